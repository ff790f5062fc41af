//! Completion queues: `ibv_create_cq`, `ibv_destroy_cq`, `ibv_resize_cq`,
//! `ibv_ack_cq_events`, and the `ibv_context_ops` entries verbs.h's inline `ibv_poll_cq`
//! and `ibv_req_notify_cq` call.
//!
//! Every CQ is a [`Cq`] whose ABI struct is an `ibv_cq_ex` (an `ibv_cq` is its prefix), so
//! a CQ from `ibv_create_cq_ex` is also a plain CQ (`ibv_cq_ex_to_cq` is a cast) and
//! `ibv_poll_cq` works on both.
//!
//! **Sizes** are rxe's: a CQ asked for `cqe` entries (1..=`max_cqe`) gets the next
//! `2^k - 1` (rxe's queues are power-of-two rings with one slot kept free), which
//! `ibv_cq.cqe` reports; `max_cqe` is rxe's 32767, so the largest request is exactly
//! granted. `ibv_resize_cq` rounds the same way, grows or shrinks the remem CQ keeping its
//! completions in order, and is EINVAL below the completions it holds (rxe's
//! `rxe_cq_chk_attr`).
//!
//! `ibv_poll_cq` moves completions from remem's CQ through a fixed array on the stack and
//! converts each into `struct ibv_wc` in place: no allocation, one lock of the remem CQ per
//! 16 completions; an empty poll yields the CPU (the soft NIC is a thread of the program).

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::channel::ChannelInner;
use crate::context::{Ctx, CtxShared};
use crate::ffi::handles::{Handle, into_abi};
use crate::ffi::{null_with, set_errno};
use core::ffi::{c_int, c_uint, c_void};
use core::mem::MaybeUninit;
use remem_verbs::{CompletionQueue, WcFlags, WorkCompletion};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Completions moved per lock of the remem CQ in `ibv_poll_cq`.
const POLL_BATCH: usize = 16;

/// A completion queue: what `ibv_create_cq` (as `ibv_cq`) and `ibv_create_cq_ex` (as
/// `ibv_cq_ex`) return a pointer to (`abi` first). The program may write its ABI struct
/// (`cq_context`); the library touches that only through raw pointers and keeps its own
/// state in [`CqInner`].
#[repr(C)]
pub struct Cq {
    /// The `ibv_cq_ex` programs see (its prefix is the `ibv_cq`).
    pub abi: ibv_cq_ex,
    /// The library's side.
    pub inner: CqInner,
}

/// The library's side of a CQ.
pub struct CqInner {
    /// remem's CQ.
    pub cq: Arc<dyn CompletionQueue>,
    /// Its context.
    pub ctx: Arc<CtxShared>,
    /// The channel it reports to (NULL: none).
    pub(crate) channel: *mut ibv_comp_channel,
    /// QP queues (send and receive, counted apiece) using the CQ: destroy is EBUSY while
    /// any is.
    pub(crate) users: AtomicU32,
    /// Completion events handed out by `ibv_get_cq_event` and acked.
    pub(crate) events: Mutex<Events>,
    pub(crate) acked: Condvar,
    /// The completion the extended poll API (`ibv_start_poll` …) stands on.
    pub(crate) current: Mutex<WorkCompletion>,
    /// The `wc_flags` asked of `ibv_create_cq_ex` (what `ibv_wc_read_*` may read).
    pub(crate) wc_flags: u64,
}

/// Completion events handed out and acked.
#[derive(Debug, Default)]
pub(crate) struct Events {
    out: u64,
    acked: u64,
}

impl std::fmt::Debug for CqInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqInner")
            .field("id", &self.cq.id())
            .field("cqe", &self.cq.cqe())
            .finish_non_exhaustive()
    }
}

impl CqInner {
    /// Notes a completion event handed out by `ibv_get_cq_event` (acked later).
    pub(crate) fn event_out(&self) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).out += 1;
    }
}

/// What creating a CQ needs, from `ibv_create_cq` or `ibv_create_cq_ex` (the FFI layer
/// resolves the program's context and channel).
pub(crate) struct CqRequest<'a> {
    pub context: Option<&'a Ctx>,
    pub cqe: i64,
    pub cq_context: *mut c_void,
    /// The channel (NULL: none) and what it is.
    pub channel: (*mut ibv_comp_channel, Option<&'a ChannelInner>),
    pub comp_vector: i64,
    pub wc_flags: u64,
}

/// The size rxe gives a queue asked for `cqe` entries: the next `2^k - 1` (`rxe_queue_init`
/// rounds `cqe + 1` slots up to a power of two and keeps one free), within `max` (the
/// device's `max_cqe`, itself `2^15 - 1`).
pub(crate) fn rxe_cqe(cqe: u32, max: u32) -> u32 {
    let slots = u64::from(cqe) + 1;
    let rounded = slots.next_power_of_two() - 1;
    u32::try_from(rounded).unwrap_or(u32::MAX).min(max.max(cqe))
}

