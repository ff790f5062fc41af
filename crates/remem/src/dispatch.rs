//! One completion dispatcher per [`Rdma`](crate::Rdma), shared by every connection made
//! from it (those it connects and those its listeners accept) and every shared receive
//! queue.
//!
//! Each connection keeps a completion queue of its own (sized for its queue pair, so one
//! busy connection cannot overrun another's CQ), and every CQ reports to the same
//! completion channel. One task (event-driven and adaptive polling) sleeps on that channel,
//! learns from each CQ event which CQ fired, acknowledges the event, and drains that CQ; in
//! busy mode one thread polls every CQ in turn. Routing is by CQ id, so a thousand
//! connections cost one task and one file descriptor, not a thousand.
//!
//! The dispatcher serves anything that implements [`Served`] (poll, arm, fail; connections
//! and shared receive queues do) and knows nothing else about them: it sits below the
//! connection layer. It owns the polling mode (connections ask it whether the application
//! polls by hand) and the routing of the device's asynchronous events.

use crate::error::{Error, LocalFailure, Result};
use remem_verbs::{AsyncEvent, CompletionChannel, CompletionQueue, Context, CqId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, broadcast};

/// How a connection's completions are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polling {
    /// One tokio task per [`Rdma`](crate::Rdma) sleeps on the completion channel that every
    /// connection's CQ reports to (epoll through `AsyncFd`), and wakes per completion
    /// event. Uses no CPU while idle.
    Event,
    /// As [`Polling::Event`], but after each completion the task keeps polling for `spin`
    /// before it sleeps again: busy under load, asleep when idle.
    Adaptive {
        /// How long to keep polling after the last completion.
        spin: Duration,
    },
    /// One thread polls every connection's CQ without ever sleeping: the lowest latency,
    /// one CPU. After a round that found nothing it yields the CPU (`sched_yield`) to any
    /// other thread that is ready (a soft device's progress thread, say), and goes on at
    /// once when none is.
    Busy,
    /// Nothing polls: the application calls
    /// [`Connection::poll_completions`](crate::Connection::poll_completions).
    Manual,
}

