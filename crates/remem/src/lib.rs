//! Asynchronous RDMA for Rust.
//!
//! remem runs on RDMA NICs through rdma-core and, where there is no RDMA hardware or kernel
//! module, on its own userspace RoCEv2 stack that speaks the wire protocol of Linux
//! Soft-RoCE (`rdma_rxe`) — so RDMA code can be developed and tested on a laptop or in CI.
//!
//! # Connect, lend memory, write, read, do atomics, send
//!
//! Two soft devices on this machine (127.0.0.1 and 127.0.0.2, each on a free UDP port: the
//! handshake tells each device the other's); the same code runs on RDMA NICs by naming
//! another device.
//!
//! ```
//! use remem::{Polling, RdmaBuilder};
//! use std::alloc::Layout;
//!
//! # fn main() -> Result<(), remem::Error> {
//! tokio::runtime::Runtime::new()?.block_on(async {
//!     let server = RdmaBuilder::new().device("soft@127.0.0.2:0").build()?;
//!     let client = RdmaBuilder::new()
//!         .device("soft@127.0.0.1:0")
//!         .polling(Polling::Event)
//!         .build()?;
//!
//!     let listener = server.listen("127.0.0.1:0").await?;
//!     let addr = listener.local_addr()?;
//!     let (client_conn, server_conn) = tokio::join!(client.connect(addr), listener.accept());
//!     let (c, s) = (client_conn?, server_conn?);
//!
//!     // The server lends 4 KiB; the client writes into it and reads it back.
//!     let lent = server.alloc_local_mr(Layout::from_size_align(4096, 8).unwrap())?;
//!     s.share_local_mr(&lent).await?;
//!     let remote = c.receive_shared_mr().await?;
//!
//!     let local = client.alloc_local_mr(Layout::from_size_align(5, 1).unwrap())?;
//!     local.write(0, b"hello")?;
//!     c.write(&local, &remote.get(0..5)?).await?;
//!     assert_eq!(&lent.to_vec()[..5], b"hello");
//!
//!     let mut back = client.alloc_local_mr(Layout::from_size_align(5, 1).unwrap())?;
//!     c.read(&mut back, &remote.get(0..5)?).await?;
//!     assert_eq!(back.to_vec(), b"hello");
//!
//!     // Atomics return the value they replaced.
//!     let counter = remote.get(8..16)?;
//!     assert_eq!(c.fetch_and_add(&counter, 5).await?, 0);
//!     assert_eq!(c.compare_and_swap(&counter, 5, 9).await?, 5);
//!
//!     // Two-sided messages, flow-controlled by credits.
//!     c.send_with_imm(&local, 7).await?;
//!     let msg = s.receive().await?;
//!     assert_eq!((msg.data.as_slice(), msg.imm), (&b"hello"[..], Some(7)));
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # Remote persistent memory
//!
//! As librpma offers it: a region backed by a file at the target, written by the peer and
//! made durable with a persistent flush (a RoCEv2 FLUSH; the target writes the range back
//! to the file before it answers).
//!
//! ```
//! use remem::{AccessFlags, FlushType, RdmaBuilder};
//! use std::alloc::Layout;
//!
//! # fn main() -> Result<(), remem::Error> {
//! tokio::runtime::Runtime::new()?.block_on(async {
//!     let target = RdmaBuilder::new().device("soft@127.0.0.4:0").build()?;
//!     let writer = RdmaBuilder::new().device("soft@127.0.0.3:0").build()?;
//!     let listener = target.listen("127.0.0.1:0").await?;
//!     let addr = listener.local_addr()?;
//!     let (w, t) = tokio::join!(writer.connect(addr), listener.accept());
//!     let (w, t) = (w?, t?);
//!
//!     let path = std::env::temp_dir().join(format!("remem-doc-{}", std::process::id()));
//!     let file = std::fs::OpenOptions::new().read(true).write(true).create(true).open(&path)?;
//!     let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
//!         | AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
//!     let log = target.register_file(&file, 0, 4096, access)?;
//!     t.share_local_mr(&log).await?;
//!     let remote = w.receive_shared_mr().await?;
//!
//!     let record = writer.alloc_local_mr(Layout::array::<u8>(6).unwrap())?;
//!     record.write(0, b"record")?;
//!     w.post_write(&record, &remote.get(0..6)?).await?; // completes only on error
//!     w.flush(&remote.get(0..6)?, FlushType::Persistent).await?; // durable once it returns
//!     assert_eq!(&std::fs::read(&path)?[..6], b"record");
//!     std::fs::remove_file(&path)?;
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # Put an existing tokio program on RDMA
//!
//! [`RdmaStream`] is a connected, ordered byte stream over a [`Connection`], with tokio's
//! `AsyncRead` and `AsyncWrite`: what runs on a `TcpStream` — `tokio::io::copy`,
//! `BufReader`, codecs, hyper, tonic — runs on it unchanged. Both sides wrap their end of
//! a connection:
//!
//! ```
//! use remem::{RdmaBuilder, RdmaStream};
//! use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! tokio::runtime::Runtime::new()?.block_on(async {
//!     let server = RdmaBuilder::new().device("soft@127.0.0.9:0").build()?;
//!     let client = RdmaBuilder::new().device("soft@127.0.0.10:0").build()?;
//!     let listener = server.listen("127.0.0.1:0").await?;
//!     let addr = listener.local_addr()?;
//!     let (c, s) = tokio::join!(client.connect(addr), listener.accept());
//!     let (mut c, s) = (RdmaStream::new(c?)?, RdmaStream::new(s?)?);
//!
//!     // A line-based echo server, written as for TCP.
//!     tokio::spawn(async move {
//!         let (r, mut w) = s.into_split();
//!         let mut lines = BufReader::new(r).lines();
//!         while let Ok(Some(line)) = lines.next_line().await {
//!             w.write_all(format!("echo: {line}\n").as_bytes()).await?;
//!             w.flush().await?;
//!         }
//!         std::io::Result::Ok(())
//!     });
//!     c.write_all(b"hello\n").await?;
//!     c.flush().await?;
//!     let mut answer = String::new();
//!     BufReader::new(&mut c).read_line(&mut answer).await?;
//!     assert_eq!(answer, "echo: hello\n");
//!     Ok(())
//! })
//! # }
//! ```
//!
//! What is copied when, backpressure, half-close and the `io::ErrorKind`s a TCP user tests
//! for: the [`stream`] module. As with tokio's `BufWriter`, flush after writing what the peer
//! must see (hyper, tonic and `tokio::io::copy` do).
//!
//! **hyper** (feature `hyper`): a server hands each accepted stream to hyper as it would a
//! `TcpStream`; a client connects by URI with `stream::hyper::RdmaConnector` — the URI
//! names the server's remem listener. HTTP/1.1 and HTTP/2 alike (`examples/http.rs` runs
//! them between two processes):
//!
//! ```
//! # #[cfg(feature = "hyper")]
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use http_body_util::{BodyExt, Full};
//! use hyper_util::rt::{TokioExecutor, TokioIo};
//! use remem::stream::hyper::RdmaConnector;
//! use remem::{RdmaBuilder, RdmaStream};
//!
//! tokio::runtime::Runtime::new()?.block_on(async {
//!     let server = RdmaBuilder::new().device("soft@127.0.0.11:0").build()?;
//!     let listener = server.listen("127.0.0.1:0").await?;
//!     let addr = listener.local_addr()?;
//!     tokio::spawn(async move {
//!         while let Ok(conn) = listener.accept().await {
//!             let io = TokioIo::new(RdmaStream::new(conn)?);
//!             let hello = hyper::service::service_fn(|_req| async {
//!                 Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
//!                     bytes::Bytes::from_static(b"hello over RDMA"),
//!                 )))
//!             });
//!             tokio::spawn(async move {
//!                 let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
//!                 http.serve_connection(io, hello).await
//!             });
//!         }
//!         Ok::<(), remem::Error>(())
//!     });
//!
//!     let client_rdma = RdmaBuilder::new().device("soft@127.0.0.12:0").build()?;
//!     let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
//!         .build::<_, Full<bytes::Bytes>>(RdmaConnector::new(client_rdma));
//!     let res = client.get(format!("http://{addr}/").parse()?).await?;
//!     assert_eq!(res.into_body().collect().await?.to_bytes(), "hello over RDMA");
//!     Ok(())
//! })
//! # }
//! # #[cfg(not(feature = "hyper"))]
//! # fn main() {}
//! ```
//!
//! **tonic** (feature `tonic`): the server serves on the streams its listener accepts,
//! `stream::tonic::Incoming`; the client's channel connects with the same connector.
//! Everything else — the generated service, the client stub — is tonic's as over TCP
//! (`examples/grpc.rs`, unary calls and a bidirectional stream between two processes, runs
//! in CI):
//!
//! ```ignore
//! // Server: any tonic service, on a remem listener.
//! let listener = rdma.listen("0.0.0.0:50051").await?;
//! tonic::transport::Server::builder()
//!     .add_service(GreeterServer::new(MyGreeter::default()))
//!     .serve_with_incoming(remem::stream::tonic::Incoming::new(listener))
//!     .await?;
//!
//! // Client: a channel whose connections are RDMA streams.
//! let channel = tonic::transport::Endpoint::from_static("http://server:50051")
//!     .connect_with_connector(remem::stream::hyper::RdmaConnector::new(rdma))
//!     .await?;
//! let mut client = GreeterClient::new(channel);
//! ```
//!
//! Memory the NIC or the peer may touch is never exposed as `&[u8]`: see [`LocalMr`] for
//! the model. The crate's design (dispatcher, credits, cancellation) is described in
//! the repository's docs/api.md.
//!
//! # Devices
//!
//! ```
//! // List the devices remem can open: at least the soft device on the loopback interface.
//! let devices = remem::devices().unwrap();
//! assert!(devices.iter().any(|d| d.name == "soft-lo"));
//!
//! // Open a soft device on 127.0.0.1 (port 0: any free UDP port; `soft-lo` would take the
//! // RoCEv2 port 4791, as a kernel rxe device does).
//! let ctx = remem::open_device(Some("soft@127.0.0.1:0")).unwrap();
//! let port = ctx.query_port(1).unwrap();
//! println!("{} active MTU {}", ctx.info().name, port.active_mtu);
//! ```

