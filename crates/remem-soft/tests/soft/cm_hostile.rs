//! Hostile connection-manager traffic: a raw peer (a plain UDP socket) aims crafted CM
//! MADs at QP 1 of a soft device that listens — malformed, truncated, of unknown
//! communication IDs, out of state, floods beyond the backlog. Each is dropped (or
//! answered as the IBTA says: REJ, DREP), counted, never a panic; and afterwards the
//! listener still takes a connection from a legitimate soft device.

use crate::common;

use common::{build, counter, seal};
use remem_conformance::{QpOptions, endpoint};
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::cm::{CmChannel, CmEvent, CmEventKind, CmId, ConnParam, PortSpace};
use remem_verbs::{Context, QpType};
use remem_wire::mad::{
    CmDrep, CmDreq, CmMra, CmRej, CmRep, CmReq, CmRtu, CmSidrRep, GSI_QKEY, MsgRef,
};
use remem_wire::{Bth, CmMad, CmMessage, CmaIpHeader, Deth, Headers, Opcode, Packet, Psn};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);
const TCP_PORT: u16 = 7471;

struct Lab {
    dev: Arc<dyn Context>,
    dev_ip: Ipv4Addr,
    peer: UdpSocket,
    peer_ip: Ipv4Addr,
    good: Arc<dyn Context>,
    port: u16,
    ch: Arc<dyn CmChannel>,
    _listener: Arc<dyn CmId>,
}

/// The victim on 127.0.23.`n`, the raw peer on `n+1`, a legitimate device on `n+2`.
fn lab(n: u8, backlog: u32) -> Lab {
    let dev_ip = Ipv4Addr::new(127, 0, 23, n);
    let peer_ip = Ipv4Addr::new(127, 0, 23, n + 1);
    let good_ip = Ipv4Addr::new(127, 0, 23, n + 2);
    let opts = SoftOptions::default();
    let dev: Arc<dyn Context> =
        Arc::new(SoftContext::bind_with(SocketAddr::new(dev_ip.into(), 0), &opts).unwrap());
    let port = dev.info().udp_addr.unwrap().port();
    let peer = UdpSocket::bind(SocketAddr::new(peer_ip.into(), port)).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let good: Arc<dyn Context> =
        Arc::new(SoftContext::bind_with(SocketAddr::new(good_ip.into(), port), &opts).unwrap());
    let ch = dev.create_cm_channel().unwrap();
    let listener = dev.create_cm_id(&ch, PortSpace::Tcp).unwrap();
    listener
        .bind(SocketAddr::new(dev_ip.into(), TCP_PORT))
        .unwrap();
    listener.listen(backlog).unwrap();
    Lab {
        dev,
        dev_ip,
        peer,
        peer_ip,
        good,
        port,
        ch,
        _listener: listener,
    }
}

/// A UD SEND ONLY to QP 1 carrying `payload`, with Q_Key `qkey`, sealed.
fn gsi_packet(l: &Lab, payload: &[u8], qkey: u32, op: Opcode) -> Vec<u8> {
    let mut bth = Bth::new(op, 1, Psn::new(0));
    bth.ack_req = true;
    let mut h = Headers::new(bth);
    if op == Opcode::UdSendOnly {
        h.deth = Some(Deth { qkey, src_qp: 1 });
    }
    seal(build(&h, payload), l.peer_ip, l.dev_ip, l.port)
}

fn send_mad(l: &Lab, mad: &[u8]) {
    let pkt = gsi_packet(l, mad, GSI_QKEY, Opcode::UdSendOnly);
    l.peer
        .send_to(&pkt, SocketAddr::new(l.dev_ip.into(), l.port))
        .unwrap();
}

fn mad(tid: u64, msg: CmMessage) -> [u8; 256] {
    CmMad::new(tid, msg).emit().unwrap()
}

