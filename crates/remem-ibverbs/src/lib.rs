//! remem's rdma-core provider: the [`remem_verbs`] model over libibverbs, for RDMA NICs
//! (mlx5, irdma, bnxt_re, efa…) and the kernel's Soft-RoCE (`rdma_rxe`).
//!
//! Built on [sideway](https://crates.io/crates/sideway) and its `rdma-mummy-sys`
//! bindings, which load libibverbs when first used: a binary with this provider builds and
//! starts on a machine without rdma-core, where [`IbverbsProvider::devices`] is simply
//! empty. Building needs cmake and libclang (the bindings' shim is compiled from C).
//!
//! What this provider adds to plain libibverbs, so that it behaves like remem's soft
//! provider behind the same traits:
//!
//! - every scatter/gather entry is checked when posted against the memory regions of the
//!   QP's protection domain (key, bounds, LOCAL_WRITE where the NIC writes): a bad entry
//!   is a typed [`Error`] from `post_send`/`post_recv`, never an address handed to the
//!   NIC or to the provider's inline copy;
//! - QP modifications are checked against the IBTA transition table
//!   ([`remem_verbs::check_modify`]) before the kernel sees them, for typed errors;
//! - immediate data is a host-order `u32` (libibverbs carries it in network order).
//!
//! Not offered: FLUSH and ATOMIC WRITE (classic `ibv_post_send` has no place for them;
//! [`DeviceAttr::flush_global`] and friends are `false`, and the async API falls back),
//! memory windows (`Unsupported`) and regions with an I/O virtual address of their own.
//! RC, UC and UD QPs are all created. Device counters are the kernel's sysfs `hw_counters` (and port
//! `counters`).
//!
//! The only `unsafe` code is in the private module `sys`, each block with its reasons.

#![warn(missing_docs)]

pub mod cm;
mod sys;

use remem_verbs::{
    AccessFlags, AddressHandle, AhAttr, AsyncEvent, AsyncEventElement, AsyncEventType, AtomicCap,
    CompletionChannel, CompletionQueue, Context, Counter, CqId, DeviceAttr, DeviceInfo, Error, Gid,
    GidEntry, GidType, LinkLayer, MemRegion, MemoryRegion, Mtu, PortAttr, PortState, PostError,
    ProtectionDomain, Provider, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, Result, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, SrqAttr, WcFlags, WcOpcode,
    WcStatus, WorkCompletion,
};
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use std::any::Any;
use std::collections::HashMap;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use sys::Zeroed;

/// The provider's name in [`DeviceInfo::provider`].
pub const PROVIDER_NAME: &str = "ibverbs";

/// The rdma-core provider: the devices libibverbs lists (`ibv_get_device_list`).
#[derive(Debug, Default, Clone, Copy)]
pub struct IbverbsProvider;

impl IbverbsProvider {
    /// The provider.
    pub fn new() -> Self {
        IbverbsProvider
    }
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOMEM) => Error::Exhausted("the device is out of resources"),
        Some(libc::EOPNOTSUPP) => Error::Unsupported("refused by the device"),
        Some(libc::EINVAL) => Error::InvalidArgument(format!("{what}: {e}")),
        _ => Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}"))),
    }
}

fn other(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!("{what}: {e}")))
}

fn netdev_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    std::fs::read_dir("/sys/class/net")
        .ok()?
        .flatten()
        .find_map(|e| {
            let idx = std::fs::read_to_string(e.path().join("ifindex")).ok()?;
            (idx.trim().parse::<u32>().ok()? == ifindex)
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
}

fn gid_type(raw: u32) -> GidType {
    match raw {
        2 => GidType::RoceV2,
        1 => GidType::RoceV1,
        _ => GidType::Ib,
    }
}

fn gid_entry(ctx: &DeviceContext, port: u8, index: u32) -> Result<GidEntry> {
    let (raw, ty, ifindex) =
        sys::query_gid(ctx, port, index).map_err(|e| io_err("ibv_query_gid_ex", e))?;
    if raw == [0; 16] {
        return Err(Error::InvalidArgument(format!(
            "GID {index} of port {port} is empty"
        )));
    }
    Ok(GidEntry {
        index,
        gid: Gid(raw),
        gid_type: gid_type(ty),
        port_num: port,
        netdev: netdev_name(ifindex),
    })
}

fn gid_table(ctx: &DeviceContext, port: u8) -> Vec<GidEntry> {
    let len = ctx
        .query_port(port)
        .map(|p| p.attr.gid_tbl_len.max(0) as u32)
        .unwrap_or(0);
    (0..len)
        .filter_map(|i| gid_entry(ctx, port, i).ok())
        .collect()
}

fn device_info(name: String, guid: u64, ctx: &DeviceContext) -> DeviceInfo {
    let ports = ctx
        .query_device()
        .map(|a| a.attr.orig_attr.phys_port_cnt)
        .unwrap_or(1);
    let gids: Vec<GidEntry> = (1..=ports).flat_map(|p| gid_table(ctx, p)).collect();
    DeviceInfo {
        name,
        provider: PROVIDER_NAME,
        node_guid: guid,
        netdev: gids.iter().find_map(|g| g.netdev.clone()),
        gids,
        udp_addr: None,
    }
}

impl Provider for IbverbsProvider {
    fn name(&self) -> &'static str {
        PROVIDER_NAME
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        // No libibverbs, no devices, or no permission: no devices.
        let Ok(list) = DeviceList::new() else {
            return Ok(Vec::new());
        };
        Ok(list
            .iter()
            .filter_map(|dev| {
                let ctx = dev.open().ok()?;
                Some(device_info(dev.name(), dev.guid().as_u64(), &ctx))
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
        let list = DeviceList::new().map_err(|_| Error::NoSuchDevice(name.to_string()))?;
        let dev = list
            .iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::NoSuchDevice(name.to_string()))?;
        let ctx = dev
            .open()
            .map_err(|e| Error::DeviceUnavailable(format!("{name}: {e}")))?;
        let info = device_info(dev.name(), dev.guid().as_u64(), &ctx);
        let async_fd = sys::async_fd(&ctx).map_err(|e| io_err("async fd", e))?;
        Ok(Arc::new_cyclic(|me| IbContext {
            info,
            ctx,
            async_fd,
            ids: Arc::new(AtomicU32::new(1)),
            me: me.clone(),
        }))
    }
}

/// An open rdma-core device.
pub struct IbContext {
    info: DeviceInfo,
    ctx: Arc<DeviceContext>,
    async_fd: RawFd,
    ids: Arc<AtomicU32>,
    /// Itself, for the CM ids it creates ([`remem_verbs::CmId::context`]).
    me: std::sync::Weak<IbContext>,
}

impl std::fmt::Debug for IbContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbContext")
            .field("name", &self.info.name)
            .finish()
    }
}

