//! An open soft device.

use crate::device::DeviceShared;
use crate::device::netdev::{Netdev, gid_table_for};
pub use crate::device::options::SoftOptions;
use crate::verbs::cm_id::CmDevice;
use remem_verbs::{
    AsyncEvent, AtomicCap, CompletionChannel, CompletionQueue, Context, Counter, DeviceAttr,
    DeviceInfo, Error, GidEntry, LinkLayer, Mtu, PortAttr, PortState, ProtectionDomain, Result,
};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

/// An open soft device (the soft provider's `ibv_context`): a UDP socket on one local
/// address and a progress thread moving packets between it and the device's queue pairs.
/// The thread stops when the context and every object made from it are dropped.
#[derive(Debug)]
pub struct SoftContext {
    dev: Arc<DeviceShared>,
    /// The device's connection manager (its engine's GSI): what CM ids are made on.
    cm: Arc<CmDevice>,
    /// Whether dropping this handle flushes the device (the application's handle does; a
    /// CM id's `context()` handle does not).
    flush_on_drop: bool,
}

/// Device attributes of a soft device: rxe's limits (rxe_param.h) where a software device
/// has any (multicast's included), except the largest message, which is IBTA's 2^31 bytes rather than rxe's 8 MiB.
fn device_attr(node_guid: u64) -> DeviceAttr {
    const MAX: u32 = 1 << 20;
    DeviceAttr {
        fw_ver: format!("remem-soft {}", env!("CARGO_PKG_VERSION")),
        node_guid,
        sys_image_guid: node_guid,
        max_mr_size: u64::MAX >> 1,
        page_size_cap: 0xffff_f000,
        vendor_id: 0x00ff_ffff,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: MAX - 16,
        max_qp_wr: MAX,
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: MAX,
        max_cqe: (1 << 15) - 1,
        max_mr: MAX >> 1,
        max_pd: MAX,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        max_res_rd_atom: 0x3f000,
        atomic_cap: AtomicCap::Hca,
        max_srq: MAX,
        max_srq_wr: MAX,
        max_srq_sge: 27,
        max_inline_data: 512,
        max_ah: (1 << 15) - 1,
        phys_port_cnt: 1,
        max_msg_sz: 1 << 31,
        flush_global: true,
        flush_persistent: true,
        atomic_write: true,
        // rxe_param.h's RXE_MAX_MW.
        max_mw: 0x1000,
        mcast: remem_verbs::McastCaps::RXE,
    }
}

fn port_attr(active_mtu: Mtu, up: bool, gids: usize) -> PortAttr {
    PortAttr {
        state: if up {
            PortState::Active
        } else {
            PortState::Down
        },
        max_mtu: Mtu::Mtu4096,
        active_mtu,
        gid_tbl_len: gids as u32,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        link_layer: LinkLayer::Ethernet,
        active_width: 1,
        active_speed: 1,
        phys_state: if up { 5 } else { 3 },
    }
}

impl SoftContext {
    /// Opens a soft device on `netdev`, serving RoCEv2 on UDP `port` of its primary address.
    pub fn new(netdev: Netdev, port: u16) -> Result<Self> {
        let ip = netdev.primary().ok_or_else(|| {
            Error::DeviceUnavailable(format!("{} has no IP address", netdev.name))
        })?;
        let info = netdev.device_info(port);
        let port_attr = port_attr(netdev.active_mtu(), netdev.up, info.gids.len());
        let attr = device_attr(info.node_guid);
        Self::open(
            info,
            attr,
            port_attr,
            SocketAddr::new(ip, port),
            &SoftOptions::from_env(),
        )
    }

