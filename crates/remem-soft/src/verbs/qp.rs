//! The soft provider's queue pair: verbs validation around the RC, UC and UD transports.

use crate::device::DeviceShared;
use crate::device::quota::Slot;
use crate::engine::DropCause;
use crate::engine::port::{Emit, QpMarks, QpPort};
use crate::mem::mr::MrTable;
use crate::transport::wqe::{PdId, RecvWqe, SendData, SendWqe};
use crate::transport::{
    AccessError, Env, Grant, RcConfig, RcTransport, RemoteKeyError, Stat, UcDrop, UcTransport,
    UdDrop, UdSource, UdTransport,
};
use crate::verbs::cq::SoftCq;
use crate::verbs::srq::SoftSrq;
use remem_verbs::{
    AccessFlags, Error, PostError, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, Result,
    SendFlags, SendOp, SendWr, WcStatus, WorkCompletion, check_modify,
};
use std::collections::VecDeque;
use std::sync::Arc;

pub use crate::device::QpLimits;

/// The size of one scatter/gather entry in a send WQE (`struct ib_sge`), the unit rxe
/// sizes a send queue's WQEs in.
const SGE_BYTES: u32 = 16;

/// Checks requested queue sizes against the device and returns what is granted.
///
/// The send side is granted as rxe does (`rxe_init_sq`): a send WQE holds
/// `max(max_send_sge * 16, max_inline_data)` bytes, and what fits in it is granted —
/// `max_inline_data` is that size and `max_send_sge` that size over 16 (within the
/// device limits). So a QP asked for one SGE and no inline data may still post 16 bytes
/// inline, and programs that check the returned `max_inline_data` (`rdma_xclient`) see
/// what rxe reports. At least one WR and SGE are granted per queue.
pub fn grant_cap(req: QpCap, lim: &QpLimits) -> Result<QpCap> {
    let check = |name: &'static str, v: u32, max: u32| {
        if v > max {
            Err(Error::InvalidArgument(format!(
                "{name} {v} exceeds the device limit {max}"
            )))
        } else {
            Ok(())
        }
    };
    check("max_send_wr", req.max_send_wr, lim.max_wr)?;
    check("max_recv_wr", req.max_recv_wr, lim.max_wr)?;
    check("max_send_sge", req.max_send_sge, lim.max_sge)?;
    check("max_recv_sge", req.max_recv_sge, lim.max_sge)?;
    check("max_inline_data", req.max_inline_data, lim.max_inline)?;
    let wqe = (req.max_send_sge.max(1) * SGE_BYTES).max(req.max_inline_data);
    Ok(QpCap {
        max_send_wr: req.max_send_wr.max(1),
        max_recv_wr: req.max_recv_wr.max(1),
        max_send_sge: (wqe / SGE_BYTES).min(lim.max_sge).max(1),
        max_recv_sge: req.max_recv_sge.max(1),
        max_inline_data: wqe.min(lim.max_inline),
    })
}

/// Validates a modify request against the state machine and the device limits, and
/// returns the next state.
pub fn validate_modify(
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
    lim: &QpLimits,
) -> Result<QpState> {
    let next = check_modify(qp_type, current, attr, mask)?;
    let bad = |name: &'static str, reason: String| Error::InvalidAttribute { name, reason };
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > lim.max_rd_atomic {
        return Err(bad(
            "max_rd_atomic",
            format!(
                "{} > device max_qp_init_rd_atom {}",
                attr.max_rd_atomic, lim.max_rd_atomic
            ),
        ));
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
        && attr.max_dest_rd_atomic > lim.max_dest_rd_atomic
    {
        return Err(bad(
            "max_dest_rd_atomic",
            format!(
                "{} > device max_qp_rd_atom {}",
                attr.max_dest_rd_atomic, lim.max_dest_rd_atomic
            ),
        ));
    }
    if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu.bytes() > lim.active_mtu {
        return Err(bad(
            "path_mtu",
            format!(
                "{} > the port's active MTU {}",
                attr.path_mtu, lim.active_mtu
            ),
        ));
    }
    Ok(next)
}

/// Copies the attributes named by `mask` from `src` into `dst`.
pub fn apply_attr(dst: &mut QpAttr, src: &QpAttr, mask: QpAttrMask) {
    use QpAttrMask as M;
    if mask.contains(M::STATE) {
        dst.qp_state = src.qp_state;
    }
    if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
        dst.en_sqd_async_notify = src.en_sqd_async_notify;
    }
    if mask.contains(M::ACCESS_FLAGS) {
        dst.qp_access_flags = src.qp_access_flags;
    }
    if mask.contains(M::PKEY_INDEX) {
        dst.pkey_index = src.pkey_index;
    }
    if mask.contains(M::PORT) {
        dst.port_num = src.port_num;
    }
    if mask.contains(M::QKEY) {
        dst.qkey = src.qkey;
    }
    if mask.contains(M::AV) {
        dst.ah_attr = src.ah_attr;
    }
    if mask.contains(M::PATH_MTU) {
        dst.path_mtu = src.path_mtu;
    }
    if mask.contains(M::TIMEOUT) {
        dst.timeout = src.timeout;
    }
    if mask.contains(M::RETRY_CNT) {
        dst.retry_cnt = src.retry_cnt;
    }
    if mask.contains(M::RNR_RETRY) {
        dst.rnr_retry = src.rnr_retry;
    }
    if mask.contains(M::RQ_PSN) {
        dst.rq_psn = src.rq_psn;
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) {
        dst.max_rd_atomic = src.max_rd_atomic;
    }
    if mask.contains(M::MIN_RNR_TIMER) {
        dst.min_rnr_timer = src.min_rnr_timer;
    }
    if mask.contains(M::SQ_PSN) {
        dst.sq_psn = src.sq_psn;
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) {
        dst.max_dest_rd_atomic = src.max_dest_rd_atomic;
    }
    if mask.contains(M::DEST_QPN) {
        dst.dest_qp_num = src.dest_qp_num;
    }
}

