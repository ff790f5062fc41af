//! Multicast: `rdma_join_multicast(_ex)`, `rdma_leave_multicast`.

#![forbid(unsafe_code)]

use super::*;
use crate::ffi::handles::Handle;

/// The join of `target` whose group is multicast GID `mgid`.
pub(super) fn find_join(target: &IdShared, mgid: &Gid) -> Option<McJoin> {
    let IpAddr::V4(group) = mgid.to_ip() else {
        return None;
    };
    target
        .state()
        .mcast
        .iter()
        .find(|j| j.group == group)
        .copied()
}

/// The RoCE v2 multicast GID of an IPv4 group (`::ffff:a.b.c.d`, the kernel's
/// `cma_iboe_set_mgid` for RoCE v2).
pub(super) fn mgid_of(group: std::net::Ipv4Addr) -> Gid {
    Gid(group.to_ipv6_mapped().octets())
}

/// `rdma_join_multicast_ex` once the FFI layer has read its arguments (`attr` copied,
/// `group` its `addr`): see [`crate::ffi::rdmacm::remem_ibv_rdma_join_multicast_ex`].
pub(crate) fn join(
    shared: &Arc<IdShared>,
    attr: Option<rdma_cm_join_mc_attr_ex>,
    group: Option<SocketAddr>,
    context: *mut c_void,
) -> c_int {
    let Some(a) = attr else {
        return fail(libc::EINVAL);
    };
    let need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    if a.comp_mask & need != need {
        return fail(libc::EINVAL);
    }
    let send_only = match a.join_flags {
        f if f == RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
        f if f == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
        _ => return fail(libc::ENOSYS),
    };
    let group = match group.map(|s| s.ip().to_canonical()) {
        Some(IpAddr::V4(g)) if g.is_multicast() => g,
        Some(IpAddr::V6(g)) if g.is_multicast() => return fail(libc::EOPNOTSUPP),
        _ => return fail(libc::EINVAL),
    };
    let Ok((dev, cm)) = shared.cm() else {
        return fail(libc::EINVAL);
    };
    let sgid_index = cm
        .local_addr()
        .map(|l| Gid::from(l.ip().to_canonical()))
        .and_then(|me| {
            dev.ctx()?
                .shared()
                .dev
                .info()
                .gids
                .iter()
                .position(|g| g.gid == me && g.gid_type == remem_verbs::GidType::RoceV2)
        })
        .unwrap_or(0) as u8;
    {
        let mut st = shared.state();
        if st.mcast.iter().any(|j| j.group == group) {
            return fail(libc::EADDRINUSE);
        }
        st.mcast.push(McJoin {
            group,
            context: context as usize,
            send_only,
        });
    }
    let ud = remem_verbs::cm::UdParam {
        qp_num: 0x00ff_ffff,
        qkey: RDMA_UDP_QKEY,
        ah_attr: remem_verbs::AhAttr {
            dgid: mgid_of(group),
            is_global: true,
            hop_limit: 64,
            sgid_index,
            port_num: 1,
            ..remem_verbs::AhAttr::default()
        },
    };
    shared.queue(Pending {
        target: Arc::clone(shared),
        ev: remem_verbs::cm::CmEvent {
            kind: CmEventKind::MulticastJoin,
            id: cm,
            listen_id: None,
            status: 0,
            private_data: Vec::new(),
            param: CmEventParam::Ud(ud),
        },
        child: None,
    });
    complete(shared)
}

/// `rdma_leave_multicast` once the FFI layer has read `addr` (`group`): leaves the group,
/// detaching the id's QP first as librdmacm does (not for a send-only join). -1 with
/// EADDRNOTAVAIL for a group the id has not joined.
pub(crate) fn leave(id: Handle<'_, RdmaId>, group: Option<SocketAddr>) -> c_int {
    let shared = id.inner();
    let Some(IpAddr::V4(group)) = group.map(|s| s.ip().to_canonical()) else {
        return fail(libc::EADDRNOTAVAIL);
    };
    let join = {
        let mut st = shared.state();
        let Some(at) = st.mcast.iter().position(|j| j.group == group) else {
            return fail(libc::EADDRNOTAVAIL);
        };
        st.mcast.remove(at)
    };
    if let Some(qp) = id.qp()
        && !join.send_only
    {
        let gid = ibv_gid {
            raw: mgid_of(group).0,
        };
        // Not attached (the join's event was never taken) is no error here, as in
        // librdmacm.
        let _ = crate::qp::detach_mcast(qp.inner(), &gid, 0);
    }
    0
}
