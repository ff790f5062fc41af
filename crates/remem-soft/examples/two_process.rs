//! A write, a read, a send and both atomics between two processes, each with its own soft
//! device: this process on 127.0.0.1, a child process on 127.0.0.2.
//!
//! ```sh
//! cargo run -p remem-soft --example two_process
//! ```
//!
//! The child serves; this process drives and prints each check. Endpoint information goes
//! over a TCP connection; the RDMA traffic is RoCEv2 over UDP between the two devices.

use remem_soft::SoftContext;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;

fn server(port: u16) -> Result<(), String> {
    let ctx =
        SoftContext::bind(SocketAddr::from(([127, 0, 0, 2], port))).map_err(|e| e.to_string())?;
    let listener = TcpListener::bind("127.0.0.2:0").map_err(|e| e.to_string())?;
    println!(
        "listening {}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    remem_conformance::remote::serve(Arc::new(ctx), listener)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("server") {
        let port = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(4791);
        return match server(port) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let ctx = match SoftContext::bind(SocketAddr::from(([127, 0, 0, 1], 0))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot open a soft device on 127.0.0.1: {e}");
            return ExitCode::FAILURE;
        }
    };
    let port = ctx.local_addr().port();
    println!("driver: soft device on {}", ctx.local_addr());
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .args(["server", &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server process");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("child stdout");
    BufReader::new(stdout).read_line(&mut line).ok();
    let Some(addr) = line
        .strip_prefix("listening ")
        .and_then(|a| a.trim().parse::<SocketAddr>().ok())
    else {
        eprintln!("server did not start: {line:?}");
        let _ = child.kill();
        let _ = child.wait();
        return ExitCode::FAILURE;
    };
    println!("driver: server process {} on 127.0.0.2:{port}", child.id());
    let result = remem_conformance::remote::drive(Arc::new(ctx), addr);
    let status = child.wait().expect("wait for the server");
    match result {
        Ok(report) if status.success() => {
            for r in report {
                println!("checked: {r}");
            }
            println!("all checks passed");
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("server process failed: {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("check failed: {e}");
            ExitCode::FAILURE
        }
    }
}
