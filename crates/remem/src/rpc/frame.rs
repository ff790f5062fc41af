//! The request/response layer's wire format: a 12-byte header before every message's
//! payload, and the ways a peer can break the protocol. Pure: no connection, no IO (the
//! error module names [`RpcViolation`], so nothing here may depend on the rest of remem).

/// Bytes of the header before every RPC message's payload.
pub const HEADER_LEN: usize = 12;

/// The version of the frame format this crate speaks (the header's first byte).
pub const VERSION: u8 = 1;

/// What an RPC message is (the header's second byte: 1, 2, 3).
///
/// ```
/// use remem::rpc::{FrameHeader, FrameKind};
///
/// let refusal = FrameHeader { kind: FrameKind::Refused, id: 3 }.to_bytes();
/// assert_eq!(refusal[1], 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A request (client to server); its payload is the request's bytes.
    Request,
    /// The answer to the request with the same id; its payload is the reply's bytes.
    Reply,
    /// The server will not answer the request with the same id; its payload says why
    /// (UTF-8).
    Refused,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Request => 1,
            FrameKind::Reply => 2,
            FrameKind::Refused => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => FrameKind::Request,
            2 => FrameKind::Reply,
            3 => FrameKind::Refused,
            _ => return None,
        })
    }
}

/// The header of an RPC message, [`HEADER_LEN`] bytes: the version (1 byte), the kind
/// (1 byte), two zero bytes, the request id (8 bytes, big-endian).
///
/// ```
/// use remem::rpc::{FrameHeader, FrameKind, HEADER_LEN};
///
/// let header = FrameHeader { kind: FrameKind::Reply, id: 7 };
/// let mut message = header.to_bytes().to_vec();
/// message.extend_from_slice(b"payload");
/// assert_eq!(FrameHeader::parse(&message), Ok((header, &b"payload"[..])));
/// assert!(FrameHeader::parse(&message[..HEADER_LEN - 1]).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// What the message is.
    pub kind: FrameKind,
    /// The request it is or answers.
    pub id: u64,
}

/// Why bytes are not an RPC message ([`FrameHeader::parse`]).
///
/// ```
/// use remem::rpc::{FrameError, FrameHeader};
///
/// assert_eq!(FrameHeader::parse(b"GET"), Err(FrameError::Short(3)));
/// let unknown_kind = [1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
/// assert_eq!(FrameHeader::parse(&unknown_kind), Err(FrameError::Kind(9)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer bytes than a header.
    #[error("{0} bytes, shorter than an RPC header")]
    Short(usize),
    /// Another version of the frame format.
    #[error("RPC frame version {0}, this side speaks {VERSION}")]
    Version(u8),
    /// A kind this version does not know.
    #[error("unknown RPC frame kind {0}")]
    Kind(u8),
    /// The reserved bytes are not zero.
    #[error("reserved bytes of an RPC header are not zero")]
    Reserved,
}

impl FrameHeader {
    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0; HEADER_LEN];
        b[0] = VERSION;
        b[1] = self.kind.code();
        b[4..].copy_from_slice(&self.id.to_be_bytes());
        b
    }

    /// Splits a message into its header and its payload.
    pub fn parse(message: &[u8]) -> Result<(FrameHeader, &[u8]), FrameError> {
        let Some((&head, payload)) = message.split_first_chunk::<HEADER_LEN>() else {
            return Err(FrameError::Short(message.len()));
        };
        let [version, kind, r0, r1, id @ ..] = head;
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let kind = FrameKind::from_code(kind).ok_or(FrameError::Kind(kind))?;
        if [r0, r1] != [0, 0] {
            return Err(FrameError::Reserved);
        }
        let id = u64::from_be_bytes(id);
        Ok((FrameHeader { kind, id }, payload))
    }
}

/// How a peer broke the request/response protocol: the connection is closed as
/// [`ProtocolViolation::Rpc`](crate::ProtocolViolation::Rpc), and every waiting call fails with that reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcViolation {
    /// A frame whose header does not decode.
    #[error("RPC: {0}")]
    Frame(#[from] FrameError),
    /// A request sent to the calling side ([`RpcClient`](super::RpcClient) answers none).
    #[error("RPC: a request sent to the calling side")]
    RequestToCaller,
    /// A reply to a request id the calling side never used.
    #[error("RPC: a reply to request {0}, never made")]
    UnknownReply(u64),
    /// A reply or refusal sent to the serving side ([`RpcServer`](super::RpcServer) makes no calls).
    #[error("RPC: a {0:?} sent to the serving side")]
    NotARequest(FrameKind),
    /// The calling side takes no answers (it returns no credits) while this many refusals
    /// of requests dropped unanswered wait to be sent
    /// ([`MAX_UNSENT_REFUSALS`](super::MAX_UNSENT_REFUSALS)), and one more was due.
    #[error("RPC: {max} refusals wait to be sent and the caller takes none")]
    UnsentRefusals {
        /// The most refusals kept waiting for a caller.
        max: usize,
    },
}
