//! What the raw-peer test binaries (`hostile.rs`, `attacks.rs`, `window.rs`) share: a soft
//! device with a plain UDP socket beside it playing its RoCEv2 peer, packets built with
//! `remem-wire` and sealed with the ICRC of an IPv4 path, the device's answers parsed, its
//! counters and asynchronous events read, and the queue pairs the attacks aim at.
//!
//! Each binary uses a part of it (`mod common;`), hence `dead_code` allowed here.

#![allow(dead_code)]

use remem_conformance::{Endpoint, QpOptions, bring_up, endpoint};
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::{
    AccessFlags, AsyncEvent, AsyncEventElement, AsyncEventType, Context, Gid, MemRegion,
    MemoryBuffer, MemoryRegion, QpAttr, QpAttrMask, QpState, QpType, QueuePair, RecvWr, Sge,
};
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use remem_wire::{Aeth, Bth, Headers, Opcode, Packet, Psn, Reth, Syndrome};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

// ------------------------------------------------------------------ the lab

/// A soft device bound to `dev_ip` (on a UDP port of its own) with `opts`, and the raw
/// peer's socket bound to `peer_ip` on the same port (RoCEv2 devices that talk use one
/// port); returns the device, the peer's socket and the port.
pub fn device_and_peer(
    dev_ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    opts: &SoftOptions,
) -> (Arc<dyn Context>, UdpSocket, u16) {
    let dev = SoftContext::bind_with(SocketAddr::new(dev_ip.into(), 0), opts).unwrap();
    let port = dev.local_addr().port();
    let peer = UdpSocket::bind(SocketAddr::new(peer_ip.into(), port)).unwrap();
    (Arc::new(dev), peer, port)
}

/// An RC endpoint on `ctx` with `o`, in RTS, connected to the raw peer (QPN `peer_qpn` at
/// `peer_ip`): sending from PSN `spsn`, expecting `epsn`, at the path MTU `o.mtu`.
pub fn connect_rc(
    ctx: &Arc<dyn Context>,
    o: &QpOptions,
    (peer_qpn, peer_ip): (u32, Ipv4Addr),
    spsn: u32,
    epsn: u32,
) -> Endpoint {
    let ep = endpoint(ctx, o, QpType::Rc, None).unwrap();
    bring_up(&ep, peer_qpn, Gid::from(peer_ip), spsn, epsn, o.mtu, o).unwrap();
    ep
}

/// [`connect_rc`] at `mtu` to a peer that acknowledges nothing (local ACK timeout 20: no
/// retransmission while a test reads the packets), and `len` bytes of a pattern (`shift`
/// varies it) registered for local access as the source of its sends.
pub fn unacked_sender(
    ctx: &Arc<dyn Context>,
    mtu: remem_verbs::Mtu,
    peer: (u32, Ipv4Addr),
    len: usize,
    shift: u32,
) -> (Endpoint, Arc<dyn MemoryRegion>) {
    let o = QpOptions {
        mtu,
        timeout: 20,
        ..QpOptions::default()
    };
    let ep = connect_rc(ctx, &o, peer, 0x00ff_fff0, 0);
    let data: Vec<u8> = (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> shift) as u8)
        .collect();
    let buf = Arc::new(MemoryBuffer::from_vec(data));
    let mr = ep
        .pd
        .reg_mr(MemRegion::whole(buf), AccessFlags::LOCAL_WRITE)
        .unwrap();
    (ep, mr)
}

/// [`connect_rc`], and a 4 KiB region filled with 0x3c registered with `mr_access`.
pub fn connected_rc(
    ctx: &Arc<dyn Context>,
    o: &QpOptions,
    peer: (u32, Ipv4Addr),
    spsn: u32,
    epsn: u32,
    mr_access: AccessFlags,
) -> (Endpoint, Arc<MemoryBuffer>, Arc<dyn MemoryRegion>) {
    let ep = connect_rc(ctx, o, peer, spsn, epsn);
    let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
    buf.fill(0, 4096, 0x3c).unwrap();
    let mr = ep
        .pd
        .reg_mr(MemRegion::whole(buf.clone()), mr_access)
        .unwrap();
    (ep, buf, mr)
}

/// Takes a UD QP from RESET through INIT (port 1, P_Key index 0, Q_Key `qkey`) to RTR.
pub fn ud_to_rtr(qp: &dyn QueuePair, qkey: u32) {
    use QpAttrMask as M;
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(&attr, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    attr.qp_state = QpState::Rtr;
    qp.modify(&attr, M::STATE).unwrap();
}

/// A scatter/gather entry of `length` bytes at offset `off` of `mr`.
pub fn sge(mr: &dyn MemoryRegion, off: u64, length: u32) -> Sge {
    Sge {
        addr: mr.addr() + off,
        length,
        lkey: mr.lkey(),
    }
}

/// Posts a receive `wr_id` of the one entry `sge` on `qp`.
pub fn post_recv(qp: &dyn QueuePair, wr_id: u64, sge: Sge) {
    qp.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[sge],
    }])
    .unwrap();
}

/// Whether `len` bytes of `buf` at `off` all hold `byte`.
pub fn filled(buf: &MemoryBuffer, off: usize, len: usize, byte: u8) -> bool {
    buf.to_vec(off, len).unwrap().iter().all(|&b| b == byte)
}

