//! `remem perf --loopback` end to end: every test on two soft devices in one process, the
//! JSON rows and the perftest table, through the raw provider and the async API.

use std::process::Command;

/// `remem perf ARGS`, with no device named in the environment.
fn remem_perf(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_remem"));
    cmd.arg("perf").args(args).env_remove("REMEM_DEVICE");
    cmd
}

/// Whether a run succeeded, and its stdout and stderr.
fn outcome(out: std::process::Output) -> (bool, String, String) {
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn perf(args: &[&str]) -> (bool, String, String) {
    outcome(remem_perf(args).output().expect("run remem perf"))
}

/// The one JSON row of a run (what `perf` or `perf_within` returned) that must have
/// succeeded.
fn the_row((ok, stdout, stderr): (bool, String, String)) -> serde_json::Value {
    assert!(ok, "{stderr}");
    serde_json::from_str(stdout.trim()).unwrap()
}

/// The JSON rows of a run that must succeed.
fn rows(args: &[&str]) -> Vec<serde_json::Value> {
    let (ok, stdout, stderr) = perf(args);
    assert!(ok, "remem perf {args:?} failed:\n{stderr}");
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn check_bw(row: &serde_json::Value, test: &str, size: u64, iterations: u64) {
    assert_eq!(row["test"], test, "{row}");
    assert_eq!(row["size"], size, "{row}");
    assert_eq!(row["iterations"], iterations, "{row}");
    let avg = row["bw_avg_mib_s"].as_f64().unwrap();
    let peak = row["bw_peak_mib_s"].as_f64().unwrap();
    let rate = row["msg_rate_mpps"].as_f64().unwrap();
    assert!(avg > 0.0 && peak >= avg, "{row}");
    // MiB = 2^20 bytes (perftest's MB): bandwidth = message rate × size.
    assert!(
        (avg - rate * 1e6 * size as f64 / 1048576.0).abs() <= avg * 1e-3 + 1e-3,
        "{row}"
    );
    // The same bandwidth in Gb/s.
    let gbit = row["bw_avg_gbit_s"].as_f64().unwrap();
    assert!(
        (gbit - avg * 1048576.0 * 8.0 / 1e9).abs() <= gbit * 1e-9,
        "{row}"
    );
}

fn check_lat(row: &serde_json::Value, test: &str, size: u64, iterations: u64) {
    assert_eq!(row["test"], test, "{row}");
    assert_eq!(row["size"], size, "{row}");
    assert_eq!(row["iterations"], iterations, "{row}");
    let l = &row["lat_us"];
    let f = |k: &str| l[k].as_f64().unwrap_or_else(|| panic!("no {k} in {row}"));
    assert!(f("min") > 0.0, "{row}");
    assert!(
        f("min") <= f("typical") && f("typical") <= f("max"),
        "{row}"
    );
    assert!(f("typical") <= f("p99") && f("p99") <= f("p999") && f("p999") <= f("max"));
    assert!(f("min") <= f("avg") && f("avg") <= f("max") && f("stdev") >= 0.0);
}

#[test]
fn every_bandwidth_test_runs_on_the_raw_provider() {
    for (test, size) in [
        ("write_bw", "4096"),
        ("read_bw", "4096"),
        ("send_bw", "4096"),
        ("atomic_bw", "8"),
    ] {
        let r = rows(&[
            "--loopback",
            test,
            "-s",
            size,
            "-n",
            "300",
            "-q",
            "2",
            "--json",
        ]);
        assert_eq!(r.len(), 1);
        check_bw(&r[0], test, size.parse().unwrap(), 600);
        assert_eq!(r[0]["api"], false);
    }
    // Compare-and-swap, inline sends, a small queue depth.
    let r = rows(&[
        "--loopback",
        "atomic_bw",
        "-A",
        "CMP_AND_SWAP",
        "-n",
        "100",
        "--json",
    ]);
    check_bw(&r[0], "atomic_bw", 8, 100);
    let r = rows(&[
        "--loopback",
        "write_bw",
        "-s",
        "64",
        "-I",
        "64",
        "-t",
        "4",
        "-n",
        "500",
        "--json",
    ]);
    check_bw(&r[0], "write_bw", 64, 500);
}

#[test]
fn every_latency_test_runs_on_the_raw_provider() {
    for test in ["write_lat", "read_lat", "send_lat", "atomic_lat"] {
        let size = if test == "atomic_lat" { 8 } else { 100 };
        let r = rows(&[
            "--loopback",
            test,
            "-s",
            &size.to_string(),
            "-n",
            "200",
            "--json",
        ]);
        assert_eq!(r.len(), 1);
        check_lat(&r[0], test, size, 200);
    }
    // Larger than the MTU: the ping-pong waits for the last byte of the last packet.
    let r = rows(&[
        "--loopback",
        "write_lat",
        "-s",
        "10000",
        "-n",
        "50",
        "--json",
    ]);
    check_lat(&r[0], "write_lat", 10000, 50);
}

#[test]
fn rdma_cm_connects_the_qps() {
    // -R: the QPs are connected through the soft devices' RDMA CM (REQ/REP/RTU on QP 1).
    for (test, qps) in [("write_bw", "2"), ("send_bw", "2"), ("read_lat", "1")] {
        let r = rows(&[
            "--loopback",
            test,
            "-R",
            "-q",
            qps,
            "-s",
            "1024",
            "-n",
            "100",
            "--json",
        ]);
        assert_eq!(r.len(), 1, "{test}");
        if test.ends_with("_bw") {
            check_bw(&r[0], test, 1024, 100 * qps.parse::<u64>().unwrap());
        } else {
            check_lat(&r[0], test, 1024, 100);
        }
    }
}

#[test]
fn the_api_runs_every_test() {
    for (test, size) in [
        ("write_bw", 4096),
        ("read_bw", 4096),
        ("send_bw", 4096),
        ("atomic_bw", 8),
    ] {
        let r = rows(&[
            "--loopback",
            "--api",
            test,
            "-s",
            &size.to_string(),
            "-n",
            "200",
            "--json",
        ]);
        check_bw(&r[0], test, size, 200);
        assert_eq!(r[0]["api"], true);
    }
    for test in ["write_lat", "read_lat", "send_lat", "atomic_lat"] {
        let r = rows(&[
            "--loopback",
            "--api",
            test,
            "-s",
            "8",
            "-n",
            "100",
            "--json",
        ]);
        check_lat(&r[0], test, 8, 100);
    }
}

#[test]
fn duration_mode_and_the_table() {
    let (ok, stdout, stderr) = perf(&["--loopback", "write_bw", "-s", "1024", "-D", "1"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("RDMA_Write BW Test"), "{stdout}");
    assert!(
        stdout.contains(
            "#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        ),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("1024 "))
        .unwrap_or_else(|| panic!("no result row in:\n{stdout}"));
    let iterations: u64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(iterations > 0, "{row}");
    let (ok, stdout, stderr) = perf(&["--loopback", "read_lat", "-n", "50", "--report_gbits"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("t_typical[usec]"), "{stdout}");
    assert!(stdout.contains("99.9% percentile[usec]"), "{stdout}");
}

#[test]
fn all_sizes_and_a_plot() {
    let dir = std::env::temp_dir().join(format!("remem-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("write_bw.svg");
    let r = rows(&[
        "--loopback",
        "write_bw",
        "-a",
        "-n",
        "4",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let sizes: Vec<u64> = r.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (1..=23).map(|p| 1 << p).collect();
    assert_eq!(sizes, want);
    let drawing = std::fs::read_to_string(&svg).unwrap();
    assert!(drawing.contains("<svg") && drawing.contains("write_bw"));
    // The title carries the run's parameters; the axes their units.
    for want in [
        "raw provider",
        "soft@127.0.0.2:",
        "1 QP",
        "4 iterations per size",
        "tx depth 128",
        "MiB/s = 2^20 B/s",
        "message rate (Mpps, log scale)",
    ] {
        assert!(drawing.contains(want), "{want:?} missing from the plot");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn verified_bandwidth_runs_under_injected_loss() {
    // Both soft devices drop 2% of the packets they send: go-back-N resends, and every
    // READ, and the last WRITE of every slot, is checked byte for byte.
    for (test, size, qps) in [
        ("write_bw", "4100", "2"),
        ("read_bw", "4100", "2"),
        ("write_bw", "64", "1"),
    ] {
        let out = remem_perf(&[
            "--loopback",
            test,
            "-s",
            size,
            "-q",
            qps,
            "-n",
            "300",
            "-t",
            "16",
            "--verify",
            "--json",
        ])
        .env("REMEM_SOFT_FAULTS", "loss=0.02,seed=5")
        .output()
        .expect("run remem perf");
        let row = the_row(outcome(out));
        assert_eq!(row["verified"], true, "{row}");
        check_bw(
            &row,
            test,
            size.parse().unwrap(),
            300 * qps.parse::<u64>().unwrap(),
        );
    }
}

#[test]
fn bad_arguments_fail_with_a_message() {
    for args in [
        &["--loopback", "write_bw", "-s", "0"][..],
        &["--loopback", "atomic_bw", "-s", "16"],
        &["--loopback", "write_lat", "-D", "1"],
        &["--loopback", "write_bw", "--plot", "x.svg"],
        &["--loopback", "nope_bw"],
        &["--loopback", "--perftest", "read_bw", "-D", "1"],
        &["--loopback", "--perftest", "--api", "read_bw"],
        // As perftest refuses them.
        &["--loopback", "write_bw", "-A", "CMP_AND_SWAP"],
        &["--loopback", "write_lat", "-b"],
        &["--loopback", "write_bw", "-a", "-D", "1"],
        &["--loopback", "write_bw", "-c", "UD"],
        &["--loopback", "read_bw", "-c", "UC"],
        &["--loopback", "atomic_bw", "-c", "UC"],
        &["--loopback", "--api", "send_bw", "-c", "UC"],
        &["--loopback", "write_bw", "-x", "1"],
        // -R is for the raw provider's RC QPs.
        &["--loopback", "write_bw", "-R", "-c", "UC"],
        &["--loopback", "write_bw", "-R", "--api"],
        // --verify checks write_bw and read_bw of one size of 8 bytes or more, raw RC.
        &["--loopback", "write_lat", "--verify"],
        &["--loopback", "send_bw", "--verify"],
        &["--loopback", "write_bw", "--verify", "-s", "4"],
        &["--loopback", "write_bw", "--verify", "-a"],
        &["--loopback", "write_bw", "--verify", "--api"],
        &["--loopback", "write_bw", "--verify", "-b"],
        &["--loopback", "write_bw", "--verify", "-c", "UC"],
        &["--loopback", "--perftest", "write_bw", "--verify"],
    ] {
        let (ok, _, stderr) = perf(args);
        assert!(!ok, "{args:?} succeeded");
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
    }
}

#[test]
fn server_and_client_in_two_processes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // Free ports: UDP for the soft devices (the server's and the client's share it, on
    // two addresses), TCP for the control connection.
    let (udp_port, tcp_port) = free_ports();
    let mut server = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["perf", "send_bw", "-p", &tcp_port, "-d"])
        .arg(format!("soft@127.0.0.1:{udp_port}"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The server says when it listens.
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("waiting for a client"), "{first}");
    let client = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args([
            "perf",
            "send_bw",
            "127.0.0.1",
            "-p",
            &tcp_port,
            "-n",
            "300",
            "--json",
            "-d",
        ])
        .arg(format!("soft@127.0.0.2:{udp_port}"))
        .output()
        .unwrap();
    if !client.status.success() {
        // A server whose client failed would wait for another forever.
        let _ = server.kill();
    }
    let served = server.wait().unwrap();
    assert!(
        client.status.success(),
        "{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(served.success());
    let row: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&client.stdout).trim()).unwrap();
    check_bw(&row, "send_bw", 65536, 300);
}

#[test]
fn every_test_runs_over_perftests_exchange() {
    for (test, size) in [
        ("write_bw", 4096),
        ("read_bw", 4096),
        ("send_bw", 4096),
        ("atomic_bw", 8),
        ("write_lat", 100),
        ("read_lat", 100),
        ("send_lat", 100),
        ("atomic_lat", 8),
    ] {
        let r = rows(&[
            "--loopback",
            "--perftest",
            test,
            "-s",
            &size.to_string(),
            "-n",
            "200",
            "--json",
        ]);
        assert_eq!(r.len(), 1, "{test}: {r:?}");
        if test.ends_with("_bw") {
            check_bw(&r[0], test, size, 200);
        } else {
            check_lat(&r[0], test, size, 200);
        }
    }
    // Two QPs (a handshake each), and every size of send_bw (handshakes around each).
    let r = rows(&[
        "--loopback",
        "--perftest",
        "read_bw",
        "-q",
        "2",
        "-n",
        "100",
        "--json",
    ]);
    check_bw(&r[0], "read_bw", 65536, 200);
    let r = rows(&[
        "--loopback",
        "--perftest",
        "send_bw",
        "-a",
        "-n",
        "20",
        "--json",
    ]);
    assert_eq!(r.len(), 23);
    for (i, row) in r.iter().enumerate() {
        check_bw(row, "send_bw", 2 << i, 20);
    }
}

/// Free ports: UDP for two soft devices (on 127.0.0.1 and 127.0.0.2), TCP for the
/// out-of-band connection. Both are chosen below the kernel's ephemeral range (32768 and
/// up), in a window of this process's own (`5000 + (pid % 250) * 20`): a `bind(0)` port
/// is ephemeral, and another test's socket could take it before the server binds it.
fn free_ports() -> (u16, String) {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 5_000 + (std::process::id() % 250) as u16 * 20;
    for _ in 0..200 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 20;
        let free = std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.2", port)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free {
            return (port, port.to_string());
        }
    }
    panic!("no free port in {base}..{}", base + 20)
}

#[test]
fn a_server_recognises_a_perftest_client_and_prints_its_result() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let (udp_port, tcp_port) = free_ports();
    // The server has no --perftest: the client's first message tells.
    let mut server = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["perf", "write_bw", "-s", "8192", "-n", "250", "--json"])
        .args(["-p", &tcp_port, "-d"])
        .arg(format!("soft@127.0.0.1:{udp_port}"))
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("waiting for a client"), "{first}");
    let client = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["perf", "--perftest", "write_bw", "127.0.0.1", "-s", "8192"])
        .args(["-n", "250", "--json", "-p", &tcp_port, "-d"])
        .arg(format!("soft@127.0.0.2:{udp_port}"))
        .output()
        .unwrap();
    if !client.status.success() {
        let _ = server.kill();
    }
    let served = server.wait_with_output().unwrap();
    assert!(
        client.status.success(),
        "{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(served.status.success());
    let mine: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&client.stdout).trim()).unwrap();
    check_bw(&mine, "write_bw", 8192, 250);
    // perftest's server prints the client's result, which came in the report exchange.
    let theirs: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&served.stdout).trim()).unwrap();
    check_bw(&theirs, "write_bw", 8192, 250);
    let avg = |r: &serde_json::Value| r["bw_avg_mib_s"].as_f64().unwrap();
    assert!((avg(&mine) - avg(&theirs)).abs() <= avg(&mine) * 1e-9);
}

// ---------------------------------------------------------------------------------------
// What a new user meets: timeouts, foreign peers, device checks, perftest's -b and -c UD,
// flags that do not apply, units, the plot's title.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

/// What `wait` (a wait for process `pid`, run on a thread of its own) returned, or `None`
/// if it took longer than `limit`: then the process is killed.
fn wait_within<T: Send + 'static>(
    pid: u32,
    limit: Duration,
    wait: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(wait());
    });
    let got = rx.recv_timeout(limit).ok();
    if got.is_none() {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    got
}

