//! Results of `remem perf` and how they are printed: perftest's tables, or JSON lines.

use super::{Settings, Test};
use std::io::Write;

/// One bandwidth result row (perftest's `ib_*_bw`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    /// Message size in bytes.
    pub size: u64,
    /// Operations completed (all QPs).
    pub iterations: u64,
    /// Peak bandwidth, bytes per second.
    pub peak_bps: f64,
    /// Average bandwidth, bytes per second.
    pub avg_bps: f64,
    /// Average message rate, messages per second.
    pub msg_rate: f64,
}

/// One latency result row (perftest's `ib_*_lat`), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatRow {
    /// Message size in bytes.
    pub size: u64,
    /// Samples taken.
    pub iterations: u64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// The median (perftest's `t_typical`).
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// A result row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// Bandwidth test.
    Bw(BwRow),
    /// Latency test.
    Lat(LatRow),
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's title of a test.
fn title(test: Test) -> &'static str {
    match test {
        Test::WriteBw => "RDMA_Write BW Test",
        Test::ReadBw => "RDMA_Read BW Test",
        Test::SendBw => "Send BW Test",
        Test::AtomicBw => "Atomic BW Test",
        Test::WriteLat => "RDMA_Write Latency Test",
        Test::ReadLat => "RDMA_Read Latency Test",
        Test::SendLat => "Send Latency Test",
        Test::AtomicLat => "Atomic Latency Test",
    }
}

/// The table's header (test, parameters, units, column names).
pub(crate) fn print_header(test: Test, api: bool, s: &Settings, gbits: bool) {
    println!("{RULE}");
    let title = title(test);
    if s.bidir {
        // perftest: "RDMA_Write Bidirectional BW Test".
        println!(
            "                    {}",
            title.replacen(" BW Test", " Bidirectional BW Test", 1)
        );
    } else {
        println!("                    {title}");
    }
    println!(
        " Number of qps   : {:<8}Transport type : RoCEv2{}",
        s.qps,
        if api { " (remem async API)" } else { "" }
    );
    println!(
        " Connection type : {:<8}Using SRQ      : OFF",
        s.conn.name()
    );
    println!(
        " TX depth        : {:<8}Inline size    : {}",
        s.tx_depth, s.inline_size
    );
    if matches!(test, Test::AtomicBw | Test::AtomicLat) {
        println!(" Atomic type     : {}", s.atomic.name());
    }
    if test.is_bw() {
        println!(
            " BW unit         : {}",
            if gbits {
                "Gb/sec = 10^9 bits per second"
            } else {
                "MB/sec = 2^20 bytes per second (as perftest; --json: bw_*_mib_s)"
            }
        );
        if s.bidir {
            println!(" Bidirectional   : the sum of both directions");
        }
    }
    println!("{RULE}");
    if test.is_bw() {
        let unit = if gbits { "Gb/sec" } else { "MB/sec" };
        println!(
            " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
        );
    } else {
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        );
    }
}

/// Bytes in perftest's MB (its MB/sec is 2^20 bytes per second): the unit of the table,
/// of `--json`'s `bw_*_mib_s` and of the plot.
pub(crate) const MIB: f64 = 1_048_576.0;

/// Bandwidth in MiB/s (perftest's MB/sec).
pub(crate) fn mib_s(bps: f64) -> f64 {
    bps / MIB
}

/// Bandwidth in Gb/s (10^9 bits per second).
pub(crate) fn gbit_s(bps: f64) -> f64 {
    bps * 8.0 / 1e9
}

/// Bandwidth in the table's unit: MB/sec with MB = 2^20 bytes (perftest's), or Gb/sec.
pub(crate) fn table_bw(bps: f64, gbits: bool) -> f64 {
    if gbits { gbit_s(bps) } else { mib_s(bps) }
}

/// A bidirectional result as perftest prints it: the sum of both directions' bandwidth
/// and message rate, with this side's size and iteration count.
pub(crate) fn both_ways(mine: &BwRow, theirs: &BwRow) -> BwRow {
    BwRow {
        size: mine.size,
        iterations: mine.iterations,
        peak_bps: mine.peak_bps + theirs.peak_bps,
        avg_bps: mine.avg_bps + theirs.avg_bps,
        msg_rate: mine.msg_rate + theirs.msg_rate,
    }
}

/// One row of the table.
pub(crate) fn print_row(row: &Row, gbits: bool) {
    println!("{}", format_row(row, gbits));
    let _ = std::io::stdout().flush();
}

