//! The connection manager's cases: connecting through RDMA CM (REQ/REP/RTU), rejecting
//! with private data, disconnecting from either side, a request to a port nobody listens
//! on, and a UD service resolution (SIDR). B listens, A connects; the only thing the two
//! exchange over the link is where B listens.

use crate::CaseResult;
use crate::harness::{QpOptions, endpoint, poll_one, roce_v2_gid};
use crate::side::{Role, Side};
use remem_verbs::{
    AccessFlags, CmChannel, CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, Context,
    MemRegion, MemoryBuffer, PortSpace, QpState, QpType, RecvWr, SendOp, SendWr, Sge, UdDest,
    WcOpcode, WcStatus,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The next event on `ch`, waiting up to `timeout`.
fn next_event(ch: &dyn CmChannel, timeout: Duration) -> Result<CmEvent, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ev) = ch.get_event() {
            return Ok(ev);
        }
        if Instant::now() > deadline {
            return Err(format!("no CM event within {timeout:?}"));
        }
        std::thread::yield_now();
    }
}

/// The next event on `ch`, which must be of `kind`.
fn expect(ch: &dyn CmChannel, kind: CmEventKind, timeout: Duration) -> Result<CmEvent, String> {
    let ev = next_event(ch, timeout)?;
    ensure!(
        ev.kind == kind,
        "CM event {:?} (status {}), want {kind:?}",
        ev.kind,
        ev.status
    );
    Ok(ev)
}

/// This side's device address (its first RoCE v2 GID as an IP address).
fn device_ip(ctx: &dyn Context) -> Result<IpAddr, String> {
    Ok(roce_v2_gid(ctx)?.1.to_ip())
}

/// Sends where B listens (or, for `none`, an address where nobody does).
fn send_addr(s: &mut Side<'_>, addr: SocketAddr) -> CaseResult {
    let ip = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let ip = u128::from(ip);
    s.send_words(&[(ip >> 64) as u64, ip as u64, u64::from(addr.port())])
}

fn recv_addr(s: &mut Side<'_>) -> Result<SocketAddr, String> {
    let [hi, lo, port] = s.recv_words::<3>()?;
    let ip = Ipv6Addr::from((u128::from(hi) << 64) | u128::from(lo));
    let ip = ip
        .to_ipv4_mapped()
        .map_or(IpAddr::V6(ip), |v4: Ipv4Addr| IpAddr::V4(v4));
    Ok(SocketAddr::new(ip, port as u16))
}

/// A CM channel and an id reporting to it.
type ChannelAndId = (Arc<dyn CmChannel>, Arc<dyn CmId>);

/// B: a listening id of port space `ps` on this device's address, port picked.
fn listen(s: &Side<'_>, ps: PortSpace) -> Result<ChannelAndId, String> {
    let ch = s
        .ctx
        .create_cm_channel()
        .map_err(err("create_cm_channel"))?;
    let id = s.ctx.create_cm_id(&ch, ps).map_err(err("create_cm_id"))?;
    id.bind(SocketAddr::new(device_ip(&*s.ctx)?, 0))
        .map_err(err("bind"))?;
    id.listen(4).map_err(err("listen"))?;
    Ok((ch, id))
}

/// A: an id of port space `ps` with `dst` resolved (address and route).
fn resolve(s: &Side<'_>, ps: PortSpace, dst: SocketAddr) -> Result<ChannelAndId, String> {
    let ch = s
        .ctx
        .create_cm_channel()
        .map_err(err("create_cm_channel"))?;
    let id = s.ctx.create_cm_id(&ch, ps).map_err(err("create_cm_id"))?;
    id.resolve_addr(None, dst, s.timeout)
        .map_err(err("resolve_addr"))?;
    expect(&*ch, CmEventKind::AddrResolved, s.timeout)?;
    id.resolve_route(s.timeout).map_err(err("resolve_route"))?;
    expect(&*ch, CmEventKind::RouteResolved, s.timeout)?;
    ensure!(
        id.peer_addr().map(|a| a.ip()) == Some(dst.ip()),
        "peer address {:?}, want {dst}",
        id.peer_addr()
    );
    Ok((ch, id))
}

