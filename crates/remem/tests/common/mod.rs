//! What the async-API test binaries share: where their `Rdma`s live, and (from the crate's
//! `src/test_util.rs`, which its unit tests use too) how two of them connect.
//!
//! By default each test end gets a soft device of its own (the address each file picks).
//! With `REMEM_TEST_DEVICE` set (e.g. `rxe0`; `cargo xtask rxe conformance` runs the tests
//! so on kernel Soft-RoCE, built with the `ibverbs` feature), every end opens a context of
//! that device instead.

#![allow(dead_code)]

use remem::verbs::{CompletionQueue, ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair};
use remem::{Connection, Rdma, RdmaBuilder};
use std::sync::Arc;

#[path = "../../src/test_util.rs"]
pub mod test_util;

/// The device `REMEM_TEST_DEVICE` names, if any.
pub fn test_device() -> Option<String> {
    std::env::var("REMEM_TEST_DEVICE")
        .ok()
        .filter(|d| !d.is_empty())
}

/// A builder on `REMEM_TEST_DEVICE` if set, else on the soft device `soft`.
pub fn builder(soft: String) -> RdmaBuilder {
    RdmaBuilder::new().device(test_device().unwrap_or(soft))
}

/// A raw RC queue pair in `pd` (remem's verbs, bypassing the async API), its send and
/// receive completions on `cq`, for `max_send_wr` sends and `max_recv_wr` receives of one
/// scatter/gather entry each (no inline data, no shared receive queue, only the sends
/// asked for signaled).
pub fn raw_rc_qp(
    pd: &dyn ProtectionDomain,
    cq: &Arc<dyn CompletionQueue>,
    max_send_wr: u32,
    max_recv_wr: u32,
) -> Arc<dyn QueuePair> {
    pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .unwrap()
}

/// The UDP port of `rdma`'s soft device (for its peer's), or 0 for other devices.
pub fn soft_port(rdma: &Rdma) -> u16 {
    rdma.context().info().udp_addr.map_or(0, |a| a.port())
}
