//! Provider events turned into `rdma_cm_event`s: the ids of connection requests, what
//! each event does to its id, the synchronous ids' waits.

#![forbid(unsafe_code)]

use super::*;

/// Creates the id of a connection request (the router, with the routes locked): on the
/// listener's device, its channel (a private one if the listener is synchronous), its
/// port space; registered at once so its own events find it. `None` if it cannot be
/// made (the request is then dropped, which rejects it).
pub(crate) fn new_child(
    listener: &Arc<IdShared>,
    ev: &remem_verbs::cm::CmEvent,
    routes: &mut router::Routes,
) -> Option<Unseen> {
    let lst = listener.state();
    let listen_handle = ev.listen_id.as_ref()?.handle();
    let dev = lst
        .cm
        .iter()
        .find(|(_, c)| c.handle() == listen_handle)
        .map(|(d, _)| Arc::clone(d))
        .or_else(|| devices::by_context(&ev.id.context()))?;
    let chan = if lst.sync {
        Chan::private().ok()?
    } else {
        Chan {
            inner: Arc::clone(&lst.channel),
            abi: lst.channel_abi,
            private: 0,
        }
    };
    drop(lst);
    let abi = chan.abi;
    let shared = Arc::new(IdShared::new(listener.ps, listener.qp_type, chan));
    boxed(Arc::clone(&shared), abi, std::ptr::null_mut(), listener.ps);
    {
        let mut st = shared.state();
        if attach_dev(&shared, &mut st, &dev, ev.id.port_num()).is_err() {
            drop(st);
            crate::ffi::rdmacm::free_unseen(Unseen(shared));
            return None;
        }
        st.cm.push((dev, Arc::clone(&ev.id)));
        if let CmEventParam::Conn(c) = &ev.param {
            st.req = *c;
        }
    }
    update_addrs(&shared, &ev.id);
    routes.insert(ev.id.handle(), Arc::downgrade(&shared));
    Some(Unseen(shared))
}

/// Releases what an id no program has seen holds (a connection request dropped before it
/// was handed out): its provider ids are unregistered and dropped (the request is
/// rejected). Its private channel (address; 0 if none), for the FFI layer to free with the
/// id (`crate::ffi::rdmacm::free_unseen`).
pub(crate) fn release_unseen(id: &IdShared) -> usize {
    let (cms, private) = {
        let mut st = id.state();
        (std::mem::take(&mut st.cm), std::mem::take(&mut st.private))
    };
    {
        let mut routes = router::routes();
        for (_, c) in &cms {
            routes.remove(&c.handle());
        }
    }
    drop(cms);
    private
}

/// The program's view of the peer's connection parameters: the peer's initiator depth is
/// what it asks of this side's responder resources, and the other way round.
pub(super) fn conn_to_abi(c: &PeerConnParam) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: c.initiator_depth,
        initiator_depth: c.responder_resources,
        flow_control: u8::from(c.flow_control),
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: u8::from(c.srq),
        qp_num: c.qp_num,
    }
}

/// Turns a queued provider event into the event handed to the program (see
/// [`take_event`]): the pointer the program gets (freed by `rdma_ack_cm_event`).
pub(crate) fn hand_out(p: Pending) -> Option<*mut rdma_cm_event> {
    take_event(p).map(|b| Box::into_raw(b).cast())
}

