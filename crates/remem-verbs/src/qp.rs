//! Queue pairs: types, states, attributes, attribute masks and the `ibv_modify_qp` rules.

#![forbid(unsafe_code)]

use crate::access::AccessFlags;
use crate::error::{Error, Result};
use crate::provider::{CompletionQueue, SharedReceiveQueue};
use crate::types::{Gid, Mtu};
use std::sync::Arc;

/// The transport service of a queue pair (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// `IBV_QPT_RC`: Reliable Connected.
    Rc,
    /// `IBV_QPT_UC`: Unreliable Connected.
    Uc,
    /// `IBV_QPT_UD`: Unreliable Datagram.
    Ud,
}

/// The state of a queue pair (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// `IBV_QPS_RESET`: just created, or reset; nothing can be posted.
    Reset = 0,
    /// `IBV_QPS_INIT`: receives may be posted; nothing is processed.
    Init = 1,
    /// `IBV_QPS_RTR`: Ready To Receive.
    Rtr = 2,
    /// `IBV_QPS_RTS`: Ready To Send.
    Rts = 3,
    /// `IBV_QPS_SQD`: Send Queue Drained.
    Sqd = 4,
    /// `IBV_QPS_SQE`: Send Queue Error (UC and UD only).
    Sqe = 5,
    /// `IBV_QPS_ERR`: every outstanding work request is flushed with `WR_FLUSH_ERR`.
    Err = 6,
}

impl QpState {
    /// Whether receive work requests may be posted (every state but RESET).
    pub fn can_post_recv(self) -> bool {
        self != QpState::Reset
    }

    /// Whether send work requests may be posted (RTS and SQD; in ERR they are accepted
    /// and flushed, as rdma-core providers do).
    pub fn can_post_send(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd | QpState::Err)
    }
}

bitflags::bitflags! {
    /// Which fields of a [`QpAttr`] a modify or query concerns (`enum ibv_qp_attr_mask`;
    /// the bit values are rdma-core's).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`
        const STATE = 1;
        /// `IBV_QP_CUR_STATE`
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`: the primary path's address vector.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`
        const RATE_LIMIT = 1 << 25;
    }
}

impl QpAttrMask {
    /// What `ibv_modify_qp` needs to move an RC QP from RESET to INIT (STATE included).
    pub const RC_TO_INIT: Self = Self::STATE
        .union(Self::PKEY_INDEX)
        .union(Self::PORT)
        .union(Self::ACCESS_FLAGS);
    /// What `ibv_modify_qp` needs to move an RC QP from INIT to RTR (STATE included).
    pub const RC_TO_RTR: Self = Self::STATE
        .union(Self::AV)
        .union(Self::PATH_MTU)
        .union(Self::DEST_QPN)
        .union(Self::RQ_PSN)
        .union(Self::MAX_DEST_RD_ATOMIC)
        .union(Self::MIN_RNR_TIMER);
    /// What `ibv_modify_qp` needs to move an RC QP from RTR to RTS (STATE included).
    pub const RC_TO_RTS: Self = Self::STATE
        .union(Self::TIMEOUT)
        .union(Self::RETRY_CNT)
        .union(Self::RNR_RETRY)
        .union(Self::SQ_PSN)
        .union(Self::MAX_QP_RD_ATOMIC);
    /// What `ibv_modify_qp` needs to move a UC QP from RESET to INIT (STATE included): as
    /// RC.
    pub const UC_TO_INIT: Self = Self::RC_TO_INIT;
    /// What `ibv_modify_qp` needs to move a UC QP from INIT to RTR (STATE included): the
    /// path and the peer, and no READ/atomic resources or RNR timer (UC has neither).
    pub const UC_TO_RTR: Self = Self::STATE
        .union(Self::AV)
        .union(Self::PATH_MTU)
        .union(Self::DEST_QPN)
        .union(Self::RQ_PSN);
    /// What `ibv_modify_qp` needs to move a UC QP from RTR to RTS (STATE included): the
    /// first PSN only (UC has no timeout, retries or READs).
    pub const UC_TO_RTS: Self = Self::STATE.union(Self::SQ_PSN);
}

