//! Between the transport's packet model ([`TxPacket`], [`RxPacket`]) and `remem-wire`.

use super::{Kind, Pos, RxPacket, TxPacket};
use remem_wire::{Aeth, Bth, Deth, Headers, Opcode, Packet, Psn};

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

/// What the transport makes of a wire opcode (`None` for opcodes it does not handle:
/// UC for now).
pub fn kind_pos(op: Opcode) -> Option<(Kind, Pos)> {
    use Kind::*;
    use Opcode::*;
    use Pos::*;
    Some(match op {
        RcSendFirst => (Send, First),
        RcSendMiddle => (Send, Middle),
        RcSendLast => (Send, Last),
        RcSendOnly | UdSendOnly => (Send, Only),
        RcSendLastImm => (SendImm, Last),
        RcSendOnlyImm | UdSendOnlyImm => (SendImm, Only),
        RcSendLastInv => (SendInv, Last),
        RcSendOnlyInv => (SendInv, Only),
        RcWriteFirst => (Write, First),
        RcWriteMiddle => (Write, Middle),
        RcWriteLast => (Write, Last),
        RcWriteOnly => (Write, Only),
        RcWriteLastImm => (WriteImm, Last),
        RcWriteOnlyImm => (WriteImm, Only),
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
        _ => return None,
    })
}

/// The wire headers of a transport packet.
pub fn headers(tx: &TxPacket) -> Headers {
    let op = opcode(tx.kind, tx.pos, tx.deth.is_some());
    let layout = op.layout();
    let mut bth = Bth::new(op, tx.dest_qpn, Psn::new(tx.psn));
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
        psn: h.bth.psn.value(),
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
        for op in Opcode::ALL {
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
    }

    #[test]
    fn headers_follow_the_layout() {
        let mut tx = TxPacket::new(Kind::WriteImm, Pos::First, 7, 9);
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
