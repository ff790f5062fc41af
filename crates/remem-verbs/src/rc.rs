//! Device setup that every verbs program repeats: finding a port's RoCE v2 GID
//! ([`roce_v2_gid`]) and bringing a connected (RC or UC) queue pair from RESET through INIT
//! and RTR to RTS towards a peer ([`connect`], or [`to_init`], [`to_rtr`], [`to_rts`] one
//! step at a time).
//!
//! What the peer told this side (out of band: a TCP exchange, a CM private data field) is
//! an [`RcPeer`]; what this side chooses is an [`RcOptions`]. The attributes each step sets
//! are plain values ([`RcOptions::init_attr`], [`RcOptions::rtr_attr`],
//! [`RcOptions::rts_attr`]), so a program that needs one odd attribute can take them and
//! change it before `modify`.
//!
//! ```
//! use remem_verbs::rc::{RcOptions, RcPeer};
//! use remem_verbs::{Gid, Mtu, QpAttrMask, QpState, QpType};
//!
//! let gid = Gid::from(std::net::Ipv4Addr::new(10, 0, 0, 2));
//! let peer = RcPeer { qpn: 0x11, psn: 0x22, gid, mtu: Mtu::Mtu1024 };
//! let o = RcOptions { sgid_index: 1, sq_psn: 0x33, timeout: 17, ..RcOptions::default() };
//! let (rtr, mask) = o.rtr_attr(QpType::Rc, &peer).unwrap();
//! assert_eq!((rtr.qp_state, rtr.dest_qp_num, rtr.rq_psn), (QpState::Rtr, 0x11, 0x22));
//! assert_eq!(rtr.path_mtu, Mtu::Mtu1024); // the smaller of the two sides'
//! assert_eq!(mask, QpAttrMask::RC_TO_RTR);
//! let (rts, _) = o.rts_attr(QpType::Rc).unwrap();
//! assert_eq!((rts.sq_psn, rts.timeout), (0x33, 17));
//! ```

#![forbid(unsafe_code)]

use crate::{
    AccessFlags, AhAttr, Context, Error, Gid, GidEntry, GidType, Mtu, QpAttr, QpAttrMask, QpState,
    QpType, QueuePair, Result,
};

/// The first RoCE v2 GID of port `port_num` of `ctx` — IPv4-mapped ones first (IPv4 is
/// what peers on other hosts most often reach: [`crate::first_roce_v2_ipv4`]), then
/// routable IPv6 ones, link-local last (a RoCE table lists the netdev's link-local
/// default GID at index 0; it names the port on its link only) — the GID remem's layers
/// use as the local address.
/// A port with none is [`Error::DeviceUnavailable`], naming the device and port; a port
/// that does not exist is the device's error from [`Context::gid_table`].
///
/// ```
/// # use remem_verbs::{GidEntry, GidType, Gid};
/// # fn f(ctx: &dyn remem_verbs::Context) -> remem_verbs::Result<()> {
/// let entry: GidEntry = remem_verbs::rc::roce_v2_gid(ctx, 1)?;
/// assert_eq!(entry.gid_type, GidType::RoceV2);
/// # Ok(()) }
/// ```
pub fn roce_v2_gid(ctx: &dyn Context, port_num: u8) -> Result<GidEntry> {
    ctx.gid_table(port_num)?
        .into_iter()
        .filter(|g| g.gid_type == GidType::RoceV2)
        .min_by_key(|g| {
            let link_local = g.gid.0[0] == 0xfe && g.gid.0[1] & 0xc0 == 0x80;
            (!g.gid.is_ipv4_mapped(), link_local, g.index)
        })
        .ok_or_else(|| {
            Error::DeviceUnavailable(format!(
                "{} port {port_num} has no RoCE v2 GID (remem speaks RoCE v2; is the \
                 interface up with an IP address?)",
                ctx.info().name
            ))
        })
}

/// What a connected QP needs to know of its peer's QP: exchanged out of band before the
/// QP can go to RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcPeer {
    /// The peer QP's number (24 bits): this QP's `dest_qp_num`.
    pub qpn: u32,
    /// The first PSN the peer sends (24 bits): this QP's `rq_psn`.
    pub psn: u32,
    /// The peer's GID: the destination of this QP's path.
    pub gid: Gid,
    /// The largest path MTU the peer's port takes; the path MTU is the smaller of this and
    /// [`RcOptions::mtu`].
    pub mtu: Mtu,
}

