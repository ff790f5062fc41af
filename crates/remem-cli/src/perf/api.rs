//! The benchmarks through the async `remem` API (`--api`): the same tests as the raw
//! provider, written as an application would write them — `Rdma`, `Connection`, pool
//! memory, batches for bandwidth, `async fn` per operation — to show what the API costs.
//!
//! The endpoint exchange uses the control connection (`PreparedConnection`), each side
//! shares its receive area with `share_local_mr`, and completions are collected by a
//! busy-polling dispatcher thread.

use super::ctrl::{self, Ctrl, Cursor};
use super::raw::{Tally, run_limit};
use super::report::{self, Row};
use super::{AtomicType, Device, Output, PerfError, Settings, Test};
use remem::{Connection, EndpointInfo, LocalMr, Polling, Rdma, RdmaBuilder, RemoteMr};
use std::alloc::Layout;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Bytes of read targets in flight at most (READ lanes each need a region of their own).
const READ_BUDGET: u64 = 64 << 20;

fn e(what: &'static str) -> impl Fn(remem::Error) -> PerfError {
    move |err| format!("{what}: {err}")
}

fn layout(size: u64) -> Result<Layout, PerfError> {
    Layout::from_size_align(size.max(8) as usize, 8).map_err(|err| err.to_string())
}

/// One concurrent strand of work within a task.
type Lane<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), PerfError>> + 'a>>;

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Runs the futures concurrently on this task until all are done; the first error wins.
async fn join_all<F: Future<Output = Result<(), PerfError>>>(fs: Vec<F>) -> Result<(), PerfError> {
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut first_err = None;
    std::future::poll_fn(|cx| {
        fs.retain_mut(|f| match f.as_mut().poll(cx) {
            Poll::Ready(r) => {
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
                false
            }
            Poll::Pending => true,
        });
        if fs.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    first_err.map_or(Ok(()), Err)
}

/// One side: its device, connections, and its receive area per connection.
struct Side<'a> {
    rdma: &'a Rdma,
    conns: &'a [Connection],
    recv: Vec<LocalMr>,
    remote: Vec<RemoteMr>,
}

/// The device and connected connections of one side; `true` when this task drives the
/// device (`Polling::Manual` on a soft device without a progress thread).
async fn connect(
    ctrl: &mut Ctrl,
    s: &Settings,
    dev: &Device,
    server: bool,
) -> Result<(Rdma, Vec<Connection>, bool), PerfError> {
    let manual = dev.soft.is_some();
    let b = RdmaBuilder::new()
        .context(dev.ctx.clone())
        .gid_index(dev.gid_index)
        .polling(if manual {
            Polling::Manual
        } else {
            Polling::Busy
        })
        .keepalive(None)
        // Messages of the run's largest size must be taken (16 MiB by default).
        .max_large_message(
            usize::try_from(s.max_size())
                .unwrap_or(usize::MAX)
                .max(16 << 20),
        )
        .cq_size(4 * s.tx_depth + 256)
        .qp_cap(remem::verbs::QpCap {
            max_send_wr: s.tx_depth.max(16),
            max_recv_wr: 64,
            max_send_sge: 8,
            max_recv_sge: 1,
            max_inline_data: s.inline_size,
        });
    let rdma = b.build().map_err(e("opening the device"))?;
    let prepared: Vec<_> = (0..s.qps)
        .map(|_| rdma.prepare())
        .collect::<Result<_, _>>()
        .map_err(e("prepare"))?;
    let mut mine = Vec::new();
    for p in &prepared {
        mine.extend_from_slice(&p.local_info().to_bytes());
    }
    let theirs = block(|| -> Result<Vec<u8>, PerfError> {
        if server {
            ctrl.send(ctrl::ENDPOINTS, &mine)?;
            ctrl.expect(ctrl::ENDPOINTS)
        } else {
            let t = ctrl.expect(ctrl::ENDPOINTS)?;
            ctrl.send(ctrl::ENDPOINTS, &mine)?;
            Ok(t)
        }
    })?;
    let n = remem::ENDPOINT_INFO_LEN;
    if theirs.len() != n * prepared.len() {
        return Err("the peer has a different number of QPs".into());
    }
    let mut conns = Vec::new();
    for (p, info) in prepared.into_iter().zip(theirs.chunks(n)) {
        let info = EndpointInfo::from_bytes(info).map_err(e("endpoint information"))?;
        conns.push(p.connect(info).map_err(e("connect"))?);
    }
    Ok((rdma, conns, manual))
}

/// Each side shares a receive area per connection with its peer.
async fn share_areas<'a>(
    rdma: &'a Rdma,
    conns: &'a [Connection],
    s: &Settings,
) -> Result<Side<'a>, PerfError> {
    let area = layout(s.max_size())?;
    let mut recv = Vec::new();
    for c in conns {
        let mr = rdma.alloc_local_mr(area).map_err(e("alloc_local_mr"))?;
        c.share_local_mr(&mr).await.map_err(e("share_local_mr"))?;
        recv.push(mr);
    }
    let mut remote = Vec::new();
    for c in conns {
        remote.push(
            c.receive_shared_mr()
                .await
                .map_err(e("receive_shared_mr"))?,
        );
    }
    Ok(Side {
        rdma,
        conns,
        recv,
        remote,
    })
}

