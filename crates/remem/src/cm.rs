//! Connections made through the RDMA connection manager ([`Rdma::connect_cm`],
//! [`Rdma::listen_cm`]): the IBTA CM's REQ/REP/RTU on the device itself instead of remem's
//! TCP exchange, so a remem endpoint reaches any RDMA CM peer's address and port, on every
//! provider with a connection manager (the soft provider's own, rdma-core's librdmacm).
//!
//! The connection is the same [`Connection`] as [`Rdma::connect`] makes. The CM
//! negotiates the queue pairs (numbers, PSNs, path MTU, addresses); what remem's message
//! layer needs beyond that — its receive credits and message limits — travels at the
//! start of the CM's private data ([`CM_EXTRAS_LEN`] bytes), the application's private
//! data after it. Either side's [`Connection::close`] (or drop) disconnects through the CM
//! too, and a CM disconnect by the peer closes the connection.
//!
//! On a device its user drives (a soft device without a progress thread), the handshake's
//! waits drive the device; after `connect_cm` returns, its RTU leaves with the device's
//! next drive ([`Connection::poll_completions`]), as every packet of such a device does.

use crate::conn::{ConnectOptions, Connection, EndpointInfo};
use crate::error::{CloseReason, Error, HandshakeError, Result};
use crate::rdma::Rdma;
use crate::sys::ChannelFd;
use remem_verbs::{
    CmChannel, CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, PeerConnParam, PortSpace,
    PrivateDataLimit, QpState,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{Notify, mpsc};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes remem puts in front of the application's private data in a CM REQ and REP:
/// magic `"RM"`, version, flags, then its receive credits, largest message and largest
/// large message (big-endian u32s).
pub const CM_EXTRAS_LEN: usize = 16;
const CM_MAGIC: &[u8; 2] = b"RM";
const CM_VERSION: u8 = 1;

/// The most application private data [`Rdma::connect_cm_with`] carries (a REQ's 56
/// bytes, less remem's [`CM_EXTRAS_LEN`]).
pub const MAX_CM_CONNECT_PRIVATE_DATA: usize = PrivateDataLimit::REQ - CM_EXTRAS_LEN;
/// The most application private data [`CmConnRequest::accept`] carries (a REP's 196
/// bytes, less remem's [`CM_EXTRAS_LEN`]).
pub const MAX_CM_ACCEPT_PRIVATE_DATA: usize = PrivateDataLimit::REP - CM_EXTRAS_LEN;

/// remem's endpoint extras in CM private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Extras {
    recv_credits: u32,
    max_message: u32,
    max_large_message: u32,
}

impl Extras {
    fn of(info: &EndpointInfo) -> Self {
        Extras {
            recv_credits: info.recv_credits,
            max_message: info.max_message,
            max_large_message: info.max_large_message,
        }
    }

    /// The extras followed by `user`.
    fn encode(&self, user: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(CM_EXTRAS_LEN + user.len());
        b.extend_from_slice(CM_MAGIC);
        b.push(CM_VERSION);
        b.push(0);
        b.extend_from_slice(&self.recv_credits.to_be_bytes());
        b.extend_from_slice(&self.max_message.to_be_bytes());
        b.extend_from_slice(&self.max_large_message.to_be_bytes());
        b.extend_from_slice(user);
        b
    }

