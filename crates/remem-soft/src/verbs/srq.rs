//! Shared receive queues.

use crate::device::DeviceShared;
use crate::transport::wqe::{PdId, RecvWqe};
use crate::verbs::qp::{build_recv_wqe, post_each};
use remem_verbs::{
    AsyncEvent, AsyncEventElement, AsyncEventType, Error, PostError, RecvWr, Result, SrqAttr,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Inner {
    queue: VecDeque<RecvWqe>,
    limit: u32,
}

/// A shared receive queue (`ibv_srq`).
#[derive(Debug)]
pub struct SoftSrq {
    num: u32,
    pd: PdId,
    max_wr: u32,
    max_sge: u32,
    inner: Mutex<Inner>,
    pub(crate) dev: Arc<DeviceShared>,
    slot: Option<crate::device::quota::Slot>,
}

impl SoftSrq {
    /// An SRQ of device `dev` in `pd`, checked against `max_srq_wr` and `max_srq_sge`. The
    /// `srq_limit` given at creation arms the limit event at once, as rxe does (rdma-core
    /// documents it as ignored by `ibv_create_srq`).
    pub(crate) fn new(num: u32, pd: PdId, attr: SrqAttr, dev: Arc<DeviceShared>) -> Result<Self> {
        let (max_wr, max_sge) = (dev.attr.max_srq_wr, dev.attr.max_srq_sge);
        if attr.max_wr == 0 || attr.max_wr > max_wr || attr.max_sge > max_sge {
            return Err(Error::InvalidArgument(format!(
                "SRQ of {} WRs × {} SGEs: the device allows 1..={max_wr} WRs and up to \
                 {max_sge} SGEs",
                attr.max_wr, attr.max_sge
            )));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(Error::InvalidArgument(format!(
                "srq_limit {} above max_wr {}",
                attr.srq_limit, attr.max_wr
            )));
        }
        Ok(SoftSrq {
            num,
            pd,
            max_wr: attr.max_wr,
            max_sge: attr.max_sge.max(1),
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                limit: attr.srq_limit,
            }),
            dev,
            slot: None,
        })
    }

    /// The SRQ, holding `slot` of its device's SRQ quota while it lives.
    pub(crate) fn with_slot(mut self, slot: crate::device::quota::Slot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Receives posted and not yet taken.
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .queue
            .len()
    }

    /// Whether no receive is posted.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the oldest receive (for the responder). If the limit is armed and fewer than
    /// `srq_limit` receives remain afterwards, raises `SRQ_LIMIT_REACHED` once and disarms
    /// (the limit reads 0 until armed again). As in rxe, only taking a receive fires the
    /// event: arming a limit above the current count does not.
    pub fn pop(&self) -> Option<RecvWqe> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let w = g.queue.pop_front()?;
        if g.limit > 0 && (g.queue.len() as u32) < g.limit {
            g.limit = 0;
            self.dev.events.raise(AsyncEvent {
                event_type: AsyncEventType::SrqLimitReached,
                element: AsyncEventElement::Srq(self.num),
            });
        }
        Some(w)
    }
}

impl remem_verbs::SharedReceiveQueue for SoftSrq {
    fn srq_num(&self) -> u32 {
        self.num
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        post_each(wrs, |wr| {
            let w = build_recv_wqe(wr, self.max_sge, self.pd, &self.dev.mrs)?;
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if g.queue.len() as u32 >= self.max_wr {
                return Err(Error::QueueFull {
                    outstanding: g.queue.len() as u32,
                });
            }
            g.queue.push_back(w);
            Ok(())
        })
    }

    /// Arms (or with 0 disarms) the limit event; above `max_wr` is `InvalidArgument`.
    fn set_limit(&self, srq_limit: u32) -> Result<()> {
        if srq_limit > self.max_wr {
            return Err(Error::InvalidArgument(format!(
                "limit {srq_limit} above max_wr {}",
                self.max_wr
            )));
        }
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).limit = srq_limit;
        Ok(())
    }

    fn query(&self) -> Result<SrqAttr> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: g.limit,
        })
    }
}
