//! What a soft device is: the state every object of a device shares ([`DeviceShared`]:
//! attributes and limits, the key table, the packet engine and how it is driven, counters,
//! QP number allocation, object quotas), its options ([`options`]), the network interface
//! it sits on ([`netdev`]) and its asynchronous event queue ([`events`]). A QP's transport
//! reaches this state through `crate::verbs::qp::QpEnv`; the objects are made in
//! [`crate::verbs`].

#![forbid(unsafe_code)]

pub mod events;
pub mod netdev;
pub mod options;
pub mod quota;

use crate::engine::Engine;
use crate::io::driver::{Inline, Nic, Progress};
use crate::mem::keys;
use crate::mem::mr::MrTable;
use crate::transport::Stat;
use events::AsyncEvents;
use remem_verbs::{AhAttr, Counter, DeviceAttr, DeviceInfo, Error, GidType, PortAttr, Result};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most PSNs an RC requester keeps unacknowledged in flight, as kernel rxe
/// (`RXE_MAX_UNACKED_PSNS`). More than this only fills the queues between the peers: with
/// 1024, four QPs against a slow rxe peer overflowed its queues and the go-back-N resends
/// ran out of retries (RETRY_EXC_ERR).
pub const MAX_UNACKED_PSNS: u32 = 128;
/// Transport statistics in counter order, with their rxe names (the transport's table).
pub use crate::transport::STAT_NAMES;

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// The lowest QP number handed out (rxe's first QP index; 0 and 1 are the special QPs).
pub(crate) const FIRST_QPN: u32 = 16;
/// The largest QP number (24 bits).
pub(crate) const MAX_QPN: u32 = 0x00ff_ffff;
/// The multicast QPN (IBTA: a packet to it is for a multicast group's QPs): never a QP's.
pub(crate) const MULTICAST_QPN: u32 = 0x00ff_ffff;