/// Waits until the device's counter `name` reaches `value`.
fn wait_counter(ctx: &dyn Context, name: &str, value: u64) {
    let deadline = Instant::now() + WAIT;
    while counter(ctx, name) < value {
        assert!(
            Instant::now() < deadline,
            "{name} = {} < {value}",
            counter(ctx, name)
        );
        std::thread::yield_now();
    }
}

/// The MADs the device sends to the raw peer until it is quiet for `quiet`.
fn answers(l: &Lab, first: Duration, quiet: Duration) -> Vec<CmMad> {
    l.peer.set_read_timeout(Some(first)).unwrap();
    let mut out = Vec::new();
    let mut b = [0u8; 4096];
    while let Ok(n) = l.peer.recv(&mut b) {
        if let Ok(p) = Packet::parse(&b[..n])
            && p.headers.bth.dest_qp == 1
            && let Ok(m) = CmMad::parse(p.payload)
        {
            out.push(m);
        }
        l.peer.set_read_timeout(Some(quiet)).unwrap();
    }
    out
}

fn next_event(ch: &Arc<dyn CmChannel>) -> CmEvent {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(ev) = ch.get_event() {
            return ev;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no CM event within {WAIT:?}");
        let fd = ch.fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: 0,
        };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }
}

/// A REQ from the raw peer for `port` with communication ID `comm`.
fn req(l: &Lab, comm: u32, port: u16) -> CmMessage {
    CmMessage::Req(CmReq {
        local_comm_id: comm,
        service_id: PortSpace::Tcp.service_id(port),
        local_qpn: 0x4242,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        remote_cm_response_timeout: 20,
        local_cm_response_timeout: 20,
        max_cm_retries: 15,
        starting_psn: 1,
        partition_key: 0xffff,
        responder_resources: 1,
        initiator_depth: 1,
        private_data: CmaIpHeader {
            src: IpAddr::V4(l.peer_ip),
            dst: IpAddr::V4(l.dev_ip),
            src_port: 5555,
            ..CmaIpHeader::default()
        }
        .with_private_data(b"raw", 92)
        .unwrap(),
        ..CmReq::default()
    })
}

/// The legitimate device connects to the listener, which accepts: both see Established.
fn listener_still_works(l: &Lab) {
    let cch = l.good.create_cm_channel().unwrap();
    let cid = l.good.create_cm_id(&cch, PortSpace::Tcp).unwrap();
    cid.resolve_addr(None, SocketAddr::new(l.dev_ip.into(), TCP_PORT), WAIT)
        .unwrap();
    assert_eq!(next_event(&cch).kind, CmEventKind::AddrResolved);
    cid.resolve_route(WAIT).unwrap();
    assert_eq!(next_event(&cch).kind, CmEventKind::RouteResolved);
    let cep = endpoint(&l.good, &QpOptions::default(), QpType::Rc, None).unwrap();
    cid.set_qp(Some(cep.qp.clone())).unwrap();
    cid.connect(&ConnParam::default()).unwrap();
    let req = loop {
        let ev = next_event(&l.ch);
        if ev.kind == CmEventKind::ConnectRequest
            && ev.id.peer_addr().map(|a| a.ip()) == l.good.info().udp_addr.map(|a| a.ip())
        {
            break ev;
        }
    };
    let sep = endpoint(&l.dev, &QpOptions::default(), QpType::Rc, None).unwrap();
    req.id.set_qp(Some(sep.qp.clone())).unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    let est = next_event(&cch);
    assert_eq!(est.kind, CmEventKind::Established, "{est:?}");
    let est = next_event(&l.ch);
    assert_eq!(est.kind, CmEventKind::Established, "{est:?}");
}

