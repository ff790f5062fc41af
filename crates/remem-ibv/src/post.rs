//! Posting: the `post_send`, `post_recv`, `post_srq_recv` slots of `ibv_context_ops` (verbs.h's inline `ibv_post_send`, ...).
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!();

/// `ibv_context_ops::post_send`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let _ = (qp, wr, bad_wr);
    libc::EOPNOTSUPP
}

/// `ibv_context_ops::post_recv`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let _ = (qp, wr, bad_wr);
    libc::EOPNOTSUPP
}

/// `ibv_context_ops::post_srq_recv`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let _ = (srq, wr, bad_wr);
    libc::EOPNOTSUPP
}
