//! Connections: `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`,
//! `rdma_establish`, `rdma_notify`.

#![allow(unsafe_code)]

use super::*;

/// The connection parameters of `rdma_connect` / `rdma_accept` (librdmacm's defaults and
/// checks: responder resources and initiator depth within the device's limits,
/// `RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH` meaning "as many as the device allows").
pub(super) fn make_conn_param(
    id: &IdShared,
    dev: &CmDev,
    p: *const rdma_conn_param,
    accepting: bool,
) -> Result<ConnParam, c_int> {
    let ip = id.abi_ptr();
    // SAFETY: a live id; reading the QP pointer the library wrote.
    let qp = unsafe { (*ip).qp };
    // SAFETY: NULL or the program's parameters, readable by the contract.
    let prm = unsafe { p.as_ref() };
    let tcp = id.ps == PortSpace::Tcp;
    if tcp && qp.is_null() && prm.is_none() {
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
    if let Some(c) = prm {
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
        if !c.private_data.is_null() && c.private_data_len > 0 {
            // SAFETY: the program's private data of `private_data_len` bytes.
            out.private_data = unsafe {
                std::slice::from_raw_parts(
                    c.private_data.cast::<u8>(),
                    usize::from(c.private_data_len),
                )
            }
            .to_vec();
        }
    }
    // SAFETY: the id's QP, when it has one, is a live QP of this library.
    if let Some(q) = unsafe { crate::ffi::handles::qp_from(qp) } {
        out.qp_num = q.qp.qp_num();
        // SAFETY: as above; reading its SRQ pointer.
        out.srq = !unsafe { (*qp).srq }.is_null();
    }
    Ok(out)
}

/// What `rdma_connect` and `rdma_accept` share: the id `id` names, its connection
/// parameters from `conn_param` (accepting or not), and `call` (the CM's connect or
/// accept) made with them; the id, or the errno to fail with.
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable.
pub(super) unsafe fn with_conn_param<'a>(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
    accepting: bool,
    call: impl FnOnce(&dyn CmId, &ConnParam) -> remem_verbs::Result<()>,
) -> Result<&'a Arc<IdShared>, c_int> {
    // SAFETY: by the contract.
    let s = unsafe { id_from(id) }.ok_or(libc::EINVAL)?;
    let (dev, cm) = s.cm()?;
    let prm = make_conn_param(s, &dev, conn_param, accepting)?;
    call(&*cm, &prm).map_err(|e| errno_of(&e))?;
    Ok(s)
}

/// `rdma_connect`: requests a connection (a UD service resolution in the UDP port space);
/// a synchronous id waits until it is established. -1 with errno: EINVAL (no route, bad
/// parameters), ECONNREFUSED (rejected), ETIMEDOUT (unreachable), ...
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard_neg("rdma_connect", || {
        // SAFETY: by the contract.
        match unsafe { with_conn_param(id, conn_param, false, |cm, prm| cm.connect(prm)) } {
            Ok(s) => complete(s),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_accept`: accepts the connection request of this id (NULL parameters: the
/// request's, within the device's limits); a synchronous id waits until the connection
/// is established (in the UDP port space it does not wait, as librdmacm).
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard_neg("rdma_accept", || {
        // SAFETY: by the contract.
        let s = match unsafe { with_conn_param(id, conn_param, true, |cm, prm| cm.accept(prm)) } {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        if s.qp_type == IBV_QPT_UD {
            if s.state().sync {
                ack_own_event(s);
            }
            return 0;
        }
        complete(s)
    })
}

pub(super) fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: by the callers' contract.
    let Some(s) = (unsafe { id_from(id) }) else {
        return fail(libc::EINVAL);
    };
    let bytes = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the program's `len` bytes of private data.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
    };
    match s
        .cm()
        .and_then(|(_, cm)| cm.reject(&bytes).map_err(|e| errno_of(&e)))
    {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `rdma_reject`: rejects the connection request of this id with private data (the peer
/// sees `RDMA_CM_EVENT_REJECTED`, status 28: consumer reject).
///
/// # Safety
///
/// `id` is NULL or a live id; `private_data` is NULL or `private_data_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard_neg("rdma_reject", || reject(id, private_data, private_data_len))
}

/// `rdma_reject_ece`: as `rdma_reject` (there is no ECE to refuse here).
///
/// # Safety
///
/// As `rdma_reject`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard_neg("rdma_reject_ece", || {
        reject(id, private_data, private_data_len)
    })
}

/// `rdma_disconnect`: disconnects (the QP moves to ERR, both sides get
/// `RDMA_CM_EVENT_DISCONNECTED`); a synchronous id waits for its event. As on kernel
/// rdma_cm, what the program posted before the call reaches the peer (the provider sends it
/// before the QP moves to ERR), and the DREQ has left when the call returns, so a program
/// may destroy everything and exit at once (`tests/teardown_c.rs`).
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_disconnect", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
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
    })
}

/// `rdma_establish`: completes a connection whose QP the program manages, after
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`. -1/EINVAL if the id has a QP.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_establish", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: a live id; reading the QP pointer.
        if !unsafe { (*id).qp }.is_null() {
            return fail(libc::EINVAL);
        }
        match s
            .cm()
            .and_then(|(_, cm)| cm.establish().map_err(|e| errno_of(&e)))
        {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_notify`: `IBV_EVENT_COMM_EST` (data arrived before the connection's last
/// message) is accepted — the CM here completes the connection when that message
/// arrives; other events are EINVAL, as the kernel's CM answers.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_notify(
    id: *mut rdma_cm_id,
    event: ibv_event_type,
) -> c_int {
    guard_neg("rdma_notify", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if s.cm().is_err() || event != IBV_EVENT_COMM_EST {
            return fail(libc::EINVAL);
        }
        0
    })
}
