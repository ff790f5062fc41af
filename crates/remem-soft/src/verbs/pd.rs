//! Protection domains (`ibv_pd`), where memory regions, queue pairs, shared receive
//! queues, address handles and memory windows are made; and the device's other object
//! constructors (CQs, completion channels, PDs) and handle checks.

use crate::device::events::SoftCompChannel;
use crate::device::quota;
use crate::device::{DeviceShared, MAX_UNACKED_PSNS};
use crate::transport::wqe::PdId;
use crate::verbs::ah::SoftAh;
use crate::verbs::cq::SoftCq;
use crate::verbs::mr::{SoftMr, SoftMw};
use crate::verbs::qp::{SoftQp, SoftQpParts};
use crate::verbs::srq::SoftSrq;
use remem_verbs::{
    AccessFlags, AddressHandle, AhAttr, CompletionChannel, CompletionQueue, Error, MemRegion,
    MemoryRegion, MemoryWindow, MwType, ProtectionDomain, QpInitAttr, QueuePair, Result,
    SharedReceiveQueue, SrqAttr,
};
use std::any::Any;
use std::sync::Arc;

/// The objects a device makes and the handles it checks as its own.
impl DeviceShared {
    /// Downcasts a CQ handle to one of this device's CQs.
    pub fn own_cq(&self, cq: &Arc<dyn CompletionQueue>) -> Result<Arc<SoftCq>> {
        let any: Arc<dyn Any + Send + Sync> = cq.clone();
        any.downcast::<SoftCq>()
            .ok()
            .filter(|c| c.device_id == self.id)
            .ok_or_else(|| Error::InvalidArgument("CQ of another device or provider".into()))
    }

    /// Downcasts an SRQ handle to one of this device's SRQs.
    pub fn own_srq(&self, srq: &Arc<dyn SharedReceiveQueue>) -> Result<Arc<SoftSrq>> {
        let any: Arc<dyn Any + Send + Sync> = srq.clone();
        any.downcast::<SoftSrq>()
            .ok()
            .filter(|s| s.dev.id == self.id)
            .ok_or_else(|| Error::InvalidArgument("SRQ of another device or provider".into()))
    }

    /// Downcasts an address handle to one of this device's, created in `pd` (IBTA: a UD
    /// work request's AH must be of the QP's protection domain).
    pub fn own_ah(&self, ah: &Arc<dyn AddressHandle>, pd: PdId) -> Result<Arc<SoftAh>> {
        let any: Arc<dyn Any + Send + Sync> = ah.clone();
        any.downcast::<SoftAh>()
            .ok()
            .filter(|a| a.device_id == self.id && a.pd == pd)
            .ok_or_else(|| {
                Error::InvalidArgument(
                    "address handle of another protection domain, device or provider".into(),
                )
            })
    }

