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
