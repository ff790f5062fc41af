//! The C ABI of rdma-core 44's `<rdma/rdma_cma.h>`: every struct, union and constant the
//! drop-in librdmacm reads or writes, laid out as the header lays them out (x86_64 /
//! aarch64 Linux, LP64). The conventions are `crate::abi`'s (anonymous members become
//! fields named after their first member with a `u_` prefix); the layout test
//! (`rdmacm::abi::tests`) measures every type and constant against the installed header.
//!
//! `<rdma/rdma_verbs.h>` adds only static inline functions over `ibv_*` calls
//! (`rdma_post_send`, `rdma_reg_msgs`, `rdma_get_send_comp`, ...): nothing to declare or
//! export here.

#![forbid(unsafe_code)]
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use crate::abi::{ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp};
use crate::abi::{ibv_qp_type, ibv_sa_path_rec, ibv_srq};
use core::ffi::{c_char, c_int, c_void};
use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

abi_types! {
    /// `struct rdma_ib_addr`: the GIDs and P_Key of a route.
    @c("struct rdma_ib_addr", "")
    pub struct rdma_ib_addr {
        pub sgid: ibv_gid,
        pub dgid: ibv_gid,
        /// Big-endian.
        pub pkey: u16,
    }
    /// The anonymous source address union of `struct rdma_addr`.
    @c("struct rdma_addr", "*")
    pub union rdma_addr_u_src_addr {
        pub src_addr: sockaddr,
        pub src_sin: sockaddr_in,
        pub src_sin6: sockaddr_in6,
        pub src_storage: sockaddr_storage,
    }
    /// The anonymous destination address union of `struct rdma_addr`.
    @c("struct rdma_addr", "*")
    pub union rdma_addr_u_dst_addr {
        pub dst_addr: sockaddr,
        pub dst_sin: sockaddr_in,
        pub dst_sin6: sockaddr_in6,
        pub dst_storage: sockaddr_storage,
    }
    /// `rdma_addr::addr`.
    @c("struct rdma_addr", "addr")
    pub union rdma_addr_addr {
        pub ibaddr: rdma_ib_addr,
    }
    /// `struct rdma_addr`: the source and destination of an id.
    @c("struct rdma_addr", "")
    pub struct rdma_addr {
        pub u_src_addr: rdma_addr_u_src_addr,
        pub u_dst_addr: rdma_addr_u_dst_addr,
        pub addr: rdma_addr_addr,
    }
    /// `struct rdma_route`.
    @c("struct rdma_route", "")
    pub struct rdma_route {
        pub addr: rdma_addr,
        pub path_rec: *mut ibv_sa_path_rec,
        pub num_paths: c_int,
    }
    /// `struct rdma_event_channel`.
    @c("struct rdma_event_channel", "")
    pub struct rdma_event_channel {
        pub fd: c_int,
    }
    /// `struct rdma_cm_id`.
    @c("struct rdma_cm_id", "")
    pub struct rdma_cm_id {
        pub verbs: *mut ibv_context,
        pub channel: *mut rdma_event_channel,
        pub context: *mut c_void,
        pub qp: *mut ibv_qp,
        pub route: rdma_route,
        pub ps: rdma_port_space,
        pub port_num: u8,
        pub event: *mut rdma_cm_event,
        pub send_cq_channel: *mut ibv_comp_channel,
        pub send_cq: *mut ibv_cq,
        pub recv_cq_channel: *mut ibv_comp_channel,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub pd: *mut ibv_pd,
        pub qp_type: ibv_qp_type,
    }
    /// `struct rdma_conn_param`.
    @c("struct rdma_conn_param", "")
    pub struct rdma_conn_param {
        pub private_data: *const c_void,
        pub private_data_len: u8,
        pub responder_resources: u8,
        pub initiator_depth: u8,
        pub flow_control: u8,
        pub retry_count: u8,
        pub rnr_retry_count: u8,
        pub srq: u8,
        pub qp_num: u32,
    }
    /// `struct rdma_ud_param`.
    @c("struct rdma_ud_param", "")
    pub struct rdma_ud_param {
        pub private_data: *const c_void,
        pub private_data_len: u8,
        pub ah_attr: ibv_ah_attr,
        pub qp_num: u32,
        pub qkey: u32,
    }
    /// `rdma_cm_event::param`.
    @c("struct rdma_cm_event", "param")
    pub union rdma_cm_event_param {
        pub conn: rdma_conn_param,
        pub ud: rdma_ud_param,
    }
    /// `struct rdma_cm_event`.
    @c("struct rdma_cm_event", "")
    pub struct rdma_cm_event {
        pub id: *mut rdma_cm_id,
        pub listen_id: *mut rdma_cm_id,
        pub event: rdma_cm_event_type,
        pub status: c_int,
        pub param: rdma_cm_event_param,
    }
    /// `struct rdma_addrinfo`.
    @c("struct rdma_addrinfo", "")
    pub struct rdma_addrinfo {
        pub ai_flags: c_int,
        pub ai_family: c_int,
        pub ai_qp_type: c_int,
        pub ai_port_space: c_int,
        pub ai_src_len: socklen_t,
        pub ai_dst_len: socklen_t,
        pub ai_src_addr: *mut sockaddr,
        pub ai_dst_addr: *mut sockaddr,
        pub ai_src_canonname: *mut c_char,
        pub ai_dst_canonname: *mut c_char,
        pub ai_route_len: usize,
        pub ai_route: *mut c_void,
        pub ai_connect_len: usize,
        pub ai_connect: *mut c_void,
        pub ai_next: *mut rdma_addrinfo,
    }
    /// `struct rdma_cm_join_mc_attr_ex`.
    @c("struct rdma_cm_join_mc_attr_ex", "")
    pub struct rdma_cm_join_mc_attr_ex {
        pub comp_mask: u32,
        pub join_flags: u32,
        pub addr: *mut sockaddr,
    }
}

