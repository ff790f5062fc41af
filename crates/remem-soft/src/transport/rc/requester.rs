//! The requester of an RC queue pair: the send queue, the packets of its work requests
//! (new and retransmitted), the retransmit and RNR timers.
//!
//! Two timers watch what is unacknowledged. The QP's local ACK timeout (`timer`) is IBTA's:
//! when it passes without forward progress a retry is spent (and `RETRY_EXC_ERR` raised
//! when none is left), so a dead peer fails after `(retry_cnt + 1) × timeout` as before. The
//! adaptive retransmission timeout (`rto_at`, from the measured round trip, see
//! [`super::pacing`]) fires earlier: it resends from the first unacknowledged PSN, paced by
//! the congestion window, and spends no retry.
//!
//! Both restart with forward progress, every READ response that arrives in order included
//! (IBTA's requester restarts its transport timer on each valid response of the oldest
//! outstanding request), and while the oldest outstanding request is a READ the early one
//! allows for the pace its responses come at ([`super::pacing`]), so a READ whose responses
//! keep coming, however slowly, is not retransmitted. A response that answers nothing new
//! (the responder sending again what a retransmission asked for: kernel rxe restarts a
//! READ's responses from a re-requested PSN once it has finished the ones in progress, and
//! only then turns to later requests) shows the peer alive and working through what it was
//! asked: it restarts both timers too, as rxe's completer restarts its retransmit timer on
//! every response it processes — within a budget of the responses the retransmissions
//! asked for again, so a peer cannot hold the timers off with duplicates it makes up.

use super::Env;
use super::pacing::Pacing;
use super::{
    AtomicEth, Feth, Kind, PLACEMENT_GLOBAL, PLACEMENT_PERSISTENT, PayloadSrc, Pos, Psn,
    RcTransport, Reth, SELECT_RANGE, SELECT_REGION, Stat, TxPacket,
};
use crate::transport::wqe::SendWqe;
use remem_verbs::{FlushLevel, FlushType, QpState, SendOp, WcStatus};
use std::collections::VecDeque;
use std::time::Instant;

/// Ask for an ACK at least every this many packets of a long message (as rxe).
const ACKREQ_EVERY: u32 = 64;

/// A send work request on its way.
#[derive(Debug)]
pub(super) struct SqEntry {
    pub(super) wqe: SendWqe,
    /// Whether PSNs were assigned (transmission started).
    pub(super) started: bool,
    pub(super) first_psn: Psn,
    pub(super) npkts: u32,
    /// READ: response packets received.
    pub(super) resp_pkts: u32,
    /// READ: the expected response PSN a re-request was sent for (to avoid re-request
    /// storms on a burst of late responses).
    pub(super) rerequested: Option<Psn>,
    /// Set when the work request is finished.
    pub(super) status: Option<WcStatus>,
}

impl SqEntry {
    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
    pub(super) fn is_rd(&self) -> bool {
        self.wqe.op.uses_rd_atomic()
    }
    /// Whether `psn` is one of this entry's PSNs.
    pub(super) fn holds(&self, psn: Psn) -> bool {
        psn.within(self.first_psn, self.npkts)
    }
}

