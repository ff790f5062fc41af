//! remem's error type.

use remem_verbs::{WcOpcode, WcStatus};

/// What can go wrong in remem's async API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verbs call failed (device, PD, MR, CQ or QP).
    #[error(transparent)]
    Verbs(#[from] remem_verbs::Error),
    /// The work request completed with an error status.
    #[error("{op:?} completed with {status} (vendor error {vendor_err:#x})")]
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
    /// The peer spoke another protocol or version, or sent something malformed.
    #[error("handshake: {0}")]
    Handshake(String),
    /// The connection is closed (by either side, or after a fatal error); pending operations
    /// fail with this.
    #[error("connection closed{}", .0.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed(Option<String>),
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
    /// The peer rejected the connection; its private data (why, if it said).
    #[error("connection rejected by the peer ({} bytes of private data)", .0.len())]
    Rejected(Vec<u8>),
}

impl From<remem_verbs::MemError> for Error {
    fn from(e: remem_verbs::MemError) -> Self {
        Error::Verbs(e.into())
    }
}

/// `Result` with remem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
