//! Two agents wired to each other in virtual time: every MAD is delivered (or dropped by
//! the test's filter) by hand, time advances only when the test says so.

use super::*;
use remem_wire::mad::{
    CM_ATTR_DREP, CM_ATTR_DREQ, CM_ATTR_MRA, CM_ATTR_REJ, CM_ATTR_REP, CM_ATTR_REQ, CM_ATTR_RTU,
    CM_ATTR_SIDR_REP, CM_ATTR_SIDR_REQ,
};

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";
const PORT: u16 = 7471;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A MAD on the wire: who sent it and its attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    from: char,
    attr: u16,
}

type Filter = Box<dyn FnMut(&Sent, &CmMad) -> bool>;

struct Net {
    a: Agent,
    b: Agent,
    now: Instant,
    log: Vec<Sent>,
    /// Returns false to lose the MAD.
    keep: Filter,
}

fn cfg() -> CmConfig {
    CmConfig {
        max_retries: 3,
        ..CmConfig::default()
    }
    .with_response_timeout(14)
}

impl Net {
    fn new() -> Net {
        Net::with(cfg(), cfg())
    }

    fn with(ca: CmConfig, cb: CmConfig) -> Net {
        Net {
            a: Agent::new(ca, 1),
            b: Agent::new(cb, 2),
            now: Instant::now(),
            log: Vec::new(),
            keep: Box::new(|_, _| true),
        }
    }

    /// Delivers every queued MAD (and what the answers produce) until both are quiet.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                moved = true;
                assert_eq!(t.dst, ip(B));
                self.carry('a', &t);
            }
            while let Some(t) = self.b.poll_transmit() {
                moved = true;
                assert_eq!(t.dst, ip(A));
                self.carry('b', &t);
            }
            if !moved {
                return;
            }
        }
    }

    fn carry(&mut self, from: char, t: &Transmit) {
        let mad = CmMad::parse(&t.mad[..]).expect("the agent emits valid MADs");
        let sent = Sent {
            from,
            attr: mad.header.attribute_id,
        };
        self.log.push(sent.clone());
        if !(self.keep)(&sent, &mad) {
            return;
        }
        let now = self.now;
        match from {
            'a' => self.b.handle_mad(now, ip(A), &t.mad[..]),
            _ => self.a.handle_mad(now, ip(B), &t.mad[..]),
        }
    }

    /// Advances virtual time to the next timer of either agent, runs it, delivers.
    fn step(&mut self) -> bool {
        let next = match (self.a.poll_timeout(), self.b.poll_timeout()) {
            (Some(x), Some(y)) => x.min(y),
            (x, y) => match x.or(y) {
                Some(t) => t,
                None => return false,
            },
        };
        self.now = self.now.max(next);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.pump();
        true
    }

    fn events(agent: &mut Agent) -> Vec<Event> {
        std::iter::from_fn(|| agent.poll_event()).collect()
    }

    fn attrs(&self) -> Vec<(char, u16)> {
        self.log.iter().map(|s| (s.from, s.attr)).collect()
    }

    /// A connects to B's listener (owner 77) with `pd`; returns A's connection.
    fn connect(&mut self, pd: &[u8]) -> u32 {
        let param = ConnParam {
            private_data: pd.to_vec(),
            qp_num: 0x111,
            ..ConnParam::default()
        };
        let args = ConnectArgs {
            ps: PortSpace::Tcp,
            src: SocketAddr::new(ip(A), 40000),
            dst: SocketAddr::new(ip(B), PORT),
            qpn: 0x111,
            param: &param,
            mtu: Mtu::Mtu4096,
            ca_guid: 0xa,
        };
        let c = self.a.connect(self.now, &args).unwrap();
        self.pump();
        c
    }

    fn listen(&mut self, backlog: u32) {
        self.b
            .listen(77, PortSpace::Tcp.service_id(PORT), None, backlog);
    }

    /// B's pending request (the one ConnectRequest event expected).
    fn request(&mut self) -> u32 {
        let evs = Net::events(&mut self.b);
        match evs.as_slice() {
            [
                Event::ConnectRequest {
                    conn, listener: 77, ..
                },
            ] => *conn,
            e => panic!("expected one request, got {e:?}"),
        }
    }

    fn accept(&mut self, conn: u32) {
        let p = ConnParam {
            private_data: b"rep".to_vec(),
            qp_num: 0x222,
            ..ConnParam::default()
        };
        self.b.accept(self.now, conn, 0x222, &p, 0xb).unwrap();
        self.pump();
    }

    /// A's REP (expected), then its RTU.
    fn establish(&mut self, conn: u32) {
        let evs = Net::events(&mut self.a);
        assert!(
            matches!(evs.as_slice(), [Event::ConnectReply { conn: c, .. }] if *c == conn),
            "{evs:?}"
        );
        self.a.establish(conn, &[]).unwrap();
        self.pump();
    }

    /// A full connection: (A's, B's).
    fn connected(&mut self) -> (u32, u32) {
        self.listen(4);
        let a = self.connect(b"req");
        let b = self.request();
        self.accept(b);
        self.establish(a);
        assert!(matches!(
            Net::events(&mut self.b).as_slice(),
            [Event::Established { .. }]
        ));
        assert_eq!(self.a.state(a), Some(ConnState::Established));
        assert_eq!(self.b.state(b), Some(ConnState::Established));
        (a, b)
    }
}

