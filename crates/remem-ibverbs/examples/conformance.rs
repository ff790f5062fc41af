//! Runs remem's provider conformance suite on an rdma-core device, or on a soft device,
//! alone or against a peer process over TCP — the wire-interop proof between remem's
//! soft provider and the kernel's Soft-RoCE (`cargo xtask rxe conformance` runs it).
//!
//! ```text
//! conformance local <device> [case…]
//!     every case (or those named), both sides in this process on two contexts of <device>
//! conformance link <device> listen|connect <host:port> A|B [case…]
//!     one session against a peer process: A names and drives the cases (every case, or
//!     those named), B serves them
//! conformance sync listen|connect <host:port>
//!     a barrier between two scripts (the VM lane's host and guest): returns once the
//!     peer has reached its own `sync` (connect retries while nobody listens)
//! conformance list
//! ```
//!
//! `<device>` is opened by the rdma-core provider if it has it (`rxe0`, `mlx5_0`), else by
//! the soft provider (`soft@10.0.0.1:4791`). `REMEM_CONFORMANCE_MTU=4096` sets the path MTU.
//! The exit status is the number of failed cases (capped at 100); 101 for a usage error.

use remem_conformance::{CASES, Case, Pair, StreamLink, TIMEOUT, remote};
use remem_verbs::{Context, Provider};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn open(name: &str) -> Result<Arc<dyn Context>, String> {
    match remem_ibverbs::IbverbsProvider::new().open(name) {
        Ok(ctx) => Ok(ctx),
        Err(remem_verbs::Error::NoSuchDevice(_)) => remem_soft::SoftProvider::new()
            .open(name)
            .map_err(|e| format!("opening {name}: {e}")),
        Err(e) => Err(format!("opening {name}: {e}")),
    }
}

fn report(results: &[(&str, Result<(), String>)]) -> ExitCode {
    let mut failed = 0u8;
    for (name, r) in results {
        match r {
            Ok(()) => println!("conformance: {name}: ok"),
            Err(e) => {
                failed = failed.saturating_add(1);
                println!("conformance: {name}: FAILED: {e}");
            }
        }
    }
    println!(
        "conformance: {} passed, {failed} failed",
        results.len() - usize::from(failed)
    );
    ExitCode::from(failed.min(100))
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: conformance local <device> [case…] | link <device> listen|connect <addr> A|B \
         [case…] | sync listen|connect <addr> | list"
    );
    ExitCode::from(101)
}

/// Accepts one connection on `addr` (`listen`) or connects to it (`connect`).
fn stream(how: &str, addr: &str) -> Result<TcpStream, String> {
    if how == "listen" {
        TcpListener::bind(addr)
            .and_then(|l| l.accept())
            .map(|(s, _)| s)
            .map_err(|e| format!("listen {addr}: {e}"))
    } else {
        connect(addr)
    }
}

/// Connects, retrying while the peer is not yet listening (bounded).
fn connect(addr: &str) -> Result<TcpStream, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(format!("connect {addr}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Runs under emulation in CI: give every wait more room than on hardware.
    let timeout = TIMEOUT * 3;
    match args.as_slice() {
        ["list"] => {
            for c in CASES {
                println!("{}: {}", c.name, c.about);
            }
            ExitCode::SUCCESS
        }
        ["sync", how @ ("listen" | "connect"), addr] => {
            // One byte each way: both sides are here.
            let met = stream(how, addr).and_then(|mut s| {
                s.write_all(&[1])
                    .and_then(|()| s.read_exact(&mut [0u8]))
                    .map_err(|e| format!("sync {addr}: {e}"))
            });
            match met {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("conformance: {e}");
                    ExitCode::from(100)
                }
            }
        }
        ["local", device, names @ ..] => {
            let (a, b) = match (open(device), open(device)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("conformance: {e}");
                    return ExitCode::from(100);
                }
            };
            let first = a.clone();
            let pair = Pair::new(a, b);
            let cases: Vec<&Case> = CASES
                .iter()
                .filter(|c| names.is_empty() || names.contains(&c.name))
                .collect();
            let mut results: Vec<_> = cases.iter().map(|c| (c.name, (c.run)(&pair))).collect();
            if remem_conformance::is_kernel_rxe(&*first) {
                // The device's counters (sysfs) saw the suite's packets.
                let counters = first.counters();
                let sent = counters.iter().find(|c| c.name == "sent_pkts");
                println!(
                    "conformance: {} counters of {device}, sent_pkts {sent:?}",
                    counters.len()
                );
                results.push((
                    "device_counters",
                    match sent {
                        Some(c) if c.value > 0 => Ok(()),
                        _ => Err(format!("no packets counted in {counters:?}")),
                    },
                ));
            }
            report(&results)
        }
        [
            "link",
            device,
            how @ ("listen" | "connect"),
            addr,
            role @ ("A" | "B"),
            names @ ..,
        ] => {
            let ctx = match open(device) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("conformance: {e}");
                    return ExitCode::from(100);
                }
            };
            let stream = match stream(how, addr) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("conformance: {e}");
                    return ExitCode::from(100);
                }
            };
            let _ = stream.set_nodelay(true);
            let mut link = StreamLink::new(stream);
            if *role == "A" {
                let cases: Vec<&'static Case> = CASES
                    .iter()
                    .filter(|c| names.is_empty() || names.contains(&c.name))
                    .collect();
                let results = remote::drive(&ctx, &mut link, &cases, timeout);
                report(&results)
            } else {
                match remote::serve(&ctx, &mut link, timeout) {
                    Ok(n) => {
                        println!("conformance: served {n} cases as B on {device}");
                        drop(link);
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("conformance: serving: {e}");
                        ExitCode::from(100)
                    }
                }
            }
        }
        _ => usage(),
    }
}
