//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (the limit), `ibv_query_srq`,
//! `ibv_destroy_srq`, and the `verbs_context` slots `create_srq_ex` and `get_srq_num`.
//! Posting (`ibv_post_srq_recv`) is in [`crate::post`].
//!
//! An SRQ is registered in its context so that remem's `SRQ_LIMIT_REACHED` event (which
//! names the SRQ number) reaches the program as the `ibv_srq` pointer.

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{CtxShared, PdInner, PdUse};
use crate::ffi::handles::into_abi;
use crate::ffi::null_with;
use core::ffi::c_int;
use core::mem::MaybeUninit;
use remem_verbs::{SharedReceiveQueue, SrqAttr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

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

/// `ibv_create_srq` (and a basic `ibv_create_srq_ex`) once the FFI layer has its
/// arguments: writes the granted `max_wr` and `max_sge` back into `a`; the pointer the
/// program holds, or NULL with errno.
pub(crate) fn create(pd: &Arc<PdInner>, a: &mut ibv_srq_init_attr) -> *mut ibv_srq {
    let want = SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    let srq = match pd.pd.create_srq(want) {
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
    let ctx = Arc::clone(&pd.ctx);
    let raw = into_abi(Srq {
        abi: ibv_srq {
            context: ctx.ibv_context(),
            srq_context: a.srq_context,
            pd: pd.ibv_pd(),
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
            _pd: pd.hold(),
        },
    });
    ctx.register_srq(num, raw);
    raw
}

/// Takes the SRQ apart before the box is freed (`ibv_destroy_srq`): EBUSY while a QP uses
/// it; waits for the acks of its async events.
pub(crate) fn release(s: &SrqInner) -> Result<(), c_int> {
    if s.users.load(Ordering::Acquire) != 0 {
        return Err(libc::EBUSY);
    }
    s.ctx.unregister_srq(s.srq.srq_num());
    Ok(())
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit event (EINVAL above `max_wr`);
/// `IBV_SRQ_MAX_WR` is satisfied when the SRQ already holds that many (remem's SRQs are
/// not resized: a larger size is EOPNOTSUPP).
pub(crate) fn modify(s: &SrqInner, a: &ibv_srq_attr, attr_mask: c_int) -> c_int {
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
}

/// `ibv_query_srq`.
pub(crate) fn query(s: &SrqInner, attr: &mut MaybeUninit<ibv_srq_attr>) -> c_int {
    match s.srq.query() {
        Ok(q) => {
            attr.write(ibv_srq_attr {
                max_wr: q.max_wr,
                max_sge: q.max_sge,
                srq_limit: q.srq_limit,
            });
            0
        }
        Err(e) => e.errno(),
    }
}

/// `verbs_context::create_srq_ex` once the FFI layer has its arguments (`pd`: `a.pd`'s):
/// a basic SRQ on a PD is created as `ibv_create_srq` would; XRC and tag-matching SRQs
/// are EOPNOTSUPP.
pub(crate) fn create_ex(
    context: *mut ibv_context,
    a: &mut ibv_srq_init_attr_ex,
    pd: Option<&Arc<PdInner>>,
) -> *mut ibv_srq {
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
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
        return null_with(libc::EINVAL);
    }
    let Some(pd) = pd.filter(|p| p.ctx.ibv_context() == context) else {
        return null_with(libc::EINVAL);
    };
    let mut basic_attr = ibv_srq_init_attr {
        srq_context: a.srq_context,
        attr: a.attr,
    };
    let srq = create(pd, &mut basic_attr);
    a.attr = basic_attr.attr;
    srq
}
