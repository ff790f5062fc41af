//! librpma's "send with immediate data": the client sends messages carrying a 32-bit
//! immediate value; the server receives each with its data and its immediate.
//!
//! Run with `cargo run -p remem --example rpma_send_with_imm`; exits non-zero if a check
//! fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error};
use rpma::check;
use std::alloc::Layout;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let none = ConnectOptions::default();
    let (c, s) = rpma::connect(&client, &listener, &none, &none).await?;
    let src = client.alloc_local_mr(Layout::array::<u8>(16).unwrap())?;
    for imm in [0u32, 1, 0xdead_beef, u32::MAX] {
        src.write(0, format!("{imm:>16}").as_bytes())?;
        c.send_with_imm(&src, imm).await?;
    }
    let mut ok = true;
    for imm in [0u32, 1, 0xdead_beef, u32::MAX] {
        let m = s.receive().await?;
        ok &= m.imm == Some(imm) && m.data == format!("{imm:>16}").as_bytes();
    }
    check(
        ok,
        "four messages, each with its immediate value and its data",
    )?;
    let _ = server;
    Ok(())
}
