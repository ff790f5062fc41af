//! Devices: the `REMEM_IBV_DEVICES` configuration, the device list, open and close.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ffi::null_with;
use core::ffi::{c_char, c_int};

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

/// `ibv_get_device_list`.
///
/// # Safety
///
/// `num_devices` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_list(
    num_devices: *mut c_int,
) -> *mut *mut ibv_device {
    let _ = num_devices;
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_free_device_list`.
///
/// # Safety
///
/// `list` came from `ibv_get_device_list`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_free_device_list(list: *mut *mut ibv_device) {
    let _ = list;
}

/// `ibv_get_device_name`.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    let _ = device;
    null_with::<c_char>(libc::EOPNOTSUPP)
}

/// `ibv_get_device_guid`: the node GUID, big-endian.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    let _ = device;
    0
}

/// `ibv_get_device_index`.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_index(device: *mut ibv_device) -> c_int {
    let _ = device;
    -1
}

/// `ibv_open_device`.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let _ = device;
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_close_device`.
///
/// # Safety
///
/// `context` is NULL or an open context, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_close_device(context: *mut ibv_context) -> c_int {
    let _ = context;
    libc::EOPNOTSUPP
}

/// `ibv_import_device`: shares a kernel uverbs context; there is none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let _ = cmd_fd;
    null_with(libc::EOPNOTSUPP)
}
