//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event`.

#![allow(unsafe_code)]

use crate::abi::*;
use core::ffi::c_int;

symver!(
    "ibv_get_async_event" @ "IBVERBS_1.1",
    "ibv_ack_async_event" @ "IBVERBS_1.1",
);

/// `ibv_get_async_event`: blocks until an event arrives unless the program made
/// `context->async_fd` non-blocking (then -1 with errno EAGAIN when none is pending).
///
/// # Safety
///
/// `context` is NULL or open; `event` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    let _ = (context, event);
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    -1
}

/// `ibv_ack_async_event`.
///
/// # Safety
///
/// `event` is NULL or an event from `ibv_get_async_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_ack_async_event(event: *mut ibv_async_event) {
    let _ = event;
}