    /// Splits private data into the extras and the application's part. The CM pads
    /// private data with zeros to its field's length, so the application's part is
    /// returned with trailing zeros (it says nothing of its length).
    fn decode(b: &[u8]) -> Result<(Extras, &[u8])> {
        if b.len() < CM_EXTRAS_LEN || &b[..2] != CM_MAGIC {
            return Err(HandshakeError::NotRemem.into());
        }
        if b[2] != CM_VERSION {
            return Err(HandshakeError::Version {
                peer: u16::from(b[2]),
                ours: u16::from(CM_VERSION),
            }
            .into());
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok((
            Extras {
                recv_credits: u32_at(4),
                max_message: u32_at(8),
                max_large_message: u32_at(12),
            },
            &b[CM_EXTRAS_LEN..],
        ))
    }
}

/// Where the events of one id go.
enum Route {
    /// A listener: connection requests, each with the receiver of its new id's events.
    Listener(mpsc::UnboundedSender<(CmEvent, mpsc::UnboundedReceiver<CmEvent>)>),
    /// Any other id.
    Id(mpsc::UnboundedSender<CmEvent>),
}

/// Routes the events of one CM channel to the ids that wait for them: a task reads the
/// channel and hands each event to the receiver registered for its id (a connection
/// request to its listener's), so that a listener and the connections it made share a
/// channel. The task ends when the last holder of the pump is gone.
pub(crate) struct Pump {
    channel: Arc<dyn CmChannel>,
    routes: Mutex<HashMap<u64, Route>>,
    stop: Arc<Notify>,
}

impl Pump {
    fn start(channel: Arc<dyn CmChannel>) -> Result<Arc<Pump>> {
        let fd = ChannelFd::new(channel.fd())?;
        let stop = Arc::new(Notify::new());
        let pump = Arc::new(Pump {
            channel,
            routes: Mutex::new(HashMap::new()),
            stop: stop.clone(),
        });
        let weak = Arc::downgrade(&pump);
        tokio::spawn(async move {
            loop {
                match weak.upgrade() {
                    Some(p) => {
                        while let Some(ev) = p.channel.get_event() {
                            p.route(ev);
                        }
                    }
                    None => return,
                }
                tokio::select! {
                    r = fd.readable() => if r.is_err() { return },
                    _ = stop.notified() => return,
                }
            }
        });
        Ok(pump)
    }

    fn register(&self, handle: u64) -> mpsc::UnboundedReceiver<CmEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.routes).insert(handle, Route::Id(tx));
        rx
    }

    fn register_listener(
        &self,
        handle: u64,
    ) -> mpsc::UnboundedReceiver<(CmEvent, mpsc::UnboundedReceiver<CmEvent>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.routes).insert(handle, Route::Listener(tx));
        rx
    }

    fn unregister(&self, handle: u64) {
        lock(&self.routes).remove(&handle);
    }

    fn route(&self, ev: CmEvent) {
        let mut routes = lock(&self.routes);
        if ev.kind == CmEventKind::ConnectRequest {
            let listener = ev.listen_id.as_ref().map(|l| l.handle());
            if let Some(Route::Listener(tx)) = listener.and_then(|l| routes.get(&l)) {
                // The new id's own events (established, disconnected) come later: route
                // them from now on, to a receiver that travels with the request.
                let (id_tx, id_rx) = mpsc::unbounded_channel();
                let handle = ev.id.handle();
                if tx.send((ev, id_rx)).is_ok() {
                    routes.insert(handle, Route::Id(id_tx));
                }
            }
            // A listener that is gone: dropping the new id rejects the request.
            return;
        }
        match routes.get(&ev.id.handle()) {
            Some(Route::Id(tx)) => {
                let _ = tx.send(ev);
            }
            _ => tracing::debug!(kind = ?ev.kind, "CM event for an id nobody waits on"),
        }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// A connection's tie to its CM id: keeps the id (and its channel's pump) alive while the
/// connection lives, and disconnects when the connection's QP leaves service.
pub(crate) struct CmLink {
    id: Arc<dyn CmId>,
    pump: Arc<Pump>,
}

impl std::fmt::Debug for CmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmLink")
            .field("id", &self.id.handle())
            .finish()
    }
}

impl CmLink {
    /// Tells the peer through the CM (a DREQ); idempotent at the provider.
    pub(crate) fn disconnect(&self) {
        if let Err(e) = self.id.disconnect() {
            tracing::debug!(error = %e, "CM disconnect");
        }
    }
}

impl Drop for CmLink {
    fn drop(&mut self) {
        self.pump.unregister(self.id.handle());
    }
}

