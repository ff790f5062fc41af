//! The byte stream between two soft devices on loopback: every byte in order under any
//! write and read sizes (and under the soft NIC's faults), half-closes, a peer that goes
//! away, backpressure with bounded memory, `tokio::io::copy` both ways at once.

use super::RdmaStream;
use crate::test_util::{connect, fresh_addr, soft_pair};
use crate::{Polling, Rdma, RdmaBuilder};
use remem_soft::{FaultConfig, SoftContext, SoftOptions};
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A bound far above what each test needs, so that a stall fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);

async fn streams(a: &Rdma, b: &Rdma) -> (RdmaStream, RdmaStream) {
    let (ca, cb) = connect(a, b).await;
    (RdmaStream::new(ca).unwrap(), RdmaStream::new(cb).unwrap())
}

/// Byte `i` of a stream seeded `seed`.
fn byte(seed: u64, i: usize) -> u8 {
    let x = (i as u64 ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8
}

/// Writes `total` bytes of stream `seed` in writes of the sizes `writes` (cycled; flushing
/// after every `flush_every`th), then shuts down.
async fn write_pattern(
    w: &mut (impl AsyncWrite + Unpin),
    seed: u64,
    total: usize,
    writes: &[usize],
    flush_every: usize,
) {
    let mut at = 0;
    let mut i = 0;
    while at < total {
        let n = writes[i % writes.len()].clamp(1, total - at);
        let chunk: Vec<u8> = (at..at + n).map(|j| byte(seed, j)).collect();
        w.write_all(&chunk).await.unwrap();
        at += n;
        i += 1;
        if flush_every > 0 && i % flush_every == 0 {
            w.flush().await.unwrap();
        }
    }
    w.shutdown().await.unwrap();
}

/// Reads to the end with reads of the sizes `reads` (cycled); returns the bytes.
async fn read_pattern(r: &mut (impl AsyncRead + Unpin), reads: &[usize]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut i = 0;
    loop {
        let mut buf = vec![0u8; reads[i % reads.len()].max(1)];
        i += 1;
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

fn check(seed: u64, got: &[u8], total: usize) {
    assert_eq!(got.len(), total, "bytes delivered");
    if let Some(i) = (0..total).find(|&i| got[i] != byte(seed, i)) {
        panic!("byte {i} of {total} differs");
    }
}

/// Both directions at once, each with its own sizes: every byte arrives, in order, once.
async fn both_ways(a: &Rdma, b: &Rdma, total: usize, writes: &[usize], reads: &[usize]) {
    let (sa, sb) = streams(a, b).await;
    let (mut ra, mut wa) = sa.into_split();
    let (mut rb, mut wb) = sb.into_split();
    let run = async {
        tokio::join!(
            write_pattern(&mut wa, 1, total, writes, 3),
            write_pattern(&mut wb, 2, total, reads, 0),
            async { check(2, &read_pattern(&mut ra, reads).await, total) },
            async { check(1, &read_pattern(&mut rb, writes).await, total) },
        )
    };
    tokio::time::timeout(BOUND, run).await.expect("stalled");
}

fn faulty(seed: u64) -> Rdma {
    let faults = FaultConfig {
        loss: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        seed,
        ..FaultConfig::default()
    };
    let opts = SoftOptions {
        faults: Some(faults),
        ..SoftOptions::default()
    };
    let dev = SoftContext::bind_with(fresh_addr(), &opts).unwrap();
    RdmaBuilder::new()
        .context(Arc::new(dev))
        .polling(Polling::Event)
        // A short retransmission timeout (about 4 ms) keeps lossy runs quick.
        .timeout(10)
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

    /// Any write sizes (from a byte to several chunks) and read sizes deliver exactly the
    /// bytes written, in order, both ways at once.
    #[test]
    fn any_write_and_read_sizes_deliver_every_byte_in_order(
        writes in proptest::collection::vec(1usize..200_000, 1..12),
        reads in proptest::collection::vec(1usize..100_000, 1..12),
        total in 0usize..1_500_000,
    ) {
        runtime().block_on(async {
            let (a, b) = soft_pair();
            both_ways(&a, &b, total, &writes, &reads).await;
        });
    }

    /// The same under the soft NIC's seeded loss, duplication and reordering.
    #[test]
    fn under_loss_duplication_and_reordering(
        writes in proptest::collection::vec(1usize..150_000, 1..8),
        reads in proptest::collection::vec(1usize..70_000, 1..8),
        total in 0usize..600_000,
        seed in 0u64..1_000_000,
    ) {
        runtime().block_on(async {
            let (a, b) = (faulty(seed), faulty(seed + 1));
            both_ways(&a, &b, total, &writes, &reads).await;
            let injected: u64 = a.context().counters().into_iter()
                .chain(b.context().counters())
                .filter(|c| c.name.starts_with("fault"))
                .map(|c| c.value)
                .sum();
            // (Small runs may see none; the counters are printed for the record.)
            eprintln!("faults injected: {injected}");
        });
    }
}

/// Tiny writes (one byte each) coalesce into few chunks while the peer is behind, and
/// arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_writes_arrive_in_order() {
    let (a, b) = soft_pair();
    both_ways(&a, &b, 20_000, &[1], &[7, 1, 4096]).await;
}

/// A half-close each way: the side that shuts down reads what the other writes after
/// reading the end; then the other shuts down too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_in_each_direction() {
    let (a, b) = soft_pair();
    for first_closes_client in [true, false] {
        let (sa, sb) = streams(&a, &b).await;
        let (mut first, mut second) = if first_closes_client {
            (sa, sb)
        } else {
            (sb, sa)
        };
        first.write_all(b"request").await.unwrap();
        first.shutdown().await.unwrap();
        let mut got = Vec::new();
        second.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        // The end stays the end.
        assert_eq!(second.read(&mut [0; 8]).await.unwrap(), 0);
        // Writing after a shutdown is a broken pipe.
        let err = first.write_all(b"more").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BrokenPipe);
        // The half-closed side still reads what the other answers.
        second.write_all(b"answer").await.unwrap();
        second.shutdown().await.unwrap();
        let mut back = Vec::new();
        first.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"answer");
    }
}

