//! One member of a full mesh of RC connections through the RDMA connection manager, on one
//! soft device shared by every member process (the host's NIC: `soft@127.0.0.1`, UDP port
//! 4791). It meshes with the C program `crates/remem-ibv/tests/c/mesh.c` on the drop-in
//! librdmacm, which speaks the same protocol; the drop-in's test `mesh` runs both kinds
//! together and kills one member mid-run.
//!
//! ```text
//! cargo run -p remem --example mesh -- ID N BASE_PORT M [K] [--device soft@127.0.0.1]
//! ```
//!
//! Member ID of N listens on 127.0.0.1:(BASE_PORT + ID) ([`Rdma::listen_cm`]), connects to
//! every member j > ID (which listens already) and accepts every j < ID: one connection per
//! pair, the member's id (big-endian u32) in each side's private data. On each connection
//! both sides send M messages, message `seq` from `s` to `r` being [`message`]`(s, r, seq)`
//! — `s`, `seq` (big-endian u32s), then [`msg_byte`]s, [`msg_len`] bytes in all — then,
//! once they have all of the peer's, a FIN (`s`, `M`: 8 bytes), then, once they have the
//! peer's FIN, a BYE (`s`, `M + 1`). A connection is done once the peer's FIN is in (every
//! message of the peer's checked); a side closes it once the peer's BYE is in (the peer
//! has everything too). The BYE is there because a close can overtake messages: the
//! peer's DREQ and its last SENDs reach this side on different channels (the CM's events,
//! the completion queue), and remem closes the connection on the DREQ even if a message
//! that arrived before it has not been polled yet — so nothing a side still waits for may
//! be in flight when the other closes. Every byte received is checked. With K, the member
//! sends only K messages on each connection, prints "stalled" once they are all in, and
//! waits.
//!
//! remem's message layer is the wire protocol (`remem::Connection::send_bytes`,
//! `receive`): each SEND carries remem's 8-byte header (kind, flags, credits returned,
//! immediate), each side grants the other [`WINDOW`] receive credits in the CM's private
//! data (remem's 16 bytes of extras in front of the application's), and returns them as it
//! takes messages — the C member implements exactly that.
//!
//! Output, a line each: `mesh ID: listening on …`, `mesh ID: connected to N-1 peers`, per
//! peer `mesh ID: peer j done, B bytes verified` or, when the connection closes or fails
//! before it is done, `mesh ID: peer j gone at T us (D ms after its last message, WHY), B
//! bytes verified` (T: the wall clock in microseconds since the epoch), then `mesh ID: ok
//! B bytes verified from P peers, G gone` (exit 0), or `mesh ID: FAIL …` (exit 1). The
//! whole run is bounded by [`LIMIT`].

use remem::{ConnectOptions, Connection, Error, Rdma, RdmaBuilder};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The largest message (remem's `max_message`): the C member's receive buffers hold as
/// much after the header.
pub const MAX_MESSAGE: usize = 4096;
/// The receive credits each side grants (remem's `recv_depth`).
pub const WINDOW: u32 = 16;
/// The longest a member runs.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A member's command line.
#[derive(Debug, Clone)]
pub struct Args {
    /// Its id, 0..n.
    pub id: u32,
    /// Members in the mesh.
    pub n: u32,
    /// Member i listens on CM port `base + i`.
    pub base: u16,
    /// Messages each way on each connection.
    pub m: u32,
    /// Sends only this many messages per connection, then waits (to be killed).
    pub stall: Option<u32>,
    /// The device (`soft@127.0.0.1`: the host's shared device on port 4791).
    pub device: String,
}

impl Args {
    /// Parses `ID N BASE_PORT M [K] [--device DEV]`.
    pub fn parse(args: &[String]) -> Result<Args, String> {
        let mut device = "soft@127.0.0.1".to_string();
        let mut pos = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--device" {
                device = it.next().ok_or("--device needs a value")?.clone();
            } else {
                pos.push(a.as_str());
            }
        }
        let num = |i: usize| -> Result<u32, String> {
            pos.get(i)
                .ok_or("usage: mesh ID N BASE_PORT M [K] [--device DEV]")?
                .parse()
                .map_err(|e| format!("argument {}: {e}", i + 1))
        };
        let a = Args {
            id: num(0)?,
            n: num(1)?,
            base: u16::try_from(num(2)?).map_err(|e| e.to_string())?,
            m: num(3)?,
            stall: if pos.len() > 4 { Some(num(4)?) } else { None },
            device,
        };
        if a.id >= a.n || a.m == 0 || a.stall.is_some_and(|k| k >= a.m) {
            return Err(format!("bad arguments {args:?}"));
        }
        Ok(a)
    }
}

