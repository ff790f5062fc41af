//! Work queue entries: work requests after validation, with their scatter/gather entries
//! resolved to memory. Shared by the QP, the SRQ and the transport.

use remem_verbs::MemRegion;

/// Identifies a protection domain within a soft device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// A receive work request, validated: every scatter entry was resolved (at post time) to the
/// exact range of a memory region of the right PD with LOCAL_WRITE access.
#[derive(Debug, Clone)]
pub struct RecvWqe {
    /// The caller's `wr_id`.
    pub wr_id: u64,
    /// The scatter list: each region covers exactly one `ibv_sge`.
    pub sges: Vec<MemRegion>,
    /// Sum of the scatter entries' lengths.
    pub total_len: u64,
}
