//! Posting work requests and routing their completions: the send queue's entries (each
//! tied to a registered 8-byte slot for a header or an atomic's result), the work requests
//! in flight, and those posted to complete silently.

use super::header::{Kind, MsgHeader};
use super::{ConnShared, lock};
use crate::error::{CloseReason, Error, LocalFailure, Result};
use crate::mr::{LocalMr, Span, register};
use remem_verbs::{
    AccessFlags, CompletionQueue, MemoryBuffer, ProtectionDomain, SendFlags, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// The most completions taken by one poll call (`RdmaBuilder::cqe_per_poll` is capped).
const MAX_PER_POLL: usize = 64;
/// Completions the first poll of a [`ConnShared::poll_cq`] call takes at most.
const FIRST_POLL: usize = 4;
/// `wr_id`s of receive buffers carry this bit; the rest is the buffer's index.
pub(crate) const RECV_TAG: u64 = 1 << 63;

/// Send-queue entries reserved for control messages, beyond the entries operations use:
/// one for the credit message (at most one is in flight; the keepalive's probe is one) and
/// one for the close message (sent once). Operations never take them, so whatever
/// operations hold — all of their entries, while messages wait for credits — a credit
/// return, a probe and a close always find an entry.
pub(crate) const CONTROL_RESERVE: u32 = 2;

/// The send queue: one permit per entry, and one registered 8-byte slot per entry; the
/// operations' entries and the control messages' ([`CONTROL_RESERVE`]) apart.
pub(crate) struct SendQueue {
    data: Pool,
    control: Pool,
    /// The entries operations may take (the QP has [`CONTROL_RESERVE`] more).
    depth: u32,
    /// A close message was posted (there is one per connection: its entry is reserved).
    close_posted: std::sync::atomic::AtomicBool,
}

/// Entries of one kind: their permits and slots.
struct Pool {
    permits: Arc<Semaphore>,
    slots: Arc<Slots>,
}

/// The registered slots, and which are free. There are as many as send-queue entries, and
/// a slot is free whenever its entry's permit is: a permit always finds its slots.
struct Slots {
    mr: LocalMr,
    free: Mutex<Vec<u32>>,
}

/// Send-queue entries held (for work requests about to be posted or in flight), each
/// with its slot; given back when dropped (the slots first, then the permits).
pub(crate) struct SqEntries {
    slots: Arc<Slots>,
    indices: Vec<u32>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for SqEntries {
    fn drop(&mut self) {
        lock(&self.slots.free).extend(self.indices.drain(..));
    }
}

impl SqEntries {
    /// The first entry's slot, as a span of the slots' region.
    pub(crate) fn slot(&self) -> Span {
        Span {
            inner: self.slots.mr.inner.clone(),
            offset: self.indices[0] as usize * 8,
            len: 8,
        }
    }

    /// The word in the first entry's slot (an atomic's result).
    fn word(&self) -> u64 {
        self.slots
            .mr
            .load_u64(self.indices[0] as usize * 8)
            .unwrap_or(0)
    }

    /// Writes `value` into the first entry's slot.
    pub(crate) fn set_word(&self, value: u64) -> Result<()> {
        self.slots
            .mr
            .store_u64(self.indices[0] as usize * 8, value)?;
        Ok(())
    }

    fn write_header(&self, h: &MsgHeader) -> Result<()> {
        self.slots
            .mr
            .write(self.indices[0] as usize * 8, &h.emit())?;
        Ok(())
    }
}

impl Pool {
    fn new(pd: &Arc<dyn ProtectionDomain>, n: u32) -> Result<Self> {
        let mr = register(
            pd,
            MemoryBuffer::zeroed(8 * n as usize)?,
            AccessFlags::LOCAL_WRITE,
        )?;
        Ok(Pool {
            permits: Arc::new(Semaphore::new(n as usize)),
            slots: Arc::new(Slots {
                mr,
                free: Mutex::new((0..n).rev().collect()),
            }),
        })
    }

    fn take(&self, permit: OwnedSemaphorePermit, n: u32) -> Option<SqEntries> {
        let mut free = lock(&self.slots.free);
        if free.len() < n as usize {
            return None;
        }
        let at = free.len() - n as usize;
        let indices = free.split_off(at);
        drop(free);
        Some(SqEntries {
            slots: self.slots.clone(),
            indices,
            _permit: permit,
        })
    }

    /// Waits for `n` free entries (`None` once the queue is closed).
    async fn acquire(&self, n: u32) -> Option<SqEntries> {
        let permit = self.permits.clone().acquire_many_owned(n).await.ok()?;
        self.take(permit, n)
    }

    /// One free entry now, if there is one (`None` also once the queue is closed).
    fn try_acquire(&self) -> Option<SqEntries> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        self.take(permit, 1)
    }
}

impl SendQueue {
    /// A send queue of `depth` entries for operations (at least one), and
    /// [`CONTROL_RESERVE`] for control messages: the QP's send queue must hold
    /// `depth + CONTROL_RESERVE` work requests.
    pub(crate) fn new(pd: &Arc<dyn ProtectionDomain>, depth: u32) -> Result<Self> {
        let depth = depth.max(1);
        Ok(SendQueue {
            data: Pool::new(pd, depth)?,
            control: Pool::new(pd, CONTROL_RESERVE)?,
            depth,
            close_posted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The entries operations may take.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// Takes all control entries that are free now (a test starves control messages).
    #[cfg(test)]
    pub(crate) fn take_control(&self) -> Vec<SqEntries> {
        std::iter::from_fn(|| self.control.try_acquire()).collect()
    }
}

/// How [`ConnShared::execute`] posts a work request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PostOpts {
    /// A message header of this kind (and immediate) goes in the entry's slot, with the
    /// credits owed to the peer.
    pub(crate) header: Option<(Kind, Option<u32>)>,
    /// Extra send flags (FENCE).
    pub(crate) flags: SendFlags,
}

/// One in-flight work request.
pub(crate) struct Pending {
    /// The waiting future, if it still waits.
    tx: Option<oneshot::Sender<(WorkCompletion, u64)>>,
    /// What must outlive the work request.
    keep: Keep,
    /// A credit message: the next one may go once it completes.
    credit_msg: bool,
    /// A close message: the QP goes to ERR once it is out.
    close_msg: bool,
    /// The last unsignaled work request posted before this one: released when this
    /// completes.
    release_upto: Option<u64>,
}

/// What a work request holds until it is done: its memory and its send-queue entries.
pub(crate) struct Keep {
    /// A close message sent as the connection is dropped keeps the connection alive until
    /// it is out (the dispatcher polls only a live connection).
    _owner: Option<Arc<ConnShared>>,
    _spans: Vec<Span>,
    sq: SqEntries,
}

/// The posting state of a connection.
pub(crate) struct Posting {
    pub(crate) sq: SendQueue,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Work requests posted to complete silently, in post order, with what they hold.
    unsignaled: Mutex<VecDeque<(u64, Keep)>>,
    next_wr: AtomicU64,
    /// Completions handled so far (the keepalive probes a connection that saw none).
    activity: AtomicU64,
    /// The operation timeout in nanoseconds; 0: none.
    op_timeout: AtomicU64,
    /// Why this side closes, for its close message: the connection's reason once the
    /// message is out, even if that is before whoever sent it records the reason.
    close_reason: Mutex<Option<CloseReason>>,
}

impl Posting {
    pub(crate) fn new(sq: SendQueue, op_timeout: Option<Duration>) -> Self {
        let p = Posting {
            sq,
            pending: Mutex::new(HashMap::new()),
            unsignaled: Mutex::new(VecDeque::new()),
            next_wr: AtomicU64::new(1),
            activity: AtomicU64::new(0),
            op_timeout: AtomicU64::new(0),
            close_reason: Mutex::new(None),
        };
        p.set_op_timeout(op_timeout);
        p
    }

    /// Sets the operation timeout (`None`: none; a zero one counts as the shortest).
    pub(crate) fn set_op_timeout(&self, t: Option<Duration>) {
        let nanos = t.map_or(0, |t| {
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1)
        });
        self.op_timeout.store(nanos, Ordering::Relaxed);
    }

    /// The operation timeout.
    pub(crate) fn op_timeout(&self) -> Option<Duration> {
        match self.op_timeout.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    /// When an operation starting now must be done by.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.op_timeout()
            .map(|t| tokio::time::Instant::now() + t.min(Duration::from_secs(1 << 32)))
    }

    /// The connection closed: waiters for entries fail.
    pub(crate) fn sq_close(&self) {
        self.sq.data.permits.close();
        self.sq.control.permits.close();
    }

    /// No signaled work request is in flight.
    pub(crate) fn idle(&self) -> bool {
        lock(&self.pending).is_empty()
    }

    /// Completions handled so far.
    pub(crate) fn activity(&self) -> u64 {
        self.activity.load(Ordering::Relaxed)
    }

    /// Records a work request about to be posted under a fresh `wr_id`.
    fn track(&self, pending: Pending) -> u64 {
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        lock(&self.pending).insert(wr_id, pending);
        wr_id
    }

    /// Releases the unsignaled work requests up to and including `wr_id` (they completed:
    /// a work request posted after them did). Returns whether `wr_id` itself was one.
    fn release_unsignaled(&self, wr_id: u64) -> bool {
        let mut q = lock(&self.unsignaled);
        let mut found = false;
        while q.front().is_some_and(|(id, _)| *id <= wr_id) {
            found |= q.pop_front().is_some_and(|(id, _)| id == wr_id);
        }
        found
    }
}

/// A credit spent for a message about to be posted: given back if it is dropped before
/// the message is posted ([`SpentCredit::posted`]).
pub(crate) struct SpentCredit<'a> {
    conn: &'a ConnShared,
    /// When the operation that spent it must be done by (its wait for the credit counted).
    deadline: Option<tokio::time::Instant>,
    armed: bool,
}

impl SpentCredit<'_> {
    /// The message is posted: the credit is spent for good.
    fn posted(mut self) {
        self.armed = false;
    }
}

