//! The conformance suite over IPv6: two soft devices on `::1` (the only IPv6 loopback
//! address, so on two ports, each sending to the other's), with RoCE v2 GIDs that are
//! plain IPv6 addresses and ICRCs over IPv6 headers. Skips, saying so, where the machine
//! has no IPv6 loopback.

use remem_conformance::{CASES, Pair, run_pair};
use remem_soft::{SoftContext, SoftOptions};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;

#[test]
fn conformance_over_ipv6() {
    // Two free ports on ::1.
    let (pa, pb) = match (UdpSocket::bind("[::1]:0"), UdpSocket::bind("[::1]:0")) {
        (Ok(a), Ok(b)) => (
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        ),
        _ => {
            println!("skipping: no IPv6 loopback here");
            eprintln!("skipping: no IPv6 loopback here");
            return;
        }
    };
    let open = |port: u16, peer: u16| {
        let opts = SoftOptions {
            peer_port: Some(peer),
            ..SoftOptions::default()
        };
        SoftContext::bind_with(
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
            &opts,
        )
        .unwrap()
    };
    let (a, b) = (open(pa, pb), open(pb, pa));
    let pair = Pair::new(Arc::new(a), Arc::new(b));
    let failed: Vec<String> = CASES
        .iter()
        .filter_map(|c| run_pair(c, &pair).err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    for ctx in [&pair.a, &pair.b] {
        let counters = ctx.counters();
        let get = |n: &str| counters.iter().find(|c| c.name == n).unwrap().value;
        assert!(
            get("rcvd_pkts") > 20,
            "traffic went over IPv6: {counters:?}"
        );
        assert_eq!(get("drop_bad_icrc"), 0, "every IPv6 ICRC verified");
        assert_eq!(get("icrc_id_recovered"), 0);
    }
}