/// Runs `remem perf ARGS`, killed (and the test failed) if it outlives `limit`.
fn perf_within(args: &[&str], limit: Duration) -> (bool, String, String) {
    let child = remem_perf(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run remem perf");
    let out = wait_within(child.id(), limit, move || child.wait_with_output())
        .unwrap_or_else(|| panic!("remem perf {args:?} still ran after {limit:?}"));
    outcome(out.expect("wait for remem perf"))
}

/// A `remem perf` server whose stderr lines come through a channel.
struct Server {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = remem_perf(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start remem perf");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Server { child, lines }
    }

    /// Waits (at most 30 s) for a stderr line containing every one of `want`; returns it.
    fn line(&mut self, want: &[&str]) -> String {
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if want.iter().all(|w| l.contains(w)) => return l,
                Ok(l) => seen.push(l),
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("the server never said {want:?}; it said {seen:?}");
                }
            }
        }
    }

    /// Waits (at most 60 s) for the server to exit; its success and the rest of stderr.
    fn finish(self) -> (bool, String) {
        let Server { mut child, lines } = self;
        let status = wait_within(child.id(), Duration::from_secs(60), move || child.wait())
            .expect("the server did not exit")
            .unwrap();
        // The process has exited: its stderr ends, and the reader thread with it.
        let rest: Vec<String> = lines.iter().collect();
        (status.success(), rest.join("\n"))
    }
}

