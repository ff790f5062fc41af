//! Remote persistent memory through the async API (librpma's operations) on soft devices
//! (`common::first_addr` and a `common::peer_addr`): FLUSH and ATOMIC WRITE natively and by librpma's
//! fallbacks, file-backed regions, writes that complete only on error, MR descriptors.

use remem::{AccessFlags, Error, FlushType, PeerConfig, Polling, Rdma, RdmaBuilder, RemoteMr};
use remem_soft::{SoftContext, SoftOptions};
use std::alloc::Layout;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::common;

use common::test_util::connect;

/// Two `Rdma`s that can talk; `a` optionally on a device without FLUSH / ATOMIC WRITE.
fn pair(a_without_placement: bool) -> (Rdma, Rdma) {
    let opts = SoftOptions {
        no_placement: a_without_placement,
        ..SoftOptions::default()
    };
    let dev = SoftContext::bind_with(common::first_addr(), &opts).unwrap();
    let a = RdmaBuilder::new()
        .context(Arc::new(dev))
        .polling(Polling::Event)
        .build()
        .unwrap();
    let b = RdmaBuilder::new()
        .device(common::peer_device())
        .build()
        .unwrap();
    (a, b)
}

/// A fresh file in the temporary directory, removed when dropped.
struct TempFile(std::path::PathBuf, std::fs::File);

