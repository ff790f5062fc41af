//! `remem perf --loopback` end to end: every test on two soft devices in one process, the
//! JSON rows and the perftest table, through the raw provider and the async API.

use std::process::Command;

fn perf(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_remem"))
        .arg("perf")
        .args(args)
        .env_remove("REMEM_DEVICE")
        .output()
        .expect("run remem perf");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
    std::fs::remove_dir_all(&dir).unwrap();
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
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port().to_string();
    drop((udp, tcp));
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
/// out-of-band connection.
fn free_ports() -> (u16, String) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port().to_string();
    (udp_port, tcp_port)
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
