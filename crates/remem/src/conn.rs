//! Connections: an RC queue pair, its completion dispatcher, and the message layer.
//!
//! # Completions
//!
//! Every operation posts one signaled work request with a fresh `wr_id` and waits for the
//! completion the dispatcher routes to it. The dispatcher runs as configured by
//! [`Polling`]: a tokio task sleeping on the completion channel ([`Polling::Event`]), the
//! same task spinning for a while after each completion before it sleeps again
//! ([`Polling::Adaptive`]), a thread that polls without sleeping ([`Polling::Busy`]), or
//! nothing at all: the application calls [`Connection::poll_completions`]
//! ([`Polling::Manual`]).
//!
//! # Cancellation
//!
//! Dropping an operation's future after its work request was posted does not cancel the
//! work request (verbs cannot): the dispatcher keeps the memory regions involved alive
//! until the completion arrives, so no memory the NIC may touch is freed or reused.
//!
//! # Messages and credits
//!
//! SEND and WRITE_WITH_IMM consume a receive at the peer. Each side posts `recv_depth`
//! receive buffers (plus two spares for credit and close messages) and tells the peer in
//! the handshake; a sender spends a credit per message and waits when it has none, so a
//! fast sender never meets an empty receive queue. A credit returns to the sender when the
//! receiving application takes the message ([`Connection::receive`] and friends): credits
//! ride in the header of every message, or in a credit message of their own when a quarter
//! of the window is owed and nothing else is going that way. Receive buffers are reposted
//! as soon as their data is copied out; a peer that sends more messages than it was granted
//! credits for breaks the protocol, and the connection closes
//! ([`ProtocolViolation::CreditsExceeded`](crate::ProtocolViolation)). So what a peer can
//! make this side hold for messages the application has not taken is bounded: `recv_depth`
//! messages of up to `max_message` bytes, plus `max_large_message` bytes of large messages
//! (read from the peer's memory at most that many bytes ahead of the application).

use crate::error::{CloseReason, Error, HandshakeError, LocalFailure, ProtocolViolation, Result};
use crate::mr::{Local, LocalMr, LocalMut, RemoteMr, Span, register};
use crate::rdma::{Polling, Rdma};
use crate::srq::{Srq, SrqShared};
use crate::{FlushType, PeerConfig};
use remem_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Gid, MemoryBuffer, Mtu, QpAttr, QpAttrMask, QpInitAttr,
    QpState, QpType, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

/// Bytes of the header in front of every message.
pub(crate) const HDR: usize = 8;
/// Large messages (rendezvous) in flight per direction.
const RDV_MAX: u32 = 4;
/// Receive buffers beyond the credits: one for a credit message, one for close, one per
/// rendezvous completion message.
const SPARE: u32 = 2 + RDV_MAX;
/// The most completions taken by one poll call (`RdmaBuilder::cqe_per_poll` is capped).
const MAX_PER_POLL: usize = 64;
/// `wr_id`s of receive buffers carry this bit; the rest is the buffer's index.
const RECV_TAG: u64 = 1 << 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Data = 1,
    Credit = 2,
    MrToken = 3,
    Close = 4,
    /// A large message: the receiver READs it from the sender's memory.
    Rts = 5,
    /// The receiver has read a large message (its id in the immediate field).
    RtsDone = 6,
    /// An agent message (memory requests and leases).
    Agent = 7,
    /// A connection's first message, from the connecting side: the nonce the listener
    /// sent over TCP. Its arrival proves that the connecting side's device sends from the
    /// address it claimed; the listener's QP stays in RTR (sending nothing of its own)
    /// until it has arrived.
    Hello = 8,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Credit,
            3 => Kind::MrToken,
            4 => Kind::Close,
            5 => Kind::Rts,
            6 => Kind::RtsDone,
            7 => Kind::Agent,
            8 => Kind::Hello,
            _ => return None,
        })
    }
}

/// What a connection's endpoint tells its peer: enough to connect an RC queue pair, and
/// the message layer's limits. Exchanged by [`Rdma::connect`] / [`crate::Listener::accept`]
/// over TCP, or by the application some other way ([`PreparedConnection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointInfo {
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number the endpoint sends.
    pub psn: u32,
    /// GID (RoCE v2: the IP address).
    pub gid: Gid,
    /// Path MTU the endpoint can do.
    pub mtu: Mtu,
    /// Messages the endpoint can take before it returns credits.
    pub recv_credits: u32,
    /// Largest message it receives in one SEND (larger ones are read from the sender's
    /// memory).
    pub max_message: u32,
    /// Largest message it receives at all ([`crate::RdmaBuilder::max_large_message`]).
    pub max_large_message: u32,
    /// The UDP port its device takes RoCEv2 packets on: 4791 but for soft devices bound
    /// elsewhere; 0 if unknown. A soft device sends to the port it listens on, so two
    /// soft devices on different ports cannot reach each other, and connecting them is an
    /// error ([`HandshakeError::PortMismatch`]).
    pub udp_port: u16,
}

/// Magic and version of the endpoint exchange.
const MAGIC: &[u8; 6] = b"REMEM\0";
const VERSION: u16 = 3;
/// Bytes of an encoded [`EndpointInfo`].
pub const ENDPOINT_INFO_LEN: usize = 52;

/// Checks the first 8 bytes of an endpoint (magic, version).
fn check_head(b: &[u8]) -> Result<()> {
    if b.len() < 8 || &b[..6] != MAGIC {
        return Err(HandshakeError::NotRemem.into());
    }
    let version = u16::from_be_bytes([b[6], b[7]]);
    if version != VERSION {
        return Err(HandshakeError::Version {
            peer: version,
            ours: VERSION,
        }
        .into());
    }
    Ok(())
}

impl EndpointInfo {
    /// Encodes it (magic, version, fields; big-endian).
    pub fn to_bytes(&self) -> [u8; ENDPOINT_INFO_LEN] {
        let mut b = [0u8; ENDPOINT_INFO_LEN];
        b[..6].copy_from_slice(MAGIC);
        b[6..8].copy_from_slice(&VERSION.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..32].copy_from_slice(self.gid.raw());
        b[32..36].copy_from_slice(&self.mtu.bytes().to_be_bytes());
        b[36..40].copy_from_slice(&self.recv_credits.to_be_bytes());
        b[40..44].copy_from_slice(&self.max_message.to_be_bytes());
        b[44..48].copy_from_slice(&self.max_large_message.to_be_bytes());
        b[48..50].copy_from_slice(&self.udp_port.to_be_bytes());
        b
    }

    /// Decodes what [`EndpointInfo::to_bytes`] wrote; another magic, version, length or a
    /// bad field is an [`Error::Handshake`].
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        check_head(b)?;
        if b.len() != ENDPOINT_INFO_LEN {
            return Err(HandshakeError::BadField("length").into());
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(EndpointInfo {
            qpn: u32_at(8) & 0x00ff_ffff,
            psn: u32_at(12) & 0x00ff_ffff,
            gid: Gid(gid),
            mtu: Mtu::from_bytes(u32_at(32)).ok_or(HandshakeError::BadField("MTU"))?,
            recv_credits: u32_at(36),
            max_message: u32_at(40),
            max_large_message: u32_at(44),
            udp_port: u16::from_be_bytes([b[48], b[49]]),
        })
    }
}

/// A connection's queue pair before it is connected: its [`EndpointInfo`] goes to the peer
/// by whatever means the application likes, and [`PreparedConnection::connect`] takes the
/// peer's. (The peer's receive buffers must be posted before anything is sent: connect
/// both sides, then let them talk.)
#[derive(Debug)]
pub struct PreparedConnection {
    shared: Arc<ConnShared>,
    info: EndpointInfo,
}

impl PreparedConnection {
    /// Sets the first PSN this side sends (the one a connection manager negotiated).
    pub(crate) fn set_psn(&mut self, psn: u32) {
        self.info.psn = psn & 0x00ff_ffff;
    }

    /// What to tell the peer.
    pub fn local_info(&self) -> EndpointInfo {
        self.info
    }

    /// Connects to the peer described by `remote`: the QP goes through RTR to RTS.
    /// Soft devices on different UDP ports fail here ([`HandshakeError::PortMismatch`]).
    pub fn connect(self, remote: EndpointInfo) -> Result<Connection> {
        self.shared.rdma.check_port(remote.udp_port)?;
        self.shared.to_rtr(&self.info, &remote)?;
        self.shared.to_rts(&self.info)?;
        let shared = self.shared;
        shared.attach(&remote)?;
        shared.confirmed.store(true, Ordering::Release);
        shared.start_keepalive();
        tracing::debug!(qpn = shared.qp.qp_num(), peer_qpn = remote.qpn, "connected");
        Ok(Connection { shared })
    }

    /// The listener's half: the QP goes to RTR only — it answers what arrives and sends
    /// nothing of its own — until the peer's hello with `nonce` has arrived (the receiver
    /// learns it), when [`ConnShared::confirm_up`] takes it to RTS.
    fn connect_pending(
        self,
        remote: EndpointInfo,
        nonce: u64,
    ) -> Result<(Connection, oneshot::Receiver<Result<(), CloseReason>>)> {
        let (tx, rx) = oneshot::channel();
        *lock(&self.shared.confirm) = Some((nonce, tx));
        self.shared.to_rtr(&self.info, &remote)?;
        let shared = self.shared;
        let conn = Connection { shared };
        conn.shared.attach(&remote)?;
        Ok((conn, rx))
    }
}

/// What a device does natively beyond the classic verbs.
#[derive(Debug, Clone, Copy)]
struct Caps {
    flush_global: bool,
    flush_persistent: bool,
    atomic_write: bool,
}

/// One in-flight work request.
struct Pending {
    /// The waiting future, if it still waits.
    tx: Option<oneshot::Sender<(WorkCompletion, u64)>>,
    /// What must outlive the work request: its memory and its send-queue slot.
    _keep: Keep,
    /// A credit message: the next one may go once it completes.
    credit_msg: bool,
    /// A close message: the QP goes to ERR once it is out.
    close_msg: bool,
    /// The last unsignaled work request posted before this one: released when this
    /// completes.
    release_upto: Option<u64>,
}

impl Pending {
    /// An operation whose future waits for its completion.
    fn awaited(
        tx: oneshot::Sender<(WorkCompletion, u64)>,
        spans: Vec<Span>,
        sq: OwnedSemaphorePermit,
        slot: Option<SlotGuard>,
    ) -> Self {
        Pending {
            tx: Some(tx),
            _keep: Keep {
                _owner: None,
                _spans: spans,
                _sq: sq,
                _slot: slot,
            },
            credit_msg: false,
            close_msg: false,
            release_upto: None,
        }
    }
}

struct Keep {
    /// A close message sent as the connection is dropped keeps the connection alive until
    /// it is out (the dispatcher polls only a live connection).
    _owner: Option<Arc<ConnShared>>,
    _spans: Vec<Span>,
    _sq: OwnedSemaphorePermit,
    _slot: Option<SlotGuard>,
}

/// A message received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its bytes.
    pub data: Vec<u8>,
    /// The immediate data, for SEND_WITH_IMM.
    pub imm: Option<u32>,
}

pub(crate) struct Inbox<T> {
    pub(crate) queue: Mutex<VecDeque<T>>,
    pub(crate) notify: Notify,
    /// Whether taking an item returns a credit to the peer (its message used one and is
    /// still owed).
    credited: bool,
}

/// An inbox whose items owe no credit (their messages were acknowledged on arrival).
impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Self::new(false)
    }
}

