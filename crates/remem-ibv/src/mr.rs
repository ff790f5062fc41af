//! Memory regions over program memory.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ffi::null_with;
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_reg_mr" @ "IBVERBS_1.1",
    "ibv_reg_mr_iova" @ "IBVERBS_1.7",
    "ibv_reg_mr_iova2" @ "IBVERBS_1.8",
    "ibv_reg_dmabuf_mr" @ "IBVERBS_1.12",
    "ibv_rereg_mr" @ "IBVERBS_1.1",
    "ibv_dereg_mr" @ "IBVERBS_1.1",
    "ibv_import_mr" @ "IBVERBS_1.10",
    "ibv_unimport_mr" @ "IBVERBS_1.10",
);

/// `ibv_reg_mr`.
///
/// # Safety
///
/// `pd` is NULL or live; `[addr, addr + length)` is program memory that stays mapped
/// until `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, addr, length, access);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
///
/// As [`remem_ibv_ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, addr, length, iova, access);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_reg_mr_iova2`.
///
/// # Safety
///
/// As [`remem_ibv_ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    let _ = (pd, addr, length, iova, access);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_reg_dmabuf_mr`: no dma-buf here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, offset, length, iova, fd, access);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_rereg_mr`.
///
/// # Safety
///
/// `mr` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let _ = (mr, flags, pd, addr, length, access);
    IBV_REREG_MR_ERR_INPUT
}

/// `ibv_dereg_mr`.
///
/// # Safety
///
/// `mr` is NULL or live, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let _ = mr;
    libc::EOPNOTSUPP
}

/// `ibv_import_mr`: none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    let _ = (pd, mr_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_mr`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_mr(mr: *mut ibv_mr) {
    let _ = mr;
}
