//! Links: how the two sides of a case exchange messages (endpoint information, results,
//! "done" signals). Every receive is bounded, so a side never waits forever for its peer.

use std::io::{ErrorKind, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// The largest message a link carries (a guard against a corrupt length prefix).
const MAX_MESSAGE: usize = 64 << 20;

/// A reliable, ordered message channel to the peer side of a case.
pub trait Link: Send {
    /// Sends one message.
    fn send(&mut self, msg: &[u8]) -> Result<(), String>;
    /// Receives the next message, waiting at most `timeout`.
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, String>;
}

fn timed_out(timeout: Duration) -> String {
    format!("no message from the peer within {timeout:?}")
}

pub(crate) const CLOSED: &str = "the peer closed the link";

/// One end of an in-process link: the two sides run on two threads of one process.
pub struct ChannelLink {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
}

impl ChannelLink {
    /// Two connected ends.
    pub fn pair() -> (ChannelLink, ChannelLink) {
        let (tx_a, rx_b) = mpsc::channel();
        let (tx_b, rx_a) = mpsc::channel();
        (
            ChannelLink { tx: tx_a, rx: rx_a },
            ChannelLink { tx: tx_b, rx: rx_b },
        )
    }
}

impl Link for ChannelLink {
    fn send(&mut self, msg: &[u8]) -> Result<(), String> {
        self.tx.send(msg.to_vec()).map_err(|_| CLOSED.to_string())
    }

    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, String> {
        self.rx.recv_timeout(timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => timed_out(timeout),
            RecvTimeoutError::Disconnected => CLOSED.to_string(),
        })
    }
}

/// A byte stream whose reads can time out: what a [`StreamLink`] runs over.
pub trait Stream: Read + Write + Send {
    /// Bounds the next reads (`None`: no bound).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
}

macro_rules! streams {
    ($($t:ty),*) => {$(
        impl Stream for $t {
            fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
                <$t>::set_read_timeout(self, timeout)
            }
        }
    )*};
}
streams!(std::net::TcpStream, std::os::unix::net::UnixStream);

/// A link over a byte stream (a TCP connection, or a Unix socket shared with a child
/// process): each message is a 4-byte little-endian length and the bytes. Dropping the link
/// closes the stream, so the peer sees the end of the link.
pub struct StreamLink<S> {
    stream: S,
    /// Bytes received but not yet returned as a whole message.
    pending: Vec<u8>,
}

impl<S: Stream> StreamLink<S> {
    /// A link over `stream`.
    pub fn new(stream: S) -> Self {
        StreamLink {
            stream,
            pending: Vec::new(),
        }
    }

    /// The next whole message among the bytes received so far.
    fn take_message(&mut self) -> Result<Option<Vec<u8>>, String> {
        let Some(prefix) = self.pending.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*prefix) as usize;
        if len > MAX_MESSAGE {
            return Err(format!(
                "message of {len} bytes on the link: corrupt stream"
            ));
        }
        if self.pending.len() < 4 + len {
            return Ok(None);
        }
        let msg = self.pending[4..4 + len].to_vec();
        self.pending.drain(..4 + len);
        Ok(Some(msg))
    }
}

impl<S: Stream> Link for StreamLink<S> {
    fn send(&mut self, msg: &[u8]) -> Result<(), String> {
        let len = u32::try_from(msg.len()).map_err(|_| "message too long".to_string())?;
        let mut frame = Vec::with_capacity(4 + msg.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(msg);
        self.stream
            .write_all(&frame)
            .and_then(|()| self.stream.flush())
            .map_err(|e| format!("link: {e}"))
    }

    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(msg) = self.take_message()? {
                return Ok(msg);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(timeout));
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| format!("link: {e}"))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(CLOSED.to_string()),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(format!("link: {e}")),
            }
        }
    }
}
