//! The RDMA connection manager's shell (the agent, [`crate::cm::agent`], is the protocol):
//! CM ids and channels, the provider-neutral CM API ([`remem_verbs::cm`]) to the
//! application.
//!
//! Every soft device has a GSI (QP 1): a received UD SEND ONLY to QP 1 with Q_Key
//! [`GSI_QKEY`](crate::cm::GSI_QKEY) carries a 256-byte MAD, handed by the engine to the device's [`CmDevice`];
//! the MADs it sends leave the same way (source QP 1, P_Key 0xFFFF), as kernel rxe does.
//!
//! Inside, as quinn splits a connection from its endpoint's IO:
//!
//! - [`crate::cm::agent`]: the protocol — a deterministic sans-IO state machine per device (REQ, MRA,
//!   REJ, REP, RTU, DREQ, DREP, SIDR REQ/REP; timers, retries, TimeWait; budgets).
//! - this module, the shell: [`SoftCmChannel`] (an fd-readable event queue, the
//!   [`FdQueue`] completion channels use), [`SoftCmId`] (an `rdma_cm_id`: bind, listen,
//!   resolve, connect, accept, reject, disconnect) and [`CmDevice`], which runs the agent
//!   under one lock, turns its events into [`CmEvent`]s on the ids' channels, and moves
//!   the ids' QPs: INIT → RTR → RTS with the negotiated attributes (before the REP leaves
//!   on the passive side, before the RTU on the active side), ERR on a reject or a
//!   disconnect.
//!
//! Address resolution is local: a soft device reaches any address of its IP family
//! through its one socket, so `resolve_addr` and `resolve_route` complete at once (the
//! events are queued before the call returns).
//!
//! Lock order: an id's state, then the device's CM state; the CM state is never held
//! while an id's lock is taken, a QP is modified, or an id is dropped.

use crate::cm::agent::{Agent, ConnectArgs, Event, QpParams};
use crate::cm::{AgentStats, CmConfig, GSI_QPN, MAD_LEN};
use crate::device::DeviceShared;
use crate::device::events::FdQueue;
use crate::engine::{GsiPort, QpPort};
use remem_verbs::cm::{
    CmChannel, CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, PeerConnParam, PortSpace,
    PrivateDataLimit, RDMA_UDP_QKEY, UdParam, check_private_data,
};
use remem_verbs::{
    AccessFlags, AhAttr, Context, Error, Gid, GidType, QpAttr, QpAttrMask, QpState, QpType,
    QueuePair, Result,
};
use remem_wire::mad::rej_reason;
use std::any::Any;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// CM ids one device holds at most (listeners, connecting and connected ids, and the ids
/// of requests not yet accepted); a request beyond it is rejected (REJ reason 3).
pub const MAX_CM_IDS: usize = 4096;

/// How long a consumer command waits for what it queued to leave (`disconnect`:
/// the sends posted before it, then its DREQ; `reject`: the REJ; dropping a connected id:
/// its DREQ). As `rdma_disconnect` on kernel rdma_cm, the call returns once the message has
/// been handed to the network; the bound only matters when the device cannot send (a
/// send queue held up by a peer that stops acknowledging).
pub const SEND_WAIT_LIMIT: Duration = Duration::from_secs(1);

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// An RDMA CM event channel of the soft provider (`rdma_event_channel`): events of ids of
/// any soft device, in order; the fd is readable while one is pending.
#[derive(Debug)]
pub struct SoftCmChannel {
    queue: FdQueue<CmEvent>,
}

impl SoftCmChannel {
    /// A new, empty channel.
    pub fn new() -> Result<Self> {
        Ok(SoftCmChannel {
            queue: FdQueue::new()?,
        })
    }

    fn push(&self, ev: CmEvent) {
        self.queue.push(ev);
    }
}

impl CmChannel for SoftCmChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.queue.fd()
    }

    fn get_event(&self) -> Option<CmEvent> {
        self.queue.pop()
    }
}

/// What an id is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    AddrResolved,
    RouteResolved,
    Listening,
    /// Active: REQ or SIDR REQ sent.
    Connecting,
    /// Active: REP received, the QP is the user's: waiting for `establish`.
    ConnectResponse,
    /// Passive: a request not yet answered.
    Requested,
    /// Passive: accepted, waiting for the RTU.
    Accepted,
    Connected,
    Disconnected,
    /// Rejected, unreachable or failed.
    Failed,
}

struct IdState {
    bound: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    phase: Phase,
    conn: Option<u32>,
    /// A SIDR request (passive, UDP port space).
    sidr: bool,
    qp: Option<Arc<dyn QueuePair>>,
}

impl std::fmt::Debug for IdState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdState")
            .field("bound", &self.bound)
            .field("peer", &self.peer)
            .field("phase", &self.phase)
            .field("conn", &self.conn)
            .field("sidr", &self.sidr)
            .field("qp", &self.qp.as_ref().map(|q| q.qp_num()))
            .finish()
    }
}

/// The CM state of one device, under one lock.
#[derive(Debug)]
struct CmState {
    agent: Agent,
    /// Connection (local communication ID) → its id.
    conns: HashMap<u32, Weak<SoftCmId>>,
    /// Listening ids by handle.
    listeners: HashMap<u64, Weak<SoftCmId>>,
    /// Bound ports per port space → the id's handle.
    ports: HashMap<(PortSpace, u16), u64>,
    /// Live ids.
    ids: usize,
    /// MADs taken from the agent's transmit queue so far (it is first in, first out: a
    /// MAD queued when the agent had queued `n` in all has been taken once this reaches
    /// `n`).
    taken: u64,
}

