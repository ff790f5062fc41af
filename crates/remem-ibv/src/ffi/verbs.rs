//! The C entry points of the verbs that are not objects' (helpers, queries, the device
//! list, contexts): each converts the program's pointers once and calls safe code in
//! [`crate::misc`], [`crate::query`], [`crate::device`] and [`crate::context`].

use super::handles::{ctx_free, ctx_from};
use super::{
    cstr, guard_int, guard_neg, guard_ptr, null_with, opt_ref, out, set_errno, slice_mut, zeroed,
};
use crate::abi::*;
use crate::context::Ctx;
use crate::{device, misc, query};
use core::ffi::{c_char, c_int, c_uint, c_void};

symver!(
    "ibv_get_device_list" @ "IBVERBS_1.1",
    "ibv_free_device_list" @ "IBVERBS_1.1",
    "ibv_get_device_name" @ "IBVERBS_1.1",
    "ibv_get_device_guid" @ "IBVERBS_1.1",
    "ibv_get_device_index" @ "IBVERBS_1.9",
    "ibv_open_device" @ "IBVERBS_1.1",
    "ibv_close_device" @ "IBVERBS_1.1",
    "ibv_import_device" @ "IBVERBS_1.10",
    "ibv_query_device" @ "IBVERBS_1.1",
    "ibv_query_port" @ "IBVERBS_1.1",
    "ibv_query_gid" @ "IBVERBS_1.1",
    "_ibv_query_gid_ex" @ "IBVERBS_1.11",
    "_ibv_query_gid_table" @ "IBVERBS_1.11",
    "ibv_query_pkey" @ "IBVERBS_1.1",
    "ibv_get_pkey_index" @ "IBVERBS_1.5",
    "ibv_query_gid_type" @ "IBVERBS_PRIVATE_34",
    "ibv_resolve_eth_l2_from_gid" @ "IBVERBS_1.1",
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

// ----- queries (crate::query) -------------------------------------------------------------------

/// The context of a query: EINVAL for NULL.
///
/// # Safety
///
/// `context` is NULL or open, for `'a`.
unsafe fn ctx<'a>(context: *mut ibv_context) -> Result<&'a Ctx, c_int> {
    // SAFETY: by the contract.
    unsafe { ctx_from(context) }.ok_or(libc::EINVAL)
}

/// Copies `value` into `dst`, at most `len` bytes of it (a caller's struct of an older,
/// smaller layout gets the prefix it has).
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

/// The index of the network interface `name` (`if_nametoindex`); 0 if there is none.
pub fn if_index(name: &core::ffi::CStr) -> u32 {
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

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
        // SAFETY: by the contract.
        let (c, attr) = unsafe { (ctx(context), out(attr)) };
        let c = match c {
            Ok(c) => c,
            Err(e) => return e,
        };
        let Some(attr) = attr else {
            return libc::EINVAL;
        };
        match query::query_device_attr(c) {
            Ok(a) => {
                attr.write(a);
                0
            }
            Err(e) => e,
        }
    })
}

