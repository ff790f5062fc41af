//! The queue verbs through their C entry points, in process: a soft device on a loopback
//! address of its own, a context and PD made as `ibv_open_device` / `ibv_alloc_pd` make
//! them, memory registered on remem's PD directly. Every wait is bounded.

#![allow(unsafe_code)]
#![allow(clippy::undocumented_unsafe_blocks)] // test code: every call is a C entry point on objects made here

use crate::abi::*;
use crate::context::{Ctx, Pd, ctx_from, pd_from};
use crate::ffi::queues::*;
use core::ffi::{c_int, c_void};
use remem_verbs::{AccessFlags, Context, MemRegion, MemoryBuffer, MemoryRegion};
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A context on a fresh soft device, a PD, and one registered buffer.
struct Env {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    gid: [u8; 16],
    /// The index of the device's RoCE v2 GID (remem speaks RoCE v2 only).
    sgid: u8,
    buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
}

/// A loopback address no other test uses (127.77.x.y from a counter and the pid).
fn addr() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    format!("127.77.{}.{}:0", (pid % 200) + 1, n % 250 + 1)
        .parse()
        .unwrap()
}

impl Env {
    fn new() -> Env {
        let dev = remem_soft::SoftContext::bind_with(addr(), &remem_soft::SoftOptions::default())
            .expect("a soft device on loopback");
        let dev: Arc<dyn Context> = Arc::new(dev);
        let ctx = Ctx::create(Arc::clone(&dev), null_mut());
        let shared = unsafe { ctx_from(ctx) }.unwrap().shared().clone();
        // The GID programs see (the context's table: RoCE v2 entries from index 0).
        let table = shared.gid_table(1).unwrap();
        let v2 = remem_verbs::first_roce_v2_ipv4(&table)
            .cloned()
            .expect("a RoCE v2 IPv4 GID");
        let (gid, sgid) = (v2.gid.0, v2.index as u8);
        let pd = Pd::create(&shared, dev.alloc_pd().unwrap());
        let buf = Arc::new(MemoryBuffer::zeroed(1 << 16).unwrap());
        let mr = unsafe { pd_from(pd) }
            .unwrap()
            .inner
            .pd
            .reg_mr(
                MemRegion::whole(Arc::clone(&buf)),
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .unwrap();
        Env {
            ctx,
            pd,
            gid,
            sgid,
            buf,
            mr,
        }
    }

    fn sge(&self, off: u64, len: u32) -> ibv_sge {
        ibv_sge {
            addr: self.mr.addr() + off,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn cq(&self, cqe: c_int, ch: *mut ibv_comp_channel) -> *mut ibv_cq {
        let cq = unsafe { remem_ibv_ibv_create_cq(self.ctx, cqe, null_mut(), ch, 0) };
        assert!(!cq.is_null(), "create_cq: {}", crate::ffi::errno());
        cq
    }

    fn qp(
        &self,
        t: ibv_qp_type,
        scq: *mut ibv_cq,
        rcq: *mut ibv_cq,
        srq: *mut ibv_srq,
    ) -> *mut ibv_qp {
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: scq,
            recv_cq: rcq,
            srq,
            cap: ibv_qp_cap {
                max_send_wr: 32,
                max_recv_wr: 32,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            qp_type: t,
            sq_sig_all: 0,
        };
        let qp = unsafe { remem_ibv_ibv_create_qp(self.pd, &mut init) };
        assert!(!qp.is_null(), "create_qp: {}", crate::ffi::errno());
        assert_eq!(init.cap.max_inline_data, 64);
        // rxe grants what fits the 64-byte send WQE: 4 SGEs of 16 bytes.
        assert_eq!(init.cap.max_send_sge, 4);
        qp
    }

    /// Brings an RC/UC QP to RTS towards `dest`.
    fn connect(&self, qp: *mut ibv_qp, dest: u32) {
        let mut a = zero_attr();
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC;
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(
            unsafe { remem_ibv_ibv_modify_qp(qp, &mut a, m as c_int) },
            0
        );
        assert_eq!(unsafe { (*qp).state }, IBV_QPS_INIT);
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = dest;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: self.gid };
        a.ah_attr.grh.sgid_index = self.sgid;
        a.ah_attr.grh.hop_limit = 1;
        let m = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        assert_eq!(
            unsafe { remem_ibv_ibv_modify_qp(qp, &mut a, m as c_int) },
            0
        );
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        let m = IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC;
        assert_eq!(
            unsafe { remem_ibv_ibv_modify_qp(qp, &mut a, m as c_int) },
            0
        );
        assert_eq!(unsafe { (*qp).state }, IBV_QPS_RTS);
    }
}

fn zero_attr() -> ibv_qp_attr {
    unsafe { std::mem::zeroed() }
}

fn zero_wr() -> ibv_send_wr {
    unsafe { std::mem::zeroed() }
}

fn zero_wc() -> ibv_wc {
    unsafe { std::mem::zeroed() }
}

/// Polls until `n` completions arrived (10 s at most).
fn poll(cq: *mut ibv_cq, n: usize) -> Vec<ibv_wc> {
    let mut out = vec![zero_wc(); n];
    let mut got = 0;
    let end = Instant::now() + Duration::from_secs(10);
    while got < n && Instant::now() < end {
        let r = unsafe {
            crate::ffi::queues::poll_cq(cq, (n - got) as c_int, out.as_mut_ptr().add(got))
        };
        assert!(r >= 0, "poll_cq: {r}");
        got += r as usize;
        if r == 0 {
            std::thread::yield_now();
        }
    }
    assert_eq!(got, n, "completions within 10 s");
    out
}

fn post(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> (c_int, *mut ibv_send_wr) {
    let mut bad = null_mut();
    let r = unsafe { post_send(qp, wr, &mut bad) };
    (r, bad)
}

fn recv(qp: *mut ibv_qp, wr_id: u64, sge: &mut ibv_sge) {
    let mut w = ibv_recv_wr {
        wr_id,
        next: null_mut(),
        sg_list: sge,
        num_sge: 1,
    };
    let mut bad = null_mut();
    assert_eq!(unsafe { post_recv(qp, &mut w, &mut bad) }, 0);
}

#[test]
fn rc_send_write_read_atomic_inline_and_errors() {
    let e = Env::new();
    let cq = e.cq(64, null_mut());
    let a = e.qp(IBV_QPT_RC, cq, cq, null_mut());
    let b = e.qp(IBV_QPT_RC, cq, cq, null_mut());
    let (qa, qb) = unsafe { ((*a).qp_num, (*b).qp_num) };
    e.connect(a, qb);
    e.connect(b, qa);

    // A CQ in use cannot be destroyed.
    assert_eq!(unsafe { remem_ibv_ibv_destroy_cq(cq) }, libc::EBUSY);

    // Inline SEND with immediate from unregistered (stack) memory.
    let mut rs = e.sge(4096, 256);
    recv(b, 7, &mut rs);
    let mut local = *b"hello from the stack, not an MR!";
    let mut s = ibv_sge {
        addr: local.as_mut_ptr() as u64,
        length: local.len() as u32,
        lkey: 0,
    };
    let mut w = zero_wr();
    w.wr_id = 1;
    w.sg_list = &mut s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND_WITH_IMM;
    w.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    w.u_imm_data.imm_data = 0xa1b2_c3d4u32.to_be();
    assert_eq!(post(a, &mut w).0, 0);
    local.fill(0);
    let wcs = poll(cq, 2);
    let rx = wcs.iter().find(|c| c.wr_id == 7).expect("the receive");
    let tx = wcs.iter().find(|c| c.wr_id == 1).expect("the send");
    assert_eq!(
        (tx.status, tx.opcode, tx.qp_num),
        (IBV_WC_SUCCESS, IBV_WC_SEND, qa)
    );
    assert_eq!(
        (rx.status, rx.opcode, rx.byte_len),
        (IBV_WC_SUCCESS, IBV_WC_RECV, 32)
    );
    assert_ne!(rx.wc_flags & IBV_WC_WITH_IMM, 0);
    assert_eq!(u32::from_be(unsafe { rx.u_imm_data.imm_data }), 0xa1b2_c3d4);
    assert_eq!(rx.qp_num, qb);
    assert_eq!(
        &e.buf.to_vec(4096, 32).unwrap()[..],
        b"hello from the stack, not an MR!"
    );

    // RDMA WRITE of two SGEs, then READ it back elsewhere.
    e.buf.write(0, b"abcdefgh12345678").unwrap();
    let mut two = [e.sge(0, 8), e.sge(8, 8)];
    let mut w = zero_wr();
    w.wr_id = 2;
    w.sg_list = two.as_mut_ptr();
    w.num_sge = 2;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma = ibv_send_wr_rdma {
        remote_addr: e.mr.addr() + 8192,
        rkey: e.mr.rkey(),
    };
    let mut rd = e.sge(12288, 16);
    let mut r = zero_wr();
    r.wr_id = 3;
    r.sg_list = &mut rd;
    r.num_sge = 1;
    r.opcode = IBV_WR_RDMA_READ;
    r.send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
    r.wr.rdma = ibv_send_wr_rdma {
        remote_addr: e.mr.addr() + 8192,
        rkey: e.mr.rkey(),
    };
    w.next = &mut r;
    assert_eq!(post(a, &mut w).0, 0);
    let wcs = poll(cq, 2);
    assert_eq!(wcs[0].wr_id, 2);
    assert_eq!(
        (wcs[1].wr_id, wcs[1].opcode, wcs[1].byte_len),
        (3, IBV_WC_RDMA_READ, 16)
    );
    assert_eq!(&e.buf.to_vec(12288, 16).unwrap()[..], b"abcdefgh12345678");

    // Fetch-and-add and compare-and-swap.
    e.buf.store_u64(16384, 40).unwrap();
    let mut res = e.sge(16392, 8);
    let mut f = zero_wr();
    f.wr_id = 4;
    f.sg_list = &mut res;
    f.num_sge = 1;
    f.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    f.send_flags = IBV_SEND_SIGNALED;
    f.wr.atomic = ibv_send_wr_atomic {
        remote_addr: e.mr.addr() + 16384,
        compare_add: 2,
        swap: 0,
        rkey: e.mr.rkey(),
    };
    assert_eq!(post(a, &mut f).0, 0);
    let wc = poll(cq, 1)[0];
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, 8)
    );
    assert_eq!(e.buf.load_u64(16392).unwrap(), 40);
    assert_eq!(e.buf.load_u64(16384).unwrap(), 42);
    f.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
    f.wr.atomic.compare_add = 42;
    f.wr.atomic.swap = 7;
    assert_eq!(post(a, &mut f).0, 0);
    assert_eq!(poll(cq, 1)[0].opcode, IBV_WC_COMP_SWAP);
    assert_eq!(e.buf.load_u64(16384).unwrap(), 7);

    // Errors: a bad opcode second in a list (the first is posted), too many SGEs, a bad
    // lkey, inline above max_inline_data, a UD-only field on RC is ignored.
    let mut ok = zero_wr();
    let mut sg = e.sge(0, 8);
    ok.wr_id = 10;
    ok.sg_list = &mut sg;
    ok.num_sge = 1;
    ok.opcode = IBV_WR_RDMA_WRITE;
    ok.send_flags = IBV_SEND_SIGNALED;
    ok.wr.rdma = ibv_send_wr_rdma {
        remote_addr: e.mr.addr(),
        rkey: e.mr.rkey(),
    };
    let mut badop = ok;
    badop.wr_id = 11;
    badop.opcode = 77;
    ok.next = &mut badop;
    let (r, bad) = post(a, &mut ok);
    assert_eq!((r, bad), (libc::EINVAL, &raw mut badop));
    assert_eq!(poll(cq, 1)[0].wr_id, 10);
    ok.next = null_mut();
    // Past the 4 SGEs granted.
    let mut five = [e.sge(0, 8); 5];
    let mut many = ok;
    many.sg_list = five.as_mut_ptr();
    many.num_sge = 5;
    assert_eq!(post(a, &mut many), (libc::EINVAL, &raw mut many));
    let mut badkey = ok;
    let mut bsg = ibv_sge {
        lkey: e.mr.lkey() ^ 0x100,
        ..e.sge(0, 8)
    };
    badkey.sg_list = &mut bsg;
    assert_eq!(post(a, &mut badkey), (libc::EINVAL, &raw mut badkey));
    let big = [0u8; 65];
    let mut bigs = ibv_sge {
        addr: big.as_ptr() as u64,
        length: 65,
        lkey: 0,
    };
    let mut inl = ok;
    inl.sg_list = &mut bigs;
    inl.send_flags |= IBV_SEND_INLINE;
    assert_eq!(post(a, &mut inl), (libc::EINVAL, &raw mut inl));
    let mut unk = ok;
    unk.send_flags = 1 << 9;
    assert_eq!(post(a, &mut unk), (libc::EINVAL, &raw mut unk));

    // Query.
    let mut qa_attr = zero_attr();
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { remem_ibv_ibv_query_qp(a, &mut qa_attr, 0, &mut init) },
        0
    );
    assert_eq!((qa_attr.qp_state, qa_attr.dest_qp_num), (IBV_QPS_RTS, qb));
    assert_eq!(qa_attr.path_mtu, IBV_MTU_1024);
    assert_eq!(qa_attr.ah_attr.is_global, 1);
    assert_eq!(
        qa_attr.ah_attr.grh.sgid_index, e.sgid,
        "the program's GID index"
    );
    assert_eq!(unsafe { qa_attr.ah_attr.grh.dgid.raw }, e.gid);
    assert_eq!((init.send_cq, init.qp_type), (cq, IBV_QPT_RC));
    assert_eq!(init.cap.max_inline_data, 64);

