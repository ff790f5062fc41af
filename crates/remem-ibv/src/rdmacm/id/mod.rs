//! RDMA CM ids (`rdma_cm_id`) and the calls on them.
//!
//! An id is a boxed [`RdmaId`]: the `rdma_cm_id` programs see first, then the library's
//! side ([`IdShared`]). It gets a device when it binds or resolves an address
//! ([`super::devices`]); from then on it holds the provider's CM id on that device (a
//! wildcard bind holds one per device: a listener on every device). The program writes
//! parts of its `rdma_cm_id` (`context`); the library writes the others in place
//! (`verbs`, `pd`, `route`, `qp`, `event`, `channel`) through the methods of
//! `crate::ffi::handles::Handle<RdmaId>`, never holding a Rust reference to the ABI
//! struct; `IdShared::handle` is the id of a library side.
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

#![forbid(unsafe_code)]

use super::abi::*;
use super::router;

use super::{errno_of, fail};
use crate::abi::*;
use crate::rdmacm::channel::{ChannelInner, Event, Pending, new_channel};
use crate::rdmacm::devices::{self, CmDev};
use core::ffi::{c_int, c_void};
use remem_verbs::cm::{CmEventKind, CmEventParam, CmId, ConnParam, PeerConnParam, PortSpace};
use remem_verbs::{Gid, QpState};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The backlog of a listener when the program gives none (as the kernel's rdma_ucm
/// `max_backlog`), and the most it may ask for.
pub const MAX_BACKLOG: u32 = 1024;

/// An id: what `rdma_create_id` returns a pointer to (`abi` first).
#[repr(C)]
pub struct RdmaId {
    /// The `rdma_cm_id` programs see.
    pub abi: rdma_cm_id,
    /// The library's side.
    pub(crate) shared: Arc<IdShared>,
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

// `EpAttr` is `Send`: see `crate::ffi::rdmacm`.

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

/// A channel for a new id: the program's (resolved by the FFI layer), or a private one.
pub(crate) struct Chan {
    inner: Arc<ChannelInner>,
    abi: usize,
    private: usize,
}

impl Chan {
    /// The program's channel `abi`, whose library side the FFI layer resolved.
    pub(crate) fn program(inner: Arc<ChannelInner>, abi: *mut rdma_event_channel) -> Chan {
        Chan {
            inner,
            abi: abi as usize,
            private: 0,
        }
    }

    /// A new private channel (a synchronous id's).
    pub(crate) fn private() -> Result<Chan, c_int> {
        let (ch, inner) = new_channel()?;
        Ok(Chan {
            inner,
            abi: ch as usize,
            private: ch as usize,
        })
    }
}

/// The id made for a connection request and not handed out yet (`Pending::child`):
/// owned by its event until the program gets it (`hand_out`) or the library frees it
/// (`crate::ffi::rdmacm::free_unseen`). Only `new_child` makes one.
pub(crate) struct Unseen(Arc<IdShared>);

impl Unseen {
    /// The id's library side.
    pub(crate) fn shared(&self) -> &Arc<IdShared> {
        &self.0
    }
}

pub(crate) use crate::ffi::handles::id_from;

/// A zeroed `rdma_route`.
fn no_route() -> rdma_route {
    crate::ffi::zeroed()
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
    let raw = crate::ffi::handles::into_abi(RdmaId {
        abi,
        shared: Arc::clone(&shared),
    });
    shared.ptr.store(raw as usize, Ordering::Release);
    raw
}

/// Creates an id (`rdma_create_id`, and `rdma_create_ep`'s with a QP type) on the
/// program's channel (`None`: a private one; an error: a destroyed one): the pointer
/// programs see.
pub(crate) fn create_id(
    channel: Option<Result<Chan, c_int>>,
    context: *mut c_void,
    ps: PortSpace,
    qp_type: ibv_qp_type,
) -> Result<*mut rdma_cm_id, c_int> {
    new_id(channel, context, ps, qp_type).map(|s| s.abi_ptr())
}

/// [`create_id`], returning the new id's library side.
pub(crate) fn new_id(
    channel: Option<Result<Chan, c_int>>,
    context: *mut c_void,
    ps: PortSpace,
    qp_type: ibv_qp_type,
) -> Result<Arc<IdShared>, c_int> {
    devices::count()?;
    let chan = match channel {
        Some(c) => c?,
        None => Chan::private()?,
    };
    let abi = chan.abi;
    let shared = Arc::new(IdShared::new(ps, qp_type, chan));
    boxed(Arc::clone(&shared), abi, context, ps);
    Ok(shared)
}

/// The QP type of a port space's ids.
pub(crate) fn qp_type_of(ps: PortSpace) -> ibv_qp_type {
    match ps {
        PortSpace::Udp | PortSpace::Ipoib => IBV_QPT_UD,
        PortSpace::Tcp | PortSpace::Ib => IBV_QPT_RC,
    }
}

mod addr;
mod conn;
mod endpoint;
mod events;
mod fields;
mod lifecycle;
mod mcast;
mod options;

pub use addr::*;
pub(crate) use conn::*;
pub(crate) use endpoint::*;
pub(crate) use events::*;
use fields::*;
pub(crate) use lifecycle::*;
pub(crate) use mcast::*;
pub(crate) use options::*;