/// Dropping a stream ends it for the peer after everything written: the peer reads every
/// byte, then the end (as after a TCP close), even when the drop came before the bytes
/// could go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_sends_what_was_written_then_the_end() {
    let (a, b) = soft_pair();
    let (mut sa, mut sb) = streams(&a, &b).await;
    let total = 3 << 20;
    let data: Vec<u8> = (0..total).map(|i| byte(9, i)).collect();
    // More than fits in flight: part of it is still staged when the stream is dropped.
    let writer = async move {
        let mut at = 0;
        while at < total {
            let n = sa.write(&data[at..]).await.unwrap();
            at += n;
        }
        drop(sa);
    };
    let reader = async {
        let mut got = Vec::new();
        sb.read_to_end(&mut got).await.unwrap();
        got
    };
    let ((), got) = tokio::time::timeout(BOUND, async { tokio::join!(writer, reader) })
        .await
        .expect("stalled");
    check(9, &got, total);
}

/// The peer closes its connection in the middle of a transfer, before ending its stream:
/// reads fail with `UnexpectedEof` and writes with `BrokenPipe`, with the remem error
/// (closed by the peer) as the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_closing_mid_transfer_is_unexpected_eof_and_broken_pipe() {
    let (a, b) = soft_pair();
    let (mut sa, mut sb) = streams(&a, &b).await;
    sb.write_all(&[5; 1000]).await.unwrap();
    sb.flush().await.unwrap();
    let mut some = [0u8; 1000];
    sa.read_exact(&mut some).await.unwrap();
    sa.write_all(&[6; 100_000]).await.unwrap();
    sb.connection().close().await;
    let err = sa.read(&mut [0; 64]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{err}");
    let source = err.get_ref().and_then(|e| e.downcast_ref::<crate::Error>());
    assert!(
        matches!(source, Some(crate::Error::Closed(crate::CloseReason::Peer))),
        "{source:?}"
    );
    let err = tokio::time::timeout(BOUND, async {
        loop {
            if let Err(e) = sa.write_all(&[7; 65536]).await {
                return e;
            }
        }
    })
    .await
    .expect("writes fail");
    assert_eq!(err.kind(), ErrorKind::BrokenPipe, "{err}");
    // The side that closed its own connection: not connected (once it has read what had
    // arrived before).
    let mut drained = 0;
    let err = loop {
        match sb.read(&mut [0; 4096]).await {
            Ok(n) => drained += n,
            Err(e) => break e,
        }
    };
    assert!(drained <= 100_000);
    assert_eq!(err.kind(), ErrorKind::NotConnected, "{err}");
    let err = sb.write_all(&[1; 10]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotConnected, "{err}");
}

