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

/// An `ibv_ah_attr` from the kernel's `ib_uverbs_ah_attr`.
pub fn ah_attr_from_kern(k: &ib_uverbs_ah_attr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: k.grh.dgid },
            flow_label: k.grh.flow_label,
            sgid_index: k.grh.sgid_index,
            hop_limit: k.grh.hop_limit,
            traffic_class: k.grh.traffic_class,
        },
        dlid: k.dlid,
        sl: k.sl,
        src_path_bits: k.src_path_bits,
        static_rate: k.static_rate,
        is_global: k.is_global,
        port_num: k.port_num,
    }
}

/// An `ibv_qp_attr` from the kernel's `ib_uverbs_qp_attr`.
pub fn qp_attr_from_kern(k: &ib_uverbs_qp_attr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: k.qp_state,
        cur_qp_state: k.cur_qp_state,
        path_mtu: k.path_mtu,
        path_mig_state: k.path_mig_state,
        qkey: k.qkey,
        rq_psn: k.rq_psn,
        sq_psn: k.sq_psn,
        dest_qp_num: k.dest_qp_num,
        qp_access_flags: k.qp_access_flags,
        cap: ibv_qp_cap {
            max_send_wr: k.max_send_wr,
            max_recv_wr: k.max_recv_wr,
            max_send_sge: k.max_send_sge,
            max_recv_sge: k.max_recv_sge,
            max_inline_data: k.max_inline_data,
        },
        ah_attr: ah_attr_from_kern(&k.ah_attr),
        alt_ah_attr: ah_attr_from_kern(&k.alt_ah_attr),
        pkey_index: k.pkey_index,
        alt_pkey_index: k.alt_pkey_index,
        en_sqd_async_notify: k.en_sqd_async_notify,
        sq_draining: k.sq_draining,
        max_rd_atomic: k.max_rd_atomic,
        max_dest_rd_atomic: k.max_dest_rd_atomic,
        min_rnr_timer: k.min_rnr_timer,
        port_num: k.port_num,
        timeout: k.timeout,
        retry_cnt: k.retry_cnt,
        rnr_retry: k.rnr_retry,
        alt_port_num: k.alt_port_num,
        alt_timeout: k.alt_timeout,
        rate_limit: 0,
    }
}

/// An `ibv_sa_path_rec` from the kernel's `ib_user_path_rec`.
pub fn path_rec_from_kern(k: &ib_user_path_rec) -> ibv_sa_path_rec {
    ibv_sa_path_rec {
        dgid: ibv_gid { raw: k.dgid },
        sgid: ibv_gid { raw: k.sgid },
        dlid: k.dlid,
        slid: k.slid,
        raw_traffic: k.raw_traffic as c_int,
        flow_label: k.flow_label,
        hop_limit: k.hop_limit,
        traffic_class: k.traffic_class,
        reversible: k.reversible as c_int,
        numb_path: k.numb_path,
        pkey: k.pkey,
        sl: k.sl,
        mtu_selector: k.mtu_selector,
        mtu: k.mtu as u8,
        rate_selector: k.rate_selector,
        rate: k.rate,
        packet_life_time_selector: k.packet_life_time_selector,
        packet_life_time: k.packet_life_time,
        preference: k.preference,
    }
}

/// The kernel's `ib_user_path_rec` of an `ibv_sa_path_rec`.
pub fn path_rec_to_kern(p: &ibv_sa_path_rec) -> ib_user_path_rec {
    // SAFETY: reading the raw bytes of GID unions (always initialised).
    let (dgid, sgid) = unsafe { (p.dgid.raw, p.sgid.raw) };
    ib_user_path_rec {
        dgid,
        sgid,
        dlid: p.dlid,
        slid: p.slid,
        raw_traffic: p.raw_traffic as u32,
        flow_label: p.flow_label,
        reversible: p.reversible as u32,
        mtu: u32::from(p.mtu),
        pkey: p.pkey,
        hop_limit: p.hop_limit,
        traffic_class: p.traffic_class,
        numb_path: p.numb_path,
        sl: p.sl,
        mtu_selector: p.mtu_selector,
        rate_selector: p.rate_selector,
        rate: p.rate,
        packet_life_time_selector: p.packet_life_time_selector,
        packet_life_time: p.packet_life_time,
        preference: p.preference,
    }
}

