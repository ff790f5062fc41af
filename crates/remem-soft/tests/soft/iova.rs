//! Memory regions registered with an I/O virtual address (`ibv_reg_mr_iova2`): two soft
//! devices on loopback, every address in the work requests (local scatter/gather entries and
//! the peer's RDMA and atomic targets) an iova, and the bytes land where the iova says.

use remem_conformance::{Endpoint, QpOptions, connect_rc, poll_one};
use remem_soft::SoftContext;
use remem_verbs::{
    AccessFlags, MemRegion, MemoryBuffer, MemoryRegion, RecvWr, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// Registers bytes `[offset, offset + len)` of a fresh 64 KiB buffer as `[iova, iova + len)`.
fn reg_iova(
    ep: &Endpoint,
    offset: usize,
    len: usize,
    iova: u64,
    access: AccessFlags,
) -> (Arc<MemoryBuffer>, Arc<dyn MemoryRegion>) {
    let buf = Arc::new(MemoryBuffer::zeroed(64 * 1024).unwrap());
    let region = MemRegion::with_iova(buf.clone(), offset..offset + len, iova).unwrap();
    let mr = ep.pd.reg_mr(region, access).unwrap();
    assert_eq!(mr.addr(), iova);
    (buf, mr)
}

fn sge(mr: &dyn MemoryRegion, at: u64, length: u32) -> Sge {
    Sge {
        addr: mr.addr() + at,
        length,
        lkey: mr.lkey(),
    }
}

fn post(ep: &Endpoint, wr_id: u64, op: SendOp, sges: &[Sge]) -> WcStatus {
    ep.qp.post_send(&[SendWr::new(wr_id, op, sges)]).unwrap();
    let wc = poll_one(&*ep.cq, T).unwrap();
    assert_eq!(wc.wr_id, wr_id);
    wc.status
}

#[test]
fn rdma_and_atomics_address_regions_by_iova() {
    let sa = SoftContext::bind("127.0.25.1:0".parse().unwrap()).unwrap();
    let port = sa.local_addr().port();
    let sb = SoftContext::bind(format!("127.0.25.2:{port}").parse().unwrap()).unwrap();
    let pair = remem_conformance::Pair::new(Arc::new(sa), Arc::new(sb));
    let (a, b) = connect_rc(&pair, &QpOptions::default()).unwrap();

    let rw = AccessFlags::LOCAL_WRITE;
    let remote =
        rw | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    // A's local memory: bytes 4096.. of its buffer, addressed from 0x1000_0000.
    let (abuf, amr) = reg_iova(&a, 4096, 16384, 0x1000_0000, rw);
    // B's target: bytes 8192.. of its buffer, addressed from 0 (a zero-based region).
    let (bbuf, bmr) = reg_iova(&b, 8192, 16384, 0, remote);

    // WRITE 5000 bytes (several packets) from A's iova 100 to B's iova 300.
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    abuf.write(4096 + 100, &data).unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: 300,
        rkey: bmr.rkey(),
    };
    assert_eq!(
        post(&a, 1, write, &[sge(&*amr, 100, 5000)]),
        WcStatus::Success
    );
    assert_eq!(bbuf.to_vec(8192 + 300, 5000).unwrap(), data);
    assert_eq!(bbuf.to_vec(8192 + 299, 1).unwrap(), [0], "nothing before");
    assert_eq!(bbuf.to_vec(8192 + 5300, 1).unwrap(), [0], "nothing after");

    // READ them back into A's iova 10000 (a scatter list of two entries).
    let read = SendOp::RdmaRead {
        remote_addr: 300,
        rkey: bmr.rkey(),
    };
    let sges = [sge(&*amr, 10000, 1000), sge(&*amr, 12000, 4000)];
    assert_eq!(post(&a, 2, read, &sges), WcStatus::Success);
    assert_eq!(abuf.to_vec(4096 + 10000, 1000).unwrap(), data[..1000]);
    assert_eq!(abuf.to_vec(4096 + 12000, 4000).unwrap(), data[1000..]);

    // Atomics at B's iova 64 (8-aligned as an iova and in memory).
    bbuf.store_u64(8192 + 64, 40).unwrap();
    let add = SendOp::AtomicFetchAndAdd {
        remote_addr: 64,
        rkey: bmr.rkey(),
        add: 2,
    };
    assert_eq!(post(&a, 3, add, &[sge(&*amr, 0, 8)]), WcStatus::Success);
    assert_eq!(bbuf.load_u64(8192 + 64).unwrap(), 42);
    assert_eq!(abuf.load_u64(4096).unwrap(), 40, "the original value");
    let cas = SendOp::AtomicCmpAndSwp {
        remote_addr: 64,
        rkey: bmr.rkey(),
        compare: 42,
        swap: 7,
    };
    assert_eq!(post(&a, 4, cas, &[sge(&*amr, 8, 8)]), WcStatus::Success);
    assert_eq!(bbuf.load_u64(8192 + 64).unwrap(), 7);

    // SEND into a receive whose entry is an iova of B.
    let (rbuf, rmr) = reg_iova(&b, 100, 256, 0xdead_0000, rw);
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &[sge(&*rmr, 16, 64)],
    }])
    .unwrap();
    assert_eq!(
        post(&a, 6, SendOp::Send, &[sge(&*amr, 100, 64)]),
        WcStatus::Success
    );
    let wc = poll_one(&*b.cq, T).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (5, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(rbuf.to_vec(100 + 16, 64).unwrap(), data[..64]);

    // The buffer's own virtual address is not the region's address: a local entry naming
    // it is refused at post, a peer naming it gets a remote access error.
    let real = Sge {
        addr: abuf.addr() + 4096,
        length: 8,
        lkey: amr.lkey(),
    };
    let write = SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: bmr.rkey(),
    };
    assert!(a.qp.post_send(&[SendWr::new(7, write, &[real])]).is_err());
    let stray = SendOp::RdmaWrite {
        remote_addr: bbuf.addr() + 8192,
        rkey: bmr.rkey(),
    };
    assert_eq!(
        post(&a, 8, stray, &[sge(&*amr, 0, 8)]),
        WcStatus::RemAccessErr
    );
}