/// The length of message `seq` from `s` to `r`: 16 to [`MAX_MESSAGE`] bytes.
pub fn msg_len(s: u32, r: u32, seq: u32) -> usize {
    let h = s
        .wrapping_mul(977)
        .wrapping_add(r.wrapping_mul(331))
        .wrapping_add(seq.wrapping_mul(2713));
    16 + (h % (MAX_MESSAGE as u32 - 16 + 1)) as usize
}

/// Byte `k` (8 or more) of message `seq` from `s` to `r`.
pub fn msg_byte(s: u32, r: u32, seq: u32, k: usize) -> u8 {
    let k = k as u32;
    (k.wrapping_mul(131) ^ (seq.wrapping_mul(7) + s * 29 + r * 53) ^ (k >> 8)) as u8
}

/// Message `seq` from `s` to `r` of a mesh of `m` messages (`seq == m`: the FIN,
/// `m + 1`: the BYE).
pub fn message(s: u32, r: u32, seq: u32, m: u32) -> Vec<u8> {
    let len = if seq < m { msg_len(s, r, seq) } else { 8 };
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&s.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend((8..len).map(|k| msg_byte(s, r, seq, k)));
    b
}

/// Why an exchange stopped.
enum Stop {
    /// The connection closed or failed.
    Lost(Error),
    /// A message was not what the protocol says.
    Bad(String),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Lost(e)
    }
}

fn wall_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Checks message `seq` from `peer` to `me`.
fn check(peer: u32, me: u32, seq: u32, m: u32, data: &[u8]) -> Result<(), Stop> {
    let want = message(peer, me, seq, m);
    if data == want.as_slice() {
        return Ok(());
    }
    let at = (data.iter().zip(&want))
        .position(|(a, b)| a != b)
        .unwrap_or(data.len().min(want.len()));
    Err(Stop::Bad(format!(
        "message {seq}: {} bytes, want {}; first difference at byte {at}",
        data.len(),
        want.len()
    )))
}

/// What became of one connection.
enum Outcome {
    Done(u64),
    Gone(u64),
}

/// The exchange on the connection to `peer`.
async fn exchange(
    a: &Args,
    peer: u32,
    conn: Connection,
    stalled: tokio::sync::mpsc::UnboundedSender<()>,
) -> Result<Outcome, String> {
    let me = a.id;
    let mut bytes = 0u64;
    let mut last = Instant::now();
    let send = async {
        for seq in 0..a.stall.unwrap_or(a.m) {
            conn.send_bytes(message(me, peer, seq, a.m)).await?;
        }
        let _ = stalled.send(());
        Ok::<(), Stop>(())
    };
    let recv = async {
        for seq in 0..a.m {
            let msg = conn.receive().await?;
            check(peer, me, seq, a.m, &msg.data)?;
            bytes += msg.data.len() as u64;
            last = Instant::now();
        }
        Ok::<(), Stop>(())
    };
    let (sent, received) = tokio::join!(send, recv);
    let mut r = received.and(sent);
    if r.is_ok() && a.stall.is_some() {
        // Killed here.
        std::future::pending::<()>().await;
    }
    if r.is_ok() {
        r = async {
            conn.send_bytes(message(me, peer, a.m, a.m)).await?;
            let fin = conn.receive().await?;
            check(peer, me, a.m, a.m, &fin.data)
        }
        .await;
    }
    match r {
        Ok(()) => {
            // Everything is in; the BYEs tell when the peer has everything too. A close by
            // the peer (once it has this side's BYE) may come first.
            let bye = async {
                conn.send_bytes(message(me, peer, a.m + 1, a.m)).await?;
                let bye = conn.receive().await?;
                check(peer, me, a.m + 1, a.m, &bye.data)
            };
            match bye.await {
                Ok(()) => conn.close().await,
                Err(Stop::Lost(_)) => {}
                Err(Stop::Bad(why)) => return Err(format!("peer {peer}: {why}")),
            }
            println!("mesh {me}: peer {peer} done, {bytes} bytes verified");
            Ok(Outcome::Done(bytes))
        }
        Err(Stop::Lost(e)) => {
            println!(
                "mesh {me}: peer {peer} gone at {} us ({} ms after its last message, {e}), \
                 {bytes} bytes verified",
                wall_us(),
                last.elapsed().as_millis()
            );
            Ok(Outcome::Gone(bytes))
        }
        Err(Stop::Bad(why)) => Err(format!("peer {peer}: {why}")),
    }
}

