//! Connection setup as librpma exposes it, on soft devices (`common::pair_with`) or
//! `REMEM_TEST_DEVICE`: private data on connect and accept, rejection, connection events,
//! a separate receive CQ.

use remem::{
    ConnectOptions, Connection, ConnectionEvent, Error, MAX_PRIVATE_DATA, Polling, Rdma, RemoteMr,
};
use std::alloc::Layout;
use std::time::Duration;

use crate::common;

fn pair() -> (Rdma, Rdma) {
    common::pair_with(|a| a.polling(Polling::Event), |b| b)
}

fn with_data(pd: &[u8]) -> ConnectOptions {
    ConnectOptions {
        private_data: pd.to_vec(),
        ..ConnectOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_data_goes_both_ways_and_carries_a_descriptor() {
    let (a, b) = pair();
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let target = b.alloc_local_mr(Layout::array::<u8>(64).unwrap()).unwrap();
    let descriptor = target.descriptor(&b).unwrap();
    let server = async {
        let req = listener.next_request().await.unwrap();
        assert_eq!(req.private_data(), b"hello from a");
        req.accept(&with_data(&descriptor)).await.unwrap()
    };
    let hello = with_data(b"hello from a");
    let (ca, cb) = tokio::join!(a.connect_with(addr, &hello), server);
    let ca = ca.unwrap();
    assert_eq!(cb.peer_private_data(), b"hello from a");
    // The listener's answer held its region's descriptor: usable at once.
    let remote = RemoteMr::from_descriptor(&ca.peer_private_data()).unwrap();
    let src = a.alloc_local_mr(Layout::array::<u8>(5).unwrap()).unwrap();
    src.write(0, b"bytes").unwrap();
    ca.write(&src, &remote.get(0..5).unwrap()).await.unwrap();
    assert_eq!(&target.to_vec()[..5], b"bytes");
    // Too much private data is refused before anything is sent.
    let too_long = with_data(&[0; MAX_PRIVATE_DATA + 1]);
    assert!(matches!(
        a.connect_with(addr, &too_long).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_connection_fails_with_the_reason() {
    let (a, b) = pair();
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = async {
        let req = listener.next_request().await.unwrap();
        req.reject(b"busy").await.unwrap();
        // The listener goes on serving: the next request is accepted.
        listener.accept().await.unwrap()
    };
    let client = async {
        let first = a.connect(addr).await;
        let second = a.connect(addr).await;
        (first, second)
    };
    let ((first, second), _accepted) = tokio::join!(client, server);
    match first {
        Err(e @ Error::Rejected(_)) => {
            assert!(matches!(&e, Error::Rejected(pd) if pd == b"busy"));
            // The message shows the reason the peer gave.
            assert_eq!(e.to_string(), "connection rejected by the peer: \"busy\"");
        }
        other => panic!("want a rejection, got {other:?}"),
    }
    assert!(second.is_ok());
}

async fn connected(a: &Rdma, b: &Rdma, opts: &ConnectOptions) -> (Connection, Connection) {
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = async { listener.next_request().await?.accept(opts).await };
    let (ca, cb) = tokio::join!(a.connect_with(addr, opts), server);
    (ca.unwrap(), cb.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_report_established_then_closed_or_lost() {
    let (a, b) = pair();
    let (ca, cb) = connected(&a, &b, &ConnectOptions::default()).await;
    assert_eq!(ca.next_event().await, ConnectionEvent::Established);
    assert_eq!(cb.next_event().await, ConnectionEvent::Established);
    // The peer closes in order: Closed on both sides.
    let waiting = tokio::spawn(async move {
        let ev = ca.next_event().await;
        (ev, ca)
    });
    cb.close().await;
    let (ev, ca) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the event arrives")
        .unwrap();
    assert_eq!(ev, ConnectionEvent::Closed);
    assert_eq!(cb.next_event().await, ConnectionEvent::Closed);
    assert_eq!(ca.next_event().await, ConnectionEvent::Closed, "and again");

    // A connection that fails (an access violation) is lost, with the reason.
    let (ca, cb) = connected(&a, &b, &ConnectOptions::default()).await;
    assert_eq!(ca.next_event().await, ConnectionEvent::Established);
    let read_only = b
        .alloc_local_mr_with(
            Layout::array::<u8>(8).unwrap(),
            remem::AccessFlags::LOCAL_WRITE | remem::AccessFlags::REMOTE_READ,
        )
        .unwrap();
    cb.share_local_mr(&read_only).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let src = a.alloc_local_mr(Layout::array::<u8>(8).unwrap()).unwrap();
    assert!(ca.write(&src, &remote).await.is_err());
    match ca.next_event().await {
        // Our write was refused: the transport's completion says so.
        ConnectionEvent::Lost(remem::CloseReason::Completion { status, .. }) => {
            assert_eq!(status, remem::verbs::WcStatus::RemAccessErr)
        }
        other => panic!("want Lost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_on_a_completion_queue_of_their_own() {
    let (a, b) = pair();
    let opts = ConnectOptions {
        separate_recv_cq: true,
        ..ConnectOptions::default()
    };
    let (ca, cb) = connected(&a, &b, &opts).await;
    let m = a
        .alloc_local_mr(Layout::array::<u8>(3000).unwrap())
        .unwrap();
    m.write(0, &[7; 3000]).unwrap();
    let reply = b.alloc_local_mr(Layout::array::<u8>(10).unwrap()).unwrap();
    reply.write(0, &[8; 10]).unwrap();
    for i in 0..100u32 {
        ca.send_with_imm(&m, i).await.unwrap();
        let got = cb.receive().await.unwrap();
        assert_eq!((got.data.len(), got.imm), (3000, Some(i)));
        cb.send(&reply).await.unwrap();
        assert_eq!(ca.receive().await.unwrap().data, vec![8; 10]);
    }
}
