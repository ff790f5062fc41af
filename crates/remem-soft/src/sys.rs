//! The one module of remem-soft that calls the C library: `sendmsg(2)` with an iovec per
//! piece of a UDP GSO batch and a `UDP_SEGMENT` control message. `quinn-udp` (which does the
//! rest of the socket work) sends one contiguous buffer; the scatter/gather send needs an
//! iovec per header, payload slice and ICRC, and the payload slices must be raw pointers:
//! they point into registered memory, which the application, or a peer's WRITE on the
//! progress thread, may change while the kernel copies it, so they may never be a `&[u8]`
//! (see `remem_verbs::mem`: safe code reaches registered memory only through atomic
//! accesses; the kernel's copy, like a NIC's DMA, is outside Rust's memory model).
//!
//! Every `unsafe` block carries a `// SAFETY:` comment.

#![allow(unsafe_code)]

use crate::transport::grant::HeldRanges;
use std::io;
use std::mem::MaybeUninit;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// Most iovecs one `sendmsg` takes (the kernel's `UIO_MAXIOV`).
pub const MAX_IOV: usize = 1024;

/// A piece of a batch: `len` bytes at `start` of the batch's own buffer, or the next of its
/// payload references (the ranges of a [`HeldRanges`], in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Bytes of the batch's buffer (headers, copied payloads, pads, ICRCs).
    Own {
        /// Offset in the buffer.
        start: usize,
        /// Length.
        len: usize,
    },
    /// The next payload reference.
    Mem,
}

