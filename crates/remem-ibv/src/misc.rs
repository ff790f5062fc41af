//! The helpers: strings, rate conversions, fork support, sysfs, kernel-struct copies,
//! and the imports that have no meaning without a kernel: the safe part (the C entry
//! points are in [`crate::ffi::verbs`]).

#![forbid(unsafe_code)]

use crate::abi::*;
use core::ffi::{CStr, c_int};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

// ----- strings ---------------------------------------------------------------------------

/// The text of a work completion status.
pub fn wc_status_str(status: ibv_wc_status) -> &'static CStr {
    const TEXT: [&CStr; 24] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    TEXT.get(status as usize).copied().unwrap_or(c"unknown")
}

/// The text of an async event type.
pub fn event_type_str(event: ibv_event_type) -> &'static CStr {
    const TEXT: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    TEXT.get(event as usize).copied().unwrap_or(c"unknown")
}

/// The text of a node type.
pub fn node_type_str(node_type: ibv_node_type) -> &'static CStr {
    match node_type {
        IBV_NODE_CA => c"InfiniBand channel adapter",
        IBV_NODE_SWITCH => c"InfiniBand switch",
        IBV_NODE_ROUTER => c"InfiniBand router",
        IBV_NODE_RNIC => c"iWARP NIC",
        IBV_NODE_USNIC => c"usNIC",
        IBV_NODE_USNIC_UDP => c"usNIC UDP",
        IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    }
}

/// The text of a port state.
pub fn port_state_str(state: ibv_port_state) -> &'static CStr {
    const TEXT: [&CStr; 6] = [
        c"PORT_NOP",
        c"PORT_DOWN",
        c"PORT_INIT",
        c"PORT_ARMED",
        c"PORT_ACTIVE",
        c"PORT_ACTIVE_DEFER",
    ];
    TEXT.get(state as usize).copied().unwrap_or(c"unknown")
}

// ----- rates -------------------------------------------------------------------------------

/// `(rate, multiple of 2.5 Gb/s)` for the rates that are whole multiples.
const MULT: [(ibv_rate, c_int); 9] = [
    (IBV_RATE_2_5_GBPS, 1),
    (IBV_RATE_5_GBPS, 2),
    (IBV_RATE_10_GBPS, 4),
    (IBV_RATE_20_GBPS, 8),
    (IBV_RATE_30_GBPS, 12),
    (IBV_RATE_40_GBPS, 16),
    (IBV_RATE_60_GBPS, 24),
    (IBV_RATE_80_GBPS, 32),
    (IBV_RATE_120_GBPS, 48),
];

/// `(rate, Mb/s)`: the data rates of the IBTA link speeds and widths.
const MBPS: [(ibv_rate, c_int); 23] = [
    (IBV_RATE_2_5_GBPS, 2500),
    (IBV_RATE_5_GBPS, 5000),
    (IBV_RATE_10_GBPS, 10000),
    (IBV_RATE_20_GBPS, 20000),
    (IBV_RATE_30_GBPS, 30000),
    (IBV_RATE_40_GBPS, 40000),
    (IBV_RATE_60_GBPS, 60000),
    (IBV_RATE_80_GBPS, 80000),
    (IBV_RATE_120_GBPS, 120000),
    (IBV_RATE_14_GBPS, 14062),
    (IBV_RATE_56_GBPS, 56250),
    (IBV_RATE_112_GBPS, 112500),
    (IBV_RATE_168_GBPS, 168750),
    (IBV_RATE_25_GBPS, 25781),
    (IBV_RATE_100_GBPS, 103125),
    (IBV_RATE_200_GBPS, 206250),
    (IBV_RATE_300_GBPS, 309375),
    (IBV_RATE_28_GBPS, 28125),
    (IBV_RATE_50_GBPS, 53125),
    (IBV_RATE_400_GBPS, 425000),
    (IBV_RATE_600_GBPS, 637500),
    (IBV_RATE_800_GBPS, 850000),
    (IBV_RATE_1200_GBPS, 1275000),
];

/// The rate as a multiple of 2.5 Gb/s (`ibv_rate_to_mult`); -1 if it is not one.
pub fn rate_to_mult(rate: ibv_rate) -> c_int {
    MULT.iter()
        .find(|(r, _)| *r == rate)
        .map_or(-1, |(_, m)| *m)
}

/// The rate of a multiple of 2.5 Gb/s (`mult_to_ibv_rate`); `IBV_RATE_MAX` if none.
pub fn mult_to_rate(mult: c_int) -> ibv_rate {
    MULT.iter()
        .find(|(_, m)| *m == mult)
        .map_or(IBV_RATE_MAX, |(r, _)| *r)
}