/// One row of the table, as text.
pub(crate) fn format_row(row: &Row, gbits: bool) -> String {
    match row {
        Row::Bw(r) => format!(
            " {:<10} {:<10}     {:>10.2}         {:>10.2}            {:.6}",
            r.size,
            r.iterations,
            table_bw(r.peak_bps, gbits),
            table_bw(r.avg_bps, gbits),
            r.msg_rate / 1e6
        ),
        Row::Lat(r) => format!(
            " {:<7} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}",
            r.size, r.iterations, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
        ),
    }
}

/// The closing rule.
pub(crate) fn print_footer() {
    println!("{RULE}");
}

/// The line a verified run (`--verify`) that succeeded prints under its rows: what was
/// checked.
pub(crate) fn verified(test: Test) -> &'static str {
    if test == Test::ReadBw {
        " Data verified   : every byte of every READ matched its pattern"
    } else {
        " Data verified   : every byte of each slot's last WRITE matched its pattern"
    }
}

/// How many of a run's messages arrived where nothing is resent (SEND over UD or UC):
/// the messages sent (both ways with `-b`) and those that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// Messages sent.
    pub sent: u64,
    /// Messages that arrived.
    pub received: u64,
}

/// One JSON object for a row. Every field that carries a unit names it: bandwidth in
/// MiB/s (2^20 bytes per second, the table's MB/sec) and Gb/s (10^9 bits per second),
/// message rate in Mpps (10^6 messages per second), latency in µs. A SEND run over UD or
/// UC says what arrived (`delivery`): `messages_sent`, `messages_received`, `messages_lost`.
pub(crate) fn json(
    test: Test,
    api: bool,
    s: &Settings,
    row: &Row,
    delivery: Option<Delivery>,
) -> String {
    let common = format!(
        "\"test\":\"{}\",\"api\":{},\"connection\":\"{}\",\"bidirectional\":{},\"qps\":{},\"tx_depth\":{}",
        test.name(),
        api,
        s.conn.name(),
        s.bidir,
        s.qps,
        s.tx_depth
    );
    // Only verified runs say so (the other rows keep their fields).
    let common = if s.verify {
        format!("{common},\"verified\":true")
    } else {
        common
    };
    let common = match delivery {
        Some(d) => format!(
            "{common},\"messages_sent\":{},\"messages_received\":{},\"messages_lost\":{}",
            d.sent,
            d.received,
            d.sent.saturating_sub(d.received)
        ),
        None => common,
    };
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v:?}")
        } else {
            "null".into()
        }
    };
    match row {
        Row::Bw(r) => format!(
            "{{{common},\"size\":{},\"iterations\":{},\"bw_peak_mib_s\":{},\"bw_avg_mib_s\":{},\"bw_peak_gbit_s\":{},\"bw_avg_gbit_s\":{},\"msg_rate_mpps\":{}}}",
            r.size,
            r.iterations,
            num(mib_s(r.peak_bps)),
            num(mib_s(r.avg_bps)),
            num(gbit_s(r.peak_bps)),
            num(gbit_s(r.avg_bps)),
            num(r.msg_rate / 1e6)
        ),
        Row::Lat(r) => format!(
            "{{{common},\"size\":{},\"iterations\":{},\"lat_us\":{{\"min\":{},\"max\":{},\"typical\":{},\"avg\":{},\"stdev\":{},\"p99\":{},\"p999\":{}}}}}",
            r.size,
            r.iterations,
            num(r.min),
            num(r.max),
            num(r.typical),
            num(r.avg),
            num(r.stdev),
            num(r.p99),
            num(r.p999)
        ),
    }
}

/// Latency statistics of `samples` (µs); sorts them.
pub(crate) fn lat_row(size: u64, samples: &mut [f64]) -> LatRow {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return LatRow {
            size,
            iterations: 0,
            min: f64::NAN,
            max: f64::NAN,
            typical: f64::NAN,
            avg: f64::NAN,
            stdev: f64::NAN,
            p99: f64::NAN,
            p999: f64::NAN,
        };
    }
    let avg = samples.iter().sum::<f64>() / n as f64;
    let var = samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / n as f64;
    // The smallest sample at or above the given fraction of all samples.
    let pct = |p: f64| samples[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    LatRow {
        size,
        iterations: n as u64,
        min: samples[0],
        max: samples[n - 1],
        typical: samples[n / 2],
        avg,
        stdev: var.sqrt(),
        p99: pct(0.99),
        p999: pct(0.999),
    }
}

