//! Device, port, GID and P_Key queries.

#![allow(unsafe_code)]

use crate::abi::*;
use core::ffi::{c_int, c_uint};

symver!(
    "ibv_query_device" @ "IBVERBS_1.1",
    "ibv_query_port" @ "IBVERBS_1.1",
    "ibv_query_gid" @ "IBVERBS_1.1",
    "_ibv_query_gid_ex" @ "IBVERBS_1.11",
    "_ibv_query_gid_table" @ "IBVERBS_1.11",
    "ibv_query_pkey" @ "IBVERBS_1.1",
    "ibv_get_pkey_index" @ "IBVERBS_1.5",
    "ibv_query_gid_type" @ "IBVERBS_PRIVATE_34",
    "ibv_resolve_eth_l2_from_gid" @ "IBVERBS_1.1",
);

/// `ibv_query_device`.
///
/// # Safety
///
/// `context` is NULL or open; `attr` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    let _ = (context, attr);
    libc::EOPNOTSUPP
}

/// `ibv_query_port` (the exported symbol, reached by programs built without the inline
/// wrapper: writes the compat layout, `ibv_port_attr` up to `link_layer`).
///
/// # Safety
///
/// `context` is NULL or open; `attr` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut _compat_ibv_port_attr,
) -> c_int {
    let _ = (context, port_num, attr);
    libc::EOPNOTSUPP
}

/// `verbs_context::query_port`: what verbs.h's inline `ibv_query_port` calls.
///
/// # Safety
///
/// `context` is NULL or open; `attr` is NULL or writable for `attr_len` bytes.
pub unsafe extern "C" fn query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    let _ = (context, port_num, attr, attr_len);
    libc::EOPNOTSUPP
}

/// `verbs_context::query_device_ex`: what verbs.h's inline `ibv_query_device_ex` calls.
///
/// # Safety
///
/// `context` is NULL or open; `input` NULL or readable; `attr` NULL or writable for
/// `attr_size` bytes.
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let _ = (context, input, attr, attr_size);
    libc::EOPNOTSUPP
}

/// `ibv_query_gid`.
///
/// # Safety
///
/// `context` is NULL or open; `gid` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    let _ = (context, port_num, index, gid);
    -1
}

/// `_ibv_query_gid_ex` (behind verbs.h's inline `ibv_query_gid_ex`).
///
/// # Safety
///
/// `context` is NULL or open; `entry` NULL or writable for `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv__ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    let _ = (context, port_num, gid_index, entry, flags, entry_size);
    libc::EOPNOTSUPP
}

/// `_ibv_query_gid_table` (behind verbs.h's inline `ibv_query_gid_table`).
///
/// # Safety
///
/// `context` is NULL or open; `entries` NULL or writable for `max_entries` entries of
/// `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv__ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let _ = (context, entries, max_entries, flags, entry_size);
    -(libc::EOPNOTSUPP as isize)
}

/// `ibv_query_pkey`.
///
/// # Safety
///
/// `context` is NULL or open; `pkey` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    let _ = (context, port_num, index, pkey);
    -1
}

/// `ibv_get_pkey_index`.
///
/// # Safety
///
/// `context` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    let _ = (context, port_num, pkey);
    -1
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; perftest uses it).
///
/// # Safety
///
/// `context` is NULL or open; `gid_type` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut ibv_gid_type_sysfs,
) -> c_int {
    let _ = (context, port_num, index, gid_type);
    -1
}

/// `ibv_resolve_eth_l2_from_gid`.
///
/// # Safety
///
/// `context` is NULL or open; the pointers NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    let _ = (context, attr, eth_mac, vid);
    libc::EOPNOTSUPP
}
