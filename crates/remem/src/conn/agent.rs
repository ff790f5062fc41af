//! The agent: memory requested from the peer, with leases.
//!
//! [`Connection::request_remote_mr`] asks the peer for a region; the peer's agent
//! allocates it, registers it for remote access (a registration of its own, so that ending
//! the lease really ends access: the registration goes, and any token for it reaches
//! nothing) and grants it for a time on *its* monotonic clock — only the duration travels,
//! never a wall-clock time. The lease ends when it expires on the lender, when the borrower
//! returns it ([`Connection::return_remote_mr`]), or when the borrower gives the memory
//! back with its contents ([`Connection::send_remote_mr`]; the lender takes it with
//! [`Connection::receive_local_mr`], registered anew for local access only).
//!
//! [`Connection::send_local_mr`] gives a region away: the sender no longer holds it, the
//! peer takes it with [`Connection::receive_remote_mr`] as a lease without a time limit,
//! and the region lives (registered for the peer, and only for it) until the peer returns
//! it, gives it back, drops it, or the connection ends.
//!
//! Dropping a [`RemoteLease`] returns it, as [`Connection::return_remote_mr`] does.
//!
//! Requests carry ids and time out ([`crate::RdmaBuilder::request_timeout`]); they travel
//! as messages on the connection and never block data-path operations.
//!
//! # What a peer can make this side hold
//!
//! Everything the agent holds for a peer is bounded per connection:
//!
//! - Leases: at most [`crate::RdmaBuilder::lend_limit`] bytes (each lease counts as the
//!   whole pages it pins, at least one) and [`crate::RdmaBuilder::lend_count_limit`]
//!   regions (at most a sixteenth of the device's `max_mr`; each lease is two
//!   registrations: its memory, for local access only, and the peer's, of exactly its
//!   range). Regions given back count until the application takes them. A request beyond
//!   either limit, or one the device refuses (its registrations used up), is answered
//!   with a refusal ([`Error::Refused`] on the requester), and nothing stays allocated.
//! - Expiry timers: one per live lease, cancelled when the lease ends otherwise.
//! - Replies: answers wait in one queue, sent in order by one task. A peer that has
//!   [`MAX_QUEUED_REPLIES`] answers waiting (it sends requests while it does not take this
//!   side's messages) breaks the protocol: the connection is closed, and the request that
//!   broke the bound is not served. This side never does that to its peer: at most
//!   [`MAX_OPEN_REQUESTS`] of its requests wait for an answer at once (further ones wait
//!   their turn, within the request timeout).
//! - Regions given to this side ([`Connection::send_local_mr`] on the peer) that the
//!   application has not taken yet: at most [`MAX_UNTAKEN_REGIONS`]; one more closes the
//!   connection as a protocol violation.
//!
//! When the connection ends, every lease and every region given away on it ends too:
//! their registrations go, so keys learnt on it reach nothing through any other
//! connection either.

use super::{ConnShared, Connection, Kind};
pub use crate::error::MalformedAgent;
use crate::error::{Error, ProtocolViolation, Result};
use crate::mr::{LocalMr, RemoteMr, TOKEN_LEN};

use std::alloc::Layout;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, oneshot};

/// Answers (grants, refusals, returns of unwanted grants) a peer may leave waiting to be
/// sent before its connection is closed as a protocol violation.
pub(crate) const MAX_QUEUED_REPLIES: usize = 256;
/// This side's requests that wait for the peer's answer at once (a quarter of
/// [`MAX_QUEUED_REPLIES`], so that requests this side gave up on still leave room).
pub(crate) const MAX_OPEN_REQUESTS: usize = 64;
/// Regions given to this side and not yet taken that a peer may leave before its
/// connection is closed as a protocol violation.
pub(crate) const MAX_UNTAKEN_REGIONS: usize = 1024;
/// The largest refusal reason sent, in bytes.
const MAX_REASON: usize = 256;
/// Memory is pinned in pages: what a lease counts against the byte limit is rounded up.
const PAGE: u64 = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A region of the peer's memory that this side holds: lent for a limited time
/// ([`Connection::request_remote_mr`]) or given to it ([`Connection::send_local_mr`] on
/// the peer, [`Connection::receive_remote_mr`] here). Dropping it ends the lease: the peer
/// revokes access and frees the region.
#[derive(Debug)]
pub struct RemoteLease {
    mr: RemoteMr,
    id: u32,
    /// When the lease ends, as seen here: the lender's duration from when the grant
    /// arrived (so slightly after the lender's own deadline); `None` for a region given.
    ends: Option<Instant>,
    /// The connection it came on, told when the lease is dropped.
    conn: Weak<ConnShared>,
    /// Already returned or given back.
    ended: bool,
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Some(conn) = self.conn.upgrade()
            && conn.is_open()
        {
            conn.send_return(self.id);
        }
    }
}

impl RemoteLease {
    /// The region.
    pub fn mr(&self) -> &RemoteMr {
        &self.mr
    }

    /// Time left before the lender revokes it (an estimate on this side's clock; the
    /// lender's clock decides), or `None` for a region given without a time limit.
    pub fn remaining(&self) -> Option<Duration> {
        self.ends
            .map(|e| e.saturating_duration_since(Instant::now()))
    }
}

type Grant = std::result::Result<(u32, RemoteMr, Duration), String>;

/// What lent regions hold of a connection's budget.
#[derive(Debug, Default)]
struct Budget {
    bytes: u64,
    regions: usize,
}

/// A region's share of the budget (its bytes, and one region), given back when dropped.
pub(crate) struct Charge {
    bytes: u64,
    budget: Weak<Mutex<Budget>>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(b) = self.budget.upgrade() {
            let mut b = lock(&b);
            b.bytes -= self.bytes;
            b.regions -= 1;
        }
    }
}

