//! Options, migration, QP attributes, ECE: `rdma_set_option`, `rdma_migrate_id`,
//! `rdma_init_qp_attr`, `rdma_set_local_ece`, `rdma_get_remote_ece`.

#![allow(unsafe_code)]

use super::*;

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` and `RDMA_OPTION_ID_ACK_TIMEOUT` (a `uint8_t`),
/// `RDMA_OPTION_ID_REUSEADDR` and `RDMA_OPTION_ID_AFONLY` (an `int`) are accepted (the
/// soft device does not use them); `RDMA_OPTION_IB_PATH` is ENOSYS (RoCE resolves its own
/// route); anything else, or a wrong `optlen`, is EINVAL.
///
/// # Safety
///
/// `id` is NULL or a live id; `optval` is NULL or `optlen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard_neg("rdma_set_option", || {
        if id.is_null() || optval.is_null() {
            return fail(libc::EINVAL);
        }
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => 0,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
                if optlen == size_of::<c_int>() =>
            {
                0
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::ENOSYS),
            _ => fail(libc::EINVAL),
        }
    })
}

/// `rdma_migrate_id`: moves the id (and its queued events) to `channel` (NULL: a private
/// channel, making it synchronous), waiting until the events handed out on the old one
/// are acked. -1/EINVAL for a synchronous id asked to stay synchronous.
///
/// # Safety
///
/// `id` is NULL or a live id; `channel` is NULL or a live channel.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard_neg("rdma_migrate_id", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if s.state().sync {
            if channel.is_null() {
                return fail(libc::EINVAL);
            }
            ack_own_event(s);
        }
        let chan = match Chan::of(channel) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let old_private = {
            let _routes = router::routes();
            let mut st = s.state();
            let moved = st.channel.take_for(s);
            for p in moved {
                chan.inner.push(p);
            }
            st.channel = Arc::clone(&chan.inner);
            st.channel_abi = chan.abi;
            st.sync = chan.private != 0;
            std::mem::replace(&mut st.private, chan.private)
        };
        set!(id, channel, chan.abi as *mut rdma_event_channel);
        s.wait_acked();
        if old_private != 0 {
            // SAFETY: the id's former private channel, used by nothing else now.
            unsafe { free_channel(old_private as *mut rdma_event_channel) };
        }
        0
    })
}

/// `rdma_init_qp_attr`: the attributes (and mask) that move the id's QP to
/// `qp_attr->qp_state`, as the CM negotiated them. -1/EINVAL before the id has a device
/// or when the state cannot be reached yet.
///
/// # Safety
///
/// `id` is NULL or a live id; `qp_attr` is NULL or readable and writable; `qp_attr_mask`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard_neg("rdma_init_qp_attr", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { id_from(id) }, unsafe { qp_attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        if qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        let state = match a.qp_state {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            _ => return fail(libc::EINVAL),
        };
        let (dev, cm) = match s.cm() {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let (mut attr, mask) = match cm.init_qp_attr(state) {
            Ok(x) => x,
            Err(e) => return fail(errno_of(&e)),
        };
        // SAFETY: the device's context, open for the life of the process.
        if let Some(c) = unsafe { crate::context::ctx_from(dev.verbs()) } {
            attr.ah_attr.sgid_index = c
                .shared()
                .program_gid_index(attr.ah_attr.sgid_index)
                .unwrap_or(0);
        }
        *a = crate::qp::qp_attr_to(&attr);
        // SAFETY: non-NULL and writable by the contract.
        unsafe { qp_attr_mask.write(mask.bits() as c_int) };
        0
    })
}

/// `rdma_set_local_ece`: kept (no ECE is exchanged here). -1/EINVAL as librdmacm: NULL
/// arguments, an id with a QP, a zero vendor id, a comp_mask.
///
/// # Safety
///
/// `id` is NULL or a live id; `ece` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard_neg("rdma_set_local_ece", || {
        // SAFETY: by the contract.
        let (Some(s), Some(e)) = (unsafe { id_from(id) }, unsafe { ece.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: a live id.
        if !unsafe { (*id).qp }.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
            return fail(libc::EINVAL);
        }
        s.state().local_ece = (e.vendor_id, e.options);
        0
    })
}

/// `rdma_get_remote_ece`: no ECE comes from the peer here (vendor id 0). -1/EINVAL for
/// NULL arguments or an id with a QP.
///
/// # Safety
///
/// `id` is NULL or a live id; `ece` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard_neg("rdma_get_remote_ece", || {
        // SAFETY: by the contract.
        if unsafe { id_from(id) }.is_none() || ece.is_null() || !unsafe { (*id).qp }.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-NULL and writable by the contract.
        unsafe {
            ece.write(ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            })
        };
        0
    })
}
