//! perftest's out-of-band exchange, so that `remem perf --perftest` runs against
//! perftest's own `ib_*` tools, either side serving.
//!
//! perftest (its `perftest_communication.c`, the protocol of its 5.70+ releases, as
//! perftest 6.06 = Debian's 4.5-0.17 speaks it) connects over TCP, port 18515. Every
//! exchange is symmetric: the client writes its message and then reads the server's of
//! the same length; the server reads first. In order:
//!
//! 1. the version, 16 bytes of NUL-padded text (`"6.06"`); peers older than 5.70 are
//!    refused, as perftest refuses them;
//! 2. the cycle buffer (page size) and the cache line size, each a 32-bit big-endian
//!    integer; both sides take the larger;
//! 3. the path MTU, two bytes: the `enum ibv_mtu` value in decimal and a NUL; both take
//!    the smaller;
//! 4. per QP, a 108-byte text message (perftest's `KEY_PRINT_FMT_GID`):
//!    `lid:out_reads:qpn:psn:rkey:vaddr:` (hex, 4/4/6/6/8/16 digits), the 16 GID bytes as
//!    two hex digits and a colon each, the SRQ number (8 digits) and a colon, NUL-padded.
//!    These "handshakes" also serve as barriers: each tool runs a fixed sequence of them
//!    (before and after moving its QPs to RTR/RTS, before and after the run), which this
//!    module follows test by test;
//! 5. bandwidth tests (WRITE, READ, atomics): after the run, the client's result (size and
//!    iterations as 64-bit big-endian integers, peak and average bandwidth and message
//!    rate as big-endian doubles, in MB/sec (2^20) or Gb/sec and Mpps), which the server
//!    prints;
//! 6. a last handshake and `"done\0"` from each side.
//!
//! Bidirectional runs (`-b`, perftest's duplex; bandwidth tests) run the test on both
//! sides at once. WRITE, READ and atomics: per size a handshake, the run, with `-a` a
//! handshake more, then both sides' reports; SEND: per size a handshake (receives
//! posted), the run (sending and receiving), the reports, and with `-a` a handshake. Each
//! side prints the sum of both directions (its own iteration count), as perftest does.
//!
//! UD (`-c UD`, SEND tests): UD QPs with perftest's Q_Key (0x11111111), an address handle
//! from the peer's GID per QP, 40 bytes for the GRH at the start of each receive buffer,
//! messages of at most the path MTU (`-a` stops there, a larger `-s` becomes the MTU). A
//! UD receiver knows the sender is done when it moves on to the next exchange on the TCP
//! connection; lost datagrams are reported, not waited for.
//!
//! UC (`-c UC`, WRITE and SEND tests; perftest refuses READ and atomics on UC): UC QPs
//! brought up with the attributes UC takes (RTR: path, peer QPN and PSN; RTS: the PSN),
//! messages of any size. As on UD, a SEND receiver does not wait for messages lost on the
//! way (UC does not retransmit; it drops a message that finds no receive posted).
//!
//! The steps before the run are bounded by the control timeout (a perftest peer that
//! says nothing, or one whose sequence of handshakes differs because it runs another
//! test, is an error, not a hang); a peer running a READ or atomic tool against another
//! test is named (its `out_reads` above 1).
//!
//! The remote address a peer gets (`vaddr`) is this side's receive area of that QP; it
//! holds at least the cycle buffer, since perftest spreads its operations over that many
//! bytes. WRITE latency is perftest's ping-pong on memory: each side writes `size` bytes
//! whose last byte counts the iterations (mod 256) and polls the last byte of its own
//! area for the peer's count; the server writes first. SEND latency is perftest's
//! message ping-pong; the client sends first.

