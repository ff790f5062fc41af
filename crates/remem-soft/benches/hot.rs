//! Hot paths of the soft provider, without network IO.
//!
//! * `mr_lookup`: resolving a key through the device's key table ([`MrTable`]) with its
//!   PD, access and bounds checks: `remote` (an rkey, once per request packet at the
//!   responder) and `local` (an lkey, once per scatter/gather entry when posting), in a
//!   table of 1 and of 4096 registrations.
//! * `cq`: pushing 1024 completions into a soft CQ, and polling them in batches of 16 and
//!   64 through `CompletionQueue::poll`.
//! * `transport_step`: two inline soft devices with one RC QP each, connected in memory
//!   (their engines driven by hand; nothing crosses the sockets).
//!   `responder_write` feeds the responder's engine an RDMA WRITE ONLY datagram
//!   (`Engine::on_datagram`: parse, ICRC check, QP lookup, transport, memory write) and
//!   takes its ACK out (`Engine::poll_transmit` until it has nothing more: ACK built,
//!   ICRC filled). The datagrams are built beforehand, outside the measurement.
//!   `write_round_trip` is a whole signaled RDMA WRITE between the two engines: post,
//!   requester builds the packet, responder handles it and builds the ACK, completer
//!   handles the ACK and completes the work request, polled off the CQ.
//!   `responder_write_4_packets` and `responder_read_4_packets` are per packet of a
//!   4-packet WRITE (FIRST, MIDDLE, MIDDLE, LAST, then the ACK out) and of a 4-packet READ
//!   (request in, 4 responses out).
//!
//! `cargo bench -p remem-soft --bench hot`

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use remem_soft::mem::mr::MrTable;
use remem_soft::testing::{Side, Spec, pair as pair_of};
use remem_soft::transport::wqe::PdId;
use remem_soft::verbs::cq::SoftCq;
use remem_soft::{SoftContext, SoftOptions};
use remem_verbs::rc::{self, RcOptions, RcPeer};
use remem_verbs::{
    AccessFlags, CompletionQueue, Context, Gid, MemRegion, MemoryBuffer, Mtu, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};
use remem_wire::{Bth, Headers, Opcode, Packet, Psn, Reth};
use std::any::Any;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PD: PdId = PdId(1);
const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

// ---------------------------------------------------------------------------- MR lookup

fn mr_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("mr_lookup");
    group.throughput(Throughput::Elements(1));
    for regions in [1usize, 4096] {
        let slice = 256;
        let buf = Arc::new(MemoryBuffer::zeroed(regions * slice).unwrap());
        let table = MrTable::new(u32::MAX);
        let entries: Vec<_> = (0..regions)
            .map(|i| {
                let region = MemRegion::new(buf.clone(), i * slice..(i + 1) * slice).unwrap();
                table.insert(PD, region, ACCESS).unwrap()
            })
            .collect();
        // Visit the registrations in a scattered order so that each lookup touches
        // another slot of the table, as a busy responder's would.
        let order: Vec<_> = (0..regions).map(|i| (i * 2654435761) % regions).collect();
        let mut i = 0;
        group.bench_function(BenchmarkId::new("remote_rkey", regions), |b| {
            b.iter(|| {
                i = (i + 1) % regions;
                let e = &entries[order[i]];
                let va = e.region().addr() + 64;
                black_box(
                    table
                        .remote(PD, black_box(e.rkey), va, 128, AccessFlags::REMOTE_WRITE)
                        .unwrap(),
                )
            })
        });
        group.bench_function(BenchmarkId::new("local_lkey", regions), |b| {
            b.iter(|| {
                i = (i + 1) % regions;
                let e = &entries[order[i]];
                let sge = Sge {
                    addr: e.region().addr() + 64,
                    length: 128,
                    lkey: black_box(e.lkey),
                };
                black_box(table.local(PD, &sge, true).unwrap())
            })
        });
        group.bench_function(BenchmarkId::new("remote_unknown_rkey", regions), |b| {
            // Keys come from a permutation and both namespaces are disjoint: an lkey is
            // never a valid rkey.
            let bad = entries[0].lkey;
            b.iter(|| {
                black_box(
                    table
                        .remote(PD, black_box(bad), 0, 8, AccessFlags::REMOTE_WRITE)
                        .unwrap_err(),
                )
            })
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------- CQ

fn soft_cq(ctx: &SoftContext, cqe: u32) -> (Arc<dyn CompletionQueue>, Arc<SoftCq>) {
    let cq = ctx.create_cq(cqe, None).unwrap();
    let any: Arc<dyn Any + Send + Sync> = cq.clone();
    let soft = any.downcast::<SoftCq>().expect("a soft CQ");
    (cq, soft)
}

fn cq(c: &mut Criterion) {
    const N: usize = 1024;
    let opts = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let ctx = SoftContext::bind_with("127.0.0.1:0".parse().unwrap(), &opts)
        .expect("a soft device on 127.0.0.1");
    let (cq, soft) = soft_cq(&ctx, N as u32);
    let wc = |i: usize| WorkCompletion {
        wr_id: i as u64,
        byte_len: 4096,
        qp_num: 0x11,
        ..WorkCompletion::default()
    };
    let mut out = vec![WorkCompletion::default(); 64];
    let drain = |cq: &dyn CompletionQueue, out: &mut [WorkCompletion]| {
        let mut got = 0;
        while got < N {
            let n = cq.poll(out).unwrap();
            assert!(n > 0, "CQ drained early");
            got += n;
        }
        black_box(&out[0]);
    };
    let mut group = c.benchmark_group("cq");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function(BenchmarkId::new("push", N), |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                for i in 0..N {
                    assert!(soft.push(black_box(wc(i)), false));
                }
                t += start.elapsed();
                drain(&*cq, &mut out);
            }
            t
        })
    });
    for batch in [16usize, 64] {
        group.bench_function(BenchmarkId::new("poll", batch), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    for i in 0..N {
                        soft.push(wc(i), false);
                    }
                    let start = Instant::now();
                    drain(&*cq, &mut out[..batch]);
                    t += start.elapsed();
                }
                t
            })
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------- transport

