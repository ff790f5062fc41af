//! QPs and SRQs on ids: `rdma_create_qp`, `rdma_create_qp_ex`, `rdma_destroy_qp`,
//! `rdma_create_srq`, `rdma_create_srq_ex`, `rdma_destroy_srq`.
//!
//! A QP is made by the drop-in's own `ibv_create_qp_ex` on the id's device (so the
//! `ibv_qp` works with every `ibv_*` call), on the given PD or the id's (`rdma_cm_id.pd`),
//! with CQs (and completion channels) made for it when the attributes name none, as
//! librdmacm does (`rdma_cm_id.send_cq`, `recv_cq` and their channels; freed by
//! `rdma_destroy_qp`). It is moved to INIT with the CM's attributes
//! ([`remem_verbs::cm::CmId::init_qp_attr`]) — a UD QP on to RTR and RTS, as librdmacm
//! does — and attached to the provider's id ([`remem_verbs::cm::CmId::set_qp`]), which
//! moves it through RTR and RTS when the connection is made and to ERR when it ends.

#![allow(unsafe_code)]

use super::abi::*;
use super::id::{IdShared, id_from};
use super::{errno_of, fail, guard_neg};
use crate::abi::*;
use crate::context::pd_from;
use core::ffi::{c_int, c_void};
use remem_verbs::QpState;
use remem_verbs::cm::CmId;
use std::sync::Arc;

symver!(
    "rdma_create_qp" @ "RDMACM_1.0",
    "rdma_create_qp_ex" @ "RDMACM_1.0",
    "rdma_destroy_qp" @ "RDMACM_1.0",
    "rdma_create_srq" @ "RDMACM_1.0",
    "rdma_create_srq_ex" @ "RDMACM_1.0",
    "rdma_destroy_srq" @ "RDMACM_1.0",
);

/// Writes a field of the id's ABI struct in place.
macro_rules! set {
    ($id:expr, $field:ident, $value:expr) => {{
        let p = $id;
        let v = $value;
        // SAFETY: a live id of this library (the callers' contract); written in place.
        unsafe { (&raw mut (*p).$field).write(v) }
    }};
}

/// Destroys the CQs and completion channels `rdma_create_qp` made for the id.
///
/// # Safety
///
/// `id` is a live id of this library.
unsafe fn destroy_cqs(id: *mut rdma_cm_id, s: &IdShared) {
    let mut st = s.state();
    if !st.own_cqs {
        return;
    }
    st.own_cqs = false;
    drop(st);
    // SAFETY: a live id; the CQs and channels named are the ones made below.
    unsafe {
        let (scq, rcq, sch, rch) = (
            (*id).send_cq,
            (*id).recv_cq,
            (*id).send_cq_channel,
            (*id).recv_cq_channel,
        );
        for cq in [rcq, scq] {
            if !cq.is_null() {
                crate::ffi::queues::remem_ibv_ibv_destroy_cq(cq);
            }
        }
        for ch in [rch, sch] {
            if !ch.is_null() {
                crate::ffi::queues::remem_ibv_ibv_destroy_comp_channel(ch);
            }
        }
    }
    set!(id, send_cq, std::ptr::null_mut());
    set!(id, recv_cq, std::ptr::null_mut());
    set!(id, send_cq_channel, std::ptr::null_mut());
    set!(id, recv_cq_channel, std::ptr::null_mut());
}

/// Makes a completion channel and a CQ of `size` entries on `verbs` for the id.
fn make_cq(
    verbs: *mut ibv_context,
    size: u32,
    id: *mut rdma_cm_id,
) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
    // SAFETY: an open context of this library.
    let ch = unsafe { crate::ffi::queues::remem_ibv_ibv_create_comp_channel(verbs) };
    if ch.is_null() {
        return Err(crate::ffi::errno());
    }
    let cqe = c_int::try_from(size).unwrap_or(c_int::MAX);
    // SAFETY: the context and the channel just made; the id is the CQ's context, as
    // librdmacm sets it.
    let cq = unsafe {
        crate::ffi::queues::remem_ibv_ibv_create_cq(verbs, cqe, id.cast::<c_void>(), ch, 0)
    };
    if cq.is_null() {
        let e = crate::ffi::errno();
        // SAFETY: the channel just made, unused.
        unsafe { crate::ffi::queues::remem_ibv_ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    Ok((ch, cq))
}

/// Moves a new QP of the id to INIT (a UD QP to RTS) with the CM's attributes.
fn init_qp(s: &IdShared, cm: &Arc<dyn CmId>, qp: *mut ibv_qp) -> Result<(), c_int> {
    // SAFETY: the QP just made.
    let h = unsafe { crate::ffi::handles::Handle::<crate::qp::Qp>::from_abi(qp) }
        .ok_or(libc::EINVAL)?;
    let q = h.inner();
    let (attr, mask) = cm.init_qp_attr(QpState::Init).map_err(|e| errno_of(&e))?;
    q.qp.modify(&attr, mask).map_err(|e| errno_of(&e))?;
    if s.qp_type == IBV_QPT_UD {
        use remem_verbs::{QpAttr, QpAttrMask};
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        q.qp.modify(&rtr, QpAttrMask::STATE)
            .map_err(|e| errno_of(&e))?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0,
            ..QpAttr::default()
        };
        q.qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .map_err(|e| errno_of(&e))?;
    }
    h.set_state(q.qp.state());
    Ok(())
}