#![warn(missing_docs)]

// Unsafe code lives in three places only: `sys` (registering a completion channel's fd
// with tokio's reactor), one function of `conn/inbox.rs` (a received message read where it
// landed) and one of `stream/staging.rs` (a byte stream's send buffer filled with a plain
// copy while it is not posted). Every other module forbids it: no `allow` inside can let
// it back in.
#[forbid(unsafe_code)]
mod cm;
mod conn;
/// What fails how: failed operations, regions that go away, stopped peers, retry and
/// operation timeouts, flow control, connection loss (`FAILURE_MODEL.md`).
#[doc = include_str!("../FAILURE_MODEL.md")]
pub mod failure_model {}
#[forbid(unsafe_code)]
mod dispatch;
#[forbid(unsafe_code)]
mod error;
#[forbid(unsafe_code)]
mod mr;
#[forbid(unsafe_code)]
mod persist;
#[forbid(unsafe_code)]
mod pool;
#[forbid(unsafe_code)]
mod rdma;
#[forbid(unsafe_code)]
pub mod rpc;
#[deny(unsafe_code)]
pub mod stream;
mod sys;
#[cfg(test)]
#[forbid(unsafe_code)]
mod test_util;
#[forbid(unsafe_code)]
mod typed;

pub use cm::{
    CM_EXTRAS_LEN, CmConnRequest, CmListener, MAX_CM_ACCEPT_PRIVATE_DATA,
    MAX_CM_CONNECT_PRIVATE_DATA,
};
pub use conn::{
    Batch, ConnRequest, ConnectOptions, Connection, ConnectionEvent, ENDPOINT_INFO_LEN,
    EndpointInfo, HandshakeFailure, Listener, MAX_PRIVATE_DATA, Message, PreparedConnection,
    RecvBuf, Srq,
};
pub use conn::{MalformedAgent, RemoteLease};
pub use dispatch::Polling;
pub use error::{CloseReason, Error, HandshakeError, LocalFailure, ProtocolViolation};
pub use mr::{Local, LocalMr, LocalMrMut, LocalMrRef, LocalMut, MR_DESCRIPTOR_LEN, RemoteMr};
pub use persist::{FlushType, PEER_CONFIG_DESCRIPTOR_LEN, PeerConfig};
pub use rdma::{Rdma, RdmaBuilder};
pub use remem_verbs as verbs;
pub use remem_verbs::{AccessFlags, MemoryBuffer};
pub use rpc::{Request, RpcClient, RpcServer};
pub use stream::RdmaStream;
pub use typed::{RemoteValue, RemoteWord};
/// The crate behind typed values ([`RemoteValue`], [`LocalMr::read_value`]): derive its
/// traits for your types with `#[zerocopy(crate = "remem::zerocopy")]`.
pub use zerocopy;

