//! Which device an RDMA CM id is on, and the devices as librdmacm opens them.
//!
//! librdmacm opens every device once for the process; an id gets one when it binds or
//! resolves an address. Here a device is opened the first time an id needs it (or
//! `rdma_get_devices` lists it) and stays open for the life of the process: its
//! `ibv_context` (this library's, so `rdma_cm_id.verbs` works with every `ibv_*` call),
//! a default PD (`rdma_cm_id.pd`, made on first use), and its provider's CM channel,
//! watched by the [`router`](super::router).
//!
//! Picking a device for an address (`for_bind`, `for_dst`): the device whose address
//! it is; the unspecified address means every device. For a destination with no device
//! of its own: the device holding the source address the kernel would use to reach it,
//! else the first device of the same scope (loopback or not) and family, else the first
//! of the family.

#![forbid(unsafe_code)]

use super::abi::*;
use crate::abi::{ibv_context, ibv_pd};
pub(crate) use crate::ffi::handles::CmContext;
use core::ffi::c_int;
use remem_verbs::cm::{CmChannel, CmId, PortSpace};
use remem_verbs::{Context, GidType};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, OnceLock};

/// Where devices come from: the drop-in's configured devices (`REMEM_IBV_DEVICES`), or a
/// test's.
pub(crate) trait Source: Send + Sync {
    /// The addresses of every configured device, in list order (an errno if the
    /// configuration is bad).
    fn addrs(&self) -> Result<Vec<Vec<IpAddr>>, c_int>;
    /// Opens device `index` as a context of this library.
    fn open(&self, index: usize) -> Result<CmContext, c_int>;
    /// The provider's CM channel for `dev`.
    fn create_cm_channel(&self, dev: &Arc<dyn Context>) -> remem_verbs::Result<Arc<dyn CmChannel>>;
    /// A CM id on `dev` reporting to `channel`.
    fn create_cm_id(
        &self,
        dev: &Arc<dyn Context>,
        channel: &Arc<dyn CmChannel>,
        ps: PortSpace,
    ) -> remem_verbs::Result<Arc<dyn CmId>>;
}

/// The drop-in's devices.
struct Configured;

impl Source for Configured {
    fn addrs(&self) -> Result<Vec<Vec<IpAddr>>, c_int> {
        match crate::device::configured() {
            Ok(devs) => Ok(devs.iter().map(|d| d.ips()).collect()),
            Err(why) => {
                eprintln!("remem-ibv: {}: {why}", crate::device::DEVICES_ENV);
                Err(libc::EINVAL)
            }
        }
    }

    fn open(&self, index: usize) -> Result<CmContext, c_int> {
        CmContext::open_configured(index)
    }

    fn create_cm_channel(&self, dev: &Arc<dyn Context>) -> remem_verbs::Result<Arc<dyn CmChannel>> {
        dev.create_cm_channel()
    }

    fn create_cm_id(
        &self,
        dev: &Arc<dyn Context>,
        channel: &Arc<dyn CmChannel>,
        ps: PortSpace,
    ) -> remem_verbs::Result<Arc<dyn CmId>> {
        dev.create_cm_id(channel, ps)
    }
}

static SOURCE: OnceLock<Box<dyn Source>> = OnceLock::new();

/// The device source (the configured devices unless a test installed its own first).
pub(crate) fn source() -> &'static dyn Source {
    SOURCE.get_or_init(|| Box::new(Configured)).as_ref()
}

/// Installs a test's device source (before any CM call of the process; the same one
/// for every test).
#[cfg(test)]
pub(crate) fn install(make: impl FnOnce() -> Box<dyn Source>) {
    SOURCE.get_or_init(make);
}

/// A device as the RDMA CM uses it (open for the life of the process).
pub(crate) struct CmDev {
    /// Its position in the device list.
    pub index: usize,
    /// Its IP addresses (from its GID table once open).
    pub ips: Vec<IpAddr>,
    /// The context ids on it report as `verbs`.
    verbs: CmContext,
    /// The remem device.
    pub dev: Arc<dyn Context>,
    /// The provider's CM channel, watched by the router.
    pub channel: Arc<dyn CmChannel>,
    /// The default PD (address; 0 until made).
    pd: Mutex<usize>,
    /// `max_qp_rd_atom`: the most responder resources a connection may ask.
    pub max_responder_resources: u8,
    /// `max_qp_init_rd_atom`: the most initiator depth.
    pub max_initiator_depth: u8,
}

