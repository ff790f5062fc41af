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

#![allow(unsafe_code)]

use super::abi::*;
use super::id::IdShared;
use crate::ffi::{guard_ptr, null_with};
use core::ffi::{c_char, c_int};
use remem_verbs::cm::CmEvent;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

symver!(
    "rdma_create_event_channel" @ "RDMACM_1.0",
    "rdma_destroy_event_channel" @ "RDMACM_1.0",
    "rdma_get_cm_event" @ "RDMACM_1.0",
    "rdma_ack_cm_event" @ "RDMACM_1.0",
    "rdma_event_str" @ "RDMACM_1.0",
);

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
    fn new() -> Result<Arc<ChannelInner>, c_int> {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(crate::ffi::errno());
        }
        Ok(Arc::new(ChannelInner {
            // SAFETY: a descriptor just created, owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            queue: Mutex::new(VecDeque::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the fd readable (the queue just became non-empty). Under the queue lock.
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to the channel's eventfd; the counter
        // is 0 here (the queue was empty), so the write cannot block.
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Makes the fd unreadable (the queue just became empty). Under the queue lock.
    fn unsignal(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from the channel's eventfd; its counter
        // is non-zero here (the queue was not empty), so the read cannot block.
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
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
    fn close(&self) -> Vec<Pending> {
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
        // SAFETY: F_GETFL on a descriptor the channel owns.
        let flags = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
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
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd for the channel's fd.
            if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
                let e = crate::ffi::errno();
                if e != libc::EAGAIN {
                    return Err(e);
                }
            }
        }
    }
}

/// A channel: what `rdma_create_event_channel` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Channel {
    /// The `rdma_event_channel` programs see (its `fd`).
    pub abi: rdma_event_channel,
    /// The queue; `None` once the channel is destroyed (a tombstone, see [`free_channel`]).
    inner: Mutex<Option<Arc<ChannelInner>>>,
}

/// Destroyed channels whose memory is kept a while (their queue and fd are released at
/// once): [`free_channel`].
static TOMBSTONES: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());

/// How many destroyed channels keep their memory (a few dozen bytes each).
const TOMBSTONES_KEPT: usize = 64;

/// Makes a channel: the pointer programs see (freed by [`free_channel`]) and its library
/// side.
pub(crate) fn new_channel() -> Result<(*mut rdma_event_channel, Arc<ChannelInner>), c_int> {
    let inner = ChannelInner::new()?;
    let abi = rdma_event_channel {
        fd: inner.fd.as_raw_fd(),
    };
    let p = Box::into_raw(Box::new(Channel {
        abi,
        inner: Mutex::new(Some(Arc::clone(&inner))),
    }))
    .cast();
    Ok((p, inner))
}

