//! Fault injection as a decorator of the [`Socket`]: [`Faulty`] decides the fate of every
//! packet the batches it is handed carry ([`FaultInjector`]) and sends on what survives.
//!
//! A call whose packets all go passes to the inner socket as it is. Otherwise its batches
//! are rebuilt: a lost packet is left out of its GSO batch and the others still leave
//! together, their payloads where they lie in registered memory (own bytes copied, payload
//! references kept), each packet after a lost one with its ICRC computed again for its new
//! index in the batch (the IPv4 identification the kernel gives it) — byte for byte as had
//! it been built into that batch. Only the rare corrupted, duplicated, reordered or delayed
//! packets are copied whole (their ICRC for identification 0) and sent alone, after the
//! batch before them. Receiving passes through.

#![forbid(unsafe_code)]

use crate::engine::EngineStats;
use crate::io::faults::{Fate, FaultConfig, FaultInjector};
use crate::io::socket::{Outgoing, Part, Socket, gather, packets};
use crate::io::sys::{Batch, MAX_BATCHES, MAX_IOV, Piece};
use crate::mem::grant::HeldRanges;
use quinn_udp::RecvMeta;
use remem_wire::icrc::{self, IcrcHasher, IpFields, UdpPorts};
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A packet of the call being sent: its batch, index in it, length and parts (a range of
/// the decorator's `parts`).
#[derive(Debug, Clone)]
struct Planned {
    batch: usize,
    index: u16,
    len: usize,
    parts: Range<usize>,
}

/// The batches being rebuilt: own bytes, pieces (own ranges, and references to the
/// original call's payload ranges), the batches closed so far and the open one.
#[derive(Debug, Default)]
struct Rebuilt {
    own: Vec<u8>,
    pieces: Vec<Piece>,
    batches: Vec<Batch>,
    zero_copy: usize,
    /// The open batch: the original batch its packets come from, where its pieces start,
    /// its packets.
    open: Option<(usize, usize, usize)>,
}

/// A [`Socket`] that injects faults into what it sends (see the module documentation).
#[derive(Debug)]
pub struct Faulty<S> {
    inner: S,
    injector: FaultInjector,
    local: SocketAddr,
    plan: Vec<Planned>,
    fates: Vec<Fate>,
    parts: Vec<Part>,
    walk: Vec<Part>,
    out: Rebuilt,
    scratch: Vec<u8>,
}

impl<S: Socket> Faulty<S> {
    /// `inner` with `cfg`'s faults.
    pub fn new(inner: S, cfg: FaultConfig) -> Self {
        let local = inner.local_addr();
        Faulty {
            inner,
            injector: FaultInjector::new(cfg),
            local,
            plan: Vec::new(),
            fates: Vec::new(),
            parts: Vec::new(),
            walk: Vec::new(),
            out: Rebuilt::default(),
            scratch: vec![0; remem_verbs::mem::READ_CHUNK],
        }
    }

    /// The ICRC header fields of a packet to `dst` with IPv4 identification `id`.
    fn icrc_fields(&self, dst: SocketAddr, id: u16) -> (IpFields, UdpPorts) {
        let ip = crate::engine::ip_fields(self.local.ip(), dst.ip(), id);
        let ports = UdpPorts {
            src: self.local.port(),
            dst: dst.port(),
        };
        (ip, ports)
    }

    /// Publishes the injector's counts.
    fn count(&self, stats: &EngineStats) {
        let c = self.injector.counts;
        stats.fault_dropped.store(c.dropped, Ordering::Relaxed);
        stats.fault_corrupted.store(c.corrupted, Ordering::Relaxed);
        stats
            .fault_duplicated
            .store(c.duplicated, Ordering::Relaxed);
        stats.fault_reordered.store(c.reordered, Ordering::Relaxed);
    }

    /// Closes the open rebuilt batch, if any.
    fn close(&mut self, original: &[Batch]) {
        let o = &mut self.out;
        if let Some((from, start, count)) = o.open.take() {
            let b = &original[from];
            o.batches.push(Batch {
                dst: b.dst,
                segment: b.segment.filter(|_| count > 1),
                pieces: start..o.pieces.len(),
            });
        }
    }

    /// Sends the rebuilt batches (references into `mem`) and empties them.
    fn flush(&mut self, original: &[Batch], mem: &HeldRanges, stats: &EngineStats) {
        self.close(original);
        let o = &mut self.out;
        if !o.batches.is_empty() {
            self.inner.send(
                &Outgoing {
                    own: &o.own,
                    pieces: &o.pieces,
                    mem,
                    batches: &o.batches,
                    zero_copy: o.zero_copy,
                },
                stats,
            );
        }
        o.own.clear();
        o.pieces.clear();
        o.batches.clear();
        o.zero_copy = 0;
    }

    /// Sends each of `ready` alone, whole.
    fn send_alone(&mut self, ready: Vec<(SocketAddr, Vec<u8>)>, stats: &EngineStats) -> usize {
        let mem = HeldRanges::default();
        for (dst, bytes) in &ready {
            let pieces = [Piece::Own {
                start: 0,
                len: bytes.len(),
            }];
            let batches = [Batch {
                dst: *dst,
                segment: None,
                pieces: 0..1,
            }];
            self.inner.send(
                &Outgoing {
                    own: bytes,
                    pieces: &pieces,
                    mem: &mem,
                    batches: &batches,
                    zero_copy: 0,
                },
                stats,
            );
        }
        ready.len()
    }

    /// Adds packet `p` (of `out`) to the rebuilt batches, as packet of the open batch
    /// (opened for it if it comes from another original batch): its own bytes copied, its
    /// references kept, its ICRC computed again if its index changed.
    fn keep(&mut self, out: &Outgoing<'_>, p: &Planned, stats: &EngineStats) {
        let n = p.parts.len();
        let continues = matches!(self.out.open, Some((from, _, _)) if from == p.batch);
        if !continues || self.out.pieces.len() + n > MAX_IOV {
            self.close(out.batches);
            if self.out.batches.len() == MAX_BATCHES || self.out.pieces.len() + n > MAX_IOV {
                self.flush(out.batches, out.mem, stats);
            }
            self.out.open = Some((p.batch, self.out.pieces.len(), 0));
        }
        let Some((_, start, count)) = self.out.open else {
            return;
        };
        let (parts, o) = (&self.parts[p.parts.clone()], &mut self.out);
        let mut referenced = false;
        for part in parts {
            match part {
                Part::Own(r) => {
                    let at = o.own.len();
                    o.own.extend_from_slice(&out.own[r.clone()]);
                    match o.pieces[start..].last_mut() {
                        Some(Piece::Own { start, len }) if *start + *len == at => *len += r.len(),
                        _ => o.pieces.push(Piece::Own {
                            start: at,
                            len: r.len(),
                        }),
                    }
                }
                Part::Mem(i) => {
                    referenced = true;
                    o.pieces.push(Piece::Ref(*i));
                }
            }
        }
        o.zero_copy += usize::from(referenced);
        o.open = Some((p.batch, start, count + 1));
        let index = count as u16;
        let ends_own = matches!(
            parts.last(),
            Some(Part::Own(r)) if r.len() >= remem_wire::ICRC_LEN
        );
        if index != p.index && ends_own {
            let (ip, ports) = self.icrc_fields(out.batches[p.batch].dst, index);
            let parts = &self.parts[p.parts.clone()];
            if let Some(crc) = icrc_over(out, parts, &ip, ports, p.len, &mut self.scratch) {
                let end = self.out.own.len();
                self.out.own[end - remem_wire::ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
            }
        }
    }
}

/// The ICRC of a packet of `len` bytes made of `parts` of `out`, for `ip` and `ports`.
fn icrc_over(
    out: &Outgoing<'_>,
    parts: &[Part],
    ip: &IpFields,
    ports: UdpPorts,
    len: usize,
    scratch: &mut [u8],
) -> Option<u32> {
    let covered = len.checked_sub(remem_wire::ICRC_LEN)?;
    let mut hasher: Option<IcrcHasher> = None;
    let mut at = 0usize;
    for part in parts {
        match part {
            Part::Own(r) => {
                let take = r.len().min(covered.saturating_sub(at));
                let bytes = &out.own[r.start..r.start + take];
                match &mut hasher {
                    Some(h) => h.update(bytes),
                    None => hasher = Some(IcrcHasher::new(ip, ports, len, bytes).ok()?),
                }
                at += r.len();
            }
            Part::Mem(i) => {
                let h = hasher.as_mut()?;
                out.mem.read_chunks(*i, scratch, |c| h.update(c)).ok()?;
                at += out.mem.range_len(*i)?;
            }
        }
    }
    Some(hasher?.finalize())
}

impl<S: Socket> Socket for Faulty<S> {
    fn send(&mut self, out: &Outgoing<'_>, stats: &EngineStats) {
        // Every packet's fate, from its headers, in order.
        self.plan.clear();
        self.fates.clear();
        self.parts.clear();
        let (plan, fates, all, injector) = (
            &mut self.plan,
            &mut self.fates,
            &mut self.parts,
            &mut self.injector,
        );
        packets(out, &mut self.walk, |p| {
            let head = match p.parts.first() {
                Some(Part::Own(r)) => &out.own[r.clone()],
                _ => &[][..],
            };
            fates.push(injector.fate(head, p.len));
            let start = all.len();
            all.extend_from_slice(p.parts);
            plan.push(Planned {
                batch: p.batch,
                index: p.index,
                len: p.len,
                parts: start..all.len(),
            });
        });
        if self.fates.iter().all(|f| *f == Fate::Go) {
            self.inner.send(out, stats);
            self.count(stats);
            return;
        }
        let now = Instant::now();
        let plan = std::mem::take(&mut self.plan);
        let fates = std::mem::take(&mut self.fates);
        for (p, fate) in plan.iter().zip(&fates) {
            match *fate {
                Fate::Go => self.keep(out, p, stats),
                Fate::Lost => {}
                Fate::Faulted(x) => {
                    // Alone and whole, after the batches before it.
                    self.flush(out.batches, out.mem, stats);
                    let dst = out.batches[p.batch].dst;
                    let mut bytes = Vec::with_capacity(p.len);
                    gather(
                        out,
                        &self.parts[p.parts.clone()],
                        &mut self.scratch,
                        &mut bytes,
                    );
                    let (ip, ports) = self.icrc_fields(dst, 0);
                    let _ = icrc::fill(&ip, ports, &mut bytes);
                    let mut ready = Vec::new();
                    self.injector.apply(now, dst, x, bytes, &mut ready);
                    self.send_alone(ready, stats);
                }
            }
        }
        self.flush(out.batches, out.mem, stats);
        (self.plan, self.fates) = (plan, fates);
        self.count(stats);
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        self.inner.recv(bufs, meta)
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd()
    }

    fn extra_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.extra_fd()
    }

    fn max_gso_segments(&self) -> usize {
        self.inner.max_gso_segments()
    }

    fn gro_segments(&self) -> usize {
        self.inner.gro_segments()
    }

    fn next_due(&self) -> Option<Instant> {
        let inner = self.inner.next_due();
        match (self.injector.next_due(), inner) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn send_due(&mut self, now: Instant, stats: &EngineStats) -> usize {
        let mut ready = Vec::new();
        self.injector.due(now, &mut ready);
        let n = self.send_alone(ready, stats) + self.inner.send_due(now, stats);
        self.count(stats);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::socket::tests::{Wire, batch, fields};

    /// Sends one batch of `n` packets through a `Faulty` over a [`Wire`] with `cfg`.
    fn send(cfg: FaultConfig, n: usize) -> (Vec<Vec<u8>>, Faulty<Wire>, EngineStats) {
        let (pkts, own, pieces, mem, b) = batch(n);
        let mut f = Faulty::new(Wire::new(), cfg);
        let stats = EngineStats::default();
        let batches = [b];
        f.send(
            &Outgoing {
                own: &own,
                pieces: &pieces,
                mem: &mem,
                batches: &batches,
                zero_copy: n,
            },
            &stats,
        );
        (pkts, f, stats)
    }

    #[test]
    fn a_call_whose_packets_all_go_passes_unchanged() {
        let (pkts, f, _) = send(FaultConfig::parse("loss=0.000000001").unwrap(), 8);
        assert_eq!(f.inner.calls, [[pkts]]);
        assert_eq!(f.inner.refs, 0, "the driver's own pieces, not rebuilt ones");
        assert_eq!(f.inner.zero_copy, 8);
    }

    #[test]
    fn lost_packets_leave_the_batch_and_the_rest_keep_their_references() {
        const N: usize = 16;
        // A seed that loses a packet with survivors after it (found, not assumed).
        let (cfg, go) = (0..)
            .map(|seed| {
                let cfg = FaultConfig {
                    loss: 0.3,
                    seed,
                    ..FaultConfig::default()
                };
                let mut f = FaultInjector::new(cfg);
                let (pkts, ..) = batch(N);
                let go: Vec<bool> = pkts
                    .iter()
                    .map(|p| f.fate(p, p.len()) == Fate::Go)
                    .collect();
                (cfg, go)
            })
            .find(|(_, go)| go.iter().skip_while(|g| **g).any(|g| *g))
            .unwrap();
        let (pkts, f, stats) = send(cfg, N);
        let survivors: Vec<&Vec<u8>> = pkts
            .iter()
            .zip(&go)
            .filter(|(_, g)| **g)
            .map(|(p, _)| p)
            .collect();
        assert_eq!(f.inner.calls.len(), 1, "one call");
        assert_eq!(f.inner.calls[0].len(), 1, "one GSO batch");
        let sent = &f.inner.calls[0][0];
        assert_eq!(sent.len(), survivors.len());
        for (j, (got, want)) in sent.iter().zip(&survivors).enumerate() {
            // The same packet, its ICRC for its new index in the batch.
            assert_eq!(got[..got.len() - 4], want[..want.len() - 4], "packet {j}");
            let (ip, ports) = fields(j as u16);
            assert!(
                icrc::verify(&ip, ports, got),
                "packet {j}: ICRC for index {j}"
            );
        }
        assert_eq!(f.inner.refs, survivors.len(), "payloads still referenced");
        assert_eq!(f.inner.zero_copy, survivors.len());
        let lost = (N - survivors.len()) as u64;
        assert_eq!(stats.fault_dropped.load(Ordering::Relaxed), lost);
    }

    #[test]
    fn a_duplicated_packet_goes_alone_and_whole_after_the_batch_before_it() {
        let cfg = FaultConfig {
            duplicate: 1.0,
            ..FaultConfig::default()
        };
        let (pkts, f, stats) = send(cfg, 3);
        // Every packet faulted: six calls of one datagram, each ICRC for identification 0.
        let sent: Vec<&Vec<u8>> = f.inner.calls.iter().flatten().flatten().collect();
        assert_eq!(f.inner.calls.len(), 6);
        assert!(
            f.inner
                .calls
                .iter()
                .all(|c| c.len() == 1 && c[0].len() == 1)
        );
        for (i, got) in sent.iter().enumerate() {
            let want = &pkts[i / 2];
            assert_eq!(got[..got.len() - 4], want[..want.len() - 4]);
            let (ip, ports) = fields(0);
            assert!(icrc::verify(&ip, ports, got), "copy {i}");
        }
        assert_eq!(f.inner.zero_copy, 0, "copied");
        assert_eq!(stats.fault_duplicated.load(Ordering::Relaxed), 3);
    }
}
