//! The byte stream's throughput and latency against tokio's `TcpStream` on loopback, in
//! one sitting: one JSON line per measurement (BENCHMARKS.md, "The byte stream").
//!
//! - `bw`: one direction, `--bytes` (default 2 GiB) in 64 KiB writes, read in 64 KiB
//!   reads; MB/s from the first write to the last byte read.
//! - `lat`: a 64-byte ping-pong, `--iters` (default 20,000) round trips after 1,000 of
//!   warm-up; the median and 99th percentile of half a round trip, in µs.
//!
//! Two soft devices in this process (127.0.0.1 and 127.0.0.2, free UDP ports), polled as
//! `--polling busy` (the default), `event`, or `inline` (as `remem perf --api` runs on
//! soft devices: no progress thread, manual polling, the waiting task drives the device); TCP on
//! 127.0.0.1. `cargo run --release -p remem --example stream_bench [-- --bytes N --iters N
//! --polling busy|event|inline]`; for experiments, `--chunks N` (the writer's staging
//! chunks), `--recv-depth N` and `--max-message BYTES` (each side's receive ring), and
//! `--only stream-bw|tcp-bw|stream-lat|messages-lat|tcp-lat` (one measurement alone).

use remem::{Polling, RdmaBuilder, RdmaStream};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WRITE: usize = 64 * 1024;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn polling() -> Polling {
    match std::env::args()
        .skip_while(|a| a != "--polling")
        .nth(1)
        .as_deref()
    {
        Some("event") => Polling::Event,
        Some("inline") => Polling::Manual,
        _ => Polling::Busy,
    }
}

/// A side's device: `--polling inline` is `remem perf --api`'s setup on soft devices (no
/// progress thread, manual polling: the task that waits drives the device and collects
/// its completions — so each side goes on reading until the other's end, driving its
/// device for the other's last acknowledgements).
fn device(name: &str) -> remem::Rdma {
    let b = RdmaBuilder::new()
        .polling(polling())
        .recv_depth(arg("--recv-depth", 32) as u32)
        .max_message(arg("--max-message", 64 * 1024));
    let b = if matches!(polling(), Polling::Manual) {
        let addr = name.trim_start_matches("soft@").parse().unwrap();
        let opts = remem_soft::SoftOptions {
            inline: true,
            ..remem_soft::SoftOptions::from_env()
        };
        b.context(std::sync::Arc::new(
            remem_soft::SoftContext::bind_with(addr, &opts).unwrap(),
        ))
    } else {
        b.device(name)
    };
    b.build().unwrap()
}

/// The stream over `c`, staging `--chunks` chunks (default [`remem::stream::DEFAULT_SEND_CHUNKS`]).
fn stream(c: remem::Connection) -> RdmaStream {
    RdmaStream::with_send_chunks(c, arg("--chunks", remem::stream::DEFAULT_SEND_CHUNKS)).unwrap()
}

/// The tokio runtime of one side: one worker, as `remem perf`'s API path has; each side
/// runs on a thread and a runtime of its own.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `a` with one end of a connected pair and `b` with the other, each on its own
/// thread and runtime; `rdma` picks RdmaStream, else TcpStream.
fn pair<A, B, FA, FB, T>(rdma: bool, a: A, b: B) -> T
where
    A: FnOnce(Box<dyn Stream>) -> FA,
    B: FnOnce(Box<dyn Stream>) -> FB + Send + 'static,
    FA: std::future::Future<Output = T>,
    FB: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        runtime().block_on(async move {
            let s: Box<dyn Stream> = if rdma {
                let dev = device("soft@127.0.0.2:0");
                let listener = dev.listen("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                Box::new(stream(listener.accept().await.unwrap()))
            } else {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let s = listener.accept().await.unwrap().0;
                s.set_nodelay(true).unwrap();
                Box::new(s)
            };
            b(s).await;
        })
    });
    let addr = rx.recv().unwrap();
    let out = runtime().block_on(async move {
        let s: Box<dyn Stream> = if rdma {
            let dev = device("soft@127.0.0.1:0");
            Box::new(stream(dev.connect(addr).await.unwrap()))
        } else {
            let s = TcpStream::connect(addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            Box::new(s)
        };
        a(s).await
    });
    server.join().unwrap();
    out
}

/// Either stream.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// MB/s of `bytes` in 64 KiB writes, from the first write to the last byte read (the
/// reader's clock: the writer tells it when it started).
fn bandwidth(rdma: bool, bytes: usize) -> f64 {
    let (started, start) = std::sync::mpsc::channel::<Instant>();
    let (result, mbs) = std::sync::mpsc::channel::<f64>();
    pair(
        rdma,
        move |mut w| async move {
            let buf = vec![0x5a; WRITE];
            started.send(Instant::now()).unwrap();
            let mut sent = 0;
            while sent < bytes {
                let n = WRITE.min(bytes - sent);
                w.write_all(&buf[..n]).await.unwrap();
                sent += n;
            }
            w.shutdown().await.unwrap();
            // Until the reader has everything (its end of file).
            let mut rest = Vec::new();
            w.read_to_end(&mut rest).await.unwrap();
        },
        move |mut r| async move {
            let mut buf = vec![0; WRITE];
            let mut got = 0;
            while got < bytes {
                let n = r.read(&mut buf).await.unwrap();
                assert!(n > 0, "early end");
                got += n;
            }
            let secs = start.recv().unwrap().elapsed().as_secs_f64();
            result.send(bytes as f64 / secs / 1e6).unwrap();
            r.shutdown().await.unwrap();
            // Until the writer's end.
            let mut rest = Vec::new();
            r.read_to_end(&mut rest).await.unwrap();
        },
    );
    mbs.recv().unwrap()
}

