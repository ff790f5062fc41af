//! RDMA CM ids (`rdma_cm_id`) and the calls on them.
//!
//! An id is a boxed [`RdmaId`]: the `rdma_cm_id` programs see first, then the library's
//! side ([`IdShared`]). It gets a device when it binds or resolves an address
//! ([`super::devices`]); from then on it holds the provider's CM id on that device (a
//! wildcard bind holds one per device: a listener on every device). The program writes
//! parts of its `rdma_cm_id` (`context`); the library writes the others in place through
//! raw pointers (`verbs`, `pd`, `route`, `qp`, `event`, `channel`), never holding a Rust
//! reference to the ABI struct.
//!
//! **Synchronous ids.** An id created without a channel (or by `rdma_create_ep`) gets a
//! private one; the calls that lead to an event (`rdma_resolve_addr`,
//! `rdma_resolve_route`, `rdma_connect`, `rdma_accept` on a connected port space,
//! `rdma_disconnect`, `rdma_get_request`) wait for it, leave it in `id->event` (acked by
//! the next such call or by `rdma_destroy_id`), and fail as librdmacm does: ECONNREFUSED
//! for a reject, the negated status for a negative one, the status otherwise.
//!
//! **Destroying** an id stops its events (unregisters its provider ids, drops those still
//! queued — a connection request not handed out is rejected), drops the provider ids
//! (the provider disconnects or rejects), then waits until every event handed out for it
//! is acked, as librdmacm's `rdma_destroy_id` does.

#![allow(unsafe_code)]

use super::abi::*;
use super::channel::{ChannelInner, Event, Pending, channel_from, free_channel, new_channel};
use super::devices::{self, CmDev};
use super::router;
use super::sockaddr::{sockaddr_to_std, std_to_storage};
use super::{errno_of, fail, guard_neg};
use crate::abi::*;
use core::ffi::{c_int, c_void};
use remem_verbs::cm::{CmEventKind, CmEventParam, CmId, ConnParam, PeerConnParam, PortSpace};
use remem_verbs::{Gid, QpState};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

symver!(
    "rdma_create_id" @ "RDMACM_1.0",
    "rdma_destroy_id" @ "RDMACM_1.0",
    "rdma_bind_addr" @ "RDMACM_1.0",
    "rdma_resolve_addr" @ "RDMACM_1.0",
    "rdma_resolve_route" @ "RDMACM_1.0",
    "rdma_listen" @ "RDMACM_1.0",
    "rdma_connect" @ "RDMACM_1.0",
    "rdma_accept" @ "RDMACM_1.0",
    "rdma_reject" @ "RDMACM_1.0",
    "rdma_reject_ece" @ "RDMACM_1.3",
    "rdma_disconnect" @ "RDMACM_1.0",
    "rdma_establish" @ "RDMACM_1.2",
    "rdma_notify" @ "RDMACM_1.0",
    "rdma_get_request" @ "RDMACM_1.0",
    "rdma_create_ep" @ "RDMACM_1.0",
    "rdma_destroy_ep" @ "RDMACM_1.0",
    "rdma_set_option" @ "RDMACM_1.0",
    "rdma_migrate_id" @ "RDMACM_1.0",
    "rdma_get_src_port" @ "RDMACM_1.0",
    "rdma_get_dst_port" @ "RDMACM_1.0",
    "rdma_init_qp_attr" @ "RDMACM_1.2",
    "rdma_set_local_ece" @ "RDMACM_1.3",
    "rdma_get_remote_ece" @ "RDMACM_1.3",
    "rdma_join_multicast" @ "RDMACM_1.0",
    "rdma_join_multicast_ex" @ "RDMACM_1.1",
    "rdma_leave_multicast" @ "RDMACM_1.0",
);

/// The backlog of a listener when the program gives none (as the kernel's rdma_ucm
/// `max_backlog`), and the most it may ask for.
pub const MAX_BACKLOG: u32 = 1024;

/// An id: what `rdma_create_id` returns a pointer to (`abi` first).
#[repr(C)]
pub struct RdmaId {
    /// The `rdma_cm_id` programs see.
    pub abi: rdma_cm_id,
    shared: Arc<IdShared>,
}

/// The library's side of an id.
pub struct IdShared {
    /// The `rdma_cm_id` (address).
    ptr: AtomicUsize,
    /// Its port space.
    pub ps: PortSpace,
    /// Its QP type (`IBV_QPT_UD` for the UDP and IPoIB port spaces).
    pub qp_type: ibv_qp_type,
    st: Mutex<IdState>,
    acked: Condvar,
}

impl std::fmt::Debug for IdShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdShared")
            .field("ps", &self.ps)
            .finish_non_exhaustive()
    }
}

/// The attributes a passive endpoint keeps for the QPs of its connections
/// (`rdma_create_ep` with `RAI_PASSIVE`).
#[derive(Clone, Copy)]
pub(crate) struct EpAttr {
    pub init: ibv_qp_init_attr,
}

// SAFETY: the pointers in the attributes (CQs, SRQ, the QP context) are the program's
// objects; the library only passes them back to its own calls on the program's behalf
// (`rdma_get_request` creating a QP), never dereferencing them on another thread.
unsafe impl Send for EpAttr {}

pub(crate) struct IdState {
    /// The channel the id's events go to now.
    pub channel: Arc<ChannelInner>,
    /// Its `rdma_event_channel` (address).
    pub channel_abi: usize,
    /// A synchronous id's private channel (address of the `rdma_event_channel`; 0 if
    /// none), freed with the id.
    pub private: usize,
    /// Whether the id is synchronous.
    pub sync: bool,
    /// The device, once bound to a specific address or resolved.
    pub dev: Option<Arc<CmDev>>,
    /// The provider ids: one, or one per device for a wildcard bind.
    pub cm: Vec<(Arc<CmDev>, Arc<dyn CmId>)>,
    /// Events handed out and not acked.
    pub outstanding: u32,
    /// A passive endpoint's QP attributes.
    pub ep: Option<EpAttr>,
    /// The peer's parameters from the connection request (for `rdma_accept(id, NULL)`).
    pub req: PeerConnParam,
    /// The CQs (and their channels) `rdma_create_qp` made for the id.
    pub own_cqs: bool,
    /// The path record `route.path_rec` points to.
    pub path: Option<Box<ibv_sa_path_rec>>,
    /// The ECE values set with `rdma_set_local_ece` (kept, not sent: no ECE here).
    pub local_ece: (u32, u32),
    /// An ESTABLISHED event was handed out for the id.
    pub connected: bool,
    /// A DISCONNECTED event was handed out for the id.
    pub disconnected: bool,
    /// The multicast groups joined (`rdma_join_multicast`).
    pub mcast: Vec<McJoin>,
}

/// A multicast group an id joined.
#[derive(Clone, Copy)]
pub(crate) struct McJoin {
    /// The group's IPv4 address.
    pub group: std::net::Ipv4Addr,
    /// The program's context pointer for the join (the event's `ud.private_data`).
    pub context: usize,
    /// Joined as a send-only full member: librdmacm attaches no QP.
    pub send_only: bool,
}

impl IdShared {
    fn new(ps: PortSpace, qp_type: ibv_qp_type, channel: Chan) -> IdShared {
        IdShared {
            ptr: AtomicUsize::new(0),
            ps,
            qp_type,
            st: Mutex::new(IdState {
                channel: channel.inner,
                channel_abi: channel.abi,
                private: channel.private,
                sync: channel.private != 0,
                dev: None,
                cm: Vec::new(),
                outstanding: 0,
                ep: None,
                req: PeerConnParam::default(),
                own_cqs: false,
                path: None,
                local_ece: (0, 0),
                connected: false,
                disconnected: false,
                mcast: Vec::new(),
            }),
            acked: Condvar::new(),
        }
    }

