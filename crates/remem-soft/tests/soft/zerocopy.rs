//! The scatter/gather send (payloads sent from registered memory, ICRC computed over the
//! pieces) puts on the wire exactly the packets the copying path builds.
//!
//! A soft device sends to a plain UDP socket playing its RC peer: WRITEs and SENDs whose
//! payloads are referenced where they lie (one or several scatter/gather entries per
//! packet, at unaligned offsets, cut by the MTU), small ones that are copied, an inline
//! SEND and a READ request. The same work is sent twice: once as the driver sends by
//! default (scatter/gather), with packet capture on, once by a child process of this test
//! with `REMEM_SOFT_COPY_MAX=65536`, which makes the driver copy every payload into the
//! packet as it always did. Every packet must be the same byte for byte up to its ICRC
//! (which covers the UDP ports, fresh in each run), and every ICRC must verify for the IPv4
//! identification the kernel gives a GSO segment (its index in its batch). The capture,
//! which records each packet from its pieces, must hold exactly the packets on the wire.

use crate::common;

use common::{device_and_peer, sge, unacked_sender};
use remem_soft::SoftOptions;
use remem_verbs::{Mtu, SendFlags, SendOp, SendWr};
use remem_wire::Packet;
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use std::net::Ipv4Addr;
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
    // A peer that acknowledges nothing: no retransmission while the packets are read.
    let (ep, mr) = unacked_sender(&ctx, mtu, (PEER_QPN, PEER), 256 * 1024, 13);
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
    // How many left with their payload referenced. (The driver counts
    // a batch once its sendmsg has returned, which may be after the peer read it: wait for
    // the count of every large packet, bounded.)
    let large = out.iter().filter(|p| p.len() > LARGE).count();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let zero_copy = loop {
        let n = common::counter(&*ctx, "tx_zero_copy_pkts") as usize;
        if n >= large
            || std::env::var_os(CHILD_OUT).is_some()
            || std::time::Instant::now() > deadline
        {
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

/// The packets of a classic pcap file's frames (Ethernet, IPv4 and UDP headers skipped).
fn captured(path: &std::path::Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(bytes[at + 16 + 14 + 20 + 8..at + 16 + len].to_vec());
        at += 16 + len;
    }
    out
}

/// Where a child run writes its packets (and the env var that makes a run a child).
const CHILD_OUT: &str = "REMEM_ZEROCOPY_TEST_OUT";

/// The packets of the copying path: this test run again in a child process whose driver
/// copies every payload (`REMEM_SOFT_COPY_MAX`, read when a device opens).
fn copied_packets(test: &str, mtu: Mtu, tag: &str) -> (Vec<Vec<u8>>, UdpPorts, usize) {
    if let Some(out) = std::env::var_os(CHILD_OUT) {
        // The child: send, then write port, zero-copy count and length-prefixed packets.
        let (pkts, ports, zero_copy) = sent_packets(None, mtu);
        let mut b = Vec::new();
        b.extend_from_slice(&ports.src.to_le_bytes());
        b.extend_from_slice(&(zero_copy as u32).to_le_bytes());
        for p in &pkts {
            b.extend_from_slice(&(p.len() as u32).to_le_bytes());
            b.extend_from_slice(p);
        }
        std::fs::write(out, b).unwrap();
        return (pkts, ports, zero_copy);
    }
    let out = std::env::temp_dir().join(format!("remem-zerocopy-{tag}-{}.bin", std::process::id()));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads", "1"])
        .env(CHILD_OUT, &out)
        .env("REMEM_SOFT_COPY_MAX", "65536")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the copying child failed");
    let b = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let port = u16::from_le_bytes([b[0], b[1]]);
    let zero_copy = u32::from_le_bytes(b[2..6].try_into().unwrap()) as usize;
    let mut pkts = Vec::new();
    let mut at = 6;
    while at < b.len() {
        let n = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        pkts.push(b[at + 4..at + 4 + n].to_vec());
        at += 4 + n;
    }
    (
        pkts,
        UdpPorts {
            src: port,
            dst: port,
        },
        zero_copy,
    )
}

fn same_packets(test: &str, mtu: Mtu, tag: &str) {
    let (copied, copied_ports, none) = copied_packets(test, mtu, tag);
    if std::env::var_os(CHILD_OUT).is_some() {
        return;
    }
    assert_eq!(none, 0, "REMEM_SOFT_COPY_MAX=65536 copies every payload");
    let pcap =
        std::env::temp_dir().join(format!("remem-zerocopy-{tag}-{}.pcap", std::process::id()));
    let (scattered, scattered_ports, referenced) = sent_packets(Some(pcap.clone()), mtu);
    // The capture (recorded from each packet's pieces) holds the packets on the wire.
    let recorded = captured(&pcap);
    let _ = std::fs::remove_file(&pcap);
    assert_eq!(recorded, scattered, "the capture is what was sent");
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
    same_packets(
        "zerocopy::scatter_gather_packets_are_the_copied_packets_mtu_1024",
        Mtu::Mtu1024,
        "1024",
    );
}

#[test]
fn scatter_gather_packets_are_the_copied_packets_mtu_4096() {
    same_packets(
        "zerocopy::scatter_gather_packets_are_the_copied_packets_mtu_4096",
        Mtu::Mtu4096,
        "4096",
    );
}
