//! Shared receive queues: one pool of receive buffers and one receive completion queue for
//! many connections (librpma's `rpma_srq`).
//!
//! Connections made with [`ConnectOptions::srq`](crate::ConnectOptions::srq) take their
//! receives from the queue: every message they get, from any peer, arrives at
//! [`Srq::receive`] with the number of the local queue pair it came to
//! ([`Connection::qp_num`](crate::Connection::qp_num)). Control messages (credits, close,
//! memory tokens, the agent) still reach their connection. Buffers are reposted as soon as
//! their data is copied out. Each connection still grants its peer `recv_depth` credits,
//! returned as [`Srq::receive`] takes its messages: so one peer can queue at most
//! `recv_depth` messages for the application (more breaks the protocol and closes its
//! connection), however many buffers the queue has. A peer that finds the queue empty is
//! told to retry (RNR), as the queue pair's `rnr_retry` allows.

use super::inbox::{Inbox, Message, Place, Received, RecvRing};
use crate::dispatch::Served;
use crate::error::{Error, LocalFailure, Result};
use crate::rdma::Rdma;
use remem_verbs::{CompletionQueue, RecvWr, SharedReceiveQueue, SrqAttr, WorkCompletion};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A connection that takes its receives from a shared receive queue: what the queue tells
/// it. (The queue knows connections only by this.)
pub(crate) trait SrqClient: Send + Sync {
    /// A receive of this connection completed, its message (if it carried one) copied out.
    fn on_received(self: Arc<Self>, wc: &WorkCompletion, message: Option<Received>);
    /// The application took one of its messages: its credit is owed to the peer.
    fn consumed(self: Arc<Self>);
    /// The queue can no longer be served.
    fn fail(&self, reason: LocalFailure);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A message that arrived at a [`Srq`], or its place while it is being read.
pub(crate) type Arrival = (u32, Place);

/// A shared receive queue ([`Rdma::create_srq`]). Cheap to clone; the queue lives while a
/// clone or a connection using it does.
#[derive(Debug, Clone)]
pub struct Srq {
    pub(crate) shared: Arc<SrqShared>,
}

pub(crate) struct SrqShared {
    pub(crate) srq: Arc<dyn SharedReceiveQueue>,
    pub(crate) cq: Arc<dyn CompletionQueue>,
    rdma: Rdma,
    /// The receive buffers (the same ring a connection without a queue has).
    ring: RecvRing,
    /// The connections using it, by local QP number.
    conns: Mutex<HashMap<u32, Weak<dyn SrqClient>>>,
    pub(crate) messages: Inbox<Arrival>,
    registered: AtomicBool,
}

impl std::fmt::Debug for SrqShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("srq_num", &self.srq.srq_num())
            .field("depth", &self.ring.depth())
            .field("connections", &lock(&self.conns).len())
            .finish()
    }
}

impl Rdma {
    /// Creates a shared receive queue of `depth` receive buffers, each taking a message of
    /// up to [`RdmaBuilder::max_message`](crate::RdmaBuilder::max_message) bytes, with a
    /// receive completion queue of its own.
    pub fn create_srq(&self, depth: u32) -> Result<Srq> {
        if depth == 0 {
            return Err(Error::InvalidArgument(
                "a shared receive queue needs at least one buffer".into(),
            ));
        }
        let cfg = self.config();
        let srq = self.pd().create_srq(SrqAttr {
            max_wr: depth,
            max_sge: 1,
            srq_limit: 0,
        })?;
        let cq = self
            .context()
            .create_cq(depth.max(cfg.cq_size), self.dispatcher().channel())?;
        let ring = RecvRing::new(self.pd(), cfg.max_message, depth)?;
        let shared = Arc::new(SrqShared {
            srq,
            cq,
            rdma: self.clone(),
            ring,
            conns: Mutex::new(HashMap::new()),
            messages: Inbox::default(),
            registered: AtomicBool::new(false),
        });
        for i in 0..depth {
            shared.post(i)?;
        }
        Ok(Srq { shared })
    }
}