/// A lease this side granted: the region, its share of the budget, and its expiry timer
/// (cancelled when the lease ends otherwise).
struct Lease {
    // Fields drop in order: the region ends (its registrations go) before its charge is
    // released.
    mr: LocalMr,
    charge: Charge,
    expiry: Option<tokio::task::AbortHandle>,
}

impl Lease {
    /// Ends the lease's timer (the lease ends otherwise) and gives back its parts.
    fn end(self) -> (LocalMr, Charge) {
        if let Some(t) = &self.expiry {
            t.abort();
        }
        (self.mr, self.charge)
    }
}

/// A region the peer gave back, until the application takes it.
pub(crate) struct Returned {
    pub(crate) mr: LocalMr,
    /// Dropped when the application takes it (a lease's region counts until then).
    _charge: Option<Charge>,
}

/// Agent messages waiting to be sent, in order.
#[derive(Default)]
struct Outbox {
    /// Each message, and whether it answers the peer.
    queue: VecDeque<(Vec<u8>, bool)>,
    /// Answers queued or being sent.
    replies: usize,
    /// A task is sending the queue.
    sending: bool,
}

/// A connection's agent state: leases granted to the peer and requests waiting for the
/// peer's answer.
pub(crate) struct Agent {
    next_id: AtomicU32,
    /// Leases this side granted, by id; `None` once the connection has ended (nothing is
    /// lent any more).
    lent: Mutex<Option<HashMap<u32, Lease>>>,
    /// What the leases, and the regions given back not yet taken, hold.
    budget: Arc<Mutex<Budget>>,
    /// The most regions lent at once (the configured limit, capped by the device's).
    count_limit: OnceLock<usize>,
    /// Requests this side sent, by id.
    waiting: Mutex<HashMap<u32, oneshot::Sender<Grant>>>,
    /// Bounds this side's requests waiting for an answer ([`MAX_OPEN_REQUESTS`]).
    open_requests: Semaphore,
    /// Regions this side gave away ([`Connection::send_local_mr`]), by id; `None` once the
    /// connection has ended.
    given: Mutex<Option<HashMap<u32, LocalMr>>>,
    /// Agent messages to send.
    outbox: Mutex<Outbox>,
    /// Regions the peer gave back with their contents.
    pub(crate) returned: crate::conn::Inbox<Option<Returned>>,
    /// Regions the peer gave to this side, until taken.
    pub(crate) received: crate::conn::Inbox<Option<(u32, RemoteMr)>>,
}

impl Default for Agent {
    fn default() -> Self {
        Agent {
            next_id: AtomicU32::new(0),
            lent: Mutex::new(Some(HashMap::new())),
            budget: Arc::default(),
            count_limit: OnceLock::new(),
            waiting: Mutex::default(),
            open_requests: Semaphore::new(MAX_OPEN_REQUESTS),
            given: Mutex::new(Some(HashMap::new())),
            outbox: Mutex::default(),
            returned: crate::conn::Inbox::default(),
            received: crate::conn::Inbox::default(),
        }
    }
}

impl Agent {
    /// The connection ends: every lease and every region given away on it ends (their
    /// registrations go, so their keys reach nothing through any other connection
    /// either), and requests waiting for an answer fail. Called before the connection
    /// counts as closed, so whoever learns that it is closed finds them ended.
    pub(crate) fn on_close(&self) {
        let lent = lock(&self.lent).take().unwrap_or_default();
        let given = lock(&self.given).take().unwrap_or_default();
        for (_, lease) in lent {
            let (mr, charge) = lease.end();
            mr.end_remote();
            drop((mr, charge));
        }
        for (_, mr) in given {
            // Its registration for the peer ends now, even if a cancelled operation of
            // this side still holds the memory.
            mr.end_remote();
        }
        lock(&self.waiting).clear();
        lock(&self.outbox).queue.clear();
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("lent", &lock(&self.lent).as_ref().map(HashMap::len))
            .field("budget", &*lock(&self.budget))
            .finish_non_exhaustive()
    }
}

/// An agent message: the body of a message of kind [`Kind::Agent`] (after the message
/// header). Every message starts with its operation (one byte) and an id (four bytes,
/// big-endian, as every field); what follows depends on the operation. Bytes after the
/// last field are ignored (room for later versions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentMsg {
    /// Asks the peer for a zeroed region of `size` bytes aligned to `align`, lent for
    /// `lease_ms` milliseconds (the peer may shorten it); `id` matches the answer.
    Request {
        /// The request's id.
        id: u32,
        /// Bytes asked for.
        size: u64,
        /// Their alignment.
        align: u64,
        /// The lease asked for.
        lease_ms: u64,
    },
    /// The answer to request `id`: lease `lease` of region `token` for `lease_ms`
    /// milliseconds on the lender's clock.
    Grant {
        /// The request answered.
        id: u32,
        /// The lease's id, which ends it ([`AgentMsg::Return`], [`AgentMsg::GiveBack`]).
        lease: u32,
        /// The region.
        token: RemoteMr,
        /// How long it is lent for.
        lease_ms: u64,
    },
    /// The refusal of request `id`, and why (at most [`MAX_REASON`] bytes of it travel).
    Deny {
        /// The request answered.
        id: u32,
        /// The lender's reason.
        reason: String,
    },
    /// The borrower ends lease (or given region) `lease`: the lender frees it.
    Return {
        /// The lease.
        lease: u32,
    },
    /// The borrower gives lease (or given region) `lease` back with its contents.
    GiveBack {
        /// The lease.
        lease: u32,
    },
    /// The sender gives region `token` away, as lease `id` without a time limit.
    Transfer {
        /// The id that ends it ([`AgentMsg::Return`], [`AgentMsg::GiveBack`]).
        id: u32,
        /// The region.
        token: RemoteMr,
    },
}

