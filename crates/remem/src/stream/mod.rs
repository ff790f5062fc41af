//! A byte stream over a connection: [`RdmaStream`], tokio's [`AsyncRead`] and
//! [`AsyncWrite`], so that code written for a `TcpStream` runs on RDMA unchanged.
//!
//! # How the bytes go
//!
//! The stream is the connection's message layer, used in order. Each side's receive ring
//! (`recv_depth` registered buffers of `max_message` bytes, posted to the queue pair) takes
//! the peer's chunks; a chunk is one SEND of at most the peer's `max_message` bytes, and
//! spends one credit. The writer copies the bytes of [`AsyncWrite::poll_write`] into a
//! registered staging buffer of its own (up to `send_chunks` chunks of `max_message`
//! bytes, each a registration with no access rights, filled with a plain `memcpy` while it
//! is not posted: `staging.rs`), and posts each chunk as soon as it has a credit and a
//! send-queue entry —
//! without waiting for the previous chunk's completion, so chunks are pipelined, and in
//! the order they were written (one writer posts them, one after another; RC delivers
//! them so). A chunk's staging buffer is reused once its completion says the peer has it.
//!
//! The reader copies from the receive buffer a chunk landed in into the caller's
//! [`ReadBuf`]; once a chunk is read to its end its buffer is posted again and its credit
//! goes back to the writer (in the header of the next message the other way, or in a credit
//! message when a quarter of the window is owed). So:
//!
//! - **What is copied, when**: each byte twice, as over TCP — into the writer's staging
//!   buffer in `poll_write`, and out of the reader's receive buffer in `poll_read`. The
//!   NIC moves it between the two registered buffers without the CPU.
//! - **Coalescing**: a write goes at once if a credit and an entry are free (no Nagle
//!   delay); while none is, later writes fill the chunk waiting to go, up to `max_message`
//!   bytes — small writes coalesce exactly when the peer is behind.
//! - **Backpressure, bounded memory**: a reader that stops reading keeps its receive
//!   buffers and so its credits; the writer's chunks wait in its staging buffer, and once
//!   that is full `poll_write` returns `Pending`. The writer never holds more than
//!   `send_chunks × max_message` bytes ([`RdmaStream::send_buffered`] tells how many it
//!   holds now), the reader never more than its ring.
//! - **Flush**: bytes that `poll_write` accepted while no credit was free wait in the
//!   staging buffer until the next write, flush or shutdown, as with tokio's `BufWriter`;
//!   `poll_flush` returns once everything accepted is posted.
//!
//! # Semantics a TCP user expects
//!
//! - [`AsyncWrite::poll_shutdown`] is a half-close: a last, empty chunk marked as the end
//!   goes after everything written; the peer's reads then return 0 (end of file), and the
//!   peer may go on writing back. Dropping the stream (or its write half) without shutting
//!   it down sends what was accepted and then the end, for at most [`LINGER`], on the
//!   connection's runtime, before the connection closes (as a TCP socket's close does).
//! - Errors are [`io::Error`]s of the kind a TCP user tests for, with the remem [`Error`]
//!   as their source ([`std::error::Error::source`], or [`io::Error::get_ref`]):
//!
//!   | what happened | reading | writing |
//!   |---|---|---|
//!   | the peer closed the connection before ending its stream (it dropped the connection, or its linger ran out) | `UnexpectedEof` | `BrokenPipe` |
//!   | the peer stopped answering: the transport's retries, the keepalive or the operation timeout ran out | `TimedOut` | `TimedOut` |
//!   | the connection failed otherwise (the peer's NIC or QP reported an error, a protocol violation) | `ConnectionReset` | `ConnectionReset` |
//!   | this side closed the connection | `NotConnected` | `NotConnected` |
//!   | writing after `poll_shutdown` | | `BrokenPipe` |
//!
//!   A peer process that is killed stops answering: the keepalive (or the next chunk's
//!   retries) finds it within the failure model's time
//!   ([`failure_model`](crate::failure_model)), and both directions fail with `TimedOut`.
//! - **Cancel safety**: the stream keeps its whole state between polls, so dropping a
//!   read or write future (`read`, `write_all`, a `select!` branch) loses no byte and
//!   duplicates none: a read's bytes are taken from the chunk only as they are copied into
//!   its buffer; a write's are accepted (and counted in its return value) only once copied
//!   into the staging buffer. (`write_all` dropped part-way has written a prefix, as
//!   over TCP.)
//!
//! With [`Polling::Manual`](crate::Polling::Manual) the stream collects its connection's
//! completions (and drives a device its user drives) as it goes — a read at each poll, a
//! writer every 4 chunks it posts (their packets leave in one batch) and whenever it waits,
//! flushes or shuts down — so reads, writes and flushes need nothing more; but a
//! caller-driven device must also be driven while nobody polls the stream — after the last
//! read or write (a written chunk leaves at the next flush, read or drive), while the peer
//! may still need an acknowledgement — as with any operation on such a device.
//!
//! The stream owns its connection's messages: use the connection through
//! [`RdmaStream::connection`] for one-sided operations only, not for `send`/`receive`.