impl<T> Inbox<T> {
    fn new(credited: bool) -> Self {
        Inbox {
            queue: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            credited,
        }
    }

    pub(crate) fn push(&self, item: T) {
        lock(&self.queue).push_back(item);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Small registered slots (8 bytes): message headers and atomic results.
struct Slots {
    mr: LocalMr,
    free: Mutex<Vec<u32>>,
}

struct SlotGuard {
    slots: Weak<Slots>,
    index: u32,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(s) = self.slots.upgrade() {
            lock(&s.free).push(self.index);
        }
    }
}

impl Slots {
    fn take(self: &Arc<Self>) -> Option<(SlotGuard, Span)> {
        let index = lock(&self.free).pop()?;
        let span = Span {
            inner: self.mr.inner.clone(),
            offset: index as usize * 8,
            len: 8,
        };
        Some((
            SlotGuard {
                slots: Arc::downgrade(self),
                index,
            },
            span,
        ))
    }
}

/// What a connection's parts share with its dispatcher.
pub(crate) struct ConnShared {
    qp: Arc<dyn QueuePair>,
    cq: Arc<dyn CompletionQueue>,
    /// The receive completion queue, when receives have one of their own (a shared
    /// receive queue's, polled by the queue, or the connection's).
    rcq: Option<Arc<dyn CompletionQueue>>,
    /// The shared receive queue receives come from, if any.
    srq: Option<Arc<SrqShared>>,
    /// What the peer sent in the handshake.
    peer_private_data: Mutex<Vec<u8>>,
    /// The QP may send: the connection was made by this side, or the peer's hello has
    /// arrived. Until then nothing is sent to the peer's claimed address, not even a close
    /// message.
    confirmed: AtomicBool,
    /// While the listener waits for the peer's hello: its nonce, and who to tell.
    confirm: Mutex<Option<(u64, Confirmed)>>,
    /// The peer closed while work of ours was in flight: the QP goes to the error state
    /// once that work has completed.
    error_when_drained: AtomicBool,
    /// Woken when the connection ends.
    ended: Notify,
    /// `next_event` reported `Established`.
    established_told: AtomicBool,
    pub(crate) rdma: Rdma,
    pub(crate) agent: crate::agent::Agent,
    /// The tokio runtime current when the connection was prepared, if any.
    rt: Option<tokio::runtime::Handle>,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Work requests posted to complete silently, in post order, with what they hold.
    unsignaled: Mutex<VecDeque<(u64, Keep)>>,
    /// What the device does natively: FLUSH (global, persistent) and ATOMIC WRITE.
    caps: Caps,
    /// What the peer declared about its memory.
    peer_cfg: Mutex<crate::PeerConfig>,
    next_wr: AtomicU64,
    /// Why the connection closed, once it has.
    closed: Mutex<Option<CloseReason>>,
    is_closed: AtomicBool,
    /// Bounds work requests in flight to the send queue's depth.
    sq: Arc<Semaphore>,
    slots: Arc<Slots>,
    // Message layer.
    recv_mr: LocalMr,
    recv_slot: usize,
    peer_max_message: AtomicU32,
    peer_max_large_message: AtomicU32,
    credits: Semaphore,
    /// Credits this side has spent (messages sent that consume a receive at the peer) and
    /// the peer has returned: it may not return more than were spent.
    spent: AtomicU64,
    returned: AtomicU64,
    /// Credits this side has granted (the initial window and every credit returned) and
    /// messages received that consume one: more received than granted breaks the protocol.
    granted: AtomicU64,
    received: AtomicU64,
    owed: AtomicU32,
    credit_window: u32,
    credit_msg_busy: AtomicBool,
    /// Completions handled so far (the keepalive probes a connection that saw none).
    activity: AtomicU64,
    /// Messages in arrival order; a large one is a placeholder until it has been read.
    messages: Inbox<Place>,
    write_imms: Inbox<u32>,
    tokens: Inbox<RemoteMr>,
    // Large messages this side sends, until the peer has read them.
    rdv: Arc<Semaphore>,
    rdv_out: Mutex<HashMap<u32, RdvOut>>,
    next_rid: AtomicU32,
    // Large messages the peer announced, until the application has taken them.
    rdv_in: Mutex<RdvIn>,
    /// The CM id of a connection made through the connection manager.
    cm: Mutex<Option<crate::cm::CmLink>>,
}

/// Told when the peer's hello has arrived, or why the connection ended before.
type Confirmed = oneshot::Sender<Result<(), CloseReason>>;

/// A message's place in the order of messages: empty while a large message is read.
pub(crate) type Place = Arc<Mutex<Option<Arrived>>>;

/// A message that arrived, with (for a large one) its share of the connection's
/// large-message budget, given back when the application takes it.
pub(crate) struct Arrived {
    pub(crate) msg: Message,
    _hold: Option<LargeHold>,
}

impl Arrived {
    fn new(msg: Message) -> Self {
        Arrived { msg, _hold: None }
    }
}

/// Bytes of large messages a connection holds for the application.
struct LargeHold {
    conn: Weak<ConnShared>,
    len: u64,
}

impl Drop for LargeHold {
    fn drop(&mut self) {
        if let Some(c) = self.conn.upgrade() {
            c.release_large(self.len);
        }
    }
}

/// The receive side of large messages: announcements whose data this side has not
/// finished reading (at most [`RDV_MAX`], as the sender keeps), the bytes it holds (being
/// read, or read and not yet taken; at most `max_large_message`), and announcements
/// waiting for that budget.
#[derive(Default)]
struct RdvIn {
    reading: u32,
    held: u64,
    waiting: VecDeque<Announced>,
}

/// A large message announced by the peer.
struct Announced {
    rid: u32,
    token: RemoteMr,
    imm: Option<u32>,
    place: Place,
}

impl Drop for ConnShared {
    fn drop(&mut self) {
        self.rdma.dispatcher().forget();
    }
}

/// A large message being read by the peer: its source stays registered (for remote reads
/// of exactly its range) until the peer says it is done.
struct RdvOut {
    done: oneshot::Sender<()>,
    _mr: Arc<dyn remem_verbs::MemoryRegion>,
    _span: Span,
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for ConnShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnShared")
            .field("qpn", &self.qp.qp_num())
            .field("closed", &*lock(&self.closed))
            .finish_non_exhaustive()
    }
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

impl Rdma {
    /// Creates a queue pair, its completion queue and receive buffers, ready to be
    /// connected to a peer with the [`EndpointInfo`] it returns.
    pub fn prepare(&self) -> Result<PreparedConnection> {
        self.prepare_with(&ConnectOptions::default())
    }

    /// [`Rdma::prepare`] with options (the private data is not used: exchange it along
    /// with the endpoint information).
    pub fn prepare_with(&self, opts: &ConnectOptions) -> Result<PreparedConnection> {
        let cfg = self.config();
        let ctx = self.context();
        let channel = self.dispatcher().channel();
        let srq = opts.srq.as_ref().map(|s| s.shared.clone());
        // With a shared receive queue the connection posts no receives of its own.
        let depth = if srq.is_some() {
            0
        } else {
            cfg.recv_depth + SPARE
        };
        let cap = remem_verbs::QpCap {
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
        let qp = self.pd().create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: rcq.clone().unwrap_or_else(|| cq.clone()),
            srq: srq.as_ref().map(|s| s.srq.clone()),
            cap,
            sq_sig_all: false,
        })?;
        let recv_slot = HDR + cfg.max_message;
        let recv_mr = register(
            self.pd(),
            MemoryBuffer::zeroed(recv_slot * depth.max(1) as usize)?,
            AccessFlags::LOCAL_WRITE,
        )?;
        // Slots for headers and atomic results: one per send-queue entry, and spares for
        // operations that hold a slot while they wait for an entry.
        let nslots = 2 * cap.max_send_wr + 8;
        let slots = Arc::new(Slots {
            mr: register(
                self.pd(),
                MemoryBuffer::zeroed(8 * nslots as usize)?,
                AccessFlags::LOCAL_WRITE,
            )?,
            free: Mutex::new((0..nslots).rev().collect()),
        });
        let psn = cfg.sq_psn.unwrap_or_else(rand::random) & 0x00ff_ffff;
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
            srq: srq.clone(),
            peer_private_data: Mutex::new(Vec::new()),
            confirmed: AtomicBool::new(false),
            confirm: Mutex::new(None),
            error_when_drained: AtomicBool::new(false),
            ended: Notify::new(),
            established_told: AtomicBool::new(false),
            rdma: self.clone(),
            agent: crate::agent::Agent::default(),
            rt: tokio::runtime::Handle::try_current().ok(),
            pending: Mutex::new(HashMap::new()),
            unsignaled: Mutex::new(VecDeque::new()),
            caps,
            peer_cfg: Mutex::new(crate::PeerConfig::default()),
            next_wr: AtomicU64::new(1),
            closed: Mutex::new(None),
            is_closed: AtomicBool::new(false),
            sq: Arc::new(Semaphore::new(cap.max_send_wr as usize)),
            slots,
            recv_mr,
            recv_slot,
            peer_max_message: AtomicU32::new(0),
            peer_max_large_message: AtomicU32::new(0),
            credits: Semaphore::new(0),
            spent: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            granted: AtomicU64::new(u64::from(cfg.recv_depth)),
            received: AtomicU64::new(0),
            owed: AtomicU32::new(0),
            credit_window: cfg.recv_depth,
            credit_msg_busy: AtomicBool::new(false),
            activity: AtomicU64::new(0),
            messages: Inbox::new(true),
            write_imms: Inbox::new(true),
            tokens: Inbox::new(true),
            rdv: Arc::new(Semaphore::new(RDV_MAX as usize)),
            rdv_out: Mutex::new(HashMap::new()),
            next_rid: AtomicU32::new(1),
            rdv_in: Mutex::new(RdvIn::default()),
            cm: Mutex::new(None),
        });
        shared.to_init()?;
        for i in 0..depth {
            shared.post_recv(i)?;
        }
        let info = EndpointInfo {
            qpn: shared.qp.qp_num(),
            psn,
            gid: self.gid(),
            mtu: self.mtu(),
            // Behind a shared receive queue too: there the credits bound what one peer
            // can queue for the application, while the queue's buffers serve every
            // connection (an empty queue is met with RNR retries).
            recv_credits: cfg.recv_depth,
            max_message: cfg.max_message as u32,
            max_large_message: cfg.max_large_message as u32,
            udp_port: self.roce_port(),
        };
        Ok(PreparedConnection { shared, info })
    }

    /// Connects to a remem listener at `addr`: endpoint information goes both ways over
    /// TCP, both queue pairs are brought to RTS, and the connection is usable as soon as
    /// this returns.
    pub async fn connect(&self, addr: impl tokio::net::ToSocketAddrs) -> Result<Connection> {
        self.connect_with(addr, &ConnectOptions::default()).await
    }

    /// [`Rdma::connect`] with options: private data for the listener (which may reject
    /// the connection: [`Error::Rejected`]), a shared receive queue, a separate receive
    /// completion queue.
    ///
    /// The handshake: this side sends its [`EndpointInfo`] and private data; the listener
    /// answers with its own, its private data and a nonce; this side brings its QP up and
    /// sends the nonce as the connection's first RDMA message (proving to the listener
    /// that it sends from the address it claimed), and the listener confirms over TCP once
    /// that message has arrived. Soft devices on different UDP ports fail with
    /// [`HandshakeError::PortMismatch`]; a listener its RoCE packets cannot reach, with
    /// [`HandshakeError::Unreachable`]. Everything is bounded by
    /// [`RdmaBuilder::handshake_timeout`](crate::RdmaBuilder::handshake_timeout).
    pub async fn connect_with(
        &self,
        addr: impl tokio::net::ToSocketAddrs,
        opts: &ConnectOptions,
    ) -> Result<Connection> {
        check_private_data(&opts.private_data)?;
        let timeout = self.config().handshake_timeout;
        let prepared = self.prepare_with(opts)?;
        let exchange = async {
            let mut stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let mut hello = prepared.local_info().to_bytes().to_vec();
            put_private_data(&mut hello, &opts.private_data);
            stream.write_all(&hello).await?;
            let mut verdict = [0u8; 1];
            read_exact(&mut stream, &mut verdict).await?;
            match verdict[0] {
                b'A' => {
                    let mut buf = [0u8; ENDPOINT_INFO_LEN];
                    read_exact(&mut stream, &mut buf).await?;
                    let remote = EndpointInfo::from_bytes(&buf)?;
                    let mut nonce = [0u8; 8];
                    read_exact(&mut stream, &mut nonce).await?;
                    let pd = read_private_data(&mut stream).await?;
                    let conn = prepared.connect(remote)?;
                    *lock(&conn.shared.peer_private_data) = pd;
                    // The connection's first message: the listener's QP takes it in RTR
                    // and goes to RTS only once it has arrived from this side's address.
                    let sent = driven(
                        &conn.shared,
                        conn.shared.send_bytes(Kind::Hello, nonce.to_vec()),
                    )
                    .await;
                    match sent {
                        Ok(()) => {}
                        Err(Error::Completion { status, .. }) => {
                            return Err(HandshakeError::Unreachable(status).into());
                        }
                        Err(Error::Closed(CloseReason::Completion { status, .. })) => {
                            return Err(HandshakeError::Unreachable(status).into());
                        }
                        Err(e) => return Err(e),
                    }
                    let mut confirmed = [0u8; 1];
                    read_exact(&mut stream, &mut confirmed).await?;
                    if confirmed != *b"C" {
                        return Err(HandshakeError::Unexpected(confirmed[0]).into());
                    }
                    Ok(conn)
                }
                b'J' => {
                    let pd = read_private_data(&mut stream).await?;
                    tracing::debug!(bytes = pd.len(), "connection rejected");
                    Err(Error::Rejected(pd))
                }
                b'E' => {
                    // The listener refused the endpoint: its devices's port follows.
                    let mut why = [0u8; 3];
                    read_exact(&mut stream, &mut why).await?;
                    Err(HandshakeError::PortMismatch {
                        local: self.send_port().unwrap_or(0),
                        peer: u16::from_be_bytes([why[1], why[2]]),
                    }
                    .into())
                }
                _ => Err(HandshakeError::NotRemem.into()),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout("connection handshake")),
        }
    }
}

