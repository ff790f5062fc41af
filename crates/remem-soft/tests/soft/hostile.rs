//! Hostile peers: a raw RoCEv2 sender built on `remem-wire` — a plain UDP socket on
//! 127.0.21.2 — aims crafted packets at a soft device on 127.0.21.1 whose queue pairs are
//! connected to it; a third party on 127.0.21.3 (not the QPs' peer) tries the same. For
//! each attack: the target memory is unchanged (compared whole), the answer is the NAK the
//! IBTA specification prescribes or silence, a device counter counts it, the victim QP
//! ends in the state the specification says (ERR after an access error or an invalid
//! request NAK, as rxe does) and the victim's application gets the affiliated asynchronous
//! event of it, and another QP on the same device keeps working (a legitimate WRITE
//! through it lands).

use crate::common;

use common::{Answer, build, device_and_peer, filled, recv_burst, reth, seal, send_to};
use remem_conformance::{Endpoint, QpOptions, endpoint};
use remem_soft::SoftOptions;
use remem_verbs::{
    AccessFlags, AsyncEvent, AsyncEventElement, AsyncEventType, Context, MemRegion, MemoryBuffer,
    MemoryRegion, Mtu, QpState, QpType, SendOp, SendWr, WcStatus,
};
use remem_wire::{Aeth, AtomicEth, Bth, Deth, Feth, Headers, Opcode, Packet, Psn, Syndrome};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

