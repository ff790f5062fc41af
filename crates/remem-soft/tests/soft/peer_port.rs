//! `Context::set_peer_udp_port` on the soft provider: two soft devices each on a UDP port
//! of its own (both opened with port 0) talk — RC SEND/WRITE/READ/atomics, UD, the
//! connection manager — once each side has told its device the other's port; without it
//! a device sends to its default peer port (its own), which the raw-socket test shows. An
//! address vector that names a port (`AhAttr::udp_port`) goes there, and moves no other path.

use crate::common;

use common::{post_recv, sge, ud_to_rtr};
use remem_conformance::{Case, Pair, run_pair};
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::{
    AccessFlags, AhAttr, Context, Error, Gid, MemRegion, MemoryBuffer, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType, SendOp, SendWr, UdDest,
};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

/// Two devices on `ip_a` and `ip_b`, each on a port of its own, each told the other's.
fn pair_on_own_ports(ip_a: &str, ip_b: &str) -> Pair {
    let a = SoftContext::bind(format!("{ip_a}:0").parse().unwrap()).expect("device a");
    let b = SoftContext::bind(format!("{ip_b}:0").parse().unwrap()).expect("device b");
    let (aa, ba) = (a.local_addr(), b.local_addr());
    assert_ne!(aa.port(), ba.port());
    a.set_peer_udp_port(Gid::from(ba.ip()), ba.port()).unwrap();
    b.set_peer_udp_port(Gid::from(aa.ip()), aa.port()).unwrap();
    Pair::new(Arc::new(a), Arc::new(b))
}

const CASES: &[&str] = &[
    "send_recv_multi_packet_multi_sge",
    "rdma_write_and_write_with_imm",
    "rdma_read_multi_packet",
    "atomics_return_original_values",
    "ud_send_recv_with_grh_and_qkey",
    "uc_send_and_write",
    "cm_connect_disconnect",
];

fn run_cases(pair: &Pair) {
    for name in CASES {
        let case = Case::named(name).unwrap_or_else(|| panic!("no case {name}"));
        if let Err(e) = run_pair(case, pair) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn devices_on_different_ports_of_one_address_talk() {
    run_cases(&pair_on_own_ports("127.0.0.1", "127.0.0.1"));
}

#[test]
fn devices_on_different_ports_and_addresses_talk() {
    run_cases(&pair_on_own_ports("127.0.0.1", "127.0.0.2"));
}

/// A UD QP in RTS on `ctx`, an address handle to `peer` (created before any port is
/// set) and a registered 64-byte buffer; `send` posts one datagram to QPN 0x42.
struct UdSender {
    pd: Arc<dyn remem_verbs::ProtectionDomain>,
    qp: Arc<dyn remem_verbs::QueuePair>,
    cq: Arc<dyn remem_verbs::CompletionQueue>,
    ah: Arc<dyn remem_verbs::AddressHandle>,
    mr: Arc<dyn remem_verbs::MemoryRegion>,
}

impl UdSender {
    fn new(ctx: &Arc<dyn Context>, peer: IpAddr) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                cap: QpCap {
                    max_send_wr: 8,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            })
            .unwrap();
        ud_to_rtr(&*qp, 0x1234);
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 1,
            ..QpAttr::default()
        };
        qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .unwrap();
        let (gid_index, _) = remem_conformance::roce_v2_gid(&**ctx).unwrap();
        let ah = pd
            .create_ah(&AhAttr {
                dgid: Gid::from(peer),
                sgid_index: gid_index,
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            })
            .unwrap();
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let mr = pd
            .reg_mr(MemRegion::whole(buf), AccessFlags::LOCAL_WRITE)
            .unwrap();
        UdSender { pd, qp, cq, ah, mr }
    }

    fn send(&self) {
        self.send_with(&self.ah);
    }

    /// Sends one datagram to QPN 0x42 through address handle `ah`.
    fn send_with(&self, ah: &Arc<dyn remem_verbs::AddressHandle>) {
        let sg = [sge(&*self.mr, 0, 8)];
        let mut wr = SendWr::new(1, SendOp::Send, &sg);
        wr.ud = Some(UdDest {
            ah: ah.clone(),
            remote_qpn: 0x42,
            remote_qkey: 0x1234,
        });
        self.qp.post_send(&[wr]).unwrap();
        remem_conformance::poll_one(&*self.cq, Duration::from_secs(5)).unwrap();
    }
}

/// The next datagram on `sock` (bounded wait).
fn recv_on(sock: &UdpSocket) -> Option<SocketAddr> {
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 2048];
    sock.recv_from(&mut buf).ok().map(|(_, from)| from)
}

#[test]
fn packets_go_to_the_default_port_until_the_peer_port_is_set() {
    // The "default" peer socket, and the peer's real socket on another port.
    let default = UdpSocket::bind("127.0.0.1:0").unwrap();
    let real = UdpSocket::bind("127.0.0.1:0").unwrap();
    let opts = SoftOptions {
        peer_port: Some(default.local_addr().unwrap().port()),
        ..SoftOptions::default()
    };
    let dev = SoftContext::bind_with("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
    let dev_addr = dev.local_addr();
    let ctx: Arc<dyn Context> = Arc::new(dev);
    let ud = UdSender::new(&ctx, "127.0.0.1".parse().unwrap());

    // Without set_peer_udp_port the datagram goes to the default port: the real peer
    // would never hear it.
    ud.send();
    assert_eq!(recv_on(&default), Some(dev_addr));

    // Told the peer's port, the same (existing) address handle sends there.
    let real_port = real.local_addr().unwrap().port();
    ctx.set_peer_udp_port(Gid::from(IpAddr::from([127, 0, 0, 1])), real_port)
        .unwrap();
    ud.send();
    assert_eq!(recv_on(&real), Some(dev_addr));

    // Overwriting the entry takes effect too (an IPv4-mapped GID names the same peer).
    let default_port = default.local_addr().unwrap().port();
    let mapped = Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped());
    ctx.set_peer_udp_port(mapped, default_port).unwrap();
    ud.send();
    assert_eq!(recv_on(&default), Some(dev_addr));
}