use super::raw::{self, Endpoint, RD_ATOMIC, Side, UD_GRACE};
use super::report::{self, BwRow, LatRow, Row};
use super::{Device, Output, PerfError, Settings, Test};
use remem::verbs::{Gid, Mtu, SendFlags, WorkCompletion};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The perftest version whose exchange this module speaks (sent as ours).
pub(crate) const VERSION: &str = "6.06";
/// The oldest perftest version accepted as a peer (perftest refuses older ones too).
const MIN_PEER_VERSION: f64 = 5.70;
/// Bytes of the version message.
pub(crate) const VERSION_LEN: usize = 16;
/// Bytes of one QP's message (perftest's `KEY_MSG_SIZE_GID`).
const DEST_LEN: usize = 108;
/// This side's cycle buffer (perftest's default: the page size) and cache line.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// Bounds on what a peer may ask for the cycle buffer (perftest sends its page size: 4 KiB,
/// 64 KiB on some arm64 and ppc64 kernels) and cache line.
const MAX_CYCLE_BUFFER: u32 = 1 << 21;
const MAX_CACHE_LINE: u32 = 4096;

/// One QP's connection data (perftest's `struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dest {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// RDMA READs and atomics the sender accepts in flight (its `max_dest_rd_atomic`).
    pub out_reads: u16,
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The first packet sequence number (24 bits).
    pub psn: u32,
    /// The remote key of `vaddr`.
    pub rkey: u32,
    /// Where the peer's operations go.
    pub vaddr: u64,
    /// The GID.
    pub gid: [u8; 16],
    /// The SRQ number (XRC and DC only; 0 here).
    pub srqn: u32,
}

impl Dest {
    /// The 108-byte message.
    pub(crate) fn encode(&self) -> [u8; DEST_LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            text.push_str(&format!("{b:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; DEST_LEN];
        // 107 characters and the NUL: always fits.
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a message; `None` unless it has every field, each in range.
    pub(crate) fn decode(msg: &[u8]) -> Option<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).ok()?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() < 23 {
            return None;
        }
        let hex = |i: usize, max: u64| -> Option<u64> {
            let f = fields[i];
            if f.is_empty() || f.len() > 16 {
                return None;
            }
            u64::from_str_radix(f, 16).ok().filter(|&v| v <= max)
        };
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(6 + i, 0xff)? as u8;
        }
        Some(Dest {
            lid: hex(0, 0xffff)? as u16,
            out_reads: hex(1, 0xffff)? as u16,
            qpn: hex(2, 0xff_ffff)? as u32,
            psn: hex(3, 0xff_ffff)? as u32,
            rkey: hex(4, 0xffff_ffff)? as u32,
            vaddr: hex(5, u64::MAX)?,
            gid,
            srqn: hex(22, 0xffff_ffff)? as u32,
        })
    }
}

/// The version message: `version` NUL-padded to 16 bytes.
fn version_message(version: &str) -> [u8; VERSION_LEN] {
    let mut out = [0u8; VERSION_LEN];
    let n = version.len().min(VERSION_LEN - 1);
    out[..n].copy_from_slice(&version.as_bytes()[..n]);
    out
}

/// The number a version message starts with (as C's `atof` reads it).
pub(crate) fn parse_version(msg: &[u8]) -> Option<f64> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = std::str::from_utf8(&msg[..end]).ok()?;
    let num: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}

/// The MTU message: the `enum ibv_mtu` value in decimal and a NUL.
fn mtu_message(mtu: Mtu) -> [u8; 2] {
    [b'0' + mtu as u8, 0]
}

/// The MTU a peer's message names, if it names one of the five.
fn parse_mtu(msg: &[u8]) -> Option<Mtu> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = std::str::from_utf8(&msg[..end]).ok()?;
    Mtu::from_ibv(text.parse().ok()?)
}

/// A bandwidth result as perftest exchanges it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Report {
    size: u64,
    iters: u64,
    bw_peak: f64,
    bw_avg: f64,
    msg_rate_mpps: f64,
}

impl Report {
    fn from_row(r: &BwRow, gbits: bool) -> Report {
        Report {
            size: r.size,
            iters: r.iterations,
            bw_peak: report::table_bw(r.peak_bps, gbits),
            bw_avg: report::table_bw(r.avg_bps, gbits),
            msg_rate_mpps: r.msg_rate / 1e6,
        }
    }

