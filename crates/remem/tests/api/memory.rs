//! Memory a peer could reach, through the async API on two soft devices in one process
//! (`common::first_device` and its peer): pool blocks are reused only once every
//! key for them is dead, regions given back are out of the borrower's reach, the agent's
//! requests are bounded per connection, and file-backed regions reserve their blocks.

use remem::{AccessFlags, Connection, Error, LocalMr, Rdma, RdmaBuilder, RemoteMr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::common;

use common::test_util::{connect, layout};

/// Two `Rdma`s that can talk (the second one built from `b`, given its builder and the
/// name of its device, e.g. with agent limits).
fn pair_on(b: impl FnOnce(RdmaBuilder, &str) -> RdmaBuilder) -> (Rdma, Rdma) {
    let a = common::builder(common::first_device()).build().unwrap();
    let name = common::test_device().unwrap_or(common::peer_device());
    let b = b(RdmaBuilder::new().device(&name), &name).build().unwrap();
    (a, b)
}

fn pair_with(b: impl FnOnce(RdmaBuilder) -> RdmaBuilder) -> (Rdma, Rdma) {
    pair_on(|builder, _| b(builder))
}

fn pair() -> (Rdma, Rdma) {
    pair_with(|b| b)
}

/// The access through a dead key failed with REM_ACCESS_ERR.
fn assert_rem_access(what: &str, result: Result<(), Error>) {
    match result {
        Err(Error::Completion { status, .. }) => {
            assert_eq!(status, remem::verbs::WcStatus::RemAccessErr, "{what}")
        }
        other => panic!("{what} through a dead key: {other:?}"),
    }
}

/// A WRITE and (on a fresh connection: the first error ends the connection) a READ from
/// `a` through `token` both fail with a remote access error; `dst` is the READ's target
/// and must stay untouched.
async fn assert_unreachable(a: &Rdma, b: &Rdma, ca: &Connection, token: &RemoteMr) {
    let src = a.alloc_local_mr(layout(token.len())).unwrap();
    src.write(0, &vec![0xee; token.len()]).unwrap();
    assert_rem_access("a write", ca.write(&src, token).await);
    let (ca, _cb) = connect(a, b).await;
    let mut dst = a.alloc_local_mr(layout(token.len())).unwrap();
    dst.write(0, &vec![0x11; token.len()]).unwrap();
    assert_rem_access("a read", ca.read(&mut dst, token).await);
    assert_eq!(dst.to_vec(), vec![0x11; token.len()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_pool_block_is_reused_only_once_its_key_is_dead() {
    let (a, b) = pair();
    let (ca, cb) = connect(&a, &b).await;
    for size in [64, 4096, 1 << 20] {
        // B shares a pool block; A writes into it with the token.
        let shared = b.alloc_local_mr(layout(size)).unwrap();
        let addr = shared.addr();
        cb.share_local_mr(&shared).await.unwrap();
        let token = ca.receive_shared_mr().await.unwrap();
        let src = a.alloc_local_mr(layout(size)).unwrap();
        src.write(0, &vec![1; size]).unwrap();
        ca.write(&src, &token).await.unwrap();
        assert_eq!(shared.to_vec(), vec![1; size]);
        // B drops it: the same block (same size class) is the next one handed out, now
        // holding other data.
        drop(shared);
        let reused = b.alloc_local_mr(layout(size)).unwrap();
        assert_eq!(reused.addr(), addr, "the block was reused");
        reused.write(0, &vec![7; size]).unwrap();
        // A's old token reaches nothing: no write lands, no read sees the new data.
        let (ca2, _cb2) = connect(&a, &b).await;
        assert_unreachable(&a, &b, &ca2, &token).await;
        assert_eq!(reused.to_vec(), vec![7; size], "the new owner's data");
        // The first connection is unaffected.
        let mut back = a.alloc_local_mr(layout(8)).unwrap();
        let own = b.alloc_local_mr(layout(8)).unwrap();
        cb.share_local_mr(&own).await.unwrap();
        ca.read(&mut back, &ca.receive_shared_mr().await.unwrap())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_given_back_is_out_of_the_borrowers_reach() {
    let (a, b) = pair();
    // A lease (B lends to A), given back with its contents.
    let (ca, cb) = connect(&a, &b).await;
    let lease = ca
        .request_remote_mr(layout(4096), Duration::from_secs(60))
        .await
        .unwrap();
    let src = a.alloc_local_mr(layout(4096)).unwrap();
    src.write(0, &[3; 4096]).unwrap();
    ca.write(&src, lease.mr()).await.unwrap();
    let token = *lease.mr();
    ca.send_remote_mr(lease).await.unwrap();
    let back: LocalMr = cb.receive_local_mr().await.unwrap();
    assert_eq!(back.to_vec(), vec![3; 4096]);
    back.write(0, &[5; 4096]).unwrap();
    assert_unreachable(&a, &b, &ca, &token).await;
    assert_eq!(back.to_vec(), vec![5; 4096]);

    // Regions given with send_local_mr (a pool block, and a registration of its own),
    // given back.
    for own_registration in [false, true] {
        let (ca, cb) = connect(&a, &b).await;
        let given = if own_registration {
            b.alloc_local_mr_with(
                layout(4096),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            )
            .unwrap()
        } else {
            b.alloc_local_mr(layout(4096)).unwrap()
        };
        cb.send_local_mr(given).await.unwrap();
        let lease = ca.receive_remote_mr().await.unwrap();
        ca.write(&src, lease.mr()).await.unwrap();
        let token = *lease.mr();
        ca.send_remote_mr(lease).await.unwrap();
        let back = cb.receive_local_mr().await.unwrap();
        assert_eq!(back.to_vec(), vec![3; 4096]);
        back.write(0, &[6; 4096]).unwrap();
        assert_unreachable(&a, &b, &ca, &token).await;
        assert_eq!(back.to_vec(), vec![6; 4096]);
    }
}

/// Asks for `n` zero-byte leases one after another; returns those granted and the first
/// refusal's reason (if any).
async fn lease_zero_bytes(
    conn: &Connection,
    n: usize,
) -> (Vec<remem::RemoteLease>, Option<String>) {
    let mut granted = Vec::new();
    for _ in 0..n {
        match conn
            .request_remote_mr(layout(0), Duration::from_secs(600))
            .await
        {
            Ok(l) => granted.push(l),
            Err(Error::Refused(why)) => return (granted, Some(why)),
            Err(e) => panic!("{e}"),
        }
    }
    (granted, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_byte_leases_count_against_the_lend_limit() {
    // Each lease counts as the pages it pins: at least one, even for zero bytes.
    let (a, b) = pair_with(|b| b.lend_limit(4 * 4096));
    let (ca, _cb) = connect(&a, &b).await;
    let (granted, refused) = lease_zero_bytes(&ca, 8).await;
    assert_eq!(granted.len(), 4);
    assert!(refused.unwrap().contains("limit"));
    // Returned: the budget is free again (the returns travel as messages, which a
    // request sent meanwhile may overtake: then it is refused, and asked again).
    drop(granted);
    let mut tries = 0;
    while let Err(e) = ca
        .request_remote_mr(layout(4 * 4096), Duration::from_secs(1))
        .await
    {
        assert!(matches!(e, Error::Refused(_)), "{e}");
        tries += 1;
        assert!(tries < 1000, "the budget never came back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_use_up_the_devices_registrations() {
    // Default limits: at most 1024 regions lent per connection, whatever their size.
    let (a, b) = pair();
    let (ca, _cb) = connect(&a, &b).await;
    let (granted, refused) = lease_zero_bytes(&ca, 1100).await;
    assert_eq!(granted.len(), 1024);
    assert!(refused.unwrap().contains("regions"));
    // Another client is served meanwhile.
    let (other, _ob) = connect(&a, &b).await;
    let lease = other
        .request_remote_mr(layout(4096), Duration::from_secs(60))
        .await
        .unwrap();
    let src = a.alloc_local_mr(layout(4096)).unwrap();
    other.write(&src, lease.mr()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_that_end_leave_no_timers_behind() {
    let (a, b) = pair();
    let (ca, cb) = connect(&a, &b).await;
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    // Warm up (the agent's sender task, the dispatcher's), then measure.
    let lease = ca
        .request_remote_mr(layout(64), Duration::from_secs(600))
        .await
        .unwrap();
    ca.return_remote_mr(lease).await.unwrap();
    let before = alive();
    for _ in 0..300 {
        let lease = ca
            .request_remote_mr(layout(64), Duration::from_secs(600))
            .await
            .unwrap();
        ca.return_remote_mr(lease).await.unwrap();
    }
    // The last return is a message: once a request behind it is answered, it was handled.
    let last = ca
        .request_remote_mr(layout(64), Duration::from_secs(600))
        .await
        .unwrap();
    let after = alive();
    assert!(
        after < before + 20,
        "{before} tasks before 300 leases that ended, {after} after"
    );
    drop((last, cb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_given_and_never_taken_are_bounded() {
    let (a, b) = pair();
    let (ca, cb) = connect(&a, &b).await;
    // A gives B regions that B never takes: B holds at most 1024, then cuts A off.
    let mut given = 0;
    for _ in 0..1100 {
        if ca
            .send_local_mr(a.alloc_local_mr(layout(64)).unwrap())
            .await
            .is_err()
        {
            break;
        }
        given += 1;
    }
    assert!(given >= 1024, "cut off after {given}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ev = tokio::time::timeout_at(deadline.into(), cb.next_event()).await;
        match ev.expect("B still serves a peer that gave 1100 regions") {
            remem::ConnectionEvent::Established => continue,
            remem::ConnectionEvent::Lost(remem::CloseReason::Protocol(
                remem::ProtocolViolation::UntakenRegions { .. },
            )) => break,
            other => panic!("{other:?}"),
        }
    }
}

/// A soft device that reports a small `max_mr` and, when told to, refuses registrations
/// for remote access as a device whose registrations are used up does.
mod small_device {
    use remem::verbs::{
        AccessFlags, AddressHandle, AhAttr, AsyncEvent, CompletionChannel, CompletionQueue,
        Context, Counter, DeviceAttr, DeviceInfo, Error, Gid, GidEntry, MemRegion, MemoryRegion,
        PortAttr, ProtectionDomain, QpInitAttr, QueuePair, Result, SharedReceiveQueue, SrqAttr,
    };
    use std::os::fd::BorrowedFd;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    pub struct SmallDevice {
        pub ctx: Arc<dyn Context>,
        pub max_mr: u32,
        pub refuse: Arc<AtomicBool>,
        /// The most work requests a queue of a QP may hold (`max_qp_wr`), enforced.
        pub max_qp_wr: Option<u32>,
    }

    struct Pd(Arc<dyn ProtectionDomain>, Arc<AtomicBool>, Option<u32>);

    impl ProtectionDomain for Pd {
        fn reg_mr(&self, region: MemRegion, access: AccessFlags) -> Result<Arc<dyn MemoryRegion>> {
            if access.intersects(AccessFlags::REMOTE) && self.1.load(Ordering::Relaxed) {
                return Err(Error::Exhausted("memory regions (max_mr)"));
            }
            self.0.reg_mr(region, access)
        }
        fn create_qp(&self, init: &QpInitAttr) -> Result<Arc<dyn QueuePair>> {
            if let Some(max) = self.2
                && init.cap.max_send_wr.max(init.cap.max_recv_wr) > max
            {
                return Err(Error::InvalidArgument(format!(
                    "more than {max} work requests"
                )));
            }
            self.0.create_qp(init)
        }
        fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SharedReceiveQueue>> {
            self.0.create_srq(attr)
        }
        fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AddressHandle>> {
            self.0.create_ah(attr)
        }
    }

    impl Context for SmallDevice {
        fn info(&self) -> &DeviceInfo {
            self.ctx.info()
        }
        fn query_device(&self) -> Result<DeviceAttr> {
            let attr = self.ctx.query_device()?;
            Ok(DeviceAttr {
                max_mr: self.max_mr,
                max_qp_wr: self.max_qp_wr.unwrap_or(attr.max_qp_wr),
                ..attr
            })
        }
        fn query_port(&self, port_num: u8) -> Result<PortAttr> {
            self.ctx.query_port(port_num)
        }
        fn query_gid(&self, port_num: u8, index: u32) -> Result<GidEntry> {
            self.ctx.query_gid(port_num, index)
        }
        fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
            Ok(Arc::new(Pd(
                self.ctx.alloc_pd()?,
                self.refuse.clone(),
                self.max_qp_wr,
            )))
        }
        fn create_comp_channel(&self) -> Result<Arc<dyn CompletionChannel>> {
            self.ctx.create_comp_channel()
        }
        fn create_cq(
            &self,
            cqe: u32,
            channel: Option<Arc<dyn CompletionChannel>>,
        ) -> Result<Arc<dyn CompletionQueue>> {
            self.ctx.create_cq(cqe, channel)
        }
        fn async_fd(&self) -> BorrowedFd<'_> {
            self.ctx.async_fd()
        }
        fn get_async_event(&self) -> Option<AsyncEvent> {
            self.ctx.get_async_event()
        }
        fn counters(&self) -> Vec<Counter> {
            self.ctx.counters()
        }
        fn can_send_to_udp_port(&self, port: u16) -> bool {
            self.ctx.can_send_to_udp_port(port)
        }
        fn set_peer_udp_port(&self, gid: Gid, port: u16) -> Result<()> {
            self.ctx.set_peer_udp_port(gid, port)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_devices_limit_bounds_leases_and_its_refusal_is_an_answer() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    // The lender's device has 1024 registrations: one connection may take a sixteenth
    // (64 leases of two registrations each).
    let refuse = Arc::new(AtomicBool::new(false));
    let (a, b) = pair_on(|b, name| {
        let soft = remem::open_device(Some(name)).unwrap();
        b.context(Arc::new(small_device::SmallDevice {
            ctx: soft,
            max_mr: 1024,
            refuse: refuse.clone(),
            max_qp_wr: None,
        }))
    });
    let (ca, _cb) = connect(&a, &b).await;
    let (mut granted, refused) = lease_zero_bytes(&ca, 70).await;
    assert_eq!(granted.len(), 64);
    assert!(refused.unwrap().contains("regions"));
    // The device refuses the next registration: the request is refused with the device's
    // reason, the connection goes on, and nothing is held for the refused request.
    ca.return_remote_mr(granted.pop().unwrap()).await.unwrap();
    refuse.store(true, Ordering::Relaxed);
    let mut why = String::new();
    for _ in 0..1000 {
        match ca
            .request_remote_mr(layout(64), Duration::from_secs(1))
            .await
        {
            Err(Error::Refused(w)) if w.contains("max_mr") => {
                why = w;
                break;
            }
            // The return may still be on its way: refused for the count, asked again.
            Err(Error::Refused(w)) => assert!(w.contains("regions"), "{w}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(why.contains("max_mr"), "{why}");
    refuse.store(false, Ordering::Relaxed);
    let lease = ca
        .request_remote_mr(layout(64), Duration::from_secs(60))
        .await
        .unwrap();
    let src = a.alloc_local_mr(layout(64)).unwrap();
    ca.write(&src, lease.mr()).await.unwrap();
}

/// A connection whose `max_send_wr` is the device's most (`max_qp_wr`) still has its
/// control messages' entries (issue 29: they come out of the configured depth there, not
/// beyond it, where the device would refuse the QP), and its messages and credits flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_queue_at_the_devices_most_still_connects() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    const MAX_QP_WR: u32 = 64;
    let (a, b) = pair_on(|b, name| {
        let soft = remem::open_device(Some(name)).unwrap();
        b.qp_cap(remem::verbs::QpCap {
            max_send_wr: MAX_QP_WR,
            max_recv_wr: MAX_QP_WR,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .recv_depth(16)
        .context(Arc::new(small_device::SmallDevice {
            ctx: soft,
            max_mr: 1 << 20,
            refuse: Arc::new(AtomicBool::new(false)),
            max_qp_wr: Some(MAX_QP_WR),
        }))
    });
    let (ca, cb) = connect(&a, &b).await;
    let sends = async {
        for i in 0..200u32 {
            ca.send_bytes(i.to_be_bytes()).await.unwrap();
        }
    };
    let receives = async {
        for i in 0..200u32 {
            assert_eq!(cb.receive().await.unwrap().data, i.to_be_bytes());
        }
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(sends, receives)
    })
    .await
    .expect("200 messages within 30 s");
}

/// A fresh path in `dir`, removed when dropped.
struct TempPath(std::path::PathBuf);

impl TempPath {
    fn new(dir: &std::path::Path, tag: &str) -> Self {
        static N: AtomicU8 = AtomicU8::new(0);
        TempPath(dir.join(format!(
            "remem-memory-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }

    fn create(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.0)
            .unwrap()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Bytes the file system has allocated to the file.
fn allocated(file: &std::fs::File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    file.metadata().unwrap().blocks() * 512
}

const FILE_RIGHTS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_WRITE);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_file_is_reserved_when_registered() {
    let (_a, b) = pair();
    let path = TempPath::new(&std::env::temp_dir(), "sparse");
    let file = path.create();
    // A hole of 1 MiB (most file systems allocate nothing for it), and one beyond the end.
    file.set_len(1 << 20).unwrap();
    for (offset, len) in [(0, 1 << 20), (1 << 20, 256 << 10)] {
        match b.register_file(&file, offset, len, FILE_RIGHTS) {
            Ok(mr) => {
                assert_eq!(mr.len(), len);
                assert!(
                    allocated(&file) >= offset + len as u64,
                    "{} bytes allocated for a region ending at {}",
                    allocated(&file),
                    offset + len as u64
                );
            }
            // A file system that cannot reserve refuses clearly.
            Err(Error::File(e)) => assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}"),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(file.metadata().unwrap().len(), (1 << 20) + (256 << 10));
}

/// A small tmpfs mounted for the test, unmounted when dropped; `None` (the test is
/// skipped, and says so) where mounting is not permitted.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(size: &str) -> Option<SmallFs> {
        let dir = TempPath::new(&std::env::temp_dir(), "tmpfs");
        std::fs::create_dir(&dir.0).ok()?;
        let dir = SmallFs(std::mem::take(&mut { dir }.0));
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "remem-test"])
            .arg(&dir.0)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(dir),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                let _ = std::fs::remove_dir(&dir.0);
                std::mem::forget(dir);
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                let _ = std::fs::remove_dir(&dir.0);
                std::mem::forget(dir);
                None
            }
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_system_refuses_at_registration_not_with_sigbus_later() {
    let Some(fs) = SmallFs::mount("256k") else {
        return;
    };
    let (a, b) = pair();
    let (ca, cb) = connect(&a, &b).await;

    // Larger than the file system: refused at registration.
    let big = TempPath::new(&fs.0, "big");
    let file = big.create();
    match b.register_file(&file, 0, 1 << 20, FILE_RIGHTS) {
        Err(Error::File(e)) => assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{e}"),
        Ok(_) => panic!("registered 1 MiB of a file on a 256 KiB file system"),
        Err(e) => panic!("{e}"),
    }
    drop(file);
    drop(big);

    // Fits: reserved, so filling the file system afterwards takes nothing from it, and a
    // peer's write into the whole region lands (without reservation: SIGBUS).
    let target = TempPath::new(&fs.0, "target");
    let file = target.create();
    let region = b.register_file(&file, 0, 128 << 10, FILE_RIGHTS).unwrap();
    let filler = TempPath::new(&fs.0, "filler");
    let mut fill = filler.create();
    let chunk = vec![1u8; 4096];
    loop {
        use std::io::Write;
        match fill.write(&chunk) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    cb.share_local_mr(&region).await.unwrap();
    let token = ca.receive_shared_mr().await.unwrap();
    let src = a.alloc_local_mr(layout(128 << 10)).unwrap();
    src.write(0, &vec![0x5a; 128 << 10]).unwrap();
    ca.write(&src, &token).await.unwrap();
    assert_eq!(region.to_vec(), vec![0x5a; 128 << 10]);
    drop((region, file, fill));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_region_ends_with_the_connection() {
    let (a, b) = pair();
    for given_back in [true, false] {
        let (ca, cb) = connect(&a, &b).await;
        let waiting = tokio::spawn(async move {
            if given_back {
                cb.receive_local_mr().await.map(drop)
            } else {
                cb.receive_remote_mr().await.map(drop)
            }
        });
        // The waiter is parked (or about to be): the peer goes away.
        tokio::task::yield_now().await;
        drop(ca);
        let got = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("still waiting for a region after the connection ended")
            .unwrap();
        assert!(matches!(got, Err(Error::Closed(_))), "{got:?}");
    }
}
