//! The C ABI of rdma-core 44's `<infiniband/verbs.h>`: every struct, union and enum
//! constant this library reads or writes, laid out exactly as the header lays them out
//! (x86_64 / aarch64 Linux, LP64).
//!
//! Conventions (see `plan17.md`): type and field names are verbs.h's; a named union or
//! struct member keeps its C name (`wr`, `element`, `global`) and its type is named
//! `<outer>_<member>`; an ANONYMOUS member gets a field named after its first member with
//! a `u_` prefix (`ibv_send_wr::u_imm_data`, a union of `imm_data` and `invalidate_rkey`).
//! `__be16/32/64` fields are plain integers holding big-endian values. C enums are 4-byte
//! integers: `pub type ibv_qp_state = u32` and `pub const IBV_QPS_RTS: ibv_qp_state`.
//! Function pointers are `Option<unsafe extern "C" fn(..)>` (NULL = `None`).
//!
//! The layout test (`abi::tests`, run by `cargo test -p remem-ibv`) compiles a C program
//! against the installed verbs.h and compares the size, alignment and every field offset
//! of every type declared here, and the value of every constant.

#![forbid(unsafe_code)]
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

#[macro_use]
pub(crate) mod macros;
#[cfg(test)]
pub(crate) mod tests;

use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::{pthread_cond_t, pthread_mutex_t, timespec};

/// Declares types that programs only ever see behind pointers this library never hands
/// out (flows, flow actions): zero-sized, not constructible.
macro_rules! opaque {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`struct ", stringify!($name), "`: opaque here (never created by this library).")]
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}

opaque!(
    ibv_flow,
    ibv_flow_attr,
    ibv_flow_action,
    ibv_flow_action_esp_attr,
    _compat_ibv_port_attr,
    verbs_ex_private
);

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context::abi_compat` of a context embedded in a
/// `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `IBV_DEVICE_RAW_SCATTER_FCS` (a 64-bit `device_cap_flags_ex` bit).
pub const IBV_DEVICE_RAW_SCATTER_FCS: u64 = 1 << 34;
/// `IBV_DEVICE_PCI_WRITE_END_PADDING` (a 64-bit `device_cap_flags_ex` bit).
pub const IBV_DEVICE_PCI_WRITE_END_PADDING: u64 = 1 << 36;

// ---------------------------------------------------------------------------------------
// Newer than rdma-core 44: the RoCEv2 memory placement extensions (FLUSH, and ATOMIC
// WRITE's device bit) as rdma-core 45+ and the kernel's uverbs headers define them. The
// installed header lacks them, so the layout test does not see these; their values are
// those of upstream verbs.h and `<rdma/ib_user_verbs.h>`.

