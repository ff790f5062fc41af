//! The library's objects behind the program's pointers.
//!
//! Every verbs object is a boxed `#[repr(C)]` Rust struct whose first field is the ABI
//! struct the program sees ([`crate::qp::Qp`] starts with its `ibv_qp_ex`, ...): the
//! pointer handed out is the box's, cast. [`Object`] says so of a type (an `unsafe`
//! trait, implemented here only), [`into_abi`] boxes one, [`Handle::from_abi`] turns the
//! program's pointer back into a typed handle (the one `unsafe` step, at the entry
//! point), and [`free`] drops it in the destroy verb.
//!
//! A handle gives the library's side of the object as a reference
//! ([`Handle::inner`]) and never a reference to the ABI struct, which the program may
//! write (`qp_context`, `wr_id`, ...): the few program-visible fields the library reads or
//! writes in place are methods here (`Handle<Qp>::set_state`, ...), so that the object
//! modules stay safe code.

use crate::abi::*;
use crate::ah::{Ah, AhInner};
use crate::channel::{Channel, ChannelInner};
use crate::context::CtxShared;
use crate::cq::{Cq, CqInner};
use crate::mr::{Mr, MrInner};
use crate::mw::{Mw, MwInner};
use crate::qp::{Qp, QpInner};
use crate::rdmacm::abi::{rdma_cm_id, rdma_event_channel};
use crate::rdmacm::id::{IdShared, RdmaId};
use crate::srq::{Srq, SrqInner};
use core::ffi::c_int;
use core::marker::PhantomData;
use core::ptr::NonNull;
use remem_verbs::QpState;
use std::sync::Arc;

/// A library object that programs hold by a pointer to its ABI struct.
///
/// # Safety
///
/// The type is `#[repr(C)]` with an `Abi` at offset 0 and an `Inner` at offset `INNER`,
/// and the program never writes the `Inner` part.
pub unsafe trait Object: Sized {
    /// The ABI struct the program sees (the first field).
    type Abi;
    /// The library's side.
    type Inner;
    /// The offset of the library's side.
    const INNER: usize;
}

macro_rules! object {
    ($t:ty, $abi:ty, $inner:ty) => {
        object!($t, $abi, $inner, inner);
    };
    ($t:ty, $abi:ty, $inner:ty, $field:ident) => {
        // SAFETY: `#[repr(C)]` with `abi: $abi` first (see its definition) and the
        // library's side in `$field`.
        unsafe impl Object for $t {
            type Abi = $abi;
            type Inner = $inner;
            const INNER: usize = core::mem::offset_of!($t, $field);
        }
        const _: () = assert!(core::mem::offset_of!($t, abi) == 0);
    };
}

object!(Qp, ibv_qp, QpInner);
object!(Cq, ibv_cq, CqInner);
object!(Srq, ibv_srq, SrqInner);
object!(Ah, ibv_ah, AhInner);
object!(Mw, ibv_mw, MwInner);
object!(Mr, ibv_mr, MrInner);
object!(Channel, ibv_comp_channel, ChannelInner);
object!(RdmaId, rdma_cm_id, Arc<IdShared>, shared);

/// A live object of this library, as the program's pointer names it, for `'a` (the call
/// that received it, in practice).
pub struct Handle<'a, T: Object> {
    abi: NonNull<T::Abi>,
    life: PhantomData<&'a T>,
}

impl<T: Object> Clone for Handle<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Object> Copy for Handle<'_, T> {}

impl<T: Object> std::fmt::Debug for Handle<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Handle").field(&self.abi).finish()
    }
}

impl<'a, T: Object> Handle<'a, T> {
    /// The object behind the program's pointer; `None` for NULL.
    ///
    /// # Safety
    ///
    /// `p` is NULL or was returned by [`into_abi`] for a `T` that is not freed, and stays
    /// alive for `'a`.
    pub unsafe fn from_abi(p: *mut T::Abi) -> Option<Self> {
        NonNull::new(p).map(|abi| Handle {
            abi,
            life: PhantomData,
        })
    }

