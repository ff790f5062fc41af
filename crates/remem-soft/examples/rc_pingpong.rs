//! `ibv_rc_pingpong` on remem's soft provider, speaking rdma-core's example's own exchange
//! (TCP port 18515, `LID:QPN:PSN:GID` as text), so that it runs against the real
//! `ibv_rc_pingpong` on another machine — in particular against kernel Soft-RoCE in the
//! VM of `cargo xtask rxe` (see `xtask/README.md`): the wire-interop proof between remem's
//! RoCEv2 stack and the kernel's.
//!
//! `rc_pingpong --device soft@IP:4791 [--iters N] [--size BYTES] [SERVER]`: without
//! `SERVER`, waits for a client on TCP 18515; with it, connects there (retrying for up to
//! two minutes while nothing listens: the server may be a VM still booting). Each side sends
//! `--size` bytes (several packets at MTU 1024) after receiving, `--iters` times, with
//! receives posted ahead, as `ibv_rc_pingpong` does; then prints what moved. Exits non-zero
//! on any error or if it does not finish within 60 s.

use remem_conformance::{QpOptions, bring_up, endpoint, roce_v2_gid};
use remem_soft::SoftContext;
use remem_verbs::{
    AccessFlags, Context, Gid, MemRegion, MemoryBuffer, Mtu, QpType, RecvWr, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PORT: u16 = 18515;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const RX_DEPTH: usize = 500;
/// `"0000:000000:000000:" + 32 hex digits + NUL`, as `ibv_rc_pingpong` sends it.
const MSG_LEN: usize = 52;

struct Dest {
    qpn: u32,
    psn: u32,
    gid: Gid,
}

fn encode(d: &Dest) -> [u8; MSG_LEN] {
    let hex: String = d.gid.raw().iter().map(|b| format!("{b:02x}")).collect();
    let text = format!("{:04x}:{:06x}:{:06x}:{hex}", 0, d.qpn, d.psn);
    let mut m = [0u8; MSG_LEN];
    m[..text.len()].copy_from_slice(text.as_bytes());
    m
}

fn decode(m: &[u8]) -> Result<Dest, String> {
    let text = std::str::from_utf8(m)
        .map_err(|_| "not text")?
        .trim_end_matches('\0');
    let parts: Vec<&str> = text.split(':').collect();
    let [_, qpn, psn, gid] = parts.as_slice() else {
        return Err(format!("bad message {text:?}"));
    };
    let num = |s: &str| u32::from_str_radix(s, 16).map_err(|_| format!("bad number {s:?}"));
    if gid.len() != 32 {
        return Err(format!("bad gid {gid:?}"));
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).map_err(|_| "bad gid")?;
    }
    Ok(Dest {
        qpn: num(qpn)?,
        psn: num(psn)?,
        gid: Gid(raw),
    })
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut device, mut iters, mut size, mut server) = (None, 1000usize, 4096usize, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => device = args.next(),
            "--iters" | "-n" => {
                iters = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--iters N")?
            }
            "--size" | "-s" => size = args.next().and_then(|v| v.parse().ok()).ok_or("--size N")?,
            other => server = Some(other.to_string()),
        }
    }
    let device = device.ok_or("--device soft@IP:PORT is required")?;
    let addr = remem_soft::SoftDeviceName::bound_addr(&device)
        .map_err(|e| e.to_string())?
        .ok_or("a soft device: soft@IP:PORT")?;
    let ctx: Arc<dyn Context> =
        Arc::new(SoftContext::bind(addr).map_err(|e| format!("opening {device}: {e}"))?);
    let o = QpOptions {
        mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    };
    let mut o = o;
    o.cap.max_recv_wr = RX_DEPTH as u32 + 1;
    o.cap.max_send_wr = 4;
    o.cqe = 2 * RX_DEPTH as u32 + 8;
    let ep = endpoint(&ctx, &o, QpType::Rc, None)?;
    let buf = Arc::new(MemoryBuffer::zeroed(size).map_err(|e| e.to_string())?);
    let mr = ep
        .pd
        .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let sge = [Sge {
        addr: mr.addr(),
        length: size as u32,
        lkey: mr.lkey(),
    }];
    let post_recvs = |n: usize| -> Result<usize, String> {
        for _ in 0..n {
            ep.qp
                .post_recv(&[RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &sge,
                }])
                .map_err(|e| format!("post_recv: {}", e.error))?;
        }
        Ok(n)
    };
    // Receives are posted once the QP is out of RESET (right after it is brought up, before
    // the peer can learn where to send).
    let mut routs: usize;
    let (_, gid) = roce_v2_gid(&*ctx)?;
    let me = Dest {
        qpn: ep.qp.qp_num(),
        psn: rand::random::<u32>() & 0x00ff_ffff,
        gid,
    };
    println!(
        "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        me.qpn,
        me.psn,
        gid.to_ip()
    );
    // The exchange, as ibv_rc_pingpong does it.
    let peer = match &server {
        None => {
            let listener = TcpListener::bind(("0.0.0.0", PORT)).map_err(|e| e.to_string())?;
            let (mut s, _) = listener.accept().map_err(|e| e.to_string())?;
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m).map_err(|e| e.to_string())?;
            let peer = decode(&m)?;
            bring_up(&ep, peer.qpn, peer.gid, me.psn, peer.psn, Mtu::Mtu1024, &o)?;
            routs = post_recvs(RX_DEPTH)?;
            s.write_all(&encode(&me)).map_err(|e| e.to_string())?;
            let mut done = [0u8; 5];
            let _ = s.read(&mut done);
            peer
        }
        Some(host) => {
            // The server may not listen yet (a VM still booting): retry for a while.
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut s = loop {
                match TcpStream::connect((host.as_str(), PORT)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(format!("connecting to {host}: {e}")),
                }
            };
            s.write_all(&encode(&me)).map_err(|e| e.to_string())?;
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m).map_err(|e| e.to_string())?;
            let peer = decode(&m)?;
            bring_up(&ep, peer.qpn, peer.gid, me.psn, peer.psn, Mtu::Mtu1024, &o)?;
            routs = post_recvs(RX_DEPTH)?;
            s.write_all(b"done\0").map_err(|e| e.to_string())?;
            peer
        }
    };
    println!(
        "  remote address: LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        peer.qpn,
        peer.psn,
        peer.gid.to_ip()
    );
    let post_send = || {
        ep.qp
            .post_send(&[SendWr::new(SEND_WRID, SendOp::Send, &sge)])
            .map_err(|e| format!("post_send: {}", e.error))
    };
    let start = Instant::now();
    let mut pending = RECV_WRID;
    if server.is_some() {
        post_send()?;
        pending |= SEND_WRID;
    }
    let (mut scnt, mut rcnt) = (0usize, 0usize);
    let mut wc = [WorkCompletion::default(); 16];
    while rcnt < iters || scnt < iters {
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("timed out: {scnt} sent, {rcnt} received"));
        }
        let n = ep.cq.poll(&mut wc).map_err(|e| e.to_string())?;
        if n == 0 {
            std::thread::yield_now();
            continue;
        }
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!("completion failed: {w:?}"));
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(RX_DEPTH - routs)?;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("completion for unknown wr_id {other}")),
            }
            pending &= !w.wr_id;
            if scnt < iters && pending == 0 {
                post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = (size * iters * 2) as f64;
    println!(
        "{} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
        secs * 1e6 / iters as f64
    );
    Ok(())
}
