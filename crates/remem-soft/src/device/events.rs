//! Async events of a device, completion channels, and the readable file descriptor that
//! announces both.
//!
//! Both are [`FdQueue`]s: the events themselves wait in process memory and a socket pair
//! only carries readiness — one byte sits in it exactly while the queue holds something.
//! Sending one datagram per event instead would lose events once a few hundred are unread
//! (a datagram socket's send buffer fills, and a non-blocking send fails), whereas the
//! kernel's own event queues (`ib_uverbs`) are unbounded lists.

use remem_verbs::{AsyncEvent, CqId};
use rustix::net::{RecvFlags, SendFlags, recv, send};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, Weak};

#[derive(Debug)]
struct State<T> {
    queue: VecDeque<T>,
    /// Whether the readiness byte is in the socket.
    signalled: bool,
}

/// A FIFO whose file descriptor is readable exactly while the FIFO is non-empty.
///
/// The fd is for `epoll`/`poll`/tokio's `AsyncFd` only: reading it directly steals the
/// readiness byte (the queue then stays readable only after the next push).
///
/// The fd is created non-blocking, but its `O_NONBLOCK` flag belongs to the user: a
/// libibverbs-style caller may clear it (rdma-core's `ibv_get_cq_event` blocks unless the
/// program set `O_NONBLOCK`) and wait with `poll` before [`FdQueue::pop`]. The queue's own
/// reads never block whatever the flag says (`MSG_DONTWAIT`), and its writes go to the
/// other end of the socket pair, which is never handed out.
#[derive(Debug)]
pub struct FdQueue<T> {
    state: Mutex<State<T>>,
    rx: UnixDatagram,
    tx: UnixDatagram,
}

impl<T> FdQueue<T> {
    /// An empty queue with a non-blocking fd.
    pub fn new() -> std::io::Result<Self> {
        let (rx, tx) = UnixDatagram::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        Ok(FdQueue {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                signalled: false,
            }),
            rx,
            tx,
        })
    }

    fn signal(&self, s: &mut State<T>) {
        if !s.signalled {
            // One byte into an empty socket: fails only if the kernel is out of memory, and
            // then the next push or pop tries again.
            s.signalled = send(&self.tx, &[1], SendFlags::DONTWAIT).is_ok();
        }
    }

    /// Appends an item; the fd becomes readable.
    pub fn push(&self, item: T) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.queue.push_back(item);
        self.signal(&mut s);
    }

    /// Takes the oldest item; the fd stops being readable when the queue empties.
    pub fn pop(&self) -> Option<T> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let item = s.queue.pop_front();
        if s.queue.is_empty() {
            if s.signalled {
                // Drain: normally exactly our one byte. Non-blocking per call, as the user
                // may have cleared O_NONBLOCK on the fd.
                while recv(&self.rx, &mut [0u8; 1], RecvFlags::DONTWAIT).is_ok() {}
                s.signalled = false;
            }
        } else {
            self.signal(&mut s);
        }
        item
    }

    /// Items waiting.
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .queue
            .len()
    }

    /// Whether nothing is waiting.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fd, readable while items are waiting. Its `O_NONBLOCK` flag is the caller's to
    /// set or clear (see the type's docs).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

/// A device's async event queue (what `ibv_get_async_event` reads); the context's
/// `async_fd` is readable while events are pending. Further readers subscribe
/// ([`AsyncEvents::subscribe`]): each has a queue and fd of its own and gets every event
/// raised after it subscribed, as each `ibv_open_device` of a kernel device does.
#[derive(Debug)]
pub struct AsyncEvents {
    queue: FdQueue<AsyncEvent>,
    subscribers: Mutex<Vec<Weak<FdQueue<AsyncEvent>>>>,
}

impl AsyncEvents {
    /// An empty queue.
    pub fn new() -> std::io::Result<Self> {
        Ok(AsyncEvents {
            queue: FdQueue::new()?,
            subscribers: Mutex::new(Vec::new()),
        })
    }

