//! `remem perf`: RDMA benchmarks named, flagged and reported as perftest's `ib_*` tools.
//!
//! `remem perf write_bw` serves; `remem perf write_bw HOST` connects to a server and runs
//! the test; `remem perf --loopback write_bw` runs both ends in one process, each on a soft
//! device of its own (127.0.0.1 and 127.0.0.2, each on a free UDP port, told the other's).
//! The client tells the server what to run, so the server needs no flags but the test's
//! name and the port. With `--perftest` the two sides speak perftest's own out-of-band
//! exchange instead (`perftest.rs`), so either may be one of perftest's `ib_*` tools;
//! then, as with perftest, both sides take the test's flags.
//!
//! A server opens its device (and checks `-d`/`-x`) before it waits for a client. A
//! connection that turns out not to be a remem perf or perftest client (silent, closed at
//! once, or speaking something else) is reported and the server waits for the next; the
//! first real client's run decides the exit status, and the server exits, as perftest's do.
//!
//! Conventions (as perftest): write and send latency are half a round trip (ping-pong),
//! read and atomic latency the whole operation; bandwidth counts message bytes. One unit
//! everywhere: MB = 2^20 bytes (perftest's MB/sec, called MiB/s in `--json` and the plot),
//! or Gb = 10^9 bits with `--report_gbits`.

pub mod plot;
pub mod report;

mod api;
mod ctrl;
mod perftest;
mod raw;
mod verify;

use remem::verbs::{Context, Gid, GidType};
use remem_soft::{SoftContext, SoftOptions};
use report::Row;
use std::io::{IsTerminal, Read};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
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

    /// A SEND test.
    fn is_send(self) -> bool {
        matches!(self, Test::SendBw | Test::SendLat)
    }

    /// A READ or atomic test (the peer needs responder resources).
    fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            Test::ReadBw | Test::ReadLat | Test::AtomicBw | Test::AtomicLat
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

impl AtomicType {
    /// perftest's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
        }
    }
}

/// The queue pair type (perftest's `-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Conn {
    /// Reliable connected (the default).
    #[value(name = "RC")]
    Rc,
    /// Unreliable connected: WRITE and SEND tests (no READ or atomics); nothing is
    /// acknowledged or retransmitted, so a message lost on the way is not waited for.
    #[value(name = "UC")]
    Uc,
    /// Unreliable datagram: SEND tests only, messages of at most the path MTU.
    #[value(name = "UD")]
    Ud,
}

impl Conn {
    /// perftest's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
        }
    }
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
    /// Iterations per QP (default: 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Every size from 2 bytes to 8 MiB (powers of two; atomics: 8 bytes only; UD: up to
    /// the path MTU).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// Report bandwidth in Gb/sec (10^9 bits) instead of MB/sec (2^20 bytes).
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
    /// Bidirectional: both sides run the bandwidth test at once (bandwidth tests); the
    /// result is the sum of both directions, as perftest's.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidir: bool,
    /// Queue pair type: RC, UC (write and send tests) or UD (send_bw and send_lat;
    /// messages of at most the path MTU).
    #[arg(
        short = 'c',
        long = "connection",
        value_enum,
        default_value = "RC",
        ignore_case = true
    )]
    pub conn: Conn,
    /// Device to use: a NIC, an interface's soft device, or `soft@IP[:PORT]` (UDP port 4791
    /// when omitted) (default: REMEM_DEVICE, else the first device).
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
    /// The atomic operation of atomic tests (default FETCH_AND_ADD).
    #[arg(short = 'A', long = "atomic_type", value_enum)]
    pub atomic_type: Option<AtomicType>,
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
    /// benchmark's thread.
    #[arg(long = "soft-thread")]
    pub soft_thread: bool,
    /// Soft devices with `--soft-thread`: the progress threads busy-poll (never sleep; a
    /// CPU each), as `REMEM_SOFT_BUSY_POLL_US=always` — the lowest latency when there are
    /// cores to spare.
    #[arg(long = "soft-busy-poll", requires = "soft_thread")]
    pub soft_busy_poll: bool,
    /// Soft devices driven by the benchmark thread: what a call of its spin receives is
    /// answered (ACKs, READ and atomic responses) with the next call's sends, in one
    /// `sendmmsg` with the reply it posts meanwhile, as `REMEM_SOFT_DEFER_RESPONSES=1`
    /// (`SoftOptions::defer_responses`): a syscall less per ping-pong message.
    #[arg(long = "soft-defer-responses", conflicts_with = "soft_thread")]
    pub soft_defer_responses: bool,
    /// Connect the queue pairs through the RDMA connection manager (CM REQ/REP/RTU on the
    /// devices, on the server's device address and the port of `-p`), as perftest's `-R`;
    /// the control connection still carries the settings and the memory keys. RC only.
    #[arg(short = 'R', long = "rdma_cm", alias = "rdma-cm")]
    pub rdma_cm: bool,
    /// Speak perftest's out-of-band exchange instead of remem's own, to run against
    /// perftest's `ib_*` tools (as with perftest, both sides need the same test and
    /// flags). A server recognises a perftest client by itself.
    #[arg(long)]
    pub perftest: bool,
    /// Seconds to wait for the peer on the control connection (connecting, and each
    /// answer it owes before and between runs).
    #[arg(long = "ctrl-timeout", default_value_t = 10.0)]
    pub ctrl_timeout: f64,
    /// Check the data (write_bw, read_bw; RC, raw provider, one size of at least 8 bytes):
    /// each QP uses `-t` slots of message size on both sides, message `i` going from slot
    /// `i % t` to slot `i % t`, and its bytes are a pattern derived from the QP, `i` and
    /// the offset. A READ's bytes are checked as it completes (every byte of every
    /// message); a WRITE's destination slots are checked by the server at the end (every
    /// byte of each slot's last message, and that the last messages are the last ones
    /// posted). A mismatch fails the run. Costs bandwidth (the pattern is written or
    /// checked per message): compare verified runs with verified runs.
    #[arg(long)]
    pub verify: bool,
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
    /// Both sides run the bandwidth test at once.
    pub bidir: bool,
    /// The queue pair type (RC, UC or UD).
    pub conn: Conn,
    /// `-R`: connect the QPs through the RDMA connection manager, on this CM port (TCP
    /// port space) of the server's device address.
    pub cm: Option<u16>,
    /// `--verify`: patterned slots, the data checked (see [`PerfArgs::verify`]).
    pub verify: bool,
}

