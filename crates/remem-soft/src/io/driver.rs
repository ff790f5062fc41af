//! The soft NIC driver: moves datagrams between a UDP socket and an [`Engine`].
//!
//! Packets go out in UDP GSO batches where the kernel offers GSO (one batch carries up to
//! 64 packets of one size to one destination; the kernel, or the NIC, cuts them apart), up
//! to 16 batches in one `sendmmsg` (in order: an ACK and the reply that follows it, which
//! differ in size, leave in one call), and come in through `recvmmsg` with UDP GRO (one receive returns up to 16 datagrams, each of
//! which may hold many coalesced packets). The receive side and the socket's setup are
//! `quinn-udp`'s, which falls back to one datagram per call where GSO or GRO is missing.
//!
//! Sends are scatter/gather (`sys::send_batches`): a batch is a list of pieces — each
//! packet's headers, its payload where it lies in registered memory, its pad and ICRC — and
//! the send hands the kernel an iovec per piece (adjacent pieces of the batch's own
//! buffer merged). The payload is never copied into a packet buffer: its ICRC is computed
//! over the pieces (the headers from the buffer, the payload read from registered memory
//! in chunks, `remem_wire::icrc::IcrcHasher`), and the kernel copies it into its socket
//! buffer once, during the call. The payload pieces are [`HeldRanges`]: an access to their
//! memory key (one per run of pieces of a key) entered when the packet is built and left
//! when the batch has been sent, so a deregistration waits for the send (at most one call)
//! and no deregistered region is read, as before. (The progress thread never deregisters; in inline mode every batch is
//! sent before `progress` returns, so a deregistration never waits for its own thread.)
//!
//! The payload may change while it waits: the application writes its memory, or a peer's
//! WRITE lands in it. A packet whose bytes change between its ICRC and the kernel's copy
//! fails the receiver's ICRC check and is dropped there; RC retransmits it. A NIC reading
//! host memory by DMA has the same race. What is copied instead: payloads of at most
//! `COPY_MAX` bytes (an iovec costs more than the copy; `REMEM_SOFT_COPY_MAX` sets it, and
//! 4096 or more copies every payload as before), UC and UD payloads (they complete
//! when handed to the driver, with no acknowledgement to wait for, so the application may
//! reuse the buffer at once). Capture and fault injection do not force the copy (below).
//!
//! The driver sends and receives through a [`Socket`]: the UDP socket itself
//! ([`crate::io::socket::Udp`]), or that socket inside decorators of the same trait —
//! capture ([`Nic::with_pcap`], [`crate::io::capture::Capture`]: records every packet
//! handed to it) and fault injection ([`Nic::with_faults`], [`crate::io::faulty::Faulty`]:
//! decides each packet's fate, leaves a lost one out of its GSO batch and sends the rest
//! together, byte for byte as had it never been built, and only the rare corrupted,
//! duplicated, reordered or delayed ones copied and alone). The driver has no branch for
//! either, and the [`Engine`] sees neither.
//!
//! A [`Nic`] is driven either by a [`Progress`] thread or, in inline mode, by the caller
//! ([`Inline`]).

#![forbid(unsafe_code)]

use crate::engine::{Engine, TxBuild};
use crate::io::capture::Capture;
use crate::io::faults::FaultConfig;
use crate::io::faulty::Faulty;
use crate::io::pcap::PcapWriter;
use crate::io::socket::{Outgoing, Socket, Udp};
use crate::io::sys::{Batch, MAX_BATCHES, MAX_IOV, Piece};
use crate::mem::grant::{HeldRanges, Mark};
use crate::transport::glue::{CopySink, PayloadSink};
use crate::transport::{AccessError, Grant, Held, TxPacket};
use quinn_udp::RecvMeta;
use remem_verbs::MemError;
use remem_wire::icrc::IcrcHasher;
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Largest packet the engine builds (MTU 4096 plus headers).
const MAX_PACKET: usize = 4096 + 128;
/// Payload bytes of one GSO batch: below IPv4's 65,507-byte UDP payload limit.
const TX_BATCH_BYTES: usize = 65_000;
/// Own bytes (headers, copied payloads, ICRCs) of the batches waiting for one `sendmmsg`.
const TX_OWN_BYTES: usize = 2 * TX_BATCH_BYTES;
/// Another batch joins the call only while the call's batches carry fewer UDP payload
/// bytes than this: small batches (an ACK, a reply, a few short messages) share a syscall,
/// bulk goes a batch per call, so the receiver works on one while the next is built (a
/// call of 16 full batches left the receiver idle meanwhile: `read_bw` 64 KiB −27 %).
const TX_COALESCE_BYTES: usize = 16 << 10;
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

