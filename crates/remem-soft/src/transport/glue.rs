//! Between the transport's packet model ([`TxPacket`], [`RxPacket`]) and `remem-wire`, and
//! where a packet's payload goes ([`PayloadSink`]).

use super::{AccessError, Grant, Held, Kind, Pos, RxPacket, TxPacket};
use remem_verbs::MemError;
use remem_wire::{Aeth, Bth, Deth, Headers, Opcode, Packet};

/// Where a packet's payload goes while the transport builds it: the transport's
/// `poll_transmit` hands its caller a function that puts the payload into a sink, piece by
/// piece in order (`at` is the position in the payload), from inline data or from
/// registered memory. A sink copies ([`CopySink`], and `Vec<u8>` for tests: the vector's
/// length is the payload's), or — the driver's scatter/gather send — keeps each piece of
/// registered memory as a range of [`crate::mem::grant::HeldRanges`] for the kernel to copy from
/// where it lies.
pub trait PayloadSink {
    /// Payload bytes the packet carries.
    fn payload_len(&self) -> usize;

    /// Payload bytes `at..at + bytes.len()` are `bytes` (inline data).
    fn put_bytes(&mut self, at: usize, bytes: &[u8]) -> Result<(), AccessError>;

    /// Payload bytes `at..at + n` are bytes `offset..offset + n` of `grant`'s range (a
    /// work request's scatter/gather entry): fails if the key was revoked.
    fn put_grant(
        &mut self,
        at: usize,
        grant: &Grant,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError>;

    /// Payload bytes `at..at + n` are bytes `offset..offset + n` of a held grant's range (a
    /// READ response's region, in an access since the response was decided).
    fn put_held(
        &mut self,
        at: usize,
        held: &Held,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError>;
}

/// A packet's payload writer, as the transports hand it out.
pub type Fill<'a> = dyn FnMut(&mut dyn PayloadSink) -> std::result::Result<(), AccessError> + 'a;

/// A [`PayloadSink`] that copies the payload into a slice (exactly the payload's length).
#[derive(Debug)]
pub struct CopySink<'a>(pub &'a mut [u8]);

fn out_of(dst: &[u8], at: usize, n: usize) -> AccessError {
    AccessError::Mem(MemError::OutOfBounds {
        offset: at as u64,
        len: n as u64,
        size: dst.len() as u64,
    })
}

fn copy_at(dst: &mut [u8], at: usize, n: usize) -> Result<&mut [u8], AccessError> {
    let size = dst.len();
    match at.checked_add(n) {
        Some(end) if end <= size => Ok(&mut dst[at..end]),
        _ => Err(out_of(dst, at, n)),
    }
}

impl PayloadSink for [u8] {
    fn payload_len(&self) -> usize {
        self.len()
    }

    fn put_bytes(&mut self, at: usize, bytes: &[u8]) -> Result<(), AccessError> {
        copy_at(self, at, bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    fn put_grant(
        &mut self,
        at: usize,
        grant: &Grant,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        grant.read(offset, copy_at(self, at, n)?)
    }

    fn put_held(
        &mut self,
        at: usize,
        held: &Held,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        held.read(offset, copy_at(self, at, n)?)
            .map_err(AccessError::Mem)
    }
}

impl PayloadSink for CopySink<'_> {
    fn payload_len(&self) -> usize {
        self.0.len()
    }

    fn put_bytes(&mut self, at: usize, bytes: &[u8]) -> Result<(), AccessError> {
        self.0.put_bytes(at, bytes)
    }

    fn put_grant(
        &mut self,
        at: usize,
        grant: &Grant,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        self.0.put_grant(at, grant, offset, n)
    }

    fn put_held(
        &mut self,
        at: usize,
        held: &Held,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        self.0.put_held(at, held, offset, n)
    }
}

impl PayloadSink for Vec<u8> {
    fn payload_len(&self) -> usize {
        self.len()
    }

    fn put_bytes(&mut self, at: usize, bytes: &[u8]) -> Result<(), AccessError> {
        self.as_mut_slice().put_bytes(at, bytes)
    }

    fn put_grant(
        &mut self,
        at: usize,
        grant: &Grant,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        self.as_mut_slice().put_grant(at, grant, offset, n)
    }