#[test]
fn malformed_and_truncated_mads_are_dropped_and_counted() {
    let l = lab(1, 4);
    let valid = mad(1, req(&l, 99, TCP_PORT + 1));
    let mut wrong_class = valid;
    wrong_class[1] = 0x81;
    let mut bad_version = valid;
    bad_version[0] = 2;
    let mut unknown_attr = valid;
    unknown_attr[17] = 0x77;
    let mut bad_header = mad(1, req(&l, 98, TCP_PORT));
    bad_header[24 + 140 + 1] = 0x70; // rdma_cm IP version 7
    for m in [
        &valid[..100],
        &valid[..0],
        &wrong_class[..],
        &bad_version[..],
        &unknown_attr[..],
        &bad_header[..],
    ] {
        send_mad(&l, m);
    }
    // Not a MAD at all: the wrong Q_Key, an RC opcode to QP 1.
    let pkt = gsi_packet(&l, &valid, 0x1111_1111, Opcode::UdSendOnly);
    l.peer
        .send_to(&pkt, SocketAddr::new(l.dev_ip.into(), l.port))
        .unwrap();
    let pkt = gsi_packet(&l, &valid, GSI_QKEY, Opcode::RcSendOnly);
    l.peer
        .send_to(&pkt, SocketAddr::new(l.dev_ip.into(), l.port))
        .unwrap();
    wait_counter(&*l.dev, "cm_drop_malformed", 6);
    wait_counter(&*l.dev, "drop_bad_qkey", 1);
    wait_counter(&*l.dev, "drop_wrong_transport", 1);
    assert_eq!(counter(&*l.dev, "cm_rx_mads"), 6);
    assert!(
        answers(&l, Duration::from_millis(200), Duration::from_millis(50)).is_empty(),
        "malformed MADs get no answer"
    );
    assert!(l.ch.get_event().is_none());
    listener_still_works(&l);
}

#[test]
fn unknown_communication_ids_are_dropped_and_counted() {
    let l = lab(11, 4);
    let msgs = [
        CmMessage::Rep(CmRep {
            local_comm_id: 1,
            remote_comm_id: 0x1234_5678,
            ..CmRep::default()
        }),
        CmMessage::Rtu(CmRtu {
            local_comm_id: 1,
            remote_comm_id: 0x2345_6789,
            ..CmRtu::default()
        }),
        CmMessage::Mra(CmMra {
            local_comm_id: 1,
            remote_comm_id: 0x3456_789a,
            ..CmMra::default()
        }),
        CmMessage::Rej(CmRej {
            local_comm_id: 1,
            remote_comm_id: 0x4567_89ab,
            reason: 28,
            ..CmRej::default()
        }),
        CmMessage::Drep(CmDrep {
            local_comm_id: 1,
            remote_comm_id: 0x5678_9abc,
            ..CmDrep::default()
        }),
        CmMessage::SidrRep(CmSidrRep {
            request_id: 0x6789_abcd,
            ..CmSidrRep::default()
        }),
        CmMessage::Dreq(CmDreq {
            local_comm_id: 7,
            remote_comm_id: 0x789a_bcde,
            ..CmDreq::default()
        }),
    ];
    for m in msgs {
        send_mad(&l, &mad(5, m));
    }
    wait_counter(&*l.dev, "cm_drop_unknown_comm_id", 7);
    // Only the DREQ is answered (a DREP, as ib_cm answers a DREQ it cannot place).
    let got = answers(&l, Duration::from_secs(2), Duration::from_millis(100));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(matches!(
        &got[0].message,
        CmMessage::Drep(d) if d.remote_comm_id == 7 && d.local_comm_id == 0x789a_bcde
    ));
    assert!(l.ch.get_event().is_none());
    listener_still_works(&l);
}

