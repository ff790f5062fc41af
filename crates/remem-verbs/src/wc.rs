//! Work completions (`struct ibv_wc`).

#![forbid(unsafe_code)]

use std::fmt;

/// The outcome of a work request (`enum ibv_wc_status`; rdma-core's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`
    #[default]
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message longer than the receive buffer, or similar.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: internal QP consistency error.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR`
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`: a scatter/gather entry outside its memory region.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP went to the error state.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local protection error on incoming data.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused access (bad rkey, bounds, rights).
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the peer could not complete the operation.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: no acknowledgement after `retry_cnt` retransmissions.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive after `rnr_retry` tries.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR`
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR`
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`
    GeneralErr = 21,
}

impl WcStatus {
    /// The string `ibv_wc_status_str` gives, e.g. `"remote access error"`.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }

    /// Whether the work request succeeded.
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of work request completed (`enum ibv_wc_opcode`; rdma-core's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`
    #[default]
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`
    LocalInv = 6,
    /// `IBV_WC_TSO`
    Tso = 7,
    /// `IBV_WC_FLUSH`
    Flush = 8,
    /// `IBV_WC_ATOMIC_WRITE`
    AtomicWrite = 9,
    /// `IBV_WC_RECV`: a receive consumed by a SEND.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

bitflags::bitflags! {
    /// Completion flags (`enum ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold a GRH (UD).
        const GRH = 1;
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK`
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// The outcome.
    pub status: WcStatus,
    /// The kind of work request (valid on success; on error only for receives it is
    /// unspecified, as in verbs).
    pub opcode: WcOpcode,
    /// Provider-specific error detail.
    pub vendor_err: u32,
    /// Bytes received (receives), read (READ) or 8 (atomics).
    pub byte_len: u32,
    /// Immediate data in host order (with [`WcFlags::WITH_IMM`]), or the invalidated rkey
    /// (with [`WcFlags::WITH_INV`]) — the union `imm_data`/`invalidated_rkey` of `ibv_wc`.
    pub imm_data: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The source QP (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI QPs).
    pub pkey_index: u16,
    /// Source LID (InfiniBand).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// The immediate data, if the completion carries it.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }

    /// The invalidated rkey, if the completion carries one.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(self.imm_data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_rdma_core() {
        assert_eq!(WcStatus::RemAccessErr as u8, 10);
        assert_eq!(WcStatus::RetryExcErr as u8, 12);
        assert_eq!(WcStatus::GeneralErr as u8, 21);
        assert_eq!(WcOpcode::Recv as u8, 128);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u8, 129);
        assert_eq!(WcOpcode::AtomicWrite as u8, 9);
    }

    #[test]
    fn imm_only_with_flag() {
        let mut wc = WorkCompletion {
            imm_data: 42,
            ..Default::default()
        };
        assert_eq!(wc.imm(), None);
        wc.wc_flags = WcFlags::WITH_IMM;
        assert_eq!(wc.imm(), Some(42));
        assert_eq!(wc.invalidated_rkey(), None);
        assert_eq!(
            WcStatus::WrFlushErr.to_string(),
            "Work Request Flushed Error"
        );
    }
}
