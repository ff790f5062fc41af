//! librpma's "separate receive completion queue": both sides' connections put receive
//! completions on a completion queue of their own (`ConnectOptions::separate_recv_cq`);
//! messages flow both ways while one-sided writes complete on the send queue's CQ.
//!
//! Run with `cargo run -p remem --example rpma_separate_recv_cq`; exits non-zero if a check
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
    let rcq = ConnectOptions {
        separate_recv_cq: true,
        ..ConnectOptions::default()
    };
    let (c, s) = rpma::connect(&client, &listener, &rcq, &rcq).await?;
    let region = server.alloc_local_mr(Layout::array::<u8>(4096).unwrap())?;
    s.share_local_mr(&region).await?;
    let remote = c.receive_shared_mr().await?;
    let a = client.alloc_local_mr(Layout::array::<u8>(512).unwrap())?;
    let b = server.alloc_local_mr(Layout::array::<u8>(512).unwrap())?;
    let mut ok = true;
    for round in 0..50u8 {
        a.write(0, &pattern(512, round))?;
        c.write(&a, &remote.get(0..512)?).await?;
        c.send(&a).await?;
        ok &= s.receive().await?.data == pattern(512, round);
        b.write(0, &pattern(512, !round))?;
        s.send(&b).await?;
        ok &= c.receive().await?.data == pattern(512, !round)
            && region.to_vec()[..512] == pattern(512, round)[..];
    }
    check(
        ok,
        "fifty rounds of writes and messages both ways with separate receive CQs",
    )?;
    Ok(())
}
