//! Unmodified Debian programs on the drop-in, both ends, two processes on loopback:
//! rdma-core's pingpong examples (ibverbs-utils) and perftest. Each process's default
//! device `rxe0` takes a loopback address of its own, so the pairs need no configuration.
//! The pingpong examples are given the device's RoCE v2 GID index (`-g`; read from
//! `ibv_devinfo -v`); perftest finds it by itself (one run names it with `-x`).
//!
//! A test whose program is not installed prints `skipped: …` and passes; so do the UC
//! runs while the soft provider has no UC queue pairs (asked of remem-soft directly).

use crate::common;
use crate::support;

use common::{DropIn, tool};
use support::{assert_both_ok, free_port, have_timeout, roce_v2_gid_index, run_pair, serial};

/// Whether the soft provider creates UC queue pairs (else the UC runs are skipped).
fn uc_supported() -> bool {
    use remem_verbs::{Context, QpCap, QpInitAttr, QpType};
    let ctx = match remem_soft::SoftContext::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        &remem_soft::SoftOptions {
            inline: true,
            ..Default::default()
        },
    ) {
        Ok(c) => c,
        Err(e) => {
            common::skip(&format!("no soft device to ask about UC: {e}"));
            return false;
        }
    };
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let ok = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: cq.clone(),
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .is_ok();
    if !ok {
        common::skip("the soft provider has no UC queue pairs");
    }
    ok
}

/// `ibv_<kind>_pingpong -g 0` (plus `extra`) between two processes; asserts that both
/// exit 0 and print their throughput lines.
fn pingpong(prog: &str, extra: &[&str]) {
    pingpong_on(prog, None, extra)
}

/// [`pingpong`] with `-g gid` (`None`: the first RoCE v2 GID `ibv_devinfo` lists).
fn pingpong_on(prog: &str, gid: Option<&str>, extra: &[&str]) {
    if !have_timeout() {
        return;
    }
    let Some(p) = tool(prog, "ibverbs-utils") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new(prog);
    let gid = match gid {
        Some(g) => g.to_string(),
        None => match roce_v2_gid_index(&d) {
            Some(g) => g,
            None => return,
        },
    };
    let port = free_port().to_string();
    let mut server = vec!["-d", "rxe0", "-g", &gid, "-p", &port, "-n", "200"];
    server.extend_from_slice(extra);
    let mut client = server.clone();
    client.push("127.0.0.1");
    let (s, c) = run_pair(&d, &p, &server, &client, port.parse().unwrap());
    assert_both_ok(&format!("{prog} {extra:?}"), &s, &c);
    for r in [&s, &c] {
        assert!(
            r.out.contains("bytes in") && r.out.contains("iters in"),
            "{prog}: no result lines in\n{}",
            r.out
        );
    }
}

#[test]
fn rc_pingpong() {
    pingpong("ibv_rc_pingpong", &[]);
}

/// rxe's GID indexes: 0 the link-local GID, 1 the IPv4 one; programs connect over either
/// (index 0 names a loopback soft device by its link-local GID; both send from its
/// address).
#[test]
fn rc_pingpong_over_gid_0_and_1() {
    pingpong_on("ibv_rc_pingpong", Some("0"), &[]);
    pingpong_on("ibv_rc_pingpong", Some("1"), &[]);
}

#[test]
fn ud_pingpong_over_gid_0_and_1() {
    pingpong_on("ibv_ud_pingpong", Some("0"), &["-s", "512"]);
    pingpong_on("ibv_ud_pingpong", Some("1"), &["-s", "512"]);
}

#[test]
fn rc_pingpong_events_and_check() {
    pingpong("ibv_rc_pingpong", &["-e", "-c"]);
}

#[test]
fn rc_pingpong_new_send_api() {
    pingpong("ibv_rc_pingpong", &["-N", "-c"]);
}

#[test]
fn uc_pingpong() {
    if uc_supported() {
        pingpong("ibv_uc_pingpong", &[]);
    }
}

#[test]
fn ud_pingpong() {
    pingpong("ibv_ud_pingpong", &["-s", "1024"]);
}

#[test]
fn ud_pingpong_events() {
    pingpong("ibv_ud_pingpong", &["-e", "-s", "512"]);
}

#[test]
fn srq_pingpong() {
    pingpong("ibv_srq_pingpong", &[]);
}

#[test]
fn srq_pingpong_events() {
    pingpong("ibv_srq_pingpong", &["-e", "-q", "4"]);
}

