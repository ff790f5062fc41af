//! Making a connection: the endpoint information each side tells the other, the TCP
//! handshake's messages (typed: [`Request`], [`Reply`]), preparing a queue pair and
//! bringing it up, and the two sides of the exchange (`Rdma::connect_with`,
//! `ConnRequest::accept`/`reject`).
//!
//! # The TCP handshake
//!
//! ```text
//! client -> listener   Request   EndpointInfo (ENDPOINT_INFO_LEN bytes), private data
//!                                (1 length byte, then the bytes)
//! listener -> client   Reply     'A' EndpointInfo, nonce (8 bytes), private data
//!                             or 'J' private data                 (rejected)
//!                             or 'E' 1 port (2 bytes)             (devices cannot talk)
//! client: QP to RTS, sends the nonce as the connection's first RDMA message (the hello)
//! listener -> client   Reply     'C'                              (the hello arrived)
//! ```
//!
//! Everything is big-endian. Decoding is pure ([`Request::decode`], [`Reply::decode`]):
//! it says how many bytes it needs, so the stream is never read past a message.

use super::{ConnShared, Connection, lock};
use crate::error::{CloseReason, Error, HandshakeError, ProtocolViolation, Result};
use crate::rdma::Rdma;
use remem_verbs::{AccessFlags, Gid, Mtu, rc};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

/// What a connection's endpoint tells its peer: enough to connect an RC queue pair, and
/// the message layer's limits. Exchanged by [`Rdma::connect`] / [`crate::Listener::accept`]
/// over TCP, or by the application some other way ([`PreparedConnection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointInfo {
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number the endpoint sends.
    pub psn: u32,
    /// GID (RoCE v2: the IP address).
    pub gid: Gid,
    /// Path MTU the endpoint can do.
    pub mtu: Mtu,
    /// Messages the endpoint can take before it returns credits.
    pub recv_credits: u32,
    /// Largest message it receives in one SEND (larger ones are read from the sender's
    /// memory).
    pub max_message: u32,
    /// Largest message it receives at all ([`crate::RdmaBuilder::max_large_message`]).
    pub max_large_message: u32,
    /// The UDP port its device takes RoCEv2 packets on: 4791 but for soft devices bound
    /// elsewhere; 0 if unknown. Connecting puts it in this connection's path (the QP's
    /// address vector, [`remem_verbs::AhAttr::udp_port`]) and nowhere else, so soft
    /// devices on any ports talk and no other connection's packets change destination; a
    /// device that sends only to 4791 facing a peer on another port fails to connect
    /// ([`HandshakeError::PortMismatch`]).
    pub udp_port: u16,
}

/// Magic and version of the endpoint exchange. Version 4: the UDP port is used (each
/// side's device is told its peer's), no longer only compared.
const MAGIC: &[u8; 6] = b"REMEM\0";
const VERSION: u16 = 4;
/// Bytes of an encoded [`EndpointInfo`].
pub const ENDPOINT_INFO_LEN: usize = 52;

/// The most private data a connection request or answer carries: 196 bytes, RDMA CM's
/// limit for an accept (a connect request through RDMA CM takes 56).
pub const MAX_PRIVATE_DATA: usize = 196;

/// Checks the first 8 bytes of an endpoint (magic, version).
fn check_head(b: &[u8]) -> Result<(), HandshakeError> {
    if b.len() < 8 || &b[..6] != MAGIC {
        return Err(HandshakeError::NotRemem);
    }
    let version = u16::from_be_bytes([b[6], b[7]]);
    if version != VERSION {
        return Err(HandshakeError::Version {
            peer: version,
            ours: VERSION,
        });
    }
    Ok(())
}

impl EndpointInfo {
    /// Encodes it (magic, version, fields; big-endian).
    ///
    /// ```
    /// use remem::{EndpointInfo, ENDPOINT_INFO_LEN};
    /// use remem::verbs::{Gid, Mtu};
    ///
    /// let info = EndpointInfo {
    ///     qpn: 17, psn: 0x1234, gid: Gid::from("127.0.0.1".parse::<std::net::IpAddr>().unwrap()),
    ///     mtu: Mtu::Mtu1024, recv_credits: 32, max_message: 65536,
    ///     max_large_message: 1 << 24, udp_port: 4791,
    /// };
    /// let bytes = info.to_bytes();
    /// assert_eq!(bytes.len(), ENDPOINT_INFO_LEN);
    /// assert_eq!(EndpointInfo::from_bytes(&bytes).unwrap(), info);
    /// ```
    pub fn to_bytes(&self) -> [u8; ENDPOINT_INFO_LEN] {
        let mut b = [0u8; ENDPOINT_INFO_LEN];
        b[..6].copy_from_slice(MAGIC);
        b[6..8].copy_from_slice(&VERSION.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..32].copy_from_slice(self.gid.raw());
        b[32..36].copy_from_slice(&self.mtu.bytes().to_be_bytes());
        b[36..40].copy_from_slice(&self.recv_credits.to_be_bytes());
        b[40..44].copy_from_slice(&self.max_message.to_be_bytes());
        b[44..48].copy_from_slice(&self.max_large_message.to_be_bytes());
        b[48..50].copy_from_slice(&self.udp_port.to_be_bytes());
        b
    }

