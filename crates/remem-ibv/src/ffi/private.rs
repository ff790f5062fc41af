//! rdma-core's provider-internal symbols (`IBVERBS_PRIVATE_34`): the `ibv_cmd_*` kernel
//! commands, `verbs_*` context plumbing and `execute_ioctl` that provider libraries call.
//!
//! Programs do not call these, but some link provider libraries directly — perftest needs
//! `libmlx5.so.1` and `libefa.so.1` (for `mlx5dv_*`, `efadv_*`), which reference them, and
//! binaries built with `-z now` resolve every reference at start-up: without these
//! symbols such a program does not start. Here there is no kernel and no provider, so:
//!
//! - `verbs_register_driver_34` (called by each provider library's constructor when it is
//!   loaded), `verbs_set_ops`, `verbs_init_cq`, `verbs_uninit_context`, `__verbs_log` do
//!   nothing;
//! - the `ibv_cmd_*` commands and `execute_ioctl` return EOPNOTSUPP (`ibv_cmd_poll_cq`
//!   -1), the functions returning a pointer NULL with errno EOPNOTSUPP; each says on
//!   stderr that it was reached (only a provider's own objects lead there, and this
//!   library makes none);
//! - `verbs_allow_disassociate_destroy` is a `bool` variable, false.
//!
//! (`ibv_query_gid_type`, the one private symbol programs call, is with the queries.)
//!
//! `__verbs_log` and `ibv_read_ibdev_sysfs_file` are variadic in C; the stubs take only
//! the fixed arguments, which a variadic call passes the same way (x86_64 and aarch64
//! Linux), and read none of the others.

use crate::ffi::{null_with, set_errno};
use core::ffi::{c_int, c_uint, c_void};

/// Says that a provider-internal function was reached.
fn reached(name: &str) {
    eprintln!(
        "remem-ibv: {name} (rdma-core provider-internal) called; the drop-in has no kernel \
         providers: failing it"
    );
}

symver!(
    "__ioctl_final_num_attrs" @ "IBVERBS_PRIVATE_34",
    "__verbs_log" @ "IBVERBS_PRIVATE_34",
    "_verbs_init_and_alloc_context" @ "IBVERBS_PRIVATE_34",
    "execute_ioctl" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_advise_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_alloc_dm" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_alloc_mw" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_alloc_pd" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_attach_mcast" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_close_xrcd" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_ah" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_counters" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_cq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_cq_ex" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_flow" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_flow_action_esp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_qp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_qp_ex" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_qp_ex2" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_rwq_ind_table" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_srq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_srq_ex" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_create_wq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_dealloc_mw" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_dealloc_pd" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_dereg_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_ah" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_counters" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_cq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_flow" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_flow_action" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_qp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_rwq_ind_table" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_srq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_destroy_wq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_detach_mcast" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_free_dm" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_get_context" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_modify_cq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_modify_flow_action_esp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_modify_qp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_modify_qp_ex" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_modify_srq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_modify_wq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_open_qp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_open_xrcd" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_poll_cq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_post_recv" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_post_send" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_post_srq_recv" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_query_context" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_query_device_any" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_query_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_query_port" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_query_qp" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_query_srq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_read_counters" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_reg_dm_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_reg_dmabuf_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_reg_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_req_notify_cq" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_rereg_mr" @ "IBVERBS_PRIVATE_34",
    "ibv_cmd_resize_cq" @ "IBVERBS_PRIVATE_34",
    "ibv_read_ibdev_sysfs_file" @ "IBVERBS_PRIVATE_34",
    "verbs_init_cq" @ "IBVERBS_PRIVATE_34",
    "verbs_open_device" @ "IBVERBS_PRIVATE_34",
    "verbs_register_driver_34" @ "IBVERBS_PRIVATE_34",
    "verbs_set_ops" @ "IBVERBS_PRIVATE_34",
    "verbs_uninit_context" @ "IBVERBS_PRIVATE_34",
);

/// `__ioctl_final_num_attrs(num_attrs, link)`: the number of attributes of a command
/// buffer chain; with no driver chain here, `num_attrs` itself.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv___ioctl_final_num_attrs(num_attrs: c_uint) -> c_uint {
    num_attrs
}

