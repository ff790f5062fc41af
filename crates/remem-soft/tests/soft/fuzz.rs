//! A stable-toolchain fuzz harness (no nightly here for cargo-fuzz): seeded random packet
//! sequences, raw bytes and mutations of valid packets go through the packet parser and
//! into an RC responder, with invariants checked after every packet:
//!
//! - nothing panics;
//! - memory outside what was granted never changes: the target buffer has guard bytes
//!   around the registered range, and a second region is registered read-only;
//! - a third region's key is revoked (deregistered) at a random moment of some sequences:
//!   from then on that memory never changes, and no response gathers from it;
//! - every packet the responder sends builds, parses back, and is a response;
//! - the QP is in RTS or ERR, and an affiliated asynchronous event is raised at most once,
//!   only with the QP in ERR.
//!
//! `REMEM_FUZZ_ITERS` sets the number of packet sequences (default 3000 in `cargo test`;
//! CI runs more; longer runs and their counts are in BENCHMARKS.md); `REMEM_FUZZ_SEED`
//! the first seed. Each sequence is 1–64 packets; the run prints how many packets it
//! executed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_soft::mem::grant::KeyedRegion;
use remem_soft::transport::fake::FakeEnv;
use remem_soft::transport::wqe::RecvWqe;
use remem_soft::transport::{Kind, Pos, RcConfig, RcTransport, RxPacket, glue};
use remem_verbs::{AccessFlags, MemRegion, MemoryBuffer, QpState};
use remem_wire::{AtomicEth, Feth, Packet, Psn, Reth};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GUARD: usize = 256;
const LEN: usize = 8192;
const WRITABLE_KEY: u32 = 0x1234_5601;
const READONLY_KEY: u32 = 0x1234_5702;
const REVOCABLE_KEY: u32 = 0x1234_5803;

struct Target {
    /// guard | writable region | guard
    buf: Arc<MemoryBuffer>,
    writable: Arc<KeyedRegion>,
    /// A region the peer may only read.
    readonly_buf: Arc<MemoryBuffer>,
    readonly: Arc<KeyedRegion>,
    /// A writable region whose key each sequence registers anew and may revoke.
    revocable_buf: Arc<MemoryBuffer>,
    recv_buf: Arc<MemoryBuffer>,
}

impl Target {
    fn new() -> Self {
        let buf = Arc::new(MemoryBuffer::zeroed(GUARD + LEN + GUARD).unwrap());
        buf.fill(0, GUARD + LEN + GUARD, 0xa5).unwrap();
        let writable = KeyedRegion::new(MemRegion::new(buf.clone(), GUARD..GUARD + LEN).unwrap());
        let readonly_buf = Arc::new(MemoryBuffer::zeroed(LEN).unwrap());
        readonly_buf.fill(0, LEN, 0x5a).unwrap();
        let readonly = KeyedRegion::new(MemRegion::whole(readonly_buf.clone()));
        Target {
            buf,
            writable,
            readonly_buf,
            readonly,
            revocable_buf: Arc::new(MemoryBuffer::zeroed(LEN).unwrap()),
            recv_buf: Arc::new(MemoryBuffer::zeroed(4 * 4096).unwrap()),
        }
    }
}

const WRITABLE: AccessFlags = AccessFlags::REMOTE.difference(AccessFlags::FLUSH_PERSISTENT);

/// A sequence's environment: the writable, read-only and (a fresh registration of the)
/// revocable regions under their keys, and `recvs` receives posted.
fn env(t: &Target, recvs: usize) -> FakeEnv {
    let mut env = FakeEnv::with_key(WRITABLE_KEY, t.writable.clone(), WRITABLE);
    env.register(READONLY_KEY, t.readonly.clone(), AccessFlags::REMOTE_READ);
    env.register(
        REVOCABLE_KEY,
        KeyedRegion::new(MemRegion::whole(t.revocable_buf.clone())),
        WRITABLE,
    );
    for _ in 0..recvs {
        post_recv(t, &mut env);
    }
    env
}