/// `rdma_create_qp_ex`: a QP on the id's device (see the module documentation). -1 with
/// errno: EINVAL (no device yet, a QP already, a PD or CQ of another device), or the
/// creation's.
///
/// # Safety
///
/// `id` is NULL or a live id; `attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard_neg("rdma_create_qp_ex", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { id_from(id) }, unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        match create_qp(id, s, a) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

fn create_qp(
    id: *mut rdma_cm_id,
    s: &Arc<IdShared>,
    a: &mut ibv_qp_init_attr_ex,
) -> Result<(), c_int> {
    let (dev, cm) = s.cm()?;
    // SAFETY: a live id; reading the fields the library and the program set.
    let (has_qp, id_pd, id_scq, id_rcq, id_srq) = unsafe {
        (
            !(*id).qp.is_null(),
            (*id).pd,
            (*id).send_cq,
            (*id).recv_cq,
            (*id).srq,
        )
    };
    if has_qp {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        a.pd = id_pd;
    }
    // The PD must be on the id's device (any context of it).
    // SAFETY: the program's PD: NULL or one of this library's.
    let p = unsafe { pd_from(a.pd) }.ok_or(libc::EINVAL)?;
    if !Arc::ptr_eq(&p.inner.ctx.dev, &dev.dev) {
        return Err(libc::EINVAL);
    }
    let verbs = p.inner.ctx.ibv_context();
    if (!id_rcq.is_null() && !a.recv_cq.is_null() && id_rcq != a.recv_cq)
        || (!id_scq.is_null() && !a.send_cq.is_null() && id_scq != a.send_cq)
    {
        return Err(libc::EINVAL);
    }
    let mut made = false;
    if a.recv_cq.is_null() && id_rcq.is_null() && a.cap.max_recv_wr > 0 {
        let (ch, cq) = make_cq(verbs, a.cap.max_recv_wr, id)?;
        set!(id, recv_cq_channel, ch);
        set!(id, recv_cq, cq);
        made = true;
    }
    if a.send_cq.is_null() && id_scq.is_null() && a.cap.max_send_wr > 0 {
        match make_cq(verbs, a.cap.max_send_wr, id) {
            Ok((ch, cq)) => {
                set!(id, send_cq_channel, ch);
                set!(id, send_cq, cq);
                made = true;
            }
            Err(e) => {
                s.state().own_cqs = made;
                // SAFETY: a live id.
                unsafe { destroy_cqs(id, s) };
                return Err(e);
            }
        }
    }
    if made {
        s.state().own_cqs = true;
    }
    // SAFETY: a live id.
    unsafe {
        if a.send_cq.is_null() {
            a.send_cq = (*id).send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = (*id).recv_cq;
        }
    }
    if a.srq.is_null() && !id_srq.is_null() {
        a.srq = id_srq;
    }
    // SAFETY: an open context of this library and the program's attributes.
    let qp = unsafe { crate::ffi::queues::create_qp_ex(verbs, a) };
    if qp.is_null() {
        let e = crate::ffi::errno();
        // SAFETY: a live id.
        unsafe { destroy_cqs(id, s) };
        return Err(e);
    }
    let attached = init_qp(s, &cm, qp).and_then(|()| {
        // SAFETY: the QP just made.
        let q = unsafe { crate::ffi::handles::qp_from(qp) }.ok_or(libc::EINVAL)?;
        cm.set_qp(Some(Arc::clone(&q.qp))).map_err(|e| errno_of(&e))
    });
    if let Err(e) = attached {
        // SAFETY: the QP just made, never the program's.
        unsafe { crate::ffi::queues::remem_ibv_ibv_destroy_qp(qp) };
        // SAFETY: a live id.
        unsafe { destroy_cqs(id, s) };
        return Err(e);
    }
    // SAFETY: the QP just made; reading its PD.
    set!(id, pd, unsafe { (*qp).pd });
    set!(id, qp, qp);
    Ok(())
}

