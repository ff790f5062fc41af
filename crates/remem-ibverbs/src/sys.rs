//! The one module of this crate that calls libibverbs through raw handles.
//!
//! sideway's safe API covers devices, contexts, protection domains, memory registration
//! and completion queues; it has no completion-channel events, no shared receive queues,
//! no address handles and no classic `ibv_post_send` with every work-request field. Those
//! calls live here, each wrapped in a safe function whose arguments make the call sound:
//! every raw pointer passed to libibverbs comes from a live object this module owns (or
//! from sideway, whose `Arc`s keep it alive), and every structure read back is plain data.
//!
//! libibverbs' verbs are thread-safe (rdma-core guarantees it for every provider), so the
//! owning types are `Send` and `Sync`.

#![allow(unsafe_code)]

use rdma_mummy_sys as ffi;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

pub(crate) use ffi::{
    ibv_ah_attr, ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc,
};

/// An all-zero value of a libibverbs plain-data structure.
pub(crate) trait Zeroed: Sized {
    /// All fields zero (null pointers, zero numbers): a valid value of every C structure
    /// this trait is implemented for.
    fn zeroed() -> Self;
}

macro_rules! zeroed {
    ($($t:ty),*) => {$(
        impl Zeroed for $t {
            fn zeroed() -> Self {
                // SAFETY: a C structure of integers, raw pointers, unions of those and
                // arrays of them: all-zero bytes are a valid value.
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}
zeroed!(
    ibv_qp_attr,
    ibv_qp_init_attr,
    ibv_send_wr,
    ibv_recv_wr,
    ibv_wc,
    ibv_ah_attr,
    ffi::ibv_srq_attr
);

fn errno_result(ret: i32) -> io::Result<()> {
    match ret {
        0 => Ok(()),
        // Providers return a positive errno, some a negative one, some -1 with errno set.
        -1 => Err(io::Error::last_os_error()),
        e => Err(io::Error::from_raw_os_error(e.abs())),
    }
}

/// The raw context of a sideway device context.
fn ctx_ptr(ctx: &DeviceContext) -> *mut ffi::ibv_context {
    // SAFETY: the pointer is only used while `ctx` (which owns it) is borrowed.
    unsafe { ctx.context() }.as_ptr()
}

fn pd_ptr(pd: &ProtectionDomain) -> *mut ffi::ibv_pd {
    // SAFETY: the pointer is only used while `pd` (which owns it) is borrowed.
    unsafe { pd.pd() }.as_ptr()
}

/// The context's async event file descriptor, switched to non-blocking.
pub(crate) fn async_fd(ctx: &DeviceContext) -> io::Result<RawFd> {
    // SAFETY: the context is live while borrowed; `async_fd` is a plain field.
    let fd = unsafe { (*ctx_ptr(ctx)).async_fd };
    set_nonblocking(fd)?;
    Ok(fd)
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller's object owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Borrows a descriptor owned by an object that outlives the borrow.
pub(crate) fn borrow_fd<T: ?Sized>(_owner: &T, fd: RawFd) -> BorrowedFd<'_> {
    // SAFETY: `fd` belongs to `_owner` (a context or completion channel), which closes it
    // only when dropped, after this borrow ends.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// One async event, taken and acknowledged.
pub(crate) struct RawAsyncEvent {
    /// `ibv_event_type`.
    pub event_type: u32,
    /// The QP number, SRQ context, CQ context or port the event names (by type).
    pub element: u64,
}

/// `struct ibv_async_event` with the event type as a plain integer (a Rust enum must not
/// receive a value it lacks, and a newer kernel may add event types).
#[repr(C)]
struct AsyncEventRaw {
    element: ffi::ibv_async_event_element_t,
    event_type: u32,
}

const EV_CQ_ERR: u32 = 0;
const EV_SRQ_ERR: u32 = 14;
const EV_SRQ_LIMIT: u32 = 15;
const EV_PORT_ACTIVE: u32 = 9;
const EV_PORT_ERR: u32 = 10;
const EV_LID_CHANGE: u32 = 11;
const EV_PKEY_CHANGE: u32 = 12;
const EV_SM_CHANGE: u32 = 13;
const EV_CLIENT_REREGISTER: u32 = 17;
const EV_GID_CHANGE: u32 = 18;
/// QP_FATAL (1) through PATH_MIG_ERR (7) name a QP, as does QP_LAST_WQE_REACHED (16).
const EV_QP_FIRST: u32 = 1;
const EV_QP_LAST: u32 = 7;
const EV_QP_LAST_WQE: u32 = 16;

/// Takes the next async event (the fd is non-blocking) and acknowledges it.
pub(crate) fn get_async_event(ctx: &DeviceContext) -> Option<RawAsyncEvent> {
    let mut ev = std::mem::MaybeUninit::<AsyncEventRaw>::uninit();
    // SAFETY: `ev` has the layout of `struct ibv_async_event`; the context is live.
    let ret = unsafe { ffi::ibv_get_async_event(ctx_ptr(ctx), ev.as_mut_ptr().cast()) };
    if ret != 0 {
        return None;
    }
    // SAFETY: libibverbs filled the event.
    let mut ev = unsafe { ev.assume_init() };
    let element = match ev.event_type {
        // SAFETY: the union member read is the one the event type names; the objects it
        // points to stay alive until the event is acknowledged below.
        EV_CQ_ERR => unsafe { (*ev.element.cq).cq_context as u64 },
        // SAFETY: as above.
        EV_SRQ_ERR | EV_SRQ_LIMIT => unsafe { (*ev.element.srq).srq_context as u64 },
        EV_PORT_ACTIVE | EV_PORT_ERR | EV_LID_CHANGE | EV_PKEY_CHANGE | EV_SM_CHANGE
        | EV_CLIENT_REREGISTER | EV_GID_CHANGE => {
            // SAFETY: as above.
            unsafe { ev.element.port_num as u64 }
        }
        // SAFETY: these events name a QP.
        EV_QP_FIRST..=EV_QP_LAST | EV_QP_LAST_WQE => unsafe { u64::from((*ev.element.qp).qp_num) },
        // The device, a WQ, or an event type newer than this crate: no element is read.
        _ => 0,
    };
    // SAFETY: the event came from ibv_get_async_event and is acknowledged once.
    unsafe { ffi::ibv_ack_async_event((&raw mut ev).cast()) };
    Some(RawAsyncEvent {
        event_type: ev.event_type,
        element,
    })
}

/// A GID table entry: the GID, its type and its netdev's interface index.
pub(crate) fn query_gid(
    ctx: &DeviceContext,
    port: u8,
    index: u32,
) -> io::Result<([u8; 16], u32, u32)> {
    let mut entry = std::mem::MaybeUninit::<ffi::ibv_gid_entry>::zeroed();
    // SAFETY: `entry` is a writable `ibv_gid_entry`; the context is live.
    let ret = unsafe {
        ffi::ibv_query_gid_ex(ctx_ptr(ctx), u32::from(port), index, entry.as_mut_ptr(), 0)
    };
    errno_result(ret)?;
    // SAFETY: zeroed is a valid value, and libibverbs filled it.
    let entry = unsafe { entry.assume_init() };
    // SAFETY: both union members are 16 plain bytes.
    let raw = unsafe { entry.gid.raw };
    Ok((raw, entry.gid_type, entry.ndev_ifindex))
}

/// A completion channel's next CQ event: the CQ context (this crate's CQ id), or `None`.
pub(crate) fn get_cq_event(channel: &CompletionChannel) -> io::Result<Option<u64>> {
    // SAFETY: the channel is live while borrowed.
    let ch = unsafe { channel.comp_channel() }.as_ptr();
    let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
    let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the fd is non-blocking, so this does not wait.
    let ret = unsafe { ffi::ibv_get_cq_event(ch, &mut cq, &mut cq_ctx) };
    if ret != 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(cq_ctx as u64))
}

/// A completion channel's descriptor, switched to non-blocking.
pub(crate) fn channel_fd(channel: &CompletionChannel) -> io::Result<RawFd> {
    use std::os::fd::AsRawFd;
    let fd = channel.as_raw_fd();
    set_nonblocking(fd)?;
    Ok(fd)
}

/// CQ operations on a sideway CQ.
pub(crate) struct Cq(pub Arc<BasicCompletionQueue>);

impl Cq {
    pub(crate) fn ptr(&self) -> *mut ffi::ibv_cq {
        // SAFETY: used only while `self` keeps the CQ alive.
        unsafe { self.0.cq() }.as_ptr()
    }

    /// `ibv_poll_cq` into `wc`: how many were taken.
    pub(crate) fn poll(&self, wc: &mut [ibv_wc]) -> io::Result<usize> {
        let n = i32::try_from(wc.len()).unwrap_or(i32::MAX);
        // SAFETY: `wc` holds `n` writable entries; the CQ is live.
        let ret = unsafe { ffi::ibv_poll_cq(self.ptr(), n, wc.as_mut_ptr()) };
        if ret < 0 {
            return Err(io::Error::from_raw_os_error(-ret));
        }
        Ok(ret as usize)
    }

    pub(crate) fn req_notify(&self, solicited_only: bool) -> io::Result<()> {
        // SAFETY: the CQ is live.
        errno_result(unsafe { ffi::ibv_req_notify_cq(self.ptr(), i32::from(solicited_only)) })
    }

    pub(crate) fn ack_events(&self, n: u32) {
        // SAFETY: the CQ is live; acknowledging more events than were taken is the
        // caller's error, which libibverbs tolerates (a counter).
        unsafe { ffi::ibv_ack_cq_events(self.ptr(), n) }
    }

    pub(crate) fn cqe(&self) -> u32 {
        // SAFETY: a plain field of a live CQ.
        unsafe { (*self.ptr()).cqe }.max(0) as u32
    }
}

/// An owned libibverbs object: destroyed (once) when dropped.
struct Handle<T> {
    ptr: NonNull<T>,
    destroy: unsafe extern "C" fn(*mut T) -> libc::c_int,
}

// SAFETY: libibverbs verbs are thread-safe for every provider (rdma-core guarantees it),
// and an object is only destroyed by its one owner's drop.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

impl<T> Handle<T> {
    /// Owns what a `ibv_create_*` call returned; null is its error (errno).
    ///
    /// # Safety
    /// `raw` is null or a live object that nothing else destroys, and `destroy` is its
    /// `ibv_destroy_*`.
    unsafe fn new(
        raw: *mut T,
        destroy: unsafe extern "C" fn(*mut T) -> libc::c_int,
    ) -> io::Result<Self> {
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(Handle { ptr, destroy })
    }

    fn ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }
}

impl<T> Drop for Handle<T> {
    fn drop(&mut self) {
        // SAFETY: the object is live and destroyed once. Its owner keeps what it depends
        // on (a QP's CQs, SRQ and PD; an SRQ's or AH's PD) in fields dropped after it.
        let _ = unsafe { (self.destroy)(self.ptr.as_ptr()) };
    }
}

/// A queue pair. Its owner keeps the PD, CQs and SRQ alive.
pub(crate) struct Qp(Handle<ffi::ibv_qp>);

impl Qp {
    /// `ibv_create_qp`; `init` carries CQ (and SRQ) pointers from [`Cq::ptr`] and
    /// [`Srq::ptr`], and gets the granted capacities.
    pub(crate) fn create(pd: &ProtectionDomain, init: &mut ibv_qp_init_attr) -> io::Result<Qp> {
        // SAFETY: `init` is a valid attribute structure whose CQ/SRQ pointers are live
        // objects of the same context (the caller holds them); the new QP (or null) is
        // owned here alone.
        unsafe { Handle::new(ffi::ibv_create_qp(pd_ptr(pd), init), ffi::ibv_destroy_qp) }.map(Qp)
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: a plain field of a live QP.
        unsafe { (*self.0.ptr()).qp_num }
    }

    pub(crate) fn modify(&self, attr: &mut ibv_qp_attr, mask: u32) -> io::Result<()> {
        // SAFETY: a valid attribute structure; the QP is live.
        errno_result(unsafe { ffi::ibv_modify_qp(self.0.ptr(), attr, mask as i32) })
    }

    pub(crate) fn query(&self, mask: u32) -> io::Result<(ibv_qp_attr, ibv_qp_init_attr)> {
        let mut attr = ibv_qp_attr::zeroed();
        let mut init = ibv_qp_init_attr::zeroed();
        // SAFETY: out-structures; the QP is live.
        let ret = unsafe { ffi::ibv_query_qp(self.0.ptr(), &mut attr, mask as i32, &mut init) };
        errno_result(ret)?;
        Ok((attr, init))
    }

    /// `ibv_post_send` of `wrs` in order, each with the scatter list `sges[ranges[i]]`
    /// (`next` and `sg_list` are set here). On error: the index of the first WR not posted.
    pub(crate) fn post_send(
        &self,
        wrs: &mut [ibv_send_wr],
        sges: &mut [ibv_sge],
        ranges: &[(usize, usize)],
    ) -> Result<(), (usize, io::Error)> {
        post_list(wrs, sges, ranges, |list, bad| {
            // SAFETY: a linked list of valid WRs whose scatter lists lie in `sges` (bounds
            // checked in post_list); the provider copies them before returning. Local
            // entries were checked against the PD's regions by the caller, remote
            // addresses and keys are checked by the NIC.
            unsafe { ffi::ibv_post_send(self.0.ptr(), list, bad) }
        })
    }

    /// `ibv_post_recv`, as [`Qp::post_send`].
    pub(crate) fn post_recv(
        &self,
        wrs: &mut [ibv_recv_wr],
        sges: &mut [ibv_sge],
        ranges: &[(usize, usize)],
    ) -> Result<(), (usize, io::Error)> {
        post_list(wrs, sges, ranges, |list, bad| {
            // SAFETY: as for post_send.
            unsafe { ffi::ibv_post_recv(self.0.ptr(), list, bad) }
        })
    }
}

/// A work request type with a `next` pointer and a scatter list.
pub(crate) trait Linked: Sized {
    fn set_links(&mut self, next: *mut Self, sg_list: *mut ibv_sge, num_sge: i32);
}

impl Linked for ibv_send_wr {
    fn set_links(&mut self, next: *mut Self, sg_list: *mut ibv_sge, num_sge: i32) {
        (self.next, self.sg_list, self.num_sge) = (next, sg_list, num_sge);
    }
}

impl Linked for ibv_recv_wr {
    fn set_links(&mut self, next: *mut Self, sg_list: *mut ibv_sge, num_sge: i32) {
        (self.next, self.sg_list, self.num_sge) = (next, sg_list, num_sge);
    }
}

/// Chains `wrs` into a list, WR `i` scattering over `sges[ranges[i]]`, and hands it to
/// `post` (an `ibv_post_*` call): on error, the index of the first WR not posted.
fn post_list<T: Linked>(
    wrs: &mut [T],
    sges: &mut [ibv_sge],
    ranges: &[(usize, usize)],
    post: impl FnOnce(*mut T, &mut *mut T) -> i32,
) -> Result<(), (usize, io::Error)> {
    if wrs.is_empty() {
        return Ok(());
    }
    let sge_base = sges.as_mut_ptr();
    let n = wrs.len();
    let base = wrs.as_mut_ptr();
    for (i, wr) in wrs.iter_mut().enumerate() {
        let (start, len) = ranges[i];
        assert!(start + len <= sges.len(), "scatter range outside the list");
        // Pointer arithmetic only: `start` is within `sges`, `i + 1` within `wrs`.
        let sg = if len == 0 {
            std::ptr::null_mut()
        } else {
            sge_base.wrapping_add(start)
        };
        let next = if i + 1 < n {
            base.wrapping_add(i + 1)
        } else {
            std::ptr::null_mut()
        };
        wr.set_links(next, sg, len as i32);
    }
    let mut bad: *mut T = std::ptr::null_mut();
    errno_result(post(base, &mut bad)).map_err(|e| (bad_index(base, bad, n), e))
}

fn bad_index<T>(base: *mut T, bad: *mut T, n: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    let offset = (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<T>();
    offset.min(n)
}

/// A shared receive queue.
pub(crate) struct Srq(Handle<ffi::ibv_srq>);

impl Srq {
    /// `ibv_create_srq` with `id` as its context (what async events report).
    pub(crate) fn create(
        pd: &ProtectionDomain,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
        id: u32,
    ) -> io::Result<(Srq, u32, u32)> {
        let mut init: ffi::ibv_srq_init_attr = ffi::ibv_srq_init_attr {
            srq_context: id as usize as *mut libc::c_void,
            attr: ffi::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: limit,
            },
        };
        // SAFETY: a valid init structure; the PD is live.
        let srq = unsafe { ffi::ibv_create_srq(pd_ptr(pd), &mut init) };
        // SAFETY: the new SRQ (or null) is owned here alone.
        let srq = unsafe { Handle::new(srq, ffi::ibv_destroy_srq) }.map(Srq)?;
        Ok((srq, init.attr.max_wr, init.attr.max_sge))
    }

    pub(crate) fn ptr(&self) -> *mut ffi::ibv_srq {
        self.0.ptr()
    }

    pub(crate) fn post_recv(
        &self,
        wrs: &mut [ibv_recv_wr],
        sges: &mut [ibv_sge],
        ranges: &[(usize, usize)],
    ) -> Result<(), (usize, io::Error)> {
        post_list(wrs, sges, ranges, |list, bad| {
            // SAFETY: as for Qp::post_send.
            unsafe { ffi::ibv_post_srq_recv(self.0.ptr(), list, bad) }
        })
    }

    pub(crate) fn set_limit(&self, limit: u32) -> io::Result<()> {
        let mut attr = ffi::ibv_srq_attr::zeroed();
        attr.srq_limit = limit;
        const IBV_SRQ_LIMIT: i32 = 2;
        // SAFETY: a valid attribute structure; the SRQ is live.
        errno_result(unsafe { ffi::ibv_modify_srq(self.0.ptr(), &mut attr, IBV_SRQ_LIMIT) })
    }

    pub(crate) fn query(&self) -> io::Result<(u32, u32, u32)> {
        let mut attr = ffi::ibv_srq_attr::zeroed();
        // SAFETY: an out-structure; the SRQ is live.
        errno_result(unsafe { ffi::ibv_query_srq(self.0.ptr(), &mut attr) })?;
        Ok((attr.max_wr, attr.max_sge, attr.srq_limit))
    }
}

/// An address handle.
pub(crate) struct Ah(Handle<ffi::ibv_ah>);

impl Ah {
    pub(crate) fn create(pd: &ProtectionDomain, attr: &mut ibv_ah_attr) -> io::Result<Ah> {
        // SAFETY: a valid attribute structure; the PD is live; the new AH (or null) is
        // owned here alone.
        unsafe { Handle::new(ffi::ibv_create_ah(pd_ptr(pd), attr), ffi::ibv_destroy_ah) }.map(Ah)
    }

    pub(crate) fn ptr(&self) -> *mut ffi::ibv_ah {
        self.0.ptr()
    }
}

/// Registers `len` bytes at `addr`, which the caller's buffer owns and keeps alive (and
/// in place) for as long as the returned region lives.
pub(crate) fn reg_mr(
    pd: &Arc<ProtectionDomain>,
    buffer: &remem_verbs::MemoryBuffer,
    offset: usize,
    len: usize,
    access: i32,
) -> io::Result<Arc<sideway::ibverbs::memory_region::MemoryRegion>> {
    buffer
        .check(offset, len)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let addr = buffer.as_ptr() as usize + offset;
    let access = sideway::ibverbs::AccessFlags::from(access);
    // SAFETY: [addr, addr + len) lies inside `buffer` (checked above), whose memory never
    // moves and which the caller's memory region object keeps alive until after the
    // region is deregistered (fields drop in order). The NIC accesses it only as the
    // registration allows; the buffer is made for exactly that (every access in Rust
    // goes through atomics).
    unsafe { pd.reg_mr(addr, len, access) }.map_err(|e| io::Error::other(e.to_string()))
}

/// The 16 bytes of a GID.
pub(crate) fn gid_bytes(gid: &ffi::ibv_gid) -> [u8; 16] {
    // SAFETY: both members of the union are 16 plain bytes.
    unsafe { gid.raw }
}

/// A completion's immediate data (network order) or invalidated rkey, as stored.
pub(crate) fn wc_imm(wc: &ibv_wc) -> u32 {
    // SAFETY: both members of the union are a plain u32.
    unsafe { wc.imm_data_invalidated_rkey_union.imm_data }
}

/// Sets a WR's immediate data (network order) or rkey to invalidate.
pub(crate) fn set_imm(wr: &mut ibv_send_wr, value: u32) {
    wr.imm_data_invalidated_rkey_union.imm_data = value;
}

/// Sets a WR's RDMA target.
pub(crate) fn set_rdma(wr: &mut ibv_send_wr, remote_addr: u64, rkey: u32) {
    wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
}

/// Sets a WR's atomic target and operands.
pub(crate) fn set_atomic(
    wr: &mut ibv_send_wr,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
) {
    wr.wr.atomic = ffi::atomic_t {
        remote_addr,
        compare_add,
        swap,
        rkey,
    };
}

/// Sets a UD WR's destination.
pub(crate) fn set_ud(
    wr: &mut ibv_send_wr,
    ah: *mut ffi::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    wr.wr.ud = ffi::ud_t {
        ah,
        remote_qpn,
        remote_qkey,
    };
}

// ---------------------------------------------------------------------------------------
// RDMA CM (librdmacm, loaded at run time like libibverbs): event channels and CM ids.
// ---------------------------------------------------------------------------------------

/// The RDMA CM event types this crate acts on (`enum rdma_cm_event_type`).
pub(crate) mod cm_event {
    pub(crate) const ADDR_RESOLVED: u32 = 0;
    pub(crate) const CONNECT_REQUEST: u32 = 4;
}

/// The port spaces of `enum rdma_port_space` whose ids carry UD parameters in events.
const PS_UDP: u32 = 0x0111;
const PS_IPOIB: u32 = 0x0002;
/// `IBV_QPT_UD`.
const QPT_UD: u32 = 4;

/// An RDMA CM event channel; destroyed when dropped (after every id on it, which hold it).
pub(crate) struct CmChannel(NonNull<ffi::rdma_event_channel>);

// SAFETY: librdmacm's calls on a channel are thread-safe (its own locking); the channel
// is destroyed once, by its owner's drop.
unsafe impl Send for CmChannel {}
// SAFETY: as above.
unsafe impl Sync for CmChannel {}

/// The connection parameters an event carries (`rdma_cm_event.param.conn`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawConnParam {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// The UD parameters an event carries (`rdma_cm_event.param.ud`).
pub(crate) struct RawUdParam {
    pub qp_num: u32,
    pub qkey: u32,
    pub ah_attr: ibv_ah_attr,
}

/// One RDMA CM event, copied out and acknowledged.
pub(crate) struct CmEvent {
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// The event's status (a negative errno, or a reject reason).
    pub status: i32,
    /// The id the event is for, as an address to compare (not to use).
    pub id: usize,
    /// For a connection request, the listening id, as an address to compare.
    pub listen_id: usize,
    /// For a connection request: the new id, owned.
    pub new_id: Option<CmId>,
    /// The private data of the message behind the event (requests, replies, rejects…).
    pub private_data: Vec<u8>,
    /// The connection parameters (ids of connected port spaces).
    pub conn: RawConnParam,
    /// The UD parameters (ids of the UDP and IPoIB port spaces, and UD ids).
    pub ud: Option<RawUdParam>,
}

impl CmChannel {
    /// `rdma_create_event_channel`; its descriptor is made non-blocking (events are
    /// awaited with [`wait_readable`]).
    pub(crate) fn new() -> io::Result<Arc<CmChannel>> {
        // SAFETY: no arguments; the channel (or null) is owned here alone.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        let ch = CmChannel(NonNull::new(raw).ok_or_else(io::Error::last_os_error)?);
        set_nonblocking(ch.fd())?;
        Ok(Arc::new(ch))
    }

    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: a plain field of the live channel.
        unsafe { (*self.0.as_ptr()).fd }
    }

    /// The next event if one is waiting (`None` when there is none), acknowledged. Never
    /// blocks, whatever the descriptor's `O_NONBLOCK` flag: the descriptor is polled
    /// first.
    pub(crate) fn try_event(self: &Arc<Self>) -> io::Result<Option<CmEvent>> {
        if !wait_readable(self.fd(), std::time::Duration::ZERO)? {
            return Ok(None);
        }
        let mut ev: *mut ffi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is live; `ev` receives an event owned by librdmacm until
        // acknowledged below.
        if unsafe { ffi::rdma_get_cm_event(self.0.as_ptr(), &mut ev) } != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: a successful call returned a live event, readable until acknowledged,
        // whose `id` is a live id (the new one for a connection request). The `param`
        // union is read through the member librdmacm fills for the id's kind (`ud` for
        // the UDP and IPoIB port spaces and UD ids, `conn` for the others), as
        // librdmacm decides it; other events leave it zeroed. Its `private_data` is null
        // or `private_data_len` readable bytes, copied before the acknowledgement.
        let out = unsafe {
            let e = &*ev;
            let (ps, qp_type) = if e.id.is_null() {
                (0, 0)
            } else {
                ((*e.id).ps, (*e.id).qp_type)
            };
            let is_ud = ps == PS_UDP || ps == PS_IPOIB || qp_type == QPT_UD;
            let (data_ptr, data_len) = if is_ud {
                (e.param.ud.private_data, e.param.ud.private_data_len)
            } else {
                (e.param.conn.private_data, e.param.conn.private_data_len)
            };
            let private_data = if data_ptr.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(data_ptr.cast::<u8>(), usize::from(data_len)).to_vec()
            };
            let conn = if is_ud {
                RawConnParam::default()
            } else {
                let c = &e.param.conn;
                RawConnParam {
                    responder_resources: c.responder_resources,
                    initiator_depth: c.initiator_depth,
                    flow_control: c.flow_control,
                    retry_count: c.retry_count,
                    rnr_retry_count: c.rnr_retry_count,
                    srq: c.srq,
                    qp_num: c.qp_num,
                }
            };
            let ud = if is_ud {
                Some(RawUdParam {
                    qp_num: e.param.ud.qp_num,
                    qkey: e.param.ud.qkey,
                    ah_attr: e.param.ud.ah_attr,
                })
            } else {
                None
            };
            let new_id = if e.event == cm_event::CONNECT_REQUEST {
                NonNull::new(e.id).map(|id| CmId {
                    id,
                    chan: std::sync::Mutex::new(self.clone()),
                })
            } else {
                None
            };
            let out = CmEvent {
                kind: e.event,
                status: e.status,
                id: e.id as usize,
                listen_id: e.listen_id as usize,
                new_id,
                private_data,
                conn,
                ud,
            };
            ffi::rdma_ack_cm_event(ev);
            out
        };
        Ok(Some(out))
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: the channel is live, and every id on it (each holds an `Arc` of it) has
        // been destroyed.
        unsafe { ffi::rdma_destroy_event_channel(self.0.as_ptr()) }
    }
}

/// Waits until `fd` is readable or `timeout` passes; `false` on timeout.
pub(crate) fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    match n {
        n if n < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(true)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// An RDMA CM id, destroyed when dropped.
pub(crate) struct CmId {
    id: NonNull<ffi::rdma_cm_id>,
    /// The channel its events go to (changed by [`CmId::migrate`]), kept alive by it.
    chan: std::sync::Mutex<Arc<CmChannel>>,
}

// SAFETY: librdmacm's calls on an id are thread-safe; the id is destroyed once, by its
// owner's drop; its fields are read only through `&self` (plain data).
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

/// The connection parameters of `rdma_connect` and `rdma_accept`.
pub(crate) struct ConnParam<'a> {
    pub private_data: &'a [u8],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub qp_num: u32,
}

impl ConnParam<'_> {
    fn raw(&self) -> io::Result<ffi::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(ffi::rdma_conn_param {
            private_data: if len == 0 {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: u8::from(self.flow_control),
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            srq: u8::from(self.srq),
            qp_num: self.qp_num & 0xff_ffff,
        })
    }
}

