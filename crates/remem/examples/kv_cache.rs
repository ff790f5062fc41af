//! A remote key-value cache between two processes.
//!
//! The server keeps a table of fixed-size slots in one region and lends it to every client
//! connection. Clients GET with one-sided READs, checking each slot's checksum (a READ that
//! raced a writer is torn: read again); PUT either by RPC (the server writes the slot) or
//! by taking the slot's lock word with compare-and-swap, WRITing the slot, and unlocking;
//! and bump counters with fetch-and-add. Several tasks on several connections do this at
//! random; at the end the client READs the whole table and checks every slot and counter
//! against what its tasks did, prints a summary, and exits non-zero on any wrong value.
//!
//! A slot is eight 64-bit words ([`Slot`]): `lock | version | key | writer | seq | fill |
//! !fill | sum`. `version` counts the writes to the slot, `(writer, seq)` names the last one
//! (the writer's `seq`-th PUT of that key), `fill` is derived from the rest, and `sum` is a
//! checksum of words 1..7. Both kinds of PUT take the slot's lock word: clients with an
//! RDMA compare-and-swap, the server (for a PUT by RPC) with a local one on the same word
//! (`LocalMr::compare_and_swap_u64`, atomic with respect to the peer's RDMA atomics).
//!
//! - `kv_cache` runs both: it starts itself as the server, then runs the client.
//! - `kv_cache server [--listen ADDR] [--device DEV] [--connections N]` serves N client
//!   connections, then exits; it prints `listening ADDR` once it listens.
//! - `kv_cache client --connect ADDR [--device DEV] [--connections N] [--tasks M]
//!   [--ops K] [--seed S]`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};
use remem::{LocalMr, RdmaBuilder, RemoteMr, RpcClient, RpcServer};
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const SLOT: usize = size_of::<Slot>();
const KEYS: u64 = 64;
const COUNTERS: usize = 8;
const TABLE: usize = KEYS as usize * SLOT + COUNTERS * 8;
/// The writer of a slot nobody has PUT yet.
const NOBODY: u64 = u64::MAX;
/// The lock word of a slot the server is writing (clients lock with `writer + 1`).
const SERVER: u64 = u64::MAX;
/// The longest either process runs.
const LIMIT: Duration = Duration::from_secs(60);

/// One slot of the table, as it lies in memory (and travels: one READ or WRITE).
#[derive(Debug, Clone, Copy, PartialEq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[zerocopy(crate = "remem::zerocopy")]
#[repr(C)]
struct Slot {
    lock: u64,
    version: u64,
    key: u64,
    writer: u64,
    seq: u64,
    fill: [u64; 2],
    sum: u64,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

impl Slot {
    /// A whole slot (unlocked) for this entry: derived words and checksum filled in.
    fn new(version: u64, key: u64, writer: u64, seq: u64) -> Slot {
        let fill = mix(key ^ mix(writer ^ mix(seq)));
        let mut s = Slot {
            lock: 0,
            version,
            key,
            writer,
            seq,
            fill: [fill, !fill],
            sum: 0,
        };
        s.sum = s.checksum();
        s
    }

    fn checksum(&self) -> u64 {
        let words = [
            self.version,
            self.key,
            self.writer,
            self.seq,
            self.fill[0],
            self.fill[1],
        ];
        words.iter().fold(0x9e37_79b9, |h, &x| mix(h ^ x))
    }

    /// Whether its words agree (a READ that raced a WRITE is torn: they do not).
    fn intact(&self) -> bool {
        *self
            == Slot {
                lock: self.lock,
                ..Slot::new(self.version, self.key, self.writer, self.seq)
            }
    }

    /// The slot after this one: the next version, written by `writer`'s PUT `seq`, locked
    /// with `lock`.
    fn next(&self, writer: u64, seq: u64, lock: u64) -> Slot {
        Slot {
            lock,
            ..Slot::new(self.version + 1, self.key, writer, seq)
        }
    }
}

fn layout(len: usize) -> Layout {
    Layout::from_size_align(len, 64).unwrap()
}

/// Where a slot (and its lock word) starts.
fn slot(key: u64) -> usize {
    key as usize * SLOT
}

/// Where counter `i` is.
fn counter(i: usize) -> usize {
    KEYS as usize * SLOT + i * 8
}

// --- Data access: the few functions that touch slots, remote and local.

/// One task's handle on the server's table: its connection's RPC client and the table.
struct Remote {
    rpc: RpcClient,
    table: RemoteMr,
}

impl Remote {
    /// GET: READs the slot until it is not torn; returns it and the torn READs.
    async fn get(&self, key: u64) -> Res<(Slot, u64)> {
        let (at, mut torn) = (self.table.at::<Slot>(slot(key))?, 0);
        loop {
            match self.rpc.connection().read_value(&at).await? {
                s if s.intact() => return Ok((s, torn)),
                _ => torn += 1,
            }
        }
    }

