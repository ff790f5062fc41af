//! remem's error type, and why connections end.

use remem_verbs::{AsyncEvent, WcOpcode, WcStatus};

/// What can go wrong in remem's async API.
///
/// # The peer died
///
/// A peer that crashed, lost power, or that the network no longer reaches does not say
/// so: it stops answering. The transport retries what it sent (the retry budget,
/// [`RdmaBuilder::timeout`](crate::RdmaBuilder::timeout) and
/// [`RdmaBuilder::retry_cnt`](crate::RdmaBuilder::retry_cnt): about 2.1 s by default), then
/// gives up, and the connection is lost. An idle connection learns it through the
/// keepalive ([`RdmaBuilder::keepalive`](crate::RdmaBuilder::keepalive)), whose probe goes
/// unanswered the same way. What a user sees then:
///
/// - the operation that was waiting: [`Error::Completion`] with status
///   [`RetryExcErr`](remem_verbs::WcStatus::RetryExcErr) ("the peer stopped answering
///   (transport retry counter exceeded)"), or
///   [`RnrRetryExcErr`](remem_verbs::WcStatus::RnrRetryExcErr) when the peer answered but
///   never had a receive for a message ("the peer stopped taking messages");
/// - every other operation, and every later one: [`Error::Closed`] with
///   [`CloseReason::Completion`] of the same status (a `receive` that only waits sees this
///   one, from the keepalive's probe);
/// - with an operation timeout set ([`Connection::set_op_timeout`](crate::Connection::set_op_timeout)),
///   possibly earlier: [`Error::Timeout`], then [`Error::Closed`] with
///   [`CloseReason::Failed`]`(`[`LocalFailure::Timeout`]`)`.
///
/// The messages say it in words first, with the verbs status as the detail in
/// parentheses. [`crate::RdmaStream`] maps all of these to `io::ErrorKind::TimedOut`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verbs call failed (device, PD, MR, CQ or QP).
    #[error(transparent)]
    Verbs(#[from] remem_verbs::Error),
    /// The work request completed with an error status. Shown in words first
    /// ("the peer stopped answering: …"; see [the peer died](Error#the-peer-died)), the
    /// status and the vendor error as the detail.
    #[error("{} (vendor error {vendor_err:#x})", completion_words(*op, *status))]
    Completion {
        /// The operation.
        op: WcOpcode,
        /// The work-completion status.
        status: WcStatus,
        /// Provider-specific detail.
        vendor_err: u32,
    },
    /// Socket IO during connection setup.
    #[error("connection setup: {0}")]
    Io(#[from] std::io::Error),
    /// The connection handshake failed: the peer is not a remem peer, speaks another
    /// version, sent something malformed, or cannot be reached over RDMA.
    #[error("handshake: {0}")]
    Handshake(HandshakeError),
    /// The connection is closed (by either side, or after a fatal error); pending operations
    /// fail with this, and say why.
    #[error("connection closed: {0}")]
    Closed(CloseReason),
    /// An asynchronous event (QP fatal, CQ error, device fatal) ended the connection.
    #[error("asynchronous event: {0}")]
    Event(remem_verbs::AsyncEvent),
    /// Local and remote lengths differ, or a range lies outside its memory region.
    #[error("length mismatch: local {local} bytes, remote {remote} bytes")]
    LengthMismatch {
        /// Local bytes.
        local: u64,
        /// Remote bytes.
        remote: u64,
    },
    /// A range lies outside its memory region.
    #[error("range {start}..{end} outside a region of {len} bytes")]
    OutOfRange {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
        /// Length of the region.
        len: usize,
    },
    /// An argument is invalid (alignment, size, options).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A message is larger than the connection's receive buffers.
    #[error("message of {len} bytes exceeds the connection's maximum of {max}")]
    MessageTooLarge {
        /// Bytes of the message.
        len: usize,
        /// The connection's maximum.
        max: usize,
    },
    /// The peer refused a request (its reason).
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// A time limit passed.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// Bytes that are not a valid descriptor (MR or peer configuration).
    #[error("bad descriptor: {0}")]
    Descriptor(String),
    /// The operation cannot be done on this device and peer (e.g. a persistent flush to a
    /// peer that neither supports FLUSH nor declared direct writes to persistent memory).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A file-backed region ([`crate::Rdma::register_file`]) cannot be set up: the file
    /// cannot be mapped, or its blocks cannot be reserved (no space left, or a file system
    /// that cannot reserve them).
    #[error("file-backed region: {0}")]
    File(std::io::Error),
    /// The peer rejected the connection; its private data (why, if it said). Shown as
    /// text where the bytes are text (trailing zero bytes, the padding of a CM reject,
    /// left out), else in hex.
    #[error("connection rejected by the peer{}", rejection_reason(.0))]
    Rejected(Vec<u8>),
}

/// An operation in words: "an RDMA WRITE".
fn op_words(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::Send => "a SEND",
        WcOpcode::RdmaWrite => "an RDMA WRITE",
        WcOpcode::RdmaRead => "an RDMA READ",
        WcOpcode::CompSwap => "a compare-and-swap",
        WcOpcode::FetchAdd => "a fetch-and-add",
        WcOpcode::BindMw => "a memory window bind",
        WcOpcode::LocalInv => "a local invalidate",
        WcOpcode::Tso => "a TSO send",
        WcOpcode::Flush => "a FLUSH",
        WcOpcode::AtomicWrite => "an ATOMIC WRITE",
        WcOpcode::Recv => "a receive",
        WcOpcode::RecvRdmaWithImm => "a receive (WRITE_WITH_IMM)",
    }
}

