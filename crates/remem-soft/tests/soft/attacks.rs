//! A second hostile peer suite, beside `hostile.rs`: a raw RoCEv2 sender (a UDP socket on
//! 127.0.23.2 and `remem-wire`) against a soft device on 127.0.23.1 that the test drives
//! itself (an inline device, no progress thread), so that what the victim answered to each
//! attack is in the peer's socket when the drive that handled it returns, and floods can
//! be measured per receive batch. Each test states the guarantee it checks: a peer gets no
//! more than it was granted (no memory beyond its keys, no completion that claims what did
//! not happen), cannot make the device queue or work without bound, and every packet the
//! device refuses is dropped and counted.

use crate::common;

use common::{Answer, build, device_and_peer, filled, reth, seal, send_sealed};
use remem_conformance::{Endpoint, QpOptions, bring_up, endpoint};
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::rc::{self, RcOptions, RcPeer};
use remem_verbs::{
    AccessFlags, AsyncEvent, AsyncEventElement, AsyncEventType, Context, Error, Gid, MemRegion,
    MemoryBuffer, MemoryRegion, Mtu, QpAttr, QpAttrMask, QpState, QpType, QueuePair, RecvWr,
    SendOp, SendWr, Sge, WcFlags, WcStatus, WorkCompletion,
};
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use remem_wire::{Aeth, AtomicEth, Bth, Deth, Feth, Headers, Opcode, Packet, Psn, Syndrome};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VICTIM_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 23, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 23, 2);
/// The raw peer's QPN as the victim QPs know it.
const PEER_QPN: u32 = 0x00ab_cdef;
/// The PSN the victim's responder expects first, and the one its requester starts at.
const EPSN: u32 = 1000;
const SPSN: u32 = 5000;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::FLUSH_GLOBAL);
/// Every drop counter a packet can end in, and `rcvd_pkts` for those a QP took.
const FATES: [&str; 11] = [
    "rcvd_pkts",
    "drop_malformed",
    "drop_bad_icrc",
    "drop_unknown_qp",
    "drop_wrong_transport",
    "drop_wrong_source",
    "drop_bad_pkey",
    "drop_qp_state",
    "drop_bad_qkey",
    "drop_ud_no_recv",
    "drop_uc_refused",
];

/// A victim device driven by the test, and the raw peer's socket on the same UDP port.
struct Lab {
    ctx: Arc<dyn Context>,
    peer: UdpSocket,
    port: u16,
}

impl Lab {
    fn new() -> Lab {
        let opts = SoftOptions {
            inline: true,
            ..SoftOptions::default()
        };
        let (ctx, peer, port) = device_and_peer(VICTIM_IP, PEER_IP, &opts);
        peer.set_nonblocking(true).unwrap();
        Lab { ctx, peer, port }
    }

    fn counter(&self, name: &str) -> u64 {
        common::counter(&*self.ctx, name)
    }

    /// Packets the device has dealt with: taken by a QP or dropped for a counted reason.
    fn handled(&self) -> u64 {
        let c = common::counters(&*self.ctx);
        FATES.iter().map(|n| c.get(*n).copied().unwrap_or(0)).sum()
    }

    /// Sends `h`/`payload` from the peer with a right ICRC.
    fn send(&self, h: &Headers, payload: &[u8]) {
        send_sealed(&self.peer, PEER_IP, VICTIM_IP, self.port, build(h, payload));
    }

    fn send_bytes(&self, bytes: Vec<u8>) {
        common::send_to(&self.peer, VICTIM_IP, self.port, &bytes);
    }

    /// Drives the device (one pump per call) until `n` more packets were dealt with;
    /// returns how many pumps that took.
    fn deliver(&self, n: u64) -> u64 {
        let target = self.handled() + n;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut pumps = 0;
        while self.handled() < target {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} packets arrived",
                n + self.handled() - target
            );
            self.ctx.drive(Duration::from_millis(20)).unwrap();
            pumps += 1;
        }
        pumps
    }

    /// Sends one packet and drives the device until it was dealt with.
    fn attack(&self, h: &Headers, payload: &[u8]) -> Vec<Answer> {
        self.send(h, payload);
        self.deliver(1);
        self.answers()
    }

    /// Sends `h`/`payload` `n` times and drives the device until all were dealt with;
    /// returns how many pumps that took and what the victim answered.
    fn flood(&self, h: &Headers, payload: &[u8], n: u64) -> (u64, Vec<Answer>) {
        for _ in 0..n {
            self.send(h, payload);
        }
        let pumps = self.deliver(n);
        (pumps, self.answers())
    }

    /// Sends `h` with `payload` (a WRITE or a SEND at `v`) and checks that it is ACKed and
    /// its payload landed at the start of `v`'s region.
    fn lands(&self, v: &Victim, h: &Headers, payload: &[u8]) {
        let a = self.attack(h, payload);
        assert!(a.iter().any(|x| x.acks(h.bth.psn.value())), "{a:?}");
        assert_eq!(v.buf.to_vec(0, payload.len()).unwrap(), payload);
    }

    /// Everything the victim has sent: what is there, waiting up to 300 ms for a first
    /// packet if nothing is (the pump that handled a packet sent its answers before it
    /// returned; loopback delivers them at once unless the machine is busy).
    fn answers(&self) -> Vec<Answer> {
        self.collect(Some(Duration::from_millis(300)))
    }

    /// What the victim has sent, without waiting.
    fn answers_now(&self) -> Vec<Answer> {
        self.collect(None)
    }

    fn collect(&self, wait: Option<Duration>) -> Vec<Answer> {
        // One more pump without waiting: what a pump that ran out of its receive budget
        // left to the next.
        let _ = self.ctx.drive(Duration::ZERO);
        let mut out = Vec::new();
        let mut b = vec![0u8; 70_000];
        let mut first = wait;
        loop {
            let got = match first.take() {
                Some(w) => {
                    self.peer.set_nonblocking(false).unwrap();
                    self.peer.set_read_timeout(Some(w)).unwrap();
                    let r = self.peer.recv(&mut b);
                    self.peer.set_nonblocking(true).unwrap();
                    r
                }
                None => self.peer.recv(&mut b),
            };
            let Ok(n) = got else { break };
            out.extend(Answer::parse(&b[..n]));
        }
        out
    }

    fn events(&self) -> Vec<AsyncEvent> {
        common::events(&*self.ctx)
    }

    /// An RC QP connected to the raw peer (expecting `EPSN`, sending from `SPSN`) and a
    /// 4 KiB region filled with 0x3c.
    fn victim(&self, o: &QpOptions) -> Victim {
        let (ep, buf, mr) = common::connected_rc(&self.ctx, o, (PEER_QPN, PEER_IP), SPSN, EPSN, RW);
        Victim { ep, buf, mr }
    }

    fn rc(&self) -> Victim {
        self.victim(&options())
    }

    /// A UD QP in RTS with Q_Key `qkey`.
    fn ud(&self, qkey: u32) -> Endpoint {
        let ep = endpoint(&self.ctx, &options(), QpType::Ud, None).unwrap();
        common::ud_to_rtr(&*ep.qp, qkey);
        let attr = QpAttr {
            qp_state: QpState::Rts,
            port_num: 1,
            qkey,
            sq_psn: 1,
            ..QpAttr::default()
        };
        ep.qp
            .modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .unwrap();
        ep
    }
}

fn options() -> QpOptions {
    QpOptions {
        access: RW,
        mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    }
}

/// A victim QP and its target region.
struct Victim {
    ep: Endpoint,
    buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
}

impl Victim {
    fn qpn(&self) -> u32 {
        self.ep.qp.qp_num()
    }

    fn request(&self, op: Opcode, psn: u32) -> Headers {
        common::request(self.qpn(), op, psn)
    }

    /// A WRITE ONLY of `len` bytes at the start of its region, through its rkey.
    fn write(&self, psn: u32, len: u32) -> Headers {
        let mut h = self.request(Opcode::RcWriteOnly, psn);
        h.reth = reth(self.mr.addr(), self.mr.rkey(), len);
        h
    }

    fn unchanged(&self) -> bool {
        filled(&self.buf, 0, 4096, 0x3c)
    }

    fn post_recv(&self, wr_id: u64, sge: Sge) {
        common::post_recv(&*self.ep.qp, wr_id, sge);
    }

    fn sge(&self, off: u64, length: u32) -> Sge {
        common::sge(&*self.mr, off, length)
    }

