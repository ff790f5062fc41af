//! Memory regions over program memory.
//!
//! `ibv_reg_mr` wraps the program's bytes in a `remem_verbs::MemoryBuffer` (through
//! `MemoryBuffer::from_raw_parts`) and registers it with the remem PD. From then on the
//! soft NIC's progress thread reads and writes those bytes while the program runs — what
//! a NIC's DMA does — always through `MemoryBuffer`'s atomic accessors. What this assumes
//! of the program (as RDMA does): the range stays mapped, with the access it was
//! registered for, until `ibv_dereg_mr` and until the work requests using it complete.
//! Registration checks that the range is mapped now (readable, and writable when the NIC
//! may write it): EFAULT otherwise, as the kernel's `ib_umem_get` answers.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::context::{PdUse, pd_from};
use crate::ffi::{errno_of, guard_int, guard_ptr, null_with, set_errno};
use core::ffi::{c_int, c_uint, c_void};
use remem_verbs::{AccessFlags, MemRegion, MemoryBuffer, MemoryRegion};
use std::ptr::NonNull;
use std::sync::Arc;

symver!(
    "ibv_reg_mr" @ "IBVERBS_1.1",
    "ibv_reg_mr_iova" @ "IBVERBS_1.7",
    "ibv_reg_mr_iova2" @ "IBVERBS_1.8",
    "ibv_reg_dmabuf_mr" @ "IBVERBS_1.12",
    "ibv_rereg_mr" @ "IBVERBS_1.1",
    "ibv_dereg_mr" @ "IBVERBS_1.1",
    "ibv_import_mr" @ "IBVERBS_1.10",
    "ibv_unimport_mr" @ "IBVERBS_1.10",
);

/// A memory region: what `ibv_reg_mr` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Mr {
    /// The `ibv_mr` programs see.
    pub abi: ibv_mr,
    /// The remem memory region.
    pub mr: Arc<dyn MemoryRegion>,
    /// The verbs access it was registered with (what `ibv_rereg_mr` keeps without
    /// CHANGE_ACCESS).
    access: u32,
    _pd: PdUse,
}

/// The access bits a registration may carry: the ones remem knows, plus rdma-core's
/// optional range (hints a provider may ignore, e.g. RELAXED_ORDERING).
const KNOWN_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_MW_BIND
    | IBV_ACCESS_ZERO_BASED
    | IBV_ACCESS_ON_DEMAND
    | IBV_ACCESS_HUGETLB
    | IBV_ACCESS_OPTIONAL_RANGE
    | (1 << 8) // IB_UVERBS_ACCESS_FLUSH_GLOBAL
    | (1 << 9); // IB_UVERBS_ACCESS_FLUSH_PERSISTENT

/// The remem access of a verbs access mask: EINVAL for unknown bits or REMOTE_WRITE /
/// REMOTE_ATOMIC without LOCAL_WRITE (ibv_reg_mr(3)), EOPNOTSUPP for on-demand paging.
/// The optional bits are dropped.
pub fn access_flags(access: u32) -> Result<AccessFlags, c_int> {
    if access & !KNOWN_ACCESS != 0 {
        return Err(libc::EINVAL);
    }
    if access & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let flags = AccessFlags::from_bits_truncate(access & !IBV_ACCESS_OPTIONAL_RANGE);
    flags.validate_for_mr().map_err(|_| libc::EINVAL)?;
    Ok(flags)
}

/// Whether the NIC may write memory registered with `flags`.
fn nic_writes(flags: AccessFlags) -> bool {
    flags.intersects(
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
    )
}

/// Checks that `[addr, addr + len)` is mapped readable (and writable if `write`) in this
/// process, from `/proc/self/maps`: EFAULT if not. Without `/proc` nothing is checked.
pub fn check_mapped(addr: usize, len: usize, write: bool) -> Result<(), c_int> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Ok(());
    };
    let end = addr.checked_add(len).ok_or(libc::EINVAL)?;
    check_mapped_in(&maps, addr, end, write)
}

/// [`check_mapped`] against the text of a maps file.
pub fn check_mapped_in(maps: &str, addr: usize, end: usize, write: bool) -> Result<(), c_int> {
    let mut covered = addr;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= covered || lo > covered {
            continue; // (lines are sorted: a gap before `covered` means unmapped)
        }
        let perms = perms.as_bytes();
        if perms.first() != Some(&b'r') || (write && perms.get(1) != Some(&b'w')) {
            return Err(libc::EFAULT);
        }
        covered = hi;
        if covered >= end {
            return Ok(());
        }
    }
    Err(libc::EFAULT)
}