/// The connection manager of one soft device: its [`Agent`] and the ids on it.
#[derive(Debug)]
pub struct CmDevice {
    state: Mutex<CmState>,
    /// The membership of the host's shared device, when the device is shared: the CM
    /// publishes its connections there and closes dead members' (`io::host`).
    host: Option<Arc<crate::io::host::Host>>,
}

/// What to do, outside the CM lock, about one agent event.
enum Work {
    /// An id to drop outside the lock.
    Hold(#[allow(dead_code)] Arc<SoftCmId>),
    Event(Event, Arc<SoftCmId>),
    Request {
        ev: Event,
        listener: Arc<SoftCmId>,
        id: Arc<SoftCmId>,
    },
}

impl CmDevice {
    /// The CM of a device, with settings `cfg`.
    #[cfg(any(test, feature = "internals"))]
    pub fn new(cfg: CmConfig) -> Self {
        Self::on_host(cfg, None)
    }

    /// The CM of a device that `host` shares with other processes: its communication IDs
    /// carry the member's slot, and its connections are published for survivors.
    pub fn on_host(cfg: CmConfig, host: Option<Arc<crate::io::host::Host>>) -> Self {
        let mut agent = Agent::new(cfg, rand::random());
        if let Some(h) = &host {
            agent.set_id_prefix(h.slot());
        }
        CmDevice {
            host,
            state: Mutex::new(CmState {
                agent,
                conns: HashMap::new(),
                listeners: HashMap::new(),
                ports: HashMap::new(),
                ids: 0,
                taken: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The agent's counters.
    pub fn stats(&self) -> AgentStats {
        self.lock().agent.stats()
    }

    /// Handles a MAD received from `from`.
    pub fn on_mad(&self, now: Instant, from: IpAddr, mad: &[u8]) {
        let work = {
            let mut st = self.lock();
            st.agent.handle_mad(now, from, mad);
            self.publish(&st);
            Self::drain(&mut st, now)
        };
        self.deliver(now, work);
    }

    /// On a shared device: publishes the connections a survivor must close if this
    /// process dies.
    fn publish(&self, st: &CmState) {
        if let Some(h) = &self.host {
            let links: Vec<crate::io::host::Link> = (st.agent.links().into_iter())
                .map(
                    |(local_id, remote_id, peer, remote_qpn)| crate::io::host::Link {
                        peer,
                        local_id,
                        remote_id,
                        remote_qpn,
                    },
                )
                .collect();
            h.publish(&links);
        }
    }

    /// The next MAD to send: its destination and bytes. On a shared device, the DREQs
    /// for the connections of members that died come first.
    pub fn poll_transmit(&self) -> Option<(IpAddr, Box<[u8; MAD_LEN]>)> {
        let mut st = self.lock();
        if let Some(h) = &self.host {
            for l in h.take_orphans() {
                st.agent
                    .send_orphan_dreq(l.peer, l.local_id, l.remote_id, l.remote_qpn);
            }
        }
        let Some(t) = st.agent.poll_transmit() else {
            self.publish(&st);
            return None;
        };
        st.taken += 1;
        Some((t.dst, t.mad))
    }

    /// Closes every open connection (a DREQ each, [`Agent::disconnect_all`]) and returns
    /// the count of MADs queued in all once they are (for [`CmDevice::taken`]).
    pub(crate) fn disconnect_all(&self) -> u64 {
        let mut st = self.lock();
        st.agent.disconnect_all(Instant::now());
        Self::queued(&st)
    }

    /// How many MADs the agent has queued so far (see [`CmState::taken`]).
    fn queued(st: &CmState) -> u64 {
        st.agent.stats().tx_mads
    }

    /// Whether the MADs queued before the agent had queued `n` in all have been taken
    /// for transmission.
    pub(crate) fn taken(&self, n: u64) -> bool {
        self.lock().taken >= n
    }

    /// The next timer deadline.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.lock().agent.poll_timeout()
    }

    /// Runs the timers due at `now`.
    pub fn on_timeout(&self, now: Instant) {
        let work = {
            let mut st = self.lock();
            st.agent.handle_timeout(now);
            Self::drain(&mut st, now)
        };
        self.deliver(now, work);
    }

    /// Takes the agent's events and finds their ids (creating the ids of new requests).
    /// Runs under the lock: no id is dropped here (they are returned).
    fn drain(st: &mut CmState, now: Instant) -> Vec<Work> {
        let mut work = Vec::new();
        while let Some(ev) = st.agent.poll_event() {
            if let Event::ConnectRequest {
                listener,
                conn,
                service_id,
                header,
                ref req,
                ..
            } = ev
            {
                let l = st.listeners.get(&listener).and_then(Weak::upgrade);
                let Some(l) = l else {
                    let _ = st
                        .agent
                        .reject(now, conn, rej_reason::CONSUMER_DEFINED, &[]);
                    continue;
                };
                if st.ids >= MAX_CM_IDS {
                    let _ = st.agent.reject(now, conn, rej_reason::NO_RESOURCES, &[]);
                    work.push(Work::Hold(l));
                    continue;
                }
                let port = service_id as u16;
                let id = SoftCmId::new(
                    l.dev.clone(),
                    l.cm.clone(),
                    l.channel.clone(),
                    l.ps,
                    IdState {
                        bound: Some(SocketAddr::new(header.dst, port)),
                        peer: Some(SocketAddr::new(header.src, header.src_port)),
                        phase: Phase::Requested,
                        conn: Some(conn),
                        sidr: req.is_none(),
                        qp: None,
                    },
                );
                st.ids += 1;
                st.agent.limit_mtu(conn, l.dev.port.active_mtu);
                st.conns.insert(conn, Arc::downgrade(&id));
                work.push(Work::Request {
                    ev,
                    listener: l,
                    id,
                });
                continue;
            }
            let conn = match &ev {
                Event::ConnectReply { conn, .. }
                | Event::Established { conn, .. }
                | Event::Rejected { conn, .. }
                | Event::Unreachable { conn, .. }
                | Event::ConnectError { conn, .. }
                | Event::Disconnected { conn, .. }
                | Event::TimewaitExit { conn }
                | Event::SidrResolved { conn, .. }
                | Event::ConnectRequest { conn, .. } => *conn,
            };
            if let Some(id) = st.conns.get(&conn).and_then(Weak::upgrade) {
                work.push(Work::Event(ev, id));
            }
        }
        work
    }

    /// Acts on events outside the lock: QP transitions, events on channels.
    fn deliver(&self, now: Instant, work: Vec<Work>) {
        for w in work {
            match w {
                Work::Request { ev, listener, id } => {
                    let Event::ConnectRequest {
                        private_data, req, ..
                    } = ev
                    else {
                        continue;
                    };
                    let param = match req {
                        Some(r) => CmEventParam::Conn(PeerConnParam {
                            responder_resources: r.responder_resources,
                            initiator_depth: r.initiator_depth,
                            flow_control: r.end_to_end_flow_control,
                            retry_count: r.retry_count,
                            rnr_retry_count: r.rnr_retry_count,
                            srq: r.srq,
                            qp_num: r.local_qpn,
                        }),
                        None => CmEventParam::None,
                    };
                    let Some(channel) = listener.channel.upgrade() else {
                        continue;
                    };
                    channel.push(CmEvent {
                        kind: CmEventKind::ConnectRequest,
                        id: id.clone(),
                        listen_id: Some(listener.clone()),
                        status: 0,
                        private_data,
                        param,
                    });
                }
                Work::Event(ev, id) => id.on_event(self, now, ev),
                Work::Hold(_) => {}
            }
        }
    }

    /// Runs a consumer command `f` on the state. Commands report no events (the agent
    /// reports only what MADs and timers bring, drained by [`CmDevice::on_mad`] and
    /// [`CmDevice::on_timeout`]), so nothing is delivered here — callers may hold their
    /// id's lock.
    fn with<T>(&self, f: impl FnOnce(&mut CmState) -> T) -> T {
        f(&mut self.lock())
    }
}

/// The engine hands QP 1's MADs here, and takes the MADs to send from here; what they bring
/// comes back up as the agent's events ([`Event`]), which [`CmDevice::on_mad`] and
/// [`CmDevice::on_timeout`] turn into CM ids (a new connection request) and their events.
impl GsiPort for CmDevice {
    fn on_mad(&self, now: Instant, from: IpAddr, mad: &[u8]) {
        CmDevice::on_mad(self, now, from, mad);
    }

    fn poll_transmit(&self) -> Option<(IpAddr, Box<[u8; MAD_LEN]>)> {
        CmDevice::poll_transmit(self)
    }

    fn next_timeout(&self) -> Option<Instant> {
        CmDevice::next_timeout(self)
    }

    fn on_timeout(&self, now: Instant) {
        CmDevice::on_timeout(self, now);
    }
}

/// An RDMA CM id on a soft device (`rdma_cm_id`).
#[derive(Debug)]
pub struct SoftCmId {
    handle: u64,
    ps: PortSpace,
    dev: Arc<DeviceShared>,
    /// The device's connection manager (the engine's GSI).
    cm: Arc<CmDevice>,
    /// Held weakly: queued events hold their ids, so an id holding its channel would keep
    /// a dropped channel with unread events (and its ids, and the device) alive for ever.
    /// Events of an id whose channel is gone are dropped (rdma_cm requires the channel to
    /// outlive its ids).
    channel: Weak<SoftCmChannel>,
    me: Weak<SoftCmId>,
    st: Mutex<IdState>,
}

/// Creates an id on `dev` reporting to `channel` (which must be a [`SoftCmChannel`]).
pub(crate) fn create_id(
    dev: &Arc<DeviceShared>,
    cm: &Arc<CmDevice>,
    channel: &Arc<dyn CmChannel>,
    ps: PortSpace,
) -> Result<Arc<dyn CmId>> {
    let any: Arc<dyn Any + Send + Sync> = channel.clone();
    let channel = any
        .downcast::<SoftCmChannel>()
        .map_err(|_| Error::InvalidArgument("CM channel of another provider".into()))?;
    {
        let mut st = cm.lock();
        if st.ids >= MAX_CM_IDS {
            return Err(Error::Exhausted("CM ids"));
        }
        st.ids += 1;
    }
    Ok(SoftCmId::new(
        dev.clone(),
        cm.clone(),
        Arc::downgrade(&channel),
        ps,
        IdState {
            bound: None,
            peer: None,
            phase: Phase::Idle,
            conn: None,
            sidr: false,
            qp: None,
        },
    ))
}

/// An error carrying `errno` (`EADDRINUSE`, `EADDRNOTAVAIL`: what `rdma_bind_addr`
/// answers; [`Error::errno`] gives it back). `what` goes to the trace log.
fn errno_error(errno: rustix::io::Errno, what: String) -> Error {
    tracing::debug!("CM: {what}");
    Error::Io(std::io::Error::from_raw_os_error(errno.raw_os_error()))
}

impl SoftCmId {
    fn new(
        dev: Arc<DeviceShared>,
        cm: Arc<CmDevice>,
        channel: Weak<SoftCmChannel>,
        ps: PortSpace,
        st: IdState,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| SoftCmId {
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            ps,
            dev,
            cm,
            channel,
            me: me.clone(),
            st: Mutex::new(st),
        })
    }

    fn lock(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cm(&self) -> &CmDevice {
        &self.cm
    }

    fn local_ip(&self) -> IpAddr {
        self.dev.engine.local().ip()
    }

    fn wake(&self) {
        self.dev.wake(GSI_QPN);
    }

    /// Wakes the GSI and waits (at most [`SEND_WAIT_LIMIT`]) until the MADs the agent had
    /// queued when it had queued `n` in all have been handed to the socket: a command
    /// returns once what it sent has left, and a process that exits next loses nothing.
    /// Called without the id's lock (the progress thread takes it to deliver events).
    fn wake_and_send(&self, n: u64) {
        self.wake();
        let cm = &self.cm;
        self.dev.drive_until(SEND_WAIT_LIMIT, &|| cm.taken(n));
    }

    /// Waits (at most [`SEND_WAIT_LIMIT`]) until what was posted to `qp`'s send queue has
    /// left (every packet sent once; [`crate::verbs::qp::SoftQp::has_unsent`]), if `qp` is a QP of
    /// this device: a NIC or kernel rxe sends what was posted before the QP moves to ERR
    /// at a disconnection, so the peer receives it rather than a flush. Called without the
    /// id's lock.
    fn send_posted(&self, qp: &Arc<dyn QueuePair>) {
        let any: Arc<dyn Any + Send + Sync> = qp.clone();
        let Ok(soft) = any.downcast::<crate::verbs::qp::SoftQp>() else {
            return; // a QP of another provider
        };
        let port: Arc<dyn QpPort> = soft.clone();
        if !self.dev.engine.owns(&port) {
            return; // a QP of another device
        }
        if soft.has_unsent() {
            self.dev.wake(qp.qp_num());
            self.dev
                .drive_until(SEND_WAIT_LIMIT, &|| !soft.has_unsent());
        }
    }

    fn event(&self, kind: CmEventKind, status: i32, private_data: Vec<u8>, param: CmEventParam) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let Some(channel) = self.channel.upgrade() else {
            return;
        };
        channel.push(CmEvent {
            kind,
            id: me,
            listen_id: None,
            status,
            private_data,
            param,
        });
    }

    /// Whether `ip` is this device's address (or the unspecified address).
    fn check_local_ip(&self, ip: IpAddr) -> Result<()> {
        let ip = ip.to_canonical();
        if ip.is_unspecified() || ip == self.local_ip() {
            Ok(())
        } else {
            Err(errno_error(
                rustix::io::Errno::ADDRNOTAVAIL,
                format!("{ip} is not this device's address"),
            ))
        }
    }

    /// Binds under both locks (`st` held by the caller).
    fn bind_locked(&self, st: &mut IdState, addr: SocketAddr) -> Result<()> {
        if st.bound.is_some() {
            return Err(Error::InvalidArgument("the id is already bound".into()));
        }
        self.check_local_ip(addr.ip())?;
        let mut cm = self.cm().lock();
        let port = if addr.port() == 0 {
            let mut pick = None;
            for _ in 0..1024 {
                let p = rand::random_range(32768..=60999u16);
                if !cm.ports.contains_key(&(self.ps, p)) {
                    pick = Some(p);
                    break;
                }
            }
            pick.ok_or(Error::Exhausted("ephemeral ports"))?
        } else {
            if cm.ports.contains_key(&(self.ps, addr.port())) {
                return Err(errno_error(
                    rustix::io::Errno::ADDRINUSE,
                    format!("port {} is bound", addr.port()),
                ));
            }
            addr.port()
        };
        cm.ports.insert((self.ps, port), self.handle);
        st.bound = Some(SocketAddr::new(addr.ip().to_canonical(), port));
        Ok(())
    }

    fn unspecified(&self) -> SocketAddr {
        let ip = match self.local_ip() {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        SocketAddr::new(ip, 0)
    }

    /// The GID index of the device's RoCE v2 GID (its address).
    fn sgid_index(&self) -> u8 {
        let me = Gid::from(self.local_ip());
        self.dev
            .info
            .gids
            .iter()
            .position(|g| g.gid_type == GidType::RoceV2 && g.gid == me)
            .or_else(|| {
                self.dev
                    .info
                    .gids
                    .iter()
                    .position(|g| g.gid_type == GidType::RoceV2)
            })
            .unwrap_or(0) as u8
    }

    fn ah_attr(&self, peer: IpAddr, p: Option<&QpParams>) -> AhAttr {
        AhAttr {
            dgid: Gid::from(peer.to_canonical()),
            flow_label: p.map_or(0, |p| p.flow_label),
            sgid_index: self.sgid_index(),
            hop_limit: p.map_or(64, |p| p.hop_limit.max(1)),
            traffic_class: p.map_or(0, |p| p.traffic_class),
            is_global: true,
            sl: p.map_or(0, |p| p.sl),
            port_num: 1,
            ..AhAttr::default()
        }
    }

    /// The attributes for `state` of a QP of `qp_type`, given the negotiated `p`.
    fn qp_attr(
        &self,
        qp_type: QpType,
        state: QpState,
        p: Option<&QpParams>,
    ) -> Result<(QpAttr, QpAttrMask)> {
        use QpAttrMask as M;
        let mut a = QpAttr {
            qp_state: state,
            port_num: 1,
            pkey_index: 0,
            ..QpAttr::default()
        };
        let need = || {
            p.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "init_qp_attr({state:?}): the peer's parameters are not known yet"
                ))
            })
        };
        let mask = match (qp_type, state) {
            (QpType::Ud, QpState::Init) => {
                a.qkey = RDMA_UDP_QKEY;
                M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY
            }
            (QpType::Ud, QpState::Rtr) => M::STATE,
            (QpType::Ud, QpState::Rts) => {
                a.sq_psn = 0;
                M::STATE | M::SQ_PSN
            }
            (_, QpState::Init) => {
                // As rdma_cm: the remote rights a connection may need (the memory
                // regions' own rights still decide what a peer may touch).
                a.qp_access_flags = if qp_type == QpType::Uc {
                    AccessFlags::REMOTE_WRITE
                } else {
                    AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_ATOMIC
                };
                M::RC_TO_INIT
            }
            (_, QpState::Rtr) => {
                let p = need()?;
                a.path_mtu = p.path_mtu;
                a.dest_qp_num = p.remote_qpn;
                a.rq_psn = p.rq_psn;
                a.max_dest_rd_atomic = p.max_dest_rd_atomic;
                a.min_rnr_timer = 12;
                a.ah_attr = self.ah_attr(p.peer, Some(p));
                if qp_type == QpType::Uc {
                    M::UC_TO_RTR
                } else {
                    M::RC_TO_RTR
                }
            }
            (_, QpState::Rts) => {
                let p = need()?;
                a.sq_psn = p.sq_psn;
                a.timeout = p.timeout;
                a.retry_cnt = p.retry_cnt;
                a.rnr_retry = p.rnr_retry;
                a.max_rd_atomic = p.max_rd_atomic;
                if qp_type == QpType::Uc {
                    M::UC_TO_RTS
                } else {
                    M::RC_TO_RTS
                }
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "init_qp_attr: the CM gives attributes for INIT, RTR and RTS, not {state:?}"
                )));
            }
        };
        Ok((a, mask))
    }

    /// Moves `qp` from where it is up to RTS with `p` (RC/UC) or the UD defaults.
    fn bring_up(&self, qp: &Arc<dyn QueuePair>, p: Option<&QpParams>) -> Result<()> {
        let t = qp.qp_type();
        loop {
            let next = match qp.state() {
                QpState::Reset => QpState::Init,
                QpState::Init => QpState::Rtr,
                QpState::Rtr => QpState::Rts,
                QpState::Rts => return Ok(()),
                s => {
                    return Err(Error::InvalidArgument(format!(
                        "the id's QP is in {s:?}; the CM moves it from RESET, INIT or RTR"
                    )));
                }
            };
            let (attr, mask) = self.qp_attr(t, next, p)?;
            qp.modify(&attr, mask)?;
        }
    }

    fn qp_err(qp: &Option<Arc<dyn QueuePair>>) {
        if let Some(qp) = qp
            && !matches!(qp.state(), QpState::Reset | QpState::Err)
        {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = qp.modify(&attr, QpAttrMask::STATE);
        }
    }

    /// An agent event about this id's connection.
    fn on_event(&self, cm: &CmDevice, now: Instant, ev: Event) {
        match ev {
            Event::ConnectReply { conn, rep } => {
                let qp = {
                    let mut st = self.lock();
                    if st.conn != Some(conn) {
                        return;
                    }
                    if st.qp.is_none() {
                        st.phase = Phase::ConnectResponse;
                    }
                    st.qp.clone()
                };
                let params = cm.lock().agent.qp_params(conn);
                let peer = PeerConnParam {
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    flow_control: rep.end_to_end_flow_control,
                    retry_count: params.map_or(0, |p| p.retry_cnt),
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    qp_num: rep.local_qpn,
                };
                let Some(qp) = qp else {
                    self.event(
                        CmEventKind::ConnectResponse,
                        0,
                        rep.private_data,
                        CmEventParam::Conn(peer),
                    );
                    return;
                };
                let up = self.bring_up(&qp, params.as_ref());
                let est = up.and_then(|()| cm.with(|st| st.agent.establish(conn, &[])));
                match est {
                    Ok(()) => {
                        self.lock().phase = Phase::Connected;
                        self.wake();
                        self.event(
                            CmEventKind::Established,
                            0,
                            rep.private_data,
                            CmEventParam::Conn(peer),
                        );
                    }
                    Err(e) => {
                        let _ = cm.with(|st| {
                            st.agent
                                .reject(now, conn, rej_reason::CONSUMER_DEFINED, &[])
                        });
                        self.wake();
                        Self::qp_err(&Some(qp));
                        self.lock().phase = Phase::Failed;
                        self.event(
                            CmEventKind::ConnectError,
                            -e.errno(),
                            Vec::new(),
                            CmEventParam::None,
                        );
                    }
                }
            }
            Event::Established { private_data, .. } => {
                self.lock().phase = Phase::Connected;
                self.event(
                    CmEventKind::Established,
                    0,
                    private_data,
                    CmEventParam::None,
                );
            }
            Event::Rejected {
                reason,
                private_data,
                ..
            } => {
                let qp = self.fail();
                Self::qp_err(&qp);
                self.event(
                    CmEventKind::Rejected,
                    i32::from(reason),
                    private_data,
                    CmEventParam::None,
                );
            }
            Event::Unreachable { status, .. } => {
                let qp = self.fail();
                Self::qp_err(&qp);
                self.event(
                    CmEventKind::Unreachable,
                    status,
                    Vec::new(),
                    CmEventParam::None,
                );
            }
            Event::ConnectError { status, .. } => {
                let qp = self.fail();
                Self::qp_err(&qp);
                self.event(
                    CmEventKind::ConnectError,
                    status,
                    Vec::new(),
                    CmEventParam::None,
                );
            }
            Event::Disconnected {
                status,
                private_data,
                ..
            } => {
                let qp = {
                    let mut st = self.lock();
                    st.phase = Phase::Disconnected;
                    st.qp.clone()
                };
                Self::qp_err(&qp);
                self.event(
                    CmEventKind::Disconnected,
                    status,
                    private_data,
                    CmEventParam::None,
                );
            }
            Event::TimewaitExit { conn } => {
                if conn != 0 && self.lock().phase == Phase::Disconnected {
                    self.event(CmEventKind::TimewaitExit, 0, Vec::new(), CmEventParam::None);
                }
            }
            Event::SidrResolved {
                qpn,
                qkey,
                private_data,
                ..
            } => {
                let peer = {
                    let mut st = self.lock();
                    st.phase = Phase::Connected;
                    st.peer
                };
                let Some(peer) = peer else {
                    return;
                };
                let ud = UdParam {
                    qp_num: qpn,
                    qkey,
                    ah_attr: self.ah_attr(peer.ip(), None),
                };
                self.event(
                    CmEventKind::Established,
                    0,
                    private_data,
                    CmEventParam::Ud(ud),
                );
            }
            Event::ConnectRequest { .. } => {}
        }
    }

    fn fail(&self) -> Option<Arc<dyn QueuePair>> {
        let mut st = self.lock();
        st.phase = Phase::Failed;
        st.conn = None;
        st.qp.clone()
    }

    fn device_ca_guid(&self) -> u64 {
        self.dev.info.node_guid
    }
}

