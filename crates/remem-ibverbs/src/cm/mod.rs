//! The RDMA CM on this provider, over librdmacm: [`IbCmChannel`] and [`IbCmId`] implement
//! [`remem_verbs::CmChannel`] and [`remem_verbs::CmId`] (what
//! [`Context::create_cm_channel`] and [`Context::create_cm_id`] of an
//! [`IbContext`] return), and the blocking helpers [`CmListener`] / [`CmConnector`] sit on
//! them. They speak the IBTA CM protocol through the kernel's `rdma_cm`, so the peer may
//! be any RDMA CM program (`rdma_server`, rping, perftest's `-R`, …) or another remem on
//! any provider.
//!
//! How the provider-neutral semantics map onto librdmacm:
//!
//! - An id is created by `rdma_create_id` in the given port space and is tied to its
//!   context's device: [`CmId::bind`] accepts only an address of that device (the
//!   unspecified address stands for the device's address of that family), and an address
//!   resolution that ends on another device reports [`CmEventKind::AddrError`]
//!   (status `-ENODEV`). A listener receives the requests that reach it through its
//!   device.
//! - librdmacm sees no QP on the ids (`rdma_cm_id.qp` stays null: the QP is remem's), so
//!   the kernel answers a connection with `CONNECT_RESPONSE`. With a QP given to
//!   [`CmId::set_qp`], [`CmChannel::get_event`] then does what librdmacm does for a QP
//!   made by `rdma_create_qp`: refreshes INIT, moves the QP to RTR and RTS with
//!   `rdma_init_qp_attr`'s attributes (the read/atomic depths as offered and negotiated),
//!   calls `rdma_establish` and reports [`CmEventKind::Established`]. Without one it
//!   reports [`CmEventKind::ConnectResponse`], and [`CmId::establish`] sends the RTU.
//! - [`CmId::accept`] moves an attached RC QP to RTR and RTS before `rdma_accept`; a
//!   reject, an unreachable peer, a connection error or a disconnect move an attached RC
//!   QP to ERR (so does [`CmId::disconnect`], before the DREQ leaves). The peer's
//!   disconnect request is answered at once (`rdma_disconnect` sends the DREP that
//!   rdma_cm leaves to its consumer), so that both sides get
//!   [`CmEventKind::Disconnected`] whoever disconnects.
//! - The UDP port space resolves services (SIDR): [`CmId::connect`] on such an id sends
//!   a SIDR REQ; [`CmEventKind::Established`] carries the peer's QP number, Q_Key and
//!   address vector ([`CmEventParam::Ud`]).
//! - Every event is taken and acknowledged at once (`rdma_get_cm_event` +
//!   `rdma_ack_cm_event`) and handed out with the ids it names: a registry maps each
//!   `rdma_cm_id` to its (weak) handle; a connection request creates the handle of its
//!   new id. Events of ids already dropped are discarded; a request reaching a listener
//!   that is gone, or arriving through another device than the listener's, is rejected.

mod blocking;

pub use blocking::{
    CmConnection, CmConnector, CmListener, CmOptions, CmRequest, MAX_REPLY_PRIVATE_DATA,
    MAX_REQUEST_PRIVATE_DATA,
};

