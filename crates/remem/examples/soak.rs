//! A soak run: mixed traffic with verification for a long time, reporting operations,
//! errors and resident memory over time (driven by `bench/soak.sh`, not run in CI).
//!
//! `cargo run --release -p remem --example soak -- SECONDS [REPORT_EVERY_SECONDS]`; faults
//! come from `REMEM_SOFT_FAULTS` (both soft devices inject them). Every READ is compared
//! with a model of the target's memory, every message with what was sent, every atomic
//! with its expected value; the target's memory is compared with the model at each report.
//! Each report period runs on a fresh connection and region (connection churn is part of
//! the soak). A failed operation is printed with its cause and counted; the period then
//! starts over on a new connection. Prints one JSON line per report on stdout and exits non-zero
//! if any data check failed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::{Connection, Error, Rdma, RdmaBuilder};
use std::alloc::Layout;
use std::time::{Duration, Instant};

const REGION: usize = 4 << 20;

fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |p| p * 4096)
}

async fn connect(a: &Rdma, b: &Rdma) -> Result<(Connection, Connection), Error> {
    let listener = b.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (ca, cb) = tokio::join!(a.connect(addr), listener.accept());
    Ok((ca?, cb?))
}

#[derive(Default)]
struct Totals {
    ops: u64,
    bytes: u64,
    errors: u64,
    mismatches: u64,
    reconnects: u64,
}

/// One connection's life: operations until `until` or the first error.
async fn session(
    a: &Rdma,
    b: &Rdma,
    rng: &mut StdRng,
    until: Instant,
    t: &mut Totals,
) -> Result<(), Error> {
    let (ca, cb) = connect(a, b).await?;
    let target = b.alloc_local_mr_with(
        Layout::from_size_align(REGION, 4096).unwrap(),
        remem::AccessFlags::LOCAL_WRITE
            | remem::AccessFlags::REMOTE_READ
            | remem::AccessFlags::REMOTE_WRITE
            | remem::AccessFlags::REMOTE_ATOMIC,
    )?;
    cb.share_local_mr(&target).await?;
    let remote = ca.receive_shared_mr().await?;
    let mut model = vec![0u8; REGION];
    let mut adds = 0u64;
    let data_end = REGION - 8;
    let mut next_check = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let len = match rng.random_range(0..4) {
            0 => rng.random_range(1..64),
            1 => rng.random_range(64..4096),
            2 => rng.random_range(4096..65536),
            _ => rng.random_range(65536..400_000),
        };
        let off = rng.random_range(0..data_end - len);
        let range = off..off + len;
        match rng.random_range(0..4) {
            0 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let src = a.alloc_local_mr(Layout::array::<u8>(len).unwrap())?;
                src.write(0, &data)?;
                ca.write(&src, &remote.get(range)?).await?;
                model[off..off + len].copy_from_slice(&data);
            }
            1 => {
                let mut dst = a.alloc_local_mr(Layout::array::<u8>(len).unwrap())?;
                ca.read(&mut dst, &remote.get(range)?).await?;
                if dst.to_vec() != model[off..off + len] {
                    eprintln!("soak: READ {off}+{len} differs from the model");
                    t.mismatches += 1;
                }
            }
            2 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let src = a.alloc_local_mr(Layout::array::<u8>(len).unwrap())?;
                src.write(0, &data)?;
                ca.send(&src).await?;
                if cb.receive().await?.data != data {
                    eprintln!("soak: a message of {len} bytes arrived changed");
                    t.mismatches += 1;
                }
            }
            _ => {
                let counter = remote.get(data_end..REGION)?;
                if ca.fetch_and_add(&counter, 1).await? != adds {
                    eprintln!("soak: fetch-and-add returned an unexpected value");
                    t.mismatches += 1;
                }
                adds += 1;
            }
        }
        t.ops += 1;
        t.bytes += len as u64;
        if Instant::now() >= next_check {
            next_check = Instant::now() + Duration::from_secs(5);
            if target.to_vec()[..data_end] != model[..data_end] {
                eprintln!("soak: target memory differs from the model");
                t.mismatches += 1;
            }
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(600);
    let every: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let a = RdmaBuilder::new().device("soft@127.0.60.1:0").build()?;
    let b = RdmaBuilder::new().device("soft@127.0.60.2:0").build()?;
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut rng = StdRng::seed_from_u64(1);
    let mut t = Totals::default();
    let mut report = start + Duration::from_secs(every);
    while Instant::now() < end {
        let until = report.min(end);
        if let Err(e) = session(&a, &b, &mut rng, until, &mut t).await {
            eprintln!("soak: error after {} operations: {e}", t.ops);
            t.errors += 1;
            t.reconnects += 1;
        }
        if Instant::now() >= report {
            println!(
                "{{\"elapsed_s\":{},\"ops\":{},\"bytes\":{},\"errors\":{},\"mismatches\":{},\"reconnects\":{},\"rss_bytes\":{}}}",
                start.elapsed().as_secs(),
                t.ops,
                t.bytes,
                t.errors,
                t.mismatches,
                t.reconnects,
                resident_bytes()
            );
            report += Duration::from_secs(every);
        }
    }
    if t.mismatches > 0 {
        std::process::exit(1);
    }
    Ok(())
}
