//! Device, port, GID and P_Key queries.
//!
//! The values come from the remem device (`remem_verbs::DeviceAttr`, `PortAttr`, the GID
//! table), with the node GUID of the device entry (`ibv_get_device_guid` and
//! `ibv_query_device` agree). Fields remem has no notion of are zero. The one port is 1;
//! the P_Key table is the default P_Key 0xffff. The GID table programs see holds the
//! device's RoCE v2 entries from index 0 (`CtxShared::gid_table`), in rxe's layout
//! (`remem_soft::netdev`): index 0 the link-local default GID, index 1 the IPv4-mapped
//! address (what `-x 1`, `-g 1` and UCX pick), then other IPv6 addresses; each
//! `ibv_gid_entry` carries the netdev's ifindex (`lo`: 1). `ibv_query_gid`,
//! `ibv_query_gid_ex`, `ibv_query_gid_table`, `ibv_query_gid_type` and
//! `ibv_query_port`'s `gid_tbl_len` read the same table. Both index 0 and 1 connect: a
//! soft device sends from its bound address under either, and a loopback device's
//! link-local GID names it as a destination.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::{Ctx, ctx_from};
use crate::ffi::{guard_int, set_errno};
use core::ffi::{c_int, c_uint};
use remem_verbs::{AtomicCap, DeviceAttr, GidEntry, GidType, LinkLayer, PortAttr};

symver!(
    "ibv_query_device" @ "IBVERBS_1.1",
    "ibv_query_port" @ "IBVERBS_1.1",
    "ibv_query_gid" @ "IBVERBS_1.1",
    "_ibv_query_gid_ex" @ "IBVERBS_1.11",
    "_ibv_query_gid_table" @ "IBVERBS_1.11",
    "ibv_query_pkey" @ "IBVERBS_1.1",
    "ibv_get_pkey_index" @ "IBVERBS_1.5",
    "ibv_query_gid_type" @ "IBVERBS_PRIVATE_34",
    "ibv_resolve_eth_l2_from_gid" @ "IBVERBS_1.1",
);

/// The default (full-membership) P_Key, the only entry of the P_Key table.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// rxe's local CA ACK delay (`ibv_device_attr.local_ca_ack_delay`).
const LOCAL_CA_ACK_DELAY: u8 = 15;

// ----- conversions (pure) --------------------------------------------------------------------

fn clamp_int(v: u32) -> c_int {
    v.min(c_int::MAX as u32) as c_int
}