use crate::Connection;
use crate::conn::{Arrived, OwnedCredit, SqEntries};
use crate::error::{CloseReason, Error, LocalFailure};
use remem_verbs::{WcStatus, WorkCompletion};
use staging::{InFlight, Reclaimed, Staging};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

/// The immediate value of the chunk that ends a stream (`poll_shutdown`): empty, after
/// every byte written.
const FIN: u32 = 0x4649_4e21;

/// With [`Polling::Manual`](crate::Polling::Manual), a writer that is not held up drives
/// its device once every this many chunks it posted (and whenever it waits, flushes or
/// shuts down): their packets leave in one batch (a `max_message` chunk of 64 KiB is 16
/// packets at MTU 4096; four are one full GSO send), not a system call a chunk.
const DRIVE_EVERY: usize = 4;

/// Chunks the writer stages by default ([`RdmaStream::with_send_chunks`]).
pub const DEFAULT_SEND_CHUNKS: usize = 16;

/// How long a dropped stream goes on sending what was written (and the end) before its
/// connection closes.
pub const LINGER: Duration = Duration::from_secs(10);

/// Where a posted chunk's completion arrives.
type Completion = oneshot::Receiver<(WorkCompletion, u64)>;

type Boxed<T> = Pin<Box<dyn Future<Output = crate::error::Result<T>> + Send>>;

/// The [`io::Error`] for `e`, of the kind a TCP user tests for (module docs), with `e`
/// as its source.
pub fn io_error(e: Error, reading: bool) -> io::Error {
    use io::ErrorKind::*;
    let timed_out = |s: &WcStatus| matches!(s, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr);
    let kind = match &e {
        Error::Closed(r) => match r {
            CloseReason::Peer if reading => UnexpectedEof,
            CloseReason::Peer => BrokenPipe,
            CloseReason::Local => NotConnected,
            CloseReason::Completion { status, .. } if timed_out(status) => TimedOut,
            CloseReason::Failed(LocalFailure::Timeout) => TimedOut,
            _ => ConnectionReset,
        },
        Error::Timeout(_) => TimedOut,
        Error::Completion { status, .. } if timed_out(status) => TimedOut,
        Error::Completion { .. } | Error::Event(_) => ConnectionReset,
        _ => Other,
    };
    io::Error::new(kind, e)
}

/// With [`Polling::Manual`](crate::Polling::Manual) nothing else collects the
/// connection's completions: the stream does, at each poll, and asks to be polled again.
fn drive(conn: &Connection, cx: &Context<'_>) {
    let sh = conn.shared();
    if sh.rdma.dispatcher().is_manual() {
        sh.poll_all();
        cx.waker().wake_by_ref();
    }
}

/// The reading side's state.
struct Reader {
    conn: Arc<Connection>,
    /// The chunk being read, and how far.
    current: Option<(Arrived, usize)>,
    /// Waiting for the next chunk (kept across polls: it takes the chunk only when it
    /// returns it).
    waiting: Option<Boxed<Arrived>>,
    /// The peer ended its stream.
    eof: bool,
}