#[derive(Debug)]
pub(super) struct Requester {
    pub(super) sq: VecDeque<SqEntry>,
    /// Index in `sq` of the entry being transmitted.
    pub(super) cur: usize,
    /// Next packet of it.
    pub(super) cur_pkt: u32,
    pub(super) next_psn: Psn,
    /// One past the highest PSN ever sent.
    pub(super) max_sent: Psn,
    /// Oldest unacknowledged PSN.
    pub(super) una: Psn,
    pub(super) rd_outstanding: u32,
    pub(super) retry_left: u8,
    pub(super) rnr_left: u8,
    /// The QP's local ACK timeout: when it passes without forward progress, a retry is
    /// spent.
    pub(super) timer: Option<Instant>,
    pub(super) rnr_until: Option<Instant>,
    pub(super) since_ackreq: u32,
    /// Congestion window and adaptive retransmission timeout.
    pub(super) pacing: Pacing,
    /// When to retransmit early (the adaptive RTO), spending no retry.
    pub(super) rto_at: Option<Instant>,
    /// The PSN timed for an RTT sample and when it was sent (a packet sent once: Karn).
    pub(super) timed: Option<(Psn, Instant)>,
    /// Until then an out-of-order READ response is no new loss: responses the peer sent
    /// before it saw the last re-request may still be arriving.
    pub(super) hold_until: Option<Instant>,
    /// The PSN of the last sequence NAK acted on, until forward progress.
    pub(super) last_seq_nak: Option<Psn>,
    /// After an early retransmission, only the first unacknowledged packet goes again
    /// (asking for an ACK) until the next forward progress shows whether the rest is
    /// needed: an ACK beyond it means the first transmission arrived and the timeout was
    /// spurious (F-RTO's idea, RFC 5682).
    pub(super) probe: bool,
    /// Some READ's responses were kept ahead of an earlier one's (see `accept_ahead`):
    /// `settle_ahead` has work until the send queue drains.
    pub(super) ahead: bool,
    /// Responses that answer nothing new and may still restart the timers: the responses
    /// the retransmissions asked for again (one per packet resent, a READ's re-request
    /// counting each response PSN it asks for), less those that came.
    pub(super) stale_budget: u32,
    /// When the last READ response arrived in order, while no retransmission happened
    /// since: the next one of the same READ times the responder's pace.
    pub(super) last_answer: Option<Instant>,
}

impl Requester {
    pub(super) fn new() -> Self {
        Requester {
            sq: VecDeque::new(),
            cur: 0,
            cur_pkt: 0,
            next_psn: Psn::new(0),
            max_sent: Psn::new(0),
            una: Psn::new(0),
            rd_outstanding: 0,
            retry_left: 0,
            rnr_left: 0,
            timer: None,
            rnr_until: None,
            since_ackreq: 0,
            pacing: Pacing::new(u32::MAX, None),
            rto_at: None,
            timed: None,
            hold_until: None,
            last_seq_nak: None,
            probe: false,
            ahead: false,
            stale_budget: 0,
            last_answer: None,
        }
    }
}

