//! librpma's "many connections served by one task": one server task accepts eight clients
//! and serves them all; each client writes its own tagged bytes into its own slice of the
//! server's region (shared over its connection) and tells the server by message; the
//! server checks every slice.
//!
//! Run with `cargo run -p remem --example rpma_many_connections`; exits non-zero if a check
//! fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{Error, RdmaBuilder};
use rpma::check;
use std::alloc::Layout;

const CLIENTS: usize = 8;
const SLICE: usize = 4096;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let server = RdmaBuilder::new().device("soft@127.0.46.1:0").build()?;
    let listener = rpma::listen(&server).await?;
    let addr = listener.local_addr()?;
    let region = server.alloc_local_mr(Layout::array::<u8>(CLIENTS * SLICE).unwrap())?;

    // One task serves every connection: accept them all, lend each its slice, then take
    // one message from each.
    let serve = async {
        let mut conns = Vec::new();
        for k in 0..CLIENTS {
            let conn = listener.accept().await?;
            conn.share_local_mr(&region).await?;
            let tag = server.alloc_local_mr(Layout::array::<u8>(1).unwrap())?;
            tag.write(0, &[k as u8])?;
            conn.send(&tag).await?;
            conns.push(conn);
        }
        for conn in &conns {
            let m = conn.receive().await?;
            let k = m.data[0] as usize;
            let slice = &region.to_vec()[k * SLICE..(k + 1) * SLICE];
            if !slice.iter().all(|&b| b == k as u8 + 1) {
                return Err(Error::InvalidArgument(format!("slice {k} is wrong")));
            }
        }
        Ok::<_, Error>(conns.len())
    };
    let clients = async {
        let mut tasks = Vec::new();
        for i in 0..CLIENTS {
            let rdma = RdmaBuilder::new()
                .device(format!("soft@127.0.46.{}:0", i + 2))
                .build()?;
            tasks.push(tokio::spawn(async move {
                let conn = rdma.connect(addr).await?;
                let remote = conn.receive_shared_mr().await?;
                let k = conn.receive().await?.data[0] as usize;
                let src = rdma.alloc_local_mr(Layout::array::<u8>(SLICE).unwrap())?;
                src.write(0, &[k as u8 + 1; SLICE])?;
                conn.write(&src, &remote.get(k * SLICE..(k + 1) * SLICE)?)
                    .await?;
                let tag = rdma.alloc_local_mr(Layout::array::<u8>(1).unwrap())?;
                tag.write(0, &[k as u8])?;
                conn.send(&tag).await?;
                // Stay connected until the server has checked.
                let _ = conn.next_event().await;
                let _ = conn.next_event().await;
                Ok::<_, Error>(())
            }));
        }
        Ok::<_, Error>(tasks)
    };
    let (served, tasks) = tokio::join!(serve, clients);
    check(
        served? == CLIENTS,
        "one task served eight connections, every slice right",
    )?;
    for t in tasks? {
        t.abort();
    }
    Ok(())
}
