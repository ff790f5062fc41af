//! Resource limits end to end on two soft devices (127.0.18.1 and .2): a completion queue
//! that overflows raises CQ_ERR and reports the overrun instead of dropping completions
//! silently; a full send queue refuses the next post without losing the work requests it
//! holds. (Scale — 10,000 QPs, 100,000 MRs — is `scale.rs`; leases that expire and revoke
//! their keys are tested in the `remem` crate.)

use remem_conformance::{Pair, QpOptions, connect_rc, poll_n};
use remem_soft::SoftContext;
use remem_verbs::{AccessFlags, AsyncEventType, Error, QpCap, SendOp, SendWr, Sge, WorkCompletion};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn pair() -> &'static Pair {
    static PAIR: OnceLock<Pair> = OnceLock::new();
    PAIR.get_or_init(|| {
        let a = SoftContext::bind("127.0.18.1:0".parse().unwrap()).unwrap();
        let port = a.local_addr().port();
        let b = SoftContext::bind(format!("127.0.18.2:{port}").parse().unwrap()).unwrap();
        Pair::new(Arc::new(a), Arc::new(b))
    })
}

fn write_wrs(n: u64, sge: &[Sge], addr: u64, rkey: u32) -> Vec<SendWr<'_>> {
    (0..n)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey,
                },
                sge,
            )
        })
        .collect()
}

#[test]
fn a_full_send_queue_refuses_the_next_post_and_keeps_the_rest() {
    let o = QpOptions {
        cap: QpCap {
            max_send_wr: 4,
            ..QpOptions::default().cap
        },
        ..QpOptions::default()
    };
    let (a, b) = connect_rc(pair(), &o).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (_, lmr) = a.reg(64, rw).unwrap();
    let (tbuf, tmr) = b.reg(64, rw).unwrap();
    let sge = [Sge {
        addr: lmr.addr(),
        length: 64,
        lkey: lmr.lkey(),
    }];
    let granted = a.qp.cap().max_send_wr;
    assert!(granted >= 4);
    // Post until the queue is full, in one list: the list stops at the first refused one.
    let wrs = write_wrs(u64::from(granted) + 3, &sge, tmr.addr(), tmr.rkey());
    let err = a.qp.post_send(&wrs).expect_err("more than the queue holds");
    assert_eq!(
        err.index, granted as usize,
        "stopped at the first that did not fit"
    );
    assert!(
        matches!(err.error, Error::QueueFull { .. }),
        "{:?}",
        err.error
    );
    // Every work request that was taken completes.
    let wcs = poll_n(&*a.cq, granted as usize, Duration::from_secs(10)).unwrap();
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..u64::from(granted)).collect::<Vec<_>>());
    assert!(
        wcs.iter()
            .all(|w| w.status == remem_verbs::WcStatus::Success)
    );
    assert_eq!(tbuf.to_vec(0, 64).unwrap().len(), 64);
    // With room again, posting works.
    a.qp.post_send(&write_wrs(1, &sge, tmr.addr(), tmr.rkey()))
        .unwrap();
    poll_n(&*a.cq, 1, Duration::from_secs(10)).unwrap();
}

#[test]
fn an_overflowing_completion_queue_reports_the_overrun() {
    let o = QpOptions {
        cqe: 4,
        ..QpOptions::default()
    };
    let (a, b) = connect_rc(pair(), &o).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (_, lmr) = a.reg(64, rw).unwrap();
    let (_, tmr) = b.reg(64, rw).unwrap();
    let sge = [Sge {
        addr: lmr.addr(),
        length: 64,
        lkey: lmr.lkey(),
    }];
    let depth = a.cq.cqe();
    // More signaled completions than the CQ holds, nobody polling.
    let n = u64::from(depth) + 4;
    for wr in write_wrs(n, &sge, tmr.addr(), tmr.rkey()) {
        a.qp.post_send(&[wr]).unwrap();
    }
    // The device raises CQ_ERR for this CQ on its asynchronous event queue.
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        if let Some(ev) = pair().a.get_async_event() {
            break ev;
        }
        assert!(Instant::now() < deadline, "no CQ_ERR event");
        // Sleep on the context's async fd until an event is pending.
        let fd = pair().a.async_fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    };
    assert_eq!(event.event_type, AsyncEventType::CqErr);
    // Polling hands out what the queue held, then reports the overrun: never an empty
    // queue as if nothing had been lost.
    let mut wc = [WorkCompletion::default(); 64];
    let mut delivered = 0;
    loop {
        match a.cq.poll(&mut wc) {
            Ok(0) => panic!("an overrun CQ polled empty after {delivered} completions"),
            Ok(k) => delivered += k,
            Err(e) => {
                assert!(e.to_string().contains("overrun"), "{e}");
                break;
            }
        }
    }
    assert!(
        delivered as u32 <= depth,
        "{delivered} completions from a CQ of {depth}"
    );
    assert!(
        (delivered as u64) < n,
        "some completions were lost, and said so"
    );
}