    /// The library's side of the object.
    pub fn inner(self) -> &'a T::Inner {
        // SAFETY: the pointer is a live boxed `T` for 'a (`from_abi`'s contract); `INNER`
        // is where its library side lies (`Object`'s contract), which the program does not
        // write, so a shared reference to it is sound.
        unsafe { &*self.abi.as_ptr().byte_add(T::INNER).cast::<T::Inner>() }
    }

    /// The pointer the program holds.
    pub fn abi(self) -> *mut T::Abi {
        self.abi.as_ptr()
    }
}

/// Boxes a new object; the pointer the program will hold (freed by [`free`]).
pub fn into_abi<T: Object>(obj: T) -> *mut T::Abi {
    Box::into_raw(Box::new(obj)).cast()
}

/// [`into_abi`], with `init` run on the boxed object and its address first (an ABI
/// `handle` derived from the address, as rdma-core's providers make one).
pub fn into_abi_at<T: Object>(obj: T, init: impl FnOnce(&mut T, usize)) -> *mut T::Abi {
    let mut b = Box::new(obj);
    let at = std::ptr::from_ref::<T>(&b) as usize;
    init(&mut b, at);
    Box::into_raw(b).cast()
}

/// Frees an object made by [`into_abi`].
///
/// # Safety
///
/// Nothing uses the object afterwards: the program gave it to its destroy verb, and the
/// library holds no handle to it.
pub unsafe fn free<T: Object>(h: Handle<'_, T>) {
    // SAFETY: the Box `into_abi` made (the ABI struct is its first field), not freed yet
    // (`from_abi`'s contract) and unused afterwards (this one's).
    drop(unsafe { Box::from_raw(h.abi().cast::<T>()) });
}

/// The library's side of a program's `*mut ibv_qp` (or `*mut ibv_qp_ex`); `None` for
/// NULL.
///
/// # Safety
///
/// `qp` is NULL or a live QP made by this library; the reference must not outlive it.
pub unsafe fn qp_from<'a>(qp: *mut ibv_qp) -> Option<&'a QpInner> {
    // SAFETY: by the contract.
    unsafe { Handle::<Qp>::from_abi(qp) }.map(Handle::inner)
}

/// The library's side of a program's `*mut ibv_cq` (or `*mut ibv_cq_ex`); `None` for
/// NULL.
///
/// # Safety
///
/// `cq` is NULL or a live CQ made by this library; the reference must not outlive it.
pub unsafe fn cq_from<'a>(cq: *mut ibv_cq) -> Option<&'a CqInner> {
    // SAFETY: by the contract.
    unsafe { Handle::<Cq>::from_abi(cq) }.map(Handle::inner)
}

/// The library's side of a program's `*mut ibv_srq`; `None` for NULL.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ made by this library; the reference must not outlive it.
pub unsafe fn srq_from<'a>(srq: *mut ibv_srq) -> Option<&'a SrqInner> {
    // SAFETY: by the contract.
    unsafe { Handle::<Srq>::from_abi(srq) }.map(Handle::inner)
}

/// The library's side of a program's `*mut ibv_ah`; `None` for NULL.
///
/// # Safety
///
/// `ah` is NULL or a live address handle made by this library; the reference must not
/// outlive it.
pub unsafe fn ah_from<'a>(ah: *mut ibv_ah) -> Option<&'a AhInner> {
    // SAFETY: by the contract.
    unsafe { Handle::<Ah>::from_abi(ah) }.map(Handle::inner)
}

/// The library's side of a program's `*mut ibv_comp_channel`; `None` for NULL.
///
/// # Safety
///
/// `ch` is NULL or a live channel made by this library; the reference must not outlive
/// it.
pub unsafe fn channel_from<'a>(ch: *mut ibv_comp_channel) -> Option<&'a ChannelInner> {
    // SAFETY: by the contract.
    unsafe { Handle::<Channel>::from_abi(ch) }.map(Handle::inner)
}

impl CtxShared {
    /// The registered CQ `id` (`None`: destroyed since).
    pub(crate) fn cq(&self, id: remem_verbs::CqId) -> Option<Handle<'_, Cq>> {
        // SAFETY: registered CQs are live: `ibv_destroy_cq` unregisters a CQ before it
        // frees it.
        unsafe { Handle::from_abi(self.cq_ptr(id)?) }
    }
}

