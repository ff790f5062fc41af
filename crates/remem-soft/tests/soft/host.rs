//! The host's shared device (`remem_soft::io::host`): several devices opened on one
//! address and UDP port are members of one device, in this process and in others; each
//! packet reaches the member that owns its QP or CM connection, and a member's death is
//! told to its peers.

use remem_conformance::{CASES, Pair, run_pair};
use remem_soft::SoftContext;
use remem_verbs::Context;
use std::net::SocketAddr;
use std::sync::Arc;

/// An address of this test process's own (`127.0.6.x`, by pid) at port 4791, the port
/// every RoCEv2 device uses.
fn host_addr(n: u8) -> SocketAddr {
    let x = (std::process::id() % 250) as u8 + 1;
    SocketAddr::from(([127, 6 + n, x, 1], 4791))
}

fn counter(ctx: &dyn Context, name: &str) -> u64 {
    ctx.counters()
        .iter()
        .find(|c| c.name == name)
        .map_or_else(|| panic!("no counter {name}"), |c| c.value)
}

#[test]
fn two_members_of_one_device_pass_every_conformance_case() {
    let addr = host_addr(0);
    let a = SoftContext::bind(addr).expect("first member");
    let b = SoftContext::bind(addr).expect("second member: the device is shared");
    assert_eq!(a.local_addr(), b.local_addr());
    assert_eq!(counter(&b, "host_members"), 2);
    let pair = Pair::new(Arc::new(a), Arc::new(b));
    let failed: Vec<String> = CASES
        .iter()
        .filter_map(|c| run_pair(c, &pair).err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
