//! The UC transport: unreliable connected service (IBTA 9.7.5, 9.8; as Linux rxe runs it).
//!
//! A UC QP is connected to one peer QP like an RC QP and carries SENDs and RDMA WRITEs (with
//! or without immediate) segmented by the path MTU, with the UC opcodes (BTH opcode prefix
//! 0x20), but nothing is acknowledged: no AckReq, no ACK, NAK, retransmission or timer.
//!
//! * **Requester.** Packets get consecutive PSNs from `sq_psn`; a work request completes
//!   (if signaled) once its last packet is handed to the network.
//! * **Responder.** Packets are taken in PSN order. A packet at another PSN than the
//!   expected one, or out of opcode sequence (a MIDDLE or LAST with no message begun, a
//!   packet of another kind than the message in progress), loses the message it belongs
//!   to: the rest of it is dropped silently, and the responder resynchronises at the next
//!   FIRST or ONLY, whatever its PSN (rxe's `check_psn` / `check_op_seq` for UC). A FIRST or
//!   ONLY that arrives while a message is in progress (its LAST was lost) abandons that
//!   message and begins a new one (IBTA's class D1 "missing LAST"; rxe drops this packet
//!   too and so loses one more message). A receive work request a lost SEND had begun to
//!   fill is not completed: the next SEND (or WRITE with immediate) reuses it from its
//!   start. A lost WRITE is abandoned where it stopped (the target memory holds what
//!   arrived, as after any failed WRITE).
//! * **Refusals are silent.** A SEND with no receive posted (RNR), a WRITE through an rkey
//!   that is unknown, of another PD, out of bounds, without REMOTE_WRITE or revoked since,
//!   a WRITE at a QP without REMOTE_WRITE access, a SEND longer than its receive: the
//!   message is dropped, nothing is sent back, the QP stays as it is (rxe's class D/E
//!   errors for UC, a QP without an SRQ; the receive, if one was taken, is kept for the
//!   next message). Each dropped packet is counted ([`UcDrop`], [`Stat::OutOfSeqRequest`]).
//! * The one error that ends the QP is local: a receive or a send whose memory was
//!   deregistered after it was posted completes with `LOC_PROT_ERR` and the QP goes to
//!   ERR, as on RC and UD.

use super::glue::PayloadSink;
use super::rc::MAX_MSG;
use super::{AccessError, Env, Grant, Kind, Pos, Psn, RcConfig, Reth, RxPacket, Stat, TxPacket};
use crate::transport::wqe::{RecvWqe, SendWqe, scatter_into};
use remem_verbs::{AccessFlags, QpState, SendOp, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::collections::VecDeque;

/// Why the UC transport dropped a packet that the device counts as a drop (see
/// [`crate::engine::DropCause`]). Packets lost to a PSN gap or an opcode out of sequence
/// are taken by the QP and counted as [`Stat::OutOfSeqRequest`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UcDrop {
    /// The QP is not in RTR, RTS or SQD.
    State,
    /// Payload sizes against the path MTU or the WRITE's length, a WRITE without its RETH
    /// (the packet, and the rest of its message), or no UC request at all (UC has no READ,
    /// atomic or response opcodes).
    Malformed,
    /// A SEND, or a WRITE with immediate, found no receive posted: the packet, and the rest
    /// of its message (UC has no RNR NAK).
    NoReceive,
    /// The responder refused the message: a WRITE its rkey or the QP's access flags do not
    /// allow, a SEND longer than its receive. The packet and the rest of its message.
    Refused,
}

/// What a message being dropped was dropped for (its remaining packets count the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// A PSN gap or an opcode out of sequence.
    Sequence,
    /// A refusal of the responder.
    Drop(UcDrop),
}

/// The message the responder is in the middle of.
#[derive(Debug)]
enum Progress {
    Idle,
    /// A SEND being placed in the responder's current receive.
    Send {
        offset: u64,
    },
    /// A WRITE: the grant resolved at FIRST (none for a zero-length WRITE).
    Write {
        region: Option<Grant>,
        offset: u64,
        len: u64,
    },
}

impl Progress {
    /// Whether `pkt` continues this message (or, when idle, begins one).
    fn continued_by(&self, pkt: &RxPacket<'_>) -> bool {
        let send = matches!(pkt.kind, Kind::Send | Kind::SendImm);
        match self {
            Progress::Idle => pkt.pos.starts(),
            Progress::Send { .. } => send && !pkt.pos.starts(),
            Progress::Write { .. } => !send && !pkt.pos.starts(),
        }
    }
}

/// The UC transport of one queue pair: requester and responder.
#[derive(Debug)]
pub struct UcTransport {
    cfg: RcConfig,
    state: QpState,
    /// Work requests to send; the first is being sent from packet `cur_pkt`.
    sq: VecDeque<SendWqe>,
    cur_pkt: u32,
    next_psn: Psn,
    /// The PSN the responder expects.
    epsn: Psn,
    progress: Progress,
    /// A receive the responder took and has not completed: the SEND in progress is placed
    /// in it, or a lost message left it for the next one.
    recv: Option<RecvWqe>,
    /// The message in progress is being dropped: its remaining packets go, until the next
    /// FIRST or ONLY.
    lost: Option<Lost>,
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        _ => WcOpcode::Send,
    }
}

impl UcTransport {
    /// A UC transport in RESET. Of `cfg` it uses the QP numbers, the path MTU, the PSNs
    /// and the access flags (UC has no timers, retries or READ/atomic resources).
    pub fn new(cfg: RcConfig) -> Self {
        UcTransport {
            cfg,
            state: QpState::Reset,
            sq: VecDeque::new(),
            cur_pkt: 0,
            next_psn: Psn::new(0),
            epsn: Psn::new(0),
            progress: Progress::Idle,
            recv: None,
            lost: None,
        }
    }