/// What the benchmarks do with a side ([`Side`], the crate's test fixture: here an inline
/// soft device driven by hand — nothing calls `progress`, no packet crosses its socket — with
/// one RC QP, one CQ for both its queues, and one 1 MiB registered buffer).
trait Drive {
    /// RESET → INIT → RTR → RTS towards `peer`, path MTU 4096, both PSNs starting at 0.
    fn connect(&self, peer: &Side);
    /// Takes one packet out of the engine (what the driver does until `None`), reporting
    /// it as sent.
    fn transmit(&self, now: Instant, buf: &mut [u8]) -> Option<(SocketAddr, usize)>;
    /// Hands `datagram` from `from` to the engine.
    fn receive(&self, now: Instant, from: &Side, datagram: &[u8]);
}

impl Drive for Side {
    fn connect(&self, peer: &Side) {
        let o = RcOptions {
            sgid_index: rc::roce_v2_gid(&self.ctx, 1).unwrap().index as u8,
            access: AccessFlags::REMOTE,
            mtu: Mtu::Mtu4096,
            min_rnr_timer: 1,
            rnr_retry: 0,
            ..RcOptions::default()
        };
        let peer = RcPeer {
            qpn: peer.qp.qp_num(),
            psn: 0,
            gid: Gid::from(peer.local().ip()),
            mtu: Mtu::Mtu4096,
        };
        rc::connect(&*self.qp, &peer, &o).unwrap();
    }

    fn transmit(&self, now: Instant, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        let (dst, len) = self.engine().poll_transmit(now, buf, 0)?;
        self.engine().transmitted(dst, &buf[..len], 0);
        Some((dst, len))
    }

    fn receive(&self, now: Instant, from: &Side, datagram: &[u8]) {
        self.engine()
            .on_datagram(now, from.local(), self.local().ip(), datagram, 0)
            .expect("accepted");
    }
}

/// Two connected sides on 127.0.0.1 and 127.0.0.2 and one UDP port (a device sends to its
/// own port by default: the other's), found by binding the first to port 0.
fn pair() -> (Side, Side) {
    let opts = SoftOptions {
        inline: true,
        ..SoftOptions::default()
    };
    let ip = |last| IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
    let (a, b) = pair_of([ip(1), ip(2)], &opts, &Spec::default());
    a.connect(&b);
    b.connect(&a);
    (a, b)
}

