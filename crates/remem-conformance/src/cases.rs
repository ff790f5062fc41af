//! The conformance cases. Each runs on both sides (see [`Side`]); A is the requester,
//! B the responder, and the two exchange what they need over the link.

use crate::cm_cases::{
    cm_connect_disconnect, cm_disconnect_by_listener, cm_no_listener, cm_reject, cm_ud_service,
};
use crate::harness::{
    Endpoint, PSNS, QpOptions, endpoint, expect_none, is_kernel_rxe, poll_n, poll_one,
};
use crate::side::{Role, Side, run_pair_with};
use crate::{Case, CaseResult};
use remem_verbs::{
    AccessFlags, Context, FlushLevel, FlushType, GidType, MemRegion, MemoryBuffer, QpAttr,
    QpAttrMask, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode,
    WcStatus, WorkCompletion,
};
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Turns any error into the suite's `String` error.
trait StrErr<T> {
    fn str_err(self) -> Result<T, String>;
}

impl<T, E: Display> StrErr<T> for Result<T, E> {
    fn str_err(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

fn wc_is(wc: &WorkCompletion, status: WcStatus, what: &str) -> CaseResult {
    ensure!(
        wc.status == status,
        "{what}: status {}, want {status} ({wc:?})",
        wc.status
    );
    Ok(())
}

fn wc_ok(wc: &WorkCompletion, opcode: WcOpcode, what: &str) -> CaseResult {
    wc_is(wc, WcStatus::Success, what)?;
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

/// Checks that `buf` holds `want` at `offset`.
fn expect_bytes(buf: &MemoryBuffer, offset: usize, want: &[u8], what: &str) -> CaseResult {
    let got = buf.to_vec(offset, want.len()).str_err()?;
    ensure!(got == want, "{what}: memory differs");
    Ok(())
}

/// Posts `wr` on `ep`'s QP and waits for a completion on its CQ.
fn post_wait(ep: &Endpoint, wr: SendWr<'_>, timeout: Duration) -> Result<WorkCompletion, String> {
    ep.qp.post_send(&[wr]).str_err()?;
    poll_one(&*ep.cq, timeout)
}

fn post_recv(qp: &dyn remem_verbs::QueuePair, wr_id: u64, sg_list: &[Sge]) -> CaseResult {
    qp.post_recv(&[RecvWr { wr_id, sg_list }]).str_err()
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

macro_rules! cases {
    ($($name:literal => $side:ident: $about:literal,)*) => {
        /// Every case, in a stable order.
        pub static CASES: &[Case] = &[$(Case {
            name: $name,
            about: $about,
            side: $side,
            run: |pair| run_pair_with($side, pair),
        }),*];
    };
}

cases! {
    "device_attributes" => device_attributes:
        "device and port attributes, port numbering and the RoCE v2 GID table",
    "qp_state_machine" => qp_state_machine:
        "illegal transitions and posts refused, ERR flushes receives, RESET, a full bring-up",
    "send_recv_multi_packet_multi_sge" => send_recv:
        "a multi-packet SEND scattered over three entries, then a SEND with immediate",
    "send_longer_than_receive" => send_too_long:
        "a SEND longer than the receive: LOC_LEN_ERR there, REM_INV_REQ_ERR and ERR here",
    "rdma_write_and_write_with_imm" => rdma_write:
        "a multi-packet RDMA WRITE at an offset, then a WRITE with immediate",
    "rdma_read_multi_packet" => rdma_read:
        "a multi-packet RDMA READ scattered over two entries",
    "atomics_return_original_values" => atomics:
        "fetch-and-add and compare-and-swap (failing and succeeding) return original values",
    "remote_access_errors" => remote_access_errors:
        "forged rkey, out of bounds and missing rights: REM_ACCESS_ERR, flush, memory intact",
    "deregistration_revokes_access" => dereg_revokes:
        "a WRITE with the rkey of a deregistered region fails and changes nothing",
    "rnr_retry_exhausted_and_recovered" => rnr:
        "RNR retries exhausted without a receive; infinite retries succeed once one is posted",
    "unsignaled_and_post_lists" => unsignaled_and_lists:
        "unsignaled WRITEs complete silently; a bad work request in a list stops it there",
    "inline_send" => inline_send:
        "an inline SEND carries the data as it was when posted",
    "local_post_errors" => local_post_errors:
        "work requests with bad local memory or too many entries are refused when posted",
    "cm_connect_disconnect" => cm_connect_disconnect:
        "RDMA CM: REQ/REP/RTU with private data both ways, a SEND, the connector disconnects",
    "cm_disconnect_by_listener" => cm_disconnect_by_listener:
        "RDMA CM: as cm_connect_disconnect, but the listener's side disconnects",
    "cm_reject_with_private_data" => cm_reject:
        "RDMA CM: a consumer reject (reason 28) with private data; the listener goes on",
    "cm_no_listener" => cm_no_listener:
        "RDMA CM: a request to a port nobody listens on is rejected (reason 8), not ignored",
    "cm_ud_service_resolution" => cm_ud_service:
        "RDMA CM: SIDR REQ/REP in the UDP port space gives the QP number and Q_Key; a datagram",
    "flush_and_atomic_write" => flush_and_atomic_write:
        "FLUSH (persistent range, global region) after a WRITE, ATOMIC WRITE; bad ones NAKed",
    "ud_send_recv_with_grh_and_qkey" => ud_send_recv:
        "UD: a wrong Q_Key is dropped, the GRH precedes the payload, oversized is refused",
    "uc_send_and_write" => uc_send_and_write:
        "UC: multi-packet SEND and WRITE, with immediate too; READ and atomics refused at post",
    "uc_lost_messages_vanish" => uc_lost_messages:
        "UC: a SEND without a receive and a WRITE with a forged rkey vanish; the QP goes on",
}

fn device_attributes(s: &mut Side<'_>) -> CaseResult {
    let ctx = &s.ctx;
    let dev = ctx.query_device().str_err()?;
    ensure!(
        dev.max_qp > 0 && dev.max_qp_wr > 0 && dev.max_sge > 0,
        "limits: {dev:?}"
    );
    ensure!(
        dev.max_qp_rd_atom >= 1,
        "max_qp_rd_atom {}",
        dev.max_qp_rd_atom
    );
    let port = ctx.query_port(1).str_err()?;
    ensure!(
        port.active_mtu <= port.max_mtu,
        "active MTU above max: {port:?}"
    );
    ensure!(ctx.query_port(0).is_err(), "port 0 must not exist");
    let gids = ctx.gid_table(1).str_err()?;
    ensure!(
        gids.iter().any(|g| g.gid_type == GidType::RoceV2),
        "no RoCE v2 GID: {gids:?}"
    );
    Ok(())
}

fn qp_state_machine(s: &mut Side<'_>) -> CaseResult {
    use QpAttrMask as M;
    let o = QpOptions::default();
    let ep = endpoint(&s.ctx, &o, QpType::Rc, None)?;
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
    let sg = [sge(&*mr, 0, 8)];
    ensure!(
        post_recv(&*qp, 1, &sg).is_err(),
        "post_recv in RESET accepted"
    );
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .map_err(|e| format!("to INIT: {e}"))?;
    ensure!(qp.state() == QpState::Init, "state {:?}", qp.state());
    // Receives may be posted in INIT; sends may not.
    post_recv(&*qp, 1, &sg).map_err(|e| format!("post_recv in INIT: {e}"))?;
    ensure!(
        qp.post_send(&[SendWr::new(2, SendOp::Send, &sg)]).is_err(),
        "post_send in INIT accepted"
    );
    // ERR flushes the posted receive.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&err, M::STATE).str_err()?;
    let wc = poll_one(&*cq, s.timeout)?;
    ensure!(
        wc.wr_id == 1 && wc.status == WcStatus::WrFlushErr,
        "flushed receive: {wc:?}"
    );
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    qp.modify(&reset, M::STATE).str_err()?;
    ensure!(
        qp.state() == QpState::Reset,
        "after reset: {:?}",
        qp.state()
    );
    // A full bring-up, with the attributes reported back by query.
    let ep = s.connect_rc(&o)?;
    let [peer_qpn] = s.exchange_words([u64::from(ep.qp.qp_num())])?;
    let q = ep.qp.query().str_err()?;
    ensure!(q.qp_state == QpState::Rts, "query state {:?}", q.qp_state);
    ensure!(
        u64::from(q.dest_qp_num) == peer_qpn,
        "dest_qp_num {}, the peer's QP is {peer_qpn}",
        q.dest_qp_num
    );
    let psn = PSNS[s.role as usize];
    ensure!(q.sq_psn == psn, "sq_psn {:#x}, want {psn:#x}", q.sq_psn);
    Ok(())
}

fn send_recv(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    let len = 10_000usize; // several packets at any MTU
    let data = pattern(len, 3);
    match s.role {
        Role::A => {
            let (sbuf, smr) = ep.reg(len, RW)?;
            sbuf.write(0, &data).str_err()?;
            s.wait_for("receives posted")?;
            let sg = [sge(&*smr, 0, len as u32)];
            let wc = post_wait(&ep, SendWr::new(1, SendOp::Send, &sg), s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "send")?;
            ensure!(wc.wr_id == 1, "send wr_id {}", wc.wr_id);
            // With immediate, small.
            s.wait_for("checked")?;
            let sg = [sge(&*smr, 0, 50)];
            let op = SendOp::SendWithImm { imm: 0xfeed_beef };
            wc_ok(
                &post_wait(&ep, SendWr::new(2, op, &sg), s.timeout)?,
                WcOpcode::Send,
                "send imm",
            )?;
        }
        Role::B => {
            let (rbuf, rmr) = ep.reg(2 * len, RW)?;
            // Receive scattered over three entries: 100 + 4900 + rest.
            let r = [
                sge(&*rmr, 0, 100),
                sge(&*rmr, 1000, 4900),
                sge(&*rmr, 8000, 10_000),
            ];
            ep.qp
                .post_recv(&[
                    RecvWr {
                        wr_id: 10,
                        sg_list: &r,
                    },
                    RecvWr {
                        wr_id: 11,
                        sg_list: &r[..1],
                    },
                ])
                .str_err()?;
            s.signal("receives posted")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Recv, "recv")?;
            ensure!(
                wc.wr_id == 10 && wc.byte_len as usize == len,
                "recv: {wc:?}"
            );
            ensure!(wc.imm().is_none(), "no immediate expected");
            expect_bytes(&rbuf, 0, &data[..100], "first entry")?;
            expect_bytes(&rbuf, 1000, &data[100..5000], "second entry")?;
            expect_bytes(&rbuf, 8000, &data[5000..], "third entry")?;
            s.signal("checked")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Recv, "recv imm")?;
            ensure!(wc.wr_id == 11 && wc.byte_len == 50, "recv imm: {wc:?}");
            ensure!(wc.imm() == Some(0xfeed_beef), "imm {:?}", wc.imm());
            ensure!(wc.wc_flags.contains(WcFlags::WITH_IMM), "WITH_IMM flag");
            expect_bytes(&rbuf, 0, &data[..50], "imm payload")?;
        }
    }
    Ok(())
}

fn send_too_long(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    let (_, mr) = ep.reg(4096, RW)?;
    // Kernel rxe's known deviation (see `is_kernel_rxe`), accepted from rxe only.
    let rxe = is_kernel_rxe(&*s.ctx);
    let [peer_rxe] = s.exchange_words([u64::from(rxe)])?;
    match s.role {
        Role::A => {
            s.wait_for("receive posted")?;
            let wc = post_wait(
                &ep,
                SendWr::new(1, SendOp::Send, &[sge(&*mr, 0, 200)]),
                s.timeout,
            )?;
            if peer_rxe != 0 && wc.status == WcStatus::RemOpErr {
                eprintln!("send_longer_than_receive: kernel rxe NAKed a remote operational error");
            } else {
                wc_is(&wc, WcStatus::RemInvReqErr, "requester")?;
            }
            ensure!(
                ep.qp.state() == QpState::Err,
                "requester QP in {:?}",
                ep.qp.state()
            );
        }
        Role::B => {
            post_recv(&*ep.qp, 5, &[sge(&*mr, 0, 100)])?;
            s.signal("receive posted")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            let want = if rxe && wc.status == WcStatus::LocQpOpErr {
                WcStatus::LocQpOpErr
            } else {
                WcStatus::LocLenErr
            };
            ensure!(wc.wr_id == 5 && wc.status == want, "responder: {wc:?}");
        }
    }
    Ok(())
}

fn rdma_write(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    let len = 9_000usize;
    let data = pattern(len, 7);
    match s.role {
        Role::A => {
            let (sbuf, smr) = ep.reg(len, RW)?;
            sbuf.write(0, &data).str_err()?;
            let t = s.remote_mr()?;
            let op = SendOp::RdmaWrite {
                remote_addr: t.addr + 32,
                rkey: t.rkey,
            };
            wc_ok(
                &post_wait(
                    &ep,
                    SendWr::new(1, op, &[sge(&*smr, 0, len as u32)]),
                    s.timeout,
                )?,
                WcOpcode::RdmaWrite,
                "write",
            )?;
            s.signal("written")?;
            // With immediate: consumes a receive, reported as RECV_RDMA_WITH_IMM.
            s.wait_for("receive posted")?;
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: t.addr,
                rkey: t.rkey,
                imm: 42,
            };
            let wc = post_wait(&ep, SendWr::new(2, op, &[sge(&*smr, 0, 16)]), s.timeout)?;
            wc_ok(&wc, WcOpcode::RdmaWrite, "write imm")?;
        }
        Role::B => {
            let (tbuf, tmr) = ep.reg(len + 64, RW)?;
            s.offer_mr(&*tmr)?;
            s.wait_for("written")?;
            expect_bytes(&tbuf, 32, &data, "written bytes")?;
            expect_bytes(&tbuf, 0, &[0; 32], "before the written range")?;
            expect_none(&*ep.cq)?;
            let (_, rmr) = ep.reg(64, RW)?;
            post_recv(&*ep.qp, 20, &[sge(&*rmr, 0, 64)])?;
            s.signal("receive posted")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::RecvRdmaWithImm, "recv write imm")?;
            ensure!(
                wc.wr_id == 20 && wc.imm() == Some(42) && wc.byte_len == 16,
                "{wc:?}"
            );
            expect_bytes(&tbuf, 0, &data[..16], "imm write bytes")?;
        }
    }
    Ok(())
}

