//! Address handles (UD).
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_create_ah" @ "IBVERBS_1.1",
    "ibv_destroy_ah" @ "IBVERBS_1.1",
    "ibv_create_ah_from_wc" @ "IBVERBS_1.1",
    "ibv_init_ah_from_wc" @ "IBVERBS_1.1",
);

/// `ibv_create_ah`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_ah(
    pd: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    let _ = (pd, attr);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_destroy_ah`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    let _ = ah;
    libc::EOPNOTSUPP
}

/// `ibv_create_ah_from_wc`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    let _ = (pd, wc, grh, port_num);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_init_ah_from_wc`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    let _ = (context, port_num, wc, grh, ah_attr);
    libc::EOPNOTSUPP
}
