//! The conformance cases.

use crate::harness::{QpOptions, connect_rc, endpoint, expect_none, poll_n, poll_one};
use crate::{Case, CaseResult, Pair};
use remem_verbs::{
    AccessFlags, GidType, QpAttr, QpAttrMask, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr,
    Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn wc_ok(wc: &WorkCompletion, opcode: WcOpcode, what: &str) -> CaseResult {
    ensure!(
        wc.status == WcStatus::Success,
        "{what}: status {} ({:?})",
        wc.status,
        wc
    );
    ensure!(
        wc.opcode == opcode,
        "{what}: opcode {:?}, want {opcode:?}",
        wc.opcode
    );
    Ok(())
}

fn sge(mr: &dyn remem_verbs::MemoryRegion, offset: u64, length: u32) -> Sge {
    Sge {
        addr: mr.addr() + offset,
        length,
        lkey: mr.lkey(),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Every case, in a stable order.
pub static CASES: &[Case] = &[
    Case {
        name: "device_attributes",
        run: device_attributes,
    },
    Case {
        name: "qp_state_machine",
        run: qp_state_machine,
    },
    Case {
        name: "send_recv_multi_packet_multi_sge",
        run: send_recv,
    },
    Case {
        name: "send_longer_than_receive",
        run: send_too_long,
    },
    Case {
        name: "rdma_write_and_write_with_imm",
        run: rdma_write,
    },
    Case {
        name: "rdma_read_multi_packet",
        run: rdma_read,
    },
    Case {
        name: "atomics_return_original_values",
        run: atomics,
    },
    Case {
        name: "remote_access_errors",
        run: remote_access_errors,
    },
    Case {
        name: "deregistration_revokes_access",
        run: dereg_revokes,
    },
    Case {
        name: "rnr_retry_exhausted_and_recovered",
        run: rnr,
    },
    Case {
        name: "unsignaled_and_post_lists",
        run: unsignaled_and_lists,
    },
    Case {
        name: "inline_send",
        run: inline_send,
    },
    Case {
        name: "local_post_errors",
        run: local_post_errors,
    },
    Case {
        name: "ud_send_recv_with_grh_and_qkey",
        run: ud_send_recv,
    },
];

fn device_attributes(p: &Pair) -> CaseResult {
    for ctx in [&p.a, &p.b] {
        let dev = ctx.query_device().map_err(|e| e.to_string())?;
        ensure!(
            dev.max_qp > 0 && dev.max_qp_wr > 0 && dev.max_sge > 0,
            "limits: {dev:?}"
        );
        ensure!(
            dev.max_qp_rd_atom >= 1,
            "max_qp_rd_atom {}",
            dev.max_qp_rd_atom
        );
        let port = ctx.query_port(1).map_err(|e| e.to_string())?;
        ensure!(
            port.active_mtu <= port.max_mtu,
            "active MTU above max: {port:?}"
        );
        ensure!(ctx.query_port(0).is_err(), "port 0 must not exist");
        let gids = ctx.gid_table(1).map_err(|e| e.to_string())?;
        ensure!(
            gids.iter().any(|g| g.gid_type == GidType::RoceV2),
            "no RoCE v2 GID: {gids:?}"
        );
    }
    Ok(())
}

fn qp_state_machine(p: &Pair) -> CaseResult {
    use QpAttrMask as M;
    let o = QpOptions::default();
    let ep = endpoint(&p.a, &o, QpType::Rc, None)?;
    let (qp, cq) = (ep.qp.clone(), ep.cq.clone());
    ensure!(qp.state() == QpState::Reset, "new QP in {:?}", qp.state());
    // Illegal: RESET -> RTR.
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    ensure!(qp.modify(&rtr, M::STATE).is_err(), "RESET -> RTR accepted");
    // Missing ACCESS_FLAGS for RC INIT.
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    ensure!(
        qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT)
            .is_err(),
        "INIT without ACCESS_FLAGS accepted"
    );
    // Posting a send in RESET fails, a receive too.
    let (_, mr) = ep.reg(64, RW)?;
    let s = [sge(&*mr, 0, 8)];
    ensure!(
        qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &s
        }])
        .is_err(),
        "post_recv in RESET accepted"
    );
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .map_err(|e| format!("to INIT: {e}"))?;
    ensure!(qp.state() == QpState::Init, "state {:?}", qp.state());
    // Receives may be posted in INIT; sends may not.
    qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &s,
    }])
    .map_err(|e| format!("post_recv in INIT: {e}"))?;
    ensure!(
        qp.post_send(&[SendWr::new(2, SendOp::Send, &s)]).is_err(),
        "post_send in INIT accepted"
    );
    // ERR flushes the posted receive.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&err, M::STATE).map_err(|e| e.to_string())?;
    let wc = poll_one(&*cq, p.timeout)?;
    ensure!(
        wc.wr_id == 1 && wc.status == WcStatus::WrFlushErr,
        "flushed receive: {wc:?}"
    );
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    qp.modify(&reset, M::STATE).map_err(|e| e.to_string())?;
    ensure!(
        qp.state() == QpState::Reset,
        "after reset: {:?}",
        qp.state()
    );
    // A full bring-up, with the attributes reported back by query.
    let (a, b) = connect_rc(p, &o)?;
    let qa = a.qp.query().map_err(|e| e.to_string())?;
    ensure!(qa.qp_state == QpState::Rts, "query state {:?}", qa.qp_state);
    ensure!(
        qa.dest_qp_num == b.qp.qp_num(),
        "dest_qp_num {}",
        qa.dest_qp_num
    );
    ensure!(qa.sq_psn == 0x00ab_cdef, "sq_psn {:#x}", qa.sq_psn);
    Ok(())
}

