//! A connection's life: the listener's wait for the peer's hello, closing (by this side,
//! by the peer, by an error), the events the application sees, and the keepalive.
//!
//! [`CloseState`] is the pure state machine (no device, no runtime); [`ConnShared`]'s
//! methods here apply its decisions to the queue pair and wake whoever waits.

use super::header::Kind;
use super::{ConnShared, Connection, lock};
use crate::error::{CloseReason, Error, LocalFailure, ProtocolViolation, Result};
use remem_verbs::{QpAttr, QpAttrMask, QpState};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::oneshot;

/// What happens to a connection, as librpma's `rpma_conn_next_event` reports it (a
/// rejected connection is [`Error::Rejected`] from
/// [`Rdma::connect_with`](crate::Rdma::connect_with)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEvent {
    /// The connection is up (the first event of every connection).
    Established,
    /// It was closed in order: by the peer, or by this side ([`Connection::close`]).
    Closed,
    /// It was lost: the transport gave up, an asynchronous error, a protocol violation
    /// (why).
    Lost(CloseReason),
}

/// What ending a connection takes ([`CloseState::end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndAction {
    /// It was already closed: nothing.
    Nothing,
    /// The peer has not proven its address: close without a word to it.
    CloseSilently,
    /// Tell the peer with a close message; the QP goes to the error state once it is out.
    TellPeer,
}

/// What the listener's side makes of a message while it waits for the peer's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HelloOutcome {
    /// The hello with the nonce sent over TCP: the peer proved its address.
    Confirmed,
    /// Anything else: a protocol violation.
    Violation,
}

/// The close state machine of one connection.
#[derive(Debug, Default)]
pub(crate) struct CloseState {
    /// The QP may send: the connection was made by this side, or the peer's hello has
    /// arrived. Until then nothing is sent to the peer's claimed address, not even a close
    /// message.
    confirmed: bool,
    /// While the listener waits for the peer's hello: its nonce.
    hello: Option<u64>,
    /// Why the connection closed, once it has.
    closed: Option<CloseReason>,
    /// The peer closed while work of ours was in flight: the QP goes to the error state
    /// once that work has completed.
    error_when_drained: bool,
    /// `next_event` reported `Established`.
    established_told: bool,
}

impl CloseState {
    /// The connecting side's state once its QP is in RTS (or the listener's once the
    /// hello arrived).
    pub(crate) fn confirm(&mut self) {
        self.confirmed = true;
    }

    /// Whether the QP may send to the peer.
    pub(crate) fn confirmed(&self) -> bool {
        self.confirmed
    }

    /// The listener's side waits for a hello carrying `nonce`.
    pub(crate) fn expect_hello(&mut self, nonce: u64) {
        self.hello = Some(nonce);
    }

    /// Whether this is the listener's side, waiting for the peer's hello. (Once it has
    /// arrived, what follows it is served as usual, even before the QP is in RTS.)
    pub(crate) fn awaits_hello(&self) -> bool {
        !self.confirmed && self.hello.is_some()
    }

    /// A message arrived while the hello was awaited: `hello` if it is one, with `data`.
    pub(crate) fn on_hello(&mut self, hello: bool, data: &[u8]) -> HelloOutcome {
        match self.hello {
            Some(nonce) if hello && data == nonce.to_be_bytes() => {
                self.hello = None;
                HelloOutcome::Confirmed
            }
            _ => HelloOutcome::Violation,
        }
    }

