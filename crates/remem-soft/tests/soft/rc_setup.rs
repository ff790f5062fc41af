//! `remem_verbs::rc` against soft devices: the first RoCE v2 GID of a port, and RC/UC QPs
//! brought from RESET to RTS by `rc::connect` (or step by step) that then move data; the
//! errors of a wrong QP type, a wrong order and a missing port.

use remem_conformance::poll_one;
use remem_soft::SoftOptions;
use remem_soft::testing::{Side, Spec, pair};
use remem_verbs::rc::{self, RcOptions, RcPeer};
use remem_verbs::{
    AccessFlags, Context, Error, GidType, QpCap, QpState, QpType, SendOp, SendWr, WcStatus,
};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

/// A side's queue pair: `qp_type`, 16 work requests of one SGE each way, every send
/// signalled, a 64-entry CQ and an 8 KiB buffer.
fn spec(qp_type: QpType) -> Spec {
    Spec {
        qp_type,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
        cqe: 64,
        len: 8192,
    }
}

/// Two soft devices on one port (127.0.0.1 and 127.0.0.2), each with a `qp_type` QP.
fn sides(qp_type: QpType) -> (Side, Side) {
    let ips = ["127.0.0.1", "127.0.0.2"].map(|ip| ip.parse().unwrap());
    pair(ips, &SoftOptions::from_env(), &spec(qp_type))
}

fn options(ctx: &dyn Context, psn: u32) -> RcOptions {
    let gid = rc::roce_v2_gid(ctx, 1).unwrap();
    RcOptions {
        sgid_index: gid.index as u8,
        sq_psn: psn,
        mtu: ctx.query_port(1).unwrap().active_mtu,
        ..RcOptions::default()
    }
}

fn peer_of(s: &Side, psn: u32) -> RcPeer {
    RcPeer {
        qpn: s.qp.qp_num(),
        psn,
        gid: rc::roce_v2_gid(&s.ctx, 1).unwrap().gid,
        mtu: s.ctx.query_port(1).unwrap().active_mtu,
    }
}

#[test]
fn first_roce_v2_gid_is_the_devices_ipv4_address() {
    let (a, _) = sides(QpType::Rc);
    let g = rc::roce_v2_gid(&a.ctx, 1).unwrap();
    assert_eq!(g.gid_type, GidType::RoceV2);
    assert_eq!(
        g.gid.to_ip(),
        "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    assert!(
        rc::roce_v2_gid(&a.ctx, 2).is_err(),
        "soft devices have port 1 only"
    );
}

#[test]
fn connect_brings_rc_qps_to_rts_and_they_write_read_and_send() {
    let (a, b) = sides(QpType::Rc);
    let (pa, pb) = (0x00ff_fffe, 0x12_3456); // A's wraps at once
    rc::connect(&*a.qp, &peer_of(&b, pb), &options(&a.ctx, pa)).unwrap();
    rc::connect(&*b.qp, &peer_of(&a, pa), &options(&b.ctx, pb)).unwrap();
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
    let attr = a.qp.query().unwrap();
    assert_eq!(attr.dest_qp_num, b.qp.qp_num());
    assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry), (14, 7, 7));

    // WRITE 5000 bytes (several packets), READ them back, SEND 100.
    a.buf.fill(0, 5000, 0xa5).unwrap();
    write_head(&a, &b, 5000);
    assert_eq!(poll_one(&*a.cq, WAIT).unwrap().status, WcStatus::Success);
    assert!(b.buf.to_vec(0, 5000).unwrap().iter().all(|&x| x == 0xa5));
    let r = [a.sge(5000, 3000)];
    b.buf.fill(1000, 3000, 0x5a).unwrap();
    let read = SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: b.buf.addr() + 1000,
            rkey: b.rkey,
        },
        &r,
    );
    a.qp.post_send(&[read]).unwrap();
    assert_eq!(poll_one(&*a.cq, WAIT).unwrap().status, WcStatus::Success);
    assert!(a.buf.to_vec(5000, 3000).unwrap().iter().all(|&x| x == 0x5a));
    let rs = [b.sge(0, 100)];
    b.qp.post_recv(&[remem_verbs::RecvWr {
        wr_id: 9,
        sg_list: &rs,
    }])
    .unwrap();
    let s = [a.sge(0, 100)];
    a.qp.post_send(&[SendWr::new(3, SendOp::Send, &s)]).unwrap();
    assert_eq!(poll_one(&*a.cq, WAIT).unwrap().status, WcStatus::Success);
    let wc = poll_one(&*b.cq, WAIT).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 100)
    );
}

/// Posts an RDMA WRITE (wr_id 1) of `from`'s first `len` bytes to the start of `to`'s
/// buffer.
fn write_head(from: &Side, to: &Side, len: u32) {
    let w = [from.sge(0, len)];
    let op = SendOp::RdmaWrite {
        remote_addr: to.buf.addr(),
        rkey: to.rkey,
    };
    from.qp.post_send(&[SendWr::new(1, op, &w)]).unwrap();
}

#[test]
fn step_by_step_uc_and_errors() {
    let (a, b) = sides(QpType::Uc);
    let uc = |s: &Side, psn| RcOptions {
        access: AccessFlags::REMOTE_WRITE,
        ..options(&s.ctx, psn)
    };
    // Out of order: RTR from RESET is the provider's error, the QP stays in RESET.
    assert!(rc::to_rtr(&*a.qp, &peer_of(&b, 0), &uc(&a, 0)).is_err());
    assert_eq!(a.qp.state(), QpState::Reset);
    for (me, peer) in [(&a, &b), (&b, &a)] {
        rc::to_init(&*me.qp, &uc(me, 0)).unwrap();
        rc::to_rtr(&*me.qp, &peer_of(peer, 0), &uc(me, 0)).unwrap();
        assert_eq!(me.qp.state(), QpState::Rtr);
        rc::to_rts(&*me.qp, &uc(me, 0)).unwrap();
    }
    b.buf.fill(0, 64, 0).unwrap();
    a.buf.fill(0, 64, 7).unwrap();
    write_head(&a, &b, 64);
    assert_eq!(poll_one(&*a.cq, WAIT).unwrap().status, WcStatus::Success);
    // UC completes at the sender when sent: wait for the bytes to land.
    let deadline = std::time::Instant::now() + WAIT;
    while !b.buf.to_vec(0, 64).unwrap().iter().all(|&x| x == 7) {
        assert!(
            std::time::Instant::now() < deadline,
            "UC WRITE never landed"
        );
        std::thread::yield_now();
    }

    // A UD QP is not connected.
    let ud = a.create_qp(&spec(QpType::Ud));
    assert!(matches!(
        rc::connect(&*ud, &peer_of(&b, 0), &options(&a.ctx, 0)),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(ud.state(), QpState::Reset);
}
