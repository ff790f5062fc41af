//! librpma's "write to persistent memory": the server exposes a file-backed region; the
//! client writes into it with RDMA WRITE and makes the write durable with a persistent
//! flush; the server then finds the bytes in its file.
//!
//! Run with `cargo run -p remem --example rpma_write_to_persistent`; exits non-zero if a
//! check fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error, FlushType, RemoteMr};
use rpma::{TempFile, check};
use std::alloc::Layout;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let file = TempFile::new("write-to-pmem")?;
    let pmem = server.register_file(&file.file, 0, 4096, rpma::PMEM)?;
    let answer = ConnectOptions {
        private_data: pmem.descriptor(&server)?,
        ..ConnectOptions::default()
    };
    let (c, s) = rpma::connect(&client, &listener, &ConnectOptions::default(), &answer).await?;
    let remote = RemoteMr::from_descriptor(&c.peer_private_data())?;
    check(
        remote.supports_flush(FlushType::Persistent),
        "the region takes persistent flushes",
    )?;

    let text = b"Hello, persistent world!";
    let src = client.alloc_local_mr(Layout::array::<u8>(text.len()).unwrap())?;
    src.write(0, text)?;
    let dst = remote.get(0..text.len())?;
    c.write(&src, &dst).await?;
    c.flush(&dst, FlushType::Persistent).await?;
    // Tell the server, which checks its own file.
    let done = client.alloc_local_mr(Layout::array::<u8>(4).unwrap())?;
    done.write(0, b"done")?;
    c.send(&done).await?;
    check(s.receive().await?.data == b"done", "the server was told")?;
    check(
        file.contents()?.starts_with(text),
        "the server's file holds the flushed bytes",
    )?;
    Ok(())
}
