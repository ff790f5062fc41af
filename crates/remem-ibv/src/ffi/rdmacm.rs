//! The C entry points of the drop-in librdmacm: each converts the
//! program's pointers once and calls safe code in [`crate::rdmacm`].
//!
//! By section: options, migration, QP attributes, ECE, multicast (`rdmacm::id::options`,
//! `mcast`); creating and destroying ids (`id::lifecycle`; an id not handed out yet is an
//! `id::Unseen`, freed only by `free_unseen`); addresses (`id::addr`); connections
//! (`id::conn`; the program's `rdma_conn_param` is read into an `id::ConnArg`);
//! synchronous endpoints (`id::endpoint`); event channels (`rdmacm::channel`: the
//! program's [`Channel`] and its tombstones live here); `rdma_getaddrinfo`
//! (`rdmacm::addrinfo`: the answer is allocated here for the program).

use super::handles::Handle;
use super::{guard_ptr, null_with, opt_mut, opt_ref, out, slice};
use crate::abi::*;
use crate::rdmacm::abi::*;
use crate::rdmacm::addrinfo::Hints;
use crate::rdmacm::channel::{ChannelInner, Event};
use crate::rdmacm::id::{self, RdmaId, id_from};
use crate::rdmacm::qp;
use crate::rdmacm::sockaddr::sockaddr_to_std;
use crate::rdmacm::{fail, guard_neg};
use core::ffi::CStr;
use core::ffi::{c_char, c_int, c_void};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

symver!(
    "rdma_getaddrinfo" @ "RDMACM_1.0",
    "rdma_freeaddrinfo" @ "RDMACM_1.0",
    "rdma_create_event_channel" @ "RDMACM_1.0",
    "rdma_destroy_event_channel" @ "RDMACM_1.0",
    "rdma_get_cm_event" @ "RDMACM_1.0",
    "rdma_ack_cm_event" @ "RDMACM_1.0",
    "rdma_event_str" @ "RDMACM_1.0",
    "rdma_create_id" @ "RDMACM_1.0",
    "rdma_destroy_id" @ "RDMACM_1.0",
    "rdma_bind_addr" @ "RDMACM_1.0",
    "rdma_resolve_addr" @ "RDMACM_1.0",
    "rdma_resolve_route" @ "RDMACM_1.0",
    "rdma_listen" @ "RDMACM_1.0",
    "rdma_connect" @ "RDMACM_1.0",
    "rdma_accept" @ "RDMACM_1.0",
    "rdma_reject" @ "RDMACM_1.0",
    "rdma_reject_ece" @ "RDMACM_1.3",
    "rdma_disconnect" @ "RDMACM_1.0",
    "rdma_establish" @ "RDMACM_1.2",
    "rdma_notify" @ "RDMACM_1.0",
    "rdma_get_request" @ "RDMACM_1.0",
    "rdma_create_ep" @ "RDMACM_1.0",
    "rdma_destroy_ep" @ "RDMACM_1.0",
    "rdma_get_src_port" @ "RDMACM_1.0",
    "rdma_get_dst_port" @ "RDMACM_1.0",
    "rdma_set_option" @ "RDMACM_1.0",
    "rdma_migrate_id" @ "RDMACM_1.0",
    "rdma_init_qp_attr" @ "RDMACM_1.2",
    "rdma_set_local_ece" @ "RDMACM_1.3",
    "rdma_get_remote_ece" @ "RDMACM_1.3",
    "rdma_join_multicast" @ "RDMACM_1.0",
    "rdma_join_multicast_ex" @ "RDMACM_1.1",
    "rdma_leave_multicast" @ "RDMACM_1.0",
    "rdma_get_devices" @ "RDMACM_1.0",
    "rdma_free_devices" @ "RDMACM_1.0",
    "rdma_create_qp" @ "RDMACM_1.0",
    "rdma_create_qp_ex" @ "RDMACM_1.0",
    "rdma_destroy_qp" @ "RDMACM_1.0",
    "rdma_create_srq" @ "RDMACM_1.0",
    "rdma_create_srq_ex" @ "RDMACM_1.0",
    "rdma_destroy_srq" @ "RDMACM_1.0",
);

/// The program's channel argument, resolved: `None` for NULL, EINVAL for a destroyed
/// channel.
///
/// # Safety
///
/// `ch` is NULL, a live channel of this library, or one destroyed since (a tombstone).
pub(crate) unsafe fn program_channel(
    ch: *mut rdma_event_channel,
) -> Option<Result<id::Chan, c_int>> {
    if ch.is_null() {
        return None;
    }
    // SAFETY: by the contract.
    let inner = unsafe { channel_from(ch) };
    Some(inner.map(|i| id::Chan::program(i, ch)).ok_or(libc::EINVAL))
}

// SAFETY: the pointers in the attributes (CQs, SRQ, the QP context) are the program's
// objects; the library only passes them back to its own calls on the program's behalf
// (`rdma_get_request` creating a QP), never dereferencing them on another thread.
unsafe impl Send for id::EpAttr {}

// ----- options, migration, QP attributes, ECE (rdmacm::id::options) ------------------------

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` and `RDMA_OPTION_ID_ACK_TIMEOUT` (a `uint8_t`),
/// `RDMA_OPTION_ID_REUSEADDR` and `RDMA_OPTION_ID_AFONLY` (an `int`) are accepted (the
/// soft device does not use them); `RDMA_OPTION_IB_PATH` is ENOSYS (RoCE resolves its own
/// route); anything else, or a wrong `optlen`, is EINVAL.
///
/// # Safety
///
/// `id` is NULL or a live id; `optval` is NULL or `optlen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard_neg("rdma_set_option", || {
        if id.is_null() || optval.is_null() {
            return fail(libc::EINVAL);
        }
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => 0,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
                if optlen == size_of::<c_int>() =>
            {
                0
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::ENOSYS),
            _ => fail(libc::EINVAL),
        }
    })
}

