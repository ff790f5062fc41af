//! Memory as the transport reaches it, below everything else in the crate: grants of
//! registered memory and their revocation ([`grant`]: a region's keyed state, the grants a
//! work request or a remote key resolves to, the ranges the scatter/gather send holds), and
//! the key generators ([`keys`]: the permutation that makes lkeys and rkeys unguessable,
//! QP numbers), and the key table that resolves lkeys and rkeys to regions and windows
//! ([`mr`]).

#![forbid(unsafe_code)]

pub mod grant;
pub mod keys;
pub mod mr;

/// Identifies a protection domain within a soft device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// Why a remote key cannot be used for an access (all are NAKed as remote access errors;
/// the cause is for counters and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteKeyError {
    /// No memory region has this rkey (forged, stale or deregistered).
    UnknownKey,
    /// The region belongs to another protection domain.
    OtherPd,
    /// The range is outside the region (or wraps).
    OutOfBounds,
    /// The region lacks the access right.
    MissingAccess,
    /// The key is a type 2 memory window bound to another QP.
    OtherQp,
    /// The key was valid when the message started (a WRITE's FIRST packet, a READ
    /// request) and has been revoked since: its memory region was deregistered.
    Revoked,
}
