//! Blocking RDMA CM connection setup for this provider's RC QPs, on [`IbCmId`]: the
//! alternative to exchanging QP numbers, PSNs and GIDs over a TCP connection of one's
//! own, where the device follows from the address (a listener on the unspecified address
//! listens through every rdma-core device; a connector goes through the device its
//! route takes).
//!
//! The QP stays the caller's: created (in RESET) on an [`IbContext`](crate::IbContext)
//! of the device the connection goes through — [`CmConnector::device`] once the address
//! is resolved, [`CmRequest::device`] for a request — and moved to INIT (by `init_qp`, to
//! post receives first, or by `connect`/`accept`), RTR and RTS by the CM id it is given
//! to, with the attributes the CM computes and the read/atomic depths of [`CmOptions`]
//! as negotiated with the peer.
//!
//! ```text
//! server: CmListener::bind(addr) → get_request() → [create the QP on request.device()]
//!         → request.accept(qp) → CmConnection
//! client: CmConnector::resolve(addr) → [create the QP on connector.device()]
//!         → connector.connect(qp) → CmConnection
//! ```
//!
//! Every step is bounded by [`CmOptions::timeout`] (or the timeout given). Without
//! librdmacm the calls fail with an [`Error`]; nothing panics.

use super::{IbCmChannel, IbCmId};
use crate::{IbverbsProvider, io_err, own, sys};
use remem_verbs::{
    CmChannel, CmEvent, CmEventKind, CmId, ConnParam, Error, PortSpace, PrivateDataLimit, Provider,
    QpState, QueuePair, Result,
};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
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

impl CmOptions {
    fn param(&self) -> ConnParam {
        ConnParam {
            private_data: self.private_data.clone(),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            ..ConnParam::default()
        }
    }
}

/// Most private data in a connection request (IBTA CM REQ, less rdma_cm's IP header).
pub const MAX_REQUEST_PRIVATE_DATA: usize = PrivateDataLimit::REQ;
/// Most private data in a reply (IBTA CM REP).
pub const MAX_REPLY_PRIVATE_DATA: usize = PrivateDataLimit::REP;

fn failed(kind: io::ErrorKind, msg: String) -> Error {
    Error::Io(io::Error::new(kind, msg))
}

/// Waits for the next event on `chan` until `deadline`.
fn next_event(chan: &IbCmChannel, deadline: Instant, what: &str) -> Result<CmEvent> {
    loop {
        if let Some(ev) = chan.get_event() {
            return Ok(ev);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failed(
                io::ErrorKind::TimedOut,
                format!("RDMA CM: no answer while waiting for {what}"),
            ));
        }
        chan.wait(left)?;
    }
}

/// Waits for `want` on `id`; any other event of `id` is the failure it names.
fn expect(
    chan: &IbCmChannel,
    id: &IbCmId,
    want: CmEventKind,
    deadline: Instant,
    what: &str,
) -> Result<CmEvent> {
    loop {
        let ev = next_event(chan, deadline, what)?;
        if ev.id.handle() != id.handle() {
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
    use CmEventKind as K;
    let (kind, name) = match ev.kind {
        K::AddrError => (io::ErrorKind::AddrNotAvailable, "address resolution failed"),
        K::RouteError => (io::ErrorKind::HostUnreachable, "route resolution failed"),
        K::ConnectError => (io::ErrorKind::ConnectionAborted, "connection error"),
        K::Unreachable => (io::ErrorKind::HostUnreachable, "the peer is unreachable"),
        K::Rejected => (
            io::ErrorKind::ConnectionRefused,
            "the peer rejected the connection",
        ),
        K::Disconnected => (io::ErrorKind::ConnectionReset, "the peer disconnected"),
        K::DeviceRemoval => (io::ErrorKind::NotConnected, "the device was removed"),
        _ => (io::ErrorKind::Other, "unexpected event"),
    };
    failed(
        kind,
        format!(
            "RDMA CM, waiting for {what}: {name} (event {:?}, status {})",
            ev.kind, ev.status
        ),
    )
}

fn open(device: &str) -> Result<Arc<crate::IbContext>> {
    own(IbverbsProvider::new().open(device)?, "context")
}

fn ib_id(id: Arc<dyn CmId>) -> Result<Arc<IbCmId>> {
    own(id, "CM id")
}

/// Gives `qp` to `id` (checking it is an RC QP of the id's device) and moves it from
/// RESET to INIT with the CM's attributes (a QP in INIT stays there).
fn init_qp(id: &IbCmId, qp: &Arc<dyn QueuePair>) -> Result<()> {
    id.set_qp(Some(qp.clone()))?;
    match qp.state() {
        QpState::Reset => {
            let (attr, mask) = id.init_qp_attr(QpState::Init)?;
            qp.modify(&attr, mask)
        }
        QpState::Init => Ok(()),
        s => Err(Error::InvalidQpState(s)),
    }
}

/// A listening RDMA CM id (one per device): receives connection requests.
pub struct CmListener {
    channel: Arc<IbCmChannel>,
    ids: Vec<Arc<IbCmId>>,
}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener")
            .field("ids", &self.ids)
            .finish_non_exhaustive()
    }
}

