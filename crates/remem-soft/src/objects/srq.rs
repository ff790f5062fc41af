//! Shared receive queues and address handles.

use super::DeviceShared;
use crate::qp::{build_recv_wqe, post_each};
use crate::wqe::{PdId, RecvWqe};
use remem_verbs::{
    AhAttr, AsyncEvent, AsyncEventElement, AsyncEventType, Error, PostError, RecvWr, Result,
    SrqAttr,
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
}

impl SoftSrq {
    pub(crate) fn new(num: u32, pd: PdId, attr: SrqAttr, dev: Arc<DeviceShared>) -> Result<Self> {
        let lim = &dev.limits;
        if attr.max_wr == 0 || attr.max_wr > lim.max_wr || attr.max_sge > lim.max_sge {
            return Err(Error::InvalidArgument(format!(
                "SRQ of {} WRs × {} SGEs is outside the device limits",
                attr.max_wr, attr.max_sge
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
        })
    }

    /// Takes the oldest receive; raises `SRQ_LIMIT_REACHED` once when an armed limit is
    /// crossed.
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

/// An address handle (`ibv_ah`).
#[derive(Debug)]
pub struct SoftAh {
    pub(crate) attr: AhAttr,
}

impl remem_verbs::AddressHandle for SoftAh {
    fn attr(&self) -> &AhAttr {
        &self.attr
    }
}