/// Bandwidth statistics from completion marks: (seconds since start, messages completed
/// so far), one per poll that found completions. Average over the whole run; peak = the
/// best rate over any stretch (sliding) of at least a sixteenth of the messages and at
/// least eight marks (perftest's peak is also a best short-term rate).
pub(crate) fn bw_row(size: u64, marks: &[(f64, u64)]) -> BwRow {
    let Some(&(elapsed, total)) = marks.last() else {
        return BwRow {
            size,
            iterations: 0,
            peak_bps: 0.0,
            avg_bps: 0.0,
            msg_rate: 0.0,
        };
    };
    let rate = |msgs: u64, secs: f64| {
        if secs > 0.0 { msgs as f64 / secs } else { 0.0 }
    };
    let avg_rate = rate(total, elapsed);
    let mut peak_rate = avg_rate;
    let min_msgs = total.div_ceil(16);
    // The run's start is a mark too; for each end, the shortest stretch that qualifies.
    let all: Vec<(f64, u64)> = std::iter::once((0.0, 0))
        .chain(marks.iter().copied())
        .collect();
    let mut j = 0usize;
    for i in 1..all.len() {
        let fits = |j: usize| all[i].1 - all[j].1 >= min_msgs && i - j >= 8;
        while j + 1 < i && fits(j + 1) {
            j += 1;
        }
        if fits(j) && all[i].0 > all[j].0 {
            peak_rate = peak_rate.max(rate(all[i].1 - all[j].1, all[i].0 - all[j].0));
        }
    }
    BwRow {
        size,
        iterations: total,
        peak_bps: peak_rate * size as f64,
        avg_bps: avg_rate * size as f64,
        msg_rate: avg_rate,
    }
}

/// A progress indicator on stderr, for runs over about two seconds.
pub(crate) struct Progress {
    start: std::time::Instant,
    last: std::time::Instant,
    shown: bool,
}

impl Progress {
    pub(crate) fn new() -> Progress {
        let now = std::time::Instant::now();
        Progress {
            start: now,
            last: now,
            shown: false,
        }
    }

