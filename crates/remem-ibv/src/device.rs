//! Devices: the `REMEM_IBV_DEVICES` configuration, the device list, open and close.
//!
//! - `REMEM_IBV_DEVICES` unset: `rxe0`, the host's soft device on
//!   `127.0.0.1`, UDP port 4791, which every process of the user shares (remem-soft's
//!   `io::host`), as every process shares a kernel rxe device: `rping -s` and
//!   `rping -c -a 127.0.0.1` reach each other with no configuration; then `rxe1`, `rxe2`,
//!   … the host's device on each interface that is up with an IPv4 address
//!   (`remem_soft::dropin::default_devices`), so a server on the host's address is reached
//!   there too.
//! - set: comma-separated `name=spec`, where spec is `soft@IP[:PORT]` (the host's soft
//!   device on that address, port 4791 when omitted, shared likewise), an interface name
//!   (`lo`, `eth0`: the soft device on that interface's primary address, remem's
//!   `soft-<if>`), or `private` (a soft device on a loopback address of this process's
//!   own, `127.a.b.c` chosen from the pid: the default before the host's device). Empty:
//!   no devices. A bad value makes `ibv_get_device_list` fail with EINVAL and one line on
//!   stderr naming the variable.
//!
//! The list is made once per process, at the first `ibv_get_device_list`; its entries live
//! as long as the process (as rdma-core's do while any list or context refers to them).
//!
//! Safe code: the C entry points are in [`crate::ffi::verbs`].

#![forbid(unsafe_code)]

use crate::abi::*;
/// `ibv_open_device`'s entry point (the RDMA CM opens devices through it).
pub use crate::ffi::verbs::remem_ibv_ibv_open_device;
use core::ffi::{c_char, c_int};
use remem_soft::{SoftContext, SoftOptions};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use remem_soft::dropin;
pub use remem_soft::dropin::{
    DEFAULT_NAME, DEVICES_ENV, DeviceConfig, Spec, guid_for_addr, loopback_candidate, parse_devices,
};

/// The UDP port of RoCEv2.
const ROCE_PORT: u16 = remem_soft::ROCEV2_UDP_PORT;

// ----- the device list --------------------------------------------------------------------

/// A device entry: what `ibv_get_device_list` points to (`abi` first).
#[repr(C)]
pub struct Device {
    /// The `ibv_device` programs see.
    pub abi: ibv_device,
    /// Where rdma-core's `struct verbs_device` keeps its provider's ops, right after the
    /// `ibv_device`: NULL, so that provider libraries a program links (libmlx5, libefa)
    /// and that check whether a device is theirs (`mlx5dv_is_supported`) read "no".
    _provider_ops: usize,
    /// Position in the list (`ibv_get_device_index`).
    pub index: usize,
    /// The configuration.
    pub config: DeviceConfig,
    state: Mutex<DeviceState>,
}

