//! A verified workload under injected network faults, over real UDP sockets between two
//! soft devices (`common::first_addr` and a `common::peer_addr`): both devices lose,
//! corrupt, duplicate, reorder or delay the packets they send ([`remem_soft::FaultConfig`]). WRITEs, READs, SENDs (eager and large)
//! and atomics of mixed sizes must complete with the target's memory exactly as a model
//! says (compared at the target), every message intact and in order, and every atomic
//! applied exactly once. Past the retry limits, operations fail with RETRY_EXC_ERR and
//! the connection reports it lost: nothing hangs.
//!
//! (The kernel here has no `sch_netem`, so `tc netem` on a veth pair cannot be used; the
//! faults are injected by the soft NIC on its way to the socket — see docs/soft-provider.md.)

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::{AccessFlags, ConnectionEvent, Error, Polling, Rdma, RdmaBuilder, RemoteMr};
use remem_soft::{FaultConfig, SoftContext, SoftOptions};
use std::alloc::Layout;
use std::sync::Arc;
use std::time::Duration;

use crate::common;

use common::test_util::connect;

const REGION: usize = 1 << 20;

fn device(addr: std::net::SocketAddr, faults: FaultConfig) -> Rdma {
    let opts = SoftOptions {
        faults: Some(faults),
        ..SoftOptions::default()
    };
    let dev = SoftContext::bind_with(addr, &opts).unwrap();
    RdmaBuilder::new()
        .context(Arc::new(dev))
        .polling(Polling::Event)
        // A short retransmission timeout (code 10: about 4 ms) keeps lossy runs quick.
        .timeout(10)
        .build()
        .unwrap()
}

fn pair(faults: FaultConfig) -> (Rdma, Rdma) {
    let a = device(common::first_addr(), faults);
    let b_faults = FaultConfig {
        seed: faults.seed.wrapping_add(1),
        ..faults
    };
    let b = device(common::peer_addr(), b_faults);
    (a, b)
}

/// Awaits `f`, failing the test (with the devices' counters) if it takes more than 20 s:
/// under faults every operation must still end.
async fn bounded<T>(
    what: &str,
    devs: (&Rdma, &Rdma),
    f: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(Duration::from_secs(20), f).await {
        Ok(v) => v,
        Err(_) => {
            let counters: Vec<String> = devs
                .0
                .context()
                .counters()
                .into_iter()
                .chain(devs.1.context().counters())
                .filter(|c| c.value > 0)
                .map(|c| format!("{}={}", c.name, c.value))
                .collect();
            panic!("{what} did not end: {counters:?}")
        }
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    // FNV-1a: enough to compare the target with the model.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Runs `ops` random operations from `a` against `b`'s region and checks everything.
async fn verified_workload(faults: FaultConfig, ops: usize) {
    let (a, b) = pair(faults);
    let (ca, cb) = connect(&a, &b).await;
    let target = b
        .alloc_local_mr(Layout::array::<u8>(REGION).unwrap())
        .unwrap();
    cb.share_local_mr(&target).await.unwrap();
    let remote = ca.receive_shared_mr().await.unwrap();
    let mut model = vec![0u8; REGION];
    let mut rng = StdRng::seed_from_u64(faults.seed);
    let (mut adds, mut sent) = (0u64, Vec::<usize>::new());
    // The last 16 bytes hold the counters.
    let data_end = REGION - 16;
    for _ in 0..ops {
        let len = match rng.random_range(0..4) {
            0 => rng.random_range(1..64),
            1 => rng.random_range(64..4096),
            2 => rng.random_range(4096..40_000),
            _ => rng.random_range(40_000..150_000),
        };
        let off = rng.random_range(0..data_end - len);
        match rng.random_range(0..4) {
            0 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let src = a.alloc_local_mr(Layout::array::<u8>(len).unwrap()).unwrap();
                src.write(0, &data).unwrap();
                let dst = remote.get(off..off + len).unwrap();
                bounded(
                    &format!("write {off}+{len}"),
                    (&a, &b),
                    ca.write(&src, &dst),
                )
                .await
                .unwrap();
                model[off..off + len].copy_from_slice(&data);
            }
            1 => {
                let mut dst = a.alloc_local_mr(Layout::array::<u8>(len).unwrap()).unwrap();
                let src = remote.get(off..off + len).unwrap();
                bounded(
                    &format!("read {off}+{len}"),
                    (&a, &b),
                    ca.read(&mut dst, &src),
                )
                .await
                .unwrap();
                assert_eq!(dst.to_vec(), model[off..off + len], "read at {off}+{len}");
            }
            2 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let src = a.alloc_local_mr(Layout::array::<u8>(len).unwrap()).unwrap();
                src.write(0, &data).unwrap();
                bounded(&format!("send {len}"), (&a, &b), ca.send(&src))
                    .await
                    .unwrap();
                // Taken at once: a receiver that does not take its messages stops a
                // sender once its credits are spent (flow control, not a fault).
                let m = bounded("receive", (&a, &b), cb.receive()).await.unwrap();
                assert_eq!(checksum(&m.data), checksum(&data), "message {}", sent.len());
                sent.push(len);
            }
            _ => {
                let counter = remote.get(REGION - 16..REGION - 8).unwrap();
                let before = bounded("fetch-and-add", (&a, &b), ca.fetch_and_add(&counter, 3))
                    .await
                    .unwrap();
                assert_eq!(before, adds * 3, "fetch-and-add applied exactly once each");
                adds += 1;
                let word = remote.get(REGION - 8..REGION).unwrap();
                let cur = bounded(
                    "compare-and-swap",
                    (&a, &b),
                    ca.compare_and_swap(&word, 0, 0),
                )
                .await
                .unwrap();
                assert_eq!(
                    bounded(
                        "compare-and-swap",
                        (&a, &b),
                        ca.compare_and_swap(&word, cur, cur + 1)
                    )
                    .await
                    .unwrap(),
                    cur
                );
            }
        }
    }
    // The target's memory is exactly the model (checked at the target), counters included.
    let at_target = target.to_vec();
    assert_eq!(
        checksum(&at_target[..data_end]),
        checksum(&model[..data_end]),
        "target memory differs from the model"
    );
    assert_eq!(target.load_u64(REGION - 16).unwrap(), adds * 3);
    let counters: std::collections::HashMap<String, u64> = a
        .context()
        .counters()
        .into_iter()
        .chain(b.context().counters())
        .fold(Default::default(), |mut m, c| {
            *m.entry(c.name.to_string()).or_default() += c.value;
            m
        });
    // The faults did happen, and were recovered from.
    let injected = counters["fault_dropped"]
        + counters["fault_corrupted"]
        + counters["fault_duplicated"]
        + counters["fault_reordered"];
    if faults.loss + faults.corrupt + faults.duplicate + faults.reorder > 0.0 {
        assert!(injected > 0, "no fault was injected: {counters:?}");
    }
    if faults.corrupt > 0.0 {
        assert!(counters["drop_bad_icrc"] > 0, "corruption went unnoticed");
    }
    eprintln!(
        "faults {faults:?}: {ops} operations ({} messages) verified; injected {injected}, retransmissions {}, bad ICRC drops {}",
        sent.len(),
        counters.get("completer_retry_err").copied().unwrap_or(0),
        counters["drop_bad_icrc"]
    );
}

