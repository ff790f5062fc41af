//! Queue pairs (RC, UC, UD): `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_destroy_qp`, and the small QP verbs.
//!
//! Every QP is a [`Qp`] whose ABI struct is an `ibv_qp_ex` (its `qp_base` is the `ibv_qp`
//! programs see), with the `ibv_wr_*` functions filled in ([`crate::qp_ex`]). `ibv_qp.state`
//! follows `ibv_modify_qp` and `ibv_query_qp`; `qp_num` is remem's QP number.
//!
//! `ibv_qp_attr` maps field by field to remem's `QpAttr` and the mask bit by bit to
//! `QpAttrMask` (their values are rdma-core's); remem checks the transition and the values
//! as the kernel does (`ib_modify_qp_is_ok`), and an address vector without a GRH is
//! EINVAL on RoCE, as rxe answers.

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::ah::{ah_attr_from, ah_attr_to};
use crate::context::{CtxShared, PdInner, PdUse};
use crate::cq::CqInner;
use crate::ffi::handles::{Handle, into_abi};
use crate::post::SendPath;
use crate::srq::SrqInner;
use core::ffi::c_int;
use core::mem::MaybeUninit;
use remem_verbs::{
    AccessFlags, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A queue pair: what `ibv_create_qp` (as `ibv_qp`) and `ibv_qp_to_qp_ex` (as `ibv_qp_ex`)
/// return pointers to (`abi` first). The program writes parts of the ABI struct
/// (`qp_context`, `wr_id`, `wr_flags`); the library touches it only through raw pointers
/// and keeps its own state in [`QpInner`].
#[repr(C)]
pub struct Qp {
    /// The `ibv_qp_ex` programs see (`qp_base` is the `ibv_qp`).
    pub abi: ibv_qp_ex,
    /// `ibv_qp_ex::wr_flush`, which rdma-core 45+ appends to the rdma-core 44 struct
    /// `abi` is: `ibv_qp_ex`'s size is a multiple of 8, so this lies where those
    /// headers put it.
    pub wr_flush: Option<wr_flush_fn>,
    /// The library's side.
    pub inner: QpInner,
}

/// The library's side of a QP.
pub struct QpInner {
    /// remem's QP.
    pub qp: Arc<dyn QueuePair>,
    /// Its transport service.
    pub qp_type: QpType,
    /// The queue sizes granted.
    pub cap: QpCap,
    /// `sq_sig_all` at creation.
    pub sq_sig_all: bool,
    /// Created by `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: the QP has the
    /// `ibv_wr_*` API (`ibv_qp_to_qp_ex`).
    pub wr_api: bool,
    /// Its context.
    pub ctx: Arc<CtxShared>,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    /// The send side (bounce region for inline data, batches).
    pub(crate) send: SendPath,
    _pd: PdUse,
}

impl std::fmt::Debug for QpInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpInner")
            .field("qp_num", &self.qp.qp_num())
            .field("qp_type", &self.qp_type)
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

/// The transport service of `ibv_qp_type`: EOPNOTSUPP for kinds verbs defines and remem
/// does not implement (XRC, raw packet, driver), EINVAL otherwise.
fn qp_type_from(t: ibv_qp_type) -> Result<QpType, c_int> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        IBV_QPT_RAW_PACKET | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV | IBV_QPT_DRIVER => {
            Err(libc::EOPNOTSUPP)
        }
        _ => Err(libc::EINVAL),
    }
}