fn rdma_read(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    let len = 12_345usize;
    let data = pattern(len, 11);
    match s.role {
        Role::A => {
            let (lbuf, lmr) = ep.reg(len, RW)?;
            let t = s.remote_mr()?;
            let op = SendOp::RdmaRead {
                remote_addr: t.addr,
                rkey: t.rkey,
            };
            // Scatter the result over two entries.
            let sg = [sge(&*lmr, 0, 5000), sge(&*lmr, 5000, (len - 5000) as u32)];
            let wc = post_wait(&ep, SendWr::new(1, op, &sg), s.timeout)?;
            wc_ok(&wc, WcOpcode::RdmaRead, "read")?;
            ensure!(wc.byte_len as usize == len, "read byte_len {}", wc.byte_len);
            expect_bytes(&lbuf, 0, &data, "read bytes")?;
            s.signal("read")?;
        }
        Role::B => {
            let (tbuf, tmr) = ep.reg(len, RW)?;
            tbuf.write(0, &data).str_err()?;
            s.offer_mr(&*tmr)?;
            s.wait_for("read")?;
            expect_none(&*ep.cq)?;
        }
    }
    Ok(())
}

fn atomics(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    let (buf, mr) = ep.reg(64, RW)?;
    match s.role {
        Role::A => {
            let t = s.remote_mr()?;
            let (va, rkey) = (t.addr + 8, t.rkey);
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
                let sg = [sge(&*mr, 8 * i as u64, 8)];
                ep.qp
                    .post_send(&[SendWr::new(i as u64, *op, &sg)])
                    .str_err()?;
            }
            let wcs = poll_n(&*ep.cq, 4, s.timeout)?;
            for (i, wc) in wcs.iter().enumerate() {
                let opcode = if i == 0 || i == 3 {
                    WcOpcode::FetchAdd
                } else {
                    WcOpcode::CompSwap
                };
                wc_ok(wc, opcode, &format!("atomic {i}"))?;
                ensure!(wc.wr_id == i as u64, "order: {wcs:?}");
                let orig = buf.load_u64(8 * i).str_err()?;
                ensure!(
                    orig == expect_orig[i],
                    "atomic {i} returned {orig}, want {}",
                    expect_orig[i]
                );
            }
            s.signal("done")?;
        }
        Role::B => {
            buf.store_u64(8, 100).str_err()?;
            s.offer_mr(&*mr)?;
            s.wait_for("done")?;
            let fin = buf.load_u64(8).str_err()?;
            ensure!(fin == 6, "final value {fin}, want 6");
        }
    }
    Ok(())
}