    /// PUT by RPC: the server writes the slot; returns the new version.
    async fn put_rpc(&self, key: u64, writer: u64, seq: u64) -> Res<u64> {
        let reply = self.rpc.call([key, writer, seq].as_bytes()).await?;
        Ok(u64::read_from_bytes(&reply).map_err(|_| "a PUT reply is 8 bytes")?)
    }

    /// PUT by CAS-lock + WRITE: takes the slot's lock word, reads the slot, writes the next
    /// version (still locked), unlocks. Returns the new version and how often the lock was
    /// busy.
    async fn put_cas(&self, key: u64, writer: u64, seq: u64) -> Res<(u64, u64)> {
        let (conn, mut busy) = (self.rpc.connection(), 0);
        let lock = self.table.word(slot(key))?;
        while conn.compare_and_swap(&lock, 0, writer + 1).await? != 0 {
            busy += 1;
            tokio::task::yield_now().await;
        }
        let new = self.get(key).await?.0.next(writer, seq, writer + 1);
        conn.write_value(&self.table.at(slot(key))?, &new).await?;
        match conn.compare_and_swap(&lock, writer + 1, 0).await? {
            w if w == writer + 1 => Ok((new.version, busy)),
            w => Err(format!("slot {key}: lock word {w}, writer {writer} had it").into()),
        }
    }

    /// Adds to a counter (fetch-and-add).
    async fn add(&self, i: usize, add: u64) -> Res<u64> {
        let word = self.table.word(counter(i))?;
        Ok(self.rpc.connection().fetch_and_add(&word, add).await?)
    }
}

/// The server's side of a PUT by RPC: takes the slot's lock word as clients do (a local
/// compare-and-swap), writes the slot's next version in its own memory, unlocks.
async fn put_local(table: &LocalMr, request: &[u8]) -> Res<Vec<u8>> {
    let [key, writer, seq] = <[u64; 3]>::read_from_bytes(request).map_err(|_| "PUT is 24 bytes")?;
    if key >= KEYS {
        return Err(format!("no key {key}").into());
    }
    while table.compare_and_swap_u64(slot(key), 0, SERVER)? != 0 {
        tokio::task::yield_now().await;
    }
    let new = table
        .read_value::<Slot>(slot(key))?
        .next(writer, seq, SERVER);
    table.write_value(slot(key), &new)?;
    table.compare_and_swap_u64(slot(key), SERVER, 0)?;
    Ok(new.version.as_bytes().to_vec())
}

// --- The server.

async fn server(args: &Args) -> Res<()> {
    let connections = args.get("connections", 3)?;
    let device: String = args.get("device", "soft@127.0.0.1:0".into())?;
    let rdma = RdmaBuilder::new().device(device).build()?;
    let table = Arc::new(rdma.alloc_local_mr(layout(TABLE))?);
    for key in 0..KEYS {
        table.write_value(slot(key), &Slot::new(0, key, NOBODY, 0))?;
    }
    let listener = rdma
        .listen(args.get("listen", "127.0.0.1:0".to_string())?)
        .await?;
    println!("listening {}", listener.local_addr()?);
    let mut served = Vec::new();
    for _ in 0..connections {
        let (conn, table) = (listener.accept().await?, table.clone());
        conn.share_local_mr(&table).await?;
        let rpc = RpcServer::new(&rdma, conn);
        let put = move |req: Vec<u8>| {
            let table = table.clone();
            async move { put_local(&table, &req).await.map_err(|e| e.to_string()) }
        };
        served.push(tokio::spawn(async move { rpc.serve(put).await }));
    }
    let mut puts = 0;
    for s in served {
        puts += s.await??;
    }
    println!("served {connections} connections, {puts} PUTs by RPC");
    Ok(())
}

// --- The client.

/// What tasks did: per task, its PUTs and adds; summed, the counts of the summary.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// PUTs per key (the last PUT of a key has that `seq`).
    puts: BTreeMap<u64, u64>,
    adds: [u64; COUNTERS],
    /// Counts, indexed by the constants below.
    pub(crate) n: [u64; 8],
}

