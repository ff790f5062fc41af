//! `remem perf`: RDMA benchmarks named, flagged and reported as perftest's `ib_*` tools.
//!
//! `remem perf write_bw` serves; `remem perf write_bw HOST` connects to a server and runs
//! the test; `remem perf --loopback write_bw` runs both ends in one process, each on a soft
//! device of its own (127.0.0.1 and 127.0.0.2, one UDP port). The client tells the server
//! what to run, so the server needs no flags but the port. With `--perftest` the two sides
//! speak perftest's own out-of-band exchange instead (`perftest.rs`), so either may be one
//! of perftest's `ib_*` tools; then, as with perftest, both sides take the test's flags.
//!
//! Conventions (as perftest): write and send latency are half a round trip (ping-pong),
//! read and atomic latency the whole operation; bandwidth counts message bytes. The tables
//! print MB/sec with MB = 2^20 bytes as perftest does (Gb/sec = 10^9 bits with
//! `--report_gbits`); `--json` prints MB = 10^6 bytes.

pub mod plot;
pub mod report;

mod api;
mod ctrl;
mod perftest;
mod raw;

use report::Row;
use std::io::IsTerminal;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// A benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// RDMA READ bandwidth.
    ReadBw,
    /// SEND bandwidth.
    SendBw,
    /// Atomic (fetch-and-add or compare-and-swap) rate.
    AtomicBw,
    /// RDMA WRITE latency (ping-pong, half the round trip).
    WriteLat,
    /// RDMA READ latency (whole operation).
    ReadLat,
    /// SEND latency (ping-pong, half the round trip).
    SendLat,
    /// Atomic latency (whole operation).
    AtomicLat,
}

const TESTS: [(Test, &str); 8] = [
    (Test::WriteBw, "write_bw"),
    (Test::ReadBw, "read_bw"),
    (Test::SendBw, "send_bw"),
    (Test::AtomicBw, "atomic_bw"),
    (Test::WriteLat, "write_lat"),
    (Test::ReadLat, "read_lat"),
    (Test::SendLat, "send_lat"),
    (Test::AtomicLat, "atomic_lat"),
];

impl Test {
    /// The test's name (`write_bw`, …).
    pub fn name(self) -> &'static str {
        TESTS
            .iter()
            .find(|(t, _)| *t == self)
            .map_or("?", |(_, n)| n)
    }

    fn code(self) -> u8 {
        TESTS.iter().position(|(t, _)| *t == self).unwrap_or(0) as u8
    }

    fn from_code(c: u8) -> Option<Test> {
        TESTS.get(usize::from(c)).map(|(t, _)| *t)
    }

    /// A bandwidth test (else latency).
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }

    fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicBw | Test::AtomicLat)
    }

    /// perftest's default message size.
    fn default_size(self) -> u64 {
        match self {
            _ if self.is_atomic() => 8,
            _ if self.is_bw() => 65536,
            _ => 2,
        }
    }

    /// perftest's default iteration count.
    fn default_iters(self) -> u64 {
        if self.is_bw() { 5000 } else { 1000 }
    }
}

impl std::str::FromStr for Test {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.strip_prefix("ib_").unwrap_or(s);
        TESTS
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(t, _)| *t)
            .ok_or_else(|| {
                let names: Vec<_> = TESTS.iter().map(|(_, n)| *n).collect();
                format!("unknown test {s:?}; one of {}", names.join(", "))
            })
    }
}

/// The atomic operation of atomic tests (perftest's `-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicType {
    /// Fetch-and-add (the default).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    /// Compare-and-swap.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

