//! librpma's "read to volatile memory": the server exposes a region and sends its
//! descriptor in the connection's private data; the client turns the descriptor back into
//! a remote region and RDMA READs it into ordinary (volatile) memory.
//!
//! Run with `cargo run -p remem --example rpma_read_to_volatile`; exits non-zero if a check
//! fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error, RemoteMr};
use rpma::check;
use std::alloc::Layout;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let text = b"Hello, remote reader: these bytes live on the server.";
    let exposed = server.alloc_local_mr(Layout::array::<u8>(text.len()).unwrap())?;
    exposed.write(0, text)?;
    let answer = ConnectOptions {
        private_data: exposed.descriptor(&server)?,
        ..ConnectOptions::default()
    };
    let (c, _s) = rpma::connect(&client, &listener, &ConnectOptions::default(), &answer).await?;
    let remote = RemoteMr::from_descriptor(&c.peer_private_data())?;
    check(
        remote.len() == text.len(),
        "the descriptor names the whole region",
    )?;
    let mut local = client.alloc_local_mr(Layout::array::<u8>(text.len()).unwrap())?;
    c.read(&mut local, &remote).await?;
    check(local.to_vec() == text, "the client read the server's bytes")?;
    Ok(())
}