#[test]
fn req_rep_rtu_and_the_negotiated_attributes() {
    let mut n = Net::new();
    n.listen(4);
    let a = n.connect(b"hello");
    let evs = Net::events(&mut n.b);
    let [
        Event::ConnectRequest {
            conn: b,
            header,
            private_data,
            req: Some(req),
            peer,
            ..
        },
    ] = evs.as_slice()
    else {
        panic!("{evs:?}")
    };
    assert_eq!(*peer, ip(A));
    assert_eq!(header.src, ip(A));
    assert_eq!(header.dst, ip(B));
    assert_eq!(header.src_port, 40000);
    assert!(private_data.starts_with(b"hello"));
    assert_eq!(
        private_data.len(),
        CmReq::PRIVATE_DATA_LEN - CmaIpHeader::LEN
    );
    assert_eq!(req.service_id, 0x0106_0000 | u64::from(PORT));
    assert_eq!(req.local_qpn, 0x111);
    let b = *b;
    n.b.limit_mtu(b, Mtu::Mtu1024);
    n.accept(b);
    n.establish(a);
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Established { .. }]
    ));
    assert_eq!(
        n.attrs(),
        [('a', CM_ATTR_REQ), ('b', CM_ATTR_REP), ('a', CM_ATTR_RTU)]
    );
    let (pa, pb) = (n.a.qp_params(a).unwrap(), n.b.qp_params(b).unwrap());
    assert_eq!(pa.remote_qpn, 0x222);
    assert_eq!(pb.remote_qpn, 0x111);
    assert_eq!(pa.sq_psn, pb.rq_psn);
    assert_eq!(pb.sq_psn, pa.rq_psn);
    assert_eq!(pa.peer, ip(B));
    assert_eq!(pb.peer, ip(A));
    assert_eq!(pb.path_mtu, Mtu::Mtu1024, "the smaller MTU");
    assert_eq!(pa.timeout, cfg().local_ack_timeout);
    assert_eq!(pb.timeout, cfg().local_ack_timeout);
    assert_eq!(pa.retry_cnt, 7);
    assert_eq!(pb.retry_cnt, 7);
    assert_eq!(
        n.a.stats().drop_out_of_state + n.b.stats().drop_out_of_state,
        0
    );
}

#[test]
fn a_lost_rep_is_recovered_by_the_req_retry() {
    let mut n = Net::new();
    let mut lost = false;
    n.keep = Box::new(move |s, _| {
        if s.attr == CM_ATTR_REP && !lost {
            lost = true;
            return false;
        }
        true
    });
    n.listen(4);
    let a = n.connect(b"");
    let b = n.request();
    n.accept(b);
    assert!(Net::events(&mut n.a).is_empty(), "the REP was lost");
    let t0 = n.now;
    assert!(n.step());
    // One response timeout later A resent its REQ; B, in REP Sent, answered it with the REP.
    assert_eq!(n.now - t0, cfg().response());
    n.establish(a);
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Established { .. }]
    ));
    // (B's own REP timer, as long as A's, fired at the same instant: a second REP.)
    let attrs = n.attrs();
    assert_eq!(
        attrs.iter().filter(|s| **s == ('a', CM_ATTR_REQ)).count(),
        2
    );
    assert_eq!(attrs.last(), Some(&('a', CM_ATTR_RTU)));
    assert_eq!(n.b.stats().duplicates, 1, "the second REQ");
    assert_eq!(n.a.stats().retransmits, 1);
}