const VICTIM_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 2);
/// A third party: not the peer of any victim QP.
const THIRD_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 3);
/// The raw peer's QPN as the victim QPs know it.
const PEER_QPN: u32 = 0xabcd;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The victim device, the raw peer's socket and a third party's (one per test binary:
/// tests take turns).
struct World {
    ctx: Arc<dyn Context>,
    sock: UdpSocket,
    third: UdpSocket,
    port: u16,
}

fn world() -> std::sync::MutexGuard<'static, World> {
    static W: OnceLock<Mutex<World>> = OnceLock::new();
    W.get_or_init(|| {
        let (ctx, sock, port) = device_and_peer(VICTIM_IP, PEER_IP, &SoftOptions::from_env());
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let third = UdpSocket::bind(SocketAddr::new(THIRD_IP.into(), port)).unwrap();
        Mutex::new(World {
            ctx,
            sock,
            third,
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
    let epsn = 1000;
    let (ep, buf, mr) =
        common::connected_rc(&w.ctx, &o, (PEER_QPN, PEER_IP), 5000, epsn, mr_access);
    Victim { ep, buf, mr, epsn }
}

fn counters(w: &World) -> HashMap<String, u64> {
    common::counters(&*w.ctx)
}

/// Builds a packet with a right ICRC (unless `bad_icrc`) and sends it to the victim.
fn send(w: &World, h: &Headers, payload: &[u8], bad_icrc: bool) {
    send_raw(
        &w.sock,
        PEER_IP,
        VICTIM_IP,
        w.port,
        build(h, payload),
        bad_icrc,
    );
}

/// Builds `h`/`payload` and sends it from the third party (a right ICRC for its address).
fn send_from_third(w: &World, h: &Headers, payload: &[u8]) {
    send_raw(
        &w.third,
        THIRD_IP,
        VICTIM_IP,
        w.port,
        build(h, payload),
        false,
    );
}

/// Sends a packet from `sock` (bound to `src`) to `dst`, ICRC filled for those addresses
/// (and spoilt if `bad_icrc`).
fn send_raw(
    sock: &UdpSocket,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    port: u16,
    buf: Vec<u8>,
    bad_icrc: bool,
) {
    let mut buf = seal(buf, src, dst, port);
    if bad_icrc && buf.len() >= 16 {
        let n = buf.len();
        buf[n - 1] ^= 0x55;
    }
    send_to(sock, dst, port, &buf);
}

/// Everything the victim sends until 50 ms pass without a packet (2 s for the first).
fn burst(w: &World) -> Vec<Answer> {
    recv_burst(&w.sock, Duration::from_secs(2), Duration::from_millis(50))
}

/// The answers the victim sends: whatever arrives within 2 s of the first wait, then until
/// 50 ms pass without another (opcode, psn, syndrome).
fn answers(w: &World) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    burst(w)
        .into_iter()
        .map(|a| (a.op, a.psn, a.syndrome))
        .collect()
}

/// Silence: nothing comes back within 2 s.
fn silence(w: &World) -> bool {
    answers(w).is_empty()
}

/// The affiliated asynchronous events pending on the device (taking them).
fn events(w: &World) -> Vec<AsyncEvent> {
    common::events(&*w.ctx)
}

fn qp_event(v: &Victim, event_type: AsyncEventType) -> AsyncEvent {
    common::qp_event(v.ep.qp.qp_num(), event_type)
}

fn request(v: &Victim, op: Opcode, psn: u32) -> Headers {
    common::request(v.ep.qp.qp_num(), op, psn)
}

/// A WRITE of `len` bytes at `va` with `rkey`.
fn write(v: &Victim, va: u64, rkey: u32, len: usize) -> (Headers, Vec<u8>) {
    let mut h = request(v, Opcode::RcWriteOnly, v.epsn);
    h.reth = reth(va, rkey, len as u32);
    (h, vec![0xee; len])
}

fn unchanged(v: &Victim) -> bool {
    filled(&v.buf, 0, 4096, 0x3c)
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

/// An atomic request of `op` to `v`'s region at `va` (its rkey) at the expected PSN.
fn atomic(v: &Victim, op: Opcode, va: u64, swap_add: u64, compare: u64) -> Headers {
    let mut h = request(v, op, v.epsn);
    h.atomic = Some(AtomicEth {
        va,
        rkey: v.mr.rkey(),
        swap_add,
        compare,
    });
    h
}

/// Sends `h`/`payload` to `v` and checks what it must cause (`outcome`: the NAK or silence,
/// the counter that grows, the QP's state after), the memory unchanged and the other QPs
/// unaffected.
fn attack(w: &World, v: &Victim, h: &Headers, payload: &[u8], outcome: Outcome, what: &str) {
    let (want, counter, state) = match outcome {
        Outcome::Fatal(syn) => (Some(syn), "send_err", QpState::Err),
        Outcome::Dropped(counter) => (None, counter, QpState::Rts),
    };
    let _ = events(w);
    let before = counters(w);
    send(w, h, payload, false);
    let a = answers(w);
    // The victim's application learns of the NAK its QP sent (IBTA C9-222.1.1, rxe): the
    // event is raised as the QP goes to ERR, before the NAK leaves.
    let mine: Vec<_> = events(w)
        .into_iter()
        .filter(|e| e.element == AsyncEventElement::Qp(v.ep.qp.qp_num()))
        .collect();
    let event = match want {
        Some(Syndrome::NakRemoteAccessError) => vec![qp_event(v, AsyncEventType::QpAccessErr)],
        Some(Syndrome::NakInvalidRequest) => vec![qp_event(v, AsyncEventType::QpReqErr)],
        _ => vec![],
    };
    assert_eq!(mine, event, "{what}: affiliated asynchronous events");
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

/// What an attack must cause ([`attack`]).
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// This NAK, which ends the victim QP (ERR, an affiliated event, `send_err` counted).
    Fatal(Syndrome),
    /// Silence: the packet dropped and counted under this counter, the QP still in RTS.
    Dropped(&'static str),
}

/// A remote access error NAK ends the QP.
const ACCESS: Outcome = Outcome::Fatal(Syndrome::NakRemoteAccessError);
/// An invalid request NAK ends the QP.
const INVALID: Outcome = Outcome::Fatal(Syndrome::NakInvalidRequest);

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
    attack(&w, &v, &h, &p, ACCESS, "forged rkey");
    // Stale: the key of a deregistered region.
    let v = victim(&w, RW, RW);
    let old = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
    let stale = v.ep.pd.reg_mr(MemRegion::whole(old.clone()), RW).unwrap();
    let (va, key) = (stale.addr(), stale.rkey());
    drop(stale);
    let (h, p) = write(&v, va, key, 64);
    attack(&w, &v, &h, &p, ACCESS, "stale rkey");
    assert!(filled(&old, 0, 4096, 0));
    // Another PD's key.
    let v = victim(&w, RW, RW);
    let other = victim(&w, RW, RW); // its own PD
    let (h, p) = write(&v, other.mr.addr(), other.mr.rkey(), 64);
    attack(&w, &v, &h, &p, ACCESS, "another PD's rkey");
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
        attack(&w, &v, &h, &p, ACCESS, what);
    }
    // A READ whose range wraps past 2^64.
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcReadRequest, v.epsn);
    h.reth = reth(u64::MAX - 100, v.mr.rkey(), 4096);
    attack(&w, &v, &h, &[], ACCESS, "wrapping READ");
}

#[test]
fn missing_rights_are_refused() {
    let w = world();
    // The region lacks REMOTE_WRITE: access error.
    let v = victim(&w, RW, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    attack(&w, &v, &h, &p, ACCESS, "MR without REMOTE_WRITE");
    // The region lacks REMOTE_ATOMIC.
    let v = victim(&w, RW, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let h = atomic(&v, Opcode::RcFetchAdd, v.mr.addr(), 1, 0);
    attack(&w, &v, &h, &[], ACCESS, "MR without REMOTE_ATOMIC");
    // The QP does not grant remote writes: invalid request.
    let v = victim(&w, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ, RW);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 32);
    attack(&w, &v, &h, &p, INVALID, "QP without REMOTE_WRITE");
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
        Outcome::Dropped("drop_unknown_qp"),
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
        attack(&w, &v, &h, &[0xee; 1024], INVALID, what);
    }
    // Payload above the MTU.
    let v = victim(&w, RW, RW);
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 2048);
    attack(&w, &v, &h, &p, INVALID, "payload above the MTU");
}

#[test]
fn misaligned_atomics_and_oversized_reads_are_invalid() {
    let w = world();
    let v = victim(&w, RW, RW);
    let h = atomic(
        &v,
        Opcode::RcCompareSwap,
        v.mr.addr() + 4,
        1,
        0x3c3c_3c3c_3c3c_3c3c,
    );
    attack(&w, &v, &h, &[], INVALID, "misaligned atomic");
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcReadRequest, v.epsn);
    h.reth = reth(v.mr.addr(), v.mr.rkey(), (1u32 << 31) + 1);
    attack(&w, &v, &h, &[], INVALID, "READ above 2^31 bytes");
    // A misaligned ATOMIC WRITE too.
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcAtomicWrite, v.epsn);
    h.reth = reth(v.mr.addr() + 2, v.mr.rkey(), 8);
    attack(&w, &v, &h, &[1; 8], INVALID, "misaligned ATOMIC WRITE");
    // A FLUSH with an unknown placement type.
    let v = victim(&w, RW, RW);
    let mut h = request(&v, Opcode::RcFlush, v.epsn);
    h.feth = Some(Feth {
        placement: 8,
        selectivity: 0,
    });
    h.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
    attack(&w, &v, &h, &[], INVALID, "FLUSH with no known placement");
}