/// A socket address as the `sockaddr_storage` librdmacm reads.
fn sockaddr(addr: std::net::SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut st).cast::<libc::sockaddr_in>(), sin) };
        }
        std::net::SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut st).cast::<libc::sockaddr_in6>(), sin6) };
        }
    }
    st
}

/// The socket address in a `sockaddr_storage`, if it is IPv4 or IPv6.
fn from_sockaddr(st: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    match i32::from(st.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, for which it is
            // large enough and aligned.
            let sin =
                unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(
                SocketAddrV4::new(
                    Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                    u16::from_be(sin.sin_port),
                )
                .into(),
            )
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(
                SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )
                .into(),
            )
        }
        _ => None,
    }
}

impl CmId {
    /// `rdma_create_id` on `chan` in port space `ps` (`enum rdma_port_space`).
    pub(crate) fn new(chan: &Arc<CmChannel>, ps: u32) -> io::Result<CmId> {
        let mut raw: *mut ffi::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: the channel is live; `raw` receives the new id (owned here alone).
        let ret =
            unsafe { ffi::rdma_create_id(chan.0.as_ptr(), &mut raw, std::ptr::null_mut(), ps) };
        errno_result(ret)?;
        let id = NonNull::new(raw).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(CmId {
            id,
            chan: std::sync::Mutex::new(chan.clone()),
        })
    }