/// Payloads of at most this many bytes are copied into the packet: below it an iovec of
/// its own costs the kernel more than the copy saves. `REMEM_SOFT_COPY_MAX` overrides it
/// (bytes; 4096 or more copies every payload, as before the scatter/gather send).
const COPY_MAX: usize = 512;

/// The environment variable that sets the largest payload copied into its packet.
pub const COPY_MAX_ENV: &str = "REMEM_SOFT_COPY_MAX";

/// Packets waiting to leave in one `sendmmsg`: GSO batches, each all to one destination
/// and all of one size but the last, which may be shorter — the `sealed` ones, then the
/// open one that packets join. Their bytes are pieces: ranges of `buf` (headers, copied
/// payloads, pads, ICRCs) and payload references held until the send returns.
///
/// One call for several batches keeps their order and saves a syscall for each: an ACK
/// and the reply that follows it (they differ in size, so they cannot share a GSO batch)
/// leave together.
#[derive(Debug)]
struct TxBatch {
    /// The batches' own bytes, `buf[..own]`; the packet being built is staged after them.
    buf: Vec<u8>,
    own: usize,
    /// The batches' pieces in order; `mem` holds the references their `Mem` pieces stand
    /// for (and, after them, the staged packet's).
    pieces: Vec<Piece>,
    mem: HeldRanges,
    /// The batches before the open one, complete.
    sealed: Vec<Batch>,
    /// Where the open batch's pieces start.
    start: usize,
    /// UDP payload bytes of the open batch's packets.
    len: usize,
    segment: usize,
    /// Packets of the open batch.
    count: usize,
    /// Packets of all the batches, and those whose payload is referenced, not copied.
    packets: usize,
    /// UDP payload bytes of all the batches.
    bytes: usize,
    zero_copy: usize,
    dst: SocketAddr,
    /// The top byte of the open batch's destination QPN: a batch goes to one process of a
    /// shared device (the kernel steers a GSO batch by its first packet), so it is cut
    /// where that byte changes.
    slot: u8,
    /// The open batch's last packet was shorter than `segment`: nothing more may join.
    closed: bool,
    /// The packet being built (see [`Stage`]).
    stage: Stage,
    /// Where payloads are read, a chunk at a time, for their ICRC.
    scratch: Vec<u8>,
}

impl TxBatch {
    /// Empties the batches (their payload references are released: their accesses end).
    fn clear(&mut self) {
        self.own = 0;
        self.sealed.clear();
        self.start = 0;
        self.len = 0;
        self.count = 0;
        self.packets = 0;
        self.bytes = 0;
        self.zero_copy = 0;
        self.closed = false;
        self.pieces.clear();
        self.mem.clear();
    }

    /// The open batch as the kernel gets it.
    fn open(&self) -> Batch {
        Batch {
            dst: self.dst,
            segment: (self.count > 1).then_some(self.segment as u16),
            pieces: self.start..self.pieces.len(),
        }
    }

    /// Closes the open batch (which has packets): the next packet starts another.
    fn seal(&mut self) {
        let open = self.open();
        self.sealed.push(open);
        self.start = self.pieces.len();
        self.len = 0;
        self.count = 0;
        self.closed = false;
    }

    /// Whether the open batch may be sealed and another opened for a packet of `pieces`
    /// pieces, rather than all of them sent first.
    fn room_for_another(&self, pieces: usize) -> bool {
        self.sealed.len() + 1 < MAX_BATCHES
            && self.pieces.len() + pieces <= MAX_IOV
            && self.bytes < TX_COALESCE_BYTES
    }
}

/// The packet being built, staged at `buf[own..]`: its pieces (`Own` offsets relative to
/// `own`; its payload references are the batch's `mem` after `mark`), and — when its
/// payload is referenced — where its header ends, its payload length and the end of its
/// own bytes.
#[derive(Debug, Default)]
struct Stage {
    pieces: Vec<Piece>,
    mark: Mark,
    scattered: Option<Scattered>,
    /// Payloads of at most this many bytes are copied all the same.
    copy_max: usize,
}

#[derive(Debug, Clone, Copy)]
struct Scattered {
    hdr: usize,
    payload: usize,
    /// End of the staged own bytes (header, then any inline bytes of the payload).
    end: usize,
}

/// What the engine builds a packet through: the staging area of the batch.
struct Stager<'a> {
    buf: &'a mut [u8],
    stage: &'a mut Stage,
    mem: &'a mut HeldRanges,
}