    // ibv_qp_to_qp_ex: only for QPs made with the ex API.
    assert!(unsafe { remem_ibv_ibv_qp_to_qp_ex(a) }.is_null());

    assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(a) }, 0);
    assert_eq!(
        unsafe { remem_ibv_ibv_destroy_cq(cq) },
        libc::EBUSY,
        "b still uses it"
    );
    assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(b) }, 0);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_cq(cq) }, 0);
}

#[test]
fn wr_api_and_cq_ex() {
    let e = Env::new();
    let mut cattr = ibv_cq_init_attr_ex {
        cqe: 32,
        cq_context: null_mut(),
        channel: null_mut(),
        comp_vector: 0,
        wc_flags: IBV_WC_STANDARD_FLAGS,
        comp_mask: 0,
        flags: 0,
        parent_domain: null_mut(),
    };
    let cqx = unsafe { crate::ffi::queues::create_cq_ex(e.ctx, &mut cattr) };
    assert!(!cqx.is_null());
    let cq: *mut ibv_cq = cqx.cast();
    // Timestamps are not offered.
    let mut ts = cattr;
    ts.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    assert!(unsafe { crate::ffi::queues::create_cq_ex(e.ctx, &mut ts) }.is_null());
    assert_eq!(crate::ffi::errno(), libc::EOPNOTSUPP);

    let mk = |ops: u64| {
        let mut x: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        x.send_cq = cq;
        x.recv_cq = cq;
        x.cap = ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 32,
        };
        x.qp_type = IBV_QPT_RC;
        x.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        x.pd = e.pd;
        x.send_ops_flags = ops;
        x
    };
    let mut bad = mk(IBV_QP_EX_WITH_TSO);
    assert!(unsafe { create_qp_ex(e.ctx, &mut bad) }.is_null());
    assert_eq!(crate::ffi::errno(), libc::EOPNOTSUPP);
    let mut nopd = mk(0);
    nopd.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    assert!(unsafe { create_qp_ex(e.ctx, &mut nopd) }.is_null());
    assert_eq!(crate::ffi::errno(), libc::EINVAL);

    let ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    let (mut xa, mut xb) = (mk(ops), mk(ops));
    let a = unsafe { create_qp_ex(e.ctx, &mut xa) };
    let b = unsafe { create_qp_ex(e.ctx, &mut xb) };
    assert!(!a.is_null() && !b.is_null());
    e.connect(a, unsafe { (*b).qp_num });
    e.connect(b, unsafe { (*a).qp_num });
    let qx = unsafe { remem_ibv_ibv_qp_to_qp_ex(a) };
    assert_eq!(qx.cast::<ibv_qp>(), a);

    let mut rs = e.sge(1024, 64);
    recv(b, 100, &mut rs);
    e.buf.write(0, b"written by wr_rdma_write").unwrap();
    let inline = *b"inline via wr_set_inline_data";
    unsafe {
        let x = &mut *qx;
        (x.wr_start.unwrap())(qx);
        x.wr_id = 1;
        x.wr_flags = IBV_SEND_SIGNALED;
        (x.wr_rdma_write.unwrap())(qx, e.mr.rkey(), e.mr.addr() + 512);
        (x.wr_set_sge.unwrap())(qx, e.mr.lkey(), e.mr.addr(), 24);
        x.wr_id = 2;
        x.wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        (x.wr_send_imm.unwrap())(qx, 0x0506_0708u32.to_be());
        (x.wr_set_inline_data.unwrap())(qx, inline.as_ptr() as *mut c_void, inline.len());
        assert_eq!((x.wr_complete.unwrap())(qx), 0);
    }

    // The extended poll API: three completions (write, send, receive) in some order.
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 && Instant::now() < end {
        let x = unsafe { &*cqx };
        let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
        let mut r = unsafe { (x.start_poll.unwrap())(cqx, &mut attr) };
        if r == libc::ENOENT {
            std::thread::yield_now();
            continue;
        }
        while r == 0 {
            let x = unsafe { &*cqx };
            let op = unsafe { (x.read_opcode.unwrap())(cqx) };
            let len = unsafe { (x.read_byte_len.unwrap())(cqx) };
            let imm = unsafe { (x.read_imm_data.unwrap())(cqx) };
            let flags = unsafe { (x.read_wc_flags.unwrap())(cqx) };
            let qpn = unsafe { (x.read_qp_num.unwrap())(cqx) };
            seen.push((x.wr_id, x.status, op, len, imm, flags, qpn));
            r = unsafe { (x.next_poll.unwrap())(cqx) };
        }
        assert_eq!(r, libc::ENOENT);
        unsafe { ((*cqx).end_poll.unwrap())(cqx) };
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    let rx = seen.iter().find(|s| s.0 == 100).unwrap();
    assert_eq!(
        (rx.1, rx.2, rx.3),
        (IBV_WC_SUCCESS, IBV_WC_RECV, inline.len() as u32)
    );
    assert_eq!(u32::from_be(rx.4), 0x0506_0708);
    assert_ne!(rx.5 & IBV_WC_WITH_IMM, 0);
    assert_eq!(rx.6, unsafe { (*b).qp_num });
    assert!(seen.iter().any(|s| s.0 == 1 && s.2 == IBV_WC_RDMA_WRITE));
    assert_eq!(
        &e.buf.to_vec(512, 24).unwrap()[..],
        b"written by wr_rdma_write"
    );
    assert_eq!(&e.buf.to_vec(1024, inline.len()).unwrap()[..], &inline[..]);

    // A builder remem does not offer, or a setter with no WR, fails the whole batch.
    unsafe {
        let x = &mut *qx;
        (x.wr_start.unwrap())(qx);
        x.wr_id = 3;
        x.wr_flags = IBV_SEND_SIGNALED;
        (x.wr_rdma_write.unwrap())(qx, e.mr.rkey(), e.mr.addr());
        (x.wr_set_sge.unwrap())(qx, e.mr.lkey(), e.mr.addr(), 8);
        (x.wr_send_tso.unwrap())(qx, std::ptr::null_mut(), 0, 0);
        assert_eq!((x.wr_complete.unwrap())(qx), libc::EOPNOTSUPP);
        (x.wr_start.unwrap())(qx);
        (x.wr_set_sge.unwrap())(qx, e.mr.lkey(), e.mr.addr(), 8);
        assert_eq!((x.wr_complete.unwrap())(qx), libc::EINVAL);
        (x.wr_start.unwrap())(qx);
        (x.wr_send.unwrap())(qx);
        (x.wr_abort.unwrap())(qx);
        (x.wr_start.unwrap())(qx);
        assert_eq!((x.wr_complete.unwrap())(qx), 0, "an empty batch");
    }
    let mut one = [zero_wc()];
    assert_eq!(
        unsafe { crate::ffi::queues::poll_cq(cq, 1, one.as_mut_ptr()) },
        0,
        "nothing was posted"
    );

    for q in [a, b] {
        assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(q) }, 0);
    }
    assert_eq!(unsafe { remem_ibv_ibv_destroy_cq(cq) }, 0);
}

