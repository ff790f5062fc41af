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
//!
//! The entry points are in `crate::ffi::rdmacm`, which passes in the verbs calls
//! (`Verbs`) and destroys the CQs made here (`ffi::rdmacm::destroy_own_cqs`).

#![forbid(unsafe_code)]

use super::abi::*;
use super::errno_of;
use super::id::RdmaId;
use crate::abi::*;
use crate::context::CtxShared;
use crate::ffi::handles::Handle;
use crate::ffi::rdmacm::destroy_own_cqs;
use core::ffi::c_int;
use remem_verbs::QpState;
use remem_verbs::cm::CmId;
use std::sync::Arc;

/// The verbs calls made here, as the FFI layer makes them (`crate::ffi::rdmacm`), on
/// objects of this library: the contexts, PDs, CQs, QPs and SRQs passed are NULL (where
/// said) or live ones of this library, and the id is live.
pub(crate) trait Verbs {
    /// The context of `pd` (the program's or the id's); `None` for NULL.
    fn pd_ctx(&self, pd: *mut ibv_pd) -> Option<Arc<CtxShared>>;
    /// A completion channel and a CQ of `cqe` entries on `verbs` whose `cq_context` is
    /// `id`, as librdmacm sets it (nothing is left made on error).
    fn make_cq(
        &self,
        verbs: *mut ibv_context,
        cqe: c_int,
        id: *mut rdma_cm_id,
    ) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int>;
    /// `ibv_create_qp_ex` on `verbs` with the attributes: the QP and its PD.
    fn create_qp(
        &self,
        verbs: *mut ibv_context,
        attr: &mut ibv_qp_init_attr_ex,
    ) -> Result<(*mut ibv_qp, *mut ibv_pd), c_int>;
    /// Runs `f` on a QP [`Verbs::create_qp`] just made.
    fn with_qp(
        &self,
        qp: *mut ibv_qp,
        f: &mut dyn FnMut(Handle<'_, crate::qp::Qp>) -> Result<(), c_int>,
    ) -> Result<(), c_int>;
    /// `ibv_destroy_qp` (NULL: nothing).
    fn destroy_qp(&self, qp: *mut ibv_qp);
    /// `ibv_create_srq_ex` on `verbs` with the attributes.
    fn create_srq(
        &self,
        verbs: *mut ibv_context,
        attr: &mut ibv_srq_init_attr_ex,
    ) -> Result<*mut ibv_srq, c_int>;
    /// `ibv_destroy_srq` (NULL: nothing).
    fn destroy_srq(&self, srq: *mut ibv_srq);
}

/// Moves a new QP of the id to INIT (a UD QP to RTS) with the CM's attributes.
fn init_qp(
    qp_type: ibv_qp_type,
    cm: &Arc<dyn CmId>,
    h: Handle<'_, crate::qp::Qp>,
) -> Result<(), c_int> {
    let q = h.inner();
    let (attr, mask) = cm.init_qp_attr(QpState::Init).map_err(|e| errno_of(&e))?;
    q.qp.modify(&attr, mask).map_err(|e| errno_of(&e))?;
    if qp_type == IBV_QPT_UD {
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

/// `rdma_create_qp_ex` once the FFI layer has the id and the attributes: a QP on the
/// id's device (see the module documentation). EINVAL (no device yet, a QP already, a PD
/// or CQ of another device), or the creation's.
pub(crate) fn create_qp(
    h: Handle<'_, RdmaId>,
    a: &mut ibv_qp_init_attr_ex,
    v: &dyn Verbs,
) -> Result<(), c_int> {
    let s = h.inner();
    let (dev, cm) = s.cm()?;
    let (id_scq, id_rcq, id_srq) = (h.send_cq(), h.recv_cq(), h.srq_ptr());
    if !h.qp_ptr().is_null() {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        a.pd = h.pd();
    }
    // The PD must be on the id's device (any context of it).
    let ctx = v.pd_ctx(a.pd).ok_or(libc::EINVAL)?;
    if !Arc::ptr_eq(&ctx.dev, &dev.dev) {
        return Err(libc::EINVAL);
    }
    let verbs = ctx.ibv_context();
    if (!id_rcq.is_null() && !a.recv_cq.is_null() && id_rcq != a.recv_cq)
        || (!id_scq.is_null() && !a.send_cq.is_null() && id_scq != a.send_cq)
    {
        return Err(libc::EINVAL);
    }
    let cqe = |size: u32| c_int::try_from(size).unwrap_or(c_int::MAX);
    let mut made = false;
    if a.recv_cq.is_null() && id_rcq.is_null() && a.cap.max_recv_wr > 0 {
        let (ch, cq) = v.make_cq(verbs, cqe(a.cap.max_recv_wr), h.abi())?;
        h.set_recv_cq_channel(ch);
        h.set_recv_cq(cq);
        made = true;
    }
    if a.send_cq.is_null() && id_scq.is_null() && a.cap.max_send_wr > 0 {
        match v.make_cq(verbs, cqe(a.cap.max_send_wr), h.abi()) {
            Ok((ch, cq)) => {
                h.set_send_cq_channel(ch);
                h.set_send_cq(cq);
                made = true;
            }
            Err(e) => {
                s.state().own_cqs = made;
                destroy_own_cqs(h);
                return Err(e);
            }
        }
    }
    if made {
        s.state().own_cqs = true;
    }
    if a.send_cq.is_null() {
        a.send_cq = h.send_cq();
    }
    if a.recv_cq.is_null() {
        a.recv_cq = h.recv_cq();
    }
    if a.srq.is_null() && !id_srq.is_null() {
        a.srq = id_srq;
    }
    let (qp, pd) = match v.create_qp(verbs, a) {
        Ok(made) => made,
        Err(e) => {
            destroy_own_cqs(h);
            return Err(e);
        }
    };
    let attached = v.with_qp(qp, &mut |q| {
        init_qp(s.qp_type, &cm, q)?;
        cm.set_qp(Some(Arc::clone(&q.inner().qp)))
            .map_err(|e| errno_of(&e))
    });
    if let Err(e) = attached {
        v.destroy_qp(qp);
        destroy_own_cqs(h);
        return Err(e);
    }
    h.set_pd(pd);
    h.set_qp(qp);
    Ok(())
}

/// `rdma_destroy_qp` once the FFI layer has the id: detaches and destroys the id's QP,
/// and the CQs made for it.
pub(crate) fn destroy_qp(h: Handle<'_, RdmaId>, v: &dyn Verbs) {
    if let Ok((_, cm)) = h.inner().cm() {
        let _ = cm.set_qp(None);
    }
    v.destroy_qp(h.qp_ptr());
    h.set_qp(std::ptr::null_mut());
    destroy_own_cqs(h);
}

/// `rdma_create_srq_ex` once the FFI layer has the id and the attributes: an SRQ on the
/// id's device (the id's PD unless `a` names one), which QPs later made on the id use.
/// EINVAL (no device, an SRQ already), EOPNOTSUPP (XRC and tag-matching SRQs), or the
/// creation's.
pub(crate) fn create_srq(
    h: Handle<'_, RdmaId>,
    a: &mut ibv_srq_init_attr_ex,
    v: &dyn Verbs,
) -> Result<(), c_int> {
    let (dev, _) = h.inner().cm().map_err(|_| libc::EINVAL)?;
    if !h.srq_ptr().is_null() {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC {
        return Err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
        a.pd = h.pd();
    }
    let ctx = v.pd_ctx(a.pd).ok_or(libc::EINVAL)?;
    if !Arc::ptr_eq(&ctx.dev, &dev.dev) {
        return Err(libc::EINVAL);
    }
    let srq = v.create_srq(ctx.ibv_context(), a)?;
    h.set_srq(srq);
    Ok(())
}

/// `rdma_destroy_srq` once the FFI layer has the id: destroys the id's SRQ (its QP
/// first, as the program must).
pub(crate) fn destroy_srq(h: Handle<'_, RdmaId>, v: &dyn Verbs) {
    v.destroy_srq(h.srq_ptr());
    h.set_srq(std::ptr::null_mut());
}