/// The most private data a connection request or answer carries: 196 bytes, RDMA CM's
/// limit for an accept (a connect request through RDMA CM takes 56).
pub const MAX_PRIVATE_DATA: usize = 196;

fn check_private_data(pd: &[u8]) -> Result<()> {
    if pd.len() > MAX_PRIVATE_DATA {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data (at most {MAX_PRIVATE_DATA})",
            pd.len()
        )));
    }
    Ok(())
}

fn put_private_data(out: &mut Vec<u8>, pd: &[u8]) {
    out.push(pd.len() as u8);
    out.extend_from_slice(pd);
}

/// `read_exact` with the handshake's error for a peer that closed the connection.
async fn read_exact(stream: &mut TcpStream, buf: &mut [u8]) -> Result<()> {
    match stream.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(HandshakeError::Closed.into())
        }
        Err(e) => Err(e.into()),
    }
}

async fn read_private_data(stream: &mut TcpStream) -> Result<Vec<u8>> {
    let mut len = [0u8; 1];
    read_exact(stream, &mut len).await?;
    if usize::from(len[0]) > MAX_PRIVATE_DATA {
        return Err(HandshakeError::PrivateDataTooLong(usize::from(len[0])).into());
    }
    let mut pd = vec![0u8; usize::from(len[0])];
    read_exact(stream, &mut pd).await?;
    Ok(pd)
}

/// Runs `fut`, which waits for completions of `conn`; with [`Polling::Manual`] nothing
/// else would collect them, so this does, between polls of `fut`.
async fn driven<F: std::future::Future>(conn: &Arc<ConnShared>, fut: F) -> F::Output {
    if conn.rdma.config().polling != Polling::Manual {
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

/// Options of a connection, on either side ([`Rdma::connect_with`],
/// [`ConnRequest::accept`]).
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Bytes for the peer (at most [`MAX_PRIVATE_DATA`]): [`ConnRequest::private_data`]
    /// at the listener, [`Connection::peer_private_data`] at the connecting side — e.g. a
    /// memory region descriptor and a peer configuration descriptor, as librpma's
    /// examples pass them.
    pub private_data: Vec<u8>,
    /// Receive completions on a completion queue of their own rather than on the one send
    /// completions use (librpma's `rpma_conn_cfg_set_rcq_size`).
    pub separate_recv_cq: bool,
    /// Take receives from this shared receive queue (its buffers and its completion
    /// queue) instead of buffers of the connection's own; messages then arrive at
    /// [`Srq::receive`]. Overrides `separate_recv_cq`.
    pub srq: Option<Srq>,
}

/// A connection request a [`crate::Listener`] received: who asks and what it says
/// ([`ConnRequest::private_data`]); accept or reject it. While it lives it takes one of
/// the listener's handshake places ([`crate::RdmaBuilder::max_handshakes`]).
#[derive(Debug)]
pub struct ConnRequest {
    pub(crate) rdma: Rdma,
    pub(crate) stream: TcpStream,
    pub(crate) remote: EndpointInfo,
    pub(crate) private_data: Vec<u8>,
    pub(crate) peer: std::net::SocketAddr,
    /// When its TCP connection was accepted.
    pub(crate) since: Instant,
    /// Where failures the peer caused are reported.
    pub(crate) failures: Arc<crate::rdma::Failures>,
    pub(crate) _place: OwnedSemaphorePermit,
}

/// Why accepting failed: this side's resources, or the peer.
pub(crate) enum AcceptError {
    Local(Error),
    Peer(Error),
}

impl ConnRequest {
    /// The private data the connecting side sent.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The TCP address the request came from.
    pub fn peer_addr(&self) -> std::net::SocketAddr {
        self.peer
    }

    /// Accepts: brings up a queue pair for it, answers with `opts.private_data`, and
    /// returns the connection once the peer is ready too. The queue pair stays in RTR —
    /// answering what arrives, sending nothing of its own — until the peer's first RDMA
    /// message (the hello with the nonce this side sent over TCP) has arrived from the
    /// address the peer claimed; only then does it go to RTS. A failure the peer caused is
    /// also reported to the listener ([`crate::Listener::next_failure`]).
    pub async fn accept(self, opts: &ConnectOptions) -> Result<Connection> {
        match self.accept_inner(opts).await {
            Ok(c) => Ok(c),
            Err(AcceptError::Local(e) | AcceptError::Peer(e)) => Err(e),
        }
    }

    pub(crate) async fn accept_inner(
        mut self,
        opts: &ConnectOptions,
    ) -> Result<Connection, AcceptError> {
        check_private_data(&opts.private_data).map_err(AcceptError::Local)?;
        let failures = self.failures.clone();
        let peer = self.peer;
        let r = self.accept_exchange(opts).await;
        if let Err(AcceptError::Peer(e)) = &r {
            failures.record(peer, e);
        }
        r
    }

    async fn accept_exchange(&mut self, opts: &ConnectOptions) -> Result<Connection, AcceptError> {
        let timeout = self.rdma.config().handshake_timeout;
        let peer = AcceptError::Peer;
        if let Err(e) = self.rdma.check_port(self.remote.udp_port) {
            let mut answer = vec![b'E', 1];
            answer.extend_from_slice(&self.rdma.roce_port().to_be_bytes());
            let _ = tokio::time::timeout(timeout, self.stream.write_all(&answer)).await;
            return Err(peer(e));
        }
        let prepared = self.rdma.prepare_with(opts).map_err(AcceptError::Local)?;
        let info = prepared.local_info();
        let nonce: u64 = rand::random();
        let (conn, confirmed) = prepared.connect_pending(self.remote, nonce).map_err(peer)?;
        *lock(&conn.shared.peer_private_data) = std::mem::take(&mut self.private_data);
        let stream = &mut self.stream;
        let exchange = async {
            let mut answer = vec![b'A'];
            answer.extend_from_slice(&info.to_bytes());
            answer.extend_from_slice(&nonce.to_be_bytes());
            put_private_data(&mut answer, &opts.private_data);
            stream.write_all(&answer).await?;
            // The peer's hello arrives over RDMA; meanwhile it has nothing to say on TCP
            // (a close there means it gave up).
            let mut byte = [0u8; 1];
            tokio::select! {
                r = confirmed => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(CloseReason::Protocol(ProtocolViolation::Handshake))) => {
                        return Err(HandshakeError::BadHello.into());
                    }
                    Ok(Err(reason)) => return Err(Error::Closed(reason)),
                    Err(_) => return Err(conn.shared.closed_error()),
                },
                r = stream.read(&mut byte) => {
                    return Err(match r {
                        Ok(0) => HandshakeError::Closed.into(),
                        Ok(_) => HandshakeError::Unexpected(byte[0]).into(),
                        Err(e) => e.into(),
                    });
                }
            }
            conn.shared.confirm_up(&info)?;
            stream.write_all(b"C").await?;
            Ok::<_, Error>(())
        };
        match tokio::time::timeout(timeout, driven(&conn.shared, exchange)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(peer(e)),
            Err(_) => Err(peer(Error::Timeout("connection handshake"))),
        }
    }

    /// Rejects: the connecting side's [`Rdma::connect_with`] fails with
    /// [`Error::Rejected`] carrying `private_data` (at most [`MAX_PRIVATE_DATA`] bytes).
    pub async fn reject(mut self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data)?;
        let mut answer = vec![b'J'];
        put_private_data(&mut answer, private_data);
        let timeout = self.rdma.config().handshake_timeout;
        let send = async {
            self.stream.write_all(&answer).await?;
            self.stream.shutdown().await
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Error::Timeout("connection handshake")),
        }
    }
}

/// Reads a connection request from a freshly accepted TCP stream, within the handshake
/// timeout: magic and version first, so that a peer speaking something else is told
/// apart at once.
pub(crate) async fn read_request(
    rdma: &Rdma,
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    place: OwnedSemaphorePermit,
    failures: Arc<crate::rdma::Failures>,
) -> Result<ConnRequest> {
    let since = Instant::now();
    let timeout = rdma.config().handshake_timeout;
    let read = async {
        stream.set_nodelay(true)?;
        let mut buf = [0u8; ENDPOINT_INFO_LEN];
        read_exact(&mut stream, &mut buf[..8]).await?;
        check_head(&buf[..8])?;
        read_exact(&mut stream, &mut buf[8..]).await?;
        let remote = EndpointInfo::from_bytes(&buf)?;
        let private_data = read_private_data(&mut stream).await?;
        Ok::<_, Error>((remote, private_data))
    };
    let (remote, private_data) = match tokio::time::timeout(timeout, read).await {
        Ok(r) => r?,
        Err(_) => return Err(Error::Timeout("connection handshake")),
    };
    Ok(ConnRequest {
        rdma: rdma.clone(),
        stream,
        remote,
        private_data,
        peer,
        since,
        failures,
        _place: place,
    })
}