/// `rdma_migrate_id`: see `id::migrate`.
///
/// # Safety
///
/// `id` is NULL or a live id; `channel` is NULL or a live channel.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard_neg("rdma_migrate_id", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<RdmaId>::from_abi(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: by the contract.
        match id::migrate(h, unsafe { program_channel(channel) }) {
            Ok(0) => 0,
            Ok(old_private) => {
                // SAFETY: the id's former private channel, used by nothing else now.
                unsafe { free_channel(old_private as *mut rdma_event_channel) };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_init_qp_attr`: see `id::init_qp_attr`; -1/EINVAL for NULL arguments.
///
/// # Safety
///
/// `id` is NULL or a live id; `qp_attr` is NULL or readable and writable; `qp_attr_mask`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard_neg("rdma_init_qp_attr", || {
        // SAFETY: by the contract.
        match unsafe { (id_from(id), opt_mut(qp_attr), out(qp_attr_mask)) } {
            (Some(s), Some(a), Some(m)) => id::init_qp_attr(s, a, m),
            _ => fail(libc::EINVAL),
        }
    })
}

/// `rdma_set_local_ece`: see `id::set_local_ece`; -1/EINVAL for NULL arguments.
///
/// # Safety
///
/// `id` is NULL or a live id; `ece` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard_neg("rdma_set_local_ece", || {
        // SAFETY: by the contract.
        match unsafe { (Handle::<RdmaId>::from_abi(id), opt_ref(ece)) } {
            (Some(h), Some(e)) => id::set_local_ece(h, e),
            _ => fail(libc::EINVAL),
        }
    })
}

/// `rdma_get_remote_ece`: no ECE comes from the peer here (vendor id 0). -1/EINVAL for
/// NULL arguments or an id with a QP.
///
/// # Safety
///
/// `id` is NULL or a live id; `ece` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard_neg("rdma_get_remote_ece", || {
        // SAFETY: by the contract.
        match unsafe { (Handle::<RdmaId>::from_abi(id), out(ece)) } {
            (Some(h), Some(e)) if h.qp_ptr().is_null() => {
                e.write(ibv_ece {
                    vendor_id: 0,
                    options: 0,
                    comp_mask: 0,
                });
                0
            }
            _ => fail(libc::EINVAL),
        }
    })
}

// ----- multicast (rdmacm::id::mcast) -------------------------------------------------------

/// `rdma_join_multicast`: `rdma_join_multicast_ex` with `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `addr` is NULL or a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    let mut attr = rdma_cm_join_mc_attr_ex {
        comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
        join_flags: RDMA_MC_JOIN_FLAG_FULLMEMBER,
        addr,
    };
    // SAFETY: by the contract; `attr` is on the stack.
    unsafe { remem_ibv_rdma_join_multicast_ex(id, &mut attr, context) }
}

/// `rdma_join_multicast_ex`: joins the IPv4 multicast group `attr->addr` on the id's device
/// (bound or resolved), as the kernel does for RoCE v2: a MULTICAST_JOIN event follows
/// whose `ud` parameters address the group (the MGID `::ffff:a.b.c.d` as `dgid`,
/// `is_global`, hop limit 64, QPN 0xFFFFFF, Q_Key `RDMA_UDP_QKEY`) and whose
/// `ud.private_data` is `context`; taking that event attaches the id's QP to the group (none
/// for a `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` join), as librdmacm does. -1 with EINVAL
/// (no address or join flags, an address that is not IPv4 multicast, an id not bound to a
/// device, a group joined already), EOPNOTSUPP (an IPv6 group), ENOSYS (an unknown flag).
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `attr` is NULL or valid, its `addr` NULL or a
/// valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard_neg("rdma_join_multicast_ex", || {
        // SAFETY: by the contract.
        let Some(shared) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: by the contract, `attr` is NULL or valid.
        let (attr, group) = match unsafe { opt_ref(attr) } {
            // SAFETY: by the contract, its `addr` is NULL or a valid socket address.
            Some(a) => (Some(*a), unsafe { sockaddr_to_std(a.addr) }),
            None => (None, None),
        };
        id::join(shared, attr, group, context)
    })
}

/// `rdma_leave_multicast`: see `id::leave`; -1/EINVAL for a NULL id.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `addr` is NULL or a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg("rdma_leave_multicast", || {
        // SAFETY: by the contract.
        match unsafe { (Handle::<RdmaId>::from_abi(id), sockaddr_to_std(addr)) } {
            (Some(h), group) => id::leave(h, group),
            (None, _) => fail(libc::EINVAL),
        }
    })
}

// ----- creating and destroying ids (rdmacm::id::lifecycle) --------------------------------

// SAFETY: a struct of integers, pointers and unions of those (rdma_cma.h; the layout
// tests check it): all-zero is a valid value.
unsafe impl super::Zeroable for rdma_cm_event {}
// SAFETY: as above.
unsafe impl super::Zeroable for rdma_ud_param {}
// SAFETY: as above.
unsafe impl super::Zeroable for rdma_conn_param {}

impl Handle<'_, RdmaId> {
    /// Acks the event a synchronous call left in `id->event`, if any.
    pub(crate) fn ack_own_event(self) {
        let ev = self.event();
        if !ev.is_null() {
            self.set_event(std::ptr::null_mut());
            // SAFETY: `id->event` is NULL or the event a synchronous call of this library
            // left there (`id::complete`, `rdma_get_request`): handed out, not acked, and
            // acked only here, once (the field is cleared first).
            unsafe { ack(ev) };
        }
    }
}

/// Frees an id no program has seen (a connection request dropped before it was handed
/// out): its provider ids are dropped (the request is rejected), then its private channel
/// and the id.
pub(crate) fn free_unseen(u: id::Unseen) {
    let private = id::release_unseen(u.shared());
    let h = u.shared().handle();
    if private != 0 {
        // SAFETY: the id's own private channel, used by nothing else now.
        unsafe { free_channel(private as *mut rdma_event_channel) };
    }
    // SAFETY: an `Unseen` is an id the program never saw (only `id::new_child` makes one,
    // and handing it out consumes it): nothing else holds its pointer, and `u` is
    // consumed here, so it is freed once.
    unsafe { super::handles::free(h) };
}

