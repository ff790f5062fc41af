//! The context (`ibv_context` inside a `verbs_context`), the protection domain object,
//! and the per-context registries that turn remem's async events into object pointers.
//!
//! Safe code: the program's pointers become these objects in the FFI layer
//! ([`crate::ffi::handles`]: [`ctx_from`], [`pd_from`], and the boxing of new ones).

#![forbid(unsafe_code)]

use crate::abi::*;
pub use crate::ffi::handles::{ctx_from, pd_from};
use crate::ffi::handles::{ctx_into_abi, into_abi_at};
use remem_verbs::{CqId, ProtectionDomain};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

/// Every open context (to find an event's object in a sibling context on the same device:
/// contexts opened on one device share its remem context and its event queue).
static CONTEXTS: Mutex<Vec<Weak<CtxShared>>> = Mutex::new(Vec::new());

/// An open device: what `ibv_open_device` returns a pointer into.
///
/// `repr(C)` with the `verbs_context` first: the `*mut ibv_context` handed out points at
/// `vctx.context`, so the `verbs_context` (and this struct) start
/// `offset_of!(verbs_context, context)` bytes before it.
#[repr(C)]
pub struct Ctx {
    /// The function tables and the embedded `ibv_context` programs see.
    pub vctx: verbs_context,
    shared: Arc<CtxShared>,
    /// `ibv_context.cmd_fd`: an open descriptor, as a kernel context's is (see
    /// [`open_cmd_fd`]); closed with the context.
    _cmd_fd: Option<std::os::fd::OwnedFd>,
}

/// The pointer-free, thread-safe part of a context that objects keep.
pub struct CtxShared {
    /// The remem device.
    pub dev: Arc<dyn remem_verbs::Context>,
    /// The `ibv_device` the context was opened from (address).
    device: usize,
    /// The `ibv_context` programs see (address; set once the context is boxed).
    ctx: AtomicUsize,
    qps: Registry,
    cqs: Registry,
    srqs: Registry,
    /// The GID table programs see on port 1: the remem device's RoCE v2 entries, in order
    /// (their remem indices). A soft device's table is all RoCE v2 in rxe's layout
    /// (link-local, IPv4, other IPv6: `remem_soft::netdev`), so this is the identity
    /// there; a device of another provider may list RoCE v1 entries, which programs must
    /// not pick (the drop-in speaks RoCE v2 only).
    gid_map: Vec<u8>,
    /// Async events handed out and not yet acked, by object address.
    pending: Mutex<HashMap<usize, u32>>,
    acked: Condvar,
    /// This context's own queue of the device's async events (its `async_fd`), where the
    /// provider gives one (`Context::subscribe_async_events`): each `ibv_open_device` then
    /// has a descriptor of its own, as with a kernel device, and reads the events of its
    /// own objects and every port and device event. `None`: the contexts of a device share
    /// the device's queue and fd ([`crate::event::translate`] looks in siblings).
    pub events: Option<Arc<dyn remem_verbs::AsyncEventQueue>>,
}

/// Object addresses by number (QP number, CQ id, SRQ number).
#[derive(Default)]
struct Registry(Mutex<HashMap<u32, usize>>);

impl Registry {
    fn insert(&self, key: u32, ptr: usize) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, ptr);
    }
    fn remove(&self, key: u32) -> Option<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
    }
    fn get(&self, key: u32) -> Option<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied()
    }
}

impl std::fmt::Debug for CtxShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CtxShared")
            .field("device", &self.dev.info().name)
            .finish_non_exhaustive()
    }
}

impl CtxShared {
    /// The `*mut ibv_context` programs see for this context.
    pub fn ibv_context(&self) -> *mut ibv_context {
        self.ctx.load(Ordering::Acquire) as *mut ibv_context
    }

    /// The `*mut ibv_device` the context was opened from.
    pub fn ibv_device(&self) -> *mut ibv_device {
        self.device as *mut ibv_device
    }

    /// The remem GID index of the program's GID index `index` (port 1): `None` past the
    /// table. Every `sgid_index` a program passes (QP address vectors, AHs) goes through
    /// this before remem sees it.
    pub fn soft_gid_index(&self, index: u8) -> Option<u8> {
        self.gid_map.get(usize::from(index)).copied()
    }