#[derive(Default)]
struct DeviceState {
    /// The address a soft device binds (for `Spec::Loopback`, chosen when listed and
    /// moved on if taken when opened).
    addr: Option<SocketAddr>,
    /// The interface of a `Spec::Netdev` device, looked up when listed.
    netdev: Option<remem_soft::Netdev>,
    /// The node GUID, host order.
    guid: u64,
    /// The open remem device, shared by every context opened on this entry.
    open: Option<Weak<dyn remem_verbs::Context>>,
    /// Next loopback attempt.
    attempt: u32,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("index", &self.index)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Device {
    pub(crate) fn new(index: usize, config: DeviceConfig) -> Result<Device, String> {
        let mut state = DeviceState::default();
        match &config.spec {
            Spec::Loopback => {
                let addr = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), ROCE_PORT);
                state.addr = Some(addr);
                state.guid = guid_for_addr(addr);
            }
            Spec::PrivateLoopback => {
                let (addr, attempt) = free_loopback(std::process::id(), 0);
                state.addr = Some(addr);
                state.attempt = attempt;
                state.guid = guid_for_addr(addr);
            }
            Spec::Soft(addr) => {
                state.addr = Some(*addr);
                state.guid = guid_for_addr(*addr);
            }
            Spec::Netdev(name) => {
                let netdev = remem_soft::list_netdevs()
                    .map_err(|e| format!("cannot list interfaces: {e}"))?
                    .into_iter()
                    .find(|n| &n.name == name)
                    .ok_or_else(|| format!("no interface `{name}` with an IP address"))?;
                state.guid = netdev.node_guid();
                state.netdev = Some(netdev);
            }
        }
        let mut abi = ibv_device {
            _ops: _ibv_device_ops {
                _dummy1: None,
                _dummy2: None,
            },
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        // The names `remem run` gives the device under /dev and /sys (the same functions).
        copy_c_str(&mut abi.name, &config.name);
        copy_c_str(&mut abi.dev_name, &dropin::dev_name(index));
        copy_c_str(&mut abi.dev_path, &dropin::dev_path(index));
        copy_c_str(&mut abi.ibdev_path, &dropin::ibdev_path(&config.name));
        Ok(Device {
            abi,
            _provider_ops: 0,
            index,
            config,
            state: Mutex::new(state),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node GUID, host order.
    pub fn guid(&self) -> u64 {
        self.state().guid
    }

    /// The UDP address a soft device binds (`None` before an interface device is open).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.state().addr
    }

    /// The IP addresses the device serves: a soft device's address, an interface's
    /// addresses (what the RDMA CM matches a bound or resolved address against).
    pub fn ips(&self) -> Vec<IpAddr> {
        let st = self.state();
        match (&st.addr, &st.netdev) {
            (Some(a), _) => vec![a.ip().to_canonical()],
            (None, Some(n)) => n.addrs.iter().map(|a| a.to_canonical()).collect(),
            (None, None) => Vec::new(),
        }
    }

    /// Opens the remem device (or shares the one already open).
    pub(crate) fn open(&self) -> remem_verbs::Result<Arc<dyn remem_verbs::Context>> {
        let mut st = self.state();
        if let Some(dev) = st.open.as_ref().and_then(Weak::upgrade) {
            return Ok(dev);
        }
        let opts = SoftOptions::from_env();
        let soft: Arc<SoftContext> = match &self.config.spec {
            Spec::Netdev(_) => {
                let netdev = st
                    .netdev
                    .clone()
                    .ok_or_else(|| remem_verbs::Error::NoSuchDevice(self.config.name.clone()))?;
                Arc::new(SoftContext::new(netdev, ROCE_PORT)?)
            }
            Spec::Soft(addr) => Arc::new(SoftContext::bind_with(*addr, &opts)?),
            Spec::Loopback => {
                let addr = st.addr.unwrap_or_else(|| {
                    SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), ROCE_PORT)
                });
                Arc::new(SoftContext::bind_with(addr, &opts)?)
            }
            Spec::PrivateLoopback => {
                let mut addr = st.addr.unwrap_or_else(|| {
                    SocketAddr::new(loopback_candidate(std::process::id(), 0).into(), ROCE_PORT)
                });
                if in_use(addr) {
                    // Another process took it since the list was made: the next free one.
                    let (next, attempt) = free_loopback(std::process::id(), st.attempt + 1);
                    addr = next;
                    st.attempt = attempt;
                    st.addr = Some(addr);
                    st.guid = guid_for_addr(addr);
                }
                Arc::new(SoftContext::bind_with(addr, &opts)?)
            }
        };
        flush_at_exit(&soft);
        crate::stats::track(&self.config.name, &soft);
        let dev: Arc<dyn remem_verbs::Context> = soft;
        st.open = Some(Arc::downgrade(&dev));
        Ok(dev)
    }
}

/// How long the process's exit waits for each open device to send what it owes.
const EXIT_FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Every soft device opened, for [`flush_open_devices`].
static OPENED: Mutex<Vec<Weak<SoftContext>>> = Mutex::new(Vec::new());

/// Has `dev` flushed when the process exits ([`flush_open_devices`], registered with
/// `atexit` when the first device opens).
fn flush_at_exit(dev: &Arc<SoftContext>) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    opened.retain(|w| w.strong_count() > 0);
    opened.push(Arc::downgrade(dev));
    drop(opened);
    REGISTERED.call_once(|| {
        crate::ffi::verbs::at_exit(flush_open_devices);
    });
}

