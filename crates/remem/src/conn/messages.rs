//! Two-sided messages: the receive ring (or a shared receive queue), credits, the
//! inboxes the application takes messages from, and sending.
//!
//! # Messages and credits
//!
//! SEND and WRITE_WITH_IMM consume a receive at the peer. Each side posts `recv_depth`
//! receive buffers (plus spares for credit, close and large-message-done messages) and
//! tells the peer in the handshake; a sender spends a credit per message and waits when it
//! has none, so a fast sender never meets an empty receive queue. A credit returns to the
//! sender when the receiving application takes the message ([`Connection::receive`] and
//! friends): credits ride in the header of every message, or in a credit message of their
//! own when a quarter of the window is owed and nothing else is going that way
//! ([`CreditWindow`]). Receive buffers are reposted as soon as their data is copied out; a
//! peer that sends more messages than it was granted credits for breaks the protocol, and
//! the connection closes
//! ([`ProtocolViolation::CreditsExceeded`](crate::ProtocolViolation)). So what a peer can
//! make this side hold for messages the application has not taken is bounded: `recv_depth`
//! messages of up to `max_message` bytes, plus `max_large_message` bytes of large messages
//! (read from the peer's memory at most that many bytes ahead of the application).

use super::credits::CreditWindow;
use super::header::{Kind, MsgHeader};
use super::inbox::{Arrived, Inbox, Message, Payload, Place, Received, RecvRing, SlotOwner};
use super::posting::{PostOpts, RECV_TAG};
use super::srq::SrqShared;
use super::{ConnShared, Connection, lock};
use crate::error::{Error, ProtocolViolation, Result};
use crate::mr::{Local, LocalMr, RemoteMr, Span, register};
use remem_verbs::{AccessFlags, MemoryBuffer, RecvWr, SendOp, WcOpcode, WcStatus, WorkCompletion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::Notify;

/// The message state of a connection.
pub(crate) struct Messages {
    /// The connection's own receive buffers (none with a shared receive queue).
    pub(crate) ring: Option<RecvRing>,
    /// The shared receive queue receives come from, if any.
    pub(crate) srq: Option<Arc<SrqShared>>,
    pub(crate) credits: Mutex<CreditWindow>,
    /// Woken when credits return (or the connection closes).
    pub(crate) credit_wait: Notify,
    /// A credit message was due and could not be posted: it is tried again at the next
    /// completion of this side's work (or keepalive tick).
    pub(crate) credit_retry: AtomicBool,
    /// Messages in arrival order; a large one is a placeholder until it has been read.
    pub(crate) messages: Inbox<Place>,
    pub(crate) write_imms: Inbox<u32>,
    pub(crate) tokens: Inbox<RemoteMr>,
}

impl Messages {
    pub(crate) fn new(ring: Option<RecvRing>, srq: Option<Arc<SrqShared>>, window: u32) -> Self {
        Messages {
            ring,
            srq,
            credits: Mutex::new(CreditWindow::new(window)),
            credit_wait: Notify::new(),
            credit_retry: AtomicBool::new(false),
            messages: Inbox::new(true),
            write_imms: Inbox::new(true),
            tokens: Inbox::new(true),
        }
    }

    /// The connection closed: every waiter wakes.
    pub(crate) fn close(&self) {
        self.credit_wait.notify_waiters();
        self.messages.wake();
        self.write_imms.wake();
        self.tokens.wake();
    }
}

impl ConnShared {
    pub(crate) fn post_recv(&self, index: u32) -> Result<()> {
        let Some(ring) = &self.msg.ring else {
            return Ok(());
        };
        self.qp
            .post_recv(&[RecvWr {
                wr_id: RECV_TAG | u64::from(index),
                sg_list: &[ring.sge(index)],
            }])
            .map_err(|e| Error::Verbs(e.error))
    }

    /// A receive into one of the connection's own buffers. An application message stays
    /// in its buffer until the application takes it ([`Connection::receive`] copies it
    /// out, [`Connection::receive_buf`] hands the buffer over), and the buffer is posted
    /// again then: a message holds a buffer only while it holds a credit, so the peer
    /// never meets an empty receive queue. Every other message is copied out and its
    /// buffer posted again at once.
    pub(crate) fn on_receive(self: &Arc<Self>, wc: &WorkCompletion, index: u32) {
        let ok = wc.status == WcStatus::Success;
        let len = wc.byte_len as usize;
        let message = match &self.msg.ring {
            Some(ring) if ok && wc.opcode != WcOpcode::RecvRdmaWithImm => {
                match ring.header(index, len) {
                    Ok(h) if h.kind == Kind::Data => {
                        let owner: Weak<dyn SlotOwner> =
                            Arc::downgrade(self) as Weak<dyn SlotOwner>;
                        Some(Ok((h, Payload::Slot(ring.hold(index, len, owner)))))
                    }
                    _ => {
                        let m = ring.read(index, len);
                        let _ = self.post_recv(index);
                        Some(m)
                    }
                }
            }
            _ => {
                if ok {
                    let _ = self.post_recv(index);
                }
                None
            }
        };
        self.on_received(wc, message);
    }

    /// A receive completed, its message (if it carried one) already copied out of the
    /// buffer — one of the connection's own or one of a shared receive queue's.
    pub(crate) fn on_received(self: &Arc<Self>, wc: &WorkCompletion, message: Option<Received>) {
        if wc.status != WcStatus::Success {
            return self.on_error_completion(wc);
        }
        if wc.opcode == WcOpcode::RecvRdmaWithImm {
            if !self.take_credit() {
                return;
            }
            if self.awaits_hello() {
                return self.end(ProtocolViolation::Handshake);
            }
            self.msg.write_imms.push(wc.imm_data);
            return;
        }
        match message {
            Some(Ok((hdr, data))) => self.on_message(hdr, data),
            Some(Err(v)) => self.end(v),
            None => self.end(ProtocolViolation::NoHeader),
        }
    }

    /// A message that consumes a credit arrived: false (and the connection closes) if the
    /// peer had none left.
    fn take_credit(self: &Arc<Self>) -> bool {
        let r = lock(&self.msg.credits).on_received();
        match r {
            Ok(()) => true,
            Err(v) => {
                self.end(v);
                false
            }
        }
    }

    /// Queues a message (or the place of a large one still being read) for the
    /// application: at the shared receive queue if the connection has one.
    pub(crate) fn deliver(&self, place: Place) {
        match &self.msg.srq {
            Some(srq) => srq.messages.push((self.qp.qp_num(), place)),
            None => self.msg.messages.push(place),
        }
    }

    pub(crate) fn notify_messages(&self) {
        match &self.msg.srq {
            Some(srq) => srq.messages.wake(),
            None => self.msg.messages.wake(),
        }
    }

    /// A message (header and data) arrived.
    fn on_message(self: &Arc<Self>, hdr: MsgHeader, payload: Payload) {
        let kind = hdr.kind;
        if kind.credited() && !self.take_credit() {
            return;
        }
        if hdr.credits > 0 {
            let r = lock(&self.msg.credits).on_returned(hdr.credits);
            if let Err(v) = r {
                return self.end(v);
            }
            self.msg.credit_wait.notify_waiters();
        }
        let imm = hdr.imm;
        if kind == Kind::Hello || self.awaits_hello() {
            return self.on_hello(kind, payload.as_slice());
        }
        let data = payload.as_slice();
        match kind {
            Kind::Data => self.deliver(Arc::new(Mutex::new(Some(Arrived::new(payload, imm))))),
            Kind::Credit | Kind::Hello => {}
            Kind::MrToken => match RemoteMr::from_bytes(data) {
                Some(t) => self.msg.tokens.push(t),
                None => self.end(ProtocolViolation::BadRegionToken),
            },
            Kind::Close => self.on_peer_close(),
            Kind::Rts => self.on_rts(data, imm),
            Kind::Agent => {
                // Handled here, so its credit goes back at once.
                self.consumed();
                self.on_agent(data);
            }
            Kind::RtsDone => self.large.done(imm.unwrap_or(0)),
        }
    }

    /// The application took a message: its credit is owed to the peer.
    pub(crate) fn consumed(self: &Arc<Self>) {
        lock(&self.msg.credits).consumed();
        self.maybe_return_credits();
    }

    /// Sends a credit message when a quarter of the window is owed and none is in flight.
    /// One that cannot be posted now is tried again ([`ConnShared::retry_credits`]).
    pub(crate) fn maybe_return_credits(self: &Arc<Self>) {
        if !self.is_open() || !lock(&self.msg.credits).want_credit_msg() {
            return;
        }
        self.post_credit_msg();
    }

    /// Posts the credit message taken to be in flight; if it cannot go, it is not, and
    /// it is tried again later.
    fn post_credit_msg(self: &Arc<Self>) {
        if self.post_control(Kind::Credit, None).is_err() {
            lock(&self.msg.credits).credit_msg_done();
            if self.is_open() {
                self.msg.credit_retry.store(true, Ordering::Release);
            }
        }
    }

    /// Tries again a credit message that could not be posted (called at each completion
    /// of this side's work and each keepalive tick; cheap when there is none).
    pub(crate) fn retry_credits(self: &Arc<Self>) {
        if self.msg.credit_retry.load(Ordering::Acquire)
            && self.msg.credit_retry.swap(false, Ordering::AcqRel)
        {
            self.maybe_return_credits();
        }
    }

    /// Probes the peer (the keepalive): a credit message, unless one is in flight.
    pub(crate) fn probe(self: &Arc<Self>) {
        if lock(&self.msg.credits).want_probe() {
            self.post_credit_msg();
        }
    }

    /// Waits for a credit and spends it (fails once the connection is closed).
    pub(crate) async fn spend_credit(&self) -> Result<()> {
        loop {
            let returned = self.msg.credit_wait.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            self.check_open()?;
            if lock(&self.msg.credits).try_spend() {
                return Ok(());
            }
            returned.await;
        }
    }

    /// Sends a message that fits the peer's receive buffers.
    pub(crate) async fn send_eager(
        self: &Arc<Self>,
        src: Option<Span>,
        kind: Kind,
        imm: Option<u32>,
    ) -> Result<()> {
        let (credit, sq) = self.credited_entry().await?;
        let spans = std::iter::once(sq.slot()).chain(src).collect();
        let opts = PostOpts {
            header: Some((kind, imm)),
            ..PostOpts::default()
        };
        self.execute(sq, SendOp::Send, spans, opts, Some(credit))
            .await
            .map(drop)
    }

    /// Sends `bytes` as one message of `kind` (from a registered scratch region).
    pub(crate) async fn send_bytes(self: &Arc<Self>, kind: Kind, bytes: Vec<u8>) -> Result<()> {
        let scratch = register(
            self.rdma.pd(),
            MemoryBuffer::from_vec(bytes),
            AccessFlags::LOCAL_WRITE,
        )?;
        self.send_eager(Some(Local::span(&scratch)), kind, None)
            .await
    }

    /// Whether messages arrive at a shared receive queue rather than at the connection.
    pub(crate) fn uses_srq(&self) -> bool {
        self.msg.srq.is_some()
    }

    /// The message at the front of the inbox, if it is there and whole, without waiting;
    /// its credit is still owed ([`ConnShared::consumed`] returns it).
    pub(crate) fn try_take_message(&self) -> Option<Arrived> {
        let mut q = lock(&self.msg.messages.queue);
        let taken = q.front_mut().and_then(|p| lock(p).take());
        if taken.is_some() {
            q.pop_front();
        }
        taken
    }

    /// The next message, once it is there and whole (fails once the connection is closed
    /// and none is left); its credit is still owed ([`ConnShared::consumed`] returns it).
    pub(crate) async fn take_message(self: Arc<Self>) -> Result<Arrived> {
        let conn = self.clone();
        super::driven(
            &self,
            conn.take_uncredited(&conn.msg.messages, |p| lock(p).take()),
        )
        .await
    }

    /// Posts `data` (of the peer's `max_message` bytes at most) as a message of kind
    /// [`Kind::Data`] with `imm`, on a credit and an entry already taken, without waiting
    /// for its completion: messages posted so go in order.
    pub(crate) fn post_message(
        self: &Arc<Self>,
        credit: super::OwnedCredit,
        sq: super::SqEntries,
        data: Option<Span>,
        imm: Option<u32>,
    ) -> Result<tokio::sync::oneshot::Receiver<(WorkCompletion, u64)>> {
        let spans = std::iter::once(sq.slot()).chain(data).collect();
        let opts = PostOpts {
            header: Some((Kind::Data, imm)),
            ..PostOpts::default()
        };
        self.post_signaled(sq, SendOp::Send, spans, opts, Some(credit.into_spent(self)))
    }

    /// Takes the item at the front of `inbox` once `ready` gives it (waiting while the
    /// inbox is empty or its front is not ready); its credit goes back now.
    pub(crate) async fn take<T, R>(
        self: &Arc<Self>,
        inbox: &Inbox<T>,
        ready: impl Fn(&mut T) -> Option<R>,
    ) -> Result<R> {
        let r = self.take_uncredited(inbox, ready).await?;
        if inbox.credited {
            self.consumed();
        }
        Ok(r)
    }

    /// [`ConnShared::take`] without returning the item's credit: the caller does.
    pub(crate) async fn take_uncredited<T, R>(
        self: &Arc<Self>,
        inbox: &Inbox<T>,
        ready: impl Fn(&mut T) -> Option<R>,
    ) -> Result<R> {
        loop {
            let notified = inbox.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let taken = {
                let mut q = lock(&inbox.queue);
                let r = q.front_mut().and_then(&ready);
                if r.is_some() {
                    q.pop_front();
                }
                r
            };
            if let Some(r) = taken {
                return Ok(r);
            }
            self.check_open()?;
            notified.await;
        }
    }
}

impl SlotOwner for ConnShared {
    fn release(&self, index: u32) {
        // (A closed connection's QP refuses it or flushes it: nothing to do then.)
        let _ = self.post_recv(index);
    }
}

/// Returns a message's credit to the peer when dropped (after the message's receive
/// buffer was given back).
struct CreditOnDrop(Arc<ConnShared>);

impl Drop for CreditOnDrop {
    fn drop(&mut self) {
        self.0.consumed();
    }
}

/// A message received without a copy ([`Connection::receive_buf`]): its bytes in the
/// registered receive buffer they landed in, readable as `&[u8]`. Dropping it gives the
/// buffer back to the connection's receive queue and the message's credit back to the
/// peer — so while the application holds `recv_depth` of them, the peer waits.
///
/// (A large message, read from the peer's memory into memory of this side's, comes the
/// same way.)
pub struct RecvBuf {
    // Dropped in this order: the buffer goes back, then the credit, then a large
    // message's share of the budget.
    payload: Payload,
    imm: Option<u32>,
    _credit: CreditOnDrop,
    _hold: Option<Box<dyn Send + Sync>>,
}

impl RecvBuf {
    /// The immediate data, for SEND_WITH_IMM.
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }
}

