//! The entry point: [`Rdma`] (an open device with a protection domain), built by
//! [`RdmaBuilder`], and [`Listener`](crate::Listener).

pub use crate::dispatch::Polling;
use crate::error::{Error, HandshakeError, Result};
use crate::mr::{LocalMr, register};
use remem_verbs::AsyncEvent;
use remem_verbs::{AccessFlags, Context, Gid, MemoryBuffer, Mtu, ProtectionDomain, QpCap};
use std::alloc::Layout;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// Configuration of an [`Rdma`]: device, port, queue sizes, QP attributes, access rights
/// and polling. Every setter has a default an RDMA user would expect.
#[derive(Debug, Clone)]
pub struct RdmaBuilder {
    pub(crate) device: Option<String>,
    pub(crate) port: u8,
    pub(crate) gid_index: Option<u8>,
    pub(crate) cq_size: u32,
    pub(crate) cqe_per_poll: usize,
    pub(crate) cap: QpCap,
    pub(crate) mtu: Option<Mtu>,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) sq_psn: Option<u32>,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) access: AccessFlags,
    pub(crate) polling: Polling,
    pub(crate) max_message: usize,
    pub(crate) max_large_message: usize,
    pub(crate) recv_depth: u32,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_handshakes: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) max_lease: Duration,
    pub(crate) lend_limit: usize,
    pub(crate) lend_count_limit: usize,
    pub(crate) context: Option<OpenDevice>,
}

/// A device opened by the application, given to [`RdmaBuilder::context`].
#[derive(Clone)]
pub(crate) struct OpenDevice(pub(crate) Arc<dyn Context>);

impl std::fmt::Debug for OpenDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.info().name)
    }
}

impl Default for RdmaBuilder {
    fn default() -> Self {
        RdmaBuilder {
            device: None,
            port: 1,
            gid_index: None,
            cq_size: 1024,
            cqe_per_poll: 16,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 0,
                max_send_sge: 8,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            mtu: None,
            timeout: 16,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            sq_psn: None,
            keepalive: Some(Duration::from_secs(2)),
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::FLUSH_GLOBAL
                | AccessFlags::FLUSH_PERSISTENT,
            polling: Polling::Event,
            max_message: 64 * 1024,
            max_large_message: 16 << 20,
            recv_depth: 32,
            handshake_timeout: Duration::from_secs(10),
            max_handshakes: 64,
            request_timeout: Duration::from_secs(10),
            max_lease: Duration::from_secs(600),
            lend_limit: 64 << 20,
            lend_count_limit: 1024,
            context: None,
        }
    }
}

impl RdmaBuilder {
    /// Defaults: the first device (`REMEM_DEVICE` overrides), port 1, the first RoCE v2
    /// GID, event-driven polling, 256 send WRs, 32 receive credits of 64 KiB messages.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses a device the application opened itself (for example a soft device with options
    /// of its own, such as `SoftOptions::inline`) instead of opening one by name. A device
    /// its user drives ([`Context::caller_driven`]) needs [`Polling::Busy`] (the polling
    /// thread drives it) or [`Polling::Manual`] ([`Connection::poll_completions`](crate::Connection::poll_completions) does).
    pub fn context(mut self, ctx: Arc<dyn Context>) -> Self {
        self.context = Some(OpenDevice(ctx));
        self
    }

