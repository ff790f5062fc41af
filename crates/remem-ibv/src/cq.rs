//! Completion queues: create/destroy/resize, completion events, and the `poll_cq` / `req_notify_cq` slots of `ibv_context_ops`.
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_create_cq" @ "IBVERBS_1.1",
    "ibv_destroy_cq" @ "IBVERBS_1.1",
    "ibv_resize_cq" @ "IBVERBS_1.1",
    "ibv_get_cq_event" @ "IBVERBS_1.1",
    "ibv_ack_cq_events" @ "IBVERBS_1.1",
);

/// `ibv_create_cq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let _ = (context, cqe, cq_context, channel, comp_vector);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_destroy_cq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let _ = cq;
    libc::EOPNOTSUPP
}

/// `ibv_resize_cq`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let _ = (cq, cqe);
    libc::EOPNOTSUPP
}

/// `ibv_get_cq_event`: blocks unless the channel fd is O_NONBLOCK; 0, or -1 with errno.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let _ = (channel, cq, cq_context);
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    -1
}

/// `ibv_ack_cq_events`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    let _ = (cq, nevents);
}

/// `ibv_context_ops::poll_cq` (verbs.h's inline `ibv_poll_cq`): the number of completions, or a negative value on error.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    let _ = (cq, num_entries, wc);
    -1
}

/// `ibv_context_ops::req_notify_cq` (verbs.h's inline `ibv_req_notify_cq`).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let _ = (cq, solicited_only);
    libc::EOPNOTSUPP
}