    /// Reports `fraction` done (0..=1) at most ten times a second, after two seconds.
    pub(crate) fn update(&mut self, what: &str, fraction: f64) {
        let now = std::time::Instant::now();
        if now.duration_since(self.start).as_secs_f64() < 2.0
            || now.duration_since(self.last).as_millis() < 100
        {
            return;
        }
        self.last = now;
        self.shown = true;
        let pct = (fraction.clamp(0.0, 1.0) * 100.0) as u32;
        let bar = "#".repeat((pct / 5) as usize);
        eprint!("\r {what:<12} [{bar:<20}] {pct:>3}%");
        let _ = std::io::stderr().flush();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.shown {
            eprint!("\r{:60}\r", "");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics() {
        let mut s: Vec<f64> = (1..=1000).map(f64::from).collect();
        s.reverse();
        let r = lat_row(8, &mut s);
        assert_eq!((r.min, r.max, r.typical), (1.0, 1000.0, 501.0));
        assert_eq!((r.p99, r.p999), (990.0, 999.0));
        assert!((r.avg - 500.5).abs() < 1e-9);
        assert!((r.stdev - 288.675).abs() < 1e-3);
        assert!(lat_row(8, &mut []).avg.is_nan());
    }

    #[test]
    fn bandwidth_statistics() {
        // 10 messages of 1000 B per 10 ms for 0.9 s, then twice as fast for 0.05 s.
        let mut marks: Vec<(f64, u64)> = (1..=90).map(|i| (i as f64 * 0.01, i * 10)).collect();
        marks.extend((1..=10).map(|i| (0.9 + i as f64 * 0.005, 900 + i * 10)));
        let r = bw_row(1000, &marks);
        assert_eq!(r.iterations, 1000);
        assert!((r.avg_bps - 1000.0 * 1000.0 / 0.95).abs() < 1e-6);
        assert!((r.peak_bps - 2.0e6).abs() < 1e-3, "{}", r.peak_bps);
        assert!((r.msg_rate - 1000.0 / 0.95).abs() < 1e-9);
        // A single burst of completions seen at once is no peak.
        let burst = [(0.5, 10), (0.5000001, 20), (1.0, 30)];
        assert!((bw_row(1, &burst).peak_bps - 30.0).abs() < 1e-9);
        assert_eq!(bw_row(8, &[]).iterations, 0);
    }

    fn settings() -> Settings {
        Settings {
            test: Test::WriteBw,
            api: false,
            atomic: super::super::AtomicType::FetchAndAdd,
            qps: 1,
            tx_depth: 128,
            inline_size: 0,
            iters: 10,
            duration: None,
            sizes: vec![65536],
            bidir: false,
            conn: super::super::Conn::Rc,
            cm: None,
            verify: false,
        }
    }

    #[test]
    fn json_rows_have_the_documented_fields() {
        let s = settings();
        let bw = json(
            Test::WriteBw,
            false,
            &s,
            &Row::Bw(BwRow {
                size: 65536,
                iterations: 10,
                peak_bps: 3.0 * MIB * 1000.0,
                avg_bps: 2.0 * MIB * 1000.0,
                msg_rate: 30517.0,
            }),
            None,
        );
        for field in [
            "\"test\":\"write_bw\"",
            "\"connection\":\"RC\"",
            "\"bidirectional\":false",
            "\"size\":65536",
            "\"iterations\":10",
            "\"bw_peak_mib_s\":3000.0",
            "\"bw_avg_mib_s\":2000.0",
            "\"bw_avg_gbit_s\":16.777216",
            "\"msg_rate_mpps\":0.030517",
        ] {
            assert!(bw.contains(field), "{bw} lacks {field}");
        }
        let mut samples = vec![1.0, 2.0, 3.0];
        let lat = json(
            Test::WriteLat,
            true,
            &s,
            &Row::Lat(lat_row(8, &mut samples)),
            None,
        );
        assert!(lat.contains("\"lat_us\":{\"min\":1.0"), "{lat}");
        assert!(lat.contains("\"p999\":3.0}"), "{lat}");
        assert!(lat.contains("\"api\":true"), "{lat}");
        // A UD or UC SEND run says what arrived.
        let ud = json(
            Test::SendBw,
            false,
            &s,
            &Row::Lat(lat_row(8, &mut samples)),
            Some(Delivery {
                sent: 100,
                received: 97,
            }),
        );
        assert!(
            ud.contains("\"messages_sent\":100,\"messages_received\":97,\"messages_lost\":3"),
            "{ud}"
        );
        assert!(!bw.contains("messages_"), "{bw}");
    }

    /// The table and `--json` say the same number for the same row, in each unit.
    #[test]
    fn the_table_and_json_agree() {
        let row = BwRow {
            size: 65536,
            iterations: 5000,
            peak_bps: 1.9e9,
            avg_bps: 1.7654321e9,
            msg_rate: 1.7654321e9 / 65536.0,
        };
        let j: Vec<(String, f64)> = json(Test::WriteBw, false, &settings(), &Row::Bw(row), None)
            .trim_matches(|c| c == '{' || c == '}')
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.split_once(':')?;
                Some((k.trim_matches('"').to_string(), v.parse().ok()?))
            })
            .collect();
        let field = |k: &str| j.iter().find(|(n, _)| n == k).unwrap().1;
        for (gbits, peak, avg) in [
            (false, "bw_peak_mib_s", "bw_avg_mib_s"),
            (true, "bw_peak_gbit_s", "bw_avg_gbit_s"),
        ] {
            let table = format_row(&Row::Bw(row), gbits);
            let cols: Vec<f64> = table
                .split_whitespace()
                .map(|c| c.parse().unwrap())
                .collect();
            assert_eq!(format!("{:.2}", field(peak)), format!("{:.2}", cols[2]));
            assert_eq!(format!("{:.2}", field(avg)), format!("{:.2}", cols[3]));
            assert_eq!(
                format!("{:.6}", field("msg_rate_mpps")),
                format!("{:.6}", cols[4])
            );
        }
        // MB/sec is perftest's: 2^20 bytes per second.
        assert!((field("bw_avg_mib_s") - 1.7654321e9 / 1048576.0).abs() < 1e-6);
    }

    #[test]
    fn both_ways_sums_as_perftest() {
        let a = BwRow {
            size: 8,
            iterations: 10,
            peak_bps: 3.0,
            avg_bps: 2.0,
            msg_rate: 1.0,
        };
        let b = BwRow {
            iterations: 12,
            ..a
        };
        let s = both_ways(&a, &b);
        assert_eq!(
            (s.iterations, s.peak_bps, s.avg_bps, s.msg_rate),
            (10, 6.0, 4.0, 2.0)
        );
    }
}