/// The rate in Mb/s (`ibv_rate_to_mbps`); -1 if unknown.
pub fn rate_to_mbps(rate: ibv_rate) -> c_int {
    MBPS.iter()
        .find(|(r, _)| *r == rate)
        .map_or(-1, |(_, m)| *m)
}

/// The rate of exactly `mbps` (`mbps_to_ibv_rate`); `IBV_RATE_MAX` if none.
pub fn mbps_to_rate(mbps: c_int) -> ibv_rate {
    MBPS.iter()
        .find(|(_, m)| *m == mbps)
        .map_or(IBV_RATE_MAX, |(r, _)| *r)
}

// ----- sysfs -------------------------------------------------------------------------------

/// `ibv_read_sysfs_file` once the FFI layer has its arguments: reads `dir/file` into
/// `buf` (NUL-terminated, a trailing newline removed; `buf` is not empty); the length
/// read, or the errno of the failure.
pub fn read_sysfs_file(dir: &CStr, file: &CStr, buf: &mut [u8]) -> Result<usize, c_int> {
    let path = std::path::Path::new(OsStr::from_bytes(dir.to_bytes()))
        .join(OsStr::from_bytes(file.to_bytes()));
    match std::fs::read(&path) {
        Ok(mut data) => {
            data.truncate(buf.len() - 1);
            if data.last() == Some(&b'\n') {
                data.pop();
            }
            buf[..data.len()].copy_from_slice(&data);
            buf[data.len()] = 0;
            Ok(data.len())
        }
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

// ----- kernel struct copies (provider helpers) -----------------------------------------------

/// An `ibv_ah_attr` from the kernel's `ib_uverbs_ah_attr`.
pub fn ah_attr_from_kern(k: &ib_uverbs_ah_attr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: k.grh.dgid },
            flow_label: k.grh.flow_label,
            sgid_index: k.grh.sgid_index,
            hop_limit: k.grh.hop_limit,
            traffic_class: k.grh.traffic_class,
        },
        dlid: k.dlid,
        sl: k.sl,
        src_path_bits: k.src_path_bits,
        static_rate: k.static_rate,
        is_global: k.is_global,
        port_num: k.port_num,
    }
}

/// An `ibv_qp_attr` from the kernel's `ib_uverbs_qp_attr`.
pub fn qp_attr_from_kern(k: &ib_uverbs_qp_attr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: k.qp_state,
        cur_qp_state: k.cur_qp_state,
        path_mtu: k.path_mtu,
        path_mig_state: k.path_mig_state,
        qkey: k.qkey,
        rq_psn: k.rq_psn,
        sq_psn: k.sq_psn,
        dest_qp_num: k.dest_qp_num,
        qp_access_flags: k.qp_access_flags,
        cap: ibv_qp_cap {
            max_send_wr: k.max_send_wr,
            max_recv_wr: k.max_recv_wr,
            max_send_sge: k.max_send_sge,
            max_recv_sge: k.max_recv_sge,
            max_inline_data: k.max_inline_data,
        },
        ah_attr: ah_attr_from_kern(&k.ah_attr),
        alt_ah_attr: ah_attr_from_kern(&k.alt_ah_attr),
        pkey_index: k.pkey_index,
        alt_pkey_index: k.alt_pkey_index,
        en_sqd_async_notify: k.en_sqd_async_notify,
        sq_draining: k.sq_draining,
        max_rd_atomic: k.max_rd_atomic,
        max_dest_rd_atomic: k.max_dest_rd_atomic,
        min_rnr_timer: k.min_rnr_timer,
        port_num: k.port_num,
        timeout: k.timeout,
        retry_cnt: k.retry_cnt,
        rnr_retry: k.rnr_retry,
        alt_port_num: k.alt_port_num,
        alt_timeout: k.alt_timeout,
        rate_limit: 0,
    }
}

/// An `ibv_sa_path_rec` from the kernel's `ib_user_path_rec`.
pub fn path_rec_from_kern(k: &ib_user_path_rec) -> ibv_sa_path_rec {
    ibv_sa_path_rec {
        dgid: ibv_gid { raw: k.dgid },
        sgid: ibv_gid { raw: k.sgid },
        dlid: k.dlid,
        slid: k.slid,
        raw_traffic: k.raw_traffic as c_int,
        flow_label: k.flow_label,
        hop_limit: k.hop_limit,
        traffic_class: k.traffic_class,
        reversible: k.reversible as c_int,
        numb_path: k.numb_path,
        pkey: k.pkey,
        sl: k.sl,
        mtu_selector: k.mtu_selector,
        mtu: k.mtu as u8,
        rate_selector: k.rate_selector,
        rate: k.rate,
        packet_life_time_selector: k.packet_life_time_selector,
        packet_life_time: k.packet_life_time,
        preference: k.preference,
    }
}