/// Where a `remem perf` server and its client meet: a free TCP port, and soft devices on
/// 127.0.0.1 (the server's) and 127.0.0.2 (the client's) that share a free UDP port.
struct Meeting {
    tcp_port: String,
    server_dev: String,
    client_dev: String,
}

impl Meeting {
    fn new() -> Meeting {
        let (udp_port, tcp_port) = free_ports();
        Meeting {
            tcp_port,
            server_dev: format!("soft@127.0.0.1:{udp_port}"),
            client_dev: format!("soft@127.0.0.2:{udp_port}"),
        }
    }

    /// Starts a server of `args` (then `-p` and `-d` naming the meeting's port and the
    /// server's device), once it says it is waiting for a client.
    fn server(&self, args: &[&str]) -> Server {
        let mut all = args.to_vec();
        all.extend(["-p", &self.tcp_port, "-d", &self.server_dev]);
        let mut server = Server::start(&all);
        server.line(&["waiting for a client"]);
        server
    }

    /// Runs a client of `args` (then `-p` and `-d` naming the meeting's port and the
    /// client's device) within `limit`.
    fn client(&self, args: &[&str], limit: Duration) -> (bool, String, String) {
        let mut all = args.to_vec();
        all.extend(["-p", &self.tcp_port, "-d", &self.client_dev]);
        perf_within(&all, limit)
    }
}