impl std::ops::Deref for RecvBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.payload.as_slice()
    }
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        self.payload.as_slice()
    }
}

impl std::fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBuf")
            .field("len", &self.payload.as_slice().len())
            .field("imm", &self.imm)
            .finish_non_exhaustive()
    }
}

impl super::srq::SrqClient for ConnShared {
    fn on_received(self: Arc<Self>, wc: &WorkCompletion, message: Option<Received>) {
        ConnShared::on_received(&self, wc, message);
    }

    fn consumed(self: Arc<Self>) {
        ConnShared::consumed(&self);
    }

    fn fail(&self, reason: crate::error::LocalFailure) {
        self.fail_local(reason);
    }
}

impl Connection {
    async fn send_message(&self, src: Option<Span>, kind: Kind, imm: Option<u32>) -> Result<()> {
        let len = src.as_ref().map_or(0, |s| s.len);
        let max = self.shared.peer().max_message as usize;
        if len > max {
            return match (kind, src) {
                (Kind::Data, Some(src)) => self.send_large(src, imm).await,
                _ => Err(Error::MessageTooLarge { len, max }),
            };
        }
        self.shared.send_eager(src, kind, imm).await
    }

    /// Sends `src` as one message (SEND); the peer takes it with [`Connection::receive`].
    /// Waits for a credit when the peer has no free receive buffer for it. A message
    /// larger than the peer's receive buffers ([`crate::RdmaBuilder::max_message`]) is
    /// read by the peer straight from `src` (RDMA READ), up to 2^31 bytes; the future
    /// ends when the peer has it. A message larger than the peer accepts (its
    /// [`crate::RdmaBuilder::max_large_message`]) is an [`Error::MessageTooLarge`], and
    /// nothing is sent.
    pub async fn send(&self, src: &impl Local) -> Result<()> {
        self.send_message(Some(src.span()), Kind::Data, None).await
    }

