//! A soft device's packet engine: QP registry, dispatch of received packets, transmit
//! scheduling, timers, the GSI QP and multicast groups ([`mcast`]). It knows a QP through
//! one narrow port, [`QpPort`] (packets in, packets out, timers, release), and the GSI (the
//! connection manager) through [`GsiPort`]; the verbs layer implements both, and the
//! engine's own bookkeeping of a QP is a [`port::QpMarks`]. It does no socket IO
//! of its own (multicast groups aside): [`Engine::on_datagram`] takes a received UDP
//! payload, [`Engine::poll_transmit_into`] builds the next packet through a [`TxBuild`]
//! (the driver's stager: headers into its batch, the payload copied or referenced where it
//! lies for the scatter/gather send), [`Engine::next_timeout`] / [`Engine::on_timeout`]
//! drive the timers; the soft NIC driver ([`crate::io::driver`]) moves the datagrams.
//! `Engine::poll_transmit` (the whole packet copied into one buffer, ICRC sealed) and
//! `Engine::poll_transmit_unsealed` are for tests and tools (`internals`).
//!
//! ICRC and the IPv4 identification: the ICRC covers the IPv4 header's identification field,
//! which a UDP socket neither sets nor reports. Linux gives the packets of an unconnected
//! socket with DF set (IP_PMTUDISC_DO) identification 0, and when it splits a UDP GSO batch
//! into segments, segment `i` gets identification `i` (both checked with tcpdump). So the
//! driver seals each packet's ICRC for the identification it will carry (its index in the
//! GSO batch) once it knows the packet's place, and the ICRC a Linux rxe peer checks is
//! right.
//!
//! On receive, an IPv6 packet's ICRC is always verified (every covered header field is known
//! from the socket); a mismatch drops it. An IPv4 packet's identification is fitted with one
//! CRC pass ([`icrc::fit_ipv4_id`]): identification 0, then its index in the GRO batch it
//! arrived in (a remem sender's GSO segment); if neither fits — always the case for kernel
//! rxe, whose identifications are unpredictable — the identification is solved for from the
//! ICRC itself (a CRC is affine, so 16 unknown bits against 32 check bits leave a 16-bit
//! check): a packet some identification fits is counted as `icrc_id_recovered` and
//! accepted, any other is dropped as a bad ICRC.

#![forbid(unsafe_code)]

pub mod mcast;
pub mod port;

use crate::transport::glue;
pub use port::{GsiPort, QpPort};
use remem_verbs::QpType;
use remem_wire::Packet;
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use std::collections::VecDeque;

/// Maps and sets keyed by QP number, hashed cheaply (the keys are this device's own QP
/// numbers; a peer's packet can only look one up).
type QpnMap<V> = std::collections::HashMap<u32, V, BuildQpnHasher>;
type QpnSet = std::collections::HashSet<u32, BuildQpnHasher>;
type BuildQpnHasher = std::hash::BuildHasherDefault<crate::mem::mr::KeyHasher>;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

/// Where [`Engine::poll_transmit_into`] builds a packet: a buffer for its headers (and its
/// payload, where that is copied), and how its payload is taken.
pub trait TxBuild {
    /// The buffer the packet is built in (room for the largest packet: MTU 4096 plus
    /// headers).
    fn buf(&mut self) -> &mut [u8];

    /// Takes the payload of transport packet `tx`, whose headers are in `buf()[..hdr]` and
    /// whose payload's place is `buf()[hdr..hdr + tx.payload_len]` (pad and ICRC field,
    /// zeroed, follow it), by calling `fill` with a sink. An error drops the packet.
    fn payload(
        &mut self,
        tx: &crate::transport::TxPacket,
        hdr: usize,
        fill: &mut crate::transport::glue::Fill<'_>,
    ) -> Result<(), crate::transport::AccessError>;
}

/// Builds whole packets into a slice (payload copied).
#[cfg(any(test, feature = "internals"))]
struct CopyBuild<'a>(&'a mut [u8]);

#[cfg(any(test, feature = "internals"))]
impl TxBuild for CopyBuild<'_> {
    fn buf(&mut self) -> &mut [u8] {
        self.0
    }

    fn payload(
        &mut self,
        tx: &crate::transport::TxPacket,
        hdr: usize,
        fill: &mut crate::transport::glue::Fill<'_>,
    ) -> Result<(), crate::transport::AccessError> {
        let end = hdr + tx.payload_len as usize;
        let Some(dst) = self.0.get_mut(hdr..end) else {
            return Err(crate::transport::AccessError::Mem(
                remem_verbs::MemError::OutOfBounds {
                    offset: hdr as u64,
                    len: u64::from(tx.payload_len),
                    size: self.0.len() as u64,
                },
            ));
        };
        fill(&mut glue::CopySink(dst))
    }
}

/// Why a received datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropCause {
    /// Not a RoCEv2 packet remem understands.
    Malformed,
    /// The ICRC did not verify.
    BadIcrc,
    /// No QP with that number.
    UnknownQp,
    /// The opcode is of another transport service than the QP's (a UD SEND at an RC QP,
    /// an RC opcode at a UD or UC QP, a UC opcode at an RC QP: rxe's `check_type_state`).
    WrongTransport,
    /// An RC or UC packet whose source address is not the QP's destination GID (rxe's
    /// `check_addr`).
    WrongSource,
    /// A P_Key other than the default partition's (0xFFFF, or 0x7FFF for a limited
    /// member): rxe's `check_keys`.
    BadPkey,
    /// The destination QP's state takes no such packet: anything in RESET, INIT or ERR, an
    /// RC response (ACK, READ response) before RTS (rxe's `check_type_state`).
    QpState,
    /// A UD datagram whose Q_Key is not the destination QP's.
    BadQkey,
    /// A UD datagram, or a packet of a UC SEND (or WRITE with immediate), for a QP with
    /// no receive posted (UD and UC have no RNR: the message is lost).
    NoReceive,
    /// A packet of a UC message the responder refused silently (UC has no NAK): a WRITE
    /// its rkey or the QP's access flags do not allow, a SEND longer than its receive.
    Refused,
}

/// Packet counters of the engine.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Packets sent.
    pub sent_pkts: AtomicU64,
    /// Packets received and handed to a QP.
    pub rcvd_pkts: AtomicU64,
    /// Dropped: malformed.
    pub drop_malformed: AtomicU64,
    /// Dropped: bad ICRC.
    pub drop_bad_icrc: AtomicU64,
    /// Dropped: unknown destination QP.
    pub drop_unknown_qp: AtomicU64,
    /// Dropped: an opcode of another transport service than the destination QP's.
    pub drop_wrong_transport: AtomicU64,
    /// Dropped: an RC packet from another address than the QP's peer.
    pub drop_wrong_source: AtomicU64,
    /// Dropped: a P_Key not of the default partition.
    pub drop_bad_pkey: AtomicU64,
    /// Dropped: the destination QP's state takes no such packet.
    pub drop_qp_state: AtomicU64,
    /// Dropped: a UD datagram with another Q_Key than the QP's.
    pub drop_bad_qkey: AtomicU64,
    /// Dropped: a UD datagram, or a packet of a UC SEND or WRITE with immediate, for a QP
    /// with no receive posted.
    pub drop_ud_no_recv: AtomicU64,
    /// Dropped: a packet of a UC message the responder refused (an rkey or access
    /// violation, a SEND longer than its receive).
    pub drop_uc_refused: AtomicU64,
    /// IPv4 packets whose ICRC checked out with an IP identification recovered from the
    /// ICRC itself (the sender's identification was neither 0 nor its GSO index).
    pub icrc_id_recovered: AtomicU64,
    /// UDP sends (each may carry a GSO batch of packets).
    pub tx_datagrams: AtomicU64,
    /// Packets sent with their payload referenced where it lies in registered memory, not
    /// copied into the packet (the driver's scatter/gather send).
    pub tx_zero_copy_pkts: AtomicU64,
    /// Fault injection: packets lost.
    pub fault_dropped: AtomicU64,
    /// Fault injection: packets corrupted.
    pub fault_corrupted: AtomicU64,
    /// Fault injection: packets duplicated.
    pub fault_duplicated: AtomicU64,
    /// Fault injection: packets reordered.
    pub fault_reordered: AtomicU64,
    /// UDP datagrams received (each may carry a GRO batch of packets).
    pub rx_datagrams: AtomicU64,
}

/// How many peers' UDP ports one device remembers
/// ([`Context::set_peer_udp_port`](remem_verbs::Context::set_peer_udp_port)): a peer
/// beyond that is refused with [`remem_verbs::Error::Exhausted`] (16 bytes or so each, so
/// the table stays under a few hundred KiB however many peers an application names).
pub const PEER_PORT_BUDGET: usize = 4096;

/// The packet engine of one soft device.
#[derive(Debug)]
pub struct Engine {
    local: SocketAddr,
    /// RC QPs send their own requests before the responses they owe (a device that defers
    /// its responses: [`Engine::set_requests_first`]).
    requests_first: AtomicBool,
    /// Where packets go when the peer's address is not in `peer_ports`.
    peer_port: u16,
    /// The UDP ports of peers that receive elsewhere than `peer_port`, by (canonical) IP
    /// address; at most [`PEER_PORT_BUDGET`] entries.
    peer_ports: RwLock<std::collections::HashMap<IpAddr, u16>>,
    /// Whether `peer_ports` has ever held an entry: until then the transmit path takes no
    /// lock to pick a port.
    any_peer_port: AtomicBool,
    /// The last IPv4 peer `peer_addr` resolved through `peer_ports`, packed (address,
    /// port, the table's generation): a connection's packets skip the table's lock and
    /// hash. Valid while its generation is `peer_ports_gen`'s.
    last_peer: AtomicU64,
    /// Bumped by every change of `peer_ports` (invalidates `last_peer`).
    peer_ports_gen: AtomicU64,
    qps: RwLock<QpnMap<Weak<dyn QpPort>>>,
    ready: Mutex<Ready>,
    /// Whether `ready`'s queue is non-empty, as of its lock's last release: an idle pump
    /// reads this instead of taking the lock the application's posts take.
    ready_hint: AtomicBool,
    timed: Mutex<QpnSet>,
    /// No timer of a QP in `timed` is due before this ([`deadline_ns`]); lowered as QPs arm
    /// timers, recomputed by a full scan. An idle pump compares the time against it instead
    /// of locking every QP with a timer.
    deadline: AtomicU64,
    /// When `on_timeout` last scanned every timer ([`deadline_ns`]): it scans at least
    /// every [`FULL_SCAN_NS`] (the connection manager's timers are found that way).
    scanned: AtomicU64,
    /// The next PSN of the GSI (QP 1), which sends the connection manager's MADs.
    gsi_psn: AtomicU64,
    /// The connection manager, behind QP 1 (none until [`Engine::attach_gsi`]: MADs are
    /// then dropped as for an unknown QP).
    gsi: std::sync::OnceLock<Arc<dyn GsiPort>>,
    /// The multicast groups the device's UD QPs are attached to.
    pub mcast: crate::engine::mcast::McastTable,
    /// Counters.
    pub stats: EngineStats,
}

