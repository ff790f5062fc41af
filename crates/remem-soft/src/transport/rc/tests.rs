//! Unit tests of the RC transport: the responder's refusals and bounds, the requester's window.

use super::*;
use crate::mem::grant::KeyedRegion;
use crate::transport::fake::{FakeEnv as TestEnv, RKEY};
use remem_verbs::MemRegion;
use remem_verbs::{AsyncEvent, AsyncEventElement, AsyncEventType};
use std::sync::Arc;

const MTU: u32 = 256;
const EPSN: Psn = Psn::new(0x00ff_fffe); // the READs below wrap the 24-bit PSN space

/// A transport configured with `cfg`, taken through INIT and RTR to RTS.
fn transport(env: &mut TestEnv, cfg: RcConfig) -> RcTransport {
    let mut t = RcTransport::new(cfg);
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        t.set_state(cfg, s, env);
    }
    t
}

/// A responder expecting `EPSN`, granting remote access, with `max_dest_rd_atomic`
/// responder resources.
fn responder(env: &mut TestEnv, max_dest_rd_atomic: u8) -> RcTransport {
    let cfg = RcConfig {
        qpn: 0x42,
        dest_qpn: 0x24,
        mtu: MTU,
        rq_psn: EPSN,
        max_dest_rd_atomic,
        access: AccessFlags::REMOTE,
        ..RcConfig::default()
    };
    transport(env, cfg)
}

/// A fresh [`TestEnv`], a [`responder`] on it and the address of its region.
fn setup(max_dest_rd_atomic: u8) -> (TestEnv, RcTransport, u64) {
    let mut env = TestEnv::new();
    let t = responder(&mut env, max_dest_rd_atomic);
    let va = env.key.region().addr();
    (env, t, va)
}

/// What the transport sends: (kind, pos, psn, syndrome, payload).
type Sent = (Kind, Pos, Psn, Option<Syndrome>, Vec<u8>);

/// Takes up to `max` packets out of the transport.
fn transmit(t: &mut RcTransport, env: &mut TestEnv, max: usize) -> Vec<Sent> {
    transmit_ordered(t, env, max, false)
}

fn transmit_ordered(
    t: &mut RcTransport,
    env: &mut TestEnv,
    max: usize,
    requests_first: bool,
) -> Vec<Sent> {
    let mut out = Vec::new();
    while out.len() < max {
        let Some(p) = t.poll_transmit_ordered(Instant::now(), env, requests_first, |h, fill| {
            let mut payload = vec![0u8; h.payload_len as usize];
            fill(&mut payload).expect("payload gathered");
            (h.kind, h.pos, h.psn, h.aeth.map(|a| a.0), payload)
        }) else {
            break;
        };
        out.push(p);
    }
    out
}

fn write_pkt(pos: Pos, psn: Psn, payload: &[u8], total: u32, va: u64) -> RxPacket<'_> {
    let mut p = RxPacket::new(Kind::Write, pos, psn);
    if pos.starts() {
        p.reth = Some(Reth {
            va,
            rkey: RKEY,
            dma_len: total,
        });
    }
    p.ack_req = pos.ends();
    p.payload = payload;
    p
}

fn read_pkt(psn: Psn, va: u64, len: u32) -> RxPacket<'static> {
    let mut p = RxPacket::new(Kind::ReadRequest, Pos::Only, psn);
    p.reth = Some(Reth {
        va,
        rkey: RKEY,
        dma_len: len,
    });
    p
}

fn qp_event(event_type: AsyncEventType) -> AsyncEvent {
    AsyncEvent {
        event_type,
        element: AsyncEventElement::Qp(0x42),
    }
}

fn nak(kind_psn: &Sent) -> Option<(Psn, Syndrome)> {
    match kind_psn {
        (Kind::Ack, _, psn, Some(s), _) if !matches!(s, Syndrome::Ack { .. }) => Some((*psn, *s)),
        _ => None,
    }
}