/// What the dispatcher serves: something with completion queues (a connection, a shared
/// receive queue) that it polls, arms and, when they can no longer be served, fails; and
/// that may be concerned by the device's asynchronous events.
pub(crate) trait Served: Send + Sync {
    /// Handles the completions that have arrived; returns how many.
    fn poll(self: Arc<Self>) -> usize;
    /// Arms the completion queues for the next completion event.
    fn arm(&self) -> remem_verbs::Result<()>;
    /// The completion queues can no longer be served.
    fn fail(&self, reason: LocalFailure);
    /// An asynchronous event of the device; returns whether it concerned this one.
    fn on_event(&self, _ev: &AsyncEvent) -> bool {
        false
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A served completion queue. The dispatcher holds the CQ itself, so it can still
/// acknowledge an event it has taken for an owner that is going away (a provider may
/// refuse to destroy a CQ with unacknowledged events).
struct Entry {
    cq: Arc<dyn CompletionQueue>,
    owner: Weak<dyn Served>,
}

/// The completion dispatcher of one [`Rdma`](crate::Rdma).
pub(crate) struct Dispatcher {
    polling: Polling,
    /// The device: driven by the busy-polling thread (and `drive`) when its user drives it;
    /// its asynchronous events routed.
    ctx: Arc<dyn Context>,
    /// The channel every CQ reports to (event-driven and adaptive polling).
    channel: Option<Arc<dyn CompletionChannel>>,
    entries: Mutex<HashMap<CqId, Entry>>,
    /// Bumped on every registration and every owner that goes away.
    generation: AtomicU64,
    /// Wakes the task (an owner went away, or the device is closing).
    wake: Notify,
    stopped: AtomicBool,
    /// The event-driven task, once started (restarted if its runtime shut down).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The busy-polling thread, once started.
    busy: Mutex<Option<std::thread::Thread>>,
    /// Who asynchronous events are routed to (connections, by QP number).
    watched: Arc<Mutex<HashMap<u32, Weak<dyn Served>>>>,
    /// Every asynchronous event of the device, for subscribers.
    events: broadcast::Sender<AsyncEvent>,
    /// The task reading the device's events, once started; told to stop on `stop`.
    watcher: OnceLock<Arc<Notify>>,
    /// Held while events are routed ([`Router::order`]).
    route_order: Arc<Mutex<()>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("polling", &self.polling)
            .field("served", &lock(&self.entries).len())
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
            ctx: ctx.clone(),
            channel,
            entries: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            task: Mutex::new(None),
            busy: Mutex::new(None),
            watched: Arc::default(),
            events: broadcast::channel(64).0,
            watcher: OnceLock::new(),
            route_order: Arc::default(),
        }))
    }

    /// Whether the application collects completions itself ([`Polling::Manual`]): then
    /// whoever waits for a completion must poll for it.
    pub(crate) fn is_manual(&self) -> bool {
        self.polling == Polling::Manual
    }

    /// Moves the packets of a device its user drives, without waiting (nothing for other
    /// devices).
    pub(crate) fn drive(&self) {
        if self.ctx.caller_driven()
            && let Err(e) = self.ctx.drive(Duration::ZERO)
        {
            tracing::warn!(error = %e, "driving the device failed");
        }
    }

    /// The channel new CQs report to, if this mode uses one.
    pub(crate) fn channel(&self) -> Option<Arc<dyn CompletionChannel>> {
        self.channel.clone()
    }

    /// Starts serving `cq` for `owner`. With manual polling nothing serves it: the
    /// application polls.
    pub(crate) fn serve<S: Served + 'static>(
        self: &Arc<Self>,
        owner: &Arc<S>,
        cq: &Arc<dyn CompletionQueue>,
    ) -> Result<()> {
        if self.is_manual() {
            return Ok(());
        }
        let weak: Weak<dyn Served> = Arc::downgrade(owner) as Weak<dyn Served>;
        lock(&self.entries).insert(
            cq.id(),
            Entry {
                cq: cq.clone(),
                owner: weak,
            },
        );
        self.generation.fetch_add(1, Ordering::AcqRel);
        match self.polling {
            Polling::Manual => Ok(()),
            Polling::Busy => self.start_busy(),
            Polling::Event | Polling::Adaptive { .. } => {
                self.start_task()?;
                // Arm the new CQ; whatever completed before arming is polled here.
                settle(&(owner.clone() as Arc<dyn Served>));
                Ok(())
            }
        }
    }

    /// An owner went away: its entries are dropped the next time the dispatcher looks.
    pub(crate) fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// The device is closing (nothing is left to serve): the task or thread ends, and so
    /// does the watcher of asynchronous events.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Some(t) = lock(&self.busy).as_ref() {
            t.unpark();
        }
        if let Some(stop) = self.watcher.get() {
            stop.notify_one();
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
        let mut owners: Vec<Weak<dyn Served>> = Vec::new();
        while !self.stopped.load(Ordering::Acquire) {
            let generation = self.generation.load(Ordering::Acquire);
            if generation != seen {
                seen = generation;
                let mut entries = lock(&self.entries);
                entries.retain(|_, e| e.owner.strong_count() > 0);
                owners = entries.values().map(|e| e.owner.clone()).collect();
            }
            if owners.is_empty() {
                // Unparked by the next registration or by `stop`.
                std::thread::park();
                continue;
            }
            self.drive();
            let mut handled = 0;
            for o in &owners {
                if let Some(o) = o.upgrade() {
                    handled += o.poll();
                }
            }
            if handled == 0 {
                // Nothing came: let another thread that is ready have the CPU (a device's
                // progress thread, the peer), as a busy-polling NIC driver would not need
                // to; on an idle machine this returns at once.
                std::thread::yield_now();
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
            let mut hot: Vec<Arc<dyn Served>> = Vec::with_capacity(fired.len());
            {
                let mut entries = lock(&self.entries);
                for (id, n) in fired.drain() {
                    if let Some(e) = entries.get(&id) {
                        e.cq.ack_events(n);
                        if let Some(o) = e.owner.upgrade() {
                            hot.push(o);
                        }
                    }
                }
                entries.retain(|_, e| e.owner.strong_count() > 0);
            }
            if !spin.is_zero() {
                // Adaptive: keep polling the owners that fired while they keep completing;
                // sleep on the channel once they have been idle for `spin`.
                let mut idle_since = Instant::now();
                loop {
                    let handled: usize = hot.iter().map(|o| o.clone().poll()).sum();
                    if handled > 0 {
                        idle_since = Instant::now();
                    } else if idle_since.elapsed() >= spin {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
            for o in &hot {
                settle(o);
            }
        }
    }

    /// Routes the device's asynchronous events to `owner` (a connection with QP number
    /// `qpn`) from now on.
    pub(crate) fn watch<S: Served + 'static>(&self, qpn: u32, owner: &Arc<S>) {
        let mut watched = lock(&self.watched);
        watched.retain(|_, w| w.strong_count() > 0);
        watched.insert(qpn, Arc::downgrade(owner) as Weak<dyn Served>);
        drop(watched);
        if let Err(e) = self.start_watcher() {
            tracing::debug!(error = %e, "asynchronous events are not watched");
        }
    }

    /// A receiver of every asynchronous event of the device from now on.
    pub(crate) fn subscribe(&self) -> Result<broadcast::Receiver<AsyncEvent>> {
        let rx = self.events.subscribe();
        self.start_watcher()?;
        Ok(rx)
    }

    fn start_watcher(&self) -> Result<()> {
        if self.watcher.get().is_some() {
            return Ok(());
        }
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument("watching asynchronous events needs a tokio runtime".into())
        })?;
        let fd = crate::sys::ChannelFd::new(self.ctx.async_fd())?;
        let stop = Arc::new(Notify::new());
        if self.watcher.set(stop.clone()).is_err() {
            return Ok(()); // another caller started it
        }
        // The task holds the device and the routing table, not the dispatcher: `stop`
        // (the device closing) ends it.
        let router = self.router();
        rt.spawn(async move {
            loop {
                tokio::select! {
                    r = fd.readable() => if r.is_err() { return },
                    _ = stop.notified() => return,
                }
                router.route();
            }
        });
        Ok(())
    }

    fn router(&self) -> Router {
        Router {
            ctx: self.ctx.clone(),
            events: self.events.clone(),
            watched: self.watched.clone(),
            order: self.route_order.clone(),
        }
    }

    /// Routes the asynchronous events the device has queued now, on the caller's thread
    /// (otherwise the watcher does, when it next runs): a connection that sees its QP
    /// flushed without having moved it to the error state learns first the event that
    /// says why (`ConnShared::mark_closed`).
    pub(crate) fn route_events(&self) {
        self.router().route();
    }
}