    /// Opens a soft device bound to `addr` (any local address; port 0 picks a free port),
    /// named `soft@<addr>`. A device sends to its own UDP port (RoCEv2 devices all use
    /// 4791), so devices that talk share a port, unless each is told the other's with
    /// [`Context::set_peer_udp_port`]. The MTU is 4096 on loopback addresses and that of the
    /// interface carrying `addr` otherwise (1024 when unknown).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        Self::bind_with(addr, &SoftOptions::from_env())
    }

    /// [`SoftContext::bind`] with explicit options.
    ///
    /// The address must be a specific one (an IPv4-mapped IPv6 address is taken as the
    /// IPv4 address it maps): a device's GID is its address, and its QPs
    /// take packets sent to that address only (rxe's `check_addr` checks the destination
    /// against the QP's source GID). An unspecified address (0.0.0.0, `::`) would make the
    /// device answer on every local address under a GID no peer can name, so it is
    /// refused with [`Error::InvalidArgument`].
    pub fn bind_with(addr: SocketAddr, opts: &SoftOptions) -> Result<Self> {
        // An IPv4-mapped IPv6 address is its IPv4 address (an IPv4 socket: DF and
        // identification 0 for the ICRC, IPv4 GIDs).
        let addr = SocketAddr::new(addr.ip().to_canonical(), addr.port());
        if addr.ip().is_unspecified() {
            return Err(Error::InvalidArgument(format!(
                "soft@{addr}: a soft device binds a specific address (its GID), not an \
                 unspecified one; name the local address peers reach it at"
            )));
        }
        let netdev = crate::device::netdev::list_netdevs()
            .ok()
            .and_then(|l| crate::device::netdev::netdev_of(l, addr.ip()));
        let mtu = match &netdev {
            Some(n) => n.active_mtu(),
            None if addr.ip().is_loopback() => Mtu::Mtu4096,
            None => Mtu::Mtu1024,
        };
        let gids = gid_table_for(Some(addr.ip()), netdev.as_ref());
        let node_guid = 0x0200_0000_0000_0000 | u64::from(rand::random::<u32>());
        let info = DeviceInfo {
            name: format!("soft@{addr}"),
            provider: "soft",
            node_guid,
            netdev: netdev.map(|n| n.name),
            gids,
            udp_addr: Some(addr),
        };
        let port = port_attr(mtu, true, info.gids.len());
        let mut attr = device_attr(node_guid);
        if opts.no_placement {
            attr.flush_global = false;
            attr.flush_persistent = false;
            attr.atomic_write = false;
        }
        Self::open(info, attr, port, addr, opts)
    }

    /// Opens the device ([`DeviceShared::open`]) and gives its engine its GSI: the
    /// connection manager, with `opts.cm` (else the environment's settings).
    fn open(
        info: DeviceInfo,
        attr: DeviceAttr,
        port: PortAttr,
        addr: SocketAddr,
        opts: &SoftOptions,
    ) -> Result<Self> {
        let dev = DeviceShared::open(info, attr, port, addr, opts)?;
        let cm = Arc::new(CmDevice::on_host(
            opts.cm
                .clone()
                .unwrap_or_else(crate::cm::CmConfig::from_env),
            dev.host.clone(),
        ));
        dev.engine.attach_gsi(cm.clone());
        if let Some(h) = &dev.host {
            // The connections of members that die are closed by this CM: it is woken for
            // their DREQs.
            let weak = Arc::downgrade(&dev);
            h.on_orphans(Box::new(move || {
                if let Some(d) = weak.upgrade() {
                    d.wake(crate::cm::GSI_QPN);
                }
            }));
        }
        Ok(SoftContext {
            dev,
            cm,
            flush_on_drop: true,
        })
    }

    /// Another handle of the device `dev` (what a CM id's `context()` returns): the same
    /// device, objects and counters; dropping it does not flush the device.
    pub(crate) fn alias(dev: Arc<DeviceShared>, cm: Arc<CmDevice>) -> Self {
        SoftContext {
            dev,
            cm,
            flush_on_drop: false,
        }
    }

    /// Drives an inline device (opened with [`SoftOptions::inline`]): runs due timers, sends
    /// what can be sent, handles received packets, and if nothing happened waits up to
    /// `timeout` for a packet (polling for the first 50 µs of it, `driver::INLINE_SPIN`,
    /// then sleeping). Returns how many packets moved. An error for a device with a
    /// progress thread.
    pub fn progress(&self, timeout: Duration) -> Result<usize> {
        self.dev.progress(timeout)
    }

    /// Waits (at most `limit`) until what the device owes has been sent: the ACKs of what
    /// it received, and its connection manager's MADs (a DREP, a REJ). What closing the
    /// device does (see `Drop`), for a process that keeps its devices open until it exits:
    /// the drop-in libibverbs calls it for every open device at exit.
    pub fn flush(&self, limit: Duration) {
        self.dev.flush(limit);
    }

    /// Closes every CM connection still open on the device — a DREQ each, sent before
    /// this returns (at most `limit`) — as the kernel's rdma_cm does for the ids of a
    /// process that exits without closing them (the drop-in calls it at exit).
    pub fn close_connections(&self, limit: Duration) {
        let n = self.cm.disconnect_all();
        self.dev.wake(crate::cm::GSI_QPN);
        let cm = &self.cm;
        self.dev.drive_until(limit, &|| cm.taken(n));
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.dev.engine.local()
    }

    /// What the device's objects share (key table, events, QP numbers, the packet engine):
    /// for tests and benchmarks that drive the engine by hand (the `internals` feature).
    #[cfg(any(test, feature = "internals"))]
    pub fn shared(&self) -> &Arc<DeviceShared> {
        &self.dev
    }
}

