//! The drop-in librdmacm against the fake CM provider (`fake`): the exported functions
//! called as a program calls them (two devices, 127.77.0.1 and 127.77.0.2; each test on
//! ports of its own, since the devices and the fake's bindings are the process's).

#![allow(unsafe_code)]

use super::abi::*;
use super::fake;
use super::sockaddr::std_to_storage;
use crate::abi::*;
use crate::ffi::errno;
use crate::ffi::rdmacm::*;
use core::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn setup() {
    fake::install();
}

fn addr(s: &str) -> libc::sockaddr_storage {
    std_to_storage(s.parse::<SocketAddr>().unwrap()).0
}

fn sa(ss: &mut libc::sockaddr_storage) -> *mut libc::sockaddr {
    (ss as *mut libc::sockaddr_storage).cast()
}

fn channel() -> *mut rdma_event_channel {
    let ch = remem_ibv_rdma_create_event_channel();
    assert!(!ch.is_null(), "errno {}", errno());
    ch
}

fn destroy_channel(ch: *mut rdma_event_channel) {
    // SAFETY: a channel of the test, not used afterwards.
    unsafe { remem_ibv_rdma_destroy_event_channel(ch) };
}

fn fd(ch: *mut rdma_event_channel) -> RawFd {
    // SAFETY: a live channel of the test.
    unsafe { (*ch).fd }
}

fn create_id(ch: *mut rdma_event_channel, ctx: usize, ps: rdma_port_space) -> *mut rdma_cm_id {
    let mut id = std::ptr::null_mut();
    // SAFETY: a live channel (or NULL) and a writable out-pointer.
    let rc = unsafe { remem_ibv_rdma_create_id(ch, &mut id, ctx as *mut c_void, ps) };
    assert_eq!(rc, 0, "rdma_create_id: errno {}", errno());
    id
}

fn destroy_id(id: *mut rdma_cm_id) {
    // SAFETY: a live id of the test, not used afterwards.
    assert_eq!(unsafe { remem_ibv_rdma_destroy_id(id) }, 0);
}

fn bind(id: *mut rdma_cm_id, a: &str) -> c_int {
    let mut ss = addr(a);
    // SAFETY: a live id and a socket address.
    unsafe { remem_ibv_rdma_bind_addr(id, sa(&mut ss)) }
}

fn listen(id: *mut rdma_cm_id) {
    assert_eq!(
        // SAFETY: a live id.
        unsafe { remem_ibv_rdma_listen(id, 0) },
        0,
        "errno {}",
        errno()
    );
}

fn resolve(id: *mut rdma_cm_id, dst: &str) -> c_int {
    let mut ss = addr(dst);
    // SAFETY: a live id and a socket address.
    unsafe { remem_ibv_rdma_resolve_addr(id, std::ptr::null_mut(), sa(&mut ss), 1000) }
}

fn route(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: a live id.
    unsafe { remem_ibv_rdma_resolve_route(id, 1000) }
}

fn conn(data: &[u8]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: data.as_ptr().cast(),
        private_data_len: data.len() as u8,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

fn connect(id: *mut rdma_cm_id, data: &[u8]) -> c_int {
    let mut p = conn(data);
    // SAFETY: a live id and parameters whose private data outlives the call.
    unsafe { remem_ibv_rdma_connect(id, &mut p) }
}

fn accept(id: *mut rdma_cm_id, data: &[u8]) -> c_int {
    let mut p = conn(data);
    // SAFETY: as `connect`.
    unsafe { remem_ibv_rdma_accept(id, &mut p) }
}

fn disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: a live id.
    unsafe { remem_ibv_rdma_disconnect(id) }
}

/// Whether the channel's fd is readable within `t`.
fn readable(ch: *mut rdma_event_channel, t: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd(ch),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, t.as_millis() as c_int) == 1 }
}

/// The next event of `ch`, which must be `kind` and come within [`WAIT`].
fn expect(ch: *mut rdma_event_channel, kind: rdma_cm_event_type) -> *mut rdma_cm_event {
    assert!(readable(ch, WAIT), "no event (waiting for {kind})");
    let mut ev = std::ptr::null_mut();
    // SAFETY: a live channel and a writable out-pointer.
    assert_eq!(unsafe { remem_ibv_rdma_get_cm_event(ch, &mut ev) }, 0);
    // SAFETY: the event just handed out.
    let got = unsafe { (*ev).event };
    assert_eq!(got, kind, "event {got}, status {}", status(ev));
    ev
}

