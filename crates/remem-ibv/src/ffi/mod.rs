//! The C ABI boundary: the only place where the library turns the program's raw
//! pointers into references, and so the only place (with the C entry points that call
//! it) where `unsafe` is allowed.
//!
//! - this module: errno, NULL returns, panic containment ([`guard`]), and the pointer
//!   conversions every entry point uses once, at its top: [`opt_ref`], [`opt_mut`],
//!   [`out`], [`slice()`], [`out_slice`], [`slice_mut`], [`cstr`], [`zeroed`], and
//!   [`ProgramMemory`] (the memory a registration names);
//! - [`handles`]: the library's objects behind the program's pointers (`*mut ibv_qp` to
//!   the [`crate::qp::Qp`] it is the first field of, ...) as typed [`handles::Handle`]s,
//!   with the few in-place reads and writes of program-visible ABI fields the objects
//!   need, each with its `// SAFETY:` argument here;
//! - [`wr`]: the program's work-request lists, read under the verbs contract;
//! - [`sys`]: `fcntl` and `poll` on the library's own descriptors;
//! - the entry modules ([`queues`], [`device`], [`verbs`], [`private`], [`rdmacm`]): the
//!   exported `extern "C"` functions, each a thin
//!   shell that converts its arguments with the helpers above and calls safe code in the
//!   object modules (`qp`, `cq`, ...), which say `#![deny(unsafe_code)]`.
//!
//! A unit test (`boundary`) keeps it so: it fails when a module outside the allow-list
//! of FFI modules allows `unsafe_code`, or when an `unsafe` block has no `// SAFETY:` note.

#![allow(unsafe_code)]

pub mod device;
pub mod handles;
pub mod private;
pub mod queues;
pub mod rdmacm;
pub mod rsocket;
pub mod sockaddr;
pub mod sys;
pub mod verbs;
pub mod wr;

#[cfg(test)]
mod boundary;

use core::ffi::{CStr, c_char};
use core::mem::MaybeUninit;
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

/// A reference to what `p` points at; `None` for NULL.
///
/// # Safety
///
/// `p` is NULL or valid for reads of a `T` for `'a`, and nobody writes it meanwhile.
pub unsafe fn opt_ref<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: by the contract.
    unsafe { p.as_ref() }
}

/// A mutable reference to what `p` points at; `None` for NULL.
///
/// # Safety
///
/// `p` is NULL or valid for reads and writes of a `T` for `'a`, and nobody else touches it
/// meanwhile (an in/out parameter of the call).
pub unsafe fn opt_mut<'a, T>(p: *mut T) -> Option<&'a mut T> {
    // SAFETY: by the contract.
    unsafe { p.as_mut() }
}

/// The place at `p` for the library to write a `T` into (an out-parameter, perhaps
/// uninitialised); `None` for NULL.
///
/// # Safety
///
/// `p` is NULL or valid for writes of a `T` for `'a`, touched by nobody else meanwhile.
pub unsafe fn out<'a, T>(p: *mut T) -> Option<&'a mut MaybeUninit<T>> {
    // SAFETY: by the contract; `MaybeUninit<T>` has `T`'s layout and any content.
    unsafe { p.cast::<MaybeUninit<T>>().as_mut() }
}

