//! Memory keys and QP numbers: unpredictable to a peer, unique until the space wraps.
//!
//! Keys are a secret 32-bit permutation (a 4-round Feistel network with random round keys)
//! applied to a counter that starts at a random value: consecutive registrations get
//! unrelated-looking keys, no key repeats before the counter wraps, and no per-key state is
//! kept. Key 0 is never handed out. QP numbers ([`QpnGen`]) are made the same way in the
//! 24-bit QPN space, so that a peer cannot enumerate a device's QPs from one it knows, and
//! a destroyed QP's number comes back only after 2^24 more have been handed out.

use rand::Rng;

/// Generates lkeys and rkeys for one device. The key table skips keys still in use, so a
/// key is never shared even after the counter wraps.
#[derive(Debug)]
pub struct KeyGen {
    round_keys: [u32; 4],
    next: u32,
    /// The top 8 bits of every key (a shared device's slot: keys are unique per host), 0:
    /// none.
    prefix: u8,
}

impl KeyGen {
    /// A generator with fresh random round keys and start.
    pub fn new() -> Self {
        let mut rng = rand::rng();
        KeyGen {
            round_keys: rng.random(),
            next: rng.random(),
            prefix: 0,
        }
    }

    fn permute(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> 16) as u16, x as u16);
        for k in self.round_keys {
            let f = (u32::from(r) ^ k).wrapping_mul(0x9e37_79b1).rotate_left(13);
            let f = (f ^ (f >> 16)) as u16;
            (l, r) = (r, l ^ f);
        }
        (u32::from(l) << 16) | u32::from(r)
    }

    /// Makes every key from now on carry `prefix` in its top 8 bits (0: none): a shared
    /// device's slot, so that keys are unique on the host. The other 24 bits stay
    /// unpredictable (the table the keys go to skips those in use).
    pub fn set_prefix(&mut self, prefix: u8) {
        self.prefix = prefix;
    }

    /// The next key.
    pub fn next_key(&mut self) -> u32 {
        loop {
            let mut k = self.permute(self.next);
            if self.prefix != 0 {
                k = u32::from(self.prefix) << 24 | (k & 0x00ff_ffff);
            }
            self.next = self.next.wrapping_add(1);
            if k != 0 {
                return k;
            }
        }
    }
}

#[cfg(test)]
impl QpnGen {
    /// Makes `qpn` the next number of the sequence.
    pub(crate) fn seek(&mut self, qpn: u32) {
        let (h, mask) = (self.bits / 2, self.half());
        let (mut l, mut r) = ((qpn >> h) & mask, qpn & mask);
        for k in self.round_keys.iter().rev() {
            (l, r) = (r ^ Self::round(l, *k, mask), l);
        }
        self.next = (l << h) | r;
    }
}

#[cfg(test)]
impl KeyGen {
    /// Steps the counter back, replaying keys (as after 2^32 keys).
    pub(crate) fn rewind(&mut self, n: u32) {
        self.next = self.next.wrapping_sub(n);
    }
}

impl Default for KeyGen {
    fn default() -> Self {
        Self::new()
    }
}

/// Width of a QP number.
const QPN_BITS: u32 = 24;

/// Generates QP numbers for one device: a secret permutation of the 24-bit space applied
/// to a counter from a random start. The device skips numbers below its first QPN (0 and 1
/// are the special QPs) and numbers in use.
#[derive(Debug)]
pub struct QpnGen {
    round_keys: [u32; 4],
    next: u32,
    /// The width of the numbers (24, or 16 on a shared device, whose slot is the top 8).
    bits: u32,
}

impl QpnGen {
    /// A generator with fresh random round keys and start.
    pub fn new() -> Self {
        Self::with_bits(QPN_BITS)
    }

    /// A generator of `bits`-bit numbers (an even width up to 24): a permutation of that
    /// space, as [`QpnGen::new`]'s is of 24 bits.
    pub fn with_bits(bits: u32) -> Self {
        let bits = bits.clamp(2, QPN_BITS) & !1;
        let mut rng = rand::rng();
        QpnGen {
            round_keys: rng.random(),
            next: rng.random::<u32>() & ((1 << bits) - 1),
            bits,
        }
    }