impl Drop for SpentCredit<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.conn.msg.credits).unspend();
            self.conn.msg.credit_wait.notify_one();
        }
    }
}

/// A credit spent and a send-queue entry taken for a message about to be posted, owned (a
/// byte stream keeps the future that waits for them across polls): the credit goes back if
/// this is dropped unposted.
pub(crate) struct OwnedCredit {
    conn: Arc<ConnShared>,
    armed: bool,
}

impl OwnedCredit {
    /// The credit, to pass to [`ConnShared::post_signaled`] on `conn` (its own
    /// connection), which spends it for good once the message is posted, or gives it back.
    pub(crate) fn into_spent(mut self, conn: &ConnShared) -> SpentCredit<'_> {
        debug_assert!(std::ptr::eq(conn, &*self.conn));
        self.armed = false;
        SpentCredit {
            conn,
            deadline: None,
            armed: true,
        }
    }
}

impl Drop for OwnedCredit {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.conn.msg.credits).unspend();
            self.conn.msg.credit_wait.notify_one();
        }
    }
}

impl ConnShared {
    /// [`ConnShared::credited_entry`], owned and without the operation timeout (a stream
    /// waits for its peer to read as long as it takes).
    pub(crate) async fn credited_entry_owned(self: Arc<Self>) -> Result<(OwnedCredit, SqEntries)> {
        self.spend_credit().await?;
        let credit = OwnedCredit {
            conn: self.clone(),
            armed: true,
        };
        let sq = self.entries(1).await?;
        Ok((credit, sq))
    }

