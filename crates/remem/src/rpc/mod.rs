//! Request/response over a connection's messages: many tasks share one connection, and
//! each awaits the reply to *its* request.
//!
//! One side calls ([`RpcClient`]), the other serves ([`RpcServer`]). Every message on the
//! connection carries a [`FrameHeader`] (a kind and a request id) before its payload: the
//! client numbers its requests, the server's reply carries the request's id back, and a
//! task of the client routes each reply to the call waiting for that id. (For calls in
//! both directions, use two connections, or a client and a server on each.)
//!
//! # Failures
//!
//! - The connection ends (closed by either side, lost): every waiting call, and every later
//!   one, fails with the connection's [`Error::Closed`] and its reason.
//! - The peer sends a frame that is not one ([`FrameError`]), a reply to a request never
//!   made, or a request to a client: a protocol violation. The side that finds it closes
//!   the connection, and its waiting calls fail with [`Error::Closed`] carrying
//!   [`CloseReason::Protocol`].
//! - A call whose future is dropped (cancelled, timed out with `tokio::time::timeout`)
//!   forgets its id: its reply, if one comes, is discarded, and later calls are not
//!   confused by it.
//! - The server drops a [`Request`] without answering it, or [`Request::refuse`]s it: the
//!   call fails with [`Error::Refused`].
//!
//! The client bounds the calls in flight ([`RpcClient::with_limit`];
//! [`DEFAULT_MAX_IN_FLIGHT`] by default): a call beyond it waits for one to finish. The
//! messages themselves are flow-controlled by the connection's credits, as every message
//! is; requests and replies larger than the connection's receive buffers travel as large
//! messages ([`Connection::send`]).

pub(crate) mod frame;

pub use frame::{FrameError, FrameHeader, FrameKind, HEADER_LEN, RpcViolation, VERSION};

use crate::error::{CloseReason, Error, ProtocolViolation, Result};
use crate::{Connection, LocalMr, Rdma};
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Semaphore, oneshot};

/// The calls a client has in flight at most unless told otherwise
/// ([`RpcClient::with_limit`]).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// Refusals of requests dropped unanswered ([`Request`]'s drop) that may wait to be sent
/// on one connection (each waits for a credit, and the caller returns credits as it takes
/// answers). One more closes the connection as a protocol violation
/// ([`RpcViolation::UnsentRefusals`]): a caller that takes no answers cannot make the
/// server hold more. They are sent in order by one task per connection, started when the
/// first waits and ended when none does.
pub const MAX_UNSENT_REFUSALS: usize = 1024;

/// The error a protocol violation of the RPC layer gives its callers.
fn violation(what: impl Into<RpcViolation>) -> CloseReason {
    CloseReason::Protocol(ProtocolViolation::Rpc(what.into()))
}