fn mtu(raw: u32) -> Mtu {
    Mtu::ALL
        .into_iter()
        .find(|m| *m as u32 == raw)
        .unwrap_or(Mtu::Mtu1024)
}

fn port_state(raw: u32) -> PortState {
    match raw {
        1 => PortState::Down,
        2 => PortState::Init,
        3 => PortState::Armed,
        4 => PortState::Active,
        5 => PortState::ActiveDefer,
        _ => PortState::Nop,
    }
}

impl Context for IbContext {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let a = self
            .ctx
            .query_device()
            .map_err(|e| other("ibv_query_device", e))?
            .attr
            .orig_attr;
        let n = |v: i32| v.max(0) as u32;
        let fw = a
            .fw_ver
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8 as char)
            .collect();
        let max_msg_sz = self
            .ctx
            .query_port(1)
            .map(|p| p.attr.max_msg_sz)
            .unwrap_or(1 << 31);
        Ok(DeviceAttr {
            fw_ver: fw,
            node_guid: u64::from_be(a.node_guid),
            sys_image_guid: u64::from_be(a.sys_image_guid),
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: n(a.max_qp),
            max_qp_wr: n(a.max_qp_wr),
            max_sge: n(a.max_sge),
            max_sge_rd: n(a.max_sge_rd),
            max_cq: n(a.max_cq),
            max_cqe: n(a.max_cqe),
            max_mr: n(a.max_mr),
            max_pd: n(a.max_pd),
            max_qp_rd_atom: n(a.max_qp_rd_atom),
            max_qp_init_rd_atom: n(a.max_qp_init_rd_atom),
            max_res_rd_atom: n(a.max_res_rd_atom),
            atomic_cap: match a.atomic_cap {
                1 => AtomicCap::Hca,
                2 => AtomicCap::Glob,
                _ => AtomicCap::None,
            },
            max_srq: n(a.max_srq),
            max_srq_wr: n(a.max_srq_wr),
            max_srq_sge: n(a.max_srq_sge),
            // Not in ibv_device_attr: a QP's granted max_inline_data says it.
            max_inline_data: 0,
            max_ah: n(a.max_ah),
            phys_port_cnt: a.phys_port_cnt,
            max_msg_sz,
            flush_global: false,
            flush_persistent: false,
            atomic_write: false,
            // Memory windows are not offered through this provider (yet).
            max_mw: 0,
            mcast: remem_verbs::McastCaps {
                max_mcast_grp: n(a.max_mcast_grp),
                max_mcast_qp_attach: n(a.max_mcast_qp_attach),
                max_total_mcast_qp_attach: n(a.max_total_mcast_qp_attach),
            },
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num == 0 {
            return Err(Error::InvalidArgument("ports are numbered from 1".into()));
        }
        let p = self
            .ctx
            .query_port(port_num)
            .map_err(|e| Error::InvalidArgument(format!("port {port_num}: {e}")))?
            .attr;
        Ok(PortAttr {
            state: port_state(p.state),
            max_mtu: mtu(p.max_mtu),
            active_mtu: mtu(p.active_mtu),
            gid_tbl_len: p.gid_tbl_len.max(0) as u32,
            max_msg_sz: p.max_msg_sz,
            pkey_tbl_len: p.pkey_tbl_len,
            link_layer: if p.link_layer == 1 {
                LinkLayer::InfiniBand
            } else {
                LinkLayer::Ethernet
            },
            active_width: p.active_width,
            active_speed: p.active_speed,
            phys_state: p.phys_state,
        })
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<GidEntry> {
        gid_entry(&self.ctx, port_num, index)
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        let pd = self.ctx.alloc_pd().map_err(|e| other("ibv_alloc_pd", e))?;
        Ok(Arc::new(IbPd {
            inner: Arc::new(PdInner {
                pd,
                device: self.info.name.clone(),
                mrs: RwLock::new(HashMap::new()),
                ids: self.ids.clone(),
            }),
        }))
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompletionChannel>> {
        let ch = self
            .ctx
            .create_comp_channel()
            .map_err(|e| other("ibv_create_comp_channel", e))?;
        let fd = sys::channel_fd(&ch).map_err(|e| io_err("channel fd", e))?;
        Ok(Arc::new(IbChannel { ch, fd }))
    }

    fn create_cq(
        &self,
        cqe: u32,
        channel: Option<Arc<dyn CompletionChannel>>,
    ) -> Result<Arc<dyn CompletionQueue>> {
        if cqe == 0 {
            return Err(Error::InvalidArgument(
                "a CQ needs at least one entry".into(),
            ));
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut b = self.ctx.create_cq_builder();
        b.setup_cqe(cqe);
        b.setup_cq_context(id as usize as *mut std::ffi::c_void);
        if let Some(ch) = &channel {
            let ch: Arc<IbChannel> = own(ch.clone(), "completion channel")?;
            b.setup_comp_channel(&ch.ch, 0);
        }
        let cq = b.build().map_err(|e| other("ibv_create_cq", e))?;
        Ok(Arc::new(IbCq {
            id: CqId(id),
            cq: sys::Cq(cq),
            _channel: channel,
        }))
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        sys::borrow_fd(self, self.async_fd)
    }

    fn get_async_event(&self) -> Option<AsyncEvent> {
        use AsyncEventType as T;
        loop {
            let ev = sys::get_async_event(&self.ctx)?;
            let event_type = match ev.event_type {
                0 => T::CqErr,
                1 => T::QpFatal,
                2 => T::QpReqErr,
                3 => T::QpAccessErr,
                4 => T::CommEst,
                5 => T::SqDrained,
                6 => T::PathMig,
                7 => T::PathMigErr,
                8 => T::DeviceFatal,
                9 => T::PortActive,
                10 => T::PortErr,
                11 => T::LidChange,
                12 => T::PkeyChange,
                13 => T::SmChange,
                14 => T::SrqErr,
                15 => T::SrqLimitReached,
                16 => T::QpLastWqeReached,
                17 => T::ClientReregister,
                18 => T::GidChange,
                19 => T::WqFatal,
                // An event type newer than this crate: taken, acknowledged and skipped.
                _ => continue,
            };
            let element = match event_type {
                T::CqErr => AsyncEventElement::Cq(CqId(ev.element as u32)),
                T::SrqErr | T::SrqLimitReached => AsyncEventElement::Srq(ev.element as u32),
                T::PortActive
                | T::PortErr
                | T::LidChange
                | T::PkeyChange
                | T::SmChange
                | T::ClientReregister
                | T::GidChange => AsyncEventElement::Port(ev.element as u8),
                T::DeviceFatal | T::WqFatal => AsyncEventElement::Device,
                _ => AsyncEventElement::Qp(ev.element as u32),
            };
            return Some(AsyncEvent {
                event_type,
                element,
            });
        }
    }

    /// The device's hardware counters as the kernel exposes them in sysfs
    /// (`/sys/class/infiniband/<dev>/hw_counters`, each port's `hw_counters` and
    /// `counters`; for kernel rxe `sent_pkts`, `rcvd_pkts`, `retry_exceeded_err`, …). A
    /// port's counters are named `<file>` for port 1 and `p<port>:<file>` for the others.
    fn counters(&self) -> Vec<Counter> {
        sysfs_counters(&std::path::Path::new("/sys/class/infiniband").join(&self.info.name))
    }

    /// An RDMA CM event channel over librdmacm ([`cm::IbCmChannel`]).
    fn create_cm_channel(&self) -> Result<Arc<dyn remem_verbs::CmChannel>> {
        self.cm_channel()
    }

    /// An RDMA CM id over librdmacm on this device ([`cm::IbCmId`]); `channel` must be
    /// this provider's.
    fn create_cm_id(
        &self,
        channel: &Arc<dyn remem_verbs::CmChannel>,
        ps: remem_verbs::PortSpace,
    ) -> Result<Arc<dyn remem_verbs::CmId>> {
        self.cm_id(channel, ps)
    }
}

/// Counter names, each leaked once: there are as many as the kernel's drivers define.
fn intern(name: String) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.push(leaked);
    leaked
}

/// The counters under a device's sysfs directory (see [`IbContext::counters`]); files
/// that do not hold a number are skipped.
fn sysfs_counters(dev: &std::path::Path) -> Vec<Counter> {
    let mut out = Vec::new();
    let mut read_dir = |dir: std::path::PathBuf, prefix: &str| {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut found: Vec<(String, u64)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let value = std::fs::read_to_string(e.path())
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                Some((format!("{prefix}{name}"), value))
            })
            .collect();
        found.sort();
        out.extend(found.into_iter().map(|(name, value)| Counter {
            name: intern(name),
            value,
        }));
    };
    read_dir(dev.join("hw_counters"), "");
    let mut ports: Vec<u32> = std::fs::read_dir(dev.join("ports"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    ports.sort_unstable();
    for port in ports {
        let prefix = if port == 1 {
            String::new()
        } else {
            format!("p{port}:")
        };
        let dir = dev.join("ports").join(port.to_string());
        read_dir(dir.join("hw_counters"), &prefix);
        read_dir(dir.join("counters"), &prefix);
    }
    out
}

/// What a PD knows of its memory regions, to check scatter/gather entries when posted.
#[derive(Debug, Clone, Copy)]
struct MrEntry {
    addr: u64,
    len: u64,
    access: AccessFlags,
}

struct PdInner {
    pd: Arc<sideway::ibverbs::protection_domain::ProtectionDomain>,
    /// The device's name (RDMA CM checks a QP is on the device of its connection).
    device: String,
    mrs: RwLock<HashMap<u32, MrEntry>>,
    ids: Arc<AtomicU32>,
}

impl PdInner {
    /// Checks every entry of a list: a region of this PD holds it, with LOCAL_WRITE if
    /// the NIC writes there.
    fn check(&self, sg: &[Sge], need_write: bool) -> Result<()> {
        let mrs = self.mrs.read().unwrap_or_else(|p| p.into_inner());
        for s in sg {
            let mr = mrs
                .get(&s.lkey)
                .ok_or(Error::InvalidLkey { lkey: s.lkey })?;
            let end = s.addr.checked_add(u64::from(s.length));
            if s.addr < mr.addr || end.is_none_or(|e| e > mr.addr + mr.len) {
                return Err(Error::SgeOutOfBounds {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                });
            }
            if need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::LocalAccess { lkey: s.lkey });
            }
        }
        Ok(())
    }
}