/// `ibv_device_attr` of a remem device with node GUID `guid` (host order).
pub fn device_attr(a: &DeviceAttr, guid: u64, pkeys: u16) -> ibv_device_attr {
    let mut fw_ver = [0 as core::ffi::c_char; 64];
    for (d, b) in fw_ver.iter_mut().zip(a.fw_ver.bytes().take(63)) {
        *d = b as core::ffi::c_char;
    }
    ibv_device_attr {
        fw_ver,
        node_guid: guid.to_be(),
        sys_image_guid: guid.to_be(),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: clamp_int(a.max_qp),
        max_qp_wr: clamp_int(a.max_qp_wr),
        device_cap_flags: IBV_DEVICE_SYS_IMAGE_GUID
            | IBV_DEVICE_RC_RNR_NAK_GEN
            // Memory windows of type 1 and 2B, as rxe reports them.
            | if a.max_mw > 0 {
                IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B
            } else {
                0
            },
        max_sge: clamp_int(a.max_sge),
        max_sge_rd: clamp_int(a.max_sge_rd),
        max_cq: clamp_int(a.max_cq),
        max_cqe: clamp_int(a.max_cqe),
        max_mr: clamp_int(a.max_mr),
        max_pd: clamp_int(a.max_pd),
        max_qp_rd_atom: clamp_int(a.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: clamp_int(a.max_res_rd_atom),
        max_qp_init_rd_atom: clamp_int(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: match a.atomic_cap {
            AtomicCap::None => IBV_ATOMIC_NONE,
            AtomicCap::Hca => IBV_ATOMIC_HCA,
            AtomicCap::Glob => IBV_ATOMIC_GLOB,
        },
        max_ee: 0,
        max_rdd: 0,
        max_mw: clamp_int(a.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: clamp_int(a.mcast.max_mcast_grp),
        max_mcast_qp_attach: clamp_int(a.mcast.max_mcast_qp_attach),
        max_total_mcast_qp_attach: clamp_int(a.mcast.max_total_mcast_qp_attach),
        max_ah: clamp_int(a.max_ah),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: clamp_int(a.max_srq),
        max_srq_wr: clamp_int(a.max_srq_wr),
        max_srq_sge: clamp_int(a.max_srq_sge),
        max_pkeys: pkeys,
        local_ca_ack_delay: LOCAL_CA_ACK_DELAY,
        phys_port_cnt: a.phys_port_cnt,
    }
}

/// `ibv_port_attr` of a remem port.
pub fn port_attr(p: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state as ibv_port_state,
        max_mtu: p.max_mtu as ibv_mtu,
        active_mtu: p.active_mtu as ibv_mtu,
        gid_tbl_len: clamp_int(p.gid_tbl_len),
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: match p.link_layer {
            LinkLayer::InfiniBand => IBV_LINK_LAYER_INFINIBAND,
            LinkLayer::Ethernet => IBV_LINK_LAYER_ETHERNET,
        },
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// `ibv_gid_entry` of a GID table entry.
pub fn gid_entry(e: &GidEntry) -> ibv_gid_entry {
    let ndev_ifindex = e.netdev.as_deref().map_or(0, |name| {
        std::ffi::CString::new(name).map_or(0, |c| {
            // SAFETY: if_nametoindex reads a NUL-terminated string.
            unsafe { libc::if_nametoindex(c.as_ptr()) }
        })
    });
    ibv_gid_entry {
        gid: ibv_gid { raw: e.gid.0 },
        gid_index: e.index,
        port_num: u32::from(e.port_num),
        gid_type: match e.gid_type {
            GidType::Ib => IBV_GID_TYPE_IB,
            GidType::RoceV1 => IBV_GID_TYPE_ROCE_V1,
            GidType::RoceV2 => IBV_GID_TYPE_ROCE_V2,
        },
        ndev_ifindex,
    }
}

/// Copies `value` into `dst`, at most `len` bytes of it.
///
/// # Safety
///
/// `dst` is writable for `len` bytes.
unsafe fn write_prefix<T>(dst: *mut T, value: &T, len: usize) {
    let n = len.min(size_of::<T>());
    // SAFETY: `value` is readable for size_of::<T>() >= n bytes, `dst` writable for
    // len >= n bytes, and they do not overlap (`value` is a Rust local).
    unsafe { std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), dst.cast::<u8>(), n) };
}

// ----- lookups ---------------------------------------------------------------------------------

/// The context, or EINVAL.
fn ctx<'a>(context: *mut ibv_context) -> Result<&'a Ctx, c_int> {
    // SAFETY: the exported functions' contracts: NULL or a live context.
    unsafe { ctx_from(context) }.ok_or(libc::EINVAL)
}

fn errno(e: remem_verbs::Error) -> c_int {
    crate::ffi::errno_of(&e)
}

/// The node GUID of the context's device entry (host order).
fn guid_of(c: &Ctx) -> u64 {
    crate::device::device_from(c.shared().ibv_device())
        .map_or(c.shared().dev.info().node_guid, |d| d.guid())
}

/// The port as programs see it: its GID table holds the RoCE v2 entries only
/// (`CtxShared::gid_table`).
fn port_of(c: &Ctx, port_num: u32) -> Result<PortAttr, c_int> {
    let ports = c.shared().dev.query_device().map_err(errno)?.phys_port_cnt;
    if port_num == 0 || port_num > u32::from(ports) {
        return Err(libc::EINVAL);
    }
    let mut p = c.shared().dev.query_port(port_num as u8).map_err(errno)?;
    p.gid_tbl_len = c.shared().gid_table(port_num as u8).map_err(errno)?.len() as u32;
    Ok(p)
}

/// The GID table entry `index` of `port_num`: EINVAL outside the table, ENODATA for an
/// empty slot.
fn gid_of(c: &Ctx, port_num: u32, index: u32) -> Result<GidEntry, c_int> {
    let port = port_of(c, port_num)?;
    if index >= port.gid_tbl_len {
        return Err(libc::EINVAL);
    }
    c.shared()
        .gid_table(port_num as u8)
        .map_err(errno)?
        .into_iter()
        .find(|e| e.index == index)
        .ok_or(libc::ENODATA)
}

// ----- device ---------------------------------------------------------------------------------

/// `ibv_query_device`: 0, or EINVAL for a NULL argument.
///
/// # Safety
///
/// `context` is NULL or open; `attr` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard_int("ibv_query_device", || {
        let c = match ctx(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match query_device_attr(c) {
            Ok(a) => {
                // SAFETY: writable by the contract.
                unsafe { attr.write(a) };
                0
            }
            Err(e) => e,
        }
    })
}

