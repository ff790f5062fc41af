//! Protection domains: `ibv_alloc_pd`, `ibv_dealloc_pd` (the object is `context::Pd`).

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ffi::null_with;
use core::ffi::c_int;

symver!(
    "ibv_alloc_pd" @ "IBVERBS_1.1",
    "ibv_dealloc_pd" @ "IBVERBS_1.1",
    "ibv_import_pd" @ "IBVERBS_1.10",
    "ibv_unimport_pd" @ "IBVERBS_1.10",
);

/// `ibv_alloc_pd`.
///
/// # Safety
///
/// `context` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    let _ = context;
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_dealloc_pd`: EBUSY while an object uses the PD.
///
/// # Safety
///
/// `pd` is NULL or a live PD, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    let _ = pd;
    libc::EOPNOTSUPP
}

/// `ibv_import_pd`: a kernel object shared between processes; none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_pd(
    context: *mut ibv_context,
    pd_handle: u32,
) -> *mut ibv_pd {
    let _ = (context, pd_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_pd`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_pd(pd: *mut ibv_pd) {
    let _ = pd;
}
