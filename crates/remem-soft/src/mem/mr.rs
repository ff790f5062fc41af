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
//!
//! **Memory windows** (`ibv_alloc_mw`, type 1 and 2) live in the same rkey namespace. A
//! window owns the upper 24 bits of its rkey (an index no registration's key shares; the
//! low 8 bits are the key byte the consumer picks at each bind, as rxe does). Binding it
//! to a range of a region that has `MW_BIND` puts an entry of its own in the rkey table: a
//! [`KeyedRegion`] over that sub-range with the window's access, resolved by the responder
//! exactly like a region's. Rebinding, invalidating (local or remote, type 2 only) and
//! deallocating remove that entry and revoke it the way deregistration revokes a region's
//! — when the call returns no grant resolved through the old rkey touches the memory. A
//! type 2 window is reached only through the QP it was bound on. Deregistering a region
//! revokes the windows bound to it too (the verbs layer refuses that first, as rxe does:
//! [`MrTable::windows_bound`]).

use crate::mem::PdId;
use crate::mem::RemoteKeyError;
use crate::mem::grant::{Grant, KeyedRegion};
use crate::mem::keys::KeyGen;
pub use remem_verbs::MwType;
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
    /// Local key (0 for a memory window's entry, which has none).
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// For a type 2 memory window's entry: the QP it was bound on, the only one whose
    /// peer may use the rkey.
    pub window_qpn: Option<u32>,
    /// Memory windows bound to this region now.
    windows: std::sync::atomic::AtomicU32,
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
    /// Memory windows, by the upper 24 bits of their rkeys.
    mws: HashMap<u32, MwSlot, BuildHasherDefault<KeyHasher>>,
}

impl Tables {
    /// The next key in use by no registration and outside every memory window's index
    /// (keys repeat only after 2^32 have been issued; a long-lived registration's key is
    /// then skipped, never shared).
    fn fresh_key(&mut self) -> u32 {
        loop {
            let k = self.keys.next_key();
            if !self.by_lkey.contains_key(&k)
                && !self.by_rkey.contains_key(&k)
                && !self.mws.contains_key(&(k >> 8))
            {
                return k;
            }
        }
    }

    /// A fresh memory window rkey: its upper 24 bits (non-zero) are shared by no key in
    /// use and no other window.
    fn fresh_window_key(&mut self) -> u32 {
        loop {
            let k = self.keys.next_key();
            let index = k >> 8;
            if index == 0 || self.mws.contains_key(&index) {
                continue;
            }
            let taken = (0..=0xffu32).any(|b| {
                let key = (index << 8) | b;
                self.by_lkey.contains_key(&key) || self.by_rkey.contains_key(&key)
            });
            if !taken {
                return k;
            }
        }
    }

    /// Takes a window's binding out of the rkey table (the caller revokes the entry it
    /// returns, outside the lock).
    fn unbind(&mut self, index: u32) -> Option<Arc<MrEntry>> {
        let slot = self.mws.get_mut(&index)?;
        let b = slot.bound.take()?;
        if self
            .by_rkey
            .get(&b.entry.rkey)
            .is_some_and(|x| Arc::ptr_eq(x, &b.entry))
        {
            self.by_rkey.remove(&b.entry.rkey);
        }
        b.mr.windows
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        Some(b.entry)
    }
}

