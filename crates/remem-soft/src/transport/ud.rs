//! The UD transport: unreliable datagrams, one SEND ONLY packet per message.

use super::glue::PayloadSink;
use super::{AccessError, Env, Kind, Pos, Psn, RxPacket, TxPacket};
use crate::transport::wqe::{SendWqe, UdTarget, scatter_into};
use remem_verbs::{QpState, SendOp, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::collections::VecDeque;
use std::net::IpAddr;

/// `wc.sl` of a UD receive that arrived over RoCEv2 IPv4: mlx5's RoCE packet type, bit 3
/// "the frame has a UDP header" (RoCEv2) and bits 2:0 the L3 header type, 2 for IPv4.
///
/// On RoCEv2 no service level travels with a packet (there is no LRH), so a NIC has no SL
/// to report: rxe leaves `sl` 0, mlx5 reports the packet type there, and UCX's `ud_verbs`
/// (1.13, Debian 12's) reads it to tell an IPv4 GRH area from an IPv6 one before checking
/// the destination GID of each receive (`uct_ud_iface_check_grh`): with 0 it reads an IPv6
/// GID where the IPv4 header is and drops every packet (as it does on rxe). Reporting
/// mlx5's value makes UCX's default (`UCX_UD_VERBS_ETH_DGID_CHECK=y`) work; programs that
/// copy `sl` into an address handle (`ibv_init_ah_from_wc`) get a valid SL, which RoCEv2
/// does not put on the wire either.
pub const WC_SL_ROCE_V2_IPV4: u8 = 0x8 | 0x2;

/// `wc.sl` of a UD receive that arrived over RoCEv2 IPv6 (see [`WC_SL_ROCE_V2_IPV4`]): L3
/// header type 1.
pub const WC_SL_ROCE_V2_IPV6: u8 = 0x8 | 0x1;

/// Length of the GRH area at the start of every UD receive buffer (verbs: the first 40 bytes
/// receive the GRH; for an IPv4 source the last 20 of them hold the IPv4 header, as on RoCEv2
/// devices).
pub const GRH_LEN: usize = 40;

/// Where a received UD packet came from (known to the driver, not to the packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdSource {
    /// Source IP address.
    pub src: IpAddr,
    /// Destination (local) IP address.
    pub dst: IpAddr,
}

/// Why the UD transport dropped a datagram (each has its device counter, see
/// [`crate::engine::DropCause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdDrop {
    /// The QP is not in RTR, RTS or SQD.
    State,
    /// Not a UD SEND ONLY with a DETH, or a payload above the path MTU.
    Malformed,
    /// Its Q_Key is not the QP's.
    Qkey,
    /// No receive was posted (UD has no RNR: the datagram is lost).
    NoReceive,
}

/// The UD transport of one queue pair.
#[derive(Debug)]
pub struct UdTransport {
    qpn: u32,
    qkey: u32,
    mtu: u32,
    state: QpState,
    next_psn: Psn,
    sq: VecDeque<SendWqe>,
}

impl UdTransport {
    /// A UD transport in RESET.
    pub fn new(qpn: u32, mtu: u32) -> Self {
        UdTransport {
            qpn,
            qkey: 0,
            mtu,
            state: QpState::Reset,
            next_psn: Psn::new(0),
            sq: VecDeque::new(),
        }
    }

    /// The state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Applies attributes (Q_Key, SQ PSN) and moves to `state`; ERR flushes the send queue.
    pub fn set_state(&mut self, state: QpState, qkey: u32, sq_psn: Psn, env: &mut dyn Env) {
        if state == QpState::Rts && self.state == QpState::Rtr {
            self.next_psn = sq_psn;
        }
        self.qkey = qkey;
        self.state = state;
        match state {
            QpState::Err => {
                for w in std::mem::take(&mut self.sq) {
                    env.send_completion(self.wc(&w, WcStatus::WrFlushErr));
                }
            }
            QpState::Reset => self.sq.clear(),
            _ => {}
        }
    }

    /// The application destroyed the QP: it takes no datagram and sends none (no
    /// completions are reported).
    pub fn release(&mut self) {
        self.state = QpState::Reset;
        self.sq.clear();
    }