    /// Why it closed, if it has.
    pub(crate) fn reason(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// Records why it closed; false if it already was.
    pub(crate) fn close(&mut self, reason: CloseReason) -> bool {
        if self.closed.is_some() {
            return false;
        }
        self.closed = Some(reason);
        true
    }

    /// This side ends the connection (a violation, a drop): what that takes.
    pub(crate) fn end(&self) -> EndAction {
        if self.closed.is_some() {
            EndAction::Nothing
        } else if !self.confirmed {
            EndAction::CloseSilently
        } else {
            EndAction::TellPeer
        }
    }

    /// The peer's close message arrived: closed (true if it was open), and the QP goes
    /// to the error state once this side's work in flight has drained.
    pub(crate) fn peer_closed(&mut self) -> bool {
        let first = self.close(CloseReason::Peer);
        if first {
            self.error_when_drained = true;
        }
        first
    }

    /// Whether the QP should go to the error state now, with `drained` telling whether
    /// this side's work in flight has completed (once).
    pub(crate) fn error_now(&mut self, drained: bool) -> bool {
        if drained && self.error_when_drained {
            self.error_when_drained = false;
            return true;
        }
        false
    }

    /// Whether the QP waits to drain before going to the error state.
    pub(crate) fn draining(&self) -> bool {
        self.error_when_drained
    }

    /// Whether `Established` is still to be reported (true once).
    pub(crate) fn take_established(&mut self) -> bool {
        !std::mem::replace(&mut self.established_told, true)
    }

    /// The event that ends the connection, once it has closed.
    pub(crate) fn end_event(&self) -> Option<ConnectionEvent> {
        self.closed.as_ref().map(|r| {
            if r.is_graceful() {
                ConnectionEvent::Closed
            } else {
                ConnectionEvent::Lost(r.clone())
            }
        })
    }

    /// The next event for the application, or `None` while it is open (wait).
    #[cfg(test)]
    pub(crate) fn next_event(&mut self) -> Option<ConnectionEvent> {
        if self.take_established() {
            return Some(ConnectionEvent::Established);
        }
        self.end_event()
    }
}

/// Told when the peer's hello has arrived, or why the connection ended before.
pub(crate) type Confirmed = oneshot::Sender<Result<(), CloseReason>>;

/// A connection's life state: the close state machine and what it tells.
#[derive(Default)]
pub(crate) struct Life {
    pub(crate) state: CloseState,
    /// Who waits for the peer's hello (the listener's accept).
    pub(crate) confirm_tx: Option<Confirmed>,
    /// A connection made through the connection manager: told when the QP goes to the
    /// error state (it disconnects the CM id, a DREQ).
    pub(crate) on_error: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Life {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Life")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl ConnShared {
    /// What operations fail with once the connection is closed: why it closed
    /// ([`Error::Event`] if an asynchronous event ended it).
    pub(crate) fn closed_error(&self) -> Error {
        match lock(&self.life).state.reason().cloned() {
            Some(CloseReason::Event(ev)) => Error::Event(ev),
            Some(reason) => Error::Closed(reason),
            None => Error::Closed(CloseReason::Local),
        }
    }

    /// Whether the connection is still open.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if !self.is_open() {
            return Err(self.closed_error());
        }
        Ok(())
    }

    /// Whether the QP may send to the peer.
    pub(crate) fn confirmed(&self) -> bool {
        lock(&self.life).state.confirmed()
    }

    /// Whether this is the listener's side, still waiting for the peer's hello.
    pub(crate) fn awaits_hello(&self) -> bool {
        lock(&self.life).state.awaits_hello()
    }

    /// Marks the connection closed and moves the QP to ERR: every work request in flight
    /// completes with a flush error, and every waiter learns why.
    ///
    /// A flush is a symptom, never the reason: one that reaches an open connection means
    /// the QP went to the error state without this side moving it there (its responder
    /// refused the peer's request), and the device says why with an asynchronous event it
    /// raises as the QP goes there. That event may not have been routed yet when the
    /// flushed completion is polled, so it is routed now, before the flush is taken as the
    /// reason: the connection closes with [`Error::Event`] every time, not with the flush
    /// in some runs (`tests/api/hostile.rs`,
    /// `a_peers_access_error_ends_the_servers_connection_with_the_event`). The flush is the
    /// reason only where no event explains it.
    pub(crate) fn mark_closed(&self, reason: CloseReason) {
        if let CloseReason::Completion {
            status: remem_verbs::WcStatus::WrFlushErr,
            ..
        } = reason
            && self.is_open()
        {
            // Querying the state waits for a transition in progress (a soft QP's lock),
            // so the event it raises is queued by now.
            let _ = self.qp.state();
            self.rdma.dispatcher().route_events();
        }
        if self.close_state(reason) {
            self.to_error();
        }
    }