abi_consts! {
    rdma_cm_event_type: u32 {
        RDMA_CM_EVENT_ADDR_RESOLVED = 0,
        RDMA_CM_EVENT_ADDR_ERROR = 1,
        RDMA_CM_EVENT_ROUTE_RESOLVED = 2,
        RDMA_CM_EVENT_ROUTE_ERROR = 3,
        RDMA_CM_EVENT_CONNECT_REQUEST = 4,
        RDMA_CM_EVENT_CONNECT_RESPONSE = 5,
        RDMA_CM_EVENT_CONNECT_ERROR = 6,
        RDMA_CM_EVENT_UNREACHABLE = 7,
        RDMA_CM_EVENT_REJECTED = 8,
        RDMA_CM_EVENT_ESTABLISHED = 9,
        RDMA_CM_EVENT_DISCONNECTED = 10,
        RDMA_CM_EVENT_DEVICE_REMOVAL = 11,
        RDMA_CM_EVENT_MULTICAST_JOIN = 12,
        RDMA_CM_EVENT_MULTICAST_ERROR = 13,
        RDMA_CM_EVENT_ADDR_CHANGE = 14,
        RDMA_CM_EVENT_TIMEWAIT_EXIT = 15,
    }
    rdma_port_space: u32 {
        RDMA_PS_IPOIB = 0x0002,
        RDMA_PS_TCP = 0x0106,
        RDMA_PS_UDP = 0x0111,
        RDMA_PS_IB = 0x013f,
    }
    ANON: u64 {
        RDMA_IB_IP_PS_MASK = 0xffff_ffff_ffff_0000,
        RDMA_IB_IP_PORT_MASK = 0x0000_0000_0000_ffff,
        RDMA_IB_IP_PS_TCP = 0x0000_0000_0106_0000,
        RDMA_IB_IP_PS_UDP = 0x0000_0000_0111_0000,
        RDMA_IB_PS_IB = 0x0000_0000_013f_0000,
    }
    ANON: u32 {
        RDMA_UDP_QKEY = 0x0123_4567,
    }
    ANON: u8 {
        RDMA_MAX_RESP_RES = 0xff,
        RDMA_MAX_INIT_DEPTH = 0xff,
    }
    ANON: c_int {
        RAI_PASSIVE = 0x1,
        RAI_NUMERICHOST = 0x2,
        RAI_NOROUTE = 0x4,
        RAI_FAMILY = 0x8,
    }
    rdma_cm_join_mc_attr_mask: u32 {
        RDMA_CM_JOIN_MC_ATTR_ADDRESS = 1,
        RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS = 1 << 1,
        RDMA_CM_JOIN_MC_ATTR_RESERVED = 1 << 2,
    }
    rdma_cm_mc_join_flags: u32 {
        RDMA_MC_JOIN_FLAG_FULLMEMBER = 0,
        RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER = 1,
        RDMA_MC_JOIN_FLAG_RESERVED = 2,
    }
    ANON: c_int {
        RDMA_OPTION_ID = 0,
        RDMA_OPTION_IB = 1,
    }
    ANON: c_int {
        RDMA_OPTION_ID_TOS = 0,
        RDMA_OPTION_ID_REUSEADDR = 1,
        RDMA_OPTION_ID_AFONLY = 2,
        RDMA_OPTION_ID_ACK_TIMEOUT = 3,
    }
    ANON: c_int {
        RDMA_OPTION_IB_PATH = 1,
    }
}

#[cfg(test)]
mod tests {
    use super::{CONSTS, TYPE_LAYOUTS};

    /// Every type and constant here against the installed `<rdma/rdma_cma.h>`.
    #[test]
    fn every_type_and_constant_matches_rdma_cma_h() {
        crate::abi::tests::check_layouts(
            "/usr/include/rdma/rdma_cma.h",
            "librdmacm-dev",
            &["rdma/rdma_cma.h", "rdma/rdma_verbs.h"],
            TYPE_LAYOUTS,
            CONSTS,
        );
    }

    /// Every struct and union written here goes through `abi_types!` (so it is measured).
    #[test]
    fn no_type_escapes_the_layout_test() {
        crate::abi::tests::check_declared(include_str!("abi.rs"), TYPE_LAYOUTS);
    }
}