// ------------------------------------------------------------------ device state

/// The device's counters by name.
pub fn counters(ctx: &dyn Context) -> HashMap<String, u64> {
    ctx.counters()
        .into_iter()
        .map(|c| (c.name.to_string(), c.value))
        .collect()
}

/// The device's counter `name` (0 if it has none of that name).
pub fn counter(ctx: &dyn Context, name: &str) -> u64 {
    ctx.counters()
        .iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.value)
}

/// The asynchronous events pending on the device (taking them).
pub fn events(ctx: &dyn Context) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.get_async_event()).collect()
}

/// The affiliated asynchronous event `event_type` of QP `qpn`.
pub fn qp_event(qpn: u32, event_type: AsyncEventType) -> AsyncEvent {
    AsyncEvent {
        event_type,
        element: AsyncEventElement::Qp(qpn),
    }
}

// ------------------------------------------------------------------ packets

/// A request `op` to QP `qpn` at PSN `psn`, asking for an ACK.
pub fn request(qpn: u32, op: Opcode, psn: u32) -> Headers {
    let mut bth = Bth::new(op, qpn, Psn::new(psn));
    bth.ack_req = true;
    Headers::new(bth)
}

/// An ACK (or NAK, by `syndrome`) to QP `qpn` for PSN `psn`, with MSN `msn`.
pub fn ack(qpn: u32, psn: u32, syndrome: Syndrome, msn: u32) -> Headers {
    let mut h = Headers::new(Bth::new(Opcode::RcAck, qpn, Psn::new(psn)));
    h.aeth = Some(Aeth { syndrome, msn });
    h
}

/// A RETH naming `len` bytes at `va` with `rkey`.
pub fn reth(va: u64, rkey: u32, len: u32) -> Option<Reth> {
    Some(Reth {
        va,
        rkey,
        dma_len: len,
    })
}

/// The bytes of a packet of headers `h` and `payload` (its ICRC not filled in).
pub fn build(h: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; h.packet_len(payload.len())];
    let n = h.build(payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Fills the ICRC of `buf` for an IPv4 packet from `src` to `dst`, UDP port `port` at both
/// ends (IP identification 0, don't fragment); a datagram too short to hold a BTH and an
/// ICRC is left as it is.
pub fn seal(mut buf: Vec<u8>, src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<u8> {
    let ip = IpFields::V4 {
        src,
        dst,
        id: 0,
        flags_frag: IPV4_DF,
    };
    let ports = UdpPorts {
        src: port,
        dst: port,
    };
    if buf.len() >= 16 {
        icrc::fill(&ip, ports, &mut buf).unwrap();
    }
    buf
}

/// Sends `bytes` from `sock` to `dst` at UDP port `port`.
pub fn send_to(sock: &UdpSocket, dst: Ipv4Addr, port: u16, bytes: &[u8]) {
    sock.send_to(bytes, SocketAddr::new(dst.into(), port))
        .unwrap();
}

/// Seals `bytes` for `src` → `dst` (see [`seal`]) and sends them from `sock` (bound to
/// `src`) to `dst` at UDP port `port`.
pub fn send_sealed(sock: &UdpSocket, src: Ipv4Addr, dst: Ipv4Addr, port: u16, bytes: Vec<u8>) {
    send_to(sock, dst, port, &seal(bytes, src, dst, port));
}

// ------------------------------------------------------------------ answers

/// A packet the device sent to the raw peer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its opcode.
    pub op: Opcode,
    /// Its PSN.
    pub psn: u32,
    /// Its AETH's syndrome, if it has one.
    pub syndrome: Option<Syndrome>,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl Answer {
    /// The packet in datagram `bytes`; `None` if it does not parse.
    pub fn parse(bytes: &[u8]) -> Option<Answer> {
        let p = Packet::parse(bytes).ok()?;
        Some(Answer {
            op: p.headers.bth.opcode,
            psn: p.headers.bth.psn.value(),
            syndrome: p.headers.aeth.map(|a| a.syndrome),
            payload: p.payload.to_vec(),
        })
    }

    /// Whether it is an ACK packet for PSN `psn` (whatever its syndrome).
    pub fn acks(&self, psn: u32) -> bool {
        self.op == Opcode::RcAck && self.psn == psn
    }

    /// Whether it is an ACK packet for PSN `psn` with `syndrome` (a NAK's, typically).
    pub fn is_nak(&self, psn: u32, syndrome: Syndrome) -> bool {
        self.acks(psn) && self.syndrome == Some(syndrome)
    }
}

/// Everything that arrives on the blocking socket `sock` — the first packet awaited up to
/// `first`, each next one up to `quiet` — skipping datagrams that do not parse; leaves the
/// socket's read timeout at `first`.
pub fn recv_burst(sock: &UdpSocket, first: Duration, quiet: Duration) -> Vec<Answer> {
    sock.set_read_timeout(Some(first)).unwrap();
    let mut out = Vec::new();
    let mut b = [0u8; 9000];
    while let Ok(n) = sock.recv(&mut b) {
        out.extend(Answer::parse(&b[..n]));
        // Stop after the first answer burst: a short second wait catches stragglers.
        sock.set_read_timeout(Some(quiet)).unwrap();
    }
    sock.set_read_timeout(Some(first)).unwrap();
    out
}