/// Checks how a refusal of a revoked key ended: the NAKs in `sent` are one remote access
/// error, for `psn`; a `fatal` one left the QP in ERR with the access error event, any
/// other (a stale duplicate's) left it in RTS with no event.
fn refused_revoked(t: &RcTransport, env: &TestEnv, sent: &[Sent], psn: Psn, fatal: bool) {
    assert_eq!(
        sent.iter().filter_map(nak).collect::<Vec<_>>(),
        [(psn, Syndrome::NakRemoteAccessError)]
    );
    if fatal {
        assert_eq!(t.state(), QpState::Err);
        assert_eq!(env.events, [qp_event(AsyncEventType::QpAccessErr)]);
    } else {
        assert_eq!(t.state(), QpState::Rts);
        assert_eq!(env.events, []);
    }
}

#[test]
fn a_write_continued_after_deregistration_is_refused() {
    let (mut env, mut t, va) = setup(4);
    let now = Instant::now();
    let first = [0xaa; MTU as usize];
    t.handle_packet(
        now,
        &write_pkt(Pos::First, EPSN, &first, 3 * MTU, va),
        &mut env,
    );
    assert_eq!(env.target.to_vec(0, 256).unwrap(), first, "FIRST lands");
    env.key.revoke(); // ibv_dereg_mr between FIRST and MIDDLE
    let middle = [0xbb; MTU as usize];
    let psn = EPSN.add(1);
    t.handle_packet(now, &write_pkt(Pos::Middle, psn, &middle, 0, 0), &mut env);
    let last = [0xcc; MTU as usize];
    t.handle_packet(
        now,
        &write_pkt(Pos::Last, psn.add(1), &last, 0, 0),
        &mut env,
    );
    assert_eq!(
        env.target.to_vec(256, 512).unwrap(),
        vec![0; 512],
        "nothing written after the deregistration"
    );
    let sent = transmit(&mut t, &mut env, 10);
    refused_revoked(&t, &env, &sent, psn, true);
}

#[test]
fn a_read_response_stops_at_deregistration() {
    let (mut env, mut t, va) = setup(4);
    env.target.fill(0, 4 * MTU as usize, 0x5a).unwrap();
    t.handle_packet(Instant::now(), &read_pkt(EPSN, va, 4 * MTU), &mut env);
    let first = transmit(&mut t, &mut env, 1);
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].0, first[0].1), (Kind::ReadResponse, Pos::First));
    assert_eq!(first[0].4, vec![0x5a; MTU as usize]);
    env.key.revoke();
    let rest = transmit(&mut t, &mut env, 10);
    assert!(
        rest.iter().all(|p| p.0 != Kind::ReadResponse),
        "no response packet after the deregistration: {rest:?}"
    );
    // A NAK in place of the next response packet, with its PSN.
    refused_revoked(&t, &env, &rest, EPSN.add(1), true);
}

#[test]
fn a_duplicate_read_after_deregistration_returns_no_data() {
    let (mut env, mut t, va) = setup(4);
    env.target.fill(0, 2 * MTU as usize, 0x5a).unwrap();
    let now = Instant::now();
    t.handle_packet(now, &read_pkt(EPSN, va, 2 * MTU), &mut env);
    assert_eq!(transmit(&mut t, &mut env, 10).len(), 2);
    // The region is deregistered and its memory reused for other data.
    env.key.revoke();
    env.target.fill(0, 2 * MTU as usize, 0x99).unwrap();
    t.handle_packet(now, &read_pkt(EPSN, va, 2 * MTU), &mut env);
    let sent = transmit(&mut t, &mut env, 10);
    assert!(
        sent.iter().all(|p| p.4.is_empty()),
        "data replayed: {sent:?}"
    );
    // The READ was answered before: a stale duplicate does not end the QP.
    refused_revoked(&t, &env, &sent, EPSN, false);
}

