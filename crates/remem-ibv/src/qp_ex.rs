//! Extended QPs: the `create_qp_ex` slot of `verbs_context`, `ibv_qp_to_qp_ex`, and the `ibv_wr_*` post API of `ibv_qp_ex`.
//!
//! STUBS with the final signatures (helper B, "queues", implements this module).

#![allow(unsafe_code)]

use crate::abi::*;
#[allow(unused_imports)]
use crate::ffi::null_with;
#[allow(unused_imports)]
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_qp_to_qp_ex" @ "IBVERBS_1.6",
);

/// `verbs_context::create_qp_ex` (verbs.h's inline `ibv_create_qp_ex`).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let _ = (context, attr);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_qp_to_qp_ex`: NULL (errno EOPNOTSUPP) for a QP created without the ex API.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    let _ = qp;
    null_with(libc::EOPNOTSUPP)
}