/// Why a memory window operation was refused (each is a bind error or an invalidation
/// error completion at the verbs layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwError {
    /// No memory window has this rkey's index (deallocated, or never allocated).
    UnknownWindow,
    /// The rkey is a memory region's: regions from `reg_mr` cannot be invalidated.
    NotAWindow,
    /// The rkey's key byte is not the window's current one.
    WrongKey,
    /// A type 2 window bound already (bind), or not bound (invalidate).
    InvalidState,
    /// Type 1 windows are not invalidated (they are unbound by a zero-length bind).
    TypeOne,
    /// The QP, window or region belong to different protection domains.
    OtherPd,
    /// Remote invalidation by a QP other than the one the window was bound on.
    OtherQp,
    /// A type 2 bind without a region or with length 0.
    NoRegion,
    /// The region is not registered (any more).
    UnknownRegion,
    /// The region lacks `MW_BIND` (C10-73).
    NoBindAccess,
    /// Remote write or atomic rights on a region without `LOCAL_WRITE` (C10-74).
    NeedsLocalWrite,
    /// The range is not inside the region (C10-75).
    OutOfBounds,
    /// Zero-based windows or regions are not supported.
    ZeroBased,
}

/// What the table knows of a memory window.
#[derive(Debug)]
struct MwSlot {
    pd: PdId,
    ty: MwType,
    /// The current rkey (index and key byte).
    rkey: u32,
    bound: Option<BoundWindow>,
}

/// A window's binding: its entry in the rkey table and the region it opens.
#[derive(Debug)]
struct BoundWindow {
    entry: Arc<MrEntry>,
    mr: Arc<MrEntry>,
}

