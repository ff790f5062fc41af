//! What a remote key resolves to, and its revocation.
//!
//! A responder resolves an rkey once per message (at a WRITE's FIRST packet, at a READ
//! request) and keeps the result for the packets that follow: the WRITE's MIDDLE and LAST,
//! the READ's response packets, a duplicate READ's replay. Deregistration must reach those
//! cached resolutions too, as a NIC's does (kernel rxe re-validates the key whenever it
//! continues or replays: `rxe_recheck_mr`). So a registration's memory is a [`KeyedRegion`]
//! shared by the key table and by every [`Grant`] resolved from it, and it carries one atomic
//! word: a revoked bit and the number of accesses in progress. Every access through a grant
//! enters (one atomic add, which also reads the revoked bit), touches memory and leaves (one
//! atomic subtract); [`KeyedRegion::revoke`] sets the bit and waits until the accesses that
//! entered before it have left. From the moment `revoke` returns, no grant reaches the
//! memory: no allocation, no lock, two uncontended atomic operations per packet.
//!
//! The lkey side works the same way: a work request's scatter/gather entries are grants
//! resolved from the lkey when it is posted, so a receive whose region is deregistered
//! before a SEND lands in it, or a SEND/WRITE whose source region is deregistered before
//! its packets are built, touches the memory no more (the work request completes with a
//! local protection error, as rxe's `copy_data` finds the lkey gone).

use super::RemoteKeyError;
use remem_verbs::{MemError, MemRegion};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The revoked bit of [`KeyedRegion::state`]; the bits below count accesses in progress.
const REVOKED: u64 = 1 << 63;

/// The memory a remote key opens, and whether the key still stands. Shared (in an `Arc`) by
/// the key table and every [`Grant`] resolved from the key.
#[derive(Debug)]
pub struct KeyedRegion {
    region: MemRegion,
    /// [`REVOKED`] | accesses in progress.
    state: AtomicU64,
}

impl KeyedRegion {
    /// A key's memory, not revoked.
    pub fn new(region: MemRegion) -> Arc<Self> {
        Arc::new(KeyedRegion {
            region,
            state: AtomicU64::new(0),
        })
    }

    /// The registered memory.
    pub fn region(&self) -> &MemRegion {
        &self.region
    }

    /// Whether the key was revoked.
    pub fn is_revoked(&self) -> bool {
        self.state.load(Ordering::Acquire) & REVOKED != 0
    }

    /// Revokes the key: once this returns, no grant resolved from it reads or writes the
    /// memory (accesses already in progress — at most one packet's copy, or the send of the
    /// batch of packets that references the memory ([`HeldRanges`]), each — are waited
    /// for). Idempotent.
    pub fn revoke(&self) {
        self.state.fetch_or(REVOKED, Ordering::AcqRel);
        let mut spins = 0u32;
        while self.state.load(Ordering::Acquire) & !REVOKED != 0 {
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Enters an access (one atomic add, which also reads the revoked bit); false, and
    /// nothing entered, if the key is revoked. Every `true` is matched by one
    /// [`KeyedRegion::leave`].
    fn try_enter(&self) -> bool {
        let prev = self.state.fetch_add(1, Ordering::Acquire);
        if prev & REVOKED != 0 {
            self.leave();
            return false;
        }
        true
    }

    /// Leaves an access entered with [`KeyedRegion::try_enter`].
    fn leave(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// Enters an access that leaves when dropped; `None` if the key is revoked.
    fn enter(&self) -> Option<Entered<'_>> {
        self.try_enter().then(|| Entered(self))
    }

    /// A grant for `[va, va + len)`, which must lie inside the region (checked without
    /// overflow); a revoked key is an unknown key.
    pub fn grant(self: &Arc<Self>, va: u64, len: u64) -> Result<Grant, RemoteKeyError> {
        if self.is_revoked() {
            return Err(RemoteKeyError::UnknownKey);
        }
        let offset = self
            .region
            .offset_of(va, len)
            .map_err(|_| RemoteKeyError::OutOfBounds)?;
        Ok(Grant {
            key: self.clone(),
            offset,
            len: usize::try_from(len).map_err(|_| RemoteKeyError::OutOfBounds)?,
        })
    }

    /// A grant for the whole region (a FLUSH of the memory region).
    pub fn grant_all(self: &Arc<Self>) -> Result<Grant, RemoteKeyError> {
        self.grant(self.region.addr(), self.region.len() as u64)
    }
}

/// An access in progress (leaves on drop).
struct Entered<'a>(&'a KeyedRegion);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// Why an access through a [`Grant`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// The key was revoked (its memory region deregistered) since the grant was resolved.
    Revoked,
    /// The memory refused the access (out of the grant's range, a failed persist).
    Mem(MemError),
}

