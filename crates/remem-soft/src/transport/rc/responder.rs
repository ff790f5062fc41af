//! The responder of an RC queue pair: executes requests in PSN order, answers duplicates,
//! refuses what it must (NAK, QP to ERR, asynchronous event) and queues its responses.

use super::{
    ACK_UNLIMITED, AccessError, Env, Grant, Kind, MAX_MSG, PLACEMENT_GLOBAL, PLACEMENT_PERSISTENT,
    PayloadSrc, Pos, Psn, RcTransport, RemoteKeyError, RxPacket, SELECT_RANGE, SELECT_REGION, Stat,
    Syndrome, TxPacket,
};
use crate::transport::wqe::{RecvWqe, scatter_into};
use remem_verbs::{
    AccessFlags, AsyncEvent, AsyncEventElement, AsyncEventType, MemError, QpState, WcFlags,
    WcOpcode, WcStatus, WorkCompletion,
};
use std::collections::VecDeque;

/// Responses a responder queues beyond two per responder resource (an answer and an ACK
/// before it): room for the ACKs and NAKs of one receive batch. A requester within its
/// `max_rd_atomic` never needs more; what a peer sends beyond it is dropped unexecuted.
const RESPONSE_SLACK: usize = 16;

/// The message sequence number after `msn` (24 bits, as PSNs; it is no PSN: it counts
/// messages, and the requester never compares it).
fn next_msn(msn: u32) -> u32 {
    msn.wrapping_add(1) & Psn::MAX
}