/// At exit: every device still open closes the CM connections the program left open (a
/// DREQ each, as kernel rdma_cm does when a process exits) and sends what it owes — the
/// ACKs of what the program saw complete, and what its connection manager owes (the DREP
/// of a disconnection the program saw and answered by exiting, a REJ, a DREQ's retry). A NIC
/// sends those whatever the process does next; the progress thread of a soft device dies
/// with the process. As closing a device does (`SoftContext`'s drop), bounded by one
/// second per device. Then each device's counters go to `REMEM_IBV_STATS` ([`crate::stats`]).
extern "C" fn flush_open_devices() {
    let _ = std::panic::catch_unwind(|| {
        let opened: Vec<Arc<SoftContext>> = OPENED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for dev in &opened {
            // The connections the program left open close, as kernel rdma_cm closes a
            // dying process's ids (its peers get DISCONNECTED, not a hang).
            dev.close_connections(EXIT_FLUSH_LIMIT);
            dev.flush(EXIT_FLUSH_LIMIT);
        }
        crate::stats::write_at_exit();
        // Not dropped here: the last handle's drop would stop the device's thread while
        // the program's exit may still use it (other `atexit` handlers, destructors).
        std::mem::forget(opened);
    });
}

/// Whether a UDP socket cannot bind `addr` because another one holds it.
fn in_use(addr: SocketAddr) -> bool {
    matches!(UdpSocket::bind(addr), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
}

/// The first loopback address from attempt `from` on that no socket holds (within 64
/// attempts; the last one tried otherwise), and its attempt number.
fn free_loopback(pid: u32, from: u32) -> (SocketAddr, u32) {
    let mut attempt = from;
    loop {
        let addr = SocketAddr::new(loopback_candidate(pid, attempt).into(), ROCE_PORT);
        if !in_use(addr) || attempt >= from + 63 {
            return (addr, attempt);
        }
        attempt += 1;
    }
}

fn copy_c_str(dst: &mut [c_char], s: &str) {
    let max = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as c_char;
    }
}

/// The devices of this process (made at the first call).
pub(crate) fn devices() -> Result<&'static [Device], &'static str> {
    static DEVICES: OnceLock<Result<Vec<Device>, String>> = OnceLock::new();
    DEVICES
        .get_or_init(|| {
            let value = std::env::var(DEVICES_ENV).ok();
            let configs = parse_devices(value.as_deref())?;
            configs
                .into_iter()
                .enumerate()
                .map(|(i, c)| Device::new(i, c))
                .collect()
        })
        .as_deref()
        .map_err(String::as_str)
}

/// The configured devices, in list order (the RDMA CM picks among them), or why
/// `REMEM_IBV_DEVICES` is refused.
pub(crate) fn configured() -> Result<&'static [Device], &'static str> {
    devices()
}

/// The device entry behind a program's `*mut ibv_device`: `None` for NULL or a pointer
/// that is not one of this library's entries.
pub fn device_from<'a>(device: *mut ibv_device) -> Option<&'a Device> {
    let devs = devices().ok()?;
    devs.iter()
        .find(|d| std::ptr::eq(&d.abi, device))
        .map(|d| -> &'a Device { d })
}

/// Clears `O_NONBLOCK` on `fd` (a failure leaves it non-blocking: `ibv_get_async_event`
/// then polls before reading either way).
pub(crate) fn set_blocking(fd: c_int) {
    let flags = crate::ffi::sys::get_fl(fd);
    if flags >= 0 {
        crate::ffi::sys::set_fl(fd, flags & !libc::O_NONBLOCK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft(name: &str, addr: &str) -> DeviceConfig {
        DeviceConfig {
            name: name.into(),
            spec: Spec::Soft(addr.parse().unwrap()),
        }
    }

    fn c_str(s: &[c_char]) -> String {
        s.iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect()
    }

    #[test]
    fn a_device_entry_has_no_provider_ops() {
        // Where rdma-core's verbs_device keeps its ops pointer: NULL here.
        assert_eq!(
            std::mem::offset_of!(Device, _provider_ops),
            size_of::<ibv_device>()
        );
        let d = Device::new(0, soft("x", "127.0.0.1:1")).unwrap();
        assert_eq!(d._provider_ops, 0);
    }

    #[test]
    fn device_names_are_the_ones_remem_run_shows() {
        let d = Device::new(3, soft("dev3", "127.0.0.1:1")).unwrap();
        assert_eq!(c_str(&d.abi.name), "dev3");
        assert_eq!(c_str(&d.abi.dev_name), "uverbs3");
        assert_eq!(c_str(&d.abi.dev_name), dropin::dev_name(3));
        assert_eq!(
            c_str(&d.abi.dev_path),
            "/sys/class/infiniband_verbs/uverbs3"
        );
        assert_eq!(c_str(&d.abi.ibdev_path), "/sys/class/infiniband/dev3");
    }
}
