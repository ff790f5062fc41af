//! The C entry points of the queue objects (QPs): each converts the program's pointers
//! once ([`super::handles`], [`super::opt_ref`], ...) and calls the safe object module
//! ([`crate::qp`]).

use super::handles::{Handle, free, qp_queues};
use super::{guard_int, guard_ptr, null_with, opt_mut, opt_ref, out};
use crate::abi::*;
use crate::qp::{self, Qp};
use core::ffi::c_int;

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
