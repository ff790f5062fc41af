//! The completer of an RC queue pair: ACKs, NAKs, READ responses and atomic
//! acknowledgements, the completions they make (in order), failures and the flush of the
//! send queue.

use super::responder::{InProgress, Out};
use super::{ACK_UNLIMITED, Env, Kind, Pos, Psn, RcTransport, RxPacket, Stat, Syndrome};
use remem_verbs::qp::rnr_timer_us;
use remem_verbs::{QpState, RNR_RETRY_INFINITE, SendOp, WcOpcode, WcStatus, WorkCompletion};
use std::time::{Duration, Instant};

impl RcTransport {
    /// Acknowledges every PSN up to and including `psn`. Returns whether it made progress.
    pub(super) fn ack_through(&mut self, now: Instant, psn: Psn, env: &mut dyn Env) -> bool {
        let r = &mut self.req;
        if psn.is_before(r.una) || psn.diff(r.max_sent) >= 0 {
            return false; // stale or acknowledging what was never sent
        }
        let mut new_una = psn.next();
        let mut lost_read = None;
        for e in r.sq.iter_mut() {
            if !e.started || e.status.is_some() {
                if e.status.is_some() {
                    continue;
                }
                break;
            }
            if e.is_rd() {
                // Responses carry READ/atomic completions; an ACK past the expected
                // response means they were lost.
                let expected = e.first_psn.add(e.resp_pkts);
                if psn.diff(expected) >= 0 {
                    new_una = expected;
                    lost_read = Some(expected);
                }
                break;
            }
            if psn.diff(e.last_psn()) >= 0 {
                e.status = Some(WcStatus::Success);
            } else {
                break;
            }
        }
        let progressed = new_una.is_after(r.una);
        self.advance_una(now, new_una);
        if let Some(p) = lost_read {
            self.rerequest_lost(now, p, env);
        }
        self.retire(now, env);
        progressed
    }

    /// Reports finished work requests from the head of the send queue, in order.
    pub(super) fn retire(&mut self, now: Instant, env: &mut dyn Env) {
        while let Some(e) = self.req.sq.front() {
            let Some(status) = e.status else { break };
            let e = self.req.sq.pop_front().expect("front exists");
            if e.is_rd() && e.started && status == WcStatus::Success {
                self.req.rd_outstanding = self.req.rd_outstanding.saturating_sub(1);
            }
            // A READ that completed ahead (its responses came while an earlier one waited)
            // is acknowledged through its last PSN once it is retired in order.
            if e.started && status == WcStatus::Success {
                self.advance_una(now, e.first_psn.add(e.npkts));
            }
            if e.wqe.signaled || status != WcStatus::Success {
                env.send_completion(self.wc(&e.wqe, status));
            }
            if self.req.cur > 0 {
                self.req.cur -= 1;
            } else {
                self.req.cur_pkt = 0;
            }
            if e.wqe.op.is_local() && status != WcStatus::Success && self.state != QpState::Err {
                // A refused bind or invalidate: the QP goes to ERR (rxe), the rest of the
                // send queue is flushed.
                env.count(Stat::SendErr);
                self.state = QpState::Err;
                self.flush(env);
                return;
            }
        }
        let r = &mut self.req;
        if r.next_psn.is_before(r.una) {
            let una = r.una;
            self.rewind_to(una);
        }
        // The timers run while something is unacknowledged; forward progress restarted
        // them (`on_progress`), anything else leaves them running.
        let r = &mut self.req;
        if r.una == r.max_sent {
            r.timer = None;
            r.rto_at = None;
        } else if r.timer.is_none() {
            r.timer = self.cfg.ack_timeout().map(|t| now + t);
        }
    }

    /// Fails the entry holding `psn` (or the head) with `status`: the QP goes to ERR.
    pub(super) fn fail(
        &mut self,
        now: Instant,
        psn: Option<Psn>,
        status: WcStatus,
        env: &mut dyn Env,
    ) {
        let idx = psn
            .and_then(|p| self.req.sq.iter().position(|e| e.started && e.holds(p)))
            .unwrap_or(0);
        // Entries before it were acknowledged (NAKs acknowledge earlier PSNs).
        for e in self.req.sq.iter_mut().take(idx) {
            e.status.get_or_insert(WcStatus::Success);
        }
        if let Some(e) = self.req.sq.get_mut(idx) {
            e.status = Some(status);
        }
        env.count(Stat::SendErr);
        self.retire(now, env);
        self.state = QpState::Err;
        self.flush(env);
    }

