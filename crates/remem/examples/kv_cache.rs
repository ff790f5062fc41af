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
//! A slot is eight 64-bit words: `lock | version | key | writer | seq | fill | fill | sum`.
//! `version` counts the writes to the slot, `(writer, seq)` names the last one (the
//! writer's `seq`-th PUT of that key), `fill` is derived from the rest, and `sum` is a
//! checksum of words 1..7. Keys below `CAS_KEYS` are PUT by CAS-lock + WRITE, the rest by
//! RPC. (The server writes its RPC slots with plain stores: it takes no lock word, so the
//! two kinds of PUT use different keys.)
//!
//! - `kv_cache` runs both: it starts itself as the server, then runs the client.
//! - `kv_cache server [--listen ADDR] [--device DEV] [--connections N]` serves N client
//!   connections, then exits; it prints `listening ADDR udp PORT` once it listens.
//! - `kv_cache client --connect ADDR [--device DEV] [--connections N] [--tasks M]
//!   [--ops K] [--seed S]`.
//!
//! The two soft devices must use one UDP port: give the client's device the port the
//! server printed (`--device soft@127.0.0.31:PORT`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::{LocalMr, RdmaBuilder, RemoteMr, RpcClient, RpcServer};
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const SLOT: usize = 64;
const CAS_KEYS: u64 = 32;
const KEYS: u64 = 64;
const COUNTERS: usize = 8;
const TABLE: usize = KEYS as usize * SLOT + COUNTERS * 8;
/// The writer of a slot nobody has PUT yet.
const NOBODY: u64 = u64::MAX;
/// The longest either process runs.
const LIMIT: Duration = Duration::from_secs(60);

/// What a slot holds, less its lock word and checksum.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    version: u64,
    key: u64,
    writer: u64,
    seq: u64,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

fn words(bytes: &[u8]) -> Vec<u64> {
    let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().unwrap());
    bytes.chunks_exact(8).map(word).collect()
}

fn bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

impl Entry {
    fn new(version: u64, key: u64, writer: u64, seq: u64) -> Entry {
        Entry {
            version,
            key,
            writer,
            seq,
        }
    }

    /// The entry after this one: the next version, written by `writer`'s PUT `seq`.
    fn next(&self, writer: u64, seq: u64) -> Entry {
        Entry::new(self.version + 1, self.key, writer, seq)
    }

    /// Words 1..8 of its slot.
    fn encode(&self) -> Vec<u8> {
        let fill = mix(self.key ^ mix(self.writer ^ mix(self.seq)));
        let mut w = vec![self.version, self.key, self.writer, self.seq, fill, !fill];
        w.push(w.iter().fold(0x9e37_79b9, |h, &x| mix(h ^ x)));
        bytes(&w)
    }

    /// The entry of a whole slot; `None` if it is torn (its words do not agree).
    fn decode(slot: &[u8]) -> Option<Entry> {
        let [_lock, version, key, writer, seq, ..] = words(slot)[..] else {
            return None;
        };
        let e = Entry::new(version, key, writer, seq);
        (e.encode() == slot[8..]).then_some(e)
    }
}

fn layout(len: usize) -> Layout {
    Layout::from_size_align(len, 64).unwrap()
}

/// Where a slot (or its lock word) starts, and where it ends.
fn slot(key: u64) -> std::ops::Range<usize> {
    key as usize * SLOT..(key as usize + 1) * SLOT
}

fn counter(i: usize) -> std::ops::Range<usize> {
    let at = KEYS as usize * SLOT + i * 8;
    at..at + 8
}

// --- Data access: the few functions that touch slots, remote and local.

/// One task's handle on the server's table: its connection (and RPC client on it), the
/// table, a buffer for one slot.
struct Remote {
    rpc: RpcClient,
    table: RemoteMr,
    buf: LocalMr,
}

impl Remote {
    /// GET: READs the slot until it is not torn; returns the entry and the torn READs.
    async fn get(&mut self, key: u64) -> Res<(Entry, u64)> {
        let (conn, mut torn) = (self.rpc.connection(), 0);
        loop {
            conn.read(&mut self.buf, &self.table.get(slot(key))?)
                .await?;
            match Entry::decode(&self.buf.to_vec()) {
                Some(e) => return Ok((e, torn)),
                None => torn += 1,
            }
        }
    }

    /// PUT by RPC: the server writes the slot; returns the new version.
    async fn put_rpc(&self, key: u64, writer: u64, seq: u64) -> Res<u64> {
        let reply = words(&self.rpc.call(&bytes(&[key, writer, seq])).await?);
        Ok(*reply.first().ok_or("an empty PUT reply")?)
    }

    /// PUT by CAS-lock + WRITE: takes the slot's lock word, reads the slot, writes the next
    /// version, unlocks. Returns the new version and how often the lock was busy.
    async fn put_cas(&mut self, key: u64, writer: u64, seq: u64) -> Res<(u64, u64)> {
        let (rpc, mut busy) = (self.rpc.clone(), 0);
        let conn = rpc.connection();
        let lock = self.table.get(slot(key).start..slot(key).start + 8)?;
        while conn.compare_and_swap(&lock, 0, writer + 1).await? != 0 {
            busy += 1;
            tokio::task::yield_now().await;
        }
        let new = self.get(key).await?.0.next(writer, seq);
        self.buf.write(8, &new.encode())?;
        let body = self.table.get(slot(key).start + 8..slot(key).end)?;
        conn.write(&self.buf.get(8..SLOT)?, &body).await?;
        match conn.compare_and_swap(&lock, writer + 1, 0).await? {
            w if w == writer + 1 => Ok((new.version, busy)),
            w => Err(format!("slot {key}: lock word {w}, writer {writer} had it").into()),
        }
    }

