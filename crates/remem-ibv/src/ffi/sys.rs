//! The few system calls the objects make on their own descriptors (`fcntl`, `poll`, an
//! rdmacm channel's eventfd, the rdmacm router's epoll), as safe functions: they pass no
//! memory but a `pollfd`, a `u64` or `epoll_event`s of the library's own.

use core::ffi::c_int;

/// `fcntl(fd, F_GETFL)`: the descriptor's status flags, or -1 with errno.
pub fn get_fl(fd: c_int) -> c_int {
    // SAFETY: F_GETFL reads the descriptor's flags; no memory is passed.
    unsafe { libc::fcntl(fd, libc::F_GETFL) }
}

/// `fcntl(fd, F_SETFL, flags)`: 0, or -1 with errno.
pub fn set_fl(fd: c_int, flags: c_int) -> c_int {
    // SAFETY: F_SETFL sets the descriptor's flags; no memory is passed.
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }
}

/// Waits until `fd` is readable (`poll` for `POLLIN`, `timeout_ms` as poll's, -1: no
/// limit): poll's result (-1 with errno, e.g. EINTR).
pub fn poll_in(fd: c_int, timeout_ms: c_int) -> c_int {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack, valid for the call.
    unsafe { libc::poll(&mut pfd, 1, timeout_ms) }
}

/// A new eventfd (counter 0, blocking, close-on-exec), or errno.
pub fn eventfd() -> Result<std::os::fd::OwnedFd, c_int> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd with valid flags; no memory is passed.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(super::errno());
    }
    // SAFETY: a descriptor just created, owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Adds `n` to an eventfd's counter (`write(2)` of 8 bytes): write's result.
pub fn eventfd_add(fd: c_int, n: u64) -> isize {
    // SAFETY: writing 8 bytes from a live u64.
    unsafe { libc::write(fd, (&raw const n).cast(), 8) }
}

/// Reads (and so resets) an eventfd's counter (`read(2)` of 8 bytes): the counter, or
/// `None` if the read failed (EAGAIN on a non-blocking fd whose counter is 0, ...).
pub fn eventfd_take(fd: c_int) -> Option<u64> {
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes into a live u64.
    let r = unsafe { libc::read(fd, (&raw mut v).cast(), 8) };
    (r == 8).then_some(v)
}

/// A new epoll instance (close-on-exec), or errno.
pub fn epoll_create() -> Result<std::os::fd::OwnedFd, c_int> {
    use std::os::fd::FromRawFd;
    // SAFETY: epoll_create1 with a valid flag; no memory is passed.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(super::errno());
    }
    // SAFETY: a descriptor just created, owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Registers `fd` with the epoll instance `epfd` for `EPOLLIN`, with `data` as its
/// events' `u64`; errno on failure.
pub fn epoll_add_in(epfd: c_int, fd: c_int, data: u64) -> Result<(), c_int> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: data,
    };
    // SAFETY: one epoll_event on the stack, valid for the call.
    if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(super::errno());
    }
    Ok(())
}

/// Waits for events of the epoll instance `epfd` into `events` (`timeout_ms` as
/// `epoll_wait`'s): how many arrived, or -1 with errno (EINTR, ...).
pub fn epoll_wait(epfd: c_int, events: &mut [libc::epoll_event], timeout_ms: c_int) -> c_int {
    let max = c_int::try_from(events.len()).unwrap_or(c_int::MAX);
    // SAFETY: `events` has room for `max` entries.
    unsafe { libc::epoll_wait(epfd, events.as_mut_ptr(), max, timeout_ms) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_poll_on_a_pipe() {
        let mut fds = [0; 2];
        // SAFETY: a two-element array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let fl = get_fl(fds[0]);
        assert!(fl >= 0 && fl & libc::O_NONBLOCK == 0);
        assert_eq!(set_fl(fds[0], fl | libc::O_NONBLOCK), 0);
        assert_ne!(get_fl(fds[0]) & libc::O_NONBLOCK, 0);
        assert_eq!(poll_in(fds[0], 0), 0, "nothing written yet");
        // SAFETY: one byte from a static.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        assert_eq!(poll_in(fds[0], -1), 1);
        for fd in fds {
            // SAFETY: the pipe's own descriptors.
            unsafe { libc::close(fd) };
        }
    }
}
