//! RDMA CM (librdmacm) connection setup for this provider's RC QPs: the alternative to
//! exchanging QP numbers, PSNs and GIDs over a TCP connection of one's own. It speaks the
//! IBTA CM protocol, so its peer may be any RDMA CM program (`rdma_server`,
//! `rdma_client`, rping, …) as well as another remem.
//!
//! The QP stays the caller's, in librdmacm's "external QP" style: created (in RESET) on
//! an [`IbContext`](crate::IbContext) of the device the connection goes through —
//! [`CmConnector::device`] once the address is resolved, [`CmRequest::device`] for a
//! request — and moved to INIT (by `init_qp`, to post receives first, or by
//! `connect`/`accept`), RTR and RTS here, with the attributes the CM computes
//! (port, P_Key, path MTU, PSNs, address vector, remote QP number) and the read/atomic
//! depths of [`CmOptions`] as negotiated with the peer.
//!
//! ```text
//! server: CmListener::bind(addr) → get_request() → [create the QP on request.device()]
//!         → request.accept(qp) → CmConnection
//! client: CmConnector::resolve(addr) → [create the QP on connector.device()]
//!         → connector.connect(qp) → CmConnection
//! ```
//!
//! Every step is bounded by [`CmOptions::timeout`] (or the timeout given). Without
//! librdmacm the calls fail with an [`Error`] (`EOPNOTSUPP`); nothing panics.

use crate::sys::{self, CmChannel, CmEvent, CmId, ConnParam, cm_event};
use crate::{IbQp, from_raw_qp_attr, io_err, own};
use remem_verbs::{Error, QpAttrMask, QpState, QpType, QueuePair, Result};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a connection is set up.
#[derive(Debug, Clone)]
pub struct CmOptions {
    /// Private data sent with the request (at most 56 bytes) or the reply (at most 196).
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics this side serves in flight for the peer (its QP's
    /// `max_dest_rd_atomic`; the device's `max_qp_rd_atom` at most).
    pub responder_resources: u8,
    /// RDMA READs and atomics this side keeps in flight towards the peer (its QP's
    /// `max_rd_atomic`, lowered to the peer's responder resources).
    pub initiator_depth: u8,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7; 7 = without end).
    pub rnr_retry_count: u8,
    /// Bound on each step: address and route resolution, the peer's reply, the
    /// connection's establishment.
    pub timeout: Duration,
}

