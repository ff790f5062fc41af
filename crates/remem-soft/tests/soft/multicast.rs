//! UD multicast on the soft provider (`QueuePair::attach_mcast` / `detach_mcast`): a
//! datagram sent to a multicast GID (IPv4-mapped, ::ffff:239.x.y.z) reaches every UD QP
//! attached to the group on every device (several devices on loopback addresses, one
//! process), each checked against its own Q_Key; a QP not attached, or detached, never
//! sees it; the checks the kernel makes (UD only, a multicast GID) are there.

use crate::common;

use common::{counter, post_recv, sge, ud_to_rtr};
use remem_soft::SoftContext;
use remem_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Error, Gid, MemRegion, MemoryBuffer,
    MemoryRegion, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair, SendOp,
    SendWr, UdDest, WcStatus, WorkCompletion,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QKEY: u32 = 0x0123_4567;
const MCAST_QPN: u32 = 0x00ff_ffff;

fn mgid(group: Ipv4Addr) -> Gid {
    Gid(group.to_ipv6_mapped().octets())
}

/// Three devices on 127.0.0.1, .2 and .3, one UDP port (a free one).
fn devices() -> [Arc<dyn Context>; 3] {
    for _ in 0..100 {
        let a = SoftContext::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = a.local_addr().port();
        let at = |ip: &str| SoftContext::bind(SocketAddr::new(ip.parse().unwrap(), port));
        if let (Ok(b), Ok(c)) = (at("127.0.0.2"), at("127.0.0.3")) {
            return [Arc::new(a), Arc::new(b), Arc::new(c)];
        }
    }
    panic!("no UDP port free on 127.0.0.1-3");
}

/// A UD QP in RTS with Q_Key `qkey`, its CQ and a registered 256-byte buffer.
struct Ud {
    pd: Arc<dyn remem_verbs::ProtectionDomain>,
    qp: Arc<dyn QueuePair>,
    cq: Arc<dyn CompletionQueue>,
    buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
}

impl Ud {
    fn new(ctx: &Arc<dyn Context>, qkey: u32) -> Ud {
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
        ud_to_rtr(&*qp, qkey);
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 1,
            ..QpAttr::default()
        };
        qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .unwrap();
        let buf = Arc::new(MemoryBuffer::zeroed(256).unwrap());
        let mr = pd
            .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::LOCAL_WRITE)
            .unwrap();
        Ud {
            pd,
            qp,
            cq,
            buf,
            mr,
        }
    }

    /// Posts a receive for a datagram (40 bytes of GRH, then the payload).
    fn post_recv(&self, wr_id: u64) {
        post_recv(&*self.qp, wr_id, sge(&*self.mr, 0, 256));
    }

    /// Sends `payload` to `group` (QPN 0xFFFFFF, Q_Key `qkey`) and waits for its completion.
    fn send_to_group(&self, ctx: &dyn Context, group: Ipv4Addr, qkey: u32, payload: &[u8]) {
        let (gid_index, _) = remem_conformance::roce_v2_gid(ctx).unwrap();
        let ah = self
            .pd
            .create_ah(&AhAttr {
                dgid: mgid(group),
                sgid_index: gid_index,
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            })
            .unwrap();
        self.buf.write(128, payload).unwrap();
        let sg = [sge(&*self.mr, 128, payload.len() as u32)];
        let mut wr = SendWr::new(7, SendOp::Send, &sg);
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: MCAST_QPN,
            remote_qkey: qkey,
        });
        self.qp.post_send(&[wr]).unwrap();
        let wc = remem_conformance::poll_one(&*self.cq, Duration::from_secs(5)).unwrap();
        assert_eq!(wc.status, WcStatus::Success);
    }

    /// The next receive completion (bounded wait), with the payload it delivered.
    fn received(&self) -> (WorkCompletion, Vec<u8>) {
        let wc = remem_conformance::poll_one(&*self.cq, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("QP {:#x}: {e}", self.qp.qp_num()));
        assert_eq!(wc.status, WcStatus::Success);
        let len = wc.byte_len as usize - 40;
        (wc, self.buf.to_vec(40, len).unwrap())
    }

    /// Nothing completed.
    fn nothing(&self) -> bool {
        let mut out = [WorkCompletion::default(); 4];
        self.cq.poll(&mut out).unwrap() == 0
    }
}