    /// The id's state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `rdma_cm_id` programs see.
    pub fn abi_ptr(&self) -> *mut rdma_cm_id {
        self.ptr.load(Ordering::Acquire) as *mut rdma_cm_id
    }

    /// Queues a provider event on the id's current channel (the router, with the routes
    /// locked).
    pub(crate) fn queue(&self, p: Pending) {
        let st = self.state();
        st.channel.push(p);
    }

    /// Counts an event handed out.
    fn event_out(&self) {
        self.state().outstanding += 1;
    }

    /// Counts the ack of an event.
    pub(crate) fn event_acked(&self) {
        let mut st = self.state();
        st.outstanding = st.outstanding.saturating_sub(1);
        self.acked.notify_all();
    }

    /// Waits until every event handed out for the id is acked.
    fn wait_acked(&self) {
        let mut st = self.state();
        while st.outstanding > 0 {
            st = self.acked.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The single provider id (EINVAL before the id has a device).
    pub(crate) fn cm(&self) -> Result<(Arc<CmDev>, Arc<dyn CmId>), c_int> {
        let st = self.state();
        match (&st.dev, st.cm.as_slice()) {
            (Some(_), [(d, c)]) => Ok((Arc::clone(d), Arc::clone(c))),
            _ => Err(libc::EINVAL),
        }
    }
}

/// A channel for a new id: the program's, or a private one.
struct Chan {
    inner: Arc<ChannelInner>,
    abi: usize,
    private: usize,
}

impl Chan {
    /// The program's channel, or (NULL) a new private one.
    fn of(channel: *mut rdma_event_channel) -> Result<Chan, c_int> {
        if channel.is_null() {
            let ch = new_channel()?;
            // SAFETY: the channel just made.
            let inner = unsafe { channel_from(ch) }.ok_or(libc::EINVAL)?;
            Ok(Chan {
                inner,
                abi: ch as usize,
                private: ch as usize,
            })
        } else {
            // SAFETY: a live channel of the program, by the callers' contract.
            let inner = unsafe { channel_from(channel) }.ok_or(libc::EINVAL)?;
            Ok(Chan {
                inner,
                abi: channel as usize,
                private: 0,
            })
        }
    }
}

/// The library's side of a program's id; `None` for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; the reference must not outlive it.
pub(crate) unsafe fn id_from<'a>(id: *mut rdma_cm_id) -> Option<&'a Arc<IdShared>> {
    // SAFETY: by the contract, a non-NULL `id` is the first field of a boxed `RdmaId`;
    // the reference covers the library's part only.
    unsafe { id.cast::<RdmaId>().as_ref().map(|r| &r.shared) }
}

/// A zeroed `rdma_route`.
fn no_route() -> rdma_route {
    // SAFETY: plain data (addresses, GIDs, a NULL pointer, integers): all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// Boxes a new id; the pointer programs see.
fn boxed(
    shared: Arc<IdShared>,
    channel_abi: usize,
    context: *mut c_void,
    ps: PortSpace,
) -> *mut rdma_cm_id {
    let abi = rdma_cm_id {
        verbs: std::ptr::null_mut(),
        channel: channel_abi as *mut rdma_event_channel,
        context,
        qp: std::ptr::null_mut(),
        route: no_route(),
        ps: rdma_port_space::from(ps.value()),
        port_num: 0,
        event: std::ptr::null_mut(),
        send_cq_channel: std::ptr::null_mut(),
        send_cq: std::ptr::null_mut(),
        recv_cq_channel: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        pd: std::ptr::null_mut(),
        qp_type: shared.qp_type,
    };
    let raw = Box::into_raw(Box::new(RdmaId {
        abi,
        shared: Arc::clone(&shared),
    }));
    shared.ptr.store(raw as usize, Ordering::Release);
    raw.cast()
}

/// Creates an id (`rdma_create_id`, and `rdma_create_ep`'s with a QP type).
pub(crate) fn create_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: PortSpace,
    qp_type: ibv_qp_type,
) -> Result<*mut rdma_cm_id, c_int> {
    devices::count()?;
    let chan = Chan::of(channel)?;
    let abi = chan.abi;
    let shared = Arc::new(IdShared::new(ps, qp_type, chan));
    Ok(boxed(shared, abi, context, ps))
}

/// The QP type of a port space's ids.
fn qp_type_of(ps: PortSpace) -> ibv_qp_type {
    match ps {
        PortSpace::Udp | PortSpace::Ipoib => IBV_QPT_UD,
        PortSpace::Tcp | PortSpace::Ib => IBV_QPT_RC,
    }
}

// ----- the ABI fields the library writes --------------------------------------------------

/// Writes `f(&mut field)` into the id's ABI struct in place.
macro_rules! set {
    ($id:expr, $field:ident, $value:expr) => {{
        let p = $id;
        let v = $value;
        // SAFETY: a live id of this library (the callers' contract); the field is
        // written in place, no reference to the struct is made.
        unsafe { (&raw mut (*p).$field).write(v) }
    }};
}

/// The GID of an IP address on RoCE (IPv4-mapped for IPv4).
fn gid_of(ip: IpAddr) -> ibv_gid {
    ibv_gid {
        raw: Gid::from(ip.to_canonical()).0,
    }
}

/// Sets the id's source address (and `ibaddr.sgid`).
///
/// # Safety
///
/// `id` is a live id of this library.
unsafe fn set_src(id: *mut rdma_cm_id, a: SocketAddr) {
    let (ss, _) = std_to_storage(a);
    // SAFETY: by the contract; fields written in place.
    unsafe {
        (&raw mut (*id).route.addr.u_src_addr.src_storage).write(ss);
        (&raw mut (*id).route.addr.addr.ibaddr.sgid).write(gid_of(a.ip()));
        (&raw mut (*id).route.addr.addr.ibaddr.pkey).write(0xffff_u16.to_be());
    }
}

/// Sets the id's destination address (and `ibaddr.dgid`).
///
/// # Safety
///
/// `id` is a live id of this library.
unsafe fn set_dst(id: *mut rdma_cm_id, a: SocketAddr) {
    let (ss, _) = std_to_storage(a);
    // SAFETY: by the contract; fields written in place.
    unsafe {
        (&raw mut (*id).route.addr.u_dst_addr.dst_storage).write(ss);
        (&raw mut (*id).route.addr.addr.ibaddr.dgid).write(gid_of(a.ip()));
    }
}

/// Gives the id its device: `verbs`, the default `pd` (unless the program gave one),
/// `port_num`.
fn attach_dev(id: &IdShared, st: &mut IdState, dev: &Arc<CmDev>, port: u8) -> Result<(), c_int> {
    let pd = dev.default_pd()?;
    let p = id.abi_ptr();
    set!(p, verbs, dev.verbs());
    // SAFETY: a live id; reading one pointer field the library also writes.
    if unsafe { (*p).pd }.is_null() {
        set!(p, pd, pd);
    }
    set!(p, port_num, port);
    st.dev = Some(Arc::clone(dev));
    Ok(())
}

/// Copies the provider id's addresses into `route.addr`.
fn update_addrs(id: &IdShared, cm: &Arc<dyn CmId>) {
    let p = id.abi_ptr();
    if let Some(a) = cm.local_addr() {
        // SAFETY: a live id.
        unsafe { set_src(p, a) };
    }
    if let Some(a) = cm.peer_addr() {
        // SAFETY: a live id.
        unsafe { set_dst(p, a) };
    }
}

/// Sets `route.path_rec` to the one path to the resolved peer (RoCE has no subnet
/// administrator: the record says what the devices use).
fn set_path(id: &IdShared, st: &mut IdState) {
    let p = id.abi_ptr();
    // SAFETY: a live id; reading the GIDs the library wrote.
    let (sgid, dgid) = unsafe {
        (
            (*p).route.addr.addr.ibaddr.sgid,
            (*p).route.addr.addr.ibaddr.dgid,
        )
    };
    let mtu = st
        .dev
        .as_ref()
        .and_then(|d| d.dev.query_port(1).ok())
        .map_or(IBV_MTU_1024, |a| a.active_mtu as ibv_mtu);
    let rec = Box::new(ibv_sa_path_rec {
        dgid,
        sgid,
        dlid: 0,
        slid: 0,
        raw_traffic: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
        reversible: 1,
        numb_path: 1,
        pkey: 0xffff_u16.to_be(),
        sl: 0,
        mtu_selector: 2,
        mtu: mtu as u8,
        rate_selector: 2,
        rate: IBV_RATE_10_GBPS as u8,
        packet_life_time_selector: 2,
        packet_life_time: 18,
        preference: 0,
    });
    let ptr = (&raw const *rec).cast_mut();
    st.path = Some(rec);
    set!(p, route, {
        // SAFETY: a live id; copying the route to change two fields.
        let mut r = unsafe { (*p).route };
        r.path_rec = ptr;
        r.num_paths = 1;
        r
    });
}

/// Re-reads the state of the id's QP into its `ibv_qp.state` (the CM moved it).
fn refresh_qp_state(id: &IdShared) {
    let p = id.abi_ptr();
    // SAFETY: a live id; reading the QP pointer the library wrote.
    let qp = unsafe { (*p).qp };
    // SAFETY: a QP the library attached, live while the id holds it.
    if let Some(h) = unsafe { crate::ffi::handles::Handle::<crate::qp::Qp>::from_abi(qp) } {
        h.set_state(h.inner().qp.state());
    }
}

// ----- events -----------------------------------------------------------------------------

/// Creates the id of a connection request (the router, with the routes locked): on the
/// listener's device, its channel (a private one if the listener is synchronous), its
/// port space; registered at once so its own events find it. `None` if it cannot be
/// made (the request is then dropped, which rejects it).
pub(crate) fn new_child(
    listener: &Arc<IdShared>,
    ev: &remem_verbs::cm::CmEvent,
    routes: &mut router::Routes,
) -> Option<usize> {
    let lst = listener.state();
    let listen_handle = ev.listen_id.as_ref()?.handle();
    let dev = lst
        .cm
        .iter()
        .find(|(_, c)| c.handle() == listen_handle)
        .map(|(d, _)| Arc::clone(d))
        .or_else(|| devices::by_context(&ev.id.context()))?;
    let chan = if lst.sync {
        Chan::of(std::ptr::null_mut()).ok()?
    } else {
        Chan {
            inner: Arc::clone(&lst.channel),
            abi: lst.channel_abi,
            private: 0,
        }
    };
    drop(lst);
    let abi = chan.abi;
    let shared = Arc::new(IdShared::new(listener.ps, listener.qp_type, chan));
    let p = boxed(Arc::clone(&shared), abi, std::ptr::null_mut(), listener.ps);
    {
        let mut st = shared.state();
        if attach_dev(&shared, &mut st, &dev, ev.id.port_num()).is_err() {
            drop(st);
            // SAFETY: the id just made, seen by nobody.
            unsafe { free_unseen(p) };
            return None;
        }
        st.cm.push((dev, Arc::clone(&ev.id)));
        if let CmEventParam::Conn(c) = &ev.param {
            st.req = *c;
        }
    }
    update_addrs(&shared, &ev.id);
    routes.insert(ev.id.handle(), Arc::downgrade(&shared));
    Some(p as usize)
}

/// Frees an id no program has seen (a connection request dropped before it was handed
/// out): its provider id is dropped (the request is rejected).
///
/// # Safety
///
/// `id` is an id of this library the program never saw; not used afterwards.
unsafe fn free_unseen(id: *mut rdma_cm_id) {
    // SAFETY: by the contract, the Box made by `boxed`.
    let b = unsafe { Box::from_raw(id.cast::<RdmaId>()) };
    let (cms, private) = {
        let mut st = b.shared.state();
        (std::mem::take(&mut st.cm), std::mem::take(&mut st.private))
    };
    {
        let mut routes = router::routes();
        for (_, c) in &cms {
            routes.remove(&c.handle());
        }
    }
    drop(cms);
    if private != 0 {
        // SAFETY: the id's own private channel.
        unsafe { free_channel(private as *mut rdma_event_channel) };
    }
}

/// The program's view of the peer's connection parameters: the peer's initiator depth is
/// what it asks of this side's responder resources, and the other way round.
fn conn_to_abi(c: &PeerConnParam) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: c.initiator_depth,
        initiator_depth: c.responder_resources,
        flow_control: u8::from(c.flow_control),
        retry_count: c.retry_count,
        rnr_retry_count: c.rnr_retry_count,
        srq: u8::from(c.srq),
        qp_num: c.qp_num,
    }
}