/// Destroys an id (see the documentation of [`crate::rdmacm::id`]).
///
/// # Safety
///
/// `h` is a live id of this library, not used afterwards.
pub(crate) unsafe fn destroy_id(h: Handle<'_, RdmaId>) {
    let private = id::stop(h.inner());
    if private != 0 {
        // SAFETY: the id's own private channel, used by nothing else now.
        unsafe { free_channel(private as *mut rdma_event_channel) };
    }
    // SAFETY: by the contract; `stop` left no handle to it in the library.
    unsafe { super::handles::free(h) };
}

/// `rdma_create_id`: a new id on `channel` (NULL: synchronous). -1 with errno: EINVAL
/// (NULL `id`, unknown port space), ENODEV (no devices).
///
/// # Safety
///
/// `channel` is NULL or a live channel; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard_neg("rdma_create_id", || {
        // SAFETY: by the contract.
        let Some(id_out) = (unsafe { out(id) }) else {
            return fail(libc::EINVAL);
        };
        let ps = match crate::rdmacm::devices::port_space(ps) {
            Ok(ps) => ps,
            Err(e) => return fail(e),
        };
        // SAFETY: by the contract.
        let chan = unsafe { program_channel(channel) };
        match id::create_id(chan, context, ps, id::qp_type_of(ps)) {
            Ok(p) => {
                id_out.write(p);
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_id`: destroys the id once its events are acked (the program destroys
/// its QP first, as the man page requires). -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_destroy_id", || {
        // SAFETY: by the contract.
        let Some(h) = (unsafe { Handle::<RdmaId>::from_abi(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: by the contract.
        unsafe { destroy_id(h) };
        0
    })
}

// ----- addresses (rdmacm::id::addr) --------------------------------------------------------

/// `rdma_bind_addr`: binds a local address (the unspecified address: every device).
/// -1 with errno: EINVAL (NULL, another family, already bound), EADDRNOTAVAIL (no device
/// has the address), EADDRINUSE.
///
/// # Safety
///
/// `id` is NULL or a live id; `addr` is NULL or a socket address of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg("rdma_bind_addr", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { id_from(id) }, unsafe { sockaddr_to_std(addr) }) else {
            return fail(libc::EINVAL);
        };
        match id::bind(s, a) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_resolve_addr`: resolves `dst` to a device (see [`crate::rdmacm::devices`]) and,
/// for a synchronous id, waits for the result. -1 with errno: EINVAL, EADDRNOTAVAIL
/// (`src` is no device's), ENODEV (no device reaches `dst`'s family), or the resolution's.
///
/// # Safety
///
/// `id` is NULL or a live id; `src_addr` and `dst_addr` are NULL or socket addresses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard_neg("rdma_resolve_addr", || {
        // SAFETY: by the contract.
        let (Some(s), Some(dst)) = (unsafe { id_from(id) }, unsafe { sockaddr_to_std(dst_addr) })
        else {
            return fail(libc::EINVAL);
        };
        // SAFETY: by the contract.
        let src = unsafe { sockaddr_to_std(src_addr) };
        if !src_addr.is_null() && src.is_none() {
            return fail(libc::EINVAL);
        }
        match id::resolve_addr(s, src, dst, id::millis(timeout_ms)) {
            Ok(()) => id::complete(s),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_resolve_route`: see `id::resolve_route`; -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    guard_neg("rdma_resolve_route", || {
        // SAFETY: by the contract.
        match unsafe { id_from(id) } {
            Some(s) => id::resolve_route(s, timeout_ms),
            None => fail(libc::EINVAL),
        }
    })
}

/// `rdma_listen`: see `id::listen`; -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard_neg("rdma_listen", || {
        // SAFETY: by the contract.
        match unsafe { id_from(id) } {
            Some(s) => id::listen(s, backlog),
            None => fail(libc::EINVAL),
        }
    })
}

/// `rdma_get_src_port`: the bound port, network order (0 unbound).
///
/// # Safety
///
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: by the contract.
    unsafe { Handle::<RdmaId>::from_abi(id) }.map_or(0, |h| h.src_port())
}

/// `rdma_get_dst_port`: the peer's port, network order (0 before it is known).
///
/// # Safety
///
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: by the contract.
    unsafe { Handle::<RdmaId>::from_abi(id) }.map_or(0, |h| h.dst_port())
}

// ----- connections (rdmacm::id::conn) ------------------------------------------------------

/// The program's connection parameters and their private data; `None` for NULL.
///
/// # Safety
///
/// `p` is NULL or readable, its `private_data` NULL or `private_data_len` readable bytes,
/// for `'a`.
unsafe fn conn_arg<'a>(p: *const rdma_conn_param) -> Option<id::ConnArg<'a>> {
    // SAFETY: by the contract.
    let param = unsafe { opt_ref(p) }?;
    // SAFETY: by the contract (NULL or `private_data_len` bytes; none for NULL).
    let private_data = unsafe {
        slice(
            param.private_data.cast::<u8>(),
            usize::from(param.private_data_len),
        )
    }
    .unwrap_or(&[]);
    Some(id::ConnArg {
        param,
        private_data,
    })
}

/// `rdma_connect`: see `id::connect`; -1/EINVAL for a NULL id.
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable (with its private data).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard_neg("rdma_connect", || {
        // SAFETY: by the contract.
        match unsafe { (id_from(id), conn_arg(conn_param)) } {
            (Some(s), arg) => id::connect(s, arg),
            (None, _) => fail(libc::EINVAL),
        }
    })
}

/// `rdma_accept`: see `id::accept`; -1/EINVAL for a NULL id.
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable (with its private data).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard_neg("rdma_accept", || {
        // SAFETY: by the contract.
        match unsafe { (id_from(id), conn_arg(conn_param)) } {
            (Some(s), arg) => id::accept(s, arg),
            (None, _) => fail(libc::EINVAL),
        }
    })
}

/// `rdma_reject` and `rdma_reject_ece` once their arguments are read.
///
/// # Safety
///
/// `id` is NULL or a live id; `data` is NULL or `len` readable bytes.
unsafe fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: by the contract.
    let Some(s) = (unsafe { id_from(id) }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: by the contract (none for NULL).
    let bytes = unsafe { slice(data.cast::<u8>(), usize::from(len)) }.unwrap_or(&[]);
    id::reject(s, bytes)
}

/// `rdma_reject`: see `id::reject`; -1/EINVAL for a NULL id.
///
/// # Safety
///
/// `id` is NULL or a live id; `private_data` is NULL or `private_data_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: by the contract.
    guard_neg("rdma_reject", || unsafe {
        reject(id, private_data, private_data_len)
    })
}