impl Reader {
    fn new(conn: Arc<Connection>) -> Self {
        Reader {
            conn,
            current: None,
            waiting: None,
            eof: false,
        }
    }

    /// The next chunk: `Ready(None)` when none is there now and some bytes were read.
    fn next(&mut self, cx: &mut Context<'_>, may_wait: bool) -> Poll<io::Result<Option<Arrived>>> {
        let sh = self.conn.shared();
        if self.waiting.is_none() {
            if let Some(a) = sh.try_take_message() {
                return Poll::Ready(Ok(Some(a)));
            }
            if !may_wait {
                return Poll::Ready(Ok(None));
            }
            self.waiting = Some(Box::pin(sh.clone().take_message()));
        }
        let w = self.waiting.as_mut().expect("set above");
        let r = ready!(w.as_mut().poll(cx));
        self.waiting = None;
        Poll::Ready(r.map(Some).map_err(|e| io_error(e, true)))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        drive(&self.conn, cx);
        let start = buf.filled().len();
        loop {
            if let Some((chunk, at)) = &mut self.current {
                let data = chunk.payload.as_slice();
                let n = (data.len() - *at).min(buf.remaining());
                buf.put_slice(&data[*at..*at + n]);
                *at += n;
                if *at == data.len() {
                    // The buffer goes back to the receive queue, then the credit to the peer.
                    self.current = None;
                    self.conn.shared().consumed();
                }
                if buf.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if self.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let read_some = buf.filled().len() > start;
            let next = match self.next(cx, !read_some) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) if read_some => {
                    // The bytes read so far go now; the error comes at the next read.
                    drop(e);
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(r) => r?,
            };
            let Some(chunk) = next else {
                return Poll::Ready(Ok(()));
            };
            match chunk.imm {
                None if chunk.payload.as_slice().is_empty() => {
                    drop(chunk);
                    self.conn.shared().consumed();
                }
                None => self.current = Some((chunk, 0)),
                Some(FIN) => {
                    drop(chunk);
                    self.conn.shared().consumed();
                    self.eof = true;
                }
                Some(imm) => {
                    drop(chunk);
                    self.conn.shared().consumed();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "not a stream's message (immediate {imm:#x}): the peer does not speak RdmaStream"
                        ),
                    )));
                }
            }
        }
    }
}

/// Whether the end of the stream was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fin {
    Open,
    /// `poll_shutdown` was called: the end goes after what is queued.
    Queued,
    Posted,
}

/// The writing side's state.
struct Writer {
    conn: Arc<Connection>,
    /// Bytes per chunk: the peer's `max_message`.
    chunk: usize,
    /// Staging buffers allowed, and allocated so far.
    max_chunks: usize,
    allocated: usize,
    free: Vec<Staging>,
    /// Accepted, not yet posted, in order; only the last may be partly filled.
    queued: VecDeque<(Staging, usize)>,
    /// Posted, not yet completed, in order.
    in_flight: VecDeque<(InFlight, usize)>,
    /// Waiting for a credit and a send-queue entry (kept across polls).
    acquire: Option<Boxed<(OwnedCredit, SqEntries)>>,
    fin: Fin,
    /// Chunks posted since the writer last drove the device (`Polling::Manual`).
    undriven: usize,
    /// A dropped stream's writer that already lingers (or should not).
    detached: bool,
}

impl Writer {
    fn new(conn: Arc<Connection>, max_chunks: usize) -> Self {
        let chunk = match conn.shared().peer().max_message {
            0 => conn.shared().rdma.config().max_message,
            n => n as usize,
        };
        Writer {
            conn,
            chunk,
            max_chunks: max_chunks.max(1),
            allocated: 0,
            free: Vec::new(),
            queued: VecDeque::new(),
            in_flight: VecDeque::new(),
            acquire: None,
            fin: Fin::Open,
            undriven: 0,
            detached: false,
        }
    }