    /// The row, reading bandwidth in the unit this side reports in (as perftest does:
    /// both sides are expected to run with the same flags).
    fn to_row(self, gbits: bool) -> BwRow {
        let bps = |v: f64| {
            if gbits {
                v * 1e9 / 8.0
            } else {
                v * f64::from(1u32 << 20)
            }
        };
        BwRow {
            size: self.size,
            iterations: self.iters,
            peak_bps: bps(self.bw_peak),
            avg_bps: bps(self.bw_avg),
            msg_rate: self.msg_rate_mpps * 1e6,
        }
    }
}

/// The TCP connection, with perftest's role: the client writes first.
struct Wire {
    stream: TcpStream,
    client: bool,
    /// How long the peer may take to answer; `None` once the runs begin (a handshake may
    /// then wait for the peer's whole run).
    limit: Option<Duration>,
}

impl Wire {
    fn timed_out(&self) -> PerfError {
        format!(
            "no answer from the perftest peer in {:.1} s (before the run; the peer may run \
             another test or other flags: perftest's tools need the same test and flags on \
             both sides)",
            self.limit.unwrap_or_default().as_secs_f64()
        )
    }

    /// Reads exactly `buf.len()` bytes; a soft device driven by this thread keeps moving
    /// packets meanwhile (the peer may be running its test against this side's memory).
    fn read(&mut self, buf: &mut [u8], side: Option<&Side>) -> Result<(), PerfError> {
        let drive = side.filter(|s| s.drives());
        self.stream
            .set_nonblocking(drive.is_some())
            .map_err(|e| e.to_string())?;
        let deadline = self.limit.map(|l| Instant::now() + l);
        let mut got = 0;
        while got < buf.len() {
            if drive.is_none() {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                if left.is_some_and(|l| l.is_zero()) {
                    return Err(self.timed_out());
                }
                self.stream
                    .set_read_timeout(left)
                    .map_err(|e| e.to_string())?;
            }
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return Err("the perftest peer closed the connection".into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    match drive {
                        Some(s) => {
                            if deadline.is_some_and(|d| Instant::now() >= d) {
                                return Err(self.timed_out());
                            }
                            s.drive(Duration::from_millis(1))?;
                        }
                        None if deadline.is_some_and(|d| Instant::now() >= d) => {
                            return Err(self.timed_out());
                        }
                        None => {}
                    }
                }
                Err(e) => return Err(format!("perftest connection: {e}")),
            }
        }
        Ok(())
    }

    fn write(&mut self, msg: &[u8]) -> Result<(), PerfError> {
        self.stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        self.stream
            .set_write_timeout(self.limit)
            .map_err(|e| e.to_string())?;
        self.stream
            .write_all(msg)
            .map_err(|e| format!("perftest connection: {e}"))
    }

    /// Whether the peer has sent something this side has not read yet (it has finished
    /// its run and moved on to the next exchange), or closed the connection.
    fn peer_moved_on(&mut self) -> Result<bool, PerfError> {
        self.stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let mut b = [0u8];
        let r = self.stream.peek(&mut b);
        self.stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        match r {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Ok(false)
            }
            Err(e) => Err(format!("perftest connection: {e}")),
        }
    }

    /// One exchange: this side's message for the peer's of the same length.
    fn xchg(&mut self, mine: &[u8], side: Option<&Side>) -> Result<Vec<u8>, PerfError> {
        let mut theirs = vec![0u8; mine.len()];
        if self.client {
            self.write(mine)?;
            self.read(&mut theirs, side)?;
        } else {
            self.read(&mut theirs, side)?;
            self.write(mine)?;
        }
        Ok(theirs)
    }

    /// A handshake: one QP's data for the peer's.
    fn hand_shake(&mut self, mine: &Dest, side: &Side) -> Result<Dest, PerfError> {
        let theirs = self.xchg(&mine.encode(), Some(side))?;
        Dest::decode(&theirs).ok_or_else(|| {
            format!(
                "malformed QP data from the perftest peer: {:?}",
                String::from_utf8_lossy(&theirs)
            )
        })
    }

    fn xchg_u32(&mut self, v: u32) -> Result<u32, PerfError> {
        let b = self.xchg(&v.to_be_bytes(), None)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn xchg_u64(&mut self, v: u64, side: &Side) -> Result<u64, PerfError> {
        let b = self.xchg(&v.to_be_bytes(), Some(side))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_be_bytes(a))
    }

    /// The bandwidth reports (perftest's `xchg_bw_reports` with a 5.33+ peer, without
    /// per-port figures).
    fn xchg_report(&mut self, mine: &Report, side: &Side) -> Result<Report, PerfError> {
        // Field by field in perftest's order, each its own exchange; doubles as their
        // big-endian bytes.
        let size = self.xchg_u64(mine.size, side)?;
        let iters = self.xchg_u64(mine.iters, side)?;
        let bw_peak = f64::from_bits(self.xchg_u64(mine.bw_peak.to_bits(), side)?);
        let bw_avg = f64::from_bits(self.xchg_u64(mine.bw_avg.to_bits(), side)?);
        let msg_rate_mpps = f64::from_bits(self.xchg_u64(mine.msg_rate_mpps.to_bits(), side)?);
        Ok(Report {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate_mpps,
        })
    }

    /// perftest's `ctx_close_connection`: a last handshake, then `"done"` (not read by
    /// either side).
    fn close(mut self, mine: &Dest, side: &Side) -> Result<(), PerfError> {
        self.hand_shake(mine, side)?;
        self.write(b"done\0")
    }
}