/// Turns a queued provider event into the event handed to the program (boxed; freed by
/// `rdma_ack_cm_event`), updating the ids it concerns. `None` drops it.
pub(crate) fn hand_out(p: Pending) -> Option<*mut rdma_cm_event> {
    let Pending { target, ev, child } = p;
    let tp = target.abi_ptr();
    let mut out = Box::new(Event {
        // SAFETY: plain data (pointers, integers, a union of them): all-zero is valid.
        abi: unsafe { std::mem::zeroed() },
        private_data: ev.private_data.clone(),
        counted: Arc::clone(&target),
    });
    out.abi.id = tp;
    out.abi.event = ev.kind.value();
    out.abi.status = ev.status;
    match ev.kind {
        CmEventKind::ConnectRequest => {
            let c = child? as *mut rdma_cm_id;
            // SAFETY: both live ids of this library; the child is not yet the program's,
            // the listener's `context` is the program's value, read once.
            unsafe { (&raw mut (*c).context).write((*tp).context) };
            out.abi.id = c;
            out.abi.listen_id = tp;
        }
        CmEventKind::AddrResolved => {
            if let Ok((_, cm)) = target.cm() {
                update_addrs(&target, &cm);
            }
        }
        CmEventKind::RouteResolved => {
            if let Ok((_, cm)) = target.cm() {
                update_addrs(&target, &cm);
            }
            let mut st = target.state();
            set_path(&target, &mut st);
        }
        CmEventKind::Established | CmEventKind::Disconnected => {
            {
                let mut st = target.state();
                if ev.kind == CmEventKind::Established {
                    st.connected = true;
                } else {
                    st.disconnected = true;
                }
            }
            refresh_qp_state(&target);
        }
        CmEventKind::Rejected | CmEventKind::ConnectError | CmEventKind::Unreachable => {
            refresh_qp_state(&target)
        }
        CmEventKind::MulticastJoin => {
            // librdmacm's `ucma_process_join`: the id's QP (unless a send-only join) is
            // attached to the group as the event is taken; a failure turns the event into
            // MULTICAST_ERROR.
            if let CmEventParam::Ud(u) = &ev.param
                && let Some(join) = find_join(&target, &u.ah_attr.dgid)
                && !join.send_only
            {
                // SAFETY: `tp` is the live id; its `qp` is NULL or the program's QP.
                let qp = unsafe { (*tp).qp };
                if !qp.is_null() {
                    let gid = ibv_gid {
                        raw: u.ah_attr.dgid.0,
                    };
                    // SAFETY: a QP of this library and a GID on the stack.
                    let r = unsafe { crate::ffi::queues::remem_ibv_ibv_attach_mcast(qp, &gid, 0) };
                    if r != 0 {
                        out.abi.event = CmEventKind::MulticastError.value();
                        out.abi.status = -r;
                    } else {
                        notify(&format!("joined {}", u.ah_attr.dgid.to_ip()));
                    }
                }
            }
        }
        _ => {}
    }
    let ev_kind = ev.kind;
    let mc_context = match &ev.param {
        CmEventParam::Ud(u) if ev_kind == CmEventKind::MulticastJoin => {
            find_join(&target, &u.ah_attr.dgid).map_or(0, |j| j.context)
        }
        _ => 0,
    };
    // The parameters: `ud` for the datagram port spaces, `conn` otherwise.
    if target.qp_type == IBV_QPT_UD || ev_kind == CmEventKind::MulticastJoin {
        // SAFETY: plain data; all-zero is valid.
        let mut ud: rdma_ud_param = unsafe { std::mem::zeroed() };
        if let CmEventParam::Ud(u) = &ev.param {
            ud.qp_num = u.qp_num;
            ud.qkey = u.qkey;
            let mut ah = u.ah_attr;
            if let Some(d) = target.state().dev.as_ref() {
                // SAFETY: the device's context, open for the life of the process.
                if let Some(c) = unsafe { crate::context::ctx_from(d.verbs()) } {
                    ah.sgid_index = c.shared().program_gid_index(ah.sgid_index).unwrap_or(0);
                }
            }
            ud.ah_attr = crate::ah::ah_attr_to(&ah);
        }
        out.abi.param.ud = ud;
    } else {
        let conn = match &ev.param {
            CmEventParam::Conn(c) => conn_to_abi(c),
            // SAFETY: plain data; all-zero is valid.
            _ => unsafe { std::mem::zeroed() },
        };
        out.abi.param.conn = conn;
    }
    drop(ev);
    let len = out.private_data.len().min(usize::from(u8::MAX));
    let data = if len == 0 {
        std::ptr::null()
    } else {
        out.private_data.as_ptr().cast::<c_void>()
    };
    // `private_data` and `private_data_len` lie at the same offsets in `conn` and `ud`;
    // write both views.
    if matches!(
        ev_kind,
        CmEventKind::MulticastJoin | CmEventKind::MulticastError
    ) {
        // A join's event carries the join's context, as librdmacm fills it.
        out.abi.param.ud.private_data = mc_context as *const c_void;
        out.abi.param.ud.private_data_len = 0;
    } else if target.qp_type == IBV_QPT_UD {
        out.abi.param.ud.private_data = data;
        out.abi.param.ud.private_data_len = len as u8;
    } else {
        out.abi.param.conn.private_data = data;
        out.abi.param.conn.private_data_len = len as u8;
    }
    target.event_out();
    Some(Box::into_raw(out).cast())
}

