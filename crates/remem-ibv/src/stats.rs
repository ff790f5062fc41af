//! `REMEM_IBV_STATS`: each device's counters, written when the process exits.
//!
//! A device a program closes before it exits (MPI and UCX close theirs in `MPI_Finalize`)
//! is counted too: every `ibv_close_device` takes a snapshot of the devices still open
//! ([`snapshot`]), and the exit writes the last one of each.
//!
//! Kernel rxe shows a device's counters in `/sys/class/infiniband/<dev>/ports/1/hw_counters/`
//! (`sent_pkts`, `rcvd_pkts`, `retry_exceeded_err`, ...); the drop-in's devices live in the
//! process, so their counters are what the process counted. With `REMEM_IBV_STATS=FILE` set,
//! the process appends one line per soft device it opened to FILE at exit (after the
//! device sent what it owed): `pid=P device=NAME sent_pkts=N rcvd_pkts=N ...`, every counter
//! of [`remem_verbs::Context::counters`] in its order (rxe's names first). Each line is one
//! `write` to a file opened with `O_APPEND`, so the lines of processes that exit at once (the
//! ranks of an MPI job) do not interleave. A file that cannot be opened is reported on
//! stderr once and the exit goes on.

#![forbid(unsafe_code)]

use remem_soft::SoftContext;
use remem_verbs::{Context as _, Counter};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// One device opened by this process, and its counters when last seen.
struct Seen {
    name: String,
    dev: Weak<SoftContext>,
    last: Vec<Counter>,
}

/// Every device opened while `REMEM_IBV_STATS` is set.
static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

/// Whether `REMEM_IBV_STATS` is set (read once).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(STATS_ENV).is_some())
}

/// Tracks a device just opened (nothing when the variable is unset).
pub fn track(name: &str, dev: &Arc<SoftContext>) {
    if enabled() {
        SEEN.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
            name: name.to_string(),
            dev: Arc::downgrade(dev),
            last: dev.counters(),
        });
    }
}

/// Takes the counters of every tracked device still open (before a close, and at exit).
pub fn snapshot() {
    if enabled() {
        for s in SEEN.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            if let Some(dev) = s.dev.upgrade() {
                s.last = dev.counters();
            }
        }
    }
}

/// At exit: a last snapshot, then one line per device opened to the file.
pub fn write_at_exit() {
    if !enabled() {
        return;
    }
    snapshot();
    let lines: Vec<String> = SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|s| line(std::process::id(), &s.name, &s.last))
        .collect();
    append(&lines);
}

/// The environment variable naming the file.
pub const STATS_ENV: &str = "REMEM_IBV_STATS";

/// The line written for one device: `pid=.. device=.. name=value ...` and a newline.
pub fn line(pid: u32, device: &str, counters: &[Counter]) -> String {
    let mut s = format!("pid={pid} device={device}");
    for c in counters {
        s.push_str(&format!(" {}={}", c.name, c.value));
    }
    s.push('\n');
    s
}

/// Appends `lines` (each a whole line) to the file named by `REMEM_IBV_STATS`, if set.
fn append(lines: &[String]) {
    let Some(path) = std::env::var_os(STATS_ENV) else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    match file {
        Ok(mut f) => {
            for l in lines {
                let _ = f.write_all(l.as_bytes());
            }
        }
        Err(e) => eprintln!(
            "libibverbs (remem): {STATS_ENV}={}: {e}; counters not written",
            path.to_string_lossy()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_the_process_the_device_and_every_counter_in_order() {
        let counters = [
            Counter {
                name: "sent_pkts",
                value: 12,
            },
            Counter {
                name: "rcvd_pkts",
                value: 7,
            },
        ];
        assert_eq!(
            line(42, "rxe0", &counters),
            "pid=42 device=rxe0 sent_pkts=12 rcvd_pkts=7\n"
        );
    }
}