    fn half(&self) -> u32 {
        (1 << (self.bits / 2)) - 1
    }

    fn round(r: u32, k: u32, mask: u32) -> u32 {
        let f = (r ^ k).wrapping_mul(0x9e37_79b1).rotate_left(11);
        (f ^ (f >> 16)) & mask
    }

    fn permute(&self, x: u32) -> u32 {
        let (h, mask) = (self.bits / 2, self.half());
        let (mut l, mut r) = ((x >> h) & mask, x & mask);
        for k in self.round_keys {
            (l, r) = (r, l ^ Self::round(r, k, mask));
        }
        (l << h) | r
    }

    /// The next number of the sequence (any value of the generator's width).
    pub fn next_qpn(&mut self) -> u32 {
        let q = self.permute(self.next);
        self.next = (self.next + 1) & ((1 << self.bits) - 1);
        q
    }
}

impl Default for QpnGen {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn keys_are_unique_and_nonzero() {
        let mut g = KeyGen::new();
        let keys: Vec<u32> = (0..200_000).map(|_| g.next_key()).collect();
        let set: HashSet<u32> = keys.iter().copied().collect();
        assert_eq!(set.len(), keys.len());
        assert!(!set.contains(&0));
        // Consecutive keys do not differ by a small constant.
        let small_steps = keys
            .windows(2)
            .filter(|w| w[1].wrapping_sub(w[0]) < 1024)
            .count();
        assert!(small_steps < 10, "{small_steps} near-sequential keys");
    }

    #[test]
    fn permutation_is_a_bijection_on_a_sample() {
        let g = KeyGen::new();
        let set: HashSet<u32> = (0..1u32 << 18).map(|x| g.permute(x)).collect();
        assert_eq!(set.len(), 1 << 18);
    }

    #[test]
    fn qpns_are_a_permutation_of_24_bits() {
        let mut g = QpnGen::new();
        let all: HashSet<u32> = (0..1u32 << 24).map(|_| g.next_qpn()).collect();
        assert_eq!(all.len(), 1 << 24, "every 24-bit value once per cycle");
        assert!(all.iter().all(|q| *q < 1 << 24));
    }

    #[test]
    fn sixteen_bit_numbers_are_a_permutation_too() {
        let mut g = QpnGen::with_bits(16);
        let all: HashSet<u32> = (0..1u32 << 16).map(|_| g.next_qpn()).collect();
        assert_eq!(all.len(), 1 << 16);
        assert!(all.iter().all(|q| *q < 1 << 16));
    }

    #[test]
    fn seek_inverts_the_permutation() {
        let mut g = QpnGen::new();
        for q in [0, 1, 16, 0x00ab_cdef, 0x00ff_ffff] {
            g.seek(q);
            assert_eq!(g.next_qpn(), q);
        }
    }

    #[test]
    fn consecutive_qpns_are_not_enumerable() {
        let mut g = QpnGen::new();
        let qpns: Vec<u32> = (0..10_000).map(|_| g.next_qpn()).collect();
        // Knowing one QPN tells nothing about the next: few neighbours within ±1024.
        let near = qpns
            .windows(2)
            .filter(|w| w[1].abs_diff(w[0]) <= 1024)
            .count();
        assert!(near < 20, "{near} near-sequential QPNs");
        let (a, b) = (QpnGen::new(), QpnGen::new());
        assert_ne!(
            (0..8).map(|x| a.permute(x)).collect::<Vec<_>>(),
            (0..8).map(|x| b.permute(x)).collect::<Vec<_>>(),
            "devices differ"
        );
    }

    #[test]
    fn devices_differ() {
        let (mut a, mut b) = (KeyGen::new(), KeyGen::new());
        let ka: Vec<u32> = (0..8).map(|_| a.next_key()).collect();
        let kb: Vec<u32> = (0..8).map(|_| b.next_key()).collect();
        assert_ne!(ka, kb);
    }
}
