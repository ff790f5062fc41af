//! `remem`: list RDMA devices, run perftest-compatible benchmarks (`remem perf`), and run
//! unmodified programs on remem's drop-in libibverbs (`remem run`).

// One module, `namespace` (the `unshare` that makes `remem run`'s mount namespace),
// allows unsafe code; the rest denies it.
#![deny(unsafe_code)]

use clap::{Parser, Subcommand};
use remem::verbs::{DeviceInfo, GidType};
use std::process::ExitCode;

mod devtree;
mod namespace;
mod perf;
mod run;

/// Asynchronous RDMA for Rust: devices and benchmarks, on RDMA NICs or remem's userspace
/// RoCEv2 stack.
#[derive(Parser, Debug)]
#[command(
    name = "remem",
    version,
    about = "remem: asynchronous RDMA for Rust, on RDMA NICs or a userspace RoCEv2 stack"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the RDMA devices remem can open (as ibv_devices), with their GID tables.
    Devices {
        /// Show every GID table entry (RoCE v1 entries of other providers too) and the UDP
        /// address.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Benchmarks as perftest's ib_* tools: `remem perf write_bw` serves,
    /// `remem perf write_bw HOST` connects, `remem perf --loopback write_bw` runs both.
    Perf(perf::PerfArgs),
    /// Run an unmodified libibverbs program on remem's soft NIC: `remem run -- ib_write_bw`.
    ///
    /// Puts a directory holding remem's drop-in libibverbs.so.1 first on LD_LIBRARY_PATH and
    /// execs the program (its exit status and signals are its own).
    Run(run::RunArgs),
}

fn gid_type_name(t: GidType) -> &'static str {
    match t {
        GidType::Ib => "IB",
        GidType::RoceV1 => "RoCE v1",
        GidType::RoceV2 => "RoCE v2",
    }
}

fn print_devices(devices: &[DeviceInfo], verbose: bool) {
    println!(
        "    {:<16}\t{:<8}\t{:<16}\tnetdev",
        "device", "provider", "node GUID"
    );
    println!(
        "    {:<16}\t{:<8}\t{:<16}\t------",
        "------", "--------", "---------"
    );
    for d in devices {
        println!(
            "    {:<16}\t{:<8}\t{:016x}\t{}",
            d.name,
            d.provider,
            d.node_guid,
            d.netdev.as_deref().unwrap_or("-")
        );
        if verbose && let Some(addr) = d.udp_addr {
            println!("        UDP port: {}", addr.port());
        }
        for g in &d.gids {
            if !verbose && g.gid_type != GidType::RoceV2 {
                continue;
            }
            println!(
                "        GID[{:>3}]: {}  {:<24} {}",
                g.index,
                g.gid,
                g.gid.to_ip(),
                gid_type_name(g.gid_type)
            );
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Devices { verbose } => match remem::devices() {
            Ok(list) if list.is_empty() => {
                eprintln!("remem: no RDMA devices found");
                ExitCode::FAILURE
            }
            Ok(list) => {
                print_devices(&list, verbose);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("remem: cannot list devices: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => run::run(&args),
        Command::Perf(args) => match perf::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("remem perf: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