/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL` (a `device_cap_flags_ex` bit).
pub const IB_UVERBS_DEVICE_FLUSH_GLOBAL: u64 = 1 << 38;
/// `IB_UVERBS_DEVICE_FLUSH_PERSISTENT` (a `device_cap_flags_ex` bit).
pub const IB_UVERBS_DEVICE_FLUSH_PERSISTENT: u64 = 1 << 39;
/// `IB_UVERBS_DEVICE_ATOMIC_WRITE` (a `device_cap_flags_ex` bit).
pub const IB_UVERBS_DEVICE_ATOMIC_WRITE: u64 = 1 << 40;
/// `IBV_ACCESS_FLUSH_GLOBAL`: a peer may FLUSH the region to global visibility.
pub const IBV_ACCESS_FLUSH_GLOBAL: u32 = 1 << 8;
/// `IBV_ACCESS_FLUSH_PERSISTENT`: a peer may FLUSH the region to persistence.
pub const IBV_ACCESS_FLUSH_PERSISTENT: u32 = 1 << 9;
/// `IBV_QP_EX_WITH_FLUSH` (`enum ibv_qp_create_send_ops_flags`).
pub const IBV_QP_EX_WITH_FLUSH: u64 = 1 << 11;
/// `IBV_WC_FLUSH` (`enum ibv_wc_opcode`).
pub const IBV_WC_FLUSH: u32 = 8;
/// `IBV_WR_FLUSH` (`enum ibv_wr_opcode`; offered through `ibv_wr_flush` only).
pub const IBV_WR_FLUSH: u32 = 14;
/// `IBV_FLUSH_GLOBAL` (`enum ibv_placement_type`).
pub const IBV_FLUSH_GLOBAL: u8 = 1 << 0;
/// `IBV_FLUSH_PERSISTENT` (`enum ibv_placement_type`).
pub const IBV_FLUSH_PERSISTENT: u8 = 1 << 1;
/// `IBV_FLUSH_RANGE` (`enum ibv_selectivity_level`).
pub const IBV_FLUSH_RANGE: u8 = 0;
/// `IBV_FLUSH_MR` (`enum ibv_selectivity_level`).
pub const IBV_FLUSH_MR: u8 = 1;
/// `ibv_qp_ex::wr_flush`, the member rdma-core 45+ appends after `wr_atomic_write`:
/// `(qp, rkey, remote_addr, len, type, level)`.
pub type wr_flush_fn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8);

// ---------------------------------------------------------------------------------------
// Function pointer types of the tables.

/// `ibv_context_ops::poll_cq`.
pub type poll_cq_fn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ibv_context_ops::req_notify_cq`.
pub type req_notify_cq_fn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ibv_context_ops::post_send`.
pub type post_send_fn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ibv_context_ops::post_recv`.
pub type post_recv_fn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_context_ops::post_srq_recv`.
pub type post_srq_recv_fn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// A `void *(*)(void)` placeholder slot of `ibv_context_ops` (`_compat_*`).
pub type compat_fn = unsafe extern "C" fn() -> *mut c_void;

abi_types! {
    // ----- GIDs ---------------------------------------------------------------------
    /// `union ibv_gid`: a 128-bit GID (an IPv6 address for RoCE v2).
    @c("union ibv_gid", "")
    pub union ibv_gid {
        pub raw: [u8; 16],
        pub global: ibv_gid_global,
    }
    /// `ibv_gid.global`: the two 64-bit halves, big-endian.
    @c("union ibv_gid", "global")
    pub struct ibv_gid_global {
        pub subnet_prefix: u64,
        pub interface_id: u64,
    }
    /// `struct ibv_gid_entry` (`ibv_query_gid_ex`, `ibv_query_gid_table`).
    @c("struct ibv_gid_entry", "")
    pub struct ibv_gid_entry {
        pub gid: ibv_gid,
        pub gid_index: u32,
        pub port_num: u32,
        /// `enum ibv_gid_type`.
        pub gid_type: u32,
        pub ndev_ifindex: u32,
    }

    // ----- device ---------------------------------------------------------------------
    /// `struct _ibv_device_ops`: two unused slots.
    @c("struct _ibv_device_ops", "")
    pub struct _ibv_device_ops {
        pub _dummy1: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut ibv_context>,
        pub _dummy2: Option<unsafe extern "C" fn(*mut ibv_context)>,
    }
    /// `struct ibv_device`: an entry of `ibv_get_device_list`.
    @c("struct ibv_device", "")
    pub struct ibv_device {
        pub _ops: _ibv_device_ops,
        pub node_type: ibv_node_type,
        pub transport_type: ibv_transport_type,
        /// The device name (`rxe0`), NUL-terminated.
        pub name: [c_char; IBV_SYSFS_NAME_MAX],
        /// The kernel's uverbs name (`uverbs0`).
        pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
        pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
        pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
    }
    /// `struct ibv_device_attr` (`ibv_query_device`).
    @c("struct ibv_device_attr", "")
    pub struct ibv_device_attr {
        pub fw_ver: [c_char; 64],
        /// Big-endian.
        pub node_guid: u64,
        /// Big-endian.
        pub sys_image_guid: u64,
        pub max_mr_size: u64,
        pub page_size_cap: u64,
        pub vendor_id: u32,
        pub vendor_part_id: u32,
        pub hw_ver: u32,
        pub max_qp: c_int,
        pub max_qp_wr: c_int,
        pub device_cap_flags: c_uint,
        pub max_sge: c_int,
        pub max_sge_rd: c_int,
        pub max_cq: c_int,
        pub max_cqe: c_int,
        pub max_mr: c_int,
        pub max_pd: c_int,
        pub max_qp_rd_atom: c_int,
        pub max_ee_rd_atom: c_int,
        pub max_res_rd_atom: c_int,
        pub max_qp_init_rd_atom: c_int,
        pub max_ee_init_rd_atom: c_int,
        pub atomic_cap: ibv_atomic_cap,
        pub max_ee: c_int,
        pub max_rdd: c_int,
        pub max_mw: c_int,
        pub max_raw_ipv6_qp: c_int,
        pub max_raw_ethy_qp: c_int,
        pub max_mcast_grp: c_int,
        pub max_mcast_qp_attach: c_int,
        pub max_total_mcast_qp_attach: c_int,
        pub max_ah: c_int,
        pub max_fmr: c_int,
        pub max_map_per_fmr: c_int,
        pub max_srq: c_int,
        pub max_srq_wr: c_int,
        pub max_srq_sge: c_int,
        pub max_pkeys: u16,
        pub local_ca_ack_delay: u8,
        pub phys_port_cnt: u8,
    }
    /// `struct ibv_query_device_ex_input`.
    @c("struct ibv_query_device_ex_input", "")
    pub struct ibv_query_device_ex_input {
        pub comp_mask: u32,
    }
    /// `struct ibv_odp_caps`.
    @c("struct ibv_odp_caps", "")
    pub struct ibv_odp_caps {
        pub general_caps: u64,
        pub per_transport_caps: ibv_odp_caps_per_transport_caps,
    }
    /// `ibv_odp_caps.per_transport_caps`.
    @c("struct ibv_odp_caps", "per_transport_caps")
    pub struct ibv_odp_caps_per_transport_caps {
        pub rc_odp_caps: u32,
        pub uc_odp_caps: u32,
        pub ud_odp_caps: u32,
    }
    /// `struct ibv_tso_caps`.
    @c("struct ibv_tso_caps", "")
    pub struct ibv_tso_caps {
        pub max_tso: u32,
        pub supported_qpts: u32,
    }
    /// `struct ibv_rss_caps`.
    @c("struct ibv_rss_caps", "")
    pub struct ibv_rss_caps {
        pub supported_qpts: u32,
        pub max_rwq_indirection_tables: u32,
        pub max_rwq_indirection_table_size: u32,
        pub rx_hash_fields_mask: u64,
        pub rx_hash_function: u8,
    }
    /// `struct ibv_packet_pacing_caps`.
    @c("struct ibv_packet_pacing_caps", "")
    pub struct ibv_packet_pacing_caps {
        pub qp_rate_limit_min: u32,
        pub qp_rate_limit_max: u32,
        pub supported_qpts: u32,
    }
    /// `struct ibv_tm_caps`.
    @c("struct ibv_tm_caps", "")
    pub struct ibv_tm_caps {
        pub max_rndv_hdr_size: u32,
        pub max_num_tags: u32,
        pub flags: u32,
        pub max_ops: u32,
        pub max_sge: u32,
    }
    /// `struct ibv_cq_moderation_caps`.
    @c("struct ibv_cq_moderation_caps", "")
    pub struct ibv_cq_moderation_caps {
        pub max_cq_count: u16,
        pub max_cq_period: u16,
    }
    /// `struct ibv_pci_atomic_caps`.
    @c("struct ibv_pci_atomic_caps", "")
    pub struct ibv_pci_atomic_caps {
        pub fetch_add: u16,
        pub swap: u16,
        pub compare_swap: u16,
    }
    /// `struct ibv_device_attr_ex` (`ibv_query_device_ex`).
    @c("struct ibv_device_attr_ex", "")
    pub struct ibv_device_attr_ex {
        pub orig_attr: ibv_device_attr,
        pub comp_mask: u32,
        pub odp_caps: ibv_odp_caps,
        pub completion_timestamp_mask: u64,
        pub hca_core_clock: u64,
        pub device_cap_flags_ex: u64,
        pub tso_caps: ibv_tso_caps,
        pub rss_caps: ibv_rss_caps,
        pub max_wq_type_rq: u32,
        pub packet_pacing_caps: ibv_packet_pacing_caps,
        pub raw_packet_caps: u32,
        pub tm_caps: ibv_tm_caps,
        pub cq_mod_caps: ibv_cq_moderation_caps,
        pub max_dm_size: u64,
        pub pci_atomic_caps: ibv_pci_atomic_caps,
        pub xrc_odp_caps: u32,
        pub phys_port_cnt_ex: u32,
    }
    /// `struct ibv_port_attr` (`ibv_query_port`).
    @c("struct ibv_port_attr", "")
    pub struct ibv_port_attr {
        pub state: ibv_port_state,
        pub max_mtu: ibv_mtu,
        pub active_mtu: ibv_mtu,
        pub gid_tbl_len: c_int,
        pub port_cap_flags: u32,
        pub max_msg_sz: u32,
        pub bad_pkey_cntr: u32,
        pub qkey_viol_cntr: u32,
        pub pkey_tbl_len: u16,
        pub lid: u16,
        pub sm_lid: u16,
        pub lmc: u8,
        pub max_vl_num: u8,
        pub sm_sl: u8,
        pub subnet_timeout: u8,
        pub init_type_reply: u8,
        pub active_width: u8,
        pub active_speed: u8,
        pub phys_state: u8,
        pub link_layer: u8,
        pub flags: u8,
        pub port_cap_flags2: u16,
    }

    // ----- async events ------------------------------------------------------------------
    /// `struct ibv_async_event`.
    @c("struct ibv_async_event", "")
    pub struct ibv_async_event {
        pub element: ibv_async_event_element,
        pub event_type: ibv_event_type,
    }
    /// `ibv_async_event.element`: the object the event is about.
    @c("struct ibv_async_event", "element")
    pub union ibv_async_event_element {
        pub cq: *mut ibv_cq,
        pub qp: *mut ibv_qp,
        pub srq: *mut ibv_srq,
        pub wq: *mut ibv_wq,
        pub port_num: c_int,
    }

    // ----- work completions -------------------------------------------------------------
    /// `struct ibv_wc`.
    @c("struct ibv_wc", "")
    pub struct ibv_wc {
        pub wr_id: u64,
        pub status: ibv_wc_status,
        pub opcode: ibv_wc_opcode,
        pub vendor_err: u32,
        pub byte_len: u32,
        /// The anonymous union of `imm_data` (big-endian) and `invalidated_rkey`.
        pub u_imm_data: ibv_wc_imm,
        pub qp_num: u32,
        pub src_qp: u32,
        pub wc_flags: c_uint,
        pub pkey_index: u16,
        pub slid: u16,
        pub sl: u8,
        pub dlid_path_bits: u8,
    }
    /// The anonymous union of `struct ibv_wc`.
    @c("struct ibv_wc", "*")
    pub union ibv_wc_imm {
        /// Big-endian.
        pub imm_data: u32,
        pub invalidated_rkey: u32,
    }
    /// `struct ibv_wc_tm_info`.
    @c("struct ibv_wc_tm_info", "")
    pub struct ibv_wc_tm_info {
        pub tag: u64,
        pub r#priv: u32,
    }

    // ----- PD, MR, MW, TD, XRCD, DM -------------------------------------------------------
    /// `struct ibv_pd`.
    @c("struct ibv_pd", "")
    pub struct ibv_pd {
        pub context: *mut ibv_context,
        pub handle: u32,
    }
    /// `struct ibv_mr`.
    @c("struct ibv_mr", "")
    pub struct ibv_mr {
        pub context: *mut ibv_context,
        pub pd: *mut ibv_pd,
        pub addr: *mut c_void,
        pub length: usize,
        pub handle: u32,
        pub lkey: u32,
        pub rkey: u32,
    }
    /// `struct ibv_mw`.
    @c("struct ibv_mw", "")
    pub struct ibv_mw {
        pub context: *mut ibv_context,
        pub pd: *mut ibv_pd,
        pub rkey: u32,
        pub handle: u32,
        pub r#type: ibv_mw_type,
    }
    /// `struct ibv_mw_bind_info`.
    @c("struct ibv_mw_bind_info", "")
    pub struct ibv_mw_bind_info {
        pub mr: *mut ibv_mr,
        pub addr: u64,
        pub length: u64,
        pub mw_access_flags: c_uint,
    }
    /// `struct ibv_mw_bind`.
    @c("struct ibv_mw_bind", "")
    pub struct ibv_mw_bind {
        pub wr_id: u64,
        pub send_flags: c_uint,
        pub bind_info: ibv_mw_bind_info,
    }
    /// `struct ibv_td_init_attr`.
    @c("struct ibv_td_init_attr", "")
    pub struct ibv_td_init_attr {
        pub comp_mask: u32,
    }
    /// `struct ibv_td`.
    @c("struct ibv_td", "")
    pub struct ibv_td {
        pub context: *mut ibv_context,
    }
    /// `struct ibv_xrcd_init_attr`.
    @c("struct ibv_xrcd_init_attr", "")
    pub struct ibv_xrcd_init_attr {
        pub comp_mask: u32,
        pub fd: c_int,
        pub oflags: c_int,
    }
    /// `struct ibv_xrcd`.
    @c("struct ibv_xrcd", "")
    pub struct ibv_xrcd {
        pub context: *mut ibv_context,
    }
    /// `struct ibv_alloc_dm_attr`.
    @c("struct ibv_alloc_dm_attr", "")
    pub struct ibv_alloc_dm_attr {
        pub length: usize,
        pub log_align_req: u32,
        pub comp_mask: u32,
    }
    /// `struct ibv_dm`.
    @c("struct ibv_dm", "")
    pub struct ibv_dm {
        pub context: *mut ibv_context,
        pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int>,
        pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int>,
        pub comp_mask: u32,
        pub handle: u32,
    }
    /// `struct ibv_parent_domain_init_attr`.
    @c("struct ibv_parent_domain_init_attr", "")
    pub struct ibv_parent_domain_init_attr {
        pub pd: *mut ibv_pd,
        pub td: *mut ibv_td,
        pub comp_mask: u32,
        pub alloc: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void>,
        pub free: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64)>,
        pub pd_context: *mut c_void,
    }
    /// `struct ibv_counters_init_attr`.
    @c("struct ibv_counters_init_attr", "")
    pub struct ibv_counters_init_attr {
        pub comp_mask: u32,
    }
    /// `struct ibv_counters`.
    @c("struct ibv_counters", "")
    pub struct ibv_counters {
        pub context: *mut ibv_context,
    }
    /// `struct ibv_counter_attach_attr`.
    @c("struct ibv_counter_attach_attr", "")
    pub struct ibv_counter_attach_attr {
        pub counter_desc: ibv_counter_description,
        pub index: u32,
        pub comp_mask: u32,
    }
    /// `struct ibv_values_ex`.
    @c("struct ibv_values_ex", "")
    pub struct ibv_values_ex {
        pub comp_mask: u32,
        pub raw_clock: timespec,
    }

    // ----- address handles --------------------------------------------------------------
    /// `struct ibv_global_route`.
    @c("struct ibv_global_route", "")
    pub struct ibv_global_route {
        pub dgid: ibv_gid,
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
    }
    /// `struct ibv_grh`: the GRH in front of a UD receive buffer.
    @c("struct ibv_grh", "")
    pub struct ibv_grh {
        /// Big-endian.
        pub version_tclass_flow: u32,
        /// Big-endian.
        pub paylen: u16,
        pub next_hdr: u8,
        pub hop_limit: u8,
        pub sgid: ibv_gid,
        pub dgid: ibv_gid,
    }
    /// `struct ibv_ah_attr`.
    @c("struct ibv_ah_attr", "")
    pub struct ibv_ah_attr {
        pub grh: ibv_global_route,
        pub dlid: u16,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
    }
    /// `struct ibv_ah`.
    @c("struct ibv_ah", "")
    pub struct ibv_ah {
        pub context: *mut ibv_context,
        pub pd: *mut ibv_pd,
        pub handle: u32,
    }

    // ----- SRQs ---------------------------------------------------------------------
    /// `struct ibv_srq_attr`.
    @c("struct ibv_srq_attr", "")
    pub struct ibv_srq_attr {
        pub max_wr: u32,
        pub max_sge: u32,
        pub srq_limit: u32,
    }
    /// `struct ibv_srq_init_attr`.
    @c("struct ibv_srq_init_attr", "")
    pub struct ibv_srq_init_attr {
        pub srq_context: *mut c_void,
        pub attr: ibv_srq_attr,
    }
    /// `struct ibv_tm_cap`.
    @c("struct ibv_tm_cap", "")
    pub struct ibv_tm_cap {
        pub max_num_tags: u32,
        pub max_ops: u32,
    }
    /// `struct ibv_srq_init_attr_ex`.
    @c("struct ibv_srq_init_attr_ex", "")
    pub struct ibv_srq_init_attr_ex {
        pub srq_context: *mut c_void,
        pub attr: ibv_srq_attr,
        pub comp_mask: u32,
        pub srq_type: ibv_srq_type,
        pub pd: *mut ibv_pd,
        pub xrcd: *mut ibv_xrcd,
        pub cq: *mut ibv_cq,
        pub tm_cap: ibv_tm_cap,
    }
    /// `struct ibv_srq`.
    @c("struct ibv_srq", "")
    pub struct ibv_srq {
        pub context: *mut ibv_context,
        pub srq_context: *mut c_void,
        pub pd: *mut ibv_pd,
        pub handle: u32,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub events_completed: u32,
    }
    /// `struct ibv_ops_wr` (tag matching; never accepted here).
    @c("struct ibv_ops_wr", "")
    pub struct ibv_ops_wr {
        pub wr_id: u64,
        pub next: *mut ibv_ops_wr,
        pub opcode: ibv_ops_wr_opcode,
        pub flags: c_int,
        pub tm: ibv_ops_wr_tm,
    }
    /// `ibv_ops_wr.tm`.
    @c("struct ibv_ops_wr", "tm")
    pub struct ibv_ops_wr_tm {
        pub unexpected_cnt: u32,
        pub handle: u32,
        pub add: ibv_ops_wr_tm_add,
    }
    /// `ibv_ops_wr.tm.add`.
    @c("struct ibv_ops_wr", "tm.add")
    pub struct ibv_ops_wr_tm_add {
        pub recv_wr_id: u64,
        pub sg_list: *mut ibv_sge,
        pub num_sge: c_int,
        pub tag: u64,
        pub mask: u64,
    }

    // ----- work queues (never created here) ----------------------------------------------
    /// `struct ibv_wq`.
    @c("struct ibv_wq", "")
    pub struct ibv_wq {
        pub context: *mut ibv_context,
        pub wq_context: *mut c_void,
        pub pd: *mut ibv_pd,
        pub cq: *mut ibv_cq,
        pub wq_num: u32,
        pub handle: u32,
        pub state: ibv_wq_state,
        pub wq_type: ibv_wq_type,
        pub post_recv: Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub events_completed: u32,
        pub comp_mask: u32,
    }
    /// `struct ibv_wq_init_attr`.
    @c("struct ibv_wq_init_attr", "")
    pub struct ibv_wq_init_attr {
        pub wq_context: *mut c_void,
        pub wq_type: ibv_wq_type,
        pub max_wr: u32,
        pub max_sge: u32,
        pub pd: *mut ibv_pd,
        pub cq: *mut ibv_cq,
        pub comp_mask: u32,
        pub create_flags: u32,
    }
    /// `struct ibv_wq_attr`.
    @c("struct ibv_wq_attr", "")
    pub struct ibv_wq_attr {
        pub attr_mask: u32,
        pub wq_state: ibv_wq_state,
        pub curr_wq_state: ibv_wq_state,
        pub flags: u32,
        pub flags_mask: u32,
    }
    /// `struct ibv_rwq_ind_table`.
    @c("struct ibv_rwq_ind_table", "")
    pub struct ibv_rwq_ind_table {
        pub context: *mut ibv_context,
        pub ind_tbl_handle: c_int,
        pub ind_tbl_num: c_int,
        pub comp_mask: u32,
    }
    /// `struct ibv_rwq_ind_table_init_attr`.
    @c("struct ibv_rwq_ind_table_init_attr", "")
    pub struct ibv_rwq_ind_table_init_attr {
        pub log_ind_tbl_size: u32,
        pub ind_tbl: *mut *mut ibv_wq,
        pub comp_mask: u32,
    }

    // ----- QPs -------------------------------------------------------------------------
    /// `struct ibv_qp_cap`.
    @c("struct ibv_qp_cap", "")
    pub struct ibv_qp_cap {
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
    }
    /// `struct ibv_qp_init_attr`.
    @c("struct ibv_qp_init_attr", "")
    pub struct ibv_qp_init_attr {
        pub qp_context: *mut c_void,
        pub send_cq: *mut ibv_cq,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub cap: ibv_qp_cap,
        pub qp_type: ibv_qp_type,
        pub sq_sig_all: c_int,
    }
    /// `struct ibv_rx_hash_conf`.
    @c("struct ibv_rx_hash_conf", "")
    pub struct ibv_rx_hash_conf {
        pub rx_hash_function: u8,
        pub rx_hash_key_len: u8,
        pub rx_hash_key: *mut u8,
        pub rx_hash_fields_mask: u64,
    }
    /// `struct ibv_qp_init_attr_ex`.
    @c("struct ibv_qp_init_attr_ex", "")
    pub struct ibv_qp_init_attr_ex {
        pub qp_context: *mut c_void,
        pub send_cq: *mut ibv_cq,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub cap: ibv_qp_cap,
        pub qp_type: ibv_qp_type,
        pub sq_sig_all: c_int,
        pub comp_mask: u32,
        pub pd: *mut ibv_pd,
        pub xrcd: *mut ibv_xrcd,
        pub create_flags: u32,
        pub max_tso_header: u16,
        pub rwq_ind_tbl: *mut ibv_rwq_ind_table,
        pub rx_hash_conf: ibv_rx_hash_conf,
        pub source_qpn: u32,
        pub send_ops_flags: u64,
    }
    /// `struct ibv_qp_open_attr`.
    @c("struct ibv_qp_open_attr", "")
    pub struct ibv_qp_open_attr {
        pub comp_mask: u32,
        pub qp_num: u32,
        pub xrcd: *mut ibv_xrcd,
        pub qp_context: *mut c_void,
        pub qp_type: ibv_qp_type,
    }
    /// `struct ibv_qp_attr`.
    @c("struct ibv_qp_attr", "")
    pub struct ibv_qp_attr {
        pub qp_state: ibv_qp_state,
        pub cur_qp_state: ibv_qp_state,
        pub path_mtu: ibv_mtu,
        pub path_mig_state: ibv_mig_state,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: c_uint,
        pub cap: ibv_qp_cap,
        pub ah_attr: ibv_ah_attr,
        pub alt_ah_attr: ibv_ah_attr,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub en_sqd_async_notify: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub rate_limit: u32,
    }
    /// `struct ibv_qp_rate_limit_attr`.
    @c("struct ibv_qp_rate_limit_attr", "")
    pub struct ibv_qp_rate_limit_attr {
        pub rate_limit: u32,
        pub max_burst_sz: u32,
        pub typical_pkt_sz: u16,
        pub comp_mask: u32,
    }
    /// `struct ibv_ece`.
    @c("struct ibv_ece", "")
    pub struct ibv_ece {
        pub vendor_id: u32,
        pub options: u32,
        pub comp_mask: u32,
    }
    /// `struct ibv_qp`.
    @c("struct ibv_qp", "")
    pub struct ibv_qp {
        pub context: *mut ibv_context,
        pub qp_context: *mut c_void,
        pub pd: *mut ibv_pd,
        pub send_cq: *mut ibv_cq,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub handle: u32,
        pub qp_num: u32,
        pub state: ibv_qp_state,
        pub qp_type: ibv_qp_type,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub events_completed: u32,
    }
    /// `struct ibv_qp_ex`: the QP with the new post-send API (`ibv_wr_*` call these).
    @c("struct ibv_qp_ex", "")
    pub struct ibv_qp_ex {
        pub qp_base: ibv_qp,
        pub comp_mask: u64,
        pub wr_id: u64,
        /// `enum ibv_send_flags`.
        pub wr_flags: c_uint,
        pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
        pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
        pub wr_bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
        pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        /// The last argument is big-endian immediate data.
        pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        /// The argument is big-endian immediate data.
        pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
        pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
        pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
        pub wr_set_inline_data_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
        pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
        pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
        pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    }

    // ----- work requests ----------------------------------------------------------------
    /// `struct ibv_data_buf`.
    @c("struct ibv_data_buf", "")
    pub struct ibv_data_buf {
        pub addr: *mut c_void,
        pub length: usize,
    }
    /// `struct ibv_sge`.
    @c("struct ibv_sge", "")
    pub struct ibv_sge {
        pub addr: u64,
        pub length: u32,
        pub lkey: u32,
    }
    /// `struct ibv_send_wr`.
    @c("struct ibv_send_wr", "")
    pub struct ibv_send_wr {
        pub wr_id: u64,
        pub next: *mut ibv_send_wr,
        pub sg_list: *mut ibv_sge,
        pub num_sge: c_int,
        pub opcode: ibv_wr_opcode,
        pub send_flags: c_uint,
        /// The anonymous union of `imm_data` (big-endian) and `invalidate_rkey`.
        pub u_imm_data: ibv_send_wr_imm,
        pub wr: ibv_send_wr_wr,
        pub qp_type: ibv_send_wr_qp_type,
        /// The anonymous union of `bind_mw` and `tso`.
        pub u_bind_mw: ibv_send_wr_bind_mw_tso,
    }
    /// The first anonymous union of `struct ibv_send_wr`.
    @c("struct ibv_send_wr", "*")
    pub union ibv_send_wr_imm {
        /// Big-endian.
        pub imm_data: u32,
        pub invalidate_rkey: u32,
    }
    /// `ibv_send_wr.wr`.
    @c("struct ibv_send_wr", "wr")
    pub union ibv_send_wr_wr {
        pub rdma: ibv_send_wr_rdma,
        pub atomic: ibv_send_wr_atomic,
        pub ud: ibv_send_wr_ud,
    }
    /// `ibv_send_wr.wr.rdma`.
    @c("struct ibv_send_wr", "wr.rdma")
    pub struct ibv_send_wr_rdma {
        pub remote_addr: u64,
        pub rkey: u32,
    }
    /// `ibv_send_wr.wr.atomic`.
    @c("struct ibv_send_wr", "wr.atomic")
    pub struct ibv_send_wr_atomic {
        pub remote_addr: u64,
        pub compare_add: u64,
        pub swap: u64,
        pub rkey: u32,
    }
    /// `ibv_send_wr.wr.ud`.
    @c("struct ibv_send_wr", "wr.ud")
    pub struct ibv_send_wr_ud {
        pub ah: *mut ibv_ah,
        pub remote_qpn: u32,
        pub remote_qkey: u32,
    }
    /// `ibv_send_wr.qp_type`.
    @c("struct ibv_send_wr", "qp_type")
    pub union ibv_send_wr_qp_type {
        pub xrc: ibv_send_wr_xrc,
    }
    /// `ibv_send_wr.qp_type.xrc`.
    @c("struct ibv_send_wr", "qp_type.xrc")
    pub struct ibv_send_wr_xrc {
        pub remote_srqn: u32,
    }
    /// The last anonymous union of `struct ibv_send_wr`.
    @c("struct ibv_send_wr", "*")
    pub union ibv_send_wr_bind_mw_tso {
        pub bind_mw: ibv_send_wr_bind_mw,
        pub tso: ibv_send_wr_tso,
    }
    /// `ibv_send_wr.bind_mw`.
    @c("struct ibv_send_wr", "bind_mw")
    pub struct ibv_send_wr_bind_mw {
        pub mw: *mut ibv_mw,
        pub rkey: u32,
        pub bind_info: ibv_mw_bind_info,
    }
    /// `ibv_send_wr.tso`.
    @c("struct ibv_send_wr", "tso")
    pub struct ibv_send_wr_tso {
        pub hdr: *mut c_void,
        pub hdr_sz: u16,
        pub mss: u16,
    }
    /// `struct ibv_recv_wr`.
    @c("struct ibv_recv_wr", "")
    pub struct ibv_recv_wr {
        pub wr_id: u64,
        pub next: *mut ibv_recv_wr,
        pub sg_list: *mut ibv_sge,
        pub num_sge: c_int,
    }

    // ----- completion channels and CQs -------------------------------------------------
    /// `struct ibv_comp_channel`.
    @c("struct ibv_comp_channel", "")
    pub struct ibv_comp_channel {
        pub context: *mut ibv_context,
        pub fd: c_int,
        pub refcnt: c_int,
    }
    /// `struct ibv_cq`.
    @c("struct ibv_cq", "")
    pub struct ibv_cq {
        pub context: *mut ibv_context,
        pub channel: *mut ibv_comp_channel,
        pub cq_context: *mut c_void,
        pub handle: u32,
        pub cqe: c_int,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub comp_events_completed: u32,
        pub async_events_completed: u32,
    }
    /// `struct ibv_poll_cq_attr`.
    @c("struct ibv_poll_cq_attr", "")
    pub struct ibv_poll_cq_attr {
        pub comp_mask: u32,
    }
    /// `struct ibv_cq_ex`: a CQ polled with `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`
    /// and read with `ibv_wc_read_*`. Its first fields are `struct ibv_cq`'s
    /// (`ibv_cq_ex_to_cq` is a cast).
    @c("struct ibv_cq_ex", "")
    pub struct ibv_cq_ex {
        pub context: *mut ibv_context,
        pub channel: *mut ibv_comp_channel,
        pub cq_context: *mut c_void,
        pub handle: u32,
        pub cqe: c_int,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub comp_events_completed: u32,
        pub async_events_completed: u32,
        pub comp_mask: u32,
        pub status: ibv_wc_status,
        pub wr_id: u64,
        pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
        pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
        pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
        pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> ibv_wc_opcode>,
        pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        /// Returns big-endian immediate data.
        pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
        pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
        pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
        pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
        pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
        pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
        pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    }
    /// `struct ibv_cq_init_attr_ex` (`ibv_create_cq_ex`).
    @c("struct ibv_cq_init_attr_ex", "")
    pub struct ibv_cq_init_attr_ex {
        pub cqe: u32,
        pub cq_context: *mut c_void,
        pub channel: *mut ibv_comp_channel,
        pub comp_vector: u32,
        /// `enum ibv_create_cq_wc_flags`.
        pub wc_flags: u64,
        pub comp_mask: u32,
        pub flags: u32,
        pub parent_domain: *mut ibv_pd,
    }
    /// `struct ibv_moderate_cq`.
    @c("struct ibv_moderate_cq", "")
    pub struct ibv_moderate_cq {
        pub cq_count: u16,
        pub cq_period: u16,
    }
    /// `struct ibv_modify_cq_attr`.
    @c("struct ibv_modify_cq_attr", "")
    pub struct ibv_modify_cq_attr {
        pub attr_mask: u32,
        pub moderate: ibv_moderate_cq,
    }

    // ----- kernel structs of the provider helpers (`ibv_copy_*_kern`) ---------------------
    /// `struct ib_uverbs_global_route` (`<rdma/ib_user_verbs.h>`).
    @c("struct ib_uverbs_global_route", "")
    pub struct ib_uverbs_global_route {
        pub dgid: [u8; 16],
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub reserved: u8,
    }
    /// `struct ib_uverbs_ah_attr` (`<rdma/ib_user_verbs.h>`).
    @c("struct ib_uverbs_ah_attr", "")
    pub struct ib_uverbs_ah_attr {
        pub grh: ib_uverbs_global_route,
        pub dlid: u16,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
        pub reserved: u8,
    }
    /// `struct ib_uverbs_qp_attr` (`<rdma/ib_user_verbs.h>`).
    @c("struct ib_uverbs_qp_attr", "")
    pub struct ib_uverbs_qp_attr {
        pub qp_attr_mask: u32,
        pub qp_state: u32,
        pub cur_qp_state: u32,
        pub path_mtu: u32,
        pub path_mig_state: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: u32,
        pub ah_attr: ib_uverbs_ah_attr,
        pub alt_ah_attr: ib_uverbs_ah_attr,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub en_sqd_async_notify: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub reserved: [u8; 5],
    }
    /// `struct ib_user_path_rec` (`<rdma/ib_user_sa.h>`).
    @c("struct ib_user_path_rec", "")
    pub struct ib_user_path_rec {
        pub dgid: [u8; 16],
        pub sgid: [u8; 16],
        /// Big-endian.
        pub dlid: u16,
        /// Big-endian.
        pub slid: u16,
        pub raw_traffic: u32,
        /// Big-endian.
        pub flow_label: u32,
        pub reversible: u32,
        pub mtu: u32,
        /// Big-endian.
        pub pkey: u16,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub numb_path: u8,
        pub sl: u8,
        pub mtu_selector: u8,
        pub rate_selector: u8,
        pub rate: u8,
        pub packet_life_time_selector: u8,
        pub packet_life_time: u8,
        pub preference: u8,
    }
    /// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
    @c("struct ibv_sa_path_rec", "")
    pub struct ibv_sa_path_rec {
        pub dgid: ibv_gid,
        pub sgid: ibv_gid,
        /// Big-endian.
        pub dlid: u16,
        /// Big-endian.
        pub slid: u16,
        pub raw_traffic: c_int,
        /// Big-endian.
        pub flow_label: u32,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub reversible: c_int,
        pub numb_path: u8,
        /// Big-endian.
        pub pkey: u16,
        pub sl: u8,
        pub mtu_selector: u8,
        pub mtu: u8,
        pub rate_selector: u8,
        pub rate: u8,
        pub packet_life_time_selector: u8,
        pub packet_life_time: u8,
        pub preference: u8,
    }

    // ----- the context ------------------------------------------------------------------
    /// `struct ibv_context_ops`: the table verbs.h's inline `ibv_post_send`,
    /// `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq` (and
    /// `ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`) call through.
    @c("struct ibv_context_ops", "")
    pub struct ibv_context_ops {
        pub _compat_query_device: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
        pub _compat_query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int>,
        pub _compat_alloc_pd: Option<compat_fn>,
        pub _compat_dealloc_pd: Option<compat_fn>,
        pub _compat_reg_mr: Option<compat_fn>,
        pub _compat_rereg_mr: Option<compat_fn>,
        pub _compat_dereg_mr: Option<compat_fn>,
        pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, ibv_mw_type) -> *mut ibv_mw>,
        pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
        pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
        pub _compat_create_cq: Option<compat_fn>,
        pub poll_cq: Option<poll_cq_fn>,
        pub req_notify_cq: Option<req_notify_cq_fn>,
        pub _compat_cq_event: Option<compat_fn>,
        pub _compat_resize_cq: Option<compat_fn>,
        pub _compat_destroy_cq: Option<compat_fn>,
        pub _compat_create_srq: Option<compat_fn>,
        pub _compat_modify_srq: Option<compat_fn>,
        pub _compat_query_srq: Option<compat_fn>,
        pub _compat_destroy_srq: Option<compat_fn>,
        pub post_srq_recv: Option<post_srq_recv_fn>,
        pub _compat_create_qp: Option<compat_fn>,
        pub _compat_query_qp: Option<compat_fn>,
        pub _compat_modify_qp: Option<compat_fn>,
        pub _compat_destroy_qp: Option<compat_fn>,
        pub post_send: Option<post_send_fn>,
        pub post_recv: Option<post_recv_fn>,
        pub _compat_create_ah: Option<compat_fn>,
        pub _compat_destroy_ah: Option<compat_fn>,
        pub _compat_attach_mcast: Option<compat_fn>,
        pub _compat_detach_mcast: Option<compat_fn>,
        pub _compat_async_event: Option<compat_fn>,
    }
    /// `struct ibv_context`: what `ibv_open_device` returns.
    @c("struct ibv_context", "")
    pub struct ibv_context {
        pub device: *mut ibv_device,
        pub ops: ibv_context_ops,
        pub cmd_fd: c_int,
        pub async_fd: c_int,
        pub num_comp_vectors: c_int,
        pub mutex: pthread_mutex_t,
        /// [`VERBS_ABI_IS_EXTENDED`]: the context sits at the end of a `verbs_context`.
        pub abi_compat: *mut c_void,
    }
    /// `struct verbs_context`: the extended function table in front of the
    /// `ibv_context` (verbs.h's inline `ibv_query_port`, `ibv_query_device_ex`,
    /// `ibv_create_cq_ex`, `ibv_create_qp_ex`, ... find it at a negative offset from the
    /// context, check `sz` and the slot, and return EOPNOTSUPP for a NULL slot).
    @c("struct verbs_context", "")
    pub struct verbs_context {
        pub query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
        /// The advice is `enum ib_uverbs_advise_mr_advice`.
        pub advise_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int>,
        pub alloc_null_mr: Option<unsafe extern "C" fn(*mut ibv_pd) -> *mut ibv_mr>,
        pub read_counters: Option<unsafe extern "C" fn(*mut ibv_counters, *mut u64, u32, u32) -> c_int>,
        pub attach_counters_point_flow: Option<unsafe extern "C" fn(*mut ibv_counters, *mut ibv_counter_attach_attr, *mut ibv_flow) -> c_int>,
        pub create_counters: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_counters_init_attr) -> *mut ibv_counters>,
        pub destroy_counters: Option<unsafe extern "C" fn(*mut ibv_counters) -> c_int>,
        pub reg_dm_mr: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr>,
        pub alloc_dm: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm>,
        pub free_dm: Option<unsafe extern "C" fn(*mut ibv_dm) -> c_int>,
        pub modify_flow_action_esp: Option<unsafe extern "C" fn(*mut ibv_flow_action, *mut ibv_flow_action_esp_attr) -> c_int>,
        pub destroy_flow_action: Option<unsafe extern "C" fn(*mut ibv_flow_action) -> c_int>,
        pub create_flow_action_esp: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_flow_action_esp_attr) -> *mut ibv_flow_action>,
        pub modify_qp_rate_limit: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_rate_limit_attr) -> c_int>,
        pub alloc_parent_domain: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd>,
        pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
        pub alloc_td: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
        pub modify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, *mut ibv_modify_cq_attr) -> c_int>,
        pub post_srq_ops: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_ops_wr, *mut *mut ibv_ops_wr) -> c_int>,
        pub destroy_rwq_ind_table: Option<unsafe extern "C" fn(*mut ibv_rwq_ind_table) -> c_int>,
        pub create_rwq_ind_table: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_rwq_ind_table_init_attr) -> *mut ibv_rwq_ind_table>,
        pub destroy_wq: Option<unsafe extern "C" fn(*mut ibv_wq) -> c_int>,
        pub modify_wq: Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_wq_attr) -> c_int>,
        pub create_wq: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_wq_init_attr) -> *mut ibv_wq>,
        pub query_rt_values: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int>,
        pub create_cq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
        pub r#priv: *mut verbs_ex_private,
        pub query_device_ex: Option<unsafe extern "C" fn(*mut ibv_context, *const ibv_query_device_ex_input, *mut ibv_device_attr_ex, usize) -> c_int>,
        pub ibv_destroy_flow: Option<unsafe extern "C" fn(*mut ibv_flow) -> c_int>,
        pub ABI_placeholder2: Option<unsafe extern "C" fn()>,
        pub ibv_create_flow: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_flow_attr) -> *mut ibv_flow>,
        pub ABI_placeholder1: Option<unsafe extern "C" fn()>,
        pub open_qp: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp>,
        pub create_qp_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
        pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
        pub create_srq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
        pub open_xrcd: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd>,
        pub close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
        pub _ABI_placeholder3: u64,
        /// `sizeof(struct verbs_context)`: the inline wrappers check a slot is inside.
        pub sz: usize,
        /// The context programs see; must be the last field.
        pub context: ibv_context,
    }
}

abi_consts! {
    ibv_gid_type: u32 {
        IBV_GID_TYPE_IB = 0,
        IBV_GID_TYPE_ROCE_V1 = 1,
        IBV_GID_TYPE_ROCE_V2 = 2,
    }
    ibv_node_type: i32 {
        IBV_NODE_UNKNOWN = -1,
        IBV_NODE_CA = 1,
        IBV_NODE_SWITCH = 2,
        IBV_NODE_ROUTER = 3,
        IBV_NODE_RNIC = 4,
        IBV_NODE_USNIC = 5,
        IBV_NODE_USNIC_UDP = 6,
        IBV_NODE_UNSPECIFIED = 7,
    }
    ibv_transport_type: i32 {
        IBV_TRANSPORT_UNKNOWN = -1,
        IBV_TRANSPORT_IB = 0,
        IBV_TRANSPORT_IWARP = 1,
        IBV_TRANSPORT_USNIC = 2,
        IBV_TRANSPORT_USNIC_UDP = 3,
        IBV_TRANSPORT_UNSPECIFIED = 4,
    }
    ibv_device_cap_flags: u32 {
        IBV_DEVICE_RESIZE_MAX_WR = 1,
        IBV_DEVICE_BAD_PKEY_CNTR = 1 << 1,
        IBV_DEVICE_BAD_QKEY_CNTR = 1 << 2,
        IBV_DEVICE_RAW_MULTI = 1 << 3,
        IBV_DEVICE_AUTO_PATH_MIG = 1 << 4,
        IBV_DEVICE_CHANGE_PHY_PORT = 1 << 5,
        IBV_DEVICE_UD_AV_PORT_ENFORCE = 1 << 6,
        IBV_DEVICE_CURR_QP_STATE_MOD = 1 << 7,
        IBV_DEVICE_SHUTDOWN_PORT = 1 << 8,
        IBV_DEVICE_INIT_TYPE = 1 << 9,
        IBV_DEVICE_PORT_ACTIVE_EVENT = 1 << 10,
        IBV_DEVICE_SYS_IMAGE_GUID = 1 << 11,
        IBV_DEVICE_RC_RNR_NAK_GEN = 1 << 12,
        IBV_DEVICE_SRQ_RESIZE = 1 << 13,
        IBV_DEVICE_N_NOTIFY_CQ = 1 << 14,
        IBV_DEVICE_MEM_WINDOW = 1 << 17,
        IBV_DEVICE_UD_IP_CSUM = 1 << 18,
        IBV_DEVICE_XRC = 1 << 20,
        IBV_DEVICE_MEM_MGT_EXTENSIONS = 1 << 21,
        IBV_DEVICE_MEM_WINDOW_TYPE_2A = 1 << 23,
        IBV_DEVICE_MEM_WINDOW_TYPE_2B = 1 << 24,
        IBV_DEVICE_RC_IP_CSUM = 1 << 25,
        IBV_DEVICE_RAW_IP_CSUM = 1 << 26,
        IBV_DEVICE_MANAGED_FLOW_STEERING = 1 << 29,
    }
    ibv_fork_status: u32 {
        IBV_FORK_DISABLED = 0,
        IBV_FORK_ENABLED = 1,
        IBV_FORK_UNNEEDED = 2,
    }
    ibv_atomic_cap: u32 {
        IBV_ATOMIC_NONE = 0,
        IBV_ATOMIC_HCA = 1,
        IBV_ATOMIC_GLOB = 2,
    }
    ibv_odp_transport_cap_bits: u32 {
        IBV_ODP_SUPPORT_SEND = 1 << 0,
        IBV_ODP_SUPPORT_RECV = 1 << 1,
        IBV_ODP_SUPPORT_WRITE = 1 << 2,
        IBV_ODP_SUPPORT_READ = 1 << 3,
        IBV_ODP_SUPPORT_ATOMIC = 1 << 4,
        IBV_ODP_SUPPORT_SRQ_RECV = 1 << 5,
    }
    ibv_odp_general_caps: u32 {
        IBV_ODP_SUPPORT = 1 << 0,
        IBV_ODP_SUPPORT_IMPLICIT = 1 << 1,
    }
    ibv_mtu: u32 {
        IBV_MTU_256 = 1,
        IBV_MTU_512 = 2,
        IBV_MTU_1024 = 3,
        IBV_MTU_2048 = 4,
        IBV_MTU_4096 = 5,
    }
    ibv_port_state: u32 {
        IBV_PORT_NOP = 0,
        IBV_PORT_DOWN = 1,
        IBV_PORT_INIT = 2,
        IBV_PORT_ARMED = 3,
        IBV_PORT_ACTIVE = 4,
        IBV_PORT_ACTIVE_DEFER = 5,
    }
    /// The anonymous enum of link layers (`ibv_port_attr::link_layer`).
    ANON: u8 {
        IBV_LINK_LAYER_UNSPECIFIED = 0,
        IBV_LINK_LAYER_INFINIBAND = 1,
        IBV_LINK_LAYER_ETHERNET = 2,
    }
    ibv_port_cap_flags: u32 {
        IBV_PORT_SM = 1 << 1,
        IBV_PORT_NOTICE_SUP = 1 << 2,
        IBV_PORT_TRAP_SUP = 1 << 3,
        IBV_PORT_OPT_IPD_SUP = 1 << 4,
        IBV_PORT_AUTO_MIGR_SUP = 1 << 5,
        IBV_PORT_SL_MAP_SUP = 1 << 6,
        IBV_PORT_MKEY_NVRAM = 1 << 7,
        IBV_PORT_PKEY_NVRAM = 1 << 8,
        IBV_PORT_LED_INFO_SUP = 1 << 9,
        IBV_PORT_SYS_IMAGE_GUID_SUP = 1 << 11,
        IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP = 1 << 12,
        IBV_PORT_EXTENDED_SPEEDS_SUP = 1 << 14,
        IBV_PORT_CAP_MASK2_SUP = 1 << 15,
        IBV_PORT_CM_SUP = 1 << 16,
        IBV_PORT_SNMP_TUNNEL_SUP = 1 << 17,
        IBV_PORT_REINIT_SUP = 1 << 18,
        IBV_PORT_DEVICE_MGMT_SUP = 1 << 19,
        IBV_PORT_VENDOR_CLASS_SUP = 1 << 20,
        IBV_PORT_DR_NOTICE_SUP = 1 << 21,
        IBV_PORT_CAP_MASK_NOTICE_SUP = 1 << 22,
        IBV_PORT_BOOT_MGMT_SUP = 1 << 23,
        IBV_PORT_LINK_LATENCY_SUP = 1 << 24,
        IBV_PORT_CLIENT_REG_SUP = 1 << 25,
        IBV_PORT_IP_BASED_GIDS = 1 << 26,
    }
    ibv_event_type: u32 {
        IBV_EVENT_CQ_ERR = 0,
        IBV_EVENT_QP_FATAL = 1,
        IBV_EVENT_QP_REQ_ERR = 2,
        IBV_EVENT_QP_ACCESS_ERR = 3,
        IBV_EVENT_COMM_EST = 4,
        IBV_EVENT_SQ_DRAINED = 5,
        IBV_EVENT_PATH_MIG = 6,
        IBV_EVENT_PATH_MIG_ERR = 7,
        IBV_EVENT_DEVICE_FATAL = 8,
        IBV_EVENT_PORT_ACTIVE = 9,
        IBV_EVENT_PORT_ERR = 10,
        IBV_EVENT_LID_CHANGE = 11,
        IBV_EVENT_PKEY_CHANGE = 12,
        IBV_EVENT_SM_CHANGE = 13,
        IBV_EVENT_SRQ_ERR = 14,
        IBV_EVENT_SRQ_LIMIT_REACHED = 15,
        IBV_EVENT_QP_LAST_WQE_REACHED = 16,
        IBV_EVENT_CLIENT_REREGISTER = 17,
        IBV_EVENT_GID_CHANGE = 18,
        IBV_EVENT_WQ_FATAL = 19,
    }
    ibv_wc_status: u32 {
        IBV_WC_SUCCESS = 0,
        IBV_WC_LOC_LEN_ERR = 1,
        IBV_WC_LOC_QP_OP_ERR = 2,
        IBV_WC_LOC_EEC_OP_ERR = 3,
        IBV_WC_LOC_PROT_ERR = 4,
        IBV_WC_WR_FLUSH_ERR = 5,
        IBV_WC_MW_BIND_ERR = 6,
        IBV_WC_BAD_RESP_ERR = 7,
        IBV_WC_LOC_ACCESS_ERR = 8,
        IBV_WC_REM_INV_REQ_ERR = 9,
        IBV_WC_REM_ACCESS_ERR = 10,
        IBV_WC_REM_OP_ERR = 11,
        IBV_WC_RETRY_EXC_ERR = 12,
        IBV_WC_RNR_RETRY_EXC_ERR = 13,
        IBV_WC_LOC_RDD_VIOL_ERR = 14,
        IBV_WC_REM_INV_RD_REQ_ERR = 15,
        IBV_WC_REM_ABORT_ERR = 16,
        IBV_WC_INV_EECN_ERR = 17,
        IBV_WC_INV_EEC_STATE_ERR = 18,
        IBV_WC_FATAL_ERR = 19,
        IBV_WC_RESP_TIMEOUT_ERR = 20,
        IBV_WC_GENERAL_ERR = 21,
        IBV_WC_TM_ERR = 22,
        IBV_WC_TM_RNDV_INCOMPLETE = 23,
    }
    ibv_wc_opcode: u32 {
        IBV_WC_SEND = 0,
        IBV_WC_RDMA_WRITE = 1,
        IBV_WC_RDMA_READ = 2,
        IBV_WC_COMP_SWAP = 3,
        IBV_WC_FETCH_ADD = 4,
        IBV_WC_BIND_MW = 5,
        IBV_WC_LOCAL_INV = 6,
        IBV_WC_TSO = 7,
        IBV_WC_ATOMIC_WRITE = 9,
        IBV_WC_RECV = 1 << 7,
        IBV_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
        IBV_WC_TM_ADD = (1 << 7) + 2,
        IBV_WC_TM_DEL = (1 << 7) + 3,
        IBV_WC_TM_SYNC = (1 << 7) + 4,
        IBV_WC_TM_RECV = (1 << 7) + 5,
        IBV_WC_TM_NO_TAG = (1 << 7) + 6,
        IBV_WC_DRIVER1 = (1 << 7) + 7,
        IBV_WC_DRIVER2 = (1 << 7) + 8,
        IBV_WC_DRIVER3 = (1 << 7) + 9,
    }
    /// The anonymous enum holding `IBV_WC_IP_CSUM_OK_SHIFT`.
    ANON: u32 {
        IBV_WC_IP_CSUM_OK_SHIFT = 2,
    }
    ibv_create_cq_wc_flags: u64 {
        IBV_WC_EX_WITH_BYTE_LEN = 1 << 0,
        IBV_WC_EX_WITH_IMM = 1 << 1,
        IBV_WC_EX_WITH_QP_NUM = 1 << 2,
        IBV_WC_EX_WITH_SRC_QP = 1 << 3,
        IBV_WC_EX_WITH_SLID = 1 << 4,
        IBV_WC_EX_WITH_SL = 1 << 5,
        IBV_WC_EX_WITH_DLID_PATH_BITS = 1 << 6,
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 1 << 7,
        IBV_WC_EX_WITH_CVLAN = 1 << 8,
        IBV_WC_EX_WITH_FLOW_TAG = 1 << 9,
        IBV_WC_EX_WITH_TM_INFO = 1 << 10,
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK = 1 << 11,
    }
    /// The anonymous enums of `ibv_create_cq_wc_flags` sets.
    ANON: u64 {
        IBV_WC_STANDARD_FLAGS = 0x7f,
        IBV_CREATE_CQ_SUP_WC_FLAGS = 0xfff,
    }
    ibv_wc_flags: u32 {
        IBV_WC_GRH = 1 << 0,
        IBV_WC_WITH_IMM = 1 << 1,
        IBV_WC_IP_CSUM_OK = 1 << 2,
        IBV_WC_WITH_INV = 1 << 3,
        IBV_WC_TM_SYNC_REQ = 1 << 4,
        IBV_WC_TM_MATCH = 1 << 5,
        IBV_WC_TM_DATA_VALID = 1 << 6,
    }
    ibv_access_flags: u32 {
        IBV_ACCESS_LOCAL_WRITE = 1,
        IBV_ACCESS_REMOTE_WRITE = 1 << 1,
        IBV_ACCESS_REMOTE_READ = 1 << 2,
        IBV_ACCESS_REMOTE_ATOMIC = 1 << 3,
        IBV_ACCESS_MW_BIND = 1 << 4,
        IBV_ACCESS_ZERO_BASED = 1 << 5,
        IBV_ACCESS_ON_DEMAND = 1 << 6,
        IBV_ACCESS_HUGETLB = 1 << 7,
        IBV_ACCESS_RELAXED_ORDERING = 1 << 20,
    }
    /// `IBV_ACCESS_OPTIONAL_*` (verbs_api.h): access bits a provider may ignore.
    ANON: u32 {
        IBV_ACCESS_OPTIONAL_FIRST = 1 << 20,
        IBV_ACCESS_OPTIONAL_RANGE = 0x3ff0_0000,
    }
    ibv_rereg_mr_flags: u32 {
        IBV_REREG_MR_CHANGE_TRANSLATION = 1 << 0,
        IBV_REREG_MR_CHANGE_PD = 1 << 1,
        IBV_REREG_MR_CHANGE_ACCESS = 1 << 2,
        IBV_REREG_MR_FLAGS_SUPPORTED = (1 << 3) - 1,
    }
    ibv_rereg_mr_err_code: i32 {
        IBV_REREG_MR_ERR_INPUT = -1,
        IBV_REREG_MR_ERR_DONT_FORK_NEW = -2,
        IBV_REREG_MR_ERR_DO_FORK_OLD = -3,
        IBV_REREG_MR_ERR_CMD = -4,
        IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW = -5,
    }
    ibv_mw_type: u32 {
        IBV_MW_TYPE_1 = 1,
        IBV_MW_TYPE_2 = 2,
    }
    ibv_rate: u32 {
        IBV_RATE_MAX = 0,
        IBV_RATE_2_5_GBPS = 2,
        IBV_RATE_5_GBPS = 5,
        IBV_RATE_10_GBPS = 3,
        IBV_RATE_20_GBPS = 6,
        IBV_RATE_30_GBPS = 4,
        IBV_RATE_40_GBPS = 7,
        IBV_RATE_60_GBPS = 8,
        IBV_RATE_80_GBPS = 9,
        IBV_RATE_120_GBPS = 10,
        IBV_RATE_14_GBPS = 11,
        IBV_RATE_56_GBPS = 12,
        IBV_RATE_112_GBPS = 13,
        IBV_RATE_168_GBPS = 14,
        IBV_RATE_25_GBPS = 15,
        IBV_RATE_100_GBPS = 16,
        IBV_RATE_200_GBPS = 17,
        IBV_RATE_300_GBPS = 18,
        IBV_RATE_28_GBPS = 19,
        IBV_RATE_50_GBPS = 20,
        IBV_RATE_400_GBPS = 21,
        IBV_RATE_600_GBPS = 22,
        IBV_RATE_800_GBPS = 23,
        IBV_RATE_1200_GBPS = 24,
    }
    ibv_srq_attr_mask: u32 {
        IBV_SRQ_MAX_WR = 1 << 0,
        IBV_SRQ_LIMIT = 1 << 1,
    }
    ibv_srq_type: u32 {
        IBV_SRQT_BASIC = 0,
        IBV_SRQT_XRC = 1,
        IBV_SRQT_TM = 2,
    }
    ibv_srq_init_attr_mask: u32 {
        IBV_SRQ_INIT_ATTR_TYPE = 1 << 0,
        IBV_SRQ_INIT_ATTR_PD = 1 << 1,
        IBV_SRQ_INIT_ATTR_XRCD = 1 << 2,
        IBV_SRQ_INIT_ATTR_CQ = 1 << 3,
        IBV_SRQ_INIT_ATTR_TM = 1 << 4,
        IBV_SRQ_INIT_ATTR_RESERVED = 1 << 5,
    }
    ibv_wq_type: u32 {
        IBV_WQT_RQ = 0,
    }
    ibv_wq_state: u32 {
        IBV_WQS_RESET = 0,
        IBV_WQS_RDY = 1,
        IBV_WQS_ERR = 2,
        IBV_WQS_UNKNOWN = 3,
    }
    ibv_qp_type: u32 {
        IBV_QPT_RC = 2,
        IBV_QPT_UC = 3,
        IBV_QPT_UD = 4,
        IBV_QPT_RAW_PACKET = 8,
        IBV_QPT_XRC_SEND = 9,
        IBV_QPT_XRC_RECV = 10,
        IBV_QPT_DRIVER = 0xff,
    }
    ibv_qp_init_attr_mask: u32 {
        IBV_QP_INIT_ATTR_PD = 1 << 0,
        IBV_QP_INIT_ATTR_XRCD = 1 << 1,
        IBV_QP_INIT_ATTR_CREATE_FLAGS = 1 << 2,
        IBV_QP_INIT_ATTR_MAX_TSO_HEADER = 1 << 3,
        IBV_QP_INIT_ATTR_IND_TABLE = 1 << 4,
        IBV_QP_INIT_ATTR_RX_HASH = 1 << 5,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 1 << 6,
    }
    ibv_qp_create_flags: u32 {
        IBV_QP_CREATE_BLOCK_SELF_MCAST_LB = 1 << 1,
        IBV_QP_CREATE_SCATTER_FCS = 1 << 8,
        IBV_QP_CREATE_CVLAN_STRIPPING = 1 << 9,
        IBV_QP_CREATE_SOURCE_QPN = 1 << 10,
        IBV_QP_CREATE_PCI_WRITE_END_PADDING = 1 << 11,
    }
    ibv_qp_create_send_ops_flags: u64 {
        IBV_QP_EX_WITH_RDMA_WRITE = 1 << 0,
        IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = 1 << 1,
        IBV_QP_EX_WITH_SEND = 1 << 2,
        IBV_QP_EX_WITH_SEND_WITH_IMM = 1 << 3,
        IBV_QP_EX_WITH_RDMA_READ = 1 << 4,
        IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = 1 << 5,
        IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = 1 << 6,
        IBV_QP_EX_WITH_LOCAL_INV = 1 << 7,
        IBV_QP_EX_WITH_BIND_MW = 1 << 8,
        IBV_QP_EX_WITH_SEND_WITH_INV = 1 << 9,
        IBV_QP_EX_WITH_TSO = 1 << 10,
        IBV_QP_EX_WITH_ATOMIC_WRITE = 1 << 12,
    }
    ibv_qp_open_attr_mask: u32 {
        IBV_QP_OPEN_ATTR_NUM = 1 << 0,
        IBV_QP_OPEN_ATTR_XRCD = 1 << 1,
        IBV_QP_OPEN_ATTR_CONTEXT = 1 << 2,
        IBV_QP_OPEN_ATTR_TYPE = 1 << 3,
        IBV_QP_OPEN_ATTR_RESERVED = 1 << 4,
    }
    ibv_qp_attr_mask: u32 {
        IBV_QP_STATE = 1 << 0,
        IBV_QP_CUR_STATE = 1 << 1,
        IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2,
        IBV_QP_ACCESS_FLAGS = 1 << 3,
        IBV_QP_PKEY_INDEX = 1 << 4,
        IBV_QP_PORT = 1 << 5,
        IBV_QP_QKEY = 1 << 6,
        IBV_QP_AV = 1 << 7,
        IBV_QP_PATH_MTU = 1 << 8,
        IBV_QP_TIMEOUT = 1 << 9,
        IBV_QP_RETRY_CNT = 1 << 10,
        IBV_QP_RNR_RETRY = 1 << 11,
        IBV_QP_RQ_PSN = 1 << 12,
        IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
        IBV_QP_ALT_PATH = 1 << 14,
        IBV_QP_MIN_RNR_TIMER = 1 << 15,
        IBV_QP_SQ_PSN = 1 << 16,
        IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
        IBV_QP_PATH_MIG_STATE = 1 << 18,
        IBV_QP_CAP = 1 << 19,
        IBV_QP_DEST_QPN = 1 << 20,
        IBV_QP_RATE_LIMIT = 1 << 25,
    }
    ibv_qp_state: u32 {
        IBV_QPS_RESET = 0,
        IBV_QPS_INIT = 1,
        IBV_QPS_RTR = 2,
        IBV_QPS_RTS = 3,
        IBV_QPS_SQD = 4,
        IBV_QPS_SQE = 5,
        IBV_QPS_ERR = 6,
        IBV_QPS_UNKNOWN = 7,
    }
    ibv_mig_state: u32 {
        IBV_MIG_MIGRATED = 0,
        IBV_MIG_REARM = 1,
        IBV_MIG_ARMED = 2,
    }
    ibv_wr_opcode: u32 {
        IBV_WR_RDMA_WRITE = 0,
        IBV_WR_RDMA_WRITE_WITH_IMM = 1,
        IBV_WR_SEND = 2,
        IBV_WR_SEND_WITH_IMM = 3,
        IBV_WR_RDMA_READ = 4,
        IBV_WR_ATOMIC_CMP_AND_SWP = 5,
        IBV_WR_ATOMIC_FETCH_AND_ADD = 6,
        IBV_WR_LOCAL_INV = 7,
        IBV_WR_BIND_MW = 8,
        IBV_WR_SEND_WITH_INV = 9,
        IBV_WR_TSO = 10,
        IBV_WR_DRIVER1 = 11,
        IBV_WR_ATOMIC_WRITE = 15,
    }
    ibv_send_flags: u32 {
        IBV_SEND_FENCE = 1 << 0,
        IBV_SEND_SIGNALED = 1 << 1,
        IBV_SEND_SOLICITED = 1 << 2,
        IBV_SEND_INLINE = 1 << 3,
        IBV_SEND_IP_CSUM = 1 << 4,
    }
    ibv_ops_wr_opcode: u32 {
        IBV_WR_TAG_ADD = 0,
        IBV_WR_TAG_DEL = 1,
        IBV_WR_TAG_SYNC = 2,
    }
    ibv_ops_flags: u32 {
        IBV_OPS_SIGNALED = 1 << 0,
        IBV_OPS_TM_SYNC = 1 << 1,
    }
    ibv_cq_attr_mask: u32 {
        IBV_CQ_ATTR_MODERATE = 1 << 0,
        IBV_CQ_ATTR_RESERVED = 1 << 1,
    }
    ibv_cq_init_attr_mask: u32 {
        IBV_CQ_INIT_ATTR_MASK_FLAGS = 1 << 0,
        IBV_CQ_INIT_ATTR_MASK_PD = 1 << 1,
    }
    ibv_create_cq_attr_flags: u32 {
        IBV_CREATE_CQ_ATTR_SINGLE_THREADED = 1 << 0,
        IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN = 1 << 1,
    }
    ibv_counter_description: u32 {
        IBV_COUNTER_PACKETS = 0,
        IBV_COUNTER_BYTES = 1,
    }
    ibv_raw_packet_caps: u32 {
        IBV_RAW_PACKET_CAP_CVLAN_STRIPPING = 1 << 0,
        IBV_RAW_PACKET_CAP_SCATTER_FCS = 1 << 1,
        IBV_RAW_PACKET_CAP_IP_CSUM = 1 << 2,
        IBV_RAW_PACKET_CAP_DELAY_DROP = 1 << 3,
    }
    ibv_tm_cap_flags: u32 {
        IBV_TM_CAP_RC = 1 << 0,
    }
    ibv_pci_atomic_op_size: u32 {
        IBV_PCI_ATOMIC_OPERATION_4_BYTE_SIZE_SUP = 1 << 0,
        IBV_PCI_ATOMIC_OPERATION_8_BYTE_SIZE_SUP = 1 << 1,
        IBV_PCI_ATOMIC_OPERATION_16_BYTE_SIZE_SUP = 1 << 2,
    }
}

/// `enum ibv_gid_type_sysfs` (rdma-core's driver.h; what `ibv_query_gid_type` writes).
pub type ibv_gid_type_sysfs = u32;
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1`: an IB or RoCE v1 GID.
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: ibv_gid_type_sysfs = 0;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`: a RoCE v2 GID.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: ibv_gid_type_sysfs = 1;