impl TxBuild for Stager<'_> {
    fn buf(&mut self) -> &mut [u8] {
        // A new packet (or a new attempt after one that failed): nothing staged.
        self.stage.pieces.clear();
        self.mem.truncate(self.stage.mark);
        self.stage.scattered = None;
        self.buf
    }

    fn payload(
        &mut self,
        tx: &TxPacket,
        hdr: usize,
        fill: &mut crate::transport::glue::Fill<'_>,
    ) -> Result<(), AccessError> {
        let n = tx.payload_len as usize;
        let Some(place) = self.buf.get_mut(hdr..hdr + n) else {
            return Err(AccessError::Mem(MemError::OutOfBounds {
                offset: hdr as u64,
                len: n as u64,
                size: self.buf.len() as u64,
            }));
        };
        // UC and UD complete a send when its packet is handed over (nothing acknowledges
        // it): their payloads are copied, so the application may reuse the memory at once.
        if n <= self.stage.copy_max || tx.uc || tx.deth.is_some() {
            return fill(&mut CopySink(place));
        }
        self.stage.pieces.push(Piece::Own { start: 0, len: hdr });
        let mut sink = ScatterSink {
            buf: self.buf,
            end: hdr,
            next: 0,
            len: n,
            pieces: &mut self.stage.pieces,
            mem: self.mem,
        };
        fill(&mut sink)?;
        if sink.next != n {
            return Err(AccessError::Mem(MemError::OutOfBounds {
                offset: sink.next as u64,
                len: n as u64,
                size: n as u64,
            }));
        }
        let end = sink.end;
        self.stage.scattered = Some(Scattered {
            hdr,
            payload: n,
            end,
        });
        Ok(())
    }
}

/// A [`PayloadSink`] that references registered memory where it lies (a range of the
/// batch's [`HeldRanges`] per piece) and copies inline bytes after the staged header.
struct ScatterSink<'a> {
    buf: &'a mut [u8],
    /// End of the staged own bytes.
    end: usize,
    /// Payload bytes put so far (pieces come in order).
    next: usize,
    len: usize,
    pieces: &'a mut Vec<Piece>,
    mem: &'a mut HeldRanges,
}

impl ScatterSink<'_> {
    /// Checks that payload bytes `at..at + n` come next and fit.
    fn next_is(&self, at: usize, n: usize) -> Result<(), AccessError> {
        if at == self.next && n <= self.len - at {
            Ok(())
        } else {
            Err(AccessError::Mem(MemError::OutOfBounds {
                offset: at as u64,
                len: n as u64,
                size: self.len as u64,
            }))
        }
    }

    fn pushed_mem(&mut self, n: usize) {
        self.next += n;
        self.pieces.push(Piece::Mem);
    }
}

impl PayloadSink for ScatterSink<'_> {
    fn payload_len(&self) -> usize {
        self.len
    }

    fn put_bytes(&mut self, at: usize, bytes: &[u8]) -> Result<(), AccessError> {
        self.next_is(at, bytes.len())?;
        // The staged own bytes end before the payload's place (`end <= hdr + at`), so
        // there is room, and the pad and ICRC (written after the payload) stay clear.
        let start = self.end;
        self.buf[start..start + bytes.len()].copy_from_slice(bytes);
        match self.pieces.last_mut() {
            Some(Piece::Own { start: s, len }) if *s + *len == start => *len += bytes.len(),
            _ => self.pieces.push(Piece::Own {
                start,
                len: bytes.len(),
            }),
        }
        self.end += bytes.len();
        self.next += bytes.len();
        Ok(())
    }

    fn put_grant(
        &mut self,
        at: usize,
        grant: &Grant,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        self.next_is(at, n)?;
        if n > 0 {
            self.mem.push_grant(grant, offset, n)?;
            self.pushed_mem(n);
        }
        Ok(())
    }

    fn put_held(
        &mut self,
        at: usize,
        held: &Held,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        self.next_is(at, n)?;
        if n > 0 {
            self.mem
                .push_held(held, offset, n)
                .map_err(AccessError::Mem)?;
            self.pushed_mem(n);
        }
        Ok(())
    }
}

impl Stage {
    /// Turns the staged packet of `total` bytes into its final pieces: a copied packet is
    /// one piece; a scattered one's pad and ICRC field (zeros) move right after its staged
    /// own bytes. Returns how many own bytes it uses.
    fn finish(&mut self, buf: &mut [u8], total: usize) -> usize {
        let Some(s) = self.scattered else {
            self.pieces.clear();
            self.pieces.push(Piece::Own {
                start: 0,
                len: total,
            });
            return total;
        };
        let tail = total - s.hdr - s.payload;
        buf[s.end..s.end + tail].fill(0);
        match self.pieces.last_mut() {
            Some(Piece::Own { start, len }) if *start + *len == s.end => *len += tail,
            _ => self.pieces.push(Piece::Own {
                start: s.end,
                len: tail,
            }),
        }
        s.end + tail
    }