fn send_recv(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let len = 10_000usize; // several packets at any MTU
    let (sbuf, smr) = a.reg(len, RW)?;
    let (rbuf, rmr) = b.reg(2 * len, RW)?;
    let data = pattern(len, 3);
    sbuf.write(0, &data).map_err(|e| e.to_string())?;
    // Receive scattered over three entries: 100 + 4900 + rest.
    let r = [
        sge(&*rmr, 0, 100),
        sge(&*rmr, 1000, 4900),
        sge(&*rmr, 8000, 10_000),
    ];
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 10,
            sg_list: &r,
        },
        RecvWr {
            wr_id: 11,
            sg_list: &r[..1],
        },
    ])
    .map_err(|e| e.to_string())?;
    let s = [sge(&*smr, 0, len as u32)];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &s)])
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    wc_ok(&wc, WcOpcode::Send, "send")?;
    ensure!(wc.wr_id == 1, "send wr_id {}", wc.wr_id);
    let wc = poll_one(&*b.cq, p.timeout)?;
    wc_ok(&wc, WcOpcode::Recv, "recv")?;
    ensure!(
        wc.wr_id == 10 && wc.byte_len as usize == len,
        "recv: {wc:?}"
    );
    ensure!(wc.imm().is_none(), "no immediate expected");
    let mut got = rbuf.to_vec(0, 100).map_err(|e| e.to_string())?;
    got.extend(rbuf.to_vec(1000, 4900).map_err(|e| e.to_string())?);
    got.extend(rbuf.to_vec(8000, len - 5000).map_err(|e| e.to_string())?);
    ensure!(got == data, "received bytes differ");
    // With immediate, small.
    let s = [sge(&*smr, 0, 50)];
    a.qp.post_send(&[SendWr::new(2, SendOp::SendWithImm { imm: 0xfeed_beef }, &s)])
        .map_err(|e| e.to_string())?;
    wc_ok(&poll_one(&*a.cq, p.timeout)?, WcOpcode::Send, "send imm")?;
    let wc = poll_one(&*b.cq, p.timeout)?;
    wc_ok(&wc, WcOpcode::Recv, "recv imm")?;
    ensure!(wc.wr_id == 11 && wc.byte_len == 50, "recv imm: {wc:?}");
    ensure!(wc.imm() == Some(0xfeed_beef), "imm {:?}", wc.imm());
    ensure!(wc.wc_flags.contains(WcFlags::WITH_IMM), "WITH_IMM flag");
    ensure!(
        rbuf.to_vec(0, 50).map_err(|e| e.to_string())? == data[..50],
        "imm payload"
    );
    Ok(())
}

