//! The RDMA connection manager between two soft devices on loopback: connect, accept,
//! data over the connected QPs, disconnect from either side, reject with private data, a
//! port nobody listens on, a peer that never answers, SIDR in the UDP port space,
//! user-managed QPs, private data limits, and lost REP / RTU retried (fault injection).
//! Everything waits on events (the channels' fds), bounded in time.

use remem_conformance::{Endpoint, QpOptions, endpoint};
use remem_soft::cm::CmConfig;
use remem_soft::{FaultConfig, SoftContext, SoftOptions};
use remem_verbs::cm::{
    CmChannel, CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, PortSpace, PrivateDataLimit,
    RDMA_UDP_QKEY,
};
use remem_verbs::{
    AccessFlags, Context, Error, QpState, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus,
    WorkCompletion,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// Two devices on `a_ip` and `b_ip`, sharing a UDP port, with `opts`.
fn pair(a_ip: &str, b_ip: &str, opts: &SoftOptions) -> (Arc<dyn Context>, Arc<dyn Context>) {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let a = SoftContext::bind_with(SocketAddr::new(ip(a_ip), 0), opts).unwrap();
    let port = a.local_addr().port();
    let b = SoftContext::bind_with(SocketAddr::new(ip(b_ip), port), opts).unwrap();
    (Arc::new(a), Arc::new(b))
}

/// Waits (bounded) for the next event on `ch`.
pub(crate) fn next_event(ch: &Arc<dyn CmChannel>, within: Duration) -> Option<CmEvent> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(ev) = ch.get_event() {
            return Some(ev);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let fd = ch.fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }
}

/// The next event, which must be of `kind`.
pub(crate) fn expect(ch: &Arc<dyn CmChannel>, kind: CmEventKind) -> CmEvent {
    let ev = next_event(ch, WAIT).unwrap_or_else(|| panic!("no {kind:?} event within {WAIT:?}"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// A listener on `ctx` at `port` (TCP port space unless `ps`).
pub(crate) fn listener(
    ctx: &Arc<dyn Context>,
    ps: PortSpace,
    port: u16,
) -> (Arc<dyn CmChannel>, Arc<dyn CmId>) {
    let ch = ctx.create_cm_channel().unwrap();
    let id = ctx.create_cm_id(&ch, ps).unwrap();
    let ip = ctx.info().udp_addr.unwrap().ip();
    id.bind(SocketAddr::new(ip, port)).unwrap();
    id.listen(8).unwrap();
    (ch, id)
}

/// An active id on `ctx` resolved to `dst`.
pub(crate) fn resolved(
    ctx: &Arc<dyn Context>,
    ps: PortSpace,
    dst: SocketAddr,
) -> (Arc<dyn CmChannel>, Arc<dyn CmId>) {
    let ch = ctx.create_cm_channel().unwrap();
    let id = ctx.create_cm_id(&ch, ps).unwrap();
    id.resolve_addr(None, dst, Duration::from_secs(2)).unwrap();
    expect(&ch, CmEventKind::AddrResolved);
    id.resolve_route(Duration::from_secs(2)).unwrap();
    expect(&ch, CmEventKind::RouteResolved);
    (ch, id)
}

pub(crate) fn addr(ctx: &Arc<dyn Context>, port: u16) -> SocketAddr {
    SocketAddr::new(ctx.info().udp_addr.unwrap().ip(), port)
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn wait_wc(ep: &Endpoint) -> WorkCompletion {
    let deadline = Instant::now() + WAIT;
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if ep.cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion");
        std::thread::yield_now();
    }
}

/// A SEND of `len` bytes from `from` to `to` (connected QPs), checked.
fn send_one(from: &Endpoint, to: &Endpoint, byte: u8) {
    let (sbuf, smr) = from.reg(256, RW).unwrap();
    let (rbuf, rmr) = to.reg(256, RW).unwrap();
    sbuf.fill(0, 256, byte).unwrap();
    let rsge = Sge {
        addr: rmr.addr(),
        length: 256,
        lkey: rmr.lkey(),
    };
    to.qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: &[rsge],
        }])
        .unwrap();
    let ssge = Sge {
        addr: smr.addr(),
        length: 256,
        lkey: smr.lkey(),
    };
    from.qp
        .post_send(&[SendWr::new(9, SendOp::Send, &[ssge])])
        .unwrap();
    let r = wait_wc(to);
    assert_eq!(r.status, WcStatus::Success);
    assert_eq!(r.byte_len, 256);
    assert_eq!(wait_wc(from).status, WcStatus::Success);
    assert!(rbuf.to_vec(0, 256).unwrap().iter().all(|&b| b == byte));
}

