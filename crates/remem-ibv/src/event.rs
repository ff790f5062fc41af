//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event`.
//!
//! remem's events name objects by number (QP number, CQ id, SRQ number); the context's
//! registries (filled by the object modules) turn them into the program's pointers. An
//! event for an object destroyed meanwhile is dropped, as the kernel drops the events of
//! a destroyed object. Each event handed out counts against its object until acked: the
//! object's destroy waits for the acks (`CtxShared::unregister_*`).

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{Ctx, CtxShared};
use crate::ffi::{set_errno, sys};
use core::ffi::c_int;
use core::mem::MaybeUninit;
use remem_verbs::{AsyncEvent, AsyncEventElement};
use std::sync::Arc;

/// What kind of object an event type is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// `element.qp`.
    Qp,
    /// `element.cq`.
    Cq,
    /// `element.srq`.
    Srq,
    /// `element.wq`.
    Wq,
    /// `element.port_num`.
    Port,
    /// Nothing (`IBV_EVENT_DEVICE_FATAL`).
    Device,
}

/// The kind of object events of `event_type` are about (ibv_get_async_event(3)).
pub fn subject(event_type: ibv_event_type) -> Subject {
    match event_type {
        IBV_EVENT_QP_FATAL
        | IBV_EVENT_QP_REQ_ERR
        | IBV_EVENT_QP_ACCESS_ERR
        | IBV_EVENT_COMM_EST
        | IBV_EVENT_SQ_DRAINED
        | IBV_EVENT_PATH_MIG
        | IBV_EVENT_PATH_MIG_ERR
        | IBV_EVENT_QP_LAST_WQE_REACHED => Subject::Qp,
        IBV_EVENT_CQ_ERR => Subject::Cq,
        IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => Subject::Srq,
        IBV_EVENT_WQ_FATAL => Subject::Wq,
        IBV_EVENT_DEVICE_FATAL => Subject::Device,
        _ => Subject::Port,
    }
}

/// The `ibv_async_event` of a remem event: its object looked up in `shared`'s registries;
/// where the contexts of a device share one queue (no [`CtxShared::events`]), then in
/// those of the other contexts open on the same device. `None` if the object is not
/// registered there (destroyed, or another context's). Notes the event as
/// handed out (until acked).
pub fn translate(shared: &Arc<CtxShared>, ev: &AsyncEvent) -> Option<ibv_async_event> {
    if let Some(e) = translate_in(shared, ev) {
        return Some(e);
    }
    if shared.events.is_some()
        || matches!(
            ev.element,
            AsyncEventElement::Port(_) | AsyncEventElement::Device
        )
    {
        // A context with a queue of its own reads only its own objects' events: the
        // others' contexts have their copies.
        return None;
    }
    shared.siblings().iter().find_map(|s| translate_in(s, ev))
}

/// [`translate`] within one context.
fn translate_in(shared: &CtxShared, ev: &AsyncEvent) -> Option<ibv_async_event> {
    let event_type = ev.event_type as ibv_event_type;
    let element = match ev.element {
        AsyncEventElement::Qp(n) => {
            let p = shared.qp_ptr(n)?;
            shared.event_out(p as usize);
            ibv_async_event_element { qp: p }
        }
        AsyncEventElement::Cq(id) => {
            let p = shared.cq_ptr(id)?;
            shared.event_out(p as usize);
            ibv_async_event_element { cq: p }
        }
        AsyncEventElement::Srq(n) => {
            let p = shared.srq_ptr(n)?;
            shared.event_out(p as usize);
            ibv_async_event_element { srq: p }
        }
        AsyncEventElement::Port(port) => ibv_async_event_element {
            port_num: c_int::from(port),
        },
        AsyncEventElement::Device => ibv_async_event_element {
            qp: std::ptr::null_mut(),
        },
    };
    Some(ibv_async_event {
        element,
        event_type,
    })
}

/// Whether the program made `fd` non-blocking.
fn nonblocking(fd: c_int) -> bool {
    let flags = sys::get_fl(fd);
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// Waits until `fd` is readable (retrying after signals).
fn wait_readable(fd: c_int) -> Result<(), c_int> {
    loop {
        let r = sys::poll_in(fd, -1);
        if r > 0 {
            return Ok(());
        }
        let e = crate::ffi::errno();
        if r < 0 && e != libc::EINTR {
            return Err(e);
        }
    }
}

/// `ibv_get_async_event` once the FFI layer has its arguments: the next event; blocks
/// until one arrives unless the program made `context->async_fd` non-blocking (then -1
/// with errno EAGAIN when none is pending).
pub(crate) fn get(c: &Ctx, event: &mut MaybeUninit<ibv_async_event>) -> c_int {
    let shared = c.shared();
    let fd = c.vctx.context.async_fd;
    loop {
        // Translate every event queued; one whose object is gone is dropped.
        loop {
            let ev = match &shared.events {
                // A shared device queue (several contexts): move what the device has
                // into the router, which files each event under its context.
                Some(q) => {
                    while shared.dev.get_async_event().is_some() {}
                    q.pop()
                }
                None => shared.dev.get_async_event(),
            };
            let Some(ev) = ev else { break };
            if let Some(out) = translate(shared, &ev) {
                event.write(out);
                return 0;
            }
        }
        if nonblocking(fd) {
            set_errno(libc::EAGAIN);
            return -1;
        }
        if let Err(e) = wait_readable(fd) {
            set_errno(e);
            return -1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::AsyncEventType;

    #[test]
    fn subjects_of_event_types() {
        assert_eq!(subject(IBV_EVENT_COMM_EST), Subject::Qp);
        assert_eq!(subject(IBV_EVENT_QP_LAST_WQE_REACHED), Subject::Qp);
        assert_eq!(subject(IBV_EVENT_CQ_ERR), Subject::Cq);
        assert_eq!(subject(IBV_EVENT_SRQ_LIMIT_REACHED), Subject::Srq);
        assert_eq!(subject(IBV_EVENT_PORT_ACTIVE), Subject::Port);
        assert_eq!(subject(IBV_EVENT_GID_CHANGE), Subject::Port);
        assert_eq!(subject(IBV_EVENT_DEVICE_FATAL), Subject::Device);
        assert_eq!(subject(IBV_EVENT_WQ_FATAL), Subject::Wq);
    }

    #[test]
    fn remem_event_types_are_verbs_values() {
        assert_eq!(
            AsyncEventType::SrqLimitReached as u32,
            IBV_EVENT_SRQ_LIMIT_REACHED
        );
        assert_eq!(AsyncEventType::WqFatal as u32, IBV_EVENT_WQ_FATAL);
        assert_eq!(AsyncEventType::CqErr as u32, IBV_EVENT_CQ_ERR);
    }
}