/// What [`driven`] moves between polls of the benchmark's future.
trait Drive {
    /// Moves packets and handles the completions that have arrived; returns how many
    /// completions.
    fn completions(&self) -> usize;
    /// Moves packets, waiting up to `wait` for one when there is nothing to do (returns
    /// at once when something moved, is ready to send, or a packet arrives).
    fn idle(&self, wait: Duration);
}

/// An inline soft device and the connections on it: this task is their dispatcher.
struct Manual<'a> {
    conns: &'a [Connection],
    soft: &'a remem_soft::SoftContext,
}

impl Drive for Manual<'_> {
    fn completions(&self) -> usize {
        self.conns.iter().map(Connection::poll_completions).sum()
    }

    fn idle(&self, wait: Duration) {
        // Fails only for a device with a progress thread, which has no `Manual` driver
        // (`poll_completions` drives the device too, and warns if that fails).
        let _ = self.soft.progress(wait);
    }
}

/// How long a bandwidth run's driver waits in the device when a round found nothing to
/// do, as the raw path's bandwidth loop does (`raw::bandwidth`); a packet ends the wait at
/// once. Latency runs spin, as the raw path's do.
const IDLE_WAIT: Duration = Duration::from_micros(200);

/// Runs `fut`; with a driver, moves the connections' packets and completions between
/// its polls (this task is their dispatcher). A round that handled no completion waits
/// in the device (`idle`, up to `idle` long, ended by the next packet) instead of
/// spinning: the two ends of `--loopback` and the host's other work share the CPUs, and
/// a side that spins while it waits for its peer takes the time its peer needs to answer
/// (on two cores under load, API bandwidth fell to a tenth of the raw path's, in stalls
/// of 60–110 ms with not one packet lost).
async fn driven<T>(driver: Option<&dyn Drive>, idle: Duration, fut: impl Future<Output = T>) -> T {
    let Some(driver) = driver else {
        return fut.await;
    };
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let handled = driver.completions();
        match fut.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready(v),
            Poll::Pending => {
                if handled == 0 && !idle.is_zero() {
                    driver.idle(idle);
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    })
    .await
}

/// The driver of a side whose task drives its device (`manual`), if it does.
fn driver<'a>(dev: &'a Device, conns: &'a [Connection], manual: bool) -> Option<Manual<'a>> {
    let soft = dev.soft.as_deref().filter(|_| manual)?;
    Some(Manual { conns, soft })
}

/// How long an idle round of `s`'s test waits in the device (see [`driven`]).
fn idle_wait(s: &Settings) -> Duration {
    if s.test.is_bw() {
        IDLE_WAIT
    } else {
        Duration::ZERO
    }
}

/// The next control frame (within `limit`), waited for on another thread so this task
/// keeps driving.
async fn recv(ctrl: &mut Ctrl, limit: Option<Duration>) -> Result<(u8, Vec<u8>), PerfError> {
    let mut c = ctrl.try_clone()?;
    tokio::task::spawn_blocking(move || c.recv_within(limit))
        .await
        .map_err(|err| err.to_string())?
}

