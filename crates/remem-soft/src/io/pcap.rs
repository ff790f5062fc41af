//! Packet capture: every packet a device sends and receives, with synthesized Ethernet, IP
//! and UDP headers, in a classic pcap file that Wireshark and tshark decode as RoCEv2.
//!
//! Enabled with the environment variable `REMEM_PCAP=path.pcap` (or programmatically).
//! Devices of one process that name the same path share one file. IPv4 headers carry DF
//! and the identification the packet's ICRC was computed for (a sent packet's index in its
//! GSO batch, which the kernel gives it; a received one's fitted to its ICRC), so every
//! ICRC verifies against the capture; UDP checksums are left 0, as rxe sends them. The
//! driver records through `io::capture::Capture`, a decorator of its socket
//! (`Nic::with_pcap`).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable naming the capture file.
pub const PCAP_ENV: &str = "REMEM_PCAP";

/// A pcap file being written.
#[derive(Debug)]
pub struct PcapWriter {
    out: Mutex<BufWriter<File>>,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<PcapWriter>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Weak<PcapWriter>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn mac(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets()[12..].to_vec(),
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

impl PcapWriter {
    /// The writer for `path`, shared with other devices of this process that use it;
    /// created (truncating the file) by the first.
    pub fn open(path: &Path) -> std::io::Result<Arc<PcapWriter>> {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = reg.get(path).and_then(Weak::upgrade) {
            return Ok(w);
        }
        let mut out = BufWriter::new(File::create(path)?);
        // Classic pcap, microsecond timestamps, snaplen 262144, linktype 1 (Ethernet).
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&262_144u32.to_le_bytes())?;
        out.write_all(&1u32.to_le_bytes())?;
        out.flush()?;
        let w = Arc::new(PcapWriter {
            out: Mutex::new(out),
        });
        reg.insert(path.to_path_buf(), Arc::downgrade(&w));
        Ok(w)
    }

    /// Records a received UDP datagram from `src` to `dst` that was packet `gro_index` of
    /// its GRO batch, with the IPv4 identification its ICRC was computed for (fitted as the
    /// engine fits it; 0 if none fits). IPv4-mapped addresses are recorded as IPv4.
    pub fn record_received(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        udp_payload: &[u8],
        gro_index: u16,
    ) {
        let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        let (src, dst) = (canonical(src), canonical(dst));
        let ip_id = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let ip = remem_wire::icrc::IpFields::V4 {
                    src: s,
                    dst: d,
                    id: 0,
                    flags_frag: remem_wire::icrc::IPV4_DF,
                };
                let ports = remem_wire::icrc::UdpPorts {
                    src: src.port(),
                    dst: dst.port(),
                };
                remem_wire::icrc::fit_ipv4_id(&ip, ports, udp_payload, gro_index).unwrap_or(0)
            }
            _ => 0,
        };
        self.record(src, dst, udp_payload, ip_id);
    }

    /// Records one UDP datagram from `src` to `dst`, in an IPv4 packet with identification
    /// `ip_id` (the one its ICRC was computed for).
    pub fn record(&self, src: SocketAddr, dst: SocketAddr, udp_payload: &[u8], ip_id: u16) {
        let mut frame = Vec::with_capacity(14 + 40 + 8 + udp_payload.len());
        frame.extend_from_slice(&mac(dst.ip()));
        frame.extend_from_slice(&mac(src.ip()));
        let udp_len = (8 + udp_payload.len()) as u16;
        match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                frame.extend_from_slice(&[0x08, 0x00]);
                frame.extend_from_slice(&remem_wire::icrc::ipv4_header(
                    s,
                    d,
                    ip_id,
                    remem_wire::icrc::IPV4_DF,
                    64,
                    0,
                    udp_payload.len(),
                ));
            }
            (s, d) => {
                let v6 = |ip: IpAddr| match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                frame.extend_from_slice(&[0x86, 0xdd]);
                frame.extend_from_slice(&[0x60, 0, 0, 0]);
                frame.extend_from_slice(&udp_len.to_be_bytes());
                frame.extend_from_slice(&[17, 64]);
                frame.extend_from_slice(&v6(s).octets());
                frame.extend_from_slice(&v6(d).octets());
            }
        }
        frame.extend_from_slice(&src.port().to_be_bytes());
        frame.extend_from_slice(&dst.port().to_be_bytes());
        frame.extend_from_slice(&udp_len.to_be_bytes());
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(udp_payload);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let len = frame.len() as u32;
        let rec = [
            (t.as_secs() as u32).to_le_bytes(),
            t.subsec_micros().to_le_bytes(),
            len.to_le_bytes(),
            len.to_le_bytes(),
        ];
        // A capture is a debugging aid: a failed write must not disturb traffic.
        let _ = rec.iter().try_for_each(|b| out.write_all(b));
        let _ = out.write_all(&frame);
        let _ = out.flush();
    }
}
