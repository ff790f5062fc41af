//! The socket of a shared device's member: [`HostSocket`], a decorator of the driver's
//! [`Socket`] around the member's UDP socket in the reuseport group. What it receives
//! for another member (see [`super::steer`]) it forwards to that member's Unix socket
//! instead of handing it to the driver; what other members forward to it, it hands to the
//! driver as if it had arrived on its own socket (with the original source and
//! destination). The driver waits on both sockets (`Socket::extra_fd`).

use super::Host;
use super::steer::{self, Owner};
use crate::engine::EngineStats;
use crate::io::socket::{Outgoing, Socket};
use quinn_udp::RecvMeta;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// How often, at most, a member whose own socket keeps delivering looks at its Unix socket.
const FORWARD_CHECK: std::time::Duration = std::time::Duration::from_micros(100);

/// The header of a forwarded datagram: its source address (16 bytes, IPv6 or IPv4-mapped)
/// and port, and its destination address.
const FWD_HEADER: usize = 16 + 2 + 16;

/// A member's socket (see the module documentation).
#[derive(Debug)]
pub struct HostSocket<S> {
    inner: S,
    host: Arc<Host>,
    /// A buffer for one forwarded datagram.
    scratch: Vec<u8>,
    /// When the Unix socket was last read.
    unix_checked: std::time::Instant,
    /// Whether that read found a forwarded datagram (then the next looks again at once).
    unix_found: bool,
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

impl<S: Socket> HostSocket<S> {
    /// Wraps `inner`, the member's socket of `host`.
    pub fn new(inner: S, host: Arc<Host>) -> io::Result<Self> {
        Ok(HostSocket {
            inner,
            host,
            scratch: vec![0; FWD_HEADER + 65536],
            unix_checked: std::time::Instant::now(),
            unix_found: true,
        })
    }

    /// The member the packet is for, when it is another than this one.
    fn elsewhere(&self, pkt: &[u8]) -> Option<u8> {
        let me = self.host.slot;
        match steer::owner(pkt) {
            Owner::Slot(s) if s == me => None,
            Owner::Any => None,
            Owner::Slot(s) => {
                let view = self.host.view.read().unwrap_or_else(|p| p.into_inner());
                view.member(s).map(|m| m.slot)
            }
            Owner::Service(sid) => {
                // A listen changes the table without ringing the members (and a listener
                // registered a moment ago may not be in the view): a request reads the
                // table itself, once per request (a few microseconds from /dev/shm).
                self.host.reload();
                let view = self.host.view.read().unwrap_or_else(|p| p.into_inner());
                view.listener(sid)
                    .filter(|&s| s != me && view.member(s).is_some())
            }
        }
    }

    fn forward(&mut self, to: u8, from: SocketAddr, dst: IpAddr, pkt: &[u8]) {
        let n = FWD_HEADER + pkt.len();
        let Some(buf) = self.scratch.get_mut(..n) else {
            return;
        };
        buf[..16].copy_from_slice(&v6(from.ip()).octets());
        buf[16..18].copy_from_slice(&from.port().to_be_bytes());
        buf[18..34].copy_from_slice(&v6(dst).octets());
        buf[FWD_HEADER..].copy_from_slice(pkt);
        let stats = &self.host.stats;
        match self.host.unix.send_to(buf, self.host.sock_path(to)) {
            Ok(_) => stats.forwarded_out.fetch_add(1, Ordering::Relaxed),
            Err(_) => stats.forward_failed.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Receives what other members forwarded, into `bufs` (one datagram each).
    fn recv_forwarded(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> usize {
        let mut n = 0;
        while n < bufs.len() {
            let Ok(len) = self.host.unix.recv(&mut self.scratch) else {
                break;
            };
            let Some(pkt) = self.scratch.get(FWD_HEADER..len) else {
                continue;
            };
            if pkt.len() > bufs[n].len() {
                continue;
            }
            let ip = |b: &[u8]| {
                let a = Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap_or_default());
                IpAddr::V6(a).to_canonical()
            };
            let from = SocketAddr::new(
                ip(&self.scratch[..16]),
                u16::from_be_bytes([self.scratch[16], self.scratch[17]]),
            );
            let dst = ip(&self.scratch[18..34]);
            bufs[n][..pkt.len()].copy_from_slice(pkt);
            let m = &mut meta[n];
            m.addr = from;
            m.len = pkt.len();
            m.stride = pkt.len();
            m.dst_ip = Some(dst);
            m.ecn = None;
            self.host.stats.forwarded_in.fetch_add(1, Ordering::Relaxed);
            n += 1;
        }
        n
    }

    /// Forwards the packets of received datagram `i` that are another member's, and
    /// moves the rest to the front of its buffer.
    fn steer(&mut self, buf: &mut [u8], m: &mut RecvMeta) {
        let stride = m.stride.max(1);
        let len = m.len.min(buf.len());
        // The common case: every packet is this member's.
        if buf[..len]
            .chunks(stride)
            .all(|p| self.elsewhere(p).is_none())
        {
            return;
        }
        let dst = m.dst_ip.unwrap_or(self.host.local.ip());
        let (mut kept, mut at) = (0, 0);
        while at < len {
            let end = (at + stride).min(len);
            match self.elsewhere(&buf[at..end]) {
                Some(slot) => {
                    let pkt = buf[at..end].to_vec();
                    self.forward(slot, m.addr, dst, &pkt);
                }
                None => {
                    buf.copy_within(at..end, kept);
                    kept += end - at;
                }
            }
            at = end;
        }
        m.len = kept;
    }
}

impl<S: Socket> Socket for HostSocket<S> {
    fn send(&mut self, out: &Outgoing<'_>, stats: &EngineStats) {
        self.inner.send(out, stats)
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        // The member's own socket first: that is where its packets come. The Unix socket
        // (forwarded packets: rare) costs a system call, made at most every
        // `FORWARD_CHECK` when the UDP socket had less than asked for (a ping-pong finds it
        // empty once per message: a read each time cost it a microsecond per round trip).
        // A forwarded packet waits that long at most: a driver that sleeps is woken by it
        // (it waits on both sockets) and reads it on waking, unless it looked less than
        // `FORWARD_CHECK` ago — then it passes by until then.
        let (n, udp_err) = match self.inner.recv(bufs, meta) {
            Ok(n) => (n, None),
            Err(e) => (0, Some(e)),
        };
        for i in 0..n {
            let mut m = meta[i];
            self.steer(&mut bufs[i], &mut m);
            meta[i] = m;
        }
        let mut forwarded = 0;
        let now = std::time::Instant::now();
        let look = n < bufs.len()
            && (self.unix_found || now.duration_since(self.unix_checked) >= FORWARD_CHECK);
        if look {
            self.unix_checked = now;
            forwarded = self.recv_forwarded(&mut bufs[n..], &mut meta[n..]);
            self.unix_found = forwarded > 0;
        }
        match udp_err {
            Some(e) if forwarded == 0 => Err(e),
            _ => Ok(n + forwarded),
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd()
    }

    fn extra_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.host.unix.as_fd())
    }

    fn max_gso_segments(&self) -> usize {
        self.inner.max_gso_segments()
    }

    fn gro_segments(&self) -> usize {
        self.inner.gro_segments()
    }

    fn next_due(&self) -> Option<std::time::Instant> {
        self.inner.next_due()
    }

    fn send_due(&mut self, now: std::time::Instant, stats: &EngineStats) -> usize {
        self.inner.send_due(now, stats)
    }
}