/// What happens to a connection, as librpma's `rpma_conn_next_event` reports it (a
/// rejected connection is [`Error::Rejected`] from [`Rdma::connect_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEvent {
    /// The connection is up (the first event of every connection).
    Established,
    /// It was closed in order: by the peer, or by this side ([`Connection::close`]).
    Closed,
    /// It was lost: the transport gave up, an asynchronous error, a protocol violation
    /// (why).
    Lost(CloseReason),
}

impl ConnShared {
    fn to_init(&self) -> Result<()> {
        use QpAttrMask as M;
        let cfg = self.rdma.config();
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: cfg.port,
            qp_access_flags: cfg.access & AccessFlags::REMOTE,
            ..QpAttr::default()
        };
        self.qp.modify(&attr, M::RC_TO_INIT)?;
        Ok(())
    }

    /// Moves the QP to RTR towards `remote`: it answers what arrives, sends nothing.
    fn to_rtr(&self, local: &EndpointInfo, remote: &EndpointInfo) -> Result<()> {
        use QpAttrMask as M;
        let cfg = self.rdma.config();
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: local.mtu.min(remote.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: cfg.max_rd_atomic,
            min_rnr_timer: cfg.min_rnr_timer,
            ah_attr: AhAttr {
                dgid: remote.gid,
                sgid_index: self.rdma.gid_index(),
                hop_limit: 64,
                is_global: true,
                port_num: cfg.port,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        self.qp.modify(&attr, M::RC_TO_RTR)?;
        Ok(())
    }

    /// Moves the QP from RTR to RTS: it may send.
    fn to_rts(&self, local: &EndpointInfo) -> Result<()> {
        let cfg = self.rdma.config();
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: local.psn,
            timeout: cfg.timeout,
            retry_cnt: cfg.retry_cnt,
            rnr_retry: cfg.rnr_retry,
            max_rd_atomic: cfg.max_rd_atomic,
            ..QpAttr::default()
        };
        self.qp.modify(&attr, QpAttrMask::RC_TO_RTS)?;
        Ok(())
    }

    /// Takes what the peer said in the handshake, and starts serving the connection:
    /// completions, the shared receive queue, asynchronous events.
    fn attach(self: &Arc<Self>, remote: &EndpointInfo) -> Result<()> {
        self.credits
            .add_permits(remote.recv_credits.min(Semaphore::MAX_PERMITS as u32) as usize);
        self.peer_max_message
            .store(remote.max_message, Ordering::Relaxed);
        self.peer_max_large_message
            .store(remote.max_large_message, Ordering::Relaxed);
        self.rdma.dispatcher().register(self, &self.cq)?;
        match (&self.srq, &self.rcq) {
            (Some(srq), _) => srq.attach(self)?,
            (None, Some(rcq)) => self.rdma.dispatcher().register(self, rcq)?,
            (None, None) => {}
        }
        self.rdma.watch(self);
        Ok(())
    }

    fn start_keepalive(self: &Arc<Self>) {
        if let (Some(every), Some(rt)) = (self.rdma.config().keepalive, self.runtime()) {
            rt.spawn(keepalive(Arc::downgrade(self), every));
        }
    }

    /// The listener's side, once the peer's hello has arrived: the QP goes to RTS, and
    /// the connection works as any other (keepalive, the hello's credit).
    fn confirm_up(self: &Arc<Self>, local: &EndpointInfo) -> Result<()> {
        self.check_open()?;
        self.to_rts(local)?;
        self.confirmed.store(true, Ordering::Release);
        self.start_keepalive();
        self.maybe_return_credits();
        tracing::debug!(qpn = self.qp.qp_num(), "connection confirmed");
        Ok(())
    }

    /// Collects completions by hand (the connection's and its shared receive queue's),
    /// first driving a device its user drives.
    pub(crate) fn poll_all(self: &Arc<Self>) -> usize {
        let ctx = self.rdma.context();
        if ctx.caller_driven()
            && let Err(e) = ctx.drive(Duration::ZERO)
        {
            tracing::warn!(error = %e, "driving the device failed");
        }
        let mut n = self.poll_cq();
        if let Some(srq) = &self.srq {
            n += srq.poll_cq();
        }
        n
    }

    fn post_recv(&self, index: u32) -> Result<()> {
        let sge = Sge {
            addr: self.recv_mr.addr() + (index as usize * self.recv_slot) as u64,
            length: self.recv_slot as u32,
            lkey: self.recv_mr.lkey(),
        };
        self.qp
            .post_recv(&[RecvWr {
                wr_id: RECV_TAG | u64::from(index),
                sg_list: &[sge],
            }])
            .map_err(|e| Error::Verbs(e.error))
    }

    /// What operations fail with once the connection is closed: why it closed
    /// ([`Error::Event`] if an asynchronous event ended it).
    pub(crate) fn closed_error(&self) -> Error {
        match lock(&self.closed).clone() {
            Some(CloseReason::Event(ev)) => Error::Event(ev),
            Some(reason) => Error::Closed(reason),
            None => Error::Closed(CloseReason::Local),
        }
    }

    /// An asynchronous event about this connection's QP or CQ (or its device): the
    /// connection is over, and its operations fail with [`Error::Event`].
    pub(crate) fn on_event(&self, ev: remem_verbs::AsyncEvent) {
        self.mark_closed(CloseReason::Event(ev));
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The runtime the connection was made on (the dispatcher may run on a thread of its
    /// own, outside it), else the current one.
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.rt
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
    }

    /// Whether an asynchronous event concerns this connection.
    pub(crate) fn concerns(&self, ev: &remem_verbs::AsyncEvent) -> bool {
        use remem_verbs::{AsyncEventElement as E, AsyncEventType as T};
        match (ev.event_type, ev.element) {
            // The QP went to the error state (a local error, or our responder NAKed the
            // peer's request; on a shared receive queue, LAST_WQE_REACHED says the same).
            (T::QpFatal | T::QpReqErr | T::QpAccessErr | T::QpLastWqeReached, E::Qp(n)) => {
                n == self.qp.qp_num()
            }
            (T::CqErr, E::Cq(id)) => {
                id == self.cq.id() || self.rcq.as_ref().is_some_and(|r| r.id() == id)
            }
            (T::DeviceFatal, _) => true,
            _ => false,
        }
    }

    /// Whether the connection is still open.
    pub(crate) fn is_open(&self) -> bool {
        !self.is_closed.load(Ordering::Acquire)
    }

    fn check_open(&self) -> Result<()> {
        if self.is_closed.load(Ordering::Acquire) {
            return Err(self.closed_error());
        }
        Ok(())
    }

    /// Marks the connection closed and moves the QP to ERR: every work request in flight
    /// completes with a flush error, and every waiter learns why.
    fn mark_closed(&self, reason: CloseReason) {
        if self.close_state(reason) {
            self.to_error();
        }
    }

    /// Ends the connection because of something this side found wrong (a protocol
    /// violation, a message above the limit; a `String` says what the peer sent that was
    /// malformed: [`ProtocolViolation::Malformed`]) or because it is dropped: tells the
    /// peer with a close message, and moves the QP to ERR once that message is out. A
    /// connection whose peer has not proven its address yet is ended without a word to it.
    pub(crate) fn end(self: &Arc<Self>, reason: impl Into<CloseReason>) {
        let reason = reason.into();
        if lock(&self.closed).is_some() {
            return;
        }
        if !self.confirmed.load(Ordering::Acquire) {
            return self.mark_closed(reason);
        }
        let told = self.post_control(Kind::Close, None).is_ok();
        if self.close_state(reason) && !told {
            self.to_error();
        }
    }

    /// Records why the connection closed and wakes every waiter; false if it already was.
    fn close_state(&self, reason: CloseReason) -> bool {
        {
            let mut c = lock(&self.closed);
            if c.is_some() {
                return false;
            }
            tracing::debug!(qpn = self.qp.qp_num(), %reason, "connection closed");
            *c = Some(reason.clone());
        }
        if let Some((_, tx)) = lock(&self.confirm).take() {
            let _ = tx.send(Err(reason));
        }
        // Leases and regions given away on this connection end with it (before anyone
        // learns that it has ended).
        self.agent.on_close();
        self.is_closed.store(true, Ordering::Release);
        self.ended.notify_waiters();
        self.sq.close();
        self.credits.close();
        self.rdv.close();
        lock(&self.rdv_out).clear();
        for n in [
            &self.messages.notify,
            &self.write_imms.notify,
            &self.tokens.notify,
            &self.agent.returned.notify,
            &self.agent.received.notify,
        ] {
            n.notify_waiters();
        }
        true
    }

    /// Moves the QP to ERR: every work request in flight completes with a flush error.
    /// After the peer's close: moves the QP to the error state once no work of ours is
    /// in flight.
    fn error_if_drained(&self) {
        if lock(&self.pending).is_empty() && self.error_when_drained.swap(false, Ordering::AcqRel) {
            self.to_error();
        }
    }

    fn to_error(&self) {
        // A connection made through the CM tells the peer's CM too (a DREQ).
        if let Some(link) = lock(&self.cm).as_ref() {
            link.disconnect();
        }
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = self.qp.modify(&err, QpAttrMask::STATE);
    }

    /// Arms the CQ for the next completion (`req_notify`).
    pub(crate) fn arm(&self) -> remem_verbs::Result<()> {
        self.cq.req_notify(false)?;
        match (&self.srq, &self.rcq) {
            (None, Some(rcq)) => rcq.req_notify(false),
            _ => Ok(()),
        }
    }

    /// The peer disconnected through the connection manager.
    pub(crate) fn peer_disconnected(&self) {
        self.mark_closed(CloseReason::Peer);
    }

    /// Ends the connection because this side can no longer serve it.
    pub(crate) fn fail_local(&self, reason: impl Into<CloseReason>) {
        self.mark_closed(reason.into());
    }

    /// Polls the CQ until it is empty; returns how many completions it handled.
    pub(crate) fn poll_cq(self: &Arc<Self>) -> usize {
        let mut total = self.poll_one_cq(&self.cq);
        match (&self.srq, &self.rcq) {
            (Some(_), _) => {} // the shared receive queue polls its own
            (None, Some(rcq)) => total += self.poll_one_cq(rcq),
            (None, None) => {}
        }
        total
    }

    fn poll_one_cq(self: &Arc<Self>, cq: &Arc<dyn CompletionQueue>) -> usize {
        let mut buf = [WorkCompletion::default(); MAX_PER_POLL];
        let wcs = &mut buf[..self.rdma.config().cqe_per_poll.clamp(1, MAX_PER_POLL)];
        let mut total = 0;
        loop {
            let n = match cq.poll(wcs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "polling a completion queue failed");
                    self.mark_closed(LocalFailure::CompletionQueue.into());
                    return total;
                }
            };
            for wc in &wcs[..n] {
                self.on_completion(wc);
            }
            if n > 0 {
                self.activity.fetch_add(n as u64, Ordering::Relaxed);
            }
            total += n;
            if n < wcs.len() {
                return total;
            }
        }
    }

    fn on_completion(self: &Arc<Self>, wc: &WorkCompletion) {
        if wc.wr_id & RECV_TAG != 0 {
            return self.on_receive(wc, (wc.wr_id & !RECV_TAG) as u32);
        }
        // (The pending map's lock is released before the unsignaled queue's is taken:
        // posting takes them in the other order.)
        let pending = lock(&self.pending).remove(&wc.wr_id);
        let Some(p) = pending else {
            // One posted to complete silently (signaled now and then, or failed).
            if self.release_unsignaled(wc.wr_id) && wc.status != WcStatus::Success {
                self.on_error_completion(wc);
            }
            return;
        };
        if let Some(upto) = p.release_upto {
            self.release_unsignaled(upto);
        }
        if p.close_msg {
            // This side is closing (`close`, a drop, a violation): closed before the QP
            // goes to the error state, so that its flushed receives end nothing.
            self.close_state(CloseReason::Local);
            self.to_error();
        }
        if p.credit_msg {
            self.credit_msg_busy.store(false, Ordering::Release);
            self.maybe_return_credits();
        }
        if wc.status != WcStatus::Success {
            self.on_error_completion(wc);
        }
        if self.error_when_drained.load(Ordering::Acquire) {
            self.error_if_drained();
        }
        if let Some(tx) = p.tx {
            // The slot's word (an atomic's result) is read before the slot is freed.
            let word = p
                ._keep
                ._slot
                .as_ref()
                .and_then(|g| self.slots.mr.load_u64(g.index as usize * 8).ok())
                .unwrap_or(0);
            let _ = tx.send((*wc, word));
        }
    }

    /// A work request failed. While the connection is open that ends it — a flush error
    /// too: the QP went to the error state without this side moving it there (e.g. its
    /// responder NAKed the peer's bad request), and a connection that can no longer send or
    /// receive must not look open.
    fn on_error_completion(&self, wc: &WorkCompletion) {
        if self.is_open() {
            self.mark_closed(CloseReason::Completion {
                op: wc.opcode,
                status: wc.status,
            });
        }
    }

    /// A receive into one of the connection's own buffers: its message is copied out and
    /// the buffer posted again at once (what the application has not taken is bounded by
    /// the credits).
    fn on_receive(self: &Arc<Self>, wc: &WorkCompletion, index: u32) {
        let ok = wc.status == WcStatus::Success;
        let message = (ok && wc.opcode != WcOpcode::RecvRdmaWithImm)
            .then(|| {
                let base = index as usize * self.recv_slot;
                read_message(&self.recv_mr, base, wc.byte_len as usize)
            })
            .flatten();
        if ok {
            let _ = self.post_recv(index);
        }
        self.on_received(wc, message);
    }

    /// A receive completed, its message (if it carried one) already copied out of the
    /// buffer — one of the connection's own or one of a shared receive queue's.
    pub(crate) fn on_received(self: &Arc<Self>, wc: &WorkCompletion, message: Option<Message0>) {
        if wc.status != WcStatus::Success {
            return self.on_error_completion(wc);
        }
        if wc.opcode == WcOpcode::RecvRdmaWithImm {
            if !self.take_credit() {
                return;
            }
            if self.awaits_hello() {
                return self.end(ProtocolViolation::Handshake);
            }
            self.write_imms.push(wc.imm_data);
            return;
        }
        match message {
            Some((hdr, data)) => self.on_message(hdr, data),
            None => self.end(ProtocolViolation::NoHeader),
        }
    }

    /// A message that consumes a credit arrived: false (and the connection closes) if the
    /// peer had none left.
    fn take_credit(self: &Arc<Self>) -> bool {
        let received = self.received.fetch_add(1, Ordering::AcqRel) + 1;
        let granted = self.granted.load(Ordering::Acquire);
        if received > granted {
            self.end(ProtocolViolation::CreditsExceeded { granted });
            return false;
        }
        true
    }

    /// Queues a message (or the place of a large one still being read) for the
    /// application: at the shared receive queue if the connection has one.
    fn deliver(&self, place: Place) {
        match &self.srq {
            Some(srq) => srq.messages.push((self.qp.qp_num(), place)),
            None => self.messages.push(place),
        }
    }

    fn notify_messages(&self) {
        let notify = match &self.srq {
            Some(srq) => &srq.messages.notify,
            None => &self.messages.notify,
        };
        notify.notify_waiters();
        notify.notify_one();
    }

    /// A message (header and data) arrived.
    fn on_message(self: &Arc<Self>, hdr: [u8; HDR], data: Vec<u8>) {
        let Some(kind) = Kind::from_u8(hdr[0]) else {
            return self.end(ProtocolViolation::UnknownKind(hdr[0]));
        };
        let credited = !matches!(kind, Kind::Credit | Kind::Close | Kind::RtsDone);
        if credited && !self.take_credit() {
            return;
        }
        let credits = u16::from_be_bytes([hdr[2], hdr[3]]);
        if credits > 0 {
            let returned = self
                .returned
                .fetch_add(u64::from(credits), Ordering::AcqRel)
                + u64::from(credits);
            if returned > self.spent.load(Ordering::Acquire) {
                return self.end(ProtocolViolation::CreditsOverReturned);
            }
            self.credits.add_permits(usize::from(credits));
        }
        let imm = (hdr[1] & 1 != 0).then(|| u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]));
        if kind == Kind::Hello || self.awaits_hello() {
            return self.on_hello(kind, &data);
        }
        match kind {
            Kind::Data => self.deliver(Arc::new(Mutex::new(Some(Arrived::new(Message {
                data,
                imm,
            }))))),
            Kind::Credit | Kind::Hello => {}
            Kind::MrToken => match RemoteMr::from_bytes(&data) {
                Some(t) => self.tokens.push(t),
                None => self.end("peer sent a malformed memory region token".to_string()),
            },
            Kind::Close => {
                // What this side posted before the close arrived may still wait for its
                // ACK (the peer's ACK can trail its close message on the wire): the QP
                // goes to the error state once that work has completed (or failed: the
                // transport's retries bound the wait), not under it.
                if self.close_state(CloseReason::Peer) {
                    self.error_when_drained.store(true, Ordering::Release);
                    self.error_if_drained();
                }
            }
            Kind::Rts => self.on_rts(&data, imm),
            Kind::Agent => {
                // Handled here, so its credit goes back at once.
                self.consumed();
                self.on_agent(&data);
            }
            Kind::RtsDone => {
                let rid = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
                if let Some(out) = lock(&self.rdv_out).remove(&rid) {
                    let _ = out.done.send(());
                }
            }
        }
    }

    /// Whether this is the listener's side, waiting for the peer's hello. (Once it has
    /// arrived, what follows it is served as usual, even before the QP is in RTS.)
    fn awaits_hello(&self) -> bool {
        !self.confirmed.load(Ordering::Acquire) && lock(&self.confirm).is_some()
    }

    /// The listener's side: the peer's first message must be the hello carrying the nonce
    /// this side sent over TCP, and there is no other hello.
    fn on_hello(self: &Arc<Self>, kind: Kind, data: &[u8]) {
        let waiting = lock(&self.confirm).take();
        match waiting {
            Some((nonce, tx)) if kind == Kind::Hello && data == nonce.to_be_bytes() => {
                // Its credit returns with the first message (or credit message) this side
                // sends once it may send.
                self.owed.fetch_add(1, Ordering::AcqRel);
                let _ = tx.send(Ok(()));
            }
            Some((nonce, tx)) => {
                *lock(&self.confirm) = Some((nonce, tx));
                self.end(ProtocolViolation::Handshake);
            }
            None => self.end(ProtocolViolation::Handshake),
        }
    }

    /// A large message announced: its place is kept in the order of messages, and it is
    /// read from the peer's memory on a task of its own as soon as the connection's
    /// large-message budget has room for it.
    fn on_rts(self: &Arc<Self>, payload: &[u8], imm: Option<u32>) {
        // (A token whose range wraps past 2^64 does not decode: `RemoteMr::decode`.)
        let (Some(rid), Some(token)) = (
            payload
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            payload.get(4..).and_then(RemoteMr::from_bytes),
        ) else {
            return self.end("peer announced a malformed large message".to_string());
        };
        let limit = self.rdma.config().max_large_message as u64;
        if token.len > limit {
            return self.end(ProtocolViolation::MessageTooLarge {
                len: token.len,
                max: limit,
            });
        }
        if self.runtime().is_none() {
            return self.fail_local(LocalFailure::NoRuntime);
        }
        let place = Arc::new(Mutex::new(None));
        let start = {
            let mut rdv = lock(&self.rdv_in);
            // The sender keeps at most RDV_MAX announcements unfinished; this side has not
            // said "done" for `reading` of them.
            if rdv.reading >= RDV_MAX {
                drop(rdv);
                return self.end(ProtocolViolation::TooManyLargeMessages { max: RDV_MAX });
            }
            rdv.reading += 1;
            self.deliver(place.clone());
            let a = Announced {
                rid,
                token,
                imm,
                place,
            };
            if rdv.waiting.is_empty() && rdv.held + token.len <= limit {
                rdv.held += token.len;
                Some(a)
            } else {
                rdv.waiting.push_back(a);
                None
            }
        };
        if let Some(a) = start {
            self.spawn_fetch(a);
        }
    }

    fn spawn_fetch(self: &Arc<Self>, a: Announced) {
        match self.runtime() {
            Some(rt) => {
                rt.spawn(self.clone().fetch_large(a));
            }
            None => self.fail_local(LocalFailure::NoRuntime),
        }
    }

    /// The application took a large message (or it was dropped): its bytes leave the
    /// budget, and announcements that now fit are read.
    fn release_large(self: &Arc<Self>, len: u64) {
        let limit = self.rdma.config().max_large_message as u64;
        let mut start = Vec::new();
        {
            let mut rdv = lock(&self.rdv_in);
            rdv.held -= len.min(rdv.held);
            while let Some(a) = rdv.waiting.front() {
                if rdv.held + a.token.len > limit {
                    break;
                }
                rdv.held += a.token.len;
                start.extend(rdv.waiting.pop_front());
            }
        }
        for a in start {
            self.spawn_fetch(a);
        }
    }

    async fn fetch_large(self: Arc<Self>, a: Announced) {
        let Announced {
            rid,
            token,
            imm,
            place,
        } = a;
        let read = async {
            let layout = std::alloc::Layout::from_size_align(token.len as usize, 1)
                .map_err(|_| CloseReason::Failed(LocalFailure::Memory))?;
            let dst = self
                .rdma
                .alloc_local_mr_uninit(layout)
                .map_err(|_| CloseReason::Failed(LocalFailure::Memory))?;
            let op = SendOp::RdmaRead {
                remote_addr: token.addr,
                rkey: token.rkey,
            };
            self.execute(op, vec![crate::mr::Local::span(&dst)], None, false, None)
                .await
                .map_err(|e| reason_of(&e))?;
            // Finished reading: the slot is free *before* the peer hears "done", since the
            // peer may announce its next large message as soon as it does (counted after
            // the post, that announcement could be taken for a fifth while the dispatcher
            // raced this task: seen on kernel rxe).
            lock(&self.rdv_in).reading -= 1;
            let permit = self.sq_entries(1).await.map_err(|e| reason_of(&e))?;
            self.post_control_with(Kind::RtsDone, Some(rid), permit)
                .map_err(|e| reason_of(&e))?;
            Ok::<_, CloseReason>(dst.to_vec())
        };
        match read.await {
            Ok(data) => {
                let hold = LargeHold {
                    conn: Arc::downgrade(&self),
                    len: token.len,
                };
                *lock(&place) = Some(Arrived {
                    msg: Message { data, imm },
                    _hold: Some(hold),
                });
                self.notify_messages();
            }
            Err(reason) => self.end(reason),
        }
    }

    /// The application took a message: its credit is owed to the peer.
    pub(crate) fn consumed(self: &Arc<Self>) {
        self.owed.fetch_add(1, Ordering::AcqRel);
        self.maybe_return_credits();
    }

    /// Sends a credit message when a quarter of the window is owed and none is in flight.
    fn maybe_return_credits(self: &Arc<Self>) {
        let owed = self.owed.load(Ordering::Acquire);
        if owed < (self.credit_window / 4).max(1)
            || self.is_closed.load(Ordering::Acquire)
            || self.credit_msg_busy.swap(true, Ordering::AcqRel)
        {
            return;
        }
        if self.post_control(Kind::Credit, None).is_err() {
            self.credit_msg_busy.store(false, Ordering::Release);
        }
    }

    /// Posts a message that needs no credit (it lands in a spare buffer) and no waiter,
    /// if a send-queue entry is free now (and the connection may send at all).
    fn post_control(self: &Arc<Self>, kind: Kind, imm: Option<u32>) -> Result<()> {
        if !self.confirmed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(
                "the peer has not confirmed the connection".into(),
            ));
        }
        let Ok(permit) = self.sq.clone().try_acquire_owned() else {
            return Err(if self.is_open() {
                Error::InvalidArgument("the send queue is full".into())
            } else {
                self.closed_error()
            });
        };
        self.post_control_with(kind, imm, permit)
    }

    /// [`ConnShared::post_control`] on a send-queue entry already taken.
    fn post_control_with(
        self: &Arc<Self>,
        kind: Kind,
        imm: Option<u32>,
        permit: OwnedSemaphorePermit,
    ) -> Result<()> {
        let Some((slot, hspan)) = self.slots.take() else {
            return Err(Error::InvalidArgument("no header slot is free".into()));
        };
        let credits = self.take_owed();
        self.slots
            .mr
            .write(hspan.offset, &header(kind, credits, imm))?;
        let sges = [hspan.sge()];
        let wr_id = self.track(Pending {
            tx: None,
            _keep: Keep {
                // A dropped connection stays alive until its close message is out, when a
                // dispatcher polls it (with Polling::Manual nothing would).
                _owner: (kind == Kind::Close
                    && self.rdma.config().polling != crate::rdma::Polling::Manual)
                    .then(|| self.clone()),
                _spans: vec![hspan],
                _sq: permit,
                _slot: Some(slot),
            },
            credit_msg: kind == Kind::Credit,
            close_msg: kind == Kind::Close,
            release_upto: None,
        });
        if let Err(e) = self
            .qp
            .post_send(&[SendWr::new(wr_id, SendOp::Send, &sges)])
        {
            lock(&self.pending).remove(&wr_id);
            self.untake_owed(credits);
            return Err(Error::Verbs(e.error));
        }
        Ok(())
    }

    /// Takes the credits owed to the peer (at most what a header carries) to return them:
    /// they count as granted from now on.
    fn take_owed(&self) -> u16 {
        let mut cur = self.owed.load(Ordering::Acquire);
        loop {
            let take = cur.min(u32::from(u16::MAX));
            match self
                .owed
                .compare_exchange(cur, cur - take, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // Granted before the peer can learn of them: a message it sends on
                    // them never finds them missing.
                    self.granted.fetch_add(u64::from(take), Ordering::AcqRel);
                    return take as u16;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Credits taken to return that did not go after all.
    fn untake_owed(&self, credits: u16) {
        self.granted.fetch_sub(u64::from(credits), Ordering::AcqRel);
        self.owed.fetch_add(u32::from(credits), Ordering::AcqRel);
    }

    /// Records a work request about to be posted under a fresh `wr_id`.
    fn track(&self, pending: Pending) -> u64 {
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        lock(&self.pending).insert(wr_id, pending);
        wr_id
    }

    /// Waits for `n` free send-queue entries (fails once the connection is closed).
    async fn sq_entries(&self, n: u32) -> Result<OwnedSemaphorePermit> {
        self.sq
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| self.closed_error())
    }

    /// Posts one signaled work request and waits for its completion; returns the word in
    /// its slot at completion (an atomic's result), 0 without a slot.
    async fn execute(
        self: &Arc<Self>,
        op: SendOp,
        spans: Vec<Span>,
        slot: Option<SlotGuard>,
        needs_credit: bool,
        header_at: Option<(usize, Kind, Option<u32>)>,
    ) -> Result<u64> {
        self.execute_flags(op, spans, slot, needs_credit, header_at, SendFlags::empty())
            .await
    }

    /// [`ConnShared::execute`] with extra send flags (FENCE).
    async fn execute_flags(
        self: &Arc<Self>,
        op: SendOp,
        spans: Vec<Span>,
        slot: Option<SlotGuard>,
        needs_credit: bool,
        header_at: Option<(usize, Kind, Option<u32>)>,
        flags: SendFlags,
    ) -> Result<u64> {
        self.check_open()?;
        let permit = self.sq_entries(1).await?;
        if needs_credit {
            self.credits
                .acquire()
                .await
                .map_err(|_| self.closed_error())?
                .forget();
            self.spent.fetch_add(1, Ordering::AcqRel);
        }
        // From here to the post nothing awaits: a dropped future cannot lose the credit.
        let mut credits = 0;
        if let Some((offset, kind, imm)) = header_at {
            credits = self.take_owed();
            self.slots.mr.write(offset, &header(kind, credits, imm))?;
        }
        let sges: Vec<Sge> = spans.iter().map(Span::sge).collect();
        let (tx, rx) = oneshot::channel();
        let mut pending = Pending::awaited(tx, spans, permit, slot);
        // Posted under the lock of the unsignaled queue, so that every unsignaled work
        // request in it went before this one: its completion releases them.
        let (wr_id, posted) = {
            let unsignaled = lock(&self.unsignaled);
            pending.release_upto = unsignaled.back().map(|(id, _)| *id);
            let wr_id = self.track(pending);
            let mut wr = SendWr::new(wr_id, op, &sges);
            wr.flags |= flags;
            (wr_id, self.qp.post_send(&[wr]))
        };
        if let Err(e) = posted {
            lock(&self.pending).remove(&wr_id);
            self.untake_owed(credits);
            if needs_credit {
                self.spent.fetch_sub(1, Ordering::AcqRel);
                self.credits.add_permits(1);
            }
            return Err(Error::Verbs(e.error));
        }
        self.outcome(rx).await
    }

    /// Waits for a posted work request's completion: its slot's word on success, else
    /// why it failed.
    async fn outcome(&self, rx: oneshot::Receiver<(WorkCompletion, u64)>) -> Result<u64> {
        let (wc, word) = rx.await.map_err(|_| self.closed_error())?;
        match wc.status {
            WcStatus::Success => Ok(word),
            WcStatus::WrFlushErr if self.is_closed.load(Ordering::Acquire) => {
                Err(self.closed_error())
            }
            status => Err(Error::Completion {
                op: wc.opcode,
                status,
                vendor_err: wc.vendor_err,
            }),
        }
    }

    /// Posts one work request that completes silently on success ("completion on error
    /// only") and returns once it is posted. Its memory stays referenced until a later
    /// signaled work request completes (RC completes in order); every `UNSIGNALED_EVERY`th
    /// is signaled anyway, with nobody waiting, so that the send queue drains. A failure
    /// completes it with an error, which closes the connection.
    async fn post_unsignaled(
        self: &Arc<Self>,
        op: SendOp,
        spans: Vec<Span>,
        slot: Option<SlotGuard>,
        flags: SendFlags,
    ) -> Result<()> {
        self.check_open()?;
        let permit = self.sq_entries(1).await?;
        let sges: Vec<Sge> = spans.iter().map(Span::sge).collect();
        let keep = Keep {
            _owner: None,
            _spans: spans,
            _sq: permit,
            _slot: slot,
        };
        let depth = self.qp.cap().max_send_wr.max(2);
        let every = u64::from(depth / 2);
        let mut unsignaled = lock(&self.unsignaled);
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let signal = (unsignaled.len() as u64 + 1).is_multiple_of(every);
        let mut wr = SendWr::new(wr_id, op, &sges);
        wr.flags = flags;
        if signal {
            wr.flags |= SendFlags::SIGNALED;
        }
        self.qp
            .post_send(&[wr])
            .map_err(|e| Error::Verbs(e.error))?;
        unsignaled.push_back((wr_id, keep));
        Ok(())
    }

    /// Releases the unsignaled work requests up to and including `wr_id` (they completed:
    /// a work request posted after them did). Returns whether `wr_id` itself was one.
    fn release_unsignaled(&self, wr_id: u64) -> bool {
        let mut q = lock(&self.unsignaled);
        let mut found = false;
        while q.front().is_some_and(|(id, _)| *id <= wr_id) {
            found |= q.pop_front().is_some_and(|(id, _)| id == wr_id);
        }
        found
    }

    /// Posts `ops` with one `post_send`, only the last signaled (RC completes in order, so
    /// its completion means all are done; an error completes the failing one), and waits.
    async fn execute_batch(self: &Arc<Self>, ops: Vec<(SendOp, Span)>) -> Result<()> {
        let n = ops.len();
        if n == 0 {
            return Ok(());
        }
        let max = self.qp.cap().max_send_wr as usize;
        if n > max {
            return Err(Error::InvalidArgument(format!(
                "a batch of {n} work requests exceeds the send queue ({max})"
            )));
        }
        self.check_open()?;
        let permit = self.sq_entries(n as u32).await?;
        let sges: Vec<[Sge; 1]> = ops.iter().map(|(_, span)| [span.sge()]).collect();
        let (send_ops, spans): (Vec<SendOp>, Vec<Span>) = ops.into_iter().unzip();
        let (tx, rx) = oneshot::channel();
        let wr_id = self.track(Pending::awaited(tx, spans, permit, None));
        let wrs: Vec<SendWr<'_>> = send_ops
            .iter()
            .zip(&sges)
            .enumerate()
            .map(|(i, (op, sge))| {
                let mut wr = SendWr::new(wr_id, *op, sge);
                if i + 1 < n {
                    wr.flags = remem_verbs::SendFlags::empty();
                }
                wr
            })
            .collect();
        if let Err(e) = self.qp.post_send(&wrs) {
            if e.index == 0 {
                lock(&self.pending).remove(&wr_id);
            } else {
                // Part of the batch went, unsignaled: end the connection so that what went
                // is flushed and its memory released.
                tracing::warn!(index = e.index, error = %e.error, "a batch failed part-way");
                self.end(LocalFailure::Post);
            }
            return Err(Error::Verbs(e.error));
        }
        self.outcome(rx).await.map(drop)
    }

    async fn slot(self: &Arc<Self>) -> Result<(SlotGuard, Span)> {
        // There are as many slots as send-queue entries; one is free unless every entry is
        // in flight, and then one frees when a completion arrives.
        loop {
            if let Some(s) = self.slots.take() {
                return Ok(s);
            }
            self.check_open()?;
            let permit = self.sq.acquire().await.map_err(|_| self.closed_error())?;
            drop(permit);
            tokio::task::yield_now().await;
        }
    }

    /// Sends a message that fits the peer's receive buffers.
    pub(crate) async fn send_eager(
        self: &Arc<Self>,
        src: Option<Span>,
        kind: Kind,
        imm: Option<u32>,
    ) -> Result<()> {
        let (slot, hspan) = self.slot().await?;
        let offset = hspan.offset;
        let spans = std::iter::once(hspan).chain(src).collect();
        self.execute(
            SendOp::Send,
            spans,
            Some(slot),
            true,
            Some((offset, kind, imm)),
        )
        .await
        .map(drop)
    }

    /// Sends `bytes` as one message of `kind` (from a registered scratch region).
    pub(crate) async fn send_bytes(self: &Arc<Self>, kind: Kind, bytes: Vec<u8>) -> Result<()> {
        let scratch = register(
            self.rdma.pd(),
            MemoryBuffer::from_vec(bytes),
            AccessFlags::LOCAL_WRITE,
        )?;
        self.send_eager(Some(crate::mr::Local::span(&scratch)), kind, None)
            .await
    }

    /// Takes the item at the front of `inbox` once `ready` gives it (waiting while the
    /// inbox is empty or its front is not ready).
    pub(crate) async fn take<T, R>(
        self: &Arc<Self>,
        inbox: &Inbox<T>,
        ready: impl Fn(&mut T) -> Option<R>,
    ) -> Result<R> {
        loop {
            let notified = inbox.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let taken = {
                let mut q = lock(&inbox.queue);
                let r = q.front_mut().and_then(&ready);
                if r.is_some() {
                    q.pop_front();
                }
                r
            };
            if let Some(r) = taken {
                if inbox.credited {
                    self.consumed();
                }
                return Ok(r);
            }
            self.check_open()?;
            notified.await;
        }
    }
}

/// Why the connection ends, from an operation's error.
fn reason_of(e: &Error) -> CloseReason {
    match e {
        Error::Closed(r) => r.clone(),
        Error::Event(ev) => CloseReason::Event(*ev),
        Error::Completion { op, status, .. } => CloseReason::Completion {
            op: *op,
            status: *status,
        },
        _ => CloseReason::Failed(LocalFailure::Post),
    }
}

/// A received message: its header and its data.
pub(crate) type Message0 = ([u8; HDR], Vec<u8>);

/// Reads the message of `len` bytes at `base` of `mr`: `None` if it has no header.
pub(crate) fn read_message(mr: &LocalMr, base: usize, len: usize) -> Option<Message0> {
    let mut hdr = [0u8; HDR];
    if len < HDR || mr.read(base, &mut hdr).is_err() {
        return None;
    }
    let mut data = vec![0u8; len - HDR];
    mr.read(base + HDR, &mut data).ok()?;
    Some((hdr, data))
}

fn header(kind: Kind, credits: u16, imm: Option<u32>) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind as u8;
    h[1] = u8::from(imm.is_some());
    h[2..4].copy_from_slice(&credits.to_be_bytes());
    h[4..].copy_from_slice(&imm.unwrap_or(0).to_be_bytes());
    h
}

