//! rsockets (`<rdma/rsocket.h>`): librdmacm's socket-like API over RDMA. The drop-in does
//! not implement it: `rsocket` fails with ENOSYS, so no rsocket descriptor ever exists,
//! and every call on one answers EBADF — except `rpoll` and `rselect`, which (as
//! librdmacm's do for descriptors that are not rsockets) wait on ordinary descriptors
//! with `poll(2)` / `select(2)`: the librdmacm examples wait for CM events with `rpoll`.
//!
//! The symbols exist (at `RDMACM_1.0`) because programs linked against librdmacm
//! reference them and start with immediate binding (`-z now`).
//!
//! An entry module of the FFI layer (every item is an `extern "C"` entry point);
//! re-exported as `crate::rdmacm::rsocket`.

use crate::ffi::set_errno;
use core::ffi::{c_int, c_void};
use libc::{fd_set, iovec, msghdr, nfds_t, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t};

symver!(
    "rsocket" @ "RDMACM_1.0",
    "rbind" @ "RDMACM_1.0",
    "rlisten" @ "RDMACM_1.0",
    "raccept" @ "RDMACM_1.0",
    "rconnect" @ "RDMACM_1.0",
    "rshutdown" @ "RDMACM_1.0",
    "rclose" @ "RDMACM_1.0",
    "rrecv" @ "RDMACM_1.0",
    "rrecvfrom" @ "RDMACM_1.0",
    "rrecvmsg" @ "RDMACM_1.0",
    "rsend" @ "RDMACM_1.0",
    "rsendto" @ "RDMACM_1.0",
    "rsendmsg" @ "RDMACM_1.0",
    "rread" @ "RDMACM_1.0",
    "rreadv" @ "RDMACM_1.0",
    "rwrite" @ "RDMACM_1.0",
    "rwritev" @ "RDMACM_1.0",
    "rpoll" @ "RDMACM_1.0",
    "rselect" @ "RDMACM_1.0",
    "rgetpeername" @ "RDMACM_1.0",
    "rgetsockname" @ "RDMACM_1.0",
    "rsetsockopt" @ "RDMACM_1.0",
    "rgetsockopt" @ "RDMACM_1.0",
    "rfcntl" @ "RDMACM_1.0",
    "riomap" @ "RDMACM_1.0",
    "riounmap" @ "RDMACM_1.0",
    "riowrite" @ "RDMACM_1.0",
);

/// -1 with errno `e`.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// `ssize_t` -1 with errno EBADF: no descriptor is an rsocket.
fn bad_ssize() -> ssize_t {
    set_errno(libc::EBADF);
    -1
}

/// `rsocket`: rsockets are not implemented (-1, ENOSYS).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    let _ = (domain, kind, protocol);
    fail(libc::ENOSYS)
}

/// `rbind`: EBADF (no descriptor is an rsocket).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rbind(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let _ = (s, addr, len);
    fail(libc::EBADF)
}

/// `rlisten`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rlisten(s: c_int, backlog: c_int) -> c_int {
    let _ = (s, backlog);
    fail(libc::EBADF)
}

/// `raccept`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_raccept(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let _ = (s, addr, len);
    fail(libc::EBADF)
}

/// `rconnect`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rconnect(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let _ = (s, addr, len);
    fail(libc::EBADF)
}

/// `rshutdown`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rshutdown(s: c_int, how: c_int) -> c_int {
    let _ = (s, how);
    fail(libc::EBADF)
}

/// `rclose`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rclose(s: c_int) -> c_int {
    let _ = s;
    fail(libc::EBADF)
}

/// `rrecv`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rrecv(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    let _ = (s, buf, len, flags);
    bad_ssize()
}

/// `rrecvfrom`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> ssize_t {
    let _ = (s, buf, len, flags, src, srclen);
    bad_ssize()
}

/// `rrecvmsg`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rrecvmsg(s: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let _ = (s, msg, flags);
    bad_ssize()
}

/// `rsend`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rsend(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    let _ = (s, buf, len, flags);
    bad_ssize()
}

