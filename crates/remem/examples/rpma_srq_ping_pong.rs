//! Message ping-pong over a shared receive queue with several connections (librpma's SRQ
//! ping-pong scenario, written anew for remem): one server, one shared receive queue, and
//! several clients. Every client's pings land in the queue's buffers; the server takes
//! them from the queue in arrival order, learns from each which connection it came on
//! (its local queue pair number), and answers on that connection. Each client checks
//! that every pong answers its own ping.
//!
//! Soft devices in this process: the server on 127.0.40.1, clients on 127.0.40.2..; each
//! on a free UDP port. Run with `cargo run -p remem --example rpma_srq_ping_pong`; it exits non-zero
//! if a check fails.

use remem::{ConnectOptions, Connection, Error, RdmaBuilder};
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::Arc;

const CLIENTS: u8 = 4;
const ROUNDS: u64 = 100;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let server = RdmaBuilder::new().device("soft@127.0.40.1:0").build()?;
    // Fewer buffers than pings in flight at once: the queue is shared, not per client.
    let srq = server.create_srq(CLIENTS as u32)?;
    let listener = server.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let opts = ConnectOptions {
        srq: Some(srq.clone()),
        ..ConnectOptions::default()
    };

    // Clients connect and ping; each waits for the pong to its ping before the next.
    let mut clients = Vec::new();
    let mut by_qpn: HashMap<u32, Arc<Connection>> = HashMap::new();
    for k in 0..CLIENTS {
        let rdma = RdmaBuilder::new()
            .device(format!("soft@127.0.40.{}:0", k + 2))
            .build()?;
        let accept = async { listener.next_request().await?.accept(&opts).await };
        let (conn, accepted) = tokio::join!(rdma.connect(addr), accept);
        // The server accepted it onto the shared queue.
        let accepted = accepted?;
        by_qpn.insert(accepted.qp_num(), Arc::new(accepted));
        clients.push((rdma, conn?));
    }

    let server_task = {
        let srq = srq.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let pong = server.alloc_local_mr(Layout::new::<[u8; 8]>())?;
            for _ in 0..ROUNDS * CLIENTS as u64 {
                let (qpn, ping) = srq.receive().await?;
                let conn = by_qpn.get(&qpn).expect("a ping from a known connection");
                let n = u64::from_le_bytes(ping.data.try_into().expect("8-byte ping"));
                pong.write(0, &(n + 1).to_le_bytes())?;
                conn.send(&pong).await?;
            }
            Ok::<_, Error>(())
        })
    };

    let mut pingers = Vec::new();
    for (k, (rdma, conn)) in clients.into_iter().enumerate() {
        pingers.push(tokio::spawn(async move {
            let ping = rdma.alloc_local_mr(Layout::new::<[u8; 8]>())?;
            for round in 0..ROUNDS {
                let n = (k as u64) << 32 | round;
                ping.write(0, &n.to_le_bytes())?;
                conn.send(&ping).await?;
                let pong = conn.receive().await?;
                let got = u64::from_le_bytes(pong.data.try_into().expect("8-byte pong"));
                assert_eq!(got, n + 1, "client {k} round {round}");
            }
            Ok::<_, Error>(())
        }));
    }
    for p in pingers {
        p.await.expect("client task")?;
    }
    server_task.await.expect("server task")?;
    println!(
        "checked: {CLIENTS} clients x {ROUNDS} ping-pongs through one shared receive queue of {} buffers",
        srq.depth()
    );
    Ok(())
}