    /// Ends the connection because of something this side found wrong (a protocol
    /// violation, a message above the limit) or because it is dropped: tells the peer with
    /// a close message, and moves the QP to ERR once that message is out. A connection
    /// whose peer has not proven its address yet is ended without a word to it.
    pub(crate) fn end(self: &Arc<Self>, reason: impl Into<CloseReason>) {
        let reason = reason.into();
        let action = lock(&self.life).state.end();
        match action {
            EndAction::Nothing => {}
            EndAction::CloseSilently => self.mark_closed(reason),
            EndAction::TellPeer => {
                let told = self.post_close(reason.clone()).is_ok();
                if self.close_state(reason) && !told {
                    self.to_error();
                }
            }
        }
    }

    /// Records why the connection closed and wakes every waiter; false if it already was.
    pub(crate) fn close_state(&self, reason: CloseReason) -> bool {
        let confirm = {
            let mut life = lock(&self.life);
            if !life.state.close(reason.clone()) {
                return false;
            }
            life.confirm_tx.take()
        };
        tracing::debug!(qpn = self.qp.qp_num(), %reason, "connection closed");
        if let Some(tx) = confirm {
            let _ = tx.send(Err(reason));
        }
        self.after_close();
        true
    }

    /// Wakes everyone who waits on an open connection; what it holds for the peer ends.
    fn after_close(&self) {
        // Leases and regions given away on this connection end with it (before anyone
        // learns that it has ended).
        self.agent.on_close();
        self.open.store(false, Ordering::Release);
        self.ended.notify_waiters();
        self.post.sq_close();
        self.msg.close();
        self.large.close();
        for n in [&self.agent.returned.notify, &self.agent.received.notify] {
            n.notify_waiters();
        }
    }

    /// After the peer's close: moves the QP to the error state once no work of ours is
    /// in flight.
    pub(crate) fn error_if_drained(&self) {
        let drained = self.post.idle();
        if lock(&self.life).state.error_now(drained) {
            self.to_error();
        }
    }

    /// Whether the QP waits to drain after the peer's close.
    pub(crate) fn draining(&self) -> bool {
        lock(&self.life).state.draining()
    }

    /// The peer's close message arrived.
    pub(crate) fn on_peer_close(&self) {
        // What this side posted before the close arrived may still wait for its ACK (the
        // peer's ACK can trail its close message on the wire): the QP goes to the error
        // state once that work has completed (or failed: the transport's retries bound
        // the wait), not under it.
        let (first, confirm) = {
            let mut life = lock(&self.life);
            let first = life.state.peer_closed();
            (first, if first { life.confirm_tx.take() } else { None })
        };
        if first {
            tracing::debug!(qpn = self.qp.qp_num(), "connection closed by the peer");
            if let Some(tx) = confirm {
                let _ = tx.send(Err(CloseReason::Peer));
            }
            self.after_close();
            self.error_if_drained();
        }
    }

    /// Moves the QP to ERR: every work request in flight completes with a flush error.
    pub(crate) fn to_error(&self) {
        // A connection made through the CM tells the peer's CM too (a DREQ).
        let hook = lock(&self.life).on_error.clone();
        if let Some(hook) = hook {
            hook();
        }
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = self.qp.modify(&err, QpAttrMask::STATE);
    }