#[test]
fn a_lost_rtu_is_recovered_by_the_rep_retry() {
    let mut n = Net::new();
    let mut lost = false;
    n.keep = Box::new(move |s, _| {
        if s.attr == CM_ATTR_RTU && !lost {
            lost = true;
            return false;
        }
        true
    });
    n.listen(4);
    let a = n.connect(b"");
    let b = n.request();
    n.accept(b);
    n.establish(a);
    assert_eq!(n.a.state(a), Some(ConnState::Established));
    assert_eq!(n.b.state(b), Some(ConnState::RepSent));
    assert!(n.step());
    // B resent the REP after the REQ's local CM response timeout; A answered with the RTU.
    assert_eq!(n.b.state(b), Some(ConnState::Established));
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Established { .. }]
    ));
    assert!(Net::events(&mut n.a).is_empty(), "no second REP event");
    assert_eq!(n.attrs()[3..], [('b', CM_ATTR_REP), ('a', CM_ATTR_RTU)]);
}

#[test]
fn a_slow_consumer_is_covered_by_an_mra() {
    let mut n = Net::new();
    n.listen(4);
    let a = n.connect(b"");
    let b = n.request();
    // B's consumer does not answer: A resends the REQ, B answers with an MRA, and A
    // waits the MRA's service timeout instead of its own retries.
    assert!(n.step());
    assert_eq!(n.attrs()[1..], [('a', CM_ATTR_REQ), ('b', CM_ATTR_MRA)]);
    assert_eq!(n.a.state(a), Some(ConnState::MraReqRcvd));
    assert_eq!(n.b.state(b), Some(ConnState::MraReqSent));
    let deadline = n.a.poll_timeout().unwrap();
    assert!(
        deadline - n.now > Duration::from_secs(30),
        "the MRA's long wait"
    );
    n.accept(b);
    n.establish(a);
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Established { .. }]
    ));
}

#[test]
fn an_unanswered_req_is_unreachable_after_the_retries() {
    let mut n = Net::new();
    n.keep = Box::new(|s, _| s.from != 'a');
    let a = n.connect(b"");
    let t0 = n.now;
    while Net::events(&mut n.a).is_empty() {
        assert!(n.step());
    }
    // (The events were taken by the loop: check the end state and the timing.)
    assert_eq!(n.a.state(a), None);
    assert_eq!(n.now - t0, cfg().response() * 4, "1 try + 3 retries");
    assert_eq!(n.a.stats().retransmits, 3);
    assert_eq!(n.a.stats().timeouts, 1);
    let reqs = n.attrs().iter().filter(|s| s.1 == CM_ATTR_REQ).count();
    assert_eq!(reqs, 4);
    assert_eq!(n.attrs().last(), Some(&('a', CM_ATTR_REJ)), "REJ timeout");
    assert_eq!(n.a.conn_count(), 0);
    assert_eq!(n.a.poll_timeout(), None);
}

#[test]
fn unreachable_event_reports_etimedout() {
    let mut n = Net::new();
    n.keep = Box::new(|_, _| false);
    let a = n.connect(b"");
    let mut evs = Vec::new();
    while evs.is_empty() {
        assert!(n.step());
        evs = Net::events(&mut n.a);
    }
    assert_eq!(
        evs,
        [Event::Unreachable {
            conn: a,
            status: -ETIMEDOUT
        }]
    );
}

