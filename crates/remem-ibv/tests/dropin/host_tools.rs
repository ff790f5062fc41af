//! Unmodified Debian programs on ONE host address: every process on the drop-in's default
//! device (`REMEM_IBV_DEVICES` unset: `rxe0`, the host's device on 127.0.0.1:4791, shared
//! by every process of the user), servers bound to no address or to 127.0.0.1, clients
//! naming 127.0.0.1, as with a kernel rxe device on `lo`: rdmacm-utils' rping, perftest
//! (`-R` and the TCP exchange), libfabric's `fi_pingpong` over `verbs` MSG endpoints and
//! `verbs;ofi_rxm`, four `ibv_rc_pingpong` pairs at once; and a client SIGKILLed mid-run,
//! whose server a survivor of the shared device disconnects (DREQ) while another pair on
//! the device goes on.
//!
//! Every program runs under `timeout` (the SIGKILLed client is killed by the test); the
//! servers use CM and TCP ports from `support::free_port` (per test process), so runs of
//! this binary and others at once on the one device stay apart. The tests take
//! `support::serial()` as the other pairs do. A test whose program is not installed prints
//! `skipped: …` and passes (fails under `REMEM_REQUIRE_IBV_TOOLS=1`).

use crate::common;
use crate::rdmacm_tools::lost_listen_race;
use crate::support;

use common::{DropIn, tool};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{
    Notify, Ran, Running, assert_both_ok, await_blocked_writing, await_listening, dropin_command,
    free_port, gid_index_of, have_timeout, run_pair_env, serial,
};

/// The host device's IPv4 GID, as `ibv_devinfo` and the pingpong examples print it.
const HOST_GID: &str = "::ffff:127.0.0.1";

/// How long a test waits for a program's next expected line.
const LINE_LIMIT: Duration = Duration::from_secs(60);

/// Runs an RDMA CM server and then its client, both on the default device: the client
/// starts once the server's `rdma_listen` has returned (`REMEM_RDMACM_NOTIFY`) or the
/// server has exited. When the client's run satisfies `abandon`, the server is ended
/// (SIGTERM through `timeout`) and collected.
fn cm_pair(
    d: &DropIn,
    prog: &Path,
    server_args: &[&str],
    client_args: &[&str],
    abandon: &dyn Fn(&Ran) -> bool,
) -> (Ran, Ran) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let notify = Notify::new(d, &format!("cm-pair-{n}"));
    let mut server =
        Running::spawn(dropin_command(d, prog, server_args).env(Notify::ENV, &notify.path));
    if !notify.wait(&mut server) {
        let not = Ran {
            code: None,
            out: "client not started: the server never listened".into(),
        };
        return (server.finish(), not);
    }
    let client = Running::spawn(&mut dropin_command(d, prog, client_args)).finish();
    if abandon(&client) {
        server.terminate();
    }
    (server.finish(), client)
}

/// The data of rping's ping number `ping` with rping's default size (64 bytes, the last
/// a NUL): `rdma-ping-<ping>: ` and then consecutive characters from 'A' + ping % 58
/// through 'z', wrapping to 'A' (what rping writes, as its source and output show).
fn rping_data(ping: usize) -> String {
    const SIZE: usize = 64;
    let mut s = format!("rdma-ping-{ping}: ");
    let mut c = b'A' + (ping % 58) as u8;
    while s.len() < SIZE - 1 {
        s.push(c as char);
        c = if c == b'z' { b'A' } else { c + 1 };
    }
    s
}

/// Asserts that `out` has exactly `count` lines `<prefix><data>` (rping `-v`: the client
/// prints `ping data: `, the server `server ping data: `), the `i`-th carrying ping `i`'s
/// data byte for byte.
fn assert_pings(who: &str, out: &str, prefix: &str, count: usize) {
    let got: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix(prefix)).collect();
    assert_eq!(
        got.len(),
        count,
        "{who}: {} pings, not {count}:\n{out}",
        got.len()
    );
    for (i, data) in got.iter().enumerate() {
        assert_eq!(*data, rping_data(i), "{who}: ping {i}'s data");
    }
}

#[test]
fn rping_data_is_recognised() {
    assert_eq!(
        rping_data(0),
        "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert_eq!(
        rping_data(9),
        "rdma-ping-9: JKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzA"
    );
    assert_eq!(
        rping_data(2148),
        "rdma-ping-2148: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopq"
    );
}

