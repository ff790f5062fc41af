//! Extended CQs: `ibv_create_cq_ex` (the `verbs_context` slot verbs.h's inline wrapper
//! calls) and the `ibv_cq_ex` functions behind `ibv_start_poll`, `ibv_next_poll`,
//! `ibv_end_poll` and `ibv_wc_read_*`.
//!
//! Every CQ carries these functions (see [`crate::cq`]): `ibv_start_poll` takes one
//! completion from remem's CQ, sets `status` and `wr_id` in the `ibv_cq_ex`, and keeps it
//! for the `read_*` calls until `ibv_next_poll` takes the next. Completions not yet taken
//! stay in remem's CQ, so plain `ibv_poll_cq` and the extended API can be mixed.
//!
//! `wc_flags` may ask for the standard fields (`IBV_WC_STANDARD_FLAGS`: byte_len, imm,
//! qp_num, src_qp, slid, sl, dlid_path_bits); timestamps, CVLAN, flow tag and tag
//! matching are EOPNOTSUPP (a soft NIC has no completion clock of its own). Every `read_*`
//! pointer is set; one whose field was not asked for returns 0.

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::channel::ChannelInner;
use crate::context::Ctx;
use crate::cq::{Cq, CqInner, CqRequest, create};
use crate::ffi::handles::Handle;
use crate::ffi::null_with;
use core::ffi::c_int;
use remem_verbs::{WcFlags, WorkCompletion};

/// `verbs_context::create_cq_ex` once the FFI layer has copied `a` and resolved its
/// context and channel (`ch`).
pub(crate) fn create_ex(
    ctx: Option<&Ctx>,
    a: &ibv_cq_init_attr_ex,
    ch: Option<&ChannelInner>,
) -> *mut ibv_cq_ex {
    let known = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
    if a.comp_mask & !known != 0 {
        return null_with(libc::EINVAL);
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null() {
        // No parent domains here (ibv_alloc_parent_domain is not supported).
        return null_with(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
        if a.flags & !(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) != 0
        {
            return null_with(libc::EINVAL);
        }
        if a.flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN != 0 {
            return null_with(libc::EOPNOTSUPP);
        }
    }
    if a.wc_flags & !IBV_CREATE_CQ_SUP_WC_FLAGS != 0 {
        return null_with(libc::EINVAL);
    }
    if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
        return null_with(libc::EOPNOTSUPP);
    }
    create(CqRequest {
        context: ctx,
        cqe: i64::from(a.cqe),
        cq_context: a.cq_context,
        channel: (a.channel, ch),
        comp_vector: i64::from(a.comp_vector),
        wc_flags: a.wc_flags,
    })
    .cast()
}

/// Takes the next completion into `current` and the `ibv_cq_ex`'s `status` and `wr_id`:
/// 0, ENOENT when the CQ is empty, or the error of an overrun CQ.
pub(crate) fn advance(h: Handle<'_, Cq>) -> c_int {
    let c = h.inner();
    let mut one = [WorkCompletion::default()];
    match c.cq.poll(&mut one) {
        Ok(0) => libc::ENOENT,
        Ok(_) => {
            *c.current.lock().unwrap_or_else(|e| e.into_inner()) = one[0];
            h.set_polled(one[0].status as ibv_wc_status, one[0].wr_id);
            0
        }
        Err(e) => e.errno(),
    }
}

/// `ibv_cq_ex::start_poll`: EINVAL for a `comp_mask` in `attr`.
pub(crate) fn start_poll(h: Handle<'_, Cq>, attr: Option<&ibv_poll_cq_attr>) -> c_int {
    if attr.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    let r = advance(h);
    if r == libc::ENOENT {
        // As an empty `ibv_poll_cq`: the soft NIC's thread gets the CPU.
        std::thread::yield_now();
    }
    r
}

/// Reads a field of the current completion, 0 if `flag` was not asked for at creation.
pub(crate) fn read<T: Default>(
    c: Option<&CqInner>,
    flag: u64,
    f: impl FnOnce(&WorkCompletion) -> T,
) -> T {
    let Some(c) = c else {
        return T::default();
    };
    if flag != 0 && c.wc_flags & flag == 0 {
        return T::default();
    }
    let w = *c.current.lock().unwrap_or_else(|e| e.into_inner());
    f(&w)
}

/// The immediate data of a completion in network order (`ibv_wc_read_imm_data`).
pub(crate) fn imm_data(w: &WorkCompletion) -> u32 {
    if w.wc_flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        w.imm_data
    }
}
