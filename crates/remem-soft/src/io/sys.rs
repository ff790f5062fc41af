//! The one module of remem-soft that calls the C library: `sendmmsg(2)` of UDP GSO
//! batches, each with an iovec per piece and a `UDP_SEGMENT` control message. `quinn-udp` (which does the
//! rest of the socket work) sends one contiguous buffer; the scatter/gather send needs an
//! iovec per header, payload slice and ICRC, and the payload slices must be raw pointers:
//! they point into registered memory, which the application, or a peer's WRITE on the
//! progress thread, may change while the kernel copies it, so they may never be a `&[u8]`
//! (see `remem_verbs::mem`: safe code reaches registered memory only through atomic
//! accesses; the kernel's copy, like a NIC's DMA, is outside Rust's memory model).
//!
//! Every `unsafe` block carries a `// SAFETY:` comment.

#![allow(unsafe_code)]

use crate::mem::grant::HeldRanges;
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
    /// Payload reference `i` (of the [`HeldRanges`]), named: a decorator that leaves some
    /// packets out of a batch refers to the others' ranges so. It does not move the
    /// numbering of the [`Piece::Mem`] pieces.
    Ref(usize),
}

/// Most GSO batches one [`send_batches`] call takes (one `sendmmsg`).
pub const MAX_BATCHES: usize = 16;

/// One GSO batch of a [`send_batches`] call: the datagrams in `pieces` (a range of the
/// call's pieces) for `dst`, cut at `segment` bytes (`None`: one datagram).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Where its datagrams go.
    pub dst: SocketAddr,
    /// The GSO segment size (every datagram but the last has it), or `None`.
    pub segment: Option<u16>,
    /// Its pieces: a range of the call's `pieces`.
    pub pieces: std::ops::Range<usize>,
}

/// Sends `batches[first..]` in one `sendmmsg` call, in order; returns how many of them
/// were sent (fewer than asked when the socket refused one: the call is then made again
/// from there, and returns the error when it refuses the first).
///
/// A batch is the concatenation of its range of `pieces` — [`Piece::Own`] ranges of
/// `own`, [`Piece::Mem`] the ranges of `mem` — sent to its `dst` as one UDP datagram, or
/// with a `segment` as a GSO batch of datagrams of `segment` bytes each (the last may be
/// shorter). The `Mem` pieces of all the batches are `mem`'s ranges in order, from its
/// first, so `pieces` is the whole list even when `first` skips batches sent before.
/// `v6_socket`: the socket is IPv6 (an IPv4 destination is then given IPv4-mapped).
/// Fails with `InvalidInput` (nothing sent) if a piece is out of bounds, there are more
/// than [`MAX_IOV`] pieces, more `Mem` pieces than `mem` has, more than [`MAX_BATCHES`]
/// batches or a batch's range outside `pieces`; otherwise with `sendmmsg`'s error
/// (`WouldBlock` when the socket buffer is full).
///
/// `sendmmsg` keeps the order: the batches' datagrams arrive in the order given (an ACK
/// queued before a reply still arrives first).
///
/// The kernel copies the payload references' bytes during the call; `mem` is borrowed for
/// it, so each range stays alive — its buffer allocated, its key's access entered (no
/// revocation completes) — until the call has returned.
pub fn send_batches(
    socket: &UdpSocket,
    v6_socket: bool,
    own: &[u8],
    pieces: &[Piece],
    mem: &HeldRanges,
    first: usize,
    batches: &[Batch],
) -> io::Result<usize> {
    send_many(socket, v6_socket, own, pieces, mem, first, batches).map(|(n, _)| n)
}