/// Why a `receive` failure ends the RPC layer: the connection's reason when it has one.
fn reason_of(conn: &Connection, e: &Error) -> CloseReason {
    match e {
        Error::Closed(r) => r.clone(),
        Error::Event(ev) => CloseReason::Event(*ev),
        Error::Completion { op, status, .. } => CloseReason::Completion {
            op: *op,
            status: *status,
        },
        _ => conn.closed().unwrap_or(CloseReason::Local),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends one frame: header and payload copied into a region from `rdma`'s pool.
async fn send_frame(
    rdma: &Rdma,
    conn: &Connection,
    header: FrameHeader,
    payload: &[u8],
) -> Result<()> {
    let len = HEADER_LEN + payload.len();
    let layout = Layout::from_size_align(len, 8)
        .map_err(|_| Error::InvalidArgument(format!("an RPC message of {len} bytes")))?;
    let mr: LocalMr = rdma.alloc_local_mr_uninit(layout)?;
    mr.write(0, &header.to_bytes())?;
    mr.write(HEADER_LEN, payload)?;
    conn.send(&mr).await
}

type Answer = Result<Vec<u8>>;

/// The calls waiting for replies, shared by the callers and the task that routes replies.
#[derive(Default)]
struct Calls {
    next_id: u64,
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    /// Set once the connection ended: every waiting call got this, every later one does.
    failed: Option<CloseReason>,
}

impl Calls {
    fn fail(&mut self, reason: CloseReason) {
        self.failed.get_or_insert(reason.clone());
        for (_, waiter) in self.waiting.drain() {
            let _ = waiter.send(Err(Error::Closed(reason.clone())));
        }
    }
}

struct ClientInner {
    rdma: Rdma,
    conn: Arc<Connection>,
    calls: Arc<Mutex<Calls>>,
    limit: Semaphore,
    router: tokio::task::AbortHandle,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // The router holds the connection; once it stops, the connection is dropped (and
        // closed) unless the application holds it too.
        self.router.abort();
    }
}

/// The calling side of request/response over a connection: cheap to clone, and every
/// clone may [`call`](RpcClient::call) concurrently; each call gets the reply to its own
/// request. The client takes every message the connection receives (do not also call
/// [`Connection::receive`] on it); one-sided operations on the connection
/// ([`RpcClient::connection`]) are unaffected. The connection is closed when the last
/// clone is dropped, unless the application holds it too.
///
/// It needs a tokio runtime: a task of its own routes the replies.
///
/// ```
/// use remem::{RdmaBuilder, rpc::{RpcClient, RpcServer}};
///
/// # fn main() -> Result<(), remem::Error> {
/// tokio::runtime::Runtime::new()?.block_on(async {
///     let server = RdmaBuilder::new().device("soft@127.0.0.6:0").build()?;
///     let client = RdmaBuilder::new().device("soft@127.0.0.5:0").build()?;
///     let listener = server.listen("127.0.0.1:0").await?;
///     let (c, s) = tokio::join!(client.connect(listener.local_addr()?), listener.accept());
///
///     // The server answers each request with its bytes reversed, until the client closes.
///     let rpc_server = RpcServer::new(&server, s?);
///     let serving = tokio::spawn(async move {
///         rpc_server.serve(|mut request| async move { request.reverse(); Ok(request) }).await
///     });
///
///     // Many tasks share the connection; each gets its own reply.
///     let rpc = RpcClient::new(&client, c?);
///     let calls = (0..8u8).map(|i| {
///         let rpc = rpc.clone();
///         tokio::spawn(async move { rpc.call(&[i, 1, 2]).await })
///     });
///     for (i, call) in (0..8u8).zip(calls) {
///         assert_eq!(call.await.unwrap()?, [2, 1, i]);
///     }
///     drop(rpc); // the last clone: the connection closes
///     assert_eq!(serving.await.unwrap()?, 8);
///     Ok(())
/// })
/// # }
/// ```
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let calls = lock(&self.inner.calls);
        f.debug_struct("RpcClient")
            .field("conn", &self.inner.conn)
            .field("waiting", &calls.waiting.len())
            .field("failed", &calls.failed)
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// A client calling over `conn`, with requests in regions from `rdma`'s pool (the
    /// `Rdma` that made the connection), at most [`DEFAULT_MAX_IN_FLIGHT`] calls at once.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the task that routes replies).
    pub fn new(rdma: &Rdma, conn: impl Into<Arc<Connection>>) -> Self {
        Self::with_limit(rdma, conn, DEFAULT_MAX_IN_FLIGHT)
    }

    /// [`RpcClient::new`] with at most `max_in_flight` calls at once (at least one).
    pub fn with_limit(rdma: &Rdma, conn: impl Into<Arc<Connection>>, max_in_flight: usize) -> Self {
        let conn = conn.into();
        let calls = Arc::new(Mutex::new(Calls::default()));
        let router = tokio::spawn(route(conn.clone(), calls.clone())).abort_handle();
        RpcClient {
            inner: Arc::new(ClientInner {
                rdma: rdma.clone(),
                conn,
                calls,
                limit: Semaphore::new(max_in_flight.max(1)),
                router,
            }),
        }
    }

    /// The connection, for one-sided operations beside the calls.
    pub fn connection(&self) -> &Connection {
        &self.inner.conn
    }

    /// Sends `request` and waits for its reply. Fails with [`Error::Closed`] once the
    /// connection has ended (and why), with [`Error::Refused`] if the server would not
    /// answer. Dropping the future forgets the call (its reply is discarded when it comes);
    /// for a time limit, wrap it in `tokio::time::timeout`.
    pub async fn call(&self, request: &[u8]) -> Result<Vec<u8>> {
        let inner = &self.inner;
        let _permit = inner
            .limit
            .acquire()
            .await
            .map_err(|_| Error::Closed(CloseReason::Local))?;
        let (id, answer) = {
            let mut calls = lock(&inner.calls);
            if let Some(reason) = &calls.failed {
                return Err(Error::Closed(reason.clone()));
            }
            let id = calls.next_id;
            calls.next_id += 1;
            let (tx, rx) = oneshot::channel();
            calls.waiting.insert(id, tx);
            (id, rx)
        };
        // From here on, dropping this future (or failing) forgets the call.
        let _forget = Forget {
            calls: &inner.calls,
            id,
        };
        let header = FrameHeader {
            kind: FrameKind::Request,
            id,
        };
        send_frame(&inner.rdma, &inner.conn, header, request).await?;
        match answer.await {
            Ok(answer) => answer,
            // The router stopped without answering: the connection ended.
            Err(_) => Err(Error::Closed(
                lock(&inner.calls)
                    .failed
                    .clone()
                    .unwrap_or(CloseReason::Local),
            )),
        }
    }
}

