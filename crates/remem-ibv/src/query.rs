//! Device, port, GID and P_Key queries: the safe part (the C entry points are in
//! [`crate::ffi::verbs`]).
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

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::Ctx;
use core::ffi::c_int;
use remem_verbs::{AtomicCap, DeviceAttr, GidEntry, GidType, LinkLayer, PortAttr};

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
        std::ffi::CString::new(name).map_or(0, |c| crate::ffi::verbs::if_index(&c))
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

// ----- lookups ---------------------------------------------------------------------------------

pub(crate) fn errno(e: remem_verbs::Error) -> c_int {
    crate::ffi::errno_of(&e)
}

/// The node GUID of the context's device entry (host order).
fn guid_of(c: &Ctx) -> u64 {
    crate::device::device_from(c.shared().ibv_device())
        .map_or(c.shared().dev.info().node_guid, |d| d.guid())
}

/// The port as programs see it: its GID table holds the RoCE v2 entries only
/// (`CtxShared::gid_table`).
pub(crate) fn port_of(c: &Ctx, port_num: u32) -> Result<PortAttr, c_int> {
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
pub(crate) fn gid_of(c: &Ctx, port_num: u32, index: u32) -> Result<GidEntry, c_int> {
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

pub(crate) fn query_device_attr(c: &Ctx) -> Result<ibv_device_attr, c_int> {
    query_device_both(c).map(|(a, _)| a)
}

/// The basic attributes and the `device_cap_flags_ex` of the context's device.
pub(crate) fn query_device_both(c: &Ctx) -> Result<(ibv_device_attr, u64), c_int> {
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

// ----- port ---------------------------------------------------------------------------------------

/// The size of rdma-core's `struct _compat_ibv_port_attr`: `ibv_port_attr` up to
/// `link_layer`, and one reserved byte.
pub(crate) const COMPAT_PORT_ATTR_LEN: usize = std::mem::offset_of!(ibv_port_attr, flags) + 1;

// ----- GIDs ----------------------------------------------------------------------------------------

/// `ibv_query_gid` once the FFI layer has the context: the GID at `index` (zeros for an
/// empty slot); EINVAL for a negative index or one past the table.
pub(crate) fn gid(c: &Ctx, port_num: u8, index: c_int) -> Result<[u8; 16], c_int> {
    let index = u32::try_from(index).map_err(|_| libc::EINVAL)?;
    match gid_of(c, u32::from(port_num), index) {
        Ok(e) => Ok(e.gid.0),
        Err(libc::ENODATA) => Ok([0; 16]),
        Err(e) => Err(e),
    }
}

/// Every port's GID table (`ibv_query_gid_table`).
pub(crate) fn gid_tables(c: &Ctx) -> Result<Vec<GidEntry>, c_int> {
    let ports = c.shared().dev.query_device().map_err(errno)?.phys_port_cnt;
    let mut all = Vec::new();
    for port in 1..=ports {
        all.extend(c.shared().gid_table(port).map_err(errno)?);
    }
    Ok(all)
}

/// `ibv_query_gid_type`: the sysfs type of the GID at `index`.
pub(crate) fn gid_type(c: &Ctx, port_num: u8, index: u32) -> Result<ibv_gid_type_sysfs, c_int> {
    let e = gid_of(c, u32::from(port_num), index)?;
    Ok(match e.gid_type {
        GidType::RoceV2 => IBV_GID_TYPE_SYSFS_ROCE_V2,
        GidType::Ib | GidType::RoceV1 => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
    })
}

// ----- P_Keys ---------------------------------------------------------------------------------------

/// `ibv_query_pkey`: the P_Key at `index` (network order); EINVAL without a place for it
/// (`has_out` false) or past the table.
pub(crate) fn pkey(c: &Ctx, port_num: u8, index: c_int, has_out: bool) -> Result<u16, c_int> {
    let port = port_of(c, u32::from(port_num))?;
    if !has_out || index < 0 || index as u32 >= u32::from(port.pkey_tbl_len) {
        return Err(libc::EINVAL);
    }
    Ok(DEFAULT_PKEY.to_be())
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order); ENOENT if absent.
pub(crate) fn pkey_index(c: &Ctx, port_num: u8, pkey: u16) -> Result<c_int, c_int> {
    port_of(c, u32::from(port_num))?;
    if u16::from_be(pkey) == DEFAULT_PKEY {
        Ok(0)
    } else {
        Err(libc::ENOENT)
    }
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
        let raw = crate::ffi::gid(&e.gid).0;
        assert_eq!(&raw[10..], &[0xff, 0xff, 127, 0, 0, 7]);
        assert_eq!(e.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!(e.gid_index, 1);
        assert_eq!(e.ndev_ifindex, 1, "lo is interface 1");
    }
}
