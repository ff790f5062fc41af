//! What the async-API test binaries share: where their `Rdma`s live, and (from the crate's
//! `src/test_util.rs`, which its unit tests use too) how two of them connect.
//!
//! By default each test end gets a soft device of its own (the address each file picks).
//! With `REMEM_TEST_DEVICE` set (e.g. `rxe0`; `cargo xtask rxe conformance` runs the tests
//! so on kernel Soft-RoCE, built with the `ibverbs` feature), every end opens a context of
//! that device instead.

#![allow(dead_code)]

use remem::{Connection, Rdma, RdmaBuilder};

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

/// The UDP port of `rdma`'s soft device (for its peer's), or 0 for other devices.
pub fn soft_port(rdma: &Rdma) -> u16 {
    rdma.context().info().udp_addr.map_or(0, |a| a.port())
}