/// A resolved access through a memory key: a range of a key's memory, usable until the key
/// is revoked — an rkey's at the responder, an lkey's in a posted work request. Offsets of
/// its methods are relative to the start of the range. Cloning it is one reference-count
/// increment.
#[derive(Debug, Clone)]
pub struct Grant {
    key: Arc<KeyedRegion>,
    /// Offset of the range inside the key's region.
    offset: usize,
    len: usize,
}

impl From<MemRegion> for Grant {
    /// A grant for the whole of `region` under a key of its own that nothing revokes
    /// (memory no registration guards: tests, the simulation).
    fn from(region: MemRegion) -> Self {
        let len = region.len();
        Grant {
            key: KeyedRegion::new(region),
            offset: 0,
            len,
        }
    }
}

impl Grant {
    /// Length of the granted range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Virtual address of the range.
    #[cfg(any(test, feature = "internals"))]
    pub fn addr(&self) -> u64 {
        self.key.region.addr() + self.offset as u64
    }

    /// Whether the key was revoked since the grant was resolved.
    pub fn is_revoked(&self) -> bool {
        self.key.is_revoked()
    }

    /// `offset..offset + n` of the range, as an offset in the key's region.
    fn at(&self, offset: usize, n: usize) -> Result<usize, MemError> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(MemError::OutOfBounds {
                offset: offset as u64,
                len: n as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Runs `f` on the key's region and the offset in it of `offset..offset + n` of the
    /// range, as one access: bounds first, then refused once the key is revoked.
    fn access<T>(
        &self,
        offset: usize,
        n: usize,
        f: impl FnOnce(&MemRegion, usize) -> Result<T, MemError>,
    ) -> Result<T, AccessError> {
        let at = self.at(offset, n).map_err(AccessError::Mem)?;
        let _entered = self.key.enter().ok_or(AccessError::Revoked)?;
        f(&self.key.region, at).map_err(AccessError::Mem)
    }

    /// Copies `src` into the range at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), AccessError> {
        self.access(offset, src.len(), |r, at| r.write(at, src))
    }

    /// Copies from the range at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), AccessError> {
        self.access(offset, dst.len(), |r, at| r.read(at, dst))
    }

    /// Atomic store of the u64 at `offset`.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        self.access(offset, 8, |r, at| r.store_u64(at, value))
    }

    /// Atomic compare-and-swap of the u64 at `offset`; returns the original value.
    pub fn compare_swap_u64(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, AccessError> {
        self.access(offset, 8, |r, at| r.compare_swap_u64(at, compare, swap))
    }

    /// Atomic fetch-and-add of the u64 at `offset`; returns the original value.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, AccessError> {
        self.access(offset, 8, |r, at| r.fetch_add_u64(at, add))
    }

    /// Makes the whole range durable (see [`MemRegion::persist`]).
    pub fn persist(&self) -> Result<(), AccessError> {
        self.access(0, self.len, |r, at| r.persist(at, self.len))
    }

    /// Enters an access that lasts until the returned [`Held`] is dropped (revocation waits
    /// for it); `None` if the key is revoked. For a check and a later copy that must not
    /// be split by a revocation: a READ response packet is decided, then its payload
    /// gathered when the packet is built.
    pub fn hold(self) -> Option<Held> {
        self.key.try_enter().then(|| Held { grant: self })
    }
}

/// A [`Grant`] in an access (see [`Grant::hold`]): its key cannot be revoked until this is
/// dropped.
#[derive(Debug)]
pub struct Held {
    grant: Grant,
}