    /// Decodes what [`EndpointInfo::to_bytes`] wrote; another magic, version, length or a
    /// bad field is an [`Error::Handshake`].
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        Ok(Self::decode(b)?)
    }

    fn decode(b: &[u8]) -> Result<Self, HandshakeError> {
        check_head(b)?;
        if b.len() != ENDPOINT_INFO_LEN {
            return Err(HandshakeError::BadField("length"));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(EndpointInfo {
            qpn: u32_at(8) & 0x00ff_ffff,
            psn: u32_at(12) & 0x00ff_ffff,
            gid: Gid(gid),
            mtu: Mtu::from_bytes(u32_at(32)).ok_or(HandshakeError::BadField("MTU"))?,
            recv_credits: u32_at(36),
            max_message: u32_at(40),
            max_large_message: u32_at(44),
            udp_port: u16::from_be_bytes([b[48], b[49]]),
        })
    }
}

/// What decoding a handshake message from the bytes read so far gives.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded<T> {
    /// The message, whole.
    Done(T),
    /// It needs this many bytes in all: read up to that, then decode again.
    Need(usize),
}

/// The connecting side's request: its endpoint and private data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) info: EndpointInfo,
    pub(crate) private_data: Vec<u8>,
}

/// Decodes `len`-prefixed private data at `at` of `b`, the message ending there.
fn decode_private_data(b: &[u8], at: usize) -> Result<Decoded<Vec<u8>>, HandshakeError> {
    let Some(&len) = b.get(at) else {
        return Ok(Decoded::Need(at + 1));
    };
    let len = usize::from(len);
    if len > MAX_PRIVATE_DATA {
        return Err(HandshakeError::PrivateDataTooLong(len));
    }
    match b.get(at + 1..at + 1 + len) {
        Some(pd) => Ok(Decoded::Done(pd.to_vec())),
        None => Ok(Decoded::Need(at + 1 + len)),
    }
}

fn emit_private_data(out: &mut Vec<u8>, pd: &[u8]) {
    out.push(pd.len().min(MAX_PRIVATE_DATA) as u8);
    out.extend_from_slice(&pd[..pd.len().min(MAX_PRIVATE_DATA)]);
}

impl Request {
    pub(crate) fn emit(&self) -> Vec<u8> {
        let mut out = self.info.to_bytes().to_vec();
        emit_private_data(&mut out, &self.private_data);
        out
    }

    /// Decodes a request from the bytes read so far: magic and version first, so that a
    /// peer speaking something else is told apart at once.
    pub(crate) fn decode(b: &[u8]) -> Result<Decoded<Self>, HandshakeError> {
        if b.len() < 8 {
            return Ok(Decoded::Need(8));
        }
        check_head(b)?;
        let Some(info) = b.get(..ENDPOINT_INFO_LEN) else {
            return Ok(Decoded::Need(ENDPOINT_INFO_LEN));
        };
        let info = EndpointInfo::decode(info)?;
        Ok(match decode_private_data(b, ENDPOINT_INFO_LEN)? {
            Decoded::Done(private_data) => Decoded::Done(Request { info, private_data }),
            Decoded::Need(n) => Decoded::Need(n),
        })
    }
}

/// The listener's answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Accepted: its endpoint, the nonce the client's hello must carry, private data.
    Accept {
        info: EndpointInfo,
        nonce: u64,
        private_data: Vec<u8>,
    },
    /// Rejected, with private data (why, if it says).
    Reject { private_data: Vec<u8> },
    /// The listener's device cannot reach the client's: the port it takes RoCEv2 on.
    PortMismatch { port: u16 },
    /// The client's hello arrived: the connection is up.
    Confirmed,
}

const TAG_ACCEPT: u8 = b'A';
const TAG_REJECT: u8 = b'J';
const TAG_PORT: u8 = b'E';
const TAG_CONFIRMED: u8 = b'C';
/// The version of the `PortMismatch` answer's layout.
const PORT_ANSWER_VERSION: u8 = 1;