    /// The program's GID index of a remem GID index (port 1), for what remem reports
    /// back (`ibv_query_qp`): `None` for an entry programs do not see.
    pub fn program_gid_index(&self, soft_index: u8) -> Option<u8> {
        self.gid_map
            .iter()
            .position(|&i| i == soft_index)
            .map(|p| p as u8)
    }

    /// The GID table programs see on `port_num` (1): the RoCE v2 entries, re-indexed
    /// from 0.
    pub fn gid_table(&self, port_num: u8) -> remem_verbs::Result<Vec<remem_verbs::GidEntry>> {
        let table = self.dev.gid_table(port_num)?;
        Ok(self
            .gid_map
            .iter()
            .enumerate()
            .filter_map(|(p, &soft)| {
                let mut e = table.iter().find(|e| e.index == u32::from(soft))?.clone();
                e.index = p as u32;
                Some(e)
            })
            .collect())
    }

    /// Registers a QP for async events (call when created).
    pub fn register_qp(&self, qp_num: u32, qp: *mut ibv_qp) {
        self.qps.insert(qp_num, qp as usize);
    }
    /// Unregisters a QP (call in destroy, before freeing it): waits until every async
    /// event handed out for it is acked.
    pub fn unregister_qp(&self, qp_num: u32) {
        if let Some(p) = self.qps.remove(qp_num) {
            self.wait_acked(p);
        }
    }
    /// The QP registered under `qp_num`.
    pub fn qp_ptr(&self, qp_num: u32) -> Option<*mut ibv_qp> {
        self.qps.get(qp_num).map(|p| p as *mut ibv_qp)
    }

    /// Registers a CQ for async events and completion events (call when created; for a
    /// `ibv_cq_ex` the pointer is the same object cast to `ibv_cq`).
    pub fn register_cq(&self, id: CqId, cq: *mut ibv_cq) {
        self.cqs.insert(id.0, cq as usize);
    }
    /// Unregisters a CQ (call in destroy, before freeing it): waits until every async
    /// event handed out for it is acked.
    pub fn unregister_cq(&self, id: CqId) {
        if let Some(p) = self.cqs.remove(id.0) {
            self.wait_acked(p);
        }
    }
    /// The CQ registered under `id`.
    pub fn cq_ptr(&self, id: CqId) -> Option<*mut ibv_cq> {
        self.cqs.get(id.0).map(|p| p as *mut ibv_cq)
    }

    /// Registers an SRQ for async events (call when created).
    pub fn register_srq(&self, srq_num: u32, srq: *mut ibv_srq) {
        self.srqs.insert(srq_num, srq as usize);
    }
    /// Unregisters an SRQ (call in destroy, before freeing it): waits until every async
    /// event handed out for it is acked.
    pub fn unregister_srq(&self, srq_num: u32) {
        if let Some(p) = self.srqs.remove(srq_num) {
            self.wait_acked(p);
        }
    }
    /// The SRQ registered under `srq_num`.
    pub fn srq_ptr(&self, srq_num: u32) -> Option<*mut ibv_srq> {
        self.srqs.get(srq_num).map(|p| p as *mut ibv_srq)
    }

    /// Notes an async event handed out for the object at `ptr` (until acked).
    pub fn event_out(&self, ptr: usize) {
        *self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(ptr)
            .or_default() += 1;
    }