#[test]
fn no_listener_is_rej_8_at_once() {
    // Without a grace (`CmConfig::listen_grace` zero), as kernel rdma_cm.
    let at_once = CmConfig {
        listen_grace: Duration::ZERO,
        ..cfg()
    };
    let mut n = Net::with(at_once.clone(), at_once);
    n.b.listen(77, PortSpace::Tcp.service_id(PORT + 1), None, 4);
    let a = n.connect(b"x");
    let evs = Net::events(&mut n.a);
    let [Event::Rejected { conn, reason, .. }] = evs.as_slice() else {
        panic!("{evs:?}")
    };
    assert_eq!((*conn, *reason), (a, rej_reason::INVALID_SERVICE_ID));
    assert_eq!(n.b.stats().rej_no_listener, 1);
    assert_eq!(n.b.conn_count(), 0, "nothing kept for it");
    // A listener on another address does not match either; a wildcard one does.
    n.b.listen(78, PortSpace::Tcp.service_id(PORT), Some(ip("10.9.9.9")), 4);
    n.connect(b"x");
    assert!(matches!(
        Net::events(&mut n.a).as_slice(),
        [Event::Rejected { reason: 8, .. }]
    ));
    n.b.listen(79, PortSpace::Tcp.service_id(PORT), Some(ip(B)), 4);
    n.connect(b"x");
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::ConnectRequest { listener: 79, .. }]
    ));
}

#[test]
fn a_request_before_its_listener_is_taken_within_the_grace_and_rejected_after_it() {
    // Nobody listens yet: the request waits (the default grace, 250 ms).
    let mut n = Net::new();
    n.connect(b"x");
    assert!(Net::events(&mut n.a).is_empty(), "not rejected yet");
    assert!(Net::events(&mut n.b).is_empty());
    assert_eq!(n.b.conn_count(), 0, "a waiting request holds no connection");
    // The server listens within the grace: the request is its listener's.
    n.b.listen(7, PortSpace::Tcp.service_id(PORT), None, 4);
    let now = n.now;
    n.b.claim_unclaimed(now);
    n.pump();
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::ConnectRequest { listener: 7, .. }]
    ));
    assert_eq!(n.b.stats().rej_no_listener, 0);
    // Nobody listens, and nobody comes: rejected when the grace is over (not before the
    // requester's own timer, which would resend the REQ).
    let mut n = Net::new();
    let start = n.now;
    n.connect(b"x");
    while Net::events(&mut n.a).is_empty() && n.step() {}
    assert_eq!(n.b.stats().rej_no_listener, 1);
    assert_eq!(
        n.now - start,
        cfg().listen_grace,
        "rejected when the grace ended"
    );
}

#[test]
fn consumer_reject_with_private_data_and_a_duplicate_req_after_it() {
    let mut n = Net::new();
    let mut first_rej = true;
    // The REJ is lost once: the resent REQ must be answered with the same REJ, not
    // become a second request.
    n.keep = Box::new(move |s, _| {
        if s.attr == CM_ATTR_REJ && first_rej {
            first_rej = false;
            return false;
        }
        true
    });
    n.listen(4);
    let a = n.connect(b"");
    let b = n.request();
    n.b.reject(n.now, b, rej_reason::CONSUMER_DEFINED, b"no thanks")
        .unwrap();
    n.pump();
    assert!(Net::events(&mut n.a).is_empty());
    assert!(n.step());
    let evs = Net::events(&mut n.a);
    let [
        Event::Rejected {
            conn,
            reason,
            private_data,
        },
    ] = evs.as_slice()
    else {
        panic!("{evs:?}")
    };
    assert_eq!((*conn, *reason), (a, 28));
    assert!(private_data.starts_with(b"no thanks"));
    assert!(Net::events(&mut n.b).is_empty(), "no second request");
    // B forgets it after TimeWait.
    while n.step() {}
    assert_eq!(n.b.conn_count(), 0);
    assert_eq!(n.a.conn_count(), 0);
}

#[test]
fn backlog_bounds_pending_requests() {
    let mut n = Net::new();
    n.listen(2);
    let _a1 = n.connect(b"1");
    let _a2 = n.connect(b"2");
    let a3 = n.connect(b"3");
    let evs = Net::events(&mut n.b);
    assert_eq!(evs.len(), 2);
    let Event::ConnectRequest { conn: b1, .. } = evs[0] else {
        panic!()
    };
    assert!(matches!(
        Net::events(&mut n.a).as_slice(),
        [Event::Rejected { conn, reason: 3, .. }] if *conn == a3
    ));
    assert_eq!(n.b.stats().rej_backlog, 1);
    // Answering one frees a place.
    n.b.reject(n.now, b1, 28, &[]).unwrap();
    n.pump();
    Net::events(&mut n.a);
    n.connect(b"4");
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::ConnectRequest { .. }]
    ));
}

