//! Golden vectors: packets captured from Linux kernel Soft-RoCE (`../shared/vectors/rxe/`,
//! beside the repository). Every packet must parse, verify its ICRC against its real IPv4
//! and UDP headers, match Wireshark's decode field by field, and rebuild byte for byte.
//!
//! Without `../shared` the test is reported as ignored, with the reason, in `cargo test`'s
//! summary; with `REMEM_REQUIRE_VECTORS=1` (set by `.ci/run` when `../shared` exists) a
//! missing directory is a failure.

use remem_wire::icrc::{self, IpFields, UdpPorts};
use remem_wire::{Packet, Syndrome};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The kernel captures: `$REMEM_VECTORS_DIR`, else `../shared/vectors/rxe` beside the
/// repository; `None` when absent.
pub(crate) fn vectors_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("REMEM_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors/rxe")
        });
    dir.is_dir().then_some(dir)
}

/// Frames of a classic pcap file (either byte order, µs or ns timestamps).
pub(crate) fn pcap_frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    let magic = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("not a pcap file (magic {m:#x})"),
    };
    let u32_at = |at: usize| {
        let b: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    assert_eq!(u32_at(20), 1, "linktype must be Ethernet");
    let mut frames = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let caplen = u32_at(at + 8) as usize;
        let origlen = u32_at(at + 12) as usize;
        assert_eq!(caplen, origlen, "truncated capture");
        frames.push(bytes[at + 16..at + 16 + caplen].to_vec());
        at += 16 + caplen;
    }
    frames
}

/// One captured frame: the IPv4 and UDP fields its ICRC covers, and the RoCEv2 packet.
pub(crate) struct Frame {
    ip: IpFields,
    ports: UdpPorts,
    pub(crate) roce: Vec<u8>,
}

/// Splits an Ethernet/IPv4/UDP frame into its [`Frame`] fields.
pub(crate) fn dissect(frame: &[u8]) -> Frame {
    assert_eq!(&frame[12..14], &[0x08, 0x00], "IPv4 ethertype");
    let ip = &frame[14..];
    assert_eq!(ip[0], 0x45, "IPv4 without options");
    assert_eq!(ip[9], 17, "UDP");
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let udp = &ip[20..total];
    let udp_len = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    assert_eq!(udp_len, udp.len());
    Frame {
        ip: IpFields::V4 {
            src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            id: u16::from_be_bytes([ip[4], ip[5]]),
            flags_frag: u16::from_be_bytes([ip[6], ip[7]]),
        },
        ports: UdpPorts {
            src: u16::from_be_bytes([udp[0], udp[1]]),
            dst: u16::from_be_bytes([udp[2], udp[3]]),
        },
        roce: udp[8..].to_vec(),
    }
}

/// One row of Wireshark's decode: column name -> value ("" when absent).
fn tsv_rows(text: &str) -> Vec<HashMap<String, String>> {
    let mut lines = text.lines();
    let names: Vec<String> = lines
        .next()
        .expect("header row")
        .split('\t')
        .map(str::to_string)
        .collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            names
                .iter()
                .cloned()
                .zip(
                    l.split('\t')
                        .map(str::to_string)
                        .chain(std::iter::repeat(String::new())),
                )
                .collect()
        })
        .collect()
}

/// How Wireshark declares a field (its `FT_*` type), which decides how `tshark -T fields`
/// prints it. Facts from Wireshark's InfiniBand dissector (`tshark -G fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldType {
    /// `FT_UINT8` … `FT_UINT64`: decimal, or `0x`-hex for `BASE_HEX` fields.
    Uint,
    /// `FT_BOOLEAN`: `0`/`1` (older tshark) or `False`/`True` (newer).
    Bool,
    /// `FT_BYTES`: hex digits without `0x`, bytes optionally separated by `:`; read here as a
    /// big-endian number (the headers carry them in network order).
    Bytes,
}

/// The type of every column the test compares; a column missing here fails the test, so a
/// new comparison must state how Wireshark prints it.
fn field_type(col: &str) -> FieldType {
    match col {
        "frame.number"
        | "infiniband.bth.opcode"
        | "infiniband.bth.padcnt"
        | "infiniband.bth.tver"
        | "infiniband.bth.p_key"
        | "infiniband.bth.destqp"
        | "infiniband.bth.psn"
        | "infiniband.deth.q_key"
        | "infiniband.deth.srcqp"
        | "infiniband.reth.va"
        | "infiniband.reth.r_key"
        | "infiniband.reth.dmalen"
        | "infiniband.aeth.syndrome"
        | "infiniband.aeth.msn"
        | "infiniband.atomiceth.swapdt"
        | "infiniband.atomiceth.cmpdt"
        | "infiniband.atomicacketh.origremdt"
        | "infiniband.invariant.crc" => FieldType::Uint,
        "infiniband.bth.se" | "infiniband.bth.m" | "infiniband.bth.a" => FieldType::Bool,
        "infiniband.immdt" | "infiniband.ieth" => FieldType::Bytes,
        other => panic!("no Wireshark field type recorded for column {other}"),
    }
}

