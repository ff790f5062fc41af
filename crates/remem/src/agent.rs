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

use crate::conn::{ConnShared, Connection, Kind};
use crate::error::{Error, Result};
use crate::mr::{LocalMr, RemoteMr, TOKEN_LEN};

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const REQUEST: u8 = 1;
const GRANT: u8 = 2;
const DENY: u8 = 3;
const RETURN: u8 = 4;
const GIVE_BACK: u8 = 5;
const TRANSFER: u8 = 6;

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
            conn.send_return(self.id, RETURN);
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

/// A connection's agent state: leases granted to the peer and requests waiting for the
/// peer's answer.
#[derive(Default)]
pub(crate) struct Agent {
    next_id: AtomicU32,
    /// Leases this side granted, by id.
    lent: Mutex<HashMap<u32, LocalMr>>,
    lent_bytes: AtomicU64,
    /// Requests this side sent, by id.
    waiting: Mutex<HashMap<u32, oneshot::Sender<Grant>>>,
    /// Regions this side gave away ([`Connection::send_local_mr`]), by id.
    given: Mutex<HashMap<u32, LocalMr>>,
    /// Regions the peer gave back with their contents.
    pub(crate) returned: crate::conn::Inbox<Option<LocalMr>>,
    /// Regions the peer gave to this side, until taken.
    pub(crate) received: crate::conn::Inbox<Option<(u32, RemoteMr)>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("lent", &lock(&self.lent).len())
            .finish_non_exhaustive()
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl ConnShared {
    /// Handles an agent message from the peer (on the dispatcher; replies go on tasks).
    pub(crate) fn on_agent(self: &Arc<Self>, msg: &[u8]) {
        let (Some(&op), Some(id)) = (msg.first(), u32_at(msg, 1)) else {
            return self.fail("peer sent a malformed agent message".into());
        };
        match op {
            REQUEST => {
                let (Some(size), Some(align), Some(ms)) =
                    (u64_at(msg, 5), u64_at(msg, 13), u64_at(msg, 21))
                else {
                    return self.fail("peer sent a malformed memory request".into());
                };
                let answer = self.lend(size, align, Duration::from_millis(ms));
                let shared = self.clone();
                self.spawn(async move {
                    let reply = match answer {
                        Ok((lease, token, lease_for)) => {
                            let mut r = vec![GRANT];
                            r.extend_from_slice(&id.to_be_bytes());
                            r.extend_from_slice(&lease.to_be_bytes());
                            r.extend_from_slice(&token.to_bytes());
                            r.extend_from_slice(&(lease_for.as_millis() as u64).to_be_bytes());
                            r
                        }
                        Err(e) => {
                            let mut r = vec![DENY];
                            r.extend_from_slice(&id.to_be_bytes());
                            r.extend_from_slice(e.to_string().as_bytes());
                            r
                        }
                    };
                    let _ = shared.send_bytes(Kind::Agent, reply).await;
                });
            }
            GRANT | DENY => {
                let answer = if op == GRANT {
                    match (
                        u32_at(msg, 5),
                        msg.get(9..9 + TOKEN_LEN).and_then(RemoteMr::from_bytes),
                        u64_at(msg, 9 + TOKEN_LEN),
                    ) {
                        (Some(lease), Some(token), Some(ms)) => {
                            Ok((lease, token, Duration::from_millis(ms)))
                        }
                        _ => return self.fail("peer sent a malformed grant".into()),
                    }
                } else {
                    Err(String::from_utf8_lossy(&msg[5..]).into_owned())
                };
                let waiter = lock(&self.agent.waiting).remove(&id);
                match (waiter, answer) {
                    (Some(tx), answer) => {
                        if let Err(Ok((lease, _, _))) = tx.send(answer) {
                            // The requester gave up: the lease goes straight back.
                            self.send_return(lease, RETURN);
                        }
                    }
                    (None, Ok((lease, _, _))) => self.send_return(lease, RETURN),
                    (None, Err(_)) => {}
                }
            }
            TRANSFER => match msg.get(5..5 + TOKEN_LEN).and_then(RemoteMr::from_bytes) {
                Some(token) => self.agent.received.push(Some((id, token))),
                None => self.fail("peer sent a malformed memory region".into()),
            },
            RETURN | GIVE_BACK => {
                let lent = lock(&self.agent.lent).remove(&id);
                let mr = match lent {
                    Some(mr) => {
                        self.agent
                            .lent_bytes
                            .fetch_sub(mr.len() as u64, Ordering::AcqRel);
                        mr
                    }
                    None => match lock(&self.agent.given).remove(&id) {
                        Some(mr) => mr,
                        None => return, // expired meanwhile
                    },
                };
                if op == GIVE_BACK {
                    match self.reregister_local(mr) {
                        Ok(mr) => self.agent.returned.push(Some(mr)),
                        Err(e) => tracing::warn!(error = %e, "cannot take back a region"),
                    }
                }
                tracing::debug!(lease = id, "lease returned");
            }
            _ => self.fail(format!("peer sent an unknown agent operation {op}")),
        }
    }

    /// Allocates and registers a region for the peer, records the lease and arms its
    /// expiry.
    fn lend(
        self: &Arc<Self>,
        size: u64,
        align: u64,
        ask: Duration,
    ) -> Result<(u32, RemoteMr, Duration)> {
        let cfg = self.rdma.config();
        let lease_for = ask.min(cfg.max_lease);
        let size = usize::try_from(size).map_err(|_| Error::InvalidArgument("size".into()))?;
        let total = self.agent.lent_bytes.load(Ordering::Acquire) + size as u64;
        if total > cfg.lend_limit as u64 {
            return Err(Error::InvalidArgument(format!(
                "lending {size} more bytes would exceed this side's limit of {}",
                cfg.lend_limit
            )));
        }
        let layout = Layout::from_size_align(size, align as usize)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let mr = self.rdma.alloc_local_mr_with(
            layout,
            cfg.access - remem_verbs::AccessFlags::FLUSH_PERSISTENT,
        )?;
        let token = mr.token(self.rdma.pd())?;
        let id = self.agent.next_id.fetch_add(1, Ordering::Relaxed);
        self.agent
            .lent_bytes
            .fetch_add(size as u64, Ordering::AcqRel);
        lock(&self.agent.lent).insert(id, mr);
        let weak = Arc::downgrade(self);
        self.spawn(async move {
            tokio::time::sleep(lease_for).await;
            if let Some(s) = weak.upgrade()
                && let Some(mr) = lock(&s.agent.lent).remove(&id)
            {
                s.agent
                    .lent_bytes
                    .fetch_sub(mr.len() as u64, Ordering::AcqRel);
                tracing::info!(
                    lease = id,
                    bytes = mr.len(),
                    "lease expired: access revoked"
                );
            }
        });
        Ok((id, token, lease_for))
    }

    /// A region given back: the registration the peer used goes, and the same memory is
    /// registered for local access only.
    fn reregister_local(&self, mr: LocalMr) -> Result<LocalMr> {
        mr.revoke_remote(self.rdma.pd())
    }

    pub(crate) fn send_return(self: &Arc<Self>, lease: u32, op: u8) {
        let shared = self.clone();
        self.spawn(async move {
            let mut m = vec![op];
            m.extend_from_slice(&lease.to_be_bytes());
            let _ = shared.send_bytes(Kind::Agent, m).await;
        });
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        match self.runtime() {
            Some(rt) => {
                rt.spawn(task);
            }
            None => tracing::warn!("the agent needs a tokio runtime; a request is dropped"),
        }
    }
}

impl Connection {
    /// Asks the peer for a zeroed region of `layout`, lent for `lease` (the peer may
    /// shorten it to its `max_lease`). The peer's agent answers by itself; no code runs on
    /// the peer for it. Fails with [`Error::Timeout`] after
    /// [`crate::RdmaBuilder::request_timeout`], or with the peer's reason if it refuses.
    pub async fn request_remote_mr(&self, layout: Layout, lease: Duration) -> Result<RemoteLease> {
        let sh = self.shared();
        let id = sh.agent.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&sh.agent.waiting).insert(id, tx);
        let mut m = vec![REQUEST];
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&(layout.size() as u64).to_be_bytes());
        m.extend_from_slice(&(layout.align() as u64).to_be_bytes());
        m.extend_from_slice(&(lease.as_millis().min(u64::MAX as u128) as u64).to_be_bytes());
        let timeout = sh.rdma.config().request_timeout;
        let answer = async {
            sh.send_bytes(Kind::Agent, m).await?;
            rx.await.map_err(|_| sh.closed_error())
        };
        let answer = match tokio::time::timeout(timeout, answer).await {
            Ok(a) => a,
            Err(_) => {
                // A grant arriving later finds no waiter and is returned at once.
                lock(&sh.agent.waiting).remove(&id);
                return Err(Error::Timeout("memory request"));
            }
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
    /// was registered with (a registration of its own, for a pool region); this side
    /// keeps the memory alive, and nothing else, until the peer returns it (then it is
    /// freed), gives it back ([`Connection::send_remote_mr`]; this side takes it again with
    /// [`Connection::receive_local_mr`]), drops it, or the connection ends. To let the
    /// peer reach a region this side keeps using, use [`Connection::share_local_mr`].
    pub async fn send_local_mr(&self, mr: LocalMr) -> Result<()> {
        let sh = self.shared();
        let token = mr.token(sh.rdma.pd())?;
        let id = sh.agent.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&sh.agent.given).insert(id, mr);
        let mut m = vec![TRANSFER];
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&token.to_bytes());
        let sent = sh.send_bytes(Kind::Agent, m).await;
        if sent.is_err() {
            lock(&sh.agent.given).remove(&id);
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
        self.give(lease, RETURN).await
    }

    /// Gives a leased region back to the lender with its contents: the lease ends and the
    /// lender takes the region with [`Connection::receive_local_mr`].
    pub async fn send_remote_mr(&self, lease: RemoteLease) -> Result<()> {
        self.give(lease, GIVE_BACK).await
    }

    async fn give(&self, mut lease: RemoteLease, op: u8) -> Result<()> {
        lease.ended = true;
        let mut m = vec![op];
        m.extend_from_slice(&lease.id.to_be_bytes());
        self.shared().send_bytes(Kind::Agent, m).await
    }

    /// The next region the peer gave back with [`Connection::send_remote_mr`], registered
    /// for local access only: the peer's token for it reaches nothing any more.
    pub async fn receive_local_mr(&self) -> Result<LocalMr> {
        let sh = self.shared();
        sh.take(&sh.agent.returned, |m| m.take()).await
    }
}