/// An RDMA WRITE ONLY datagram from `from` to `to` with PSN `psn`, as `from`'s engine
/// would send it (ICRC for IPv4 identification 0).
fn write_datagram(from: &Side, to: &Side, psn: u32, payload: &[u8], offset: u64) -> Vec<u8> {
    let mut h = Headers::new(Bth::new(Opcode::RcWriteOnly, to.qp.qp_num(), Psn::new(psn)));
    h.bth.ack_req = true;
    h.reth = Some(Reth {
        va: to.buf.addr() + offset,
        rkey: to.rkey,
        dma_len: payload.len() as u32,
    });
    datagram(from, to, &h, payload)
}

/// A WRITE of `packets` full-MTU (4096-byte) packets from `from` to `to` from PSN `psn`:
/// FIRST (with the RETH), MIDDLEs, LAST (asking for the ACK).
fn multi_write_datagrams(from: &Side, to: &Side, psn: u32, packets: u32) -> Vec<Vec<u8>> {
    let payload = vec![0x5au8; 4096];
    (0..packets)
        .map(|i| {
            let op = match i {
                0 => Opcode::RcWriteFirst,
                i if i + 1 == packets => Opcode::RcWriteLast,
                _ => Opcode::RcWriteMiddle,
            };
            let psn = Psn::new((psn + i) & 0x00ff_ffff);
            let mut h = Headers::new(Bth::new(op, to.qp.qp_num(), psn));
            h.bth.ack_req = i + 1 == packets;
            if i == 0 {
                h.reth = Some(Reth {
                    va: to.buf.addr() + 65536,
                    rkey: to.rkey,
                    dma_len: packets * 4096,
                });
            }
            datagram(from, to, &h, &payload)
        })
        .collect()
}

/// An RDMA READ request of `len` bytes from `from` to `to` with PSN `psn`.
fn read_datagram(from: &Side, to: &Side, psn: u32, len: u32) -> Vec<u8> {
    let mut h = Headers::new(Bth::new(
        Opcode::RcReadRequest,
        to.qp.qp_num(),
        Psn::new(psn),
    ));
    h.bth.ack_req = true;
    h.reth = Some(Reth {
        va: to.buf.addr() + 65536,
        rkey: to.rkey,
        dma_len: len,
    });
    datagram(from, to, &h, &[])
}

/// `h` and `payload` as a datagram from `from` to `to`, ICRC filled by `from`'s engine
/// (identification 0).
fn datagram(from: &Side, to: &Side, h: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; h.packet_len(payload.len())];
    let len = h.build(payload, &mut out).unwrap();
    from.engine()
        .fill_icrc(to.local(), &mut out[..len], 0)
        .unwrap();
    out
}

/// The responder's step: the datagram in, its ACK out (and nothing more to send).
fn responder_step(a: &Side, b: &Side, now: Instant, datagram: &[u8], out: &mut [u8]) -> usize {
    b.receive(now, a, datagram);
    let (_, len) = b.transmit(now, out).expect("an ACK");
    assert!(b.transmit(now, out).is_none(), "one ACK per packet");
    len
}

