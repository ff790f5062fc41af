//! Busy polling (`SoftOptions::busy_poll = Duration::MAX`, `REMEM_SOFT_BUSY_POLL_US=always`):
//! the progress threads never sleep, so posts wake nothing — and everything still works.
//! Alone in its binary: two spinning threads would starve the devices of tests running
//! beside them on a small machine.

use remem_conformance::{CASES, Pair, run_pair};
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

fn wakeups(ctx: &dyn Context) -> u64 {
    ctx.counters()
        .iter()
        .find(|c| c.name == "progress_wakeups")
        .expect("progress_wakeups counter")
        .value
}

/// Two devices on 127.0.9.`ips` whose progress threads poll as `busy_poll` says, through
/// the whole conformance suite; returns the wake-ups posts wrote to their threads.
fn suite(ips: [u8; 2], busy_poll: Duration) -> u64 {
    let open = |ip: u8| {
        let opts = SoftOptions {
            busy_poll,
            ..SoftOptions::default()
        };
        let addr = SocketAddr::from(([127, 0, 9, ip], 0));
        SoftContext::bind_with(addr, &opts).unwrap()
    };
    let (a, b) = (open(ips[0]), open(ips[1]));
    a.set_peer_udp_port(
        remem_verbs::Gid::from(b.local_addr().ip()),
        b.local_addr().port(),
    )
    .unwrap();
    b.set_peer_udp_port(
        remem_verbs::Gid::from(a.local_addr().ip()),
        a.local_addr().port(),
    )
    .unwrap();
    let pair = Pair::new(Arc::new(a), Arc::new(b));
    let failed: Vec<String> = CASES
        .iter()
        .filter_map(|c| run_pair(c, &pair).err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    wakeups(&*pair.a) + wakeups(&*pair.b)
}

#[test]
fn busy_polling_threads_pass_the_suite_without_wake_ups() {
    let woken = suite([1, 2], Duration::MAX);
    assert_eq!(woken, 0, "a busy-polling thread is never woken");
    // The same suite with sleeping threads: posts do wake them.
    let woken = suite([3, 4], Duration::ZERO);
    assert!(woken > 0, "sleeping threads are woken by posts: {woken}");
}