fn remote_access_errors(s: &mut Side<'_>) -> CaseResult {
    struct Bad {
        what: &'static str,
        op: fn(u64, u32) -> SendOp,
        access: AccessFlags,
        offset: u64,
        rkey_xor: u32,
    }
    let write = |remote_addr, rkey| SendOp::RdmaWrite { remote_addr, rkey };
    let read = |remote_addr, rkey| SendOp::RdmaRead { remote_addr, rkey };
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
        let ep = s.connect_rc(&QpOptions::default())?;
        match s.role {
            Role::A => {
                let (_, lmr) = ep.reg(64, RW)?;
                let t = s.remote_mr()?;
                let op = (c.op)(t.addr + c.offset, t.rkey ^ c.rkey_xor);
                let sg = [sge(&*lmr, 0, 16)];
                // Two requests: the second must be flushed after the first fails.
                ep.qp
                    .post_send(&[SendWr::new(1, op, &sg), SendWr::new(2, op, &sg)])
                    .str_err()?;
                let wcs = poll_n(&*ep.cq, 2, s.timeout)?;
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
                    ep.qp.state() == QpState::Err,
                    "{}: requester {:?}",
                    c.what,
                    ep.qp.state()
                );
                s.signal("done")?;
            }
            Role::B => {
                let (tbuf, tmr) = ep.reg(4096, c.access)?;
                s.offer_mr(&*tmr)?;
                s.wait_for("done")?;
                expect_bytes(&tbuf, 0, &[0; 4096], c.what)?;
            }
        }
    }
    Ok(())
}

