//! Large messages (rendezvous): a message larger than the peer's receive buffers is
//! announced (`Rts`: an id and a token for its range, registered for remote reads only);
//! the receiver reads it with RDMA READ into memory of its own and says when it is done
//! (`RtsDone`), and the sender's registration ends.
//!
//! Both tables are pure state (no device, no runtime): [`RdvIn`], the receive side's
//! budget and queue, and [`RdvOut`], the sender's announcements awaiting "done".

use super::header::Kind;
use super::inbox::{Arrived, Payload, Place};
use super::lifecycle::reason_of;
use super::{ConnShared, Connection, lock};
use crate::error::{CloseReason, Error, LocalFailure, ProtocolViolation, Result};
use crate::mr::{RemoteMr, Span, register};
use remem_verbs::{AccessFlags, MemoryBuffer, SendOp};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Large messages in flight per direction.
pub(crate) const RDV_MAX: u32 = 4;

/// The receive side of large messages: announcements whose data this side has not
/// finished reading (at most [`RDV_MAX`], as the sender keeps), the bytes it holds (being
/// read, or read and not yet taken; at most `limit`), and announcements waiting for that
/// budget. `A` is what an announcement carries.
#[derive(Debug)]
pub(crate) struct RdvIn<A> {
    limit: u64,
    reading: u32,
    held: u64,
    waiting: VecDeque<(u64, A)>,
}

impl<A> RdvIn<A> {
    /// A table holding at most `limit` bytes at once.
    pub(crate) fn new(limit: u64) -> Self {
        RdvIn {
            limit,
            reading: 0,
            held: 0,
            waiting: VecDeque::new(),
        }
    }

    /// The peer announced a message of `len` bytes: `Some(a)` to start reading it now,
    /// `None` while it waits for the budget; a violation if it is above the limit or one
    /// announcement too many.
    pub(crate) fn announce(&mut self, len: u64, a: A) -> Result<Option<A>, ProtocolViolation> {
        if len > self.limit {
            return Err(ProtocolViolation::MessageTooLarge {
                len,
                max: self.limit,
            });
        }
        // The sender keeps at most RDV_MAX announcements unfinished; this side has not
        // said "done" for `reading` of them.
        if self.reading >= RDV_MAX {
            return Err(ProtocolViolation::TooManyLargeMessages { max: RDV_MAX });
        }
        self.reading += 1;
        if self.waiting.is_empty() && self.held + len <= self.limit {
            self.held += len;
            Ok(Some(a))
        } else {
            self.waiting.push_back((len, a));
            Ok(None)
        }
    }

    /// A message has been read (before the peer is told: it may announce the next one as
    /// soon as it hears).
    pub(crate) fn read_done(&mut self) {
        self.reading = self.reading.saturating_sub(1);
    }

    /// The application took (or dropped) a message of `len` bytes: announcements that now
    /// fit, in order, to be read.
    pub(crate) fn release(&mut self, len: u64) -> Vec<A> {
        self.held -= len.min(self.held);
        let mut start = Vec::new();
        while let Some((len, _)) = self.waiting.front() {
            if self.held + len > self.limit {
                break;
            }
            self.held += len;
            start.extend(self.waiting.pop_front().map(|(_, a)| a));
        }
        start
    }
}

/// The send side: announcements awaiting the peer's "done", by id.
#[derive(Debug)]
pub(crate) struct RdvOut<T> {
    next: u32,
    out: HashMap<u32, T>,
}

impl<T> Default for RdvOut<T> {
    fn default() -> Self {
        RdvOut {
            next: 1,
            out: HashMap::new(),
        }
    }
}

impl<T> RdvOut<T> {
    /// Records an announcement; its id.
    pub(crate) fn insert(&mut self, t: T) -> u32 {
        let rid = self.next;
        self.next = self.next.wrapping_add(1);
        self.out.insert(rid, t);
        rid
    }

    /// The peer is done with `rid` (or the announcement did not go).
    pub(crate) fn remove(&mut self, rid: u32) -> Option<T> {
        self.out.remove(&rid)
    }

    /// The connection closed: every announcement ends.
    pub(crate) fn clear(&mut self) {
        self.out.clear();
    }
}