/// A synchronous id's wait for the event of the call just made (`ucma_complete` in
/// librdmacm): acks the previous `id->event`, takes the next event of its private
/// channel into `id->event`, and fails as librdmacm does. 0 at once for an id with a
/// program's channel.
fn complete(id: &Arc<IdShared>) -> c_int {
    let (sync, channel) = {
        let st = id.state();
        (st.sync, Arc::clone(&st.channel))
    };
    if !sync {
        return 0;
    }
    ack_own_event(id);
    let ev = loop {
        match channel.wait() {
            Ok(p) => {
                if let Some(ev) = hand_out(p) {
                    break ev;
                }
            }
            Err(e) => return fail(e),
        }
    };
    set!(id.abi_ptr(), event, ev);
    // SAFETY: the event just handed out.
    let (kind, status) = unsafe { ((*ev).event, (*ev).status) };
    match (kind, status) {
        (RDMA_CM_EVENT_REJECTED, _) => fail(libc::ECONNREFUSED),
        (_, s) if s < 0 => fail(-s),
        (_, s) if s > 0 => fail(s),
        (RDMA_CM_EVENT_ADDR_ERROR | RDMA_CM_EVENT_ROUTE_ERROR, _) => fail(libc::EHOSTUNREACH),
        (RDMA_CM_EVENT_UNREACHABLE, _) => fail(libc::ETIMEDOUT),
        (RDMA_CM_EVENT_CONNECT_ERROR, _) => fail(libc::ECONNRESET),
        _ => 0,
    }
}

/// Acks the event a synchronous call left in `id->event`, if any.
fn ack_own_event(id: &IdShared) {
    let p = id.abi_ptr();
    // SAFETY: a live id; the field is the library's in synchronous use.
    let ev = unsafe { (*p).event };
    if !ev.is_null() {
        set!(p, event, std::ptr::null_mut());
        // SAFETY: an event handed out by this library, not acked yet.
        unsafe { super::channel::ack(ev) };
    }
}

// ----- create, destroy --------------------------------------------------------------------

/// `rdma_create_id`: a new id on `channel` (NULL: synchronous). -1 with errno: EINVAL
/// (NULL `id`, unknown port space), ENODEV (no devices).
///
/// # Safety
///
/// `channel` is NULL or a live channel; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard_neg("rdma_create_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let ps = match devices::port_space(ps) {
            Ok(ps) => ps,
            Err(e) => return fail(e),
        };
        match create_id(channel, context, ps, qp_type_of(ps)) {
            Ok(p) => {
                // SAFETY: non-NULL and writable by the contract.
                unsafe { id.write(p) };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// Destroys an id (see the module documentation).
///
/// # Safety
///
/// `id` is a live id of this library, not used afterwards.
pub(crate) unsafe fn destroy(id: *mut rdma_cm_id) {
    // SAFETY: by the contract.
    let Some(shared) = (unsafe { id_from(id) }).cloned() else {
        return;
    };
    let (cms, purged) = {
        let mut routes = router::routes();
        let mut st = shared.state();
        for (_, c) in &st.cm {
            routes.remove(&c.handle());
        }
        let purged = st.channel.take_for(&shared);
        // The new ids of connection requests never handed out: unregister them now,
        // free them below.
        for p in &purged {
            if let Some(c) = p.child {
                // SAFETY: a child id made by the router, not yet the program's.
                if let Some(cs) = unsafe { id_from(c as *mut rdma_cm_id) } {
                    for (_, cm) in &cs.state().cm {
                        routes.remove(&cm.handle());
                    }
                }
            }
        }
        (std::mem::take(&mut st.cm), purged)
    };
    for p in purged {
        if let Some(c) = p.child {
            // SAFETY: as above; its CONNECT_REQUEST is gone with `purged`.
            unsafe { free_unseen(c as *mut rdma_cm_id) };
        }
    }
    drop(cms);
    ack_own_event(&shared);
    shared.wait_acked();
    let private = std::mem::take(&mut shared.state().private);
    if private != 0 {
        // SAFETY: the id's own private channel, used by nothing else now.
        unsafe { free_channel(private as *mut rdma_event_channel) };
    }
    // SAFETY: the Box made by `boxed`; the program does not use the id afterwards.
    drop(unsafe { Box::from_raw(id.cast::<RdmaId>()) });
}

/// `rdma_destroy_id`: destroys the id once its events are acked (the program destroys
/// its QP first, as the man page requires). -1/EINVAL for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_destroy_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: by the contract.
        unsafe { destroy(id) };
        0
    })
}

// ----- addresses --------------------------------------------------------------------------

/// Binds `addr` on the devices it covers (one provider id per device; the first picks
/// the port when `addr`'s is 0, the others take the same).
fn bind(id: &Arc<IdShared>, addr: SocketAddr) -> Result<(), c_int> {
    if !id.state().cm.is_empty() {
        return Err(libc::EINVAL);
    }
    let devs = devices::for_bind(addr.ip())?;
    let wildcard = addr.ip().is_unspecified();
    let mut made: Vec<(Arc<CmDev>, Arc<dyn CmId>)> = Vec::new();
    let mut port = addr.port();
    for d in &devs {
        let cm = d.create_cm_id(id.ps)?;
        router::routes().insert(cm.handle(), Arc::downgrade(id));
        let r = cm.bind(SocketAddr::new(addr.ip(), port));
        made.push((Arc::clone(d), Arc::clone(&cm)));
        if let Err(e) = r {
            let mut routes = router::routes();
            for (_, c) in &made {
                routes.remove(&c.handle());
            }
            return Err(errno_of(&e));
        }
        if port == 0 {
            port = cm.local_addr().map_or(0, |a| a.port());
        }
    }
    let first = Arc::clone(&made[0].1);
    {
        let mut st = id.state();
        if !wildcard {
            attach_dev(id, &mut st, &made[0].0, first.port_num())?;
        }
        st.cm = made;
    }
    let local = first
        .local_addr()
        .unwrap_or_else(|| SocketAddr::new(addr.ip(), port));
    // SAFETY: a live id.
    unsafe { set_src(id.abi_ptr(), local) };
    Ok(())
}

