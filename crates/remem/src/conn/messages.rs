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
use super::inbox::{Arrived, Inbox, Message, Place, Received, RecvRing};
use super::posting::{PostOpts, RECV_TAG};
use super::srq::SrqShared;
use super::{ConnShared, Connection, lock};
use crate::error::{Error, ProtocolViolation, Result};
use crate::mr::{Local, LocalMr, RemoteMr, Span, register};
use remem_verbs::{AccessFlags, MemoryBuffer, RecvWr, SendOp, WcOpcode, WcStatus, WorkCompletion};
use std::sync::{Arc, Mutex};
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

    /// A receive into one of the connection's own buffers: its message is copied out and
    /// the buffer posted again at once (what the application has not taken is bounded by
    /// the credits).
    pub(crate) fn on_receive(self: &Arc<Self>, wc: &WorkCompletion, index: u32) {
        let ok = wc.status == WcStatus::Success;
        let message = match &self.msg.ring {
            Some(ring) if ok && wc.opcode != WcOpcode::RecvRdmaWithImm => {
                Some(ring.read(index, wc.byte_len as usize))
            }
            _ => None,
        };
        if ok {
            let _ = self.post_recv(index);
        }
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
    fn on_message(self: &Arc<Self>, hdr: MsgHeader, data: Vec<u8>) {
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
            return self.on_hello(kind, &data);
        }
        match kind {
            Kind::Data => self.deliver(Arc::new(Mutex::new(Some(Arrived::new(Message {
                data,
                imm,
            }))))),
            Kind::Credit | Kind::Hello => {}
            Kind::MrToken => match RemoteMr::from_bytes(&data) {
                Some(t) => self.msg.tokens.push(t),
                None => self.end("peer sent a malformed memory region token".to_string()),
            },
            Kind::Close => self.on_peer_close(),
            Kind::Rts => self.on_rts(&data, imm),
            Kind::Agent => {
                // Handled here, so its credit goes back at once.
                self.consumed();
                self.on_agent(&data);
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
    pub(crate) fn maybe_return_credits(self: &Arc<Self>) {
        if !self.is_open() || !lock(&self.msg.credits).want_credit_msg() {
            return;
        }
        if self.post_control(Kind::Credit, None).is_err() {
            lock(&self.msg.credits).credit_msg_done();
        }
    }

    /// Probes the peer (the keepalive): a credit message, unless one is in flight.
    pub(crate) fn probe(self: &Arc<Self>) {
        if lock(&self.msg.credits).want_probe() && self.post_control(Kind::Credit, None).is_err() {
            lock(&self.msg.credits).credit_msg_done();
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
        let sq = self.entries(1).await?;
        let spans = std::iter::once(sq.slot()).chain(src).collect();
        let opts = PostOpts {
            credit: true,
            header: Some((kind, imm)),
            ..PostOpts::default()
        };
        self.execute(sq, SendOp::Send, spans, opts).await.map(drop)
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

    /// Takes the item at the front of `inbox` once `ready` gives it (waiting while the
    /// inbox is empty or its front is not ready).
    pub(crate) async fn take<T, R>(
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
                if inbox.credited {
                    self.consumed();
                }
                return Ok(r);
            }
            self.check_open()?;
            notified.await;
        }
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
    pub async fn receive(&self) -> Result<Message> {
        if self.shared.msg.srq.is_some() {
            return Err(Error::InvalidArgument(
                "this connection's messages arrive at its shared receive queue (Srq::receive)"
                    .into(),
            ));
        }
        let arrived = self
            .shared
            .take(&self.shared.msg.messages, |m| lock(m).take())
            .await?;
        // (A large message's share of the budget goes back as `arrived` is dropped.)
        Ok(arrived.msg)
    }

    /// The immediate data of the next RDMA WRITE_WITH_IMM the peer did.
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
