//! BTH opcodes and the extension headers each one carries (IBTA 9.2, Annex A17; as Linux
//! rxe's opcode table lays them out).

use std::fmt;

/// Extension headers that follow the BTH, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Layout {
    /// DETH (UD).
    pub deth: bool,
    /// FETH (FLUSH), before the RETH.
    pub feth: bool,
    /// RETH.
    pub reth: bool,
    /// AtomicETH.
    pub atomic: bool,
    /// AETH.
    pub aeth: bool,
    /// AtomicAckETH (after the AETH).
    pub atomic_ack: bool,
    /// ImmDt.
    pub imm: bool,
    /// IETH.
    pub ieth: bool,
    /// Whether a payload may follow.
    pub payload: bool,
    /// A payload of exactly this many bytes (ATOMIC WRITE: 8).
    pub fixed_payload: Option<usize>,
}

impl Layout {
    /// Bytes of extension headers.
    pub const fn ext_len(&self) -> usize {
        (if self.deth { 8 } else { 0 })
            + (if self.feth { 4 } else { 0 })
            + (if self.reth { 16 } else { 0 })
            + (if self.atomic { 28 } else { 0 })
            + (if self.aeth { 4 } else { 0 })
            + (if self.atomic_ack { 8 } else { 0 })
            + (if self.imm { 4 } else { 0 })
            + (if self.ieth { 4 } else { 0 })
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $val:literal, $text:literal, { $($field:ident),* } ; )*) => {
        /// A BTH opcode this crate understands (`IB_OPCODE_*`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $name = $val, )*
        }

        impl Opcode {
            /// Every opcode, in value order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),*];

            /// The opcode with this BTH value, if known.
            pub const fn from_u8(v: u8) -> Option<Opcode> {
                match v {
                    $( $val => Some(Opcode::$name), )*
                    _ => None,
                }
            }

            /// The IBTA name, e.g. `"RC_RDMA_WRITE_FIRST"`.
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$name => $text, )* }
            }

            /// The headers and payload rule of this opcode.
            pub const fn layout(self) -> Layout {
                match self {
                    $( Opcode::$name => {
                        #[allow(unused_mut)]
                        let mut l = Layout {
                            deth: false, feth: false, reth: false, atomic: false, aeth: false,
                            atomic_ack: false, imm: false, ieth: false, payload: false,
                            fixed_payload: None,
                        };
                        $( opcodes!(@set l $field); )*
                        l
                    } )*
                }
            }
        }
    };
    (@set $l:ident payload) => { $l.payload = true; };
    (@set $l:ident atomic_write) => { $l.payload = true; $l.fixed_payload = Some(8); };
    (@set $l:ident $f:ident) => { $l.$f = true; };
}

