//! Durability across a crash of the target process. The test (the writer, on
//! `common::first_device`) spawns this test binary again as the target (`child_target`, on
//! a `common::peer_device`), which maps a file given by the parent, registers it for
//! persistent flushes and sends its descriptor as private data. The writer writes a pattern in many chunks with
//! writes that complete only on error, makes the whole range durable with one persistent
//! flush, and kills the target with SIGKILL the moment the flush completes. Reopening the
//! file, every flushed byte must be there.
//!
//! What this proves, and what it does not: a SIGKILL does not take the kernel's page
//! cache with it, so bytes that reached the target's file mapping survive it whether or not
//! they were written back. The test therefore proves that a completed persistent flush
//! means every earlier write had been placed in the target's file mapping — none was still
//! in flight in the network, in the soft NIC's queues or in the target's user-space
//! receive path — and written back (`msync` runs before the flush is answered). It cannot
//! simulate a power loss; on persistent memory (DAX) the written-back range is what
//! survives one.
//!
//! Without the flush (the second test) nothing is promised: writes whose completions the
//! writer has not seen may still be on their way when the target dies. The only thing that
//! holds is that the file never holds garbage: each chunk is either all the pattern or all
//! zeros, never something else.

use remem::{ConnectOptions, Error, FlushType, RdmaBuilder, RemoteMr};
use std::alloc::Layout;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common;

const FILE_ENV: &str = "REMEM_DURABILITY_FILE";
const LEN: usize = 1 << 20;
const CHUNK: usize = 16 * 1024;
const LIMIT: Duration = Duration::from_secs(30);

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| ((i / 7) % 251) as u8 + 1).collect()
}

/// The target: runs only as the child process of the tests below.
#[test]
#[ignore = "runs in the child process of the durability tests"]
fn child_target() {
    let Ok(path) = std::env::var(FILE_ENV) else {
        eprintln!("child_target only runs as the child of the durability tests");
        return;
    };
    std::thread::spawn(|| {
        let _ = std::io::stdin().read(&mut [0]);
        std::process::exit(3); // the parent went away
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let served = rt.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let rdma = RdmaBuilder::new().device(common::peer_device()).build()?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)?;
            let access = remem::AccessFlags::LOCAL_WRITE
                | remem::AccessFlags::REMOTE_WRITE
                | remem::AccessFlags::FLUSH_GLOBAL
                | remem::AccessFlags::FLUSH_PERSISTENT;
            let region = rdma.register_file(&file, 0, LEN, access)?;
            let listener = rdma.listen("127.0.0.1:0").await?;
            println!("listening {}", listener.local_addr()?);
            let opts = ConnectOptions {
                private_data: region.descriptor(&rdma)?,
                ..ConnectOptions::default()
            };
            let conn = listener.next_request().await?.accept(&opts).await?;
            // Serve until killed.
            let _ = conn.next_event().await;
            let _ = conn.next_event().await;
            Ok::<_, Error>(())
        })
        .await
    });
    served.expect("the child's time limit").expect("serving");
}

struct Target {
    process: Child,
    addr: SocketAddr,
}

impl Target {
    fn spawn(path: &std::path::Path) -> Target {
        let mut process = Command::new(std::env::current_exe().expect("own path"))
            .args([
                "--exact",
                "durability::child_target",
                "--ignored",
                "--nocapture",
            ])
            .env(FILE_ENV, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the target");
        let lines = BufReader::new(process.stdout.take().expect("piped")).lines();
        let addr = lines
            .map_while(Result::ok)
            .find_map(|l| l.split_once("listening ")?.1.parse().ok())
            .expect("the target listens");
        Target { process, addr }
    }

    /// SIGKILL, and wait for it to be gone.
    fn kill(mut self) {
        self.process.kill().expect("SIGKILL");
        self.process.wait().expect("reaped");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Writes the pattern in chunks to a fresh target, flushing at the end if `flush`, then
/// kills the target and returns the file's contents.
fn write_then_kill(tag: &str, flush: bool) -> Vec<u8> {
    let path = std::env::temp_dir().join(format!("remem-durability-{tag}-{}", std::process::id()));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(LEN as u64))
        .expect("target file");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let rdma = rt
        .block_on(async { RdmaBuilder::new().device(common::first_device()).build() })
        .expect("device");
    let target = Target::spawn(&path);
    rt.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let conn = rdma.connect(target.addr).await?;
            let remote = RemoteMr::from_descriptor(&conn.peer_private_data())?;
            let data = pattern();
            let src = rdma.alloc_local_mr(Layout::array::<u8>(LEN).unwrap())?;
            src.write(0, &data)?;
            for k in 0..LEN / CHUNK {
                let range = k * CHUNK..(k + 1) * CHUNK;
                conn.post_write(&src.get(range.clone())?, &remote.get(range)?)
                    .await?;
            }
            if flush {
                conn.flush(&remote, FlushType::Persistent).await?;
            }
            Ok::<_, Error>(())
        })
        .await
    })
    .expect("time limit")
    .expect("writing");
    // The moment the flush completed (or the last write was posted): kill the target.
    target.kill();
    let contents = std::fs::read(&path).expect("reopening the file");
    let _ = std::fs::remove_file(&path);
    contents
}

#[test]
fn flushed_bytes_survive_a_killed_target() {
    let contents = write_then_kill("flushed", true);
    assert_eq!(contents.len(), LEN);
    let want = pattern();
    let first_bad = contents.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "a flushed byte is missing from the file");
}

#[test]
fn without_a_flush_nothing_is_promised_but_nothing_is_garbage() {
    let contents = write_then_kill("unflushed", false);
    assert_eq!(contents.len(), LEN);
    let want = pattern();
    let mut landed = 0;
    for k in 0..LEN / CHUNK {
        let got = &contents[k * CHUNK..(k + 1) * CHUNK];
        let w = &want[k * CHUNK..(k + 1) * CHUNK];
        // Packets land whole (MTU-sized pieces), so a chunk may be partly there; every
        // byte is either the pattern's or still zero.
        assert!(
            got.iter().zip(w).all(|(g, w)| g == w || *g == 0),
            "chunk {k} holds bytes nobody wrote"
        );
        if got == w {
            landed += 1;
        }
    }
    eprintln!(
        "without a flush: {landed} of {} chunks had landed",
        LEN / CHUNK
    );
}
