//! Synchronous endpoints: `rdma_get_request`, `rdma_create_ep`, `rdma_destroy_ep`.

#![allow(unsafe_code)]

use super::*;

/// `rdma_get_request`: the next connection request of a synchronous listener (waiting
/// for one); the new id holds the request in `id->event` and, for an endpoint made with
/// QP attributes, a QP. -1 with errno: EINVAL (not synchronous, another event),
/// ECONNREFUSED, or the event's status.
///
/// # Safety
///
/// `listen` is NULL or a live id; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard_neg("rdma_get_request", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(listen) }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let (sync, channel, ep) = {
            let st = s.state();
            (st.sync, Arc::clone(&st.channel), st.ep)
        };
        if !sync {
            return fail(libc::EINVAL);
        }
        ack_own_event(s);
        let ev = loop {
            match channel.wait() {
                Ok(p) => {
                    if let Some(ev) = hand_out(p) {
                        break ev;
                    }
                }
                Err(e) => return fail(e),
            }
        };
        // SAFETY: the event just handed out.
        let (kind, status, child) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let err = match (kind, status) {
            (RDMA_CM_EVENT_REJECTED, _) => Some(libc::ECONNREFUSED),
            (_, s) if s != 0 => Some(s.abs()),
            (RDMA_CM_EVENT_CONNECT_REQUEST, _) => None,
            _ => Some(libc::EINVAL),
        };
        if let Some(e) = err {
            s.handle().set_event(ev);
            return fail(e);
        }
        if let Some(ep) = ep {
            let mut attr = ep.init;
            // SAFETY: a live id; reading the PD the endpoint was given.
            let pd = unsafe { (*listen).pd };
            // SAFETY: the new id (live), the listener's PD and a local attribute copy.
            let r = unsafe { crate::rdmacm::qp::remem_ibv_rdma_create_qp(child, pd, &mut attr) };
            if r != 0 {
                let e = crate::ffi::errno();
                s.handle().set_event(ev);
                return fail(e);
            }
        }
        // SAFETY: the new id, live, handed out in the event.
        if let Some(c) = unsafe { crate::ffi::handles::Handle::<RdmaId>::from_abi(child) } {
            c.set_event(ev);
        }
        // SAFETY: non-NULL and writable by the contract.
        unsafe { id.write(child) };
        0
    })
}

/// `rdma_create_ep`: a synchronous id for `res` (from `rdma_getaddrinfo`): passive
/// (`RAI_PASSIVE`), bound to `res->ai_src_addr`, keeping `pd` and `qp_init_attr` for the
/// QPs of its connections; active, with the address and route resolved and (given
/// `qp_init_attr`) a QP. -1 with errno.
///
/// # Safety
///
/// `id` is NULL or writable; `res` is NULL or a valid `rdma_addrinfo`; `pd` is NULL or
/// a live PD; `qp_init_attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_ep", || {
        // SAFETY: by the contract.
        let Some(r) = (unsafe { res.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let ps = match u32::try_from(r.ai_port_space)
            .map_err(|_| libc::EINVAL)
            .and_then(devices::port_space)
        {
            Ok(ps) => ps,
            Err(e) => return fail(e),
        };
        let qp_type = if r.ai_qp_type == 0 {
            qp_type_of(ps)
        } else {
            r.ai_qp_type as ibv_qp_type
        };
        let cm_id = match create_id(None, std::ptr::null_mut(), ps, qp_type) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        // SAFETY: the id just made.
        let rc = unsafe { setup_ep(cm_id, r, pd, qp_init_attr) };
        if rc != 0 {
            let e = crate::ffi::errno();
            // SAFETY: the id just made, never the program's.
            unsafe { remem_ibv_rdma_destroy_ep(cm_id) };
            return fail(e);
        }
        // SAFETY: non-NULL and writable by the contract.
        unsafe { id.write(cm_id) };
        0
    })
}

/// The rest of `rdma_create_ep` on the new id.
///
/// # Safety
///
/// As `rdma_create_ep`; `id` is the new id.
pub(super) unsafe fn setup_ep(
    id: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the new id, live.
    let Some(s) = (unsafe { id_from(id) }) else {
        return fail(libc::EINVAL);
    };
    if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: the program's addrinfo (a socket address or NULL).
        let Some(a) = (unsafe { sockaddr_to_std(r.ai_src_addr) }) else {
            return fail(libc::EINVAL);
        };
        if let Err(e) = bind(s, a) {
            return fail(e);
        }
        if !pd.is_null() {
            s.handle().set_pd(pd);
        }
        // SAFETY: NULL or readable by the contract.
        if let Some(init) = unsafe { qp_init_attr.as_ref() } {
            let mut init = *init;
            init.qp_type = s.qp_type;
            s.state().ep = Some(EpAttr { init });
        }
        return 0;
    }
    // SAFETY: the program's addrinfo (socket addresses or NULL).
    let (src, dst) = unsafe {
        (
            sockaddr_to_std(r.ai_src_addr),
            sockaddr_to_std(r.ai_dst_addr),
        )
    };
    let Some(dst) = dst else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = resolve_addr(s, src, dst, Duration::from_millis(2000)) {
        return fail(e);
    }
    if complete(s) != 0 {
        return -1;
    }
    match s.cm().and_then(|(_, cm)| {
        cm.resolve_route(Duration::from_millis(2000))
            .map_err(|e| errno_of(&e))
    }) {
        Ok(()) => {
            if complete(s) != 0 {
                return -1;
            }
        }
        Err(e) => return fail(e),
    }
    // SAFETY: NULL or readable and writable by the contract.
    if let Some(init) = unsafe { qp_init_attr.as_mut() } {
        init.qp_type = s.qp_type;
        // SAFETY: the live id, the program's PD or NULL, its attributes.
        return unsafe { crate::rdmacm::qp::remem_ibv_rdma_create_qp(id, pd, init) };
    }
    0
}

/// `rdma_destroy_ep`: destroys the endpoint's QP and SRQ (and the CQs made for them),
/// then the id.
///
/// # Safety
///
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_ep(id: *mut rdma_cm_id) {
    crate::ffi::guard(
        "rdma_destroy_ep",
        || (),
        || {
            if id.is_null() {
                return;
            }
            // SAFETY: a live id by the contract.
            unsafe {
                if !(*id).qp.is_null() {
                    crate::rdmacm::qp::remem_ibv_rdma_destroy_qp(id);
                }
                if !(*id).srq.is_null() {
                    crate::rdmacm::qp::remem_ibv_rdma_destroy_srq(id);
                }
                if let Some(h) = crate::ffi::handles::Handle::<RdmaId>::from_abi(id) {
                    crate::ffi::rdmacm::destroy_id(h);
                }
            }
        },
    )
}