#[test]
fn a_flood_of_duplicates_executes_once() {
    let w = world();
    let v = victim(&w, RW, RW);
    // One FETCH_ADD, then 10,000 copies of it: added once, each copy answered with the
    // cached original value (the duplicate counter counts them).
    let h = atomic(&v, Opcode::RcFetchAdd, v.mr.addr() + 64, 5, 0);
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

// ------------------------------------------------------------------ revocation

/// Everything the victim sends until 50 ms pass without a packet (2 s for the first):
/// opcode, PSN, syndrome and payload.
fn packets(w: &World) -> Vec<(Opcode, u32, Option<Syndrome>, Vec<u8>)> {
    burst(w)
        .into_iter()
        .map(|a| (a.op, a.psn, a.syndrome, a.payload))
        .collect()
}

fn is_read_response(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly
    )
}

#[test]
fn a_write_continued_after_deregistration_changes_nothing() {
    let w = world();
    let v = victim(&w, RW, RW);
    let Victim { ep, buf, mr, epsn } = v;
    let (va, rkey) = (mr.addr(), mr.rkey());
    // FIRST of a 3-packet WRITE (asking for an ACK, so that we know it was executed).
    let mut h = common::request(ep.qp.qp_num(), Opcode::RcWriteFirst, epsn);
    h.reth = reth(va, rkey, 3 * 1024);
    send(&w, &h, &[0xee; 1024], false);
    let a = answers(&w);
    assert!(
        a.iter()
            .any(|(op, psn, _)| *op == Opcode::RcAck && *psn == epsn),
        "{a:?}"
    );
    assert_eq!(buf.to_vec(0, 1024).unwrap(), vec![0xee; 1024]);
    // The application deregisters the region (and would hand the memory out again).
    drop(mr);
    let _ = events(&w);
    let before = counters(&w);
    for (op, psn) in [
        (Opcode::RcWriteMiddle, epsn + 1),
        (Opcode::RcWriteLast, epsn + 2),
    ] {
        let mut h = Headers::new(Bth::new(op, ep.qp.qp_num(), Psn::new(psn)));
        h.bth.ack_req = op == Opcode::RcWriteLast;
        send(&w, &h, &[0xdd; 1024], false);
    }
    let a = answers(&w);
    assert!(
        a.iter().any(|(op, psn, s)| *op == Opcode::RcAck
            && *psn == epsn + 1
            && *s == Some(Syndrome::NakRemoteAccessError)),
        "a remote access error NAK for the MIDDLE: {a:?}"
    );
    assert!(
        filled(&buf, 1024, 3072, 0x3c),
        "memory written after its deregistration"
    );
    assert_eq!(ep.qp.state(), QpState::Err);
    assert!(counters(&w)["send_err"] > before["send_err"]);
    assert_eq!(
        events(&w),
        [common::qp_event(
            ep.qp.qp_num(),
            AsyncEventType::QpAccessErr
        )]
    );
    others_unaffected(&w);
}

