//! The program's `struct sockaddr`s to and from `std::net::SocketAddr`: the one place
//! the drop-in librdmacm reads or writes a socket address in program memory
//! (`rdma_bind_addr`'s argument, an `rdma_addrinfo`'s, the `sockaddr_storage` of an
//! id's route). Re-exported as `crate::rdmacm::sockaddr`.

use core::ffi::{CStr, c_int};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Reads a `struct sockaddr` (AF_INET or AF_INET6) into a `SocketAddr`; `None` for NULL
/// or another family.
///
/// # Safety
///
/// `sa` is NULL or points to a socket address of its family's size.
pub unsafe fn sockaddr_to_std(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-NULL and readable by the contract (the family field comes first).
    let family = c_int::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in by the contract.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6 by the contract.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A `SocketAddr` as a `sockaddr_storage` (AF_INET or AF_INET6), and its length.
pub fn std_to_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid (AF_UNSPEC) value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits at the start of a sockaddr_storage.
            unsafe { (&raw mut ss).cast::<libc::sockaddr_in>().write(sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: a sockaddr_in6 fits at the start of a sockaddr_storage.
            unsafe { (&raw mut ss).cast::<libc::sockaddr_in6>().write(sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Resolves `node`/`service` with the C library's `getaddrinfo` for `rdma_getaddrinfo`
/// (`None` node and service: no address): the first IPv4 or IPv6 address, or an
/// `EAI_*` code.
pub(crate) fn resolve(
    node: Option<&CStr>,
    service: Option<&CStr>,
    h: &crate::rdmacm::addrinfo::Hints,
) -> Result<Option<SocketAddr>, c_int> {
    if node.is_none() && service.is_none() {
        return Ok(None);
    }
    // SAFETY: plain data; all-zero is a valid (empty) hints structure.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_socktype = libc::SOCK_STREAM;
    if h.flags & crate::rdmacm::abi::RAI_PASSIVE != 0 {
        hints.ai_flags |= libc::AI_PASSIVE;
    }
    if h.flags & crate::rdmacm::abi::RAI_NUMERICHOST != 0 {
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

#[cfg(test)]
mod sockaddr_tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip() {
        for a in [
            "127.0.0.5:7174".parse::<SocketAddr>().unwrap(),
            "[fd00::1]:4791".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
        ] {
            let (ss, len) = std_to_storage(a);
            assert!(len as usize <= size_of::<libc::sockaddr_storage>());
            // SAFETY: a socket address just written.
            let back = unsafe { sockaddr_to_std((&raw const ss).cast()) };
            assert_eq!(back, Some(a));
        }
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { sockaddr_to_std(std::ptr::null()) }, None);
        // SAFETY: a zeroed storage is readable.
        let zero: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { sockaddr_to_std((&raw const zero).cast()) }, None);
    }
}