    /// Sends `src` with immediate data `imm` (SEND_WITH_IMM).
    pub async fn send_with_imm(&self, src: &impl Local, imm: u32) -> Result<()> {
        self.send_message(Some(src.span()), Kind::Data, Some(imm))
            .await
    }

    /// The next message the peer sent. (On a connection with a shared receive queue,
    /// messages arrive at [`Srq::receive`](crate::Srq::receive) instead: this is an error
    /// there.)
    ///
    /// **Cancel safe**: a message is taken from the connection's queue only in the poll
    /// that returns it, so dropping the future (a `tokio::select!` whose other branch won,
    /// a timeout) loses nothing — a message that arrived meanwhile waits for the next
    /// `receive`, in order. Taking it returns its credit to the peer; a peer whose
    /// messages are not taken waits once it has used the credits this side granted
    /// ([`RdmaBuilder::recv_depth`](crate::RdmaBuilder::recv_depth)). Fails with
    /// [`Error::Closed`] once the connection is closed or lost, with the reason (a peer
    /// that died: see [the peer died](crate::Error#the-peer-died)).
    pub async fn receive(&self) -> Result<Message> {
        if self.shared.msg.srq.is_some() {
            return Err(Error::InvalidArgument(
                "this connection's messages arrive at its shared receive queue (Srq::receive)"
                    .into(),
            ));
        }
        // Copied out (and its buffer given back) before its credit goes back. (A large
        // message's share of the budget goes back as it is dropped.) Both happen after the
        // inbox's lock is released: giving bytes back to the budget takes the budget's lock,
        // which the dispatcher holds while it queues an announced message's place in the
        // inbox (lock order: the budget, then the inbox; never the inbox, then the budget).
        let sh = &self.shared;
        let arrived = sh
            .take_uncredited(&sh.msg.messages, |m| lock(m).take())
            .await?;
        let message = arrived.into_message();
        if sh.msg.messages.credited {
            sh.consumed();
        }
        Ok(message)
    }