const GETS: usize = 0;
const TORN: usize = 1;
const RPC_PUTS: usize = 2;
const CAS_PUTS: usize = 3;
const BUSY: usize = 4;
const FAAS: usize = 5;
const SLOTS_VERIFIED: usize = 6;
const COUNTERS_VERIFIED: usize = 7;

impl Tally {
    /// The `seq` of this task's next PUT of `key`.
    fn next_seq(&mut self, key: u64) -> u64 {
        *self.puts.entry(key).and_modify(|n| *n += 1).or_insert(1)
    }
}

async fn task(r: Remote, writer: u64, ops: usize, seed: u64) -> Res<Tally> {
    let (mut t, mut seen) = (Tally::default(), [0u64; KEYS as usize]);
    let mut rng = StdRng::seed_from_u64(seed ^ mix(writer));
    for _ in 0..ops {
        match rng.random_range(0..10) {
            0..4 => {
                let key = rng.random_range(0..KEYS);
                let (e, torn) = r.get(key).await?;
                // Versions only grow; this task's own PUTs are seen.
                if e.key != key || e.version < seen[key as usize] {
                    let after = seen[key as usize];
                    return Err(format!("GET {key}: {e:?} after version {after}").into());
                }
                seen[key as usize] = e.version;
                (t.n[GETS], t.n[TORN]) = (t.n[GETS] + 1, t.n[TORN] + torn);
            }
            4..6 => {
                let key = rng.random_range(0..KEYS);
                seen[key as usize] = r.put_rpc(key, writer, t.next_seq(key)).await?;
                t.n[RPC_PUTS] += 1;
            }
            6..8 => {
                let key = rng.random_range(0..KEYS);
                let (version, busy) = r.put_cas(key, writer, t.next_seq(key)).await?;
                seen[key as usize] = version;
                (t.n[CAS_PUTS], t.n[BUSY]) = (t.n[CAS_PUTS] + 1, t.n[BUSY] + busy);
            }
            _ => {
                let (i, add) = (rng.random_range(0..COUNTERS), rng.random_range(1..100));
                r.add(i, add).await?;
                (t.adds[i], t.n[FAAS]) = (t.adds[i] + add, t.n[FAAS] + 1);
            }
        }
    }
    Ok(t)
}

/// Every slot and counter of `table` against what the tasks did (indexed by writer).
fn verify(table: &LocalMr, tallies: &[Tally]) -> Res<Tally> {
    let mut sum = Tally::default();
    for t in tallies {
        sum.n.iter_mut().zip(t.n).for_each(|(s, n)| *s += n);
    }
    for key in 0..KEYS {
        let s = table.read_value::<Slot>(slot(key))?;
        let puts: u64 = tallies.iter().filter_map(|t| t.puts.get(&key)).sum();
        // The last PUT is the last one of the writer it names (or the slot is untouched).
        let last = tallies
            .get(s.writer as usize)
            .and_then(|t| t.puts.get(&key));
        let last_ok = last.map_or(puts == 0 && s.writer == NOBODY, |&seq| seq == s.seq);
        if !s.intact() || s.key != key || s.version != puts || s.lock != 0 || !last_ok {
            return Err(format!("slot {key}: {s:?} after {puts} PUTs").into());
        }
        sum.n[SLOTS_VERIFIED] += 1;
    }
    for i in 0..COUNTERS {
        let (value, adds) = (
            table.read_value::<u64>(counter(i))?,
            tallies.iter().map(|t| t.adds[i]).sum::<u64>(),
        );
        if value != adds {
            return Err(format!("counter {i}: {value}, expected {adds}").into());
        }
        sum.n[COUNTERS_VERIFIED] += 1;
    }
    Ok(sum)
}

