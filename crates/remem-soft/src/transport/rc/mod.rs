//! Requester, completer and responder of one RC queue pair.
//!
//! One [`RcTransport`] holds the three: the requester ([`requester`]: the send queue and
//! the packets of its work requests, timers), the completer ([`completer`]: what comes
//! back for them, completions, failures) and the responder ([`responder`]: the peer's
//! requests, executed and answered). This module holds their common boundary: the
//! configuration, the QP state, transmission and the dispatch of received packets.

mod completer;
mod pacing;
mod requester;
mod responder;
#[cfg(test)]
mod tests;

use super::glue::PayloadSink;
use super::{AccessError, Env, RxPacket, TxPacket};
use crate::transport::wqe::SendWqe;
use remem_verbs::qp::local_ack_timeout_ns;
use remem_verbs::{
    AccessFlags, MemError, QpState, RNR_RETRY_INFINITE, SendOp, WcOpcode, WcStatus, WorkCompletion,
};
use requester::Requester;
use responder::{InProgress, Out, Responder};
use std::time::{Duration, Instant};

pub(super) use super::{
    ACK_UNLIMITED, AtomicEth, Feth, Grant, Kind, Pos, Psn, RemoteKeyError, Reth, Stat, Syndrome,
};

/// The largest message: 2^31 bytes (IBTA).
pub const MAX_MSG: u64 = 1 << 31;

/// The attributes the transport runs with (from `ibv_qp_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConfig {
    /// This QP's number.
    pub qpn: u32,
    /// The peer QP.
    pub dest_qpn: u32,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// First PSN the requester sends.
    pub sq_psn: Psn,
    /// First PSN the responder expects.
    pub rq_psn: Psn,
    /// Local ACK timeout code (0 = no timeout).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs.
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code this responder sends.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this requester may have.
    pub max_rd_atomic: u8,
    /// READ/atomic responder resources.
    pub max_dest_rd_atomic: u8,
    /// Remote operations the responder accepts.
    pub access: AccessFlags,
    /// Most unacknowledged PSNs in flight.
    pub window: u32,
}

impl Default for RcConfig {
    fn default() -> Self {
        RcConfig {
            qpn: 0,
            dest_qpn: 0,
            mtu: 1024,
            sq_psn: Psn::new(0),
            rq_psn: Psn::new(0),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: RNR_RETRY_INFINITE,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: AccessFlags::empty(),
            window: 1024,
        }
    }
}

impl RcConfig {
    fn ack_timeout(&self) -> Option<Duration> {
        local_ack_timeout_ns(self.timeout).map(Duration::from_nanos)
    }

    /// Number of PSNs a work request consumes.
    fn npkts(&self, wqe: &SendWqe) -> u32 {
        match wqe.op {
            SendOp::AtomicCmpAndSwp { .. }
            | SendOp::AtomicFetchAndAdd { .. }
            | SendOp::AtomicWrite { .. }
            | SendOp::Flush { .. } => 1,
            _ => wqe.len.div_ceil(u64::from(self.mtu)).max(1) as u32,
        }
    }
}

/// FETH placement type bits (`IB_FLUSH_GLOBAL`, `IB_FLUSH_PERSISTENT`).
const PLACEMENT_GLOBAL: u8 = 1;
const PLACEMENT_PERSISTENT: u8 = 2;
/// FETH selectivity levels (`IB_FLUSH_RANGE`, `IB_FLUSH_MR`).
const SELECT_RANGE: u8 = 0;
const SELECT_REGION: u8 = 1;

/// The RC transport of one queue pair.
#[derive(Debug)]
pub struct RcTransport {
    cfg: RcConfig,
    state: QpState,
    req: Requester,
    resp: Responder,
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
        SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
        SendOp::Flush { .. } => WcOpcode::Flush,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

impl RcTransport {
    /// A transport in RESET.
    pub fn new(cfg: RcConfig) -> Self {
        RcTransport {
            cfg,
            state: QpState::Reset,
            req: Requester::new(),
            resp: Responder::new(),
        }
    }

    /// The QP state as the transport sees it (it moves to ERR by itself on errors).
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The configuration.
    #[cfg(any(test, feature = "internals"))]
    pub fn config(&self) -> &RcConfig {
        &self.cfg
    }

    /// Applies new attributes and moves to `state` (the QP object validated the
    /// transition). Entering RTR starts the responder at `rq_psn`, entering RTS from RTR
    /// the requester at `sq_psn`; RESET forgets everything; ERR flushes every work request.
    pub fn set_state(&mut self, cfg: RcConfig, state: QpState, env: &mut dyn Env) {
        let old = self.state;
        self.cfg = cfg;
        self.state = state;
        self.req.pacing.configure(cfg.window, cfg.ack_timeout());
        match state {
            QpState::Reset => {
                self.req = Requester::new();
                self.req.pacing.configure(cfg.window, cfg.ack_timeout());
                self.resp = Responder::new();
            }
            QpState::Rtr if old != QpState::Rtr => {
                self.resp = Responder::new();
                self.resp.epsn = cfg.rq_psn;
            }
            QpState::Rts if old == QpState::Rtr => {
                let r = &mut self.req;
                r.next_psn = cfg.sq_psn;
                r.max_sent = cfg.sq_psn;
                r.una = cfg.sq_psn;
                r.retry_left = cfg.retry_cnt;
                r.rnr_left = cfg.rnr_retry;
            }
            QpState::Err => self.flush(env),
            _ => {}
        }
    }

