//! Completion channels: a pollable fd per channel (`ibv_get_cq_event`).
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_create_comp_channel" @ "IBVERBS_1.0",
    "ibv_destroy_comp_channel" @ "IBVERBS_1.0",
);

/// `ibv_create_comp_channel`.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    let _ = context;
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_comp_channel(
    channel: *mut ibv_comp_channel,
) -> c_int {
    let _ = channel;
    libc::EOPNOTSUPP
}