impl Reply {
    pub(crate) fn emit(&self) -> Vec<u8> {
        match self {
            Reply::Accept {
                info,
                nonce,
                private_data,
            } => {
                let mut out = vec![TAG_ACCEPT];
                out.extend_from_slice(&info.to_bytes());
                out.extend_from_slice(&nonce.to_be_bytes());
                emit_private_data(&mut out, private_data);
                out
            }
            Reply::Reject { private_data } => {
                let mut out = vec![TAG_REJECT];
                emit_private_data(&mut out, private_data);
                out
            }
            Reply::PortMismatch { port } => {
                let mut out = vec![TAG_PORT, PORT_ANSWER_VERSION];
                out.extend_from_slice(&port.to_be_bytes());
                out
            }
            Reply::Confirmed => vec![TAG_CONFIRMED],
        }
    }

    /// Decodes an answer from the bytes read so far; an unknown first byte is
    /// [`HandshakeError::Unexpected`].
    pub(crate) fn decode(b: &[u8]) -> Result<Decoded<Self>, HandshakeError> {
        let Some(&tag) = b.first() else {
            return Ok(Decoded::Need(1));
        };
        match tag {
            TAG_ACCEPT => {
                let end = 1 + ENDPOINT_INFO_LEN + 8;
                let Some(fixed) = b.get(1..end) else {
                    return Ok(Decoded::Need(end));
                };
                let info = EndpointInfo::decode(&fixed[..ENDPOINT_INFO_LEN])?;
                let mut nonce = [0u8; 8];
                nonce.copy_from_slice(&fixed[ENDPOINT_INFO_LEN..]);
                let nonce = u64::from_be_bytes(nonce);
                Ok(match decode_private_data(b, end)? {
                    Decoded::Done(private_data) => Decoded::Done(Reply::Accept {
                        info,
                        nonce,
                        private_data,
                    }),
                    Decoded::Need(n) => Decoded::Need(n),
                })
            }
            TAG_REJECT => Ok(match decode_private_data(b, 1)? {
                Decoded::Done(private_data) => Decoded::Done(Reply::Reject { private_data }),
                Decoded::Need(n) => Decoded::Need(n),
            }),
            TAG_PORT => {
                let Some(f) = b.get(1..4) else {
                    return Ok(Decoded::Need(4));
                };
                if f[0] != PORT_ANSWER_VERSION {
                    return Err(HandshakeError::Unexpected(f[0]));
                }
                Ok(Decoded::Done(Reply::PortMismatch {
                    port: u16::from_be_bytes([f[1], f[2]]),
                }))
            }
            TAG_CONFIRMED => Ok(Decoded::Done(Reply::Confirmed)),
            other => Err(HandshakeError::Unexpected(other)),
        }
    }
}

