//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: address translation for RDMA endpoints.
//!
//! The node and service are resolved by the C library's `getaddrinfo` (numeric hosts,
//! host names, service names; `RAI_NUMERICHOST` and `RAI_FAMILY` map to
//! `AI_NUMERICHOST` and the family hint). The result is one `rdma_addrinfo`: for
//! `RAI_PASSIVE`, the local address to bind (`ai_src_addr`; the wildcard without a node);
//! otherwise the destination (`ai_dst_addr`), with the hints' source address if they
//! name one. The QP type and port space are the hints' (RC and `RDMA_PS_TCP` by
//! default; UD and `RDMA_PS_UDP` go together). No route or connect data is needed on
//! RoCE (`ai_route_len` and `ai_connect_len` are 0). Every part is `malloc`ed and freed by
//! `rdma_freeaddrinfo`.
//!
//! Errors are the `getaddrinfo` codes (`EAI_NONAME`, ...), as librdmacm returns them;
//! `EAI_BADFLAGS`, `EAI_FAMILY` (not IPv4 or IPv6) and `EAI_QPTYPE`-style mismatches
//! (a UD QP type with a connected port space) answer bad hints; EAI_SYSTEM with errno
//! for allocation failures.
//!
//! The entry points, and the allocation of the `rdma_addrinfo` the program gets, are in
//! `crate::ffi::rdmacm`; this module answers (`answer`).

#![forbid(unsafe_code)]

use super::abi::*;
use crate::abi::{IBV_QPT_RC, IBV_QPT_UD};
use core::ffi::{CStr, c_int};
use std::net::SocketAddr;

/// The flags `rdma_getaddrinfo` knows.
const KNOWN_FLAGS: c_int = RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE | RAI_FAMILY;

/// What the hints ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hints {
    pub flags: c_int,
    pub family: c_int,
    pub qp_type: c_int,
    pub port_space: c_int,
}

/// The QP type and port space of the result (librdmacm's defaults and pairing), or the
/// `EAI_*` code for hints that do not go together.
pub(crate) fn kinds(h: &Hints) -> Result<(c_int, c_int), c_int> {
    let udp = RDMA_PS_UDP as c_int;
    let tcp = RDMA_PS_TCP as c_int;
    let (qp, ps) = match (h.qp_type, h.port_space) {
        (0, 0) => (IBV_QPT_RC as c_int, tcp),
        (0, ps) if ps == udp || ps == RDMA_PS_IPOIB as c_int => (IBV_QPT_UD as c_int, ps),
        (0, ps) => (IBV_QPT_RC as c_int, ps),
        (qp, 0) if qp == IBV_QPT_UD as c_int => (qp, udp),
        (qp, 0) => (qp, tcp),
        (qp, ps) => (qp, ps),
    };
    let ud = qp == IBV_QPT_UD as c_int;
    if (ud && ps == tcp) || (!ud && ps == udp) {
        return Err(libc::EAI_SERVICE);
    }
    if ![
        IBV_QPT_RC as c_int,
        IBV_QPT_UD as c_int,
        crate::abi::IBV_QPT_UC as c_int,
    ]
    .contains(&qp)
    {
        return Err(libc::EAI_SOCKTYPE);
    }
    Ok((qp, ps))
}

/// What `rdma_getaddrinfo` answers (one `rdma_addrinfo`), before the FFI layer
/// allocates it for the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    /// `ai_flags`.
    pub flags: c_int,
    /// `ai_family`.
    pub family: c_int,
    /// `ai_qp_type`.
    pub qp_type: c_int,
    /// `ai_port_space`.
    pub port_space: c_int,
    /// `ai_src_addr`.
    pub src: Option<SocketAddr>,
    /// `ai_dst_addr`.
    pub dst: Option<SocketAddr>,
}

/// `rdma_getaddrinfo` once the FFI layer has read its arguments (`hints` with its source
/// and destination addresses): the answer, or an `EAI_*` code.
pub(crate) fn answer(
    node: Option<&CStr>,
    service: Option<&CStr>,
    hints: Option<(Hints, Option<SocketAddr>, Option<SocketAddr>)>,
) -> Result<Answer, c_int> {
    let (h, hint_src, hint_dst) = hints.unwrap_or((
        Hints {
            flags: 0,
            family: 0,
            qp_type: 0,
            port_space: 0,
        },
        None,
        None,
    ));
    if h.flags & !KNOWN_FLAGS != 0 {
        return Err(libc::EAI_BADFLAGS);
    }
    if ![0, libc::AF_INET, libc::AF_INET6].contains(&h.family) {
        return Err(libc::EAI_FAMILY);
    }
    let (qp_type, port_space) = kinds(&h)?;
    let passive = h.flags & RAI_PASSIVE != 0;
    let resolved = crate::ffi::sockaddr::resolve(node, service, &h)?;
    let (src, dst) = if passive {
        (resolved.or(hint_src), None)
    } else {
        (hint_src, resolved.or(hint_dst))
    };
    if src.is_none() && dst.is_none() {
        return Err(libc::EAI_NONAME);
    }
    let family = match src.or(dst) {
        Some(SocketAddr::V6(_)) => libc::AF_INET6,
        _ => libc::AF_INET,
    };
    Ok(Answer {
        flags: h.flags,
        family,
        qp_type,
        port_space,
        src,
        dst,
    })
}