impl std::fmt::Debug for CmDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmDev")
            .field("index", &self.index)
            .field("ips", &self.ips)
            .finish_non_exhaustive()
    }
}

impl CmDev {
    /// The `ibv_context` of the device (this library's; never closed).
    pub fn verbs(&self) -> *mut ibv_context {
        self.verbs.as_ptr()
    }

    /// The device's context (open for the life of the process).
    pub fn ctx(&self) -> Option<&crate::context::Ctx> {
        self.verbs.ctx()
    }

    /// The device's default PD (`rdma_cm_id.pd`), made on first use.
    pub fn default_pd(&self) -> Result<*mut ibv_pd, c_int> {
        let mut pd = self.pd.lock().unwrap_or_else(|e| e.into_inner());
        if *pd == 0 {
            *pd = self.verbs.alloc_pd()? as usize;
        }
        Ok(*pd as *mut ibv_pd)
    }

    /// A new CM id on this device.
    pub fn create_cm_id(&self, ps: PortSpace) -> Result<Arc<dyn CmId>, c_int> {
        source()
            .create_cm_id(&self.dev, &self.channel, ps)
            .map_err(|e| super::errno_of(&e))
    }
}

/// The devices opened so far, by index.
static OPEN: Mutex<Vec<Option<Arc<CmDev>>>> = Mutex::new(Vec::new());

/// The addresses of every device: those of an open device from its GID table, the
/// configured ones otherwise.
fn all_addrs() -> Result<Vec<Vec<IpAddr>>, c_int> {
    let mut addrs = source().addrs()?;
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    for (i, d) in open.iter().enumerate() {
        if let (Some(d), Some(slot)) = (d, addrs.get_mut(i)) {
            slot.clone_from(&d.ips);
        }
    }
    Ok(addrs)
}

/// How many devices there are (ENODEV for none, as librdmacm).
pub(crate) fn count() -> Result<usize, c_int> {
    match source().addrs()?.len() {
        0 => Err(libc::ENODEV),
        n => Ok(n),
    }
}

/// Opens device `index` for the CM (once per process).
pub(crate) fn open(index: usize) -> Result<Arc<CmDev>, c_int> {
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(d)) = open.get(index) {
        return Ok(Arc::clone(d));
    }
    let src = source();
    let verbs = src.open(index)?;
    let ctx = verbs.ctx().ok_or(libc::ENODEV)?;
    let dev = Arc::clone(&ctx.shared().dev);
    let channel = src
        .create_cm_channel(&dev)
        .map_err(|e| super::errno_of(&e))?;
    super::router::watch(&channel)?;
    // The addresses the CM reaches the device at: a soft device's bound one (its table's
    // link-local name and the netdev's other IPv6 addresses are not bound), else the
    // RoCE v2 GIDs that are not link-local.
    let mut ips: Vec<IpAddr> = match dev.info().udp_addr {
        Some(a) => vec![a.ip().to_canonical()],
        None => dev
            .gid_table(1)
            .unwrap_or_default()
            .iter()
            .filter(|e| e.gid_type == GidType::RoceV2 && !e.gid.to_ipv6().is_unicast_link_local())
            .map(|e| e.gid.to_ip().to_canonical())
            .collect(),
    };
    if ips.is_empty() {
        ips = src.addrs()?.get(index).cloned().unwrap_or_default();
    }
    let attr = dev.query_device().ok();
    let clamp = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    let d = Arc::new(CmDev {
        index,
        ips,
        verbs,
        dev,
        channel,
        pd: Mutex::new(0),
        max_responder_resources: attr.as_ref().map_or(1, |a| clamp(a.max_qp_rd_atom)),
        max_initiator_depth: attr.as_ref().map_or(1, |a| clamp(a.max_qp_init_rd_atom)),
    });
    if open.len() <= index {
        open.resize(index + 1, None);
    }
    open[index] = Some(Arc::clone(&d));
    Ok(d)
}

/// The open device of a remem device (the one a provider id reports as its context).
pub(crate) fn by_context(dev: &Arc<dyn Context>) -> Option<Arc<CmDev>> {
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.iter()
        .flatten()
        .find(|d| Arc::ptr_eq(&d.dev, dev))
        .cloned()
}

