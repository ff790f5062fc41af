//! The soft NIC driver: moves datagrams between a UDP socket and an [`Engine`].
//!
//! Packets go out in UDP GSO batches where the kernel offers GSO (one `sendmsg` carries up to
//! 64 packets of one size to one destination; the kernel, or the NIC, cuts them apart) and
//! come in through `recvmmsg` with UDP GRO (one receive returns up to 16 datagrams, each of
//! which may hold many coalesced packets). The socket work is done by `quinn-udp`, which
//! falls back to one datagram per call where GSO or GRO is missing.
//!
//! A [`Nic`] is driven either by a [`Progress`] thread or, in inline mode, by the caller
//! ([`Inline`]).

use crate::engine::Engine;
use crate::faults::{FaultConfig, FaultInjector};
use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Largest packet the engine builds (MTU 4096 plus headers).
const MAX_PACKET: usize = 4096 + 128;
/// Payload bytes of one GSO batch: below IPv4's 65,507-byte UDP payload limit.
const TX_BATCH_BYTES: usize = 65_000;
/// Datagrams per `recvmmsg`.
const RX_BATCH: usize = if quinn_udp::BATCH_SIZE < 16 {
    quinn_udp::BATCH_SIZE
} else {
    16
};
/// Packets one transmit pass sends at most: then the pump reads the socket and runs the
/// timers before it sends on. A 2 GiB READ response does not keep the device deaf (and
/// other connections' packets dropped at the full socket) until it has all left.
const TX_BUDGET: usize = 1024;
/// `recvmmsg` calls per pump at most (so at most `RX_CALLS * RX_BATCH` datagrams): then the
/// pump sends what they produced and runs the timers before it reads on. A peer that keeps
/// the socket full cannot make the device queue answers without sending them, or starve
/// its timers and other QPs' transmissions.
const RX_CALLS: usize = 4;
/// One receive buffer: a whole GRO batch (at most 64 KiB of UDP payload).
const RX_BUF: usize = 1 << 16;
/// Socket buffer size asked for (the kernel caps it at `net.core.[rw]mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;

/// Packets waiting to leave in one GSO send: all to one destination, all of one size but
/// the last, which may be shorter.
#[derive(Debug)]
struct TxBatch {
    buf: Vec<u8>,
    len: usize,
    segment: usize,
    count: usize,
    dst: SocketAddr,
    /// The last packet was shorter than `segment`: nothing more may join.
    closed: bool,
}

/// A UDP socket set up for RoCEv2 and the buffers to drive it.
#[derive(Debug)]
pub struct Nic {
    socket: Arc<UdpSocket>,
    state: UdpSocketState,
    rx: Vec<u8>,
    meta: Vec<RecvMeta>,
    tx: TxBatch,
    /// Faults injected into what this NIC sends (testing).
    faults: Option<Box<FaultInjector>>,
}

impl Nic {
    /// Sets `socket` up: non-blocking, GRO on, larger buffers, and for IPv4 DF with
    /// IP_PMTUDISC_DO so that packets carry identification 0 (see [`crate::engine`]).
    pub fn new(socket: UdpSocket) -> io::Result<Self> {
        let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
        let local = socket.local_addr()?;
        if local.is_ipv4() {
            rustix::net::sockopt::set_ip_mtu_discover(
                &socket,
                rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
            )?;
        }
        // Best effort: a larger receive buffer absorbs bursts, the kernel may cap it.
        let _ = state.set_recv_buffer_size(UdpSockRef::from(&socket), SOCKET_BUFFER);
        let _ = state.set_send_buffer_size(UdpSockRef::from(&socket), SOCKET_BUFFER);
        Ok(Nic {
            socket: Arc::new(socket),
            state,
            rx: vec![0; RX_BATCH * RX_BUF],
            meta: vec![RecvMeta::default(); RX_BATCH],
            tx: TxBatch {
                buf: vec![0; TX_BATCH_BYTES],
                len: 0,
                segment: 0,
                count: 0,
                dst: local,
                closed: false,
            },
            faults: None,
        })
    }