    /// [`ConnShared::credited_entry_owned`] if both are free now, without waiting (and
    /// without the allocation of a future); `None` if either is not (the credit goes back).
    pub(crate) fn try_credited_entry_owned(self: &Arc<Self>) -> Option<(OwnedCredit, SqEntries)> {
        if !self.is_open() || !lock(&self.msg.credits).try_spend() {
            return None;
        }
        let credit = OwnedCredit {
            conn: self.clone(),
            armed: true,
        };
        // (Dropped without an entry, the credit is given back.)
        let sq = self.post.sq.data.try_acquire()?;
        Some((credit, sq))
    }

    /// Waits for `n` free send-queue entries (fails once the connection is closed).
    pub(crate) async fn entries(&self, n: u32) -> Result<SqEntries> {
        self.post
            .sq
            .data
            .acquire(n)
            .await
            .ok_or_else(|| self.closed_error())
    }

    /// Waits for a credit, then for a send-queue entry, for a message that consumes a
    /// receive at the peer. The credit comes first: a message waiting for one holds no
    /// entry, so messages waiting for credits never keep the entries from operations that
    /// need none (nor, with [`CONTROL_RESERVE`], from the messages that return credits).
    /// Dropped while it waits for the entry, the credit goes back.
    pub(crate) async fn credited_entry(&self) -> Result<(SpentCredit<'_>, SqEntries)> {
        self.check_open()?;
        let deadline = self.post.deadline();
        match deadline {
            // Nothing is posted yet: a timeout here leaves the connection open.
            Some(at) => tokio::time::timeout_at(at, self.spend_credit())
                .await
                .map_err(|_| Error::Timeout("waiting for a credit"))??,
            None => self.spend_credit().await?,
        }
        let credit = SpentCredit {
            conn: self,
            deadline,
            armed: true,
        };
        let sq = self.entries(1).await?;
        Ok((credit, sq))
    }