/// `__verbs_log`: nothing to do (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv___verbs_log() {}

/// `_verbs_init_and_alloc_context`: NULL with errno EOPNOTSUPP (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv__verbs_init_and_alloc_context() -> *mut c_void {
    reached("_verbs_init_and_alloc_context");
    null_with(libc::EOPNOTSUPP)
}

/// `execute_ioctl`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_execute_ioctl() -> c_int {
    reached("execute_ioctl");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_advise_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_advise_mr() -> c_int {
    reached("ibv_cmd_advise_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_alloc_dm`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_alloc_dm() -> c_int {
    reached("ibv_cmd_alloc_dm");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_alloc_mw`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_alloc_mw() -> c_int {
    reached("ibv_cmd_alloc_mw");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_alloc_pd`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_alloc_pd() -> c_int {
    reached("ibv_cmd_alloc_pd");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_attach_mcast`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_attach_mcast() -> c_int {
    reached("ibv_cmd_attach_mcast");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_close_xrcd`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_close_xrcd() -> c_int {
    reached("ibv_cmd_close_xrcd");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_ah`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_ah() -> c_int {
    reached("ibv_cmd_create_ah");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_counters`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_counters() -> c_int {
    reached("ibv_cmd_create_counters");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_cq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_cq() -> c_int {
    reached("ibv_cmd_create_cq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_cq_ex`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_cq_ex() -> c_int {
    reached("ibv_cmd_create_cq_ex");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_flow`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_flow() -> c_int {
    reached("ibv_cmd_create_flow");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_flow_action_esp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_flow_action_esp() -> c_int {
    reached("ibv_cmd_create_flow_action_esp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_qp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_qp() -> c_int {
    reached("ibv_cmd_create_qp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_qp_ex`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_qp_ex() -> c_int {
    reached("ibv_cmd_create_qp_ex");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_qp_ex2`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_qp_ex2() -> c_int {
    reached("ibv_cmd_create_qp_ex2");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_rwq_ind_table`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_rwq_ind_table() -> c_int {
    reached("ibv_cmd_create_rwq_ind_table");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_srq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_srq() -> c_int {
    reached("ibv_cmd_create_srq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_srq_ex`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_srq_ex() -> c_int {
    reached("ibv_cmd_create_srq_ex");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_create_wq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_create_wq() -> c_int {
    reached("ibv_cmd_create_wq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_dealloc_mw`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_dealloc_mw() -> c_int {
    reached("ibv_cmd_dealloc_mw");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_dealloc_pd`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_dealloc_pd() -> c_int {
    reached("ibv_cmd_dealloc_pd");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_dereg_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_dereg_mr() -> c_int {
    reached("ibv_cmd_dereg_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_ah`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_ah() -> c_int {
    reached("ibv_cmd_destroy_ah");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_counters`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_counters() -> c_int {
    reached("ibv_cmd_destroy_counters");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_cq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_cq() -> c_int {
    reached("ibv_cmd_destroy_cq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_flow`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_flow() -> c_int {
    reached("ibv_cmd_destroy_flow");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_flow_action`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_flow_action() -> c_int {
    reached("ibv_cmd_destroy_flow_action");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_qp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_qp() -> c_int {
    reached("ibv_cmd_destroy_qp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_rwq_ind_table`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_rwq_ind_table() -> c_int {
    reached("ibv_cmd_destroy_rwq_ind_table");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_srq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_srq() -> c_int {
    reached("ibv_cmd_destroy_srq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_destroy_wq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_destroy_wq() -> c_int {
    reached("ibv_cmd_destroy_wq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_detach_mcast`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_detach_mcast() -> c_int {
    reached("ibv_cmd_detach_mcast");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_free_dm`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_free_dm() -> c_int {
    reached("ibv_cmd_free_dm");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_get_context`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_get_context() -> c_int {
    reached("ibv_cmd_get_context");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_modify_cq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_modify_cq() -> c_int {
    reached("ibv_cmd_modify_cq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_modify_flow_action_esp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_modify_flow_action_esp() -> c_int {
    reached("ibv_cmd_modify_flow_action_esp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_modify_qp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_modify_qp() -> c_int {
    reached("ibv_cmd_modify_qp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_modify_qp_ex`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_modify_qp_ex() -> c_int {
    reached("ibv_cmd_modify_qp_ex");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_modify_srq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_modify_srq() -> c_int {
    reached("ibv_cmd_modify_srq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_modify_wq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_modify_wq() -> c_int {
    reached("ibv_cmd_modify_wq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_open_qp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_open_qp() -> c_int {
    reached("ibv_cmd_open_qp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_open_xrcd`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_open_xrcd() -> c_int {
    reached("ibv_cmd_open_xrcd");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_poll_cq`: -1 (an error; no kernel CQs here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_poll_cq() -> c_int {
    reached("ibv_cmd_poll_cq");
    -1
}

/// `ibv_cmd_post_recv`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_post_recv() -> c_int {
    reached("ibv_cmd_post_recv");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_post_send`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_post_send() -> c_int {
    reached("ibv_cmd_post_send");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_post_srq_recv`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_post_srq_recv() -> c_int {
    reached("ibv_cmd_post_srq_recv");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_query_context`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_query_context() -> c_int {
    reached("ibv_cmd_query_context");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_query_device_any`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_query_device_any() -> c_int {
    reached("ibv_cmd_query_device_any");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_query_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_query_mr() -> c_int {
    reached("ibv_cmd_query_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_query_port`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_query_port() -> c_int {
    reached("ibv_cmd_query_port");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_query_qp`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_query_qp() -> c_int {
    reached("ibv_cmd_query_qp");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_query_srq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_query_srq() -> c_int {
    reached("ibv_cmd_query_srq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_read_counters`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_read_counters() -> c_int {
    reached("ibv_cmd_read_counters");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_reg_dm_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_reg_dm_mr() -> c_int {
    reached("ibv_cmd_reg_dm_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_reg_dmabuf_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_reg_dmabuf_mr() -> c_int {
    reached("ibv_cmd_reg_dmabuf_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_reg_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_reg_mr() -> c_int {
    reached("ibv_cmd_reg_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_req_notify_cq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_req_notify_cq() -> c_int {
    reached("ibv_cmd_req_notify_cq");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_rereg_mr`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_rereg_mr() -> c_int {
    reached("ibv_cmd_rereg_mr");
    libc::EOPNOTSUPP
}

/// `ibv_cmd_resize_cq`: EOPNOTSUPP (no kernel commands here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_cmd_resize_cq() -> c_int {
    reached("ibv_cmd_resize_cq");
    libc::EOPNOTSUPP
}

/// `ibv_read_ibdev_sysfs_file`: -1 with errno ENOENT (the soft devices have no sysfs
/// directory).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// `verbs_init_cq`: nothing to do (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_verbs_init_cq() {}

/// `verbs_open_device`: NULL with errno EOPNOTSUPP (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_verbs_open_device() -> *mut c_void {
    reached("verbs_open_device");
    null_with(libc::EOPNOTSUPP)
}

/// `verbs_register_driver_34`: nothing to do (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_verbs_register_driver_34() {}

/// `verbs_set_ops`: nothing to do (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_verbs_set_ops() {}

/// `verbs_uninit_context`: nothing to do (no providers here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_verbs_uninit_context() {}

// `bool verbs_allow_disassociate_destroy` (false): a variable, so defined in assembly
// with its version (the trampolines of `symver!` are for functions).
#[cfg(not(test))]
::core::arch::global_asm!(
    ".pushsection .bss",
    ".globl __remem_ibv_d_verbs_allow_disassociate_destroy",
    concat!(
        ".type __remem_ibv_d_verbs_allow_disassociate_destroy, ",
        crate::object_type!()
    ),
    ".size __remem_ibv_d_verbs_allow_disassociate_destroy, 1",
    "__remem_ibv_d_verbs_allow_disassociate_destroy:",
    ".zero 1",
    ".symver __remem_ibv_d_verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34",
    ".popsection",
);

/// The data symbols this module exports, with their versions.
#[allow(dead_code)]
pub(crate) const DATA_SYMBOLS: &[(&str, &str)] =
    &[("verbs_allow_disassociate_destroy", "IBVERBS_PRIVATE_34")];