/// The connections to every other member: made to every j > id, accepted from every j < id.
async fn connect_all(rdma: &Rdma, a: &Args) -> Result<Vec<(u32, Connection)>, String> {
    let cm = |i: u32| SocketAddr::from((Ipv4Addr::LOCALHOST, a.base + i as u16));
    let listener = rdma
        .listen_cm(cm(a.id))
        .await
        .map_err(|e| format!("listening on {}: {e}", cm(a.id)))?;
    println!("mesh {}: listening on {}", a.id, cm(a.id));
    let opts = ConnectOptions {
        private_data: a.id.to_be_bytes().to_vec(),
        ..ConnectOptions::default()
    };
    let mut out = Vec::new();
    let mut connecting = tokio::task::JoinSet::new();
    for j in a.id + 1..a.n {
        let (rdma, opts, to) = (rdma.clone(), opts.clone(), cm(j));
        connecting.spawn(async move { (j, rdma.connect_cm_with(to, &opts).await) });
    }
    for _ in 0..a.id {
        let req = listener
            .next_request()
            .await
            .map_err(|e| format!("a connection request: {e}"))?;
        let pd = req.private_data();
        let peer = u32::from_be_bytes(pd.get(..4).ok_or("no id")?.try_into().unwrap());
        if peer >= a.id || out.iter().any(|(p, _)| *p == peer) {
            return Err(format!("a connection request from member {peer}"));
        }
        let conn = req
            .accept(&opts)
            .await
            .map_err(|e| format!("accepting member {peer}: {e}"))?;
        out.push((peer, conn));
    }
    while let Some(joined) = connecting.join_next().await {
        let (j, r) = joined.map_err(|e| e.to_string())?;
        let conn = r.map_err(|e| format!("connecting to member {j}: {e}"))?;
        if conn.peer_private_data().get(..4) != Some(&j.to_be_bytes()[..]) {
            return Err(format!("member {j} answered with another id"));
        }
        out.push((j, conn));
    }
    Ok(out)
}

/// Runs member `a`: `Ok` with the summary line once every connection is done or gone.
pub async fn run(a: Args) -> Result<String, String> {
    let rdma = RdmaBuilder::new()
        .device(&a.device)
        .max_message(MAX_MESSAGE)
        .recv_depth(WINDOW)
        .build()
        .map_err(|e| format!("{}: {e}", a.device))?;
    let conns = connect_all(&rdma, &a).await?;
    println!("mesh {}: connected to {} peers", a.id, conns.len());
    let (stalled_tx, mut stalled_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    for (peer, conn) in conns {
        let (a, tx) = (a.clone(), stalled_tx.clone());
        tasks.spawn(async move { exchange(&a, peer, conn, tx).await });
    }
    drop(stalled_tx);
    if let Some(k) = a.stall {
        for _ in 1..a.n {
            stalled_rx.recv().await;
        }
        println!("mesh {}: stalled after {k} messages to each peer", a.id);
    }
    let (mut total, mut done, mut gone, mut failed) = (0, 0, 0, Vec::new());
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(Outcome::Done(b)) => (total, done) = (total + b, done + 1),
            Ok(Outcome::Gone(b)) => (total, gone) = (total + b, gone + 1),
            Err(e) => failed.push(e),
        }
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    Ok(format!(
        "mesh {}: ok {total} bytes verified from {done} peers, {gone} gone",
        a.id
    ))
}

/// Runs the member of `args` to its end (bounded by [`LIMIT`]); the exit status.
pub fn main_with(args: &[String]) -> i32 {
    let a = match Args::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mesh: {e}");
            return 2;
        }
    };
    let id = a.id;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(async { tokio::time::timeout(LIMIT, run(a)).await }) {
        Ok(Ok(line)) => {
            println!("{line}");
            0
        }
        Ok(Err(e)) => {
            println!("mesh {id}: FAIL {e}");
            1
        }
        Err(_) => {
            println!("mesh {id}: FAIL not finished within {LIMIT:?}");
            1
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(main_with(&args));
}
