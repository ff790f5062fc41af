//! Server/client pairs of unmodified programs on the drop-in, on loopback, bounded in
//! time; built on the shared helpers in `common` (drop-in directory, tools, bounded runs).
//!
//! Every test that needs something absent prints `skipped: <why>` and returns.

#![allow(dead_code)]

use super::common::{DropIn, text, tool};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long one program may run before `timeout` ends it (seconds).
pub const RUN_LIMIT_S: u64 = 120;

/// The pairs run one at a time: two processes with a progress thread each are as much as a
/// small CI machine takes while staying fast.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A TCP port on 127.0.0.1 for a tool's out-of-band exchange, free when chosen and out of
/// the kernel's ephemeral range (`ip_local_port_range`, 32768–60999 by default): a port
/// from `bind(0)` is in that range, so another test's `connect` could take it between the
/// choice and the server's `listen` (CI saw "Couldn't listen to port"). Below 32768 only
/// explicit binders compete; the window is `10000 + (pid % 1000) * 20`, 20 ports per
/// process, so concurrent test processes stay apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % 1000) as u16 * 20;
    for _ in 0..200 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 20;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port in {base}..{}", base + 20)
}

/// Whether coreutils' `timeout` is there (every program runs under it).
pub fn have_timeout() -> bool {
    tool("timeout", "coreutils").is_some()
}

/// A command running `prog args` on the drop-in `d` under `timeout`.
pub fn dropin_command(d: &DropIn, prog: &Path, args: &[&str]) -> Command {
    let mut c = d.command("timeout");
    c.arg("-k")
        .arg("5")
        .arg(RUN_LIMIT_S.to_string())
        .arg(prog)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The index of the default device's RoCE v2 GID (what `-g` / `-x` must name: remem
/// speaks RoCE v2 only), read from `ibv_devinfo -v` on the drop-in.
pub fn roce_v2_gid_index(d: &DropIn) -> Option<String> {
    let devinfo = tool("ibv_devinfo", "ibverbs-utils")?;
    let out = d.command(devinfo).arg("-v").output().ok()?;
    let t = text(&out.stdout);
    let line = t
        .lines()
        .find(|l| l.contains("GID[") && l.contains("RoCE v2"));
    let idx = line.and_then(|l| {
        let inner = l.split('[').nth(1)?.split(']').next()?;
        Some(inner.trim().to_string())
    });
    assert!(idx.is_some(), "ibv_devinfo -v shows no RoCE v2 GID:\n{t}");
    idx
}

/// What one program did.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status code (`None`: killed by a signal, or never started).
    pub code: Option<i32>,
    /// Standard output, then standard error.
    pub out: String,
}

impl Ran {
    fn collect(child: Child) -> Ran {
        let out = child.wait_with_output().unwrap();
        Ran {
            code: out.status.code(),
            out: text(&out.stdout) + &text(&out.stderr),
        }
    }
}

/// Whether some process listens on TCP `port` (IPv4 or IPv6), from `/proc/net/tcp*`.
pub fn listening(port: u16) -> bool {
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
/// server listens on `port` (the kernel's socket table says so) or the server has exited.
pub fn run_pair(
    d: &DropIn,
    prog: &Path,
    server_args: &[&str],
    client_args: &[&str],
    port: u16,
) -> (Ran, Ran) {
    run_pair_env(d, prog, server_args, client_args, port, &[])
}

/// [`run_pair`] with `env` (name, value) set for both programs.
pub fn run_pair_env(
    d: &DropIn,
    prog: &Path,
    server_args: &[&str],
    client_args: &[&str],
    port: u16,
    env: &[(&str, &str)],
) -> (Ran, Ran) {
    let mut server = dropin_command(d, prog, server_args)
        .envs(env.iter().copied())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(RUN_LIMIT_S);
    while !listening(port) {
        if server.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let ran = Ran::collect(server);
            let not = Ran {
                code: None,
                out: "client not started: the server never listened".into(),
            };
            return (ran, not);
        }
        // Polling the socket table: nothing else tells when the server has listened.
        std::thread::sleep(Duration::from_millis(2));
    }
    let client = dropin_command(d, prog, client_args)
        .envs(env.iter().copied())
        .spawn()
        .unwrap();
    let client = Ran::collect(client);
    let server = Ran::collect(server);
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

/// One side of an RDMA CM pair: the program, its arguments, the address of its device.
pub struct CmSide<'a> {
    pub prog: &'a Path,
    pub args: Vec<String>,
    /// The IPv4 address of its soft device (`REMEM_IBV_DEVICES=rxe0=soft@IP`).
    pub ip: std::net::Ipv4Addr,
}