/// The `len` values at `p` (empty for `len` 0, whatever `p` is); `None` for a NULL `p`
/// with a non-zero `len`.
///
/// # Safety
///
/// For a non-zero `len`, `p` is NULL or valid for reads of `len` values of `T` for `'a`,
/// not written meanwhile.
pub unsafe fn slice<'a, T>(p: *const T, len: usize) -> Option<&'a [T]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: by the contract; non-NULL, and C arrays are aligned.
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The `len` places at `p`, to write (an output array); as [`slice()`].
///
/// # Safety
///
/// For a non-zero `len`, `p` is NULL or valid for reads and writes of `len` values of `T`
/// for `'a`, touched by nobody else meanwhile.
pub unsafe fn slice_mut<'a, T>(p: *mut T, len: usize) -> Option<&'a mut [T]> {
    if len == 0 {
        return Some(&mut []);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: by the contract.
    Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// The `len` places at `p` for the library to write (an output array, perhaps
/// uninitialised); as [`slice()`].
///
/// # Safety
///
/// For a non-zero `len`, `p` is NULL or valid for writes of `len` values of `T` for `'a`,
/// touched by nobody else meanwhile.
pub unsafe fn out_slice<'a, T>(p: *mut T, len: usize) -> Option<&'a mut [MaybeUninit<T>]> {
    // SAFETY: by the contract; `MaybeUninit<T>` has `T`'s layout and any content.
    unsafe { slice_mut(p.cast::<MaybeUninit<T>>(), len) }
}

/// The NUL-terminated string at `p`; `None` for NULL.
///
/// # Safety
///
/// `p` is NULL or a NUL-terminated string valid for `'a`.
pub unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a CStr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: by the contract.
    Some(unsafe { CStr::from_ptr(p) })
}

/// Program memory that a registration names (`ibv_reg_mr`'s `[addr, addr + len)`), as
/// the entry point received it: the program vouches for it when it registers it.
#[derive(Debug)]
pub struct ProgramMemory {
    addr: *mut core::ffi::c_void,
    len: usize,
}

impl ProgramMemory {
    /// The program's range `[addr, addr + len)`.
    ///
    /// # Safety
    ///
    /// `addr` is NULL, or `[addr, addr + len)` is memory the program owns and keeps
    /// mapped until the registration made of it is dropped (`ibv_dereg_mr`, or the
    /// `ibv_rereg_mr` that replaces it), as ibv_reg_mr(3) requires.
    pub unsafe fn new(addr: *mut core::ffi::c_void, len: usize) -> ProgramMemory {
        ProgramMemory { addr, len }
    }

    /// Its start.
    pub fn addr(&self) -> *mut core::ffi::c_void {
        self.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory as a buffer the NIC reads and writes; `None` for NULL.
    pub fn into_buffer(self) -> Option<remem_verbs::MemoryBuffer> {
        let ptr = core::ptr::NonNull::new(self.addr.cast::<u8>())?;
        // SAFETY: memory the program owns and keeps mapped while the registration lives
        // (`new`'s contract; `mr::register` also checks it is mapped). This is memory the
        // program itself keeps using while the NIC reads and writes it — the RDMA model:
        // the buffer only ever touches it through MemoryBuffer's atomic accessors, which
        // is what a device doing DMA into program memory amounts to, and a program racing
        // its own accesses with the NIC's gets torn data, not undefined behaviour on the
        // Rust side. The owner is nothing: the program frees the memory.
        Some(unsafe { remem_verbs::MemoryBuffer::from_raw_parts(ptr, self.len, Box::new(())) })
    }
}

/// The 16 bytes of a GID (`union ibv_gid`: both of its views are plain bytes).
pub fn gid(g: &crate::abi::ibv_gid) -> remem_verbs::Gid {
    // SAFETY: every bit pattern of the union's 16 bytes is a valid `raw` array.
    remem_verbs::Gid(unsafe { g.raw })
}

/// The 32 bits of a work completion's `imm_data` / `invalidated_rkey` union.
pub fn wc_imm(wc: &crate::abi::ibv_wc) -> u32 {
    // SAFETY: both views of the union are a `u32`.
    unsafe { wc.u_imm_data.imm_data }
}

/// An ABI type for which all-zero bytes are a valid value: integers, raw pointers (NULL),
/// function pointers in `Option`, arrays, unions and structs of those.
///
/// # Safety
///
/// All-zero bytes must be a valid value of the type.
pub unsafe trait Zeroable: Sized {}

/// An all-zero `T` (what C code gets from `memset(&x, 0, sizeof x)`).
pub fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `T: Zeroable`.
    unsafe { std::mem::zeroed() }
}

macro_rules! zeroable {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: a verbs.h / rdma_cma.h struct of integers, pointers and unions of
            // those (the layout tests check each against the header).
            unsafe impl Zeroable for $t {}
        )*
    };
}

zeroable!(
    crate::abi::ibv_qp_attr,
    crate::abi::ibv_qp_init_attr,
    crate::abi::ibv_ah_attr,
    crate::abi::ibv_wc,
    crate::abi::ibv_send_wr,
    crate::abi::ibv_recv_wr,
    crate::abi::ibv_sge,
    crate::rdmacm::abi::rdma_route,
);

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

zeroable!(
    crate::abi::ibv_sa_path_rec,
    crate::abi::ib_uverbs_qp_attr,
    crate::abi::ibv_device_attr_ex,
);
