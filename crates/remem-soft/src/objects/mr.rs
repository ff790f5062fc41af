//! Memory regions and the device's key table.
//!
//! The table maps lkeys and rkeys (two separate namespaces: an lkey used as an rkey is an
//! unknown key) to shared [`MrEntry`]s. Lookups run once per scatter/gather entry when
//! posting and once per request packet on the responder: they take a read lock, hash the
//! key with one multiplication (keys come from a secret permutation, so they are already
//! spread and a peer cannot choose them), and allocate nothing — the resulting
//! [`Grant`] shares the registration's buffer.
//!
//! Deregistration revokes the rkey at the root: the registration's [`KeyedRegion`] is
//! shared by every [`Grant`] a responder resolved from it (and kept for a WRITE's later
//! packets, a READ's responses, a duplicate READ's replay), so [`MrTable::remove`] reaches
//! all of them — it returns once no grant can touch the memory any more.

use super::DeviceShared;
use super::keys::KeyGen;
use crate::transport::{Grant, KeyedRegion, RemoteKeyError};
use crate::wqe::PdId;
use remem_verbs::{AccessFlags, Error, MemRegion, Result, Sge};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, RwLock};

/// What the key table knows of a registration.
#[derive(Debug)]
pub struct MrEntry {
    /// Protection domain.
    pub pd: PdId,
    /// The memory, and whether its keys still stand.
    pub key: Arc<KeyedRegion>,
    /// Access rights.
    pub access: AccessFlags,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

impl MrEntry {
    /// The registered memory.
    pub fn region(&self) -> &MemRegion {
        self.key.region()
    }
}

/// Hashes a memory key or a QP number: Fibonacci hashing, which fills the high bits the table's probe
/// tags come from.
#[derive(Debug, Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, k: u32) {
        self.0 = u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type KeyMap = HashMap<u32, Arc<MrEntry>, BuildHasherDefault<KeyHasher>>;

#[derive(Debug, Default)]
struct Tables {
    by_lkey: KeyMap,
    by_rkey: KeyMap,
    keys: KeyGen,
}

impl Tables {
    /// The next key in use by no registration (keys repeat only after 2^32 have been
    /// issued; a long-lived registration's key is then skipped, never shared).
    fn fresh_key(&mut self) -> u32 {
        loop {
            let k = self.keys.next_key();
            if !self.by_lkey.contains_key(&k) && !self.by_rkey.contains_key(&k) {
                return k;
            }
        }
    }
}

/// The memory regions of a device, by lkey and by rkey.
#[derive(Debug)]
pub struct MrTable {
    tables: RwLock<Tables>,
    max: usize,
}

impl Default for MrTable {
    /// A table without a registration limit.
    fn default() -> Self {
        Self::new(u32::MAX)
    }
}

impl MrTable {
    /// An empty table admitting at most `max_mr` registrations at a time.
    pub fn new(max_mr: u32) -> Self {
        MrTable {
            tables: RwLock::new(Tables::default()),
            max: max_mr as usize,
        }
    }

    /// Registers `region` for `pd` with fresh keys; [`Error::Exhausted`] at `max_mr`
    /// registrations.
    pub fn insert(&self, pd: PdId, region: MemRegion, access: AccessFlags) -> Result<Arc<MrEntry>> {
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        if t.by_lkey.len() >= self.max {
            return Err(Error::Exhausted("memory regions (max_mr)"));
        }
        let lkey = t.fresh_key();
        let rkey = t.fresh_key();
        let e = Arc::new(MrEntry {
            pd,
            key: KeyedRegion::new(region),
            access,
            lkey,
            rkey,
        });
        t.by_lkey.insert(lkey, e.clone());
        t.by_rkey.insert(rkey, e.clone());
        Ok(e)
    }