/// Registers `[addr, addr + length)` with the remem PD of `p`, NIC address `iova` (0 with
/// ZERO_BASED), after the checks `ibv_reg_mr` makes: the errno on failure.
fn register(
    p: &crate::context::PdInner,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<Arc<dyn MemoryRegion>, c_int> {
    let flags = access_flags(access)?;
    if length == 0 {
        return Err(libc::EINVAL);
    }
    let ptr = NonNull::new(addr.cast::<u8>()).ok_or(libc::EFAULT)?;
    check_mapped(addr as usize, length, nic_writes(flags))?;
    let iova = if access & IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    // SAFETY: the program registers memory it owns and keeps mapped until ibv_dereg_mr
    // (checked mapped just now; the rest is the verbs contract, ibv_reg_mr(3)). This is
    // memory the program itself keeps using while the NIC reads and writes it — the RDMA
    // model: the buffer only ever touches it through MemoryBuffer's atomic accessors,
    // which is what a device doing DMA into program memory amounts to, and a program
    // racing its own accesses with the NIC's gets torn data, not undefined behaviour on
    // the Rust side. The owner is nothing: the program frees the memory.
    let buf = unsafe { MemoryBuffer::from_raw_parts(ptr, length, Box::new(())) };
    let region = MemRegion::with_iova(Arc::new(buf), .., iova).map_err(|_| libc::EINVAL)?;
    p.pd.reg_mr(region, flags).map_err(|e| errno_of(&e))
}

/// Registers `[addr, addr + length)` on `pd` with NIC address `iova`.
fn reg(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: u32) -> *mut ibv_mr {
    // SAFETY: NULL or a live PD by the callers' contracts.
    let Some(p) = (unsafe { pd_from(pd) }) else {
        return null_with(libc::EINVAL);
    };
    let mr = match register(&p.inner, addr, length, iova, access) {
        Ok(mr) => mr,
        Err(e) => return null_with(e),
    };
    let abi = ibv_mr {
        context: p.abi.context,
        pd,
        addr,
        length,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    Box::into_raw(Box::new(Mr {
        abi,
        mr,
        access,
        _pd: p.inner.hold(),
    }))
    .cast()
}

/// `ibv_reg_mr`: NULL with errno EINVAL (NULL PD, zero length, bad access), EFAULT
/// (memory not mapped with the access needed), EOPNOTSUPP (on-demand paging).
///
/// # Safety
///
/// `pd` is NULL or live; `[addr, addr + length)` is program memory that stays mapped
/// until `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr", || {
        reg(pd, addr, length, addr as u64, access as u32)
    })
}

/// `ibv_reg_mr_iova`: as `ibv_reg_mr`, the NIC addressing the region at `iova`.
///
/// # Safety
///
/// As [`remem_ibv_ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr_iova", || {
        reg(pd, addr, length, iova, access as u32)
    })
}

/// `ibv_reg_mr_iova2`: as `ibv_reg_mr_iova` (verbs.h's inline `ibv_reg_mr` calls this
/// one when the access is not a constant or has optional bits).
///
/// # Safety
///
/// As [`remem_ibv_ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr_iova2", || reg(pd, addr, length, iova, access))
}