/// A protection domain of an rdma-core device.
pub struct IbPd {
    inner: Arc<PdInner>,
}

/// Recovers this provider's object from a handle; a handle of another provider is an
/// `InvalidArgument` naming `what`.
fn own<T: Any + Send + Sync>(handle: Arc<dyn Any + Send + Sync>, what: &str) -> Result<Arc<T>> {
    handle
        .downcast::<T>()
        .map_err(|_| Error::InvalidArgument(format!("{what} of another provider")))
}

fn own_cq(cq: &Arc<dyn CompletionQueue>) -> Result<Arc<IbCq>> {
    own(cq.clone(), "CQ")
}

fn own_srq(srq: &Arc<dyn SharedReceiveQueue>) -> Result<Arc<IbSrq>> {
    own(srq.clone(), "SRQ")
}

fn ah_attr(a: &AhAttr) -> sys::ibv_ah_attr {
    let mut r = sys::ibv_ah_attr::zeroed();
    r.grh.dgid.raw = a.dgid.0;
    r.grh.flow_label = a.flow_label;
    r.grh.sgid_index = a.sgid_index;
    r.grh.hop_limit = a.hop_limit;
    r.grh.traffic_class = a.traffic_class;
    r.is_global = u8::from(a.is_global);
    r.dlid = a.dlid;
    r.sl = a.sl;
    r.src_path_bits = a.src_path_bits;
    r.static_rate = a.static_rate;
    r.port_num = a.port_num;
    r
}

