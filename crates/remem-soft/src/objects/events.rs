//! Async events of a device and the readable file descriptor that announces them.

use remem_verbs::AsyncEvent;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;

/// A queue of async events whose fd is readable while events are pending.
#[derive(Debug)]
pub struct AsyncEvents {
    queue: Mutex<VecDeque<AsyncEvent>>,
    rx: UnixDatagram,
    tx: UnixDatagram,
}

impl AsyncEvents {
    /// An empty queue.
    pub fn new() -> std::io::Result<Self> {
        let (rx, tx) = UnixDatagram::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        Ok(AsyncEvents {
            queue: Mutex::new(VecDeque::new()),
            rx,
            tx,
        })
    }

    /// Raises an event.
    pub fn raise(&self, ev: AsyncEvent) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(ev);
        let _ = self.tx.send(&[1]);
    }

    /// Takes the next event.
    pub fn pop(&self) -> Option<AsyncEvent> {
        let ev = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()?;
        let _ = self.rx.recv(&mut [0u8; 1]);
        Some(ev)
    }

    /// The fd, readable while events are pending.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

/// A completion channel (`ibv_comp_channel`): one datagram per CQ event, carrying the CQ id.
#[derive(Debug)]
pub struct SoftCompChannel {
    rx: UnixDatagram,
    tx: UnixDatagram,
    /// The device this channel belongs to.
    pub(crate) device_id: u64,
}

impl SoftCompChannel {
    /// A new channel.
    pub fn new(device_id: u64) -> std::io::Result<Self> {
        let (rx, tx) = UnixDatagram::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        Ok(SoftCompChannel { rx, tx, device_id })
    }

    /// Announces an event of CQ `id`.
    pub fn notify(&self, id: u32) {
        let _ = self.tx.send(&id.to_ne_bytes());
    }
}

impl remem_verbs::CompletionChannel for SoftCompChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    fn get_cq_event(&self) -> remem_verbs::Result<Option<remem_verbs::CqId>> {
        let mut b = [0u8; 4];
        match self.rx.recv(&mut b) {
            Ok(4) => Ok(Some(remem_verbs::CqId(u32::from_ne_bytes(b)))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
