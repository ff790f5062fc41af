//! Completion queues.

use crate::device::events::{AsyncEvents, SoftCompChannel};
use remem_verbs::{
    AsyncEvent, AsyncEventElement, AsyncEventType, CqId, Error, Result, WcStatus, WorkCompletion,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Inner {
    queue: VecDeque<WorkCompletion>,
    overflowed: bool,
    /// `Some(solicited_only)` while armed.
    armed: Option<bool>,
}

/// A completion queue (`ibv_cq`) of exactly `cqe` entries, allocated at creation (pushing
/// never allocates). [`resize`](remem_verbs::CompletionQueue::resize) changes the size
/// (up to `max_cqe`, not below what it holds), keeping what it holds in order.
///
/// **Overrun.** When a completion arrives while the queue holds `cqe` entries, the CQ
/// overruns, as a hardware CQ does: that completion — and every later one — is lost and
/// counted ([`SoftCq::lost`]), the `CQ_ERR` async event is raised once, and `poll` fails
/// with [`Error::Exhausted`] once the completions queued before the overrun have been
/// polled (they are still delivered, oldest first). The CQ stays in error; its QPs' work
/// requests can no longer be reaped, so the application must tear them down.
///
/// **Notification.** [`req_notify`](remem_verbs::CompletionQueue::req_notify) arms the CQ
/// once: the next completion added (or, solicited-only, the next solicited or unsuccessful
/// one) puts one event naming this CQ on its channel and disarms it. Completions already
/// queued when it is armed do not fire. Arming for any completion while armed for
/// solicited ones widens the arming; arming for solicited ones while armed for any leaves
/// it as it is (IBTA's "next completion" wins).
///
/// **Acknowledgement.** `ack_events` only counts ([`SoftCq::unacked`]). rdma-core's
/// `ibv_destroy_cq` blocks until every event was acknowledged; here dropping a CQ with
/// unacknowledged events is allowed, and events already on the channel still name its
/// (no longer used) [`CqId`].
#[derive(Debug)]
pub struct SoftCq {
    id: CqId,
    /// The size (changed under the `inner` lock by `resize`).
    depth: AtomicU32,
    /// The device's `max_cqe` (the most `resize` grants).
    max_depth: u32,
    inner: Mutex<Inner>,
    channel: Option<Arc<SoftCompChannel>>,
    events: Arc<AsyncEvents>,
    pub(crate) device_id: u64,
    lost: AtomicU64,
    notified: AtomicU64,
    acked: AtomicU64,
    slot: Option<crate::device::quota::Slot>,
}

impl SoftCq {
    pub(crate) fn new(
        id: CqId,
        depth: u32,
        channel: Option<Arc<SoftCompChannel>>,
        events: Arc<AsyncEvents>,
        device_id: u64,
    ) -> Self {
        SoftCq {
            id,
            depth: AtomicU32::new(depth),
            max_depth: depth,
            inner: Mutex::new(Inner {
                queue: VecDeque::with_capacity(depth as usize),
                overflowed: false,
                armed: None,
            }),
            channel,
            events,
            device_id,
            lost: AtomicU64::new(0),
            notified: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            slot: None,
        }
    }

    /// The CQ, resizable up to `max_cqe` entries.
    pub(crate) fn with_max(mut self, max_cqe: u32) -> Self {
        self.max_depth = max_cqe.max(self.max_depth);
        self
    }

    /// The CQ, holding `slot` of its device's CQ quota while it lives.
    pub(crate) fn with_slot(mut self, slot: crate::device::quota::Slot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Adds a completion; `solicited` is the SE bit of a receive completion's last packet
    /// (pass `false` for send completions). Returns `false` if the CQ overran: the
    /// completion is lost and counted, and the CQ is in error (see [`SoftCq`]).
    pub fn push(&self, wc: WorkCompletion, solicited: bool) -> bool {
        let fire = {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if g.overflowed || g.queue.len() >= self.depth.load(Ordering::Relaxed) as usize {
                self.lost.fetch_add(1, Ordering::Relaxed);
                if !g.overflowed {
                    g.overflowed = true;
                    self.events.raise(AsyncEvent {
                        event_type: AsyncEventType::CqErr,
                        element: AsyncEventElement::Cq(self.id),
                    });
                }
                return false;
            }
            g.queue.push_back(wc);
            let fire = match g.armed {
                Some(false) => true,
                Some(true) => solicited || wc.status != WcStatus::Success,
                None => false,
            };
            if fire {
                g.armed = None;
            }
            fire
        };
        if fire && let Some(ch) = &self.channel {
            self.notified.fetch_add(1, Ordering::Relaxed);
            ch.notify(self.id);
        }
        true
    }

    /// Completions lost to overrun.
    #[cfg(any(test, feature = "internals"))]
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Whether the CQ overran (and is in error).
    #[cfg(any(test, feature = "internals"))]
    pub fn overflowed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .overflowed
    }

    /// Events acknowledged so far.
    #[cfg(any(test, feature = "internals"))]
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Events put on the channel and not (yet) acknowledged.
    #[cfg(any(test, feature = "internals"))]
    pub fn unacked(&self) -> u64 {
        self.notified
            .load(Ordering::Relaxed)
            .saturating_sub(self.acked())
    }
}

impl remem_verbs::CompletionQueue for SoftCq {
    fn id(&self) -> CqId {
        self.id
    }

    fn cqe(&self) -> u32 {
        self.depth.load(Ordering::Relaxed)
    }

    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let n = wc.len().min(g.queue.len());
        for (slot, c) in wc.iter_mut().zip(g.queue.drain(..n)) {
            *slot = c;
        }
        if n == 0 && g.overflowed {
            return Err(Error::Exhausted(
                "completion queue overrun: completions were lost",
            ));
        }
        Ok(n)
    }

    /// Arms the CQ. A CQ created without a channel has nowhere to report and is refused
    /// with [`Error::InvalidArgument`] (rdma-core accepts the call and drops the event).
    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::InvalidArgument(
                "req_notify on a CQ created without a completion channel".into(),
            ));
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.armed = match g.armed {
            Some(false) => Some(false),
            _ => Some(solicited_only),
        };
        Ok(())
    }

    fn ack_events(&self, n: u32) {
        self.acked.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    /// Resizes to exactly `size` entries (`cqe..=max_cqe`; `cqe` at least the completions
    /// held), under the queue's lock: completions arriving meanwhile wait, none is lost or
    /// reordered. Growing reserves the room at once (pushing still never allocates).
    fn resize(&self, cqe: u32, size: u32) -> Result<u32> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if cqe == 0 || size < cqe || size > self.max_depth {
            return Err(Error::InvalidArgument(format!(
                "cqe {cqe} (size {size}) outside 1..={}",
                self.max_depth
            )));
        }
        if (cqe as usize) < g.queue.len() {
            return Err(Error::InvalidArgument(format!(
                "cqe {cqe} is fewer than the {} completions the CQ holds",
                g.queue.len()
            )));
        }
        let len = g.queue.len();
        g.queue.reserve(size as usize - len);
        g.queue.shrink_to(size as usize);
        self.depth.store(size, Ordering::Relaxed);
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::events::readable;
    use remem_verbs::{CompletionChannel, CompletionQueue};

    #[test]
    fn resize_keeps_the_completions_in_order_and_refuses_below_them() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let cq = SoftCq::new(CqId(3), 2, None, ev, 1).with_max(8);
        let wc = |id: u64| WorkCompletion {
            wr_id: id,
            ..WorkCompletion::default()
        };
        assert!(cq.push(wc(1), false) && cq.push(wc(2), false));
        // Full at 2: growing makes room, keeping what it holds.
        assert_eq!(cq.resize(4, 4).unwrap(), 4);
        assert_eq!(cq.cqe(), 4);
        assert!(cq.push(wc(3), false) && cq.push(wc(4), false));
        let refused = |r: Result<u32>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(refused(cq.resize(3, 3)), "below the fill");
        assert!(
            refused(cq.resize(3, 7)),
            "asked below the fill, whatever the rounding"
        );
        assert!(refused(cq.resize(0, 1)));
        assert!(refused(cq.resize(5, 4)), "a size below the ask");
        assert!(refused(cq.resize(8, 9)), "past max_cqe");
        assert_eq!(cq.cqe(), 4);
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out[..2]).unwrap(), 2);
        // Shrinking to what it holds: the next completion overruns.
        assert_eq!(cq.resize(2, 2).unwrap(), 2);
        assert!(!cq.push(wc(5), false));
        let n = cq.poll(&mut out).unwrap();
        assert_eq!(
            out[..n].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            [3, 4],
            "order kept across resizes"
        );
        assert!(cq.overflowed());
    }

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            ..WorkCompletion::default()
        }
    }

    fn cq_with_channel(depth: u32) -> (SoftCq, Arc<SoftCompChannel>, Arc<AsyncEvents>) {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let ch = Arc::new(SoftCompChannel::new(1).unwrap());
        let cq = SoftCq::new(CqId(9), depth, Some(ch.clone()), ev.clone(), 1);
        (cq, ch, ev)
    }

    #[test]
    fn oldest_first_in_batches() {
        let (cq, _, _) = cq_with_channel(8);
        for i in 0..5 {
            assert!(cq.push(wc(i), false));
        }
        let mut out = [WorkCompletion::default(); 3];
        assert_eq!(cq.poll(&mut out).unwrap(), 3);
        assert_eq!(out.map(|w| w.wr_id), [0, 1, 2]);
        assert_eq!(cq.poll(&mut out).unwrap(), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (3, 4));
        assert_eq!(cq.poll(&mut out).unwrap(), 0);
        assert_eq!(cq.poll(&mut []).unwrap(), 0);
        // Room is given back by polling: a full CQ drained accepts `depth` more.
        for i in 0..8 {
            assert!(cq.push(wc(i), false));
        }
        let mut all = [WorkCompletion::default(); 8];
        assert_eq!(cq.poll(&mut all).unwrap(), 8);
        assert!(cq.push(wc(8), false));
        assert!(!cq.overflowed());
    }

    #[test]
    fn order_overflow_and_error() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let cq = SoftCq::new(CqId(3), 2, None, ev.clone(), 1);
        assert!(cq.push(wc(1), false));
        assert!(cq.push(wc(2), false));
        assert!(!readable(ev.fd()));
        assert!(!cq.push(wc(3), false));
        assert!(cq.overflowed());
        assert_eq!(cq.lost(), 1);
        assert!(readable(ev.fd()), "CQ_ERR is pending on the async fd");
        let e = ev.pop().unwrap();
        assert_eq!(e.event_type, AsyncEventType::CqErr);
        assert_eq!(e.element, AsyncEventElement::Cq(CqId(3)));
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(
            cq.poll(&mut out[..1]).unwrap(),
            1,
            "queued ones are still delivered"
        );
        assert_eq!(out[0].wr_id, 1);
        assert!(
            !cq.push(wc(4), false),
            "an overrun CQ stays in error even with room"
        );
        assert_eq!(cq.lost(), 2);
        assert!(ev.pop().is_none(), "raised once");
        assert_eq!(cq.poll(&mut out).unwrap(), 1, "then the rest");
        assert_eq!(out[0].wr_id, 2);
        let err = cq.poll(&mut out).unwrap_err();
        assert!(matches!(err, Error::Exhausted(_)), "{err}");
        assert!(cq.poll(&mut out).is_err(), "and stays so");
    }

    #[test]
    fn notify_once_and_solicited_only() {
        let (cq, ch, _) = cq_with_channel(16);
        cq.push(wc(1), false);
        assert_eq!(ch.get_cq_event().unwrap(), None, "not armed");
        cq.req_notify(false).unwrap();
        assert_eq!(
            ch.get_cq_event().unwrap(),
            None,
            "queued completions do not fire"
        );
        cq.push(wc(2), false);
        cq.push(wc(3), false);
        assert_eq!(ch.get_cq_event().unwrap(), Some(CqId(9)));
        assert_eq!(ch.get_cq_event().unwrap(), None, "one event per arming");
        cq.req_notify(true).unwrap();
        cq.push(wc(4), false);
        assert_eq!(
            ch.get_cq_event().unwrap(),
            None,
            "unsolicited success does not fire"
        );
        cq.push(wc(5), true);
        assert_eq!(ch.get_cq_event().unwrap(), Some(CqId(9)));
        cq.req_notify(true).unwrap();
        cq.push(
            WorkCompletion {
                status: WcStatus::RemAccessErr,
                ..wc(6)
            },
            false,
        );
        assert_eq!(ch.get_cq_event().unwrap(), Some(CqId(9)), "errors fire");
        assert_eq!(cq.unacked(), 3);
        cq.ack_events(3);
        assert_eq!((cq.acked(), cq.unacked()), (3, 0));
    }

    #[test]
    fn arming_widens_but_never_narrows() {
        let (cq, ch, _) = cq_with_channel(16);
        cq.req_notify(false).unwrap();
        cq.req_notify(true).unwrap();
        cq.push(wc(1), false);
        assert_eq!(
            ch.get_cq_event().unwrap(),
            Some(CqId(9)),
            "still armed for any completion"
        );
        cq.req_notify(true).unwrap();
        cq.req_notify(false).unwrap();
        cq.push(wc(2), false);
        assert_eq!(ch.get_cq_event().unwrap(), Some(CqId(9)), "widened");
    }

    #[test]
    fn overrun_does_not_notify() {
        let (cq, ch, ev) = cq_with_channel(1);
        cq.push(wc(1), false);
        cq.req_notify(false).unwrap();
        assert!(!cq.push(wc(2), false));
        assert_eq!(ch.get_cq_event().unwrap(), None);
        assert_eq!(ev.pop().map(|e| e.event_type), Some(AsyncEventType::CqErr));
    }

    #[test]
    fn req_notify_needs_a_channel() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let cq = SoftCq::new(CqId(1), 4, None, ev, 1);
        assert!(matches!(
            cq.req_notify(false),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn channel_fd_wakes_async_fd_on_armed_push() {
        use tokio::io::unix::AsyncFd;
        let (cq, ch, _) = cq_with_channel(16);
        // An owned duplicate of the fd (tokio's safe constructor takes ownership).
        #[allow(deprecated)]
        let fd = AsyncFd::new(ch.fd().try_clone_to_owned().unwrap()).unwrap();
        cq.push(wc(1), false);
        assert_eq!(ch.get_cq_event().unwrap(), None, "unarmed: no event");
        assert!(!readable(ch.fd()));
        cq.req_notify(false).unwrap();
        let waiter = async {
            // The timeout only turns a hang into a failure.
            let ready = tokio::time::timeout(std::time::Duration::from_secs(10), fd.readable());
            let mut guard = ready.await.expect("the channel became readable").unwrap();
            let got = ch.get_cq_event().unwrap();
            guard.clear_ready();
            got
        };
        let pusher = async {
            tokio::task::yield_now().await;
            cq.push(wc(2), false);
        };
        let (got, ()) = tokio::join!(waiter, pusher);
        assert_eq!(got, Some(CqId(9)));
        cq.ack_events(1);
        assert!(!readable(ch.fd()));
        cq.push(wc(3), false);
        assert_eq!(ch.get_cq_event().unwrap(), None, "disarmed after firing");
    }
}