#[test]
fn connection_records_are_bounded() {
    let b_cfg = CmConfig {
        max_conns: 3,
        ..cfg()
    };
    let mut n = Net::with(cfg(), b_cfg);
    n.listen(100);
    for _ in 0..5 {
        n.connect(b"");
    }
    assert_eq!(Net::events(&mut n.b).len(), 3);
    assert_eq!(n.b.conn_count(), 3);
    assert_eq!(n.b.stats().rej_no_resources, 2);
    let rejected = Net::events(&mut n.a)
        .iter()
        .filter(|e| matches!(e, Event::Rejected { reason: 3, .. }))
        .count();
    assert_eq!(rejected, 2);
}

#[test]
fn disconnect_from_either_side_with_lost_dreq_and_drep() {
    for (who, lose) in [
        ('a', CM_ATTR_DREQ),
        ('a', CM_ATTR_DREP),
        ('b', CM_ATTR_DREQ),
        ('b', CM_ATTR_DREP),
    ] {
        let mut n = Net::new();
        let (a, b) = n.connected();
        let mut lost = false;
        n.keep = Box::new(move |s, _| {
            if s.attr == lose && !lost {
                lost = true;
                return false;
            }
            true
        });
        let (me, peer) = if who == 'a' { (a, b) } else { (b, a) };
        let (mine, theirs) = if who == 'a' {
            (&mut n.a, &mut n.b)
        } else {
            (&mut n.b, &mut n.a)
        };
        mine.disconnect(n.now, me, b"bye").unwrap();
        let _ = theirs;
        n.pump();
        // Whatever was lost, the DREQ's retry (answered from TimeWait) finishes it.
        let mut mine_ev = Vec::new();
        let mut theirs_ev = Vec::new();
        for _ in 0..10 {
            let (m, t) = if who == 'a' {
                (Net::events(&mut n.a), Net::events(&mut n.b))
            } else {
                (Net::events(&mut n.b), Net::events(&mut n.a))
            };
            mine_ev.extend(m);
            theirs_ev.extend(t);
            if !mine_ev.is_empty() {
                break;
            }
            n.step();
        }
        assert!(
            matches!(mine_ev.first(), Some(Event::Disconnected { conn, status: 0, .. }) if *conn == me),
            "{who} lost {lose:#x}: {mine_ev:?}"
        );
        assert!(
            matches!(theirs_ev.first(), Some(Event::Disconnected { conn, status: 0, private_data }) if *conn == peer && private_data.starts_with(b"bye")),
            "{who} lost {lose:#x}: {theirs_ev:?}"
        );
        // Both leave TimeWait, and the records go.
        while n.step() {}
        let exits = [Net::events(&mut n.a), Net::events(&mut n.b)];
        for e in &exits {
            assert!(
                matches!(e.as_slice(), [Event::TimewaitExit { .. }]),
                "{e:?}"
            );
        }
        assert_eq!(n.a.conn_count() + n.b.conn_count(), 0);
    }
}

#[test]
fn dreqs_that_cross_disconnect_both_once() {
    let mut n = Net::new();
    let (a, b) = n.connected();
    n.a.disconnect(n.now, a, &[]).unwrap();
    n.b.disconnect(n.now, b, &[]).unwrap();
    n.pump();
    for ag in [&mut n.a, &mut n.b] {
        let evs = Net::events(ag);
        assert_eq!(
            evs.iter()
                .filter(|e| matches!(e, Event::Disconnected { status: 0, .. }))
                .count(),
            1,
            "{evs:?}"
        );
    }
}

#[test]
fn an_unanswered_dreq_disconnects_with_etimedout() {
    let mut n = Net::new();
    let (a, _b) = n.connected();
    n.keep = Box::new(|_, _| false);
    n.a.disconnect(n.now, a, &[]).unwrap();
    let mut evs = Vec::new();
    while evs.is_empty() {
        assert!(n.step());
        evs = Net::events(&mut n.a);
    }
    assert!(matches!(
        evs.as_slice(),
        [Event::Disconnected { status, .. }] if *status == -ETIMEDOUT
    ));
}