    /// Computes the ICRC of the finished staged packet of `total` bytes (own bytes in
    /// `buf`) over its pieces and writes it into its last four bytes.
    fn seal(
        &self,
        buf: &mut [u8],
        scratch: &mut [u8],
        mem: &HeldRanges,
        total: usize,
        ip: &remem_wire::icrc::IpFields,
        ports: remem_wire::icrc::UdpPorts,
    ) -> Option<()> {
        if let [Piece::Own { start, len }] = self.pieces[..] {
            // A whole packet (copied payload): as `icrc::fill`.
            let pkt = buf.get_mut(start..start + len)?;
            return remem_wire::icrc::fill(ip, ports, pkt).ok();
        }
        let covered = total.checked_sub(remem_wire::ICRC_LEN)?;
        let mut refs = self.mark.ranges()..;
        let mut hasher: Option<IcrcHasher> = None;
        let mut at = 0usize;
        let mut last_own_end = 0;
        for piece in &self.pieces {
            match *piece {
                Piece::Own { start, len } => {
                    let take = len.min(covered.saturating_sub(at));
                    let bytes = &buf[start..start + take];
                    match &mut hasher {
                        Some(h) => h.update(bytes),
                        None => hasher = Some(IcrcHasher::new(ip, ports, total, bytes).ok()?),
                    }
                    at += len;
                    last_own_end = start + len;
                }
                Piece::Mem | Piece::Ref(_) => {
                    // (A staged packet's references are `Mem` pieces, in order.)
                    let i = refs.next()?;
                    let h = hasher.as_mut()?;
                    mem.read_chunks(i, scratch, |c| h.update(c)).ok()?;
                    at += mem.range_len(i)?;
                }
            }
        }
        let crc = hasher?.finalize();
        buf.get_mut(last_own_end.checked_sub(4)?..last_own_end)?
            .copy_from_slice(&crc.to_le_bytes());
        Some(())
    }
}

/// A [`Socket`] and the buffers to drive it.
#[derive(Debug)]
pub struct Nic {
    /// The UDP socket, or decorators around it (capture, fault injection).
    socket: Box<dyn Socket>,
    rx: Vec<u8>,
    meta: Vec<RecvMeta>,
    /// (Boxed: it is large, and a `Nic` is moved into its thread or held inline.)
    tx: Box<TxBatch>,
    /// The last `recvmmsg` found the socket empty: the next asks for one datagram, not
    /// `RX_BATCH` (see [`Nic::receive`]).
    rx_empty: bool,
    /// `recvmmsg` calls made (those that found nothing included).
    rx_calls: u64,
}

impl Nic {
    /// A driver for `socket`, set up as [`Udp::new`] sets it up.
    pub fn new(socket: UdpSocket) -> io::Result<Self> {
        Ok(Nic::over(Box::new(Udp::new(socket)?)))
    }

    /// A driver for `socket`.
    pub fn over(socket: Box<dyn Socket>) -> Self {
        let local = socket.local_addr();
        Nic {
            socket,
            rx: vec![0; RX_BATCH * RX_BUF],
            meta: vec![RecvMeta::default(); RX_BATCH],
            tx: Box::new(TxBatch {
                buf: vec![0; TX_OWN_BYTES + MAX_PACKET],
                own: 0,
                pieces: Vec::with_capacity(MAX_IOV),
                mem: HeldRanges::default(),
                sealed: Vec::with_capacity(MAX_BATCHES),
                start: 0,
                len: 0,
                segment: 0,
                count: 0,
                packets: 0,
                bytes: 0,
                zero_copy: 0,
                dst: local,
                slot: 0,
                closed: false,
                stage: Stage {
                    copy_max: std::env::var(COPY_MAX_ENV)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(COPY_MAX),
                    ..Stage::default()
                },
                scratch: vec![0; remem_verbs::mem::READ_CHUNK],
            }),
            rx_empty: false,
            rx_calls: 0,
        }
    }

    /// Injects `cfg`'s faults (if any) into every packet this NIC sends: its socket is
    /// wrapped in a [`Faulty`] decorator.
    pub fn with_faults(mut self, cfg: FaultConfig) -> Self {
        if cfg.is_active() {
            self.socket = Box::new(Faulty::new(self.socket, cfg));
        }
        self
    }

