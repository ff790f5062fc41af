//! The fields of the program's `rdma_cm_id` the library writes in place (addresses,
//! device, path record, the QP's state), through `Handle<RdmaId>`'s methods.

#![forbid(unsafe_code)]

use super::*;

/// Gives the id its device: `verbs`, the default `pd` (unless the program gave one),
/// `port_num`.
pub(super) fn attach_dev(
    id: &IdShared,
    st: &mut IdState,
    dev: &Arc<CmDev>,
    port: u8,
) -> Result<(), c_int> {
    let pd = dev.default_pd()?;
    let h = id.handle();
    h.set_verbs(dev.verbs());
    if h.pd().is_null() {
        h.set_pd(pd);
    }
    h.set_port_num(port);
    st.dev = Some(Arc::clone(dev));
    Ok(())
}

/// Copies the provider id's addresses into `route.addr`.
pub(super) fn update_addrs(id: &IdShared, cm: &Arc<dyn CmId>) {
    let h = id.handle();
    if let Some(a) = cm.local_addr() {
        h.set_src(a);
    }
    if let Some(a) = cm.peer_addr() {
        h.set_dst(a);
    }
}

/// Sets `route.path_rec` to the one path to the resolved peer (RoCE has no subnet
/// administrator: the record says what the devices use).
pub(super) fn set_path(id: &IdShared, st: &mut IdState) {
    let h = id.handle();
    let (sgid, dgid) = h.gids();
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
    h.set_path_rec(ptr);
}

/// Re-reads the state of the id's QP into its `ibv_qp.state` (the CM moved it).
pub(super) fn refresh_qp_state(id: &IdShared) {
    if let Some(q) = id.handle().qp() {
        q.set_state(q.inner().qp.state());
    }
}
