//! One completion dispatcher per [`Rdma`](crate::Rdma), shared by every connection made
//! from it (those it connects and those its listeners accept).
//!
//! Each connection keeps a completion queue of its own (sized for its queue pair, so one
//! busy connection cannot overrun another's CQ), and every CQ reports to the same
//! completion channel. One task (event-driven and adaptive polling) sleeps on that channel,
//! learns from each CQ event which CQ fired, acknowledges the event, and drains that CQ; in
//! busy mode one thread polls every CQ in turn. Routing is by CQ id, so a thousand
//! connections cost one task and one file descriptor, not a thousand.

use crate::conn::ConnShared;
use crate::error::{Error, Result};
use crate::rdma::Polling;
use crate::srq::SrqShared;
use remem_verbs::{CompletionChannel, CompletionQueue, Context, CqId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered connection's completion queue. The dispatcher holds the CQ itself, so it
/// can still acknowledge an event it has taken for a connection that is going away (a
/// provider may refuse to destroy a CQ with unacknowledged events).
struct Entry {
    cq: Arc<dyn CompletionQueue>,
    conn: Owner,
}

/// Whose completion queue an entry is: a connection's, or a shared receive queue's.
#[derive(Clone)]
enum Owner {
    Conn(Weak<ConnShared>),
    Srq(Weak<SrqShared>),
}

/// A live owner.
enum Live {
    Conn(Arc<ConnShared>),
    Srq(Arc<SrqShared>),
}

impl Owner {
    fn upgrade(&self) -> Option<Live> {
        match self {
            Owner::Conn(w) => w.upgrade().map(Live::Conn),
            Owner::Srq(w) => w.upgrade().map(Live::Srq),
        }
    }

    fn strong_count(&self) -> usize {
        match self {
            Owner::Conn(w) => w.strong_count(),
            Owner::Srq(w) => w.strong_count(),
        }
    }
}

impl Live {
    fn poll_cq(&self) -> usize {
        match self {
            Live::Conn(c) => c.poll_cq(),
            Live::Srq(s) => s.poll_cq(),
        }
    }

    fn arm(&self) -> remem_verbs::Result<()> {
        match self {
            Live::Conn(c) => c.arm(),
            Live::Srq(s) => s.arm(),
        }
    }

    fn fail_local(&self, reason: crate::error::LocalFailure) {
        match self {
            Live::Conn(c) => c.fail_local(reason),
            Live::Srq(s) => s.fail_local(reason),
        }
    }
}

/// The completion dispatcher of one [`Rdma`](crate::Rdma).
pub(crate) struct Dispatcher {
    polling: Polling,
    /// A device its user drives: the busy-polling thread moves its packets.
    driven: Option<Arc<dyn Context>>,
    /// The channel every CQ reports to (event-driven and adaptive polling).
    channel: Option<Arc<dyn CompletionChannel>>,
    entries: Mutex<HashMap<CqId, Entry>>,
    /// Bumped on every registration and every connection that goes away.
    generation: AtomicU64,
    /// Wakes the task (a connection went away, or the device is closing).
    wake: Notify,
    stopped: AtomicBool,
    /// The event-driven task, once started (restarted if its runtime shut down).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The busy-polling thread, once started.
    busy: Mutex<Option<std::thread::Thread>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("polling", &self.polling)
            .field("connections", &lock(&self.entries).len())
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher for `polling`; event-driven modes get their completion channel now.
    pub(crate) fn new(ctx: &Arc<dyn Context>, polling: Polling) -> Result<Arc<Self>> {
        let channel = match polling {
            Polling::Event | Polling::Adaptive { .. } => Some(ctx.create_comp_channel()?),
            Polling::Busy | Polling::Manual => None,
        };
        Ok(Arc::new(Dispatcher {
            polling,
            driven: ctx.caller_driven().then(|| ctx.clone()),
            channel,
            entries: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            task: Mutex::new(None),
            busy: Mutex::new(None),
        }))
    }

    /// The channel new CQs report to, if this mode uses one.
    pub(crate) fn channel(&self) -> Option<Arc<dyn CompletionChannel>> {
        self.channel.clone()
    }

    /// Starts serving `conn`'s CQ (its QP is connected). With manual polling nothing
    /// serves it: the application calls `poll_completions`.
    pub(crate) fn register(
        self: &Arc<Self>,
        conn: &Arc<ConnShared>,
        cq: &Arc<dyn CompletionQueue>,
    ) -> Result<()> {
        self.serve(cq, Owner::Conn(Arc::downgrade(conn)))
    }

    /// Starts serving a shared receive queue's completion queue.
    pub(crate) fn register_srq(self: &Arc<Self>, srq: &Arc<SrqShared>) -> Result<()> {
        self.serve(&srq.cq, Owner::Srq(Arc::downgrade(srq)))
    }

    fn serve(self: &Arc<Self>, cq: &Arc<dyn CompletionQueue>, owner: Owner) -> Result<()> {
        if self.polling == Polling::Manual {
            return Ok(());
        }
        let live = owner.upgrade();
        lock(&self.entries).insert(
            cq.id(),
            Entry {
                cq: cq.clone(),
                conn: owner,
            },
        );
        self.generation.fetch_add(1, Ordering::AcqRel);
        match self.polling {
            Polling::Manual => Ok(()),
            Polling::Busy => self.start_busy(),
            Polling::Event | Polling::Adaptive { .. } => {
                self.start_task()?;
                // Arm the new CQ; whatever completed before arming is polled here.
                if let Some(live) = &live {
                    settle(live);
                }
                Ok(())
            }
        }
    }

    /// A connection went away: its entry is dropped the next time the dispatcher looks.
    pub(crate) fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// The device is closing (no connection is left): the task or thread ends.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Some(t) = lock(&self.busy).as_ref() {
            t.unpark();
        }
    }

    fn start_busy(self: &Arc<Self>) -> Result<()> {
        let mut busy = lock(&self.busy);
        if let Some(t) = busy.as_ref() {
            t.unpark();
            return Ok(());
        }
        let d = self.clone();
        let handle = std::thread::Builder::new()
            .name("remem-poll".into())
            .spawn(move || d.busy_loop())?;
        *busy = Some(handle.thread().clone());
        Ok(())
    }

    fn busy_loop(self: Arc<Self>) {
        let mut seen = u64::MAX;
        let mut conns: Vec<Owner> = Vec::new();
        while !self.stopped.load(Ordering::Acquire) {
            let generation = self.generation.load(Ordering::Acquire);
            if generation != seen {
                seen = generation;
                let mut entries = lock(&self.entries);
                entries.retain(|_, e| e.conn.strong_count() > 0);
                conns = entries.values().map(|e| e.conn.clone()).collect();
            }
            if conns.is_empty() {
                // Unparked by the next registration or by `stop`.
                std::thread::park();
                continue;
            }
            let mut handled = 0;
            if let Some(ctx) = &self.driven
                && let Err(e) = ctx.drive(Duration::ZERO)
            {
                tracing::warn!(error = %e, "driving the device failed");
            }
            for c in &conns {
                if let Some(c) = c.upgrade() {
                    handled += c.poll_cq();
                }
            }
            if handled == 0 {
                std::hint::spin_loop();
            }
        }
    }

    fn start_task(self: &Arc<Self>) -> Result<()> {
        let mut task = lock(&self.task);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return Ok(());
        }
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument(
                "event-driven polling needs a tokio runtime (or use Polling::Manual)".into(),
            )
        })?;
        let Some(channel) = self.channel.clone() else {
            return Err(Error::InvalidArgument("no completion channel".into()));
        };
        let fd = crate::sys::ChannelFd::new(channel.fd())?;
        let spin = match self.polling {
            Polling::Adaptive { spin } => spin,
            _ => Duration::ZERO,
        };
        *task = Some(rt.spawn(self.clone().event_loop(channel, fd, spin)));
        Ok(())
    }

    async fn event_loop(
        self: Arc<Self>,
        channel: Arc<dyn CompletionChannel>,
        fd: crate::sys::ChannelFd,
        spin: Duration,
    ) {
        let mut fired: HashMap<CqId, u32> = HashMap::new();
        loop {
            tokio::select! {
                r = fd.readable() => if r.is_err() { return },
                _ = self.wake.notified() => {}
            }
            if self.stopped.load(Ordering::Acquire) {
                return;
            }
            while let Ok(Some(id)) = channel.get_cq_event() {
                *fired.entry(id).or_default() += 1;
            }
            let mut hot = Vec::with_capacity(fired.len());
            {
                let mut entries = lock(&self.entries);
                for (id, n) in fired.drain() {
                    if let Some(e) = entries.get(&id) {
                        e.cq.ack_events(n);
                        if let Some(c) = e.conn.upgrade() {
                            hot.push(c);
                        }
                    }
                }
                entries.retain(|_, e| e.conn.strong_count() > 0);
            }
            if !spin.is_zero() {
                // Adaptive: keep polling the connections that fired while they keep
                // completing; sleep on the channel once they have been idle for `spin`.
                let mut idle_since = Instant::now();
                loop {
                    let handled: usize = hot.iter().map(|c| c.poll_cq()).sum();
                    if handled > 0 {
                        idle_since = Instant::now();
                    } else if idle_since.elapsed() >= spin {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
            for c in &hot {
                settle(c);
            }
        }
    }
}

/// Drains `conn`'s CQ and arms it; a completion that arrived before arming raises no
/// event, so the CQ is polled once more after arming.
fn settle(conn: &Live) {
    loop {
        conn.poll_cq();
        if let Err(e) = conn.arm() {
            tracing::warn!(error = %e, "cannot arm a completion queue");
            conn.fail_local(crate::error::LocalFailure::CompletionQueue);
            return;
        }
        if conn.poll_cq() == 0 {
            return;
        }
    }
}