impl Held {
    /// Copies from the range at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let g = &self.grant;
        g.key.region.read(g.at(offset, dst.len())?, dst)
    }

    /// Copies from the range at `offset` into `dst` through the kernel: memory the program
    /// unmapped under its registration fails the copy ([`MemError::Unmapped`]) instead of
    /// faulting the process (`MemoryBuffer::read_careful`). For a duplicate READ's replay,
    /// which may come after the requester completed the READ and the program let the
    /// memory go.
    pub fn read_careful(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let g = &self.grant;
        g.key.region.read_careful(g.at(offset, dst.len())?, dst)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.grant.key.leave();
    }
}

/// Ranges of keys' memory in accesses that last until they are dropped (their keys cannot be
/// revoked meanwhile, and their buffers stay allocated): a batch's packet payloads as the
/// driver's scatter/gather send references them, from the moment each packet is built
/// until the kernel has copied the batch.
///
/// Consecutive ranges of one key share one access (a [`Held`]: the key's `Arc` and an
/// entered access): a 64 KiB WRITE's sixteen packets cost one reference count and one
/// access for the batch, not one each. Adding a range of a key already held checks its
/// revoked bit instead (a load), so a deregistration that has begun stops new packets as
/// [`Grant::read`] would, and waits only for what was already built.
///
/// Its bytes are read, never referenced: [`HeldRanges::read_chunks`] (the ICRC),
/// [`HeldRanges::read`] (a packet materialized), and [`HeldRanges::ptr`], the address the
/// kernel copies from — while the application, or a peer's WRITE on the progress thread,
/// may be writing the same memory. A packet whose bytes change between its ICRC and the
/// kernel's copy fails the receiver's ICRC check and is dropped there (RC retransmits
/// it): the race a NIC reading host memory by DMA has.
#[derive(Debug, Default)]
pub struct HeldRanges {
    holds: Vec<Held>,
    /// (index in `holds`, offset in the key's region, length).
    ranges: Vec<(usize, usize, usize)>,
}

/// How far a [`HeldRanges`] was filled (see [`HeldRanges::mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    holds: usize,
    ranges: usize,
}

impl Mark {
    /// Index of the first range added after the mark.
    pub fn ranges(&self) -> usize {
        self.ranges
    }
}

impl HeldRanges {
    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are none.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of accesses held (at most one per run of ranges of one key).
    #[cfg(any(test, feature = "internals"))]
    pub fn holds(&self) -> usize {
        self.holds.len()
    }

    /// The last hold, if it is of `key`.
    fn last_of(&self, key: &Arc<KeyedRegion>) -> Option<usize> {
        let i = self.holds.len().checked_sub(1)?;
        Arc::ptr_eq(&self.holds[i].grant.key, key).then_some(i)
    }

    /// Adds `[offset, offset + n)` of `grant`'s range: [`AccessError::Revoked`] if its key
    /// is revoked (or being revoked), [`AccessError::Mem`] outside the range.
    pub fn push_grant(
        &mut self,
        grant: &Grant,
        offset: usize,
        n: usize,
    ) -> Result<(), AccessError> {
        let at = grant.at(offset, n).map_err(AccessError::Mem)?;
        let owner = match self.last_of(&grant.key) {
            Some(i) if !grant.key.is_revoked() => i,
            Some(_) => return Err(AccessError::Revoked),
            None => {
                let held = grant.clone().hold().ok_or(AccessError::Revoked)?;
                self.holds.push(held);
                self.holds.len() - 1
            }
        };
        self.ranges.push((owner, at, n));
        Ok(())
    }

    /// Adds `[offset, offset + n)` of a held grant's range (a READ response's region): it
    /// is within an access in progress, so only the bounds can fail.
    pub fn push_held(&mut self, held: &Held, offset: usize, n: usize) -> Result<(), MemError> {
        let at = held.grant.at(offset, n)?;
        let owner = match self.last_of(&held.grant.key) {
            Some(i) => i,
            None => {
                self.holds.push(held.share());
                self.holds.len() - 1
            }
        };
        self.ranges.push((owner, at, n));
        Ok(())
    }

    /// How far it is filled now.
    pub fn mark(&self) -> Mark {
        Mark {
            holds: self.holds.len(),
            ranges: self.ranges.len(),
        }
    }