fn dereg_revokes(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    match s.role {
        Role::A => {
            let (_, lmr) = ep.reg(64, RW)?;
            let t = s.remote_mr()?;
            s.wait_for("deregistered")?;
            let op = SendOp::RdmaWrite {
                remote_addr: t.addr,
                rkey: t.rkey,
            };
            let wc = post_wait(&ep, SendWr::new(1, op, &[sge(&*lmr, 0, 8)]), s.timeout)?;
            wc_is(&wc, WcStatus::RemAccessErr, "write after dereg")?;
            s.signal("done")?;
        }
        Role::B => {
            let (tbuf, tmr) = ep.reg(64, RW)?;
            s.offer_mr(&*tmr)?;
            drop(tmr); // ibv_dereg_mr
            s.signal("deregistered")?;
            s.wait_for("done")?;
            expect_bytes(&tbuf, 0, &[0; 64], "deregistered memory")?;
        }
    }
    Ok(())
}

fn rnr(s: &mut Side<'_>) -> CaseResult {
    // Limited RNR retries and no receive: RNR_RETRY_EXC_ERR.
    let o = QpOptions {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..QpOptions::default()
    };
    let limited = s.connect_rc(&o)?;
    if s.role == Role::A {
        let (_, smr) = limited.reg(64, RW)?;
        let wc = post_wait(
            &limited,
            SendWr::new(1, SendOp::Send, &[sge(&*smr, 0, 8)]),
            s.timeout,
        )?;
        wc_is(&wc, WcStatus::RnrRetryExcErr, "limited RNR")?;
    }
    // Infinite RNR retries: the send completes once a receive is posted.
    let ep = s.connect_rc(&QpOptions::default())?;
    let (buf, mr) = ep.reg(64, RW)?;
    match s.role {
        Role::A => {
            buf.write(0, b"late").str_err()?;
            ep.qp
                .post_send(&[SendWr::new(1, SendOp::Send, &[sge(&*mr, 0, 4)])])
                .str_err()?;
            expect_none(&*ep.cq)?;
            s.signal("sent")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "send after RNR")?;
        }
        Role::B => {
            s.wait_for("sent")?;
            post_recv(&*ep.qp, 3, &[sge(&*mr, 0, 64)])?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Recv, "recv after RNR")?;
            expect_bytes(&buf, 0, b"late", "payload after RNR")?;
        }
    }
    Ok(())
}

