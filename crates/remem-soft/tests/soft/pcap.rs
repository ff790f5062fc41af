//! `REMEM_PCAP`: every packet two devices exchange is captured; every captured packet
//! parses and its ICRC verifies against the synthesized IP/UDP headers; and tshark (when
//! installed — `.ci/run` installs it and sets `REMEM_REQUIRE_TSHARK=1`) decodes all of them
//! as InfiniBand with no malformed packet.

use remem_conformance::{CASES, Pair};
use remem_soft::{SoftContext, SoftOptions};
use remem_wire::Packet;
use remem_wire::icrc::{self, IpFields, UdpPorts};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;

fn frames(bytes: &[u8]) -> Vec<&[u8]> {
    assert_eq!(&bytes[..4], &0xa1b2_c3d4u32.to_le_bytes());
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(&bytes[at + 16..at + 16 + len]);
        at += 16 + len;
    }
    assert_eq!(at, bytes.len(), "trailing bytes");
    out
}

/// Parses an Ethernet/IPv4/UDP frame carrying RoCEv2 and checks its ICRC against the IP and
/// UDP headers in the frame. Returns the IP identification.
fn verify_frame(i: usize, f: &[u8]) -> u16 {
    assert_eq!(&f[12..14], &[0x08, 0x00], "frame {i}: IPv4");
    let ip = &f[14..34];
    let udp = &f[34..];
    let id = u16::from_be_bytes([ip[4], ip[5]]);
    let fields = IpFields::V4 {
        src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        id,
        flags_frag: u16::from_be_bytes([ip[6], ip[7]]),
    };
    let ports = UdpPorts {
        src: u16::from_be_bytes([udp[0], udp[1]]),
        dst: u16::from_be_bytes([udp[2], udp[3]]),
    };
    let payload = &udp[8..];
    Packet::parse(payload).unwrap_or_else(|e| panic!("frame {i}: {e}"));
    assert!(icrc::verify(&fields, ports, payload), "frame {i}: ICRC");
    id
}

/// The kernel's own IP headers: `.ci/run` captures (tcpdump, in a network namespace whose
/// loopback has UDP segmentation offload off, so the kernel cuts every GSO batch into
/// packets itself) the traffic of the two-process example and names the capture in
/// `REMEM_KERNEL_PCAP`. Every packet's ICRC must verify against the IP header the kernel
/// wrote — identification included — as a Linux rxe receiver checks it.
#[test]
fn kernel_segmented_capture_verifies() {
    let Some(path) = std::env::var_os("REMEM_KERNEL_PCAP") else {
        println!("skipping: REMEM_KERNEL_PCAP is not set (.ci/run sets it)");
        eprintln!("skipping: REMEM_KERNEL_PCAP is not set (.ci/run sets it)");
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let frames = frames(&bytes);
    let ids: Vec<u16> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| verify_frame(i, f))
        .collect();
    let segmented = ids.iter().filter(|&&id| id > 0).count();
    assert!(
        segmented > 0,
        "no packet with identification > 0 in {} frames: nothing was cut from a GSO batch",
        frames.len()
    );
    eprintln!(
        "{} kernel-written packets verified, {segmented} of them cut from GSO batches",
        frames.len()
    );
}

#[test]
fn capture_decodes_as_rocev2() {
    let path = std::env::temp_dir().join(format!("remem-pcap-test-{}.pcap", std::process::id()));
    let port;
    {
        let opts = SoftOptions {
            pcap: Some(path.clone()),
            ..SoftOptions::default()
        };
        let a = SoftContext::bind_with("127.0.6.1:0".parse().unwrap(), &opts).unwrap();
        port = a.local_addr().port();
        let b =
            SoftContext::bind_with(format!("127.0.6.2:{port}").parse().unwrap(), &opts).unwrap();
        let pair = Pair::new(Arc::new(a), Arc::new(b));
        for name in [
            "send_recv_multi_packet_multi_sge",
            "rdma_write_and_write_with_imm",
            "rdma_read_multi_packet",
            "atomics_return_original_values",
            "remote_access_errors",
        ] {
            let case = CASES.iter().find(|c| c.name == name).unwrap();
            (case.run)(&pair).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    let bytes = std::fs::read(&path).unwrap();
    let frames = frames(&bytes);
    assert!(frames.len() > 50, "only {} packets captured", frames.len());
    for (i, f) in frames.iter().enumerate() {
        verify_frame(i, f);
    }
    let tshark = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&path)
        .args(["-d", &format!("udp.port=={port},infiniband")])
        // Payload heuristics off (as the MANIFEST of the kernel captures explains: with them
        // on, small SENDs are taken for RPC-over-RDMA and decoded as malformed).
        .args([
            "--disable-protocol",
            "smc,smb_direct,rpcordma,nvme-rdma,lnet,iser,eoib,infiniband_sdp,fcoib",
        ])
        .args([
            "-T",
            "fields",
            "-e",
            "frame.protocols",
            "-e",
            "_ws.malformed",
        ])
        .output();
    match tshark {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), frames.len(), "tshark saw every frame");
            for (i, l) in lines.iter().enumerate() {
                assert!(
                    l.contains("infiniband"),
                    "frame {i} not decoded as InfiniBand: {l}"
                );
                assert!(
                    !l.to_lowercase().contains("malformed"),
                    "frame {i} malformed: {l}"
                );
            }
            eprintln!(
                "tshark decoded {} frames as RoCEv2, none malformed",
                lines.len()
            );
        }
        other => {
            if let Ok(out) = &other {
                eprintln!("tshark: {}", String::from_utf8_lossy(&out.stderr));
            }
            assert!(
                std::env::var_os("REMEM_REQUIRE_TSHARK").is_none(),
                "REMEM_REQUIRE_TSHARK is set but tshark failed: {other:?}"
            );
            println!("skipping the tshark check: tshark is not installed");
            eprintln!("skipping the tshark check: tshark is not installed");
        }
    }
    let _ = std::fs::remove_file(&path);
}
