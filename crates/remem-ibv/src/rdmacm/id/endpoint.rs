//! Synchronous endpoints: `rdma_get_request`, `rdma_create_ep`, `rdma_destroy_ep`. The
//! entry points are in `crate::ffi::rdmacm`, which passes in the QP creation
//! (`rdma_create_qp` on the program's attributes).

#![forbid(unsafe_code)]

use super::*;

/// `rdma_create_qp` as the FFI layer makes it for an endpoint: on the id (live), a PD (the
/// program's, or NULL), attributes (the program's, or a copy): 0, or -1 with errno.
pub(crate) type CreateQp<'f> =
    &'f mut dyn FnMut(*mut rdma_cm_id, *mut ibv_pd, &mut ibv_qp_init_attr) -> c_int;

/// `rdma_get_request` once the FFI layer has the listener: the next connection request of
/// a synchronous listener (waiting for one); the new id holds the request in `id->event`
/// and, for an endpoint made with QP attributes, a QP (`create_qp`). EINVAL (not
/// synchronous, another event), ECONNREFUSED, or the event's status.
pub(crate) fn get_request(
    s: &Arc<IdShared>,
    create_qp: CreateQp<'_>,
) -> Result<*mut rdma_cm_id, c_int> {
    let (sync, channel, ep) = {
        let st = s.state();
        (st.sync, Arc::clone(&st.channel), st.ep)
    };
    if !sync {
        return Err(libc::EINVAL);
    }
    ack_own_event(s);
    let (ev, child) = loop {
        let p = channel.wait()?;
        let child = p.child.as_ref().map(|c| Arc::clone(c.shared()));
        if let Some(ev) = take_event(p) {
            break (ev, child);
        }
    };
    let (kind, status) = (ev.abi.event, ev.abi.status);
    let ev: *mut rdma_cm_event = Box::into_raw(ev).cast();
    let err = match (kind, status) {
        (RDMA_CM_EVENT_REJECTED, _) => Some(libc::ECONNREFUSED),
        (_, s) if s != 0 => Some(s.abs()),
        (RDMA_CM_EVENT_CONNECT_REQUEST, _) => None,
        _ => Some(libc::EINVAL),
    };
    let listen = s.handle();
    let child = match (err, child) {
        (None, Some(c)) => c,
        (e, _) => {
            listen.set_event(ev);
            return Err(e.unwrap_or(libc::EINVAL));
        }
    };
    let ch = child.handle();
    if let Some(ep) = ep {
        let mut attr = ep.init;
        if create_qp(ch.abi(), listen.pd(), &mut attr) != 0 {
            let e = crate::ffi::errno();
            listen.set_event(ev);
            return Err(e);
        }
    }
    ch.set_event(ev);
    Ok(ch.abi())
}

/// The program's `rdma_addrinfo` and attributes for `rdma_create_ep`, as the FFI layer
/// read them.
pub(crate) struct EpArgs<'a> {
    /// The addrinfo.
    pub ai: &'a rdma_addrinfo,
    /// Its `ai_src_addr`.
    pub src: Option<SocketAddr>,
    /// Its `ai_dst_addr`.
    pub dst: Option<SocketAddr>,
    /// The program's PD (or NULL).
    pub pd: *mut ibv_pd,
    /// The program's QP attributes.
    pub init: Option<&'a mut ibv_qp_init_attr>,
}

/// `rdma_create_ep` once the FFI layer has read its arguments: a synchronous id for `res`
/// (from `rdma_getaddrinfo`): passive (`RAI_PASSIVE`), bound to `res->ai_src_addr`,
/// keeping `pd` and `qp_init_attr` for the QPs of its connections; active, with the
/// address and route resolved and (given `qp_init_attr`) a QP (`create_qp`). On failure
/// the new id is left to `destroy_ep`.
pub(crate) fn create_ep(
    args: EpArgs<'_>,
    create_qp: CreateQp<'_>,
    destroy_ep: impl FnOnce(*mut rdma_cm_id),
) -> Result<*mut rdma_cm_id, c_int> {
    let r = args.ai;
    let ps = u32::try_from(r.ai_port_space)
        .map_err(|_| libc::EINVAL)
        .and_then(devices::port_space)?;
    let qp_type = if r.ai_qp_type == 0 {
        qp_type_of(ps)
    } else {
        r.ai_qp_type as ibv_qp_type
    };
    let s = new_id(None, std::ptr::null_mut(), ps, qp_type)?;
    let cm_id = s.abi_ptr();
    if setup_ep(&s, args, create_qp) != 0 {
        let e = crate::ffi::errno();
        destroy_ep(cm_id);
        return Err(e);
    }
    Ok(cm_id)
}

/// The rest of `rdma_create_ep` on the new id `s`: 0, or -1 with errno.
fn setup_ep(s: &Arc<IdShared>, args: EpArgs<'_>, create_qp: CreateQp<'_>) -> c_int {
    let r = args.ai;
    let pd = args.pd;
    if r.ai_flags & RAI_PASSIVE != 0 {
        let Some(a) = args.src else {
            return fail(libc::EINVAL);
        };
        if let Err(e) = bind(s, a) {
            return fail(e);
        }
        if !pd.is_null() {
            s.handle().set_pd(pd);
        }
        if let Some(init) = args.init {
            let mut init = *init;
            init.qp_type = s.qp_type;
            s.state().ep = Some(EpAttr { init });
        }
        return 0;
    }
    let Some(dst) = args.dst else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = resolve_addr(s, args.src, dst, Duration::from_millis(2000)) {
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
    if let Some(init) = args.init {
        init.qp_type = s.qp_type;
        return create_qp(s.abi_ptr(), pd, init);
    }
    0
}