    /// Drops what was added after `mark` (a packet that was not built).
    pub fn truncate(&mut self, mark: Mark) {
        self.ranges.truncate(mark.ranges);
        self.holds.truncate(mark.holds);
    }

    /// Moves the ranges added after `mark` into a new list (a packet that starts the next
    /// batch), with the holds they need: those added after `mark` move, one they share
    /// with the ranges before it is entered again (nested in the access it shares).
    pub fn split_off(&mut self, mark: Mark) -> HeldRanges {
        let moved = self.holds.split_off(mark.holds);
        let after = self.ranges.split_off(mark.ranges);
        // A range added after the mark reuses a hold from before it only while no hold was
        // added after it, and only the last one: at most one hold is shared.
        let mut out = HeldRanges::default();
        let shared = after.iter().any(|r| r.0 < mark.holds);
        if shared && let Some(last) = self.holds.last() {
            out.holds.push(last.share());
        }
        let base = usize::from(shared);
        out.ranges = after
            .into_iter()
            .map(|(owner, at, n)| {
                let owner = if owner < mark.holds {
                    0
                } else {
                    owner - mark.holds + base
                };
                (owner, at, n)
            })
            .collect();
        out.holds.extend(moved);
        out
    }

    /// Drops every range and hold (their accesses end).
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.holds.clear();
    }

    /// Length of range `i`.
    pub fn range_len(&self, i: usize) -> Option<usize> {
        self.ranges.get(i).map(|r| r.2)
    }

    fn region(&self, i: usize) -> Result<(&MemRegion, usize, usize), MemError> {
        let out = |size| MemError::OutOfBounds {
            offset: i as u64,
            len: 1,
            size,
        };
        let &(owner, at, n) = self.ranges.get(i).ok_or(out(self.ranges.len() as u64))?;
        let held = self.holds.get(owner).ok_or(out(self.holds.len() as u64))?;
        Ok((&held.grant.key.region, at, n))
    }

    /// Reads range `i` in chunks of at most `scratch.len()`, in order (see
    /// `MemoryBuffer::read_chunks`).
    pub fn read_chunks(
        &self,
        i: usize,
        scratch: &mut [u8],
        f: impl FnMut(&[u8]),
    ) -> Result<(), MemError> {
        let (region, at, n) = self.region(i)?;
        region.read_chunks(at, n, scratch, f)
    }

    /// Copies range `i` into `dst` (exactly its length).
    #[cfg(any(test, feature = "internals"))]
    pub fn read(&self, i: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let (region, at, n) = self.region(i)?;
        if dst.len() != n {
            return Err(MemError::OutOfBounds {
                offset: 0,
                len: dst.len() as u64,
                size: n as u64,
            });
        }
        region.read(at, dst)
    }

    /// The address of range `i`'s first byte, valid for reads of its length while this
    /// holds it, for a copy outside Rust's memory model only — see `MemoryBuffer::ptr_at`.
    pub fn ptr(&self, i: usize) -> Result<*const u8, MemError> {
        let (region, at, n) = self.region(i)?;
        region.ptr_at(at, n)
    }
}