use crate::{IbContext, IbQp, from_ah_attr, from_raw_qp_attr, io_err, own, sys};
use remem_verbs::cm::check_private_data;
use remem_verbs::{
    CmChannel, CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, Context, Error, PeerConnParam,
    PortSpace, PrivateDataLimit, QpAttr, QpAttrMask, QpState, QpType, QueuePair, Result, UdParam,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Handles of CM ids: unique in the process.
static HANDLES: AtomicU64 = AtomicU64::new(1);

/// The negative errno an event's status reports for `e`.
fn neg_errno(e: &Error) -> i32 {
    let n = match e {
        Error::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        Error::InvalidArgument(_) | Error::InvalidQpState(_) => libc::EINVAL,
        Error::Exhausted(_) => libc::ENOMEM,
        Error::Unsupported(_) => libc::EOPNOTSUPP,
        _ => libc::EIO,
    };
    -n
}

/// The event kind of an `enum rdma_cm_event_type` value; `None` for those the
/// provider-neutral API has no kind for.
fn kind_of(raw: u32) -> Option<CmEventKind> {
    use CmEventKind as K;
    Some(match raw {
        0 => K::AddrResolved,
        1 => K::AddrError,
        2 => K::RouteResolved,
        3 => K::RouteError,
        4 => K::ConnectRequest,
        5 => K::ConnectResponse,
        6 => K::ConnectError,
        7 => K::Unreachable,
        8 => K::Rejected,
        9 => K::Established,
        10 => K::Disconnected,
        11 => K::DeviceRemoval,
        12 => K::MulticastJoin,
        13 => K::MulticastError,
        14 => K::AddrChange,
        15 => K::TimewaitExit,
        _ => return None,
    })
}

fn peer_param(c: &sys::RawConnParam) -> PeerConnParam {
    PeerConnParam {
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        flow_control: c.flow_control != 0,
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: c.srq != 0,
        qp_num: c.qp_num,
    }
}

/// The parameters an event of `kind` carries.
fn event_param(kind: CmEventKind, ev: &sys::CmEvent) -> CmEventParam {
    use CmEventKind as K;
    match (&ev.ud, kind) {
        (Some(ud), K::ConnectRequest | K::Established) => CmEventParam::Ud(UdParam {
            qp_num: ud.qp_num,
            qkey: ud.qkey,
            ah_attr: from_ah_attr(&ud.ah_attr),
        }),
        (None, K::ConnectRequest | K::ConnectResponse | K::Established) => {
            CmEventParam::Conn(peer_param(&ev.conn))
        }
        _ => CmEventParam::None,
    }
}

/// An RDMA CM event channel of the rdma-core provider (`rdma_event_channel`), serving the
/// ids of every rdma-core device.
pub struct IbCmChannel {
    raw: Arc<sys::CmChannel>,
    me: Weak<IbCmChannel>,
    /// The ids reporting here, by `rdma_cm_id` address.
    ids: Mutex<HashMap<usize, Weak<IbCmId>>>,
}

impl std::fmt::Debug for IbCmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbCmChannel")
            .field("fd", &self.raw.fd())
            .finish_non_exhaustive()
    }
}

impl IbCmChannel {
    /// `rdma_create_event_channel`, non-blocking.
    pub fn new() -> Result<Arc<IbCmChannel>> {
        let raw = sys::CmChannel::new().map_err(|e| io_err("rdma_create_event_channel", e))?;
        Ok(Arc::new_cyclic(|me| IbCmChannel {
            raw,
            me: me.clone(),
            ids: Mutex::new(HashMap::new()),
        }))
    }

    fn lookup(&self, key: usize) -> Option<Arc<IbCmId>> {
        lock(&self.ids).get(&key)?.upgrade()
    }

    fn register(&self, id: &Arc<IbCmId>) {
        lock(&self.ids).insert(id.raw.key(), Arc::downgrade(id));
    }

    fn unregister(&self, key: usize) {
        lock(&self.ids).remove(&key);
    }