#[test]
fn ud_datagram_and_reply_address() {
    let e = Env::new();
    let cq = e.cq(16, null_mut());
    let a = e.qp(IBV_QPT_UD, cq, cq, null_mut());
    let b = e.qp(IBV_QPT_UD, cq, cq, null_mut());
    for q in [a, b] {
        let mut x = zero_attr();
        x.qp_state = IBV_QPS_INIT;
        x.port_num = 1;
        x.qkey = 0x1111_1111;
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        assert_eq!(unsafe { remem_ibv_ibv_modify_qp(q, &mut x, m as c_int) }, 0);
        x.qp_state = IBV_QPS_RTR;
        assert_eq!(
            unsafe { remem_ibv_ibv_modify_qp(q, &mut x, IBV_QP_STATE as c_int) },
            0
        );
        x.qp_state = IBV_QPS_RTS;
        let m = IBV_QP_STATE | IBV_QP_SQ_PSN;
        assert_eq!(unsafe { remem_ibv_ibv_modify_qp(q, &mut x, m as c_int) }, 0);
    }
    let mut ah_attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    ah_attr.port_num = 1;
    ah_attr.grh.dgid = ibv_gid { raw: e.gid };
    ah_attr.grh.sgid_index = e.sgid;
    assert!(
        unsafe { remem_ibv_ibv_create_ah(e.pd, &mut ah_attr) }.is_null(),
        "no GRH"
    );
    assert_eq!(crate::ffi::errno(), libc::EINVAL);
    ah_attr.is_global = 1;
    ah_attr.grh.hop_limit = 1;
    let ah = unsafe { remem_ibv_ibv_create_ah(e.pd, &mut ah_attr) };
    assert!(!ah.is_null());

    let mut rs = e.sge(0, 40 + 64);
    recv(b, 9, &mut rs);
    e.buf.write(4096, b"datagram").unwrap();
    let mut s = e.sge(4096, 8);
    let mut w = zero_wr();
    w.wr_id = 1;
    w.sg_list = &mut s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.ud = ibv_send_wr_ud {
        ah,
        remote_qpn: unsafe { (*b).qp_num },
        remote_qkey: 0x1111_1111,
    };
    assert_eq!(post(a, &mut w).0, 0);
    let wcs = poll(cq, 2);
    let rx = *wcs.iter().find(|c| c.wr_id == 9).unwrap();
    assert_eq!((rx.status, rx.byte_len), (IBV_WC_SUCCESS, 48));
    assert_ne!(rx.wc_flags & IBV_WC_GRH, 0);
    assert_eq!(rx.src_qp, unsafe { (*a).qp_num });
    assert_eq!(&e.buf.to_vec(40, 8).unwrap()[..], b"datagram");

    // The reply's address: back to the sender's GID, from our GID index 0.
    let grh = e.buf.to_vec(0, 40).unwrap();
    let mut back: ibv_ah_attr = unsafe { std::mem::zeroed() };
    let mut rxw = rx;
    let r = unsafe {
        remem_ibv_ibv_init_ah_from_wc(e.ctx, 1, &mut rxw, grh.as_ptr() as *mut ibv_grh, &mut back)
    };
    assert_eq!(r, 0);
    assert_eq!(
        (back.is_global, back.port_num, back.grh.sgid_index),
        (1, 1, e.sgid)
    );
    assert_eq!(unsafe { back.grh.dgid.raw }, e.gid);
    let reply =
        unsafe { remem_ibv_ibv_create_ah_from_wc(e.pd, &mut rxw, grh.as_ptr() as *mut ibv_grh, 1) };
    assert!(!reply.is_null());

    // A UD send without an address handle is EINVAL.
    w.wr.ud.ah = null_mut();
    assert_eq!(post(a, &mut w), (libc::EINVAL, &raw mut w));

    for q in [a, b] {
        assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(q) }, 0);
    }
    assert_eq!(unsafe { remem_ibv_ibv_destroy_ah(ah) }, 0);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_ah(reply) }, 0);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_cq(cq) }, 0);
}

