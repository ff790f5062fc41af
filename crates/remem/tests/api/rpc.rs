//! Request/response over messages (`remem::rpc`): many tasks on one connection each get
//! their own reply, even when the server answers out of order; the in-flight limit holds; a
//! cancelled call does not confuse later ones; refusals; the peer closing fails every
//! waiting call; malformed frames are protocol violations on either side.

use crate::common;

use common::test_util::{connect, layout};
use remem::rpc::{FrameError, FrameHeader, FrameKind, RpcClient, RpcServer, RpcViolation};
use remem::{CloseReason, Connection, Error, ProtocolViolation, Rdma};
use std::time::Duration;

/// The longest any test here runs.
const LIMIT: Duration = Duration::from_secs(30);

/// Client and server `Rdma`s (the tests' shared pair) and their connection.
async fn pair() -> (Rdma, Connection, Rdma, Connection) {
    let (a, b) = common::pair();
    let (ca, cb) = connect(&a, &b).await;
    (a, ca, b, cb)
}

fn run<F: std::future::Future<Output = ()>>(f: F) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async { tokio::time::timeout(LIMIT, f).await })
        .expect("the test's time limit");
}

/// What the servers here answer: the request's bytes reversed, after a tag.
fn answer(request: &[u8]) -> Vec<u8> {
    let mut reply = b"re:".to_vec();
    reply.extend(request.iter().rev());
    reply
}

/// A request unique to (task, call), of a length that varies.
fn request(task: usize, call: usize) -> Vec<u8> {
    let text = format!("task {task} call {call} ");
    text.repeat(1 + (task + call) % 5).into_bytes()
}

/// Sends raw bytes as one message (a peer that does not speak the RPC framing).
async fn send_raw(rdma: &Rdma, conn: &Connection, bytes: &[u8]) {
    let mr = rdma.alloc_local_mr(layout(bytes.len())).unwrap();
    mr.write(0, bytes).unwrap();
    conn.send(&mr).await.unwrap();
}

#[test]
fn many_tasks_share_one_connection() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let server = RpcServer::new(&b, cb);
        let serving = tokio::spawn(async move {
            server
                .serve(|request| async move { Ok(answer(&request)) })
                .await
        });
        let rpc = RpcClient::new(&a, ca);
        let (tasks, calls) = (32, 40);
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let rpc = rpc.clone();
                tokio::spawn(async move {
                    for call in 0..calls {
                        let request = request(task, call);
                        let reply = rpc.call(&request).await.unwrap();
                        assert_eq!(reply, answer(&request), "task {task} call {call}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        drop(rpc);
        assert_eq!(serving.await.unwrap().unwrap(), (tasks * calls) as u64);
    });
}

#[test]
fn replies_out_of_order_reach_their_calls() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::new(&a, ca);
        let n = 32;
        let calls: Vec<_> = (0..n)
            .map(|task| {
                let rpc = rpc.clone();
                tokio::spawn(async move { (task, rpc.call(&request(task, 0)).await) })
            })
            .collect();
        // The server takes every request before it answers any, then answers in reverse.
        let server = RpcServer::new(&b, cb);
        let mut requests = Vec::new();
        for _ in 0..n {
            requests.push(server.next_request().await.unwrap().expect("a request"));
        }
        while let Some(r) = requests.pop() {
            let reply = answer(r.data());
            r.reply(&reply).await.unwrap();
        }
        for call in calls {
            let (task, reply) = call.await.unwrap();
            assert_eq!(reply.unwrap(), answer(&request(task, 0)), "task {task}");
        }
    });
}

#[test]
fn calls_in_flight_are_bounded() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::with_limit(&a, ca, 2);
        let calls: Vec<_> = (0..5u8)
            .map(|i| {
                let rpc = rpc.clone();
                tokio::spawn(async move { rpc.call(&[i]).await })
            })
            .collect();
        let server = RpcServer::new(&b, cb);
        let first = server.next_request().await.unwrap().unwrap();
        let second = server.next_request().await.unwrap().unwrap();
        // A third request cannot come while two are unanswered (a bounded check that
        // something does not happen).
        let third = tokio::time::timeout(Duration::from_millis(300), server.next_request()).await;
        assert!(third.is_err(), "a third request arrived: {third:?}");
        for r in [first, second] {
            let reply = r.data().to_vec();
            r.reply(&reply).await.unwrap();
        }
        for _ in 0..3 {
            let r = server.next_request().await.unwrap().unwrap();
            let reply = r.data().to_vec();
            r.reply(&reply).await.unwrap();
        }
        for (i, call) in (0..5u8).zip(calls) {
            assert_eq!(call.await.unwrap().unwrap(), [i]);
        }
    });
}