/// A decoded field as a number, read by its Wireshark type; `None` when absent. Wireshark
/// repeats some fields as "v,v" (the field and its subtree): the first is taken.
fn num(row: &HashMap<String, String>, col: &str) -> Option<u64> {
    let v = row.get(col)?.split(',').next()?.trim();
    if v.is_empty() {
        return None;
    }
    let bad = || {
        panic!(
            "{col}={v:?} is not a {:?} as Wireshark prints it",
            field_type(col)
        )
    };
    Some(match field_type(col) {
        FieldType::Uint => match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|_| bad()),
            None => v.parse().unwrap_or_else(|_| bad()),
        },
        FieldType::Bool => match v {
            "0" | "False" => 0,
            "1" | "True" => 1,
            _ => bad(),
        },
        FieldType::Bytes => {
            let hex: String = v.chars().filter(|c| *c != ':').collect();
            if hex.is_empty()
                || !hex.len().is_multiple_of(2)
                || hex.len() > 16
                || hex.starts_with("0x")
            {
                bad();
            }
            u64::from_str_radix(&hex, 16).unwrap_or_else(|_| bad())
        }
    })
}

#[test]
fn wireshark_field_types_are_read_as_printed() {
    let row = |col: &str, v: &str| HashMap::from([(col.to_string(), v.to_string())]);
    // Immediate data is a byte string: hex without 0x, in network order.
    assert_eq!(
        num(
            &row("infiniband.immdt", "11223344,11223344"),
            "infiniband.immdt"
        ),
        Some(0x1122_3344)
    );
    assert_eq!(
        num(&row("infiniband.immdt", "11:22:33:44"), "infiniband.immdt"),
        Some(0x1122_3344)
    );
    assert_eq!(
        num(&row("infiniband.ieth", "0000abcd"), "infiniband.ieth"),
        Some(0xabcd)
    );
    // Integers: decimal, or 0x-hex for BASE_HEX fields.
    assert_eq!(
        num(&row("infiniband.bth.psn", "256"), "infiniband.bth.psn"),
        Some(256)
    );
    assert_eq!(
        num(
            &row("infiniband.bth.destqp", "0x00001f"),
            "infiniband.bth.destqp"
        ),
        Some(31)
    );
    assert_eq!(
        num(&row("infiniband.bth.a", "True"), "infiniband.bth.a"),
        Some(1)
    );
    assert_eq!(
        num(&row("infiniband.bth.a", "0"), "infiniband.bth.a"),
        Some(0)
    );
    assert_eq!(num(&row("infiniband.immdt", ""), "infiniband.immdt"), None);
}

#[test]
#[should_panic(expected = "is not a Bytes")]
fn a_byte_string_with_0x_is_not_what_wireshark_prints() {
    let row = HashMap::from([("infiniband.immdt".to_string(), "0x11223344".to_string())]);
    num(&row, "infiniband.immdt");
}