/// The devices a bind to `ip` covers: every device for the unspecified address (those
/// that open; ENODEV if none does), else the device serving `ip` (EADDRNOTAVAIL if none).
pub(crate) fn for_bind(ip: IpAddr) -> Result<Vec<Arc<CmDev>>, c_int> {
    let ip = ip.to_canonical();
    let addrs = all_addrs()?;
    if ip.is_unspecified() {
        let mut out = Vec::new();
        let mut err = libc::ENODEV;
        for i in 0..addrs.len() {
            match open(i) {
                Ok(d) => out.push(d),
                Err(e) => err = e,
            }
        }
        return if out.is_empty() { Err(err) } else { Ok(out) };
    }
    let i = addrs
        .iter()
        .position(|a| a.contains(&ip))
        .ok_or(libc::EADDRNOTAVAIL)?;
    Ok(vec![open(i)?])
}

/// The device that serves `ip` (EADDRNOTAVAIL if none).
pub(crate) fn for_src(ip: IpAddr) -> Result<Arc<CmDev>, c_int> {
    let ip = ip.to_canonical();
    let i = all_addrs()?
        .iter()
        .position(|a| a.contains(&ip))
        .ok_or(libc::EADDRNOTAVAIL)?;
    open(i)
}

/// The device to reach `dst` from (see the module documentation; ENODEV if no device
/// has the family).
pub(crate) fn for_dst(dst: IpAddr) -> Result<Arc<CmDev>, c_int> {
    let dst = dst.to_canonical();
    let addrs = all_addrs()?;
    let pick = pick_for_dst(&addrs, dst, kernel_source_for(dst)).ok_or(libc::ENODEV)?;
    open(pick)
}

/// The address the kernel would send from to reach `dst` (a connected UDP socket's
/// local address; nothing is sent).
fn kernel_source_for(dst: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        IpAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(dst, 9)).ok()?;
    Some(s.local_addr().ok()?.ip().to_canonical())
}

/// The index of the device to reach `dst` from, among devices with addresses `addrs`,
/// given the kernel's source address for it (pure; see the module documentation).
pub(crate) fn pick_for_dst(
    addrs: &[Vec<IpAddr>],
    dst: IpAddr,
    kernel_src: Option<IpAddr>,
) -> Option<usize> {
    let find = |f: &dyn Fn(&IpAddr) -> bool| addrs.iter().position(|a| a.iter().any(f));
    find(&|a| *a == dst)
        .or_else(|| kernel_src.and_then(|s| find(&|a| *a == s)))
        .or_else(|| find(&|a| a.is_ipv4() == dst.is_ipv4() && a.is_loopback() == dst.is_loopback()))
        .or_else(|| find(&|a| a.is_ipv4() == dst.is_ipv4()))
}

/// The port space of an `enum rdma_port_space` value (EINVAL otherwise).
pub(crate) fn port_space(ps: rdma_port_space) -> Result<PortSpace, c_int> {
    u16::try_from(ps)
        .ok()
        .and_then(PortSpace::from_value)
        .ok_or(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_destination_picks_its_own_device_then_the_kernel_s_then_the_same_scope() {
        let addrs = vec![
            vec![ip("10.0.0.1")],
            vec![ip("127.0.0.2")],
            vec![ip("127.0.0.3"), ip("fd00::3")],
        ];
        assert_eq!(pick_for_dst(&addrs, ip("127.0.0.3"), None), Some(2));
        assert_eq!(pick_for_dst(&addrs, ip("127.0.0.9"), None), Some(1));
        assert_eq!(
            pick_for_dst(&addrs, ip("127.0.0.9"), Some(ip("127.0.0.3"))),
            Some(2)
        );
        assert_eq!(pick_for_dst(&addrs, ip("192.168.1.1"), None), Some(0));
        assert_eq!(pick_for_dst(&addrs, ip("fd00::7"), None), Some(2));
        assert_eq!(pick_for_dst(&[vec![ip("10.0.0.1")]], ip("::1"), None), None);
        assert_eq!(pick_for_dst(&[], ip("10.0.0.1"), None), None);
    }

    #[test]
    fn port_spaces() {
        assert_eq!(port_space(RDMA_PS_TCP), Ok(PortSpace::Tcp));
        assert_eq!(port_space(RDMA_PS_UDP), Ok(PortSpace::Udp));
        assert_eq!(port_space(RDMA_PS_IB), Ok(PortSpace::Ib));
        assert_eq!(port_space(RDMA_PS_IPOIB), Ok(PortSpace::Ipoib));
        assert_eq!(port_space(7), Err(libc::EINVAL));
        assert_eq!(port_space(0x1_0106), Err(libc::EINVAL));
    }
}
