//! The provider interface: object-safe traits, one per verbs object.
//!
//! A provider (the soft RoCEv2 stack, rdma-core) implements these traits; everything above —
//! the async API, the CLI, the conformance suite — holds `Arc<dyn …>` handles and is
//! written once. Handles are reference counted like sideway's: a child keeps its parents
//! alive (a QP its CQs and PD, a memory region its PD), and dropping the last handle
//! destroys the object (`ibv_destroy_*`, `ibv_dereg_mr`).
//!
//! Every trait has `Any` as a supertrait so that a provider can recover its own concrete
//! type from a handle it is given (e.g. the CQ named in [`QpInitAttr`]): a handle from
//! another provider is rejected with [`Error::InvalidArgument`], never misused.

#![forbid(unsafe_code)]

use crate::access::AccessFlags;
use crate::device::{DeviceAttr, DeviceInfo, GidEntry, PortAttr};
use crate::error::{Error, PostError, Result};
use crate::event::AsyncEvent;
use crate::mem::MemRegion;
use crate::qp::{AhAttr, QpAttr, QpCap, QpInitAttr, QpState, QpType};
use crate::wc::WorkCompletion;
use crate::wr::{RecvWr, SendWr};
use std::any::Any;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// The UDP destination port of RoCEv2 (IANA-assigned): where RoCE NICs and kernel rxe
/// receive.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// A source of devices: one per provider (`ibv_get_device_list` + `ibv_open_device`).
pub trait Provider: Send + Sync {
    /// The provider's name, e.g. `"soft"` or `"ibverbs"`.
    fn name(&self) -> &'static str;

    /// The devices this provider can open now. A provider whose library or hardware is
    /// missing returns an empty list, not an error.
    fn devices(&self) -> Result<Vec<DeviceInfo>>;

    /// Opens a device by name (`ibv_open_device`).
    fn open(&self, name: &str) -> Result<Arc<dyn Context>>;
}

/// An identifier of a completion queue, unique within its [`Context`]; what a completion
/// channel reports and what CQ async events name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// One named device counter (rxe's `hw_counters`, e.g. `sent_pkts`, `rcvd_seq_err`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// The counter's name.
    pub name: &'static str,
    /// Its value.
    pub value: u64,
}

/// One reader's queue of a device's async events ([`Context::subscribe_async_events`]).
pub trait AsyncEventQueue: Any + Send + Sync {
    /// Readable while an event is pending; created non-blocking (its `O_NONBLOCK` flag is
    /// the user's to set or clear, as [`Context::async_fd`]'s).
    fn fd(&self) -> BorrowedFd<'_>;

    /// Takes the next event (oldest first) without blocking.
    fn pop(&self) -> Option<AsyncEvent>;
}

/// An open device (`struct ibv_context`).
pub trait Context: Any + Send + Sync {
    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Device attributes (`ibv_query_device`).
    fn query_device(&self) -> Result<DeviceAttr>;

    /// Port attributes (`ibv_query_port`); ports are numbered from 1.
    fn query_port(&self, port_num: u8) -> Result<PortAttr>;

    /// One GID table entry (`ibv_query_gid_ex`); an empty slot is an error.
    fn query_gid(&self, port_num: u8, index: u32) -> Result<GidEntry>;

