//! Memory a peer could reach, through the async API on two soft devices in one process
//! (127.0.53.x, one UDP port picked at run time): pool blocks are reused only once every
//! key for them is dead, regions given back are out of the borrower's reach, the agent's
//! requests are bounded per connection, and file-backed regions reserve their blocks.

use remem::{AccessFlags, Connection, Error, LocalMr, Rdma, RdmaBuilder, RemoteMr};
use std::alloc::Layout;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

mod common;

/// Two `Rdma`s that can talk (the second one built from `b`, e.g. with agent limits).
fn pair_with(b: impl FnOnce(RdmaBuilder) -> RdmaBuilder) -> (Rdma, Rdma) {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let a = common::builder(format!("soft@127.0.53.{n}:0"))
        .build()
        .unwrap();
    let port = common::soft_port(&a);
    let b = b(common::builder(format!("soft@127.0.53.{}:{port}", n + 1)))
        .build()
        .unwrap();
    (a, b)
}

fn pair() -> (Rdma, Rdma) {
    pair_with(|b| b)
}

async fn connect(a: &Rdma, b: &Rdma) -> (Connection, Connection) {
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ca, cb) = tokio::join!(a.connect(addr), listener.accept());
    (ca.unwrap(), cb.unwrap())
}

fn layout(n: usize) -> Layout {
    Layout::from_size_align(n, 8).unwrap()
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
    let src = a.alloc_local_mr(layout(token.len() as usize)).unwrap();
    src.write(0, &vec![0xee; token.len() as usize]).unwrap();
    assert_rem_access("a write", ca.write(&src, token).await);
    let (ca, _cb) = connect(a, b).await;
    let mut dst = a.alloc_local_mr(layout(token.len() as usize)).unwrap();
    dst.write(0, &vec![0x11; token.len() as usize]).unwrap();
    assert_rem_access("a read", ca.read(&mut dst, token).await);
    assert_eq!(dst.to_vec(), vec![0x11; token.len() as usize]);
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
