//! Multicast: `rdma_join_multicast(_ex)`, `rdma_leave_multicast`.

#![allow(unsafe_code)]

use super::*;

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

/// `rdma_join_multicast`: `rdma_join_multicast_ex` with `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `addr` is NULL or a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    let mut attr = rdma_cm_join_mc_attr_ex {
        comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
        join_flags: RDMA_MC_JOIN_FLAG_FULLMEMBER,
        addr,
    };
    // SAFETY: by the contract; `attr` is on the stack.
    unsafe { remem_ibv_rdma_join_multicast_ex(id, &mut attr, context) }
}

/// `rdma_join_multicast_ex`: joins the IPv4 multicast group `attr->addr` on the id's device
/// (bound or resolved), as the kernel does for RoCE v2: a MULTICAST_JOIN event follows
/// whose `ud` parameters address the group (the MGID `::ffff:a.b.c.d` as `dgid`,
/// `is_global`, hop limit 64, QPN 0xFFFFFF, Q_Key `RDMA_UDP_QKEY`) and whose
/// `ud.private_data` is `context`; taking that event attaches the id's QP to the group (none
/// for a `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` join), as librdmacm does. -1 with EINVAL
/// (no address or join flags, an address that is not IPv4 multicast, an id not bound to a
/// device, a group joined already), EOPNOTSUPP (an IPv6 group), ENOSYS (an unknown flag).
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `attr` is NULL or valid, its `addr` NULL or a
/// valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard_neg("rdma_join_multicast_ex", || {
        // SAFETY: by the contract.
        let Some(shared) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-NULL and valid by the contract.
        let a = unsafe { attr.read() };
        let need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        if a.comp_mask & need != need {
            return fail(libc::EINVAL);
        }
        let send_only = match a.join_flags {
            f if f == RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
            f if f == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
            _ => return fail(libc::ENOSYS),
        };
        // SAFETY: NULL or a valid socket address by the contract.
        let group = match unsafe { sockaddr_to_std(a.addr) }.map(|s| s.ip().to_canonical()) {
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
                // SAFETY: the device's context, open for the life of the process.
                let c = unsafe { crate::context::ctx_from(dev.verbs()) }?;
                c.shared()
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
    })
}

/// `rdma_leave_multicast`: leaves a group joined with `rdma_join_multicast(_ex)`, detaching
/// the id's QP first as librdmacm does (not for a send-only join). -1 with EADDRNOTAVAIL
/// for a group the id has not joined, EINVAL for a NULL id or address.
///
/// # Safety
///
/// `id` is NULL or a live id of this library; `addr` is NULL or a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg("rdma_leave_multicast", || {
        // SAFETY: by the contract.
        let Some(shared) = (unsafe { id_from(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: NULL or a valid socket address by the contract.
        let Some(IpAddr::V4(group)) =
            (unsafe { sockaddr_to_std(addr) }).map(|s| s.ip().to_canonical())
        else {
            return fail(libc::EADDRNOTAVAIL);
        };
        let join = {
            let mut st = shared.state();
            let Some(at) = st.mcast.iter().position(|j| j.group == group) else {
                return fail(libc::EADDRNOTAVAIL);
            };
            st.mcast.remove(at)
        };
        // SAFETY: `id` is live; its `qp` is NULL or the program's QP.
        let qp = unsafe { (*id).qp };
        if !qp.is_null() && !join.send_only {
            let gid = ibv_gid {
                raw: mgid_of(group).0,
            };
            // SAFETY: a QP of this library and a GID on the stack. (Not attached — the
            // join's event was never taken — is no error here, as in librdmacm.)
            let _ = unsafe { crate::ffi::queues::remem_ibv_ibv_detach_mcast(qp, &gid, 0) };
        }
        0
    })
}