/// The next control frame, which must carry `tag`, within `limit`.
async fn expect(ctrl: &mut Ctrl, tag: u8, limit: Option<Duration>) -> Result<Vec<u8>, PerfError> {
    let (got, payload) = recv(ctrl, limit).await?;
    ctrl::check_tag(got, tag)?;
    Ok(payload)
}

fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Waits until the last byte of `mr`'s first `size` bytes is `m`. The server passes its
/// control connection: nothing comes on it during a ping-pong but news that the client
/// gave up (or vanished), so a lost ping cannot hang the server.
async fn wait_byte(
    mr: &LocalMr,
    size: u64,
    m: u8,
    mut ctrl: Option<&mut Ctrl>,
) -> Result<(), PerfError> {
    let mut b = [0u8];
    let mut spins = 0u32;
    loop {
        mr.read(size as usize - 1, &mut b).map_err(e("read"))?;
        if b[0] == m {
            return Ok(());
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096)
            && let Some(c) = ctrl.as_deref_mut()
            && let Some((tag, _)) = c.try_recv()?
        {
            return Err(format!(
                "control: unexpected frame {tag} during a ping-pong"
            ));
        }
        tokio::task::yield_now().await;
    }
}

/// The server.
pub(crate) fn server(mut ctrl: Ctrl, s: &Settings, dev: &Device) -> Result<(), PerfError> {
    let rt = super::runtime()?;
    let result = rt.block_on(serve(&mut ctrl, s, dev));
    if let Err(err) = &result {
        ctrl.fail(err);
    }
    result
}

async fn serve(ctrl: &mut Ctrl, s: &Settings, dev: &Device) -> Result<(), PerfError> {
    let (rdma, conns, manual) = connect(ctrl, s, dev, true).await?;
    let d = driver(dev, &conns, manual);
    let d = d.as_ref().map(|d| d as &dyn Drive);
    driven(d, idle_wait(s), serve_sizes(ctrl, s, &rdma, &conns)).await
}

