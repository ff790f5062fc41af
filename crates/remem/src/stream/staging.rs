//! The writer's staging buffers: where [`AsyncWrite::poll_write`]'s bytes are copied
//! before they go as a chunk, and the stream's one function with `unsafe` code.
//!
//! The copy is a plain `memcpy` ([`MemRegion::write_unshared`]) rather than the word-by-word
//! atomic stores of [`LocalMr::write`]: the writer's thread makes it for every byte it
//! sends, and on a soft device (whose NIC runs on the same thread) the atomic copy was a
//! sixth of that thread's work, the plain one about a twentieth (BENCHMARKS.md, "The byte
//! stream"). A plain copy is sound only while nothing else touches the bytes, and the
//! types here keep it so:
//!
//! - a [`Staging`] buffer is a registration of its own with no access rights (a local
//!   send's source only: no peer can reach it, and no work request may write it);
//! - it is written only while it is held as a `Staging`, which is not posted;
//! - [`Staging::post`] consumes it into an [`InFlight`], which has no way to write, and
//!   only [`InFlight::poll_reclaim`] gives it back, once the chunk's successful completion
//!   has arrived (the NIC has finished reading it; a completion that never comes, or an
//!   error's, keeps it out of use).
//!
//! [`AsyncWrite::poll_write`]: tokio::io::AsyncWrite::poll_write
//! [`MemRegion::write_unshared`]: remem_verbs::mem::MemRegion::write_unshared

use super::Completion;
use crate::Rdma;
use crate::error::Result;
use crate::mr::{Local, LocalMr, Span};
use remem_verbs::{AccessFlags, WcStatus, WorkCompletion};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot::error::RecvError;

/// A staging buffer that is not posted: the writer's to fill.
#[derive(Debug)]
pub(super) struct Staging {
    mr: LocalMr,
}

impl Staging {
    /// A new buffer of `len` bytes: registered on its own, with no access rights.
    pub(super) fn alloc(rdma: &Rdma, len: usize) -> Result<Staging> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 64)
            .map_err(|e| crate::Error::InvalidArgument(e.to_string()))?;
        let mr = rdma.alloc_local_mr_with(layout, AccessFlags::empty())?;
        Ok(Staging { mr })
    }

    /// Copies `src` into the buffer at `offset`.
    #[allow(unsafe_code)]
    pub(super) fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let inner = &self.mr.inner;
        let at = inner.at(offset, src.len())?;
        // SAFETY: nothing accesses these bytes concurrently with this copy.
        // - No peer: the buffer is a registration of its own, made with no access rights
        //   (`alloc`), and its keys are given to no one.
        // - No work request: a `Staging` is never posted (`post` consumes it into an
        //   `InFlight`, which cannot write), and an `InFlight` gives it back only once the
        //   chunk's successful completion has arrived (`poll_reclaim`): the peer acknowledged
        //   every packet of it, so the NIC has finished reading it (it reads for a packet
        //   before the packet leaves, and resends nothing acknowledged), and that completion,
        //   passed through the completion queue and a oneshot channel to this thread,
        //   happens-before this copy. The post of the buffer's next
        //   chunk comes after this copy on this thread and synchronises with the NIC.
        // - No other holder: `LocalMr` is not `Clone`, and this module hands out no
        //   reference to it; the spans posted earlier are done with (above).
        unsafe { inner.region().write_unshared(at, src) }?;
        Ok(())
    }

    /// Posts the first `len` bytes as a chunk through `post`; the buffer is the chunk's
    /// until its completion (dropped with it if the post fails).
    pub(super) fn post(
        self,
        len: usize,
        post: impl FnOnce(Span) -> Result<Completion>,
    ) -> Result<InFlight> {
        let span = Span {
            len,
            ..Local::span(&self.mr)
        };
        let done = post(span)?;
        Ok(InFlight {
            staging: Some(self),
            done: Some(done),
        })
    }
}

/// A staging buffer posted as a chunk, with the chunk's completion to come.
#[derive(Debug)]
pub(super) struct InFlight {
    staging: Option<Staging>,
    done: Option<Completion>,
}

/// What a chunk's completion gives back: the completion (or that it will never come) and,
/// once it came, the buffer.
pub(super) struct Reclaimed {
    pub(super) completion: std::result::Result<(WorkCompletion, u64), RecvError>,
    pub(super) staging: Option<Staging>,
}

impl InFlight {
    /// Ready once the chunk's completion has arrived (once only: later polls pend).
    pub(super) fn poll_reclaim(&mut self, cx: &mut Context<'_>) -> Poll<Reclaimed> {
        let Some(done) = self.done.as_mut() else {
            return Poll::Pending;
        };
        let completion = std::task::ready!(Pin::new(done).poll(cx));
        self.done = None;
        // Only a successful completion gives the buffer back. Without a completion the NIC
        // may not be done with it; an unsuccessful one (a flush) may come from another
        // thread than the one reading the buffer for a packet (a QP moved to the error
        // state while its packets are built): it stays out of use either way (the stream
        // has failed by then).
        let staging = match &completion {
            Ok((wc, _)) if wc.status == WcStatus::Success => self.staging.take(),
            _ => None,
        };
        Poll::Ready(Reclaimed {
            completion,
            staging,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A buffer posted through a stand-in for the post (its completion is the test's to
    /// send): what `poll_reclaim` gives back for `completion`, or for none.
    fn reclaim_after(completion: Option<WcStatus>) -> Option<Staging> {
        let (rdma, _) = crate::test_util::soft_pair();
        let mut staging = Staging::alloc(&rdma, 4096).unwrap();
        staging.write(100, b"chunk").unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut posted = staging
            .post(105, |span| {
                assert_eq!(span.len, 105);
                Ok(rx)
            })
            .unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            posted.poll_reclaim(&mut cx).is_pending(),
            "no completion yet"
        );
        match completion {
            Some(status) => {
                let wc = WorkCompletion {
                    status,
                    ..WorkCompletion::default()
                };
                tx.send((wc, 0)).unwrap();
            }
            None => drop(tx),
        }
        let Poll::Ready(r) = posted.poll_reclaim(&mut cx) else {
            panic!("the completion is there");
        };
        assert_eq!(r.completion.is_ok(), completion.is_some());
        // Once only.
        assert!(posted.poll_reclaim(&mut cx).is_pending());
        r.staging
    }

    #[test]
    fn only_a_successful_completion_gives_the_buffer_back() {
        let mut back = reclaim_after(Some(WcStatus::Success)).expect("given back");
        back.write(0, b"again").unwrap();
        // A flush (from whichever thread moved the QP to the error state), another error,
        // or no completion at all: the NIC may still read it, so it stays out of use.
        assert!(reclaim_after(Some(WcStatus::WrFlushErr)).is_none());
        assert!(reclaim_after(Some(WcStatus::RetryExcErr)).is_none());
        assert!(reclaim_after(None).is_none());
    }

    #[test]
    fn a_write_past_the_buffer_is_refused() {
        let (rdma, _) = crate::test_util::soft_pair();
        let mut staging = Staging::alloc(&rdma, 64).unwrap();
        assert!(staging.write(60, b"12345").is_err());
        staging.write(59, b"12345").unwrap();
    }
}