/// Most message sizes a run may ask for (`-a` goes to 8 MiB).
const MAX_SIZE: u64 = 1 << 30;
/// Most bytes of buffers a run may make each side allocate (16 GiB: `-a -q 1024`).
const MAX_BUFFERS: u64 = 1 << 34;

impl Settings {
    fn from_args(a: &PerfArgs) -> Result<Settings, String> {
        let test = a.test;
        if a.atomic_type.is_some() && !test.is_atomic() {
            // perftest: "You are not running the atomic_lat/bw test!"
            return Err(format!(
                "-A applies to atomic tests (atomic_bw, atomic_lat), not {}",
                test.name()
            ));
        }
        if a.all && a.duration.is_some() {
            // perftest: "Duration mode currently doesn't support running on all sizes."
            return Err("-D cannot run every size (-a): use one or the other".into());
        }
        let sizes = if a.all {
            if test.is_atomic() {
                vec![8]
            } else {
                (1..=23).map(|p| 1u64 << p).collect()
            }
        } else {
            vec![a.size.unwrap_or(test.default_size())]
        };
        let tx_depth = a.tx_depth.unwrap_or(if test.is_bw() { 128 } else { 1 });
        let s = Settings {
            test,
            api: a.api,
            atomic: a.atomic_type.unwrap_or(AtomicType::FetchAndAdd),
            qps: a.qps,
            tx_depth,
            inline_size: a.inline_size,
            iters: a.iters.unwrap_or(test.default_iters()),
            duration: a.duration.map(Duration::from_secs),
            sizes,
            bidir: a.bidir,
            conn: a.conn,
            cm: a.rdma_cm.then_some(a.port),
            verify: a.verify,
        };
        if a.rdma_cm && (a.conn != Conn::Rc || a.api || a.perftest) {
            return Err(
                "-R connects RC QPs of the raw provider through the RDMA CM: not with -c UC/UD, \
                 --api or --perftest"
                    .into(),
            );
        }
        if a.duration == Some(0) {
            return Err("-D must be at least 1 second".into());
        }
        s.check()?;
        Ok(s)
    }

    /// Why these settings cannot run, if they cannot (a server checks a client's too).
    pub(crate) fn check(&self) -> Result<(), String> {
        let test = self.test;
        for &s in &self.sizes {
            if s == 0 || s > MAX_SIZE {
                return Err(format!("message size {s} outside 1..={MAX_SIZE}"));
            }
            if test.is_atomic() && s != 8 {
                return Err("atomic operations are 8 bytes (-s 8)".into());
            }
        }
        if self.bidir && !test.is_bw() {
            // perftest: "Bidirectional is only available in BW test"
            return Err(format!(
                "-b (bidirectional) applies to bandwidth tests, not {}",
                test.name()
            ));
        }
        match self.conn {
            Conn::Rc => {}
            Conn::Uc if test.is_read_or_atomic() => {
                // perftest's own words.
                return Err(format!(
                    "UC connection not possible in READ/ATOMIC verbs (-c UC with {})",
                    test.name()
                ));
            }
            Conn::Uc => {}
            Conn::Ud if !test.is_send() => {
                // perftest: "UD connection only possible in SEND verb"
                return Err(format!(
                    "-c UD runs SEND tests only (send_bw, send_lat), not {}",
                    test.name()
                ));
            }
            Conn::Ud => {}
        }
        if self.api && self.conn != Conn::Rc {
            return Err(format!(
                "--api runs RC connections: no -c {}",
                self.conn.name()
            ));
        }
        if self.api && self.bidir {
            return Err("-b runs on the raw provider: not with --api".into());
        }
        let ping_pong = matches!(test, Test::WriteLat | Test::SendLat);
        if self.duration.is_some() && ping_pong {
            return Err(format!(
                "-D is not supported by {} (ping-pong): use -n",
                test.name()
            ));
        }
        if !test.is_bw() && self.qps != 1 {
            return Err("latency tests use one QP (-q 1)".into());
        }
        if self.qps == 0 || self.qps > 1024 {
            return Err(format!("-q {} outside 1..=1024", self.qps));
        }
        if self.verify {
            if !matches!(test, Test::WriteBw | Test::ReadBw) || self.conn != Conn::Rc {
                return Err("--verify checks write_bw and read_bw on RC".into());
            }
            if self.api || self.bidir {
                return Err("--verify runs on the raw provider, one way: no --api or -b".into());
            }
            if self.sizes.len() != 1 || self.sizes[0] < 8 {
                return Err(
                    "--verify runs one message size of at least 8 bytes (-s, no -a)".into(),
                );
            }
        }
        // Each side allocates two areas of the largest message per QP: a client's settings
        // cannot make a server allocate without bound.
        let buffers = 2 * self.area_bytes() * u64::from(self.qps);
        if buffers > MAX_BUFFERS {
            return Err(format!(
                "-q {} with {}-byte messages needs {buffers} bytes of buffers per side, more \
                 than {MAX_BUFFERS}",
                self.qps,
                self.max_size()
            ));
        }
        if self.tx_depth == 0 || self.tx_depth > 8192 {
            return Err(format!("-t {} outside 1..=8192", self.tx_depth));
        }
        if self.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if self.inline_size > 512 {
            return Err(format!(
                "-I {} above the devices' 512 bytes",
                self.inline_size
            ));
        }
        Ok(())
    }

