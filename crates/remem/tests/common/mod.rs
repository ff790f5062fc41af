//! What the async-API test binaries share: where their `Rdma`s live, and (from the crate's
//! `src/test_util.rs`, which its unit tests use too) how two of them connect.
//!
//! By default each test end gets a soft device of its own: a test's first device on
//! 127.0.0.1 at a free UDP port ([`first_addr`]), every device that talks to it where
//! [`peer_addr`] says ([`pair`], [`pair_with`] build two `Rdma`s so). With
//! `REMEM_TEST_DEVICE` set (e.g. `rxe0`; `cargo xtask rxe conformance` runs the tests so on
//! kernel Soft-RoCE, built with the `ibverbs` feature), every end opens a context of that
//! device instead.

#![allow(dead_code)]

use remem::verbs::{CompletionQueue, ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair};
use remem::{Connection, Rdma, RdmaBuilder};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where a test's first soft device binds: 127.0.0.1, port 0 (the kernel picks a free UDP
/// port, so tests and test binaries never collide).
pub fn first_addr() -> SocketAddr {
    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)
}

/// Where a soft device that talks to the one bound at `first` binds.
///
/// Soft devices that talk send to their own UDP port (RoCEv2's rule: everyone on 4791)
/// unless told the peer's, and remem's handshake does not carry it yet: so the peer shares
/// `first`'s port, on a loopback address of its own (127.1.x.y, fresh for each call in
/// this process; another process's device on that address and port would need `first`'s
/// port, which is this process's). This is the one place that changes once the handshake
/// carries the port: then it is `first_addr()` too.
pub fn peer_addr(first: SocketAddr) -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % (254 * 256);
    let ip = Ipv4Addr::new(127, 1, (n / 254) as u8, (n % 254 + 1) as u8);
    SocketAddr::new(IpAddr::V4(ip), first.port())
}

/// The name of a test's first soft device (`soft@127.0.0.1:0`).
pub fn first_device() -> String {
    format!("soft@{}", first_addr())
}

/// The name of a soft device that talks to `first`'s ([`peer_addr`]).
pub fn peer_device(first: &Rdma) -> String {
    let addr = first.context().info().udp_addr.unwrap_or_else(first_addr);
    format!("soft@{}", peer_addr(addr))
}

/// Two `Rdma`s that can talk: `a` on the test's first device, `b` on its peer
/// ([`peer_device`]) — or both on `REMEM_TEST_DEVICE` — each built from its builder by
/// `a_opts` / `b_opts` (polling, limits, …).
pub fn pair_with(
    a_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
    b_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
) -> (Rdma, Rdma) {
    let a = a_opts(builder(first_device())).build().unwrap();
    let b = b_opts(builder(peer_device(&a))).build().unwrap();
    (a, b)
}

/// [`pair_with`] on soft devices always (for tests of soft-device behaviour, which ignore
/// `REMEM_TEST_DEVICE`).
pub fn soft_pair_with(
    a_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
    b_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
) -> (Rdma, Rdma) {
    let a = a_opts(RdmaBuilder::new().device(first_device()))
        .build()
        .unwrap();
    let b = b_opts(RdmaBuilder::new().device(peer_device(&a)))
        .build()
        .unwrap();
    (a, b)
}

/// [`pair_with`] the builders' defaults.
pub fn pair() -> (Rdma, Rdma) {
    pair_with(|a| a, |b| b)
}

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