/// Why `s` cannot run against perftest, if it cannot.
pub(crate) fn check(s: &Settings) -> Result<(), PerfError> {
    if s.api {
        return Err("--perftest runs on the raw provider: no --api".into());
    }
    if s.duration.is_some() {
        return Err("--perftest runs a number of iterations: use -n, not -D".into());
    }
    if s.verify {
        return Err("--verify needs remem perf on both sides: not with --perftest".into());
    }
    Ok(())
}

/// Serves one perftest client (`ib_*` with this host's address) with `s` from this
/// side's own flags; `version` is the client's first message, already read. Prints what
/// perftest's server prints.
pub(crate) fn server(
    stream: TcpStream,
    version: [u8; VERSION_LEN],
    s: &Settings,
    dev: &Device,
    out: &mut Output,
    timeout: Duration,
) -> Result<Vec<Row>, PerfError> {
    run(stream, Some(version), s, dev, out, timeout)
}

/// Runs `s` against a perftest server.
pub(crate) fn client(
    stream: TcpStream,
    s: &Settings,
    dev: &Device,
    out: &mut Output,
    timeout: Duration,
) -> Result<Vec<Row>, PerfError> {
    run(stream, None, s, dev, out, timeout)
}

fn is_v4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Runs the exchange and the test; `their_version` is a client's version message when
/// this side serves (read already to tell a perftest client from a remem one).
fn run(
    stream: TcpStream,
    their_version: Option<[u8; VERSION_LEN]>,
    s: &Settings,
    dev: &Device,
    out: &mut Output,
    timeout: Duration,
) -> Result<Vec<Row>, PerfError> {
    check(s)?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let client = their_version.is_none();
    let mut w = Wire {
        stream,
        client,
        limit: Some(timeout),
    };

    let theirs = match their_version {
        Some(v) => {
            w.write(&version_message(VERSION))?;
            v.to_vec()
        }
        None => w.xchg(&version_message(VERSION), None)?,
    };
    let peer = parse_version(&theirs).unwrap_or(0.0);
    if peer < MIN_PEER_VERSION {
        return Err(format!(
            "the peer speaks perftest {:?}; versions before {MIN_PEER_VERSION} are not supported",
            String::from_utf8_lossy(&theirs).trim_end_matches('\0')
        ));
    }
    let cycle = w.xchg_u32(CYCLE_BUFFER)?.max(CYCLE_BUFFER);
    let cache_line = w.xchg_u32(CACHE_LINE)?.max(CACHE_LINE);
    if cycle > MAX_CYCLE_BUFFER || cache_line > MAX_CACHE_LINE {
        return Err(format!(
            "the perftest peer asks for a cycle buffer of {cycle} bytes and a cache line of \
             {cache_line}: more than this side allows"
        ));
    }
    // Each QP's area: the largest message or the cycle buffer, whole cache lines.
    let min_area = (cycle as usize).div_ceil(cache_line as usize) * cache_line as usize;
    let mut side = Side::new(s, dev, min_area)?;
    let theirs = w.xchg(&mtu_message(side.mtu), Some(&side))?;
    let mtu = parse_mtu(&theirs).map_or(side.mtu, |m| m.min(side.mtu));
    // UD messages are at most the path MTU (perftest's check_mtu and size clamp).
    let (fit, note) = s.fit_path_mtu(u64::from(mtu.bytes()));
    if let Some(n) = note {
        out.note(&n);
    }
    let s = &fit;

    let reads = s.test.is_read_or_atomic();
    let mine: Vec<Dest> = side
        .endpoints()
        .iter()
        .map(|e| Dest {
            lid: 0,
            out_reads: if reads { u16::from(RD_ATOMIC) } else { 1 },
            qpn: e.qpn,
            psn: e.psn,
            rkey: e.rkey,
            vaddr: e.addr,
            gid: *e.gid.raw(),
            srqn: 0,
        })
        .collect();
    let mut remote = Vec::with_capacity(mine.len());
    // write_lat, read_lat and atomic_lat begin with one handshake more (send_lat does
    // not).
    if matches!(s.test, Test::WriteLat | Test::ReadLat | Test::AtomicLat) {
        w.hand_shake(&mine[0], &side)?;
    }
    for d in &mine {
        remote.push(w.hand_shake(d, &side)?);
    }
    if is_v4_mapped(&mine[0].gid) != is_v4_mapped(&remote[0].gid) {
        return Err(
            "the perftest peer's GID is of the other IP version: pick GIDs of one \
                    version (-x)"
                .into(),
        );
    }
    // perftest's READ and atomic tools accept their device's outstanding READs; the
    // others send 1. A peer that accepts more runs another test than this side.
    if !reads && remote.iter().any(|r| r.out_reads > 1) {
        return Err(format!(
            "the perftest peer runs a READ or atomic test (it accepts {} outstanding READs), \
             this side {}: run the same test on both sides",
            remote[0].out_reads,
            s.test.name()
        ));
    }
    let endpoints: Vec<Endpoint> = remote
        .iter()
        .map(|r| Endpoint {
            qpn: r.qpn,
            psn: r.psn,
            gid: Gid(r.gid),
            mtu: mtu.bytes(),
            addr: r.vaddr,
            rkey: r.rkey,
        })
        .collect();
    let rd_atomic = remote
        .iter()
        .map(|r| r.out_reads)
        .min()
        .unwrap_or(1)
        .clamp(1, u16::from(RD_ATOMIC)) as u8;
    side.connect(&endpoints, rd_atomic)?;
    if s.test.is_send() {
        w.hand_shake(&mine[0], &side)?;
        for d in &mine {
            w.hand_shake(d, &side)?;
        }
    } else {
        for d in &mine {
            w.hand_shake(d, &side)?;
        }
        w.hand_shake(&mine[0], &side)?;
    }
    // From here on a handshake may wait for the peer's run.
    w.limit = None;

    let mut rows = Vec::new();
    let gbits = out.gbits;
    let all = s.sizes.len() > 1;
    match s.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw if s.bidir => {
            // perftest's duplex: a handshake before each size's run, one after it with
            // -a, then the reports; each side prints the sum of both.
            for &size in &s.sizes {
                w.hand_shake(&mine[0], &side)?;
                let mut progress = out.progress();
                let (row, _) = raw::bandwidth(&side, s, &endpoints, size, &mut 0, &mut progress)?;
                drop(progress);
                if all {
                    w.hand_shake(&mine[0], &side)?;
                }
                let theirs = w.xchg_report(&Report::from_row(&row, gbits), &side)?;
                let row = Row::Bw(report::both_ways(&row, &theirs.to_row(gbits)));
                out.row(s, &row);
                rows.push(row);
            }
            w.close(&mine[0], &side)?;
        }
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => {
            if client {
                let mut last = None;
                for &size in &s.sizes {
                    let mut progress = out.progress();
                    let (row, _) =
                        raw::bandwidth(&side, s, &endpoints, size, &mut 0, &mut progress)?;
                    drop(progress);
                    out.row(s, &Row::Bw(row));
                    rows.push(Row::Bw(row));
                    last = Some(row);
                }
                w.hand_shake(&mine[0], &side)?;
                let mine_report = last.map(|r| Report::from_row(&r, gbits));
                w.xchg_report(&mine_report.unwrap_or(EMPTY_REPORT), &side)?;
            } else {
                // The client runs; its result comes at the end, to be printed here.
                w.hand_shake(&mine[0], &side)?;
                let theirs = w.xchg_report(&EMPTY_REPORT, &side)?;
                let row = Row::Bw(theirs.to_row(gbits));
                out.row(s, &row);
                rows.push(row);
            }
            w.close(&mine[0], &side)?;
        }
        Test::SendBw => {
            let expected = s.iters * u64::from(s.qps);
            for &size in &s.sizes {
                // perftest's side posts its receives, then this handshake.
                w.hand_shake(&mine[0], &side)?;
                let row = if s.bidir {
                    let mut progress = out.progress();
                    let mut got = 0;
                    let (row, _) =
                        raw::bandwidth(&side, s, &endpoints, size, &mut got, &mut progress)?;
                    drop(progress);
                    receive_from_peer(&side, &mut got, expected, &mut w, timeout, |_| {})?;
                    let theirs = w.xchg_report(&Report::from_row(&row, gbits), &side)?;
                    report::both_ways(&row, &theirs.to_row(gbits))
                } else if client {
                    let mut progress = out.progress();
                    let (row, _) =
                        raw::bandwidth(&side, s, &endpoints, size, &mut 0, &mut progress)?;
                    row
                } else {
                    receive_bw(&side, size, expected, &mut w, timeout)?
                };
                out.row(s, &Row::Bw(row));
                rows.push(Row::Bw(row));
                if all {
                    w.hand_shake(&mine[0], &side)?;
                }
            }
            w.close(&mine[0], &side)?;
        }
        Test::ReadLat | Test::AtomicLat => {
            if client {
                for &size in &s.sizes {
                    let mut progress = out.progress();
                    let row = raw::latency(&side, s, &endpoints[0], size, &mut progress)?;
                    out.row(s, &Row::Lat(row));
                    rows.push(Row::Lat(row));
                }
            }
            // The server's handshake waits here while the client reads or updates its
            // memory.
            w.close(&mine[0], &side)?;
        }
        Test::WriteLat => {
            for &size in &s.sizes {
                let row = write_ping_pong(&side, s, &endpoints[0], size, client)?;
                out.row(s, &Row::Lat(row));
                rows.push(Row::Lat(row));
            }
            // perftest's write_lat ends without a closing exchange.
        }
        Test::SendLat => {
            for &size in &s.sizes {
                // perftest posts its receives, then this handshake (once per size).
                w.hand_shake(&mine[0], &side)?;
                let row = send_ping_pong(&side, s, &endpoints[0], size, client)?;
                out.row(s, &Row::Lat(row));
                rows.push(Row::Lat(row));
            }
            w.close(&mine[0], &side)?;
        }
    }
    Ok(rows)
}