fn send_too_long(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (_, smr) = a.reg(4096, RW)?;
    let (_, rmr) = b.reg(4096, RW)?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &[sge(&*rmr, 0, 100)],
    }])
    .map_err(|e| e.to_string())?;
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*smr, 0, 200)])])
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    ensure!(wc.status == WcStatus::RemInvReqErr, "requester: {wc:?}");
    let wc = poll_one(&*b.cq, p.timeout)?;
    ensure!(
        wc.wr_id == 5 && wc.status == WcStatus::LocLenErr,
        "responder: {wc:?}"
    );
    ensure!(
        a.qp.state() == QpState::Err,
        "requester QP in {:?}",
        a.qp.state()
    );
    Ok(())
}

fn rdma_write(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let len = 9_000usize;
    let (sbuf, smr) = a.reg(len, RW)?;
    let (tbuf, tmr) = b.reg(len + 64, RW)?;
    let data = pattern(len, 7);
    sbuf.write(0, &data).map_err(|e| e.to_string())?;
    let op = SendOp::RdmaWrite {
        remote_addr: tmr.addr() + 32,
        rkey: tmr.rkey(),
    };
    a.qp.post_send(&[SendWr::new(1, op, &[sge(&*smr, 0, len as u32)])])
        .map_err(|e| e.to_string())?;
    wc_ok(&poll_one(&*a.cq, p.timeout)?, WcOpcode::RdmaWrite, "write")?;
    ensure!(
        tbuf.to_vec(32, len).map_err(|e| e.to_string())? == data,
        "written bytes differ"
    );
    ensure!(
        tbuf.to_vec(0, 32).map_err(|e| e.to_string())? == vec![0; 32],
        "wrote before the range"
    );
    expect_none(&*b.cq)?;
    // With immediate: consumes a receive, reported as RECV_RDMA_WITH_IMM.
    let (_, rmr) = b.reg(64, RW)?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 20,
        sg_list: &[sge(&*rmr, 0, 64)],
    }])
    .map_err(|e| e.to_string())?;
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: tmr.addr(),
        rkey: tmr.rkey(),
        imm: 42,
    };
    a.qp.post_send(&[SendWr::new(2, op, &[sge(&*smr, 0, 16)])])
        .map_err(|e| e.to_string())?;
    wc_ok(
        &poll_one(&*a.cq, p.timeout)?,
        WcOpcode::RdmaWrite,
        "write imm",
    )?;
    let wc = poll_one(&*b.cq, p.timeout)?;
    wc_ok(&wc, WcOpcode::RecvRdmaWithImm, "recv write imm")?;
    ensure!(
        wc.wr_id == 20 && wc.imm() == Some(42) && wc.byte_len == 16,
        "{wc:?}"
    );
    ensure!(
        tbuf.to_vec(0, 16).map_err(|e| e.to_string())? == data[..16],
        "imm write bytes"
    );
    Ok(())
}

fn rdma_read(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let len = 12_345usize;
    let (lbuf, lmr) = a.reg(len, RW)?;
    let (tbuf, tmr) = b.reg(len, RW)?;
    let data = pattern(len, 11);
    tbuf.write(0, &data).map_err(|e| e.to_string())?;
    let op = SendOp::RdmaRead {
        remote_addr: tmr.addr(),
        rkey: tmr.rkey(),
    };
    // Scatter the result over two entries.
    let s = [sge(&*lmr, 0, 5000), sge(&*lmr, 5000, (len - 5000) as u32)];
    a.qp.post_send(&[SendWr::new(1, op, &s)])
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    wc_ok(&wc, WcOpcode::RdmaRead, "read")?;
    ensure!(wc.byte_len as usize == len, "read byte_len {}", wc.byte_len);
    ensure!(
        lbuf.to_vec(0, len).map_err(|e| e.to_string())? == data,
        "read bytes differ"
    );
    expect_none(&*b.cq)?;
    Ok(())
}