    /// Injects `cfg`'s faults into every packet this NIC sends (one packet per send then:
    /// no GSO batches).
    pub fn with_faults(mut self, cfg: FaultConfig) -> Self {
        self.faults = cfg.is_active().then(|| Box::new(FaultInjector::new(cfg)));
        self
    }

    /// When a packet held back by fault injection becomes due.
    pub fn next_fault_due(&self) -> Option<Instant> {
        self.faults.as_ref().and_then(|f| f.next_due())
    }

    /// Sends what fault injection decided, one datagram each.
    fn send_faulted(&mut self, engine: &Engine, out: Vec<(SocketAddr, Vec<u8>)>) {
        for (dst, bytes) in out {
            let transmit = Transmit {
                destination: dst,
                ecn: None,
                contents: &bytes,
                segment_size: None,
                src_ip: None,
            };
            let _ = self
                .state
                .try_send(UdpSockRef::from(&*self.socket), &transmit);
            engine.stats.tx_datagrams.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Releases packets held back by fault injection that are due.
    fn release_faulted(&mut self, engine: &Engine, now: Instant) -> usize {
        let Some(f) = self.faults.as_mut() else {
            return 0;
        };
        let mut out = Vec::new();
        f.due(now, &mut out);
        let n = out.len();
        self.send_faulted(engine, out);
        n
    }

    /// How many packets one send may carry (1 without GSO).
    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// How many packets one receive may return per datagram (1 without GRO).
    pub fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// Runs due timers, sends everything that can be sent and handles what has arrived (at
    /// most `RX_CALLS` receive batches: a caller that keeps pumping while packets move
    /// reads the rest next time), without blocking. Returns how many packets and datagrams
    /// moved.
    pub fn pump(&mut self, engine: &Engine) -> usize {
        let now = Instant::now();
        engine.on_timeout(now);
        let moved = self.release_faulted(engine, now) + self.transmit(engine, now);
        let received = self.receive(engine);
        if received == 0 {
            return moved;
        }
        // What the received packets produced (ACKs, READ and atomic responses) leaves in
        // this same call, as a NIC answers without waiting for the application: a caller
        // that sees a WRITE land in its memory may stop driving, or drop the device, at
        // once — the peer must still get its ACK.
        moved + received + self.transmit(engine, Instant::now())
    }

    /// Waits until the socket or `wake` is readable, or `timeout` has passed; returns
    /// whether `wake` is readable.
    fn wait_or_wake(&self, timeout: Duration, wake: &impl std::os::fd::AsFd) -> bool {
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let mut fds = [
            rustix::event::PollFd::new(&*self.socket, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(wake, rustix::event::PollFlags::IN),
        ];
        // An error (EINTR) just ends the wait early.
        let _ = rustix::event::poll(&mut fds, Some(&ts));
        !fds[1].revents().is_empty()
    }

    /// Waits until the socket is readable or `timeout` has passed.
    pub fn wait(&self, timeout: Duration) {
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let mut fds = [rustix::event::PollFd::new(
            &*self.socket,
            rustix::event::PollFlags::IN,
        )];
        // An error (EINTR) just ends the wait early.
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }

    fn transmit(&mut self, engine: &Engine, now: Instant) -> usize {
        let max_segments = if self.faults.is_some() {
            1
        } else {
            self.state.max_gso_segments().clamp(1, 64)
        };
        let mut sent = 0;
        while sent < TX_BUDGET {
            let b = &self.tx;
            if b.count > 0
                && (b.count >= max_segments || b.closed || b.len + MAX_PACKET > b.buf.len())
            {
                self.flush(engine, self.tx.len);
            }
            let b = &mut self.tx;
            let start = b.len;
            let Some((dst, len)) =
                engine.poll_transmit_unsealed(now, &mut b.buf[start..start + MAX_PACKET])
            else {
                break;
            };
            sent += 1;
            let mut at = start;
            if b.count > 0 && (dst != b.dst || len > b.segment) {
                // It cannot join this batch: send the batch, and start the next with it.
                self.flush(engine, start);
                self.tx.buf.copy_within(start..start + len, 0);
                at = 0;
            }
            // Its ICRC covers the IPv4 identification the kernel gives it: its index in
            // the batch.
            let b = &mut self.tx;
            if engine
                .fill_icrc(dst, &mut b.buf[at..at + len], b.count as u16)
                .is_none()
            {
                continue;
            }
            if b.count == 0 {
                b.dst = dst;
                b.segment = len;
            }
            b.closed = len < b.segment;
            b.count += 1;
            b.len += len;
        }
        if self.tx.count > 0 {
            self.flush(engine, self.tx.len);
        }
        sent
    }

    /// Sends the batch in `tx.buf[..end]` and empties it.
    fn flush(&mut self, engine: &Engine, end: usize) {
        if let Some(f) = self.faults.as_mut() {
            // One packet (no batches with faults): its fate first.
            let b = &mut self.tx;
            let mut out = Vec::new();
            f.on_send(Instant::now(), b.dst, &b.buf[..end], &mut out);
            engine.transmitted(b.dst, &b.buf[..end], 0);
            let c = f.counts;
            let s = &engine.stats;
            s.fault_dropped.store(c.dropped, Ordering::Relaxed);
            s.fault_corrupted.store(c.corrupted, Ordering::Relaxed);
            s.fault_duplicated.store(c.duplicated, Ordering::Relaxed);
            s.fault_reordered.store(c.reordered, Ordering::Relaxed);
            b.len = 0;
            b.count = 0;
            b.closed = false;
            self.send_faulted(engine, out);
            return;
        }
        let b = &mut self.tx;
        let contents = &b.buf[..end];
        let transmit = Transmit {
            destination: b.dst,
            ecn: None,
            contents,
            segment_size: (b.count > 1).then_some(b.segment),
            src_ip: None,
        };
        let sock = UdpSockRef::from(&*self.socket);
        let mut result = self.state.try_send(sock, &transmit);
        for _ in 0..3 {
            match &result {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut fds = [rustix::event::PollFd::new(
                        &*self.socket,
                        rustix::event::PollFlags::OUT,
                    )];
                    let ts = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    let _ = rustix::event::poll(&mut fds, Some(&ts));
                    result = self
                        .state
                        .try_send(UdpSockRef::from(&*self.socket), &transmit);
                }
                _ => break,
            }
        }
        engine.stats.tx_datagrams.fetch_add(1, Ordering::Relaxed);
        // A packet the socket refused is lost on the wire as far as the transport knows:
        // RC retransmits it, UD is unreliable anyway.
        for (i, pkt) in contents.chunks(b.segment.max(1)).enumerate() {
            engine.transmitted(b.dst, pkt, i as u16);
        }
        b.len = 0;
        b.count = 0;
        b.closed = false;
    }

    fn receive(&mut self, engine: &Engine) -> usize {
        let local_ip = engine.local().ip();
        let mut moved = 0;
        for _ in 0..RX_CALLS {
            let mut chunks = self.rx.chunks_mut(RX_BUF);
            let mut bufs: [IoSliceMut<'_>; RX_BATCH] =
                std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
            let n =
                match self
                    .state
                    .recv(UdpSockRef::from(&*self.socket), &mut bufs, &mut self.meta)
                {
                    Ok(n) => n,
                    Err(_) => return moved, // WouldBlock, or an ICMP error with nothing to do
                };
            let now = Instant::now();
            for (meta, buf) in self.meta[..n].iter().zip(&bufs) {
                moved += 1;
                if meta.len > 0 {
                    // (zero-length datagrams are wake-ups)
                    engine.stats.rx_datagrams.fetch_add(1, Ordering::Relaxed);
                }
                let to = meta.dst_ip.unwrap_or(local_ip);
                let stride = meta.stride.max(1);
                for (i, pkt) in buf[..meta.len].chunks(stride).enumerate() {
                    let _ = engine.on_datagram(now, meta.addr, to, pkt, i as u16);
                }
            }
        }
        moved
    }
}

/// A progress thread driving a [`Nic`] for an [`Engine`].
///
/// Three ways to wait, by `busy_poll` ([`crate::SoftOptions::busy_poll`]):
/// * zero (the default): when a pump moved nothing, the thread sleeps in `poll` on its
///   socket and an eventfd until a datagram arrives, the next timer is due, or a post from
///   another thread wakes it ([`Progress::wake`]: one eventfd write, made only while the
///   thread is waiting or about to);
/// * a duration: it keeps pumping for that long before it sleeps;
/// * [`Duration::MAX`]: it never sleeps — every pass is a nonblocking receive, the
///   timers are compared against a cached deadline, and posts wake nothing (no syscall
///   on the posting thread). This spends a CPU for the lowest latency.
#[derive(Debug)]
pub struct Progress {
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    /// Passes of the loop completed (each one pump: receive, then send what that produced).
    passes: Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How other threads wake a sleeping progress thread: a flag it sets before it sleeps,
/// and an eventfd it sleeps on besides its socket.
#[derive(Debug)]
struct Waker {
    /// The thread is waiting, or about to (it checks for work after setting this).
    waiting: AtomicBool,
    /// Readable while a wake-up is pending.
    fd: std::os::fd::OwnedFd,
    /// Wake-ups written (for tests: how many syscalls posts cost the posting threads).
    writes: std::sync::atomic::AtomicU64,
}

impl Waker {
    fn new() -> io::Result<Self> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
        )?;
        Ok(Waker {
            waiting: AtomicBool::new(false),
            fd,
            writes: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Wakes the thread if it is waiting (or about to): one eventfd write.
    fn wake(&self) {
        if self.waiting.swap(false, Ordering::SeqCst) {
            self.writes.fetch_add(1, Ordering::Relaxed);
            // The counter cannot overflow in practice; a failed write leaves the thread
            // to its timer.
            let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        }
    }

    /// Takes a pending wake-up (nonblocking).
    fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

impl Progress {
    /// Starts the thread for `engine` on `nic`, pinned to CPU `cpu` if given, spinning for
    /// `busy_poll` before it sleeps ([`Duration::MAX`]: never sleeping).
    pub fn start(
        mut nic: Nic,
        engine: Arc<Engine>,
        cpu: Option<usize>,
        busy_poll: Duration,
    ) -> io::Result<Self> {
        let local = nic.socket.local_addr()?;
        let waker = Arc::new(Waker::new()?);
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let thread = {
            let (waker, stop, passes) = (waker.clone(), stop.clone(), passes.clone());
            std::thread::Builder::new()
                .name(format!("remem-soft {local}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        let mut set = rustix::thread::CpuSet::new();
                        set.set(cpu);
                        if let Err(err) = rustix::thread::sched_setaffinity(None, &set) {
                            eprintln!(
                                "remem-soft: cannot pin the progress thread to CPU {cpu}: {err}"
                            );
                        }
                    }
                    run(&mut nic, &engine, &waker, &stop, &passes, busy_poll)
                })?
        };
        Ok(Progress {
            waker,
            stop,
            passes,
            thread: Some(thread),
        })
    }

    /// Waits (at most `limit`) until everything the device received before this call has
    /// been handled and what it produced sent: two passes of the thread's loop completed
    /// after the call (the one in progress may have delivered a completion and not yet sent
    /// its ACK), then nothing left to send.
    pub fn flush(&self, engine: &Engine, limit: Duration) {
        let deadline = Instant::now() + limit;
        let start = self.passes.load(Ordering::Acquire);
        self.waker.waiting.store(true, Ordering::SeqCst);
        self.wake();
        while (self.passes.load(Ordering::Acquire) < start + 2 || engine.owes_packets())
            && Instant::now() < deadline
        {
            // A bounded wait at close (as `ibv_close_device` may block), not a test's sleep.
            std::thread::sleep(Duration::from_micros(20));
            self.wake();
        }
    }

    /// Wakes the thread if it is waiting (an eventfd write; nothing when it is not
    /// waiting, as a busy-polling thread never is).
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// How many wake-ups other threads have written so far (each one a syscall on the
    /// posting thread): zero for a busy-polling thread.
    pub fn wakeups(&self) -> u64 {
        self.waker.writes.load(Ordering::Relaxed)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waker.waiting.store(true, Ordering::SeqCst);
        self.wake();
        if let Some(t) = self.thread.take() {
            // The last handle may be dropped on the progress thread itself (while it handles
            // a packet for a QP nobody else holds): it then ends by itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn run(
    nic: &mut Nic,
    engine: &Engine,
    waker: &Waker,
    stop: &AtomicBool,
    passes: &std::sync::atomic::AtomicU64,
    spin: Duration,
) {
    if spin == Duration::MAX {
        // Busy polling: nonblocking passes until stopped, nothing else.
        while !stop.load(Ordering::Acquire) {
            nic.pump(engine);
            passes.fetch_add(1, Ordering::AcqRel);
        }
    }
    while !stop.load(Ordering::Acquire) {
        let moved = nic.pump(engine);
        passes.fetch_add(1, Ordering::AcqRel);
        if moved > 0 || engine.has_ready() {
            continue;
        }
        if !spin.is_zero() {
            let until = Instant::now() + spin;
            let mut moved = 0;
            while moved == 0 && Instant::now() < until && !stop.load(Ordering::Acquire) {
                moved = nic.pump(engine);
                std::hint::spin_loop();
            }
            if moved > 0 {
                continue;
            }
        }
        // Announce the wait, then look for work once more: a post that marked its QP
        // before this store is seen here, one after it finds the flag set and wakes us.
        waker.waiting.store(true, Ordering::SeqCst);
        if engine.has_ready() || stop.load(Ordering::SeqCst) {
            waker.waiting.store(false, Ordering::SeqCst);
            continue;
        }
        let woken = nic.wait_or_wake(
            time_to_next_timer(engine, nic, Duration::from_millis(100)),
            &waker.fd,
        );
        waker.waiting.store(false, Ordering::SeqCst);
        if woken {
            // A wake-up written after this thread stopped waiting stays pending and ends
            // a later wait early: harmless (one extra pass).
            waker.clear();
        }
    }
    // Stopping: send what is owed first. A receiver may see a completion, destroy its QP
    // and close the device before this thread has sent the ACK for that message (a NIC
    // acknowledges in hardware whatever the process does next); without this the peer
    // would retry into a closed port until its retries run out. Bounded: each pass sends
    // at most a pump's budget.
    for _ in 0..STOP_FLUSH_PASSES {
        if !engine.has_ready() {
            break;
        }
        nic.pump(engine);
    }
}

/// How many pump passes a stopping progress thread makes to send what is owed.
const STOP_FLUSH_PASSES: usize = 64;

fn time_to_next_timer(engine: &Engine, nic: &Nic, at_most: Duration) -> Duration {
    let next = match (engine.next_timeout(), nic.next_fault_due()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    next.map(|t| t.saturating_duration_since(Instant::now()))
        .unwrap_or(at_most)
        .min(at_most)
        .max(Duration::from_micros(1))
}

/// Caller-driven progress for single-threaded programs and deterministic tests: no thread;
/// [`Inline::progress`] moves packets when called.
#[derive(Debug)]
pub struct Inline {
    nic: Nic,
}

impl Inline {
    /// Inline progress over `nic`.
    pub fn new(nic: Nic) -> Self {
        Inline { nic }
    }

    /// Runs due timers, sends what can be sent, and handles received packets; if nothing
    /// happened, waits up to `timeout` (bounded by the next timer) for a packet and handles
    /// it. Returns the number of packets sent and datagrams received.
    pub fn progress(&mut self, engine: &Engine, timeout: Duration) -> usize {
        let moved = self.nic.pump(engine);
        if moved > 0 || timeout.is_zero() || engine.has_ready() {
            return moved;
        }
        self.nic
            .wait(time_to_next_timer(engine, &self.nic, timeout));
        self.nic.pump(engine)
    }
}