/// Reads one handshake message from `stream` with `decode`, never past its end.
async fn read_msg<T>(
    stream: &mut TcpStream,
    decode: impl Fn(&[u8]) -> Result<Decoded<T>, HandshakeError>,
) -> Result<T> {
    let mut buf = Vec::new();
    loop {
        match decode(&buf)? {
            Decoded::Done(t) => return Ok(t),
            Decoded::Need(n) => {
                let at = buf.len();
                buf.resize(n, 0);
                match stream.read_exact(&mut buf[at..]).await {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return Err(HandshakeError::Closed.into());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
}

/// A connection's queue pair before it is connected: its [`EndpointInfo`] goes to the peer
/// by whatever means the application likes, and [`PreparedConnection::connect`] takes the
/// peer's. (The peer's receive buffers must be posted before anything is sent: connect
/// both sides, then let them talk.)
#[derive(Debug)]
pub struct PreparedConnection {
    pub(crate) shared: Arc<ConnShared>,
    pub(crate) info: EndpointInfo,
}

impl PreparedConnection {
    /// Sets the first PSN this side sends (the one a connection manager negotiated).
    pub(crate) fn set_psn(&mut self, psn: u32) {
        self.info.psn = psn & 0x00ff_ffff;
    }

    /// What to tell the peer.
    pub fn local_info(&self) -> EndpointInfo {
        self.info
    }

    /// Connects to the peer described by `remote`: the QP goes through RTR to RTS, its path
    /// to the peer's GID at the peer's UDP port (that QP's alone: the device's other paths
    /// do not change). A device that sends only to port 4791 facing a peer on another
    /// fails here ([`HandshakeError::PortMismatch`]).
    pub fn connect(self, remote: EndpointInfo) -> Result<Connection> {
        let port = self.shared.rdma.path_port(remote.udp_port)?;
        self.shared.to_rtr(&self.info, &remote, port)?;
        self.shared.to_rts(&self.info)?;
        let shared = self.shared;
        shared.attach(&remote)?;
        lock(&shared.life).state.confirm();
        shared.start_keepalive();
        tracing::debug!(qpn = shared.qp.qp_num(), peer_qpn = remote.qpn, "connected");
        Ok(Connection { shared })
    }

    /// The listener's half: the QP goes to RTR only, its path to `remote`'s GID at UDP
    /// port `port` ([`Rdma::path_port`]) — it answers only what arrives from there
    /// and sends nothing of its own — until the peer's hello with `nonce` has arrived (the
    /// receiver learns it), when [`ConnShared::confirm_up`] takes it to RTS.
    fn connect_pending(
        self,
        remote: EndpointInfo,
        port: u16,
        nonce: u64,
    ) -> Result<(Connection, oneshot::Receiver<Result<(), CloseReason>>)> {
        let (tx, rx) = oneshot::channel();
        {
            let mut life = lock(&self.shared.life);
            life.state.expect_hello(nonce);
            life.confirm_tx = Some(tx);
        }
        self.shared.to_rtr(&self.info, &remote, port)?;
        let conn = Connection {
            shared: self.shared,
        };
        conn.shared.attach(&remote)?;
        Ok((conn, rx))
    }
}

impl Rdma {
    /// Creates a queue pair, its completion queue and receive buffers, ready to be
    /// connected to a peer with the [`EndpointInfo`] it returns.
    pub fn prepare(&self) -> Result<PreparedConnection> {
        self.prepare_with(&ConnectOptions::default())
    }

    /// [`Rdma::prepare`] with options (the private data is not used: exchange it along
    /// with the endpoint information).
    pub fn prepare_with(&self, opts: &ConnectOptions) -> Result<PreparedConnection> {
        let shared = ConnShared::new(self, opts)?;
        let cfg = self.config();
        let info = EndpointInfo {
            qpn: shared.qp.qp_num(),
            psn: cfg.sq_psn.unwrap_or_else(rand::random) & 0x00ff_ffff,
            gid: self.gid(),
            mtu: self.mtu(),
            // Behind a shared receive queue too: there the credits bound what one peer
            // can queue for the application, while the queue's buffers serve every
            // connection (an empty queue is met with RNR retries).
            recv_credits: cfg.recv_depth,
            max_message: cfg.max_message as u32,
            max_large_message: cfg.max_large_message as u32,
            udp_port: self.roce_port(),
        };
        Ok(PreparedConnection { shared, info })
    }

    /// Connects to a remem listener at `addr`: endpoint information goes both ways over
    /// TCP, both queue pairs are brought to RTS, and the connection is usable as soon as
    /// this returns.
    pub async fn connect(&self, addr: impl tokio::net::ToSocketAddrs) -> Result<Connection> {
        self.connect_with(addr, &ConnectOptions::default()).await
    }

    /// [`Rdma::connect`] with options: private data for the listener (which may reject
    /// the connection: [`Error::Rejected`]), a shared receive queue, a separate receive
    /// completion queue.
    ///
    /// The handshake: this side sends its [`EndpointInfo`] and private data; the listener
    /// answers with its own, its private data and a nonce; this side brings its QP up and
    /// sends the nonce as the connection's first RDMA message (proving to the listener
    /// that it sends from the address it claimed), and the listener confirms over TCP once
    /// that message has arrived. Each side's QP is told the UDP port the other takes
    /// RoCEv2 on (its own path's, nothing device-wide), so soft devices on any ports
    /// connect (two `soft@…:0` devices: no port to name); a device that sends only to port 4791 (an RDMA NIC) facing a peer on
    /// another fails with [`HandshakeError::PortMismatch`]; a listener its RoCE packets
    /// cannot reach, with
    /// [`HandshakeError::Unreachable`]. Everything is bounded by
    /// [`RdmaBuilder::handshake_timeout`](crate::RdmaBuilder::handshake_timeout).
    pub async fn connect_with(
        &self,
        addr: impl tokio::net::ToSocketAddrs,
        opts: &ConnectOptions,
    ) -> Result<Connection> {
        check_private_data(&opts.private_data)?;
        let timeout = self.config().handshake_timeout;
        let prepared = self.prepare_with(opts)?;
        let exchange = async {
            let mut stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let request = Request {
                info: prepared.local_info(),
                private_data: opts.private_data.clone(),
            };
            stream.write_all(&request.emit()).await?;
            let reply = match read_msg(&mut stream, Reply::decode).await {
                Err(Error::Handshake(HandshakeError::Unexpected(_))) => {
                    return Err(HandshakeError::NotRemem.into());
                }
                r => r?,
            };
            match reply {
                Reply::Accept {
                    info: remote,
                    nonce,
                    private_data,
                } => {
                    let conn = prepared.connect(remote)?;
                    conn.set_peer_private_data(private_data);
                    // The connection's first message: the listener's QP takes it in RTR
                    // and goes to RTS only once it has arrived from this side's address.
                    let sent = super::driven(
                        &conn.shared,
                        conn.shared
                            .send_bytes(super::Kind::Hello, nonce.to_be_bytes().to_vec()),
                    )
                    .await;
                    match sent {
                        Ok(()) => {}
                        Err(Error::Completion { status, .. }) => {
                            return Err(HandshakeError::Unreachable(status).into());
                        }
                        Err(Error::Closed(CloseReason::Completion { status, .. })) => {
                            return Err(HandshakeError::Unreachable(status).into());
                        }
                        Err(e) => return Err(e),
                    }
                    match read_msg(&mut stream, Reply::decode).await {
                        Ok(Reply::Confirmed) => Ok(conn),
                        Ok(other) => Err(HandshakeError::Unexpected(other.emit()[0]).into()),
                        Err(e) => Err(e),
                    }
                }
                Reply::Reject { private_data } => {
                    tracing::debug!(bytes = private_data.len(), "connection rejected");
                    Err(Error::Rejected(private_data))
                }
                Reply::PortMismatch { port } => Err(HandshakeError::PortMismatch {
                    local: self.roce_port(),
                    peer: port,
                }
                .into()),
                Reply::Confirmed => Err(HandshakeError::NotRemem.into()),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout("connection handshake")),
        }
    }
}

pub(crate) fn check_private_data(pd: &[u8]) -> Result<()> {
    if pd.len() > MAX_PRIVATE_DATA {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data (at most {MAX_PRIVATE_DATA})",
            pd.len()
        )));
    }
    Ok(())
}

/// Options of a connection, on either side ([`Rdma::connect_with`],
/// [`ConnRequest::accept`]).
///
/// ```
/// use remem::{ConnectOptions, RdmaBuilder};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), remem::Error> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let server = RdmaBuilder::new().device("soft@127.0.0.11:0").build()?;
/// let client = RdmaBuilder::new().device("soft@127.0.0.12:0").build()?;
/// let listener = server.listen("127.0.0.1:0").await?;
/// let opts = ConnectOptions {
///     private_data: b"hello".to_vec(),
///     // Give up on a silent peer after 4 × 4.096 µs × 2^14 (about 0.27 s) ...
///     timeout: Some(14),
///     retry_cnt: Some(3),
///     // ... and on any one operation after 100 ms.
///     op_timeout: Some(Duration::from_millis(100)),
///     ..ConnectOptions::default()
/// };
/// let (c, req) = tokio::join!(client.connect_with(listener.local_addr()?, &opts), async {
///     let req = listener.next_request().await?;
///     assert_eq!(req.private_data(), b"hello");
///     req.accept(&ConnectOptions::default()).await
/// });
/// let (c, _s) = (c?, req?);
/// assert_eq!(c.op_timeout(), Some(Duration::from_millis(100)));
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Bytes for the peer (at most [`MAX_PRIVATE_DATA`]): [`ConnRequest::private_data`]
    /// at the listener, [`Connection::peer_private_data`] at the connecting side — e.g. a
    /// memory region descriptor and a peer configuration descriptor, as librpma's
    /// examples pass them.
    pub private_data: Vec<u8>,
    /// Receive completions on a completion queue of their own rather than on the one send
    /// completions use (librpma's `rpma_conn_cfg_set_rcq_size`).
    pub separate_recv_cq: bool,
    /// Take receives from this shared receive queue (its buffers and its completion
    /// queue) instead of buffers of the connection's own; messages then arrive at
    /// [`Srq::receive`](crate::Srq::receive). Overrides `separate_recv_cq`.
    pub srq: Option<crate::Srq>,
    /// The local ACK timeout exponent of this connection's queue pair (default:
    /// [`RdmaBuilder::timeout`](crate::RdmaBuilder::timeout)).
    pub timeout: Option<u8>,
    /// Transport retries of this connection's queue pair (default:
    /// [`RdmaBuilder::retry_cnt`](crate::RdmaBuilder::retry_cnt)).
    pub retry_cnt: Option<u8>,
    /// RNR retries of this connection's queue pair (default:
    /// [`RdmaBuilder::rnr_retry`](crate::RdmaBuilder::rnr_retry)).
    pub rnr_retry: Option<u8>,
    /// The connection's operation timeout (default: none; see
    /// [`Connection::set_op_timeout`]).
    pub op_timeout: Option<std::time::Duration>,
}

