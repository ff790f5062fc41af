//! Options, migration, QP attributes, ECE: `rdma_set_option`, `rdma_migrate_id`,
//! `rdma_init_qp_attr`, `rdma_set_local_ece`, `rdma_get_remote_ece`.

#![forbid(unsafe_code)]

use super::*;
use crate::ffi::handles::Handle;
use core::mem::MaybeUninit;

/// `rdma_migrate_id` once the FFI layer has the id and the channel (`None`: NULL; an
/// error: a destroyed one): moves it and its queued events to
/// `channel` (NULL: a private channel, making it synchronous; -1/EINVAL for a synchronous
/// id asked to stay synchronous), waiting until the events handed out on the old one are
/// acked. The old private channel (address; 0 if none), for the FFI layer to free.
pub(crate) fn migrate(
    id: Handle<'_, RdmaId>,
    channel: Option<Result<Chan, c_int>>,
) -> Result<usize, c_int> {
    let s = id.inner();
    if s.state().sync {
        if channel.is_none() {
            return Err(libc::EINVAL);
        }
        ack_own_event(s);
    }
    let chan = match channel {
        Some(c) => c?,
        None => Chan::private()?,
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
    id.set_channel(chan.abi as *mut rdma_event_channel);
    s.wait_acked();
    Ok(old_private)
}

/// `rdma_init_qp_attr` once the FFI layer has its arguments: the attributes (and mask)
/// that move the id's QP to `qp_attr->qp_state`, as the CM negotiated them. -1/EINVAL
/// before the id has a device or when the state cannot be reached yet.
pub(crate) fn init_qp_attr(
    s: &IdShared,
    a: &mut ibv_qp_attr,
    mask_out: &mut MaybeUninit<c_int>,
) -> c_int {
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
    if let Some(c) = dev.ctx() {
        attr.ah_attr.sgid_index = c
            .shared()
            .program_gid_index(attr.ah_attr.sgid_index)
            .unwrap_or(0);
    }
    *a = crate::qp::qp_attr_to(&attr);
    mask_out.write(mask.bits() as c_int);
    0
}

/// `rdma_set_local_ece`: kept (no ECE is exchanged here). -1/EINVAL as librdmacm: an id
/// with a QP, a zero vendor id, a comp_mask.
pub(crate) fn set_local_ece(id: Handle<'_, RdmaId>, e: &ibv_ece) -> c_int {
    if !id.qp_ptr().is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
        return fail(libc::EINVAL);
    }
    id.inner().state().local_ece = (e.vendor_id, e.options);
    0
}
