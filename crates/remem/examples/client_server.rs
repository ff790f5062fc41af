//! Client and server, async-rdma's front-page scenario: the client requests a region at the
//! server (`request_remote_mr`, a lease), writes into it with RDMA WRITE and hands it back
//! (`send_remote_mr`); the server takes it (`receive_local_mr`) and checks the bytes. Then
//! the server lends a region itself and the client tells it where it wrote — once with a
//! message after a plain WRITE, once with the immediate of a WRITE_WITH_IMM. No data is
//! copied through a message.
//!
//! Two soft devices in this process, 127.0.0.2 (server) and 127.0.0.1 (client), each on a
//! free UDP port (remem's handshake tells each the other's). Run with `cargo run -p remem --example client_server`; it exits non-zero if a
//! check fails.

use remem::{Error, RdmaBuilder};
use std::alloc::Layout;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

/// The region the server lends: 8 bytes, as in the original scenario.
const LEN: usize = 8;

/// Where the client finds the server: the TCP address it listens on.
type Address = SocketAddr;

async fn server(listening: oneshot::Sender<Address>) -> Result<(), Error> {
    let rdma = RdmaBuilder::new().device("soft@127.0.0.2:0").build()?;
    let listener = rdma.listen("127.0.0.1:0").await?;
    let _ = listening.send(listener.local_addr()?);
    let conn = listener.accept().await?;
    // 0. The client requested a region here (the agent served it), wrote, and gave it back.
    let given = conn.receive_local_mr().await?;
    assert_eq!(given.to_vec(), [9; LEN]);
    println!("checked: a requested region came back with the client's bytes");

    let lent = rdma.alloc_local_mr(Layout::new::<[u8; LEN]>())?;
    conn.share_local_mr(&lent).await?;

    // 1. A plain WRITE, then a message naming the range written. RC delivers in order: the
    //    data is in place before the message arrives.
    let msg = conn.receive().await?;
    assert_eq!(msg.data, [4, 4], "the client wrote bytes 4..8");
    // Only bytes 4..8 are settled here: the client may already be writing 0..4 (step 2).
    assert_eq!(lent.get(4..8)?.to_vec(), [1, 1, 1, 1]);
    println!("checked: WRITE of bytes 4..8 seen by the server after the client's message");

    // 2. WRITE_WITH_IMM: the immediate (here the offset written) is the notification.
    let offset = conn.receive_write_imm().await?;
    assert_eq!(offset, 0);
    assert_eq!(lent.to_vec(), [2, 2, 2, 2, 1, 1, 1, 1]);
    println!("checked: WRITE_WITH_IMM of bytes 0..4 seen by the server with its immediate");

    // Tell the client it may go: the region stays lent until `lent` is dropped.
    conn.send(&lent.get(0..1)?).await?;
    Ok(())
}

async fn client(server: oneshot::Receiver<Address>) -> Result<(), Error> {
    let addr = server.await.expect("the server listens or fails");
    let rdma = RdmaBuilder::new().device("soft@127.0.0.1:0").build()?;
    let conn = rdma.connect(addr).await?;
    let local = rdma.alloc_local_mr(Layout::new::<[u8; LEN]>())?;

    // 0. Request a region at the server for ten seconds, write, give it back.
    let lease = conn
        .request_remote_mr(Layout::new::<[u8; LEN]>(), Duration::from_secs(10))
        .await?;
    local.write(0, &[9; LEN])?;
    conn.write(&local, lease.mr()).await?;
    conn.send_remote_mr(lease).await?;

    let remote = conn.receive_shared_mr().await?;
    assert_eq!(remote.len(), LEN);

    local.write(0, &[1; LEN])?;
    conn.write(&local.get(4..8)?, &remote.get(4..8)?).await?;
    let range = rdma.alloc_local_mr(Layout::new::<[u8; 2]>())?;
    range.write(0, &[4, 4])?; // offset 4, length 4
    conn.send(&range).await?;

    local.write(0, &[2; LEN])?;
    conn.write_with_imm(&local.get(0..4)?, &remote.get(0..4)?, 0)
        .await?;

    let done = conn.receive().await?;
    assert_eq!(done.data, [2], "the server's first byte, as it sees it");
    println!("checked: the server's reply");
    Ok(())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (listening, server_address) = oneshot::channel();
    let server = tokio::spawn(server(listening));
    let client = tokio::spawn(client(server_address));
    let (s, c) = tokio::join!(server, client);
    s??;
    c??;
    println!("checked: client and server finished");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Runtime::new()?;
    let limit = Duration::from_secs(30);
    runtime.block_on(async { tokio::time::timeout(limit, run()).await })?
}