std::thread_local! {
    /// The device (its [`DeviceShared`]'s address) whose inline `progress` this thread is
    /// running, 0 when none: [`DeviceShared::drive_until`] must not drive it again from
    /// inside (its lock is held).
    static INLINE_DRIVING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How a device's packets are moved.
#[derive(Debug)]
enum Driver {
    /// A progress thread.
    Thread(Progress),
    /// The application calls `progress`.
    Inline(Mutex<Inline>),
}

/// What every object of a soft device shares.
#[derive(Debug)]
pub struct DeviceShared {
    /// Unique per opened device (to reject another device's handles).
    pub id: u64,
    /// What the device is.
    pub info: DeviceInfo,
    /// Device attributes.
    pub attr: DeviceAttr,
    /// Port 1 attributes.
    pub port: PortAttr,
    /// Limits QPs are checked against.
    pub limits: QpLimits,
    /// Memory regions.
    pub mrs: MrTable,
    /// Async events.
    pub events: Arc<AsyncEvents>,
    /// The packet engine.
    pub engine: Arc<Engine>,
    /// Object limits.
    pub quotas: quota::Quotas,
    driver: Driver,
    stats: [AtomicU64; STAT_NAMES.len()],
    pub(crate) qpns: Mutex<keys::QpnGen>,
    qpn_prefix: u8,
    next_id: AtomicU32,
    /// The membership of the host's shared device (`None`: a private device). Declared
    /// after `driver`: the driver's socket closes first, then the membership leaves.
    pub host: Option<Arc<crate::io::host::Host>>,
}

impl DeviceShared {
    /// Binds `addr` and starts the device's progress thread.
    pub fn open(
        mut info: DeviceInfo,
        attr: DeviceAttr,
        port: PortAttr,
        addr: SocketAddr,
        opts: &crate::device::options::SoftOptions,
    ) -> Result<Arc<Self>> {
        // A device on a given port is the host's, shared with its other processes
        // (`io::host`); on port 0, or asked to be private, it binds its own socket.
        let (socket, host) = if addr.port() != 0 && !opts.private {
            let (host, socket) = crate::io::host::Host::join(addr).map_err(|e| {
                Error::DeviceUnavailable(format!("{}: cannot join UDP {addr}: {e}", info.name))
            })?;
            (socket, Some(host))
        } else {
            let socket = UdpSocket::bind(addr).map_err(|e| {
                Error::DeviceUnavailable(format!("{}: cannot bind UDP {addr}: {e}", info.name))
            })?;
            (socket, None)
        };
        let local = socket.local_addr()?;
        // Port 0 picked a port: the device's address and name tell which.
        if let Some(asked) = info.udp_addr.filter(|a| *a != local) {
            info.name = info.name.replace(&asked.to_string(), &local.to_string());
            info.udp_addr = Some(local);
        }
        let faults = opts
            .faults
            .or_else(crate::io::faults::FaultConfig::from_env);
        let pcap = match &opts.pcap {
            Some(path) => Some(crate::io::pcap::PcapWriter::open(path)?),
            None => None,
        };
        // Capture outermost: it records what the driver built, before the faults.
        let nic = match &host {
            Some(h) => Nic::over(Box::new(crate::io::host::socket::HostSocket::new(
                crate::io::socket::Udp::new(socket)?,
                h.clone(),
            )?)),
            None => Nic::new(socket)?,
        };
        let nic = nic.with_faults(faults.unwrap_or_default()).with_pcap(pcap);
        tracing::debug!(
            device = %info.name,
            gso_segments = nic.max_gso_segments(),
            gro_segments = nic.gro_segments(),
            "socket offloads (1: none)"
        );
        let peer_port = opts.peer_port.unwrap_or(local.port());
        let engine = Arc::new(Engine::new(local, peer_port));
        engine.set_requests_first(opts.inline && opts.defer_responses);
        let driver = if opts.inline {
            Driver::Inline(Mutex::new(
                Inline::new(nic).defer_responses(opts.defer_responses),
            ))
        } else {
            Driver::Thread(Progress::start(
                nic,
                engine.clone(),
                opts.cpu,
                opts.busy_poll,
            )?)
        };
        let limits = QpLimits {
            max_wr: attr.max_qp_wr,
            max_sge: attr.max_sge,
            max_inline: attr.max_inline_data,
            max_rd_atomic: attr.max_qp_init_rd_atom.min(255) as u8,
            max_dest_rd_atomic: attr.max_qp_rd_atom.min(255) as u8,
            active_mtu: port.active_mtu.bytes(),
            max_msg: u64::from(port.max_msg_sz),
            placement: attr.atomic_write,
        };
        let max_mr = attr.max_mr;
        let mrs = MrTable::new(max_mr);
        if let Some(h) = &host {
            mrs.set_key_prefix(h.slot());
        }
        let quotas = quota::Quotas::new(&attr);
        Ok(Arc::new(DeviceShared {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            info,
            attr,
            port,
            limits,
            mrs,
            events: Arc::new(AsyncEvents::new()?),
            engine,
            quotas,
            driver,
            stats: Default::default(),
            qpns: Mutex::new(keys::QpnGen::with_bits(16)),
            // The top 8 bits of every QP number: a shared device's slot, a private
            // device's own random value (1–254: never QPN 0, 1 or 0xFFFFFF).
            qpn_prefix: host
                .as_ref()
                .map_or_else(|| rand::random_range(1..=254u8), |h| h.slot()),
            next_id: AtomicU32::new(1),
            host,
        }))
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A QP number not in use by a live QP: 24 bits, from 16 up (0 and 1 are the special
    /// QPs) and never 0xFFFFFF (the multicast QPN), in the order of a secret permutation of
    /// the QPN space ([`keys::QpnGen`]): a peer who knows one of the device's QPNs cannot
    /// guess the others, and a destroyed QP's number is handed out again only after the
    /// rest of the space. The top 8 bits are the device's (on a shared device the
    /// process's slot: the host steers by it), the other 16 a permutation: 65 536 numbers.
    pub(crate) fn alloc_qpn(&self) -> Result<u32> {
        let mut g = self.qpns.lock().unwrap_or_else(|p| p.into_inner());
        // The top 8 bits are the device's: on a shared device the process's slot
        // (`io::host::steer`), so a sender's GSO batches, cut where that byte changes, each
        // go to one process.
        let slot = u32::from(self.qpn_prefix) << 16;
        for _ in 0..=MAX_QPN {
            let qpn = slot | g.next_qpn();
            if qpn >= FIRST_QPN && qpn != MULTICAST_QPN && !self.engine.has_qp(qpn) {
                return Ok(qpn);
            }
        }
        Err(Error::Exhausted("QP numbers"))
    }

    /// Counts a transport statistic.
    pub fn count(&self, stat: Stat) {
        if let Some(i) = STAT_NAMES.iter().position(|(s, _)| *s == stat) {
            self.stats[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every counter of the device and its engine, rxe names first (the connection
    /// manager's follow them: `verbs::context::SoftContext`'s counters).
    pub fn counters(&self) -> Vec<Counter> {
        let e = &self.engine.stats;
        let counter = |name, c: &AtomicU64| Counter {
            name,
            value: c.load(Ordering::Relaxed),
        };
        let mut out = vec![
            counter("sent_pkts", &e.sent_pkts),
            counter("rcvd_pkts", &e.rcvd_pkts),
        ];
        out.extend(
            STAT_NAMES
                .iter()
                .zip(&self.stats)
                .map(|((stat, _), v)| counter(stat.rxe_name(), v)),
        );
        out.extend([
            counter("drop_malformed", &e.drop_malformed),
            counter("drop_bad_icrc", &e.drop_bad_icrc),
            counter("drop_unknown_qp", &e.drop_unknown_qp),
            counter("drop_wrong_transport", &e.drop_wrong_transport),
            counter("drop_wrong_source", &e.drop_wrong_source),
            counter("drop_bad_pkey", &e.drop_bad_pkey),
            counter("drop_qp_state", &e.drop_qp_state),
            counter("drop_bad_qkey", &e.drop_bad_qkey),
            counter("drop_ud_no_recv", &e.drop_ud_no_recv),
            counter("drop_uc_refused", &e.drop_uc_refused),
            counter("icrc_id_recovered", &e.icrc_id_recovered),
            counter("tx_datagrams", &e.tx_datagrams),
            counter("rx_datagrams", &e.rx_datagrams),
            counter("tx_zero_copy_pkts", &e.tx_zero_copy_pkts),
            counter("fault_dropped", &e.fault_dropped),
            counter("fault_corrupted", &e.fault_corrupted),
            counter("fault_duplicated", &e.fault_duplicated),
            counter("fault_reordered", &e.fault_reordered),
        ]);
        // The host's shared device: packets forwarded between its members, dead members
        // removed, members now (all 0 on a private device).
        let h = self.host.as_deref();
        let host = |f: fn(&crate::io::host::HostStats) -> &AtomicU64| {
            h.map_or(0, |h| f(&h.stats).load(Ordering::Relaxed))
        };
        out.extend([
            Counter {
                name: "host_forwarded_out",
                value: host(|s| &s.forwarded_out),
            },
            Counter {
                name: "host_forwarded_in",
                value: host(|s| &s.forwarded_in),
            },
            Counter {
                name: "host_forward_failed",
                value: host(|s| &s.forward_failed),
            },
            Counter {
                name: "host_reaped",
                value: host(|s| &s.reaped),
            },
            Counter {
                name: "host_members",
                value: h.map_or(0, |h| h.members() as u64),
            },
        ]);
        // Wake-ups other threads wrote to a sleeping progress thread (an eventfd write
        // each, on the posting thread): none with busy polling or inline progress.
        out.push(Counter {
            name: "progress_wakeups",
            value: match &self.driver {
                Driver::Thread(p) => p.wakeups(),
                Driver::Inline(_) => 0,
            },
        });
        out
    }

    pub(crate) fn wake(&self, qpn: u32) {
        self.engine.mark_ready(qpn);
        if let Driver::Thread(p) = &self.driver {
            p.wake();
        }
    }

    /// Whether the device's progress thread waits for work now (or is about to): a post
    /// made now must wake it. False without a thread.
    #[cfg(test)]
    pub(crate) fn progress_waiting(&self) -> bool {
        matches!(&self.driver, Driver::Thread(p) if p.waiting())
    }

    /// Whether the device has no progress thread (its user moves packets).
    pub fn is_inline(&self) -> bool {
        matches!(self.driver, Driver::Inline(_))
    }

    /// Waits (at most `limit`) until what the device received has been handled and the
    /// packets that produced (ACKs above all) are sent; on an inline device, moves them.
    pub fn flush(&self, limit: std::time::Duration) {
        match &self.driver {
            Driver::Thread(p) => p.flush(&self.engine, limit),
            Driver::Inline(_) => {
                let deadline = std::time::Instant::now() + limit;
                while self.engine.owes_packets() && std::time::Instant::now() < deadline {
                    let _ = self.progress(std::time::Duration::ZERO);
                }
            }
        }
    }

    /// Drives the device (at most `limit`) until `done()` holds and the packets it had
    /// taken from the engine by then have been handed to the socket: the progress thread
    /// is woken and waited for ([`Progress::wait_sent`]; on that thread itself nothing
    /// is waited for), an inline device is driven by the caller. Returns whether `done()`
    /// held in time. What a consumer command queued (a CM's DREQ, the sends posted before
    /// a disconnection) has left when it returns, as on a NIC.
    pub(crate) fn drive_until(&self, limit: std::time::Duration, done: &dyn Fn() -> bool) -> bool {
        match &self.driver {
            Driver::Thread(p) => p.wait_sent(limit, done),
            Driver::Inline(_) if INLINE_DRIVING.get() == std::ptr::from_ref(self).addr() => {
                // Called from inside this device's own `progress` (an id dropped while its
                // events are delivered): the caller sends it when the call goes on.
                done()
            }
            Driver::Inline(_) => {
                let deadline = std::time::Instant::now() + limit;
                loop {
                    if done() {
                        // A call in progress on another thread may have built the packets
                        // and not sent them yet: this call waits for it (one lock), and
                        // sends what is left.
                        let _ = self.progress(std::time::Duration::ZERO);
                        return true;
                    }
                    if std::time::Instant::now() >= deadline {
                        return false;
                    }
                    let _ = self.progress(std::time::Duration::ZERO);
                }
            }
        }
    }

    /// Moves packets in inline mode (see [`Inline::progress`]); an error in thread mode.
    pub fn progress(&self, timeout: std::time::Duration) -> Result<usize> {
        match &self.driver {
            Driver::Inline(i) => {
                let mut i = i.lock().unwrap_or_else(|p| p.into_inner());
                let outer = INLINE_DRIVING.replace(std::ptr::from_ref(self).addr());
                let moved = i.progress(&self.engine, timeout);
                INLINE_DRIVING.set(outer);
                Ok(moved)
            }
            Driver::Thread(_) => Err(Error::InvalidArgument(
                "progress() drives inline devices; this one has a progress thread".into(),
            )),
        }
    }

    /// Checks an address vector: port 1, a GRH (RoCE requires one), an `sgid_index` naming
    /// a GID this device sends from (index 0, its link-local name, or its bound address;
    /// see [`crate::device::netdev`]), and a destination reachable from the bound address: of its
    /// IP family once [`crate::device::netdev::wire_gid`] has mapped a loopback device's link-local
    /// GID, and not another link-local GID (soft devices do not speak IPv6 link-local).
    pub(crate) fn check_av(&self, av: &AhAttr) -> Result<()> {
        let bad = |reason: String| Error::InvalidAttribute {
            name: "ah_attr",
            reason,
        };
        if av.port_num != 1 {
            return Err(bad(format!(
                "port {} does not exist (soft devices have port 1)",
                av.port_num
            )));
        }
        if !av.is_global {
            return Err(bad("RoCE address vectors need a GRH (is_global)".into()));
        }
        let Some(sgid) = self.info.gids.get(usize::from(av.sgid_index)) else {
            return Err(bad(format!("sgid_index {} is empty", av.sgid_index)));
        };
        if sgid.gid_type != GidType::RoceV2 {
            return Err(bad(format!(
                "sgid_index {} is a {:?} GID; soft devices speak RoCE v2 only",
                av.sgid_index, sgid.gid_type
            )));
        }
        let bound = (self.info.udp_addr).map(|a| remem_verbs::Gid::from(a.ip().to_canonical()));
        if av.sgid_index != 0 && Some(sgid.gid) != bound {
            return Err(bad(format!(
                "sgid_index {} ({}) is not an address this soft device binds: it sends from \
                 GID index 1 (or its link-local name, index 0)",
                av.sgid_index, sgid.gid
            )));
        }
        let dgid = crate::device::netdev::wire_gid(av.dgid);
        if crate::device::netdev::is_link_local(&dgid) {
            return Err(bad(format!(
                "destination {} is a link-local GID of no soft device on a loopback \
                 address; soft devices speak IPv4 or routable IPv6 only (use the peer's \
                 GID index 1)",
                av.dgid
            )));
        }
        if bound.is_some_and(|b| b.is_ipv4_mapped() != dgid.is_ipv4_mapped()) {
            return Err(bad(
                "source and destination GIDs are of different IP families".into(),
            ));
        }
        Ok(())
    }
}

/// Device limits a QP is checked against.
#[derive(Debug, Clone, Copy)]
pub struct QpLimits {
    /// `max_qp_wr`.
    pub max_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// `max_inline_data`.
    pub max_inline: u32,
    /// `max_qp_init_rd_atom`.
    pub max_rd_atomic: u8,
    /// `max_qp_rd_atom`.
    pub max_dest_rd_atomic: u8,
    /// The port's active MTU in bytes.
    pub active_mtu: u32,
    /// Largest message.
    pub max_msg: u64,
    /// The RoCEv2 memory placement extensions (FLUSH, ATOMIC WRITE) are on.
    pub placement: bool,
}