    /// Waits up to `timeout` for the channel to have an event; `false` on timeout.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<bool> {
        sys::wait_readable(self.raw.fd(), timeout).map_err(|e| io_err("poll", e))
    }

    /// The provider-neutral event for a librdmacm event, after doing what the event asks
    /// of the id (moving its QP, answering the reply); `None` for an event nobody is to
    /// see.
    fn translate(&self, ev: sys::CmEvent) -> Option<CmEvent> {
        let mut kind = kind_of(ev.kind)?;
        if kind == CmEventKind::ConnectRequest {
            // Owned from here: dropped (destroyed, so rejected by the kernel) unless a
            // handle takes it.
            let mut ev = ev;
            let new = ev.new_id.take()?;
            let listener = self.lookup(ev.listen_id)?;
            if new.device_name().as_deref() != Some(listener.device()) {
                let _ = new.reject(&[]);
                return None;
            }
            let id = IbCmId::wrap(new, listener.ctx.clone(), listener.ps, self.me.upgrade()?);
            {
                let mut st = lock(&id.state);
                st.bound = true;
                st.peer = Some(peer_param(&ev.conn));
            }
            let param = event_param(kind, &ev);
            return Some(CmEvent {
                kind,
                param,
                id,
                listen_id: Some(listener),
                status: ev.status,
                private_data: ev.private_data,
            });
        }
        let id = self.lookup(ev.id)?;
        let mut status = ev.status;
        match kind {
            CmEventKind::AddrResolved => {
                if id.raw.device_name().as_deref() == Some(id.device()) {
                    lock(&id.state).bound = true;
                } else {
                    kind = CmEventKind::AddrError;
                    status = -libc::ENODEV;
                }
            }
            CmEventKind::ConnectResponse => {
                let peer = peer_param(&ev.conn);
                lock(&id.state).peer = Some(peer);
                if let Some(qp) = id.rc_qp() {
                    match id.complete_active(&qp, &peer) {
                        Ok(()) => kind = CmEventKind::Established,
                        Err(e) => {
                            id.qp_to_err();
                            let _ = id.raw.reject(&[]);
                            kind = CmEventKind::ConnectError;
                            status = neg_errno(&e);
                        }
                    }
                }
            }
            CmEventKind::Rejected | CmEventKind::Unreachable | CmEventKind::ConnectError => {
                id.qp_to_err();
            }
            CmEventKind::Disconnected => {
                let answer = !std::mem::replace(&mut lock(&id.state).disconnected, true);
                id.qp_to_err();
                if answer {
                    // The peer's DREQ: rdma_cm leaves the DREP to the consumer's
                    // rdma_disconnect; the trait's peer is told at once (and so gets its
                    // own Disconnected without waiting for the DREQ's timeout).
                    let _ = id.raw.disconnect();
                }
            }
            _ => {}
        }
        let param = event_param(kind, &ev);
        Some(CmEvent {
            kind,
            param,
            id,
            listen_id: None,
            status,
            private_data: ev.private_data,
        })
    }
}

impl CmChannel for IbCmChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        sys::borrow_fd(self, self.raw.fd())
    }

    fn get_event(&self) -> Option<CmEvent> {
        loop {
            // An error reading the channel (none is expected once it exists) reads as
            // "nothing pending": the trait has no error to give.
            let raw = self.raw.try_event().ok().flatten()?;
            if let Some(ev) = self.translate(raw) {
                return Some(ev);
            }
        }
    }
}

/// What an id has learnt and done.
#[derive(Debug, Default)]
struct IdState {
    /// Bound to an address (and so to the device).
    bound: bool,
    /// The responder resources and initiator depth this side offered in its request.
    offered: Option<(u8, u8)>,
    /// The peer's parameters, from its request or reply.
    peer: Option<PeerConnParam>,
    /// Disconnected (by either side).
    disconnected: bool,
}

/// An RDMA CM id of the rdma-core provider (`rdma_cm_id`), tied to one device.
pub struct IbCmId {
    handle: u64,
    ps: PortSpace,
    ctx: Arc<IbContext>,
    channel: Mutex<Arc<IbCmChannel>>,
    qp: Mutex<Option<Arc<dyn QueuePair>>>,
    state: Mutex<IdState>,
    // Destroyed last (fields drop in order), after `Drop` unregistered it.
    raw: sys::CmId,
}

impl std::fmt::Debug for IbCmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbCmId")
            .field("handle", &self.handle)
            .field("port_space", &self.ps)
            .field("device", &self.device())
            .finish_non_exhaustive()
    }
}

impl Drop for IbCmId {
    fn drop(&mut self) {
        // Out of the registry while the rdma_cm_id still lives (its address is then no
        // other id's); `raw` is destroyed after this.
        lock(&self.channel).unregister(self.raw.key());
    }
}

fn ps_value(ps: PortSpace) -> u32 {
    u32::from(ps.value())
}

