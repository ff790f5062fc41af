//! The scatter/gather send (payloads sent from registered memory, ICRC computed over the
//! pieces) puts on the wire exactly the packets the copying path builds.
//!
//! A soft device sends to a plain UDP socket playing its RC peer: WRITEs and SENDs whose
//! payloads are referenced where they lie (one or several scatter/gather entries per
//! packet, at unaligned offsets, cut by the MTU), small ones that are copied, an inline
//! SEND and a READ request. The same work is sent twice: once as the driver sends by
//! default (scatter/gather), once with packet capture on, which makes the driver copy every
//! payload into the packet as it always did. Every packet must be the same byte for byte up
//! to its ICRC (which covers the UDP ports, fresh in each run), and every ICRC must verify
//! for the IPv4 identification the kernel gives a GSO segment (its index in its batch).

mod common;

use common::{connect_rc, device_and_peer, sge};
use remem_conformance::QpOptions;
use remem_soft::SoftOptions;
use remem_verbs::{AccessFlags, MemRegion, MemoryBuffer, Mtu, SendFlags, SendOp, SendWr};
use remem_wire::Packet;
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

const DEV: Ipv4Addr = Ipv4Addr::new(127, 0, 60, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 60, 2);
const PEER_QPN: u32 = 0x4242;
/// Packets longer than this carry more than 512 bytes of payload (the copy threshold), and
/// every packet with more is longer: no payload of the test's lies between 512 and 544
/// bytes.
const LARGE: usize = 512 + 32;

/// The packets the device sends for the test's work requests, in order, the ports they
/// came from and went to, and how many of them the driver sent from registered memory.
fn sent_packets(capture: Option<std::path::PathBuf>, mtu: Mtu) -> (Vec<Vec<u8>>, UdpPorts, usize) {
    let opts = SoftOptions {
        pcap: capture,
        ..SoftOptions::default()
    };
    let (ctx, peer, port) = device_and_peer(DEV, PEER, &opts);
    let o = QpOptions {
        mtu,
        // No retransmission while the packets are read (nothing acknowledges them).
        timeout: 20,
        ..QpOptions::default()
    };
    let ep = connect_rc(&ctx, &o, (PEER_QPN, PEER), 0x00ff_fff0, 0);
    let len = 256 * 1024;
    let data: Vec<u8> = (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let buf = Arc::new(MemoryBuffer::from_vec(data));
    let mr = ep
        .pd
        .reg_mr(MemRegion::whole(buf), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let write = |va: u64| SendOp::RdmaWrite {
        remote_addr: va,
        rkey: 0x77,
    };
    // A WRITE of 10,003 bytes from an odd offset; a SEND of three entries (one of 7
    // bytes) whose packets straddle them; a WRITE with immediate of 100 bytes (copied);
    // a WRITE of exactly 3 MTUs; an inline SEND; a READ request; a 64 KiB WRITE.
    let w1 = [sge(&*mr, 3, 10_003)];
    let s1 = [
        sge(&*mr, 20_001, 1_500),
        sge(&*mr, 30_000, 7),
        sge(&*mr, 40_005, 3_001),
    ];
    let w2 = [sge(&*mr, 50_000, 100)];
    let mtu_bytes = mtu.bytes();
    let w3 = [sge(&*mr, 60_000, 3 * mtu_bytes)];
    let inline = [sge(&*mr, 70_000, 60)];
    let r = [sge(&*mr, 80_000, 5_000)];
    let w4 = [sge(&*mr, 100_000, 65_536)];
    let mut wrs = vec![
        SendWr::new(1, write(0x1000_0003), &w1),
        SendWr::new(2, SendOp::Send, &s1),
        SendWr::new(
            3,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0x2000_0000,
                rkey: 0x77,
                imm: 0xfeed,
            },
            &w2,
        ),
        SendWr::new(4, write(0x3000_0000), &w3),
        SendWr::new(5, SendOp::Send, &inline),
        SendWr::new(
            6,
            SendOp::RdmaRead {
                remote_addr: 0x4000_0000,
                rkey: 0x77,
            },
            &r,
        ),
        SendWr::new(7, write(0x5000_0000), &w4),
    ];
    wrs[4].flags |= SendFlags::INLINE;
    ep.qp.post_send(&wrs).unwrap();
    let pkts = |n: u32| n.div_ceil(mtu_bytes).max(1) as usize;
    let want = pkts(10_003) + pkts(4_508) + 1 + 3 + 1 + 1 + pkts(65_536);
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    let mut b = vec![0u8; 65_536];
    while out.len() < want {
        let (n, from) = peer.recv_from(&mut b).expect("the device's packets");
        assert_eq!(from.port(), port);
        out.push(b[..n].to_vec());
    }
    // How many left with their payload referenced: none while capturing. (The driver counts
    // a batch once its sendmsg has returned, which may be after the peer read it: wait for
    // the count of every large packet, bounded.)
    let large = out.iter().filter(|p| p.len() > LARGE).count();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let zero_copy = loop {
        let n = common::counter(&*ctx, "tx_zero_copy_pkts") as usize;
        if n >= large || opts.pcap.is_some() || std::time::Instant::now() > deadline {
            break n;
        }
        std::thread::yield_now();
    };
    (
        out,
        UdpPorts {
            src: port,
            dst: port,
        },
        zero_copy,
    )
}

fn check_icrcs(pkts: &[Vec<u8>], ports: UdpPorts) {
    let ip = IpFields::V4 {
        src: DEV,
        dst: PEER,
        id: 0,
        flags_frag: IPV4_DF,
    };
    for (i, p) in pkts.iter().enumerate() {
        Packet::parse(p).unwrap_or_else(|e| panic!("packet {i}: {e}"));
        let id = icrc::recover_ipv4_id(&ip, ports, p);
        assert!(
            id.is_some_and(|id| id < 64),
            "packet {i}: ICRC verifies for no GSO index ({id:?})"
        );
    }
}

fn same_packets(mtu: Mtu, tag: &str) {
    let dir = std::env::temp_dir();
    let pcap = dir.join(format!("remem-zerocopy-{tag}-{}.pcap", std::process::id()));
    let (copied, copied_ports, none) = sent_packets(Some(pcap.clone()), mtu);
    let _ = std::fs::remove_file(&pcap);
    assert_eq!(none, 0, "capturing copies every payload");
    let (scattered, scattered_ports, referenced) = sent_packets(None, mtu);
    check_icrcs(&copied, copied_ports);
    check_icrcs(&scattered, scattered_ports);
    assert_eq!(copied.len(), scattered.len());
    for (i, (c, s)) in copied.iter().zip(&scattered).enumerate() {
        assert_eq!(
            c[..c.len() - 4],
            s[..s.len() - 4],
            "packet {i} differs (MTU {})",
            mtu.bytes()
        );
    }
    // Every packet with more than 512 bytes of payload (the copy threshold) left from
    // registered memory, and no other.
    let big = scattered.iter().filter(|p| p.len() > LARGE).count();
    assert!(big >= 10, "{big} large packets");
    assert_eq!(referenced, big, "packets sent from registered memory");
}

#[test]
fn scatter_gather_packets_are_the_copied_packets_mtu_1024() {
    same_packets(Mtu::Mtu1024, "1024");
}

#[test]
fn scatter_gather_packets_are_the_copied_packets_mtu_4096() {
    same_packets(Mtu::Mtu4096, "4096");
}