#[test]
fn a_replay_revoked_before_it_is_sent_stops_without_ending_the_qp() {
    let (mut env, mut t, va) = setup(4);
    let now = Instant::now();
    t.handle_packet(now, &read_pkt(EPSN, va, 3 * MTU), &mut env);
    assert_eq!(transmit(&mut t, &mut env, 10).len(), 3);
    // A duplicate of the READ's second packet queues a replay; the key goes first.
    t.handle_packet(
        now,
        &read_pkt(EPSN.add(1), va + u64::from(MTU), 2 * MTU),
        &mut env,
    );
    env.key.revoke();
    let sent = transmit(&mut t, &mut env, 10);
    assert!(
        sent.iter().all(|p| p.4.is_empty()),
        "data replayed: {sent:?}"
    );
    refused_revoked(&t, &env, &sent, EPSN.add(1), false);
}

#[test]
fn a_replay_whose_memory_is_gone_is_refused_without_faulting() {
    // The region is a file mapping: truncating the file takes its pages away while the
    // key stands, as a program unmapping a buffer it registered does (UCX frees a buffer
    // its peer has READ before its registration cache deregisters it). Reading such
    // memory with a load ends the process (SIGBUS here, SIGSEGV for an unmapped buffer).
    let path = std::env::temp_dir().join(format!("remem-replay-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap(); // the open file is all the test needs
    let buf = Arc::new(remem_verbs::MemoryBuffer::map_file(&file, 0, 4 * MTU as usize).unwrap());
    let key = KeyedRegion::new(MemRegion::whole(buf));
    let mut env = TestEnv::with_key(RKEY, key.clone(), AccessFlags::REMOTE);
    let mut t = responder(&mut env, 4);
    let va = key.region().addr();
    env.target.fill(0, 3 * MTU as usize, 0x5a).unwrap();
    let now = Instant::now();
    t.handle_packet(now, &read_pkt(EPSN, va, 3 * MTU), &mut env);
    assert_eq!(transmit(&mut t, &mut env, 10).len(), 3);
    // A duplicate while the memory is there: the replay carries its bytes.
    t.handle_packet(now, &read_pkt(EPSN, va, 3 * MTU), &mut env);
    let replay = transmit(&mut t, &mut env, 10);
    assert_eq!(replay.len(), 3);
    assert!(
        replay
            .iter()
            .all(|p| p.0 == Kind::ReadResponse && p.4 == [0x5a; MTU as usize])
    );
    // The memory goes, the key stays; another duplicate arrives.
    file.set_len(0).unwrap();
    t.handle_packet(
        now,
        &read_pkt(EPSN.add(1), va + u64::from(MTU), 2 * MTU),
        &mut env,
    );
    let sent = transmit(&mut t, &mut env, 10);
    assert!(
        sent.iter().all(|p| p.4.is_empty()),
        "data replayed: {sent:?}"
    );
    refused_revoked(&t, &env, &sent, EPSN.add(1), false);
    assert!(!key.is_revoked());
}

#[test]
fn a_flood_of_duplicate_reads_is_bounded() {
    let (mut env, mut t, va) = setup(2);
    let now = Instant::now();
    const PKTS: u32 = 64;
    t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
    // Duplicates while the response is queued: covered by it, dropped.
    for _ in 0..1000 {
        t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
    }
    assert_eq!(env.stat("drop_duplicate_read"), 1000);
    assert_eq!(transmit(&mut t, &mut env, 100_000).len(), PKTS as usize);
    // Part of a replay out, then duplicates from the start: it starts again, once.
    t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
    assert_eq!(transmit(&mut t, &mut env, 10).len(), 10);
    for _ in 0..1000 {
        t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
    }
    let replay = transmit(&mut t, &mut env, 100_000);
    assert_eq!(replay.len(), PKTS as usize);
    assert_eq!((replay[0].1, replay[0].2), (Pos::First, EPSN));
    assert_eq!(env.stat("drop_duplicate_read"), 1000 + 999);
    // A duplicate from the middle (the requester's re-request) while a replay of the
    // READ is still queued from an earlier PSN: covered by it.
    let mid = EPSN.add(40);
    t.handle_packet(now, &read_pkt(EPSN, va, PKTS * MTU), &mut env);
    t.handle_packet(now, &read_pkt(mid, va + 40 * 256, 24 * MTU), &mut env);
    assert_eq!(transmit(&mut t, &mut env, 100_000).len(), PKTS as usize);
    assert_eq!(t.state(), QpState::Rts);
    assert!(env.events.is_empty());
}

#[test]
fn what_a_peer_makes_the_responder_queue_is_bounded() {
    let (mut env, mut t, va) = setup(4); // at most 2 × 4 + 16 = 24 responses queued
    let now = Instant::now();
    // SENDs with no receive posted, nothing sent in between: one RNR NAK, not one each.
    let send = RxPacket::new(Kind::Send, Pos::Only, EPSN);
    for _ in 0..1000 {
        t.handle_packet(now, &send, &mut env);
    }
    assert_eq!(env.stat("send_rnr_err"), 1000);
    let sent = transmit(&mut t, &mut env, 100_000);
    assert_eq!(sent.len(), 1, "{sent:?}");
    // New FETCH_ADDs at consecutive PSNs, nothing sent in between: executed while the
    // queue has room; the rest dropped unexecuted, as if lost.
    let fa = |psn| {
        let mut p = RxPacket::new(Kind::FetchAdd, Pos::Only, psn);
        p.atomic = Some(AtomicEth {
            va,
            rkey: RKEY,
            swap_add: 1,
            compare: 0,
        });
        p
    };
    let mut psn = EPSN;
    for _ in 0..1000 {
        t.handle_packet(now, &fa(psn), &mut env);
        psn = psn.add(1);
    }
    assert_eq!(env.target.load_u64(0).unwrap(), 24, "executed");
    // (The first one dropped keeps its PSN expected: those after it are out of
    // sequence, and with the queue full not even a sequence NAK is queued.)
    assert_eq!(env.stat("drop_resp_queue_full"), 1);
    assert_eq!(env.stat("out_of_seq_request"), 1000 - 25);
    assert_eq!(transmit(&mut t, &mut env, 100_000).len(), 24);
    // The requester's retransmission of the first one dropped is executed now.
    let next = EPSN.add(24);
    t.handle_packet(now, &fa(next), &mut env);
    assert_eq!(env.target.load_u64(0).unwrap(), 25);
    // Duplicates of it: answered from its resource, at most a queue's worth at a time.
    for _ in 0..1000 {
        t.handle_packet(now, &fa(next), &mut env);
    }
    assert_eq!(transmit(&mut t, &mut env, 100_000).len(), 24);
    assert_eq!(
        env.target.load_u64(0).unwrap(),
        25,
        "a duplicate was executed"
    );
    assert_eq!(t.state(), QpState::Rts);
    assert!(env.events.is_empty());
}

/// A ping-pong's turn: the peer's WRITE has arrived (its ACK is owed) and this side has
/// posted its 8-byte SEND answer; returns the QP, its environment and the WRITE's target.
fn owed_ack_and_answer() -> (TestEnv, RcTransport, u64) {
    let (mut env, mut t, va) = setup(4);
    t.handle_packet(
        Instant::now(),
        &write_pkt(Pos::Only, EPSN, &[1; 8], 8, va),
        &mut env,
    );
    t.post_send(
        SendWqe {
            wr_id: 1,
            op: SendOp::Send,
            data: crate::transport::wqe::SendData::Sges(vec![
                MemRegion::new(env.target.clone(), 0..8).unwrap().into(),
            ]),
            len: 8,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        },
        &mut env,
    );
    (env, t, va)
}

#[test]
fn an_owed_ack_leaves_before_this_sides_next_request() {
    // A ping-pong: the peer's WRITE arrives and this side posts its answer at once. The
    // ACK of the peer's WRITE goes first, as a NIC that acknowledges in hardware sends
    // it: a peer waiting in an event loop sees its own WRITE complete before this
    // side's answer arrives (perftest's `ib_send_lat -e` relies on it).
    let (mut env, mut t, _) = owed_ack_and_answer();
    let sent = transmit(&mut t, &mut env, 10);
    let kinds: Vec<Kind> = sent.iter().map(|p| p.0).collect();
    assert_eq!(kinds, [Kind::Ack, Kind::Send], "{sent:?}");
}

#[test]
fn with_requests_first_the_answer_leads_and_the_owed_ack_follows() {
    // A device that defers its responses (`SoftOptions::defer_responses`): the answer and
    // the ACK leave in one GSO batch, whose longer packet must come first.
    let (mut env, mut t, va) = owed_ack_and_answer();
    let now = Instant::now();
    let sent = transmit_ordered(&mut t, &mut env, 10, true);
    let kinds: Vec<Kind> = sent.iter().map(|p| p.0).collect();
    assert_eq!(kinds, [Kind::Send, Kind::Ack], "{sent:?}");
    // Nothing to send of its own: what it owes still leaves.
    t.handle_packet(
        now,
        &write_pkt(Pos::Only, EPSN.next(), &[2; 8], 8, va),
        &mut env,
    );
    let sent = transmit_ordered(&mut t, &mut env, 10, true);
    assert_eq!(sent.iter().map(|p| p.0).collect::<Vec<_>>(), [Kind::Ack]);
}

#[test]
fn the_window_bounds_the_packets_of_one_message_in_flight() {
    let mut env = TestEnv::new();
    let cfg = RcConfig {
        qpn: 0x42,
        dest_qpn: 0x24,
        mtu: MTU,
        sq_psn: EPSN,
        window: 16,
        ..RcConfig::default()
    };
    let mut t = transport(&mut env, cfg);
    let len = 64 * MTU as usize;
    t.post_send(
        SendWqe {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 5,
            },
            data: crate::transport::wqe::SendData::Sges(vec![
                MemRegion::new(env.target.clone(), 0..len).unwrap().into(),
            ]),
            len: len as u64,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        },
        &mut env,
    );
    // A 64-packet WRITE to a peer that does not answer: 16 packets, then nothing; the
    // 16th asks for the ACK that opens the window again.
    let now = Instant::now();
    let mut sent = Vec::new();
    while let Some(p) = t.poll_transmit(now, &mut env, |h, _| (h.psn, h.ack_req)) {
        sent.push(p);
    }
    assert_eq!(sent.len(), 16);
    assert_eq!(sent.iter().filter(|p| p.1).count(), 1, "{sent:?}");
    assert_eq!(sent[15], (EPSN.add(15), true));
    let mut ack = RxPacket::new(Kind::Ack, Pos::Only, EPSN.add(15));
    ack.aeth = Some((ACK_UNLIMITED, 1));
    t.handle_packet(now, &ack, &mut env);
    assert_eq!(
        transmit(&mut t, &mut env, 1000).len(),
        16,
        "the window moved on"
    );
}

#[test]
fn reads_beyond_the_responder_resources_are_dropped_as_lost() {
    let (mut env, mut t, va) = setup(2);
    let now = Instant::now();
    let mut psn = EPSN;
    for _ in 0..3 {
        t.handle_packet(now, &read_pkt(psn, va, 4 * MTU), &mut env);
        psn = psn.add(4);
    }
    assert_eq!(env.stat("drop_read_overflow"), 1, "the third is dropped");
    let sent = transmit(&mut t, &mut env, 100);
    assert_eq!(sent.len(), 8, "two READs answered");
    // Not executed: its PSN is still expected, and it is accepted once there is room.
    let third = EPSN.add(8);
    t.handle_packet(now, &read_pkt(third, va, 4 * MTU), &mut env);
    let sent = transmit(&mut t, &mut env, 100);
    assert_eq!(sent.len(), 4);
    assert_eq!(sent[0].2, third);
    assert_eq!(t.state(), QpState::Rts);
}

#[test]
fn refusals_raise_their_affiliated_events() {
    // Invalid request: a MIDDLE without FIRST.
    let mut env = TestEnv::new();
    let mut t = responder(&mut env, 4);
    let m = [0u8; MTU as usize];
    t.handle_packet(
        Instant::now(),
        &write_pkt(Pos::Middle, EPSN, &m, 0, 0),
        &mut env,
    );
    assert_eq!(t.state(), QpState::Err);
    assert_eq!(env.events, [qp_event(AsyncEventType::QpReqErr)]);
    // Access error: an unknown key.
    let mut env = TestEnv::new();
    let mut t = responder(&mut env, 4);
    let mut p = read_pkt(EPSN, env.key.region().addr(), 8);
    p.reth.as_mut().unwrap().rkey = RKEY + 1;
    t.handle_packet(Instant::now(), &p, &mut env);
    assert_eq!(env.events, [qp_event(AsyncEventType::QpAccessErr)]);
    // A duplicate or a packet after ERR raises nothing more.
    t.handle_packet(Instant::now(), &p, &mut env);
    assert_eq!(env.events.len(), 1);
}

#[test]
fn the_responder_naks_a_sequence_gap_once_and_answers_duplicates() {
    let (mut env, mut t, va) = setup(4);
    let now = Instant::now();
    let data = [7u8; 8];
    let write = |psn| {
        let mut p = write_pkt(Pos::Only, psn, &data, 8, va);
        p.ack_req = true;
        p
    };
    // EPSN is lost: ten packets after it, one sequence NAK naming it (IBTA: one NAK per
    // gap, not one per out-of-order packet).
    for i in 1..=10 {
        t.handle_packet(now, &write(EPSN.add(i)), &mut env);
    }
    let naks: Vec<_> = transmit(&mut t, &mut env, 100)
        .iter()
        .filter_map(nak)
        .collect();
    assert_eq!(naks, [(EPSN, Syndrome::NakPsnSeqErr)]);
    assert_eq!(env.stat("out_of_seq_request"), 10);
    // The requester goes back: EPSN and the next are executed and acknowledged.
    t.handle_packet(now, &write(EPSN), &mut env);
    t.handle_packet(now, &write(EPSN.add(1)), &mut env);
    let sent = transmit(&mut t, &mut env, 100);
    assert_eq!(sent.iter().filter_map(nak).count(), 0, "{sent:?}");
    assert_eq!(
        sent.last().map(|p| (p.0, p.2)),
        Some((Kind::Ack, EPSN.add(1)))
    );
    // A new gap (EPSN + 2 lost again) is a new sequence error: one more NAK.
    t.handle_packet(now, &write(EPSN.add(3)), &mut env);
    t.handle_packet(now, &write(EPSN.add(4)), &mut env);
    let naks: Vec<_> = transmit(&mut t, &mut env, 100)
        .iter()
        .filter_map(nak)
        .collect();
    assert_eq!(naks, [(EPSN.add(2), Syndrome::NakPsnSeqErr)]);
    // A duplicate asking for an ACK is acknowledged with the last PSN executed (IBTA
    // 9.7.5.1.2), not executed again.
    t.handle_packet(now, &write(EPSN), &mut env);
    let sent = transmit(&mut t, &mut env, 100);
    assert_eq!(
        sent.iter().map(|p| (p.0, p.2, p.3)).collect::<Vec<_>>(),
        [(Kind::Ack, EPSN.add(1), Some(ACK_UNLIMITED))]
    );
    assert_eq!(env.stat("duplicate_request"), 1);
    assert_eq!(t.state(), QpState::Rts);
}