/// Creates a CQ object; the pointer the program holds, or NULL with errno.
pub(crate) fn create(req: CqRequest<'_>) -> *mut ibv_cq {
    let Some(ctx) = req.context else {
        return null_with(libc::EINVAL);
    };
    let num_vectors = i64::from(ctx.vctx.context.num_comp_vectors);
    if req.cqe <= 0 || req.cqe > i64::from(u32::MAX) {
        return null_with(libc::EINVAL);
    }
    if req.comp_vector < 0 || req.comp_vector >= num_vectors {
        return null_with(libc::EINVAL);
    }
    let (channel_ptr, channel) = req.channel;
    if let Some(ch) = channel
        && !Arc::ptr_eq(&ch.ctx, ctx.shared())
    {
        return null_with(libc::EINVAL);
    }
    let shared = ctx.shared();
    let max = shared.dev.query_device().map_or(u32::MAX, |a| a.max_cqe);
    let want = req.cqe as u32;
    // Above max_cqe stays so (the device refuses it); below, rxe's rounding.
    let depth = if want > max { want } else { rxe_cqe(want, max) };
    let cq = match shared
        .dev
        .create_cq(depth, channel.map(|c| Arc::clone(&c.ch)))
    {
        Ok(c) => c,
        Err(e) => return null_with(e.errno()),
    };
    let id = cq.id();
    let cqe = c_int::try_from(cq.cqe()).unwrap_or(c_int::MAX);
    let raw = into_abi(Cq {
        abi: crate::ffi::queues::cq_ex_abi(
            shared.ibv_context(),
            channel_ptr,
            req.cq_context,
            id.0,
            cqe,
        ),
        inner: CqInner {
            cq,
            ctx: Arc::clone(shared),
            channel: channel_ptr,
            users: AtomicU32::new(0),
            events: Mutex::new(Events::default()),
            acked: Condvar::new(),
            current: Mutex::new(WorkCompletion::default()),
            wc_flags: req.wc_flags,
        },
    });
    if let Some(ch) = channel {
        ch.cqs.fetch_add(1, Ordering::AcqRel);
    }
    shared.register_cq(id, raw.cast());
    raw
}