    /// Whether an asynchronous event concerns this connection.
    pub(crate) fn concerns(&self, ev: &remem_verbs::AsyncEvent) -> bool {
        use remem_verbs::{AsyncEventElement as E, AsyncEventType as T};
        match (ev.event_type, ev.element) {
            // The QP went to the error state (a local error, or our responder NAKed the
            // peer's request; on a shared receive queue, LAST_WQE_REACHED says the same).
            (T::QpFatal | T::QpReqErr | T::QpAccessErr | T::QpLastWqeReached, E::Qp(n)) => {
                n == self.qp.qp_num()
            }
            (T::CqErr, E::Cq(id)) => {
                id == self.cq.id() || self.rcq.as_ref().is_some_and(|r| r.id() == id)
            }
            (T::DeviceFatal, _) => true,
            _ => false,
        }
    }

    /// The peer disconnected through the connection manager.
    pub(crate) fn peer_disconnected(&self) {
        self.mark_closed(CloseReason::Peer);
    }

    /// Ends the connection because this side can no longer serve it.
    pub(crate) fn fail_local(&self, reason: impl Into<CloseReason>) {
        self.mark_closed(reason.into());
    }

    /// The listener's side: the peer's first message must be the hello carrying the nonce
    /// this side sent over TCP, and there is no other hello.
    pub(crate) fn on_hello(self: &Arc<Self>, kind: Kind, data: &[u8]) {
        let told = {
            let mut life = lock(&self.life);
            match life.state.on_hello(kind == Kind::Hello, data) {
                HelloOutcome::Confirmed => life.confirm_tx.take(),
                HelloOutcome::Violation => None,
            }
        };
        match told {
            Some(tx) => {
                // Its credit returns with the first message (or credit message) this side
                // sends once it may send.
                lock(&self.msg.credits).consumed();
                let _ = tx.send(Ok(()));
            }
            None => self.end(ProtocolViolation::Handshake),
        }
    }

    pub(crate) fn start_keepalive(self: &Arc<Self>) {
        if let (Some(every), Some(rt)) = (self.rdma.config().keepalive, self.runtime()) {
            rt.spawn(keepalive(Arc::downgrade(self), every));
        }
    }
}

impl Connection {
    /// Whether the connection is closed, and why.
    pub fn closed(&self) -> Option<CloseReason> {
        lock(&self.shared.life).state.reason().cloned()
    }

    /// Closes the connection: tells the peer (best effort), then fails every pending
    /// operation on both sides with [`Error::Closed`].
    pub async fn close(&self) {
        let sh = &self.shared;
        if !sh.is_open() {
            return;
        }
        // The close message lands in a spare buffer; wait (bounded) for it to be
        // acknowledged so the peer learns before our QP stops: its completion closes the
        // connection.
        if sh.post_close(CloseReason::Local).is_ok() {
            let closed = async {
                loop {
                    let ended = sh.ended.notified();
                    tokio::pin!(ended);
                    ended.as_mut().enable();
                    if !sh.is_open() {
                        return;
                    }
                    ended.await;
                }
            };
            let bounded = tokio::time::timeout(Duration::from_secs(1), closed);
            let _ = super::driven(sh, bounded).await;
        }
        sh.mark_closed(CloseReason::Local);
    }

    /// Closes the connection because of what this side found wrong with the peer (a
    /// layer above the messages, such as RPC): the peer is told, and `reason` is the
    /// connection's reason ([`Connection::closed`], its events, its operations' errors).
    pub(crate) fn end_with(&self, reason: CloseReason) {
        self.shared.end(reason);
    }