fn check_remote(local: usize, remote: &RemoteMr) -> Result<()> {
    if local as u64 != remote.len {
        return Err(Error::LengthMismatch {
            local: local as u64,
            remote: remote.len,
        });
    }
    if local > 1 << 31 {
        return Err(Error::InvalidArgument(format!(
            "{local} bytes exceed the 2^31-byte limit of one RDMA operation"
        )));
    }
    Ok(())
}

/// A one-sided operation on a peer's region.
#[derive(Clone, Copy)]
enum OneSided {
    Write,
    WriteImm(u32),
    Read,
}

impl OneSided {
    /// The work request's operation for `len` local bytes, once the lengths are checked.
    fn op(self, len: usize, remote: &RemoteMr) -> Result<SendOp> {
        check_remote(len, remote)?;
        let (remote_addr, rkey) = (remote.addr, remote.rkey);
        Ok(match self {
            OneSided::Write => SendOp::RdmaWrite { remote_addr, rkey },
            OneSided::WriteImm(imm) => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            OneSided::Read => SendOp::RdmaRead { remote_addr, rkey },
        })
    }
}

fn check_atomic(remote: &RemoteMr) -> Result<()> {
    if remote.len != 8 || !remote.addr.is_multiple_of(8) {
        return Err(Error::InvalidArgument(format!(
            "atomics act on 8 aligned bytes, not {} bytes at {:#x}",
            remote.len, remote.addr
        )));
    }
    Ok(())
}

