//! Async events of a device, completion channels, and the readable file descriptor that
//! announces both.
//!
//! Both are [`FdQueue`]s: the events themselves wait in process memory and a socket pair
//! only carries readiness — one byte sits in it exactly while the queue holds something.
//! Sending one datagram per event instead would lose events once a few hundred are unread
//! (a datagram socket's send buffer fills, and a non-blocking send fails), whereas the
//! kernel's own event queues (`ib_uverbs`) are unbounded lists.

use remem_verbs::{AsyncEvent, CqId};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;

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
            s.signalled = self.tx.send(&[1]).is_ok();
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
                // Drain: normally exactly our one byte.
                while self.rx.recv(&mut [0u8; 1]).is_ok() {}
                s.signalled = false;
            }
        } else {
            self.signal(&mut s);
        }
        item
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .queue
            .len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fd, readable while items are waiting.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

/// A device's async event queue (what `ibv_get_async_event` reads); the context's
/// `async_fd` is readable while events are pending.
#[derive(Debug)]
pub struct AsyncEvents {
    queue: FdQueue<AsyncEvent>,
}

impl AsyncEvents {
    /// An empty queue.
    pub fn new() -> std::io::Result<Self> {
        Ok(AsyncEvents {
            queue: FdQueue::new()?,
        })
    }

    /// Raises an event.
    pub fn raise(&self, ev: AsyncEvent) {
        self.queue.push(ev);
    }

    /// Takes the next event (oldest first).
    pub fn pop(&self) -> Option<AsyncEvent> {
        self.queue.pop()
    }

    /// The fd, readable while events are pending.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.queue.fd()
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
}