/// What a memory region's `ibv_mr` says of its registration (the fields the library
/// writes; `handle` stays).
#[derive(Debug, Clone, Copy)]
pub struct Registration {
    /// `context`.
    pub context: *mut ibv_context,
    /// `pd`.
    pub pd: *mut ibv_pd,
    /// `addr`.
    pub addr: *mut core::ffi::c_void,
    /// `length`.
    pub length: usize,
    /// `lkey`.
    pub lkey: u32,
    /// `rkey`.
    pub rkey: u32,
}

impl Handle<'_, Mr> {
    /// The registration the program's `ibv_mr` shows, read in place.
    pub fn registration(self) -> Registration {
        let p = self.abi();
        // SAFETY: a live region; its fields are read in place.
        unsafe {
            Registration {
                context: (*p).context,
                pd: (*p).pd,
                addr: (*p).addr,
                length: (*p).length,
                lkey: (*p).lkey,
                rkey: (*p).rkey,
            }
        }
    }

    /// Writes a new registration into the program's `ibv_mr` (`ibv_rereg_mr`, whose
    /// caller does not use the region meanwhile).
    pub fn set_registration(self, r: Registration) {
        let p = self.abi();
        // SAFETY: a live region; the fields are written in place, no reference is made.
        unsafe {
            (&raw mut (*p).pd).write(r.pd);
            (&raw mut (*p).addr).write(r.addr);
            (&raw mut (*p).length).write(r.length);
            (&raw mut (*p).lkey).write(r.lkey);
            (&raw mut (*p).rkey).write(r.rkey);
        }
    }
}

impl Handle<'_, Mw> {
    /// The window's `rkey` as the program's `ibv_mw` says (the program may set it for a
    /// type 2 window), read in place.
    pub fn rkey(self) -> u32 {
        // SAFETY: a live window; one field read in place.
        unsafe { (*self.abi()).rkey }
    }

    /// Sets the program's `mw->rkey`.
    pub fn set_rkey(self, rkey: u32) {
        // SAFETY: a live window; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).rkey).write(rkey) };
    }
}

impl Handle<'_, Cq> {
    /// Sets the `status` and `wr_id` the program reads in its `ibv_cq_ex` after
    /// `ibv_start_poll` / `ibv_next_poll`.
    pub fn set_polled(self, status: ibv_wc_status, wr_id: u64) {
        let p = self.abi().cast::<ibv_cq_ex>();
        // SAFETY: a live CQ, whose ABI struct is an `ibv_cq_ex` (`Cq::abi`); the two
        // public fields are written in place (no reference is made), by the one thread
        // between start_poll and end_poll.
        unsafe {
            (&raw mut (*p).status).write(status);
            (&raw mut (*p).wr_id).write(wr_id);
        }
    }

    /// The program's `cq_context`, read in place (the program may change it).
    pub fn cq_context(self) -> *mut core::ffi::c_void {
        // SAFETY: a live CQ; one field read in place.
        unsafe { (*self.abi()).cq_context }
    }

    /// Sets the size the program reads in `cq->cqe` (as rdma-core's providers write it
    /// on resize).
    pub fn set_cqe(self, cqe: c_int) {
        // SAFETY: a live CQ; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).cqe).write(cqe) };
    }

    /// Adds to the program's `comp_events_completed` (the caller holds the CQ's events
    /// lock, as rdma-core counts under the CQ's mutex).
    pub fn add_comp_events_completed(self, n: u32) {
        // SAFETY: a live CQ; the counter is read and written in place, no reference is
        // made.
        unsafe {
            let p = &raw mut (*self.abi()).comp_events_completed;
            p.write(p.read().wrapping_add(n));
        }
    }
}

impl CqInner {
    /// The channel the CQ reports to, if any.
    pub(crate) fn channel(&self) -> Option<&ChannelInner> {
        // SAFETY: a CQ's channel stays alive while the CQ does (it counts in the
        // channel's `cqs`; destroying the channel is EBUSY until the CQ is destroyed).
        unsafe { channel_from(self.channel) }
    }
}