/// The operation byte of each [`AgentMsg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    Request = 1,
    Grant = 2,
    Deny = 3,
    Return = 4,
    GiveBack = 5,
    Transfer = 6,
}

impl Op {
    fn from_byte(b: u8) -> Option<Op> {
        [
            Op::Request,
            Op::Grant,
            Op::Deny,
            Op::Return,
            Op::GiveBack,
            Op::Transfer,
        ]
        .into_iter()
        .find(|op| *op as u8 == b)
    }
}

/// Reads big-endian fields front to back.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    fn token(&mut self) -> Option<RemoteMr> {
        RemoteMr::from_bytes(self.take(TOKEN_LEN)?)
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl AgentMsg {
    fn op(&self) -> Op {
        match self {
            AgentMsg::Request { .. } => Op::Request,
            AgentMsg::Grant { .. } => Op::Grant,
            AgentMsg::Deny { .. } => Op::Deny,
            AgentMsg::Return { .. } => Op::Return,
            AgentMsg::GiveBack { .. } => Op::GiveBack,
            AgentMsg::Transfer { .. } => Op::Transfer,
        }
    }

    /// The message's bytes. A refusal's reason is cut to [`MAX_REASON`] bytes (on a
    /// character boundary).
    pub(crate) fn emit(&self) -> Vec<u8> {
        let mut m = vec![self.op() as u8];
        match self {
            AgentMsg::Request {
                id,
                size,
                align,
                lease_ms,
            } => {
                m.extend_from_slice(&id.to_be_bytes());
                m.extend_from_slice(&size.to_be_bytes());
                m.extend_from_slice(&align.to_be_bytes());
                m.extend_from_slice(&lease_ms.to_be_bytes());
            }
            AgentMsg::Grant {
                id,
                lease,
                token,
                lease_ms,
            } => {
                m.extend_from_slice(&id.to_be_bytes());
                m.extend_from_slice(&lease.to_be_bytes());
                m.extend_from_slice(&token.to_bytes());
                m.extend_from_slice(&lease_ms.to_be_bytes());
            }
            AgentMsg::Deny { id, reason } => {
                m.extend_from_slice(&id.to_be_bytes());
                m.extend_from_slice(cut(reason, MAX_REASON).as_bytes());
            }
            AgentMsg::Return { lease } | AgentMsg::GiveBack { lease } => {
                m.extend_from_slice(&lease.to_be_bytes());
            }
            AgentMsg::Transfer { id, token } => {
                m.extend_from_slice(&id.to_be_bytes());
                m.extend_from_slice(&token.to_bytes());
            }
        }
        m
    }

    /// Parses a message from the peer. Total: anything that is not a message of this
    /// version is a [`MalformedAgent`], never a panic. A refusal's reason is read as
    /// UTF-8 (invalid sequences replaced), at most [`MAX_REASON`] bytes of it.
    pub(crate) fn parse(msg: &[u8]) -> std::result::Result<AgentMsg, MalformedAgent> {
        let mut f = Fields(msg);
        let (Some(op), Some(id)) = (f.take(1), f.u32()) else {
            return Err(MalformedAgent::Short);
        };
        let op = Op::from_byte(op[0]).ok_or(MalformedAgent::UnknownOp(op[0]))?;
        Ok(match op {
            Op::Request => {
                let (Some(size), Some(align), Some(lease_ms)) = (f.u64(), f.u64(), f.u64()) else {
                    return Err(MalformedAgent::Request);
                };
                AgentMsg::Request {
                    id,
                    size,
                    align,
                    lease_ms,
                }
            }
            Op::Grant => {
                let (Some(lease), Some(token), Some(lease_ms)) = (f.u32(), f.token(), f.u64())
                else {
                    return Err(MalformedAgent::Grant);
                };
                AgentMsg::Grant {
                    id,
                    lease,
                    token,
                    lease_ms,
                }
            }
            Op::Deny => {
                let why = &f.0[..f.0.len().min(MAX_REASON)];
                AgentMsg::Deny {
                    id,
                    reason: String::from_utf8_lossy(why).into_owned(),
                }
            }
            Op::Return => AgentMsg::Return { lease: id },
            Op::GiveBack => AgentMsg::GiveBack { lease: id },
            Op::Transfer => AgentMsg::Transfer {
                id,
                token: f.token().ok_or(MalformedAgent::Region)?,
            },
        })
    }
}

impl ConnShared {
    /// Handles an agent message from the peer (on the dispatcher; answers are queued and
    /// sent by a task).
    pub(crate) fn on_agent(self: &Arc<Self>, msg: &[u8]) {
        if !self.is_open() {
            // What arrives after the end (it was in flight) is not served: everything
            // lent on the connection ended with it.
            return;
        }
        let msg = match AgentMsg::parse(msg) {
            Ok(msg) => msg,
            Err(e) => return self.end(ProtocolViolation::Agent(e)),
        };
        match msg {
            AgentMsg::Request {
                id,
                size,
                align,
                lease_ms,
            } => {
                // Room for the answer first: a peer that does not take our answers gets
                // nothing more allocated.
                if !self.reserve_reply() {
                    return;
                }
                let reply = match self.lend(size, align, Duration::from_millis(lease_ms)) {
                    Ok((lease, token, lease_for)) => AgentMsg::Grant {
                        id,
                        lease,
                        token,
                        lease_ms: u64::try_from(lease_for.as_millis()).unwrap_or(u64::MAX),
                    },
                    Err(e) => AgentMsg::Deny {
                        id,
                        reason: e.to_string(),
                    },
                };
                self.queue_agent(reply, true);
            }
            AgentMsg::Grant {
                id,
                lease,
                token,
                lease_ms,
            } => self.on_answer(id, Ok((lease, token, Duration::from_millis(lease_ms)))),
            AgentMsg::Deny { id, reason } => self.on_answer(id, Err(reason)),
            AgentMsg::Transfer { id, token } => {
                let untaken = lock(&self.agent.received.queue).len();
                if untaken >= MAX_UNTAKEN_REGIONS {
                    return self.end(ProtocolViolation::UntakenRegions {
                        max: MAX_UNTAKEN_REGIONS,
                    });
                }
                self.agent.received.push(Some((id, token)))
            }
            AgentMsg::Return { lease } => self.on_lease_end(lease, false),
            AgentMsg::GiveBack { lease } => self.on_lease_end(lease, true),
        }
    }