    /// Raises an event: to the device's queue and to every live subscriber's.
    pub fn raise(&self, ev: AsyncEvent) {
        self.queue.push(ev);
        let mut subs = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|w| match w.upgrade() {
            Some(q) => {
                q.push(ev);
                true
            }
            None => false,
        });
    }

    /// A new reader: a queue of its own that gets every event raised from now on, until
    /// the returned handle is dropped.
    pub fn subscribe(&self) -> std::io::Result<Arc<FdQueue<AsyncEvent>>> {
        let q = Arc::new(FdQueue::new()?);
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&q));
        Ok(q)
    }

    /// Takes the next event (oldest first).
    pub fn pop(&self) -> Option<AsyncEvent> {
        self.queue.pop()
    }

    /// The fd, readable while events are pending; [`AsyncEvents::pop`] never blocks,
    /// whatever the fd's `O_NONBLOCK` flag (the caller's to set or clear).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.queue.fd()
    }
}

impl remem_verbs::AsyncEventQueue for FdQueue<AsyncEvent> {
    fn fd(&self) -> BorrowedFd<'_> {
        FdQueue::fd(self)
    }

    fn pop(&self) -> Option<AsyncEvent> {
        FdQueue::pop(self)
    }
}

/// A completion channel (`ibv_comp_channel`): CQ events in the order they fired, each
/// naming its CQ; the fd is readable while any is pending.
///
/// A CQ keeps its channel alive (so, unlike `ibv_destroy_comp_channel`, dropping the
/// channel's handle while CQs use it is not an error).
#[derive(Debug)]
pub struct SoftCompChannel {
    queue: FdQueue<CqId>,
    /// The device this channel belongs to.
    pub(crate) device_id: u64,
}

impl SoftCompChannel {
    /// A new channel of device `device_id`.
    pub fn new(device_id: u64) -> std::io::Result<Self> {
        Ok(SoftCompChannel {
            queue: FdQueue::new()?,
            device_id,
        })
    }

    /// Announces an event of CQ `id`.
    pub fn notify(&self, id: CqId) {
        self.queue.push(id);
    }

    /// Events not yet taken.
    #[cfg(any(test, feature = "internals"))]
    pub fn pending(&self) -> usize {
        self.queue.len()
    }
}

impl remem_verbs::CompletionChannel for SoftCompChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.queue.fd()
    }

    fn get_cq_event(&self) -> remem_verbs::Result<Option<CqId>> {
        Ok(self.queue.pop())
    }
}