    /// Removes a registration: both its keys stop working at once (for posts and for
    /// peers), and every grant a responder resolved from its rkey is revoked — once this
    /// returns, no peer's packet reads or writes the memory (a copy in progress is waited
    /// for). Work requests posted with its lkey hold grants of the same key: they reach the
    /// memory no more either (they complete with a local protection error).
    pub fn remove(&self, e: &Arc<MrEntry>) {
        {
            let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
            if t.by_lkey.get(&e.lkey).is_some_and(|x| Arc::ptr_eq(x, e)) {
                t.by_lkey.remove(&e.lkey);
            }
            if t.by_rkey.get(&e.rkey).is_some_and(|x| Arc::ptr_eq(x, e)) {
                t.by_rkey.remove(&e.rkey);
            }
        }
        // Outside the table's lock: lookups of other keys need not wait for a copy.
        e.key.revoke();
    }

    /// Number of registrations.
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_lkey
            .len()
    }

    /// Whether there are none.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves a remote access for the responder: a grant exactly covering
    /// `[va, va + len)` if `rkey` names a region of `pd` granting `need` that contains it.
    /// Checked in rxe's order: key, PD, access rights, bounds; a range wrapping past 2^64 is
    /// out of bounds. The grant works until the region is deregistered.
    pub fn remote(
        &self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        Self::granted(&t, pd, rkey, need)?.key.grant(va, len)
    }

    /// Resolves a remote key to a grant for its whole region (a FLUSH of the memory
    /// region), with the same key, PD and access checks as [`MrTable::remote`].
    pub fn remote_region(
        &self,
        pd: PdId,
        rkey: u32,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        Self::granted(&t, pd, rkey, need)?.key.grant_all()
    }

    /// Resolves an `ibv_sge`: unknown lkey or a region of another PD →
    /// [`Error::InvalidLkey`]; `need_write` without LOCAL_WRITE → [`Error::LocalAccess`];
    /// outside the region (or wrapping past 2^64) → [`Error::SgeOutOfBounds`]. A zero-length
    /// entry inside (or at the end of) its region is valid. The grant stops working when
    /// the region is deregistered (the lkey is revoked with the rkey).
    pub fn local(&self, pd: PdId, sge: &Sge, need_write: bool) -> Result<Grant> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        let e = t
            .by_lkey
            .get(&sge.lkey)
            .filter(|e| e.pd == pd)
            .ok_or(Error::InvalidLkey { lkey: sge.lkey })?;
        if need_write && !e.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::LocalAccess { lkey: sge.lkey });
        }
        e.key
            .grant(sge.addr, u64::from(sge.length))
            .map_err(|cause| match cause {
                RemoteKeyError::OutOfBounds => Error::SgeOutOfBounds {
                    addr: sge.addr,
                    length: sge.length,
                    lkey: sge.lkey,
                },
                _ => Error::InvalidLkey { lkey: sge.lkey },
            })
    }

    /// The entry of `rkey` if it is in `pd` and grants `need` (rxe's order of checks).
    fn granted(
        t: &Tables,
        pd: PdId,
        rkey: u32,
        need: AccessFlags,
    ) -> std::result::Result<&MrEntry, RemoteKeyError> {
        let e = t.by_rkey.get(&rkey).ok_or(RemoteKeyError::UnknownKey)?;
        if e.pd != pd {
            return Err(RemoteKeyError::OtherPd);
        }
        if !e.access.contains(need) {
            return Err(RemoteKeyError::MissingAccess);
        }
        Ok(e)
    }
}

/// A registered memory region (`ibv_mr`); dropping it deregisters.
#[derive(Debug)]
pub struct SoftMr {
    pub(crate) entry: Arc<MrEntry>,
    pub(crate) dev: Arc<DeviceShared>,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.dev.mrs.remove(&self.entry);
    }
}