/// A pair of loopback addresses (server, client) for one RDMA CM pair: distinct per call
/// and per test process (`127.{180 + pid % 60}.n.{1,2}`), so pairs running at once, in
/// this process or another, never share a soft device's UDP port.
pub fn cm_addrs() -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
    use std::sync::atomic::{AtomicU8, Ordering};
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 180 + (std::process::id() % 60) as u8;
    (
        std::net::Ipv4Addr::new(127, b, n, 1),
        std::net::Ipv4Addr::new(127, b, n, 2),
    )
}

/// Runs an RDMA CM server and then its client on the drop-in, each on a soft device of
/// its own: the client starts once the server's `rdma_listen` has returned (the library
/// writes a line to the FIFO named by `REMEM_RDMACM_NOTIFY`) or the server has exited.
/// When the client's run satisfies `abandon`, the server is not awaited but ended
/// (SIGTERM through `timeout`, which passes it on) and collected.
pub fn run_cm_pair(
    d: &DropIn,
    server: &CmSide,
    client: &CmSide,
    abandon: &dyn Fn(&Ran) -> bool,
) -> (Ran, Ran) {
    let notify = Notify::new(d, &format!("listening-{}", server.ip));
    let sargs: Vec<&str> = server.args.iter().map(String::as_str).collect();
    let mut s = dropin_command(d, server.prog, &sargs)
        .env("REMEM_IBV_DEVICES", format!("rxe0=soft@{}", server.ip))
        .env(Notify::ENV, &notify.path)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(RUN_LIMIT_S);
    loop {
        // Woken by the line; the timeout only lets a server that died be noticed.
        if notify.rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        if s.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let ran = Ran::collect(s);
            let not = Ran {
                code: None,
                out: "client not started: the server never listened".into(),
            };
            return (ran, not);
        }
    }
    let cargs: Vec<&str> = client.args.iter().map(String::as_str).collect();
    let c = dropin_command(d, client.prog, &cargs)
        .env("REMEM_IBV_DEVICES", format!("rxe0=soft@{}", client.ip))
        .spawn()
        .unwrap();
    let client = Ran::collect(c);
    if abandon(&client) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(s.id().to_string())
            .status();
    }
    let server = Ran::collect(s);
    (server, client)
}

/// The index of the default device's RoCE v2 GID `gid` (as `ibv_devinfo -v` prints it:
/// `::ffff:127.0.0.1` for the host's device on 127.0.0.1), read from `ibv_devinfo -v` on
/// the drop-in; panics when the table has no such GID.
pub fn gid_index_of(d: &DropIn, gid: &str) -> Option<String> {
    let devinfo = tool("ibv_devinfo", "ibverbs-utils")?;
    let out = super::common::run(d.command(devinfo).arg("-v"), Duration::from_secs(60));
    let t = text(&out.stdout);
    let idx = t
        .lines()
        .filter(|l| l.contains("GID[") && l.contains("RoCE v2"))
        .find(|l| l.split_whitespace().any(|w| w.trim_end_matches(',') == gid))
        .and_then(|l| {
            let inner = l.split('[').nth(1)?.split(']').next()?;
            Some(inner.trim().to_string())
        });
    assert!(
        idx.is_some(),
        "ibv_devinfo -v shows no RoCE v2 GID {gid}:\n{t}"
    );
    idx
}

/// A FIFO for `REMEM_RDMACM_NOTIFY`: the drop-in's librdmacm writes a line to it once a
/// program's `rdma_listen` has returned (or its multicast join completed).
pub struct Notify {
    /// The FIFO's path (the value of `REMEM_RDMACM_NOTIFY`).
    pub path: std::path::PathBuf,
    rx: std::sync::mpsc::Receiver<String>,
}

impl Notify {
    /// The name of the variable the library reads.
    pub const ENV: &'static str = "REMEM_RDMACM_NOTIFY";

    /// A fresh FIFO `name` in the drop-in directory, with a thread reading its first line.
    pub fn new(d: &DropIn, name: &str) -> Notify {
        use std::io::BufRead;
        let path = d.dir.join(format!("notify-{name}"));
        let _ = std::fs::remove_file(&path);
        let made = Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
        // Read and write: the open does not wait for a writer, and the library's
        // non-blocking open for writing finds a reader.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(reader).read_line(&mut line);
            let _ = tx.send(line);
        });
        Notify { path, rx }
    }

    /// Waits for the line: `true` once it came, `false` if `program` exited first or
    /// [`RUN_LIMIT_S`] passed.
    pub fn wait(&self, program: &mut Running) -> bool {
        let deadline = Instant::now() + Duration::from_secs(RUN_LIMIT_S);
        loop {
            // Woken by the line; the timeout only lets a program that died be noticed.
            if self.rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                return true;
            }
            if program.exited() || Instant::now() > deadline {
                return false;
            }
        }
    }
}

