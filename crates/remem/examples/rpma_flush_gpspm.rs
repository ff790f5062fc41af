//! A flush carried out through messages (librpma's "GPSPM", general-purpose server
//! persistency method): the client writes into the server's file-backed region with RDMA
//! WRITE, then asks the server by message to make the range durable; the server does it
//! itself (`LocalMr::persist`: the range's pages written back to its file) and answers; only then does
//! the client count the data as persistent. No RoCEv2 FLUSH is used — this is how
//! persistence works with a peer whose NIC cannot flush.
//!
//! Run with `cargo run -p remem --example rpma_flush_gpspm`; exits non-zero if a check
//! fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error, RemoteMr};
use rpma::{TempFile, check, pattern};
use std::alloc::Layout;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let file = TempFile::new("gpspm")?;
    let pmem = server.register_file(
        &file.file,
        0,
        32 * 1024,
        remem::AccessFlags::LOCAL_WRITE | remem::AccessFlags::REMOTE_WRITE,
    )?;
    let answer = ConnectOptions {
        private_data: pmem.descriptor(&server)?,
        ..ConnectOptions::default()
    };
    let (c, s) = rpma::connect(&client, &listener, &ConnectOptions::default(), &answer).await?;
    let remote = RemoteMr::from_descriptor(&c.peer_private_data())?;

    // The server's persistence service: "offset,len" → persist → "ok".
    let server_side = async {
        let reply = server.alloc_local_mr(Layout::array::<u8>(2).unwrap())?;
        reply.write(0, b"ok")?;
        for _ in 0..4 {
            let req = s.receive().await?;
            let text = String::from_utf8_lossy(&req.data).into_owned();
            let (off, len) = text
                .split_once(',')
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                .ok_or_else(|| Error::InvalidArgument(format!("bad request {text}")))?;
            // The server makes the range durable itself.
            pmem.persist(off as usize, len as usize)?;
            s.send(&reply).await?;
        }
        Ok::<_, Error>(())
    };
    let client_side = async {
        let msg = client.alloc_local_mr(Layout::array::<u8>(32).unwrap())?;
        for k in 0..4usize {
            let data = pattern(8 * 1024, k as u8);
            let src = client.alloc_local_mr(Layout::array::<u8>(data.len()).unwrap())?;
            src.write(0, &data)?;
            let (off, len) = (k * 8 * 1024, 8 * 1024);
            c.write(&src, &remote.get(off..off + len)?).await?;
            let text = format!("{off},{len}");
            msg.write(0, text.as_bytes())?;
            c.send(&msg.get(0..text.len())?).await?;
            if c.receive().await?.data != b"ok" {
                return Err(Error::InvalidArgument("no ok".into()));
            }
        }
        Ok::<_, Error>(())
    };
    let (a, b) = tokio::join!(server_side, client_side);
    a?;
    b?;
    let on_disk = file.contents()?;
    check(
        (0..4u8)
            .all(|k| on_disk[k as usize * 8192..(k as usize + 1) * 8192] == pattern(8192, k)[..]),
        "four writes, each made durable by the server on request",
    )?;
    Ok(())
}
