//! The invariant CRC, computed exactly as Linux rxe does it (`rxe_icrc.c`).
//!
//! CRC-32 (the zlib polynomial and conventions) over: 8 bytes of 0xff standing for the
//! masked LRH; the IPv4 header with TOS, TTL and header checksum set to all ones — or the
//! IPv6 header with traffic class, flow label and hop limit set to all ones; the UDP header
//! with its checksum set to all ones; the BTH with its FECN/BECN/reserved byte (byte 4) set
//! to all ones; then the rest of the packet up to the ICRC. The result is stored
//! little-endian in the last four bytes of the UDP payload.

use crate::packet::ICRC_LEN;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The IP header fields the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFields {
    /// IPv4.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification.
        id: u16,
        /// Flags and fragment offset (0x4000: DF).
        flags_frag: u16,
    },
    /// IPv6.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// The flags/fragment field with only DF set.
pub const IPV4_DF: u16 = 0x4000;

/// The UDP ports of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpPorts {
    /// Source port.
    pub src: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst: u16,
}

/// The UDP payload was too short to hold a BTH and an ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} bytes is too short for a RoCEv2 packet")]
pub struct TooShort(pub usize);

/// Bytes of a packet's start that [`IcrcHasher::new`] hashes in one call with the masked
/// pseudo-header (the BTH and the extension headers that follow it).
const HEAD_MAX: usize = 128;

/// The ICRC of a packet given in pieces, computed without assembling the packet: the driver
/// hashes a packet's headers from its transmit buffer and its payload straight from
/// registered memory (in chunks, see `remem_verbs::mem`), then sends the pieces with one
/// scatter/gather `sendmsg`.
///
/// [`IcrcHasher::new`] takes the UDP payload's length (ICRC field included) and its first
/// bytes — at least the 12-byte BTH, and as many of the headers after it as the caller
/// has at hand; [`IcrcHasher::update`] then takes every further byte up to the ICRC field,
/// in order, sliced any way; [`IcrcHasher::finalize`] gives what [`compute`] gives for the
/// assembled packet.
#[derive(Clone)]
pub struct IcrcHasher {
    h: crc32fast::Hasher,
    /// Covered bytes still to come (checked in debug builds).
    left: usize,
}