    /// The non-empty entries of a port's GID table (`ibv_query_gid_table`).
    fn gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>> {
        let len = self.query_port(port_num)?.gid_tbl_len;
        Ok((0..len)
            .filter_map(|i| self.query_gid(port_num, i).ok())
            .collect())
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>>;

    /// Creates a completion channel (`ibv_create_comp_channel`).
    fn create_comp_channel(&self) -> Result<Arc<dyn CompletionChannel>>;

    /// Creates a completion queue of at least `cqe` entries (`ibv_create_cq`), reporting
    /// its events to `channel` if given.
    fn create_cq(
        &self,
        cqe: u32,
        channel: Option<Arc<dyn CompletionChannel>>,
    ) -> Result<Arc<dyn CompletionQueue>>;

    /// A file descriptor that is readable while an async event is pending (the context's
    /// `async_fd`), for epoll or tokio's `AsyncFd`. Created non-blocking; as for
    /// [`CompletionChannel::fd`], its `O_NONBLOCK` flag belongs to the user.
    fn async_fd(&self) -> BorrowedFd<'_>;

    /// Takes the next async event without blocking (`ibv_get_async_event` on a
    /// non-blocking `async_fd`, then `ibv_ack_async_event`).
    fn get_async_event(&self) -> Option<AsyncEvent>;

    /// A queue of its own for one more reader of this device's async events: every event
    /// the device raises from now on reaches it, as well as [`Context::async_fd`]'s queue.
    /// Each `ibv_open_device` of a kernel device has its own `async_fd` (a program that
    /// opens a device twice, as UCX and Open MPI do, watches two descriptors); a provider
    /// whose opens share one device gives each its own queue through this. Unsupported
    /// (EOPNOTSUPP) by default.
    fn subscribe_async_events(&self) -> Result<Arc<dyn AsyncEventQueue>> {
        Err(crate::Error::Unsupported("async event subscriptions"))
    }

    /// The device's counters.
    fn counters(&self) -> Vec<Counter>;

    /// Whether the device moves packets only when its user calls [`Context::drive`] (a
    /// soft device opened without a progress thread). NICs, and soft devices with a
    /// progress thread, move packets by themselves: `false`.
    fn caller_driven(&self) -> bool {
        false
    }

    /// Moves the device's work forward from the caller's thread, waiting up to `timeout`
    /// when there is nothing to do; returns how much moved (packets, for a soft device).
    /// Does nothing (returns 0 at once) on a device that is not
    /// [`caller_driven`](Context::caller_driven).
    fn drive(&self, timeout: std::time::Duration) -> Result<usize> {
        let _ = timeout;
        Ok(0)
    }

    /// Whether the device can send RoCEv2 to UDP port `port`, as an address vector's
    /// [`udp_port`](crate::AhAttr::udp_port) names it: RoCE NICs and kernel rxe send only
    /// to [`ROCEV2_UDP_PORT`] (the default answers so); a soft device sends anywhere. A
    /// pure question: it changes nothing.
    fn can_send_to_udp_port(&self, port: u16) -> bool {
        port == ROCEV2_UDP_PORT
    }

    /// Tells the device that the RoCEv2 peer whose GID is `gid` receives on UDP port `port`
    /// (a soft device of another process may listen on any port; RoCE NICs and kernel rxe
    /// all use [`ROCEV2_UDP_PORT`]). Later packets to that GID — from QPs or address
    /// handles, new or existing, whose address vector names no port of its own
    /// ([`AhAttr::udp_port`](crate::AhAttr::udp_port) 0), and the connection manager's —
    /// go to that port. It is the application's device-wide configuration (e.g. for raw
    /// verbs or RDMA CM between soft devices on different ports): nothing a peer says
    /// should reach it — a connection that learns its peer's port from the peer puts it in
    /// its own path instead. Devices that can only send to [`ROCEV2_UDP_PORT`] accept that
    /// port and answer any other with [`Error::Unsupported`]; a
    /// device may bound how many peers it remembers
    /// ([`Error::Exhausted`] beyond that).
    fn set_peer_udp_port(&self, gid: crate::Gid, port: u16) -> Result<()> {
        let _ = gid;
        if port == ROCEV2_UDP_PORT {
            Ok(())
        } else {
            Err(crate::Error::Unsupported(
                "sending RoCEv2 to a UDP port other than 4791",
            ))
        }
    }

    /// Creates an RDMA CM event channel (`rdma_create_event_channel`) that ids of any
    /// device of this provider may report to. [`Error::Unsupported`]
    /// where the provider has no connection manager.
    fn create_cm_channel(&self) -> Result<Arc<dyn crate::cm::CmChannel>> {
        Err(crate::Error::Unsupported("RDMA CM"))
    }

    /// Creates an RDMA CM id on this device (`rdma_create_id` followed by binding it to
    /// the device) in port space `ps`, reporting its events to `channel` (made by
    /// [`Context::create_cm_channel`] of a device of the same provider; another
    /// provider's channel is [`Error::InvalidArgument`]).
    fn create_cm_id(
        &self,
        channel: &Arc<dyn crate::cm::CmChannel>,
        ps: crate::cm::PortSpace,
    ) -> Result<Arc<dyn crate::cm::CmId>> {
        let _ = (channel, ps);
        Err(crate::Error::Unsupported("RDMA CM"))
    }
}

/// A protection domain (`struct ibv_pd`): memory regions and queue pairs of one PD can
/// reach each other, never those of another.
pub trait ProtectionDomain: Any + Send + Sync {
    /// Registers memory (`ibv_reg_mr`). The region's virtual address is its buffer's
    /// address plus offset. Remote write or atomic access without LOCAL_WRITE is an error.
    fn reg_mr(&self, region: MemRegion, access: AccessFlags) -> Result<Arc<dyn MemoryRegion>>;