#[test]
fn a_duplicate_read_after_deregistration_returns_no_data() {
    let w = world();
    let v = victim(&w, RW, RW);
    let Victim { ep, buf, mr, epsn } = v;
    let mut h = Headers::new(Bth::new(
        Opcode::RcReadRequest,
        ep.qp.qp_num(),
        Psn::new(epsn),
    ));
    h.reth = reth(mr.addr(), mr.rkey(), 2048);
    send(&w, &h, &[], false);
    let first = packets(&w);
    assert_eq!(
        first.iter().filter(|p| is_read_response(p.0)).count(),
        2,
        "{first:?}"
    );
    // Deregistered, and the memory reused for other data; then the READ comes again.
    drop(mr);
    buf.fill(0, 4096, 0x77).unwrap();
    let _ = events(&w);
    send(&w, &h, &[], false);
    let again = packets(&w);
    assert!(
        again.iter().all(|p| !is_read_response(p.0)),
        "a replay after deregistration: {:?}",
        again.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>()
    );
    assert!(
        again.iter().any(|p| p.0 == Opcode::RcAck
            && p.1 == epsn
            && p.2 == Some(Syndrome::NakRemoteAccessError)),
        "{again:?}"
    );
    // The READ itself succeeded: a stale duplicate (one the network delivered late) must
    // not end the connection, so the QP stays up and no event is raised.
    assert_eq!(ep.qp.state(), QpState::Rts);
    assert_eq!(events(&w), []);
    // The QP goes on: the next PSN's (new) READ through a live key is answered.
    let (lbuf, live) = ep.reg(4096, RW).unwrap();
    lbuf.fill(0, 4096, 0x42).unwrap();
    let mut h = Headers::new(Bth::new(
        Opcode::RcReadRequest,
        ep.qp.qp_num(),
        Psn::new(epsn + 2),
    ));
    h.reth = reth(live.addr(), live.rkey(), 64);
    send(&w, &h, &[], false);
    let next = packets(&w);
    assert!(
        next.iter()
            .any(|p| p.0 == Opcode::RcReadResponseOnly && p.1 == epsn + 2),
        "{next:?}"
    );
    others_unaffected(&w);
}

