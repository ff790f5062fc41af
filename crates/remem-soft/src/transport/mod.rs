//! The RC transport: requester, completer and responder of one queue pair as a sans-IO state
//! machine (quinn-proto is the model).
//!
//! It takes received packets ([`RcTransport::handle_packet`]) and timer expiries
//! ([`RcTransport::handle_timeout`]) with an explicit `now`, produces packets to send
//! ([`RcTransport::poll_transmit`]) and reports the next deadline
//! ([`RcTransport::next_timeout`]). Memory, receive queues and completion queues are reached
//! through the [`Env`] trait, so the same code runs under the UDP driver and in the
//! deterministic simulation of `tests`. [`UcTransport`] (unreliable connected: the same
//! packets, nothing acknowledged, a lost message dropped whole) and [`UdTransport`]
//! (datagrams) have the same boundary.
//!
//! Packets are described by [`TxPacket`] / [`RxPacket`]: the opcode split into what the
//! packet is ([`Kind`]) and where in its message it stands ([`Pos`]), plus the header fields
//! the transport reads or writes. `wire_glue` turns them into and out of `remem_wire`
//! packets.

#![forbid(unsafe_code)]

#[cfg(any(test, feature = "internals"))]
pub mod fake;
pub mod glue;
mod rc;
#[cfg(test)]
mod sim;
mod uc;
mod ud;
pub mod wqe;

pub use crate::mem::RemoteKeyError;
pub use crate::mem::grant::{AccessError, Grant, Held};
pub use rc::{RcConfig, RcTransport};
pub use uc::{UcDrop, UcTransport};
pub use ud::{UdDrop, UdSource, UdTransport};

use remem_verbs::{AccessFlags, AsyncEvent, WorkCompletion};
use wqe::RecvWqe;

/// What a packet is, independent of its position in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// SEND.
    Send,
    /// SEND with immediate (ImmDt on LAST/ONLY).
    SendImm,
    /// SEND with invalidate (IETH on LAST/ONLY).
    SendInv,
    /// RDMA WRITE (RETH on FIRST/ONLY).
    Write,
    /// RDMA WRITE with immediate (RETH on FIRST/ONLY, ImmDt on LAST/ONLY).
    WriteImm,
    /// RDMA READ request (RETH).
    ReadRequest,
    /// RDMA READ response (AETH on FIRST/LAST/ONLY).
    ReadResponse,
    /// ACKNOWLEDGE (AETH): ACK or NAK.
    Ack,
    /// ATOMIC ACKNOWLEDGE (AETH + AtomicAckETH).
    AtomicAck,
    /// COMPARE SWAP (AtomicETH).
    CompareSwap,
    /// FETCH ADD (AtomicETH).
    FetchAdd,
    /// ATOMIC WRITE (RETH and 8 bytes of payload).
    AtomicWrite,
    /// FLUSH (FETH, RETH).
    Flush,
}

impl Kind {
    /// Whether packets of this kind are requests (sent by a requester, handled by a
    /// responder) rather than responses.
    pub fn is_request(self) -> bool {
        !matches!(self, Kind::ReadResponse | Kind::Ack | Kind::AtomicAck)
    }
}

/// Where a packet stands in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pos {
    /// FIRST of several.
    First,
    /// MIDDLE.
    Middle,
    /// LAST of several.
    Last,
    /// The whole message in one packet (also used for single-packet kinds: READ request,
    /// ACK, atomics).
    Only,
}

impl Pos {
    /// Position of packet `index` of `count` (`count >= 1`).
    pub fn of(index: u32, count: u32) -> Pos {
        match (index, count) {
            (_, 0 | 1) => Pos::Only,
            (0, _) => Pos::First,
            (i, n) if i + 1 == n => Pos::Last,
            _ => Pos::Middle,
        }
    }

    /// FIRST or ONLY: the packet starts a message.
    pub fn starts(self) -> bool {
        matches!(self, Pos::First | Pos::Only)
    }

    /// LAST or ONLY: the packet ends a message.
    pub fn ends(self) -> bool {
        matches!(self, Pos::Last | Pos::Only)
    }
}

pub use remem_wire::{AtomicEth, Feth, Psn, Reth, Syndrome};

/// The unlimited-credit ACK syndrome rxe sends.
pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credits: 31 };