fn transport_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport_step");
    group.throughput(Throughput::Elements(1));
    let now = Instant::now();
    for size in [64usize, 1024, 4096] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();

        // The responder alone.
        let (a, b) = pair();
        let mut out = vec![0u8; 8192];
        let mut psn = 0u32;
        {
            // Check once: the write lands and an ACK for its PSN comes out.
            let d = write_datagram(&a, &b, psn, &payload, 4096);
            let len = responder_step(&a, &b, now, &d, &mut out);
            let ack = Packet::parse(&out[..len]).unwrap();
            assert_eq!(ack.headers.bth.opcode, Opcode::RcAck);
            assert_eq!(ack.headers.bth.psn, Psn::new(psn));
            assert_eq!(b.buf.to_vec(4096, size).unwrap(), payload);
            assert!(b.transmit(now, &mut out).is_none());
            psn += 1;
        }
        group.bench_function(BenchmarkId::new("responder_write", size), |bench| {
            bench.iter_batched_ref(
                || {
                    let d = write_datagram(&a, &b, psn & 0x00ff_ffff, &payload, 4096);
                    psn += 1;
                    d
                },
                |d| black_box(responder_step(&a, &b, now, d, &mut out)),
                BatchSize::SmallInput,
            )
        });
        drop((a, b));

        // The whole signaled WRITE between the two engines.
        let (a, b) = pair();
        let sge = [Sge {
            addr: a.buf.addr(),
            length: size as u32,
            lkey: a.lkey,
        }];
        a.buf.write(0, &payload).unwrap();
        let op = SendOp::RdmaWrite {
            remote_addr: b.buf.addr() + 8192,
            rkey: b.rkey,
        };
        let mut wr_id = 0;
        let mut wc = [WorkCompletion::default(); 2];
        let mut round_trip = |out: &mut [u8]| {
            wr_id += 1;
            a.qp.post_send(&[SendWr::new(wr_id, op, &sge)]).unwrap();
            let (_, len) = a.transmit(now, out).expect("the WRITE");
            let (request, ack) = out.split_at_mut(len);
            let ack_len = responder_step(&a, &b, now, request, ack);
            a.receive(now, &b, &ack[..ack_len]);
            assert!(a.transmit(now, out).is_none());
            // The completion, taken off the CQ (which would otherwise overflow).
            assert_eq!(a.cq.poll(&mut wc).unwrap(), 1);
            assert_eq!((wc[0].wr_id, wc[0].status), (wr_id, WcStatus::Success));
        };
        round_trip(&mut out);
        assert_eq!(b.buf.to_vec(8192, size).unwrap(), payload);
        group.bench_function(BenchmarkId::new("write_round_trip", size), |bench| {
            bench.iter(|| round_trip(&mut out))
        });
    }
    group.finish();
    multi_packet(c, now);
}

/// Per packet of multi-packet messages at the responder: a WRITE of 4 × 4096 bytes
/// (FIRST, 2 × MIDDLE, LAST, then its ACK out) and a READ of 4 × 4096 bytes (the request
/// in, its 4 response packets out, each payload gathered from the region).
fn multi_packet(c: &mut Criterion, now: Instant) {
    const PACKETS: u32 = 4;
    let mut group = c.benchmark_group("transport_step");
    group.throughput(Throughput::Elements(u64::from(PACKETS)));
    let (a, b) = pair();
    let mut out = vec![0u8; 8192];
    let mut psn = 0u32;
    let write = |out: &mut [u8], datagrams: &[Vec<u8>]| {
        for d in datagrams {
            b.receive(now, &a, d);
        }
        let (_, len) = b.transmit(now, out).expect("an ACK");
        assert!(b.transmit(now, out).is_none(), "one ACK per message");
        len
    };
    {
        let d = multi_write_datagrams(&a, &b, psn, PACKETS);
        let len = write(&mut out, &d);
        let ack = Packet::parse(&out[..len]).unwrap();
        assert_eq!(ack.headers.bth.opcode, Opcode::RcAck);
        assert_eq!(ack.headers.bth.psn, Psn::new(psn + PACKETS - 1));
        assert_eq!(
            b.buf.to_vec(65536, 4096 * PACKETS as usize).unwrap(),
            vec![0x5a; 4096 * PACKETS as usize]
        );
        psn += PACKETS;
    }
    group.bench_function(
        BenchmarkId::new("responder_write_4_packets", 4096),
        |bench| {
            bench.iter_batched_ref(
                || {
                    let d = multi_write_datagrams(&a, &b, psn & 0x00ff_ffff, PACKETS);
                    psn += PACKETS;
                    d
                },
                |d| black_box(write(&mut out, d)),
                BatchSize::SmallInput,
            )
        },
    );
    let read = |out: &mut [u8], datagram: &[u8]| {
        b.receive(now, &a, datagram);
        let mut n = 0;
        while b.transmit(now, out).is_some() {
            n += 1;
        }
        assert_eq!(n, PACKETS, "one response packet per MTU");
        n
    };
    read(
        &mut out,
        &read_datagram(&a, &b, psn & 0x00ff_ffff, PACKETS * 4096),
    );
    psn += PACKETS;
    group.bench_function(
        BenchmarkId::new("responder_read_4_packets", 4096),
        |bench| {
            bench.iter_batched_ref(
                || {
                    let d = read_datagram(&a, &b, psn & 0x00ff_ffff, PACKETS * 4096);
                    psn += PACKETS;
                    d
                },
                |d| black_box(read(&mut out, d)),
                BatchSize::SmallInput,
            )
        },
    );
    group.finish();
}

criterion_group!(benches, mr_lookup, cq, transport_step);
criterion_main!(benches);