/// Removes a call's entry when its future ends, however it ends.
struct Forget<'a> {
    calls: &'a Mutex<Calls>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.calls).waiting.remove(&self.id);
    }
}

/// The client's router: takes every message, hands each reply to its call; on the end of
/// the connection or a protocol violation, fails every call.
async fn route(conn: Arc<Connection>, calls: Arc<Mutex<Calls>>) {
    let reason = loop {
        let message = match conn.receive().await {
            Ok(m) => m,
            Err(e) => break reason_of(&conn, &e),
        };
        let (header, payload) = match FrameHeader::parse(&message.data) {
            Ok(parsed) => parsed,
            Err(e) => break violation(e),
        };
        let answer = match header.kind {
            FrameKind::Reply => Ok(payload.to_vec()),
            FrameKind::Refused => Err(Error::Refused(String::from_utf8_lossy(payload).into())),
            FrameKind::Request => break violation(RpcViolation::RequestToCaller),
        };
        let mut calls = lock(&calls);
        if header.id >= calls.next_id {
            break violation(RpcViolation::UnknownReply(header.id));
        }
        // No waiter: the call was dropped; its reply is discarded.
        if let Some(waiter) = calls.waiting.remove(&header.id) {
            let _ = waiter.send(answer);
        }
    };
    if matches!(reason, CloseReason::Protocol(_)) {
        // The connection closes with the violation as its reason (before any call learns
        // it): one reason, the same at `Connection::closed` and in the calls' errors.
        conn.end_with(reason.clone());
    }
    lock(&calls).fail(reason);
}

/// The serving side of request/response over a connection: takes requests
/// ([`RpcServer::next_request`]) and answers each ([`Request::reply`]), or runs a handler
/// on each in turn ([`RpcServer::serve`], as in [`RpcClient`]'s example).
///
/// Taking requests one by one, a server may answer them in any order, from other tasks,
/// or refuse them:
///
/// ```
/// use remem::{Error, RdmaBuilder, rpc::{RpcClient, RpcServer}};
///
/// # fn main() -> Result<(), remem::Error> {
/// tokio::runtime::Runtime::new()?.block_on(async {
///     let server = RdmaBuilder::new().device("soft@127.0.0.8:0").build()?;
///     let client = RdmaBuilder::new().device("soft@127.0.0.7:0").build()?;
///     let listener = server.listen("127.0.0.1:0").await?;
///     let (c, s) = tokio::join!(client.connect(listener.local_addr()?), listener.accept());
///     let rpc = RpcClient::new(&client, c?);
///     let (first, second) = (rpc.clone(), rpc.clone());
///     let calls = tokio::spawn(async move {
///         tokio::join!(first.call(b"ping"), second.call(b"shutdown"))
///     });
///
///     let rpc_server = RpcServer::new(&server, s?);
///     for _ in 0..2 {
///         let request = rpc_server.next_request().await?.expect("the client is there");
///         if request.data() == b"ping" {
///             // Answered by another task.
///             tokio::spawn(async move { request.reply(b"pong").await });
///         } else {
///             request.refuse("not allowed").await?;
///         }
///     }
///     let (pong, refused) = calls.await.unwrap();
///     assert_eq!(pong?, b"pong");
///     assert!(matches!(refused, Err(Error::Refused(why)) if why == "not allowed"));
///     Ok(())
/// })
/// # }
/// ```
#[derive(Debug)]
pub struct RpcServer {
    rdma: Rdma,
    conn: Arc<Connection>,
    refusals: Arc<Refusals>,
}