#[test]
fn releasing_ids_rejects_or_disconnects() {
    // A pending request whose id is dropped is rejected (consumer reject).
    let mut n = Net::new();
    n.listen(4);
    n.connect(b"");
    let b = n.request();
    n.b.release(n.now, b);
    n.pump();
    assert!(matches!(
        Net::events(&mut n.a).as_slice(),
        [Event::Rejected { reason: 28, .. }]
    ));
    // An established connection whose id is dropped is disconnected; the peer hears it.
    let mut n = Net::new();
    let (a, _b) = n.connected();
    n.a.release(n.now, a);
    n.pump();
    assert!(Net::events(&mut n.a).is_empty(), "nobody to tell");
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Disconnected { .. }]
    ));
    // A connecting id dropped: the REQ's retries stop, the peer's request is withdrawn.
    let mut n = Net::new();
    n.listen(4);
    let a = n.connect(b"");
    let _b = n.request();
    n.a.release(n.now, a);
    n.pump();
    assert_eq!(n.a.conn_count(), 0);
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Rejected { reason: 4, .. }]
    ));
}

#[test]
fn a_pending_request_times_out_if_never_answered() {
    let b_cfg = CmConfig {
        pending_timeout: Duration::from_millis(500),
        ..cfg()
    };
    let mut n = Net::with(cfg(), b_cfg);
    n.listen(1);
    let _a = n.connect(b"");
    let b = n.request();
    // A gives up after its retries (MRAs keep it waiting), B after its pending timeout.
    let mut b_evs = Vec::new();
    while b_evs.is_empty() {
        assert!(n.step());
        b_evs = Net::events(&mut n.b);
    }
    assert!(
        matches!(b_evs.as_slice(), [Event::ConnectError { conn, status }] if *conn == b && *status == -ETIMEDOUT),
        "{b_evs:?}"
    );
    // The backlog place is free again.
    n.connect(b"");
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::ConnectRequest { .. }]
    ));
}

#[test]
fn timewait_records_are_bounded() {
    let b_cfg = CmConfig {
        max_timewait: 2,
        ..cfg()
    };
    let mut n = Net::with(cfg(), b_cfg);
    n.listen(16);
    for _ in 0..4 {
        n.connect(b"");
        let b = n.request();
        n.b.reject(n.now, b, 28, &[]).unwrap();
        n.pump();
    }
    assert_eq!(n.b.conn_count(), 2);
    assert_eq!(n.b.stats().timewait_evicted, 2);
}

fn sidr_connect(n: &mut Net, port: u16) -> u32 {
    let param = ConnParam {
        private_data: b"sidr".to_vec(),
        ..ConnParam::default()
    };
    let args = ConnectArgs {
        ps: PortSpace::Udp,
        src: SocketAddr::new(ip(A), 40001),
        dst: SocketAddr::new(ip(B), port),
        qpn: 0x333,
        param: &param,
        mtu: Mtu::Mtu4096,
        ca_guid: 0xa,
    };
    let c = n.a.connect(n.now, &args).unwrap();
    n.pump();
    c
}