/// `ibv_copy_qp_attr_from_kern`: copies a kernel `struct ib_uverbs_qp_attr` into an
/// `ibv_qp_attr` (a helper for providers and rdma_cm). Nothing for a NULL argument.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *mut ib_uverbs_qp_attr,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract; read_unaligned copes with any caller alignment.
        unsafe { dst.write_unaligned(qp_attr_from_kern(&src.read_unaligned())) };
    }
}

/// `ibv_copy_ah_attr_from_kern`: copies a kernel `struct ib_uverbs_ah_attr`.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *mut ib_uverbs_ah_attr,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract.
        unsafe { dst.write_unaligned(ah_attr_from_kern(&src.read_unaligned())) };
    }
}

/// `ibv_copy_path_rec_from_kern`: copies a kernel `struct ib_user_path_rec` into an
/// `ibv_sa_path_rec`.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *mut ib_user_path_rec,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract.
        unsafe { dst.write_unaligned(path_rec_from_kern(&src.read_unaligned())) };
    }
}

/// `ibv_copy_path_rec_to_kern`: copies an `ibv_sa_path_rec` into a kernel
/// `struct ib_user_path_rec`.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *mut ibv_sa_path_rec,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract.
        unsafe { dst.write_unaligned(path_rec_to_kern(&src.read_unaligned())) };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_event_texts() {
        assert_eq!(wc_status_str(IBV_WC_SUCCESS), c"success");
        assert_eq!(
            wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE),
            c"TM software rendezvous"
        );
        assert_eq!(wc_status_str(24), c"unknown");
        assert_eq!(event_type_str(IBV_EVENT_WQ_FATAL), c"WQ fatal");
        assert_eq!(event_type_str(20), c"unknown");
        assert_eq!(node_type_str(IBV_NODE_UNKNOWN), c"unknown");
        assert_eq!(port_state_str(IBV_PORT_ACTIVE_DEFER), c"PORT_ACTIVE_DEFER");
        assert_eq!(port_state_str(6), c"unknown");
    }

    #[test]
    fn rates_round_trip() {
        for (rate, mult) in MULT {
            assert_eq!(remem_ibv_mult_to_ibv_rate(mult), rate);
            assert_eq!(remem_ibv_ibv_rate_to_mult(rate), mult);
        }
        for (rate, mbps) in MBPS {
            assert_eq!(remem_ibv_mbps_to_ibv_rate(mbps), rate);
            assert_eq!(remem_ibv_ibv_rate_to_mbps(rate), mbps);
        }
        assert_eq!(remem_ibv_ibv_rate_to_mbps(IBV_RATE_MAX), -1);
        assert_eq!(remem_ibv_mult_to_ibv_rate(3), IBV_RATE_MAX);
    }

    #[test]
    fn path_records_round_trip_through_the_kernel_layout() {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut p: ibv_sa_path_rec = unsafe { std::mem::zeroed() };
        p.dgid = ibv_gid { raw: [7; 16] };
        p.dlid = 0x1234u16.to_be();
        p.flow_label = 0xabcdu32.to_be();
        p.reversible = 1;
        p.mtu = IBV_MTU_4096 as u8;
        p.rate = IBV_RATE_40_GBPS as u8;
        p.preference = 9;
        let k = path_rec_to_kern(&p);
        assert_eq!(k.dgid, [7; 16]);
        assert_eq!(k.mtu, IBV_MTU_4096);
        let back = path_rec_from_kern(&k);
        // SAFETY: comparing the bytes of plain C structs without padding holes read.
        let same = unsafe { (back.dgid.raw, back.sgid.raw) == (p.dgid.raw, p.sgid.raw) };
        assert!(same);
        assert_eq!(
            (
                back.dlid,
                back.flow_label,
                back.reversible,
                back.mtu,
                back.rate,
                back.preference
            ),
            (
                p.dlid,
                p.flow_label,
                p.reversible,
                p.mtu,
                p.rate,
                p.preference
            )
        );
    }

    #[test]
    fn qp_attr_from_the_kernel_layout() {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut k: ib_uverbs_qp_attr = unsafe { std::mem::zeroed() };
        k.qp_state = IBV_QPS_RTS;
        k.max_send_wr = 17;
        k.ah_attr.grh.dgid = [1; 16];
        k.ah_attr.is_global = 1;
        k.alt_timeout = 3;
        let a = qp_attr_from_kern(&k);
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!(a.cap.max_send_wr, 17);
        // SAFETY: reading the raw bytes of a GID union.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, [1; 16]);
        assert_eq!((a.ah_attr.is_global, a.alt_timeout), (1, 3));
    }
}
