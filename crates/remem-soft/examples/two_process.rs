//! A write, a read, a send and both atomics between two processes, each with its own soft
//! device: this process on 127.0.0.1, a child process on 127.0.0.2.
//!
//! ```sh
//! cargo run -p remem-soft --example two_process
//! ```
//!
//! Both processes run the same conformance cases, this one as the requester (A), the child
//! as the responder (B). Queue pair numbers, memory keys and results go over a socket
//! between the two; the RDMA traffic is RoCEv2 over UDP between the two devices.

use remem_conformance::remote::{run_with_child, serve_parent};
use remem_conformance::{Case, TIMEOUT};
use remem_soft::SoftContext;
use std::net::SocketAddr;
use std::process::{Command, ExitCode};
use std::sync::Arc;

const CASES: [&str; 4] = [
    "send_recv_multi_packet_multi_sge",
    "rdma_write_and_write_with_imm",
    "rdma_read_multi_packet",
    "atomics_return_original_values",
];

fn device(ip: [u8; 4], port: u16) -> Result<Arc<SoftContext>, String> {
    let addr = SocketAddr::from((ip, port));
    SoftContext::bind(addr)
        .map(Arc::new)
        .map_err(|e| format!("cannot open a soft device on {addr}: {e}"))
}

/// The child: B on 127.0.0.2 until the parent is done.
fn server(port: u16) -> Result<(), String> {
    serve_parent(&(device([127, 0, 0, 2], port)? as _), TIMEOUT).map(|_| ())
}

fn driver() -> Result<(), String> {
    let ctx = device([127, 0, 0, 1], 0)?;
    let port = ctx.local_addr().port();
    println!("driver: soft device on {}", ctx.local_addr());
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    child.args(["server", &port.to_string()]);
    println!("driver: server process on 127.0.0.2:{port}");
    let cases: Vec<&Case> = CASES.iter().filter_map(|n| Case::named(n)).collect();
    let results = run_with_child(&(ctx as _), child, &cases, TIMEOUT)?;
    let mut failed = 0;
    for (name, result) in &results {
        match result {
            Ok(()) => println!(
                "checked: {name}: {}",
                Case::named(name).map_or("", |c| c.about)
            ),
            Err(e) => {
                failed += 1;
                eprintln!("FAILED: {name}: {e}");
            }
        }
    }
    match failed {
        0 if results.len() == CASES.len() => Ok(()),
        0 => Err(format!("ran {} of {} cases", results.len(), CASES.len())),
        n => Err(format!("{n} failed")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = if args.get(1).map(String::as_str) == Some("server") {
        let port = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(4791);
        server(port).map_err(|e| format!("server: {e}"))
    } else {
        driver().map(|()| println!("all checks passed"))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
