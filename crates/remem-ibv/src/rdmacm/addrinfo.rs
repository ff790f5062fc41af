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

#![allow(unsafe_code)]

use super::abi::*;
use super::sockaddr::{sockaddr_to_std, std_to_storage};
use crate::abi::{IBV_QPT_RC, IBV_QPT_UD};
use core::ffi::{CStr, c_char, c_int};
use std::net::SocketAddr;

symver!(
    "rdma_getaddrinfo" @ "RDMACM_1.0",
    "rdma_freeaddrinfo" @ "RDMACM_1.0",
);

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

/// `malloc`s a copy of a socket address.
fn alloc_addr(a: SocketAddr) -> Result<(*mut libc::sockaddr, libc::socklen_t), c_int> {
    let (ss, len) = std_to_storage(a);
    // SAFETY: malloc of `len` bytes, checked.
    let p = unsafe { libc::malloc(len as usize) }.cast::<u8>();
    if p.is_null() {
        crate::ffi::set_errno(libc::ENOMEM);
        return Err(libc::EAI_SYSTEM);
    }
    // SAFETY: `len` bytes of the storage into the `len` bytes just allocated.
    unsafe { std::ptr::copy_nonoverlapping((&raw const ss).cast::<u8>(), p, len as usize) };
    Ok((p.cast(), len))
}

/// Resolves `node`/`service` with the C library (`None` node and service: no address).
fn resolve(
    node: Option<&CStr>,
    service: Option<&CStr>,
    h: &Hints,
) -> Result<Option<SocketAddr>, c_int> {
    if node.is_none() && service.is_none() {
        return Ok(None);
    }
    // SAFETY: plain data; all-zero is a valid (empty) hints structure.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_socktype = libc::SOCK_STREAM;
    if h.flags & RAI_PASSIVE != 0 {
        hints.ai_flags |= libc::AI_PASSIVE;
    }
    if h.flags & RAI_NUMERICHOST != 0 {
        hints.ai_flags |= libc::AI_NUMERICHOST;
    }
    hints.ai_family = h.family;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: C strings or NULL, a valid hints structure, a result pointer.
    let rc = unsafe {
        libc::getaddrinfo(
            node.map_or(std::ptr::null(), CStr::as_ptr),
            service.map_or(std::ptr::null(), CStr::as_ptr),
            &hints,
            &mut res,
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    let mut found = None;
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list entry getaddrinfo made.
        let a = unsafe { &*cur };
        // SAFETY: getaddrinfo's address of the entry's family.
        if let Some(sa) = unsafe { sockaddr_to_std(a.ai_addr) } {
            found = Some(sa);
            break;
        }
        cur = a.ai_next;
    }
    // SAFETY: the list getaddrinfo made.
    unsafe { libc::freeaddrinfo(res) };
    found.map(Some).ok_or(libc::EAI_FAMILY)
}

/// `rdma_getaddrinfo`: see the module documentation. 0, or an `EAI_*` code (EAI_SYSTEM
/// with errno; EINVAL-style misuse, a NULL `res`, is `EAI_SYSTEM`/EINVAL).
///
/// # Safety
///
/// `node` and `service` are NULL or C strings; `hints` is NULL or a valid
/// `rdma_addrinfo`; `res` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    crate::ffi::guard(
        "rdma_getaddrinfo",
        || {
            crate::ffi::set_errno(libc::EIO);
            libc::EAI_SYSTEM
        },
        || {
            if res.is_null() {
                crate::ffi::set_errno(libc::EINVAL);
                return libc::EAI_SYSTEM;
            }
            // SAFETY: NULL or C strings / a valid structure, by the contract.
            let (node, service, hints) = unsafe {
                (
                    (!node.is_null()).then(|| CStr::from_ptr(node)),
                    (!service.is_null()).then(|| CStr::from_ptr(service)),
                    hints.as_ref(),
                )
            };
            match getaddrinfo(node, service, hints) {
                Ok(p) => {
                    // SAFETY: non-NULL and writable by the contract.
                    unsafe { res.write(p) };
                    0
                }
                Err(code) => code,
            }
        },
    )
}