/// Whether `out` has a perftest result row: a line after the `#bytes` header whose first
/// two columns are integers and that has at least five numeric columns.
fn has_result_row(out: &str) -> bool {
    let mut after_header = false;
    for line in out.lines() {
        if line.contains("#bytes") {
            after_header = true;
            continue;
        }
        if !after_header {
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 5
            && cols[0].parse::<u64>().is_ok()
            && cols[1].parse::<u64>().is_ok()
            && cols.iter().all(|c| c.parse::<f64>().is_ok())
        {
            return true;
        }
    }
    false
}

/// A perftest program with `args` (both ends), device `rxe0`, a TCP port of its own;
/// asserts both exit 0 and that the client printed a result row.
fn perftest(prog: &str, args: &[&str]) {
    if !have_timeout() {
        return;
    }
    let Some(p) = tool(prog, "perftest") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new(prog);
    let port = free_port().to_string();
    let mut server = vec!["-d", "rxe0", "-p", &port, "-F"];
    server.extend_from_slice(args);
    let mut client = server.clone();
    client.push("127.0.0.1");
    let (s, c) = run_pair(&d, &p, &server, &client, port.parse().unwrap());
    assert_both_ok(&format!("{prog} {args:?}"), &s, &c);
    assert!(
        has_result_row(&c.out),
        "{prog} {args:?}: no result row in the client's output\n{}",
        c.out
    );
}

#[test]
fn write_bw() {
    perftest("ib_write_bw", &["-n", "200"]);
}

#[test]
fn write_bw_gid_index_named() {
    if !have_timeout() {
        return;
    }
    // `-x 1`, as scripts written for rxe name its IPv4 GID; and `-x 0`, the link-local.
    perftest("ib_write_bw", &["-n", "200", "-x", "1"]);
    perftest("ib_write_bw", &["-n", "200", "-x", "0"]);
}

#[test]
fn write_bw_old_post_send_multi_qp() {
    perftest(
        "ib_write_bw",
        &["-n", "200", "--use_old_post_send", "-q", "4"],
    );
}

#[test]
fn write_bw_bidirectional() {
    perftest("ib_write_bw", &["-n", "200", "-b"]);
}

#[test]
fn write_bw_all_sizes() {
    perftest("ib_write_bw", &["-n", "20", "-a"]);
}

#[test]
fn write_bw_uc() {
    if uc_supported() {
        perftest("ib_write_bw", &["-n", "200", "-c", "UC"]);
    }
}

#[test]
fn read_bw() {
    perftest("ib_read_bw", &["-n", "200"]);
}

#[test]
fn read_bw_old_post_send_multi_qp_bidirectional() {
    perftest(
        "ib_read_bw",
        &["-n", "100", "--use_old_post_send", "-q", "4", "-b"],
    );
}

#[test]
fn send_bw() {
    perftest("ib_send_bw", &["-n", "200"]);
}

#[test]
fn send_bw_ud() {
    perftest("ib_send_bw", &["-n", "200", "-c", "UD"]);
}

#[test]
fn send_bw_old_post_send_bidirectional_multi_qp() {
    perftest(
        "ib_send_bw",
        &["-n", "200", "--use_old_post_send", "-b", "-q", "4"],
    );
}

#[test]
fn send_bw_uc() {
    // UC has no flow control: a sender that outruns its receiver loses messages (as on a
    // NIC), and perftest's SEND server waits for every one. 200 one-packet messages fit the
    // receives it posts and the receiving socket's buffer even when the machine is loaded
    // (200 × 64 KiB did not: a CI run lost one and the server waited until killed).
    if uc_supported() {
        perftest("ib_send_bw", &["-n", "200", "-s", "1024", "-c", "UC"]);
    }
}

#[test]
fn atomic_bw() {
    perftest("ib_atomic_bw", &["-n", "200"]);
}

#[test]
fn atomic_bw_cmp_swap_old_post_send() {
    perftest(
        "ib_atomic_bw",
        &[
            "-n",
            "200",
            "-A",
            "CMP_AND_SWAP",
            "--use_old_post_send",
            "-q",
            "2",
        ],
    );
}

#[test]
fn write_lat() {
    perftest("ib_write_lat", &["-n", "200"]);
}

#[test]
fn write_lat_old_post_send() {
    perftest(
        "ib_write_lat",
        &["-n", "200", "--use_old_post_send", "-s", "8"],
    );
}

#[test]
fn read_lat() {
    perftest("ib_read_lat", &["-n", "200"]);
}

#[test]
fn send_lat() {
    perftest("ib_send_lat", &["-n", "200"]);
}

#[test]
fn send_lat_ud() {
    perftest("ib_send_lat", &["-n", "200", "-c", "UD"]);
}

#[test]
fn send_lat_old_post_send_inline() {
    // `-e` (completion events) is left out: perftest's latency loop takes one event per
    // expected completion and polls the CQ it expects once, which assumes the peer's ACK
    // arrives before its reply; remem's RC sends a ready reply ahead of a pending ACK, so
    // ib_send_lat -e sees the reply's event first (the pingpong tests cover events).
    perftest(
        "ib_send_lat",
        &["-n", "200", "--use_old_post_send", "-s", "64", "-I", "128"],
    );
}

#[test]
fn atomic_lat() {
    perftest("ib_atomic_lat", &["-n", "200"]);
}

#[test]
fn result_rows_are_recognised() {
    let bw = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      200              1234.56            1200.00		   0.019200
---------------------------------------------------------------------------------------";
    assert!(has_result_row(bw));
    let lat = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2       200          5.01           20.33        6.10     	       6.50        	1.02		9.99 		20.33";
    assert!(has_result_row(lat));
    assert!(!has_result_row(
        " #bytes     #iterations\n Couldn't connect\n"
    ));
    assert!(
        !has_result_row("65536 200 1 2 3\n"),
        "a row needs the header"
    );
}