/// Posts a receive of one of four 4 KiB slots of `t.recv_buf`. Receives come and go (a
/// sequence posts a few now and then, and sometimes none is posted: RNR); the last posted
/// is taken first.
fn post_recv(t: &Target, env: &mut FakeEnv) {
    let i = env.rq.len() % 4;
    env.rq.push_front(RecvWqe {
        wr_id: i as u64,
        sges: vec![
            MemRegion::new(t.recv_buf.clone(), i * 4096..(i + 1) * 4096)
                .unwrap()
                .into(),
        ],
        total_len: 4096,
    });
}

const KINDS: [Kind; 13] = [
    Kind::Send,
    Kind::SendImm,
    Kind::SendInv,
    Kind::Write,
    Kind::WriteImm,
    Kind::ReadRequest,
    Kind::ReadResponse,
    Kind::Ack,
    Kind::AtomicAck,
    Kind::CompareSwap,
    Kind::FetchAdd,
    Kind::AtomicWrite,
    Kind::Flush,
];
const POSITIONS: [Pos; 4] = [Pos::First, Pos::Middle, Pos::Last, Pos::Only];

/// An address near the registered ranges (mostly that of `rkey`), or anywhere.
fn address(rng: &mut StdRng, t: &Target, rkey: u32) -> u64 {
    let pick = match rkey {
        _ if rng.random_bool(0.3) => rng.random_range(0..3),
        WRITABLE_KEY => 0,
        REVOCABLE_KEY => 1,
        _ => 2,
    };
    let base = match pick {
        0 => t.writable.region().addr(),
        1 => t.revocable_buf.addr(),
        _ => t.readonly.region().addr(),
    };
    match rng.random_range(0..6) {
        0 => rng.random(),
        1 => u64::MAX - rng.random_range(0..64),
        2 => base.wrapping_sub(rng.random_range(0..512)),
        3 => base + LEN as u64 - rng.random_range(0..64),
        _ => base + rng.random_range(0..LEN as u64),
    }
}

fn rkey(rng: &mut StdRng) -> u32 {
    match rng.random_range(0..6) {
        0 => rng.random(),
        1 => READONLY_KEY,
        2 => REVOCABLE_KEY,
        _ => WRITABLE_KEY,
    }
}

fn length(rng: &mut StdRng) -> u32 {
    match rng.random_range(0..6) {
        0 => rng.random(),
        1 => 0,
        2 => 8,
        3 => (1 << 31) + rng.random_range(0..2),
        _ => rng.random_range(0..3 * LEN as u32),
    }
}

/// Checks what the responder sends (at most `budget` packets) and the invariants on memory
/// and state; `revoked`: the revocable region's contents when its key was revoked.
fn check(
    qp: &mut RcTransport,
    t: &Target,
    env: &mut FakeEnv,
    revoked: Option<&[u8]>,
    now: Instant,
    counts: &mut Counts,
    budget: usize,
) {
    let mut sent = 0;
    while sent < budget
        && let Some(bytes) = qp.poll_transmit(now, env, |hdr, fill| {
            let mut payload = vec![0u8; hdr.payload_len as usize];
            fill(&mut payload).expect("a response's payload is in bounds");
            assert!(
                !hdr.kind.is_request(),
                "the responder sent a request: {hdr:?}"
            );
            let h = glue::headers(hdr);
            let mut out = vec![0u8; h.packet_len(payload.len())];
            let n = h.build(&payload, &mut out).expect("a response builds");
            out.truncate(n);
            out
        })
    {
        let p = Packet::parse(&bytes).expect("a response parses back");
        assert!(glue::rx(&p).is_some());
        sent += 1;
        counts.responses += 1;
    }
    let guard_ok = |b: &[u8]| b.iter().all(|&x| x == 0xa5);
    assert!(
        guard_ok(&t.buf.to_vec(0, GUARD).unwrap()),
        "guard before the region changed"
    );
    assert!(
        guard_ok(&t.buf.to_vec(GUARD + LEN, GUARD).unwrap()),
        "guard after the region changed"
    );
    assert!(
        t.readonly_buf
            .to_vec(0, LEN)
            .unwrap()
            .iter()
            .all(|&x| x == 0x5a),
        "a read-only region changed"
    );
    if let Some(at_revocation) = revoked {
        assert!(
            t.revocable_buf.to_vec(0, LEN).unwrap() == at_revocation,
            "a revoked region changed"
        );
    }
    assert!(
        matches!(qp.state(), QpState::Rts | QpState::Err),
        "{:?}",
        qp.state()
    );
    assert!(env.events.len() <= 1, "events {:?}", env.events);
    assert!(
        env.events.is_empty() || qp.state() == QpState::Err,
        "an event without the QP in ERR"
    );
}

