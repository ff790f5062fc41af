//! The completion channel's fd works with tokio's `AsyncFd`: awaiting readability completes
//! when an armed CQ gets a completion, and the event names the CQ.

use remem_conformance::{QpOptions, bring_up, endpoint};
use remem_soft::SoftContext;
use remem_verbs::{
    AccessFlags, Context, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

#[tokio::test(flavor = "current_thread")]
async fn async_fd_wakes_on_armed_completion() {
    let sa = SoftContext::bind("127.0.7.1:0".parse().unwrap()).unwrap();
    let port = sa.local_addr().port();
    let a: Arc<dyn Context> = Arc::new(sa);
    let b: Arc<dyn Context> =
        Arc::new(SoftContext::bind(format!("127.0.7.2:{port}").parse().unwrap()).unwrap());

    // Receiver b: a CQ with a completion channel; sender a: a plain CQ.
    let o = QpOptions::default();
    let channel = b.create_comp_channel().unwrap();
    let eb = endpoint(&b, &o, QpType::Rc, Some(channel.clone())).unwrap();
    let cq = eb.cq.clone();
    let ea = endpoint(&a, &o, QpType::Rc, None).unwrap();
    let ga = a.query_gid(1, 1).unwrap().gid;
    let gb = b.query_gid(1, 1).unwrap().gid;
    let mtu = remem_verbs::Mtu::Mtu1024;
    bring_up(&ea, eb.qp.qp_num(), gb, 1, 2, mtu, &o).unwrap();
    bring_up(&eb, ea.qp.qp_num(), ga, 2, 1, mtu, &o).unwrap();

    let (_rbuf, rmr) = eb.reg(64, AccessFlags::LOCAL_WRITE).unwrap();
    let (_sbuf, smr) = ea.reg(64, AccessFlags::empty()).unwrap();
    eb.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[Sge {
                addr: rmr.addr(),
                length: 64,
                lkey: rmr.lkey(),
            }],
        }])
        .unwrap();

    // tokio 1.54 deprecates `AsyncFd::new` (its replacement `register` is `unsafe`, which
    // this workspace forbids); the fd here is an owned duplicate kept open for the test.
    #[allow(deprecated)]
    let fd = AsyncFd::new(channel.fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(channel.get_cq_event().unwrap(), None, "nothing yet");
    cq.req_notify(false).unwrap();
    ea.qp
        .post_send(&[SendWr::new(
            9,
            SendOp::Send,
            &[Sge {
                addr: smr.addr(),
                length: 8,
                lkey: smr.lkey(),
            }],
        )])
        .unwrap();
    let mut guard = tokio::time::timeout(Duration::from_secs(10), fd.readable())
        .await
        .expect("the channel became readable")
        .unwrap();
    let ev = channel.get_cq_event().unwrap();
    assert_eq!(ev, Some(cq.id()));
    cq.ack_events(1);
    guard.clear_ready();
    let mut wc = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].wr_id, 1);
    // Not re-armed: a second completion does not make the channel readable.
    assert_eq!(channel.get_cq_event().unwrap(), None);
}