/// `rdma_bind_addr`: binds a local address (the unspecified address: every device).
/// -1 with errno: EINVAL (NULL, another family, already bound), EADDRNOTAVAIL (no device
/// has the address), EADDRINUSE.
///
/// # Safety
///
/// `id` is NULL or a live id; `addr` is NULL or a socket address of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg("rdma_bind_addr", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { id_from(id) }, unsafe { sockaddr_to_std(addr) }) else {
            return fail(libc::EINVAL);
        };
        match bind(s, a) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// A duration of `ms` milliseconds (a negative value counts as 0).
fn millis(ms: c_int) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn resolve_addr(
    id: &Arc<IdShared>,
    src: Option<SocketAddr>,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<(), c_int> {
    let cm = {
        // Lock order: the routes, then the id.
        let mut routes = router::routes();
        let mut st = id.state();
        if st.dev.is_none() {
            let dev = if !st.cm.is_empty() {
                // Bound to the wildcard: keep the device that reaches `dst`.
                let dev = devices::for_dst(dst.ip())?;
                let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut st.cm)
                    .into_iter()
                    .partition(|(d, _)| Arc::ptr_eq(d, &dev));
                for (_, c) in &gone {
                    routes.remove(&c.handle());
                }
                if keep.is_empty() {
                    return Err(libc::EADDRNOTAVAIL);
                }
                st.cm = keep;
                dev
            } else {
                match src.filter(|s| !s.ip().is_unspecified()) {
                    Some(s) => devices::for_src(s.ip())?,
                    None => devices::for_dst(dst.ip())?,
                }
            };
            if st.cm.is_empty() {
                let cm = dev.create_cm_id(id.ps)?;
                routes.insert(cm.handle(), Arc::downgrade(id));
                st.cm.push((Arc::clone(&dev), cm));
            }
            let port = st.cm[0].1.port_num();
            attach_dev(id, &mut st, &dev, port)?;
        }
        match st.cm.as_slice() {
            [(_, c)] => Arc::clone(c),
            _ => return Err(libc::EINVAL),
        }
    };
    // SAFETY: a live id.
    unsafe { set_dst(id.abi_ptr(), dst) };
    cm.resolve_addr(src, dst, timeout).map_err(|e| errno_of(&e))
}

/// `rdma_resolve_addr`: resolves `dst` to a device (see [`super::devices`]) and, for a
/// synchronous id, waits for the result. -1 with errno: EINVAL, EADDRNOTAVAIL (`src`
/// is no device's), ENODEV (no device reaches `dst`'s family), or the resolution's.
///
/// # Safety
///
/// `id` is NULL or a live id; `src_addr` and `dst_addr` are NULL or socket addresses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard_neg("rdma_resolve_addr", || {
        // SAFETY: by the contract.
        let (Some(s), Some(dst)) = (unsafe { id_from(id) }, unsafe { sockaddr_to_std(dst_addr) })
        else {
            return fail(libc::EINVAL);
        };
        // SAFETY: by the contract.
        let src = unsafe { sockaddr_to_std(src_addr) };
        if !src_addr.is_null() && src.is_none() {
            return fail(libc::EINVAL);
        }
        match resolve_addr(s, src, dst, millis(timeout_ms)) {
            Ok(()) => complete(s),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_resolve_route`: resolves the route to the resolved address (synchronous ids
/// wait). -1/EINVAL before the address is resolved.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    guard_neg("rdma_resolve_route", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        let r = s.cm().and_then(|(_, cm)| {
            cm.resolve_route(millis(timeout_ms))
                .map_err(|e| errno_of(&e))
        });
        match r {
            Ok(()) => complete(s),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_listen`: listens on the bound address (unbound: every device, a free port).
/// A backlog of 0 or less, or above 1024, is 1024 (as the kernel's rdma_ucm).
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard_neg("rdma_listen", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if s.state().cm.is_empty() {
            let any: SocketAddr = (std::net::Ipv4Addr::UNSPECIFIED, 0).into();
            if let Err(e) = bind(s, any) {
                return fail(e);
            }
        }
        let backlog = u32::try_from(backlog)
            .ok()
            .filter(|b| (1..=MAX_BACKLOG).contains(b))
            .unwrap_or(MAX_BACKLOG);
        let cms: Vec<_> = s.state().cm.iter().map(|(_, c)| Arc::clone(c)).collect();
        for c in &cms {
            if let Err(e) = c.listen(backlog) {
                return fail(errno_of(&e));
            }
        }
        if let Some(a) = cms.first().and_then(|c| c.local_addr()) {
            // SAFETY: a live id.
            unsafe { set_src(s.abi_ptr(), a) };
            notify(&format!("listening {a}"));
        }
        0
    })
}

/// The environment variable naming a file (typically a FIFO) that hears of every
/// listener: one line `listening IP:PORT` per successful `rdma_listen`, and of every
/// multicast receiver: one line `joined GROUP` per MULTICAST_JOIN event taken whose QP was
/// attached to the group. Scripts and tests start a client once the server listens or
/// receives (a CM service or a multicast group has no socket to watch).
pub const NOTIFY_ENV: &str = "REMEM_RDMACM_NOTIFY";

/// Writes a line to `$REMEM_RDMACM_NOTIFY`, if set (failures are ignored: no reader on a
/// FIFO, a path that cannot be opened).
fn notify(line: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(path) = std::env::var_os(NOTIFY_ENV) else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// `rdma_get_src_port`: the bound port, network order (0 unbound).
///
/// # Safety
///
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: a live id; the route's source address is an address structure.
    unsafe { port_of((&raw const (*id).route.addr.u_src_addr).cast()) }
}

/// `rdma_get_dst_port`: the peer's port, network order (0 before it is known).
///
/// # Safety
///
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: a live id; the route's destination address is an address structure.
    unsafe { port_of((&raw const (*id).route.addr.u_dst_addr).cast()) }
}

/// The port of a socket address, network order (0 for another family).
///
/// # Safety
///
/// `sa` points to a `sockaddr_storage`.
unsafe fn port_of(sa: *const libc::sockaddr_storage) -> u16 {
    // SAFETY: by the contract.
    let family = c_int::from(unsafe { (*sa).ss_family });
    match family {
        // SAFETY: an AF_INET storage holds a sockaddr_in.
        libc::AF_INET => unsafe { (*sa.cast::<libc::sockaddr_in>()).sin_port },
        // SAFETY: an AF_INET6 storage holds a sockaddr_in6.
        libc::AF_INET6 => unsafe { (*sa.cast::<libc::sockaddr_in6>()).sin6_port },
        _ => 0,
    }
}

// ----- connections ------------------------------------------------------------------------