    fn completions(&self) -> Vec<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 64];
        let n = self.ep.cq.poll(&mut wc).unwrap_or(0);
        wc[..n].to_vec()
    }

    fn event(&self, event_type: AsyncEventType) -> AsyncEvent {
        common::qp_event(self.qpn(), event_type)
    }
}

fn atomic(va: u64, rkey: u32) -> Option<AtomicEth> {
    Some(AtomicEth {
        va,
        rkey,
        swap_add: 1,
        compare: 0x3c3c_3c3c_3c3c_3c3c,
    })
}

// ------------------------------------------------------------------ binding

#[test]
fn unspecified_and_mapped_bind_addresses() {
    // A device bound to every address would take packets sent to any of them, under a GID
    // (0.0.0.0, ::) no peer can name: refused, with a typed error.
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let err = SoftContext::bind(addr.parse().unwrap()).err();
        assert!(
            matches!(err, Some(Error::InvalidArgument(_))),
            "{addr}: {err:?}"
        );
    }
    // An IPv4-mapped IPv6 address is its IPv4 address: an IPv4 device (its packets carry
    // IPv4 headers, so its ICRCs are computed over IPv4 fields).
    let mapped = SocketAddr::new(IpAddr::V6(Ipv4Addr::new(127, 0, 23, 9).to_ipv6_mapped()), 0);
    let dev = SoftContext::bind(mapped).unwrap();
    assert_eq!(
        dev.local_addr().ip(),
        IpAddr::V4(Ipv4Addr::new(127, 0, 23, 9))
    );
    assert!(
        dev.info().name.starts_with("soft@127.0.23.9:"),
        "{}",
        dev.info().name
    );
}

// ------------------------------------------------------------------ keys and claims

#[test]
fn a_send_with_invalidate_is_refused_not_claimed() {
    // The soft device has no key a peer may invalidate (no memory windows, no
    // fast-registered regions; rxe refuses to invalidate a reg_mr region too). A
    // completion flagged WITH_INV would tell the application that the peer's access to
    // that rkey has ended — while the key still works.
    let lab = Lab::new();
    let v = lab.rc();
    v.post_recv(1, v.sge(0, 256));
    let mut h = v.request(Opcode::RcSendOnlyInv, EPSN);
    h.ieth = Some(v.mr.rkey());
    let a = lab.attack(&h, &[0xee; 64]);
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN, Syndrome::NakInvalidRequest)),
        "{a:?}"
    );
    let wcs = v.completions();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemInvReqErr));
    assert!(!wcs[0].wc_flags.contains(WcFlags::WITH_INV), "{wcs:?}");
    assert_eq!(v.ep.qp.state(), QpState::Err);
    // The receive's completion reported the error: no asynchronous event on top.
    assert!(lab.events().is_empty());
    // The region is still registered: another QP's WRITE through the rkey lands.
    let w = lab.rc();
    lab.lands(&w, &w.write(EPSN, 8), &[0x11; 8]);
}

#[test]
fn a_receive_whose_region_was_deregistered_takes_no_data() {
    // The application posted a receive, then deregistered its region (and uses the
    // memory for something else). A NIC looks the lkey up for every packet it places (rxe's
    // copy_data): the peer's SEND must not land there.
    let lab = Lab::new();
    let Victim { ep, buf, mr } = lab.rc();
    common::post_recv(&*ep.qp, 7, common::sge(&*mr, 0, 2048));
    drop(mr);
    buf.fill(0, 4096, 0x55).unwrap(); // reused for other data
    // A two-packet SEND.
    let mut h = Headers::new(Bth::new(
        Opcode::RcSendFirst,
        ep.qp.qp_num(),
        Psn::new(EPSN),
    ));
    h.bth.ack_req = false;
    lab.send(&h, &[0xee; 1024]);
    h.bth.opcode = Opcode::RcSendLast;
    h.bth.psn = Psn::new(EPSN + 1);
    h.bth.ack_req = true;
    lab.send(&h, &[0xee; 100]);
    lab.deliver(2);
    let a = lab.answers();
    assert!(
        filled(&buf, 0, 4096, 0x55),
        "the SEND was written into a deregistered region"
    );
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN, Syndrome::NakRemoteOperationalError)),
        "{a:?}"
    );
    failed_once(&ep, 7, WcStatus::LocProtErr);
}

#[test]
fn a_send_whose_source_was_deregistered_sends_nothing() {
    // The requester gathers a SEND's payload when it builds the packets: a region
    // deregistered after the post (and reused) is not read.
    let lab = Lab::new();
    let Victim { ep, buf, mr } = lab.rc();
    let sge = [common::sge(&*mr, 0, 3000)];
    ep.qp
        .post_send(&[SendWr::new(9, SendOp::Send, &sge)])
        .unwrap();
    drop(mr);
    buf.fill(0, 4096, 0x77).unwrap(); // secret data now
    let _ = lab.ctx.drive(Duration::ZERO);
    let a = lab.answers();
    assert!(
        a.iter()
            .all(|x| !x.payload.contains(&0x77) && !x.payload.contains(&0x3c)),
        "a deregistered region's memory was sent: {:?}",
        a.iter().map(|x| (x.op, x.psn)).collect::<Vec<_>>()
    );
    failed_once(&ep, 9, WcStatus::LocProtErr);
}

#[test]
fn a_write_with_immediate_held_by_rnr_then_deregistered_writes_no_more() {
    // FIRST lands; the LAST finds no receive (RNR NAK) and the region is deregistered
    // before the peer retries it: the retry writes nothing and is an access error.
    let lab = Lab::new();
    let Victim { ep, buf, mr } = lab.rc();
    let qpn = ep.qp.qp_num();
    let mut h = Headers::new(Bth::new(Opcode::RcWriteFirst, qpn, Psn::new(EPSN)));
    h.reth = reth(mr.addr(), mr.rkey(), 2048);
    lab.send(&h, &[0xee; 1024]);
    let mut last = Headers::new(Bth::new(Opcode::RcWriteLastImm, qpn, Psn::new(EPSN + 1)));
    last.bth.ack_req = true;
    last.imm = Some(5);
    lab.send(&last, &[0xdd; 1024]);
    lab.deliver(2);
    let a = lab.answers();
    assert!(
        a.iter()
            .any(|x| x.psn == EPSN + 1 && matches!(x.syndrome, Some(Syndrome::RnrNak { .. }))),
        "{a:?}"
    );
    assert_eq!(buf.to_vec(0, 1024).unwrap(), vec![0xee; 1024]);
    assert_eq!(buf.to_vec(1024, 1024).unwrap(), vec![0x3c; 1024]);
    drop(mr);
    buf.fill(0, 4096, 0x55).unwrap();
    let (_b2, other) = ep.reg(64, RW).unwrap();
    common::post_recv(&*ep.qp, 1, common::sge(&*other, 0, 64));
    let _ = lab.events();
    let a = lab.attack(&last, &[0xdd; 1024]);
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN + 1, Syndrome::NakRemoteAccessError)),
        "{a:?}"
    );
    assert!(filled(&buf, 0, 4096, 0x55));
    assert_eq!(ep.qp.state(), QpState::Err);
    assert_eq!(
        lab.events(),
        [common::qp_event(qpn, AsyncEventType::QpAccessErr)]
    );
}

#[test]
fn atomic_write_and_flush_after_deregistration_are_access_errors() {
    let lab = Lab::new();
    for op in [Opcode::RcAtomicWrite, Opcode::RcFlush, Opcode::RcFetchAdd] {
        let Victim { ep, buf, mr } = lab.rc();
        let (va, rkey) = (mr.addr(), mr.rkey());
        drop(mr);
        buf.fill(0, 4096, 0x55).unwrap();
        let mut h = common::request(ep.qp.qp_num(), op, EPSN);
        let payload = match op {
            Opcode::RcAtomicWrite => {
                h.reth = reth(va, rkey, 8);
                vec![1; 8]
            }
            Opcode::RcFlush => {
                h.feth = Some(Feth {
                    placement: 1,
                    selectivity: 1,
                });
                h.reth = reth(0, rkey, 0);
                vec![]
            }
            _ => {
                h.atomic = atomic(va, rkey);
                vec![]
            }
        };
        let a = lab.attack(&h, &payload);
        assert!(
            a.iter()
                .any(|x| x.is_nak(EPSN, Syndrome::NakRemoteAccessError)),
            "{op}: {a:?}"
        );
        assert!(filled(&buf, 0, 4096, 0x55), "{op}");
        assert_eq!(ep.qp.state(), QpState::Err);
        let _ = lab.events();
    }
}