/// The value of `rnr_retry` that means "retry for ever" (IBTA: 7 = infinite).
pub const RNR_RETRY_INFINITE: u8 = 7;

/// An address vector (`struct ibv_ah_attr` with its `ibv_global_route`).
///
/// On RoCE every path is global: `dgid` is the peer's GID and `sgid_index` selects the
/// local GID (hence the local IP address) the packets leave from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (`grh.dgid`).
    pub dgid: Gid,
    /// Flow label (`grh.flow_label`, 20 bits); on RoCEv2 it can pick the UDP source port.
    pub flow_label: u32,
    /// Index of the source GID in the local port's table (`grh.sgid_index`).
    pub sgid_index: u8,
    /// Hop limit (`grh.hop_limit`), the IP TTL.
    pub hop_limit: u8,
    /// Traffic class (`grh.traffic_class`), the IP DSCP/ECN byte.
    pub traffic_class: u8,
    /// Whether a GRH is used (`is_global`); always true on RoCE.
    pub is_global: bool,
    /// Destination LID (InfiniBand only).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate limit (`IBV_RATE_*`), 0 for none.
    pub static_rate: u8,
    /// Local port (1-based).
    pub port_num: u8,
    /// The UDP port the destination takes RoCEv2 packets on, a property of this path
    /// alone: packets of the QP or address handle go to the destination GID's IP address at
    /// this port, whatever the device was told of other paths. 0 (the default): the
    /// device's choice — [`ROCEV2_UDP_PORT`](crate::ROCEV2_UDP_PORT) on a NIC and kernel
    /// rxe, a soft device's default peer port (or the port the application set for that
    /// address with
    /// [`Context::set_peer_udp_port`](crate::Context::set_peer_udp_port)). A device that
    /// sends only to 4791 refuses another port
    /// ([`Context::can_send_to_udp_port`](crate::Context::can_send_to_udp_port)) with
    /// [`Error::Unsupported`]. A connected QP whose path names
    /// a port other than 4791 also takes packets only from that port (only soft devices
    /// receive elsewhere than 4791, and a soft device sends from the port it receives on;
    /// 4791 peers send from ports of their choosing).
    pub udp_port: u16,
}

impl Default for AhAttr {
    fn default() -> Self {
        AhAttr {
            dgid: Gid::ZERO,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            is_global: true,
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port_num: 1,
            udp_port: 0,
        }
    }
}

/// Queue sizes of a QP (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpCap {
    /// Most outstanding send work requests.
    pub max_send_wr: u32,
    /// Most outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Most scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Most scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Most bytes of inline data per send work request.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What a QP is created with (`struct ibv_qp_init_attr`).
#[derive(Clone)]
pub struct QpInitAttr {
    /// The transport service.
    pub qp_type: QpType,
    /// Where send completions go.
    pub send_cq: Arc<dyn CompletionQueue>,
    /// Where receive completions go (may be the same CQ as `send_cq`).
    pub recv_cq: Arc<dyn CompletionQueue>,
    /// A shared receive queue to take receives from instead of the QP's own.
    pub srq: Option<Arc<dyn SharedReceiveQueue>>,
    /// Requested queue sizes; the provider may round up and reports what it gave in
    /// [`QueuePair::cap`](crate::QueuePair::cap).
    pub cap: QpCap,
    /// `sq_sig_all`: every send work request completes with a CQE, SIGNALED or not.
    pub sq_sig_all: bool,
}

impl std::fmt::Debug for QpInitAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpInitAttr")
            .field("qp_type", &self.qp_type)
            .field("send_cq", &self.send_cq.id())
            .field("recv_cq", &self.recv_cq.id())
            .field("srq", &self.srq.as_ref().map(|s| s.srq_num()))
            .field("cap", &self.cap)
            .field("sq_sig_all", &self.sq_sig_all)
            .finish()
    }
}

