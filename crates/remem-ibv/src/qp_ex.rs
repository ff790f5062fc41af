//! Extended QPs: the `create_qp_ex` slot of `verbs_context` (verbs.h's inline
//! `ibv_create_qp_ex`), `ibv_qp_to_qp_ex`, and the `ibv_wr_*` post API whose functions
//! every QP's `ibv_qp_ex` carries.
//!
//! `ibv_wr_start` enters the QP's critical region (one thread at a time, as the man page
//! promises); each builder (`ibv_wr_send`, `ibv_wr_rdma_write`, …) starts a work request
//! with the `wr_id` and `wr_flags` it reads from the `ibv_qp_ex` at that call; the setters
//! (`ibv_wr_set_sge*`, `ibv_wr_set_inline_data*` — the data is copied at once —,
//! `ibv_wr_set_ud_addr`) complete the last one. `ibv_wr_complete` posts the batch through
//! the same path as `ibv_post_send` (`post::flush`) and leaves the region;
//! `ibv_wr_abort` drops it. A builder or setter that cannot be honoured (an operation
//! remem does not implement: TSO, XRC; a setter without a work request;
//! too much inline data) records the error, which `ibv_wr_complete` returns, posting
//! nothing. A failure only remem can see (a full send queue, a bad lkey) is found while
//! posting: the work requests before it are posted. `ibv_wr_bind_mw` and
//! `ibv_wr_local_inv` are memory window work requests ([`crate::mw`]).
//!
//! **RoCEv2 memory placement extensions.** On a device that reports them
//! (`IB_UVERBS_DEVICE_ATOMIC_WRITE`, `IB_UVERBS_DEVICE_FLUSH_GLOBAL`/`_PERSISTENT` in
//! `device_cap_flags_ex`), an RC QP may be created with `IBV_QP_EX_WITH_ATOMIC_WRITE` and
//! `IBV_QP_EX_WITH_FLUSH`. `ibv_wr_atomic_write` copies its 8 bytes at the call (as rxe
//! keeps them in the WQE) and posts them inline; `ibv_wr_flush` is the `wr_flush` member
//! rdma-core 45+ appends to `ibv_qp_ex` (`qp::Qp::wr_flush` lies there). The target
//! checks them as rxe does: ATOMIC WRITE needs `IBV_ACCESS_REMOTE_WRITE` on the region
//! and an 8-byte aligned address, FLUSH the `IBV_ACCESS_FLUSH_*` bit of its type; a
//! refused one completes with `IBV_WC_REM_ACCESS_ERR` (or `IBV_WC_REM_INV_REQ_ERR`).

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ffi::handles::qp_from;
use crate::ffi::wr::{copy_inline, ud_dest};
use crate::ffi::{guard, guard_ptr, null_with};
use crate::post::{PendingWr, flush, send_flags};
use crate::qp::{QpInner, create};
use core::ffi::{c_int, c_void};
use remem_verbs::{DeviceAttr, FlushLevel, FlushType, QpType, SendFlags, SendOp, Sge};
use std::sync::Arc;
use std::sync::atomic::Ordering;

symver!(
    "ibv_qp_to_qp_ex" @ "IBVERBS_1.6",
);