    pub(crate) fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(8).max(8)
    }

    /// Bytes of one of a QP's two areas: the largest message, or with `--verify` one slot
    /// of it per operation in flight.
    pub(crate) fn area_bytes(&self) -> u64 {
        if self.verify {
            self.max_size() * u64::from(self.tx_depth)
        } else {
            self.max_size()
        }
    }

    /// The settings to run over a path MTU of `mtu` bytes: a UD message is at most one
    /// MTU, so `-a` stops there and a larger `-s` becomes the MTU (as perftest does), with
    /// a note saying so. Unchanged for RC.
    pub(crate) fn fit_path_mtu(&self, mtu: u64) -> (Settings, Option<String>) {
        let mut s = self.clone();
        if self.conn != Conn::Ud || self.sizes.iter().all(|&x| x <= mtu) {
            return (s, None);
        }
        let note = if self.sizes.len() > 1 {
            s.sizes.retain(|&x| x <= mtu);
            format!("UD messages are at most the path MTU: -a runs sizes up to {mtu} bytes")
        } else {
            format!(
                "-s {} is above the UD path MTU: {mtu}-byte messages, as perftest",
                self.sizes[0]
            )
        };
        if s.sizes.is_empty() || self.sizes.len() == 1 {
            s.sizes = vec![mtu];
        }
        (s, Some(note))
    }
}

/// What the flags say that does not change the run (perftest accepts these and ignores
/// the flag without a word; remem perf says so).
fn warnings(a: &PerfArgs) -> Vec<String> {
    let mut w = Vec::new();
    if a.all
        && let Some(s) = a.size
    {
        w.push(format!(
            "-s {s} is ignored: -a runs every size from 2 bytes to 8 MiB"
        ));
    }
    if let (Some(n), Some(d)) = (a.iters, a.duration) {
        w.push(format!("-n {n} is ignored: -D runs the test for {d} s"));
    }
    if a.inline_size > 0 && a.test.is_read_or_atomic() {
        w.push(format!(
            "-I {} is ignored: {} sends no data inline",
            a.inline_size,
            a.test.name()
        ));
    }
    if a.report_gbits && !a.test.is_bw() {
        w.push("--report_gbits is ignored: latency tests report microseconds".into());
    }
    if a.tx_depth.is_some() && !a.test.is_bw() {
        w.push("-t is ignored: latency tests keep one operation in flight".into());
    }
    w
}

/// A server's own flags that the client's settings override (a remem perf server takes
/// its client's settings), one line each.
fn overridden(a: &PerfArgs, c: &Settings) -> Vec<String> {
    let mut d = Vec::new();
    let mut differ = |flag: String, theirs: String| {
        d.push(format!(
            "{flag} given to this server is ignored: the client's {theirs} applies"
        ))
    };
    match (a.all, a.size) {
        (true, _) if c.sizes.len() == 1 => {
            differ("-a".into(), format!("size of {} bytes", c.sizes[0]))
        }
        (false, Some(s)) if c.sizes != [s] => differ(
            format!("-s {s}"),
            if c.sizes.len() == 1 {
                format!("size of {} bytes", c.sizes[0])
            } else {
                "-a".into()
            },
        ),
        _ => {}
    }
    if let Some(n) = a.iters
        && (n != c.iters || c.duration.is_some())
    {
        differ(format!("-n {n}"), run_length(c));
    }
    if let Some(dur) = a.duration
        && c.duration != Some(Duration::from_secs(dur))
    {
        differ(format!("-D {dur}"), run_length(c));
    }
    if let Some(t) = a.tx_depth
        && t != c.tx_depth
    {
        differ(format!("-t {t}"), format!("-t {}", c.tx_depth));
    }
    if a.qps != 1 && a.qps != c.qps {
        differ(format!("-q {}", a.qps), format!("-q {}", c.qps));
    }
    if a.inline_size != 0 && a.inline_size != c.inline_size {
        differ(
            format!("-I {}", a.inline_size),
            format!("-I {}", c.inline_size),
        );
    }
    if let Some(at) = a.atomic_type
        && at != c.atomic
    {
        differ(
            format!("-A {}", at.name()),
            format!("-A {}", c.atomic.name()),
        );
    }
    if a.bidir && !c.bidir {
        differ("-b".into(), "unidirectional run".into());
    }
    if a.conn != Conn::Rc && a.conn != c.conn {
        differ(
            format!("-c {}", a.conn.name()),
            format!("-c {}", c.conn.name()),
        );
    }
    if a.api && !c.api {
        differ("--api".into(), "raw provider".into());
    }
    d
}

fn run_length(s: &Settings) -> String {
    match s.duration {
        Some(d) => format!("-D {}", d.as_secs()),
        None => format!("-n {}", s.iters),
    }
}

/// Where a side runs: its device and how its packets move.
#[derive(Debug, Clone)]
pub(crate) struct DeviceChoice {
    /// Device name (`soft@ip[:port]`, an interface's soft device, or a NIC).
    pub name: Option<String>,
    pub gid_index: Option<u8>,
    /// Soft devices: driven by the benchmark thread (no progress thread).
    pub soft_inline: bool,
    /// Soft devices with a progress thread: it busy-polls.
    pub soft_busy_poll: bool,
    /// Inline soft devices: responses leave with the next call's sends.
    pub soft_defer_responses: bool,
}

/// The port of every device.
pub(crate) const PORT: u8 = 1;