#[test]
fn a_receive_a_send_had_begun_is_flushed_not_lost() {
    // A SEND's FIRST takes a receive; the peer then breaks the sequence and the QP goes to
    // ERR. Every receive comes back to the application — the one begun included — so that
    // its buffer is not lost (rxe flushes it too).
    let lab = Lab::new();
    let v = lab.rc();
    v.post_recv(1, v.sge(0, 2048));
    v.post_recv(2, v.sge(2048, 2048));
    let mut h = v.request(Opcode::RcSendFirst, EPSN);
    h.bth.ack_req = false;
    lab.send(&h, &[0xee; 1024]);
    let bad = v.request(Opcode::RcWriteMiddle, EPSN + 1);
    lab.send(&bad, &[0xdd; 1024]);
    lab.deliver(2);
    let a = lab.answers();
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN + 1, Syndrome::NakInvalidRequest)),
        "{a:?}"
    );
    let wcs = v.completions();
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
        "every receive completes"
    );
    assert_eq!(v.ep.qp.state(), QpState::Err);
}

#[test]
fn a_zero_length_flush_still_names_a_valid_key() {
    // A zero-length READ or WRITE checks no key (IBTA 9.4.3, 9.4.4); a FLUSH always does,
    // as rxe checks it: a forged key gets no answer that it was flushed.
    let lab = Lab::new();
    let v = lab.rc();
    let mut h = v.request(Opcode::RcFlush, EPSN);
    h.feth = Some(Feth {
        placement: 1,
        selectivity: 0,
    });
    h.reth = reth(v.mr.addr(), v.mr.rkey() ^ 0x5a5a_0000, 0);
    let a = lab.attack(&h, &[]);
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN, Syndrome::NakRemoteAccessError)),
        "{a:?}"
    );
    assert!(
        a.iter().all(|x| x.op != Opcode::RcReadResponseOnly),
        "{a:?}"
    );
    assert_eq!(v.ep.qp.state(), QpState::Err);
    assert_eq!(lab.events(), [v.event(AsyncEventType::QpAccessErr)]);
    // With the right key, the same empty FLUSH is answered.
    let w = lab.rc();
    let mut h = w.request(Opcode::RcFlush, EPSN);
    h.feth = Some(Feth {
        placement: 1,
        selectivity: 0,
    });
    h.reth = reth(w.mr.addr(), w.mr.rkey(), 0);
    let a = lab.attack(&h, &[]);
    assert!(
        a.iter()
            .any(|x| x.op == Opcode::RcReadResponseOnly && x.psn == EPSN),
        "{a:?}"
    );
}

/// An opcode, how its headers name memory, its payload and the NAK it must get.
type Case = (
    Opcode,
    Box<dyn Fn(&Victim, &mut Headers)>,
    Vec<u8>,
    Syndrome,
);

#[test]
fn out_of_range_addresses_in_every_opcode_are_access_errors() {
    // Addresses near 2^64 and lengths near 2^32 in every header that names memory: the
    // range is checked without overflow, nothing is touched, the NAK says why.
    let lab = Lab::new();
    let ends = [u64::MAX, u64::MAX - 7, u64::MAX - 4095, 1 << 63];
    for va in ends {
        let cases: Vec<Case> = vec![
            (
                Opcode::RcWriteOnly,
                Box::new(move |v, h| h.reth = reth(va, v.mr.rkey(), 64)),
                vec![0xee; 64],
                Syndrome::NakRemoteAccessError,
            ),
            (
                Opcode::RcReadRequest,
                Box::new(move |v, h| h.reth = reth(va, v.mr.rkey(), 64)),
                vec![],
                Syndrome::NakRemoteAccessError,
            ),
            (
                Opcode::RcReadRequest,
                Box::new(|v, h| h.reth = reth(v.mr.addr(), v.mr.rkey(), u32::MAX)),
                vec![],
                Syndrome::NakInvalidRequest,
            ),
            (
                Opcode::RcWriteFirst,
                Box::new(|v, h| h.reth = reth(v.mr.addr(), v.mr.rkey(), 1 << 31)),
                vec![0xee; 1024],
                Syndrome::NakRemoteAccessError,
            ),
            (
                Opcode::RcCompareSwap,
                Box::new(move |v, h| h.atomic = atomic(va & !7, v.mr.rkey())),
                vec![],
                Syndrome::NakRemoteAccessError,
            ),
            (
                Opcode::RcFetchAdd,
                Box::new(move |v, h| h.atomic = atomic(va & !7, v.mr.rkey())),
                vec![],
                Syndrome::NakRemoteAccessError,
            ),
            (
                Opcode::RcAtomicWrite,
                Box::new(move |v, h| h.reth = reth(va & !7, v.mr.rkey(), 8)),
                vec![1; 8],
                Syndrome::NakRemoteAccessError,
            ),
            (
                Opcode::RcFlush,
                Box::new(move |v, h| {
                    h.feth = Some(Feth {
                        placement: 1,
                        selectivity: 0,
                    });
                    h.reth = reth(va, v.mr.rkey(), u32::MAX);
                }),
                vec![],
                Syndrome::NakRemoteAccessError,
            ),
        ];
        for (op, fill, payload, want) in cases {
            let v = lab.rc();
            let mut h = v.request(op, EPSN);
            fill(&v, &mut h);
            let a = lab.attack(&h, &payload);
            assert!(
                a.iter().any(|x| x.is_nak(EPSN, want)),
                "{op} at {va:#x}: want {want:?}, got {a:?}"
            );
            assert!(v.unchanged(), "{op} at {va:#x} changed memory");
            assert_eq!(v.ep.qp.state(), QpState::Err, "{op}");
            let _ = lab.events();
        }
    }
}

#[test]
fn zero_and_maximal_lengths() {
    let lab = Lab::new();
    // A zero-length WRITE needs no key: acknowledged, nothing written.
    let v = lab.rc();
    let mut h = v.request(Opcode::RcWriteOnly, EPSN);
    h.reth = reth(u64::MAX, 0xdead_beef, 0);
    let a = lab.attack(&h, &[]);
    assert!(
        a.iter().any(|x| x.op == Opcode::RcAck
            && x.psn == EPSN
            && x.syndrome == Some(Syndrome::Ack { credits: 31 })),
        "{a:?}"
    );
    // A zero-length READ: one empty response, no key needed.
    let mut h = v.request(Opcode::RcReadRequest, EPSN + 1);
    h.reth = reth(u64::MAX, 0xdead_beef, 0);
    let a = lab.attack(&h, &[]);
    assert!(
        a.iter().any(|x| x.op == Opcode::RcReadResponseOnly
            && x.psn == EPSN + 1
            && x.payload.is_empty()),
        "{a:?}"
    );
    assert!(v.unchanged());
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    // A WRITE whose LAST ends it short of the length its FIRST announced: an invalid
    // request, nothing written past what came.
    let mut h = v.request(Opcode::RcWriteFirst, EPSN + 2);
    h.bth.ack_req = false;
    h.reth = reth(v.mr.addr(), v.mr.rkey(), 2048);
    lab.attack(&h, &[0xee; 1024]);
    let mut h = v.request(Opcode::RcWriteLast, EPSN + 3);
    let a = lab.attack(&h, &[0xdd; 512]);
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN + 3, Syndrome::NakInvalidRequest)),
        "{a:?}"
    );
    assert_eq!(v.buf.to_vec(1024, 1024).unwrap(), vec![0x3c; 1024]);
    // ... and a READ of exactly 2^31 bytes from a 4 KiB region is out of its bounds.
    let w = lab.rc();
    h = w.request(Opcode::RcReadRequest, EPSN);
    h.reth = reth(w.mr.addr(), w.mr.rkey(), 1 << 31);
    let a = lab.attack(&h, &[]);
    assert!(
        a.iter()
            .any(|x| x.is_nak(EPSN, Syndrome::NakRemoteAccessError)),
        "{a:?}"
    );
}

// ------------------------------------------------------------------ what a NIC checks first

/// The bring-up options of the QPs these tests stop half-way: port 1, granting remote
/// writes, path MTU `mtu`, one READ/atomic as target, RNR timer code 1, no hop limit.
fn half_way(mtu: Mtu, sgid_index: u8) -> RcOptions {
    RcOptions {
        sgid_index,
        access: AccessFlags::REMOTE_WRITE,
        mtu,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        hop_limit: 0,
        ..RcOptions::default()
    }
}

/// Takes an RC QP from RESET to INIT (port 1, granting remote writes).
fn rc_to_init(qp: &dyn QueuePair) {
    rc::to_init(qp, &half_way(Mtu::Mtu1024, 0)).unwrap();
}

