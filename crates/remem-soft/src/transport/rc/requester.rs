//! The requester of an RC queue pair: the send queue, the packets of its work requests
//! (new and retransmitted), the retransmit and RNR timers.

use super::Env;
use super::psn::{add, diff};
use super::{
    AtomicEth, Feth, Kind, PLACEMENT_GLOBAL, PLACEMENT_PERSISTENT, PayloadSrc, Pos, RcTransport,
    Reth, SELECT_RANGE, SELECT_REGION, Stat, TxPacket,
};
use crate::wqe::SendWqe;
use remem_verbs::{FlushLevel, FlushType, QpState, SendOp, WcStatus};
use std::collections::VecDeque;
use std::time::Instant;

/// Ask for an ACK at least every this many packets of a long message (as rxe).
const ACKREQ_EVERY: u32 = 64;

/// A send work request on its way.
#[derive(Debug)]
pub(super) struct SqEntry {
    pub(super) wqe: SendWqe,
    /// Whether PSNs were assigned (transmission started).
    pub(super) started: bool,
    pub(super) first_psn: u32,
    pub(super) npkts: u32,
    /// READ: response packets received.
    pub(super) resp_pkts: u32,
    /// READ: the expected response PSN a re-request was sent for (to avoid re-request
    /// storms on a burst of late responses).
    pub(super) rerequested: Option<u32>,
    /// Set when the work request is finished.
    pub(super) status: Option<WcStatus>,
}

impl SqEntry {
    pub(super) fn last_psn(&self) -> u32 {
        add(self.first_psn, self.npkts.saturating_sub(1))
    }
    pub(super) fn is_rd(&self) -> bool {
        self.wqe.op.uses_rd_atomic()
    }
    /// Whether `psn` is one of this entry's PSNs.
    pub(super) fn holds(&self, psn: u32) -> bool {
        let d = diff(psn, self.first_psn);
        d >= 0 && (d as u32) < self.npkts
    }
}

#[derive(Debug)]
pub(super) struct Requester {
    pub(super) sq: VecDeque<SqEntry>,
    /// Index in `sq` of the entry being transmitted.
    pub(super) cur: usize,
    /// Next packet of it.
    pub(super) cur_pkt: u32,
    pub(super) next_psn: u32,
    /// One past the highest PSN ever sent.
    pub(super) max_sent: u32,
    /// Oldest unacknowledged PSN.
    pub(super) una: u32,
    pub(super) rd_outstanding: u32,
    pub(super) retry_left: u8,
    pub(super) rnr_left: u8,
    pub(super) timer: Option<Instant>,
    pub(super) rnr_until: Option<Instant>,
    pub(super) since_ackreq: u32,
}

impl Requester {
    pub(super) fn new() -> Self {
        Requester {
            sq: VecDeque::new(),
            cur: 0,
            cur_pkt: 0,
            next_psn: 0,
            max_sent: 0,
            una: 0,
            rd_outstanding: 0,
            retry_left: 0,
            rnr_left: 0,
            timer: None,
            rnr_until: None,
            since_ackreq: 0,
        }
    }
}

