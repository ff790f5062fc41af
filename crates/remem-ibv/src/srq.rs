//! Shared receive queues (posting is in `post`).
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_create_srq" @ "IBVERBS_1.1",
    "ibv_destroy_srq" @ "IBVERBS_1.1",
    "ibv_modify_srq" @ "IBVERBS_1.1",
    "ibv_query_srq" @ "IBVERBS_1.1",
);

/// `ibv_create_srq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    let _ = (pd, attr);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_destroy_srq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    let _ = srq;
    libc::EOPNOTSUPP
}

/// `ibv_modify_srq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    attr_mask: c_int,
) -> c_int {
    let _ = (srq, attr, attr_mask);
    libc::EOPNOTSUPP
}

/// `ibv_query_srq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
) -> c_int {
    let _ = (srq, attr);
    libc::EOPNOTSUPP
}

/// `verbs_context::create_srq_ex` (verbs.h's inline `ibv_create_srq_ex` for what `ibv_create_srq` cannot express).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    let _ = (context, attr);
    null_with(libc::EOPNOTSUPP)
}

/// `verbs_context::get_srq_num` (verbs.h's inline `ibv_get_srq_num`).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    let _ = (srq, srq_num);
    libc::EOPNOTSUPP
}
