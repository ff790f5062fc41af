//! A pool of pre-registered memory, so that allocating a memory region costs no
//! registration on the hot path.
//!
//! Size classes are powers of two from 64 bytes to 1 MiB. Each class carves slabs (at
//! least 256 KiB, registered once for local access) into blocks; a freed block returns to
//! its class's free list. Larger allocations get a registration of their own. Blocks are
//! aligned to their size (slabs are page aligned), so any alignment up to the block size
//! (at most a page) is honoured.
//!
//! A block lent to a peer (shared or given) is registered for remote access on its own,
//! a registration only its region holds; when the region is dropped, that registration
//! ends first and only then does the block return to its free list (the source of a large
//! message is registered for the peer by an entry that holds the region too, and ends its
//! registration first as well). So memory is never handed out again while a key a peer
//! holds may still reach it.

use crate::error::Result;
use remem_verbs::{AccessFlags, MemRegion, MemoryBuffer, MemoryRegion, ProtectionDomain};
use std::sync::{Arc, Mutex, Weak};

const MIN_SHIFT: u32 = 6;
const MAX_SHIFT: u32 = 20;
const SLAB: usize = 256 * 1024;
/// Alignment of slabs (MemoryBuffer allocations are page aligned).
const PAGE: usize = 4096;

/// Free blocks of one size class: their slab's registration and offset.
type FreeList = Mutex<Vec<(Arc<dyn MemoryRegion>, usize)>>;

/// The pool of one `Rdma` (one protection domain).
pub(crate) struct Pool {
    pd: Arc<dyn ProtectionDomain>,
    classes: Vec<FreeList>,
}

/// One allocated block: its slab's registration and offset. Dropping it frees the block.
pub(crate) struct Block {
    mr: Arc<dyn MemoryRegion>,
    offset: usize,
    class: usize,
    pool: Weak<Pool>,
}

impl Block {
    pub(crate) fn mr(&self) -> &Arc<dyn MemoryRegion> {
        &self.mr
    }

    pub(crate) fn offset(&self) -> usize {
        self.offset
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            let mut free = pool.classes[self.class]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            free.push((self.mr.clone(), self.offset));
        }
    }
}

impl Pool {
    pub(crate) fn new(pd: Arc<dyn ProtectionDomain>) -> Arc<Self> {
        Arc::new(Pool {
            pd,
            classes: (MIN_SHIFT..=MAX_SHIFT)
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
        })
    }

    /// The class serving `size` bytes at `align`, if the pool serves it.
    fn class_of(size: usize, align: usize) -> Option<usize> {
        let need = size
            .max(align)
            .max(1 << MIN_SHIFT)
            .checked_next_power_of_two()?;
        let shift = need.trailing_zeros();
        (shift <= MAX_SHIFT && align <= PAGE).then(|| (shift - MIN_SHIFT) as usize)
    }

    /// A block of at least `size` bytes aligned to `align`, or `None` when the pool does
    /// not serve that size (the caller registers memory of its own).
    pub(crate) fn alloc(self: &Arc<Self>, size: usize, align: usize) -> Result<Option<Block>> {
        let Some(class) = Self::class_of(size, align) else {
            return Ok(None);
        };
        let block_size = 1usize << (class as u32 + MIN_SHIFT);
        let mut free = self.classes[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if free.is_empty() {
            // A new slab, registered once, carved into blocks.
            let slab = SLAB.max(block_size);
            let region = MemRegion::whole(Arc::new(MemoryBuffer::zeroed(slab)?));
            let mr = self.pd.reg_mr(region, AccessFlags::LOCAL_WRITE)?;
            free.extend(
                (0..slab / block_size)
                    .rev()
                    .map(|i| (mr.clone(), i * block_size)),
            );
        }
        let Some((mr, offset)) = free.pop() else {
            return Ok(None);
        };
        Ok(Some(Block {
            mr,
            offset,
            class,
            pool: Arc::downgrade(self),
        }))
    }
}

#[cfg(test)]
impl Pool {
    /// Blocks on the free lists.
    pub(crate) fn free_blocks(&self) -> usize {
        self.classes
            .iter()
            .map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(Pool::class_of(1, 1), Some(0));
        assert_eq!(Pool::class_of(64, 8), Some(0));
        assert_eq!(Pool::class_of(65, 8), Some(1));
        assert_eq!(Pool::class_of(100, 4096), Some(6));
        assert_eq!(Pool::class_of(1 << 20, 8), Some(14));
        assert_eq!(Pool::class_of((1 << 20) + 1, 8), None);
        assert_eq!(Pool::class_of(64, 8192), None);
    }