    /// Work requests queued.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    fn wc(&self, w: &SendWqe, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: w.wr_id,
            status,
            opcode: WcOpcode::Send,
            byte_len: w.len as u32,
            qp_num: self.qpn,
            ..WorkCompletion::default()
        }
    }

    /// Queues a validated UD send. A message longer than the path MTU completes at once
    /// with `LOC_LEN_ERR`; in ERR the send is flushed.
    pub fn post_send(&mut self, wqe: SendWqe, env: &mut dyn Env) {
        if self.state == QpState::Err {
            env.send_completion(self.wc(&wqe, WcStatus::WrFlushErr));
        } else if wqe.len > u64::from(self.mtu) || wqe.ud.is_none() {
            env.send_completion(self.wc(&wqe, WcStatus::LocLenErr));
        } else {
            self.sq.push_back(wqe);
        }
    }

    /// Sends the next datagram: `emit` gets the headers, the destination and a payload
    /// writer. The work request completes (if signaled) once the datagram is handed over;
    /// one whose memory was deregistered since it was posted is not sent and completes with
    /// `LOC_PROT_ERR` (the QP goes to ERR).
    pub fn poll_transmit<R>(
        &mut self,
        env: &mut dyn Env,
        emit: impl FnOnce(
            &TxPacket,
            &UdTarget,
            &mut dyn FnMut(&mut dyn PayloadSink) -> Result<(), AccessError>,
        ) -> R,
    ) -> Option<R> {
        if self.state != QpState::Rts {
            return None;
        }
        let wqe = self.sq.pop_front()?;
        if wqe.is_revoked() {
            env.send_completion(self.wc(&wqe, WcStatus::LocProtErr));
            self.set_state(QpState::Err, self.qkey, Psn::new(0), env);
            return None;
        }
        let target = wqe.ud?;
        let (kind, imm) = match wqe.op {
            SendOp::SendWithImm { imm } => (Kind::SendImm, Some(imm)),
            _ => (Kind::Send, None),
        };
        let mut pkt = TxPacket::new(kind, Pos::Only, target.remote_qpn, self.next_psn);
        self.next_psn = self.next_psn.next();
        pkt.imm = imm;
        pkt.solicited = wqe.solicited;
        // A Q_Key with the high bit set means "use the QP's own Q_Key" (IBTA 10.2.5).
        let qkey = if target.remote_qkey & 0x8000_0000 != 0 {
            self.qkey
        } else {
            target.remote_qkey
        };
        pkt.deth = Some((qkey, self.qpn));
        pkt.payload_len = wqe.len as u32;
        let r = emit(&pkt, &target, &mut |dst| wqe.gather_into(0, dst));
        if wqe.signaled {
            env.send_completion(self.wc(&wqe, WcStatus::Success));
        }
        Some(r)
    }

    /// Delivers a received datagram: takes a receive, writes the GRH area and the payload,
    /// completes it. What a UD QP does not take is dropped and the reason returned (the
    /// device counts it): a QP not in RTR/RTS/SQD, anything but a SEND ONLY with a DETH, a
    /// payload above the path MTU, a Q_Key other than the QP's (compared whole, the
    /// controlled-key bit included), no receive posted (UD has no RNR). A datagram longer
    /// than the receive buffer completes it with `LOC_LEN_ERR`, nothing written; a receive
    /// whose memory was deregistered since it was posted completes with `LOC_PROT_ERR`,
    /// nothing written, and the QP goes to ERR (rxe: a malformed WQE, class A).
    pub fn handle_packet(
        &mut self,
        pkt: &RxPacket<'_>,
        src: &UdSource,
        env: &mut dyn Env,
    ) -> Result<(), UdDrop> {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return Err(UdDrop::State);
        }
        let Some((qkey, src_qp)) = pkt.deth else {
            return Err(UdDrop::Malformed);
        };
        if !matches!(pkt.kind, Kind::Send | Kind::SendImm)
            || pkt.pos != Pos::Only
            || pkt.payload.len() > self.mtu as usize
        {
            return Err(UdDrop::Malformed);
        }
        if qkey != self.qkey {
            return Err(UdDrop::Qkey);
        }
        let Some(wqe) = env.take_recv() else {
            return Err(UdDrop::NoReceive);
        };
        let mut wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: (GRH_LEN + pkt.payload.len()) as u32,
            qp_num: self.qpn,
            src_qp,
            wc_flags: WcFlags::GRH,
            sl: match (src.src.to_canonical(), src.dst.to_canonical()) {
                (IpAddr::V4(_), IpAddr::V4(_)) => WC_SL_ROCE_V2_IPV4,
                _ => WC_SL_ROCE_V2_IPV6,
            },
            ..WorkCompletion::default()
        };
        if let Some(imm) = pkt.imm {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        let status = if wqe.total_len < (GRH_LEN + pkt.payload.len()) as u64 {
            WcStatus::LocLenErr
        } else {
            let grh = grh_bytes(src, pkt.payload.len(), pkt.imm.is_some());
            match scatter_into(&wqe.sges, 0, &grh)
                .and_then(|()| scatter_into(&wqe.sges, GRH_LEN as u64, pkt.payload))
            {
                Ok(()) => WcStatus::Success,
                Err(AccessError::Mem(_)) => WcStatus::LocLenErr,
                Err(AccessError::Revoked) => WcStatus::LocProtErr,
            }
        };
        if status != WcStatus::Success {
            wc.status = status;
            wc.byte_len = 0;
            wc.wc_flags = WcFlags::empty();
            wc.imm_data = 0;
        }
        env.recv_completion(wc, pkt.solicited);
        if status == WcStatus::LocProtErr {
            self.set_state(QpState::Err, self.qkey, Psn::new(0), env);
        }
        Ok(())
    }
}