    fn buffered(&self) -> usize {
        self.queued.iter().map(|q| q.1).sum::<usize>()
            + self.in_flight.iter().map(|f| f.1).sum::<usize>()
    }

    /// Takes back the staging buffers of chunks that completed (in order).
    fn reclaim(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let sh = self.conn.shared();
        while let Some((chunk, _)) = self.in_flight.front_mut() {
            let Poll::Ready(Reclaimed {
                completion,
                staging,
            }) = chunk.poll_reclaim(cx)
            else {
                break;
            };
            self.in_flight.pop_front();
            self.free.extend(staging);
            sh.completed(completion).map_err(|e| io_error(e, false))?;
        }
        Ok(())
    }

    /// Copies as much of `src` as the staging buffer takes; returns how much.
    fn accept(&mut self, src: &[u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < src.len() {
            if let Some((staging, len)) = self.queued.back_mut()
                && *len < self.chunk
            {
                let k = (self.chunk - *len).min(src.len() - n);
                staging
                    .write(*len, &src[n..n + k])
                    .map_err(|e| io_error(e, false))?;
                *len += k;
                n += k;
                continue;
            }
            let staging = match self.free.pop() {
                Some(staging) => staging,
                None if self.allocated < self.max_chunks => {
                    let staging = Staging::alloc(&self.conn.shared().rdma, self.chunk)
                        .map_err(|e| io_error(e, false))?;
                    self.allocated += 1;
                    staging
                }
                None => break,
            };
            self.queued.push_back((staging, 0));
        }
        Ok(n)
    }

    /// [`drive`]s the connection's device (a device its user drives): sends the chunks
    /// posted since the last time, takes what arrived.
    fn drive(&mut self, cx: &Context<'_>) {
        drive(&self.conn, cx);
        self.undriven = 0;
    }

    /// Waits for a credit and an entry: `Pending` until both are there.
    fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(OwnedCredit, SqEntries)>> {
        let sh = self.conn.shared();
        if self.acquire.is_none()
            && let Some(got) = sh.try_credited_entry_owned()
        {
            return Poll::Ready(Ok(got));
        }
        let fut = self
            .acquire
            .get_or_insert_with(|| Box::pin(sh.clone().credited_entry_owned()));
        let r = ready!(fut.as_mut().poll(cx));
        self.acquire = None;
        Poll::Ready(r.map_err(|e| io_error(e, false)))
    }

    /// Posts what is queued (and the end, once shut down), in order: `Ready` once all of it
    /// is posted.
    fn push(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.queued.is_empty() {
            let (credit, sq) = ready!(self.poll_acquire(cx))?;
            let (staging, len) = self.queued.pop_front().expect("not empty");
            let sh = self.conn.shared();
            let chunk = staging
                .post(len, |span| sh.post_message(credit, sq, Some(span), None))
                .map_err(|e| io_error(e, false))?;
            self.in_flight.push_back((chunk, len));
            self.undriven += 1;
        }
        if self.fin == Fin::Queued {
            let (credit, sq) = ready!(self.poll_acquire(cx))?;
            let sh = self.conn.shared();
            // Its completion is not waited for: the end holds no staging buffer.
            sh.post_message(credit, sq, None, Some(FIN))
                .map_err(|e| io_error(e, false))?;
            self.fin = Fin::Posted;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.undriven >= DRIVE_EVERY {
            self.drive(cx);
        }
        if self.fin != Fin::Open {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "writing to a stream that was shut down",
            )));
        }
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        self.conn
            .shared()
            .check_open()
            .map_err(|e| io_error(e, false))?;
        self.reclaim(cx)?;
        let mut n = self.accept_all(bufs)?;
        if n == 0 {
            // Full: send what is posted, post what waits, and take back what completed.
            self.drive(cx);
            if let Poll::Ready(r) = self.push(cx) {
                r?;
            }
            self.reclaim(cx)?;
            n = self.accept_all(bufs)?;
            if n == 0 {
                // Woken by a credit or entry (push) or a completion (reclaim).
                return Poll::Pending;
            }
        }
        // Goes at once if it can; else it waits for the next write or flush.
        if let Poll::Ready(r) = self.push(cx) {
            r?;
        }
        Poll::Ready(Ok(n))
    }

    fn accept_all(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            let k = self.accept(b)?;
            n += k;
            if k < b.len() {
                break;
            }
        }
        Ok(n)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.drive(cx);
        // Completions are taken back here too, so a writer that only flushes frees its
        // staging buffers.
        self.reclaim(cx)?;
        self.push(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.drive(cx);
        if self.fin == Fin::Open {
            self.fin = Fin::Queued;
        }
        self.reclaim(cx)?;
        self.push(cx)
    }

    /// The state, moved out for the linger (this one is left detached).
    fn detach(&mut self) -> Writer {
        self.detached = true;
        Writer {
            conn: self.conn.clone(),
            chunk: self.chunk,
            max_chunks: self.max_chunks,
            allocated: self.allocated,
            free: std::mem::take(&mut self.free),
            queued: std::mem::take(&mut self.queued),
            in_flight: std::mem::take(&mut self.in_flight),
            acquire: self.acquire.take(),
            fin: self.fin,
            undriven: self.undriven,
            detached: false,
        }
    }
}