/// A packet the transport wants sent; its payload is written by the transport into the
/// buffer the glue provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPacket {
    /// What it is.
    pub kind: Kind,
    /// Where in its message.
    pub pos: Pos,
    /// Destination QP.
    pub dest_qpn: u32,
    /// PSN.
    pub psn: Psn,
    /// AckReq.
    pub ack_req: bool,
    /// Solicited event.
    pub solicited: bool,
    /// RETH, where the opcode carries one.
    pub reth: Option<Reth>,
    /// AETH (syndrome, MSN), where the opcode carries one.
    pub aeth: Option<(Syndrome, u32)>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AtomicAckETH original value.
    pub atomic_ack: Option<u64>,
    /// FETH (FLUSH).
    pub feth: Option<Feth>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH rkey.
    pub ieth: Option<u32>,
    /// DETH (Q_Key, source QP), UD only.
    pub deth: Option<(u32, u32)>,
    /// An unreliable connected packet: it goes out with the UC opcode of its kind and
    /// position (BTH opcode prefix 0x20) instead of the RC one.
    pub uc: bool,
    /// Payload length.
    pub payload_len: u32,
}

impl TxPacket {
    /// A packet of `kind`/`pos` with every optional field empty.
    pub fn new(kind: Kind, pos: Pos, dest_qpn: u32, psn: Psn) -> Self {
        TxPacket {
            kind,
            pos,
            dest_qpn,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            aeth: None,
            atomic: None,
            atomic_ack: None,
            feth: None,
            imm: None,
            ieth: None,
            deth: None,
            uc: false,
            payload_len: 0,
        }
    }
}

/// A received packet, as the transport sees it.
#[derive(Debug, Clone, Copy)]
pub struct RxPacket<'a> {
    /// What it is.
    pub kind: Kind,
    /// Where in its message.
    pub pos: Pos,
    /// PSN.
    pub psn: Psn,
    /// AckReq.
    pub ack_req: bool,
    /// Solicited event.
    pub solicited: bool,
    /// RETH.
    pub reth: Option<Reth>,
    /// AETH.
    pub aeth: Option<(Syndrome, u32)>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AtomicAckETH.
    pub atomic_ack: Option<u64>,
    /// FETH.
    pub feth: Option<Feth>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH: the rkey a SEND with invalidate names.
    pub ieth: Option<u32>,
    /// DETH (Q_Key, source QP), UD only.
    pub deth: Option<(u32, u32)>,
    /// Payload (pad removed).
    pub payload: &'a [u8],
}

impl<'a> RxPacket<'a> {
    /// A packet of `kind`/`pos` with every optional field empty and no payload.
    #[cfg(any(test, feature = "internals"))]
    pub fn new(kind: Kind, pos: Pos, psn: Psn) -> Self {
        RxPacket {
            kind,
            pos,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            aeth: None,
            atomic: None,
            atomic_ack: None,
            feth: None,
            imm: None,
            ieth: None,
            deth: None,
            payload: &[],
        }
    }
}

/// Transport statistics in counter order, with their rxe names.
pub const STAT_NAMES: [(Stat, &str); 15] = [
    (Stat::DuplicateRequest, "duplicate_request"),
    (Stat::OutOfSeqRequest, "out_of_seq_request"),
    (Stat::RcvdRnrNak, "rcvd_rnr_err"),
    (Stat::SentRnrNak, "send_rnr_err"),
    (Stat::RcvdSeqNak, "rcvd_seq_err"),
    (Stat::RetryExceeded, "retry_exceeded_err"),
    (Stat::RnrRetryExceeded, "retry_rnr_exceeded_err"),
    (Stat::CompleterRetry, "completer_retry_err"),
    (Stat::SendErr, "send_err"),
    (Stat::DuplicateReadDropped, "drop_duplicate_read"),
    (Stat::ReadOverflowDropped, "drop_read_overflow"),
    (Stat::ResponseQueueFull, "drop_resp_queue_full"),
    (Stat::Retransmitted, "retransmitted_pkts"),
    (Stat::CwndReduced, "cwnd_reductions"),
    (Stat::EarlyRetransmit, "early_retransmits"),
];