fn atomics(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (lbuf, lmr) = a.reg(64, RW)?;
    let (tbuf, tmr) = b.reg(64, RW)?;
    tbuf.store_u64(8, 100).map_err(|e| e.to_string())?;
    let va = tmr.addr() + 8;
    let rkey = tmr.rkey();
    let ops = [
        SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: 5,
        },
        SendOp::AtomicCmpAndSwp {
            remote_addr: va,
            rkey,
            compare: 104,
            swap: 1,
        }, // fails
        SendOp::AtomicCmpAndSwp {
            remote_addr: va,
            rkey,
            compare: 105,
            swap: 7,
        }, // succeeds
        SendOp::AtomicFetchAndAdd {
            remote_addr: va,
            rkey,
            add: u64::MAX,
        }, // wraps: -1
    ];
    let expect_orig = [100u64, 105, 105, 7];
    for (i, op) in ops.iter().enumerate() {
        let s = [sge(&*lmr, 8 * i as u64, 8)];
        a.qp.post_send(&[SendWr::new(i as u64, *op, &s)])
            .map_err(|e| e.to_string())?;
    }
    let wcs = poll_n(&*a.cq, 4, p.timeout)?;
    for (i, wc) in wcs.iter().enumerate() {
        let opcode = if i == 0 || i == 3 {
            WcOpcode::FetchAdd
        } else {
            WcOpcode::CompSwap
        };
        wc_ok(wc, opcode, &format!("atomic {i}"))?;
        ensure!(wc.wr_id == i as u64, "order: {wcs:?}");
        let orig = lbuf.load_u64(8 * i).map_err(|e| e.to_string())?;
        ensure!(
            orig == expect_orig[i],
            "atomic {i} returned {orig}, want {}",
            expect_orig[i]
        );
    }
    let fin = tbuf.load_u64(8).map_err(|e| e.to_string())?;
    ensure!(fin == 6, "final value {fin}, want 6");
    Ok(())
}

fn remote_access_errors(p: &Pair) -> CaseResult {
    struct Bad {
        what: &'static str,
        op: fn(u64, u32, u64) -> SendOp,
        access: AccessFlags,
        offset: u64,
        rkey_xor: u32,
    }
    let write = |va, rkey, _| SendOp::RdmaWrite {
        remote_addr: va,
        rkey,
    };
    let read = |va, rkey, _| SendOp::RdmaRead {
        remote_addr: va,
        rkey,
    };
    let cases = [
        Bad {
            what: "forged rkey",
            op: write,
            access: RW,
            offset: 0,
            rkey_xor: 0x5a5a_0000,
        },
        Bad {
            what: "past the end",
            op: write,
            access: RW,
            offset: 4090,
            rkey_xor: 0,
        },
        Bad {
            what: "no REMOTE_WRITE",
            op: write,
            access: AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_READ),
            offset: 0,
            rkey_xor: 0,
        },
        Bad {
            what: "no REMOTE_READ",
            op: read,
            access: AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
            offset: 0,
            rkey_xor: 0,
        },
    ];
    for c in cases {
        let (a, b) = connect_rc(p, &QpOptions::default())?;
        let (_, lmr) = a.reg(64, RW)?;
        let (tbuf, tmr) = b.reg(4096, c.access)?;
        let op = (c.op)(tmr.addr() + c.offset, tmr.rkey() ^ c.rkey_xor, 0);
        let s = [sge(&*lmr, 0, 16)];
        // Two requests: the second must be flushed after the first fails.
        a.qp.post_send(&[SendWr::new(1, op, &s), SendWr::new(2, op, &s)])
            .map_err(|e| e.to_string())?;
        let wcs = poll_n(&*a.cq, 2, p.timeout)?;
        ensure!(
            wcs[0].status == WcStatus::RemAccessErr,
            "{}: first {:?}",
            c.what,
            wcs[0]
        );
        ensure!(
            wcs[1].status == WcStatus::WrFlushErr,
            "{}: second {:?}",
            c.what,
            wcs[1]
        );
        ensure!(
            a.qp.state() == QpState::Err,
            "{}: requester {:?}",
            c.what,
            a.qp.state()
        );
        ensure!(
            tbuf.to_vec(0, 4096).map_err(|e| e.to_string())? == vec![0; 4096],
            "{}: target memory changed",
            c.what
        );
    }
    Ok(())
}