use remem_verbs::{Context, DeviceInfo, Provider};

type VResult<T> = std::result::Result<T, remem_verbs::Error>;
use std::sync::Arc;

/// The environment variable that names the device [`open_device`] opens by default.
pub const DEVICE_ENV: &str = "REMEM_DEVICE";

/// Every provider built into this binary, in order of preference: rdma-core's devices
/// first (with the `ibverbs` feature), so that a real NIC wins where one exists, then the
/// soft provider.
pub fn providers() -> Vec<Box<dyn Provider>> {
    vec![
        #[cfg(feature = "ibverbs")]
        Box::new(remem_ibverbs::IbverbsProvider::new()),
        Box::new(remem_soft::SoftProvider::new()),
    ]
}

/// The devices every provider can open, in order of preference.
pub fn devices() -> VResult<Vec<DeviceInfo>> {
    let mut all = Vec::new();
    for p in providers() {
        all.extend(p.devices()?);
    }
    Ok(all)
}

/// Opens a device: the one named, else the one `REMEM_DEVICE` names, else the first
/// device of [`devices`]. A name may also be one a provider opens without listing it, such
/// as `soft@127.0.0.2:4791`.
///
/// A soft device's name that does not parse (`soft@127.0.0.1:99999`, `soft@host`,
/// `soft-`) is an [`InvalidArgument`](remem_verbs::Error::InvalidArgument) that says what
/// is wrong with it, not [`NoSuchDevice`](remem_verbs::Error::NoSuchDevice).
pub fn open_device(name: Option<&str>) -> VResult<Arc<dyn Context>> {
    let env = std::env::var(DEVICE_ENV).ok().filter(|s| !s.is_empty());
    let wanted = name.map(str::to_string).or(env);
    if let Some(w) = &wanted {
        check_soft_name(w)?;
        for p in providers() {
            match p.open(w) {
                Err(remem_verbs::Error::NoSuchDevice(_)) => continue,
                other => return other,
            }
        }
        return Err(remem_verbs::Error::NoSuchDevice(w.clone()));
    }
    for p in providers() {
        if let Some(d) = p.devices()?.first() {
            return p.open(&d.name);
        }
    }
    Err(remem_verbs::Error::NoSuchDevice(
        "(no RDMA device found)".to_string(),
    ))
}

