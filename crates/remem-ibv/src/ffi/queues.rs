//! The C entry points of the queue objects (completion channels, CQs, SRQs, QPs, posting,
//! address handles): each converts the program's
//! pointers once ([`super::handles`], [`super::opt_ref`], ...) and calls the safe object
//! module ([`crate::cq`], [`crate::srq`], [`crate::qp`], [`crate::post`], [`crate::ah`],
//! [`crate::channel`]).

use super::handles::{Handle, channel_from, cq_from, free, qp_from, qp_queues, srq_from};
use super::wr::{RecvWrRef, SendWrRef};
use super::{
    guard, guard_int, guard_neg, guard_ptr, null_with, opt_mut, opt_ref, out, out_slice, set_errno,
};
use crate::abi::*;
use crate::ah::{self, Ah};
use crate::channel::{self, Channel};
use crate::cq::{self, Cq, CqRequest};
use crate::cq_ex;
use crate::post;
use crate::post::Pending;
use crate::qp::{self, Qp, QpInner};
use crate::qp_ex;
use crate::srq::{self, Srq};
use core::ffi::{c_int, c_uint, c_void};
use remem_verbs::{SendOp, WorkCompletion};
use std::sync::Arc;

symver!(
    "ibv_qp_to_qp_ex" @ "IBVERBS_1.6",
    "ibv_create_comp_channel" @ "IBVERBS_1.0",
    "ibv_destroy_comp_channel" @ "IBVERBS_1.0",
    "ibv_get_cq_event" @ "IBVERBS_1.1",
    "ibv_create_ah" @ "IBVERBS_1.1",
    "ibv_destroy_ah" @ "IBVERBS_1.1",
    "ibv_init_ah_from_wc" @ "IBVERBS_1.1",
    "ibv_create_ah_from_wc" @ "IBVERBS_1.1",
    "ibv_create_srq" @ "IBVERBS_1.1",
    "ibv_destroy_srq" @ "IBVERBS_1.1",
    "ibv_modify_srq" @ "IBVERBS_1.1",
    "ibv_query_srq" @ "IBVERBS_1.1",
    "ibv_create_cq" @ "IBVERBS_1.1",
    "ibv_destroy_cq" @ "IBVERBS_1.1",
    "ibv_resize_cq" @ "IBVERBS_1.1",
    "ibv_ack_cq_events" @ "IBVERBS_1.1",
    "ibv_create_qp" @ "IBVERBS_1.1",
    "ibv_destroy_qp" @ "IBVERBS_1.1",
    "ibv_modify_qp" @ "IBVERBS_1.1",
    "ibv_query_qp" @ "IBVERBS_1.1",
    "ibv_query_qp_data_in_order" @ "IBVERBS_1.14",
    "ibv_query_ece" @ "IBVERBS_1.10",
    "ibv_set_ece" @ "IBVERBS_1.10",
    "ibv_attach_mcast" @ "IBVERBS_1.1",
    "ibv_detach_mcast" @ "IBVERBS_1.1",
);

// ----- completion channels (crate::channel) -----------------------------------------------

/// `ibv_create_comp_channel`.
///
/// # Safety
///
/// `context` is NULL or a context from `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard_ptr("ibv_create_comp_channel", || {
        // SAFETY: by the contract.
        channel::create(unsafe { crate::context::ctx_from(context) })
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses the channel.
///
/// # Safety
///
/// `channel` is NULL or a live channel from `ibv_create_comp_channel`, not used afterwards
/// on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_comp_channel(
    channel: *mut ibv_comp_channel,
) -> c_int {
    guard_int("ibv_destroy_comp_channel", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Channel>::from_abi(channel) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = channel::release(h.inner()) {
            return e;
        }
        // SAFETY: the program gives the channel up; no CQ refers to it (`release`).
        unsafe { free(h) };
        0
    })
}