    /// Notes the ack of an event for the object at `ptr`.
    pub fn event_acked(&self, ptr: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = pending.get_mut(&ptr) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&ptr);
            }
        }
        self.acked.notify_all();
    }

    /// The other open contexts on the same remem device.
    pub fn siblings(self: &Arc<Self>) -> Vec<Arc<CtxShared>> {
        let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.iter()
            .filter_map(Weak::upgrade)
            .filter(|c| !Arc::ptr_eq(c, self) && Arc::ptr_eq(&c.dev, &self.dev))
            .collect()
    }

    fn wait_acked(&self, ptr: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while pending.contains_key(&ptr) {
            pending = self.acked.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Ctx {
    /// The shared part objects keep.
    pub fn shared(&self) -> &Arc<CtxShared> {
        &self.shared
    }

    /// Makes a context for `dev`, opened from `device`; returns the pointer programs see.
    /// Freed by [`crate::ffi::handles::ctx_free`].
    pub fn create(dev: Arc<dyn remem_verbs::Context>, device: *mut ibv_device) -> *mut ibv_context {
        let events = dev.subscribe_async_events().ok();
        let async_fd = events
            .as_ref()
            .map_or_else(|| dev.async_fd().as_raw_fd(), |q| q.fd().as_raw_fd());
        let gid_map = program_gids(&dev.gid_table(1).unwrap_or_default());
        let shared = Arc::new(CtxShared {
            dev,
            gid_map,
            device: device as usize,
            ctx: AtomicUsize::new(0),
            qps: Registry::default(),
            cqs: Registry::default(),
            srqs: Registry::default(),
            pending: Mutex::new(HashMap::new()),
            acked: Condvar::new(),
            events,
        });
        {
            let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&shared));
        }
        let cmd_fd = open_cmd_fd(device);
        let raw_cmd_fd = cmd_fd.as_ref().map_or(-1, |f| f.as_raw_fd());
        let mut vctx = verbs_context_table(device, async_fd);
        vctx.context.cmd_fd = raw_cmd_fd;
        ctx_into_abi(
            Ctx {
                vctx,
                shared,
                _cmd_fd: cmd_fd,
            },
            |c, ibv| c.shared.ctx.store(ibv as usize, Ordering::Release),
        )
    }
}

