//! `rdma_create_id` and `rdma_destroy_id`.

#![allow(unsafe_code)]

use super::*;

/// `rdma_create_id`: a new id on `channel` (NULL: synchronous). -1 with errno: EINVAL
/// (NULL `id`, unknown port space), ENODEV (no devices).
///
/// # Safety
///
/// `channel` is NULL or a live channel; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard_neg("rdma_create_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let ps = match devices::port_space(ps) {
            Ok(ps) => ps,
            Err(e) => return fail(e),
        };
        // SAFETY: by the contract.
        let chan = unsafe { crate::ffi::rdmacm::program_channel(channel) };
        match create_id(chan, context, ps, qp_type_of(ps)) {
            Ok(p) => {
                // SAFETY: non-NULL and writable by the contract.
                unsafe { id.write(p) };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// Destroys an id (see the module documentation).
///
/// # Safety
///
/// `id` is a live id of this library, not used afterwards.
pub(crate) unsafe fn destroy(id: *mut rdma_cm_id) {
    // SAFETY: by the contract.
    let Some(shared) = (unsafe { id_from(id) }).cloned() else {
        return;
    };
    let (cms, purged) = {
        let mut routes = router::routes();
        let mut st = shared.state();
        for (_, c) in &st.cm {
            routes.remove(&c.handle());
        }
        let purged = st.channel.take_for(&shared);
        // The new ids of connection requests never handed out: unregister them now,
        // free them below.
        for p in &purged {
            if let Some(c) = p.child {
                // SAFETY: a child id made by the router, not yet the program's.
                if let Some(cs) = unsafe { id_from(c as *mut rdma_cm_id) } {
                    for (_, cm) in &cs.state().cm {
                        routes.remove(&cm.handle());
                    }
                }
            }
        }
        (std::mem::take(&mut st.cm), purged)
    };
    for p in purged {
        if let Some(c) = p.child {
            // SAFETY: as above; its CONNECT_REQUEST is gone with `purged`.
            unsafe { free_unseen(c as *mut rdma_cm_id) };
        }
    }
    drop(cms);
    ack_own_event(&shared);
    shared.wait_acked();
    let private = std::mem::take(&mut shared.state().private);
    if private != 0 {
        // SAFETY: the id's own private channel, used by nothing else now.
        unsafe { free_channel(private as *mut rdma_event_channel) };
    }
    // SAFETY: the Box made by `boxed`; the program does not use the id afterwards.
    drop(unsafe { Box::from_raw(id.cast::<RdmaId>()) });
}

/// `rdma_destroy_id`: destroys the id once its events are acked (the program destroys
/// its QP first, as the man page requires). -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_destroy_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: by the contract.
        unsafe { destroy(id) };
        0
    })
}