#[test]
fn packets_for_a_qp_in_a_state_that_takes_none_are_dropped_and_counted() {
    let lab = Lab::new();
    let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
    // RESET, INIT, and ERR: a WRITE is dropped (and counted), not executed, not answered.
    let ep = endpoint(&lab.ctx, &options(), QpType::Rc, None).unwrap();
    let mr = ep.pd.reg_mr(MemRegion::whole(buf.clone()), RW).unwrap();
    let write = |qpn: u32| {
        let mut h = common::request(qpn, Opcode::RcWriteOnly, EPSN);
        h.reth = reth(mr.addr(), mr.rkey(), 8);
        h
    };
    let before = lab.counter("drop_qp_state");
    assert!(lab.attack(&write(ep.qp.qp_num()), &[1; 8]).is_empty());
    rc_to_init(&*ep.qp);
    assert!(lab.attack(&write(ep.qp.qp_num()), &[1; 8]).is_empty());
    let v = lab.rc();
    v.ep.qp
        .modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let h = v.write(EPSN, 8);
    assert!(lab.attack(&h, &[1; 8]).is_empty());
    assert_eq!(buf.to_vec(0, 64).unwrap(), [0; 64]);
    assert!(v.unchanged());
    // RTR: requests are taken, responses (an ACK naming a PSN) are not.
    let rtr = endpoint(&lab.ctx, &options(), QpType::Rc, None).unwrap();
    let o = options();
    rc_to_init(&*rtr.qp);
    let peer = RcPeer {
        qpn: PEER_QPN,
        psn: EPSN,
        gid: Gid::from(PEER_IP),
        mtu: o.mtu,
    };
    rc::to_rtr(&*rtr.qp, &peer, &half_way(o.mtu, rtr.gid_index)).unwrap();
    let ack = common::ack(rtr.qp.qp_num(), SPSN, Syndrome::Ack { credits: 31 }, 0);
    assert!(lab.attack(&ack, &[]).is_empty());
    assert_eq!(lab.counter("drop_qp_state"), before + 4);
    // A packet for QPN 0 or 0xFFFFFF (the SMI and multicast QPNs) reaches no QP; QPN 1 is
    // the GSI (the connection manager's), which takes UD SEND ONLY MADs only.
    let unknown = lab.counter("drop_unknown_qp");
    let wrong = lab.counter("drop_wrong_transport");
    for qpn in [0, 1, 0x00ff_ffff] {
        assert!(lab.attack(&write(qpn), &[1; 8]).is_empty());
    }
    assert_eq!(lab.counter("drop_unknown_qp"), unknown + 2);
    assert_eq!(lab.counter("drop_wrong_transport"), wrong + 1);
    assert_eq!(lab.counter("cm_rx_mads"), 0);
}

#[test]
fn a_foreign_partition_is_dropped_and_counted() {
    // RoCE has one partition: P_Key 0xFFFF (0x7FFF for a limited member), as rxe checks.
    let lab = Lab::new();
    let v = lab.rc();
    for pkey in [0x0000, 0x8001, 0x1234, 0x7ffe] {
        let before = lab.counter("drop_bad_pkey");
        let mut h = v.write(EPSN, 8);
        h.bth.pkey = pkey;
        assert!(lab.attack(&h, &[0xee; 8]).is_empty(), "P_Key {pkey:#x}");
        assert_eq!(lab.counter("drop_bad_pkey"), before + 1, "P_Key {pkey:#x}");
        assert!(v.unchanged(), "P_Key {pkey:#x}");
    }
    // A limited member of the default partition is one of it.
    let mut h = v.write(EPSN, 8);
    h.bth.pkey = 0x7fff;
    lab.lands(&v, &h, &[0xee; 8]);
}

#[test]
fn malformed_datagrams_of_every_size_are_dropped_and_counted() {
    let lab = Lab::new();
    // Valid packets of several opcodes, cut at every length, each with an ICRC that is right
    // for what is left (so only the parser and the responder's checks stand between it and
    // memory): dropped as malformed, or — a cut that still parses is a shorter packet of
    // the same opcode — refused with an invalid request NAK. Nothing written either way.
    for op in [Opcode::RcWriteOnly, Opcode::RcCompareSwap, Opcode::RcFlush] {
        let v = lab.rc();
        let mut h = v.request(op, EPSN);
        let payload = match op {
            Opcode::RcWriteOnly => {
                h.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
                vec![0xee; 64]
            }
            Opcode::RcCompareSwap => {
                h.atomic = atomic(v.mr.addr(), v.mr.rkey());
                vec![]
            }
            _ => {
                h.feth = Some(Feth {
                    placement: 1,
                    selectivity: 0,
                });
                h.reth = reth(v.mr.addr(), v.mr.rkey(), 64);
                vec![]
            }
        };
        let whole = build(&h, &payload);
        let before = lab.counter("drop_malformed");
        for cut in 1..whole.len() {
            lab.send_bytes(seal(whole[..cut].to_vec(), PEER_IP, VICTIM_IP, lab.port));
        }
        lab.deliver(whole.len() as u64 - 1);
        assert!(lab.counter("drop_malformed") > before, "{op}");
        let a = lab.answers();
        assert!(
            a.iter().all(|x| x.op == Opcode::RcAck
                && x.psn == EPSN
                && x.syndrome == Some(Syndrome::NakInvalidRequest)),
            "{op}: {a:?}"
        );
        assert!(v.unchanged(), "{op}");
    }
    // Garbage of every length up to 2 KiB, and of lengths up to the largest datagram: all
    // dropped, none reaches a QP, nothing answers.
    let v = lab.rc();
    let taken = lab.counter("rcvd_pkts");
    let mut x = 0x1234_5678_u32;
    let mut garbage = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    };
    let mut pending = 0;
    for n in (1..2048)
        .chain((2048..65_507).step_by(4093))
        .chain([65_507])
    {
        lab.send_bytes(garbage(n));
        pending += 1;
        if pending == 32 || n >= 2048 {
            lab.deliver(pending);
            pending = 0;
        }
    }
    lab.deliver(pending);
    assert_eq!(lab.counter("rcvd_pkts"), taken);
    assert!(lab.answers().is_empty());
    assert!(v.unchanged());
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    // Pad counts that eat into the payload: the payload the opcode's length needs is not
    // there, an invalid request.
    for pad in 1..=3u8 {
        let w = lab.rc();
        let h = w.write(EPSN, 64);
        let mut bytes = build(&h, &[0xee; 64]);
        bytes[1] = (bytes[1] & !0x30) | (pad << 4);
        lab.send_bytes(seal(bytes, PEER_IP, VICTIM_IP, lab.port));
        lab.deliver(1);
        let a = lab.answers();
        assert!(
            a.iter()
                .any(|x| x.is_nak(EPSN, Syndrome::NakInvalidRequest)),
            "pad {pad}: {a:?}"
        );
        assert!(w.unchanged());
    }
}

#[test]
fn gso_batches_of_odd_strides_are_split_and_each_part_dropped() {
    // A peer can send UDP GSO batches (GRO hands them over whole, cut at the stride): each
    // part is a packet of its own, however odd the stride, and the last may be shorter.
    let lab = Lab::new();
    let v = lab.rc();
    let state = quinn_udp::UdpSocketState::new((&lab.peer).into()).unwrap();
    if state.max_gso_segments() < 2 {
        println!("skipping: no UDP GSO here");
        return;
    }
    let dst = SocketAddr::new(VICTIM_IP.into(), lab.port);
    for (stride, segments) in [(1usize, 40usize), (3, 30), (61, 20), (97, 10)] {
        let len = stride * segments - stride / 2;
        let contents: Vec<u8> = (0..len).map(|i| (i * 7 + stride) as u8).collect();
        let transmit = quinn_udp::Transmit {
            destination: dst,
            ecn: None,
            contents: &contents,
            segment_size: Some(stride),
            src_ip: None,
        };
        state.try_send((&lab.peer).into(), &transmit).unwrap();
        lab.deliver(len.div_ceil(stride) as u64);
    }
    assert_eq!(lab.counter("rcvd_pkts"), 0);
    assert!(lab.answers().is_empty());
    assert!(v.unchanged());
}