fn qp_state_from(s: ibv_qp_state) -> Result<QpState, c_int> {
    Ok(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

fn mtu_from(m: ibv_mtu) -> Result<Mtu, c_int> {
    Mtu::ALL
        .into_iter()
        .find(|x| *x as ibv_mtu == m)
        .ok_or(libc::EINVAL)
}

fn cap_from(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

pub(crate) fn cap_to(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_qp_attr` and its mask to remem's: the fields the mask names are checked (an
/// unknown state or MTU, access bits verbs does not define, a path without a GRH: EINVAL),
/// the others are carried as they are (remem reads only what the mask names).
pub(crate) fn qp_attr_from(a: &ibv_qp_attr, mask: c_int) -> Result<(QpAttr, QpAttrMask), c_int> {
    let mask = u32::try_from(mask)
        .ok()
        .and_then(QpAttrMask::from_bits)
        .ok_or(libc::EINVAL)?;
    let mut q = QpAttr {
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        cap: cap_from(&a.cap),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..QpAttr::default()
    };
    if mask.contains(QpAttrMask::STATE) {
        q.qp_state = qp_state_from(a.qp_state)?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        q.cur_qp_state = qp_state_from(a.cur_qp_state)?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        q.path_mtu = mtu_from(a.path_mtu)?;
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        q.qp_access_flags = AccessFlags::from_bits(a.qp_access_flags).ok_or(libc::EINVAL)?;
    }
    if mask.contains(QpAttrMask::AV) {
        q.ah_attr = ah_attr_from(&a.ah_attr)?;
    }
    Ok((q, mask))
}

/// An all-zero address vector (the alternate path, which remem does not keep).
fn no_ah_attr() -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: [0; 16] },
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 0,
            traffic_class: 0,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 0,
        port_num: 0,
    }
}

/// remem's QP attributes to `ibv_qp_attr` (every field; no alternate path).
pub(crate) fn qp_attr_to(q: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: q.qp_state as ibv_qp_state,
        cur_qp_state: q.cur_qp_state as ibv_qp_state,
        path_mtu: q.path_mtu as ibv_mtu,
        path_mig_state: IBV_MIG_MIGRATED,
        qkey: q.qkey,
        rq_psn: q.rq_psn,
        sq_psn: q.sq_psn,
        dest_qp_num: q.dest_qp_num,
        qp_access_flags: q.qp_access_flags.bits(),
        cap: cap_to(&q.cap),
        ah_attr: ah_attr_to(&q.ah_attr),
        alt_ah_attr: no_ah_attr(),
        pkey_index: q.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: u8::from(q.en_sqd_async_notify),
        sq_draining: u8::from(q.sq_draining),
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        min_rnr_timer: q.min_rnr_timer,
        port_num: q.port_num,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    }
}

/// The CQs and SRQ `ibv_qp_init_attr` names (the FFI layer resolves them): a NULL CQ is
/// EINVAL.
pub(crate) type Queues<'a> = Result<(&'a CqInner, &'a CqInner, Option<&'a SrqInner>), c_int>;

/// Creates a QP object from `init` on `pd` (`ibv_create_qp`, and `ibv_create_qp_ex` with
/// `wr_api` when it asked for the `ibv_wr_*` API): `queues` are `init`'s CQs and SRQ.
/// Writes the granted queue sizes back into `init.cap`; the pointer the program holds.
pub(crate) fn create(
    pd: Option<&Arc<PdInner>>,
    init: &mut ibv_qp_init_attr,
    queues: Queues<'_>,
    wr_api: bool,
) -> Result<*mut ibv_qp, c_int> {
    let p = pd.ok_or(libc::EINVAL)?;
    let qp_type = qp_type_from(init.qp_type)?;
    let ctx = &p.ctx;
    let (scq, rcq, srq) = queues?;
    if !Arc::ptr_eq(&scq.ctx, ctx)
        || !Arc::ptr_eq(&rcq.ctx, ctx)
        || srq.is_some_and(|s| !Arc::ptr_eq(&s.ctx, ctx))
    {
        return Err(libc::EINVAL);
    }
    let qp =
        p.pd.create_qp(&QpInitAttr {
            qp_type,
            send_cq: Arc::clone(&scq.cq),
            recv_cq: Arc::clone(&rcq.cq),
            srq: srq.map(|s| Arc::clone(&s.srq)),
            cap: cap_from(&init.cap),
            sq_sig_all: init.sq_sig_all != 0,
        })
        .map_err(|e| e.errno())?;
    let cap = qp.cap();
    let send = SendPath::new(&p.pd, &cap)?;
    let qp_num = qp.qp_num();
    let base = ibv_qp {
        context: ctx.ibv_context(),
        qp_context: init.qp_context,
        pd: p.ibv_pd(),
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        handle: qp_num,
        qp_num,
        state: IBV_QPS_RESET,
        qp_type: init.qp_type,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        events_completed: 0,
    };
    let raw = into_abi(Qp {
        abi: crate::ffi::queues::qp_ex_abi(base),
        wr_flush: Some(crate::ffi::queues::wr_flush),
        inner: QpInner {
            qp,
            qp_type,
            cap,
            sq_sig_all: init.sq_sig_all != 0,
            wr_api,
            ctx: Arc::clone(ctx),
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            send,
            _pd: p.hold(),
        },
    });
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    ctx.register_qp(qp_num, raw.cast());
    init.cap = cap_to(&cap);
    Ok(raw)
}

/// Destroys the QP's library side before the box is freed: waits until the program has
/// acked every async event about it, and releases its hold on its CQs and SRQ.
pub(crate) fn release(q: &QpInner) {
    q.ctx.unregister_qp(q.qp.qp_num());
    let (scq, rcq, srq) = q.queues();
    for c in [scq, rcq].into_iter().flatten() {
        c.users.fetch_sub(1, Ordering::AcqRel);
    }
    if let Some(s) = srq {
        s.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `ibv_modify_qp`: 0 or the errno (EINVAL for a transition or attribute remem refuses).
pub(crate) fn modify(qp: Handle<'_, Qp>, a: &ibv_qp_attr, attr_mask: c_int) -> c_int {
    let q = qp.inner();
    let (mut attr, mask) = match qp_attr_from(a, attr_mask) {
        Ok(x) => x,
        Err(e) => return e,
    };
    if mask.contains(QpAttrMask::AV) {
        // The program's GID index names remem's entry through the context's map.
        match q.ctx.soft_gid_index(attr.ah_attr.sgid_index) {
            Some(i) => attr.ah_attr.sgid_index = i,
            None => return libc::EINVAL,
        }
    }
    match q.qp.modify(&attr, mask) {
        Ok(()) => {
            qp.set_state(q.qp.state());
            0
        }
        Err(e) => e.errno(),
    }
}

/// `ibv_query_qp`: every attribute, and the creation attributes.
pub(crate) fn query(
    qp: Handle<'_, Qp>,
    attr: &mut MaybeUninit<ibv_qp_attr>,
    init_attr: &mut MaybeUninit<ibv_qp_init_attr>,
) -> c_int {
    let q = qp.inner();
    let mut now = match q.qp.query() {
        Ok(a) => a,
        Err(e) => return e.errno(),
    };
    // remem's GID index as the program numbers it.
    now.ah_attr.sgid_index = q.ctx.program_gid_index(now.ah_attr.sgid_index).unwrap_or(0);
    qp.set_state(now.qp_state);
    attr.write(qp_attr_to(&now));
    init_attr.write(qp.init_attr());
    0
}

/// `ibv_attach_mcast`: 0 or the errno.
pub(crate) fn attach_mcast(q: &QpInner, gid: &ibv_gid, lid: u16) -> c_int {
    q.qp.attach_mcast(&crate::ffi::gid(gid), lid)
        .err()
        .map_or(0, |e| e.errno())
}

/// `ibv_detach_mcast`: 0 or the errno.
pub(crate) fn detach_mcast(q: &QpInner, gid: &ibv_gid, lid: u16) -> c_int {
    q.qp.detach_mcast(&crate::ffi::gid(gid), lid)
        .err()
        .map_or(0, |e| e.errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero_attr() -> ibv_qp_attr {
        crate::ffi::zeroed()
    }

    #[test]
    fn modify_attr_mapping() {
        let mut a = zero_attr();
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = 0x12_3456;
        a.rq_psn = 77;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: [9; 16] };
        a.ah_attr.grh.sgid_index = 0;
        let mask = (IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER) as c_int;
        let (q, m) = qp_attr_from(&a, mask).unwrap();
        assert_eq!(m, QpAttrMask::RC_TO_RTR);
        assert_eq!(q.qp_state, QpState::Rtr);
        assert_eq!(q.path_mtu, Mtu::Mtu4096);
        assert_eq!((q.dest_qp_num, q.rq_psn), (0x12_3456, 77));
        assert_eq!(q.ah_attr.dgid.0, [9; 16]);
        let back = qp_attr_to(&q);
        assert_eq!((back.qp_state, back.path_mtu), (IBV_QPS_RTR, IBV_MTU_4096));
        assert_eq!(back.dest_qp_num, 0x12_3456);

        // RoCE needs a GRH.
        a.ah_attr.is_global = 0;
        assert_eq!(qp_attr_from(&a, mask).unwrap_err(), libc::EINVAL);
        // An unknown state, MTU, access bit or mask bit.
        let mut b = zero_attr();
        b.qp_state = IBV_QPS_UNKNOWN;
        assert_eq!(
            qp_attr_from(&b, IBV_QP_STATE as c_int).unwrap_err(),
            libc::EINVAL
        );
        b.path_mtu = 6;
        assert_eq!(
            qp_attr_from(&b, IBV_QP_PATH_MTU as c_int).unwrap_err(),
            libc::EINVAL
        );
        b.qp_access_flags = 1 << 30;
        assert_eq!(
            qp_attr_from(&b, IBV_QP_ACCESS_FLAGS as c_int).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(qp_attr_from(&b, 1 << 22).unwrap_err(), libc::EINVAL);
        // Fields outside the mask are not checked.
        assert!(qp_attr_from(&b, IBV_QP_QKEY as c_int).is_ok());
    }

    #[test]
    fn qp_types() {
        assert_eq!(qp_type_from(IBV_QPT_RC), Ok(QpType::Rc));
        assert_eq!(qp_type_from(IBV_QPT_UD), Ok(QpType::Ud));
        assert_eq!(qp_type_from(IBV_QPT_XRC_SEND), Err(libc::EOPNOTSUPP));
        assert_eq!(qp_type_from(1), Err(libc::EINVAL));
    }
}