/// Transport statistics the environment counts (the device counters of rxe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    /// A duplicate request was received (`duplicate_request`).
    DuplicateRequest,
    /// A request beyond the expected PSN was received (`out_of_seq_request`).
    OutOfSeqRequest,
    /// An RNR NAK was received (`rcvd_rnr_err`).
    RcvdRnrNak,
    /// An RNR NAK was sent (`send_rnr_err`).
    SentRnrNak,
    /// A PSN sequence error NAK was received (`rcvd_seq_err`).
    RcvdSeqNak,
    /// Retries ran out (`retry_exceeded_err`).
    RetryExceeded,
    /// RNR retries ran out (`retry_rnr_exceeded_err`).
    RnrRetryExceeded,
    /// The completer started a retransmission (`completer_retry_err`).
    CompleterRetry,
    /// A NAK other than sequence/RNR was sent or an error completion made (`send_err`).
    SendErr,
    /// A duplicate READ request was dropped: a response covering it was already queued,
    /// or as many READ responses as the QP has responder resources were queued
    /// (`drop_duplicate_read`).
    DuplicateReadDropped,
    /// A new READ request was dropped unexecuted (as if lost: the requester retries it)
    /// while as many READ responses as the QP has responder resources were still queued
    /// (`drop_read_overflow`).
    ReadOverflowDropped,
    /// A request was dropped unexecuted (as if lost: the requester retries it) because the
    /// QP's queue of responses to send was full (`drop_resp_queue_full`): a peer cannot
    /// make the responder queue more than a bounded number of ACKs, NAKs and answers.
    ResponseQueueFull,
    /// A request packet was sent again (go-back-N after a NAK, a timeout or a missing READ
    /// response; `retransmitted_pkts`).
    Retransmitted,
    /// The requester's congestion window was cut: a loss event or a stall
    /// (`cwnd_reductions`).
    CwndReduced,
    /// The adaptive retransmission timeout expired: the requester resent from the first
    /// unacknowledged PSN without spending a retry (`early_retransmits`).
    EarlyRetransmit,
}

impl Stat {
    /// Its rxe counter name (`duplicate_request`, …), from [`STAT_NAMES`].
    pub fn rxe_name(self) -> &'static str {
        STAT_NAMES
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("unknown", |(_, name)| name)
    }
}

/// What the transport needs from its surroundings: memory, receive queues, completion
/// queues, counters. Implemented by the soft QP's [`crate::verbs::qp::QpEnv`] over its device's
/// tables, and by the simulation tests over models.
pub trait Env {
    /// Resolves a remote access: a grant for `[va, va + len)` of the memory region `rkey`
    /// if it is in the QP's protection domain and grants `need`. The grant stops working
    /// when the region is deregistered ([`KeyedRegion::revoke`](crate::mem::grant::KeyedRegion::revoke)).
    fn remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Grant, RemoteKeyError>;

    /// Resolves a remote key to a grant for its whole memory region if it is in the QP's
    /// protection domain and grants `need` (a FLUSH of the whole region).
    fn remote_region(&mut self, rkey: u32, need: AccessFlags) -> Result<Grant, RemoteKeyError>;

    /// Takes the next receive work request (from the QP's receive queue or its SRQ).
    fn take_recv(&mut self) -> Option<RecvWqe>;

    /// Executes a local operation of this QP's send queue (a memory window bind or a
    /// local invalidate, [`SendOp::is_local`](remem_verbs::SendOp::is_local)) when the
    /// requester reaches it: the status it completes with on failure (`MW_BIND_ERR` for
    /// a bind, `LOC_QP_OP_ERR` for an invalidate, as rxe). Without memory windows: every
    /// one fails.
    fn local_op(&mut self, op: &remem_verbs::SendOp) -> Result<(), remem_verbs::WcStatus> {
        Err(match op {
            remem_verbs::SendOp::BindMw { .. } => remem_verbs::WcStatus::MwBindErr,
            _ => remem_verbs::WcStatus::LocQpOpErr,
        })
    }

    /// Invalidates `rkey` for a SEND with invalidate received on this QP: true if it was a
    /// type 2 memory window of the QP's protection domain bound on this QP, now free and
    /// revoked; false (nothing changed) for any other key — a region from `reg_mr`
    /// cannot be invalidated, as rxe refuses it. Without memory windows: always false.
    fn invalidate(&mut self, rkey: u32) -> bool {
        let _ = rkey;
        false
    }

    /// Reports a send-queue completion.
    fn send_completion(&mut self, wc: WorkCompletion);

    /// Reports a receive-queue completion; `solicited` from the SE bit of the last packet.
    fn recv_completion(&mut self, wc: WorkCompletion, solicited: bool);

    /// Counts an event.
    fn count(&mut self, stat: Stat);

    /// Raises an affiliated asynchronous event (the responder moved the QP to ERR over a
    /// peer's request: `IBV_EVENT_QP_ACCESS_ERR`, `IBV_EVENT_QP_REQ_ERR`,
    /// `IBV_EVENT_QP_FATAL`).
    fn async_event(&mut self, event: AsyncEvent);
}