#[test]
fn an_icrc_for_another_ip_identification_is_recovered_a_corrupted_one_is_not() {
    // Kernel rxe's IPv4 identifications are unpredictable; the ICRC covers them. A packet
    // whose ICRC fits some identification is taken (and counted); one with a flipped
    // payload bit fits none and is dropped.
    let lab = Lab::new();
    let v = lab.rc();
    let h = v.write(EPSN, 64);
    let mut bytes = build(&h, &[0xee; 64]);
    let ip = IpFields::V4 {
        src: PEER_IP,
        dst: VICTIM_IP,
        id: 0x5a17,
        flags_frag: IPV4_DF,
    };
    let ports = UdpPorts {
        src: lab.port,
        dst: lab.port,
    };
    icrc::fill(&ip, ports, &mut bytes).unwrap();
    let mut corrupted = bytes.clone();
    corrupted[40] ^= 0x10;
    let (recovered, bad) = (
        lab.counter("icrc_id_recovered"),
        lab.counter("drop_bad_icrc"),
    );
    lab.send_bytes(corrupted);
    lab.deliver(1);
    assert_eq!(lab.counter("drop_bad_icrc"), bad + 1);
    assert!(v.unchanged());
    lab.send_bytes(bytes);
    lab.deliver(1);
    assert_eq!(lab.counter("icrc_id_recovered"), recovered + 1);
    assert_eq!(v.buf.to_vec(0, 64).unwrap(), vec![0xee; 64]);
}

// ------------------------------------------------------------------ bounded work

#[test]
fn a_receive_pump_reads_a_bounded_batch() {
    // A peer that keeps the socket full cannot keep the device reading without sending
    // (or running its timers): one pump reads at most 4 receive batches.
    let lab = Lab::new();
    let v = lab.rc();
    let mut h = v.write(EPSN, 8);
    h.bth.dest_qp = 0x00ff_fff7; // no such QP: each is dropped
    for _ in 0..150 {
        lab.send(&h, &[0; 8]);
    }
    let before = lab.counter("rx_datagrams");
    let _ = lab.ctx.drive(Duration::ZERO);
    let read = lab.counter("rx_datagrams") - before;
    assert!(read > 0 && read <= 64, "{read} datagrams in one pump");
}

#[test]
fn rnr_nak_floods_are_merged() {
    // SENDs at a QP without a receive: each is refused with an RNR NAK, but a burst of
    // them gets one, not one each.
    let lab = Lab::new();
    let v = lab.rc();
    let h = v.request(Opcode::RcSendOnly, EPSN);
    let n = 100;
    let (pumps, a) = lab.flood(&h, &[0xee; 16], n);
    let rnr = a
        .iter()
        .filter(|x| matches!(x.syndrome, Some(Syndrome::RnrNak { .. })))
        .count() as u64;
    assert!(
        rnr >= 1 && rnr <= pumps + 1,
        "{rnr} RNR NAKs in {pumps} pumps"
    );
    assert_eq!(lab.counter("send_rnr_err"), n);
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    // A receive posted now takes the retried SEND.
    v.post_recv(1, v.sge(0, 64));
    lab.lands(&v, &h, &[0xee; 16]);
}

#[test]
fn duplicates_and_ackreq_floods_cost_bounded_answers() {
    let lab = Lab::new();
    let v = lab.rc();
    // Duplicate WRITEs asking for an ACK each: ACKs merge, one per pump at most.
    let w = v.write(EPSN, 8);
    lab.attack(&w, &[0x11; 8]);
    let n = 120;
    let (pumps, a) = lab.flood(&w, &[0x22; 8], n);
    let acks = a.iter().filter(|x| x.op == Opcode::RcAck).count() as u64;
    assert!(
        acks <= pumps + 1,
        "{acks} ACKs for {n} duplicates in {pumps} pumps"
    );
    assert_eq!(v.buf.to_vec(0, 8).unwrap(), [0x11; 8], "re-executed");
    // Duplicate atomics are answered from their resource, not re-executed; the answers
    // one pump queues are bounded by the response queue (48 here: 2 × 16 resources + 16).
    let mut f = v.request(Opcode::RcFetchAdd, EPSN + 1);
    f.atomic = atomic(v.mr.addr() + 64, v.mr.rkey());
    lab.attack(&f, &[]);
    let (pumps, a) = lab.flood(&f, &[], n);
    let acks = a.iter().filter(|x| x.op == Opcode::RcAtomicAck).count() as u64;
    assert!(acks <= 48 * pumps, "{acks} atomic ACKs in {pumps} pumps");
    assert_eq!(
        v.buf.load_u64(64).unwrap(),
        0x3c3c_3c3c_3c3c_3c3c_u64.wrapping_add(1),
        "added once"
    );
    assert_eq!(v.ep.qp.state(), QpState::Rts);
}

#[test]
fn psns_across_the_wrap_and_half_the_space_away() {
    // The responder expects a PSN just below 2^24: a WRITE crossing the wrap lands, a
    // duplicate from before the wrap is re-ACKed (not re-executed), and a PSN half the
    // space away counts as a duplicate, never as new.
    let lab = Lab::new();
    let o = options();
    let near = 0x00ff_fffe;
    let ep = common::connect_rc(&lab.ctx, &o, (PEER_QPN, PEER_IP), SPSN, near);
    let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
    let mr = ep.pd.reg_mr(MemRegion::whole(buf.clone()), RW).unwrap();
    let qpn = ep.qp.qp_num();
    let pkt = |op, psn: u32| common::request(qpn, op, psn & 0x00ff_ffff);
    let mut h = pkt(Opcode::RcWriteFirst, near);
    h.reth = reth(mr.addr(), mr.rkey(), 3072);
    h.bth.ack_req = false;
    lab.send(&h, &[1; 1024]);
    lab.send(&pkt(Opcode::RcWriteMiddle, near + 1), &[2; 1024]);
    lab.send(&pkt(Opcode::RcWriteLast, near + 2), &[3; 1024]);
    lab.deliver(3);
    let a = lab.answers();
    assert!(a.iter().any(|x| x.acks(0)), "{a:?}");
    assert_eq!(buf.to_vec(2048, 1024).unwrap(), vec![3; 1024]);
    // The same FIRST again (PSN before the wrap): a duplicate.
    let mut h = pkt(Opcode::RcWriteOnly, near);
    h.reth = reth(mr.addr(), mr.rkey(), 8);
    let a = lab.attack(&h, &[9; 8]);
    assert!(
        a.iter()
            .all(|x| x.syndrome.is_none_or(|s| matches!(s, Syndrome::Ack { .. })))
    );
    // Half the PSN space away from the expected PSN (1).
    let mut h = pkt(Opcode::RcWriteOnly, 1 + (1 << 23));
    h.reth = reth(mr.addr(), mr.rkey(), 8);
    lab.attack(&h, &[9; 8]);
    assert_eq!(buf.to_vec(0, 8).unwrap(), [1; 8], "an old PSN was executed");
    assert_eq!(ep.qp.state(), QpState::Rts);
}

#[test]
fn a_long_read_response_leaves_room_to_receive() {
    // A peer's READ of 8 MiB (8192 response packets) must not keep the device from reading
    // its socket until all of it has left: other connections' packets would be dropped
    // meanwhile. One pump sends at most its transmit budget (1024 packets) per pass.
    let lab = Lab::new();
    let v = lab.rc();
    let big = Arc::new(MemoryBuffer::zeroed(8 << 20).unwrap());
    let mr = v.ep.pd.reg_mr(MemRegion::whole(big), RW).unwrap();
    let mut h = v.request(Opcode::RcReadRequest, EPSN);
    h.reth = reth(mr.addr(), mr.rkey(), 8 << 20);
    lab.send(&h, &[]);
    let before = lab.counter("sent_pkts");
    lab.deliver(1);
    let sent = lab.counter("sent_pkts") - before;
    assert!(
        (1..=2 * 1024).contains(&sent),
        "{sent} packets sent in the pump that took the READ"
    );
}