/// `ibv_get_cq_event`: see `channel::get_cq_event`.
///
/// # Safety
///
/// `channel` is NULL or a live channel; `cq` and `cq_context` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard_neg("ibv_get_cq_event", || {
        // SAFETY: by the contract. Only clones of what the wait uses are kept, not the
        // reference: the channel may be destroyed while this thread waits.
        let ch = unsafe { channel_from(channel) }
            .map(|ch| (Arc::clone(&ch.ch), Arc::clone(&ch.ctx), ch.fd));
        // SAFETY: by the contract.
        match (ch, unsafe { out(cq) }, unsafe { out(cq_context) }) {
            (Some((events, ctx, fd)), Some(cq), Some(cq_context)) => {
                channel::get_cq_event(events, ctx, fd, cq, cq_context)
            }
            _ => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

// ----- CQs (crate::cq) ---------------------------------------------------------------------

/// `ibv_create_cq`.
///
/// # Safety
///
/// `context` is NULL or an open context; `channel` is NULL or one of its channels.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard_ptr("ibv_create_cq", || {
        // SAFETY: by the contract.
        let (ctx, ch) = unsafe {
            (
                crate::context::ctx_from(context),
                crate::ffi::handles::channel_from(channel),
            )
        };
        cq::create(CqRequest {
            context: ctx,
            cqe: i64::from(cqe),
            cq_context,
            channel: (channel, ch),
            comp_vector: i64::from(comp_vector),
            wc_flags: IBV_WC_STANDARD_FLAGS,
        })
    })
}

/// `ibv_destroy_cq`: EBUSY while a QP uses it; otherwise waits until every completion
/// event handed out for it was acked (`ibv_ack_cq_events`) and every async event about it
/// too, as rdma-core documents, then frees it.
///
/// # Safety
///
/// `cq` is NULL or a live CQ, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard_int("ibv_destroy_cq", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Cq>::from_abi(cq) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = cq::release(h.inner()) {
            return e;
        }
        // SAFETY: the program gives the CQ up; no QP uses it (`release`).
        unsafe { free(h) };
        0
    })
}

/// `ibv_resize_cq`: see `cq::resize`; EINVAL for a NULL CQ.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard_int("ibv_resize_cq", || {
        // SAFETY: by the contract.
        match unsafe { Handle::<Cq>::from_abi(cq) } {
            Some(h) => cq::resize(h, cqe),
            None => libc::EINVAL,
        }
    })
}

/// `ibv_ack_cq_events`.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard(
        "ibv_ack_cq_events",
        || (),
        || {
            // SAFETY: by the contract.
            if let Some(h) = unsafe { Handle::<Cq>::from_abi(cq) } {
                cq::ack_events(h, nevents);
            }
        },
    )
}

/// `ibv_context_ops::poll_cq` (verbs.h's inline `ibv_poll_cq`): the number of completions
/// written to `wc` (at most `num_entries`), or a negative errno: `-EINVAL` for bad
/// arguments, `-ENOMEM` once the CQ overran and its queued completions are all polled.
///
/// # Safety
///
/// `cq` is a live CQ; `wc` has room for `num_entries` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(
        "ibv_poll_cq",
        || -libc::EIO,
        || {
            let Ok(n) = usize::try_from(num_entries) else {
                return -libc::EINVAL;
            };
            // SAFETY: by the contract.
            match unsafe { (cq_from(cq), out_slice(wc, n)) } {
                (Some(c), Some(wc)) => cq::poll(c, wc),
                _ => -libc::EINVAL,
            }
        },
    )
}

/// `ibv_context_ops::req_notify_cq` (verbs.h's inline `ibv_req_notify_cq`). A CQ without
/// a channel accepts the request and reports nowhere, as rdma-core does.
///
/// # Safety
///
/// `cq` is a live CQ.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard_int("ibv_req_notify_cq", || {
        // SAFETY: by the contract.
        match unsafe { cq_from(cq) } {
            Some(c) => cq::req_notify(c, solicited_only),
            None => libc::EINVAL,
        }
    })
}

// ----- posting (crate::post) ----------------------------------------------------------------

/// `ibv_context_ops::post_send` (verbs.h's inline `ibv_post_send`): 0, or the errno of
/// the first work request not posted, which `bad_wr` names.
///
/// # Safety
///
/// `qp` is a live QP; `wr` is a valid list of work requests (as [`SendWrRef::new`]
/// says); `bad_wr` is NULL or writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard_int("ibv_post_send", || {
        // SAFETY: by the contract.
        let (q, bad) = unsafe { (qp_from(qp), out(bad_wr)) };
        // SAFETY: by the contract, for a QP of this type.
        let list = q.and_then(|q| unsafe { SendWrRef::new(wr, q.qp_type) });
        post::post_send(q, wr, list, bad)
    })
}

