//! A pool of pre-registered memory, so that allocating a memory region costs no
//! registration on the hot path.
//!
//! Size classes are powers of two from 64 bytes to 1 MiB. Each class carves slabs (at
//! least 256 KiB, registered once for local access) into blocks; a freed block returns to
//! its class's free list. Larger allocations get a registration of their own. Blocks are
//! aligned to their size (slabs are page aligned), so any alignment up to the block size
//! (at most a page) is honoured.

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
}
