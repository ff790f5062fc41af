//! Packet capture as a decorator of the [`Socket`]: [`Capture`] records every packet of
//! the batches it is handed — gathered from its pieces, with the IPv4 identification the
//! kernel gives it (its index in its GSO batch) — and every packet of the datagrams it
//! receives, in a [`PcapWriter`], then passes the call on. Around a fault injector it
//! records what the driver built, a packet the injector then loses included.

#![forbid(unsafe_code)]

use crate::engine::EngineStats;
use crate::io::pcap::PcapWriter;
use crate::io::socket::{Outgoing, Part, Socket, gather, packets};
use quinn_udp::RecvMeta;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

/// A [`Socket`] that records what passes through it (see the module documentation).
#[derive(Debug)]
pub struct Capture<S> {
    inner: S,
    pcap: Arc<PcapWriter>,
    local: SocketAddr,
    parts: Vec<Part>,
    gathered: Vec<u8>,
    scratch: Vec<u8>,
}

impl<S: Socket> Capture<S> {
    /// `inner`, recording into `pcap`.
    pub fn new(inner: S, pcap: Arc<PcapWriter>) -> Self {
        let local = inner.local_addr();
        Capture {
            inner,
            pcap,
            local,
            parts: Vec::new(),
            gathered: Vec::new(),
            scratch: vec![0; remem_verbs::mem::READ_CHUNK],
        }
    }
}

impl<S: Socket> Socket for Capture<S> {
    fn send(&mut self, out: &Outgoing<'_>, stats: &EngineStats) {
        let (pcap, local, gathered, scratch) = (
            &self.pcap,
            self.local,
            &mut self.gathered,
            &mut self.scratch,
        );
        packets(out, &mut self.parts, |p| {
            gather(out, p.parts, scratch, gathered);
            pcap.record(local, out.batches[p.batch].dst, gathered, p.index);
        });
        self.inner.send(out, stats);
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        let n = self.inner.recv(bufs, meta)?;
        let local = self.local;
        for (meta, buf) in meta[..n].iter().zip(bufs.iter()) {
            let to = SocketAddr::new(meta.dst_ip.unwrap_or(local.ip()), local.port());
            // (A zero-length datagram is a wake-up: no packets.)
            for (i, pkt) in buf[..meta.len].chunks(meta.stride.max(1)).enumerate() {
                self.pcap.record_received(meta.addr, to, pkt, i as u16);
            }
        }
        Ok(n)
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
        self.inner.next_due()
    }

    fn send_due(&mut self, now: Instant, stats: &EngineStats) -> usize {
        self.inner.send_due(now, stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::socket::tests::{PEER, Wire, batch};

    #[test]
    fn every_packet_of_a_batch_is_recorded_with_its_index_and_the_call_passes_on() {
        let path = std::env::temp_dir().join(format!("remem-capture-{}.pcap", std::process::id()));
        let (pkts, own, pieces, mem, b) = batch(4);
        let mut c = Capture::new(Wire::new(), PcapWriter::open(&path).unwrap());
        let batches = [b];
        c.send(
            &Outgoing {
                own: &own,
                pieces: &pieces,
                mem: &mem,
                batches: &batches,
                zero_copy: 4,
            },
            &EngineStats::default(),
        );
        assert_eq!(c.inner.calls, [[pkts.clone()]]);
        assert_eq!(c.inner.refs, 0, "passed on as it is");
        drop(c);
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        // Records after the 24-byte file header: 16 bytes of record header, then Ethernet
        // (14), IPv4 (20), UDP (8) and the packet.
        let mut at = 24;
        let mut n = 0;
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
            let frame = &bytes[at + 16..at + 16 + len];
            let id = u16::from_be_bytes([frame[18], frame[19]]);
            assert_eq!(usize::from(id), n, "the packet's index in its batch");
            assert_eq!(
                &frame[30..34],
                &PEER
                    .parse::<SocketAddr>()
                    .map(|a| match a.ip() {
                        std::net::IpAddr::V4(v4) => v4.octets(),
                        _ => unreachable!(),
                    })
                    .unwrap()
            );
            assert_eq!(frame[42..], pkts[n][..]);
            at += 16 + len;
            n += 1;
        }
        assert_eq!(n, 4);
    }
}