fn ack(ev: *mut rdma_cm_event) {
    // SAFETY: an event handed out to the test, not acked yet.
    assert_eq!(unsafe { remem_ibv_rdma_ack_cm_event(ev) }, 0);
}

fn status(ev: *mut rdma_cm_event) -> c_int {
    // SAFETY: a live event.
    unsafe { (*ev).status }
}

fn ev_id(ev: *mut rdma_cm_event) -> *mut rdma_cm_id {
    // SAFETY: a live event.
    unsafe { (*ev).id }
}

/// The private data of a connected port space's event.
fn conn_data(ev: *mut rdma_cm_event) -> Vec<u8> {
    // SAFETY: a live event of a connected port space; the data lives with it.
    unsafe {
        let c = (*ev).param.conn;
        if c.private_data.is_null() {
            return Vec::new();
        }
        std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
            .to_vec()
    }
}

/// Reads a field of a live id.
macro_rules! get {
    ($id:expr, $($f:tt)+) => {{
        let p = $id;
        // SAFETY: a live id of the test.
        unsafe { (*p).$($f)+ }
    }};
}

fn qp_attr(qp_type: ibv_qp_type) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type,
        sq_sig_all: 0,
    }
}

fn create_qp(id: *mut rdma_cm_id, qp_type: ibv_qp_type) -> *mut ibv_qp {
    let mut a = qp_attr(qp_type);
    // SAFETY: a live id, its own PD (NULL), attributes.
    let rc = unsafe { remem_ibv_rdma_create_qp(id, std::ptr::null_mut(), &mut a) };
    assert_eq!(rc, 0, "rdma_create_qp: errno {}", errno());
    let qp = get!(id, qp);
    assert!(!qp.is_null());
    assert_eq!(a.send_cq, get!(id, send_cq));
    assert_eq!(a.recv_cq, get!(id, recv_cq));
    qp
}

fn destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: a live id whose QP the test no longer uses.
    unsafe { remem_ibv_rdma_destroy_qp(id) };
    assert!(get!(id, qp).is_null());
    assert!(get!(id, send_cq).is_null() && get!(id, recv_cq).is_null());
}

fn qp_num(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live QP.
    unsafe { (*qp).qp_num }
}

fn qp_state(qp: *mut ibv_qp) -> ibv_qp_state {
    // SAFETY: a live QP.
    unsafe { (*qp).state }
}

fn src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: a live id.
    u16::from_be(unsafe { remem_ibv_rdma_get_src_port(id) })
}

fn dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: a live id.
    u16::from_be(unsafe { remem_ibv_rdma_get_dst_port(id) })
}