fn unsignaled_and_lists(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    let data = pattern(4096, 1);
    let (buf, mr) = ep.reg(4096, RW)?;
    match s.role {
        Role::A => {
            buf.write(0, &data).str_err()?;
            let t = s.remote_mr()?;
            let write = |i: u64| SendOp::RdmaWrite {
                remote_addr: t.addr + i * 1024,
                rkey: t.rkey,
            };
            let sg: Vec<[Sge; 1]> = (0..4).map(|i| [sge(&*mr, i * 1024, 1024)]).collect();
            let wrs: Vec<SendWr<'_>> = (0..4u64)
                .map(|i| {
                    let mut wr = SendWr::new(i, write(i), &sg[i as usize]);
                    if i != 3 {
                        wr.flags = SendFlags::empty(); // unsignaled
                    }
                    wr
                })
                .collect();
            ep.qp.post_send(&wrs).str_err()?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            ensure!(wc.wr_id == 3, "only the signaled WR completes: {wc:?}");
            wc_ok(&wc, WcOpcode::RdmaWrite, "signaled write")?;
            s.signal("written")?;
            expect_none(&*ep.cq)?;
            // A bad work request in a list: those before it are posted, bad_wr points at it.
            let bad = [Sge {
                lkey: mr.lkey() ^ 0x77,
                ..sg[0][0]
            }];
            let list = [
                SendWr::new(10, write(0), &sg[0]),
                SendWr::new(11, write(0), &bad),
                SendWr::new(12, write(0), &sg[0]),
            ];
            let err = ep.qp.post_send(&list).err().ok_or("bad lkey accepted")?;
            ensure!(err.index == 1, "bad_wr index {}", err.index);
            let wc = poll_one(&*ep.cq, s.timeout)?;
            ensure!(wc.wr_id == 10, "first of the list: {wc:?}");
            expect_none(&*ep.cq)?;
            s.signal("done")?;
        }
        Role::B => {
            s.offer_mr(&*mr)?;
            s.wait_for("written")?;
            expect_bytes(&buf, 0, &data, "writes")?;
            s.wait_for("done")?;
            expect_none(&*ep.cq)?;
        }
    }
    Ok(())
}

fn inline_send(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_rc(&QpOptions::default())?;
    match s.role {
        Role::A => {
            let (sbuf, smr) = ep.reg(64, AccessFlags::empty())?;
            sbuf.write(0, b"inline!").str_err()?;
            s.wait_for("receive posted")?;
            let sg = [sge(&*smr, 0, 7)];
            let mut wr = SendWr::new(1, SendOp::Send, &sg);
            wr.flags |= SendFlags::INLINE;
            ep.qp.post_send(&[wr]).str_err()?;
            // The source may change right after posting: inline data was copied.
            sbuf.write(0, b"CHANGED").str_err()?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "inline send")?;
        }
        Role::B => {
            let (rbuf, rmr) = ep.reg(64, RW)?;
            post_recv(&*ep.qp, 1, &[sge(&*rmr, 0, 64)])?;
            s.signal("receive posted")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Recv, "inline recv")?;
            expect_bytes(&rbuf, 0, b"inline!", "inline payload")?;
        }
    }
    Ok(())
}

/// Both sides check their own device.
fn local_post_errors(s: &mut Side<'_>) -> CaseResult {
    let o = QpOptions::default();
    let ep = s.connect_rc(&o)?;
    let (_, mr) = ep.reg(64, AccessFlags::empty())?;
    let refused = |sg: &[Sge], op: SendOp, what: &str| {
        ensure!(
            ep.qp.post_send(&[SendWr::new(1, op, sg)]).is_err(),
            "{what} accepted"
        );
        Ok(())
    };
    // READ into memory without LOCAL_WRITE.
    let read = SendOp::RdmaRead {
        remote_addr: 0,
        rkey: 0,
    };
    refused(&[sge(&*mr, 0, 8)], read, "READ into read-only memory")?;
    // SGE outside its region.
    refused(&[sge(&*mr, 60, 8)], SendOp::Send, "out-of-bounds SGE")?;
    // An lkey of another PD.
    let (_, other) = endpoint(&s.ctx, &o, QpType::Rc, None)?.reg(64, RW)?;
    refused(&[sge(&*other, 0, 8)], SendOp::Send, "lkey of another PD")?;
    // Too many SGEs.
    let many = [sge(&*mr, 0, 1); 5];
    refused(&many, SendOp::Send, "more SGEs than max_send_sge")?;
    expect_none(&*ep.cq)
}

