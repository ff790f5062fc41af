//! librpma's "write with immediate data": the client writes into the server's region with
//! RDMA WRITE_WITH_IMM; the immediate tells the server where the data went (its offset),
//! and the server finds the bytes there — no other message needed.
//!
//! Run with `cargo run -p remem --example rpma_write_with_imm`; exits non-zero if a check
//! fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error};
use rpma::{check, pattern};
use std::alloc::Layout;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let none = ConnectOptions::default();
    let (c, s) = rpma::connect(&client, &listener, &none, &none).await?;
    let region = server.alloc_local_mr(Layout::array::<u8>(64 * 1024).unwrap())?;
    s.share_local_mr(&region).await?;
    let remote = c.receive_shared_mr().await?;
    let mut ok = true;
    for (k, off) in [0u32, 4096, 30_000, 60_000].into_iter().enumerate() {
        let data = pattern(1000, k as u8);
        let src = client.alloc_local_mr(Layout::array::<u8>(1000).unwrap())?;
        src.write(0, &data)?;
        c.write_with_imm(&src, &remote.get(off as usize..off as usize + 1000)?, off)
            .await?;
        let at = s.receive_write_imm().await? as usize;
        ok &= at == off as usize && region.to_vec()[at..at + 1000] == data[..];
    }
    check(ok, "each immediate named where its WRITE put the data")?;
    Ok(())
}