    /// Records every packet this NIC sends and receives in `pcap` (if any): its socket is
    /// wrapped in a [`Capture`] decorator. Added after [`Nic::with_faults`], it records
    /// what the driver built, before the faults (a lost packet is recorded too).
    pub fn with_pcap(mut self, pcap: Option<Arc<PcapWriter>>) -> Self {
        if let Some(pcap) = pcap {
            self.socket = Box::new(Capture::new(self.socket, pcap));
        }
        self
    }

    /// When a packet the socket holds back (fault injection) becomes due.
    pub fn next_fault_due(&self) -> Option<Instant> {
        self.socket.next_due()
    }

    /// How many packets one send may carry (1 without GSO).
    pub fn max_gso_segments(&self) -> usize {
        self.socket.max_gso_segments()
    }

    /// How many packets one receive may return per datagram (1 without GRO).
    pub fn gro_segments(&self) -> usize {
        self.socket.gro_segments()
    }

    /// Runs due timers, sends everything that can be sent and handles what has arrived (at
    /// most `RX_CALLS` receive batches: a caller that keeps pumping while packets move
    /// reads the rest next time), without blocking. Returns how many packets and datagrams
    /// moved.
    pub fn pump(&mut self, engine: &Engine) -> usize {
        self.pump_with(engine, true)
    }

