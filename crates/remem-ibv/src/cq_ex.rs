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

#![allow(unsafe_code)]

use crate::abi::*;
use crate::cq::{CqInner, CqRequest, create};
use crate::ffi::handles::cq_from;
use crate::ffi::{guard, guard_ptr, null_with};
use core::ffi::{c_int, c_uint, c_void};
use remem_verbs::{WcFlags, WorkCompletion};

symver!();

/// The `ibv_cq_ex` of a new CQ: the `ibv_cq` fields and every extended function.
pub(crate) fn abi(
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

/// `verbs_context::create_cq_ex` (verbs.h's inline `ibv_create_cq_ex`).
///
/// # Safety
///
/// `context` is an open context; `attr` is NULL or readable.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard_ptr("ibv_create_cq_ex", || {
        // SAFETY: by the contract, NULL or readable; copied out.
        let Some(a) = (unsafe { attr.as_ref() }).copied() else {
            return null_with(libc::EINVAL);
        };
        let known = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
        if a.comp_mask & !known != 0 {
            return null_with(libc::EINVAL);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null() {
            // No parent domains here (ibv_alloc_parent_domain is not supported).
            return null_with(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            if a.flags & !(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)
                != 0
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
        // SAFETY: by the contract: the program's context and channel (NULL or live).
        let (ctx, ch) = unsafe {
            (
                crate::context::ctx_from(context),
                crate::ffi::handles::channel_from(a.channel),
            )
        };
        create(CqRequest {
            context: ctx,
            cqe: i64::from(a.cqe),
            cq_context: a.cq_context,
            channel: (a.channel, ch),
            comp_vector: i64::from(a.comp_vector),
            wc_flags: a.wc_flags,
        })
        .cast()
    })
}

/// The CQ of an `ibv_cq_ex` pointer.
///
/// # Safety
///
/// `cq` is NULL or a live CQ made by this library.
unsafe fn cq<'a>(cq: *mut ibv_cq_ex) -> Option<&'a CqInner> {
    // SAFETY: by the contract (an `ibv_cq_ex` of this library is its `ibv_cq`).
    unsafe { cq_from(cq.cast()) }
}

/// Takes the next completion into `current` and the `ibv_cq_ex`'s `status` and `wr_id`:
/// 0, ENOENT when the CQ is empty, or the error of an overrun CQ.
fn advance(p: *mut ibv_cq_ex, c: &CqInner) -> c_int {
    let mut one = [WorkCompletion::default()];
    match c.cq.poll(&mut one) {
        Ok(0) => libc::ENOENT,
        Ok(_) => {
            *c.current.lock().unwrap_or_else(|e| e.into_inner()) = one[0];
            // SAFETY: `p` is the live CQ; the two public fields are written in place (no
            // reference is made), by the one thread between start_poll and end_poll.
            unsafe {
                (&raw mut (*p).status).write(one[0].status as ibv_wc_status);
                (&raw mut (*p).wr_id).write(one[0].wr_id);
            }
            0
        }
        Err(e) => e.errno(),
    }
}

/// `ibv_cq_ex::start_poll`.
unsafe extern "C" fn start_poll(p: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(
        "ibv_start_poll",
        || libc::EIO,
        || {
            // SAFETY: the program passes the CQ it polls.
            let Some(c) = (unsafe { cq(p) }) else {
                return libc::EINVAL;
            };
            // SAFETY: NULL or readable.
            if let Some(a) = unsafe { attr.as_ref() }
                && a.comp_mask != 0
            {
                return libc::EINVAL;
            }
            let r = advance(p, c);
            if r == libc::ENOENT {
                // As an empty `ibv_poll_cq`: the soft NIC's thread gets the CPU.
                std::thread::yield_now();
            }
            r
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
            let Some(c) = (unsafe { cq(p) }) else {
                return libc::EINVAL;
            };
            advance(p, c)
        },
    )
}

/// `ibv_cq_ex::end_poll`: nothing is held between the calls.
unsafe extern "C" fn end_poll(_p: *mut ibv_cq_ex) {}

/// Reads a field of the current completion, 0 if `flag` was not asked for at creation.
fn read<T: Default>(p: *mut ibv_cq_ex, flag: u64, f: impl FnOnce(&WorkCompletion) -> T) -> T {
    // SAFETY: the program passes the CQ it polls.
    let Some(c) = (unsafe { cq(p) }) else {
        return T::default();
    };
    if flag != 0 && c.wc_flags & flag == 0 {
        return T::default();
    }
    let w = *c.current.lock().unwrap_or_else(|e| e.into_inner());
    f(&w)
}

unsafe extern "C" fn read_opcode(p: *mut ibv_cq_ex) -> ibv_wc_opcode {
    read(p, 0, |w| w.opcode as ibv_wc_opcode)
}
unsafe extern "C" fn read_vendor_err(p: *mut ibv_cq_ex) -> u32 {
    read(p, 0, |w| w.vendor_err)
}
unsafe extern "C" fn read_byte_len(p: *mut ibv_cq_ex) -> u32 {
    read(p, IBV_WC_EX_WITH_BYTE_LEN, |w| w.byte_len)
}
/// Immediate data in network order.
unsafe extern "C" fn read_imm_data(p: *mut ibv_cq_ex) -> u32 {
    read(p, IBV_WC_EX_WITH_IMM, |w| {
        if w.wc_flags.contains(WcFlags::WITH_IMM) {
            w.imm_data.to_be()
        } else {
            w.imm_data
        }
    })
}
unsafe extern "C" fn read_qp_num(p: *mut ibv_cq_ex) -> u32 {
    read(p, IBV_WC_EX_WITH_QP_NUM, |w| w.qp_num)
}
unsafe extern "C" fn read_src_qp(p: *mut ibv_cq_ex) -> u32 {
    read(p, IBV_WC_EX_WITH_SRC_QP, |w| w.src_qp)
}
unsafe extern "C" fn read_wc_flags(p: *mut ibv_cq_ex) -> c_uint {
    read(p, 0, |w| w.wc_flags.bits())
}
unsafe extern "C" fn read_slid(p: *mut ibv_cq_ex) -> u32 {
    read(p, IBV_WC_EX_WITH_SLID, |w| u32::from(w.slid))
}
unsafe extern "C" fn read_sl(p: *mut ibv_cq_ex) -> u8 {
    read(p, IBV_WC_EX_WITH_SL, |w| w.sl)
}
unsafe extern "C" fn read_dlid_path_bits(p: *mut ibv_cq_ex) -> u8 {
    read(p, IBV_WC_EX_WITH_DLID_PATH_BITS, |w| w.dlid_path_bits)
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
    if let Some(i) = unsafe { info.as_mut() } {
        *i = ibv_wc_tm_info { tag: 0, r#priv: 0 };
    }
}
