//! Inline devices: no progress thread; one application thread drives both devices.

use remem_conformance::{QpOptions, connect_rc};
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::{AccessFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn one_thread_drives_two_inline_devices() {
    let opts = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let a = Arc::new(SoftContext::bind_with("127.0.9.1:0".parse().unwrap(), &opts).unwrap());
    let port = a.local_addr().port();
    let b = Arc::new(
        SoftContext::bind_with(format!("127.0.9.2:{port}").parse().unwrap(), &opts).unwrap(),
    );
    let pair = remem_conformance::Pair::new(a.clone(), b.clone());
    let (ea, eb) = connect_rc(&pair, &QpOptions::default()).unwrap();
    let (sbuf, smr) = ea.reg(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let (tbuf, tmr) = eb
        .reg(8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    sbuf.write(0, &data).unwrap();
    let op = SendOp::RdmaWrite {
        remote_addr: tmr.addr(),
        rkey: tmr.rkey(),
    };
    ea.qp
        .post_send(&[SendWr::new(
            1,
            op,
            &[Sge {
                addr: smr.addr(),
                length: 8192,
                lkey: smr.lkey(),
            }],
        )])
        .unwrap();
    // Nothing moves until this thread drives the devices.
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(ea.cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(tbuf.to_vec(0, 16).unwrap(), vec![0; 16]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ea.cq.poll(&mut wc).unwrap() == 0 {
        assert!(Instant::now() < deadline, "write did not complete");
        a.progress(Duration::from_millis(1)).unwrap();
        b.progress(Duration::from_millis(1)).unwrap();
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(tbuf.to_vec(0, 8192).unwrap(), data);
    // A threaded device refuses progress().
    let threaded = SoftContext::bind("127.0.9.3:0".parse().unwrap()).unwrap();
    assert!(threaded.progress(Duration::ZERO).is_err());
}

/// The device's counter `name`.
fn counter(ctx: &SoftContext, name: &str) -> u64 {
    use remem_verbs::Context;
    ctx.counters()
        .into_iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.value)
}

/// `SoftOptions::defer_responses`: a spinning call that receives a SEND leaves its ACK for
/// the next call, which sends it in one GSO batch with the reply posted meanwhile (the
/// reply first); the peer handles the ACK first all the same, so its send completes before
/// the reply's receive does. Without the option, the ACK leaves in the receiving call.
#[test]
fn deferred_responses_leave_with_the_reply_and_are_handled_first() {
    for defer in [false, true] {
        let opts = SoftOptions {
            inline: true,
            defer_responses: defer,
            ..SoftOptions::default()
        };
        let n = 10 + u8::from(defer);
        let a = Arc::new(
            SoftContext::bind_with(format!("127.0.{n}.1:0").parse().unwrap(), &opts).unwrap(),
        );
        let port = a.local_addr().port();
        let b = Arc::new(
            SoftContext::bind_with(format!("127.0.{n}.2:{port}").parse().unwrap(), &opts).unwrap(),
        );
        let pair = remem_conformance::Pair::new(a.clone(), b.clone());
        let (ea, eb) = connect_rc(&pair, &QpOptions::default()).unwrap();
        let (abuf, amr) = ea.reg(64, AccessFlags::LOCAL_WRITE).unwrap();
        let (bbuf, bmr) = eb.reg(64, AccessFlags::LOCAL_WRITE).unwrap();
        abuf.write(0, b"ping").unwrap();
        bbuf.write(0, b"pong").unwrap();
        let sge = |mr: &dyn remem_verbs::MemoryRegion, off: u64| Sge {
            addr: mr.addr() + off,
            length: 4,
            lkey: mr.lkey(),
        };
        let recv = |ep: &remem_conformance::Endpoint, s: Sge| {
            ep.qp
                .post_recv(&[remem_verbs::RecvWr {
                    wr_id: 2,
                    sg_list: &[s],
                }])
                .unwrap()
        };
        recv(&ea, sge(&*amr, 32));
        recv(&eb, sge(&*bmr, 32));
        ea.qp
            .post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*amr, 0)])])
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut wc = [WorkCompletion::default(); 4];
        // B spins until the SEND has arrived (A sends it on its first call).
        let mut got = 0;
        while got == 0 {
            assert!(Instant::now() < deadline, "the SEND did not arrive");
            a.progress(Duration::ZERO).unwrap();
            b.progress(Duration::ZERO).unwrap();
            got = eb.cq.poll(&mut wc).unwrap();
        }
        assert_eq!((got, wc[0].opcode), (1, WcOpcode::Recv));
        assert_eq!(bbuf.to_vec(32, 4).unwrap(), b"ping");
        let acked = counter(&b, "sent_pkts");
        assert_eq!(acked, u64::from(!defer), "ACKs sent by the receiving call");
        // B answers; its next call sends what it owes and the reply.
        eb.qp
            .post_send(&[SendWr::new(3, SendOp::Send, &[sge(&*bmr, 0)])])
            .unwrap();
        let calls = counter(&b, "tx_datagrams");
        b.progress(Duration::ZERO).unwrap();
        assert_eq!(counter(&b, "sent_pkts"), 2);
        // (The ACK and the reply: one GSO batch when deferred, else the reply alone.)
        assert_eq!(counter(&b, "tx_datagrams"), calls + 1);
        // A's completions: its SEND's, then the reply's receive.
        let mut seen = Vec::new();
        while seen.len() < 2 {
            assert!(Instant::now() < deadline, "A saw {seen:?}");
            a.progress(Duration::ZERO).unwrap();
            let k = ea.cq.poll(&mut wc).unwrap();
            seen.extend(wc[..k].iter().map(|w| (w.opcode, w.status)));
        }
        assert_eq!(
            seen,
            [
                (WcOpcode::Send, WcStatus::Success),
                (WcOpcode::Recv, WcStatus::Success)
            ],
            "defer {defer}"
        );
        assert_eq!(abuf.to_vec(32, 4).unwrap(), b"pong");
    }
}