/// A connection request a [`crate::Listener`] received: who asks and what it says
/// ([`ConnRequest::private_data`]); accept or reject it. While it lives it takes one of
/// the listener's handshake places ([`crate::RdmaBuilder::max_handshakes`]).
#[derive(Debug)]
pub struct ConnRequest {
    pub(crate) rdma: Rdma,
    pub(crate) stream: TcpStream,
    pub(crate) remote: EndpointInfo,
    pub(crate) private_data: Vec<u8>,
    pub(crate) peer: std::net::SocketAddr,
    /// When its TCP connection was accepted.
    pub(crate) since: Instant,
    /// Where failures the peer caused are reported.
    pub(crate) failures: Arc<super::listener::Failures>,
    pub(crate) _place: OwnedSemaphorePermit,
}

/// Why accepting failed: this side's resources, or the peer.
pub(crate) enum AcceptError {
    Local(Error),
    Peer(Error),
}

impl ConnRequest {
    /// The private data the connecting side sent.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The TCP address the request came from.
    pub fn peer_addr(&self) -> std::net::SocketAddr {
        self.peer
    }

    /// Accepts: brings up a queue pair for it, answers with `opts.private_data`, and
    /// returns the connection once the peer is ready too. The queue pair stays in RTR —
    /// answering what arrives, sending nothing of its own — until the peer's first RDMA
    /// message (the hello with the nonce this side sent over TCP) has arrived from the
    /// address the peer claimed; only then does it go to RTS. A failure the peer caused is
    /// also reported to the listener ([`crate::Listener::next_failure`]).
    pub async fn accept(self, opts: &ConnectOptions) -> Result<Connection> {
        match self.accept_inner(opts).await {
            Ok(c) => Ok(c),
            Err(AcceptError::Local(e) | AcceptError::Peer(e)) => Err(e),
        }
    }

