//! Parsing a UDP payload into a typed, borrowed view, and building packets into caller
//! buffers.

use crate::headers::{Aeth, AtomicEth, Bth, Deth, Feth, Reth};
use crate::opcode::{Layout, Opcode};

/// Length of the invariant CRC at the end of every packet.
pub const ICRC_LEN: usize = 4;

/// Why a UDP payload is not a valid RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Shorter than its headers and ICRC require.
    #[error("truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes the opcode's headers plus the ICRC need.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The BTH opcode is not one this crate knows.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Transport header version other than 0.
    #[error("unsupported transport header version {0}")]
    BadVersion(u8),
    /// The pad count is larger than the payload.
    #[error("pad count {pad} exceeds the {len} payload bytes")]
    PadTooLong {
        /// Pad count.
        pad: u8,
        /// Payload bytes including pad.
        len: usize,
    },
    /// Header, payload and pad are not a multiple of 4 bytes.
    #[error("packet length {0} is not a multiple of 4")]
    Unaligned(usize),
    /// A payload on an opcode that carries none, or of the wrong fixed size.
    #[error("{opcode} cannot carry a {len}-byte payload")]
    BadPayload {
        /// The opcode.
        opcode: Opcode,
        /// Payload length.
        len: usize,
    },
}

/// Why a packet could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The headers given do not match what the opcode carries.
    #[error("{opcode} needs headers {needed:?}, got {given:?}")]
    WrongHeaders {
        /// The opcode.
        opcode: Opcode,
        /// Its layout.
        needed: Layout,
        /// What was given.
        given: Layout,
    },
    /// A payload on an opcode that carries none, or of the wrong fixed size.
    #[error("{opcode} cannot carry a {len}-byte payload")]
    BadPayload {
        /// The opcode.
        opcode: Opcode,
        /// Payload length.
        len: usize,
    },
    /// The buffer is too small.
    #[error("buffer of {got} bytes, {needed} needed")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Buffer size.
        got: usize,
    },
}

/// Every header of a packet: the BTH and the extension headers its opcode carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Headers {
    /// Base transport header (its pad count is computed when building).
    pub bth: Bth,
    /// DETH.
    pub deth: Option<Deth>,
    /// FETH.
    pub feth: Option<Feth>,
    /// RETH.
    pub reth: Option<Reth>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original remote data.
    pub atomic_ack: Option<u64>,
    /// ImmDt (host order; big-endian on the wire).
    pub imm: Option<u32>,
    /// IETH: the rkey to invalidate.
    pub ieth: Option<u32>,
}

impl Headers {
    /// Headers with only a BTH.
    pub fn new(bth: Bth) -> Self {
        Headers {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
        }
    }

    /// Which extension headers are present.
    pub fn present(&self) -> Layout {
        let op = self.bth.opcode.layout();
        Layout {
            deth: self.deth.is_some(),
            feth: self.feth.is_some(),
            reth: self.reth.is_some(),
            atomic: self.atomic.is_some(),
            aeth: self.aeth.is_some(),
            atomic_ack: self.atomic_ack.is_some(),
            imm: self.imm.is_some(),
            ieth: self.ieth.is_some(),
            payload: op.payload,
            fixed_payload: op.fixed_payload,
        }
    }

    /// Length of the BTH and extension headers.
    pub fn len(&self) -> usize {
        Bth::LEN + self.bth.opcode.layout().ext_len()
    }

    /// Always false: a packet has at least a BTH.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The total UDP payload length for `payload_len` bytes of payload: headers, payload,
    /// pad to a multiple of 4, ICRC.
    pub fn packet_len(&self, payload_len: usize) -> usize {
        let body = self.len() + payload_len;
        body.next_multiple_of(4) + ICRC_LEN
    }

    /// Writes the headers for a `payload_len`-byte payload into `buf`, zeroes the pad and
    /// ICRC bytes, and returns `(header_len, packet_len)`. The caller writes the payload to
    /// `buf[header_len..header_len + payload_len]` (gathering it from wherever it lives),
    /// then fills the ICRC with [`crate::icrc::fill`].
    pub fn write(&self, payload_len: usize, buf: &mut [u8]) -> Result<(usize, usize), BuildError> {
        let opcode = self.bth.opcode;
        let layout = opcode.layout();
        let given = self.present();
        if given != layout {
            return Err(BuildError::WrongHeaders {
                opcode,
                needed: layout,
                given,
            });
        }
        let payload_ok = match layout.fixed_payload {
            Some(n) => payload_len == n,
            None => layout.payload || payload_len == 0,
        };
        if !payload_ok {
            return Err(BuildError::BadPayload {
                opcode,
                len: payload_len,
            });
        }
        let hdr_len = self.len();
        let total = self.packet_len(payload_len);
        let Some(out) = buf.get_mut(..total) else {
            return Err(BuildError::BufferTooSmall {
                needed: total,
                got: buf.len(),
            });
        };
        let pad = (total - ICRC_LEN - hdr_len - payload_len) as u8;
        let mut bth = self.bth;
        bth.pad = pad;
        out[..Bth::LEN].copy_from_slice(&bth.to_bytes());
        let mut at = Bth::LEN;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        if let Some(h) = self.deth {
            put(&h.to_bytes());
        }
        if let Some(h) = self.feth {
            put(&h.to_bytes());
        }
        if let Some(h) = self.reth {
            put(&h.to_bytes());
        }
        if let Some(h) = self.atomic {
            put(&h.to_bytes());
        }
        if let Some(h) = self.aeth {
            put(&h.to_bytes());
        }
        if let Some(v) = self.atomic_ack {
            put(&v.to_be_bytes());
        }
        if let Some(v) = self.imm {
            put(&v.to_be_bytes());
        }
        if let Some(v) = self.ieth {
            put(&v.to_be_bytes());
        }
        out[hdr_len + payload_len..].fill(0);
        Ok((hdr_len, total))
    }

