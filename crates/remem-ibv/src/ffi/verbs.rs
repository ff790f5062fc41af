//! The C entry points of the verbs that are not objects' (helpers, queries, the device
//! list, contexts): each converts the program's pointers once and calls safe code in
//! [`crate::misc`], [`crate::query`], [`crate::device`] and [`crate::context`].

use super::null_with;
use super::{cstr, set_errno, slice_mut};
use crate::abi::*;
use crate::misc;
use core::ffi::{c_char, c_int, c_void};

symver!(
    "ibv_fork_init" @ "IBVERBS_1.1",
    "ibv_is_fork_initialized" @ "IBVERBS_1.13",
    "ibv_dontfork_range" @ "IBVERBS_1.1",
    "ibv_dofork_range" @ "IBVERBS_1.1",
    "ibv_wc_status_str" @ "IBVERBS_1.1",
    "ibv_event_type_str" @ "IBVERBS_1.1",
    "ibv_node_type_str" @ "IBVERBS_1.1",
    "ibv_port_state_str" @ "IBVERBS_1.1",
    "ibv_rate_to_mult" @ "IBVERBS_1.0",
    "mult_to_ibv_rate" @ "IBVERBS_1.0",
    "ibv_rate_to_mbps" @ "IBVERBS_1.1",
    "mbps_to_ibv_rate" @ "IBVERBS_1.1",
    "ibv_get_sysfs_path" @ "IBVERBS_1.0",
    "ibv_read_sysfs_file" @ "IBVERBS_1.0",
    "ibv_copy_qp_attr_from_kern" @ "IBVERBS_1.0",
    "ibv_copy_ah_attr_from_kern" @ "IBVERBS_1.1",
    "ibv_copy_path_rec_from_kern" @ "IBVERBS_1.0",
    "ibv_copy_path_rec_to_kern" @ "IBVERBS_1.0",
    "ibv_import_dm" @ "IBVERBS_1.13",
    "ibv_unimport_dm" @ "IBVERBS_1.13",
);

// ----- helpers (crate::misc) -----------------------------------------------------------------

/// `ibv_fork_init`: nothing to prepare (no memory is pinned; a forked child sees the
/// parent's registered memory copy-on-write like any other memory). Returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (fork needs no preparation here).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing to do; 0.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_dofork_range`: nothing to do; 0.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_wc_status_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    misc::wc_status_str(status).as_ptr()
}

/// `ibv_event_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    misc::event_type_str(event).as_ptr()
}

/// `ibv_node_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_node_type_str(node_type: ibv_node_type) -> *const c_char {
    misc::node_type_str(node_type).as_ptr()
}

/// `ibv_port_state_str`.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_port_state_str(state: ibv_port_state) -> *const c_char {
    misc::port_state_str(state).as_ptr()
}

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s; -1 if it is not one.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    misc::rate_to_mult(rate)
}

/// `mult_to_ibv_rate`: the rate of a multiple of 2.5 Gb/s; `IBV_RATE_MAX` if none.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    misc::mult_to_rate(mult)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s; -1 if unknown.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    misc::rate_to_mbps(rate)
}

/// `mbps_to_ibv_rate`: the rate of exactly `mbps`; `IBV_RATE_MAX` if none.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    misc::mbps_to_rate(mbps)
}

/// `ibv_get_sysfs_path`: `/sys` (the soft devices have no sysfs entries).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated, a trailing
/// newline removed); the length read, or -1 with errno set.
///
/// # Safety
///
/// `dir` and `file` are NULL or NUL-terminated strings; `buf` is NULL or writable for
/// `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    // SAFETY: by the contract.
    let (dir, file, buf) = unsafe { (cstr(dir), cstr(file), slice_mut(buf.cast::<u8>(), size)) };
    match (dir, file, buf) {
        (Some(dir), Some(file), Some(buf)) if size > 0 => {
            match misc::read_sysfs_file(dir, file, buf) {
                Ok(n) => n as c_int,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        }
        _ => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

/// `ibv_copy_qp_attr_from_kern`: copies a kernel `struct ib_uverbs_qp_attr` into an
/// `ibv_qp_attr` (a helper for providers and rdma_cm). Nothing for a NULL argument.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *mut ib_uverbs_qp_attr,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract; read_unaligned copes with any caller alignment.
        unsafe { dst.write_unaligned(misc::qp_attr_from_kern(&src.read_unaligned())) };
    }
}

/// `ibv_copy_ah_attr_from_kern`: copies a kernel `struct ib_uverbs_ah_attr`.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *mut ib_uverbs_ah_attr,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract.
        unsafe { dst.write_unaligned(misc::ah_attr_from_kern(&src.read_unaligned())) };
    }
}

/// `ibv_copy_path_rec_from_kern`: copies a kernel `struct ib_user_path_rec` into an
/// `ibv_sa_path_rec`.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *mut ib_user_path_rec,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract.
        unsafe { dst.write_unaligned(misc::path_rec_from_kern(&src.read_unaligned())) };
    }
}

/// `ibv_copy_path_rec_to_kern`: copies an `ibv_sa_path_rec` into a kernel
/// `struct ib_user_path_rec`.
///
/// # Safety
///
/// `dst` is NULL or writable, `src` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *mut ibv_sa_path_rec,
) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: valid by the contract.
        unsafe { dst.write_unaligned(misc::path_rec_to_kern(&src.read_unaligned())) };
    }
}

/// `ibv_import_dm`: no device memory here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_dm(
    context: *mut ibv_context,
    dm_handle: u32,
) -> *mut ibv_dm {
    let _ = (context, dm_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_dm`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_dm(dm: *mut ibv_dm) {
    let _ = dm;
}