#[test]
fn sidr_resolution_reject_and_no_listener() {
    let mut n = Net::new();
    let mut lost = false;
    n.keep = Box::new(move |s, _| {
        if s.attr == CM_ATTR_SIDR_REP && !lost {
            lost = true;
            return false;
        }
        true
    });
    n.b.listen(5, PortSpace::Udp.service_id(PORT), None, 4);
    let a = sidr_connect(&mut n, PORT);
    let evs = Net::events(&mut n.b);
    let [
        Event::ConnectRequest {
            conn: b,
            req: None,
            private_data,
            ..
        },
    ] = evs.as_slice()
    else {
        panic!("{evs:?}")
    };
    assert!(private_data.starts_with(b"sidr"));
    let p = ConnParam {
        private_data: b"ok".to_vec(),
        ..ConnParam::default()
    };
    n.b.accept(n.now, *b, 0x444, &p, 0xb).unwrap();
    n.pump();
    // The SIDR REP was lost: the SIDR REQ's retry is answered with the same reply.
    assert!(n.step());
    let evs = Net::events(&mut n.a);
    assert!(
        matches!(evs.as_slice(), [Event::SidrResolved { conn, qpn: 0x444, qkey, private_data }]
            if *conn == a && *qkey == RDMA_UDP_QKEY && private_data.starts_with(b"ok")),
        "{evs:?}"
    );
    assert!(Net::events(&mut n.b).is_empty(), "one request only");
    assert_eq!(
        n.attrs(),
        [
            ('a', CM_ATTR_SIDR_REQ),
            ('b', CM_ATTR_SIDR_REP),
            ('a', CM_ATTR_SIDR_REQ),
            ('b', CM_ATTR_SIDR_REP)
        ]
    );
    // Rejected by the consumer: status 2.
    sidr_connect(&mut n, PORT);
    let evs = Net::events(&mut n.b);
    let [Event::ConnectRequest { conn: b, .. }] = evs.as_slice() else {
        panic!("{evs:?}")
    };
    n.b.reject(n.now, *b, 0, b"no").unwrap();
    n.pump();
    assert!(matches!(
        Net::events(&mut n.a).as_slice(),
        [Event::Unreachable { status: 2, .. }]
    ));
    // Nobody listens: status 1.
    sidr_connect(&mut n, PORT + 1);
    assert!(matches!(
        Net::events(&mut n.a).as_slice(),
        [Event::Unreachable { status: 1, .. }]
    ));
}

/// A MAD from `src` built by hand.
fn mad(msg: CmMessage) -> [u8; MAD_LEN] {
    CmMad::new(0x1234, msg).emit().unwrap()
}

#[test]
fn hostile_mads_are_dropped_and_counted() {
    let mut n = Net::new();
    let (a, b) = n.connected();
    let now = n.now;
    let before = n.b.stats();
    let evil = ip("10.0.0.66");
    // Truncated, not CM, unknown attribute.
    n.b.handle_mad(now, ip(A), &[1, 7, 2, 3]);
    let mut m = mad(CmMessage::Rtu(CmRtu::default()));
    m[1] = 0x81; // another management class
    n.b.handle_mad(now, ip(A), &m);
    let mut m = mad(CmMessage::Rtu(CmRtu::default()));
    m[17] = 0x99; // attribute 0x0099
    n.b.handle_mad(now, ip(A), &m);
    // A REQ whose rdma_cm header is garbage, one with an invalid MTU.
    n.listen(4);
    let mut req = CmReq {
        local_comm_id: 5,
        service_id: PortSpace::Tcp.service_id(PORT),
        path_mtu: 3,
        private_data: vec![0xee; 36],
        ..CmReq::default()
    };
    n.b.handle_mad(now, ip(A), &mad(CmMessage::Req(req.clone())));
    req.private_data = CmaIpHeader {
        src: ip(A),
        dst: ip(B),
        ..CmaIpHeader::default()
    }
    .with_private_data(&[], CmReq::PRIVATE_DATA_LEN)
    .unwrap();
    req.path_mtu = 9;
    n.b.handle_mad(now, ip(A), &mad(CmMessage::Req(req)));
    // Unknown communication IDs.
    for msg in [
        CmMessage::Rtu(CmRtu {
            local_comm_id: a,
            remote_comm_id: b ^ 1,
            ..CmRtu::default()
        }),
        CmMessage::Dreq(CmDreq {
            local_comm_id: a,
            remote_comm_id: 0xdead_beef,
            ..CmDreq::default()
        }),
        CmMessage::Rep(CmRep {
            local_comm_id: 1,
            remote_comm_id: 2,
            ..CmRep::default()
        }),
        CmMessage::SidrRep(CmSidrRep {
            request_id: 3,
            ..CmSidrRep::default()
        }),
    ] {
        n.b.handle_mad(now, ip(A), &mad(msg));
    }
    // The right IDs from the wrong address.
    let dreq = CmMessage::Dreq(CmDreq {
        local_comm_id: a,
        remote_comm_id: b,
        ..CmDreq::default()
    });
    n.b.handle_mad(now, evil, &mad(dreq));
    // The peer's own ID with the wrong peer ID.
    let dreq = CmMessage::Dreq(CmDreq {
        local_comm_id: a ^ 0x10,
        remote_comm_id: b,
        ..CmDreq::default()
    });
    n.b.handle_mad(now, ip(A), &mad(dreq));
    // Out of state: a REP and an MRA for an established passive connection, a DREP
    // with no DREQ.
    for msg in [
        CmMessage::Rep(CmRep {
            local_comm_id: a,
            remote_comm_id: b,
            ..CmRep::default()
        }),
        CmMessage::Mra(CmMra {
            local_comm_id: a,
            remote_comm_id: b,
            message_mraed: MsgRef::Rep,
            ..CmMra::default()
        }),
        CmMessage::Drep(CmDrep {
            local_comm_id: a,
            remote_comm_id: b,
            ..CmDrep::default()
        }),
    ] {
        n.b.handle_mad(now, ip(A), &mad(msg));
    }
    // (The unknown DREQ was answered with a DREP, as ib_cm answers it.)
    let answers: Vec<Transmit> = std::iter::from_fn(|| n.b.poll_transmit()).collect();
    assert_eq!(answers.len(), 1);
    assert!(matches!(
        CmMad::parse(&answers[0].mad[..]).unwrap().message,
        CmMessage::Drep(CmDrep {
            local_comm_id: 0xdead_beef,
            ..
        })
    ));
    let s = n.b.stats();
    assert_eq!(s.rx_mads - before.rx_mads, 14);
    assert_eq!(s.drop_malformed - before.drop_malformed, 5);
    assert_eq!(s.drop_unknown_comm_id - before.drop_unknown_comm_id, 5);
    assert_eq!(s.drop_wrong_source - before.drop_wrong_source, 1);
    assert_eq!(s.drop_out_of_state - before.drop_out_of_state, 3);
    assert!(Net::events(&mut n.b).is_empty());
    assert_eq!(n.b.tx_len(), 0, "nothing answered");
    assert_eq!(n.b.state(b), Some(ConnState::Established));
    // The connection and the listener still work.
    n.b.disconnect(n.now, b, &[]).unwrap();
    n.pump();
    assert!(matches!(
        Net::events(&mut n.a).as_slice(),
        [Event::Disconnected { .. }]
    ));
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::Disconnected { .. }]
    ));
    n.connect(b"again");
    assert!(matches!(
        Net::events(&mut n.b).as_slice(),
        [Event::ConnectRequest { .. }]
    ));
}

