//! PSN arithmetic on the plain `u32`s of the transport's bookkeeping, by way of
//! [`remem_wire::Psn`].

use remem_wire::Psn;

/// PSNs are 24 bits.
pub const PSN_MASK: u32 = Psn::MAX;

/// `psn + n` modulo 2^24.
pub fn add(psn: u32, n: u32) -> u32 {
    Psn::new(psn).add(n).value()
}

/// The signed distance from `a` to `b` on the 24-bit circle, in `-2^23 .. 2^23`:
/// positive when `b` is after `a`.
pub fn diff(b: u32, a: u32) -> i32 {
    Psn::new(b).diff(Psn::new(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(add(PSN_MASK - 1, 5), 3);
        assert_eq!(diff(3, PSN_MASK - 1), 5);
        assert_eq!(diff(PSN_MASK - 1, 3), -5);
        assert_eq!(diff(7, 7), 0);
        assert_eq!(diff(1 << 22, 0), 1 << 22);
        assert_eq!(diff(0, 1 << 23), -(1 << 23));
    }
}
