//! The verbs objects of a soft device: the state they share, protection domains, and the
//! environment a QP's transport runs in.

pub mod cq;
pub mod events;
pub mod keys;
pub mod mr;
pub mod srq;

use crate::engine::{Engine, Inline, Progress};
use crate::qp::{LocalMemory, QpLimits, QpSurroundings, SoftQp, SoftQpParts};
use crate::transport::{RemoteKeyError, Stat};
use crate::wqe::{PdId, RecvWqe};
use cq::SoftCq;
use events::{AsyncEvents, SoftCompChannel};
use mr::{MrTable, SoftMr};
use remem_verbs::{
    AccessFlags, AddressHandle, AhAttr, CompletionChannel, CompletionQueue, Counter, DeviceAttr,
    DeviceInfo, Error, GidType, MemRegion, MemoryRegion, PortAttr, ProtectionDomain, QpInitAttr,
    QueuePair, Result, Sge, SharedReceiveQueue, SrqAttr, WorkCompletion,
};
use srq::{SoftAh, SoftSrq};
use std::any::Any;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Transport statistics in counter order, with their rxe names.
pub const STAT_NAMES: [(Stat, &str); 9] = [
    (Stat::DuplicateRequest, "duplicate_request"),
    (Stat::OutOfSeqRequest, "out_of_seq_request"),
    (Stat::RcvdRnrNak, "rcvd_rnr_err"),
    (Stat::SentRnrNak, "send_rnr_err"),
    (Stat::RcvdSeqNak, "rcvd_seq_err"),
    (Stat::RetryExceeded, "retry_exceeded_err"),
    (Stat::RnrRetryExceeded, "retry_rnr_exceeded_err"),
    (Stat::CompleterRetry, "completer_retry_err"),
    (Stat::SendErr, "send_err"),
];

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// How a device's packets are moved.
#[derive(Debug)]
enum Driver {
    /// A progress thread.
    Thread(Progress),
    /// The application calls `progress`.
    Inline(Mutex<Inline>),
}

/// What every object of a soft device shares.
#[derive(Debug)]
pub struct DeviceShared {
    /// Unique per opened device (to reject another device's handles).
    pub id: u64,
    /// What the device is.
    pub info: DeviceInfo,
    /// Device attributes.
    pub attr: DeviceAttr,
    /// Port 1 attributes.
    pub port: PortAttr,
    /// Limits QPs are checked against.
    pub limits: QpLimits,
    /// Memory regions.
    pub mrs: MrTable,
    /// Async events.
    pub events: Arc<AsyncEvents>,
    /// The packet engine.
    pub engine: Arc<Engine>,
    driver: Driver,
    stats: [AtomicU64; STAT_NAMES.len()],
    next_qpn: Mutex<u32>,
    next_id: AtomicU32,
}

impl DeviceShared {
    /// Binds `addr` and starts the device's progress thread.
    pub fn open(
        info: DeviceInfo,
        attr: DeviceAttr,
        port: PortAttr,
        addr: SocketAddr,
        opts: &crate::context::SoftOptions,
    ) -> Result<Arc<Self>> {
        let socket = UdpSocket::bind(addr).map_err(|e| {
            Error::DeviceUnavailable(format!("{}: cannot bind UDP {addr}: {e}", info.name))
        })?;
        let local = socket.local_addr()?;
        if local.is_ipv4() {
            // DF set and, on an unconnected socket, IP identification 0 — the ICRC covers the
            // identification, so it must be known when the ICRC is computed (see engine docs).
            rustix::net::sockopt::set_ip_mtu_discover(
                &socket,
                rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
            )
            .map_err(std::io::Error::from)?;
        }
        let pcap = match &opts.pcap {
            Some(path) => Some(crate::pcap::PcapWriter::open(path)?),
            None => None,
        };
        let engine = Arc::new(Engine::with_pcap(local, local.port(), pcap));
        let driver = if opts.inline {
            Driver::Inline(Mutex::new(Inline::new(socket)?))
        } else {
            Driver::Thread(Progress::start(socket, engine.clone(), opts.cpu)?)
        };
        let limits = QpLimits {
            max_wr: attr.max_qp_wr,
            max_sge: attr.max_sge,
            max_inline: attr.max_inline_data,
            max_rd_atomic: attr.max_qp_init_rd_atom.min(255) as u8,
            max_dest_rd_atomic: attr.max_qp_rd_atom.min(255) as u8,
            active_mtu: port.active_mtu.bytes(),
            max_msg: u64::from(port.max_msg_sz),
        };
        Ok(Arc::new(DeviceShared {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            info,
            attr,
            port,
            limits,
            mrs: MrTable::default(),
            events: Arc::new(AsyncEvents::new()?),
            engine,
            driver,
            stats: Default::default(),
            next_qpn: Mutex::new(16 + rand::random::<u32>() % 0x1000),
            next_id: AtomicU32::new(1),
        }))
    }

    fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A QP number not in use (24 bits, never 0 or 1).
    fn alloc_qpn(&self) -> u32 {
        let mut n = self.next_qpn.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let qpn = *n;
            *n = if *n >= 0x00ff_ffff { 16 } else { *n + 1 };
            if qpn >= 2 && !self.engine.has_qp(qpn) {
                return qpn;
            }
        }
    }

    /// Counts a transport statistic.
    pub fn count(&self, stat: Stat) {
        if let Some(i) = STAT_NAMES.iter().position(|(s, _)| *s == stat) {
            self.stats[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every counter, rxe names first.
    pub fn counters(&self) -> Vec<Counter> {
        let e = &self.engine.stats;
        let counter = |name, c: &AtomicU64| Counter {
            name,
            value: c.load(Ordering::Relaxed),
        };
        let mut out = vec![
            counter("sent_pkts", &e.sent_pkts),
            counter("rcvd_pkts", &e.rcvd_pkts),
        ];
        out.extend(
            STAT_NAMES
                .iter()
                .zip(&self.stats)
                .map(|((_, name), v)| counter(name, v)),
        );
        out.extend([
            counter("drop_malformed", &e.drop_malformed),
            counter("drop_bad_icrc", &e.drop_bad_icrc),
            counter("drop_unknown_qp", &e.drop_unknown_qp),
            counter("icrc_unverified", &e.icrc_unverified),
        ]);
        out
    }

    fn wake(&self, qpn: u32) {
        self.engine.mark_ready(qpn);
        if let Driver::Thread(p) = &self.driver {
            p.wake();
        }
    }

    /// Moves packets in inline mode (see [`Inline::progress`]); an error in thread mode.
    pub fn progress(&self, timeout: std::time::Duration) -> Result<usize> {
        match &self.driver {
            Driver::Inline(i) => Ok(i
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .progress(&self.engine, timeout)?),
            Driver::Thread(_) => Err(Error::InvalidArgument(
                "progress() drives inline devices; this one has a progress thread".into(),
            )),
        }
    }

    /// Checks an address vector against the GID table.
    fn check_av(&self, av: &AhAttr) -> Result<()> {
        let bad = |reason: String| Error::InvalidAttribute {
            name: "ah_attr",
            reason,
        };
        if av.port_num > 1 {
            return Err(bad(format!("port {} does not exist", av.port_num)));
        }
        let Some(sgid) = self.info.gids.get(usize::from(av.sgid_index)) else {
            return Err(bad(format!("sgid_index {} is empty", av.sgid_index)));
        };
        if sgid.gid_type != GidType::RoceV2 {
            return Err(bad(format!(
                "sgid_index {} is a {:?} GID; soft devices speak RoCE v2 only",
                av.sgid_index, sgid.gid_type
            )));
        }
        if sgid.gid.is_ipv4_mapped() != av.dgid.is_ipv4_mapped() {
            return Err(bad(
                "source and destination GIDs are of different IP families".into(),
            ));
        }
        Ok(())
    }

    /// Downcasts a CQ handle to one of this device's CQs.
    pub fn own_cq(&self, cq: &Arc<dyn CompletionQueue>) -> Result<Arc<SoftCq>> {
        let any: Arc<dyn Any + Send + Sync> = cq.clone();
        any.downcast::<SoftCq>()
            .ok()
            .filter(|c| c.device_id == self.id)
            .ok_or_else(|| Error::InvalidArgument("CQ of another device or provider".into()))
    }

    fn own_srq(&self, srq: &Arc<dyn SharedReceiveQueue>) -> Result<Arc<SoftSrq>> {
        let any: Arc<dyn Any + Send + Sync> = srq.clone();
        any.downcast::<SoftSrq>()
            .ok()
            .filter(|s| s.dev.id == self.id)
            .ok_or_else(|| Error::InvalidArgument("SRQ of another device or provider".into()))
    }

    /// Creates a CQ.
    pub fn create_cq(
        self: &Arc<Self>,
        cqe: u32,
        channel: Option<Arc<dyn CompletionChannel>>,
    ) -> Result<Arc<SoftCq>> {
        if cqe == 0 || cqe > self.attr.max_cqe {
            return Err(Error::InvalidArgument(format!(
                "cqe {cqe} outside 1..={}",
                self.attr.max_cqe
            )));
        }
        let channel = match channel {
            None => None,
            Some(ch) => {
                let any: Arc<dyn Any + Send + Sync> = ch;
                let ch = any
                    .downcast::<SoftCompChannel>()
                    .ok()
                    .filter(|c| c.device_id == self.id)
                    .ok_or_else(|| {
                        Error::InvalidArgument("completion channel of another device".into())
                    })?;
                Some(ch)
            }
        };
        Ok(Arc::new(SoftCq::new(
            remem_verbs::CqId(self.next_id()),
            cqe,
            channel,
            self.events.clone(),
            self.id,
        )))
    }

    /// Creates a completion channel.
    pub fn create_comp_channel(&self) -> Result<Arc<SoftCompChannel>> {
        Ok(Arc::new(SoftCompChannel::new(self.id)?))
    }

    /// Allocates a PD.
    pub fn alloc_pd(self: &Arc<Self>) -> Arc<SoftPd> {
        Arc::new(SoftPd {
            id: PdId(self.next_id()),
            dev: self.clone(),
        })
    }
}

impl LocalMemory for DeviceShared {
    fn local(&self, pd: PdId, sge: &Sge, need_write: bool) -> Result<MemRegion> {
        self.mrs.local(pd, sge, need_write)
    }
}

/// The surroundings of one QP's transport.
struct QpAround {
    dev: Arc<DeviceShared>,
    send_cq: Arc<SoftCq>,
    recv_cq: Arc<SoftCq>,
    srq: Option<Arc<SoftSrq>>,
}

impl QpSurroundings for QpAround {
    fn remote(
        &self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<MemRegion, RemoteKeyError> {
        self.dev.mrs.remote(pd, rkey, va, len, need)
    }

    fn srq_pop(&self) -> Option<Option<RecvWqe>> {
        self.srq.as_ref().map(|s| s.pop())
    }

    fn send_cq(&self, wc: WorkCompletion) {
        self.send_cq.push(wc, false);
    }

    fn recv_cq(&self, wc: WorkCompletion, solicited: bool) {
        self.recv_cq.push(wc, solicited);
    }

    fn count(&self, stat: Stat) {
        self.dev.count(stat);
    }

    fn check_av(&self, av: &AhAttr) -> Result<()> {
        self.dev.check_av(av)
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct SoftPd {
    id: PdId,
    dev: Arc<DeviceShared>,
}

impl ProtectionDomain for SoftPd {
    fn reg_mr(&self, region: MemRegion, access: AccessFlags) -> Result<Arc<dyn MemoryRegion>> {
        access
            .validate_for_mr()
            .map_err(|e| Error::InvalidArgument(e.into()))?;
        if region.len() as u64 > self.dev.attr.max_mr_size {
            return Err(Error::InvalidArgument(format!(
                "region of {} bytes exceeds max_mr_size",
                region.len()
            )));
        }
        let entry = self.dev.mrs.insert(self.id, region, access);
        Ok(Arc::new(SoftMr {
            entry,
            dev: self.dev.clone(),
        }))
    }

    fn create_qp(&self, init: &QpInitAttr) -> Result<Arc<dyn QueuePair>> {
        let dev = &self.dev;
        let around = Arc::new(QpAround {
            dev: dev.clone(),
            send_cq: dev.own_cq(&init.send_cq)?,
            recv_cq: dev.own_cq(&init.recv_cq)?,
            srq: init.srq.as_ref().map(|s| dev.own_srq(s)).transpose()?,
        });
        let qpn = dev.alloc_qpn();
        let weak = Arc::downgrade(dev);
        let qp = Arc::new(SoftQp::new(SoftQpParts {
            qpn,
            qp_type: init.qp_type,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            has_srq: init.srq.is_some(),
            pd: self.id,
            limits: dev.limits,
            window: 1024,
            around,
            mem: dev.clone(),
            wake: Arc::new(move |qpn| {
                if let Some(d) = weak.upgrade() {
                    d.wake(qpn);
                }
            }),
        })?);
        dev.engine.register(&qp);
        Ok(qp)
    }

    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SharedReceiveQueue>> {
        let num = self.dev.next_id();
        Ok(Arc::new(SoftSrq::new(
            num,
            self.id,
            attr,
            self.dev.clone(),
        )?))
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AddressHandle>> {
        self.dev.check_av(attr)?;
        Ok(Arc::new(SoftAh { attr: *attr }))
    }
}