/// `ibv_context_ops::post_recv` (verbs.h's inline `ibv_post_recv`). A QP that takes its
/// receives from an SRQ refuses them (EINVAL).
///
/// # Safety
///
/// `qp` is a live QP; `wr` is a valid list (as [`RecvWrRef::new`] says); `bad_wr` is NULL
/// or writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int("ibv_post_recv", || {
        // SAFETY: by the contract.
        let (q, list, bad) = unsafe { (qp_from(qp), RecvWrRef::new(wr), out(bad_wr)) };
        post::post_recv_list(wr, list, bad, q.map(|q| q.cap.max_recv_sge), |r| {
            q.map_or(Ok(()), |q| q.qp.post_recv(std::slice::from_ref(r)))
        })
    })
}

/// `ibv_context_ops::post_srq_recv` (verbs.h's inline `ibv_post_srq_recv`).
///
/// # Safety
///
/// `srq` is a live SRQ; `wr` is a valid list (as [`RecvWrRef::new`] says); `bad_wr` is
/// NULL or writable.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int("ibv_post_srq_recv", || {
        // SAFETY: by the contract.
        let (s, list, bad) = unsafe { (srq_from(srq), RecvWrRef::new(wr), out(bad_wr)) };
        post::post_recv_list(wr, list, bad, s.map(|s| s.max_sge), |r| {
            s.map_or(Ok(()), |s| s.srq.post_recv(std::slice::from_ref(r)))
        })
    })
}

// ----- extended CQs (crate::cq_ex) --------------------------------------------------------

/// The `ibv_cq_ex` of a new CQ: the `ibv_cq` fields and every extended function
/// ([`crate::cq_ex`]).
pub(crate) fn cq_ex_abi(
    context: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
) -> ibv_cq_ex {
    ibv_cq_ex {
        context,
        channel,
        cq_context,
        handle,
        cqe,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: IBV_WC_SUCCESS,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: Some(read_zero_u64),
        read_cvlan: Some(read_cvlan),
        read_flow_tag: Some(read_flow_tag),
        read_tm_info: Some(read_tm_info),
        read_completion_wallclock_ns: Some(read_zero_u64),
    }
}

/// `verbs_context::create_cq_ex` (verbs.h's inline `ibv_create_cq_ex`): see
/// `cq_ex::create_ex`.
///
/// # Safety
///
/// `context` is an open context; `attr` is NULL or readable, its channel NULL or live.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard_ptr("ibv_create_cq_ex", || {
        // SAFETY: by the contract, NULL or readable; copied out.
        let Some(a) = (unsafe { opt_ref(attr) }).copied() else {
            return null_with(libc::EINVAL);
        };
        // SAFETY: by the contract: the program's context and channel (NULL or live).
        let (ctx, ch) = unsafe { (crate::context::ctx_from(context), channel_from(a.channel)) };
        cq_ex::create_ex(ctx, &a, ch)
    })
}

/// The CQ behind an `ibv_cq_ex` pointer.
///
/// # Safety
///
/// `cq` is NULL or a live CQ made by this library (its `ibv_cq_ex` is its `ibv_cq`).
unsafe fn cq_ex<'a>(cq: *mut ibv_cq_ex) -> Option<Handle<'a, Cq>> {
    // SAFETY: by the contract.
    unsafe { Handle::from_abi(cq.cast()) }
}

/// `ibv_cq_ex::start_poll`.
unsafe extern "C" fn start_poll(p: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(
        "ibv_start_poll",
        || libc::EIO,
        || {
            // SAFETY: the program passes the CQ it polls, and NULL or a readable `attr`.
            match unsafe { (cq_ex(p), opt_ref(attr)) } {
                (Some(h), a) => cq_ex::start_poll(h, a),
                (None, _) => libc::EINVAL,
            }
        },
    )
}

/// `ibv_cq_ex::next_poll`.
unsafe extern "C" fn next_poll(p: *mut ibv_cq_ex) -> c_int {
    guard(
        "ibv_next_poll",
        || libc::EIO,
        || {
            // SAFETY: the program passes the CQ it polls.
            match unsafe { cq_ex(p) } {
                Some(h) => cq_ex::advance(h),
                None => libc::EINVAL,
            }
        },
    )
}