/// `rdma_reject_ece`: as `rdma_reject` (there is no ECE to refuse here).
///
/// # Safety
///
/// As `rdma_reject`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: by the contract.
    guard_neg("rdma_reject_ece", || unsafe {
        reject(id, private_data, private_data_len)
    })
}

/// `rdma_disconnect`: see `id::disconnect`; -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_disconnect", || {
        // SAFETY: by the contract.
        match unsafe { id_from(id) } {
            Some(s) => id::disconnect(s),
            None => fail(libc::EINVAL),
        }
    })
}

/// `rdma_establish`: see `id::establish`; -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_establish", || {
        // SAFETY: by the contract.
        match unsafe { Handle::<RdmaId>::from_abi(id) } {
            Some(h) => id::establish(h),
            None => fail(libc::EINVAL),
        }
    })
}

/// `rdma_notify`: see `id::notify_event`; -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_notify(
    id: *mut rdma_cm_id,
    event: ibv_event_type,
) -> c_int {
    guard_neg("rdma_notify", || {
        // SAFETY: by the contract.
        match unsafe { id_from(id) } {
            Some(s) => id::notify_event(s, event),
            None => fail(libc::EINVAL),
        }
    })
}

// ----- synchronous endpoints (rdmacm::id::endpoint) ----------------------------------------

/// `rdma_create_qp` for an endpoint (`id::CreateQp`).
fn endpoint_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> c_int {
    // SAFETY: `id::get_request` and `id::create_ep` pass a live id they just made, the PD
    // the program gave (to the listener or to `rdma_create_ep`, which it keeps alive while
    // the endpoint lives) or NULL, and attributes the program gave (or a copy of them).
    unsafe { remem_ibv_rdma_create_qp(id, pd, attr) }
}

/// `rdma_get_request`: see `id::get_request`; -1/EINVAL for NULL arguments.
///
/// # Safety
///
/// `listen` is NULL or a live id; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard_neg("rdma_get_request", || {
        // SAFETY: by the contract.
        let (Some(s), Some(id_out)) = (unsafe { id_from(listen) }, unsafe { out(id) }) else {
            return fail(libc::EINVAL);
        };
        match id::get_request(s, &mut endpoint_qp) {
            Ok(child) => {
                id_out.write(child);
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_create_ep`: see `id::create_ep`. -1 with errno (EINVAL for NULL `id` or `res`).
///
/// # Safety
///
/// `id` is NULL or writable; `res` is NULL or a valid `rdma_addrinfo` (its addresses NULL
/// or socket addresses); `pd` is NULL or a live PD; `qp_init_attr` is NULL or readable and
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_ep", || {
        // SAFETY: by the contract.
        let (Some(ai), Some(id_out)) = (unsafe { opt_ref(res) }, unsafe { out(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: by the contract.
        let args = unsafe {
            id::EpArgs {
                ai,
                src: sockaddr_to_std(ai.ai_src_addr),
                dst: sockaddr_to_std(ai.ai_dst_addr),
                pd,
                init: opt_mut(qp_init_attr),
            }
        };
        // SAFETY: the id `create_ep` just made, never the program's.
        let destroy = |p| unsafe { remem_ibv_rdma_destroy_ep(p) };
        match id::create_ep(args, &mut endpoint_qp, destroy) {
            Ok(p) => {
                id_out.write(p);
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_ep`: destroys the endpoint's QP and SRQ (and the CQs made for them),
/// then the id.
///
/// # Safety
///
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_ep(id: *mut rdma_cm_id) {
    super::guard(
        "rdma_destroy_ep",
        || (),
        || {
            // SAFETY: by the contract.
            let Some(h) = (unsafe { Handle::<RdmaId>::from_abi(id) }) else {
                return;
            };
            // SAFETY: a live id (the contract), its QP and SRQ the library's.
            unsafe {
                if !h.qp_ptr().is_null() {
                    remem_ibv_rdma_destroy_qp(id);
                }
                if !h.srq_ptr().is_null() {
                    remem_ibv_rdma_destroy_srq(id);
                }
                destroy_id(h);
            }
        },
    )
}

// ----- event channels (rdmacm::channel) ----------------------------------------------------

/// A channel: what `rdma_create_event_channel` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Channel {
    /// The `rdma_event_channel` programs see (its `fd`).
    pub abi: rdma_event_channel,
    /// The queue; `None` once the channel is destroyed (a tombstone, see [`free_channel`]).
    inner: Mutex<Option<Arc<ChannelInner>>>,
}

/// Destroyed channels whose memory is kept a while (their queue and fd are released at
/// once): [`free_channel`].
static TOMBSTONES: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());

/// How many destroyed channels keep their memory (a few dozen bytes each).
const TOMBSTONES_KEPT: usize = 64;

/// Makes a channel: the pointer programs see (freed by [`free_channel`]) and its library
/// side.
pub(crate) fn new_channel() -> Result<(*mut rdma_event_channel, Arc<ChannelInner>), c_int> {
    let inner = ChannelInner::new()?;
    let abi = rdma_event_channel { fd: inner.fd() };
    let p = Box::into_raw(Box::new(Channel {
        abi,
        inner: Mutex::new(Some(Arc::clone(&inner))),
    }))
    .cast();
    Ok((p, inner))
}

