//! Property tests of the CM MADs: no input makes parsing panic, whatever parses emits
//! again to a MAD that parses to the same thing, and every generated message survives
//! emit → parse unchanged (private data zero padded to its field).

use proptest::collection::vec;
use proptest::prelude::*;
use remem_wire::mad::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn bits(n: u32) -> impl Strategy<Value = u8> {
    0..=((1u16 << n) - 1) as u8
}

fn u24() -> impl Strategy<Value = u32> {
    0..=QPN_MASK
}

fn msg_ref() -> impl Strategy<Value = MsgRef> {
    bits(2).prop_map(MsgRef::from_value)
}

fn pd(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=max)
}

fn path() -> impl Strategy<Value = CmPath> {
    (
        any::<(u16, u16, [u8; 16], [u8; 16])>(),
        (0..=0xf_ffffu32, bits(6), any::<u8>(), any::<u8>()),
        (bits(4), any::<bool>(), bits(5)),
    )
        .prop_map(
            |(
                (local_lid, remote_lid, local_gid, remote_gid),
                (flow_label, packet_rate, traffic_class, hop_limit),
                (sl, subnet_local, local_ack_timeout),
            )| CmPath {
                local_lid,
                remote_lid,
                local_gid,
                remote_gid,
                flow_label,
                packet_rate,
                traffic_class,
                hop_limit,
                sl,
                subnet_local,
                local_ack_timeout,
            },
        )
}

fn req() -> impl Strategy<Value = CmReq> {
    (
        (
            any::<u32>(),
            u24(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        ),
        (u24(), any::<u8>(), u24(), any::<u8>(), u24()),
        (bits(5), bits(2), any::<bool>(), u24(), bits(5), bits(3)),
        (any::<u16>(), bits(4), any::<bool>(), bits(3), bits(4)),
        (any::<bool>(), bits(3), path(), path(), any::<bool>()),
        pd(CmReq::PRIVATE_DATA_LEN),
    )
        .prop_map(|(a, b, c, d, e, private_data)| CmReq {
            local_comm_id: a.0,
            vendor_id: a.1,
            service_id: a.2,
            local_ca_guid: a.3,
            local_qkey: a.4,
            local_qpn: b.0,
            responder_resources: b.1,
            local_eecn: b.2,
            initiator_depth: b.3,
            remote_eecn: b.4,
            remote_cm_response_timeout: c.0,
            transport_service_type: c.1,
            end_to_end_flow_control: c.2,
            starting_psn: c.3,
            local_cm_response_timeout: c.4,
            retry_count: c.5,
            partition_key: d.0,
            path_mtu: d.1,
            rdc_exists: d.2,
            rnr_retry_count: d.3,
            max_cm_retries: d.4,
            srq: e.0,
            extended_transport_type: e.1,
            primary_path: e.2,
            alternate_path: e.3,
            sap_supported: e.4,
            private_data,
        })
}

fn rep() -> impl Strategy<Value = CmRep> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            u24(),
            u24(),
            u24(),
        ),
        (
            u24(),
            any::<u8>(),
            any::<u8>(),
            bits(5),
            bits(2),
            any::<bool>(),
        ),
        (bits(3), any::<bool>(), any::<u64>()),
        pd(CmRep::PRIVATE_DATA_LEN),
    )
        .prop_map(|(a, b, c, private_data)| CmRep {
            local_comm_id: a.0,
            remote_comm_id: a.1,
            local_qkey: a.2,
            local_qpn: a.3,
            vendor_id: a.4,
            local_eecn: a.5,
            starting_psn: b.0,
            responder_resources: b.1,
            initiator_depth: b.2,
            target_ack_delay: b.3,
            failover_accepted: b.4,
            end_to_end_flow_control: b.5,
            rnr_retry_count: c.0,
            srq: c.1,
            local_ca_guid: c.2,
            private_data,
        })
}

