//! The base and extension transport headers, big-endian on the wire.
//!
//! Each header converts from and to a fixed-size byte array, so parsing a header can never
//! read out of bounds; [`crate::Packet::parse`] slices the packet and checks lengths first.

use crate::opcode::Opcode;
use crate::psn::Psn;

fn be24(b: &[u8; 3]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

fn put24(v: u32, out: &mut [u8]) {
    out.copy_from_slice(&v.to_be_bytes()[1..]);
}

/// Base Transport Header (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub se: bool,
    /// MigReq.
    pub mig_req: bool,
    /// Pad count (0–3): bytes added after the payload to reach a 4-byte multiple.
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN (masked out of the ICRC).
    pub fecn: bool,
    /// BECN (masked out of the ICRC).
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Bth {
    /// Wire length.
    pub const LEN: usize = 12;

    /// A BTH with default P_Key 0xffff, no flags, pad 0.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Self {
        Bth {
            opcode,
            se: false,
            mig_req: false,
            pad: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & 0x00ff_ffff,
            ack_req: false,
            psn,
        }
    }

    /// Decodes the fields; `None` for an unknown opcode.
    pub fn from_bytes(b: &[u8; 12]) -> Option<Self> {
        Some(Bth {
            opcode: Opcode::from_u8(b[0])?,
            se: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad: (b[1] >> 4) & 3,
            tver: b[1] & 0x0f,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: be24(&[b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: Psn::new(be24(&[b[9], b[10], b[11]])),
        })
    }

    /// Encodes.
    pub fn to_bytes(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0] = self.opcode.value();
        b[1] = (u8::from(self.se) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad & 3) << 4)
            | (self.tver & 0x0f);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        put24(self.dest_qp & 0x00ff_ffff, &mut b[5..8]);
        b[8] = u8::from(self.ack_req) << 7;
        put24(self.psn.value(), &mut b[9..12]);
        b
    }
}

/// RDMA Extended Transport Header (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl Reth {
    /// Wire length.
    pub const LEN: usize = 16;
    /// Decodes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        let (va, rest) = b.split_at(8);
        Reth {
            va: u64::from_be_bytes(va.try_into().unwrap_or([0; 8])),
            rkey: u32::from_be_bytes(rest[..4].try_into().unwrap_or([0; 4])),
            dma_len: u32::from_be_bytes(rest[4..].try_into().unwrap_or([0; 4])),
        }
    }
    /// Encodes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.dma_len.to_be_bytes());
        b
    }
}

/// The meaning of an AETH syndrome (IBTA 9.7.5.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with an end-to-end credit code (31: unlimited/invalid).
    Ack {
        /// Credit count code.
        credits: u8,
    },
    /// Receiver-not-ready NAK with a 5-bit timer code.
    RnrNak {
        /// RNR timer code.
        timer: u8,
    },
    /// PSN sequence error NAK.
    NakPsnSeqErr,
    /// Invalid request NAK.
    NakInvalidRequest,
    /// Remote access error NAK.
    NakRemoteAccessError,
    /// Remote operational error NAK.
    NakRemoteOperationalError,
    /// Invalid RD request NAK.
    NakInvalidRdRequest,
    /// A reserved encoding (the raw byte).
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte.
    pub fn from_byte(b: u8) -> Self {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Syndrome::Ack { credits: low },
            1 => Syndrome::RnrNak { timer: low },
            3 => match low {
                0 => Syndrome::NakPsnSeqErr,
                1 => Syndrome::NakInvalidRequest,
                2 => Syndrome::NakRemoteAccessError,
                3 => Syndrome::NakRemoteOperationalError,
                4 => Syndrome::NakInvalidRdRequest,
                _ => Syndrome::Reserved(b),
            },
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::NakPsnSeqErr => 0x60,
            Syndrome::NakInvalidRequest => 0x61,
            Syndrome::NakRemoteAccessError => 0x62,
            Syndrome::NakRemoteOperationalError => 0x63,
            Syndrome::NakInvalidRdRequest => 0x64,
            Syndrome::Reserved(b) => b,
        }
    }
}

/// ACK Extended Transport Header (4 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    /// Wire length.
    pub const LEN: usize = 4;
    /// Decodes.
    pub fn from_bytes(b: &[u8; 4]) -> Self {
        Aeth {
            syndrome: Syndrome::from_byte(b[0]),
            msn: be24(&[b[1], b[2], b[3]]),
        }
    }
    /// Encodes.
    pub fn to_bytes(&self) -> [u8; 4] {
        let mut b = [0u8; 4];
        b[0] = self.syndrome.to_byte();
        put24(self.msn & 0x00ff_ffff, &mut b[1..]);
        b
    }
}