opcodes! {
    /// RC SEND FIRST.
    RcSendFirst = 0x00, "RC_SEND_FIRST", { payload };
    /// RC SEND MIDDLE.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", { payload };
    /// RC SEND LAST.
    RcSendLast = 0x02, "RC_SEND_LAST", { payload };
    /// RC SEND LAST with immediate.
    RcSendLastImm = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", { imm, payload };
    /// RC SEND ONLY.
    RcSendOnly = 0x04, "RC_SEND_ONLY", { payload };
    /// RC SEND ONLY with immediate.
    RcSendOnlyImm = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", { imm, payload };
    /// RC RDMA WRITE FIRST.
    RcWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", { reth, payload };
    /// RC RDMA WRITE MIDDLE.
    RcWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", { payload };
    /// RC RDMA WRITE LAST.
    RcWriteLast = 0x08, "RC_RDMA_WRITE_LAST", { payload };
    /// RC RDMA WRITE LAST with immediate.
    RcWriteLastImm = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", { imm, payload };
    /// RC RDMA WRITE ONLY.
    RcWriteOnly = 0x0a, "RC_RDMA_WRITE_ONLY", { reth, payload };
    /// RC RDMA WRITE ONLY with immediate.
    RcWriteOnlyImm = 0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", { reth, imm, payload };
    /// RC RDMA READ REQUEST.
    RcReadRequest = 0x0c, "RC_RDMA_READ_REQUEST", { reth };
    /// RC RDMA READ RESPONSE FIRST.
    RcReadResponseFirst = 0x0d, "RC_RDMA_READ_RESPONSE_FIRST", { aeth, payload };
    /// RC RDMA READ RESPONSE MIDDLE.
    RcReadResponseMiddle = 0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", { payload };
    /// RC RDMA READ RESPONSE LAST.
    RcReadResponseLast = 0x0f, "RC_RDMA_READ_RESPONSE_LAST", { aeth, payload };
    /// RC RDMA READ RESPONSE ONLY.
    RcReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", { aeth, payload };
    /// RC ACKNOWLEDGE.
    RcAck = 0x11, "RC_ACKNOWLEDGE", { aeth };
    /// RC ATOMIC ACKNOWLEDGE.
    RcAtomicAck = 0x12, "RC_ATOMIC_ACKNOWLEDGE", { aeth, atomic_ack };
    /// RC COMPARE SWAP.
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", { atomic };
    /// RC FETCH ADD.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", { atomic };
    /// RC SEND LAST with invalidate.
    RcSendLastInv = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", { ieth, payload };
    /// RC SEND ONLY with invalidate.
    RcSendOnlyInv = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", { ieth, payload };
    /// RC FLUSH (FETH, then RETH).
    RcFlush = 0x1c, "RC_FLUSH", { feth, reth };
    /// RC ATOMIC WRITE (RETH and an 8-byte payload).
    RcAtomicWrite = 0x1d, "RC_ATOMIC_WRITE", { reth, atomic_write };
    /// UC SEND FIRST.
    UcSendFirst = 0x20, "UC_SEND_FIRST", { payload };
    /// UC SEND MIDDLE.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", { payload };
    /// UC SEND LAST.
    UcSendLast = 0x22, "UC_SEND_LAST", { payload };
    /// UC SEND LAST with immediate.
    UcSendLastImm = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", { imm, payload };
    /// UC SEND ONLY.
    UcSendOnly = 0x24, "UC_SEND_ONLY", { payload };
    /// UC SEND ONLY with immediate.
    UcSendOnlyImm = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", { imm, payload };
    /// UC RDMA WRITE FIRST.
    UcWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", { reth, payload };
    /// UC RDMA WRITE MIDDLE.
    UcWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", { payload };
    /// UC RDMA WRITE LAST.
    UcWriteLast = 0x28, "UC_RDMA_WRITE_LAST", { payload };
    /// UC RDMA WRITE LAST with immediate.
    UcWriteLastImm = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", { imm, payload };
    /// UC RDMA WRITE ONLY.
    UcWriteOnly = 0x2a, "UC_RDMA_WRITE_ONLY", { reth, payload };
    /// UC RDMA WRITE ONLY with immediate.
    UcWriteOnlyImm = 0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", { reth, imm, payload };
    /// UD SEND ONLY.
    UdSendOnly = 0x64, "UD_SEND_ONLY", { deth, payload };
    /// UD SEND ONLY with immediate.
    UdSendOnlyImm = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", { deth, imm, payload };
}

impl Opcode {
    /// The BTH value.
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// Whether this is a response, sent by a responder to a requester: an RC RDMA READ
    /// response, ACKNOWLEDGE or ATOMIC ACKNOWLEDGE (every other opcode is a request).
    pub const fn is_response(self) -> bool {
        let v = self as u8;
        v >= Opcode::RcReadResponseFirst as u8 && v <= Opcode::RcAtomicAck as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_the_read_responses_and_acknowledges() {
        let responses: Vec<u8> = (0..=255u8)
            .filter_map(Opcode::from_u8)
            .filter(|o| o.is_response())
            .map(Opcode::value)
            .collect();
        assert_eq!(responses, [0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12]);
    }

    #[test]
    fn values_round_trip_and_unknown_values_are_none() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op.value()), Some(*op));
        }
        let known = Opcode::ALL.len();
        let all = (0..=255u8)
            .filter(|v| Opcode::from_u8(*v).is_some())
            .count();
        assert_eq!(known, all);
        assert_eq!(Opcode::from_u8(0x15), None); // RESYNC: not supported
        assert_eq!(Opcode::from_u8(0xff), None);
    }

    #[test]
    fn layouts_match_ibta() {
        assert_eq!(Opcode::RcWriteFirst.layout().ext_len(), 16);
        assert_eq!(Opcode::RcWriteOnlyImm.layout().ext_len(), 20);
        assert_eq!(Opcode::RcCompareSwap.layout().ext_len(), 28);
        assert_eq!(Opcode::RcAtomicAck.layout().ext_len(), 12);
        assert_eq!(Opcode::RcFlush.layout().ext_len(), 20);
        assert_eq!(Opcode::UdSendOnlyImm.layout().ext_len(), 12);
        assert!(!Opcode::RcReadRequest.layout().payload);
        assert!(Opcode::RcReadResponseMiddle.layout().payload);
        assert_eq!(Opcode::RcAtomicWrite.layout().fixed_payload, Some(8));
        assert_eq!(Opcode::RcAck.name(), "RC_ACKNOWLEDGE");
    }
}
