//! The C entry points of the device-side objects that have moved out of their object
//! modules (protection domains, memory regions and windows, asynchronous events): each
//! converts the program's pointers once and calls the safe object module ([`crate::pd`],
//! [`crate::mr`], [`crate::mw`], [`crate::event`]).

use super::handles::{Handle, free, qp_from};
use super::{ProgramMemory, guard_int, guard_neg, guard_ptr, null_with, opt_ref, out, set_errno};
use crate::abi::*;
use crate::context::{Pd, ctx_from, pd_from};
use crate::event;
use crate::mr::{self, Mr};
use crate::mw::{self, Mw};
use crate::pd;
use core::ffi::{c_int, c_uint, c_void};

symver!(
    "ibv_reg_mr" @ "IBVERBS_1.1",
    "ibv_reg_mr_iova" @ "IBVERBS_1.7",
    "ibv_reg_mr_iova2" @ "IBVERBS_1.8",
    "ibv_reg_dmabuf_mr" @ "IBVERBS_1.12",
    "ibv_rereg_mr" @ "IBVERBS_1.1",
    "ibv_dereg_mr" @ "IBVERBS_1.1",
    "ibv_import_mr" @ "IBVERBS_1.10",
    "ibv_unimport_mr" @ "IBVERBS_1.10",
    "ibv_get_async_event" @ "IBVERBS_1.1",
    "ibv_ack_async_event" @ "IBVERBS_1.1",
    "ibv_alloc_pd" @ "IBVERBS_1.1",
    "ibv_dealloc_pd" @ "IBVERBS_1.1",
    "ibv_import_pd" @ "IBVERBS_1.10",
    "ibv_unimport_pd" @ "IBVERBS_1.10",
);

// ----- protection domains (crate::pd) -------------------------------------------------------

/// `ibv_alloc_pd`: NULL with errno EINVAL for a NULL context.
///
/// # Safety
///
/// `context` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard_ptr("ibv_alloc_pd", || {
        // SAFETY: NULL or a live context by the contract.
        pd::alloc(unsafe { ctx_from(context) })
    })
}

/// `ibv_dealloc_pd`: 0; EBUSY while an object (MR, QP, SRQ, AH) uses the PD, EINVAL for
/// NULL.
///
/// # Safety
///
/// `pd` is NULL or a live PD, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard_int("ibv_dealloc_pd", || {
        // SAFETY: NULL or a live PD by the contract.
        let Some(h) = (unsafe { Handle::<Pd>::from_abi(pd) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = pd::release(h.inner()) {
            return e;
        }
        // SAFETY: a live PD of this library with no users, not used afterwards.
        unsafe { free(h) };
        0
    })
}

/// `ibv_import_pd`: a kernel object shared between processes; none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_pd(
    context: *mut ibv_context,
    pd_handle: u32,
) -> *mut ibv_pd {
    let _ = (context, pd_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_pd`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_pd(pd: *mut ibv_pd) {
    let _ = pd;
}

// ----- memory windows (crate::mw) -----------------------------------------------------------

/// `ibv_context_ops::alloc_mw`: see `mw::alloc`.
///
/// # Safety
///
/// `pd` is NULL or a live PD of this library.
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, r#type: ibv_mw_type) -> *mut ibv_mw {
    guard_ptr("ibv_alloc_mw", || {
        // SAFETY: by the contract.
        mw::alloc(unsafe { pd_from(pd) }.map(|p| &p.inner), r#type)
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
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Mw>::from_abi(mw) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the program gives the window up.
        unsafe { free(h) };
        0
    })
}

/// `ibv_context_ops::bind_mw` (verbs.h's inline `ibv_bind_mw`): see `mw::bind`.
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
        let (Some(q), Some(b)) = (unsafe { qp_from(qp) }, unsafe { opt_ref(mw_bind) }) else {
            return libc::EINVAL;
        };
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Mw>::from_abi(mw) }) else {
            return libc::EINVAL;
        };
        let rkey = mw::inc_rkey(h.rkey());
        // SAFETY: by the contract: the window, and the bind's region NULL or live.
        let op = unsafe { super::wr::bind_op(mw, rkey, &b.bind_info) };
        mw::bind(q, h, b, rkey, op)
    })
}

// ----- asynchronous events (crate::event) ---------------------------------------------------

/// `ibv_get_async_event`: see `event::get`; -1 with errno EINVAL for a NULL argument.
///
/// # Safety
///
/// `context` is NULL or open; `event` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard_neg("ibv_get_async_event", || {
        // SAFETY: by the contract.
        match unsafe { (ctx_from(context), out(event)) } {
            (Some(c), Some(e)) => event::get(c, e),
            _ => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

/// `ibv_ack_async_event`: acknowledges an event from `ibv_get_async_event` (every event
/// must be acked before its object can be destroyed).
///
/// # Safety
///
/// `event` is NULL or an event from `ibv_get_async_event` whose object is still live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    super::guard(
        "ibv_ack_async_event",
        || (),
        || {
            // SAFETY: a readable event by the contract.
            let ev = unsafe { event.read() };
            let object: *mut *mut ibv_context = match event::subject(ev.event_type) {
                event::Subject::Qp | event::Subject::Cq | event::Subject::Srq => {
                    // SAFETY: for these subjects the element is the object's pointer (the
                    // members are all pointers of the same size).
                    unsafe { ev.element.qp }.cast()
                }
                event::Subject::Wq | event::Subject::Port | event::Subject::Device => return,
            };
            if object.is_null() {
                return;
            }
            // SAFETY: a live `ibv_qp` / `ibv_cq` / `ibv_srq` of this library, whose first
            // field is its `context`.
            let context = unsafe { *object };
            // SAFETY: the object's context, open while the object lives.
            if let Some(c) = unsafe { ctx_from(context) } {
                c.shared().event_acked(object as usize);
            }
        },
    );
}

// ----- memory regions (crate::mr) -----------------------------------------------------------

/// `ibv_reg_mr`: NULL with errno EINVAL (NULL PD, zero length, bad access), EFAULT
/// (memory not mapped with the access needed), EOPNOTSUPP (on-demand paging).
///
/// # Safety
///
/// `pd` is NULL or live; `[addr, addr + length)` is program memory that stays mapped
/// until `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr", || {
        // SAFETY: by the contract.
        let (p, mem) = unsafe { (pd_from(pd), ProgramMemory::new(addr, length)) };
        mr::reg(p, mem, addr as u64, access as u32)
    })
}