/// The kernel's `ib_user_path_rec` of an `ibv_sa_path_rec`.
pub fn path_rec_to_kern(p: &ibv_sa_path_rec) -> ib_user_path_rec {
    let (dgid, sgid) = (crate::ffi::gid(&p.dgid).0, crate::ffi::gid(&p.sgid).0);
    ib_user_path_rec {
        dgid,
        sgid,
        dlid: p.dlid,
        slid: p.slid,
        raw_traffic: p.raw_traffic as u32,
        flow_label: p.flow_label,
        reversible: p.reversible as u32,
        mtu: u32::from(p.mtu),
        pkey: p.pkey,
        hop_limit: p.hop_limit,
        traffic_class: p.traffic_class,
        numb_path: p.numb_path,
        sl: p.sl,
        mtu_selector: p.mtu_selector,
        rate_selector: p.rate_selector,
        rate: p.rate,
        packet_life_time_selector: p.packet_life_time_selector,
        packet_life_time: p.packet_life_time,
        preference: p.preference,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_event_texts() {
        assert_eq!(wc_status_str(IBV_WC_SUCCESS), c"success");
        assert_eq!(
            wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE),
            c"TM software rendezvous"
        );
        assert_eq!(wc_status_str(24), c"unknown");
        assert_eq!(event_type_str(IBV_EVENT_WQ_FATAL), c"WQ fatal");
        assert_eq!(event_type_str(20), c"unknown");
        assert_eq!(node_type_str(IBV_NODE_UNKNOWN), c"unknown");
        assert_eq!(port_state_str(IBV_PORT_ACTIVE_DEFER), c"PORT_ACTIVE_DEFER");
        assert_eq!(port_state_str(6), c"unknown");
    }

    #[test]
    fn rates_round_trip() {
        for (rate, mult) in MULT {
            assert_eq!(mult_to_rate(mult), rate);
            assert_eq!(rate_to_mult(rate), mult);
        }
        for (rate, mbps) in MBPS {
            assert_eq!(mbps_to_rate(mbps), rate);
            assert_eq!(rate_to_mbps(rate), mbps);
        }
        assert_eq!(rate_to_mbps(IBV_RATE_MAX), -1);
        assert_eq!(mult_to_rate(3), IBV_RATE_MAX);
    }

    #[test]
    fn path_records_round_trip_through_the_kernel_layout() {
        let mut p: ibv_sa_path_rec = crate::ffi::zeroed();
        p.dgid = ibv_gid { raw: [7; 16] };
        p.dlid = 0x1234u16.to_be();
        p.flow_label = 0xabcdu32.to_be();
        p.reversible = 1;
        p.mtu = IBV_MTU_4096 as u8;
        p.rate = IBV_RATE_40_GBPS as u8;
        p.preference = 9;
        let k = path_rec_to_kern(&p);
        assert_eq!(k.dgid, [7; 16]);
        assert_eq!(k.mtu, IBV_MTU_4096);
        let back = path_rec_from_kern(&k);
        let gids = |r: &ibv_sa_path_rec| (crate::ffi::gid(&r.dgid), crate::ffi::gid(&r.sgid));
        assert_eq!(gids(&back), gids(&p));
        assert_eq!(
            (
                back.dlid,
                back.flow_label,
                back.reversible,
                back.mtu,
                back.rate,
                back.preference
            ),
            (
                p.dlid,
                p.flow_label,
                p.reversible,
                p.mtu,
                p.rate,
                p.preference
            )
        );
    }

    #[test]
    fn qp_attr_from_the_kernel_layout() {
        let mut k: ib_uverbs_qp_attr = crate::ffi::zeroed();
        k.qp_state = IBV_QPS_RTS;
        k.max_send_wr = 17;
        k.ah_attr.grh.dgid = [1; 16];
        k.ah_attr.is_global = 1;
        k.alt_timeout = 3;
        let a = qp_attr_from_kern(&k);
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!(a.cap.max_send_wr, 17);
        assert_eq!(crate::ffi::gid(&a.ah_attr.grh.dgid).0, [1; 16]);
        assert_eq!((a.ah_attr.is_global, a.alt_timeout), (1, 3));
    }
}