/// A listener on `ip:port` on channel `ch` and a client that resolved its address and
/// route on channel `cch`.
fn listener_and_client(
    sch: *mut rdma_event_channel,
    cch: *mut rdma_event_channel,
    ip: &str,
    port: u16,
    ps: rdma_port_space,
) -> (*mut rdma_cm_id, *mut rdma_cm_id) {
    let lid = create_id(sch, 0x1234, ps);
    assert_eq!(bind(lid, &format!("{ip}:{port}")), 0, "errno {}", errno());
    listen(lid);
    let cid = create_id(cch, 0x5678, ps);
    assert_eq!(
        resolve(cid, &format!("{ip}:{port}")),
        0,
        "errno {}",
        errno()
    );
    let e = expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
    assert_eq!(ev_id(e), cid);
    ack(e);
    assert_eq!(route(cid), 0);
    ack(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    (lid, cid)
}

#[test]
fn connect_accept_with_private_data_and_disconnect() {
    setup();
    let (sch, cch) = (channel(), channel());
    let (lid, cid) = listener_and_client(sch, cch, fake::IPS[0], 45001, RDMA_PS_TCP);
    // The listener is on device 0; the client found it by the destination.
    assert!(!get!(lid, verbs).is_null());
    assert_eq!(get!(cid, verbs), get!(lid, verbs));
    assert!(!get!(cid, pd).is_null());
    assert_eq!(get!(cid, port_num), 1);
    assert_eq!(src_port(lid), 45001);
    assert_eq!(dst_port(cid), 45001);
    assert_ne!(src_port(cid), 0);
    // The route has one path, to the listener's GID.
    assert_eq!(get!(cid, route.num_paths), 1);
    let path = get!(cid, route.path_rec);
    // SAFETY: the id's path record, live with it; every GID bit pattern is valid.
    let dgid = unsafe { (*path).dgid.raw };
    assert_eq!(&dgid[10..], &[0xff, 0xff, 127, 77, 0, 1]);

    let cqp = create_qp(cid, IBV_QPT_RC);
    assert_eq!(qp_state(cqp), IBV_QPS_INIT);
    assert_eq!(connect(cid, b"hello"), 0);

    let req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    let child = ev_id(req);
    assert_ne!(child, lid);
    // SAFETY: a live event.
    assert_eq!(unsafe { (*req).listen_id }, lid);
    assert_eq!(conn_data(req), b"hello");
    // SAFETY: a live event of a connected port space.
    assert_eq!(unsafe { (*req).param.conn.qp_num }, qp_num(cqp));
    assert_eq!(get!(child, context) as usize, 0x1234);
    assert_eq!(get!(child, verbs), get!(lid, verbs));
    assert_eq!(get!(child, channel), sch);
    assert_eq!(get!(child, ps), RDMA_PS_TCP);
    assert_eq!(dst_port(child), src_port(cid));
    let sqp = create_qp(child, IBV_QPT_RC);
    assert_eq!(accept(child, b"world"), 0);
    ack(req);

    let est = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
    assert_eq!(conn_data(est), b"world");
    // SAFETY: a live event of a connected port space.
    assert_eq!(unsafe { (*est).param.conn.qp_num }, qp_num(sqp));
    ack(est);
    let est = expect(sch, RDMA_CM_EVENT_ESTABLISHED);
    assert_eq!(ev_id(est), child);
    ack(est);

    assert_eq!(disconnect(cid), 0);
    ack(expect(cch, RDMA_CM_EVENT_DISCONNECTED));
    let d = expect(sch, RDMA_CM_EVENT_DISCONNECTED);
    assert_eq!(ev_id(d), child);
    ack(d);
    assert!(!readable(sch, Duration::ZERO) && !readable(cch, Duration::ZERO));

    destroy_qp(cid);
    destroy_qp(child);
    for id in [cid, child, lid] {
        destroy_id(id);
    }
    destroy_channel(sch);
    destroy_channel(cch);
}

#[test]
fn reject_carries_private_data_and_no_listener_is_reason_8() {
    setup();
    let (sch, cch) = (channel(), channel());
    let (lid, cid) = listener_and_client(sch, cch, fake::IPS[1], 45002, RDMA_PS_TCP);
    assert_eq!(connect(cid, b"please"), 0);
    let req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    let child = ev_id(req);
    let why = b"no thanks";
    assert_eq!(
        // SAFETY: a live id and `why.len()` bytes.
        unsafe { remem_ibv_rdma_reject(child, why.as_ptr().cast(), why.len() as u8) },
        0
    );
    ack(req);
    let rej = expect(cch, RDMA_CM_EVENT_REJECTED);
    assert_eq!(status(rej), 28);
    assert_eq!(conn_data(rej), why);
    ack(rej);
    destroy_id(child);
    destroy_id(cid);

    // Nobody listens on 45003: reject reason 8 (invalid service ID).
    let cid = create_id(cch, 0, RDMA_PS_TCP);
    assert_eq!(resolve(cid, &format!("{}:45003", fake::IPS[1])), 0);
    ack(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
    assert_eq!(route(cid), 0);
    ack(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    assert_eq!(
        // Without a QP, a connected port space needs parameters.
        // SAFETY: a live id, NULL parameters.
        unsafe { remem_ibv_rdma_connect(cid, std::ptr::null_mut()) },
        -1
    );
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(connect(cid, b""), 0);
    let rej = expect(cch, RDMA_CM_EVENT_REJECTED);
    assert_eq!(status(rej), 8);
    ack(rej);
    destroy_id(cid);
    destroy_id(lid);
    destroy_channel(sch);
    destroy_channel(cch);
}

#[test]
fn destroying_a_listener_rejects_the_requests_not_handed_out() {
    setup();
    let (sch, cch) = (channel(), channel());
    let (lid, cid) = listener_and_client(sch, cch, fake::IPS[0], 45004, RDMA_PS_TCP);
    assert_eq!(connect(cid, b"x"), 0);
    // The request is queued on the server's channel; the listener goes away.
    assert!(readable(sch, WAIT));
    destroy_id(lid);
    assert!(
        !readable(sch, Duration::ZERO),
        "the request left with its listener"
    );
    let rej = expect(cch, RDMA_CM_EVENT_REJECTED);
    ack(rej);
    destroy_id(cid);
    destroy_channel(sch);
    destroy_channel(cch);
}

#[test]
fn destroy_waits_until_the_events_are_acked() {
    setup();
    let ch = channel();
    let id = create_id(ch, 0, RDMA_PS_TCP);
    assert_eq!(resolve(id, &format!("{}:45005", fake::IPS[0])), 0);
    let ev = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    let (tx, rx) = mpsc::channel();
    let idp = id as usize;
    let t = std::thread::spawn(move || {
        destroy_id(idp as *mut rdma_cm_id);
        tx.send(()).unwrap();
    });
    // One event is out: destroy must still be waiting (checked for a while).
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    ack(ev);
    rx.recv_timeout(WAIT)
        .expect("rdma_destroy_id returns once acked");
    t.join().unwrap();
    destroy_channel(ch);
}

#[test]
fn a_nonblocking_channel_answers_eagain() {
    setup();
    let ch = channel();
    // SAFETY: setting a flag on the channel's fd, as a program does.
    unsafe { libc::fcntl(fd(ch), libc::F_SETFL, libc::O_NONBLOCK) };
    let mut ev = std::ptr::null_mut();
    // SAFETY: a live channel and a writable out-pointer.
    assert_eq!(unsafe { remem_ibv_rdma_get_cm_event(ch, &mut ev) }, -1);
    assert_eq!(errno(), libc::EAGAIN);
    let id = create_id(ch, 0, RDMA_PS_TCP);
    assert_eq!(resolve(id, &format!("{}:45006", fake::IPS[0])), 0);
    ack(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    destroy_id(id);
    destroy_channel(ch);
}

#[test]
fn migrate_moves_queued_events_and_can_make_an_id_synchronous() {
    setup();
    let (a, b) = (channel(), channel());
    let id = create_id(a, 0, RDMA_PS_TCP);
    assert_eq!(resolve(id, &format!("{}:45007", fake::IPS[0])), 0);
    assert!(readable(a, WAIT));
    // SAFETY: a live id and channel.
    assert_eq!(unsafe { remem_ibv_rdma_migrate_id(id, b) }, 0);
    assert_eq!(get!(id, channel), b);
    assert!(!readable(a, Duration::ZERO));
    ack(expect(b, RDMA_CM_EVENT_ADDR_RESOLVED));
    assert_eq!(
        // To a private channel: the next call waits for its own event.
        // SAFETY: a live id; NULL makes it synchronous.
        unsafe { remem_ibv_rdma_migrate_id(id, std::ptr::null_mut()) },
        0
    );
    assert_ne!(get!(id, channel), b);
    assert_eq!(route(id), 0);
    let ev = get!(id, event);
    assert!(!ev.is_null());
    // SAFETY: the id's own event.
    assert_eq!(unsafe { (*ev).event }, RDMA_CM_EVENT_ROUTE_RESOLVED);
    assert_eq!(
        // A synchronous id cannot become synchronous again.
        // SAFETY: a live id.
        unsafe { remem_ibv_rdma_migrate_id(id, std::ptr::null_mut()) },
        -1
    );
    assert_eq!(errno(), libc::EINVAL);
    destroy_id(id);
    destroy_channel(a);
    destroy_channel(b);
}

#[test]
fn a_wildcard_listener_covers_every_device() {
    setup();
    let (sch, cch) = (channel(), channel());
    let lid = create_id(sch, 0, RDMA_PS_TCP);
    assert_eq!(bind(lid, "0.0.0.0:45008"), 0, "errno {}", errno());
    assert!(get!(lid, verbs).is_null(), "a wildcard bind has no device");
    listen(lid);
    let mut children = Vec::new();
    for ip in fake::IPS {
        let cid = create_id(cch, 0, RDMA_PS_TCP);
        assert_eq!(resolve(cid, &format!("{ip}:45008")), 0);
        ack(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
        assert_eq!(route(cid), 0);
        ack(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
        assert_eq!(connect(cid, b"w"), 0);
        let req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
        let child = ev_id(req);
        // The request's id is on the device it arrived at: the client's.
        assert_eq!(get!(child, verbs), get!(cid, verbs));
        ack(req);
        children.push((cid, child));
    }
    assert_ne!(get!(children[0].1, verbs), get!(children[1].1, verbs));
    for (c, s) in children {
        destroy_id(s);
        ack(expect(cch, RDMA_CM_EVENT_REJECTED));
        destroy_id(c);
    }
    destroy_id(lid);
    destroy_channel(sch);
    destroy_channel(cch);
}

#[test]
fn bind_errors() {
    setup();
    let ch = channel();
    let a = create_id(ch, 0, RDMA_PS_TCP);
    assert_eq!(bind(a, "10.255.0.1:45009"), -1);
    assert_eq!(errno(), libc::EADDRNOTAVAIL);
    assert_eq!(bind(a, &format!("{}:45009", fake::IPS[0])), 0);
    // Bound already.
    assert_eq!(bind(a, &format!("{}:45010", fake::IPS[0])), -1);
    assert_eq!(errno(), libc::EINVAL);
    let b = create_id(ch, 0, RDMA_PS_TCP);
    assert_eq!(bind(b, &format!("{}:45009", fake::IPS[0])), -1);
    assert_eq!(errno(), libc::EADDRINUSE);
    // Another port space is another service.
    let u = create_id(ch, 0, RDMA_PS_UDP);
    assert_eq!(bind(u, &format!("{}:45009", fake::IPS[0])), 0);
    assert_eq!(
        // NULL and AF_UNIX addresses.
        // SAFETY: a live id; NULL is allowed.
        unsafe { remem_ibv_rdma_bind_addr(b, std::ptr::null_mut()) },
        -1
    );
    // SAFETY: plain data; all-zero is valid.
    let mut unix: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    unix.ss_family = libc::AF_UNIX as libc::sa_family_t;
    // SAFETY: a live id and an address structure.
    assert_eq!(unsafe { remem_ibv_rdma_bind_addr(b, sa(&mut unix)) }, -1);
    assert_eq!(errno(), libc::EINVAL);
    // An unknown port space.
    let mut id = std::ptr::null_mut();
    assert_eq!(
        // SAFETY: a live channel and a writable out-pointer.
        unsafe { remem_ibv_rdma_create_id(ch, &mut id, std::ptr::null_mut(), 77) },
        -1
    );
    assert_eq!(errno(), libc::EINVAL);
    for id in [a, b, u] {
        destroy_id(id);
    }
    destroy_channel(ch);
}

#[test]
fn udp_service_resolution_gives_the_remote_qp() {
    setup();
    let (sch, cch) = (channel(), channel());
    let (lid, cid) = listener_and_client(sch, cch, fake::IPS[0], 45011, RDMA_PS_UDP);
    assert_eq!(get!(cid, qp_type), IBV_QPT_UD);
    let cqp = create_qp(cid, IBV_QPT_UD);
    // UD QPs are ready at once (librdmacm moves them to RTS).
    assert_eq!(qp_state(cqp), IBV_QPS_RTS);
    assert_eq!(connect(cid, b"sidr"), 0);
    let req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    let child = ev_id(req);
    // SAFETY: a live event of a datagram port space.
    let (d, n) = unsafe {
        (
            (*req).param.ud.private_data,
            (*req).param.ud.private_data_len,
        )
    };
    assert!(!d.is_null() && n == 4);
    let sqp = create_qp(child, IBV_QPT_UD);
    assert_eq!(accept(child, b""), 0);
    ack(req);
    let est = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
    // SAFETY: a live event of a datagram port space.
    let ud = unsafe { (*est).param.ud };
    assert_eq!(ud.qp_num, qp_num(sqp));
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    assert_eq!(ud.ah_attr.is_global, 1);
    // The device's IPv4 GID: index 1, as in rxe's table.
    assert_eq!(ud.ah_attr.grh.sgid_index, 1);
    ack(est);
    // No ESTABLISHED on the passive side of a service resolution.
    assert!(!readable(sch, Duration::from_millis(50)));
    destroy_qp(cid);
    destroy_qp(child);
    for id in [cid, child, lid] {
        destroy_id(id);
    }
    destroy_channel(sch);
    destroy_channel(cch);
}

#[test]
fn init_qp_attr_and_options() {
    setup();
    let ch = channel();
    let id = create_id(ch, 0, RDMA_PS_TCP);
    // SAFETY: plain data; all-zero is valid.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    let mut mask = 0;
    attr.qp_state = IBV_QPS_INIT;
    assert_eq!(
        // SAFETY: a live id and writable outputs.
        unsafe { remem_ibv_rdma_init_qp_attr(id, &mut attr, &mut mask) },
        -1
    );
    assert_eq!(errno(), libc::EINVAL, "no device yet");
    assert_eq!(src_port(id), 0);
    assert_eq!(resolve(id, &format!("{}:45012", fake::IPS[0])), 0);
    ack(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    assert_eq!(
        // SAFETY: as above.
        unsafe { remem_ibv_rdma_init_qp_attr(id, &mut attr, &mut mask) },
        0
    );
    assert_eq!(attr.qp_state, IBV_QPS_INIT);
    assert_eq!(attr.port_num, 1);
    let want = (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) as c_int;
    assert_eq!(mask, want);

    let mut tos: u8 = 32;
    let mut on: c_int = 1;
    // SAFETY: a live id and option values of the sizes given.
    unsafe {
        assert_eq!(
            remem_ibv_rdma_set_option(
                id,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS,
                (&raw mut tos).cast(),
                1
            ),
            0
        );
        assert_eq!(
            remem_ibv_rdma_set_option(
                id,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_REUSEADDR,
                (&raw mut on).cast(),
                4
            ),
            0
        );
        assert_eq!(
            remem_ibv_rdma_set_option(
                id,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS,
                (&raw mut on).cast(),
                4
            ),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            remem_ibv_rdma_set_option(
                id,
                RDMA_OPTION_IB,
                RDMA_OPTION_IB_PATH,
                (&raw mut on).cast(),
                4
            ),
            -1
        );
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(
            remem_ibv_rdma_set_option(id, 9, 9, (&raw mut on).cast(), 4),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        // Multicast: no address, a unicast one: EINVAL; an IPv6 group: EOPNOTSUPP (RoCE v2
        // as older kernels); leaving a group never joined: EADDRNOTAVAIL.
        assert_eq!(
            remem_ibv_rdma_join_multicast(id, std::ptr::null_mut(), std::ptr::null_mut()),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        let mut unicast = std_to_storage("127.0.0.1:0".parse().unwrap()).0;
        assert_eq!(
            remem_ibv_rdma_join_multicast(id, (&raw mut unicast).cast(), std::ptr::null_mut()),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        let mut v6 = std_to_storage("[ff0e::1]:0".parse().unwrap()).0;
        assert_eq!(
            remem_ibv_rdma_join_multicast(id, (&raw mut v6).cast(), std::ptr::null_mut()),
            -1
        );
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let mut group = std_to_storage("239.1.2.3:0".parse().unwrap()).0;
        assert_eq!(
            remem_ibv_rdma_leave_multicast(id, (&raw mut group).cast()),
            -1
        );
        assert_eq!(errno(), libc::EADDRNOTAVAIL);
        assert_eq!(remem_ibv_rdma_notify(id, IBV_EVENT_COMM_EST), 0);
        assert_eq!(remem_ibv_rdma_notify(id, IBV_EVENT_QP_FATAL), -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut ece = ibv_ece {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        };
        assert_eq!(remem_ibv_rdma_get_remote_ece(id, &mut ece), 0);
        assert_eq!(ece.vendor_id, 0);
        assert_eq!(remem_ibv_rdma_set_local_ece(id, &mut ece), -1);
        // NULL ids are EINVAL everywhere, never a crash.
        let null = std::ptr::null_mut();
        assert_eq!(remem_ibv_rdma_listen(null, 1), -1);
        assert_eq!(remem_ibv_rdma_connect(null, std::ptr::null_mut()), -1);
        assert_eq!(remem_ibv_rdma_accept(null, std::ptr::null_mut()), -1);
        assert_eq!(remem_ibv_rdma_disconnect(null), -1);
        assert_eq!(remem_ibv_rdma_destroy_id(null), -1);
        assert_eq!(remem_ibv_rdma_resolve_route(null, 1), -1);
        assert_eq!(
            remem_ibv_rdma_create_qp(null, std::ptr::null_mut(), std::ptr::null_mut()),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
    }
    destroy_id(id);
    destroy_channel(ch);
}

#[test]
fn an_id_s_srq_serves_the_qp_made_on_it_until_destroyed() {
    setup();
    let ch = channel();
    let id = create_id(ch, 0, RDMA_PS_TCP);
    let mut attr = ibv_srq_init_attr {
        srq_context: std::ptr::null_mut(),
        attr: ibv_srq_attr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        },
    };
    // SAFETY: a live id (no device yet), its PD (NULL) and attributes.
    unsafe {
        assert_eq!(
            remem_ibv_rdma_create_srq(id, std::ptr::null_mut(), &mut attr),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
    }
    assert_eq!(bind(id, &format!("{}:45015", fake::IPS[0])), 0);
    // SAFETY: as above, on a bound id.
    unsafe {
        assert_eq!(
            remem_ibv_rdma_create_srq(id, std::ptr::null_mut(), &mut attr),
            0,
            "rdma_create_srq: errno {}",
            errno()
        );
    }
    let srq = get!(id, srq);
    assert!(!srq.is_null());
    // SAFETY: a live id that has an SRQ already; an XRC SRQ is not supported.
    unsafe {
        assert_eq!(
            remem_ibv_rdma_create_srq(id, std::ptr::null_mut(), &mut attr),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        let mut ex: ibv_srq_init_attr_ex = std::mem::zeroed();
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
        ex.srq_type = IBV_SRQT_XRC;
        assert_eq!(remem_ibv_rdma_create_srq_ex(id, &mut ex), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
    let mut a = qp_attr(IBV_QPT_RC);
    // SAFETY: a live id, its own PD (NULL), attributes.
    let rc = unsafe { remem_ibv_rdma_create_qp(id, std::ptr::null_mut(), &mut a) };
    assert_eq!(rc, 0, "rdma_create_qp: errno {}", errno());
    assert_eq!(a.srq, srq, "the QP uses the id's SRQ");
    assert!(!get!(id, send_cq).is_null() && !get!(id, recv_cq).is_null());
    destroy_qp(id);
    // SAFETY: a live id whose SRQ the test no longer uses.
    unsafe { remem_ibv_rdma_destroy_srq(id) };
    assert!(get!(id, srq).is_null());
    // SAFETY: NULL ids are ignored.
    unsafe { remem_ibv_rdma_destroy_srq(std::ptr::null_mut()) };
    destroy_id(id);
    destroy_channel(ch);
}

#[test]
fn get_devices_lists_every_device_open() {
    setup();
    let mut n = 0;
    // SAFETY: a writable count.
    let list = unsafe { remem_ibv_rdma_get_devices(&mut n) };
    assert!(!list.is_null());
    assert_eq!(n, 2);
    // SAFETY: the NULL-terminated list of n contexts just made.
    unsafe {
        assert!(!(*list).is_null() && !(*list.add(1)).is_null());
        assert!((*list.add(2)).is_null());
        assert!(crate::context::ctx_from(*list).is_some());
        remem_ibv_rdma_free_devices(list);
    }
}

/// Runs `f` on a thread, failing the test if it does not return within [`WAIT`].
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(WAIT)
        .expect("a synchronous call returned in time")
}

fn getaddrinfo(node: &std::ffi::CStr, port: &std::ffi::CStr, flags: c_int) -> *mut rdma_addrinfo {
    // SAFETY: plain data; all-zero is valid.
    let mut h: rdma_addrinfo = unsafe { std::mem::zeroed() };
    h.ai_flags = flags;
    h.ai_port_space = RDMA_PS_TCP as c_int;
    let mut res = std::ptr::null_mut();
    // SAFETY: C strings, valid hints, a writable out-pointer.
    let rc = unsafe { remem_ibv_rdma_getaddrinfo(node.as_ptr(), port.as_ptr(), &h, &mut res) };
    assert_eq!(rc, 0);
    res
}

#[test]
fn synchronous_endpoints_as_rdma_server_and_rdma_client_use_them() {
    setup();
    // The server: a passive endpoint with QP attributes; rdma_get_request waits.
    let res = getaddrinfo(c"127.77.0.2", c"45013", RAI_PASSIVE) as usize;
    let mut lid = std::ptr::null_mut();
    let mut init = qp_attr(IBV_QPT_RC);
    // SAFETY: a writable out-pointer, the addrinfo, attributes.
    let rc = unsafe {
        remem_ibv_rdma_create_ep(
            &mut lid,
            res as *mut rdma_addrinfo,
            std::ptr::null_mut(),
            &mut init,
        )
    };
    assert_eq!(rc, 0, "errno {}", errno());
    // SAFETY: the addrinfo, not used afterwards.
    unsafe { remem_ibv_rdma_freeaddrinfo(res as *mut rdma_addrinfo) };
    listen(lid);
    let lidp = lid as usize;
    let (tx, rx) = mpsc::channel::<usize>();
    let server = std::thread::spawn(move || {
        let lid = lidp as *mut rdma_cm_id;
        let mut id = std::ptr::null_mut();
        assert_eq!(
            // SAFETY: a live synchronous listener and a writable out-pointer.
            unsafe { remem_ibv_rdma_get_request(lid, &mut id) },
            0,
            "errno {}",
            errno()
        );
        // The request's QP was made from the endpoint's attributes.
        let qp = get!(id, qp);
        assert!(!qp.is_null());
        let ev = get!(id, event);
        // SAFETY: the request event the new id holds.
        assert_eq!(unsafe { (*ev).event }, RDMA_CM_EVENT_CONNECT_REQUEST);
        assert_eq!(
            // SAFETY: a live id; NULL parameters take the request's.
            unsafe { remem_ibv_rdma_accept(id, std::ptr::null_mut()) },
            0,
            "errno {}",
            errno()
        );
        let ev = get!(id, event);
        // SAFETY: the event the accept left.
        assert_eq!(unsafe { (*ev).event }, RDMA_CM_EVENT_ESTABLISHED);
        tx.send(qp_num(qp) as usize).unwrap();
        // Waits for the client's disconnection (or its own).
        assert_eq!(disconnect(id), 0, "errno {}", errno());
        // SAFETY: a live id; its QP, SRQ and CQs are the endpoint's.
        unsafe { remem_ibv_rdma_destroy_ep(id) };
    });

    let client = bounded(move || {
        let res = getaddrinfo(c"127.77.0.2", c"45013", 0);
        let mut cid = std::ptr::null_mut();
        let mut init = qp_attr(IBV_QPT_RC);
        // SAFETY: a writable out-pointer, the addrinfo, attributes.
        let rc =
            unsafe { remem_ibv_rdma_create_ep(&mut cid, res, std::ptr::null_mut(), &mut init) };
        assert_eq!(rc, 0, "errno {}", errno());
        // SAFETY: the addrinfo, not used afterwards.
        unsafe { remem_ibv_rdma_freeaddrinfo(res) };
        assert!(!get!(cid, qp).is_null());
        assert!(!get!(cid, send_cq_channel).is_null());
        assert_eq!(
            // SAFETY: a live id; NULL parameters are fine with a QP.
            unsafe { remem_ibv_rdma_connect(cid, std::ptr::null_mut()) },
            0,
            "errno {}",
            errno()
        );
        let ev = get!(cid, event);
        // SAFETY: the event the connect left.
        let remote = unsafe { (*ev).param.conn.qp_num };
        assert_eq!(disconnect(cid), 0, "errno {}", errno());
        // SAFETY: a live id.
        unsafe { remem_ibv_rdma_destroy_ep(cid) };
        remote
    });
    let server_qp = rx.recv_timeout(WAIT).expect("the server accepted");
    assert_eq!(client as usize, server_qp);
    bounded(move || server.join().is_ok())
        .then_some(())
        .expect("the server ended");
    // SAFETY: the listener, not used afterwards.
    unsafe { remem_ibv_rdma_destroy_ep(lidp as *mut rdma_cm_id) };
}

#[test]
fn get_request_needs_a_synchronous_listener() {
    setup();
    let ch = channel();
    let lid = create_id(ch, 0, RDMA_PS_TCP);
    let mut id = std::ptr::null_mut();
    // SAFETY: a live id and a writable out-pointer.
    assert_eq!(unsafe { remem_ibv_rdma_get_request(lid, &mut id) }, -1);
    assert_eq!(errno(), libc::EINVAL);
    destroy_id(lid);
    destroy_channel(ch);
}

#[test]
fn disconnections_that_cross_both_succeed() {
    setup();
    let (sch, cch) = (channel(), channel());
    let (lid, cid) = listener_and_client(sch, cch, fake::IPS[0], 45014, RDMA_PS_TCP);
    let _cqp = create_qp(cid, IBV_QPT_RC);
    assert_eq!(connect(cid, b""), 0);
    let req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    let child = ev_id(req);
    let _sqp = create_qp(child, IBV_QPT_RC);
    assert_eq!(accept(child, b""), 0);
    ack(req);
    ack(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
    ack(expect(sch, RDMA_CM_EVENT_ESTABLISHED));
    // The client disconnects; the server's disconnect crosses it (the provider already
    // took the connection down): both succeed, each side sees one DISCONNECTED.
    assert_eq!(disconnect(cid), 0);
    assert_eq!(disconnect(child), 0, "errno {}", errno());
    ack(expect(cch, RDMA_CM_EVENT_DISCONNECTED));
    ack(expect(sch, RDMA_CM_EVENT_DISCONNECTED));
    assert!(!readable(sch, Duration::from_millis(50)) && !readable(cch, Duration::ZERO));
    // An id that never connected still answers the provider's refusal.
    let lone = create_id(cch, 0, RDMA_PS_TCP);
    assert_eq!(resolve(lone, &format!("{}:45014", fake::IPS[0])), 0);
    ack(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
    assert_eq!(disconnect(lone), -1);
    assert_eq!(errno(), libc::EINVAL);
    destroy_qp(cid);
    destroy_qp(child);
    for id in [lone, cid, child, lid] {
        destroy_id(id);
    }
    destroy_channel(sch);
    destroy_channel(cch);
}