/// The library's side of a program's channel; `None` for NULL or a destroyed channel.
///
/// # Safety
///
/// `ch` is NULL, a live channel of this library, or one destroyed since (its tombstone is
/// kept for a while: [`free_channel`]).
pub(crate) unsafe fn channel_from(ch: *mut rdma_event_channel) -> Option<Arc<ChannelInner>> {
    // SAFETY: by the contract, a non-NULL `ch` is the first field of a boxed `Channel`;
    // the reference covers the library's part only and ends in this function.
    let c = unsafe { ch.cast::<Channel>().as_ref() }?;
    c.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Destroys a channel made by [`new_channel`]: its queue and fd are released now (ids
/// still on it, and a thread still waiting in `rdma_get_cm_event`, keep the queue alive
/// until they are done), and its memory is kept as a tombstone until 64 more channels
/// are destroyed. Programs use a channel after destroying it: rping's CM thread loops back
/// into `rdma_get_cm_event` while its main thread destroys the channel at exit. With
/// librdmacm that thread is nearly always blocked in `read` by then, and a blocked `read`
/// outlives the descriptor's close: it just never returns. Here a waiter holds the queue
/// and waits on, and a call that starts after the destroy finds the tombstone and waits
/// the same way (until a signal: EINTR), instead of reading freed memory — or failing
/// with EBADF as a `read` of the closed descriptor would, which makes rping exit 255 when
/// its teardown is quicker than the kernel's.
///
/// # Safety
///
/// `ch` came from [`new_channel`] and is not destroyed yet (or is a tombstone still kept,
/// which a second destroy leaves as it is).
pub(crate) unsafe fn free_channel(ch: *mut rdma_event_channel) {
    // SAFETY: by the contract, the live Box made in `new_channel`.
    let c = unsafe { &*ch.cast::<Channel>() };
    let inner = c.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
    if inner.is_none() {
        // Destroyed already (a program's second destroy): the tombstone is queued once.
        return;
    }
    // Dropped outside the queue's lock (an event's drop may release its id).
    let dropped = inner.as_ref().map(|i| i.close());
    drop(dropped);
    drop(inner);
    let evicted = {
        let mut t = TOMBSTONES.lock().unwrap_or_else(|e| e.into_inner());
        t.push_back(ch as usize);
        if t.len() > TOMBSTONES_KEPT {
            t.pop_front()
        } else {
            None
        }
    };
    if let Some(old) = evicted {
        // SAFETY: a Box made in `new_channel`, destroyed 64 destroys ago and freed only
        // here, once.
        drop(unsafe { Box::from_raw(old as *mut Channel) });
    }
}

/// Frees an event handed out and counts its ack.
///
/// # Safety
///
/// `ev` is a live event of this library, not used afterwards.
pub(crate) unsafe fn ack(ev: *mut rdma_cm_event) {
    // SAFETY: by the contract, the Box made by `id::hand_out`.
    let ev = unsafe { Box::from_raw(ev.cast::<Event>()) };
    ev.counted.event_acked();
}

/// `rdma_create_event_channel`: a channel (its fd blocking); NULL with errno (ENODEV when
/// there are no devices, EINVAL for a bad `REMEM_IBV_DEVICES`, or the eventfd's error).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard_ptr("rdma_create_event_channel", || {
        if let Err(e) = crate::rdmacm::devices::count() {
            return null_with(e);
        }
        new_channel().map_or_else(null_with, |(p, _)| p)
    })
}

/// `rdma_destroy_event_channel`: frees the channel (the program has destroyed its ids and
/// acked their events first, as the man page requires). A thread still waiting in
/// `rdma_get_cm_event` on it keeps waiting (its queue and fd live until it returns).
///
/// # Safety
///
/// `channel` is NULL or a live channel, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    crate::ffi::guard(
        "rdma_destroy_event_channel",
        || (),
        || {
            if !channel.is_null() {
                // SAFETY: a live channel by the contract, not used afterwards.
                unsafe { free_channel(channel) };
            }
        },
    )
}

/// `rdma_get_cm_event`: the next event of the channel, waiting for one unless the fd is
/// non-blocking. -1 with errno: EINVAL for NULL arguments, EAGAIN (non-blocking, none
/// queued), EINTR (a signal; the only way out of a wait on a channel destroyed since:
/// `rdma_destroy_event_channel`).
///
/// # Safety
///
/// `channel` is NULL, a live channel or one destroyed recently; `event` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard_neg("rdma_get_cm_event", || {
        if channel.is_null() || event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: by the contract, a live channel or a tombstone. The wait holds the
        // channel's queue (and fd) itself: a program may destroy the channel while a
        // thread of its own still waits in here (rping does at exit), as a thread blocked
        // in librdmacm's `read` holds the file.
        let Some(ch) = (unsafe { channel_from(channel) }) else {
            // A destroyed channel: wait as a thread that was already blocked in it waits,
            // until a signal interrupts (see `free_channel`).
            // SAFETY: poll on no descriptors: only a signal ends it.
            unsafe { libc::poll(std::ptr::null_mut(), 0, -1) };
            return fail(libc::EINTR);
        };
        loop {
            let p = match ch.wait() {
                Ok(p) => p,
                Err(e) => return fail(e),
            };
            if let Some(ev) = id::hand_out(p) {
                // SAFETY: non-NULL and writable by the contract.
                unsafe { event.write(ev) };
                return 0;
            }
        }
    })
}

/// `rdma_ack_cm_event`: frees the event (EINVAL for NULL).
///
/// # Safety
///
/// `event` is NULL or an event from `rdma_get_cm_event` not acked yet, not used
/// afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard_neg("rdma_ack_cm_event", || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: by the contract.
        unsafe { ack(event) };
        0
    })
}

/// `rdma_event_str`: the name of an event type (`"UNKNOWN EVENT"` for another value).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let s: &'static core::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