impl Handle<'_, Qp> {
    /// Sets the `state` the program reads in its `ibv_qp`.
    pub fn set_state(self, state: QpState) {
        // SAFETY: a live QP (`from_abi`'s contract); the field is written in place, no
        // reference to the program's struct is made.
        unsafe { (&raw mut (*self.abi()).state).write(state as ibv_qp_state) };
    }

    /// The `wr_id` and `wr_flags` the program wrote in its `ibv_qp_ex` before an
    /// `ibv_wr_*` builder, read in place.
    pub fn wr_id_flags(self) -> (u64, u32) {
        let p = self.abi().cast::<ibv_qp_ex>();
        // SAFETY: a live QP, whose ABI struct is an `ibv_qp_ex` (`Qp::abi`); the two
        // public fields are read in place.
        unsafe { ((*p).wr_id, (*p).wr_flags) }
    }

    /// The creation attributes as the program sees them now (`qp_context` and the queues
    /// read in place from its `ibv_qp`), with the granted `cap` and `sq_sig_all`.
    pub fn init_attr(self) -> ibv_qp_init_attr {
        let q = self.inner();
        let p = self.abi();
        // SAFETY: a live QP; its fields are read in place (the program may write
        // `qp_context` between calls, not during this one).
        unsafe {
            ibv_qp_init_attr {
                qp_context: (*p).qp_context,
                send_cq: (*p).send_cq,
                recv_cq: (*p).recv_cq,
                srq: (*p).srq,
                cap: crate::qp::cap_to(&q.cap),
                qp_type: (*p).qp_type,
                sq_sig_all: c_int::from(q.sq_sig_all),
            }
        }
    }
}

impl QpInner {
    /// The CQs and SRQ the QP was created with.
    pub(crate) fn queues(&self) -> (Option<&CqInner>, Option<&CqInner>, Option<&SrqInner>) {
        // SAFETY: a QP's CQs and SRQ stay alive while it does: their `users` count it, and
        // destroying them is EBUSY until it is destroyed.
        unsafe {
            (
                cq_from(self.send_cq),
                cq_from(self.recv_cq),
                srq_from(self.srq),
            )
        }
    }
}

/// The CQs and SRQ named by `ibv_qp_init_attr`: EINVAL for a NULL CQ.
///
/// # Safety
///
/// The attribute's `send_cq`, `recv_cq` and `srq` are NULL or live objects of this
/// library, alive for `'a`.
pub unsafe fn qp_queues<'a>(
    init: &ibv_qp_init_attr,
) -> Result<(&'a CqInner, &'a CqInner, Option<&'a SrqInner>), c_int> {
    // SAFETY: by the contract.
    unsafe {
        Ok((
            cq_from(init.send_cq).ok_or(libc::EINVAL)?,
            cq_from(init.recv_cq).ok_or(libc::EINVAL)?,
            srq_from(init.srq),
        ))
    }
}

impl<'a> Handle<'a, RdmaId> {
    /// The program's `id->qp`: NULL, or the QP attached to the id.
    pub fn qp_ptr(self) -> *mut ibv_qp {
        // SAFETY: a live id; one pointer field read in place.
        unsafe { (*self.abi()).qp }
    }

    /// The QP attached to the id (`rdma_create_qp`'s, or the program's own, which it
    /// keeps alive while attached, as librdmacm requires); `None` without one.
    pub fn qp(self) -> Option<Handle<'a, Qp>> {
        // SAFETY: `id->qp` is NULL or a live QP of this library while the id holds it.
        unsafe { Handle::from_abi(self.qp_ptr()) }
    }

    /// Sets the program's `id->channel`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`ch` is stored, never dereferenced"
    )]
    pub fn set_channel(self, ch: *mut rdma_event_channel) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).channel).write(ch) };
    }
}

// ----- contexts and protection domains (crate::context) -------------------------------------

object!(crate::context::Pd, ibv_pd, Arc<crate::context::PdInner>);

/// The context behind a program's `*mut ibv_context`; `None` for NULL or a context this
/// library did not make (its `abi_compat` is not the extended-ABI marker).
///
/// # Safety
///
/// `ctx` is NULL or points to a live `ibv_context`; the returned reference must not
/// outlive it.
pub unsafe fn ctx_from<'a>(ctx: *mut ibv_context) -> Option<&'a crate::context::Ctx> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: non-NULL and live by the contract; reading one field.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let raw = ctx
        .cast::<u8>()
        .wrapping_sub(core::mem::offset_of!(verbs_context, context))
        .cast::<crate::context::Ctx>();
    // SAFETY: every context this library hands out is `vctx.context` of a boxed `Ctx`
    // (checked by the marker above), so `raw` is that box.
    Some(unsafe { &*raw })
}

