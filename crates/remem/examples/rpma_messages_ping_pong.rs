//! librpma's "messages ping-pong": the client sends a counter, the server answers with the
//! counter plus one, for a number of rounds; every answer is checked.
//!
//! Run with `cargo run -p remem --example rpma_messages_ping_pong`; exits non-zero if a
//! check fails.

#[path = "rpma/mod.rs"]
mod rpma;

use remem::{ConnectOptions, Error};
use rpma::check;
use std::alloc::Layout;

const ROUNDS: u64 = 1000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let (server, client) = rpma::devices()?;
    let listener = rpma::listen(&server).await?;
    let none = ConnectOptions::default();
    let (c, s) = rpma::connect(&client, &listener, &none, &none).await?;
    let pong = async {
        let out = server.alloc_local_mr(Layout::new::<u64>())?;
        for _ in 0..ROUNDS {
            let m = s.receive().await?;
            let n = u64::from_le_bytes(
                m.data
                    .try_into()
                    .map_err(|_| Error::InvalidArgument("ping".into()))?,
            );
            out.write(0, &(n + 1).to_le_bytes())?;
            s.send(&out).await?;
        }
        Ok::<_, Error>(())
    };
    let ping = async {
        let out = client.alloc_local_mr(Layout::new::<u64>())?;
        let mut n = 7u64;
        for _ in 0..ROUNDS {
            out.write(0, &n.to_le_bytes())?;
            c.send(&out).await?;
            let m = c.receive().await?;
            let got = u64::from_le_bytes(
                m.data
                    .try_into()
                    .map_err(|_| Error::InvalidArgument("pong".into()))?,
            );
            if got != n + 1 {
                return Err(Error::InvalidArgument(format!("pong {got} for ping {n}")));
            }
            n = got;
        }
        Ok::<_, Error>(n)
    };
    let (served, last) = tokio::join!(pong, ping);
    served?;
    check(
        last? == 7 + ROUNDS,
        "a thousand pings, each answered with its successor",
    )?;
    Ok(())
}
