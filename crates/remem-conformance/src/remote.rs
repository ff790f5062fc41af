//! Two processes: a *driver* that runs one-sided and two-sided operations against a
//! *server* in another process, each on its own device. Endpoint information (QP number,
//! GID, PSN, buffer address, rkey) is exchanged over a TCP connection as one text line each
//! way; the TCP connection then carries the server's checks back to the driver.

use crate::harness::{Endpoint, QpOptions, bring_up, endpoint, poll_one, roce_v2_gid};
use remem_verbs::{
    AccessFlags, Context, Gid, Mtu, QpType, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const BUF: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(10);

struct Info {
    qpn: u32,
    gid: Gid,
    psn: u32,
    addr: u64,
    rkey: u32,
}

impl Info {
    fn line(&self) -> String {
        format!(
            "{} {} {} {} {}\n",
            self.qpn,
            self.gid.to_ip(),
            self.psn,
            self.addr,
            self.rkey
        )
    }

    fn parse(line: &str) -> Result<Info, String> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("bad endpoint line {line:?}");
        if f.len() != 5 {
            return Err(bad());
        }
        Ok(Info {
            qpn: f[0].parse().map_err(|_| bad())?,
            gid: Gid::from(f[1].parse::<IpAddr>().map_err(|_| bad())?),
            psn: f[2].parse().map_err(|_| bad())?,
            addr: f[3].parse().map_err(|_| bad())?,
            rkey: f[4].parse().map_err(|_| bad())?,
        })
    }
}

/// One side's endpoint, its registered buffer and what it tells the peer.
struct Side {
    ep: Endpoint,
    buf: Arc<remem_verbs::MemoryBuffer>,
    mr: Arc<dyn remem_verbs::MemoryRegion>,
    info: Info,
}

fn setup(ctx: &Arc<dyn Context>, psn: u32) -> Result<Side, String> {
    let o = QpOptions {
        cqe: 64,
        ..QpOptions::default()
    };
    let ep = endpoint(ctx, &o, QpType::Rc, None)?;
    let (_, gid) = roce_v2_gid(&**ctx)?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let (buf, mr) = ep.reg(BUF, access)?;
    let info = Info {
        qpn: ep.qp.qp_num(),
        gid,
        psn,
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    Ok(Side { ep, buf, mr, info })
}

fn connect(ep: &Endpoint, me: &Info, peer: &Info) -> Result<(), String> {
    let mtu = ep
        .ctx
        .query_port(1)
        .map_err(|e| e.to_string())?
        .active_mtu
        .min(Mtu::Mtu1024);
    bring_up(
        ep,
        peer.qpn,
        peer.gid,
        me.psn,
        peer.psn,
        mtu,
        &QpOptions::default(),
    )
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + 5) as u8).collect()
}

/// Serves one driver on `listener` with device `ctx`: receives one SEND, then checks the
/// WRITE and atomics the driver made and reports each check over TCP.
pub fn serve(ctx: Arc<dyn Context>, listener: TcpListener) -> Result<(), String> {
    let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(TIMEOUT)).ok();
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut out = stream;
    let Side {
        ep,
        buf,
        mr,
        info: me,
    } = setup(&ctx, 0x00ff_fffa)?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let peer = Info::parse(&line)?;
    // The value the driver's compare-and-swap and fetch-and-add work on.
    buf.store_u64(BUF - 8, 1000).map_err(|e| e.to_string())?;
    connect(&ep, &me, &peer)?;
    // A receive for the driver's SEND, posted before we announce ourselves.
    let r = [Sge {
        addr: mr.addr() + 32 * 1024,
        length: 1024,
        lkey: mr.lkey(),
    }];
    ep.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &r,
        }])
        .map_err(|e| e.to_string())?;
    out.write_all(me.line().as_bytes())
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*ep.cq, TIMEOUT)?;
    let msg = buf
        .to_vec(32 * 1024, wc.byte_len as usize)
        .map_err(|e| e.to_string())?;
    let send_ok = wc.status == WcStatus::Success
        && wc.opcode == WcOpcode::Recv
        && wc.imm() == Some(0x1234)
        && msg == b"hello from the driver";
    writeln!(out, "send {}", if send_ok { "ok" } else { "BAD" }).map_err(|e| e.to_string())?;
    // Wait for the driver to say its one-sided operations are done, then check memory.
    line.clear();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let write_ok = buf.to_vec(0, 8192).map_err(|e| e.to_string())? == pattern(8192);
    let atomic_ok = buf.load_u64(BUF - 8).map_err(|e| e.to_string())? == 2000 + 7;
    writeln!(
        out,
        "write {} atomics {}",
        if write_ok { "ok" } else { "BAD" },
        if atomic_ok { "ok" } else { "BAD" }
    )
    .map_err(|e| e.to_string())?;
    drop(mr);
    Ok(())
}