/// The 40 bytes a UD receive gets in front of the payload: an IPv6 header, or for IPv4
/// twenty zero bytes followed by the IPv4 header (as RoCEv2 devices deliver it). The
/// headers are those the datagram arrived with as far as a UDP socket tells: the addresses,
/// the lengths (UDP header, BTH, DETH, immediate data, payload, pad, ICRC), protocol UDP;
/// what it does not tell is written as a remem sender sends it (IPv4: DF, identification
/// 0, TTL 64, with a valid header checksum; IPv6: traffic class and flow label 0, hop limit
/// 64). An IPv4-mapped pair of addresses is IPv4.
fn grh_bytes(src: &UdSource, payload_len: usize, imm: bool) -> [u8; GRH_LEN] {
    let pad = payload_len.wrapping_neg() & 3;
    // UDP header, BTH, DETH, ImmDt, payload, pad, ICRC.
    let udp_len = 8 + 12 + 8 + if imm { 4 } else { 0 } + payload_len + pad + 4;
    let mut g = [0u8; GRH_LEN];
    match (src.src.to_canonical(), src.dst.to_canonical()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = remem_wire::icrc::ipv4_header(
                s,
                d,
                0,
                remem_wire::icrc::IPV4_DF,
                64,
                0,
                udp_len - 8,
            );
            g[20..].copy_from_slice(&ip);
        }
        (s, d) => {
            let to6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            g[0] = 0x60;
            let plen = udp_len.min(usize::from(u16::MAX)) as u16;
            g[4..6].copy_from_slice(&plen.to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&to6(s).octets());
            g[24..40].copy_from_slice(&to6(d).octets());
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::RxPacket;
    use crate::transport::wqe::{RecvWqe, SendData};
    use remem_verbs::{AhAttr, MemRegion, MemoryBuffer};
    use std::sync::Arc;

    use crate::transport::fake::FakeEnv as E;

    fn ready(qpn: u32, env: &mut E) -> UdTransport {
        let mut t = UdTransport::new(qpn, 1024);
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            t.set_state(s, 0x1111_1111, Psn::new(5), env);
        }
        t
    }

    #[test]
    fn datagram_round_trip_with_grh_and_imm() {
        let (mut ea, mut eb) = (E::default(), E::default());
        let mut a = ready(0x20, &mut ea);
        let mut b = ready(0x30, &mut eb);
        let src = Arc::new(MemoryBuffer::from_vec(b"hello, datagram".to_vec()));
        let wqe = SendWqe {
            wr_id: 9,
            op: SendOp::SendWithImm { imm: 77 },
            data: SendData::Sges(vec![MemRegion::whole(src).into()]),
            len: 15,
            signaled: true,
            solicited: false,
            fence: false,
            ud: Some(UdTarget {
                av: AhAttr::default(),
                remote_qpn: 0x30,
                remote_qkey: 0x8000_0000, // use our own Q_Key
            }),
        };
        a.post_send(wqe, &mut ea);
        let recv = Arc::new(MemoryBuffer::zeroed(100).unwrap());
        eb.rq.push_back(RecvWqe {
            wr_id: 1,
            sges: vec![MemRegion::whole(recv.clone()).into()],
            total_len: 100,
        });
        let (hdr, payload) = a
            .poll_transmit(&mut ea, |h, t, fill| {
                assert_eq!(t.remote_qpn, 0x30);
                let mut p = vec![0; h.payload_len as usize];
                fill(&mut p).unwrap();
                (*h, p)
            })
            .unwrap();
        assert_eq!(hdr.deth, Some((0x1111_1111, 0x20)));
        assert_eq!(hdr.psn, Psn::new(5));
        assert_eq!(ea.sent.len(), 1);
        let mut rx = RxPacket::new(hdr.kind, hdr.pos, hdr.psn);
        rx.deth = hdr.deth;
        rx.imm = hdr.imm;
        rx.payload = &payload;
        let from = UdSource {
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.2".parse().unwrap(),
        };
        b.handle_packet(&rx, &from, &mut eb).unwrap();
        let wc = eb.recvd[0];
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len, 40 + 15);
        assert_eq!(wc.src_qp, 0x20);
        assert_eq!(wc.imm(), Some(77));
        assert!(wc.wc_flags.contains(WcFlags::GRH));
        let got = recv.to_vec(0, 55).unwrap();
        assert_eq!(&got[40..], b"hello, datagram");
        assert_eq!(got[20], 0x45);
        assert_eq!(&got[32..36], &[127, 0, 0, 1]);
        // rxe's GRH area for IPv4: twenty zero bytes, then the IPv4 header whose last four
        // bytes (the last four of the area) are the destination address.
        assert_eq!(&got[..20], &[0; 20]);
        assert_eq!(&got[36..40], &[127, 0, 0, 2]);
        // wc.sl: mlx5's RoCEv2-over-IPv4 packet type (UCX's ud_verbs reads it).
        assert_eq!(wc.sl, WC_SL_ROCE_V2_IPV4);
        assert_eq!(wc.sl & 0x7, 2);
        // Wrong Q_Key: dropped; no receive: dropped (the device counts both).
        rx.deth = Some((0x2222, 0x20));
        assert_eq!(b.handle_packet(&rx, &from, &mut eb), Err(UdDrop::Qkey));
        rx.deth = hdr.deth;
        assert_eq!(b.handle_packet(&rx, &from, &mut eb), Err(UdDrop::NoReceive));
        assert_eq!(eb.recvd.len(), 1);
    }

    #[test]
    fn a_receive_deregistered_after_its_post_takes_nothing() {
        let mut e = E::default();
        let mut t = ready(0x30, &mut e);
        let recv = Arc::new(MemoryBuffer::zeroed(100).unwrap());
        let key = crate::mem::grant::KeyedRegion::new(MemRegion::whole(recv.clone()));
        e.rq.push_back(RecvWqe {
            wr_id: 1,
            sges: vec![key.grant_all().unwrap()],
            total_len: 100,
        });
        key.revoke();
        let mut rx = RxPacket::new(Kind::Send, Pos::Only, Psn::new(0));
        rx.deth = Some((0x1111_1111, 0x20));
        rx.payload = b"data";
        let from = UdSource {
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.2".parse().unwrap(),
        };
        t.handle_packet(&rx, &from, &mut e).unwrap();
        assert_eq!(e.recvd[0].status, WcStatus::LocProtErr);
        assert_eq!(recv.to_vec(0, 100).unwrap(), vec![0; 100]);
        assert_eq!(t.state(), QpState::Err);
    }

    #[test]
    fn too_long_for_mtu_and_flush() {
        let mut e = E::default();
        let mut t = ready(1, &mut e);
        let big = Arc::new(MemoryBuffer::zeroed(2000).unwrap());
        let mk = |wr_id| SendWqe {
            wr_id,
            op: SendOp::Send,
            data: SendData::Sges(vec![MemRegion::whole(big.clone()).into()]),
            len: 2000,
            signaled: true,
            solicited: false,
            fence: false,
            ud: Some(UdTarget {
                av: AhAttr::default(),
                remote_qpn: 2,
                remote_qkey: 1,
            }),
        };
        t.post_send(mk(1), &mut e);
        assert_eq!(e.sent[0].status, WcStatus::LocLenErr);
        t.set_state(QpState::Err, 0, Psn::new(0), &mut e);
        t.post_send(mk(2), &mut e);
        assert_eq!(e.sent[1].status, WcStatus::WrFlushErr);
    }
}