async fn serve_sizes(
    ctrl: &mut Ctrl,
    s: &Settings,
    rdma: &Rdma,
    conns: &[Connection],
) -> Result<(), PerfError> {
    let side = share_areas(rdma, conns, s).await?;
    block(|| ctrl.send(ctrl::READY, &[]))?;
    let src = side
        .rdma
        .alloc_local_mr(layout(s.max_size())?)
        .map_err(e("alloc"))?;
    loop {
        let t = Some(ctrl.timeout());
        let mut received = 0;
        let (tag, payload) = recv(ctrl, t).await?;
        match tag {
            ctrl::DONE => return Ok(()),
            ctrl::START => {}
            other => return Err(format!("control: unexpected frame {other}")),
        }
        let size = Cursor(&payload).u64().ok_or("malformed START")?;
        block(|| ctrl.send(ctrl::READY, &[]))?;
        match s.test {
            Test::WriteLat => {
                let (c, recv, remote) = (&side.conns[0], &side.recv[0], &side.remote[0]);
                let dst = remote.get(0..size as usize).map_err(e("range"))?;
                let view = src.get(0..size as usize).map_err(e("range"))?;
                for i in 0..s.iters {
                    let m = marker(i);
                    wait_byte(recv, size, m, Some(&mut *ctrl)).await?;
                    src_last(&src, size, m)?;
                    c.write(&view, &dst).await.map_err(e("write"))?;
                }
                expect(ctrl, ctrl::DONE, t).await?;
            }
            Test::SendLat => {
                let c = &side.conns[0];
                let src = src.get(0..size as usize).map_err(e("range"))?;
                for _ in 0..s.iters {
                    c.receive().await.map_err(e("receive"))?;
                    c.send(&src).await.map_err(e("send"))?;
                }
                expect(ctrl, ctrl::DONE, t).await?;
            }
            Test::SendBw => {
                // Every connection receives until the client has said how many it sent
                // (all of them completed there, so all arrive here) and all are taken.
                let got = std::sync::atomic::AtomicU64::new(0);
                let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                let mut all: Vec<Lane<'_>> = Vec::new();
                for c in side.conns {
                    let (got, mut stop) = (&got, stop_rx.clone());
                    all.push(Box::pin(async move {
                        loop {
                            tokio::select! {
                                r = c.receive() => {
                                    r.map_err(e("receive"))?;
                                    got.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                                _ = stop.changed() => return Ok(()),
                            }
                        }
                    }));
                }
                let mut ctrl2 = ctrl.try_clone()?;
                let limit = run_limit(s, ctrl);
                let got_ref = &got;
                all.push(Box::pin(async move {
                    let got = got_ref;
                    let (tag, p) = tokio::task::spawn_blocking(move || ctrl2.recv_within(limit))
                        .await
                        .map_err(|err| err.to_string())??;
                    if tag != ctrl::DONE {
                        return Err(format!("control: unexpected frame {tag}"));
                    }
                    let total = Cursor(&p).u64().ok_or("malformed DONE")?;
                    while got.load(std::sync::atomic::Ordering::Relaxed) < total {
                        tokio::task::yield_now().await;
                    }
                    let _ = stop_tx.send(true);
                    Ok(())
                }));
                join_all(all).await?;
                received = got.into_inner();
            }
            _ => {
                expect(ctrl, ctrl::DONE, run_limit(s, ctrl)).await?;
            }
        }
        let tally = Tally {
            received,
            sent: 0,
            row: None,
        };
        block(|| ctrl.send(ctrl::RESULT, &tally.encode()))?;
    }
}

fn src_last(src: &LocalMr, size: u64, m: u8) -> Result<(), PerfError> {
    src.write(size as usize - 1, &[m]).map_err(e("write"))
}

/// The client.
pub(crate) fn client(
    mut ctrl: Ctrl,
    s: &Settings,
    dev: &Device,
    out: &mut Output,
) -> Result<Vec<Row>, PerfError> {
    let rt = super::runtime()?;
    let result = rt.block_on(run(&mut ctrl, s, dev, out));
    if let Err(err) = &result {
        ctrl.fail(err);
    }
    result
}

async fn run(
    ctrl: &mut Ctrl,
    s: &Settings,
    dev: &Device,
    out: &mut Output,
) -> Result<Vec<Row>, PerfError> {
    let (rdma, conns, manual) = connect(ctrl, s, dev, false).await?;
    let d = driver(dev, &conns, manual);
    let d = d.as_ref().map(|d| d as &dyn Drive);
    driven(d, idle_wait(s), run_sizes(ctrl, s, &rdma, &conns, out)).await
}

async fn run_sizes(
    ctrl: &mut Ctrl,
    s: &Settings,
    rdma: &Rdma,
    conns: &[Connection],
    out: &mut Output,
) -> Result<Vec<Row>, PerfError> {
    let side = share_areas(rdma, conns, s).await?;
    let t = Some(ctrl.timeout());
    expect(ctrl, ctrl::READY, t).await?;
    let mut rows = Vec::new();
    for &size in &s.sizes {
        block(|| ctrl.send(ctrl::START, &size.to_be_bytes()))?;
        expect(ctrl, ctrl::READY, t).await?;
        let (row, count) = if s.test.is_bw() {
            let (r, n) = bandwidth(&side, s, size).await?;
            (Row::Bw(r), n)
        } else {
            let r = latency(&side, s, size).await?;
            (Row::Lat(r), r.iterations)
        };
        block(|| ctrl.send(ctrl::DONE, &count.to_be_bytes()))?;
        let p = expect(ctrl, ctrl::RESULT, t).await?;
        let tally = Tally::decode(&p).ok_or("malformed RESULT")?;
        if s.test == Test::SendBw && tally.received != count {
            return Err(format!(
                "the server received {} of the {count} messages sent",
                tally.received
            ));
        }
        out.row(s, &row);
        rows.push(row);
    }
    block(|| ctrl.send(ctrl::DONE, &0u64.to_be_bytes()))?;
    Ok(rows)
}

/// Shared by the lanes of a bandwidth run.
struct Meter {
    start: Instant,
    deadline: Option<Instant>,
    done: std::sync::atomic::AtomicU64,
    marks: std::sync::Mutex<Vec<(f64, u64)>>,
}

impl Meter {
    fn completed(&self, n: u64) {
        let done = self.done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
        let t = self.start.elapsed().as_secs_f64();
        self.marks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((t, done));
    }

    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// A bandwidth run: per connection, `tx_depth / batch` lanes each posting a batch of
/// `batch` operations and awaiting it (WRITE, READ), or `tx_depth` lanes of single
/// operations (atomics, SEND).
async fn bandwidth(
    side: &Side<'_>,
    s: &Settings,
    size: u64,
) -> Result<(report::BwRow, u64), PerfError> {
    let cq_mod = (s.tx_depth / 2).clamp(1, 64) as u64;
    let meter = Meter {
        start: Instant::now(),
        deadline: s.duration.map(|d| Instant::now() + d),
        done: 0.into(),
        marks: std::sync::Mutex::new(Vec::new()),
    };
    let per_conn = if s.duration.is_some() {
        u64::MAX
    } else {
        s.iters
    };
    let src = side
        .rdma
        .alloc_local_mr(layout(size)?)
        .map_err(e("alloc"))?;
    let src = src.get(0..size as usize).map_err(e("range"))?;
    let mut lanes: Vec<Lane<'_>> = Vec::new();
    for (c, remote) in side.conns.iter().zip(&side.remote) {
        let dst = remote.get(0..size as usize).map_err(e("range"))?;
        match s.test {
            Test::WriteBw => {
                let n_lanes = (u64::from(s.tx_depth) / cq_mod).max(1);
                for l in 0..n_lanes {
                    let quota = share(per_conn, n_lanes, l);
                    let (meter, dst) = (&meter, dst);
                    lanes.push(Box::pin(async move {
                        let mut left = quota;
                        while left > 0 && !meter.over() {
                            let k = cq_mod.min(left);
                            let mut batch = c.batch();
                            for _ in 0..k {
                                batch.write(&src, &dst).map_err(e("batch"))?;
                            }
                            batch.submit().await.map_err(e("write"))?;
                            meter.completed(k);
                            left -= k;
                        }
                        Ok(())
                    }));
                }
            }
            Test::ReadBw => {
                let n_lanes = u64::from(s.tx_depth)
                    .min((READ_BUDGET / size).max(1))
                    .max(1);
                for l in 0..n_lanes {
                    let quota = share(per_conn, n_lanes, l);
                    let mut target = side
                        .rdma
                        .alloc_local_mr(layout(size)?)
                        .map_err(e("alloc"))?;
                    let (meter, dst) = (&meter, dst);
                    lanes.push(Box::pin(async move {
                        let mut left = quota;
                        while left > 0 && !meter.over() {
                            let mut t = target.get_mut(0..size as usize).map_err(e("range"))?;
                            c.read(&mut t, &dst).await.map_err(e("read"))?;
                            meter.completed(1);
                            left -= 1;
                        }
                        Ok(())
                    }));
                }
            }
            Test::AtomicBw | Test::SendBw => {
                let n_lanes =
                    u64::from(s.tx_depth).min(if s.test == Test::AtomicBw { 16 } else { 64 });
                let word = remote.get(0..8).map_err(e("range"))?;
                for l in 0..n_lanes {
                    let quota = share(per_conn, n_lanes, l);
                    let (meter, test, atomic) = (&meter, s.test, s.atomic);
                    lanes.push(Box::pin(async move {
                        let mut left = quota;
                        while left > 0 && !meter.over() {
                            match (test, atomic) {
                                (Test::SendBw, _) => c.send(&src).await.map(drop),
                                (_, AtomicType::FetchAndAdd) => {
                                    c.fetch_and_add(&word, 1).await.map(drop)
                                }
                                (_, AtomicType::CmpAndSwap) => {
                                    c.compare_and_swap(&word, 0, 0).await.map(drop)
                                }
                            }
                            .map_err(e("operation"))?;
                            meter.completed(1);
                            left -= 1;
                        }
                        Ok(())
                    }));
                }
            }
            _ => return Err("a latency test in the bandwidth runner".into()),
        }
    }
    join_all(lanes).await?;
    let marks = meter.marks.into_inner().unwrap_or_else(|p| p.into_inner());
    let done = meter.done.into_inner();
    Ok((report::bw_row(size, &marks), done))
}

/// Lane `l` of `lanes`'s share of `total` operations.
fn share(total: u64, lanes: u64, l: u64) -> u64 {
    if total == u64::MAX {
        return u64::MAX;
    }
    total / lanes + u64::from(l < total % lanes)
}

async fn latency(side: &Side<'_>, s: &Settings, size: u64) -> Result<report::LatRow, PerfError> {
    let (c, recv, remote) = (&side.conns[0], &side.recv[0], &side.remote[0]);
    let dst = remote.get(0..size as usize).map_err(e("range"))?;
    let src_mr = side
        .rdma
        .alloc_local_mr(layout(size)?)
        .map_err(e("alloc"))?;
    let src = src_mr.get(0..size as usize).map_err(e("range"))?;
    let mut target = side
        .rdma
        .alloc_local_mr(layout(size)?)
        .map_err(e("alloc"))?;
    let word = remote.get(0..8).map_err(e("range"))?;
    let iters = if s.duration.is_some() {
        u64::MAX
    } else {
        s.iters
    };
    let deadline = s.duration.map(|d| Instant::now() + d);
    let mut samples = Vec::with_capacity(iters.min(1 << 24) as usize);
    for i in 0..iters {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let t0 = Instant::now();
        match s.test {
            Test::WriteLat => {
                let m = marker(i);
                src_last(&src_mr, size, m)?;
                let t0 = Instant::now();
                c.write(&src, &dst).await.map_err(e("write"))?;
                wait_byte(recv, size, m, None).await?;
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                continue;
            }
            Test::SendLat => {
                c.send(&src).await.map_err(e("send"))?;
                c.receive().await.map_err(e("receive"))?;
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                continue;
            }
            Test::ReadLat => {
                let mut t = target.get_mut(0..size as usize).map_err(e("range"))?;
                c.read(&mut t, &dst).await.map_err(e("read"))?;
            }
            _ => {
                match s.atomic {
                    AtomicType::FetchAndAdd => c.fetch_and_add(&word, 1).await,
                    AtomicType::CmpAndSwap => c.compare_and_swap(&word, 0, 0).await,
                }
                .map_err(e("atomic"))?;
            }
        }
        samples.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(report::lat_row(size, &mut samples))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A device that hands out `per_round` completions each round and records the waits
    /// asked of it.
    struct Fake {
        per_round: usize,
        rounds: Cell<usize>,
        waits: RefCell<Vec<Duration>>,
    }

    impl Fake {
        fn new(per_round: usize) -> Self {
            Fake {
                per_round,
                rounds: Cell::new(0),
                waits: RefCell::new(Vec::new()),
            }
        }
    }

    impl Drive for Fake {
        fn completions(&self) -> usize {
            self.rounds.set(self.rounds.get() + 1);
            self.per_round
        }

        fn idle(&self, wait: Duration) {
            self.waits.borrow_mut().push(wait);
        }
    }

    /// A future that is pending `n` times, then done.
    fn pending_for(n: usize) -> impl Future<Output = ()> {
        let mut left = n;
        std::future::poll_fn(move |_| {
            if left == 0 {
                Poll::Ready(())
            } else {
                left -= 1;
                Poll::Pending
            }
        })
    }

    fn run(d: &Fake, idle: Duration, n: usize) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(driven(Some(d as &dyn Drive), idle, pending_for(n)));
    }

    /// A bandwidth round that found nothing to do waits in the device (which a packet
    /// ends) instead of spinning: a spinning side took the CPU its loopback peer needed
    /// (API bandwidth at a tenth of the raw path's on two loaded cores).
    #[test]
    fn an_idle_round_waits_in_the_device() {
        let d = Fake::new(0);
        run(&d, IDLE_WAIT, 3);
        assert_eq!(d.rounds.get(), 4);
        assert_eq!(*d.waits.borrow(), vec![IDLE_WAIT; 3]);
    }

    /// A round that handled completions goes straight on (more may be there).
    #[test]
    fn a_busy_round_does_not_wait() {
        let d = Fake::new(2);
        run(&d, IDLE_WAIT, 3);
        assert_eq!(d.rounds.get(), 4);
        assert!(d.waits.borrow().is_empty());
    }

    /// Latency runs spin, as the raw path's latency loops do.
    #[test]
    fn latency_rounds_spin() {
        let d = Fake::new(0);
        run(&d, Duration::ZERO, 3);
        assert_eq!(d.rounds.get(), 4);
        assert!(d.waits.borrow().is_empty());
    }
}
