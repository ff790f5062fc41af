//! Closing a device sends what it owes first: once the last handle of a soft device with a
//! progress thread is dropped, the ACK of a message its user has already seen complete is
//! on the wire. A process that closes the device and exits (the drop-in libibverbs' users
//! do: `ibv_rc_pingpong` after its last receive) would otherwise kill the progress thread
//! before it sent that ACK, and the peer would retry until RETRY_EXC_ERR.
//!
//! The peer is a plain UDP socket on loopback, where a datagram sent is in the receiver's
//! buffer when `send` returns: so after the drop returns the ACK must already be readable,
//! without waiting.

use crate::common;

use common::{Answer, build, connected_rc, post_recv, request, send_sealed, sge};
use remem_conformance::QpOptions;
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::{AccessFlags, Context, Mtu, WcStatus, WorkCompletion};
use remem_wire::Opcode;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEV_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 27, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 27, 2);
const PEER_QPN: u32 = 0x0012_3456;
const EPSN: u32 = 700;
const SPSN: u32 = 900;
/// Rounds: the ACK and the completion come from one pass of the progress thread, so a
/// close that does not wait loses the race only now and then.
const ROUNDS: usize = 200;

#[test]
fn closing_a_device_sends_the_acks_it_owes() {
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let o = QpOptions {
        access: rw,
        mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    };
    for round in 0..ROUNDS {
        let dev =
            SoftContext::bind_with(SocketAddr::new(DEV_IP.into(), 0), &SoftOptions::default())
                .unwrap();
        let port = dev.local_addr().port();
        let ctx: Arc<dyn Context> = Arc::new(dev);
        let peer = UdpSocket::bind(SocketAddr::new(PEER_IP.into(), port)).unwrap();
        let (ep, buf, mr) = connected_rc(&ctx, &o, (PEER_QPN, PEER_IP), SPSN, EPSN, rw);
        post_recv(&*ep.qp, 1, sge(&*mr, 0, 64));
        let h = request(ep.qp.qp_num(), Opcode::RcSendOnly, EPSN);
        send_sealed(&peer, PEER_IP, DEV_IP, port, build(&h, &[0x5a; 16]));
        // The user sees the receive complete ...
        let mut wc = [WorkCompletion::default()];
        let deadline = Instant::now() + Duration::from_secs(10);
        while ep.cq.poll(&mut wc).unwrap() == 0 {
            assert!(
                Instant::now() < deadline,
                "round {round}: no receive completion"
            );
            std::hint::spin_loop();
        }
        assert_eq!(wc[0].status, WcStatus::Success);
        // ... and closes everything at once.
        drop((ep, buf, mr, ctx));
        // The ACK is out by now.
        peer.set_nonblocking(true).unwrap();
        let mut b = [0u8; 2048];
        let mut acked = false;
        while let Ok(n) = peer.recv(&mut b) {
            acked |= Answer::parse(&b[..n]).is_some_and(|a| a.acks(EPSN));
        }
        assert!(
            acked,
            "round {round}: the device closed before sending its ACK"
        );
    }
}