    /// Adds to a counter (fetch-and-add).
    async fn add(&self, i: usize, add: u64) -> Res<u64> {
        let word = self.table.get(counter(i))?;
        Ok(self.rpc.connection().fetch_and_add(&word, add).await?)
    }
}

/// The server's side of a PUT by RPC: writes the slot's next version in its own memory.
fn put_local(table: &LocalMr, request: &[u8]) -> Res<Vec<u8>> {
    let [key, writer, seq] = words(request)[..] else {
        return Err("PUT takes 24 bytes".into());
    };
    if !(CAS_KEYS..KEYS).contains(&key) {
        return Err(format!("key {key} is not PUT by RPC").into());
    }
    let (mut old, at) = ([0; SLOT], slot(key).start);
    table.read(at, &mut old)?;
    let new = Entry::decode(&old).ok_or("a torn slot")?.next(writer, seq);
    table.write(at + 8, &new.encode())?;
    Ok(bytes(&[new.version]))
}

// --- The server.

async fn server(args: &Args) -> Res<()> {
    let connections = args.get("connections", 3)?;
    let device: String = args.get("device", "soft@127.0.0.32:0".into())?;
    let rdma = RdmaBuilder::new().device(device).build()?;
    let table = rdma.alloc_local_mr(layout(TABLE))?;
    for key in 0..KEYS {
        let empty = Entry::new(0, key, NOBODY, 0);
        table.write(slot(key).start + 8, &empty.encode())?;
    }
    // One RPC PUT at a time (the connections' handlers run concurrently).
    let (table, one_put) = (Arc::new(table), Arc::new(Mutex::new(())));
    let listener = rdma
        .listen(args.get("listen", "127.0.0.1:0".to_string())?)
        .await?;
    let udp = rdma.context().info().udp_addr.map_or(0, |a| a.port());
    println!("listening {} udp {udp}", listener.local_addr()?);
    let mut served = Vec::new();
    for _ in 0..connections {
        let (conn, table, one_put) = (listener.accept().await?, table.clone(), one_put.clone());
        conn.share_local_mr(&table).await?;
        let rpc = RpcServer::new(&rdma, conn);
        let put = move |req: Vec<u8>| {
            let _one = one_put.lock().unwrap();
            std::future::ready(put_local(&table, &req).map_err(|e| e.to_string()))
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

async fn task(mut r: Remote, writer: u64, ops: usize, seed: u64) -> Res<Tally> {
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
                let key = rng.random_range(CAS_KEYS..KEYS);
                seen[key as usize] = r.put_rpc(key, writer, t.next_seq(key)).await?;
                t.n[RPC_PUTS] += 1;
            }
            6..8 => {
                let key = rng.random_range(0..CAS_KEYS);
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
fn verify(table: &[u8], tallies: &[Tally]) -> Res<Tally> {
    let mut sum = Tally::default();
    for t in tallies {
        sum.n.iter_mut().zip(t.n).for_each(|(s, n)| *s += n);
    }
    for key in 0..KEYS {
        let at = &table[slot(key).start..slot(key).end];
        let e = Entry::decode(at).ok_or(format!("slot {key} is torn at rest"))?;
        let puts: u64 = tallies.iter().filter_map(|t| t.puts.get(&key)).sum();
        // The last PUT is the last one of the writer it names (or the slot is untouched).
        let last = tallies
            .get(e.writer as usize)
            .and_then(|t| t.puts.get(&key));
        let last_ok = last.map_or(puts == 0 && e.writer == NOBODY, |&seq| seq == e.seq);
        if e.key != key || e.version != puts || words(at)[0] != 0 || !last_ok {
            return Err(format!("slot {key}: {e:?} after {puts} PUTs").into());
        }
        sum.n[SLOTS_VERIFIED] += 1;
    }
    let counters = words(&table[counter(0).start..]);
    for (i, value) in counters.into_iter().enumerate() {
        let adds: u64 = tallies.iter().map(|t| t.adds[i]).sum();
        if value != adds {
            return Err(format!("counter {i}: {value}, expected {adds}").into());
        }
        sum.n[COUNTERS_VERIFIED] += 1;
    }
    Ok(sum)
}

/// Runs the client's tasks, verifies the table, prints and returns the summary.
pub(crate) async fn client(args: &Args) -> Res<Tally> {
    let device: String = args.get("device", "soft@127.0.0.31:0".into())?;
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
            let rpc = rpc.clone();
            let r = Remote {
                rpc,
                table,
                buf: rdma.alloc_local_mr(layout(SLOT))?,
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
    let sum = verify(&all.to_vec(), &tallies)?;
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
        self.0.first().map_or("", |m| m.as_str())
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
/// it, its TCP address and its device's UDP port.
pub(crate) fn spawn_server(mut cmd: Command) -> Res<(Child, SocketAddr, u16)> {
    let mut child = cmd.stdout(Stdio::piped()).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("listening "));
    let line = line.ok_or("the server did not say where it listens")?;
    let ["listening", addr, "udp", udp] = line.split(' ').collect::<Vec<_>>()[..] else {
        return Err(format!("not an address and port: {line}").into());
    };
    std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .for_each(|l| println!("server: {l}"))
    });
    Ok((child, addr.parse()?, udp.parse()?))
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
            let (mut child, addr, udp) = spawn_server(cmd)?;
            let device = format!("soft@127.0.0.31:{udp}");
            args.0.extend([
                "--connect".into(),
                addr.to_string(),
                "--device".into(),
                device,
            ]);
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
