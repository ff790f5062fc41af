//! Property tests: build → parse round trips for every opcode, and no input makes parsing
//! or ICRC checking panic.

use proptest::prelude::*;
use remem_wire::icrc::{self, IpFields, UdpPorts};
use remem_wire::{Aeth, AtomicEth, Bth, Deth, Feth, Headers, Opcode, Packet, Psn, Reth, Syndrome};

fn any_headers() -> impl Strategy<Value = (Headers, Vec<u8>)> {
    (
        0..Opcode::ALL.len(),
        any::<[u64; 4]>(),
        any::<[u32; 6]>(),
        any::<(bool, bool, bool, bool, u16)>(),
        proptest::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(i, w, d, (se, m, a, ecn, pkey), payload)| {
            let op = Opcode::ALL[i];
            let l = op.layout();
            let mut bth = Bth::new(op, d[0], Psn::new(d[1]));
            bth.se = se;
            bth.mig_req = m;
            bth.ack_req = a;
            bth.fecn = ecn;
            bth.pkey = pkey;
            let mut h = Headers::new(bth);
            if l.deth {
                h.deth = Some(Deth {
                    qkey: d[2],
                    src_qp: d[3] & 0xff_ffff,
                });
            }
            if l.feth {
                h.feth = Some(Feth {
                    placement: (d[4] & 0xf) as u8,
                    selectivity: ((d[4] >> 4) & 3) as u8,
                });
            }
            if l.reth {
                h.reth = Some(Reth {
                    va: w[0],
                    rkey: d[2],
                    dma_len: d[5],
                });
            }
            if l.atomic {
                h.atomic = Some(AtomicEth {
                    va: w[0],
                    rkey: d[2],
                    swap_add: w[1],
                    compare: w[2],
                });
            }
            if l.aeth {
                h.aeth = Some(Aeth {
                    syndrome: Syndrome::from_byte(d[4] as u8),
                    msn: d[5] & 0xff_ffff,
                });
            }
            if l.atomic_ack {
                h.atomic_ack = Some(w[3]);
            }
            if l.imm {
                h.imm = Some(d[3]);
            }
            if l.ieth {
                h.ieth = Some(d[4]);
            }
            let payload = match l.fixed_payload {
                Some(n) => payload
                    .into_iter()
                    .chain(std::iter::repeat(7))
                    .take(n)
                    .collect(),
                None if l.payload => payload,
                None => Vec::new(),
            };
            (h, payload)
        })
}

fn ip() -> IpFields {
    IpFields::V4 {
        src: "10.1.2.3".parse().unwrap(),
        dst: "10.4.5.6".parse().unwrap(),
        id: 0,
        flags_frag: icrc::IPV4_DF,
    }
}