/// A program running with its output piped: its standard output read line by line as the
/// test asks (a line is taken from the pipe only when the test takes it, so a program the
/// test stops reading blocks once the pipe is full), its standard error read to the end
/// by a thread. Ended (SIGTERM, which `timeout` passes on) and reaped when dropped
/// unfinished: a failed test leaves no process behind.
pub struct Running {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    out: String,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
    /// When its standard output reached its end (the program exited, or closed it).
    pub ended: Option<Instant>,
    reaped: bool,
}

impl Running {
    /// Spawns `cmd` with standard output and error piped.
    pub fn spawn(cmd: &mut Command) -> Running {
        use std::io::{BufRead, Read};
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let stdout = child.stdout.take().unwrap();
        // Rendezvous: the thread takes the next line from the pipe only once the test
        // has taken the previous one.
        let (tx, lines) = std::sync::mpsc::sync_channel::<String>(0);
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(stdout);
            let mut buf = Vec::new();
            while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                if tx.send(text(&buf)).is_err() {
                    break;
                }
                buf.clear();
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let err = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        Running {
            child,
            lines,
            out: String::new(),
            err: Some(err),
            ended: None,
            reaped: false,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The standard output read so far.
    pub fn out(&self) -> &str {
        &self.out
    }

    /// Reads standard output until `count` lines have satisfied `want`: `true` then,
    /// `false` when the output ended or `limit` passed first.
    pub fn await_lines(
        &mut self,
        want: impl Fn(&str) -> bool,
        count: usize,
        limit: Duration,
    ) -> bool {
        let deadline = Instant::now() + limit;
        let mut seen = self.out.lines().filter(|l| want(l)).count();
        while seen < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if want(line.trim_end_matches('\n')) {
                        seen += 1;
                    }
                    self.out.push_str(&line);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    self.ended.get_or_insert_with(Instant::now);
                    return false;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return false,
            }
        }
        true
    }

    /// Reads standard output to its end: `true` once there, `false` if `limit` passed.
    pub fn await_end(&mut self, limit: Duration) -> bool {
        self.await_lines(|_| false, 1, limit);
        self.ended.is_some()
    }

    /// Whether the program's main thread sleeps writing to a pipe (`/proc/<pid>/wchan`
    /// names `pipe_write`, or `anon_pipe_write` since Linux 6.14; Linux shows it to the
    /// same user): a program whose standard output the test has stopped reading (see
    /// [`Running::await_lines`]) then stays blocked in a `printf` until it is read again.
    /// For a program run under `timeout` (its only child), the program is looked at.
    pub fn blocked_writing(&self) -> bool {
        let pid = self.pid();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
        let program = children
            .ok()
            .and_then(|c| c.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| pid.to_string());
        std::fs::read_to_string(format!("/proc/{program}/wchan"))
            .is_ok_and(|w| w.ends_with("pipe_write"))
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Sends it SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Sends it SIGTERM (`timeout` passes it on to the program it runs, and kills that one
    /// 5 s later if it is still there).
    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
    }

    /// Reads its output to the end and waits for it (ending it if that takes more than
    /// [`RUN_LIMIT_S`] plus a margin: it runs under `timeout`, or should have ended).
    pub fn finish(&mut self) -> Ran {
        if !self.await_end(Duration::from_secs(RUN_LIMIT_S + 10)) {
            self.terminate();
            self.await_end(Duration::from_secs(10));
        }
        let status = self.child.wait().unwrap();
        self.reaped = true;
        let err = self
            .err
            .take()
            .map(|h| h.join().unwrap())
            .unwrap_or_default();
        Ran {
            code: status.code(),
            out: self.out.clone() + &text(&err),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            if !self.exited() {
                self.terminate();
            }
            let _ = self.child.wait();
        }
    }
}

/// Waits until one of `programs` is [`Running::blocked_writing`]: `false` if one exited
/// first or `limit` passed.
pub fn await_blocked_writing(programs: &mut [&mut Running], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !programs.iter().any(|p| p.blocked_writing()) {
        if programs.iter_mut().any(|p| p.exited()) || Instant::now() > deadline {
            return false;
        }
        // Polling: nothing tells when a writer has blocked on a full pipe.
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// Waits until some process listens on TCP `port` (the kernel's socket table says so):
/// `false` if `server` exited first or [`RUN_LIMIT_S`] passed.
pub fn await_listening(port: u16, server: &mut Running) -> bool {
    let deadline = Instant::now() + Duration::from_secs(RUN_LIMIT_S);
    while !listening(port) {
        if server.exited() || Instant::now() > deadline {
            return false;
        }
        // Polling the socket table: nothing else tells when the server has listened.
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}