/// How long closing a device waits for the packets it still owes (see `Drop`).
const CLOSE_FLUSH_LIMIT: Duration = Duration::from_secs(1);

impl Drop for SoftContext {
    /// Closing the device waits (at most one second) until what it received has
    /// been handled and the ACKs that produced are sent: a NIC acknowledges whatever the
    /// process does next, but a process that sees its last receive complete, closes the
    /// device and exits would kill the progress thread before it sent that ACK, and its
    /// peer would retry into a closed port until RETRY_EXC_ERR (seen with
    /// `ibv_rc_pingpong` on the drop-in libibverbs; `tests/close.rs`).
    fn drop(&mut self) {
        if self.flush_on_drop {
            self.dev.flush(CLOSE_FLUSH_LIMIT);
        }
    }
}

impl Context for SoftContext {
    fn info(&self) -> &DeviceInfo {
        &self.dev.info
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(self.dev.attr.clone())
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::InvalidArgument(format!(
                "port {port_num} does not exist (soft devices have port 1)"
            )));
        }
        Ok(self.dev.port.clone())
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<GidEntry> {
        self.query_port(port_num)?;
        self.dev
            .info
            .gids
            .get(index as usize)
            .cloned()
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GID index {index} is empty (table has {} entries)",
                    self.dev.info.gids.len()
                ))
            })
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        Ok(self.dev.alloc_pd()?)
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompletionChannel>> {
        Ok(self.dev.create_comp_channel()?)
    }

    fn create_cq(
        &self,
        cqe: u32,
        channel: Option<Arc<dyn CompletionChannel>>,
    ) -> Result<Arc<dyn CompletionQueue>> {
        Ok(self.dev.create_cq(cqe, channel)?)
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        self.dev.events.fd()
    }

    fn get_async_event(&self) -> Option<AsyncEvent> {
        self.dev.events.pop()
    }

    fn subscribe_async_events(&self) -> Result<Arc<dyn remem_verbs::AsyncEventQueue>> {
        let q: Arc<dyn remem_verbs::AsyncEventQueue> = self
            .dev
            .events
            .subscribe()
            .map_err(remem_verbs::Error::Io)?;
        Ok(q)
    }

    fn counters(&self) -> Vec<Counter> {
        let mut out = self.dev.counters();
        out.extend(
            self.cm
                .stats()
                .named()
                .into_iter()
                .map(|(name, value)| Counter { name, value }),
        );
        out
    }

    /// Soft devices send to any UDP port (but 0): an address vector may name one.
    fn can_send_to_udp_port(&self, port: u16) -> bool {
        port != 0
    }

    /// Soft devices send to any UDP port: the peer's port goes into a per-device table
    /// ([`crate::PEER_PORT_BUDGET`] peers; [`Error::Exhausted`] beyond), consulted
    /// for every packet to that GID's address (QPs and address handles whose address
    /// vector names no port, CM MADs). The application's configuration: remem's handshake
    /// never writes it (the port a peer claims goes into that connection's path).
    fn set_peer_udp_port(&self, gid: remem_verbs::Gid, port: u16) -> Result<()> {
        self.dev.engine.set_peer_port(gid.to_ip(), port)
    }

    fn create_cm_channel(&self) -> Result<Arc<dyn remem_verbs::cm::CmChannel>> {
        Ok(Arc::new(crate::verbs::cm_id::SoftCmChannel::new()?))
    }

    fn create_cm_id(
        &self,
        channel: &Arc<dyn remem_verbs::cm::CmChannel>,
        ps: remem_verbs::cm::PortSpace,
    ) -> Result<Arc<dyn remem_verbs::cm::CmId>> {
        crate::verbs::cm_id::create_id(&self.dev, &self.cm, channel, ps)
    }

    fn caller_driven(&self) -> bool {
        self.dev.is_inline()
    }

    fn drive(&self, timeout: Duration) -> Result<usize> {
        if self.dev.is_inline() {
            self.dev.progress(timeout)
        } else {
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::options::busy_poll_from;
    use remem_verbs::GidType;

    #[test]
    fn bind_loopback_and_query() {
        let ctx = SoftContext::bind("127.0.3.1:0".parse().unwrap()).unwrap();
        assert!(ctx.local_addr().port() != 0);
        // The device reports the port it bound, in its address and its name.
        assert_eq!(ctx.info().udp_addr, Some(ctx.local_addr()));
        assert_eq!(ctx.info().name, format!("soft@{}", ctx.local_addr()));
        let dev = ctx.query_device().unwrap();
        assert_eq!(dev.max_qp_rd_atom, 128);
        let port = ctx.query_port(1).unwrap();
        assert_eq!(port.active_mtu, Mtu::Mtu4096, "loopback gives 4096");
        assert_eq!(port.state, PortState::Active);
        assert!(ctx.query_port(2).is_err());
        // rxe's layout: the link-local name, then the bound address; RoCE v2 only; lo's.
        let table = ctx.gid_table(1).unwrap();
        assert!(table.len() >= 2);
        assert!(table.iter().all(|e| e.gid_type == GidType::RoceV2));
        assert!(table.iter().all(|e| e.netdev.as_deref() == Some("lo")));
        assert_eq!(
            table[0].gid.to_string(),
            "fe80:0000:0000:0000:0200:00ff:fe00:0301"
        );
        assert_eq!(table[1].gid, remem_verbs::Gid::from(ctx.local_addr().ip()));
        assert_eq!(port.gid_tbl_len as usize, table.len());
        assert!(ctx.query_gid(1, table.len() as u32).is_err());
        let counters = ctx.counters();
        assert!(counters.iter().any(|c| c.name == "rcvd_seq_err"));
        assert!(counters.iter().all(|c| c.value == 0));
        assert!(ctx.get_async_event().is_none());
    }

    #[test]
    fn busy_poll_reads_microseconds_or_always() {
        assert_eq!(busy_poll_from(Some("50")), Duration::from_micros(50));
        assert_eq!(busy_poll_from(Some(" always ")), Duration::MAX);
        assert_eq!(busy_poll_from(Some("soon")), Duration::ZERO);
        assert_eq!(busy_poll_from(None), Duration::ZERO);
    }

    #[test]
    fn busy_address_is_unavailable() {
        let a = SoftContext::bind("127.0.3.2:0".parse().unwrap()).unwrap();
        let err = SoftContext::bind(a.local_addr()).err().unwrap();
        assert!(matches!(err, Error::DeviceUnavailable(_)), "{err}");
    }
}
