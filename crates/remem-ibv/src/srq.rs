//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (the limit), `ibv_query_srq`,
//! `ibv_destroy_srq`, and the `verbs_context` slots `create_srq_ex` and `get_srq_num`.
//! Posting (`ibv_post_srq_recv`) is in [`crate::post`].
//!
//! An SRQ is registered in its context so that remem's `SRQ_LIMIT_REACHED` event (which
//! names the SRQ number) reaches the program as the `ibv_srq` pointer.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::{CtxShared, PdUse, pd_from};
use crate::ffi::handles::srq_from;
use crate::ffi::{guard_int, guard_ptr, null_with};
use core::ffi::c_int;
use remem_verbs::{SharedReceiveQueue, SrqAttr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

symver!(
    "ibv_create_srq" @ "IBVERBS_1.1",
    "ibv_destroy_srq" @ "IBVERBS_1.1",
    "ibv_modify_srq" @ "IBVERBS_1.1",
    "ibv_query_srq" @ "IBVERBS_1.1",
);

/// A shared receive queue: what `ibv_create_srq` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Srq {
    /// The `ibv_srq` programs see.
    pub abi: ibv_srq,
    /// The library's side.
    pub inner: SrqInner,
}

/// The library's side of an SRQ.
pub struct SrqInner {
    /// remem's SRQ.
    pub srq: Arc<dyn SharedReceiveQueue>,
    /// Its context.
    pub ctx: Arc<CtxShared>,
    /// Most scatter entries per receive.
    pub max_sge: u32,
    /// Most receives queued.
    pub max_wr: u32,
    /// QPs taking their receives from it: destroy is EBUSY while any does.
    pub(crate) users: AtomicU32,
    _pd: PdUse,
}

impl std::fmt::Debug for SrqInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrqInner")
            .field("srq_num", &self.srq.srq_num())
            .field("max_wr", &self.max_wr)
            .finish_non_exhaustive()
    }
}

/// `ibv_create_srq`: writes the granted `max_wr` and `max_sge` back into `attr`.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: the caller's contract.
    unsafe { create_srq(pd, attr) }
}

/// `ibv_create_srq`'s body (also behind `ibv_create_srq_ex`).
///
/// # Safety
///
/// As `ibv_create_srq`.
unsafe fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq", || {
        // SAFETY: by the contract.
        let (Some(p), Some(a)) = (unsafe { pd_from(pd) }, unsafe { attr.as_mut() }) else {
            return null_with(libc::EINVAL);
        };
        let want = SrqAttr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        };
        let srq = match p.inner.pd.create_srq(want) {
            Ok(s) => s,
            Err(e) => return null_with(e.errno()),
        };
        let got = match srq.query() {
            Ok(g) => g,
            Err(e) => return null_with(e.errno()),
        };
        a.attr.max_wr = got.max_wr;
        a.attr.max_sge = got.max_sge;
        let num = srq.srq_num();
        let ctx = Arc::clone(&p.inner.ctx);
        let raw = Box::into_raw(Box::new(Srq {
            abi: ibv_srq {
                context: ctx.ibv_context(),
                srq_context: a.srq_context,
                pd,
                handle: num,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            inner: SrqInner {
                srq,
                ctx: Arc::clone(&ctx),
                max_sge: got.max_sge,
                max_wr: got.max_wr,
                users: AtomicU32::new(0),
                _pd: p.inner.hold(),
            },
        }));
        ctx.register_srq(num, raw.cast());
        raw.cast()
    })
}

/// `ibv_destroy_srq`: EBUSY while a QP uses it; waits for the acks of its async events.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard_int("ibv_destroy_srq", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { srq_from(srq) }) else {
            return libc::EINVAL;
        };
        if s.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        s.ctx.unregister_srq(s.srq.srq_num());
        // SAFETY: the Box made in create; the program no longer uses it.
        drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
        0
    })
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit event (EINVAL above `max_wr`);
/// `IBV_SRQ_MAX_WR` is satisfied when the SRQ already holds that many (remem's SRQs are
/// not resized: a larger size is EOPNOTSUPP).
///
/// # Safety
///
/// `srq` is NULL or a live SRQ; `attr` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    attr_mask: c_int,
) -> c_int {
    guard_int("ibv_modify_srq", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { srq_from(srq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let mask = attr_mask as u32;
        if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        if mask & IBV_SRQ_MAX_WR != 0 && a.max_wr > s.max_wr {
            return libc::EOPNOTSUPP;
        }
        if mask & IBV_SRQ_LIMIT != 0
            && let Err(e) = s.srq.set_limit(a.srq_limit)
        {
            return e.errno();
        }
        0
    })
}

/// `ibv_query_srq`.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ; `attr` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
) -> c_int {
    guard_int("ibv_query_srq", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { srq_from(srq) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match s.srq.query() {
            Ok(q) => {
                // SAFETY: writable by the contract.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: q.max_wr,
                        max_sge: q.max_sge,
                        srq_limit: q.srq_limit,
                    })
                };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `verbs_context::create_srq_ex` (verbs.h's inline `ibv_create_srq_ex` calls it for what
/// `ibv_create_srq` cannot express): a basic SRQ on a PD is created as `ibv_create_srq`
/// would; XRC and tag-matching SRQs are EOPNOTSUPP.
///
/// # Safety
///
/// `context` is an open context; `attr` is NULL or readable and writable.
pub unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq_ex", || {
        // SAFETY: by the contract.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return null_with(libc::EINVAL);
        };
        let known = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ
            | IBV_SRQ_INIT_ATTR_TM;
        if a.comp_mask & !known != 0 {
            return null_with(libc::EINVAL);
        }
        let basic = a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || a.srq_type == IBV_SRQT_BASIC;
        if !basic || a.comp_mask & (IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_TM) != 0 {
            return null_with(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return null_with(libc::EINVAL);
        }
        // SAFETY: `a.pd` is the program's PD.
        if unsafe { pd_from(a.pd) }.is_none_or(|p| p.inner.ctx.ibv_context() != context) {
            return null_with(libc::EINVAL);
        }
        let mut basic_attr = ibv_srq_init_attr {
            srq_context: a.srq_context,
            attr: a.attr,
        };
        // SAFETY: the PD as given; `basic_attr` is a local.
        let srq = unsafe { create_srq(a.pd, &mut basic_attr) };
        a.attr = basic_attr.attr;
        srq
    })
}

/// `verbs_context::get_srq_num` (verbs.h's inline `ibv_get_srq_num`).
///
/// # Safety
///
/// `srq` is NULL or a live SRQ; `srq_num` is NULL or writable.
pub unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    guard_int("ibv_get_srq_num", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { srq_from(srq) }) else {
            return libc::EINVAL;
        };
        if srq_num.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: writable by the contract.
        unsafe { srq_num.write(s.srq.srq_num()) };
        0
    })
}
