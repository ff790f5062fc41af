//! Tests of connections as a whole (between soft devices on loopback), for what the
//! integration tests do not cover: UDP ports learned in the handshake.

use super::lock;
use crate::test_util::{connect, fresh_addr, fresh_device, layout};
use crate::{Error, HandshakeError, Rdma, RdmaBuilder};
use remem_verbs::{
    AsyncEvent, CompletionChannel, CompletionQueue, Context, Counter, DeviceAttr, DeviceInfo,
    GidEntry, PortAttr, ProtectionDomain,
};
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

fn port_of(rdma: &Rdma) -> u16 {
    rdma.context().info().udp_addr.unwrap().port()
}

/// A soft device that, like an RDMA NIC or kernel rxe, sends RoCEv2 only to UDP port
/// 4791: everything is the soft device's but `can_send_to_udp_port` and
/// `set_peer_udp_port`, which keep the trait's defaults.
struct Only4791(Arc<dyn Context>);

impl Context for Only4791 {
    fn info(&self) -> &DeviceInfo {
        self.0.info()
    }
    fn query_device(&self) -> remem_verbs::Result<DeviceAttr> {
        self.0.query_device()
    }
    fn query_port(&self, port_num: u8) -> remem_verbs::Result<PortAttr> {
        self.0.query_port(port_num)
    }
    fn query_gid(&self, port_num: u8, index: u32) -> remem_verbs::Result<GidEntry> {
        self.0.query_gid(port_num, index)
    }
    fn alloc_pd(&self) -> remem_verbs::Result<Arc<dyn ProtectionDomain>> {
        self.0.alloc_pd()
    }
    fn create_comp_channel(&self) -> remem_verbs::Result<Arc<dyn CompletionChannel>> {
        self.0.create_comp_channel()
    }
    fn create_cq(
        &self,
        cqe: u32,
        channel: Option<Arc<dyn CompletionChannel>>,
    ) -> remem_verbs::Result<Arc<dyn CompletionQueue>> {
        self.0.create_cq(cqe, channel)
    }
    fn async_fd(&self) -> BorrowedFd<'_> {
        self.0.async_fd()
    }
    fn get_async_event(&self) -> Option<AsyncEvent> {
        self.0.get_async_event()
    }
    fn counters(&self) -> Vec<Counter> {
        self.0.counters()
    }
}

fn only_4791(ip: &str) -> Rdma {
    let soft = crate::open_device(Some(&format!("soft@{ip}:0"))).unwrap();
    RdmaBuilder::new()
        .context(Arc::new(Only4791(soft)))
        .handshake_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Two soft devices on random UDP ports, named without a port: the handshake tells each
/// device the other's port, and they connect and do RDMA. (Before: `PortMismatch`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_devices_on_different_ports_connect_without_naming_ports() {
    let a = RdmaBuilder::new().device(fresh_device()).build().unwrap();
    let b = RdmaBuilder::new().device(fresh_device()).build().unwrap();
    assert_ne!(port_of(&a), port_of(&b));
    let (ca, cb) = tokio::time::timeout(Duration::from_secs(10), connect(&a, &b))
        .await
        .unwrap();
    let lent = b.alloc_local_mr(layout(64)).unwrap();
    cb.share_local_mr(&lent).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let src = a.alloc_local_mr(layout(5)).unwrap();
    src.write(0, b"ports").unwrap();
    ca.write(&src, &remote.get(0..5).unwrap()).await.unwrap();
    assert_eq!(&lent.to_vec()[..5], b"ports");
    let mut back = a.alloc_local_mr(layout(5)).unwrap();
    ca.read(&mut back, &remote.get(0..5).unwrap())
        .await
        .unwrap();
    assert_eq!(back.to_vec(), b"ports");
    cb.send(&lent).await.unwrap();
    assert_eq!(ca.receive().await.unwrap().data.len(), 64);
}