    /// The device to open, by name (`soft-lo`, `soft@127.0.0.1:4791`, `rxe0`, `mlx5_0`…).
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self
    }

    /// The port (default 1).
    pub fn port(mut self, port: u8) -> Self {
        self.port = port;
        self
    }

    /// The GID index (default: the first RoCE v2 GID, IPv4 preferred).
    pub fn gid_index(mut self, index: u8) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// Entries of each connection's completion queue (at least its queues' depths).
    pub fn cq_size(mut self, entries: u32) -> Self {
        self.cq_size = entries;
        self
    }

    /// Completions taken per poll call (default 16, at most 64).
    pub fn cqe_per_poll(mut self, n: usize) -> Self {
        self.cqe_per_poll = n;
        self
    }

    /// Queue pair capacities (send WRs bound the operations in flight per connection).
    pub fn qp_cap(mut self, cap: QpCap) -> Self {
        self.cap = cap;
        self
    }

    /// Path MTU (default: the port's active MTU, lowered to the peer's).
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (default 16, about 268 ms). With
    /// [`RdmaBuilder::retry_cnt`] it bounds how long a peer may answer nothing before the
    /// connection fails: (retry_cnt + 1) × 4.096 µs × 2^timeout, 2.1 s by default — so a
    /// peer that stops for a second (a soft device's process stopped by a debugger or
    /// descheduled stops its NIC too) does not break the connection. The price: a lost
    /// packet that nothing follows (the last of a burst) is resent only after the timeout,
    /// so on a lossy network a lower value (14, about 67 ms, the old default) recovers
    /// faster, and a peer pausing longer than 8 of them fails. Per connection:
    /// [`ConnectOptions::timeout`](crate::ConnectOptions::timeout).
    pub fn timeout(mut self, timeout: u8) -> Self {
        self.timeout = timeout;
        self
    }

    /// Transport retries (default 7, the most RC allows): see [`RdmaBuilder::timeout`].
    pub fn retry_cnt(mut self, n: u8) -> Self {
        self.retry_cnt = n;
        self
    }

    /// RNR retries (default 7: infinite).
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }

    /// Minimum RNR NAK timer code (default 12, 0.64 ms).
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.min_rnr_timer = code;
        self
    }

    /// The first PSN this side sends (24 bits; default: random per connection). The peer
    /// learns it in the handshake, as its receive PSN.
    pub fn sq_psn(mut self, psn: u32) -> Self {
        self.sq_psn = Some(psn & 0x00ff_ffff);
        self
    }

    /// How long a connection may go without a completion before it probes its peer
    /// (default 2 s; `None`: never). A peer that is gone then fails the connection after
    /// the transport's retries (`timeout`, `retry_cnt`), even if this side only waits.
    pub fn keepalive(mut self, every: Option<Duration>) -> Self {
        self.keepalive = every;
        self
    }

    /// READs and atomics in flight, each way (default 16).
    pub fn max_rd_atomic(mut self, n: u8) -> Self {
        self.max_rd_atomic = n;
        self
    }

    /// The most a peer may do to this side's memory: the QP's remote access rights and the
    /// default rights of allocated regions (default: local write, remote read, write,
    /// atomic, and both FLUSH placements; allocated regions never get
    /// `FLUSH_PERSISTENT`, which only file-backed regions can honour:
    /// [`Rdma::register_file`]).
    pub fn access(mut self, access: AccessFlags) -> Self {
        self.access = access;
        self
    }

    /// How completions are collected (default [`Polling::Event`]).
    pub fn polling(mut self, polling: Polling) -> Self {
        self.polling = polling;
        self
    }

    /// Largest message sent in one SEND (default 64 KiB): the size of each receive buffer.
    /// Larger messages go by RDMA READ (see [`Connection::send`](crate::Connection::send)).
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// Largest message this side accepts (default 16 MiB, at most 2^31), and the most
    /// bytes of large messages a connection holds at once: messages larger than
    /// [`RdmaBuilder::max_message`] are read from the sender's memory into memory
    /// allocated here, at most this many bytes ahead of the application taking them (later
    /// ones wait, and so does their sender). The peer learns the limit in the handshake:
    /// sending a larger message is an [`Error::MessageTooLarge`] there. So what a peer can
    /// make this side hold per connection for messages not yet taken is bounded by
    /// `recv_depth × max_message + max_large_message`.
    pub fn max_large_message(mut self, bytes: usize) -> Self {
        self.max_large_message = bytes.min(1 << 31);
        self
    }

    /// Messages the peer may send before this side takes them (default 32): the credits
    /// this side grants. A peer that sends more breaks the protocol, and the connection
    /// closes.
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// Time limit of the connection handshake (default 10 s), on each side: a peer that
    /// says nothing, or too little, is given up on after it.
    pub fn handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t;
        self
    }

    /// Connection handshakes a [`Listener`](crate::Listener) runs at once (default 64): requests being
    /// read, waiting for [`Listener::next_request`](crate::Listener::next_request), or being accepted. Each runs on its
    /// own with [`RdmaBuilder::handshake_timeout`], so a slow or silent client delays no
    /// other; beyond the limit, new TCP connections wait in the kernel's backlog until a
    /// handshake ends. Bounds the memory and time unknown peers can take.
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.max_handshakes = n.max(1);
        self
    }

    /// Time limit of an agent request such as [`Connection::request_remote_mr`](crate::Connection::request_remote_mr)
    /// (default 10 s).
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// The longest lease this side grants (default 10 minutes): longer requests are
    /// shortened.
    pub fn max_lease(mut self, t: Duration) -> Self {
        self.max_lease = t;
        self
    }

    /// How many bytes this side lends to each connection's peer at once (default
    /// 64 MiB); requests beyond it are refused. Each lease counts as the whole pages it
    /// pins (at least one, even for a request of zero bytes), and regions the peer gave
    /// back count until they are taken ([`Connection::receive_local_mr`](crate::Connection::receive_local_mr)).
    pub fn lend_limit(mut self, bytes: usize) -> Self {
        self.lend_limit = bytes;
        self
    }

    /// How many regions this side lends to each connection's peer at once (default
    /// 1024, and never more than a sixteenth of the device's `max_mr`: each lease takes
    /// two registrations, so no one connection can use up the device's registrations);
    /// requests beyond it are refused. Regions the peer gave back count until taken.
    pub fn lend_count_limit(mut self, regions: usize) -> Self {
        self.lend_count_limit = regions;
        self
    }

    /// Opens the device and allocates a protection domain.
    pub fn build(self) -> Result<Rdma> {
        if self.max_message == 0 || self.max_message > (1 << 30) {
            return Err(Error::InvalidArgument(format!(
                "max_message {} outside 1..=2^30",
                self.max_message
            )));
        }
        if self.recv_depth == 0 || self.cap.max_send_wr == 0 {
            return Err(Error::InvalidArgument(
                "recv_depth and max_send_wr must be at least 1".into(),
            ));
        }
        let ctx = match &self.context {
            Some(OpenDevice(ctx)) => ctx.clone(),
            None => crate::open_device(self.device.as_deref())?,
        };
        if ctx.caller_driven() && matches!(self.polling, Polling::Event | Polling::Adaptive { .. })
        {
            return Err(Error::InvalidArgument(format!(
                "{} moves packets only when driven: use Polling::Busy or Polling::Manual",
                ctx.info().name
            )));
        }
        let port = ctx.query_port(self.port)?;
        let (gid_index, gid) = match self.gid_index {
            Some(i) => (i, ctx.query_gid(self.port, u32::from(i))?.gid),
            None => {
                let entry = remem_verbs::rc::roce_v2_gid(&*ctx, self.port)?;
                (entry.index as u8, entry.gid)
            }
        };
        let mtu = self.mtu.map_or(port.active_mtu, |m| m.min(port.active_mtu));
        let pd = ctx.alloc_pd()?;
        let pool = crate::pool::Pool::new(pd.clone());
        let dispatch = crate::dispatch::Dispatcher::new(&ctx, self.polling)?;
        tracing::debug!(device = %ctx.info().name, %gid_index, "rdma opened");
        Ok(Rdma {
            inner: Arc::new(RdmaInner {
                dispatch,
                pool,
                ctx,
                pd,
                cfg: self,
                gid_index,
                gid,
                mtu,
            }),
        })
    }
}

