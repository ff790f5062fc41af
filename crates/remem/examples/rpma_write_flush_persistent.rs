//! librpma's "write and flush to persistent memory", with completions on error only: the
//! client posts several RDMA WRITEs that complete silently (`post_write`), then one
//! persistent flush whose completion means all of them are durable in the server's file.
//!
//! Then the same on a client whose device has no RoCEv2 FLUSH (a soft device emulating
//! kernel Soft-RoCE before Linux 6.2): a persistent flush is refused until the client
//! applies the server's peer configuration — its declaration that writes reach its
//! persistent memory directly, which is the peer's promise about its hardware — and then
//! done as librpma does it, with a READ after the writes.
//!
//! Run with `cargo run -p remem --example rpma_write_flush_persistent`; exits non-zero if a
//! check fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error, FlushType, PeerConfig, RdmaBuilder, RemoteMr};
use remem_soft::{SoftContext, SoftOptions};
use rpma::{TempFile, check, pattern};
use std::alloc::Layout;
use std::sync::Arc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let file = TempFile::new("write-flush")?;
    let pmem = server.register_file(&file.file, 0, 16 * 1024, rpma::PMEM)?;
    // Private data: the region's descriptor, then the server's peer configuration.
    let mut pd = pmem.descriptor(&server)?;
    pd.extend_from_slice(
        &PeerConfig {
            direct_write_to_pmem: true,
        }
        .descriptor(),
    );
    let answer = ConnectOptions {
        private_data: pd,
        ..ConnectOptions::default()
    };
    let (c, _s) = rpma::connect(&client, &listener, &ConnectOptions::default(), &answer).await?;
    let got = c.peer_private_data();
    let (mr_desc, cfg_desc) = got.split_at(remem::MR_DESCRIPTOR_LEN);
    let remote = RemoteMr::from_descriptor(mr_desc)?;

    let data = pattern(8 * 1024, 9);
    let src = client.alloc_local_mr(Layout::array::<u8>(data.len()).unwrap())?;
    src.write(0, &data)?;
    for k in 0..8 {
        let part = src.get(k * 1024..(k + 1) * 1024)?;
        c.post_write(&part, &remote.get(k * 1024..(k + 1) * 1024)?)
            .await?;
    }
    c.flush(&remote.get(0..8 * 1024)?, FlushType::Persistent)
        .await?;
    check(
        file.contents()?[..8 * 1024] == data[..],
        "eight silent WRITEs and one persistent FLUSH: all durable in the server's file",
    )?;

    // A device without FLUSH.
    let old = SoftContext::bind_with(
        "127.0.0.3:0".parse().expect("address"),
        &SoftOptions {
            no_placement: true,
            ..SoftOptions::default()
        },
    )?;
    let legacy = RdmaBuilder::new().context(Arc::new(old)).build()?;
    let (c2, _s2) = rpma::connect(&legacy, &listener, &ConnectOptions::default(), &answer).await?;
    let src2 = legacy.alloc_local_mr(Layout::array::<u8>(1024).unwrap())?;
    src2.write(0, &pattern(1024, 1))?;
    let dst2 = remote.get(8 * 1024..9 * 1024)?;
    c2.post_write(&src2, &dst2).await?;
    check(
        matches!(
            c2.flush(&dst2, FlushType::Persistent).await,
            Err(Error::Unsupported(_))
        ),
        "without FLUSH and without the peer's declaration, a persistent flush is refused",
    )?;
    c2.apply_peer_config(PeerConfig::from_descriptor(cfg_desc)?);
    c2.flush(&dst2, FlushType::Persistent).await?;
    check(
        file.contents()?[8 * 1024..9 * 1024] == pattern(1024, 1)[..],
        "with the declaration, the READ-after-WRITE flush completes and the bytes are there",
    )?;
    Ok(())
}
