//! The helpers: strings, rate conversions, fork support, sysfs, kernel-struct copies,
//! and the imports that have no meaning without a kernel.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ffi::null_with;
use core::ffi::{CStr, c_char, c_int, c_void};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

symver!(
    "ibv_fork_init" @ "IBVERBS_1.1",
    "ibv_is_fork_initialized" @ "IBVERBS_1.13",
    "ibv_dontfork_range" @ "IBVERBS_1.1",
    "ibv_dofork_range" @ "IBVERBS_1.1",
    "ibv_wc_status_str" @ "IBVERBS_1.1",
    "ibv_event_type_str" @ "IBVERBS_1.1",
    "ibv_node_type_str" @ "IBVERBS_1.1",
    "ibv_port_state_str" @ "IBVERBS_1.1",
    "ibv_rate_to_mult" @ "IBVERBS_1.0",
    "mult_to_ibv_rate" @ "IBVERBS_1.0",
    "ibv_rate_to_mbps" @ "IBVERBS_1.1",
    "mbps_to_ibv_rate" @ "IBVERBS_1.1",
    "ibv_get_sysfs_path" @ "IBVERBS_1.0",
    "ibv_read_sysfs_file" @ "IBVERBS_1.0",
    "ibv_copy_qp_attr_from_kern" @ "IBVERBS_1.0",
    "ibv_copy_ah_attr_from_kern" @ "IBVERBS_1.1",
    "ibv_copy_path_rec_from_kern" @ "IBVERBS_1.0",
    "ibv_copy_path_rec_to_kern" @ "IBVERBS_1.0",
    "ibv_import_dm" @ "IBVERBS_1.13",
    "ibv_unimport_dm" @ "IBVERBS_1.13",
);

// ----- fork ------------------------------------------------------------------------------

/// `ibv_fork_init`: nothing to prepare (no memory is pinned; a forked child sees the
/// parent's registered memory copy-on-write like any other memory). Returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (fork needs no preparation here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing to do; 0.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_dofork_range`: nothing to do; 0.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

// ----- strings ---------------------------------------------------------------------------

/// The text of a work completion status.
pub fn wc_status_str(status: ibv_wc_status) -> &'static CStr {
    const TEXT: [&CStr; 24] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    TEXT.get(status as usize).copied().unwrap_or(c"unknown")
}

/// The text of an async event type.
pub fn event_type_str(event: ibv_event_type) -> &'static CStr {
    const TEXT: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    TEXT.get(event as usize).copied().unwrap_or(c"unknown")
}

/// The text of a node type.
pub fn node_type_str(node_type: ibv_node_type) -> &'static CStr {
    match node_type {
        IBV_NODE_CA => c"InfiniBand channel adapter",
        IBV_NODE_SWITCH => c"InfiniBand switch",
        IBV_NODE_ROUTER => c"InfiniBand router",
        IBV_NODE_RNIC => c"iWARP NIC",
        IBV_NODE_USNIC => c"usNIC",
        IBV_NODE_USNIC_UDP => c"usNIC UDP",
        IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    }
}

/// The text of a port state.
pub fn port_state_str(state: ibv_port_state) -> &'static CStr {
    const TEXT: [&CStr; 6] = [
        c"PORT_NOP",
        c"PORT_DOWN",
        c"PORT_INIT",
        c"PORT_ARMED",
        c"PORT_ACTIVE",
        c"PORT_ACTIVE_DEFER",
    ];
    TEXT.get(state as usize).copied().unwrap_or(c"unknown")
}

/// `ibv_wc_status_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    wc_status_str(status).as_ptr()
}

/// `ibv_event_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    event_type_str(event).as_ptr()
}

/// `ibv_node_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_node_type_str(node_type: ibv_node_type) -> *const c_char {
    node_type_str(node_type).as_ptr()
}

/// `ibv_port_state_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_port_state_str(state: ibv_port_state) -> *const c_char {
    port_state_str(state).as_ptr()
}

// ----- rates -------------------------------------------------------------------------------

/// `(rate, multiple of 2.5 Gb/s)` for the rates that are whole multiples.
const MULT: [(ibv_rate, c_int); 9] = [
    (IBV_RATE_2_5_GBPS, 1),
    (IBV_RATE_5_GBPS, 2),
    (IBV_RATE_10_GBPS, 4),
    (IBV_RATE_20_GBPS, 8),
    (IBV_RATE_30_GBPS, 12),
    (IBV_RATE_40_GBPS, 16),
    (IBV_RATE_60_GBPS, 24),
    (IBV_RATE_80_GBPS, 32),
    (IBV_RATE_120_GBPS, 48),
];