/// The transport configuration for a QP's attributes.
pub fn rc_config(qpn: u32, attr: &QpAttr, window: u32) -> RcConfig {
    RcConfig {
        qpn,
        dest_qpn: attr.dest_qp_num,
        mtu: attr.path_mtu.bytes(),
        sq_psn: remem_wire::Psn::new(attr.sq_psn),
        rq_psn: remem_wire::Psn::new(attr.rq_psn),
        timeout: attr.timeout,
        retry_cnt: attr.retry_cnt,
        rnr_retry: attr.rnr_retry,
        min_rnr_timer: attr.min_rnr_timer,
        max_rd_atomic: attr.max_rd_atomic,
        max_dest_rd_atomic: attr.max_dest_rd_atomic,
        access: attr.qp_access_flags,
        window,
    }
}

/// Validates one send work request and turns it into a WQE: its scatter/gather entries are
/// resolved through `dev`'s key table ([`MrTable::local`]) and a UD request's address
/// handle must be one of `dev`'s, of protection domain `pd` ([`DeviceShared::own_ah`]).
pub fn build_send_wqe(
    wr: &SendWr<'_>,
    qp_type: QpType,
    cap: &QpCap,
    sq_sig_all: bool,
    max_msg: u64,
    pd: PdId,
    dev: &DeviceShared,
) -> Result<SendWqe> {
    let op = wr.op;
    let valid = match qp_type {
        QpType::Rc => true,
        QpType::Uc => op.valid_on_uc(),
        QpType::Ud => op.valid_on_ud(),
    };
    if !valid {
        return Err(Error::InvalidOpcode {
            op: op.name(),
            qp_type,
        });
    }
    if wr.sg_list.len() > cap.max_send_sge as usize {
        return Err(Error::TooManySge {
            given: wr.sg_list.len(),
            max: cap.max_send_sge,
        });
    }
    let len = wr.total_len();
    if len > max_msg {
        return Err(Error::MessageTooLarge { len, max: max_msg });
    }
    let is_atomic = matches!(
        op,
        SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
    );
    // READ and atomic results are written into the scatter list.
    let need_write = op.is_read_or_atomic();
    if op.is_local() && !wr.sg_list.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{} takes no local buffer (empty gather list)",
            op.name()
        )));
    }
    if matches!(op, SendOp::Flush { .. }) && !wr.sg_list.is_empty() {
        return Err(Error::InvalidArgument(
            "IBV_WR_FLUSH takes no local buffer (empty gather list)".into(),
        ));
    }
    if (is_atomic || matches!(op, SendOp::AtomicWrite { .. })) && len != 8 {
        return Err(Error::InvalidArgument(format!(
            "{} needs exactly 8 bytes of local buffer, got {len}",
            op.name()
        )));
    }
    let inline = wr.flags.contains(SendFlags::INLINE);
    if inline {
        if need_write {
            return Err(Error::InvalidArgument(format!(
                "{} cannot be inline",
                op.name()
            )));
        }
        // An ATOMIC WRITE's 8 bytes may always be inline: rxe keeps them in the WQE
        // whatever `max_inline_data` is (`ibv_wr_atomic_write` passes the value itself).
        let atomic_write_value = matches!(op, SendOp::AtomicWrite { .. }) && len == 8;
        if len > u64::from(cap.max_inline_data) && !atomic_write_value {
            return Err(Error::InlineTooLarge {
                given: len,
                max: cap.max_inline_data,
            });
        }
    }
    let mut sges = Vec::with_capacity(wr.sg_list.len());
    for sge in wr.sg_list {
        sges.push(dev.mrs.local(pd, sge, need_write)?);
    }
    let data = if inline {
        let mut bytes = vec![0u8; len as usize];
        let mut at = 0;
        for (r, sge) in sges.iter().zip(wr.sg_list) {
            r.read(0, &mut bytes[at..at + r.len()])
                .map_err(|e| match e {
                    AccessError::Revoked => Error::InvalidLkey { lkey: sge.lkey },
                    AccessError::Mem(e) => Error::Mem(e),
                })?;
            at += r.len();
        }
        SendData::Inline(bytes.into_boxed_slice())
    } else {
        SendData::Sges(sges)
    };
    let ud = match (qp_type, &wr.ud) {
        (QpType::Ud, None) => {
            return Err(Error::InvalidArgument(
                "a UD send needs a destination (address handle, QPN, Q_Key)".into(),
            ));
        }
        (QpType::Ud, Some(d)) => Some(crate::transport::wqe::UdTarget {
            av: dev.own_ah(&d.ah, pd)?.attr,
            remote_qpn: d.remote_qpn,
            remote_qkey: d.remote_qkey,
        }),
        _ => None,
    };
    Ok(SendWqe {
        wr_id: wr.wr_id,
        op,
        data,
        len,
        signaled: sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
        solicited: wr.flags.contains(SendFlags::SOLICITED),
        fence: wr.flags.contains(SendFlags::FENCE),
        ud,
    })
}