impl RcTransport {
    /// Queues a validated send work request. In ERR it completes at once with
    /// `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wqe: SendWqe, env: &mut dyn Env) {
        if self.state == QpState::Err {
            env.send_completion(self.wc(&wqe, WcStatus::WrFlushErr));
            return;
        }
        self.req.sq.push_back(SqEntry {
            wqe,
            started: false,
            first_psn: Psn::new(0),
            npkts: 0,
            resp_pkts: 0,
            rerequested: None,
            status: None,
        });
    }

    /// Work requests posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.req.sq.len()
    }

    pub(super) fn poll_request(
        &mut self,
        now: Instant,
        env: &mut dyn Env,
    ) -> Option<(TxPacket, PayloadSrc)> {
        let cfg = self.cfg;
        let r = &mut self.req;
        if r.rnr_until.is_some_and(|t| t > now) {
            return None;
        }
        r.rnr_until = None;
        // A READ whose responses partly came ahead (while an earlier one waited for a lost
        // response) is asked again only from its first missing response; one that came
        // whole is not asked again.
        while let Some(e) = r.sq.get(r.cur)
            && e.started
            && matches!(e.wqe.op, SendOp::RdmaRead { .. })
            && e.resp_pkts > r.cur_pkt
        {
            if e.resp_pkts >= e.npkts {
                r.next_psn = e.first_psn.add(e.npkts);
                r.cur += 1;
                r.cur_pkt = 0;
            } else {
                r.cur_pkt = e.resp_pkts;
                r.next_psn = e.first_psn.add(e.resp_pkts);
            }
        }
        // Local operations (memory window bind, local invalidate) are executed when the
        // cursor reaches them, in order, and take no PSN: each is finished at once and
        // retires, in order, once everything before it has (its PSN range is empty,
        // ending just before the next packet's).
        let mut executed = false;
        while let Some(e) = r.sq.get_mut(r.cur)
            && e.wqe.op.is_local()
        {
            if !e.started {
                if self.state == QpState::Sqd || (e.wqe.fence && r.rd_outstanding > 0) {
                    break;
                }
                e.started = true;
                e.first_psn = r.next_psn.prev();
                e.npkts = 0;
                e.status = Some(match env.local_op(&e.wqe.op) {
                    Ok(()) => WcStatus::Success,
                    Err(status) => status,
                });
                executed = true;
            }
            if e.status != Some(WcStatus::Success) {
                // A refused one stops the send queue: the QP fails when it retires.
                break;
            }
            r.cur += 1;
            r.cur_pkt = 0;
        }
        if executed {
            self.retire(now, env);
        }
        let r = &mut self.req;
        let entry = r.sq.get_mut(r.cur)?;
        if entry.wqe.op.is_local() {
            return None;
        }
        // The window bounds the PSNs in flight packet by packet, inside a message too: a
        // peer that stops acknowledging gets at most a window per attempt, however long
        // the message (rxe bounds unacknowledged PSNs the same way). The congestion
        // window narrows it after losses.
        let limit = r.pacing.limit().min(cfg.window.max(1));
        if r.next_psn.diff(r.una) >= limit as i32 || (r.probe && r.next_psn != r.una) {
            return None;
        }
        if !entry.started {
            if self.state == QpState::Sqd {
                return None;
            }
            if entry.wqe.fence && r.rd_outstanding > 0 {
                return None;
            }
            if entry.is_rd() {
                if r.rd_outstanding >= u32::from(cfg.max_rd_atomic) {
                    return None;
                }
                r.rd_outstanding += 1;
            }
            entry.started = true;
            entry.first_psn = r.next_psn;
            entry.npkts = cfg.npkts(&entry.wqe);
        }
        let index = r.cur;
        let k = r.cur_pkt;
        let psn = entry.first_psn.add(k);
        let mtu = u64::from(cfg.mtu);
        let offset = u64::from(k) * mtu;
        let mut pkt = TxPacket::new(Kind::Send, Pos::Only, cfg.dest_qpn, psn);
        let mut consumed = 1; // PSNs this packet uses
        let mut payload_off = None;
        match entry.wqe.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                pkt.kind = Kind::ReadRequest;
                pkt.reth = Some(Reth {
                    va: remote_addr.wrapping_add(offset),
                    rkey,
                    dma_len: (entry.wqe.len - offset.min(entry.wqe.len)) as u32,
                });
                pkt.ack_req = true;
                consumed = entry.npkts - k;
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                pkt.kind = Kind::CompareSwap;
                pkt.atomic = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                pkt.ack_req = true;
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add: value,
            } => {
                pkt.kind = Kind::FetchAdd;
                pkt.atomic = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: value,
                    compare: 0,
                });
                pkt.ack_req = true;
            }
            SendOp::AtomicWrite { remote_addr, rkey } => {
                pkt.kind = Kind::AtomicWrite;
                pkt.reth = Some(Reth {
                    va: remote_addr,
                    rkey,
                    dma_len: 8,
                });
                pkt.payload_len = 8;
                pkt.ack_req = true;
                payload_off = Some(0);
            }
            SendOp::Flush {
                remote_addr,
                rkey,
                len,
                flush_type,
                level,
            } => {
                pkt.kind = Kind::Flush;
                pkt.feth = Some(Feth {
                    placement: match flush_type {
                        FlushType::Global => PLACEMENT_GLOBAL,
                        FlushType::Persistent => PLACEMENT_PERSISTENT,
                    },
                    selectivity: match level {
                        FlushLevel::Range => SELECT_RANGE,
                        FlushLevel::Region => SELECT_REGION,
                    },
                });
                pkt.reth = Some(Reth {
                    va: remote_addr,
                    rkey,
                    dma_len: len,
                });
                pkt.ack_req = true;
            }
            op => {
                let (kind, reth) = match op {
                    SendOp::Send => (Kind::Send, None),
                    SendOp::SendWithImm { imm } => {
                        pkt.imm = Some(imm);
                        (Kind::SendImm, None)
                    }
                    SendOp::SendWithInv { rkey } => {
                        pkt.ieth = Some(rkey);
                        (Kind::SendInv, None)
                    }
                    SendOp::RdmaWrite { remote_addr, rkey } => (
                        Kind::Write,
                        Some(Reth {
                            va: remote_addr,
                            rkey,
                            dma_len: entry.wqe.len as u32,
                        }),
                    ),
                    SendOp::RdmaWriteWithImm {
                        remote_addr,
                        rkey,
                        imm,
                    } => {
                        pkt.imm = Some(imm);
                        (
                            Kind::WriteImm,
                            Some(Reth {
                                va: remote_addr,
                                rkey,
                                dma_len: entry.wqe.len as u32,
                            }),
                        )
                    }
                    _ => (Kind::Send, None),
                };
                pkt.kind = kind;
                pkt.pos = Pos::of(k, entry.npkts);
                if pkt.pos.starts() {
                    pkt.reth = reth;
                }
                if !pkt.pos.ends() {
                    pkt.imm = None;
                    pkt.ieth = None;
                }
                pkt.payload_len = (entry.wqe.len - offset).min(mtu) as u32;
                pkt.solicited = entry.wqe.solicited && pkt.pos.ends();
                r.since_ackreq += 1;
                // An ACK is asked for at the end of a message, every ACKREQ_EVERY packets,
                // and on the packet that fills the window (else a window smaller than
                // ACKREQ_EVERY would wait for an ACK nobody asked for).
                let fills_window = psn.next().diff(r.una) >= limit as i32;
                pkt.ack_req = pkt.pos.ends() || r.since_ackreq >= ACKREQ_EVERY || fills_window;
                payload_off = Some(offset);
            }
        }
        if r.probe {
            pkt.ack_req = true;
        }
        if pkt.ack_req {
            r.since_ackreq = 0;
        }
        // Advance the cursor.
        r.cur_pkt += consumed;
        if r.cur_pkt >= entry.npkts {
            if entry.wqe.op.is_read_or_atomic() && entry.rerequested.is_none() && k > 0 {
                entry.rerequested = Some(psn);
            }
            r.cur += 1;
            r.cur_pkt = 0;
        }
        if psn.is_before(r.max_sent) {
            env.count(Stat::Retransmitted);
            r.stale_budget = r.stale_budget.saturating_add(consumed);
            r.last_answer = None;
        } else if r.timed.is_none() {
            r.timed = Some((psn, now));
        }
        r.pacing.on_sent(consumed);
        r.next_psn = psn.add(consumed);
        if r.next_psn.is_after(r.max_sent) {
            r.max_sent = r.next_psn;
        }
        if r.timer.is_none() {
            r.timer = cfg.ack_timeout().map(|t| now + t);
        }
        let src = match payload_off {
            Some(offset) => PayloadSrc::Wqe { index, offset },
            None => PayloadSrc::None,
        };
        if self.req.rto_at.is_none() {
            let rto = self.early_rto();
            self.req.rto_at = Some(now + rto);
        }
        Some((pkt, src))
    }

    /// Moves the transmit cursor back to `psn` (go-back-N).
    pub(super) fn rewind_to(&mut self, psn: Psn) {
        let r = &mut self.req;
        // A timed packet that will be sent again gives no RTT sample (Karn).
        if r.timed.is_some_and(|(t, _)| t.diff(psn) >= 0) {
            r.timed = None;
        }
        for (i, e) in r.sq.iter().enumerate() {
            if !e.started {
                break;
            }
            if e.holds(psn) {
                r.cur = i;
                r.cur_pkt = psn.diff(e.first_psn) as u32;
                r.next_psn = psn;
                return;
            }
        }
        // Nothing holds it (all acknowledged): continue with the first unstarted entry.
        r.cur = r.sq.iter().position(|e| !e.started).unwrap_or(r.sq.len());
        r.cur_pkt = 0;
        r.next_psn = r.max_sent;
    }

    /// A response of the READ (or atomic) expecting `expected` was lost: re-requests it
    /// from there (go-back-N, paced), and cuts the congestion window. For about a round
    /// trip afterwards, more signs of the same loss (the responses the peer sent before the
    /// re-request reached it) are ignored.
    pub(super) fn rerequest_lost(&mut self, now: Instant, expected: Psn, env: &mut dyn Env) {
        if self.req.hold_until.is_some_and(|t| t > now) {
            return;
        }
        if self.rerequest(expected) {
            self.on_loss(now, expected, env);
            let hold = self.req.pacing.srtt().unwrap_or(super::pacing::MIN_RTO);
            self.req.hold_until = Some(now + hold);
        }
    }

    /// Re-requests a READ (or resends an atomic) from its expected response PSN, once per
    /// expected PSN. Returns whether the cursor went back.
    pub(super) fn rerequest(&mut self, expected: Psn) -> bool {
        let Some(e) = self
            .req
            .sq
            .iter_mut()
            .find(|e| e.started && e.holds(expected))
        else {
            return false;
        };
        if e.rerequested == Some(expected) {
            return false;
        }
        e.rerequested = Some(expected);
        // Only go back if the cursor is past it.
        let cursor_past = self.req.next_psn.is_after(expected);
        if cursor_past {
            self.rewind_to(expected);
        }
        cursor_past
    }

    /// The first unacknowledged PSN moved forward by `n` PSNs: the retry budgets are
    /// restored, the congestion window grows, an RTT sample may be taken, and both
    /// retransmission timers start again (or stop, with nothing left unacknowledged).
    pub(super) fn on_progress(&mut self, now: Instant, n: u32) {
        let cfg = self.cfg;
        let r = &mut self.req;
        r.retry_left = cfg.retry_cnt;
        r.rnr_left = cfg.rnr_retry;
        r.last_seq_nak = None;
        r.probe = false;
        // An early retransmission is judged by the first progress after it: an ACK of
        // PSNs the go-back-N has not sent again yet acknowledges the first transmission.
        if r.pacing.undo_pending() {
            let spurious = r.una.is_after(r.next_psn);
            if spurious {
                tracing::trace!(psn = r.una.value(), "the early retransmission was spurious");
            }
            r.pacing.judge_rto(spurious);
        }
        r.pacing.on_ack(n, now);
        if let Some((psn, at)) = r.timed
            && r.una.is_after(psn)
        {
            r.pacing.on_rtt(now.saturating_duration_since(at));
            r.timed = None;
        }
        if r.una == r.max_sent {
            r.timer = None;
            r.rto_at = None;
            r.last_answer = None;
        } else {
            r.timer = cfg.ack_timeout().map(|t| now + t);
            let rto = self.early_rto();
            self.req.rto_at = Some(now + rto);
        }
    }

    /// The adaptive retransmission timeout for what is unacknowledged now: the RTO, or,
    /// while the oldest outstanding request is a READ, the RTO with the time its next
    /// response takes at the responder's pace ([`Pacing::answer_rto`]).
    pub(super) fn early_rto(&self) -> std::time::Duration {
        let r = &self.req;
        let head = r.sq.iter().find(|e| e.started && e.status.is_none());
        match head {
            Some(e) if matches!(e.wqe.op, SendOp::RdmaRead { .. }) => {
                let offset = u64::from(e.resp_pkts) * u64::from(self.cfg.mtu);
                let bytes = e
                    .wqe
                    .len
                    .saturating_sub(offset)
                    .min(u64::from(self.cfg.mtu));
                r.pacing.answer_rto(bytes as u32)
            }
            _ => r.pacing.rto(),
        }
    }

    /// A response that answers nothing new arrived at `now` (a duplicate of one already
    /// taken, or the responder sending again what a retransmission asked for): while the
    /// budget of such responses lasts, the peer is alive and working through what it was
    /// asked, and both timers start again (no retry is restored: only progress does that).
    pub(super) fn on_stale_response(&mut self, now: Instant) {
        let r = &mut self.req;
        if r.una == r.max_sent || r.stale_budget == 0 {
            return;
        }
        r.stale_budget -= 1;
        if r.timer.is_some() {
            r.timer = self.cfg.ack_timeout().map(|t| now + t);
        }
        if self.req.rto_at.is_some() {
            self.req.rto_at = Some(now + self.early_rto());
        }
    }

    /// Moves the first unacknowledged PSN to `una` (forward progress, see
    /// [`Self::on_progress`]); nothing if it is not ahead.
    pub(super) fn advance_una(&mut self, now: Instant, una: Psn) {
        let n = una.diff(self.req.una);
        if n > 0 {
            self.req.una = una;
            self.on_progress(now, n as u32);
        }
    }

    /// A loss was detected at `psn` (a sequence NAK, a missing READ response, an early
    /// retransmission): the congestion window is cut, once per loss event.
    pub(super) fn on_loss(&mut self, now: Instant, psn: Psn, env: &mut dyn Env) {
        if self.req.pacing.on_loss(now) {
            env.count(Stat::CwndReduced);
            tracing::trace!(
                psn = psn.value(),
                cwnd = self.req.pacing.cwnd(),
                "loss: congestion window cut"
            );
        }
    }

    /// Handles the retransmit and RNR timers.
    pub fn handle_timeout(&mut self, now: Instant, env: &mut dyn Env) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        let stalled = self.req.timer.is_some_and(|t| t <= now);
        let early = self.req.rto_at.is_some_and(|t| t <= now);
        if !stalled && !early {
            return;
        }
        self.req.rto_at = None;
        if stalled {
            self.req.timer = None;
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.una == self.req.max_sent {
            return;
        }
        let una = self.req.una;
        if stalled {
            // IBTA's local ACK timeout: no forward progress for the QP's `timeout`.
            if self.req.retry_left == 0 {
                env.count(Stat::RetryExceeded);
                tracing::warn!(
                    psn = una.value(),
                    "no ACK after every retry: RETRY_EXC_ERR, QP to ERR"
                );
                self.fail(now, Some(una), WcStatus::RetryExcErr, env);
                return;
            }
            self.req.retry_left -= 1;
            env.count(Stat::CompleterRetry);
            self.req.pacing.on_stall(now);
            env.count(Stat::CwndReduced);
            tracing::debug!(
                psn = una.value(),
                retries_left = self.req.retry_left,
                "ACK timeout: retransmitting from the first unacknowledged PSN"
            );
        } else {
            // The adaptive RTO: resend from the first unacknowledged PSN, paced by the
            // (cut) congestion window; no retry spent.
            env.count(Stat::EarlyRetransmit);
            if self.req.pacing.on_rto(now) {
                env.count(Stat::CwndReduced);
            }
            tracing::trace!(
                psn = una.value(),
                "retransmission timeout: resending from the first unacknowledged PSN"
            );
        }
        for e in self.req.sq.iter_mut() {
            e.rerequested = None;
        }
        self.req.hold_until = None;
        self.req.probe = !stalled;
        self.rewind_to(una);
    }
}
