//! Running unmodified programs on the drop-in: the library directory, Debian tools found on
//! `PATH`, server/client pairs on loopback, bounded in time.
//!
//! Shared by the integration tests that run ibverbs-utils, perftest and the C test
//! programs. Every test that needs something absent prints `skipped: <why>` and returns.

#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long one program may run before `timeout` ends it.
pub const RUN_LIMIT_S: u32 = 120;

/// The built `libremem_ibv.so`: next to the `deps` directory this test runs from.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    profile_dir.join("libremem_ibv.so")
}

/// A directory holding `libibverbs.so.1` -> the built library (what `remem run` sets up),
/// one per test process.
pub fn dropin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = library();
        assert!(
            lib.exists(),
            "{} was not built (cargo builds the cdylib before the tests)",
            lib.display()
        );
        let dir = std::env::temp_dir().join(format!("remem-ibv-queues-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libibverbs.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).unwrap();
        dir
    })
    .clone()
}

/// The program `name` on `PATH`, or `None` after printing why the test is skipped.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        println!("skipped: {name} is not installed (Debian packages ibverbs-utils, perftest)");
    }
    found
}

/// Whether `timeout` (coreutils) is there; every program runs under it.
pub fn have_timeout() -> bool {
    tool("timeout").is_some()
}

/// The tools run one pair at a time: two processes with a progress thread each are as much
/// as a small CI machine takes while staying fast.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A TCP port on 127.0.0.1 free right now (the tools' out-of-band exchange).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A command running `prog args` on the drop-in under `timeout`.
pub fn dropin_command(prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.arg("-k")
        .arg("5")
        .arg(RUN_LIMIT_S.to_string())
        .arg(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", dropin_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// What one program did.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output and standard error, in that order.
    pub out: String,
}

impl Ran {
    fn collect(mut child: Child) -> Ran {
        let mut out = String::new();
        let mut err = String::new();
        // Both pipes are read on threads so that neither fills and blocks the child.
        let mut so = child.stdout.take().unwrap();
        let mut se = child.stderr.take().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            s
        });
        let _ = so.read_to_string(&mut out);
        err.push_str(&t.join().unwrap());
        let status = child.wait().unwrap();
        out.push_str(&err);
        Ran {
            code: status.code(),
            out,
        }
    }
}

/// Whether some process listens on TCP `port` (IPv4 or IPv6), from `/proc/net/tcp*`.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Runs a server and then its client, both on the drop-in: the client starts once the
/// server listens on `port` (seen in `/proc/net/tcp`, or the server having exited).
pub fn run_pair(prog: &Path, server_args: &[&str], client_args: &[&str], port: u16) -> (Ran, Ran) {
    let server = dropin_command(prog, server_args).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(u64::from(RUN_LIMIT_S));
    let mut server = Some(server);
    while !listening(port) && Instant::now() < deadline {
        if let Some(s) = server.as_mut()
            && s.try_wait().unwrap().is_some()
        {
            // The server ended before it listened: report what it said.
            let ran = Ran::collect(server.take().unwrap());
            return (
                ran,
                Ran {
                    code: None,
                    out: "client not started: the server exited first".into(),
                },
            );
        }
        std::thread::yield_now();
        std::thread::sleep(Duration::from_millis(2));
    }
    let client = dropin_command(prog, client_args).spawn().unwrap();
    let client = Ran::collect(client);
    let server = Ran::collect(server.unwrap());
    (server, client)
}

/// Panics with both outputs unless both exited with status 0.
pub fn assert_both_ok(what: &str, server: &Ran, client: &Ran) {
    if server.code != Some(0) || client.code != Some(0) {
        panic!(
            "{what}: server exited {:?}, client {:?}\n--- server ---\n{}\n--- client ---\n{}",
            server.code, client.code, server.out, client.out
        );
    }
}
