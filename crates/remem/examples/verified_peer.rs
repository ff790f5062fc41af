//! A verified workload between two processes — for network namespaces joined by a veth
//! pair (the fault lane of `.ci/run`), or any two hosts.
//!
//! `verified_peer serve DEVICE TCP_ADDR` serves one connection: it lends a region, and
//! answers each message with a checksum — of the message's bytes, or, for the message
//! `sum`, of its whole region (so the client checks the target's memory at the target).
//! `verified_peer run DEVICE TCP_ADDR OPS` connects and runs OPS random operations —
//! WRITEs, READs (compared with a model), SENDs (checksum compared), fetch-and-adds
//! (exactly once) — then compares the server's checksum of its region with the model's.
//! Prints one JSON line with the counts and the bandwidth; exits non-zero on any mismatch.
//! Faults come from `REMEM_SOFT_FAULTS` on either side.
//!
//! `serve-cm` and `run-cm` do the same over a connection made through the RDMA connection
//! manager (`Rdma::listen_cm` / `Rdma::connect_cm`): ADDR is then the server device's IP
//! address and a CM port (TCP port space), e.g. `10.77.0.2:7473`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::{Error, RdmaBuilder};
use std::alloc::Layout;
use std::time::Instant;

const REGION: usize = 1 << 20;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn fail(what: String) -> Error {
    Error::InvalidArgument(what)
}

fn cm_addr(addr: &str) -> Result<std::net::SocketAddr, Error> {
    addr.parse()
        .map_err(|_| fail(format!("{addr}: not an IP address and port")))
}

async fn serve(device: &str, addr: &str, cm: bool) -> Result<(), Error> {
    let rdma = RdmaBuilder::new().device(device).timeout(12).build()?;
    let conn = if cm {
        let listener = rdma.listen_cm(cm_addr(addr)?).await?;
        println!("listening (RDMA CM) {:?}", listener.local_addr());
        listener.accept().await?
    } else {
        let listener = rdma.listen(addr).await?;
        println!("listening {}", listener.local_addr()?);
        listener.accept().await?
    };
    let region = rdma.alloc_local_mr(Layout::from_size_align(REGION, 4096).unwrap())?;
    conn.share_local_mr(&region).await?;
    let reply = rdma.alloc_local_mr(Layout::new::<u64>())?;
    loop {
        let m = match conn.receive().await {
            Ok(m) => m,
            Err(Error::Closed(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let sum = if m.data == b"sum" {
            fnv(&region.to_vec())
        } else {
            fnv(&m.data)
        };
        reply.write(0, &sum.to_le_bytes())?;
        match conn.send(&reply).await {
            // The client may close as soon as it has the answer, before our side has
            // seen the answer's acknowledgement: the end of the run, not a failure.
            Err(Error::Closed(_)) => return Ok(()),
            other => other?,
        }
    }
}

async fn run(device: &str, addr: &str, ops: usize, cm: bool) -> Result<(), Error> {
    let rdma = RdmaBuilder::new().device(device).timeout(12).build()?;
    let conn = if cm {
        rdma.connect_cm(cm_addr(addr)?).await?
    } else {
        rdma.connect(addr).await?
    };
    let remote = conn.receive_shared_mr().await?;
    let mut model = vec![0u8; REGION];
    let mut rng = StdRng::seed_from_u64(ops as u64);
    let (mut bytes, mut adds) = (0u64, 0u64);
    let counter_at = REGION - 8;
    let start = Instant::now();
    let answer = |m: remem::Message| -> Result<u64, Error> {
        Ok(u64::from_le_bytes(
            m.data.try_into().map_err(|_| fail("short answer".into()))?,
        ))
    };
    for _ in 0..ops {
        let len = match rng.random_range(0..3) {
            0 => rng.random_range(1..4096),
            1 => rng.random_range(4096..65536),
            _ => rng.random_range(65536..200_000),
        };
        let off = rng.random_range(0..counter_at - len);
        let range = off..off + len;
        match rng.random_range(0..4) {
            0 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let src = rdma.alloc_local_mr(Layout::array::<u8>(len).unwrap())?;
                src.write(0, &data)?;
                conn.write(&src, &remote.get(range)?).await?;
                model[off..off + len].copy_from_slice(&data);
            }
            1 => {
                let mut dst = rdma.alloc_local_mr(Layout::array::<u8>(len).unwrap())?;
                conn.read(&mut dst, &remote.get(range)?).await?;
                if dst.to_vec() != model[off..off + len] {
                    return Err(fail(format!("READ {off}+{len} differs from the model")));
                }
            }
            2 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let src = rdma.alloc_local_mr(Layout::array::<u8>(len).unwrap())?;
                src.write(0, &data)?;
                conn.send(&src).await?;
                if answer(conn.receive().await?)? != fnv(&data) {
                    return Err(fail(format!("a {len}-byte message arrived changed")));
                }
            }
            _ => {
                let counter = remote.get(counter_at..REGION)?;
                if conn.fetch_and_add(&counter, 1).await? != adds {
                    return Err(fail("fetch-and-add applied other than once".into()));
                }
                adds += 1;
                model[counter_at..].copy_from_slice(&adds.to_ne_bytes());
            }
        }
        bytes += len as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let sum = rdma.alloc_local_mr(Layout::array::<u8>(3).unwrap())?;
    sum.write(0, b"sum")?;
    conn.send(&sum).await?;
    if answer(conn.receive().await?)? != fnv(&model) {
        return Err(fail("the server's memory differs from the model".into()));
    }
    let counters: Vec<String> = rdma
        .context()
        .counters()
        .into_iter()
        .filter(|c| {
            c.value > 0
                && (c.name.starts_with("fault")
                    || c.name.contains("retry")
                    || c.name.starts_with("drop"))
        })
        .map(|c| format!("\"{}\":{}", c.name, c.value))
        .collect();
    let mut line = format!(
        "{{\"ops\":{ops},\"bytes\":{bytes},\"seconds\":{secs:.3},\"MBps\":{:.1},\"verified\":true",
        bytes as f64 / secs / 1e6
    );
    for c in counters {
        line.push(',');
        line.push_str(&c);
    }
    println!("{line}}}");
    conn.close().await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", device, addr] => serve(device, addr, false).await,
        ["serve-cm", device, addr] => serve(device, addr, true).await,
        ["run", device, addr, ops] => run(device, addr, ops.parse().unwrap_or(200), false).await,
        ["run-cm", device, addr, ops] => run(device, addr, ops.parse().unwrap_or(200), true).await,
        _ => Err(fail(
            "usage: verified_peer serve|serve-cm DEVICE ADDR | run|run-cm DEVICE ADDR OPS".into(),
        )),
    }
}