    /// Builds a whole packet (ICRC bytes left zero) and returns its length.
    pub fn build(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize, BuildError> {
        let (hdr, total) = self.write(payload.len(), buf)?;
        buf[hdr..hdr + payload.len()].copy_from_slice(payload);
        Ok(total)
    }
}

/// A parsed packet: typed headers and a borrowed payload (pad removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The headers.
    pub headers: Headers,
    /// The payload, without pad bytes.
    pub payload: &'a [u8],
    /// The ICRC as it was on the wire (little-endian bytes read as a `u32`).
    pub icrc: u32,
    /// The whole UDP payload.
    pub bytes: &'a [u8],
}

fn take<const N: usize>(b: &[u8], at: &mut usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = b.get(*at..*at + N) {
        out.copy_from_slice(src);
    }
    *at += N;
    out
}

impl<'a> Packet<'a> {
    /// Parses a UDP payload. Never panics, whatever the input: every malformed packet is a
    /// [`ParseError`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ParseError> {
        let min = Bth::LEN + ICRC_LEN;
        let Some(bth_bytes) = bytes.get(..Bth::LEN) else {
            return Err(ParseError::Truncated {
                needed: min,
                got: bytes.len(),
            });
        };
        let mut raw = [0u8; Bth::LEN];
        raw.copy_from_slice(bth_bytes);
        let bth = Bth::from_bytes(&raw).ok_or(ParseError::UnknownOpcode(raw[0]))?;
        if bth.tver != 0 {
            return Err(ParseError::BadVersion(bth.tver));
        }
        let layout = bth.opcode.layout();
        let hdr_len = Bth::LEN + layout.ext_len();
        if bytes.len() < hdr_len + ICRC_LEN {
            return Err(ParseError::Truncated {
                needed: hdr_len + ICRC_LEN,
                got: bytes.len(),
            });
        }
        if !bytes.len().is_multiple_of(4) {
            return Err(ParseError::Unaligned(bytes.len()));
        }
        let mut at = Bth::LEN;
        let mut h = Headers::new(bth);
        if layout.deth {
            h.deth = Some(Deth::from_bytes(&take(bytes, &mut at)));
        }
        if layout.feth {
            h.feth = Some(Feth::from_bytes(&take(bytes, &mut at)));
        }
        if layout.reth {
            h.reth = Some(Reth::from_bytes(&take(bytes, &mut at)));
        }
        if layout.atomic {
            h.atomic = Some(AtomicEth::from_bytes(&take(bytes, &mut at)));
        }
        if layout.aeth {
            h.aeth = Some(Aeth::from_bytes(&take(bytes, &mut at)));
        }
        if layout.atomic_ack {
            h.atomic_ack = Some(u64::from_be_bytes(take(bytes, &mut at)));
        }
        if layout.imm {
            h.imm = Some(u32::from_be_bytes(take(bytes, &mut at)));
        }
        if layout.ieth {
            h.ieth = Some(u32::from_be_bytes(take(bytes, &mut at)));
        }
        let icrc_at = bytes.len() - ICRC_LEN;
        let padded = &bytes[hdr_len..icrc_at];
        let pad = usize::from(bth.pad);
        if pad > padded.len() {
            return Err(ParseError::PadTooLong {
                pad: bth.pad,
                len: padded.len(),
            });
        }
        let payload = &padded[..padded.len() - pad];
        let payload_ok = match layout.fixed_payload {
            Some(n) => payload.len() == n,
            None => layout.payload || payload.is_empty(),
        };
        if !payload_ok {
            return Err(ParseError::BadPayload {
                opcode: bth.opcode,
                len: payload.len(),
            });
        }
        let mut icrc = [0u8; 4];
        icrc.copy_from_slice(&bytes[icrc_at..]);
        Ok(Packet {
            headers: h,
            payload,
            icrc: u32::from_le_bytes(icrc),
            bytes,
        })
    }

    /// The BTH.
    pub fn bth(&self) -> &Bth {
        &self.headers.bth
    }
}