fn faults(seed: u64) -> FaultConfig {
    FaultConfig {
        seed,
        ..FaultConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_a_tenth_of_a_percent() {
    verified_workload(
        FaultConfig {
            loss: 0.001,
            ..faults(1)
        },
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_one_percent() {
    verified_workload(
        FaultConfig {
            loss: 0.01,
            ..faults(2)
        },
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_five_percent() {
    verified_workload(
        FaultConfig {
            loss: 0.05,
            ..faults(3)
        },
        120,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplication() {
    verified_workload(
        FaultConfig {
            duplicate: 0.05,
            ..faults(4)
        },
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordering() {
    verified_workload(
        FaultConfig {
            reorder: 0.05,
            ..faults(5)
        },
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruption() {
    verified_workload(
        FaultConfig {
            corrupt: 0.02,
            ..faults(6)
        },
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay() {
    verified_workload(
        FaultConfig {
            delay: Duration::from_micros(300),
            ..faults(7)
        },
        100,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_at_once() {
    verified_workload(
        FaultConfig {
            loss: 0.01,
            corrupt: 0.01,
            duplicate: 0.01,
            reorder: 0.01,
            delay: Duration::from_micros(100),
            ..faults(8)
        },
        150,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_retry_limit_operations_fail_and_the_connection_is_lost() {
    // The requester's packets all vanish: its retries run out.
    let (a, b) = {
        let a = device(
            common::first_addr(),
            FaultConfig {
                loss: 1.0,
                ..faults(9)
            },
        );
        let b = device(common::peer_addr(), faults(10));
        (a, b)
    };
    // (Endpoints exchanged out of band: the TCP handshake's first RDMA message could not
    // get through either, and connecting would fail with HandshakeError::Unreachable.)
    let (pa, pb) = (a.prepare().unwrap(), b.prepare().unwrap());
    let (ia, ib) = (pa.local_info(), pb.local_info());
    let (ca, cb) = (pa.connect(ib).unwrap(), pb.connect(ia).unwrap());
    let target = b
        .alloc_local_mr_with(
            Layout::array::<u8>(64).unwrap(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let bytes = target.descriptor(&b).unwrap();
    let remote = RemoteMr::from_descriptor(&bytes).unwrap();
    let src = a.alloc_local_mr(Layout::array::<u8>(64).unwrap()).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), ca.write(&src, &remote))
        .await
        .expect("the write ends: nothing hangs");
    match outcome {
        Err(Error::Completion { status, .. }) => {
            assert_eq!(status, remem::verbs::WcStatus::RetryExcErr)
        }
        other => panic!("want RETRY_EXC_ERR, got {other:?}"),
    }
    assert_eq!(ca.next_event().await, ConnectionEvent::Established);
    assert!(matches!(ca.next_event().await, ConnectionEvent::Lost(_)));
    assert!(matches!(
        ca.write(&src, &remote).await,
        Err(Error::Closed(_) | Error::Event(_))
    ));
    drop(cb);
}
