//! Connections: an RC queue pair, the completions the dispatcher routes to it, and the
//! message layer. [`Connection`] is the one door; the files below follow the state they
//! own:
//!
//! | file | state |
//! |---|---|
//! | `handshake` | endpoint information, the TCP handshake's messages, preparing and connecting a QP, accepting and rejecting |
//! | `listener` | the listener: handshakes under way, requests waiting, failures |
//! | `posting` | send-queue entries (each with its registered slot), work requests in flight, unsignaled ones, completion routing |
//! | `ops` | one-sided operations, atomics, flush, batches |
//! | `header` | the 8-byte message header (pure codec) |
//! | `credits` | the credit window (pure state machine) |
//! | `inbox` | the receive ring shared with shared receive queues, inboxes |
//! | `messages` | receiving and sending messages, credits on the wire |
//! | `large` | large messages (rendezvous; pure tables) |
//! | `srq` | shared receive queues |
//! | `lifecycle` | the hello, closing (pure state machine), events, keepalive |
//!
//! # Completions
//!
//! Every operation takes send-queue entries, posts one signaled work request with a fresh
//! `wr_id` and waits for the completion the dispatcher routes to it. The dispatcher runs
//! as configured by [`Polling`](crate::Polling): a tokio task sleeping on the completion
//! channel, the same task spinning for a while after each completion, a thread that polls
//! without sleeping, or nothing at all: the application calls
//! [`Connection::poll_completions`].
//!
//! # Cancellation
//!
//! Dropping an operation's future after its work request was posted does not cancel the
//! work request (verbs cannot): the dispatcher keeps the memory regions involved (and the
//! send-queue entry) alive until the completion arrives, so no memory the NIC may touch is
//! freed or reused.

// Every module here but `inbox` (one function reads a received message where it landed)
// forbids unsafe code.
#[forbid(unsafe_code)]
mod agent;
#[forbid(unsafe_code)]
mod credits;
#[forbid(unsafe_code)]
mod handshake;
#[forbid(unsafe_code)]
mod header;
mod inbox;
#[forbid(unsafe_code)]
mod large;
#[forbid(unsafe_code)]
mod lifecycle;
#[forbid(unsafe_code)]
mod listener;
#[forbid(unsafe_code)]
mod messages;
#[forbid(unsafe_code)]
mod ops;
#[forbid(unsafe_code)]
mod posting;
#[forbid(unsafe_code)]
mod srq;
#[cfg(test)]
#[forbid(unsafe_code)]
mod tests;

pub use agent::{MalformedAgent, RemoteLease};
pub use handshake::{
    ConnRequest, ConnectOptions, ENDPOINT_INFO_LEN, EndpointInfo, MAX_PRIVATE_DATA,
    PreparedConnection,
};
pub use inbox::Message;
pub use lifecycle::ConnectionEvent;
pub use listener::{HandshakeFailure, Listener};
pub use messages::RecvBuf;
pub use ops::Batch;
pub use srq::Srq;

// Paths other modules use.
pub(crate) use header::Kind;
pub(crate) use inbox::{Arrived, Inbox};
pub(crate) use posting::{OwnedCredit, SqEntries};

use crate::dispatch::Served;
use crate::error::{LocalFailure, Result};
use crate::rdma::Rdma;
use inbox::RecvRing;
use large::{Large, RDV_MAX};
use lifecycle::Life;
use messages::Messages;
use posting::{Posting, SendQueue};
use remem_verbs::{AsyncEvent, CompletionQueue, QpInitAttr, QpType, QueuePair};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::Notify;

/// Receive buffers beyond the credits: one for a credit message, one for close, one per
/// large-message completion message.
const SPARE: u32 = 2 + RDV_MAX;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a device does natively beyond the classic verbs.
#[derive(Debug, Clone, Copy)]
struct Caps {
    flush_global: bool,
    flush_persistent: bool,
    atomic_write: bool,
}

/// The transport's retry settings of a connection's queue pair.
#[derive(Debug, Clone, Copy)]
struct Transport {
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
}

