//! Connection management: the RDMA CM (`librdmacm`'s `rdma_cm_id`, `rdma_event_channel`,
//! `rdma_cm_event`), provider-neutral.
//!
//! A [`CmChannel`] delivers [`CmEvent`]s through a pollable file descriptor. A [`CmId`] is
//! an RDMA CM identifier on one device ([`Context::create_cm_id`]): it binds an IP address
//! and port, listens, resolves a destination, connects, accepts, rejects and disconnects,
//! with private data, and moves the queue pair it is given through INIT, RTR and RTS with
//! the attributes the two connection managers negotiated — as librdmacm does for a QP made
//! by `rdma_create_qp`.
//!
//! The flows, as `rdma_cm(7)` describes them:
//!
//! - **Active side** (client): [`CmId::resolve_addr`] → [`CmEventKind::AddrResolved`];
//!   [`CmId::resolve_route`] → [`CmEventKind::RouteResolved`]; create a QP, move it to INIT
//!   with [`CmId::init_qp_attr`] and [`CmId::set_qp`]; [`CmId::connect`] →
//!   [`CmEventKind::Established`] (the QP is then in RTS), or [`CmEventKind::Rejected`]
//!   (with the peer's private data and the reject reason as `status`),
//!   [`CmEventKind::Unreachable`] (no answer within the CM's timeouts and retries) or
//!   [`CmEventKind::ConnectError`].
//! - **Passive side** (server): [`CmId::bind`], [`CmId::listen`] →
//!   [`CmEventKind::ConnectRequest`] carrying a *new* id for the connection
//!   ([`CmEvent::id`]; the listener is [`CmEvent::listen_id`]); on that id create a QP,
//!   [`CmId::set_qp`], then [`CmId::accept`] (the QP goes to RTR and RTS, the reply leaves)
//!   → [`CmEventKind::Established`] when the peer's RTU arrives; or [`CmId::reject`] with
//!   private data.
//! - **Either side**: [`CmId::disconnect`] → [`CmEventKind::Disconnected`] on both sides
//!   (the QP moves to ERR, flushing what is outstanding).
//!
//! A QP the user manages itself (no [`CmId::set_qp`]; its number given in
//! [`ConnParam::qp_num`]) is moved by the user with [`CmId::init_qp_attr`]; the active side
//! then gets [`CmEventKind::ConnectResponse`] instead of `Established` and answers with
//! [`CmId::establish`].
//!
//! In the UDP port space ([`PortSpace::Udp`]) `connect` is a service ID resolution (SIDR):
//! the passive side's `accept` answers with its UD QP number and Q_Key, which the active
//! side gets in [`CmEventKind::Established`]'s [`UdParam`].
//!
//! Private data: a consumer may send as much with each message as rdma_cm allows on
//! IP-based port spaces ([`PrivateDataLimit`]; the CM's own IP addressing header takes the
//! first 36 bytes of a REQ's and a SIDR REQ's private data). Longer private data is
//! refused with [`Error::InvalidArgument`].
//!
//! [`Error::InvalidArgument`]: crate::Error::InvalidArgument

#![forbid(unsafe_code)]

use crate::error::Result;
use crate::provider::{Context, QueuePair};
use crate::qp::{AhAttr, QpAttr, QpAttrMask, QpState, QpType};
use std::any::Any;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

/// The Q_Key rdma_cm gives UD QPs of the UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// An RDMA CM port space (`enum rdma_port_space`): which services a port number names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected QPs, connected by REQ/REP/RTU.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagram QPs, resolved by SIDR REQ/REP.
    Udp,
    /// `RDMA_PS_IB`: any QP type, connected or datagram.
    Ib,
    /// `RDMA_PS_IPOIB`: IP over InfiniBand's port space.
    Ipoib,
}