fn query_device_attr(c: &Ctx) -> Result<ibv_device_attr, c_int> {
    query_device_both(c).map(|(a, _)| a)
}

/// The basic attributes and the `device_cap_flags_ex` of the context's device.
fn query_device_both(c: &Ctx) -> Result<(ibv_device_attr, u64), c_int> {
    let a = c.shared().dev.query_device().map_err(errno)?;
    let pkeys = c.shared().dev.query_port(1).map_or(1, |p| p.pkey_tbl_len);
    let basic = device_attr(&a, guid_of(c), pkeys);
    let ex = u64::from(basic.device_cap_flags) | cap_flags_ex(&a);
    Ok((basic, ex))
}

/// The 64-bit `device_cap_flags_ex` bits beyond `device_cap_flags`: the RoCEv2 memory
/// placement extensions the device executes (`IB_UVERBS_DEVICE_FLUSH_GLOBAL`,
/// `_FLUSH_PERSISTENT`, `_ATOMIC_WRITE`, as rxe reports them).
pub fn cap_flags_ex(a: &DeviceAttr) -> u64 {
    let mut f = 0;
    if a.flush_global {
        f |= IB_UVERBS_DEVICE_FLUSH_GLOBAL;
    }
    if a.flush_persistent {
        f |= IB_UVERBS_DEVICE_FLUSH_PERSISTENT;
    }
    if a.atomic_write {
        f |= IB_UVERBS_DEVICE_ATOMIC_WRITE;
    }
    f
}

/// `verbs_context::query_device_ex` (verbs.h's inline `ibv_query_device_ex`): the basic
/// attributes, the placement extensions in `device_cap_flags_ex` ([`cap_flags_ex`]), and
/// zeros for the extensions remem has none of. EINVAL for a NULL
/// argument, an input with a non-zero `comp_mask`, or `attr_size` smaller than
/// `struct ibv_device_attr`; a smaller (older) `ibv_device_attr_ex` gets its prefix.
///
/// # Safety
///
/// `context` is NULL or open; `input` NULL or readable; `attr` NULL or writable for
/// `attr_size` bytes.
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard_int("ibv_query_device_ex", || {
        let c = match ctx(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        // SAFETY: NULL or readable by the contract.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let (orig, flags_ex) = match query_device_both(c) {
            Ok(a) => a,
            Err(e) => return e,
        };
        // SAFETY: an all-zero ibv_device_attr_ex is valid (integers, no pointers).
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        ex.device_cap_flags_ex = flags_ex;
        ex.phys_port_cnt_ex = u32::from(orig.phys_port_cnt);
        ex.orig_attr = orig;
        // SAFETY: writable for attr_size bytes by the contract.
        unsafe { write_prefix(attr, &ex, attr_size) };
        0
    })
}

