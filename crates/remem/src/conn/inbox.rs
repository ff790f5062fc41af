//! What the message layer shares with shared receive queues: the receive ring (registered
//! buffers receives land in), received messages, and the inboxes the application takes
//! them from. A leaf: it knows nothing of connections or queues.

use super::header::{HDR, MsgHeader};
use crate::error::{ProtocolViolation, Result};
use crate::mr::{LocalMr, register};
use remem_verbs::{AccessFlags, MemoryBuffer, ProtectionDomain, Sge};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A message received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its bytes.
    pub data: Vec<u8>,
    /// The immediate data, for SEND_WITH_IMM.
    pub imm: Option<u32>,
}

/// A message that arrived, with (for a large one) its share of the connection's
/// large-message budget, given back when the application takes it (dropped with it).
pub(crate) struct Arrived {
    pub(crate) msg: Message,
    pub(crate) _hold: Option<Box<dyn Send + Sync>>,
}

impl Arrived {
    pub(crate) fn new(msg: Message) -> Self {
        Arrived { msg, _hold: None }
    }
}

/// A message's place in the order of messages: empty while a large message is read.
pub(crate) type Place = Arc<Mutex<Option<Arrived>>>;

/// A queue of things that arrived, and who waits for them.
pub(crate) struct Inbox<T> {
    pub(crate) queue: Mutex<VecDeque<T>>,
    pub(crate) notify: Notify,
    /// Whether taking an item returns a credit to the peer (its message used one and is
    /// still owed).
    pub(crate) credited: bool,
}

/// An inbox whose items owe no credit (their messages were acknowledged on arrival).
impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Self::new(false)
    }
}

impl<T> Inbox<T> {
    pub(crate) fn new(credited: bool) -> Self {
        Inbox {
            queue: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            credited,
        }
    }

    pub(crate) fn push(&self, item: T) {
        lock(&self.queue).push_back(item);
        self.wake();
    }

    /// Wakes every waiter (the front may have become ready, or the connection closed).
    pub(crate) fn wake(&self) {
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

/// What a receive brought: a header and its data, or why it is not a message.
pub(crate) type Received = std::result::Result<(MsgHeader, Vec<u8>), ProtocolViolation>;

/// Receive buffers in one registered region: `depth` slots of a header and
/// `max_message` bytes, posted to a queue pair or to a shared receive queue by index.
pub(crate) struct RecvRing {
    mr: LocalMr,
    slot: usize,
    depth: u32,
}

impl RecvRing {
    /// A ring of `depth` buffers taking messages of up to `max_message` bytes.
    pub(crate) fn new(
        pd: &Arc<dyn ProtectionDomain>,
        max_message: usize,
        depth: u32,
    ) -> Result<Self> {
        let slot = HDR + max_message;
        let mr = register(
            pd,
            MemoryBuffer::zeroed(slot * depth.max(1) as usize)?,
            AccessFlags::LOCAL_WRITE,
        )?;
        Ok(RecvRing { mr, slot, depth })
    }

    /// Buffers in the ring.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The scatter/gather entry of buffer `index`.
    pub(crate) fn sge(&self, index: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + (index as usize * self.slot) as u64,
            length: self.slot as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// The message of `len` bytes that landed in buffer `index`, copied out.
    pub(crate) fn read(&self, index: u32, len: usize) -> Received {
        let base = index as usize * self.slot;
        let mut hdr = [0u8; HDR];
        if len < HDR || len > self.slot || self.mr.read(base, &mut hdr).is_err() {
            return Err(ProtocolViolation::NoHeader);
        }
        let header = MsgHeader::parse(&hdr)?;
        let mut data = vec![0u8; len - HDR];
        self.mr
            .read(base + HDR, &mut data)
            .map_err(|_| ProtocolViolation::NoHeader)?;
        Ok((header, data))
    }
}
