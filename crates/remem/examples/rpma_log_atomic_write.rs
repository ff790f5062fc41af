//! An append-only log advanced with atomic write (librpma's log scenario): the server's
//! log is a file-backed region whose first 8 bytes hold the used length. The client
//! appends each record with a WRITE that completes only on error, makes it durable with a
//! persistent flush, then advances the length with an 8-byte atomic write and makes that
//! durable too — so a reader of the file never sees a length covering bytes that are not
//! there. At the end the file is read back and parsed.
//!
//! Run with `cargo run -p remem --example rpma_log_atomic_write`; exits non-zero if a check
//! fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error, FlushType, RemoteMr};
use rpma::{TempFile, check};
use std::alloc::Layout;

const LOG: usize = 64 * 1024;
const HEADER: usize = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let file = TempFile::new("log")?;
    let log = server.register_file(&file.file, 0, LOG, rpma::PMEM)?;
    let answer = ConnectOptions {
        private_data: log.descriptor(&server)?,
        ..ConnectOptions::default()
    };
    let (c, _s) = rpma::connect(&client, &listener, &ConnectOptions::default(), &answer).await?;
    let remote = RemoteMr::from_descriptor(&c.peer_private_data())?;
    let used = remote.get(0..HEADER)?;

    let records: Vec<String> = (0..50)
        .map(|i| format!("record {i}: {}\n", "x".repeat(i)))
        .collect();
    let mut end = HEADER;
    let scratch = client.alloc_local_mr(Layout::array::<u8>(256).unwrap())?;
    for r in &records {
        let bytes = r.as_bytes();
        scratch.write(0, bytes)?;
        let at = remote.get(end..end + bytes.len())?;
        c.post_write(&scratch.get(0..bytes.len())?, &at).await?;
        c.flush(&at, FlushType::Persistent).await?;
        end += bytes.len();
        // The record is durable: now the length may cover it.
        c.atomic_write(&used, (end - HEADER) as u64).await?;
        c.flush(&used, FlushType::Persistent).await?;
    }
    let on_disk = file.contents()?;
    let len = u64::from_ne_bytes(on_disk[..8].try_into().unwrap()) as usize;
    let text = std::str::from_utf8(&on_disk[8..8 + len]).unwrap_or("");
    check(
        len == end - HEADER,
        "the length word covers exactly the records",
    )?;
    check(
        text.lines().count() == records.len() && text == records.concat(),
        "the file holds every record, in order",
    )?;
    Ok(())
}
