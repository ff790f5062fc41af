//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`, and the helpers that answer a UD
//! datagram, `ibv_init_ah_from_wc` / `ibv_create_ah_from_wc`.
//!
//! On RoCE every address vector is global: an `ibv_ah_attr` without `is_global` is EINVAL
//! (as rxe refuses it). The GRH area in front of a UD receive holds, for an IPv4 sender,
//! twenty unused bytes and the IPv4 header, for IPv6 the IPv6 header; the reply's
//! destination is the datagram's source address, its source GID index the local GID that
//! equals the datagram's destination.

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{CtxShared, PdInner, PdUse};
use crate::ffi::handles::into_abi_at;
use crate::ffi::null_with;
use core::ffi::c_int;
use remem_verbs::{AddressHandle, AhAttr, Gid, GidType};
use std::sync::Arc;

/// An address handle: what `ibv_create_ah` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Ah {
    /// The `ibv_ah` programs see.
    pub abi: ibv_ah,
    /// The library's side.
    pub inner: AhInner,
}

/// The library's side of an address handle.
pub struct AhInner {
    /// remem's address handle.
    pub ah: Arc<dyn AddressHandle>,
    _pd: PdUse,
}

impl std::fmt::Debug for AhInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AhInner")
            .field("attr", self.ah.attr())
            .finish_non_exhaustive()
    }
}

/// `struct ibv_ah_attr` to remem's address vector; EINVAL without a GRH (RoCE needs one).
pub(crate) fn ah_attr_from(a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    if a.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(AhAttr {
        dgid: crate::ffi::gid(&a.grh.dgid),
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        is_global: true,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        port_num: a.port_num,
        // `struct ibv_ah_attr` has no port: the device's default (4791, or the soft
        // device's peer port), as on every verbs device.
        udp_port: 0,
    })
}

/// remem's address vector to `struct ibv_ah_attr`.
pub(crate) fn ah_attr_to(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// `ibv_create_ah` once the FFI layer has its arguments: the pointer the program holds,
/// or NULL with errno.
pub(crate) fn create(pd: &Arc<PdInner>, a: &ibv_ah_attr) -> *mut ibv_ah {
    let mut av = match ah_attr_from(a) {
        Ok(av) => av,
        Err(e) => return null_with(e),
    };
    // The program's GID index names remem's entry through the context's map.
    match pd.ctx.soft_gid_index(av.sgid_index) {
        Some(i) => av.sgid_index = i,
        None => return null_with(libc::EINVAL),
    }
    let ah = match pd.pd.create_ah(&av) {
        Ok(ah) => ah,
        Err(e) => return null_with(e.errno()),
    };
    into_abi_at(
        Ah {
            abi: ibv_ah {
                context: pd.ctx.ibv_context(),
                pd: pd.ibv_pd(),
                handle: 0,
            },
            inner: AhInner { ah, _pd: pd.hold() },
        },
        |ah, at| ah.abi.handle = (at as u32) >> 4,
    )
}

/// The IP version of a UD receive's GRH area: 6 (an IPv6 header at the start), 4 (an
/// IPv4 header in its last 20 bytes), or `None`.
fn grh_version(grh: &[u8; 40]) -> Option<u8> {
    if grh[0] >> 4 == 6 {
        Some(6)
    } else if grh[20] >> 4 == 4 && grh[20] & 0xf == 5 {
        Some(4)
    } else {
        None
    }
}

/// The reply's address vector from a receive's GRH area (without the source GID index):
/// `(remote gid, local gid, traffic class, flow label)`.
fn grh_addresses(grh: &[u8; 40]) -> Option<(Gid, Gid, u8, u32)> {
    let mapped = |b: &[u8]| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(b);
        Gid(g)
    };
    match grh_version(grh)? {
        4 => {
            let ip = &grh[20..];
            Some((mapped(&ip[12..16]), mapped(&ip[16..20]), ip[1], 0))
        }
        _ => {
            let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&grh[8..24]);
            d.copy_from_slice(&grh[24..40]);
            Some((Gid(s), Gid(d), (vtf >> 20) as u8, vtf & 0xf_ffff))
        }
    }
}