impl Drop for Writer {
    /// Sends what was accepted and the end, on the connection's runtime, for at most
    /// [`LINGER`]; the connection closes after (once the reading side is gone too).
    fn drop(&mut self) {
        if self.detached || self.fin == Fin::Posted || !self.conn.shared().is_open() {
            return;
        }
        let Some(rt) = self.conn.shared().runtime() else {
            return;
        };
        let mut w = self.detach();
        w.detached = true;
        rt.spawn(async move {
            let done = std::future::poll_fn(|cx| w.poll_shutdown(cx));
            let _ = tokio::time::timeout(LINGER, done).await;
        });
    }
}

/// A reliable, ordered byte stream over a [`Connection`]: tokio's [`AsyncRead`] and
/// [`AsyncWrite`], so `tokio::io::copy`, `BufReader`, `BufWriter`, `tokio_util`'s
/// `Framed`, hyper and tonic run on it unchanged. How bytes move, what is copied, the
/// errors and cancel safety: the [module docs](self).
///
/// ```
/// use remem::{RdmaBuilder, RdmaStream};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// tokio::runtime::Runtime::new()?.block_on(async {
///     let server = RdmaBuilder::new().device("soft@127.0.0.7:0").build()?;
///     let client = RdmaBuilder::new().device("soft@127.0.0.8:0").build()?;
///     let listener = server.listen("127.0.0.1:0").await?;
///     let addr = listener.local_addr()?;
///     let (c, s) = tokio::join!(client.connect(addr), listener.accept());
///     let (mut c, mut s) = (RdmaStream::new(c?)?, RdmaStream::new(s?)?);
///
///     c.write_all(b"ping").await?;
///     c.shutdown().await?; // a half-close: the server reads to the end
///     let mut got = Vec::new();
///     s.read_to_end(&mut got).await?;
///     assert_eq!(got, b"ping");
///     s.write_all(b"pong").await?; // and may still answer
///     s.flush().await?;
///     let mut answer = [0; 4];
///     c.read_exact(&mut answer).await?;
///     assert_eq!(&answer, b"pong");
///     Ok(())
/// })
/// # }
/// ```
pub struct RdmaStream {
    reader: Reader,
    writer: Writer,
}

impl std::fmt::Debug for RdmaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("qpn", &self.reader.conn.qp_num())
            .field("send_buffered", &self.writer.buffered())
            .finish_non_exhaustive()
    }
}

impl RdmaStream {
    /// A stream over `conn`, which it owns from now on (both sides of a connection make
    /// one). Fails if the connection's messages go to a shared receive queue.
    pub fn new(conn: Connection) -> crate::error::Result<Self> {
        Self::with_send_chunks(conn, DEFAULT_SEND_CHUNKS)
    }

