//! Memory keys: unpredictable to a peer, unique until 2^32 registrations.
//!
//! Keys are a secret 32-bit permutation (a 4-round Feistel network with random round keys)
//! applied to a counter that starts at a random value: consecutive registrations get
//! unrelated-looking keys, no key repeats before the counter wraps, and no per-key state is
//! kept. Key 0 is never handed out.

use rand::Rng;

/// Generates lkeys and rkeys for one device. The key table skips keys still in use, so a
/// key is never shared even after the counter wraps.
#[derive(Debug)]
pub struct KeyGen {
    round_keys: [u32; 4],
    next: u32,
}

impl KeyGen {
    /// A generator with fresh random round keys and start.
    pub fn new() -> Self {
        let mut rng = rand::rng();
        KeyGen {
            round_keys: rng.random(),
            next: rng.random(),
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

    /// The next key.
    pub fn next_key(&mut self) -> u32 {
        loop {
            let k = self.permute(self.next);
            self.next = self.next.wrapping_add(1);
            if k != 0 {
                return k;
            }
        }
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
    fn devices_differ() {
        let (mut a, mut b) = (KeyGen::new(), KeyGen::new());
        let ka: Vec<u32> = (0..8).map(|_| a.next_key()).collect();
        let kb: Vec<u32> = (0..8).map(|_| b.next_key()).collect();
        assert_ne!(ka, kb);
    }
}