impl CmListener {
    /// Listens on `addr` (an address of an RDMA device's network interface, or the
    /// unspecified address for every device with an address of that family; port as in
    /// TCP: `rdma_server` uses 7471, 0 picks one).
    pub fn bind(addr: SocketAddr) -> Result<CmListener> {
        let channel = IbCmChannel::new()?;
        let devices = IbverbsProvider::new().devices()?;
        let mut ids = Vec::new();
        let mut addr = addr;
        let mut last_err = None;
        for dev in devices {
            let owns =
                addr.ip().is_unspecified() || dev.gids.iter().any(|g| g.gid.to_ip() == addr.ip());
            if !owns {
                continue;
            }
            let ctx = open(&dev.name)?;
            let id = IbCmId::create(ctx, channel.clone(), PortSpace::Tcp)?;
            match id.bind(addr) {
                Ok(()) => {}
                // A device without an address of that family listens nowhere.
                Err(e) if addr.ip().is_unspecified() => {
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            }
            id.listen(64)?;
            // The other devices listen on the port the first one got.
            if let Some(local) = id.local_addr() {
                addr.set_port(local.port());
            }
            ids.push(id);
        }
        if ids.is_empty() {
            return Err(last_err.unwrap_or_else(|| {
                io_err(
                    "rdma_bind_addr",
                    io::Error::new(
                        io::ErrorKind::AddrNotAvailable,
                        format!("no RDMA device has the address {}", addr.ip()),
                    ),
                )
            }));
        }
        Ok(CmListener { channel, ids })
    }

    /// The addresses it listens on (one per device).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.ids.iter().filter_map(|id| id.local_addr()).collect()
    }

    /// The next connection request, waiting up to `timeout`.
    pub fn get_request(&self, timeout: Duration) -> Result<CmRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = next_event(&self.channel, deadline, "a connection request")?;
            if ev.kind != CmEventKind::ConnectRequest {
                // Events of the listener itself (an address change) need no action.
                continue;
            }
            let id = ib_id(ev.id.clone())?;
            // The connection's events go to a channel of its own.
            let channel = IbCmChannel::new()?;
            id.migrate(&channel)?;
            return Ok(CmRequest {
                id,
                channel,
                event: ev,
            });
        }
    }
}

/// A connection request, to accept with a QP or to reject. Dropped, it is rejected.
pub struct CmRequest {
    id: Arc<IbCmId>,
    channel: Arc<IbCmChannel>,
    event: CmEvent,
}

impl std::fmt::Debug for CmRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmRequest")
            .field("device", &self.device())
            .field("private_data", &self.event.private_data)
            .finish_non_exhaustive()
    }
}

impl CmRequest {
    /// The device the connection goes through: create the QP on it.
    pub fn device(&self) -> &str {
        self.id.device()
    }

    /// The requester's private data (padded with zeros to the protocol's size).
    pub fn private_data(&self) -> &[u8] {
        &self.event.private_data
    }

    fn peer(&self) -> remem_verbs::PeerConnParam {
        match self.event.param {
            remem_verbs::CmEventParam::Conn(p) => p,
            _ => remem_verbs::PeerConnParam::default(),
        }
    }

    /// RDMA READs and atomics the requester serves in flight.
    pub fn peer_responder_resources(&self) -> u8 {
        self.peer().responder_resources
    }

    /// RDMA READs and atomics the requester keeps in flight towards this side.
    pub fn peer_initiator_depth(&self) -> u8 {
        self.peer().initiator_depth
    }

    /// Moves `qp` (RC, in RESET, on [`CmRequest::device`]) to INIT with the CM's port,
    /// P_Key and access attributes, so that receives can be posted before accepting.
    pub fn init_qp(&self, qp: &Arc<dyn QueuePair>) -> Result<()> {
        init_qp(&self.id, qp)
    }

    /// Accepts with `qp` (RC, in RESET or INIT, on [`CmRequest::device`]): moves it to
    /// RTS and replies; returns once the requester confirms.
    pub fn accept(self, qp: &Arc<dyn QueuePair>, opts: &CmOptions) -> Result<CmConnection> {
        init_qp(&self.id, qp)?;
        self.id.accept(&opts.param())?;
        expect(
            &self.channel,
            &self.id,
            CmEventKind::Established,
            Instant::now() + opts.timeout,
            "the connection to be established",
        )?;
        Ok(CmConnection {
            id: self.id,
            channel: self.channel,
            qp: qp.clone(),
            private_data: self.event.private_data,
        })
    }

    /// Rejects the request, with `private_data` (at most 148 bytes) for the requester.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }
}

/// The active side before it connects: the peer's address and route resolved.
pub struct CmConnector {
    id: Arc<IbCmId>,
    channel: Arc<IbCmChannel>,
}