/// The next item of `rx` (`None` once its sender is gone), waiting until `deadline` at
/// most (`Err(())` past it). On a device its user drives
/// ([`Context::caller_driven`](remem_verbs::Context::caller_driven)) nothing else moves the
/// CM's packets while a handshake waits: the wait drives it.
async fn recv_driven<T>(
    ctx: &Arc<dyn remem_verbs::Context>,
    rx: &mut mpsc::UnboundedReceiver<T>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<T>> {
    if !ctx.caller_driven() {
        return match deadline {
            Some(d) => tokio::time::timeout_at(d, rx.recv())
                .await
                .map_err(|_| Error::Timeout("RDMA CM")),
            None => Ok(rx.recv().await),
        };
    }
    loop {
        match rx.try_recv() {
            Ok(v) => return Ok(Some(v)),
            Err(mpsc::error::TryRecvError::Disconnected) => return Ok(None),
            Err(mpsc::error::TryRecvError::Empty) => {}
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Err(Error::Timeout("RDMA CM"));
        }
        ctx.drive(std::time::Duration::ZERO)?;
        tokio::task::yield_now().await;
    }
}

/// Waits for the next event of an id, bounded by `deadline`.
async fn next_event(
    ctx: &Arc<dyn remem_verbs::Context>,
    rx: &mut mpsc::UnboundedReceiver<CmEvent>,
    deadline: tokio::time::Instant,
    what: &'static str,
) -> Result<CmEvent> {
    match recv_driven(ctx, rx, Some(deadline)).await {
        Ok(Some(ev)) => Ok(ev),
        Ok(None) => Err(HandshakeError::Closed.into()),
        Err(Error::Timeout(_)) => Err(Error::Timeout(what)),
        Err(e) => Err(e),
    }
}

/// The error a failed CM step reports.
fn cm_failure(ev: &CmEvent) -> Error {
    match ev.kind {
        CmEventKind::Rejected if ev.status == remem_verbs::cm::REJ_CONSUMER_DEFINED => {
            Error::Rejected(ev.private_data.clone())
        }
        kind => HandshakeError::Cm {
            event: kind,
            status: ev.status,
        }
        .into(),
    }
}

/// Expects an event of `kind`; any other ends the step with its error.
async fn expect(
    ctx: &Arc<dyn remem_verbs::Context>,
    rx: &mut mpsc::UnboundedReceiver<CmEvent>,
    kind: CmEventKind,
    deadline: tokio::time::Instant,
    what: &'static str,
) -> Result<CmEvent> {
    let ev = next_event(ctx, rx, deadline, what).await?;
    if ev.kind == kind {
        Ok(ev)
    } else {
        Err(cm_failure(&ev))
    }
}

/// What the CM negotiated about the peer, as remem's [`EndpointInfo`], and this side's
/// send PSN.
fn negotiated(
    id: &Arc<dyn CmId>,
    peer: &PeerConnParam,
    extras: Extras,
) -> Result<(EndpointInfo, u32)> {
    let (rtr, _) = id.init_qp_attr(QpState::Rtr)?;
    let (rts, _) = id.init_qp_attr(QpState::Rts)?;
    let remote = EndpointInfo {
        qpn: peer.qp_num,
        psn: rtr.rq_psn,
        gid: rtr.ah_attr.dgid,
        mtu: rtr.path_mtu,
        recv_credits: extras.recv_credits,
        max_message: extras.max_message,
        max_large_message: extras.max_large_message,
        // The CM's own messages reached the peer's device: the device knows its port
        // already (0: nothing to tell it).
        udp_port: 0,
    };
    Ok((remote, rts.sq_psn))
}

/// The connection parameters this side offers.
fn conn_param(rdma: &Rdma, info: &EndpointInfo, opts: &ConnectOptions) -> ConnParam {
    let cfg = rdma.config();
    ConnParam {
        private_data: Extras::of(info).encode(&opts.private_data),
        responder_resources: cfg.max_rd_atomic,
        initiator_depth: cfg.max_rd_atomic,
        flow_control: true,
        retry_count: cfg.retry_cnt,
        rnr_retry_count: cfg.rnr_retry,
        srq: opts.srq.is_some(),
        qp_num: info.qpn,
    }
}

fn peer_param(ev: &CmEvent) -> Result<PeerConnParam> {
    match &ev.param {
        CmEventParam::Conn(p) => Ok(*p),
        _ => Err(HandshakeError::BadField("CM connection parameters").into()),
    }
}

impl Rdma {
    /// Connects to `addr` through the RDMA connection manager: the device resolves the
    /// address, sends a CM connection request to that IP address and port (port space
    /// TCP), and the connection is usable once the CM has established it. The peer is a
    /// remem listener ([`Rdma::listen_cm`]) on any provider. Needs a provider with a
    /// connection manager and a tokio runtime; bounded by
    /// [`RdmaBuilder::handshake_timeout`](crate::RdmaBuilder::handshake_timeout).
    pub async fn connect_cm(&self, addr: SocketAddr) -> Result<Connection> {
        self.connect_cm_with(addr, &ConnectOptions::default()).await
    }

    /// [`Rdma::connect_cm`] with options. The private data may be
    /// [`MAX_CM_CONNECT_PRIVATE_DATA`] bytes at most. A rejection by the listener's
    /// application is [`Error::Rejected`] with its private data; any other failure of the
    /// CM (nobody listening at that port: reject reason 8; no answer: unreachable) is
    /// [`HandshakeError::Cm`].
    pub async fn connect_cm_with(
        &self,
        addr: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Connection> {
        if opts.private_data.len() > MAX_CM_CONNECT_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of private data (at most {MAX_CM_CONNECT_PRIVATE_DATA} through the CM)",
                opts.private_data.len()
            )));
        }
        let timeout = self.config().handshake_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let ctx = self.context();
        let channel = ctx.create_cm_channel()?;
        let pump = Pump::start(channel.clone())?;
        let id = ctx.create_cm_id(&channel, PortSpace::Tcp)?;
        let mut rx = pump.register(id.handle());
        let link = CmLink {
            id: id.clone(),
            pump,
        };
        id.resolve_addr(None, addr, timeout)?;
        expect(
            ctx,
            &mut rx,
            CmEventKind::AddrResolved,
            deadline,
            "CM address resolution",
        )
        .await?;
        id.resolve_route(timeout)?;
        expect(
            ctx,
            &mut rx,
            CmEventKind::RouteResolved,
            deadline,
            "CM route resolution",
        )
        .await?;
        let mut prepared = self.prepare_with(opts)?;
        id.connect(&conn_param(self, &prepared.local_info(), opts))?;
        let ev = next_event(ctx, &mut rx, deadline, "CM connection").await?;
        if ev.kind != CmEventKind::ConnectResponse {
            return Err(cm_failure(&ev));
        }
        let (extras, user) = Extras::decode(&ev.private_data)?;
        let (remote, psn) = negotiated(&id, &peer_param(&ev)?, extras)?;
        prepared.set_psn(psn);
        let conn = prepared.connect(remote)?;
        conn.set_peer_private_data(user.to_vec());
        id.establish()?;
        attach(&conn, link, rx);
        Ok(conn)
    }

    /// Listens for CM connection requests on `addr` (this device's address or the
    /// unspecified one; port 0 picks a free port): what [`Rdma::connect_cm`] and any
    /// RDMA CM client of port space TCP send. At most
    /// [`RdmaBuilder::max_handshakes`](crate::RdmaBuilder::max_handshakes) requests wait
    /// unanswered; the CM rejects more. Needs a tokio runtime.
    pub async fn listen_cm(&self, addr: SocketAddr) -> Result<CmListener> {
        let ctx = self.context();
        let channel = ctx.create_cm_channel()?;
        let pump = Pump::start(channel.clone())?;
        let id = ctx.create_cm_id(&channel, PortSpace::Tcp)?;
        let requests = pump.register_listener(id.handle());
        id.bind(addr)?;
        id.listen(self.config().max_handshakes.max(1) as u32)?;
        Ok(CmListener {
            rdma: self.clone(),
            id,
            pump,
            requests: tokio::sync::Mutex::new(requests),
        })
    }
}

