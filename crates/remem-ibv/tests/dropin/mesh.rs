//! Eight processes on the host's device (127.0.0.1, UDP port 4791, one device shared by
//! all of them) in a full mesh of RC connections made through the RDMA CM: five run the
//! C program `tests/c/mesh.c` on the drop-in (rdma_cm and verbs, `REMEM_IBV_DEVICES`
//! unset: the default `rxe0`), three run the `remem` crate's `mesh` example (the async
//! API on `soft@127.0.0.1`, compiled into this test binary and started as
//! `mesh::child_member`). Both speak one protocol (the example's documentation states
//! it); every byte each member receives is checked against the pattern, and the test
//! checks each pair's byte count against the sizes the pattern gives.
//!
//! - `eight_processes_mesh_and_every_byte_arrives`: all 28 pairs exchange everything and
//!   close; every member exits 0.
//! - `a_member_killed_mid_run_is_seen_gone_and_the_others_finish`: one C member sends only
//!   a few messages on each connection and says "stalled" once its peers have them; the
//!   test SIGKILLs it then. Its seven peers — in the middle of their exchange with it —
//!   must see it gone (the host's DREQ for its connections, or a failed completion) within
//!   [`GONE_WITHIN`], and finish with each other; the registry holds no member for it.
//!
//! Members start in the order the protocol needs (member i connects to every j > i):
//! 7 first, then each once the previous one says it listens. Nothing sleeps: the test
//! waits for the members' lines.

#[allow(dead_code)]
#[path = "../../../remem/examples/mesh.rs"]
mod example;

use crate::common::{self, DropIn};
use crate::support;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Carries a member's command line to the child test process that runs it.
const ARGS_ENV: &str = "REMEM_MESH_MEMBER_ARGS";
/// Members.
const N: u32 = 8;
/// Messages each way per connection.
const M: u32 = 30;
/// Which members run the C program (the others the async API): five and three.
const C_MEMBERS: [bool; N as usize] = [true, false, true, true, false, true, false, true];
/// The member killed (a C one, with connections both made and accepted), and how many
/// messages it sends on each connection first.
const VICTIM: u32 = 3;
const VICTIM_SENDS: u32 = 5;
/// How soon the victim's peers must see it gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);
/// The longest the whole mesh may take.
const LIMIT: Duration = Duration::from_secs(90);

/// An async-API member; runs only as a child process of the tests below.
#[test]
#[ignore = "runs in the child processes of the mesh tests"]
fn child_member() {
    let Ok(line) = std::env::var(ARGS_ENV) else {
        eprintln!("child_member only runs as a child of the mesh tests");
        return;
    };
    std::thread::spawn(|| {
        // The parent writes nothing: end of file (or an error) means it is gone.
        let _ = std::io::stdin().read(&mut [0]);
        eprintln!("child: the parent went away");
        std::process::exit(3);
    });
    // Ends the harness's "test mesh::child_member ... ": the member's lines start lines.
    println!();
    let args: Vec<String> = line.split(' ').map(String::from).collect();
    std::process::exit(example::main_with(&args));
}

#[test]
fn eight_processes_mesh_and_every_byte_arrives() {
    mesh(None);
}

#[test]
fn a_member_killed_mid_run_is_seen_gone_and_the_others_finish() {
    mesh(Some(VICTIM));
}

/// The members' CM ports start here: per test process and test, apart from other test
/// processes on the same shared device, and from the ports `support::free_port` hands out
/// (10000–29999, which other tests give their CM listeners on the same device): 30000 to
/// the ephemeral range (32768).
fn cm_base(victim: Option<u32>) -> u16 {
    30_000 + (std::process::id() % 170) as u16 * 16 + if victim.is_some() { 8 } else { 0 }
}

/// What a member printed (`None`: its output ended).
struct Line {
    id: u32,
    text: Option<String>,
    at: SystemTime,
}

/// The members' processes, killed and reaped if the test ends early.
struct Members(Vec<Option<Child>>);

impl Drop for Members {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Forwards each line of `r` to `tx`, then its end.
fn forward(id: u32, r: impl Read + Send + 'static, tx: mpsc::Sender<Line>) {
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(text) = l else { break };
            let at = SystemTime::now();
            let _ = tx.send(Line {
                id,
                text: Some(text),
                at,
            });
        }
        let _ = tx.send(Line {
            id,
            text: None,
            at: SystemTime::now(),
        });
    });
}

