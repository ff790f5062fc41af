//! 24-bit packet sequence numbers.

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
    pub const fn new(v: u32) -> Self {
        Psn(v & Self::MAX)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The signed distance from `other` to `self`, in `-2^23 .. 2^23`: positive when
    /// `self` is after `other`.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Orders two PSNs on the circle (`Less` if `self` is before `other`).
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

    #[test]
    fn wrap_and_order() {
        let top = Psn::new(Psn::MAX);
        assert_eq!(top.add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(Psn::new(2).diff(top), 3);
        assert_eq!(top.diff(Psn::new(2)), -3);
        assert_eq!(Psn::new(2).cmp_circular(top), Ordering::Greater);
        assert_eq!(Psn::new(1 << 23).diff(Psn::new(0)), -(1 << 23));
        assert_eq!(Psn::new((1 << 23) - 1).diff(Psn::new(0)), (1 << 23) - 1);
        assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
        assert_eq!(Psn::new(5).cmp_circular(Psn::new(5)), Ordering::Equal);
    }
}
