//! Extended CQs: the `create_cq_ex` slot of `verbs_context` and the `ibv_cq_ex` poll functions (`start_poll`, `next_poll`, `end_poll`, `read_*`).
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!();

/// `verbs_context::create_cq_ex` (verbs.h's inline `ibv_create_cq_ex`).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let _ = (context, attr);
    null_with(libc::EOPNOTSUPP)
}