fn message() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        req().prop_map(CmMessage::Req),
        (
            any::<(u32, u32)>(),
            msg_ref(),
            bits(5),
            pd(CmMra::PRIVATE_DATA_LEN)
        )
            .prop_map(|((l, r), m, t, p)| CmMessage::Mra(CmMra {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: m,
                service_timeout: t,
                private_data: p,
            })),
        (
            any::<(u32, u32, u16)>(),
            msg_ref(),
            vec(any::<u8>(), 0..=ARI_LEN),
            pd(CmRej::PRIVATE_DATA_LEN)
        )
            .prop_map(|((l, r, reason), m, ari, p)| CmMessage::Rej(CmRej {
                local_comm_id: l,
                remote_comm_id: r,
                message_rejected: m,
                reason,
                ari,
                private_data: p,
            })),
        rep().prop_map(CmMessage::Rep),
        (any::<(u32, u32)>(), pd(CmRtu::PRIVATE_DATA_LEN)).prop_map(|((l, r), p)| {
            CmMessage::Rtu(CmRtu {
                local_comm_id: l,
                remote_comm_id: r,
                private_data: p,
            })
        }),
        (any::<(u32, u32)>(), u24(), pd(CmDreq::PRIVATE_DATA_LEN)).prop_map(|((l, r), q, p)| {
            CmMessage::Dreq(CmDreq {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn_eecn: q,
                private_data: p,
            })
        }),
        (any::<(u32, u32)>(), pd(CmDrep::PRIVATE_DATA_LEN)).prop_map(|((l, r), p)| {
            CmMessage::Drep(CmDrep {
                local_comm_id: l,
                remote_comm_id: r,
                private_data: p,
            })
        }),
        (any::<(u32, u16, u64)>(), pd(CmSidrReq::PRIVATE_DATA_LEN)).prop_map(
            |((request_id, partition_key, service_id), p)| CmMessage::SidrReq(CmSidrReq {
                request_id,
                partition_key,
                service_id,
                private_data: p,
            })
        ),
        (
            any::<(u32, u8, u64, u32)>(),
            (u24(), u24()),
            vec(any::<u8>(), 0..=ARI_LEN),
            pd(CmSidrRep::PRIVATE_DATA_LEN)
        )
            .prop_map(
                |((request_id, status, service_id, qkey), (vendor_id, qpn), ari, p)| {
                    CmMessage::SidrRep(CmSidrRep {
                        request_id,
                        status,
                        vendor_id,
                        qpn,
                        service_id,
                        qkey,
                        ari,
                        private_data: p,
                    })
                }
            ),
    ]
}

fn header(attribute_id: u16) -> impl Strategy<Value = MadHeader> {
    (any::<(u8, u8, u16, u16, u64, u32)>()).prop_map(
        move |(
            class_version,
            method,
            status,
            class_specific,
            transaction_id,
            attribute_modifier,
        )| {
            MadHeader {
                base_version: MAD_BASE_VERSION,
                mgmt_class: MGMT_CLASS_CM,
                class_version,
                method,
                status,
                class_specific,
                transaction_id,
                attribute_id,
                attribute_modifier,
            }
        },
    )
}

fn mad() -> impl Strategy<Value = CmMad> {
    message().prop_flat_map(|m| {
        header(m.attribute_id()).prop_map(move |header| CmMad {
            header,
            message: m.clone(),
        })
    })
}

/// The message as parsing returns it: private data padded to the whole field.
fn padded(mut m: CmMessage) -> CmMessage {
    let full = m.private_data_len();
    let pd = match &mut m {
        CmMessage::Req(x) => &mut x.private_data,
        CmMessage::Mra(x) => &mut x.private_data,
        CmMessage::Rej(x) => &mut x.private_data,
        CmMessage::Rep(x) => &mut x.private_data,
        CmMessage::Rtu(x) => &mut x.private_data,
        CmMessage::Dreq(x) => &mut x.private_data,
        CmMessage::Drep(x) => &mut x.private_data,
        CmMessage::SidrReq(x) => &mut x.private_data,
        CmMessage::SidrRep(x) => &mut x.private_data,
    };
    pd.resize(full, 0);
    m
}