/// The peer's message limits, from the handshake.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PeerLimits {
    pub(crate) max_message: u32,
    pub(crate) max_large_message: u32,
}

/// What the peer said (private data) and declared (its memory).
#[derive(Debug, Default)]
pub(crate) struct Peer {
    pub(crate) private_data: Vec<u8>,
    pub(crate) cfg: crate::PeerConfig,
}

/// What a connection's parts share with its dispatcher: the verbs objects, and one
/// sub-state per concern.
pub(crate) struct ConnShared {
    qp: Arc<dyn QueuePair>,
    cq: Arc<dyn CompletionQueue>,
    /// The receive completion queue, when receives have one of their own (a shared
    /// receive queue's, polled by the queue, or the connection's).
    rcq: Option<Arc<dyn CompletionQueue>>,
    pub(crate) rdma: Rdma,
    /// The tokio runtime current when the connection was prepared, if any.
    rt: Option<tokio::runtime::Handle>,
    /// What the device does natively: FLUSH (global, persistent) and ATOMIC WRITE.
    caps: Caps,
    /// The queue pair's retry settings.
    transport: Transport,
    /// The hello, the close state machine, what closing tells (one lock).
    life: Mutex<Life>,
    /// Whether the connection is open: a mirror of the close state, published after
    /// everything a close ends has ended.
    open: AtomicBool,
    /// Woken when the connection ends.
    ended: Notify,
    /// Send-queue entries, work requests in flight.
    post: Posting,
    /// Receive buffers, credits, inboxes.
    msg: Messages,
    /// Large messages, both ways.
    large: Large,
    /// The peer's limits, once connected.
    peer_limits: OnceLock<PeerLimits>,
    /// What the peer said and declared.
    peer: Mutex<Peer>,
    pub(crate) agent: agent::Agent,
}

impl std::fmt::Debug for ConnShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnShared")
            .field("qpn", &self.qp.qp_num())
            .field("closed", &lock(&self.life).state.reason())
            .finish_non_exhaustive()
    }
}

impl Drop for ConnShared {
    fn drop(&mut self) {
        self.rdma.dispatcher().forget();
    }
}

