//! The fields of the program's `rdma_cm_id` the library writes in place (addresses,
//! device, path record, the QP's state).

#![allow(unsafe_code)]

use super::*;

/// The GID of an IP address on RoCE (IPv4-mapped for IPv4).
pub(super) fn gid_of(ip: IpAddr) -> ibv_gid {
    ibv_gid {
        raw: Gid::from(ip.to_canonical()).0,
    }
}

/// Sets the id's source address (and `ibaddr.sgid`).
///
/// # Safety
///
/// `id` is a live id of this library.
pub(super) unsafe fn set_src(id: *mut rdma_cm_id, a: SocketAddr) {
    let (ss, _) = std_to_storage(a);
    // SAFETY: by the contract; fields written in place.
    unsafe {
        (&raw mut (*id).route.addr.u_src_addr.src_storage).write(ss);
        (&raw mut (*id).route.addr.addr.ibaddr.sgid).write(gid_of(a.ip()));
        (&raw mut (*id).route.addr.addr.ibaddr.pkey).write(0xffff_u16.to_be());
    }
}

/// Sets the id's destination address (and `ibaddr.dgid`).
///
/// # Safety
///
/// `id` is a live id of this library.
pub(super) unsafe fn set_dst(id: *mut rdma_cm_id, a: SocketAddr) {
    let (ss, _) = std_to_storage(a);
    // SAFETY: by the contract; fields written in place.
    unsafe {
        (&raw mut (*id).route.addr.u_dst_addr.dst_storage).write(ss);
        (&raw mut (*id).route.addr.addr.ibaddr.dgid).write(gid_of(a.ip()));
    }
}

/// Gives the id its device: `verbs`, the default `pd` (unless the program gave one),
/// `port_num`.
pub(super) fn attach_dev(
    id: &IdShared,
    st: &mut IdState,
    dev: &Arc<CmDev>,
    port: u8,
) -> Result<(), c_int> {
    let pd = dev.default_pd()?;
    let p = id.abi_ptr();
    set!(p, verbs, dev.verbs());
    // SAFETY: a live id; reading one pointer field the library also writes.
    if unsafe { (*p).pd }.is_null() {
        set!(p, pd, pd);
    }
    set!(p, port_num, port);
    st.dev = Some(Arc::clone(dev));
    Ok(())
}

/// Copies the provider id's addresses into `route.addr`.
pub(super) fn update_addrs(id: &IdShared, cm: &Arc<dyn CmId>) {
    let p = id.abi_ptr();
    if let Some(a) = cm.local_addr() {
        // SAFETY: a live id.
        unsafe { set_src(p, a) };
    }
    if let Some(a) = cm.peer_addr() {
        // SAFETY: a live id.
        unsafe { set_dst(p, a) };
    }
}

/// Sets `route.path_rec` to the one path to the resolved peer (RoCE has no subnet
/// administrator: the record says what the devices use).
pub(super) fn set_path(id: &IdShared, st: &mut IdState) {
    let p = id.abi_ptr();
    // SAFETY: a live id; reading the GIDs the library wrote.
    let (sgid, dgid) = unsafe {
        (
            (*p).route.addr.addr.ibaddr.sgid,
            (*p).route.addr.addr.ibaddr.dgid,
        )
    };
    let mtu = st
        .dev
        .as_ref()
        .and_then(|d| d.dev.query_port(1).ok())
        .map_or(IBV_MTU_1024, |a| a.active_mtu as ibv_mtu);
    let rec = Box::new(ibv_sa_path_rec {
        dgid,
        sgid,
        dlid: 0,
        slid: 0,
        raw_traffic: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
        reversible: 1,
        numb_path: 1,
        pkey: 0xffff_u16.to_be(),
        sl: 0,
        mtu_selector: 2,
        mtu: mtu as u8,
        rate_selector: 2,
        rate: IBV_RATE_10_GBPS as u8,
        packet_life_time_selector: 2,
        packet_life_time: 18,
        preference: 0,
    });
    let ptr = (&raw const *rec).cast_mut();
    st.path = Some(rec);
    set!(p, route, {
        // SAFETY: a live id; copying the route to change two fields.
        let mut r = unsafe { (*p).route };
        r.path_rec = ptr;
        r.num_paths = 1;
        r
    });
}

/// Re-reads the state of the id's QP into its `ibv_qp.state` (the CM moved it).
pub(super) fn refresh_qp_state(id: &IdShared) {
    let p = id.abi_ptr();
    // SAFETY: a live id; reading the QP pointer the library wrote.
    let qp = unsafe { (*p).qp };
    // SAFETY: a QP the library attached, live while the id holds it.
    if let Some(h) = unsafe { crate::ffi::handles::Handle::<crate::qp::Qp>::from_abi(qp) } {
        h.set_state(h.inner().qp.state());
    }
}