/// The library's side of a program's channel; `None` for NULL or a destroyed channel.
///
/// # Safety
///
/// `ch` is NULL, a live channel of this library, or one destroyed since (its tombstone is
/// kept for a while: [`free_channel`]).
pub(crate) unsafe fn channel_from(ch: *mut rdma_event_channel) -> Option<Arc<ChannelInner>> {
    // SAFETY: by the contract, a non-NULL `ch` is the first field of a boxed `Channel`;
    // the reference covers the library's part only and ends in this function.
    let c = unsafe { ch.cast::<Channel>().as_ref() }?;
    c.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Destroys a channel made by [`new_channel`]: its queue and fd are released now (ids
/// still on it, and a thread still waiting in `rdma_get_cm_event`, keep the queue alive
/// until they are done), and its memory is kept as a tombstone until 64 more channels
/// are destroyed. Programs use a channel after destroying it: rping's CM thread loops back
/// into `rdma_get_cm_event` while its main thread destroys the channel at exit. With
/// librdmacm that thread is nearly always blocked in `read` by then, and a blocked `read`
/// outlives the descriptor's close: it just never returns. Here a waiter holds the queue
/// and waits on, and a call that starts after the destroy finds the tombstone and waits
/// the same way (until a signal: EINTR), instead of reading freed memory — or failing
/// with EBADF as a `read` of the closed descriptor would, which makes rping exit 255 when
/// its teardown is quicker than the kernel's.
///
/// # Safety
///
/// `ch` came from [`new_channel`] and is not destroyed yet (or is a tombstone still kept,
/// which a second destroy leaves as it is).
pub(crate) unsafe fn free_channel(ch: *mut rdma_event_channel) {
    // SAFETY: by the contract, the live Box made in `new_channel`.
    let c = unsafe { &*ch.cast::<Channel>() };
    let inner = c.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
    if inner.is_none() {
        // Destroyed already (a program's second destroy): the tombstone is queued once.
        return;
    }
    // Dropped outside the queue's lock (an event's drop may release its id).
    let dropped = inner.as_ref().map(|i| i.close());
    drop(dropped);
    drop(inner);
    let evicted = {
        let mut t = TOMBSTONES.lock().unwrap_or_else(|e| e.into_inner());
        t.push_back(ch as usize);
        if t.len() > TOMBSTONES_KEPT {
            t.pop_front()
        } else {
            None
        }
    };
    if let Some(old) = evicted {
        // SAFETY: a Box made in `new_channel`, destroyed 64 destroys ago and freed only
        // here, once.
        drop(unsafe { Box::from_raw(old as *mut Channel) });
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

/// Frees an event handed out and counts its ack.
///
/// # Safety
///
/// `ev` is a live event of this library, not used afterwards.
pub(crate) unsafe fn ack(ev: *mut rdma_cm_event) {
    // SAFETY: by the contract, the Box made by `id::hand_out`.
    let ev = unsafe { Box::from_raw(ev.cast::<Event>()) };
    ev.counted.event_acked();
}

/// `rdma_create_event_channel`: a channel (its fd blocking); NULL with errno (ENODEV when
/// there are no devices, EINVAL for a bad `REMEM_IBV_DEVICES`, or the eventfd's error).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard_ptr("rdma_create_event_channel", || {
        if let Err(e) = super::devices::count() {
            return null_with(e);
        }
        new_channel().map_or_else(null_with, |(p, _)| p)
    })
}

/// `rdma_destroy_event_channel`: frees the channel (the program has destroyed its ids and
/// acked their events first, as the man page requires). A thread still waiting in
/// `rdma_get_cm_event` on it keeps waiting (its queue and fd live until it returns).
///
/// # Safety
///
/// `channel` is NULL or a live channel, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    crate::ffi::guard(
        "rdma_destroy_event_channel",
        || (),
        || {
            if !channel.is_null() {
                // SAFETY: a live channel by the contract, not used afterwards.
                unsafe { free_channel(channel) };
            }
        },
    )
}

/// `rdma_get_cm_event`: the next event of the channel, waiting for one unless the fd is
/// non-blocking. -1 with errno: EINVAL for NULL arguments, EAGAIN (non-blocking, none
/// queued), EINTR (a signal; the only way out of a wait on a channel destroyed since:
/// `rdma_destroy_event_channel`).
///
/// # Safety
///
/// `channel` is NULL, a live channel or one destroyed recently; `event` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    super::guard_neg("rdma_get_cm_event", || {
        if channel.is_null() || event.is_null() {
            return super::fail(libc::EINVAL);
        }
        // SAFETY: by the contract, a live channel or a tombstone. The wait holds the
        // channel's queue (and fd) itself: a program may destroy the channel while a
        // thread of its own still waits in here (rping does at exit), as a thread blocked
        // in librdmacm's `read` holds the file.
        let Some(ch) = (unsafe { channel_from(channel) }) else {
            // A destroyed channel: wait as a thread that was already blocked in it waits,
            // until a signal interrupts (see `free_channel`).
            // SAFETY: poll on no descriptors: only a signal ends it.
            unsafe { libc::poll(std::ptr::null_mut(), 0, -1) };
            return super::fail(libc::EINTR);
        };
        loop {
            let p = match ch.wait() {
                Ok(p) => p,
                Err(e) => return super::fail(e),
            };
            if let Some(ev) = super::id::hand_out(p) {
                // SAFETY: non-NULL and writable by the contract.
                unsafe { event.write(ev) };
                return 0;
            }
        }
    })
}

/// `rdma_ack_cm_event`: frees the event (EINVAL for NULL).
///
/// # Safety
///
/// `event` is NULL or an event from `rdma_get_cm_event` not acked yet, not used
/// afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    super::guard_neg("rdma_ack_cm_event", || {
        if event.is_null() {
            return super::fail(libc::EINVAL);
        }
        // SAFETY: by the contract.
        unsafe { ack(event) };
        0
    })
}