impl Default for CmOptions {
    fn default() -> Self {
        CmOptions {
            private_data: Vec::new(),
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Most private data in a connection request (IBTA CM REQ).
pub const MAX_REQUEST_PRIVATE_DATA: usize = 56;
/// Most private data in a reply (IBTA CM REP).
pub const MAX_REPLY_PRIVATE_DATA: usize = 196;

fn cm_err(what: &str, e: io::Error) -> Error {
    io_err(what, e)
}

fn failed(kind: io::ErrorKind, msg: String) -> Error {
    Error::Io(io::Error::new(kind, msg))
}

/// Waits for the next event on `chan` until `deadline`.
fn next_event(chan: &Arc<CmChannel>, deadline: Instant, what: &str) -> Result<CmEvent> {
    loop {
        if let Some(ev) = chan
            .try_event()
            .map_err(|e| cm_err("rdma_get_cm_event", e))?
        {
            return Ok(ev);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failed(
                io::ErrorKind::TimedOut,
                format!("RDMA CM: no answer while waiting for {what}"),
            ));
        }
        sys::wait_readable(chan.fd(), left).map_err(|e| cm_err("poll", e))?;
    }
}

/// Waits for `want` on `id`; any other event of `id` is the failure it names.
fn expect(id: &CmId, want: u32, deadline: Instant, what: &str) -> Result<CmEvent> {
    loop {
        let ev = next_event(id.channel(), deadline, what)?;
        if ev.id != id.key() {
            // Not this id's (a stale event of an id already gone): nothing to do.
            continue;
        }
        if ev.kind == want {
            return Ok(ev);
        }
        return Err(event_error(&ev, what));
    }
}

/// What an unexpected CM event means for the step that waited.
fn event_error(ev: &CmEvent, what: &str) -> Error {
    let (kind, name) = match ev.kind {
        1 => (io::ErrorKind::AddrNotAvailable, "address resolution failed"),
        3 => (io::ErrorKind::HostUnreachable, "route resolution failed"),
        6 => (io::ErrorKind::ConnectionAborted, "connection error"),
        7 => (io::ErrorKind::HostUnreachable, "the peer is unreachable"),
        8 => (
            io::ErrorKind::ConnectionRefused,
            "the peer rejected the connection",
        ),
        10 => (io::ErrorKind::ConnectionReset, "the peer disconnected"),
        11 => (io::ErrorKind::NotConnected, "the device was removed"),
        _ => (io::ErrorKind::Other, "unexpected event"),
    };
    failed(
        kind,
        format!(
            "RDMA CM, waiting for {what}: {name} (event {}, status {})",
            ev.kind, ev.status
        ),
    )
}

fn timeout_ms(t: Duration) -> i32 {
    t.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// Checks that `qp` is an RC QP of this provider on `device`, in RESET or INIT; returns
/// its state.
fn check_qp(qp: &Arc<dyn QueuePair>, device: &str) -> Result<QpState> {
    let ib: Arc<IbQp> = own(qp.clone(), "QP")?;
    if ib.qp_type != QpType::Rc {
        return Err(Error::InvalidArgument(format!(
            "RDMA CM connects RC QPs, not {:?}",
            ib.qp_type
        )));
    }
    if ib.pd.device != device {
        return Err(Error::InvalidArgument(format!(
            "the QP is on {}, the connection goes through {device}",
            ib.pd.device
        )));
    }
    let state = qp.state();
    if !matches!(state, QpState::Reset | QpState::Init) {
        return Err(Error::InvalidQpState(state));
    }
    Ok(state)
}

/// Moves `qp` (RC, this provider's, on the id's device) from RESET to INIT with the CM's
/// attributes, unless it is in INIT already.
fn init_qp(id: &CmId, device: &str, qp: &Arc<dyn QueuePair>) -> Result<()> {
    if check_qp(qp, device)? == QpState::Reset {
        move_qp(id, qp, QpState::Init, None)?;
    }
    Ok(())
}

/// Moves `qp` to `state` with the CM's attributes, overriding the read/atomic depth where
/// given (`rdma_init_qp_attr` does not know an external QP's).
fn move_qp(
    id: &CmId,
    qp: &Arc<dyn QueuePair>,
    state: QpState,
    rd_atomic: Option<u8>,
) -> Result<()> {
    let (raw, mask) = id
        .init_qp_attr(state as u32)
        .map_err(|e| cm_err("rdma_init_qp_attr", e))?;
    let mut attr = from_raw_qp_attr(&raw);
    let mut mask = QpAttrMask::from_bits_truncate(mask as u32);
    match (state, rd_atomic) {
        (QpState::Rtr, Some(n)) => {
            attr.max_dest_rd_atomic = n;
            mask |= QpAttrMask::MAX_DEST_RD_ATOMIC;
        }
        (QpState::Rts, Some(n)) => {
            attr.max_rd_atomic = n;
            mask |= QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        _ => {}
    }
    qp.modify(&attr, mask)
}

fn check_private_data(data: &[u8], max: usize) -> Result<()> {
    if data.len() > max {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data: at most {max} fit",
            data.len()
        )));
    }
    Ok(())
}

/// A listening RDMA CM id: receives connection requests.
pub struct CmListener {
    id: CmId,
}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener").finish_non_exhaustive()
    }
}

impl CmListener {
    /// Listens on `addr` (an address of an RDMA device's network interface, or the
    /// unspecified address for all of them; port as in TCP: `rdma_server` uses 7471).
    pub fn bind(addr: SocketAddr) -> Result<CmListener> {
        let chan = CmChannel::new().map_err(|e| cm_err("rdma_create_event_channel", e))?;
        let id = CmId::new(&chan).map_err(|e| cm_err("rdma_create_id", e))?;
        id.bind(addr).map_err(|e| cm_err("rdma_bind_addr", e))?;
        id.listen(64).map_err(|e| cm_err("rdma_listen", e))?;
        Ok(CmListener { id })
    }