/// `rsendto`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rsendto(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dst: *const sockaddr,
    dstlen: socklen_t,
) -> ssize_t {
    let _ = (s, buf, len, flags, dst, dstlen);
    bad_ssize()
}

/// `rsendmsg`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rsendmsg(s: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let _ = (s, msg, flags);
    bad_ssize()
}

/// `rread`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rread(s: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    let _ = (s, buf, count);
    bad_ssize()
}

/// `rreadv`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rreadv(s: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let _ = (s, iov, iovcnt);
    bad_ssize()
}

/// `rwrite`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rwrite(s: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let _ = (s, buf, count);
    bad_ssize()
}

/// `rwritev`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rwritev(s: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let _ = (s, iov, iovcnt);
    bad_ssize()
}

/// `rpoll`: `poll(2)` (no descriptor is an rsocket, so every one is an ordinary one).
///
/// # Safety
///
/// As `poll(2)`: `fds` points to `nfds` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's contract is poll(2)'s.
    unsafe { libc::poll(fds, nfds, timeout) }
}

/// `rselect`: `select(2)` (no descriptor is an rsocket).
///
/// # Safety
///
/// As `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rselect(
    nfds: c_int,
    readfds: *mut fd_set,
    writefds: *mut fd_set,
    exceptfds: *mut fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's contract is select(2)'s.
    unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) }
}

/// `rgetpeername`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rgetpeername(
    s: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    let _ = (s, addr, len);
    fail(libc::EBADF)
}

/// `rgetsockname`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rgetsockname(
    s: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    let _ = (s, addr, len);
    fail(libc::EBADF)
}

/// `rsetsockopt`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rsetsockopt(
    s: c_int,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: socklen_t,
) -> c_int {
    let _ = (s, level, optname, optval, optlen);
    fail(libc::EBADF)
}

/// `rgetsockopt`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rgetsockopt(
    s: c_int,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut socklen_t,
) -> c_int {
    let _ = (s, level, optname, optval, optlen);
    fail(libc::EBADF)
}

/// `rfcntl` (variadic in C; the optional argument is not read): EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_rfcntl(s: c_int, cmd: c_int) -> c_int {
    let _ = (s, cmd);
    fail(libc::EBADF)
}

/// `riomap`: EBADF (-1 as `off_t`).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_riomap(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    offset: off_t,
) -> off_t {
    let _ = (s, buf, len, prot, flags, offset);
    set_errno(libc::EBADF);
    -1
}

/// `riounmap`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_riounmap(s: c_int, buf: *mut c_void, len: size_t) -> c_int {
    let _ = (s, buf, len);
    fail(libc::EBADF)
}

/// `riowrite`: EBADF.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_riowrite(
    s: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> size_t {
    let _ = (s, buf, count, offset, flags);
    set_errno(libc::EBADF);
    usize::MAX
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::errno;

    #[test]
    fn no_descriptor_is_an_rsocket() {
        assert_eq!(remem_ibv_rsocket(libc::AF_INET, libc::SOCK_STREAM, 0), -1);
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(remem_ibv_rclose(0), -1);
        assert_eq!(errno(), libc::EBADF);
        assert_eq!(remem_ibv_rsend(0, std::ptr::null(), 0, 0), -1);
        assert_eq!(errno(), libc::EBADF);
    }

    #[test]
    fn rpoll_polls_ordinary_descriptors() {
        let mut fds = [0 as c_int; 2];
        // SAFETY: a two-int array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let mut p = pollfd {
            fd: fds[0],
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd.
        assert_eq!(unsafe { remem_ibv_rpoll(&mut p, 1, 0) }, 0);
        // SAFETY: writing one byte from a live buffer to the pipe.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        // SAFETY: one pollfd.
        assert_eq!(unsafe { remem_ibv_rpoll(&mut p, 1, 1000) }, 1);
        assert_ne!(p.revents & libc::POLLIN, 0);
        // SAFETY: closing the pipe this test made.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