/// `ibv_reg_dmabuf_mr`: no dma-buf here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, offset, length, iova, fd, access);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_rereg_mr` (ibv_rereg_mr(3)): changes the registration of `mr` in place — its
/// translation (`addr`, `length`; IBV_REREG_MR_CHANGE_TRANSLATION), its PD (`pd`, of the
/// same context; IBV_REREG_MR_CHANGE_PD) and/or its access (`access`;
/// IBV_REREG_MR_CHANGE_ACCESS); what a flag does not name stays. 0 on success: the
/// `ibv_mr` keeps its address and `handle`, and gets new `lkey`/`rkey` (a fresh
/// registration, as mlx5 gives when it re-creates the MR; rxe offers no rereg). The old
/// registration is revoked exactly as `ibv_dereg_mr` revokes it: its keys stop working at
/// once, so a peer still using the old rkey is NAKed (remote access error).
///
/// On failure nothing changed and the old registration stays valid:
/// `IBV_REREG_MR_ERR_INPUT` with errno EINVAL (NULL MR, no flag or an unknown one,
/// CHANGE_TRANSLATION without an address or length, a NULL PD or one of another context
/// with CHANGE_PD, bad access bits), EFAULT (the new range is not mapped with the access
/// needed), EOPNOTSUPP (on-demand paging), or the errno of the device's refusal.
///
/// # Safety
///
/// `mr` is NULL or live and not used by another thread during the call; `pd` NULL or
/// live; with CHANGE_TRANSLATION, `[addr, addr + length)` is program memory that stays
/// mapped until the MR is deregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let fail = |errno: c_int| {
        set_errno(errno);
        IBV_REREG_MR_ERR_INPUT
    };
    let r = crate::ffi::guard(
        "ibv_rereg_mr",
        || Err(libc::EIO),
        || {
            let flags = flags as u32;
            if mr.is_null() || flags == 0 || flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
                return Err(libc::EINVAL);
            }
            let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
            if translation && (addr.is_null() || length == 0) {
                return Err(libc::EINVAL);
            }
            // SAFETY: a live MR made by `reg` (its first field), used by this thread alone
            // during the call (the contract).
            let m = unsafe { &mut *mr.cast::<Mr>() };
            let (new_pd, pd_inner) = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
                // SAFETY: NULL or a live PD (the contract).
                let p = unsafe { pd_from(pd) }.ok_or(libc::EINVAL)?;
                if p.abi.context != m.abi.context {
                    return Err(libc::EINVAL);
                }
                (pd, p.inner.hold())
            } else {
                (m.abi.pd, m._pd.pd().hold())
            };
            let access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
                access as u32
            } else {
                m.access
            };
            let (addr, length) = if translation {
                (addr, length)
            } else {
                (m.abi.addr, m.abi.length)
            };
            // Without a new translation the NIC address stays; with one it is the new
            // address (ZERO_BASED: 0).
            let iova = if translation {
                addr as u64
            } else {
                m.mr.addr()
            };
            let new = register(pd_inner.pd(), addr, length, iova, access)?;
            // The old registration goes as ibv_dereg_mr's does: dropping it removes its
            // keys from the device at once.
            let old = std::mem::replace(&mut m.mr, new);
            drop(old);
            m._pd = pd_inner;
            m.access = access;
            m.abi.pd = new_pd;
            m.abi.addr = addr;
            m.abi.length = length;
            m.abi.lkey = m.mr.lkey();
            m.abi.rkey = m.mr.rkey();
            Ok(())
        },
    );
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `ibv_dereg_mr`: 0; EINVAL for NULL. Work requests still using the region keep the
/// NIC's reference to the memory (the program must not unmap it before they complete).
///
/// # Safety
///
/// `mr` is NULL or live, not used afterwards on success.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remem_ibv_ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard_int("ibv_dereg_mr", || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // A region with memory windows bound stays (rxe: EINVAL, IBA 10.6.7.2.6).
        // SAFETY: a live MR made by `reg` (its first field).
        if unsafe { &*mr.cast::<Mr>() }.mr.windows_bound() > 0 {
            return libc::EINVAL;
        }
        // SAFETY: a live MR made by `reg` (its first field), not used afterwards.
        drop(unsafe { Box::from_raw(mr.cast::<Mr>()) });
        0
    })
}

/// `ibv_import_mr`: none here (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    let _ = (pd, mr_handle);
    null_with(libc::EOPNOTSUPP)
}

