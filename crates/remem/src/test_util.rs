//! Helpers shared by the crate's unit tests (as `crate::test_util`) and its integration
//! tests (`tests/common/mod.rs` includes this file by path): connecting two `Rdma`s and
//! the layouts of the regions they allocate. The including module has `Connection` and
//! `Rdma` in scope.

use super::{Connection, Rdma};
use std::alloc::Layout;

/// Connects `a` to `b` through a listener of `b` on a loopback TCP port; returns `a`'s end
/// and `b`'s.
pub async fn connect(a: &Rdma, b: &Rdma) -> (Connection, Connection) {
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ca, cb) = tokio::join!(a.connect(addr), listener.accept());
    (ca.unwrap(), cb.unwrap())
}

/// The layout of `n` bytes aligned to 8.
pub fn layout(n: usize) -> Layout {
    Layout::from_size_align(n, 8).unwrap()
}
