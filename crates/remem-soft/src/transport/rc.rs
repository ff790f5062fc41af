//! Requester, completer and responder of one RC queue pair.

use super::psn::{add, diff};
use super::{
    ACK_UNLIMITED, AccessError, AtomicEth, Env, Feth, Grant, Kind, Pos, RemoteKeyError, Reth,
    RxPacket, Stat, Syndrome, TxPacket,
};
use crate::wqe::{RecvWqe, SendWqe, scatter_into};
use remem_verbs::qp::{local_ack_timeout_ns, rnr_timer_us};
use remem_verbs::{
    AccessFlags, AsyncEvent, AsyncEventElement, AsyncEventType, FlushLevel, FlushType, MemError,
    QpState, RNR_RETRY_INFINITE, SendOp, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The largest message: 2^31 bytes (IBTA).
pub const MAX_MSG: u64 = 1 << 31;

/// Ask for an ACK at least every this many packets of a long message (as rxe).
const ACKREQ_EVERY: u32 = 64;

/// Responses a responder queues beyond two per responder resource (an answer and an ACK
/// before it): room for the ACKs and NAKs of one receive batch. A requester within its
/// `max_rd_atomic` never needs more; what a peer sends beyond it is dropped unexecuted.
const RESPONSE_SLACK: usize = 16;

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
    pub sq_psn: u32,
    /// First PSN the responder expects.
    pub rq_psn: u32,
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
            sq_psn: 0,
            rq_psn: 0,
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

/// A send work request on its way.
#[derive(Debug)]
struct SqEntry {
    wqe: SendWqe,
    /// Whether PSNs were assigned (transmission started).
    started: bool,
    first_psn: u32,
    npkts: u32,
    /// READ: response packets received.
    resp_pkts: u32,
    /// READ: the expected response PSN a re-request was sent for (to avoid re-request
    /// storms on a burst of late responses).
    rerequested: Option<u32>,
    /// Set when the work request is finished.
    status: Option<WcStatus>,
}

impl SqEntry {
    fn last_psn(&self) -> u32 {
        add(self.first_psn, self.npkts.saturating_sub(1))
    }
    fn is_rd(&self) -> bool {
        self.wqe.op.uses_rd_atomic()
    }
    /// Whether `psn` is one of this entry's PSNs.
    fn holds(&self, psn: u32) -> bool {
        let d = diff(psn, self.first_psn);
        d >= 0 && (d as u32) < self.npkts
    }
}

#[derive(Debug)]
struct Requester {
    sq: VecDeque<SqEntry>,
    /// Index in `sq` of the entry being transmitted.
    cur: usize,
    /// Next packet of it.
    cur_pkt: u32,
    next_psn: u32,
    /// One past the highest PSN ever sent.
    max_sent: u32,
    /// Oldest unacknowledged PSN.
    una: u32,
    rd_outstanding: u32,
    retry_left: u8,
    rnr_left: u8,
    timer: Option<Instant>,
    rnr_until: Option<Instant>,
    since_ackreq: u32,
}

impl Requester {
    fn new() -> Self {
        Requester {
            sq: VecDeque::new(),
            cur: 0,
            cur_pkt: 0,
            next_psn: 0,
            max_sent: 0,
            una: 0,
            rd_outstanding: 0,
            retry_left: 0,
            rnr_left: 0,
            timer: None,
            rnr_until: None,
            since_ackreq: 0,
        }
    }
}

/// What the responder is in the middle of.
#[derive(Debug)]
enum InProgress {
    Idle,
    Send {
        wqe: RecvWqe,
        kind: Kind,
        offset: u64,
    },
    Write {
        /// The grant resolved at FIRST (none for a zero-length WRITE); every later packet
        /// goes through it, so a deregistration in between refuses them.
        region: Option<Grant>,
        kind: Kind,
        offset: u64,
        len: u64,
    },
}

#[derive(Debug)]
enum Resource {
    Read {
        psn: u32,
        npkts: u32,
        region: Option<Grant>,
        len: u64,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
    /// An ATOMIC WRITE or FLUSH, executed once and answered by a zero-length READ
    /// response (a duplicate is answered again, not executed again).
    Done {
        psn: u32,
    },
}

/// FETH placement type bits (`IB_FLUSH_GLOBAL`, `IB_FLUSH_PERSISTENT`).
const PLACEMENT_GLOBAL: u8 = 1;
const PLACEMENT_PERSISTENT: u8 = 2;
/// FETH selectivity levels (`IB_FLUSH_RANGE`, `IB_FLUSH_MR`).
const SELECT_RANGE: u8 = 0;
const SELECT_REGION: u8 = 1;

impl Out {
    /// The answer to an ATOMIC WRITE or FLUSH: an RDMA READ response (only) without data.
    fn empty_read_response(psn: u32) -> Out {
        Out::Read {
            region: None,
            base_psn: psn,
            len: 0,
            start: 0,
            next: 0,
            npkts: 1,
            replay: false,
        }
    }
}

/// A response waiting to be sent, in PSN order.
#[derive(Debug)]
enum Out {
    Ack {
        psn: u32,
        syndrome: Syndrome,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
    },
    Read {
        /// Checked before each packet's payload is gathered (a revoked key ends the
        /// response with a NAK).
        region: Option<Grant>,
        /// PSN of packet index 0 of the READ.
        base_psn: u32,
        /// Length of the whole READ.
        len: u64,
        /// Index of the first packet of this (re)transmission.
        start: u32,
        /// Next packet index to send.
        next: u32,
        /// Packets in the whole READ.
        npkts: u32,
        /// A replay for a duplicate request (the READ itself was answered before).
        replay: bool,
    },
}

#[derive(Debug)]
struct Responder {
    epsn: u32,
    msn: u32,
    nak_sent: bool,
    progress: InProgress,
    resources: VecDeque<Resource>,
    out: VecDeque<Out>,
}

impl Responder {
    fn new() -> Self {
        Responder {
            epsn: 0,
            msn: 0,
            nak_sent: false,
            progress: InProgress::Idle,
            resources: VecDeque::new(),
            out: VecDeque::new(),
        }
    }

    /// Queues an ACK for `psn`, merging with an unsent ACK at the back of the queue.
    fn push_ack(&mut self, psn: u32) {
        if let Some(Out::Ack { psn: p, syndrome }) = self.out.back_mut()
            && *syndrome == ACK_UNLIMITED
        {
            *p = psn;
            return;
        }
        self.out.push_back(Out::Ack {
            psn,
            syndrome: ACK_UNLIMITED,
        });
    }

    /// Queues a NAK, unless the same NAK is already the last response queued (a flood of
    /// SENDs without a receive gets one RNR NAK per burst, not one each).
    fn push_nak(&mut self, psn: u32, syndrome: Syndrome) {
        if let Some(Out::Ack {
            psn: p,
            syndrome: s,
        }) = self.out.back()
            && (*p, *s) == (psn, syndrome)
        {
            return;
        }
        self.out.push_back(Out::Ack { psn, syndrome });
    }
}

/// Why the responder refuses a request: the NAK it sends and the affiliated asynchronous
/// event it raises (IBTA C9-222.1.1: the error goes to the responder's client as an
/// affiliated asynchronous error unless a receive work request's completion reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refuse {
    /// Invalid request NAK; `IBV_EVENT_QP_REQ_ERR` (Invalid Request Local WQ Error).
    Invalid,
    /// Remote access error NAK; `IBV_EVENT_QP_ACCESS_ERR` (Local Access Violation WQ Error).
    Access(RemoteKeyError),
    /// Remote operational error NAK; `IBV_EVENT_QP_FATAL` (Local WQ Catastrophic Error).
    Operational,
    /// A NAK with this syndrome, the error already reported by an error completion of the
    /// receive the request consumed: no event.
    Reported(Syndrome),
}

impl Refuse {
    /// The refusal of an access through a grant: a revoked key is an access error, a
    /// failure of the memory itself an operational error.
    fn of_access(e: AccessError) -> Refuse {
        match e {
            AccessError::Revoked => Refuse::Access(RemoteKeyError::Revoked),
            AccessError::Mem(_) => Refuse::Operational,
        }
    }
}

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
        match state {
            QpState::Reset => {
                self.req = Requester::new();
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
            first_psn: 0,
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
        match (self.req.timer, self.req.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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

    // ------------------------------------------------------------------ requester

    /// Produces the next packet to send, if any: calls `emit` with its headers and a
    /// function that writes its payload into the slice it is given (exactly
    /// `payload_len` bytes). Responses go first, then new or retransmitted requests. A READ
    /// response whose memory region was deregistered meanwhile is not sent: a NAK takes
    /// its place and the QP goes to ERR (completions and the event through `env`).
    pub fn poll_transmit<R>(
        &mut self,
        now: Instant,
        env: &mut dyn Env,
        emit: impl FnOnce(&TxPacket, &mut dyn FnMut(&mut [u8]) -> Result<(), AccessError>) -> R,
    ) -> Option<R> {
        let sending = matches!(self.state, QpState::Rts | QpState::Sqd);
        // What the responder owes (ACKs, READ and atomic responses) goes before this side's
        // own requests, as a NIC that acknowledges in hardware sends it: a peer sees its
        // request acknowledged before this side's answer to it arrives. (Both still leave
        // in one GSO batch when the driver sends them together.)
        let (pkt, src) = match self.poll_response(env) {
            Some(p) => p,
            None if sending => self.poll_request(now)?,
            None => return None,
        };
        // A region of the work request was deregistered since it was posted: none of it is
        // sent, the work request completes with a local protection error (rxe's
        // `copy_data` finds the lkey gone) and the QP goes to ERR. (A deregistration after
        // this check makes the gather below fail: the packet is not built, and the
        // retransmission ends here.)
        if let PayloadSrc::Wqe { index, .. } = &src
            && self.req.sq.get(*index).is_some_and(|e| e.wqe.is_revoked())
        {
            self.fail(now, Some(pkt.psn), WcStatus::LocProtErr, env);
            return self.poll_transmit(now, env, emit);
        }
        let sq = &self.req.sq;
        let mut fill = |dst: &mut [u8]| match &src {
            PayloadSrc::None => Ok(()),
            PayloadSrc::Wqe { index, offset } => match sq.get(*index) {
                Some(e) => e.wqe.gather(*offset, dst),
                None => Err(AccessError::Mem(MemError::OutOfBounds {
                    offset: *offset,
                    len: dst.len() as u64,
                    size: 0,
                })),
            },
            PayloadSrc::Region { held, offset } => {
                held.read(*offset, dst).map_err(AccessError::Mem)
            }
        };
        Some(emit(&pkt, &mut fill))
    }

    fn poll_request(&mut self, now: Instant) -> Option<(TxPacket, PayloadSrc)> {
        let cfg = self.cfg;
        let r = &mut self.req;
        if r.rnr_until.is_some_and(|t| t > now) {
            return None;
        }
        r.rnr_until = None;
        let entry = r.sq.get_mut(r.cur)?;
        // The window bounds the PSNs in flight packet by packet, inside a message too: a
        // peer that stops acknowledging gets at most a window per attempt, however long
        // the message (rxe bounds unacknowledged PSNs the same way).
        if diff(r.next_psn, r.una) >= cfg.window as i32 {
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
        let psn = add(entry.first_psn, k);
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
                let fills_window = diff(add(psn, 1), r.una) >= cfg.window as i32;
                pkt.ack_req = pkt.pos.ends() || r.since_ackreq >= ACKREQ_EVERY || fills_window;
                payload_off = Some(offset);
            }
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
        r.next_psn = add(psn, consumed);
        if diff(r.next_psn, r.max_sent) > 0 {
            r.max_sent = r.next_psn;
        }
        if r.timer.is_none() {
            r.timer = cfg.ack_timeout().map(|t| now + t);
        }
        let src = match payload_off {
            Some(offset) => PayloadSrc::Wqe { index, offset },
            None => PayloadSrc::None,
        };
        Some((pkt, src))
    }

    /// The next queued response (ACK/NAK, atomic ACK, READ response packet).
    fn poll_response(&mut self, env: &mut dyn Env) -> Option<(TxPacket, PayloadSrc)> {
        let mtu = self.cfg.mtu;
        let dest = self.cfg.dest_qpn;
        let msn = self.resp.msn;
        let out = self.resp.out.front_mut()?;
        let result = match out {
            Out::Ack { psn, syndrome } => {
                let mut p = TxPacket::new(Kind::Ack, Pos::Only, dest, *psn);
                p.aeth = Some((*syndrome, msn));
                (p, PayloadSrc::None, true)
            }
            Out::AtomicAck { psn, orig } => {
                let mut p = TxPacket::new(Kind::AtomicAck, Pos::Only, dest, *psn);
                p.aeth = Some((ACK_UNLIMITED, msn));
                p.atomic_ack = Some(*orig);
                (p, PayloadSrc::None, true)
            }
            Out::Read {
                region,
                base_psn,
                len,
                start,
                next,
                npkts,
                replay,
            } => {
                let idx = *next;
                let psn = add(*base_psn, idx);
                let offset = u64::from(idx) * u64::from(mtu);
                let payload_len = len.saturating_sub(offset).min(u64::from(mtu)) as u32;
                // A READ response goes on only while its key stands (rxe re-checks the key
                // before each response packet: `rxe_recheck_mr`). The packet holds the
                // grant until its payload is gathered, so a deregistration either comes
                // first — the packet is replaced by a remote access error NAK with its
                // PSN, and the QP goes to ERR — or waits for the copy.
                let src = match region {
                    Some(r) if payload_len > 0 => match r.clone().hold() {
                        Some(held) => PayloadSrc::Region {
                            held,
                            offset: offset as usize,
                        },
                        None => {
                            let replay = *replay;
                            self.resp.out.pop_front();
                            if replay {
                                self.refuse_replay(psn, env);
                            } else {
                                self.refuse(psn, Refuse::Access(RemoteKeyError::Revoked), env);
                            }
                            return self.poll_response(env);
                        }
                    },
                    _ => PayloadSrc::None,
                };
                let pos = Pos::of(idx - *start, *npkts - *start);
                let mut p = TxPacket::new(Kind::ReadResponse, pos, dest, psn);
                p.payload_len = payload_len;
                if pos != Pos::Middle {
                    p.aeth = Some((ACK_UNLIMITED, msn));
                }
                *next += 1;
                (p, src, *next >= *npkts)
            }
        };
        let (pkt, src, done) = result;
        if done {
            self.resp.out.pop_front();
        }
        Some((pkt, src))
    }

    /// Moves the transmit cursor back to `psn` (go-back-N).
    fn rewind_to(&mut self, psn: u32) {
        let r = &mut self.req;
        for (i, e) in r.sq.iter().enumerate() {
            if !e.started {
                break;
            }
            if e.holds(psn) {
                r.cur = i;
                r.cur_pkt = diff(psn, e.first_psn) as u32;
                r.next_psn = psn;
                return;
            }
        }
        // Nothing holds it (all acknowledged): continue with the first unstarted entry.
        r.cur = r.sq.iter().position(|e| !e.started).unwrap_or(r.sq.len());
        r.cur_pkt = 0;
        r.next_psn = r.max_sent;
    }

    /// Acknowledges every PSN up to and including `psn`. Returns whether it made progress.
    fn ack_through(&mut self, now: Instant, psn: u32, env: &mut dyn Env) -> bool {
        let r = &mut self.req;
        if diff(psn, r.una) < 0 || diff(psn, r.max_sent) >= 0 {
            return false; // stale or acknowledging what was never sent
        }
        let mut new_una = add(psn, 1);
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
                let expected = add(e.first_psn, e.resp_pkts);
                if diff(psn, expected) >= 0 {
                    new_una = expected;
                    lost_read = Some(expected);
                }
                break;
            }
            if diff(psn, e.last_psn()) >= 0 {
                e.status = Some(WcStatus::Success);
            } else {
                break;
            }
        }
        let progressed = diff(new_una, r.una) > 0;
        if progressed {
            r.una = new_una;
            r.retry_left = self.cfg.retry_cnt;
            r.rnr_left = self.cfg.rnr_retry;
        }
        if let Some(p) = lost_read {
            self.rerequest(p);
        }
        self.retire(now, env);
        progressed
    }

    /// Re-requests a READ (or resends an atomic) from its expected response PSN, once per
    /// expected PSN.
    fn rerequest(&mut self, expected: u32) {
        let Some(e) = self
            .req
            .sq
            .iter_mut()
            .find(|e| e.started && e.holds(expected))
        else {
            return;
        };
        if e.rerequested == Some(expected) {
            return;
        }
        e.rerequested = Some(expected);
        // Only go back if the cursor is past it.
        let cursor_past = diff(self.req.next_psn, expected) > 0;
        if cursor_past {
            self.rewind_to(expected);
        }
    }

    /// Reports finished work requests from the head of the send queue, in order.
    fn retire(&mut self, now: Instant, env: &mut dyn Env) {
        while let Some(e) = self.req.sq.front() {
            let Some(status) = e.status else { break };
            let e = self.req.sq.pop_front().expect("front exists");
            if e.is_rd() && e.started && status == WcStatus::Success {
                self.req.rd_outstanding = self.req.rd_outstanding.saturating_sub(1);
            }
            if e.wqe.signaled || status != WcStatus::Success {
                env.send_completion(self.wc(&e.wqe, status));
            }
            if self.req.cur > 0 {
                self.req.cur -= 1;
            } else {
                self.req.cur_pkt = 0;
            }
        }
        let r = &mut self.req;
        if diff(r.next_psn, r.una) < 0 {
            let una = r.una;
            self.rewind_to(una);
        }
        let r = &mut self.req;
        r.timer = if r.una == r.max_sent {
            None
        } else {
            self.cfg.ack_timeout().map(|t| now + t)
        };
    }

    /// Fails the entry holding `psn` (or the head) with `status`: the QP goes to ERR.
    fn fail(&mut self, now: Instant, psn: Option<u32>, status: WcStatus, env: &mut dyn Env) {
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
    fn flush(&mut self, env: &mut dyn Env) {
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

    /// Handles the retransmit and RNR timers.
    pub fn handle_timeout(&mut self, now: Instant, env: &mut dyn Env) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        let Some(t) = self.req.timer else { return };
        if t > now {
            return;
        }
        self.req.timer = None;
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.una == self.req.max_sent {
            return;
        }
        if self.req.retry_left == 0 {
            env.count(Stat::RetryExceeded);
            let una = self.req.una;
            tracing::warn!(
                psn = una,
                "no ACK after every retry: RETRY_EXC_ERR, QP to ERR"
            );
            self.fail(now, Some(una), WcStatus::RetryExcErr, env);
            return;
        }
        self.req.retry_left -= 1;
        env.count(Stat::CompleterRetry);
        let una = self.req.una;
        tracing::debug!(
            psn = una,
            retries_left = self.req.retry_left,
            "ACK timeout: retransmitting from the first unacknowledged PSN"
        );
        for e in self.req.sq.iter_mut() {
            e.rerequested = None;
        }
        self.rewind_to(una);
    }

    /// Handles a response packet (ACK, NAK, READ response, atomic ACK).
    fn handle_response(&mut self, now: Instant, pkt: &RxPacket<'_>, env: &mut dyn Env) {
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
                        self.ack_through(now, pkt.psn, env);
                    }
                    nak => self.handle_nak(now, pkt.psn, nak, env),
                }
            }
            Kind::AtomicAck => {
                let Some(orig) = pkt.atomic_ack else { return };
                let Some(i) = self.first_pending_rd() else {
                    return;
                };
                let e = &self.req.sq[i];
                let is_atomic = matches!(
                    e.wqe.op,
                    SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
                );
                if e.first_psn != pkt.psn || !is_atomic {
                    return; // duplicate or unexpected
                }
                self.ack_through(now, add(pkt.psn, super::psn::PSN_MASK), env);
                let Some(i) = self.first_pending_rd() else {
                    return;
                };
                let e = &mut self.req.sq[i];
                let status = match e.wqe.scatter(0, &orig.to_ne_bytes()) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocProtErr,
                };
                e.status = Some(status);
                self.req.una = add(pkt.psn, 1);
                self.req.retry_left = self.cfg.retry_cnt;
                if status == WcStatus::Success {
                    self.retire(now, env);
                } else {
                    self.fail(now, Some(pkt.psn), status, env);
                }
            }
            Kind::ReadResponse => self.handle_read_response(now, pkt, env),
            _ => {}
        }
    }

    /// Index of the first READ/atomic entry awaiting its response.
    fn first_pending_rd(&self) -> Option<usize> {
        self.req
            .sq
            .iter()
            .position(|e| e.started && e.status.is_none() && e.is_rd())
    }

    fn handle_read_response(&mut self, now: Instant, pkt: &RxPacket<'_>, env: &mut dyn Env) {
        let Some(i) = self.first_pending_rd() else {
            return;
        };
        let e = &self.req.sq[i];
        let answered_by_empty =
            matches!(e.wqe.op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. });
        if !matches!(e.wqe.op, SendOp::RdmaRead { .. }) && !answered_by_empty {
            return;
        }
        let expected = add(e.first_psn, e.resp_pkts);
        let d = diff(pkt.psn, expected);
        if d < 0 {
            return; // duplicate
        }
        if d > 0 {
            // Earlier responses were lost: ask again from the first missing one.
            self.rerequest(expected);
            return;
        }
        // Responses acknowledge every earlier request.
        if diff(expected, self.req.una) > 0 {
            self.ack_through(now, add(expected, super::psn::PSN_MASK), env);
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
            self.req.una = add(pkt.psn, 1);
            self.req.retry_left = self.cfg.retry_cnt;
            self.req.rnr_left = self.cfg.rnr_retry;
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
        e.resp_pkts += 1;
        self.req.una = add(pkt.psn, 1);
        self.req.retry_left = self.cfg.retry_cnt;
        self.req.rnr_left = self.cfg.rnr_retry;
        if last {
            e.status = Some(WcStatus::Success);
            self.retire(now, env);
        } else {
            self.req.timer = self.cfg.ack_timeout().map(|t| now + t);
        }
    }

    fn handle_nak(&mut self, now: Instant, psn: u32, nak: Syndrome, env: &mut dyn Env) {
        // A NAK acknowledges everything before its PSN.
        let r = &self.req;
        if diff(psn, r.una) < 0 || diff(psn, r.max_sent) >= 0 {
            return;
        }
        if diff(psn, r.una) > 0 {
            self.ack_through(now, add(psn, super::psn::PSN_MASK), env);
        }
        if self.req.una != psn {
            return; // the NAK names a PSN inside a READ still being answered; stale
        }
        match nak {
            Syndrome::NakPsnSeqErr => {
                env.count(Stat::RcvdSeqNak);
                if self.req.retry_left == 0 {
                    env.count(Stat::RetryExceeded);
                    tracing::warn!(psn, "sequence NAK after every retry: RETRY_EXC_ERR");
                    self.fail(now, Some(psn), WcStatus::RetryExcErr, env);
                    return;
                }
                self.req.retry_left -= 1;
                env.count(Stat::CompleterRetry);
                tracing::debug!(psn, "sequence NAK: retransmitting from its PSN");
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

    // ------------------------------------------------------------------ responder

    /// Handles one received packet addressed to this QP.
    pub fn handle_packet(&mut self, now: Instant, pkt: &RxPacket<'_>, env: &mut dyn Env) {
        if !pkt.kind.is_request() {
            self.handle_response(now, pkt, env);
            return;
        }
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return;
        }
        // What a peer can make the responder queue is bounded: with the queue of responses
        // full, a request is dropped unexecuted, as if lost (the requester retries it).
        let full = self.resp.out.len() >= self.response_cap();
        let d = diff(pkt.psn, self.resp.epsn);
        if d > 0 {
            env.count(Stat::OutOfSeqRequest);
            if !self.resp.nak_sent && !full {
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.resp.push_nak(e, Syndrome::NakPsnSeqErr);
            }
            return;
        }
        if d < 0 {
            env.count(Stat::DuplicateRequest);
            if full {
                env.count(Stat::ResponseQueueFull);
                return;
            }
            self.duplicate(pkt, env);
            return;
        }
        if full {
            env.count(Stat::ResponseQueueFull);
            return;
        }
        self.resp.nak_sent = false;
        if let Err(refuse) = self.execute(pkt, env) {
            self.refuse(pkt.psn, refuse, env);
        }
    }

    /// Refuses the request at `psn`: queues its NAK, moves the QP to ERR (IBTA 9.9.3, as
    /// rxe does: the NAK stays queued and is still sent, everything else is flushed) and
    /// raises the affiliated asynchronous event of the refusal.
    fn refuse(&mut self, psn: u32, why: Refuse, env: &mut dyn Env) {
        use AsyncEventType as E;
        let (syndrome, event) = match why {
            Refuse::Invalid => (Syndrome::NakInvalidRequest, Some(E::QpReqErr)),
            Refuse::Access(_) => (Syndrome::NakRemoteAccessError, Some(E::QpAccessErr)),
            Refuse::Operational => (Syndrome::NakRemoteOperationalError, Some(E::QpFatal)),
            Refuse::Reported(syndrome) => (syndrome, None),
        };
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn,
            ?why,
            "responder refuses a request: NAK, QP to ERR"
        );
        env.count(Stat::SendErr);
        self.resp.push_nak(psn, syndrome);
        self.state = QpState::Err;
        self.flush(env);
        if let Some(event_type) = event {
            env.async_event(AsyncEvent {
                event_type,
                element: AsyncEventElement::Qp(self.cfg.qpn),
            });
        }
    }

    /// A duplicate READ whose key was revoked since the READ was executed: a remote access
    /// error NAK with its PSN and no data, but — unlike a refused new request — the QP
    /// stays as it is and no asynchronous event is raised. The READ itself succeeded; a
    /// requester that still waits for it (its responses were lost) fails it with
    /// `REM_ACCESS_ERR` at once, and one that completed it long ago (the duplicate is a
    /// stale copy the network delivered late, after the application deregistered the
    /// region) ignores a NAK for a PSN it no longer has outstanding. Moving to ERR here, as
    /// kernel rxe does, would let a duplicated packet end a healthy connection.
    fn refuse_replay(&mut self, psn: u32, env: &mut dyn Env) {
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn,
            "duplicate READ through a revoked key: NAK, no data"
        );
        env.count(Stat::SendErr);
        self.resp.push_nak(psn, Syndrome::NakRemoteAccessError);
    }

    /// The most responses queued at once: two per responder resource (READ responses,
    /// atomic answers, the ACKs between them) and [`RESPONSE_SLACK`] more.
    fn response_cap(&self) -> usize {
        2 * usize::from(self.cfg.max_dest_rd_atomic.max(1)) + RESPONSE_SLACK
    }

    /// READ responses queued (new ones and replays, partly sent or not).
    fn queued_reads(&self) -> usize {
        self.resp
            .out
            .iter()
            .filter(|o| matches!(o, Out::Read { .. }))
            .count()
    }

    fn duplicate(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) {
        let psn = pkt.psn;
        match pkt.kind {
            Kind::ReadRequest => {
                let found = self.resp.resources.iter().find_map(|r| match r {
                    Resource::Read {
                        psn: base,
                        npkts,
                        region,
                        len,
                    } => {
                        let d = diff(psn, *base);
                        (d >= 0 && (d as u32) < *npkts)
                            .then(|| (*base, *npkts, region.clone(), *len, d as u32))
                    }
                    Resource::Atomic { .. } | Resource::Done { .. } => None,
                });
                // No resource holds it (reused since): dropped, as rxe does (class D).
                let Some((base, npkts, region, len, d)) = found else {
                    return;
                };
                // A replay re-validates the key (rxe's `rxe_recheck_mr`): the region may
                // have been deregistered since the READ was executed.
                if region.as_ref().is_some_and(Grant::is_revoked) {
                    self.refuse_replay(psn, env);
                    return;
                }
                // Bounded replay work: one queued response per READ. One still to send
                // packet `d` covers the duplicate; one already past it starts again from
                // `d`. Otherwise a new replay is queued, up to as many READ responses as
                // the QP has responder resources.
                let mut queued = 0;
                for o in self.resp.out.iter_mut() {
                    if let Out::Read {
                        base_psn,
                        start,
                        next,
                        ..
                    } = o
                    {
                        if *base_psn == base {
                            if d >= *next {
                                env.count(Stat::DuplicateReadDropped);
                            } else {
                                (*start, *next) = (d, d);
                            }
                            return;
                        }
                        queued += 1;
                    }
                }
                if queued >= usize::from(self.cfg.max_dest_rd_atomic) {
                    env.count(Stat::DuplicateReadDropped);
                    return;
                }
                self.resp.out.push_back(Out::Read {
                    region,
                    base_psn: base,
                    len,
                    start: d,
                    next: d,
                    npkts,
                    replay: true,
                });
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                let found = self.resp.resources.iter().find_map(|r| match r {
                    Resource::Atomic { psn: p, orig } if *p == psn => Some(*orig),
                    _ => None,
                });
                if let Some(orig) = found {
                    self.resp.out.push_back(Out::AtomicAck { psn, orig });
                }
            }
            Kind::AtomicWrite | Kind::Flush => {
                let found = self
                    .resp
                    .resources
                    .iter()
                    .any(|r| matches!(r, Resource::Done { psn: p } if *p == psn));
                if found {
                    self.resp.out.push_back(Out::empty_read_response(psn));
                }
            }
            _ => {
                if pkt.ack_req || pkt.pos.ends() {
                    let last = add(self.resp.epsn, super::psn::PSN_MASK);
                    self.resp.push_ack(last);
                }
            }
        }
    }

    fn remote(
        env: &mut dyn Env,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<Grant>, Refuse> {
        if len == 0 {
            return Ok(None); // zero-length accesses check no key (IBTA 9.4.3, 9.4.4)
        }
        env.remote(rkey, va, len, need)
            .map(Some)
            .map_err(Refuse::Access)
    }

    fn execute(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<(), Refuse> {
        let mtu = u64::from(self.cfg.mtu);
        let plen = pkt.payload.len() as u64;
        // Sequence: a message in progress must be continued by its own kind.
        let continuing = match &self.resp.progress {
            InProgress::Idle => None,
            InProgress::Send { kind, .. } | InProgress::Write { kind, .. } => Some(*kind),
        };
        match continuing {
            Some(k) => {
                let same_family = matches!(
                    (k, pkt.kind),
                    (
                        Kind::Send | Kind::SendImm | Kind::SendInv,
                        Kind::Send | Kind::SendImm | Kind::SendInv
                    ) | (Kind::Write | Kind::WriteImm, Kind::Write | Kind::WriteImm)
                );
                if !same_family || pkt.pos.starts() {
                    return Err(Refuse::Invalid);
                }
            }
            None if !pkt.pos.starts() => return Err(Refuse::Invalid),
            None => {}
        }
        // Payload sizes: FIRST and MIDDLE carry exactly one MTU, LAST 1..=MTU.
        match pkt.pos {
            Pos::First | Pos::Middle if plen != mtu => return Err(Refuse::Invalid),
            Pos::Last if plen == 0 || plen > mtu => return Err(Refuse::Invalid),
            Pos::Only if plen > mtu => return Err(Refuse::Invalid),
            _ => {}
        }
        let access = self.cfg.access;
        match pkt.kind {
            Kind::Send | Kind::SendImm | Kind::SendInv => {
                if !self.exec_send(pkt, env)? {
                    return Ok(()); // RNR: the PSN stays expected
                }
            }
            Kind::Write | Kind::WriteImm => {
                if !access.contains(AccessFlags::REMOTE_WRITE) {
                    return Err(Refuse::Invalid);
                }
                if !self.exec_write(pkt, env)? {
                    return Ok(());
                }
            }
            Kind::ReadRequest => {
                if !access.contains(AccessFlags::REMOTE_READ) || plen != 0 {
                    return Err(Refuse::Invalid);
                }
                let reth = pkt.reth.ok_or(Refuse::Invalid)?;
                let len = u64::from(reth.dma_len);
                if len > MAX_MSG {
                    return Err(Refuse::Invalid);
                }
                let region = Self::remote(env, reth.rkey, reth.va, len, AccessFlags::REMOTE_READ)?;
                // At most as many READ responses queued as the QP has responder resources
                // (a requester within its max_rd_atomic never has more outstanding): one
                // beyond is dropped unexecuted, as a lost packet, and the requester's
                // retransmission finds room once the queue has drained.
                let cap = usize::from(self.cfg.max_dest_rd_atomic);
                if cap > 0 && self.queued_reads() >= cap {
                    env.count(Stat::ReadOverflowDropped);
                    return Ok(());
                }
                let npkts = len.div_ceil(mtu).max(1) as u32;
                self.push_resource(Resource::Read {
                    psn: pkt.psn,
                    npkts,
                    region: region.clone(),
                    len,
                })?;
                self.resp.out.push_back(Out::Read {
                    region,
                    base_psn: pkt.psn,
                    len,
                    start: 0,
                    next: 0,
                    npkts,
                    replay: false,
                });
                self.resp.msn = add(self.resp.msn, 1);
                self.resp.epsn = add(pkt.psn, npkts);
                return Ok(());
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                if !access.contains(AccessFlags::REMOTE_ATOMIC) || plen != 0 {
                    return Err(Refuse::Invalid);
                }
                let a = pkt.atomic.ok_or(Refuse::Invalid)?;
                if a.va % 8 != 0 {
                    return Err(Refuse::Invalid);
                }
                let region = Self::remote(env, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)?
                    .ok_or(Refuse::Invalid)?;
                let orig = match pkt.kind {
                    Kind::CompareSwap => region.compare_swap_u64(0, a.compare, a.swap_add),
                    _ => region.fetch_add_u64(0, a.swap_add),
                }
                .map_err(Refuse::of_access)?;
                self.push_resource(Resource::Atomic { psn: pkt.psn, orig })?;
                self.resp
                    .out
                    .push_back(Out::AtomicAck { psn: pkt.psn, orig });
                self.resp.msn = add(self.resp.msn, 1);
                self.resp.epsn = add(pkt.psn, 1);
                return Ok(());
            }
            Kind::AtomicWrite => {
                // An ATOMIC WRITE needs the QP's remote write right (as rxe checks it).
                if !access.contains(AccessFlags::REMOTE_WRITE) {
                    return Err(Refuse::Invalid);
                }
                let reth = pkt.reth.ok_or(Refuse::Invalid)?;
                let value: [u8; 8] = pkt.payload.try_into().map_err(|_| Refuse::Invalid)?;
                if reth.dma_len != 8 || reth.va % 8 != 0 {
                    return Err(Refuse::Invalid);
                }
                let region = Self::remote(env, reth.rkey, reth.va, 8, AccessFlags::REMOTE_WRITE)?
                    .ok_or(Refuse::Invalid)?;
                // The 8 bytes land as they are, in one store, after everything before.
                region
                    .store_u64(0, u64::from_ne_bytes(value))
                    .map_err(Refuse::of_access)?;
                self.answer_with_empty_read_response(pkt.psn)?;
                return Ok(());
            }
            Kind::Flush => {
                if plen != 0 {
                    return Err(Refuse::Invalid);
                }
                let feth = pkt.feth.ok_or(Refuse::Invalid)?;
                let reth = pkt.reth.ok_or(Refuse::Invalid)?;
                let mut need = AccessFlags::empty();
                if feth.placement & PLACEMENT_GLOBAL != 0 {
                    need |= AccessFlags::FLUSH_GLOBAL;
                }
                if feth.placement & PLACEMENT_PERSISTENT != 0 {
                    need |= AccessFlags::FLUSH_PERSISTENT;
                }
                // No known placement bit, or one the QP does not grant: invalid request.
                if need.is_empty()
                    || feth.placement & !(PLACEMENT_GLOBAL | PLACEMENT_PERSISTENT) != 0
                    || !access.contains(need)
                {
                    return Err(Refuse::Invalid);
                }
                // Unlike a zero-length READ or WRITE, a FLUSH always names a key, and it
                // is checked even for an empty range (as rxe's check_rkey does).
                let region = match feth.selectivity {
                    SELECT_RANGE => Some(
                        env.remote(reth.rkey, reth.va, u64::from(reth.dma_len), need)
                            .map_err(Refuse::Access)?,
                    ),
                    SELECT_REGION => {
                        Some(env.remote_region(reth.rkey, need).map_err(Refuse::Access)?)
                    }
                    _ => return Err(Refuse::Invalid),
                };
                // Every earlier request of this QP was executed before this one (PSN
                // order), so its data is in place: make it visible, then durable.
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                if need.contains(AccessFlags::FLUSH_PERSISTENT)
                    && let Some(r) = &region
                {
                    r.persist().map_err(|e| {
                        tracing::warn!(error = ?e, "persistent FLUSH failed");
                        Refuse::of_access(e)
                    })?;
                }
                self.answer_with_empty_read_response(pkt.psn)?;
                return Ok(());
            }
            _ => return Err(Refuse::Invalid),
        }
        self.resp.epsn = add(pkt.psn, 1);
        if pkt.ack_req {
            self.resp.push_ack(pkt.psn);
        }
        Ok(())
    }

    /// Finishes an ATOMIC WRITE or FLUSH at `psn`: a resource to answer duplicates, the
    /// zero-length READ response, the next expected PSN.
    fn answer_with_empty_read_response(&mut self, psn: u32) -> Result<(), Refuse> {
        self.push_resource(Resource::Done { psn })?;
        self.resp.out.push_back(Out::empty_read_response(psn));
        self.resp.msn = add(self.resp.msn, 1);
        self.resp.epsn = add(psn, 1);
        Ok(())
    }

    fn push_resource(&mut self, r: Resource) -> Result<(), Refuse> {
        let cap = usize::from(self.cfg.max_dest_rd_atomic);
        if cap == 0 {
            return Err(Refuse::Invalid);
        }
        // Resources are reused oldest first, as rxe does.
        while self.resp.resources.len() >= cap {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(r);
        Ok(())
    }

    /// Receiver not ready: queues an RNR NAK for `psn`. The requester retries from this PSN,
    /// so sequence NAKs for the packets that follow are pointless: they are suppressed.
    fn rnr_nak(&mut self, psn: u32, env: &mut dyn Env) {
        env.count(Stat::SentRnrNak);
        let timer = self.cfg.min_rnr_timer;
        self.resp.push_nak(psn, Syndrome::RnrNak { timer });
        self.resp.nak_sent = true;
    }

    /// Executes a SEND packet. Returns `Ok(false)` when no receive was posted (an RNR NAK
    /// was queued and the PSN stays expected).
    fn exec_send(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<bool, Refuse> {
        let (wqe, offset) = match std::mem::replace(&mut self.resp.progress, InProgress::Idle) {
            InProgress::Send { wqe, offset, .. } => (wqe, offset),
            _ => match env.take_recv() {
                Some(wqe) => (wqe, 0),
                None => {
                    self.rnr_nak(pkt.psn, env);
                    return Ok(false);
                }
            },
        };
        let fits = offset + pkt.payload.len() as u64 <= MAX_MSG;
        let placed = if fits {
            scatter_into(&wqe.sges, offset, pkt.payload)
        } else {
            Err(AccessError::Mem(MemError::OutOfBounds {
                offset,
                len: pkt.payload.len() as u64,
                size: MAX_MSG,
            }))
        };
        // A SEND with invalidate asks this NIC to invalidate an rkey. A soft device has no
        // key that can be invalidated remotely (no memory windows, no fast-registered
        // regions: every region is registered by `reg_mr`, which rxe refuses to invalidate
        // too), so the request fails: a completion flagged WITH_INV must never tell the
        // application that a peer's access ended when it did not.
        let refused_invalidate = pkt.kind == Kind::SendInv && pkt.pos.ends();
        let failure = match placed {
            // Longer than the receive buffer: the receive completes with a local length
            // error and the requester gets an invalid-request NAK.
            Err(AccessError::Mem(_)) => Some((WcStatus::LocLenErr, Syndrome::NakInvalidRequest)),
            // The receive's memory was deregistered since it was posted: nothing is written;
            // it completes with a local protection error and the requester gets a remote
            // operational error NAK (rxe: a malformed WQE, class A).
            Err(AccessError::Revoked) => {
                Some((WcStatus::LocProtErr, Syndrome::NakRemoteOperationalError))
            }
            // rxe's class J: the receive completes with an invalid request error.
            Ok(()) if refused_invalidate => {
                Some((WcStatus::RemInvReqErr, Syndrome::NakInvalidRequest))
            }
            Ok(()) => None,
        };
        if let Some((status, syndrome)) = failure {
            env.recv_completion(
                WorkCompletion {
                    wr_id: wqe.wr_id,
                    status,
                    opcode: WcOpcode::Recv,
                    qp_num: self.cfg.qpn,
                    ..WorkCompletion::default()
                },
                false,
            );
            return Err(Refuse::Reported(syndrome));
        }
        let offset = offset + pkt.payload.len() as u64;
        if pkt.pos.ends() {
            let mut wc = WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: offset as u32,
                qp_num: self.cfg.qpn,
                src_qp: self.cfg.dest_qpn,
                ..WorkCompletion::default()
            };
            if let Some(imm) = pkt.imm.filter(|_| pkt.kind == Kind::SendImm) {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            self.resp.msn = add(self.resp.msn, 1);
            env.recv_completion(wc, pkt.solicited);
        } else {
            self.resp.progress = InProgress::Send {
                wqe,
                kind: pkt.kind,
                offset,
            };
        }
        Ok(true)
    }

    /// Executes an RDMA WRITE packet. Returns `Ok(false)` on RNR (WRITE with immediate
    /// and no receive posted).
    fn exec_write(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<bool, Refuse> {
        let (region, offset, len) =
            match std::mem::replace(&mut self.resp.progress, InProgress::Idle) {
                InProgress::Write {
                    region,
                    offset,
                    len,
                    ..
                } => (region, offset, len),
                _ => {
                    let reth = pkt.reth.ok_or(Refuse::Invalid)?;
                    let len = u64::from(reth.dma_len);
                    if len > MAX_MSG {
                        return Err(Refuse::Invalid);
                    }
                    let region =
                        Self::remote(env, reth.rkey, reth.va, len, AccessFlags::REMOTE_WRITE)?;
                    (region, 0, len)
                }
            };
        let end = offset + pkt.payload.len() as u64;
        if end > len || (pkt.pos.ends() && end != len) {
            return Err(Refuse::Invalid);
        }
        // Every packet re-validates the key resolved at FIRST (as rxe's check_rkey does for
        // MIDDLE and LAST): the write below refuses a region deregistered since. A WRITE
        // with immediate consumes a receive at its end: it checks the key before it takes
        // the receive, and takes it before touching memory so that an RNR retry is
        // harmless.
        let takes_recv = pkt.kind == Kind::WriteImm && pkt.pos.ends();
        if takes_recv && !pkt.payload.is_empty() && region.as_ref().is_some_and(Grant::is_revoked) {
            return Err(Refuse::Access(RemoteKeyError::Revoked));
        }
        let recv = if takes_recv {
            match env.take_recv() {
                Some(w) => Some(w),
                None => {
                    self.rnr_nak(pkt.psn, env);
                    // Keep the message state so the retried LAST continues it.
                    if !pkt.pos.starts() {
                        self.resp.progress = InProgress::Write {
                            region,
                            kind: pkt.kind,
                            offset,
                            len,
                        };
                    }
                    return Ok(false);
                }
            }
        } else {
            None
        };
        if let Some(r) = &region
            && !pkt.payload.is_empty()
            && let Err(e) = r.write(offset as usize, pkt.payload)
        {
            let why = match e {
                AccessError::Revoked => RemoteKeyError::Revoked,
                AccessError::Mem(_) => RemoteKeyError::OutOfBounds,
            };
            // A receive this packet took (the key was revoked between the check above and
            // the copy) completes with the error, which then needs no event.
            if let Some(w) = recv {
                env.recv_completion(
                    WorkCompletion {
                        wr_id: w.wr_id,
                        status: WcStatus::RemAccessErr,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        qp_num: self.cfg.qpn,
                        src_qp: self.cfg.dest_qpn,
                        ..WorkCompletion::default()
                    },
                    false,
                );
                return Err(Refuse::Reported(Syndrome::NakRemoteAccessError));
            }
            return Err(Refuse::Access(why));
        }
        if pkt.pos.ends() {
            self.resp.msn = add(self.resp.msn, 1);
            if let Some(w) = recv {
                let wc = WorkCompletion {
                    wr_id: w.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: len as u32,
                    imm_data: pkt.imm.unwrap_or(0),
                    wc_flags: WcFlags::WITH_IMM,
                    qp_num: self.cfg.qpn,
                    src_qp: self.cfg.dest_qpn,
                    ..WorkCompletion::default()
                };
                env.recv_completion(wc, pkt.solicited);
            }
        } else {
            self.resp.progress = InProgress::Write {
                region,
                kind: pkt.kind,
                offset: end,
                len,
            };
        }
        Ok(true)
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
        held: super::grant::Held,
        offset: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::KeyedRegion;
    use remem_verbs::{MemRegion, MemoryBuffer};
    use std::collections::HashMap;
    use std::sync::Arc;

    const RKEY: u32 = 0x77;
    const MTU: u32 = 256;
    const EPSN: u32 = 0x00ff_fffe; // the READs below wrap the 24-bit PSN space

    /// One revocable region under `RKEY`, and what the transport reports.
    struct TestEnv {
        buf: Arc<MemoryBuffer>,
        key: Arc<KeyedRegion>,
        stats: HashMap<&'static str, u64>,
        events: Vec<AsyncEvent>,
        send_wcs: Vec<WorkCompletion>,
    }

    impl TestEnv {
        fn new() -> Self {
            let buf = Arc::new(MemoryBuffer::zeroed(64 * 1024).unwrap());
            TestEnv {
                key: KeyedRegion::new(MemRegion::whole(buf.clone())),
                buf,
                stats: HashMap::new(),
                events: Vec::new(),
                send_wcs: Vec::new(),
            }
        }
        fn stat(&self, name: &str) -> u64 {
            self.stats.get(name).copied().unwrap_or(0)
        }
    }

    impl Env for TestEnv {
        fn remote(
            &mut self,
            rkey: u32,
            va: u64,
            len: u64,
            _need: AccessFlags,
        ) -> Result<Grant, RemoteKeyError> {
            if rkey != RKEY || self.key.is_revoked() {
                return Err(RemoteKeyError::UnknownKey);
            }
            self.key.grant(va, len)
        }
        fn remote_region(&mut self, rkey: u32, need: AccessFlags) -> Result<Grant, RemoteKeyError> {
            let va = self.key.region().addr();
            let len = self.key.region().len() as u64;
            self.remote(rkey, va, len, need)
        }
        fn take_recv(&mut self) -> Option<RecvWqe> {
            None
        }
        fn send_completion(&mut self, wc: WorkCompletion) {
            self.send_wcs.push(wc);
        }
        fn recv_completion(&mut self, _wc: WorkCompletion, _solicited: bool) {}
        fn count(&mut self, stat: Stat) {
            let name = match stat {
                Stat::DuplicateRequest => "duplicate_request",
                Stat::SendErr => "send_err",
                Stat::DuplicateReadDropped => "drop_duplicate_read",
                Stat::ReadOverflowDropped => "drop_read_overflow",
                Stat::OutOfSeqRequest => "out_of_seq_request",
                Stat::ResponseQueueFull => "drop_resp_queue_full",
                Stat::SentRnrNak => "send_rnr_err",
                _ => "other",
            };
            *self.stats.entry(name).or_default() += 1;
        }
        fn async_event(&mut self, event: AsyncEvent) {
            self.events.push(event);
        }
    }

    /// A transport configured with `cfg`, taken through INIT and RTR to RTS.
    fn transport(env: &mut TestEnv, cfg: RcConfig) -> RcTransport {
        let mut t = RcTransport::new(cfg);
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            t.set_state(cfg, s, env);
        }
        t
    }

    /// A responder expecting `EPSN`, granting remote access, with `max_dest_rd_atomic`
    /// responder resources.
    fn responder(env: &mut TestEnv, max_dest_rd_atomic: u8) -> RcTransport {
        let cfg = RcConfig {
            qpn: 0x42,
            dest_qpn: 0x24,
            mtu: MTU,
            rq_psn: EPSN,
            max_dest_rd_atomic,
            access: AccessFlags::REMOTE,
            ..RcConfig::default()
        };
        transport(env, cfg)
    }

    /// A fresh [`TestEnv`], a [`responder`] on it and the address of its region.
    fn setup(max_dest_rd_atomic: u8) -> (TestEnv, RcTransport, u64) {
        let mut env = TestEnv::new();
        let t = responder(&mut env, max_dest_rd_atomic);
        let va = env.key.region().addr();
        (env, t, va)
    }

    /// What the transport sends: (kind, pos, psn, syndrome, payload).
    type Sent = (Kind, Pos, u32, Option<Syndrome>, Vec<u8>);

    /// Takes up to `max` packets out of the transport.
    fn transmit(t: &mut RcTransport, env: &mut TestEnv, max: usize) -> Vec<Sent> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(p) = t.poll_transmit(Instant::now(), env, |h, fill| {
                let mut payload = vec![0u8; h.payload_len as usize];
                fill(&mut payload).expect("payload gathered");
                (h.kind, h.pos, h.psn, h.aeth.map(|a| a.0), payload)
            }) else {
                break;
            };
            out.push(p);
        }
        out
    }

    fn write_pkt(pos: Pos, psn: u32, payload: &[u8], total: u32, va: u64) -> RxPacket<'_> {
        let mut p = RxPacket::new(Kind::Write, pos, psn);
        if pos.starts() {
            p.reth = Some(Reth {
                va,
                rkey: RKEY,
                dma_len: total,
            });
        }
        p.ack_req = pos.ends();
        p.payload = payload;
        p
    }

    fn read_pkt(psn: u32, va: u64, len: u32) -> RxPacket<'static> {
        let mut p = RxPacket::new(Kind::ReadRequest, Pos::Only, psn);
        p.reth = Some(Reth {
            va,
            rkey: RKEY,
            dma_len: len,
        });
        p
    }

    fn qp_event(event_type: AsyncEventType) -> AsyncEvent {
        AsyncEvent {
            event_type,
            element: AsyncEventElement::Qp(0x42),
        }
    }

    fn nak(kind_psn: &Sent) -> Option<(u32, Syndrome)> {
        match kind_psn {
            (Kind::Ack, _, psn, Some(s), _) if !matches!(s, Syndrome::Ack { .. }) => {
                Some((*psn, *s))
            }
            _ => None,
        }
    }

    /// Checks how a refusal of a revoked key ended: the NAKs in `sent` are one remote access
    /// error, for `psn`; a `fatal` one left the QP in ERR with the access error event, any
    /// other (a stale duplicate's) left it in RTS with no event.
    fn refused_revoked(t: &RcTransport, env: &TestEnv, sent: &[Sent], psn: u32, fatal: bool) {
        assert_eq!(
            sent.iter().filter_map(nak).collect::<Vec<_>>(),
            [(psn, Syndrome::NakRemoteAccessError)]
        );
        if fatal {
            assert_eq!(t.state(), QpState::Err);
            assert_eq!(env.events, [qp_event(AsyncEventType::QpAccessErr)]);
        } else {
            assert_eq!(t.state(), QpState::Rts);
            assert_eq!(env.events, []);
        }
    }

    #[test]
    fn a_write_continued_after_deregistration_is_refused() {
        let (mut env, mut t, va) = setup(4);
        let now = Instant::now();
        let first = [0xaa; MTU as usize];
        t.handle_packet(
            now,
            &write_pkt(Pos::First, EPSN, &first, 3 * MTU, va),
            &mut env,
        );
        assert_eq!(env.buf.to_vec(0, 256).unwrap(), first, "FIRST lands");
        env.key.revoke(); // ibv_dereg_mr between FIRST and MIDDLE
        let middle = [0xbb; MTU as usize];
        let psn = add(EPSN, 1);
        t.handle_packet(now, &write_pkt(Pos::Middle, psn, &middle, 0, 0), &mut env);
        let last = [0xcc; MTU as usize];
        t.handle_packet(
            now,
            &write_pkt(Pos::Last, add(psn, 1), &last, 0, 0),
            &mut env,
        );
        assert_eq!(
            env.buf.to_vec(256, 512).unwrap(),
            vec![0; 512],
            "nothing written after the deregistration"
        );
        let sent = transmit(&mut t, &mut env, 10);
        refused_revoked(&t, &env, &sent, psn, true);
    }

    #[test]
    fn a_read_response_stops_at_deregistration() {
        let (mut env, mut t, va) = setup(4);
        env.buf.fill(0, 4 * MTU as usize, 0x5a).unwrap();
        t.handle_packet(Instant::now(), &read_pkt(EPSN, va, 4 * MTU), &mut env);
        let first = transmit(&mut t, &mut env, 1);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].0, first[0].1), (Kind::ReadResponse, Pos::First));
        assert_eq!(first[0].4, vec![0x5a; MTU as usize]);
        env.key.revoke();
        let rest = transmit(&mut t, &mut env, 10);
        assert!(
            rest.iter().all(|p| p.0 != Kind::ReadResponse),
            "no response packet after the deregistration: {rest:?}"
        );
        // A NAK in place of the next response packet, with its PSN.
        refused_revoked(&t, &env, &rest, add(EPSN, 1), true);
    }

    #[test]
    fn a_duplicate_read_after_deregistration_returns_no_data() {
        let (mut env, mut t, va) = setup(4);
        env.buf.fill(0, 2 * MTU as usize, 0x5a).unwrap();
        let now = Instant::now();
        t.handle_packet(now, &read_pkt(EPSN, va, 2 * MTU), &mut env);
        assert_eq!(transmit(&mut t, &mut env, 10).len(), 2);
        // The region is deregistered and its memory reused for other data.
        env.key.revoke();
        env.buf.fill(0, 2 * MTU as usize, 0x99).unwrap();
        t.handle_packet(now, &read_pkt(EPSN, va, 2 * MTU), &mut env);
        let sent = transmit(&mut t, &mut env, 10);
        assert!(
            sent.iter().all(|p| p.4.is_empty()),
            "data replayed: {sent:?}"
        );
        // The READ was answered before: a stale duplicate does not end the QP.
        refused_revoked(&t, &env, &sent, EPSN, false);
    }

    #[test]
    fn a_replay_revoked_before_it_is_sent_stops_without_ending_the_qp() {
        let (mut env, mut t, va) = setup(4);
        let now = Instant::now();
        t.handle_packet(now, &read_pkt(EPSN, va, 3 * MTU), &mut env);
        assert_eq!(transmit(&mut t, &mut env, 10).len(), 3);
        // A duplicate of the READ's second packet queues a replay; the key goes first.
        t.handle_packet(
            now,
            &read_pkt(add(EPSN, 1), va + u64::from(MTU), 2 * MTU),
            &mut env,
        );
        env.key.revoke();
        let sent = transmit(&mut t, &mut env, 10);
        assert!(
            sent.iter().all(|p| p.4.is_empty()),
            "data replayed: {sent:?}"
        );
        refused_revoked(&t, &env, &sent, add(EPSN, 1), false);
    }

    #[test]
    fn a_flood_of_duplicate_reads_is_bounded() {
        let (mut env, mut t, va) = setup(2);
        let now = Instant::now();
        const PKTS: u32 = 64;
        t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
        // Duplicates while the response is queued: covered by it, dropped.
        for _ in 0..1000 {
            t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
        }
        assert_eq!(env.stat("drop_duplicate_read"), 1000);
        assert_eq!(transmit(&mut t, &mut env, 100_000).len(), PKTS as usize);
        // Part of a replay out, then duplicates from the start: it starts again, once.
        t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
        assert_eq!(transmit(&mut t, &mut env, 10).len(), 10);
        for _ in 0..1000 {
            t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
        }
        let replay = transmit(&mut t, &mut env, 100_000);
        assert_eq!(replay.len(), PKTS as usize);
        assert_eq!((replay[0].1, replay[0].2), (Pos::First, EPSN));
        assert_eq!(env.stat("drop_duplicate_read"), 1000 + 999);
        // A duplicate from the middle (the requester's re-request) while a replay of the
        // READ is still queued from an earlier PSN: covered by it.
        let mid = add(EPSN, 40);
        t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
        t.handle_packet(now, &read_pkt(mid, va + 40 * 256, 24 * MTU), &mut env);
        assert_eq!(transmit(&mut t, &mut env, 100_000).len(), PKTS as usize);
        assert_eq!(t.state(), QpState::Rts);
        assert!(env.events.is_empty());
    }

    #[test]
    fn what_a_peer_makes_the_responder_queue_is_bounded() {
        let (mut env, mut t, va) = setup(4); // at most 2 × 4 + 16 = 24 responses queued
        let now = Instant::now();
        // SENDs with no receive posted, nothing sent in between: one RNR NAK, not one each.
        let send = RxPacket::new(Kind::Send, Pos::Only, EPSN);
        for _ in 0..1000 {
            t.handle_packet(now, &send, &mut env);
        }
        assert_eq!(env.stat("send_rnr_err"), 1000);
        let sent = transmit(&mut t, &mut env, 100_000);
        assert_eq!(sent.len(), 1, "{sent:?}");
        // New FETCH_ADDs at consecutive PSNs, nothing sent in between: executed while the
        // queue has room; the rest dropped unexecuted, as if lost.
        let fa = |psn| {
            let mut p = RxPacket::new(Kind::FetchAdd, Pos::Only, psn);
            p.atomic = Some(AtomicEth {
                va,
                rkey: RKEY,
                swap_add: 1,
                compare: 0,
            });
            p
        };
        let mut psn = EPSN;
        for _ in 0..1000 {
            t.handle_packet(now, &fa(psn), &mut env);
            psn = add(psn, 1);
        }
        assert_eq!(env.buf.load_u64(0).unwrap(), 24, "executed");
        // (The first one dropped keeps its PSN expected: those after it are out of
        // sequence, and with the queue full not even a sequence NAK is queued.)
        assert_eq!(env.stat("drop_resp_queue_full"), 1);
        assert_eq!(env.stat("out_of_seq_request"), 1000 - 25);
        assert_eq!(transmit(&mut t, &mut env, 100_000).len(), 24);
        // The requester's retransmission of the first one dropped is executed now.
        let next = add(EPSN, 24);
        t.handle_packet(now, &fa(next), &mut env);
        assert_eq!(env.buf.load_u64(0).unwrap(), 25);
        // Duplicates of it: answered from its resource, at most a queue's worth at a time.
        for _ in 0..1000 {
            t.handle_packet(now, &fa(next), &mut env);
        }
        assert_eq!(transmit(&mut t, &mut env, 100_000).len(), 24);
        assert_eq!(env.buf.load_u64(0).unwrap(), 25, "a duplicate was executed");
        assert_eq!(t.state(), QpState::Rts);
        assert!(env.events.is_empty());
    }

    #[test]
    fn an_owed_ack_leaves_before_this_sides_next_request() {
        // A ping-pong: the peer's WRITE arrives and this side posts its answer at once. The
        // ACK of the peer's WRITE goes first, as a NIC that acknowledges in hardware sends
        // it: a peer waiting in an event loop sees its own WRITE complete before this
        // side's answer arrives (perftest's `ib_send_lat -e` relies on it).
        let (mut env, mut t, va) = setup(4);
        let now = Instant::now();
        t.handle_packet(now, &write_pkt(Pos::Only, EPSN, &[1; 8], 8, va), &mut env);
        t.post_send(
            SendWqe {
                wr_id: 1,
                op: SendOp::Send,
                data: crate::wqe::SendData::Sges(vec![
                    MemRegion::new(env.buf.clone(), 0..8).unwrap().into(),
                ]),
                len: 8,
                signaled: true,
                solicited: false,
                fence: false,
                ud: None,
            },
            &mut env,
        );
        let sent = transmit(&mut t, &mut env, 10);
        let kinds: Vec<Kind> = sent.iter().map(|p| p.0).collect();
        assert_eq!(kinds, [Kind::Ack, Kind::Send], "{sent:?}");
    }

    #[test]
    fn the_window_bounds_the_packets_of_one_message_in_flight() {
        let mut env = TestEnv::new();
        let cfg = RcConfig {
            qpn: 0x42,
            dest_qpn: 0x24,
            mtu: MTU,
            sq_psn: EPSN,
            window: 16,
            ..RcConfig::default()
        };
        let mut t = transport(&mut env, cfg);
        let len = 64 * MTU as usize;
        t.post_send(
            SendWqe {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    remote_addr: 0x1000,
                    rkey: 5,
                },
                data: crate::wqe::SendData::Sges(vec![
                    MemRegion::new(env.buf.clone(), 0..len).unwrap().into(),
                ]),
                len: len as u64,
                signaled: true,
                solicited: false,
                fence: false,
                ud: None,
            },
            &mut env,
        );
        // A 64-packet WRITE to a peer that does not answer: 16 packets, then nothing; the
        // 16th asks for the ACK that opens the window again.
        let now = Instant::now();
        let mut sent = Vec::new();
        while let Some(p) = t.poll_transmit(now, &mut env, |h, _| (h.psn, h.ack_req)) {
            sent.push(p);
        }
        assert_eq!(sent.len(), 16);
        assert_eq!(sent.iter().filter(|p| p.1).count(), 1, "{sent:?}");
        assert_eq!(sent[15], (add(EPSN, 15), true));
        let mut ack = RxPacket::new(Kind::Ack, Pos::Only, add(EPSN, 15));
        ack.aeth = Some((ACK_UNLIMITED, 1));
        t.handle_packet(now, &ack, &mut env);
        assert_eq!(
            transmit(&mut t, &mut env, 1000).len(),
            16,
            "the window moved on"
        );
    }

    #[test]
    fn reads_beyond_the_responder_resources_are_dropped_as_lost() {
        let (mut env, mut t, va) = setup(2);
        let now = Instant::now();
        let mut psn = EPSN;
        for _ in 0..3 {
            t.handle_packet(now, &read_pkt(psn, va, 4 * MTU), &mut env);
            psn = add(psn, 4);
        }
        assert_eq!(env.stat("drop_read_overflow"), 1, "the third is dropped");
        let sent = transmit(&mut t, &mut env, 100);
        assert_eq!(sent.len(), 8, "two READs answered");
        // Not executed: its PSN is still expected, and it is accepted once there is room.
        let third = add(EPSN, 8);
        t.handle_packet(now, &read_pkt(third, va, 4 * MTU), &mut env);
        let sent = transmit(&mut t, &mut env, 100);
        assert_eq!(sent.len(), 4);
        assert_eq!(sent[0].2, third);
        assert_eq!(t.state(), QpState::Rts);
    }

    #[test]
    fn refusals_raise_their_affiliated_events() {
        // Invalid request: a MIDDLE without FIRST.
        let mut env = TestEnv::new();
        let mut t = responder(&mut env, 4);
        let m = [0u8; MTU as usize];
        t.handle_packet(
            Instant::now(),
            &write_pkt(Pos::Middle, EPSN, &m, 0, 0),
            &mut env,
        );
        assert_eq!(t.state(), QpState::Err);
        assert_eq!(env.events, [qp_event(AsyncEventType::QpReqErr)]);
        // Access error: an unknown key.
        let mut env = TestEnv::new();
        let mut t = responder(&mut env, 4);
        let mut p = read_pkt(EPSN, env.key.region().addr(), 8);
        p.reth.as_mut().unwrap().rkey = RKEY + 1;
        t.handle_packet(Instant::now(), &p, &mut env);
        assert_eq!(env.events, [qp_event(AsyncEventType::QpAccessErr)]);
        // A duplicate or a packet after ERR raises nothing more.
        t.handle_packet(Instant::now(), &p, &mut env);
        assert_eq!(env.events.len(), 1);
    }
}