    fn ptr(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The id's address, to match events against.
    pub(crate) fn key(&self) -> usize {
        self.ptr() as usize
    }

    pub(crate) fn bind(&self, addr: std::net::SocketAddr) -> io::Result<()> {
        let mut st = sockaddr(addr);
        // SAFETY: the id is live; the address is a valid sockaddr for the call.
        errno_result(unsafe { ffi::rdma_bind_addr(self.ptr(), (&raw mut st).cast()) })
    }

    pub(crate) fn listen(&self, backlog: i32) -> io::Result<()> {
        // SAFETY: the id is live and bound.
        errno_result(unsafe { ffi::rdma_listen(self.ptr(), backlog) })
    }

    pub(crate) fn resolve_addr(
        &self,
        src: Option<std::net::SocketAddr>,
        dst: std::net::SocketAddr,
        timeout_ms: i32,
    ) -> io::Result<()> {
        let mut st = sockaddr(dst);
        let mut src_st = src.map(sockaddr);
        let src_ptr = match &mut src_st {
            Some(s) => (s as *mut libc::sockaddr_storage).cast(),
            None => std::ptr::null_mut(),
        };
        // SAFETY: the id is live; the addresses are valid for the call (copied by it);
        // a null source lets the route choose.
        errno_result(unsafe {
            ffi::rdma_resolve_addr(self.ptr(), src_ptr, (&raw mut st).cast(), timeout_ms)
        })
    }

    pub(crate) fn resolve_route(&self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: the id is live with a resolved address.
        errno_result(unsafe { ffi::rdma_resolve_route(self.ptr(), timeout_ms) })
    }

    pub(crate) fn connect(&self, p: &ConnParam<'_>) -> io::Result<()> {
        let mut raw = p.raw()?;
        // SAFETY: the id is live; `raw` and its private data (borrowed from `p`) are valid
        // for the call, which copies them.
        errno_result(unsafe { ffi::rdma_connect(self.ptr(), &mut raw) })
    }

    pub(crate) fn accept(&self, p: &ConnParam<'_>) -> io::Result<()> {
        let mut raw = p.raw()?;
        // SAFETY: as for `connect`.
        errno_result(unsafe { ffi::rdma_accept(self.ptr(), &mut raw) })
    }

    pub(crate) fn reject(&self, private_data: &[u8]) -> io::Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let data = if len == 0 {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: the id is live; the data is null (length 0) or valid for the call,
        // which copies it.
        errno_result(unsafe { ffi::rdma_reject(self.ptr(), data, len) })
    }

    pub(crate) fn establish(&self) -> io::Result<()> {
        // SAFETY: the id is live.
        errno_result(unsafe { ffi::rdma_establish(self.ptr()) })
    }

    pub(crate) fn disconnect(&self) -> io::Result<()> {
        // SAFETY: the id is live.
        errno_result(unsafe { ffi::rdma_disconnect(self.ptr()) })
    }

    /// `rdma_init_qp_attr` for moving a QP to `state` (`enum ibv_qp_state`): the
    /// attributes and their mask.
    pub(crate) fn init_qp_attr(&self, state: u32) -> io::Result<(ibv_qp_attr, i32)> {
        let mut attr = ibv_qp_attr::zeroed();
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: the id is live; `attr` and `mask` are written by the call.
        errno_result(unsafe { ffi::rdma_init_qp_attr(self.ptr(), &mut attr, &mut mask) })?;
        Ok((attr, mask))
    }

    /// Moves the id's events to `chan` (`rdma_migrate_id`).
    pub(crate) fn migrate(&self, chan: &Arc<CmChannel>) -> io::Result<()> {
        let mut cur = self.chan.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the id and both channels are live; the old channel stays alive until
        // its `Arc` is replaced below, after the call.
        errno_result(unsafe { ffi::rdma_migrate_id(self.ptr(), chan.0.as_ptr()) })?;
        *cur = chan.clone();
        Ok(())
    }

    /// The local address (`rdma_get_local_addr`), once bound.
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        // SAFETY: the id is live; the route's source address is a plain sockaddr
        // storage librdmacm fills (zeroed, family AF_UNSPEC, until bound).
        from_sockaddr(unsafe { &(*self.ptr()).route.addr.src_addr_union.src_storage })
    }