fn dereg_revokes(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (_, lmr) = a.reg(64, RW)?;
    let (tbuf, tmr) = b.reg(64, RW)?;
    let (va, rkey) = (tmr.addr(), tmr.rkey());
    drop(tmr); // ibv_dereg_mr
    let op = SendOp::RdmaWrite {
        remote_addr: va,
        rkey,
    };
    a.qp.post_send(&[SendWr::new(1, op, &[sge(&*lmr, 0, 8)])])
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    ensure!(
        wc.status == WcStatus::RemAccessErr,
        "write after dereg: {wc:?}"
    );
    ensure!(
        tbuf.to_vec(0, 64).map_err(|e| e.to_string())? == vec![0; 64],
        "memory changed"
    );
    Ok(())
}

fn rnr(p: &Pair) -> CaseResult {
    // Limited RNR retries and no receive: RNR_RETRY_EXC_ERR.
    let o = QpOptions {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..QpOptions::default()
    };
    let (a, _b) = connect_rc(p, &o)?;
    let (_, smr) = a.reg(64, RW)?;
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*smr, 0, 8)])])
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    ensure!(wc.status == WcStatus::RnrRetryExcErr, "limited RNR: {wc:?}");
    // Infinite RNR retries: the send completes once a receive is posted.
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (sbuf, smr) = a.reg(64, RW)?;
    let (rbuf, rmr) = b.reg(64, RW)?;
    sbuf.write(0, b"late").map_err(|e| e.to_string())?;
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*smr, 0, 4)])])
        .map_err(|e| e.to_string())?;
    expect_none(&*a.cq)?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: &[sge(&*rmr, 0, 64)],
    }])
    .map_err(|e| e.to_string())?;
    wc_ok(
        &poll_one(&*a.cq, p.timeout)?,
        WcOpcode::Send,
        "send after RNR",
    )?;
    wc_ok(
        &poll_one(&*b.cq, p.timeout)?,
        WcOpcode::Recv,
        "recv after RNR",
    )?;
    ensure!(
        rbuf.to_vec(0, 4).map_err(|e| e.to_string())? == b"late",
        "payload after RNR"
    );
    Ok(())
}