/// A queue pair of `qp_type` on the id's device, moved to INIT with the CM's attributes
/// and given to the id (as `rdma_create_qp` does).
fn attach_qp(
    id: &Arc<dyn CmId>,
    qp_type: QpType,
    o: &QpOptions,
) -> Result<crate::Endpoint, String> {
    let ep = endpoint(&id.context(), o, qp_type, None)?;
    let (attr, mask) = id
        .init_qp_attr(QpState::Init)
        .map_err(err("init_qp_attr(INIT)"))?;
    ep.qp.modify(&attr, mask).map_err(err("modify to INIT"))?;
    id.set_qp(Some(ep.qp.clone())).map_err(err("set_qp"))?;
    Ok(ep)
}

fn param(data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: data.to_vec(),
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    }
}

fn has_prefix(got: &[u8], want: &[u8], what: &str) -> CaseResult {
    ensure!(
        got.starts_with(want),
        "{what}: private data {:?}, want it to start with {:?}",
        &got[..got.len().min(want.len() + 8)],
        want
    );
    Ok(())
}

fn state(ep: &crate::Endpoint) -> Result<QpState, String> {
    Ok(ep.qp.query().map_err(err("query_qp"))?.qp_state)
}

/// Both sides connected through the CM with private data each way; a SEND from A to B
/// over the connection. Returns this side's channel, id and endpoint.
#[allow(clippy::type_complexity)]
fn connected(
    s: &mut Side<'_>,
) -> Result<(Arc<dyn CmChannel>, Arc<dyn CmId>, crate::Endpoint), String> {
    let o = QpOptions::default();
    let (ch, id, ep) = match s.role {
        Role::B => {
            let (ch, listener) = listen(s, PortSpace::Tcp)?;
            send_addr(s, listener.local_addr().ok_or("listener has no address")?)?;
            let req = expect(&*ch, CmEventKind::ConnectRequest, s.timeout)?;
            has_prefix(&req.private_data, b"from A", "REQ")?;
            ensure!(
                req.listen_id.as_ref().map(|l| l.handle()) == Some(listener.handle()),
                "the request does not name its listener"
            );
            ensure!(
                matches!(req.param, CmEventParam::Conn(p) if p.qp_num != 0),
                "REQ parameters: {:?}",
                req.param
            );
            let id = req.id.clone();
            let ep = attach_qp(&id, QpType::Rc, &o)?;
            let (rbuf, rmr) = ep.reg(64, AccessFlags::LOCAL_WRITE)?;
            let sg = [Sge {
                addr: rmr.addr(),
                length: 64,
                lkey: rmr.lkey(),
            }];
            ep.qp
                .post_recv(&[RecvWr {
                    wr_id: 7,
                    sg_list: &sg,
                }])
                .map_err(err("post_recv"))?;
            id.accept(&param(b"from B")).map_err(err("accept"))?;
            expect(&*ch, CmEventKind::Established, s.timeout)?;
            ensure!(
                state(&ep)? == QpState::Rts,
                "QP {:?} after accept",
                state(&ep)?
            );
            let wc = poll_one(&*ep.cq, s.timeout)?;
            ensure!(
                wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv && wc.byte_len == 5,
                "receive: {wc:?}"
            );
            let mut got = [0u8; 5];
            rbuf.read(0, &mut got).map_err(err("read"))?;
            ensure!(&got == b"hello", "received bytes differ: {got:?}");
            drop(listener);
            (ch, id, ep)
        }
        Role::A => {
            let dst = recv_addr(s)?;
            let (ch, id) = resolve(s, PortSpace::Tcp, dst)?;
            let ep = attach_qp(&id, QpType::Rc, &o)?;
            id.connect(&param(b"from A")).map_err(err("connect"))?;
            let ev = expect(&*ch, CmEventKind::Established, s.timeout)?;
            has_prefix(&ev.private_data, b"from B", "REP")?;
            ensure!(
                state(&ep)? == QpState::Rts,
                "QP {:?} after Established",
                state(&ep)?
            );
            let (sbuf, smr) = ep.reg(64, AccessFlags::LOCAL_WRITE)?;
            sbuf.write(0, b"hello").map_err(err("write"))?;
            let sg = [Sge {
                addr: smr.addr(),
                length: 5,
                lkey: smr.lkey(),
            }];
            let mut wr = SendWr::new(1, SendOp::Send, &sg);
            wr.flags = remem_verbs::SendFlags::SIGNALED;
            ep.qp.post_send(&[wr]).map_err(err("post_send"))?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            ensure!(wc.status == WcStatus::Success, "send: {wc:?}");
            (ch, id, ep)
        }
    };
    s.barrier("connected")?;
    Ok((ch, id, ep))
}