fn ud_qp(ctx: &Arc<dyn Context>, qkey: u32) -> Result<Endpoint, String> {
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

fn ud_send_recv(s: &mut Side<'_>) -> CaseResult {
    const QKEY_B: u32 = 0x2222_2222;
    let qkey = match s.role {
        Role::A => 0x1111_1111,
        Role::B => QKEY_B,
    };
    let ep = ud_qp(&s.ctx, qkey)?;
    let (_, peer) = s.exchange_qp(&ep, &QpOptions::default())?;
    match s.role {
        Role::A => {
            let (sbuf, smr) = ep.reg(256, RW)?;
            sbuf.write(0, b"datagram payload").str_err()?;
            let ah = ep
                .pd
                .create_ah(&remem_verbs::AhAttr {
                    dgid: peer.gid,
                    sgid_index: ep.gid_index,
                    ..remem_verbs::AhAttr::default()
                })
                .map_err(|e| format!("create_ah: {e}"))?;
            let dest = |qkey| remem_verbs::UdDest {
                ah: ah.clone(),
                remote_qpn: peer.qpn,
                remote_qkey: qkey,
            };
            let sg = [sge(&*smr, 0, 16)];
            // A wrong Q_Key is dropped at the receiver; the right one arrives.
            let mut bad = SendWr::new(1, SendOp::Send, &sg);
            bad.ud = Some(dest(0x3333_3333));
            let mut good = SendWr::new(2, SendOp::SendWithImm { imm: 99 }, &sg);
            good.ud = Some(dest(QKEY_B));
            s.wait_for("receive posted")?;
            ep.qp.post_send(&[bad, good]).str_err()?;
            let wcs = poll_n(&*ep.cq, 2, s.timeout)?;
            ensure!(
                wcs.iter().all(|w| w.status == WcStatus::Success),
                "UD sends complete locally: {wcs:?}"
            );
            // Datagrams larger than the MTU are refused locally.
            let mtu = s.ctx.query_port(1).str_err()?.active_mtu.bytes();
            let (_, bigmr) = ep.reg(mtu as usize + 1, RW)?;
            let bs = [sge(&*bigmr, 0, mtu + 1)];
            let mut big = SendWr::new(3, SendOp::Send, &bs);
            big.ud = Some(dest(QKEY_B));
            let wc = post_wait(&ep, big, s.timeout)?;
            if is_kernel_rxe(&*s.ctx) && wc.status == WcStatus::Success {
                eprintln!("ud: kernel rxe sent a datagram above the path MTU (known deviation)");
            } else {
                wc_is(&wc, WcStatus::LocLenErr, "oversized datagram")?;
            }
            s.signal("done")?;
        }
        Role::B => {
            let (rbuf, rmr) = ep.reg(1024, RW)?;
            post_recv(&*ep.qp, 1, &[sge(&*rmr, 0, 512)])?;
            s.signal("receive posted")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
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
            ensure!(wc.src_qp == peer.qpn, "src_qp {}", wc.src_qp);
            ensure!(wc.wc_flags.contains(WcFlags::GRH), "GRH flag");
            expect_bytes(&rbuf, 40, b"datagram payload", "payload after the GRH")?;
            s.wait_for("done")?;
            expect_none(&*ep.cq)?;
        }
    }
    Ok(())
}

/// A file in the temporary directory, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(tag: &str) -> Result<(Self, std::fs::File), String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "remem-conformance-{tag}-{}-{nanos}",
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((TempFile(path), file))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn flush_and_atomic_write(s: &mut Side<'_>) -> CaseResult {
    // Both sides must support the operations (kernels before 6.2 have neither in rxe).
    let dev = s.ctx.query_device().str_err()?;
    let mine =
        u64::from(dev.flush_global && dev.atomic_write) | (u64::from(dev.flush_persistent) << 1);
    let [theirs] = s.exchange_words([mine])?;
    if mine & theirs & 1 == 0 {
        return Ok(()); // not supported by one side: nothing to check
    }
    let persistent = mine & theirs & 2 != 0;
    let flush_access = AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
    let opts = QpOptions {
        access: QpOptions::default().access | flush_access,
        ..QpOptions::default()
    };
    let data = pattern(1000, 23);
    let value = 0x1122_3344_5566_7788u64;
    let ep = s.connect_rc(&opts)?;
    match s.role {
        Role::A => {
            let (lbuf, lmr) = ep.reg(64 + data.len(), RW)?;
            lbuf.write(64, &data).str_err()?;
            lbuf.write(0, &value.to_ne_bytes()).str_err()?;
            let t = s.remote_mr()?;
            let write = SendOp::RdmaWrite {
                remote_addr: t.addr,
                rkey: t.rkey,
            };
            let flush = |flush_type, level, len| SendOp::Flush {
                remote_addr: t.addr,
                rkey: t.rkey,
                len,
                flush_type,
                level,
            };
            let aw = SendOp::AtomicWrite {
                remote_addr: t.addr + 1024,
                rkey: t.rkey,
            };
            let flush_type = if persistent {
                FlushType::Persistent
            } else {
                FlushType::Global
            };
            let wsg = [sge(&*lmr, 64, data.len() as u32)];
            let asg = [sge(&*lmr, 0, 8)];
            let wrs = [
                SendWr::new(1, write, &wsg),
                SendWr::new(2, flush(flush_type, FlushLevel::Range, 1000), &[]),
                SendWr::new(3, flush(FlushType::Global, FlushLevel::Region, 0), &[]),
                SendWr::new(4, aw, &asg),
            ];
            ep.qp.post_send(&wrs).str_err()?;
            let wcs = poll_n(&*ep.cq, 4, s.timeout)?;
            let want = [
                WcOpcode::RdmaWrite,
                WcOpcode::Flush,
                WcOpcode::Flush,
                WcOpcode::AtomicWrite,
            ];
            for (i, wc) in wcs.iter().enumerate() {
                wc_ok(wc, want[i], &format!("work request {}", i + 1))?;
                ensure!(wc.wr_id == i as u64 + 1, "order: {wcs:?}");
            }
            s.signal("done")?;
        }
        Role::B => {
            let access = RW | AccessFlags::FLUSH_GLOBAL;
            // A file-backed region where persistence is supported: a persistent FLUSH
            // must have written the range to the file by the time it completes.
            let (file, buf, mr) = if persistent {
                let (tmp, file) = TempFile::new("flush")?;
                let buf = Arc::new(MemoryBuffer::map_file(&file, 0, 4096).str_err()?);
                let mr = ep
                    .pd
                    .reg_mr(
                        MemRegion::whole(buf.clone()),
                        access | AccessFlags::FLUSH_PERSISTENT,
                    )
                    .str_err()?;
                (Some(tmp), buf, mr)
            } else {
                let (buf, mr) = ep.reg(4096, access)?;
                (None, buf, mr)
            };
            s.offer_mr(&*mr)?;
            s.wait_for("done")?;
            expect_bytes(&buf, 0, &data, "written bytes")?;
            let got = buf.load_u64(1024).str_err()?;
            ensure!(got == value, "atomic write left {got:#x}, want {value:#x}");
            if let Some(tmp) = &file {
                let on_disk = std::fs::read(&tmp.0).str_err()?;
                ensure!(
                    on_disk.get(..data.len()) == Some(&data[..]),
                    "the file does not hold the flushed bytes"
                );
            }
            expect_none(&*ep.cq)?;
        }
    }
    // Refused ones: a misaligned ATOMIC WRITE (invalid request), a FLUSH of a region
    // without flush rights and an ATOMIC WRITE without REMOTE_WRITE (access errors).
    struct Bad {
        what: &'static str,
        op: fn(u64, u32) -> SendOp,
        access: AccessFlags,
        status: WcStatus,
    }
    let bads = [
        Bad {
            what: "misaligned ATOMIC WRITE",
            op: |a, rkey| SendOp::AtomicWrite {
                remote_addr: a + 4,
                rkey,
            },
            access: RW,
            status: WcStatus::RemInvReqErr,
        },
        Bad {
            what: "FLUSH without FLUSH_GLOBAL",
            op: |a, rkey| SendOp::Flush {
                remote_addr: a,
                rkey,
                len: 64,
                flush_type: FlushType::Global,
                level: FlushLevel::Range,
            },
            access: RW,
            status: WcStatus::RemAccessErr,
        },
        Bad {
            what: "ATOMIC WRITE without REMOTE_WRITE",
            op: |a, rkey| SendOp::AtomicWrite {
                remote_addr: a,
                rkey,
            },
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            status: WcStatus::RemAccessErr,
        },
    ];
    for b in bads {
        let ep = s.connect_rc(&opts)?;
        match s.role {
            Role::A => {
                let (_, lmr) = ep.reg(8, RW)?;
                let t = s.remote_mr()?;
                let op = (b.op)(t.addr, t.rkey);
                let sg = [sge(&*lmr, 0, 8)];
                let sg: &[Sge] = if matches!(op, SendOp::Flush { .. }) {
                    &[]
                } else {
                    &sg
                };
                let wc = post_wait(&ep, SendWr::new(9, op, sg), s.timeout)?;
                wc_is(&wc, b.status, b.what)?;
                s.signal("done")?;
            }
            Role::B => {
                let (buf, mr) = ep.reg(64, b.access)?;
                buf.fill(0, 64, 0xee).str_err()?;
                s.offer_mr(&*mr)?;
                s.wait_for("done")?;
                expect_bytes(&buf, 0, &[0xee; 64], b.what)?;
            }
        }
    }
    Ok(())
}

fn uc_send_and_write(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_uc(&QpOptions::default())?;
    let (slen, wlen) = (10_000usize, 9_000usize); // several packets at any MTU
    let (sdata, wdata) = (pattern(slen, 5), pattern(wlen, 9));
    match s.role {
        Role::A => {
            let (sbuf, smr) = ep.reg(slen.max(wlen), RW)?;
            // READ and atomics are not UC operations: refused when posted.
            let sg = [sge(&*smr, 0, 8)];
            for op in [
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: 0,
                },
                SendOp::AtomicFetchAndAdd {
                    remote_addr: 0,
                    rkey: 0,
                    add: 1,
                },
                SendOp::AtomicCmpAndSwp {
                    remote_addr: 0,
                    rkey: 0,
                    compare: 0,
                    swap: 1,
                },
            ] {
                ensure!(
                    ep.qp.post_send(&[SendWr::new(9, op, &sg)]).is_err(),
                    "{} accepted on a UC QP",
                    op.name()
                );
            }
            expect_none(&*ep.cq)?;
            let t = s.remote_mr()?;
            s.wait_for("receives posted")?;
            sbuf.write(0, &sdata).str_err()?;
            // A UC work request completes once sent: nothing is acknowledged.
            let all = [sge(&*smr, 0, slen as u32)];
            let wc = post_wait(&ep, SendWr::new(1, SendOp::Send, &all), s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "send")?;
            let op = SendOp::SendWithImm { imm: 0x1234_5678 };
            let wc = post_wait(&ep, SendWr::new(2, op, &[sge(&*smr, 0, 50)]), s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "send imm")?;
            sbuf.write(0, &wdata).str_err()?;
            let op = SendOp::RdmaWrite {
                remote_addr: t.addr + 32,
                rkey: t.rkey,
            };
            let all = [sge(&*smr, 0, wlen as u32)];
            let wc = post_wait(&ep, SendWr::new(3, op, &all), s.timeout)?;
            wc_ok(&wc, WcOpcode::RdmaWrite, "write")?;
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: t.addr,
                rkey: t.rkey,
                imm: 42,
            };
            let wc = post_wait(&ep, SendWr::new(4, op, &[sge(&*smr, 0, 16)]), s.timeout)?;
            wc_ok(&wc, WcOpcode::RdmaWrite, "write imm")?;
        }
        Role::B => {
            let (rbuf, rmr) = ep.reg(slen, RW)?;
            let (tbuf, tmr) = ep.reg(wlen + 64, RW)?;
            s.offer_mr(&*tmr)?;
            post_recv(&*ep.qp, 10, &[sge(&*rmr, 0, slen as u32)])?;
            post_recv(&*ep.qp, 11, &[sge(&*rmr, 0, 100)])?;
            post_recv(&*ep.qp, 12, &[sge(&*rmr, 0, 8)])?;
            s.signal("receives posted")?;
            let wcs = poll_n(&*ep.cq, 3, s.timeout)?;
            wc_ok(&wcs[0], WcOpcode::Recv, "recv")?;
            ensure!(
                wcs[0].wr_id == 10 && wcs[0].byte_len as usize == slen && wcs[0].imm().is_none(),
                "recv: {:?}",
                wcs[0]
            );
            wc_ok(&wcs[1], WcOpcode::Recv, "recv imm")?;
            ensure!(
                wcs[1].wr_id == 11 && wcs[1].byte_len == 50,
                "recv imm: {:?}",
                wcs[1]
            );
            ensure!(wcs[1].imm() == Some(0x1234_5678), "imm {:?}", wcs[1].imm());
            expect_bytes(&rbuf, 0, &sdata, "sent bytes")?;
            wc_ok(&wcs[2], WcOpcode::RecvRdmaWithImm, "recv write imm")?;
            ensure!(
                wcs[2].wr_id == 12 && wcs[2].imm() == Some(42) && wcs[2].byte_len == 16,
                "recv write imm: {:?}",
                wcs[2]
            );
            expect_bytes(&tbuf, 0, &wdata[..16], "write imm bytes")?;
            expect_bytes(&tbuf, 16, &[0; 16], "between the writes")?;
            expect_bytes(&tbuf, 32, &wdata, "written bytes")?;
            expect_none(&*ep.cq)?;
        }
    }
    Ok(())
}