fn unsignaled_and_lists(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (sbuf, smr) = a.reg(4096, RW)?;
    let (tbuf, tmr) = b.reg(4096, RW)?;
    sbuf.write(0, &pattern(4096, 1))
        .map_err(|e| e.to_string())?;
    let s: Vec<[Sge; 1]> = (0..4).map(|i| [sge(&*smr, i * 1024, 1024)]).collect();
    let wrs: Vec<SendWr<'_>> = (0..4u64)
        .map(|i| {
            let mut wr = SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: tmr.addr() + i * 1024,
                    rkey: tmr.rkey(),
                },
                &s[i as usize],
            );
            if i != 3 {
                wr.flags = SendFlags::empty(); // unsignaled
            }
            wr
        })
        .collect();
    a.qp.post_send(&wrs).map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    ensure!(wc.wr_id == 3, "only the signaled WR completes: {wc:?}");
    wc_ok(&wc, WcOpcode::RdmaWrite, "signaled write")?;
    ensure!(
        tbuf.to_vec(0, 4096).map_err(|e| e.to_string())? == pattern(4096, 1),
        "writes"
    );
    expect_none(&*a.cq)?;
    // A bad work request in a list: those before it are posted, bad_wr points at it.
    let bad = [Sge {
        lkey: smr.lkey() ^ 0x77,
        ..s[0][0]
    }];
    let list = [
        SendWr::new(
            10,
            SendOp::RdmaWrite {
                remote_addr: tmr.addr(),
                rkey: tmr.rkey(),
            },
            &s[0],
        ),
        SendWr::new(
            11,
            SendOp::RdmaWrite {
                remote_addr: tmr.addr(),
                rkey: tmr.rkey(),
            },
            &bad,
        ),
        SendWr::new(
            12,
            SendOp::RdmaWrite {
                remote_addr: tmr.addr(),
                rkey: tmr.rkey(),
            },
            &s[0],
        ),
    ];
    let err = a.qp.post_send(&list).err().ok_or("bad lkey accepted")?;
    ensure!(err.index == 1, "bad_wr index {}", err.index);
    let wc = poll_one(&*a.cq, p.timeout)?;
    ensure!(wc.wr_id == 10, "first of the list: {wc:?}");
    expect_none(&*a.cq)?;
    Ok(())
}

fn inline_send(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (sbuf, smr) = a.reg(64, AccessFlags::empty())?;
    let (rbuf, rmr) = b.reg(64, RW)?;
    sbuf.write(0, b"inline!").map_err(|e| e.to_string())?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[sge(&*rmr, 0, 64)],
    }])
    .map_err(|e| e.to_string())?;
    let mut wr = SendWr::new(1, SendOp::Send, &[]);
    let s = [sge(&*smr, 0, 7)];
    wr.sg_list = &s;
    wr.flags |= SendFlags::INLINE;
    a.qp.post_send(&[wr]).map_err(|e| e.to_string())?;
    // The source may change right after posting: inline data was copied.
    sbuf.write(0, b"CHANGED").map_err(|e| e.to_string())?;
    wc_ok(&poll_one(&*a.cq, p.timeout)?, WcOpcode::Send, "inline send")?;
    wc_ok(&poll_one(&*b.cq, p.timeout)?, WcOpcode::Recv, "inline recv")?;
    ensure!(
        rbuf.to_vec(0, 7).map_err(|e| e.to_string())? == b"inline!",
        "inline payload"
    );
    Ok(())
}

fn local_post_errors(p: &Pair) -> CaseResult {
    let (a, b) = connect_rc(p, &QpOptions::default())?;
    let (_, mr) = a.reg(64, AccessFlags::empty())?;
    // READ into memory without LOCAL_WRITE.
    let op = SendOp::RdmaRead {
        remote_addr: 0,
        rkey: 0,
    };
    ensure!(
        a.qp.post_send(&[SendWr::new(1, op, &[sge(&*mr, 0, 8)])])
            .is_err(),
        "READ into read-only memory accepted"
    );
    // SGE outside its region.
    ensure!(
        a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*mr, 60, 8)])])
            .is_err(),
        "out-of-bounds SGE accepted"
    );
    // An lkey of another PD.
    let (_, other) = b.reg(64, RW)?;
    ensure!(
        a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*other, 0, 8)])])
            .is_err(),
        "lkey of another PD accepted"
    );
    // Too many SGEs.
    let many = [sge(&*mr, 0, 1); 5];
    ensure!(
        a.qp.post_send(&[SendWr::new(1, SendOp::Send, &many)])
            .is_err(),
        "more SGEs than max_send_sge accepted"
    );
    expect_none(&*a.cq)?;
    Ok(())
}

