//! What the message layer shares with shared receive queues: the receive ring (registered
//! buffers receives land in), received messages, and the inboxes the application takes
//! them from. A leaf: it knows nothing of connections or queues.

use super::header::{HDR, MsgHeader};
use crate::error::{ProtocolViolation, Result};
use crate::mr::{LocalMr, register};
use remem_verbs::{AccessFlags, MemoryBuffer, ProtectionDomain, Sge};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
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

/// Who gives a receive buffer back to its queue once its message is done with.
pub(crate) trait SlotOwner: Send + Sync {
    /// Buffer `index` is free again: post it.
    fn release(&self, index: u32);
}

/// A message's bytes left in the receive buffer they landed in: the buffer is not posted
/// again until this is dropped, so nothing writes to it meanwhile.
pub(crate) struct SlotHold {
    buf: Arc<MemoryBuffer>,
    offset: usize,
    len: usize,
    index: u32,
    owner: Weak<dyn SlotOwner>,
}

impl SlotHold {
    /// The message's bytes.
    #[allow(unsafe_code)]
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.buf.check(self.offset, self.len).is_err() || self.len == 0 {
            return &[];
        }
        // SAFETY: the range lies inside the buffer (checked above), which `self.buf` keeps
        // allocated, and nothing writes to it while `self` lives: it is part of one
        // receive buffer of a ring (`RecvRing`), registered for local write only (no peer
        // can write it), written only by a receive posted on it — and that buffer is not
        // posted again until `self` is dropped (`SlotOwner::release`), which cannot happen
        // while the returned borrow of `self` lives. The NIC's writes into it (the
        // receive that completed) happen-before this read: the completion was taken from
        // the completion queue, under the queue's synchronisation, before `self` was
        // made. Slots are 64-byte aligned in a page-aligned buffer, so no atomic word the
        // provider writes for a neighbouring buffer overlaps these bytes.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(self.offset), self.len) }
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.upgrade() {
            owner.release(self.index);
        }
    }
}

/// A received message's bytes: copied out, or still in its receive buffer.
pub(crate) enum Payload {
    Owned(Vec<u8>),
    Slot(SlotHold),
}

impl Payload {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Owned(v) => v,
            Payload::Slot(s) => s.bytes(),
        }
    }

    /// The bytes as a vector: copied out of a receive buffer, which is then given back.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Payload::Owned(v) => v,
            Payload::Slot(s) => s.bytes().to_vec(),
        }
    }
}

/// A message that arrived, with (for a large one) its share of the connection's
/// large-message budget, given back when the application takes it (dropped with it).
pub(crate) struct Arrived {
    pub(crate) payload: Payload,
    pub(crate) imm: Option<u32>,
    pub(crate) _hold: Option<Box<dyn Send + Sync>>,
}

impl Arrived {
    pub(crate) fn new(payload: Payload, imm: Option<u32>) -> Self {
        Arrived {
            payload,
            imm,
            _hold: None,
        }
    }

    /// The message, its bytes copied out (its receive buffer given back).
    pub(crate) fn into_message(self) -> Message {
        Message {
            data: self.payload.into_vec(),
            imm: self.imm,
        }
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
pub(crate) type Received = std::result::Result<(MsgHeader, Payload), ProtocolViolation>;

/// Receive buffers in one registered region: `depth` slots of a header and
/// `max_message` bytes (each starting on a 64-byte boundary), posted to a queue pair or to
/// a shared receive queue by index.
pub(crate) struct RecvRing {
    mr: LocalMr,
    /// The registered buffer, and where the region starts in it.
    buf: Arc<MemoryBuffer>,
    base: usize,
    /// Bytes a buffer takes (a header and `max_message`).
    slot: usize,
    /// Bytes from one buffer to the next.
    stride: usize,
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
        let stride = slot.next_multiple_of(64);
        let mr = register(
            pd,
            MemoryBuffer::zeroed(stride * depth.max(1) as usize)?,
            AccessFlags::LOCAL_WRITE,
        )?;
        let region = crate::mr::Local::span(&mr).region()?;
        Ok(RecvRing {
            buf: region.buffer().clone(),
            base: region.offset(),
            mr,
            slot,
            stride,
            depth,
        })
    }

    /// Buffers in the ring.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The scatter/gather entry of buffer `index`.
    pub(crate) fn sge(&self, index: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + (index as usize * self.stride) as u64,
            length: self.slot as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// Whether `p` points into the ring's buffers.
    #[cfg(test)]
    pub(crate) fn contains(&self, p: *const u8) -> bool {
        let start = self.buf.as_ptr() as usize + self.base;
        (start..start + self.stride * self.depth as usize).contains(&(p as usize))
    }

    /// The header of the message of `len` bytes that landed in buffer `index`.
    pub(crate) fn header(&self, index: u32, len: usize) -> Result<MsgHeader, ProtocolViolation> {
        let base = index as usize * self.stride;
        let mut hdr = [0u8; HDR];
        if len < HDR || len > self.slot || self.mr.read(base, &mut hdr).is_err() {
            return Err(ProtocolViolation::NoHeader);
        }
        MsgHeader::parse(&hdr)
    }

    /// The message of `len` bytes that landed in buffer `index`, copied out.
    pub(crate) fn read(&self, index: u32, len: usize) -> Received {
        let header = self.header(index, len)?;
        let mut data = vec![0u8; len - HDR];
        self.mr
            .read(index as usize * self.stride + HDR, &mut data)
            .map_err(|_| ProtocolViolation::NoHeader)?;
        Ok((header, Payload::Owned(data)))
    }

    /// The message of `len` bytes that landed in buffer `index`, left there: the buffer
    /// is given back to `owner` when the returned hold is dropped. (`len` was checked by
    /// [`RecvRing::header`].)
    pub(crate) fn hold(&self, index: u32, len: usize, owner: Weak<dyn SlotOwner>) -> SlotHold {
        SlotHold {
            buf: self.buf.clone(),
            offset: self.base + index as usize * self.stride + HDR,
            len: len.saturating_sub(HDR),
            index,
            owner,
        }
    }
}