/// The connection parameters of `rdma_connect` / `rdma_accept` (librdmacm's defaults and
/// checks: responder resources and initiator depth within the device's limits,
/// `RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH` meaning "as many as the device allows").
fn make_conn_param(
    id: &IdShared,
    dev: &CmDev,
    p: *const rdma_conn_param,
    accepting: bool,
) -> Result<ConnParam, c_int> {
    let ip = id.abi_ptr();
    // SAFETY: a live id; reading the QP pointer the library wrote.
    let qp = unsafe { (*ip).qp };
    // SAFETY: NULL or the program's parameters, readable by the contract.
    let prm = unsafe { p.as_ref() };
    let tcp = id.ps == PortSpace::Tcp;
    if tcp && qp.is_null() && prm.is_none() {
        return Err(libc::EINVAL);
    }
    let req = id.state().req;
    let (max_rr, max_id) = (dev.max_responder_resources, dev.max_initiator_depth);
    let mut out = ConnParam {
        responder_resources: if accepting {
            req.initiator_depth.min(max_rr)
        } else {
            max_rr
        },
        initiator_depth: if accepting {
            req.responder_resources.min(max_id)
        } else {
            max_id
        },
        ..ConnParam::default()
    };
    if let Some(c) = prm {
        if tcp
            && ((c.responder_resources != RDMA_MAX_RESP_RES && c.responder_resources > max_rr)
                || (c.initiator_depth != RDMA_MAX_INIT_DEPTH && c.initiator_depth > max_id))
        {
            return Err(libc::EINVAL);
        }
        if c.responder_resources != RDMA_MAX_RESP_RES {
            out.responder_resources = c.responder_resources;
        }
        if c.initiator_depth != RDMA_MAX_INIT_DEPTH {
            out.initiator_depth = c.initiator_depth;
        }
        out.flow_control = c.flow_control != 0;
        out.retry_count = c.retry_count.min(7);
        out.rnr_retry_count = c.rnr_retry_count.min(7);
        out.srq = c.srq != 0;
        out.qp_num = c.qp_num;
        if !c.private_data.is_null() && c.private_data_len > 0 {
            // SAFETY: the program's private data of `private_data_len` bytes.
            out.private_data = unsafe {
                std::slice::from_raw_parts(
                    c.private_data.cast::<u8>(),
                    usize::from(c.private_data_len),
                )
            }
            .to_vec();
        }
    }
    // SAFETY: the id's QP, when it has one, is a live QP of this library.
    if let Some(q) = unsafe { crate::ffi::handles::qp_from(qp) } {
        out.qp_num = q.qp.qp_num();
        // SAFETY: as above; reading its SRQ pointer.
        out.srq = !unsafe { (*qp).srq }.is_null();
    }
    Ok(out)
}

/// What `rdma_connect` and `rdma_accept` share: the id `id` names, its connection
/// parameters from `conn_param` (accepting or not), and `call` (the CM's connect or
/// accept) made with them; the id, or the errno to fail with.
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable.
unsafe fn with_conn_param<'a>(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
    accepting: bool,
    call: impl FnOnce(&dyn CmId, &ConnParam) -> remem_verbs::Result<()>,
) -> Result<&'a Arc<IdShared>, c_int> {
    // SAFETY: by the contract.
    let s = unsafe { id_from(id) }.ok_or(libc::EINVAL)?;
    let (dev, cm) = s.cm()?;
    let prm = make_conn_param(s, &dev, conn_param, accepting)?;
    call(&*cm, &prm).map_err(|e| errno_of(&e))?;
    Ok(s)
}

/// `rdma_connect`: requests a connection (a UD service resolution in the UDP port space);
/// a synchronous id waits until it is established. -1 with errno: EINVAL (no route, bad
/// parameters), ECONNREFUSED (rejected), ETIMEDOUT (unreachable), ...
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard_neg("rdma_connect", || {
        // SAFETY: by the contract.
        match unsafe { with_conn_param(id, conn_param, false, |cm, prm| cm.connect(prm)) } {
            Ok(s) => complete(s),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_accept`: accepts the connection request of this id (NULL parameters: the
/// request's, within the device's limits); a synchronous id waits until the connection
/// is established (in the UDP port space it does not wait, as librdmacm).
///
/// # Safety
///
/// `id` is NULL or a live id; `conn_param` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard_neg("rdma_accept", || {
        // SAFETY: by the contract.
        let s = match unsafe { with_conn_param(id, conn_param, true, |cm, prm| cm.accept(prm)) } {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        if s.qp_type == IBV_QPT_UD {
            if s.state().sync {
                ack_own_event(s);
            }
            return 0;
        }
        complete(s)
    })
}

fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: by the callers' contract.
    let Some(s) = (unsafe { id_from(id) }) else {
        return fail(libc::EINVAL);
    };
    let bytes = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the program's `len` bytes of private data.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
    };
    match s
        .cm()
        .and_then(|(_, cm)| cm.reject(&bytes).map_err(|e| errno_of(&e)))
    {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `rdma_reject`: rejects the connection request of this id with private data (the peer
/// sees `RDMA_CM_EVENT_REJECTED`, status 28: consumer reject).
///
/// # Safety
///
/// `id` is NULL or a live id; `private_data` is NULL or `private_data_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard_neg("rdma_reject", || reject(id, private_data, private_data_len))
}

/// `rdma_reject_ece`: as `rdma_reject` (there is no ECE to refuse here).
///
/// # Safety
///
/// As `rdma_reject`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard_neg("rdma_reject_ece", || {
        reject(id, private_data, private_data_len)
    })
}

/// `rdma_disconnect`: disconnects (the QP moves to ERR, both sides get
/// `RDMA_CM_EVENT_DISCONNECTED`); a synchronous id waits for its event. As on kernel
/// rdma_cm, what the program posted before the call reaches the peer (the provider sends it
/// before the QP moves to ERR), and the DREQ has left when the call returns, so a program
/// may destroy everything and exit at once (`tests/teardown_c.rs`).
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_disconnect", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        match s
            .cm()
            .and_then(|(_, cm)| cm.disconnect().map_err(|e| errno_of(&e)))
        {
            Ok(()) => {
                refresh_qp_state(s);
                complete(s)
            }
            Err(e) => {
                // The provider refuses because the connection is already going down: the
                // peer's disconnection crossed ours (both ends of rdma_server/rdma_client
                // disconnect). librdmacm's kernel answers that with success (it sends the
                // reply); so does this library, and a synchronous id waits for the
                // DISCONNECTED event on its way, unless it had it already.
                let (connected, disconnected, sync) = {
                    let st = s.state();
                    (st.connected, st.disconnected, st.sync)
                };
                if !connected {
                    return fail(e);
                }
                refresh_qp_state(s);
                if sync && !disconnected {
                    return complete(s);
                }
                0
            }
        }
    })
}

/// `rdma_establish`: completes a connection whose QP the program manages, after
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`. -1/EINVAL if the id has a QP.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_establish", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: a live id; reading the QP pointer.
        if !unsafe { (*id).qp }.is_null() {
            return fail(libc::EINVAL);
        }
        match s
            .cm()
            .and_then(|(_, cm)| cm.establish().map_err(|e| errno_of(&e)))
        {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_notify`: `IBV_EVENT_COMM_EST` (data arrived before the connection's last
/// message) is accepted — the CM here completes the connection when that message
/// arrives; other events are EINVAL, as the kernel's CM answers.
///
/// # Safety
///
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_notify(
    id: *mut rdma_cm_id,
    event: ibv_event_type,
) -> c_int {
    guard_neg("rdma_notify", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if s.cm().is_err() || event != IBV_EVENT_COMM_EST {
            return fail(libc::EINVAL);
        }
        0
    })
}

// ----- synchronous endpoints --------------------------------------------------------------

