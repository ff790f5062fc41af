//! The router: one thread of the process that waits (epoll) on the CM channel of every
//! open device and hands each provider event to the `rdma_event_channel` of the id it
//! belongs to at that moment.
//!
//! Provider ids are registered by their handle; an event of an id no
//! longer registered (destroyed) is dropped, which for a connection request rejects it
//! (dropping the provider's new id). A connection request creates the new
//! `rdma_cm_id` here (`id::new_child`) and registers it before the event is
//! queued, so the new id's own later events always find it.
//!
//! Lock order: the routes, then an id's state, then a channel's queue.

#![forbid(unsafe_code)]

use super::id::IdShared;
use crate::ffi::sys;
use core::ffi::c_int;
use remem_verbs::cm::{CmChannel, CmEvent, CmEventKind};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock, Weak};

/// The provider ids known to the router, by handle.
pub(crate) type Routes = HashMap<u64, Weak<IdShared>>;

struct Router {
    epoll: OwnedFd,
    channels: Mutex<Vec<Arc<dyn CmChannel>>>,
}

static ROUTES: LazyLock<Mutex<Routes>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn router() -> Result<&'static Router, c_int> {
    static ROUTER: OnceLock<Result<Router, c_int>> = OnceLock::new();
    ROUTER
        .get_or_init(|| {
            let epoll = sys::epoll_create()?;
            std::thread::Builder::new()
                .name("remem-rdmacm".into())
                .spawn(run)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
            Ok(Router {
                epoll,
                channels: Mutex::new(Vec::new()),
            })
        })
        .as_ref()
        .map_err(|e| *e)
}

/// Watches a device's CM channel (once per device).
pub(crate) fn watch(channel: &Arc<dyn CmChannel>) -> Result<(), c_int> {
    let r = router()?;
    let mut chans = r.channels.lock().unwrap_or_else(|e| e.into_inner());
    // The channel is kept in `channels` for the life of the process, so its descriptor
    // stays open while registered.
    sys::epoll_add_in(
        r.epoll.as_raw_fd(),
        channel.fd().as_raw_fd(),
        chans.len() as u64,
    )?;
    chans.push(Arc::clone(channel));
    Ok(())
}

/// The routes, locked (for registering and unregistering atomically with other state).
pub(crate) fn routes() -> MutexGuard<'static, Routes> {
    ROUTES.lock().unwrap_or_else(|e| e.into_inner())
}

fn run() {
    // Blocks until the router is made (this thread starts inside its initialisation).
    let Ok(r) = router() else { return };
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
    loop {
        let n = sys::epoll_wait(r.epoll.as_raw_fd(), &mut events, -1);
        if n < 0 {
            if crate::ffi::errno() == libc::EINTR {
                continue;
            }
            eprintln!("remem-ibv: the RDMA CM event thread stops: epoll_wait failed");
            return;
        }
        for e in &events[..n as usize] {
            let idx = e.u64 as usize;
            let ch = {
                let chans = r.channels.lock().unwrap_or_else(|e| e.into_inner());
                chans.get(idx).cloned()
            };
            let Some(ch) = ch else { continue };
            while let Some(ev) = ch.get_event() {
                deliver(ev);
            }
        }
    }
}

/// Hands one provider event to its id's channel (or drops it).
pub(crate) fn deliver(ev: CmEvent) {
    let mut routes = routes();
    deliver_locked(&mut routes, ev);
}

fn deliver_locked(routes: &mut Routes, ev: CmEvent) {
    if ev.kind == CmEventKind::ConnectRequest {
        let listener = ev
            .listen_id
            .as_ref()
            .and_then(|l| routes.get(&l.handle()))
            .and_then(Weak::upgrade);
        let Some(listener) = listener else {
            // Nobody listens any more: dropping the new provider id rejects it.
            return;
        };
        let Some(child) = super::id::new_child(&listener, &ev, routes) else {
            return;
        };
        listener.queue(super::channel::Pending {
            target: Arc::clone(&listener),
            ev,
            child: Some(child),
        });
        return;
    }
    let Some(target) = routes.get(&ev.id.handle()).and_then(Weak::upgrade) else {
        return;
    };
    target.queue(super::channel::Pending {
        target: Arc::clone(&target),
        ev,
        child: None,
    });
}