/// A device that sends only to 4791 (as a NIC does) connecting to a soft device on
/// another port: a clear `PortMismatch` at connect time, on whichever side it is. (Before:
/// the first message went unacknowledged, `Unreachable` after the retries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_sends_only_to_4791_fails_with_port_mismatch() {
    let nic = only_4791(&fresh_addr().ip().to_string());
    let soft = RdmaBuilder::new()
        .device(fresh_device())
        .handshake_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (nic_port, soft_port) = (port_of(&nic), port_of(&soft));
    // The NIC connects: its own device refuses the soft device's port.
    let listener = soft.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        let _ = listener.accept().await;
    });
    match nic.connect(addr).await {
        Err(Error::Handshake(HandshakeError::PortMismatch { local, peer })) => {
            assert_eq!((local, peer), (nic_port, soft_port));
        }
        other => panic!("want a port mismatch, got {other:?}"),
    }
    serve.abort();
    // The NIC listens: it cannot answer the soft device's port, and says so.
    let listener = Arc::new(nic.listen("127.0.0.1:0").await.unwrap());
    let addr = listener.local_addr().unwrap();
    let accepting = listener.clone();
    let serve = tokio::spawn(async move {
        let _ = accepting.accept().await;
    });
    let r = soft.connect(addr).await;
    let failure = tokio::time::timeout(Duration::from_secs(5), listener.next_failure())
        .await
        .unwrap();
    serve.abort();
    match (r, failure.error) {
        (
            Err(Error::Handshake(HandshakeError::PortMismatch { local, peer })),
            Error::Handshake(HandshakeError::PortMismatch { .. }),
        ) => assert_eq!((local, peer), (soft_port, nic_port)),
        other => panic!("want a port mismatch on both sides, got {other:?}"),
    }
}

/// A request to stop for a while, and who to tell once stopped.
type Pause = Arc<std::sync::Mutex<Option<(Duration, std::sync::mpsc::Sender<()>)>>>;

/// A peer whose device moves packets only when driven (an inline soft device: its NIC is
/// the process, as a soft device's is), driven by a thread that can be stopped for a
/// while — a stopped (debugged, descheduled) process, deterministically.
struct StoppablePeer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    pause: Pause,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StoppablePeer {
    /// An `Rdma` on an inline soft device at `ip`, polled by hand.
    fn rdma(ip: &str) -> Rdma {
        let opts = remem_soft::SoftOptions {
            inline: true,
            ..Default::default()
        };
        let ctx =
            remem_soft::SoftContext::bind_with(format!("{ip}:0").parse().unwrap(), &opts).unwrap();
        RdmaBuilder::new()
            .context(Arc::new(ctx))
            .polling(crate::Polling::Manual)
            .keepalive(None)
            .build()
            .unwrap()
    }

    /// Drives `conn`'s device and completions on a thread of its own.
    fn drive(rdma: &Rdma, conn: Arc<crate::Connection>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pause: Pause = Arc::default();
        let ctx = rdma.context().clone();
        let (s, p) = (stop.clone(), pause.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Acquire) {
                let stopped = p.lock().unwrap().take();
                if let Some((how_long, told)) = stopped {
                    let _ = told.send(());
                    // The process is stopped: its NIC does nothing meanwhile.
                    std::thread::sleep(how_long);
                }
                let _ = ctx.drive(Duration::from_millis(1));
                conn.poll_completions();
            }
        });
        StoppablePeer {
            stop,
            pause,
            thread: Some(thread),
        }
    }

    /// Stops the peer for `how_long`; returns once it has stopped.
    fn stop_for(&self, how_long: Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        *self.pause.lock().unwrap() = Some((how_long, tx));
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the peer's driver stopped");
    }
}