/// `ibv_reg_mr_iova`: as `ibv_reg_mr`, the NIC addressing the region at `iova`.
///
/// # Safety
///
/// As [`remem_ibv_ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr_iova", || {
        // SAFETY: by the contract.
        let (p, mem) = unsafe { (pd_from(pd), ProgramMemory::new(addr, length)) };
        mr::reg(p, mem, iova, access as u32)
    })
}

/// `ibv_reg_mr_iova2`: as `ibv_reg_mr_iova` (verbs.h's inline `ibv_reg_mr` calls this
/// one when the access is not a constant or has optional bits).
///
/// # Safety
///
/// As [`remem_ibv_ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr_iova2", || {
        // SAFETY: by the contract.
        let (p, mem) = unsafe { (pd_from(pd), ProgramMemory::new(addr, length)) };
        mr::reg(p, mem, iova, access)
    })
}

/// `ibv_reg_dmabuf_mr`: no dma-buf here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, offset, length, iova, fd, access);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_rereg_mr` (ibv_rereg_mr(3)): changes the registration of `mr` in place — its
/// translation (`addr`, `length`; IBV_REREG_MR_CHANGE_TRANSLATION), its PD (`pd`, of the
/// same context; IBV_REREG_MR_CHANGE_PD) and/or its access (`access`;
/// IBV_REREG_MR_CHANGE_ACCESS); what a flag does not name stays. 0 on success: the
/// `ibv_mr` keeps its address and `handle`, and gets new `lkey`/`rkey` (a fresh
/// registration, as mlx5 gives when it re-creates the MR; rxe offers no rereg). The old
/// registration is revoked exactly as `ibv_dereg_mr` revokes it: its keys stop working at
/// once, so a peer still using the old rkey is NAKed (remote access error).
///
/// On failure nothing changed and the old registration stays valid:
/// `IBV_REREG_MR_ERR_INPUT` with errno EINVAL (NULL MR, no flag or an unknown one,
/// CHANGE_TRANSLATION without an address or length, a NULL PD or one of another context
/// with CHANGE_PD, bad access bits), EFAULT (the new range is not mapped with the access
/// needed), EOPNOTSUPP (on-demand paging), or the errno of the device's refusal.
///
/// # Safety
///
/// `mr` is NULL or live and not used by another thread during the call; `pd` NULL or
/// live; with CHANGE_TRANSLATION, `[addr, addr + length)` is program memory that stays
/// mapped until the MR is deregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let r = super::guard(
        "ibv_rereg_mr",
        || Err(libc::EIO),
        || {
            let flags = flags as u32;
            // SAFETY: by the contract.
            let h = unsafe { Handle::<Mr>::from_abi(mr) };
            let Some(h) = h.filter(|_| flags != 0 && flags & !IBV_REREG_MR_FLAGS_SUPPORTED == 0)
            else {
                return Err(libc::EINVAL);
            };
            let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
            if translation && (addr.is_null() || length == 0) {
                return Err(libc::EINVAL);
            }
            let now = h.registration();
            // SAFETY: with CHANGE_TRANSLATION the new range is program memory that stays
            // mapped (the contract); without, the current one, which `ibv_reg_mr`'s
            // contract keeps mapped until the region is deregistered.
            let mem = unsafe {
                if translation {
                    ProgramMemory::new(addr, length)
                } else {
                    ProgramMemory::new(now.addr, now.length)
                }
            };
            // SAFETY: by the contract.
            let p = unsafe { pd_from(pd) };
            mr::rereg(h, flags, p, mem, access as u32)
        },
    );
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            IBV_REREG_MR_ERR_INPUT
        }
    }
}

/// `ibv_dereg_mr`: 0; EINVAL for NULL or a region with windows bound. Work requests still
/// using the region keep the NIC's reference to the memory (the program must not unmap it
/// before they complete).
///
/// # Safety
///
/// `mr` is NULL or live, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard_int("ibv_dereg_mr", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Mr>::from_abi(mr) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = mr::release(h.inner()) {
            return e;
        }
        // SAFETY: the program gives the region up.
        unsafe { free(h) };
        0
    })
}

/// `ibv_import_mr`: none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    let _ = (pd, mr_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_mr`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_mr(mr: *mut ibv_mr) {
    let _ = mr;
}
