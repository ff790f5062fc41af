//! librpma's "read to persistent memory": the side with persistent memory (here the
//! client, with a file-backed region) reads the other side's data with RDMA READ straight
//! into it and makes it durable there; the file then holds the bytes.
//!
//! Run with `cargo run -p remem --example rpma_read_to_persistent`; exits non-zero if a
//! check fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error, RemoteMr};
use rpma::{TempFile, check, pattern};
use std::alloc::Layout;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let data = pattern(64 * 1024, 3);
    let source = server.alloc_local_mr(Layout::array::<u8>(data.len()).unwrap())?;
    source.write(0, &data)?;
    let answer = ConnectOptions {
        private_data: source.descriptor(&server)?,
        ..ConnectOptions::default()
    };
    let (c, _s) = rpma::connect(&client, &listener, &ConnectOptions::default(), &answer).await?;
    let remote = RemoteMr::from_descriptor(&c.peer_private_data())?;

    let file = TempFile::new("read-to-pmem")?;
    let mut pmem = client.register_file(&file.file, 0, data.len(), rpma::PMEM)?;
    c.read(&mut pmem, &remote).await?;
    // Durable on this side: the mapping's dirty pages written back to the file.
    file.file.sync_data()?;
    check(
        pmem.to_vec() == data,
        "the READ landed in the file-backed region",
    )?;
    check(file.contents()? == data, "the file holds the bytes read")?;
    Ok(())
}