#[test]
fn a_cancelled_call_does_not_confuse_later_ones() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::new(&a, ca);
        let server = RpcServer::new(&b, cb);

        let cancelled = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(b"first").await }
        });
        let first = server.next_request().await.unwrap().unwrap();
        assert_eq!(first.data(), b"first");
        cancelled.abort();
        assert!(cancelled.await.unwrap_err().is_cancelled());
        assert!(format!("{rpc:?}").contains("waiting: 0"), "{rpc:?}");

        let later = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(b"second").await }
        });
        let second = server.next_request().await.unwrap().unwrap();
        // The cancelled call's reply comes first; it must be discarded, not handed on.
        first.reply(b"reply to first").await.unwrap();
        second.reply(b"reply to second").await.unwrap();
        assert_eq!(later.await.unwrap().unwrap(), b"reply to second");
        // And the client still works.
        let third = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(b"third").await }
        });
        let r = server.next_request().await.unwrap().unwrap();
        r.reply(b"3").await.unwrap();
        assert_eq!(third.await.unwrap().unwrap(), b"3");
    });
}

#[test]
fn refused_and_dropped_requests_fail_their_calls() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::new(&a, ca);
        let server = RpcServer::new(&b, cb);
        let calls = tokio::spawn({
            let rpc = rpc.clone();
            async move { (rpc.call(b"x").await, rpc.call(b"y").await) }
        });
        let x = server.next_request().await.unwrap().unwrap();
        x.refuse("no such key").await.unwrap();
        let y = server.next_request().await.unwrap().unwrap();
        drop(y);
        let (x, y) = calls.await.unwrap();
        assert!(
            matches!(x, Err(Error::Refused(ref why)) if why == "no such key"),
            "{x:?}"
        );
        assert!(matches!(y, Err(Error::Refused(_))), "{y:?}");
    });
}

#[test]
fn a_handler_that_fails_refuses_its_request() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let server = RpcServer::new(&b, cb);
        let serving = tokio::spawn(async move {
            server
                .serve(|request| async move {
                    match request.as_slice() {
                        b"bad" => Err("bad request".to_string()),
                        other => Ok(answer(other)),
                    }
                })
                .await
        });
        let rpc = RpcClient::new(&a, ca);
        let bad = rpc.call(b"bad").await;
        assert!(
            matches!(bad, Err(Error::Refused(ref why)) if why == "bad request"),
            "{bad:?}"
        );
        assert_eq!(rpc.call(b"good").await.unwrap(), answer(b"good"));
        drop(rpc);
        assert_eq!(serving.await.unwrap().unwrap(), 2);
    });
}

#[test]
fn the_peer_closing_fails_every_waiting_call() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::new(&a, ca);
        let server = RpcServer::new(&b, cb);
        let calls: Vec<_> = (0..6u8)
            .map(|i| {
                let rpc = rpc.clone();
                tokio::spawn(async move { rpc.call(&[i]).await })
            })
            .collect();
        // Every request has arrived and none is answered: then the server closes.
        let mut held = Vec::new();
        for _ in 0..6 {
            held.push(server.next_request().await.unwrap().unwrap());
        }
        server.connection().close().await;
        for call in calls {
            let r = call.await.unwrap();
            assert!(matches!(r, Err(Error::Closed(CloseReason::Peer))), "{r:?}");
        }
        let later = rpc.call(b"after").await;
        assert!(
            matches!(later, Err(Error::Closed(CloseReason::Peer))),
            "{later:?}"
        );
        drop(held);
    });
}

#[test]
fn a_malformed_reply_is_a_protocol_violation() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::new(&a, ca);
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(b"q").await }
        });
        // A raw peer: takes the request, answers three bytes.
        let request = cb.receive().await.unwrap();
        let (header, payload) = FrameHeader::parse(&request.data).unwrap();
        assert_eq!((header.kind, payload), (FrameKind::Request, &b"q"[..]));
        send_raw(&b, &cb, &[1, 2, 3]).await;
        // One reason at both doors: the call's error, `closed()` and the last event.
        let why = CloseReason::Protocol(ProtocolViolation::Rpc(RpcViolation::Frame(
            FrameError::Short(3),
        )));
        ended_for(call.await.unwrap(), rpc.connection(), why).await;
        assert!(matches!(
            rpc.call(b"again").await,
            Err(Error::Closed(CloseReason::Protocol(_)))
        ));
        // The client closed the connection: the raw peer sees it.
        assert!(matches!(cb.receive().await, Err(Error::Closed(_))));
    });
}

#[test]
fn a_reply_to_a_request_never_made_is_a_protocol_violation() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let rpc = RpcClient::new(&a, ca);
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(b"q").await }
        });
        let request = cb.receive().await.unwrap();
        let (header, _) = FrameHeader::parse(&request.data).unwrap();
        let forged = FrameHeader {
            kind: FrameKind::Reply,
            id: header.id + 1000,
        };
        send_raw(&b, &cb, &forged.to_bytes()).await;
        let r = call.await.unwrap();
        assert!(
            matches!(
                r,
                Err(Error::Closed(CloseReason::Protocol(
                    ProtocolViolation::Rpc(RpcViolation::UnknownReply(_))
                )))
            ),
            "{r:?}"
        );
    });
}

