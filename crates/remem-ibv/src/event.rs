//! Asynchronous events: `ibv_get_async_event`, `ibv_ack_async_event`.
//!
//! remem's events name objects by number (QP number, CQ id, SRQ number); the context's
//! registries (filled by the object modules) turn them into the program's pointers. An
//! event for an object destroyed meanwhile is dropped, as the kernel drops the events of
//! a destroyed object. Each event handed out counts against its object until acked: the
//! object's destroy waits for the acks (`CtxShared::unregister_*`).

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::{CtxShared, ctx_from};
use crate::ffi::{guard_neg, set_errno};
use core::ffi::c_int;
use remem_verbs::{AsyncEvent, AsyncEventElement};
use std::sync::Arc;

symver!(
    "ibv_get_async_event" @ "IBVERBS_1.1",
    "ibv_ack_async_event" @ "IBVERBS_1.1",
);

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
    // SAFETY: F_GETFL only reads the fd's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// Waits until `fd` is readable (retrying after signals).
fn wait_readable(fd: c_int) -> Result<(), c_int> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r > 0 {
            return Ok(());
        }
        let e = crate::ffi::errno();
        if r < 0 && e != libc::EINTR {
            return Err(e);
        }
    }
}

/// `ibv_get_async_event`: the next event; blocks until one arrives unless the program made
/// `context->async_fd` non-blocking (then -1 with errno EAGAIN when none is pending). -1
/// with errno EINVAL for a NULL argument.
///
/// # Safety
///
/// `context` is NULL or open; `event` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard_neg("ibv_get_async_event", || {
        // SAFETY: NULL or a live context by the contract.
        let Some(c) = (unsafe { ctx_from(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let shared = c.shared();
        let fd = c.vctx.context.async_fd;
        loop {
            loop {
                let ev = match &shared.events {
                    Some(q) => {
                        // Nobody reads the device's own queue here: keep it from growing.
                        while shared.dev.get_async_event().is_some() {}
                        q.pop()
                    }
                    None => shared.dev.get_async_event(),
                };
                let Some(ev) = ev else { break };
                if let Some(out) = translate(shared, &ev) {
                    // SAFETY: writable by the contract.
                    unsafe { event.write(out) };
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
    })
}

/// `ibv_ack_async_event`: acknowledges an event from `ibv_get_async_event` (every event
/// must be acked before its object can be destroyed).
///
/// # Safety
///
/// `event` is NULL or an event from `ibv_get_async_event` whose object is still live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    crate::ffi::guard(
        "ibv_ack_async_event",
        || (),
        || {
            // SAFETY: an event from ibv_get_async_event by the contract.
            let ev = unsafe { event.read() };
            // Every object's ABI struct starts with its `struct ibv_context *`. All the
            // pointer members of the union share its first 8 bytes, so reading `qp` reads
            // whichever object pointer the event type says is set.
            let object: *mut *mut ibv_context = match subject(ev.event_type) {
                Subject::Qp | Subject::Cq | Subject::Srq => {
                    // SAFETY: the union holds a pointer for these event types.
                    unsafe { ev.element.qp }.cast()
                }
                Subject::Wq | Subject::Port | Subject::Device => return,
            };
            if object.is_null() {
                return;
            }
            // SAFETY: the object is live by the contract; its first field is its context.
            let context = unsafe { *object };
            // SAFETY: the object's context is live while the object is.
            if let Some(c) = unsafe { ctx_from(context) } {
                c.shared().event_acked(object as usize);
            }
        },
    );
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

#[cfg(test)]
mod registry_tests {
    use super::*;
    use crate::context::{Ctx, ctx_from};
    use remem_verbs::{AsyncEventType, CqId};

    #[test]
    fn each_open_of_a_device_has_its_own_async_fd_and_its_own_objects_events() {
        let dev: Arc<dyn remem_verbs::Context> = Arc::new(
            remem_soft::SoftContext::bind_with(
                "127.0.0.1:0".parse().unwrap(),
                &remem_soft::SoftOptions::default(),
            )
            .unwrap(),
        );
        let (a, b) = (
            Ctx::create(Arc::clone(&dev), std::ptr::null_mut()),
            Ctx::create(Arc::clone(&dev), std::ptr::null_mut()),
        );
        // SAFETY: live contexts just made.
        let (sa, sb) = unsafe {
            (
                Arc::clone(ctx_from(a).unwrap().shared()),
                Arc::clone(ctx_from(b).unwrap().shared()),
            )
        };
        // Two descriptors, as two opens of a kernel device give (UCX keys its event
        // handlers by descriptor; O_NONBLOCK on one must not change the other).
        // SAFETY: live contexts.
        let (fa, fb) = unsafe { ((*a).async_fd, (*b).async_fd) };
        assert!(fa >= 0 && fb >= 0 && fa != fb, "{fa} {fb}");
        assert!(sa.events.is_some() && sb.events.is_some());
        let cq = 0x2000 as *mut ibv_cq;
        sb.register_cq(CqId(3), cq);
        let ev = AsyncEvent {
            event_type: AsyncEventType::CqErr,
            element: AsyncEventElement::Cq(CqId(3)),
        };
        // The event reaches both queues; only the owner's context reports it.
        assert!(translate(&sa, &ev).is_none(), "another context's CQ");
        let got = translate(&sb, &ev).expect("its own CQ");
        assert_eq!(got.event_type, IBV_EVENT_CQ_ERR);
        // SAFETY: a CQ event carries a CQ pointer.
        assert_eq!(unsafe { got.element.cq }, cq);
        sb.event_acked(cq as usize);
        sb.unregister_cq(CqId(3));
        assert!(
            translate(&sb, &ev).is_none(),
            "destroyed objects get no events"
        );
        // A port event goes to every context.
        let port = AsyncEvent {
            event_type: AsyncEventType::PortActive,
            element: AsyncEventElement::Port(1),
        };
        for s in [&sa, &sb] {
            let port = translate(s, &port).unwrap();
            // SAFETY: a port event carries a port number.
            let port_num = unsafe { port.element.port_num };
            assert_eq!(port_num, 1);
        }
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe {
            Ctx::free(a);
            Ctx::free(b);
        }
    }
}