/// Boxes a new context; `init` runs on it with the `*mut ibv_context` the program will
/// hold (its `vctx.context`) before that is returned. Freed by [`ctx_free`].
pub fn ctx_into_abi(
    ctx: crate::context::Ctx,
    init: impl FnOnce(&crate::context::Ctx, *mut ibv_context),
) -> *mut ibv_context {
    let raw = Box::into_raw(Box::new(ctx));
    // SAFETY: `raw` is the live allocation just made; taking a field's address creates
    // no reference.
    let ibv = unsafe { &raw mut (*raw).vctx.context };
    // SAFETY: as above; a shared reference to the live box, which nothing else sees yet.
    init(unsafe { &*raw }, ibv);
    ibv
}

/// Frees a context made by [`ctx_into_abi`].
///
/// # Safety
///
/// `ctx` came from [`ctx_into_abi`], is not freed yet, and is not used afterwards.
pub unsafe fn ctx_free(ctx: *mut ibv_context) {
    let raw = ctx
        .cast::<u8>()
        .wrapping_sub(core::mem::offset_of!(verbs_context, context))
        .cast::<crate::context::Ctx>();
    // SAFETY: by the contract, `raw` is the Box made in `ctx_into_abi`.
    drop(unsafe { Box::from_raw(raw) });
}

/// The PD behind a program's `*mut ibv_pd`; `None` for NULL.
///
/// # Safety
///
/// `pd` is NULL or a live PD made by this library; the reference must not outlive it.
pub unsafe fn pd_from<'a>(pd: *mut ibv_pd) -> Option<&'a crate::context::Pd> {
    // SAFETY: by the contract, a non-NULL `pd` is the first field of a boxed `Pd`.
    unsafe { pd.cast::<crate::context::Pd>().as_ref() }
}

// ----- the RDMA CM's devices (crate::rdmacm::devices) ----------------------------------------

/// A context this library opened for the RDMA CM ([`crate::rdmacm::devices`]): it is
/// never closed by the library and lives for the process (a program must not close the
/// contexts `rdma_get_devices` lists or `rdma_cm_id.verbs` holds, as with librdmacm), so
/// its [`Ctx`](crate::context::Ctx) is reachable from safe code for as long as the
/// process runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CmContext(usize);

impl CmContext {
    /// Opens configured device `index` (`REMEM_IBV_DEVICES`) as `ibv_open_device` does:
    /// EINVAL if the configuration is bad, ENODEV for no such device, else the errno of
    /// `ibv_open_device`.
    pub(crate) fn open_configured(index: usize) -> Result<Self, c_int> {
        let devs = crate::device::configured().map_err(|_| libc::EINVAL)?;
        let d = devs.get(index).ok_or(libc::ENODEV)?;
        // SAFETY: a device entry of this library's list (which lives for the process).
        let ctx = unsafe { super::verbs::remem_ibv_ibv_open_device((&raw const d.abi).cast_mut()) };
        if ctx.is_null() {
            Err(super::errno())
        } else {
            Ok(Self(ctx as usize))
        }
    }

    /// A new context on a test's device `dev` (no `ibv_device` behind it).
    #[cfg(test)]
    pub(crate) fn create(dev: Arc<dyn remem_verbs::Context>) -> Self {
        Self(crate::context::Ctx::create(dev, core::ptr::null_mut()) as usize)
    }

    /// The `ibv_context` the program sees.
    pub(crate) fn as_ptr(self) -> *mut ibv_context {
        self.0 as *mut ibv_context
    }

    /// The library's context.
    pub(crate) fn ctx(self) -> Option<&'static crate::context::Ctx> {
        // SAFETY: a context this library made, never closed (see the type).
        unsafe { ctx_from(self.as_ptr()) }
    }

    /// A new PD on the context, as `ibv_alloc_pd` (NULL-free: its errno otherwise).
    pub(crate) fn alloc_pd(self) -> Result<*mut ibv_pd, c_int> {
        // SAFETY: the context is open (see the type).
        let p = unsafe { super::device::remem_ibv_ibv_alloc_pd(self.as_ptr()) };
        if p.is_null() {
            Err(super::errno())
        } else {
            Ok(p)
        }
    }
}