/// `remem perf` options (perftest's flags where perftest has them).
#[derive(clap::Args, Debug, Clone)]
pub struct PerfArgs {
    /// write_bw, read_bw, send_bw, atomic_bw, write_lat, read_lat, send_lat or atomic_lat
    /// (an `ib_` prefix is accepted).
    pub test: Test,
    /// The server to connect to; without it, serve (wait for a client).
    pub host: Option<String>,
    /// Run both ends here, each on a soft device of its own (127.0.0.1, 127.0.0.2).
    #[arg(long)]
    pub loopback: bool,
    /// Message size in bytes (default: 65536 for bandwidth, 2 for latency, 8 for atomics).
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Iterations (default: 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Every size from 2 bytes to 8 MiB (powers of two; atomics: 8 bytes only).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// Report bandwidth in Gb/sec instead of MB/sec.
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
    /// Device to use (default: REMEM_DEVICE, else the first device).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// GID index (default: the device's first RoCE v2 GID, IPv4 preferred).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u8>,
    /// TCP port of the control connection.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Work requests in flight per QP (default: 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Number of queue pairs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Largest message sent inline (copied at post time), bytes.
    #[arg(
        short = 'I',
        long = "inline_size",
        alias = "inline-size",
        default_value_t = 0
    )]
    pub inline_size: u32,
    /// Accepted for perftest compatibility (CPU frequency checks do not apply).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// The atomic operation of atomic tests.
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD"
    )]
    pub atomic_type: AtomicType,
    /// One JSON object per result row on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Run the test through the async `remem` API instead of the raw provider.
    #[arg(long)]
    pub api: bool,
    /// With -a: draw bandwidth or latency against message size into this SVG file.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Soft devices: move packets on a progress thread of their own instead of the
    /// benchmark's thread (raw provider only).
    #[arg(long = "soft-thread")]
    pub soft_thread: bool,
    /// Speak perftest's out-of-band exchange instead of remem's own, to run against
    /// perftest's `ib_*` tools (as with perftest, both sides need the same test and
    /// flags). A server recognises a perftest client by itself.
    #[arg(long)]
    pub perftest: bool,
}

/// What the client tells the server: the test and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub test: Test,
    pub api: bool,
    pub atomic: AtomicType,
    pub qps: u32,
    pub tx_depth: u32,
    pub inline_size: u32,
    pub iters: u64,
    pub duration: Option<Duration>,
    pub sizes: Vec<u64>,
}

/// Most message sizes a run may ask for (`-a` goes to 8 MiB).
const MAX_SIZE: u64 = 1 << 30;

impl Settings {
    fn from_args(a: &PerfArgs) -> Result<Settings, String> {
        let test = a.test;
        let sizes = if a.all {
            if test.is_atomic() {
                vec![8]
            } else {
                (1..=23).map(|p| 1u64 << p).collect()
            }
        } else {
            vec![a.size.unwrap_or(test.default_size())]
        };
        for &s in &sizes {
            if s == 0 || s > MAX_SIZE {
                return Err(format!("message size {s} outside 1..={MAX_SIZE}"));
            }
            if test.is_atomic() && s != 8 {
                return Err("atomic operations are 8 bytes (-s 8)".into());
            }
        }
        let ping_pong = matches!(test, Test::WriteLat | Test::SendLat);
        if a.duration.is_some() && ping_pong {
            return Err(format!(
                "-D is not supported by {} (ping-pong): use -n",
                test.name()
            ));
        }
        if !test.is_bw() && a.qps != 1 {
            return Err("latency tests use one QP (-q 1)".into());
        }
        if a.qps == 0 || a.qps > 1024 {
            return Err(format!("-q {} outside 1..=1024", a.qps));
        }
        let tx_depth = a.tx_depth.unwrap_or(if test.is_bw() { 128 } else { 1 });
        if tx_depth == 0 || tx_depth > 8192 {
            return Err(format!("-t {tx_depth} outside 1..=8192"));
        }
        let iters = a.iters.unwrap_or(test.default_iters());
        if iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if a.duration == Some(0) {
            return Err("-D must be at least 1 second".into());
        }
        if a.inline_size > 512 {
            return Err(format!("-I {} above the devices' 512 bytes", a.inline_size));
        }
        Ok(Settings {
            test,
            api: a.api,
            atomic: a.atomic_type,
            qps: a.qps,
            tx_depth,
            inline_size: a.inline_size,
            iters,
            duration: a.duration.map(Duration::from_secs),
            sizes,
        })
    }

    pub(crate) fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(8).max(8)
    }
}

/// Where a side runs: its device and how its packets move.
#[derive(Debug, Clone)]
pub(crate) struct DeviceChoice {
    /// Device name (`soft@ip:port`, an interface's soft device, or a NIC).
    pub name: Option<String>,
    pub gid_index: Option<u8>,
    /// Soft devices: driven by the benchmark thread (no progress thread).
    pub soft_inline: bool,
}

/// The error of a benchmark run.
pub type PerfError = String;

