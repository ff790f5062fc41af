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

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ah::{ah_attr_from, ah_attr_to};
use crate::context::{CtxShared, PdUse, pd_from};
use crate::cq::cq_from;
use crate::ffi::{guard_int, guard_ptr, null_with};
use crate::post::SendPath;
use crate::srq::srq_from;
use core::ffi::c_int;
use remem_verbs::{
    AccessFlags, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;

symver!(
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
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
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

/// The library's side of a program's `*mut ibv_qp` (or `*mut ibv_qp_ex`); `None` for
/// NULL.
///
/// # Safety
///
/// `qp` is NULL or a live QP made by this library; the reference must not outlive it.
pub unsafe fn qp_from<'a>(qp: *mut ibv_qp) -> Option<&'a QpInner> {
    if qp.is_null() {
        return None;
    }
    // SAFETY: by the contract, a non-NULL `qp` is the first field of a boxed `Qp`; the
    // reference covers only the library's part, never the ABI struct.
    Some(unsafe { &(*qp.cast::<Qp>()).inner })
}

/// Sets the `state` the program reads in its `ibv_qp`.
///
/// # Safety
///
/// `qp` is a live QP of this library.
pub(crate) unsafe fn set_state(qp: *mut ibv_qp, state: QpState) {
    // SAFETY: by the contract; written in place, no reference is made.
    unsafe { (&raw mut (*qp).state).write(state as ibv_qp_state) };
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

fn cap_to(c: &QpCap) -> ibv_qp_cap {
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

/// Creates a QP object from `init` on `pd` (`ibv_create_qp`, and `ibv_create_qp_ex` with
/// `wr_api` when it asked for the `ibv_wr_*` API). Writes the granted queue sizes back
/// into `init.cap`.
pub(crate) fn create(
    pd: *mut ibv_pd,
    init: &mut ibv_qp_init_attr,
    wr_api: bool,
) -> Result<*mut Qp, c_int> {
    // SAFETY: the PD pointer comes from the program: NULL or one of this library's.
    let p = unsafe { pd_from(pd) }.ok_or(libc::EINVAL)?;
    let qp_type = qp_type_from(init.qp_type)?;
    let ctx = &p.inner.ctx;
    // SAFETY: the CQ and SRQ pointers come from the program: NULL or this library's.
    let (scq, rcq, srq) = unsafe {
        (
            cq_from(init.send_cq).ok_or(libc::EINVAL)?,
            cq_from(init.recv_cq).ok_or(libc::EINVAL)?,
            srq_from(init.srq),
        )
    };
    if !Arc::ptr_eq(&scq.ctx, ctx)
        || !Arc::ptr_eq(&rcq.ctx, ctx)
        || srq.is_some_and(|s| !Arc::ptr_eq(&s.ctx, ctx))
    {
        return Err(libc::EINVAL);
    }
    let qp = p
        .inner
        .pd
        .create_qp(&QpInitAttr {
            qp_type,
            send_cq: Arc::clone(&scq.cq),
            recv_cq: Arc::clone(&rcq.cq),
            srq: srq.map(|s| Arc::clone(&s.srq)),
            cap: cap_from(&init.cap),
            sq_sig_all: init.sq_sig_all != 0,
        })
        .map_err(|e| e.errno())?;
    let cap = qp.cap();
    let send = SendPath::new(&p.inner.pd, &cap)?;
    let qp_num = qp.qp_num();
    let base = ibv_qp {
        context: ctx.ibv_context(),
        qp_context: init.qp_context,
        pd,
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
    let raw = Box::into_raw(Box::new(Qp {
        abi: crate::qp_ex::abi(base),
        wr_flush: Some(crate::qp_ex::wr_flush),
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
            _pd: p.inner.hold(),
        },
    }));
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    ctx.register_qp(qp_num, raw.cast());
    init.cap = cap_to(&cap);
    Ok(raw)
}

/// `ibv_create_qp`: RC, UC and UD QPs (UC as far as remem's provider has them); writes the
/// granted queue sizes back into `attr.cap`.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp", || {
        // SAFETY: by the contract.
        let Some(init) = (unsafe { attr.as_mut() }) else {
            return null_with(libc::EINVAL);
        };
        match create(pd, init, false) {
            Ok(q) => q.cast(),
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
        let Some(q) = (unsafe { qp_from(qp) }) else {
            return libc::EINVAL;
        };
        q.ctx.unregister_qp(q.qp.qp_num());
        // SAFETY: a QP's CQs and SRQ stay alive while it does (their `users` count it, and
        // destroying them is EBUSY until then).
        unsafe {
            for cq in [q.send_cq, q.recv_cq] {
                if let Some(c) = cq_from(cq) {
                    c.users.fetch_sub(1, Ordering::AcqRel);
                }
            }
            if let Some(s) = srq_from(q.srq) {
                s.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // SAFETY: the Box made in `create`; the program no longer uses it.
        drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
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
        let (Some(q), Some(a)) = (unsafe { qp_from(qp) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
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
                // SAFETY: `qp` is live by the contract.
                unsafe { set_state(qp, q.qp.state()) };
                0
            }
            Err(e) => e.errno(),
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
        let Some(q) = (unsafe { qp_from(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let mut now = match q.qp.query() {
            Ok(a) => a,
            Err(e) => return e.errno(),
        };
        // remem's GID index as the program numbers it.
        now.ah_attr.sgid_index = q.ctx.program_gid_index(now.ah_attr.sgid_index).unwrap_or(0);
        // SAFETY: `qp` is live; its program-visible fields are read in place; the
        // out-pointers are writable by the contract.
        unsafe {
            set_state(qp, now.qp_state);
            attr.write(qp_attr_to(&now));
            init_attr.write(ibv_qp_init_attr {
                qp_context: (*qp).qp_context,
                send_cq: (*qp).send_cq,
                recv_cq: (*qp).recv_cq,
                srq: (*qp).srq,
                cap: cap_to(&q.cap),
                qp_type: (*qp).qp_type,
                sq_sig_all: c_int::from(q.sq_sig_all),
            });
        }
        0
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
        match unsafe { mcast_args(qp, gid) } {
            Some((q, mgid)) => q.qp.attach_mcast(&mgid, lid).err().map_or(0, |e| e.errno()),
            None => libc::EINVAL,
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
        match unsafe { mcast_args(qp, gid) } {
            Some((q, mgid)) => q.qp.detach_mcast(&mgid, lid).err().map_or(0, |e| e.errno()),
            None => libc::EINVAL,
        }
    })
}

/// The QP and the GID of an attach or detach (None: a NULL or foreign pointer).
///
/// # Safety
///
/// `qp` and `gid` are NULL or valid, as verbs.h documents.
unsafe fn mcast_args<'a>(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
) -> Option<(&'a QpInner, remem_verbs::Gid)> {
    // SAFETY: by the contract.
    let q = unsafe { qp_from(qp) }?;
    if gid.is_null() {
        return None;
    }
    // SAFETY: non-NULL and valid by the contract; a GID is 16 plain bytes.
    let raw = unsafe { (*gid).raw };
    Some((q, remem_verbs::Gid(raw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero_attr() -> ibv_qp_attr {
        // SAFETY: all-zero is a valid `ibv_qp_attr` (integers and a GID union).
        unsafe { std::mem::zeroed() }
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
