//! The C entry points of the device-side objects that have moved out of their object
//! modules (protection domains): each converts the program's pointers once and calls the
//! safe object module ([`crate::pd`]).

use super::{guard_int, guard_ptr, null_with};
use crate::abi::*;
use crate::context::{Pd, ctx_from, pd_from};
use crate::pd;
use core::ffi::c_int;

symver!(
    "ibv_alloc_pd" @ "IBVERBS_1.1",
    "ibv_dealloc_pd" @ "IBVERBS_1.1",
    "ibv_import_pd" @ "IBVERBS_1.10",
    "ibv_unimport_pd" @ "IBVERBS_1.10",
);

// ----- protection domains (crate::pd) -------------------------------------------------------

/// `ibv_alloc_pd`: NULL with errno EINVAL for a NULL context.
///
/// # Safety
///
/// `context` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard_ptr("ibv_alloc_pd", || {
        // SAFETY: NULL or a live context by the contract.
        pd::alloc(unsafe { ctx_from(context) })
    })
}

/// `ibv_dealloc_pd`: 0; EBUSY while an object (MR, QP, SRQ, AH) uses the PD, EINVAL for
/// NULL.
///
/// # Safety
///
/// `pd` is NULL or a live PD, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard_int("ibv_dealloc_pd", || {
        // SAFETY: NULL or a live PD by the contract.
        let Some(p) = (unsafe { pd_from(pd) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = pd::release(&p.inner) {
            return e;
        }
        // SAFETY: a live PD of this library with no users, not used afterwards.
        unsafe { Pd::free(pd) };
        0
    })
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