/// `(rate, Mb/s)`: the data rates of the IBTA link speeds and widths.
const MBPS: [(ibv_rate, c_int); 23] = [
    (IBV_RATE_2_5_GBPS, 2500),
    (IBV_RATE_5_GBPS, 5000),
    (IBV_RATE_10_GBPS, 10000),
    (IBV_RATE_20_GBPS, 20000),
    (IBV_RATE_30_GBPS, 30000),
    (IBV_RATE_40_GBPS, 40000),
    (IBV_RATE_60_GBPS, 60000),
    (IBV_RATE_80_GBPS, 80000),
    (IBV_RATE_120_GBPS, 120000),
    (IBV_RATE_14_GBPS, 14062),
    (IBV_RATE_56_GBPS, 56250),
    (IBV_RATE_112_GBPS, 112500),
    (IBV_RATE_168_GBPS, 168750),
    (IBV_RATE_25_GBPS, 25781),
    (IBV_RATE_100_GBPS, 103125),
    (IBV_RATE_200_GBPS, 206250),
    (IBV_RATE_300_GBPS, 309375),
    (IBV_RATE_28_GBPS, 28125),
    (IBV_RATE_50_GBPS, 53125),
    (IBV_RATE_400_GBPS, 425000),
    (IBV_RATE_600_GBPS, 637500),
    (IBV_RATE_800_GBPS, 850000),
    (IBV_RATE_1200_GBPS, 1275000),
];

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s; -1 if it is not one.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    MULT.iter()
        .find(|(r, _)| *r == rate)
        .map_or(-1, |(_, m)| *m)
}

/// `mult_to_ibv_rate`: the rate of a multiple of 2.5 Gb/s; `IBV_RATE_MAX` if none.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    MULT.iter()
        .find(|(_, m)| *m == mult)
        .map_or(IBV_RATE_MAX, |(r, _)| *r)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s; -1 if unknown.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    MBPS.iter()
        .find(|(r, _)| *r == rate)
        .map_or(-1, |(_, m)| *m)
}

/// `mbps_to_ibv_rate`: the rate of exactly `mbps`; `IBV_RATE_MAX` if none.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    MBPS.iter()
        .find(|(_, m)| *m == mbps)
        .map_or(IBV_RATE_MAX, |(r, _)| *r)
}

// ----- sysfs -------------------------------------------------------------------------------

/// `ibv_get_sysfs_path`: `/sys` (the soft devices have no sysfs entries).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated, a trailing
/// newline removed); the length read, or -1 with errno set.
///
/// # Safety
///
/// `dir` and `file` are NULL or NUL-terminated strings; `buf` is NULL or writable for
/// `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        crate::ffi::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: non-NULL NUL-terminated strings by the contract.
    let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = std::path::Path::new(OsStr::from_bytes(dir.to_bytes()))
        .join(OsStr::from_bytes(file.to_bytes()));
    match std::fs::read(&path) {
        Ok(mut data) => {
            data.truncate(size - 1);
            if data.last() == Some(&b'\n') {
                data.pop();
            }
            // SAFETY: `buf` is writable for `size` bytes and `data.len() < size`.
            let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
            out[..data.len()].copy_from_slice(&data);
            out[data.len()] = 0;
            data.len() as c_int
        }
        Err(e) => {
            crate::ffi::set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            -1
        }
    }
}

// ----- kernel struct copies (provider helpers) -----------------------------------------------

/// `ibv_copy_qp_attr_from_kern`: copies a kernel `struct ib_uverbs_qp_attr` into an
/// `ibv_qp_attr` (a helper for providers).
///
/// # Safety
///
/// `dst` and `src` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *mut c_void,
) {
    let _ = (dst, src);
}

/// `ibv_copy_ah_attr_from_kern`: copies a kernel `struct ib_uverbs_ah_attr`.
///
/// # Safety
///
/// `dst` and `src` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *mut c_void,
) {
    let _ = (dst, src);
}

/// `ibv_copy_path_rec_from_kern`: copies a kernel `struct ib_user_path_rec` into an
/// `ibv_sa_path_rec`.
///
/// # Safety
///
/// `dst` and `src` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_path_rec_from_kern(dst: *mut c_void, src: *mut c_void) {
    let _ = (dst, src);
}

/// `ibv_copy_path_rec_to_kern`: copies an `ibv_sa_path_rec` into a kernel
/// `struct ib_user_path_rec`.
///
/// # Safety
///
/// `dst` and `src` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_path_rec_to_kern(dst: *mut c_void, src: *mut c_void) {
    let _ = (dst, src);
}

// ----- imports -----------------------------------------------------------------------------

/// `ibv_import_dm`: no device memory here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_dm(
    context: *mut ibv_context,
    dm_handle: u32,
) -> *mut ibv_dm {
    let _ = (context, dm_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_dm`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_dm(dm: *mut ibv_dm) {
    let _ = dm;
}