/// Whether `fd` is readable now, asked of the kernel (a non-blocking `MSG_PEEK`).
#[cfg(test)]
pub(crate) fn readable(fd: BorrowedFd<'_>) -> bool {
    use rustix::net::{RecvFlags, recv};
    let mut b = [0u8; 1];
    match recv(fd, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok(_) => true,
        Err(e) if e == rustix::io::Errno::AGAIN => false,
        Err(e) => panic!("peek: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::{AsyncEventElement, AsyncEventType, CompletionChannel};
    use std::os::fd::AsRawFd;

    #[test]
    fn fd_is_readable_exactly_while_nonempty() {
        let q = FdQueue::new().unwrap();
        assert!(!readable(q.fd()));
        assert_eq!(q.pop(), None);
        q.push(1u32);
        q.push(2);
        assert!(readable(q.fd()));
        assert_eq!(q.pop(), Some(1));
        assert!(readable(q.fd()), "one item still waits");
        assert_eq!(q.pop(), Some(2));
        assert!(!readable(q.fd()));
        assert_eq!(q.pop(), None);
        q.push(3);
        assert!(readable(q.fd()));
    }

    /// Clears `O_NONBLOCK` on `fd` (through a duplicate: the flag belongs to the open file
    /// description both share), as a user of the fd may.
    fn make_blocking(fd: BorrowedFd<'_>) {
        let dup = UnixDatagram::from(fd.try_clone_to_owned().unwrap());
        dup.set_nonblocking(false).unwrap();
    }

    /// Runs `f` on a thread of its own; fails if it does not finish within 10 s (it would
    /// hang on a blocking read).
    fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{what} hung on a blocking fd"))
    }

    #[test]
    fn pop_never_blocks_when_the_user_made_the_fd_blocking() {
        let q = std::sync::Arc::new(FdQueue::new().unwrap());
        make_blocking(q.fd());
        let q2 = q.clone();
        let got = finishes("FdQueue::pop", move || {
            let empty = q2.pop();
            q2.push(1u32);
            q2.push(2);
            let a = q2.pop();
            let b = q2.pop(); // drains the readiness byte
            let c = q2.pop();
            (empty, a, b, c)
        });
        assert_eq!(got, (None, Some(1), Some(2), None));
        assert!(!readable(q.fd()));
        q.push(3);
        assert!(readable(q.fd()), "readiness survives the blocking fd");

        // The same through a completion channel and a device's async events.
        let ch = std::sync::Arc::new(SoftCompChannel::new(1).unwrap());
        make_blocking(ch.fd());
        let ch2 = ch.clone();
        let got = finishes("get_cq_event", move || {
            ch2.notify(CqId(4));
            (ch2.get_cq_event().unwrap(), ch2.get_cq_event().unwrap())
        });
        assert_eq!(got, (Some(CqId(4)), None));
        let ev = std::sync::Arc::new(AsyncEvents::new().unwrap());
        make_blocking(ev.fd());
        let ev2 = ev.clone();
        let e = AsyncEvent {
            event_type: AsyncEventType::PortActive,
            element: AsyncEventElement::Port(1),
        };
        let got = finishes("AsyncEvents::pop", move || {
            ev2.raise(e);
            (ev2.pop(), ev2.pop())
        });
        assert_eq!(got, (Some(e), None));

        // What a blocking `ibv_get_cq_event` does over it: poll until readable, then pop.
        let q = std::sync::Arc::new(FdQueue::new().unwrap());
        make_blocking(q.fd());
        let waiter = {
            let q = q.clone();
            move || {
                let fd = q.fd();
                let mut fds = [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::IN,
                )];
                rustix::event::poll(&mut fds, None).unwrap();
                q.pop()
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(waiter());
        });
        q.push(7u32);
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Ok(Some(7)), "the waiter woke with the item");
    }

    #[test]
    fn thousands_of_unread_events_are_kept() {
        // More than a datagram socket's send buffer holds (a few hundred datagrams).
        let ch = SoftCompChannel::new(1).unwrap();
        for i in 0..5000 {
            ch.notify(CqId(i));
        }
        assert_eq!(ch.pending(), 5000);
        for i in 0..5000 {
            assert!(readable(ch.fd()));
            assert_eq!(ch.get_cq_event().unwrap(), Some(CqId(i)));
        }
        assert!(!readable(ch.fd()));
        assert_eq!(ch.get_cq_event().unwrap(), None);
    }

    #[test]
    fn async_events_in_order() {
        let ev = AsyncEvents::new().unwrap();
        assert!(!readable(ev.fd()));
        let e = |n| AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            element: AsyncEventElement::Srq(n),
        };
        ev.raise(e(1));
        ev.raise(e(2));
        assert!(readable(ev.fd()));
        assert_eq!(ev.pop(), Some(e(1)));
        assert_eq!(ev.pop(), Some(e(2)));
        assert!(!readable(ev.fd()));
        assert_eq!(ev.pop(), None);
    }

    #[test]
    fn a_subscriber_gets_every_later_event_on_a_descriptor_of_its_own() {
        let ev = AsyncEvents::new().unwrap();
        let e = |n| AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            element: AsyncEventElement::Srq(n),
        };
        ev.raise(e(1));
        let sub = ev.subscribe().unwrap();
        assert_ne!(sub.fd().as_raw_fd(), ev.fd().as_raw_fd());
        assert!(
            !readable(sub.fd()),
            "only events raised after it subscribed"
        );
        ev.raise(e(2));
        assert!(readable(sub.fd()));
        assert_eq!(sub.pop(), Some(e(2)));
        assert!(!readable(sub.fd()));
        // The device's own queue still has both.
        assert_eq!(ev.pop(), Some(e(1)));
        assert_eq!(ev.pop(), Some(e(2)));
        // A dropped subscriber is forgotten at the next event.
        drop(sub);
        ev.raise(e(3));
        assert!(ev.subscribers.lock().unwrap().is_empty());
    }
}