/// `rdma_event_str`: the name of an event type (`"UNKNOWN EVENT"` for another value).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let s: &'static core::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names() {
        // SAFETY: the strings are static C strings.
        let name = |e| unsafe { core::ffi::CStr::from_ptr(remem_ibv_rdma_event_str(e)) };
        assert_eq!(
            name(RDMA_CM_EVENT_ESTABLISHED).to_str().unwrap(),
            "RDMA_CM_EVENT_ESTABLISHED"
        );
        assert_eq!(
            name(RDMA_CM_EVENT_TIMEWAIT_EXIT).to_str().unwrap(),
            "RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
        assert_eq!(name(99).to_str().unwrap(), "UNKNOWN EVENT");
    }

    #[test]
    fn the_fd_is_readable_exactly_while_events_are_queued() {
        let ch = ChannelInner::new().unwrap();
        let readable = || {
            let mut p = libc::pollfd {
                fd: ch.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!readable());
        // A blocking fd, as librdmacm's.
        assert!(!ch.nonblocking());
        // SAFETY: setting O_NONBLOCK on the channel's own fd, as a program would.
        unsafe { libc::fcntl(ch.fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(ch.wait().err(), Some(libc::EAGAIN));
        assert!(ch.pop().is_none());
        assert!(!readable());
    }

    #[test]
    fn null_arguments_are_einval() {
        let mut ev = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: NULL channel is allowed.
            unsafe { remem_ibv_rdma_get_cm_event(std::ptr::null_mut(), &mut ev) },
            -1
        );
        assert_eq!(crate::ffi::errno(), libc::EINVAL);
        assert_eq!(
            // SAFETY: NULL is allowed.
            unsafe { remem_ibv_rdma_ack_cm_event(std::ptr::null_mut()) },
            -1
        );
        assert_eq!(crate::ffi::errno(), libc::EINVAL);
    }

    /// rping destroys its channel at exit while its CM thread still waits in
    /// `rdma_get_cm_event`: the waiter must not touch freed memory (this test runs under
    /// valgrind in CI). It holds the channel's queue while it waits and returns EINTR
    /// when a signal interrupts it.
    #[test]
    fn destroying_a_channel_under_a_waiter_frees_nothing_it_uses() {
        extern "C" fn nothing(_: c_int) {}
        // SAFETY: installs a handler that does nothing for SIGUSR2, without SA_RESTART
        // (poll is never restarted anyway): the waiter's poll returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        }
        let (channel, _) = new_channel().unwrap();
        // SAFETY: the channel just made.
        let inner = unsafe { channel_from(channel) }.unwrap();
        let at = channel as usize;
        let waiter = std::thread::spawn(move || {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a live channel when the call starts; `ev` is writable.
            let r = unsafe { remem_ibv_rdma_get_cm_event(at as *mut _, &mut ev) };
            (r, crate::ffi::errno())
        });
        // The waiter holds the queue once it is inside the call.
        while Arc::strong_count(&inner) < 3 {
            std::thread::yield_now();
        }
        // SAFETY: the channel is not used by this thread afterwards but to check that a
        // destroyed channel is refused (its tombstone is kept).
        unsafe { remem_ibv_rdma_destroy_event_channel(channel) };
        assert_eq!(Arc::strong_count(&inner), 2, "the waiter still holds it");
        // A call that starts after the destroy waits too, until a signal.
        let late = std::thread::spawn(move || {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a channel destroyed just now: its tombstone is kept.
            let r = unsafe { remem_ibv_rdma_get_cm_event(at as *mut _, &mut ev) };
            (r, crate::ffi::errno())
        });
        {
            use std::os::unix::thread::JoinHandleExt;
            let tid = late.as_pthread_t();
            while !late.is_finished() {
                // SAFETY: the thread is alive until joined.
                unsafe { libc::pthread_kill(tid, libc::SIGUSR2) };
                std::thread::yield_now();
            }
        }
        assert_eq!(late.join().unwrap(), (-1, libc::EINTR));
        // Interrupt the wait until the waiter returns (a signal may land before it polls).
        use std::os::unix::thread::JoinHandleExt;
        let tid = waiter.as_pthread_t();
        while Arc::strong_count(&inner) > 1 {
            // SAFETY: the waiter thread is alive while it holds its reference.
            unsafe { libc::pthread_kill(tid, libc::SIGUSR2) };
            std::thread::yield_now();
        }
        assert_eq!(waiter.join().unwrap(), (-1, libc::EINTR));
    }
}