/// `rdma_create_qp`: `rdma_create_qp_ex` on `pd` (NULL: the id's) with the basic
/// attributes; the granted sizes and the CQs used are written back.
///
/// # Safety
///
/// `id` is NULL or a live id; `pd` is NULL or a live PD; `qp_init_attr` is NULL or
/// readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_qp", || {
        // SAFETY: by the contract.
        let (Some(s), Some(b)) = (unsafe { id_from(id) }, unsafe { qp_init_attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: plain data; all-zero is valid.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.qp_context = b.qp_context;
        ex.send_cq = b.send_cq;
        ex.recv_cq = b.recv_cq;
        ex.srq = b.srq;
        ex.cap = b.cap;
        ex.qp_type = b.qp_type;
        ex.sq_sig_all = b.sq_sig_all;
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        ex.pd = if pd.is_null() {
            // SAFETY: a live id; reading its PD.
            unsafe { (*id).pd }
        } else {
            pd
        };
        let r = create_qp(id, s, &mut ex);
        b.send_cq = ex.send_cq;
        b.recv_cq = ex.recv_cq;
        b.srq = ex.srq;
        b.cap = ex.cap;
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_qp`: detaches and destroys the id's QP, and the CQs made for it.
///
/// # Safety
///
/// `id` is NULL or a live id whose QP the program no longer uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_qp(id: *mut rdma_cm_id) {
    crate::ffi::guard(
        "rdma_destroy_qp",
        || (),
        || {
            // SAFETY: by the contract.
            let Some(s) = (unsafe { id_from(id) }) else {
                return;
            };
            if let Ok((_, cm)) = s.cm() {
                let _ = cm.set_qp(None);
            }
            // SAFETY: a live id; its QP is this library's (or NULL).
            unsafe {
                let qp = (*id).qp;
                if !qp.is_null() {
                    crate::ffi::queues::remem_ibv_ibv_destroy_qp(qp);
                }
            }
            set!(id, qp, std::ptr::null_mut());
            // SAFETY: a live id.
            unsafe { destroy_cqs(id, s) };
        },
    )
}

/// `rdma_create_srq_ex`: an SRQ on the id's device (the id's PD unless `attr` names
/// one), which QPs later made on the id use. -1 with errno: EINVAL (no device, an SRQ
/// already), EOPNOTSUPP (XRC and tag-matching SRQs), or the creation's.
///
/// # Safety
///
/// `id` is NULL or a live id; `attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard_neg("rdma_create_srq_ex", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { id_from(id) }, unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        let Ok((dev, _)) = s.cm() else {
            return fail(libc::EINVAL);
        };
        // SAFETY: a live id.
        if !unsafe { (*id).srq }.is_null() {
            return fail(libc::EINVAL);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC {
            return fail(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
            // SAFETY: a live id.
            a.pd = unsafe { (*id).pd };
        }
        // SAFETY: the program's PD or the id's: NULL or this library's.
        let Some(p) = (unsafe { pd_from(a.pd) }) else {
            return fail(libc::EINVAL);
        };
        if !Arc::ptr_eq(&p.inner.ctx.dev, &dev.dev) {
            return fail(libc::EINVAL);
        }
        // SAFETY: an open context and the program's attributes.
        let srq = unsafe { crate::ffi::queues::create_srq_ex(p.inner.ctx.ibv_context(), a) };
        if srq.is_null() {
            return -1;
        }
        set!(id, srq, srq);
        0
    })
}

/// `rdma_create_srq`: `rdma_create_srq_ex` with a basic SRQ on `pd` (NULL: the id's).
///
/// # Safety
///
/// `id` is NULL or a live id; `pd` is NULL or a live PD; `attr` is NULL or readable and
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard_neg("rdma_create_srq", || {
        // SAFETY: by the contract.
        let Some(b) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: plain data; all-zero is valid.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.srq_context = b.srq_context;
        ex.attr = b.attr;
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        ex.srq_type = IBV_SRQT_BASIC;
        ex.pd = pd;
        // SAFETY: by the contract; `ex` is a local copy.
        let r = unsafe { remem_ibv_rdma_create_srq_ex(id, &mut ex) };
        b.attr = ex.attr;
        r
    })
}

/// `rdma_destroy_srq`: destroys the id's SRQ (its QP first, as the program must).
///
/// # Safety
///
/// `id` is NULL or a live id whose SRQ the program no longer uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_srq(id: *mut rdma_cm_id) {
    crate::ffi::guard(
        "rdma_destroy_srq",
        || (),
        || {
            if id.is_null() {
                return;
            }
            // SAFETY: a live id; its SRQ is this library's (or NULL).
            unsafe {
                let srq = (*id).srq;
                if !srq.is_null() {
                    crate::ffi::queues::remem_ibv_ibv_destroy_srq(srq);
                }
            }
            set!(id, srq, std::ptr::null_mut());
        },
    )
}