/// Where a bind puts a window: `len` bytes at `addr` of `mr`, with `access`.
#[derive(Debug, Clone)]
pub struct MwBind<'a> {
    /// The region (None, or `len` 0: a type 1 window is unbound).
    pub mr: Option<&'a Arc<MrEntry>>,
    /// Start address (inside the region).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The window's rights (`IBV_ACCESS_REMOTE_*`).
    pub access: AccessFlags,
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
    /// Makes every key handed out from now on carry `prefix` in its top 8 bits (a shared
    /// device's slot: keys unique on the host; see `io::host`).
    pub fn set_key_prefix(&self, prefix: u8) {
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        t.keys.set_prefix(prefix);
    }

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
            window_qpn: None,
            windows: Default::default(),
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
        let mut windows = Vec::new();
        {
            let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
            if t.by_lkey.get(&e.lkey).is_some_and(|x| Arc::ptr_eq(x, e)) {
                t.by_lkey.remove(&e.lkey);
            }
            if t.by_rkey.get(&e.rkey).is_some_and(|x| Arc::ptr_eq(x, e)) {
                t.by_rkey.remove(&e.rkey);
            }
            // Windows still bound to it lose their binding with it.
            if Self::bound_to(e) > 0 {
                let bound: Vec<u32> = t
                    .mws
                    .iter()
                    .filter(|(_, s)| s.bound.as_ref().is_some_and(|b| Arc::ptr_eq(&b.mr, e)))
                    .map(|(i, _)| *i)
                    .collect();
                windows.extend(bound.into_iter().filter_map(|i| t.unbind(i)));
            }
        }
        // Outside the table's lock: lookups of other keys need not wait for a copy.
        e.key.revoke();
        for w in windows {
            w.key.revoke();
        }
    }

    fn bound_to(e: &MrEntry) -> u32 {
        e.windows.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The memory windows bound to a region now (`ibv_dereg_mr` refuses a region with
    /// any, as rxe does).
    pub fn windows_bound(&self, e: &MrEntry) -> u32 {
        Self::bound_to(e)
    }

    /// Allocates a memory window of `ty` in `pd`, unbound: its rkey (`ibv_mw.rkey`).
    pub fn alloc_mw(&self, pd: PdId, ty: MwType) -> u32 {
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let rkey = t.fresh_window_key();
        t.mws.insert(
            rkey >> 8,
            MwSlot {
                pd,
                ty,
                rkey,
                bound: None,
            },
        );
        rkey
    }

    /// Deallocates the window of `rkey` (its index: the key byte may be any), revoking its
    /// binding: once this returns, no access through it touches memory.
    pub fn dealloc_mw(&self, rkey: u32) -> std::result::Result<(), MwError> {
        let old = {
            let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
            let index = rkey >> 8;
            if !t.mws.contains_key(&index) {
                return Err(MwError::UnknownWindow);
            }
            let old = t.unbind(index);
            t.mws.remove(&index);
            old
        };
        if let Some(e) = old {
            e.key.revoke();
        }
        Ok(())
    }

    /// Binds the window `mw` (its current rkey: another key byte is
    /// [`MwError::WrongKey`]) for a QP `qpn` of `pd` to `to`, giving it the key byte
    /// `key`: the window's new rkey. Checked as rxe checks a bind (key, state, PDs,
    /// `MW_BIND`, C10-74, bounds); a refused bind changes nothing. The old binding
    /// is revoked before this returns.
    pub fn bind_mw(
        &self,
        mw: u32,
        pd: PdId,
        qpn: u32,
        key: u8,
        to: &MwBind<'_>,
    ) -> std::result::Result<u32, MwError> {
        let index = mw >> 8;
        let old;
        let new_rkey;
        {
            let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
            let slot = t.mws.get(&index).ok_or(MwError::UnknownWindow)?;
            if slot.rkey != mw {
                return Err(MwError::WrongKey);
            }
            let ty = slot.ty;
            if ty == MwType::Two && slot.bound.is_some() {
                return Err(MwError::InvalidState);
            }
            if slot.pd != pd {
                return Err(MwError::OtherPd);
            }
            let target = to.mr.filter(|_| to.len > 0);
            if ty == MwType::Two && target.is_none() {
                return Err(MwError::NoRegion);
            }
            if to.access.contains(AccessFlags::ZERO_BASED) {
                return Err(MwError::ZeroBased);
            }
            let sub = match target {
                None => None,
                Some(mr) => {
                    if !t.by_lkey.get(&mr.lkey).is_some_and(|x| Arc::ptr_eq(x, mr)) {
                        return Err(MwError::UnknownRegion);
                    }
                    if mr.pd != pd {
                        return Err(MwError::OtherPd);
                    }
                    if mr.access.contains(AccessFlags::ZERO_BASED) {
                        return Err(MwError::ZeroBased);
                    }
                    if !mr.access.contains(AccessFlags::MW_BIND) {
                        return Err(MwError::NoBindAccess);
                    }
                    if to
                        .access
                        .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                        && !mr.access.contains(AccessFlags::LOCAL_WRITE)
                    {
                        return Err(MwError::NeedsLocalWrite);
                    }
                    let region = mr.region();
                    let at = region
                        .offset_of(to.addr, to.len)
                        .map_err(|_| MwError::OutOfBounds)?;
                    let len = usize::try_from(to.len).map_err(|_| MwError::OutOfBounds)?;
                    let sub = MemRegion::new(region.buffer().clone(), at..at + len)
                        .map_err(|_| MwError::OutOfBounds)?;
                    Some((Arc::clone(mr), sub))
                }
            };
            old = t.unbind(index);
            new_rkey = (mw & !0xff) | u32::from(key);
            let slot = t.mws.get_mut(&index).ok_or(MwError::UnknownWindow)?;
            slot.rkey = new_rkey;
            if let Some((mr, sub)) = sub {
                let entry = Arc::new(MrEntry {
                    pd,
                    key: KeyedRegion::new(sub),
                    access: to.access & AccessFlags::REMOTE,
                    lkey: 0,
                    rkey: new_rkey,
                    window_qpn: (ty == MwType::Two).then_some(qpn),
                    windows: Default::default(),
                });
                mr.windows.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                slot.bound = Some(BoundWindow {
                    entry: Arc::clone(&entry),
                    mr,
                });
                t.by_rkey.insert(new_rkey, entry);
            }
        }
        if let Some(e) = old {
            e.key.revoke();
        }
        Ok(new_rkey)
    }

    /// Invalidates the type 2 window of `rkey` for a QP `qpn` of `pd` (local invalidate,
    /// or `remote`: a SEND with invalidate received on that QP, which must be the one the
    /// window was bound on). The window is free again and its rkey revoked when this
    /// returns.
    pub fn invalidate(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        remote: bool,
    ) -> std::result::Result<(), MwError> {
        let old = {
            let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
            let Some(slot) = t.mws.get(&(rkey >> 8)) else {
                return Err(if t.by_rkey.contains_key(&rkey) {
                    MwError::NotAWindow
                } else {
                    MwError::UnknownWindow
                });
            };
            if slot.ty == MwType::One {
                return Err(MwError::TypeOne);
            }
            if slot.rkey != rkey {
                return Err(MwError::WrongKey);
            }
            if slot.pd != pd {
                return Err(MwError::OtherPd);
            }
            let Some(b) = &slot.bound else {
                return Err(MwError::InvalidState);
            };
            if remote && b.entry.window_qpn != Some(qpn) {
                return Err(MwError::OtherQp);
            }
            t.unbind(rkey >> 8)
        };
        if let Some(e) = old {
            e.key.revoke();
        }
        Ok(())
    }

    /// The registration whose lkey is `lkey` (what a bind names the region by).
    pub fn by_lkey(&self, lkey: u32) -> Option<Arc<MrEntry>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_lkey
            .get(&lkey)
            .cloned()
    }

    /// The memory windows allocated now.
    pub fn windows(&self) -> usize {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .mws
            .len()
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
    /// out of bounds. The grant works until the region is deregistered. A type 2 window's
    /// QP is not checked: responders use [`MrTable::remote_on`].
    #[cfg(any(test, feature = "internals"))]
    pub fn remote(
        &self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        Self::granted(&t, pd, None, rkey, need)?.key.grant(va, len)
    }

    /// [`MrTable::remote`] for a request that arrived on QP `qpn`: a type 2 memory
    /// window's rkey works only on the QP it was bound on
    /// ([`RemoteKeyError::OtherQp`]).
    pub fn remote_on(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        Self::granted(&t, pd, Some(qpn), rkey, need)?
            .key
            .grant(va, len)
    }

    /// Resolves a remote key to a grant for its whole region (a FLUSH of the memory
    /// region), with the same key, PD and access checks as [`MrTable::remote`].
    #[cfg(any(test, feature = "internals"))]
    pub fn remote_region(
        &self,
        pd: PdId,
        rkey: u32,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        Self::granted(&t, pd, None, rkey, need)?.key.grant_all()
    }

    /// [`MrTable::remote_region`] for a request that arrived on QP `qpn` (see
    /// [`MrTable::remote_on`]).
    pub fn remote_region_on(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        Self::granted(&t, pd, Some(qpn), rkey, need)?
            .key
            .grant_all()
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

    /// The entry of `rkey` if it is in `pd` (and, for a type 2 window, bound on QP
    /// `qpn` when one is given) and grants `need` (rxe's order of checks).
    fn granted(
        t: &Tables,
        pd: PdId,
        qpn: Option<u32>,
        rkey: u32,
        need: AccessFlags,
    ) -> std::result::Result<&MrEntry, RemoteKeyError> {
        let e = t.by_rkey.get(&rkey).ok_or(RemoteKeyError::UnknownKey)?;
        if e.pd != pd {
            return Err(RemoteKeyError::OtherPd);
        }
        if let (Some(bound), Some(q)) = (e.window_qpn, qpn)
            && bound != q
        {
            return Err(RemoteKeyError::OtherQp);
        }
        if !e.access.contains(need) {
            return Err(RemoteKeyError::MissingAccess);
        }
        Ok(e)
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

    // ----- memory windows ------------------------------------------------------------

    /// A table with one 4 KiB region of PD 1 (`access`), its buffer and entry.
    fn bindable(access: AccessFlags) -> (MrTable, Arc<MemoryBuffer>, Arc<MrEntry>) {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
        let e = t
            .insert(PdId(1), MemRegion::whole(buf.clone()), access)
            .unwrap();
        (t, buf, e)
    }

    const RW: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);

    fn to<'a>(mr: &'a Arc<MrEntry>, addr: u64, len: u64, access: AccessFlags) -> MwBind<'a> {
        MwBind {
            mr: Some(mr),
            addr,
            len,
            access,
        }
    }

    #[test]
    fn a_window_grants_its_range_with_its_rights_and_a_new_key_byte() {
        let (t, buf, e) = bindable(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let mw = t.alloc_mw(PdId(1), MwType::One);
        assert_ne!(mw >> 8, e.rkey >> 8, "a window's index is its own");
        assert_ne!(mw >> 8, e.lkey >> 8);
        // Unbound, its rkey opens nothing.
        let w = AccessFlags::REMOTE_WRITE;
        assert_eq!(
            t.remote(PdId(1), mw, buf.addr(), 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        let va = buf.addr() + 1024;
        let rkey = t
            .bind_mw(mw, PdId(1), 5, 0x42, &to(&e, va, 512, RW))
            .unwrap();
        assert_eq!(rkey, (mw & !0xff) | 0x42, "the consumer's key byte");
        assert_eq!(t.windows_bound(&e), 1);
        let g = t.remote(PdId(1), rkey, va + 8, 16, w).unwrap();
        g.write(0, b"through the MW!!").unwrap();
        assert_eq!(buf.to_vec(1024 + 8, 16).unwrap(), b"through the MW!!");
        // Its range, not the region's; its rights, not the region's (which has none).
        for (addr, len) in [(va - 1, 1), (va + 500, 13), (buf.addr(), 8)] {
            assert_eq!(
                t.remote(PdId(1), rkey, addr, len, w).err(),
                Some(RemoteKeyError::OutOfBounds)
            );
        }
        assert_eq!(
            t.remote(PdId(1), rkey, va, 8, AccessFlags::REMOTE_ATOMIC)
                .err(),
            Some(RemoteKeyError::MissingAccess)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va, 8, w).err(),
            Some(RemoteKeyError::MissingAccess),
            "the region itself grants nothing remote"
        );
        assert_eq!(
            t.remote(PdId(2), rkey, va, 8, w).err(),
            Some(RemoteKeyError::OtherPd)
        );
        // Rebinding a type 1 window revokes the old rkey (and grants from it) at once.
        let again = t
            .bind_mw(rkey, PdId(1), 5, 0x43, &to(&e, va, 8, RW))
            .unwrap();
        assert!(g.is_revoked());
        assert_eq!(
            g.write(0, b"x"),
            Err(crate::transport::AccessError::Revoked)
        );
        assert_eq!(
            t.remote(PdId(1), rkey, va, 8, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert!(t.remote(PdId(1), again, va, 8, w).is_ok());
        assert_eq!(t.windows_bound(&e), 1);
        // A zero-length bind unbinds it; type 1 windows are never invalidated.
        let none = MwBind {
            mr: None,
            addr: 0,
            len: 0,
            access: RW,
        };
        let unbound = t.bind_mw(again, PdId(1), 5, 0x44, &none).unwrap();
        assert_eq!(t.windows_bound(&e), 0);
        assert_eq!(
            t.remote(PdId(1), again, va, 8, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert_eq!(
            t.invalidate(PdId(1), 5, unbound, false),
            Err(MwError::TypeOne)
        );
        t.dealloc_mw(unbound).unwrap();
        assert_eq!(t.windows(), 0);
        assert_eq!(t.dealloc_mw(unbound), Err(MwError::UnknownWindow));
    }

    #[test]
    fn binds_are_checked_as_rxe_checks_them() {
        let (t, buf, e) = bindable(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let va = buf.addr();
        let mw = t.alloc_mw(PdId(1), MwType::Two);
        let bind = |b: &MwBind<'_>| t.bind_mw(mw, PdId(1), 9, 1, b);
        assert_eq!(
            t.bind_mw(mw, PdId(2), 9, 1, &to(&e, va, 8, RW)),
            Err(MwError::OtherPd),
            "QP of another PD (C10-72)"
        );
        let none = MwBind {
            mr: None,
            addr: 0,
            len: 0,
            access: RW,
        };
        assert_eq!(bind(&none), Err(MwError::NoRegion), "type 2 needs a region");
        assert_eq!(bind(&to(&e, va, 0, RW)), Err(MwError::NoRegion));
        assert_eq!(bind(&to(&e, va + 4000, 100, RW)), Err(MwError::OutOfBounds));
        assert_eq!(bind(&to(&e, va - 8, 16, RW)), Err(MwError::OutOfBounds));
        assert_eq!(
            bind(&to(&e, va, 8, RW | AccessFlags::ZERO_BASED)),
            Err(MwError::ZeroBased)
        );
        // The region needs MW_BIND (C10-73), and LOCAL_WRITE for remote write rights
        // (C10-74); it must be of the PD and still registered.
        let nobind = t
            .insert(
                PdId(1),
                MemRegion::whole(buf.clone()),
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap();
        assert_eq!(bind(&to(&nobind, va, 8, RW)), Err(MwError::NoBindAccess));
        let ro = t
            .insert(PdId(1), MemRegion::whole(buf.clone()), AccessFlags::MW_BIND)
            .unwrap();
        assert_eq!(bind(&to(&ro, va, 8, RW)), Err(MwError::NeedsLocalWrite));
        assert!(
            t.bind_mw(mw, PdId(1), 9, 1, &to(&ro, va, 8, AccessFlags::REMOTE_READ))
                .is_ok()
        );
        let mw2 = t.alloc_mw(PdId(1), MwType::Two);
        let other = t
            .insert(
                PdId(2),
                MemRegion::whole(buf.clone()),
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            )
            .unwrap();
        assert_eq!(
            t.bind_mw(mw2, PdId(1), 9, 1, &to(&other, va, 8, RW)),
            Err(MwError::OtherPd)
        );
        t.remove(&other);
        let gone = other;
        assert_eq!(
            t.bind_mw(mw2, PdId(1), 9, 1, &to(&gone, va, 8, RW)),
            Err(MwError::UnknownRegion)
        );
        // A bound type 2 window cannot be bound again until invalidated.
        let rkey = t.bind_mw(mw2, PdId(1), 9, 7, &to(&e, va, 8, RW)).unwrap();
        assert_eq!(
            t.bind_mw(rkey, PdId(1), 9, 8, &to(&e, va, 8, RW)),
            Err(MwError::InvalidState)
        );
        assert_eq!(t.windows_bound(&e), 1);
    }

    #[test]
    fn type_two_windows_belong_to_their_qp_and_are_invalidated() {
        let (t, buf, e) = bindable(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let va = buf.addr();
        let mw = t.alloc_mw(PdId(1), MwType::Two);
        let rkey = t
            .bind_mw(mw, PdId(1), 9, 0x10, &to(&e, va, 64, RW))
            .unwrap();
        let w = AccessFlags::REMOTE_WRITE;
        assert!(t.remote_on(PdId(1), 9, rkey, va, 8, w).is_ok());
        assert_eq!(
            t.remote_on(PdId(1), 10, rkey, va, 8, w).err(),
            Some(RemoteKeyError::OtherQp),
            "another QP of the PD"
        );
        let held = t.remote_region_on(PdId(1), 9, rkey, w).unwrap();
        assert_eq!(held.len(), 64);
        // Invalidation: the exact rkey, a window (not a region), the PD, remote only
        // from its QP; then it is free and its rkey dead.
        assert_eq!(
            t.invalidate(PdId(1), 9, rkey ^ 1, false),
            Err(MwError::WrongKey)
        );
        assert_eq!(
            t.invalidate(PdId(1), 9, e.rkey, false),
            Err(MwError::NotAWindow)
        );
        assert_eq!(
            t.invalidate(PdId(1), 9, 0x100, false),
            Err(MwError::UnknownWindow)
        );
        assert_eq!(t.invalidate(PdId(2), 9, rkey, false), Err(MwError::OtherPd));
        assert_eq!(t.invalidate(PdId(1), 10, rkey, true), Err(MwError::OtherQp));
        t.invalidate(PdId(1), 10, rkey, false).unwrap();
        assert!(held.is_revoked(), "revoked when invalidate returns");
        assert_eq!(
            t.remote_on(PdId(1), 9, rkey, va, 8, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert_eq!(t.windows_bound(&e), 0);
        assert_eq!(
            t.invalidate(PdId(1), 9, rkey, true),
            Err(MwError::InvalidState)
        );
        // Free again: a new bind, remote invalidation from its QP.
        let rkey = t
            .bind_mw(rkey, PdId(1), 9, 0x11, &to(&e, va, 64, RW))
            .unwrap();
        t.invalidate(PdId(1), 9, rkey, true).unwrap();
        assert!(t.remote_on(PdId(1), 9, rkey, va, 8, w).is_err());
        // Deallocating a bound window revokes it too.
        let rkey = t
            .bind_mw(rkey, PdId(1), 9, 0x12, &to(&e, va, 64, RW))
            .unwrap();
        let held = t.remote_on(PdId(1), 9, rkey, va, 8, w).unwrap();
        t.dealloc_mw(rkey).unwrap();
        assert!(held.is_revoked());
        assert_eq!(t.windows_bound(&e), 0);
    }

    #[test]
    fn deregistering_a_region_revokes_its_windows() {
        let (t, buf, e) = bindable(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let va = buf.addr();
        let one = t.alloc_mw(PdId(1), MwType::One);
        let two = t.alloc_mw(PdId(1), MwType::Two);
        let k1 = t.bind_mw(one, PdId(1), 3, 1, &to(&e, va, 64, RW)).unwrap();
        let k2 = t
            .bind_mw(two, PdId(1), 3, 2, &to(&e, va + 64, 64, RW))
            .unwrap();
        assert_eq!(t.windows_bound(&e), 2);
        let w = AccessFlags::REMOTE_WRITE;
        let g1 = t.remote(PdId(1), k1, va, 8, w).unwrap();
        let g2 = t.remote(PdId(1), k2, va + 64, 8, w).unwrap();
        t.remove(&e);
        assert!(g1.is_revoked() && g2.is_revoked());
        assert!(t.remote(PdId(1), k1, va, 8, w).is_err());
        assert!(t.remote(PdId(1), k2, va + 64, 8, w).is_err());
        // The windows stay allocated, unbound (the type 2 one free again).
        assert_eq!(t.windows(), 2);
        assert_eq!(
            t.invalidate(PdId(1), 3, k2, false),
            Err(MwError::InvalidState)
        );
    }

    #[test]
    fn window_indexes_and_region_keys_never_meet() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let mws: Vec<u32> = (0..200).map(|_| t.alloc_mw(PdId(1), MwType::One)).collect();
        let mrs: Vec<_> = (0..200)
            .map(|_| {
                t.insert(PdId(1), MemRegion::whole(buf.clone()), AccessFlags::empty())
                    .unwrap()
            })
            .collect();
        let indexes: std::collections::HashSet<u32> = mws.iter().map(|k| k >> 8).collect();
        assert_eq!(indexes.len(), mws.len());
        assert!(mws.iter().all(|k| k >> 8 != 0));
        for e in &mrs {
            assert!(!indexes.contains(&(e.lkey >> 8)) && !indexes.contains(&(e.rkey >> 8)));
        }
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