    /// The peer ends lease (or given region) `id`: returned (freed), or given back with
    /// its contents (registered anew for local access, for the application to take).
    fn on_lease_end(&self, id: u32, give_back: bool) {
        let lent = lock(&self.agent.lent).as_mut().and_then(|l| l.remove(&id));
        let (mr, charge) = match lent {
            Some(lease) => {
                let (mr, charge) = lease.end();
                (mr, Some(charge))
            }
            None => match lock(&self.agent.given).as_mut().and_then(|g| g.remove(&id)) {
                Some(mr) => (mr, None),
                None => return, // expired meanwhile
            },
        };
        if give_back {
            match self.reregister_local(mr) {
                Ok(mr) => self.agent.returned.push(Some(Returned {
                    mr,
                    _charge: charge,
                })),
                Err(e) => tracing::warn!(error = %e, "cannot take back a region"),
            }
        } else {
            // The peer's registration ends now (even if a cancelled operation of
            // this side still holds a given region), before the budget is free.
            mr.end_remote();
            drop(mr);
            drop(charge);
        }
        tracing::debug!(lease = id, "lease returned");
    }

    /// The peer's answer to request `id`: to its waiter, or — a grant nobody waits for
    /// any more (the requester gave up) — straight back to the peer.
    fn on_answer(self: &Arc<Self>, id: u32, answer: Grant) {
        let waiter = lock(&self.agent.waiting).remove(&id);
        let unwanted = match (waiter, answer) {
            (Some(tx), answer) => match tx.send(answer) {
                // The requester gave up: the lease goes straight back.
                Err(Ok((lease, _, _))) => Some(lease),
                _ => None,
            },
            (None, Ok((lease, _, _))) => Some(lease),
            (None, Err(_)) => None,
        };
        if let Some(lease) = unwanted
            && self.reserve_reply()
        {
            self.queue_agent(AgentMsg::Return { lease }, true);
        }
    }

    /// The most regions lent to this connection's peer at once: the configured limit,
    /// and at most a sixteenth of the device's registrations (two per lease).
    fn count_limit(&self) -> usize {
        *self.agent.count_limit.get_or_init(|| {
            let configured = self.rdma.config().lend_count_limit;
            match self.rdma.context().query_device() {
                Ok(attr) => configured.min(attr.max_mr as usize / 16),
                Err(_) => configured,
            }
        })
    }

    /// Takes this lease's share of the budget, or says which limit it would exceed.
    fn charge(&self, size: usize) -> Result<Charge> {
        let cfg = self.rdma.config();
        let bytes = (size as u64).max(1).div_ceil(PAGE).saturating_mul(PAGE);
        let regions = self.count_limit();
        let mut b = lock(&self.agent.budget);
        if b.regions >= regions {
            return Err(Error::InvalidArgument(format!(
                "lending one more region would exceed this side's limit of {regions} regions"
            )));
        }
        if b.bytes.saturating_add(bytes) > cfg.lend_limit as u64 {
            return Err(Error::InvalidArgument(format!(
                "lending {size} more bytes would exceed this side's limit of {}",
                cfg.lend_limit
            )));
        }
        b.bytes += bytes;
        b.regions += 1;
        Ok(Charge {
            bytes,
            budget: Arc::downgrade(&self.agent.budget),
        })
    }

    /// Allocates and registers a region for the peer, records the lease and arms its
    /// expiry. The memory is registered for local access only; the peer reaches it through
    /// a registration of exactly its range, which ends when the lease does.
    fn lend(
        self: &Arc<Self>,
        size: u64,
        align: u64,
        ask: Duration,
    ) -> Result<(u32, RemoteMr, Duration)> {
        let cfg = self.rdma.config();
        let lease_for = ask.min(cfg.max_lease);
        let size = usize::try_from(size).map_err(|_| Error::InvalidArgument("size".into()))?;
        let align = usize::try_from(align).map_err(|_| Error::InvalidArgument("align".into()))?;
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let charge = self.charge(size)?;
        let local = self
            .rdma
            .alloc_local_mr_with(layout, remem_verbs::AccessFlags::LOCAL_WRITE)?;
        let mr = LocalMr::lending(
            local.inner.mr.clone(),
            cfg.access - remem_verbs::AccessFlags::FLUSH_PERSISTENT,
        );
        drop(local);
        let token = mr.give_token(self.rdma.pd())?;
        let id = self.agent.next_id.fetch_add(1, Ordering::Relaxed);
        let lease = Lease {
            mr,
            charge,
            expiry: None,
        };
        match &mut *lock(&self.agent.lent) {
            Some(lent) => lent.insert(id, lease),
            // The connection ended meanwhile: this lease ends too (after the lock).
            None => return Err(self.closed_error()),
        };
        let weak = Arc::downgrade(self);
        let expiry = self.spawn(async move {
            tokio::time::sleep(lease_for).await;
            if let Some(s) = weak.upgrade() {
                let lease = lock(&s.agent.lent).as_mut().and_then(|l| l.remove(&id));
                if let Some(lease) = lease {
                    lease.mr.end_remote();
                    tracing::info!(
                        lease = id,
                        bytes = lease.mr.len(),
                        "lease expired: access revoked"
                    );
                }
            }
        });
        if let Some(expiry) = expiry {
            match lock(&self.agent.lent).as_mut().and_then(|l| l.get_mut(&id)) {
                Some(lease) => lease.expiry = Some(expiry),
                None => expiry.abort(), // over already
            }
        }
        Ok((id, token, lease_for))
    }

