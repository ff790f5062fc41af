//! A tiny RPC — "sum these numbers" — in two flavours:
//!
//! - over messages: each request is a SEND whose immediate is the request id; the server
//!   answers with a SEND carrying the same id;
//! - over one-sided operations: each side lends the other a region; the client WRITEs a
//!   request into the server's region and notifies with the immediate of a WRITE_WITH_IMM
//!   (the request's length), the server WRITEs the reply into the client's region and
//!   notifies the same way (the request's sequence number).
//!
//! The server serves until the client closes the connection. Two soft devices in this
//! process, 127.0.0.2 (server) and 127.0.0.1 (client), each on a free UDP port. Run with
//! `cargo run -p remem --example rpc`; it exits non-zero if a check fails.

use remem::{Connection, Error, Listener, LocalMr, Rdma, RdmaBuilder};
use std::alloc::Layout;
use std::net::SocketAddr;
use std::time::Duration;

/// The requests: how many numbers each sums (1, 2, ..., n).
const SIZES: [u64; 5] = [1, 2, 10, 100, 500];
/// The largest request, in bytes.
const MAX_REQUEST: usize = 500 * 8;

/// What the server computes: the wrapping sum of the little-endian u64s in `request`.
fn serve(request: &[u8]) -> u64 {
    let words = request
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()));
    words.fold(0, u64::wrapping_add)
}

/// A request of `n` numbers in a new region, and the reply it must get.
fn request(rdma: &Rdma, n: u64) -> Result<(LocalMr, u64), Error> {
    let bytes: Vec<u8> = (1..=n).flat_map(u64::to_le_bytes).collect();
    let mr = rdma.alloc_local_mr(Layout::from_size_align(bytes.len(), 8).unwrap())?;
    mr.write(0, &bytes)?;
    Ok((mr, n * (n + 1) / 2))
}

fn word(rdma: &Rdma) -> Result<LocalMr, Error> {
    rdma.alloc_local_mr(Layout::new::<u64>())
}

/// `None` once the peer has closed the connection.
fn until_closed<T>(result: Result<T, Error>) -> Result<Option<T>, Error> {
    match result {
        Err(Error::Closed(_)) => Ok(None),
        other => other.map(Some),
    }
}

/// Answers requests that come as messages until the client closes; returns how many.
async fn serve_messages(rdma: &Rdma, conn: &Connection) -> Result<usize, Error> {
    let (reply, mut served) = (word(rdma)?, 0);
    while let Some(msg) = until_closed(conn.receive().await)? {
        reply.store_u64(0, serve(&msg.data))?;
        conn.send_with_imm(&reply, msg.imm.unwrap_or_default())
            .await?;
        served += 1;
    }
    Ok(served)
}

/// Answers requests written into a lent region until the client closes; returns how many.
async fn serve_one_sided(rdma: &Rdma, conn: &Connection) -> Result<usize, Error> {
    let requests = rdma.alloc_local_mr(Layout::from_size_align(MAX_REQUEST, 8).unwrap())?;
    conn.share_local_mr(&requests).await?;
    let replies = conn.receive_shared_mr().await?;
    let (reply, mut served) = (word(rdma)?, 0);
    while let Some(len) = until_closed(conn.receive_write_imm().await)? {
        let mut request = vec![0; (len as usize).min(MAX_REQUEST)];
        requests.read(0, &mut request)?;
        reply.store_u64(0, serve(&request))?;
        conn.write_with_imm(&reply, &replies, served).await?;
        served += 1;
    }
    Ok(served as usize)
}

async fn server(rdma: Rdma, listener: Listener) -> Result<[usize; 2], Error> {
    let by_messages = serve_messages(&rdma, &listener.accept().await?).await?;
    let one_sided = serve_one_sided(&rdma, &listener.accept().await?).await?;
    Ok([by_messages, one_sided])
}

async fn over_messages(rdma: &Rdma, conn: &Connection) -> Result<(), Error> {
    for (id, n) in (0..).zip(SIZES) {
        let (req, expected) = request(rdma, n)?;
        conn.send_with_imm(&req, id).await?;
        let reply = conn.receive().await?;
        assert_eq!(reply.imm, Some(id), "the reply names its request");
        assert_eq!(reply.data, expected.to_le_bytes(), "sum of 1..={n}");
    }
    println!("checked: {} RPCs over send/receive", SIZES.len());
    Ok(())
}

async fn over_one_sided(rdma: &Rdma, conn: &Connection) -> Result<(), Error> {
    let requests = conn.receive_shared_mr().await?;
    let replies = word(rdma)?;
    conn.share_local_mr(&replies).await?;
    for (id, n) in (0..).zip(SIZES) {
        let (req, expected) = request(rdma, n)?;
        let len = req.len();
        conn.write_with_imm(&req, &requests.get(..len)?, len as u32)
            .await?;
        assert_eq!(conn.receive_write_imm().await?, id, "the reply's id");
        assert_eq!(replies.load_u64(0)?, expected, "sum of 1..={n}");
    }
    println!("checked: {} RPCs over write/write_with_imm", SIZES.len());
    Ok(())
}

async fn client(rdma: Rdma, server: SocketAddr) -> Result<(), Error> {
    let conn = rdma.connect(server).await?;
    over_messages(&rdma, &conn).await?;
    conn.close().await;
    let conn = rdma.connect(server).await?;
    over_one_sided(&rdma, &conn).await?;
    conn.close().await;
    Ok(())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let server_rdma = RdmaBuilder::new().device("soft@127.0.0.2:0").build()?;
    let client_rdma = RdmaBuilder::new().device("soft@127.0.0.1:0").build()?;
    let listener = server_rdma.listen("127.0.0.1:0").await?;
    let client = tokio::spawn(client(client_rdma, listener.local_addr()?));
    let server = tokio::spawn(server(server_rdma, listener));
    let (s, c) = tokio::join!(server, client);
    c??;
    assert_eq!(s??, [SIZES.len(); 2], "requests the server answered");
    println!("checked: the server answered every request and saw both closes");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Runtime::new()?;
    let limit = Duration::from_secs(30);
    runtime.block_on(async { tokio::time::timeout(limit, run()).await })?
}