/// `ibv_unimport_mr`: nothing was imported; does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn remem_ibv_ibv_unimport_mr(mr: *mut ibv_mr) {
    let _ = mr;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;

    #[test]
    fn rereg_keeps_the_object_and_handle_and_drops_the_old_registration() {
        let ctx =
            crate::context::Ctx::create(crate::context::tests::soft_device(), std::ptr::null_mut());
        // SAFETY: a live context.
        let pd = unsafe { crate::ffi::device::remem_ibv_ibv_alloc_pd(ctx) };
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 2048];
        let rw = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        // SAFETY: live PD, memory that outlives the MR.
        let mr = unsafe { remem_ibv_ibv_reg_mr(pd, a.as_mut_ptr().cast(), a.len(), rw) };
        assert!(!mr.is_null());
        // SAFETY: the live MR just made (read through its pointer only).
        let (handle, rkey, old) =
            unsafe { ((*mr).handle, (*mr).rkey, Arc::clone(&(*mr.cast::<Mr>()).mr)) };
        let rereg = |flags: u32, addr: *mut u8, len: usize, access: u32| {
            // SAFETY: live MR and PD; the memory outlives the MR.
            unsafe {
                remem_ibv_ibv_rereg_mr(mr, flags as c_int, pd, addr.cast(), len, access as c_int)
            }
        };
        // Bad input: nothing changes.
        assert_eq!(rereg(0, null_mut(), 0, 0), IBV_REREG_MR_ERR_INPUT);
        assert_eq!(
            rereg(
                IBV_REREG_MR_CHANGE_ACCESS,
                null_mut(),
                0,
                IBV_ACCESS_REMOTE_WRITE
            ),
            IBV_REREG_MR_ERR_INPUT
        );
        // SAFETY: the live MR.
        assert_eq!(unsafe { (*mr).rkey }, rkey);
        // Access and translation at once.
        let flags = IBV_REREG_MR_CHANGE_ACCESS | IBV_REREG_MR_CHANGE_TRANSLATION;
        assert_eq!(
            rereg(flags, b.as_mut_ptr(), b.len(), IBV_ACCESS_LOCAL_WRITE),
            0
        );
        // SAFETY: the live MR.
        let m = unsafe { &*mr.cast::<Mr>() };
        assert_eq!(m.abi.handle, handle, "same handle");
        assert_ne!(m.abi.rkey, rkey, "new keys");
        assert_eq!((m.abi.addr, m.abi.length), (b.as_mut_ptr().cast(), b.len()));
        assert_eq!(m.mr.access(), AccessFlags::LOCAL_WRITE);
        assert_eq!((m.mr.addr(), m.mr.len()), (b.as_ptr() as u64, b.len()));
        // The old registration is gone (its last handle is the test's): its keys are
        // revoked when that drops, as at ibv_dereg_mr.
        assert_eq!(Arc::strong_count(&old), 1);
        drop(old);
        // SAFETY: the live MR and PD, not used afterwards.
        unsafe {
            assert_eq!(remem_ibv_ibv_dereg_mr(mr), 0);
            assert_eq!(crate::ffi::device::remem_ibv_ibv_dealloc_pd(pd), 0);
            crate::context::Ctx::free(ctx);
        }
    }

    const MAPS: &str = "\
00400000-00401000 r-xp 00000000 08:01 1 /bin/x
00600000-00602000 rw-p 00000000 00:00 0
00602000-00604000 rw-p 00000000 00:00 0 [heap]
00604000-00605000 r--p 00000000 00:00 0
00700000-00701000 rw-p 00000000 00:00 0
";

    #[test]
    fn mapped_ranges() {
        // Inside one mapping, across adjacent ones, to the very end.
        assert_eq!(check_mapped_in(MAPS, 0x600100, 0x600200, true), Ok(()));
        assert_eq!(check_mapped_in(MAPS, 0x601000, 0x603000, true), Ok(()));
        assert_eq!(check_mapped_in(MAPS, 0x600000, 0x604000, true), Ok(()));
        // Read-only: fine to read, not to write.
        assert_eq!(check_mapped_in(MAPS, 0x600000, 0x605000, false), Ok(()));
        assert_eq!(
            check_mapped_in(MAPS, 0x603000, 0x604800, true),
            Err(libc::EFAULT)
        );
        assert_eq!(
            check_mapped_in(MAPS, 0x400000, 0x400010, true),
            Err(libc::EFAULT)
        );
        // A hole, unmapped memory, past the last mapping.
        assert_eq!(
            check_mapped_in(MAPS, 0x604800, 0x700100, false),
            Err(libc::EFAULT)
        );
        assert_eq!(check_mapped_in(MAPS, 0x10, 0x20, false), Err(libc::EFAULT));
        assert_eq!(
            check_mapped_in(MAPS, 0x700800, 0x701001, false),
            Err(libc::EFAULT)
        );
    }

    #[test]
    fn this_process_maps() {
        let v = vec![7u8; 10000];
        assert_eq!(check_mapped(v.as_ptr() as usize, v.len(), true), Ok(()));
        assert_eq!(check_mapped(usize::MAX - 10, 100, false), Err(libc::EINVAL));
        assert_eq!(check_mapped(8, 8, false), Err(libc::EFAULT));
    }

    #[test]
    fn access_masks() {
        let all = IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC;
        assert_eq!(access_flags(all).unwrap().bits(), all);
        assert_eq!(
            access_flags(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING | (1 << 29)),
            Ok(AccessFlags::LOCAL_WRITE),
            "optional bits are dropped"
        );
        assert_eq!(access_flags(IBV_ACCESS_REMOTE_WRITE), Err(libc::EINVAL));
        assert_eq!(access_flags(1 << 15), Err(libc::EINVAL));
        assert_eq!(access_flags(IBV_ACCESS_ON_DEMAND), Err(libc::EOPNOTSUPP));
        assert_eq!(access_flags(0), Ok(AccessFlags::empty()));
    }
}