    pub(crate) async fn accept_inner(
        mut self,
        opts: &ConnectOptions,
    ) -> Result<Connection, AcceptError> {
        check_private_data(&opts.private_data).map_err(AcceptError::Local)?;
        let failures = self.failures.clone();
        let peer = self.peer;
        let r = self.accept_exchange(opts).await;
        if let Err(AcceptError::Peer(e)) = &r {
            failures.record(peer, e);
        }
        r
    }

    async fn accept_exchange(&mut self, opts: &ConnectOptions) -> Result<Connection, AcceptError> {
        let timeout = self.rdma.config().handshake_timeout;
        let peer = AcceptError::Peer;
        // This side's device must reach the client's port: if it cannot, the client learns
        // why. The port is only asked about here: it goes into this connection's path, and
        // the device changes nothing for a client that has proven nothing (the QP answers
        // only packets from that GID and port, and sends nothing of its own before the
        // hello has come from there).
        let port = match self.rdma.path_port(self.remote.udp_port) {
            Ok(port) => port,
            Err(e @ Error::Handshake(HandshakeError::PortMismatch { .. })) => {
                let answer = Reply::PortMismatch {
                    port: self.rdma.roce_port(),
                };
                let _ = tokio::time::timeout(timeout, self.stream.write_all(&answer.emit())).await;
                return Err(peer(e));
            }
            Err(e) => return Err(AcceptError::Local(e)),
        };
        let prepared = self.rdma.prepare_with(opts).map_err(AcceptError::Local)?;
        let info = prepared.local_info();
        let nonce: u64 = rand::random();
        let (conn, confirmed) = prepared
            .connect_pending(self.remote, port, nonce)
            .map_err(peer)?;
        conn.set_peer_private_data(std::mem::take(&mut self.private_data));
        let stream = &mut self.stream;
        let exchange = async {
            let answer = Reply::Accept {
                info,
                nonce,
                private_data: opts.private_data.clone(),
            };
            stream.write_all(&answer.emit()).await?;
            // The peer's hello arrives over RDMA; meanwhile it has nothing to say on TCP
            // (a close there means it gave up).
            let mut byte = [0u8; 1];
            tokio::select! {
                r = confirmed => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(CloseReason::Protocol(ProtocolViolation::Handshake))) => {
                        return Err(HandshakeError::BadHello.into());
                    }
                    Ok(Err(reason)) => return Err(Error::Closed(reason)),
                    Err(_) => return Err(conn.shared.closed_error()),
                },
                r = stream.read(&mut byte) => {
                    return Err(match r {
                        Ok(0) => HandshakeError::Closed.into(),
                        Ok(_) => HandshakeError::Unexpected(byte[0]).into(),
                        Err(e) => e.into(),
                    });
                }
            }
            conn.shared.confirm_up(&info)?;
            stream.write_all(&Reply::Confirmed.emit()).await?;
            Ok::<_, Error>(())
        };
        match tokio::time::timeout(timeout, super::driven(&conn.shared, exchange)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(peer(e)),
            Err(_) => Err(peer(Error::Timeout("connection handshake"))),
        }
    }

    /// Rejects: the connecting side's [`Rdma::connect_with`] fails with
    /// [`Error::Rejected`] carrying `private_data` (at most [`MAX_PRIVATE_DATA`] bytes).
    pub async fn reject(mut self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data)?;
        let answer = Reply::Reject {
            private_data: private_data.to_vec(),
        }
        .emit();
        let timeout = self.rdma.config().handshake_timeout;
        let send = async {
            self.stream.write_all(&answer).await?;
            self.stream.shutdown().await
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Error::Timeout("connection handshake")),
        }
    }
}