impl PortSpace {
    /// The `enum rdma_port_space` value (also the port space byte pair of a service ID).
    pub fn value(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Ib => 0x013f,
            PortSpace::Udp => 0x0111,
        }
    }

    /// The port space of an `enum rdma_port_space` value.
    pub fn from_value(value: u16) -> Option<PortSpace> {
        [
            PortSpace::Ipoib,
            PortSpace::Tcp,
            PortSpace::Ib,
            PortSpace::Udp,
        ]
        .into_iter()
        .find(|ps| ps.value() == value)
    }

    /// The QP type connections of this port space use (`RDMA_PS_IB` is RC unless told
    /// otherwise).
    pub fn qp_type(self) -> QpType {
        match self {
            PortSpace::Tcp | PortSpace::Ib => QpType::Rc,
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
        }
    }

    /// The IBTA service ID of `port` in this port space, as rdma_cm forms it for IP-based
    /// services: the port space in bits 16..32 and the port in bits 0..16
    /// (`0x0000_0000_0106_pppp` for TCP).
    pub fn service_id(self, port: u16) -> u64 {
        (u64::from(self.value()) << 16) | u64::from(port)
    }

    /// The port space and port a service ID of an IP-based service names, or `None` if
    /// it is not of that form.
    pub fn from_service_id(sid: u64) -> Option<(PortSpace, u16)> {
        if sid >> 32 != 0 {
            return None;
        }
        Some((PortSpace::from_value((sid >> 16) as u16)?, sid as u16))
    }
}

/// The most private data a consumer may send in each CM message on an IP-based port
/// space (rdma_cm's limits: the IBTA message's private data field, less the 36-byte IP
/// addressing header in a REQ and a SIDR REQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateDataLimit;

impl PrivateDataLimit {
    /// REQ: 92 bytes, of which 36 are the CM's IP header.
    pub const REQ: usize = 56;
    /// REP.
    pub const REP: usize = 196;
    /// REJ.
    pub const REJ: usize = 148;
    /// RTU (sent by `establish` / carried by `Established`).
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR REQ: 216 bytes, of which 36 are the CM's IP header.
    pub const SIDR_REQ: usize = 180;
    /// SIDR REP.
    pub const SIDR_REP: usize = 136;
}

/// Connection parameters (`struct rdma_conn_param`): what [`CmId::connect`] and
/// [`CmId::accept`] offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Consumer private data for the REQ, REP or SIDR message (see [`PrivateDataLimit`]).
    pub private_data: Vec<u8>,
    /// The RDMA READ and atomic requests this side accepts in flight as a target
    /// (`responder_resources`; becomes the QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// The RDMA READ and atomic requests this side issues in flight (`initiator_depth`;
    /// becomes the QP's `max_rd_atomic`, bounded by the peer's responder resources).
    pub initiator_depth: u8,
    /// Whether this side's receive queue is flow-controlled by credits (`flow_control`).
    pub flow_control: bool,
    /// Retransmissions after a transport timeout (`retry_count`, 0–7; the active side's
    /// value serves both).
    pub retry_count: u8,
    /// Retransmissions after an RNR NAK (`rnr_retry_count`, 0–7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// Whether the QP uses a shared receive queue (`srq`).
    pub srq: bool,
    /// The QP number to announce when no QP was given to [`CmId::set_qp`] (`qp_num`).
    pub qp_num: u32,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// The peer's connection parameters, as a [`CmEventKind::ConnectRequest`],
/// [`CmEventKind::ConnectResponse`] or [`CmEventKind::Established`] event reports them
/// (`rdma_cm_event.param.conn`; the private data is [`CmEvent::private_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerConnParam {
    /// The peer's responder resources.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
    /// Whether the peer's receive queue is flow-controlled.
    pub flow_control: bool,
    /// The retry count of the connection.
    pub retry_count: u8,
    /// The RNR retry count the peer asked for.
    pub rnr_retry_count: u8,
    /// Whether the peer's QP uses a shared receive queue.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// What a UD service resolution reports (`rdma_cm_event.param.ud`): the remote UD QP and
/// how to address it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The remote QP number.
    pub qp_num: u32,
    /// The remote QP's Q_Key.
    pub qkey: u32,
    /// An address vector reaching the remote QP (for `create_ah`).
    pub ah_attr: AhAttr,
}