fn from_ah_attr(r: &sys::ibv_ah_attr) -> AhAttr {
    AhAttr {
        // A union of 16 plain bytes either way; read through the copy-out helper.
        dgid: Gid(sys_gid(r)),
        flow_label: r.grh.flow_label,
        sgid_index: r.grh.sgid_index,
        hop_limit: r.grh.hop_limit,
        traffic_class: r.grh.traffic_class,
        is_global: r.is_global != 0,
        dlid: r.dlid,
        sl: r.sl,
        src_path_bits: r.src_path_bits,
        static_rate: r.static_rate,
        port_num: r.port_num,
        // rdma-core's address vector has no port: RoCEv2 goes to 4791.
        udp_port: 0,
    }
}

/// A path to a UDP port other than 4791: rdma-core devices (NICs, kernel rxe) cannot send
/// there ([`Context::can_send_to_udp_port`]'s default says so).
fn check_udp_port(a: &AhAttr) -> Result<()> {
    if a.udp_port == 0 || a.udp_port == remem_verbs::ROCEV2_UDP_PORT {
        Ok(())
    } else {
        Err(Error::Unsupported(
            "sending RoCEv2 to a UDP port other than 4791",
        ))
    }
}

fn sys_gid(r: &sys::ibv_ah_attr) -> [u8; 16] {
    sys::gid_bytes(&r.grh.dgid)
}