/// Reads a connection request from a freshly accepted TCP stream, within the handshake
/// timeout: magic and version first, so that a peer speaking something else is told
/// apart at once.
pub(crate) async fn read_request(
    rdma: &Rdma,
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    place: OwnedSemaphorePermit,
    failures: Arc<super::listener::Failures>,
) -> Result<ConnRequest> {
    let since = Instant::now();
    let timeout = rdma.config().handshake_timeout;
    let read = async {
        stream.set_nodelay(true)?;
        read_msg(&mut stream, Request::decode).await
    };
    let request = match tokio::time::timeout(timeout, read).await {
        Ok(r) => r?,
        Err(_) => return Err(Error::Timeout("connection handshake")),
    };
    Ok(ConnRequest {
        rdma: rdma.clone(),
        stream,
        remote: request.info,
        private_data: request.private_data,
        peer,
        since,
        failures,
        _place: place,
    })
}

impl ConnShared {
    /// This side's attributes for the QP's way to RTS (`remem_verbs::rc`, the one helper
    /// every part of the workspace uses): the configuration's port, access, READ/atomic
    /// depths and RNR timer, the connection's retry budget, and — once known — `local`'s
    /// MTU and first PSN.
    fn rc_options(&self, local: Option<&EndpointInfo>) -> rc::RcOptions {
        let cfg = self.rdma.config();
        let mut o = rc::RcOptions {
            port_num: cfg.port,
            sgid_index: self.rdma.gid_index(),
            access: cfg.access & AccessFlags::REMOTE,
            max_rd_atomic: cfg.max_rd_atomic,
            max_dest_rd_atomic: cfg.max_rd_atomic,
            min_rnr_timer: cfg.min_rnr_timer,
            timeout: self.transport.timeout,
            retry_cnt: self.transport.retry_cnt,
            rnr_retry: self.transport.rnr_retry,
            ..rc::RcOptions::default()
        };
        if let Some(local) = local {
            (o.mtu, o.sq_psn) = (local.mtu, local.psn);
        }
        o
    }

    pub(crate) fn to_init(&self) -> Result<()> {
        Ok(rc::to_init(&*self.qp, &self.rc_options(None))?)
    }

    /// Moves the QP to RTR towards `remote`, its path naming UDP port `port` (0: the
    /// device's default; [`Rdma::path_port`]): it answers what arrives, sends nothing.
    fn to_rtr(&self, local: &EndpointInfo, remote: &EndpointInfo, port: u16) -> Result<()> {
        let peer = rc::RcPeer {
            qpn: remote.qpn,
            psn: remote.psn,
            gid: remote.gid,
            mtu: remote.mtu,
        };
        let (mut attr, mask) = self
            .rc_options(Some(local))
            .rtr_attr(self.qp.qp_type(), &peer)?;
        attr.ah_attr.udp_port = port;
        Ok(self.qp.modify(&attr, mask)?)
    }

    /// Moves the QP from RTR to RTS: it may send.
    fn to_rts(&self, local: &EndpointInfo) -> Result<()> {
        Ok(rc::to_rts(&*self.qp, &self.rc_options(Some(local)))?)
    }

    /// Takes what the peer said in the handshake, and starts serving the connection:
    /// completions, the shared receive queue, asynchronous events.
    fn attach(self: &Arc<Self>, remote: &EndpointInfo) -> Result<()> {
        lock(&self.msg.credits).peer_window(remote.recv_credits);
        let _ = self.peer_limits.set(super::PeerLimits {
            max_message: remote.max_message,
            max_large_message: remote.max_large_message,
        });
        let dispatcher = self.rdma.dispatcher();
        dispatcher.serve(self, &self.cq)?;
        match (&self.msg.srq, &self.rcq) {
            (Some(srq), _) => srq.attach(self.qp.qp_num(), self)?,
            (None, Some(rcq)) => dispatcher.serve(self, rcq)?,
            (None, None) => {}
        }
        dispatcher.watch(self.qp.qp_num(), self);
        Ok(())
    }