#[test]
fn srq_shared_by_two_qps() {
    let e = Env::new();
    let cq = e.cq(32, null_mut());
    let mut sattr = ibv_srq_init_attr {
        srq_context: null_mut(),
        attr: ibv_srq_attr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        },
    };
    let srq = unsafe { remem_ibv_ibv_create_srq(e.pd, &mut sattr) };
    assert!(!srq.is_null());
    assert!(sattr.attr.max_wr >= 8);
    let mut num = 0;
    assert_eq!(unsafe { get_srq_num(srq, &mut num) }, 0);
    assert_ne!(num, 0);
    let a = e.qp(IBV_QPT_RC, cq, cq, null_mut());
    let b = e.qp(IBV_QPT_RC, cq, cq, srq);
    e.connect(a, unsafe { (*b).qp_num });
    e.connect(b, unsafe { (*a).qp_num });
    // b takes receives only from the SRQ.
    let mut rs = e.sge(0, 64);
    let mut rw = ibv_recv_wr {
        wr_id: 5,
        next: null_mut(),
        sg_list: &mut rs,
        num_sge: 1,
    };
    let mut badr = null_mut();
    assert_eq!(unsafe { post_recv(b, &mut rw, &mut badr) }, libc::EINVAL);
    assert_eq!(badr, &raw mut rw);
    let mut rs2 = e.sge(64, 64);
    let mut rw2 = ibv_recv_wr {
        wr_id: 6,
        next: null_mut(),
        sg_list: &mut rs2,
        num_sge: 1,
    };
    rw.next = &mut rw2;
    assert_eq!(unsafe { post_srq_recv(srq, &mut rw, &mut badr) }, 0);

    // Limit: arm at 2 with 2 queued; one receive taken fires SRQ_LIMIT_REACHED.
    let mut la = ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: 100,
    };
    assert_eq!(
        unsafe { remem_ibv_ibv_modify_srq(srq, &mut la, IBV_SRQ_LIMIT as c_int) },
        libc::EINVAL
    );
    la.srq_limit = 2;
    assert_eq!(
        unsafe { remem_ibv_ibv_modify_srq(srq, &mut la, IBV_SRQ_LIMIT as c_int) },
        0
    );
    la.max_wr = 1 << 20;
    assert_eq!(
        unsafe { remem_ibv_ibv_modify_srq(srq, &mut la, IBV_SRQ_MAX_WR as c_int) },
        libc::EOPNOTSUPP
    );
    let mut q = ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: 0,
    };
    assert_eq!(unsafe { remem_ibv_ibv_query_srq(srq, &mut q) }, 0);
    assert_eq!(q.srq_limit, 2);

    let mut s = e.sge(1024, 4);
    let mut w = zero_wr();
    w.wr_id = 1;
    w.sg_list = &mut s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    assert_eq!(post(a, &mut w).0, 0);
    let wcs = poll(cq, 2);
    assert!(wcs.iter().any(|c| c.wr_id == 5 && c.opcode == IBV_WC_RECV));
    let shared = unsafe { ctx_from(e.ctx) }.unwrap().shared().clone();
    let end = Instant::now() + Duration::from_secs(10);
    let ev = loop {
        if let Some(ev) = shared.dev.get_async_event() {
            break ev;
        }
        assert!(Instant::now() < end, "SRQ_LIMIT_REACHED within 10 s");
        std::thread::yield_now();
    };
    assert_eq!(ev.event_type, remem_verbs::AsyncEventType::SrqLimitReached);
    assert_eq!(ev.element, remem_verbs::AsyncEventElement::Srq(num));
    assert_eq!(shared.srq_ptr(num), Some(srq));

    assert_eq!(unsafe { remem_ibv_ibv_destroy_srq(srq) }, libc::EBUSY);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(b) }, 0);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_srq(srq) }, 0);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(a) }, 0);
    assert_eq!(unsafe { remem_ibv_ibv_destroy_cq(cq) }, 0);
}