#[derive(Debug, Default)]
struct Ready {
    queue: VecDeque<u32>,
    set: QpnSet,
    /// QPs kept alive until their queued packets are out: an ACK owed for a message the
    /// application has already seen completed must leave even if it destroys the QP at
    /// once (else the peer retries into a void and fails with RETRY_EXC_ERR).
    held: QpnMap<Arc<dyn QpPort>>,
}

/// Where a received packet goes once [`Engine::admit`] let it through.
enum Admitted<'p> {
    /// A MAD for the GSI.
    Gsi(Arc<dyn GsiPort>, &'p [u8]),
    /// A packet for one QP.
    Qp(Arc<dyn QpPort>, crate::transport::RxPacket<'p>),
    /// A UD datagram for the QPs attached to its multicast group.
    Multicast(Vec<u32>, crate::transport::RxPacket<'p>),
}

/// Adds one to a counter.
fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// How often (nanoseconds) [`Engine::on_timeout`] scans every timer even when the cached
/// deadline says none is due: the connection manager arms timers from application threads
/// without telling the engine (its timeouts are milliseconds and more).
const FULL_SCAN_NS: u64 = 1_000_000;

/// The instant timer deadlines are counted from, so that one fits an atomic.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A deadline as nanoseconds since [`epoch`] (`u64::MAX`: none; one before the epoch: 0).
pub(crate) fn deadline_ns(t: Option<Instant>) -> u64 {
    t.map_or(u64::MAX, |t| {
        t.saturating_duration_since(epoch())
            .as_nanos()
            .min(u128::from(u64::MAX - 1)) as u64
    })
}

pub(crate) fn ip_fields(src: IpAddr, dst: IpAddr, id: u16) -> IpFields {
    match (src.to_canonical(), dst.to_canonical()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpFields::V4 {
            src: s,
            dst: d,
            id,
            flags_frag: IPV4_DF,
        },
        (s, d) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            IpFields::V6 {
                src: v6(s),
                dst: v6(d),
            }
        }
    }
}

impl Engine {
    /// An engine for a device bound to `local`, sending to peers on `peer_port`.
    /// (It does no IO: packet capture and fault injection are layers of the driver's
    /// `Nic`, as decorators of its socket: `Nic::with_pcap`, `Nic::with_faults`.)
    pub fn new(local: SocketAddr, peer_port: u16) -> Self {
        Engine {
            local,
            requests_first: AtomicBool::new(false),
            peer_port,
            peer_ports: RwLock::new(std::collections::HashMap::new()),
            any_peer_port: AtomicBool::new(false),
            last_peer: AtomicU64::new(0),
            peer_ports_gen: AtomicU64::new(1),
            qps: RwLock::new(QpnMap::default()),
            ready: Mutex::new(Ready::default()),
            ready_hint: AtomicBool::new(false),
            timed: Mutex::new(QpnSet::default()),
            deadline: AtomicU64::new(u64::MAX),
            scanned: AtomicU64::new(0),
            gsi_psn: AtomicU64::new(0),
            gsi: std::sync::OnceLock::new(),
            mcast: crate::engine::mcast::McastTable::default(),
            stats: EngineStats::default(),
        }
    }

    /// The local address.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Records that the peer at `ip` receives RoCEv2 on UDP `port`: every packet this
    /// device sends to `ip` afterwards — those of QPs and address handles whose address
    /// vector names no port of its own, and the connection manager's, new or existing —
    /// goes to that port instead of the device's default peer port. The application's
    /// device-wide configuration
    /// ([`Context::set_peer_udp_port`](remem_verbs::Context::set_peer_udp_port)): nothing a
    /// peer says writes it (a port learnt from a peer goes into that connection's path:
    /// [`Engine::path_addr`]).
    /// Setting a peer again overwrites its entry. Port 0 is
    /// [`remem_verbs::Error::InvalidArgument`]; a new peer beyond [`PEER_PORT_BUDGET`] is
    /// [`remem_verbs::Error::Exhausted`].
    ///
    /// ```
    /// use remem_soft::engine::Engine;
    /// let engine = Engine::new("127.0.0.1:4791".parse().unwrap(), 4791);
    /// let peer = "127.0.0.2".parse().unwrap();
    /// assert_eq!(engine.peer_addr(peer).port(), 4791);
    /// engine.set_peer_port(peer, 50_000).unwrap();
    /// assert_eq!(engine.peer_addr(peer), "127.0.0.2:50000".parse().unwrap());
    /// assert!(engine.set_peer_port(peer, 0).is_err());
    /// ```
    pub fn set_peer_port(&self, ip: IpAddr, port: u16) -> remem_verbs::Result<()> {
        if port == 0 {
            return Err(remem_verbs::Error::InvalidArgument(format!(
                "UDP port 0 for peer {ip}: a peer receives on a port of its own"
            )));
        }
        let ip = ip.to_canonical();
        let mut table = self.peer_ports.write().unwrap_or_else(|p| p.into_inner());
        if table.len() >= PEER_PORT_BUDGET && !table.contains_key(&ip) {
            return Err(remem_verbs::Error::Exhausted(
                "peer UDP port table (4096 peers per soft device)",
            ));
        }
        table.insert(ip, port);
        // (16 bits of the generation are cached: an entry stored before a change and
        // checked 65,536 changes later would be taken; clearing the cache here closes
        // even that for every lookup that starts after this.)
        self.peer_ports_gen.fetch_add(1, Ordering::AcqRel);
        self.last_peer.store(0, Ordering::Release);
        self.any_peer_port.store(true, Ordering::Release);
        Ok(())
    }

    /// The UDP address packets of a path to `ip` whose address vector names UDP port
    /// `port` go to: that port, a property of the path alone (a connection's, learnt from
    /// its peer: nothing else's destination changes with it); for `port` 0, as
    /// [`Engine::peer_addr`] says.
    ///
    /// ```
    /// use remem_soft::engine::Engine;
    /// let engine = Engine::new("127.0.0.1:4791".parse().unwrap(), 4791);
    /// let peer = "127.0.0.2".parse().unwrap();
    /// engine.set_peer_port(peer, 50_000).unwrap();
    /// assert_eq!(engine.path_addr(peer, 6000), "127.0.0.2:6000".parse().unwrap());
    /// assert_eq!(engine.path_addr(peer, 0), "127.0.0.2:50000".parse().unwrap());
    /// ```
    #[inline]
    pub fn path_addr(&self, ip: IpAddr, port: u16) -> SocketAddr {
        if port != 0 {
            return SocketAddr::new(ip, port);
        }
        self.peer_addr(ip)
    }

    /// The UDP address packets to the peer at `ip` go to when their path names no port:
    /// its port from [`Engine::set_peer_port`], else the device's default peer port.
    pub fn peer_addr(&self, ip: IpAddr) -> SocketAddr {
        if !self.any_peer_port.load(Ordering::Acquire) {
            return SocketAddr::new(ip, self.peer_port);
        }
        // The generation is read before the table: a change after this read makes what is
        // cached below stale at once (its generation is older than the table's).
        let generation = self.peer_ports_gen.load(Ordering::Acquire) & 0xffff;
        let v4 = match ip.to_canonical() {
            IpAddr::V4(v4) => Some(u32::from(v4)),
            IpAddr::V6(_) => None,
        };
        if let Some(v4) = v4 {
            let last = self.last_peer.load(Ordering::Acquire);
            if last >> 32 == u64::from(v4) && last & 0xffff == generation {
                return SocketAddr::new(ip, ((last >> 16) & 0xffff) as u16);
            }
        }
        let port = self
            .peer_ports
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip.to_canonical())
            .copied()
            .unwrap_or(self.peer_port);
        if let Some(v4) = v4 {
            let packed = (u64::from(v4) << 32) | (u64::from(port) << 16) | generation;
            self.last_peer.store(packed, Ordering::Release);
        }
        SocketAddr::new(ip, port)
    }

    /// Gives the engine its GSI (QP 1): the device's connection manager, which takes the
    /// MADs received on QP 1 and gives those to send. Set once; a second call is refused
    /// (`false`).
    pub fn attach_gsi(&self, gsi: Arc<dyn GsiPort>) -> bool {
        self.gsi.set(gsi).is_ok()
    }

    /// Registers a QP so that packets reach it. The engine holds it weakly: dropping the
    /// last handle destroys the QP.
    pub fn register(&self, qp: &Arc<dyn QpPort>) {
        let qpn = qp.number();
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qpn, Arc::downgrade(qp));
    }

    /// Whether a live QP has this number.
    pub fn has_qp(&self, qpn: u32) -> bool {
        self.qp(qpn).is_some()
    }

    /// Whether `qp` is registered with this engine (a QP of this device).
    pub fn owns(&self, qp: &Arc<dyn QpPort>) -> bool {
        self.qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&qp.number())
            .is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(qp)))
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<dyn QpPort>> {
        let found = self
            .qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&qpn)
            .map(Weak::upgrade);
        match found {
            Some(Some(qp)) => Some(qp),
            Some(None) => {
                // Forget the dead entry, unless a new QP took the number meanwhile.
                let mut qps = self.qps.write().unwrap_or_else(|p| p.into_inner());
                if qps.get(&qpn).is_some_and(|w| w.strong_count() == 0) {
                    qps.remove(&qpn);
                }
                None
            }
            None => None,
        }
    }

    /// Whether the application has dropped every handle of `qp`: only the engine keeps it
    /// (its transmit hold, and `ours` references of the caller). Such a QP is destroyed as
    /// far as its peer is concerned: it takes no packet, and sends only the
    /// acknowledgements it owed ([`QpPort::release`]).
    fn released(&self, qp: &Arc<dyn QpPort>, ours: usize) -> bool {
        Arc::strong_count(qp) <= ours + usize::from(qp.marks().is_held())
    }

    /// Marks a QP as possibly having packets to send.
    pub fn mark_ready(&self, qpn: u32) {
        let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        if r.set.insert(qpn) {
            r.queue.push_back(qpn);
        }
        self.ready_hint.store(true, Ordering::SeqCst);
    }

    /// Marks a QP as having packets to send, keeping it alive until they are sent.
    fn mark_ready_held(&self, qp: Arc<dyn QpPort>) {
        let qpn = qp.number();
        let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        if r.set.insert(qpn) {
            r.queue.push_back(qpn);
        }
        self.ready_hint.store(true, Ordering::SeqCst);
        qp.marks().set_held(true);
        r.held.insert(qpn, qp);
    }

    /// Notes that `qp` may have a timer running: it joins the timed set (a lock only the
    /// first time: the QP remembers that it is in), and the engine's cached deadline
    /// comes down to the QP's (read without the QP's lock).
    fn mark_timed(&self, qp: &dyn QpPort) {
        let marks = qp.marks();
        let next = marks.deadline_ns();
        if next == u64::MAX {
            // No timer: the set forgets it at the next scan if it is in.
            return;
        }
        if !marks.is_timed() {
            let mut timed = self.timed.lock().unwrap_or_else(|p| p.into_inner());
            timed.insert(qp.number());
            marks.set_timed(true);
        }
        self.deadline.fetch_min(next, Ordering::Relaxed);
    }

    /// Handles a received UDP payload from `from` to local address `to`; `gro_index` is its
    /// position in the GRO batch it arrived in (0 when it came alone): `Engine::admit`
    /// checks it, then the QPs it is for (or the GSI) take it.
    pub fn on_datagram(
        &self,
        now: Instant,
        from: SocketAddr,
        to: IpAddr,
        payload: &[u8],
        gro_index: u16,
    ) -> Result<(), DropCause> {
        // An IPv4 packet that reached an IPv6 socket carries IPv4-mapped addresses: it is
        // an IPv4 packet all the same (its ICRC covers an IPv4 header; its GRH is IPv4's).
        let (from, to) = (
            SocketAddr::new(from.ip().to_canonical(), from.port()),
            to.to_canonical(),
        );
        let src = crate::transport::UdSource {
            src: from.ip(),
            dst: to,
        };
        match self.admit(from, to, payload, gro_index)? {
            Admitted::Gsi(gsi, mad) => {
                count(&self.stats.rcvd_pkts);
                gsi.on_mad(now, from.ip(), mad);
                self.note_cm_deadline();
                self.mark_ready(crate::cm::GSI_QPN);
                Ok(())
            }
            Admitted::Qp(qp, rx) => {
                qp.handle_packet(now, &rx, &src, from.port())
                    .map_err(|cause| self.dropped(cause))?;
                count(&self.stats.rcvd_pkts);
                self.mark_timed(&*qp);
                self.mark_ready_held(qp);
                Ok(())
            }
            Admitted::Multicast(members, rx) => {
                // A copy for each attached UD QP, each taking it as a unicast datagram
                // would be taken (what one refuses is counted as for unicast). Taken when
                // at least one QP took it (the error returned otherwise is the last QP's).
                let mut last = Err(DropCause::UnknownQp);
                for qpn in members {
                    let Some(qp) = self.qp(qpn) else {
                        continue;
                    };
                    if self.released(&qp, 1) {
                        qp.release();
                        continue;
                    }
                    match qp.handle_packet(now, &rx, &src, from.port()) {
                        Ok(()) => {
                            last = Ok(());
                            self.mark_ready_held(qp);
                        }
                        Err(cause) => {
                            self.dropped(cause);
                            if last.is_err() {
                                last = Err(cause);
                            }
                        }
                    }
                }
                if last.is_ok() {
                    count(&self.stats.rcvd_pkts);
                }
                last
            }
        }
    }

    /// The checks a received packet passes before anything executes it, in order, each
    /// with the cause it is dropped for (and counted under, [`Engine::dropped`]):
    ///
    /// | # | check | dropped as |
    /// |---|-------|------------|
    /// | 1 | it parses as a RoCEv2 packet (BTH and the extension headers its opcode names) | [`DropCause::Malformed`] |
    /// | 2 | its ICRC: an IPv6 packet's as it is, an IPv4 one's for identification 0, its GRO index, or one solved for (`icrc_id_recovered`) | [`DropCause::BadIcrc`] |
    /// | 3 | its P_Key is the default partition's (0xFFFF or 0x7FFF) | [`DropCause::BadPkey`] |
    /// | 4 | to QP 1 (the GSI): a UD SEND ONLY, with a DETH, with the GSI's Q_Key, and the device has a GSI ([`Engine::attach_gsi`]) | `WrongTransport`, `Malformed`, `BadQkey`, `UnknownQp` |
    /// | 5 | to the multicast QPN: its destination is a group some QP is attached to, its opcode UD's | `UnknownQp`, `WrongTransport` |
    /// | 6 | to any other QPN: a live QP has that number, and the application has not destroyed it ([`Engine::released`]) | [`DropCause::UnknownQp`] |
    /// | 7 | its opcode is of the QP's transport service (rxe's `check_type_state`) | [`DropCause::WrongTransport`] |
    /// | 8 | the transport's fields parse ([`glue::rx`]) | [`DropCause::Malformed`] |
    ///
    /// What depends on the QP's state is checked by the QP, under its lock, as it takes
    /// the packet ([`QpPort::handle_packet`]), and counted here too: an RC or UC packet
    /// from another address (or UDP port) than its path's ([`DropCause::WrongSource`],
    /// rxe's `check_addr`), a state that takes no such packet ([`DropCause::QpState`]), a
    /// UD Q_Key other than the QP's ([`DropCause::BadQkey`]), a UD or UC SEND with no
    /// receive posted ([`DropCause::NoReceive`]), a UC message its responder refused
    /// ([`DropCause::Refused`]). A multicast packet takes steps 6 to 8 and the QP's checks
    /// once per attached QP.
    fn admit<'p>(
        &self,
        from: SocketAddr,
        to: IpAddr,
        payload: &'p [u8],
        gro_index: u16,
    ) -> Result<Admitted<'p>, DropCause> {
        let Ok(pkt) = Packet::parse(payload) else {
            return Err(self.dropped(DropCause::Malformed));
        };
        let ports = UdpPorts {
            src: from.port(),
            dst: self.local.port(),
        };
        // One CRC pass per packet: an IPv6 packet's ICRC is checked as it is; an IPv4 one's
        // identification is fitted — 0 (an unconnected sender's single datagram), then its
        // index in the GRO batch (a remem sender's GSO segment, whose ICRC was computed for
        // its index in the batch), then solved for (kernel rxe's unpredictable ones).
        let fitted = match ip_fields(from.ip(), to, 0) {
            ip @ IpFields::V4 { .. } => icrc::fit_ipv4_id(&ip, ports, payload, gro_index),
            ip => icrc::verify(&ip, ports, payload).then_some(0),
        };
        match fitted {
            None => return Err(self.dropped(DropCause::BadIcrc)),
            Some(id) if id != 0 && id != gro_index => count(&self.stats.icrc_id_recovered),
            Some(_) => {}
        }
        // The default partition only (full or limited membership), as rxe checks it.
        if pkt.headers.bth.pkey & 0x7fff != 0x7fff {
            return Err(self.dropped(DropCause::BadPkey));
        }
        let qpn = pkt.headers.bth.dest_qp;
        if qpn == crate::cm::GSI_QPN {
            // A UD SEND ONLY with the GSI's Q_Key carries a MAD for the connection manager
            // (which counts what it drops itself; the packet counts as taken).
            if pkt.headers.bth.opcode != remem_wire::Opcode::UdSendOnly {
                return Err(self.dropped(DropCause::WrongTransport));
            }
            let Some(deth) = pkt.headers.deth else {
                return Err(self.dropped(DropCause::Malformed));
            };
            if deth.qkey != crate::cm::GSI_QKEY {
                return Err(self.dropped(DropCause::BadQkey));
            }
            let Some(gsi) = self.gsi.get() else {
                return Err(self.dropped(DropCause::UnknownQp));
            };
            return Ok(Admitted::Gsi(gsi.clone(), pkt.payload));
        }
        if qpn == crate::engine::mcast::MULTICAST_QPN {
            let members = match to {
                IpAddr::V4(group) if group.is_multicast() => self.mcast.members(group),
                _ => Vec::new(),
            };
            if members.is_empty() {
                return Err(self.dropped(DropCause::UnknownQp));
            }
            if pkt.headers.bth.opcode.value() >> 5 != 3 {
                return Err(self.dropped(DropCause::WrongTransport));
            }
            let Some(rx) = glue::rx(&pkt) else {
                return Err(self.dropped(DropCause::Malformed));
            };
            return Ok(Admitted::Multicast(members, rx));
        }
        let Some(qp) = self.qp(qpn) else {
            return Err(self.dropped(DropCause::UnknownQp));
        };
        // A QP the application destroyed, kept only until what it owes has left, is gone
        // for its peer: no packet reaches it (it would still execute WRITEs, READs…).
        if self.released(&qp, 1) {
            qp.release();
            return Err(self.dropped(DropCause::UnknownQp));
        }
        // The opcode's transport service (its top three bits) must be the QP's.
        let service = match pkt.headers.bth.opcode.value() >> 5 {
            0 => Some(QpType::Rc),
            1 => Some(QpType::Uc),
            3 => Some(QpType::Ud),
            _ => None, // nothing else parses
        };
        if service != Some(qp.service()) {
            return Err(self.dropped(DropCause::WrongTransport));
        }
        let Some(rx) = glue::rx(&pkt) else {
            return Err(self.dropped(DropCause::Malformed));
        };
        Ok(Admitted::Qp(qp, rx))
    }

    /// Counts a received packet dropped for `cause` (one counter per cause) and returns
    /// the cause.
    fn dropped(&self, cause: DropCause) -> DropCause {
        let s = &self.stats;
        count(match cause {
            DropCause::Malformed => &s.drop_malformed,
            DropCause::BadIcrc => &s.drop_bad_icrc,
            DropCause::UnknownQp => &s.drop_unknown_qp,
            DropCause::WrongTransport => &s.drop_wrong_transport,
            DropCause::WrongSource => &s.drop_wrong_source,
            DropCause::BadPkey => &s.drop_bad_pkey,
            DropCause::QpState => &s.drop_qp_state,
            DropCause::BadQkey => &s.drop_bad_qkey,
            DropCause::NoReceive => &s.drop_ud_no_recv,
            DropCause::Refused => &s.drop_uc_refused,
        });
        cause
    }

    /// Builds the GSI's next MAD packet into `buf`.
    fn gsi_transmit(&self, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        loop {
            let (ip, mad) = self.gsi.get()?.poll_transmit()?;
            let psn = self.gsi_psn.fetch_add(1, Ordering::Relaxed) as u32 & 0x00ff_ffff;
            let mut bth = remem_wire::Bth::new(
                remem_wire::Opcode::UdSendOnly,
                crate::cm::GSI_QPN,
                remem_wire::Psn::new(psn),
            );
            // As kernel rxe sends its MADs (rping.pcap): AckReq set, P_Key 0xFFFF.
            bth.ack_req = true;
            let mut h = remem_wire::Headers::new(bth);
            h.deth = Some(remem_wire::Deth {
                qkey: crate::cm::GSI_QKEY,
                src_qp: crate::cm::GSI_QPN,
            });
            if let Ok(n) = h.build(&mad[..], buf) {
                return Some((self.peer_addr(ip), n));
            }
        }
    }

    /// Writes the next packet to send into `buf` (ICRC included, computed for IPv4
    /// identification `ip_id`) and returns its destination and length. The driver reports
    /// the packet with [`Engine::transmitted`] once it is handed to the socket.
    #[cfg(any(test, feature = "internals"))]
    pub fn poll_transmit(
        &self,
        now: Instant,
        buf: &mut [u8],
        ip_id: u16,
    ) -> Option<(SocketAddr, usize)> {
        loop {
            let (dst, len) = self.poll_transmit_unsealed(now, buf)?;
            if self.fill_icrc(dst, &mut buf[..len], ip_id).is_some() {
                return Some((dst, len));
            }
        }
    }

    /// As [`Engine::poll_transmit`], but leaves the ICRC to the caller
    /// ([`Engine::fill_icrc`]), for a driver that learns the packet's place in a GSO batch
    /// (its IPv4 identification) only after seeing its destination and length: each
    /// packet's CRC is then computed once.
    #[cfg(any(test, feature = "internals"))]
    pub fn poll_transmit_unsealed(
        &self,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<(SocketAddr, usize)> {
        self.poll_transmit_into(now, &mut CopyBuild(buf))
    }

    /// Whether RC QPs send their own requests before the responses (ACKs, READ and atomic
    /// responses) they owe; by default responses go first. A device whose driver defers
    /// its responses to the next pump turns it on (`SoftOptions::defer_responses`): a
    /// reply posted meanwhile then leads its GSO batch and the shorter ACK ends it.
    pub fn set_requests_first(&self, on: bool) {
        self.requests_first.store(on, Ordering::Relaxed);
    }

    /// As [`Engine::poll_transmit_unsealed`], building the packet through `out`: its
    /// headers (pad and ICRC field zeroed) into `out.buf()`, its payload as
    /// [`TxBuild::payload`] decides — copied there, or referenced where it lies (the
    /// driver's scatter/gather send). Returns the destination and the packet's whole length.
    pub fn poll_transmit_into(
        &self,
        now: Instant,
        out: &mut dyn TxBuild,
    ) -> Option<(SocketAddr, usize)> {
        loop {
            if !self.ready_hint.load(Ordering::SeqCst) {
                // Nothing queued (as of the last release of the lock): no lock taken.
                return None;
            }
            let (qpn, held) = {
                let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
                let Some(qpn) = r.queue.pop_front() else {
                    self.ready_hint.store(false, Ordering::SeqCst);
                    return None;
                };
                if r.queue.is_empty() {
                    self.ready_hint.store(false, Ordering::SeqCst);
                }
                r.set.remove(&qpn);
                let held = r.held.remove(&qpn);
                if let Some(qp) = &held {
                    qp.marks().set_held(false);
                }
                (qpn, held)
            };
            if qpn == crate::cm::GSI_QPN {
                let out = self.gsi_transmit(out.buf());
                // A MAD sent arms its retry timer.
                self.note_cm_deadline();
                match out {
                    Some(out) => {
                        self.mark_ready(qpn);
                        return Some(out);
                    }
                    None => continue,
                }
            }
            let held_alive = held.is_some();
            let Some(qp) = held.or_else(|| self.qp(qpn)) else {
                continue;
            };
            if held_alive && Arc::strong_count(&qp) == 1 {
                // Destroyed by the application: only what it owes leaves, once.
                qp.release();
            }
            let mut dst = self.local;
            let first = self.requests_first.load(Ordering::Relaxed);
            let (built, more) = qp.poll_transmit(now, first, &mut |tx, path, fill| {
                dst = self.path_addr(path.dgid.to_ip(), path.udp_port);
                let h = glue::headers(tx);
                let (hdr, total) = h.write(tx.payload_len as usize, out.buf()).ok()?;
                out.payload(tx, hdr, fill).ok()?;
                Some(total)
            });
            self.mark_timed(&*qp);
            match built {
                Some(Some(len)) => {
                    // It may have more: keep it in the rotation (and alive, if it was
                    // held: what it queued before it was destroyed still leaves). A QP
                    // that says it has nothing more is left out: polling it again would
                    // cost a lock of the ready queue twice and one of the QP for nothing;
                    // whatever gives it more (a post, a packet, a timer) marks it again.
                    if more {
                        if held_alive {
                            self.mark_ready_held(qp);
                        } else {
                            self.mark_ready(qpn);
                        }
                    }
                    return Some((dst, len));
                }
                Some(None) => continue, // could not build (buffer too small): skip
                None => continue,       // nothing to send now
            }
        }
    }

    /// Computes the ICRC of a packet from [`Engine::poll_transmit_unsealed`] (or recomputes
    /// that of one from [`Engine::poll_transmit`]) for IPv4 identification `ip_id`.
    #[cfg(any(test, feature = "internals"))]
    pub fn fill_icrc(&self, dst: SocketAddr, pkt: &mut [u8], ip_id: u16) -> Option<()> {
        let ip = ip_fields(self.local.ip(), dst.ip(), ip_id);
        let ports = UdpPorts {
            src: self.local.port(),
            dst: dst.port(),
        };
        icrc::fill(&ip, ports, pkt).ok()
    }

    /// The IP and UDP fields a packet to `dst` with IPv4 identification `ip_id` has, as its
    /// ICRC covers them (for a driver computing the ICRC over a packet in pieces).
    pub fn icrc_fields(&self, dst: SocketAddr, ip_id: u16) -> (IpFields, UdpPorts) {
        let ip = ip_fields(self.local.ip(), dst.ip(), ip_id);
        let ports = UdpPorts {
            src: self.local.port(),
            dst: dst.port(),
        };
        (ip, ports)
    }

    /// Counts a packet handed to the socket (for drivers other than `Nic`, which counts its
    /// packets itself).
    #[cfg(any(test, feature = "internals"))]
    pub fn transmitted(&self, _dst: SocketAddr, _pkt: &[u8], _ip_id: u16) {
        self.stats.sent_pkts.fetch_add(1, Ordering::Relaxed);
    }

    /// The earliest timer deadline of any QP or of the connection manager (a full scan,
    /// which also refreshes the cached deadline idle pumps compare against).
    pub fn next_timeout(&self) -> Option<Instant> {
        let mut timed = self.timed.lock().unwrap_or_else(|p| p.into_inner());
        let mut next: Option<Instant> = None;
        timed.retain(|qpn| {
            let Some(qp) = self.qp(*qpn) else {
                return false;
            };
            let Some(t) = qp.next_timeout() else {
                qp.marks().set_timed(false);
                return false;
            };
            next = Some(next.map_or(t, |n| n.min(t)));
            true
        });
        drop(timed);
        let next = match (next, self.gsi_next_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.deadline.store(deadline_ns(next), Ordering::Relaxed);
        next
    }

    /// Lowers the cached deadline to the connection manager's next timer (after it
    /// handled a MAD or sent one, which may arm one).
    fn note_cm_deadline(&self) {
        let t = deadline_ns(self.gsi_next_timeout());
        self.deadline.fetch_min(t, Ordering::Relaxed);
    }

    /// The connection manager's next timer deadline.
    fn gsi_next_timeout(&self) -> Option<Instant> {
        self.gsi.get().and_then(|g| g.next_timeout())
    }

    /// Runs expired timers. Cheap when none is due: the time is compared against a
    /// cached deadline, and every timer is scanned only when that passed or
    /// a millisecond after the last scan.
    pub fn on_timeout(&self, now: Instant) {
        let at = deadline_ns(Some(now));
        if at < self.deadline.load(Ordering::Relaxed)
            && at.saturating_sub(self.scanned.load(Ordering::Relaxed)) < FULL_SCAN_NS
        {
            return;
        }
        self.scanned.store(at, Ordering::Relaxed);
        if let Some(gsi) = self.gsi.get()
            && gsi.next_timeout().is_some_and(|t| t <= now)
        {
            gsi.on_timeout(now);
            self.mark_ready(crate::cm::GSI_QPN);
        }
        let qpns: Vec<u32> = self
            .timed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        for qpn in qpns {
            if let Some(qp) = self.qp(qpn)
                && !self.released(&qp, 1)
                && qp.next_timeout().is_some_and(|t| t <= now)
            {
                qp.handle_timeout(now);
                self.mark_ready(qpn);
            }
        }
        // The scan refreshes the cached deadline (QPs and the connection manager).
        self.next_timeout();
    }

    /// Whether some QP may have something to send (no lock: the queue's state as of the
    /// last release of its lock).
    pub fn has_ready(&self) -> bool {
        self.ready_hint.load(Ordering::SeqCst)
    }

    /// Whether packets are still owed: a QP is marked ready, or a destroyed QP is kept until
    /// its last acknowledgements are out.
    pub fn owes_packets(&self) -> bool {
        let r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        !r.queue.is_empty() || !r.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SoftOptions;
    use crate::mem::mr::{MwBind, MwType};
    use crate::testing::{Side, Spec};
    use remem_verbs::rc::{self, RcOptions, RcPeer};
    use remem_verbs::{
        AccessFlags, Gid, MemRegion, MemoryRegion, Mtu, QpCap, QpInitAttr, QpType, QueuePair,
        RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
    };

    use std::time::Duration;

    /// Two sides (the crate's test fixture, [`crate::testing::Side`]) with `opts` on
    /// addresses `ips` and one UDP port, each with an RC QP with `cap` over `len` bytes.
    fn pair(ips: [&str; 2], opts: &SoftOptions, cap: QpCap, len: usize) -> (Side, Side) {
        let spec = Spec {
            cap,
            len,
            ..Spec::default()
        };
        crate::testing::pair(ips.map(|ip| ip.parse().unwrap()), opts, &spec)
    }

    /// Two devices with progress threads that poll as `busy_poll` says, 1 MiB each.
    fn threaded_pair(ips: [&str; 2], busy_poll: Duration) -> (Side, Side) {
        let opts = SoftOptions {
            busy_poll,
            ..SoftOptions::default()
        };
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let (a, b) = pair(ips, &opts, cap, 1 << 20);
        connect(&a, &b);
        connect(&b, &a);
        (a, b)
    }

    /// How many packets one send and one receive may carry on a UDP socket of `ip` (GSO,
    /// GRO), as a device's driver finds them.
    fn offloads(ip: &str) -> (usize, usize) {
        let socket = std::net::UdpSocket::bind(format!("{ip}:0")).unwrap();
        let nic = crate::io::driver::Nic::new(socket).unwrap();
        (nic.max_gso_segments(), nic.gro_segments())
    }

    /// Takes `me`'s QP to RTS towards `peer`'s, path MTU 1024, both PSNs near the wrap.
    fn connect(me: &Side, peer: &Side) {
        let sgid = rc::roce_v2_gid(&me.ctx, 1).unwrap();
        let o = RcOptions {
            sgid_index: sgid.index as u8,
            access: AccessFlags::REMOTE,
            sq_psn: 0x00ff_fff0,
            mtu: Mtu::Mtu1024,
            min_rnr_timer: 1,
            // 4.2 ms per attempt, 8 attempts: a lost ACK (or one never sent) still fails a
            // test within ~34 ms, and a progress thread starved for a few milliseconds on
            // a loaded host does not (with no retry, one 4 ms stall failed
            // ack_leaves_even_if_the_receiver_destroys_its_qp_at_once).
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 0,
            ..RcOptions::default()
        };
        let peer = RcPeer {
            qpn: peer.qp.qp_num(),
            psn: 0x00ff_fff0,
            gid: Gid::from(peer.ctx.local_addr().ip()),
            mtu: Mtu::Mtu1024,
        };
        rc::connect(&*me.qp, &peer, &o).unwrap();
    }

    /// Two inline devices with one connected RC QP each over 64 KiB, driven by hand:
    /// nothing calls `progress`, so the engines see only the datagrams a test hands them.
    fn in_memory(ips: [&str; 2]) -> (Side, Side) {
        let opts = SoftOptions {
            inline: true,
            ..SoftOptions::default()
        };
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let (a, b) = pair(ips, &opts, cap, 1 << 16);
        connect(&a, &b);
        connect(&b, &a);
        (a, b)
    }

    // ----- memory windows through the transport ---------------------------------------

    /// A connected threaded pair where `b` has a region over its whole buffer with
    /// MW_BIND (and no remote rights of its own), and a window of `ty` bound on `b`'s QP
    /// to `[4096, 8192)` with remote READ and WRITE: the pair, the window's rkey.
    fn window_pair(ips: [&str; 2], ty: MwType) -> (Side, Side, Arc<dyn MemoryRegion>, u32) {
        let (a, b) = threaded_pair(ips, Duration::ZERO);
        let mr =
            b.pd.reg_mr(
                MemRegion::whole(b.buf.clone()),
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            )
            .unwrap();
        let mrs = &b.ctx.shared().mrs;
        let e = mrs.by_lkey(mr.lkey()).unwrap();
        let mw = mrs.alloc_mw(e.pd, ty);
        let bind = MwBind {
            mr: Some(&e),
            addr: b.buf.addr() + 4096,
            len: 4096,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        };
        let rkey = mrs.bind_mw(mw, e.pd, b.qp.qp_num(), 0x5a, &bind).unwrap();
        (a, b, mr, rkey)
    }

    fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcOpcode, WcStatus)> {
        wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect()
    }

    #[test]
    fn read_and_write_through_a_window_then_invalidated_it_is_a_remote_access_error() {
        let (a, b, mr, rkey) = window_pair(["127.0.1.41", "127.0.1.42"], MwType::Two);
        a.buf.fill(0, 64, 0x77).unwrap();
        let at = b.buf.addr() + 4096 + 128;
        let write = SendOp::RdmaWrite {
            remote_addr: at,
            rkey,
        };
        let signalled = |id, op, sge: Sge| {
            let list = [sge];
            let mut wr = SendWr::new(id, op, &list);
            wr.flags |= remem_verbs::SendFlags::SIGNALED;
            a.qp.post_send(&[wr]).unwrap();
        };
        signalled(1, write, a.sge(0, 64));
        let read = SendOp::RdmaRead {
            remote_addr: at,
            rkey,
        };
        signalled(2, read, a.sge(1024, 64));
        let wcs = wait_wcs(&a, 2);
        assert_eq!(
            statuses(&wcs),
            [
                (1, WcOpcode::RdmaWrite, WcStatus::Success),
                (2, WcOpcode::RdmaRead, WcStatus::Success)
            ]
        );
        assert!(
            b.buf
                .to_vec(4096 + 128, 64)
                .unwrap()
                .iter()
                .all(|&x| x == 0x77)
        );
        assert!(a.buf.to_vec(1024, 64).unwrap().iter().all(|&x| x == 0x77));
        // Invalidated (as a local invalidate does), the rkey is refused: a remote access
        // error NAK, nothing written.
        let b_mrs = &b.ctx.shared().mrs;
        let e = b_mrs.by_lkey(mr.lkey()).unwrap();
        b_mrs.invalidate(e.pd, b.qp.qp_num(), rkey, false).unwrap();
        a.buf.fill(0, 64, 0x99).unwrap();
        signalled(3, write, a.sge(0, 64));
        let wcs = wait_wcs(&a, 3);
        assert_eq!(
            statuses(&wcs).last(),
            Some(&(3, WcOpcode::RdmaWrite, WcStatus::RemAccessErr))
        );
        assert!(
            b.buf
                .to_vec(4096 + 128, 64)
                .unwrap()
                .iter()
                .all(|&x| x == 0x77)
        );
    }

    #[test]
    fn outside_its_window_an_access_is_a_remote_access_error() {
        let (a, b, _mr, rkey) = window_pair(["127.0.1.43", "127.0.1.44"], MwType::One);
        a.buf.fill(0, 64, 0x55).unwrap();
        // Inside the region, across the window's end.
        let write = SendOp::RdmaWrite {
            remote_addr: b.buf.addr() + 8192 - 32,
            rkey,
        };
        let list = [a.sge(0, 64)];
        let mut wr = SendWr::new(1, write, &list);
        wr.flags |= remem_verbs::SendFlags::SIGNALED;
        a.qp.post_send(&[wr]).unwrap();
        let wcs = wait_wcs(&a, 1);
        assert_eq!(
            statuses(&wcs),
            [(1, WcOpcode::RdmaWrite, WcStatus::RemAccessErr)]
        );
        assert!(b.buf.to_vec(8192 - 32, 64).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn a_send_with_invalidate_frees_a_type_two_window_and_says_so() {
        let (a, b, mr, rkey) = window_pair(["127.0.1.45", "127.0.1.46"], MwType::Two);
        let signalled = |id, op, sge: Sge| {
            let list = [sge];
            let mut wr = SendWr::new(id, op, &list);
            wr.flags |= remem_verbs::SendFlags::SIGNALED;
            a.qp.post_send(&[wr]).unwrap();
        };
        let recv = |id| {
            let list = [b.sge(0, 64)];
            b.qp.post_recv(&[RecvWr {
                wr_id: id,
                sg_list: &list,
            }])
            .unwrap();
        };
        recv(10);
        signalled(1, SendOp::SendWithInv { rkey }, a.sge(0, 16));
        assert_eq!(
            statuses(&wait_wcs(&a, 1)),
            [(1, WcOpcode::Send, WcStatus::Success)]
        );
        let got = wait_wcs(&b, 1);
        assert_eq!(got[0].status, WcStatus::Success);
        assert_eq!(got[0].opcode, WcOpcode::Recv);
        assert_eq!(got[0].invalidated_rkey(), Some(rkey));
        assert_eq!(got[0].byte_len, 16);
        // The window is free: the rkey opens nothing any more, and the window can be
        // bound again.
        let b_mrs = &b.ctx.shared().mrs;
        let e = b_mrs.by_lkey(mr.lkey()).unwrap();
        assert_eq!(b_mrs.windows_bound(&e), 0);
        let write = SendOp::RdmaWrite {
            remote_addr: b.buf.addr() + 4096,
            rkey,
        };
        signalled(2, write, a.sge(0, 8));
        assert_eq!(
            statuses(&wait_wcs(&a, 2))[1],
            (2, WcOpcode::RdmaWrite, WcStatus::RemAccessErr)
        );
    }

    #[test]
    fn a_send_invalidating_a_region_key_fails_and_invalidates_nothing() {
        let (a, b, mr, rkey) = window_pair(["127.0.1.47", "127.0.1.48"], MwType::One);
        let list = [b.sge(0, 64)];
        b.qp.post_recv(&[RecvWr {
            wr_id: 10,
            sg_list: &list,
        }])
        .unwrap();
        // A type 1 window cannot be invalidated remotely (nor a `reg_mr` region).
        let list = [a.sge(0, 16)];
        let mut wr = SendWr::new(1, SendOp::SendWithInv { rkey }, &list);
        wr.flags |= remem_verbs::SendFlags::SIGNALED;
        a.qp.post_send(&[wr]).unwrap();
        let got = wait_wcs(&b, 1);
        assert_eq!(got[0].status, WcStatus::RemInvReqErr);
        assert_eq!(got[0].invalidated_rkey(), None);
        assert_eq!(
            statuses(&wait_wcs(&a, 1)),
            [(1, WcOpcode::Send, WcStatus::RemInvReqErr)]
        );
        let b_mrs = &b.ctx.shared().mrs;
        let e = b_mrs.by_lkey(mr.lkey()).unwrap();
        assert_eq!(b_mrs.windows_bound(&e), 1, "still bound");
    }

    #[test]
    fn bind_and_local_invalidate_work_requests_run_in_send_queue_order() {
        let (a, b) = threaded_pair(["127.0.1.49", "127.0.1.50"], Duration::ZERO);
        // `a` binds a type 2 window over its own buffer, then `b` writes through it.
        let mr =
            a.pd.reg_mr(
                MemRegion::whole(a.buf.clone()),
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            )
            .unwrap();
        let mw = a.pd.alloc_mw(MwType::Two).unwrap();
        assert_eq!(mw.mw_type(), MwType::Two);
        let rkey = (mw.rkey() & !0xff) | 0x21;
        let post = |side: &Side, id, op| {
            let mut wr = SendWr::new(id, op, &[]);
            wr.flags |= remem_verbs::SendFlags::SIGNALED;
            side.qp.post_send(&[wr]).unwrap();
        };
        // A WRITE first, then the bind: the bind completes after it, in order.
        let list = [a.sge(0, 8)];
        let mut w = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: b.buf.addr(),
                rkey: b.rkey(),
            },
            &list,
        );
        w.flags |= remem_verbs::SendFlags::SIGNALED;
        a.qp.post_send(&[w]).unwrap();
        let bind = SendOp::BindMw {
            mw: mw.rkey(),
            rkey,
            lkey: mr.lkey(),
            addr: a.buf.addr() + 256,
            len: 256,
            access: AccessFlags::REMOTE_WRITE,
        };
        post(&a, 2, bind);
        assert_eq!(
            statuses(&wait_wcs(&a, 2)),
            [
                (1, WcOpcode::RdmaWrite, WcStatus::Success),
                (2, WcOpcode::BindMw, WcStatus::Success)
            ]
        );
        b.buf.fill(0, 8, 0xab).unwrap();
        let list = [b.sge(0, 8)];
        let write = SendOp::RdmaWrite {
            remote_addr: a.buf.addr() + 256,
            rkey,
        };
        let mut w = SendWr::new(3, write, &list);
        w.flags |= remem_verbs::SendFlags::SIGNALED;
        b.qp.post_send(&[w]).unwrap();
        assert_eq!(
            statuses(&wait_wcs(&b, 1)),
            [(3, WcOpcode::RdmaWrite, WcStatus::Success)]
        );
        assert_eq!(a.buf.to_vec(256, 8).unwrap(), [0xab; 8]);
        // Local invalidate: the rkey is dead for `b`.
        post(&a, 4, SendOp::LocalInv { rkey });
        assert_eq!(
            statuses(&wait_wcs(&a, 3))[2],
            (4, WcOpcode::LocalInv, WcStatus::Success)
        );
        let mut w = SendWr::new(5, write, &list);
        w.flags |= remem_verbs::SendFlags::SIGNALED;
        b.qp.post_send(&[w]).unwrap();
        assert_eq!(
            statuses(&wait_wcs(&b, 2))[1],
            (5, WcOpcode::RdmaWrite, WcStatus::RemAccessErr)
        );
    }

    #[test]
    fn a_refused_bind_completes_with_mw_bind_err_and_fails_the_qp() {
        let (a, _b) = threaded_pair(["127.0.1.51", "127.0.1.52"], Duration::ZERO);
        let mr =
            a.pd.reg_mr(
                MemRegion::whole(a.buf.clone()),
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            )
            .unwrap();
        let mw = a.pd.alloc_mw(MwType::Two).unwrap();
        let post = |id, op| {
            let mut wr = SendWr::new(id, op, &[]);
            wr.flags |= remem_verbs::SendFlags::SIGNALED;
            a.qp.post_send(&[wr]).unwrap();
        };
        // The range leaves the region: refused; the QP fails, what follows is flushed.
        let bad = SendOp::BindMw {
            mw: mw.rkey(),
            rkey: mw.rkey() + 1,
            lkey: mr.lkey(),
            addr: a.buf.addr(),
            len: 1 << 30,
            access: AccessFlags::REMOTE_WRITE,
        };
        post(6, bad);
        post(
            7,
            SendOp::LocalInv {
                rkey: mw.rkey() + 1,
            },
        );
        assert_eq!(
            statuses(&wait_wcs(&a, 2)),
            [
                (6, WcOpcode::BindMw, WcStatus::MwBindErr),
                (7, WcOpcode::LocalInv, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(a.qp.state(), remem_verbs::QpState::Err);
    }

    #[test]
    fn binds_between_writes_and_reads_complete_in_order_under_loss() {
        let opts = SoftOptions {
            faults: Some(crate::io::faults::FaultConfig {
                loss: 0.1,
                duplicate: 0.05,
                reorder: 0.05,
                seed: 7,
                ..Default::default()
            }),
            ..SoftOptions::default()
        };
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let (a, b) = pair(["127.0.1.53", "127.0.1.54"], &opts, cap, 1 << 16);
        connect(&a, &b);
        connect(&b, &a);
        let mr =
            a.pd.reg_mr(
                MemRegion::whole(a.buf.clone()),
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            )
            .unwrap();
        let mw = a.pd.alloc_mw(MwType::One).unwrap();
        let mut rkey = mw.rkey();
        let mut expect = Vec::new();
        for i in 0..60u64 {
            let list = [a.sge(1024 * (i % 8), 512)];
            let (op, wc) = match i % 3 {
                0 => (
                    SendOp::RdmaWrite {
                        remote_addr: b.buf.addr() + 512 * (i % 16),
                        rkey: b.rkey(),
                    },
                    WcOpcode::RdmaWrite,
                ),
                1 => {
                    let next = (rkey & !0xff) | ((rkey + 1) & 0xff);
                    let op = SendOp::BindMw {
                        mw: rkey,
                        rkey: next,
                        lkey: mr.lkey(),
                        addr: a.buf.addr() + 64 * (i % 32),
                        len: 64,
                        access: AccessFlags::REMOTE_READ,
                    };
                    rkey = next;
                    (op, WcOpcode::BindMw)
                }
                _ => (
                    SendOp::RdmaRead {
                        remote_addr: b.buf.addr() + 512 * (i % 16),
                        rkey: b.rkey(),
                    },
                    WcOpcode::RdmaRead,
                ),
            };
            let sges: &[Sge] = if op.is_local() { &[] } else { &list };
            let mut wr = SendWr::new(i, op, sges);
            wr.flags |= remem_verbs::SendFlags::SIGNALED;
            a.qp.post_send(&[wr]).unwrap();
            expect.push((i, wc, WcStatus::Success));
        }
        let wcs = wait_wcs(&a, expect.len());
        assert_eq!(statuses(&wcs), expect, "every one, in order");
        assert!(
            a.counter("fault_dropped") > 0 && a.counter("retransmitted_pkts") > 0,
            "the faults were there"
        );
        // The last bind stands: its rkey opens its 64 bytes, the earlier ones nothing.
        let mrs = &a.ctx.shared().mrs;
        let e = mrs.by_lkey(mr.lkey()).unwrap();
        assert_eq!(mrs.windows_bound(&e), 1);
        let r = AccessFlags::REMOTE_READ;
        let last = a.buf.addr() + 64 * (58 % 32);
        assert!(mrs.remote(e.pd, rkey, last, 64, r).is_ok());
        assert!(mrs.remote(e.pd, rkey - 1, last, 64, r).is_err());
    }

    #[test]
    fn a_qp_with_nothing_more_to_send_leaves_the_ready_queue() {
        let (a_side, b_side) = in_memory(["127.0.1.11", "127.0.1.12"]);
        let (a, b) = (a_side.engine(), b_side.engine());
        let now = Instant::now();
        let mut pkt = vec![0u8; 2048];
        let write = SendOp::RdmaWrite {
            remote_addr: b_side.buf.addr() + 512,
            rkey: b_side.rkey(),
        };
        let sge = a_side.sge(0, 64);
        a_side
            .qp
            .post_send(&[SendWr::new(1, write, &[sge])])
            .unwrap();
        assert!(a.has_ready());
        let (dst, len) = a.poll_transmit(now, &mut pkt, 0).unwrap();
        assert_eq!(dst, b_side.ctx.local_addr());
        // The requester's one packet is out: nothing more, so the QP left the queue.
        assert!(!a.has_ready(), "requester polled again for nothing");
        let from = a_side.ctx.local_addr();
        let to = b_side.ctx.local_addr().ip();
        b.on_datagram(now, from, to, &pkt[..len], 0).unwrap();
        let (_, ack) = b.poll_transmit(now, &mut pkt, 0).unwrap();
        // The ACK is out and the responder owes nothing more.
        assert!(!b.has_ready(), "responder polled again for nothing");
        assert!(b.poll_transmit(now, &mut pkt, 0).is_none());
        // The ACK completes the WRITE, and a new post marks the QP again.
        let from = b_side.ctx.local_addr();
        let to = a_side.ctx.local_addr().ip();
        a.on_datagram(now, from, to, &pkt[..ack], 0).unwrap();
        assert!(a.poll_transmit(now, &mut pkt, 0).is_none());
        let wcs = a_side.poll();
        assert_eq!(
            wcs.iter()
                .map(|w| (w.wr_id, w.opcode, w.status))
                .collect::<Vec<_>>(),
            [(1, WcOpcode::RdmaWrite, WcStatus::Success)]
        );
        a_side
            .qp
            .post_send(&[SendWr::new(2, write, &[sge])])
            .unwrap();
        assert!(
            a.poll_transmit(now, &mut pkt, 0).is_some(),
            "a post marks it again"
        );
    }

    /// Waits (at most 10 s) until `s` has polled `n` completions; returns them all.
    fn wait_wcs(s: &Side, n: usize) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let wcs = s.poll();
            if wcs.len() >= n {
                return wcs;
            }
            assert!(Instant::now() < deadline, "timed out: {wcs:?}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn datagrams_of_every_size_are_dropped_and_counted() {
        let engine = Engine::new("127.0.1.9:4791".parse().unwrap(), 4791);
        let from: SocketAddr = "127.0.1.10:4791".parse().unwrap();
        let to: IpAddr = "127.0.1.9".parse().unwrap();
        let now = Instant::now();
        let mut x = 0x9e37_79b9_u32;
        let bytes: Vec<u8> = (0..65_535)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        for n in 0..=bytes.len() {
            let r = engine.on_datagram(now, from, to, &bytes[..n], n as u16);
            assert!(
                matches!(r, Err(DropCause::Malformed | DropCause::BadIcrc)),
                "{n} bytes: {r:?}"
            );
        }
        let s = &engine.stats;
        let dropped =
            s.drop_malformed.load(Ordering::Relaxed) + s.drop_bad_icrc.load(Ordering::Relaxed);
        assert_eq!(dropped, bytes.len() as u64 + 1);
        assert_eq!(s.rcvd_pkts.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn peer_ports_are_looked_up_again_after_a_change() {
        let engine = Engine::new("127.0.1.9:4791".parse().unwrap(), 4791);
        let (p, q): (IpAddr, IpAddr) = ("127.0.1.10".parse().unwrap(), "::2".parse().unwrap());
        assert_eq!(engine.peer_addr(p).port(), 4791);
        engine.set_peer_port(p, 5000).unwrap();
        for _ in 0..3 {
            assert_eq!(engine.peer_addr(p).port(), 5000, "cached or not");
        }
        assert_eq!(engine.peer_addr(q).port(), 4791);
        engine.set_peer_port(p, 5001).unwrap();
        assert_eq!(engine.peer_addr(p).port(), 5001);
        engine.set_peer_port(q, 6000).unwrap();
        assert_eq!(engine.peer_addr(q).port(), 6000);
        assert_eq!(engine.peer_addr(p).port(), 5001);
        let mapped = IpAddr::V6(std::net::Ipv4Addr::new(127, 0, 1, 10).to_ipv6_mapped());
        assert_eq!(engine.peer_addr(mapped).port(), 5001);
    }

    /// Another RC QP on `me`'s device (its PD and CQ), in RTS towards `peer_qpn` on `peer`'s
    /// address, its path naming UDP port `udp_port` (0: none).
    fn path_qp(me: &Side, peer: &Side, peer_qpn: u32, udp_port: u16) -> Arc<dyn QueuePair> {
        let qp = me
            .pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: me.cq.clone(),
                recv_cq: me.cq.clone(),
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .unwrap();
        let o = RcOptions {
            sgid_index: rc::roce_v2_gid(&me.ctx, 1).unwrap().index as u8,
            access: AccessFlags::REMOTE,
            mtu: Mtu::Mtu1024,
            ..RcOptions::default()
        };
        let peer = RcPeer {
            qpn: peer_qpn,
            psn: 0,
            gid: Gid::from(peer.ctx.local_addr().ip()),
            mtu: Mtu::Mtu1024,
        };
        rc::to_init(&*qp, &o).unwrap();
        let (mut rtr, mask) = o.rtr_attr(QpType::Rc, &peer).unwrap();
        rtr.ah_attr.udp_port = udp_port;
        qp.modify(&rtr, mask).unwrap();
        rc::to_rts(&*qp, &o).unwrap();
        qp
    }

    /// Posts a 64-byte WRITE on `qp` of `side` and returns where its packet goes.
    fn write_goes_to(side: &Side, qp: &dyn QueuePair) -> SocketAddr {
        let write = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 1,
        };
        qp.post_send(&[SendWr::new(9, write, &[side.sge(0, 64)])])
            .unwrap();
        let mut pkt = vec![0u8; 2048];
        side.engine()
            .poll_transmit(Instant::now(), &mut pkt, 0)
            .unwrap()
            .0
    }

    #[test]
    fn a_paths_udp_port_is_its_own() {
        let (a, b) = in_memory(["127.0.1.31", "127.0.1.32"]);
        let b_addr = b.ctx.local_addr();
        let named = path_qp(&a, &b, b.qp.qp_num(), 40_000);
        // The path that names no port goes to the device's default; the one that names a
        // port, there — and nothing else changed with it.
        assert_eq!(write_goes_to(&a, &*a.qp), b_addr);
        assert_eq!(
            write_goes_to(&a, &*named),
            SocketAddr::new(b_addr.ip(), 40_000)
        );
        assert_eq!(write_goes_to(&a, &*a.qp), b_addr);
        assert_eq!(a.engine().peer_addr(b_addr.ip()), b_addr);
        // The application's table moves paths that name no port, and only those.
        a.engine().set_peer_port(b_addr.ip(), 50_000).unwrap();
        assert_eq!(write_goes_to(&a, &*a.qp).port(), 50_000);
        assert_eq!(write_goes_to(&a, &*named).port(), 40_000);
    }

    #[test]
    fn a_path_naming_a_port_takes_packets_only_from_there() {
        let (a, b) = in_memory(["127.0.1.33", "127.0.1.34"]);
        let (a_addr, b_addr) = (a.ctx.local_addr(), b.ctx.local_addr());
        // B's QPs towards A's address: one naming port 40 000, one naming 4791, one none.
        let b_named = path_qp(&b, &a, 0x100, 40_000);
        let b_4791 = path_qp(&b, &a, 0x101, remem_verbs::ROCEV2_UDP_PORT);
        let b_none = path_qp(&b, &a, 0x102, 0);
        // A's QPs sending to each (to B's own port).
        let senders = [&b_named, &b_4791, &b_none].map(|q| path_qp(&a, &b, q.qp_num(), 0));
        // A WRITE request from A's address at `port` to `sender`'s peer, its ICRC computed
        // for that port.
        let from_port = |sender: &Arc<dyn QueuePair>, port: u16| {
            let write = SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 1,
            };
            sender
                .post_send(&[SendWr::new(9, write, &[a.sge(0, 64)])])
                .unwrap();
            let mut pkt = vec![0u8; 2048];
            let (dst, len) = a
                .engine()
                .poll_transmit_unsealed(Instant::now(), &mut pkt)
                .unwrap();
            pkt.truncate(len);
            let ip = ip_fields(a_addr.ip(), dst.ip(), 0);
            let ports = UdpPorts {
                src: port,
                dst: dst.port(),
            };
            icrc::fill(&ip, ports, &mut pkt).unwrap();
            b.engine().on_datagram(
                Instant::now(),
                SocketAddr::new(a_addr.ip(), port),
                b_addr.ip(),
                &pkt,
                0,
            )
        };
        let wrong = b.counter("drop_wrong_source");
        // The path naming 40 000 takes packets from A's address at 40 000 only.
        assert_eq!(
            from_port(&senders[0], a_addr.port()),
            Err(DropCause::WrongSource)
        );
        assert_eq!(b.counter("drop_wrong_source"), wrong + 1);
        assert_eq!(from_port(&senders[0], 40_000), Ok(()));
        // 4791 peers (NICs, kernel rxe) send from ports of their choosing: not checked.
        assert_eq!(from_port(&senders[1], 51_234), Ok(()));
        assert_eq!(from_port(&senders[2], 51_235), Ok(()));
        assert_eq!(b.counter("drop_wrong_source"), wrong + 1);
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4() {
        // An IPv4 packet that reached an IPv6 socket carries IPv4-mapped addresses: its
        // ICRC covers an IPv4 header all the same.
        let engine = Engine::new("127.0.1.9:4791".parse().unwrap(), 4791);
        let (src, dst) = (
            std::net::Ipv4Addr::new(127, 0, 1, 10),
            std::net::Ipv4Addr::new(127, 0, 1, 9),
        );
        let mut h = remem_wire::Headers::new(remem_wire::Bth::new(
            remem_wire::Opcode::RcSendOnly,
            0x77,
            remem_wire::Psn::new(1),
        ));
        h.bth.ack_req = true;
        let mut pkt = vec![0u8; h.packet_len(8)];
        let n = h.build(&[1; 8], &mut pkt).unwrap();
        pkt.truncate(n);
        let ip = IpFields::V4 {
            src,
            dst,
            id: 0,
            flags_frag: IPV4_DF,
        };
        icrc::fill(
            &ip,
            UdpPorts {
                src: 4791,
                dst: 4791,
            },
            &mut pkt,
        )
        .unwrap();
        let from = SocketAddr::new(IpAddr::V6(src.to_ipv6_mapped()), 4791);
        let to = IpAddr::V6(dst.to_ipv6_mapped());
        // Verified as IPv4, then no QP 0x77: the ICRC was right.
        assert_eq!(
            engine.on_datagram(Instant::now(), from, to, &pkt, 0),
            Err(DropCause::UnknownQp)
        );
    }

    /// A GSI that records the MADs handed to it and sends one MAD back to each sender.
    #[derive(Debug, Default)]
    struct RecordingGsi {
        got: Mutex<Vec<(IpAddr, Vec<u8>)>>,
        replies: Mutex<Vec<IpAddr>>,
    }

    impl GsiPort for RecordingGsi {
        fn on_mad(&self, _now: Instant, from: IpAddr, mad: &[u8]) {
            self.got.lock().unwrap().push((from, mad.to_vec()));
            self.replies.lock().unwrap().push(from);
        }

        fn poll_transmit(&self) -> Option<(IpAddr, Box<[u8; crate::cm::MAD_LEN]>)> {
            let to = self.replies.lock().unwrap().pop()?;
            Some((to, Box::new([0xab; crate::cm::MAD_LEN])))
        }

        fn next_timeout(&self) -> Option<Instant> {
            None
        }

        fn on_timeout(&self, _now: Instant) {}
    }

    #[test]
    fn the_gsi_port_takes_qp1_mads_and_sends_its_own() {
        let (local, peer) = (
            std::net::Ipv4Addr::new(127, 0, 1, 20),
            std::net::Ipv4Addr::new(127, 0, 1, 21),
        );
        let engine = Engine::new(SocketAddr::new(local.into(), 4791), 4791);
        let mut h = remem_wire::Headers::new(remem_wire::Bth::new(
            remem_wire::Opcode::UdSendOnly,
            crate::cm::GSI_QPN,
            remem_wire::Psn::new(7),
        ));
        h.deth = Some(remem_wire::Deth {
            qkey: crate::cm::GSI_QKEY,
            src_qp: crate::cm::GSI_QPN,
        });
        let mad = [0x5a; crate::cm::MAD_LEN];
        let mut pkt = vec![0u8; h.packet_len(mad.len())];
        let n = h.build(&mad, &mut pkt).unwrap();
        pkt.truncate(n);
        let ip = IpFields::V4 {
            src: peer,
            dst: local,
            id: 0,
            flags_frag: IPV4_DF,
        };
        let ports = UdpPorts {
            src: 4791,
            dst: 4791,
        };
        icrc::fill(&ip, ports, &mut pkt).unwrap();
        let from = SocketAddr::new(peer.into(), 4791);
        let now = Instant::now();
        // No GSI attached: QP 1 is a QP nobody has.
        assert_eq!(
            engine.on_datagram(now, from, local.into(), &pkt, 0),
            Err(DropCause::UnknownQp)
        );
        assert_eq!(engine.stats.drop_unknown_qp.load(Ordering::Relaxed), 1);
        let gsi = Arc::new(RecordingGsi::default());
        assert!(engine.attach_gsi(gsi.clone()));
        assert!(!engine.attach_gsi(Arc::new(RecordingGsi::default())));
        engine
            .on_datagram(now, from, local.into(), &pkt, 0)
            .unwrap();
        assert_eq!(
            *gsi.got.lock().unwrap(),
            vec![(IpAddr::from(peer), mad.to_vec())]
        );
        // Its reply leaves from QP 1 as a UD SEND ONLY to the sender.
        let mut out = vec![0u8; 8192];
        let (dst, len) = engine.poll_transmit(now, &mut out, 0).unwrap();
        assert_eq!(dst, from);
        let reply = Packet::parse(&out[..len]).unwrap();
        assert_eq!(reply.headers.bth.opcode, remem_wire::Opcode::UdSendOnly);
        assert_eq!(reply.headers.bth.dest_qp, crate::cm::GSI_QPN);
        assert_eq!(reply.payload, &[0xab; crate::cm::MAD_LEN][..]);
        assert!(engine.poll_transmit(now, &mut out, 0).is_none());
    }

    #[test]
    fn two_devices_over_udp_loopback() {
        let (a, b) = threaded_pair(["127.0.1.1", "127.0.1.2"], Duration::ZERO);
        // SEND of 10 000 bytes (10 packets at MTU 1024).
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        a.buf.write(0, &data).unwrap();
        b.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[b.sge(100_000, 20_000)],
        }])
        .unwrap();
        a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[a.sge(0, 10_000)])])
            .unwrap();
        let wcs = wait_wcs(&b, 1);
        assert_eq!(wcs[0].status, WcStatus::Success);
        assert_eq!(wcs[0].byte_len, 10_000);
        assert_eq!(b.buf.to_vec(100_000, 10_000).unwrap(), data);
        // WRITE, READ, fetch-add.
        let write = SendOp::RdmaWrite {
            remote_addr: b.buf.addr() + 200_000,
            rkey: b.rkey(),
        };
        let read = SendOp::RdmaRead {
            remote_addr: b.buf.addr() + 100_000,
            rkey: b.rkey(),
        };
        let fa = SendOp::AtomicFetchAndAdd {
            remote_addr: b.buf.addr() + 300_000,
            rkey: b.rkey(),
            add: 5,
        };
        b.buf.store_u64(300_000, 37).unwrap();
        a.qp.post_send(&[
            SendWr::new(2, write, &[a.sge(0, 5000)]),
            SendWr::new(3, read, &[a.sge(50_000, 10_000)]),
            SendWr::new(4, fa, &[a.sge(80_000, 8)]),
        ])
        .unwrap();
        let wcs = wait_wcs(&a, 4);
        let ops: Vec<(u64, WcOpcode, WcStatus)> =
            wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
        assert_eq!(
            ops,
            vec![
                (1, WcOpcode::Send, WcStatus::Success),
                (2, WcOpcode::RdmaWrite, WcStatus::Success),
                (3, WcOpcode::RdmaRead, WcStatus::Success),
                (4, WcOpcode::FetchAdd, WcStatus::Success),
            ]
        );
        assert_eq!(b.buf.to_vec(200_000, 5000).unwrap(), data[..5000]);
        assert_eq!(a.buf.to_vec(50_000, 10_000).unwrap(), data);
        assert_eq!(a.buf.load_u64(80_000).unwrap(), 37);
        assert_eq!(b.buf.load_u64(300_000).unwrap(), 42);
    }

    /// SEND ping-pongs between two devices whose threads poll as `busy_poll` says;
    /// returns the wake-ups the posting threads wrote (eventfd writes).
    fn ping_pong(ips: [&str; 2], busy_poll: Duration) -> u64 {
        let (a, b) = threaded_pair(ips, busy_poll);
        for round in 0..20u64 {
            for (me, peer) in [(&a, &b), (&b, &a)] {
                peer.qp
                    .post_recv(&[RecvWr {
                        wr_id: round,
                        sg_list: &[peer.sge(4096, 8)],
                    }])
                    .unwrap();
                // Each post finds this side's thread waiting (when it sleeps: waited for
                // here, so a loaded machine's thread that has not gone to sleep yet does
                // not leave the count at 0): the post must wake it to send.
                let deadline = Instant::now() + Duration::from_secs(10);
                while busy_poll.is_zero()
                    && !me.ctx.shared().progress_waiting()
                    && Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
                me.qp
                    .post_send(&[SendWr::new(round, SendOp::Send, &[me.sge(0, 8)])])
                    .unwrap();
                loop {
                    let wcs = peer.poll();
                    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
                    if wcs
                        .iter()
                        .any(|w| w.opcode == WcOpcode::Recv && w.wr_id == round)
                    {
                        break;
                    }
                    assert!(Instant::now() < deadline, "round {round}: {wcs:?}");
                    std::thread::yield_now();
                }
            }
        }
        a.counter("progress_wakeups") + b.counter("progress_wakeups")
    }

    #[test]
    fn sleeping_threads_are_woken_by_posts() {
        // (Busy-polling threads: tests/busy_poll.rs, alone in its binary, since two
        // spinning threads would starve the other tests' devices on a small machine.)
        let woken = ping_pong(["127.0.1.7", "127.0.1.8"], Duration::ZERO);
        assert!(woken > 0, "sleeping threads woken by posts: {woken}");
    }

    #[test]
    fn batches_carry_verifiable_icrcs() {
        let ips = ["127.0.1.3", "127.0.1.4"];
        let (a, b) = threaded_pair(ips, Duration::ZERO);
        let (a_offloads, b_offloads) = (offloads(ips[0]), offloads(ips[1]));
        // 300 kB in 1 KiB packets: the requester has a window of packets ready at once.
        let len = 300_000;
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
        a.buf.write(0, &data).unwrap();
        let write = SendOp::RdmaWrite {
            remote_addr: b.buf.addr() + 400_000,
            rkey: b.rkey(),
        };
        a.qp.post_send(&[SendWr::new(1, write, &[a.sge(0, len as u32)])])
            .unwrap();
        let wcs = wait_wcs(&a, 1);
        assert_eq!(wcs[0].status, WcStatus::Success);
        assert_eq!(b.buf.to_vec(400_000, len).unwrap(), data);
        let get = |s: &Side, f: fn(&EngineStats) -> &AtomicU64| {
            f(&s.engine().stats).load(Ordering::Relaxed)
        };
        for s in [&a, &b] {
            // Every packet's ICRC verified: with identification 0, or its GRO index.
            assert_eq!(get(s, |e| &e.icrc_id_recovered), 0);
            assert_eq!(get(s, |e| &e.drop_bad_icrc), 0);
        }
        let (sent, sends) = (get(&a, |e| &e.sent_pkts), get(&a, |e| &e.tx_datagrams));
        assert!(sent >= (len / 1024) as u64, "sent {sent}");
        if a_offloads.0 > 1 {
            assert!(sends < sent / 2, "GSO: {sends} sends for {sent} packets");
        }
        let (rcvd, recvs) = (get(&b, |e| &e.rcvd_pkts), get(&b, |e| &e.rx_datagrams));
        if a_offloads.0 > 1 && b_offloads.1 > 1 {
            assert!(
                recvs < rcvd / 2,
                "GRO: {recvs} datagrams for {rcvd} packets"
            );
        }
    }

    #[test]
    fn ack_leaves_even_if_the_receiver_destroys_its_qp_at_once() {
        // The receiver sees its completion and destroys the QP before its progress
        // thread sent the ACK: the ACK must still leave, or the sender fails after its
        // retries. Repeated, since the window is a race.
        for round in 0..10u32 {
            let (a, b) = threaded_pair(["127.0.1.5", "127.0.1.6"], Duration::ZERO);
            b.qp.post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &[b.sge(0, 64)],
            }])
            .unwrap();
            a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[a.sge(0, 64)])])
                .unwrap();
            wait_wcs(&b, 1);
            // The application's last handle of the QP; the device stays open.
            let Side { qp, ctx: b_ctx, .. } = b;
            drop(qp);
            let wcs = wait_wcs(&a, 1);
            assert_eq!(wcs[0].status, WcStatus::Success, "round {round}");
            drop(b_ctx);
        }
    }
}