struct RdmaInner {
    /// Collects the completions of every connection made from this device, and routes
    /// its asynchronous events.
    dispatch: Arc<crate::dispatch::Dispatcher>,
    // Registrations go before the PD, the PD before the context it belongs to.
    pool: Arc<crate::pool::Pool>,
    pd: Arc<dyn ProtectionDomain>,
    ctx: Arc<dyn Context>,
    cfg: RdmaBuilder,
    gid_index: u8,
    gid: Gid,
    mtu: Mtu,
}

impl Drop for RdmaInner {
    fn drop(&mut self) {
        self.dispatch.stop();
    }
}

impl std::fmt::Debug for RdmaInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rdma")
            .field("device", &self.ctx.info().name)
            .field("gid", &self.gid)
            .finish_non_exhaustive()
    }
}

/// An open RDMA device with a protection domain: makes connections and memory regions.
/// Cheap to clone; connections made from one `Rdma` share its device and PD.
#[derive(Debug, Clone)]
pub struct Rdma {
    inner: Arc<RdmaInner>,
}

impl Rdma {
    /// A builder with defaults.
    pub fn builder() -> RdmaBuilder {
        RdmaBuilder::new()
    }

    pub(crate) fn dispatcher(&self) -> &Arc<crate::dispatch::Dispatcher> {
        &self.inner.dispatch
    }