    /// Creates a queue pair in RESET (`ibv_create_qp`).
    fn create_qp(&self, init: &QpInitAttr) -> Result<Arc<dyn QueuePair>>;

    /// Creates a shared receive queue (`ibv_create_srq`).
    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SharedReceiveQueue>>;

    /// Creates an address handle for UD sends (`ibv_create_ah`).
    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AddressHandle>>;

    /// Allocates a memory window of `ty` (`ibv_alloc_mw`), unbound; dropping the last
    /// handle deallocates it and revokes its binding. [`Error::Unsupported`]
    /// where the device has none (`DeviceAttr::max_mw` 0).
    fn alloc_mw(&self, ty: MwType) -> Result<Arc<dyn MemoryWindow>> {
        let _ = ty;
        Err(crate::Error::Unsupported("memory windows"))
    }
}

/// The type of a memory window (`enum ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound by `ibv_bind_mw`, reachable through any QP of its PD,
    /// unbound by a zero-length bind, never invalidated.
    One,
    /// `IBV_MW_TYPE_2`: bound by a work request, reachable only through the QP it was
    /// bound on, freed by local or remote invalidation.
    Two,
}

/// A memory window (`struct ibv_mw`): a range of a registered region opened to peers
/// with an rkey and rights of its own, bound and invalidated by work requests
/// ([`SendOp::BindMw`](crate::SendOp::BindMw), [`SendOp::LocalInv`](crate::SendOp::LocalInv)).
pub trait MemoryWindow: Any + Send + Sync {
    /// The rkey it was allocated with (its index names it in binds; the key byte changes
    /// with each bind).
    fn rkey(&self) -> u32;
    /// Its type.
    fn mw_type(&self) -> MwType;
}

/// A registered memory region (`struct ibv_mr`). Dropping the last handle deregisters it
/// (`ibv_dereg_mr`): its keys stop working at once.
pub trait MemoryRegion: Any + Send + Sync {
    /// The local key, for scatter/gather entries.
    fn lkey(&self) -> u32;
    /// The remote key a peer uses.
    fn rkey(&self) -> u32;
    /// The registered memory.
    fn region(&self) -> &MemRegion;
    /// The access rights it was registered with.
    fn access(&self) -> AccessFlags;
    /// Address of the first byte as work requests name it (`ibv_mr.addr`): its virtual
    /// address, or the iova of a region made by [`MemRegion::with_iova`].
    fn addr(&self) -> u64 {
        self.region().addr()
    }
    /// Length in bytes (`ibv_mr.length`).
    fn len(&self) -> usize {
        self.region().len()
    }
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How many memory windows are bound to it now (a region with any cannot be
    /// deregistered through verbs, IBA 10.6.7.2.6). 0 where the provider has none.
    fn windows_bound(&self) -> u32 {
        0
    }
}

/// A completion queue (`struct ibv_cq`).
pub trait CompletionQueue: Any + Send + Sync {
    /// The queue's identifier within its context.
    fn id(&self) -> CqId;

    /// The number of entries it holds (at least what was asked for).
    fn cqe(&self) -> u32;

    /// Moves up to `wc.len()` completions into `wc`, oldest first, and returns how many
    /// (`ibv_poll_cq`). A CQ that overflowed returns an error (and its context raised
    /// [`AsyncEventType::CqErr`](crate::AsyncEventType::CqErr)).
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize>;

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion — or with
    /// `solicited_only`, the next solicited or error completion — makes the CQ's channel
    /// readable once.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;

    /// Acknowledges `n` events taken from the channel for this CQ (`ibv_ack_cq_events`).
    fn ack_events(&self, n: u32);