#[test]
fn a_destroyed_qp_takes_no_more_packets() {
    // The application destroys a QP while its READ response is still streaming (the
    // device holds the QP until what it owes has left): from then on the peer reaches
    // nothing through it — a WRITE is dropped, not executed, and the READ response stops.
    let victim_ip = Ipv4Addr::new(127, 0, 23, 5);
    let peer_ip = Ipv4Addr::new(127, 0, 23, 6);
    let (ctx, peer, port) = device_and_peer(victim_ip, peer_ip, &SoftOptions::from_env());
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let o = options();
    let ep = common::connect_rc(&ctx, &o, (PEER_QPN, peer_ip), SPSN, EPSN);
    const LEN: usize = 64 << 20;
    let big = Arc::new(MemoryBuffer::zeroed(LEN).unwrap());
    big.fill(0, 4096, 0x3c).unwrap();
    let mr = ep.pd.reg_mr(MemRegion::whole(big.clone()), RW).unwrap();
    let qpn = ep.qp.qp_num();
    let counter = |name: &str| common::counter(&*ctx, name);
    let mut h = Headers::new(Bth::new(Opcode::RcReadRequest, qpn, Psn::new(EPSN)));
    h.reth = reth(mr.addr(), mr.rkey(), LEN as u32);
    let sent_before = counter("sent_pkts");
    send_sealed(&peer, peer_ip, victim_ip, port, build(&h, &[]));
    let mut b = vec![0u8; 9000];
    let n = peer.recv(&mut b).unwrap();
    assert_eq!(
        Packet::parse(&b[..n]).unwrap().headers.bth.opcode,
        Opcode::RcReadResponseFirst
    );
    // ibv_destroy_qp: the application's last handle goes (the region stays registered).
    let Endpoint { qp, .. } = ep;
    drop(qp);
    // The WRITE that would come next.
    let mut w = common::request(qpn, Opcode::RcWriteOnly, EPSN + (LEN / 1024) as u32);
    w.reth = reth(mr.addr(), mr.rkey(), 64);
    let seen = counter("drop_unknown_qp") + counter("rcvd_pkts");
    send_sealed(&peer, peer_ip, victim_ip, port, build(&w, &[0xee; 64]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter("drop_unknown_qp") + counter("rcvd_pkts") == seen {
        assert!(Instant::now() < deadline, "the WRITE never arrived");
        std::thread::yield_now();
    }
    assert_eq!(
        big.to_vec(0, 64).unwrap(),
        vec![0x3c; 64],
        "written through a destroyed QP"
    );
    assert!(counter("drop_unknown_qp") > 0);
    // The response stopped: far fewer than its 65,536 packets left.
    let sent = counter("sent_pkts") - sent_before;
    assert!(
        sent < (LEN / 1024) as u64,
        "{sent} packets: the READ went on"
    );
}

// ------------------------------------------------------------------ our requester

/// Posts a signaled work request on `v` and drives until the victim sent its first packet.
fn post(lab: &Lab, v: &Victim, wr_id: u64, op: SendOp, sge: &[Sge]) -> Vec<Answer> {
    v.ep.qp.post_send(&[SendWr::new(wr_id, op, sge)]).unwrap();
    let _ = lab.ctx.drive(Duration::ZERO);
    lab.answers()
}

fn respond(lab: &Lab, v: &Victim, op: Opcode, psn: u32, syndrome: Syndrome, payload: &[u8]) {
    let mut h = Headers::new(Bth::new(op, v.qpn(), Psn::new(psn)));
    if op.layout().aeth {
        h.aeth = Some(Aeth { syndrome, msn: 0 });
    }
    if op.layout().atomic_ack {
        h.atomic_ack = Some(0x4141_4141_4141_4141);
    }
    lab.send(&h, payload);
    lab.deliver(1);
}

/// Checks that `ep`'s CQ holds exactly one completion (without driving), `wr_id` with
/// `status`, and that its QP is in ERR.
fn failed_once(ep: &Endpoint, wr_id: u64, status: WcStatus) {
    let mut wc = [WorkCompletion::default(); 4];
    let n = ep.cq.poll(&mut wc).unwrap();
    assert_eq!(n, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (wr_id, status));
    assert_eq!(ep.qp.state(), QpState::Err);
}

/// Drives until `v`'s CQ has a completion (the requester's timers run meanwhile).
fn completion(lab: &Lab, v: &Victim) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut wc = [WorkCompletion::default(); 1];
        if v.ep.cq.poll(&mut wc).unwrap_or(0) == 1 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion");
        lab.ctx.drive(Duration::from_millis(5)).unwrap();
    }
}

#[test]
fn read_responses_beyond_the_request_write_nothing_outside_it() {
    let lab = Lab::new();
    let v = lab.rc();
    // A READ of 100 bytes into the middle of the region: its neighbours must stay.
    let sge = [v.sge(1000, 100)];
    let read = SendOp::RdmaRead {
        remote_addr: 0x10_0000,
        rkey: 0x99,
    };
    let a = post(&lab, &v, 1, read, &sge);
    assert!(
        a.iter()
            .any(|x| x.op == Opcode::RcReadRequest && x.psn == SPSN),
        "{a:?}"
    );
    let ack = Syndrome::Ack { credits: 31 };
    // Answers the requester never asked for: an atomic ACK, a response for a later PSN
    // (taken as a sign of loss: the READ is asked again), a FIRST for a one-packet READ.
    respond(&lab, &v, Opcode::RcAtomicAck, SPSN, ack, &[]);
    respond(
        &lab,
        &v,
        Opcode::RcReadResponseOnly,
        SPSN + 7,
        ack,
        &[0x66; 100],
    );
    assert!(v.completions().is_empty());
    assert!(v.unchanged());
    // Longer than asked: the READ fails, nothing written beyond its 100 bytes.
    respond(
        &lab,
        &v,
        Opcode::RcReadResponseOnly,
        SPSN,
        ack,
        &[0x66; 1024],
    );
    let wc = completion(&lab, &v);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::BadRespErr));
    assert!(v.unchanged(), "a READ response was written");
    assert_eq!(v.ep.qp.state(), QpState::Err);
}

#[test]
fn naks_and_rnr_naks_in_a_loop_spend_the_retry_counts() {
    // retry_cnt 2 and rnr_retry 2: a peer answering every attempt with a NAK ends the work
    // request after three attempts, however fast it NAKs (the RNR timer it names is obeyed,
    // not spun on).
    let lab = Lab::new();
    let o = QpOptions {
        retry_cnt: 2,
        rnr_retry: 2,
        timeout: 18, // ~1 s: no ACK timeout while the NAKs come
        ..options()
    };
    for (nak, status) in [
        (Syndrome::RnrNak { timer: 1 }, WcStatus::RnrRetryExcErr),
        (Syndrome::NakPsnSeqErr, WcStatus::RetryExcErr),
    ] {
        let v = lab.victim(&o);
        let sge = [v.sge(0, 64)];
        let mut attempts = post(&lab, &v, 1, SendOp::Send, &sge)
            .iter()
            .filter(|x| x.op == Opcode::RcSendOnly)
            .count();
        // NAKs for PSNs never sent or long acknowledged are ignored.
        respond(&lab, &v, Opcode::RcAck, SPSN + 100, nak, &[]);
        respond(&lab, &v, Opcode::RcAck, SPSN.wrapping_sub(1), nak, &[]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let wc = loop {
            assert!(Instant::now() < deadline);
            if attempts > 0 {
                respond(&lab, &v, Opcode::RcAck, SPSN, nak, &[]);
                attempts -= 1;
            }
            let mut wc = [WorkCompletion::default(); 1];
            if v.ep.cq.poll(&mut wc).unwrap() == 1 {
                break wc[0];
            }
            lab.ctx.drive(Duration::from_millis(2)).unwrap();
            attempts += lab
                .answers_now()
                .iter()
                .filter(|x| x.op == Opcode::RcSendOnly)
                .count();
        };
        assert_eq!(wc.status, status, "{nak:?}");
        assert!(attempts == 0, "{nak:?}: sent again after failing");
        assert_eq!(v.ep.qp.state(), QpState::Err);
    }
}

#[test]
fn a_peer_that_never_acknowledges_gets_a_bounded_number_of_packets() {
    // The requester's window (128 PSNs, rxe's) and retry count bound what it sends to a
    // peer that never answers: at most a window per attempt, then RETRY_EXC_ERR.
    let lab = Lab::new();
    let o = QpOptions {
        retry_cnt: 2,
        timeout: 8, // ~1 ms
        ..options()
    };
    let v = lab.victim(&o);
    let big = Arc::new(MemoryBuffer::zeroed(4 << 20).unwrap());
    let mr = v.ep.pd.reg_mr(MemRegion::whole(big), RW).unwrap();
    let sge = [common::sge(&*mr, 0, 4 << 20)];
    let write = SendOp::RdmaWrite {
        remote_addr: 0x1000,
        rkey: 0x1234,
    };
    let before = lab.counter("sent_pkts");
    v.ep.qp.post_send(&[SendWr::new(3, write, &sge)]).unwrap();
    let wc = completion(&lab, &v);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::RetryExcErr));
    let sent = lab.counter("sent_pkts") - before;
    let window = u64::from(remem_soft::device::MAX_UNACKED_PSNS);
    assert!(
        (window..=3 * window).contains(&sent),
        "{sent} packets to a silent peer"
    );
}

// ------------------------------------------------------------------ UD