    /// A region given back: the registration the peer used goes, and the same memory is
    /// registered for local access only.
    fn reregister_local(&self, mr: LocalMr) -> Result<LocalMr> {
        mr.revoke_remote(self.rdma.pd())
    }

    /// Makes room for one more answer to the peer; false (and the connection closed) if
    /// the peer already has [`MAX_QUEUED_REPLIES`] waiting.
    fn reserve_reply(self: &Arc<Self>) -> bool {
        let full = lock(&self.agent.outbox).replies >= MAX_QUEUED_REPLIES;
        if full {
            self.end(ProtocolViolation::UnreadAnswers {
                max: MAX_QUEUED_REPLIES,
            });
        }
        !full
    }

    /// Queues an agent message (an answer to the peer if `reply`, whose room
    /// [`ConnShared::reserve_reply`] made) and makes sure a task sends the queue.
    fn queue_agent(self: &Arc<Self>, msg: AgentMsg, reply: bool) {
        let mut out = lock(&self.agent.outbox);
        if !self.is_open() {
            return;
        }
        out.replies += usize::from(reply);
        out.queue.push_back((msg.emit(), reply));
        if out.sending {
            return;
        }
        out.sending = true;
        drop(out);
        let shared = self.clone();
        if self.spawn(shared.send_agent_queue()).is_none() {
            let mut out = lock(&self.agent.outbox);
            *out = Outbox::default();
        }
    }

    /// Sends the queued agent messages, in order, until the queue is empty.
    async fn send_agent_queue(self: Arc<Self>) {
        loop {
            let next = {
                let mut out = lock(&self.agent.outbox);
                match out.queue.pop_front() {
                    Some(m) => m,
                    None => {
                        out.sending = false;
                        return;
                    }
                }
            };
            let (msg, reply) = next;
            let sent = self.send_bytes(Kind::Agent, msg).await;
            let mut out = lock(&self.agent.outbox);
            out.replies = out.replies.saturating_sub(usize::from(reply));
            if sent.is_err() {
                // The connection is over: nothing more goes out.
                *out = Outbox::default();
                return;
            }
        }
    }

    /// Queues the end of lease `lease` (a return: the peer frees it).
    pub(crate) fn send_return(self: &Arc<Self>, lease: u32) {
        self.queue_agent(AgentMsg::Return { lease }, false);
    }

    fn spawn(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::AbortHandle> {
        match self.runtime() {
            Some(rt) => Some(rt.spawn(task).abort_handle()),
            None => {
                tracing::warn!("the agent needs a tokio runtime; a request is dropped");
                None
            }
        }
    }
}

impl Connection {
    /// Asks the peer for a zeroed region of `layout`, lent for `lease` (the peer may
    /// shorten it to its `max_lease`). The peer's agent answers by itself; no code runs on
    /// the peer for it. Fails with [`Error::Timeout`] after
    /// [`crate::RdmaBuilder::request_timeout`], or with [`Error::Refused`] and the peer's
    /// reason if it refuses (beyond its [`crate::RdmaBuilder::lend_limit`] or
    /// [`crate::RdmaBuilder::lend_count_limit`], or when its device refuses the
    /// registration).
    ///
    /// At most 64 requests of a connection wait for an answer at once; further ones wait
    /// for their turn (within the timeout). A peer leaves at most 256 answers unsent
    /// (while this side does not take its messages) before it closes the connection as a
    /// protocol violation.
    pub async fn request_remote_mr(&self, layout: Layout, lease: Duration) -> Result<RemoteLease> {
        let sh = self.shared();
        let timeout = sh.rdma.config().request_timeout;
        let answer = async {
            // At most MAX_OPEN_REQUESTS wait for an answer at once: the peer closes a
            // connection that leaves it more answers to send than it allows.
            let _turn = sh
                .agent
                .open_requests
                .acquire()
                .await
                .map_err(|_| sh.closed_error())?;
            let id = sh.agent.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            lock(&sh.agent.waiting).insert(id, tx);
            // A grant arriving after this side gave up finds no waiter and is returned.
            let _forget = Forget(sh, id);
            let request = AgentMsg::Request {
                id,
                size: layout.size() as u64,
                align: layout.align() as u64,
                lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            };
            sh.send_bytes(Kind::Agent, request.emit()).await?;
            rx.await.map_err(|_| sh.closed_error())
        };
        let answer = match tokio::time::timeout(timeout, answer).await {
            Ok(a) => a,
            Err(_) => return Err(Error::Timeout("memory request")),
        }?;
        let (lease_id, mr, lease_for) = answer.map_err(Error::Refused)?;
        Ok(RemoteLease {
            mr,
            id: lease_id,
            ends: Some(Instant::now() + lease_for),
            conn: Arc::downgrade(sh),
            ended: false,
        })
    }

