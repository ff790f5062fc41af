//! Resource scale on one soft device: 10,000 RC queue pairs and 100,000 memory regions,
//! within a stated memory budget, measured as resident memory (one test in this binary, so
//! nothing else allocates meanwhile). Budget: 16 KiB per QP (with its share of 64-entry CQs)
//! and 1 KiB per MR (the registrations, not the memory they cover). The figures measured
//! are printed and recorded in BENCHMARKS.md.

use remem_soft::SoftContext;
use remem_verbs::{
    AccessFlags, CompletionQueue, Context, MemRegion, MemoryBuffer, QpCap, QpInitAttr, QpType,
};
use std::sync::Arc;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn ten_thousand_qps_and_a_hundred_thousand_mrs() {
    const QPS: usize = 10_000;
    const MRS: usize = 100_000;
    let ctx = SoftContext::bind("127.0.17.1:0".parse().unwrap()).unwrap();
    let pd = ctx.alloc_pd().unwrap();

    // Memory regions: 100,000 registrations of 64-byte slices of one buffer.
    let buf = Arc::new(MemoryBuffer::zeroed(MRS * 64).unwrap());
    let before = resident_bytes();
    let mut mrs = Vec::with_capacity(MRS);
    for i in 0..MRS {
        let region = MemRegion::new(buf.clone(), i * 64..(i + 1) * 64).unwrap();
        mrs.push(
            pd.reg_mr(region, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                .unwrap(),
        );
    }
    let per_mr = (resident_bytes().saturating_sub(before)) as f64 / MRS as f64;
    // Every key is distinct.
    let mut keys: Vec<u32> = mrs.iter().map(|m| m.rkey()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), MRS);

    // Queue pairs: 10,000, each with CQs shared by groups of 16.
    let before = resident_bytes();
    let mut cqs: Vec<Arc<dyn CompletionQueue>> = Vec::new();
    let mut qps = Vec::with_capacity(QPS);
    for i in 0..QPS {
        if i % 16 == 0 {
            cqs.push(ctx.create_cq(64 * 16, None).unwrap());
        }
        let cq = cqs.last().unwrap().clone();
        qps.push(
            pd.create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq.clone(),
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .unwrap(),
        );
    }
    let per_qp = (resident_bytes().saturating_sub(before)) as f64 / QPS as f64;
    let mut qpns: Vec<u32> = qps.iter().map(|q| q.qp_num()).collect();
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), QPS);
    println!("scale: {QPS} QPs at {per_qp:.0} B each, {MRS} MRs at {per_mr:.0} B each (resident)");
    assert!(per_qp <= 16.0 * 1024.0, "{per_qp:.0} bytes per QP");
    assert!(per_mr <= 1024.0, "{per_mr:.0} bytes per MR");

    // Everything goes away: the objects are released with their handles.
    drop(qps);
    drop(cqs);
    drop(mrs);
    let region = MemRegion::whole(buf.clone());
    assert!(pd.reg_mr(region, AccessFlags::LOCAL_WRITE).is_ok());
}