// ----- QPs and SRQs on ids (rdmacm::qp) ---------------------------------------------------

/// Destroys the CQs and completion channels `rdma_create_qp` made for the id (nothing if
/// it made none, or they are destroyed already), and clears the id's fields naming them.
pub(crate) fn destroy_own_cqs(h: Handle<'_, RdmaId>) {
    {
        let mut st = h.inner().state();
        if !st.own_cqs {
            return;
        }
        st.own_cqs = false;
    }
    for cq in [h.recv_cq(), h.send_cq()] {
        if !cq.is_null() {
            // SAFETY: a CQ `rdma_create_qp` made for the id (`own_cqs`), not destroyed
            // yet (the flag is cleared once they are).
            unsafe { super::queues::remem_ibv_ibv_destroy_cq(cq) };
        }
    }
    for ch in [h.recv_cq_channel(), h.send_cq_channel()] {
        if !ch.is_null() {
            // SAFETY: as above, a completion channel made with the CQs (now destroyed).
            unsafe { super::queues::remem_ibv_ibv_destroy_comp_channel(ch) };
        }
    }
    h.set_send_cq(core::ptr::null_mut());
    h.set_recv_cq(core::ptr::null_mut());
    h.set_send_cq_channel(core::ptr::null_mut());
    h.set_recv_cq_channel(core::ptr::null_mut());
}

/// The verbs calls of `rdmacm::qp`, on objects of this library (its contract): the
/// entry points below pass it with a live id whose fields name live objects or NULL,
/// and attributes the program gave (or a copy).
struct QpVerbs;

impl qp::Verbs for QpVerbs {
    fn pd_ctx(&self, pd: *mut ibv_pd) -> Option<Arc<crate::context::CtxShared>> {
        // SAFETY: the program's PD or the id's: NULL or a live PD of this library.
        unsafe { super::handles::pd_from(pd) }.map(|p| Arc::clone(&p.inner.ctx))
    }