/// Counts of one run.
#[derive(Default)]
struct Counts {
    packets: u64,
    responses: u64,
    /// Revocations that found a grant of the key held by the transport (a WRITE in
    /// progress, a READ's resource or queued response).
    revoked_in_use: u64,
}

fn one_sequence(seed: u64, t: &Target, counts: &mut Counts) {
    let mut rng = StdRng::seed_from_u64(seed);
    let cfg = RcConfig {
        qpn: 0x11,
        dest_qpn: 0x22,
        mtu: [256, 1024, 4096][rng.random_range(0..3)],
        rq_psn: Psn::new(rng.random_range(0..1 << 24)),
        sq_psn: Psn::new(0),
        max_dest_rd_atomic: rng.random_range(0..5),
        access: if rng.random_bool(0.8) {
            AccessFlags::REMOTE
        } else {
            AccessFlags::from_bits_truncate(rng.random())
        },
        window: 64,
        ..RcConfig::default()
    };
    let mut env = env(t, rng.random_range(0..6));
    let mut revoked: Option<Vec<u8>> = None;
    let mut qp = RcTransport::new(cfg);
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        qp.set_state(cfg, state, &mut env);
    }
    let mut now = Instant::now();
    let mut epsn = cfg.rq_psn;
    for _ in 0..rng.random_range(1..=64) {
        counts.packets += 1;
        if rng.random_bool(0.25) {
            // A well-formed READ or WRITE at the expected PSN, mostly through the revocable
            // key, which may be revoked between the WRITE's packets.
            let key = if rng.random_bool(0.7) {
                REVOCABLE_KEY
            } else {
                WRITABLE_KEY
            };
            let base = match key {
                REVOCABLE_KEY => t.revocable_buf.addr(),
                _ => t.writable.region().addr(),
            };
            let mtu = cfg.mtu as usize;
            let npkts = rng.random_range(1..=(LEN / mtu).min(4));
            let len = (npkts - 1) * mtu + rng.random_range(1..=mtu);
            let va = base + rng.random_range(0..=(LEN - len)) as u64;
            let reth = Some(Reth {
                va,
                rkey: key,
                dma_len: len as u32,
            });
            if rng.random_bool(0.5) {
                let mut rx = RxPacket::new(Kind::ReadRequest, Pos::Only, epsn);
                rx.reth = reth;
                qp.handle_packet(now, &rx, &mut env);
                epsn = epsn.add(npkts as u32);
            } else {
                let payload: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                for (i, chunk) in payload.chunks(mtu).enumerate() {
                    let mut rx = RxPacket::new(Kind::Write, Pos::of(i as u32, npkts as u32), epsn);
                    rx.reth = reth.filter(|_| i == 0);
                    rx.ack_req = i + 1 == npkts;
                    rx.payload = chunk;
                    qp.handle_packet(now, &rx, &mut env);
                    epsn = epsn.next();
                    if rng.random_bool(0.2) {
                        maybe_revoke(&mut env, &mut revoked, counts);
                    }
                    check(&mut qp, t, &mut env, revoked.as_deref(), now, counts, 0);
                }
            }
        } else if rng.random_bool(0.1) {
            // Raw bytes, or a valid-looking packet with bytes flipped, through the parser.
            let mut bytes: Vec<u8> = (0..rng.random_range(0..200))
                .map(|_| rng.random())
                .collect();
            if !bytes.is_empty() && rng.random_bool(0.5) {
                bytes[0] =
                    [0x00, 0x04, 0x0a, 0x0c, 0x10, 0x11, 0x12, 0x1c, 0x1d][rng.random_range(0..9)];
            }
            if let Ok(p) = Packet::parse(&bytes)
                && let Some(rx) = glue::rx(&p)
            {
                qp.handle_packet(now, &rx, &mut env);
            }
        } else {
            let kind = KINDS[rng.random_range(0..KINDS.len())];
            let pos = POSITIONS[rng.random_range(0..4)];
            let psn = match rng.random_range(0..8) {
                0 => Psn::new(rng.random_range(0..1 << 24)),
                1 => epsn.sub(rng.random_range(1..8)),
                2 => epsn.add(rng.random_range(1..8)),
                _ => epsn,
            };
            let mut rx = RxPacket::new(kind, pos, psn);
            rx.ack_req = rng.random_bool(0.5);
            if rng.random_bool(0.8) {
                let rkey = rkey(&mut rng);
                rx.reth = Some(Reth {
                    va: address(&mut rng, t, rkey),
                    rkey,
                    dma_len: length(&mut rng),
                });
            }
            if rng.random_bool(0.5) {
                let rkey = rkey(&mut rng);
                let va = address(&mut rng, t, rkey);
                rx.atomic = Some(AtomicEth {
                    va: if rng.random_bool(0.8) { va & !7 } else { va },
                    rkey,
                    swap_add: rng.random(),
                    compare: rng.random(),
                });
            }
            if rng.random_bool(0.5) {
                rx.feth = Some(Feth {
                    placement: rng.random_range(0..4),
                    selectivity: rng.random_range(0..3),
                });
            }
            if rng.random_bool(0.3) {
                rx.imm = Some(rng.random());
            }
            let plen = match rng.random_range(0..5) {
                0 => 0,
                1 => 8,
                2 => cfg.mtu as usize,
                3 => cfg.mtu as usize + rng.random_range(1..16),
                _ => rng.random_range(0..cfg.mtu as usize),
            };
            let payload: Vec<u8> = (0..plen).map(|_| rng.random()).collect();
            rx.payload = &payload;
            qp.handle_packet(now, &rx, &mut env);
            if psn == epsn && rng.random_bool(0.7) {
                epsn = epsn.next();
            }
        }
        if rng.random_bool(0.05) {
            now += Duration::from_millis(rng.random_range(1..200));
            qp.handle_timeout(now, &mut env);
        }
        if rng.random_bool(0.1) {
            post_recv(t, &mut env);
        }
        if rng.random_bool(0.05) {
            maybe_revoke(&mut env, &mut revoked, counts);
        }
        // Responses leave a few at a time, so that some are still queued when the key is
        // revoked.
        let budget = rng.random_range(0..8);
        check(
            &mut qp,
            t,
            &mut env,
            revoked.as_deref(),
            now,
            counts,
            budget,
        );
    }
    check(
        &mut qp,
        t,
        &mut env,
        revoked.as_deref(),
        now,
        counts,
        usize::MAX,
    );
}

