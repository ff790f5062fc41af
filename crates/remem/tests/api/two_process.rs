//! The async API between two processes. The test is the client, on `common::first_device`;
//! it spawns this test binary again as the server (`child_server`), on a device of its own
//! (`common::peer_device`: remem's handshake tells each device the other's UDP port), which
//! prints the TCP address it listens on. The server lends a region; the client writes into
//! it, reads what the server put there, does atomics on a counter in it, and asks by
//! message for a check; the server checks in its own memory and answers by message; the
//! client closes and the server must see it.
//!
//! The child's standard input is a pipe the parent holds: when the parent goes away, the
//! child sees its end and exits; its whole run is bounded too.

use remem::{Connection, Error, Rdma, RdmaBuilder};
use std::alloc::Layout;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common;

/// Set (to 1) in the child's environment: `child_server` serves only then.
const CHILD_ENV: &str = "REMEM_API_TWO_PROCESS_CHILD";
/// The longest either process runs.
const LIMIT: Duration = Duration::from_secs(30);
/// The exit code of a child whose parent went away.
const ORPHANED: i32 = 3;
/// The lent region: the parent writes `0..HALF`, the server fills `HALF..2 * HALF`, and the
/// counter (initially `START`) follows.
const HALF: usize = 10_000;
const COUNTER: usize = 2 * HALF;
const START: u64 = 40;
/// What the counter holds after the parent's atomics.
const FINAL: u64 = 100;

/// Bytes that differ between the two processes and along the region.
fn pattern(seed: u8) -> Vec<u8> {
    (0..HALF).map(|i| (i % 251) as u8 ^ seed).collect()
}

fn layout(len: usize) -> Layout {
    Layout::from_size_align(len, 8).unwrap()
}

/// The server; runs only as the child process of the tests below.
#[test]
#[ignore = "runs in the child process of two_processes"]
fn child_server() {
    if std::env::var_os(CHILD_ENV).is_none() {
        eprintln!("child_server only runs as the child of two_processes");
        return;
    }
    std::thread::spawn(|| {
        // The parent writes nothing: end of file (or an error) means it is gone.
        let _ = std::io::stdin().read(&mut [0]);
        eprintln!("child: the parent went away");
        std::process::exit(ORPHANED);
    });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let served = runtime.block_on(async { tokio::time::timeout(LIMIT, serve()).await });
    served.expect("the child's time limit").expect("serving");
}