impl Drop for StoppablePeer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `a` (a normal soft device, `opts`) connected to a stoppable peer, with a region of the
/// peer's shared.
async fn stoppable_pair(
    opts: crate::ConnectOptions,
) -> (
    Rdma,
    crate::Connection,
    StoppablePeer,
    crate::RemoteMr,
    crate::LocalMr,
) {
    let a = RdmaBuilder::new().device(fresh_device()).build().unwrap();
    let b = StoppablePeer::rdma(&fresh_addr().ip().to_string());
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ca, cb) = tokio::join!(a.connect_with(addr, &opts), listener.accept());
    let (ca, cb) = (ca.unwrap(), Arc::new(cb.unwrap()));
    let lent = b.alloc_local_mr(layout(64)).unwrap();
    let peer = StoppablePeer::drive(&b, cb.clone());
    cb.share_local_mr(&lent).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    (a, ca, peer, remote, lent)
}

/// The default retry budget (2.1 s) outlasts a peer stopped for 1.2 s: the write waits
/// for it and completes. (Before: 8 × 67 ms, and the write failed with RETRY_EXC_ERR.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_retries_survive_a_peer_stopped_for_a_second() {
    let (a, ca, peer, remote, _lent) = stoppable_pair(Default::default()).await;
    let src = a.alloc_local_mr(layout(8)).unwrap();
    peer.stop_for(Duration::from_millis(1200));
    let t0 = std::time::Instant::now();
    ca.write(&src, &remote.get(0..8).unwrap()).await.unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(1000),
        "the peer was not stopped"
    );
    assert_eq!(
        ca.fetch_and_add(&remote.get(8..16).unwrap(), 1)
            .await
            .unwrap(),
        0
    );
    assert!(ca.closed().is_none());
}

/// A retry budget set per connection (`ConnectOptions`) applies: 2 × 1 ms does not
/// survive the same pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_options_set_the_retry_budget() {
    let opts = crate::ConnectOptions {
        timeout: Some(8),
        retry_cnt: Some(1),
        ..Default::default()
    };
    let (a, ca, peer, remote, _lent) = stoppable_pair(opts).await;
    let src = a.alloc_local_mr(layout(8)).unwrap();
    peer.stop_for(Duration::from_millis(1200));
    match ca.write(&src, &remote.get(0..8).unwrap()).await {
        Err(Error::Completion { status, .. }) => {
            assert_eq!(status, remem_verbs::WcStatus::RetryExcErr)
        }
        other => panic!("want RETRY_EXC_ERR, got {other:?}"),
    }
}

/// A short operation timeout fires while the peer is stopped: the operation fails with
/// `Error::Timeout` at once, and the connection is closed (typed reason).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_operation_timeout_fires_and_closes_the_connection() {
    let opts = crate::ConnectOptions {
        op_timeout: Some(Duration::from_millis(100)),
        ..Default::default()
    };
    let (a, ca, peer, remote, _lent) = stoppable_pair(opts).await;
    assert_eq!(ca.op_timeout(), Some(Duration::from_millis(100)));
    let src = a.alloc_local_mr(layout(8)).unwrap();
    peer.stop_for(Duration::from_millis(1200));
    let t0 = std::time::Instant::now();
    let r = ca.write(&src, &remote.get(0..8).unwrap()).await;
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        ca.closed(),
        Some(crate::CloseReason::Failed(crate::LocalFailure::Timeout))
    );
    let mut dst = a.alloc_local_mr(layout(8)).unwrap();
    let again = ca.read(&mut dst, &remote.get(0..8).unwrap()).await;
    assert!(matches!(again, Err(Error::Closed(_))), "{again:?}");
}