    /// Posts one signaled work request on `sq` and waits for its completion; returns the
    /// word in the entry's slot at completion (an atomic's result).
    /// A message that consumes a receive at the peer comes with the credit it spent
    /// ([`ConnShared::credited_entry`]).
    pub(crate) async fn execute(
        self: &Arc<Self>,
        sq: SqEntries,
        op: SendOp,
        spans: Vec<Span>,
        opts: PostOpts,
        credit: Option<SpentCredit<'_>>,
    ) -> Result<u64> {
        self.check_open()?;
        let deadline = match &credit {
            Some(c) => c.deadline,
            None => self.post.deadline(),
        };
        let rx = self.post_signaled(sq, op, spans, opts, credit)?;
        self.outcome(rx, deadline).await
    }

    /// Posts one signaled work request on `sq` now, without waiting: returns where its
    /// completion (and the word in the entry's slot then) will arrive. The memory of
    /// `spans` and the entry stay held until the completion. Work requests posted by one
    /// caller one after another go in that order (RC executes and completes them so); a
    /// byte stream ([`crate::RdmaStream`]) posts its chunks so, without waiting for each.
    pub(crate) fn post_signaled(
        self: &Arc<Self>,
        sq: SqEntries,
        op: SendOp,
        spans: Vec<Span>,
        opts: PostOpts,
        credit: Option<SpentCredit<'_>>,
    ) -> Result<oneshot::Receiver<(WorkCompletion, u64)>> {
        // Nothing awaits from here to the post: a dropped future cannot lose the credit.
        let mut credits = 0;
        if let Some((kind, imm)) = opts.header {
            credits = lock(&self.msg.credits).take_owed();
            if let Err(e) = sq.write_header(&MsgHeader::new(kind, credits, imm)) {
                self.unpost(credits);
                return Err(e);
            }
        }
        let sges: Vec<Sge> = spans.iter().map(Span::sge).collect();
        let (tx, rx) = oneshot::channel();
        let mut pending = Pending {
            tx: Some(tx),
            keep: Keep {
                _owner: None,
                _spans: spans,
                sq,
            },
            credit_msg: false,
            close_msg: false,
            release_upto: None,
        };
        // Posted under the lock of the unsignaled queue, so that every unsignaled work
        // request in it went before this one: its completion releases them.
        let (wr_id, posted) = {
            let unsignaled = lock(&self.post.unsignaled);
            pending.release_upto = unsignaled.back().map(|(id, _)| *id);
            let wr_id = self.post.track(pending);
            let mut wr = SendWr::new(wr_id, op, &sges);
            wr.flags |= opts.flags;
            (wr_id, self.qp.post_send(&[wr]))
        };
        if let Err(e) = posted {
            lock(&self.post.pending).remove(&wr_id);
            self.unpost(credits);
            return Err(Error::Verbs(e.error));
        }
        if let Some(c) = credit {
            c.posted();
        }
        Ok(rx)
    }