fn getaddrinfo(
    node: Option<&CStr>,
    service: Option<&CStr>,
    hints: Option<&rdma_addrinfo>,
) -> Result<*mut rdma_addrinfo, c_int> {
    let h = hints.map_or(
        Hints {
            flags: 0,
            family: 0,
            qp_type: 0,
            port_space: 0,
        },
        |h| Hints {
            flags: h.ai_flags,
            family: h.ai_family,
            qp_type: h.ai_qp_type,
            port_space: h.ai_port_space,
        },
    );
    if h.flags & !KNOWN_FLAGS != 0 {
        return Err(libc::EAI_BADFLAGS);
    }
    if ![0, libc::AF_INET, libc::AF_INET6].contains(&h.family) {
        return Err(libc::EAI_FAMILY);
    }
    let (qp_type, port_space) = kinds(&h)?;
    // SAFETY: the hints' addresses: NULL or socket addresses, by the contract.
    let (hint_src, hint_dst) = hints.map_or((None, None), |h| unsafe {
        (
            sockaddr_to_std(h.ai_src_addr),
            sockaddr_to_std(h.ai_dst_addr),
        )
    });
    let passive = h.flags & RAI_PASSIVE != 0;
    let resolved = resolve(node, service, &h)?;
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
    // SAFETY: calloc of one structure, checked; all-zero is a valid (empty) one.
    let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if rai.is_null() {
        crate::ffi::set_errno(libc::ENOMEM);
        return Err(libc::EAI_SYSTEM);
    }
    // SAFETY: the structure just allocated.
    let r = unsafe { &mut *rai };
    r.ai_flags = h.flags;
    r.ai_family = family;
    r.ai_qp_type = qp_type;
    r.ai_port_space = port_space;
    let fill = |r: &mut rdma_addrinfo| -> Result<(), c_int> {
        if let Some(a) = src {
            let (p, len) = alloc_addr(a)?;
            r.ai_src_addr = p;
            r.ai_src_len = len;
        }
        if let Some(a) = dst {
            let (p, len) = alloc_addr(a)?;
            r.ai_dst_addr = p;
            r.ai_dst_len = len;
        }
        Ok(())
    };
    if let Err(e) = fill(r) {
        // SAFETY: the structure just made.
        unsafe { remem_ibv_rdma_freeaddrinfo(rai) };
        return Err(e);
    }
    Ok(rai)
}