/// An open device with its GID chosen and checked.
pub(crate) struct Device {
    pub ctx: Arc<dyn Context>,
    /// The soft device to drive, when it is driven by the benchmark's thread.
    pub soft: Option<Arc<SoftContext>>,
    pub gid_index: u8,
    pub gid: Gid,
    /// The device's name.
    pub name: String,
}

/// The address of a `soft@<ip>[:<port>]` device name (UDP port 4791 when omitted, as the
/// soft provider reads its names); `None` if `name` is not of that form.
pub(crate) fn soft_addr(name: &str) -> Option<Result<SocketAddr, PerfError>> {
    remem_soft::SoftDeviceName::bound_addr(name)
        .map_err(|e| e.to_string())
        .transpose()
}

/// Opens the chosen device and checks its GID (`-x`, or the first RoCE v2 GID, IPv4
/// preferred).
pub(crate) fn open_device(choice: &DeviceChoice) -> Result<Device, PerfError> {
    let (ctx, soft): (Arc<dyn Context>, _) = match choice.name.as_deref().and_then(soft_addr) {
        Some(addr) => {
            let addr = addr?;
            let name = choice.name.as_deref().unwrap_or("soft");
            let mut opts = SoftOptions {
                inline: choice.soft_inline,
                ..SoftOptions::from_env()
            };
            if choice.soft_busy_poll {
                opts.busy_poll = Duration::MAX;
            }
            if choice.soft_defer_responses {
                opts.defer_responses = true;
            }
            let soft =
                Arc::new(SoftContext::bind_with(addr, &opts).map_err(|e| format!("{name}: {e}"))?);
            (soft.clone(), choice.soft_inline.then_some(soft))
        }
        None => (
            remem::open_device(choice.name.as_deref())
                .map_err(|e| format!("opening the device: {e}"))?,
            None,
        ),
    };
    let name = ctx.info().name.clone();
    let (gid_index, gid) = match choice.gid_index {
        Some(i) => {
            let entry = ctx
                .query_gid(PORT, u32::from(i))
                .map_err(|e| format!("{name}: GID index {i} (-x): {e}"))?;
            if entry.gid.raw() == &[0; 16] {
                return Err(format!("{name}: GID index {i} (-x) is empty"));
            }
            if entry.gid_type != GidType::RoceV2 {
                return Err(format!(
                    "{name}: GID index {i} (-x) is not a RoCE v2 GID: remem speaks RoCE v2 \
                     (`remem devices -v` lists the table)"
                ));
            }
            (i, entry.gid)
        }
        None => remem::verbs::rc::roce_v2_gid(&*ctx, PORT)
            .map(|g| (g.index as u8, g.gid))
            .map_err(|e| format!("{name}: {e}"))?,
    };
    Ok(Device {
        ctx,
        soft,
        gid_index,
        gid,
        name,
    })
}

/// The error of a benchmark run.
pub type PerfError = String;

/// Why a server did not run a client.
pub(crate) enum Refusal {
    /// The connection is not a remem perf or perftest client: the server waits for the
    /// next.
    NotAPeer(String),
    /// A client came and its run failed (or was refused): the server exits with this.
    Failed(PerfError),
}

fn ctrl_timeout(a: &PerfArgs) -> Result<Duration, PerfError> {
    if !(a.ctrl_timeout.is_finite() && a.ctrl_timeout > 0.0 && a.ctrl_timeout <= 86_400.0) {
        return Err(format!(
            "--ctrl-timeout {} outside (0, 86400] seconds",
            a.ctrl_timeout
        ));
    }
    Ok(Duration::from_secs_f64(a.ctrl_timeout))
}

/// Runs `remem perf`; prints results to stdout; returns an error message on failure.
///
/// A client's run ends with what it measured, whatever ends it: when a size fails, or on
/// Ctrl-C during a sweep (`-a`), the table is closed, the `--json` rows already printed
/// stand, and `--plot` draws the sizes done; then the error (exit status 1, 130 for
/// Ctrl-C).
pub fn run(args: &PerfArgs) -> Result<(), PerfError> {
    let settings = Settings::from_args(args)?;
    if args.plot.is_some() && !args.all {
        return Err("--plot draws a curve over sizes: use it with -a".into());
    }
    if args.perftest {
        perftest::check(&settings)?;
    }
    let timeout = ctrl_timeout(args)?;
    if args.loopback && (args.host.is_some() || args.ib_dev.is_some() || args.gid_index.is_some()) {
        return Err("--loopback picks its own soft devices: no HOST, -d or -x".into());
    }
    if args.loopback
        && let Some(dev) = std::env::var_os(remem::DEVICE_ENV).filter(|d| !d.is_empty())
    {
        return Err(format!(
            "--loopback picks its own soft devices (127.0.0.1 and 127.0.0.2), so {}={} \
             would be ignored: unset it, or run a server and a client on that device",
            remem::DEVICE_ENV,
            dev.to_string_lossy()
        ));
    }
    if let Some(path) = &args.plot {
        // Before the sweep: a plot that cannot be written fails now, not after it.
        check_plot_path(path)?;
    }
    for w in warnings(args) {
        eprintln!("remem perf: warning: {w}");
    }
    if !args.loopback && args.host.is_none() {
        return serve(args, timeout);
    }
    let mut out = Output::new(args, &settings);
    if args.all {
        watch_interrupt(&out, args, &settings)?;
    }
    let result = if let Some(host) = args.host.as_ref().filter(|_| !args.loopback) {
        // The device first: a bad -d or -x fails before anything is sent.
        open_device(&device_of(args)).and_then(|dev| {
            let stream = connect(host, args.port, timeout)?;
            client(args, &settings, stream, &dev, timeout, &mut out)
        })
    } else {
        loopback(args, &settings, timeout, &mut out)
    };
    let mut printed = lock(&out.printed);
    printed.concluded = true;
    let drawn = conclude(args, &settings, &printed, result.is_ok());
    match result {
        Ok(()) => drawn,
        Err(e) => {
            if args.all && !printed.rows.is_empty() {
                eprintln!(
                    "remem perf: stopped after {}: the results above are those of the sizes \
                     done{}",
                    sizes_done(&printed.rows),
                    match (&args.plot, drawn) {
                        (Some(p), Ok(())) => format!(", drawn in {}", p.display()),
                        (Some(_), Err(why)) => format!(" ({why})"),
                        (None, _) => String::new(),
                    }
                );
            }
            Err(e)
        }
    }
}