/// Runs the client's tasks, verifies the table, prints and returns the summary.
pub(crate) async fn client(args: &Args) -> Res<Tally> {
    let device: String = args.get("device", "soft@127.0.0.2:0".into())?;
    let rdma = RdmaBuilder::new().device(device).build()?;
    let addr: SocketAddr = args.get("connect", ([127, 0, 0, 1], 0).into())?;
    let (connections, tasks_per, ops) = (
        args.get("connections", 3)?,
        args.get("tasks", 4)?,
        args.get("ops", 300)?,
    );
    let seed = args.get("seed", 19)?;
    let (mut tasks, mut first) = (Vec::new(), None);
    for c in 0..connections {
        let conn = rdma.connect(addr).await?;
        let table = conn.receive_shared_mr().await?;
        let rpc = RpcClient::new(&rdma, conn);
        for m in 0..tasks_per {
            let r = Remote {
                rpc: rpc.clone(),
                table,
            };
            let writer = (c * tasks_per + m) as u64;
            tasks.push(tokio::spawn(task(r, writer, ops, seed)));
        }
        first.get_or_insert((rpc, table));
    }
    let mut tallies = Vec::new();
    for t in tasks {
        tallies.push(t.await??);
    }
    let (rpc, table) = first.ok_or("no connections")?;
    let mut all = rdma.alloc_local_mr(layout(TABLE))?;
    rpc.connection().read(&mut all, &table).await?;
    let sum = verify(&all, &tallies)?;
    let [gets, torn, rpc_puts, cas_puts, busy, faas, slots, counters] = sum.n;
    println!(
        "kv_cache: {connections} connections x {tasks_per} tasks: {gets} GETs ({torn} torn READs retried), \
         {rpc_puts} PUTs by RPC, {cas_puts} by CAS-lock + WRITE ({busy} busy locks), \
         {faas} fetch-and-adds; verified {slots} slots, {counters} counters"
    );
    Ok(sum)
}

// --- Processes and arguments.

/// The command line: the mode (`server`, `client` or none), then `--name value` pairs (a
/// later one wins).
pub(crate) struct Args(pub(crate) Vec<String>);

impl Args {
    fn mode(&self) -> &str {
        let first = self.0.first().map_or("", |m| m.as_str());
        if first.starts_with("--") { "" } else { first }
    }

    /// The value of `--name`, else `default`.
    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Res<T> {
        let at = self
            .0
            .iter()
            .rposition(|a| a.strip_prefix("--") == Some(name));
        let Some(value) = at.map(|i| self.0.get(i + 1)) else {
            return Ok(default);
        };
        let value = value.ok_or(format!("--{name} needs a value"))?;
        value
            .parse()
            .map_err(|_| format!("--{name} {value}: not valid").into())
    }
}

/// Starts the server process `cmd` and waits until it prints that it listens; returns
/// it and its TCP address.
pub(crate) fn spawn_server(mut cmd: Command) -> Res<(Child, SocketAddr)> {
    let mut child = cmd.stdout(Stdio::piped()).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("listening "));
    let line = line.ok_or("the server did not say where it listens")?;
    let addr = line["listening ".len()..].parse()?;
    std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .for_each(|l| println!("server: {l}"))
    });
    Ok((child, addr))
}

/// Runs `f` on a runtime of its own, within the time limit.
fn limited<T>(f: impl std::future::Future<Output = Res<T>>) -> Res<T> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async { tokio::time::timeout(LIMIT, f).await })?
}

/// `kv_cache [server|client] [options]`, as the module's documentation says.
pub(crate) fn main_with(mut args: Args) -> Res<()> {
    match args.mode() {
        "server" => limited(server(&args)),
        "client" => limited(client(&args)).map(drop),
        "" => {
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.args([
                "server",
                "--connections",
                &args.get("connections", 3)?.to_string(),
            ]);
            let (mut child, addr) = spawn_server(cmd)?;
            args.0.extend(["--connect".into(), addr.to_string()]);
            if let Err(e) = limited(client(&args)) {
                let _ = child.kill(); // (it would wait for connections until its time limit)
                return Err(e);
            }
            match child.wait()? {
                s if s.success() => Ok(()),
                s => Err(format!("the server failed: {s}").into()),
            }
        }
        other => Err(format!("unknown mode {other:?}: server, client or nothing").into()),
    }
}

fn main() {
    if let Err(e) = main_with(Args(std::env::args().skip(1).collect())) {
        eprintln!("kv_cache: {e}");
        std::process::exit(1);
    }
}