    /// The next message the peer sent, without a copy: its bytes in the registered
    /// receive buffer they landed in ([`RecvBuf`] derefs to `&[u8]`). Dropping it gives
    /// the buffer back and returns the message's credit to the peer. [`Connection::receive`]
    /// and this take from the same queue of messages. Cancel safe, as
    /// [`Connection::receive`] is.
    ///
    /// ```
    /// # use remem::RdmaBuilder;
    /// # fn main() -> Result<(), remem::Error> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// # let server = RdmaBuilder::new().device("soft@127.0.0.7:0").build()?;
    /// # let client = RdmaBuilder::new().device("soft@127.0.0.8:0").build()?;
    /// # let listener = server.listen("127.0.0.1:0").await?;
    /// # let addr = listener.local_addr()?;
    /// # let (c, s) = tokio::join!(client.connect(addr), listener.accept());
    /// # let (c, s) = (c?, s?);
    /// // Sent from a plain slice (copied into a registered buffer inside) ...
    /// c.send_bytes(b"no copy on this side").await?;
    /// // ... and read where it landed.
    /// let msg = s.receive_buf().await?;
    /// assert_eq!(&msg[..], b"no copy on this side");
    /// drop(msg); // the buffer goes back to the receive queue
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub async fn receive_buf(&self) -> Result<RecvBuf> {
        let sh = &self.shared;
        if sh.msg.srq.is_some() {
            return Err(Error::InvalidArgument(
                "this connection's messages arrive at its shared receive queue (Srq::receive)"
                    .into(),
            ));
        }
        let arrived = sh
            .take_uncredited(&sh.msg.messages, |m| lock(m).take())
            .await?;
        Ok(RecvBuf {
            payload: arrived.payload,
            imm: arrived.imm,
            _credit: CreditOnDrop(sh.clone()),
            _hold: arrived._hold,
        })
    }