    /// The next connection request, waiting up to `timeout`.
    pub fn get_request(&self, timeout: Duration) -> Result<CmRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = next_event(self.id.channel(), deadline, "a connection request")?;
            if ev.kind != cm_event::CONNECT_REQUEST {
                // Events of the listener itself (an address change) need no action.
                continue;
            }
            let Some(mut id) = ev.new_id else { continue };
            // The connection's events go to a channel of its own.
            let chan = CmChannel::new().map_err(|e| cm_err("rdma_create_event_channel", e))?;
            id.migrate(&chan)
                .map_err(|e| cm_err("rdma_migrate_id", e))?;
            let device = id.device_name().ok_or_else(|| {
                failed(
                    io::ErrorKind::Other,
                    "RDMA CM: a request without a device".into(),
                )
            })?;
            return Ok(CmRequest {
                id,
                device,
                private_data: ev.private_data,
                responder_resources: ev.responder_resources,
                initiator_depth: ev.initiator_depth,
            });
        }
    }
}

/// A connection request, to accept with a QP or to reject. Dropped, it is rejected.
pub struct CmRequest {
    id: CmId,
    device: String,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
}

impl std::fmt::Debug for CmRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmRequest")
            .field("device", &self.device)
            .field("private_data", &self.private_data)
            .finish_non_exhaustive()
    }
}

impl CmRequest {
    /// The device the connection goes through: create the QP on it.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The requester's private data (padded with zeros to the protocol's size).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// RDMA READs and atomics the requester serves in flight.
    pub fn peer_responder_resources(&self) -> u8 {
        self.responder_resources
    }

    /// RDMA READs and atomics the requester keeps in flight towards this side.
    pub fn peer_initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    /// Moves `qp` (RC, in RESET, on [`CmRequest::device`]) to INIT with the CM's port,
    /// P_Key and access attributes, so that receives can be posted before accepting.
    pub fn init_qp(&self, qp: &Arc<dyn QueuePair>) -> Result<()> {
        init_qp(&self.id, &self.device, qp)
    }

    /// Accepts with `qp` (RC, in RESET or INIT, on [`CmRequest::device`]): moves it to
    /// RTS and replies; returns once the requester confirms.
    pub fn accept(self, qp: &Arc<dyn QueuePair>, opts: &CmOptions) -> Result<CmConnection> {
        check_private_data(&opts.private_data, MAX_REPLY_PRIVATE_DATA)?;
        init_qp(&self.id, &self.device, qp)?;
        // This side serves no more than the requester keeps in flight, and keeps no more
        // in flight than the requester serves.
        let responder = opts
            .responder_resources
            .min(self.initiator_depth.max(1))
            .max(1);
        let initiator = opts.initiator_depth.min(self.responder_resources);
        move_qp(&self.id, qp, QpState::Rtr, Some(responder))?;
        move_qp(&self.id, qp, QpState::Rts, Some(initiator))?;
        self.id
            .accept(&ConnParam {
                private_data: &opts.private_data,
                responder_resources: responder,
                initiator_depth: initiator,
                retry_count: opts.retry_count,
                rnr_retry_count: opts.rnr_retry_count,
                qp_num: qp.qp_num(),
            })
            .map_err(|e| cm_err("rdma_accept", e))?;
        let deadline = Instant::now() + opts.timeout;
        expect(
            &self.id,
            cm_event::ESTABLISHED,
            deadline,
            "the connection to be established",
        )?;
        Ok(CmConnection::new(self.id, qp.clone(), self.private_data))
    }

    /// Rejects the request, with `private_data` (at most 148 bytes) for the requester.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data, 148)?;
        self.id
            .reject(private_data)
            .map_err(|e| cm_err("rdma_reject", e))
    }
}

/// The active side before it connects: the peer's address and route resolved.
pub struct CmConnector {
    id: CmId,
    device: String,
}

