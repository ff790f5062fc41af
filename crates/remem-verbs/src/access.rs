//! Memory access rights (`enum ibv_access_flags`).

#![forbid(unsafe_code)]

bitflags::bitflags! {
    /// Access rights of a memory region or of a queue pair's responder
    /// (`enum ibv_access_flags`; the bit values are rdma-core's).
    ///
    /// Local read access is always granted. As in verbs, `REMOTE_WRITE` and `REMOTE_ATOMIC`
    /// require `LOCAL_WRITE` on a memory region (see [`AccessFlags::validate_for_mr`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the local NIC may write (receives, READ responses).
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: a peer may RDMA WRITE.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: a peer may RDMA READ.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: a peer may run atomics (CAS, fetch-add, atomic write).
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region.
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: remote addresses are offsets from the region's start.
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB`: the memory is backed by huge pages.
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_FLUSH_GLOBAL`: a peer may FLUSH with global visibility placement.
        const FLUSH_GLOBAL = 1 << 8;
        /// `IBV_ACCESS_FLUSH_PERSISTENT`: a peer may FLUSH with persistence placement.
        const FLUSH_PERSISTENT = 1 << 9;
        /// `IBV_ACCESS_RELAXED_ORDERING`: the NIC may reorder PCIe writes (a hint).
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// The rights a peer can use remotely.
    pub const REMOTE: AccessFlags = AccessFlags::REMOTE_READ
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_ATOMIC)
        .union(AccessFlags::FLUSH_GLOBAL)
        .union(AccessFlags::FLUSH_PERSISTENT);

    /// Checks the combination for a memory registration as `ibv_reg_mr` does:
    /// remote write or remote atomic access without local write is `EINVAL`.
    pub fn validate_for_mr(self) -> Result<(), &'static str> {
        if self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !self.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err("REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE");
        }
        Ok(())
    }

    /// Whether any remote right is granted (the region has an rkey a peer may use).
    pub fn is_remote(self) -> bool {
        self.intersects(Self::REMOTE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_values_match_rdma_core() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::FLUSH_GLOBAL.bits(), 256);
        assert_eq!(AccessFlags::FLUSH_PERSISTENT.bits(), 512);
    }

    #[test]
    fn remote_write_needs_local_write() {
        assert!(AccessFlags::REMOTE_WRITE.validate_for_mr().is_err());
        assert!(AccessFlags::REMOTE_ATOMIC.validate_for_mr().is_err());
        assert!(
            (AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE)
                .validate_for_mr()
                .is_ok()
        );
        assert!(AccessFlags::REMOTE_READ.validate_for_mr().is_ok());
        assert!(AccessFlags::empty().validate_for_mr().is_ok());
        assert!(!AccessFlags::LOCAL_WRITE.is_remote());
        assert!(AccessFlags::REMOTE_READ.is_remote());
    }
}