impl RcTransport {
    /// Queues a validated send work request. In ERR it completes at once with
    /// `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wqe: SendWqe, env: &mut dyn Env) {
        if self.state == QpState::Err {
            env.send_completion(self.wc(&wqe, WcStatus::WrFlushErr));
            return;
        }
        self.req.sq.push_back(SqEntry {
            wqe,
            started: false,
            first_psn: 0,
            npkts: 0,
            resp_pkts: 0,
            rerequested: None,
            status: None,
        });
    }

    /// Work requests posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.req.sq.len()
    }

    pub(super) fn poll_request(&mut self, now: Instant) -> Option<(TxPacket, PayloadSrc)> {
        let cfg = self.cfg;
        let r = &mut self.req;
        if r.rnr_until.is_some_and(|t| t > now) {
            return None;
        }
        r.rnr_until = None;
        let entry = r.sq.get_mut(r.cur)?;
        // The window bounds the PSNs in flight packet by packet, inside a message too: a
        // peer that stops acknowledging gets at most a window per attempt, however long
        // the message (rxe bounds unacknowledged PSNs the same way).
        if diff(r.next_psn, r.una) >= cfg.window as i32 {
            return None;
        }
        if !entry.started {
            if self.state == QpState::Sqd {
                return None;
            }
            if entry.wqe.fence && r.rd_outstanding > 0 {
                return None;
            }
            if entry.is_rd() {
                if r.rd_outstanding >= u32::from(cfg.max_rd_atomic) {
                    return None;
                }
                r.rd_outstanding += 1;
            }
            entry.started = true;
            entry.first_psn = r.next_psn;
            entry.npkts = cfg.npkts(&entry.wqe);
        }
        let index = r.cur;
        let k = r.cur_pkt;
        let psn = add(entry.first_psn, k);
        let mtu = u64::from(cfg.mtu);
        let offset = u64::from(k) * mtu;
        let mut pkt = TxPacket::new(Kind::Send, Pos::Only, cfg.dest_qpn, psn);
        let mut consumed = 1; // PSNs this packet uses
        let mut payload_off = None;
        match entry.wqe.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                pkt.kind = Kind::ReadRequest;
                pkt.reth = Some(Reth {
                    va: remote_addr.wrapping_add(offset),
                    rkey,
                    dma_len: (entry.wqe.len - offset.min(entry.wqe.len)) as u32,
                });
                pkt.ack_req = true;
                consumed = entry.npkts - k;
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                pkt.kind = Kind::CompareSwap;
                pkt.atomic = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                pkt.ack_req = true;
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add: value,
            } => {
                pkt.kind = Kind::FetchAdd;
                pkt.atomic = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: value,
                    compare: 0,
                });
                pkt.ack_req = true;
            }
            SendOp::AtomicWrite { remote_addr, rkey } => {
                pkt.kind = Kind::AtomicWrite;
                pkt.reth = Some(Reth {
                    va: remote_addr,
                    rkey,
                    dma_len: 8,
                });
                pkt.payload_len = 8;
                pkt.ack_req = true;
                payload_off = Some(0);
            }
            SendOp::Flush {
                remote_addr,
                rkey,
                len,
                flush_type,
                level,
            } => {
                pkt.kind = Kind::Flush;
                pkt.feth = Some(Feth {
                    placement: match flush_type {
                        FlushType::Global => PLACEMENT_GLOBAL,
                        FlushType::Persistent => PLACEMENT_PERSISTENT,
                    },
                    selectivity: match level {
                        FlushLevel::Range => SELECT_RANGE,
                        FlushLevel::Region => SELECT_REGION,
                    },
                });
                pkt.reth = Some(Reth {
                    va: remote_addr,
                    rkey,
                    dma_len: len,
                });
                pkt.ack_req = true;
            }
            op => {
                let (kind, reth) = match op {
                    SendOp::Send => (Kind::Send, None),
                    SendOp::SendWithImm { imm } => {
                        pkt.imm = Some(imm);
                        (Kind::SendImm, None)
                    }
                    SendOp::SendWithInv { rkey } => {
                        pkt.ieth = Some(rkey);
                        (Kind::SendInv, None)
                    }
                    SendOp::RdmaWrite { remote_addr, rkey } => (
                        Kind::Write,
                        Some(Reth {
                            va: remote_addr,
                            rkey,
                            dma_len: entry.wqe.len as u32,
                        }),
                    ),
                    SendOp::RdmaWriteWithImm {
                        remote_addr,
                        rkey,
                        imm,
                    } => {
                        pkt.imm = Some(imm);
                        (
                            Kind::WriteImm,
                            Some(Reth {
                                va: remote_addr,
                                rkey,
                                dma_len: entry.wqe.len as u32,
                            }),
                        )
                    }
                    _ => (Kind::Send, None),
                };
                pkt.kind = kind;
                pkt.pos = Pos::of(k, entry.npkts);
                if pkt.pos.starts() {
                    pkt.reth = reth;
                }
                if !pkt.pos.ends() {
                    pkt.imm = None;
                    pkt.ieth = None;
                }
                pkt.payload_len = (entry.wqe.len - offset).min(mtu) as u32;
                pkt.solicited = entry.wqe.solicited && pkt.pos.ends();
                r.since_ackreq += 1;
                // An ACK is asked for at the end of a message, every ACKREQ_EVERY packets,
                // and on the packet that fills the window (else a window smaller than
                // ACKREQ_EVERY would wait for an ACK nobody asked for).
                let fills_window = diff(add(psn, 1), r.una) >= cfg.window as i32;
                pkt.ack_req = pkt.pos.ends() || r.since_ackreq >= ACKREQ_EVERY || fills_window;
                payload_off = Some(offset);
            }
        }
        if pkt.ack_req {
            r.since_ackreq = 0;
        }
        // Advance the cursor.
        r.cur_pkt += consumed;
        if r.cur_pkt >= entry.npkts {
            if entry.wqe.op.is_read_or_atomic() && entry.rerequested.is_none() && k > 0 {
                entry.rerequested = Some(psn);
            }
            r.cur += 1;
            r.cur_pkt = 0;
        }
        r.next_psn = add(psn, consumed);
        if diff(r.next_psn, r.max_sent) > 0 {
            r.max_sent = r.next_psn;
        }
        if r.timer.is_none() {
            r.timer = cfg.ack_timeout().map(|t| now + t);
        }
        let src = match payload_off {
            Some(offset) => PayloadSrc::Wqe { index, offset },
            None => PayloadSrc::None,
        };
        Some((pkt, src))
    }

    /// Moves the transmit cursor back to `psn` (go-back-N).
    pub(super) fn rewind_to(&mut self, psn: u32) {
        let r = &mut self.req;
        for (i, e) in r.sq.iter().enumerate() {
            if !e.started {
                break;
            }
            if e.holds(psn) {
                r.cur = i;
                r.cur_pkt = diff(psn, e.first_psn) as u32;
                r.next_psn = psn;
                return;
            }
        }
        // Nothing holds it (all acknowledged): continue with the first unstarted entry.
        r.cur = r.sq.iter().position(|e| !e.started).unwrap_or(r.sq.len());
        r.cur_pkt = 0;
        r.next_psn = r.max_sent;
    }

    /// Re-requests a READ (or resends an atomic) from its expected response PSN, once per
    /// expected PSN.
    pub(super) fn rerequest(&mut self, expected: u32) {
        let Some(e) = self
            .req
            .sq
            .iter_mut()
            .find(|e| e.started && e.holds(expected))
        else {
            return;
        };
        if e.rerequested == Some(expected) {
            return;
        }
        e.rerequested = Some(expected);
        // Only go back if the cursor is past it.
        let cursor_past = diff(self.req.next_psn, expected) > 0;
        if cursor_past {
            self.rewind_to(expected);
        }
    }

    /// Handles the retransmit and RNR timers.
    pub fn handle_timeout(&mut self, now: Instant, env: &mut dyn Env) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        let Some(t) = self.req.timer else { return };
        if t > now {
            return;
        }
        self.req.timer = None;
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.una == self.req.max_sent {
            return;
        }
        if self.req.retry_left == 0 {
            env.count(Stat::RetryExceeded);
            let una = self.req.una;
            tracing::warn!(
                psn = una,
                "no ACK after every retry: RETRY_EXC_ERR, QP to ERR"
            );
            self.fail(now, Some(una), WcStatus::RetryExcErr, env);
            return;
        }
        self.req.retry_left -= 1;
        env.count(Stat::CompleterRetry);
        let una = self.req.una;
        tracing::debug!(
            psn = una,
            retries_left = self.req.retry_left,
            "ACK timeout: retransmitting from the first unacknowledged PSN"
        );
        for e in self.req.sq.iter_mut() {
            e.rerequested = None;
        }
        self.rewind_to(una);
    }
}