#[test]
fn a_read_response_stops_when_its_region_is_deregistered() {
    let w = world();
    let v = victim(&w, RW, RW);
    // A READ of 256 MiB (262,144 response packets): far longer than it takes to
    // deregister the region once its first response packet is seen.
    const LEN: usize = 256 << 20;
    let big = Arc::new(MemoryBuffer::zeroed(LEN).unwrap());
    let mr = v.ep.pd.reg_mr(MemRegion::whole(big.clone()), RW).unwrap();
    let mut h = request(&v, Opcode::RcReadRequest, v.epsn);
    h.reth = reth(mr.addr(), mr.rkey(), LEN as u32);
    let before = counters(&w);
    let _ = events(&w);
    send(&w, &h, &[], false);
    let mut b = [0u8; 9000];
    let n = w.sock.recv(&mut b).unwrap();
    assert!(is_read_response(
        Packet::parse(&b[..n]).unwrap().headers.bth.opcode
    ));
    drop(mr);
    big.fill(0, 1 << 20, 0x77).unwrap(); // handed out again
    let rest = packets(&w);
    assert!(
        rest.iter().all(|p| !p.3.contains(&0x77)),
        "memory of a deregistered region was sent"
    );
    let sent = counters(&w)["sent_pkts"] - before["sent_pkts"];
    assert!(
        sent < (LEN / 1024) as u64 / 2,
        "{sent} packets: the READ went on"
    );
    assert_eq!(v.ep.qp.state(), QpState::Err);
    assert_eq!(events(&w), [qp_event(&v, AsyncEventType::QpAccessErr)]);
    others_unaffected(&w);
}

// ------------------------------------------------------------------ what a NIC checks first

#[test]
fn opcodes_of_another_transport_are_dropped_and_counted() {
    let w = world();
    let v = victim(&w, RW, RW);
    // A receive the victim could consume.
    common::post_recv(&*v.ep.qp, 1, common::sge(&*v.mr, 0, 1024));
    // A UD SEND (with its DETH) at the RC QP: not run as an RC SEND.
    let mut h = request(&v, Opcode::UdSendOnly, v.epsn);
    h.deth = Some(Deth {
        qkey: 0x1111_1111,
        src_qp: PEER_QPN,
    });
    let before = counters(&w);
    send(&w, &h, &[0xee; 64], false);
    assert!(silence(&w), "a UD SEND answered by an RC QP");
    // A UC WRITE at the RC QP: not run as an RC WRITE.
    let mut h = request(&v, Opcode::UcWriteOnly, v.epsn);
    h.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
    send(&w, &h, &[0xee; 64], false);
    assert!(silence(&w), "a UC WRITE answered by an RC QP");
    let after = counters(&w);
    assert_eq!(
        after["drop_wrong_transport"],
        before.get("drop_wrong_transport").copied().unwrap_or(0) + 2
    );
    assert!(unchanged(&v), "memory or the receive buffer changed");
    let mut wc = [remem_verbs::WorkCompletion::default(); 2];
    assert_eq!(
        v.ep.cq.poll(&mut wc).unwrap(),
        0,
        "the receive was consumed"
    );
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    // An RC WRITE at a UD QP.
    let ud = endpoint(&w.ctx, &QpOptions::default(), QpType::Ud, None).unwrap();
    common::ud_to_rtr(&*ud.qp, 0x1111_1111);
    let mut h = Headers::new(Bth::new(Opcode::RcWriteOnly, ud.qp.qp_num(), Psn::new(0)));
    h.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
    send(&w, &h, &[0xee; 64], false);
    assert!(silence(&w));
    assert_eq!(
        counters(&w)["drop_wrong_transport"],
        after["drop_wrong_transport"] + 1
    );
    others_unaffected(&w);
}