/// Sends the concatenation of `pieces` — [`Piece::Own`] ranges of `own`, [`Piece::Mem`]
/// the ranges of `mem`, from its first, in order — as one UDP datagram to `dst`, or with `segment` as a GSO
/// batch of datagrams of `segment` bytes each (the last may be shorter), in one
/// `sendmsg` call. `v6_socket`: the socket is IPv6 (an IPv4 destination is then given
/// IPv4-mapped). Fails with `InvalidInput` (nothing sent) if a piece is out of bounds,
/// there are more than [`MAX_IOV`] pieces or more `Mem` pieces than `mem` has; otherwise
/// with `sendmsg`'s error (`WouldBlock` when the socket buffer is full).
///
/// The kernel copies the payload references' bytes during the call; `mem` is borrowed for
/// it, so each range stays alive — its buffer allocated, its key's access entered (no
/// revocation completes) — until the call has returned.
pub fn send_gso(
    socket: &UdpSocket,
    v6_socket: bool,
    dst: SocketAddr,
    segment: Option<u16>,
    own: &[u8],
    pieces: &[Piece],
    mem: &HeldRanges,
) -> io::Result<usize> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    if pieces.len() > MAX_IOV {
        return Err(invalid("too many pieces for one sendmsg"));
    }
    let mut iov = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_IOV];
    let mut refs = 0..mem.len();
    let mut total = 0usize;
    for (slot, piece) in iov.iter_mut().zip(pieces) {
        let (base, len) = match *piece {
            Piece::Own { start, len } => {
                let bytes = start
                    .checked_add(len)
                    .and_then(|end| own.get(start..end))
                    .ok_or_else(|| invalid("piece out of the batch buffer"))?;
                (bytes.as_ptr(), len)
            }
            Piece::Mem => {
                let i = refs
                    .next()
                    .ok_or_else(|| invalid("more references than held ranges"))?;
                let ptr = mem
                    .ptr(i)
                    .map_err(|_| invalid("held range out of bounds"))?;
                (ptr, mem.range_len(i).unwrap_or(0))
            }
        };
        total += len;
        slot.write(libc::iovec {
            iov_base: base.cast_mut().cast(),
            iov_len: len,
        });
    }
    let (mut addr, addr_len) = sockaddr(dst, v6_socket);
    // One UDP_SEGMENT control message (a u16), in a buffer aligned for `cmsghdr`.
    #[repr(C, align(8))]
    struct Control([u8; 32]);
    let mut control = Control([0; 32]);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
    debug_assert!(space <= control.0.len());
    // SAFETY: an all-zero msghdr is a valid value (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut addr).cast();
    msg.msg_namelen = addr_len;
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = pieces.len() as _;
    if let Some(seg) = segment {
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg_control` points to `control`, `space` bytes long (at least
        // CMSG_SPACE(2), checked above) and aligned for `cmsghdr`, so CMSG_FIRSTHDR is a
        // valid, non-null pointer into it and CMSG_DATA leaves room for the u16 written.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), seg);
        }
    }
    loop {
        // SAFETY: `msg` points to live, initialised data for the whole call: the address
        // and control buffer on this stack frame, the first `pieces.len()` iovecs (each
        // written above) and, through them, `own`'s bytes (borrowed for the call) and each
        // held range's bytes (in bounds of its buffer, which the borrowed `HeldRanges`
        // keeps allocated and unrevoked). The kernel only reads through them. Bytes of a
        // held range that another thread writes meanwhile are copied torn, never unsafely:
        // no Rust reference to them exists.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) };
        if n >= 0 {
            debug_assert_eq!(n as usize, total);
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `dst` as a C socket address for a socket of the given family.
fn sockaddr(dst: SocketAddr, v6_socket: bool) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let dst = match dst {
        SocketAddr::V4(v4) if v6_socket => {
            SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
        }
        other => other,
    };
    let len = match dst {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in>(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in6>(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::KeyedRegion;
    use remem_verbs::{MemRegion, MemoryBuffer};
    use std::sync::Arc;
    use std::time::Duration;

    fn pair(ip: &str) -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind(format!("{ip}:0")).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind(format!("{ip}:0")).unwrap();
        (tx, rx)
    }

    fn held(data: &[u8], ranges: &[(usize, usize)]) -> HeldRanges {
        let buf = Arc::new(MemoryBuffer::from_vec(data.to_vec()));
        let key = KeyedRegion::new(MemRegion::whole(buf));
        let grant = key.grant_all().unwrap();
        let mut out = HeldRanges::default();
        for &(offset, len) in ranges {
            out.push_grant(&grant, offset, len).unwrap();
        }
        out
    }

    #[test]
    fn pieces_arrive_as_one_datagram_in_order() {
        let (tx, rx) = pair("127.0.0.1");
        let own: Vec<u8> = (0..64u8).collect();
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 1) as u8).collect();
        let mem = held(&data, &[(10, 3000), (4000, 5)]);
        let pieces = [
            Piece::Own { start: 0, len: 12 },
            Piece::Mem,
            Piece::Own { start: 40, len: 0 },
            Piece::Mem,
            Piece::Own { start: 12, len: 8 },
        ];
        let dst = rx.local_addr().unwrap();
        let n = send_gso(&tx, false, dst, None, &own, &pieces, &mem).unwrap();
        assert_eq!(n, 12 + 3000 + 5 + 8);
        let mut got = vec![0u8; 65536];
        let (len, from) = rx.recv_from(&mut got).unwrap();
        assert_eq!(from, tx.local_addr().unwrap());
        let want = [&own[..12], &data[10..3010], &data[4000..4005], &own[12..20]].concat();
        assert_eq!(&got[..len], &want[..]);
    }

    #[test]
    fn a_gso_batch_is_cut_at_the_segment_size_across_pieces() {
        let (tx, rx) = pair("127.0.0.1");
        let own: Vec<u8> = (0..100u8).collect();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
        // Three datagrams of 1000 bytes and one of 500, cut through the middle of pieces.
        let mem = held(&data, &[(0, 1500), (2000, 1960)]);
        let pieces = [
            Piece::Own { start: 0, len: 40 },
            Piece::Mem,
            Piece::Own { start: 40, len: 0 },
            Piece::Mem,
        ];
        let stream = [&own[..40], &data[..1500], &data[2000..3960]].concat();
        assert_eq!(stream.len(), 3500);
        let dst = rx.local_addr().unwrap();
        match send_gso(&tx, false, dst, Some(1000), &own, &pieces, &mem) {
            Ok(n) => assert_eq!(n, 3500),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                eprintln!("skipped: no UDP GSO here ({e})");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let mut got = vec![0u8; 65536];
        for want in stream.chunks(1000) {
            let (len, _) = rx.recv_from(&mut got).unwrap();
            assert_eq!(&got[..len], want);
        }
    }

    #[test]
    fn an_ipv4_destination_from_an_ipv6_socket_is_mapped() {
        let Ok(tx) = UdpSocket::bind("[::]:0") else {
            eprintln!("skipped: no IPv6 here");
            return;
        };
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let own = [9u8; 20];
        let pieces = [Piece::Own { start: 0, len: 20 }];
        let dst = rx.local_addr().unwrap();
        match send_gso(&tx, true, dst, None, &own, &pieces, &HeldRanges::default()) {
            Ok(n) => assert_eq!(n, 20),
            Err(e) => {
                eprintln!("skipped: dual-stack sockets unavailable ({e})");
                return;
            }
        }
        let mut got = [0u8; 64];
        let (len, _) = rx.recv_from(&mut got).unwrap();
        assert_eq!(&got[..len], &own);
    }

    #[test]
    fn bad_descriptions_send_nothing() {
        let (tx, rx) = pair("127.0.0.1");
        rx.set_nonblocking(true).unwrap();
        let dst = rx.local_addr().unwrap();
        let own = [1u8; 16];
        let err = |pieces: &[Piece], mem: &HeldRanges| {
            send_gso(&tx, false, dst, None, &own, pieces, mem)
                .unwrap_err()
                .kind()
        };
        let invalid = io::ErrorKind::InvalidInput;
        assert_eq!(
            err(&[Piece::Own { start: 10, len: 7 }], &HeldRanges::default()),
            invalid
        );
        assert_eq!(
            err(
                &[Piece::Own {
                    start: usize::MAX,
                    len: 2
                }],
                &HeldRanges::default()
            ),
            invalid
        );
        assert_eq!(err(&[Piece::Mem], &HeldRanges::default()), invalid);
        let many = vec![Piece::Own { start: 0, len: 1 }; MAX_IOV + 1];
        assert_eq!(err(&many, &HeldRanges::default()), invalid);
        assert!(rx.recv_from(&mut [0u8; 64]).is_err(), "nothing was sent");
    }
}