/// What a failed completion means, in words, with its status (`ibv_wc_status_str`) as
/// the detail in parentheses.
fn completion_words(op: WcOpcode, status: WcStatus) -> String {
    let op = op_words(op);
    match status {
        WcStatus::RetryExcErr => format!(
            "the peer stopped answering: {op} was not acknowledged within the transport's \
             retries ({status})"
        ),
        WcStatus::RespTimeoutErr => {
            format!("the peer stopped answering: {op} got no response in time ({status})")
        }
        WcStatus::RnrRetryExcErr => format!(
            "the peer stopped taking messages: {op} found no receive posted there within \
             the retries ({status})"
        ),
        WcStatus::RemAccessErr => format!(
            "the peer refused the access: {op} outside the peer's region or without the \
             rights it was registered with ({status})"
        ),
        WcStatus::WrFlushErr => {
            format!("{op} was not done: the connection had already failed ({status})")
        }
        _ => format!("{op} failed ({status})"),
    }
}

/// A rejection's private data for [`Error::Rejected`]'s message: `: "reason"` for text,
/// `: private data 0a0b… (n bytes)` otherwise, nothing when the peer gave none.
fn rejection_reason(data: &[u8]) -> String {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let data = &data[..end];
    if data.is_empty() {
        return " (no reason given)".into();
    }
    match std::str::from_utf8(data) {
        Ok(text) if !text.chars().any(char::is_control) => format!(": \"{text}\""),
        _ => {
            let hex: String = data.iter().take(32).map(|b| format!("{b:02x}")).collect();
            let more = if data.len() > 32 { "…" } else { "" };
            format!(": private data {hex}{more} ({} bytes)", data.len())
        }
    }
}

impl From<remem_verbs::MemError> for Error {
    fn from(e: remem_verbs::MemError) -> Self {
        Error::Verbs(e.into())
    }
}

/// Why a connection handshake failed ([`Error::Handshake`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer's first bytes are not remem's: a port scanner, another protocol.
    #[error("not a remem peer")]
    NotRemem,
    /// The peer speaks another version of the handshake.
    #[error("the peer speaks handshake version {peer}, this side version {ours}")]
    Version {
        /// The peer's version.
        peer: u16,
        /// This side's.
        ours: u16,
    },
    /// A field of the peer's endpoint information is invalid.
    #[error("bad {0} in the peer's endpoint information")]
    BadField(&'static str),
    /// The peer announced more private data than a handshake carries.
    #[error("{0} bytes of private data, above the limit")]
    PrivateDataTooLong(usize),
    /// The peer closed the TCP connection before the handshake was done.
    #[error("the peer closed the connection during the handshake")]
    Closed,
    /// The peer answered something the handshake has no place for.
    #[error("unexpected answer {0:#04x} from the peer")]
    Unexpected(u8),
    /// The devices take RoCEv2 on different UDP ports and one of them can send only to the
    /// standard port 4791 (an RDMA NIC or kernel rxe, which
    /// [`can_send_to_udp_port`](remem_verbs::Context::can_send_to_udp_port) says of no
    /// other port): it cannot reach the other. Soft devices tell each other their ports in the
    /// handshake and talk on any; open the soft device on port 4791 to talk to a NIC.
    #[error(
        "the devices take RoCEv2 on different UDP ports (this side {local}, the peer {peer}) \
         and one of them sends only to port 4791 (an RDMA NIC or kernel rxe): open the soft \
         device on port 4791"
    )]
    PortMismatch {
        /// The port this side's device takes RoCEv2 on.
        local: u16,
        /// The port the peer's device takes RoCEv2 on.
        peer: u16,
    },
    /// The first RDMA message of the connection, which proves the client can be reached
    /// at the address it claimed, was not acknowledged: RoCE packets do not reach the
    /// peer (address, routing, or soft devices on different UDP ports).
    #[error(
        "the peer did not acknowledge the connection's first message ({0}): its device is \
         not reachable over RoCE from this one (check GIDs, routes, firewalls)"
    )]
    Unreachable(WcStatus),
    /// The client's first RDMA message was not the hello it was told to send.
    #[error("the peer's first message is not the hello of this handshake")]
    BadHello,
    /// The RDMA connection manager could not connect ([`crate::Rdma::connect_cm`]):
    /// the event it reported instead of the one expected, and its status — for
    /// [`CmEventKind::Rejected`](remem_verbs::CmEventKind::Rejected) the IBTA reject
    /// reason (8: nobody listens on that port), for
    /// [`CmEventKind::Unreachable`](remem_verbs::CmEventKind::Unreachable) a negative errno.
    #[error("the connection manager reported {event:?} (status {status})")]
    Cm {
        /// The event.
        event: remem_verbs::CmEventKind,
        /// Its status.
        status: i32,
    },
}