/// A UD datagram from the raw peer to `qpn`.
fn ud_send(qpn: u32, qkey: u32, src_qp: u32, imm: Option<u32>) -> Headers {
    let op = if imm.is_some() {
        Opcode::UdSendOnlyImm
    } else {
        Opcode::UdSendOnly
    };
    let mut h = Headers::new(Bth::new(op, qpn, Psn::new(0)));
    h.deth = Some(Deth { qkey, src_qp });
    h.imm = imm;
    h
}

/// The IPv4 header checksum over `hdr` is valid.
fn ipv4_checksum_ok(hdr: &[u8]) -> bool {
    let sum: u32 = hdr
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    (folded & 0xffff) + (folded >> 16) == 0xffff
}

#[test]
fn ud_checks_the_qkey_and_writes_the_grh_as_received() {
    let lab = Lab::new();
    const QKEY: u32 = 0x1111_1111;
    let ud = lab.ud(QKEY);
    let qpn = ud.qp.qp_num();
    let (buf, mr) = ud.reg(8192, RW).unwrap();
    let recv = |wr_id: u64, off: u64, len: u32| {
        common::post_recv(&*ud.qp, wr_id, common::sge(&*mr, off, len))
    };
    recv(1, 0, 1024);
    // Wrong Q_Keys — other bits, or the controlled-key bit that only a sender's own NIC
    // may substitute — are dropped and counted; nothing is consumed.
    for qkey in [QKEY ^ 1, QKEY | 0x8000_0000, 0x8000_0000, 0] {
        let before = lab.counter("drop_bad_qkey");
        lab.send(&ud_send(qpn, qkey, 0x42, None), &[0xee; 15]);
        lab.deliver(1);
        assert_eq!(lab.counter("drop_bad_qkey"), before + 1, "Q_Key {qkey:#x}");
    }
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(ud.cq.poll(&mut wc).unwrap(), 0);
    // The right Q_Key: the receive gets the GRH area (an IPv4 header after 20 bytes) and
    // the payload; the completion names the source QP, whatever 24 bits it is.
    lab.send(&ud_send(qpn, QKEY, 0x00fe_dcba, Some(77)), &[0xee; 15]);
    lab.deliver(1);
    assert_eq!(ud.cq.poll(&mut wc).unwrap(), 1);
    let w = wc[0];
    assert_eq!((w.wr_id, w.status), (1, WcStatus::Success));
    assert_eq!(w.byte_len, 40 + 15);
    assert_eq!(w.src_qp, 0x00fe_dcba);
    assert_eq!(w.imm(), Some(77));
    let grh = buf.to_vec(0, 40).unwrap();
    assert_eq!(grh[..20], [0; 20]);
    let ip = &grh[20..];
    assert_eq!(ip[0], 0x45);
    // IPv4 total length: IP, UDP, BTH, DETH, ImmDt, 15 bytes of payload, 1 of pad, ICRC.
    assert_eq!(
        u16::from_be_bytes([ip[2], ip[3]]),
        20 + 8 + 12 + 8 + 4 + 15 + 1 + 4
    );
    assert_eq!(ip[9], 17, "UDP");
    assert_eq!(ip[12..16], PEER_IP.octets());
    assert_eq!(ip[16..20], VICTIM_IP.octets());
    assert!(ipv4_checksum_ok(ip), "IPv4 header checksum {ip:x?}");
    assert_eq!(buf.to_vec(40, 15).unwrap(), [0xee; 15]);
    // Longer than the receive (GRH included): it completes with LOC_LEN_ERR, nothing
    // written; shorter than the GRH area alone, the same.
    buf.fill(0, 8192, 0x3c).unwrap();
    recv(2, 1024, 40 + 16);
    recv(3, 2048, 39);
    lab.send(&ud_send(qpn, QKEY, 0x42, None), &[0xee; 17]);
    lab.send(&ud_send(qpn, QKEY, 0x42, None), &[]);
    lab.deliver(2);
    assert_eq!(ud.cq.poll(&mut wc).unwrap(), 2);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::LocLenErr));
    assert_eq!((wc[1].wr_id, wc[1].status), (3, WcStatus::LocLenErr));
    assert!(filled(&buf, 0, 8192, 0x3c));
    // Above the path MTU (4096 on loopback): dropped as malformed, the receive kept.
    recv(4, 0, 8192);
    let before = lab.counter("drop_malformed");
    lab.send(&ud_send(qpn, QKEY, 0x42, None), &vec![0xee; 4100]);
    lab.deliver(1);
    assert_eq!(lab.counter("drop_malformed"), before + 1);
    assert_eq!(ud.cq.poll(&mut wc).unwrap(), 0);
    // A flood with no receive posted: each dropped and counted, nothing queued.
    lab.send(&ud_send(qpn, QKEY, 0x42, None), &[1]);
    lab.deliver(1);
    assert_eq!(ud.cq.poll(&mut wc).unwrap(), 1);
    let before = lab.counter("drop_ud_no_recv");
    for _ in 0..200 {
        lab.send(&ud_send(qpn, QKEY, 0x42, None), &[1; 64]);
    }
    lab.deliver(200);
    assert_eq!(lab.counter("drop_ud_no_recv"), before + 200);
    assert!(lab.answers().is_empty(), "UD answers nothing");
    assert_eq!(ud.qp.state(), QpState::Rts);
}

#[test]
fn ud_over_ipv6_gets_an_ipv6_grh() {
    let Ok(probe) = UdpSocket::bind("[::1]:0") else {
        println!("skipping: no IPv6 loopback here");
        return;
    };
    let peer_port = probe.local_addr().unwrap().port();
    let opts = SoftOptions {
        inline: true,
        peer_port: Some(peer_port),
        ..SoftOptions::default()
    };
    let dev = SoftContext::bind_with(SocketAddr::from((Ipv6Addr::LOCALHOST, 0)), &opts).unwrap();
    let port = dev.local_addr().port();
    let ctx: Arc<dyn Context> = Arc::new(dev);
    let ep = endpoint(&ctx, &options(), QpType::Ud, None).unwrap();
    common::ud_to_rtr(&*ep.qp, 7);
    let (buf, mr) = ep.reg(1024, RW).unwrap();
    common::post_recv(&*ep.qp, 1, common::sge(&*mr, 0, 1024));
    let h = ud_send(ep.qp.qp_num(), 7, 0x42, None);
    let mut bytes = build(&h, &[0xee; 13]);
    let ip = IpFields::V6 {
        src: Ipv6Addr::LOCALHOST,
        dst: Ipv6Addr::LOCALHOST,
    };
    icrc::fill(
        &ip,
        UdpPorts {
            src: peer_port,
            dst: port,
        },
        &mut bytes,
    )
    .unwrap();
    probe
        .send_to(&bytes, SocketAddr::from((Ipv6Addr::LOCALHOST, port)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [WorkCompletion::default(); 1];
    while ep.cq.poll(&mut wc).unwrap() == 0 {
        assert!(Instant::now() < deadline, "{:?}", ctx.counters());
        ctx.drive(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    let grh = buf.to_vec(0, 40).unwrap();
    assert_eq!(grh[0] >> 4, 6);
    // Payload length: UDP, BTH, DETH, 13 bytes of payload, 3 of pad, ICRC.
    assert_eq!(
        u16::from_be_bytes([grh[4], grh[5]]),
        8 + 12 + 8 + 13 + 3 + 4
    );
    assert_eq!(grh[6], 17, "next header UDP");
    assert_eq!(grh[8..24], Ipv6Addr::LOCALHOST.octets());
    assert_eq!(grh[24..40], Ipv6Addr::LOCALHOST.octets());
    assert_eq!(buf.to_vec(40, 13).unwrap(), [0xee; 13]);
}

// ------------------------------------------------------------------ completion resources

#[test]
fn a_peer_overrunning_a_cq_and_draining_an_srq_raises_one_event_each() {
    let lab = Lab::new();
    // A CQ of 4 and 8 receives: the peer's 8 SENDs overrun it — CQ_ERR once, the first
    // four completions still delivered, then the overrun reported; nothing panics.
    let o = QpOptions {
        cqe: 4,
        ..options()
    };
    let v = lab.victim(&o);
    for i in 0..8 {
        v.post_recv(i, v.sge(i * 64, 64));
    }
    let _ = lab.events();
    for i in 0..8 {
        let mut h = v.request(Opcode::RcSendOnly, EPSN + i);
        h.bth.ack_req = i == 7;
        lab.send(&h, &[i as u8; 8]);
    }
    lab.deliver(8);
    let cq_id = v.ep.cq.id();
    assert_eq!(
        lab.events(),
        [AsyncEvent {
            event_type: AsyncEventType::CqErr,
            element: AsyncEventElement::Cq(cq_id),
        }]
    );
    let mut wc = [WorkCompletion::default(); 8];
    assert_eq!(v.ep.cq.poll(&mut wc).unwrap(), 4);
    assert!(v.ep.cq.poll(&mut wc).is_err(), "the overrun is reported");
    // An SRQ with the limit armed at 4: a peer draining it raises SRQ_LIMIT_REACHED once.
    let ep = endpoint(&lab.ctx, &options(), QpType::Rc, None).unwrap();
    let srq = ep
        .pd
        .create_srq(remem_verbs::SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 4,
        })
        .unwrap();
    let cq = lab.ctx.create_cq(64, None).unwrap();
    let qp = ep
        .pd
        .create_qp(&remem_verbs::QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: Some(srq.clone()),
            cap: options().cap,
            sq_sig_all: false,
        })
        .unwrap();
    let e2 = Endpoint {
        ctx: lab.ctx.clone(),
        pd: ep.pd.clone(),
        cq: cq.clone(),
        qp,
        gid_index: ep.gid_index,
    };
    let o = options();
    bring_up(&e2, PEER_QPN, Gid::from(PEER_IP), SPSN, EPSN, o.mtu, &o).unwrap();
    let (_b, mr) = e2.reg(8 * 64, RW).unwrap();
    for i in 0..8u64 {
        srq.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[common::sge(&*mr, i * 64, 64)],
        }])
        .unwrap();
    }
    for i in 0..8 {
        let mut h = Headers::new(Bth::new(
            Opcode::RcSendOnly,
            e2.qp.qp_num(),
            Psn::new(EPSN + i),
        ));
        h.bth.ack_req = true;
        lab.send(&h, &[1; 8]);
    }
    lab.deliver(8);
    let srq_events: Vec<_> = lab
        .events()
        .into_iter()
        .filter(|e| e.event_type == AsyncEventType::SrqLimitReached)
        .collect();
    assert_eq!(srq_events.len(), 1, "{srq_events:?}");
    assert_eq!(cq.poll(&mut wc).unwrap(), 8);
}

