//! Two soft devices in two processes (this test and a child it spawns), talking RoCEv2
//! over UDP on loopback: SEND with immediate, WRITE, READ, compare-and-swap, fetch-and-add.

use remem_soft::SoftContext;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::Arc;

const CHILD_ENV: &str = "REMEM_TWO_PROCESS_CHILD_PORT";

/// The server side; runs only in the child process (ignored otherwise).
#[test]
#[ignore = "runs in the child process of two_processes"]
fn child_server() {
    let port: u16 = std::env::var(CHILD_ENV)
        .expect("only run as a child")
        .parse()
        .unwrap();
    let ctx = SoftContext::bind(SocketAddr::from(([127, 0, 5, 2], port))).unwrap();
    let listener = TcpListener::bind("127.0.5.2:0").unwrap();
    println!("listening {}", listener.local_addr().unwrap());
    remem_conformance::remote::serve(Arc::new(ctx), listener).unwrap();
}

#[test]
fn two_processes() {
    let ctx = SoftContext::bind(SocketAddr::from(([127, 0, 5, 1], 0))).unwrap();
    let port = ctx.local_addr().port();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_server", "--ignored", "--nocapture"])
        .env(CHILD_ENV, port.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    // The test harness prints its own lines first; find ours.
    while reader.read_line(&mut line).unwrap() > 0 {
        if let Some(a) = line.trim().strip_prefix("listening ") {
            addr = Some(a.parse::<SocketAddr>().unwrap());
            break;
        }
        line.clear();
    }
    let addr = addr.expect("child did not start its server");
    let report = remem_conformance::remote::drive(Arc::new(ctx), addr);
    // Drain the child's output so it cannot block on a full pipe, then reap it.
    std::thread::spawn(move || for _ in reader.lines() {});
    let status = child.wait().unwrap();
    let report = report.unwrap();
    assert!(status.success(), "child failed: {status}");
    assert_eq!(report.len(), 10, "{report:?}");
}