    /// Gives `mr` to the peer: ownership passes. The peer takes it with
    /// [`Connection::receive_remote_mr`] and reaches the whole region with the rights `mr`
    /// grants when lent ([`LocalMr::access`]), through a registration made for it of
    /// exactly the region's range; this side keeps the memory alive, and nothing else,
    /// until the peer returns it (then it is freed), gives it back
    /// ([`Connection::send_remote_mr`]; this side takes it again with
    /// [`Connection::receive_local_mr`]), drops it, or the connection ends — then that
    /// registration ends at once, even while an operation of this side (a cancelled one
    /// still in flight) holds the memory. To let the peer reach a region this side keeps
    /// using, use [`Connection::share_local_mr`].
    ///
    /// The peer holds at most 1024 regions given to it and not yet taken; one more closes
    /// the connection as a protocol violation.
    pub async fn send_local_mr(&self, mr: LocalMr) -> Result<()> {
        let sh = self.shared();
        let token = mr.give_token(sh.rdma.pd())?;
        let id = sh.agent.next_id.fetch_add(1, Ordering::Relaxed);
        match &mut *lock(&sh.agent.given) {
            Some(given) => given.insert(id, mr),
            None => return Err(sh.closed_error()),
        };
        let sent = sh
            .send_bytes(Kind::Agent, AgentMsg::Transfer { id, token }.emit())
            .await;
        if sent.is_err() {
            let mr = lock(&sh.agent.given).as_mut().and_then(|g| g.remove(&id));
            drop(mr);
        }
        sent
    }

    /// The next region the peer gave with [`Connection::send_local_mr`]: this side holds
    /// it until it returns it ([`Connection::return_remote_mr`] or by dropping it) or gives
    /// it back ([`Connection::send_remote_mr`]).
    pub async fn receive_remote_mr(&self) -> Result<RemoteLease> {
        let sh = self.shared();
        let (id, mr) = sh.take(&sh.agent.received, |m| m.take()).await?;
        Ok(RemoteLease {
            mr,
            id,
            ends: None,
            conn: Arc::downgrade(sh),
            ended: false,
        })
    }

    /// Ends a lease early: the lender revokes access and frees the region.
    pub async fn return_remote_mr(&self, lease: RemoteLease) -> Result<()> {
        self.give(lease, |lease| AgentMsg::Return { lease }).await
    }

    /// Gives a leased region back to the lender with its contents: the lease ends and the
    /// lender takes the region with [`Connection::receive_local_mr`].
    pub async fn send_remote_mr(&self, lease: RemoteLease) -> Result<()> {
        self.give(lease, |lease| AgentMsg::GiveBack { lease }).await
    }

    async fn give(&self, mut lease: RemoteLease, msg: fn(u32) -> AgentMsg) -> Result<()> {
        lease.ended = true;
        self.shared()
            .send_bytes(Kind::Agent, msg(lease.id).emit())
            .await
    }