/// `rdma_get_request`: the next connection request of a synchronous listener (waiting
/// for one); the new id holds the request in `id->event` and, for an endpoint made with
/// QP attributes, a QP. -1 with errno: EINVAL (not synchronous, another event),
/// ECONNREFUSED, or the event's status.
///
/// # Safety
///
/// `listen` is NULL or a live id; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard_neg("rdma_get_request", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(listen) }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let (sync, channel, ep) = {
            let st = s.state();
            (st.sync, Arc::clone(&st.channel), st.ep)
        };
        if !sync {
            return fail(libc::EINVAL);
        }
        ack_own_event(s);
        let ev = loop {
            match channel.wait() {
                Ok(p) => {
                    if let Some(ev) = hand_out(p) {
                        break ev;
                    }
                }
                Err(e) => return fail(e),
            }
        };
        // SAFETY: the event just handed out.
        let (kind, status, child) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let err = match (kind, status) {
            (RDMA_CM_EVENT_REJECTED, _) => Some(libc::ECONNREFUSED),
            (_, s) if s != 0 => Some(s.abs()),
            (RDMA_CM_EVENT_CONNECT_REQUEST, _) => None,
            _ => Some(libc::EINVAL),
        };
        if let Some(e) = err {
            set!(listen, event, ev);
            return fail(e);
        }
        if let Some(ep) = ep {
            let mut attr = ep.init;
            // SAFETY: a live id; reading the PD the endpoint was given.
            let pd = unsafe { (*listen).pd };
            // SAFETY: the new id (live), the listener's PD and a local attribute copy.
            let r = unsafe { super::qp::remem_ibv_rdma_create_qp(child, pd, &mut attr) };
            if r != 0 {
                let e = crate::ffi::errno();
                set!(listen, event, ev);
                return fail(e);
            }
        }
        set!(child, event, ev);
        // SAFETY: non-NULL and writable by the contract.
        unsafe { id.write(child) };
        0
    })
}

/// `rdma_create_ep`: a synchronous id for `res` (from `rdma_getaddrinfo`): passive
/// (`RAI_PASSIVE`), bound to `res->ai_src_addr`, keeping `pd` and `qp_init_attr` for the
/// QPs of its connections; active, with the address and route resolved and (given
/// `qp_init_attr`) a QP. -1 with errno.
///
/// # Safety
///
/// `id` is NULL or writable; `res` is NULL or a valid `rdma_addrinfo`; `pd` is NULL or
/// a live PD; `qp_init_attr` is NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_ep", || {
        // SAFETY: by the contract.
        let Some(r) = (unsafe { res.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let ps = match u32::try_from(r.ai_port_space)
            .map_err(|_| libc::EINVAL)
            .and_then(devices::port_space)
        {
            Ok(ps) => ps,
            Err(e) => return fail(e),
        };
        let qp_type = if r.ai_qp_type == 0 {
            qp_type_of(ps)
        } else {
            r.ai_qp_type as ibv_qp_type
        };
        let cm_id = match create_id(std::ptr::null_mut(), std::ptr::null_mut(), ps, qp_type) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        // SAFETY: the id just made.
        let rc = unsafe { setup_ep(cm_id, r, pd, qp_init_attr) };
        if rc != 0 {
            let e = crate::ffi::errno();
            // SAFETY: the id just made, never the program's.
            unsafe { remem_ibv_rdma_destroy_ep(cm_id) };
            return fail(e);
        }
        // SAFETY: non-NULL and writable by the contract.
        unsafe { id.write(cm_id) };
        0
    })
}

/// The rest of `rdma_create_ep` on the new id.
///
/// # Safety
///
/// As `rdma_create_ep`; `id` is the new id.
unsafe fn setup_ep(
    id: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the new id, live.
    let Some(s) = (unsafe { id_from(id) }) else {
        return fail(libc::EINVAL);
    };
    if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: the program's addrinfo (a socket address or NULL).
        let Some(a) = (unsafe { sockaddr_to_std(r.ai_src_addr) }) else {
            return fail(libc::EINVAL);
        };
        if let Err(e) = bind(s, a) {
            return fail(e);
        }
        if !pd.is_null() {
            set!(id, pd, pd);
        }
        // SAFETY: NULL or readable by the contract.
        if let Some(init) = unsafe { qp_init_attr.as_ref() } {
            let mut init = *init;
            init.qp_type = s.qp_type;
            s.state().ep = Some(EpAttr { init });
        }
        return 0;
    }
    // SAFETY: the program's addrinfo (socket addresses or NULL).
    let (src, dst) = unsafe {
        (
            sockaddr_to_std(r.ai_src_addr),
            sockaddr_to_std(r.ai_dst_addr),
        )
    };
    let Some(dst) = dst else {
        return fail(libc::EINVAL);
    };
    if let Err(e) = resolve_addr(s, src, dst, Duration::from_millis(2000)) {
        return fail(e);
    }
    if complete(s) != 0 {
        return -1;
    }
    match s.cm().and_then(|(_, cm)| {
        cm.resolve_route(Duration::from_millis(2000))
            .map_err(|e| errno_of(&e))
    }) {
        Ok(()) => {
            if complete(s) != 0 {
                return -1;
            }
        }
        Err(e) => return fail(e),
    }
    // SAFETY: NULL or readable and writable by the contract.
    if let Some(init) = unsafe { qp_init_attr.as_mut() } {
        init.qp_type = s.qp_type;
        // SAFETY: the live id, the program's PD or NULL, its attributes.
        return unsafe { super::qp::remem_ibv_rdma_create_qp(id, pd, init) };
    }
    0
}

/// `rdma_destroy_ep`: destroys the endpoint's QP and SRQ (and the CQs made for them),
/// then the id.
///
/// # Safety
///
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_destroy_ep(id: *mut rdma_cm_id) {
    crate::ffi::guard(
        "rdma_destroy_ep",
        || (),
        || {
            if id.is_null() {
                return;
            }
            // SAFETY: a live id by the contract.
            unsafe {
                if !(*id).qp.is_null() {
                    super::qp::remem_ibv_rdma_destroy_qp(id);
                }
                if !(*id).srq.is_null() {
                    super::qp::remem_ibv_rdma_destroy_srq(id);
                }
                destroy(id);
            }
        },
    )
}

// ----- options, migration, QP attributes --------------------------------------------------

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` and `RDMA_OPTION_ID_ACK_TIMEOUT` (a `uint8_t`),
/// `RDMA_OPTION_ID_REUSEADDR` and `RDMA_OPTION_ID_AFONLY` (an `int`) are accepted (the
/// soft device does not use them); `RDMA_OPTION_IB_PATH` is ENOSYS (RoCE resolves its own
/// route); anything else, or a wrong `optlen`, is EINVAL.
///
/// # Safety
///
/// `id` is NULL or a live id; `optval` is NULL or `optlen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard_neg("rdma_set_option", || {
        if id.is_null() || optval.is_null() {
            return fail(libc::EINVAL);
        }
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => 0,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY)
                if optlen == size_of::<c_int>() =>
            {
                0
            }
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::ENOSYS),
            _ => fail(libc::EINVAL),
        }
    })
}

/// `rdma_migrate_id`: moves the id (and its queued events) to `channel` (NULL: a private
/// channel, making it synchronous), waiting until the events handed out on the old one
/// are acked. -1/EINVAL for a synchronous id asked to stay synchronous.
///
/// # Safety
///
/// `id` is NULL or a live id; `channel` is NULL or a live channel.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard_neg("rdma_migrate_id", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if s.state().sync {
            if channel.is_null() {
                return fail(libc::EINVAL);
            }
            ack_own_event(s);
        }
        let chan = match Chan::of(channel) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let old_private = {
            let _routes = router::routes();
            let mut st = s.state();
            let moved = st.channel.take_for(s);
            for p in moved {
                chan.inner.push(p);
            }
            st.channel = Arc::clone(&chan.inner);
            st.channel_abi = chan.abi;
            st.sync = chan.private != 0;
            std::mem::replace(&mut st.private, chan.private)
        };
        set!(id, channel, chan.abi as *mut rdma_event_channel);
        s.wait_acked();
        if old_private != 0 {
            // SAFETY: the id's former private channel, used by nothing else now.
            unsafe { free_channel(old_private as *mut rdma_event_channel) };
        }
        0
    })
}