/// Atomic Extended Transport Header (28 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (compare-swap) or add (fetch-add) data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

impl AtomicEth {
    /// Wire length.
    pub const LEN: usize = 28;
    /// Decodes.
    pub fn from_bytes(b: &[u8; 28]) -> Self {
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        AtomicEth {
            va: u64_at(0),
            rkey: u32::from_be_bytes(b[8..12].try_into().unwrap_or([0; 4])),
            swap_add: u64_at(12),
            compare: u64_at(20),
        }
    }
    /// Encodes.
    pub fn to_bytes(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..].copy_from_slice(&self.compare.to_be_bytes());
        b
    }
}

/// Datagram Extended Transport Header (8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl Deth {
    /// Wire length.
    pub const LEN: usize = 8;
    /// Decodes.
    pub fn from_bytes(b: &[u8; 8]) -> Self {
        Deth {
            qkey: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            src_qp: be24(&[b[5], b[6], b[7]]),
        }
    }
    /// Encodes.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&self.qkey.to_be_bytes());
        put24(self.src_qp & 0x00ff_ffff, &mut b[5..]);
        b
    }
}

/// FLUSH Extended Transport Header (4 bytes): placement type and selectivity level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Feth {
    /// Placement type bits (bit 0: global visibility, bit 1: persistence).
    pub placement: u8,
    /// Selectivity level (0: memory range, 1: memory region).
    pub selectivity: u8,
}

impl Feth {
    /// Wire length.
    pub const LEN: usize = 4;
    /// Decodes (reserved bits ignored).
    pub fn from_bytes(b: &[u8; 4]) -> Self {
        let v = u32::from_be_bytes(*b);
        Feth {
            placement: (v & 0x0f) as u8,
            selectivity: ((v >> 4) & 0x03) as u8,
        }
    }
    /// Encodes.
    pub fn to_bytes(&self) -> [u8; 4] {
        (u32::from(self.placement & 0x0f) | (u32::from(self.selectivity & 3) << 4)).to_be_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bth_bits() {
        // From the MANIFEST's ACK example: 11 00 ffff 00 000012 00 0e2ead
        let raw = [
            0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x0e, 0x2e, 0xad,
        ];
        let b = Bth::from_bytes(&raw).unwrap();
        assert_eq!(b.opcode, Opcode::RcAck);
        assert_eq!(b.dest_qp, 0x12);
        assert_eq!(b.psn.value(), 0x0e2ead);
        assert_eq!(b.pkey, 0xffff);
        assert_eq!(b.to_bytes(), raw);
        let mut c = b;
        c.se = true;
        c.pad = 3;
        c.ack_req = true;
        c.fecn = true;
        let bytes = c.to_bytes();
        assert_eq!(bytes[1], 0xb0);
        assert_eq!(bytes[4], 0x80);
        assert_eq!(bytes[8], 0x80);
        assert_eq!(Bth::from_bytes(&bytes), Some(c));
        assert_eq!(Bth::from_bytes(&[0x15; 12]), None);
    }

    #[test]
    fn syndromes() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack { credits: 31 });
        assert_eq!(Syndrome::from_byte(0x2c), Syndrome::RnrNak { timer: 12 });
        assert_eq!(Syndrome::from_byte(0x62), Syndrome::NakRemoteAccessError);
    }

    #[test]
    fn round_trips() {
        let r = Reth {
            va: 0x0102_0304_0506_0708,
            rkey: 0xdead_beef,
            dma_len: 3000,
        };
        assert_eq!(Reth::from_bytes(&r.to_bytes()), r);
        let a = AtomicEth {
            va: 1,
            rkey: 2,
            swap_add: 3,
            compare: 4,
        };
        assert_eq!(AtomicEth::from_bytes(&a.to_bytes()), a);
        let d = Deth {
            qkey: 0x1111_1111,
            src_qp: 0x1d,
        };
        assert_eq!(Deth::from_bytes(&d.to_bytes()), d);
        let f = Feth {
            placement: 2,
            selectivity: 1,
        };
        assert_eq!(Feth::from_bytes(&f.to_bytes()), f);
        let e = Aeth {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: 0x00ab_cdef,
        };
        assert_eq!(Aeth::from_bytes(&e.to_bytes()), e);
    }
}
