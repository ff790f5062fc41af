//! Work requests (`struct ibv_send_wr`, `struct ibv_recv_wr`, `struct ibv_sge`).
//!
//! Work requests borrow their scatter/gather lists, so posting allocates nothing. Every
//! scatter/gather entry names memory by address and lkey; a provider posts an entry only if
//! it lies inside a memory region of the QP's protection domain (inline data included), so a
//! safe caller can never make a provider read or write memory that was not registered.

#![forbid(unsafe_code)]

use crate::provider::AddressHandle;
use std::sync::Arc;

/// One scatter/gather entry (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address (the memory region's virtual address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The local key of the memory region the entry lies in.
    pub lkey: u32,
}

bitflags::bitflags! {
    /// Send work request flags (`enum ibv_send_flags`; rdma-core's bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier RDMA READs and atomics to complete first.
        const FENCE = 1;
        /// `IBV_SEND_SIGNALED`: generate a completion on success.
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: set the solicited event bit (wakes `req_notify(true)`).
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: copy the data at post time; the buffers may be reused at once.
        const INLINE = 1 << 3;
    }
}

/// Where a RoCEv2 FLUSH places data (`IBV_FLUSH_GLOBAL` / `IBV_FLUSH_PERSISTENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushType {
    /// Global visibility: the data is visible to every agent at the target.
    Global,
    /// Persistence: the data is durable at the target.
    Persistent,
}

/// What a FLUSH covers (`IBV_FLUSH_RANGE` / `IBV_FLUSH_MR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushLevel {
    /// The range given by the remote address and length.
    Range,
    /// The whole memory region of the rkey.
    Region,
}

/// The operation of a send work request, with its operation-specific fields
/// (`ibv_send_wr.opcode` with `wr.rdma`, `wr.atomic`, `imm_data`, `invalidate_rkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: the immediate value is delivered with the receive completion.
    SendWithImm {
        /// Immediate data, in host order (sent big-endian).
        imm: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: the peer invalidates `rkey` on receipt.
    SendWithInv {
        /// The remote key to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: consumes a receive at the peer.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data, in host order.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`: the scatter list receives the data.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: 8 bytes at an 8-byte aligned address; the original value
    /// is written to the single 8-byte scatter entry.
    AtomicCmpAndSwp {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store when equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: the original value is written to the scatter entry.
    AtomicFetchAndAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add (wrapping).
        add: u64,
    },
    /// `IBV_WR_ATOMIC_WRITE`: an 8-byte write performed atomically at the target; the
    /// 8 bytes come from the gather list.
    AtomicWrite {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW` (and `ibv_bind_mw`): binds the memory window whose rkey is `mw` to
    /// `[addr, addr + len)` of the region whose lkey is `lkey` (0, or `len` 0: a type 1
    /// window is unbound), with `access` (`IBV_ACCESS_REMOTE_*`), giving it the rkey `rkey`
    /// (the window's index with a new key byte). Executed in send-queue order; a refused
    /// bind completes with `IBV_WC_MW_BIND_ERR` and the QP goes to the error state.
    BindMw {
        /// The window's current rkey.
        mw: u32,
        /// The rkey it gets (only its low 8 bits, the key byte, are the consumer's).
        rkey: u32,
        /// The local key of the region it opens (0: none).
        lkey: u32,
        /// Start address, inside the region.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// The window's rights.
        access: crate::AccessFlags,
    },
    /// `IBV_WR_LOCAL_INV`: invalidates the type 2 memory window of `rkey`, in send-queue
    /// order; a refused one completes with an error and the QP goes to the error state.
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_FLUSH`: make earlier writes to the range visible or persistent.
    Flush {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes to flush (ignored for [`FlushLevel::Region`]).
        len: u32,
        /// Placement type.
        flush_type: FlushType,
        /// Selectivity.
        level: FlushLevel,
    },
}

impl SendOp {
    /// The verbs name of the opcode, e.g. `"IBV_WR_RDMA_WRITE"`.
    pub fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "IBV_WR_SEND",
            SendOp::SendWithImm { .. } => "IBV_WR_SEND_WITH_IMM",
            SendOp::SendWithInv { .. } => "IBV_WR_SEND_WITH_INV",
            SendOp::RdmaWrite { .. } => "IBV_WR_RDMA_WRITE",
            SendOp::RdmaWriteWithImm { .. } => "IBV_WR_RDMA_WRITE_WITH_IMM",
            SendOp::RdmaRead { .. } => "IBV_WR_RDMA_READ",
            SendOp::AtomicCmpAndSwp { .. } => "IBV_WR_ATOMIC_CMP_AND_SWP",
            SendOp::AtomicFetchAndAdd { .. } => "IBV_WR_ATOMIC_FETCH_AND_ADD",
            SendOp::AtomicWrite { .. } => "IBV_WR_ATOMIC_WRITE",
            SendOp::Flush { .. } => "IBV_WR_FLUSH",
            SendOp::BindMw { .. } => "IBV_WR_BIND_MW",
            SendOp::LocalInv { .. } => "IBV_WR_LOCAL_INV",
        }
    }

    /// Whether the operation is executed by the local NIC alone (memory window bind, local
    /// invalidate): no packet, no local buffer.
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }

    /// Whether the operation is a READ or an atomic: it takes a responder resource
    /// (bounded by `max_rd_atomic`) and waits for a response carrying data.
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::AtomicCmpAndSwp { .. }
                | SendOp::AtomicFetchAndAdd { .. }
        )
    }

    /// Whether the operation takes an RDMA READ/atomic resource at the responder and is
    /// answered by a response rather than a plain ACK: READ, the atomics, ATOMIC WRITE and
    /// FLUSH (bounded by `max_rd_atomic` / `max_dest_rd_atomic`).
    pub fn uses_rd_atomic(&self) -> bool {
        self.is_read_or_atomic()
            || matches!(self, SendOp::AtomicWrite { .. } | SendOp::Flush { .. })
    }

    /// Whether the operation is allowed on a UD QP (only sends are).
    pub fn valid_on_ud(&self) -> bool {
        matches!(self, SendOp::Send | SendOp::SendWithImm { .. })
    }

    /// Whether the operation is allowed on a UC QP (sends, writes and the local memory
    /// window operations, as rxe allows them).
    pub fn valid_on_uc(&self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
                | SendOp::BindMw { .. }
                | SendOp::LocalInv { .. }
        )
    }
}

