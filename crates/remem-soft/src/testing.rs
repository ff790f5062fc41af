//! The test fixture the crate's unit tests, integration tests and benchmarks share (public
//! with the `internals` feature): [`Side`], a soft device with one queue pair, one CQ for
//! both its queues and one registered buffer (and more queue pairs on request), and
//! [`pair`], two of them on one UDP port.

#![forbid(unsafe_code)]

use crate::engine::Engine;
use crate::{SoftContext, SoftOptions};
use remem_verbs::rc::RcPeer;
use remem_verbs::{
    AccessFlags, CompletionQueue, Context, Gid, MemRegion, MemoryBuffer, MemoryRegion, Mtu,
    ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair, Sge, WorkCompletion,
};
use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// What a [`Side`] is made of.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The queue pair's type.
    pub qp_type: QpType,
    /// Its queues' sizes.
    pub cap: QpCap,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
    /// The CQ's entries.
    pub cqe: u32,
    /// The registered buffer's length in bytes.
    pub len: usize,
}

impl Default for Spec {
    /// RC, 256 work requests of one SGE each way, nothing inline, signalled on request, a
    /// 1024-entry CQ, 1 MiB.
    fn default() -> Self {
        Spec {
            qp_type: QpType::Rc,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            cqe: 1024,
            len: 1 << 20,
        }
    }
}

/// A soft device with one queue pair, one CQ for both its queues, and one zeroed buffer
/// registered for local writes and remote READ, WRITE and atomics.
pub struct Side {
    /// The device.
    pub ctx: SoftContext,
    /// The protection domain of the QP and the region.
    pub pd: Arc<dyn ProtectionDomain>,
    /// The queue pair.
    pub qp: Arc<dyn QueuePair>,
    /// The CQ of both its queues.
    pub cq: Arc<dyn CompletionQueue>,
    /// The buffer's registration.
    pub mr: Arc<dyn MemoryRegion>,
    /// The buffer.
    pub buf: Arc<MemoryBuffer>,
    /// The region's lkey (read once: no call through `mr` where a benchmark measures).
    pub lkey: u32,
    /// The region's rkey.
    pub rkey: u32,
    /// Every completion [`Side::poll`] took from `cq` so far, in order.
    wcs: RefCell<Vec<WorkCompletion>>,
}

impl Side {
    /// A side on `ctx` as `spec` says.
    pub fn new(ctx: SoftContext, spec: &Spec) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(spec.cqe, None).unwrap();
        let qp = new_qp(&pd, &cq, spec);
        let buf = Arc::new(MemoryBuffer::zeroed(spec.len).unwrap());
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd.reg_mr(MemRegion::whole(buf.clone()), access).unwrap();
        Side {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            ctx,
            pd,
            qp,
            cq,
            mr,
            buf,
            wcs: RefCell::new(Vec::new()),
        }
    }

    /// Another queue pair on this side's device, in its protection domain with [`Side::cq`]
    /// for both its queues, of `spec`'s type, sizes and `sq_sig_all`.
    pub fn create_qp(&self, spec: &Spec) -> Arc<dyn QueuePair> {
        new_qp(&self.pd, &self.cq, spec)
    }

    /// The device's packet engine.
    pub fn engine(&self) -> &Engine {
        &self.ctx.shared().engine
    }

    /// The device's address.
    pub fn local(&self) -> SocketAddr {
        self.ctx.local_addr()
    }

    /// The region's rkey.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// `length` bytes of the buffer from `off`.
    pub fn sge(&self, off: u64, length: u32) -> Sge {
        Sge {
            addr: self.buf.addr() + off,
            length,
            lkey: self.lkey,
        }
    }

    /// This side as a peer sees it: its QP, first PSN `psn`, its address, path MTU `mtu`.
    pub fn peer(&self, psn: u32, mtu: Mtu) -> RcPeer {
        RcPeer {
            qpn: self.qp.qp_num(),
            psn,
            gid: Gid::from(self.local().ip()),
            mtu,
        }
    }

    /// Polls the CQ empty; returns every completion polled so far.
    pub fn poll(&self) -> Vec<WorkCompletion> {
        let mut out = [WorkCompletion::default(); 16];
        let mut wcs = self.wcs.borrow_mut();
        loop {
            let n = self.cq.poll(&mut out).unwrap();
            if n == 0 {
                return wcs.clone();
            }
            wcs.extend_from_slice(&out[..n]);
        }
    }

    /// A device counter.
    pub fn counter(&self, name: &str) -> u64 {
        let counters = self.ctx.counters();
        counters.iter().find(|c| c.name == name).unwrap().value
    }
}

/// A queue pair in `pd` with `cq` for both its queues, as `spec` says.
fn new_qp(
    pd: &Arc<dyn ProtectionDomain>,
    cq: &Arc<dyn CompletionQueue>,
    spec: &Spec,
) -> Arc<dyn QueuePair> {
    pd.create_qp(&QpInitAttr {
        qp_type: spec.qp_type,
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: spec.cap,
        sq_sig_all: spec.sq_sig_all,
    })
    .unwrap()
}

/// Two sides as `spec` says, devices with `opts` on addresses `ips` and one UDP port (a
/// device sends to its own port by default: the other's). The port is a free one, found
/// by binding the first device to port 0.
pub fn pair(ips: [IpAddr; 2], opts: &SoftOptions, spec: &Spec) -> (Side, Side) {
    for _ in 0..100 {
        let a = SoftContext::bind_with(SocketAddr::new(ips[0], 0), opts).unwrap();
        let port = a.local_addr().port();
        if let Ok(b) = SoftContext::bind_with(SocketAddr::new(ips[1], port), opts) {
            return (Side::new(a, spec), Side::new(b, spec));
        }
    }
    panic!("no UDP port free on both {ips:?}");
}
