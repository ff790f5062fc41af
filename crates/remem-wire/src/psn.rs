//! 24-bit packet sequence numbers.
//!
//! PSNs wrap at 2^24, so they have no total order: whether one is before another is only
//! defined on the circle (IBTA 9.7.1), relative to each other. [`Psn`] therefore implements
//! neither `Ord` nor `PartialOrd` on its raw value; it offers the circular distance
//! ([`Psn::diff`]) and the comparisons built on it ([`Psn::is_before`],
//! [`Psn::is_after`], [`Psn::within`]). Every operation is inline `u32` arithmetic.

use std::cmp::Ordering;
use std::fmt;

/// A packet sequence number: 24 bits, compared on the circle (IBTA 9.7.1: `b` is after `a`
/// when `b - a` modulo 2^24 is below 2^23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The largest value, 2^24 − 1.
    pub const MAX: u32 = 0x00ff_ffff;

    /// A PSN from the low 24 bits of `v`.
    #[inline]
    pub const fn new(v: u32) -> Self {
        Psn(v & Self::MAX)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    #[inline]
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The PSN after this one (`self + 1` modulo 2^24).
    #[inline]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// The PSN before this one (`self - 1` modulo 2^24).
    #[inline]
    pub const fn prev(self) -> Self {
        self.sub(1)
    }

    /// The signed distance from `other` to `self`, in `-2^23 .. 2^23`: positive when
    /// `self` is after `other`. (The two PSNs exactly 2^23 apart are each "before" the
    /// other: the distance is `-2^23` both ways.)
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Whether `self` comes before `other` on the circle (`self.diff(other) < 0`).
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// Whether `self` comes after `other` on the circle (`self.diff(other) > 0`).
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// Whether `self` is one of the `n` PSNs starting at `base` (`base`, `base + 1`, …,
    /// `base + n - 1`), for `n` up to 2^23.
    #[inline]
    pub const fn within(self, base: Psn, n: u32) -> bool {
        let d = self.diff(base);
        d >= 0 && (d as u32) < n
    }

    /// Orders two PSNs on the circle (`Less` if `self` is before `other`).
    #[inline]
    pub fn cmp_circular(self, other: Psn) -> Ordering {
        self.diff(other).cmp(&0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HALF: u32 = 1 << 23;

    #[test]
    fn wrap_and_order() {
        let top = Psn::new(Psn::MAX);
        assert_eq!(top.add(1), Psn::new(0));
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(Psn::new(0).prev(), top);
        assert_eq!(Psn::new(2).diff(top), 3);
        assert_eq!(top.diff(Psn::new(2)), -3);
        assert_eq!(Psn::new(2).cmp_circular(top), Ordering::Greater);
        assert_eq!(Psn::new(1 << 23).diff(Psn::new(0)), -(1 << 23));
        assert_eq!(Psn::new((1 << 23) - 1).diff(Psn::new(0)), (1 << 23) - 1);
        assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
        assert_eq!(Psn::new(5).cmp_circular(Psn::new(5)), Ordering::Equal);
    }

    #[test]
    fn comparisons_across_the_wrap() {
        let top = Psn::new(Psn::MAX);
        let zero = Psn::new(0);
        // 0 follows 2^24 - 1, whatever the raw values say.
        assert!(zero.is_after(top));
        assert!(top.is_before(zero));
        assert!(!zero.is_before(top));
        assert!(!top.is_after(top) && !top.is_before(top));
        // A range starting just below the wrap holds the PSNs past it.
        let base = Psn::new(Psn::MAX - 1);
        assert!(base.within(base, 1));
        assert!(!base.within(base, 0));
        assert!(zero.within(base, 3));
        assert!(!Psn::new(1).within(base, 3));
        assert!(!base.prev().within(base, 3));
        // Exactly half the circle apart: each is before the other.
        let far = zero.add(HALF);
        assert!(far.is_before(zero) && zero.is_before(far));
    }

    fn psn() -> impl Strategy<Value = Psn> {
        prop_oneof![
            any::<u32>().prop_map(Psn::new),
            // Near the wrap, where raw comparisons go wrong.
            (0u32..64).prop_map(|k| Psn::new(Psn::MAX - k)),
            (0u32..64).prop_map(Psn::new),
        ]
    }

    proptest! {
        /// Going `n` forward (or back) is a distance of `n` (or `-n`), across the wrap too.
        #[test]
        fn add_and_sub_are_distances(a in psn(), n in 0u32..HALF) {
            prop_assert_eq!(a.add(n).diff(a), n as i32);
            prop_assert_eq!(a.sub(n).diff(a), -(n as i32));
            prop_assert_eq!(a.add(n).sub(n), a);
            prop_assert_eq!(a.next().prev(), a);
            prop_assert_eq!(a.add(n).value(), (a.value() + n) % (1 << 24));
        }

        /// The distance is antisymmetric (except half a circle apart), unchanged when both
        /// move by the same amount, and adding it to `b` gives `a` back.
        #[test]
        fn diff_is_a_circle_distance(a in psn(), b in psn(), k in any::<u32>()) {
            let d = a.diff(b);
            prop_assert!((-(HALF as i32)..HALF as i32).contains(&d));
            prop_assert_eq!(b.add(d as u32), a);
            if d != -(HALF as i32) {
                prop_assert_eq!(b.diff(a), -d);
            }
            prop_assert_eq!(a.add(k).diff(b.add(k)), d);
            prop_assert_eq!(a.is_before(b), d < 0);
            prop_assert_eq!(a.is_after(b), d > 0);
            prop_assert_eq!(a.cmp_circular(b), d.cmp(&0));
        }

        /// `within` is "0 ≤ distance from the base < n".
        #[test]
        fn within_is_an_offset_from_the_base(a in psn(), base in psn(), n in 0u32..=HALF) {
            let off = a.value().wrapping_sub(base.value()) & Psn::MAX;
            prop_assert_eq!(a.within(base, n), off < n);
        }
    }
}
