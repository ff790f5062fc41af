//! Helpers for the C ABI boundary: errno, NULL returns, panic containment.

#![allow(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Sets the calling thread's `errno`.
pub fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for the
    // thread's lifetime.
    unsafe { *libc::__errno_location() = errno };
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

/// Sets `errno` and returns NULL: the failure of a verb that returns a pointer.
pub fn null_with<T>(errno: i32) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

/// The errno value of a remem-verbs error (EINVAL, ENOMEM, EOPNOTSUPP, ...).
pub fn errno_of(err: &remem_verbs::Error) -> i32 {
    err.errno()
}

/// Runs the body of an exported function; a panic (a bug) becomes `on_panic` (e.g.
/// `libc::EIO`, or NULL after `set_errno`) instead of unwinding into C, with a line on
/// stderr.
pub fn guard<R>(name: &str, on_panic: impl FnOnce() -> R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("remem-ibv: internal error in {name} (a panic); the call fails");
            on_panic()
        }
    }
}

/// [`guard`] for a verb that returns an errno value (0 = success): a panic returns EIO.
pub fn guard_int(name: &str, body: impl FnOnce() -> i32) -> i32 {
    guard(name, || libc::EIO, body)
}

/// [`guard`] for a verb that returns a pointer: a panic returns NULL with errno EIO.
pub fn guard_ptr<T>(name: &str, body: impl FnOnce() -> *mut T) -> *mut T {
    guard(name, || null_with(libc::EIO), body)
}

/// `-errno` style verbs return -1 with errno set: a panic returns -1 with errno EIO.
pub fn guard_neg(name: &str, body: impl FnOnce() -> i32) -> i32 {
    guard(
        name,
        || {
            set_errno(libc::EIO);
            -1
        },
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_with_sets_errno() {
        let p: *mut u8 = null_with(libc::EOPNOTSUPP);
        assert!(p.is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
    }

    #[test]
    fn guard_contains_a_panic() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = guard_int("test", || panic!("boom"));
        std::panic::set_hook(prev);
        assert_eq!(r, libc::EIO);
    }
}