/// Waits (bounded) until `f` holds.
fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn every_attached_qp_of_every_device_gets_a_copy() {
    let [a, b, c] = devices();
    let group: Ipv4Addr = "239.66.1.1".parse().unwrap();
    let sender = Ud::new(&a, QKEY);
    let (b1, b2, b3, c1) = (
        Ud::new(&b, QKEY),
        Ud::new(&b, QKEY),
        Ud::new(&b, QKEY),
        Ud::new(&c, QKEY),
    );
    for q in [&b1, &b2, &c1] {
        q.qp.attach_mcast(&mgid(group), 0).unwrap();
        // Attaching again is no error (rxe).
        q.qp.attach_mcast(&mgid(group), 0).unwrap();
    }
    for q in [&b1, &b2, &b3, &c1] {
        q.post_recv(1);
    }
    sender.send_to_group(&*a, group, QKEY, b"to the group");
    for q in [&b1, &b2, &c1] {
        let (wc, payload) = q.received();
        assert_eq!(payload, b"to the group");
        assert_eq!(wc.src_qp, sender.qp.qp_num());
        // The GRH area holds the IPv4 header the datagram came with: to the group.
        assert_eq!(q.buf.to_vec(36, 4).unwrap(), group.octets());
    }
    // b3 is on b1's device and was not attached: the delivery to b1 and b2 passed it by.
    assert!(b3.nothing());
    assert!(sender.nothing(), "the sender's own QP was not attached");

    // Detached, b1 gets nothing more; b2 still does.
    b1.qp.detach_mcast(&mgid(group), 0).unwrap();
    for q in [&b1, &b2, &c1] {
        q.post_recv(2);
    }
    sender.send_to_group(&*a, group, QKEY, b"second");
    assert_eq!(b2.received().1, b"second");
    assert!(b1.nothing());
    assert_eq!(c1.received().1, b"second");
}

#[test]
fn a_qkey_mismatch_is_dropped_and_counted_per_qp() {
    let [a, b, _c] = devices();
    let group: Ipv4Addr = "239.66.2.2".parse().unwrap();
    let sender = Ud::new(&a, QKEY);
    let right = Ud::new(&b, QKEY);
    let wrong = Ud::new(&b, 0x1111);
    for q in [&right, &wrong] {
        q.qp.attach_mcast(&mgid(group), 0).unwrap();
        q.post_recv(1);
    }
    let before = counter(&*b, "drop_bad_qkey");
    sender.send_to_group(&*a, group, QKEY, b"keyed");
    assert_eq!(right.received().1, b"keyed");
    until("the Q_Key drop to be counted", || {
        counter(&*b, "drop_bad_qkey") == before + 1
    });
    assert!(wrong.nothing());
}

#[test]
fn a_destroyed_qp_leaves_its_groups() {
    let [a, b, _c] = devices();
    let group: Ipv4Addr = "239.66.3.3".parse().unwrap();
    let sender = Ud::new(&a, QKEY);
    let gone = Ud::new(&b, QKEY);
    gone.qp.attach_mcast(&mgid(group), 0).unwrap();
    drop(gone);
    let stays = Ud::new(&b, QKEY);
    stays.qp.attach_mcast(&mgid(group), 0).unwrap();
    stays.post_recv(1);
    sender.send_to_group(&*a, group, QKEY, b"after");
    assert_eq!(stays.received().1, b"after");
    // The group's socket was closed with the destroyed QP and opened again: one copy.
    assert!(stays.nothing());
}

#[test]
fn attach_checks_what_the_kernel_checks() {
    let [a, _b, _c] = devices();
    let ud = Ud::new(&a, QKEY);
    let group = mgid("239.66.4.4".parse().unwrap());
    let unicast = Gid::from("127.0.0.2".parse::<IpAddr>().unwrap());
    assert!(matches!(
        ud.qp.attach_mcast(&unicast, 0),
        Err(Error::InvalidArgument(_))
    ));
    // Detaching a QP that is not attached: EINVAL, as rxe.
    assert!(matches!(
        ud.qp.detach_mcast(&group, 0),
        Err(Error::InvalidArgument(_))
    ));
    let v6 = Gid("ff0e::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    assert!(matches!(
        ud.qp.attach_mcast(&v6, 0),
        Err(Error::Unsupported(_))
    ));
    let cq = a.create_cq(4, None).unwrap();
    let rc = ud
        .pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let e = rc.attach_mcast(&group, 0).unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    let attr = a.query_device().unwrap();
    assert_eq!(attr.mcast, remem_verbs::McastCaps::RXE);
}
