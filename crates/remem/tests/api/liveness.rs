//! Liveness of the message layer: many concurrent sends in both directions at once, with
//! both applications receiving, all arrive — credits always return, whatever the sends
//! waiting for credits hold (FAILURE_MODEL.md, "Credits always return").

use remem::verbs::QpCap;
use remem::{Connection, RdmaBuilder};
use std::sync::Arc;
use std::time::Duration;

use crate::common;

use common::test_util::connect;

/// How long one run may take at most: far more than it needs (a few seconds), so that a
/// stall fails the test instead of hanging it.
const BOUND: Duration = Duration::from_secs(120);

/// The bytes of message `i` sent by side `side`: `len` bytes that name both.
fn message(side: u8, i: u32, len: usize) -> Vec<u8> {
    let mut m = vec![side; len.max(5)];
    m[1..5].copy_from_slice(&i.to_be_bytes());
    m
}

/// The length of message `i`: small, with every `large_every`th one larger than the
/// receiver's buffers (a large message, read by the receiver), if `large_every > 0`.
fn len_of(i: u32, large_every: u32) -> usize {
    if large_every > 0 && i % large_every == large_every - 1 {
        20_000 + i as usize % 7
    } else {
        8 + i as usize % 64
    }
}

/// `n` concurrent sends from `conn` (each on a task of its own) and a loop receiving the
/// peer's `n`; returns once every send has completed and every message has arrived, each
/// exactly once and whole.
async fn exchange(conn: Arc<Connection>, side: u8, n: u32, large_every: u32) {
    let sends: Vec<_> = (0..n)
        .map(|i| {
            let conn = conn.clone();
            tokio::spawn(async move {
                conn.send_bytes(message(side, i, len_of(i, large_every)))
                    .await
            })
        })
        .collect();
    let mut seen = vec![false; n as usize];
    let peer = 1 - side;
    for _ in 0..n {
        let m = conn.receive().await.expect("receive");
        let i = u32::from_be_bytes(m.data[1..5].try_into().unwrap());
        assert!(i < n, "message {i}");
        assert_eq!(m.data, message(peer, i, len_of(i, large_every)));
        assert!(!std::mem::replace(&mut seen[i as usize], true), "{i} twice");
    }
    for s in sends {
        s.await.unwrap().expect("send");
    }
}

/// Both sides send `n` messages concurrently and receive the other's `n`.
async fn both_ways(max_send_wr: Option<u32>, recv_depth: Option<u32>, n: u32, large_every: u32) {
    let opts = |b: RdmaBuilder| {
        let b = match max_send_wr {
            Some(wr) => b.qp_cap(QpCap {
                max_send_wr: wr,
                max_recv_wr: 0,
                max_send_sge: 8,
                max_recv_sge: 1,
                max_inline_data: 0,
            }),
            None => b,
        };
        match recv_depth {
            Some(d) => b.recv_depth(d),
            None => b,
        }
    };
    let (a, b) = common::pair_with(opts, opts);
    let (ca, cb) = connect(&a, &b).await;
    let (ca, cb) = (Arc::new(ca), Arc::new(cb));
    let run = async {
        tokio::join!(
            tokio::spawn(exchange(ca.clone(), 0, n, large_every)),
            tokio::spawn(exchange(cb.clone(), 1, n, large_every)),
        )
    };
    let (x, y) = tokio::time::timeout(BOUND, run).await.unwrap_or_else(|_| {
        panic!(
            "stalled: {n} sends each way, max_send_wr {max_send_wr:?}, recv_depth {recv_depth:?}"
        )
    });
    x.unwrap();
    y.unwrap();
    assert!(ca.closed().is_none() && cb.closed().is_none());
}

/// The reproduction of issue 29: with the defaults, 400 concurrent sends each way (more
/// than the send queue's 256 entries) stalled after 32 messages each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_concurrent_sends_than_send_queue_entries_each_way_all_arrive() {
    both_ways(None, None, 400, 0).await;
}

/// Thousands each way, small and large mixed, with the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_mixed_sends_each_way_with_default_queues() {
    both_ways(None, None, 3000, 16).await;
}

/// Thousands each way, small and large mixed, with small send queues and windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_mixed_sends_each_way_with_small_queues() {
    for (wr, depth) in [(8, Some(4)), (16, None), (12, Some(16))] {
        both_ways(Some(wr), depth, 2000, 16).await;
    }
}
