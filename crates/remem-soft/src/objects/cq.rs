//! Completion queues.

use super::events::{AsyncEvents, SoftCompChannel};
use remem_verbs::{
    AsyncEvent, AsyncEventElement, AsyncEventType, CqId, Error, Result, WcStatus, WorkCompletion,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<WorkCompletion>,
    overflowed: bool,
    /// `Some(solicited_only)` while armed.
    armed: Option<bool>,
}

/// A completion queue (`ibv_cq`).
///
/// When a completion arrives while the queue holds `cqe` entries the CQ overruns: that
/// completion is lost (and counted), the `CQ_ERR` async event is raised once, and after the
/// completions already queued have been polled, `poll` fails — as a hardware CQ overrun.
#[derive(Debug)]
pub struct SoftCq {
    id: CqId,
    depth: u32,
    inner: Mutex<Inner>,
    channel: Option<Arc<SoftCompChannel>>,
    events: Arc<AsyncEvents>,
    pub(crate) device_id: u64,
    lost: AtomicU64,
    acked: AtomicU64,
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
            depth,
            inner: Mutex::new(Inner::default()),
            channel,
            events,
            device_id,
            lost: AtomicU64::new(0),
            acked: AtomicU64::new(0),
        }
    }

    /// Adds a completion; `false` if the CQ overran (the completion is lost and counted).
    pub fn push(&self, wc: WorkCompletion, solicited: bool) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.overflowed || g.queue.len() >= self.depth as usize {
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
            if let Some(ch) = &self.channel {
                ch.notify(self.id.0);
            }
        }
        true
    }

    /// Completions lost to overrun.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Events acknowledged so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }
}

impl remem_verbs::CompletionQueue for SoftCq {
    fn id(&self) -> CqId {
        self.id
    }

    fn cqe(&self) -> u32 {
        self.depth
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

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::InvalidArgument(
                "req_notify on a CQ created without a completion channel".into(),
            ));
        }
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).armed = Some(solicited_only);
        Ok(())
    }

    fn ack_events(&self, n: u32) {
        self.acked.fetch_add(u64::from(n), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::{CompletionChannel, CompletionQueue};

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            ..WorkCompletion::default()
        }
    }

    #[test]
    fn order_overflow_and_error() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let cq = SoftCq::new(CqId(3), 2, None, ev.clone(), 1);
        assert!(cq.push(wc(1), false));
        assert!(cq.push(wc(2), false));
        assert!(!cq.push(wc(3), false));
        assert_eq!(cq.lost(), 1);
        let e = ev.pop().unwrap();
        assert_eq!(e.event_type, AsyncEventType::CqErr);
        assert_eq!(e.element, AsyncEventElement::Cq(CqId(3)));
        assert!(ev.pop().is_none(), "raised once");
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
        assert!(
            cq.poll(&mut out).is_err(),
            "overrun reported after the queue drains"
        );
    }

    #[test]
    fn notify_once_and_solicited_only() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let ch = Arc::new(SoftCompChannel::new(1).unwrap());
        let cq = SoftCq::new(CqId(9), 16, Some(ch.clone()), ev, 1);
        cq.push(wc(1), false);
        assert_eq!(ch.get_cq_event().unwrap(), None, "not armed");
        cq.req_notify(false).unwrap();
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
        cq.ack_events(3);
        assert_eq!(cq.acked(), 3);
    }
}