#[test]
fn requests_from_another_address_are_dropped_and_counted() {
    let w = world();
    let v = victim(&w, RW, RW);
    let before = counters(&w);
    // A valid WRITE, right QPN, PSN and rkey, from an address that is not the QP's peer.
    let (h, p) = write(&v, v.mr.addr(), v.mr.rkey(), 64);
    send_from_third(&w, &h, &p);
    // A READ too.
    let mut r = request(&v, Opcode::RcReadRequest, v.epsn);
    r.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
    send_from_third(&w, &r, &[]);
    let mut b = [0u8; 512];
    w.third
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        w.third.recv(&mut b).is_err(),
        "the third party got an answer"
    );
    assert!(silence(&w), "the peer got an answer");
    assert!(unchanged(&v));
    assert_eq!(
        counters(&w)["drop_wrong_source"],
        before.get("drop_wrong_source").copied().unwrap_or(0) + 2
    );
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    // The PSN is still expected: the same WRITE from the peer lands.
    send(&w, &h, &p, false);
    let a = answers(&w);
    assert!(
        a.iter()
            .any(|(op, psn, _)| *op == Opcode::RcAck && *psn == v.epsn),
        "{a:?}"
    );
    assert_eq!(v.buf.to_vec(0, 64).unwrap(), vec![0xee; 64]);
}

#[test]
fn forged_acks_and_naks_from_a_third_party_change_nothing() {
    let w = world();
    let v = victim(&w, RW, RW);
    // The victim's QP (requester) WRITEs to the raw peer: its PSN is bring_up's 5000.
    let sge = common::sge(&*v.mr, 0, 64);
    let op = SendOp::RdmaWrite {
        remote_addr: 0x1000,
        rkey: 0x1234,
    };
    v.ep.qp.post_send(&[SendWr::new(7, op, &[sge])]).unwrap();
    let a = answers(&w);
    assert!(
        a.iter()
            .any(|(op, psn, _)| *op == Opcode::RcWriteOnly && *psn == 5000),
        "{a:?}"
    );
    let before = counters(&w);
    // The third party NAKs it (it would fail with REM_ACCESS_ERR, the QP to ERR), then
    // ACKs it (it would complete without having arrived).
    for syndrome in [
        Syndrome::NakRemoteAccessError,
        Syndrome::Ack { credits: 31 },
    ] {
        send_from_third(&w, &common::ack(v.ep.qp.qp_num(), 5000, syndrome, 1), &[]);
    }
    // A READ response naming it too.
    let mut h = Headers::new(Bth::new(
        Opcode::RcReadResponseOnly,
        v.ep.qp.qp_num(),
        Psn::new(5000),
    ));
    h.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 1,
    });
    send_from_third(&w, &h, &[0; 64]);
    // The victim retransmits (no ACK came from its peer): proof the forgeries did nothing.
    let a = answers(&w);
    assert!(
        a.iter()
            .any(|(op, psn, _)| *op == Opcode::RcWriteOnly && *psn == 5000),
        "{a:?}"
    );
    let mut wc = [remem_verbs::WorkCompletion::default(); 2];
    assert_eq!(v.ep.cq.poll(&mut wc).unwrap(), 0, "a forged completion");
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    assert_eq!(
        counters(&w)["drop_wrong_source"],
        before.get("drop_wrong_source").copied().unwrap_or(0) + 3
    );
    // The peer's own ACK completes it.
    let h = common::ack(v.ep.qp.qp_num(), 5000, Syndrome::Ack { credits: 31 }, 1);
    send(&w, &h, &[], false);
    let wc = remem_conformance::poll_one(&*v.ep.cq, Duration::from_secs(5)).unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
}

