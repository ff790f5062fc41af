//! Shared receive queues through the async API on soft devices (`common::first_device`
//! and its peers) or
//! `REMEM_TEST_DEVICE`: several
//! connections' messages arriving at one queue, in order per connection, bursts larger
//! than the queue, large messages and WRITE_WITH_IMM behind it.

use remem::{ConnectOptions, Connection, Error, Polling, Rdma, Srq};
use std::alloc::Layout;
use std::collections::HashMap;

use crate::common;

fn rdma(device: String) -> Rdma {
    common::builder(device)
        .polling(Polling::Event)
        .build()
        .unwrap()
}

/// A server and `clients` clients, each connected to the server through `srq`'s queue.
async fn setup(clients: usize, depth: u32) -> (Rdma, Srq, Vec<(Rdma, Connection, Connection)>) {
    let server = rdma(common::first_device());
    let srq = server.create_srq(depth).unwrap();
    let listener = server.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = ConnectOptions {
        srq: Some(srq.clone()),
        ..ConnectOptions::default()
    };
    let mut out = Vec::new();
    for _ in 0..clients {
        let client = rdma(common::peer_device());
        let accept = async { listener.next_request().await?.accept(&opts).await };
        let (c, s) = tokio::join!(client.connect(addr), accept);
        out.push((client, c.unwrap(), s.unwrap()));
    }
    (server, srq, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_many_connections_arrive_at_one_queue() {
    let (server, srq, conns) = setup(3, 8).await;
    // Each client sends 40 numbered messages without waiting: 120 messages into 8
    // buffers, so senders meet an empty queue and retry.
    let mut sends = Vec::new();
    for (k, (client, c, _)) in conns.iter().enumerate() {
        let m = client
            .alloc_local_mr(Layout::array::<u8>(5).unwrap())
            .unwrap();
        sends.push(async move {
            for i in 0..40u32 {
                m.write(0, &[k as u8, i as u8, 0, 0, 0]).unwrap();
                c.send_with_imm(&m, i).await.unwrap();
            }
        });
    }
    let by_qpn: HashMap<u32, usize> = conns
        .iter()
        .enumerate()
        .map(|(k, (_, _, s))| (s.qp_num(), k))
        .collect();
    let receive = async {
        let mut next = [0u32; 3];
        for _ in 0..120 {
            let (qpn, msg) = srq.receive().await.unwrap();
            let k = by_qpn[&qpn];
            // In order per connection, and from the connection the QP number names.
            assert_eq!(msg.imm, Some(next[k]));
            assert_eq!(msg.data, [k as u8, next[k] as u8, 0, 0, 0]);
            next[k] += 1;
        }
        next
    };
    let (_, next) = tokio::join!(futures_join(sends), receive);
    assert_eq!(next, [40; 3]);
    // Answers go back on the connection a message came from.
    let (_, c, s) = &conns[1];
    let reply = server
        .alloc_local_mr(Layout::array::<u8>(4).unwrap())
        .unwrap();
    reply.write(0, b"pong").unwrap();
    s.send(&reply).await.unwrap();
    assert_eq!(c.receive().await.unwrap().data, b"pong");
    // The connection itself has no messages of its own to give.
    assert!(matches!(s.receive().await, Err(Error::InvalidArgument(_))));
}

async fn futures_join<F: std::future::Future<Output = ()>>(fs: Vec<F>) {
    let handles: Vec<_> = fs.into_iter().map(Box::pin).collect();
    for h in handles {
        h.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_and_write_imm_behind_a_shared_queue() {
    let (server, srq, conns) = setup(2, 4).await;
    let target = server
        .alloc_local_mr(Layout::array::<u8>(64).unwrap())
        .unwrap();
    let (client, c, s) = &conns[0];
    s.share_local_mr(&target).await.unwrap();
    let remote = c.receive_shared_mr().await.unwrap();
    // Larger than the receive buffers: read by RDMA READ, delivered at the queue.
    let big = client
        .alloc_local_mr(Layout::array::<u8>(300_000).unwrap())
        .unwrap();
    big.write(0, &vec![3u8; 300_000]).unwrap();
    c.send(&big).await.unwrap();
    let (qpn, msg) = srq.receive().await.unwrap();
    assert_eq!((qpn, msg.data.len()), (s.qp_num(), 300_000));
    assert!(msg.data.iter().all(|&b| b == 3));
    // WRITE_WITH_IMM takes a buffer of the queue and reaches its connection.
    let src = client
        .alloc_local_mr(Layout::array::<u8>(8).unwrap())
        .unwrap();
    src.write(0, b"withimm!").unwrap();
    c.write_with_imm(&src, &remote.get(0..8).unwrap(), 77)
        .await
        .unwrap();
    assert_eq!(s.receive_write_imm().await.unwrap(), 77);
    assert_eq!(&target.to_vec()[..8], b"withimm!");
    // The other connection still works, and closing one leaves the queue serving the rest.
    let (client2, c2, s2) = &conns[1];
    c.close().await;
    let m = client2
        .alloc_local_mr(Layout::array::<u8>(3).unwrap())
        .unwrap();
    m.write(0, b"hey").unwrap();
    c2.send(&m).await.unwrap();
    let (qpn, msg) = srq.receive().await.unwrap();
    assert_eq!((qpn, msg.data.as_slice()), (s2.qp_num(), &b"hey"[..]));
    assert!(server.create_srq(0).is_err());
}