/// A large message being read by the peer: its source stays registered (for remote reads
/// of exactly its range) until the peer says it is done.
pub(crate) struct Outgoing {
    done: oneshot::Sender<()>,
    _mr: Arc<dyn remem_verbs::MemoryRegion>,
    _span: Span,
    _permit: OwnedSemaphorePermit,
}

/// A large message announced by the peer.
pub(crate) struct Announced {
    rid: u32,
    token: RemoteMr,
    imm: Option<u32>,
    place: Place,
}

/// The large-message state of a connection.
pub(crate) struct Large {
    /// Announcements this side may have unfinished.
    out_slots: Arc<Semaphore>,
    out: Mutex<RdvOut<Outgoing>>,
    incoming: Mutex<RdvIn<Announced>>,
}

impl Large {
    pub(crate) fn new(limit: u64) -> Self {
        Large {
            out_slots: Arc::new(Semaphore::new(RDV_MAX as usize)),
            out: Mutex::new(RdvOut::default()),
            incoming: Mutex::new(RdvIn::new(limit)),
        }
    }

    /// The connection closed.
    pub(crate) fn close(&self) {
        self.out_slots.close();
        lock(&self.out).clear();
    }

    /// The peer finished reading `rid`.
    pub(crate) fn done(&self, rid: u32) {
        if let Some(out) = lock(&self.out).remove(rid) {
            let _ = out.done.send(());
        }
    }
}

/// Bytes of large messages a connection holds for the application: given back when
/// dropped.
struct LargeHold {
    conn: Weak<ConnShared>,
    len: u64,
}

impl Drop for LargeHold {
    fn drop(&mut self) {
        if let Some(c) = self.conn.upgrade() {
            c.release_large(self.len);
        }
    }
}

impl ConnShared {
    /// A large message announced: its place is kept in the order of messages, and it is
    /// read from the peer's memory on a task of its own as soon as the connection's
    /// large-message budget has room for it.
    pub(crate) fn on_rts(self: &Arc<Self>, payload: &[u8], imm: Option<u32>) {
        // (A token whose range wraps past 2^64 does not decode: `RemoteMr::decode`.)
        let (Some(rid), Some(token)) = (
            payload
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            payload.get(4..).and_then(RemoteMr::from_bytes),
        ) else {
            return self.end(ProtocolViolation::BadAnnouncement);
        };
        if self.runtime().is_none() {
            return self.fail_local(LocalFailure::NoRuntime);
        }
        let place = Arc::new(Mutex::new(None));
        let announced = Announced {
            rid,
            token,
            imm,
            place: place.clone(),
        };
        // The place is queued inside the budget's lock (the inbox's lock inside it): the
        // application's side takes them the other way round never — it gives a message's
        // bytes back to the budget after it let go of the inbox (`Connection::receive`).
        let start = {
            let mut rdv = lock(&self.large.incoming);
            let r = rdv.announce(token.len, announced);
            if r.is_ok() {
                self.deliver(place);
            }
            r
        };
        match start {
            Ok(Some(a)) => self.spawn_fetch(a),
            Ok(None) => {}
            Err(v) => self.end(v),
        }
    }

    fn spawn_fetch(self: &Arc<Self>, a: Announced) {
        match self.runtime() {
            Some(rt) => {
                rt.spawn(self.clone().fetch_large(a));
            }
            None => self.fail_local(LocalFailure::NoRuntime),
        }
    }

    /// The application took a large message (or it was dropped): its bytes leave the
    /// budget, and announcements that now fit are read.
    fn release_large(self: &Arc<Self>, len: u64) {
        let start = lock(&self.large.incoming).release(len);
        for a in start {
            self.spawn_fetch(a);
        }
    }