impl Drop for SoftCmId {
    fn drop(&mut self) {
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        let (conn, bound, qp, phase) = (st.conn, st.bound, st.qp.take(), st.phase);
        let now = Instant::now();
        let cm = &self.cm;
        let (before, after) = cm.with(|s| {
            let before = CmDevice::queued(s);
            s.ids = s.ids.saturating_sub(1);
            if let Some(b) = bound
                && s.ports.get(&(self.ps, b.port())) == Some(&self.handle)
            {
                s.ports.remove(&(self.ps, b.port()));
            }
            if phase == Phase::Listening {
                s.listeners.remove(&self.handle);
                s.agent.unlisten(self.handle);
                if let (Some(h), Some(b)) = (&self.dev.host, bound) {
                    let _ = h.listen(self.ps.service_id(b.port()), false);
                }
            }
            if let Some(c) = conn {
                if s.conns.get(&c).is_some_and(|w| w.strong_count() == 0) {
                    s.conns.remove(&c);
                }
                s.agent.release(now, c);
            }
            (before, CmDevice::queued(s))
        });
        if matches!(phase, Phase::Connected | Phase::Accepted) {
            Self::qp_err(&qp);
        }
        if after > before {
            // A destroyed connected id sends its DREQ (a pending one its REJ) before the
            // destruction returns, as `rdma_destroy_id` does.
            self.wake_and_send(after);
        } else {
            self.dev.wake(GSI_QPN);
        }
    }
}