impl Connection {
    /// Writes `src` into the peer's `dst` (RDMA WRITE); lengths must match.
    pub async fn write(&self, src: &impl Local, dst: &RemoteMr) -> Result<()> {
        self.one_sided(OneSided::Write, src.span(), dst).await
    }

    /// Writes `src` into the peer's `dst` and hands `imm` to the peer's
    /// [`Connection::receive_write_imm`] (RDMA WRITE_WITH_IMM).
    pub async fn write_with_imm(&self, src: &impl Local, dst: &RemoteMr, imm: u32) -> Result<()> {
        self.one_sided(OneSided::WriteImm(imm), src.span(), dst)
            .await
    }

    /// Reads the peer's `src` into `dst` (RDMA READ); lengths must match.
    pub async fn read(&self, dst: &mut impl LocalMut, src: &RemoteMr) -> Result<()> {
        self.one_sided(OneSided::Read, dst.span(), src).await
    }

    /// Writes the concatenation of `srcs` into the peer's `dst` with one RDMA WRITE (a
    /// gather list); the total length must match.
    pub async fn write_gather(&self, srcs: &[&dyn Local], dst: &RemoteMr) -> Result<()> {
        let spans = srcs.iter().map(|s| s.span()).collect();
        self.one_sided_sg(OneSided::Write, spans, dst).await
    }

