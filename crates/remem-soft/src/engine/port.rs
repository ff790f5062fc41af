//! What the engine knows of the objects above it: a queue pair through [`QpPort`], the GSI
//! (QP 1, the connection manager) through [`GsiPort`]. The verbs layer implements both
//! (`verbs::qp::SoftQp`, `verbs::cm_id::CmDevice`); the engine names neither.
//!
//! The engine's own bookkeeping of a QP — whether its transmit queue holds the QP alive,
//! whether its set of QPs with timers holds it, the QP's next deadline as last published —
//! is a [`QpMarks`], which the engine reads and writes; a QP only carries it (it is
//! reached without a lock on every packet, and the QP publishes its deadline into it under
//! its own lock, from whichever thread changed its timers).

use crate::transport::glue::Fill;
use crate::transport::{RxPacket, TxPacket, UdSource};
use remem_verbs::QpType;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::DropCause;

/// Where a packet goes, as its QP's or address handle's address vector says: the
/// destination GID's IP address, at `udp_port` when it names one (0: the device's default
/// for that address, [`crate::engine::Engine::peer_addr`]). The port is the path's alone
/// — a connection learns it from its peer — so no other path's destination changes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// The destination GID, as on the wire: a loopback device's link-local GID mapped to
    /// its address ([`crate::device::netdev::wire_gid`]).
    pub dgid: remem_verbs::Gid,
    /// The destination UDP port; 0: the device's default.
    pub udp_port: u16,
}

impl Path {
    /// Whether the source UDP port of the path's packets is checked: when the path names a
    /// port other than 4791. Only soft devices receive elsewhere than 4791, and a soft
    /// device sends from the port it receives on; a 4791 peer (a NIC, kernel rxe) sends
    /// from a port of its choosing (its flow entropy), which tells nothing.
    pub fn checks_source_port(&self) -> bool {
        self.udp_port != 0 && self.udp_port != remem_verbs::ROCEV2_UDP_PORT
    }

    /// Whether a packet from `ip`, UDP port `port`, comes from the path's peer: its
    /// destination GID's address (an IPv4 source matches the IPv4-mapped GID), and its
    /// port when [`Path::checks_source_port`].
    pub fn is_source(&self, ip: IpAddr, port: u16) -> bool {
        remem_verbs::Gid::from(ip.to_canonical()) == self.dgid
            && (!self.checks_source_port() || port == self.udp_port)
    }
}

/// How a QP hands the engine its next packet ([`QpPort::poll_transmit`]): called at most
/// once, with the packet's headers, its path and a writer for its payload; returns the
/// packet's whole length, or `None` when it could not be built (it is then skipped).
pub type Emit<'a> = dyn FnMut(&TxPacket, Path, &mut Fill<'_>) -> Option<usize> + 'a;

/// A queue pair as the engine sees it: packets in, packets out, timers, release. The
/// engine's registry holds each weakly (`Weak<dyn QpPort>`): dropping the application's
/// last handle destroys the QP.
pub trait QpPort: Send + Sync + std::fmt::Debug {
    /// The QP number.
    fn number(&self) -> u32;

    /// The transport service (a packet of another service is dropped before the QP sees
    /// it).
    fn service(&self) -> QpType;

    /// The engine's bookkeeping of this QP (see [`QpMarks`]).
    fn marks(&self) -> &QpMarks;

    /// Handles a packet addressed to this QP, received from `src` (from UDP port
    /// `src_port`); an error says why it was dropped.
    fn handle_packet(
        &self,
        now: Instant,
        pkt: &RxPacket<'_>,
        src: &UdSource,
        src_port: u16,
    ) -> Result<(), DropCause>;

    /// Produces the next packet through `emit` (`None`: nothing to send now; `Some(r)`:
    /// what `emit` returned), and whether the QP may have more to send now (`false` only
    /// when it knows it has nothing: the engine then leaves it out of its ready queue until
    /// something marks it again). `requests_first`: an RC QP sends its own requests before
    /// the responses it owes.
    fn poll_transmit(
        &self,
        now: Instant,
        requests_first: bool,
        emit: &mut Emit<'_>,
    ) -> (Option<Option<usize>>, bool);

    /// The next deadline of this QP's timers.
    fn next_timeout(&self) -> Option<Instant>;

    /// Handles expired timers.
    fn handle_timeout(&self, now: Instant);

    /// The application dropped its last handle while the engine still holds the QP to
    /// send what it owes: it takes no more packets, runs no timers, and sends only the
    /// acknowledgements it had queued.
    fn release(&self);
}

/// The GSI (QP 1) as the engine sees it: the connection manager of the device, which takes
/// the MADs received on QP 1 and gives those to send. It reports what they bring (a new
/// connection request, a reply…) to its own users, above the engine.
pub trait GsiPort: Send + Sync + std::fmt::Debug {
    /// Handles a MAD received from `from`.
    fn on_mad(&self, now: Instant, from: IpAddr, mad: &[u8]);

    /// The next MAD to send: its destination and bytes.
    fn poll_transmit(&self) -> Option<(IpAddr, Box<[u8; crate::cm::MAD_LEN]>)>;

    /// The next timer deadline.
    fn next_timeout(&self) -> Option<Instant>;

    /// Runs the timers due at `now`.
    fn on_timeout(&self, now: Instant);
}

/// The engine's bookkeeping of one QP, carried by the QP ([`QpPort::marks`]) so that the
/// engine reads it without the QP's lock or its own.
#[derive(Debug)]
pub struct QpMarks {
    /// Whether the engine's transmit queue holds a strong reference (kept with that
    /// reference, under the engine's lock).
    held: AtomicBool,
    /// The QP's next timer deadline as of the last call into its transport
    /// ([`super::deadline_ns`]; `u64::MAX`: none).
    deadline: AtomicU64,
    /// Whether the engine's set of QPs with timers holds the QP (set and cleared by the
    /// engine under that set's lock).
    timed: AtomicBool,
}

impl Default for QpMarks {
    fn default() -> Self {
        QpMarks {
            held: AtomicBool::new(false),
            deadline: AtomicU64::new(u64::MAX),
            timed: AtomicBool::new(false),
        }
    }
}

impl QpMarks {
    /// Publishes the QP's next timer deadline (with the QP's lock held, after any call
    /// into its transport that may have changed its timers).
    pub fn publish_deadline(&self, next: Option<Instant>) {
        self.deadline
            .store(super::deadline_ns(next), Ordering::Relaxed);
    }

    pub(super) fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::Relaxed);
    }

    pub(super) fn is_held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    pub(super) fn deadline_ns(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }

    pub(super) fn is_timed(&self) -> bool {
        self.timed.load(Ordering::Relaxed)
    }

    pub(super) fn set_timed(&self, timed: bool) {
        self.timed.store(timed, Ordering::Relaxed);
    }
}