#[test]
fn a_malformed_request_is_a_protocol_violation() {
    run(async {
        let (a, ca, b, cb) = pair().await;
        let server = RpcServer::new(&b, cb);
        // Not a frame, then a reply sent to the serving side: each is a violation.
        send_raw(&a, &ca, b"GET key").await;
        let r = server.next_request().await;
        assert!(
            matches!(
                r,
                Err(Error::Closed(CloseReason::Protocol(
                    ProtocolViolation::Rpc(RpcViolation::Frame(_))
                )))
            ),
            "{r:?}"
        );
        assert!(matches!(ca.receive().await, Err(Error::Closed(_))));

        let (a, ca, b, cb) = pair().await;
        let server = RpcServer::new(&b, cb);
        let reply = FrameHeader {
            kind: FrameKind::Reply,
            id: 0,
        };
        send_raw(&a, &ca, &reply.to_bytes()).await;
        // One reason at both doors: the error of `next_request`, `closed()` and the last
        // event; and the peer is told.
        let why = CloseReason::Protocol(ProtocolViolation::Rpc(RpcViolation::NotARequest(
            FrameKind::Reply,
        )));
        ended_for(server.next_request().await, server.connection(), why).await;
        assert!(matches!(
            ca.receive().await,
            Err(Error::Closed(CloseReason::Peer))
        ));
    });
}

/// Checks that `conn` ended for `why` at both doors: the error `r` of the call that met
/// it, its `closed()` and its last event.
async fn ended_for<T: std::fmt::Debug>(r: Result<T, Error>, conn: &Connection, why: CloseReason) {
    match r {
        Err(Error::Closed(r)) => assert_eq!(r, why),
        other => panic!("{other:?}"),
    }
    assert_eq!(conn.closed(), Some(why.clone()));
    assert_eq!(last_event(conn).await, remem::ConnectionEvent::Lost(why));
}

/// The event that ended `conn` (after `Established`).
async fn last_event(conn: &Connection) -> remem::ConnectionEvent {
    loop {
        match conn.next_event().await {
            remem::ConnectionEvent::Established => continue,
            ev => return ev,
        }
    }
}

/// A caller that grants one credit and never takes an answer, while the server drops its
/// requests unanswered: the refusals wait, one task per connection sends them (not one per
/// request), and one beyond `MAX_UNSENT_REFUSALS` closes the connection as a protocol
/// violation — the server holds a bounded amount for it.
#[test]
fn refusals_a_caller_never_takes_are_bounded() {
    run(async {
        use remem::rpc::MAX_UNSENT_REFUSALS;
        let (a, b) = common::pair_with(|a| a.recv_depth(1), |b| b);
        let (ca, cb) = connect(&a, &b).await;
        let server = RpcServer::new(&b, cb);
        let metrics = tokio::runtime::Handle::current().metrics();
        let tasks_before = metrics.num_alive_tasks();
        let request = |id: u64| {
            let mut frame = FrameHeader {
                kind: FrameKind::Request,
                id,
            }
            .to_bytes()
            .to_vec();
            frame.extend_from_slice(b"q");
            frame
        };
        // Half the budget: the server drops each; its refusals wait (one went on the one
        // credit), sent by one task.
        let half = MAX_UNSENT_REFUSALS as u64 / 2;
        for id in 0..half {
            send_raw(&a, &ca, &request(id)).await;
            let r = server.next_request().await.unwrap().expect("a request");
            assert_eq!(r.id(), id);
            drop(r);
        }
        let tasks = metrics.num_alive_tasks();
        assert!(
            tasks <= tasks_before + 1,
            "{} tasks for {half} dropped requests",
            tasks - tasks_before
        );
        assert_eq!(server.connection().closed(), None);
        // Past the budget the connection closes, with why.
        let why = CloseReason::Protocol(ProtocolViolation::Rpc(RpcViolation::UnsentRefusals {
            max: MAX_UNSENT_REFUSALS,
        }));
        // (One refusal went on the credit, one waits for the next inside the task that
        // sends them, `MAX_UNSENT_REFUSALS` wait their turn: dropping the next request is
        // one too many.)
        for id in half..=MAX_UNSENT_REFUSALS as u64 + 2 {
            ca.send_bytes(request(id)).await.unwrap();
            let r = server.next_request().await.unwrap().expect("a request");
            assert_eq!(server.connection().closed(), None, "closed before {id}");
            drop(r);
        }
        assert_eq!(server.connection().closed(), Some(why.clone()));
        assert_eq!(
            last_event(server.connection()).await,
            remem::ConnectionEvent::Lost(why)
        );
        // The caller is told.
        assert_eq!(last_event(&ca).await, remem::ConnectionEvent::Closed);
    });
}