impl ProtectionDomain for IbPd {
    fn reg_mr(&self, region: MemRegion, access: AccessFlags) -> Result<Arc<dyn MemoryRegion>> {
        access
            .validate_for_mr()
            .map_err(|e| Error::InvalidArgument(e.into()))?;
        if region.addr() != region.buffer().addr() + region.offset() as u64 {
            // rdma-core has ibv_reg_mr_iova2 for it, but this provider registers through
            // sideway's ibv_reg_mr, which knows virtual addresses only.
            return Err(Error::Unsupported(
                "memory regions with an I/O virtual address (MemRegion::with_iova) on the \
                 rdma-core provider",
            ));
        }
        // This provider offers no FLUSH (the device attributes say so), and kernels without
        // it refuse the bits: register without them.
        let raw_access = access
            .difference(AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT)
            .bits() as i32;
        let mr = sys::reg_mr(
            &self.inner.pd,
            region.buffer(),
            region.offset(),
            region.len(),
            raw_access,
        )
        .map_err(|e| io_err("ibv_reg_mr", e))?;
        let entry = MrEntry {
            addr: region.addr(),
            len: region.len() as u64,
            access,
        };
        self.inner
            .mrs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mr.lkey(), entry);
        Ok(Arc::new(IbMr {
            mr,
            region,
            access,
            pd: self.inner.clone(),
        }))
    }

    fn create_qp(&self, init: &QpInitAttr) -> Result<Arc<dyn QueuePair>> {
        let qp_type = match init.qp_type {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
        };
        let send_cq = own_cq(&init.send_cq)?;
        let recv_cq = own_cq(&init.recv_cq)?;
        let srq = init.srq.as_ref().map(own_srq).transpose()?;
        let mut raw = sys::ibv_qp_init_attr::zeroed();
        raw.send_cq = send_cq.cq.ptr();
        raw.recv_cq = recv_cq.cq.ptr();
        raw.srq = srq.as_ref().map_or(std::ptr::null_mut(), |s| s.srq.ptr());
        raw.cap.max_send_wr = init.cap.max_send_wr;
        raw.cap.max_recv_wr = if srq.is_some() {
            0
        } else {
            init.cap.max_recv_wr
        };
        raw.cap.max_send_sge = init.cap.max_send_sge;
        raw.cap.max_recv_sge = if srq.is_some() {
            0
        } else {
            init.cap.max_recv_sge
        };
        raw.cap.max_inline_data = init.cap.max_inline_data;
        raw.qp_type = qp_type;
        raw.sq_sig_all = i32::from(init.sq_sig_all);
        let qp =
            sys::Qp::create(&self.inner.pd, &mut raw).map_err(|e| io_err("ibv_create_qp", e))?;
        let cap = QpCap {
            max_send_wr: raw.cap.max_send_wr,
            max_recv_wr: raw.cap.max_recv_wr,
            max_send_sge: raw.cap.max_send_sge,
            max_recv_sge: raw.cap.max_recv_sge,
            max_inline_data: raw.cap.max_inline_data,
        };
        Ok(Arc::new(IbQp {
            qp,
            qp_type: init.qp_type,
            cap,
            has_srq: srq.is_some(),
            _send_cq: init.send_cq.clone(),
            _recv_cq: init.recv_cq.clone(),
            _srq: init.srq.clone(),
            pd: self.inner.clone(),
        }))
    }

    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SharedReceiveQueue>> {
        let id = self.inner.ids.fetch_add(1, Ordering::Relaxed);
        let (srq, max_wr, max_sge) = sys::Srq::create(
            &self.inner.pd,
            attr.max_wr,
            attr.max_sge,
            attr.srq_limit,
            id,
        )
        .map_err(|e| io_err("ibv_create_srq", e))?;
        Ok(Arc::new(IbSrq {
            srq,
            id,
            max_sge,
            _max_wr: max_wr,
            pd: self.inner.clone(),
        }))
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AddressHandle>> {
        check_udp_port(attr)?;
        let mut raw = ah_attr(attr);
        let ah =
            sys::Ah::create(&self.inner.pd, &mut raw).map_err(|e| io_err("ibv_create_ah", e))?;
        Ok(Arc::new(IbAh {
            ah,
            attr: *attr,
            pd: self.inner.clone(),
        }))
    }
}

/// A registered memory region of an rdma-core device.
pub struct IbMr {
    // Deregistered first (fields drop in order), then the memory may go.
    mr: Arc<sideway::ibverbs::memory_region::MemoryRegion>,
    region: MemRegion,
    access: AccessFlags,
    pd: Arc<PdInner>,
}

impl Drop for IbMr {
    fn drop(&mut self) {
        // Posting with the key fails from now on; the NIC's own check covers WRs in flight.
        self.pd
            .mrs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.mr.lkey());
    }
}

impl MemoryRegion for IbMr {
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    fn region(&self) -> &MemRegion {
        &self.region
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
}

/// A completion channel of an rdma-core device.
pub struct IbChannel {
    ch: Arc<sideway::ibverbs::completion::CompletionChannel>,
    fd: RawFd,
}

impl CompletionChannel for IbChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        sys::borrow_fd(self, self.fd)
    }

    fn get_cq_event(&self) -> Result<Option<CqId>> {
        sys::get_cq_event(&self.ch)
            .map(|o| o.map(|id| CqId(id as u32)))
            .map_err(|e| io_err("ibv_get_cq_event", e))
    }
}

/// A completion queue of an rdma-core device.
pub struct IbCq {
    id: CqId,
    cq: sys::Cq,
    _channel: Option<Arc<dyn CompletionChannel>>,
}

fn wc_status(raw: u32) -> WcStatus {
    use WcStatus::*;
    const ALL: [WcStatus; 22] = [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocEecOpErr,
        LocProtErr,
        WrFlushErr,
        MwBindErr,
        BadRespErr,
        LocAccessErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
        LocRddViolErr,
        RemInvRdReqErr,
        RemAbortErr,
        InvEecnErr,
        InvEecStateErr,
        FatalErr,
        RespTimeoutErr,
        GeneralErr,
    ];
    ALL.get(raw as usize).copied().unwrap_or(GeneralErr)
}

fn wc_opcode(raw: u32) -> WcOpcode {
    use WcOpcode::*;
    match raw {
        0 => Send,
        1 => RdmaWrite,
        2 => RdmaRead,
        3 => CompSwap,
        4 => FetchAdd,
        5 => BindMw,
        6 => LocalInv,
        7 => Tso,
        8 => Flush,
        9 => AtomicWrite,
        129 => RecvRdmaWithImm,
        _ => Recv,
    }
}