/// A reader that stops reading stalls the writer: writes pend once the peer's receive
/// buffers and this side's staging buffer are full, and the writer's memory never grows
/// past its capacity (measured at every write). Reading again moves every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_stalls_the_writer_with_bounded_memory() {
    let (a, b) = soft_pair();
    let (sa, mut sb) = streams(&a, &b).await;
    let chunk = a.config().max_message;
    let ring = a.config().recv_depth as usize * chunk;
    let capacity = sa.send_capacity();
    let bound = ring + capacity;
    let total = 4 * bound;
    let (progress, mut seen) = tokio::sync::watch::channel(0usize);
    let writer = tokio::spawn(async move {
        let mut sa = sa;
        let data: Vec<u8> = (0..total).map(|i| byte(3, i)).collect();
        let mut at = 0;
        let mut most = 0;
        while at < total {
            // Whole chunks, so that each credit carries a full receive buffer.
            at += sa.write(&data[at..(at + chunk).min(total)]).await.unwrap();
            assert!(sa.send_buffered() <= capacity);
            assert!(sa.send_allocated() <= capacity);
            most = most.max(sa.send_allocated());
            progress.send_replace(at);
        }
        sa.shutdown().await.unwrap();
        most
    });
    // The writer fills what the peer's buffers and its own staging take...
    let stalled_at = *tokio::time::timeout(BOUND, seen.wait_for(|&at| at >= bound))
        .await
        .expect("the writer fills the buffers")
        .unwrap();
    // ...and no more: with nothing read, a write accepts no byte beyond them.
    assert!(
        stalled_at <= bound,
        "{stalled_at} accepted with nothing read"
    );
    assert!(!writer.is_finished());
    // Reading again moves the rest.
    let got = tokio::time::timeout(BOUND, async {
        let mut got = Vec::new();
        sb.read_to_end(&mut got).await.unwrap();
        got
    })
    .await
    .expect("stalled");
    check(3, &got, total);
    let most = writer.await.unwrap();
    assert!(most <= capacity, "{most} bytes of staging");
}

/// A source of `n` bytes of stream `seed` for `tokio::io::copy`.
struct Pattern {
    seed: u64,
    at: usize,
    n: usize,
}

impl AsyncRead for Pattern {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let k = buf.remaining().min(self.n - self.at).min(64 * 1024);
        let (seed, at) = (self.seed, self.at);
        let bytes: Vec<u8> = (at..at + k).map(|i| byte(seed, i)).collect();
        buf.put_slice(&bytes);
        self.at += k;
        std::task::Poll::Ready(Ok(()))
    }
}

/// A sink that checksums what `tokio::io::copy` writes into it.
#[derive(Default)]
struct Checksum {
    hash: u64,
    len: usize,
}

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

impl AsyncWrite for Checksum {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.hash = fnv(self.hash, buf);
        self.len += buf.len();
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// `tokio::io::copy` of `total` bytes each way at once, checksummed at the far end.
pub(crate) async fn copy_both_ways(a: &Rdma, b: &Rdma, total: usize) {
    let (sa, sb) = streams(a, b).await;
    let side = |s: RdmaStream, seed: u64| async move {
        let (mut r, mut w) = s.into_split();
        let send = tokio::spawn(async move {
            let mut src = Pattern {
                seed,
                at: 0,
                n: total,
            };
            let n = tokio::io::copy(&mut src, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
            n
        });
        let mut sink = Checksum { hash: FNV0, len: 0 };
        let got = tokio::io::copy(&mut r, &mut sink).await.unwrap();
        (send.await.unwrap(), got, sink.hash)
    };
    let expect = |seed: u64| {
        let mut h = FNV0;
        let mut at = 0;
        while at < total {
            let k = (total - at).min(1 << 20);
            let v: Vec<u8> = (at..at + k).map(|i| byte(seed, i)).collect();
            h = fnv(h, &v);
            at += k;
        }
        h
    };
    let ((sent_a, got_a, hash_a), (sent_b, got_b, hash_b)) =
        tokio::time::timeout(BOUND * 10, async { tokio::join!(side(sa, 1), side(sb, 2)) })
            .await
            .expect("stalled");
    assert_eq!((sent_a, sent_b), (total as u64, total as u64));
    assert_eq!((got_a, got_b), (total as u64, total as u64));
    assert_eq!(hash_a, expect(2), "what a received");
    assert_eq!(hash_b, expect(1), "what b received");
}

/// 64 MiB each way at once (`.ci/run` runs the 1 GiB one, below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_64_mib_both_ways_with_a_checksum() {
    let (a, b) = soft_pair();
    copy_both_ways(&a, &b, 64 << 20).await;
}

/// 1 GiB each way at once (`.ci/run` runs it, in release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "1 GiB each way: run by .ci/run in release"]
async fn copy_1_gib_both_ways_with_a_checksum() {
    let (a, b) = soft_pair();
    copy_both_ways(&a, &b, 1 << 30).await;
}

/// With manual polling (no dispatcher), the stream collects its own completions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_with_manual_polling() {
    let (a, b) = crate::test_util::soft_pair_with(
        |x| x.polling(Polling::Manual),
        |x| x.polling(Polling::Manual),
    );
    both_ways(&a, &b, 300_000, &[1000, 70_000], &[5000]).await;
}