/// Bytes that look like a CM MAD (base version 1, class CM, a CM attribute) with an
/// arbitrary body, so the message parsers see every pattern, not only header rejections.
fn cm_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    (vec(any::<u8>(), MAD_LEN..=MAD_LEN + 8), 0x000fu16..=0x001b).prop_map(|(mut b, attr)| {
        b[0] = MAD_BASE_VERSION;
        b[1] = MGMT_CLASS_CM;
        b[16..18].copy_from_slice(&attr.to_be_bytes());
        b
    })
}

fn ip_pair() -> impl Strategy<Value = (IpAddr, IpAddr)> {
    prop_oneof![
        any::<(u32, u32)>()
            .prop_map(|(a, b)| (IpAddr::V4(Ipv4Addr::from(a)), IpAddr::V4(Ipv4Addr::from(b)))),
        any::<(u128, u128)>()
            .prop_map(|(a, b)| (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b)))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parse_never_panics(bytes in vec(any::<u8>(), 0..300)) {
        let _ = MadHeader::parse(&bytes);
        let _ = CmaIpHeader::parse(&bytes);
        if let Ok(m) = CmMad::parse(&bytes) {
            let again = m.emit().expect("a parsed MAD emits");
            prop_assert_eq!(CmMad::parse(&again), Ok(m));
        }
    }

    #[test]
    fn cm_like_bytes_parse_or_fail_typed(bytes in cm_like_bytes()) {
        match CmMad::parse(&bytes) {
            Ok(m) => {
                let again = m.emit().expect("a parsed MAD emits");
                prop_assert_eq!(CmMad::parse(&again), Ok(m.clone()));
                // Emitting drops only reserved bits: every bit it sets was in the input.
                for (i, (&e, &b)) in again.iter().zip(&bytes).enumerate() {
                    prop_assert_eq!(e & !b, 0, "byte {} of {}", i, m.message.name());
                }
            }
            Err(e) => prop_assert!(matches!(
                e,
                MadError::UnknownAttribute(_) | MadError::AriTooLong(_)
            ), "{e:?}"),
        }
    }

    #[test]
    fn truncated_mads_are_errors(m in mad(), cut in 0..MAD_LEN) {
        let b = m.emit().unwrap();
        prop_assert_eq!(
            CmMad::parse(&b[..cut]),
            Err(MadError::Truncated { needed: MAD_LEN, got: cut })
        );
    }

    #[test]
    fn emit_parse_round_trip(m in mad()) {
        let b = m.emit().unwrap();
        let back = CmMad::parse(&b).unwrap();
        prop_assert_eq!(back.header, m.header);
        prop_assert_eq!(&back.message, &padded(m.message.clone()));
        // And the padded form emits to the same bytes.
        prop_assert_eq!(back.emit().unwrap(), b);
        let mut into = [0xffu8; MAD_LEN + 3];
        m.emit_into(&mut into).unwrap();
        prop_assert_eq!(&into[..MAD_LEN], &b[..]);
    }

    #[test]
    fn cma_header_round_trip(
        (src, dst) in ip_pair(),
        src_port in any::<u16>(),
        data in pd(CmReq::PRIVATE_DATA_LEN - CmaIpHeader::LEN),
    ) {
        let h = CmaIpHeader { cma_version: CmaIpHeader::VERSION, src_port, src, dst };
        let pd = h.with_private_data(&data, CmReq::PRIVATE_DATA_LEN).unwrap();
        prop_assert_eq!(pd.len(), CmaIpHeader::LEN + data.len());
        prop_assert_eq!(CmaIpHeader::parse(&pd), Ok(h));
        prop_assert_eq!(&pd[CmaIpHeader::LEN..], &data[..]);
    }

    #[test]
    fn timeouts_are_monotonic(e in 0u8..31) {
        prop_assert!(timeout_duration(e) < timeout_duration(e + 1));
        prop_assert_eq!(timeout_exponent(timeout_duration(e)), e);
        prop_assert_eq!(gid_to_ip(&ip_to_gid(IpAddr::V4(Ipv4Addr::from(u32::from(e))))),
            IpAddr::V4(Ipv4Addr::from(u32::from(e))));
    }
}
