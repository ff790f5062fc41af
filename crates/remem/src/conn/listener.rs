//! Listening for connections: [`Listener`] accepts TCP connections and runs each
//! handshake on a task of its own, bounded in number and in time; the requests that arrive
//! whole wait for the application ([`Listener::next_request`], [`Listener::accept`]).

use super::handshake::{AcceptError, ConnRequest, ConnectOptions};
use super::{Connection, lock};
use crate::error::{Error, Result};
use crate::rdma::Rdma;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::{Notify, Semaphore, mpsc};

impl Rdma {
    /// Listens for remem connections on `addr` (TCP, for the endpoint exchange). A task
    /// accepts TCP connections and runs each handshake on its own, with its own timeout
    /// ([`RdmaBuilder::handshake_timeout`](crate::RdmaBuilder::handshake_timeout)), at most [`RdmaBuilder::max_handshakes`](crate::RdmaBuilder::max_handshakes) at
    /// once; requests that arrive whole wait for [`Listener::next_request`] or
    /// [`Listener::accept`]. Idle connections cannot keep a client out: one source address
    /// may have at most 8 handshakes whose request has not arrived yet (more are closed
    /// at once), and when every place is taken the one that has waited longest for its
    /// request gives its place to the newcomer. Needs a tokio runtime.
    pub async fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        let tcp = TcpListener::bind(addr).await?;
        let local = tcp.local_addr()?;
        let places = self.config().max_handshakes.max(1);
        let (tx, rx) = mpsc::channel(places);
        let failures = Arc::new(Failures::default());
        let task = tokio::spawn(accept_loop(
            self.clone(),
            tcp,
            tx,
            Arc::new(Semaphore::new(places)),
            failures.clone(),
        ));
        Ok(Listener {
            rdma: self.clone(),
            local,
            requests: tokio::sync::Mutex::new(rx),
            accepting: tokio::sync::Mutex::new(tokio::task::JoinSet::new()),
            failures,
            task,
        })
    }
}

/// Handshakes whose request has not arrived yet that one source address may have under
/// way at once; a connection beyond it is closed as soon as it is accepted (and reported).
pub(crate) const MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// The handshakes whose request has not arrived yet, by id: where each comes from, and
/// how to end it.
#[derive(Default)]
struct Reading {
    by_id: std::collections::BTreeMap<u64, (std::net::SocketAddr, tokio::task::AbortHandle)>,
}

impl Reading {
    fn count_from(&self, ip: std::net::IpAddr) -> usize {
        self.by_id.values().filter(|(a, _)| a.ip() == ip).count()
    }
}

/// Accepts TCP connections and reads each request on a task of its own, at most
/// `max_handshakes` at once. A source with [`MAX_HANDSHAKES_PER_SOURCE`] requests still to
/// arrive gets no more places; when every place is taken, the handshake that has waited
/// longest for its request gives its place up to the newcomer (a client sends its request
/// as soon as it is connected: idle sockets, not clients, wait), so idle connections never
/// keep a client in the backlog while its own handshake timeout runs.
async fn accept_loop(
    rdma: Rdma,
    tcp: TcpListener,
    requests: mpsc::Sender<ConnRequest>,
    places: Arc<Semaphore>,
    failures: Arc<Failures>,
) {
    // The handshakes under way: aborted with this task when the listener is dropped.
    let mut handshakes = tokio::task::JoinSet::new();
    let reading = Arc::new(Mutex::new(Reading::default()));
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
            a = tcp.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors, a connection reset before it was taken: not
                // the listener's end. Back off a little so that a persistent error does
                // not spin.
                tracing::warn!(error = %e, "accepting a TCP connection failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        tracing::debug!(%peer, "connection request");
        if lock(&reading).count_from(peer.ip()) >= MAX_HANDSHAKES_PER_SOURCE {
            drop(stream);
            failures.record(
                peer,
                &Error::Io(std::io::Error::other(
                    "too many handshakes under way from this address",
                )),
            );
            continue;
        }
        let place = match places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(tokio::sync::TryAcquireError::Closed) => return,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                // The oldest handshake still waiting for its request gives its place up
                // (its task is aborted; the place is free once it has stopped).
                let oldest = lock(&reading).by_id.pop_first();
                if let Some((_, (addr, abort))) = oldest {
                    abort.abort();
                    failures.record(
                        addr,
                        &Error::Timeout("connection request (its place went to a newer one)"),
                    );
                }
                // (Otherwise every place holds a request waiting for the application:
                // wait for it to take one.)
                match places.clone().acquire_owned().await {
                    Ok(place) => place,
                    Err(_) => return,
                }
            }
        };
        let id = next_id;
        next_id += 1;
        let (rdma, requests, failures) = (rdma.clone(), requests.clone(), failures.clone());
        let done_reading = reading.clone();
        // Spawned under the lock, so that the task cannot remove its entry before it is in.
        let mut in_progress = lock(&reading);
        let abort = handshakes.spawn(async move {
            let read =
                super::handshake::read_request(&rdma, stream, peer, place, failures.clone()).await;
            lock(&done_reading).by_id.remove(&id);
            match read {
                // (If the listener is gone, the request is dropped: its TCP connection
                // closes.)
                Ok(req) => drop(requests.send(req).await),
                Err(e) => failures.record(peer, &e),
            }
        });
        in_progress.by_id.insert(id, (peer, abort));
    }
}

