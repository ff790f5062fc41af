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

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::{CtxShared, ctx_from};
use crate::ffi::{guard_int, guard_neg, guard_ptr, null_with, set_errno};
use core::ffi::{c_int, c_void};
use remem_verbs::CompletionChannel;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

symver!(
    "ibv_create_comp_channel" @ "IBVERBS_1.0",
    "ibv_destroy_comp_channel" @ "IBVERBS_1.0",
    "ibv_get_cq_event" @ "IBVERBS_1.1",
);

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

/// The library's side of a program's `*mut ibv_comp_channel`; `None` for NULL.
///
/// # Safety
///
/// `ch` is NULL or a live channel made by this library; the reference must not outlive
/// it.
pub unsafe fn channel_from<'a>(ch: *mut ibv_comp_channel) -> Option<&'a ChannelInner> {
    if ch.is_null() {
        return None;
    }
    // SAFETY: by the contract, a non-NULL `ch` is the first field of a boxed `Channel`;
    // the reference covers only the library's part, never the ABI struct.
    Some(unsafe { &(*ch.cast::<Channel>()).inner })
}

/// `ibv_create_comp_channel`.
///
/// # Safety
///
/// `context` is NULL or a context from `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard_ptr("ibv_create_comp_channel", || {
        // SAFETY: by the contract.
        let Some(ctx) = (unsafe { ctx_from(context) }) else {
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
        let raw = Box::into_raw(Box::new(Channel {
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
        }));
        raw.cast()
    })
}

/// Clears `O_NONBLOCK` on `fd` (what a program gets from rdma-core: a blocking fd).
fn set_blocking(fd: c_int) {
    // SAFETY: fcntl on an fd this library owns; no memory is passed.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// Whether the program asked for a non-blocking channel (`O_NONBLOCK` on the fd). While
/// the fd is non-blocking from creation ([`FD_QUEUE_DRAINS_DONTWAIT`] false) the flag says
/// nothing about the program, and the channel blocks.
fn nonblocking(fd: c_int) -> bool {
    if !FD_QUEUE_DRAINS_DONTWAIT {
        return false;
    }
    // SAFETY: fcntl F_GETFL reads the fd's flags; no memory is passed.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses the channel.
///
/// # Safety
///
/// `channel` is NULL or a live channel from `ibv_create_comp_channel`, not used afterwards
/// on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_destroy_comp_channel(
    channel: *mut ibv_comp_channel,
) -> c_int {
    guard_int("ibv_destroy_comp_channel", || {
        // SAFETY: by the contract.
        let Some(ch) = (unsafe { channel_from(channel) }) else {
            return libc::EINVAL;
        };
        if ch.cqs.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: by the contract, the Box made in create, no longer used by the program;
        // no CQ refers to it (counted above).
        drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        0
    })
}

/// `ibv_get_cq_event`: waits for the next completion event of the channel and names its
/// CQ and that CQ's `cq_context`. 0, or -1 with errno (`EAGAIN`: a non-blocking channel
/// with no event; `EINTR`: a signal interrupted the wait).
///
/// # Safety
///
/// `channel` is NULL or a live channel; `cq` and `cq_context` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard_neg("ibv_get_cq_event", || {
        // SAFETY: by the contract. The wait holds what it uses itself (remem's channel,
        // which owns the fd, and the context): a thread of the program may destroy the
        // channel while another still waits in here, as one blocked in libibverbs' `read`
        // holds the file.
        let Some((events, ctx, fd)) = (unsafe { channel_from(channel) })
            .map(|ch| (Arc::clone(&ch.ch), Arc::clone(&ch.ctx), ch.fd))
        else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        loop {
            match events.get_cq_event() {
                Err(e) => {
                    set_errno(e.errno());
                    return -1;
                }
                Ok(Some(id)) => {
                    // A CQ destroyed since its event fired is gone from the registry:
                    // its event is dropped, as the kernel drops a destroyed CQ's events.
                    let Some(p) = ctx.cq_ptr(id) else { continue };
                    // SAFETY: registered CQs are live (unregistered before they are
                    // freed); `p` is a boxed `Cq` (its ABI struct first).
                    let c = unsafe { crate::ffi::handles::cq_from(p) };
                    if let Some(c) = c {
                        c.event_out();
                    }
                    // SAFETY: the out-pointers are writable by the contract; the CQ's
                    // context is read from its ABI struct, where the program may have
                    // changed it.
                    unsafe {
                        *cq = p;
                        *cq_context = (*p).cq_context;
                    }
                    return 0;
                }
                Ok(None) => {
                    if nonblocking(fd) {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one pollfd on the stack, valid for the call.
                    let r = unsafe { libc::poll(&mut pfd, 1, -1) };
                    if r < 0 {
                        // errno is poll's (EINTR): what a read of the event fd gives.
                        return -1;
                    }
                }
            }
        }
    })
}