impl TempFile {
    fn new(tag: &str) -> Self {
        static N: AtomicU8 = AtomicU8::new(0);
        let path = std::env::temp_dir().join(format!(
            "remem-persist-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        TempFile(path, file)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const PMEM: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::FLUSH_GLOBAL)
    .union(AccessFlags::FLUSH_PERSISTENT);

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_and_atomic_write_on_a_file_backed_region() {
    let (a, b) = pair(false);
    let (ca, cb) = connect(&a, &b).await;
    let file = TempFile::new("native");
    let target = b.register_file(&file.1, 0, 8192, PMEM).unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    assert!(remote.supports_flush(FlushType::Persistent));
    assert!(remote.supports_flush(FlushType::Visibility));

    let data = pattern(4096, 7);
    let src = a
        .alloc_local_mr(Layout::array::<u8>(4096).unwrap())
        .unwrap();
    src.write(0, &data).unwrap();
    // Write completing only on error, then a persistent flush of the range: once it
    // completes, the bytes are in the file.
    ca.post_write(&src, &remote.get(0..4096).unwrap())
        .await
        .unwrap();
    ca.flush(&remote.get(0..4096).unwrap(), FlushType::Persistent)
        .await
        .unwrap();
    let on_disk = std::fs::read(&file.0).unwrap();
    assert_eq!(&on_disk[..4096], &data[..]);

    // An atomic write lands as one u64, in order after everything before it.
    let word = remote.get(4096..4104).unwrap();
    ca.atomic_write(&word, 0x0102_0304_0506_0708).await.unwrap();
    ca.flush(&word, FlushType::Visibility).await.unwrap();
    assert_eq!(target.load_u64(4096).unwrap(), 0x0102_0304_0506_0708);
    // Misaligned or wrongly sized words are refused before anything is posted.
    assert!(matches!(
        ca.atomic_write(&remote.get(4100..4108).unwrap(), 1).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ca.atomic_write(&remote.get(0..16).unwrap(), 1).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(ca.closed().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_native_flush_remem_falls_back_as_librpma_does() {
    let (a, b) = pair(true);
    let (ca, cb) = connect(&a, &b).await;
    let target = b
        .alloc_local_mr(Layout::array::<u8>(4096).unwrap())
        .unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let data = pattern(1000, 3);
    let src = a
        .alloc_local_mr(Layout::array::<u8>(1000).unwrap())
        .unwrap();
    src.write(0, &data).unwrap();
    ca.post_write(&src, &remote.get(0..1000).unwrap())
        .await
        .unwrap();
    // Visibility: a READ after the writes.
    ca.flush(&remote.get(0..1000).unwrap(), FlushType::Visibility)
        .await
        .unwrap();
    assert_eq!(target.to_vec()[..1000], data[..]);
    // Persistence needs the peer's word that writes reach persistent memory directly.
    assert!(matches!(
        ca.flush(&remote, FlushType::Persistent).await,
        Err(Error::Unsupported(_))
    ));
    let declared = PeerConfig {
        direct_write_to_pmem: true,
    };
    ca.apply_peer_config(PeerConfig::from_descriptor(&declared.descriptor()).unwrap());
    ca.flush(&remote, FlushType::Persistent).await.unwrap();
    // ATOMIC WRITE becomes an 8-byte WRITE with FENCE.
    ca.atomic_write(&remote.get(1000..1008).unwrap(), u64::MAX - 1)
        .await
        .unwrap();
    ca.flush(&remote, FlushType::Visibility).await.unwrap();
    assert_eq!(target.load_u64(1000).unwrap(), u64::MAX - 1);
    assert!(ca.closed().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_completing_on_error_only_drain_the_send_queue() {
    let (a, b) = pair(false);
    let (ca, cb) = connect(&a, &b).await;
    let target = b
        .alloc_local_mr(Layout::array::<u8>(64 * 1024).unwrap())
        .unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    // Three times the send queue's depth of silent writes: remem signals some of them
    // itself, so the queue never fills for good.
    let n = 3 * 128;
    let src = a.alloc_local_mr(Layout::array::<u8>(128).unwrap()).unwrap();
    for i in 0..n {
        src.write(0, &[i as u8; 128]).unwrap();
        let at = (i % 512) * 128;
        ca.post_write(
            &src.get(0..128).unwrap(),
            &remote.get(at..at + 128).unwrap(),
        )
        .await
        .unwrap();
        // Wait for this write before changing the source again.
        ca.flush(&remote.get(at..at + 128).unwrap(), FlushType::Visibility)
            .await
            .unwrap();
    }
    let all = target.to_vec();
    for i in 0..n {
        let at = (i % 512) * 128;
        assert!(all[at..at + 128].iter().all(|&v| v == i as u8), "write {i}");
    }
    // Without flushes in between: they still all complete and land.
    let srcs: Vec<_> = (0..200u32)
        .map(|i| {
            let m = a.alloc_local_mr(Layout::array::<u8>(64).unwrap()).unwrap();
            m.write(0, &[(i % 251) as u8; 64]).unwrap();
            m
        })
        .collect();
    for (i, m) in srcs.iter().enumerate() {
        let at = i * 64;
        ca.post_write(m, &remote.get(at..at + 64).unwrap())
            .await
            .unwrap();
    }
    ca.flush(&remote, FlushType::Visibility).await.unwrap();
    let all = target.to_vec();
    for i in 0..200usize {
        assert!(
            all[i * 64..i * 64 + 64]
                .iter()
                .all(|&v| v == (i % 251) as u8)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_completing_on_error_only_fails_the_connection() {
    let (a, b) = pair(false);
    let (ca, cb) = connect(&a, &b).await;
    let read_only = b
        .alloc_local_mr_with(
            Layout::array::<u8>(64).unwrap(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    cb.share_local_mr(&read_only).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    assert!(!remote.access().contains(AccessFlags::REMOTE_WRITE));
    let src = a.alloc_local_mr(Layout::array::<u8>(64).unwrap()).unwrap();
    src.write(0, &[9; 64]).unwrap();
    // Posting succeeds; the error arrives as a completion and closes the connection, so
    // the next operation fails.
    ca.post_write(&src, &remote).await.unwrap();
    let after = ca.flush(&remote, FlushType::Visibility).await;
    assert!(after.is_err(), "{after:?}");
    assert!(ca.closed().is_some());
    assert_eq!(read_only.to_vec(), vec![0; 64]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mr_descriptors_travel_by_any_channel() {
    let (a, b) = pair(false);
    let (ca, _cb) = connect(&a, &b).await;
    let file = TempFile::new("desc");
    let target = b.register_file(&file.1, 4096, 4096, PMEM).unwrap();
    let bytes = target.descriptor(&b).unwrap();
    assert_eq!(bytes.len(), remem::MR_DESCRIPTOR_LEN);
    let remote = RemoteMr::from_descriptor(&bytes).unwrap();
    assert_eq!(remote.len(), 4096);
    assert_eq!(remote.access(), PMEM - AccessFlags::LOCAL_WRITE);
    let src = a.alloc_local_mr(Layout::array::<u8>(16).unwrap()).unwrap();
    src.write(0, b"through the file").unwrap();
    ca.write(&src, &remote.get(100..116).unwrap())
        .await
        .unwrap();
    ca.flush(&remote, FlushType::Persistent).await.unwrap();
    assert_eq!(
        &std::fs::read(&file.0).unwrap()[4196..4212],
        b"through the file"
    );
    // Bad bytes are errors.
    for bad in [&bytes[..10], &[0u8; remem::MR_DESCRIPTOR_LEN][..]] {
        assert!(matches!(
            RemoteMr::from_descriptor(bad),
            Err(Error::Descriptor(_))
        ));
    }
    // Pool memory cannot be registered for persistent flushes; files can.
    assert!(
        b.alloc_local_mr_with(Layout::array::<u8>(64).unwrap(), PMEM)
            .is_err()
    );
}