/// Validates one receive work request and turns it into a WQE, its scatter/gather entries
/// resolved through the key table `mrs` (with LOCAL_WRITE).
pub fn build_recv_wqe(wr: &RecvWr<'_>, max_sge: u32, pd: PdId, mrs: &MrTable) -> Result<RecvWqe> {
    if wr.sg_list.len() > max_sge as usize {
        return Err(Error::TooManySge {
            given: wr.sg_list.len(),
            max: max_sge,
        });
    }
    let mut sges = Vec::with_capacity(wr.sg_list.len());
    let mut total = 0u64;
    for sge in wr.sg_list {
        let r = mrs.local(pd, sge, true)?;
        total += r.len() as u64;
        sges.push(r);
    }
    Ok(RecvWqe {
        wr_id: wr.wr_id,
        sges,
        total_len: total,
    })
}

/// Posts a list of work requests one by one with `post`, stopping at the first failure as
/// `ibv_post_send` does (`bad_wr`).
pub fn post_each<T>(
    wrs: &[T],
    mut post: impl FnMut(&T) -> Result<()>,
) -> std::result::Result<(), PostError> {
    for (index, wr) in wrs.iter().enumerate() {
        post(wr).map_err(|error| PostError { index, error })?;
    }
    Ok(())
}

/// The transport of a QP: reliable connected, unreliable connected or unreliable datagram.
#[derive(Debug)]
pub enum Transport {
    /// RC (boxed: it is much larger than UD's state).
    Rc(Box<RcTransport>),
    /// UC (boxed: larger than UD's state).
    Uc(Box<UcTransport>),
    /// UD.
    Ud(UdTransport),
}

impl Transport {
    /// The QP state.
    pub fn state(&self) -> QpState {
        match self {
            Transport::Rc(t) => t.state(),
            Transport::Uc(t) => t.state(),
            Transport::Ud(t) => t.state(),
        }
    }

    fn set_state(&mut self, cfg: RcConfig, attr: &QpAttr, next: QpState, env: &mut dyn Env) {
        match self {
            Transport::Rc(t) => t.set_state(cfg, next, env),
            Transport::Uc(t) => t.set_state(cfg, next, env),
            Transport::Ud(t) => {
                t.set_state(next, attr.qkey, remem_wire::Psn::new(attr.sq_psn), env)
            }
        }
    }

    fn post_send(&mut self, wqe: SendWqe, env: &mut dyn Env) {
        match self {
            Transport::Rc(t) => t.post_send(wqe, env),
            Transport::Uc(t) => t.post_send(wqe, env),
            Transport::Ud(t) => t.post_send(wqe, env),
        }
    }

    fn send_queue_len(&self) -> usize {
        match self {
            Transport::Rc(t) => t.send_queue_len(),
            Transport::Uc(t) => t.send_queue_len(),
            Transport::Ud(t) => t.send_queue_len(),
        }
    }

    /// Hands a packet to the transport if the QP's state takes it (rxe's
    /// `check_type_state`): RC requests in RTR, RTS and SQD, RC responses in RTS and SQD,
    /// UC and UD requests in RTR, RTS and SQD; the rest is dropped with its cause.
    fn handle_packet(
        &mut self,
        now: std::time::Instant,
        pkt: &crate::transport::RxPacket<'_>,
        src: &UdSource,
        env: &mut dyn Env,
    ) -> std::result::Result<(), DropCause> {
        match self {
            Transport::Rc(t) => {
                let takes = match t.state() {
                    QpState::Rtr => pkt.kind.is_request(),
                    QpState::Rts | QpState::Sqd => true,
                    _ => false,
                };
                if !takes {
                    return Err(DropCause::QpState);
                }
                t.handle_packet(now, pkt, env);
                Ok(())
            }
            Transport::Uc(t) => t.handle_packet(pkt, env).map_err(|e| match e {
                UcDrop::State => DropCause::QpState,
                UcDrop::Malformed => DropCause::Malformed,
                UcDrop::NoReceive => DropCause::NoReceive,
                UcDrop::Refused => DropCause::Refused,
            }),
            Transport::Ud(t) => t.handle_packet(pkt, src, env).map_err(|e| match e {
                UdDrop::State => DropCause::QpState,
                UdDrop::Malformed => DropCause::Malformed,
                UdDrop::Qkey => DropCause::BadQkey,
                UdDrop::NoReceive => DropCause::NoReceive,
            }),
        }
    }

    fn handle_timeout(&mut self, now: std::time::Instant, env: &mut dyn Env) {
        if let Transport::Rc(t) = self {
            t.handle_timeout(now, env);
        }
    }

    fn next_timeout(&self) -> Option<std::time::Instant> {
        match self {
            Transport::Rc(t) => t.next_timeout(),
            Transport::Uc(_) | Transport::Ud(_) => None,
        }
    }
}

pub use crate::engine::port::Path;

/// The state of a QP behind its lock: attributes, the transport and its environment.
#[derive(Debug)]
struct QpInner {
    /// Current attributes.
    attr: QpAttr,
    /// What the transport reaches: the receive queue, the device, the CQs.
    env: QpEnv,
    /// The transport.
    t: Transport,
}

/// The [`Env`] a QP's transport runs in, kept with the transport under the QP's lock: the
/// QP's own receive queue, and the device around it — the key table an rkey is resolved in
/// (one lookup, no indirection through a trait object), the counters and async event queue,
/// the QP's CQs and SRQ.
pub struct QpEnv {
    /// The device: key table, counters, async events.
    dev: Arc<DeviceShared>,
    /// The QP's number (in flushed completions).
    qpn: u32,
    /// The QP's protection domain (rkeys resolve in it).
    pd: PdId,
    /// Where send completions go.
    send_cq: Arc<SoftCq>,
    /// Where receive completions go.
    recv_cq: Arc<SoftCq>,
    /// The shared receive queue, if receives come from one.
    srq: Option<Arc<SoftSrq>>,
    /// The QP's own receive queue (unused when the QP has an SRQ).
    rq: VecDeque<RecvWqe>,
}