/// `verbs_context::query_device_ex` (verbs.h's inline `ibv_query_device_ex`): the basic
/// attributes, the placement extensions in `device_cap_flags_ex` ([`query::cap_flags_ex`]), and
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
        // SAFETY: by the contract.
        let (c, input) = unsafe { (ctx(context), opt_ref(input)) };
        let c = match c {
            Ok(c) => c,
            Err(e) => return e,
        };
        if input.is_some_and(|i| i.comp_mask != 0) {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let (orig, flags_ex) = match query::query_device_both(c) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let mut ex: ibv_device_attr_ex = zeroed();
        ex.device_cap_flags_ex = flags_ex;
        ex.phys_port_cnt_ex = u32::from(orig.phys_port_cnt);
        ex.orig_attr = orig;
        // SAFETY: writable for attr_size bytes by the contract.
        unsafe { write_prefix(attr, &ex, attr_size) };
        0
    })
}

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
        // SAFETY: by the contract.
        let c = match unsafe { ctx(context) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match query::port_of(c, u32::from(port_num)) {
            Ok(p) => {
                // SAFETY: writable for attr_len bytes by the contract.
                unsafe { write_prefix(attr, &query::port_attr(&p), attr_len) };
                0
            }
            Err(e) => e,
        }
    })
}

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
    unsafe { query_port(context, port_num, attr.cast(), query::COMPAT_PORT_ATTR_LEN) }
}

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
    guard_neg("ibv_query_gid", || {
        // SAFETY: by the contract.
        let (c, gid) = unsafe { (ctx(context), out(gid)) };
        let r = c.and_then(|c| {
            let gid = gid.ok_or(libc::EINVAL)?;
            Ok((gid, query::gid(c, port_num, index)?))
        });
        match r {
            Ok((gid, raw)) => {
                gid.write(ibv_gid { raw });
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
        // SAFETY: by the contract.
        let c = match unsafe { ctx(context) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL, writable for entry_size >= size_of bytes by the contract.
        let entry = unsafe { out(entry) }.expect("checked non-NULL");
        match query::gid_of(c, port_num, gid_index) {
            Ok(e) => {
                entry.write(query::gid_entry(&e));
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
        // SAFETY: by the contract.
        let c = match unsafe { ctx(context) } {
            Ok(c) => c,
            Err(e) => return -e,
        };
        if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -libc::EINVAL;
        }
        let all = match query::gid_tables(c) {
            Ok(all) => all,
            Err(e) => return -e,
        };
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
                    .write_unaligned(query::gid_entry(e))
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
    guard_neg("ibv_query_gid_type", || {
        // SAFETY: by the contract.
        let (c, gid_type) = unsafe { (ctx(context), out(gid_type)) };
        let r = c.and_then(|c| {
            let out = gid_type.ok_or(libc::EINVAL)?;
            Ok((out, query::gid_type(c, port_num, index)?))
        });
        match r {
            Ok((out, t)) => {
                out.write(t);
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

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
    guard_neg("ibv_query_pkey", || {
        // SAFETY: by the contract.
        let (c, out) = unsafe { (ctx(context), out(pkey)) };
        let r = c.and_then(|c| query::pkey(c, port_num, index, out.is_some()));
        match (r, out) {
            (Ok(p), Some(out)) => {
                out.write(p);
                0
            }
            (r, _) => {
                set_errno(r.err().unwrap_or(libc::EINVAL));
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
    guard_neg("ibv_get_pkey_index", || {
        // SAFETY: by the contract.
        match unsafe { ctx(context) }.and_then(|c| query::pkey_index(c, port_num, pkey)) {
            Ok(i) => i,
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

// ----- the device list (crate::device) --------------------------------------------------------

/// Has `f` run when the process exits (`atexit`; a failure to register is ignored, as
/// the flush it runs is a courtesy).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registers a function of this library that takes no argument and does not
    // unwind (the callers' catch panics); the library is never unloaded while the process
    // runs (its devices' threads live in it).
    unsafe { libc::atexit(f) };
}

/// `ibv_get_device_list`: a NULL-terminated array of the devices (free it with
/// `ibv_free_device_list`); `*num_devices` their number. NULL with errno EINVAL if
/// `REMEM_IBV_DEVICES` is bad.
///
/// # Safety
///
/// `num_devices` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_list(
    num_devices: *mut c_int,
) -> *mut *mut ibv_device {
    guard_ptr("ibv_get_device_list", || {
        // SAFETY: by the contract.
        let num_devices = unsafe { out(num_devices) };
        let devs = match device::devices() {
            Ok(d) => d,
            Err(why) => {
                eprintln!("remem-ibv: {}: {why}", device::DEVICES_ENV);
                if let Some(n) = num_devices {
                    n.write(0);
                }
                return null_with(libc::EINVAL);
            }
        };
        let mut list: Vec<*mut ibv_device> =
            devs.iter().map(|d| (&raw const d.abi).cast_mut()).collect();
        list.push(std::ptr::null_mut());
        if let Some(n) = num_devices {
            n.write(devs.len() as c_int);
        }
        Box::into_raw(list.into_boxed_slice()).cast()
    })
}

/// `ibv_free_device_list`.
///
/// # Safety
///
/// `list` is NULL or came from `ibv_get_device_list` and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated (made by ibv_get_device_list).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: the boxed slice of n + 1 pointers made by ibv_get_device_list.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `ibv_get_device_name`: NULL (errno EINVAL) for a pointer that is not a device.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match device::device_from(device) {
        Some(d) => d.abi.name.as_ptr(),
        None => null_with::<c_char>(libc::EINVAL),
    }
}

/// `ibv_get_device_guid`: the node GUID, big-endian (0 with errno EINVAL for a pointer
/// that is not a device).
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    match device::device_from(device) {
        Some(d) => d.guid().to_be(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    }
}

/// `ibv_get_device_index`: the device's position in the list; -1 for a pointer that is
/// not a device.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_device_index(device: *mut ibv_device) -> c_int {
    device::device_from(device).map_or(-1, |d| d.index as c_int)
}

/// `ibv_open_device`: opens the soft device (its progress thread starts in this process).
/// NULL with errno: EINVAL for a pointer that is not a device, ENODEV (or the socket's
/// error) if it cannot be opened.
///
/// # Safety
///
/// `device` is NULL or from the device list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard_ptr("ibv_open_device", || {
        let Some(d) = device::device_from(device) else {
            return null_with(libc::EINVAL);
        };
        match d.open() {
            Ok(dev) => {
                let ctx = Ctx::create(dev, device);
                // ibv_get_async_event blocks unless the program sets O_NONBLOCK itself.
                // SAFETY: `ctx` was just made and is live.
                let c = unsafe { ctx_from(ctx) }.expect("a context of this library");
                device::set_blocking(c.vctx.context.async_fd);
                ctx
            }
            Err(e) => {
                eprintln!("remem-ibv: cannot open {}: {e}", d.config.name);
                null_with(super::errno_of(&e))
            }
        }
    })
}

/// `ibv_close_device`: 0, or EINVAL for a context this library did not make. Objects the
/// program did not destroy stay usable until it does (they keep the device open).
///
/// # Safety
///
/// `context` is NULL or an open context, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_close_device(context: *mut ibv_context) -> c_int {
    guard_int("ibv_close_device", || {
        // SAFETY: NULL or a live context by the contract.
        if unsafe { ctx_from(context) }.is_none() {
            return libc::EINVAL;
        }
        crate::stats::snapshot();
        // SAFETY: a context this library made (checked above), not used afterwards.
        unsafe { ctx_free(context) };
        0
    })
}

/// `ibv_import_device`: shares a kernel uverbs context; there is none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let _ = cmd_fd;
    null_with(libc::EOPNOTSUPP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{Pd, program_gids};
    use crate::ffi::handles::{Handle, ctx_free, free, pd_from};
    use remem_verbs::CqId;
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    #[test]
    fn write_prefix_writes_no_more_than_asked() {
        let mut buf = [0xaau8; 8];
        let value = 0x1122_3344_5566_7788u64;
        // SAFETY: buf is writable for 8 bytes.
        unsafe { write_prefix(buf.as_mut_ptr().cast::<u64>(), &value, 3) };
        assert_eq!(&buf[..3], &value.to_ne_bytes()[..3]);
        assert_eq!(&buf[3..], &[0xaa; 5]);
    }

    #[test]
    fn context_pointer_round_trips() {
        let ctx = Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context just made.
        let c = unsafe { ctx_from(ctx) }.unwrap();
        assert_eq!(c.shared().ibv_context(), ctx);
        assert_eq!(c.vctx.sz, size_of::<verbs_context>());
        // SAFETY: a live context; reading its fields.
        assert_eq!(unsafe { (*ctx).abi_compat }, VERBS_ABI_IS_EXTENDED);
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe { ctx_free(ctx) };
        // SAFETY: NULL is allowed.
        assert!(unsafe { ctx_from(std::ptr::null_mut()) }.is_none());
    }

    #[test]
    fn cmd_fd_is_an_open_descriptor_closed_with_the_context() {
        let ctx = Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context just made; reading a field.
        let fd = unsafe { (*ctx).cmd_fd };
        assert!(fd >= 0);
        // SAFETY: fstat of a descriptor into a local.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        assert_eq!(
            st.st_mode & libc::S_IFMT,
            libc::S_IFCHR,
            "/dev/null without a device"
        );
        // SAFETY: fcntl on a descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert!(flags & libc::FD_CLOEXEC != 0);
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe { ctx_free(ctx) };
        // SAFETY: fcntl on a (now closed) descriptor number.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) }, -1);
    }

    #[test]
    fn programs_see_rxes_gid_table() {
        let ctx = Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context just made.
        let shared = unsafe { ctx_from(ctx) }.unwrap().shared();
        // A soft device's table is all RoCE v2 in rxe's layout: programs see it as is.
        let soft = shared.dev.gid_table(1).unwrap();
        let seen = shared.gid_table(1).unwrap();
        assert_eq!(seen, soft);
        assert!(seen.len() >= 2);
        assert!(seen[0].gid.to_ipv6().is_unicast_link_local());
        assert_eq!(
            remem_verbs::first_roce_v2_ipv4(&seen).map(|e| e.index),
            Some(1)
        );
        for i in 0..seen.len() as u8 {
            assert_eq!(shared.soft_gid_index(i), Some(i));
            assert_eq!(shared.program_gid_index(i), Some(i));
        }
        assert_eq!(shared.soft_gid_index(seen.len() as u8), None);
        // A table with RoCE v1 entries (another provider's): programs see the v2 ones.
        let mixed: Vec<remem_verbs::GidEntry> =
            [remem_verbs::GidType::RoceV1, remem_verbs::GidType::RoceV2]
                .into_iter()
                .enumerate()
                .map(|(i, gid_type)| remem_verbs::GidEntry {
                    index: i as u32,
                    gid_type,
                    ..soft[1].clone()
                })
                .collect();
        assert_eq!(program_gids(&mixed), vec![1]);
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe { ctx_free(ctx) };
    }

    #[test]
    fn unregistering_waits_for_the_acks() {
        let ctx = Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context just made.
        let shared = Arc::clone(unsafe { ctx_from(ctx) }.unwrap().shared());
        let qp = 0x1000 as *mut ibv_qp;
        shared.register_qp(7, qp);
        assert_eq!(shared.qp_ptr(7), Some(qp));
        shared.event_out(qp as usize);
        shared.event_out(qp as usize);
        let (tx, rx) = mpsc::channel();
        let s2 = Arc::clone(&shared);
        let t = std::thread::spawn(move || {
            s2.unregister_qp(7);
            tx.send(()).unwrap();
        });
        shared.event_acked(qp as usize);
        // One event still out: the destroy must still be waiting (checked for a while).
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        shared.event_acked(qp as usize);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("unregister returns");
        t.join().unwrap();
        assert_eq!(shared.qp_ptr(7), None);
        // Unregistering what is not registered returns at once.
        shared.unregister_cq(CqId(5));
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe { ctx_free(ctx) };
    }

    #[test]
    fn pd_users_block_nothing_but_are_counted() {
        let ctx = Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context just made.
        let c = unsafe { ctx_from(ctx) }.unwrap();
        let pd = Pd::create(c.shared(), c.shared().dev.alloc_pd().unwrap());
        // SAFETY: a live PD just made.
        let p = unsafe { pd_from(pd) }.unwrap();
        assert_eq!(p.inner.ibv_pd(), pd);
        assert_eq!(p.abi.context, ctx);
        let hold = p.inner.hold();
        assert_eq!(p.inner.users(), 1);
        drop(hold);
        assert_eq!(p.inner.users(), 0);
        // SAFETY: made by Pd::create / Ctx::create, not used afterwards.
        unsafe {
            free(Handle::<Pd>::from_abi(pd).expect("a PD"));
            ctx_free(ctx);
        }
    }

    #[test]
    fn programs_see_the_table_remem_run_describes() {
        // `remem run` writes /sys/class/infiniband/<dev>/ports/1/gids from
        // `remem_soft::dropin::program_gid_table`; an open device's table is the same.
        let addr: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let config = device::DeviceConfig {
            name: "t".into(),
            spec: device::Spec::Soft(addr),
        };
        let d = device::Device::new(0, config).unwrap();
        let dev = d.open().unwrap();
        let ctx = Ctx::create(dev, (&raw const d.abi).cast_mut());
        // SAFETY: a live context just made.
        let shared = unsafe { crate::context::ctx_from(ctx) }.unwrap().shared();
        let seen = shared.gid_table(1).unwrap();
        assert_eq!(seen, remem_soft::dropin::program_gid_table(addr.ip()));
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe { crate::ffi::handles::ctx_free(ctx) };
    }
}