impl CmId for SoftCmId {
    fn handle(&self) -> u64 {
        self.handle
    }

    fn port_space(&self) -> PortSpace {
        self.ps
    }

    fn context(&self) -> Arc<dyn Context> {
        Arc::new(crate::verbs::context::SoftContext::alias(
            self.dev.clone(),
            self.cm.clone(),
        ))
    }

    fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.lock();
        self.bind_locked(&mut st, addr)
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.lock().bound
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.lock().peer
    }

    fn listen(&self, backlog: u32) -> Result<()> {
        let mut st = self.lock();
        if !matches!(st.phase, Phase::Idle | Phase::Listening) {
            return Err(Error::InvalidArgument(format!(
                "listen: the id is {:?}",
                st.phase
            )));
        }
        if st.bound.is_none() {
            self.bind_locked(&mut st, self.unspecified())?;
        }
        let Some(bound) = st.bound else {
            return Err(Error::InvalidArgument("listen: not bound".into()));
        };
        let ip = (!bound.ip().is_unspecified()).then_some(bound.ip());
        let sid = self.ps.service_id(bound.port());
        // On the host's shared device one process listens on a service: the others'
        // requests for it are steered to it (`io::host`).
        if st.phase == Phase::Idle
            && let Some(h) = &self.dev.host
        {
            h.listen(sid, true).map_err(|e| {
                errno_error(
                    rustix::io::Errno::ADDRINUSE,
                    format!("listen: another process on this device listens on {bound}: {e}"),
                )
            })?;
        }
        let me = self.me.clone();
        let now = Instant::now();
        let work = {
            let mut cm = self.cm().lock();
            cm.agent.listen(self.handle, sid, ip, backlog);
            cm.listeners.insert(self.handle, me);
            // Requests that came a moment before this listen (`CmConfig::listen_grace`)
            // are this listener's now.
            cm.agent.claim_unclaimed(now);
            CmDevice::drain(&mut cm, now)
        };
        st.phase = Phase::Listening;
        drop(st);
        if !work.is_empty() {
            self.cm().deliver(now, work);
            self.dev.wake(GSI_QPN);
        }
        Ok(())
    }

    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout: Duration,
    ) -> Result<()> {
        let mut st = self.lock();
        if !matches!(
            st.phase,
            Phase::Idle | Phase::AddrResolved | Phase::RouteResolved
        ) {
            return Err(Error::InvalidArgument(format!(
                "resolve_addr: the id is {:?}",
                st.phase
            )));
        }
        let dst = SocketAddr::new(dst.ip().to_canonical(), dst.port());
        if dst.is_ipv4() != self.local_ip().is_ipv4() || dst.ip().is_unspecified() {
            drop(st);
            self.event(CmEventKind::AddrError, -22, Vec::new(), CmEventParam::None);
            return Ok(());
        }
        if st.bound.is_none() {
            let src = src.unwrap_or_else(|| self.unspecified());
            self.bind_locked(&mut st, src)?;
        } else if let Some(src) = src {
            self.check_local_ip(src.ip())?;
        }
        // Resolved, the id's source address is the device's (rdma_get_local_addr).
        if let Some(b) = st.bound.filter(|b| b.ip().is_unspecified()) {
            st.bound = Some(SocketAddr::new(self.local_ip(), b.port()));
        }
        st.peer = Some(dst);
        st.phase = Phase::AddrResolved;
        drop(st);
        self.event(CmEventKind::AddrResolved, 0, Vec::new(), CmEventParam::None);
        Ok(())
    }

    fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        let mut st = self.lock();
        if !matches!(st.phase, Phase::AddrResolved | Phase::RouteResolved) {
            return Err(Error::InvalidArgument(
                "resolve_route: resolve the address first".into(),
            ));
        }
        st.phase = Phase::RouteResolved;
        drop(st);
        self.event(
            CmEventKind::RouteResolved,
            0,
            Vec::new(),
            CmEventParam::None,
        );
        Ok(())
    }

    fn set_qp(&self, qp: Option<Arc<dyn QueuePair>>) -> Result<()> {
        if let Some(qp) = &qp {
            let any: Arc<dyn Any + Send + Sync> = qp.clone();
            let soft = any
                .downcast::<crate::verbs::qp::SoftQp>()
                .map_err(|_| Error::InvalidArgument("QP of another provider".into()))?;
            let port: Arc<dyn QpPort> = soft;
            if !self.dev.engine.owns(&port) {
                return Err(Error::InvalidArgument("QP of another device".into()));
            }
            let want_ud = self.ps.qp_type() == QpType::Ud;
            if (qp.qp_type() == QpType::Ud) != want_ud {
                return Err(Error::InvalidArgument(format!(
                    "a {:?} QP in the {:?} port space",
                    qp.qp_type(),
                    self.ps
                )));
            }
        }
        self.lock().qp = qp;
        Ok(())
    }

    fn qp(&self) -> Option<Arc<dyn QueuePair>> {
        self.lock().qp.clone()
    }

    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let (conn, qp_type) = {
            let st = self.lock();
            let t = st.qp.as_ref().map_or(self.ps.qp_type(), |q| q.qp_type());
            (st.conn, t)
        };
        let params = conn.and_then(|c| self.cm().lock().agent.qp_params(c));
        self.qp_attr(qp_type, state, params.as_ref())
    }

    fn connect(&self, param: &ConnParam) -> Result<()> {
        let sidr = self.ps == PortSpace::Udp;
        if sidr {
            check_private_data(
                param.private_data.len(),
                PrivateDataLimit::SIDR_REQ,
                "SIDR REQ",
            )?;
        } else {
            check_private_data(param.private_data.len(), PrivateDataLimit::REQ, "REQ")?;
        }
        let mut st = self.lock();
        if !matches!(st.phase, Phase::AddrResolved | Phase::RouteResolved) {
            return Err(Error::InvalidArgument(format!(
                "connect: resolve the address and route first (the id is {:?})",
                st.phase
            )));
        }
        let (Some(src), Some(dst)) = (st.bound, st.peer) else {
            return Err(Error::InvalidArgument("connect: not resolved".into()));
        };
        let src = if src.ip().is_unspecified() {
            SocketAddr::new(self.local_ip(), src.port())
        } else {
            src
        };
        let qpn = match &st.qp {
            Some(qp) => {
                if sidr {
                    self.bring_up(qp, None)?;
                } else if qp.state() == QpState::Reset {
                    let (a, m) = self.qp_attr(qp.qp_type(), QpState::Init, None)?;
                    qp.modify(&a, m)?;
                }
                qp.qp_num()
            }
            None => param.qp_num,
        };
        let args = ConnectArgs {
            ps: self.ps,
            src,
            dst,
            qpn,
            param,
            mtu: self.dev.port.active_mtu,
            ca_guid: self.device_ca_guid(),
        };
        let now = Instant::now();
        let me = self.me.clone();
        let conn = self.cm().with(|cm| {
            let conn = cm.agent.connect(now, &args)?;
            cm.conns.insert(conn, me);
            Ok::<u32, Error>(conn)
        })?;
        st.conn = Some(conn);
        st.phase = Phase::Connecting;
        drop(st);
        self.wake();
        Ok(())
    }

    fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut st = self.lock();
        let limit = if st.sidr {
            PrivateDataLimit::SIDR_REP
        } else {
            PrivateDataLimit::REP
        };
        check_private_data(param.private_data.len(), limit, "REP")?;
        let (Phase::Requested, Some(conn)) = (st.phase, st.conn) else {
            return Err(Error::InvalidArgument(format!(
                "accept: no connection request on this id (it is {:?})",
                st.phase
            )));
        };
        let now = Instant::now();
        let qpn = match st.qp.clone() {
            Some(qp) => {
                let up = if st.sidr {
                    self.bring_up(&qp, None)
                } else {
                    let p = self.cm().lock().agent.accept_qp_params(conn, param);
                    self.bring_up(&qp, p.as_ref())
                };
                if let Err(e) = up {
                    let _ = self
                        .cm()
                        .with(|cm| cm.agent.reject(now, conn, rej_reason::NO_QP, &[]));
                    st.phase = Phase::Failed;
                    drop(st);
                    self.wake();
                    return Err(e);
                }
                qp.qp_num()
            }
            None => param.qp_num,
        };
        let guid = self.device_ca_guid();
        self.cm()
            .with(|cm| cm.agent.accept(now, conn, qpn, param, guid))?;
        st.phase = if st.sidr {
            Phase::Connected
        } else {
            Phase::Accepted
        };
        drop(st);
        self.wake();
        Ok(())
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        let limit = if st.sidr {
            PrivateDataLimit::SIDR_REP
        } else {
            PrivateDataLimit::REJ
        };
        check_private_data(private_data.len(), limit, "REJ")?;
        let (Phase::Requested | Phase::ConnectResponse, Some(conn)) = (st.phase, st.conn) else {
            return Err(Error::InvalidArgument(format!(
                "reject: no connection request on this id (it is {:?})",
                st.phase
            )));
        };
        let now = Instant::now();
        let queued = self.cm().with(|cm| {
            cm.agent
                .reject(now, conn, rej_reason::CONSUMER_DEFINED, private_data)
                .map(|()| CmDevice::queued(cm))
        })?;
        st.phase = Phase::Failed;
        drop(st);
        self.wake_and_send(queued);
        Ok(())
    }

    /// Sends what was posted to the id's QP first (see `SoftCmId::send_posted`), then
    /// moves the QP to ERR and sends the DREQ; returns once the DREQ has been handed to the
    /// socket (at most [`SEND_WAIT_LIMIT`] each), as kernel rdma_cm has sent it when
    /// `rdma_disconnect` returns.
    fn disconnect(&self) -> Result<()> {
        let check = |st: &IdState| match st.phase {
            Phase::Connected | Phase::Accepted | Phase::ConnectResponse => Ok(true),
            Phase::Disconnected => Ok(false),
            p => Err(Error::InvalidArgument(format!(
                "disconnect: the id is not connected ({p:?})"
            ))),
        };
        let qp = {
            let st = self.lock();
            if !check(&st)? || st.conn.is_none() {
                return Ok(());
            }
            st.qp.clone()
        };
        if let Some(qp) = &qp {
            self.send_posted(qp);
        }
        // The peer may have disconnected meanwhile (its DREQ handled on the progress
        // thread): look again.
        let mut st = self.lock();
        if !check(&st)? {
            return Ok(());
        }
        let Some(conn) = st.conn else {
            return Ok(());
        };
        Self::qp_err(&st.qp);
        if st.sidr || self.ps == PortSpace::Udp {
            st.phase = Phase::Disconnected;
            return Ok(());
        }
        let now = Instant::now();
        let r = self.cm().with(|cm| {
            cm.agent
                .disconnect(now, conn, &[])
                .map(|()| CmDevice::queued(cm))
        });
        if r.is_ok() && st.phase == Phase::ConnectResponse {
            st.phase = Phase::Disconnected;
        }
        drop(st);
        match r {
            Ok(queued) => {
                self.wake_and_send(queued);
                Ok(())
            }
            Err(e) => {
                self.wake();
                Err(e)
            }
        }
    }

    fn establish(&self) -> Result<()> {
        let mut st = self.lock();
        let (Phase::ConnectResponse, Some(conn)) = (st.phase, st.conn) else {
            return Err(Error::InvalidArgument(format!(
                "establish: no connect response on this id (it is {:?})",
                st.phase
            )));
        };
        self.cm().with(|cm| cm.agent.establish(conn, &[]))?;
        st.phase = Phase::Connected;
        drop(st);
        self.wake();
        Ok(())
    }
}