// ------------------------------------------------------------------ UC

/// A UC QP connected to the raw peer at `peer_ip` (expecting `EPSN`), and a 4 KiB region
/// filled with 0x3c.
fn uc_victim(lab: &Lab, peer_ip: Ipv4Addr) -> Victim {
    let o = options();
    let ep = endpoint(&lab.ctx, &o, QpType::Uc, None).unwrap();
    bring_up(&ep, PEER_QPN, Gid::from(peer_ip), SPSN, EPSN, o.mtu, &o).unwrap();
    let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
    buf.fill(0, 4096, 0x3c).unwrap();
    let mr = ep.pd.reg_mr(MemRegion::whole(buf.clone()), RW).unwrap();
    Victim { ep, buf, mr }
}

/// A UC request: no AckReq (a UC requester asks for none; the responder would ignore it).
fn uc(v: &Victim, op: Opcode, psn: u32) -> Headers {
    let mut h = v.request(op, psn);
    h.bth.ack_req = false;
    h
}

#[test]
fn uc_packets_are_taken_silently_and_every_drop_is_counted() {
    let lab = Lab::new();
    let v = uc_victim(&lab, PEER_IP);
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    let count = |names: &[&str]| -> Vec<u64> { names.iter().map(|n| lab.counter(n)).collect() };
    let names = [
        "rcvd_pkts",
        "out_of_seq_request",
        "drop_ud_no_recv",
        "drop_uc_refused",
        "drop_malformed",
        "drop_wrong_transport",
        "sent_pkts",
    ];
    let before = count(&names);
    let mtu = 1024usize;
    // A three-packet SEND into a posted receive: completed, nothing sent back.
    v.post_recv(1, v.sge(0, 4096));
    let data: Vec<u8> = (0..2 * mtu + 100).map(|i| i as u8).collect();
    let ops = [
        Opcode::UcSendFirst,
        Opcode::UcSendMiddle,
        Opcode::UcSendLast,
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let end = ((i + 1) * mtu).min(data.len());
        assert!(
            lab.attack(&uc(&v, op, EPSN + i as u32), &data[i * mtu..end])
                .is_empty()
        );
    }
    let wcs = v.completions();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].byte_len), (1, data.len() as u32));
    assert_eq!(v.buf.to_vec(0, data.len()).unwrap(), data);
    // A WRITE ONLY lands, unanswered.
    let mut w = uc(&v, Opcode::UcWriteOnly, EPSN + 3);
    w.reth = reth(v.mr.addr() + 3000, v.mr.rkey(), 8);
    assert!(lab.attack(&w, &[0x11; 8]).is_empty());
    assert_eq!(v.buf.to_vec(3000, 8).unwrap(), [0x11; 8]);
    // A MIDDLE with no message begun: taken and dropped (out of sequence).
    assert!(
        lab.attack(&uc(&v, Opcode::UcSendMiddle, EPSN + 4), &data[..mtu])
            .is_empty()
    );
    // A SEND ONLY with no receive: dropped (UC has no RNR NAK).
    assert!(
        lab.attack(&uc(&v, Opcode::UcSendOnly, EPSN + 5), &[1; 8])
            .is_empty()
    );
    // A WRITE through a forged rkey, and a WRITE FIRST beyond the region: refused
    // silently, the rest of the message too.
    let mut forged = uc(&v, Opcode::UcWriteOnly, EPSN + 6);
    forged.reth = reth(v.mr.addr(), v.mr.rkey() ^ 0x0101_0100, 8);
    assert!(lab.attack(&forged, &[0x22; 8]).is_empty());
    let mut beyond = uc(&v, Opcode::UcWriteFirst, EPSN + 7);
    beyond.reth = reth(v.mr.addr() + 3072, v.mr.rkey(), 2 * mtu as u32);
    assert!(lab.attack(&beyond, &[0x22; 1024]).is_empty());
    let last = uc(&v, Opcode::UcWriteLast, EPSN + 8);
    assert!(lab.attack(&last, &[0x22; 1024]).is_empty());
    // A FIRST shorter than the MTU: malformed.
    assert!(
        lab.attack(&uc(&v, Opcode::UcSendFirst, EPSN + 9), &[1; 8])
            .is_empty()
    );
    // RC opcodes at a UC QP: not run.
    assert!(lab.attack(&v.write(EPSN + 10, 8), &[0x22; 8]).is_empty());
    // Nothing changed, nothing was sent, the QP goes on.
    assert!(filled(&v.buf, 3008, 4096 - 3008, 0x3c));
    assert!(v.completions().is_empty());
    assert!(lab.events().is_empty());
    assert_eq!(v.ep.qp.state(), QpState::Rts);
    let after = count(&names);
    let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    // rcvd_pkts: the SEND's 3, the WRITE, the orphaned MIDDLE.
    assert_eq!(delta, [5, 1, 1, 3, 1, 1, 0], "{names:?}");
    // And a SEND with a receive still works.
    v.post_recv(2, v.sge(0, 64));
    let mut h = uc(&v, Opcode::UcSendOnlyImm, EPSN + 11);
    h.imm = Some(0x0abc);
    assert!(lab.attack(&h, &[7; 16]).is_empty());
    let wcs = v.completions();
    assert_eq!(
        (wcs.len(), wcs[0].wr_id, wcs[0].imm()),
        (1, 2, Some(0x0abc))
    );
}

#[test]
fn uc_opcodes_at_an_rc_qp_and_uc_packets_from_another_address_are_dropped() {
    let lab = Lab::new();
    // A UC QP whose peer is another address than the raw peer's: its packets are not the
    // peer's (rxe's check_addr covers UC as RC).
    let v = uc_victim(&lab, Ipv4Addr::new(127, 0, 23, 3));
    let before = lab.counter("drop_wrong_source");
    let mut w = uc(&v, Opcode::UcWriteOnly, EPSN);
    w.reth = reth(v.mr.addr(), v.mr.rkey(), 8);
    assert!(lab.attack(&w, &[0x11; 8]).is_empty());
    assert_eq!(lab.counter("drop_wrong_source"), before + 1);
    assert!(v.unchanged());
    // A UC WRITE at an RC QP.
    let r = lab.rc();
    let before = lab.counter("drop_wrong_transport");
    let mut w = r.request(Opcode::UcWriteOnly, EPSN);
    w.reth = reth(r.mr.addr(), r.mr.rkey(), 8);
    assert!(lab.attack(&w, &[0x11; 8]).is_empty());
    assert_eq!(lab.counter("drop_wrong_transport"), before + 1);
    assert!(r.unchanged());
}
