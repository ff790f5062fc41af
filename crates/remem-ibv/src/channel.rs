//! Completion channels (`ibv_create_comp_channel`, `ibv_destroy_comp_channel`,
//! `ibv_get_cq_event`).
//!
//! A channel is remem's [`CompletionChannel`]: a queue of CQ events whose file descriptor
//! (`ibv_comp_channel.fd`) is readable exactly while an event waits, so programs can
//! `poll`/`epoll` it. `ibv_get_cq_event` blocks (in `poll(2)` on that fd) until an event
//! arrives, unless the program made the fd non-blocking (`O_NONBLOCK`): then an empty
//! channel is -1 with errno `EAGAIN`, as reading rdma-core's event fd would be.
//!
//! The event names a CQ id; the context's registry turns it into the `ibv_cq` pointer. An
//! event of a CQ destroyed since is skipped (rdma-core's kernel drops the events of a CQ it
//! destroys). Each event handed out counts on its CQ until `ibv_ack_cq_events`
//! ([`crate::cq`]); `ibv_destroy_cq` waits for those acks.

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{Ctx, CtxShared};
use crate::ffi::handles::into_abi;
use crate::ffi::{null_with, set_errno, sys};
use core::ffi::{c_int, c_void};
use core::mem::MaybeUninit;
use remem_verbs::CompletionChannel;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether remem-soft's event queues drain their fd with `MSG_DONTWAIT` (they do, since
/// the FdQueue change of issue 17), so that the channel fd is handed to the program
/// blocking, as rdma-core's is, and the program's own `O_NONBLOCK` decides whether
/// `ibv_get_cq_event` waits. (Were it `false`, the fd would stay non-blocking and
/// `ibv_get_cq_event` would always wait.)
pub(crate) const FD_QUEUE_DRAINS_DONTWAIT: bool = true;

/// A completion channel: what `ibv_create_comp_channel` returns a pointer to (`abi`
/// first). The program may write its ABI struct; the library reads and writes that only
/// through raw pointers and keeps its own state in [`ChannelInner`].
#[repr(C)]
pub struct Channel {
    /// The `ibv_comp_channel` programs see.
    pub abi: ibv_comp_channel,
    /// The library's side.
    pub inner: ChannelInner,
}

/// The library's side of a completion channel.
pub struct ChannelInner {
    /// The channel's fd (also in `ibv_comp_channel.fd`).
    pub fd: c_int,
    /// remem's channel.
    pub ch: Arc<dyn CompletionChannel>,
    /// Its context.
    pub ctx: Arc<CtxShared>,
    /// CQs created on the channel and not destroyed: `ibv_destroy_comp_channel` is EBUSY
    /// while any is.
    pub(crate) cqs: AtomicU32,
}

impl std::fmt::Debug for ChannelInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelInner")
            .field("fd", &self.fd)
            .field("cqs", &self.cqs.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// `ibv_create_comp_channel` once the FFI layer has the context: the pointer the program
/// holds, or NULL with errno.
pub(crate) fn create(ctx: Option<&Ctx>) -> *mut ibv_comp_channel {
    let Some(ctx) = ctx else {
        return null_with(libc::EINVAL);
    };
    let shared = ctx.shared();
    let ch = match shared.dev.create_comp_channel() {
        Ok(c) => c,
        Err(e) => return null_with(e.errno()),
    };
    let fd = ch.fd().as_raw_fd();
    if FD_QUEUE_DRAINS_DONTWAIT {
        set_blocking(fd);
    }
    into_abi(Channel {
        abi: ibv_comp_channel {
            context: shared.ibv_context(),
            fd,
            refcnt: 0,
        },
        inner: ChannelInner {
            fd,
            ch,
            ctx: Arc::clone(shared),
            cqs: AtomicU32::new(0),
        },
    })
}

/// Clears `O_NONBLOCK` on `fd` (what a program gets from rdma-core: a blocking fd).
fn set_blocking(fd: c_int) {
    let fl = sys::get_fl(fd);
    if fl >= 0 {
        sys::set_fl(fd, fl & !libc::O_NONBLOCK);
    }
}

/// Whether the program asked for a non-blocking channel (`O_NONBLOCK` on the fd). While
/// the fd is non-blocking from creation ([`FD_QUEUE_DRAINS_DONTWAIT`] false) the flag says
/// nothing about the program, and the channel blocks.
fn nonblocking(fd: c_int) -> bool {
    if !FD_QUEUE_DRAINS_DONTWAIT {
        return false;
    }
    let fl = sys::get_fl(fd);
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Whether the channel may be destroyed (`ibv_destroy_comp_channel`): EBUSY while a CQ
/// uses it.
pub(crate) fn release(ch: &ChannelInner) -> Result<(), c_int> {
    if ch.cqs.load(Ordering::Acquire) != 0 {
        return Err(libc::EBUSY);
    }
    Ok(())
}

/// `ibv_get_cq_event` once the FFI layer has taken what the wait uses (remem's channel,
/// which owns the fd, and the context: a thread of the program may destroy the channel
/// while another still waits in here, as one blocked in libibverbs' `read` holds the
/// file): waits for the next completion event, names its CQ and that CQ's `cq_context`.
/// 0, or -1 with errno (`EAGAIN`: a non-blocking channel with no event; `EINTR`: a signal
/// interrupted the wait).
pub(crate) fn get_cq_event(
    events: Arc<dyn CompletionChannel>,
    ctx: Arc<CtxShared>,
    fd: c_int,
    cq: &mut MaybeUninit<*mut ibv_cq>,
    cq_context: &mut MaybeUninit<*mut c_void>,
) -> c_int {
    loop {
        match events.get_cq_event() {
            Err(e) => {
                set_errno(e.errno());
                return -1;
            }
            Ok(Some(id)) => {
                // A CQ destroyed since its event fired is gone from the registry: its
                // event is dropped, as the kernel drops a destroyed CQ's events.
                let Some(c) = ctx.cq(id) else { continue };
                c.inner().event_out();
                cq.write(c.abi());
                // Read from its ABI struct, where the program may have changed it.
                cq_context.write(c.cq_context());
                return 0;
            }
            Ok(None) => {
                if nonblocking(fd) {
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                if sys::poll_in(fd, -1) < 0 {
                    // errno is poll's (EINTR): what a read of the event fd gives.
                    return -1;
                }
            }
        }
    }
}