    /// [`Nic::pump`]; with `respond` false, what the received packets produced waits for
    /// the next pump's sends (see [`crate::SoftOptions::defer_responses`]).
    fn pump_with(&mut self, engine: &Engine, respond: bool) -> usize {
        let now = Instant::now();
        engine.on_timeout(now);
        let moved = self.socket.send_due(now, &engine.stats) + self.transmit(engine, now);
        let received = self.receive(engine);
        if received == 0 || !respond {
            return moved + received;
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
        let socket = self.socket.fd();
        let extra = self.socket.extra_fd();
        let in_ = rustix::event::PollFlags::IN;
        let mut fds = [
            rustix::event::PollFd::new(wake, in_),
            rustix::event::PollFd::new(&socket, in_),
            rustix::event::PollFd::new(&socket, in_),
        ];
        if let Some(extra) = &extra {
            fds[2] = rustix::event::PollFd::new(extra, in_);
        }
        let n = if extra.is_some() { 3 } else { 2 };
        // An error (EINTR) just ends the wait early.
        let _ = rustix::event::poll(&mut fds[..n], Some(&ts));
        !fds[0].revents().is_empty()
    }

    /// Waits until the socket is readable or `timeout` has passed.
    pub fn wait(&self, timeout: Duration) {
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let socket = self.socket.fd();
        let extra = self.socket.extra_fd();
        let in_ = rustix::event::PollFlags::IN;
        let mut fds = [
            rustix::event::PollFd::new(&socket, in_),
            rustix::event::PollFd::new(&socket, in_),
        ];
        if let Some(extra) = &extra {
            fds[1] = rustix::event::PollFd::new(extra, in_);
        }
        let n = if extra.is_some() { 2 } else { 1 };
        // An error (EINTR) just ends the wait early.
        let _ = rustix::event::poll(&mut fds[..n], Some(&ts));
    }

    fn transmit(&mut self, engine: &Engine, now: Instant) -> usize {
        let max_segments = self.socket.max_gso_segments().clamp(1, 64);
        let mut sent = 0;
        while sent < TX_BUDGET {
            let b = &mut self.tx;
            if b.count > 0
                && (b.count >= max_segments || b.closed || b.len + MAX_PACKET > TX_BATCH_BYTES)
            {
                if b.room_for_another(1) {
                    b.seal();
                } else {
                    self.flush(engine);
                }
            }
            if self.tx.own + MAX_PACKET > TX_OWN_BYTES {
                self.flush(engine);
            }
            let b = &mut self.tx;
            let own = b.own;
            b.stage.mark = b.mem.mark();
            let mut stager = Stager {
                buf: &mut b.buf[own..own + MAX_PACKET],
                stage: &mut b.stage,
                mem: &mut b.mem,
            };
            let Some((dst, len)) = engine.poll_transmit_into(now, &mut stager) else {
                // A packet whose building failed may have left references staged: their
                // accesses end now, not at the next pass (a deregistration waits for them).
                b.stage.pieces.clear();
                b.mem.truncate(b.stage.mark);
                break;
            };
            sent += 1;
            let staged = b.stage.finish(&mut b.buf[own..own + MAX_PACKET], len);
            // The BTH's destination QPN is bytes 5..8: its top byte names the process.
            let slot = b.buf.get(own + 5).copied().unwrap_or(0);
            let other = dst != b.dst || slot != b.slot;
            if b.count > 0 && (other || len > b.segment) && b.room_for_another(b.stage.pieces.len())
            {
                // It cannot join the open batch: it opens the next (sent in the same call).
                b.seal();
            }
            if b.packets > 0
                && ((b.count > 0 && (other || len > b.segment))
                    || b.pieces.len() + b.stage.pieces.len() > MAX_IOV)
            {
                // It cannot join these batches: send them, and start the next with it.
                let staged_mem = b.mem.split_off(b.stage.mark);
                self.flush(engine);
                let b = &mut self.tx;
                b.mem = staged_mem;
                b.stage.mark = Mark::default();
                b.buf.copy_within(own..own + staged, 0);
            }
            // Its ICRC covers the IPv4 identification the kernel gives it: its index in
            // the batch.
            let b = &mut self.tx;
            let (ip, ports) = engine.icrc_fields(dst, b.count as u16);
            let at = b.own;
            if b.stage
                .seal(
                    &mut b.buf[at..at + staged],
                    &mut b.scratch,
                    &b.mem,
                    len,
                    &ip,
                    ports,
                )
                .is_none()
            {
                b.mem.truncate(b.stage.mark);
                continue;
            }
            for piece in b.stage.pieces.drain(..) {
                let piece = match piece {
                    Piece::Own { start, len } => Piece::Own {
                        start: start + at,
                        len,
                    },
                    other => other,
                };
                // (Merged with the open batch's last piece; never with a sealed batch's.)
                let open = &mut b.pieces[b.start..];
                match (open.last_mut(), piece) {
                    (
                        Some(Piece::Own { start, len }),
                        Piece::Own {
                            start: next,
                            len: more,
                        },
                    ) if *start + *len == next => *len += more,
                    (_, piece) => b.pieces.push(piece),
                }
            }
            if b.count == 0 {
                b.dst = dst;
                b.slot = slot;
                b.segment = len;
            }
            b.closed = len < b.segment;
            b.zero_copy += usize::from(b.stage.scattered.is_some());
            b.count += 1;
            b.packets += 1;
            b.bytes += len;
            b.len += len;
            b.own += staged;
        }
        if self.tx.packets > 0 {
            self.flush(engine);
        }
        sent
    }

    /// Hands the batches, in order, to the socket (one `sendmmsg`, more when the socket
    /// takes only some), and empties them.
    fn flush(&mut self, engine: &Engine) {
        let b = &mut self.tx;
        if b.count > 0 {
            let open = b.open();
            b.sealed.push(open);
        }
        let b = &self.tx;
        self.socket.send(
            &Outgoing {
                own: &b.buf[..b.own],
                pieces: &b.pieces,
                mem: &b.mem,
                batches: &b.sealed,
                zero_copy: b.zero_copy,
            },
            &engine.stats,
        );
        engine
            .stats
            .sent_pkts
            .fetch_add(b.packets as u64, Ordering::Relaxed);
        self.tx.clear();
    }

    /// Handles what has arrived: up to `RX_CALLS` `recvmmsg` calls, each of up to
    /// `RX_BATCH` datagrams (each datagram possibly a GRO batch of packets).
    ///
    /// On a latency-bound path (a ping-pong) every call is on the critical path, so the
    /// calls are sized by what the last one found: after one that found the socket empty
    /// the next asks for one datagram (the kernel then returns as soon as it has one instead
    /// of looking for a second), after one that found datagrams for `RX_BATCH`; and a call
    /// that returned fewer datagrams than it had room for (or just the one it asked for)
    /// ends the pump's receiving, instead of one more call that would find the socket
    /// empty. A pump that stops early reads the rest next time.
    fn receive(&mut self, engine: &Engine) -> usize {
        let local_ip = engine.local().ip();
        let mut moved = 0;
        for _ in 0..RX_CALLS {
            let room = if self.rx_empty { 1 } else { RX_BATCH };
            self.rx_calls += 1;
            let mut chunks = self.rx.chunks_mut(RX_BUF);
            let mut bufs: [IoSliceMut<'_>; RX_BATCH] =
                std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or_default()));
            let n = match self.socket.recv(&mut bufs[..room], &mut self.meta[..room]) {
                Ok(n) => n,
                Err(_) => {
                    // WouldBlock, or an ICMP error with nothing to do.
                    self.rx_empty = true;
                    return moved;
                }
            };
            self.rx_empty = false;
            let short = n < room || room == 1;
            let now = Instant::now();
            let received = self.meta[..n].iter().zip(&bufs);
            // Every packet of the call, with the address it came from and went to, and its
            // index in its GRO batch (zero-length datagrams are wake-ups: no packets).
            let pkts = || {
                received.clone().flat_map(|(meta, buf)| {
                    let to = meta.dst_ip.unwrap_or(local_ip);
                    let stride = meta.stride.max(1);
                    buf[..meta.len]
                        .chunks(stride)
                        .enumerate()
                        .map(move |(i, pkt)| (meta.addr, to, pkt, i as u16))
                })
            };
            for (meta, _) in received.clone() {
                moved += 1;
                if meta.len > 0 {
                    engine.stats.rx_datagrams.fetch_add(1, Ordering::Relaxed);
                }
            }
            // The responses first (ACKs, READ and atomic responses), then the requests: a
            // peer that sends its reply and the ACK of this side's request together (the
            // reply first, the longer packet leading their GSO batch:
            // `SoftOptions::defer_responses`) still has this side see its own request
            // complete before the reply arrives, as the ACK-first order on the wire would.
            // The two kinds go to different halves of a QP (completer, responder): each
            // keeps its order.
            for pass in [true, false] {
                for (from, to, pkt, i) in pkts() {
                    if is_response(pkt) == pass {
                        let _ = engine.on_datagram(now, from, to, pkt, i);
                    }
                }
            }
            if short {
                break;
            }
        }
        moved
    }
}