/// `tokio_util::codec::Framed` runs unchanged on the stream: length-delimited frames of
/// every size from empty to several chunks, both ways, arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_with_a_length_delimited_codec() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_util::codec::{Framed, LengthDelimitedCodec};
    let (a, b) = soft_pair();
    let (sa, sb) = streams(&a, &b).await;
    let codec = || {
        LengthDelimitedCodec::builder()
            .max_frame_length(1 << 20)
            .new_codec()
    };
    let (mut fa, mut fb) = (Framed::new(sa, codec()), Framed::new(sb, codec()));
    let frames: Vec<bytes::Bytes> = [0usize, 1, 100, 65_536, 65_537, 300_000, 7]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| byte(i as u64, j))
                .collect::<Vec<u8>>()
                .into()
        })
        .collect();
    let run = async {
        for f in &frames {
            fa.send(f.clone()).await.unwrap();
        }
        for f in &frames {
            let got = fb.next().await.unwrap().unwrap();
            assert_eq!(&got[..], &f[..]);
            fb.send(got.freeze()).await.unwrap();
        }
        for f in &frames {
            assert_eq!(&fa.next().await.unwrap().unwrap()[..], &f[..]);
        }
    };
    tokio::time::timeout(BOUND, run).await.expect("stalled");
}

/// Cancel safety: read and write futures dropped after one poll (as a `select!` that
/// another branch won would drop them) lose no byte and duplicate none — a write's bytes
/// count once it returns `Ready`, and a dropped read leaves its bytes for the next. With
/// the borrowed halves of `split`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_read_and_write_futures_lose_and_duplicate_nothing() {
    use futures_util::FutureExt;
    let (a, b) = soft_pair();
    let (mut sa, mut sb) = streams(&a, &b).await;
    let total = 2_000_000;
    let data: Vec<u8> = (0..total).map(|i| byte(4, i)).collect();
    let (mut ra, mut wa) = sa.split();
    let (mut rb, mut wb) = sb.split();
    let writer = async {
        let mut at = 0;
        let mut round = 0usize;
        while at < total {
            round += 1;
            let end = (at + 1 + round * 7919 % 100_000).min(total);
            // Every other write is polled once and dropped if it is not done.
            if round.is_multiple_of(2) {
                if let Some(n) = wa.write(&data[at..end]).now_or_never() {
                    at += n.unwrap();
                }
                tokio::task::yield_now().await;
            } else {
                at += wa.write(&data[at..end]).await.unwrap();
            }
        }
        wa.shutdown().await.unwrap();
        // The other way: nothing, just the end.
        wb.shutdown().await.unwrap();
    };
    let reader = async {
        let mut got = Vec::new();
        let mut round = 0usize;
        loop {
            round += 1;
            let mut buf = vec![0u8; 1 + round * 104_729 % 70_000];
            let n = if round.is_multiple_of(3) {
                match rb.read(&mut buf).now_or_never() {
                    Some(n) => n.unwrap(),
                    None => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                }
            } else {
                rb.read(&mut buf).await.unwrap()
            };
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(ra.read(&mut [0; 8]).await.unwrap(), 0);
        got
    };
    let ((), got) = tokio::time::timeout(BOUND, async { tokio::join!(writer, reader) })
        .await
        .expect("stalled");
    check(4, &got, total);
}

/// On soft devices without a progress thread and with manual polling: the stream drives
/// its device and collects its completions at each poll (nothing else polls the CQs here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_inline_devices_with_manual_polling() {
    let inline = || {
        let opts = SoftOptions {
            inline: true,
            ..SoftOptions::default()
        };
        let dev = SoftContext::bind_with(fresh_addr(), &opts).unwrap();
        RdmaBuilder::new()
            .context(Arc::new(dev))
            .polling(Polling::Manual)
            .build()
            .unwrap()
    };
    let (a, b) = (inline(), inline());
    // A side whose reads and writes are done must still answer its peer (acknowledge,
    // retransmit): as with any caller-driven device, someone drives it meanwhile.
    let done = std::sync::atomic::AtomicBool::new(false);
    let drive = async {
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            a.context().drive(Duration::ZERO).unwrap();
            b.context().drive(Duration::ZERO).unwrap();
            tokio::task::yield_now().await;
        }
    };
    let run = async {
        both_ways(&a, &b, 3_000_000, &[65536, 1000], &[65536, 333]).await;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    tokio::join!(drive, run);
}
