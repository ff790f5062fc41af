//! Devices: the `REMEM_IBV_DEVICES` configuration, the device list, open and close.
//!
//! - `REMEM_IBV_DEVICES` unset: one device, `rxe0`, a soft device on a loopback address
//!   of this process's own (`127.a.b.c` chosen from the pid, never `127.0.0.1`; the next
//!   one if that is taken), UDP port 4791. Two programs on one host each get their own
//!   address and reach each other with no configuration.
//! - set: comma-separated `name=spec`, where spec is `soft@IP[:PORT]` (a soft device
//!   bound to that address, port 4791 when omitted) or an interface name (`lo`, `eth0`:
//!   the soft device on that interface's primary address, remem's `soft-<if>`). Empty:
//!   no devices. A bad value makes `ibv_get_device_list` fail with EINVAL and one line on
//!   stderr naming the variable.
//!
//! The list is made once per process, at the first `ibv_get_device_list`; its entries live
//! as long as the process (as rdma-core's do while any list or context refers to them).

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::Ctx;
use crate::ffi::{guard_int, guard_ptr, null_with, set_errno};
use core::ffi::{c_char, c_int};
use remem_soft::{SoftContext, SoftOptions};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, OnceLock, Weak};

symver!(
    "ibv_get_device_list" @ "IBVERBS_1.1",
    "ibv_free_device_list" @ "IBVERBS_1.1",
    "ibv_get_device_name" @ "IBVERBS_1.1",
    "ibv_get_device_guid" @ "IBVERBS_1.1",
    "ibv_get_device_index" @ "IBVERBS_1.9",
    "ibv_open_device" @ "IBVERBS_1.1",
    "ibv_close_device" @ "IBVERBS_1.1",
    "ibv_import_device" @ "IBVERBS_1.10",
);

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
    fn new(index: usize, config: DeviceConfig) -> Result<Device, String> {
        let mut state = DeviceState::default();
        match &config.spec {
            Spec::Loopback => {
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
    fn open(&self) -> remem_verbs::Result<Arc<dyn remem_verbs::Context>> {
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
        // SAFETY: registers a function of this library that takes no argument and does not
        // unwind (it catches panics); the library is never unloaded while the process runs
        // (its devices' threads live in it).
        unsafe { libc::atexit(flush_open_devices) };
    });
}

/// At exit: every device still open sends what it owes first — the ACKs of what the
/// program saw complete, and what its connection manager owes (the DREP of a
/// disconnection the program saw and answered by exiting, a REJ, a DREQ's retry). A NIC
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
fn devices() -> Result<&'static [Device], &'static str> {
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

/// `ibv_get_device_list`: a NULL-terminated array of the devices (free it with
/// `ibv_free_device_list`); `*num_devices` their number. NULL with errno EINVAL if
/// `REMEM_IBV_DEVICES` is bad.
///
/// # Safety
///
/// `num_devices` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_list(
    num_devices: *mut c_int,
) -> *mut *mut ibv_device {
    guard_ptr("ibv_get_device_list", || {
        let devs = match devices() {
            Ok(d) => d,
            Err(why) => {
                eprintln!("remem-ibv: {DEVICES_ENV}: {why}");
                if !num_devices.is_null() {
                    // SAFETY: non-NULL, writable by the contract.
                    unsafe { *num_devices = 0 };
                }
                return null_with(libc::EINVAL);
            }
        };
        let mut list: Vec<*mut ibv_device> =
            devs.iter().map(|d| (&raw const d.abi).cast_mut()).collect();
        list.push(std::ptr::null_mut());
        if !num_devices.is_null() {
            // SAFETY: non-NULL, writable by the contract.
            unsafe { *num_devices = devs.len() as c_int };
        }
        Box::into_raw(list.into_boxed_slice()).cast()
    })
}

/// `ibv_free_device_list`.
///
/// # Safety
///
/// `list` is NULL or came from `ibv_get_device_list` and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated (made by ibv_get_device_list).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: the boxed slice of n + 1 pointers made by ibv_get_device_list.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `ibv_get_device_name`: NULL (errno EINVAL) for a pointer that is not a device.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match device_from(device) {
        Some(d) => d.abi.name.as_ptr(),
        None => null_with::<c_char>(libc::EINVAL),
    }
}

/// `ibv_get_device_guid`: the node GUID, big-endian (0 with errno EINVAL for a pointer
/// that is not a device).
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    match device_from(device) {
        Some(d) => d.guid().to_be(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    }
}

/// `ibv_get_device_index`: the device's position in the list; -1 for a pointer that is
/// not a device.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_index(device: *mut ibv_device) -> c_int {
    device_from(device).map_or(-1, |d| d.index as c_int)
}

/// `ibv_open_device`: opens the soft device (its progress thread starts in this process).
/// NULL with errno: EINVAL for a pointer that is not a device, ENODEV (or the socket's
/// error) if it cannot be opened.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard_ptr("ibv_open_device", || {
        let Some(d) = device_from(device) else {
            return null_with(libc::EINVAL);
        };
        match d.open() {
            Ok(dev) => {
                let ctx = Ctx::create(dev, device);
                // ibv_get_async_event blocks unless the program sets O_NONBLOCK itself.
                // SAFETY: `ctx` was just made and is live.
                let fd = unsafe { (*ctx).async_fd };
                set_blocking(fd);
                ctx
            }
            Err(e) => {
                eprintln!("remem-ibv: cannot open {}: {e}", d.config.name);
                null_with(crate::ffi::errno_of(&e))
            }
        }
    })
}

/// Clears `O_NONBLOCK` on `fd` (a failure leaves it non-blocking: `ibv_get_async_event`
/// then polls before reading either way).
fn set_blocking(fd: c_int) {
    // SAFETY: fcntl on an fd this library owns; F_GETFL/F_SETFL touch only its flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
}

/// `ibv_close_device`: 0, or EINVAL for a context this library did not make. Objects the
/// program did not destroy stay usable until it does (they keep the device open).
///
/// # Safety
///
/// `context` is NULL or an open context, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_close_device(context: *mut ibv_context) -> c_int {
    guard_int("ibv_close_device", || {
        // SAFETY: NULL or a live context by the contract.
        if unsafe { crate::context::ctx_from(context) }.is_none() {
            return libc::EINVAL;
        }
        crate::stats::snapshot();
        // SAFETY: a context this library made (checked above), not used afterwards.
        unsafe { crate::ffi::handles::ctx_free(context) };
        0
    })
}

/// `ibv_import_device`: shares a kernel uverbs context; there is none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let _ = cmd_fd;
    null_with(libc::EOPNOTSUPP)
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

    #[test]
    fn programs_see_the_table_remem_run_describes() {
        // `remem run` writes /sys/class/infiniband/<dev>/ports/1/gids from
        // `dropin::program_gid_table`; an open device's table is the same.
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let d = Device::new(0, soft("t", "127.0.0.1:0")).unwrap();
        let dev = d.open().unwrap();
        let ctx = Ctx::create(dev, (&raw const d.abi).cast_mut());
        // SAFETY: a live context just made.
        let shared = unsafe { crate::context::ctx_from(ctx) }.unwrap().shared();
        let seen = shared.gid_table(1).unwrap();
        assert_eq!(seen, dropin::program_gid_table(addr.ip()));
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe { crate::ffi::handles::ctx_free(ctx) };
    }
}