    /// Completes every outstanding work request with `WR_FLUSH_ERR`.
    pub(super) fn flush(&mut self, env: &mut dyn Env) {
        let sq = std::mem::take(&mut self.req.sq);
        for e in sq {
            match e.status {
                Some(WcStatus::Success) if !e.wqe.signaled => {}
                Some(s) => env.send_completion(self.wc(&e.wqe, s)),
                None => env.send_completion(self.wc(&e.wqe, WcStatus::WrFlushErr)),
            }
        }
        self.req.cur = 0;
        self.req.cur_pkt = 0;
        self.req.timer = None;
        self.req.rnr_until = None;
        self.req.rd_outstanding = 0;
        // A receive a multi-packet SEND had begun to fill is flushed like the queued ones
        // (first: it was taken first), not dropped: its buffer must come back to the
        // application (rxe completes `qp->resp.wqe` with a flush error too).
        if let InProgress::Send { wqe, .. } =
            std::mem::replace(&mut self.resp.progress, InProgress::Idle)
        {
            env.recv_completion(
                WorkCompletion {
                    wr_id: wqe.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: self.cfg.qpn,
                    ..WorkCompletion::default()
                },
                false,
            );
        }
        // Keep queued NAKs so the peer learns why; drop everything else.
        self.resp
            .out
            .retain(|o| matches!(o, Out::Ack { syndrome, .. } if *syndrome != ACK_UNLIMITED));
    }