/// What the responder is in the middle of.
#[derive(Debug)]
pub(super) enum InProgress {
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
pub(super) enum Resource {
    Read {
        psn: Psn,
        npkts: u32,
        region: Option<Grant>,
        len: u64,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
    /// An ATOMIC WRITE or FLUSH, executed once and answered by a zero-length READ
    /// response (a duplicate is answered again, not executed again).
    Done {
        psn: Psn,
    },
}

impl Out {
    /// The answer to an ATOMIC WRITE or FLUSH: an RDMA READ response (only) without data.
    pub(super) fn empty_read_response(psn: Psn) -> Out {
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
pub(super) enum Out {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
    },
    Read {
        /// Checked before each packet's payload is gathered (a revoked key ends the
        /// response with a NAK).
        region: Option<Grant>,
        /// PSN of packet index 0 of the READ.
        base_psn: Psn,
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
pub(super) struct Responder {
    pub(super) epsn: Psn,
    pub(super) msn: u32,
    pub(super) nak_sent: bool,
    pub(super) progress: InProgress,
    pub(super) resources: VecDeque<Resource>,
    pub(super) out: VecDeque<Out>,
    /// The payload of the replayed READ response packet being built, copied out of the
    /// region with the kernel's checked copy ([`PayloadSrc::Copied`]).
    pub(super) replay_copy: Vec<u8>,
}

impl Responder {
    pub(super) fn new() -> Self {
        Responder {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            progress: InProgress::Idle,
            resources: VecDeque::new(),
            out: VecDeque::new(),
            replay_copy: Vec::new(),
        }
    }

    /// Queues an ACK for `psn`, merging with an unsent ACK at the back of the queue.
    pub(super) fn push_ack(&mut self, psn: Psn) {
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
    pub(super) fn push_nak(&mut self, psn: Psn, syndrome: Syndrome) {
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
pub(super) enum Refuse {
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
    pub(super) fn of_access(e: AccessError) -> Refuse {
        match e {
            AccessError::Revoked => Refuse::Access(RemoteKeyError::Revoked),
            AccessError::Mem(_) => Refuse::Operational,
        }
    }
}

impl RcTransport {
    /// The next queued response (ACK/NAK, atomic ACK, READ response packet).
    pub(super) fn poll_response(&mut self, env: &mut dyn Env) -> Option<(TxPacket, PayloadSrc)> {
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
                let psn = base_psn.add(idx);
                let offset = u64::from(idx) * u64::from(mtu);
                let payload_len = len.saturating_sub(offset).min(u64::from(mtu)) as u32;
                // A READ response goes on only while its key stands (rxe re-checks the key
                // before each response packet: `rxe_recheck_mr`). The packet holds the
                // grant until its payload is gathered, so a deregistration either comes
                // first — the packet is replaced by a remote access error NAK with its
                // PSN, and the QP goes to ERR — or waits for the copy.
                //
                // A replay answers a duplicate request, and may be built after the
                // requester completed the READ and the program that owns the memory let it
                // go: UCX frees a buffer once its peer has READ it and deregisters it only
                // later (its registration cache's invalidation is lazy). A NIC reads the
                // pages its registration pinned; the soft NIC reads the program's mappings,
                // so a replay's payload is copied by the kernel, which fails on memory no
                // longer mapped where a load would kill the process. Such a replay ends as
                // a revoked key's does: a remote access error NAK, no data, the QP as it
                // was (`refuse_replay`).
                let src = match region {
                    Some(r) if payload_len > 0 => match r.clone().hold() {
                        Some(held) if *replay => {
                            let copy = &mut self.resp.replay_copy;
                            copy.clear();
                            copy.resize(payload_len as usize, 0);
                            match held.read_careful(offset as usize, copy) {
                                Ok(()) => PayloadSrc::Copied,
                                Err(e) => {
                                    tracing::debug!(
                                        qpn = self.cfg.qpn,
                                        psn = psn.value(),
                                        error = %e,
                                        "a duplicate READ's memory is gone"
                                    );
                                    self.resp.out.pop_front();
                                    self.refuse_replay(psn, env);
                                    return self.poll_response(env);
                                }
                            }
                        }
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

    /// Handles one received request packet addressed to this QP.
    pub(super) fn handle_request(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return;
        }
        // What a peer can make the responder queue is bounded: with the queue of responses
        // full, a request is dropped unexecuted, as if lost (the requester retries it).
        let full = self.resp.out.len() >= self.response_cap();
        let d = pkt.psn.diff(self.resp.epsn);
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
    pub(super) fn refuse(&mut self, psn: Psn, why: Refuse, env: &mut dyn Env) {
        use AsyncEventType as E;
        let (syndrome, event) = match why {
            Refuse::Invalid => (Syndrome::NakInvalidRequest, Some(E::QpReqErr)),
            Refuse::Access(_) => (Syndrome::NakRemoteAccessError, Some(E::QpAccessErr)),
            Refuse::Operational => (Syndrome::NakRemoteOperationalError, Some(E::QpFatal)),
            Refuse::Reported(syndrome) => (syndrome, None),
        };
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn = psn.value(),
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
    pub(super) fn refuse_replay(&mut self, psn: Psn, env: &mut dyn Env) {
        tracing::debug!(
            qpn = self.cfg.qpn,
            psn = psn.value(),
            "duplicate READ through a revoked key: NAK, no data"
        );
        env.count(Stat::SendErr);
        self.resp.push_nak(psn, Syndrome::NakRemoteAccessError);
    }

    /// The most responses queued at once: two per responder resource (READ responses,
    /// atomic answers, the ACKs between them) and [`RESPONSE_SLACK`] more.
    pub(super) fn response_cap(&self) -> usize {
        2 * usize::from(self.cfg.max_dest_rd_atomic.max(1)) + RESPONSE_SLACK
    }

    /// READ responses queued (new ones and replays, partly sent or not).
    pub(super) fn queued_reads(&self) -> usize {
        self.resp
            .out
            .iter()
            .filter(|o| matches!(o, Out::Read { .. }))
            .count()
    }

    pub(super) fn duplicate(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) {
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
                        let d = psn.diff(*base);
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
                    let last = self.resp.epsn.prev();
                    self.resp.push_ack(last);
                }
            }
        }
    }

    pub(super) fn remote(
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

    pub(super) fn execute(&mut self, pkt: &RxPacket<'_>, env: &mut dyn Env) -> Result<(), Refuse> {
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
                self.resp.msn = next_msn(self.resp.msn);
                self.resp.epsn = pkt.psn.add(npkts);
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
                self.resp.msn = next_msn(self.resp.msn);
                self.resp.epsn = pkt.psn.next();
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
        self.resp.epsn = pkt.psn.next();
        if pkt.ack_req {
            self.resp.push_ack(pkt.psn);
        }
        Ok(())
    }

    /// Finishes an ATOMIC WRITE or FLUSH at `psn`: a resource to answer duplicates, the
    /// zero-length READ response, the next expected PSN.
    pub(super) fn answer_with_empty_read_response(&mut self, psn: Psn) -> Result<(), Refuse> {
        self.push_resource(Resource::Done { psn })?;
        self.resp.out.push_back(Out::empty_read_response(psn));
        self.resp.msn = next_msn(self.resp.msn);
        self.resp.epsn = psn.next();
        Ok(())
    }

    pub(super) fn push_resource(&mut self, r: Resource) -> Result<(), Refuse> {
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
    pub(super) fn rnr_nak(&mut self, psn: Psn, env: &mut dyn Env) {
        env.count(Stat::SentRnrNak);
        let timer = self.cfg.min_rnr_timer;
        self.resp.push_nak(psn, Syndrome::RnrNak { timer });
        self.resp.nak_sent = true;
    }

    /// Executes a SEND packet. Returns `Ok(false)` when no receive was posted (an RNR NAK
    /// was queued and the PSN stays expected).
    pub(super) fn exec_send(
        &mut self,
        pkt: &RxPacket<'_>,
        env: &mut dyn Env,
    ) -> Result<bool, Refuse> {
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
        // A SEND with invalidate asks this NIC to invalidate an rkey once its data is
        // placed (rxe's order). Only a type 2 memory window bound on this QP can be
        // (`Env::invalidate`; a region from `reg_mr` cannot, as rxe refuses it); anything
        // else fails the request: a completion flagged WITH_INV must never tell the
        // application that a peer's access ended when it did not.
        let invalidates = pkt.kind == Kind::SendInv && pkt.pos.ends();
        let refused_invalidate =
            invalidates && placed.is_ok() && !pkt.ieth.is_some_and(|rkey| env.invalidate(rkey));
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
            if let Some(rkey) = pkt.ieth.filter(|_| invalidates) {
                wc.imm_data = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
            self.resp.msn = next_msn(self.resp.msn);
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
    pub(super) fn exec_write(
        &mut self,
        pkt: &RxPacket<'_>,
        env: &mut dyn Env,
    ) -> Result<bool, Refuse> {
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
            self.resp.msn = next_msn(self.resp.msn);
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