/// The address vector that answers the datagram `w` received (`grh`: the 40 bytes of
/// its GRH area, when `w` has `IBV_WC_GRH`), and whether it is complete (the errno when
/// not: no GRH area or none that parses, EINVAL; no local GID equal to its destination,
/// ENOENT). `ibv_init_ah_from_wc` writes the vector either way.
pub(crate) fn init_attr(
    ctx: &CtxShared,
    port_num: u8,
    w: &ibv_wc,
    grh: Option<&[u8; 40]>,
) -> (ibv_ah_attr, Result<(), c_int>) {
    let mut a = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: [0; 16] },
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 0,
            traffic_class: 0,
        },
        dlid: w.slid,
        sl: w.sl,
        src_path_bits: w.dlid_path_bits,
        static_rate: 0,
        is_global: 0,
        port_num,
    };
    let mut ret = Ok(());
    if w.wc_flags & IBV_WC_GRH != 0 {
        a.is_global = 1;
        match grh.and_then(grh_addresses) {
            None => ret = Err(libc::EINVAL),
            Some((remote, local, tclass, flow)) => {
                a.grh.dgid = ibv_gid { raw: remote.0 };
                a.grh.traffic_class = tclass;
                a.grh.flow_label = flow;
                a.grh.hop_limit = 0xff;
                let index = ctx.gid_table(port_num).ok().and_then(|t| {
                    t.iter()
                        .position(|g| g.gid == local && g.gid_type == GidType::RoceV2)
                        .map(|i| t[i].index)
                });
                match index.and_then(|i| u8::try_from(i).ok()) {
                    Some(i) => a.grh.sgid_index = i,
                    None => ret = Err(libc::ENOENT),
                }
            }
        }
    }
    (a, ret)
}

/// `ibv_create_ah_from_wc` once the FFI layer has its arguments: [`init_attr`] then
/// [`create`]; NULL with errno.
pub(crate) fn create_from_wc(
    pd: Option<&Arc<PdInner>>,
    w: Option<&ibv_wc>,
    grh: Option<&[u8; 40]>,
    port_num: u8,
) -> *mut ibv_ah {
    let (Some(pd), Some(w)) = (pd, w) else {
        return null_with(libc::EINVAL);
    };
    match init_attr(&pd.ctx, port_num, w, grh) {
        (a, Ok(())) => create(pd, &a),
        (_, Err(e)) => null_with(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_grh_gives_the_reply_addresses() {
        let mut g = [0u8; 40];
        g[20] = 0x45;
        g[21] = 0x08; // TOS
        g[32..36].copy_from_slice(&[127, 1, 2, 3]); // source
        g[36..40].copy_from_slice(&[127, 4, 5, 6]); // destination
        let (remote, local, tclass, flow) = grh_addresses(&g).unwrap();
        assert_eq!(&remote.0[10..], &[0xff, 0xff, 127, 1, 2, 3]);
        assert_eq!(&local.0[10..], &[0xff, 0xff, 127, 4, 5, 6]);
        assert_eq!((tclass, flow), (8, 0));
    }

    #[test]
    fn ipv6_grh_gives_the_reply_addresses() {
        let mut g = [0u8; 40];
        g[0..4].copy_from_slice(&0x6123_4567u32.to_be_bytes());
        g[8..24].copy_from_slice(&[0xfe; 16]);
        g[24..40].copy_from_slice(&[0x20; 16]);
        let (remote, local, tclass, flow) = grh_addresses(&g).unwrap();
        assert_eq!(remote.0, [0xfe; 16]);
        assert_eq!(local.0, [0x20; 16]);
        assert_eq!((tclass, flow), (0x12, 0x3_4567));
        assert_eq!(grh_addresses(&[0u8; 40]), None, "neither header");
    }

    #[test]
    fn ah_attr_round_trip_and_grh_required() {
        let av = AhAttr {
            dgid: Gid([7; 16]),
            flow_label: 0x12345,
            sgid_index: 2,
            hop_limit: 9,
            traffic_class: 3,
            is_global: true,
            dlid: 1,
            sl: 4,
            src_path_bits: 5,
            static_rate: 6,
            port_num: 1,
            udp_port: 0,
        };
        let c = ah_attr_to(&av);
        assert_eq!(ah_attr_from(&c).unwrap(), av);
        let mut local = c;
        local.is_global = 0;
        assert_eq!(ah_attr_from(&local), Err(libc::EINVAL));
    }
}