#[test]
fn a_server_skips_silent_and_foreign_peers_then_serves_a_client() {
    let meeting = Meeting::new();
    let mut server = meeting.server(&["write_bw", "--ctrl-timeout", "0.5"]);
    let addr = format!("127.0.0.1:{}", meeting.tcp_port);
    // A peer that connects and says nothing.
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    let l = server.line(&["said nothing for 0.5 s", "waiting for another client"]);
    assert!(l.contains("not a remem perf"), "{l}");
    drop(silent);
    // A peer that speaks HTTP.
    let mut http = std::net::TcpStream::connect(&addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let l = server.line(&["not a remem perf peer", "waiting for another client"]);
    assert!(!l.contains("too large"), "{l}");
    drop(http);
    // A peer that closes at once.
    drop(std::net::TcpStream::connect(&addr).unwrap());
    server.line(&["without a word", "waiting for another client"]);
    // Then a real client runs, and the server exits as perftest's does.
    let row = the_row(meeting.client(
        &["write_bw", "127.0.0.1", "-n", "200", "-s", "4096", "--json"],
        Duration::from_secs(60),
    ));
    check_bw(&row, "write_bw", 4096, 200);
    let (served, rest) = server.finish();
    assert!(served, "{rest}");
}

#[test]
fn a_client_gives_up_on_a_server_that_never_answers() {
    let (udp_port, _) = free_ports();
    let dev = format!("soft@127.0.0.2:{udp_port}");
    // The kernel completes the connection; nobody ever answers.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port().to_string();
    // A write_bw client (`test`: the name, or --perftest and the name) of that server.
    let client = |test: &[&str]| {
        let mut args = test.to_vec();
        args.extend([
            "127.0.0.1",
            "-p",
            &port,
            "--ctrl-timeout",
            "0.5",
            "-d",
            &dev,
        ]);
        perf_within(&args, Duration::from_secs(30))
    };
    let started = std::time::Instant::now();
    let (ok, _, stderr) = client(&["write_bw"]);
    assert!(!ok);
    assert!(stderr.contains("said nothing for 0.5 s"), "{stderr}");
    assert!(stderr.contains("remem perf server"), "{stderr}");
    let (ok, _, stderr) = client(&["--perftest", "write_bw"]);
    assert!(!ok);
    assert!(
        stderr.contains("no answer from the perftest peer in 0.5 s"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    drop(mute);
}

/// Serves one connection on a free port with `answer` (after reading what the client
/// sends first); returns the port.
fn foreign_server(answer: &'static [u8]) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
            let _ = s.write_all(answer);
            // Hold the connection until the client leaves.
            let _ = s.read(&mut b);
        }
    });
    port
}