/// The side that disconnects, and the one that is told.
fn disconnect_by(s: &mut Side<'_>, by: Role) -> CaseResult {
    let (ch, id, ep) = connected(s)?;
    if s.role == by {
        id.disconnect().map_err(err("disconnect"))?;
    }
    expect(&*ch, CmEventKind::Disconnected, s.timeout)?;
    ensure!(
        state(&ep)? == QpState::Err,
        "QP {:?} after Disconnected",
        state(&ep)?
    );
    s.barrier("disconnected")
}

/// A connects to B through the CM (REQ/REP/RTU with private data both ways), sends over
/// the connection, and disconnects; both sides see `Disconnected` and their QP in ERR.
pub(crate) fn cm_connect_disconnect(s: &mut Side<'_>) -> CaseResult {
    disconnect_by(s, Role::A)
}

/// As [`cm_connect_disconnect`], but the listener's side disconnects.
pub(crate) fn cm_disconnect_by_listener(s: &mut Side<'_>) -> CaseResult {
    disconnect_by(s, Role::B)
}

/// B rejects A's first request with private data (A: `Rejected`, status 28, the data);
/// the listener goes on and accepts the second.
pub(crate) fn cm_reject(s: &mut Side<'_>) -> CaseResult {
    let o = QpOptions::default();
    match s.role {
        Role::B => {
            let (ch, listener) = listen(s, PortSpace::Tcp)?;
            send_addr(s, listener.local_addr().ok_or("listener has no address")?)?;
            let req = expect(&*ch, CmEventKind::ConnectRequest, s.timeout)?;
            req.id.reject(b"not today").map_err(err("reject"))?;
            drop(req);
            let req = expect(&*ch, CmEventKind::ConnectRequest, s.timeout)?;
            has_prefix(&req.private_data, b"again", "second REQ")?;
            let _ep = attach_qp(&req.id, QpType::Rc, &o)?;
            req.id.accept(&param(b"")).map_err(err("accept"))?;
            expect(&*ch, CmEventKind::Established, s.timeout)?;
            s.barrier("done")
        }
        Role::A => {
            let dst = recv_addr(s)?;
            let (ch, id) = resolve(s, PortSpace::Tcp, dst)?;
            let _ep = attach_qp(&id, QpType::Rc, &o)?;
            id.connect(&param(b"first")).map_err(err("connect"))?;
            let ev = expect(&*ch, CmEventKind::Rejected, s.timeout)?;
            ensure!(
                ev.status == remem_verbs::cm::REJ_CONSUMER_DEFINED,
                "reject status {}, want 28 (consumer reject)",
                ev.status
            );
            has_prefix(&ev.private_data, b"not today", "REJ")?;
            let (ch, id) = resolve(s, PortSpace::Tcp, dst)?;
            let _ep = attach_qp(&id, QpType::Rc, &o)?;
            id.connect(&param(b"again")).map_err(err("connect"))?;
            expect(&*ch, CmEventKind::Established, s.timeout)?;
            s.barrier("done")
        }
    }
}

/// A connects to a port of B's address nobody listens on: the CM answers with a reject
/// (reason 8, invalid service ID) within its timeout, not silence.
pub(crate) fn cm_no_listener(s: &mut Side<'_>) -> CaseResult {
    match s.role {
        Role::B => {
            // A port nobody listens on: bound (so no one else takes it) but not listening.
            let ch = s
                .ctx
                .create_cm_channel()
                .map_err(err("create_cm_channel"))?;
            let id = s
                .ctx
                .create_cm_id(&ch, PortSpace::Tcp)
                .map_err(err("create_cm_id"))?;
            id.bind(SocketAddr::new(device_ip(&*s.ctx)?, 0))
                .map_err(err("bind"))?;
            send_addr(s, id.local_addr().ok_or("bound id has no address")?)?;
            s.barrier("done")
        }
        Role::A => {
            let dst = recv_addr(s)?;
            let (ch, id) = resolve(s, PortSpace::Tcp, dst)?;
            let _ep = attach_qp(&id, QpType::Rc, &QpOptions::default())?;
            id.connect(&param(b"anyone?")).map_err(err("connect"))?;
            let ev = next_event(&*ch, s.timeout)?;
            ensure!(
                ev.kind == CmEventKind::Rejected
                    && ev.status == remem_verbs::cm::REJ_INVALID_SERVICE_ID,
                "connect to a port nobody listens on: {:?} status {}, want Rejected status 8",
                ev.kind,
                ev.status
            );
            s.barrier("done")
        }
    }
}

