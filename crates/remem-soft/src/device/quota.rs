//! Per-device object limits: `max_pd`, `max_cq`, `max_qp`, `max_srq` and `max_ah` are
//! enforced, not just reported. Each live object holds a [`Slot`]; dropping it frees the slot.

use remem_verbs::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// How many objects of one kind may live at once, and how many do.
#[derive(Debug)]
pub struct Quota {
    what: &'static str,
    max: u32,
    used: AtomicU32,
}

/// One live object's share of a [`Quota`].
#[derive(Debug)]
pub struct Slot(Arc<Quota>);

impl Quota {
    /// A quota of `max` objects of kind `what` (named in the error when it runs out).
    pub fn new(what: &'static str, max: u32) -> Arc<Self> {
        Arc::new(Quota {
            what,
            max,
            used: AtomicU32::new(0),
        })
    }

    /// Takes a slot, or fails with [`Error::Exhausted`] when `max` objects live.
    pub fn take(self: &Arc<Self>) -> Result<Slot> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < self.max).then_some(u + 1)
            })
            .map_err(|_| Error::Exhausted(self.what))?;
        Ok(Slot(self.clone()))
    }

    /// Live objects.
    #[cfg(any(test, feature = "internals"))]
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The quotas of one device.
#[derive(Debug)]
pub struct Quotas {
    /// Protection domains.
    pub pd: Arc<Quota>,
    /// Completion queues.
    pub cq: Arc<Quota>,
    /// Queue pairs.
    pub qp: Arc<Quota>,
    /// Shared receive queues.
    pub srq: Arc<Quota>,
    /// Address handles.
    pub ah: Arc<Quota>,
}

impl Quotas {
    /// The quotas a device's attributes promise.
    pub fn new(attr: &remem_verbs::DeviceAttr) -> Self {
        Quotas {
            pd: Quota::new("protection domains (max_pd)", attr.max_pd),
            cq: Quota::new("completion queues (max_cq)", attr.max_cq),
            qp: Quota::new("queue pairs (max_qp)", attr.max_qp),
            srq: Quota::new("shared receive queues (max_srq)", attr.max_srq),
            ah: Quota::new("address handles (max_ah)", attr.max_ah),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_and_returned() {
        let q = Quota::new("things", 2);
        let a = q.take().unwrap();
        let b = q.take().unwrap();
        assert!(matches!(q.take(), Err(Error::Exhausted("things"))));
        assert_eq!(q.used(), 2);
        drop(a);
        let _c = q.take().unwrap();
        drop(b);
        assert_eq!(q.used(), 1);
    }
}