/// Why a connection ended: [`Error::Closed`], [`crate::ConnectionEvent::Lost`],
/// [`crate::Connection::closed`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// This side closed it ([`crate::Connection::close`], or dropped it).
    #[error("closed by this side")]
    Local,
    /// The peer closed it in order (its close message arrived).
    #[error("closed by the peer")]
    Peer,
    /// An asynchronous event about the connection's QP or CQ, or a fatal device event
    /// (e.g. the peer's bad access moved the QP to the error state).
    #[error("asynchronous event: {0}")]
    Event(AsyncEvent),
    /// A work request completed with an error: the transport gave up (retries
    /// exhausted: the peer stopped answering, see [the peer died](Error#the-peer-died)),
    /// the peer refused an access, or the QP went to the error state (a receive flushed
    /// while the connection was open). Shown in words, the status in parentheses.
    #[error("{}", completion_words(*op, *status))]
    Completion {
        /// The operation.
        op: WcOpcode,
        /// Its status.
        status: WcStatus,
    },
    /// The peer broke the message protocol.
    #[error("protocol violation by the peer: {0}")]
    Protocol(ProtocolViolation),
    /// This side could no longer serve the connection.
    #[error("{0}")]
    Failed(LocalFailure),
}

/// How a peer broke the message protocol ([`CloseReason::Protocol`]); the connection is
/// closed when one is found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// More messages than the credits this side granted (receive buffers it promised).
    #[error("more messages than the {granted} credits granted")]
    CreditsExceeded {
        /// Credits granted so far (initial window and every credit returned).
        granted: u64,
    },
    /// The peer returned more credits than this side had used.
    #[error("more credits returned than used")]
    CreditsOverReturned,
    /// More large messages announced at once than the protocol allows.
    #[error("more than {max} large messages announced at once")]
    TooManyLargeMessages {
        /// The most in flight.
        max: u32,
    },
    /// A large message above this side's limit ([`crate::RdmaBuilder::max_large_message`]).
    #[error("a message of {len} bytes, above the limit of {max}")]
    MessageTooLarge {
        /// Its length.
        len: u64,
        /// This side's limit.
        max: u64,
    },
    /// A message without the 8-byte header every message carries.
    #[error("a message without a header")]
    NoHeader,
    /// A message of a kind this version does not know.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// A message that only a connection's first message may be, or a first message that
    /// is not the handshake's hello.
    #[error("a message out of place in the handshake")]
    Handshake,
    /// The peer keeps sending agent requests while it leaves this many of our answers
    /// unread (it takes none of our messages).
    #[error("the peer has {max} agent answers waiting and sends more requests")]
    UnreadAnswers {
        /// The most answers kept waiting for a peer.
        max: usize,
    },
    /// The peer gave more regions (`send_local_mr`) than this side keeps untaken.
    #[error("the peer gave more than {max} regions that were not taken")]
    UntakenRegions {
        /// The most given regions kept untaken.
        max: usize,
    },
    /// A large message's announcement that does not decode.
    #[error("a malformed large-message announcement")]
    BadAnnouncement,
    /// A memory region token (`share_local_mr`) that does not decode.
    #[error("peer sent a malformed memory region token")]
    BadRegionToken,
    /// A malformed message of memory lending ([`crate::Connection::request_remote_mr`] and
    /// friends).
    #[error(transparent)]
    Agent(#[from] MalformedAgent),
    /// A request/response frame out of place or malformed ([`crate::rpc`]).
    #[error(transparent)]
    Rpc(#[from] crate::rpc::frame::RpcViolation),
}

/// Why this side could no longer serve a connection ([`CloseReason::Failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocalFailure {
    /// Polling or arming a completion queue failed.
    #[error("the completion queue failed")]
    CompletionQueue,
    /// A large message arrived where no tokio runtime runs to read it.
    #[error("large messages need a tokio runtime")]
    NoRuntime,
    /// Memory for a large message could not be allocated.
    #[error("no memory for a large message")]
    Memory,
    /// Posting a work request failed part-way through a batch.
    #[error("posting a batch failed part-way")]
    Post,
    /// An operation was not done within the connection's operation timeout
    /// ([`crate::Connection::set_op_timeout`]).
    #[error("an operation outlived its timeout")]
    Timeout,
}