/// Revokes the revocable key (once per sequence), remembering its memory at that moment.
fn maybe_revoke(env: &mut FakeEnv, revoked: &mut Option<Vec<u8>>, counts: &mut Counts) {
    if revoked.is_some() {
        return;
    }
    let revocable = &env.keys[&REVOCABLE_KEY].0;
    if Arc::strong_count(revocable) > 1 {
        counts.revoked_in_use += 1;
    }
    revocable.revoke();
    *revoked = Some(revocable.region().buffer().to_vec(0, LEN).unwrap());
}

#[test]
fn responder_fuzz() {
    let iters: u64 = std::env::var("REMEM_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let first: u64 = std::env::var("REMEM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let t = Target::new();
    let mut counts = Counts::default();
    for seed in first..first + iters {
        let run = std::panic::AssertUnwindSafe(|| one_sequence(seed, &t, &mut counts));
        if let Err(e) = std::panic::catch_unwind(run) {
            eprintln!(
                "fuzz: sequence {seed} failed; rerun with REMEM_FUZZ_SEED={seed} REMEM_FUZZ_ITERS=1"
            );
            std::panic::resume_unwind(e);
        }
    }
    let Counts {
        packets,
        responses,
        revoked_in_use,
    } = counts;
    assert!(
        responses > 0,
        "the responder never answered: the harness is not reaching it"
    );
    assert!(
        iters < 1000 || revoked_in_use > 0,
        "no key was revoked while the responder held it: the harness is not reaching it"
    );
    println!(
        "fuzz: {iters} sequences from seed {first}: {packets} packets executed, {responses} responses checked, {revoked_in_use} keys revoked while in use"
    );
}