fn convert_wc(w: &sys::ibv_wc) -> WorkCompletion {
    let wc_flags = WcFlags::from_bits_truncate(w.wc_flags);
    let raw_imm = sys::wc_imm(w);
    WorkCompletion {
        wr_id: w.wr_id,
        status: wc_status(w.status),
        opcode: wc_opcode(w.opcode),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        // Immediate data arrives in network order; an invalidated rkey in host order.
        imm_data: if wc_flags.contains(WcFlags::WITH_IMM) {
            u32::from_be(raw_imm)
        } else {
            raw_imm
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

impl CompletionQueue for IbCq {
    fn id(&self) -> CqId {
        self.id
    }

    fn cqe(&self) -> u32 {
        self.cq.cqe()
    }

    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let mut raw = [sys::ibv_wc::zeroed(); 32];
        let mut done = 0;
        while done < wc.len() {
            let want = (wc.len() - done).min(raw.len());
            let n = self
                .cq
                .poll(&mut raw[..want])
                .map_err(|e| io_err("ibv_poll_cq (CQ overrun?)", e))?;
            for (dst, src) in wc[done..].iter_mut().zip(&raw[..n]) {
                *dst = convert_wc(src);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.cq
            .req_notify(solicited_only)
            .map_err(|e| io_err("ibv_req_notify_cq", e))
    }

    fn ack_events(&self, n: u32) {
        self.cq.ack_events(n);
    }
}

/// A queue pair of an rdma-core device.
pub struct IbQp {
    // Destroyed first (fields drop in order); then its CQs, SRQ and PD may go.
    qp: sys::Qp,
    qp_type: QpType,
    cap: QpCap,
    has_srq: bool,
    _send_cq: Arc<dyn CompletionQueue>,
    _recv_cq: Arc<dyn CompletionQueue>,
    _srq: Option<Arc<dyn SharedReceiveQueue>>,
    pd: Arc<PdInner>,
}

fn qp_state(raw: u32) -> QpState {
    match raw {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        _ => QpState::Err,
    }
}

/// A libibverbs QP attribute structure in remem's terms.
fn from_raw_qp_attr(r: &sys::ibv_qp_attr) -> QpAttr {
    QpAttr {
        qp_state: qp_state(r.qp_state),
        cur_qp_state: qp_state(r.cur_qp_state),
        path_mtu: mtu(r.path_mtu),
        qkey: r.qkey,
        rq_psn: r.rq_psn,
        sq_psn: r.sq_psn,
        dest_qp_num: r.dest_qp_num,
        qp_access_flags: AccessFlags::from_bits_truncate(r.qp_access_flags),
        cap: QpCap {
            max_send_wr: r.cap.max_send_wr,
            max_recv_wr: r.cap.max_recv_wr,
            max_send_sge: r.cap.max_send_sge,
            max_recv_sge: r.cap.max_recv_sge,
            max_inline_data: r.cap.max_inline_data,
        },
        ah_attr: from_ah_attr(&r.ah_attr),
        pkey_index: r.pkey_index,
        en_sqd_async_notify: r.en_sqd_async_notify != 0,
        sq_draining: r.sq_draining != 0,
        max_rd_atomic: r.max_rd_atomic,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        port_num: r.port_num,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
    }
}

fn raw_qp_attr(a: &QpAttr) -> sys::ibv_qp_attr {
    let mut r = sys::ibv_qp_attr::zeroed();
    r.qp_state = a.qp_state as u32;
    r.cur_qp_state = a.cur_qp_state as u32;
    r.path_mtu = a.path_mtu as u32;
    r.qkey = a.qkey;
    r.rq_psn = a.rq_psn;
    r.sq_psn = a.sq_psn;
    r.dest_qp_num = a.dest_qp_num;
    r.qp_access_flags = a.qp_access_flags.bits();
    r.cap.max_send_wr = a.cap.max_send_wr;
    r.cap.max_recv_wr = a.cap.max_recv_wr;
    r.cap.max_send_sge = a.cap.max_send_sge;
    r.cap.max_recv_sge = a.cap.max_recv_sge;
    r.cap.max_inline_data = a.cap.max_inline_data;
    r.ah_attr = ah_attr(&a.ah_attr);
    r.pkey_index = a.pkey_index;
    r.en_sqd_async_notify = u8::from(a.en_sqd_async_notify);
    r.max_rd_atomic = a.max_rd_atomic;
    r.max_dest_rd_atomic = a.max_dest_rd_atomic;
    r.min_rnr_timer = a.min_rnr_timer;
    r.port_num = a.port_num;
    r.timeout = a.timeout;
    r.retry_cnt = a.retry_cnt;
    r.rnr_retry = a.rnr_retry;
    r
}

const ALL_ATTRS: u32 = QpAttrMask::all().bits()
    & !(QpAttrMask::RATE_LIMIT.bits()
        | QpAttrMask::ALT_PATH.bits()
        | QpAttrMask::PATH_MIG_STATE.bits());

fn send_opcode(op: &SendOp) -> Result<u32> {
    Ok(match op {
        SendOp::RdmaWrite { .. } => 0,
        SendOp::RdmaWriteWithImm { .. } => 1,
        SendOp::Send => 2,
        SendOp::SendWithImm { .. } => 3,
        SendOp::RdmaRead { .. } => 4,
        SendOp::AtomicCmpAndSwp { .. } => 5,
        SendOp::AtomicFetchAndAdd { .. } => 6,
        SendOp::SendWithInv { .. } => 9,
        SendOp::BindMw { .. } | SendOp::LocalInv { .. } => {
            return Err(Error::Unsupported(
                "memory windows on the rdma-core provider",
            ));
        }
        SendOp::AtomicWrite { .. } | SendOp::Flush { .. } => {
            return Err(Error::Unsupported(
                "FLUSH and ATOMIC WRITE on the rdma-core provider",
            ));
        }
    })
}

impl IbQp {
    fn build_send(&self, wr: &SendWr<'_>) -> Result<sys::ibv_send_wr> {
        let opcode = send_opcode(&wr.op)?;
        let valid = match self.qp_type {
            QpType::Rc => true,
            QpType::Uc => wr.op.valid_on_uc(),
            QpType::Ud => wr.op.valid_on_ud(),
        };
        if !valid {
            return Err(Error::InvalidOpcode {
                op: wr.op.name(),
                qp_type: self.qp_type,
            });
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(Error::TooManySge {
                given: wr.sg_list.len(),
                max: self.cap.max_send_sge,
            });
        }
        if wr.flags.contains(SendFlags::INLINE)
            && wr.total_len() > u64::from(self.cap.max_inline_data)
        {
            return Err(Error::InlineTooLarge {
                given: wr.total_len(),
                max: self.cap.max_inline_data,
            });
        }
        // The NIC writes into the local memory of READs and atomics.
        let need_write = wr.op.is_read_or_atomic();
        if matches!(
            wr.op,
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
        ) && wr.total_len() != 8
        {
            return Err(Error::InvalidArgument(
                "an atomic operation's local buffer is 8 bytes".into(),
            ));
        }
        self.pd.check(wr.sg_list, need_write)?;
        let mut raw = sys::ibv_send_wr::zeroed();
        raw.wr_id = wr.wr_id;
        raw.opcode = opcode;
        raw.send_flags = wr.flags.bits();
        match wr.op {
            SendOp::SendWithImm { imm } => sys::set_imm(&mut raw, imm.to_be()),
            SendOp::SendWithInv { rkey } => sys::set_imm(&mut raw, rkey),
            SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaRead { remote_addr, rkey } => {
                sys::set_rdma(&mut raw, remote_addr, rkey)
            }
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                sys::set_imm(&mut raw, imm.to_be());
                sys::set_rdma(&mut raw, remote_addr, rkey);
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => sys::set_atomic(&mut raw, remote_addr, rkey, compare, swap),
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => sys::set_atomic(&mut raw, remote_addr, rkey, add, 0),
            _ => {}
        }
        if self.qp_type == QpType::Ud {
            let ud = wr
                .ud
                .as_ref()
                .ok_or_else(|| Error::InvalidArgument("a UD send needs a destination".into()))?;
            let ah: Arc<IbAh> = own(ud.ah.clone(), "address handle")?;
            if !Arc::ptr_eq(&ah.pd, &self.pd) {
                return Err(Error::InvalidArgument(
                    "address handle of another protection domain".into(),
                ));
            }
            sys::set_ud(&mut raw, ah.ah.ptr(), ud.remote_qpn, ud.remote_qkey);
        }
        Ok(raw)
    }
}

fn sges(list: &[Sge]) -> impl Iterator<Item = sys::ibv_sge> + '_ {
    list.iter().map(|s| sys::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    })
}

fn post_err(index: usize, e: std::io::Error, outstanding: u32) -> PostError {
    let error = match e.raw_os_error() {
        Some(libc::ENOMEM) => Error::QueueFull { outstanding },
        _ => io_err("post", e),
    };
    PostError { index, error }
}

impl QueuePair for IbQp {
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn state(&self) -> QpState {
        self.qp
            .query(QpAttrMask::STATE.bits())
            .map(|(a, _)| qp_state(a.qp_state))
            .unwrap_or(QpState::Err)
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        remem_verbs::check_modify(self.qp_type, self.state(), attr, mask)?;
        if mask.contains(QpAttrMask::AV) {
            check_udp_port(&attr.ah_attr)?;
        }
        let mut raw = raw_qp_attr(attr);
        self.qp
            .modify(&mut raw, mask.bits())
            .map_err(|e| io_err("ibv_modify_qp", e))
    }

    fn query(&self) -> Result<QpAttr> {
        let (r, _) = self
            .qp
            .query(ALL_ATTRS)
            .map_err(|e| io_err("ibv_query_qp", e))?;
        Ok(from_raw_qp_attr(&r))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        // Checked up front: a bad WR stops the list there, those before it are posted.
        let mut raw = Vec::with_capacity(wrs.len());
        let mut list = Vec::new();
        let mut ranges = Vec::with_capacity(wrs.len());
        let mut bad = None;
        for (i, wr) in wrs.iter().enumerate() {
            match self.build_send(wr) {
                Ok(r) => {
                    ranges.push((list.len(), wr.sg_list.len()));
                    list.extend(sges(wr.sg_list));
                    raw.push(r);
                }
                Err(error) => {
                    bad = Some(PostError { index: i, error });
                    break;
                }
            }
        }
        self.qp
            .post_send(&mut raw, &mut list, &ranges)
            .map_err(|(i, e)| post_err(i, e, self.cap.max_send_wr))?;
        bad.map_or(Ok(()), Err)
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        if self.has_srq {
            return Err(PostError {
                index: 0,
                error: Error::InvalidArgument(
                    "this QP receives from a shared receive queue".into(),
                ),
            });
        }
        let (mut raw, mut list, ranges, bad) = recv_list(&self.pd, wrs, self.cap.max_recv_sge);
        self.qp
            .post_recv(&mut raw, &mut list, &ranges)
            .map_err(|(i, e)| post_err(i, e, self.cap.max_recv_wr))?;
        bad.map_or(Ok(()), Err)
    }
}

type RecvList = (
    Vec<sys::ibv_recv_wr>,
    Vec<sys::ibv_sge>,
    Vec<(usize, usize)>,
    Option<PostError>,
);

fn recv_list(pd: &PdInner, wrs: &[RecvWr<'_>], max_sge: u32) -> RecvList {
    let mut raw = Vec::with_capacity(wrs.len());
    let mut list = Vec::new();
    let mut ranges = Vec::with_capacity(wrs.len());
    for (i, wr) in wrs.iter().enumerate() {
        let checked = if wr.sg_list.len() > max_sge as usize {
            Err(Error::TooManySge {
                given: wr.sg_list.len(),
                max: max_sge,
            })
        } else {
            pd.check(wr.sg_list, true)
        };
        if let Err(error) = checked {
            return (raw, list, ranges, Some(PostError { index: i, error }));
        }
        let mut r = sys::ibv_recv_wr::zeroed();
        r.wr_id = wr.wr_id;
        ranges.push((list.len(), wr.sg_list.len()));
        list.extend(sges(wr.sg_list));
        raw.push(r);
    }
    (raw, list, ranges, None)
}

/// A shared receive queue of an rdma-core device.
pub struct IbSrq {
    srq: sys::Srq,
    id: u32,
    max_sge: u32,
    _max_wr: u32,
    pd: Arc<PdInner>,
}

impl SharedReceiveQueue for IbSrq {
    fn srq_num(&self) -> u32 {
        self.id
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let (mut raw, mut list, ranges, bad) = recv_list(&self.pd, wrs, self.max_sge);
        self.srq
            .post_recv(&mut raw, &mut list, &ranges)
            .map_err(|(i, e)| post_err(i, e, self._max_wr))?;
        bad.map_or(Ok(()), Err)
    }

    fn set_limit(&self, srq_limit: u32) -> Result<()> {
        self.srq
            .set_limit(srq_limit)
            .map_err(|e| io_err("ibv_modify_srq", e))
    }

    fn query(&self) -> Result<SrqAttr> {
        let (max_wr, max_sge, srq_limit) =
            self.srq.query().map_err(|e| io_err("ibv_query_srq", e))?;
        Ok(SrqAttr {
            max_wr,
            max_sge,
            srq_limit,
        })
    }
}

/// An address handle of an rdma-core device.
pub struct IbAh {
    ah: sys::Ah,
    attr: AhAttr,
    pd: Arc<PdInner>,
}

impl AddressHandle for IbAh {
    fn attr(&self) -> &AhAttr {
        &self.attr
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sysfs_counters_are_read_by_port_and_named_once() {
        let dir = std::env::temp_dir().join(format!("remem-ib-counters-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, value) in [
            ("hw_counters/lifespan", "10\n"),
            ("ports/1/hw_counters/sent_pkts", "42\n"),
            ("ports/1/hw_counters/rcvd_pkts", "41\n"),
            ("ports/1/counters/port_xmit_data", "7\n"),
            ("ports/2/hw_counters/sent_pkts", "5\n"),
            ("ports/1/hw_counters/not_a_number", "x\n"),
        ] {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, value).unwrap();
        }
        let got: Vec<(&str, u64)> = super::sysfs_counters(&dir)
            .iter()
            .map(|c| (c.name, c.value))
            .collect();
        assert_eq!(
            got,
            [
                ("lifespan", 10),
                ("rcvd_pkts", 41),
                ("sent_pkts", 42),
                ("port_xmit_data", 7),
                ("p2:sent_pkts", 5)
            ]
        );
        // A name read again is the same leaked string.
        let again = super::sysfs_counters(&dir);
        assert!(std::ptr::eq(
            again[2].name,
            super::intern("sent_pkts".into())
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(super::sysfs_counters(&dir).is_empty());
    }

    use super::*;

    #[test]
    fn conversions_match_rdma_core() {
        assert_eq!(wc_status(10), WcStatus::RemAccessErr);
        assert_eq!(wc_status(99), WcStatus::GeneralErr);
        assert_eq!(wc_opcode(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(qp_state(3), QpState::Rts);
        assert_eq!(mtu(5), Mtu::Mtu4096);
        assert_eq!(gid_type(2), GidType::RoceV2);
        let a = QpAttr {
            qp_state: QpState::Rtr,
            dest_qp_num: 0x12_3456,
            path_mtu: Mtu::Mtu4096,
            ..QpAttr::default()
        };
        let r = raw_qp_attr(&a);
        assert_eq!((r.qp_state, r.dest_qp_num, r.path_mtu), (2, 0x12_3456, 5));
        assert_eq!(from_ah_attr(&r.ah_attr), a.ah_attr);
    }

    #[test]
    fn regions_with_an_iova_are_refused_clearly() {
        use super::*;
        let p = IbverbsProvider::new();
        let Some(dev) = p.devices().unwrap().into_iter().next() else {
            eprintln!("skipped: no RDMA device to register memory on");
            return;
        };
        let pd = p.open(&dev.name).unwrap().alloc_pd().unwrap();
        let buf = Arc::new(remem_verbs::MemoryBuffer::zeroed(4096).unwrap());
        let region = MemRegion::with_iova(buf.clone(), 64..128, 0x1000).unwrap();
        let err = pd.reg_mr(region, AccessFlags::LOCAL_WRITE).err();
        assert!(matches!(err, Some(Error::Unsupported(_))), "{err:?}");
        // The same range at its own address registers.
        let region = MemRegion::new(buf, 64..128).unwrap();
        assert!(pd.reg_mr(region, AccessFlags::LOCAL_WRITE).is_ok());
    }

    #[test]
    fn without_devices_the_list_is_empty_and_open_fails_cleanly() {
        // On machines without RDMA devices (or without libibverbs) there is nothing to open.
        let p = IbverbsProvider::new();
        let devices = p.devices().unwrap();
        if devices.is_empty() {
            assert!(matches!(p.open("rxe0"), Err(Error::NoSuchDevice(_))));
        } else {
            eprintln!("RDMA devices present: {devices:?}");
        }
        assert!(matches!(
            p.open("no-such-device"),
            Err(Error::NoSuchDevice(_))
        ));
    }
}