/// How many sizes `rows` hold, and which: `5 sizes (2 to 32 bytes)`.
fn sizes_done(rows: &[Row]) -> String {
    let size = |r: &Row| match r {
        Row::Bw(b) => b.size,
        Row::Lat(l) => l.size,
    };
    match rows {
        [] => "no size".into(),
        [one] => format!("1 size ({} bytes)", size(one)),
        [first, .., last] => format!(
            "{} sizes ({} to {} bytes)",
            rows.len(),
            size(first),
            size(last)
        ),
    }
}

/// Checks that `--plot`'s file can be written once the sweep is done: it is not a
/// folder, and its folder exists and takes new files.
fn check_plot_path(path: &std::path::Path) -> Result<(), PerfError> {
    let bad = |why: String| format!("--plot {}: {why}", path.display());
    if path.is_dir() {
        return Err(bad("a folder, not a file".into()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) => Err(bad(format!("its folder {}: {e}", dir.display()))),
        Ok(m) if !m.is_dir() => Err(bad(format!("{} is not a folder", dir.display()))),
        Ok(_) => rustix::fs::access(
            dir,
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
        )
        .map_err(|e| bad(format!("cannot write in {}: {e}", dir.display()))),
    }
}

/// What a client has printed so far, shared with the Ctrl-C watcher of a sweep
/// ([`watch_interrupt`]).
#[derive(Default)]
pub(crate) struct Printed {
    /// The table's header is out (so its closing rule is owed).
    header_done: bool,
    /// The rows, in the order they were printed.
    rows: Vec<Row>,
    /// This side's device and the peer's, once the peer said (the plot's title).
    devices: Option<(String, String)>,
    /// The run's end has been printed ([`conclude`]): nothing more to do on Ctrl-C.
    concluded: bool,
}

fn lock(p: &std::sync::Mutex<Printed>) -> std::sync::MutexGuard<'_, Printed> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends a client's output, however the run ended: the table's closing rule (and, for a
/// verified run that succeeded, the line that says so), then the plot of the rows printed.
fn conclude(args: &PerfArgs, s: &Settings, p: &Printed, ok: bool) -> Result<(), PerfError> {
    if !args.json && p.header_done {
        if ok && s.verify {
            println!("{}", report::verified(s.test));
        }
        report::print_footer();
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let Some(path) = &args.plot else {
        return Ok(());
    };
    if p.rows.is_empty() {
        return Ok(());
    }
    let unknown = || ("?".to_string(), "?".to_string());
    let title = plot::Title {
        test: s.test.name().into(),
        params: plot_params(s, p.devices.as_ref().unwrap_or(&unknown())),
    };
    plot::plot(path, &title, &p.rows, args.report_gbits)
        .map_err(|e| format!("cannot draw {}: {e}", path.display()))
}

/// During a sweep (`-a`): Ctrl-C ends the run as a failed size does — the table closed,
/// the plot of the sizes done drawn, a line that says so — and the process exits with
/// status 130. The handler is in place when this returns (before the sweep starts).
fn watch_interrupt(out: &Output, args: &PerfArgs, s: &Settings) -> Result<(), PerfError> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("cannot watch for Ctrl-C: {e}"))?;
    let mut interrupt = {
        let _in = rt.enter();
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch for Ctrl-C: {e}"))?
    };
    let (printed, args, s) = (out.printed.clone(), args.clone(), s.clone());
    std::thread::Builder::new()
        .name("remem-perf-ctrl-c".into())
        .spawn(move || {
            if rt.block_on(interrupt.recv()).is_none() {
                return;
            }
            let p = lock(&printed);
            if !p.concluded {
                let drawn = conclude(&args, &s, &p, false);
                eprintln!(
                    "remem perf: interrupted (Ctrl-C) after {}{}",
                    sizes_done(&p.rows),
                    match (&args.plot, drawn) {
                        (Some(path), Ok(())) if !p.rows.is_empty() =>
                            format!(", drawn in {}", path.display()),
                        (Some(_), Err(why)) => format!(" ({why})"),
                        _ => String::new(),
                    }
                );
            }
            std::process::exit(130);
        })
        .map_err(|e| format!("cannot watch for Ctrl-C: {e}"))?;
    Ok(())
}

/// The run's parameters as the plot's subtitle.
fn plot_params(s: &Settings, (mine, peer): &(String, String)) -> String {
    let mut p = vec![
        if s.api { "async API" } else { "raw provider" }.to_string(),
        format!(
            "{}{}",
            s.conn.name(),
            if s.bidir { ", bidirectional" } else { "" }
        ),
        format!("{mine} → {peer}"),
        format!("{} QP{}", s.qps, if s.qps == 1 { "" } else { "s" }),
    ];
    p.push(match s.duration {
        Some(d) => format!("{} s per size", d.as_secs()),
        None => format!("{} iterations per size", s.iters),
    });
    if s.test.is_bw() {
        p.push(format!("tx depth {}", s.tx_depth));
    }
    if s.test.is_atomic() {
        p.push(s.atomic.name().into());
    }
    p.join(" · ")
}