    /// Reads the peer's `src` into `dsts` one after the other with one RDMA READ (a
    /// scatter list); the total length must match.
    pub async fn read_scatter(&self, dsts: &mut [&mut dyn LocalMut], src: &RemoteMr) -> Result<()> {
        let spans = dsts.iter().map(|d| d.span()).collect();
        self.one_sided_sg(OneSided::Read, spans, src).await
    }

    async fn one_sided(&self, kind: OneSided, span: Span, remote: &RemoteMr) -> Result<()> {
        self.one_sided_sg(kind, vec![span], remote).await
    }

    async fn one_sided_sg(
        &self,
        kind: OneSided,
        spans: Vec<Span>,
        remote: &RemoteMr,
    ) -> Result<()> {
        let max = self.shared.qp.cap().max_send_sge as usize;
        if spans.is_empty() || spans.len() > max {
            return Err(Error::InvalidArgument(format!(
                "{} scatter/gather entries; this connection takes 1 to {max} (RdmaBuilder::qp_cap)",
                spans.len()
            )));
        }
        let total = spans.iter().map(|s| s.len).sum();
        let op = kind.op(total, remote)?;
        // WRITE_WITH_IMM consumes a receive at the peer: it needs a credit.
        let credit = matches!(kind, OneSided::WriteImm(_));
        self.shared
            .execute(op, spans, None, credit, None)
            .await
            .map(drop)
    }

    async fn atomic(&self, op: SendOp) -> Result<u64> {
        let (slot, span) = self.shared.slot().await?;
        self.shared
            .execute(op, vec![span], Some(slot), false, None)
            .await
    }

    /// Compares the peer's 8-byte word at `dst` with `compare` and, if equal, replaces it
    /// with `swap`; returns the value it held (ATOMIC CMP_AND_SWP).
    pub async fn compare_and_swap(&self, dst: &RemoteMr, compare: u64, swap: u64) -> Result<u64> {
        check_atomic(dst)?;
        self.atomic(SendOp::AtomicCmpAndSwp {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            compare,
            swap,
        })
        .await
    }

    /// Adds `add` to the peer's 8-byte word at `dst`; returns the value it held (ATOMIC
    /// FETCH_AND_ADD).
    pub async fn fetch_and_add(&self, dst: &RemoteMr, add: u64) -> Result<u64> {
        check_atomic(dst)?;
        self.atomic(SendOp::AtomicFetchAndAdd {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            add,
        })
        .await
    }

    /// Makes the writes this connection did to the peer's `dst` visible at the peer
    /// ([`FlushType::Visibility`]) or durable there ([`FlushType::Persistent`]), as
    /// librpma's `rpma_flush` does; returns once they are.
    ///
    /// With a device that does RoCEv2 FLUSH and a region registered for that placement
    /// ([`RemoteMr::supports_flush`]), one FLUSH request does it: the peer executes it after
    /// every earlier request of the connection, and for a persistent flush writes the
    /// range back to its file ([`crate::Rdma::register_file`]) before answering.
    /// Otherwise remem falls back to librpma's method: a small RDMA READ from `dst`, whose
    /// answer comes after the earlier writes were placed (needs REMOTE_READ on the
    /// region); for [`FlushType::Persistent`] that is only enough where the peer declared
    /// that its writes go straight to persistent memory ([`PeerConfig`],
    /// [`Connection::apply_peer_config`]), and is an [`Error::Unsupported`] otherwise.
    pub async fn flush(&self, dst: &RemoteMr, flush: FlushType) -> Result<()> {
        let sh = &self.shared;
        if dst.len > 1 << 31 {
            return Err(Error::InvalidArgument(format!(
                "{} bytes exceed the 2^31-byte limit of one FLUSH",
                dst.len
            )));
        }
        let native = match flush {
            FlushType::Visibility => sh.caps.flush_global,
            FlushType::Persistent => sh.caps.flush_persistent,
        };
        if native && dst.supports_flush(flush) {
            let op = SendOp::Flush {
                remote_addr: dst.addr,
                rkey: dst.rkey,
                len: dst.len as u32,
                flush_type: match flush {
                    FlushType::Visibility => remem_verbs::FlushType::Global,
                    FlushType::Persistent => remem_verbs::FlushType::Persistent,
                },
                level: remem_verbs::FlushLevel::Range,
            };
            return sh.execute(op, vec![], None, false, None).await.map(drop);
        }
        if flush == FlushType::Persistent && !lock(&sh.peer_cfg).direct_write_to_pmem {
            return Err(Error::Unsupported(
                "persistent flush: the region takes no FLUSH (or the device has none) and \
                 the peer did not declare direct writes to persistent memory"
                    .into(),
            ));
        }
        if !dst.access.contains(AccessFlags::REMOTE_READ) {
            return Err(Error::Unsupported(
                "flush without RoCEv2 FLUSH reads the region, which grants no REMOTE_READ".into(),
            ));
        }
        // The READ's answer leaves the peer after every earlier write was placed.
        let (slot, span) = sh.slot().await?;
        let len = dst.len.min(8) as usize;
        let span = Span { len, ..span };
        let op = SendOp::RdmaRead {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        };
        sh.execute(op, vec![span], Some(slot), false, None)
            .await
            .map(drop)
    }

    /// Writes `value` into the peer's 8-byte aligned word `dst` in one piece, after every
    /// earlier operation of this connection (librpma's `rpma_atomic_write`): a RoCEv2
    /// ATOMIC WRITE where the device has it, else an 8-byte RDMA WRITE with FENCE. The 8
    /// bytes land in this machine's byte order, as a `u64` stored here would.
    pub async fn atomic_write(&self, dst: &RemoteMr, value: u64) -> Result<()> {
        check_atomic(dst)?;
        let sh = &self.shared;
        let (slot, span) = sh.slot().await?;
        sh.slots.mr.store_u64(span.offset, value)?;
        let (op, flags) = if sh.caps.atomic_write {
            let op = SendOp::AtomicWrite {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            };
            (op, SendFlags::empty())
        } else {
            let op = SendOp::RdmaWrite {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            };
            (op, SendFlags::FENCE)
        };
        sh.execute_flags(op, vec![span], Some(slot), false, None, flags)
            .await
            .map(drop)
    }