    async fn fetch_large(self: Arc<Self>, a: Announced) {
        let Announced {
            rid,
            token,
            imm,
            place,
        } = a;
        let read = async {
            let layout = std::alloc::Layout::from_size_align(token.len as usize, 1)
                .map_err(|_| CloseReason::Failed(LocalFailure::Memory))?;
            let dst = self
                .rdma
                .alloc_local_mr_uninit(layout)
                .map_err(|_| CloseReason::Failed(LocalFailure::Memory))?;
            let op = SendOp::RdmaRead {
                remote_addr: token.addr,
                rkey: token.rkey,
            };
            let sq = self.entries(1).await.map_err(|e| reason_of(&e))?;
            self.execute(
                sq,
                op,
                vec![crate::mr::Local::span(&dst)],
                Default::default(),
                None,
            )
            .await
            .map_err(|e| reason_of(&e))?;
            // Finished reading: the slot is free *before* the peer hears "done", since the
            // peer may announce its next large message as soon as it does (counted after
            // the post, that announcement could be taken for a fifth while the dispatcher
            // raced this task: seen on kernel rxe).
            lock(&self.large.incoming).read_done();
            let sq = self.entries(1).await.map_err(|e| reason_of(&e))?;
            self.post_control_with(Kind::RtsDone, Some(rid), sq)
                .map_err(|e| reason_of(&e))?;
            Ok::<_, CloseReason>(dst.to_vec())
        };
        match read.await {
            Ok(data) => {
                let hold = LargeHold {
                    conn: Arc::downgrade(&self),
                    len: token.len,
                };
                *lock(&place) = Some(Arrived {
                    payload: Payload::Owned(data),
                    imm,
                    _hold: Some(Box::new(hold)),
                });
                self.notify_messages();
            }
            Err(reason) => self.end(reason),
        }
    }
}

impl Connection {
    /// A message larger than the peer's receive buffers: the peer is told where it is
    /// (its range registered for remote reads only), reads it with RDMA READ, and says
    /// when it is done; then the registration ends.
    pub(crate) async fn send_large(&self, src: Span, imm: Option<u32>) -> Result<()> {
        let sh = &self.shared;
        let max = (sh.peer().max_large_message as usize).min(1 << 31);
        if src.len > max {
            return Err(Error::MessageTooLarge { len: src.len, max });
        }
        let permit = sh
            .large
            .out_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sh.closed_error())?;
        let mr = sh
            .rdma
            .pd()
            .reg_mr(src.region()?, AccessFlags::REMOTE_READ)?;
        let token = RemoteMr {
            addr: mr.addr(),
            len: src.len as u64,
            rkey: mr.rkey(),
            access: AccessFlags::REMOTE_READ,
        };
        let (done, finished) = oneshot::channel();
        // The entry, not this future, keeps the source registered: if the future is
        // dropped, the peer can still read until it says it is done.
        let rid = lock(&sh.large.out).insert(Outgoing {
            done,
            _mr: mr,
            _span: src,
            _permit: permit,
        });
        let mut announce = rid.to_be_bytes().to_vec();
        announce.extend_from_slice(&token.to_bytes());
        let scratch = register(
            sh.rdma.pd(),
            MemoryBuffer::from_vec(announce),
            AccessFlags::LOCAL_WRITE,
        );
        let announced = match scratch {
            Ok(scratch) => {
                sh.send_eager(Some(crate::mr::Local::span(&scratch)), Kind::Rts, imm)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = announced {
            lock(&sh.large.out).remove(rid);
            return Err(e);
        }
        finished.await.map_err(|_| sh.closed_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_bounds_what_is_read_ahead() {
        let mut t = RdvIn::new(100);
        assert_eq!(t.announce(60, 'a'), Ok(Some('a')));
        assert_eq!(t.announce(50, 'b'), Ok(None), "over the budget: waits");
        assert_eq!(
            t.announce(10, 'c'),
            Ok(None),
            "behind a waiting one: in order"
        );
        t.read_done();
        assert!(t.release(0).is_empty());
        assert_eq!(t.release(60), vec!['b', 'c']);
    }

    #[test]
    fn too_large_and_too_many_are_violations() {
        let mut t = RdvIn::new(100);
        assert_eq!(
            t.announce(101, ()),
            Err(ProtocolViolation::MessageTooLarge { len: 101, max: 100 })
        );
        for _ in 0..RDV_MAX {
            t.announce(1, ()).unwrap();
        }
        assert_eq!(
            t.announce(1, ()),
            Err(ProtocolViolation::TooManyLargeMessages { max: RDV_MAX })
        );
        t.read_done();
        assert!(t.announce(1, ()).is_ok(), "a finished read frees a place");
    }

    #[test]
    fn outgoing_ids_are_distinct() {
        let mut o = RdvOut::default();
        let a = o.insert("a");
        let b = o.insert("b");
        assert_ne!(a, b);
        assert_eq!(o.remove(a), Some("a"));
        assert_eq!(o.remove(a), None);
        o.clear();
        assert_eq!(o.remove(b), None);
    }
}
