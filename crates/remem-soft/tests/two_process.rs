//! Every conformance case between two soft devices in two processes: this test plays A on
//! 127.0.5.1, a child process it spawns (this test binary again) plays B on 127.0.5.2, and
//! the devices talk RoCEv2 over UDP on loopback.

use remem_conformance::remote::{run_with_child, serve_parent};
use remem_conformance::{CASES, TIMEOUT};
use remem_soft::SoftContext;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;

const CHILD_ENV: &str = "REMEM_TWO_PROCESS_CHILD_PORT";

fn device(ip: [u8; 4], port: u16) -> SoftContext {
    SoftContext::bind(SocketAddr::from((ip, port))).expect("soft device")
}

/// The B side; runs only in the child process of `two_processes`.
#[test]
#[ignore = "runs in the child process of two_processes"]
fn child_server() {
    let Ok(port) = std::env::var(CHILD_ENV) else {
        eprintln!("child_server only runs as the child of two_processes");
        return;
    };
    let ctx = device([127, 0, 5, 2], port.parse().expect("port"));
    let served = serve_parent(&(Arc::new(ctx) as _), TIMEOUT).expect("serving the parent");
    eprintln!("child: served {served} cases");
}

#[test]
fn two_processes() {
    let ctx = device([127, 0, 5, 1], 0);
    let mut child = Command::new(std::env::current_exe().expect("own path"));
    child
        .args(["--exact", "child_server", "--ignored", "--nocapture"])
        .env(CHILD_ENV, ctx.local_addr().port().to_string())
        .stdout(Stdio::null()); // the test harness's report; failures come over the link
    let cases: Vec<_> = CASES.iter().collect();
    let results = run_with_child(&(Arc::new(ctx) as _), child, &cases, TIMEOUT).expect("child");
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        results.len(),
        failed.join("\n")
    );
    assert_eq!(results.len(), CASES.len(), "every case ran");
}
