//! An `RdmaStream` whose peer process is killed in the middle of a transfer: the writer's
//! and the reader's next operations fail with `TimedOut` — the kind a TCP user sees from a
//! peer that vanished — within the failure model's time (the transport's retries, about
//! 2.1 s with the defaults; FAILURE_MODEL.md), with the remem error as the source.
//!
//! The test spawns this test binary again as the peer (`child_peer`), which accepts a
//! stream, reads a first MiB, says so, and waits to be killed.

use remem::{CloseReason, Error, RdmaBuilder, RdmaStream};
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;

/// Set (to 1) in the child's environment: `child_peer` runs only then.
const CHILD_ENV: &str = "REMEM_STREAM_KILL_CHILD";
const MIB: usize = 1 << 20;

#[test]
#[ignore = "runs in the child process of a_killed_peer_times_out_reads_and_writes"]
fn child_peer() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // The parent kills us; should it go away first, our standard input ends.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read(&mut [0]);
        std::process::exit(3);
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rdma = RdmaBuilder::new()
            .device(common::peer_device())
            .build()
            .unwrap();
        let listener = rdma.listen("127.0.0.1:0").await.unwrap();
        println!("listening {}", listener.local_addr().unwrap());
        let mut s = RdmaStream::new(listener.accept().await.unwrap()).unwrap();
        let mut buf = vec![0; MIB];
        s.read_exact(&mut buf).await.unwrap();
        println!("read");
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[test]
fn a_killed_peer_times_out_reads_and_writes() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "stream_kill::child_peer",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr: std::net::SocketAddr = lines
        .by_ref()
        .find_map(|l| l.ok()?.split_once("listening ")?.1.parse().ok())
        .expect("the child listens");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rdma = rt
        .block_on(async { RdmaBuilder::new().device(common::first_device()).build() })
        .unwrap();
    let s = rt.block_on(async { RdmaStream::new(rdma.connect(addr).await.unwrap()).unwrap() });
    let (mut r, mut w) = s.into_split();
    rt.block_on(async {
        w.write_all(&vec![1; MIB]).await.unwrap();
        w.flush().await.unwrap();
    });
    assert!(
        lines.by_ref().any(|l| l.is_ok_and(|l| l == "read")),
        "the child read the first MiB"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let (read, write) = rt.block_on(async {
        let read = async { r.read(&mut [0; 64]).await.unwrap_err() };
        let write = async {
            loop {
                if let Err(e) = w.write_all(&[2; 65536]).await {
                    return e;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(read, write) })
            .await
            .expect("the reader and writer fail in time")
    });
    let took = killed.elapsed();
    for (what, e) in [("read", read), ("write", write)] {
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{what}: {e}");
        let source = e.get_ref().and_then(|s| s.downcast_ref::<Error>());
        assert!(
            matches!(source, Some(Error::Closed(CloseReason::Completion { .. }))),
            "{what}: {source:?}"
        );
    }
    // The transport's retries (about 2.1 s), with room for a loaded machine.
    assert!(took < Duration::from_secs(10), "{took:?}");
    println!("both failed with TimedOut {took:?} after the kill");
}