/// What the side without a result of its own sends in the report exchange.
const EMPTY_REPORT: Report = Report {
    size: 0,
    iters: 0,
    bw_peak: 0.0,
    bw_avg: 0.0,
    msg_rate_mpps: 0.0,
};

/// Receives (and reposts) until `got` reaches `expected`, calling `arrived` with the new
/// total after each batch. The peer has sent everything once it moves on to the next
/// exchange on the TCP connection: then on UD the wait ends [`raw::UD_GRACE`] after the
/// last arrival (lost datagrams never come); on RC, where nothing is lost, a peer that
/// moved on with messages missing for `timeout` sent fewer than `expected` (other `-n` or
/// `-q` than this side): an error.
fn receive_from_peer(
    side: &Side,
    got: &mut u64,
    expected: u64,
    w: &mut Wire,
    timeout: Duration,
    mut arrived: impl FnMut(u64),
) -> Result<(), PerfError> {
    let mut wcs = [WorkCompletion::default(); 64];
    let mut last = Instant::now();
    let quiet = if side.unreliable() { UD_GRACE } else { timeout };
    while *got < expected {
        if side.take_recvs(&mut wcs, got)? > 0 {
            last = Instant::now();
            arrived(*got);
            side.drive(Duration::ZERO)?;
            continue;
        }
        if last.elapsed() >= quiet && w.peer_moved_on()? {
            if side.unreliable() {
                return Ok(());
            }
            return Err(format!(
                "the perftest peer sent {got} of the {expected} messages this side expects \
                 (-n × -q): run both sides with the same flags"
            ));
        }
        side.drive(Duration::from_micros(200))?;
    }
    Ok(())
}