async fn serve() -> Result<(), Error> {
    let rdma = RdmaBuilder::new().device(common::peer_device()).build()?;
    let listener = rdma.listen("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    let conn = listener.accept().await?;
    let region = rdma.alloc_local_mr(layout(COUNTER + 8))?;
    region.write(HALF, &pattern(2))?;
    region.store_u64(COUNTER, START)?;
    conn.share_local_mr(&region).await?;

    let request = conn.receive().await?;
    let mut failed = Vec::new();
    if (request.data.as_slice(), request.imm) != (b"check", Some(1)) {
        failed.push(format!("request {request:?}"));
    }
    if region.to_vec()[..HALF] != pattern(1) {
        failed.push("the parent's write".to_string());
    }
    match region.load_u64(COUNTER)? {
        FINAL => {}
        other => failed.push(format!("counter {other}")),
    }
    let report = if failed.is_empty() {
        "ok".to_string()
    } else {
        format!("failed: {}", failed.join(", "))
    };
    println!("checked: {report}");
    send_text(&rdma, &conn, &report).await?;

    match conn.receive().await {
        Err(Error::Closed(_)) => println!("checked: the parent closed the connection"),
        other => panic!("expected the parent's close, got {other:?}"),
    }
    Ok(())
}

async fn send_text(rdma: &Rdma, conn: &Connection, text: &str) -> Result<(), Error> {
    let mr = rdma.alloc_local_mr(layout(text.len()))?;
    mr.write(0, text.as_bytes())?;
    conn.send_with_imm(&mr, 1).await
}

/// The child process, with its standard input held open and its output read by a thread;
/// killed if the test ends before it exits.
struct Server {
    process: Child,
    stdin: Option<ChildStdin>,
    output: Option<JoinHandle<Vec<String>>>,
    addr: SocketAddr,
}

impl Server {
    /// Spawns the child; returns once it listens.
    fn spawn() -> Server {
        let mut process = Command::new(std::env::current_exe().expect("own path"))
            .args([
                "--exact",
                "two_process::child_server",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the child");
        let stdin = process.stdin.take();
        let mut lines = BufReader::new(process.stdout.take().expect("piped")).lines();
        // The harness prints its own lines first; the child's time limit bounds the wait.
        let addr = lines
            .by_ref()
            .find_map(|l| l.ok()?.split_once("listening ")?.1.parse().ok())
            .expect("the child listens");
        let output = std::thread::spawn(move || lines.map_while(Result::ok).collect());
        Server {
            process,
            stdin,
            output: Some(output),
            addr,
        }
    }

    /// Waits for the child to exit; returns its exit code and what it printed.
    fn wait(mut self) -> (Option<i32>, Vec<String>) {
        // The child exits within its limit, or when it sees its standard input close.
        let status = self.process.wait().expect("waiting for the child");
        let output = self.output.take().map(|t| t.join().expect("reader"));
        (status.code(), output.unwrap_or_default())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The parent's device, and the runtime its connections run on.
fn parent_device() -> (tokio::runtime::Runtime, Rdma) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let rdma =
        runtime.block_on(async { RdmaBuilder::new().device(common::first_device()).build() });
    (runtime, rdma.expect("device"))
}

async fn client(rdma: &Rdma, server: SocketAddr) -> Result<(), Error> {
    let conn = rdma.connect(server).await?;
    let remote = conn.receive_shared_mr().await?;
    assert_eq!(remote.len(), COUNTER + 8);

    let src = rdma.alloc_local_mr(layout(HALF))?;
    src.write(0, &pattern(1))?;
    conn.write(&src, &remote.get(..HALF)?).await?;
    let mut back = rdma.alloc_local_mr(layout(HALF))?;
    conn.read(&mut back, &remote.get(HALF..COUNTER)?).await?;
    assert_eq!(back.to_vec(), pattern(2), "read what the child put there");

    let counter = remote.get(COUNTER..)?;
    assert_eq!(conn.fetch_and_add(&counter, 5).await?, START);
    assert_eq!(conn.compare_and_swap(&counter, START, 1).await?, START + 5);
    assert_eq!(
        conn.compare_and_swap(&counter, START + 5, FINAL).await?,
        START + 5
    );

    send_text(rdma, &conn, "check").await?;
    let report = conn.receive().await?;
    assert_eq!(
        String::from_utf8_lossy(&report.data),
        "ok",
        "the child's report"
    );
    conn.close().await;
    Ok(())
}

#[test]
fn two_processes() {
    let (runtime, rdma) = parent_device();
    let server = Server::spawn();
    let run =
        runtime.block_on(async { tokio::time::timeout(LIMIT, client(&rdma, server.addr)).await });
    run.expect("the parent's time limit").expect("the client");
    let (code, output) = server.wait();
    println!("child: {output:?}");
    assert_eq!(code, Some(0), "the child's exit");
    for check in ["checked: ok", "checked: the parent closed the connection"] {
        assert!(output.iter().any(|l| l == check), "{check:?} in {output:?}");
    }
}

/// A child whose parent goes away (here: closes the child's standard input) exits by
/// itself.
#[test]
fn the_child_exits_when_its_parent_goes_away() {
    let (_runtime, _rdma) = parent_device();
    let mut server = Server::spawn();
    drop(server.stdin.take());
    // Had it waited for its time limit instead, its code would be the test harness's.
    assert_eq!(server.wait().0, Some(ORPHANED));
}