/// `ibv_cq_ex::end_poll`: nothing is held between the calls.
unsafe extern "C" fn end_poll(_p: *mut ibv_cq_ex) {}

/// [`cq_ex::read`] on the program's CQ.
///
/// # Safety
///
/// `p` is NULL or a live CQ of this library.
unsafe fn read<T: Default>(
    p: *mut ibv_cq_ex,
    flag: u64,
    f: impl FnOnce(&WorkCompletion) -> T,
) -> T {
    // SAFETY: by the contract.
    cq_ex::read(unsafe { cq_ex(p) }.map(Handle::inner), flag, f)
}

// The `ibv_wc_read_*` functions: the program passes the CQ it polls.
unsafe extern "C" fn read_opcode(p: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, 0, |w| w.opcode as ibv_wc_opcode) }
}
unsafe extern "C" fn read_vendor_err(p: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, 0, |w| w.vendor_err) }
}
unsafe extern "C" fn read_byte_len(p: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_BYTE_LEN, |w| w.byte_len) }
}
/// Immediate data in network order.
unsafe extern "C" fn read_imm_data(p: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_IMM, cq_ex::imm_data) }
}
unsafe extern "C" fn read_qp_num(p: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_QP_NUM, |w| w.qp_num) }
}
unsafe extern "C" fn read_src_qp(p: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_SRC_QP, |w| w.src_qp) }
}
unsafe extern "C" fn read_wc_flags(p: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, 0, |w| w.wc_flags.bits()) }
}
unsafe extern "C" fn read_slid(p: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_SLID, |w| u32::from(w.slid)) }
}
unsafe extern "C" fn read_sl(p: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_SL, |w| w.sl) }
}
unsafe extern "C" fn read_dlid_path_bits(p: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the program passes the CQ it polls.
    unsafe { read(p, IBV_WC_EX_WITH_DLID_PATH_BITS, |w| w.dlid_path_bits) }
}
/// Timestamps cannot be asked for (creation refuses them): 0.
unsafe extern "C" fn read_zero_u64(_p: *mut ibv_cq_ex) -> u64 {
    0
}
unsafe extern "C" fn read_cvlan(_p: *mut ibv_cq_ex) -> u16 {
    0
}
unsafe extern "C" fn read_flow_tag(_p: *mut ibv_cq_ex) -> u32 {
    0
}
/// Tag matching cannot be asked for: the info is zeroed.
unsafe extern "C" fn read_tm_info(_p: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    // SAFETY: NULL or writable by the caller's contract.
    if let Some(i) = unsafe { opt_mut(info) } {
        *i = ibv_wc_tm_info { tag: 0, r#priv: 0 };
    }
}

// ----- SRQs (crate::srq) -------------------------------------------------------------------

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
    guard_ptr("ibv_create_srq", || {
        // SAFETY: by the contract.
        match unsafe { (crate::context::pd_from(pd), opt_mut(attr)) } {
            (Some(p), Some(a)) => srq::create(&p.inner, a),
            _ => null_with(libc::EINVAL),
        }
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
        let Some(h) = (unsafe { Handle::<Srq>::from_abi(srq) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = srq::release(h.inner()) {
            return e;
        }
        // SAFETY: the program gives the SRQ up; no QP uses it (`release`).
        unsafe { free(h) };
        0
    })
}

/// `ibv_modify_srq`: see `srq::modify`.
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
        match unsafe { (srq_from(srq), opt_ref(attr)) } {
            (Some(s), Some(a)) => srq::modify(s, a, attr_mask),
            _ => libc::EINVAL,
        }
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
        match unsafe { (srq_from(srq), out(attr)) } {
            (Some(s), Some(a)) => srq::query(s, a),
            _ => libc::EINVAL,
        }
    })
}