/// The descriptor a context's `cmd_fd` holds: programs `fstat` it, pass it on, or close
/// their own copies of it, and a kernel context's is the open uverbs character device.
/// Here: `/dev/infiniband/<dev_name>` where it exists (what `remem run` provides), else
/// `/dev/null`, opened read-write and close-on-exec as libibverbs opens uverbs; `None`
/// (cmd_fd -1) only if neither opens. No command goes through it: the soft device's verbs
/// are calls into this library.
fn open_cmd_fd(device: *mut ibv_device) -> Option<std::os::fd::OwnedFd> {
    let dev_name = crate::device::device_from(device).map_or_else(String::new, |d| {
        let bytes: Vec<u8> = d
            .abi
            .dev_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let open = |path: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()
            .map(std::os::fd::OwnedFd::from)
    };
    let uverbs = (!dev_name.is_empty() && !dev_name.contains('/'))
        .then(|| open(&format!("/dev/infiniband/{dev_name}")))
        .flatten();
    uverbs.or_else(|| open("/dev/null"))
}

/// The remem indices of the GID entries programs see: the RoCE v2 ones, in index order.
pub fn program_gids(table: &[remem_verbs::GidEntry]) -> Vec<u8> {
    let mut v2: Vec<u8> = table
        .iter()
        .filter(|e| e.gid_type == remem_verbs::GidType::RoceV2)
        .filter_map(|e| u8::try_from(e.index).ok())
        .collect();
    v2.sort_unstable();
    v2
}

/// The function tables of every context.
fn verbs_context_table(device: *mut ibv_device, async_fd: i32) -> verbs_context {
    let ops = ibv_context_ops {
        _compat_query_device: Some(crate::ffi::verbs::remem_ibv_ibv_query_device),
        _compat_query_port: Some(crate::ffi::verbs::remem_ibv_ibv_query_port),
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: Some(crate::ffi::device::alloc_mw),
        bind_mw: Some(crate::ffi::device::bind_mw),
        dealloc_mw: Some(crate::ffi::device::dealloc_mw),
        _compat_create_cq: None,
        poll_cq: Some(crate::ffi::queues::poll_cq),
        req_notify_cq: Some(crate::ffi::queues::req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(crate::ffi::queues::post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(crate::ffi::queues::post_send),
        post_recv: Some(crate::ffi::queues::post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    };
    verbs_context {
        query_port: Some(crate::ffi::verbs::query_port),
        advise_mr: None,
        alloc_null_mr: None,
        read_counters: None,
        attach_counters_point_flow: None,
        create_counters: None,
        destroy_counters: None,
        reg_dm_mr: None,
        alloc_dm: None,
        free_dm: None,
        modify_flow_action_esp: None,
        destroy_flow_action: None,
        create_flow_action_esp: None,
        modify_qp_rate_limit: None,
        alloc_parent_domain: None,
        dealloc_td: None,
        alloc_td: None,
        modify_cq: None,
        post_srq_ops: None,
        destroy_rwq_ind_table: None,
        create_rwq_ind_table: None,
        destroy_wq: None,
        modify_wq: None,
        create_wq: None,
        query_rt_values: None,
        create_cq_ex: Some(crate::ffi::queues::create_cq_ex),
        r#priv: std::ptr::null_mut(),
        query_device_ex: Some(crate::ffi::verbs::query_device_ex),
        ibv_destroy_flow: None,
        ABI_placeholder2: None,
        ibv_create_flow: None,
        ABI_placeholder1: None,
        open_qp: None,
        create_qp_ex: Some(crate::ffi::queues::create_qp_ex),
        get_srq_num: Some(crate::ffi::queues::get_srq_num),
        create_srq_ex: Some(crate::ffi::queues::create_srq_ex),
        open_xrcd: None,
        close_xrcd: None,
        _ABI_placeholder3: 0,
        sz: std::mem::size_of::<verbs_context>(),
        context: ibv_context {
            device,
            ops,
            cmd_fd: -1,
            async_fd,
            num_comp_vectors: 1,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            abi_compat: VERBS_ABI_IS_EXTENDED,
        },
    }
}

// ---------------------------------------------------------------------------------------
// Protection domains.

/// A protection domain: what `ibv_alloc_pd` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Pd {
    /// The `ibv_pd` programs see.
    pub abi: ibv_pd,
    /// The Rust side.
    pub inner: Arc<PdInner>,
}

/// The thread-safe part of a PD that objects made on it keep.
pub struct PdInner {
    /// The remem protection domain.
    pub pd: Arc<dyn ProtectionDomain>,
    /// Its context.
    pub ctx: Arc<CtxShared>,
    /// The `ibv_pd` programs see (address).
    ibv: AtomicUsize,
    users: AtomicUsize,
}

impl std::fmt::Debug for PdInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdInner")
            .field("users", &self.users.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// An object's hold on its PD: while one exists, `ibv_dealloc_pd` fails with EBUSY.
#[derive(Debug)]
pub struct PdUse(Arc<PdInner>);

impl PdUse {
    /// The PD held.
    pub fn pd(&self) -> &Arc<PdInner> {
        &self.0
    }
}

impl Drop for PdUse {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl PdInner {
    /// Takes a hold on the PD for an object made on it.
    pub fn hold(self: &Arc<Self>) -> PdUse {
        self.users.fetch_add(1, Ordering::AcqRel);
        PdUse(Arc::clone(self))
    }

    /// How many objects hold the PD.
    pub fn users(&self) -> usize {
        self.users.load(Ordering::Acquire)
    }

    /// The `*mut ibv_pd` programs see.
    pub fn ibv_pd(&self) -> *mut ibv_pd {
        self.ibv.load(Ordering::Acquire) as *mut ibv_pd
    }
}

impl Pd {
    /// Makes a PD object for `pd` in `ctx`; returns the pointer programs see. Freed by
    /// [`crate::ffi::handles::free`].
    pub fn create(ctx: &Arc<CtxShared>, pd: Arc<dyn ProtectionDomain>) -> *mut ibv_pd {
        into_abi_at(
            Pd {
                abi: ibv_pd {
                    context: ctx.ibv_context(),
                    handle: 0,
                },
                inner: Arc::new(PdInner {
                    pd,
                    ctx: Arc::clone(ctx),
                    ibv: AtomicUsize::new(0),
                    users: AtomicUsize::new(0),
                }),
            },
            |p, at| {
                p.abi.handle = (at as u32) >> 4;
                p.inner.ibv.store(at, Ordering::Release);
            },
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    /// A soft device on a loopback address of its own, for tests.
    pub(crate) fn soft_device() -> Arc<dyn remem_verbs::Context> {
        Arc::new(
            remem_soft::SoftContext::bind_with(
                "127.0.0.1:0".parse().unwrap(),
                &remem_soft::SoftOptions::default(),
            )
            .unwrap(),
        )
    }
}
