//! Connections: `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`,
//! `rdma_establish`, `rdma_notify`. The entry points are in `crate::ffi::rdmacm`.

#![forbid(unsafe_code)]

use super::*;
use crate::ffi::handles::Handle;

/// The connection parameters of `rdma_connect` / `rdma_accept` (librdmacm's defaults and
/// checks: responder resources and initiator depth within the device's limits,
/// `RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH` meaning "as many as the device allows").
pub(super) fn make_conn_param(
    id: &IdShared,
    dev: &CmDev,
    arg: Option<ConnArg<'_>>,
    accepting: bool,
) -> Result<ConnParam, c_int> {
    let qp = id.handle().qp();
    let tcp = id.ps == PortSpace::Tcp;
    if tcp && qp.is_none() && arg.is_none() {
        return Err(libc::EINVAL);
    }
    let req = id.state().req;
    let (max_rr, max_id) = (dev.max_responder_resources, dev.max_initiator_depth);
    let mut out = ConnParam {
        responder_resources: if accepting {
            req.initiator_depth.min(max_rr)
        } else {
            max_rr
        },
        initiator_depth: if accepting {
            req.responder_resources.min(max_id)
        } else {
            max_id
        },
        ..ConnParam::default()
    };
    if let Some(ConnArg {
        param: c,
        private_data,
    }) = arg
    {
        if tcp
            && ((c.responder_resources != RDMA_MAX_RESP_RES && c.responder_resources > max_rr)
                || (c.initiator_depth != RDMA_MAX_INIT_DEPTH && c.initiator_depth > max_id))
        {
            return Err(libc::EINVAL);
        }
        if c.responder_resources != RDMA_MAX_RESP_RES {
            out.responder_resources = c.responder_resources;
        }
        if c.initiator_depth != RDMA_MAX_INIT_DEPTH {
            out.initiator_depth = c.initiator_depth;
        }
        out.flow_control = c.flow_control != 0;
        out.retry_count = c.retry_count.min(7);
        out.rnr_retry_count = c.rnr_retry_count.min(7);
        out.srq = c.srq != 0;
        out.qp_num = c.qp_num;
        out.private_data = private_data.to_vec();
    }
    if let Some(q) = qp {
        out.qp_num = q.inner().qp.qp_num();
        out.srq = !q.init_attr().srq.is_null();
    }
    Ok(out)
}

/// The program's `rdma_conn_param`, as the FFI layer read it: the struct and the
/// `private_data_len` bytes its `private_data` points to (none for NULL).
#[derive(Clone, Copy)]
pub(crate) struct ConnArg<'a> {
    /// The parameters.
    pub param: &'a rdma_conn_param,
    /// Their private data.
    pub private_data: &'a [u8],
}

/// What `rdma_connect` and `rdma_accept` share: the id's connection parameters from
/// `arg` (accepting or not), and `call` (the CM's connect or accept) made with them.
fn with_conn_param(
    s: &IdShared,
    arg: Option<ConnArg<'_>>,
    accepting: bool,
    call: impl FnOnce(&dyn CmId, &ConnParam) -> remem_verbs::Result<()>,
) -> Result<(), c_int> {
    let (dev, cm) = s.cm()?;
    let prm = make_conn_param(s, &dev, arg, accepting)?;
    call(&*cm, &prm).map_err(|e| errno_of(&e))
}

/// `rdma_connect` once the FFI layer has its arguments: requests a connection (a UD
/// service resolution in the UDP port space); a synchronous id waits until it is
/// established. -1 with errno: EINVAL (no route, bad parameters), ECONNREFUSED
/// (rejected), ETIMEDOUT (unreachable), ...
pub(crate) fn connect(s: &Arc<IdShared>, arg: Option<ConnArg<'_>>) -> c_int {
    match with_conn_param(s, arg, false, |cm, prm| cm.connect(prm)) {
        Ok(()) => complete(s),
        Err(e) => fail(e),
    }
}

/// `rdma_accept` once the FFI layer has its arguments: accepts the connection request of
/// this id (no parameters: the request's, within the device's limits); a synchronous id
/// waits until the connection is established (in the UDP port space it does not wait, as
/// librdmacm).
pub(crate) fn accept(s: &Arc<IdShared>, arg: Option<ConnArg<'_>>) -> c_int {
    if let Err(e) = with_conn_param(s, arg, true, |cm, prm| cm.accept(prm)) {
        return fail(e);
    }
    if s.qp_type == IBV_QPT_UD {
        if s.state().sync {
            ack_own_event(s);
        }
        return 0;
    }
    complete(s)
}

/// `rdma_reject` (and `rdma_reject_ece`) once the FFI layer has read the private data:
/// rejects the connection request of this id (the peer sees `RDMA_CM_EVENT_REJECTED`,
/// status 28: consumer reject).
pub(crate) fn reject(s: &IdShared, private_data: &[u8]) -> c_int {
    match s
        .cm()
        .and_then(|(_, cm)| cm.reject(private_data).map_err(|e| errno_of(&e)))
    {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `rdma_disconnect` once the FFI layer has the id: disconnects (the QP moves to ERR,
/// both sides get `RDMA_CM_EVENT_DISCONNECTED`); a synchronous id waits for its event. As
/// on kernel rdma_cm, what the program posted before the call reaches the peer (the
/// provider sends it before the QP moves to ERR), and the DREQ has left when the call
/// returns, so a program may destroy everything and exit at once
/// (`tests/teardown_c.rs`).
pub(crate) fn disconnect(s: &Arc<IdShared>) -> c_int {
    match s
        .cm()
        .and_then(|(_, cm)| cm.disconnect().map_err(|e| errno_of(&e)))
    {
        Ok(()) => {
            refresh_qp_state(s);
            complete(s)
        }
        Err(e) => {
            // The provider refuses because the connection is already going down: the
            // peer's disconnection crossed ours (both ends of rdma_server/rdma_client
            // disconnect). librdmacm's kernel answers that with success (it sends the
            // reply); so does this library, and a synchronous id waits for the
            // DISCONNECTED event on its way, unless it had it already.
            let (connected, disconnected, sync) = {
                let st = s.state();
                (st.connected, st.disconnected, st.sync)
            };
            if !connected {
                return fail(e);
            }
            refresh_qp_state(s);
            if sync && !disconnected {
                return complete(s);
            }
            0
        }
    }
}

/// `rdma_establish` once the FFI layer has the id: completes a connection whose QP the
/// program manages, after `RDMA_CM_EVENT_CONNECT_RESPONSE`. -1/EINVAL if the id has a QP.
pub(crate) fn establish(id: Handle<'_, RdmaId>) -> c_int {
    if !id.qp_ptr().is_null() {
        return fail(libc::EINVAL);
    }
    match id
        .inner()
        .cm()
        .and_then(|(_, cm)| cm.establish().map_err(|e| errno_of(&e)))
    {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `rdma_notify` once the FFI layer has the id: `IBV_EVENT_COMM_EST` (data arrived before
/// the connection's last message) is accepted — the CM here completes the connection when
/// that message arrives; other events are EINVAL, as the kernel's CM answers.
pub(crate) fn notify_event(s: &IdShared, event: ibv_event_type) -> c_int {
    if s.cm().is_err() || event != IBV_EVENT_COMM_EST {
        return fail(libc::EINVAL);
    }
    0
}