#[test]
fn a_client_names_a_foreign_server() {
    let (udp_port, _) = free_ports();
    let dev = format!("soft@127.0.0.2:{udp_port}");
    for (answer, want) in [
        (
            &b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"[..],
            "not a remem perf peer",
        ),
        (&b"6.06\0\0\0\0\0\0\0\0\0\0\0\0"[..], "--perftest"),
    ] {
        let port = foreign_server(answer);
        let (ok, _, stderr) = perf_within(
            &["write_bw", "127.0.0.1", "-p", &port, "-d", &dev],
            Duration::from_secs(30),
        );
        assert!(!ok);
        assert!(stderr.contains(want), "{stderr}");
        assert!(!stderr.contains("too large"), "{stderr}");
    }
}

#[test]
fn a_server_checks_its_device_and_flags_before_waiting() {
    let (udp_port, tcp_port) = free_ports();
    let dev = format!("soft@127.0.0.1:{udp_port}");
    for (args, want) in [
        (vec!["-d", "no-such-device"], "no-such-device"),
        (vec!["-d", &dev, "-x", "200"], "GID index 200"),
        (vec!["-d", "soft@300.1.2.3"], "expected soft@<ip>[:<port>]"),
        (vec!["-d", &dev, "-c", "UD"], "-c UD"),
        (vec!["-d", &dev, "-A", "CMP_AND_SWAP"], "-A"),
    ] {
        let mut all = vec!["write_bw", "-p", &tcp_port];
        all.extend(&args);
        let (ok, _, stderr) = perf_within(&all, Duration::from_secs(30));
        assert!(!ok, "{all:?} served");
        assert!(stderr.contains(want), "{all:?}: {stderr}");
        assert!(
            !stderr.contains("waiting for a client"),
            "{all:?}: {stderr}"
        );
    }
}

#[test]
fn soft_devices_without_a_port_use_the_rocev2_port() {
    // Addresses of their own, so that port 4791 is free on them.
    let (_, tcp_port) = free_ports();
    let mut server = Server::start(&["send_bw", "-p", &tcp_port, "-d", "soft@127.0.7.91"]);
    server.line(&["waiting for a client", "soft@127.0.7.91:4791"]);
    let row = the_row(perf_within(
        &[
            "send_bw",
            "127.0.0.1",
            "-p",
            &tcp_port,
            "-n",
            "100",
            "-s",
            "1024",
            "--json",
            "-d",
            "soft@127.0.7.92",
        ],
        Duration::from_secs(60),
    ));
    check_bw(&row, "send_bw", 1024, 100);
    assert!(server.finish().0);
}

#[test]
fn a_client_asking_for_another_test_is_refused() {
    let meeting = Meeting::new();
    let server = meeting.server(&["write_bw"]);
    let (ok, _, stderr) = meeting.client(&["read_bw", "127.0.0.1"], Duration::from_secs(30));
    assert!(!ok);
    assert!(
        stderr.contains("this server runs write_bw, the client asked for read_bw"),
        "{stderr}"
    );
    let (served, rest) = server.finish();
    assert!(!served);
    assert!(rest.contains("the client asked for read_bw"), "{rest}");
}

#[test]
fn a_servers_own_flags_that_the_client_overrides_are_named() {
    let meeting = Meeting::new();
    let mut server = meeting.server(&["write_bw", "-s", "4096", "-q", "2"]);
    let (ok, _, stderr) = meeting.client(
        &["write_bw", "127.0.0.1", "-n", "50"],
        Duration::from_secs(60),
    );
    assert!(ok, "{stderr}");
    server.line(&["warning", "-s 4096", "65536 bytes"]);
    server.line(&["warning", "-q 2", "-q 1"]);
    assert!(server.finish().0);
}

