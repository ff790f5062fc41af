//! Helpers shared by the crate's unit tests (as `crate::test_util`) and its integration
//! tests (`tests/api/common/mod.rs` includes this file by path): two `Rdma`s on soft devices
//! and connecting them, and the layouts of the regions they allocate. The including module
//! has `Connection`, `Rdma` and `RdmaBuilder` in scope.

use super::{Connection, Rdma, RdmaBuilder};
use std::alloc::Layout;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where a soft device binds: a fresh loopback address (127.1.x.y, a new one for each call
/// in this process, so that a device talking to several peers tells them apart by
/// address), port 0 (the kernel picks a free UDP port, so tests and test binaries never
/// collide; remem's handshake tells each end the other's port).
pub fn fresh_addr() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % (254 * 256);
    let ip = Ipv4Addr::new(127, 1, (n / 254) as u8, (n % 254 + 1) as u8);
    SocketAddr::new(IpAddr::V4(ip), 0)
}

/// The name of a soft device on a [`fresh_addr`] (`soft@127.1.x.y:0`).
pub fn fresh_device() -> String {
    format!("soft@{}", fresh_addr())
}

/// Two `Rdma`s that can talk, each on a soft device of its own ([`fresh_device`]), built
/// from its builder by `a_opts` / `b_opts` (polling, limits, …).
pub fn soft_pair_with(
    a_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
    b_opts: impl FnOnce(RdmaBuilder) -> RdmaBuilder,
) -> (Rdma, Rdma) {
    let a = a_opts(RdmaBuilder::new().device(fresh_device()))
        .build()
        .unwrap();
    let b = b_opts(RdmaBuilder::new().device(fresh_device()))
        .build()
        .unwrap();
    (a, b)
}

/// [`soft_pair_with`] the builders' defaults.
pub fn soft_pair() -> (Rdma, Rdma) {
    soft_pair_with(|a| a, |b| b)
}

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