/// Pointers handed to a thread (the objects outlive it).
struct Send<T>(T);
// SAFETY: test objects used by one thread at a time, joined before they are freed.
unsafe impl<T> std::marker::Send for Send<T> {}

#[test]
fn channel_events_block_ack_and_busy() {
    let e = Env::new();
    let ch = unsafe { remem_ibv_ibv_create_comp_channel(e.ctx) };
    assert!(!ch.is_null());
    let mut cookie = 5u8;
    let cq = unsafe { remem_ibv_ibv_create_cq(e.ctx, 8, (&raw mut cookie).cast(), ch, 0) };
    assert!(!cq.is_null());
    assert!(unsafe { remem_ibv_ibv_create_cq(e.ctx, 8, null_mut(), ch, 1) }.is_null());
    assert_eq!(
        crate::ffi::errno(),
        libc::EINVAL,
        "comp_vector out of range"
    );
    assert_eq!(
        unsafe { remem_ibv_ibv_destroy_comp_channel(ch) },
        libc::EBUSY
    );

    // The fd is handed out blocking; O_NONBLOCK set by the program makes an empty channel
    // EAGAIN at once.
    let fd = unsafe { (*ch).fd };
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert_eq!(fl & libc::O_NONBLOCK, 0, "a blocking fd, as rdma-core's");
    assert_eq!(
        unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) },
        0
    );
    let (mut c, mut x) = (null_mut(), null_mut());
    assert_eq!(
        unsafe { remem_ibv_ibv_get_cq_event(ch, &mut c, &mut x) },
        -1
    );
    assert_eq!(crate::ffi::errno(), libc::EAGAIN);
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, fl) }, 0);
    let a = e.qp(IBV_QPT_RC, cq, cq, null_mut());
    let b = e.qp(IBV_QPT_RC, cq, cq, null_mut());
    e.connect(a, unsafe { (*b).qp_num });
    e.connect(b, unsafe { (*a).qp_num });
    assert_eq!(unsafe { req_notify_cq(cq, 0) }, 0);

    // A thread blocks in ibv_get_cq_event; a completion wakes it.
    let waiter = {
        let ch = Send(ch);
        std::thread::spawn(move || {
            let ch = ch;
            let mut got: *mut ibv_cq = null_mut();
            let mut ctx: *mut c_void = null_mut();
            let r = unsafe { remem_ibv_ibv_get_cq_event(ch.0, &mut got, &mut ctx) };
            Send((r, got, ctx))
        })
    };
    let mut s = e.sge(0, 8);
    let mut w = zero_wr();
    w.wr_id = 1;
    w.sg_list = &mut s;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma = ibv_send_wr_rdma {
        remote_addr: e.mr.addr() + 64,
        rkey: e.mr.rkey(),
    };
    assert_eq!(post(a, &mut w).0, 0);
    let Send((r, got, ctx)) = waiter.join().unwrap();
    assert_eq!(r, 0);
    assert_eq!(got, cq);
    assert_eq!(ctx, (&raw mut cookie).cast());
    assert_eq!(poll(cq, 1)[0].wr_id, 1);

    // destroy_cq waits for the ack: a thread destroying it finishes only after it.
    for q in [a, b] {
        assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(q) }, 0);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let destroyer = {
        let cq = Send(cq);
        std::thread::spawn(move || {
            let cq = cq;
            let r = unsafe { remem_ibv_ibv_destroy_cq(cq.0) };
            tx.send(r).unwrap();
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "destroy_cq returned before the event was acked"
    );
    unsafe { remem_ibv_ibv_ack_cq_events(cq, 1) };
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0);
    destroyer.join().unwrap();
    assert_eq!(unsafe { remem_ibv_ibv_destroy_comp_channel(ch) }, 0);
}