fn ms(t: Duration) -> i32 {
    t.as_millis().clamp(1, i32::MAX as u128) as i32
}

impl IbCmId {
    /// `rdma_create_id` in `ps` on `channel`, for `ctx`'s device.
    pub(crate) fn create(
        ctx: Arc<IbContext>,
        channel: Arc<IbCmChannel>,
        ps: PortSpace,
    ) -> Result<Arc<IbCmId>> {
        let raw =
            sys::CmId::new(&channel.raw, ps_value(ps)).map_err(|e| io_err("rdma_create_id", e))?;
        Ok(IbCmId::wrap(raw, ctx, ps, channel))
    }

    fn wrap(
        raw: sys::CmId,
        ctx: Arc<IbContext>,
        ps: PortSpace,
        channel: Arc<IbCmChannel>,
    ) -> Arc<IbCmId> {
        let id = Arc::new(IbCmId {
            handle: HANDLES.fetch_add(1, Ordering::Relaxed),
            ps,
            ctx,
            channel: Mutex::new(channel.clone()),
            qp: Mutex::new(None),
            state: Mutex::new(IdState::default()),
            raw,
        });
        channel.register(&id);
        id
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.ctx.info.name
    }

    /// Moves the id's events to `channel` (`rdma_migrate_id`): events already taken
    /// stay where they were.
    pub fn migrate(self: &Arc<Self>, channel: &Arc<IbCmChannel>) -> Result<()> {
        let mut cur = lock(&self.channel);
        self.raw
            .migrate(&channel.raw)
            .map_err(|e| io_err("rdma_migrate_id", e))?;
        cur.unregister(self.raw.key());
        channel.register(self);
        *cur = channel.clone();
        Ok(())
    }

    /// The IP addresses of the device's RoCE GIDs (IPv6 link-local ones with their
    /// interface as scope).
    fn device_addrs(&self) -> Vec<SocketAddr> {
        let mut ports: Vec<u8> = self.ctx.info.gids.iter().map(|g| g.port_num).collect();
        ports.dedup();
        if ports.is_empty() {
            ports.push(1);
        }
        let mut out: Vec<SocketAddr> = Vec::new();
        for p in ports {
            for g in self.ctx.gid_table(p).unwrap_or_default() {
                let ip = g.gid.to_ip();
                let addr = match ip {
                    IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
                        let scope = g.netdev.as_deref().and_then(ifindex).unwrap_or(0);
                        SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, scope))
                    }
                    ip => SocketAddr::new(ip, 0),
                };
                if !out.contains(&addr) {
                    out.push(addr);
                }
            }
        }
        out
    }

    /// `addr` as bound on this device: the unspecified address becomes the device's
    /// address of its family (a global IPv6 address before a link-local one); another
    /// address must be the device's.
    fn device_addr(&self, addr: SocketAddr) -> Result<SocketAddr> {
        let mine = self.device_addrs();
        let found = if addr.ip().is_unspecified() {
            let mut same: Vec<&SocketAddr> = mine
                .iter()
                .filter(|a| a.is_ipv4() == addr.is_ipv4())
                .collect();
            same.sort_by_key(|a| matches!(a, SocketAddr::V6(v6) if v6.scope_id() != 0));
            same.first().map(|a| {
                let mut a = **a;
                a.set_port(addr.port());
                a
            })
        } else {
            mine.iter().any(|a| a.ip() == addr.ip()).then_some(addr)
        };
        found.ok_or_else(|| {
            io_err(
                "rdma_bind_addr",
                std::io::Error::new(
                    std::io::ErrorKind::AddrNotAvailable,
                    format!("{} is not an address of {}", addr.ip(), self.device()),
                ),
            )
        })
    }

    /// The attached QP if it is connected (RC): the one the CM moves.
    fn rc_qp(&self) -> Option<Arc<dyn QueuePair>> {
        lock(&self.qp)
            .clone()
            .filter(|qp| qp.qp_type() == QpType::Rc)
    }

    /// Moves the attached RC QP to ERR (a failed or ended connection).
    fn qp_to_err(&self) {
        if let Some(qp) = self.rc_qp() {
            let _ = qp.modify(
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            );
        }
    }

    /// Moves `qp` to `state` with the CM's attributes, the read/atomic depth overridden
    /// where given.
    fn move_qp(&self, qp: &Arc<dyn QueuePair>, state: QpState, depth: Option<u8>) -> Result<()> {
        let (mut attr, mut mask) = self.init_qp_attr(state)?;
        match (state, depth) {
            (QpState::Rtr, Some(n)) => {
                attr.max_dest_rd_atomic = n;
                mask |= QpAttrMask::MAX_DEST_RD_ATOMIC;
            }
            (QpState::Rts, Some(n)) => {
                attr.max_rd_atomic = n;
                mask |= QpAttrMask::MAX_QP_RD_ATOMIC;
            }
            _ => {}
        }
        qp.modify(&attr, mask)
    }

    /// RESET → INIT, or INIT → INIT to take the attributes the CM knows once a request
    /// or reply is in (librdmacm does the same: the access flags follow the peer's
    /// resources), then RTR with `responder` and RTS with `initiator`.
    fn to_rts(&self, qp: &Arc<dyn QueuePair>, responder: u8, initiator: u8) -> Result<()> {
        if matches!(qp.state(), QpState::Reset | QpState::Init) {
            self.move_qp(qp, QpState::Init, None)?;
        }
        self.move_qp(qp, QpState::Rtr, Some(responder))?;
        self.move_qp(qp, QpState::Rts, Some(initiator))
    }

    /// The active side's answer to a reply when it has a QP: RTR, RTS, RTU.
    fn complete_active(&self, qp: &Arc<dyn QueuePair>, peer: &PeerConnParam) -> Result<()> {
        let (responder, initiator) = lock(&self.state).offered.unwrap_or((1, 1));
        self.to_rts(qp, responder, initiator.min(peer.responder_resources))?;
        self.raw
            .establish()
            .map_err(|e| io_err("rdma_establish", e))
    }

    fn sys_param<'a>(p: &'a ConnParam, qp_num: u32) -> sys::ConnParam<'a> {
        sys::ConnParam {
            private_data: &p.private_data,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            qp_num,
        }
    }

    fn is_ud(&self) -> bool {
        matches!(self.ps, PortSpace::Udp | PortSpace::Ipoib)
    }
}