    /// The application destroyed the QP while the device still holds it to send what it
    /// owes: from now on it takes no packet (RESET), runs no timer and sends no request,
    /// and of its queued responses only the acknowledgements go out (ACKs, NAKs, atomic
    /// answers, the empty answers of ATOMIC WRITE and FLUSH) — not the rest of a READ
    /// response: a destroyed QP reaches no memory any more. No completions are reported
    /// (verbs reports none for a destroyed QP).
    pub fn release(&mut self) {
        self.state = QpState::Reset;
        self.req = Requester::new();
        self.resp.progress = InProgress::Idle;
        self.resp.resources.clear();
        self.resp.out.retain(|o| {
            !matches!(
                o,
                Out::Read {
                    region: Some(_),
                    ..
                }
            )
        });
    }

    /// Whether `poll_transmit` may have something to send now.
    pub fn wants_transmit(&self, now: Instant) -> bool {
        if !self.resp.out.is_empty() {
            return true;
        }
        matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.req.cur < self.req.sq.len()
            && self.req.rnr_until.is_none_or(|t| t <= now)
    }

    /// The earliest time `handle_timeout` must be called.
    pub fn next_timeout(&self) -> Option<Instant> {
        [self.req.timer, self.req.rto_at, self.req.rnr_until]
            .into_iter()
            .flatten()
            .min()
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

    /// Produces the next packet to send, if any: calls `emit` with its headers and a
    /// function that writes its payload into the slice it is given (exactly
    /// `payload_len` bytes). Responses go first, then new or retransmitted requests. A READ
    /// response whose memory region was deregistered meanwhile is not sent: a NAK takes
    /// its place and the QP goes to ERR (completions and the event through `env`).
    #[cfg(any(test, feature = "internals"))]
    pub fn poll_transmit<R>(
        &mut self,
        now: Instant,
        env: &mut dyn Env,
        emit: impl FnOnce(
            &TxPacket,
            &mut dyn FnMut(&mut dyn PayloadSink) -> Result<(), AccessError>,
        ) -> R,
    ) -> Option<R> {
        self.poll_transmit_ordered(now, env, false, emit)
    }

    /// [`RcTransport::poll_transmit`], with this side's own requests before what the
    /// responder owes when `requests_first` (a device that defers its responses,
    /// `SoftOptions::defer_responses`: the reply the application just posted and the ACK
    /// owed then share one GSO batch, the longer packet first, as GSO requires).
    pub fn poll_transmit_ordered<R>(
        &mut self,
        now: Instant,
        env: &mut dyn Env,
        requests_first: bool,
        emit: impl FnOnce(
            &TxPacket,
            &mut dyn FnMut(&mut dyn PayloadSink) -> Result<(), AccessError>,
        ) -> R,
    ) -> Option<R> {
        let sending = matches!(self.state, QpState::Rts | QpState::Sqd);
        // What the responder owes (ACKs, READ and atomic responses) goes before this side's
        // own requests, as a NIC that acknowledges in hardware sends it: a peer sees its
        // request acknowledged before this side's answer to it arrives (the driver sends
        // both in one call).
        let polled = if requests_first && sending {
            match self.poll_request(now, env) {
                Some(p) => Some(p),
                None => self.poll_response(env),
            }
        } else {
            match self.poll_response(env) {
                Some(p) => Some(p),
                None if sending => self.poll_request(now, env),
                None => None,
            }
        };
        let (pkt, src) = polled?;
        // A region of the work request was deregistered since it was posted: none of it is
        // sent, the work request completes with a local protection error (rxe's
        // `copy_data` finds the lkey gone) and the QP goes to ERR. (A deregistration after
        // this check makes the gather below fail: the packet is not built, and the
        // retransmission ends here.)
        if let PayloadSrc::Wqe { index, .. } = &src
            && self.req.sq.get(*index).is_some_and(|e| e.wqe.is_revoked())
        {
            self.fail(now, Some(pkt.psn), WcStatus::LocProtErr, env);
            return self.poll_transmit_ordered(now, env, requests_first, emit);
        }
        let sq = &self.req.sq;
        let copied = &self.resp.replay_copy;
        let mut fill = |dst: &mut dyn PayloadSink| match &src {
            PayloadSrc::None => Ok(()),
            PayloadSrc::Copied => dst.put_bytes(0, copied),
            PayloadSrc::Wqe { index, offset } => match sq.get(*index) {
                Some(e) => e.wqe.gather_into(*offset, dst),
                None => Err(AccessError::Mem(MemError::OutOfBounds {
                    offset: *offset,
                    len: dst.payload_len() as u64,
                    size: 0,
                })),
            },
            PayloadSrc::Region { held, offset } => {
                dst.put_held(0, held, *offset, dst.payload_len())
            }
        };
        Some(emit(&pkt, &mut fill))
    }

    /// Handles one received packet addressed to this QP: a response goes to the
    /// completer, a request to the responder.
    pub fn handle_packet(&mut self, now: Instant, pkt: &RxPacket<'_>, env: &mut dyn Env) {
        if !pkt.kind.is_request() {
            self.handle_response(now, pkt, env);
            return;
        }
        self.handle_request(pkt, env);
    }
}

/// Where a packet's payload comes from.
#[derive(Debug)]
enum PayloadSrc {
    None,
    /// The send queue entry at `index`, from message offset `offset`.
    Wqe {
        index: usize,
        offset: u64,
    },
    /// A responder memory region (READ responses), held against revocation until the
    /// packet is built.
    Region {
        held: crate::mem::grant::Held,
        offset: usize,
    },
    /// A replayed READ response's payload, already copied out of its region into the
    /// responder's `replay_copy` (exactly the packet's payload).
    Copied,
}
