//! One completion dispatcher per `Rdma`: the connections a listener accepts (and those a
//! client makes) share one tokio task (event-driven polling) or one polling thread (busy
//! polling), however many there are. Own test binary: it counts the process's threads.

use remem::{Connection, Listener, Polling, Rdma};
use std::alloc::Layout;
use std::task::Poll;

#[path = "api/common/mod.rs"]
mod common;

/// Two `Rdma`s on soft devices (`common::pair_with`) or `REMEM_TEST_DEVICE`.
fn pair(polling: Polling) -> (Rdma, Rdma) {
    let opts = |b: remem::RdmaBuilder| b.polling(polling).keepalive(None);
    common::pair_with(opts, opts)
}

/// `n` connections from `a` to `listener` (on the other `Rdma`).
async fn connect_many(a: &Rdma, listener: &Listener, n: usize) -> Vec<(Connection, Connection)> {
    let addr = listener.local_addr().unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let (ca, cb) = tokio::join!(a.connect(addr), listener.accept());
        out.push((ca.unwrap(), cb.unwrap()));
    }
    out
}

/// Every connection works, concurrently: each writes its own pattern into a region its
/// peer lends, then sends a message that the peer receives.
async fn exercise(a: &Rdma, b: &Rdma, conns: &[(Connection, Connection)]) {
    let layout = Layout::from_size_align(4096, 8).unwrap();
    let tasks = conns.iter().enumerate().map(|(i, (ca, cb))| async move {
        let target = b.alloc_local_mr(layout).unwrap();
        cb.share_local_mr(&target).await.unwrap();
        let remote = ca.receive_shared_mr().await.unwrap();
        let src = a.alloc_local_mr(layout).unwrap();
        src.write(0, &[i as u8 + 1; 4096]).unwrap();
        ca.write(&src, &remote).await.unwrap();
        ca.send(&src.get(0..16).unwrap()).await.unwrap();
        let msg = cb.receive().await.unwrap();
        assert_eq!(msg.data, vec![i as u8 + 1; 16]);
        assert_eq!(target.to_vec(), vec![i as u8 + 1; 4096]);
    });
    futures_join_all(tasks).await;
}

/// Runs the futures concurrently (on this task) until all are done.
async fn futures_join_all<F: Future<Output = ()>>(fs: impl Iterator<Item = F>) {
    let mut fs: Vec<_> = fs.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        fs.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if fs.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_polling_uses_one_task_however_many_connections() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let (a, b) = pair(Polling::Event);
    // One listener throughout: its accept task is counted in both figures (a listener
    // dropped in between leaves an aborted task alive until the runtime reaps it).
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let one = connect_many(&a, &listener, 1).await;
    exercise(&a, &b, &one).await;
    let tasks_with_one = metrics.num_alive_tasks();
    let more = connect_many(&a, &listener, 15).await;
    exercise(&a, &b, &more).await;
    exercise(&a, &b, &one).await;
    // The steady count is the same with one connection as with sixteen; either figure may
    // still include a short-lived task of a handshake that has just ended (the server side's
    // handshake task is reaped a moment after both ends hold their `Connection`), so allow
    // that much. One task per connection would add 15 on each side, 30 in all.
    let tasks_with_sixteen = metrics.num_alive_tasks();
    assert!(
        tasks_with_sixteen <= tasks_with_one + 2,
        "15 more connections must not add tasks: {tasks_with_one} with one, \
         {tasks_with_sixteen} with sixteen"
    );
    drop((one, more));
}

fn poll_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "remem-poll")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_uses_one_thread_per_device() {
    let (a, b) = pair(Polling::Busy);
    let listener = b.listen("127.0.0.1:0").await.unwrap();
    let conns = connect_many(&a, &listener, 8).await;
    exercise(&a, &b, &conns).await;
    // One thread for `a`'s eight connections, one for `b`'s.
    assert_eq!(poll_threads(), 2);
}