fn device_of(args: &PerfArgs) -> DeviceChoice {
    DeviceChoice {
        name: args.ib_dev.clone(),
        gid_index: args.gid_index,
        soft_inline: !args.soft_thread,
        soft_busy_poll: args.soft_busy_poll,
        soft_defer_responses: args.soft_defer_responses,
    }
}

fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, PerfError> {
    let addr =
        if host.contains(':') && !host.starts_with('[') && host.parse::<SocketAddr>().is_err() {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .collect();
    let mut last = format!("cannot resolve {addr}: no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

fn serve(args: &PerfArgs, timeout: Duration) -> Result<(), PerfError> {
    let dev = open_device(&device_of(args))?;
    let listener = TcpListener::bind(("0.0.0.0", args.port))
        .or_else(|_| TcpListener::bind(("::", args.port)))
        .map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
    eprintln!(
        "remem perf: waiting for a client on port {} (device {})",
        args.port, dev.name
    );
    loop {
        let (stream, peer) = listener
            .accept()
            .map_err(|e| format!("accept failed: {e}"))?;
        match server(stream, &dev, args, true, timeout) {
            Ok(()) => return Ok(()),
            Err(Refusal::Failed(e)) => return Err(e),
            Err(Refusal::NotAPeer(why)) => {
                eprintln!("remem perf: {peer}: {why}; waiting for another client");
            }
        }
    }
}

/// What a new connection's first byte says it is, within `timeout`.
fn first_byte(stream: &TcpStream, timeout: Duration) -> Result<u8, Refusal> {
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| Refusal::NotAPeer(e.to_string()))?;
    let mut first = [0u8];
    loop {
        return match stream.peek(&mut first) {
            Ok(0) => Err(Refusal::NotAPeer(
                "closed the connection without a word".into(),
            )),
            Ok(_) => Ok(first[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(Refusal::NotAPeer(format!(
                    "said nothing for {:.1} s: not a remem perf or perftest client",
                    timeout.as_secs_f64()
                )))
            }
            Err(e) => Err(Refusal::NotAPeer(e.to_string())),
        };
    }
}

/// The server side of one connection. A remem client sends the settings; a perftest
/// client (or any with `--perftest`) runs with this side's own flags, `local`, and
/// prints what perftest's server prints unless `!print`.
pub(crate) fn server(
    mut stream: TcpStream,
    dev: &Device,
    local: &PerfArgs,
    print: bool,
    timeout: Duration,
) -> Result<(), Refusal> {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let first = first_byte(&stream, timeout)?;
    // perftest's client speaks first: its version, as text.
    if first.is_ascii_digit() {
        let mut version = [0u8; perftest::VERSION_LEN];
        stream
            .read_exact(&mut version)
            .map_err(|e| Refusal::NotAPeer(format!("not a perftest client: {e}")))?;
        let Some(v) = perftest::parse_version(&version) else {
            return Err(Refusal::NotAPeer(format!(
                "not a remem perf or perftest client: it sent {:?}",
                String::from_utf8_lossy(&version)
            )));
        };
        if print {
            eprintln!("remem perf: client {peer} (perftest {v})");
        }
        let settings = Settings::from_args(local).map_err(Refusal::Failed)?;
        perftest::check(&settings).map_err(Refusal::Failed)?;
        let mut out = Output::new(local, &settings);
        out.quiet = !print;
        perftest::server(stream, version, &settings, dev, &mut out, timeout)
            .map_err(Refusal::Failed)?;
        out.finish();
        return Ok(());
    }
    if local.perftest {
        let mut head = [0u8; 16];
        let n = stream.peek(&mut head).unwrap_or(0);
        return Err(Refusal::NotAPeer(format!(
            "not a perftest client: it sent {:?}",
            String::from_utf8_lossy(&head[..n])
        )));
    }
    let mut ctrl = ctrl::Ctrl::new(stream, timeout).map_err(Refusal::NotAPeer)?;
    let settings = match ctrl.recv_settings() {
        Ok(s) => s,
        Err(e) => {
            // A remem perf of another version learns why.
            ctrl.fail(&e);
            return Err(Refusal::NotAPeer(e));
        }
    };
    if print {
        eprintln!("remem perf: client {peer}");
    }
    let refuse = |ctrl: &mut ctrl::Ctrl, why: String| {
        ctrl.fail(&why);
        Refusal::Failed(why)
    };
    if settings.test != local.test {
        let why = format!(
            "this server runs {}, the client asked for {}: run the same test on both sides",
            local.test.name(),
            settings.test.name()
        );
        return Err(refuse(&mut ctrl, why));
    }
    if let Err(why) = settings.check() {
        return Err(refuse(&mut ctrl, why));
    }
    if print {
        for w in overridden(local, &settings) {
            eprintln!("remem perf: warning: {w}");
        }
    }
    ctrl.send_hello(&dev.name).map_err(Refusal::Failed)?;
    if settings.api {
        api::server(ctrl, &settings, dev)
    } else {
        raw::server(ctrl, &settings, dev)
    }
    .map_err(Refusal::Failed)
}

/// A client's run: its rows go to `out` (which keeps them, and the devices' names, for
/// the plot) as they come.
fn client(
    args: &PerfArgs,
    settings: &Settings,
    stream: TcpStream,
    dev: &Device,
    timeout: Duration,
    out: &mut Output,
) -> Result<(), PerfError> {
    if args.perftest {
        out.devices(&dev.name, "a perftest peer");
        perftest::client(stream, settings, dev, out, timeout)?;
        return Ok(());
    }
    let mut ctrl = ctrl::Ctrl::new(stream, timeout)?;
    ctrl.send_settings(settings)?;
    let peer = ctrl.recv_hello()?;
    out.devices(&dev.name, &peer);
    if settings.api {
        api::client(ctrl, settings, dev, out)?;
    } else {
        raw::client(ctrl, settings, dev, out)?;
    }
    Ok(())
}

/// Tells soft device `dev` the UDP port `peer`'s soft device takes RoCEv2 packets on.
fn introduce(dev: &Device, peer: &Device) -> Result<(), PerfError> {
    let port = peer
        .ctx
        .info()
        .udp_addr
        .ok_or_else(|| format!("{}: not a soft device", peer.name))?
        .port();
    dev.ctx
        .set_peer_udp_port(peer.gid, port)
        .map_err(|e| format!("{}: the peer's UDP port: {e}", dev.name))
}

/// Both ends in this process: the server on a thread, each on its own soft device.
fn loopback(
    args: &PerfArgs,
    settings: &Settings,
    timeout: Duration,
    out: &mut Output,
) -> Result<(), PerfError> {
    let soft_inline = !args.soft_thread;
    // Each device on a free UDP port, told the other's: remem's handshake (`--api`) tells
    // each device its peer's port, but the raw exchange and the RDMA CM carry none.
    let open = |ip: &str| {
        open_device(&DeviceChoice {
            name: Some(format!("soft@{ip}:0")),
            gid_index: None,
            soft_inline,
            soft_busy_poll: args.soft_busy_poll,
            soft_defer_responses: args.soft_defer_responses,
        })
    };
    let server_dev = open("127.0.0.1")?;
    let client_dev = open("127.0.0.2")?;
    introduce(&server_dev, &client_dev)?;
    introduce(&client_dev, &server_dev)?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let tcp = listener.local_addr().map_err(|e| e.to_string())?;
    let local = args.clone();
    let server = std::thread::Builder::new()
        .name("remem-perf-server".into())
        .spawn(move || -> Result<(), PerfError> {
            let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
            // The client prints the results.
            server(stream, &server_dev, &local, false, timeout).map_err(|r| match r {
                Refusal::NotAPeer(e) | Refusal::Failed(e) => e,
            })
        })
        .map_err(|e| e.to_string())?;
    let stream = TcpStream::connect(tcp).map_err(|e| e.to_string())?;
    let result = client(args, settings, stream, &client_dev, timeout, out);
    let served = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    result?;
    served.map_err(|e| format!("server: {e}"))
}

/// Where results go: the table (or JSON lines) and the progress indicator.
pub(crate) struct Output {
    test: Test,
    json: bool,
    api: bool,
    gbits: bool,
    /// What was printed, and the rows (kept for the plot, also on failure or Ctrl-C).
    printed: Arc<std::sync::Mutex<Printed>>,
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
            printed: Arc::default(),
            progress: std::io::stderr().is_terminal(),
            quiet: false,
        }
    }

    /// This side's device and the peer's (the plot's title).
    fn devices(&self, mine: &str, peer: &str) {
        lock(&self.printed).devices = Some((mine.to_string(), peer.to_string()));
    }

    /// Whether to draw a progress indicator (stderr is a terminal).
    pub(crate) fn progress(&self) -> Option<report::Progress> {
        (self.progress && !self.quiet).then(report::Progress::new)
    }

    /// A note for the user (stderr), unless quiet.
    pub(crate) fn note(&self, what: &str) {
        if !self.quiet {
            eprintln!("remem perf: {what}");
        }
    }

    pub(crate) fn row(&mut self, settings: &Settings, row: &Row) {
        self.row_with(settings, row, None);
    }

    /// A row, with how many of its messages arrived where nothing is resent (UD and UC
    /// SEND runs: in `--json`; the table's note says it).
    pub(crate) fn row_with(
        &mut self,
        settings: &Settings,
        row: &Row,
        delivery: Option<report::Delivery>,
    ) {
        // Held while printing: a Ctrl-C meanwhile waits for the row to be out.
        let mut printed = lock(&self.printed);
        printed.rows.push(*row);
        if self.quiet {
            return;
        }
        if self.json {
            println!(
                "{}",
                report::json(self.test, self.api, settings, row, delivery)
            );
            let _ = std::io::Write::flush(&mut std::io::stdout());
            return;
        }
        if !printed.header_done {
            printed.header_done = true;
            report::print_header(self.test, self.api, settings, self.gbits);
        }
        report::print_row(row, self.gbits);
    }

    /// A server's end of the table (a client's is [`conclude`]).
    fn finish(&self) {
        if !self.json && lock(&self.printed).header_done {
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

    fn args(args: &[&str]) -> PerfArgs {
        Cli::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .perf
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
        let s = parse(&["send_bw", "-a", "--report_gbits", "-F"]).unwrap();
        assert_eq!(s.sizes.len(), 23);
        assert_eq!((s.sizes[0], s.sizes[22]), (2, 8 << 20));
        let s = parse(&["send_bw", "-D", "2"]).unwrap();
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
        // Buffers: 2 × 1 GiB × 16 QPs is more than a side allocates.
        assert!(parse(&["write_bw", "-s", "1073741824", "-q", "16"]).is_err());
        assert!(parse(&["write_bw", "-a", "-q", "1024"]).is_ok());
    }

    /// Flags perftest refuses are refused, each with a message that names the flag.
    #[test]
    fn flags_that_do_not_apply_are_errors_as_in_perftest() {
        for (args, names) in [
            (&["write_bw", "-A", "CMP_AND_SWAP"][..], "-A"),
            (&["read_lat", "-A", "FETCH_AND_ADD"], "-A"),
            (&["write_lat", "-b"], "-b"),
            (&["send_lat", "-b"], "-b"),
            (&["write_bw", "-a", "-D", "2"], "-D"),
            (&["write_bw", "-c", "UD"], "-c UD"),
            (&["read_bw", "-c", "UD"], "-c UD"),
            (
                &["read_bw", "-c", "UC"],
                "UC connection not possible in READ/ATOMIC verbs",
            ),
            (
                &["atomic_lat", "-c", "UC"],
                "UC connection not possible in READ/ATOMIC verbs",
            ),
            (&["send_bw", "-c", "UD", "--api"], "--api"),
            (&["write_bw", "-c", "UC", "--api"], "-c UC"),
            (&["write_bw", "-b", "--api"], "--api"),
        ] {
            let err = parse(args).expect_err(&format!("{args:?} was accepted"));
            assert!(err.contains(names), "{args:?}: {err}");
        }
        assert!(parse(&["send_bw", "-c", "XRC"]).is_err());
    }

    #[test]
    fn new_perftest_flags_parse() {
        let s = parse(&["send_bw", "-c", "UD", "-b", "-q", "2"]).unwrap();
        assert_eq!((s.conn, s.bidir, s.qps), (Conn::Ud, true, 2));
        let s = parse(&["send_lat", "-c", "ud"]).unwrap();
        assert_eq!((s.conn, s.bidir), (Conn::Ud, false));
        for test in ["write_bw", "send_bw", "write_lat", "send_lat"] {
            let s = parse(&[test, "-c", "UC"]).unwrap();
            assert_eq!(s.conn, Conn::Uc, "{test}");
        }
        let s = parse(&["send_bw", "-c", "uc", "-b", "-q", "4"]).unwrap();
        assert_eq!((s.conn, s.bidir, s.qps), (Conn::Uc, true, 4));
        // UC messages are not cut to the MTU (only UD's are).
        let (fit, note) = parse(&["send_bw", "-c", "UC", "-s", "65536"])
            .unwrap()
            .fit_path_mtu(1024);
        assert_eq!((fit.sizes, note), (vec![65536], None));
        let s = parse(&["atomic_bw", "-b"]).unwrap();
        assert!(s.bidir);
        assert_eq!(s.atomic, AtomicType::FetchAndAdd);
    }

    /// Flags perftest ignores without a word: remem perf runs, and says so.
    #[test]
    fn flags_that_change_nothing_are_warned_about() {
        let cases: [(&[&str], &str); 5] = [
            (&["write_bw", "-a", "-s", "4096"], "-s 4096 is ignored"),
            (&["write_bw", "-n", "10", "-D", "2"], "-n 10 is ignored"),
            (&["read_bw", "-I", "64"], "-I 64 is ignored"),
            (
                &["write_lat", "--report_gbits"],
                "--report_gbits is ignored",
            ),
            (&["read_lat", "-t", "16"], "-t is ignored"),
        ];
        for (a, want) in cases {
            assert!(parse(a).is_ok(), "{a:?}");
            let w = warnings(&args(a));
            assert!(w.iter().any(|w| w.contains(want)), "{a:?}: {w:?}");
        }
        assert!(warnings(&args(&["write_bw", "-s", "4096", "-n", "10"])).is_empty());
    }

    #[test]
    fn a_servers_own_flags_that_the_client_overrides_are_named() {
        let client = parse(&["write_bw", "-s", "65536", "-n", "100"]).unwrap();
        let w = overridden(&args(&["write_bw", "-s", "4096", "-q", "2"]), &client);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("-s 4096") && w[0].contains("65536 bytes"),
            "{w:?}"
        );
        assert!(w[1].contains("-q 2"), "{w:?}");
        // Flags the client also gave, with the same values, are not named.
        assert!(overridden(&args(&["write_bw", "-s", "65536", "-n", "100"]), &client).is_empty());
        assert!(overridden(&args(&["write_bw"]), &client).is_empty());
    }

    #[test]
    fn ud_sizes_fit_the_path_mtu() {
        let s = parse(&["send_bw", "-c", "UD", "-a"]).unwrap();
        let (fit, note) = s.fit_path_mtu(1024);
        assert_eq!(fit.sizes, (1..=10).map(|p| 1u64 << p).collect::<Vec<_>>());
        assert!(note.unwrap().contains("1024"));
        let s = parse(&["send_bw", "-c", "UD"]).unwrap();
        let (fit, note) = s.fit_path_mtu(4096);
        assert_eq!(fit.sizes, [4096]);
        assert!(note.unwrap().contains("-s 65536"));
        let s = parse(&["send_bw", "-c", "UD", "-s", "100"]).unwrap();
        assert_eq!(s.fit_path_mtu(1024), (s.clone(), None));
        // RC messages are not bounded by the MTU.
        let s = parse(&["send_bw"]).unwrap();
        assert_eq!(s.fit_path_mtu(1024), (s.clone(), None));
    }

    #[test]
    fn soft_device_names_default_to_the_rocev2_port() {
        let addr = |n: &str| soft_addr(n).unwrap().unwrap();
        assert_eq!(addr("soft@10.0.0.1"), "10.0.0.1:4791".parse().unwrap());
        assert_eq!(addr("soft@10.0.0.1:7000"), "10.0.0.1:7000".parse().unwrap());
        assert_eq!(addr("soft@::1"), "[::1]:4791".parse().unwrap());
        assert_eq!(addr("soft@[::1]:7000"), "[::1]:7000".parse().unwrap());
        assert!(soft_addr("soft@nope").unwrap().is_err());
        assert!(soft_addr("rxe0").is_none());
    }

    #[test]
    fn test_codes_round_trip() {
        for (t, name) in TESTS {
            assert_eq!(Test::from_code(t.code()), Some(t));
            assert_eq!(name.parse::<Test>().unwrap(), t);
        }
    }
}