/// `rping -s` (bound to no address) and `rping -c -a 127.0.0.1 -C 100 -v`, both on the
/// default device: 100 pings, each one's data checked on both sides (the client with
/// `-V` too).
#[test]
fn rping_unbound_server_and_client_to_127_0_0_1_100_verified_pings() {
    if !have_timeout() {
        return;
    }
    let Some(rping) = tool("rping", "rdmacm-utils") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new("host-rping");
    let port = free_port().to_string();
    let (s, c) = cm_pair(
        &d,
        &rping,
        &["-s", "-p", &port, "-C", "100", "-v"],
        &[
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-C",
            "100",
            "-v",
            "-V",
        ],
        &|_| false,
    );
    assert_both_ok("rping on 127.0.0.1", &s, &c);
    assert_pings("rping server", &s.out, "server ping data: ", 100);
    assert_pings("rping client", &c.out, "ping data: ", 100);
}

/// perftest's address line for the host device's GID (`GID: 00:…:255:255:127:00:00:01`).
const PERFTEST_HOST_GID: &str = "GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:01";

/// Asserts that perftest's output shows the local and the remote QP on the host device's
/// GID.
fn assert_host_gids(prog: &str, out: &str) {
    for side in ["local address", "remote address"] {
        let line = out.lines().skip_while(|l| !l.contains(side)).nth(1);
        assert!(
            line.is_some_and(|l| l.contains(PERFTEST_HOST_GID)),
            "{prog}: the {side} is not on {HOST_GID}:\n{out}"
        );
    }
}

/// How many times a perftest `-R` pair is run when its client loses perftest's listen race
/// (`rdmacm_tools::lost_listen_race`). On the host's shared device the race is lost far
/// more often than between two private devices: 2 to 3 runs in 6 of each of ib_write_bw,
/// ib_send_lat, ib_send_bw and ib_read_lat `-R` on 127.0.0.1 here, against none in 4
/// ib_send_lat runs between two addresses (`soft@127.0.50.1` and `.2`). Why is not known:
/// `rdma_bind_addr` + `rdma_listen` cost the same (about 50 µs) on the shared device as on
/// a private one; on one address the client's REQ reaches its own socket first and is
/// forwarded to the listener (`host_forwarded_out`), or rejected there when the listener
/// is not in the table yet. 10 runs make a failure from the race alone unlikely (about
/// 0.5^10).
const HOST_LISTEN_RACE_ATTEMPTS: u32 = 10;

/// perftest `prog -R` (the RDMA CM) with `extra`, server bound to no address, client to
/// 127.0.0.1, on the default device; asserts that both exit 0, over rdma_cm, on the host
/// device's GID, with `result` in the client's output.
fn perftest_cm(prog: &str, extra: &[&str], result: &str) {
    if !have_timeout() {
        return;
    }
    let Some(p) = tool(prog, "perftest") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new(&format!("host-{prog}"));
    let mut attempt = 1;
    let (s, c) = loop {
        let port = free_port().to_string();
        let mut server = vec!["-R", "-d", "rxe0", "-p", &port];
        server.extend_from_slice(extra);
        let mut client = server.clone();
        client.push("127.0.0.1");
        let (s, c) = cm_pair(&d, &p, &server, &client, &lost_listen_race);
        if attempt == HOST_LISTEN_RACE_ATTEMPTS || !lost_listen_race(&c) {
            break (s, c);
        }
        eprintln!(
            "{prog}: attempt {attempt} lost perftest's listen race (see \
             rdmacm_tools::lost_listen_race), running the pair again:\n{}",
            c.out
        );
        attempt += 1;
    };
    assert_both_ok(&format!("{prog} -R {extra:?}"), &s, &c);
    assert!(c.out.contains("Data ex. method : rdma_cm"), "{}", c.out);
    assert_host_gids(prog, &c.out);
    assert!(c.out.contains(result), "{prog}: no {result} in\n{}", c.out);
}

#[test]
fn ib_write_bw_rdma_cm_both_on_127_0_0_1() {
    perftest_cm("ib_write_bw", &["-n", "500"], "BW average[MB/sec]");
}

#[test]
fn ib_send_lat_rdma_cm_both_on_127_0_0_1() {
    perftest_cm("ib_send_lat", &["-n", "500"], "t_avg[usec]");
}

