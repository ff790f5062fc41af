//! [`RdmaStream`] under tonic 0.14 (feature `tonic`): [`Incoming`], the accepted streams
//! of a [`Listener`] for `Server::serve_with_incoming`, and tonic's `Connected` for the
//! stream ([`RdmaConnectInfo`] in each request's extensions). A client connects with
//! [`RdmaConnector`](super::hyper::RdmaConnector) through
//! `Endpoint::connect_with_connector` (`examples/grpc.rs`).

use super::{RdmaStream, io_error};
use crate::{Connection, Listener};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

/// What a tonic service learns of a request's connection
/// (`request.extensions().get::<RdmaConnectInfo>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaConnectInfo {
    /// The local queue pair's number.
    pub qp_num: u32,
}

impl tonic::transport::server::Connected for RdmaStream {
    type ConnectInfo = RdmaConnectInfo;

    fn connect_info(&self) -> RdmaConnectInfo {
        RdmaConnectInfo {
            qp_num: self.connection().qp_num(),
        }
    }
}

type Accepting = Pin<Box<dyn Future<Output = crate::error::Result<Connection>> + Send>>;

/// The connections a [`Listener`] accepts, each as an [`RdmaStream`]: a
/// `futures_core::Stream`, for `tonic::transport::Server::serve_with_incoming` (or any
/// accept loop). Ends never; an item is an error only when the listener fails.
pub struct Incoming {
    listener: Arc<Listener>,
    accepting: Option<Accepting>,
}

impl Incoming {
    /// The streams `listener` accepts.
    pub fn new(listener: Listener) -> Self {
        Incoming {
            listener: Arc::new(listener),
            accepting: None,
        }
    }

    /// The listener.
    pub fn listener(&self) -> &Listener {
        &self.listener
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming").finish_non_exhaustive()
    }
}

impl futures_core::Stream for Incoming {
    type Item = io::Result<RdmaStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let listener = &this.listener;
        let fut = this.accepting.get_or_insert_with(|| {
            let l = listener.clone();
            Box::pin(async move { l.accept().await })
        });
        let r = ready!(fut.as_mut().poll(cx));
        this.accepting = None;
        Poll::Ready(Some(
            r.and_then(RdmaStream::new).map_err(|e| io_error(e, true)),
        ))
    }
}