/// The kind of a CM event (`enum rdma_cm_event_type`; [`CmEventKind::value`] is its
/// number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    AddrError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a new connection request at a listener.
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer accepted a connection whose QP the user
    /// manages; answer with [`CmId::establish`].
    ConnectResponse,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the connection failed (e.g. a timeout waiting for
    /// the RTU, or a protocol error).
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer within the CM's timeouts and
    /// retries.
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`: the peer rejected the request; `status` is the IBTA
    /// reject reason (e.g. 28 consumer reject, 8 invalid service ID).
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`: either side disconnected (or the connection's QP
    /// failed).
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    DeviceRemoval,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`: a join of a multicast group completed; the UD
    /// parameters address the group (QPN 0xFFFFFF, the group's Q_Key).
    MulticastJoin,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`: a joined group failed.
    MulticastError,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    AddrChange,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP of a disconnected connection may be reused.
    TimewaitExit,
}

impl CmEventKind {
    /// The `enum rdma_cm_event_type` value.
    pub fn value(self) -> u32 {
        match self {
            CmEventKind::AddrResolved => 0,
            CmEventKind::AddrError => 1,
            CmEventKind::RouteResolved => 2,
            CmEventKind::RouteError => 3,
            CmEventKind::ConnectRequest => 4,
            CmEventKind::ConnectResponse => 5,
            CmEventKind::ConnectError => 6,
            CmEventKind::Unreachable => 7,
            CmEventKind::Rejected => 8,
            CmEventKind::Established => 9,
            CmEventKind::Disconnected => 10,
            CmEventKind::DeviceRemoval => 11,
            CmEventKind::MulticastJoin => 12,
            CmEventKind::MulticastError => 13,
            CmEventKind::AddrChange => 14,
            CmEventKind::TimewaitExit => 15,
        }
    }
}

/// The reject reason of a consumer's [`CmId::reject`] (IBTA REJ reason 28, "consumer
/// reject"), as [`CmEventKind::Rejected`] reports it.
pub const REJ_CONSUMER_DEFINED: i32 = 28;
/// The reject reason for a request to a service nobody listens on (IBTA REJ reason 8,
/// "invalid service ID").
pub const REJ_INVALID_SERVICE_ID: i32 = 8;

/// Extra parameters of an event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CmEventParam {
    /// None.
    #[default]
    None,
    /// A connected port space's parameters.
    Conn(PeerConnParam),
    /// A UD service resolution's result.
    Ud(UdParam),
}

/// A CM event (`struct rdma_cm_event`).
#[derive(Clone)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The id it happened to; for [`CmEventKind::ConnectRequest`], the new id of the
    /// requested connection.
    pub id: Arc<dyn CmId>,
    /// For [`CmEventKind::ConnectRequest`], the listening id.
    pub listen_id: Option<Arc<dyn CmId>>,
    /// 0, a negative errno (e.g. `-ETIMEDOUT` for `Unreachable`), or for `Rejected` the
    /// IBTA reject reason.
    pub status: i32,
    /// The private data the peer sent with the message that caused the event (REQ, REP,
    /// REJ, RTU, DREQ or SIDR REQ/REP), without the CM's IP header.
    pub private_data: Vec<u8>,
    /// Connection or UD parameters.
    pub param: CmEventParam,
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("id", &self.id.handle())
            .field("listen_id", &self.listen_id.as_ref().map(|l| l.handle()))
            .field("status", &self.status)
            .field("private_data", &self.private_data.len())
            .field("param", &self.param)
            .finish()
    }
}

/// A CM event channel (`struct rdma_event_channel`): a file descriptor that is readable
/// while an event is pending. One channel serves the ids of every device of its
/// provider.
pub trait CmChannel: Any + Send + Sync {
    /// The channel's file descriptor, for epoll or tokio's `AsyncFd`. Created
    /// non-blocking; its `O_NONBLOCK` flag belongs to the user, and
    /// [`CmChannel::get_event`] never blocks whatever the flag.
    fn fd(&self) -> BorrowedFd<'_>;

    /// Takes the next event without blocking, oldest first (`rdma_get_cm_event` on a
    /// non-blocking channel); `rdma_ack_cm_event` is dropping it.
    fn get_event(&self) -> Option<CmEvent>;
}

/// An RDMA CM identifier on one device (`struct rdma_cm_id`). Dropping the last handle
/// destroys it (`rdma_destroy_id`): a connected id sends a disconnect request, a
/// listener stops listening, a request not yet answered is rejected.
pub trait CmId: Any + Send + Sync {
    /// A number naming this id, unique in the process while it lives.
    fn handle(&self) -> u64;

    /// The port space it was created in.
    fn port_space(&self) -> PortSpace;

    /// The device it is on (`rdma_cm_id.verbs`).
    fn context(&self) -> Arc<dyn Context>;

    /// The device port it uses (`rdma_cm_id.port_num`, 1-based).
    fn port_num(&self) -> u8 {
        1
    }

    /// Binds a local address (`rdma_bind_addr`): the device's address or the unspecified
    /// address of its family; port 0 picks a free port. A port already bound in the same
    /// port space on the device is an error (`EADDRINUSE`), as is an address that is not
    /// the device's (`EADDRNOTAVAIL`).
    fn bind(&self, addr: SocketAddr) -> Result<()>;