#[test]
fn cq_overrun_fails_poll() {
    let e = Env::new();
    let tiny = e.cq(1, null_mut());
    let cq = e.cq(16, null_mut());
    let a = e.qp(IBV_QPT_RC, tiny, tiny, null_mut());
    let b = e.qp(IBV_QPT_RC, cq, cq, null_mut());
    e.connect(a, unsafe { (*b).qp_num });
    e.connect(b, unsafe { (*a).qp_num });
    let mut s = e.sge(0, 8);
    let mut ws: Vec<ibv_send_wr> = (0..3)
        .map(|i| {
            let mut w = zero_wr();
            w.wr_id = i;
            w.sg_list = &mut s;
            w.num_sge = 1;
            w.opcode = IBV_WR_RDMA_WRITE;
            w.send_flags = IBV_SEND_SIGNALED;
            w.wr.rdma = ibv_send_wr_rdma {
                remote_addr: e.mr.addr(),
                rkey: e.mr.rkey(),
            };
            w
        })
        .collect();
    for w in &mut ws {
        assert_eq!(post(a, w).0, 0);
    }
    // Nothing is polled until the CQ has overrun (its CQ_ERR event is raised).
    let shared = unsafe { ctx_from(e.ctx) }.unwrap().shared().clone();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(ev) = shared.dev.get_async_event() {
            assert_eq!(ev.event_type, remem_verbs::AsyncEventType::CqErr);
            break;
        }
        assert!(Instant::now() < end, "CQ_ERR within 10 s");
        std::thread::yield_now();
    }
    // The completion queued before the overrun, then the error.
    let mut wc = [zero_wc(), zero_wc()];
    assert_eq!(
        unsafe { crate::ffi::queues::poll_cq(tiny, 2, wc.as_mut_ptr()) },
        1
    );
    assert_eq!(wc[0].wr_id, 0);
    let r = unsafe { crate::ffi::queues::poll_cq(tiny, 2, wc.as_mut_ptr()) };
    assert_eq!(r, -libc::ENOMEM);
    assert_eq!(crate::ffi::errno(), libc::ENOMEM);
    for q in [a, b] {
        assert_eq!(unsafe { remem_ibv_ibv_destroy_qp(q) }, 0);
    }
}

