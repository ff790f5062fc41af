//! The C entry points of the device-side objects that have moved out of their object
//! modules (protection domains, memory windows, asynchronous events): each converts the
//! program's pointers once and calls the safe object module ([`crate::pd`], [`crate::mw`],
//! [`crate::event`]).

use super::handles::{Handle, free, qp_from};
use super::{guard_int, guard_neg, guard_ptr, null_with, opt_ref, out, set_errno};
use crate::abi::*;
use crate::context::{Pd, ctx_from, pd_from};
use crate::event;
use crate::mw::{self, Mw};
use crate::pd;
use core::ffi::c_int;

symver!(
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
        let Some(p) = (unsafe { pd_from(pd) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = pd::release(&p.inner) {
            return e;
        }
        // SAFETY: a live PD of this library with no users, not used afterwards.
        unsafe { Pd::free(pd) };
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