    /// The listener's side, once the peer's hello has arrived: the QP goes to RTS, and
    /// the connection works as any other (keepalive, the hello's credit).
    fn confirm_up(self: &Arc<Self>, local: &EndpointInfo) -> Result<()> {
        self.check_open()?;
        self.to_rts(local)?;
        lock(&self.life).state.confirm();
        self.start_keepalive();
        self.maybe_return_credits();
        tracing::debug!(qpn = self.qp.qp_num(), "connection confirmed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_info() -> impl Strategy<Value = EndpointInfo> {
        (
            0u32..1 << 24,
            0u32..1 << 24,
            any::<[u8; 16]>(),
            proptest::sample::select(vec![
                Mtu::Mtu256,
                Mtu::Mtu512,
                Mtu::Mtu1024,
                Mtu::Mtu2048,
                Mtu::Mtu4096,
            ]),
            any::<(u32, u32, u32, u16)>(),
        )
            .prop_map(
                |(qpn, psn, gid, mtu, (credits, max, large, port))| EndpointInfo {
                    qpn,
                    psn,
                    gid: Gid(gid),
                    mtu,
                    recv_credits: credits,
                    max_message: max,
                    max_large_message: large,
                    udp_port: port,
                },
            )
    }

    fn any_pd() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..=MAX_PRIVATE_DATA)
    }

    fn any_reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            (any_info(), any::<u64>(), any_pd()).prop_map(|(info, nonce, private_data)| {
                Reply::Accept {
                    info,
                    nonce,
                    private_data,
                }
            }),
            any_pd().prop_map(|private_data| Reply::Reject { private_data }),
            any::<u16>().prop_map(|port| Reply::PortMismatch { port }),
            Just(Reply::Confirmed),
        ]
    }

    /// Decodes `bytes` as a stream would deliver them: only as many as asked for.
    fn decode_stream<T>(
        bytes: &[u8],
        decode: impl Fn(&[u8]) -> Result<Decoded<T>, HandshakeError>,
    ) -> Result<(T, usize), HandshakeError> {
        let mut have = 0;
        loop {
            match decode(&bytes[..have])? {
                Decoded::Done(t) => return Ok((t, have)),
                Decoded::Need(n) => {
                    assert!(
                        n > have && n <= bytes.len(),
                        "asks for {n} of {}",
                        bytes.len()
                    );
                    have = n;
                }
            }
        }
    }

    proptest! {
        #[test]
        fn endpoint_round_trip(info in any_info()) {
            prop_assert_eq!(EndpointInfo::from_bytes(&info.to_bytes()).unwrap(), info);
        }

        #[test]
        fn request_round_trip(info in any_info(), private_data in any_pd()) {
            let r = Request { info, private_data };
            let bytes = r.emit();
            prop_assert_eq!(decode_stream(&bytes, Request::decode), Ok((r, bytes.len())));
        }

        #[test]
        fn reply_round_trip(r in any_reply()) {
            let bytes = r.emit();
            prop_assert_eq!(decode_stream(&bytes, Reply::decode), Ok((r, bytes.len())));
        }

        /// Arbitrary bytes: a message, a typed error, or a request for more — never a
        /// panic, and never a request for fewer bytes than it has.
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(Decoded::Need(n)) = Reply::decode(&b) {
                prop_assert!(n > b.len());
            }
            if let Ok(Decoded::Need(n)) = Request::decode(&b) {
                prop_assert!(n > b.len());
            }
        }
    }

    #[test]
    fn typed_errors() {
        assert_eq!(Reply::decode(b"Z"), Err(HandshakeError::Unexpected(b'Z')));
        assert_eq!(Request::decode(b"HTTP/1.1"), Err(HandshakeError::NotRemem));
        let mut old = *b"REMEM\0\0\x02";
        assert_eq!(
            Request::decode(&old),
            Err(HandshakeError::Version {
                peer: 2,
                ours: VERSION
            })
        );
        old[7] = VERSION as u8;
        assert_eq!(Request::decode(&old), Ok(Decoded::Need(ENDPOINT_INFO_LEN)));
        assert_eq!(
            Reply::decode(&[b'J', 197]),
            Err(HandshakeError::PrivateDataTooLong(197))
        );
    }
}