/// A resolves B's UD service (SIDR REQ/REP in the UDP port space): A learns B's QP
/// number and Q_Key and sends B a datagram with them.
pub(crate) fn cm_ud_service(s: &mut Side<'_>) -> CaseResult {
    let o = QpOptions::default();
    match s.role {
        Role::B => {
            let (ch, listener) = listen(s, PortSpace::Udp)?;
            send_addr(s, listener.local_addr().ok_or("listener has no address")?)?;
            let req = expect(&*ch, CmEventKind::ConnectRequest, s.timeout)?;
            has_prefix(&req.private_data, b"ud?", "SIDR REQ")?;
            let ep = ud_ready(&req.id, &o)?;
            let buf = Arc::new(MemoryBuffer::zeroed(4096).map_err(err("buffer"))?);
            let mr = ep
                .pd
                .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::LOCAL_WRITE)
                .map_err(err("reg_mr"))?;
            let sg = [Sge {
                addr: mr.addr(),
                length: 4096,
                lkey: mr.lkey(),
            }];
            ep.qp
                .post_recv(&[RecvWr {
                    wr_id: 3,
                    sg_list: &sg,
                }])
                .map_err(err("post_recv"))?;
            let mut p = param(b"ud!");
            p.qp_num = ep.qp.qp_num();
            req.id.accept(&p).map_err(err("accept"))?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            ensure!(
                wc.status == WcStatus::Success && wc.byte_len == 40 + 4,
                "UD receive: {wc:?}"
            );
            let mut got = [0u8; 4];
            buf.read(40, &mut got).map_err(err("read"))?;
            ensure!(&got == b"ping", "datagram bytes differ: {got:?}");
            s.barrier("done")
        }
        Role::A => {
            let dst = recv_addr(s)?;
            let (ch, id) = resolve(s, PortSpace::Udp, dst)?;
            let ep = ud_ready(&id, &o)?;
            id.connect(&param(b"ud?")).map_err(err("connect"))?;
            let ev = expect(&*ch, CmEventKind::Established, s.timeout)?;
            has_prefix(&ev.private_data, b"ud!", "SIDR REP")?;
            let CmEventParam::Ud(ud) = ev.param else {
                return Err(format!("SIDR REP parameters: {:?}", ev.param));
            };
            ensure!(
                ud.qkey == remem_verbs::cm::RDMA_UDP_QKEY,
                "Q_Key {:#x}, want rdma_cm's {:#x}",
                ud.qkey,
                remem_verbs::cm::RDMA_UDP_QKEY
            );
            let ah = ep.pd.create_ah(&ud.ah_attr).map_err(err("create_ah"))?;
            let (sbuf, smr) = ep.reg(64, AccessFlags::LOCAL_WRITE)?;
            sbuf.write(0, b"ping").map_err(err("write"))?;
            let sg = [Sge {
                addr: smr.addr(),
                length: 4,
                lkey: smr.lkey(),
            }];
            let mut wr = SendWr::new(9, SendOp::Send, &sg);
            wr.flags = remem_verbs::SendFlags::SIGNALED;
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: ud.qp_num,
                remote_qkey: ud.qkey,
            });
            ep.qp.post_send(&[wr]).map_err(err("post_send"))?;
            let wc = poll_one(&*ep.cq, s.timeout)?;
            ensure!(wc.status == WcStatus::Success, "UD send: {wc:?}");
            s.barrier("done")
        }
    }
}

/// A UD QP on the id's device in RTS, its INIT attributes (Q_Key) from the CM.
fn ud_ready(id: &Arc<dyn CmId>, o: &QpOptions) -> Result<crate::Endpoint, String> {
    use remem_verbs::{QpAttr, QpAttrMask};
    let ep = attach_qp(id, QpType::Ud, o)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    ep.qp
        .modify(&rtr, QpAttrMask::STATE)
        .map_err(err("UD to RTR"))?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
        ..QpAttr::default()
    };
    ep.qp
        .modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .map_err(err("UD to RTS"))?;
    Ok(ep)
}