/// `rdma_freeaddrinfo`: frees a list `rdma_getaddrinfo` returned.
///
/// # Safety
///
/// `res` is NULL or a list from `rdma_getaddrinfo`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: an entry rdma_getaddrinfo made; its parts were malloc'd (or NULL).
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free((*cur).ai_src_canonname.cast());
            libc::free((*cur).ai_dst_canonname.cast());
            libc::free((*cur).ai_route);
            libc::free((*cur).ai_connect);
            libc::free(cur.cast());
            cur = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(
        node: Option<&CStr>,
        service: Option<&CStr>,
        h: Option<rdma_addrinfo>,
    ) -> Result<*mut rdma_addrinfo, c_int> {
        getaddrinfo(node, service, h.as_ref())
    }

    fn hints(flags: c_int, ps: rdma_port_space) -> rdma_addrinfo {
        // SAFETY: plain data; all-zero is valid.
        let mut h: rdma_addrinfo = unsafe { std::mem::zeroed() };
        h.ai_flags = flags;
        h.ai_port_space = ps as c_int;
        h
    }

    #[test]
    fn passive_numeric_and_wildcard() {
        let r = get(None, Some(c"7471"), Some(hints(RAI_PASSIVE, RDMA_PS_TCP))).unwrap();
        // SAFETY: the result just made.
        unsafe {
            assert!((*r).ai_dst_addr.is_null());
            assert_eq!(
                sockaddr_to_std((*r).ai_src_addr),
                Some("0.0.0.0:7471".parse().unwrap())
            );
            assert_eq!((*r).ai_qp_type, IBV_QPT_RC as c_int);
            assert_eq!((*r).ai_port_space, RDMA_PS_TCP as c_int);
            assert_eq!((*r).ai_src_len as usize, size_of::<libc::sockaddr_in>());
            remem_ibv_rdma_freeaddrinfo(r);
        }
        let r = get(
            Some(c"127.0.0.7"),
            Some(c"7471"),
            Some(hints(RAI_PASSIVE | RAI_NUMERICHOST, RDMA_PS_UDP)),
        )
        .unwrap();
        // SAFETY: the result just made.
        unsafe {
            assert_eq!(
                sockaddr_to_std((*r).ai_src_addr),
                Some("127.0.0.7:7471".parse().unwrap())
            );
            assert_eq!((*r).ai_qp_type, IBV_QPT_UD as c_int);
            remem_ibv_rdma_freeaddrinfo(r);
        }
    }

    #[test]
    fn active_names_the_destination() {
        let r = get(Some(c"127.0.0.9"), Some(c"20079"), None).unwrap();
        // SAFETY: the result just made.
        unsafe {
            assert!((*r).ai_src_addr.is_null());
            assert_eq!(
                sockaddr_to_std((*r).ai_dst_addr),
                Some("127.0.0.9:20079".parse().unwrap())
            );
            assert_eq!((*r).ai_family, libc::AF_INET);
            remem_ibv_rdma_freeaddrinfo(r);
        }
        let r = get(Some(c"::1"), Some(c"1"), None).unwrap();
        // SAFETY: the result just made.
        unsafe {
            assert_eq!((*r).ai_family, libc::AF_INET6);
            assert_eq!((*r).ai_dst_len as usize, size_of::<libc::sockaddr_in6>());
            remem_ibv_rdma_freeaddrinfo(r);
        }
    }

    #[test]
    fn bad_input_gets_eai_codes() {
        assert_eq!(get(None, None, None).err(), Some(libc::EAI_NONAME));
        assert_eq!(
            get(Some(c"not a host"), None, Some(hints(RAI_NUMERICHOST, 0))).err(),
            Some(libc::EAI_NONAME)
        );
        assert_eq!(
            get(Some(c"127.0.0.1"), None, Some(hints(0x100, 0))).err(),
            Some(libc::EAI_BADFLAGS)
        );
        let mut h = hints(0, RDMA_PS_TCP);
        h.ai_qp_type = IBV_QPT_UD as c_int;
        assert_eq!(
            get(Some(c"127.0.0.1"), None, Some(h)).err(),
            Some(libc::EAI_SERVICE)
        );
        let mut h = hints(0, 0);
        h.ai_family = libc::AF_UNIX;
        assert_eq!(
            get(Some(c"127.0.0.1"), None, Some(h)).err(),
            Some(libc::EAI_FAMILY)
        );
        let mut out = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: NULL strings and hints are allowed; `out` is writable.
            unsafe {
                remem_ibv_rdma_getaddrinfo(
                    std::ptr::null(),
                    std::ptr::null(),
                    std::ptr::null(),
                    &mut out,
                )
            },
            libc::EAI_NONAME
        );
        // SAFETY: NULL is allowed.
        unsafe { remem_ibv_rdma_freeaddrinfo(std::ptr::null_mut()) };
    }

    #[test]
    fn hints_addresses_are_used_without_a_node() {
        let (ss, len) = std_to_storage("127.0.0.3:5000".parse().unwrap());
        let mut h = hints(0, 0);
        h.ai_dst_addr = (&raw const ss).cast_mut().cast();
        h.ai_dst_len = len;
        let r = get(None, None, Some(h)).unwrap();
        // SAFETY: the result just made.
        unsafe {
            assert_eq!(
                sockaddr_to_std((*r).ai_dst_addr),
                Some("127.0.0.3:5000".parse().unwrap())
            );
            remem_ibv_rdma_freeaddrinfo(r);
        }
    }
}
