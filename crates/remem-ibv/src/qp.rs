//! Queue pairs (RC, UC, UD): create/destroy/modify/query and the small QP verbs.
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_create_qp" @ "IBVERBS_1.1",
    "ibv_destroy_qp" @ "IBVERBS_1.1",
    "ibv_modify_qp" @ "IBVERBS_1.1",
    "ibv_query_qp" @ "IBVERBS_1.1",
    "ibv_query_qp_data_in_order" @ "IBVERBS_1.14",
    "ibv_query_ece" @ "IBVERBS_1.10",
    "ibv_set_ece" @ "IBVERBS_1.10",
    "ibv_attach_mcast" @ "IBVERBS_1.1",
    "ibv_detach_mcast" @ "IBVERBS_1.1",
);

/// `ibv_create_qp`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let _ = (pd, attr);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_destroy_qp`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let _ = qp;
    libc::EOPNOTSUPP
}

/// `ibv_modify_qp`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    let _ = (qp, attr, attr_mask);
    libc::EOPNOTSUPP
}

/// `ibv_query_qp`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let _ = (qp, attr, attr_mask, init_attr);
    libc::EOPNOTSUPP
}

/// `ibv_query_qp_data_in_order`: 0 = no in-order guarantee.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_qp_data_in_order(
    qp: *mut ibv_qp,
    op: ibv_wr_opcode,
    flags: u32,
) -> c_int {
    let _ = (qp, op, flags);
    0
}

/// `ibv_query_ece`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    let _ = (qp, ece);
    libc::EOPNOTSUPP
}

/// `ibv_set_ece`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    let _ = (qp, ece);
    libc::EOPNOTSUPP
}

/// `ibv_attach_mcast`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    let _ = (qp, gid, lid);
    libc::EOPNOTSUPP
}

/// `ibv_detach_mcast`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    let _ = (qp, gid, lid);
    libc::EOPNOTSUPP
}
