//! The one module of remem's async API that needs `unsafe`: registering a completion
//! channel's file descriptor with tokio's reactor. (One function elsewhere opts in too: a
//! received message read in place, `conn/inbox.rs`'s `SlotHold::bytes`.)

#![allow(unsafe_code)]

use std::os::fd::{BorrowedFd, OwnedFd};
use tokio::io::unix::AsyncFd;

/// A completion channel's fd (a duplicate the reactor owns), readable when the channel
/// has an event.
#[derive(Debug)]
pub(crate) struct ChannelFd(AsyncFd<OwnedFd>);

impl ChannelFd {
    pub(crate) fn new(fd: BorrowedFd<'_>) -> std::io::Result<Self> {
        let owned = fd.try_clone_to_owned()?;
        // SAFETY: `register` needs the descriptor to stay open and refer to the same open
        // file for the AsyncFd's whole life. `owned` is a duplicate that the AsyncFd owns
        // and closes only when it is dropped; nothing else can close it.
        let afd = unsafe { AsyncFd::register(owned) }.map_err(|e| e.into_parts().1)?;
        Ok(ChannelFd(afd))
    }

    /// Waits until the fd is readable; the readiness is cleared so the next call waits
    /// for a new edge (the caller drains the channel in between).
    pub(crate) async fn readable(&self) -> std::io::Result<()> {
        let mut guard = self.0.readable().await?;
        guard.clear_ready();
        Ok(())
    }
}