/// A listener of the RDMA connection manager ([`Rdma::listen_cm`]).
pub struct CmListener {
    rdma: Rdma,
    id: Arc<dyn CmId>,
    pump: Arc<Pump>,
    requests:
        tokio::sync::Mutex<mpsc::UnboundedReceiver<(CmEvent, mpsc::UnboundedReceiver<CmEvent>)>>,
}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener")
            .field("local_addr", &self.id.local_addr())
            .finish_non_exhaustive()
    }
}

impl CmListener {
    /// The address it listens on (with the port picked, if it was 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The next connection request.
    pub async fn next_request(&self) -> Result<CmConnRequest> {
        let mut requests = self.requests.lock().await;
        let (ev, rx) = recv_driven(self.rdma.context(), &mut requests, None)
            .await?
            .ok_or(Error::Closed(CloseReason::Local))?;
        Ok(CmConnRequest {
            rdma: self.rdma.clone(),
            link: CmLink {
                id: ev.id.clone(),
                pump: self.pump.clone(),
            },
            rx,
            peer: ev.id.peer_addr(),
            event: ev,
        })
    }

    /// Accepts the next connection request with default options.
    pub async fn accept(&self) -> Result<Connection> {
        self.next_request()
            .await?
            .accept(&ConnectOptions::default())
            .await
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        self.pump.unregister(self.id.handle());
    }
}