impl ConnShared {
    /// A queue pair with its completion queues, receive buffers and send-queue slots, in
    /// INIT with its receives posted.
    fn new(rdma: &Rdma, opts: &ConnectOptions) -> Result<Arc<Self>> {
        let cfg = rdma.config();
        let ctx = rdma.context();
        let channel = rdma.dispatcher().channel();
        let srq = opts.srq.as_ref().map(|s| s.shared.clone());
        // With a shared receive queue the connection posts no receives of its own.
        let depth = if srq.is_some() {
            0
        } else {
            cfg.recv_depth + SPARE
        };
        // Operations take `max_send_wr` entries at most; control messages have their own,
        // beyond them — or out of them, where `max_send_wr` is already the device's most.
        let device_max = ctx.query_device().map_or(u32::MAX, |a| a.max_qp_wr);
        let send_depth = cfg
            .cap
            .max_send_wr
            .min(device_max.saturating_sub(posting::CONTROL_RESERVE))
            .max(1);
        let cap = remem_verbs::QpCap {
            max_send_wr: send_depth + posting::CONTROL_RESERVE,
            max_recv_wr: cfg.cap.max_recv_wr.max(depth),
            max_send_sge: cfg.cap.max_send_sge.max(2),
            ..cfg.cap
        };
        let (cq, rcq) = if let Some(s) = &srq {
            let n = cfg.cq_size.max(cap.max_send_wr);
            (ctx.create_cq(n, channel)?, Some(s.cq.clone()))
        } else if opts.separate_recv_cq {
            let cq = ctx.create_cq(cfg.cq_size.max(cap.max_send_wr), channel.clone())?;
            let rcq = ctx.create_cq(cfg.cq_size.max(cap.max_recv_wr), channel)?;
            (cq, Some(rcq))
        } else {
            let n = cfg.cq_size.max(cap.max_send_wr + cap.max_recv_wr);
            (ctx.create_cq(n, channel)?, None)
        };
        let qp = rdma.pd().create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: rcq.clone().unwrap_or_else(|| cq.clone()),
            srq: srq.as_ref().map(|s| s.srq.clone()),
            cap,
            sq_sig_all: false,
        })?;
        let ring = if srq.is_none() {
            Some(RecvRing::new(rdma.pd(), cfg.max_message, depth)?)
        } else {
            None
        };
        let sq = SendQueue::new(rdma.pd(), send_depth)?;
        let dev = ctx.query_device()?;
        let caps = Caps {
            flush_global: dev.flush_global,
            flush_persistent: dev.flush_persistent,
            atomic_write: dev.atomic_write,
        };
        let shared = Arc::new(ConnShared {
            qp,
            cq,
            rcq,
            rdma: rdma.clone(),
            rt: tokio::runtime::Handle::try_current().ok(),
            caps,
            transport: Transport {
                timeout: opts.timeout.unwrap_or(cfg.timeout),
                retry_cnt: opts.retry_cnt.unwrap_or(cfg.retry_cnt),
                rnr_retry: opts.rnr_retry.unwrap_or(cfg.rnr_retry),
            },
            life: Mutex::new(Life::default()),
            open: AtomicBool::new(true),
            ended: Notify::new(),
            post: Posting::new(sq, opts.op_timeout),
            msg: Messages::new(ring, srq, cfg.recv_depth),
            large: Large::new(cfg.max_large_message as u64),
            peer_limits: OnceLock::new(),
            peer: Mutex::new(Peer::default()),
            agent: agent::Agent::default(),
        });
        shared.to_init()?;
        for i in 0..depth {
            shared.post_recv(i)?;
        }
        Ok(shared)
    }

    /// The peer's limits (zero before it is connected).
    pub(crate) fn peer(&self) -> PeerLimits {
        self.peer_limits.get().copied().unwrap_or_default()
    }

    /// The runtime the connection was made on (the dispatcher may run on a thread of its
    /// own, outside it), else the current one.
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.rt
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
    }

    /// Collects completions by hand (the connection's and its shared receive queue's),
    /// first driving a device its user drives.
    pub(crate) fn poll_all(self: &Arc<Self>) -> usize {
        self.rdma.dispatcher().drive();
        let mut n = self.poll_cq();
        if let Some(srq) = &self.msg.srq {
            n += srq.poll_cq();
        }
        n
    }

    /// Arms the CQs for the next completion (`req_notify`).
    fn arm_cqs(&self) -> remem_verbs::Result<()> {
        self.cq.req_notify(false)?;
        match (&self.msg.srq, &self.rcq) {
            (None, Some(rcq)) => rcq.req_notify(false),
            _ => Ok(()),
        }
    }

    /// Sets what to do when the QP goes to the error state (a connection manager's
    /// disconnect).
    pub(crate) fn on_error(&self, hook: Arc<dyn Fn() + Send + Sync>) {
        lock(&self.life).on_error = Some(hook);
    }
}

impl Served for ConnShared {
    fn poll(self: Arc<Self>) -> usize {
        self.poll_cq()
    }

    fn arm(&self) -> remem_verbs::Result<()> {
        self.arm_cqs()
    }

    fn fail(&self, reason: LocalFailure) {
        self.fail_local(reason);
    }

    /// An asynchronous event about this connection's QP or CQ (or its device): the
    /// connection is over, and its operations fail with [`Error::Event`](crate::Error).
    fn on_event(&self, ev: &AsyncEvent) -> bool {
        if !self.concerns(ev) {
            return false;
        }
        self.mark_closed(crate::CloseReason::Event(*ev));
        true
    }
}

/// Runs `fut`, which waits for completions of `conn`; with manual polling nothing else
/// would collect them, so this does, between polls of `fut`.
pub(crate) async fn driven<F: std::future::Future>(conn: &Arc<ConnShared>, fut: F) -> F::Output {
    if !conn.rdma.dispatcher().is_manual() {
        return fut.await;
    }
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        conn.poll_all();
        match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(v),
            std::task::Poll::Pending => {
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
        }
    })
    .await
}

