//! Hostile peers: a raw RoCEv2 sender built on `remem-wire` — a plain UDP socket on
//! 127.0.21.2 — aims crafted packets at a soft device on 127.0.21.1 whose queue pairs are
//! connected to it. For each attack: the target memory is unchanged (compared whole), the
//! answer is the NAK the IBTA specification prescribes or silence, a device counter counts
//! it, the victim QP ends in the state the specification says (ERR after an access error
//! or an invalid request NAK, as rxe does), and another QP on the same device keeps
//! working (a legitimate WRITE through it lands).

use remem_conformance::{Endpoint, QpOptions, bring_up, endpoint};
use remem_soft::SoftContext;
use remem_verbs::{
    AccessFlags, Context, Gid, MemRegion, MemoryBuffer, MemoryRegion, Mtu, QpState, QpType,
};
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use remem_wire::{AtomicEth, Bth, Feth, Headers, Opcode, Packet, Psn, Reth, Syndrome};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

const VICTIM_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 2);
/// The raw peer's QPN as the victim QPs know it.
const PEER_QPN: u32 = 0xabcd;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The victim device and the raw peer's socket (one per test binary: tests take turns).
struct World {
    ctx: Arc<dyn Context>,
    sock: UdpSocket,
    port: u16,
}

fn world() -> std::sync::MutexGuard<'static, World> {
    static W: OnceLock<Mutex<World>> = OnceLock::new();
    W.get_or_init(|| {
        let dev = SoftContext::bind(SocketAddr::new(VICTIM_IP.into(), 0)).unwrap();
        let port = dev.local_addr().port();
        let sock = UdpSocket::bind(SocketAddr::new(PEER_IP.into(), port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Mutex::new(World {
            ctx: Arc::new(dev),
            sock,
            port,
        })
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

/// A victim QP connected to the raw peer, expecting PSN `epsn`, and a target region.
struct Victim {
    ep: Endpoint,
    buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
    epsn: u32,
}

fn victim(w: &World, access: AccessFlags, mr_access: AccessFlags) -> Victim {
    let o = QpOptions {
        access,
        mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    };
    let ep = endpoint(&w.ctx, &o, QpType::Rc, None).unwrap();
    let epsn = 1000;
    bring_up(
        &ep,
        PEER_QPN,
        Gid::from(PEER_IP),
        5000,
        epsn,
        Mtu::Mtu1024,
        &o,
    )
    .unwrap();
    let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
    buf.fill(0, 4096, 0x3c).unwrap();
    let mr = ep
        .pd
        .reg_mr(MemRegion::whole(buf.clone()), mr_access)
        .unwrap();
    Victim { ep, buf, mr, epsn }
}

fn counters(w: &World) -> HashMap<String, u64> {
    w.ctx
        .counters()
        .into_iter()
        .map(|c| (c.name.to_string(), c.value))
        .collect()
}

/// Builds a packet with a right ICRC (unless `bad_icrc`) and sends it to the victim.
fn send(w: &World, h: &Headers, payload: &[u8], bad_icrc: bool) {
    let mut buf = vec![0u8; h.packet_len(payload.len())];
    let n = h.build(payload, &mut buf).unwrap();
    buf.truncate(n);
    seal_and_send(w, buf, bad_icrc);
}

fn seal_and_send(w: &World, mut buf: Vec<u8>, bad_icrc: bool) {
    let ip = IpFields::V4 {
        src: PEER_IP,
        dst: VICTIM_IP,
        id: 0,
        flags_frag: IPV4_DF,
    };
    let ports = UdpPorts {
        src: w.port,
        dst: w.port,
    };
    if buf.len() >= 16 {
        icrc::fill(&ip, ports, &mut buf).unwrap();
        if bad_icrc {
            let n = buf.len();
            buf[n - 1] ^= 0x55;
        }
    }
    w.sock
        .send_to(&buf, SocketAddr::new(VICTIM_IP.into(), w.port))
        .unwrap();
}

/// The answers the victim sends: whatever arrives within 2 s of the first wait, then until
/// 50 ms pass without another (opcode, psn, syndrome).
fn answers(w: &World) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    let mut out = Vec::new();
    let mut b = [0u8; 9000];
    while let Ok(n) = w.sock.recv(&mut b) {
        if let Ok(p) = Packet::parse(&b[..n]) {
            out.push((
                p.headers.bth.opcode,
                p.headers.bth.psn.value(),
                p.headers.aeth.map(|a| a.syndrome),
            ));
        }
        // Stop after the first answer burst: a short second wait catches stragglers.
        w.sock
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
    }
    w.sock
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    out
}

/// Silence: nothing comes back within 2 s.
fn silence(w: &World) -> bool {
    answers(w).is_empty()
}

fn request(v: &Victim, op: Opcode, psn: u32) -> Headers {
    let mut bth = Bth::new(op, v.ep.qp.qp_num(), Psn::new(psn));
    bth.ack_req = true;
    Headers::new(bth)
}

fn reth(va: u64, rkey: u32, len: u32) -> Option<Reth> {
    Some(Reth {
        va,
        rkey,
        dma_len: len,
    })
}

/// A WRITE of `len` bytes at `va` with `rkey`.
fn write(v: &Victim, va: u64, rkey: u32, len: usize) -> (Headers, Vec<u8>) {
    let mut h = request(v, Opcode::RcWriteOnly, v.epsn);
    h.reth = reth(va, rkey, len as u32);
    (h, vec![0xee; len])
}

fn unchanged(v: &Victim) -> bool {
    v.buf.to_vec(0, 4096).unwrap().iter().all(|&b| b == 0x3c)
}

/// Another QP on the device still works: a WRITE from the raw peer through a fresh victim
/// lands and is ACKed.
fn others_unaffected(w: &World) {
    let v = victim(w, RW, RW);
    let (h, p) = write(&v, v.mr.addr() + 8, v.mr.rkey(), 16);
    send(w, &h, &p, false);
    let a = answers(w);
    assert!(
        a.iter().any(|(op, psn, s)| *op == Opcode::RcAck
            && *psn == v.epsn
            && matches!(s, Some(Syndrome::Ack { .. }))),
        "a legitimate WRITE on another QP: {a:?}"
    );
    assert_eq!(v.buf.to_vec(8, 16).unwrap(), vec![0xee; 16]);
}

/// Sends `h`/`payload` to `v` and checks: memory unchanged, the NAK `want` (or silence),
/// the counter `counter` grew, the QP's state.
#[allow(clippy::too_many_arguments)]
fn attack(
    w: &World,
    v: &Victim,
    h: &Headers,
    payload: &[u8],
    want: Option<Syndrome>,
    counter: &str,
    state: QpState,
    what: &str,
) {
    let before = counters(w);
    send(w, h, payload, false);
    let a = answers(w);
    match want {
        Some(syn) => assert!(
            a.iter().any(|(op, psn, s)| *op == Opcode::RcAck
                && *psn == h.bth.psn.value()
                && *s == Some(syn)),
            "{what}: want {syn:?}, got {a:?}"
        ),
        None => assert!(a.is_empty(), "{what}: want silence, got {a:?}"),
    }
    assert!(unchanged(v), "{what}: target memory changed");
    let after = counters(w);
    assert!(
        after[counter] > before.get(counter).copied().unwrap_or(0),
        "{what}: counter {counter} did not move"
    );
    assert_eq!(v.ep.qp.state(), state, "{what}: victim QP state");
    others_unaffected(w);
}

const ACCESS: Option<Syndrome> = Some(Syndrome::NakRemoteAccessError);
const INVALID: Option<Syndrome> = Some(Syndrome::NakInvalidRequest);

#[test]
fn a_valid_write_from_the_raw_peer_lands() {
    // The positive control: without it the refusals below would prove nothing.
    let w = world();
    let v = victim(&w, RW, RW);
    let (h, p) = write(&v, v.mr.addr() + 100, v.mr.rkey(), 200);
    send(&w, &h, &p, false);
    let a = answers(&w);
    assert!(
        a.iter()
            .any(|(op, psn, _)| *op == Opcode::RcAck && *psn == v.epsn),
        "{a:?}"
    );
    assert_eq!(v.buf.to_vec(100, 200).unwrap(), vec![0xee; 200]);
    assert_eq!(v.ep.qp.state(), QpState::Rts);
}

#[test]
fn forged_stale_and_foreign_keys_are_access_errors() {
    let w = world();
    // Forged.
    let v = victim(&w, RW, RW);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey() ^ 0x0101_0000, 64);
    attack(
        &w,
        &v,
        &h,
        &p,
        ACCESS,
        "send_err",
        QpState::Err,
        "forged rkey",
    );
    // Stale: the key of a deregistered region.
    let v = victim(&w, RW, RW);
    let old = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
    let stale = v.ep.pd.reg_mr(MemRegion::whole(old.clone()), RW).unwrap();
    let (va, key) = (stale.addr(), stale.rkey());
    drop(stale);
    let (h, p) = write(&v, va, key, 64);
    attack(
        &w,
        &v,
        &h,
        &p,
        ACCESS,
        "send_err",
        QpState::Err,
        "stale rkey",
    );
    assert!(old.to_vec(0, 4096).unwrap().iter().all(|&b| b == 0));
    // Another PD's key.
    let v = victim(&w, RW, RW);
    let other = victim(&w, RW, RW); // its own PD
    let (h, p) = write(&v, other.mr.addr(), other.mr.rkey(), 64);
    attack(
        &w,
        &v,
        &h,
        &p,
        ACCESS,
        "send_err",
        QpState::Err,
        "another PD's rkey",
    );
    assert!(unchanged(&other));
}

#[test]
fn ranges_out_of_bounds_or_wrapping_are_access_errors() {
    let w = world();
    for (what, off, len) in [
        ("past the end", 4090u64, 64usize),
        ("before the start", u64::MAX - 15, 64),
    ] {
        let v = victim(&w, RW, RW);
        let (h, p) = write(&v, v.mr.addr().wrapping_add(off), v.mr.rkey(), len);
        attack(&w, &v, &h, &p, ACCESS, "send_err", QpState::Err, what);
    }
    // A READ whose range wraps past 2^64.
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcReadRequest, v.epsn);
    h.reth = reth(u64::MAX - 100, v.mr.rkey(), 4096);
    attack(
        &w,
        &v,
        &h,
        &[],
        ACCESS,
        "send_err",
        QpState::Err,
        "wrapping READ",
    );
}

#[test]
fn missing_rights_are_refused() {
    let w = world();
    // The region lacks REMOTE_WRITE: access error.
    let v = victim(&w, RW, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    attack(
        &w,
        &v,
        &h,
        &p,
        ACCESS,
        "send_err",
        QpState::Err,
        "MR without REMOTE_WRITE",
    );
    // The region lacks REMOTE_ATOMIC.
    let v = victim(&w, RW, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let mut h = request(&v, Opcode::RcFetchAdd, v.epsn);
    h.atomic = Some(AtomicEth {
        va: v.mr.addr(),
        rkey: v.mr.rkey(),
        swap_add: 1,
        compare: 0,
    });
    attack(
        &w,
        &v,
        &h,
        &[],
        ACCESS,
        "send_err",
        QpState::Err,
        "MR without REMOTE_ATOMIC",
    );
    // The QP does not grant remote writes: invalid request.
    let v = victim(&w, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ, RW);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    attack(
        &w,
        &v,
        &h,
        &p,
        INVALID,
        "send_err",
        QpState::Err,
        "QP without REMOTE_WRITE",
    );
}

#[test]
fn unknown_qpn_truncated_headers_and_bad_icrc_are_dropped_silently() {
    let w = world();
    let v = victim(&w, RW, RW);
    // Unknown destination QP.
    let (mut h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    h.bth.dest_qp = 0x00ff_fff0;
    attack(
        &w,
        &v,
        &h,
        &p,
        None,
        "drop_unknown_qp",
        QpState::Rts,
        "unknown QPN",
    );
    // Truncated: a WRITE cut inside its RETH.
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    let mut buf = vec![0u8; h.packet_len(p.len())];
    let n = h.build(&p, &mut buf).unwrap();
    let before = counters(&w);
    w.sock
        .send_to(&buf[..20.min(n)], SocketAddr::new(VICTIM_IP.into(), w.port))
        .unwrap();
    assert!(silence(&w), "truncated header answered");
    assert!(counters(&w)["drop_malformed"] > before["drop_malformed"]);
    assert!(unchanged(&v));
    // Bad ICRC.
    let before = counters(&w);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    send(&w, &h, &p, true);
    assert!(silence(&w), "bad ICRC answered");
    assert!(counters(&w)["drop_bad_icrc"] > before["drop_bad_icrc"]);
    assert!(unchanged(&v));
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    others_unaffected(&w);
}

#[test]
fn psns_outside_the_window_and_out_of_order_packets() {
    let w = world();
    // Far ahead: one sequence NAK, not a storm, however many come.
    let v = victim(&w, RW, RW);
    let before = counters(&w);
    for k in 0..5 {
        let (mut h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
        h.bth.psn = Psn::new(v.epsn + 1000 + k);
        send(&w, &h, &p, false);
    }
    let a = answers(&w);
    let naks = a
        .iter()
        .filter(|(_, _, s)| *s == Some(Syndrome::NakPsnSeqErr))
        .count();
    assert_eq!(naks, 1, "{a:?}");
    assert!(
        counters(&w)["out_of_seq_request"]
            >= before.get("out_of_seq_request").copied().unwrap_or(0) + 5
    );
    assert!(unchanged(&v));
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    // MIDDLE or LAST without FIRST: invalid request.
    for (op, what) in [
        (Opcode::RcWriteMiddle, "MIDDLE without FIRST"),
        (Opcode::RcWriteLast, "LAST without FIRST"),
    ] {
        let v = victim(&w, RW, RW);
        let h = request(&v, op, v.epsn);
        attack(
            &w,
            &v,
            &h,
            &[0xee; 1024],
            INVALID,
            "send_err",
            QpState::Err,
            what,
        );
    }
    // Payload above the MTU.
    let v = victim(&w, RW, RW);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 2048);
    attack(
        &w,
        &v,
        &h,
        &p,
        INVALID,
        "send_err",
        QpState::Err,
        "payload above the MTU",
    );
}

#[test]
fn misaligned_atomics_and_oversized_reads_are_invalid() {
    let w = world();
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcCompareSwap, v.epsn);
    h.atomic = Some(AtomicEth {
        va: v.mr.addr() + 4,
        rkey: v.mr.rkey(),
        swap_add: 1,
        compare: 0x3c3c_3c3c_3c3c_3c3c,
    });
    attack(
        &w,
        &v,
        &h,
        &[],
        INVALID,
        "send_err",
        QpState::Err,
        "misaligned atomic",
    );
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcReadRequest, v.epsn);
    h.reth = reth(v.mr.addr(), v.mr.rkey(), (1u32 << 31) + 1);
    attack(
        &w,
        &v,
        &h,
        &[],
        INVALID,
        "send_err",
        QpState::Err,
        "READ above 2^31 bytes",
    );
    // A misaligned ATOMIC WRITE too.
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcAtomicWrite, v.epsn);
    h.reth = reth(v.mr.addr() + 2, v.mr.rkey(), 8);
    attack(
        &w,
        &v,
        &h,
        &[1; 8],
        INVALID,
        "send_err",
        QpState::Err,
        "misaligned ATOMIC WRITE",
    );
    // A FLUSH with an unknown placement type.
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcFlush, v.epsn);
    h.feth = Some(Feth {
        placement: 8,
        selectivity: 0,
    });
    h.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
    attack(
        &w,
        &v,
        &h,
        &[],
        INVALID,
        "send_err",
        QpState::Err,
        "FLUSH with no known placement",
    );
}

