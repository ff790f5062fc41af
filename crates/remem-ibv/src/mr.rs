//! Memory regions over program memory.
//!
//! `ibv_reg_mr` wraps the program's bytes in a `remem_verbs::MemoryBuffer` (through
//! `MemoryBuffer::from_raw_parts`, in [`crate::ffi::ProgramMemory`]) and registers it with the remem PD. From then on the
//! soft NIC's progress thread reads and writes those bytes while the program runs — what
//! a NIC's DMA does — always through `MemoryBuffer`'s atomic accessors. What this assumes
//! of the program (as RDMA does): the range stays mapped, with the access it was
//! registered for, until `ibv_dereg_mr` and until the work requests using it complete.
//! (The one access that may come later, a READ response replayed for a duplicate request,
//! reads through the kernel and is refused on unmapped memory: see docs/dropin.md.)
//! Registration checks that the range is mapped now (readable, and writable when the NIC
//! may write it): EFAULT otherwise, as the kernel's `ib_umem_get` answers.

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::context::{Pd, PdInner, PdUse};
use crate::ffi::handles::{Handle, Registration, into_abi};
use crate::ffi::{ProgramMemory, errno_of, null_with};
use core::ffi::c_int;
use remem_verbs::{AccessFlags, MemRegion, MemoryRegion};
use std::sync::{Arc, Mutex, MutexGuard};

/// A memory region: what `ibv_reg_mr` returns a pointer to (`abi` first).
#[repr(C)]
pub struct Mr {
    /// The `ibv_mr` programs see.
    pub abi: ibv_mr,
    /// The library's side.
    pub inner: MrInner,
}

/// The library's side of a memory region (`ibv_rereg_mr` replaces it in place).
pub struct MrInner {
    state: Mutex<MrState>,
}

/// A region's registration.
pub struct MrState {
    /// The remem memory region.
    pub mr: Arc<dyn MemoryRegion>,
    /// The verbs access it was registered with (what `ibv_rereg_mr` keeps without
    /// CHANGE_ACCESS).
    access: u32,
    pd: PdUse,
}

impl std::fmt::Debug for MrInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrInner").finish_non_exhaustive()
    }
}

impl MrInner {
    /// The registration, locked.
    pub fn state(&self) -> MutexGuard<'_, MrState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
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

/// Registers the program's memory `mem` with the remem PD of `p`, NIC address `iova` (0
/// with ZERO_BASED), after the checks `ibv_reg_mr` makes: the errno on failure.
fn register(
    p: &PdInner,
    mem: ProgramMemory,
    iova: u64,
    access: u32,
) -> Result<Arc<dyn MemoryRegion>, c_int> {
    let flags = access_flags(access)?;
    if mem.is_empty() {
        return Err(libc::EINVAL);
    }
    if mem.addr().is_null() {
        return Err(libc::EFAULT);
    }
    check_mapped(mem.addr() as usize, mem.len(), nic_writes(flags))?;
    let iova = if access & IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    let buf = mem.into_buffer().ok_or(libc::EFAULT)?;
    let region = MemRegion::with_iova(Arc::new(buf), .., iova).map_err(|_| libc::EINVAL)?;
    p.pd.reg_mr(region, flags).map_err(|e| errno_of(&e))
}

/// `ibv_reg_mr` (and `_iova`, `_iova2`) once the FFI layer has its arguments: registers
/// `mem` on `pd` with NIC address `iova`; NULL with errno EINVAL (NULL PD, zero length,
/// bad access), EFAULT (memory not mapped with the access needed), EOPNOTSUPP (on-demand
/// paging).
pub(crate) fn reg(pd: Option<&Pd>, mem: ProgramMemory, iova: u64, access: u32) -> *mut ibv_mr {
    let Some(p) = pd else {
        return null_with(libc::EINVAL);
    };
    let (addr, length) = (mem.addr(), mem.len());
    let mr = match register(&p.inner, mem, iova, access) {
        Ok(mr) => mr,
        Err(e) => return null_with(e),
    };
    let abi = ibv_mr {
        context: p.abi.context,
        pd: p.inner.ibv_pd(),
        addr,
        length,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    into_abi(Mr {
        abi,
        inner: MrInner {
            state: Mutex::new(MrState {
                mr,
                access,
                pd: p.inner.hold(),
            }),
        },
    })
}

/// `ibv_rereg_mr` once the FFI layer has its arguments (`pd`: the new PD, used with
/// IBV_REREG_MR_CHANGE_PD; `mem`: the new translation with CHANGE_TRANSLATION, else the
/// current one): see [`crate::ffi::device::remem_ibv_ibv_rereg_mr`]. The errno on
/// failure, when nothing changed.
pub(crate) fn rereg(
    mr: Handle<'_, Mr>,
    flags: u32,
    pd: Option<&Pd>,
    mem: ProgramMemory,
    access: u32,
) -> Result<(), c_int> {
    let now = mr.registration();
    let mut st = mr.inner().state();
    let pd_use = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        let p = pd.ok_or(libc::EINVAL)?;
        if p.abi.context != now.context {
            return Err(libc::EINVAL);
        }
        p.inner.hold()
    } else {
        st.pd.pd().hold()
    };
    let access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        access
    } else {
        st.access
    };
    // Without a new translation the NIC address stays; with one it is the new address
    // (ZERO_BASED: 0).
    let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let iova = if translation {
        mem.addr() as u64
    } else {
        st.mr.addr()
    };
    let (addr, length) = (mem.addr(), mem.len());
    let new = register(pd_use.pd(), mem, iova, access)?;
    // The old registration goes as ibv_dereg_mr's does: dropping it removes its keys from
    // the device at once.
    let old = std::mem::replace(&mut st.mr, new);
    drop(old);
    mr.set_registration(Registration {
        context: now.context,
        pd: pd_use.pd().ibv_pd(),
        addr,
        length,
        lkey: st.mr.lkey(),
        rkey: st.mr.rkey(),
    });
    st.pd = pd_use;
    st.access = access;
    Ok(())
}

/// Whether the region may be deregistered (`ibv_dereg_mr`): a region with memory windows
/// bound stays (rxe: EINVAL, IBA 10.6.7.2.6).
pub(crate) fn release(m: &MrInner) -> Result<(), c_int> {
    if m.state().mr.windows_bound() > 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