/// The `ibv_qp_ex` of a new QP: `base` and every `ibv_wr_*` function.
pub(crate) fn abi(base: ibv_qp) -> ibv_qp_ex {
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

/// The send operations (`IBV_QP_EX_WITH_*`) the `ibv_wr_*` API offers on a QP type of a
/// device with `attr` (whose placement extensions add ATOMIC WRITE and FLUSH to RC).
fn send_ops_supported(t: QpType, attr: &DeviceAttr) -> u64 {
    let windows = if attr.max_mw > 0 {
        IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV
    } else {
        0
    };
    let placement = (if attr.atomic_write {
        IBV_QP_EX_WITH_ATOMIC_WRITE
    } else {
        0
    }) | (if attr.flush_global || attr.flush_persistent {
        IBV_QP_EX_WITH_FLUSH
    } else {
        0
    });
    match t {
        QpType::Ud => IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
        // rxe's UC set: with memory windows, BIND_MW (not LOCAL_INV).
        QpType::Uc => {
            IBV_QP_EX_WITH_SEND
                | IBV_QP_EX_WITH_SEND_WITH_IMM
                | IBV_QP_EX_WITH_RDMA_WRITE
                | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
                | (windows & IBV_QP_EX_WITH_BIND_MW)
        }
        QpType::Rc => {
            IBV_QP_EX_WITH_SEND
                | IBV_QP_EX_WITH_SEND_WITH_IMM
                | IBV_QP_EX_WITH_SEND_WITH_INV
                | IBV_QP_EX_WITH_RDMA_WRITE
                | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
                | IBV_QP_EX_WITH_RDMA_READ
                | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
                | placement
                | windows
        }
    }
}

/// `verbs_context::create_qp_ex` (verbs.h's inline `ibv_create_qp_ex`): a QP on
/// `attr.pd` (`IBV_QP_INIT_ATTR_PD` is required); with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`
/// it has the `ibv_wr_*` API, and asking for an operation its type (or the device) does
/// not offer is EOPNOTSUPP. XRC, RSS and TSO attributes and creation flags are EOPNOTSUPP.
///
/// # Safety
///
/// `context` is an open context; `attr` is NULL or readable and writable.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp_ex", || {
        // SAFETY: by the contract.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return null_with(libc::EINVAL);
        };
        let known = IBV_QP_INIT_ATTR_PD
            | IBV_QP_INIT_ATTR_XRCD
            | IBV_QP_INIT_ATTR_CREATE_FLAGS
            | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
            | IBV_QP_INIT_ATTR_IND_TABLE
            | IBV_QP_INIT_ATTR_RX_HASH
            | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let mask = a.comp_mask;
        if mask & !known != 0 {
            return null_with(libc::EINVAL);
        }
        if mask & (IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH)
            != 0
            || (mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 && a.max_tso_header != 0)
            || (mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return null_with(libc::EOPNOTSUPP);
        }
        if mask & IBV_QP_INIT_ATTR_PD == 0 {
            return null_with(libc::EINVAL);
        }
        // SAFETY: the program's PD: NULL or one of this library's.
        let pd = match unsafe { crate::context::pd_from(a.pd) } {
            Some(p) if p.inner.ctx.ibv_context() == context => &p.inner,
            _ => return null_with(libc::EINVAL),
        };
        let dev = Arc::clone(&pd.ctx.dev);
        let wr_api = mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if wr_api {
            let t = match a.qp_type {
                IBV_QPT_RC => QpType::Rc,
                IBV_QPT_UC => QpType::Uc,
                IBV_QPT_UD => QpType::Ud,
                // create() answers for the other types.
                _ => QpType::Rc,
            };
            let attr = match dev.query_device() {
                Ok(d) => d,
                Err(e) => return null_with(e.errno()),
            };
            if a.send_ops_flags & !send_ops_supported(t, &attr) != 0 {
                return null_with(libc::EOPNOTSUPP);
            }
        }
        let mut basic = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: the program's CQs and SRQ: NULL or this library's.
        let queues = unsafe { crate::ffi::handles::qp_queues(&basic) };
        match create(Some(pd), &mut basic, queues, wr_api) {
            Ok(q) => {
                a.cap = basic.cap;
                q.cast()
            }
            Err(e) => null_with(e),
        }
    })
}

/// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP created by `ibv_create_qp_ex` with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; NULL (errno EOPNOTSUPP) for another QP, as
/// rdma-core answers.
///
/// # Safety
///
/// `qp` is NULL or a live QP.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard_ptr("ibv_qp_to_qp_ex", || {
        // SAFETY: by the contract.
        match unsafe { qp_from(qp) } {
            Some(q) if q.wr_api => qp.cast(),
            Some(_) => null_with(libc::EOPNOTSUPP),
            None => null_with(libc::EINVAL),
        }
    })
}

/// Runs `f` on the QP's `ibv_wr_*` batch unless an error is already recorded; `f`'s
/// error is recorded. A panic records EIO.
fn with_batch(
    qpx: *mut ibv_qp_ex,
    name: &str,
    f: impl FnOnce(&QpInner, &mut crate::post::Pending) -> Result<(), c_int>,
) {
    guard(
        name,
        || (),
        || {
            // SAFETY: the program passes one of this library's QPs.
            let Some(q) = (unsafe { qp_from(qpx.cast()) }) else {
                return;
            };
            let mut b = q.send.ex.lock().unwrap_or_else(|e| e.into_inner());
            if b.err != 0 {
                return;
            }
            if let Err(e) = f(q, &mut b.pending) {
                b.err = e;
            }
        },
    )
}