impl std::fmt::Debug for CmConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConnector")
            .field("device", &self.device())
            .finish_non_exhaustive()
    }
}

/// The device the route to `dst` leaves through, as `rdma_resolve_addr` finds it.
fn route_device(dst: SocketAddr, timeout: Duration) -> Result<String> {
    let chan = sys::CmChannel::new().map_err(|e| io_err("rdma_create_event_channel", e))?;
    let id = sys::CmId::new(&chan, u32::from(PortSpace::Tcp.value()))
        .map_err(|e| io_err("rdma_create_id", e))?;
    id.resolve_addr(None, dst, super::ms(timeout))
        .map_err(|e| io_err("rdma_resolve_addr", e))?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ev) = chan
            .try_event()
            .map_err(|e| io_err("rdma_get_cm_event", e))?
        {
            if ev.id != id.key() {
                continue;
            }
            if ev.kind != sys::cm_event::ADDR_RESOLVED {
                return Err(failed(
                    io::ErrorKind::AddrNotAvailable,
                    format!(
                        "RDMA CM: resolving {dst}: event {} (status {})",
                        ev.kind, ev.status
                    ),
                ));
            }
            return id.device_name().ok_or_else(|| {
                failed(
                    io::ErrorKind::Other,
                    "RDMA CM: resolved without a device".into(),
                )
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failed(
                io::ErrorKind::TimedOut,
                format!("RDMA CM: no answer while resolving {dst}"),
            ));
        }
        sys::wait_readable(chan.fd(), left).map_err(|e| io_err("poll", e))?;
    }
}

impl CmConnector {
    /// Resolves `dst` (a listener's address) to a local device, port and route, each step
    /// within `timeout`.
    pub fn resolve(dst: SocketAddr, timeout: Duration) -> Result<CmConnector> {
        let ctx = open(&route_device(dst, timeout)?)?;
        let channel = IbCmChannel::new()?;
        let id = IbCmId::create(ctx, channel.clone(), PortSpace::Tcp)?;
        id.resolve_addr(None, dst, timeout)?;
        expect(
            &channel,
            &id,
            CmEventKind::AddrResolved,
            Instant::now() + timeout,
            "the address",
        )?;
        id.resolve_route(timeout)?;
        expect(
            &channel,
            &id,
            CmEventKind::RouteResolved,
            Instant::now() + timeout,
            "the route",
        )?;
        Ok(CmConnector { id, channel })
    }

    /// The device the connection goes through: create the QP on it.
    pub fn device(&self) -> &str {
        self.id.device()
    }

    /// Moves `qp` (RC, in RESET, on [`CmConnector::device`]) to INIT with the CM's port,
    /// P_Key and access attributes, so that receives can be posted before connecting.
    pub fn init_qp(&self, qp: &Arc<dyn QueuePair>) -> Result<()> {
        init_qp(&self.id, qp)
    }

    /// Connects with `qp` (RC, in RESET or INIT, on [`CmConnector::device`]): sends the
    /// request, and once the listener accepts, moves the QP to RTS and confirms.
    pub fn connect(self, qp: &Arc<dyn QueuePair>, opts: &CmOptions) -> Result<CmConnection> {
        init_qp(&self.id, qp)?;
        self.id.connect(&opts.param())?;
        let ev = expect(
            &self.channel,
            &self.id,
            CmEventKind::Established,
            Instant::now() + opts.timeout,
            "the listener's reply",
        )?;
        Ok(CmConnection {
            id: self.id,
            channel: self.channel,
            qp: qp.clone(),
            private_data: ev.private_data,
        })
    }
}

/// An established connection. Dropped (or [`CmConnection::disconnect`]ed), it
/// disconnects, and its QP goes to the error state (outstanding work is flushed).
pub struct CmConnection {
    id: Arc<IbCmId>,
    channel: Arc<IbCmChannel>,
    qp: Arc<dyn QueuePair>,
    private_data: Vec<u8>,
}

impl std::fmt::Debug for CmConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConnection")
            .field("qp_num", &self.qp.qp_num())
            .finish_non_exhaustive()
    }
}

impl CmConnection {
    /// The connection's QP.
    pub fn qp(&self) -> &Arc<dyn QueuePair> {
        &self.qp
    }

    /// The connection's CM id.
    pub fn id(&self) -> &Arc<IbCmId> {
        &self.id
    }

    /// The peer's private data: the requester's (on the accepting side) or the reply's.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Disconnects (the peer gets a disconnect event) and moves the QP to the error state.
    pub fn disconnect(&self) -> Result<()> {
        self.id.disconnect()
    }

    /// Waits up to `timeout` for the peer to disconnect; then the QP is in the error
    /// state. `Ok(false)` if the peer has not disconnected by then.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            match next_event(&self.channel, deadline, "the peer to disconnect") {
                Ok(ev)
                    if ev.id.handle() == self.id.handle()
                        && ev.kind == CmEventKind::Disconnected =>
                {
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