/// `sendmmsg` of `batches[first..]`: (messages sent, their bytes).
fn send_many(
    socket: &UdpSocket,
    v6_socket: bool,
    own: &[u8],
    pieces: &[Piece],
    mem: &HeldRanges,
    first: usize,
    batches: &[Batch],
) -> io::Result<(usize, usize)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    if pieces.len() > MAX_IOV {
        return Err(invalid("too many pieces for one sendmsg"));
    }
    if batches.len() > MAX_BATCHES || first > batches.len() {
        return Err(invalid("too many batches for one sendmmsg"));
    }
    if batches
        .iter()
        .any(|b| b.pieces.start > b.pieces.end || b.pieces.end > pieces.len())
    {
        return Err(invalid("a batch's pieces are out of the list"));
    }
    let mut iov = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_IOV];
    let mut refs = 0..mem.len();
    for (slot, piece) in iov.iter_mut().zip(pieces) {
        let (base, len) = match *piece {
            Piece::Own { start, len } => {
                let bytes = start
                    .checked_add(len)
                    .and_then(|end| own.get(start..end))
                    .ok_or_else(|| invalid("piece out of the batch buffer"))?;
                (bytes.as_ptr(), len)
            }
            Piece::Mem | Piece::Ref(_) => {
                let i = match *piece {
                    Piece::Ref(i) => i,
                    _ => refs
                        .next()
                        .ok_or_else(|| invalid("more references than held ranges"))?,
                };
                let ptr = mem
                    .ptr(i)
                    .map_err(|_| invalid("held range out of bounds"))?;
                (ptr, mem.range_len(i).unwrap_or(0))
            }
        };
        slot.write(libc::iovec {
            iov_base: base.cast_mut().cast(),
            iov_len: len,
        });
    }
    let todo = &batches[first..];
    if todo.is_empty() {
        return Ok((0, 0));
    }
    // One UDP_SEGMENT control message (a u16) per batch, in buffers aligned for `cmsghdr`.
    #[repr(C, align(8))]
    #[derive(Clone, Copy)]
    struct Control([u8; 32]);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of::<Control>());
    let mut controls = [Control([0; 32]); MAX_BATCHES];
    let mut addrs =
        [const { MaybeUninit::<(libc::sockaddr_storage, libc::socklen_t)>::uninit() }; MAX_BATCHES];
    // SAFETY: an all-zero mmsghdr is a valid value (null pointers, zero lengths).
    let mut msgs: [libc::mmsghdr; MAX_BATCHES] = unsafe { std::mem::zeroed() };
    for (k, b) in todo.iter().enumerate() {
        let addr = addrs[k].write(sockaddr(b.dst, v6_socket));
        let msg = &mut msgs[k].msg_hdr;
        msg.msg_name = (&raw mut addr.0).cast();
        msg.msg_namelen = addr.1;
        // (In bounds of `iov`: the range was checked against `pieces`, at most MAX_IOV.)
        msg.msg_iov = iov[b.pieces.start..].as_mut_ptr().cast();
        msg.msg_iovlen = b.pieces.len() as _;
        if let Some(seg) = b.segment {
            msg.msg_control = controls[k].0.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: `msg_control` points to `controls[k]`, `space` bytes long (at least
            // CMSG_SPACE(2), checked above) and aligned for `cmsghdr`, so CMSG_FIRSTHDR is
            // a valid, non-null pointer into it and CMSG_DATA leaves room for the u16.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(msg);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), seg);
            }
        }
    }
    loop {
        // SAFETY: the first `todo.len()` entries of `msgs` point to live, initialised data
        // for the whole call: their addresses and control buffers on this stack frame, the
        // iovecs of their ranges (every one of the first `pieces.len()` was written above)
        // and, through them, `own`'s bytes (borrowed for the call) and each held range's
        // bytes (in bounds of its buffer, which the borrowed `HeldRanges` keeps allocated
        // and unrevoked). The kernel only reads through them and writes each entry's
        // `msg_len`. Bytes of a held range that another thread writes meanwhile are copied
        // torn, never unsafely: no Rust reference to them exists.
        let n =
            unsafe { libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), todo.len() as _, 0) };
        if n >= 0 {
            let n = n as usize;
            let bytes = msgs[..n].iter().map(|m| m.msg_len as usize).sum();
            return Ok((n, bytes));
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

/// Turns off the ancillary data `quinn-udp` asks for on every received datagram — its
/// destination address (`IP_PKTINFO`, `IPV6_RECVPKTINFO`), its TOS/traffic class
/// (`IP_RECVTOS`, `IPV6_RECVTCLASS`) and a receive timestamp (`SO_TIMESTAMPNS`) — on a
/// socket bound to one address: there the destination is that address, and neither the
/// traffic class nor the time is used. Each costs the kernel work on every receive (and a
/// socket that asks for timestamps has the kernel stamp every packet it receives). UDP
/// GRO's segment size, which the receive path needs, stays on.
pub fn quiet_receive(socket: &UdpSocket, v6: bool) -> io::Result<()> {
    let off = |level: libc::c_int, name: libc::c_int| -> io::Result<()> {
        let zero: libc::c_int = 0;
        // SAFETY: `zero` is a live `c_int` for the whole call and the length passed is its
        // size; the descriptor is the socket's, open while `socket` is borrowed.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                name,
                (&zero as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    off(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS)?;
    if v6 {
        off(libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO)?;
        off(libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS)?;
        // (Set by quinn-udp on dual-stack sockets only; a v6-only one may refuse it.)
        let _ = off(libc::IPPROTO_IP, libc::IP_RECVTOS);
    } else {
        off(libc::IPPROTO_IP, libc::IP_PKTINFO)?;
        off(libc::IPPROTO_IP, libc::IP_RECVTOS)?;
    }
    Ok(())
}

/// `SO_ATTACH_REUSEPORT_CBPF` (`asm-generic/socket.h`; the same on x86 and arm).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// One classic BPF instruction (`struct sock_filter`): what [`attach_reuseport_cbpf`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Operation code (`BPF_LD | BPF_W | BPF_ABS`, …).
    pub code: u16,
    /// Jump offset when the condition holds.
    pub jt: u8,
    /// Jump offset when it does not.
    pub jf: u8,
    /// The constant (an offset, an immediate, a return value).
    pub k: u32,
}

/// Attaches the classic BPF `program` to the `SO_REUSEPORT` group of `socket`
/// (`SO_ATTACH_REUSEPORT_CBPF`, which needs no privilege): the kernel runs it on every
/// datagram for the group, with the UDP header pulled off, and takes its return value as
/// the index of the group's socket that receives it (an index at or past the group's size
/// falls back to the kernel's hash). It replaces the group's program.
pub fn attach_reuseport_cbpf(socket: &UdpSocket, program: &[Insn]) -> io::Result<()> {
    let mut filters: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let len = u16::try_from(filters.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?;
    let prog = libc::sock_fprog {
        len,
        filter: filters.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `filters`, `len` instructions, both live for the whole call
    // (the kernel copies the program); the length passed is `prog`'s size; the descriptor
    // is the socket's, open while `socket` is borrowed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An integer socket option's value (`getsockopt`).
    pub(crate) fn int_option(
        socket: &UdpSocket,
        level: libc::c_int,
        name: libc::c_int,
    ) -> libc::c_int {
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are live for the call and `len` is `value`'s size; the
        // descriptor is the socket's, open while `socket` is borrowed.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt: {}", io::Error::last_os_error());
        value
    }
    use crate::mem::grant::KeyedRegion;
    use remem_verbs::{MemRegion, MemoryBuffer};
    use std::sync::Arc;
    use std::time::Duration;

    /// One batch of `pieces`, sent alone; the bytes sent.
    fn send_gso(
        socket: &UdpSocket,
        v6_socket: bool,
        dst: SocketAddr,
        segment: Option<u16>,
        own: &[u8],
        pieces: &[Piece],
        mem: &HeldRanges,
    ) -> io::Result<usize> {
        let one = [Batch {
            dst,
            segment,
            pieces: 0..pieces.len(),
        }];
        send_many(socket, v6_socket, own, pieces, mem, 0, &one).map(|(_, bytes)| bytes)
    }

    fn pair(ip: &str) -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind(format!("{ip}:0")).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind(format!("{ip}:0")).unwrap();
        (tx, rx)
    }

    pub(crate) fn held(data: &[u8], ranges: &[(usize, usize)]) -> HeldRanges {
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
    fn a_named_reference_sends_its_range_and_leaves_the_numbering_of_the_others() {
        let (tx, rx) = pair("127.0.0.1");
        let own: Vec<u8> = (0..16u8).collect();
        let data: Vec<u8> = (0..300u32).map(|i| (i * 5 + 3) as u8).collect();
        let mem = held(&data, &[(0, 100), (100, 100), (200, 100)]);
        // Range 2 by name, then the first `Mem` piece: range 0 still.
        let pieces = [
            Piece::Own { start: 0, len: 8 },
            Piece::Ref(2),
            Piece::Mem,
            Piece::Own { start: 8, len: 8 },
        ];
        send_gso(
            &tx,
            false,
            rx.local_addr().unwrap(),
            None,
            &own,
            &pieces,
            &mem,
        )
        .unwrap();
        let mut got = vec![0u8; 1024];
        let (len, _) = rx.recv_from(&mut got).unwrap();
        let want = [&own[..8], &data[200..], &data[..100], &own[8..]].concat();
        assert_eq!(&got[..len], want);
        // A name beyond the ranges: nothing sent.
        let err = send_gso(
            &tx,
            false,
            rx.local_addr().unwrap(),
            None,
            &own,
            &[Piece::Ref(3)],
            &mem,
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn batches_of_one_call_arrive_in_order_and_a_later_start_skips_the_first() {
        let (tx, rx) = pair("127.0.0.1");
        let (_, rx2) = pair("127.0.0.1");
        let own: Vec<u8> = (0..200u8).collect();
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 3 + 2) as u8).collect();
        let mem = held(&data, &[(0, 1000), (1000, 7)]);
        // An ACK-sized datagram, then a GSO batch of two 500-byte datagrams (header pieces
        // around a payload reference) to a second socket, then a datagram with a reference.
        let pieces = [
            Piece::Own { start: 0, len: 20 },
            Piece::Own { start: 20, len: 12 },
            Piece::Mem,
            Piece::Own { start: 32, len: 8 },
            Piece::Mem,
        ];
        let (a, b) = (rx.local_addr().unwrap(), rx2.local_addr().unwrap());
        let batches = [
            Batch {
                dst: a,
                segment: None,
                pieces: 0..1,
            },
            Batch {
                dst: b,
                segment: Some(510),
                pieces: 1..4,
            },
            Batch {
                dst: a,
                segment: None,
                pieces: 4..5,
            },
        ];
        match send_batches(&tx, false, &own, &pieces, &mem, 0, &batches) {
            Ok(n) => assert_eq!(n, 3),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                eprintln!("skipped: no UDP GSO here ({e})");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let mut got = vec![0u8; 65536];
        let mut next = |rx: &UdpSocket| {
            let (len, _) = rx.recv_from(&mut got).unwrap();
            got[..len].to_vec()
        };
        assert_eq!(next(&rx), &own[..20]);
        assert_eq!(next(&rx), &data[1000..1007]);
        let stream = [&own[20..32], &data[..1000], &own[32..40]].concat();
        assert_eq!(next(&rx2), &stream[..510]);
        assert_eq!(next(&rx2), &stream[510..]);
        // From the third batch on: the references before it are skipped, not resent.
        assert_eq!(
            send_batches(&tx, false, &own, &pieces, &mem, 2, &batches).unwrap(),
            1
        );
        assert_eq!(next(&rx), &data[1000..1007]);
        // A batch whose range leaves the list, or too many batches: nothing sent.
        let bad = [Batch {
            dst: a,
            segment: None,
            pieces: 3..6,
        }];
        let err = send_batches(&tx, false, &own, &pieces, &mem, 0, &bad).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let many = vec![batches[0].clone(); MAX_BATCHES + 1];
        let err = send_batches(&tx, false, &own, &pieces, &mem, 0, &many).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        rx.set_nonblocking(true).unwrap();
        assert!(rx.recv_from(&mut got).is_err(), "nothing more was sent");
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