/// Drives a server at `server`: SEND with immediate, WRITE, READ back, compare-and-swap and
/// fetch-and-add; returns a line per check ("… ok"). Any failed check is an `Err`.
pub fn drive(ctx: Arc<dyn Context>, server: std::net::SocketAddr) -> Result<Vec<String>, String> {
    let stream = TcpStream::connect(server).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(TIMEOUT)).ok();
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut out = stream;
    let Side {
        ep,
        buf,
        mr,
        info: me,
    } = setup(&ctx, 0x0012_3456)?;
    out.write_all(me.line().as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let peer = Info::parse(&line)?;
    connect(&ep, &me, &peer)?;
    let mut report = Vec::new();
    let sge = |off: u64, len: u32| Sge {
        addr: mr.addr() + off,
        length: len,
        lkey: mr.lkey(),
    };
    let expect = |what: &str, ok: bool, report: &mut Vec<String>| {
        if ok {
            report.push(format!("{what} ok"));
            Ok(())
        } else {
            Err(format!("{what} FAILED"))
        }
    };
    // SEND with immediate.
    buf.write(0, b"hello from the driver")
        .map_err(|e| e.to_string())?;
    ep.qp
        .post_send(&[SendWr::new(
            1,
            SendOp::SendWithImm { imm: 0x1234 },
            &[sge(0, 21)],
        )])
        .map_err(|e| e.to_string())?;
    let wc = poll_one(&*ep.cq, TIMEOUT)?;
    expect(
        "send completion",
        wc.status == WcStatus::Success,
        &mut report,
    )?;
    line.clear();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    expect(
        "server received the send",
        line.trim() == "send ok",
        &mut report,
    )?;
    // WRITE 8 KiB, READ it back.
    let data = pattern(8192);
    buf.write(0, &data).map_err(|e| e.to_string())?;
    let w = SendOp::RdmaWrite {
        remote_addr: peer.addr,
        rkey: peer.rkey,
    };
    let r = SendOp::RdmaRead {
        remote_addr: peer.addr,
        rkey: peer.rkey,
    };
    ep.qp
        .post_send(&[
            SendWr::new(2, w, &[sge(0, 8192)]),
            SendWr::new(3, r, &[sge(16384, 8192)]),
        ])
        .map_err(|e| e.to_string())?;
    for id in [2, 3] {
        let wc = poll_one(&*ep.cq, TIMEOUT)?;
        expect(
            &format!("{} completion", if id == 2 { "write" } else { "read" }),
            wc.status == WcStatus::Success && wc.wr_id == id,
            &mut report,
        )?;
    }
    expect(
        "read returned what was written",
        buf.to_vec(16384, 8192).map_err(|e| e.to_string())? == data,
        &mut report,
    )?;
    // Compare-and-swap 1000 -> 2000, then fetch-and-add 7.
    let va = peer.addr + BUF as u64 - 8;
    let cas = SendOp::AtomicCmpAndSwp {
        remote_addr: va,
        rkey: peer.rkey,
        compare: 1000,
        swap: 2000,
    };
    let faa = SendOp::AtomicFetchAndAdd {
        remote_addr: va,
        rkey: peer.rkey,
        add: 7,
    };
    ep.qp
        .post_send(&[
            SendWr::new(4, cas, &[sge(32768, 8)]),
            SendWr::new(5, faa, &[sge(32776, 8)]),
        ])
        .map_err(|e| e.to_string())?;
    for _ in 0..2 {
        let wc = poll_one(&*ep.cq, TIMEOUT)?;
        expect(
            "atomic completion",
            wc.status == WcStatus::Success,
            &mut report,
        )?;
    }
    expect(
        "compare-and-swap returned 1000",
        buf.load_u64(32768).map_err(|e| e.to_string())? == 1000,
        &mut report,
    )?;
    expect(
        "fetch-and-add returned 2000",
        buf.load_u64(32776).map_err(|e| e.to_string())? == 2000,
        &mut report,
    )?;
    writeln!(out, "done").map_err(|e| e.to_string())?;
    line.clear();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    expect(
        "server saw the written bytes and the atomics' result",
        line.trim() == "write ok atomics ok",
        &mut report,
    )?;
    Ok(report)
}