    /// The connection's next event (librpma's `rpma_conn_next_event`): first
    /// [`ConnectionEvent::Established`], then, once it ends, [`ConnectionEvent::Closed`]
    /// (in order, by either side) or [`ConnectionEvent::Lost`] (and that again on every
    /// later call).
    pub async fn next_event(&self) -> ConnectionEvent {
        let sh = &self.shared;
        if lock(&sh.life).state.take_established() {
            return ConnectionEvent::Established;
        }
        loop {
            let ended = sh.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            // Reported once everything the close ends has ended (`is_open` turns false
            // last), not as soon as the reason is recorded.
            if !sh.is_open()
                && let Some(ev) = lock(&sh.life).state.end_event()
            {
                return ev;
            }
            ended.await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Tell the peer; the QP goes to ERR once the close message is out (going to ERR
        // now would flush the message before it leaves).
        self.shared.end(CloseReason::Local);
    }
}

/// Probes an idle connection: after a period with no completion, a message the peer must
/// acknowledge (a credit message returning nothing). A peer that is gone never does, the
/// transport's retries run out, and the connection fails — so a side that only waits
/// (`receive`) learns that its peer died.
async fn keepalive(weak: Weak<ConnShared>, every: Duration) {
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(every).await;
        let Some(s) = weak.upgrade() else { return };
        if !s.is_open() {
            return;
        }
        s.retry_credits();
        let now = s.post.activity();
        if now == last {
            s.probe();
        }
        last = now;
    }
}

/// Why the connection ends, from an operation's error.
pub(crate) fn reason_of(e: &Error) -> CloseReason {
    match e {
        Error::Closed(r) => r.clone(),
        Error::Event(ev) => CloseReason::Event(*ev),
        Error::Completion { op, status, .. } => CloseReason::Completion {
            op: *op,
            status: *status,
        },
        _ => CloseReason::Failed(LocalFailure::Post),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_once_and_keeps_the_first_reason() {
        let mut s = CloseState::default();
        s.confirm();
        assert_eq!(s.end(), EndAction::TellPeer);
        assert!(s.close(CloseReason::Local));
        assert!(!s.close(CloseReason::Peer));
        assert_eq!(s.reason(), Some(&CloseReason::Local));
        assert_eq!(s.end(), EndAction::Nothing);
        assert!(!s.peer_closed());
    }

    #[test]
    fn unconfirmed_connections_close_silently() {
        let mut s = CloseState::default();
        s.expect_hello(7);
        assert!(s.awaits_hello());
        assert_eq!(s.end(), EndAction::CloseSilently);
    }

    #[test]
    fn hello_must_carry_the_nonce() {
        let mut s = CloseState::default();
        s.expect_hello(7);
        assert_eq!(
            s.on_hello(false, &7u64.to_be_bytes()),
            HelloOutcome::Violation
        );
        assert_eq!(
            s.on_hello(true, &8u64.to_be_bytes()),
            HelloOutcome::Violation
        );
        assert_eq!(
            s.on_hello(true, &7u64.to_be_bytes()),
            HelloOutcome::Confirmed
        );
        // There is no second hello.
        assert_eq!(
            s.on_hello(true, &7u64.to_be_bytes()),
            HelloOutcome::Violation
        );
        s.confirm();
        assert!(!s.awaits_hello());
    }

    #[test]
    fn peer_close_waits_for_the_drain() {
        let mut s = CloseState::default();
        s.confirm();
        assert!(s.peer_closed());
        assert!(s.draining());
        assert!(!s.error_now(false));
        assert!(s.error_now(true));
        assert!(!s.error_now(true), "once");
        assert_eq!(s.reason(), Some(&CloseReason::Peer));
    }

    #[test]
    fn events_established_then_closed_or_lost() {
        let mut s = CloseState::default();
        assert_eq!(s.next_event(), Some(ConnectionEvent::Established));
        assert_eq!(s.next_event(), None);
        s.close(CloseReason::Peer);
        assert_eq!(s.next_event(), Some(ConnectionEvent::Closed));
        let mut s = CloseState::default();
        s.next_event();
        s.close(CloseReason::Protocol(ProtocolViolation::NoHeader));
        let lost = Some(ConnectionEvent::Lost(CloseReason::Protocol(
            ProtocolViolation::NoHeader,
        )));
        assert_eq!(s.next_event(), lost);
        assert_eq!(s.next_event(), lost, "again on every later call");
    }
}