    /// Sends `data` as one message, as [`Connection::send`] does, from memory that needs no
    /// registration (a slice, a `Vec<u8>`, a `bytes::Bytes`): the bytes are copied into a
    /// registered buffer of this side's pool ([`Rdma::alloc_local_mr`](crate::Rdma::alloc_local_mr))
    /// inside, so the caller copies nothing. Larger than the peer's receive buffers, it is
    /// read by the peer from that copy.
    ///
    /// ```
    /// # use remem::RdmaBuilder;
    /// # fn main() -> Result<(), remem::Error> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// # let server = RdmaBuilder::new().device("soft@127.0.0.9:0").build()?;
    /// # let client = RdmaBuilder::new().device("soft@127.0.0.10:0").build()?;
    /// # let listener = server.listen("127.0.0.1:0").await?;
    /// # let addr = listener.local_addr()?;
    /// # let (c, s) = tokio::join!(client.connect(addr), listener.accept());
    /// # let (c, s) = (c?, s?);
    /// let payload = bytes::Bytes::from_static(b"from Bytes");
    /// c.send_bytes(&payload).await?;
    /// c.send_bytes_with_imm(vec![1, 2, 3], 7).await?;
    /// assert_eq!(s.receive().await?.data, b"from Bytes");
    /// let m = s.receive().await?;
    /// assert_eq!((m.data, m.imm), (vec![1, 2, 3], Some(7)));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub async fn send_bytes(&self, data: impl AsRef<[u8]>) -> Result<()> {
        self.send_copied(data.as_ref(), None).await
    }

    /// [`Connection::send_bytes`] with immediate data `imm` (SEND_WITH_IMM).
    pub async fn send_bytes_with_imm(&self, data: impl AsRef<[u8]>, imm: u32) -> Result<()> {
        self.send_copied(data.as_ref(), Some(imm)).await
    }

    async fn send_copied(&self, data: &[u8], imm: Option<u32>) -> Result<()> {
        if data.is_empty() {
            return self.send_message(None, Kind::Data, imm).await;
        }
        let layout = std::alloc::Layout::from_size_align(data.len(), 1)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let buf = self.shared.rdma.alloc_local_mr_uninit(layout)?;
        buf.write(0, data)?;
        self.send_message(Some(buf.span()), Kind::Data, imm).await
    }

    /// The immediate data of the next RDMA WRITE_WITH_IMM the peer did
    /// ([`Connection::write_with_imm`]), in the order the peer did them; the write's bytes
    /// are in this side's region when its immediate is here.
    ///
    /// **Cancel safe**, as [`Connection::receive`] is: an immediate is taken only in the
    /// poll that returns it, so a dropped future (a `select!` branch that lost) loses none.
    /// Taking one returns a credit to the peer: a peer whose immediates are not taken
    /// waits once it holds this side's [`RdmaBuilder::recv_depth`](crate::RdmaBuilder::recv_depth)
    /// (32 by default) of immediates and messages not taken.
    pub async fn receive_write_imm(&self) -> Result<u32> {
        self.shared
            .take(&self.shared.msg.write_imms, |i| Some(*i))
            .await
    }

    /// Shares `mr` with the peer while this side keeps it: the peer receives a token
    /// ([`Connection::receive_shared_mr`]) with which it reaches the whole region with the
    /// rights `mr` was registered with, for as long as `mr` lives. To give a region away
    /// (ownership passes), use [`Connection::send_local_mr`].
    pub async fn share_local_mr(&self, mr: &LocalMr) -> Result<()> {
        let token = mr.token(self.shared.rdma.pd())?.to_bytes();
        self.shared.send_bytes(Kind::MrToken, token.to_vec()).await
    }

    /// The next memory region the peer shared with [`Connection::share_local_mr`].
    pub async fn receive_shared_mr(&self) -> Result<RemoteMr> {
        self.shared
            .take(&self.shared.msg.tokens, |t| Some(*t))
            .await
    }
}
