//! Connections through the RDMA connection manager (`Rdma::connect_cm` /
//! `Rdma::listen_cm`) on soft devices sharing a UDP port (`common::same_port_pair_with`:
//! the CM, unlike remem's TCP handshake, does not tell a device its peer's port) or
//! `REMEM_TEST_DEVICE`: private data both ways, data over the connection, rejection, a
//! port nobody listens on, and a close by either side seen by the other.

use remem::verbs::CmEventKind;
use remem::{
    ConnectOptions, ConnectionEvent, Error, HandshakeError, MAX_CM_CONNECT_PRIVATE_DATA,
    MR_DESCRIPTOR_LEN, Polling, Rdma, RemoteMr,
};
use std::alloc::Layout;
use std::net::SocketAddr;

use crate::common;

fn pair() -> (Rdma, Rdma) {
    common::same_port_pair_with(|a| a.polling(Polling::Event), |b| b)
}

/// Where `b` listens: its device's address, a port the CM picks.
fn any_port(b: &Rdma) -> SocketAddr {
    SocketAddr::new(b.gid().to_ip(), 0)
}

fn with_data(pd: &[u8]) -> ConnectOptions {
    ConnectOptions {
        private_data: pd.to_vec(),
        ..ConnectOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cm_connection_carries_private_data_and_traffic_both_ways() {
    let (a, b) = pair();
    let listener = b.listen_cm(any_port(&b)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    assert_ne!(addr.port(), 0, "the listener's port was picked");
    let target = b.alloc_local_mr(Layout::array::<u8>(64).unwrap()).unwrap();
    let descriptor = target.descriptor(&b).unwrap();
    let server = async {
        let req = listener.next_request().await.unwrap();
        assert!(req.private_data().starts_with(b"hello from a"));
        req.accept(&with_data(&descriptor)).await.unwrap()
    };
    let hello = with_data(b"hello from a");
    let (ca, cb) = tokio::join!(a.connect_cm_with(addr, &hello), server);
    let ca = ca.unwrap();
    assert!(cb.peer_private_data().starts_with(b"hello from a"));
    // The listener's answer held its region's descriptor: usable at once.
    let pd = ca.peer_private_data();
    let remote = RemoteMr::from_descriptor(&pd[..MR_DESCRIPTOR_LEN]).unwrap();
    let src = a.alloc_local_mr(Layout::array::<u8>(5).unwrap()).unwrap();
    src.write(0, b"bytes").unwrap();
    ca.write(&src, &remote.get(0..5).unwrap()).await.unwrap();
    assert_eq!(&target.to_vec()[..5], b"bytes");
    // Messages both ways.
    let msg = b.alloc_local_mr(Layout::array::<u8>(3).unwrap()).unwrap();
    msg.write(0, b"b2a").unwrap();
    let (sent, got) = tokio::join!(cb.send(&msg), ca.receive());
    sent.unwrap();
    assert_eq!(got.unwrap().data, b"b2a");
    let (sent, got) = tokio::join!(ca.send(&src), cb.receive());
    sent.unwrap();
    assert_eq!(got.unwrap().data, b"bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_by_either_side_is_seen_by_the_other() {
    let (a, b) = pair();
    let listener = b.listen_cm(any_port(&b)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    for closer_is_a in [true, false] {
        let (ca, cb) = tokio::join!(a.connect_cm(addr), listener.accept());
        let (ca, cb) = (ca.unwrap(), cb.unwrap());
        let (closer, other) = if closer_is_a { (&ca, &cb) } else { (&cb, &ca) };
        assert_eq!(other.next_event().await, ConnectionEvent::Established);
        closer.close().await;
        assert_eq!(other.next_event().await, ConnectionEvent::Closed);
        assert!(other.closed().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_cm_connection_fails_with_the_listeners_private_data() {
    let (a, b) = pair();
    let listener = b.listen_cm(any_port(&b)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = async {
        let req = listener.next_request().await.unwrap();
        req.reject(b"busy").unwrap();
        // The listener goes on serving: the next request is accepted.
        listener.accept().await.unwrap()
    };
    let client = async { (a.connect_cm(addr).await, a.connect_cm(addr).await) };
    let ((first, second), _server_end) = tokio::join!(client, server);
    match first {
        Err(e @ Error::Rejected(_)) => {
            assert!(matches!(&e, Error::Rejected(pd) if pd.starts_with(b"busy")));
            // The message shows the reason (not the CM's padding to 148 bytes).
            assert_eq!(e.to_string(), "connection rejected by the peer: \"busy\"");
        }
        other => panic!("want Rejected, got {other:?}"),
    }
    second.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_port_nobody_listens_on_fails_fast_with_reason_8() {
    let (a, b) = pair();
    // Learn a free port, then stop listening on it.
    let addr = {
        let l = b.listen_cm(any_port(&b)).await.unwrap();
        l.local_addr().unwrap()
    };
    let started = std::time::Instant::now();
    match a.connect_cm(addr).await {
        Err(Error::Handshake(HandshakeError::Cm { event, status })) => {
            assert_eq!((event, status), (CmEventKind::Rejected, 8));
        }
        other => panic!("want a CM reject, got {other:?}"),
    }
    // A reject comes back in a round trip, not after the CM's retries.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_much_private_data_is_refused_before_anything_is_sent() {
    let (a, b) = pair();
    let listener = b.listen_cm(any_port(&b)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let long = with_data(&[7; MAX_CM_CONNECT_PRIVATE_DATA + 1]);
    assert!(matches!(
        a.connect_cm_with(addr, &long).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_their_users_drive_connect_through_the_cm() {
    // Soft devices without a progress thread: nothing moves the CM's packets unless the
    // handshake's waits drive the devices (the listener's too, while it waits for a
    // request).
    use remem_soft::{SoftContext, SoftOptions};
    use std::sync::Arc;
    let inline = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let open = |addr| -> Arc<dyn remem::verbs::Context> {
        Arc::new(SoftContext::bind_with(addr, &inline).unwrap())
    };
    let a_ctx = open(common::first_addr());
    let b_ctx = open(common::same_port_addr(a_ctx.info().udp_addr.unwrap()));
    assert!(a_ctx.caller_driven() && b_ctx.caller_driven());
    let build = |ctx| {
        remem::RdmaBuilder::new()
            .context(ctx)
            .polling(Polling::Manual)
            .keepalive(None)
            .build()
            .unwrap()
    };
    let (a, b) = (build(a_ctx), build(b_ctx));
    let listener = b.listen_cm(any_port(&b)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { listener.accept().await });
    let ca = a.connect_cm(addr).await.unwrap();
    // The connector's RTU leaves when its device is driven next (as with any packet of a
    // device its user drives): poll until the listener has its connection.
    let cb = loop {
        if server.is_finished() {
            break server.await.unwrap().unwrap();
        }
        ca.poll_completions();
        tokio::task::yield_now().await;
    };
    assert_ne!(ca.qp_num(), 0);
    assert_ne!(cb.qp_num(), 0);
}