    /// The peer's address (`rdma_get_peer_addr`), once resolved or connected.
    pub(crate) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        // SAFETY: as for `local_addr`, the destination address.
        from_sockaddr(unsafe { &(*self.ptr()).route.addr.dst_addr_union.dst_storage })
    }

    /// The device port the id is bound to (`port_num`; 0 until bound to a device).
    pub(crate) fn port_num(&self) -> u8 {
        // SAFETY: the id is live; `port_num` is a plain field.
        unsafe { (*self.ptr()).port_num }
    }

    /// The name of the device the id is bound to, once it is bound to one.
    pub(crate) fn device_name(&self) -> Option<String> {
        // SAFETY: the id is live; `verbs` is null or librdmacm's live context of the id's
        // device, whose `device` and name outlive the id.
        unsafe {
            let verbs = (*self.ptr()).verbs;
            if verbs.is_null() {
                return None;
            }
            let name = ffi::ibv_get_device_name((*verbs).device);
            if name.is_null() {
                return None;
            }
            Some(
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is live and destroyed once; every event on it was acknowledged
        // when taken ([`CmChannel::try_event`]).
        let _ = unsafe { ffi::rdma_destroy_id(self.ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn socket_addresses_survive_the_sockaddr_round_trip() {
        for a in [
            "10.77.0.2:7471",
            "0.0.0.0:0",
            "[fe80::1%3]:18515",
            "[2001:db8::5]:4791",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_sockaddr(&sockaddr(a)), Some(a), "{a}");
        }
        // An address librdmacm has not filled yet (AF_UNSPEC) is none.
        // SAFETY: all-zero bytes are a valid sockaddr_storage.
        let empty: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_sockaddr(&empty), None);
    }

    #[test]
    fn connection_parameters_are_bounded_as_librdmacm_reads_them() {
        let data = [7u8; 300];
        let p = ConnParam {
            private_data: &data,
            responder_resources: 4,
            initiator_depth: 4,
            flow_control: true,
            retry_count: 9,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0x0100_0011,
        };
        // More private data than a u8 length says is refused, not truncated.
        assert!(p.raw().is_err());
        let p = ConnParam {
            private_data: &data[..56],
            ..p
        };
        let raw = p.raw().unwrap();
        assert_eq!(raw.private_data_len, 56);
        assert_eq!((raw.retry_count, raw.flow_control), (7, 1));
        assert_eq!(raw.qp_num, 0x11, "QP numbers are 24 bits");
        let empty = ConnParam {
            private_data: &[],
            ..p
        };
        assert!(empty.raw().unwrap().private_data.is_null());
    }
}