#[test]
fn a_flood_of_duplicates_executes_once() {
    let w = world();
    let v = victim(&w, RW, RW);
    // One FETCH_ADD, then 10,000 copies of it: added once, each copy answered with the
    // cached original value (the duplicate counter counts them).
    let mut h = request(&v, Opcode::RcFetchAdd, v.epsn);
    h.atomic = Some(AtomicEth {
        va: v.mr.addr() + 64,
        rkey: v.mr.rkey(),
        swap_add: 5,
        compare: 0,
    });
    let before = counters(&w);
    send(&w, &h, &[], false);
    let first = answers(&w);
    assert!(
        first.iter().any(|(op, _, _)| *op == Opcode::RcAtomicAck),
        "{first:?}"
    );
    for _ in 0..10_000 {
        send(&w, &h, &[], false);
    }
    let _ = answers(&w);
    let after = counters(&w);
    assert!(
        after["duplicate_request"] >= before.get("duplicate_request").copied().unwrap_or(0) + 9_000
    );
    assert_eq!(
        v.buf.load_u64(64).unwrap(),
        0x3c3c_3c3c_3c3c_3c3c_u64.wrapping_add(5),
        "added exactly once"
    );
    // A flood of WRITE duplicates changes nothing after the first.
    let (mut h, p) = write(&v, v.mr.addr() + 256, v.mr.rkey(), 64);
    h.bth.psn = Psn::new(v.epsn + 1);
    send(&w, &h, &p, false);
    let _ = answers(&w);
    v.buf.fill(256, 64, 0x11).unwrap();
    for _ in 0..10_000 {
        send(&w, &h, &p, false);
    }
    let _ = answers(&w);
    assert_eq!(
        v.buf.to_vec(256, 64).unwrap(),
        vec![0x11; 64],
        "duplicates were re-executed"
    );
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    others_unaffected(&w);
}