/// Starts a work request of `op` with the `wr_id` and `wr_flags` the program set in the
/// `ibv_qp_ex`.
fn build(qpx: *mut ibv_qp_ex, name: &str, op: Result<SendOp, c_int>) {
    if qpx.is_null() {
        return;
    }
    // SAFETY: the program's `ibv_qp_ex`, whose two public fields it wrote before this
    // call; they are read in place.
    let (wr_id, wr_flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    with_batch(qpx, name, |_, p| {
        let op = op?;
        let flags = send_flags(wr_flags)?;
        let at = p.sges.len() as u32;
        p.wrs.push(PendingWr {
            wr_id,
            op,
            flags,
            ud: None,
            sges: (at, 0),
            inline: None,
            tag: 0,
        });
        Ok(())
    })
}

/// The work request the setters complete: the last one built (EINVAL if none).
fn last(p: &mut crate::post::Pending) -> Result<&mut PendingWr, c_int> {
    p.wrs.last_mut().ok_or(libc::EINVAL)
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    build(
        qpx,
        "ibv_wr_atomic_cmp_swp",
        Ok(SendOp::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        }),
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    build(
        qpx,
        "ibv_wr_atomic_fetch_add",
        Ok(SendOp::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        }),
    );
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
    let op = match unsafe { info.as_ref() } {
        // SAFETY: the program's window and region (NULL or live).
        Some(i) => unsafe { crate::mw::bind_op(mw, rkey, i) },
        None => Err(libc::EINVAL),
    };
    build(qpx, "ibv_wr_bind_mw", op);
}

/// `ibv_wr_local_inv`: invalidates the type 2 window of `rkey`, in send-queue order.
unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    build(qpx, "ibv_wr_local_inv", Ok(SendOp::LocalInv { rkey }));
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    build(
        qpx,
        "ibv_wr_rdma_read",
        Ok(SendOp::RdmaRead { remote_addr, rkey }),
    );
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    build(
        qpx,
        "ibv_wr_rdma_write",
        Ok(SendOp::RdmaWrite { remote_addr, rkey }),
    );
}

/// `imm` is big-endian, as verbs passes it.
unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    build(
        qpx,
        "ibv_wr_rdma_write_imm",
        Ok(SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm),
        }),
    );
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    build(qpx, "ibv_wr_send", Ok(SendOp::Send));
}

/// `imm` is big-endian, as verbs passes it.
unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    build(
        qpx,
        "ibv_wr_send_imm",
        Ok(SendOp::SendWithImm {
            imm: u32::from_be(imm),
        }),
    );
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    build(qpx, "ibv_wr_send_inv", Ok(SendOp::SendWithInv { rkey }));
}

unsafe extern "C" fn wr_send_tso(qpx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    build(qpx, "ibv_wr_send_tso", Err(libc::EOPNOTSUPP));
}

/// `ibv_wr_atomic_write`: the 8 bytes at `wr` are copied now (EINVAL for NULL) and
/// travel inline, as rxe keeps them in its WQE.
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    wr: *const c_void,
) {
    build(
        qpx,
        "ibv_wr_atomic_write",
        Ok(SendOp::AtomicWrite { remote_addr, rkey }),
    );
    with_batch(qpx, "ibv_wr_atomic_write", |_, p| {
        if wr.is_null() {
            p.wrs.pop();
            return Err(libc::EINVAL);
        }
        let start = p.inline.len();
        // SAFETY: the program's 8-byte value, readable during this call (verbs.h).
        unsafe { copy_inline(p, wr as usize as u64, 8) }?;
        let w = last(p)?;
        w.inline = Some((start as u32, 8));
        w.flags |= SendFlags::INLINE;
        Ok(())
    });
}

