//! Many connections to one server: one listener accepts `CLIENTS` clients at once, each with
//! its own device (127.0.3.2, 127.0.3.3, ...; the server is 127.0.3.1; each on a free UDP
//! port, which remem's handshake tells the peer). The server lends the same 8-byte counter on every connection; every client adds
//! to it `ADDS` times with RDMA FETCH_AND_ADD, then reports by message. Checked: the final
//! counter is the sum of all adds, and the values the adds returned are each of
//! `0..CLIENTS * ADDS` exactly once — no add was lost or seen twice across connections.
//!
//! Run with `cargo run -p remem --example multi_connection`; it exits non-zero if a check
//! fails.

use remem::{Connection, Error, LocalMr, RdmaBuilder};
use std::alloc::Layout;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const CLIENTS: u8 = 8;
const ADDS: u64 = 100;

/// Lends `counter` on `conn`, then waits for the client's report: how many adds it did.
async fn serve(conn: Connection, counter: Arc<LocalMr>) -> Result<u64, Error> {
    conn.share_local_mr(&counter).await?;
    let report = conn.receive().await?;
    let adds = u64::from_le_bytes(report.data.try_into().expect("an 8-byte report"));
    conn.close().await;
    Ok(adds)
}

/// Client `i`: its own device, a connection, `ADDS` adds; returns the values they returned.
async fn client(i: u8, server: SocketAddr) -> Result<Vec<u64>, Error> {
    let rdma = RdmaBuilder::new()
        .device(format!("soft@127.0.3.{}:0", i + 2))
        .build()?;
    let conn = rdma.connect(server).await?;
    let counter = conn.receive_shared_mr().await?;
    let mut seen = Vec::new();
    for _ in 0..ADDS {
        seen.push(conn.fetch_and_add(&counter, 1).await?);
    }
    let report = rdma.alloc_local_mr(Layout::new::<u64>())?;
    report.store_u64(0, ADDS)?;
    conn.send(&report).await?;
    // The server closes once it has the report.
    assert!(matches!(conn.receive().await, Err(Error::Closed(_))));
    Ok(seen)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let server = RdmaBuilder::new().device("soft@127.0.3.1:0").build()?;
    let listener = server.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(i, addr)))
        .collect();

    let counter = Arc::new(server.alloc_local_mr(Layout::new::<u64>())?);
    let mut served = Vec::new();
    for _ in 0..CLIENTS {
        let conn = listener.accept().await?;
        served.push(tokio::spawn(serve(conn, counter.clone())));
    }
    let mut reported = 0;
    for s in served {
        reported += s.await??;
    }
    let mut seen = Vec::new();
    for c in clients {
        seen.extend(c.await??);
    }

    let total = u64::from(CLIENTS) * ADDS;
    assert_eq!(reported, total, "adds the clients reported");
    assert_eq!(counter.load_u64(0)?, total, "the counter");
    println!("checked: {CLIENTS} connections, counter = {total}");
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..total).collect::<Vec<_>>(),
        "values the adds returned"
    );
    println!("checked: each of 0..{total} returned by exactly one add");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Runtime::new()?;
    let limit = Duration::from_secs(30);
    runtime.block_on(async { tokio::time::timeout(limit, run()).await })?
}