/// A connection request a [`CmListener`] received: accept or reject it. Dropping it
/// unanswered rejects it.
pub struct CmConnRequest {
    rdma: Rdma,
    link: CmLink,
    rx: mpsc::UnboundedReceiver<CmEvent>,
    peer: Option<SocketAddr>,
    event: CmEvent,
}

impl std::fmt::Debug for CmConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConnRequest")
            .field("peer", &self.peer)
            .field("event", &self.event)
            .finish_non_exhaustive()
    }
}

impl CmConnRequest {
    /// The application's private data in the request (zero-padded to the CM's field:
    /// the CM does not carry its length); empty if the peer is not a remem endpoint.
    pub fn private_data(&self) -> &[u8] {
        Extras::decode(&self.event.private_data).map_or(&[], |(_, user)| user)
    }

    /// The peer's IP address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Accepts: brings up a queue pair with what the CM negotiated, answers with
    /// `opts.private_data` (at most [`MAX_CM_ACCEPT_PRIVATE_DATA`] bytes), and returns
    /// the connection once the CM reports it established. A request from a peer that is
    /// not a remem endpoint is rejected ([`HandshakeError::NotRemem`]).
    pub async fn accept(self, opts: &ConnectOptions) -> Result<Connection> {
        if opts.private_data.len() > MAX_CM_ACCEPT_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of private data (at most {MAX_CM_ACCEPT_PRIVATE_DATA} through the CM)",
                opts.private_data.len()
            )));
        }
        let CmConnRequest {
            rdma,
            link,
            mut rx,
            event,
            ..
        } = self;
        let id = link.id.clone();
        let (extras, user) = match Extras::decode(&event.private_data) {
            Ok(v) => v,
            Err(e) => {
                let _ = id.reject(&[]);
                return Err(e);
            }
        };
        let deadline = tokio::time::Instant::now() + rdma.config().handshake_timeout;
        let mut prepared = rdma.prepare_with(opts)?;
        let (remote, psn) = negotiated(&id, &peer_param(&event)?, extras)?;
        prepared.set_psn(psn);
        let info = prepared.local_info();
        let conn = prepared.connect(remote)?;
        conn.set_peer_private_data(user.to_vec());
        id.accept(&conn_param(&rdma, &info, opts))?;
        expect(
            rdma.context(),
            &mut rx,
            CmEventKind::Established,
            deadline,
            "CM connection",
        )
        .await?;
        attach(&conn, link, rx);
        Ok(conn)
    }

    /// Rejects with private data (at most [`remem_verbs::PrivateDataLimit::REJ`] bytes):
    /// the connecting side fails with [`Error::Rejected`].
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        Ok(self.link.id.reject(private_data)?)
    }
}

/// Ties the connection to the CM id that made it: closing it disconnects the id, and the
/// peer's disconnect (an event on `rx`) closes it.
fn attach(conn: &Connection, link: CmLink, rx: mpsc::UnboundedReceiver<CmEvent>) {
    let shared = conn.shared();
    shared.on_error(Arc::new(move || link.disconnect()));
    tokio::spawn(watch(Arc::downgrade(shared), rx));
}

/// Watches a connection's CM id: a disconnect by the peer (or a CM error) closes it.
async fn watch(conn: Weak<crate::conn::ConnShared>, mut rx: mpsc::UnboundedReceiver<CmEvent>) {
    while let Some(ev) = rx.recv().await {
        if matches!(
            ev.kind,
            CmEventKind::Disconnected | CmEventKind::ConnectError | CmEventKind::DeviceRemoval
        ) {
            if let Some(c) = conn.upgrade() {
                c.peer_disconnected();
            }
            return;
        }
    }
}
