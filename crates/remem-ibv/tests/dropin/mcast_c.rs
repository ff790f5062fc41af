//! UD multicast through the drop-in libibverbs (tests/c/mcast.c): two processes, each with
//! a soft device of its own on loopback. The receiver attaches two UD QPs to an IPv4 group
//! (`ibv_attach_mcast` with `::ffff:239.78.1.1`), the sender sends one datagram to it (QPN
//! 0xFFFFFF): both attached QPs receive it, a QP not attached does not; the errors are the
//! kernel's (EINVAL for a unicast GID, an RC QP, a QP not attached) and the device reports
//! rxe's multicast limits. The sender starts once the receiver has attached
//! (`REMEM_RDMACM_NOTIFY`, which the program writes itself). `rdma_join_multicast`'s
//! MULTICAST_JOIN event carries the `ud` parameters the kernel fills for RoCE v2.

use crate::common;
use crate::support;

use common::DropIn;
use support::CmSide;

#[test]
fn two_processes_exchange_a_multicast_datagram() {
    if !support::have_timeout() {
        return;
    }
    let _serial = support::serial();
    let d = DropIn::new("c-mcast");
    let Some(exe) = common::compile_c(
        &d,
        "mcast",
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    ) else {
        return;
    };
    let (s, c) = support::cm_addrs();
    let group = "239.78.1.1";
    let receiver = CmSide {
        prog: &exe,
        args: vec!["recv".into(), group.into()],
        ip: s,
    };
    let sender = CmSide {
        prog: &exe,
        args: vec!["send".into(), group.into()],
        ip: c,
    };
    let (r, s) = support::run_cm_pair(&d, &receiver, &sender, &|_| false);
    let show = format!(
        "--- receiver ({:?}) ---\n{}\n--- sender ({:?}) ---\n{}",
        r.code, r.out, s.code, s.out
    );
    assert_eq!(r.code, Some(0), "{show}");
    assert_eq!(s.code, Some(0), "{show}");
    assert!(
        r.out.contains("received on QP 1: \"hello, group\""),
        "{show}"
    );
    assert!(r.out.contains("0 failures"), "{show}");
    assert!(s.out.contains("sent to 239.78.1.1"), "{show}");
}

#[test]
fn rdma_join_multicast_reports_the_kernels_ud_parameters() {
    if !support::have_timeout() {
        return;
    }
    let d = DropIn::new("c-mcast-join");
    let Some(exe) = common::compile_c(
        &d,
        "mcast",
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    ) else {
        return;
    };
    let (ip, _) = support::cm_addrs();
    let out = support::dropin_command(&d, &exe, &["join", "239.78.2.2", &ip.to_string()])
        .env("REMEM_IBV_DEVICES", format!("rxe0=soft@{ip}"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("joined and left 239.78.2.2"), "{text}");
    assert!(text.contains("0 failures"), "{text}");
}