    /// The QP state as the transport sees it.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Applies new attributes and moves to `state`: entering RTR starts the responder at
    /// `rq_psn`, entering RTS from RTR the requester at `sq_psn`; RESET forgets everything;
    /// ERR flushes every work request.
    pub fn set_state(&mut self, cfg: RcConfig, state: QpState, env: &mut dyn Env) {
        let old = self.state;
        self.cfg = cfg;
        self.state = state;
        match state {
            QpState::Reset => {
                self.sq.clear();
                self.cur_pkt = 0;
                self.progress = Progress::Idle;
                self.recv = None;
                self.lost = None;
            }
            QpState::Rtr if old != QpState::Rtr => {
                self.epsn = cfg.rq_psn;
                self.progress = Progress::Idle;
                self.lost = None;
            }
            QpState::Rts if old == QpState::Rtr => self.next_psn = cfg.sq_psn,
            QpState::Err => self.flush(env),
            _ => {}
        }
    }

    /// The application destroyed the QP: it takes no packet and sends none (no completions
    /// are reported).
    pub fn release(&mut self) {
        self.state = QpState::Reset;
        self.sq.clear();
        self.progress = Progress::Idle;
        self.recv = None;
    }

    /// Work requests posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    fn wc(&self, wqe: &SendWqe, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode: wc_opcode(&wqe.op),
            byte_len: wqe.len as u32,
            qp_num: self.cfg.qpn,
            ..WorkCompletion::default()
        }
    }

    /// Queues a validated send work request (a SEND or WRITE, with or without immediate:
    /// the QP refused the others when they were posted). In ERR it completes at once with
    /// `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wqe: SendWqe, env: &mut dyn Env) {
        if self.state == QpState::Err {
            env.send_completion(self.wc(&wqe, WcStatus::WrFlushErr));
        } else {
            self.sq.push_back(wqe);
        }
    }

    /// Completes every work request with `WR_FLUSH_ERR` (the receive the responder holds
    /// first: it was taken before those still queued).
    fn flush(&mut self, env: &mut dyn Env) {
        for w in std::mem::take(&mut self.sq) {
            env.send_completion(self.wc(&w, WcStatus::WrFlushErr));
        }
        self.cur_pkt = 0;
        self.progress = Progress::Idle;
        if let Some(r) = self.recv.take() {
            env.recv_completion(self.recv_wc(&r, WcStatus::WrFlushErr), false);
        }
    }

    /// A local protection error (memory deregistered after the post): the work request
    /// or receive completes with it, the QP goes to ERR.
    fn fail_local(&mut self, wc: WorkCompletion, send: bool, env: &mut dyn Env) {
        env.count(Stat::SendErr);
        if send {
            env.send_completion(wc);
        } else {
            env.recv_completion(wc, false);
        }
        self.state = QpState::Err;
        self.flush(env);
    }

    fn recv_wc(&self, r: &RecvWqe, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: r.wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.cfg.qpn,
            ..WorkCompletion::default()
        }
    }

    // ------------------------------------------------------------------ requester

    /// Produces the next packet to send: `emit` gets its headers and a writer for its
    /// payload. A work request completes (if signaled) once its last packet is emitted;
    /// one whose memory was deregistered since it was posted sends nothing more, completes
    /// with `LOC_PROT_ERR` and the QP goes to ERR. In SQD the message begun is finished and
    /// no other is begun.
    pub fn poll_transmit<R>(
        &mut self,
        env: &mut dyn Env,
        emit: impl FnOnce(
            &TxPacket,
            &mut dyn FnMut(&mut dyn PayloadSink) -> Result<(), AccessError>,
        ) -> R,
    ) -> Option<R> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if self.cur_pkt == 0 && self.state == QpState::Sqd {
            return None;
        }
        // Local operations (memory window bind, local invalidate) at the head run now, in
        // order, and complete at once: UC waits for nothing after a message has gone.
        while self.sq.front().is_some_and(|w| w.op.is_local()) {
            let w = self.sq.pop_front()?;
            match env.local_op(&w.op) {
                Ok(()) if w.signaled => env.send_completion(self.wc(&w, WcStatus::Success)),
                Ok(()) => {}
                Err(status) => {
                    // Refused: the QP goes to ERR (rxe), the rest is flushed.
                    self.fail_local(self.wc(&w, status), true, env);
                    return None;
                }
            }
        }
        let wqe = self.sq.front()?;
        if wqe.is_revoked() {
            let wc = self.wc(wqe, WcStatus::LocProtErr);
            self.sq.pop_front();
            self.fail_local(wc, true, env);
            return None;
        }
        let mtu = u64::from(self.cfg.mtu);
        let npkts = wqe.len.div_ceil(mtu).max(1) as u32;
        let k = self.cur_pkt;
        let offset = u64::from(k) * mtu;
        let psn = self.next_psn;
        let (kind, reth, imm) = match wqe.op {
            SendOp::Send => (Kind::Send, None, None),
            SendOp::SendWithImm { imm } => (Kind::SendImm, None, Some(imm)),
            SendOp::RdmaWrite { remote_addr, rkey } => (
                Kind::Write,
                Some(Reth {
                    va: remote_addr,
                    rkey,
                    dma_len: wqe.len as u32,
                }),
                None,
            ),
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (
                Kind::WriteImm,
                Some(Reth {
                    va: remote_addr,
                    rkey,
                    dma_len: wqe.len as u32,
                }),
                Some(imm),
            ),
            // Refused when posted; never queued.
            _ => {
                let wc = self.wc(wqe, WcStatus::LocQpOpErr);
                self.sq.pop_front();
                self.fail_local(wc, true, env);
                return None;
            }
        };
        let pos = Pos::of(k, npkts);
        let mut pkt = TxPacket::new(kind, pos, self.cfg.dest_qpn, psn);
        pkt.uc = true;
        pkt.reth = reth.filter(|_| pos.starts());
        pkt.imm = imm.filter(|_| pos.ends());
        pkt.solicited = wqe.solicited && pos.ends();
        pkt.payload_len = (wqe.len - offset).min(mtu) as u32;
        let mut revoked = false;
        let r = emit(&pkt, &mut |dst| {
            let res = wqe.gather_into(offset, dst);
            revoked |= res == Err(AccessError::Revoked);
            res
        });
        if revoked {
            // Deregistered between the check above and the copy: the packet was not built.
            let wqe = self.sq.pop_front()?;
            self.cur_pkt = 0;
            self.fail_local(self.wc(&wqe, WcStatus::LocProtErr), true, env);
            return Some(r);
        }
        self.next_psn = psn.next();
        self.cur_pkt += 1;
        if self.cur_pkt >= npkts {
            self.cur_pkt = 0;
            let wqe = self.sq.pop_front()?;
            if wqe.signaled {
                env.send_completion(self.wc(&wqe, WcStatus::Success));
            }
        }
        Some(r)
    }

    // ------------------------------------------------------------------ responder

    /// Handles a received packet. `Ok` when the QP took it — executed, or dropped as part
    /// of a message lost to a PSN gap or an opcode out of sequence (counted as
    /// [`Stat::OutOfSeqRequest`]); `Err` with the reason for the packets the device
    /// counts as drops (the QP's state, a malformed packet, no receive, a refusal).
    pub fn handle_packet(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<(), UcDrop> {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return Err(UcDrop::State);
        }
        if !matches!(
            pkt.kind,
            Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm
        ) {
            return Err(UcDrop::Malformed);
        }
        let in_order = pkt.psn == self.epsn && self.lost.is_none();
        if !in_order || !self.progress.continued_by(pkt) {
            if pkt.pos.starts() {
                // Resynchronise: whatever was in progress is abandoned (its receive stays
                // for this message) and this packet begins a new message.
                self.progress = Progress::Idle;
                self.lost = None;
            } else {
                self.progress = Progress::Idle;
                let lost = *self.lost.get_or_insert(Lost::Sequence);
                return Self::dropped(lost, env);
            }
        }
        self.epsn = pkt.psn.next();
        match self.execute(pkt, env) {
            Ok(()) => Ok(()),
            Err(why) => {
                self.progress = Progress::Idle;
                self.lost = (!pkt.pos.ends()).then_some(Lost::Drop(why));
                tracing::trace!(
                    qpn = self.cfg.qpn,
                    psn = pkt.psn.value(),
                    ?why,
                    "UC message dropped"
                );
                Err(why)
            }
        }
    }

    fn dropped(lost: Lost, env: &mut dyn Env) -> Result<(), UcDrop> {
        match lost {
            Lost::Sequence => {
                env.count(Stat::OutOfSeqRequest);
                Ok(())
            }
            Lost::Drop(why) => Err(why),
        }
    }

    /// Executes an in-sequence packet; `Err` drops the message.
    fn execute(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<(), UcDrop> {
        let mtu = u64::from(self.cfg.mtu);
        let plen = pkt.payload.len() as u64;
        // Payload sizes: FIRST and MIDDLE carry exactly one MTU, LAST 1..=MTU.
        let sized = match pkt.pos {
            Pos::First | Pos::Middle => plen == mtu,
            Pos::Last => plen != 0 && plen <= mtu,
            Pos::Only => plen <= mtu,
        };
        if !sized {
            return Err(UcDrop::Malformed);
        }
        match pkt.kind {
            Kind::Send | Kind::SendImm => self.exec_send(pkt, env),
            _ => self.exec_write(pkt, env),
        }
    }

    /// The receive for the message at hand: the one held, else the next posted.
    fn take_recv(&mut self, env: &mut dyn Env) -> Result<(), UcDrop> {
        if self.recv.is_none() {
            self.recv = env.take_recv();
        }
        if self.recv.is_some() {
            Ok(())
        } else {
            Err(UcDrop::NoReceive)
        }
    }

    fn exec_send(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<(), UcDrop> {
        let offset = match self.progress {
            Progress::Send { offset, .. } => offset,
            _ => 0,
        };
        self.take_recv(env)?;
        let Some(recv) = &self.recv else {
            return Err(UcDrop::NoReceive);
        };
        if offset + pkt.payload.len() as u64 > MAX_MSG {
            return Err(UcDrop::Malformed);
        }
        match scatter_into(&recv.sges, offset, pkt.payload) {
            Ok(()) => {}
            // Longer than the receive (rxe: a length error, class D: dropped).
            Err(AccessError::Mem(_)) => return Err(UcDrop::Refused),
            // The receive's memory was deregistered since it was posted.
            Err(AccessError::Revoked) => {
                let wc = self.recv_wc(recv, WcStatus::LocProtErr);
                self.recv = None;
                self.fail_local(wc, false, env);
                return Ok(());
            }
        }
        let offset = offset + pkt.payload.len() as u64;
        if pkt.pos.ends() {
            let recv = self.recv.take().ok_or(UcDrop::NoReceive)?;
            let mut wc = WorkCompletion {
                byte_len: offset as u32,
                src_qp: self.cfg.dest_qpn,
                ..self.recv_wc(&recv, WcStatus::Success)
            };
            if let Some(imm) = pkt.imm.filter(|_| pkt.kind == Kind::SendImm) {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            self.progress = Progress::Idle;
            env.recv_completion(wc, pkt.solicited);
        } else {
            self.progress = Progress::Send { offset };
        }
        Ok(())
    }

    fn exec_write(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<(), UcDrop> {
        // rxe's check_op_valid for UC: a QP without REMOTE_WRITE drops the message.
        if !self.cfg.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(UcDrop::Refused);
        }
        let (region, offset, len) = match std::mem::replace(&mut self.progress, Progress::Idle) {
            Progress::Write {
                region,
                offset,
                len,
                ..
            } => (region, offset, len),
            _ => {
                let reth = pkt.reth.ok_or(UcDrop::Malformed)?;
                let len = u64::from(reth.dma_len);
                if len > MAX_MSG {
                    return Err(UcDrop::Malformed);
                }
                let region = if len == 0 {
                    None // a zero-length WRITE checks no key (IBTA 9.4.3)
                } else {
                    let g = env
                        .remote(reth.rkey, reth.va, len, AccessFlags::REMOTE_WRITE)
                        .map_err(|_| UcDrop::Refused)?;
                    Some(g)
                };
                (region, 0, len)
            }
        };
        let end = offset + pkt.payload.len() as u64;
        if end > len || (pkt.pos.ends() && end != len) {
            return Err(UcDrop::Malformed);
        }
        let takes_recv = pkt.kind == Kind::WriteImm && pkt.pos.ends();
        if takes_recv {
            self.take_recv(env)?;
        }
        if let Some(r) = &region
            && !pkt.payload.is_empty()
        {
            // Every packet goes through the grant resolved at FIRST: a region
            // deregistered since refuses the rest of the WRITE.
            r.write(offset as usize, pkt.payload)
                .map_err(|_| UcDrop::Refused)?;
        }
        if !pkt.pos.ends() {
            self.progress = Progress::Write {
                region,
                offset: end,
                len,
            };
        } else if takes_recv && let Some(recv) = self.recv.take() {
            let wc = WorkCompletion {
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: len as u32,
                imm_data: pkt.imm.unwrap_or(0),
                wc_flags: WcFlags::WITH_IMM,
                src_qp: self.cfg.dest_qpn,
                ..self.recv_wc(&recv, WcStatus::Success)
            };
            env.recv_completion(wc, pkt.solicited);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::grant::KeyedRegion;

    use crate::transport::wqe::SendData;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use remem_verbs::{MemRegion, MemoryBuffer};

    use std::sync::Arc;

    const MTU: u32 = 256;
    use crate::transport::fake::{FakeEnv as Side, RKEY};
    /// The requester's first PSN: its messages cross the 24-bit PSN wrap.
    const SPSN: Psn = Psn::new(0x00ff_fffe);

    fn cfg(qpn: u32, dest: u32) -> RcConfig {
        RcConfig {
            qpn,
            dest_qpn: dest,
            mtu: MTU,
            sq_psn: SPSN,
            rq_psn: SPSN,
            access: AccessFlags::REMOTE_WRITE,
            ..RcConfig::default()
        }
    }

    /// A transport with `cfg`, taken through INIT and RTR to RTS.
    fn ready(cfg: RcConfig, env: &mut Side) -> UcTransport {
        let mut t = UcTransport::new(cfg);
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            t.set_state(cfg, s, env);
        }
        t
    }

    /// A requester (QPN 0x10) and a responder (QPN 0x20) connected to each other.
    fn pair() -> (UcTransport, Side, UcTransport, Side) {
        let (mut ea, mut eb) = (Side::new(), Side::new());
        let a = ready(cfg(0x10, 0x20), &mut ea);
        let b = ready(cfg(0x20, 0x10), &mut eb);
        (a, ea, b, eb)
    }

    /// A signaled work request over `data` (copied into a buffer of its own).
    fn wqe(wr_id: u64, op: SendOp, data: &[u8]) -> SendWqe {
        let buf = Arc::new(MemoryBuffer::from_vec(data.to_vec()));
        SendWqe {
            wr_id,
            op,
            data: SendData::Sges(vec![MemRegion::whole(buf).into()]),
            len: data.len() as u64,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        }
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
            .collect()
    }

    /// A packet on the wire.
    #[derive(Debug, Clone)]
    struct Wire {
        hdr: TxPacket,
        payload: Vec<u8>,
    }

    impl Wire {
        fn rx(&self) -> RxPacket<'_> {
            let h = &self.hdr;
            let mut r = RxPacket::new(h.kind, h.pos, h.psn);
            r.ack_req = h.ack_req;
            r.solicited = h.solicited;
            r.reth = h.reth;
            r.imm = h.imm;
            r.payload = &self.payload;
            r
        }
    }

    /// Everything the transport sends now.
    fn transmit(t: &mut UcTransport, env: &mut Side) -> Vec<Wire> {
        let mut out = Vec::new();
        while let Some(w) = t.poll_transmit(env, |hdr, fill| {
            let mut payload = vec![0u8; hdr.payload_len as usize];
            fill(&mut payload).unwrap();
            Wire { hdr: *hdr, payload }
        }) {
            out.push(w);
        }
        out
    }

    fn deliver(t: &mut UcTransport, env: &mut Side, w: &[Wire]) -> Vec<Result<(), UcDrop>> {
        w.iter().map(|p| t.handle_packet(&p.rx(), env)).collect()
    }

    fn kinds(w: &[Wire]) -> Vec<(Kind, Pos)> {
        w.iter().map(|p| (p.hdr.kind, p.hdr.pos)).collect()
    }

    #[test]
    fn local_operations_run_in_order_between_messages() {
        let (mut a, mut ea, _b, _eb) = pair();
        let bind = SendOp::BindMw {
            mw: 0x100,
            rkey: 0x101,
            lkey: 5,
            addr: 0,
            len: 8,
            access: AccessFlags::REMOTE_WRITE,
        };
        let inv = SendOp::LocalInv { rkey: 0x101 };
        let m = pattern(1, 300);
        a.post_send(wqe(1, SendOp::Send, &m), &mut ea);
        a.post_send(wqe(2, bind, &[]), &mut ea);
        a.post_send(wqe(3, SendOp::Send, &m), &mut ea);
        a.post_send(wqe(4, inv, &[]), &mut ea);
        let w = transmit(&mut a, &mut ea);
        assert_eq!(
            w.len(),
            4,
            "two messages of two packets, nothing for the local ones"
        );
        assert_eq!(ea.local_ops, [bind, inv]);
        let done: Vec<_> = ea
            .sent
            .iter()
            .map(|c| (c.wr_id, c.opcode, c.status))
            .collect();
        assert_eq!(
            done,
            [
                (1, WcOpcode::Send, WcStatus::Success),
                (2, WcOpcode::BindMw, WcStatus::Success),
                (3, WcOpcode::Send, WcStatus::Success),
                (4, WcOpcode::LocalInv, WcStatus::Success),
            ]
        );
        // A refused one fails the QP: what follows is flushed, never sent.
        ea.refuse_local = true;
        a.post_send(wqe(5, SendOp::Send, &m), &mut ea);
        a.post_send(wqe(6, bind, &[]), &mut ea);
        a.post_send(wqe(7, SendOp::Send, &m), &mut ea);
        assert_eq!(transmit(&mut a, &mut ea).len(), 2, "only message 5");
        let done: Vec<_> = ea.sent[4..].iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            done,
            [
                (5, WcStatus::Success),
                (6, WcStatus::MwBindErr),
                (7, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(a.state(), QpState::Err);
    }

    #[test]
    fn messages_go_as_uc_packets_and_complete_when_sent() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        let va = eb.key.region().addr();
        let (m1, m2, m3, m4) = (
            pattern(1, 600),
            pattern(2, 256),
            pattern(3, 513),
            pattern(4, 0),
        );
        a.post_send(wqe(1, SendOp::Send, &m1), &mut ea);
        a.post_send(wqe(2, SendOp::SendWithImm { imm: 0xfeed }, &m2), &mut ea);
        let write = SendOp::RdmaWrite {
            remote_addr: va + 100,
            rkey: RKEY,
        };
        a.post_send(wqe(3, write, &m3), &mut ea);
        let write_imm = SendOp::RdmaWriteWithImm {
            remote_addr: va,
            rkey: RKEY,
            imm: 9,
        };
        a.post_send(wqe(4, write_imm, &m4), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        use Kind::*;
        use Pos::*;
        assert_eq!(
            kinds(&wire),
            [
                (Send, First),
                (Send, Middle),
                (Send, Last),
                (SendImm, Only),
                (Write, First),
                (Write, Middle),
                (Write, Last),
                (WriteImm, Only),
            ]
        );
        // UC: consecutive PSNs across the wrap, no ACK requested, nothing to wait for.
        let psns: Vec<u32> = wire.iter().map(|p| p.hdr.psn.value()).collect();
        assert_eq!(psns, [0x00ff_fffe, 0x00ff_ffff, 0, 1, 2, 3, 4, 5]);
        assert!(wire.iter().all(|p| p.hdr.uc && !p.hdr.ack_req));
        assert!(
            wire.iter()
                .all(|p| p.hdr.aeth.is_none() && p.hdr.dest_qpn == 0x20)
        );
        assert_eq!(wire[4].hdr.reth.map(|r| r.dma_len), Some(513));
        assert_eq!(wire[5].hdr.reth, None);
        assert_eq!(wire[3].hdr.imm, Some(0xfeed));
        // Every work request completed once its last packet left, in order.
        let ids: Vec<u64> = ea.sent.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert!(ea.sent.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(ea.sent[2].opcode, WcOpcode::RdmaWrite);
        assert_eq!(a.send_queue_len(), 0);
        assert!(a.poll_transmit(&mut ea, |_, _| ()).is_none());
        // The responder places them.
        let r1 = eb.post_recv(11, 1024);
        let r2 = eb.post_recv(12, 256);
        let _r3 = eb.post_recv(13, 16);
        assert!(deliver(&mut b, &mut eb, &wire).iter().all(Result::is_ok));
        assert_eq!(r1.to_vec(0, 600).unwrap(), m1);
        assert_eq!(r2.to_vec(0, 256).unwrap(), m2);
        assert_eq!(eb.target.to_vec(100, 513).unwrap(), m3);
        let got: Vec<_> = eb
            .recvd
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm()))
            .collect();
        assert_eq!(
            got,
            [
                (11, WcStatus::Success, WcOpcode::Recv, 600, None),
                (12, WcStatus::Success, WcOpcode::Recv, 256, Some(0xfeed)),
                (13, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0, Some(9)),
            ]
        );
        assert_eq!(eb.stats.len(), 0, "nothing dropped");
    }

    #[test]
    fn a_lost_middle_packet_loses_its_message_and_no_other() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        let (m1, m2) = (pattern(1, 700), pattern(2, 300));
        a.post_send(wqe(1, SendOp::Send, &m1), &mut ea);
        a.post_send(wqe(2, SendOp::Send, &m2), &mut ea);
        let mut wire = transmit(&mut a, &mut ea);
        assert_eq!(wire.len(), 5);
        // The sender completed both: it cannot know.
        assert_eq!(ea.sent.len(), 2);
        wire.remove(1); // the MIDDLE of the first
        let r1 = eb.post_recv(11, 1024);
        eb.post_recv(12, 1024);
        let fates = deliver(&mut b, &mut eb, &wire);
        assert_eq!(fates, [Ok(()); 4]);
        // The first message is lost; its receive takes the second message.
        assert_eq!(eb.recvd.len(), 1);
        assert_eq!(eb.recvd[0].wr_id, 11);
        assert_eq!(eb.recvd[0].byte_len, 300);
        assert_eq!(r1.to_vec(0, 300).unwrap(), m2);
        // The second receive is still posted: no completion for a lost message.
        assert_eq!(eb.rq.len(), 1);
        assert_eq!(eb.stat("out_of_seq_request"), 1, "the orphaned LAST");
        assert_eq!(b.state(), QpState::Rts);
    }

    #[test]
    fn a_lost_first_or_last_packet_loses_its_message_and_no_other() {
        for lost in [0usize, 2] {
            let (mut a, mut ea, mut b, mut eb) = pair();
            let (m1, m2, m3) = (pattern(1, 700), pattern(2, 600), pattern(3, 10));
            for (i, m) in [&m1, &m2, &m3].into_iter().enumerate() {
                a.post_send(wqe(i as u64 + 1, SendOp::Send, m), &mut ea);
            }
            let mut wire = transmit(&mut a, &mut ea);
            assert_eq!(wire.len(), 7);
            wire.remove(lost);
            let r1 = eb.post_recv(11, 1024);
            let r2 = eb.post_recv(12, 1024);
            eb.post_recv(13, 1024);
            deliver(&mut b, &mut eb, &wire);
            // A lost FIRST orphans MIDDLE and LAST; a lost LAST is noticed at the next
            // FIRST, which begins the next message at once (IBTA's "missing LAST").
            let ids: Vec<u64> = eb.recvd.iter().map(|w| w.wr_id).collect();
            assert_eq!(ids, [11, 12], "lost {lost}");
            assert_eq!(r1.to_vec(0, 600).unwrap(), m2);
            assert_eq!(r2.to_vec(0, 10).unwrap(), m3);
            assert_eq!(eb.recvd[0].byte_len, 600);
            assert_eq!(eb.rq.len(), 1);
            assert_eq!(
                eb.stat("out_of_seq_request"),
                if lost == 0 { 2 } else { 0 },
                "lost {lost}"
            );
        }
    }

    #[test]
    fn a_write_that_lost_a_packet_is_abandoned() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        let va = eb.key.region().addr();
        let op = |imm| SendOp::RdmaWriteWithImm {
            remote_addr: va,
            rkey: RKEY,
            imm,
        };
        let m1 = pattern(1, 3 * MTU as usize);
        a.post_send(wqe(1, op(1), &m1), &mut ea);
        a.post_send(wqe(2, op(2), &pattern(2, 8)), &mut ea);
        let mut wire = transmit(&mut a, &mut ea);
        wire.remove(1);
        eb.post_recv(11, 8);
        eb.post_recv(12, 8);
        deliver(&mut b, &mut eb, &wire);
        // The first packet of the lost WRITE landed, then the second WRITE over it; the
        // lost one's LAST did not (nor its immediate).
        let mem = eb.target.to_vec(0, 3 * MTU as usize).unwrap();
        assert_eq!(mem[..8], pattern(2, 8));
        assert_eq!(mem[8..MTU as usize], m1[8..MTU as usize]);
        assert!(mem[MTU as usize..].iter().all(|&x| x == 0));
        let got: Vec<_> = eb.recvd.iter().map(|w| (w.wr_id, w.imm())).collect();
        assert_eq!(got, [(11, Some(2))]);
        assert_eq!(eb.rq.len(), 1);
    }

    #[test]
    fn a_send_without_a_receive_is_dropped_whole_and_the_next_delivered() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        a.post_send(wqe(1, SendOp::Send, &pattern(1, 600)), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        // No receive: every packet of the message goes (no RNR NAK, nothing sent back).
        assert_eq!(deliver(&mut b, &mut eb, &wire), [Err(UcDrop::NoReceive); 3]);
        assert!(transmit(&mut b, &mut eb).is_empty());
        let m2 = pattern(2, 600);
        a.post_send(wqe(2, SendOp::Send, &m2), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        let r = eb.post_recv(11, 1024);
        assert_eq!(deliver(&mut b, &mut eb, &wire), [Ok(()); 3]);
        assert_eq!(r.to_vec(0, 600).unwrap(), m2);
        assert_eq!(eb.recvd.len(), 1);
        // A WRITE with immediate needs a receive at its end too.
        let va = eb.key.region().addr();
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: va,
            rkey: RKEY,
            imm: 5,
        };
        a.post_send(wqe(3, op, &pattern(3, 8)), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        assert_eq!(deliver(&mut b, &mut eb, &wire), [Err(UcDrop::NoReceive)]);
        assert_eq!(eb.recvd.len(), 1);
        assert_eq!(ea.sent.len(), 3);
    }

    #[test]
    fn refused_messages_are_dropped_silently_and_the_qp_goes_on() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        let va = eb.key.region().addr();
        let write = |remote_addr, rkey| SendOp::RdmaWrite { remote_addr, rkey };
        // An unknown rkey, a range out of bounds, a region without REMOTE_WRITE.
        a.post_send(wqe(1, write(va, 0x99), &pattern(1, 600)), &mut ea);
        a.post_send(wqe(2, write(va + 65_000, RKEY), &pattern(2, 600)), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        assert_eq!(deliver(&mut b, &mut eb, &wire), [Err(UcDrop::Refused); 6]);
        eb.set_access(RKEY, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        a.post_send(wqe(3, write(va, RKEY), &pattern(3, 10)), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        assert_eq!(deliver(&mut b, &mut eb, &wire), [Err(UcDrop::Refused)]);
        eb.set_access(RKEY, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        assert!(
            eb.target
                .to_vec(0, 64 * 1024)
                .unwrap()
                .iter()
                .all(|&x| x == 0)
        );
        // A SEND longer than its receive: dropped, the receive kept for the next one.
        a.post_send(wqe(4, SendOp::Send, &pattern(4, 300)), &mut ea);
        a.post_send(wqe(5, SendOp::Send, &pattern(5, 100)), &mut ea);
        let wire = transmit(&mut a, &mut ea);
        let r = eb.post_recv(11, 200);
        assert_eq!(
            deliver(&mut b, &mut eb, &wire),
            [Err(UcDrop::Refused), Err(UcDrop::Refused), Ok(())]
        );
        assert_eq!(eb.recvd.len(), 1);
        assert_eq!((eb.recvd[0].wr_id, eb.recvd[0].byte_len), (11, 100));
        assert_eq!(r.to_vec(0, 100).unwrap(), pattern(5, 100));
        // No event, nothing sent back, the QP goes on; the sender completed everything.
        assert!(eb.events.is_empty());
        assert!(transmit(&mut b, &mut eb).is_empty());
        assert_eq!(b.state(), QpState::Rts);
        assert_eq!(ea.sent.len(), 5);
        assert!(ea.sent.iter().all(|w| w.status == WcStatus::Success));
        // A QP without REMOTE_WRITE takes no WRITE at all.
        let mut ro = cfg(0x20, 0x10);
        ro.access = AccessFlags::REMOTE_READ;
        let (mut ec, mut c) = (Side::new(), UcTransport::new(ro));
        for s in [QpState::Init, QpState::Rtr] {
            c.set_state(ro, s, &mut ec);
        }
        let mut a = ready(cfg(0x10, 0x20), &mut ea);
        a.post_send(
            wqe(6, write(ec.key.region().addr(), RKEY), &[1; 8]),
            &mut ea,
        );
        let wire = transmit(&mut a, &mut ea);
        assert_eq!(deliver(&mut c, &mut ec, &wire), [Err(UcDrop::Refused)]);
        assert!(ec.target.to_vec(0, 8).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn malformed_sizes_and_states_are_dropped() {
        let (_, _, mut b, mut eb) = pair();
        eb.post_recv(11, 4096);
        // A FIRST shorter than the MTU, and the rest of its message.
        let short = [0u8; 100];
        let mut p = RxPacket::new(Kind::Send, Pos::First, SPSN);
        p.payload = &short;
        assert_eq!(b.handle_packet(&p, &mut eb), Err(UcDrop::Malformed));
        let full = [0u8; MTU as usize];
        let mut p = RxPacket::new(Kind::Send, Pos::Last, SPSN.next());
        p.payload = &full;
        assert_eq!(b.handle_packet(&p, &mut eb), Err(UcDrop::Malformed));
        // A WRITE ONLY without its RETH; one longer than its RETH says.
        let mut p = RxPacket::new(Kind::Write, Pos::Only, SPSN.add(2));
        p.payload = &short;
        assert_eq!(b.handle_packet(&p, &mut eb), Err(UcDrop::Malformed));
        p.reth = Some(Reth {
            va: eb.key.region().addr(),
            rkey: RKEY,
            dma_len: 50,
        });
        assert_eq!(b.handle_packet(&p, &mut eb), Err(UcDrop::Malformed));
        // Then a good one.
        let mut p = RxPacket::new(Kind::SendImm, Pos::Only, SPSN.add(9));
        p.payload = &short;
        p.imm = Some(3);
        assert_eq!(b.handle_packet(&p, &mut eb), Ok(()));
        assert_eq!(eb.recvd[0].byte_len, 100);
        // Responses and READs have no place at a UC QP; in INIT nothing is taken.
        let p = RxPacket::new(Kind::ReadRequest, Pos::Only, SPSN.add(10));
        assert_eq!(b.handle_packet(&p, &mut eb), Err(UcDrop::Malformed));
        let mut c = UcTransport::new(cfg(0x20, 0x10));
        c.set_state(cfg(0x20, 0x10), QpState::Init, &mut eb);
        let p = RxPacket::new(Kind::Send, Pos::Only, SPSN);
        assert_eq!(c.handle_packet(&p, &mut eb), Err(UcDrop::State));
    }

    #[test]
    fn deregistered_memory_ends_the_qp_as_on_rc() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        // A send whose source is deregistered after the post.
        let src = Arc::new(MemoryBuffer::zeroed(600).unwrap());
        let key = KeyedRegion::new(MemRegion::whole(src));
        let mut w = wqe(1, SendOp::Send, &[]);
        w.data = SendData::Sges(vec![key.grant_all().unwrap()]);
        w.len = 600;
        a.post_send(w, &mut ea);
        a.post_send(wqe(2, SendOp::Send, &[1]), &mut ea);
        key.revoke();
        assert!(transmit(&mut a, &mut ea).is_empty());
        let st: Vec<_> = ea.sent.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(st, [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]);
        assert_eq!(a.state(), QpState::Err);
        // A receive deregistered after its post takes no data.
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let key = KeyedRegion::new(MemRegion::whole(buf.clone()));
        eb.rq.push_back(RecvWqe {
            wr_id: 11,
            sges: vec![key.grant_all().unwrap()],
            total_len: 64,
        });
        eb.post_recv(12, 64);
        key.revoke();
        let mut p = RxPacket::new(Kind::Send, Pos::Only, SPSN);
        p.payload = b"data";
        assert_eq!(b.handle_packet(&p, &mut eb), Ok(()));
        assert_eq!(eb.recvd[0].status, WcStatus::LocProtErr);
        assert_eq!(b.state(), QpState::Err);
        assert!(buf.to_vec(0, 64).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn err_flushes_the_receive_a_lost_message_left_behind() {
        let (mut a, mut ea, mut b, mut eb) = pair();
        a.post_send(wqe(1, SendOp::Send, &pattern(1, 600)), &mut ea);
        let mut wire = transmit(&mut a, &mut ea);
        wire.pop(); // the LAST: the receive stays with the QP
        eb.post_recv(11, 1024);
        eb.post_recv(12, 1024);
        deliver(&mut b, &mut eb, &wire);
        assert!(eb.recvd.is_empty());
        b.set_state(cfg(0x20, 0x10), QpState::Err, &mut eb);
        // The QP's own queue is flushed by the QP object; the held receive by the transport.
        let got: Vec<_> = eb.recvd.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(11, WcStatus::WrFlushErr)]);
    }

    #[test]
    fn sqd_finishes_the_message_begun_and_begins_none() {
        let (mut a, mut ea, _, _) = pair();
        a.post_send(wqe(1, SendOp::Send, &pattern(1, 600)), &mut ea);
        a.post_send(wqe(2, SendOp::Send, &pattern(2, 10)), &mut ea);
        let first = a.poll_transmit(&mut ea, |h, _| h.pos).unwrap();
        assert_eq!(first, Pos::First);
        a.set_state(cfg(0x10, 0x20), QpState::Sqd, &mut ea);
        let rest = transmit(&mut a, &mut ea);
        assert_eq!(
            kinds(&rest),
            [(Kind::Send, Pos::Middle), (Kind::Send, Pos::Last)]
        );
        assert_eq!(ea.sent.len(), 1);
        a.set_state(cfg(0x10, 0x20), QpState::Rts, &mut ea);
        assert_eq!(transmit(&mut a, &mut ea).len(), 1);
        assert_eq!(ea.sent.len(), 2);
    }

    /// Random messages through a network that loses packets (even seeds), or that also
    /// duplicates and reorders them (odd seeds): the sender completes every work request;
    /// the receiver completes only whole messages, each exactly as sent (data and
    /// immediate), receives in the order posted; over a network that keeps the order, the
    /// messages arrive in the order sent, each at most once. (A packet that overtakes
    /// others, or a copy of one, is a new message to UC if it is an ONLY: UC relies on the
    /// network's order, as RoCE's per-flow order gives it.)
    #[test]
    fn over_a_lossy_network_only_whole_messages_arrive() {
        for seed in 0..200u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let ordered = seed % 2 == 0;
            let (mut a, mut ea, mut b, mut eb) = pair();
            let n = 40;
            let mut sent = Vec::new();
            for i in 0..n {
                let len = match rng.random_range(0..4) {
                    0 => rng.random_range(0..=MTU as usize),
                    1 => MTU as usize * rng.random_range(1..4),
                    _ => rng.random_range(0..4 * MTU as usize),
                };
                let m = pattern(i as u8, len);
                let imm = (len == 0 || rng.random_bool(0.5)).then_some(i);
                let op = match imm {
                    Some(imm) => SendOp::SendWithImm { imm },
                    None => SendOp::Send,
                };
                a.post_send(wqe(u64::from(i), op, &m), &mut ea);
                sent.push((m, imm));
            }
            let bufs: Vec<_> = (0..n)
                .map(|i| eb.post_recv(100 + u64::from(i), 1024))
                .collect();
            let mut wire = Vec::new();
            for p in transmit(&mut a, &mut ea) {
                if rng.random_bool(0.1) {
                    continue;
                }
                if !ordered && rng.random_bool(0.05) {
                    wire.push(p.clone());
                }
                wire.push(p);
            }
            if !ordered {
                for _ in 0..wire.len() / 10 {
                    let i = rng.random_range(0..wire.len());
                    let j = rng.random_range(0..wire.len());
                    wire.swap(i, j);
                }
            }
            deliver(&mut b, &mut eb, &wire);
            assert_eq!(ea.sent.len(), n as usize, "seed {seed}");
            assert!(ea.sent.iter().all(|w| w.status == WcStatus::Success));
            assert!(!eb.recvd.is_empty(), "seed {seed}: nothing arrived");
            let mut last = None;
            for (k, wc) in eb.recvd.iter().enumerate() {
                assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
                assert_eq!(wc.wr_id, 100 + k as u64, "seed {seed}");
                let got = (bufs[k].to_vec(0, wc.byte_len as usize).unwrap(), wc.imm());
                let Some(i) = sent.iter().position(|m| *m == got) else {
                    panic!("seed {seed}: receive {k} holds no message sent");
                };
                if ordered {
                    assert!(last.is_none_or(|l| i > l), "seed {seed}: out of order");
                    last = Some(i);
                }
            }
        }
    }
}
