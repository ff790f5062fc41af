//! One reason, always the same, for a connection whose peer made a bad access: its QP went
//! to the error state because its responder refused the peer's request, which the device
//! says with an asynchronous event (`QpAccessErr`). The flushed receives that follow
//! are a symptom, never the reason (FAILURE_MODEL.md, "A failed one-sided operation").
//! The event and the flush race to the connection; the reason must not depend on which
//! comes first, so the test repeats.

use remem::verbs::{AccessFlags, AsyncEventType};
use remem::{CloseReason, ConnectionEvent, Error, Polling};
use std::time::Duration;

mod common;

use common::test_util::connect;

/// Runs: the wrong reason won in about half of them.
const RUNS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_bad_access_closes_the_connection_with_the_event_every_time() {
    for run in 0..RUNS {
        let server = common::builder(common::first_device())
            .polling(Polling::Event)
            .build()
            .unwrap();
        let client = common::builder(common::peer_device())
            .polling(Polling::Event)
            .build()
            .unwrap();
        let (cc, sc) = connect(&client, &server).await;
        assert_eq!(sc.next_event().await, ConnectionEvent::Established);
        let read_only = server
            .alloc_local_mr_with(
                std::alloc::Layout::array::<u8>(8).unwrap(),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        sc.share_local_mr(&read_only).await.unwrap();
        let remote = cc.receive_shared_mr().await.unwrap();
        let src = client
            .alloc_local_mr(std::alloc::Layout::array::<u8>(8).unwrap())
            .unwrap();
        // The server's responder refuses the write: its QP goes to ERR, with the event.
        assert!(cc.write(&src, &remote).await.is_err());
        let r = tokio::time::timeout(Duration::from_secs(5), sc.receive())
            .await
            .expect("the server's receive waits forever");
        let ev = match r {
            Err(Error::Event(ev)) => ev,
            other => panic!("run {run}: the receive failed with {other:?}, not the event"),
        };
        assert_eq!(ev.event_type, AsyncEventType::QpAccessErr, "run {run}");
        assert_eq!(sc.closed(), Some(CloseReason::Event(ev)), "run {run}");
        let end = tokio::time::timeout(Duration::from_secs(5), sc.next_event())
            .await
            .unwrap();
        assert_eq!(
            end,
            ConnectionEvent::Lost(CloseReason::Event(ev)),
            "run {run}"
        );
        assert!(
            matches!(sc.send(&read_only).await, Err(Error::Event(e)) if e == ev),
            "run {run}"
        );
    }
}