/// What routing asynchronous events takes: the device, its subscribers and watchers.
struct Router {
    ctx: Arc<dyn Context>,
    events: broadcast::Sender<AsyncEvent>,
    watched: Arc<Mutex<HashMap<u32, Weak<dyn Served>>>>,
    /// Held while routing: events reach everyone in the order the device queued them,
    /// whichever thread routes them.
    order: Arc<Mutex<()>>,
}

impl Router {
    /// Takes every queued event and tells each watcher and subscriber of it.
    fn route(&self) {
        let _order = lock(&self.order);
        while let Some(ev) = self.ctx.get_async_event() {
            tracing::debug!(event = %ev, "asynchronous event");
            let live: Vec<_> = lock(&self.watched)
                .values()
                .filter_map(Weak::upgrade)
                .collect();
            for o in live {
                o.on_event(&ev);
            }
            let _ = self.events.send(ev);
        }
    }
}

/// Drains `owner`'s CQs and arms them; a completion that arrived before arming raises no
/// event, so they are polled once more after arming.
fn settle(owner: &Arc<dyn Served>) {
    loop {
        owner.clone().poll();
        if let Err(e) = owner.arm() {
            tracing::warn!(error = %e, "cannot arm a completion queue");
            owner.fail(LocalFailure::CompletionQueue);
            return;
        }
        if owner.clone().poll() == 0 {
            return;
        }
    }
}