// ----- port ---------------------------------------------------------------------------------------

/// `verbs_context::query_port` (verbs.h's inline `ibv_query_port`): 0; EINVAL for a NULL
/// argument or a port other than 1. A smaller (older) `ibv_port_attr` gets its prefix.
///
/// # Safety
///
/// `context` is NULL or open; `attr` is NULL or writable for `attr_len` bytes.
pub unsafe extern "C" fn query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    guard_int("ibv_query_port", || {
        let c = match ctx(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match port_of(c, u32::from(port_num)) {
            Ok(p) => {
                // SAFETY: writable for attr_len bytes by the contract.
                unsafe { write_prefix(attr, &port_attr(&p), attr_len) };
                0
            }
            Err(e) => e,
        }
    })
}

/// The size of rdma-core's `struct _compat_ibv_port_attr`: `ibv_port_attr` up to
/// `link_layer`, and one reserved byte.
const COMPAT_PORT_ATTR_LEN: usize = std::mem::offset_of!(ibv_port_attr, flags) + 1;

/// `ibv_query_port`, the exported symbol (reached by programs built without verbs.h's
/// inline wrapper): writes the compat layout, `ibv_port_attr` up to `link_layer`.
///
/// # Safety
///
/// `context` is NULL or open; `attr` is NULL or writable for the compat layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut _compat_ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded contract; the compat layout is the prefix written.
    unsafe { query_port(context, port_num, attr.cast(), COMPAT_PORT_ATTR_LEN) }
}

// ----- GIDs ----------------------------------------------------------------------------------------