/// `receive_buf` hands over the receive buffer the message landed in (no copy), and the
/// buffer — with the message's credit — goes back only when it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_buf_hands_over_the_receive_buffer_until_dropped() {
    let a = RdmaBuilder::new().device(fresh_device()).build().unwrap();
    let b = RdmaBuilder::new()
        .device(fresh_device())
        .recv_depth(2)
        .build()
        .unwrap();
    let (ca, cb) = connect(&a, &b).await;
    ca.send_bytes(b"one").await.unwrap();
    ca.send_bytes_with_imm(b"two", 2).await.unwrap();
    let one = cb.receive_buf().await.unwrap();
    let two = cb.receive_buf().await.unwrap();
    assert_eq!((&one[..], one.imm()), (&b"one"[..], None));
    assert_eq!((&two[..], two.imm()), (&b"two"[..], Some(2)));
    let ring = cb.shared.msg.ring.as_ref().unwrap();
    assert!(ring.contains(one.as_ptr()) && ring.contains(two.as_ptr()));
    // Both of B's buffers are held: A has no credit, and its next message waits.
    assert_eq!(lock(&ca.shared.msg.credits).available(), 0);
    let ca = Arc::new(ca);
    let third = tokio::spawn({
        let ca = ca.clone();
        async move { ca.send_bytes(b"three").await }
    });
    drop(one);
    tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("a dropped buffer returns its credit")
        .unwrap()
        .unwrap();
    assert_eq!(cb.receive().await.unwrap().data, b"three");
    assert_eq!(&two[..], b"two", "a held buffer is not reused");
}

/// `send_bytes` sends from a slice, a `Vec` or `Bytes` (copied inside into a registered
/// buffer), large messages and empty ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_bytes_sends_from_unregistered_memory() {
    let a = RdmaBuilder::new().device(fresh_device()).build().unwrap();
    let b = RdmaBuilder::new()
        .device(fresh_device())
        .max_message(1024)
        .build()
        .unwrap();
    let (ca, cb) = connect(&a, &b).await;
    let large: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let bytes = bytes::Bytes::from(large.clone());
    ca.send_bytes(&bytes).await.unwrap();
    ca.send_bytes(b"").await.unwrap();
    ca.send_bytes_with_imm(&large[..10], 9).await.unwrap();
    let got = cb.receive_buf().await.unwrap();
    assert_eq!(&got[..], &large[..]);
    assert!(cb.receive().await.unwrap().data.is_empty());
    let m = cb.receive().await.unwrap();
    assert_eq!((&m.data[..], m.imm), (&large[..10], Some(9)));
}

/// A credit message that could not be posted (here: its reserved send-queue entries taken
/// by the test) is posted again at the next completion of this side's work — one that
/// carries no credits itself, a write — so the peer's send that waits for those credits
/// goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credit_message_that_could_not_be_posted_is_retried() {
    // A grants B 4 credits, and returns them one at a time (a quarter of 4). No keepalive:
    // its probe would carry the credits too, later.
    let (a, b) = crate::test_util::soft_pair_with(|a| a.recv_depth(4).keepalive(None), |b| b);
    let (ca, cb) = connect(&a, &b).await;
    let target = b.alloc_local_mr(layout(8)).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    // (Its credit goes back now, with nothing else owed.)
    let src = a.alloc_local_mr(layout(8)).unwrap();
    ca.write(&src, &remote).await.unwrap();
    for i in 0..3u8 {
        cb.send_bytes([i]).await.unwrap();
    }
    let held = ca.shared().post.sq.take_control();
    assert_eq!(held.len(), super::posting::CONTROL_RESERVE as usize);
    for i in 0..3u8 {
        assert_eq!(ca.receive().await.unwrap().data, [i]);
    }
    assert!(
        ca.shared()
            .msg
            .credit_retry
            .load(std::sync::atomic::Ordering::Acquire),
        "the credit messages found no entry"
    );
    // B has one credit left (the token's came back); its next message after that waits
    // for the three A owes.
    cb.send_bytes([3]).await.unwrap();
    let cb = Arc::new(cb);
    let waiting = tokio::spawn({
        let cb = cb.clone();
        async move { cb.send_bytes([4]).await }
    });
    drop(held);
    // A's write completes: the credit message goes with it.
    ca.write(&src, &remote).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("B still waits for the credits A owes")
        .unwrap()
        .unwrap();
    assert_eq!(ca.receive().await.unwrap().data, [3]);
    assert_eq!(ca.receive().await.unwrap().data, [4]);
}