/// `verbs_context::create_srq_ex` (verbs.h's inline `ibv_create_srq_ex` calls it for what
/// `ibv_create_srq` cannot express): see `srq::create_ex`.
///
/// # Safety
///
/// `context` is an open context; `attr` is NULL or readable and writable, its `pd` NULL or
/// a live PD.
pub unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq_ex", || {
        // SAFETY: by the contract.
        let Some(a) = (unsafe { opt_mut(attr) }) else {
            return null_with(libc::EINVAL);
        };
        // SAFETY: by the contract, `a.pd` is NULL or the program's PD.
        let pd = unsafe { crate::context::pd_from(a.pd) }.map(|p| &p.inner);
        srq::create_ex(context, a, pd)
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
        match unsafe { (srq_from(srq), out(srq_num)) } {
            (Some(s), Some(n)) => {
                n.write(s.srq.srq_num());
                0
            }
            _ => libc::EINVAL,
        }
    })
}

// ----- address handles (crate::ah) ---------------------------------------------------------

/// `ibv_create_ah`.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `attr` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_ah(
    pd: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    guard_ptr("ibv_create_ah", || {
        // SAFETY: by the contract.
        match unsafe { (crate::context::pd_from(pd), opt_ref(attr)) } {
            (Some(p), Some(a)) => ah::create(&p.inner, a),
            _ => null_with(libc::EINVAL),
        }
    })
}

/// `ibv_destroy_ah`.
///
/// # Safety
///
/// `ah` is NULL or a live address handle, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard_int("ibv_destroy_ah", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Ah>::from_abi(ah) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the program gives the handle up. Work requests already posted hold
        // their own reference to remem's handle.
        unsafe { free(h) };
        0
    })
}

/// The 40-byte GRH area of a UD receive, when the completion says it has one.
///
/// # Safety
///
/// `grh` is NULL or points to the 40 bytes in front of the received payload when `wc`
/// has `IBV_WC_GRH`.
unsafe fn grh_area(wc: Option<&ibv_wc>, grh: *mut ibv_grh) -> Option<[u8; 40]> {
    if grh.is_null() || wc.is_none_or(|w| w.wc_flags & IBV_WC_GRH == 0) {
        return None;
    }
    // SAFETY: by the contract (any alignment: the area lies in a receive buffer).
    Some(unsafe { grh.cast::<[u8; 40]>().read_unaligned() })
}

/// `ibv_init_ah_from_wc`: the address vector that answers the datagram `wc` received
/// (its GRH area at `grh`), see `ah::init_attr`. 0, or -1 with errno.
///
/// # Safety
///
/// `context` is an open context; `wc` and `ah_attr` are valid; `grh` points to the 40
/// bytes in front of the received payload when `wc` has `IBV_WC_GRH`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard_neg("ibv_init_ah_from_wc", || {
        // SAFETY: by the contract.
        let (ctx, w, out) =
            unsafe { (crate::context::ctx_from(context), opt_ref(wc), out(ah_attr)) };
        let (Some(ctx), Some(w), Some(out)) = (ctx, w, out) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        // SAFETY: by the contract.
        let area = unsafe { grh_area(Some(w), grh) };
        let (a, r) = ah::init_attr(ctx.shared(), port_num, w, area.as_ref());
        out.write(a);
        match r {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `ibv_create_ah_from_wc`: `ibv_init_ah_from_wc` then `ibv_create_ah`.
///
/// # Safety
///
/// As [`remem_ibv_ibv_init_ah_from_wc`], with `pd` a live PD.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard_ptr("ibv_create_ah_from_wc", || {
        // SAFETY: by the contract.
        let (p, w) = unsafe { (crate::context::pd_from(pd), opt_ref(wc)) };
        // SAFETY: by the contract.
        let area = unsafe { grh_area(w, grh) };
        ah::create_from_wc(p.map(|p| &p.inner), w, area.as_ref(), port_num)
    })
}

// ----- extended QPs, the ibv_wr_* API (crate::qp_ex) ---------------------------------------

/// The `ibv_qp_ex` of a new QP: `base` and every `ibv_wr_*` function ([`crate::qp_ex`]).
pub(crate) fn qp_ex_abi(base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}