/// The shared device's registry (the host NIC's: under `REMEM_HOST_DIR` or `/dev/shm`,
/// by user, network namespace, address and port).
fn registry() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("REMEM_HOST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/dev/shm".into());
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let netns = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
    Some(
        base.join(format!("remem-{uid}"))
            .join(format!("net{netns}"))
            .join("127.0.0.1-4791"),
    )
}

/// The registry's table, if it exists.
fn registry_table() -> Option<String> {
    std::fs::read_to_string(registry()?.join("table")).ok()
}

/// The slot of the member with process id `pid`, if the registry lists one.
fn slot_of(pid: u32) -> Option<String> {
    registry_table()?.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&"m") && f.get(2) == Some(&pid.to_string().as_str()))
            .then(|| f[1].to_string())
    })
}

/// Whether the registry lists a member with process id `pid`.
fn registered(pid: u32) -> bool {
    slot_of(pid).is_some()
}

/// Whether the registry lists a member in `slot`.
fn slot_held(slot: &str) -> bool {
    registry_table().is_some_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().take(2).eq(["m", slot]))
    })
}

/// Bytes member `to` verifies of the first `count` messages from `from`.
fn expected(from: u32, to: u32, count: u32) -> u64 {
    (0..count)
        .map(|s| example::msg_len(from, to, s) as u64)
        .sum()
}

