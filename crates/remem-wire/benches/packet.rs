//! Building and parsing RoCEv2 packets: the per-packet work of `remem-wire` on the soft
//! provider's transmit and receive paths.
//!
//! * `wire_build`: headers and payload into a buffer (`Headers::build`), then the ICRC
//!   (`icrc::fill`), for an RDMA WRITE ONLY of 64 B, 1 KiB and 4 KiB and for an ACK;
//!   `build_no_icrc` is the same without the ICRC, to show its share.
//! * `wire_parse`: `Packet::parse` plus `icrc::verify`, what the engine does with every
//!   datagram it receives; `parse_no_icrc` is the parse alone.
//!
//! * `wire_fit_ipv4_id`: the ICRC check of an IPv4 packet whose identification the receiver
//!   does not know (`icrc::fit_ipv4_id`), right on the hint (a GSO segment's index) and
//!   solved for (kernel rxe's identifications).
//!
//! IPv4 with identification 0 and DF, as the soft provider sends.
//!
//! `cargo bench -p remem-wire --bench packet`

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use remem_wire::icrc::{self, IPV4_DF, IpFields, UdpPorts};
use remem_wire::{Aeth, Bth, Headers, Opcode, Packet, Psn, ROCEV2_PORT, Reth, Syndrome};
use std::hint::black_box;
use std::net::Ipv4Addr;

const SIZES: [usize; 3] = [64, 1024, 4096];

fn ip() -> IpFields {
    IpFields::V4 {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
        id: 0,
        flags_frag: IPV4_DF,
    }
}

const PORTS: UdpPorts = UdpPorts {
    src: 49152,
    dst: ROCEV2_PORT,
};

/// RDMA WRITE ONLY of `len` bytes, asking for an ACK.
fn write_only(len: usize) -> Headers {
    let mut h = Headers::new(Bth::new(Opcode::RcWriteOnly, 0x12, Psn::new(100)));
    h.bth.ack_req = true;
    h.reth = Some(Reth {
        va: 0x7f00_0000_1000,
        rkey: 0xabcd_0123,
        dma_len: len as u32,
    });
    h
}

/// An ACK (unlimited credits).
fn ack() -> Headers {
    let mut h = Headers::new(Bth::new(Opcode::RcAck, 0x12, Psn::new(100)));
    h.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 7,
    });
    h
}

/// The cases: name, headers, payload.
fn cases() -> Vec<(String, Headers, Vec<u8>)> {
    let mut v: Vec<_> = SIZES
        .iter()
        .map(|&n| {
            let payload: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            (format!("write_only_{n}"), write_only(n), payload)
        })
        .collect();
    v.push(("ack".to_string(), ack(), Vec::new()));
    v
}

/// A whole packet with its ICRC.
fn packet(h: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; h.packet_len(payload.len())];
    let len = h.build(payload, &mut buf).expect("valid headers");
    icrc::fill(&ip(), PORTS, &mut buf[..len]).expect("long enough");
    buf
}

fn build(c: &mut Criterion) {
    let ip = ip();
    let mut group = c.benchmark_group("wire_build");
    for (name, h, payload) in cases() {
        let len = h.packet_len(payload.len());
        group.throughput(Throughput::Bytes(len as u64));
        let mut buf = vec![0u8; 8192];
        group.bench_with_input(BenchmarkId::new("build_icrc", &name), &h, |b, h| {
            b.iter(|| {
                let n = black_box(h).build(black_box(&payload), &mut buf).unwrap();
                icrc::fill(&ip, PORTS, &mut buf[..n]).unwrap();
                black_box(&buf[..n]);
            })
        });
        group.bench_with_input(BenchmarkId::new("build_no_icrc", &name), &h, |b, h| {
            b.iter(|| {
                let n = black_box(h).build(black_box(&payload), &mut buf).unwrap();
                black_box(&buf[..n]);
            })
        });
    }
    group.finish();
}

fn parse(c: &mut Criterion) {
    let ip = ip();
    let mut group = c.benchmark_group("wire_parse");
    for (name, h, payload) in cases() {
        let bytes = packet(&h, &payload);
        assert!(icrc::verify(&ip, PORTS, &bytes));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("parse_verify", &name), &bytes, |b, p| {
            b.iter(|| {
                let p = black_box(p.as_slice());
                let pkt = Packet::parse(p).unwrap();
                assert!(icrc::verify(&ip, PORTS, p));
                black_box(pkt);
            })
        });
        group.bench_with_input(BenchmarkId::new("parse_no_icrc", &name), &bytes, |b, p| {
            b.iter(|| black_box(Packet::parse(black_box(p.as_slice())).unwrap()))
        });
    }
    group.finish();
}

/// The receiver's ICRC check of an IPv4 packet whose identification it does not know:
/// `fit_ipv4_id` with the identification a remem sender's GSO segment carries (its index, the
/// hint) and with one kernel rxe picked (solved for).
fn fit_id(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire_fit_ipv4_id");
    for (name, h, payload) in cases() {
        let mut bytes = packet(&h, &payload);
        let sent = IpFields::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            id: 0x2345,
            flags_frag: IPV4_DF,
        };
        icrc::fill(&sent, PORTS, &mut bytes).unwrap();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        for (what, hint) in [("hinted", 0x2345), ("solved", 7)] {
            group.bench_with_input(BenchmarkId::new(what, &name), &bytes, |b, p| {
                b.iter(|| {
                    let id = icrc::fit_ipv4_id(&ip(), PORTS, black_box(p.as_slice()), hint);
                    assert_eq!(id, Some(0x2345));
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, build, parse, fit_id);
criterion_main!(benches);