/// Half round trips of a 64-byte ping-pong, in µs: (median, p99).
fn latency(rdma: bool, iters: usize) -> (f64, f64) {
    let warm = 1000;
    pair(
        rdma,
        move |mut a| async move {
            let mut buf = [7u8; 64];
            let mut times = Vec::with_capacity(iters);
            for i in 0..warm + iters {
                let t = Instant::now();
                a.write_all(&buf).await.unwrap();
                a.flush().await.unwrap();
                a.read_exact(&mut buf).await.unwrap();
                if i >= warm {
                    times.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            // Each side reads until the other's end (driving an inline device meanwhile).
            a.shutdown().await.unwrap();
            a.read_to_end(&mut Vec::new()).await.unwrap();
            times.sort_by(f64::total_cmp);
            (times[times.len() / 2], times[times.len() * 99 / 100])
        },
        move |mut b| async move {
            let mut buf = [0u8; 64];
            for _ in 0..warm + iters {
                b.read_exact(&mut buf).await.unwrap();
                b.write_all(&buf).await.unwrap();
                b.flush().await.unwrap();
            }
            b.shutdown().await.unwrap();
            b.read_to_end(&mut Vec::new()).await.unwrap();
        },
    )
}

/// The same ping-pong with the message API underneath the stream (`send`, `receive`), on
/// the same threads and runtimes: what the stream adds is the difference.
fn latency_messages(iters: usize) -> (f64, f64) {
    let warm = 1000;
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        runtime().block_on(async move {
            let dev = device("soft@127.0.0.2:0");
            let listener = dev.listen("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let c = listener.accept().await.unwrap();
            let mr = dev
                .alloc_local_mr(std::alloc::Layout::new::<[u8; 64]>())
                .unwrap();
            for _ in 0..warm + iters {
                c.receive().await.unwrap();
                c.send(&mr).await.unwrap();
            }
            c.close().await;
        })
    });
    let addr = rx.recv().unwrap();
    let out = runtime().block_on(async move {
        let dev = device("soft@127.0.0.1:0");
        let c = dev.connect(addr).await.unwrap();
        let mr = dev
            .alloc_local_mr(std::alloc::Layout::new::<[u8; 64]>())
            .unwrap();
        let mut times = Vec::with_capacity(iters);
        for i in 0..warm + iters {
            let t = Instant::now();
            c.send(&mr).await.unwrap();
            c.receive().await.unwrap();
            if i >= warm {
                times.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        c.close().await;
        times.sort_by(f64::total_cmp);
        (times[times.len() / 2], times[times.len() * 99 / 100])
    });
    server.join().unwrap();
    out
}

fn main() {
    let bytes = arg("--bytes", 2 << 30);
    let iters = arg("--iters", 20_000);
    let p = polling();
    // `--only stream-bw` / `--only stream-lat`: that measurement alone (for profiling).
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("stream-bw") {
        let mbs = bandwidth(true, bytes);
        println!(
            r#"{{"test":"bw","transport":"RdmaStream","polling":"{p:?}","write":65536,"bytes":{bytes},"MBps":{mbs:.0}}}"#
        );
    }
    if run("tcp-bw") {
        let mbs = bandwidth(false, bytes);
        println!(
            r#"{{"test":"bw","transport":"TcpStream","write":65536,"bytes":{bytes},"MBps":{mbs:.0}}}"#
        );
    }
    if run("stream-lat") {
        let (median, p99) = latency(true, iters);
        println!(
            r#"{{"test":"lat","transport":"RdmaStream","polling":"{p:?}","size":64,"iters":{iters},"median_us":{median:.2},"p99_us":{p99:.2}}}"#
        );
    }
    // (Not with `inline`: `remem perf --api send_lat` is that figure.)
    if run("messages-lat") && !matches!(p, Polling::Manual) {
        let (median, p99) = latency_messages(iters);
        println!(
            r#"{{"test":"lat","transport":"send/receive","polling":"{p:?}","size":64,"iters":{iters},"median_us":{median:.2},"p99_us":{p99:.2}}}"#
        );
    }
    if run("tcp-lat") {
        let (median, p99) = latency(false, iters);
        println!(
            r#"{{"test":"lat","transport":"TcpStream","size":64,"iters":{iters},"median_us":{median:.2},"p99_us":{p99:.2}}}"#
        );
    }
}