    /// [`RdmaStream::new`], staging at most `chunks` chunks of the peer's `max_message`
    /// bytes (at least one): the most the writer holds, and the most chunks in flight.
    pub fn with_send_chunks(conn: Connection, chunks: usize) -> crate::error::Result<Self> {
        if conn.shared().uses_srq() {
            return Err(Error::InvalidArgument(
                "a stream needs a connection with receive buffers of its own (not a shared receive queue)".into(),
            ));
        }
        let conn = Arc::new(conn);
        Ok(RdmaStream {
            reader: Reader::new(conn.clone()),
            writer: Writer::new(conn, chunks),
        })
    }

    /// The connection underneath (for one-sided operations, [`Connection::closed`],
    /// events; not for messages, which are the stream's).
    pub fn connection(&self) -> &Connection {
        &self.reader.conn
    }

    /// Bytes written that the peer has not yet acknowledged: staged to go, or in flight.
    /// Never more than [`RdmaStream::send_capacity`].
    pub fn send_buffered(&self) -> usize {
        self.writer.buffered()
    }

    /// The most bytes the writer stages: chunks × the peer's `max_message`.
    pub fn send_capacity(&self) -> usize {
        self.writer.max_chunks * self.writer.chunk
    }

    /// Staging memory the writer has registered so far (it grows up to
    /// [`RdmaStream::send_capacity`], and never beyond).
    pub fn send_allocated(&self) -> usize {
        self.writer.allocated * self.writer.chunk
    }

    /// Splits the stream into a reading and a writing half that can be used from two
    /// tasks at once; the connection closes once both are dropped.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf {
                reader: self.reader,
            },
            OwnedWriteHalf {
                writer: self.writer,
            },
        )
    }

    /// Borrows a reading and a writing half, to use at once (e.g. in `tokio::join!`).
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        (
            ReadHalf {
                reader: &mut self.reader,
            },
            WriteHalf {
                writer: &mut self.writer,
            },
        )
    }
}

impl AsyncRead for RdmaStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().reader.poll_read(cx, buf)
    }
}

/// The writing side's methods, for the stream and its halves.
macro_rules! async_write {
    ($t:ty, $($w:tt)+) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.get_mut().$($w)+.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                self.get_mut().$($w)+.poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.get_mut().$($w)+.poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.get_mut().$($w)+.poll_shutdown(cx)
            }
        }
    };
}

async_write!(RdmaStream, writer);
async_write!(OwnedWriteHalf, writer);
async_write!(WriteHalf<'_>, writer);

/// The reading half of an [`RdmaStream`] ([`RdmaStream::into_split`]).
pub struct OwnedReadHalf {
    reader: Reader,
}

/// The writing half of an [`RdmaStream`] ([`RdmaStream::into_split`]); dropping it ends
/// the stream for the peer (as [`AsyncWrite::poll_shutdown`] does, after what was written).
pub struct OwnedWriteHalf {
    writer: Writer,
}

/// A borrowed reading half ([`RdmaStream::split`]).
pub struct ReadHalf<'a> {
    reader: &'a mut Reader,
}

/// A borrowed writing half ([`RdmaStream::split`]).
pub struct WriteHalf<'a> {
    writer: &'a mut Writer,
}

impl OwnedWriteHalf {
    /// Bytes written that the peer has not yet acknowledged ([`RdmaStream::send_buffered`]).
    pub fn send_buffered(&self) -> usize {
        self.writer.buffered()
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().reader.poll_read(cx, buf)
    }
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().reader.poll_read(cx, buf)
    }
}

macro_rules! debug_half {
    ($($t:ty),+) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )+};
}
debug_half!(OwnedReadHalf, OwnedWriteHalf, ReadHalf<'_>, WriteHalf<'_>);

#[cfg(feature = "hyper")]
#[forbid(unsafe_code)]
pub mod hyper;
mod staging;
#[cfg(test)]
#[forbid(unsafe_code)]
mod tests;
#[cfg(feature = "tonic")]
#[forbid(unsafe_code)]
pub mod tonic;