    /// The bound local address (`rdma_get_local_addr`), once bound or resolved.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// The peer's address (`rdma_get_peer_addr`), once resolved or connected.
    fn peer_addr(&self) -> Option<SocketAddr>;

    /// Listens for connection requests (`rdma_listen`); binds port 0 first if unbound.
    /// At most `backlog` requests wait unanswered (a positive number; more are rejected
    /// until some are accepted or rejected).
    fn listen(&self, backlog: u32) -> Result<()>;

    /// Resolves `dst` to this device (`rdma_resolve_addr`); binds an ephemeral port (and
    /// `src` if given) first if unbound. Completes with [`CmEventKind::AddrResolved`] or
    /// [`CmEventKind::AddrError`] within `timeout`.
    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()>;

    /// Resolves the route to the resolved address (`rdma_resolve_route`). Completes with
    /// [`CmEventKind::RouteResolved`] or [`CmEventKind::RouteError`] within `timeout`.
    fn resolve_route(&self, timeout: Duration) -> Result<()>;

    /// The queue pair the CM moves through INIT, RTR and RTS (and ERR on disconnect), as
    /// `rdma_create_qp` attaches one; `None` detaches it.
    fn set_qp(&self, qp: Option<Arc<dyn QueuePair>>) -> Result<()>;

    /// The attached queue pair.
    fn qp(&self) -> Option<Arc<dyn QueuePair>>;

    /// The attributes (and their mask) that move this id's QP to `state`
    /// (`rdma_init_qp_attr`): INIT (port, P_Key index, access flags, Q_Key for UD), RTR
    /// (path MTU, destination QP and PSN, address vector, responder resources) and RTS
    /// (send PSN, timeout, retry counts, initiator depth) once the peer's parameters are
    /// known.
    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)>;

    /// Requests a connection (`rdma_connect`) once the route is resolved; see the module
    /// documentation for the events that follow.
    fn connect(&self, param: &ConnParam) -> Result<()>;

    /// Accepts a connection request (`rdma_accept`) on the id a
    /// [`CmEventKind::ConnectRequest`] brought.
    fn accept(&self, param: &ConnParam) -> Result<()>;

    /// Rejects a connection request with private data (`rdma_reject`): the peer gets
    /// [`CmEventKind::Rejected`] with status [`REJ_CONSUMER_DEFINED`].
    fn reject(&self, private_data: &[u8]) -> Result<()>;

    /// Disconnects (`rdma_disconnect`): the QP moves to ERR, the peer is told, and both
    /// sides get [`CmEventKind::Disconnected`].
    fn disconnect(&self) -> Result<()>;

    /// Completes a connection whose QP the user manages after
    /// [`CmEventKind::ConnectResponse`] (`rdma_establish`): sends the RTU.
    fn establish(&self) -> Result<()>;
}

/// Whether `len` bytes of consumer private data fit a message whose limit is `limit`.
pub fn check_private_data(len: usize, limit: usize, what: &'static str) -> Result<()> {
    if len > limit {
        return Err(crate::Error::InvalidArgument(format!(
            "{what} private data of {len} bytes exceeds rdma_cm's limit of {limit}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_are_rdma_cm_s() {
        // rdma_cm's IP services: 0x0000000001ss pppp with ss the port space's low byte.
        assert_eq!(PortSpace::Tcp.service_id(7174), 0x0000_0000_0106_1c06);
        assert_eq!(PortSpace::Udp.service_id(1), 0x0000_0000_0111_0001);
        for ps in [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
            PortSpace::Ipoib,
        ] {
            assert_eq!(PortSpace::from_value(ps.value()), Some(ps));
            assert_eq!(
                PortSpace::from_service_id(ps.service_id(4791)),
                Some((ps, 4791))
            );
        }
        assert_eq!(PortSpace::from_service_id(0x1234_0000_0106_0001), None);
        assert_eq!(PortSpace::from_service_id(0x0000_0000_0177_0001), None);
        assert_eq!(PortSpace::Ipoib.service_id(2), 0x0000_0000_0002_0002);
    }

    #[test]
    fn event_numbers_are_librdmacm_s() {
        assert_eq!(CmEventKind::ConnectRequest.value(), 4);
        assert_eq!(CmEventKind::Established.value(), 9);
        assert_eq!(CmEventKind::TimewaitExit.value(), 15);
    }

    #[test]
    fn private_data_limits() {
        assert!(check_private_data(56, PrivateDataLimit::REQ, "REQ").is_ok());
        assert!(check_private_data(57, PrivateDataLimit::REQ, "REQ").is_err());
    }
}