impl std::fmt::Debug for CmConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConnector")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl CmConnector {
    /// Resolves `dst` (a listener's address) to a local device, port and route, each step
    /// within `timeout`.
    pub fn resolve(dst: SocketAddr, timeout: Duration) -> Result<CmConnector> {
        let chan = CmChannel::new().map_err(|e| cm_err("rdma_create_event_channel", e))?;
        let id = CmId::new(&chan).map_err(|e| cm_err("rdma_create_id", e))?;
        id.resolve_addr(dst, timeout_ms(timeout))
            .map_err(|e| cm_err("rdma_resolve_addr", e))?;
        expect(
            &id,
            cm_event::ADDR_RESOLVED,
            Instant::now() + timeout,
            "the address",
        )?;
        id.resolve_route(timeout_ms(timeout))
            .map_err(|e| cm_err("rdma_resolve_route", e))?;
        expect(
            &id,
            cm_event::ROUTE_RESOLVED,
            Instant::now() + timeout,
            "the route",
        )?;
        let device = id.device_name().ok_or_else(|| {
            failed(
                io::ErrorKind::Other,
                "RDMA CM: resolved without a device".into(),
            )
        })?;
        Ok(CmConnector { id, device })
    }

    /// The device the connection goes through: create the QP on it.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Moves `qp` (RC, in RESET, on [`CmConnector::device`]) to INIT with the CM's port,
    /// P_Key and access attributes, so that receives can be posted before connecting.
    pub fn init_qp(&self, qp: &Arc<dyn QueuePair>) -> Result<()> {
        init_qp(&self.id, &self.device, qp)
    }

    /// Connects with `qp` (RC, in RESET or INIT, on [`CmConnector::device`]): sends the
    /// request, and once the listener accepts, moves the QP to RTS and confirms.
    pub fn connect(self, qp: &Arc<dyn QueuePair>, opts: &CmOptions) -> Result<CmConnection> {
        check_private_data(&opts.private_data, MAX_REQUEST_PRIVATE_DATA)?;
        init_qp(&self.id, &self.device, qp)?;
        self.id
            .connect(&ConnParam {
                private_data: &opts.private_data,
                responder_resources: opts.responder_resources,
                initiator_depth: opts.initiator_depth,
                retry_count: opts.retry_count,
                rnr_retry_count: opts.rnr_retry_count,
                qp_num: qp.qp_num(),
            })
            .map_err(|e| cm_err("rdma_connect", e))?;
        let reply = expect(
            &self.id,
            cm_event::CONNECT_RESPONSE,
            Instant::now() + opts.timeout,
            "the listener's reply",
        )?;
        let responder = opts.responder_resources.max(1);
        let initiator = opts.initiator_depth.min(reply.responder_resources);
        let moved = move_qp(&self.id, qp, QpState::Rtr, Some(responder))
            .and_then(|()| move_qp(&self.id, qp, QpState::Rts, Some(initiator)));
        if let Err(e) = moved {
            let _ = self.id.reject(&[]);
            return Err(e);
        }
        self.id
            .establish()
            .map_err(|e| cm_err("rdma_establish", e))?;
        Ok(CmConnection::new(self.id, qp.clone(), reply.private_data))
    }
}

/// An established connection. Dropped (or [`CmConnection::disconnect`]ed), it
/// disconnects, and its QP goes to the error state (outstanding work is flushed).
pub struct CmConnection {
    id: CmId,
    qp: Arc<dyn QueuePair>,
    private_data: Vec<u8>,
    disconnected: Mutex<bool>,
}

impl std::fmt::Debug for CmConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConnection")
            .field("qp_num", &self.qp.qp_num())
            .finish_non_exhaustive()
    }
}

impl CmConnection {
    fn new(id: CmId, qp: Arc<dyn QueuePair>, private_data: Vec<u8>) -> CmConnection {
        CmConnection {
            id,
            qp,
            private_data,
            disconnected: Mutex::new(false),
        }
    }

    /// The connection's QP.
    pub fn qp(&self) -> &Arc<dyn QueuePair> {
        &self.qp
    }

    /// The peer's private data: the requester's (on the accepting side) or the reply's.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn mark_down(&self) {
        let mut d = self.disconnected.lock().unwrap_or_else(|p| p.into_inner());
        if !*d {
            *d = true;
            let _ = self.qp.modify(
                &remem_verbs::QpAttr {
                    qp_state: QpState::Err,
                    ..Default::default()
                },
                QpAttrMask::STATE,
            );
        }
    }

    /// Disconnects (the peer gets a disconnect event) and moves the QP to the error state.
    pub fn disconnect(&self) -> Result<()> {
        if *self.disconnected.lock().unwrap_or_else(|p| p.into_inner()) {
            return Ok(());
        }
        let r = self
            .id
            .disconnect()
            .map_err(|e| cm_err("rdma_disconnect", e));
        self.mark_down();
        r
    }

    /// Waits up to `timeout` for the peer to disconnect; then the QP is in the error
    /// state. `Ok(false)` if the peer has not disconnected by then.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            match next_event(self.id.channel(), deadline, "the peer to disconnect") {
                Ok(ev) if ev.id == self.id.key() && ev.kind == cm_event::DISCONNECTED => {
                    self.mark_down();
                    return Ok(true);
                }
                Ok(_) => {}
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::TimedOut => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for CmConnection {
    fn drop(&mut self) {
        let _ = self.disconnect();
    }
}
