//! Devices, their attributes, ports and GID tables.

#![forbid(unsafe_code)]

use crate::types::{Gid, LinkLayer, Mtu, PortState};
use std::net::SocketAddr;

/// One RDMA device a provider can open (an entry of `ibv_get_device_list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device name (`ibv_get_device_name`), e.g. `rxe0`, `mlx5_0`, `soft-lo`.
    pub name: String,
    /// The provider that opens it (`"soft"`, `"ibverbs"`).
    pub provider: &'static str,
    /// The node GUID (`ibv_get_device_guid`), host byte order.
    pub node_guid: u64,
    /// The network interface the device sits on, where it has one (rxe's `netdev`).
    pub netdev: Option<String>,
    /// The GID table of port 1, non-empty entries only.
    pub gids: Vec<GidEntry>,
    /// The UDP address a software device sends from and listens on, where that applies.
    pub udp_addr: Option<SocketAddr>,
}

/// How a GID is used on the wire (`enum ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// `IBV_GID_TYPE_IB`: native InfiniBand.
    Ib,
    /// `IBV_GID_TYPE_ROCE_V1`: RoCE over Ethernet (ethertype 0x8915).
    RoceV1,
    /// `IBV_GID_TYPE_ROCE_V2`: RoCE over UDP/IP, port 4791.
    RoceV2,
}

/// One GID table entry (`struct ibv_gid_entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The index in the port's GID table (`-x/--gid-index` in perftest).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// How the GID is used.
    pub gid_type: GidType,
    /// The port this entry belongs to (1-based).
    pub port_num: u8,
    /// The network device the GID was derived from, if any.
    pub netdev: Option<String>,
}

/// The first RoCE v2 GID with an IPv4 address (`::ffff:a.b.c.d`) of a GID table, by
/// index: the one UCX and most programs use by default. In rxe's table (and a soft
/// device's) it is index 1, after the link-local default GID.
pub fn first_roce_v2_ipv4(table: &[GidEntry]) -> Option<&GidEntry> {
    table
        .iter()
        .filter(|e| e.gid_type == GidType::RoceV2 && e.gid.is_ipv4_mapped())
        .min_by_key(|e| e.index)
}

/// Which atomic operations are atomic with respect to what (`enum ibv_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`: no atomics.
    None,
    /// `IBV_ATOMIC_HCA`: atomic with respect to other atomics through this device.
    Hca,
    /// `IBV_ATOMIC_GLOB`: atomic with respect to every agent, CPU included.
    Glob,
}

/// Device attributes (`struct ibv_device_attr`, with the extended fields remem needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID, host byte order.
    pub node_guid: u64,
    /// System image GUID, host byte order.
    pub sys_image_guid: u64,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (a bit per power of two).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most outstanding work requests on one queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Most scatter/gather entries per RDMA READ.
    pub max_sge_rd: u32,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries in one completion queue.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most outstanding RDMA READ/atomic requests a QP can be the target of
    /// (bounds `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA READ/atomic requests a QP can initiate (bounds `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Most responder resources for READ/atomic of the whole device.
    pub max_res_rd_atom: u32,
    /// Atomic guarantees.
    pub atomic_cap: AtomicCap,
    /// Most shared receive queues.
    pub max_srq: u32,
    /// Most work requests on one shared receive queue.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries per shared receive queue work request.
    pub max_srq_sge: u32,
    /// Most bytes of inline data in one send work request.
    pub max_inline_data: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Largest message, bytes (`ibv_port_attr.max_msg_sz`, repeated here for convenience).
    pub max_msg_sz: u32,
    /// RoCEv2 FLUSH with global-visibility placement
    /// (`IB_UVERBS_DEVICE_FLUSH_GLOBAL` of `device_cap_flags_ex`).
    pub flush_global: bool,
    /// RoCEv2 FLUSH with persistence placement (`IB_UVERBS_DEVICE_FLUSH_PERSISTENT`).
    pub flush_persistent: bool,
    /// RoCEv2 ATOMIC WRITE (`IB_UVERBS_DEVICE_ATOMIC_WRITE`).
    pub atomic_write: bool,
    /// Most memory windows (type 1 and 2B; 0: none).
    pub max_mw: u32,
    /// UD multicast limits (all zero: no multicast).
    pub mcast: McastCaps,
}

/// UD multicast limits of a device (`max_mcast_grp`, `max_mcast_qp_attach`,
/// `max_total_mcast_qp_attach` of `struct ibv_device_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct McastCaps {
    /// Most multicast groups with a QP attached.
    pub max_mcast_grp: u32,
    /// Most QPs attached to one group.
    pub max_mcast_qp_attach: u32,
    /// Most attachments (QP, group) of the whole device.
    pub max_total_mcast_qp_attach: u32,
}

impl McastCaps {
    /// Kernel rxe's limits (`rxe_param.h`: `RXE_MAX_MCAST_GRP`, `RXE_MAX_MCAST_QP_ATTACH`,
    /// `RXE_MAX_TOT_MCAST_QP_ATTACH`).
    pub const RXE: McastCaps = McastCaps {
        max_mcast_grp: 8192,
        max_mcast_qp_attach: 56,
        max_total_mcast_qp_attach: 0x70000,
    };
}

/// Port attributes (`struct ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use (derived from the network device MTU on RoCE).
    pub active_mtu: Mtu,
    /// Length of the GID table.
    pub gid_tbl_len: u32,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
    /// Length of the P_Key table.
    pub pkey_tbl_len: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active link width (`IBV_WIDTH_*` encoding).
    pub active_width: u8,
    /// Active link speed (`IBV_SPEED_*` encoding).
    pub active_speed: u8,
    /// Physical state (5 = LinkUp, 3 = Disabled).
    pub phys_state: u8,
}