    /// Handles a response packet (ACK, NAK, READ response, atomic ACK).
    pub(super) fn handle_response(&mut self, now: Instant, pkt: &RxPacket<'_>, env: &mut dyn Env) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        match pkt.kind {
            Kind::Ack => {
                let Some((syndrome, _msn)) = pkt.aeth else {
                    return;
                };
                match syndrome {
                    Syndrome::Ack { .. } => {
                        let stale = pkt.psn.is_before(self.req.una);
                        if !self.ack_through(now, pkt.psn, env) && stale {
                            self.on_stale_response(now);
                        }
                    }
                    nak => self.handle_nak(now, pkt.psn, nak, env),
                }
            }
            Kind::AtomicAck => {
                let Some(orig) = pkt.atomic_ack else { return };
                let Some(i) = self.first_pending_rd() else {
                    self.on_stale_response(now);
                    return;
                };
                let e = &self.req.sq[i];
                let is_atomic = matches!(
                    e.wqe.op,
                    SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
                );
                if e.first_psn != pkt.psn || !is_atomic {
                    // A duplicate (a resent atomic answered again) or unexpected.
                    if pkt.psn.is_before(e.first_psn) {
                        self.on_stale_response(now);
                    }
                    return;
                }
                self.ack_through(now, pkt.psn.prev(), env);
                let Some(i) = self.first_pending_rd() else {
                    return;
                };
                let e = &mut self.req.sq[i];
                let status = match e.wqe.scatter(0, &orig.to_ne_bytes()) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocProtErr,
                };
                e.status = Some(status);
                self.advance_una(now, pkt.psn.next());
                if status == WcStatus::Success {
                    self.retire(now, env);
                } else {
                    self.fail(now, Some(pkt.psn), status, env);
                }
            }
            Kind::ReadResponse => self.handle_read_response(now, pkt, env),
            _ => {}
        }
        self.settle_ahead(now, env);
    }

    /// A response for a READ after `first` (the first READ/atomic still waiting), the next
    /// one that READ expects: its data is placed now and counted, so that the go-back-N
    /// after the loss before it re-requests only what is still missing (the READ completes
    /// in order, once everything before it has). Anything else is ignored: it is asked for
    /// again and checked when its READ is the first waiting.
    fn accept_ahead(&mut self, pkt: &RxPacket<'_>, first: usize) {
        let mtu = u64::from(self.cfg.mtu);
        let Some(e) = self
            .req
            .sq
            .iter_mut()
            .skip(first + 1)
            .find(|e| e.started && e.holds(pkt.psn))
        else {
            return;
        };
        if e.status.is_some()
            || !matches!(e.wqe.op, SendOp::RdmaRead { .. })
            || e.first_psn.add(e.resp_pkts) != pkt.psn
        {
            return;
        }
        let offset = u64::from(e.resp_pkts) * mtu;
        let last = e.resp_pkts + 1 == e.npkts;
        let want = if last {
            e.wqe.len.saturating_sub(offset)
        } else {
            mtu
        };
        if pkt.pos.ends() != last
            || pkt.payload.len() as u64 != want
            || e.wqe.scatter(offset, pkt.payload).is_err()
        {
            return;
        }
        e.resp_pkts += 1;
        if last {
            e.status = Some(WcStatus::Success);
        }
        self.req.ahead = true;
    }

    /// Responses received ahead acknowledge what was requested before them once nothing
    /// before is missing: moves the first unacknowledged PSN over them (a READ's responses
    /// acknowledge every earlier request, IBTA's implicit acknowledgement).
    pub(super) fn settle_ahead(&mut self, now: Instant, env: &mut dyn Env) {
        if self.req.sq.is_empty() {
            self.req.ahead = false;
        }
        if !self.req.ahead {
            return;
        }
        for _ in 0..=self.req.sq.len() {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                return;
            }
            let r = &self.req;
            let Some(i) = r.sq.iter().position(|e| e.status.is_none()) else {
                return;
            };
            let e = &r.sq[i];
            if !e.started {
                // Everything sent is finished.
                if r.max_sent.diff(r.una) <= 0 {
                    return;
                }
                let max_sent = r.max_sent;
                self.advance_una(now, max_sent);
                self.retire(now, env);
                continue;
            }
            let is_read = matches!(e.wqe.op, SendOp::RdmaRead { .. });
            if is_read {
                // Everything before the first unfinished READ is finished, and the
                // responses it has came in order from its first.
                let expected = e.first_psn.add(e.resp_pkts);
                if expected.diff(r.una) <= 0 {
                    return;
                }
                self.advance_una(now, expected);
                self.retire(now, env);
                continue;
            }
            if e.is_rd() {
                return;
            }
            // SENDs/WRITEs not acknowledged yet, before a READ answered ahead: its
            // responses acknowledge them.
            let Some(rd) = r.sq.iter().skip(i + 1).find(|e| e.is_rd()) else {
                return;
            };
            let answered = rd.started
                && matches!(rd.wqe.op, SendOp::RdmaRead { .. })
                && (rd.resp_pkts > 0 || rd.status.is_some());
            if !answered {
                return;
            }
            let before = rd.first_psn.prev();
            if !self.ack_through(now, before, env) {
                return;
            }
        }
    }

    /// Index of the first READ/atomic entry awaiting its response.
    pub(super) fn first_pending_rd(&self) -> Option<usize> {
        self.req
            .sq
            .iter()
            .position(|e| e.started && e.status.is_none() && e.is_rd())
    }

    pub(super) fn handle_read_response(
        &mut self,
        now: Instant,
        pkt: &RxPacket<'_>,
        env: &mut dyn Env,
    ) {
        let Some(i) = self.first_pending_rd() else {
            // Responses of a READ already complete: the responder sending again what a
            // retransmission asked for.
            self.on_stale_response(now);
            return;
        };
        let e = &self.req.sq[i];
        let answered_by_empty =
            matches!(e.wqe.op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. });
        let expected = e.first_psn.add(e.resp_pkts);
        let d = pkt.psn.diff(expected);
        if d < 0 {
            // A duplicate, or a READ before it answered again.
            self.on_stale_response(now);
            return;
        }
        if !matches!(e.wqe.op, SendOp::RdmaRead { .. }) && !answered_by_empty {
            return;
        }
        if d > 0 {
            // Earlier responses were lost: ask again from the first missing one (once: the
            // responses the peer sent before it saw the re-request are no new loss). A
            // response of a later READ is kept if it is the next one that READ expects:
            // its request needs no answer twice.
            self.accept_ahead(pkt, i);
            self.rerequest_lost(now, expected, env);
            return;
        }
        // Responses acknowledge every earlier request.
        if expected.is_after(self.req.una) {
            self.ack_through(now, expected.prev(), env);
        }
        let Some(i) = self.first_pending_rd() else {
            return;
        };
        let mtu = u64::from(self.cfg.mtu);
        let e = &mut self.req.sq[i];
        if answered_by_empty {
            // ATOMIC WRITE and FLUSH are answered by one zero-length READ response.
            if pkt.pos != Pos::Only || !pkt.payload.is_empty() {
                self.fail(now, Some(pkt.psn), WcStatus::BadRespErr, env);
                return;
            }
            e.resp_pkts = 1;
            e.status = Some(WcStatus::Success);
            self.advance_una(now, pkt.psn.next());
            self.retire(now, env);
            return;
        }
        let offset = u64::from(e.resp_pkts) * mtu;
        let remaining = e.wqe.len.saturating_sub(offset);
        let last = e.resp_pkts + 1 == e.npkts;
        let want = if last { remaining } else { mtu };
        if pkt.pos.ends() != last || pkt.payload.len() as u64 != want {
            self.fail(now, Some(pkt.psn), WcStatus::BadRespErr, env);
            return;
        }
        if e.wqe.scatter(offset, pkt.payload).is_err() {
            self.fail(now, Some(pkt.psn), WcStatus::LocProtErr, env);
            return;
        }
        // Two responses of one READ in a row, nothing resent in between: the
        // responder's pace.
        if e.resp_pkts > 0
            && let Some(at) = self.req.last_answer
        {
            let gap = now.saturating_duration_since(at);
            self.req
                .pacing
                .on_answer_gap(now, gap, pkt.payload.len() as u32);
        }
        self.req.last_answer = Some(now);
        let e = &mut self.req.sq[i];
        e.resp_pkts += 1;
        if last {
            e.status = Some(WcStatus::Success);
        }
        self.advance_una(now, pkt.psn.next());
        if last {
            self.retire(now, env);
        }
    }

    pub(super) fn handle_nak(&mut self, now: Instant, psn: Psn, nak: Syndrome, env: &mut dyn Env) {
        // A NAK acknowledges everything before its PSN.
        let r = &self.req;
        if psn.is_before(r.una) || psn.diff(r.max_sent) >= 0 {
            return;
        }
        let progressed = psn.is_after(r.una);
        if progressed {
            self.ack_through(now, psn.prev(), env);
        }
        if self.req.una != psn {
            return; // the NAK names a PSN inside a READ still being answered; stale
        }
        match nak {
            Syndrome::NakPsnSeqErr => {
                env.count(Stat::RcvdSeqNak);
                // A responder NAKs a sequence gap once; the same NAK again without
                // progress in between is a copy (or arrived after the go-back-N it asked
                // for): going back again would only resend the same packets twice. The
                // timers cover a resend that is lost.
                if !progressed && self.req.last_seq_nak == Some(psn) {
                    return;
                }
                self.req.last_seq_nak = Some(psn);
                // Everything before `psn` is acknowledged: resend from it, paced by the
                // (cut) congestion window. No retry is spent: `retry_cnt` counts the local
                // ACK timeouts without forward progress (`handle_timeout`), and a peer
                // that NAKs is alive.
                self.on_loss(now, psn, env);
                tracing::debug!(
                    psn = psn.value(),
                    "sequence NAK: retransmitting from its PSN"
                );
                self.req.probe = false;
                self.rewind_to(psn);
            }
            Syndrome::RnrNak { timer: code } => {
                env.count(Stat::RcvdRnrNak);
                if self.cfg.rnr_retry != RNR_RETRY_INFINITE {
                    if self.req.rnr_left == 0 {
                        env.count(Stat::RnrRetryExceeded);
                        self.fail(now, Some(psn), WcStatus::RnrRetryExcErr, env);
                        return;
                    }
                    self.req.rnr_left -= 1;
                }
                self.req.rnr_until =
                    Some(now + Duration::from_micros(u64::from(rnr_timer_us(code))));
                // Waiting for the peer's receive is no loss: no early retransmission
                // meanwhile (the timer starts again with the next packet).
                self.req.rto_at = None;
                self.req.probe = false;
                self.rewind_to(psn);
            }
            Syndrome::NakInvalidRequest => self.fail(now, Some(psn), WcStatus::RemInvReqErr, env),
            Syndrome::NakRemoteAccessError => {
                self.fail(now, Some(psn), WcStatus::RemAccessErr, env)
            }
            Syndrome::NakInvalidRdRequest => {
                self.fail(now, Some(psn), WcStatus::RemInvRdReqErr, env)
            }
            Syndrome::NakRemoteOperationalError | Syndrome::Reserved(_) => {
                self.fail(now, Some(psn), WcStatus::RemOpErr, env)
            }
            Syndrome::Ack { .. } => {}
        }
    }
}