    /// Creates a CQ of exactly `cqe` entries (1..=`max_cqe`), reporting to `channel`, which
    /// must be one of this device's.
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
        let slot = self.quotas.cq.take()?;
        Ok(Arc::new(
            SoftCq::new(
                remem_verbs::CqId(self.next_id()),
                cqe,
                channel,
                self.events.clone(),
                self.id,
            )
            .with_max(self.attr.max_cqe)
            .with_slot(slot),
        ))
    }

    /// Creates a completion channel.
    pub fn create_comp_channel(&self) -> Result<Arc<SoftCompChannel>> {
        Ok(Arc::new(SoftCompChannel::new(self.id)?))
    }

    /// Allocates a PD (at most `max_pd` live).
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<SoftPd>> {
        Ok(Arc::new(SoftPd {
            _slot: self.quotas.pd.take()?,
            id: PdId(self.next_id()),
            dev: self.clone(),
        }))
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct SoftPd {
    id: PdId,
    dev: Arc<DeviceShared>,
    _slot: quota::Slot,
}

impl SoftPd {
    /// The PD's identifier within its device.
    #[cfg(any(test, feature = "internals"))]
    pub fn id(&self) -> PdId {
        self.id
    }
}

impl ProtectionDomain for SoftPd {
    fn reg_mr(&self, region: MemRegion, access: AccessFlags) -> Result<Arc<dyn MemoryRegion>> {
        access
            .validate_for_mr()
            .map_err(|e| Error::InvalidArgument(e.into()))?;
        if access.contains(AccessFlags::FLUSH_PERSISTENT) && !region.buffer().is_persistent() {
            // As rxe refuses it for memory that is not persistent memory: a persistent
            // FLUSH must mean the data is durable.
            return Err(Error::InvalidArgument(
                "FLUSH_PERSISTENT access needs a buffer with a durable backing store \
                 (MemoryBuffer::map_file)"
                    .into(),
            ));
        }
        if region.len() as u64 > self.dev.attr.max_mr_size {
            return Err(Error::InvalidArgument(format!(
                "region of {} bytes exceeds max_mr_size",
                region.len()
            )));
        }
        let entry = self.dev.mrs.insert(self.id, region, access)?;
        Ok(Arc::new(SoftMr {
            entry,
            dev: self.dev.clone(),
        }))
    }

    fn create_qp(&self, init: &QpInitAttr) -> Result<Arc<dyn QueuePair>> {
        let dev = &self.dev;
        let slot = dev.quotas.qp.take()?;
        let send_cq = dev.own_cq(&init.send_cq)?;
        let recv_cq = dev.own_cq(&init.recv_cq)?;
        let srq = init.srq.as_ref().map(|s| dev.own_srq(s)).transpose()?;
        let qpn = dev.alloc_qpn()?;
        let qp = Arc::new(SoftQp::new(SoftQpParts {
            qpn,
            qp_type: init.qp_type,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            pd: self.id,
            window: MAX_UNACKED_PSNS,
            dev: dev.clone(),
            slot,
            send_cq,
            recv_cq,
            srq,
        })?);
        let port: Arc<dyn crate::engine::QpPort> = qp.clone();
        dev.engine.register(&port);
        Ok(qp)
    }

    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SharedReceiveQueue>> {
        let num = self.dev.next_id();
        let slot = self.dev.quotas.srq.take()?;
        Ok(Arc::new(
            SoftSrq::new(num, self.id, attr, self.dev.clone())?.with_slot(slot),
        ))
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AddressHandle>> {
        self.dev.check_av(attr)?;
        Ok(Arc::new(SoftAh {
            _slot: self.dev.quotas.ah.take()?,
            attr: *attr,
            pd: self.id,
            device_id: self.dev.id,
        }))
    }

    fn alloc_mw(&self, ty: MwType) -> Result<Arc<dyn MemoryWindow>> {
        let max = self.dev.attr.max_mw as usize;
        if max == 0 {
            return Err(Error::Unsupported("memory windows"));
        }
        if self.dev.mrs.windows() >= max {
            return Err(Error::Exhausted("memory windows (max_mw)"));
        }
        Ok(Arc::new(SoftMw {
            rkey: self.dev.mrs.alloc_mw(self.id, ty),
            ty,
            dev: Arc::clone(&self.dev),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::events::readable;
    use crate::device::{FIRST_QPN, MAX_QPN, MULTICAST_QPN, STAT_NAMES};
    use crate::transport::RemoteKeyError;
    use crate::transport::Stat;
    use crate::{SoftContext, SoftOptions};
    use remem_verbs::GidType;
    use remem_verbs::{
        AsyncEvent, AsyncEventElement, AsyncEventType, Context, Gid, MemoryBuffer, PostError,
        QpCap, QpType, RecvWr, Sge, WorkCompletion,
    };
    use std::net::Ipv4Addr;

    /// An inline device (no progress thread) on an ephemeral loopback port.
    fn device() -> SoftContext {
        let opts = SoftOptions {
            inline: true,
            ..SoftOptions::default()
        };
        SoftContext::bind_with("127.0.0.1:0".parse().unwrap(), &opts).unwrap()
    }

    /// A QP of `qp_type` in `pd`, with default caps and a CQ of its own.
    fn qp_of(dev: &Arc<DeviceShared>, pd: &Arc<SoftPd>, qp_type: QpType) -> Arc<dyn QueuePair> {
        let cq: Arc<dyn CompletionQueue> = dev.create_cq(8, None).unwrap();
        pd.create_qp(&QpInitAttr {
            qp_type,
            send_cq: cq.clone(),
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap()
    }

    fn buffer(len: usize) -> Arc<MemoryBuffer> {
        Arc::new(MemoryBuffer::zeroed(len).unwrap())
    }

    fn sge(mr: &dyn MemoryRegion, off: u64, length: u32) -> Sge {
        Sge {
            addr: mr.addr() + off,
            length,
            lkey: mr.lkey(),
        }
    }

    #[test]
    fn dereg_revokes_both_keys_at_once() {
        let ctx = device();
        let dev = ctx.shared().clone();
        let pd = dev.alloc_pd().unwrap();
        let buf = buffer(4096);
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = pd.reg_mr(MemRegion::whole(buf.clone()), rw).unwrap();
        let (lkey, rkey, va) = (mr.lkey(), mr.rkey(), mr.addr());
        assert_ne!(lkey, 0);
        assert_ne!(rkey, 0);
        assert_ne!(lkey, rkey);
        let held = dev
            .mrs
            .remote(pd.id(), rkey, va, 64, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert!(dev.mrs.local(pd.id(), &sge(&*mr, 0, 8), true).is_ok());
        drop(mr);
        assert!(dev.mrs.is_empty());
        assert_eq!(
            dev.mrs
                .remote(pd.id(), rkey, va, 64, AccessFlags::REMOTE_WRITE)
                .err(),
            Some(RemoteKeyError::UnknownKey)
        );
        let s = Sge {
            addr: va,
            length: 8,
            lkey,
        };
        assert!(matches!(
            dev.mrs.local(pd.id(), &s, false),
            Err(Error::InvalidLkey { .. })
        ));
        // A responder's resolution made before (a WRITE in progress, a READ's responses)
        // is revoked with the key: it reaches the memory no more.
        assert!(held.is_revoked());
        assert_eq!(
            held.write(0, b"too late"),
            Err(crate::transport::AccessError::Revoked)
        );
        assert_eq!(
            held.read(0, &mut [0; 8]),
            Err(crate::transport::AccessError::Revoked)
        );
        assert_eq!(buf.to_vec(0, 8).unwrap(), [0; 8]);
    }

    #[test]
    fn reg_mr_checks_access_and_pds_are_separate() {
        let ctx = device();
        let dev = ctx.shared().clone();
        let (pd1, pd2) = (dev.alloc_pd().unwrap(), dev.alloc_pd().unwrap());
        assert_ne!(pd1.id(), pd2.id());
        let buf = buffer(64);
        for bad in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
            assert!(matches!(
                pd1.reg_mr(MemRegion::whole(buf.clone()), bad),
                Err(Error::InvalidArgument(_))
            ));
        }
        let mr = pd1
            .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::REMOTE_READ)
            .unwrap();
        assert_eq!(mr.access(), AccessFlags::REMOTE_READ);
        assert_eq!((mr.addr(), mr.len()), (buf.addr(), 64));
        let r = AccessFlags::REMOTE_READ;
        assert!(dev.mrs.remote(pd1.id(), mr.rkey(), mr.addr(), 8, r).is_ok());
        assert_eq!(
            dev.mrs.remote(pd2.id(), mr.rkey(), mr.addr(), 8, r).err(),
            Some(RemoteKeyError::OtherPd)
        );
        assert!(matches!(
            dev.mrs.local(pd2.id(), &sge(&*mr, 0, 8), false),
            Err(Error::InvalidLkey { .. })
        ));
        // Persistent FLUSH rights only for memory with a durable backing store.
        let persist = AccessFlags::REMOTE_READ | AccessFlags::FLUSH_PERSISTENT;
        assert!(matches!(
            pd1.reg_mr(MemRegion::whole(buf.clone()), persist),
            Err(Error::InvalidArgument(_))
        ));
        let path = std::env::temp_dir().join(format!("remem-soft-mr-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let mapped = Arc::new(MemoryBuffer::map_file(&file, 0, 4096).unwrap());
        std::fs::remove_file(&path).unwrap();
        let pmr = pd1.reg_mr(MemRegion::whole(mapped), persist).unwrap();
        let whole = dev
            .mrs
            .remote_region(pd1.id(), pmr.rkey(), AccessFlags::FLUSH_PERSISTENT)
            .unwrap();
        assert_eq!(whole.len(), 4096);
        assert_eq!(
            dev.mrs
                .remote_region(pd1.id(), pmr.rkey(), AccessFlags::REMOTE_WRITE)
                .err(),
            Some(RemoteKeyError::MissingAccess)
        );
        assert_eq!(
            dev.mrs.remote_region(pd2.id(), pmr.rkey(), r).err(),
            Some(RemoteKeyError::OtherPd)
        );
    }

    #[test]
    fn create_cq_limits_and_foreign_handles() {
        let (a, b) = (device(), device());
        let max = a.query_device().unwrap().max_cqe;
        assert!(matches!(
            a.create_cq(0, None),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            a.create_cq(max + 1, None),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(a.create_cq(max, None).unwrap().cqe(), max);
        let cq = a.create_cq(5, None).unwrap();
        assert_eq!(cq.cqe(), 5);
        let other = a.create_cq(5, None).unwrap();
        assert_ne!(cq.id(), other.id());
        // Another device's channel and CQ are refused.
        let bch = b.create_comp_channel().unwrap();
        assert!(matches!(
            a.create_cq(4, Some(bch)),
            Err(Error::InvalidArgument(_))
        ));
        let bcq = b.create_cq(4, None).unwrap();
        assert!(matches!(
            a.shared().own_cq(&bcq),
            Err(Error::InvalidArgument(_))
        ));
        assert!(a.shared().own_cq(&cq).is_ok());
        let pd = a.alloc_pd().unwrap();
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: bcq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        assert!(matches!(
            pd.create_qp(&init),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn cq_overrun_reaches_the_context() {
        let ctx = device();
        assert!(!readable(ctx.async_fd()));
        assert_eq!(ctx.get_async_event(), None);
        let cq = ctx.shared().create_cq(1, None).unwrap();
        assert!(cq.push(WorkCompletion::default(), false));
        assert!(!cq.push(WorkCompletion::default(), false));
        assert!(readable(ctx.async_fd()));
        assert_eq!(
            ctx.get_async_event(),
            Some(AsyncEvent {
                event_type: AsyncEventType::CqErr,
                element: AsyncEventElement::Cq(remem_verbs::CompletionQueue::id(&*cq)),
            })
        );
        assert!(!readable(ctx.async_fd()));
        assert_eq!(ctx.get_async_event(), None);
    }

    #[test]
    fn qpns_are_24_bit_from_16_unpredictable_and_skip_live_ones() {
        let ctx = device();
        let dev = ctx.shared().clone();
        let qpns: Vec<u32> = (0..1000).map(|_| dev.alloc_qpn().unwrap()).collect();
        assert!(qpns.iter().all(|q| (FIRST_QPN..=MAX_QPN).contains(q)));
        // Not a sequence: knowing one number does not give the next.
        let sequential = qpns.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(sequential < 5, "{sequential} sequential QPNs");
        // 0, 1 and the rest below 16 are never handed out, nor the multicast QPN.
        for special in [0, 1, 15, MULTICAST_QPN] {
            dev.qpns.lock().unwrap().seek(special);
            let q = dev.alloc_qpn().unwrap();
            assert!(q >= FIRST_QPN, "{q} after seeking {special}");
            assert_ne!(q, MULTICAST_QPN, "after seeking {special}");
        }
        // A live QP's number is skipped when the sequence comes round to it.
        let pd = dev.alloc_pd().unwrap();
        let qp = qp_of(&dev, &pd, QpType::Rc);
        let live = qp.qp_num();
        dev.qpns.lock().unwrap().seek(live);
        assert_ne!(dev.alloc_qpn().unwrap(), live);
        drop(qp);
        dev.qpns.lock().unwrap().seek(live);
        assert_eq!(dev.alloc_qpn().unwrap(), live, "free again once destroyed");
        // And a destroyed QP's number does not come back soon: not among the next 10,000.
        let pd = dev.alloc_pd().unwrap();
        let gone = qp_of(&dev, &pd, QpType::Rc).qp_num();
        assert!((0..10_000).all(|_| dev.alloc_qpn().unwrap() != gone));
    }

    #[test]
    fn object_limits_are_enforced() {
        let ctx = device();
        let d = ctx.shared();
        let attr = remem_verbs::DeviceAttr {
            max_pd: 1,
            max_cq: 1,
            max_qp: 1,
            max_srq: 1,
            max_ah: 1,
            ..d.attr.clone()
        };
        let opts = SoftOptions {
            inline: true,
            ..SoftOptions::default()
        };
        let addr = "127.0.0.1:0".parse().unwrap();
        let dev = DeviceShared::open(d.info.clone(), attr, d.port.clone(), addr, &opts).unwrap();
        let exhausted = |r: Result<()>| matches!(r, Err(Error::Exhausted(_)));
        let pd = dev.alloc_pd().unwrap();
        assert!(exhausted(dev.alloc_pd().map(drop)));
        let cq: Arc<dyn CompletionQueue> = dev.create_cq(4, None).unwrap();
        assert!(exhausted(dev.create_cq(4, None).map(drop)));
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        let qp = pd.create_qp(&init).unwrap();
        assert!(exhausted(pd.create_qp(&init).map(drop)));
        let srq_attr = SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = pd.create_srq(srq_attr).unwrap();
        assert!(exhausted(pd.create_srq(srq_attr).map(drop)));
        let v2 = dev
            .info
            .gids
            .iter()
            .position(|g| g.gid_type == GidType::RoceV2)
            .unwrap() as u8;
        let av = AhAttr {
            dgid: Gid::from(Ipv4Addr::new(127, 0, 0, 2)),
            sgid_index: v2,
            ..AhAttr::default()
        };
        let ah = pd.create_ah(&av).unwrap();
        assert!(exhausted(pd.create_ah(&av).map(drop)));
        // Destroying an object frees its slot.
        drop((qp, srq, ah));
        assert!(pd.create_qp(&init).is_ok());
        assert!(pd.create_srq(srq_attr).is_ok());
        assert!(pd.create_ah(&av).is_ok());
        drop(cq);
        drop(init);
        assert!(dev.create_cq(4, None).is_ok());
        drop(pd);
        assert!(dev.alloc_pd().is_ok());
    }

    #[test]
    fn address_handles_are_checked() {
        let ctx = device();
        let dev = ctx.shared().clone();
        let pd = dev.alloc_pd().unwrap();
        let gids = &dev.info.gids;
        let v2 = 1;
        assert!(gids.iter().all(|g| g.gid_type == GidType::RoceV2));
        // Index 0, the device's link-local name, sends from the bound address too, and a
        // loopback device's link-local GID names it as a destination.
        let peer_ll = crate::device::netdev::link_local_gid("127.0.0.2".parse().unwrap(), None);
        for (sgid_index, dgid) in [
            (0, peer_ll),
            (1, peer_ll),
            (0, Gid::from(Ipv4Addr::new(127, 0, 0, 2))),
        ] {
            let av = AhAttr {
                dgid,
                sgid_index,
                ..AhAttr::default()
            };
            assert!(pd.create_ah(&av).is_ok(), "{av:?}");
        }
        let good = AhAttr {
            dgid: Gid::from(Ipv4Addr::new(127, 0, 0, 2)),
            sgid_index: v2,
            ..AhAttr::default()
        };
        let ah = pd.create_ah(&good).unwrap();
        assert_eq!(ah.attr(), &good);
        assert!(dev.own_ah(&ah, pd.id()).is_ok());
        let other_pd = dev.alloc_pd().unwrap();
        assert!(dev.own_ah(&ah, other_pd.id()).is_err(), "another PD's AH");
        // A UD send must name an AH of the QP's own PD.
        let qp = qp_of(&dev, &pd, QpType::Ud);
        use remem_verbs::{QpAttr, QpAttrMask as M, QpState, SendOp, SendWr, UdDest};
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: 0x11,
            ..QpAttr::default()
        };
        qp.modify(&attr, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
            .unwrap();
        attr.qp_state = QpState::Rtr;
        qp.modify(&attr, M::STATE).unwrap();
        attr.qp_state = QpState::Rts;
        qp.modify(&attr, M::STATE | M::SQ_PSN).unwrap();
        let foreign = other_pd.create_ah(&good).unwrap();
        for (ah, ok) in [(ah.clone(), true), (foreign, false)] {
            let mut wr = SendWr::new(1, SendOp::Send, &[]);
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: 0x22,
                remote_qkey: 0x11,
            });
            assert_eq!(qp.post_send(&[wr]).is_ok(), ok);
        }
        let bad = [
            AhAttr {
                port_num: 0,
                ..good
            },
            AhAttr {
                port_num: 2,
                ..good
            },
            AhAttr {
                sgid_index: gids.len() as u8,
                ..good
            },
            AhAttr {
                is_global: false,
                ..good
            },
            AhAttr {
                dgid: Gid::from("::2".parse::<std::net::Ipv6Addr>().unwrap()),
                ..good
            },
            // A link-local GID that names no loopback device: unreachable.
            AhAttr {
                dgid: Gid::from(
                    "fe80::5054:ff:fe28:c219"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap(),
                ),
                ..good
            },
        ]
        .into_iter()
        // An address of the netdev the device does not bind (lo's ::1): not a source.
        .chain((gids.len() > 2).then_some(AhAttr {
            sgid_index: 2,
            ..good
        }));
        for attr in bad {
            assert!(
                matches!(
                    pd.create_ah(&attr),
                    Err(Error::InvalidAttribute {
                        name: "ah_attr",
                        ..
                    })
                ),
                "{attr:?}"
            );
        }
    }

    fn recv<'a>(wr_id: u64, sg_list: &'a [Sge]) -> RecvWr<'a> {
        RecvWr { wr_id, sg_list }
    }

    #[test]
    fn srq_post_pop_and_errors() {
        let ctx = device();
        let dev = ctx.shared().clone();
        let attr = dev.attr.clone();
        let pd = dev.alloc_pd().unwrap();
        let too_big = [
            SrqAttr {
                max_wr: 0,
                max_sge: 1,
                srq_limit: 0,
            },
            SrqAttr {
                max_wr: attr.max_srq_wr + 1,
                max_sge: 1,
                srq_limit: 0,
            },
            SrqAttr {
                max_wr: 4,
                max_sge: attr.max_srq_sge + 1,
                srq_limit: 0,
            },
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 5,
            },
        ];
        for a in too_big {
            assert!(
                matches!(pd.create_srq(a), Err(Error::InvalidArgument(_))),
                "{a:?}"
            );
        }
        let srq_attr = SrqAttr {
            max_wr: 3,
            max_sge: 2,
            srq_limit: 0,
        };
        let srq = pd.create_srq(srq_attr).unwrap();
        assert_eq!(srq.query().unwrap(), srq_attr);
        let own = dev.own_srq(&srq).unwrap();
        let buf = buffer(256);
        let mr = pd
            .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::LOCAL_WRITE)
            .unwrap();
        let ro = pd
            .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::empty())
            .unwrap();
        let other_pd_mr = dev
            .alloc_pd()
            .unwrap()
            .reg_mr(MemRegion::whole(buf.clone()), AccessFlags::LOCAL_WRITE)
            .unwrap();
        let ok = [sge(&*mr, 0, 16), sge(&*mr, 16, 16)];
        let three = [sge(&*mr, 0, 1), sge(&*mr, 1, 1), sge(&*mr, 2, 1)];
        let ro_sge = [sge(&*ro, 0, 8)];
        let oob = [sge(&*mr, 250, 8)];
        let foreign = [sge(&*other_pd_mr, 0, 8)];
        type Is = fn(&Error) -> bool;
        let cases: [(&[Sge], Is); 4] = [
            (&three, |e| {
                matches!(e, Error::TooManySge { given: 3, max: 2 })
            }),
            (&ro_sge, |e| matches!(e, Error::LocalAccess { .. })),
            (&oob, |e| matches!(e, Error::SgeOutOfBounds { .. })),
            (&foreign, |e| matches!(e, Error::InvalidLkey { .. })),
        ];
        for (bad, is) in cases {
            let err = srq.post_recv(&[recv(1, &ok), recv(2, bad)]).unwrap_err();
            assert_eq!(err.index, 1, "{err}");
            assert!(is(&err.error), "{err}");
            // The one before the bad WR stays posted.
            assert_eq!(own.pop().map(|w| w.wr_id), Some(1));
        }
        assert!(own.is_empty());
        // Fill, overflow, then pop in order with the right memory.
        srq.post_recv(&[recv(10, &ok), recv(11, &[]), recv(12, &ok[..1])])
            .unwrap();
        let PostError { index, error } = srq.post_recv(&[recv(13, &ok)]).unwrap_err();
        assert_eq!(index, 0);
        assert!(
            matches!(error, Error::QueueFull { outstanding: 3 }),
            "{error}"
        );
        let w = own.pop().unwrap();
        assert_eq!((w.wr_id, w.total_len, w.sges.len()), (10, 32, 2));
        assert_eq!(w.sges[1].addr(), buf.addr() + 16);
        let w = own.pop().unwrap();
        assert_eq!((w.wr_id, w.total_len), (11, 0));
        assert_eq!(own.pop().unwrap().wr_id, 12);
        assert!(own.pop().is_none());
        // No limit armed: no event.
        assert_eq!(ctx.get_async_event(), None);
    }

    #[test]
    fn srq_limit_fires_once_when_armed() {
        let ctx = device();
        let dev = ctx.shared().clone();
        let pd = dev.alloc_pd().unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let own = dev.own_srq(&srq).unwrap();
        let buf = buffer(64);
        let mr = pd
            .reg_mr(MemRegion::whole(buf), AccessFlags::LOCAL_WRITE)
            .unwrap();
        let s = [sge(&*mr, 0, 8)];
        let wrs: Vec<_> = (0..6).map(|i| recv(i, &s)).collect();
        srq.post_recv(&wrs).unwrap();
        assert!(matches!(srq.set_limit(9), Err(Error::InvalidArgument(_))));
        srq.set_limit(4).unwrap();
        assert_eq!(srq.query().unwrap().srq_limit, 4);
        own.pop().unwrap(); // 5 left
        own.pop().unwrap(); // 4 left: not below the limit
        assert_eq!(ctx.get_async_event(), None);
        own.pop().unwrap(); // 3 left: below
        let ev = AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            element: AsyncEventElement::Srq(srq.srq_num()),
        };
        assert!(readable(ctx.async_fd()));
        assert_eq!(ctx.get_async_event(), Some(ev));
        assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed");
        own.pop().unwrap();
        assert_eq!(ctx.get_async_event(), None, "once per arming");
        // Re-armed above the current count (2): the next pop fires.
        srq.set_limit(8).unwrap();
        assert_eq!(ctx.get_async_event(), None);
        own.pop().unwrap();
        assert_eq!(ctx.get_async_event(), Some(ev));
        // A limit given at creation is armed.
        let armed = pd
            .create_srq(SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 1,
            })
            .unwrap();
        armed.post_recv(&[recv(1, &s)]).unwrap();
        dev.own_srq(&armed).unwrap().pop().unwrap();
        assert_eq!(
            ctx.get_async_event().map(|e| e.element),
            Some(AsyncEventElement::Srq(armed.srq_num()))
        );
    }

    #[test]
    fn counters_are_named_and_counted() {
        let ctx = device();
        let names: Vec<_> = ctx.counters().iter().map(|c| c.name).collect();
        for (_, name) in STAT_NAMES {
            assert!(names.contains(&name), "{name}");
        }
        ctx.shared().count(Stat::RcvdSeqNak);
        ctx.shared().count(Stat::RcvdSeqNak);
        let v = |n| ctx.counters().iter().find(|c| c.name == n).unwrap().value;
        assert_eq!(v("rcvd_seq_err"), 2);
        assert_eq!(v("duplicate_request"), 0);
    }
}
