//! UD multicast: the groups a soft device's QPs are attached to, and the sockets that
//! receive the groups' datagrams.
//!
//! RoCEv2 maps a multicast GID to IP multicast as kernel rxe does: an IPv4-mapped GID
//! `::ffff:a.b.c.d` (a.b.c.d in 224.0.0.0/4) is IPv4 group a.b.c.d, UDP port 4791 (the
//! device's peer port). A UD send whose address handle names such a GID goes to that IP
//! group (BTH DestQP 0xFFFFFF, the multicast QPN, as the application gives it); every device
//! whose QPs are attached to the group receives it, the sender's own included (the IP
//! stack loops multicast back to the sending host: `IP_MULTICAST_LOOP`, on by default), and
//! hands a copy to each attached UD QP, which takes it as a unicast datagram (its state, its
//! Q_Key, a posted receive; what it refuses is counted per QP).
//!
//! Where rxe's netdev joins the group's MAC address (`dev_mc_add`) and the kernel's CM
//! sends the IGMP join, a soft device, which sees only UDP, joins the IP group on the
//! interface of its own address: the first QP attached to a group opens one socket bound to
//! `group:port` with `SO_REUSEADDR` (so that every device on the host, in this process or
//! another, binds the same group and port), joined with `IP_ADD_MEMBERSHIP` on the device's
//! address; a thread receives on it and hands each datagram to the engine as if it had
//! arrived on the device's own socket (to the group address). The last QP detached closes it.
//! A socket bound to the device's unicast address never receives a group's datagrams, so no
//! datagram arrives twice. On loopback no route or root is needed (the membership and the
//! sender's bound source address pick `lo`); across network namespaces the group's
//! datagrams travel like any IP multicast on the link between them (a veth pair).
//!
//! IPv6 multicast GIDs (ff00::/8) are not mapped: kernels before 5.16 refuse IPv6 groups on
//! RoCEv2 too (`-ENOTSUPP`), and so does a soft device ([`remem_verbs::Error::Unsupported`]).

use crate::engine::Engine;
use remem_verbs::{Error, Gid, McastCaps, Result};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The receive buffer asked for a group's socket (the device's own socket's size).
const RX_BUFFER: usize = 4 << 20;

/// The QPN of a multicast packet's BTH (IBTA: a packet to it is for the group's QPs).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// How long a group's receiving thread blocks before it looks whether it should stop (the
/// last detach waits for it: a socket left in the group meanwhile would let a new one for
/// the same group see each datagram twice).
const RX_POLL: Duration = Duration::from_millis(50);

/// The IPv4 group a multicast GID stands for: `Ok(None)` for a GID that is not multicast.
pub fn group_of(mgid: &Gid) -> Result<Option<Ipv4Addr>> {
    if !mgid.is_multicast() {
        return Ok(None);
    }
    match mgid.to_ip() {
        IpAddr::V4(v4) => Ok(Some(v4)),
        IpAddr::V6(_) => Err(Error::Unsupported(
            "IPv6 multicast groups on RoCEv2 (only IPv4-mapped multicast GIDs are mapped)",
        )),
    }
}

/// One group: the QPs attached and the socket receiving for them.
#[derive(Debug)]
struct Group {
    qpns: Vec<u32>,
    _rx: GroupRx,
}