/// Runs `remem perf`; prints results to stdout; returns an error message on failure.
pub fn run(args: &PerfArgs) -> Result<(), PerfError> {
    let settings = Settings::from_args(args)?;
    if args.plot.is_some() && !args.all {
        return Err("--plot draws a curve over sizes: use it with -a".into());
    }
    if args.perftest {
        perftest::check(&settings)?;
    }
    let rows = if args.loopback {
        if args.host.is_some() || args.ib_dev.is_some() {
            return Err("--loopback picks its own soft devices: no HOST or -d".into());
        }
        loopback(args, &settings)?
    } else if let Some(host) = &args.host {
        let stream = connect(host, args.port)?;
        client(args, &settings, stream, device_of(args))?
    } else {
        serve(args)?;
        return Ok(());
    };
    if let Some(path) = &args.plot {
        plot::plot(path, settings.test.name(), &rows, args.report_gbits)
            .map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
    }
    Ok(())
}

fn device_of(args: &PerfArgs) -> DeviceChoice {
    DeviceChoice {
        name: args.ib_dev.clone(),
        gid_index: args.gid_index,
        soft_inline: !args.soft_thread,
    }
}

fn connect(host: &str, port: u16) -> Result<TcpStream, PerfError> {
    let addr =
        if host.contains(':') && !host.starts_with('[') && host.parse::<SocketAddr>().is_err() {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
    TcpStream::connect(&addr).map_err(|e| format!("cannot connect to {addr}: {e}"))
}

fn serve(args: &PerfArgs) -> Result<(), PerfError> {
    let listener = TcpListener::bind(("0.0.0.0", args.port))
        .or_else(|_| TcpListener::bind(("::", args.port)))
        .map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
    eprintln!(
        "remem perf: waiting for a client on port {} (device {})",
        args.port,
        args.ib_dev.as_deref().unwrap_or("default")
    );
    let (stream, peer) = listener
        .accept()
        .map_err(|e| format!("accept failed: {e}"))?;
    eprintln!("remem perf: client {peer}");
    server(stream, device_of(args), args, true)
}

/// Whether a client speaks perftest's exchange: its first message is a version number,
/// remem's a settings frame (tag 1).
fn speaks_perftest(stream: &TcpStream) -> bool {
    let mut first = [0u8];
    matches!(stream.peek(&mut first), Ok(1) if first[0].is_ascii_digit())
}

/// The server side of one client's run. A remem client sends the settings; a perftest
/// client (or any with `--perftest`) runs with this side's own flags, `local`, and
/// prints what perftest's server prints unless `!print`.
pub(crate) fn server(
    stream: TcpStream,
    device: DeviceChoice,
    local: &PerfArgs,
    print: bool,
) -> Result<(), PerfError> {
    if local.perftest || speaks_perftest(&stream) {
        let settings = Settings::from_args(local)?;
        perftest::check(&settings)?;
        let mut out = Output::new(local, &settings);
        out.quiet = !print;
        perftest::server(stream, &settings, &device, &mut out)?;
        out.finish();
        return Ok(());
    }
    let mut ctrl = ctrl::Ctrl::new(stream)?;
    let settings = ctrl.recv_settings()?;
    if settings.api {
        api::server(ctrl, &settings, &device)
    } else {
        raw::server(ctrl, &settings, &device)
    }
}

fn client(
    args: &PerfArgs,
    settings: &Settings,
    stream: TcpStream,
    device: DeviceChoice,
) -> Result<Vec<Row>, PerfError> {
    let mut out = Output::new(args, settings);
    if args.perftest {
        let rows = perftest::client(stream, settings, &device, &mut out)?;
        out.finish();
        return Ok(rows);
    }
    let mut ctrl = ctrl::Ctrl::new(stream)?;
    ctrl.send_settings(settings)?;
    let rows = if settings.api {
        api::client(ctrl, settings, &device, &mut out)?
    } else {
        raw::client(ctrl, settings, &device, &mut out)?
    };
    out.finish();
    Ok(rows)
}

/// Both ends in this process: the server on a thread, each on its own soft device.
fn loopback(args: &PerfArgs, settings: &Settings) -> Result<Vec<Row>, PerfError> {
    let soft_inline = !args.soft_thread;
    // The server's device picks a free UDP port; the client's binds the same port on
    // another address (soft devices talk to their peer's port).
    let probe = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map_err(|e| format!("no free UDP port: {e}"))?;
    let udp_port = probe.port();
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let tcp = listener.local_addr().map_err(|e| e.to_string())?;
    let server_dev = DeviceChoice {
        name: Some(format!("soft@127.0.0.1:{udp_port}")),
        gid_index: None,
        soft_inline,
    };
    let local = args.clone();
    let server = std::thread::Builder::new()
        .name("remem-perf-server".into())
        .spawn(move || -> Result<(), PerfError> {
            let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
            // The client prints the results.
            server(stream, server_dev, &local, false)
        })
        .map_err(|e| e.to_string())?;
    let client_dev = DeviceChoice {
        name: Some(format!("soft@127.0.0.2:{udp_port}")),
        gid_index: None,
        soft_inline,
    };
    let stream = TcpStream::connect(tcp).map_err(|e| e.to_string())?;
    let result = client(args, settings, stream, client_dev);
    let served = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    let rows = result?;
    served.map_err(|e| format!("server: {e}"))?;
    Ok(rows)
}

/// Where results go: the table (or JSON lines) and the progress indicator.
pub(crate) struct Output {
    test: Test,
    json: bool,
    api: bool,
    gbits: bool,
    header_done: bool,
    progress: bool,
    /// Print nothing.
    quiet: bool,
}

impl Output {
    fn new(args: &PerfArgs, settings: &Settings) -> Output {
        Output {
            test: settings.test,
            json: args.json,
            api: settings.api,
            gbits: args.report_gbits,
            header_done: false,
            progress: std::io::stderr().is_terminal(),
            quiet: false,
        }
    }

    /// Whether to draw a progress indicator (stderr is a terminal).
    pub(crate) fn progress(&self) -> Option<report::Progress> {
        (self.progress && !self.quiet).then(report::Progress::new)
    }

    pub(crate) fn row(&mut self, settings: &Settings, row: &Row) {
        if self.quiet {
            return;
        }
        if self.json {
            println!("{}", report::json(self.test, self.api, settings, row));
            return;
        }
        if !self.header_done {
            self.header_done = true;
            report::print_header(self.test, self.api, settings, self.gbits);
        }
        report::print_row(row, self.gbits);
    }

    fn finish(&self) {
        if !self.json && self.header_done {
            report::print_footer();
        }
    }
}

/// The tokio runtime of the API path (one worker: the benchmark task drives the device).
pub(crate) fn runtime() -> Result<Arc<tokio::runtime::Runtime>, PerfError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map(Arc::new)
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    fn parse(args: &[&str]) -> Result<Settings, String> {
        let cli = Cli::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        Settings::from_args(&cli.perf)
    }

    #[test]
    fn perftest_flags_and_defaults() {
        let s = parse(&["write_bw", "-s", "4096", "-n", "10", "-t", "64", "-q", "2"]).unwrap();
        assert_eq!(
            (s.test, s.sizes.clone(), s.iters, s.tx_depth, s.qps),
            (Test::WriteBw, vec![4096], 10, 64, 2)
        );
        let s = parse(&["ib_read_lat"]).unwrap();
        assert_eq!(
            (s.test, s.sizes.clone(), s.iters, s.tx_depth),
            (Test::ReadLat, vec![2], 1000, 1)
        );
        let s = parse(&["atomic_bw", "-A", "CMP_AND_SWAP"]).unwrap();
        assert_eq!(
            (s.sizes.clone(), s.atomic),
            (vec![8], AtomicType::CmpAndSwap)
        );
        let s = parse(&["send_bw", "-a", "--report_gbits", "-F", "-D", "2"]).unwrap();
        assert_eq!(s.sizes.len(), 23);
        assert_eq!((s.sizes[0], s.sizes[22]), (2, 8 << 20));
        assert_eq!(s.duration, Some(Duration::from_secs(2)));
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&["nope_bw"]).is_err());
        assert!(parse(&["atomic_bw", "-s", "16"]).is_err());
        assert!(parse(&["write_lat", "-D", "2"]).is_err());
        assert!(parse(&["read_lat", "-q", "2"]).is_err());
        assert!(parse(&["write_bw", "-s", "0"]).is_err());
        assert!(parse(&["write_bw", "-t", "0"]).is_err());
        assert!(parse(&["write_bw", "-I", "4096"]).is_err());
    }

    #[test]
    fn test_codes_round_trip() {
        for (t, name) in TESTS {
            assert_eq!(Test::from_code(t.code()), Some(t));
            assert_eq!(name.parse::<Test>().unwrap(), t);
        }
    }
}