/// `verbs_context::create_qp_ex` (verbs.h's inline `ibv_create_qp_ex`): see
/// `qp_ex::create_ex`.
///
/// # Safety
///
/// `context` is an open context; `attr` is NULL or readable and writable, its PD (with
/// `IBV_QP_INIT_ATTR_PD`), CQs and SRQ NULL or live objects of this library.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp_ex", || {
        // SAFETY: by the contract.
        let Some(a) = (unsafe { opt_mut(attr) }) else {
            return null_with(libc::EINVAL);
        };
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            // SAFETY: with IBV_QP_INIT_ATTR_PD, `a.pd` is NULL or the program's PD.
            unsafe { crate::context::pd_from(a.pd) }.map(|p| &p.inner)
        } else {
            None
        };
        let basic = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: the program's CQs and SRQ: NULL or this library's.
        let queues = unsafe { qp_queues(&basic) };
        qp_ex::create_ex(context, a, pd, queues)
    })
}

/// `ibv_qp_to_qp_ex`: see `qp_ex::to_qp_ex`; NULL (errno EINVAL) for NULL.
///
/// # Safety
///
/// `qp` is NULL or a live QP.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard_ptr("ibv_qp_to_qp_ex", || {
        // SAFETY: by the contract.
        match unsafe { Handle::<Qp>::from_abi(qp) } {
            Some(h) => qp_ex::to_qp_ex(h),
            None => null_with(libc::EINVAL),
        }
    })
}

/// The QP of an `ibv_qp_ex` pointer.
///
/// # Safety
///
/// `qpx` is NULL or a live QP of this library (its `ibv_qp_ex` is its `ibv_qp`).
unsafe fn qp_ex_handle<'a>(qpx: *mut ibv_qp_ex) -> Option<Handle<'a, Qp>> {
    // SAFETY: by the contract.
    unsafe { Handle::from_abi(qpx.cast()) }
}

/// A builder: starts a work request of `op` on the program's QP (a panic records
/// nothing and returns).
///
/// # Safety
///
/// `qpx` is NULL or a live QP of this library.
unsafe fn build(qpx: *mut ibv_qp_ex, name: &str, op: Result<SendOp, c_int>) {
    // SAFETY: by the contract.
    let h = unsafe { qp_ex_handle(qpx) };
    guard(name, || (), || qp_ex::build(h, op));
}

/// A setter: runs `f` on the program's QP's batch (see [`qp_ex::with_batch`]).
///
/// # Safety
///
/// `qpx` is NULL or a live QP of this library.
unsafe fn with_batch(
    qpx: *mut ibv_qp_ex,
    name: &str,
    f: impl FnOnce(&QpInner, &mut Pending) -> Result<(), c_int>,
) {
    // SAFETY: by the contract.
    let h = unsafe { qp_ex_handle(qpx) };
    guard(name, || (), || qp_ex::with_batch(h.map(Handle::inner), f));
}

/// The program's bytes at `addr` (`len` of them; `None`: a NULL address with bytes).
///
/// # Safety
///
/// `addr` is NULL or readable for `len` bytes during the call (what verbs requires of
/// inline data).
unsafe fn bytes<'a>(addr: *const c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: by the contract.
    unsafe { super::slice(addr.cast::<u8>(), len) }
}

// The `ibv_wr_*` functions of every QP's `ibv_qp_ex`: the program passes one of this
// library's QPs, and pointers valid as verbs.h documents.

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::AtomicCmpAndSwp {
        remote_addr,
        rkey,
        compare,
        swap,
    };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_atomic_cmp_swp", Ok(op)) };
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr,
        rkey,
        add,
    };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_atomic_fetch_add", Ok(op)) };
}

/// `ibv_wr_bind_mw`: binds `mw` with `info`, giving it `rkey` (see [`crate::mw`]); a NULL
/// `info` records EINVAL.
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: the program's bind information: NULL or readable.
    let op = match unsafe { opt_ref(info) } {
        // SAFETY: the program's window and region (NULL or live).
        Some(i) => unsafe { super::wr::bind_op(mw, rkey, i) },
        None => Err(libc::EINVAL),
    };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_bind_mw", op) };
}

/// `ibv_wr_local_inv`: invalidates the type 2 window of `rkey`, in send-queue order.
unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_local_inv", Ok(SendOp::LocalInv { rkey })) };
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let op = SendOp::RdmaRead { remote_addr, rkey };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_rdma_read", Ok(op)) };
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let op = SendOp::RdmaWrite { remote_addr, rkey };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_rdma_write", Ok(op)) };
}

/// `imm` is big-endian, as verbs passes it.
unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    let op = SendOp::RdmaWriteWithImm {
        remote_addr,
        rkey,
        imm: u32::from_be(imm),
    };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_rdma_write_imm", Ok(op)) };
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_send", Ok(SendOp::Send)) };
}