    fn make_cq(
        &self,
        verbs: *mut ibv_context,
        cqe: c_int,
        id: *mut rdma_cm_id,
    ) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        // SAFETY: an open context of this library (a live PD's).
        let ch = unsafe { super::queues::remem_ibv_ibv_create_comp_channel(verbs) };
        if ch.is_null() {
            return Err(super::errno());
        }
        // SAFETY: the context and the channel just made; the id is the CQ's context, as
        // librdmacm sets it.
        let cq = unsafe {
            super::queues::remem_ibv_ibv_create_cq(verbs, cqe, id.cast::<c_void>(), ch, 0)
        };
        if cq.is_null() {
            let e = super::errno();
            // SAFETY: the channel just made, unused.
            unsafe { super::queues::remem_ibv_ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        Ok((ch, cq))
    }

    fn create_qp(
        &self,
        verbs: *mut ibv_context,
        attr: &mut ibv_qp_init_attr_ex,
    ) -> Result<(*mut ibv_qp, *mut ibv_pd), c_int> {
        // SAFETY: an open context of this library and the program's attributes (their PD
        // checked live, their CQs and SRQ the program's or the id's).
        let qp = unsafe { super::queues::create_qp_ex(verbs, attr) };
        if qp.is_null() {
            return Err(super::errno());
        }
        // SAFETY: the QP just made; reading its PD.
        Ok((qp, unsafe { (*qp).pd }))
    }

    fn with_qp(
        &self,
        qp: *mut ibv_qp,
        f: &mut dyn FnMut(Handle<'_, crate::qp::Qp>) -> Result<(), c_int>,
    ) -> Result<(), c_int> {
        // SAFETY: a QP `create_qp` just made, alive for the call.
        f(unsafe { Handle::from_abi(qp) }.ok_or(libc::EINVAL)?)
    }

    fn destroy_qp(&self, qp: *mut ibv_qp) {
        if !qp.is_null() {
            // SAFETY: the id's QP: one `create_qp` made, or the program's own attached
            // one, which it no longer uses (`rdma_destroy_qp`'s contract).
            unsafe { super::queues::remem_ibv_ibv_destroy_qp(qp) };
        }
    }

    fn create_srq(
        &self,
        verbs: *mut ibv_context,
        attr: &mut ibv_srq_init_attr_ex,
    ) -> Result<*mut ibv_srq, c_int> {
        // SAFETY: an open context (a live PD's) and the program's attributes.
        let srq = unsafe { super::queues::create_srq_ex(verbs, attr) };
        if srq.is_null() {
            Err(super::errno())
        } else {
            Ok(srq)
        }
    }

    fn destroy_srq(&self, srq: *mut ibv_srq) {
        if !srq.is_null() {
            // SAFETY: the id's SRQ, which the program no longer uses
            // (`rdma_destroy_srq`'s contract).
            unsafe { super::queues::remem_ibv_ibv_destroy_srq(srq) };
        }
    }
}

/// `rdma_create_qp_ex`: see `qp::create_qp`. -1 with errno (EINVAL for NULL arguments).
///
/// # Safety
///
/// `id` is NULL or a live id; `attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard_neg("rdma_create_qp_ex", || {
        // SAFETY: by the contract.
        let (Some(h), Some(a)) = (unsafe { Handle::<RdmaId>::from_abi(id) }, unsafe {
            attr.as_mut()
        }) else {
            return fail(libc::EINVAL);
        };
        match qp::create_qp(h, a, &QpVerbs) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_create_qp`: `rdma_create_qp_ex` on `pd` (NULL: the id's) with the basic
/// attributes; the granted sizes and the CQs used are written back.
///
/// # Safety
///
/// `id` is NULL or a live id; `pd` is NULL or a live PD; `qp_init_attr` is NULL or
/// readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_qp", || {
        // SAFETY: by the contract.
        let (Some(h), Some(b)) = (unsafe { Handle::<RdmaId>::from_abi(id) }, unsafe {
            qp_init_attr.as_mut()
        }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: plain data; all-zero is valid.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.qp_context = b.qp_context;
        ex.send_cq = b.send_cq;
        ex.recv_cq = b.recv_cq;
        ex.srq = b.srq;
        ex.cap = b.cap;
        ex.qp_type = b.qp_type;
        ex.sq_sig_all = b.sq_sig_all;
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        ex.pd = if pd.is_null() { h.pd() } else { pd };
        let r = qp::create_qp(h, &mut ex, &QpVerbs);
        b.send_cq = ex.send_cq;
        b.recv_cq = ex.recv_cq;
        b.srq = ex.srq;
        b.cap = ex.cap;
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_qp`: see `qp::destroy_qp`.
///
/// # Safety
///
/// `id` is NULL or a live id whose QP the program no longer uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_qp(id: *mut rdma_cm_id) {
    super::guard(
        "rdma_destroy_qp",
        || (),
        || {
            // SAFETY: by the contract.
            if let Some(h) = unsafe { Handle::<RdmaId>::from_abi(id) } {
                qp::destroy_qp(h, &QpVerbs);
            }
        },
    )
}

/// `rdma_create_srq_ex`: see `qp::create_srq`. -1 with errno (EINVAL for NULL
/// arguments).
///
/// # Safety
///
/// `id` is NULL or a live id; `attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard_neg("rdma_create_srq_ex", || {
        // SAFETY: by the contract.
        let (Some(h), Some(a)) = (unsafe { Handle::<RdmaId>::from_abi(id) }, unsafe {
            attr.as_mut()
        }) else {
            return fail(libc::EINVAL);
        };
        match qp::create_srq(h, a, &QpVerbs) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_create_srq`: `rdma_create_srq_ex` with a basic SRQ on `pd` (NULL: the id's).
///
/// # Safety
///
/// `id` is NULL or a live id; `pd` is NULL or a live PD; `attr` is NULL or readable and
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard_neg("rdma_create_srq", || {
        // SAFETY: by the contract.
        let Some(b) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: plain data; all-zero is valid.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.srq_context = b.srq_context;
        ex.attr = b.attr;
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        ex.srq_type = IBV_SRQT_BASIC;
        ex.pd = pd;
        // SAFETY: by the contract; `ex` is a local copy.
        let r = unsafe { remem_ibv_rdma_create_srq_ex(id, &mut ex) };
        b.attr = ex.attr;
        r
    })
}

/// `rdma_destroy_srq`: see `qp::destroy_srq`.
///
/// # Safety
///
/// `id` is NULL or a live id whose SRQ the program no longer uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_srq(id: *mut rdma_cm_id) {
    super::guard(
        "rdma_destroy_srq",
        || (),
        || {
            // SAFETY: by the contract.
            if let Some(h) = unsafe { Handle::<RdmaId>::from_abi(id) } {
                qp::destroy_srq(h, &QpVerbs);
            }
        },
    )
}

// ----- devices (rdmacm::devices) -------------------------------------------------------

/// `rdma_get_devices`: every device, opened (`ibv_context`s of this library), in a
/// NULL-terminated array freed by `rdma_free_devices`; `*num_devices` their number. NULL
/// with errno (ENODEV: no devices) if none can be opened.
///
/// # Safety
///
/// `num_devices` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_devices(
    num_devices: *mut c_int,
) -> *mut *mut ibv_context {
    guard_ptr("rdma_get_devices", || {
        let set_num = |n: usize| {
            if !num_devices.is_null() {
                // SAFETY: non-NULL and writable by the contract.
                unsafe { *num_devices = n as c_int };
            }
        };
        let n = match crate::rdmacm::devices::count() {
            Ok(n) => n,
            Err(e) => {
                set_num(0);
                return null_with(e);
            }
        };
        let list: Vec<*mut ibv_context> = (0..n)
            .filter_map(|i| crate::rdmacm::devices::open(i).ok())
            .map(|d| d.verbs())
            .collect();
        if list.is_empty() {
            set_num(0);
            return null_with(libc::ENODEV);
        }
        set_num(list.len());
        // SAFETY: calloc of len + 1 pointers (zeroed: the NULL terminator); freed by
        // rdma_free_devices with free().
        let out = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if out.is_null() {
            set_num(0);
            return null_with(libc::ENOMEM);
        }
        for (i, c) in list.iter().enumerate() {
            // SAFETY: within the len + 1 slots just allocated.
            unsafe { out.add(i).write(*c) };
        }
        out
    })
}

/// `rdma_free_devices`: frees the array (the devices stay open, as librdmacm's do).
///
/// # Safety
///
/// `list` is NULL or came from `rdma_get_devices` and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: NULL or the calloc'd array of rdma_get_devices, by the contract.
    unsafe { libc::free(list.cast()) };
}

#[cfg(test)]
mod channel_tests {
    use super::*;

    #[test]
    fn event_names() {
        // SAFETY: the strings are static C strings.
        let name = |e| unsafe { core::ffi::CStr::from_ptr(remem_ibv_rdma_event_str(e)) };
        assert_eq!(
            name(RDMA_CM_EVENT_ESTABLISHED).to_str().unwrap(),
            "RDMA_CM_EVENT_ESTABLISHED"
        );
        assert_eq!(
            name(RDMA_CM_EVENT_TIMEWAIT_EXIT).to_str().unwrap(),
            "RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
        assert_eq!(name(99).to_str().unwrap(), "UNKNOWN EVENT");
    }

    #[test]
    fn null_arguments_are_einval() {
        let mut ev = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: NULL channel is allowed.
            unsafe { remem_ibv_rdma_get_cm_event(std::ptr::null_mut(), &mut ev) },
            -1
        );
        assert_eq!(crate::ffi::errno(), libc::EINVAL);
        assert_eq!(
            // SAFETY: NULL is allowed.
            unsafe { remem_ibv_rdma_ack_cm_event(std::ptr::null_mut()) },
            -1
        );
        assert_eq!(crate::ffi::errno(), libc::EINVAL);
    }

    /// rping destroys its channel at exit while its CM thread still waits in
    /// `rdma_get_cm_event`: the waiter must not touch freed memory (this test runs under
    /// valgrind in CI). It holds the channel's queue while it waits and returns EINTR
    /// when a signal interrupts it.
    #[test]
    fn destroying_a_channel_under_a_waiter_frees_nothing_it_uses() {
        extern "C" fn nothing(_: c_int) {}
        // SAFETY: installs a handler that does nothing for SIGUSR2, without SA_RESTART
        // (poll is never restarted anyway): the waiter's poll returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        }
        let (channel, _) = new_channel().unwrap();
        // SAFETY: the channel just made.
        let inner = unsafe { channel_from(channel) }.unwrap();
        let at = channel as usize;
        let waiter = std::thread::spawn(move || {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a live channel when the call starts; `ev` is writable.
            let r = unsafe { remem_ibv_rdma_get_cm_event(at as *mut _, &mut ev) };
            (r, crate::ffi::errno())
        });
        // The waiter holds the queue once it is inside the call.
        while Arc::strong_count(&inner) < 3 {
            std::thread::yield_now();
        }
        // SAFETY: the channel is not used by this thread afterwards but to check that a
        // destroyed channel is refused (its tombstone is kept).
        unsafe { remem_ibv_rdma_destroy_event_channel(channel) };
        assert_eq!(Arc::strong_count(&inner), 2, "the waiter still holds it");
        // A call that starts after the destroy waits too, until a signal.
        let late = std::thread::spawn(move || {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a channel destroyed just now: its tombstone is kept.
            let r = unsafe { remem_ibv_rdma_get_cm_event(at as *mut _, &mut ev) };
            (r, crate::ffi::errno())
        });
        {
            use std::os::unix::thread::JoinHandleExt;
            let tid = late.as_pthread_t();
            while !late.is_finished() {
                // SAFETY: the thread is alive until joined.
                unsafe { libc::pthread_kill(tid, libc::SIGUSR2) };
                std::thread::yield_now();
            }
        }
        assert_eq!(late.join().unwrap(), (-1, libc::EINTR));
        // Interrupt the wait until the waiter returns (a signal may land before it polls).
        use std::os::unix::thread::JoinHandleExt;
        let tid = waiter.as_pthread_t();
        while Arc::strong_count(&inner) > 1 {
            // SAFETY: the waiter thread is alive while it holds its reference.
            unsafe { libc::pthread_kill(tid, libc::SIGUSR2) };
            std::thread::yield_now();
        }
        assert_eq!(waiter.join().unwrap(), (-1, libc::EINTR));
    }
}

// ----- rdma_getaddrinfo (rdmacm::addrinfo) -------------------------------------------------

/// `malloc`s a copy of a socket address.
fn alloc_addr(a: SocketAddr) -> Result<(*mut libc::sockaddr, libc::socklen_t), c_int> {
    let (ss, len) = crate::rdmacm::sockaddr::std_to_storage(a);
    // SAFETY: malloc of `len` bytes, checked.
    let p = unsafe { libc::malloc(len as usize) }.cast::<u8>();
    if p.is_null() {
        super::set_errno(libc::ENOMEM);
        return Err(libc::EAI_SYSTEM);
    }
    // SAFETY: `len` bytes of the storage into the `len` bytes just allocated.
    unsafe { std::ptr::copy_nonoverlapping((&raw const ss).cast::<u8>(), p, len as usize) };
    Ok((p.cast(), len))
}

/// `rdma_getaddrinfo` once the C strings are read: reads the hints (and their addresses),
/// and allocates the answer for the program (freed by `rdma_freeaddrinfo`).
///
/// # Safety
///
/// `hints` is NULL or a valid `rdma_addrinfo` (its addresses NULL or socket addresses).
unsafe fn getaddrinfo(
    node: Option<&CStr>,
    service: Option<&CStr>,
    hints: Option<&rdma_addrinfo>,
) -> Result<*mut rdma_addrinfo, c_int> {
    let hints = hints.map(|h| {
        (
            Hints {
                flags: h.ai_flags,
                family: h.ai_family,
                qp_type: h.ai_qp_type,
                port_space: h.ai_port_space,
            },
            // SAFETY: by the contract.
            unsafe { sockaddr_to_std(h.ai_src_addr) },
            // SAFETY: by the contract.
            unsafe { sockaddr_to_std(h.ai_dst_addr) },
        )
    });
    let a = crate::rdmacm::addrinfo::answer(node, service, hints)?;
    // SAFETY: calloc of one structure, checked; all-zero is a valid (empty) one.
    let rai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if rai.is_null() {
        super::set_errno(libc::ENOMEM);
        return Err(libc::EAI_SYSTEM);
    }
    // SAFETY: the structure just allocated.
    let r = unsafe { &mut *rai };
    r.ai_flags = a.flags;
    r.ai_family = a.family;
    r.ai_qp_type = a.qp_type;
    r.ai_port_space = a.port_space;
    let fill = |r: &mut rdma_addrinfo| -> Result<(), c_int> {
        if let Some(s) = a.src {
            let (p, len) = alloc_addr(s)?;
            r.ai_src_addr = p;
            r.ai_src_len = len;
        }
        if let Some(d) = a.dst {
            let (p, len) = alloc_addr(d)?;
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
    super::guard(
        "rdma_getaddrinfo",
        || {
            super::set_errno(libc::EIO);
            libc::EAI_SYSTEM
        },
        || {
            if res.is_null() {
                super::set_errno(libc::EINVAL);
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
            // SAFETY: by the contract.
            match unsafe { getaddrinfo(node, service, hints) } {
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
mod addrinfo_tests {
    use super::*;
    use crate::rdmacm::sockaddr::std_to_storage;

    fn get(
        node: Option<&CStr>,
        service: Option<&CStr>,
        h: Option<rdma_addrinfo>,
    ) -> Result<*mut rdma_addrinfo, c_int> {
        // SAFETY: hints made by the tests (no addresses, or socket addresses).
        unsafe { getaddrinfo(node, service, h.as_ref()) }
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