#[test]
fn bidirectional_runs_as_perftest() {
    for perftest in [false, true] {
        for (test, size) in [
            ("write_bw", "4096"),
            ("read_bw", "4096"),
            ("send_bw", "4096"),
            ("atomic_bw", "8"),
        ] {
            let mut args = vec![
                "--loopback",
                test,
                "-b",
                "-s",
                size,
                "-n",
                "200",
                "-q",
                "2",
                "--json",
            ];
            if perftest {
                args.push("--perftest");
            }
            let r = rows(&args);
            assert_eq!(r.len(), 1, "{args:?}");
            // The sum of both directions; perftest prints its own side's iterations.
            check_bw(&r[0], test, size.parse().unwrap(), 400);
            assert_eq!(r[0]["bidirectional"], true);
        }
        // Every size: perftest's handshakes around each size's run.
        for test in ["write_bw", "send_bw"] {
            let mut args = vec!["--loopback", test, "-b", "-a", "-n", "8", "--json"];
            if perftest {
                args.push("--perftest");
            }
            let r = rows(&args);
            assert_eq!(r.len(), 23, "{args:?}");
            for (i, row) in r.iter().enumerate() {
                check_bw(row, test, 2 << i, 8);
            }
        }
    }
    // The table says so.
    let (ok, stdout, stderr) = perf(&["--loopback", "write_bw", "-b", "-n", "100"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("RDMA_Write Bidirectional BW Test"),
        "{stdout}"
    );
}

#[test]
fn ud_queue_pairs_run_send_tests() {
    for perftest in [false, true] {
        let extra: &[&str] = if perftest { &["--perftest"] } else { &[] };
        let with =
            |a: &[&str]| -> Vec<String> { a.iter().chain(extra).map(|s| s.to_string()).collect() };
        let run = |a: &[&str]| {
            let a = with(a);
            let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
            perf_within(&a, Duration::from_secs(120))
        };
        // A message above the path MTU becomes the MTU (4096 on these soft devices), as
        // perftest does, with a note.
        let (ok, stdout, stderr) = run(&[
            "--loopback",
            "send_bw",
            "-c",
            "UD",
            "-n",
            "300",
            "-q",
            "2",
            "--json",
        ]);
        assert!(ok, "{stderr}");
        assert!(stderr.contains("above the UD path MTU"), "{stderr}");
        let row: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        check_bw(&row, "send_bw", 4096, 600);
        assert_eq!(row["connection"], "UD");
        // -a stops at the MTU.
        let (ok, stdout, stderr) = run(&[
            "--loopback",
            "send_bw",
            "-c",
            "UD",
            "-a",
            "-n",
            "20",
            "--json",
        ]);
        assert!(ok, "{stderr}");
        let sizes: Vec<u64> = stdout
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["size"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(sizes, (1..=12).map(|p| 1u64 << p).collect::<Vec<_>>());
        // Both ways, and latency.
        let row = the_row(run(&[
            "--loopback",
            "send_bw",
            "-c",
            "UD",
            "-b",
            "-s",
            "1024",
            "-n",
            "200",
            "--json",
        ]));
        check_bw(&row, "send_bw", 1024, 200);
        let row = the_row(run(&[
            "--loopback",
            "send_lat",
            "-c",
            "UD",
            "-s",
            "512",
            "-n",
            "200",
            "--json",
        ]));
        check_lat(&row, "send_lat", 512, 200);
    }
}

#[test]
fn uc_queue_pairs_run_write_and_send_tests() {
    for perftest in [false, true] {
        let extra: &[&str] = if perftest { &["--perftest"] } else { &[] };
        let run = |a: &[&str]| {
            let a: Vec<&str> = a.iter().chain(extra).copied().collect();
            perf_within(&a, Duration::from_secs(120))
        };
        // Messages of any size (not cut to the MTU as on UD), several QPs, both ways.
        for test in ["write_bw", "send_bw"] {
            let (ok, stdout, stderr) = run(&[
                "--loopback",
                test,
                "-c",
                "UC",
                "-s",
                "65536",
                "-n",
                "200",
                "-q",
                "2",
                "--json",
            ]);
            assert!(ok, "{test}: {stderr}");
            assert!(!stderr.contains("MTU"), "{test}: {stderr}");
            let row: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            // A UC sender is not held back by acknowledgements: a burst can overrun the
            // receiving socket, and what is lost is not resent. The row is the sender's;
            // a loss is named, and does not stall the run.
            if stderr.contains("arrived") {
                assert!(
                    stderr.contains("UC does not retransmit"),
                    "{test}: {stderr}"
                );
            }
            check_bw(&row, test, 65536, 400);
            assert_eq!(row["connection"], "UC");
            let row = the_row(run(&[
                "--loopback",
                test,
                "-c",
                "UC",
                "-b",
                "-s",
                "4096",
                "-n",
                "200",
                "--json",
            ]));
            check_bw(&row, test, 4096, 200);
            assert_eq!(row["bidirectional"], true);
        }
        // Every size.
        let r = rows(
            &[
                "--loopback",
                "write_bw",
                "-c",
                "UC",
                "-a",
                "-n",
                "8",
                "--json",
            ]
            .iter()
            .chain(extra)
            .copied()
            .collect::<Vec<_>>(),
        );
        assert_eq!(r.len(), 23);
        for (i, row) in r.iter().enumerate() {
            check_bw(row, "write_bw", 2 << i, 8);
        }
        // Ping-pongs.
        for test in ["write_lat", "send_lat"] {
            let row = the_row(run(&[
                "--loopback",
                test,
                "-c",
                "UC",
                "-s",
                "3000",
                "-n",
                "200",
                "--json",
            ]));
            check_lat(&row, test, 3000, 200);
            assert_eq!(row["connection"], "UC");
        }
    }
    // READ and atomics are refused as perftest refuses them.
    for test in ["read_bw", "read_lat", "atomic_bw", "atomic_lat"] {
        let (ok, _, stderr) = perf(&["--loopback", test, "-c", "UC"]);
        assert!(!ok, "{test}");
        assert!(
            stderr.contains("UC connection not possible in READ/ATOMIC verbs"),
            "{test}: {stderr}"
        );
    }
}

#[test]
fn flags_that_change_nothing_are_named() {
    let (ok, _, stderr) = perf(&[
        "--loopback",
        "write_bw",
        "-a",
        "-s",
        "4096",
        "-n",
        "2",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("warning: -s 4096 is ignored"), "{stderr}");
    let (ok, _, stderr) = perf(&["--loopback", "write_bw", "-n", "5", "-D", "1", "--json"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("warning: -n 5 is ignored"), "{stderr}");
}

#[test]
fn the_table_states_its_unit() {
    let (ok, stdout, stderr) = perf(&["--loopback", "write_bw", "-n", "100"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("MB/sec = 2^20 bytes per second"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = perf(&["--loopback", "write_bw", "-n", "100", "--report_gbits"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Gb/sec = 10^9 bits per second"), "{stdout}");
}

/// A run that fails on the wire says what the device counted (retries, NAKs, drops), as
/// the first clue to why (issue 16: `-q 4 write_bw` against a TCG guest's rxe ended in
/// RETRY_EXC_ERR with nothing else to go on).
#[test]
fn a_failed_run_names_the_devices_counters() {
    let out = remem_perf(&["--loopback", "write_bw", "-s", "4096", "-n", "100"])
        // Both soft NICs lose nearly every packet they send: the requester gives up.
        .env("REMEM_SOFT_FAULTS", "loss=0.8,seed=3")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("RetryExcErr"), "{stderr}");
    assert!(stderr.contains("device counters:"), "{stderr}");
    assert!(stderr.contains("retry_exceeded_err=1"), "{stderr}");
}

/// Over perftest's exchange nothing names the test; a READ or atomic tool gives itself
/// away by accepting more than one outstanding READ, and a side running another test
/// says so and closes the connection instead of leaving its peer waiting.
#[test]
fn a_perftest_peer_running_another_test_is_named() {
    let meeting = Meeting::new();
    let server = meeting.server(&["write_bw", "-n", "50"]);
    let (ok, _, stderr) = meeting.client(
        &["--perftest", "read_bw", "127.0.0.1", "-n", "50"],
        Duration::from_secs(60),
    );
    assert!(!ok, "{stderr}");
    let (served, rest) = server.finish();
    assert!(!served);
    assert!(rest.contains("runs a READ or atomic test"), "{rest}");
}

// ---------------------------------------------------------------------------------------
// A sweep keeps what it measured: a size that fails, Ctrl-C; the plot's path checked
// first; what a verified run and a UD run say; REMEM_DEVICE with --loopback.

/// A `remem perf` run whose stdout lines come through a channel as they are printed.
struct Streaming {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    /// The lines taken so far.
    seen: Vec<String>,
}

impl Streaming {
    fn start(cmd: &mut Command) -> Streaming {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start remem perf");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Streaming {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 60 s) for a stdout line that `want` accepts.
    fn until(&mut self, want: impl Fn(&str) -> bool) {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(l) => {
                    let done = want(&l);
                    self.seen.push(l);
                    if done {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no such line; stdout so far: {:?}", self.seen);
                }
            }
        }
    }

    /// Waits (at most 60 s) for the process to exit: its status, all of stdout, stderr.
    fn finish(self) -> (std::process::ExitStatus, Vec<String>, String) {
        let Streaming {
            mut child,
            lines,
            mut seen,
        } = self;
        let mut stderr = child.stderr.take().unwrap();
        let status = wait_within(child.id(), Duration::from_secs(60), move || {
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            (child.wait(), err)
        })
        .expect("remem perf did not exit");
        seen.extend(lines.iter());
        (status.0.unwrap(), seen, status.1)
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-perf-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A size of `-a` that fails (the server dies after the first size): the rows of the
/// sizes done stay printed, the plot draws them, a line says so, and the run fails with
/// the error.
#[test]
fn a_sweep_whose_size_fails_keeps_the_sizes_done() {
    let dir = temp_dir("failed");
    let svg = dir.join("write_lat.svg");
    let meeting = Meeting::new();
    let mut server = meeting.server(&["write_lat", "-n", "300"]);
    let mut client = Streaming::start(&mut remem_perf(&[
        "write_lat",
        "127.0.0.1",
        "-a",
        "-n",
        "300",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
        "-p",
        &meeting.tcp_port,
        "-d",
        &meeting.client_dev,
    ]));
    client.until(|l| l.contains("\"size\":2,"));
    // The server dies in the middle of the sweep.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let (status, stdout, stderr) = client.finish();
    assert!(!status.success(), "{stderr}");
    let sizes: Vec<u64> = stdout
        .iter()
        .map(|l| {
            let row: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            check_lat(&row, "write_lat", row["size"].as_u64().unwrap(), 300);
            row["size"].as_u64().unwrap()
        })
        .collect();
    assert!(!sizes.is_empty() && sizes.len() < 23, "{sizes:?}");
    assert_eq!(
        sizes,
        (1..=sizes.len()).map(|p| 1u64 << p).collect::<Vec<_>>()
    );
    let said = format!("stopped after {} size", sizes.len());
    assert!(stderr.contains(&said), "{stderr}");
    assert!(stderr.contains("drawn in"), "{stderr}");
    let drawing = std::fs::read_to_string(&svg).expect("the plot of the sizes done");
    assert!(drawing.contains("write_lat") && drawing.contains("latency (µs, log scale)"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ctrl-C during `-a` (SIGINT once the first row is out): the table is closed, the plot
/// of the sizes done is drawn, a line says so, and the exit status is 130.
#[test]
fn ctrl_c_during_a_sweep_keeps_the_sizes_done() {
    let dir = temp_dir("ctrl-c");
    let svg = dir.join("write_lat.svg");
    let mut run = Streaming::start(&mut remem_perf(&[
        "--loopback",
        "write_lat",
        "-a",
        "-n",
        "300",
        "--plot",
        svg.to_str().unwrap(),
    ]));
    // The first result row (2 bytes) is out.
    run.until(|l| l.split_whitespace().next() == Some("2"));
    let sent = Command::new("kill")
        .args(["-INT", &run.child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status.code(), Some(130), "{status:?}: {stderr}");
    let rows: Vec<&String> = stdout
        .iter()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })
        .collect();
    assert!(!rows.is_empty() && rows.len() < 23, "{stdout:?}");
    // The table is closed after its rows.
    assert!(stdout.last().unwrap().starts_with("-----"), "{stdout:?}");
    assert!(stderr.contains("interrupted (Ctrl-C) after"), "{stderr}");
    let drawing = std::fs::read_to_string(&svg).expect("the plot of the sizes done");
    assert!(drawing.contains("write_lat"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--plot`'s file is checked before the sweep: a folder that does not exist, or a
/// folder given as the file, fails at once, with nothing measured.
#[test]
fn the_plot_path_is_checked_before_the_sweep() {
    let dir = temp_dir("plot-path");
    let missing = dir.join("no-such-folder").join("x.svg");
    for (path, says) in [
        (missing.to_str().unwrap(), "its folder"),
        (dir.to_str().unwrap(), "a folder, not a file"),
    ] {
        let (ok, stdout, stderr) =
            perf(&["--loopback", "write_bw", "-a", "-n", "4", "--plot", path]);
        assert!(!ok);
        assert!(stdout.is_empty(), "measured before failing: {stdout}");
        assert!(
            stderr.contains(&format!("--plot {path}: {says}")),
            "{stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A verified run says in its table that it verified (and `--json` rows carry
/// `"verified": true`).
#[test]
fn a_verified_run_says_so() {
    for (test, checked) in [
        (
            "write_bw",
            "every byte of each slot's last WRITE matched its pattern",
        ),
        ("read_bw", "every byte of every READ matched its pattern"),
    ] {
        let (ok, stdout, stderr) =
            perf(&["--loopback", test, "-s", "4096", "-n", "200", "--verify"]);
        assert!(ok, "{stderr}");
        assert!(
            stdout.contains(&format!("Data verified   : {checked}")),
            "{stdout}"
        );
    }
    let (ok, stdout, _) = perf(&["--loopback", "write_bw", "-s", "4096", "-n", "200"]);
    assert!(ok);
    assert!(!stdout.contains("verified"), "{stdout}");
}

/// A UD SEND run says in `--json` how many messages arrived (and how many were lost).
#[test]
fn ud_loss_is_in_the_json() {
    for bidir in [false, true] {
        let mut args = vec![
            "--loopback",
            "send_bw",
            "-c",
            "UD",
            "-s",
            "1024",
            "-n",
            "300",
            "--json",
        ];
        if bidir {
            args.push("-b");
        }
        let out = remem_perf(&args)
            // Both soft devices lose a fifth of what they send: UD resends nothing.
            .env("REMEM_SOFT_FAULTS", "loss=0.2,seed=7")
            .output()
            .unwrap();
        let row = the_row(outcome(out));
        let sent = row["messages_sent"].as_u64().unwrap();
        let received = row["messages_received"].as_u64().unwrap();
        let lost = row["messages_lost"].as_u64().unwrap();
        assert_eq!(sent, if bidir { 600 } else { 300 }, "{row}");
        assert_eq!(received + lost, sent, "{row}");
        assert!(lost > 0 && received > 0, "{row}");
    }
    // RC resends: no such fields.
    let row = the_row(perf(&[
        "--loopback",
        "send_bw",
        "-s",
        "1024",
        "-n",
        "100",
        "--json",
    ]));
    assert!(row.get("messages_lost").is_none(), "{row}");
}

/// `--loopback` picks its own devices: a device named in REMEM_DEVICE is refused with a
/// word, not silently ignored.
#[test]
fn remem_device_with_loopback_is_refused() {
    let out = remem_perf(&["--loopback", "write_bw", "-n", "10"])
        .env("REMEM_DEVICE", "soft@127.0.0.1:0")
        .output()
        .unwrap();
    let (ok, stdout, stderr) = outcome(out);
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("--loopback picks its own soft devices")
            && stderr.contains("REMEM_DEVICE=soft@127.0.0.1:0 would be ignored"),
        "{stderr}"
    );
}