/// A reliable connection to a peer: one-sided reads, writes and atomics on the peer's
/// memory, and two-sided messages.
///
/// Operations are `async fn`s taking `&self`: many tasks may use one connection at once.
/// Dropping the connection closes it (see [`Connection::close`]).
#[derive(Debug)]
pub struct Connection {
    shared: Arc<ConnShared>,
}

impl Connection {
    /// Handles the completions that have arrived; returns how many. Only needed with
    /// [`Polling::Manual`](crate::Polling::Manual) (elsewhere the dispatcher does it). On a
    /// device that its user drives
    /// ([`Context::caller_driven`](remem_verbs::Context::caller_driven)), first moves its
    /// packets, without waiting.
    pub fn poll_completions(&self) -> usize {
        self.shared.poll_all()
    }

    /// A batch of one-sided operations posted together, with only the last signaled: for
    /// throughput, one doorbell and one completion per batch. Memory added to the batch
    /// stays borrowed until the batch is done.
    pub fn batch<'m>(&self) -> Batch<'_, 'm> {
        Batch::new(self)
    }

    pub(crate) fn shared(&self) -> &Arc<ConnShared> {
        &self.shared
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.shared.qp.qp_num()
    }

    /// Records the private data the peer sent with its connection request or answer.
    pub(crate) fn set_peer_private_data(&self, pd: Vec<u8>) {
        lock(&self.shared.peer).private_data = pd;
    }

    /// Bounds every later operation of this connection (`None`: no bound but the
    /// transport's; default [`ConnectOptions::op_timeout`]). An operation's work request
    /// that has not completed when the time is up closes the connection
    /// ([`CloseReason::Failed`](crate::CloseReason::Failed)`(`[`LocalFailure::Timeout`](crate::LocalFailure::Timeout)`)`),
    /// and the operation fails with [`Error::Timeout`](crate::Error::Timeout). As with any
    /// RDMA failure, a write may still land at the peer and a read may still fill its
    /// buffer: the memory stays held until the work request is flushed, so none is reused
    /// early. Time spent waiting for a credit (a message to a peer that takes none) counts
    /// too, but fails the operation without closing the connection, since nothing was
    /// posted.
    ///
    /// Without one, an operation to a peer that answers nothing fails once the transport's
    /// retries run out ([`RdmaBuilder::timeout`](crate::RdmaBuilder::timeout), 2.1 s by
    /// default).
    ///
    /// ```
    /// # use remem::RdmaBuilder;
    /// # use std::{alloc::Layout, time::Duration};
    /// # fn main() -> Result<(), remem::Error> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// # let server = RdmaBuilder::new().device("soft@127.0.0.5:0").build()?;
    /// # let client = RdmaBuilder::new().device("soft@127.0.0.6:0").build()?;
    /// # let listener = server.listen("127.0.0.1:0").await?;
    /// # let addr = listener.local_addr()?;
    /// # let (c, s) = tokio::join!(client.connect(addr), listener.accept());
    /// # let (c, s) = (c?, s?);
    /// # let lent = server.alloc_local_mr(Layout::from_size_align(8, 8).unwrap())?;
    /// # s.share_local_mr(&lent).await?;
    /// # let remote = c.receive_shared_mr().await?;
    /// c.set_op_timeout(Some(Duration::from_millis(500)));
    /// assert_eq!(c.op_timeout(), Some(Duration::from_millis(500)));
    /// // Done in time; a peer that answered nothing for 500 ms would have closed `c`.
    /// assert_eq!(c.fetch_and_add(&remote, 1).await?, 0);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn set_op_timeout(&self, timeout: Option<std::time::Duration>) {
        self.shared.post.set_op_timeout(timeout);
    }

    /// The operation timeout ([`Connection::set_op_timeout`]).
    pub fn op_timeout(&self) -> Option<std::time::Duration> {
        self.shared.post.op_timeout()
    }

    /// The private data the peer sent when the connection was made
    /// ([`ConnectOptions::private_data`]); empty if none.
    pub fn peer_private_data(&self) -> Vec<u8> {
        lock(&self.shared.peer).private_data.clone()
    }
}