/// Turns a queued provider event into the event handed to the program, updating the ids
/// it concerns; `None` drops it.
pub(crate) fn take_event(p: Pending) -> Option<Box<Event>> {
    let Pending { target, ev, child } = p;
    let th = target.handle();
    let tp = th.abi();
    let mut out = Box::new(Event {
        abi: crate::ffi::zeroed(),
        private_data: ev.private_data.clone(),
        counted: Arc::clone(&target),
    });
    out.abi.id = tp;
    out.abi.event = ev.kind.value();
    out.abi.status = ev.status;
    match ev.kind {
        CmEventKind::ConnectRequest => {
            // The child becomes the program's with the event.
            let c = child?.0;
            let ch = c.handle();
            ch.set_context(th.context());
            out.abi.id = ch.abi();
            out.abi.listen_id = tp;
        }
        CmEventKind::AddrResolved => {
            if let Ok((_, cm)) = target.cm() {
                update_addrs(&target, &cm);
            }
        }
        CmEventKind::RouteResolved => {
            if let Ok((_, cm)) = target.cm() {
                update_addrs(&target, &cm);
            }
            let mut st = target.state();
            set_path(&target, &mut st);
        }
        CmEventKind::Established | CmEventKind::Disconnected => {
            {
                let mut st = target.state();
                if ev.kind == CmEventKind::Established {
                    st.connected = true;
                } else {
                    st.disconnected = true;
                }
            }
            refresh_qp_state(&target);
        }
        CmEventKind::Rejected | CmEventKind::ConnectError | CmEventKind::Unreachable => {
            refresh_qp_state(&target)
        }
        CmEventKind::MulticastJoin => {
            // librdmacm's `ucma_process_join`: the id's QP (unless a send-only join) is
            // attached to the group as the event is taken; a failure turns the event into
            // MULTICAST_ERROR.
            if let CmEventParam::Ud(u) = &ev.param
                && let Some(join) = find_join(&target, &u.ah_attr.dgid)
                && !join.send_only
                && let Some(qp) = th.qp()
            {
                let gid = ibv_gid {
                    raw: u.ah_attr.dgid.0,
                };
                let r = crate::qp::attach_mcast(qp.inner(), &gid, 0);
                if r != 0 {
                    out.abi.event = CmEventKind::MulticastError.value();
                    out.abi.status = -r;
                } else {
                    notify(&format!("joined {}", u.ah_attr.dgid.to_ip()));
                }
            }
        }
        _ => {}
    }
    let ev_kind = ev.kind;
    let mc_context = match &ev.param {
        CmEventParam::Ud(u) if ev_kind == CmEventKind::MulticastJoin => {
            find_join(&target, &u.ah_attr.dgid).map_or(0, |j| j.context)
        }
        _ => 0,
    };
    // The parameters: `ud` for the datagram port spaces, `conn` otherwise.
    if target.qp_type == IBV_QPT_UD || ev_kind == CmEventKind::MulticastJoin {
        let mut ud: rdma_ud_param = crate::ffi::zeroed();
        if let CmEventParam::Ud(u) = &ev.param {
            ud.qp_num = u.qp_num;
            ud.qkey = u.qkey;
            let mut ah = u.ah_attr;
            if let Some(d) = target.state().dev.as_ref()
                && let Some(c) = d.ctx()
            {
                ah.sgid_index = c.shared().program_gid_index(ah.sgid_index).unwrap_or(0);
            }
            ud.ah_attr = crate::ah::ah_attr_to(&ah);
        }
        out.abi.param.ud = ud;
    } else {
        let conn = match &ev.param {
            CmEventParam::Conn(c) => conn_to_abi(c),
            _ => crate::ffi::zeroed(),
        };
        out.abi.param.conn = conn;
    }
    drop(ev);
    let len = out.private_data.len().min(usize::from(u8::MAX));
    let data = if len == 0 {
        std::ptr::null()
    } else {
        out.private_data.as_ptr().cast::<c_void>()
    };
    // `private_data` and `private_data_len` lie at the same offsets in `conn` and `ud`;
    // write both views.
    if matches!(
        ev_kind,
        CmEventKind::MulticastJoin | CmEventKind::MulticastError
    ) {
        // A join's event carries the join's context, as librdmacm fills it.
        out.abi.param.ud.private_data = mc_context as *const c_void;
        out.abi.param.ud.private_data_len = 0;
    } else if target.qp_type == IBV_QPT_UD {
        out.abi.param.ud.private_data = data;
        out.abi.param.ud.private_data_len = len as u8;
    } else {
        out.abi.param.conn.private_data = data;
        out.abi.param.conn.private_data_len = len as u8;
    }
    target.event_out();
    Some(out)
}

/// A synchronous id's wait for the event of the call just made (`ucma_complete` in
/// librdmacm): acks the previous `id->event`, takes the next event of its private
/// channel into `id->event`, and fails as librdmacm does. 0 at once for an id with a
/// program's channel.
pub(crate) fn complete(id: &Arc<IdShared>) -> c_int {
    let (sync, channel) = {
        let st = id.state();
        (st.sync, Arc::clone(&st.channel))
    };
    if !sync {
        return 0;
    }
    ack_own_event(id);
    let ev = loop {
        match channel.wait() {
            Ok(p) => {
                if let Some(ev) = take_event(p) {
                    break ev;
                }
            }
            Err(e) => return fail(e),
        }
    };
    let (kind, status) = (ev.abi.event, ev.abi.status);
    id.handle().set_event(Box::into_raw(ev).cast());
    match (kind, status) {
        (RDMA_CM_EVENT_REJECTED, _) => fail(libc::ECONNREFUSED),
        (_, s) if s < 0 => fail(-s),
        (_, s) if s > 0 => fail(s),
        (RDMA_CM_EVENT_ADDR_ERROR | RDMA_CM_EVENT_ROUTE_ERROR, _) => fail(libc::EHOSTUNREACH),
        (RDMA_CM_EVENT_UNREACHABLE, _) => fail(libc::ETIMEDOUT),
        (RDMA_CM_EVENT_CONNECT_ERROR, _) => fail(libc::ECONNRESET),
        _ => 0,
    }
}

/// Acks the event a synchronous call left in `id->event`, if any.
pub(super) fn ack_own_event(id: &IdShared) {
    id.handle().ack_own_event();
}