/// Takes the CQ apart before the box is freed (`ibv_destroy_cq`): EBUSY while a QP uses
/// it; otherwise waits until every completion event handed out for it was acked
/// (`ibv_ack_cq_events`) and every async event about it too.
pub(crate) fn release(c: &CqInner) -> Result<(), c_int> {
    if c.users.load(Ordering::Acquire) != 0 {
        return Err(libc::EBUSY);
    }
    // No more completion events can name it once it is out of the registry.
    c.ctx.unregister_cq(c.cq.id());
    {
        let mut ev = c.events.lock().unwrap_or_else(|e| e.into_inner());
        while ev.acked < ev.out {
            ev = c.acked.wait(ev).unwrap_or_else(|e| e.into_inner());
        }
    }
    if let Some(ch) = c.channel() {
        ch.cqs.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}

/// `ibv_resize_cq`: 0 with `cq->cqe` the new size (rounded as at creation: see the module
/// docs), keeping the completions the CQ holds, in order; EINVAL for `cqe` < 1, more than
/// `max_cqe`, or fewer than the completions it holds now.
pub(crate) fn resize(cq: Handle<'_, Cq>, cqe: c_int) -> c_int {
    let c = cq.inner();
    let Ok(want) = u32::try_from(cqe) else {
        return libc::EINVAL;
    };
    let max = match c.ctx.dev.query_device() {
        Ok(a) => a.max_cqe,
        Err(e) => return e.errno(),
    };
    if want == 0 || want > max {
        return libc::EINVAL;
    }
    match c.cq.resize(want, rxe_cqe(want, max)) {
        Ok(n) => {
            cq.set_cqe(c_int::try_from(n).unwrap_or(c_int::MAX));
            0
        }
        Err(e) => e.errno(),
    }
}

/// `ibv_ack_cq_events`: counts `nevents` completion events acked (in the program's
/// `comp_events_completed` too, under the events lock, as rdma-core counts under the CQ's
/// mutex).
pub(crate) fn ack_events(cq: Handle<'_, Cq>, nevents: c_uint) {
    let c = cq.inner();
    let mut ev = c.events.lock().unwrap_or_else(|e| e.into_inner());
    ev.acked += u64::from(nevents);
    cq.add_comp_events_completed(nevents);
    c.cq.ack_events(nevents);
    c.acked.notify_all();
}

/// Converts remem's completion into `struct ibv_wc`: `imm_data` in network order (with
/// `IBV_WC_WITH_IMM`), the invalidated rkey as it is (with `IBV_WC_WITH_INV`).
pub(crate) fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    let imm = if w.wc_flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        w.imm_data
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as ibv_wc_status,
        opcode: w.opcode as ibv_wc_opcode,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        u_imm_data: ibv_wc_imm { imm_data: imm },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// `ibv_context_ops::poll_cq` (verbs.h's inline `ibv_poll_cq`) once the FFI layer has the
/// program's array: the number of completions written to `wc`, or a negative errno
/// (`-ENOMEM` once the CQ overran and its queued completions are all polled).
pub(crate) fn poll(c: &CqInner, wc: &mut [MaybeUninit<ibv_wc>]) -> c_int {
    let want = wc.len();
    let mut buf = [WorkCompletion::default(); POLL_BATCH];
    let mut got = 0usize;
    while got < want {
        let n = (want - got).min(POLL_BATCH);
        match c.cq.poll(&mut buf[..n]) {
            Ok(k) => {
                for (slot, w) in wc[got..].iter_mut().zip(&buf[..k]) {
                    slot.write(to_ibv_wc(w));
                }
                got += k;
                if k < n {
                    break;
                }
            }
            Err(e) if got == 0 => {
                set_errno(e.errno());
                return -e.errno();
            }
            // What was polled before the error is returned; the error comes on the next
            // call.
            Err(_) => break,
        }
    }
    if got == 0 && want > 0 {
        // The NIC is a thread of this process: a program spinning on an empty CQ gives it
        // the CPU (on a machine with a core to spare this costs one sched_yield per empty
        // poll; on a busy one it is what lets the completion arrive). remem's Rust
        // benchmark loop does the same.
        std::thread::yield_now();
    }
    got as c_int
}

/// `ibv_context_ops::req_notify_cq` (verbs.h's inline `ibv_req_notify_cq`). A CQ without
/// a channel accepts the request and reports nowhere, as rdma-core does.
pub(crate) fn req_notify(c: &CqInner, solicited_only: c_int) -> c_int {
    if c.channel.is_null() {
        // rdma-core accepts it; the event has nowhere to go.
        return 0;
    }
    match c.cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_as_rxe_does() {
        let max = (1 << 15) - 1;
        assert_eq!(rxe_cqe(1, max), 1);
        assert_eq!(rxe_cqe(2, max), 3);
        assert_eq!(rxe_cqe(10, max), 15);
        assert_eq!(rxe_cqe(15, max), 15);
        assert_eq!(rxe_cqe(16, max), 31);
        assert_eq!(rxe_cqe(max, max), max);
        assert_eq!(rxe_cqe(20000, max), max);
    }
    use remem_verbs::{WcOpcode, WcStatus};

    #[test]
    fn wc_conversion_is_exact() {
        let w = WorkCompletion {
            wr_id: 0x1122_3344_5566_7788,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            vendor_err: 0x77,
            byte_len: 4096,
            imm_data: 0x0102_0304,
            qp_num: 0xab_cdef,
            src_qp: 0x12_3456,
            wc_flags: WcFlags::GRH | WcFlags::WITH_IMM,
            pkey_index: 3,
            slid: 0x1234,
            sl: 5,
            dlid_path_bits: 6,
        };
        let c = to_ibv_wc(&w);
        assert_eq!(c.wr_id, w.wr_id);
        assert_eq!(c.status, IBV_WC_REM_ACCESS_ERR);
        assert_eq!(c.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(c.vendor_err, 0x77);
        assert_eq!(c.byte_len, 4096);
        let imm = crate::ffi::wc_imm(&c);
        assert_eq!(imm.to_ne_bytes(), [1, 2, 3, 4], "network order in memory");
        assert_eq!((c.qp_num, c.src_qp), (0xab_cdef, 0x12_3456));
        assert_eq!(c.wc_flags, IBV_WC_GRH | IBV_WC_WITH_IMM);
        assert_eq!(
            (c.pkey_index, c.slid, c.sl, c.dlid_path_bits),
            (3, 0x1234, 5, 6)
        );

        let inv = WorkCompletion {
            imm_data: 0xdead_beef,
            wc_flags: WcFlags::WITH_INV,
            opcode: WcOpcode::Recv,
            ..WorkCompletion::default()
        };
        let c = to_ibv_wc(&inv);
        let rkey = crate::ffi::wc_imm(&c);
        assert_eq!(rkey, 0xdead_beef, "host order");
        assert_eq!(c.opcode, IBV_WC_RECV);
        assert_eq!(c.status, IBV_WC_SUCCESS);
    }
}