    fn put_held(
        &mut self,
        at: usize,
        held: &Held,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        self.as_mut_slice().put_held(at, held, offset, n)
    }
}

/// The wire opcode of a transport packet (`ud`: it carries a DETH).
pub fn opcode(kind: Kind, pos: Pos, ud: bool) -> Opcode {
    use Kind::*;
    use Opcode::*;
    use Pos::*;
    match (kind, pos) {
        (Send | SendImm, Only) if ud => {
            if kind == SendImm {
                UdSendOnlyImm
            } else {
                UdSendOnly
            }
        }
        (Send | SendImm | SendInv, First) => RcSendFirst,
        (Send | SendImm | SendInv, Middle) => RcSendMiddle,
        (Send, Last) => RcSendLast,
        (Send, Only) => RcSendOnly,
        (SendImm, Last) => RcSendLastImm,
        (SendImm, Only) => RcSendOnlyImm,
        (SendInv, Last) => RcSendLastInv,
        (SendInv, Only) => RcSendOnlyInv,
        (Write | WriteImm, First) => RcWriteFirst,
        (Write | WriteImm, Middle) => RcWriteMiddle,
        (Write, Last) => RcWriteLast,
        (Write, Only) => RcWriteOnly,
        (WriteImm, Last) => RcWriteLastImm,
        (WriteImm, Only) => RcWriteOnlyImm,
        (ReadRequest, _) => RcReadRequest,
        (ReadResponse, First) => RcReadResponseFirst,
        (ReadResponse, Middle) => RcReadResponseMiddle,
        (ReadResponse, Last) => RcReadResponseLast,
        (ReadResponse, Only) => RcReadResponseOnly,
        (Ack, _) => RcAck,
        (AtomicAck, _) => RcAtomicAck,
        (CompareSwap, _) => RcCompareSwap,
        (FetchAdd, _) => RcFetchAdd,
        (AtomicWrite, _) => RcAtomicWrite,
        (Flush, _) => RcFlush,
    }
}

/// The UC opcode of a transport packet: SEND and RDMA WRITE (with or without immediate)
/// only, with the RC opcode's value in the UC range (IBTA numbers the twelve alike: RC
/// 0x00–0x0b, UC 0x20–0x2b).
pub fn uc_opcode(kind: Kind, pos: Pos) -> Option<Opcode> {
    if !matches!(
        kind,
        Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm
    ) {
        return None;
    }
    Opcode::from_u8(opcode(kind, pos, false).value() | 0x20)
}

/// What the transport makes of a wire opcode (every opcode `remem-wire` parses has a
/// meaning today; `None` is kept for opcodes it may learn later). UC opcodes map to the kinds and positions of their RC twins (the engine has checked
/// that the destination QP is of the opcode's service).
pub fn kind_pos(op: Opcode) -> Option<(Kind, Pos)> {
    use Kind::*;
    use Opcode::*;
    use Pos::*;
    Some(match op {
        RcSendFirst | UcSendFirst => (Send, First),
        RcSendMiddle | UcSendMiddle => (Send, Middle),
        RcSendLast | UcSendLast => (Send, Last),
        RcSendOnly | UdSendOnly | UcSendOnly => (Send, Only),
        RcSendLastImm | UcSendLastImm => (SendImm, Last),
        RcSendOnlyImm | UdSendOnlyImm | UcSendOnlyImm => (SendImm, Only),
        RcSendLastInv => (SendInv, Last),
        RcSendOnlyInv => (SendInv, Only),
        RcWriteFirst | UcWriteFirst => (Write, First),
        RcWriteMiddle | UcWriteMiddle => (Write, Middle),
        RcWriteLast | UcWriteLast => (Write, Last),
        RcWriteOnly | UcWriteOnly => (Write, Only),
        RcWriteLastImm | UcWriteLastImm => (WriteImm, Last),
        RcWriteOnlyImm | UcWriteOnlyImm => (WriteImm, Only),
        RcReadRequest => (ReadRequest, Only),
        RcReadResponseFirst => (ReadResponse, First),
        RcReadResponseMiddle => (ReadResponse, Middle),
        RcReadResponseLast => (ReadResponse, Last),
        RcReadResponseOnly => (ReadResponse, Only),
        RcAck => (Ack, Only),
        RcAtomicAck => (AtomicAck, Only),
        RcCompareSwap => (CompareSwap, Only),
        RcFetchAdd => (FetchAdd, Only),
        RcAtomicWrite => (AtomicWrite, Only),
        RcFlush => (Flush, Only),
    })
}

/// The wire headers of a transport packet.
pub fn headers(tx: &TxPacket) -> Headers {
    let rc_or_ud = || opcode(tx.kind, tx.pos, tx.deth.is_some());
    let op = if tx.uc {
        uc_opcode(tx.kind, tx.pos).unwrap_or_else(rc_or_ud)
    } else {
        rc_or_ud()
    };
    let layout = op.layout();
    let mut bth = Bth::new(op, tx.dest_qpn, tx.psn);
    bth.ack_req = tx.ack_req;
    bth.se = tx.solicited;
    let mut h = Headers::new(bth);
    h.reth = tx.reth.filter(|_| layout.reth);
    h.aeth = tx
        .aeth
        .filter(|_| layout.aeth)
        .map(|(syndrome, msn)| Aeth { syndrome, msn });
    h.atomic = tx.atomic.filter(|_| layout.atomic);
    h.atomic_ack = tx.atomic_ack.filter(|_| layout.atomic_ack);
    h.feth = tx.feth.filter(|_| layout.feth);
    h.imm = tx.imm.filter(|_| layout.imm);
    h.ieth = tx.ieth.filter(|_| layout.ieth);
    h.deth = tx
        .deth
        .filter(|_| layout.deth)
        .map(|(qkey, src_qp)| Deth { qkey, src_qp });
    h
}

/// The transport's view of a parsed packet.
pub fn rx<'a>(p: &Packet<'a>) -> Option<RxPacket<'a>> {
    let h = &p.headers;
    let (kind, pos) = kind_pos(h.bth.opcode)?;
    Some(RxPacket {
        kind,
        pos,
        psn: h.bth.psn,
        ack_req: h.bth.ack_req,
        solicited: h.bth.se,
        reth: h.reth,
        aeth: h.aeth.map(|a| (a.syndrome, a.msn)),
        atomic: h.atomic,
        atomic_ack: h.atomic_ack,
        feth: h.feth,
        imm: h.imm,
        ieth: h.ieth,
        deth: h.deth.map(|d| (d.qkey, d.src_qp)),
        payload: p.payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_opcode_round_trips() {
        for op in Opcode::ALL.iter().filter(|o| o.value() >> 5 != 1) {
            if let Some((kind, pos)) = kind_pos(*op) {
                let ud = matches!(op, Opcode::UdSendOnly | Opcode::UdSendOnlyImm);
                assert_eq!(opcode(kind, pos, ud), *op, "{op}");
            }
        }
        // The transport handles every RC opcode, FLUSH and ATOMIC WRITE included.
        let handled = Opcode::ALL
            .iter()
            .filter(|o| o.value() < 0x20 && kind_pos(**o).is_some())
            .count();
        assert_eq!(handled, 25);
        // And the twelve UC opcodes, each the UC twin of its kind and position.
        let uc: Vec<_> = Opcode::ALL
            .iter()
            .filter(|o| o.value() >> 5 == 1)
            .copied()
            .collect();
        assert_eq!(uc.len(), 12);
        for op in uc {
            let (kind, pos) = kind_pos(op).unwrap_or_else(|| panic!("{op} not handled"));
            assert_eq!(uc_opcode(kind, pos), Some(op), "{op}");
            let mut tx = TxPacket::new(kind, pos, 1, remem_wire::Psn::new(2));
            tx.uc = true;
            assert_eq!(headers(&tx).bth.opcode, op);
        }
        // Nothing else has a UC opcode.
        assert_eq!(uc_opcode(Kind::ReadRequest, Pos::Only), None);
        assert_eq!(uc_opcode(Kind::SendInv, Pos::Only), None);
        assert_eq!(uc_opcode(Kind::Ack, Pos::Only), None);
    }

    #[test]
    fn uc_headers_carry_no_ack_request_and_parse_back() {
        let mut tx = TxPacket::new(Kind::WriteImm, Pos::Only, 7, remem_wire::Psn::new(9));
        tx.uc = true;
        tx.imm = Some(0xabcd);
        tx.reth = Some(remem_wire::Reth {
            va: 0x1000,
            rkey: 0x42,
            dma_len: 4,
        });
        let h = headers(&tx);
        assert_eq!(h.bth.opcode, Opcode::UcWriteOnlyImm);
        assert_eq!(h.bth.opcode.value(), 0x2b);
        assert!(!h.bth.ack_req);
        let mut buf = [0u8; 128];
        let n = h.build(&[1, 2, 3, 4], &mut buf).unwrap();
        let p = Packet::parse(&buf[..n]).unwrap();
        let r = rx(&p).unwrap();
        assert_eq!((r.kind, r.pos), (Kind::WriteImm, Pos::Only));
        assert_eq!((r.imm, r.reth), (tx.imm, tx.reth));
        assert_eq!(r.payload, &[1, 2, 3, 4]);
    }

    #[test]
    fn headers_follow_the_layout() {
        let mut tx = TxPacket::new(Kind::WriteImm, Pos::First, 7, remem_wire::Psn::new(9));
        tx.imm = Some(5); // not carried on FIRST
        tx.reth = Some(remem_wire::Reth {
            va: 1,
            rkey: 2,
            dma_len: 3,
        });
        let h = headers(&tx);
        assert_eq!(h.bth.opcode, Opcode::RcWriteFirst);
        assert_eq!(h.imm, None);
        assert!(h.reth.is_some());
        let mut buf = [0u8; 64];
        let n = h.build(&[0; 8], &mut buf).unwrap();
        let p = Packet::parse(&buf[..n]).unwrap();
        let r = rx(&p).unwrap();
        assert_eq!((r.kind, r.pos), (Kind::Write, Pos::First));
        assert_eq!(r.reth, tx.reth);
    }
}