/// An address vector that names a UDP port (`AhAttr::udp_port`) sends there, whatever
/// the device's default or table says, and moves no other path: the port is the path's.
#[test]
fn an_address_handle_naming_a_port_sends_there_and_moves_nothing_else() {
    let default = UdpSocket::bind("127.0.0.1:0").unwrap();
    let named = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tabled = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = |s: &UdpSocket| s.local_addr().unwrap().port();
    let opts = SoftOptions {
        peer_port: Some(port(&default)),
        ..SoftOptions::default()
    };
    let dev = SoftContext::bind_with("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
    let dev_addr = dev.local_addr();
    let ctx: Arc<dyn Context> = Arc::new(dev);
    assert!(ctx.can_send_to_udp_port(port(&named)));
    let ud = UdSender::new(&ctx, "127.0.0.1".parse().unwrap());
    let mut av = *ud.ah.attr();
    av.udp_port = port(&named);
    let ah_named = ud.pd.create_ah(&av).unwrap();
    ud.send_with(&ah_named);
    assert_eq!(recv_on(&named), Some(dev_addr));
    // The other address handle to the same GID still goes to the default port.
    ud.send();
    assert_eq!(recv_on(&default), Some(dev_addr));
    // The application's table moves the handle that names no port, not the other.
    ctx.set_peer_udp_port(Gid::from(IpAddr::from([127, 0, 0, 1])), port(&tabled))
        .unwrap();
    ud.send();
    assert_eq!(recv_on(&tabled), Some(dev_addr));
    ud.send_with(&ah_named);
    assert_eq!(recv_on(&named), Some(dev_addr));
}

#[test]
fn without_the_peer_port_devices_on_different_ports_do_not_hear_each_other() {
    // b is on another port and nobody told a: a's datagram goes to a's own port.
    let a: Arc<dyn Context> = Arc::new(SoftContext::bind("127.0.0.1:0".parse().unwrap()).unwrap());
    let b: Arc<dyn Context> = Arc::new(SoftContext::bind("127.0.0.1:0".parse().unwrap()).unwrap());
    let ud = UdSender::new(&a, "127.0.0.1".parse().unwrap());
    let before = common::counter(&*b, "rcvd_pkts");
    ud.send();
    // The datagram reached a itself (to an unknown QPN): that is where it went.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while common::counter(&*a, "drop_unknown_qp") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a never got its own datagram"
        );
        std::thread::yield_now();
    }
    assert_eq!(common::counter(&*b, "rcvd_pkts"), before);
}

#[test]
fn peer_port_table_is_bounded() {
    let dev = SoftContext::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    assert!(matches!(
        dev.set_peer_udp_port(Gid::from(IpAddr::from([127, 0, 0, 9])), 0),
        Err(Error::InvalidArgument(_))
    ));
    let budget = remem_soft::engine::PEER_PORT_BUDGET;
    for i in 0..budget as u32 {
        let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        dev.set_peer_udp_port(Gid::from(ip), 5000).unwrap();
    }
    // Overwriting a known peer is fine at the limit; a new one is refused.
    dev.set_peer_udp_port(Gid::from(std::net::Ipv4Addr::from(0x0a00_0000)), 5001)
        .unwrap();
    let one_more = std::net::Ipv4Addr::from(0x0a00_0000 + budget as u32);
    assert!(matches!(
        dev.set_peer_udp_port(Gid::from(one_more), 5000),
        Err(Error::Exhausted(_))
    ));
}

#[test]
fn default_port_needs_no_entry_for_a_receive() {
    // A device that was told nothing still receives from a peer told its port: b knows
    // a's port, a answers b on b's port only once told (RC needs both; here b → a UD).
    let a: Arc<dyn Context> = Arc::new(SoftContext::bind("127.0.0.1:0".parse().unwrap()).unwrap());
    let b = SoftContext::bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let a_addr = a.info().udp_addr.unwrap();
    b.set_peer_udp_port(Gid::from(a_addr.ip()), a_addr.port())
        .unwrap();
    let b: Arc<dyn Context> = Arc::new(b);
    // a's UD QP with a receive posted, QPN told to b.
    let ud_a = UdSender::new(&a, "127.0.0.2".parse().unwrap());
    let buf = Arc::new(MemoryBuffer::zeroed(256).unwrap());
    let rmr = ud_a
        .pd
        .reg_mr(MemRegion::whole(buf), AccessFlags::LOCAL_WRITE)
        .unwrap();
    post_recv(&*ud_a.qp, 7, sge(&*rmr, 0, 256));
    let ud_b = UdSender::new(&b, a_addr.ip());
    let sg = [sge(&*ud_b.mr, 0, 8)];
    let mut wr = SendWr::new(1, SendOp::Send, &sg);
    wr.ud = Some(UdDest {
        ah: ud_b.ah.clone(),
        remote_qpn: ud_a.qp.qp_num(),
        remote_qkey: 0x1234,
    });
    ud_b.qp.post_send(&[wr]).unwrap();
    remem_conformance::poll_one(&*ud_b.cq, Duration::from_secs(5)).unwrap();
    let wc = remem_conformance::poll_one(&*ud_a.cq, Duration::from_secs(5)).unwrap();
    assert_eq!(wc.wr_id, 7);
    assert_eq!(wc.status, remem_verbs::WcStatus::Success);
}