/// The destination of a send on a UD QP (`ibv_send_wr.wr.ud`).
#[derive(Clone)]
pub struct UdDest {
    /// The address handle naming the destination port.
    pub ah: Arc<dyn AddressHandle>,
    /// The destination QP number.
    pub remote_qpn: u32,
    /// The destination Q_Key (a value with the high bit set means "use the QP's Q_Key").
    pub remote_qkey: u32,
}

impl std::fmt::Debug for UdDest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdDest")
            .field("ah", &self.ah.attr())
            .field("remote_qpn", &self.remote_qpn)
            .field("remote_qkey", &self.remote_qkey)
            .finish()
    }
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone)]
pub struct SendWr<'a> {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// The gather list (data to send or write), or for READ and atomics the scatter list
    /// that receives the data.
    pub sg_list: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
    /// The destination, on a UD QP only.
    pub ud: Option<UdDest>,
}

impl<'a> SendWr<'a> {
    /// A signaled work request with no flags other than SIGNALED and no UD destination.
    pub fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }

    /// Total bytes of the scatter/gather list, or `None` on overflow of u64 (impossible
    /// for lists shorter than 2^32 entries).
    pub fn total_len(&self) -> u64 {
        self.sg_list.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The scatter list the received message is written to.
    pub sg_list: &'a [Sge],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_bits_match_rdma_core() {
        assert_eq!(SendFlags::FENCE.bits(), 1);
        assert_eq!(SendFlags::SIGNALED.bits(), 2);
        assert_eq!(SendFlags::SOLICITED.bits(), 4);
        assert_eq!(SendFlags::INLINE.bits(), 8);
    }

    #[test]
    fn total_len_sums_sges() {
        let sges = [
            Sge {
                addr: 0,
                length: u32::MAX,
                lkey: 1,
            },
            Sge {
                addr: 0,
                length: 10,
                lkey: 1,
            },
        ];
        let wr = SendWr::new(7, SendOp::Send, &sges);
        assert_eq!(wr.total_len(), u64::from(u32::MAX) + 10);
        assert_eq!(wr.op.name(), "IBV_WR_SEND");
    }

    #[test]
    fn op_classes() {
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 0,
        };
        assert!(read.is_read_or_atomic());
        assert!(!read.valid_on_uc());
        assert!(!read.valid_on_ud());
        assert!(SendOp::Send.valid_on_ud());
        assert!(
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0
            }
            .valid_on_uc()
        );
    }
}
