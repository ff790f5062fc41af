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

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{PdInner, PdUse};
use crate::ffi::handles::{Handle, into_abi};
use crate::ffi::{errno_of, null_with};
use crate::post::send_flags;
use crate::qp::QpInner;
use core::ffi::c_int;
use remem_verbs::{AccessFlags, MemoryWindow, MwType, SendOp, SendWr};
use std::sync::Arc;

/// A memory window: what `ibv_alloc_mw` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Mw {
    /// The `ibv_mw` programs see (`rkey` is the one its last `ibv_bind_mw` gave it).
    pub abi: ibv_mw,
    /// The library's side.
    pub inner: MwInner,
}

/// The library's side of a memory window.
pub struct MwInner {
    /// The remem window.
    pub mw: Arc<dyn MemoryWindow>,
    _pd: PdUse,
}

impl std::fmt::Debug for MwInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MwInner")
            .field("rkey", &self.mw.rkey())
            .finish_non_exhaustive()
    }
}

/// `ibv_context_ops::alloc_mw` once the FFI layer has the PD: a window of `type`
/// (`IBV_MW_TYPE_1` or `_2`) on `pd`; NULL with errno EINVAL for another type or a NULL
/// PD, ENOMEM past `max_mw`.
pub(crate) fn alloc(pd: Option<&Arc<PdInner>>, r#type: ibv_mw_type) -> *mut ibv_mw {
    let Some(p) = pd else {
        return null_with(libc::EINVAL);
    };
    let ty = match r#type {
        IBV_MW_TYPE_1 => MwType::One,
        IBV_MW_TYPE_2 => MwType::Two,
        _ => return null_with(libc::EINVAL),
    };
    let mw = match p.pd.alloc_mw(ty) {
        Ok(m) => m,
        Err(remem_verbs::Error::Exhausted(_)) => return null_with(libc::ENOMEM),
        Err(e) => return null_with(errno_of(&e)),
    };
    into_abi(Mw {
        abi: ibv_mw {
            context: p.ctx.ibv_context(),
            pd: p.ibv_pd(),
            rkey: mw.rkey(),
            handle: mw.rkey() >> 8,
            r#type,
        },
        inner: MwInner { mw, _pd: p.hold() },
    })
}

/// The bind work request of the window whose `ibv_mw.rkey` is `mw_rkey` (`None`: a NULL
/// window) with `info` (`mr_lkey`: the lkey of `info.mr`, `None` for NULL), giving it
/// `rkey`: EINVAL for a NULL window, unknown access bits, a zero-based window (rxe's
/// provider refuses them), or an address or length without a region.
pub(crate) fn bind_op(
    mw_rkey: Option<u32>,
    rkey: u32,
    info: &ibv_mw_bind_info,
    mr_lkey: Option<u32>,
) -> Result<SendOp, c_int> {
    let Some(mw) = mw_rkey else {
        return Err(libc::EINVAL);
    };
    let access = AccessFlags::from_bits(info.mw_access_flags).ok_or(libc::EINVAL)?;
    if access.contains(AccessFlags::ZERO_BASED) {
        return Err(libc::EINVAL);
    }
    let lkey = match mr_lkey {
        Some(lkey) => lkey,
        None if info.addr != 0 || info.length != 0 => return Err(libc::EINVAL),
        None => 0,
    };
    Ok(SendOp::BindMw {
        mw,
        rkey,
        lkey,
        addr: info.addr,
        len: info.length,
        access,
    })
}

/// `ibv_context_ops::bind_mw` (verbs.h's inline `ibv_bind_mw`, which has already refused
/// a window that is not type 1 and a region of another PD) once the FFI layer has the
/// bind (`op`: [`bind_op`] with the rkey [`inc_rkey`]`(mw->rkey)`): posts it on `q` and
/// sets `mw->rkey` to the new rkey. 0, or the errno of the post (EINVAL: the checks
/// `bind_op` makes; a QP that cannot take it).
pub(crate) fn bind(
    q: &QpInner,
    mw: Handle<'_, Mw>,
    b: &ibv_mw_bind,
    rkey: u32,
    op: Result<SendOp, c_int>,
) -> c_int {
    let op = match op {
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
    // As rxe's provider writes it once the bind is posted.
    mw.set_rkey(rkey);
    0
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