/// A connection handshake that failed because of the peer ([`Listener::next_failure`]).
#[derive(Debug)]
pub struct HandshakeFailure {
    /// Where the TCP connection came from.
    pub peer: std::net::SocketAddr,
    /// What went wrong: typically [`Error::Handshake`], [`Error::Timeout`] or
    /// [`Error::Io`].
    pub error: Error,
}

/// The most recent failures a listener keeps for [`Listener::next_failure`].
const FAILURES_KEPT: usize = 64;

/// Handshakes that failed, counted and the most recent kept.
#[derive(Default)]
pub(crate) struct Failures {
    count: AtomicU64,
    recent: Mutex<VecDeque<HandshakeFailure>>,
    notify: Notify,
}

impl std::fmt::Debug for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failures")
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

impl Failures {
    /// Reports a handshake that failed because of the peer at `peer`.
    pub(crate) fn record(&self, peer: std::net::SocketAddr, error: &Error) {
        tracing::info!(%peer, %error, "connection handshake failed");
        // The error is rebuilt from its description where it holds what cannot be cloned.
        let error = match error {
            Error::Handshake(h) => Error::Handshake(*h),
            Error::Timeout(w) => Error::Timeout(w),
            Error::Closed(r) => Error::Closed(r.clone()),
            Error::Io(e) => Error::Io(std::io::Error::new(e.kind(), e.to_string())),
            Error::Completion {
                op,
                status,
                vendor_err,
            } => Error::Completion {
                op: *op,
                status: *status,
                vendor_err: *vendor_err,
            },
            other => Error::InvalidArgument(other.to_string()),
        };
        {
            let mut recent = lock(&self.recent);
            if recent.len() == FAILURES_KEPT {
                recent.pop_front();
            }
            recent.push_back(HandshakeFailure { peer, error });
        }
        self.count.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

/// Accepts remem connections; all share the [`Rdma`] (device and PD) it was made from.
/// Dropping it stops accepting (handshakes under way end within their timeout).
#[derive(Debug)]
pub struct Listener {
    rdma: Rdma,
    local: std::net::SocketAddr,
    requests: tokio::sync::Mutex<mpsc::Receiver<ConnRequest>>,
    /// Requests [`Listener::accept`] is accepting, each on a task of its own.
    accepting: tokio::sync::Mutex<tokio::task::JoinSet<Result<Connection, AcceptError>>>,
    failures: Arc<Failures>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// The address it listens on.
    pub fn local_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.local)
    }

    /// Waits for the next good connection and accepts it (with default options and no
    /// private data): [`Listener::next_request`] then [`ConnRequest::accept`]. A handshake
    /// that fails because of the peer (a port scan, another protocol, a client that says
    /// nothing or does not prove its address) does not end it: it is reported
    /// ([`Listener::next_failure`], `tracing`) and the next request is taken. Requests are
    /// accepted concurrently, each on a task of its own, so a client that is slow to finish
    /// its handshake delays no other; a connection accepted while nobody waits here is
    /// returned by the next call. It fails only when this side cannot serve a connection
    /// (e.g. no queue pair can be created).
    pub async fn accept(&self) -> Result<Connection> {
        let mut accepting = self.accepting.lock().await;
        loop {
            tokio::select! {
                biased;
                Some(done) = accepting.join_next(), if !accepting.is_empty() => match done {
                    Ok(Ok(c)) => return Ok(c),
                    Ok(Err(AcceptError::Local(e))) => return Err(e),
                    Ok(Err(AcceptError::Peer(_))) => {} // reported
                    Err(e) => tracing::warn!(error = %e, "an accepting task failed"),
                },
                req = self.next_request() => {
                    let req = req?;
                    accepting.spawn(async move {
                        req.accept_inner(&ConnectOptions::default()).await
                    });
                }
            }
        }
    }

    /// Waits for the next connection request: the application reads its private data and
    /// accepts ([`ConnRequest::accept`]) or rejects ([`ConnRequest::reject`]) it. Only
    /// well-formed requests come here; a request that waited longer than the handshake
    /// timeout (its client has given up) is dropped and reported as a failure.
    pub async fn next_request(&self) -> Result<ConnRequest> {
        let timeout = self.rdma.config().handshake_timeout;
        let mut requests = self.requests.lock().await;
        loop {
            let Some(req) = requests.recv().await else {
                return Err(Error::Io(std::io::Error::other(
                    "the listener stopped accepting",
                )));
            };
            if req.since.elapsed() > timeout {
                self.failures.record(
                    req.peer,
                    &Error::Timeout("connection request waited too long"),
                );
                continue;
            }
            return Ok(req);
        }
    }

    /// Handshakes that failed because of the peer since the listener started.
    pub fn failed_handshakes(&self) -> u64 {
        self.failures.count.load(Ordering::Acquire)
    }

    /// The next handshake failure not yet taken (the listener keeps the 64 most recent;
    /// older ones are only counted), waiting for one if there is none.
    pub async fn next_failure(&self) -> HandshakeFailure {
        loop {
            let notified = self.failures.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(f) = lock(&self.failures.recent).pop_front() {
                return f;
            }
            notified.await;
        }
    }
}
