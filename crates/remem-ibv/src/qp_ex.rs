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

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::PdInner;
use crate::ffi::handles::Handle;
use crate::ffi::null_with;
use crate::post::{Pending, PendingWr, flush, send_flags};
use crate::qp::{Qp, QpInner, Queues, create};
use core::ffi::c_int;
use remem_verbs::{DeviceAttr, FlushLevel, FlushType, QpType, SendFlags, SendOp, Sge, UdDest};
use std::sync::Arc;
use std::sync::atomic::Ordering;

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

/// `verbs_context::create_qp_ex` (verbs.h's inline `ibv_create_qp_ex`) once the FFI
/// layer has its arguments (`pd`: `attr.pd`'s when `IBV_QP_INIT_ATTR_PD` is set;
/// `queues`: its CQs and SRQ): a QP on `attr.pd` (`IBV_QP_INIT_ATTR_PD` is required);
/// with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` it has the `ibv_wr_*` API, and asking for an
/// operation its type (or the device) does not offer is EOPNOTSUPP. XRC, RSS and TSO
/// attributes and creation flags are EOPNOTSUPP.
pub(crate) fn create_ex(
    context: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
    pd: Option<&Arc<PdInner>>,
    queues: Queues<'_>,
) -> *mut ibv_qp {
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
    if mask & (IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH) != 0
        || (mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 && a.max_tso_header != 0)
        || (mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
    {
        return null_with(libc::EOPNOTSUPP);
    }
    if mask & IBV_QP_INIT_ATTR_PD == 0 {
        return null_with(libc::EINVAL);
    }
    let Some(pd) = pd.filter(|p| p.ctx.ibv_context() == context) else {
        return null_with(libc::EINVAL);
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
    match create(Some(pd), &mut basic, queues, wr_api) {
        Ok(q) => {
            a.cap = basic.cap;
            q
        }
        Err(e) => null_with(e),
    }
}

/// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP created by `ibv_create_qp_ex` with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; NULL (errno EOPNOTSUPP) for another QP, as
/// rdma-core answers.
pub(crate) fn to_qp_ex(qp: Handle<'_, Qp>) -> *mut ibv_qp_ex {
    if qp.inner().wr_api {
        qp.abi().cast()
    } else {
        null_with(libc::EOPNOTSUPP)
    }
}

/// Runs `f` on the QP's `ibv_wr_*` batch unless an error is already recorded; `f`'s
/// error is recorded.
pub(crate) fn with_batch(
    q: Option<&QpInner>,
    f: impl FnOnce(&QpInner, &mut Pending) -> Result<(), c_int>,
) {
    let Some(q) = q else {
        return;
    };
    let mut b = q.send.ex.lock().unwrap_or_else(|e| e.into_inner());
    if b.err != 0 {
        return;
    }
    if let Err(e) = f(q, &mut b.pending) {
        b.err = e;
    }
}

/// Starts a work request of `op` with the `wr_id` and `wr_flags` the program set in the
/// `ibv_qp_ex`.
pub(crate) fn build(qp: Option<Handle<'_, Qp>>, op: Result<SendOp, c_int>) {
    let Some(qp) = qp else {
        return;
    };
    let (wr_id, wr_flags) = qp.wr_id_flags();
    with_batch(Some(qp.inner()), |_, p| {
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
fn last(p: &mut Pending) -> Result<&mut PendingWr, c_int> {
    p.wrs.last_mut().ok_or(libc::EINVAL)
}

/// `ibv_wr_atomic_write`: the 8 bytes `value` (read at the call; `None` for NULL: EINVAL)
/// travel inline, as rxe keeps them in its WQE.
pub(crate) fn atomic_write(
    qp: Option<Handle<'_, Qp>>,
    rkey: u32,
    remote_addr: u64,
    value: Option<[u8; 8]>,
) {
    build(qp, Ok(SendOp::AtomicWrite { remote_addr, rkey }));
    with_batch(qp.map(Handle::inner), |_, p| {
        let Some(v) = value else {
            p.wrs.pop();
            return Err(libc::EINVAL);
        };
        let start = p.inline.len();
        p.inline.extend_from_slice(&v);
        let w = last(p)?;
        w.inline = Some((start as u32, 8));
        w.flags |= SendFlags::INLINE;
        Ok(())
    });
}

/// The operation of `ibv_wr_flush`: `ty` is `IBV_FLUSH_GLOBAL` or `IBV_FLUSH_PERSISTENT`,
/// `level` `IBV_FLUSH_RANGE` or `IBV_FLUSH_MR`; other values, and a length above 4 GiB - 1
/// (a FLUSH's DMA length field), are EINVAL.
pub(crate) fn flush_op(
    rkey: u32,
    remote_addr: u64,
    len: usize,
    ty: u8,
    level: u8,
) -> Result<SendOp, c_int> {
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
    match (flush_type, level, u32::try_from(len)) {
        (Ok(flush_type), Ok(level), Ok(len)) => Ok(SendOp::Flush {
            remote_addr,
            rkey,
            len,
            flush_type,
            level,
        }),
        _ => Err(libc::EINVAL),
    }
}

/// `ibv_wr_set_ud_addr` (`dest`: the address handle's, EINVAL for NULL): EINVAL on a QP
/// that is not UD.
pub(crate) fn set_ud_addr(
    q: &QpInner,
    p: &mut Pending,
    dest: Result<UdDest, c_int>,
) -> Result<(), c_int> {
    if q.qp_type != QpType::Ud {
        return Err(libc::EINVAL);
    }
    last(p)?.ud = Some(dest?);
    Ok(())
}

/// Sets the last work request's data to the SGEs `list` (EINVAL above `max_send_sge`;
/// `None`: a NULL list with entries, EINVAL).
pub(crate) fn set_sges(
    q: &QpInner,
    p: &mut Pending,
    list: Option<&[ibv_sge]>,
) -> Result<(), c_int> {
    let list = list.ok_or(libc::EINVAL)?;
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

/// Sets the last work request's data to a copy of the program's buffers (EINVAL above
/// `max_inline_data`, or for a buffer `None`: bytes at address 0).
pub(crate) fn set_inline<'b>(
    q: &QpInner,
    p: &mut Pending,
    bufs: impl ExactSizeIterator<Item = (usize, Option<&'b [u8]>)> + Clone,
) -> Result<(), c_int> {
    last(p)?;
    let total: u64 = bufs.clone().map(|(len, _)| len as u64).sum();
    if total > u64::from(q.cap.max_inline_data) {
        return Err(libc::EINVAL);
    }
    let start = p.inline.len();
    for (_, b) in bufs {
        match b {
            Some(bytes) => p.inline.extend_from_slice(bytes),
            None => {
                p.inline.truncate(start);
                return Err(libc::EINVAL);
            }
        }
    }
    let at = p.sges.len() as u32;
    let w = last(p)?;
    w.inline = Some((start as u32, total as u32));
    w.sges = (at, 0);
    Ok(())
}

/// `ibv_wr_start`: enters the QP's critical region and empties its batch.
pub(crate) fn start(q: &QpInner) {
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
}

/// `ibv_wr_complete`: posts the batch (or returns the error recorded) and leaves the
/// critical region.
pub(crate) fn complete(q: &QpInner) -> c_int {
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
}

/// `ibv_wr_abort`: drops the batch and leaves the critical region.
pub(crate) fn abort(q: &QpInner) {
    let mut b = q.send.ex.lock().unwrap_or_else(|e| e.into_inner());
    b.pending.clear();
    b.err = 0;
    drop(b);
    q.send.ex_busy.store(false, Ordering::Release);
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