/// QP attributes (`struct ibv_qp_attr`): what [`QueuePair::modify`](crate::QueuePair::modify)
/// sets (the fields a [`QpAttrMask`] names) and [`QueuePair::query`](crate::QueuePair::query)
/// reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// `qp_state`: the state to move to.
    pub qp_state: QpState,
    /// `cur_qp_state`: the state the caller believes the QP is in (with `CUR_STATE`).
    pub cur_qp_state: QpState,
    /// `path_mtu`.
    pub path_mtu: Mtu,
    /// `qkey` (UD).
    pub qkey: u32,
    /// `rq_psn`: the PSN the responder expects first (24 bits).
    pub rq_psn: u32,
    /// `sq_psn`: the PSN the requester sends first (24 bits).
    pub sq_psn: u32,
    /// `dest_qp_num`: the peer QP (24 bits).
    pub dest_qp_num: u32,
    /// `qp_access_flags`: which remote operations the responder accepts
    /// (REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC).
    pub qp_access_flags: AccessFlags,
    /// `cap` (reported by query).
    pub cap: QpCap,
    /// `ah_attr`: the primary path.
    pub ah_attr: AhAttr,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `en_sqd_async_notify`.
    pub en_sqd_async_notify: bool,
    /// `sq_draining` (reported by query).
    pub sq_draining: bool,
    /// `max_rd_atomic`: outstanding RDMA READ/atomic requests this QP may initiate.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: outstanding RDMA READ/atomic requests this QP accepts as target.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`: the RNR NAK timer code (0–31) this QP's responder sends.
    pub min_rnr_timer: u8,
    /// `port_num` (1-based).
    pub port_num: u8,
    /// `timeout`: the local ACK timeout, 4.096 µs × 2^timeout (0 = infinite; 0–31).
    pub timeout: u8,
    /// `retry_cnt`: retransmissions after a timeout or sequence NAK (0–7).
    pub retry_cnt: u8,
    /// `rnr_retry`: retransmissions after an RNR NAK (0–6; 7 = infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: RNR_RETRY_INFINITE,
        }
    }
}

impl QpAttr {
    /// The local ACK timeout in nanoseconds: 4.096 µs × 2^`timeout`, `None` for 0 (infinite).
    pub fn timeout_ns(&self) -> Option<u64> {
        local_ack_timeout_ns(self.timeout)
    }
}

/// The local ACK timeout for a `timeout` code: 4096 ns × 2^code, `None` for 0 (infinite) or
/// a code above 31.
pub fn local_ack_timeout_ns(code: u8) -> Option<u64> {
    match code {
        1..=31 => Some(4096u64 << code),
        _ => None,
    }
}

/// The RNR NAK timer in microseconds for a 5-bit timer code (IBTA table 45: code 0 is
/// 655.36 ms, 1 is 0.01 ms … 31 is 491.52 ms).
pub fn rnr_timer_us(code: u8) -> u32 {
    const TABLE: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    TABLE[usize::from(code & 31)]
}

/// Required and optional attributes of one transition, per QP type.
struct Rule {
    req: QpAttrMask,
    opt: QpAttrMask,
}

const fn rule(req: QpAttrMask, opt: QpAttrMask) -> Option<Rule> {
    Some(Rule { req, opt })
}