/// `ib_send_lat` with perftest's default out-of-band exchange (TCP to 127.0.0.1) and
/// `-x <index of ::ffff:127.0.0.1>` on both sides.
#[test]
fn ib_send_lat_tcp_exchange_gid_index_of_127_0_0_1() {
    if !have_timeout() {
        return;
    }
    let Some(p) = tool("ib_send_lat", "perftest") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new("host-send-lat-x");
    let Some(gid) = gid_index_of(&d, HOST_GID) else {
        return;
    };
    let port = free_port();
    let ps = port.to_string();
    let server = ["-d", "rxe0", "-x", &gid, "-p", &ps, "-n", "500", "-F"];
    let mut client = server.to_vec();
    client.push("127.0.0.1");
    let (s, c) = run_pair_env(&d, &p, &server, &client, port, &[]);
    assert_both_ok("ib_send_lat -x", &s, &c);
    assert!(c.out.contains("Data ex. method : Ethernet"), "{}", c.out);
    assert_host_gids("ib_send_lat -x", &c.out);
    assert!(c.out.contains("t_avg[usec]"), "{}", c.out);
}

/// `fi_pingpong` (libfabric-bin) with `args`, the server given no address (only its
/// control port, `-B`), the client naming 127.0.0.1 (`-P`): 100 round trips of 64 KiB
/// with libfabric's data checks (`-c`), both on the default device. Returns both runs
/// after asserting that both exit 0 and print the result row.
fn fi_pingpong(args: &[&str], env: &[(&str, &str)]) -> Option<(Ran, Ran)> {
    if !have_timeout() {
        return None;
    }
    let p = tool("fi_pingpong", "libfabric-bin")?;
    let _one = serial();
    let d = DropIn::new("host-fi-pingpong");
    let port = free_port();
    let ps = port.to_string();
    let mut server = vec!["-B", &ps, "-I", "100", "-S", "65536", "-c"];
    server.extend_from_slice(args);
    let mut client = server.clone();
    client[0] = "-P";
    client.push("127.0.0.1");
    let (s, c) = run_pair_env(&d, &p, &server, &client, port, env);
    assert_both_ok(&format!("fi_pingpong {args:?}"), &s, &c);
    for (who, r) in [("server", &s), ("client", &c)] {
        // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
        let row = r.out.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() == 8 && cols[..3] == ["64k", "100", "=100"]
        });
        assert!(
            row,
            "fi_pingpong {args:?}: no result row from the {who}:\n{}",
            r.out
        );
    }
    Some((s, c))
}

/// libfabric's verbs MSG endpoints: the passive endpoint binds (`rdma_bind_addr`) to
/// 127.0.0.1, which is the host device's address (kernel rdma_cm binds loopback to the
/// first active device); `FI_LOG_LEVEL=info` makes the provider say where it listens.
#[test]
fn fi_pingpong_verbs_msg_without_addresses() {
    let env = [("FI_LOG_LEVEL", "info")];
    let Some((s, _)) = fi_pingpong(&["-p", "verbs", "-e", "msg"], &env) else {
        return;
    };
    assert!(
        s.out.contains("listening on: fi_sockaddr_in://127.0.0.1:"),
        "the verbs provider's listener is not on 127.0.0.1:\n{}",
        s.out
    );
}

/// `verbs;ofi_rxm` RDM endpoints (connections made on demand through verbs MSG endpoints).
/// `FI_UNIVERSE_SIZE=16`: ofi_rxm sizes its CQ as (tx + rx queue size) × universe size
/// (262,144 by default), past rxe's `max_cqe` (32767), so without it `fi_enable` fails
/// with EINVAL on kernel rxe as on the drop-in (see the crate's docs).
#[test]
fn fi_pingpong_verbs_ofi_rxm_rdm_without_addresses() {
    fi_pingpong(
        &["-p", "verbs;ofi_rxm", "-e", "rdm"],
        &[("FI_UNIVERSE_SIZE", "16")],
    );
}

/// The value of `QPN 0x…` in the first line of `out` containing `side`.
fn pingpong_qpn(out: &str, side: &str) -> Option<u32> {
    let line = out.lines().find(|l| l.contains(side))?;
    let hex = line.split("QPN 0x").nth(1)?.split(',').next()?;
    u32::from_str_radix(hex, 16).ok()
}