/// The refusals of a server's dropped requests waiting to be sent (at most
/// [`MAX_UNSENT_REFUSALS`]), and whether the task sending them runs.
#[derive(Debug, Default)]
struct Refusals {
    state: Mutex<RefusalQueue>,
}

#[derive(Debug, Default)]
struct RefusalQueue {
    ids: std::collections::VecDeque<u64>,
    sending: bool,
}

/// What a dropped request is refused with.
const DROPPED: &[u8] = b"dropped without an answer";

impl Refusals {
    /// Request `id` was dropped unanswered: its refusal waits its turn. Beyond the budget
    /// the connection closes instead.
    fn refuse(self: &Arc<Self>, rdma: Rdma, conn: Arc<Connection>, id: u64) {
        {
            let mut q = lock(&self.state);
            if q.ids.len() >= MAX_UNSENT_REFUSALS {
                drop(q);
                conn.end_with(violation(RpcViolation::UnsentRefusals {
                    max: MAX_UNSENT_REFUSALS,
                }));
                return;
            }
            q.ids.push_back(id);
            if std::mem::replace(&mut q.sending, true) {
                return; // the sending task takes it
            }
        }
        // Without a runtime (it is shutting down) nothing can be sent: the connection
        // ends with it, and the caller learns that instead.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(self.clone().send_all(rdma, conn))),
            Err(_) => {
                let mut q = lock(&self.state);
                q.ids.clear();
                q.sending = false;
            }
        }
    }

    /// Sends the waiting refusals in order until none waits (or the connection ends).
    async fn send_all(self: Arc<Self>, rdma: Rdma, conn: Arc<Connection>) {
        loop {
            let id = {
                let mut q = lock(&self.state);
                match q.ids.pop_front() {
                    Some(id) => id,
                    None => {
                        q.sending = false;
                        return;
                    }
                }
            };
            let header = FrameHeader {
                kind: FrameKind::Refused,
                id,
            };
            if send_frame(&rdma, &conn, header, DROPPED).await.is_err() {
                // The connection ended: the callers learn that instead.
                let mut q = lock(&self.state);
                q.ids.clear();
                q.sending = false;
                return;
            }
        }
    }
}

impl RpcServer {
    /// A server answering requests that arrive on `conn`, with replies in regions from
    /// `rdma`'s pool (the `Rdma` that made the connection).
    pub fn new(rdma: &Rdma, conn: impl Into<Arc<Connection>>) -> Self {
        RpcServer {
            rdma: rdma.clone(),
            conn: conn.into(),
            refusals: Arc::default(),
        }
    }