    /// A message that was not posted after all: the credits it was to return go back
    /// (the credit it spent goes back as its [`SpentCredit`] is dropped).
    fn unpost(&self, returned: u16) {
        lock(&self.msg.credits).untake_owed(returned);
    }

    /// Waits for a posted work request's completion: its slot's word on success, else
    /// why it failed. Past `deadline` the connection closes (the work request may still be
    /// executed by the peer, as RDMA has it; its memory stays held until it is flushed)
    /// and the operation fails with [`Error::Timeout`].
    async fn outcome(
        &self,
        rx: oneshot::Receiver<(WorkCompletion, u64)>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<u64> {
        let done = match deadline {
            None => rx.await,
            Some(at) => match tokio::time::timeout_at(at, rx).await {
                Ok(done) => done,
                Err(_) => {
                    self.mark_closed(LocalFailure::Timeout.into());
                    return Err(Error::Timeout("operation"));
                }
            },
        };
        self.completed(done)
    }

    /// What a work request's completion (as [`ConnShared::post_signaled`] delivers it)
    /// says: its slot's word on success, else why it failed.
    pub(crate) fn completed(
        &self,
        done: std::result::Result<(WorkCompletion, u64), oneshot::error::RecvError>,
    ) -> Result<u64> {
        let (wc, word) = done.map_err(|_| self.closed_error())?;
        match wc.status {
            WcStatus::Success => Ok(word),
            WcStatus::WrFlushErr if !self.is_open() => Err(self.closed_error()),
            status => Err(Error::Completion {
                op: wc.opcode,
                status,
                vendor_err: wc.vendor_err,
            }),
        }
    }

    /// Posts one work request that completes silently on success ("completion on error
    /// only") and returns once it is posted. Its memory stays referenced until a later
    /// signaled work request completes (RC completes in order); every `depth / 2`th is
    /// signaled anyway, with nobody waiting, so that the send queue drains. A failure
    /// completes it with an error, which closes the connection.
    pub(crate) async fn post_unsignaled(
        self: &Arc<Self>,
        op: SendOp,
        spans: Vec<Span>,
        flags: SendFlags,
    ) -> Result<()> {
        self.check_open()?;
        let sq = self.entries(1).await?;
        let sges: Vec<Sge> = spans.iter().map(Span::sge).collect();
        let keep = Keep {
            _owner: None,
            _spans: spans,
            sq,
        };
        let depth = self.post.sq.depth().max(2);
        let every = u64::from(depth / 2);
        let mut unsignaled = lock(&self.post.unsignaled);
        let wr_id = self.post.next_wr.fetch_add(1, Ordering::Relaxed);
        let signal = (unsignaled.len() as u64 + 1).is_multiple_of(every);
        let mut wr = SendWr::new(wr_id, op, &sges);
        wr.flags = flags;
        if signal {
            wr.flags |= SendFlags::SIGNALED;
        }
        self.qp
            .post_send(&[wr])
            .map_err(|e| Error::Verbs(e.error))?;
        unsignaled.push_back((wr_id, keep));
        Ok(())
    }

    /// Posts `ops` with one `post_send`, only the last signaled (RC completes in order, so
    /// its completion means all are done; an error completes the failing one), and waits.
    pub(crate) async fn execute_batch(self: &Arc<Self>, ops: Vec<(SendOp, Span)>) -> Result<()> {
        let n = ops.len();
        if n == 0 {
            return Ok(());
        }
        let max = self.post.sq.depth() as usize;
        if n > max {
            return Err(Error::InvalidArgument(format!(
                "a batch of {n} work requests exceeds the send queue ({max})"
            )));
        }
        self.check_open()?;
        let deadline = self.post.deadline();
        let sq = self.entries(n as u32).await?;
        let sges: Vec<[Sge; 1]> = ops.iter().map(|(_, span)| [span.sge()]).collect();
        let (send_ops, spans): (Vec<SendOp>, Vec<Span>) = ops.into_iter().unzip();
        let (tx, rx) = oneshot::channel();
        let wr_id = self.post.track(Pending {
            tx: Some(tx),
            keep: Keep {
                _owner: None,
                _spans: spans,
                sq,
            },
            credit_msg: false,
            close_msg: false,
            release_upto: None,
        });
        let wrs: Vec<SendWr<'_>> = send_ops
            .iter()
            .zip(&sges)
            .enumerate()
            .map(|(i, (op, sge))| {
                let mut wr = SendWr::new(wr_id, *op, sge);
                if i + 1 < n {
                    wr.flags = SendFlags::empty();
                }
                wr
            })
            .collect();
        if let Err(e) = self.qp.post_send(&wrs) {
            if e.index == 0 {
                lock(&self.post.pending).remove(&wr_id);
            } else {
                // Part of the batch went, unsignaled: end the connection so that what went
                // is flushed and its memory released.
                tracing::warn!(index = e.index, error = %e.error, "a batch failed part-way");
                self.end(LocalFailure::Post);
            }
            return Err(Error::Verbs(e.error));
        }
        self.outcome(rx, deadline).await.map(drop)
    }

    /// Posts a control message (a credit message or a close: it needs no credit, it lands
    /// in a spare buffer) with no waiter, on an entry reserved for control messages
    /// ([`CONTROL_RESERVE`]), if the connection may send at all. There is one close
    /// message per connection: a later one is taken as already posted.
    pub(crate) fn post_control(self: &Arc<Self>, kind: Kind, imm: Option<u32>) -> Result<()> {
        if !self.confirmed() {
            return Err(Error::InvalidArgument(
                "the peer has not confirmed the connection".into(),
            ));
        }
        let close = kind == Kind::Close;
        if close && self.post.sq.close_posted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let posted = match self.post.sq.control.try_acquire() {
            Some(sq) => self.post_control_with(kind, imm, sq),
            None if self.is_open() => Err(Error::InvalidArgument(
                "the send queue's control entries are taken".into(),
            )),
            None => Err(self.closed_error()),
        };
        if close && posted.is_err() {
            self.post.sq.close_posted.store(false, Ordering::Release);
        }
        posted
    }

    /// Posts the close message (once per connection), with why this side closes.
    pub(crate) fn post_close(self: &Arc<Self>, reason: CloseReason) -> Result<()> {
        lock(&self.post.close_reason).get_or_insert(reason);
        self.post_control(Kind::Close, None)
    }

    /// [`ConnShared::post_control`] on a send-queue entry already taken.
    pub(crate) fn post_control_with(
        self: &Arc<Self>,
        kind: Kind,
        imm: Option<u32>,
        sq: SqEntries,
    ) -> Result<()> {
        let credits = lock(&self.msg.credits).take_owed();
        if let Err(e) = sq.write_header(&MsgHeader::new(kind, credits, imm)) {
            self.unpost(credits);
            return Err(e);
        }
        let hspan = sq.slot();
        let sges = [hspan.sge()];
        let wr_id = self.post.track(Pending {
            tx: None,
            keep: Keep {
                // A dropped connection stays alive until its close message is out, when a
                // dispatcher polls it (with Polling::Manual nothing would).
                _owner: (kind == Kind::Close && !self.rdma.dispatcher().is_manual())
                    .then(|| self.clone()),
                _spans: vec![hspan],
                sq,
            },
            credit_msg: kind == Kind::Credit,
            close_msg: kind == Kind::Close,
            release_upto: None,
        });
        if let Err(e) = self
            .qp
            .post_send(&[SendWr::new(wr_id, SendOp::Send, &sges)])
        {
            lock(&self.post.pending).remove(&wr_id);
            self.unpost(credits);
            return Err(Error::Verbs(e.error));
        }
        Ok(())
    }

    /// Polls the CQ until it is empty; returns how many completions it handled.
    pub(crate) fn poll_cq(self: &Arc<Self>) -> usize {
        let mut total = self.poll_one_cq(&self.cq);
        match (&self.msg.srq, &self.rcq) {
            (Some(_), _) => {} // the shared receive queue polls its own
            (None, Some(rcq)) => total += self.poll_one_cq(rcq),
            (None, None) => {}
        }
        total
    }

    fn poll_one_cq(self: &Arc<Self>, cq: &Arc<dyn CompletionQueue>) -> usize {
        let per_poll = self.rdma.config().cqe_per_poll.clamp(1, MAX_PER_POLL);
        // A busy-polling loop mostly finds nothing: its first look takes a few completions
        // into a small array, and only a full one is followed by polls of `per_poll` (the
        // arrays are initialised on every call: 48 bytes a completion).
        let mut first = [WorkCompletion::default(); FIRST_POLL];
        let first = &mut first[..per_poll.min(FIRST_POLL)];
        let Some(n) = self.poll_once(cq, first) else {
            return 0;
        };
        if n < first.len() {
            return n;
        }
        let mut buf = [WorkCompletion::default(); MAX_PER_POLL];
        let wcs = &mut buf[..per_poll];
        let mut total = n;
        while let Some(n) = self.poll_once(cq, wcs) {
            total += n;
            if n < wcs.len() {
                break;
            }
        }
        total
    }

    /// One poll of `cq` into `wcs`, and what it took handled: how many (`None` once the
    /// queue failed, which closes the connection).
    fn poll_once(
        self: &Arc<Self>,
        cq: &Arc<dyn CompletionQueue>,
        wcs: &mut [WorkCompletion],
    ) -> Option<usize> {
        let n = match cq.poll(wcs) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "polling a completion queue failed");
                self.mark_closed(LocalFailure::CompletionQueue.into());
                return None;
            }
        };
        for wc in &wcs[..n] {
            self.on_completion(wc);
        }
        if n > 0 {
            self.post.activity.fetch_add(n as u64, Ordering::Relaxed);
        }
        Some(n)
    }

    fn on_completion(self: &Arc<Self>, wc: &WorkCompletion) {
        if wc.wr_id & RECV_TAG != 0 {
            return self.on_receive(wc, (wc.wr_id & !RECV_TAG) as u32);
        }
        // (The pending map's lock is released before the unsignaled queue's is taken:
        // posting takes them in the other order.)
        let pending = lock(&self.post.pending).remove(&wc.wr_id);
        let Some(p) = pending else {
            // One posted to complete silently (signaled now and then, or failed).
            if self.post.release_unsignaled(wc.wr_id) && wc.status != WcStatus::Success {
                self.on_error_completion(wc);
            }
            self.retry_credits();
            return;
        };
        if let Some(upto) = p.release_upto {
            self.post.release_unsignaled(upto);
        }
        if p.close_msg {
            // This side is closing (`close`, a drop, a violation): closed before the QP
            // goes to the error state, so that its flushed receives end nothing.
            let reason = lock(&self.post.close_reason).clone();
            self.close_state(reason.unwrap_or(CloseReason::Local));
            self.to_error();
        }
        if p.credit_msg {
            lock(&self.msg.credits).credit_msg_done();
            self.maybe_return_credits();
        }
        if wc.status != WcStatus::Success {
            self.on_error_completion(wc);
        }
        if self.draining() {
            self.error_if_drained();
        }
        if let Some(tx) = p.tx {
            // The slot's word (an atomic's result) is read before the slot is freed.
            let _ = tx.send((*wc, p.keep.sq.word()));
        }
        drop(p.keep);
        // Entries are free again: a credit message that found none goes now.
        self.retry_credits();
    }

    /// A work request failed. While the connection is open that ends it — a flush error
    /// too: the QP went to the error state without this side moving it there (e.g. its
    /// responder NAKed the peer's bad request), and a connection that can no longer send or
    /// receive must not look open.
    pub(crate) fn on_error_completion(&self, wc: &WorkCompletion) {
        if self.is_open() {
            self.mark_closed(CloseReason::Completion {
                op: wc.opcode,
                status: wc.status,
            });
        }
    }
}