/// Four `ibv_rc_pingpong` pairs at once on the default device: four servers (TCP ports
/// of their own) listening, then four clients to 127.0.0.1, all with `-g <index of
/// ::ffff:127.0.0.1>`: every pair succeeds, every QP is on the host device's GID, the
/// eight QP numbers are distinct and each client reached its own server's QP.
#[test]
fn four_rc_pingpong_pairs_at_once_on_127_0_0_1() {
    if !have_timeout() {
        return;
    }
    let Some(p) = tool("ibv_rc_pingpong", "ibverbs-utils") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new("host-rc-x4");
    let Some(gid) = gid_index_of(&d, HOST_GID) else {
        return;
    };
    let ports: Vec<String> = (0..4).map(|_| free_port().to_string()).collect();
    let args = |port: &str| -> Vec<String> {
        ["-d", "rxe0", "-g", &gid, "-p", port, "-n", "500"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let mut servers: Vec<Running> = ports
        .iter()
        .map(|port| {
            let a = args(port);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            Running::spawn(&mut dropin_command(&d, &p, &a))
        })
        .collect();
    for (i, port) in ports.iter().enumerate() {
        if !await_listening(port.parse().unwrap(), &mut servers[i]) {
            panic!("server {i} never listened: {:?}", servers[i].finish());
        }
    }
    let mut clients: Vec<Running> = ports
        .iter()
        .map(|port| {
            let mut a = args(port);
            a.push("127.0.0.1".into());
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            Running::spawn(&mut dropin_command(&d, &p, &a))
        })
        .collect();
    let cs: Vec<Ran> = clients.iter_mut().map(Running::finish).collect();
    let ss: Vec<Ran> = servers.iter_mut().map(Running::finish).collect();
    let mut qpns = std::collections::BTreeSet::new();
    for (i, (s, c)) in ss.iter().zip(&cs).enumerate() {
        assert_both_ok(&format!("ibv_rc_pingpong pair {i}"), s, c);
        for r in [s, c] {
            assert!(r.out.contains("500 iters in"), "pair {i}:\n{}", r.out);
            for side in ["local address:", "remote address:"] {
                let line = r.out.lines().find(|l| l.contains(side));
                assert!(
                    line.is_some_and(|l| l.trim_end().ends_with(&format!("GID {HOST_GID}"))),
                    "pair {i}: the {side} is not on {HOST_GID}:\n{}",
                    r.out
                );
            }
            qpns.insert(pingpong_qpn(&r.out, "local address:").unwrap());
        }
        assert_eq!(
            pingpong_qpn(&c.out, "remote address:"),
            pingpong_qpn(&s.out, "local address:"),
            "pair {i}: the client reached another server's QP"
        );
    }
    assert_eq!(
        qpns.len(),
        8,
        "QP numbers shared between processes: {qpns:x?}"
    );
}

/// The sum of `host_reaped` over the `REMEM_IBV_STATS` lines in `stats`.
fn reaped_in(stats: &str) -> u64 {
    stats
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("host_reaped="))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// How many pings the pair that keeps running makes: more than a pipe (64 KiB) holds of
/// `-v` lines, so that both its programs block on their unread output mid-run.
const OTHER_PINGS: usize = 2000;

/// A client SIGKILLed mid-run: the host device's other members notice its death (pidfd)
/// and one of them sends a DREQ for its connection, so its server (`rping -s`) takes the
/// DISCONNECTED event (rping's "state 10") and exits within 5 s of the kill (measured and
/// printed). The client is killed between two pings (blocked in a `printf` on its full,
/// unread output pipe), so its server has nothing in flight and waits for the next ping:
/// only the DREQ can end it (without it, tried by dropping the orphaned connections
/// instead of closing them, the server waits for ever; a server whose RDMA READ was in
/// flight would instead see it fail after its retries, `cq completion failed status 12`).
/// Another rping pair on the device, connected before the kill and still mid-run after it
/// (one of its programs blocked on its full output pipe, unread until the killed client's
/// server has exited, the other waiting for it), then finishes its 2000 pings, every
/// one's data checked. A survivor reaped the dead member (`host_reaped` in the
/// survivors' `REMEM_IBV_STATS` lines).
///
/// The time is mostly the dying process's own exit: the kernel makes a pidfd readable
/// only once every descriptor of the process is released, and releasing the inotify
/// descriptor of its `io::host` watcher waits for the kernel's fsnotify mark reaper (an
/// SRCU grace period). Here 2–6 ms; killing clients mid-ping in a loop on a loaded 2-core
/// machine, the pidfd came from 1 ms to 0.75 s after the SIGKILL, the dying process seen
/// in `__flush_work` ← `fsnotify_destroy_group` ← `inotify_release` meanwhile.
#[test]
fn a_killed_rping_client_is_disconnected_and_another_pair_finishes() {
    if !have_timeout() {
        return;
    }
    let Some(rping) = tool("rping", "rdmacm-utils") else {
        return;
    };
    let _one = serial();
    let d = DropIn::new("host-rping-death");
    let stats = d.dir.join("stats");
    let is_ping = |l: &str| l.starts_with("ping data: ");

    // The pair that keeps running: its client's first 10 pings read, then nothing.
    let oport = free_port().to_string();
    let pings = OTHER_PINGS.to_string();
    let onotify = Notify::new(&d, "other");
    let mut oserver = Running::spawn(
        dropin_command(&d, &rping, &["-s", "-p", &oport, "-C", &pings, "-v"])
            .env(Notify::ENV, &onotify.path)
            .env("REMEM_IBV_STATS", &stats),
    );
    assert!(onotify.wait(&mut oserver), "{:?}", oserver.finish());
    let oargs = [
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &oport,
        "-C",
        &pings,
        "-v",
        "-V",
    ];
    let mut oclient =
        Running::spawn(dropin_command(&d, &rping, &oargs).env("REMEM_IBV_STATS", &stats));
    assert!(
        oclient.await_lines(is_ping, 10, LINE_LIMIT),
        "the other pair's client: {:?}",
        oclient.finish()
    );
    // The first of the two to fill its pipe blocks, and the other waits for it.
    let blocked = await_blocked_writing(&mut [&mut oserver, &mut oclient], LINE_LIMIT);
    assert!(
        blocked,
        "the other pair is not mid-run: {:?}",
        oserver.finish()
    );

    // The pair whose client dies: no `-v` on the server (its output is read only at the
    // end), the client outside `timeout` (the test kills it, or drops it: SIGTERM).
    let vport = free_port().to_string();
    let vnotify = Notify::new(&d, "victim");
    let mut vserver = Running::spawn(
        dropin_command(&d, &rping, &["-s", "-p", &vport])
            .env(Notify::ENV, &vnotify.path)
            .env("REMEM_IBV_STATS", &stats),
    );
    assert!(vnotify.wait(&mut vserver), "{:?}", vserver.finish());
    let mut victim = Running::spawn(d.command(&rping).args([
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &vport,
        "-C",
        "100000",
        "-v",
    ]));
    assert!(
        victim.await_lines(is_ping, 20, LINE_LIMIT),
        "the client to kill: {:?}",
        victim.finish()
    );
    let between_pings = await_blocked_writing(&mut [&mut victim], LINE_LIMIT);
    assert!(between_pings, "the client to kill: {:?}", victim.finish());
    victim.kill();
    let killed = Instant::now();
    let ended = vserver.await_end(Duration::from_secs(30));
    let took = vserver.ended.map(|t| t - killed);
    if !ended {
        vserver.terminate();
    }
    let vs = vserver.finish();
    eprintln!("the killed client's server ended {took:?} after the kill");
    assert!(
        ended,
        "the server did not exit within 30 s of the kill: {vs:?}"
    );
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(5)),
        "the server took {took:?} (over 5 s) to end after its client was killed: {vs:?}"
    );
    assert!(
        vs.out.contains("state 10"),
        "the server did not see the DISCONNECTED event (rping's state 10): {vs:?}"
    );
    let v = victim.finish();
    assert_eq!(v.code, None, "the client was not killed: {v:?}");

    // The other pair was mid-run throughout.
    assert!(
        !oserver.exited() && !oclient.exited(),
        "the other pair ended early"
    );
    // Both read at once: each program waits for the other, which may be blocked on its
    // full pipe.
    let (os, oc) = std::thread::scope(|t| {
        let s = t.spawn(|| oserver.finish());
        let c = oclient.finish();
        (s.join().unwrap(), c)
    });
    assert_both_ok("the other rping pair", &os, &oc);
    assert_pings(
        "the other server",
        &os.out,
        "server ping data: ",
        OTHER_PINGS,
    );
    assert_pings("the other client", &oc.out, "ping data: ", OTHER_PINGS);

    // The lines of rxe0 (127.0.0.1); the host's other devices (one per interface) are
    // listed and opened too.
    let stats: String = std::fs::read_to_string(&stats)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" device=rxe0 "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        stats.lines().count(),
        3,
        "a stats line from each survivor:\n{stats}"
    );
    // (Counted per dead member removed: short-lived members the test ran before, such as
    // `ibv_devinfo`, may be among them.)
    assert!(
        reaped_in(&stats) >= 1,
        "a survivor reaps the dead member:\n{stats}"
    );
}
