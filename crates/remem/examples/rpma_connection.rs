//! Connection setup as librpma's "connection" scenario: the client connects with private
//! data, the server reads it from the connection request and accepts with private data of
//! its own; both see the connection established, the client closes and both see it closed.
//! A second client is rejected, and its connect fails with the server's reason.
//!
//! Run with `cargo run -p remem --example rpma_connection`; exits non-zero if a check fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, ConnectionEvent, Error};
use rpma::check;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let addr = listener.local_addr()?;
    let hello = ConnectOptions {
        private_data: b"hello from the client".to_vec(),
        ..ConnectOptions::default()
    };
    let serve = async {
        let req = listener.next_request().await?;
        check(
            req.private_data() == b"hello from the client",
            "the server read the client's private data",
        )?;
        let answer = ConnectOptions {
            private_data: b"welcome".to_vec(),
            ..ConnectOptions::default()
        };
        req.accept(&answer).await
    };
    let (c, s) = tokio::join!(client.connect_with(addr, &hello), serve);
    let (c, s) = (c?, s?);
    check(
        c.peer_private_data() == b"welcome",
        "the client read the server's answer",
    )?;
    check(
        c.next_event().await == ConnectionEvent::Established
            && s.next_event().await == ConnectionEvent::Established,
        "both sides see the connection established",
    )?;
    c.close().await;
    check(
        s.next_event().await == ConnectionEvent::Closed
            && c.next_event().await == ConnectionEvent::Closed,
        "both sides see it closed in order",
    )?;

    let reject = async {
        let req = listener.next_request().await?;
        req.reject(b"no room").await
    };
    let (refused, rejected) = tokio::join!(client.connect(addr), reject);
    rejected?;
    check(
        matches!(refused, Err(Error::Rejected(ref why)) if why == b"no room"),
        "a rejected client learns why",
    )?;
    Ok(())
}
