//! Typed errors of the verbs model.

#![forbid(unsafe_code)]

use crate::qp::{QpAttrMask, QpState, QpType};

/// The result type of the verbs model.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a verb failed. Each variant says which `errno` rdma-core would have returned
/// ([`Error::errno`]), so providers and users can map between the two.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range or inconsistent (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The QP state transition is not allowed for this QP type (`EINVAL`).
    #[error("invalid QP state transition {from:?} -> {to:?} for a {qp_type:?} QP")]
    InvalidTransition {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// A transition lacks attributes it requires (`EINVAL`).
    #[error("modify QP {from:?} -> {to:?}: missing required attributes {missing:?}")]
    MissingAttributes {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The required attributes that were not in the mask.
        missing: QpAttrMask,
    },
    /// A transition names attributes it does not accept (`EINVAL`).
    #[error(
        "modify QP {from:?} -> {to:?}: attributes {extra:?} are not allowed in this transition"
    )]
    UnexpectedAttributes {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The attributes that are neither required nor optional.
        extra: QpAttrMask,
    },
    /// A QP attribute value is out of range (`EINVAL`).
    #[error("QP attribute {name} out of range: {reason}")]
    InvalidAttribute {
        /// The attribute (as in `struct ibv_qp_attr`).
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The provider does not implement this (`EOPNOTSUPP`).
    #[error("not supported by this provider: {0}")]
    Unsupported(&'static str),
    /// A device limit was reached (`ENOMEM`).
    #[error("resource limit reached: {0}")]
    Exhausted(&'static str),
    /// A work queue has no room for another work request (`ENOMEM`).
    #[error("work queue full: {outstanding} work requests outstanding")]
    QueueFull {
        /// Work requests posted and not yet completed.
        outstanding: u32,
    },
    /// Work requests cannot be posted to a QP in this state (`EINVAL`).
    #[error("cannot post to a QP in state {0:?}")]
    InvalidQpState(QpState),
    /// No device of that name (`ENODEV`).
    #[error("no such RDMA device: {0}")]
    NoSuchDevice(String),
    /// The device exists but cannot be used (`ENODEV`).
    #[error("device unavailable: {0}")]
    DeviceUnavailable(String),
    /// The lkey does not name a memory region of the QP's protection domain (`EINVAL`).
    #[error("lkey {lkey:#x} does not name a memory region of this protection domain")]
    InvalidLkey {
        /// The key.
        lkey: u32,
    },
    /// A scatter/gather entry reaches outside its memory region (`EINVAL`).
    #[error(
        "scatter/gather entry [{addr:#x}, +{length}) lies outside the memory region of lkey {lkey:#x}"
    )]
    SgeOutOfBounds {
        /// Start address of the entry.
        addr: u64,
        /// Length of the entry.
        length: u32,
        /// The entry's lkey.
        lkey: u32,
    },
    /// The memory region lacks a local right the operation needs (`EACCES`).
    #[error("memory region lkey {lkey:#x} lacks LOCAL_WRITE, needed by this operation")]
    LocalAccess {
        /// The entry's lkey.
        lkey: u32,
    },
    /// More scatter/gather entries than the queue was created for (`EINVAL`).
    #[error("too many scatter/gather entries: {given} > {max}")]
    TooManySge {
        /// Entries given.
        given: usize,
        /// The queue's limit.
        max: u32,
    },
    /// Inline data longer than the QP's `max_inline_data` (`EINVAL`).
    #[error("inline data of {given} bytes exceeds max_inline_data {max}")]
    InlineTooLarge {
        /// Bytes given.
        given: u64,
        /// The QP's limit.
        max: u32,
    },
    /// A message longer than the port's maximum message size (`EINVAL`).
    #[error("message of {len} bytes exceeds the maximum message size {max}")]
    MessageTooLarge {
        /// Message length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The operation is not valid on this kind of QP (`EINVAL`).
    #[error("{op} is not valid on a {qp_type:?} QP")]
    InvalidOpcode {
        /// The operation's verbs name.
        op: &'static str,
        /// The QP type.
        qp_type: QpType,
    },
    /// The object is still used by another (`EBUSY`).
    #[error("object in use: {0}")]
    Busy(&'static str),
    /// A memory access out of bounds or misaligned.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// An operating system call failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The `errno` value rdma-core returns for this failure.
    pub fn errno(&self) -> i32 {
        const EINVAL: i32 = 22;
        const ENOMEM: i32 = 12;
        const ENODEV: i32 = 19;
        const EACCES: i32 = 13;
        const EBUSY: i32 = 16;
        const EOPNOTSUPP: i32 = 95;
        const EIO: i32 = 5;
        match self {
            Error::Unsupported(_) => EOPNOTSUPP,
            Error::Exhausted(_) | Error::QueueFull { .. } => ENOMEM,
            Error::NoSuchDevice(_) | Error::DeviceUnavailable(_) => ENODEV,
            Error::LocalAccess { .. } => EACCES,
            Error::Busy(_) => EBUSY,
            Error::Io(e) => e.raw_os_error().unwrap_or(EIO),
            _ => EINVAL,
        }
    }
}

/// A failed post of a list of work requests: which one failed (`bad_wr`) and why.
///
/// As with `ibv_post_send`, the work requests before `index` were posted and will complete;
/// the one at `index` and those after it were not.
#[derive(Debug, thiserror::Error)]
#[error("work request #{index} not posted: {error}")]
pub struct PostError {
    /// Index of the first work request not posted.
    pub index: usize,
    /// Why it was refused.
    #[source]
    pub error: Error,
}

/// An access to a [`MemoryBuffer`](crate::MemoryBuffer) outside it or misaligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// `[offset, offset + len)` is not inside the buffer of `size` bytes (or overflows).
    #[error("access [{offset}, +{len}) is outside a buffer of {size} bytes")]
    OutOfBounds {
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Size of the buffer or region.
        size: u64,
    },
    /// An 8-byte atomic at an address that is not 8-byte aligned.
    #[error("atomic access at address {addr:#x} is not 8-byte aligned")]
    Misaligned {
        /// The address of the access.
        addr: u64,
    },
    /// Writing a range back to its backing store (`msync`) failed.
    #[error("persisting the range failed: {0}")]
    Persist(std::io::ErrorKind),
    /// The memory behind `[offset, offset + len)` is no longer mapped (or no longer
    /// readable): the program unmapped it, or truncated the file behind it, while the
    /// buffer still names it. Only [`MemoryBuffer::read_careful`](crate::MemoryBuffer::read_careful)
    /// reports it; every other access would fault.
    #[error("the memory at [{offset}, +{len}) is no longer mapped")]
    Unmapped {
        /// Offset of the first byte that could not be read.
        offset: u64,
        /// Bytes that could not be read from there on.
        len: u64,
    },
}