fn check_file(pcap: &Path) -> usize {
    let job = pcap.file_stem().unwrap().to_string_lossy().into_owned();
    let frames = pcap_frames(&std::fs::read(pcap).unwrap());
    let tsv = std::fs::read_to_string(pcap.with_extension("tshark.tsv")).unwrap();
    let rows = tsv_rows(&tsv);
    assert_eq!(rows.len(), frames.len(), "{job}: TSV rows vs frames");
    for (i, (frame, row)) in frames.iter().zip(&rows).enumerate() {
        let ctx = format!("{job} frame {}", i + 1);
        assert_eq!(num(row, "frame.number"), Some(i as u64 + 1), "{ctx}");
        let f = dissect(frame);
        let p = Packet::parse(&f.roce).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert!(icrc::verify(&f.ip, f.ports, &f.roce), "{ctx}: ICRC");
        // Over slices, as the scatter/gather send path computes it: the headers, then the
        // payload in pieces, whatever the cut.
        let wire = u32::from_le_bytes(f.roce[f.roce.len() - 4..].try_into().unwrap());
        let covered = &f.roce[..f.roce.len() - 4];
        let hdr = covered.len() - p.payload.len() - usize::from(p.headers.bth.pad);
        for cut in [12, hdr, hdr + p.payload.len() / 2, covered.len()] {
            let (a, b) = covered.split_at(cut.min(covered.len()));
            let (b1, b2) = b.split_at(b.len() / 3);
            assert_eq!(
                icrc::compute_slices(&f.ip, f.ports, &[a, b1, &[], b2]),
                Ok(wire),
                "{ctx}: ICRC over slices cut at {cut}"
            );
        }
        // What a receiver that cannot see the IP header does: recover the kernel's
        // identification from the ICRC alone.
        if let IpFields::V4 { id, .. } = f.ip {
            assert_eq!(
                icrc::recover_ipv4_id(&f.ip, f.ports, &f.roce),
                Some(id),
                "{ctx}: identification from the ICRC"
            );
        }
        let h = &p.headers;
        let eq = |col: &str, got: Option<u64>| {
            assert_eq!(got, num(row, col), "{ctx}: {col}");
        };
        eq(
            "infiniband.bth.opcode",
            Some(u64::from(h.bth.opcode.value())),
        );
        eq("infiniband.bth.se", Some(u64::from(h.bth.se)));
        eq("infiniband.bth.m", Some(u64::from(h.bth.mig_req)));
        eq("infiniband.bth.padcnt", Some(u64::from(h.bth.pad)));
        eq("infiniband.bth.tver", Some(u64::from(h.bth.tver)));
        eq("infiniband.bth.p_key", Some(u64::from(h.bth.pkey)));
        eq("infiniband.bth.destqp", Some(u64::from(h.bth.dest_qp)));
        eq("infiniband.bth.a", Some(u64::from(h.bth.ack_req)));
        eq("infiniband.bth.psn", Some(u64::from(h.bth.psn.value())));
        eq("infiniband.deth.q_key", h.deth.map(|d| u64::from(d.qkey)));
        eq("infiniband.deth.srcqp", h.deth.map(|d| u64::from(d.src_qp)));
        // Wireshark shows the AtomicETH's VA and R_Key in the RETH columns.
        let va = h.reth.map(|r| r.va).or(h.atomic.map(|a| a.va));
        let rkey = h.reth.map(|r| r.rkey).or(h.atomic.map(|a| a.rkey));
        eq("infiniband.reth.va", va);
        eq("infiniband.reth.r_key", rkey.map(u64::from));
        eq(
            "infiniband.reth.dmalen",
            h.reth.map(|r| u64::from(r.dma_len)),
        );
        eq(
            "infiniband.aeth.syndrome",
            h.aeth.map(|a| u64::from(a.syndrome.to_byte())),
        );
        eq("infiniband.aeth.msn", h.aeth.map(|a| u64::from(a.msn)));
        eq("infiniband.atomiceth.swapdt", h.atomic.map(|a| a.swap_add));
        eq("infiniband.atomiceth.cmpdt", h.atomic.map(|a| a.compare));
        eq("infiniband.atomicacketh.origremdt", h.atomic_ack);
        eq("infiniband.immdt", h.imm.map(u64::from));
        eq("infiniband.ieth", h.ieth.map(u64::from));
        eq(
            "infiniband.invariant.crc",
            Some(u64::from(u32::from_be_bytes(p.icrc.to_le_bytes()))),
        );
        if let Some(a) = h.aeth {
            assert!(!matches!(a.syndrome, Syndrome::Reserved(_)), "{ctx}");
        }
        // Rebuild from the parsed fields: byte for byte.
        let mut buf = vec![0u8; f.roce.len() + 8];
        let n = h.build(p.payload, &mut buf).unwrap();
        icrc::fill(&f.ip, f.ports, &mut buf[..n]).unwrap();
        assert_eq!(&buf[..n], &f.roce[..], "{ctx}: rebuilt bytes");
    }
    frames.len()
}

/// Without the captures this test is *ignored* (the build script sees the directory is
/// missing), so `cargo test`'s summary says so with the reason; `REMEM_REQUIRE_VECTORS`
/// turns a missing directory into a failure (`captures_present_when_required`).
#[test]
#[cfg_attr(
    rxe_vectors_missing,
    ignore = "kernel Soft-RoCE captures not found (../shared/vectors/rxe beside the repository)"
)]
fn kernel_soft_roce_captures() {
    let Some(dir) = vectors_dir() else {
        panic!("../shared/vectors/rxe disappeared since the build; run `cargo test` again");
    };
    let mut pcaps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    pcaps.sort();
    assert!(!pcaps.is_empty(), "no captures in {}", dir.display());
    let mut total = 0;
    for p in &pcaps {
        let n = check_file(p);
        assert!(n > 0, "{} is empty", p.display());
        total += n;
    }
    eprintln!(
        "checked {total} kernel Soft-RoCE packets in {} captures",
        pcaps.len()
    );
    assert!(total >= 200, "only {total} packets checked");
}

#[test]
fn captures_present_when_required() {
    if std::env::var_os("REMEM_REQUIRE_VECTORS").is_some() {
        assert!(
            vectors_dir().is_some(),
            "REMEM_REQUIRE_VECTORS is set but ../shared/vectors/rxe is missing"
        );
    }
}