impl std::fmt::Debug for IcrcHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcrcHasher")
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl IcrcHasher {
    /// Starts the ICRC of a UDP payload of `udp_payload_len` bytes (its last 4 the ICRC
    /// field) that begins with `head` (at least the 12 bytes of the BTH; at most the bytes
    /// the ICRC covers). Fails if the packet is too short to hold a BTH and an ICRC, or if
    /// `head` is shorter than a BTH or longer than the covered bytes.
    pub fn new(
        ip: &IpFields,
        ports: UdpPorts,
        udp_payload_len: usize,
        head: &[u8],
    ) -> Result<Self, TooShort> {
        let n = udp_payload_len;
        if n < 12 + ICRC_LEN {
            return Err(TooShort(n));
        }
        if head.len() < 12 || head.len() > n - ICRC_LEN {
            return Err(TooShort(head.len()));
        }
        let udp_len = (8 + n) as u16;
        // Everything before the payload proper goes into one buffer, hashed in one call (the
        // CRC is slow on pieces of a few bytes): 8 bytes for the LRH, the IP header (20 or
        // 40), the UDP header (8), the BTH (12) and up to `HEAD_MAX - 12` bytes after it.
        let mut pre = [0u8; 8 + 40 + 8 + HEAD_MAX];
        pre[..8].fill(0xff);
        let mut at = 8;
        match ip {
            IpFields::V4 {
                src,
                dst,
                id,
                flags_frag,
            } => {
                let v4 = &mut pre[at..at + 20];
                v4[0] = 0x45;
                v4[1] = 0xff;
                v4[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
                v4[4..6].copy_from_slice(&id.to_be_bytes());
                v4[6..8].copy_from_slice(&flags_frag.to_be_bytes());
                v4[8] = 0xff;
                v4[9] = 17;
                v4[10] = 0xff;
                v4[11] = 0xff;
                v4[12..16].copy_from_slice(&src.octets());
                v4[16..20].copy_from_slice(&dst.octets());
                at += 20;
            }
            IpFields::V6 { src, dst } => {
                let v6 = &mut pre[at..at + 40];
                v6[..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
                v6[4..6].copy_from_slice(&udp_len.to_be_bytes());
                v6[6] = 17;
                v6[7] = 0xff;
                v6[8..24].copy_from_slice(&src.octets());
                v6[24..40].copy_from_slice(&dst.octets());
                at += 40;
            }
        }
        let udp = &mut pre[at..at + 8];
        udp[..2].copy_from_slice(&ports.src.to_be_bytes());
        udp[2..4].copy_from_slice(&ports.dst.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        udp[6..8].fill(0xff);
        at += 8;
        let (first, rest) = head.split_at(head.len().min(HEAD_MAX));
        pre[at..at + first.len()].copy_from_slice(first);
        pre[at + 4] = 0xff;
        at += first.len();
        let mut h = crc32fast::Hasher::new();
        h.update(&pre[..at]);
        h.update(rest);
        Ok(IcrcHasher {
            h,
            left: n - ICRC_LEN - head.len(),
        })
    }

    /// Hashes the next covered bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        debug_assert!(
            bytes.len() <= self.left,
            "more bytes than the packet covers"
        );
        self.left = self.left.saturating_sub(bytes.len());
        self.h.update(bytes);
    }

    /// The ICRC (every covered byte must have been hashed).
    pub fn finalize(self) -> u32 {
        debug_assert_eq!(self.left, 0, "covered bytes missing");
        self.h.finalize()
    }
}

/// How many of a packet's first `covered` bytes to hash with the pseudo-header (at least the
/// BTH, at most [`HEAD_MAX`]): all of a small packet's; of a larger one's, as many as leave
/// the rest a multiple of 256 bytes where that is possible. `crc32fast` folds 256 bytes per step on wide vector units and finishes a
/// remainder 16 bytes at a time: a 4 KiB payload after a 28-byte header costs about a fifth
/// less this way than hashed from byte 12.
fn head_len(covered: usize) -> usize {
    if covered <= HEAD_MAX {
        return covered; // a small packet: one call
    }
    12 + ((covered - 12) % 256).min(HEAD_MAX - 12)
}

/// Computes the ICRC of `udp_payload` (whose last 4 bytes are the ICRC field, not covered).
pub fn compute(ip: &IpFields, ports: UdpPorts, udp_payload: &[u8]) -> Result<u32, TooShort> {
    let n = udp_payload.len();
    if n < 12 + ICRC_LEN {
        return Err(TooShort(n));
    }
    let covered = &udp_payload[..n - ICRC_LEN];
    let (head, rest) = covered.split_at(head_len(covered.len()));
    let mut h = IcrcHasher::new(ip, ports, n, head)?;
    h.update(rest);
    Ok(h.finalize())
}

/// Computes the ICRC of a packet given as slices: `covered`, concatenated, is its UDP
/// payload up to the ICRC field (headers, payload, pad; the 4-byte ICRC field itself is
/// not included), sliced any way. The same value as [`compute`] over the assembled packet.
pub fn compute_slices(ip: &IpFields, ports: UdpPorts, covered: &[&[u8]]) -> Result<u32, TooShort> {
    let total: usize = covered.iter().map(|s| s.len()).sum();
    // The head: the first (at most HEAD_MAX) bytes, gathered across slices if need be.
    let mut head = [0u8; HEAD_MAX];
    let want = total.min(HEAD_MAX);
    let mut got = 0;
    let mut first = (0, 0); // (slice index, offset) where the rest starts
    for (i, s) in covered.iter().enumerate() {
        let k = s.len().min(want - got);
        head[got..got + k].copy_from_slice(&s[..k]);
        got += k;
        first = (i, k);
        if got == want {
            break;
        }
    }
    let mut h = IcrcHasher::new(ip, ports, total + ICRC_LEN, &head[..want])?;
    if let Some(s) = covered.get(first.0) {
        h.update(&s[first.1..]);
        for s in &covered[first.0 + 1..] {
            h.update(s);
        }
    }
    Ok(h.finalize())
}

/// Computes the ICRC and writes it into the last 4 bytes of `udp_payload`.
pub fn fill(ip: &IpFields, ports: UdpPorts, udp_payload: &mut [u8]) -> Result<(), TooShort> {
    let crc = compute(ip, ports, udp_payload)?;
    let n = udp_payload.len();
    udp_payload[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Whether the ICRC in `udp_payload` is right.
pub fn verify(ip: &IpFields, ports: UdpPorts, udp_payload: &[u8]) -> bool {
    match compute(ip, ports, udp_payload) {
        Ok(crc) => udp_payload[udp_payload.len() - ICRC_LEN..] == crc.to_le_bytes(),
        Err(_) => false,
    }
}

/// For an IPv4 packet whose sender's IP identification is unknown (a kernel picks it):
/// the identification that makes its ICRC right, if there is one.
///
/// The ICRC covers the 16-bit identification, and a CRC is affine over GF(2): the ICRC for
/// identification `id` is the ICRC for 0 XOR a linear function of `id`'s bits. Solving that
/// system (16 unknowns, 32 equations) finds the one `id` that fits, or shows none does; so
/// the ICRC still checks 16 of its 32 bits — a corrupted packet passes with probability
/// 2^-16 rather than always. `ip` must be [`IpFields::V4`] (its `id` is ignored); `None` for
/// IPv6, short packets and packets no identification fits.
pub fn recover_ipv4_id(ip: &IpFields, ports: UdpPorts, udp_payload: &[u8]) -> Option<u16> {
    fit_ipv4_id(ip, ports, udp_payload, 0)
}

/// [`recover_ipv4_id`] with a guess: the identification that makes the ICRC of an IPv4
/// packet right, trying 0 and then `hint` (a remem sender's GSO segment carries its index in
/// the batch, which GRO hands back) before solving for any other. One CRC pass over the
/// packet whatever the outcome: each identification bit's effect on the ICRC depends only
/// on the packet's length (the 14 bytes before the field, then a shift over the rest: a
/// multiplication by a power of x modulo the CRC polynomial), so it is computed once per
/// length and thread and cached, never by hashing the packet again. `None` for IPv6, short packets
/// and packets no identification fits.
pub fn fit_ipv4_id(ip: &IpFields, ports: UdpPorts, udp_payload: &[u8], hint: u16) -> Option<u16> {
    let IpFields::V4 {
        src,
        dst,
        flags_frag,
        ..
    } = *ip
    else {
        return None;
    };
    let n = udp_payload.len();
    let c0 = compute(
        &IpFields::V4 {
            src,
            dst,
            id: 0,
            flags_frag,
        },
        ports,
        udp_payload,
    )
    .ok()?;
    let got = u32::from_le_bytes(udp_payload[n - ICRC_LEN..].try_into().ok()?);
    let target = c0 ^ got;
    if target == 0 {
        return Some(0);
    }
    // The pre-image has this many bytes after the identification field (at offset 12: 8
    // bytes of LRH, 4 of the IPv4 header before it, then the 2-byte ID itself).
    let after = (8 + 20 + 8 + 12 + (n - 12 - ICRC_LEN) - ID_END) as u64;
    IdEffects::with(after, |fx| {
        if hint != 0 && fx.of(hint) == target {
            Some(hint)
        } else {
            fx.solve(target)
        }
    })
}

/// Bytes of the ICRC pre-image up to the end of the IPv4 identification field.
const ID_END: usize = 8 + 6;

/// What each bit of the IPv4 identification changes in the ICRC of a packet with `after`
/// bytes of pre-image after the identification field, and those effects reduced to a basis
/// for solving. Computed once per length and thread (a receiver sees few lengths: full MTU
/// packets and the last of each message) and kept in a small cache.
#[derive(Debug, Clone, Copy)]
struct IdEffects {
    after: u64,
    bit: [u32; 16],
    /// `(effect, identification bits that make it up)`, by decreasing effect.
    basis: [(u32, u16); 16],
    rank: usize,
}

impl IdEffects {
    fn new(after: u64) -> IdEffects {
        let shift = x_pow_8n(after);
        let zero = crc32fast::hash(&[0u8; ID_END]);
        let mut bit = [0u32; 16];
        for (i, e) in bit.iter_mut().enumerate() {
            let mut head = [0u8; ID_END];
            head[12..14].copy_from_slice(&(1u16 << i).to_be_bytes());
            // The difference of two finalized CRCs over equal lengths is the raw CRC of
            // their XOR (the initial value and final XOR cancel), carried over the rest.
            *e = mul_mod_p(crc32fast::hash(&head) ^ zero, shift);
        }
        let mut basis = [(0u32, 0u16); 16];
        let mut rank = 0;
        for (i, &e) in bit.iter().enumerate() {
            let mut v = e;
            let mut combo = 1u16 << i;
            for &(b, c) in &basis[..rank] {
                if v ^ b < v {
                    v ^= b;
                    combo ^= c;
                }
            }
            if v != 0 {
                basis[rank] = (v, combo);
                rank += 1;
                basis[..rank].sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
            }
        }
        IdEffects {
            after,
            bit,
            basis,
            rank,
        }
    }

    /// Runs `f` with the effects for `after`, from this thread's cache (8 lengths, the
    /// oldest replaced).
    fn with<R>(after: u64, f: impl FnOnce(&IdEffects) -> R) -> R {
        thread_local! {
            static CACHE: std::cell::RefCell<(usize, [Option<IdEffects>; 8])> =
                const { std::cell::RefCell::new((0, [None; 8])) };
        }
        CACHE.with_borrow_mut(|(next, slots)| {
            if let Some(fx) = slots.iter().flatten().find(|fx| fx.after == after) {
                return f(fx);
            }
            let fx = IdEffects::new(after);
            slots[*next] = Some(fx);
            *next = (*next + 1) % slots.len();
            f(&fx)
        })
    }

    /// The change identification `id` makes to the ICRC (against identification 0).
    fn of(&self, id: u16) -> u32 {
        (0..16)
            .filter(|i| id & (1 << i) != 0)
            .fold(0, |acc, i| acc ^ self.bit[i])
    }

    /// The identification whose change is `target`, if one is.
    fn solve(&self, target: u32) -> Option<u16> {
        let mut rest = target;
        let mut id = 0u16;
        for &(b, c) in &self.basis[..self.rank] {
            if rest ^ b < rest {
                rest ^= b;
                id ^= c;
            }
        }
        (rest == 0).then_some(id)
    }
}

/// The reflected CRC-32 polynomial (IEEE 802.3, as the ICRC uses it).
const POLY_REFLECTED: u32 = 0xEDB8_8320;

/// `a * b` modulo the CRC polynomial, both in the reflected bit order of a CRC-32 register
/// (bit 31 is the coefficient of x^0).
fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    for bit in (0..32).rev() {
        product ^= b & 0u32.wrapping_sub((a >> bit) & 1);
        b = (b >> 1) ^ (POLY_REFLECTED & 0u32.wrapping_sub(b & 1));
    }
    product
}

/// x^(8 * `bytes`) modulo the CRC polynomial (reflected): what shifting a CRC register over
/// `bytes` zero bytes multiplies it by.
fn x_pow_8n(bytes: u64) -> u32 {
    // x^(2^k), starting at x^8 (k = 3) and squared as the exponent's bits are walked.
    let mut square = 1u32 << (31 - 8);
    let mut result = 1u32 << 31; // x^0
    let mut e = bytes;
    while e != 0 {
        if e & 1 != 0 {
            result = mul_mod_p(result, square);
        }
        square = mul_mod_p(square, square);
        e >>= 1;
    }
    result
}

/// The internet checksum of an IPv4 header (checksum field treated as zero).
pub fn ipv4_checksum(header: &[u8; 20]) -> u16 {
    let mut sum: u32 = 0;
    for (i, pair) in header.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A complete IPv4 header for a UDP datagram of `udp_payload_len` payload bytes (for packet
/// captures and raw senders), with a correct checksum.
pub fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    flags_frag: u16,
    ttl: u8,
    tos: u8,
    udp_payload_len: usize,
) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[1] = tos;
    h[2..4].copy_from_slice(&((20 + 8 + udp_payload_len) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6..8].copy_from_slice(&flags_frag.to_be_bytes());
    h[8] = ttl;
    h[9] = 17;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let c = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The MANIFEST's worked example: an ACK from 192.168.77.2 to 192.168.77.1.
    #[test]
    fn manifest_example() {
        let payload = hex("1100ffff 00000012 000e2ead 1f000001 22b65570");
        let ip = IpFields::V4 {
            src: Ipv4Addr::new(192, 168, 77, 2),
            dst: Ipv4Addr::new(192, 168, 77, 1),
            id: 0xd9ef,
            flags_frag: IPV4_DF,
        };
        let ports = UdpPorts {
            src: 0xc144,
            dst: 4791,
        };
        assert_eq!(compute(&ip, ports, &payload).unwrap(), 0x7055_b622);
        assert!(verify(&ip, ports, &payload));
        let mut copy = payload.clone();
        copy[19] = 0;
        fill(&ip, ports, &mut copy).unwrap();
        assert_eq!(copy, payload);
        // The example's real IPv4 header checksum.
        let h = ipv4_header(
            Ipv4Addr::new(192, 168, 77, 2),
            Ipv4Addr::new(192, 168, 77, 1),
            0xd9ef,
            IPV4_DF,
            64,
            0,
            20,
        );
        assert_eq!(&h[..], &hex("45000030d9ef400040114579c0a84d02c0a84d01")[..]);
    }

    #[test]
    fn icrc_over_slices_and_hasher_match_the_assembled_packet() {
        let payload = hex("1100ffff 00000012 000e2ead 1f000001 22b65570");
        let ip = IpFields::V4 {
            src: Ipv4Addr::new(192, 168, 77, 2),
            dst: Ipv4Addr::new(192, 168, 77, 1),
            id: 0xd9ef,
            flags_frag: IPV4_DF,
        };
        let ports = UdpPorts {
            src: 0xc144,
            dst: 4791,
        };
        let covered = &payload[..16];
        for cut in 0..=16 {
            let (a, b) = covered.split_at(cut);
            assert_eq!(
                compute_slices(&ip, ports, &[a, b]),
                Ok(0x7055_b622),
                "{cut}"
            );
        }
        assert_eq!(
            compute_slices(&ip, ports, &[&[], covered, &[]]),
            Ok(0x7055_b622)
        );
        for head in 12..=16 {
            let mut h = IcrcHasher::new(&ip, ports, 20, &covered[..head]).unwrap();
            h.update(&covered[head..]);
            assert_eq!(h.finalize(), 0x7055_b622);
        }
        // A 4 KiB payload fed in chunks of every size across the head's 64-byte limit.
        let mut big: Vec<u8> = (0..4124u32).map(|i| (i * 31 + 7) as u8).collect();
        fill(&ip, ports, &mut big).unwrap();
        let want = compute(&ip, ports, &big).unwrap();
        for head in [12, 40, 63, 64, 65, 200] {
            for chunk in [1, 7, 64, 1000, 4096] {
                let mut h = IcrcHasher::new(&ip, ports, big.len(), &big[..head]).unwrap();
                for c in big[head..big.len() - 4].chunks(chunk) {
                    h.update(c);
                }
                assert_eq!(h.finalize(), want, "head {head} chunk {chunk}");
            }
        }
        // Too short a packet, or a head shorter than a BTH or longer than the covered bytes.
        assert_eq!(compute_slices(&ip, ports, &[&[0; 11]]), Err(TooShort(15)));
        assert!(IcrcHasher::new(&ip, ports, 20, &covered[..11]).is_err());
        assert!(IcrcHasher::new(&ip, ports, 20, &payload[..17]).is_err());
        assert!(IcrcHasher::new(&ip, ports, 15, &covered[..12]).is_err());
    }

    #[test]
    fn masked_fields_do_not_matter_and_covered_ones_do() {
        let mut payload = hex("11000000 00000012 000e2ead 1f000001 00000000");
        let ip = IpFields::V6 {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        let ports = UdpPorts {
            src: 49152,
            dst: 4791,
        };
        fill(&ip, ports, &mut payload).unwrap();
        assert!(verify(&ip, ports, &payload));
        // FECN/BECN byte is masked.
        let mut p = payload.clone();
        p[4] = 0xc0;
        assert!(verify(&ip, ports, &p));
        // Every other byte is covered.
        for i in (0..payload.len() - 4).filter(|i| *i != 4) {
            let mut p = payload.clone();
            p[i] ^= 1;
            assert!(!verify(&ip, ports, &p), "byte {i}");
        }
        let other = UdpPorts {
            src: 49153,
            ..ports
        };
        assert!(!verify(&ip, other, &payload));
        assert!(compute(&ip, ports, &[0; 15]).is_err());
    }

    #[test]
    fn an_unknown_ipv4_identification_is_recovered_and_corruption_still_caught() {
        let ports = UdpPorts {
            src: 51000,
            dst: 4791,
        };
        for (len, id) in [
            (16usize, 1u16),
            (60, 0x8001),
            (1100, 0xbeef),
            (4124, 0xffff),
        ] {
            let mut payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let ip = |id| IpFields::V4 {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                id,
                flags_frag: IPV4_DF,
            };
            fill(&ip(id), ports, &mut payload).unwrap();
            assert!(!verify(&ip(0), ports, &payload) || id == 0);
            assert_eq!(
                recover_ipv4_id(&ip(0), ports, &payload),
                Some(id),
                "len {len}"
            );
            // A flipped bit anywhere the ICRC covers: no identification fits.
            let mut missed = 0;
            for byte in (0..len - 4).filter(|b| *b != 4) {
                let mut p = payload.clone();
                p[byte] ^= 0x10;
                if recover_ipv4_id(&ip(0), ports, &p).is_some() {
                    missed += 1;
                }
            }
            assert_eq!(missed, 0, "len {len}");
        }
        let v6 = IpFields::V6 {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        assert_eq!(recover_ipv4_id(&v6, ports, &[0; 40]), None);
    }

    #[test]
    fn shifting_by_a_power_of_x_is_appending_zero_bytes() {
        // The raw CRC register (no initial value, no final XOR) of `v` followed by `n` zero
        // bytes is `v` times x^(8n): checked against crc32fast through the linearity of
        // finalized CRCs (their difference over equal lengths is the raw CRC of the XOR).
        for n in [0usize, 1, 2, 7, 100, 4100] {
            let a: Vec<u8> = (0..4).chain(std::iter::repeat_n(0, n)).collect();
            let b: Vec<u8> = std::iter::repeat_n(0, 4 + n).collect();
            let head = crc32fast::hash(&a[..4]) ^ crc32fast::hash(&b[..4]);
            let whole = crc32fast::hash(&a) ^ crc32fast::hash(&b);
            assert_eq!(mul_mod_p(head, x_pow_8n(n as u64)), whole, "n {n}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_fitted_identification_is_the_senders(
            len in 16usize..5000,
            seed in proptest::prelude::any::<u8>(),
            id in proptest::prelude::any::<u16>(),
            hint in proptest::prelude::any::<u16>(),
        ) {
            let ports = UdpPorts { src: 49152, dst: 4791 };
            let ip = |id| IpFields::V4 {
                src: "192.0.2.1".parse().unwrap(),
                dst: "192.0.2.77".parse().unwrap(),
                id,
                flags_frag: IPV4_DF,
            };
            let mut payload: Vec<u8> =
                (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            fill(&ip(id), ports, &mut payload).unwrap();
            // Whatever the hint, the one identification that fits is the sender's; a right
            // hint is what it returns.
            proptest::prop_assert_eq!(fit_ipv4_id(&ip(0), ports, &payload, hint), Some(id));
            proptest::prop_assert_eq!(fit_ipv4_id(&ip(0), ports, &payload, id), Some(id));
            proptest::prop_assert!(verify(&ip(id), ports, &payload));
        }
    }
}
