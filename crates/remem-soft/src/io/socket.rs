//! What the driver needs from its datagram socket ([`Socket`]): send a list of GSO
//! batches built from pieces, receive datagrams (GRO batches) with their segment sizes and
//! sources, its local address, a descriptor to wait on. [`Udp`] is the real one (a UDP
//! socket, `sys`'s scatter/gather `sendmmsg`, quinn-udp's `recvmmsg`); fault injection
//! ([`crate::io::faulty::Faulty`]) and capture ([`crate::io::capture::Capture`]) are
//! decorators that implement the same trait around an inner socket, as smoltcp's
//! `FaultInjector` and `PcapWriter` wrap a `Device`. The driver's `Nic` holds one boxed
//! socket: without faults and capture that is the [`Udp`] itself (one indirect call per
//! send or receive call, none per packet).
//!
//! [`packets`] cuts an [`Outgoing`]'s batches into their packets, for the decorators.

#![forbid(unsafe_code)]

use crate::engine::EngineStats;
use crate::io::sys::{self, Batch, Piece};
use crate::mem::grant::HeldRanges;
use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Socket buffer size asked for (the kernel caps it at `net.core.[rw]mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;

/// The batches one send hands a socket: GSO batches (each to one destination, its packets
/// all of one size but the last) whose bytes are `pieces` — ranges of `own`, and payload
/// references into `mem` — as `sys::send_batches` takes them.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The batches' own bytes (headers, copied payloads, pads, ICRCs).
    pub own: &'a [u8],
    /// The pieces of all the batches, in order.
    pub pieces: &'a [Piece],
    /// The payload references the pieces name.
    pub mem: &'a HeldRanges,
    /// The batches, in order.
    pub batches: &'a [Batch],
    /// How many of their packets reference their payload (none copied): the socket that
    /// sends them counts them (`tx_zero_copy_pkts`).
    pub zero_copy: usize,
}

/// A datagram socket as the driver uses it (see the module documentation).
pub trait Socket: Send + std::fmt::Debug {
    /// Sends `out`'s batches in order, best effort (a batch the socket refuses is lost, as
    /// on a wire: RC retransmits), counting in `stats` what it sends (`tx_datagrams`,
    /// `tx_zero_copy_pkts`; a fault injector its faults).
    fn send(&mut self, out: &Outgoing<'_>, stats: &EngineStats);

    /// Receives up to `bufs.len()` datagrams without blocking (each possibly a GRO batch
    /// of packets of `meta.stride` bytes) into `bufs`, their sources and sizes into `meta`;
    /// returns how many (`WouldBlock` when there are none).
    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize>;

    /// The address the socket is bound to.
    fn local_addr(&self) -> SocketAddr;

    /// The descriptor that is readable when a datagram waits (and writable when a send
    /// can go).
    fn fd(&self) -> BorrowedFd<'_>;

    /// A second descriptor the driver also waits on, readable when datagrams wait
    /// elsewhere (a shared device's member: what other members forwarded). Polled beside
    /// [`Socket::fd`] rather than joined to it in an epoll set, whose nested wake-up cost a
    /// ping-pong about a microsecond per round trip.
    fn extra_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// How many packets one GSO batch may carry (1 without GSO).
    fn max_gso_segments(&self) -> usize;

    /// How many packets one received datagram may carry (1 without GRO).
    fn gro_segments(&self) -> usize;

    /// When a packet the socket holds back (a fault injector's delayed or reordered one)
    /// becomes due: the driver wakes for it.
    fn next_due(&self) -> Option<Instant> {
        None
    }

    /// Sends what it holds back that is due at `now`; returns how many datagrams.
    fn send_due(&mut self, _now: Instant, _stats: &EngineStats) -> usize {
        0
    }
}

impl<S: Socket + ?Sized> Socket for Box<S> {
    fn send(&mut self, out: &Outgoing<'_>, stats: &EngineStats) {
        (**self).send(out, stats)
    }
    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        (**self).recv(bufs, meta)
    }
    fn local_addr(&self) -> SocketAddr {
        (**self).local_addr()
    }
    fn fd(&self) -> BorrowedFd<'_> {
        (**self).fd()
    }
    fn extra_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).extra_fd()
    }
    fn max_gso_segments(&self) -> usize {
        (**self).max_gso_segments()
    }
    fn gro_segments(&self) -> usize {
        (**self).gro_segments()
    }
    fn next_due(&self) -> Option<Instant> {
        (**self).next_due()
    }
    fn send_due(&mut self, now: Instant, stats: &EngineStats) -> usize {
        (**self).send_due(now, stats)
    }
}

/// A UDP socket set up for RoCEv2: the real [`Socket`].
#[derive(Debug)]
pub struct Udp {
    socket: UdpSocket,
    state: UdpSocketState,
    local: SocketAddr,
    /// The socket is IPv6 (IPv4 destinations are given IPv4-mapped).
    v6: bool,
    /// GSO failed on this socket (a device without the offloads): one packet per send.
    gso_failed: bool,
}

impl Udp {
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
        if !local.ip().is_unspecified() {
            // Bound to one address: no per-datagram destination address, TOS or timestamp.
            sys::quiet_receive(&socket, local.is_ipv6())?;
        }
        Ok(Udp {
            socket,
            state,
            local,
            v6: local.is_ipv6(),
            gso_failed: false,
        })
    }
}

impl Socket for Udp {
    /// One `sendmmsg` for all the batches (more when the socket takes only some; a full
    /// socket buffer is waited for, 1 ms at a time, three times at most).
    fn send(&mut self, out: &Outgoing<'_>, stats: &EngineStats) {
        let send = |first: usize| {
            sys::send_batches(
                &self.socket,
                self.v6,
                out.own,
                out.pieces,
                out.mem,
                first,
                out.batches,
            )
        };
        let mut first = 0;
        let mut full = 0;
        while first < out.batches.len() {
            match send(first) {
                Ok(0) => break,
                Ok(n) => first += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if full == 3 {
                        break;
                    }
                    full += 1;
                    let mut fds = [rustix::event::PollFd::new(
                        &self.socket,
                        rustix::event::PollFlags::OUT,
                    )];
                    let ts = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    let _ = rustix::event::poll(&mut fds, Some(&ts));
                }
                Err(e) => {
                    if out.batches[first].segment.is_some()
                        && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL))
                    {
                        // The kernel cannot segment for this socket's device (as
                        // quinn-udp, from then on one packet per send); these packets
                        // are lost, RC retransmits them.
                        self.gso_failed = true;
                    }
                    // This batch is lost; the others still go.
                    first += 1;
                }
            }
        }
        // A packet the socket refused is lost on the wire as far as the transport knows:
        // RC retransmits it, UD is unreliable anyway.
        stats
            .tx_datagrams
            .fetch_add(out.batches.len() as u64, Ordering::Relaxed);
        stats
            .tx_zero_copy_pkts
            .fetch_add(out.zero_copy as u64, Ordering::Relaxed);
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        self.state.recv(UdpSockRef::from(&self.socket), bufs, meta)
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    fn max_gso_segments(&self) -> usize {
        if self.gso_failed {
            1
        } else {
            self.state.max_gso_segments()
        }
    }

    fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

/// A part of one packet of an [`Outgoing`]: bytes of its `own` buffer, or payload
/// reference `i` of its `mem`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// `own[range]`.
    Own(Range<usize>),
    /// Range `i` of `mem`.
    Mem(usize),
}

/// One packet of an [`Outgoing`], as [`packets`] finds it.
#[derive(Debug)]
pub struct Packet<'p> {
    /// Its batch (an index of `batches`).
    pub batch: usize,
    /// Its index in that batch: the IPv4 identification the kernel gives it.
    pub index: u16,
    /// Its length.
    pub len: usize,
    /// Its parts, in order.
    pub parts: &'p [Part],
}

/// Calls `f` with every packet of `out`, in order: each batch cut at its segment size
/// (the pieces of a batch without one are one packet). Payload references are numbered as
/// `sys::send_batches` numbers them.
pub fn packets(out: &Outgoing<'_>, parts: &mut Vec<Part>, mut f: impl FnMut(Packet<'_>)) {
    // `Mem` pieces name `mem`'s ranges in order, over the whole list of pieces.
    let mems_before = |at: usize| {
        out.pieces[..at.min(out.pieces.len())]
            .iter()
            .filter(|p| matches!(p, Piece::Mem))
            .count()
    };
    for (k, b) in out.batches.iter().enumerate() {
        let seg = b.segment.map_or(usize::MAX, usize::from);
        let mut mem = mems_before(b.pieces.start);
        let mut index = 0u16;
        let mut filled = 0usize;
        parts.clear();
        let mut emit = |parts: &mut Vec<Part>, filled: &mut usize, index: &mut u16| {
            f(Packet {
                batch: k,
                index: *index,
                len: *filled,
                parts,
            });
            parts.clear();
            *filled = 0;
            *index = index.wrapping_add(1);
        };
        for piece in &out.pieces[b.pieces.clone()] {
            match *piece {
                Piece::Own { mut start, mut len } => {
                    while len > 0 {
                        let take = len.min(seg - filled);
                        parts.push(Part::Own(start..start + take));
                        (start, len, filled) = (start + take, len - take, filled + take);
                        if filled == seg {
                            emit(parts, &mut filled, &mut index);
                        }
                    }
                }
                Piece::Mem | Piece::Ref(_) => {
                    let i = match *piece {
                        Piece::Ref(i) => i,
                        _ => {
                            mem += 1;
                            mem - 1
                        }
                    };
                    parts.push(Part::Mem(i));
                    filled += out.mem.range_len(i).unwrap_or(0);
                    if filled >= seg {
                        emit(parts, &mut filled, &mut index);
                    }
                }
            }
        }
        if !parts.is_empty() {
            emit(parts, &mut filled, &mut index);
        }
    }
}

/// Copies the bytes of a packet's `parts` (of `out`) into `dst` (cleared first), reading
/// payload references through `scratch`.
pub fn gather(out: &Outgoing<'_>, parts: &[Part], scratch: &mut [u8], dst: &mut Vec<u8>) {
    dst.clear();
    for part in parts {
        match part {
            Part::Own(r) => dst.extend_from_slice(&out.own[r.clone()]),
            Part::Mem(i) => {
                // A reference was readable when the packet was built: its access is held.
                let _ = out
                    .mem
                    .read_chunks(*i, scratch, |c| dst.extend_from_slice(c));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::io::sys::tests::held;
    use remem_wire::icrc;

    /// Where the fixture's packets come from and go.
    pub(crate) const LOCAL: &str = "127.0.0.1:4791";
    pub(crate) const PEER: &str = "127.0.0.2:4791";

    /// A socket that keeps what it is handed: per call, its batches' packets (index in the
    /// batch and bytes), and whether each used a payload reference by name.
    #[derive(Debug)]
    pub(crate) struct Wire {
        /// For its descriptor only.
        socket: UdpSocket,
        /// Per send call: per batch, its packets' bytes.
        pub(crate) calls: Vec<Vec<Vec<Vec<u8>>>>,
        /// `Piece::Ref` pieces seen.
        pub(crate) refs: usize,
        /// `zero_copy` of the calls, summed.
        pub(crate) zero_copy: usize,
    }

    impl Wire {
        pub(crate) fn new() -> Self {
            Wire {
                socket: UdpSocket::bind("127.0.0.1:0").unwrap(),
                calls: Vec::new(),
                refs: 0,
                zero_copy: 0,
            }
        }
    }

    impl Socket for Wire {
        fn send(&mut self, out: &Outgoing<'_>, _stats: &EngineStats) {
            let mut batches: Vec<Vec<Vec<u8>>> = vec![Vec::new(); out.batches.len()];
            let mut scratch = vec![0; 64];
            packets(out, &mut Vec::new(), |p| {
                assert_eq!(usize::from(p.index), batches[p.batch].len());
                let mut bytes = Vec::new();
                gather(out, p.parts, &mut scratch, &mut bytes);
                assert_eq!(bytes.len(), p.len);
                batches[p.batch].push(bytes);
            });
            self.refs += out
                .pieces
                .iter()
                .filter(|p| matches!(p, Piece::Ref(_)))
                .count();
            self.zero_copy += out.zero_copy;
            self.calls.push(batches);
        }
        fn recv(&mut self, _: &mut [IoSliceMut<'_>], _: &mut [RecvMeta]) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
        fn local_addr(&self) -> SocketAddr {
            LOCAL.parse().unwrap()
        }
        fn fd(&self) -> BorrowedFd<'_> {
            self.socket.as_fd()
        }
        fn max_gso_segments(&self) -> usize {
            64
        }
        fn gro_segments(&self) -> usize {
            64
        }
    }

    /// The ICRC fields of a packet from [`LOCAL`] to [`PEER`] with IPv4 identification `id`.
    pub(crate) fn fields(id: u16) -> (icrc::IpFields, icrc::UdpPorts) {
        let (l, p): (SocketAddr, SocketAddr) = (LOCAL.parse().unwrap(), PEER.parse().unwrap());
        (
            crate::engine::ip_fields(l.ip(), p.ip(), id),
            icrc::UdpPorts {
                src: l.port(),
                dst: p.port(),
            },
        )
    }

    /// A GSO batch of `n` RDMA WRITE MIDDLE packets to [`PEER`] as the driver builds one:
    /// each a BTH (its PSN `k`) in own bytes, 64 payload bytes referenced, its ICRC (for
    /// identification `k`, its index) in own bytes, the ICRC and the next BTH one piece.
    /// Returns the packets whole, and the call's own bytes, pieces, references and batch.
    #[allow(clippy::type_complexity)]
    pub(crate) fn batch(n: usize) -> (Vec<Vec<u8>>, Vec<u8>, Vec<Piece>, HeldRanges, Batch) {
        const PAYLOAD: usize = 64;
        let data: Vec<u8> = (0..n * PAYLOAD).map(|i| (i * 13 + 5) as u8).collect();
        let mut pkts = Vec::new();
        let mut own = Vec::new();
        let mut pieces = Vec::new();
        for k in 0..n {
            let mut pkt = vec![0x07, 0, 0xff, 0xff, 0, 0, 0x12, 0x34, 0, 0, 0, k as u8];
            pkt.extend_from_slice(&data[k * PAYLOAD..(k + 1) * PAYLOAD]);
            pkt.extend_from_slice(&[0; 4]);
            let (ip, ports) = fields(k as u16);
            icrc::fill(&ip, ports, &mut pkt).unwrap();
            let at = own.len();
            own.extend_from_slice(&pkt[..12]);
            match pieces.last_mut() {
                Some(Piece::Own { len, .. }) => *len += 12,
                _ => pieces.push(Piece::Own { start: at, len: 12 }),
            }
            pieces.push(Piece::Mem);
            let at = own.len();
            own.extend_from_slice(&pkt[pkt.len() - 4..]);
            pieces.push(Piece::Own { start: at, len: 4 });
            pkts.push(pkt);
        }
        let ranges: Vec<(usize, usize)> = (0..n).map(|k| (k * PAYLOAD, PAYLOAD)).collect();
        let mem = held(&data, &ranges);
        let batch = Batch {
            dst: PEER.parse().unwrap(),
            segment: Some((12 + PAYLOAD + 4) as u16),
            pieces: 0..pieces.len(),
        };
        (pkts, own, pieces, mem, batch)
    }

    #[test]
    fn packets_cuts_a_batch_at_its_segment_size_across_merged_pieces() {
        let (pkts, own, pieces, mem, batch) = batch(5);
        let batches = [batch];
        let out = Outgoing {
            own: &own,
            pieces: &pieces,
            mem: &mem,
            batches: &batches,
            zero_copy: 5,
        };
        let mut wire = Wire::new();
        wire.send(&out, &EngineStats::default());
        assert_eq!(wire.calls, [[pkts]]);
    }
}