impl From<ProtocolViolation> for CloseReason {
    fn from(v: ProtocolViolation) -> Self {
        CloseReason::Protocol(v)
    }
}

impl From<LocalFailure> for CloseReason {
    fn from(f: LocalFailure) -> Self {
        CloseReason::Failed(f)
    }
}

impl From<HandshakeError> for Error {
    fn from(e: HandshakeError) -> Self {
        Error::Handshake(e)
    }
}

impl CloseReason {
    /// Whether the connection ended in order (closed by either side), rather than lost.
    pub fn is_graceful(&self) -> bool {
        matches!(self, CloseReason::Local | CloseReason::Peer)
    }
}

/// `Result` with remem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a memory-lending (agent) message from the peer: the connection is
/// closed as [`ProtocolViolation::Agent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MalformedAgent {
    /// Shorter than an operation and an id.
    #[error("peer sent a malformed agent message")]
    Short,
    /// An operation this version does not know.
    #[error("peer sent an unknown agent operation {0}")]
    UnknownOp(u8),
    /// A request without its fields.
    #[error("peer sent a malformed memory request")]
    Request,
    /// A grant without its fields, or with an invalid region.
    #[error("peer sent a malformed grant")]
    Grant,
    /// A region given away that is missing or invalid.
    #[error("peer sent a malformed memory region")]
    Region,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that stopped answering is said in words; the verbs status is the detail.
    #[test]
    fn a_dead_peer_is_said_in_words_with_the_status_as_detail() {
        let e = Error::Completion {
            op: WcOpcode::RdmaWrite,
            status: WcStatus::RetryExcErr,
            vendor_err: 0,
        };
        assert_eq!(
            e.to_string(),
            "the peer stopped answering: an RDMA WRITE was not acknowledged within the \
             transport's retries (transport retry counter exceeded) (vendor error 0x0)"
        );
        let closed = Error::Closed(CloseReason::Completion {
            op: WcOpcode::Send,
            status: WcStatus::RetryExcErr,
        });
        assert_eq!(
            closed.to_string(),
            "connection closed: the peer stopped answering: a SEND was not acknowledged \
             within the transport's retries (transport retry counter exceeded)"
        );
        let rnr = CloseReason::Completion {
            op: WcOpcode::Send,
            status: WcStatus::RnrRetryExcErr,
        };
        assert!(
            rnr.to_string()
                .starts_with("the peer stopped taking messages: a SEND")
                && rnr.to_string().ends_with("(RNR retry counter exceeded)"),
            "{rnr}"
        );
        let refused = CloseReason::Completion {
            op: WcOpcode::RdmaRead,
            status: WcStatus::RemAccessErr,
        };
        assert!(
            refused
                .to_string()
                .starts_with("the peer refused the access: an RDMA READ"),
            "{refused}"
        );
    }

    /// A rejection shows the peer's reason: as text (its zero padding left out), in hex
    /// when it is not text, and says when there is none.
    #[test]
    fn a_rejection_shows_the_peers_reason() {
        let mut padded = b"server full".to_vec();
        padded.resize(148, 0);
        assert_eq!(
            Error::Rejected(padded).to_string(),
            "connection rejected by the peer: \"server full\""
        );
        assert_eq!(
            Error::Rejected(vec![1, 0xff, 0, 2]).to_string(),
            "connection rejected by the peer: private data 01ff0002 (4 bytes)"
        );
        assert_eq!(
            Error::Rejected(vec![0; 148]).to_string(),
            "connection rejected by the peer (no reason given)"
        );
        let long = Error::Rejected(vec![0xab; 40]).to_string();
        assert!(
            long.ends_with(&format!("{}… (40 bytes)", "ab".repeat(32))),
            "{long}"
        );
    }
}
