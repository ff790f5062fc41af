//! Memory windows: the `alloc_mw`, `dealloc_mw` and `bind_mw` slots of `ibv_context_ops`
//! (verbs.h's inline `ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`), and the bind work
//! request shared by `ibv_post_send`'s `IBV_WR_BIND_MW` and `ibv_wr_bind_mw`.
//!
//! A window is remem's ([`remem_verbs::MemoryWindow`], the soft device's key table: see
//! remem-soft's `objects::mr`), so a peer's access through its rkey is checked and revoked
//! exactly like a region's. Types 1 and 2 (2B: reached only through the QP it was bound
//! on) are offered, as rxe offers them. A bind is a work request executed in send-queue
//! order: `ibv_bind_mw` (type 1) posts one with the rkey `ibv_inc_rkey(mw->rkey)` and, once
//! posted, sets `mw->rkey` to it (as rxe's provider does); a type 2 window is bound by
//! `IBV_WR_BIND_MW` / `ibv_wr_bind_mw` with the rkey the program chose, and freed by
//! `IBV_WR_LOCAL_INV` or by a peer's SEND with invalidate. A refused bind completes with
//! `IBV_WC_MW_BIND_ERR` and the QP goes to the error state. `ibv_dereg_mr` of a region with
//! windows bound is EINVAL (rxe, IBA 10.6.7.2.6); `ibv_dealloc_pd` while windows hold the
//! PD is EBUSY. RC and UC QPs take binds, as rxe's do (`IBV_QP_EX_WITH_BIND_MW` on both,
//! `_LOCAL_INV` on RC).

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::{PdUse, pd_from};
use crate::ffi::handles::qp_from;
use crate::ffi::{errno_of, guard_int, guard_ptr, null_with};
use crate::post::send_flags;
use core::ffi::c_int;
use remem_verbs::{AccessFlags, MemoryWindow, MwType, SendOp, SendWr};
use std::sync::Arc;

symver!();

/// A memory window: what `ibv_alloc_mw` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Mw {
    /// The `ibv_mw` programs see (`rkey` is the one its last `ibv_bind_mw` gave it).
    pub abi: ibv_mw,
    /// The remem window.
    pub mw: Arc<dyn MemoryWindow>,
    _pd: PdUse,
}

/// The window behind a program's `*mut ibv_mw`; `None` for NULL.
///
/// # Safety
///
/// `mw` is NULL or a live window made by [`alloc_mw`]; the reference must not outlive it.
pub unsafe fn mw_from<'a>(mw: *mut ibv_mw) -> Option<&'a Mw> {
    // SAFETY: by the contract, a non-NULL `mw` is the first field of a boxed `Mw`.
    unsafe { mw.cast::<Mw>().as_ref() }
}

/// `ibv_context_ops::alloc_mw`: a window of `type` (`IBV_MW_TYPE_1` or `_2`) on `pd`;
/// NULL with errno EINVAL for another type or a NULL PD, ENOMEM past `max_mw`.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, r#type: ibv_mw_type) -> *mut ibv_mw {
    guard_ptr("ibv_alloc_mw", || {
        // SAFETY: by the contract.
        let Some(p) = (unsafe { pd_from(pd) }) else {
            return null_with(libc::EINVAL);
        };
        let ty = match r#type {
            IBV_MW_TYPE_1 => MwType::One,
            IBV_MW_TYPE_2 => MwType::Two,
            _ => return null_with(libc::EINVAL),
        };
        let mw = match p.inner.pd.alloc_mw(ty) {
            Ok(m) => m,
            Err(remem_verbs::Error::Exhausted(_)) => return null_with(libc::ENOMEM),
            Err(e) => return null_with(errno_of(&e)),
        };
        let raw = Box::into_raw(Box::new(Mw {
            abi: ibv_mw {
                context: p.inner.ctx.ibv_context(),
                pd,
                rkey: mw.rkey(),
                handle: mw.rkey() >> 8,
                r#type,
            },
            mw,
            _pd: p.inner.hold(),
        }));
        raw.cast()
    })
}

/// `ibv_context_ops::dealloc_mw`: 0 (its binding is revoked before this returns);
/// EINVAL for NULL.
///
/// # Safety
///
/// `mw` is NULL or a live window of this library, not used afterwards.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard_int("ibv_dealloc_mw", || {
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live window made by `alloc_mw` (its first field), not used afterwards.
        drop(unsafe { Box::from_raw(mw.cast::<Mw>()) });
        0
    })
}

/// The bind work request of window `mw` (its `ibv_mw.rkey` names it) with `info`, giving
/// it `rkey`: EINVAL for a NULL window, unknown access bits, a zero-based window (rxe's
/// provider refuses them), or an address or length without a region.
///
/// # Safety
///
/// `mw` is NULL or a live window of this library; `info.mr` is NULL or a live region of
/// this library.
pub(crate) unsafe fn bind_op(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<SendOp, c_int> {
    if mw.is_null() {
        return Err(libc::EINVAL);
    }
    let access = AccessFlags::from_bits(info.mw_access_flags).ok_or(libc::EINVAL)?;
    if access.contains(AccessFlags::ZERO_BASED) {
        return Err(libc::EINVAL);
    }
    let lkey = if info.mr.is_null() {
        if info.addr != 0 || info.length != 0 {
            return Err(libc::EINVAL);
        }
        0
    } else {
        // SAFETY: a live region of this library by the contract.
        unsafe { (*info.mr).lkey }
    };
    Ok(SendOp::BindMw {
        // SAFETY: a live window by the contract; its `rkey` (which the program may set
        // for a type 2 window) is read in place.
        mw: unsafe { (*mw).rkey },
        rkey,
        lkey,
        addr: info.addr,
        len: info.length,
        access,
    })
}

/// `ibv_context_ops::bind_mw` (verbs.h's inline `ibv_bind_mw`, which has already refused
/// a window that is not type 1 and a region of another PD): posts the bind on `qp` with
/// the rkey `ibv_inc_rkey(mw->rkey)` and sets `mw->rkey` to it. 0, or the errno of the post
/// (EINVAL: the checks `bind_op` makes; a QP that cannot take it).
///
/// # Safety
///
/// `qp`, `mw` and `mw_bind` are NULL or live objects of this library (`mw_bind` readable,
/// its region NULL or live).
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard_int("ibv_bind_mw", || {
        // SAFETY: by the contract.
        let (Some(q), Some(b)) = (unsafe { qp_from(qp) }, unsafe { mw_bind.as_ref() }) else {
            return libc::EINVAL;
        };
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live window by the contract; its `rkey` is read in place.
        let rkey = inc_rkey(unsafe { (*mw).rkey });
        // SAFETY: by the contract.
        let op = match unsafe { bind_op(mw, rkey, &b.bind_info) } {
            Ok(op) => op,
            Err(e) => return e,
        };
        let flags = match send_flags(b.send_flags) {
            Ok(f) => f,
            Err(e) => return e,
        };
        let mut wr = SendWr::new(b.wr_id, op, &[]);
        wr.flags = flags;
        if let Err(e) = q.qp.post_send(std::slice::from_ref(&wr)) {
            return e.error.errno();
        }
        // SAFETY: the program's live window; the rkey field is written as rxe's provider
        // writes it once the bind is posted.
        unsafe { (*mw).rkey = rkey };
        0
    })
}

/// verbs.h's `ibv_inc_rkey`: the key byte (low 8 bits) plus one, the index kept.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_changes_the_key_byte_only() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
    }
}