impl Held {
    /// Another access to the same range, entered inside this one (which keeps the key from
    /// being revoked meanwhile, so it cannot fail).
    pub fn share(&self) -> Held {
        // Not `try_enter`: this access is part of one in progress (ours), so `revoke` is
        // still waiting for it if it has been called; the new count keeps it waiting.
        self.grant.key.state.fetch_add(1, Ordering::Acquire);
        Held {
            grant: self.grant.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::MemoryBuffer;
    use std::sync::atomic::AtomicBool;

    fn key(len: usize) -> (Arc<MemoryBuffer>, Arc<KeyedRegion>) {
        let buf = Arc::new(MemoryBuffer::zeroed(len).unwrap());
        let k = KeyedRegion::new(MemRegion::new(buf.clone(), 16..len).unwrap());
        (buf, k)
    }

    #[test]
    fn grants_are_bounded_to_their_range() {
        let (buf, k) = key(128);
        let va = k.region().addr();
        let g = k.grant(va + 8, 16).unwrap();
        assert_eq!((g.addr(), g.len()), (va + 8, 16));
        g.write(0, &[1; 16]).unwrap();
        assert_eq!(buf.to_vec(24, 16).unwrap(), vec![1; 16]);
        assert!(matches!(g.write(1, &[1; 16]), Err(AccessError::Mem(_))));
        assert!(matches!(
            g.read(usize::MAX, &mut [0; 2]),
            Err(AccessError::Mem(_))
        ));
        assert_eq!(g.fetch_add_u64(8, 2).unwrap(), 0x0101_0101_0101_0101);
        assert!(matches!(g.store_u64(9, 0), Err(AccessError::Mem(_))));
        assert_eq!(
            k.grant(va + 100, 13).err(),
            Some(RemoteKeyError::OutOfBounds)
        );
        assert_eq!(
            k.grant(u64::MAX - 3, 8).err(),
            Some(RemoteKeyError::OutOfBounds)
        );
        assert_eq!(k.grant_all().unwrap().len(), 112);
    }

    #[test]
    fn revocation_reaches_every_grant() {
        let (buf, k) = key(64);
        let va = k.region().addr();
        let g = k.grant(va, 8).unwrap();
        let copy = g.clone();
        g.store_u64(0, 7).unwrap();
        k.revoke();
        assert!(g.is_revoked() && copy.is_revoked());
        for g in [&g, &copy] {
            assert_eq!(g.write(0, &[9; 8]), Err(AccessError::Revoked));
            assert_eq!(g.read(0, &mut [0; 8]), Err(AccessError::Revoked));
            assert_eq!(g.fetch_add_u64(0, 1), Err(AccessError::Revoked));
            assert_eq!(g.compare_swap_u64(0, 7, 1), Err(AccessError::Revoked));
            assert_eq!(g.store_u64(0, 1), Err(AccessError::Revoked));
        }
        assert_eq!(buf.load_u64(16).unwrap(), 7, "untouched after revocation");
        assert_eq!(k.grant(va, 8).err(), Some(RemoteKeyError::UnknownKey));
        k.revoke(); // idempotent
    }

    #[test]
    fn revoke_waits_for_accesses_in_progress() {
        // A writer hammers the region through a grant; once `revoke` returns, the memory
        // never changes again.
        let (buf, k) = key(4096 + 16);
        let g = k.grant_all().unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let writer = {
            let started = started.clone();
            std::thread::spawn(move || {
                let mut n = 0u8;
                loop {
                    n = n.wrapping_add(1);
                    if g.write(0, &[n; 4096]).is_err() {
                        return;
                    }
                    started.store(true, Ordering::Release);
                }
            })
        };
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        k.revoke();
        let after = buf.to_vec(16, 4096).unwrap();
        writer.join().unwrap();
        assert_eq!(buf.to_vec(16, 4096).unwrap(), after);
        // Whole packets only: the copy in progress finished before `revoke` returned.
        assert!(after.iter().all(|&b| b == after[0]));
    }

    #[test]
    fn a_held_grant_delays_revocation() {
        let (buf, k) = key(64);
        buf.fill(16, 48, 5).unwrap();
        let held = k.grant_all().unwrap().hold().unwrap();
        let revoker = {
            let k = k.clone();
            std::thread::spawn(move || k.revoke())
        };
        // Revocation is under way (the bit is set) but waits for the holder.
        while !k.is_revoked() {
            std::hint::spin_loop();
        }
        let mut out = [0u8; 48];
        held.read(0, &mut out).unwrap();
        assert_eq!(out, [5; 48]);
        assert!(
            !revoker.is_finished(),
            "revoke returned while the grant was held"
        );
        drop(held);
        revoker.join().unwrap();
        assert!(k.grant_all().is_err());
        let g = Grant {
            key: k.clone(),
            offset: 0,
            len: 8,
        };
        assert!(g.hold().is_none(), "a revoked key cannot be held");
    }

    #[test]
    fn held_ranges_read_their_bytes_and_delay_revocation() {
        let (buf, k) = key(4096 + 16);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
        buf.write(16, &data).unwrap();
        let g = k.grant(k.region().addr() + 100, 3000).unwrap();
        let mut r = HeldRanges::default();
        r.push_grant(&g, 7, 2500).unwrap();
        r.push_grant(&g, 0, 10).unwrap();
        assert_eq!((r.len(), r.holds()), (2, 1), "one key, one access");
        assert_eq!(r.range_len(0), Some(2500));
        let mut got = Vec::new();
        r.read_chunks(0, &mut [0; 1000], |c| got.extend_from_slice(c))
            .unwrap();
        assert_eq!(got, &data[107..2607]);
        let mut copy = vec![0; 2500];
        r.read(0, &mut copy).unwrap();
        assert_eq!(copy, got);
        assert!(r.read(0, &mut [0; 3]).is_err(), "exactly its length");
        assert!(r.read(2, &mut [0; 3]).is_err(), "no such range");
        assert_eq!(r.ptr(1).unwrap() as u64, buf.addr() + 16 + 100);
        assert!(matches!(
            r.push_grant(&g, 1, 3000),
            Err(AccessError::Mem(_))
        ));
        // Another key: an access of its own.
        let (_buf2, k2) = key(64);
        r.push_grant(&k2.grant_all().unwrap(), 0, 8).unwrap();
        assert_eq!((r.len(), r.holds()), (3, 2));
        // A packet that was not built leaves nothing behind.
        let mark = r.mark();
        r.push_grant(&k2.grant_all().unwrap(), 8, 8).unwrap();
        r.push_grant(&g, 0, 1).unwrap();
        r.truncate(mark);
        assert_eq!((r.len(), r.holds()), (3, 2));
        // From a held grant (a READ response's region): nested in its access.
        let held = k.grant_all().unwrap().hold().unwrap();
        let mark = r.mark();
        r.push_held(&held, 4000, 96).unwrap();
        assert!(r.push_held(&held, 4000, 97).is_err());
        r.push_grant(&g, 2990, 10).unwrap();
        assert_eq!((r.len(), r.holds()), (5, 3));
        drop(held);
        // The ranges after the mark start a batch of their own, holding what they need.
        let mut next = r.split_off(mark);
        assert_eq!((r.len(), next.len(), next.holds()), (3, 2, 1));
        let mut tail = [0u8; 96];
        next.read(0, &mut tail).unwrap();
        assert_eq!(&tail[..], &data[4000..]);
        r.clear();
        // The ranges alone keep revocation waiting.
        let revoker = {
            let k = k.clone();
            std::thread::spawn(move || k.revoke())
        };
        while !k.is_revoked() {
            std::hint::spin_loop();
        }
        next.read(1, &mut [0; 10]).unwrap();
        assert!(
            !revoker.is_finished(),
            "revoke returned while a range was held"
        );
        assert!(
            matches!(next.push_grant(&g, 0, 1), Err(AccessError::Revoked)),
            "a key being revoked takes no new range"
        );
        assert!(matches!(
            HeldRanges::default().push_grant(&g, 0, 1),
            Err(AccessError::Revoked)
        ));
        next.clear();
        revoker.join().unwrap();
    }

    #[test]
    fn a_split_shares_the_hold_before_the_mark() {
        let (_buf, k) = key(1024);
        let g = k.grant_all().unwrap();
        let mut r = HeldRanges::default();
        r.push_grant(&g, 0, 100).unwrap();
        let mark = r.mark();
        r.push_grant(&g, 100, 100).unwrap(); // shares the hold before the mark
        let (_buf2, k2) = key(64);
        r.push_grant(&k2.grant_all().unwrap(), 0, 8).unwrap();
        r.push_grant(&g, 200, 8).unwrap(); // a new hold of the first key
        let next = r.split_off(mark);
        assert_eq!((r.len(), r.holds()), (1, 1));
        assert_eq!((next.len(), next.holds()), (3, 3));
        assert_eq!(next.ptr(0).unwrap(), r.ptr(0).unwrap().wrapping_add(100));
        assert_eq!(next.range_len(1), Some(8));
        assert_eq!(next.ptr(2).unwrap(), r.ptr(0).unwrap().wrapping_add(200));
        drop(r);
        // Every access ends with the lists.
        drop(next);
        k.revoke();
        k2.revoke();
    }
}