    /// A protection domain whose registrations for remote access record, when they end,
    /// how many blocks the pool had free at that moment.
    struct WatchPd {
        pd: Arc<dyn ProtectionDomain>,
        pool: std::sync::OnceLock<Weak<Pool>>,
        free_at_dereg: Mutex<Vec<usize>>,
    }

    struct WatchMr {
        mr: Arc<dyn MemoryRegion>,
        pd: Arc<WatchPd>,
    }

    impl Drop for WatchMr {
        fn drop(&mut self) {
            if self.mr.access().intersects(AccessFlags::REMOTE)
                && let Some(pool) = self.pd.pool.get().and_then(Weak::upgrade)
            {
                let free = pool.free_blocks();
                self.pd.free_at_dereg.lock().unwrap().push(free);
            }
        }
    }

    impl MemoryRegion for WatchMr {
        fn lkey(&self) -> u32 {
            self.mr.lkey()
        }
        fn rkey(&self) -> u32 {
            self.mr.rkey()
        }
        fn region(&self) -> &MemRegion {
            self.mr.region()
        }
        fn access(&self) -> AccessFlags {
            self.mr.access()
        }
    }

    /// Registers through the inner PD; `Arc<WatchPd>` is what the pool gets.
    struct Watched(Arc<WatchPd>);

    impl ProtectionDomain for Watched {
        fn reg_mr(&self, region: MemRegion, access: AccessFlags) -> VResult<Arc<dyn MemoryRegion>> {
            Ok(Arc::new(WatchMr {
                mr: self.0.pd.reg_mr(region, access)?,
                pd: self.0.clone(),
            }))
        }
        fn create_qp(
            &self,
            init: &remem_verbs::QpInitAttr,
        ) -> VResult<Arc<dyn remem_verbs::QueuePair>> {
            self.0.pd.create_qp(init)
        }
        fn create_srq(
            &self,
            attr: remem_verbs::SrqAttr,
        ) -> VResult<Arc<dyn remem_verbs::SharedReceiveQueue>> {
            self.0.pd.create_srq(attr)
        }
        fn create_ah(
            &self,
            attr: &remem_verbs::AhAttr,
        ) -> VResult<Arc<dyn remem_verbs::AddressHandle>> {
            self.0.pd.create_ah(attr)
        }
    }

    type VResult<T> = remem_verbs::Result<T>;

    #[test]
    fn a_lent_block_returns_to_the_pool_only_after_its_registration_ended() {
        let ctx = crate::open_device(Some(&crate::test_util::fresh_device())).unwrap();
        let watch = Arc::new(WatchPd {
            pd: ctx.alloc_pd().unwrap(),
            pool: std::sync::OnceLock::new(),
            free_at_dereg: Mutex::new(Vec::new()),
        });
        let pd: Arc<dyn ProtectionDomain> = Arc::new(Watched(watch.clone()));
        let pool = Pool::new(pd.clone());
        let _ = watch.pool.set(Arc::downgrade(&pool));
        let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let region = |pool: &Arc<Pool>| {
            let block = pool.alloc(4096, 8).unwrap().unwrap();
            crate::mr::LocalMr::from_block(block, 4096, rights)
        };

        // Shared (registered for the peer), then dropped: the registration ends while the
        // block is still out of the pool, and only then does the block come back.
        let shared = region(&pool);
        shared.token(&pd).unwrap();
        let free = pool.free_blocks();
        drop(shared);
        assert_eq!(*watch.free_at_dereg.lock().unwrap(), [free]);
        assert_eq!(pool.free_blocks(), free + 1);

        // Given and taken back: the registration ends at once, the block stays with the
        // region (it is in use) and returns only when the region goes.
        watch.free_at_dereg.lock().unwrap().clear();
        let given = region(&pool);
        given.give_token(&pd).unwrap();
        let free = pool.free_blocks();
        let back = given.revoke_remote(&pd).unwrap();
        assert_eq!(*watch.free_at_dereg.lock().unwrap(), [free]);
        assert_eq!(pool.free_blocks(), free);
        // Lent again (a new registration), then dropped.
        back.token(&pd).unwrap();
        drop(back);
        assert_eq!(*watch.free_at_dereg.lock().unwrap(), [free, free]);
        assert_eq!(pool.free_blocks(), free + 1);
    }
}