/// `ibv_query_gid`: 0 (an empty slot of the table reads as the zero GID, as in
/// rdma-core); -1 with errno EINVAL for a bad port or index or a NULL argument.
///
/// # Safety
///
/// `context` is NULL or open; `gid` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    crate::ffi::guard_neg("ibv_query_gid", || {
        let r = ctx(context).and_then(|c| {
            if gid.is_null() || index < 0 {
                return Err(libc::EINVAL);
            }
            match gid_of(c, u32::from(port_num), index as u32) {
                Ok(e) => Ok(e.gid.0),
                Err(libc::ENODATA) => Ok([0; 16]),
                Err(e) => Err(e),
            }
        });
        match r {
            Ok(raw) => {
                // SAFETY: writable by the contract.
                unsafe { gid.write(ibv_gid { raw }) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `_ibv_query_gid_ex` (verbs.h's inline `ibv_query_gid_ex`): 0; EINVAL for a bad
/// port, index, flags, NULL argument or an `entry_size` smaller than
/// `struct ibv_gid_entry`; ENODATA for an empty slot.
///
/// # Safety
///
/// `context` is NULL or open; `entry` NULL or writable for `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv__ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard_int("ibv_query_gid_ex", || {
        let c = match ctx(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        match gid_of(c, port_num, gid_index) {
            Ok(e) => {
                // SAFETY: writable for entry_size >= size_of bytes by the contract.
                unsafe { entry.write(gid_entry(&e)) };
                0
            }
            Err(e) => e,
        }
    })
}

/// `_ibv_query_gid_table` (verbs.h's inline `ibv_query_gid_table`): the valid entries of
/// every port, packed at `entry_size` strides; their number, or a negative errno: EINVAL
/// for bad flags, a NULL argument or an `entry_size` smaller than `struct ibv_gid_entry`,
/// or too few `max_entries`.
///
/// # Safety
///
/// `context` is NULL or open; `entries` NULL or writable for `max_entries` entries of
/// `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv__ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let r = guard_int("ibv_query_gid_table", || {
        let c = match ctx(context) {
            Ok(c) => c,
            Err(e) => return -e,
        };
        if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -libc::EINVAL;
        }
        let ports = match c.shared().dev.query_device() {
            Ok(a) => a.phys_port_cnt,
            Err(e) => return -errno(e),
        };
        let mut all = Vec::new();
        for port in 1..=ports {
            match c.shared().gid_table(port) {
                Ok(t) => all.extend(t),
                Err(e) => return -errno(e),
            }
        }
        if all.len() > max_entries {
            return -libc::EINVAL;
        }
        for (i, e) in all.iter().enumerate() {
            // SAFETY: i < max_entries, each slot writable for entry_size bytes by the
            // contract; the slot may be unaligned for a foreign entry_size.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(i * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(gid_entry(e))
            };
        }
        all.len() as c_int
    });
    // guard_int's panic value is EIO, positive: make it negative.
    if r == libc::EIO {
        -(libc::EIO as isize)
    } else {
        r as isize
    }
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; perftest uses it): 0 with the sysfs type
/// (RoCE v2, or IB/RoCE v1); -1 with errno EINVAL for a bad port, index or NULL argument,
/// ENODATA for an empty slot.
///
/// # Safety
///
/// `context` is NULL or open; `gid_type` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut ibv_gid_type_sysfs,
) -> c_int {
    crate::ffi::guard_neg("ibv_query_gid_type", || {
        let r = ctx(context).and_then(|c| {
            if gid_type.is_null() {
                return Err(libc::EINVAL);
            }
            gid_of(c, u32::from(port_num), index)
        });
        match r {
            Ok(e) => {
                let t = match e.gid_type {
                    GidType::RoceV2 => IBV_GID_TYPE_SYSFS_ROCE_V2,
                    GidType::Ib | GidType::RoceV1 => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
                };
                // SAFETY: writable by the contract.
                unsafe { gid_type.write(t) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

// ----- P_Keys ---------------------------------------------------------------------------------------

/// `ibv_query_pkey`: the default P_Key (big-endian) at index 0; -1 with errno EINVAL for
/// a bad port, index or NULL argument.
///
/// # Safety
///
/// `context` is NULL or open; `pkey` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    crate::ffi::guard_neg("ibv_query_pkey", || {
        let r = ctx(context).and_then(|c| {
            let port = port_of(c, u32::from(port_num))?;
            if pkey.is_null() || index < 0 || index as u32 >= u32::from(port.pkey_tbl_len) {
                return Err(libc::EINVAL);
            }
            Ok(())
        });
        match r {
            Ok(()) => {
                // SAFETY: writable by the contract.
                unsafe { pkey.write(DEFAULT_PKEY.to_be()) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `ibv_get_pkey_index`: the index of `pkey` (big-endian) in the P_Key table; -1 with
/// errno EINVAL for a bad port, ENOENT for a P_Key not in the table.
///
/// # Safety
///
/// `context` is NULL or open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    crate::ffi::guard_neg("ibv_get_pkey_index", || {
        let r = ctx(context).and_then(|c| port_of(c, u32::from(port_num)));
        match r {
            Ok(_) if u16::from_be(pkey) == DEFAULT_PKEY => 0,
            Ok(_) => {
                set_errno(libc::ENOENT);
                -1
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `ibv_resolve_eth_l2_from_gid`: the Ethernet address of a RoCE destination. Soft
/// devices speak UDP and have no layer 2 of their own: EOPNOTSUPP.
///
/// # Safety
///
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    let _ = (context, attr, eth_mac, vid);
    libc::EOPNOTSUPP
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::{Gid, Mtu, PortState};

    fn soft_attr() -> DeviceAttr {
        DeviceAttr {
            fw_ver: "x".repeat(100),
            node_guid: 1,
            sys_image_guid: 1,
            max_mr_size: u64::MAX >> 1,
            page_size_cap: 0xffff_f000,
            vendor_id: 0xffffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: u32::MAX,
            max_qp_wr: 1 << 20,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: 1 << 20,
            max_cqe: 32767,
            max_mr: 1 << 19,
            max_pd: 1 << 20,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 0x3f000,
            atomic_cap: AtomicCap::Hca,
            max_srq: 1 << 20,
            max_srq_wr: 1 << 20,
            max_srq_sge: 27,
            max_inline_data: 512,
            max_ah: 32767,
            phys_port_cnt: 1,
            max_msg_sz: 1 << 31,
            flush_global: true,
            flush_persistent: true,
            atomic_write: true,
            max_mw: 0x1000,
            mcast: remem_verbs::McastCaps::RXE,
        }
    }

    #[test]
    fn device_attr_converts_and_clamps() {
        let a = device_attr(&soft_attr(), 0x0200_12b7_7f00_0065, 1);
        assert_eq!(u64::from_be(a.node_guid), 0x0200_12b7_7f00_0065);
        assert_eq!(a.sys_image_guid, a.node_guid);
        assert_eq!(a.max_qp, c_int::MAX, "u32::MAX clamps to INT_MAX");
        assert_eq!(a.atomic_cap, IBV_ATOMIC_HCA);
        assert_eq!(a.max_pkeys, 1);
        assert_eq!(a.phys_port_cnt, 1);
        assert_eq!(a.fw_ver[62], b'x' as core::ffi::c_char);
        assert_eq!(a.fw_ver[63], 0, "fw_ver stays NUL-terminated");
    }

    #[test]
    fn memory_windows_are_reported_as_rxe_reports_them() {
        let mut a = soft_attr();
        let d = device_attr(&a, 1, 1);
        assert_eq!(d.max_mw, 0x1000);
        let mw = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
        assert_eq!(d.device_cap_flags & mw, mw);
        assert_eq!(d.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A, 0);
        a.max_mw = 0;
        let d = device_attr(&a, 1, 1);
        assert_eq!((d.max_mw, d.device_cap_flags & mw), (0, 0));
    }

    #[test]
    fn placement_extensions_in_cap_flags_ex() {
        let mut a = soft_attr();
        assert_eq!(
            cap_flags_ex(&a),
            (1 << 38) | (1 << 39) | (1 << 40),
            "FLUSH_GLOBAL, FLUSH_PERSISTENT, ATOMIC_WRITE"
        );
        a.flush_persistent = false;
        a.atomic_write = false;
        assert_eq!(cap_flags_ex(&a), IB_UVERBS_DEVICE_FLUSH_GLOBAL);
    }

    #[test]
    fn port_attr_converts() {
        let p = port_attr(&PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            gid_tbl_len: 2,
            max_msg_sz: 1 << 31,
            pkey_tbl_len: 1,
            link_layer: LinkLayer::Ethernet,
            active_width: 1,
            active_speed: 1,
            phys_state: 5,
        });
        assert_eq!(p.state, IBV_PORT_ACTIVE);
        assert_eq!(p.max_mtu, IBV_MTU_4096);
        assert_eq!(p.active_mtu, IBV_MTU_1024);
        assert_eq!(p.link_layer, IBV_LINK_LAYER_ETHERNET);
        assert_eq!(p.gid_tbl_len, 2);
        assert_eq!(p.phys_state, 5);
    }

    #[test]
    fn gid_entry_converts() {
        let e = gid_entry(&GidEntry {
            index: 1,
            gid: Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 7)),
            gid_type: GidType::RoceV2,
            port_num: 1,
            netdev: Some("lo".into()),
        });
        // SAFETY: reading the raw bytes of a GID union (always initialised).
        let raw = unsafe { e.gid.raw };
        assert_eq!(&raw[10..], &[0xff, 0xff, 127, 0, 0, 7]);
        assert_eq!(e.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!(e.gid_index, 1);
        assert_eq!(e.ndev_ifindex, 1, "lo is interface 1");
    }

    #[test]
    fn write_prefix_writes_no_more_than_asked() {
        let mut buf = [0xaau8; 8];
        let value = 0x1122_3344_5566_7788u64;
        // SAFETY: buf is writable for 8 bytes.
        unsafe { write_prefix(buf.as_mut_ptr().cast::<u64>(), &value, 3) };
        assert_eq!(&buf[..3], &value.to_ne_bytes()[..3]);
        assert_eq!(&buf[3..], &[0xaa; 5]);
    }
}
