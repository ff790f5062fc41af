//! What the async-API test binaries share: where their `Rdma`s live, and (from the crate's
//! `src/test_util.rs`, which its unit tests use too) how two of them connect.
//!
//! By default each test end gets a soft device of its own on port 0 (the kernel picks a
//! free UDP port, so tests and test binaries never collide): a test's first device on
//! 127.0.0.1 ([`first_addr`]), every other one on a loopback address of its own
//! ([`peer_addr`]), so that a device talking to several peers tells them apart by address.
//! remem's handshake tells each device its peer's UDP port, so nobody names a port
//! ([`pair`], [`pair_with`] build two `Rdma`s so). Connections through the RDMA CM do not
//! carry it: their devices share one port ([`same_port_addr`]). With `REMEM_TEST_DEVICE`
//! set (e.g. `rxe0`; `cargo xtask rxe conformance` runs the tests so on kernel Soft-RoCE,
//! built with the `ibverbs` feature), every end opens a context of that device instead.

#![allow(dead_code)]

use remem::verbs::{CompletionQueue, ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair};
use remem::{Connection, Rdma, RdmaBuilder};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

/// Where a test's first soft device binds: 127.0.0.1, port 0 (the kernel picks a free UDP
/// port, so tests and test binaries never collide).
pub fn first_addr() -> SocketAddr {
    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)
}

/// Where a soft device that talks to a test's others binds: a fresh loopback address, port
/// 0 (remem's handshake tells each end the other's port; [`test_util::fresh_addr`]).
pub fn peer_addr() -> SocketAddr {
    test_util::fresh_addr()
}

/// Where a soft device that talks to the one bound at `first` binds when nothing tells
/// either its peer's UDP port (connections through the RDMA CM, raw queue pairs): `first`'s
/// port (soft devices send to their own port unless told the peer's), on a fresh loopback
/// address.
pub fn same_port_addr(first: SocketAddr) -> SocketAddr {
    SocketAddr::new(test_util::fresh_addr().ip(), first.port())
}

/// The name of a test's first soft device (`soft@127.0.0.1:0`).
pub fn first_device() -> String {
    format!("soft@{}", first_addr())
}

/// The name of a soft device that talks to a test's others ([`peer_addr`]).
pub fn peer_device() -> String {
    format!("soft@{}", peer_addr())
}

/// Two `Rdma`s that can talk: `a` on the test's first device, `b` on a peer device
/// ([`peer_device`]) — or both on `REMEM_TEST_DEVICE` — each built from its builder by
/// `a_opts` / `b_opts` (polling, limits, …).
pub fn pair_with(
    a_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
    b_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
) -> (Rdma, Rdma) {
    let a = a_opts(builder(first_device())).build().unwrap();
    let b = b_opts(builder(peer_device())).build().unwrap();
    (a, b)
}

/// [`pair_with`] for connections that do not tell the devices each other's UDP port
/// (through the RDMA CM): `b`'s soft device shares `a`'s port ([`same_port_addr`]).
pub fn same_port_pair_with(
    a_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
    b_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
) -> (Rdma, Rdma) {
    let a = a_opts(builder(first_device())).build().unwrap();
    let first = a.context().info().udp_addr.unwrap_or_else(first_addr);
    let b = b_opts(builder(format!("soft@{}", same_port_addr(first))))
        .build()
        .unwrap();
    (a, b)
}

/// [`pair_with`] on soft devices always (for tests of soft-device behaviour, which ignore
/// `REMEM_TEST_DEVICE`): [`test_util::soft_pair_with`].
pub fn soft_pair_with(
    a_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
    b_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
) -> (Rdma, Rdma) {
    test_util::soft_pair_with(a_opts, b_opts)
}

/// [`pair_with`] the builders' defaults.
pub fn pair() -> (Rdma, Rdma) {
    pair_with(|a| a, |b| b)
}

#[path = "../../../src/test_util.rs"]
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