/// `ibv_wr_flush` (`ibv_qp_ex::wr_flush` of rdma-core 45+): `ty` is `IBV_FLUSH_GLOBAL` or
/// `IBV_FLUSH_PERSISTENT`, `level` `IBV_FLUSH_RANGE` or `IBV_FLUSH_MR`; other values, and
/// a length above 4 GiB - 1 (a FLUSH's DMA length field), record EINVAL.
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
    let flush_type = match ty {
        IBV_FLUSH_GLOBAL => Ok(FlushType::Global),
        IBV_FLUSH_PERSISTENT => Ok(FlushType::Persistent),
        _ => Err(libc::EINVAL),
    };
    let level = match level {
        IBV_FLUSH_RANGE => Ok(FlushLevel::Range),
        IBV_FLUSH_MR => Ok(FlushLevel::Region),
        _ => Err(libc::EINVAL),
    };
    let op = match (flush_type, level, u32::try_from(len)) {
        (Ok(flush_type), Ok(level), Ok(len)) => Ok(SendOp::Flush {
            remote_addr,
            rkey,
            len,
            flush_type,
            level,
        }),
        _ => Err(libc::EINVAL),
    };
    build(qpx, "ibv_wr_flush", op);
}

unsafe extern "C" fn wr_set_ud_addr(qpx: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    with_batch(qpx, "ibv_wr_set_ud_addr", |q, p| {
        if q.qp_type != QpType::Ud {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's address handle: NULL or one of this library's.
        let d = unsafe { ud_dest(ah, qpn, qkey) }?;
        last(p)?.ud = Some(d);
        Ok(())
    });
}

unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, _srqn: u32) {
    with_batch(qpx, "ibv_wr_set_xrc_srqn", |_, _| Err(libc::EOPNOTSUPP));
}

/// Sets the last work request's data to the SGEs `list` (EINVAL above `max_send_sge`).
fn set_sges(q: &QpInner, p: &mut crate::post::Pending, list: &[ibv_sge]) -> Result<(), c_int> {
    if list.len() > q.cap.max_send_sge as usize {
        return Err(libc::EINVAL);
    }
    last(p)?;
    let at = p.sges.len() as u32;
    p.sges.extend(list.iter().map(|s| Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }));
    let w = last(p)?;
    w.sges = (at, list.len() as u32);
    w.inline = None;
    Ok(())
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_batch(qpx, "ibv_wr_set_sge", |q, p| {
        set_sges(q, p, &[ibv_sge { addr, length, lkey }])
    });
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, list: *const ibv_sge) {
    with_batch(qpx, "ibv_wr_set_sge_list", |q, p| {
        if num_sge > q.cap.max_send_sge as usize || (num_sge > 0 && list.is_null()) {
            return Err(libc::EINVAL);
        }
        let l: &[ibv_sge] = if num_sge == 0 {
            &[]
        } else {
            // SAFETY: the program's array of `num_sge` entries (bounded above).
            unsafe { std::slice::from_raw_parts(list, num_sge) }
        };
        set_sges(q, p, l)
    });
}