impl std::fmt::Debug for QpEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpEnv")
            .field("qpn", &self.qpn)
            .field("pd", &self.pd)
            .field("srq", &self.srq.is_some())
            .field("rq", &self.rq.len())
            .finish()
    }
}

impl QpEnv {
    /// A flushed receive completion (`IBV_WC_WR_FLUSH_ERR`) of work request `wr_id`.
    fn flushed_recv(&self, wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: remem_verbs::WcStatus::WrFlushErr,
            opcode: remem_verbs::WcOpcode::Recv,
            qp_num: self.qpn,
            ..WorkCompletion::default()
        }
    }

    /// Completes every receive of the QP's own queue as flushed.
    fn flush_rq(&mut self) {
        while let Some(w) = self.rq.pop_front() {
            self.recv_cq.push(self.flushed_recv(w.wr_id), false);
        }
    }
}

impl Env for QpEnv {
    fn remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        self.dev
            .mrs
            .remote_on(self.pd, self.qpn, rkey, va, len, need)
    }

    fn remote_region(
        &mut self,
        rkey: u32,
        need: AccessFlags,
    ) -> std::result::Result<Grant, RemoteKeyError> {
        self.dev.mrs.remote_region_on(self.pd, self.qpn, rkey, need)
    }

    fn local_op(&mut self, op: &SendOp) -> std::result::Result<(), WcStatus> {
        let mrs = &self.dev.mrs;
        match *op {
            SendOp::BindMw {
                mw,
                rkey,
                lkey,
                addr,
                len,
                access,
            } => {
                let mr = if lkey == 0 || len == 0 {
                    None
                } else {
                    Some(mrs.by_lkey(lkey).ok_or(WcStatus::MwBindErr)?)
                };
                let to = crate::mem::mr::MwBind {
                    mr: mr.as_ref(),
                    addr,
                    len,
                    access,
                };
                mrs.bind_mw(mw, self.pd, self.qpn, rkey as u8, &to)
                    .map(|_| ())
                    .map_err(|_| WcStatus::MwBindErr)
            }
            SendOp::LocalInv { rkey } => mrs
                .invalidate(self.pd, self.qpn, rkey, false)
                .map_err(|_| WcStatus::LocQpOpErr),
            _ => Err(WcStatus::LocQpOpErr),
        }
    }

    fn invalidate(&mut self, rkey: u32) -> bool {
        self.dev
            .mrs
            .invalidate(self.pd, self.qpn, rkey, true)
            .is_ok()
    }

    fn take_recv(&mut self) -> Option<RecvWqe> {
        match &self.srq {
            Some(srq) => srq.pop(),
            None => self.rq.pop_front(),
        }
    }

    fn send_completion(&mut self, wc: WorkCompletion) {
        self.send_cq.push(wc, false);
    }

    fn recv_completion(&mut self, wc: WorkCompletion, solicited: bool) {
        self.recv_cq.push(wc, solicited);
    }

    fn count(&mut self, stat: Stat) {
        self.dev.count(stat);
    }

    fn async_event(&mut self, event: remem_verbs::AsyncEvent) {
        self.dev.events.raise(event);
    }
}

/// The soft provider's queue pair (`ibv_qp`).
pub struct SoftQp {
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    sq_sig_all: bool,
    has_srq: bool,
    pd: PdId,
    window: u32,
    /// The device (posting resolves lkeys and address handles in it, and wakes its engine);
    /// the transport reaches it through [`QpEnv`].
    dev: Arc<DeviceShared>,
    /// The QP's share of the device's `max_qp`.
    _slot: Slot,
    inner: std::sync::Mutex<QpInner>,
    /// The engine's bookkeeping of this QP (its transmit hold, its timer deadline as the
    /// transport last said, its place in the engine's timed set).
    marks: crate::engine::port::QpMarks,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQp")
            .field("qpn", &self.qpn)
            .field("qp_type", &self.qp_type)
            .finish()
    }
}

/// Everything a [`SoftQp`] is made from (by its device, [`crate::verbs::pd::SoftPd`]).
pub(crate) struct SoftQpParts {
    /// QP number (allocated by the device).
    pub qpn: u32,
    /// Transport service.
    pub qp_type: QpType,
    /// Requested queue sizes.
    pub cap: QpCap,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
    /// The protection domain.
    pub pd: PdId,
    /// Most unacknowledged packets in flight.
    pub window: u32,
    /// The device: limits, key table, counters, events, engine.
    pub dev: Arc<DeviceShared>,
    /// The QP's share of the device's `max_qp`.
    pub slot: Slot,
    /// Where send completions go.
    pub send_cq: Arc<SoftCq>,
    /// Where receive completions go.
    pub recv_cq: Arc<SoftCq>,
    /// The shared receive queue, if any.
    pub srq: Option<Arc<SoftSrq>>,
}