/// `rdma_init_qp_attr`: the attributes (and mask) that move the id's QP to
/// `qp_attr->qp_state`, as the CM negotiated them. -1/EINVAL before the id has a device
/// or when the state cannot be reached yet.
///
/// # Safety
///
/// `id` is NULL or a live id; `qp_attr` is NULL or readable and writable; `qp_attr_mask`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard_neg("rdma_init_qp_attr", || {
        // SAFETY: by the contract.
        let (Some(s), Some(a)) = (unsafe { id_from(id) }, unsafe { qp_attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        if qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        let state = match a.qp_state {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            _ => return fail(libc::EINVAL),
        };
        let (dev, cm) = match s.cm() {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let (mut attr, mask) = match cm.init_qp_attr(state) {
            Ok(x) => x,
            Err(e) => return fail(errno_of(&e)),
        };
        // SAFETY: the device's context, open for the life of the process.
        if let Some(c) = unsafe { crate::context::ctx_from(dev.verbs()) } {
            attr.ah_attr.sgid_index = c
                .shared()
                .program_gid_index(attr.ah_attr.sgid_index)
                .unwrap_or(0);
        }
        *a = crate::qp::qp_attr_to(&attr);
        // SAFETY: non-NULL and writable by the contract.
        unsafe { qp_attr_mask.write(mask.bits() as c_int) };
        0
    })
}

/// `rdma_set_local_ece`: kept (no ECE is exchanged here). -1/EINVAL as librdmacm: NULL
/// arguments, an id with a QP, a zero vendor id, a comp_mask.
///
/// # Safety
///
/// `id` is NULL or a live id; `ece` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard_neg("rdma_set_local_ece", || {
        // SAFETY: by the contract.
        let (Some(s), Some(e)) = (unsafe { id_from(id) }, unsafe { ece.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: a live id.
        if !unsafe { (*id).qp }.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
            return fail(libc::EINVAL);
        }
        s.state().local_ece = (e.vendor_id, e.options);
        0
    })
}

/// `rdma_get_remote_ece`: no ECE comes from the peer here (vendor id 0). -1/EINVAL for
/// NULL arguments or an id with a QP.
///
/// # Safety
///
/// `id` is NULL or a live id; `ece` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard_neg("rdma_get_remote_ece", || {
        // SAFETY: by the contract.
        if unsafe { id_from(id) }.is_none() || ece.is_null() || !unsafe { (*id).qp }.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-NULL and writable by the contract.
        unsafe {
            ece.write(ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            })
        };
        0
    })
}

/// The join of `target` whose group is multicast GID `mgid`.
fn find_join(target: &IdShared, mgid: &Gid) -> Option<McJoin> {
    let IpAddr::V4(group) = mgid.to_ip() else {
        return None;
    };
    target
        .state()
        .mcast
        .iter()
        .find(|j| j.group == group)
        .copied()
}

/// The RoCE v2 multicast GID of an IPv4 group (`::ffff:a.b.c.d`, the kernel's
/// `cma_iboe_set_mgid` for RoCE v2).
fn mgid_of(group: std::net::Ipv4Addr) -> Gid {
    Gid(group.to_ipv6_mapped().octets())
}

/// `rdma_join_multicast`: `rdma_join_multicast_ex` with `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `addr` is NULL or a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    let mut attr = rdma_cm_join_mc_attr_ex {
        comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
        join_flags: RDMA_MC_JOIN_FLAG_FULLMEMBER,
        addr,
    };
    // SAFETY: by the contract; `attr` is on the stack.
    unsafe { remem_ibv_rdma_join_multicast_ex(id, &mut attr, context) }
}

/// `rdma_join_multicast_ex`: joins the IPv4 multicast group `attr->addr` on the id's device
/// (bound or resolved), as the kernel does for RoCE v2: a MULTICAST_JOIN event follows
/// whose `ud` parameters address the group (the MGID `::ffff:a.b.c.d` as `dgid`,
/// `is_global`, hop limit 64, QPN 0xFFFFFF, Q_Key `RDMA_UDP_QKEY`) and whose
/// `ud.private_data` is `context`; taking that event attaches the id's QP to the group (none
/// for a `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` join), as librdmacm does. -1 with EINVAL
/// (no address or join flags, an address that is not IPv4 multicast, an id not bound to a
/// device, a group joined already), EOPNOTSUPP (an IPv6 group), ENOSYS (an unknown flag).
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `attr` is NULL or valid, its `addr` NULL or a
/// valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard_neg("rdma_join_multicast_ex", || {
        // SAFETY: by the contract.
        let Some(shared) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-NULL and valid by the contract.
        let a = unsafe { attr.read() };
        let need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        if a.comp_mask & need != need {
            return fail(libc::EINVAL);
        }
        let send_only = match a.join_flags {
            f if f == RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
            f if f == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
            _ => return fail(libc::ENOSYS),
        };
        // SAFETY: NULL or a valid socket address by the contract.
        let group = match unsafe { sockaddr_to_std(a.addr) }.map(|s| s.ip().to_canonical()) {
            Some(IpAddr::V4(g)) if g.is_multicast() => g,
            Some(IpAddr::V6(g)) if g.is_multicast() => return fail(libc::EOPNOTSUPP),
            _ => return fail(libc::EINVAL),
        };
        let Ok((dev, cm)) = shared.cm() else {
            return fail(libc::EINVAL);
        };
        let sgid_index = cm
            .local_addr()
            .map(|l| Gid::from(l.ip().to_canonical()))
            .and_then(|me| {
                // SAFETY: the device's context, open for the life of the process.
                let c = unsafe { crate::context::ctx_from(dev.verbs()) }?;
                c.shared()
                    .dev
                    .info()
                    .gids
                    .iter()
                    .position(|g| g.gid == me && g.gid_type == remem_verbs::GidType::RoceV2)
            })
            .unwrap_or(0) as u8;
        {
            let mut st = shared.state();
            if st.mcast.iter().any(|j| j.group == group) {
                return fail(libc::EADDRINUSE);
            }
            st.mcast.push(McJoin {
                group,
                context: context as usize,
                send_only,
            });
        }
        let ud = remem_verbs::cm::UdParam {
            qp_num: 0x00ff_ffff,
            qkey: RDMA_UDP_QKEY,
            ah_attr: remem_verbs::AhAttr {
                dgid: mgid_of(group),
                is_global: true,
                hop_limit: 64,
                sgid_index,
                port_num: 1,
                ..remem_verbs::AhAttr::default()
            },
        };
        shared.queue(Pending {
            target: Arc::clone(shared),
            ev: remem_verbs::cm::CmEvent {
                kind: CmEventKind::MulticastJoin,
                id: cm,
                listen_id: None,
                status: 0,
                private_data: Vec::new(),
                param: CmEventParam::Ud(ud),
            },
            child: None,
        });
        complete(shared)
    })
}

/// `rdma_leave_multicast`: leaves a group joined with `rdma_join_multicast(_ex)`, detaching
/// the id's QP first as librdmacm does (not for a send-only join). -1 with EADDRNOTAVAIL
/// for a group the id has not joined, EINVAL for a NULL id or address.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `addr` is NULL or a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg("rdma_leave_multicast", || {
        // SAFETY: by the contract.
        let Some(shared) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: NULL or a valid socket address by the contract.
        let Some(IpAddr::V4(group)) =
            (unsafe { sockaddr_to_std(addr) }).map(|s| s.ip().to_canonical())
        else {
            return fail(libc::EADDRNOTAVAIL);
        };
        let join = {
            let mut st = shared.state();
            let Some(at) = st.mcast.iter().position(|j| j.group == group) else {
                return fail(libc::EADDRNOTAVAIL);
            };
            st.mcast.remove(at)
        };
        // SAFETY: `id` is live; its `qp` is NULL or the program's QP.
        let qp = unsafe { (*id).qp };
        if !qp.is_null() && !join.send_only {
            let gid = ibv_gid {
                raw: mgid_of(group).0,
            };
            // SAFETY: a QP of this library and a GID on the stack. (Not attached — the
            // join's event was never taken — is no error here, as in librdmacm.)
            let _ = unsafe { crate::ffi::queues::remem_ibv_ibv_detach_mcast(qp, &gid, 0) };
        }
        0
    })
}
