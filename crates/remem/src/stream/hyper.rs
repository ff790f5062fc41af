//! [`RdmaStream`] under hyper 1 (feature `hyper`): [`HyperIo`], hyper's IO traits over a
//! stream (and hyper-util's `Connection`, which its legacy client asks of a connector's
//! IO), and [`RdmaConnector`], a `tower::Service<Uri>` that connects over RDMA — for
//! hyper-util's client and tonic's `Endpoint::connect_with_connector`.
//!
//! A server needs nothing more: hand `hyper_util::rt::TokioIo::new(stream)` (or
//! [`HyperIo::new`]) to hyper's `serve_connection`, for HTTP/1.1 and HTTP/2 alike
//! (`examples/http.rs`).

use super::{RdmaStream, io_error};
use crate::Rdma;
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

/// An [`RdmaStream`] as hyper's IO ([`hyper::rt::Read`], [`hyper::rt::Write`]), and a
/// [`Connection`] for hyper-util's legacy client.
#[derive(Debug)]
pub struct HyperIo(TokioIo<RdmaStream>);

impl HyperIo {
    /// Wraps `stream`.
    pub fn new(stream: RdmaStream) -> Self {
        HyperIo(TokioIo::new(stream))
    }

    /// The stream.
    pub fn get_ref(&self) -> &RdmaStream {
        self.0.inner()
    }

    /// The stream, unwrapped.
    pub fn into_inner(self) -> RdmaStream {
        self.0.into_inner()
    }
}

impl hyper::rt::Read for HyperIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for HyperIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl Connection for HyperIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Connects by URI over RDMA: `http://HOST:PORT/…` is a remem listener's TCP address (the
/// handshake's; the bytes then go over RDMA), each connection an [`RdmaStream`]. A
/// `tower::Service<Uri>`, as hyper-util's legacy client and tonic's
/// `Endpoint::connect_with_connector` take. A URI without a port takes 80 (`http`) or 443.
#[derive(Debug, Clone)]
pub struct RdmaConnector {
    rdma: Rdma,
}

impl RdmaConnector {
    /// Connections from `rdma`'s device.
    pub fn new(rdma: Rdma) -> Self {
        RdmaConnector { rdma }
    }
}

impl tower_service::Service<Uri> for RdmaConnector {
    type Response = HyperIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<HyperIo>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let rdma = self.rdma.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a URI without a host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let default = if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            };
            let port = uri.port_u16().unwrap_or(default);
            let conn = rdma
                .connect((host, port))
                .await
                .map_err(|e| io_error(e, false))?;
            Ok(HyperIo::new(
                RdmaStream::new(conn).map_err(|e| io_error(e, false))?,
            ))
        })
    }
}