fn ud_qp(
    ctx: &std::sync::Arc<dyn remem_verbs::Context>,
    qkey: u32,
) -> Result<crate::harness::Endpoint, String> {
    use QpAttrMask as M;
    let ep = endpoint(ctx, &QpOptions::default(), QpType::Ud, None)?;
    let qp = ep.qp.clone();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .map_err(|e| format!("UD to INIT: {e}"))?;
    a.qp_state = QpState::Rtr;
    qp.modify(&a, M::STATE)
        .map_err(|e| format!("UD to RTR: {e}"))?;
    a.qp_state = QpState::Rts;
    a.sq_psn = 7;
    qp.modify(&a, M::STATE | M::SQ_PSN)
        .map_err(|e| format!("UD to RTS: {e}"))?;
    Ok(ep)
}

fn ud_send_recv(p: &Pair) -> CaseResult {
    let a = ud_qp(&p.a, 0x1111_1111)?;
    let b = ud_qp(&p.b, 0x2222_2222)?;
    let (sbuf, smr) = a.reg(256, RW)?;
    let (rbuf, rmr) = b.reg(1024, RW)?;
    sbuf.write(0, b"datagram payload")
        .map_err(|e| e.to_string())?;
    let gb =
        p.b.query_gid(1, u32::from(b.gid_index))
            .map_err(|e| e.to_string())?
            .gid;
    let ah =
        a.pd.create_ah(&remem_verbs::AhAttr {
            dgid: gb,
            sgid_index: a.gid_index,
            ..remem_verbs::AhAttr::default()
        })
        .map_err(|e| format!("create_ah: {e}"))?;
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[sge(&*rmr, 0, 512)],
    }])
    .map_err(|e| e.to_string())?;
    let s = [sge(&*smr, 0, 16)];
    let dest = |qkey| remem_verbs::UdDest {
        ah: ah.clone(),
        remote_qpn: b.qp.qp_num(),
        remote_qkey: qkey,
    };
    // A wrong Q_Key is dropped at the receiver; the right one arrives.
    let mut bad = SendWr::new(1, SendOp::Send, &s);
    bad.ud = Some(dest(0x3333_3333));
    let mut good = SendWr::new(2, SendOp::SendWithImm { imm: 99 }, &s);
    good.ud = Some(dest(0x2222_2222));
    a.qp.post_send(&[bad, good]).map_err(|e| e.to_string())?;
    let wcs = poll_n(&*a.cq, 2, p.timeout)?;
    ensure!(
        wcs.iter().all(|w| w.status == WcStatus::Success),
        "UD sends complete locally: {wcs:?}"
    );
    let wc = poll_one(&*b.cq, p.timeout)?;
    wc_ok(&wc, WcOpcode::Recv, "UD recv")?;
    ensure!(
        wc.imm() == Some(99),
        "the wrong-Q_Key datagram was not dropped: {wc:?}"
    );
    ensure!(
        wc.byte_len == 40 + 16,
        "byte_len {} (GRH + payload)",
        wc.byte_len
    );
    ensure!(wc.src_qp == a.qp.qp_num(), "src_qp {}", wc.src_qp);
    ensure!(wc.wc_flags.contains(WcFlags::GRH), "GRH flag");
    ensure!(
        rbuf.to_vec(40, 16).map_err(|e| e.to_string())? == b"datagram payload",
        "payload after the 40-byte GRH"
    );
    // Datagrams larger than the MTU are refused locally.
    let big_mtu =
        p.a.query_port(1)
            .map_err(|e| e.to_string())?
            .active_mtu
            .bytes();
    let (_, bigmr) = a.reg(big_mtu as usize + 1, RW)?;
    let mut big = SendWr::new(3, SendOp::Send, &[]);
    let bs = [sge(&*bigmr, 0, big_mtu + 1)];
    big.sg_list = &bs;
    big.ud = Some(dest(0x2222_2222));
    a.qp.post_send(&[big]).map_err(|e| e.to_string())?;
    let wc = poll_one(&*a.cq, p.timeout)?;
    ensure!(
        wc.status == WcStatus::LocLenErr,
        "oversized datagram: {wc:?}"
    );
    Ok(())
}