// ------------------------------------------------------------------ replay work

#[test]
fn a_flood_of_duplicate_reads_is_bounded() {
    // An inline device (driven here): the whole flood is received in one go, then what it
    // produced is sent.
    let victim_ip = Ipv4Addr::new(127, 0, 22, 1);
    let peer_ip = Ipv4Addr::new(127, 0, 22, 2);
    let opts = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let (ctx, sock, port) = device_and_peer(victim_ip, peer_ip, &opts);
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let o = QpOptions {
        access: RW,
        mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    };
    let ep = common::connect_rc(&ctx, &o, (PEER_QPN, peer_ip), 5000, 1000);
    let (_buf, mr) = ep.reg(16 * 1024, RW).unwrap();
    let mut h = Headers::new(Bth::new(
        Opcode::RcReadRequest,
        ep.qp.qp_num(),
        Psn::new(1000),
    ));
    h.reth = reth(mr.addr(), mr.rkey(), 16 * 1024);
    let counter = |name: &str| common::counter(&*ctx, name);
    let received = |n: usize| {
        let mut b = [0u8; 2048];
        (0..n).filter(|_| sock.recv(&mut b).is_ok()).count()
    };
    // The READ: 16 response packets.
    send_raw(&sock, peer_ip, victim_ip, port, build(&h, &[]), false);
    let sent0 = counter("sent_pkts");
    while counter("sent_pkts") < sent0 + 16 {
        ctx.drive(Duration::from_millis(100)).unwrap();
    }
    assert_eq!(received(16), 16);
    // 100 copies of the 60-byte request.
    let (sent1, dups1) = (counter("sent_pkts"), counter("duplicate_request"));
    for _ in 0..100 {
        send_raw(&sock, peer_ip, victim_ip, port, build(&h, &[]), false);
    }
    let mut pumps = 0u64;
    while counter("duplicate_request") < dups1 + 100 {
        ctx.drive(Duration::from_millis(100)).unwrap();
        pumps += 1;
        assert!(pumps < 100, "the duplicates did not arrive");
    }
    ctx.drive(Duration::ZERO).unwrap();
    let sent = counter("sent_pkts") - sent1;
    // One replay per batch of duplicates received (normally one batch), not one each.
    assert!(
        sent >= 16 && sent <= 16 * pumps.min(4),
        "{sent} packets sent for 100 duplicates in {pumps} receive batches"
    );
    assert!(counter("drop_duplicate_read") >= 100 - pumps.min(4));
    assert_eq!(ep.qp.state(), QpState::Rts);
}

#[test]
fn qpns_are_not_enumerable_from_one_known() {
    // A peer knows the QPN of its own connection; the device's other QPs must not be the
    // numbers next to it.
    let w = world();
    let eps: Vec<_> = (0..64)
        .map(|_| endpoint(&w.ctx, &QpOptions::default(), QpType::Rc, None).unwrap())
        .collect();
    let qpns: Vec<u32> = eps.iter().map(|e| e.qp.qp_num()).collect();
    let near = qpns
        .windows(2)
        .filter(|p| p[1].abs_diff(p[0]) <= 64)
        .count();
    assert!(near <= 1, "QPNs in sequence: {qpns:x?}");
    assert!(qpns.iter().all(|q| (16..1 << 24).contains(q)));
}
