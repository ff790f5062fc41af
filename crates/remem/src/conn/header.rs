//! The 8-byte header in front of every message remem sends over a connection: what kind
//! of message it is, the credits it returns, and its immediate value.
//!
//! ```text
//! byte 0     kind (`Kind`)
//! byte 1     flags: bit 0 set when an immediate value is present; other bits reserved (0)
//! bytes 2-3  credits returned to the receiver (big-endian)
//! bytes 4-7  the immediate value (big-endian; 0 when absent)
//! ```
//!
//! Pure: no device, no runtime. [`MsgHeader::parse`] never panics; reserved bits are
//! ignored on parse and written as zero.

use crate::error::ProtocolViolation;

/// Bytes of the header in front of every message.
pub(crate) const HDR: usize = 8;

/// The flag bit saying an immediate value is present.
const FLAG_IMM: u8 = 1;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub(crate) enum Kind {
    /// An application message.
    Data = 1,
    /// Credits only.
    Credit = 2,
    /// A memory region shared with the peer ([`crate::Connection::share_local_mr`]).
    MrToken = 3,
    /// The sender closes the connection.
    Close = 4,
    /// A large message: the receiver READs it from the sender's memory.
    Rts = 5,
    /// The receiver has read a large message (its id in the immediate field).
    RtsDone = 6,
    /// An agent message (memory requests and leases).
    Agent = 7,
    /// A connection's first message, from the connecting side: the nonce the listener
    /// sent over TCP. Its arrival proves that the connecting side's device sends from the
    /// address it claimed; the listener's QP stays in RTR (sending nothing of its own)
    /// until it has arrived.
    Hello = 8,
}

impl Kind {
    /// Every kind, in wire order.
    #[cfg(test)]
    pub(crate) const ALL: [Kind; 8] = [
        Kind::Data,
        Kind::Credit,
        Kind::MrToken,
        Kind::Close,
        Kind::Rts,
        Kind::RtsDone,
        Kind::Agent,
        Kind::Hello,
    ];

    /// The kind of wire value `v`, if there is one.
    pub(crate) fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Credit,
            3 => Kind::MrToken,
            4 => Kind::Close,
            5 => Kind::Rts,
            6 => Kind::RtsDone,
            7 => Kind::Agent,
            8 => Kind::Hello,
            _ => return None,
        })
    }

    /// Whether a message of this kind takes one of the receiver's credits (a receive
    /// buffer it granted). Credit, close and large-message-done messages land in the
    /// spare buffers every connection posts beyond its credits.
    pub(crate) fn credited(self) -> bool {
        !matches!(self, Kind::Credit | Kind::Close | Kind::RtsDone)
    }
}

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsgHeader {
    /// What the message is.
    pub(crate) kind: Kind,
    /// Credits it returns to the receiver.
    pub(crate) credits: u16,
    /// Its immediate value (SEND_WITH_IMM's; a large message's id for `RtsDone`).
    pub(crate) imm: Option<u32>,
}

impl MsgHeader {
    /// A header of `kind` returning `credits`, with `imm`.
    pub(crate) fn new(kind: Kind, credits: u16, imm: Option<u32>) -> Self {
        MsgHeader { kind, credits, imm }
    }

    /// Encodes it.
    pub(crate) fn emit(&self) -> [u8; HDR] {
        let mut h = [0u8; HDR];
        h[0] = self.kind as u8;
        h[1] = if self.imm.is_some() { FLAG_IMM } else { 0 };
        h[2..4].copy_from_slice(&self.credits.to_be_bytes());
        h[4..].copy_from_slice(&self.imm.unwrap_or(0).to_be_bytes());
        h
    }

    /// Decodes the header at the start of `b` (a message's bytes): a message shorter than
    /// a header is [`ProtocolViolation::NoHeader`], an unknown kind
    /// [`ProtocolViolation::UnknownKind`].
    pub(crate) fn parse(b: &[u8]) -> Result<Self, ProtocolViolation> {
        let Some(h) = b.get(..HDR) else {
            return Err(ProtocolViolation::NoHeader);
        };
        let kind = Kind::from_u8(h[0]).ok_or(ProtocolViolation::UnknownKind(h[0]))?;
        let credits = u16::from_be_bytes([h[2], h[3]]);
        let imm = (h[1] & FLAG_IMM != 0).then(|| u32::from_be_bytes([h[4], h[5], h[6], h[7]]));
        Ok(MsgHeader { kind, credits, imm })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_header() -> impl Strategy<Value = MsgHeader> {
        (
            proptest::sample::select(Kind::ALL.to_vec()),
            any::<u16>(),
            any::<Option<u32>>(),
        )
            .prop_map(|(kind, credits, imm)| MsgHeader { kind, credits, imm })
    }

    proptest! {
        #[test]
        fn round_trip(h in any_header()) {
            prop_assert_eq!(MsgHeader::parse(&h.emit()), Ok(h));
        }

        /// Any bytes: a header or a typed error, never a panic; what parses re-emits to
        /// the same bytes but for reserved bits and an immediate without its flag.
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..16)) {
            match MsgHeader::parse(&b) {
                Ok(h) => {
                    let e = h.emit();
                    prop_assert_eq!(e[0], b[0]);
                    prop_assert_eq!(&e[2..4], &b[2..4]);
                    if b[1] & 1 != 0 {
                        prop_assert_eq!(&e[4..8], &b[4..8]);
                    }
                }
                Err(ProtocolViolation::NoHeader) => prop_assert!(b.len() < HDR),
                Err(ProtocolViolation::UnknownKind(k)) => {
                    prop_assert_eq!(k, b[0]);
                    prop_assert!(Kind::from_u8(k).is_none());
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }

    #[test]
    fn layout() {
        let h = MsgHeader::new(Kind::Rts, 0x0102, Some(0x0a0b_0c0d));
        assert_eq!(h.emit(), [5, 1, 1, 2, 0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(
            MsgHeader::new(Kind::Data, 3, None).emit(),
            [1, 0, 0, 3, 0, 0, 0, 0]
        );
        assert_eq!(
            MsgHeader::parse(&[9; 8]),
            Err(ProtocolViolation::UnknownKind(9))
        );
        assert_eq!(MsgHeader::parse(&[1; 7]), Err(ProtocolViolation::NoHeader));
        assert!(Kind::Data.credited() && !Kind::Close.credited());
    }
}