/// Connects an RC endpoint of `a` to a listener on `b` (port `port`), with private data
/// both ways; returns (client endpoint, client id, client channel, server endpoint,
/// server id, server channel, listener id).
#[allow(clippy::type_complexity)]
fn connect_pair(
    a: &Arc<dyn Context>,
    b: &Arc<dyn Context>,
    port: u16,
) -> (
    Endpoint,
    Arc<dyn CmId>,
    Arc<dyn CmChannel>,
    Endpoint,
    Arc<dyn CmId>,
    Arc<dyn CmChannel>,
    Arc<dyn CmId>,
) {
    let (sch, lid) = listener(b, PortSpace::Tcp, port);
    let (cch, cid) = resolved(a, PortSpace::Tcp, addr(b, port));
    assert_eq!(cid.local_addr().unwrap().ip(), addr(a, 0).ip());
    assert_eq!(cid.peer_addr(), Some(addr(b, port)));
    let cep = endpoint(a, &QpOptions::default(), QpType::Rc, None).unwrap();
    cid.set_qp(Some(cep.qp.clone())).unwrap();
    cid.connect(&ConnParam {
        private_data: b"hello from a".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id.as_ref().unwrap().handle(), lid.handle());
    assert!(req.private_data.starts_with(b"hello from a"));
    assert_eq!(req.private_data.len(), PrivateDataLimit::REQ);
    let CmEventParam::Conn(p) = req.param else {
        panic!("{req:?}")
    };
    assert_eq!(p.qp_num, cep.qp.qp_num());
    let sid = req.id.clone();
    assert_eq!(sid.peer_addr(), cid.local_addr());
    assert_eq!(sid.local_addr(), Some(addr(b, port)));
    let sep = endpoint(b, &QpOptions::default(), QpType::Rc, None).unwrap();
    sid.set_qp(Some(sep.qp.clone())).unwrap();
    sid.accept(&ConnParam {
        private_data: b"welcome from b".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    assert_eq!(sep.qp.state(), QpState::Rts, "accept moves the QP to RTS");
    let est = expect(&cch, CmEventKind::Established);
    assert!(est.private_data.starts_with(b"welcome from b"));
    let CmEventParam::Conn(p) = est.param else {
        panic!("{est:?}")
    };
    assert_eq!(p.qp_num, sep.qp.qp_num());
    assert_eq!(cep.qp.state(), QpState::Rts);
    expect(&sch, CmEventKind::Established);
    (cep, cid, cch, sep, sid, sch, lid)
}

#[test]
fn connect_send_and_disconnect_from_the_client() {
    let (a, b) = pair("127.0.40.1", "127.0.40.2", &SoftOptions::default());
    let (cep, cid, cch, sep, sid, sch, _lid) = connect_pair(&a, &b, 7001);
    send_one(&cep, &sep, 0x5a);
    send_one(&sep, &cep, 0xa5);
    cid.disconnect().unwrap();
    expect(&cch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
    assert_eq!(cep.qp.state(), QpState::Err);
    assert_eq!(sep.qp.state(), QpState::Err);
    // A second disconnect (as programs do after the event) is harmless.
    cid.disconnect().unwrap();
    sid.disconnect().unwrap();
}

#[test]
fn disconnect_from_the_server() {
    let (a, b) = pair("127.0.40.3", "127.0.40.4", &SoftOptions::default());
    let (cep, _cid, cch, sep, sid, sch, _lid) = connect_pair(&a, &b, 7002);
    send_one(&cep, &sep, 1);
    sid.disconnect().unwrap();
    expect(&sch, CmEventKind::Disconnected);
    expect(&cch, CmEventKind::Disconnected);
    assert_eq!(cep.qp.state(), QpState::Err);
}

#[test]
fn reject_with_private_data() {
    let (a, b) = pair("127.0.40.5", "127.0.40.6", &SoftOptions::default());
    let (sch, _lid) = listener(&b, PortSpace::Tcp, 7003);
    let (cch, cid) = resolved(&a, PortSpace::Tcp, addr(&b, 7003));
    cid.connect(&ConnParam {
        qp_num: 0x1234,
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    req.id.reject(b"go away").unwrap();
    let rej = expect(&cch, CmEventKind::Rejected);
    assert_eq!(rej.status, remem_verbs::cm::REJ_CONSUMER_DEFINED);
    assert!(rej.private_data.starts_with(b"go away"));
    assert_eq!(rej.private_data.len(), PrivateDataLimit::REJ);
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_rejected_at_once() {
    let (a, b) = pair("127.0.40.7", "127.0.40.8", &SoftOptions::default());
    let (_sch, _lid) = listener(&b, PortSpace::Tcp, 7004);
    let (cch, cid) = resolved(&a, PortSpace::Tcp, addr(&b, 7005));
    let start = Instant::now();
    cid.connect(&ConnParam::default()).unwrap();
    let rej = expect(&cch, CmEventKind::Rejected);
    assert_eq!(rej.status, remem_verbs::cm::REJ_INVALID_SERVICE_ID);
    // Well within one CM response timeout (about 1 s by default): no retries.
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn nobody_answering_is_unreachable_after_the_retries() {
    let cfg = CmConfig {
        max_retries: 2,
        ..CmConfig::default()
    }
    .with_response_timeout(12); // 16.8 ms per try
    let opts = SoftOptions {
        cm: Some(cfg),
        ..SoftOptions::default()
    };
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let a: Arc<dyn Context> =
        Arc::new(SoftContext::bind_with(SocketAddr::new(ip("127.0.40.9"), 0), &opts).unwrap());
    // 127.0.40.10 has no device: the REQs go nowhere.
    let (cch, cid) = resolved(&a, PortSpace::Tcp, "127.0.40.10:7006".parse().unwrap());
    cid.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, CmEventKind::Unreachable);
    assert_eq!(ev.status, -110);
    let c: std::collections::HashMap<_, _> = a
        .counters()
        .into_iter()
        .map(|c| (c.name, c.value))
        .collect();
    assert_eq!(c["cm_retransmits"], 2);
    assert_eq!(c["cm_timeouts"], 1);
}

#[test]
fn user_managed_qps_get_connect_response_and_establish() {
    let (a, b) = pair("127.0.40.11", "127.0.40.12", &SoftOptions::default());
    let (sch, _lid) = listener(&b, PortSpace::Tcp, 7007);
    let (cch, cid) = resolved(&a, PortSpace::Tcp, addr(&b, 7007));
    let cep = endpoint(&a, &QpOptions::default(), QpType::Rc, None).unwrap();
    // The QP is moved by the user with the CM's attributes.
    let (attr, mask) = cid.init_qp_attr(QpState::Init).unwrap();
    cep.qp.modify(&attr, mask).unwrap();
    assert!(
        cid.init_qp_attr(QpState::Rtr).is_err(),
        "not known before the REP"
    );
    cid.connect(&ConnParam {
        qp_num: cep.qp.qp_num(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    let sid = req.id.clone();
    let sep = endpoint(&b, &QpOptions::default(), QpType::Rc, None).unwrap();
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (attr, mask) = sid.init_qp_attr(s).unwrap();
        sep.qp.modify(&attr, mask).unwrap();
    }
    sid.accept(&ConnParam {
        qp_num: sep.qp.qp_num(),
        ..ConnParam::default()
    })
    .unwrap();
    let resp = expect(&cch, CmEventKind::ConnectResponse);
    let CmEventParam::Conn(p) = resp.param else {
        panic!("{resp:?}")
    };
    assert_eq!(p.qp_num, sep.qp.qp_num());
    for s in [QpState::Rtr, QpState::Rts] {
        let (attr, mask) = cid.init_qp_attr(s).unwrap();
        cep.qp.modify(&attr, mask).unwrap();
    }
    cid.establish().unwrap();
    expect(&sch, CmEventKind::Established);
    send_one(&cep, &sep, 0x33);
    send_one(&sep, &cep, 0x44);
}

#[test]
fn private_data_limits() {
    let (a, b) = pair("127.0.40.13", "127.0.40.14", &SoftOptions::default());
    let (sch, _lid) = listener(&b, PortSpace::Tcp, 7008);
    let (cch, cid) = resolved(&a, PortSpace::Tcp, addr(&b, 7008));
    let too_long = ConnParam {
        private_data: vec![1; PrivateDataLimit::REQ + 1],
        qp_num: 0x77,
        ..ConnParam::default()
    };
    assert!(matches!(
        cid.connect(&too_long),
        Err(Error::InvalidArgument(_))
    ));
    let full = ConnParam {
        private_data: (0..PrivateDataLimit::REQ as u8).collect(),
        qp_num: 0x77,
        ..ConnParam::default()
    };
    cid.connect(&full).unwrap();
    let req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(req.private_data, full.private_data);
    let rep_long = ConnParam {
        private_data: vec![2; PrivateDataLimit::REP + 1],
        qp_num: 0x88,
        ..ConnParam::default()
    };
    assert!(matches!(
        req.id.accept(&rep_long),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        req.id.reject(&[3; PrivateDataLimit::REJ + 1]),
        Err(Error::InvalidArgument(_))
    ));
    let rep_full = ConnParam {
        private_data: vec![4; PrivateDataLimit::REP],
        qp_num: 0x88,
        ..ConnParam::default()
    };
    req.id.accept(&rep_full).unwrap();
    let resp = expect(&cch, CmEventKind::ConnectResponse);
    assert_eq!(resp.private_data, rep_full.private_data);
}

#[test]
fn sidr_resolves_a_ud_service() {
    let (a, b) = pair("127.0.40.15", "127.0.40.16", &SoftOptions::default());
    let (sch, _lid) = listener(&b, PortSpace::Udp, 7009);
    let (cch, cid) = resolved(&a, PortSpace::Udp, addr(&b, 7009));
    let cep = endpoint(&a, &QpOptions::default(), QpType::Ud, None).unwrap();
    cid.set_qp(Some(cep.qp.clone())).unwrap();
    cid.connect(&ConnParam {
        private_data: b"ud please".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    assert_eq!(cep.qp.state(), QpState::Rts);
    let req = expect(&sch, CmEventKind::ConnectRequest);
    assert!(req.private_data.starts_with(b"ud please"));
    assert_eq!(req.private_data.len(), PrivateDataLimit::SIDR_REQ);
    let sep = endpoint(&b, &QpOptions::default(), QpType::Ud, None).unwrap();
    req.id.set_qp(Some(sep.qp.clone())).unwrap();
    req.id
        .accept(&ConnParam {
            private_data: b"ud ok".to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
    assert_eq!(sep.qp.state(), QpState::Rts);
    let est = expect(&cch, CmEventKind::Established);
    assert!(est.private_data.starts_with(b"ud ok"));
    let CmEventParam::Ud(ud) = est.param else {
        panic!("{est:?}")
    };
    assert_eq!(ud.qp_num, sep.qp.qp_num());
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    assert_eq!(ud.ah_attr.dgid, remem_verbs::Gid::from(addr(&b, 0).ip()));
    // A SIDR REQ to a port nobody listens on: unreachable with the SIDR status.
    let (cch2, cid2) = resolved(&a, PortSpace::Udp, addr(&b, 7010));
    cid2.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch2, CmEventKind::Unreachable);
    assert_eq!(ev.status, 1);
}

/// Faults on every packet a device sends, with a CM that retries fast.
fn lossy(seed: u64) -> SoftOptions {
    SoftOptions {
        faults: Some(FaultConfig {
            loss: 0.3,
            seed,
            ..FaultConfig::default()
        }),
        cm: Some(CmConfig::default().with_response_timeout(14)),
        ..SoftOptions::default()
    }
}

#[test]
fn connections_survive_lost_mads() {
    // 30% of every packet both devices send is lost: REQs, REPs, RTUs, DREQs and DREPs
    // among them; the CM's retries get every connection through, and RC retries the data.
    let mut retransmits = 0;
    for round in 0..4u64 {
        let ip = |s: String| s.parse::<IpAddr>().unwrap();
        let a: Arc<dyn Context> = Arc::new(
            SoftContext::bind_with(
                SocketAddr::new(ip(format!("127.0.41.{}", 2 * round + 1)), 0),
                &lossy(round + 1),
            )
            .unwrap(),
        );
        let port = a.info().udp_addr.unwrap().port();
        let b: Arc<dyn Context> = Arc::new(
            SoftContext::bind_with(
                SocketAddr::new(ip(format!("127.0.41.{}", 2 * round + 2)), port),
                &lossy(round + 100),
            )
            .unwrap(),
        );
        let (cep, cid, cch, sep, _sid, sch, _lid) = connect_pair(&a, &b, 7100);
        send_one(&cep, &sep, 9);
        cid.disconnect().unwrap();
        expect(&cch, CmEventKind::Disconnected);
        expect(&sch, CmEventKind::Disconnected);
        for ctx in [&a, &b] {
            retransmits += ctx
                .counters()
                .iter()
                .find(|c| c.name == "cm_retransmits")
                .map_or(0, |c| c.value);
        }
    }
    assert!(retransmits > 0, "some MADs were lost and resent");
}

/// A CM that retries fast, with the first MADs of the kinds in `drop_cm` lost.
fn dropping(drop_cm: &str) -> SoftOptions {
    SoftOptions {
        faults: Some(FaultConfig::parse(&format!("drop_cm={drop_cm}")).unwrap()),
        cm: Some(CmConfig::default().with_response_timeout(14)),
        ..SoftOptions::default()
    }
}

fn counter(ctx: &Arc<dyn Context>, name: &str) -> u64 {
    ctx.counters()
        .iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.value)
}

#[test]
fn a_lost_rep_and_a_lost_rtu_are_retried() {
    // The listener's first REP is lost: the connector's REQ times out and goes again, the
    // listener answers the duplicate with its REP again. Then the connector's first RTU
    // (and first DREQ) are lost: the listener's REP times out and goes again, the
    // connector answers with the RTU again; the DREQ is resent.
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let a: Arc<dyn Context> = Arc::new(
        SoftContext::bind_with(SocketAddr::new(ip("127.0.42.1"), 0), &dropping("rtu+dreq"))
            .unwrap(),
    );
    let port = a.info().udp_addr.unwrap().port();
    let b: Arc<dyn Context> = Arc::new(
        SoftContext::bind_with(SocketAddr::new(ip("127.0.42.2"), port), &dropping("rep")).unwrap(),
    );
    let (cep, cid, cch, sep, _sid, sch, _lid) = connect_pair(&a, &b, 7300);
    send_one(&cep, &sep, 3);
    cid.disconnect().unwrap();
    expect(&cch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
    // a resent its REQ (the REP was lost), its RTU (on b's REP again) and its DREQ;
    // b its REP (on the duplicate REQ, and again when no RTU came).
    assert!(counter(&a, "cm_retransmits") >= 2, "{:?}", a.counters());
    assert!(counter(&b, "cm_retransmits") + counter(&b, "cm_duplicates") >= 1);
    assert!(counter(&a, "fault_dropped") >= 2 || counter(&b, "fault_dropped") >= 1);
}

#[test]
fn another_providers_channel_and_bad_binds_are_refused() {
    let (a, b) = pair("127.0.40.17", "127.0.40.18", &SoftOptions::default());
    let ch = a.create_cm_channel().unwrap();
    let id = a.create_cm_id(&ch, PortSpace::Tcp).unwrap();
    let other = b.create_cm_id(&ch, PortSpace::Tcp).unwrap();
    // Another device's address.
    let e = id.bind(addr(&b, 7200)).unwrap_err();
    assert_eq!(e.errno(), 99, "{e}");
    id.bind(addr(&a, 7200)).unwrap();
    assert_eq!(id.local_addr(), Some(addr(&a, 7200)));
    let id2 = a.create_cm_id(&ch, PortSpace::Tcp).unwrap();
    let e = id2.bind(addr(&a, 7200)).unwrap_err();
    assert_eq!(e.errno(), 98, "{e}");
    // The same port in another port space, or on another device, is free.
    a.create_cm_id(&ch, PortSpace::Udp)
        .unwrap()
        .bind(addr(&a, 7200))
        .unwrap();
    other.bind(addr(&b, 7200)).unwrap();
    // A QP of another device.
    let ep = endpoint(&b, &QpOptions::default(), QpType::Rc, None).unwrap();
    assert!(id.set_qp(Some(ep.qp.clone())).is_err());
    // The id's context is its device.
    assert_eq!(id.context().info().name, a.info().name);
}

#[test]
fn dropping_a_channel_with_unread_events_frees_ids_and_device() {
    let at: SocketAddr = "127.0.40.19:0".parse().unwrap();
    let ctx: Arc<dyn Context> = Arc::new(SoftContext::bind(at).unwrap());
    let bound = ctx.info().udp_addr.unwrap();
    let ch = ctx.create_cm_channel().unwrap();
    let id = ctx.create_cm_id(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, "127.0.40.20:7300".parse().unwrap(), WAIT)
        .unwrap();
    // The AddrResolved event (holding the id) is never read.
    drop(id);
    drop(ch);
    drop(ctx);
    // The device is gone: its address can be bound again.
    SoftContext::bind(bound).expect("the device was freed");
}

#[test]
fn dropping_a_connected_id_disconnects_the_peer() {
    let (a, b) = pair("127.0.40.21", "127.0.40.22", &SoftOptions::default());
    let (cep, cid, _cch, _sep, _sid, sch, _lid) = connect_pair(&a, &b, 7301);
    drop(cid);
    expect(&sch, CmEventKind::Disconnected);
    assert_eq!(cep.qp.state(), QpState::Err);
}

#[test]
fn inline_devices_connect_when_driven() {
    let opts = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let (a, b) = pair("127.0.40.23", "127.0.40.24", &opts);
    // Drives both devices until `ch` has an event.
    let drive = |ch: &Arc<dyn CmChannel>| -> CmEvent {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(ev) = ch.get_event() {
                return ev;
            }
            assert!(Instant::now() < deadline, "no event");
            a.drive(Duration::from_millis(1)).unwrap();
            b.drive(Duration::from_millis(1)).unwrap();
        }
    };
    let (sch, _lid) = listener(&b, PortSpace::Tcp, 7302);
    let cch = a.create_cm_channel().unwrap();
    let cid = a.create_cm_id(&cch, PortSpace::Tcp).unwrap();
    cid.resolve_addr(None, addr(&b, 7302), WAIT).unwrap();
    assert_eq!(drive(&cch).kind, CmEventKind::AddrResolved);
    cid.resolve_route(WAIT).unwrap();
    assert_eq!(drive(&cch).kind, CmEventKind::RouteResolved);
    cid.connect(&ConnParam {
        qp_num: 0x99,
        ..ConnParam::default()
    })
    .unwrap();
    let req = drive(&sch);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    req.id
        .accept(&ConnParam {
            qp_num: 0x98,
            ..ConnParam::default()
        })
        .unwrap();
    assert_eq!(drive(&cch).kind, CmEventKind::ConnectResponse);
    cid.establish().unwrap();
    assert_eq!(drive(&sch).kind, CmEventKind::Established);
}

#[test]
fn connect_over_ipv6() {
    // Two devices on ::1 (the only IPv6 loopback address), on two ports, each sending to
    // the other's: rdma_cm's IP header and the GIDs are IPv6.
    let (pa, pb) = match (
        std::net::UdpSocket::bind("[::1]:0"),
        std::net::UdpSocket::bind("[::1]:0"),
    ) {
        (Ok(a), Ok(b)) => (
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        ),
        _ => {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        }
    };
    let open = |port: u16, peer: u16| -> Arc<dyn Context> {
        let opts = SoftOptions {
            peer_port: Some(peer),
            ..SoftOptions::default()
        };
        Arc::new(
            SoftContext::bind_with(
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
                &opts,
            )
            .unwrap(),
        )
    };
    let (a, b) = (open(pa, pb), open(pb, pa));
    let (cep, cid, cch, sep, _sid, sch, _lid) = connect_pair(&a, &b, 7400);
    send_one(&cep, &sep, 6);
    send_one(&sep, &cep, 7);
    cid.disconnect().unwrap();
    expect(&cch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
}