    pub(crate) fn config(&self) -> &RdmaBuilder {
        &self.inner.cfg
    }

    /// The device.
    pub fn context(&self) -> &Arc<dyn Context> {
        &self.inner.ctx
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<dyn ProtectionDomain> {
        &self.inner.pd
    }

    /// The local GID connections use.
    pub fn gid(&self) -> Gid {
        self.inner.gid
    }

    pub(crate) fn gid_index(&self) -> u8 {
        self.inner.gid_index
    }

    pub(crate) fn mtu(&self) -> Mtu {
        self.inner.mtu
    }

    /// The UDP port the device takes RoCEv2 packets on: a soft device's own, 4791 for
    /// every other device.
    pub(crate) fn roce_port(&self) -> u16 {
        self.context()
            .info()
            .udp_addr
            .map_or(remem_soft::ROCEV2_UDP_PORT, |a| a.port())
    }

    /// The UDP port a connection's path names for a peer that said it takes RoCEv2 on
    /// `port` (0: unknown): 0 — the device's default — for 0 and for this device's own port
    /// (a device sends to its own port: 4791, or a soft device's), else `port`. The port
    /// goes into that connection's QP alone ([`remem_verbs::AhAttr::udp_port`]): nothing
    /// device-wide changes for what a peer claims. A device that can send only to the
    /// standard port 4791 (an RDMA NIC, kernel rxe) cannot reach a peer on another: that is
    /// [`HandshakeError::PortMismatch`], at connect time. A pure question: the device is
    /// told nothing.
    pub(crate) fn path_port(&self, port: u16) -> Result<u16> {
        let own = self.roce_port();
        if port == 0 || port == own {
            return Ok(0);
        }
        if self.context().can_send_to_udp_port(port) {
            Ok(port)
        } else {
            Err(HandshakeError::PortMismatch {
                local: own,
                peer: port,
            }
            .into())
        }
    }

    /// Allocates a zeroed memory region of `layout` from the pool of pre-registered memory
    /// (no registration: sizes up to 1 MiB and alignments up to a page come from the pool;
    /// larger ones are registered). Lent to a peer, it grants the default rights
    /// ([`RdmaBuilder::access`]).
    pub fn alloc_local_mr(&self, layout: Layout) -> Result<LocalMr> {
        let mr = self.alloc_local_mr_uninit(layout)?;
        mr.fill_zero()?;
        Ok(mr)
    }

    /// [`Rdma::alloc_local_mr`] without zeroing: the contents are unspecified (bytes an
    /// earlier allocation left). Safe, unlike an uninitialised Rust allocation: the pool's
    /// memory is always initialised, and it is only ever read through copies.
    pub fn alloc_local_mr_uninit(&self, layout: Layout) -> Result<LocalMr> {
        // Pool memory has no durable backing store: no persistent FLUSH into it.
        let access = self.config().access - AccessFlags::FLUSH_PERSISTENT;
        match self.inner.pool.alloc(layout.size(), layout.align())? {
            Some(block) => Ok(LocalMr::from_block(block, layout.size(), access)),
            None => self.alloc_local_mr_with(layout, access),
        }
    }

    /// Allocates and registers a zeroed memory region of `layout` with `access` (which may
    /// not exceed [`RdmaBuilder::access`]): a registration of its own, not from the pool.
    pub fn alloc_local_mr_with(&self, layout: Layout, access: AccessFlags) -> Result<LocalMr> {
        let buf = MemoryBuffer::zeroed(layout.size().max(1))?;
        if !buf.addr().is_multiple_of(layout.align() as u64) {
            return Err(Error::InvalidArgument(format!(
                "alignment {} is not supported (at most {})",
                layout.align(),
                1u64 << buf.addr().trailing_zeros()
            )));
        }
        self.register(buf, access)
    }

    /// Registers memory the caller owns (a `Vec<u8>`, `Box<[u8]>`, `BytesMut` or memory map
    /// turned into a [`MemoryBuffer`]: `from_vec`, `from_boxed`, `from_bytes_mut`,
    /// `from_mmap`) with
    /// `access`, which may not exceed [`RdmaBuilder::access`].
    pub fn register(&self, buf: MemoryBuffer, access: AccessFlags) -> Result<LocalMr> {
        self.check_access(access)?;
        register(self.pd(), buf, access)
    }

    /// Refuses `access` beyond [`RdmaBuilder::access`].
    fn check_access(&self, access: AccessFlags) -> Result<()> {
        let allowed = self.config().access;
        if !allowed.contains(access) {
            return Err(Error::InvalidArgument(format!(
                "access {access:?} exceeds the most this Rdma grants ({allowed:?})"
            )));
        }
        Ok(())
    }

    /// Maps `len` bytes of `file` from byte `offset` (growing the file if it is shorter)
    /// and registers them with `access`, which may include
    /// [`AccessFlags::FLUSH_PERSISTENT`]: a persistent target for a peer's writes and
    /// flushes — on persistent memory with a DAX file system, or on any file system, where
    /// a persistent flush writes the range back (`msync`) before it completes.
    /// `access` may not exceed [`RdmaBuilder::access`].
    ///
    /// The range's blocks are reserved first (`fallocate`): a peer's write must never
    /// find a hole the file system has no space for, which would kill this process with
    /// `SIGBUS` in the middle of serving the peer. If they cannot be reserved — the file
    /// system is full, or cannot reserve blocks at all — registration fails with
    /// [`Error::File`] (the file may keep the part that was reserved). On a copy-on-write
    /// file system (btrfs with snapshots or reflinks) a reservation does not cover
    /// rewriting blocks that are shared: don't share files registered so.
    ///
    /// What happens to the file while it is registered is the application's
    /// responsibility, as for any memory map: another process (or this one) that
    /// truncates the file below the range, or punches a hole in it that cannot be filled
    /// again, makes later accesses to the missing part fault with `SIGBUS` — local ones and
    /// a peer's alike. Concurrent writes by other processes are races on values, never
    /// undefined behaviour (see [`MemoryBuffer::map_file`]).
    pub fn register_file(
        &self,
        file: &std::fs::File,
        offset: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<LocalMr> {
        // Before the file is touched.
        self.check_access(access)?;
        if len > 0 {
            reserve(file, offset, len as u64).map_err(Error::File)?;
        }
        let map = MemoryBuffer::map_file(file, offset, len).map_err(Error::File)?;
        register(self.pd(), map, access)
    }

    /// The device's asynchronous events (QP fatal, CQ error, port active/error, SRQ
    /// limit, …) as a stream: `while let Ok(ev) = events.recv().await`. An event about a
    /// connection's QP or CQ also ends that connection, failing its pending operations
    /// with [`Error::Event`]. Needs a tokio runtime (the device's event fd is watched by a
    /// task). A subscriber that falls more than 64 events behind is told how many it missed
    /// (`RecvError::Lagged`).
    pub fn subscribe_events(&self) -> Result<broadcast::Receiver<AsyncEvent>> {
        self.dispatcher().subscribe()
    }
}

/// Reserves the blocks of `[offset, offset + len)` of `file` (growing it if it is
/// shorter), so that writes into the range never need space the file system lacks.
fn reserve(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    use rustix::fs::{FallocateFlags, fallocate};
    if offset
        .checked_add(len)
        .is_none_or(|end| end > i64::MAX as u64)
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the range lies beyond the largest file size",
        ));
    }
    loop {
        return match fallocate(file, FallocateFlags::empty(), offset, len) {
            Err(rustix::io::Errno::INTR) => continue,
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
                Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!(
                        "the file system cannot reserve the region's blocks (fallocate: {e}); \
                         a peer's write into an unreserved block could kill this process \
                         (SIGBUS) when the file system is full"
                    ),
                ))
            }
            Err(e) => Err(std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!(
                    "cannot reserve {len} bytes of the file at offset {offset} (fallocate: {e})"
                ),
            )),
        };
    }
}

impl LocalMr {
    /// A descriptor of this region for a peer: address, length, remote key, the rights it
    /// grants and the FLUSH placements it supports, in a compact versioned encoding
    /// ([`RemoteMr::from_descriptor`](crate::RemoteMr::from_descriptor) turns it back into
    /// a remote region). Pass it by any means, e.g. in a connection's private data. A pool
    /// block is registered for the peer on first use, as when it is shared over a
    /// connection. (Here rather than in `mr`, which knows no `Rdma`.)
    pub fn descriptor(&self, rdma: &Rdma) -> Result<Vec<u8>> {
        Ok(self.token(rdma.pd())?.descriptor())
    }
}