/// The interface index of a network device (for an IPv6 link-local scope).
fn ifindex(netdev: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{netdev}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl CmId for IbCmId {
    fn handle(&self) -> u64 {
        self.handle
    }

    fn port_space(&self) -> PortSpace {
        self.ps
    }

    fn context(&self) -> Arc<dyn Context> {
        self.ctx.clone()
    }

    fn port_num(&self) -> u8 {
        self.raw.port_num().max(1)
    }

    fn bind(&self, addr: SocketAddr) -> Result<()> {
        let addr = self.device_addr(addr)?;
        self.raw
            .bind(addr)
            .map_err(|e| io_err("rdma_bind_addr", e))?;
        if self.raw.device_name().is_some_and(|d| d != self.device()) {
            return Err(io_err(
                "rdma_bind_addr",
                std::io::Error::new(
                    std::io::ErrorKind::AddrNotAvailable,
                    format!("{addr} was bound on another device than {}", self.device()),
                ),
            ));
        }
        lock(&self.state).bound = true;
        Ok(())
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.raw.local_addr()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.raw.peer_addr()
    }

    fn listen(&self, backlog: u32) -> Result<()> {
        if backlog == 0 {
            return Err(Error::InvalidArgument(
                "a listener's backlog is a positive number".into(),
            ));
        }
        if !lock(&self.state).bound {
            self.bind(SocketAddr::new(IpAddr::from([0u8; 4]), 0))?;
        }
        self.raw
            .listen(i32::try_from(backlog).unwrap_or(i32::MAX))
            .map_err(|e| io_err("rdma_listen", e))
    }

    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let src = src.map(|s| self.device_addr(s)).transpose()?;
        self.raw
            .resolve_addr(src, dst, ms(timeout))
            .map_err(|e| io_err("rdma_resolve_addr", e))
    }

    fn resolve_route(&self, timeout: Duration) -> Result<()> {
        self.raw
            .resolve_route(ms(timeout))
            .map_err(|e| io_err("rdma_resolve_route", e))
    }

    fn set_qp(&self, qp: Option<Arc<dyn QueuePair>>) -> Result<()> {
        if let Some(qp) = &qp {
            let ib: Arc<IbQp> = own(qp.clone(), "QP")?;
            if ib.pd.device != self.device() {
                return Err(Error::InvalidArgument(format!(
                    "the QP is on {}, the CM id on {}",
                    ib.pd.device,
                    self.device()
                )));
            }
            let fits = match self.ps {
                PortSpace::Tcp => ib.qp_type == QpType::Rc,
                PortSpace::Udp | PortSpace::Ipoib => ib.qp_type == QpType::Ud,
                PortSpace::Ib => matches!(ib.qp_type, QpType::Rc | QpType::Ud),
            };
            if !fits {
                return Err(Error::InvalidArgument(format!(
                    "a {:?} QP in port space {:?}",
                    ib.qp_type, self.ps
                )));
            }
        }
        *lock(&self.qp) = qp;
        Ok(())
    }

    fn qp(&self) -> Option<Arc<dyn QueuePair>> {
        lock(&self.qp).clone()
    }

    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let (raw, mask) = self
            .raw
            .init_qp_attr(state as u32)
            .map_err(|e| io_err("rdma_init_qp_attr", e))?;
        Ok((
            from_raw_qp_attr(&raw),
            QpAttrMask::from_bits_truncate(mask as u32),
        ))
    }

    fn connect(&self, param: &ConnParam) -> Result<()> {
        let (limit, what) = if self.is_ud() {
            (PrivateDataLimit::SIDR_REQ, "SIDR REQ")
        } else {
            (PrivateDataLimit::REQ, "REQ")
        };
        check_private_data(param.private_data.len(), limit, what)?;
        let qp = self.qp();
        if let Some(qp) = qp.as_ref().filter(|q| q.qp_type() == QpType::Rc)
            && qp.state() == QpState::Reset
        {
            self.move_qp(qp, QpState::Init, None)?;
        }
        let qp_num = qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
        lock(&self.state).offered = Some((param.responder_resources, param.initiator_depth));
        self.raw
            .connect(&Self::sys_param(param, qp_num))
            .map_err(|e| io_err("rdma_connect", e))
    }

    fn accept(&self, param: &ConnParam) -> Result<()> {
        let (limit, what) = if self.is_ud() {
            (PrivateDataLimit::SIDR_REP, "SIDR REP")
        } else {
            (PrivateDataLimit::REP, "REP")
        };
        check_private_data(param.private_data.len(), limit, what)?;
        let peer = lock(&self.state)
            .peer
            .ok_or_else(|| Error::InvalidArgument("accept answers a connection request".into()))?;
        let mut param = param.clone();
        if !self.is_ud() {
            // This side keeps no more reads in flight than the requester serves.
            param.initiator_depth = param.initiator_depth.min(peer.responder_resources);
        }
        let qp = self.qp();
        if let Some(qp) = qp.as_ref().filter(|q| q.qp_type() == QpType::Rc) {
            self.to_rts(qp, param.responder_resources, param.initiator_depth)?;
        }
        let qp_num = qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
        self.raw
            .accept(&Self::sys_param(&param, qp_num))
            .map_err(|e| {
                self.qp_to_err();
                io_err("rdma_accept", e)
            })
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        let (limit, what) = if self.is_ud() {
            (PrivateDataLimit::SIDR_REP, "SIDR REP")
        } else {
            (PrivateDataLimit::REJ, "REJ")
        };
        check_private_data(private_data.len(), limit, what)?;
        self.raw
            .reject(private_data)
            .map_err(|e| io_err("rdma_reject", e))
    }

    fn disconnect(&self) -> Result<()> {
        {
            let mut st = lock(&self.state);
            if st.disconnected {
                return Ok(());
            }
            st.disconnected = true;
        }
        self.qp_to_err();
        self.raw
            .disconnect()
            .map_err(|e| io_err("rdma_disconnect", e))
    }

    fn establish(&self) -> Result<()> {
        self.raw
            .establish()
            .map_err(|e| io_err("rdma_establish", e))
    }
}

