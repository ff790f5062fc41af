//! The async API on two soft devices in one process (`common::pair`: port 0, the peer on
//! the first's port): connection setup over TCP, one-sided operations, atomics, messages, lending
//! memory, many tasks on one connection, cancellation, access errors and close.

use remem::{AccessFlags, Connection, Error, Polling, Rdma, RdmaBuilder};
use std::alloc::Layout;

use crate::common;

use common::test_util::{connect, layout};

/// Two `Rdma`s that can talk: on two soft devices (`common::pair_with`), or
/// both on the device `REMEM_TEST_DEVICE` names (two contexts of e.g. `rxe0`).
fn pair(polling: Polling) -> (Rdma, Rdma) {
    common::pair_with(|a| a.polling(polling), |b| b.polling(polling))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sided_atomics_and_messages() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    // B lends a region; A writes, reads back, and does atomics on it.
    let target = b.alloc_local_mr(layout(100_000)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    assert_eq!(remote.len(), 100_000);
    let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 + 1) as u8).collect();
    let src = a.alloc_local_mr(layout(50_000)).unwrap();
    src.write(0, &data).unwrap();
    ca.write(&src, &remote.get(1000..51_000).unwrap())
        .await
        .unwrap();
    assert_eq!(target.to_vec()[1000..51_000], data[..]);
    let mut back = a.alloc_local_mr(layout(50_000)).unwrap();
    ca.read(&mut back, &remote.get(1000..51_000).unwrap())
        .await
        .unwrap();
    assert_eq!(back.to_vec(), data);
    // Read into part of a region, through get_mut.
    let part = back.get_mut(0..100).unwrap();
    ca.read(&mut { part }, &remote.get(0..100).unwrap())
        .await
        .unwrap();
    assert_eq!(back.to_vec()[..100], vec![0u8; 100][..]);
    // Atomics return the previous value.
    target.store_u64(99_992, 40).unwrap();
    let word = remote.get(99_992..100_000).unwrap();
    assert_eq!(ca.fetch_and_add(&word, 2).await.unwrap(), 40);
    assert_eq!(ca.compare_and_swap(&word, 42, 7).await.unwrap(), 42);
    assert_eq!(ca.compare_and_swap(&word, 42, 9).await.unwrap(), 7);
    assert_eq!(target.load_u64(99_992).unwrap(), 7);
    // Write with immediate.
    ca.write_with_imm(
        &src.get(0..10).unwrap(),
        &remote.get(0..10).unwrap(),
        0xabcd,
    )
    .await
    .unwrap();
    assert_eq!(cb.receive_write_imm().await.unwrap(), 0xabcd);
    assert_eq!(target.to_vec()[..10], data[..10]);
    // Messages, with and without immediate, both ways.
    ca.send(&src.get(0..3000).unwrap()).await.unwrap();
    ca.send_with_imm(&src.get(5..6).unwrap(), 77).await.unwrap();
    let m = cb.receive().await.unwrap();
    assert_eq!((m.data.as_slice(), m.imm), (&data[..3000], None));
    let m = cb.receive().await.unwrap();
    assert_eq!((m.data.as_slice(), m.imm), (&data[5..6], Some(77)));
    let reply = b.alloc_local_mr(layout(4)).unwrap();
    reply.write(0, b"pong").unwrap();
    cb.send(&reply).await.unwrap();
    assert_eq!(ca.receive().await.unwrap().data, b"pong");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lengths_and_alignment_are_checked_before_posting() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(64)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let src = a.alloc_local_mr(layout(32)).unwrap();
    assert!(matches!(
        ca.write(&src, &remote).await,
        Err(Error::LengthMismatch {
            local: 32,
            remote: 64
        })
    ));
    assert!(matches!(
        ca.fetch_and_add(&remote.get(4..12).unwrap(), 1).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(remote.get(60..70).is_err());
    assert!(src.get(..33).is_err());
    // The connection still works.
    ca.write(&src, &remote.get(0..32).unwrap()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_violation_fails_the_operation_and_the_connection() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    // Lent read-only: a write is a remote access error.
    let ro = b
        .alloc_local_mr_with(
            layout(64),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    cb.share_local_mr(&ro).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let src = a.alloc_local_mr(layout(64)).unwrap();
    let mut dst = a.alloc_local_mr(layout(64)).unwrap();
    ca.read(&mut dst, &remote).await.unwrap();
    match ca.write(&src, &remote).await {
        Err(Error::Completion { status, .. }) => {
            assert_eq!(status, remem::verbs::WcStatus::RemAccessErr)
        }
        other => panic!("write to a read-only region: {other:?}"),
    }
    // An RC QP in error: everything after fails with Closed.
    assert!(matches!(
        ca.read(&mut dst, &remote).await,
        Err(Error::Closed(_))
    ));
    // Access beyond what the Rdma grants cannot even be registered.
    let ro_rdma = RdmaBuilder::new()
        .device(common::first_device())
        .access(AccessFlags::LOCAL_WRITE)
        .build()
        .unwrap();
    assert!(matches!(
        ro_rdma.alloc_local_mr_with(
            layout(8),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        ),
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_connection() {
    let (a, b) = pair(Polling::Adaptive {
        spin: std::time::Duration::from_micros(50),
    });
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(8 * 64)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let ca = std::sync::Arc::new(ca);
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (ca, a) = (ca.clone(), a.clone());
        tasks.push(tokio::spawn(async move {
            let word = remote.get(t * 8..t * 8 + 8).unwrap();
            let src = a.alloc_local_mr(layout(8)).unwrap();
            for i in 0..50u64 {
                let prev = ca.fetch_and_add(&word, 1).await.unwrap();
                assert_eq!(prev, i);
                src.store_u64(0, t as u64).unwrap();
            }
            // Messages from many tasks: credits keep the receiver's queue from overflowing.
            for _ in 0..10 {
                ca.send(&src).await.unwrap();
            }
        }));
    }
    let receiver = tokio::spawn(async move {
        let mut count = [0u32; 16];
        for _ in 0..160 {
            let m = cb.receive().await.unwrap();
            count[u64::from_le_bytes(m.data.try_into().unwrap()) as usize] += 1;
        }
        (count, cb)
    });
    for t in tasks {
        t.await.unwrap();
    }
    let (count, _cb) = receiver.await.unwrap();
    assert_eq!(count, [10; 16]);
    for t in 0..16 {
        assert_eq!(target.load_u64(t * 8).unwrap(), 50);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_fails_pending_operations_on_both_sides() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let ca = std::sync::Arc::new(ca);
    // A waits for a message that never comes; B closes.
    let waiter = {
        let ca = ca.clone();
        tokio::spawn(async move { ca.receive().await })
    };
    cb.close().await;
    assert!(matches!(waiter.await.unwrap(), Err(Error::Closed(_))));
    assert!(ca.closed().is_some());
    let buf = a.alloc_local_mr(layout(8)).unwrap();
    assert!(matches!(ca.send(&buf).await, Err(Error::Closed(_))));
    assert!(matches!(cb.send(&buf).await, Err(Error::Closed(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_operation_keeps_its_memory_alive() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(1 << 20)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    target.write(0, &[5u8; 1 << 20]).unwrap();
    // Poll a read once (it is posted), then drop the future and the region. On a loaded
    // machine the read may finish before the first poll returns: then try again.
    let mut cancelled = false;
    for _ in 0..20 {
        let mut dst = a.alloc_local_mr(layout(1 << 20)).unwrap();
        let first = {
            let fut = ca.read(&mut dst, &remote);
            tokio::pin!(fut);
            futures_poll_once(fut.as_mut()).await
        };
        drop(dst);
        if first.is_none() {
            cancelled = true;
            break;
        }
    }
    if common::test_device().is_some() && !cancelled {
        // Kernel rxe on one device may run a whole READ inside the post system call: then
        // no read is still in flight after its first poll, and there is nothing to cancel.
        eprintln!("every read finished within its first poll: cancellation not exercised");
    } else {
        assert!(cancelled, "every read finished within its first poll");
    }
    // The connection goes on; the dropped read completed into memory nobody else got.
    let mut again = a.alloc_local_mr(layout(1 << 20)).unwrap();
    ca.read(&mut again, &remote).await.unwrap();
    assert_eq!(again.to_vec(), vec![5u8; 1 << 20]);
}

/// Polls a future once; `Some` if it finished.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
        std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_manual_polling() {
    let (a, b) = pair(Polling::Busy);
    let (ca, cb) = connect(&a, &b).await;
    let m = a.alloc_local_mr(layout(16)).unwrap();
    ca.send(&m).await.unwrap();
    assert_eq!(cb.receive().await.unwrap().data, vec![0; 16]);
    // The agent and large messages work with a polling thread outside the runtime too.
    let lease = ca
        .request_remote_mr(layout(64), std::time::Duration::from_secs(5))
        .await
        .unwrap();
    ca.write(&m, &lease.mr().get(0..16).unwrap()).await.unwrap();
    let big = a.alloc_local_mr(layout(200_000)).unwrap();
    ca.send(&big).await.unwrap();
    assert_eq!(cb.receive().await.unwrap().data.len(), 200_000);
    drop((ca, cb));

    let (a, b) = pair(Polling::Manual);
    let (ca, cb) = connect(&a, &b).await;
    let m = a.alloc_local_mr(layout(16)).unwrap();
    m.write(0, b"manual polling!!").unwrap();
    let send = ca.send(&m);
    let recv = cb.receive();
    tokio::pin!(send, recv);
    let (mut sent, mut got) = (false, None);
    while !sent || got.is_none() {
        ca.poll_completions();
        cb.poll_completions();
        if !sent {
            sent = futures_poll_once(send.as_mut()).await.is_some();
        }
        if got.is_none() {
            got = futures_poll_once(recv.as_mut()).await;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(got.unwrap().unwrap().data, b"manual polling!!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_endpoint_exchange() {
    let (a, b) = pair(Polling::Event);
    let pa = a.prepare().unwrap();
    let pb = b.prepare().unwrap();
    let (ia, ib) = (pa.local_info(), pb.local_info());
    let bytes = ia.to_bytes();
    assert_eq!(remem::EndpointInfo::from_bytes(&bytes).unwrap(), ia);
    let mut bad = bytes;
    bad[7] = 9;
    assert!(matches!(
        remem::EndpointInfo::from_bytes(&bad),
        Err(Error::Handshake(_))
    ));
    let ca = pa.connect(ib).unwrap();
    let cb = pb.connect(ia).unwrap();
    let m = a.alloc_local_mr(layout(5)).unwrap();
    m.write(0, b"hello").unwrap();
    ca.send(&m).await.unwrap();
    assert_eq!(cb.receive().await.unwrap().data, b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_regions_are_zeroed_reused_and_lent_alone() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    // A freed block comes back zeroed from alloc_local_mr.
    let first = b.alloc_local_mr(layout(4096)).unwrap();
    let addr = first.addr();
    first.write(0, &[9; 4096]).unwrap();
    drop(first);
    let again = b.alloc_local_mr(layout(4096)).unwrap();
    assert_eq!(again.addr(), addr, "the block was reused");
    assert_eq!(again.to_vec(), vec![0; 4096]);
    // Neighbouring blocks of one slab: lending one reaches only that one.
    let neighbour = b.alloc_local_mr(layout(4096)).unwrap();
    assert_eq!(neighbour.addr().abs_diff(again.addr()), 4096, "same slab");
    cb.share_local_mr(&again).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    assert_eq!(remote.len(), 4096);
    let src = a.alloc_local_mr(layout(4096)).unwrap();
    src.write(0, &[7; 4096]).unwrap();
    ca.write(&src, &remote).await.unwrap();
    assert_eq!(again.to_vec(), vec![7; 4096]);
    assert_eq!(neighbour.to_vec(), vec![0; 4096]);
    // Large and strongly aligned allocations get registrations of their own.
    let big = b.alloc_local_mr(layout(3 << 20)).unwrap();
    assert_eq!(big.len(), 3 << 20);
    let paged = b
        .alloc_local_mr(Layout::from_size_align(100, 4096).unwrap())
        .unwrap();
    assert_eq!(paged.addr() % 4096, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_go_by_rdma_read() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let ca = std::sync::Arc::new(ca);
    // Several large messages at once (more than the rendezvous window), with immediates,
    // mixed with small ones; they arrive whole and in order.
    let sizes = [
        1 << 20,
        70_000,
        100,
        3 << 20,
        65_536,
        65_537,
        200_000,
        5_000_000,
    ];
    let mut senders = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let src = a.alloc_local_mr(layout(n)).unwrap();
        let data: Vec<u8> = (0..n).map(|k| (k * 31 + i) as u8).collect();
        src.write(0, &data).unwrap();
        // Send in order; completion (the peer has read it) is awaited later.
        let ca = ca.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        senders.push((
            tokio::spawn(async move {
                let r = ca.send_with_imm(&src, i as u32);
                tokio::pin!(r);
                // Post before the next sender starts, so the order is fixed.
                let first =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(r.as_mut().poll(cx))).await;
                let _ = tx.send(());
                match first {
                    std::task::Poll::Ready(x) => x,
                    std::task::Poll::Pending => r.await,
                }
            }),
            data,
        ));
        let _ = rx.await;
    }
    for (i, (_, data)) in senders.iter().enumerate() {
        let m = cb.receive().await.unwrap();
        assert_eq!(m.imm, Some(i as u32));
        assert!(
            m.data == *data,
            "message {i} of {} bytes differs",
            data.len()
        );
    }
    for (task, _) in senders {
        task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_taken_while_others_are_announced_do_not_deadlock() {
    // Taking a large message gives its bytes back to the budget (a lock of the budget) while
    // the dispatcher, announcing the next ones, queues their places (a lock of the inbox):
    // `receive` once did the first inside the inbox's lock, and the dispatcher the second
    // inside the budget's, a deadlock the workspace's tests met once in CI. Four senders keep
    // announcements coming (the rendezvous window) while the receiver takes them, thousands
    // of times, each message checked; a deadlock fails the test at its deadline.
    const SENDERS: usize = 4;
    const EACH: usize = 300;
    const LEN: usize = 70_000;
    let (a, b) = common::pair_with(
        |a| a.polling(Polling::Event),
        |b| b.polling(Polling::Event).max_large_message(3 * LEN),
    );
    let (ca, cb) = connect(&a, &b).await;
    let ca = std::sync::Arc::new(ca);
    let a = std::sync::Arc::new(a);
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let (a, ca) = (a.clone(), ca.clone());
        senders.push(tokio::spawn(async move {
            let src = a.alloc_local_mr(layout(LEN)).unwrap();
            for k in 0..EACH {
                src.write(0, &[(s * EACH + k) as u8; LEN]).unwrap();
                ca.send_with_imm(&src, (s * EACH + k) as u32).await.unwrap();
            }
        }));
    }
    // A deadlock blocks the runtime's worker threads, and with them its timers: a thread of
    // its own watches the deadline, and ends the test binary if it passes.
    let (done, watched) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watched.recv_timeout(std::time::Duration::from_secs(120))
            == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        {
            eprintln!(
                "large_messages_taken_while_others_are_announced: no progress in 120 s (a deadlock)"
            );
            std::process::exit(101);
        }
    });
    for _ in 0..SENDERS * EACH {
        let m = cb.receive().await.unwrap();
        let tag = m.imm.unwrap() as usize;
        assert!(m.data.len() == LEN && m.data.iter().all(|&x| x == tag as u8));
    }
    for s in senders {
        s.await.unwrap();
    }
    done.send(()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_above_the_receivers_limit_is_refused_before_it_is_sent() {
    let (a, b) = common::soft_pair_with(|a| a, |b| b.max_large_message(100_000));
    let (ca, cb) = connect(&a, &b).await;
    // The receiver said its limit in the handshake: the sender refuses at once, and the
    // connection goes on.
    let src = a.alloc_local_mr(layout(200_000)).unwrap();
    assert!(matches!(
        ca.send(&src).await,
        Err(Error::MessageTooLarge {
            len: 200_000,
            max: 100_000
        })
    ));
    let fits = a.alloc_local_mr(layout(100_000)).unwrap();
    fits.write(0, &[3; 100_000]).unwrap();
    ca.send(&fits).await.unwrap();
    assert_eq!(cb.receive().await.unwrap().data, vec![3; 100_000]);
    assert!(ca.closed().is_none() && cb.closed().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_beyond_the_receivers_budget_wait_for_the_application() {
    // B holds at most 300 kB of large messages at a time.
    let (a, b) = common::soft_pair_with(|a| a, |b| b.max_large_message(300_000));
    let (ca, cb) = connect(&a, &b).await;
    let ca = std::sync::Arc::new(ca);
    // Ten messages of 200 kB sent at once: B reads one, the rest wait for room, and no
    // more than the protocol's four are announced at a time.
    let mut sends = Vec::new();
    for i in 0..10u8 {
        let ca = ca.clone();
        let src = a.alloc_local_mr(layout(200_000)).unwrap();
        src.write(0, &[i; 200_000]).unwrap();
        sends.push(tokio::spawn(async move {
            ca.send_with_imm(&src, u32::from(i)).await
        }));
    }
    let mut got = Vec::new();
    for _ in 0..10 {
        let m = cb.receive().await.unwrap();
        let i = m.imm.unwrap() as u8;
        assert_eq!(m.data, vec![i; 200_000]);
        got.push(i);
    }
    for s in sends {
        s.await.unwrap().unwrap();
    }
    got.sort();
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert!(ca.closed().is_none() && cb.closed().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_events_arrive_as_a_stream() {
    use remem::verbs::{
        AsyncEventElement, AsyncEventType, QpAttr, QpAttrMask as M, QpState, RecvWr,
    };
    let (a, _b) = pair(Polling::Event);
    let mut events = a.subscribe_events().unwrap();
    // Overrun a one-entry CQ (two flushed receives) to make the device raise CQ_ERR.
    let cq = a.context().create_cq(1, None).unwrap();
    let qp = common::raw_rc_qp(&**a.pd(), &cq, 1, 4);
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(&attr, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let wrs = [1, 2].map(|wr_id| RecvWr {
        wr_id,
        sg_list: &[],
    });
    qp.post_recv(&wrs).unwrap();
    attr.qp_state = QpState::Err;
    qp.modify(&attr, M::STATE).unwrap();
    let ev = tokio::time::timeout(std::time::Duration::from_secs(10), events.recv())
        .await
        .expect("no event within 10 s")
        .unwrap();
    assert_eq!(ev.event_type, AsyncEventType::CqErr);
    assert_eq!(ev.element, AsyncEventElement::Cq(cq.id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_connection_tells_the_peer() {
    for _ in 0..5 {
        let (a, b) = pair(Polling::Event);
        let (ca, cb) = connect(&a, &b).await;
        drop(ca);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), cb.receive()).await;
        assert!(matches!(r, Ok(Err(Error::Closed(_)))), "{r:?}");
    }
}

/// A write through a dead token fails with REM_ACCESS_ERR.
fn assert_rem_access(result: Result<(), Error>) {
    match result {
        Err(Error::Completion { status, .. }) => {
            assert_eq!(status, remem::verbs::WcStatus::RemAccessErr)
        }
        other => panic!("a write through a dead token: {other:?}"),
    }
}

/// Writes through `token` until a write fails (access ends when a message or a timer on
/// the peer says so), for at most 5 s; the failure must be REM_ACCESS_ERR.
async fn write_until_revoked(conn: &Connection, src: &remem::LocalMr, token: &remem::RemoteMr) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let revoked = loop {
        match conn.write(src, token).await {
            Ok(()) if std::time::Instant::now() < deadline => tokio::task::yield_now().await,
            other => break other,
        }
    };
    assert_rem_access(revoked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_grant_expire_return_and_give_back() {
    use std::time::Duration;
    let (a, b) = common::soft_pair_with(
        |a| a,
        |b| b.lend_limit(1 << 20).max_lease(Duration::from_millis(300)),
    );
    let (ca, cb) = connect(&a, &b).await;
    let src = a.alloc_local_mr(layout(4096)).unwrap();
    src.write(0, &[3; 4096]).unwrap();

    // Granted: usable at once; the lender shortened the lease to its maximum.
    let lease = ca
        .request_remote_mr(layout(4096), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(lease.remaining().unwrap() <= Duration::from_millis(300));
    ca.write(&src, lease.mr()).await.unwrap();
    // Given back with its contents: the lender has the bytes, the borrower's token is dead.
    let token = *lease.mr();
    ca.send_remote_mr(lease).await.unwrap();
    let back = cb.receive_local_mr().await.unwrap();
    assert_eq!(back.to_vec(), vec![3; 4096]);
    assert_rem_access(ca.write(&src, &token).await);

    // Expiry on the lender's clock revokes access (a fresh connection: the last one is in
    // error after the access violation).
    let (ca, _cb) = connect(&a, &b).await;
    let lease = ca
        .request_remote_mr(layout(4096), Duration::from_millis(50))
        .await
        .unwrap();
    ca.write(&src, lease.mr()).await.unwrap();
    // Wait out the lease on this side's clock without sleeping blind.
    write_until_revoked(&ca, &src, lease.mr()).await;

    // Refused beyond the lend limit; returned leases free the budget.
    let (ca, _cb) = connect(&a, &b).await;
    let big = ca
        .request_remote_mr(layout(2 << 20), Duration::from_secs(1))
        .await;
    assert!(matches!(big, Err(Error::Refused(r)) if r.contains("limit")));
    let l1 = ca
        .request_remote_mr(layout(800_000), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        ca.request_remote_mr(layout(800_000), Duration::from_secs(1))
            .await
            .is_err()
    );
    ca.return_remote_mr(l1).await.unwrap();
    // The return travels as a message; the next request follows it in order.
    ca.request_remote_mr(layout(800_000), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_local_mr_passes_ownership() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let src = b.alloc_local_mr(layout(4096)).unwrap();
    src.write(0, &[9; 4096]).unwrap();

    // A gives a region away (it is moved: A cannot touch it any more); B holds it without
    // a time limit, reads and writes it, and gives it back with its contents.
    let given = a.alloc_local_mr(layout(4096)).unwrap();
    given.write(0, &[7; 4096]).unwrap();
    ca.send_local_mr(given).await.unwrap();
    let lease = cb.receive_remote_mr().await.unwrap();
    assert_eq!(lease.remaining(), None);
    assert_eq!(lease.mr().len(), 4096);
    let mut seen = b.alloc_local_mr(layout(4096)).unwrap();
    cb.read(&mut seen, lease.mr()).await.unwrap();
    assert_eq!(seen.to_vec(), vec![7; 4096]);
    cb.write(&src, lease.mr()).await.unwrap();
    let token = *lease.mr();
    cb.send_remote_mr(lease).await.unwrap();
    let back = ca.receive_local_mr().await.unwrap();
    assert_eq!(back.to_vec(), vec![9; 4096]);
    // Back with A, registered for local access only: B's token reaches nothing.
    assert_rem_access(cb.write(&src, &token).await);

    // Dropping a region received ends it: A frees it, and the token goes dead.
    let (ca, cb) = connect(&a, &b).await;
    ca.send_local_mr(a.alloc_local_mr(layout(4096)).unwrap())
        .await
        .unwrap();
    let lease = cb.receive_remote_mr().await.unwrap();
    let token = *lease.mr();
    cb.write(&src, &token).await.unwrap();
    drop(lease);
    // The return travels as a message sent by a task.
    write_until_revoked(&cb, &src, &token).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_post_many_and_complete_once() {
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(64 * 1024)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let srcs: Vec<_> = (0..64u8)
        .map(|i| {
            let m = a.alloc_local_mr(layout(1024)).unwrap();
            m.write(0, &[i; 1024]).unwrap();
            m
        })
        .collect();
    let mut batch = ca.batch();
    for (i, src) in srcs.iter().enumerate() {
        let at = i * 1024;
        batch
            .write(src, &remote.get(at..at + 1024).unwrap())
            .unwrap();
    }
    assert_eq!(batch.len(), 64);
    batch.submit().await.unwrap();
    let written = target.to_vec();
    for i in 0..64 {
        assert!(
            written[i * 1024..(i + 1) * 1024]
                .iter()
                .all(|&x| x == i as u8)
        );
    }
    // A read in a batch, through an exclusive view.
    let mut back = a.alloc_local_mr(layout(64 * 1024)).unwrap();
    {
        let mut batch = ca.batch();
        let mut whole = back.get_mut(..).unwrap();
        batch.read(&mut whole, &remote).unwrap();
        batch.submit().await.unwrap();
    }
    assert_eq!(back.to_vec(), written);
    // A failing operation fails the batch.
    let ro = b
        .alloc_local_mr_with(
            layout(1024),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    cb.share_local_mr(&ro).await.unwrap();
    let ro_remote = ca.receive_shared_mr().await.unwrap();
    let mut batch = ca.batch();
    batch
        .write(&srcs[0], &remote.get(0..1024).unwrap())
        .unwrap();
    batch.write(&srcs[1], &ro_remote).unwrap();
    batch
        .write(&srcs[2], &remote.get(1024..2048).unwrap())
        .unwrap();
    assert!(matches!(
        batch.submit().await,
        Err(Error::Completion {
            status: remem::verbs::WcStatus::RemAccessErr,
            ..
        })
    ));
    // Checked as they are added.
    let mut batch = ca.batch();
    assert!(matches!(
        batch.write(&srcs[0], &remote),
        Err(Error::LengthMismatch { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_memory_and_memory_maps_register() {
    use remem::MemoryBuffer;
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // A memory map on the lender (anonymous: mapping a file is unsafe in memmap2, for
    // reasons of its own), a Vec and a BytesMut on the borrower.
    let map = memmap2::MmapMut::map_anon(4096).unwrap();
    let mapped = b.register(MemoryBuffer::from_mmap(map), rights).unwrap();
    cb.share_local_mr(&mapped).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let from_vec = a
        .register(
            MemoryBuffer::from_vec(b"from a vector".to_vec()),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    ca.write(&from_vec, &remote.get(0..13).unwrap())
        .await
        .unwrap();
    let mut bytes = bytes::BytesMut::zeroed(13);
    bytes[0] = 1;
    let mut into = a
        .register(
            MemoryBuffer::from_bytes_mut(bytes),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    ca.read(&mut into, &remote.get(0..13).unwrap())
        .await
        .unwrap();
    assert_eq!(into.to_vec(), b"from a vector");
    assert_eq!(&mapped.to_vec()[..13], b"from a vector");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scatter_gather_and_chosen_psns() {
    // PSNs just below the 24-bit wrap: a multi-packet transfer crosses it.
    let (a, b) = common::soft_pair_with(|a| a.sq_psn(0xff_fffe), |b| b.sq_psn(0xff_fff0));
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(30_000)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let parts: Vec<_> = [(10_000usize, 1u8), (5_000, 2), (15_000, 3)]
        .iter()
        .map(|&(n, v)| {
            let m = a.alloc_local_mr(layout(n)).unwrap();
            m.write(0, &vec![v; n]).unwrap();
            m
        })
        .collect();
    let srcs: Vec<&dyn remem::Local> = parts.iter().map(|p| p as &dyn remem::Local).collect();
    ca.write_gather(&srcs, &remote).await.unwrap();
    let mut want = vec![1u8; 10_000];
    want.extend(vec![2u8; 5_000]);
    want.extend(vec![3u8; 15_000]);
    assert!(target.to_vec() == want, "gathered write");
    let mut x = a.alloc_local_mr(layout(12_000)).unwrap();
    let mut y = a.alloc_local_mr(layout(18_000)).unwrap();
    ca.read_scatter(&mut [&mut x, &mut y], &remote)
        .await
        .unwrap();
    assert!(
        x.to_vec() == want[..12_000] && y.to_vec() == want[12_000..],
        "scattered read"
    );
    // Lengths must add up; the list must fit the QP's max_send_sge (8 by default).
    assert!(matches!(
        ca.write_gather(&srcs[..2], &remote).await,
        Err(Error::LengthMismatch { .. })
    ));
    let many: Vec<&dyn remem::Local> = (0..9).map(|_| srcs[0]).collect();
    assert!(matches!(
        ca.write_gather(&many, &remote.get(0..90_000).unwrap_or(remote))
            .await,
        Err(Error::InvalidArgument(_))
    ));
    // Messages both ways still flow across the wrap.
    ca.send(&parts[0]).await.unwrap();
    assert_eq!(cb.receive().await.unwrap().data.len(), 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_notices_a_vanished_peer() {
    use std::time::Duration;
    let (a, b) = common::soft_pair_with(
        |a| {
            a.keepalive(Some(Duration::from_millis(50)))
                .timeout(8) // about 1 ms
                .retry_cnt(2)
        },
        |b| b,
    );
    // A connects to an endpoint on B's device whose QP does not exist: nothing it sends
    // is ever acknowledged, and nothing arrives.
    let pb = b.prepare().unwrap();
    let mut ghost = pb.local_info();
    ghost.qpn = (ghost.qpn + 1000) & 0x00ff_ffff;
    let ca = a.prepare().unwrap().connect(ghost).unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(10), ca.receive()).await;
    assert!(
        matches!(
            waited,
            Ok(Err(Error::Closed(remem::CloseReason::Completion {
                status: remem::verbs::WcStatus::RetryExcErr,
                ..
            })))
        ),
        "{waited:?}"
    );
    // Said in words, the verbs status as the detail.
    let said = waited.unwrap().unwrap_err().to_string();
    assert!(
        said.starts_with("connection closed: the peer stopped answering: ")
            && said.ends_with("(transport retry counter exceeded)"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_without_a_progress_thread_is_driven_by_its_user() {
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
    let b_ctx = open(common::peer_addr());
    assert!(a_ctx.caller_driven());
    // Nothing would move its packets while the dispatcher sleeps on events.
    let refused = RdmaBuilder::new().context(a_ctx.clone()).build();
    assert!(matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("driven")));
    // The busy-polling thread drives one side; the other polls (and drives) by hand.
    let a = RdmaBuilder::new()
        .context(a_ctx)
        .polling(Polling::Busy)
        .build()
        .unwrap();
    let b = RdmaBuilder::new()
        .context(b_ctx)
        .polling(Polling::Manual)
        .keepalive(None)
        .build()
        .unwrap();
    let pa = a.prepare().unwrap();
    let pb = b.prepare().unwrap();
    let (ia, ib) = (pa.local_info(), pb.local_info());
    let ca = pa.connect(ib).unwrap();
    let cb = pb.connect(ia).unwrap();
    let target = b.alloc_local_mr(layout(4096)).unwrap();
    let src = a.alloc_local_mr(layout(4096)).unwrap();
    src.write(0, &[0x5a; 4096]).unwrap();
    // B's side moves only while B polls: share, then let A write while B polls (bounded:
    // a device nobody drives would never finish).
    let run = async {
        let share = cb.share_local_mr(&target);
        tokio::pin!(share);
        loop {
            tokio::select! {
                r = &mut share => { r.unwrap(); break; }
                _ = tokio::task::yield_now() => { cb.poll_completions(); }
            }
        }
        let remote = ca.receive_shared_mr().await.unwrap();
        let write = ca.write(&src, &remote);
        tokio::pin!(write);
        loop {
            tokio::select! {
                r = &mut write => { r.unwrap(); break; }
                _ = tokio::task::yield_now() => { cb.poll_completions(); }
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), run)
        .await
        .expect("the driven device made no progress");
    assert_eq!(target.to_vec(), vec![0x5a; 4096]);
}

/// Two connections on devices their user drives, all served by one task that polls every
/// connection between polls of the work (as `remem perf --api -q 2` does): the two make
/// progress together — neither waits for the other to finish — and every write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_manual_driver_moves_two_connections_together() {
    use remem_soft::{SoftContext, SoftOptions};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    const SIZE: usize = 16 << 10;
    const PER_BATCH: usize = 8;
    const BATCHES: u64 = 32;
    let inline = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let build = |addr| {
        let ctx: Arc<dyn remem::verbs::Context> =
            Arc::new(SoftContext::bind_with(addr, &inline).unwrap());
        RdmaBuilder::new()
            .context(ctx)
            .polling(Polling::Manual)
            .keepalive(None)
            .build()
            .unwrap()
    };
    let a = build(common::first_addr());
    let b = build(common::peer_addr());
    let mut conns = Vec::new();
    for _ in 0..2 {
        let (pa, pb) = (a.prepare().unwrap(), b.prepare().unwrap());
        let (ia, ib) = (pa.local_info(), pb.local_info());
        conns.push((pa.connect(ib).unwrap(), pb.connect(ia).unwrap()));
    }
    let all: Vec<&Connection> = conns.iter().flat_map(|(x, y)| [x, y]).collect();
    let targets: Vec<_> = (0..2)
        .map(|_| b.alloc_local_mr(layout(SIZE)).unwrap())
        .collect();
    let src_mr = a.alloc_local_mr(layout(SIZE)).unwrap();
    src_mr.write(0, &[0x77; SIZE]).unwrap();
    let src = src_mr.get(0..SIZE).unwrap();
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    // What the other connection had completed when one completed all its batches.
    let other_at_finish = [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)];
    let work = async {
        for ((_, cb), t) in conns.iter().zip(&targets) {
            cb.share_local_mr(t).await.unwrap();
        }
        let mut remotes = Vec::new();
        for (ca, _) in &conns {
            remotes.push(ca.receive_shared_mr().await.unwrap());
        }
        let lane = |i: usize| {
            let (ca, dst) = (&conns[i].0, remotes[i].get(0..SIZE).unwrap());
            let (src, done, other_at_finish) = (&src, &done, &other_at_finish);
            async move {
                for _ in 0..BATCHES / 2 {
                    let mut batch = ca.batch();
                    for _ in 0..PER_BATCH {
                        batch.write(src, &dst).unwrap();
                    }
                    batch.submit().await.unwrap();
                    if done[i].fetch_add(1, Ordering::AcqRel) + 1 == BATCHES {
                        let other = done[1 - i].load(Ordering::Acquire);
                        other_at_finish[i].store(other, Ordering::Release);
                    }
                }
            }
        };
        tokio::join!(lane(0), lane(0), lane(1), lane(1));
    };
    // One task drives everything: each round polls every connection (which drives their
    // devices), then the work.
    let driven = async {
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            for c in &all {
                c.poll_completions();
            }
            match work.as_mut().poll(cx) {
                std::task::Poll::Ready(()) => std::task::Poll::Ready(()),
                std::task::Poll::Pending => {
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
            }
        })
        .await
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), driven)
        .await
        .expect("two connections under one manual driver made no progress");
    for i in 0..2 {
        assert_eq!(done[i].load(Ordering::Acquire), BATCHES);
        assert_eq!(targets[i].to_vec(), vec![0x77; SIZE]);
    }
    // Whichever finished first (it saw the other short of its batches; the second saw
    // all of them), the other had made progress by then.
    let seen = other_at_finish.map(|o| o.into_inner());
    let first = usize::from(seen[1] < seen[0]);
    assert!(
        seen[first] > 0,
        "connection {first} finished its {BATCHES} batches before the other completed one"
    );
}

/// `write_with_imm` takes a credit: with the peer's default `recv_depth` (32) of
/// immediates not taken, the next writer waits — its write is not even posted (a plain
/// WRITE issued after it, which RC would place after it, lands while its bytes do not) —
/// until the peer takes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_with_imm_waits_once_the_peer_holds_32_immediates() {
    use std::task::Poll;
    const DEPTH: usize = 32; // RdmaBuilder::recv_depth's default
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(8 * (DEPTH + 2))).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let src = a.alloc_local_mr(layout(8)).unwrap();
    src.write(0, &[0xee; 8]).unwrap();
    let slot = |i: usize| remote.get(8 * i..8 * (i + 1)).unwrap();
    for i in 0..DEPTH {
        ca.write_with_imm(&src, &slot(i), i as u32).await.unwrap();
    }
    // The 33rd: pending at its first poll, and not posted.
    let last = slot(DEPTH);
    let next = ca.write_with_imm(&src, &last, DEPTH as u32);
    tokio::pin!(next);
    let first = std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await;
    assert!(first.is_pending(), "the 33rd write did not wait: {first:?}");
    ca.write(&src, &slot(DEPTH + 1)).await.unwrap();
    let bytes = target.to_vec();
    assert_eq!(
        bytes[8 * (DEPTH + 1)..],
        [0xee; 8],
        "the later write landed"
    );
    assert_eq!(
        bytes[8 * DEPTH..8 * (DEPTH + 1)],
        [0; 8],
        "the waiting write was posted"
    );
    // The peer takes one immediate: its credit goes back and the writer goes on.
    assert_eq!(cb.receive_write_imm().await.unwrap(), 0);
    next.await.unwrap();
    assert_eq!(target.to_vec()[8 * DEPTH..8 * (DEPTH + 1)], [0xee; 8]);
    for i in 1..=DEPTH {
        assert_eq!(cb.receive_write_imm().await.unwrap(), i as u32);
    }
}

/// `receive` and `receive_write_imm` inside `select!`, their futures dropped over and
/// over (each loses to the other or to a yield): no message and no immediate is lost or
/// reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_and_receive_write_imm_are_cancel_safe_in_select() {
    const N: u32 = 300;
    let (a, b) = pair(Polling::Event);
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(8)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let sender = tokio::spawn(async move {
        let src = a.alloc_local_mr(layout(8)).unwrap();
        for i in 0..N {
            src.write(0, &u64::from(i).to_le_bytes()).unwrap();
            ca.send(&src).await.unwrap();
            ca.write_with_imm(&src, &remote, i).await.unwrap();
        }
        (a, ca)
    });
    let (mut msgs, mut imms, mut dropped) = (Vec::new(), Vec::new(), 0u64);
    while msgs.len() < N as usize || imms.len() < N as usize {
        tokio::select! {
            biased;
            m = cb.receive(), if msgs.len() < N as usize => msgs.push(m.unwrap()),
            i = cb.receive_write_imm(), if imms.len() < N as usize => imms.push(i.unwrap()),
            _ = tokio::task::yield_now() => dropped += 1,
        }
    }
    let (_a, _ca) = sender.await.unwrap();
    let want: Vec<Vec<u8>> = (0..u64::from(N))
        .map(|i| i.to_le_bytes().to_vec())
        .collect();
    let got: Vec<Vec<u8>> = msgs.into_iter().map(|m| m.data).collect();
    assert_eq!(got, want);
    assert_eq!(imms, (0..N).collect::<Vec<_>>());
    assert!(
        dropped > 0,
        "no future was dropped: the test tested nothing"
    );
}