impl SoftQp {
    /// Creates a QP in RESET, checking the requested caps against the device.
    pub(crate) fn new(parts: SoftQpParts) -> Result<Self> {
        let limits = parts.dev.limits;
        let cap = grant_cap(parts.cap, &limits)?;
        let attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
        let t = match parts.qp_type {
            QpType::Ud => Transport::Ud(UdTransport::new(parts.qpn, limits.active_mtu)),
            QpType::Uc => Transport::Uc(Box::new(UcTransport::new(rc_config(
                parts.qpn,
                &attr,
                parts.window,
            )))),
            QpType::Rc => Transport::Rc(Box::new(RcTransport::new(rc_config(
                parts.qpn,
                &attr,
                parts.window,
            )))),
        };
        let env = QpEnv {
            dev: parts.dev.clone(),
            qpn: parts.qpn,
            pd: parts.pd,
            send_cq: parts.send_cq,
            recv_cq: parts.recv_cq,
            srq: parts.srq,
            rq: VecDeque::new(),
        };
        Ok(SoftQp {
            qpn: parts.qpn,
            qp_type: parts.qp_type,
            cap,
            sq_sig_all: parts.sq_sig_all,
            has_srq: env.srq.is_some(),
            pd: parts.pd,
            window: parts.window,
            dev: parts.dev,
            _slot: parts.slot,
            inner: std::sync::Mutex::new(QpInner { attr, env, t }),
            marks: crate::engine::port::QpMarks::default(),
        })
    }

    /// Publishes the transport's next deadline (with the QP's lock held).
    fn publish_deadline(&self, t: &Transport) {
        self.marks.publish_deadline(t.next_timeout());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QpInner> {
        // A panic while holding the lock is a bug elsewhere; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the transport with this QP's environment and its path (RC, UC: packets
    /// go to its destination GID's address, at its UDP port if it names one, and come only
    /// from there), then flushes the receive queue if the QP ended up in ERR.
    fn with_env<R>(&self, f: impl FnOnce(&mut Transport, &mut QpEnv, Path) -> R) -> R {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let path = Path {
            dgid: crate::device::netdev::wire_gid(inner.attr.ah_attr.dgid),
            udp_port: inner.attr.ah_attr.udp_port,
        };
        let r = f(&mut inner.t, &mut inner.env, path);
        if inner.t.state() == QpState::Err {
            inner.env.flush_rq();
        }
        self.publish_deadline(&inner.t);
        r
    }

    /// Marks the QP as possibly having packets to send (wakes the device's engine).
    fn wake(&self) {
        self.dev.wake(self.qpn);
    }

    /// Whether the send queue holds work whose packets have not all left yet (RC: a
    /// request the requester may send, or a response owed; UC, UD: a work request not yet
    /// handed to the driver). A disconnection waits for this to clear before the QP goes
    /// to ERR (`cm::SoftCmId::disconnect`).
    pub(crate) fn has_unsent(&self) -> bool {
        let g = self.lock();
        match &g.t {
            Transport::Rc(t) => t.wants_transmit(std::time::Instant::now()),
            Transport::Uc(t) => t.send_queue_len() > 0,
            Transport::Ud(t) => t.send_queue_len() > 0,
        }
    }
}

/// What the engine sees of a QP: the transport behind the QP's lock, with its
/// environment and path (`SoftQp::with_env`).
impl QpPort for SoftQp {
    fn number(&self) -> u32 {
        self.qpn
    }

    fn service(&self) -> QpType {
        self.qp_type
    }

    fn marks(&self) -> &QpMarks {
        &self.marks
    }

    /// Handles a packet addressed to this QP, received from `src` (from UDP port
    /// `src_port`). What the QP's state does not take is dropped first
    /// ([`DropCause::QpState`]: anything in RESET, INIT or ERR, an RC response before RTS).
    /// An RC or UC QP connected to a peer (RTR, RTS, SQD) takes packets only from its
    /// destination GID's address, as rxe's `check_addr` does (an IPv4 source matches the
    /// IPv4-mapped GID of its address), and — when its path names a UDP port other than
    /// 4791 ([`Path::checks_source_port`]) — only from that port: one from any other
    /// source is dropped ([`DropCause::WrongSource`]) before it reaches the transport, so
    /// a third party can neither write through the QP nor forge its ACKs, NAKs or READ
    /// responses without spoofing the peer's address, and a QP answers only packets from
    /// where its answers go. UD datagrams may come from anywhere; their Q_Key is checked
    /// ([`DropCause::BadQkey`]).
    fn handle_packet(
        &self,
        now: std::time::Instant,
        pkt: &crate::transport::RxPacket<'_>,
        src: &UdSource,
        src_port: u16,
    ) -> std::result::Result<(), DropCause> {
        self.with_env(|t, env, path| {
            if matches!(t, Transport::Rc(_) | Transport::Uc(_))
                && matches!(t.state(), QpState::Rtr | QpState::Rts | QpState::Sqd)
                && !path.is_source(src.src, src_port)
            {
                return Err(DropCause::WrongSource);
            }
            t.handle_packet(now, pkt, src, env)
        })
    }

    /// The application dropped its last handle while the device still holds the QP to
    /// send what it owes (see [`crate::engine`]): it takes no more packets, runs no
    /// timers, and sends only the acknowledgements it had queued
    /// ([`RcTransport::release`]).
    fn release(&self) {
        let mut g = self.lock();
        match &mut g.t {
            Transport::Rc(t) => t.release(),
            Transport::Uc(t) => t.release(),
            Transport::Ud(t) => t.release(),
        }
        g.env.rq.clear();
    }

    /// Produces the next packet (`emit` gets its headers, the destination GID and a writer
    /// for its payload), and whether the QP may have more to send now, told under
    /// the same lock: `false` only when the transport knows it has nothing (an RC QP with
    /// no response owed and no request it may send: `RcTransport::wants_transmit`, which
    /// must stay conservative); UC and UD always say `true`. The engine then leaves the
    /// QP out of its ready queue until something marks it again (a post, a packet, a
    /// timer), instead of polling it once more for nothing. `requests_first`: an RC QP
    /// sends its own requests before what its responder owes
    /// (`RcTransport::poll_transmit_ordered`).
    fn poll_transmit(
        &self,
        now: std::time::Instant,
        requests_first: bool,
        emit: &mut Emit<'_>,
    ) -> (Option<Option<usize>>, bool) {
        self.with_env(|t, env, path| match t {
            Transport::Rc(rc) => {
                let built = rc.poll_transmit_ordered(now, env, requests_first, |tx, fill| {
                    emit(tx, path, fill)
                });
                let more = rc.wants_transmit(now);
                (built, more)
            }
            Transport::Uc(uc) => (uc.poll_transmit(env, |tx, fill| emit(tx, path, fill)), true),
            Transport::Ud(ud) => (
                ud.poll_transmit(env, |tx, target, fill| {
                    let path = Path {
                        dgid: crate::device::netdev::wire_gid(target.av.dgid),
                        udp_port: target.av.udp_port,
                    };
                    emit(tx, path, fill)
                }),
                true,
            ),
        })
    }

    /// Handles expired timers.
    fn handle_timeout(&self, now: std::time::Instant) {
        self.with_env(|t, env, _| t.handle_timeout(now, env));
    }

    /// The next deadline of this QP's timers.
    fn next_timeout(&self) -> Option<std::time::Instant> {
        self.lock().t.next_timeout()
    }
}

impl remem_verbs::QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn state(&self) -> QpState {
        self.lock().t.state()
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            let current = inner.t.state();
            let next = validate_modify(self.qp_type, current, attr, mask, &self.dev.limits)?;
            if mask.contains(QpAttrMask::AV) {
                self.dev.check_av(&attr.ah_attr)?;
            }
            apply_attr(&mut inner.attr, attr, mask);
            inner.attr.qp_state = next;
            let cfg = rc_config(self.qpn, &inner.attr, self.window);
            inner.t.set_state(cfg, &inner.attr, next, &mut inner.env);
            self.publish_deadline(&inner.t);
            match next {
                QpState::Err => inner.env.flush_rq(),
                QpState::Reset => inner.env.rq.clear(),
                _ => {}
            }
        }
        self.wake();
        Ok(())
    }