/// A SEND bandwidth server: receives (and reposts) `expected` messages (fewer on UD or UC
/// when some are lost); the time runs from the first to the last.
fn receive_bw(
    side: &Side,
    size: u64,
    expected: u64,
    w: &mut Wire,
    timeout: Duration,
) -> Result<BwRow, PerfError> {
    let mut marks: Vec<(f64, u64)> = Vec::with_capacity(4096);
    let mut start = None;
    let mut got = 0;
    receive_from_peer(side, &mut got, expected, w, timeout, |total| {
        let t0 = *start.get_or_insert_with(Instant::now);
        marks.push((t0.elapsed().as_secs_f64(), total));
    })?;
    if got < expected {
        eprintln!(
            "remem perf: {size} B: {got} of {expected} messages arrived ({} does not \
             retransmit)",
            side.conn_name()
        );
    }
    Ok(report::bw_row(size, &marks))
}

/// perftest's WRITE latency ping-pong (`run_iter_lat_write`): the server writes first;
/// each side waits for the peer's count in the last byte of its own area before writing
/// the next. Latency is half the time between consecutive posts.
fn write_ping_pong(
    side: &Side,
    s: &Settings,
    remote: &Endpoint,
    size: u64,
    client: bool,
) -> Result<LatRow, PerfError> {
    let iters = s.iters;
    let op = side.op(s, remote);
    let sge = [side.local(s, 0, size)];
    let flags = side.flags(s, size) | SendFlags::SIGNALED;
    let post_at = side.src_area(0) + size as usize - 1;
    let poll_at = side.recv_area(0) + size as usize - 1;
    let mut wcs = [WorkCompletion::default(); 1];
    let mut byte = [0u8];
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    let mut posted: Vec<Instant> = Vec::with_capacity(iters.min(1 << 24) as usize);
    while scnt < iters || ccnt < iters || rcnt < iters {
        // The server writes first; after that each side waits for the peer's count.
        if rcnt < iters && (client || scnt >= 1) {
            rcnt += 1;
            loop {
                side.buf
                    .read(poll_at, &mut byte)
                    .map_err(|e| e.to_string())?;
                if byte[0] == rcnt as u8 {
                    break;
                }
                side.drive(Duration::ZERO)?;
            }
        }
        if scnt < iters {
            scnt += 1;
            side.buf
                .write(post_at, &[scnt as u8])
                .map_err(|e| e.to_string())?;
            posted.push(Instant::now());
            let mut wr = side.wr(0, scnt, op, &sge);
            wr.flags = flags;
            side.qps[0]
                .post_send(&[wr])
                .map_err(|e| format!("post_send: {}", e.error))?;
        }
        if ccnt < iters {
            loop {
                side.drive(Duration::ZERO)?;
                if side.poll(&mut wcs)? > 0 {
                    ccnt += 1;
                    break;
                }
            }
        }
    }
    Ok(half_round_trips(size, &posted))
}