// ----- rdma_cm_id fields the library writes in place (issue 31: rdmacm::id) ---------------

/// The `ibv_gid` of an IP address on RoCE (IPv4-mapped for IPv4).
fn ip_gid(ip: std::net::IpAddr) -> ibv_gid {
    ibv_gid {
        raw: remem_verbs::Gid::from(ip.to_canonical()).0,
    }
}

impl IdShared {
    /// The id whose library side this is.
    ///
    /// An id's library side is reachable only while its id lives: from the id itself,
    /// from the router's routes and the channels' queued events (which `rdma_destroy_id`
    /// removes before it frees the id), and from the events handed out (which it waits
    /// for). Panics if called before the id is boxed (a bug).
    pub(crate) fn handle(&self) -> Handle<'_, RdmaId> {
        // SAFETY: `abi_ptr` is the boxed `RdmaId` holding this side, alive while the side
        // is reachable (above), so for the borrow of `self`.
        unsafe { Handle::from_abi(self.abi_ptr()) }.expect("an id's library side knows its id")
    }
}

impl<'a> Handle<'a, RdmaId> {
    /// Sets the id's source address (`route.addr.src_addr`, and `ibaddr.sgid` and
    /// `pkey`).
    pub fn set_src(self, a: std::net::SocketAddr) {
        let (ss, _) = super::sockaddr::std_to_storage(a);
        let p = self.abi();
        // SAFETY: a live id; fields written in place, no reference is made.
        unsafe {
            (&raw mut (*p).route.addr.u_src_addr.src_storage).write(ss);
            (&raw mut (*p).route.addr.addr.ibaddr.sgid).write(ip_gid(a.ip()));
            (&raw mut (*p).route.addr.addr.ibaddr.pkey).write(0xffff_u16.to_be());
        }
    }

    /// Sets the id's destination address (`route.addr.dst_addr`, and `ibaddr.dgid`).
    pub fn set_dst(self, a: std::net::SocketAddr) {
        let (ss, _) = super::sockaddr::std_to_storage(a);
        let p = self.abi();
        // SAFETY: a live id; fields written in place, no reference is made.
        unsafe {
            (&raw mut (*p).route.addr.u_dst_addr.dst_storage).write(ss);
            (&raw mut (*p).route.addr.addr.ibaddr.dgid).write(ip_gid(a.ip()));
        }
    }

    /// The source and destination GIDs of `route.addr.ibaddr`.
    pub fn gids(self) -> (ibv_gid, ibv_gid) {
        let p = self.abi();
        // SAFETY: a live id; two fields read in place.
        unsafe {
            (
                (*p).route.addr.addr.ibaddr.sgid,
                (*p).route.addr.addr.ibaddr.dgid,
            )
        }
    }

