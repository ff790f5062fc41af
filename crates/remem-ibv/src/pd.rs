//! Protection domains: `ibv_alloc_pd`, `ibv_dealloc_pd` (the object is `context::Pd`; the
//! C entry points are in [`crate::ffi::device`]).

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{Ctx, Pd, PdInner};
use crate::ffi::{errno_of, null_with};
use core::ffi::c_int;

/// `ibv_alloc_pd` once the FFI layer has the context: NULL with errno EINVAL for a NULL
/// context.
pub(crate) fn alloc(ctx: Option<&Ctx>) -> *mut ibv_pd {
    let Some(c) = ctx else {
        return null_with(libc::EINVAL);
    };
    match c.shared().dev.alloc_pd() {
        Ok(pd) => Pd::create(c.shared(), pd),
        Err(e) => null_with(errno_of(&e)),
    }
}

/// Whether the PD may be freed (`ibv_dealloc_pd`): EBUSY while an object (MR, QP, SRQ,
/// AH) uses it.
pub(crate) fn release(p: &PdInner) -> Result<(), c_int> {
    if p.users() > 0 {
        return Err(libc::EBUSY);
    }
    Ok(())
}
