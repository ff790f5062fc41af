//! Temporary stubs.
#![allow(missing_docs)]
#![allow(unsafe_code)]
symver!(
    "rdma_destroy_id" @ "RDMACM_1.0",
    "rdma_get_remote_ece" @ "RDMACM_1.3",
    "rdma_leave_multicast" @ "RDMACM_1.0",
    "rdma_get_src_port" @ "RDMACM_1.0",
    "rdma_get_cm_event" @ "RDMACM_1.0",
    "rdma_join_multicast" @ "RDMACM_1.0",
    "rdma_destroy_qp" @ "RDMACM_1.0",
    "rdma_init_qp_attr" @ "RDMACM_1.2",
    "rdma_destroy_ep" @ "RDMACM_1.0",
    "rdma_bind_addr" @ "RDMACM_1.0",
    "rdma_freeaddrinfo" @ "RDMACM_1.0",
    "rdma_disconnect" @ "RDMACM_1.0",
    "rdma_join_multicast_ex" @ "RDMACM_1.1",
    "rdma_resolve_addr" @ "RDMACM_1.0",
    "rdma_reject" @ "RDMACM_1.0",
    "rdma_create_srq" @ "RDMACM_1.0",
    "rdma_create_srq_ex" @ "RDMACM_1.0",
    "rdma_create_id" @ "RDMACM_1.0",
    "rdma_set_local_ece" @ "RDMACM_1.3",
    "rdma_get_dst_port" @ "RDMACM_1.0",
    "rdma_reject_ece" @ "RDMACM_1.3",
    "rdma_notify" @ "RDMACM_1.0",
    "rdma_event_str" @ "RDMACM_1.0",
    "rdma_destroy_event_channel" @ "RDMACM_1.0",
    "rdma_create_qp" @ "RDMACM_1.0",
    "rdma_getaddrinfo" @ "RDMACM_1.0",
    "rdma_get_request" @ "RDMACM_1.0",
    "rdma_ack_cm_event" @ "RDMACM_1.0",
    "rdma_resolve_route" @ "RDMACM_1.0",
    "rdma_create_ep" @ "RDMACM_1.0",
    "rdma_get_devices" @ "RDMACM_1.0",
    "rdma_listen" @ "RDMACM_1.0",
    "rdma_set_option" @ "RDMACM_1.0",
    "rdma_destroy_srq" @ "RDMACM_1.0",
    "rdma_connect" @ "RDMACM_1.0",
    "rdma_accept" @ "RDMACM_1.0",
    "rdma_free_devices" @ "RDMACM_1.0",
    "rdma_create_event_channel" @ "RDMACM_1.0",
    "rdma_establish" @ "RDMACM_1.2",
    "rdma_migrate_id" @ "RDMACM_1.0",
    "rdma_create_qp_ex" @ "RDMACM_1.0",
);
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_destroy_id() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_get_remote_ece() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_leave_multicast() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_get_src_port() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_get_cm_event() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_join_multicast() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_destroy_qp() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_init_qp_attr() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_destroy_ep() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_bind_addr() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_freeaddrinfo() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_disconnect() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_join_multicast_ex() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_resolve_addr() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_reject() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_srq() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_srq_ex() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_id() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_set_local_ece() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_get_dst_port() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_reject_ece() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_notify() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_event_str() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_destroy_event_channel() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_qp() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_getaddrinfo() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_get_request() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_ack_cm_event() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_resolve_route() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_ep() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_get_devices() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_listen() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_set_option() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_destroy_srq() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_connect() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_accept() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_free_devices() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_event_channel() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_establish() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_migrate_id() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_qp_ex() -> i32 {
    crate::ffi::set_errno(libc::ENOSYS);
    -1
}