    fn query(&self) -> Result<QpAttr> {
        let g = self.lock();
        let mut attr = g.attr;
        attr.qp_state = g.t.state();
        attr.cur_qp_state = attr.qp_state;
        attr.cap = self.cap;
        Ok(attr)
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let r = post_each(wrs, |wr| {
            if !self.dev.limits.placement
                && matches!(wr.op, SendOp::Flush { .. } | SendOp::AtomicWrite { .. })
            {
                return Err(Error::Unsupported(
                    "FLUSH and ATOMIC WRITE on a device without the memory placement extensions",
                ));
            }
            let wqe = build_send_wqe(
                wr,
                self.qp_type,
                &self.cap,
                self.sq_sig_all,
                self.dev.limits.max_msg,
                self.pd,
                &self.dev,
            )?;
            self.with_env(|t, env, _| {
                let state = t.state();
                if !state.can_post_send() {
                    return Err(Error::InvalidQpState(state));
                }
                let outstanding = t.send_queue_len() as u32;
                if outstanding >= self.cap.max_send_wr {
                    return Err(Error::QueueFull { outstanding });
                }
                t.post_send(wqe, env);
                Ok(())
            })
        });
        if !wrs.is_empty() {
            self.wake();
        }
        r
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        post_each(wrs, |wr| {
            if self.has_srq {
                return Err(Error::InvalidArgument(
                    "this QP takes its receives from a shared receive queue".into(),
                ));
            }
            let wqe = build_recv_wqe(wr, self.cap.max_recv_sge, self.pd, &self.dev.mrs)?;
            let mut g = self.lock();
            let state = g.t.state();
            if !state.can_post_recv() {
                return Err(Error::InvalidQpState(state));
            }
            let env = &mut g.env;
            if state == QpState::Err {
                env.recv_cq.push(env.flushed_recv(wqe.wr_id), false);
                return Ok(());
            }
            if env.rq.len() >= self.cap.max_recv_wr as usize {
                return Err(Error::QueueFull {
                    outstanding: env.rq.len() as u32,
                });
            }
            env.rq.push_back(wqe);
            Ok(())
        })
    }

    fn attach_mcast(&self, mgid: &remem_verbs::Gid, _mlid: u16) -> Result<()> {
        let group = self.mcast_group(mgid)?;
        let engine = &self.dev.engine;
        engine
            .mcast
            .attach(engine, group, self.qpn, &self.dev.attr.mcast)
    }

    fn detach_mcast(&self, mgid: &remem_verbs::Gid, _mlid: u16) -> Result<()> {
        let group = self.mcast_group(mgid)?;
        self.dev.engine.mcast.detach(group, self.qpn)
    }
}

impl SoftQp {
    /// The IPv4 group of `mgid` for an attach or detach (the kernel's checks, `ib_attach_mcast`:
    /// EINVAL for a GID that is not multicast or a QP that is not UD).
    fn mcast_group(&self, mgid: &remem_verbs::Gid) -> Result<std::net::Ipv4Addr> {
        if self.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument(format!(
                "only UD QPs join multicast groups (QP {:#x} is {:?})",
                self.qpn, self.qp_type
            )));
        }
        crate::engine::mcast::group_of(mgid)?.ok_or_else(|| {
            Error::InvalidArgument(format!("{} is not a multicast GID", mgid.to_ipv6()))
        })
    }
}

