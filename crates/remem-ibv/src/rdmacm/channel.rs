//! Event channels (`rdma_create_event_channel`, `rdma_destroy_event_channel`) and the
//! events handed out of them (`rdma_get_cm_event`, `rdma_ack_cm_event`, `rdma_event_str`).
//!
//! A channel is a queue of provider events for its ids and an eventfd that is readable
//! while the queue is not empty (written when the first event arrives, read when the last
//! one leaves, both under the queue's lock). The fd is blocking, as librdmacm's is: a
//! program that wants `rdma_get_cm_event` not to wait sets `O_NONBLOCK` on it (then the
//! call fails with EAGAIN when nothing is queued); otherwise the call waits in `poll(2)`.
//!
//! An event handed out is a boxed `Event` (the `rdma_cm_event` first, the private data
//! it points to after it); it counts on its id (for a connection request, on the
//! listening id, as librdmacm counts it) until `rdma_ack_cm_event` frees it, and
//! `rdma_destroy_id` waits for that.
//!
//! The channel the program holds (`Channel`, its `rdma_event_channel` first), its
//! tombstones, and the entry points are in `crate::ffi::rdmacm`; the eventfd's system
//! calls in `crate::ffi::sys`.

#![forbid(unsafe_code)]

pub(crate) use crate::ffi::rdmacm::new_channel;

use super::abi::*;
use super::id::IdShared;
use crate::ffi::sys;
use core::ffi::c_int;
use remem_verbs::cm::CmEvent;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// A provider event waiting in a channel.
pub(crate) struct Pending {
    /// The id it is for (for a connection request, the listening id).
    pub target: Arc<IdShared>,
    /// The provider's event.
    pub ev: CmEvent,
    /// For a connection request, the new `rdma_cm_id` made for it.
    pub child: Option<super::id::Unseen>,
}

/// The library's side of a channel.
pub(crate) struct ChannelInner {
    fd: OwnedFd,
    queue: Mutex<VecDeque<Pending>>,
    /// The program destroyed the channel: nothing more is queued, and a thread still
    /// waiting in `rdma_get_cm_event` waits on (as one blocked in librdmacm's `read` of
    /// the closed descriptor does), until a signal interrupts it.
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ChannelInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelInner")
            .field("fd", &self.fd.as_raw_fd())
            .finish_non_exhaustive()
    }
}

impl ChannelInner {
    pub(crate) fn new() -> Result<Arc<ChannelInner>, c_int> {
        Ok(Arc::new(ChannelInner {
            fd: sys::eventfd()?,
            queue: Mutex::new(VecDeque::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the fd readable (the queue just became non-empty). Under the queue lock.
    fn signal(&self) {
        // The counter is 0 here (the queue was empty), so the write cannot block.
        sys::eventfd_add(self.fd.as_raw_fd(), 1);
    }

    /// Makes the fd unreadable (the queue just became empty). Under the queue lock.
    fn unsignal(&self) {
        // The counter is non-zero here (the queue was not empty), so the read cannot
        // block.
        sys::eventfd_take(self.fd.as_raw_fd());
    }

    /// The eventfd programs poll (`rdma_event_channel.fd`).
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Queues an event (dropped once the channel is destroyed).
    pub fn push(&self, p: Pending) {
        let mut q = self.lock();
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if q.is_empty() {
            self.signal();
        }
        q.push_back(p);
    }

    /// The program destroyed the channel: drops what is queued and makes the fd unreadable
    /// for good (waiters wait on).
    pub(crate) fn close(&self) -> Vec<Pending> {
        let mut q = self.lock();
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        if !q.is_empty() {
            self.unsignal();
        }
        q.drain(..).collect()
    }

    /// Takes the oldest event, if any.
    pub fn pop(&self) -> Option<Pending> {
        let mut q = self.lock();
        let p = q.pop_front();
        if p.is_some() && q.is_empty() {
            self.unsignal();
        }
        p
    }

    /// Takes every queued event for `id` (its own, and connection requests it listened
    /// for), oldest first.
    pub fn take_for(&self, id: &Arc<IdShared>) -> Vec<Pending> {
        let mut q = self.lock();
        let was_empty = q.is_empty();
        let (mine, rest): (Vec<Pending>, Vec<Pending>) =
            q.drain(..).partition(|p| Arc::ptr_eq(&p.target, id));
        q.extend(rest);
        if !was_empty && q.is_empty() {
            self.unsignal();
        }
        mine
    }

    /// Whether the program set `O_NONBLOCK` on the fd.
    fn nonblocking(&self) -> bool {
        let flags = sys::get_fl(self.fd.as_raw_fd());
        flags >= 0 && flags & libc::O_NONBLOCK != 0
    }

    /// Takes the oldest event, waiting for one unless the fd is non-blocking (EAGAIN);
    /// EINTR if a signal interrupts the wait.
    pub fn wait(&self) -> Result<Pending, c_int> {
        loop {
            if let Some(p) = self.pop() {
                return Ok(p);
            }
            if self.nonblocking() {
                return Err(libc::EAGAIN);
            }
            if sys::poll_in(self.fd.as_raw_fd(), -1) < 0 {
                let e = crate::ffi::errno();
                if e != libc::EAGAIN {
                    return Err(e);
                }
            }
        }
    }
}

/// An event handed out: what `rdma_get_cm_event` returns a pointer to (`abi` first).
#[repr(C)]
pub(crate) struct Event {
    /// The `rdma_cm_event` programs see.
    pub abi: rdma_cm_event,
    /// The private data `abi.param.*.private_data` points to.
    pub private_data: Vec<u8>,
    /// The id the event counts on until acked.
    pub counted: Arc<IdShared>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_is_readable_exactly_while_events_are_queued() {
        let ch = ChannelInner::new().unwrap();
        let readable = || sys::poll_in(ch.fd(), 0) == 1;
        assert!(!readable());
        // A blocking fd, as librdmacm's.
        assert!(!ch.nonblocking());
        // Setting O_NONBLOCK on the channel's own fd, as a program would.
        sys::set_fl(ch.fd(), sys::get_fl(ch.fd()) | libc::O_NONBLOCK);
        assert_eq!(ch.wait().err(), Some(libc::EAGAIN));
        assert!(ch.pop().is_none());
        assert!(!readable());
    }
}