    /// Sets `route.path_rec` (the library's record, kept by the id) and `num_paths` 1.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`rec` is stored, never dereferenced"
    )]
    pub fn set_path_rec(self, rec: *mut ibv_sa_path_rec) {
        let p = self.abi();
        // SAFETY: a live id; fields written in place, no reference is made.
        unsafe {
            (&raw mut (*p).route.path_rec).write(rec);
            (&raw mut (*p).route.num_paths).write(1);
        }
    }

    /// The source port of `route.addr`, network order (0 for no address).
    pub fn src_port(self) -> u16 {
        // SAFETY: a live id; the field read in place (a union of address structures).
        let ss = unsafe { (*self.abi()).route.addr.u_src_addr.src_storage };
        port_of(&ss)
    }

    /// The destination port of `route.addr`, network order (0 for no address).
    pub fn dst_port(self) -> u16 {
        // SAFETY: a live id; the field read in place (a union of address structures).
        let ss = unsafe { (*self.abi()).route.addr.u_dst_addr.dst_storage };
        port_of(&ss)
    }

    /// Sets `id->verbs`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`verbs` is stored, never dereferenced"
    )]
    pub fn set_verbs(self, verbs: *mut ibv_context) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).verbs).write(verbs) };
    }

    /// `id->pd`.
    pub fn pd(self) -> *mut ibv_pd {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).pd }
    }

    /// Sets `id->pd`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`pd` is stored, never dereferenced"
    )]
    pub fn set_pd(self, pd: *mut ibv_pd) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).pd).write(pd) };
    }

    /// Sets `id->port_num`.
    pub fn set_port_num(self, port: u8) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).port_num).write(port) };
    }

    /// `id->srq`.
    pub fn srq_ptr(self) -> *mut ibv_srq {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).srq }
    }

    /// `id->context` (the program's).
    pub fn context(self) -> *mut core::ffi::c_void {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).context }
    }

    /// Sets `id->context` (a new id's, before the program sees it).
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`context` is stored, never dereferenced"
    )]
    pub fn set_context(self, context: *mut core::ffi::c_void) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).context).write(context) };
    }

    /// `id->send_cq`.
    pub fn send_cq(self) -> *mut ibv_cq {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).send_cq }
    }

    /// Sets `id->send_cq`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`cq` is stored, never dereferenced"
    )]
    pub fn set_send_cq(self, cq: *mut ibv_cq) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).send_cq).write(cq) };
    }

    /// `id->recv_cq`.
    pub fn recv_cq(self) -> *mut ibv_cq {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).recv_cq }
    }

    /// Sets `id->recv_cq`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`cq` is stored, never dereferenced"
    )]
    pub fn set_recv_cq(self, cq: *mut ibv_cq) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).recv_cq).write(cq) };
    }

    /// `id->send_cq_channel`.
    pub fn send_cq_channel(self) -> *mut ibv_comp_channel {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).send_cq_channel }
    }

    /// Sets `id->send_cq_channel`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`ch` is stored, never dereferenced"
    )]
    pub fn set_send_cq_channel(self, ch: *mut ibv_comp_channel) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).send_cq_channel).write(ch) };
    }

    /// `id->recv_cq_channel`.
    pub fn recv_cq_channel(self) -> *mut ibv_comp_channel {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).recv_cq_channel }
    }

    /// Sets `id->recv_cq_channel`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`ch` is stored, never dereferenced"
    )]
    pub fn set_recv_cq_channel(self, ch: *mut ibv_comp_channel) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).recv_cq_channel).write(ch) };
    }

    /// Sets `id->qp`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`qp` is stored, never dereferenced"
    )]
    pub fn set_qp(self, qp: *mut ibv_qp) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).qp).write(qp) };
    }

    /// Sets `id->srq`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`srq` is stored, never dereferenced"
    )]
    pub fn set_srq(self, srq: *mut ibv_srq) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).srq).write(srq) };
    }

    /// `id->event`: the event a synchronous call left (NULL if none).
    pub fn event(self) -> *mut crate::rdmacm::abi::rdma_cm_event {
        // SAFETY: a live id; one field read in place.
        unsafe { (*self.abi()).event }
    }

    /// Sets `id->event`.
    #[allow(
        clippy::not_unsafe_ptr_arg_deref,
        reason = "`ev` is stored, never dereferenced"
    )]
    pub fn set_event(self, ev: *mut crate::rdmacm::abi::rdma_cm_event) {
        // SAFETY: a live id; the field is written in place, no reference is made.
        unsafe { (&raw mut (*self.abi()).event).write(ev) };
    }
}

/// The port of a socket address, network order (0 for another family).
fn port_of(ss: &libc::sockaddr_storage) -> u16 {
    let p = (&raw const *ss).cast::<u8>();
    match c_int::from(ss.ss_family) {
        // SAFETY: an AF_INET storage holds a sockaddr_in (a storage is aligned for it).
        libc::AF_INET => unsafe { (*p.cast::<libc::sockaddr_in>()).sin_port },
        // SAFETY: an AF_INET6 storage holds a sockaddr_in6.
        libc::AF_INET6 => unsafe { (*p.cast::<libc::sockaddr_in6>()).sin6_port },
        _ => 0,
    }
}

/// The library's side of a program's id; `None` for NULL.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; the reference must not outlive it.
pub unsafe fn id_from<'a>(id: *mut rdma_cm_id) -> Option<&'a Arc<IdShared>> {
    // SAFETY: by the contract.
    unsafe { Handle::<RdmaId>::from_abi(id) }.map(Handle::inner)
}