    /// Posts an RDMA WRITE of `src` into `dst` that completes silently ("completion on
    /// error only", librpma's `RPMA_F_COMPLETION_ON_ERROR`): returns once it is posted.
    /// A later operation that completes (e.g. [`Connection::flush`]) means this one is done
    /// too; if it fails, the connection closes and later operations fail. Change `src`
    /// only after such a later completion: the NIC may still be reading it (a race on
    /// values, never undefined behaviour). Its memory stays registered until then.
    pub async fn post_write(&self, src: &impl Local, dst: &RemoteMr) -> Result<()> {
        let span = src.span();
        let op = OneSided::Write.op(span.len, dst)?;
        self.shared
            .post_unsignaled(op, vec![span], None, SendFlags::empty())
            .await
    }

    /// Applies what the peer declared about its memory (decoded from its
    /// [`PeerConfig::descriptor`]): decides how [`Connection::flush`] makes data
    /// persistent when the region takes no RoCEv2 FLUSH.
    pub fn apply_peer_config(&self, cfg: PeerConfig) {
        *lock(&self.shared.peer_cfg) = cfg;
    }

    async fn send_message(&self, src: Option<Span>, kind: Kind, imm: Option<u32>) -> Result<()> {
        let len = src.as_ref().map_or(0, |s| s.len);
        let max = self.shared.peer_max_message.load(Ordering::Relaxed) as usize;
        if len > max {
            return match (kind, src) {
                (Kind::Data, Some(src)) => self.send_large(src, imm).await,
                _ => Err(Error::MessageTooLarge { len, max }),
            };
        }
        self.shared.send_eager(src, kind, imm).await
    }

    /// A message larger than the peer's receive buffers: the peer is told where it is
    /// (its range registered for remote reads only), reads it with RDMA READ, and says
    /// when it is done; then the registration ends.
    async fn send_large(&self, src: Span, imm: Option<u32>) -> Result<()> {
        let sh = &self.shared;
        let max = (sh.peer_max_large_message.load(Ordering::Relaxed) as usize).min(1 << 31);
        if src.len > max {
            return Err(Error::MessageTooLarge { len: src.len, max });
        }
        let permit = sh
            .rdv
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sh.closed_error())?;
        let mr = sh
            .rdma
            .pd()
            .reg_mr(src.region()?, AccessFlags::REMOTE_READ)?;
        let token = RemoteMr {
            addr: mr.addr(),
            len: src.len as u64,
            rkey: mr.rkey(),
            access: AccessFlags::REMOTE_READ,
        };
        let rid = sh.next_rid.fetch_add(1, Ordering::Relaxed);
        let mut announce = rid.to_be_bytes().to_vec();
        announce.extend_from_slice(&token.to_bytes());
        let scratch = register(
            sh.rdma.pd(),
            MemoryBuffer::from_vec(announce),
            AccessFlags::LOCAL_WRITE,
        )?;
        let (done, finished) = oneshot::channel();
        // The entry, not this future, keeps the source registered: if the future is
        // dropped, the peer can still read until it says it is done.
        lock(&sh.rdv_out).insert(
            rid,
            RdvOut {
                done,
                _mr: mr,
                _span: src,
                _permit: permit,
            },
        );
        let announced = sh
            .send_eager(Some(crate::mr::Local::span(&scratch)), Kind::Rts, imm)
            .await;
        if let Err(e) = announced {
            lock(&sh.rdv_out).remove(&rid);
            return Err(e);
        }
        finished.await.map_err(|_| sh.closed_error())
    }

    /// Sends `src` as one message (SEND); the peer takes it with [`Connection::receive`].
    /// Waits for a credit when the peer has no free receive buffer for it. A message
    /// larger than the peer's receive buffers ([`crate::RdmaBuilder::max_message`]) is
    /// read by the peer straight from `src` (RDMA READ), up to 2^31 bytes; the future
    /// ends when the peer has it. A message larger than the peer accepts (its
    /// [`crate::RdmaBuilder::max_large_message`]) is an [`Error::MessageTooLarge`], and
    /// nothing is sent.
    pub async fn send(&self, src: &impl Local) -> Result<()> {
        self.send_message(Some(src.span()), Kind::Data, None).await
    }

    /// Sends `src` with immediate data `imm` (SEND_WITH_IMM).
    pub async fn send_with_imm(&self, src: &impl Local, imm: u32) -> Result<()> {
        self.send_message(Some(src.span()), Kind::Data, Some(imm))
            .await
    }

    /// The next message the peer sent. (On a connection with a shared receive queue,
    /// messages arrive at [`Srq::receive`] instead: this is an error there.)
    pub async fn receive(&self) -> Result<Message> {
        if self.shared.srq.is_some() {
            return Err(Error::InvalidArgument(
                "this connection's messages arrive at its shared receive queue (Srq::receive)"
                    .into(),
            ));
        }
        let arrived = self
            .shared
            .take(&self.shared.messages, |m| lock(m).take())
            .await?;
        // (A large message's share of the budget goes back as `arrived` is dropped.)
        Ok(arrived.msg)
    }

    /// The immediate data of the next RDMA WRITE_WITH_IMM the peer did.
    pub async fn receive_write_imm(&self) -> Result<u32> {
        self.shared
            .take(&self.shared.write_imms, |i| Some(*i))
            .await
    }

    /// Shares `mr` with the peer while this side keeps it: the peer receives a token
    /// ([`Connection::receive_shared_mr`]) with which it reaches the whole region with the
    /// rights `mr` was registered with, for as long as `mr` lives. To give a region away
    /// (ownership passes), use [`Connection::send_local_mr`].
    pub async fn share_local_mr(&self, mr: &LocalMr) -> Result<()> {
        let token = mr.token(self.shared.rdma.pd())?.to_bytes();
        self.shared.send_bytes(Kind::MrToken, token.to_vec()).await
    }

    /// The next memory region the peer shared with [`Connection::share_local_mr`].
    pub async fn receive_shared_mr(&self) -> Result<RemoteMr> {
        self.shared.take(&self.shared.tokens, |t| Some(*t)).await
    }

    /// Handles the completions that have arrived; returns how many. Only needed with
    /// [`Polling::Manual`] (elsewhere the dispatcher does it). On a device that its user
    /// drives ([`Context::caller_driven`](remem_verbs::Context::caller_driven)), first moves
    /// its packets, without waiting.
    pub fn poll_completions(&self) -> usize {
        self.shared.poll_all()
    }

    /// A batch of one-sided operations posted together, with only the last signaled: for
    /// throughput, one doorbell and one completion per batch. Memory added to the batch
    /// stays borrowed until the batch is done.
    pub fn batch<'m>(&self) -> Batch<'_, 'm> {
        Batch {
            conn: self,
            ops: Vec::new(),
            _borrows: std::marker::PhantomData,
        }
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
        *lock(&self.shared.peer_private_data) = pd;
    }

    /// Ties the connection to the CM id that made it: closing it disconnects the id, and
    /// the peer's disconnect (an event on `rx`) closes it.
    pub(crate) fn attach_cm(
        &self,
        link: crate::cm::CmLink,
        rx: tokio::sync::mpsc::UnboundedReceiver<remem_verbs::CmEvent>,
    ) {
        *lock(&self.shared.cm) = Some(link);
        tokio::spawn(crate::cm::watch(Arc::downgrade(&self.shared), rx));
    }

    /// Whether the connection is closed, and why.
    pub fn closed(&self) -> Option<CloseReason> {
        lock(&self.shared.closed).clone()
    }

    /// Closes the connection: tells the peer (best effort), then fails every pending
    /// operation on both sides with [`Error::Closed`].
    pub async fn close(&self) {
        if self.shared.is_closed.load(Ordering::Acquire) {
            return;
        }
        // The close message lands in a spare buffer; wait (bounded) for it to be acked so
        // the peer learns before our QP stops.
        let sent = self.shared.post_control(Kind::Close, None);
        if sent.is_ok() {
            let deadline = Instant::now() + Duration::from_secs(1);
            while Instant::now() < deadline && self.shared.sq.available_permits() < self.sq_depth()
            {
                if self.shared.rdma.config().polling == Polling::Manual {
                    self.poll_completions();
                }
                tokio::task::yield_now().await;
            }
        }
        self.shared.mark_closed(CloseReason::Local);
    }

    /// The private data the peer sent when the connection was made
    /// ([`ConnectOptions::private_data`]); empty if none.
    pub fn peer_private_data(&self) -> Vec<u8> {
        lock(&self.shared.peer_private_data).clone()
    }

    /// The connection's next event (librpma's `rpma_conn_next_event`): first
    /// [`ConnectionEvent::Established`], then, once it ends, [`ConnectionEvent::Closed`]
    /// (in order, by either side) or [`ConnectionEvent::Lost`] (and that again on every
    /// later call).
    pub async fn next_event(&self) -> ConnectionEvent {
        let sh = &self.shared;
        if !sh.established_told.swap(true, Ordering::AcqRel) {
            return ConnectionEvent::Established;
        }
        loop {
            let ended = sh.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if sh.is_closed.load(Ordering::Acquire) {
                return match lock(&sh.closed).clone() {
                    Some(r) if !r.is_graceful() => ConnectionEvent::Lost(r),
                    _ => ConnectionEvent::Closed,
                };
            }
            ended.await;
        }
    }

    fn sq_depth(&self) -> usize {
        self.shared.qp.cap().max_send_wr as usize
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Tell the peer; the QP goes to ERR once the close message is out (going to ERR
        // now would flush the message before it leaves).
        self.shared.end(CloseReason::Local);
    }
}

/// Probes an idle connection: after a period with no completion, a message the peer must
/// acknowledge (a credit message returning nothing). A peer that is gone never does, the
/// transport's retries run out, and the connection fails — so a side that only waits
/// (`receive`) learns that its peer died.
async fn keepalive(weak: Weak<ConnShared>, every: Duration) {
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(every).await;
        let Some(s) = weak.upgrade() else { return };
        if s.is_closed.load(Ordering::Acquire) {
            return;
        }
        let now = s.activity.load(Ordering::Relaxed);
        if now == last
            && !s.credit_msg_busy.swap(true, Ordering::AcqRel)
            && s.post_control(Kind::Credit, None).is_err()
        {
            s.credit_msg_busy.store(false, Ordering::Release);
        }
        last = now;
    }
}

/// One-sided operations posted together ([`Connection::batch`]): RDMA WRITEs and READs,
/// checked as they are added, posted with one call when submitted, and complete together.
#[derive(Debug)]
pub struct Batch<'c, 'm> {
    conn: &'c Connection,
    ops: Vec<(SendOp, Span)>,
    _borrows: std::marker::PhantomData<&'m mut ()>,
}

impl<'m> Batch<'_, 'm> {
    /// Adds an RDMA WRITE of `src` into `dst` (lengths must match).
    pub fn write(&mut self, src: &'m impl Local, dst: &RemoteMr) -> Result<&mut Self> {
        self.add(OneSided::Write, src.span(), dst)
    }

    /// Adds an RDMA READ of `src` into `dst` (lengths must match).
    pub fn read(&mut self, dst: &'m mut impl LocalMut, src: &RemoteMr) -> Result<&mut Self> {
        self.add(OneSided::Read, dst.span(), src)
    }

    fn add(&mut self, kind: OneSided, span: Span, remote: &RemoteMr) -> Result<&mut Self> {
        let op = kind.op(span.len, remote)?;
        self.ops.push((op, span));
        Ok(self)
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Posts the batch and waits until every operation is done; the first error fails it
    /// (and, as for any RC error, the connection).
    pub async fn submit(self) -> Result<()> {
        self.conn.shared.execute_batch(self.ops).await
    }
}
