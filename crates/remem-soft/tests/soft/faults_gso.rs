//! The fault injector keeps GSO batches: each packet's fate is decided as it joins its
//! batch, a lost packet is left out and the others still leave together, from registered
//! memory, byte for byte as without the injector.
//!
//! A soft device sends RDMA WRITEs to a plain UDP socket playing its RC peer (nothing
//! acknowledges them, and the retransmission timer is seconds away): once without faults,
//! once with a seeded injector. The packets that arrive are exactly the reference packets
//! whose fate the same seed decides is "go", in order, equal up to their ICRC (which covers
//! the device's fresh UDP port and the packet's index in its GSO batch), and they left in
//! GSO batches (fewer `sendmsg` calls than packets) with their payloads referenced.

use crate::common;

use common::{device_and_peer, sge, unacked_sender};
use remem_soft::SoftOptions;
use remem_soft::faults::{Fate, FaultConfig, FaultInjector};
use remem_verbs::{Mtu, SendOp, SendWr};
use remem_wire::Packet;
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const PEER_QPN: u32 = 0x4343;
/// Packets of the test's work at MTU 1024: a 48 KiB and a 16 KiB WRITE.
const PACKETS: usize = 48 + 16;

/// What one run saw: the packets that arrived, in order, and the device's counters.
struct Run {
    pkts: Vec<Vec<u8>>,
    port: u16,
    datagrams: u64,
    zero_copy: u64,
    dropped: u64,
}

fn run(dev: Ipv4Addr, peer_ip: Ipv4Addr, faults: Option<FaultConfig>, want: usize) -> Run {
    let opts = SoftOptions {
        faults,
        ..SoftOptions::default()
    };
    let (ctx, peer, port) = device_and_peer(dev, peer_ip, &opts);
    // A peer that acknowledges nothing: no retransmission while the packets are read.
    let (ep, mr) = unacked_sender(&ctx, Mtu::Mtu1024, (PEER_QPN, peer_ip), 64 * 1024, 11);
    let write = |va: u64| SendOp::RdmaWrite {
        remote_addr: va,
        rkey: 0x77,
    };
    let w1 = [sge(&*mr, 0, 48 * 1024)];
    let w2 = [sge(&*mr, 48 * 1024, 16 * 1024)];
    ep.qp
        .post_send(&[
            SendWr::new(1, write(0x1000_0000), &w1),
            SendWr::new(2, write(0x2000_0000), &w2),
        ])
        .unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut pkts = Vec::new();
    let mut b = vec![0u8; 65_536];
    while pkts.len() < want {
        let (n, from) = peer.recv_from(&mut b).expect("the device's packets");
        assert_eq!(from.port(), port);
        pkts.push(b[..n].to_vec());
    }
    // The driver counts a batch once its sendmsg has returned, which may be after the peer
    // read it: wait until every packet the device built is counted (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::counter(&*ctx, "sent_pkts") < PACKETS as u64 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    // Nothing more comes: lost packets are not sent late.
    peer.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    assert!(
        peer.recv_from(&mut b).is_err(),
        "more packets than fates let go"
    );
    Run {
        pkts,
        port,
        datagrams: common::counter(&*ctx, "tx_datagrams"),
        zero_copy: common::counter(&*ctx, "tx_zero_copy_pkts"),
        dropped: common::counter(&*ctx, "fault_dropped"),
    }
}

/// Every packet parses and its ICRC verifies for an IPv4 identification below 64 (its
/// index in its GSO batch): returns them.
fn check_icrcs(r: &Run, dev: Ipv4Addr, peer: Ipv4Addr) -> Vec<u16> {
    let ip = IpFields::V4 {
        src: dev,
        dst: peer,
        id: 0,
        flags_frag: IPV4_DF,
    };
    let ports = UdpPorts {
        src: r.port,
        dst: r.port,
    };
    let mut ids = Vec::new();
    for (i, p) in r.pkts.iter().enumerate() {
        Packet::parse(p).unwrap_or_else(|e| panic!("packet {i}: {e}"));
        let id = icrc::recover_ipv4_id(&ip, ports, p);
        assert!(
            id.is_some_and(|id| id < 64),
            "packet {i}: ICRC verifies for no GSO index ({id:?})"
        );
        ids.extend(id);
    }
    ids
}

fn faulted_run_keeps_batches(spec: &str, dev: u8) {
    let dev_ip = Ipv4Addr::new(127, 0, 61, dev);
    let peer_ip = Ipv4Addr::new(127, 0, 61, dev + 1);
    let reference = run(dev_ip, peer_ip, None, PACKETS);
    let _ = check_icrcs(&reference, dev_ip, peer_ip);
    // The same seed decides the same fates for the same packets.
    let cfg = FaultConfig::parse(spec).unwrap();
    let mut f = FaultInjector::new(cfg);
    let go: Vec<&Vec<u8>> = reference
        .pkts
        .iter()
        .filter(|p| match f.fate(p, p.len()) {
            Fate::Go => true,
            Fate::Lost => false,
            Fate::Faulted(x) => panic!("{spec}: only losses expected, got {x:?}"),
        })
        .collect();
    if cfg.loss > 0.01 {
        assert!(
            (PACKETS / 2..PACKETS).contains(&go.len()),
            "{spec}: {} of {PACKETS} go",
            go.len()
        );
    }
    let faulted = run(dev_ip, peer_ip, Some(cfg), go.len());
    let ids = check_icrcs(&faulted, dev_ip, peer_ip);
    // Each batch numbers its packets 0, 1, 2, … (a lost packet leaves no hole: it was never
    // part of the batch), and each `sendmsg` starts a batch at 0.
    for (i, w) in ids.windows(2).enumerate() {
        assert!(
            w[1] == 0 || w[1] == w[0] + 1,
            "{spec}: packet {} has index {} after {}",
            i + 1,
            w[1],
            w[0]
        );
    }
    let batches = ids.iter().filter(|id| **id == 0).count() as u64;
    assert_eq!(batches, faulted.datagrams, "{spec}: batches");
    assert_eq!(faulted.dropped, (PACKETS - go.len()) as u64);
    for (i, (want, got)) in go.iter().zip(&faulted.pkts).enumerate() {
        assert_eq!(
            want[..want.len() - 4],
            got[..got.len() - 4],
            "{spec}: surviving packet {i} differs"
        );
    }
    if reference.datagrams >= PACKETS as u64 {
        println!("skipped batch checks: no UDP GSO on this host's loopback");
        return;
    }
    // Survivors leave in GSO batches and from registered memory, as without the injector.
    assert!(
        faulted.datagrams * 4 <= go.len() as u64,
        "{spec}: {} sendmsg calls for {} packets (no GSO batches)",
        faulted.datagrams,
        go.len()
    );
    assert_eq!(
        faulted.zero_copy,
        go.len() as u64,
        "{spec}: zero-copy packets"
    );
    assert_eq!(reference.zero_copy, PACKETS as u64);
}

#[test]
fn an_idle_injector_keeps_gso_batches_and_zero_copy() {
    faulted_run_keeps_batches("loss=0.000000001,seed=1", 1);
}

#[test]
fn lost_packets_leave_the_rest_of_their_batch_byte_identical() {
    // 20 % lost: packets in the middle of batches (some, not all: checked).
    faulted_run_keeps_batches("loss=0.2,seed=7", 3);
}