/// How long an inline device's `progress` keeps pumping before it sleeps, when nothing
/// moved and its caller is willing to wait. A sleep costs a wake-up when the next packet
/// comes (the thread scheduled again, on two cores often after a context switch of the
/// peer process): with a 50 µs spin, `remem perf --loopback write_bw -s 64` (whose
/// benchmark thread waits in the device while its window is full) went from 0.99–1.12 to
/// 2.17–2.26 Mpps, 64 KiB unchanged (BENCHMARKS.md). Only the caller's own thread spins,
/// and only within the wait it asked for.
pub const INLINE_SPIN: Duration = Duration::from_micros(50);

/// Whether a received packet is a response (by its BTH opcode; nothing else is looked at).
fn is_response(pkt: &[u8]) -> bool {
    pkt.first()
        .and_then(|&b| remem_wire::Opcode::from_u8(b))
        .is_some_and(remem_wire::Opcode::is_response)
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
        let local = nic.socket.local_addr();
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

    /// Waits (at most `limit`) until `done()` holds, then until the pass of the thread in
    /// progress at that moment has ended: each pass hands what it built to the socket
    /// before it ends, so the packets the thread took from the engine before `done()` held
    /// have left. Returns whether `done()` held in time. On the thread itself nothing can
    /// be waited for: it returns `done()` at once (the thread sends it on its next pass).
    pub fn wait_sent(&self, limit: Duration, done: &dyn Fn() -> bool) -> bool {
        if self.on_thread() {
            return done();
        }
        let deadline = Instant::now() + limit;
        loop {
            let pass = self.passes.load(Ordering::Acquire);
            if done() {
                while self.passes.load(Ordering::Acquire) == pass && Instant::now() < deadline {
                    self.wake();
                    // A bounded wait inside a call that may block (as `rdma_disconnect`
                    // does), as in `flush`.
                    std::thread::sleep(Duration::from_micros(20));
                }
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.wake();
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Whether the caller is the progress thread itself.
    fn on_thread(&self) -> bool {
        self.thread
            .as_ref()
            .is_some_and(|t| t.thread().id() == std::thread::current().id())
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

    /// Whether the thread waits for work (or is about to): the next `wake` writes.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> bool {
        self.waker.waiting.load(Ordering::SeqCst)
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
    /// Spinning calls leave responses for the next call ([`Inline::defer_responses`]).
    defer: bool,
}

impl Inline {
    /// Inline progress over `nic`.
    pub fn new(nic: Nic) -> Self {
        Inline { nic, defer: false }
    }

    /// With `defer`, a call with no timeout leaves what its received packets produced
    /// (ACKs, READ and atomic responses) for the next call's sends, where they leave in
    /// one `sendmmsg` with what the application posted meanwhile (see
    /// [`crate::SoftOptions::defer_responses`]).
    pub fn defer_responses(mut self, defer: bool) -> Self {
        self.defer = defer;
        self
    }

    /// Runs due timers, sends what can be sent, and handles received packets; if nothing
    /// happened, waits up to `timeout` (bounded by the next timer) for a packet and handles
    /// it: it keeps pumping for the first [`INLINE_SPIN`] of the wait, then sleeps in
    /// `poll(2)`. Returns the number of packets sent and datagrams received.
    pub fn progress(&mut self, engine: &Engine, timeout: Duration) -> usize {
        let moved = self
            .nic
            .pump_with(engine, !(self.defer && timeout.is_zero()));
        if moved > 0 || timeout.is_zero() || engine.has_ready() {
            return moved;
        }
        let spin = INLINE_SPIN.min(timeout);
        let started = Instant::now();
        while started.elapsed() < spin {
            let moved = self.nic.pump(engine);
            if moved > 0 || engine.has_ready() {
                return moved;
            }
        }
        let timeout = timeout.saturating_sub(started.elapsed());
        if timeout.is_zero() {
            return 0;
        }
        self.nic
            .wait(time_to_next_timer(engine, &self.nic, timeout));
        self.nic.pump(engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine and its NIC on 127.0.0.1, and a plain socket that sends to it.
    fn nic() -> (Engine, Nic, UdpSocket) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = socket.local_addr().unwrap();
        let engine = Engine::new(local, local.port());
        let nic = Nic::new(socket).unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.connect(local).unwrap();
        (engine, nic, peer)
    }

    /// Sends `n` datagrams of different lengths (so none is coalesced with another) and
    /// waits until the NIC's socket holds them all.
    fn queue(peer: &UdpSocket, nic: &Nic, n: usize) {
        for i in 0..n {
            peer.send(&vec![0xee; 20 + i]).unwrap();
        }
        // Loopback delivers in the sending call; the wait only guards against a slow host.
        nic.wait(Duration::from_secs(5));
    }

    fn received(engine: &Engine) -> u64 {
        engine.stats.rx_datagrams.load(Ordering::Relaxed)
    }

    #[test]
    fn a_receive_after_an_empty_socket_asks_for_one_datagram_then_for_a_batch() {
        let (engine, mut nic, peer) = nic();
        // Nothing there: the next call is sized for one datagram.
        assert_eq!(nic.pump(&engine), 0);
        assert_eq!(nic.rx_calls, 1);
        queue(&peer, &nic, 20);
        nic.pump(&engine);
        assert_eq!(
            received(&engine),
            1,
            "one datagram asked for after an empty socket"
        );
        // That call found one: the next asks for a batch, and stops at a full one only
        // after RX_CALLS calls.
        nic.pump(&engine);
        assert_eq!(received(&engine), 20, "the rest in one pump");
        // The socket is empty again (a short call ended that pump without finding it so);
        // a pump finds it empty, and the next receive is one datagram again.
        assert_eq!(nic.pump(&engine), 0);
        queue(&peer, &nic, 3);
        nic.pump(&engine);
        assert_eq!(received(&engine), 21);
    }

    #[test]
    fn a_short_receive_ends_the_pump() {
        let (engine, mut nic, peer) = nic();
        // A fresh NIC asks for a batch; three datagrams come back, fewer than it had room
        // for: the pump stops receiving there (its next call would find the socket empty).
        queue(&peer, &nic, 3);
        nic.pump(&engine);
        assert_eq!(received(&engine), 3);
        assert_eq!(nic.rx_calls, 1, "no call after the short one");
        // A datagram that arrives now is not read by that pump, but by the next one, which
        // asks for a batch (the last call found datagrams).
        queue(&peer, &nic, 2);
        nic.pump(&engine);
        assert_eq!(received(&engine), 5);
    }

    #[test]
    fn a_socket_bound_to_one_address_asks_for_no_ancillary_data() {
        let on = |socket: &UdpSocket, level, name| {
            crate::io::sys::tests::int_option(socket, level, name)
        };
        let bound = UdpSocket::bind("127.0.0.1:0").unwrap();
        let probe = bound.try_clone().unwrap();
        let _nic = Nic::new(bound).unwrap();
        assert_eq!(on(&probe, libc::IPPROTO_IP, libc::IP_PKTINFO), 0);
        assert_eq!(on(&probe, libc::IPPROTO_IP, libc::IP_RECVTOS), 0);
        assert_eq!(on(&probe, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS), 0);
        assert_ne!(on(&probe, libc::SOL_UDP, libc::UDP_GRO), 0, "GRO stays on");
        // A wildcard socket needs each datagram's destination address.
        let any = UdpSocket::bind("0.0.0.0:0").unwrap();
        let probe = any.try_clone().unwrap();
        let _nic = Nic::new(any).unwrap();
        assert_ne!(on(&probe, libc::IPPROTO_IP, libc::IP_PKTINFO), 0);
    }
}