    /// Resizes the queue (`ibv_resize_cq`) to hold `size` entries — `cqe`, or more where
    /// the caller rounds as its device does (rxe: the next `2^k - 1`) — keeping the
    /// completions it holds, in order; returns the new size.
    /// [`crate::Error::InvalidArgument`] for `cqe` 0, `size` below `cqe` or above the
    /// device's `max_cqe`, or `cqe` fewer than the completions it holds now (rxe's
    /// `rxe_cq_chk_attr`). A provider that cannot resize: [`crate::Error::Unsupported`].
    fn resize(&self, cqe: u32, size: u32) -> Result<u32> {
        let _ = (cqe, size);
        Err(crate::Error::Unsupported("resizing a completion queue"))
    }
}

/// A completion channel (`struct ibv_comp_channel`): a file descriptor that becomes
/// readable when an armed CQ gets a completion.
pub trait CompletionChannel: Any + Send + Sync {
    /// The channel's file descriptor (`ibv_comp_channel.fd`), for epoll or tokio's
    /// `AsyncFd`. It is created non-blocking; its `O_NONBLOCK` flag belongs to the user
    /// (a libibverbs-style caller clears it to make its own `ibv_get_cq_event` block). The
    /// soft provider's [`CompletionChannel::get_cq_event`] never blocks whatever the flag;
    /// the rdma-core provider's is rdma-core's, which blocks on a blocking fd.
    fn fd(&self) -> BorrowedFd<'_>;

    /// Takes the next CQ event without blocking (`ibv_get_cq_event` on a non-blocking fd):
    /// the CQ that fired, or `None` if there is no event. Each event must later be
    /// acknowledged with [`CompletionQueue::ack_events`].
    fn get_cq_event(&self) -> Result<Option<CqId>>;
}

/// A queue pair (`struct ibv_qp`).
pub trait QueuePair: Any + Send + Sync {
    /// The QP number (24 bits).
    fn qp_num(&self) -> u32;

    /// The transport service.
    fn qp_type(&self) -> QpType;

    /// The queue sizes granted at creation.
    fn cap(&self) -> QpCap;

    /// The current state (cheap; for the full attributes use [`QueuePair::query`]).
    fn state(&self) -> QpState;

    /// Modifies attributes and/or the state (`ibv_modify_qp`), validated as
    /// [`check_modify`](crate::check_modify) describes plus the device's limits.
    fn modify(&self, attr: &QpAttr, mask: crate::qp::QpAttrMask) -> Result<()>;

    /// The current attributes (`ibv_query_qp`).
    fn query(&self) -> Result<QpAttr>;

    /// Posts send work requests in order (`ibv_post_send`). On error, those before
    /// [`PostError::index`] were posted.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;

    /// Posts receive work requests in order (`ibv_post_recv`).
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;

    /// Attaches this UD QP to the multicast group `mgid` (`ibv_attach_mcast`; `mlid` is
    /// ignored on RoCE): datagrams sent to the group then reach it (QPN 0xFFFFFF in their
    /// BTH), each checked against its Q_Key as a unicast datagram is. Attaching again is no
    /// error. [`Error::InvalidArgument`] (EINVAL) for a GID that is not multicast or a QP
    /// that is not UD, [`Error::Exhausted`] (ENOMEM) beyond the device's
    /// [`McastCaps`](crate::McastCaps); by default [`Error::Unsupported`].
    fn attach_mcast(&self, mgid: &crate::Gid, mlid: u16) -> Result<()> {
        let _ = (mgid, mlid);
        Err(Error::Unsupported("multicast"))
    }

    /// Detaches this QP from the multicast group `mgid` (`ibv_detach_mcast`):
    /// [`Error::InvalidArgument`] (EINVAL) if it is not attached; by default
    /// [`Error::Unsupported`].
    fn detach_mcast(&self, mgid: &crate::Gid, mlid: u16) -> Result<()> {
        let _ = (mgid, mlid);
        Err(Error::Unsupported("multicast"))
    }
}

/// Attributes of a shared receive queue (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SrqAttr {
    /// Most outstanding receive work requests.
    pub max_wr: u32,
    /// Most scatter entries per receive work request.
    pub max_sge: u32,
    /// When armed, raise `SRQ_LIMIT_REACHED` once fewer than this many receives remain
    /// (0 = not armed).
    pub srq_limit: u32,
}

/// A shared receive queue (`struct ibv_srq`).
pub trait SharedReceiveQueue: Any + Send + Sync {
    /// The SRQ number.
    fn srq_num(&self) -> u32;

    /// Posts receive work requests (`ibv_post_srq_recv`).
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    fn set_limit(&self, srq_limit: u32) -> Result<()>;

    /// Current attributes (`ibv_query_srq`).
    fn query(&self) -> Result<SrqAttr>;
}

/// An address handle for UD sends (`struct ibv_ah`).
pub trait AddressHandle: Any + Send + Sync {
    /// The address vector it was created from.
    fn attr(&self) -> &AhAttr;
}
