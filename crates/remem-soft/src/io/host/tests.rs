//! The kernel's side of the host's NIC: the reuseport group steers each slot's packets to
//! its member's socket, before and after a member leaves (the last socket moving into its
//! index, as the table mirrors it).

use super::Host;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

/// A packet with a BTH whose destination QPN is in `slot` (all the program reads).
fn packet(slot: u8) -> [u8; 64] {
    let mut p = [0u8; 64];
    p[0] = 0x04;
    p[4..8].copy_from_slice(&(u32::from(slot) << 16 | 0x0505).to_be_bytes());
    p
}

/// Whether `s` has a datagram (waiting at most `within`) equal to `want`.
fn got(s: &UdpSocket, want: &[u8], within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 128];
    matches!(s.recv(&mut buf), Ok(n) if &buf[..n] == want)
}

#[test]
fn the_kernel_hands_each_slot_to_its_member_before_and_after_a_departure() {
    let addr = SocketAddr::from(([127, 9, (std::process::id() % 250) as u8 + 1, 1], 4791));
    let (a, sa) = Host::join(addr).unwrap();
    let (b, sb) = Host::join(addr).unwrap();
    let (c, sc) = Host::join(addr).unwrap();
    assert_eq!(c.members(), 3);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let check = |members: &[(&Host, &UdpSocket)]| {
        for (h, s) in members {
            let p = packet(h.slot());
            tx.send_to(&p, addr).unwrap();
            assert!(
                got(s, &p, Duration::from_secs(5)),
                "slot {} got its packet",
                h.slot()
            );
            // And nobody else did.
            for (other, os) in members {
                if other.slot() != h.slot() {
                    assert!(
                        !got(os, &p, Duration::from_millis(1)),
                        "slot {}",
                        other.slot()
                    );
                }
            }
        }
    };
    check(&[(&a, &sa), (&b, &sb), (&c, &sc)]);
    // The first member leaves: the kernel moves the last socket (c's) into its index, and
    // the program rewritten on the way out says so.
    drop(sa);
    a.leave();
    assert_eq!(b.members(), 2);
    assert_eq!(b.table().member(c.slot()).unwrap().index, 0);
    check(&[(&b, &sb), (&c, &sc)]);
}