impl Drop for SoftQp {
    /// A destroyed QP leaves every multicast group it was attached to.
    fn drop(&mut self) {
        if self.qp_type == QpType::Ud {
            self.dev.engine.mcast.detach_all(self.qpn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::{MemRegion, MemoryBuffer, Mtu, Sge};

    /// One region of bytes 0..=255 registered in PD 1 of an inline soft device, with
    /// LOCAL_WRITE only if `writable`.
    struct OneMr {
        /// Keeps the device open.
        _ctx: crate::SoftContext,
        dev: Arc<DeviceShared>,
        entry: Arc<crate::mem::mr::MrEntry>,
    }

    impl OneMr {
        fn lkey(&self) -> u32 {
            self.entry.lkey
        }

        fn addr(&self) -> u64 {
            self.entry.region().addr()
        }
    }

    fn mr(writable: bool) -> OneMr {
        let opts = crate::SoftOptions {
            inline: true,
            ..crate::SoftOptions::default()
        };
        let ctx = crate::SoftContext::bind_with("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
        let dev = ctx.shared().clone();
        let buf = Arc::new(MemoryBuffer::from_vec((0..=255u8).collect()));
        let access = if writable {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        let entry = dev
            .mrs
            .insert(PdId(1), MemRegion::whole(buf), access)
            .unwrap();
        OneMr {
            _ctx: ctx,
            dev,
            entry,
        }
    }

    fn limits() -> QpLimits {
        QpLimits {
            max_wr: 1024,
            max_sge: 4,
            max_inline: 64,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            active_mtu: 1024,
            max_msg: 1 << 31,
            placement: true,
        }
    }

    fn cap() -> QpCap {
        QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 16,
        }
    }

    #[test]
    fn caps_are_checked_and_rounded_up() {
        let lim = limits();
        assert!(grant_cap(cap(), &lim).is_ok());
        let mut c = cap();
        c.max_send_sge = 5;
        assert!(grant_cap(c, &lim).is_err());
        c = cap();
        c.max_inline_data = 65;
        assert!(grant_cap(c, &lim).is_err());
        c = cap();
        c.max_recv_wr = 0;
        assert_eq!(grant_cap(c, &lim).unwrap().max_recv_wr, 1);
        // The send WQE is max(sge * 16, inline) bytes; what fits is granted (rxe).
        let granted = |sge: u32, inline: u32| {
            let g = grant_cap(
                QpCap {
                    max_send_sge: sge,
                    max_inline_data: inline,
                    ..cap()
                },
                &lim,
            )
            .unwrap();
            (g.max_send_sge, g.max_inline_data)
        };
        assert_eq!(granted(2, 0), (2, 32));
        assert_eq!(granted(1, 0), (1, 16));
        assert_eq!(granted(0, 0), (1, 16));
        assert_eq!(granted(1, 40), (2, 40));
        assert_eq!(granted(2, 64), (4, 64));
        assert_eq!(granted(4, 64), (4, 64));
    }

    #[test]
    fn modify_checks_device_limits() {
        let lim = limits();
        let mut attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu2048,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER;
        assert!(matches!(
            validate_modify(QpType::Rc, QpState::Init, &attr, mask, &lim),
            Err(Error::InvalidAttribute {
                name: "path_mtu",
                ..
            })
        ));
        attr.path_mtu = Mtu::Mtu1024;
        attr.max_dest_rd_atomic = 17;
        assert!(validate_modify(QpType::Rc, QpState::Init, &attr, mask, &lim).is_err());
        attr.max_dest_rd_atomic = 16;
        assert_eq!(
            validate_modify(QpType::Rc, QpState::Init, &attr, mask, &lim).unwrap(),
            QpState::Rtr
        );
        let mut stored = QpAttr::default();
        apply_attr(&mut stored, &attr, mask);
        assert_eq!(stored.qp_state, QpState::Rtr);
        assert_eq!(stored.max_dest_rd_atomic, 16);
        let cfg = rc_config(5, &stored, 64);
        assert_eq!(cfg.mtu, 1024);
        assert_eq!(cfg.max_dest_rd_atomic, 16);
    }

    #[test]
    fn send_wqe_validation() {
        let m = mr(true);
        let base = m.addr();
        let sge = [Sge {
            addr: base + 10,
            length: 8,
            lkey: m.lkey(),
        }];
        let c = cap();
        let build = |wr: &SendWr<'_>, t| build_send_wqe(wr, t, &c, false, 1 << 31, PdId(1), &m.dev);
        let w = build(&SendWr::new(1, SendOp::Send, &sge), QpType::Rc).unwrap();
        assert_eq!(w.len, 8);
        assert!(w.signaled);
        // READ on UD/UC is not allowed.
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 0,
        };
        assert!(matches!(
            build(&SendWr::new(1, read, &sge), QpType::Ud),
            Err(Error::InvalidOpcode { .. })
        ));
        assert!(build(&SendWr::new(1, read, &sge), QpType::Uc).is_err());
        // UD needs a destination.
        assert!(build(&SendWr::new(1, SendOp::Send, &sge), QpType::Ud).is_err());
        // Too many SGEs.
        let three = [sge[0]; 3];
        assert!(matches!(
            build(&SendWr::new(1, SendOp::Send, &three), QpType::Rc),
            Err(Error::TooManySge { given: 3, max: 2 })
        ));
        // Atomics need exactly 8 bytes.
        let fa = SendOp::AtomicFetchAndAdd {
            remote_addr: 0,
            rkey: 0,
            add: 1,
        };
        let sge4 = [Sge {
            length: 4,
            ..sge[0]
        }];
        assert!(build(&SendWr::new(1, fa, &sge4), QpType::Rc).is_err());
        assert!(build(&SendWr::new(1, fa, &sge), QpType::Rc).is_ok());
        // Bad lkey (the region's rkey: the two namespaces are apart), another PD's lkey,
        // out of bounds.
        let rkey = m.entry.rkey;
        let bad = [Sge {
            lkey: rkey,
            ..sge[0]
        }];
        assert!(matches!(
            build(&SendWr::new(1, SendOp::Send, &bad), QpType::Rc),
            Err(Error::InvalidLkey { lkey }) if lkey == rkey
        ));
        assert!(matches!(
            build_send_wqe(
                &SendWr::new(1, SendOp::Send, &sge),
                QpType::Rc,
                &c,
                false,
                1 << 31,
                PdId(2),
                &m.dev
            ),
            Err(Error::InvalidLkey { .. })
        ));
        let oob = [Sge {
            addr: base + 250,
            length: 8,
            lkey: m.lkey(),
        }];
        assert!(matches!(
            build(&SendWr::new(1, SendOp::Send, &oob), QpType::Rc),
            Err(Error::SgeOutOfBounds { .. })
        ));
        // Inline copies at post time, within max_inline_data.
        let mut wr = SendWr::new(1, SendOp::Send, &sge);
        wr.flags |= SendFlags::INLINE;
        let w = build(&wr, QpType::Rc).unwrap();
        match &w.data {
            SendData::Inline(b) => assert_eq!(&b[..], &[10, 11, 12, 13, 14, 15, 16, 17]),
            _ => panic!("not inline"),
        }
        let big = [Sge {
            length: 17,
            ..sge[0]
        }];
        let mut wr = SendWr::new(1, SendOp::Send, &big);
        wr.flags |= SendFlags::INLINE;
        assert!(matches!(
            build(&wr, QpType::Rc),
            Err(Error::InlineTooLarge { given: 17, max: 16 })
        ));
        // ATOMIC WRITE carries exactly 8 bytes; FLUSH no local buffer; both RC only.
        let aw = SendOp::AtomicWrite {
            remote_addr: 0,
            rkey: 0,
        };
        let four = [Sge {
            length: 4,
            ..sge[0]
        }];
        assert!(matches!(
            build(&SendWr::new(1, aw, &four), QpType::Rc),
            Err(Error::InvalidArgument(_))
        ));
        let eight = sge;
        assert!(build(&SendWr::new(1, aw, &eight), QpType::Rc).is_ok());
        // Its 8 bytes may be inline even where max_inline_data is smaller (rxe keeps
        // them in the WQE); other inline data may not.
        let tiny = QpCap {
            max_inline_data: 0,
            ..c
        };
        let mut wr = SendWr::new(1, aw, &eight);
        wr.flags |= SendFlags::INLINE;
        let w = build_send_wqe(&wr, QpType::Rc, &tiny, false, 1 << 31, PdId(1), &m.dev).unwrap();
        match &w.data {
            SendData::Inline(b) => assert_eq!(&b[..], &[10, 11, 12, 13, 14, 15, 16, 17]),
            _ => panic!("not inline"),
        }
        let mut wr = SendWr::new(1, SendOp::Send, &eight);
        wr.flags |= SendFlags::INLINE;
        assert!(matches!(
            build_send_wqe(&wr, QpType::Rc, &tiny, false, 1 << 31, PdId(1), &m.dev),
            Err(Error::InlineTooLarge { given: 8, max: 0 })
        ));
        assert!(matches!(
            build(&SendWr::new(1, aw, &eight), QpType::Ud),
            Err(Error::InvalidOpcode { .. })
        ));
        let flush = SendOp::Flush {
            remote_addr: 0,
            rkey: 0,
            len: 64,
            flush_type: remem_verbs::FlushType::Global,
            level: remem_verbs::FlushLevel::Range,
        };
        assert!(build(&SendWr::new(1, flush, &[]), QpType::Rc).is_ok());
        assert!(matches!(
            build(&SendWr::new(1, flush, &eight), QpType::Rc),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn read_target_needs_local_write() {
        let m = mr(false);
        let sge = [Sge {
            addr: m.addr(),
            length: 8,
            lkey: m.lkey(),
        }];
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 0,
        };
        let r = build_send_wqe(
            &SendWr::new(1, read, &sge),
            QpType::Rc,
            &cap(),
            true,
            1 << 31,
            PdId(1),
            &m.dev,
        );
        assert!(matches!(r, Err(Error::LocalAccess { .. })));
        // A plain send from read-only memory is fine; sq_sig_all signals it.
        let mut wr = SendWr::new(1, SendOp::Send, &sge);
        wr.flags = SendFlags::empty();
        let w = build_send_wqe(&wr, QpType::Rc, &cap(), true, 1 << 31, PdId(1), &m.dev).unwrap();
        assert!(w.signaled);
        assert!(
            build_recv_wqe(
                &RecvWr {
                    wr_id: 1,
                    sg_list: &sge
                },
                2,
                PdId(1),
                &m.dev.mrs
            )
            .is_err()
        );
    }

    #[test]
    fn post_each_reports_bad_wr() {
        let mut seen = Vec::new();
        let r = post_each(&[1, 2, 3, 4], |x| {
            if *x == 3 {
                return Err(Error::QueueFull { outstanding: 2 });
            }
            seen.push(*x);
            Ok(())
        });
        assert_eq!(r.unwrap_err().index, 2);
        assert_eq!(seen, [1, 2]);
    }
}