/// A ping-pong's latency row, as perftest computes it: half the time between consecutive
/// posts, over the iterations run (one sample fewer).
fn half_round_trips(size: u64, posted: &[Instant]) -> LatRow {
    let mut samples: Vec<f64> = posted
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect();
    LatRow {
        iterations: posted.len() as u64,
        ..report::lat_row(size, &mut samples)
    }
}

/// perftest's SEND latency ping-pong (`run_iter_lat_send`): the client sends first; each
/// side waits for the peer's message before sending the next. Latency is half the time
/// between consecutive posts.
fn send_ping_pong(
    side: &Side,
    s: &Settings,
    remote: &Endpoint,
    size: u64,
    client: bool,
) -> Result<LatRow, PerfError> {
    let iters = s.iters;
    let op = side.op(s, remote);
    let sge = [side.local(s, 0, size)];
    let flags = side.flags(s, size);
    let mut wcs = [WorkCompletion::default(); 64];
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut posted: Vec<Instant> = Vec::with_capacity(iters.min(1 << 24) as usize);
    while scnt < iters || rcnt < iters {
        // The server waits first; after that each side waits for the peer's message.
        if rcnt < iters && (!client || scnt >= 1) {
            raw::wait_recv(side, &mut wcs, &mut || Ok(()))?;
            rcnt += 1;
        }
        if scnt < iters {
            posted.push(Instant::now());
            raw::post(side, 0, op, &sge, flags, scnt)?;
            scnt += 1;
            side.drive(Duration::ZERO)?;
        }
    }
    Ok(half_round_trips(size, &posted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest() -> Dest {
        Dest {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x5555_dead_b000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2],
            srqn: 0,
        }
    }

    #[test]
    fn dest_message_is_perftests_format() {
        let m = dest().encode();
        assert_eq!(m.len(), 108);
        let text = std::str::from_utf8(&m[..107]).unwrap();
        assert_eq!(
            text,
            "0000:0080:000011:abcdef:12345678:00005555deadb000:\
             00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:"
        );
        assert_eq!(m[107], 0);
        assert_eq!(Dest::decode(&m), Some(dest()));
    }

    #[test]
    fn malformed_dest_messages_are_refused() {
        let good = dest().encode();
        // Every truncation that loses a field, garbage, and out-of-range fields.
        for cut in 0..100 {
            let mut m = good;
            m[cut..].fill(0);
            // 23 fields: 22 colons before the SRQ number (which may be cut short).
            let colons = m[..cut].iter().filter(|&&b| b == b':').count();
            if colons < 22 || cut == 98 {
                assert_eq!(Dest::decode(&m), None, "cut at {cut}");
            }
        }
        assert_eq!(Dest::decode(&[0xff; 108]), None);
        let mut wide = String::from_utf8(good[..107].to_vec()).unwrap();
        wide.replace_range(10..16, "1000000");
        assert_eq!(Dest::decode(wide.as_bytes()), None, "a QPN above 24 bits");
        let not_hex = String::from_utf8(good[..107].to_vec())
            .unwrap()
            .replacen("0080", "00g0", 1);
        assert_eq!(Dest::decode(not_hex.as_bytes()), None);
    }

    #[test]
    fn version_and_mtu_messages() {
        let v = version_message(VERSION);
        assert_eq!(&v[..5], b"6.06\0");
        assert_eq!(parse_version(&v), Some(6.06));
        assert_eq!(parse_version(b"5.70\0\0\0"), Some(5.7));
        assert_eq!(parse_version(b"x\0"), None);
        assert_eq!(mtu_message(Mtu::Mtu4096), *b"5\0");
        assert_eq!(parse_mtu(b"3\0"), Some(Mtu::Mtu1024));
        assert_eq!(parse_mtu(b"9\0"), None);
        assert_eq!(parse_mtu(b"\0\0"), None);
    }

    #[test]
    fn reports_convert_in_the_table_unit() {
        let row = BwRow {
            size: 65536,
            iterations: 1000,
            peak_bps: 2.0 * f64::from(1u32 << 20),
            avg_bps: f64::from(1u32 << 20),
            msg_rate: 16.0,
        };
        let r = Report::from_row(&row, false);
        assert_eq!((r.bw_peak, r.bw_avg), (2.0, 1.0));
        assert_eq!(r.to_row(false), row);
        let g = Report::from_row(&row, true);
        assert!((g.bw_avg - 8.0 * f64::from(1u32 << 20) / 1e9).abs() < 1e-12);
    }
}