/// Sets the last work request's data to a copy of the program's buffers (EINVAL above
/// `max_inline_data`).
fn set_inline(
    q: &QpInner,
    p: &mut crate::post::Pending,
    bufs: &[ibv_data_buf],
) -> Result<(), c_int> {
    last(p)?;
    let total: u64 = bufs.iter().map(|b| b.length as u64).sum();
    if total > u64::from(q.cap.max_inline_data) {
        return Err(libc::EINVAL);
    }
    let start = p.inline.len();
    for b in bufs {
        // SAFETY: the program's buffer, readable for its length during this call (what
        // verbs requires of inline data).
        if let Err(e) = unsafe { copy_inline(p, b.addr as usize as u64, b.length) } {
            p.inline.truncate(start);
            return Err(e);
        }
    }
    let at = p.sges.len() as u32;
    let w = last(p)?;
    w.inline = Some((start as u32, total as u32));
    w.sges = (at, 0);
    Ok(())
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    with_batch(qpx, "ibv_wr_set_inline_data", |q, p| {
        set_inline(q, p, &[ibv_data_buf { addr, length }])
    });
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    list: *const ibv_data_buf,
) {
    with_batch(qpx, "ibv_wr_set_inline_data_list", |q, p| {
        if num_buf > 0 && list.is_null() {
            return Err(libc::EINVAL);
        }
        let l: &[ibv_data_buf] = if num_buf == 0 {
            &[]
        } else {
            // SAFETY: the program's array of `num_buf` entries.
            unsafe { std::slice::from_raw_parts(list, num_buf) }
        };
        set_inline(q, p, l)
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    guard(
        "ibv_wr_start",
        || (),
        || {
            // SAFETY: the program passes one of this library's QPs.
            let Some(q) = (unsafe { qp_from(qpx.cast()) }) else {
                return;
            };
            while q
                .send
                .ex_busy
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::thread::yield_now();
            }
            let mut b = q.send.ex.lock().unwrap_or_else(|e| e.into_inner());
            b.pending.clear();
            b.err = 0;
        },
    )
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    guard(
        "ibv_wr_complete",
        || libc::EIO,
        || {
            // SAFETY: the program passes one of this library's QPs.
            let Some(q) = (unsafe { qp_from(qpx.cast()) }) else {
                return libc::EINVAL;
            };
            let mut b = q.send.ex.lock().unwrap_or_else(|e| e.into_inner());
            let r = if b.err != 0 {
                b.pending.clear();
                b.err
            } else {
                match flush(q, &mut b.pending) {
                    Ok(()) => 0,
                    Err((_, e)) => e,
                }
            };
            b.err = 0;
            drop(b);
            q.send.ex_busy.store(false, Ordering::Release);
            r
        },
    )
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    guard(
        "ibv_wr_abort",
        || (),
        || {
            // SAFETY: the program passes one of this library's QPs.
            let Some(q) = (unsafe { qp_from(qpx.cast()) }) else {
                return;
            };
            let mut b = q.send.ex.lock().unwrap_or_else(|e| e.into_inner());
            b.pending.clear();
            b.err = 0;
            drop(b);
            q.send.ex_busy.store(false, Ordering::Release);
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(placement: bool) -> DeviceAttr {
        DeviceAttr {
            fw_ver: String::new(),
            node_guid: 1,
            sys_image_guid: 1,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 1,
            max_qp_wr: 1,
            max_sge: 1,
            max_sge_rd: 1,
            max_cq: 1,
            max_cqe: 1,
            max_mr: 1,
            max_pd: 1,
            max_qp_rd_atom: 1,
            max_qp_init_rd_atom: 1,
            max_res_rd_atom: 1,
            atomic_cap: remem_verbs::AtomicCap::Hca,
            max_srq: 1,
            max_srq_wr: 1,
            max_srq_sge: 1,
            max_inline_data: 0,
            max_ah: 1,
            phys_port_cnt: 1,
            max_msg_sz: 1,
            flush_global: placement,
            flush_persistent: placement,
            atomic_write: placement,
            max_mw: if placement { 0x1000 } else { 0 },
            mcast: remem_verbs::McastCaps::default(),
        }
    }

    #[test]
    fn send_ops_per_type() {
        let on = attr(true);
        let ud = send_ops_supported(QpType::Ud, &on);
        assert_ne!(ud & IBV_QP_EX_WITH_SEND, 0);
        assert_eq!(ud & IBV_QP_EX_WITH_RDMA_WRITE, 0);
        assert_eq!(ud & (IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_FLUSH), 0);
        let uc = send_ops_supported(QpType::Uc, &on);
        assert_ne!(uc & IBV_QP_EX_WITH_RDMA_WRITE, 0);
        assert_eq!(uc & IBV_QP_EX_WITH_RDMA_READ, 0);
        assert_eq!(uc & (IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_FLUSH), 0);
        assert_ne!(uc & IBV_QP_EX_WITH_BIND_MW, 0);
        assert_eq!(uc & IBV_QP_EX_WITH_LOCAL_INV, 0);
        let rc = send_ops_supported(QpType::Rc, &on);
        assert_ne!(rc & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, 0);
        assert_ne!(rc & IBV_QP_EX_WITH_BIND_MW, 0);
        assert_ne!(rc & IBV_QP_EX_WITH_LOCAL_INV, 0);
        assert_ne!(rc & IBV_QP_EX_WITH_ATOMIC_WRITE, 0);
        assert_ne!(rc & IBV_QP_EX_WITH_FLUSH, 0);
    }

    #[test]
    fn placement_ops_follow_the_device() {
        let rc = send_ops_supported(QpType::Rc, &attr(false));
        assert_eq!(rc & (IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_FLUSH), 0);
        assert_eq!(rc & (IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV), 0);
        let mut flush_only = attr(false);
        flush_only.flush_persistent = true;
        let rc = send_ops_supported(QpType::Rc, &flush_only);
        assert_eq!(rc & IBV_QP_EX_WITH_ATOMIC_WRITE, 0);
        assert_ne!(rc & IBV_QP_EX_WITH_FLUSH, 0);
    }
}