#[test]
fn out_of_state_mads_are_dropped_and_counted() {
    let l = lab(21, 4);
    // A REQ the application never answers; its resend brings the device's MRA (and with
    // it the device's communication ID).
    send_mad(&l, &mad(9, req(&l, 0xabc, TCP_PORT)));
    let ev = next_event(&l.ch);
    assert_eq!(ev.kind, CmEventKind::ConnectRequest);
    assert!(ev.private_data.starts_with(b"raw"));
    send_mad(&l, &mad(9, req(&l, 0xabc, TCP_PORT)));
    let got = answers(&l, Duration::from_secs(5), Duration::from_millis(100));
    let dev_comm = match got.as_slice() {
        [
            CmMad {
                message: CmMessage::Mra(m),
                ..
            },
        ] => {
            assert_eq!(m.remote_comm_id, 0xabc);
            assert_eq!(m.message_mraed, MsgRef::Req);
            m.local_comm_id
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(counter(&*l.dev, "cm_duplicates"), 1);
    // An RTU before any REP, a DREQ and a DREP for a connection not established, an MRA
    // of a REP never sent.
    for m in [
        CmMessage::Rtu(CmRtu {
            local_comm_id: 0xabc,
            remote_comm_id: dev_comm,
            ..CmRtu::default()
        }),
        CmMessage::Dreq(CmDreq {
            local_comm_id: 0xabc,
            remote_comm_id: dev_comm,
            ..CmDreq::default()
        }),
        CmMessage::Drep(CmDrep {
            local_comm_id: 0xabc,
            remote_comm_id: dev_comm,
            ..CmDrep::default()
        }),
        CmMessage::Mra(CmMra {
            local_comm_id: 0xabc,
            remote_comm_id: dev_comm,
            message_mraed: MsgRef::Rep,
            ..CmMra::default()
        }),
    ] {
        send_mad(&l, &mad(9, m));
    }
    wait_counter(&*l.dev, "cm_drop_out_of_state", 4);
    // The right IDs from a third address.
    let third = UdpSocket::bind(SocketAddr::new(
        Ipv4Addr::new(127, 0, 23, 24).into(),
        l.port,
    ))
    .unwrap();
    let mut bth = Bth::new(Opcode::UdSendOnly, 1, Psn::new(0));
    bth.ack_req = true;
    let mut h = Headers::new(bth);
    h.deth = Some(Deth {
        qkey: GSI_QKEY,
        src_qp: 1,
    });
    let rej = mad(
        9,
        CmMessage::Rej(CmRej {
            local_comm_id: 0xabc,
            remote_comm_id: dev_comm,
            reason: 28,
            ..CmRej::default()
        }),
    );
    let pkt = seal(
        build(&h, &rej),
        Ipv4Addr::new(127, 0, 23, 24),
        l.dev_ip,
        l.port,
    );
    third
        .send_to(&pkt, SocketAddr::new(l.dev_ip.into(), l.port))
        .unwrap();
    wait_counter(&*l.dev, "cm_drop_wrong_source", 1);
    assert!(l.ch.get_event().is_none(), "the pending request stands");
    // The application rejects it: the raw peer gets the REJ.
    ev.id.reject(b"not you").unwrap();
    let got = answers(&l, Duration::from_secs(5), Duration::from_millis(100));
    assert!(
        matches!(got.as_slice(), [CmMad { message: CmMessage::Rej(r), .. }]
            if r.reason == 28 && r.remote_comm_id == 0xabc && r.private_data.starts_with(b"not you")),
        "{got:?}"
    );
    listener_still_works(&l);
}

#[test]
fn a_flood_beyond_the_backlog_is_rejected_and_counted() {
    let l = lab(31, 4);
    const FLOOD: u32 = 64;
    for i in 0..FLOOD {
        send_mad(&l, &mad(u64::from(i), req(&l, 0x1000 + i, TCP_PORT)));
    }
    // Nobody listens on this one.
    send_mad(&l, &mad(999, req(&l, 0x9999, TCP_PORT + 7)));
    wait_counter(&*l.dev, "cm_rx_mads", u64::from(FLOOD) + 1);
    let mut requests = Vec::new();
    for _ in 0..4 {
        let ev = next_event(&l.ch);
        assert_eq!(ev.kind, CmEventKind::ConnectRequest);
        requests.push(ev);
    }
    assert!(l.ch.get_event().is_none(), "the backlog holds 4");
    assert_eq!(counter(&*l.dev, "cm_rej_backlog"), u64::from(FLOOD) - 4);
    // The quiet time outlasts the request's grace for a listener (`CmConfig::listen_grace`,
    // 250 ms), after which it is rejected.
    let got = answers(&l, Duration::from_secs(5), Duration::from_millis(600));
    assert_eq!(counter(&*l.dev, "cm_rej_no_listener"), 1);
    let rejs: Vec<u16> = got
        .iter()
        .filter_map(|m| match &m.message {
            CmMessage::Rej(r) => Some(r.reason),
            _ => None,
        })
        .collect();
    assert_eq!(rejs.iter().filter(|&&r| r == 3).count(), FLOOD as usize - 4);
    assert_eq!(rejs.iter().filter(|&&r| r == 8).count(), 1);
    // The application answers the four; the listener takes the legitimate connection.
    for ev in requests {
        ev.id.reject(&[]).unwrap();
    }
    listener_still_works(&l);
}

#[test]
fn mads_leave_as_kernel_rxe_sends_them_and_a_raw_rej_is_taken() {
    let l = lab(41, 4);
    // The device connects to the raw peer: its REQ arrives at the raw socket.
    let cch = l.dev.create_cm_channel().unwrap();
    let cid = l.dev.create_cm_id(&cch, PortSpace::Tcp).unwrap();
    cid.resolve_addr(None, SocketAddr::new(l.peer_ip.into(), 9000), WAIT)
        .unwrap();
    assert_eq!(next_event(&cch).kind, CmEventKind::AddrResolved);
    cid.resolve_route(WAIT).unwrap();
    assert_eq!(next_event(&cch).kind, CmEventKind::RouteResolved);
    cid.connect(&ConnParam {
        qp_num: 0x4321,
        private_data: b"hi".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    l.peer.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; 4096];
    let n = l.peer.recv(&mut b).unwrap();
    let pkt = &b[..n];
    // As rping.pcap shows kernel rxe's: UD SEND ONLY to QP 1, P_Key 0xFFFF, AckReq, DETH
    // Q_Key 0x80010000 from QP 1, a 256-byte MAD, an ICRC that verifies.
    let p = Packet::parse(pkt).unwrap();
    let h = &p.headers;
    assert_eq!(h.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(
        (h.bth.dest_qp, h.bth.pkey, h.bth.ack_req),
        (1, 0xffff, true)
    );
    assert_eq!(
        h.deth,
        Some(Deth {
            qkey: GSI_QKEY,
            src_qp: 1
        })
    );
    assert_eq!(p.payload.len(), 256);
    let ipf = remem_wire::icrc::IpFields::V4 {
        src: l.dev_ip,
        dst: l.peer_ip,
        id: 0,
        flags_frag: remem_wire::icrc::IPV4_DF,
    };
    let ports = remem_wire::icrc::UdpPorts {
        src: l.port,
        dst: l.port,
    };
    assert!(remem_wire::icrc::verify(&ipf, ports, pkt));
    let mad = CmMad::parse(p.payload).unwrap();
    let CmMessage::Req(r) = &mad.message else {
        panic!("{mad:?}")
    };
    assert_eq!(r.service_id, PortSpace::Tcp.service_id(9000));
    assert_eq!(r.local_qpn, 0x4321);
    let hdr = CmaIpHeader::parse(&r.private_data).unwrap();
    assert_eq!(
        (hdr.src, hdr.dst),
        (IpAddr::V4(l.dev_ip), IpAddr::V4(l.peer_ip))
    );
    assert_eq!(&r.private_data[36..38], b"hi");
    // The raw peer rejects it (a REJ naming only the device's ID, as for an unknown
    // service): the device reports Rejected with reason 8.
    let rej = mad_bytes_rej(mad.header.transaction_id, r.local_comm_id);
    send_mad(&l, &rej);
    let ev = next_event(&cch);
    assert_eq!(ev.kind, CmEventKind::Rejected);
    assert_eq!(ev.status, 8);
}

fn mad_bytes_rej(tid: u64, theirs: u32) -> [u8; 256] {
    mad(
        tid,
        CmMessage::Rej(CmRej {
            local_comm_id: 0,
            remote_comm_id: theirs,
            reason: 8,
            ..CmRej::default()
        }),
    )
}