/// Async events across two opens of a device (moved from `event`, whose module is safe
/// code: the test reads the program's side through raw pointers).
mod async_events {
    use crate::abi::*;
    use crate::context::{Ctx, ctx_from};
    use crate::event::translate;
    use remem_verbs::{AsyncEvent, AsyncEventElement, AsyncEventType, CqId};
    use std::sync::Arc;

    #[test]
    fn each_open_of_a_device_has_its_own_async_fd_and_its_own_objects_events() {
        let dev: Arc<dyn remem_verbs::Context> = Arc::new(
            remem_soft::SoftContext::bind_with(
                "127.0.0.1:0".parse().unwrap(),
                &remem_soft::SoftOptions::default(),
            )
            .unwrap(),
        );
        let (a, b) = (
            Ctx::create(Arc::clone(&dev), std::ptr::null_mut()),
            Ctx::create(Arc::clone(&dev), std::ptr::null_mut()),
        );
        // SAFETY: live contexts just made.
        let (sa, sb) = unsafe {
            (
                Arc::clone(ctx_from(a).unwrap().shared()),
                Arc::clone(ctx_from(b).unwrap().shared()),
            )
        };
        // Two descriptors, as two opens of a kernel device give (UCX keys its event
        // handlers by descriptor; O_NONBLOCK on one must not change the other).
        // SAFETY: live contexts.
        let (fa, fb) = unsafe { ((*a).async_fd, (*b).async_fd) };
        assert!(fa >= 0 && fb >= 0 && fa != fb, "{fa} {fb}");
        assert!(sa.events.is_some() && sb.events.is_some());
        let cq = 0x2000 as *mut ibv_cq;
        sb.register_cq(CqId(3), cq);
        let ev = AsyncEvent {
            event_type: AsyncEventType::CqErr,
            element: AsyncEventElement::Cq(CqId(3)),
        };
        // The event reaches both queues; only the owner's context reports it.
        assert!(translate(&sa, &ev).is_none(), "another context's CQ");
        let got = translate(&sb, &ev).expect("its own CQ");
        assert_eq!(got.event_type, IBV_EVENT_CQ_ERR);
        // SAFETY: a CQ event carries a CQ pointer.
        assert_eq!(unsafe { got.element.cq }, cq);
        sb.event_acked(cq as usize);
        sb.unregister_cq(CqId(3));
        assert!(
            translate(&sb, &ev).is_none(),
            "destroyed objects get no events"
        );
        // A port event goes to every context.
        let port = AsyncEvent {
            event_type: AsyncEventType::PortActive,
            element: AsyncEventElement::Port(1),
        };
        for s in [&sa, &sb] {
            let port = translate(s, &port).unwrap();
            // SAFETY: a port event carries a port number.
            let port_num = unsafe { port.element.port_num };
            assert_eq!(port_num, 1);
        }
        // SAFETY: made by Ctx::create, not used afterwards.
        unsafe {
            crate::ffi::handles::ctx_free(a);
            crate::ffi::handles::ctx_free(b);
        }
    }
}