/// The microseconds in "… gone at T us …".
fn gone_at(line: &str) -> Option<u128> {
    line.split(" gone at ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// The bytes in "…, B bytes verified".
fn verified(line: &str) -> Option<u64> {
    line.strip_suffix(" bytes verified")?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

fn mesh(victim: Option<u32>) {
    let d = DropIn::new(if victim.is_some() {
        "mesh-kill"
    } else {
        "mesh"
    });
    let Some(exe) = common::compile_c(
        &d,
        "mesh",
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    ) else {
        return;
    };
    let _one_at_a_time = support::serial();
    let base = cm_base(victim);
    let deadline = Instant::now() + LIMIT;
    let (tx, rx) = mpsc::channel::<Line>();
    let mut members = Members((0..N).map(|_| None).collect());
    let mut out: Vec<Vec<String>> = vec![Vec::new(); N as usize];
    let mut ended = vec![0u8; N as usize];
    let dump = |out: &Vec<Vec<String>>| -> String {
        (out.iter().enumerate())
            .map(|(i, l)| format!("--- member {i}\n{}\n", l.join("\n")))
            .collect()
    };
    // Takes the next line (recording it), or fails the test past the deadline.
    let next = |out: &mut Vec<Vec<String>>, ended: &mut Vec<u8>| -> Line {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                match &l.text {
                    Some(t) => out[l.id as usize].push(t.clone()),
                    None => ended[l.id as usize] += 1,
                }
                l
            }
            Err(_) => panic!("the mesh ran past {LIMIT:?}\n{}", dump(out)),
        }
    };

    // Start 7, 6, …, 0, each once the one before listens.
    for id in (0..N).rev() {
        let mut args = vec![
            id.to_string(),
            N.to_string(),
            base.to_string(),
            M.to_string(),
        ];
        if victim == Some(id) {
            args.push(VICTIM_SENDS.to_string());
        }
        let mut cmd = if C_MEMBERS[id as usize] {
            let mut c = d.command(&exe);
            c.args(&args);
            c
        } else {
            let mut c = Command::new(std::env::current_exe().expect("own path"));
            c.args([
                "--exact",
                "mesh::child_member",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ARGS_ENV, args.join(" "))
            .stdin(Stdio::piped());
            c
        };
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a member");
        forward(id, child.stdout.take().unwrap(), tx.clone());
        forward(id, child.stderr.take().unwrap(), tx.clone());
        members.0[id as usize] = Some(child);
        let listening = format!("mesh {id}: listening");
        loop {
            let l = next(&mut out, &mut ended);
            if l.id == id && l.text.as_ref().is_some_and(|t| t.starts_with(&listening)) {
                break;
            }
            assert!(
                !(l.id == id && ended[id as usize] == 2),
                "member {id} ended before it listened\n{}",
                dump(&out)
            );
        }
    }

    // The victim: killed once its peers have its first messages.
    let mut killed_at = None;
    let mut victim_pid = 0;
    let mut victim_slot = String::new();
    if let Some(v) = victim {
        let stalled = format!("mesh {v}: stalled");
        loop {
            let l = next(&mut out, &mut ended);
            if l.id == v && l.text.as_ref().is_some_and(|t| t.starts_with(&stalled)) {
                break;
            }
            assert!(
                ended[v as usize] < 2,
                "the victim ended before it stalled\n{}",
                dump(&out)
            );
        }
        let mut child = members.0[v as usize].take().unwrap();
        victim_pid = child.id();
        victim_slot = slot_of(victim_pid).expect("the victim is a member of 127.0.0.1:4791");
        killed_at = Some(SystemTime::now());
        child.kill().expect("SIGKILL the victim");
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "the victim died of SIGKILL"
        );
    }

    // Everything else, to the end of every survivor's output.
    let survivors: Vec<u32> = (0..N).filter(|&i| Some(i) != victim).collect();
    let mut gone_seen: Vec<(u32, Duration, Duration)> = Vec::new();
    let mut registry_checked = false;
    while survivors.iter().any(|&i| ended[i as usize] < 2) {
        let l = next(&mut out, &mut ended);
        let (Some(v), Some(t)) = (victim, &l.text) else {
            continue;
        };
        if !t.contains(&format!(": peer {v} gone at ")) {
            continue;
        }
        let at = UNIX_EPOCH + Duration::from_micros(gone_at(t).expect("a time") as u64);
        let killed = killed_at.unwrap();
        let after = at.duration_since(killed).unwrap_or_else(|e| {
            panic!(
                "member {} saw member {v} gone {:?} before it was killed: {t}",
                l.id,
                e.duration()
            )
        });
        let printed = l.at.duration_since(killed).unwrap_or_default();
        gone_seen.push((l.id, after, printed));
        if !registry_checked {
            // Its peers learn through the member that reaped it: it has left the table.
            registry_checked = true;
            assert!(
                !registered(victim_pid),
                "the registry still lists the killed member {victim_pid}:\n{}",
                registry_table().unwrap_or_default()
            );
        }
    }
    for &i in &survivors {
        let status = members.0[i as usize].take().unwrap().wait().unwrap();
        assert!(
            status.success(),
            "member {i} exited with {status}\n{}",
            dump(&out)
        );
    }

    // Every pair's bytes, as the pattern says.
    for &i in &survivors {
        let lines = &out[i as usize];
        let mut total = 0;
        for j in (0..N).filter(|&j| j != i) {
            let (word, count) = if Some(j) == victim {
                ("gone at", VICTIM_SENDS)
            } else {
                ("done,", M)
            };
            let prefix = format!("mesh {i}: peer {j} {word}");
            let line = lines
                .iter()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no \"{prefix}\" line\n{}", dump(&out)));
            let bytes = verified(line).expect("a byte count");
            assert_eq!(bytes, expected(j, i, count), "{line}\n{}", dump(&out));
            total += bytes;
        }
        let (done, gone) = if victim.is_some() { (6, 1) } else { (7, 0) };
        let ok = format!("mesh {i}: ok {total} bytes verified from {done} peers, {gone} gone");
        assert!(lines.contains(&ok), "no \"{ok}\"\n{}", dump(&out));
        assert!(
            lines.contains(&format!("mesh {i}: connected to 7 peers")),
            "{}",
            dump(&out)
        );
    }

    if victim.is_some() {
        gone_seen.sort_by_key(|g| g.0);
        for (i, after, printed) in &gone_seen {
            eprintln!(
                "member {i} ({}) saw the killed member gone {:.1} ms after the SIGKILL \
                 (its line read {:.1} ms after)",
                if C_MEMBERS[*i as usize] {
                    "C, drop-in"
                } else {
                    "async API"
                },
                after.as_secs_f64() * 1e3,
                printed.as_secs_f64() * 1e3
            );
        }
        assert_eq!(gone_seen.len(), survivors.len(), "{}", dump(&out));
        for (i, after, _) in &gone_seen {
            assert!(
                *after < GONE_WITHIN,
                "member {i} saw the killed member gone only after {after:?}\n{}",
                dump(&out)
            );
        }
        assert!(
            !registered(victim_pid),
            "the registry still lists the killed member"
        );
        // Its Unix socket and its list of connections went with it (unless a newcomer
        // holds its slot already).
        let dir = registry().unwrap();
        for file in [format!("{victim_slot}.sock"), format!("{victim_slot}.cm")] {
            assert!(
                !dir.join(&file).exists() || slot_held(&victim_slot),
                "{file} is left in the registry"
            );
        }
    }
    let bytes: u64 = survivors
        .iter()
        .map(|&i| {
            (0..N)
                .filter(|&j| j != i)
                .map(|j| expected(j, i, if Some(j) == victim { VICTIM_SENDS } else { M }))
                .sum::<u64>()
        })
        .sum();
    eprintln!(
        "{} members, {} verified bytes received in all",
        survivors.len(),
        bytes
    );
}