impl IbContext {
    pub(crate) fn cm_channel(&self) -> Result<Arc<dyn CmChannel>> {
        Ok(IbCmChannel::new()?)
    }

    pub(crate) fn cm_id(
        &self,
        channel: &Arc<dyn CmChannel>,
        ps: PortSpace,
    ) -> Result<Arc<dyn CmId>> {
        let channel: Arc<IbCmChannel> = own(channel.clone(), "CM channel")?;
        let ctx = self
            .me
            .upgrade()
            .ok_or(Error::DeviceUnavailable(self.info.name.clone()))?;
        Ok(IbCmId::create(ctx, channel, ps)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Zeroed as _;

    #[test]
    fn event_numbers_map_to_kinds_and_back() {
        for raw in 0..=16 {
            if let Some(k) = kind_of(raw) {
                assert_eq!(k.value(), raw);
            }
        }
        assert_eq!(kind_of(12), Some(CmEventKind::MulticastJoin));
        assert_eq!(kind_of(4), Some(CmEventKind::ConnectRequest));
    }

    fn raw_event(ud: bool) -> sys::CmEvent {
        let mut ah = crate::sys::ibv_ah_attr::zeroed();
        ah.is_global = 1;
        ah.grh.dgid.raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1];
        ah.port_num = 1;
        sys::CmEvent {
            kind: 9,
            status: 0,
            id: 1,
            listen_id: 0,
            new_id: None,
            private_data: b"ud!".to_vec(),
            conn: sys::RawConnParam {
                responder_resources: 4,
                initiator_depth: 2,
                flow_control: 1,
                retry_count: 7,
                rnr_retry_count: 6,
                srq: 0,
                qp_num: 0x11,
            },
            ud: ud.then_some(sys::RawUdParam {
                qp_num: 0x22,
                qkey: remem_verbs::cm::RDMA_UDP_QKEY,
                ah_attr: ah,
            }),
        }
    }

    #[test]
    fn events_carry_the_parameters_of_their_port_space() {
        let ev = raw_event(false);
        match event_param(CmEventKind::Established, &ev) {
            CmEventParam::Conn(p) => {
                assert_eq!(
                    (p.responder_resources, p.initiator_depth, p.qp_num),
                    (4, 2, 0x11)
                );
                assert!(p.flow_control && !p.srq);
                assert_eq!(p.rnr_retry_count, 6);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            event_param(CmEventKind::ConnectResponse, &ev),
            CmEventParam::Conn(peer_param(&ev.conn))
        );
        // Events that are not about the connection's parameters carry none.
        assert_eq!(
            event_param(CmEventKind::Disconnected, &ev),
            CmEventParam::None
        );
        let ev = raw_event(true);
        match event_param(CmEventKind::Established, &ev) {
            CmEventParam::Ud(u) => {
                assert_eq!((u.qp_num, u.qkey), (0x22, remem_verbs::cm::RDMA_UDP_QKEY));
                assert!(u.ah_attr.is_global);
                assert_eq!(
                    u.ah_attr.dgid.to_ip(),
                    "10.77.0.1".parse::<std::net::IpAddr>().unwrap()
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            event_param(CmEventKind::ConnectRequest, &ev),
            CmEventParam::Ud(_)
        ));
    }

    #[test]
    fn errors_become_negative_errnos() {
        assert_eq!(
            neg_errno(&Error::InvalidArgument("x".into())),
            -libc::EINVAL
        );
        assert_eq!(
            neg_errno(&Error::Io(std::io::Error::from_raw_os_error(
                libc::ETIMEDOUT
            ))),
            -libc::ETIMEDOUT
        );
    }
}