/// Waits (bounded) until `buf` holds `want` at `offset`: a UC requester's completion
/// says only that the data left, so the responder watches its memory.
fn await_bytes(buf: &MemoryBuffer, offset: usize, want: &[u8], timeout: Duration) -> CaseResult {
    let deadline = std::time::Instant::now() + timeout;
    while buf.to_vec(offset, want.len()).str_err()? != want {
        ensure!(
            std::time::Instant::now() < deadline,
            "{} bytes at offset {offset} did not arrive within {timeout:?}",
            want.len()
        );
        std::thread::yield_now();
    }
    Ok(())
}

fn uc_lost_messages(s: &mut Side<'_>) -> CaseResult {
    let ep = s.connect_uc(&QpOptions::default())?;
    let len = 3000usize; // several packets at MTU 1024
    const MARK: [u8; 8] = *b"UC-MARK!";
    match s.role {
        Role::A => {
            let (sbuf, smr) = ep.reg(len, RW)?;
            sbuf.write(0, &pattern(len, 1)).str_err()?;
            let t = s.remote_mr()?;
            let all = [sge(&*smr, 0, len as u32)];
            // B has no receive posted: the SEND is lost there, and this side cannot know.
            let wc = post_wait(&ep, SendWr::new(1, SendOp::Send, &all), s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "send without a receive")?;
            // A forged rkey: dropped there, no NAK, no error here either.
            let forged = SendOp::RdmaWrite {
                remote_addr: t.addr,
                rkey: t.rkey ^ 0x5a5a_5a00,
            };
            let wc = post_wait(&ep, SendWr::new(2, forged, &all), s.timeout)?;
            wc_ok(&wc, WcOpcode::RdmaWrite, "write with a forged rkey")?;
            // A marker: UC keeps the order, so once it has landed, B has seen (and
            // dropped) everything before it.
            sbuf.write(0, &MARK).str_err()?;
            let mark = SendOp::RdmaWrite {
                remote_addr: t.addr + len as u64,
                rkey: t.rkey,
            };
            let wc = post_wait(&ep, SendWr::new(3, mark, &[sge(&*smr, 0, 8)]), s.timeout)?;
            wc_ok(&wc, WcOpcode::RdmaWrite, "marker")?;
            s.signal("marked")?;
            s.wait_for("receive posted")?;
            sbuf.write(0, &pattern(100, 2)).str_err()?;
            let op = SendOp::SendWithImm { imm: 7 };
            let wc = post_wait(&ep, SendWr::new(4, op, &[sge(&*smr, 0, 100)]), s.timeout)?;
            wc_ok(&wc, WcOpcode::Send, "send after the losses")?;
        }
        Role::B => {
            let (tbuf, tmr) = ep.reg(len + 8, RW)?;
            s.offer_mr(&*tmr)?;
            s.wait_for("marked")?;
            await_bytes(&tbuf, len, &MARK, s.timeout)?;
            expect_bytes(&tbuf, 0, &vec![0; len], "memory behind the forged rkey")?;
            // Nothing completed (the lost SEND had no receive to complete), nothing failed.
            expect_none(&*ep.cq)?;
            ensure!(
                ep.qp.state() == QpState::Rts,
                "responder QP in {:?} after the losses",
                ep.qp.state()
            );
            let (rbuf, rmr) = ep.reg(len, RW)?;
            post_recv(&*ep.qp, 20, &[sge(&*rmr, 0, len as u32)])?;
            s.signal("receive posted")?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            wc_ok(&wc, WcOpcode::Recv, "recv after the losses")?;
            ensure!(
                wc.wr_id == 20 && wc.byte_len == 100 && wc.imm() == Some(7),
                "recv after the losses: {wc:?}"
            );
            expect_bytes(&rbuf, 0, &pattern(100, 2), "received bytes")?;
            expect_none(&*ep.cq)?;
        }
    }
    Ok(())
}
