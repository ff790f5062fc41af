//! The RC requester's window: a soft QP keeps at most `MAX_UNACKED_PSNS` (128, kernel rxe's
//! `RXE_MAX_UNACKED_PSNS`) packets unacknowledged in flight, and each ACK opens the window by
//! what it acknowledges. A raw UDP socket plays the peer: it counts what arrives and ACKs
//! when the test says so.

use crate::common;

use remem_conformance::QpOptions;
use remem_soft::SoftOptions;
use remem_soft::device::MAX_UNACKED_PSNS;
use remem_verbs::{AccessFlags, Mtu, SendOp, SendWr, Sge, WcStatus};
use remem_wire::{Opcode, Packet, Syndrome};
use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

const DEV_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 23, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 23, 2);
const PEER_QPN: u32 = 0x4242;
const FIRST_PSN: u32 = 0xff_fff0; // the window crosses the 24-bit wrap

/// Receives WRITE packets until `until` (a PSN offset from the first) has arrived; returns
/// the highest offset seen. Panics on anything else, or if nothing comes for 5 s.
fn receive_through(sock: &UdpSocket, until: u32) -> u32 {
    let mut b = [0u8; 9000];
    let mut highest = 0;
    loop {
        let n = sock.recv(&mut b).unwrap_or_else(|e| {
            panic!("the requester stopped sending at {highest} (waiting for {until}): {e}")
        });
        let p = Packet::parse(&b[..n]).unwrap();
        let off = p.headers.bth.psn.value().wrapping_sub(FIRST_PSN) & 0xff_ffff;
        assert!(
            matches!(
                p.headers.bth.opcode,
                Opcode::RcWriteFirst | Opcode::RcWriteMiddle | Opcode::RcWriteLast
            ),
            "{:?}",
            p.headers.bth.opcode
        );
        highest = highest.max(off);
        if off >= until {
            return highest;
        }
    }
}

/// Whatever arrives within `wait` (the retransmit timer is far longer).
fn drain(sock: &UdpSocket, wait: Duration) -> Vec<u32> {
    sock.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 9000];
    let mut got = Vec::new();
    while let Ok(n) = sock.recv(&mut b) {
        let p = Packet::parse(&b[..n]).unwrap();
        got.push(p.headers.bth.psn.value().wrapping_sub(FIRST_PSN) & 0xff_ffff);
    }
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    got
}

/// ACKs every PSN up to offset `off` from the first.
fn ack(sock: &UdpSocket, port: u16, qpn: u32, off: u32) {
    let psn = FIRST_PSN.wrapping_add(off) & 0xff_ffff;
    let h = common::ack(qpn, psn, Syndrome::Ack { credits: 31 }, 1);
    common::send_sealed(sock, PEER_IP, DEV_IP, port, common::build(&h, &[]));
}

#[test]
fn at_most_128_packets_are_unacknowledged_and_acks_open_the_window() {
    assert_eq!(MAX_UNACKED_PSNS, 128, "rxe's RXE_MAX_UNACKED_PSNS");
    // The peer uses the device's UDP port, as RoCEv2 devices that talk do.
    let (ctx, sock, port) = common::device_and_peer(DEV_IP, PEER_IP, &SoftOptions::from_env());
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Room for a whole window of datagrams: nothing may be lost at this end.
    rustix::net::sockopt::set_socket_recv_buffer_size(&sock, 4 << 20).unwrap();
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        timeout: 22, // 17 s: no retransmission while the test runs
        ..QpOptions::default()
    };
    let ep = common::connect_rc(&ctx, &o, (PEER_QPN, PEER_IP), FIRST_PSN, 1);
    // One WRITE of 400 packets.
    let (_buf, mr) = ep.reg(400 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = Sge {
        addr: mr.addr(),
        length: 400 * 1024,
        lkey: mr.lkey(),
    };
    let op = SendOp::RdmaWrite {
        remote_addr: 0x10000,
        rkey: 0x77,
    };
    ep.qp.post_send(&[SendWr::new(1, op, &[sge])]).unwrap();
    // The first 128 packets leave, and nothing more until an ACK.
    assert_eq!(receive_through(&sock, 127), 127);
    let more = drain(&sock, Duration::from_millis(300));
    assert!(
        more.iter().all(|&o| o < 128),
        "packets beyond the window left unacknowledged: {more:?}"
    );
    // ACKing the first 50 lets exactly 50 more go.
    ack(&sock, port, ep.qp.qp_num(), 49);
    assert_eq!(receive_through(&sock, 177), 177);
    let more = drain(&sock, Duration::from_millis(300));
    assert!(more.iter().all(|&o| o < 178), "{more:?}");
    // ACKing everything lets the rest go, and the WRITE completes once all are ACKed.
    ack(&sock, port, ep.qp.qp_num(), 177);
    assert_eq!(receive_through(&sock, 305), 305);
    ack(&sock, port, ep.qp.qp_num(), 305);
    assert_eq!(receive_through(&sock, 399), 399);
    ack(&sock, port, ep.qp.qp_num(), 399);
    // The completion follows as soon as the progress thread has handled the last ACK.
    let mut wc = [remem_verbs::WorkCompletion::default(); 1];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ep.cq.poll(&mut wc).unwrap() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the WRITE did not complete after every packet was ACKed"
        );
        std::thread::yield_now();
    }
    assert_eq!(wc[0].status, WcStatus::Success);
}