/// `ibv_rereg_mr` through its entry point (moved from `mr`, whose module is safe code).
mod rereg {
    use crate::abi::*;
    use crate::ffi::device::{
        remem_ibv_ibv_dereg_mr, remem_ibv_ibv_reg_mr, remem_ibv_ibv_rereg_mr,
    };
    use crate::mr::Mr;
    use core::ffi::c_int;
    use remem_verbs::AccessFlags;
    use std::ptr::null_mut;
    use std::sync::Arc;

    #[test]
    fn rereg_keeps_the_object_and_handle_and_drops_the_old_registration() {
        let ctx =
            crate::context::Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context.
        let pd = unsafe { crate::ffi::device::remem_ibv_ibv_alloc_pd(ctx) };
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 2048];
        let rw = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        // SAFETY: live PD, memory that outlives the MR.
        let mr = unsafe { remem_ibv_ibv_reg_mr(pd, a.as_mut_ptr().cast(), a.len(), rw) };
        assert!(!mr.is_null());
        // SAFETY: the live MR just made (read through its pointer only).
        let (handle, rkey, old) = unsafe {
            (
                (*mr).handle,
                (*mr).rkey,
                Arc::clone(&(*mr.cast::<Mr>()).inner.state().mr),
            )
        };
        let rereg = |flags: u32, addr: *mut u8, len: usize, access: u32| {
            // SAFETY: live MR and PD; the memory outlives the MR.
            unsafe {
                remem_ibv_ibv_rereg_mr(mr, flags as c_int, pd, addr.cast(), len, access as c_int)
            }
        };
        // Bad input: nothing changes.
        assert_eq!(rereg(0, null_mut(), 0, 0), IBV_REREG_MR_ERR_INPUT);
        assert_eq!(
            rereg(
                IBV_REREG_MR_CHANGE_ACCESS,
                null_mut(),
                0,
                IBV_ACCESS_REMOTE_WRITE
            ),
            IBV_REREG_MR_ERR_INPUT
        );
        // SAFETY: the live MR.
        assert_eq!(unsafe { (*mr).rkey }, rkey);
        // Access and translation at once.
        let flags = IBV_REREG_MR_CHANGE_ACCESS | IBV_REREG_MR_CHANGE_TRANSLATION;
        assert_eq!(
            rereg(flags, b.as_mut_ptr(), b.len(), IBV_ACCESS_LOCAL_WRITE),
            0
        );
        // SAFETY: the live MR.
        let m = unsafe { &*mr.cast::<Mr>() };
        assert_eq!(m.abi.handle, handle, "same handle");
        assert_ne!(m.abi.rkey, rkey, "new keys");
        assert_eq!((m.abi.addr, m.abi.length), (b.as_mut_ptr().cast(), b.len()));
        let st = m.inner.state();
        assert_eq!(st.mr.access(), AccessFlags::LOCAL_WRITE);
        assert_eq!((st.mr.addr(), st.mr.len()), (b.as_ptr() as u64, b.len()));
        drop(st);
        // The old registration is gone (its last handle is the test's): its keys are
        // revoked when that drops, as at ibv_dereg_mr.
        assert_eq!(Arc::strong_count(&old), 1);
        drop(old);
        // SAFETY: the live MR and PD, not used afterwards.
        unsafe {
            assert_eq!(remem_ibv_ibv_dereg_mr(mr), 0);
            assert_eq!(crate::ffi::device::remem_ibv_ibv_dealloc_pd(pd), 0);
            crate::ffi::handles::ctx_free(ctx);
        }
    }
}