/// The socket bound to a group and the thread reading it.
#[derive(Debug)]
struct GroupRx {
    _socket: Arc<UdpSocket>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for GroupRx {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

/// The multicast groups of one device.
#[derive(Debug, Default)]
pub struct McastTable {
    groups: Mutex<HashMap<Ipv4Addr, Group>>,
}

impl McastTable {
    /// The QPs attached to `group` (empty when none).
    pub fn members(&self, group: Ipv4Addr) -> Vec<u32> {
        self.lock()
            .get(&group)
            .map(|g| g.qpns.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, Group>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches `qpn` to `group`, joining the group on the device's address first if no QP
    /// of the device is attached yet; the limits are `caps` (rxe's: ENOMEM beyond them).
    pub fn attach(
        &self,
        engine: &Arc<Engine>,
        group: Ipv4Addr,
        qpn: u32,
        caps: &McastCaps,
    ) -> Result<()> {
        let mut groups = self.lock();
        if let Some(g) = groups.get_mut(&group) {
            if g.qpns.contains(&qpn) {
                return Ok(());
            }
            if g.qpns.len() >= caps.max_mcast_qp_attach as usize {
                return Err(Error::Exhausted("QPs attached to one multicast group"));
            }
        } else if groups.len() >= caps.max_mcast_grp as usize {
            return Err(Error::Exhausted("multicast groups"));
        }
        let total: usize = groups.values().map(|g| g.qpns.len()).sum();
        if total >= caps.max_total_mcast_qp_attach as usize {
            return Err(Error::Exhausted("multicast attachments"));
        }
        if let Some(g) = groups.get_mut(&group) {
            g.qpns.push(qpn);
            return Ok(());
        }
        let rx = open_group(engine, group)?;
        groups.insert(
            group,
            Group {
                qpns: vec![qpn],
                _rx: rx,
            },
        );
        Ok(())
    }

    /// Detaches `qpn` from `group` (EINVAL if it is not attached); the last QP detached
    /// leaves the group.
    pub fn detach(&self, group: Ipv4Addr, qpn: u32) -> Result<()> {
        let removed = {
            let mut groups = self.lock();
            let Some(g) = groups.get_mut(&group) else {
                return Err(Error::InvalidArgument(format!(
                    "QP {qpn:#x} is not attached to multicast group {group}"
                )));
            };
            let Some(at) = g.qpns.iter().position(|q| *q == qpn) else {
                return Err(Error::InvalidArgument(format!(
                    "QP {qpn:#x} is not attached to multicast group {group}"
                )));
            };
            g.qpns.remove(at);
            if g.qpns.is_empty() {
                groups.remove(&group)
            } else {
                None
            }
        };
        // (The group's socket is closed and its thread joined outside the lock.)
        drop(removed);
        Ok(())
    }

    /// Detaches `qpn` from every group (its QP is destroyed, as rxe's
    /// `rxe_drop_all_mcast_groups`).
    pub fn detach_all(&self, qpn: u32) {
        let removed: Vec<Group> = {
            let mut groups = self.lock();
            for g in groups.values_mut() {
                g.qpns.retain(|q| *q != qpn);
            }
            let empty: Vec<Ipv4Addr> = groups
                .iter()
                .filter(|(_, g)| g.qpns.is_empty())
                .map(|(ip, _)| *ip)
                .collect();
            empty.iter().filter_map(|ip| groups.remove(ip)).collect()
        };
        drop(removed);
    }
}

/// Opens the socket receiving `group` for the device of `engine` and starts its thread.
fn open_group(engine: &Arc<Engine>, group: Ipv4Addr) -> Result<GroupRx> {
    let local = engine.local();
    let IpAddr::V4(iface) = local.ip().to_canonical() else {
        return Err(Error::Unsupported(
            "IPv4 multicast on a device bound to an IPv6 address",
        ));
    };
    let fail = |what: &str, e: rustix::io::Errno| {
        Error::DeviceUnavailable(format!(
            "multicast group {group} on {local}: {what}: {}",
            std::io::Error::from(e)
        ))
    };
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| fail("socket", e))?;
    // Every device on the host that joins the group binds the same address and port.
    sockopt::set_socket_reuseaddr(&fd, true).map_err(|e| fail("SO_REUSEADDR", e))?;
    rustix::net::bind(&fd, &SocketAddrV4::new(group, local.port())).map_err(|e| fail("bind", e))?;
    // Best effort, as the device's own socket: a burst to the group waits here while the
    // thread hands datagrams over one by one (the kernel may cap it at rmem_max).
    let _ = sockopt::set_socket_recv_buffer_size(&fd, RX_BUFFER);
    sockopt::set_ip_add_membership(&fd, &group, &iface)
        .map_err(|e| fail("IP_ADD_MEMBERSHIP", e))?;
    let socket = Arc::new(UdpSocket::from(fd));
    socket.set_read_timeout(Some(RX_POLL))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (socket, stop, engine) = (socket.clone(), stop.clone(), Arc::downgrade(engine));
        std::thread::Builder::new()
            .name(format!("remem-mcast-{group}"))
            .spawn(move || receive(&socket, &stop, &engine, group))?
    };
    Ok(GroupRx {
        _socket: socket,
        stop,
        thread: Some(thread),
    })
}

/// A group's receiving thread: each datagram goes to the engine as one that arrived for
/// the group's address.
fn receive(socket: &UdpSocket, stop: &AtomicBool, engine: &Weak<Engine>, group: Ipv4Addr) {
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Acquire) {
        let (n, from): (usize, SocketAddr) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(_) if stop.load(Ordering::Acquire) => return,
            Err(_) => continue,
        };
        let Some(engine) = engine.upgrade() else {
            return;
        };
        engine.stats.rx_datagrams.fetch_add(1, Ordering::Relaxed);
        let _ = engine.on_datagram(Instant::now(), from, IpAddr::V4(group), &buf[..n], 0);
    }
}