const PORTS: UdpPorts = UdpPorts {
    src: 0xc001,
    dst: 4791,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn build_parse_round_trip((h, payload) in any_headers()) {
        let mut buf = vec![0u8; 700];
        let len = h.build(&payload, &mut buf).unwrap();
        prop_assert_eq!(len % 4, 0);
        icrc::fill(&ip(), PORTS, &mut buf[..len]).unwrap();
        let p = Packet::parse(&buf[..len]).unwrap();
        let mut want = h;
        want.bth.pad = ((4 - payload.len() % 4) % 4) as u8;
        prop_assert_eq!(p.headers, want);
        prop_assert_eq!(p.payload, &payload[..]);
        prop_assert!(icrc::verify(&ip(), PORTS, &buf[..len]));
        // parse -> rebuild is byte-exact
        let mut again = vec![0u8; 700];
        let n = p.headers.build(p.payload, &mut again).unwrap();
        icrc::fill(&ip(), PORTS, &mut again[..n]).unwrap();
        prop_assert_eq!(&again[..n], &buf[..len]);
    }

    #[test]
    fn icrc_over_slices_is_the_icrc_of_the_assembled_packet(
        (h, payload) in any_headers(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
        id in any::<u16>(),
        v6 in any::<bool>(),
    ) {
        let mut buf = vec![0u8; 700];
        let len = h.build(&payload, &mut buf).unwrap();
        let ip = if v6 {
            IpFields::V6 { src: "fe80::1".parse().unwrap(), dst: "fe80::2".parse().unwrap() }
        } else {
            IpFields::V4 {
                src: "10.1.2.3".parse().unwrap(),
                dst: "10.4.5.6".parse().unwrap(),
                id,
                flags_frag: icrc::IPV4_DF,
            }
        };
        icrc::fill(&ip, PORTS, &mut buf[..len]).unwrap();
        let want = icrc::compute(&ip, PORTS, &buf[..len]).unwrap();
        // The covered bytes cut at arbitrary points (empty pieces included).
        let covered = &buf[..len - 4];
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (covered.len() + 1)).collect();
        at.push(0);
        at.push(covered.len());
        at.sort_unstable();
        let pieces: Vec<&[u8]> = at.windows(2).map(|w| &covered[w[0]..w[1]]).collect();
        prop_assert_eq!(icrc::compute_slices(&ip, PORTS, &pieces), Ok(want));
        // And through the hasher: any head of at least the BTH, then the rest in pieces.
        let head = 12 + cuts.first().copied().unwrap_or(0) % (covered.len() - 11);
        let mut hasher = icrc::IcrcHasher::new(&ip, PORTS, len, &covered[..head]).unwrap();
        let mut rest = &covered[head..];
        for c in &cuts {
            let k = c % (rest.len() + 1);
            hasher.update(&rest[..k]);
            rest = &rest[k..];
        }
        hasher.update(rest);
        prop_assert_eq!(hasher.finalize(), want);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(p) = Packet::parse(&bytes) {
            // whatever parses rebuilds to the same length
            let mut buf = vec![0u8; 400];
            let n = p.headers.build(p.payload, &mut buf).unwrap();
            prop_assert_eq!(n, bytes.len());
        }
        let _ = icrc::verify(&ip(), PORTS, &bytes);
        let _ = icrc::compute(&ip(), PORTS, &bytes);
        let (a, b) = bytes.split_at(bytes.len() / 2);
        prop_assert_eq!(
            icrc::compute_slices(&ip(), PORTS, &[a, b.get(..b.len().saturating_sub(4)).unwrap_or_default()]).ok(),
            icrc::compute(&ip(), PORTS, &bytes).ok()
        );
    }

    #[test]
    fn mutated_packets_never_panic((h, payload) in any_headers(), at in any::<usize>(), val in any::<u8>(), cut in any::<usize>()) {
        let mut buf = vec![0u8; 700];
        let len = h.build(&payload, &mut buf).unwrap();
        let mut pkt = buf[..len].to_vec();
        let i = at % pkt.len();
        pkt[i] = val;
        let _ = Packet::parse(&pkt);
        let _ = Packet::parse(&pkt[..cut % (pkt.len() + 1)]);
    }
}

#[test]
fn wrong_headers_and_small_buffers_are_errors() {
    let h = Headers::new(Bth::new(Opcode::RcWriteFirst, 1, Psn::new(0)));
    let mut buf = [0u8; 64];
    assert!(h.build(b"x", &mut buf).is_err(), "WRITE FIRST without RETH");
    let h = Headers::new(Bth::new(Opcode::RcAck, 1, Psn::new(0)));
    assert!(h.build(&[], &mut buf).is_err(), "ACK without AETH");
    let mut h = Headers::new(Bth::new(Opcode::RcSendOnly, 1, Psn::new(0)));
    assert!(h.build(&[0; 100], &mut buf).is_err(), "buffer too small");
    h.reth = Some(Reth::default());
    assert!(h.build(&[], &mut buf).is_err(), "SEND ONLY with a RETH");
    let mut h = Headers::new(Bth::new(Opcode::RcReadRequest, 1, Psn::new(0)));
    h.reth = Some(Reth::default());
    assert!(
        h.build(&[1], &mut buf).is_err(),
        "READ REQUEST with payload"
    );
}

#[test]
fn malformed_inputs_give_typed_errors() {
    use remem_wire::ParseError;
    assert!(matches!(
        Packet::parse(&[]),
        Err(ParseError::Truncated { .. })
    ));
    let mut p = [0u8; 16];
    p[0] = 0x15; // RESYNC: not supported
    assert_eq!(Packet::parse(&p), Err(ParseError::UnknownOpcode(0x15)));
    p[0] = 0x04;
    p[1] = 0x01; // TVer 1
    assert_eq!(Packet::parse(&p), Err(ParseError::BadVersion(1)));
    p[1] = 0x30; // pad 3 with no payload
    assert!(matches!(
        Packet::parse(&p),
        Err(ParseError::PadTooLong { .. })
    ));
    p[0] = 0x06; // WRITE FIRST needs a RETH: 12 + 16 + 4
    p[1] = 0;
    assert!(matches!(
        Packet::parse(&p),
        Err(ParseError::Truncated { needed: 32, .. })
    ));
    let mut p = [0u8; 24];
    p[0] = 0x11; // ACK (12 + 4 + 4 bytes) with 4 bytes of payload
    assert!(matches!(
        Packet::parse(&p),
        Err(ParseError::BadPayload { .. })
    ));
    assert!(matches!(
        Packet::parse(&[0u8; 17]),
        Err(ParseError::Unaligned(17))
    ));
}