#[test]
fn random_and_mutated_mads_never_panic() {
    let mut n = Net::new();
    let (a, b) = n.connected();
    n.listen(4);
    let valid: Vec<[u8; MAD_LEN]> = vec![
        mad(CmMessage::Rtu(CmRtu {
            local_comm_id: a,
            remote_comm_id: b,
            ..CmRtu::default()
        })),
        mad(CmMessage::Dreq(CmDreq {
            local_comm_id: a,
            remote_comm_id: b,
            ..CmDreq::default()
        })),
        mad(CmMessage::Req(CmReq {
            local_comm_id: 9,
            service_id: PortSpace::Tcp.service_id(PORT),
            path_mtu: 3,
            private_data: CmaIpHeader {
                src: ip(A),
                dst: ip(B),
                ..CmaIpHeader::default()
            }
            .with_private_data(&[], 92)
            .unwrap(),
            ..CmReq::default()
        })),
    ];
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20_000 {
        let mut m = valid[i % valid.len()].to_vec();
        for _ in 0..(rnd() % 6) {
            let at = (rnd() % MAD_LEN as u64) as usize;
            m[at] = rnd() as u8;
        }
        let len = if rnd() % 8 == 0 {
            (rnd() % 300) as usize
        } else {
            MAD_LEN
        };
        m.resize(len, 0);
        let from = if rnd() % 2 == 0 {
            ip(A)
        } else {
            ip("10.0.0.66")
        };
        n.b.handle_mad(n.now, from, &m);
        while n.b.poll_transmit().is_some() {}
        Net::events(&mut n.b);
        if i % 1000 == 0 {
            n.now += Duration::from_millis(100);
            n.b.handle_timeout(n.now);
        }
    }
    assert_eq!(n.b.stats().rx_mads, 20_000 + 2);
    assert!(n.b.conn_count() <= cfg().max_conns);
}