impl Srq {
    /// The next message any connection using the queue received, with the number of the
    /// local queue pair it came to ([`Connection::qp_num`](crate::Connection::qp_num)).
    /// Messages of one connection come in order; a large one (read by RDMA READ) keeps its
    /// place. Cancel safe, as [`Connection::receive`](crate::Connection::receive) is: a
    /// dropped future loses no message.
    pub async fn receive(&self) -> Result<(u32, Message)> {
        let inbox = &self.shared.messages;
        loop {
            let notified = inbox.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let ready = {
                let mut q = lock(&inbox.queue);
                let ready = q
                    .front()
                    .and_then(|(qpn, place)| lock(place).take().map(|m| (*qpn, m)));
                if ready.is_some() {
                    q.pop_front();
                }
                ready
            };
            if let Some((qpn, arrived)) = ready {
                // The message's credit goes back to the peer it came from.
                let conn = lock(&self.shared.conns).get(&qpn).and_then(Weak::upgrade);
                if let Some(c) = conn {
                    c.consumed();
                }
                return Ok((qpn, arrived.into_message()));
            }
            notified.await;
        }
    }

    /// Receive buffers in the queue.
    pub fn depth(&self) -> u32 {
        self.shared.ring.depth()
    }

    /// Drives the queue's completions by hand (with [`Polling::Manual`](crate::Polling)):
    /// returns how many it handled.
    pub fn poll_completions(&self) -> usize {
        self.shared.clone().poll()
    }
}

impl SrqShared {
    fn post(&self, index: u32) -> Result<()> {
        self.srq
            .post_recv(&[RecvWr {
                wr_id: u64::from(index),
                sg_list: &[self.ring.sge(index)],
            }])
            .map_err(|e| Error::Verbs(e.error))
    }

    /// A connection starts using the queue (it is connected): its receives are routed to
    /// it, and the queue's completions are served by the dispatcher.
    pub(crate) fn attach<C: SrqClient + 'static>(
        self: &Arc<Self>,
        qpn: u32,
        conn: &Arc<C>,
    ) -> Result<()> {
        {
            let mut conns = lock(&self.conns);
            conns.retain(|_, c| c.strong_count() > 0);
            conns.insert(qpn, Arc::downgrade(conn) as Weak<dyn SrqClient>);
        }
        if !self.registered.swap(true, Ordering::AcqRel) {
            self.rdma.dispatcher().serve(self, &self.cq)?;
        }
        Ok(())
    }

    /// Polls the receive completion queue until it is empty; returns how many completions
    /// it handled.
    pub(crate) fn poll_cq(&self) -> usize {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut total = 0;
        loop {
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "polling a shared receive completion queue failed");
                    self.fail_local(LocalFailure::CompletionQueue);
                    return total;
                }
            };
            for wc in &wcs[..n] {
                self.on_completion(wc);
            }
            total += n;
            if n < wcs.len() {
                return total;
            }
        }
    }

    fn on_completion(&self, wc: &WorkCompletion) {
        let index = wc.wr_id as u32;
        // Copy the message out, then give the buffer back at once.
        let message = (wc.status == remem_verbs::WcStatus::Success
            && wc.opcode != remem_verbs::WcOpcode::RecvRdmaWithImm)
            .then(|| self.ring.read(index, wc.byte_len as usize));
        if index < self.ring.depth()
            && let Err(e) = self.post(index)
        {
            tracing::warn!(error = %e, "reposting a shared receive buffer failed");
        }
        let conn = lock(&self.conns).get(&wc.qp_num).and_then(Weak::upgrade);
        match conn {
            Some(c) => c.on_received(wc, message),
            None => tracing::debug!(qpn = wc.qp_num, "receive for a connection that is gone"),
        }
    }

    /// The queue can no longer be served: every connection using it ends.
    pub(crate) fn fail_local(&self, reason: LocalFailure) {
        let conns: Vec<_> = lock(&self.conns)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for c in conns {
            c.fail(reason);
        }
    }
}

impl Served for SrqShared {
    fn poll(self: Arc<Self>) -> usize {
        self.poll_cq()
    }

    fn arm(&self) -> remem_verbs::Result<()> {
        self.cq.req_notify(false)
    }

    fn fail(&self, reason: LocalFailure) {
        self.fail_local(reason);
    }
}