    /// The connection, for one-sided operations and sharing regions beside the requests.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The next request; `None` once the peer has closed the connection in order. A
    /// message that is not a request is a protocol violation: the connection is closed,
    /// and this fails with [`Error::Closed`] carrying [`CloseReason::Protocol`].
    pub async fn next_request(&self) -> Result<Option<Request>> {
        let message = match self.conn.receive().await {
            Ok(m) => m,
            Err(Error::Closed(CloseReason::Peer)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let reason = match FrameHeader::parse(&message.data) {
            Ok((header, payload)) if header.kind == FrameKind::Request => {
                return Ok(Some(Request {
                    id: header.id,
                    data: payload.to_vec(),
                    server: Some((self.rdma.clone(), self.conn.clone())),
                    refusals: self.refusals.clone(),
                }));
            }
            Ok((header, _)) => violation(RpcViolation::NotARequest(header.kind)),
            Err(e) => violation(e),
        };
        self.conn.end_with(reason.clone());
        Err(Error::Closed(reason))
    }

    /// Answers every request with what `handler` returns for its bytes — a reply, or why
    /// the request is refused ([`Request::refuse`]) — one request at a time, until the peer
    /// closes the connection; returns how many it answered. (To answer requests
    /// concurrently, take them with [`RpcServer::next_request`] and spawn.)
    pub async fn serve<F, Fut>(&self, mut handler: F) -> Result<u64>
    where
        F: FnMut(Vec<u8>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Vec<u8>, String>>,
    {
        let mut served = 0;
        while let Some(mut request) = self.next_request().await? {
            let answered = match handler(std::mem::take(&mut request.data)).await {
                Ok(reply) => request.reply(&reply).await,
                Err(why) => request.refuse(&why).await,
            };
            match answered {
                // The peer may close as soon as it has its last reply, before this side
                // has seen the reply acknowledged: the end of the run, not a failure.
                Err(Error::Closed(CloseReason::Peer)) => return Ok(served),
                other => other?,
            }
            served += 1;
        }
        Ok(served)
    }
}

/// A request taken by [`RpcServer::next_request`]: its bytes, and the way to answer it
/// (it may move to another task for that: [`RpcServer`]'s example). Dropped without an
/// answer, it is refused (the caller gets [`Error::Refused`]): its refusal waits its turn
/// among at most [`MAX_UNSENT_REFUSALS`] on the connection.
#[derive(Debug)]
pub struct Request {
    id: u64,
    data: Vec<u8>,
    /// Where the answer goes; taken when it is sent.
    server: Option<(Rdma, Arc<Connection>)>,
    /// The connection's refusals waiting to be sent.
    refusals: Arc<Refusals>,
}

impl Request {
    /// The request's id (unique on its connection).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The request's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Answers the request with `reply`.
    pub async fn reply(mut self, reply: &[u8]) -> Result<()> {
        self.answer(FrameKind::Reply, reply).await
    }

    /// Refuses the request: the call fails with [`Error::Refused`] and `reason`.
    pub async fn refuse(mut self, reason: &str) -> Result<()> {
        self.answer(FrameKind::Refused, reason.as_bytes()).await
    }

    async fn answer(&mut self, kind: FrameKind, payload: &[u8]) -> Result<()> {
        // (`reply` and `refuse` consume the request: it is answered once.)
        let Some((rdma, conn)) = self.server.take() else {
            return Ok(());
        };
        let header = FrameHeader { kind, id: self.id };
        send_frame(&rdma, &conn, header, payload).await
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some((rdma, conn)) = self.server.take() {
            self.refusals.refuse(rdma, conn, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Request),
            Just(FrameKind::Reply),
            Just(FrameKind::Refused)
        ]
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let good = FrameHeader {
            kind: FrameKind::Request,
            id: u64::MAX,
        }
        .to_bytes();
        assert_eq!(FrameHeader::parse(&good[..3]), Err(FrameError::Short(3)));
        let mut b = good;
        b[0] = 2;
        assert_eq!(FrameHeader::parse(&b), Err(FrameError::Version(2)));
        let mut b = good;
        b[1] = 0;
        assert_eq!(FrameHeader::parse(&b), Err(FrameError::Kind(0)));
        let mut b = good;
        b[3] = 1;
        assert_eq!(FrameHeader::parse(&b), Err(FrameError::Reserved));
        assert_eq!(
            FrameHeader::parse(&good).unwrap().0.id,
            u64::MAX,
            "the id is all eight bytes"
        );
    }

    proptest! {
        #[test]
        fn headers_round_trip(kind in kind(), id in any::<u64>(),
                              payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let header = FrameHeader { kind, id };
            let mut message = header.to_bytes().to_vec();
            message.extend_from_slice(&payload);
            prop_assert_eq!(FrameHeader::parse(&message), Ok((header, &payload[..])));
        }

        #[test]
        fn any_bytes_parse_or_fail_typed(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
            // Never panics; what parses re-emits to the same header bytes.
            if let Ok((header, payload)) = FrameHeader::parse(&bytes) {
                prop_assert_eq!(&header.to_bytes()[..], &bytes[..HEADER_LEN]);
                prop_assert_eq!(payload, &bytes[HEADER_LEN..]);
            }
        }
    }
}