impl remem_verbs::MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.entry.lkey
    }
    fn rkey(&self) -> u32 {
        self.entry.rkey
    }
    fn region(&self) -> &MemRegion {
        self.entry.region()
    }
    fn access(&self) -> AccessFlags {
        self.entry.access
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::MemoryBuffer;

    #[test]
    fn lookups_and_every_error_cause() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
        let region = MemRegion::new(buf.clone(), 1000..2000).unwrap();
        let e = t
            .insert(
                PdId(1),
                region.clone(),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        assert_ne!(e.lkey, e.rkey);
        let va = region.addr();
        let w = AccessFlags::REMOTE_WRITE;
        let r = t.remote(PdId(1), e.rkey, va + 10, 100, w).unwrap();
        assert_eq!((r.addr(), r.len()), (va + 10, 100));
        assert_eq!(
            t.remote(PdId(1), e.rkey ^ 1, va, 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert_eq!(
            t.remote(PdId(1), e.lkey, va, 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert_eq!(
            t.remote(PdId(2), e.rkey, va, 1, w).err(),
            Some(RemoteKeyError::OtherPd)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va, 1, AccessFlags::REMOTE_READ)
                .err(),
            Some(RemoteKeyError::MissingAccess)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va + 999, 2, w).err(),
            Some(RemoteKeyError::OutOfBounds)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va - 1, 1, w).err(),
            Some(RemoteKeyError::OutOfBounds)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, u64::MAX - 1, 4, w).err(),
            Some(RemoteKeyError::OutOfBounds),
            "wrapping past 2^64"
        );
        let sge = Sge {
            addr: va,
            length: 10,
            lkey: e.lkey,
        };
        assert_eq!(t.local(PdId(1), &sge, true).unwrap().len(), 10);
        assert!(matches!(
            t.local(PdId(2), &sge, false),
            Err(Error::InvalidLkey { .. })
        ));
        let oob = Sge {
            addr: va + 995,
            length: 10,
            lkey: e.lkey,
        };
        assert!(matches!(
            t.local(PdId(1), &oob, false),
            Err(Error::SgeOutOfBounds { .. })
        ));
        let zero = Sge {
            addr: va,
            length: 0,
            lkey: e.lkey,
        };
        assert_eq!(t.local(PdId(1), &zero, false).unwrap().len(), 0);
        t.remove(&e);
        assert_eq!(
            t.remote(PdId(1), e.rkey, va, 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert!(t.local(PdId(1), &sge, false).is_err());
        assert!(t.is_empty());
    }

    #[test]
    fn read_only_region_refuses_local_write() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let e = t
            .insert(
                PdId(1),
                MemRegion::whole(buf.clone()),
                AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let sge = Sge {
            addr: buf.addr(),
            length: 8,
            lkey: e.lkey,
        };
        assert!(matches!(
            t.local(PdId(1), &sge, true),
            Err(Error::LocalAccess { .. })
        ));
        assert!(t.local(PdId(1), &sge, false).is_ok());
    }

    fn sge(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge { addr, length, lkey }
    }

    #[test]
    fn local_bounds_edges_and_wrap_around() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(256).unwrap());
        let region = MemRegion::new(buf.clone(), 64..192).unwrap();
        let e = t
            .insert(PdId(7), region.clone(), AccessFlags::LOCAL_WRITE)
            .unwrap();
        let (va, k) = (region.addr(), e.lkey);
        let whole = t.local(PdId(7), &sge(va, 128, k), true).unwrap();
        assert_eq!((whole.addr(), whole.len()), (va, 128));
        whole.write(0, &[9]).unwrap();
        assert_eq!(buf.to_vec(64, 1).unwrap(), [9], "shares the buffer");
        let mid = t.local(PdId(7), &sge(va + 5, 7, k), true).unwrap();
        assert_eq!((mid.addr(), mid.len()), (va + 5, 7));
        mid.write(0, &[8]).unwrap();
        assert_eq!(buf.to_vec(64 + 5, 1).unwrap(), [8]);
        let end = t.local(PdId(7), &sge(va + 128, 0, k), false).unwrap();
        assert_eq!(end.len(), 0, "zero length at the end is inside");
        let oob = |addr, len| {
            matches!(
                t.local(PdId(7), &sge(addr, len, k), false),
                Err(Error::SgeOutOfBounds { .. })
            )
        };
        assert!(oob(va + 129, 0), "zero length past the end");
        assert!(oob(va - 1, 1), "one byte before");
        assert!(oob(va + 127, 2), "one byte after");
        assert!(oob(va, u32::MAX), "longer than the region");
        assert!(oob(u64::MAX - 2, 8), "wraps past 2^64");
        assert!(oob(u64::MAX, u32::MAX), "wraps past 2^64");
        assert!(oob(0, 1));
        // The lkey is not an rkey and vice versa.
        assert!(matches!(
            t.local(PdId(7), &sge(va, 1, e.rkey), false),
            Err(Error::InvalidLkey { .. })
        ));
    }

    #[test]
    fn remote_edges_and_wrap_around() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(128).unwrap());
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let e = t
            .insert(PdId(1), MemRegion::whole(buf.clone()), all)
            .unwrap();
        let va = buf.addr();
        let r = AccessFlags::REMOTE_READ;
        assert_eq!(t.remote(PdId(1), e.rkey, va, 128, r).unwrap().len(), 128);
        assert_eq!(t.remote(PdId(1), e.rkey, va + 128, 0, r).unwrap().len(), 0);
        let need = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        assert!(t.remote(PdId(1), e.rkey, va + 8, 8, need).is_ok());
        for (addr, len) in [
            (va + 129, 0),
            (va, 129),
            (va + 1, u64::MAX),
            (u64::MAX, 1),
            (u64::MAX - 63, 128),
            (va, u64::MAX),
        ] {
            assert_eq!(
                t.remote(PdId(1), e.rkey, addr, len, r).err(),
                Some(RemoteKeyError::OutOfBounds),
                "[{addr:#x}, +{len})"
            );
        }
    }

    #[test]
    fn keys_in_use_are_never_reissued() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let a = t
            .insert(PdId(1), MemRegion::whole(buf.clone()), AccessFlags::empty())
            .unwrap();
        // Replay the generator as if 2^32 keys had been issued since `a`'s.
        t.tables.write().unwrap().keys.rewind(2);
        let b = t
            .insert(PdId(1), MemRegion::whole(buf.clone()), AccessFlags::empty())
            .unwrap();
        let keys = [a.lkey, a.rkey, b.lkey, b.rkey];
        assert!(keys.iter().all(|k| *k != 0));
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(keys[i], keys[j]);
            }
        }
        t.remove(&b);
        assert_eq!(t.len(), 1);
        let s = sge(buf.addr(), 1, a.lkey);
        assert!(t.local(PdId(1), &s, false).is_ok(), "a still registered");
        // Removing an entry twice, or one the table no longer holds, touches nothing else.
        t.remove(&b);
        assert!(t.local(PdId(1), &s, false).is_ok());
        t.remove(&a);
        assert!(t.is_empty());
    }

    #[test]
    fn max_mr_is_enforced() {
        let t = MrTable::new(2);
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let reg = || t.insert(PdId(1), MemRegion::whole(buf.clone()), AccessFlags::empty());
        let a = reg().unwrap();
        let _b = reg().unwrap();
        assert!(matches!(reg(), Err(Error::Exhausted(_))));
        t.remove(&a);
        assert!(reg().is_ok(), "room again after a deregistration");
    }

    #[test]
    fn lookups_spread_over_many_registrations() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let entries: Vec<_> = (0..2000)
            .map(|i| {
                t.insert(
                    PdId(i % 3),
                    MemRegion::whole(buf.clone()),
                    AccessFlags::REMOTE_READ,
                )
                .unwrap()
            })
            .collect();
        for e in &entries {
            let got = t
                .remote(e.pd, e.rkey, buf.addr(), 8, AccessFlags::REMOTE_READ)
                .unwrap();
            assert_eq!(got.len(), 8);
            assert!(t.local(e.pd, &sge(buf.addr(), 8, e.lkey), false).is_ok());
        }
        for e in &entries {
            t.remove(e);
        }
        assert!(t.is_empty());
    }
}