/// `imm` is big-endian, as verbs passes it.
unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    let op = SendOp::SendWithImm {
        imm: u32::from_be(imm),
    };
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_send_imm", Ok(op)) };
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_send_inv", Ok(SendOp::SendWithInv { rkey })) };
}

unsafe extern "C" fn wr_send_tso(qpx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_send_tso", Err(libc::EOPNOTSUPP)) };
}

/// `ibv_wr_atomic_write`: the 8 bytes at `wr` are copied now (EINVAL for NULL), see
/// [`qp_ex::atomic_write`].
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    wr: *const c_void,
) {
    // SAFETY: the program's QP; its 8-byte value, readable during this call (verbs.h).
    let (h, value) = unsafe { (qp_ex_handle(qpx), opt_ref(wr.cast::<[u8; 8]>()).copied()) };
    guard(
        "ibv_wr_atomic_write",
        || (),
        || qp_ex::atomic_write(h, rkey, remote_addr, value),
    );
}

/// `ibv_wr_flush` (`ibv_qp_ex::wr_flush` of rdma-core 45+): see [`qp_ex::flush_op`].
///
/// # Safety
///
/// `qpx` is one of this library's QPs.
pub(crate) unsafe extern "C" fn wr_flush(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    ty: u8,
    level: u8,
) {
    let op = qp_ex::flush_op(rkey, remote_addr, len, ty, level);
    // SAFETY: the program's QP.
    unsafe { build(qpx, "ibv_wr_flush", op) };
}

unsafe extern "C" fn wr_set_ud_addr(qpx: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: the program's address handle: NULL or one of this library's.
    let dest = unsafe { super::wr::ud_dest(ah, qpn, qkey) };
    // SAFETY: the program's QP.
    unsafe {
        with_batch(qpx, "ibv_wr_set_ud_addr", |q, p| {
            qp_ex::set_ud_addr(q, p, dest)
        })
    };
}

unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, _srqn: u32) {
    // SAFETY: the program's QP.
    unsafe { with_batch(qpx, "ibv_wr_set_xrc_srqn", |_, _| Err(libc::EOPNOTSUPP)) };
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = [ibv_sge { addr, length, lkey }];
    // SAFETY: the program's QP.
    unsafe {
        with_batch(qpx, "ibv_wr_set_sge", |q, p| {
            qp_ex::set_sges(q, p, Some(&sge))
        })
    };
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, list: *const ibv_sge) {
    // SAFETY: the program's array of `num_sge` entries.
    let l = unsafe { super::slice(list, num_sge) };
    // SAFETY: the program's QP.
    unsafe { with_batch(qpx, "ibv_wr_set_sge_list", |q, p| qp_ex::set_sges(q, p, l)) };
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: the program's buffer, readable for its length during this call.
    let b = unsafe { bytes(addr, length) };
    // SAFETY: the program's QP.
    unsafe {
        with_batch(qpx, "ibv_wr_set_inline_data", |q, p| {
            qp_ex::set_inline(q, p, std::iter::once((length, b)))
        })
    };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: the program's QP, and its array of `num_buf` entries.
    let (h, l) = unsafe { (qp_ex_handle(qpx), super::slice(list, num_buf)) };
    let set = |q: &QpInner, p: &mut Pending| {
        let l = l.ok_or(libc::EINVAL)?;
        // SAFETY: each buffer is readable for its length during this call (what verbs
        // requires of inline data).
        let bufs = l
            .iter()
            .map(|b| (b.length, unsafe { bytes(b.addr, b.length) }));
        qp_ex::set_inline(q, p, bufs)
    };
    guard(
        "ibv_wr_set_inline_data_list",
        || (),
        || qp_ex::with_batch(h.map(Handle::inner), set),
    );
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: the program's QP.
    let h = unsafe { qp_ex_handle(qpx) };
    guard(
        "ibv_wr_start",
        || (),
        || h.map_or((), |h| qp_ex::start(h.inner())),
    );
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the program's QP.
    let h = unsafe { qp_ex_handle(qpx) };
    guard(
        "ibv_wr_complete",
        || libc::EIO,
        || h.map_or(libc::EINVAL, |h| qp_ex::complete(h.inner())),
    )
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: the program's QP.
    let h = unsafe { qp_ex_handle(qpx) };
    guard(
        "ibv_wr_abort",
        || (),
        || h.map_or((), |h| qp_ex::abort(h.inner())),
    );
}

