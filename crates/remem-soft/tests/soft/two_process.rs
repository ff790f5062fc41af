//! Every conformance case between two soft devices in two processes: this test plays A on
//! 127.0.5.1, a child process it spawns (this test binary again) plays B on 127.0.5.2, and
//! the devices talk RoCEv2 over UDP on loopback. Once more with both processes on one
//! address and port: two members of the host's shared device (`io::host`).

use remem_conformance::remote::{run_with_child, serve_parent};
use remem_conformance::{CASES, Case, CaseResult, TIMEOUT};
use remem_soft::SoftContext;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;

const CHILD_ENV: &str = "REMEM_TWO_PROCESS_CHILD_PORT";
/// The child's address when it is not 127.0.5.2.
const CHILD_IP_ENV: &str = "REMEM_TWO_PROCESS_CHILD_IP";

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
    let ip = std::env::var(CHILD_IP_ENV).map_or([127, 0, 5, 2], |ip| {
        ip.parse::<std::net::Ipv4Addr>().expect("child ip").octets()
    });
    let ctx = device(ip, port.parse().expect("port"));
    serve_parent(&(Arc::new(ctx) as _), TIMEOUT).expect("serving the parent");
}

/// Runs `cases` with a child process serving B; returns each case's name and result.
fn with_child(cases: &[&'static Case]) -> Vec<(&'static str, CaseResult)> {
    with_child_at(cases, device([127, 0, 5, 1], 0), None)
}

/// [`with_child`] with this side's device `ctx`, and the child's on `child_ip` (at the
/// same port) when given.
fn with_child_at(
    cases: &[&'static Case],
    ctx: SoftContext,
    child_ip: Option<std::net::Ipv4Addr>,
) -> Vec<(&'static str, CaseResult)> {
    let mut child = Command::new(std::env::current_exe().expect("own path"));
    child
        .args([
            "--exact",
            "two_process::child_server",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, ctx.local_addr().port().to_string())
        .envs(child_ip.map(|ip| (CHILD_IP_ENV, ip.to_string())))
        .stdout(Stdio::null()); // the test harness's report; failures come over the link
    run_with_child(&(Arc::new(ctx) as _), child, cases, TIMEOUT).expect("child")
}

#[test]
fn two_processes() {
    assert_all_pass(with_child(&CASES.iter().collect::<Vec<_>>()));
}

/// Both processes on one address and port 4791: one shared device, every packet steered
/// to the process that owns its QP (or CM connection).
#[test]
fn two_processes_on_one_shared_device() {
    let ip = std::net::Ipv4Addr::new(127, 0, 5, 10 + (std::process::id() % 200) as u8);
    let ctx = device(ip.octets(), 4791);
    assert_all_pass(with_child_at(
        &CASES.iter().collect::<Vec<_>>(),
        ctx,
        Some(ip),
    ));
}

fn assert_all_pass(results: Vec<(&'static str, CaseResult)>) {
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

/// A case the child does not know fails on both sides, and the next case still runs.
#[test]
fn an_unknown_case_fails_and_the_session_goes_on() {
    static UNKNOWN: Case = Case {
        name: "not_a_case",
        about: "a case only the parent knows",
        side: |s| s.barrier("never reached by the child"),
        run: |_| Ok(()),
    };
    let next = Case::named("rdma_read_multi_packet").expect("case");
    let results = with_child(&[&UNKNOWN, next]);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(
        results[0].1,
        Err("B: no case \"not_a_case\"".to_string()),
        "unknown case"
    );
    assert_eq!(results[1], (next.name, Ok(())), "the next case");
}