/// What this side chooses when it brings a connected QP up. The defaults are those of a
/// verbs program on a RoCE NIC: port 1, P_Key index 0, GID index 0 (set it from
/// [`roce_v2_gid`]), remote WRITE/READ/atomic access, MTU up to 4096, 16 READs/atomics
/// each way, RNR timer code 12 (0.64 ms), ACK timeout code 14 (67 ms), 7 retries, infinite
/// RNR retries, hop limit 64 with a GRH (RoCE v2 routes by IP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcOptions {
    /// `port_num` (1-based), of the QP and its path.
    pub port_num: u8,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `ah_attr.sgid_index`: the local GID the QP sends from (RoCE v2: [`roce_v2_gid`]).
    pub sgid_index: u8,
    /// `qp_access_flags`: the remote operations this QP accepts (a UC QP takes at most
    /// REMOTE_WRITE; the flags are passed as given).
    pub access: AccessFlags,
    /// `sq_psn`: the first PSN this QP sends (24 bits; the peer's [`RcPeer::psn`]).
    pub sq_psn: u32,
    /// The largest path MTU this side's port takes (see [`RcPeer::mtu`]).
    pub mtu: Mtu,
    /// `max_rd_atomic`: READs/atomics this QP may have outstanding (RC).
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: READs/atomics this QP accepts outstanding as target (RC).
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`: the RNR NAK timer code this QP's responder sends (RC; 0–31).
    pub min_rnr_timer: u8,
    /// `timeout`: the local ACK timeout code, 4.096 µs × 2^timeout (RC; 0 = infinite).
    pub timeout: u8,
    /// `retry_cnt`: retransmissions after a timeout or sequence NAK (RC; 0–7).
    pub retry_cnt: u8,
    /// `rnr_retry`: retransmissions after an RNR NAK (RC; 0–6, 7 = infinite).
    pub rnr_retry: u8,
    /// `ah_attr.is_global`: whether packets carry a GRH (RoCE: always, the IP header).
    pub is_global: bool,
    /// `ah_attr.hop_limit`.
    pub hop_limit: u8,
    /// `ah_attr.traffic_class`.
    pub traffic_class: u8,
    /// `ah_attr.flow_label` (20 bits).
    pub flow_label: u32,
}

impl Default for RcOptions {
    fn default() -> Self {
        RcOptions {
            port_num: 1,
            pkey_index: 0,
            sgid_index: 0,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sq_psn: 0,
            mtu: Mtu::Mtu4096,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            is_global: true,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// The connected service's transition masks: RC's, or UC's (no READ/atomic resources,
/// timeout, retries or RNR timer); any other QP type is [`Error::InvalidArgument`].
fn masks(qp_type: QpType) -> Result<[QpAttrMask; 3]> {
    use QpAttrMask as M;
    match qp_type {
        QpType::Rc => Ok([M::RC_TO_INIT, M::RC_TO_RTR, M::RC_TO_RTS]),
        QpType::Uc => Ok([M::UC_TO_INIT, M::UC_TO_RTR, M::UC_TO_RTS]),
        other => Err(Error::InvalidArgument(format!(
            "a {other:?} QP is not connected: RC and UC QPs go to RTR towards one peer"
        ))),
    }
}

impl RcOptions {
    /// RESET → INIT: the port, P_Key index and access flags, and the mask of that
    /// transition for `qp_type` (RC or UC).
    pub fn init_attr(&self, qp_type: QpType) -> Result<(QpAttr, QpAttrMask)> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: self.pkey_index,
            port_num: self.port_num,
            qp_access_flags: self.access,
            ..QpAttr::default()
        };
        Ok((attr, masks(qp_type)?[0]))
    }

    /// The path towards `peer`: its GID from this side's GID index and port.
    pub fn ah_attr(&self, peer: &RcPeer) -> AhAttr {
        AhAttr {
            dgid: peer.gid,
            sgid_index: self.sgid_index,
            hop_limit: self.hop_limit,
            traffic_class: self.traffic_class,
            flow_label: self.flow_label,
            is_global: self.is_global,
            port_num: self.port_num,
            ..AhAttr::default()
        }
    }

    /// INIT → RTR towards `peer`: the path, the smaller MTU, the peer's QPN and first PSN,
    /// and (RC) this side's READ/atomic target resources and RNR timer; with the mask.
    pub fn rtr_attr(&self, qp_type: QpType, peer: &RcPeer) -> Result<(QpAttr, QpAttrMask)> {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: self.mtu.min(peer.mtu),
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            ah_attr: self.ah_attr(peer),
            ..QpAttr::default()
        };
        Ok((attr, masks(qp_type)?[1]))
    }

    /// RTR → RTS: the first PSN and (RC) the timeout, retry counts and READ/atomic
    /// initiator resources; with the mask.
    pub fn rts_attr(&self, qp_type: QpType) -> Result<(QpAttr, QpAttrMask)> {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            ..QpAttr::default()
        };
        Ok((attr, masks(qp_type)?[2]))
    }
}

/// Moves `qp` (RC or UC, in RESET) to INIT with `o`'s port, P_Key index and access.
pub fn to_init(qp: &dyn QueuePair, o: &RcOptions) -> Result<()> {
    let (attr, mask) = o.init_attr(qp.qp_type())?;
    qp.modify(&attr, mask)
}

/// Moves `qp` (RC or UC, in INIT) to RTR towards `peer`: it takes the peer's packets and
/// answers them, and sends nothing of its own.
pub fn to_rtr(qp: &dyn QueuePair, peer: &RcPeer, o: &RcOptions) -> Result<()> {
    let (attr, mask) = o.rtr_attr(qp.qp_type(), peer)?;
    qp.modify(&attr, mask)
}

/// Moves `qp` (RC or UC, in RTR) to RTS: it may send.
pub fn to_rts(qp: &dyn QueuePair, o: &RcOptions) -> Result<()> {
    let (attr, mask) = o.rts_attr(qp.qp_type())?;
    qp.modify(&attr, mask)
}

/// Brings `qp` (RC or UC, in RESET) through INIT and RTR to RTS towards `peer`: the three
/// `ibv_modify_qp` calls of a verbs program, with `o`'s choices. The first failing step's
/// error is returned (the QP stays in the state it reached).
///
/// ```
/// use remem_verbs::rc::{self, RcOptions, RcPeer};
/// use remem_verbs::{Context, QueuePair, Result};
///
/// /// Connects `qp` on `ctx` to what the peer sent, sending from PSN `my_psn`.
/// fn bring_up(ctx: &dyn Context, qp: &dyn QueuePair, peer: RcPeer, my_psn: u32) -> Result<()> {
///     let gid = rc::roce_v2_gid(ctx, 1)?;
///     let mtu = ctx.query_port(1)?.active_mtu;
///     let o = RcOptions { sgid_index: gid.index as u8, sq_psn: my_psn, mtu, ..RcOptions::default() };
///     rc::connect(qp, &peer, &o)
/// }
/// ```
pub fn connect(qp: &dyn QueuePair, peer: &RcPeer, o: &RcOptions) -> Result<()> {
    to_init(qp, o)?;
    to_rtr(qp, peer, o)?;
    to_rts(qp, o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_modify;

    fn peer() -> RcPeer {
        RcPeer {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            gid: Gid::from(std::net::Ipv4Addr::new(10, 0, 0, 2)),
            mtu: Mtu::Mtu1024,
        }
    }

    #[test]
    fn every_step_passes_the_modify_rules_for_rc_and_uc() {
        let o = RcOptions::default();
        for t in [QpType::Rc, QpType::Uc] {
            let (init, m) = o.init_attr(t).unwrap();
            check_modify(t, QpState::Reset, &init, m).unwrap();
            let (rtr, m) = o.rtr_attr(t, &peer()).unwrap();
            check_modify(t, QpState::Init, &rtr, m).unwrap();
            let (rts, m) = o.rts_attr(t).unwrap();
            check_modify(t, QpState::Rtr, &rts, m).unwrap();
        }
    }

    #[test]
    fn attributes_are_the_options_and_the_peer() {
        let o = RcOptions {
            port_num: 2,
            pkey_index: 3,
            sgid_index: 4,
            sq_psn: 5,
            mtu: Mtu::Mtu512,
            max_rd_atomic: 6,
            max_dest_rd_atomic: 7,
            min_rnr_timer: 8,
            timeout: 9,
            retry_cnt: 1,
            rnr_retry: 2,
            hop_limit: 10,
            traffic_class: 11,
            flow_label: 12,
            ..RcOptions::default()
        };
        let (init, _) = o.init_attr(QpType::Rc).unwrap();
        assert_eq!((init.port_num, init.pkey_index), (2, 3));
        assert_eq!(init.qp_access_flags, o.access);
        let (rtr, _) = o.rtr_attr(QpType::Rc, &peer()).unwrap();
        assert_eq!(rtr.path_mtu, Mtu::Mtu512, "the smaller MTU");
        assert_eq!((rtr.dest_qp_num, rtr.rq_psn), (0x12_3456, 0xab_cdef));
        assert_eq!((rtr.max_dest_rd_atomic, rtr.min_rnr_timer), (7, 8));
        let ah = rtr.ah_attr;
        assert_eq!((ah.dgid, ah.sgid_index, ah.port_num), (peer().gid, 4, 2));
        assert_eq!(
            (ah.hop_limit, ah.traffic_class, ah.flow_label),
            (10, 11, 12)
        );
        assert!(ah.is_global);
        let (rts, _) = o.rts_attr(QpType::Rc).unwrap();
        assert_eq!((rts.sq_psn, rts.max_rd_atomic, rts.timeout), (5, 6, 9));
        assert_eq!((rts.retry_cnt, rts.rnr_retry), (1, 2));
    }

    #[test]
    fn uc_masks_leave_out_what_uc_has_not_and_ud_is_refused() {
        let o = RcOptions::default();
        assert_eq!(
            o.rtr_attr(QpType::Uc, &peer()).unwrap().1,
            QpAttrMask::UC_TO_RTR
        );
        assert_eq!(o.rts_attr(QpType::Uc).unwrap().1, QpAttrMask::UC_TO_RTS);
        assert!(matches!(
            o.init_attr(QpType::Ud),
            Err(Error::InvalidArgument(_))
        ));
    }

    /// A device that has only the GID table given (every other verb unsupported).
    struct Gids(crate::DeviceInfo, std::fs::File);

    impl Context for Gids {
        fn info(&self) -> &crate::DeviceInfo {
            &self.0
        }
        fn query_device(&self) -> Result<crate::DeviceAttr> {
            Err(Error::Unsupported("mock"))
        }
        fn query_port(&self, _: u8) -> Result<crate::PortAttr> {
            Err(Error::Unsupported("mock"))
        }
        fn query_gid(&self, _: u8, _: u32) -> Result<GidEntry> {
            Err(Error::Unsupported("mock"))
        }
        fn gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>> {
            match port_num {
                1 => Ok(self.0.gids.clone()),
                _ => Err(Error::InvalidArgument(format!("no port {port_num}"))),
            }
        }
        fn alloc_pd(&self) -> Result<std::sync::Arc<dyn crate::ProtectionDomain>> {
            Err(Error::Unsupported("mock"))
        }
        fn create_comp_channel(&self) -> Result<std::sync::Arc<dyn crate::CompletionChannel>> {
            Err(Error::Unsupported("mock"))
        }
        fn create_cq(
            &self,
            _: u32,
            _: Option<std::sync::Arc<dyn crate::CompletionChannel>>,
        ) -> Result<std::sync::Arc<dyn crate::CompletionQueue>> {
            Err(Error::Unsupported("mock"))
        }
        fn async_fd(&self) -> std::os::fd::BorrowedFd<'_> {
            std::os::fd::AsFd::as_fd(&self.1)
        }
        fn get_async_event(&self) -> Option<crate::AsyncEvent> {
            None
        }
        fn counters(&self) -> Vec<crate::Counter> {
            Vec::new()
        }
    }

    fn device(gids: &[(Gid, GidType)]) -> Gids {
        let gids = gids
            .iter()
            .enumerate()
            .map(|(i, &(gid, gid_type))| GidEntry {
                index: i as u32,
                gid,
                gid_type,
                port_num: 1,
                netdev: None,
            })
            .collect();
        let info = crate::DeviceInfo {
            name: "mock0".into(),
            provider: "mock",
            node_guid: 0,
            netdev: None,
            gids,
            udp_addr: None,
        };
        Gids(info, std::fs::File::open("/dev/null").unwrap())
    }

    #[test]
    fn roce_v2_gid_prefers_ipv4_and_says_when_there_is_none() {
        let v4 = Gid::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
        let v6 = Gid::from("fd00::1".parse::<std::net::Ipv6Addr>().unwrap());
        let dev = device(&[
            (v6, GidType::RoceV1),
            (v6, GidType::RoceV2),
            (v4, GidType::RoceV1),
            (v4, GidType::RoceV2),
        ]);
        let g = roce_v2_gid(&dev, 1).unwrap();
        assert_eq!((g.index, g.gid), (3, v4), "IPv4-mapped first");
        let only_v6 = device(&[(v6, GidType::RoceV1), (v6, GidType::RoceV2)]);
        assert_eq!(roce_v2_gid(&only_v6, 1).unwrap().index, 1);
        // rxe's layout on an IPv6-only netdev: the link-local default GID at 0, the
        // routable address after it, which is the one taken.
        let ll = Gid::from("fe80::200:ff:fe00:0".parse::<std::net::Ipv6Addr>().unwrap());
        let rxe_v6 = device(&[(ll, GidType::RoceV2), (v6, GidType::RoceV2)]);
        assert_eq!(roce_v2_gid(&rxe_v6, 1).unwrap().gid, v6, "link-local last");
        let rxe = device(&[(ll, GidType::RoceV2), (v4, GidType::RoceV2)]);
        assert_eq!(roce_v2_gid(&rxe, 1).unwrap().index, 1);
        assert_eq!(
            crate::first_roce_v2_ipv4(&rxe.0.gids).map(|e| e.index),
            Some(1)
        );
        let v1_only = device(&[(v4, GidType::RoceV1), (v4, GidType::Ib)]);
        match roce_v2_gid(&v1_only, 1) {
            Err(Error::DeviceUnavailable(m)) => {
                assert!(m.contains("mock0 port 1 has no RoCE v2 GID"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            roce_v2_gid(&dev, 2),
            Err(Error::InvalidArgument(_))
        ));
    }
}