// ----- QPs (crate::qp) ---------------------------------------------------------------------

/// `ibv_create_qp`: RC, UC and UD QPs (UC as far as remem's provider has them); writes the
/// granted queue sizes back into `attr.cap`.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `attr` is NULL or readable and writable, its CQs and SRQ NULL
/// or live objects of this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp", || {
        // SAFETY: by the contract.
        let Some(init) = (unsafe { opt_mut(attr) }) else {
            return null_with(libc::EINVAL);
        };
        // SAFETY: by the contract.
        let (pd, queues) = unsafe { (crate::context::pd_from(pd), qp_queues(init)) };
        match qp::create(pd.map(|p| &p.inner), init, queues, false) {
            Ok(q) => q,
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_destroy_qp`: waits until the program has acked every async event about the QP,
/// then destroys it (remem finishes sending what the QP owes on the wire).
///
/// # Safety
///
/// `qp` is NULL or a live QP, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard_int("ibv_destroy_qp", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<Qp>::from_abi(qp) }) else {
            return libc::EINVAL;
        };
        qp::release(h.inner());
        // SAFETY: the program gives the QP up; the library holds no handle to it.
        unsafe { free(h) };
        0
    })
}

/// `ibv_modify_qp`: 0 or the errno (EINVAL for a transition or attribute remem refuses).
///
/// # Safety
///
/// `qp` is NULL or a live QP; `attr` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard_int("ibv_modify_qp", || {
        // SAFETY: by the contract.
        match unsafe { (Handle::<Qp>::from_abi(qp), opt_ref(attr)) } {
            (Some(q), Some(a)) => qp::modify(q, a, attr_mask),
            _ => libc::EINVAL,
        }
    })
}

/// `ibv_query_qp`: every attribute (whatever `attr_mask` names), and the creation
/// attributes.
///
/// # Safety
///
/// `qp` is NULL or a live QP; `attr` and `init_attr` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let _ = attr_mask;
    guard_int("ibv_query_qp", || {
        // SAFETY: by the contract.
        match unsafe { (Handle::<Qp>::from_abi(qp), out(attr), out(init_attr)) } {
            (Some(q), Some(a), Some(i)) => qp::query(q, a, i),
            _ => libc::EINVAL,
        }
    })
}

/// `ibv_query_qp_data_in_order`: 0 = no in-order guarantee is promised.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_qp_data_in_order(
    qp: *mut ibv_qp,
    op: ibv_wr_opcode,
    flags: u32,
) -> c_int {
    let _ = (qp, op, flags);
    0
}

/// `ibv_query_ece`: no enhanced connection establishment (EOPNOTSUPP).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    let _ = (qp, ece);
    libc::EOPNOTSUPP
}

/// `ibv_set_ece`: EOPNOTSUPP.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    let _ = (qp, ece);
    libc::EOPNOTSUPP
}

/// `ibv_attach_mcast`: attaches a UD QP to the multicast group `gid` (`lid` is ignored on
/// RoCE); 0, or EINVAL (not a UD QP, not a multicast GID), ENOMEM (beyond the device's
/// `max_mcast_*` limits, rxe's), EOPNOTSUPP (an IPv6 group).
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    guard_int("ibv_attach_mcast", || {
        // SAFETY: by the contract.
        match unsafe { (super::handles::qp_from(qp), opt_ref(gid)) } {
            (Some(q), Some(g)) => qp::attach_mcast(q, g, lid),
            _ => libc::EINVAL,
        }
    })
}

/// `ibv_detach_mcast`: detaches the QP from the group; EINVAL if it is not attached.
///
/// # Safety
///
/// The pointers are NULL or valid objects of this library, as verbs.h documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    guard_int("ibv_detach_mcast", || {
        // SAFETY: by the contract.
        match unsafe { (super::handles::qp_from(qp), opt_ref(gid)) } {
            (Some(q), Some(g)) => qp::detach_mcast(q, g, lid),
            _ => libc::EINVAL,
        }
    })
}