/// A name that claims to be a soft device's (`soft@…`, `soft-…`) must parse as one: no
/// other provider names its devices so, so a typo is the user's to fix, and is said so.
fn check_soft_name(name: &str) -> VResult<()> {
    if !(name.starts_with("soft@") || name.starts_with("soft-")) {
        return Ok(());
    }
    let Err(e) = name.parse::<remem_soft::SoftDeviceName>() else {
        return Ok(());
    };
    // The commonest slip: a port out of range (`soft@127.0.0.1:99999`).
    let port = name.rsplit_once(':').map(|(_, p)| p);
    let why = match port.and_then(|p| p.parse::<u64>().ok()) {
        Some(p) if p > u64::from(u16::MAX) => {
            format!("bad device name `{name}`: {p} is not a UDP port (0 to 65535)")
        }
        _ => format!("bad device name {e}"),
    };
    Err(remem_verbs::Error::InvalidArgument(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_by_name_and_unknown_name() {
        let addr = crate::test_util::fresh_addr();
        let ctx = open_device(Some(&format!("soft@{addr}"))).unwrap();
        assert!(ctx.info().name.starts_with(&format!("soft@{}:", addr.ip())));
        assert!(devices().unwrap().iter().any(|d| d.name == "soft-lo"));
        assert!(matches!(
            open_device(Some("no-such-dev")),
            Err(remem_verbs::Error::NoSuchDevice(n)) if n == "no-such-dev"
        ));
    }

    /// A soft device's name that does not parse is a parse error that says what is wrong,
    /// not "no such RDMA device".
    #[test]
    fn a_bad_soft_device_name_is_a_parse_error() {
        let err = open_device(Some("soft@127.0.0.1:99999")).err().unwrap();
        assert!(
            matches!(&err, remem_verbs::Error::InvalidArgument(_)),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "invalid argument: bad device name `soft@127.0.0.1:99999`: 99999 is not a UDP \
             port (0 to 65535)"
        );
        for bad in ["soft@host:1", "soft@1.2.3", "soft-"] {
            let err = open_device(Some(bad)).err().unwrap();
            assert!(
                matches!(&err, remem_verbs::Error::InvalidArgument(m) if m.contains(bad)),
                "{bad}: {err:?}"
            );
            assert!(!err.to_string().contains("no such"), "{err}");
        }
        // Through the builder too.
        let built = RdmaBuilder::new().device("soft@127.0.0.1:99999").build();
        assert!(
            matches!(&built, Err(Error::Verbs(remem_verbs::Error::InvalidArgument(m))) if m.contains("99999 is not a UDP port")),
            "{built:?}"
        );
    }
}