/// The IBTA QP state transition table (the rules the kernel's `ib_modify_qp_is_ok` applies):
/// `None` where the transition is not allowed.
fn transition_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<Rule> {
    use QpAttrMask as M;
    use QpState::*;
    use QpType::*;
    const NONE: QpAttrMask = QpAttrMask::empty();
    match (from, to) {
        // Any state may go to RESET or ERR, with no attributes.
        (_, Reset) | (_, Err) => rule(NONE, NONE),
        (Reset, Init) => match qp_type {
            Ud => rule(M::PKEY_INDEX | M::PORT | M::QKEY, NONE),
            Rc | Uc => rule(M::RC_TO_INIT.difference(M::STATE), NONE),
        },
        (Init, Init) => match qp_type {
            Ud => rule(NONE, M::PKEY_INDEX | M::PORT | M::QKEY),
            Rc | Uc => rule(NONE, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => match qp_type {
            Ud => rule(NONE, M::PKEY_INDEX | M::QKEY),
            Uc => rule(
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Rc => rule(
                M::RC_TO_RTR.difference(M::STATE),
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
        },
        (Rtr, Rts) => match qp_type {
            Ud => rule(M::SQ_PSN, M::CUR_STATE | M::QKEY),
            Uc => rule(
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => rule(
                M::RC_TO_RTS.difference(M::STATE),
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match qp_type {
            Ud => rule(NONE, M::CUR_STATE | M::QKEY),
            Uc => rule(
                NONE,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => rule(
                NONE,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Sqd) => rule(NONE, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Ud => rule(NONE, M::PKEY_INDEX | M::QKEY),
            Uc => rule(
                NONE,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Rc => rule(
                NONE,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
        },
        // SQE exists for UC and UD only: an RC send error takes the QP to ERR.
        (Sqe, Rts) if qp_type != Rc => match qp_type {
            Ud => rule(NONE, M::CUR_STATE | M::QKEY),
            _ => rule(NONE, M::CUR_STATE | M::ACCESS_FLAGS),
        },
        _ => None,
    }
}

/// Checks a modify request as `ibv_modify_qp` does before touching the QP, and returns the
/// state the QP moves to.
///
/// * Without `STATE` in `mask` the QP stays in `current` (which must be a valid
///   self-transition, e.g. RTS → RTS).
/// * With `CUR_STATE`, `attr.cur_qp_state` must equal `current` and the current state must
///   be RTR, RTS, SQD or SQE.
/// * The transition must be allowed for the QP type, every required attribute must be in
///   `mask`, and no attribute outside the required and optional sets may be.
/// * The values given must be in range: PSNs and QP numbers 24 bits, `timeout` and
///   `min_rnr_timer` 0–31, `retry_cnt` and `rnr_retry` 0–7, `port_num` 1, access flags
///   limited to LOCAL_WRITE and the remote rights.
///
/// Device limits (`max_rd_atomic` against `max_qp_init_rd_atom`, the path MTU against the
/// port's, the GID index against the GID table) are the provider's to check.
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<QpState> {
    use QpAttrMask as M;
    let next = if mask.contains(M::STATE) {
        attr.qp_state
    } else {
        current
    };
    if mask.contains(M::CUR_STATE) {
        if !matches!(
            current,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return Err(Error::InvalidArgument(format!(
                "IBV_QP_CUR_STATE is only allowed from RTR, RTS, SQD or SQE, not {current:?}"
            )));
        }
        if attr.cur_qp_state != current {
            return Err(Error::InvalidArgument(format!(
                "cur_qp_state {:?} does not match the QP's state {current:?}",
                attr.cur_qp_state
            )));
        }
    }
    let Some(rule) = transition_rule(qp_type, current, next) else {
        return Err(Error::InvalidTransition {
            qp_type,
            from: current,
            to: next,
        });
    };
    let missing = rule.req - mask;
    if !missing.is_empty() {
        return Err(Error::MissingAttributes {
            from: current,
            to: next,
            missing,
        });
    }
    let extra = mask - rule.req - rule.opt - M::STATE;
    if !extra.is_empty() {
        return Err(Error::UnexpectedAttributes {
            from: current,
            to: next,
            extra,
        });
    }
    check_values(attr, mask)?;
    Ok(next)
}

fn check_values(attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
    use QpAttrMask as M;
    fn bad(name: &'static str, reason: String) -> Error {
        Error::InvalidAttribute { name, reason }
    }
    const PSN_MAX: u32 = (1 << 24) - 1;
    if mask.contains(M::RQ_PSN) && attr.rq_psn > PSN_MAX {
        return Err(bad(
            "rq_psn",
            format!("{:#x} is wider than 24 bits", attr.rq_psn),
        ));
    }
    if mask.contains(M::SQ_PSN) && attr.sq_psn > PSN_MAX {
        return Err(bad(
            "sq_psn",
            format!("{:#x} is wider than 24 bits", attr.sq_psn),
        ));
    }
    if mask.contains(M::DEST_QPN) && attr.dest_qp_num > PSN_MAX {
        return Err(bad(
            "dest_qp_num",
            format!("{:#x} is wider than 24 bits", attr.dest_qp_num),
        ));
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return Err(bad("timeout", format!("{} > 31", attr.timeout)));
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return Err(bad("min_rnr_timer", format!("{} > 31", attr.min_rnr_timer)));
    }
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return Err(bad("retry_cnt", format!("{} > 7", attr.retry_cnt)));
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return Err(bad("rnr_retry", format!("{} > 7", attr.rnr_retry)));
    }
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return Err(bad(
            "port_num",
            format!("port {} does not exist (ports: 1)", attr.port_num),
        ));
    }
    if mask.contains(M::AV) && attr.ah_attr.port_num > 1 {
        return Err(bad(
            "ah_attr.port_num",
            format!("port {} does not exist (ports: 1)", attr.ah_attr.port_num),
        ));
    }
    if mask.contains(M::ACCESS_FLAGS) {
        let allowed = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE;
        let extra = attr.qp_access_flags - allowed;
        if !extra.is_empty() {
            return Err(bad(
                "qp_access_flags",
                format!("{extra:?} is not a QP access right"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;

    fn to(state: QpState) -> QpAttr {
        QpAttr {
            qp_state: state,
            ..QpAttr::default()
        }
    }

    const RC_INIT: QpAttrMask = M::RC_TO_INIT;
    const RC_RTR: QpAttrMask = M::RC_TO_RTR;
    const RC_RTS: QpAttrMask = M::RC_TO_RTS;

    #[test]
    fn rc_bring_up_sequence() {
        use QpState::*;
        let t = QpType::Rc;
        assert_eq!(check_modify(t, Reset, &to(Init), RC_INIT).unwrap(), Init);
        assert_eq!(check_modify(t, Init, &to(Rtr), RC_RTR).unwrap(), Rtr);
        assert_eq!(check_modify(t, Rtr, &to(Rts), RC_RTS).unwrap(), Rts);
        assert_eq!(
            check_modify(t, Rts, &to(Sqd), M::STATE | M::EN_SQD_ASYNC_NOTIFY).unwrap(),
            Sqd
        );
        assert_eq!(check_modify(t, Sqd, &to(Rts), M::STATE).unwrap(), Rts);
        assert_eq!(check_modify(t, Rts, &to(Err), M::STATE).unwrap(), Err);
        assert_eq!(check_modify(t, Err, &to(Reset), M::STATE).unwrap(), Reset);
    }

    #[test]
    fn uc_bring_up_takes_no_rc_only_attribute() {
        use QpState::*;
        let t = QpType::Uc;
        assert_eq!(
            check_modify(t, Reset, &to(Init), M::UC_TO_INIT).unwrap(),
            Init
        );
        assert_eq!(check_modify(t, Init, &to(Rtr), M::UC_TO_RTR).unwrap(), Rtr);
        assert_eq!(check_modify(t, Rtr, &to(Rts), M::UC_TO_RTS).unwrap(), Rts);
        // What only RC has (ibv_modify_qp(3)'s table; the kernel's ib_modify_qp_is_ok)
        // is refused at every step, by name.
        let rc_only = [
            (Init, Rtr, M::UC_TO_RTR, M::MAX_DEST_RD_ATOMIC),
            (Init, Rtr, M::UC_TO_RTR, M::MIN_RNR_TIMER),
            (Rtr, Rts, M::UC_TO_RTS, M::TIMEOUT),
            (Rtr, Rts, M::UC_TO_RTS, M::RETRY_CNT),
            (Rtr, Rts, M::UC_TO_RTS, M::RNR_RETRY),
            (Rtr, Rts, M::UC_TO_RTS, M::MAX_QP_RD_ATOMIC),
            (Rtr, Rts, M::UC_TO_RTS, M::MIN_RNR_TIMER),
            (Rts, Rts, M::STATE, M::MIN_RNR_TIMER),
            (Sqd, Sqd, M::STATE, M::TIMEOUT),
            (Sqd, Sqd, M::STATE, M::MAX_DEST_RD_ATOMIC),
            (Reset, Init, M::UC_TO_INIT, M::QKEY),
        ];
        for (from, next, mask, extra) in rc_only {
            match check_modify(t, from, &to(next), mask | extra) {
                std::result::Result::Err(Error::UnexpectedAttributes { extra: got, .. }) => {
                    assert_eq!(got, extra)
                }
                other => panic!("{from:?} -> {next:?} with {extra:?}: {other:?}"),
            }
        }
        // Nor does UC require them: the RC masks are too much, the UC ones enough.
        assert!(check_modify(t, Init, &to(Rtr), M::RC_TO_RTR).is_err());
        assert!(check_modify(t, Rtr, &to(Rts), M::RC_TO_RTS).is_err());
        // What UC may change later: access flags, the path in SQD, SQE -> RTS.
        let opt = M::STATE | M::ACCESS_FLAGS;
        assert_eq!(check_modify(t, Rts, &to(Rts), opt).unwrap(), Rts);
        assert_eq!(
            check_modify(t, Rtr, &to(Rts), M::UC_TO_RTS | opt).unwrap(),
            Rts
        );
        assert_eq!(
            check_modify(t, Sqd, &to(Sqd), M::STATE | M::AV).unwrap(),
            Sqd
        );
        assert_eq!(check_modify(t, Sqe, &to(Rts), opt).unwrap(), Rts);
        assert!(check_modify(QpType::Rc, Sqe, &to(Rts), M::STATE).is_err());
    }

    #[test]
    fn missing_required_attribute_is_named() {
        let e = check_modify(
            QpType::Rc,
            QpState::Init,
            &to(QpState::Rtr),
            RC_RTR - M::MIN_RNR_TIMER,
        )
        .unwrap_err();
        match e {
            Error::MissingAttributes { missing, .. } => assert_eq!(missing, M::MIN_RNR_TIMER),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unexpected_attribute_is_named() {
        let e = check_modify(
            QpType::Rc,
            QpState::Reset,
            &to(QpState::Init),
            RC_INIT | M::SQ_PSN,
        )
        .unwrap_err();
        match e {
            Error::UnexpectedAttributes { extra, .. } => assert_eq!(extra, M::SQ_PSN),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn illegal_transitions() {
        use QpState::*;
        for (from, next) in [
            (Reset, Rtr),
            (Reset, Rts),
            (Init, Rts),
            (Rtr, Rtr),
            (Rtr, Sqd),
        ] {
            let e = check_modify(QpType::Rc, from, &to(next), M::STATE).unwrap_err();
            assert!(
                matches!(e, Error::InvalidTransition { .. }),
                "{from:?}->{next:?}: {e:?}"
            );
        }
        // RC has no SQE state to leave.
        assert!(check_modify(QpType::Rc, Sqe, &to(Rts), M::STATE).is_err());
        assert!(check_modify(QpType::Ud, Sqe, &to(Rts), M::STATE).is_ok());
    }

    #[test]
    fn no_state_in_mask_means_stay() {
        // RTS -> RTS with an optional attribute is fine...
        assert_eq!(
            check_modify(
                QpType::Rc,
                QpState::Rts,
                &QpAttr::default(),
                M::MIN_RNR_TIMER
            )
            .unwrap(),
            QpState::Rts
        );
        // ...RTR -> RTR is not a valid transition.
        assert!(check_modify(QpType::Rc, QpState::Rtr, &QpAttr::default(), M::TIMEOUT).is_err());
    }

    #[test]
    fn ud_needs_qkey() {
        let mask = M::STATE | M::PKEY_INDEX | M::PORT;
        assert!(check_modify(QpType::Ud, QpState::Reset, &to(QpState::Init), mask).is_err());
        assert!(
            check_modify(
                QpType::Ud,
                QpState::Reset,
                &to(QpState::Init),
                mask | M::QKEY
            )
            .is_ok()
        );
        // UD RTR needs nothing; RTS needs the SQ PSN only.
        assert!(check_modify(QpType::Ud, QpState::Init, &to(QpState::Rtr), M::STATE).is_ok());
        assert!(check_modify(QpType::Ud, QpState::Rtr, &to(QpState::Rts), M::STATE).is_err());
        assert!(
            check_modify(
                QpType::Ud,
                QpState::Rtr,
                &to(QpState::Rts),
                M::STATE | M::SQ_PSN
            )
            .is_ok()
        );
    }

    #[test]
    fn cur_state_must_match() {
        let mut attr = to(QpState::Rts);
        attr.cur_qp_state = QpState::Rts;
        assert!(check_modify(QpType::Rc, QpState::Rts, &attr, M::STATE | M::CUR_STATE).is_ok());
        attr.cur_qp_state = QpState::Sqd;
        assert!(check_modify(QpType::Rc, QpState::Rts, &attr, M::STATE | M::CUR_STATE).is_err());
        // not allowed from INIT at all
        let mut attr = to(QpState::Init);
        attr.cur_qp_state = QpState::Init;
        assert!(check_modify(QpType::Rc, QpState::Init, &attr, M::STATE | M::CUR_STATE).is_err());
    }

    #[test]
    fn value_ranges() {
        let mut attr = to(QpState::Rtr);
        attr.rq_psn = 1 << 24;
        assert!(matches!(
            check_modify(QpType::Rc, QpState::Init, &attr, RC_RTR),
            Err(Error::InvalidAttribute { name: "rq_psn", .. })
        ));
        let mut attr = to(QpState::Rts);
        attr.retry_cnt = 8;
        assert!(matches!(
            check_modify(QpType::Rc, QpState::Rtr, &attr, RC_RTS),
            Err(Error::InvalidAttribute {
                name: "retry_cnt",
                ..
            })
        ));
        attr.retry_cnt = 7;
        attr.timeout = 32;
        assert!(check_modify(QpType::Rc, QpState::Rtr, &attr, RC_RTS).is_err());
        let mut attr = to(QpState::Init);
        attr.qp_access_flags = AccessFlags::MW_BIND;
        assert!(check_modify(QpType::Rc, QpState::Reset, &attr, RC_INIT).is_err());
        attr.qp_access_flags = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        attr.port_num = 2;
        assert!(check_modify(QpType::Rc, QpState::Reset, &attr, RC_INIT).is_err());
    }

    #[test]
    fn any_state_to_reset_and_err() {
        use QpState::*;
        for from in [Reset, Init, Rtr, Rts, Sqd, Sqe, Err] {
            assert_eq!(
                check_modify(QpType::Rc, from, &to(Reset), M::STATE).unwrap(),
                Reset
            );
            assert_eq!(
                check_modify(QpType::Rc, from, &to(Err), M::STATE).unwrap(),
                Err
            );
        }
    }

    #[test]
    fn timers() {
        assert_eq!(local_ack_timeout_ns(0), None);
        assert_eq!(local_ack_timeout_ns(1), Some(8192));
        assert_eq!(local_ack_timeout_ns(14), Some(4096 << 14)); // ~67 ms
        assert_eq!(local_ack_timeout_ns(32), None);
        assert_eq!(rnr_timer_us(0), 655_360);
        assert_eq!(rnr_timer_us(1), 10);
        assert_eq!(rnr_timer_us(12), 640);
        assert_eq!(rnr_timer_us(31), 491_520);
    }
}