    /// The next region the peer gave back with [`Connection::send_remote_mr`], registered
    /// for local access only: the peer's token for it reaches nothing any more (its
    /// registration ended before the region was queued here). A leased region counts
    /// against this side's [`crate::RdmaBuilder::lend_limit`] until it is taken here.
    pub async fn receive_local_mr(&self) -> Result<LocalMr> {
        let sh = self.shared();
        // Taken: the region no longer counts against what this side lends.
        let back = sh.take(&sh.agent.returned, |m| m.take()).await?;
        Ok(back.mr)
    }
}

/// Forgets a request's waiter when the request ends, however it ends.
struct Forget<'a>(&'a Arc<ConnShared>, u32);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.0.agent.waiting).remove(&self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CloseReason;
    use crate::mr::Local;
    use crate::test_util::{connect, layout};
    use crate::{ConnectionEvent, Rdma, RdmaBuilder};
    use crate::{LocalMr, RemoteMr};
    use proptest::prelude::*;
    use remem_verbs::{AccessFlags, WcStatus};

    fn arb_token() -> impl Strategy<Value = RemoteMr> {
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_filter_map(
            "a valid token",
            |(addr, len, rkey, bits)| {
                let mut b = [0; TOKEN_LEN];
                b[..8].copy_from_slice(&addr.to_be_bytes());
                b[8..16].copy_from_slice(&(len % (u64::MAX - addr).max(1)).to_be_bytes());
                b[16..20].copy_from_slice(&rkey.to_be_bytes());
                let rights = bits & AccessFlags::REMOTE.bits();
                b[20..].copy_from_slice(&rights.to_be_bytes());
                RemoteMr::from_bytes(&b)
            },
        )
    }

    fn arb_msg() -> impl Strategy<Value = AgentMsg> {
        prop_oneof![
            (any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                |(id, size, align, lease_ms)| AgentMsg::Request {
                    id,
                    size,
                    align,
                    lease_ms
                }
            ),
            (any::<u32>(), any::<u32>(), arb_token(), any::<u64>()).prop_map(
                |(id, lease, token, lease_ms)| AgentMsg::Grant {
                    id,
                    lease,
                    token,
                    lease_ms
                }
            ),
            // Reasons that travel whole: at most MAX_REASON bytes.
            (any::<u32>(), "\\PC{0,64}").prop_map(|(id, reason)| AgentMsg::Deny { id, reason }),
            any::<u32>().prop_map(|lease| AgentMsg::Return { lease }),
            any::<u32>().prop_map(|lease| AgentMsg::GiveBack { lease }),
            (any::<u32>(), arb_token()).prop_map(|(id, token)| AgentMsg::Transfer { id, token }),
        ]
    }

    proptest! {
        /// Every message parses back to itself, also with bytes after its last field.
        #[test]
        fn agent_messages_round_trip(
            msg in arb_msg(),
            tail in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let bytes = msg.emit();
            prop_assert_eq!(AgentMsg::parse(&bytes), Ok(msg.clone()));
            if !matches!(msg, AgentMsg::Deny { .. }) {
                let longer = [&bytes[..], &tail[..]].concat();
                prop_assert_eq!(AgentMsg::parse(&longer), Ok(msg.clone()));
            }
            // Cut short anywhere before its last field: an error, never a panic.
            for n in 0..bytes.len() {
                let short = AgentMsg::parse(&bytes[..n]);
                if n < 5 {
                    prop_assert_eq!(short, Err(MalformedAgent::Short));
                } else if matches!(
                    msg,
                    AgentMsg::Request { .. } | AgentMsg::Grant { .. } | AgentMsg::Transfer { .. }
                ) {
                    prop_assert!(short.is_err(), "{:?} cut to {} bytes", msg, n);
                }
            }
        }

        /// Parsing is total: arbitrary bytes give a message or an error, and a message
        /// emits bytes that parse to it again.
        #[test]
        fn agent_messages_parse_arbitrary_bytes_without_panicking(
            op in 0u8..9,
            bytes in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            for input in [&bytes[..], &[&[op][..], &bytes[..]].concat()[..]] {
                if let Ok(msg) = AgentMsg::parse(input) {
                    prop_assert_eq!(AgentMsg::parse(&msg.emit()), Ok(msg));
                }
            }
        }
    }

    #[test]
    fn agent_messages_keep_their_wire_layout() {
        // The layout the protocol had before it was typed, byte for byte.
        let token = RemoteMr {
            addr: 0x1122_3344_5566_7788,
            len: 0x1000,
            rkey: 0xaabb_ccdd,
            access: AccessFlags::REMOTE_READ,
        };
        let be32 = |v: u32| v.to_be_bytes().to_vec();
        let be64 = |v: u64| v.to_be_bytes().to_vec();
        let cases = [
            (
                AgentMsg::Request {
                    id: 9,
                    size: 4096,
                    align: 8,
                    lease_ms: 60_000,
                },
                [vec![1], be32(9), be64(4096), be64(8), be64(60_000)].concat(),
            ),
            (
                AgentMsg::Grant {
                    id: 9,
                    lease: 3,
                    token,
                    lease_ms: 500,
                },
                [
                    vec![2],
                    be32(9),
                    be32(3),
                    token.to_bytes().to_vec(),
                    be64(500),
                ]
                .concat(),
            ),
            (
                AgentMsg::Deny {
                    id: 9,
                    reason: "no".into(),
                },
                [vec![3], be32(9), b"no".to_vec()].concat(),
            ),
            (AgentMsg::Return { lease: 3 }, [vec![4], be32(3)].concat()),
            (AgentMsg::GiveBack { lease: 3 }, [vec![5], be32(3)].concat()),
            (
                AgentMsg::Transfer { id: 4, token },
                [vec![6], be32(4), token.to_bytes().to_vec()].concat(),
            ),
        ];
        for (msg, bytes) in cases {
            assert_eq!(msg.emit(), bytes, "{msg:?}");
            assert_eq!(AgentMsg::parse(&bytes), Ok(msg));
        }
        // What is wrong, typed (the text the connection closes with).
        assert_eq!(AgentMsg::parse(&[1, 0, 0]), Err(MalformedAgent::Short));
        assert_eq!(
            AgentMsg::parse(&[7, 0, 0, 0, 1]),
            Err(MalformedAgent::UnknownOp(7))
        );
        assert_eq!(
            AgentMsg::parse(&[1, 0, 0, 0, 1, 0]),
            Err(MalformedAgent::Request)
        );
        assert_eq!(
            AgentMsg::parse(&[2, 0, 0, 0, 1]),
            Err(MalformedAgent::Grant)
        );
        assert_eq!(
            AgentMsg::parse(&[6, 0, 0, 0, 1]),
            Err(MalformedAgent::Region)
        );
        assert_eq!(
            MalformedAgent::UnknownOp(7).to_string(),
            "peer sent an unknown agent operation 7"
        );
    }

    #[test]
    fn a_long_reason_is_cut_on_a_character_boundary() {
        let reason = "é".repeat(MAX_REASON); // two bytes each
        let bytes = AgentMsg::Deny { id: 1, reason }.emit();
        assert_eq!(bytes.len(), 5 + MAX_REASON);
        match AgentMsg::parse(&bytes) {
            Ok(AgentMsg::Deny { id: 1, reason }) => {
                assert_eq!(reason, "é".repeat(MAX_REASON / 2))
            }
            other => panic!("{other:?}"),
        }
        // A peer's reason longer than the limit is cut on arrival too.
        let long = [&[3, 0, 0, 0, 1][..], &[b'x'; 1000][..]].concat();
        match AgentMsg::parse(&long) {
            Ok(AgentMsg::Deny { reason, .. }) => assert_eq!(reason.len(), MAX_REASON),
            other => panic!("{other:?}"),
        }
    }

    /// Two `Rdma`s that can talk on soft devices, the first (the peer that misbehaves in
    /// some tests) built from `a`.
    fn pair(a: impl FnOnce(RdmaBuilder) -> RdmaBuilder) -> (Rdma, Rdma) {
        crate::test_util::soft_pair_with(a, |b| b)
    }

    /// How the connection ended (bounded wait).
    async fn ended(conn: &Connection) -> ConnectionEvent {
        let deadline = Duration::from_secs(10);
        loop {
            match tokio::time::timeout(deadline, conn.next_event()).await {
                Ok(ConnectionEvent::Established) => continue,
                Ok(ev) => return ev,
                Err(_) => panic!("the connection is still open"),
            }
        }
    }

    /// Writes from `conn` through `token` until one fails (the end of access travels as a
    /// message), for at most 5 s; it must fail with a remote access error.
    async fn write_until_revoked(conn: &Connection, src: &LocalMr, token: &RemoteMr) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let revoked = loop {
            match conn.write(src, token).await {
                Ok(()) if Instant::now() < deadline => tokio::task::yield_now().await,
                other => break other,
            }
        };
        match revoked {
            Err(Error::Completion { status, .. }) => assert_eq!(status, WcStatus::RemAccessErr),
            other => panic!("a write through the old key: {other:?}"),
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum End {
        /// The borrower gives the region back (`send_remote_mr`).
        GiveBack,
        /// The borrower drops its lease (a return).
        Drop,
        /// The connection it was given on ends.
        Close,
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_region_given_away_is_unreachable_once_it_ends_while_an_operation_of_ours_holds_it() {
        let (a, b) = pair(|a| a);
        let rights =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let src = a.alloc_local_mr(layout(4096)).unwrap();
        src.write(0, &[9; 4096]).unwrap();
        for end in [End::GiveBack, End::Drop, End::Close] {
            for own_registration in [true, false] {
                // A fresh connection each round: an access error ends the last one.
                let (ca, cb) = connect(&a, &b).await;
                let given = if own_registration {
                    b.alloc_local_mr_with(layout(4096), rights).unwrap()
                } else {
                    b.alloc_local_mr(layout(4096)).unwrap()
                };
                // What an operation of B's still in flight (a cancelled one) holds.
                let in_flight = given.span();
                cb.send_local_mr(given).await.unwrap();
                let lease = ca.receive_remote_mr().await.unwrap();
                let token = *lease.mr();
                ca.write(&src, &token).await.unwrap();
                match end {
                    End::GiveBack => {
                        ca.send_remote_mr(lease).await.unwrap();
                        let back = cb.receive_local_mr().await.unwrap();
                        back.write(0, &[4; 4096]).unwrap();
                        write_until_revoked(&ca, &src, &token).await;
                        assert_eq!(back.to_vec(), vec![4; 4096]);
                    }
                    End::Drop => {
                        drop(lease);
                        write_until_revoked(&ca, &src, &token).await;
                    }
                    End::Close => {
                        // A keeps its lease (no return); the connection ends, and A reaches
                        // B through another one.
                        ca.close().await;
                        let (ca2, _cb2) = connect(&a, &b).await;
                        write_until_revoked(&ca2, &src, &token).await;
                        drop(lease);
                    }
                }
                drop(in_flight);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_requests_but_takes_no_answers_is_cut_off() {
        // A takes at most two messages of B's before it returns credits, and takes none.
        let (a, b) = pair(|a| a.recv_depth(2));
        let (ca, cb) = connect(&a, &b).await;
        let m = b.alloc_local_mr(layout(8)).unwrap();
        cb.send(&m).await.unwrap();
        cb.send(&m).await.unwrap();
        // B can send A nothing more; A sends requests (zero bytes, the cheapest) as fast as
        // its credits allow. B may leave MAX_QUEUED_REPLIES answers waiting, then cuts A off.
        let mut sent = 0;
        for id in 0..(MAX_QUEUED_REPLIES as u32 + 64) {
            let r = AgentMsg::Request {
                id,
                size: 0,
                align: 1,
                lease_ms: 60_000,
            };
            let send = ca.shared().send_bytes(Kind::Agent, r.emit());
            match tokio::time::timeout(Duration::from_secs(10), send).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break, // B closed the connection
                Err(_) => panic!("B took no more requests after {sent}"),
            }
            sent += 1;
        }
        assert!(sent > MAX_QUEUED_REPLIES, "B closed after {sent} requests");
        match ended(&cb).await {
            ConnectionEvent::Lost(CloseReason::Protocol(ProtocolViolation::UnreadAnswers {
                ..
            })) => {}
            other => panic!("{other:?}"),
        }
        // What B held for A ended with the connection.
        assert!(lock(&cb.shared().agent.lent).is_none());
        assert_eq!(lock(&cb.shared().agent.budget).regions, 0);
        // Others are served.
        let (ca, _cb) = connect(&a, &b).await;
        ca.request_remote_mr(layout(64), Duration::from_secs(1))
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peers_token_that_wraps_past_2_64_ends_the_connection() {
        let (a, b) = pair(|a| a);
        let wraps = RemoteMr {
            addr: u64::MAX - 100,
            len: 4096,
            rkey: 1,
            access: AccessFlags::REMOTE_READ,
        }
        .to_bytes();
        // Shared (share_local_mr's message) and given (send_local_mr's).
        let given = AgentMsg::Transfer {
            id: 7,
            token: RemoteMr::from_bytes(&[0; TOKEN_LEN]).unwrap(),
        }
        .emit();
        // The same message with the region that wraps (no `RemoteMr` holds one).
        let given = [&given[..5], &wraps[..]].concat();
        for (kind, msg) in [(Kind::MrToken, wraps.to_vec()), (Kind::Agent, given)] {
            let (ca, cb) = connect(&a, &b).await;
            ca.shared().send_bytes(kind, msg).await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(10), async {
                match kind {
                    Kind::MrToken => cb.receive_shared_mr().await.map(drop),
                    _ => cb.receive_remote_mr().await.map(drop),
                }
            })
            .await
            .expect("the connection is still open");
            match got {
                Err(Error::Closed(CloseReason::Protocol(
                    ProtocolViolation::BadRegionToken
                    | ProtocolViolation::Agent(MalformedAgent::Region),
                ))) => {}
                other => panic!("{other:?}"),
            }
        }
    }
}
