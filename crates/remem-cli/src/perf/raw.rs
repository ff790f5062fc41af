//! The benchmarks on the raw provider (`remem-verbs`), as perftest drives libibverbs.
//!
//! Each side has one CQ, one QP per `-q` (RC; UC for WRITE and SEND tests with `-c UC`;
//! UD for SEND tests with `-c UD`), and one
//! registered buffer with two areas per QP: a receive area (where the peer's WRITEs and
//! SENDs land, and what its READs and atomics target) and a source area (what this side
//! writes and sends). A UD receive area starts with the 40 bytes the GRH lands in. A soft
//! device is driven by the benchmark thread itself (no progress thread) unless
//! `--soft-thread`.
//!
//! The exchange on the control connection, after the settings and the server's hello:
//! ENDPOINTS each way (the server's first), READY from the server once its QPs are up;
//! then per size START (client), READY (server), the run, DONE with the operations the
//! client completed, and RESULT from the server: what it received, and with `-b` what it
//! sent and measured (its own run in the other direction). A last DONE of 0 ends it.

use super::ctrl::{self, Ctrl, Cursor};
use super::report::{self, BwRow, Row};
use super::{AtomicType, Conn, Device, Output, PORT, PerfError, Settings, Test};
use remem::verbs::rc::{self, RcOptions, RcPeer};
use remem::verbs::{
    AccessFlags, AhAttr, CmChannel, CmEvent, CmEventKind, CmId, CompletionQueue, ConnParam,
    Context, Gid, MemRegion, MemoryBuffer, MemoryRegion, Mtu, PortSpace, ProtectionDomain, QpAttr,
    QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendFlags, SendOp, SendWr,
    Sge, UdDest, WcStatus, WorkCompletion,
};
use remem_soft::SoftContext;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receive work requests carry this bit in their id.
pub(super) const RECV: u64 = 1 << 63;
/// Device passes between looks at the control connection while a latency test's passive
/// side spins ([`Side::spin_until_ctrl`]).
const CTRL_EVERY: u32 = 256;
/// Receives posted per QP for SEND tests.
const RX_DEPTH: u32 = 512;
/// Outstanding RDMA READs and atomics per QP (perftest's `-o` default is 16 too).
pub(super) const RD_ATOMIC: u8 = 16;
/// The Q_Key of UD QPs (perftest's `DEF_QKEY`).
pub(super) const QKEY: u32 = 0x1111_1111;
/// Bytes at the start of a UD receive buffer that receive the GRH.
pub(super) const GRH: usize = 40;
/// How long a UD receiver waits for stragglers once the sender is done: datagrams still
/// in flight arrive within it; lost ones never will.
pub(super) const UD_GRACE: Duration = Duration::from_millis(200);

fn err(what: &str) -> impl Fn(remem::verbs::Error) -> PerfError + '_ {
    move |e| format!("{what}: {e}")
}

/// What one side tells the other about one of its QPs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Endpoint {
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) gid: Gid,
    pub(super) mtu: u32,
    /// The QP's receive area.
    pub(super) addr: u64,
    pub(super) rkey: u32,
}

fn encode_endpoints(eps: &[Endpoint]) -> Vec<u8> {
    let mut b = (eps.len() as u32).to_be_bytes().to_vec();
    for e in eps {
        b.extend_from_slice(&e.qpn.to_be_bytes());
        b.extend_from_slice(&e.psn.to_be_bytes());
        b.extend_from_slice(e.gid.raw());
        b.extend_from_slice(&e.mtu.to_be_bytes());
        b.extend_from_slice(&e.addr.to_be_bytes());
        b.extend_from_slice(&e.rkey.to_be_bytes());
    }
    b
}

fn decode_endpoints(b: &[u8]) -> Option<Vec<Endpoint>> {
    let mut c = Cursor(b);
    let n = c.u32()? as usize;
    if n > 1024 {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let qpn = c.u32()?;
        let psn = c.u32()?;
        let gid = Gid(c.bytes(16)?.try_into().ok()?);
        let mtu = c.u32()?;
        let addr = c.u64()?;
        let rkey = c.u32()?;
        out.push(Endpoint {
            qpn,
            psn,
            gid,
            mtu,
            addr,
            rkey,
        });
    }
    Some(out)
}

/// One side's verbs objects.
pub(super) struct Side {
    soft: Option<Arc<SoftContext>>,
    cq: Arc<dyn CompletionQueue>,
    pub(super) qps: Vec<Arc<dyn QueuePair>>,
    pub(super) buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
    /// Bytes per area (the largest message or `min_area`, with the GRH on UD, rounded up
    /// to 64).
    area: usize,
    pub(super) gid_index: u8,
    pub(super) gid: Gid,
    /// The port's active MTU.
    pub(super) mtu: Mtu,
    /// The MTU of the path to the peer (after [`Side::connect`]).
    pub(super) path_mtu: Mtu,
    conn: Conn,
    /// Per QP, the peer's QP as a UD destination (UD only, after [`Side::connect`]).
    ud: Vec<UdDest>,
    psns: Vec<u32>,
    pd: Arc<dyn ProtectionDomain>,
    ctx: Arc<dyn Context>,
    /// With -R: the CM channel and ids of the QPs (kept while the QPs live).
    cm: Option<CmState>,
}

/// With -R: a side's CM channel and the ids of its QPs.
type CmState = (Arc<dyn CmChannel>, Vec<Arc<dyn CmId>>);

impl Side {
    /// Creates the objects on `dev`; each area holds at least `min_area` bytes.
    pub(super) fn new(s: &Settings, dev: &Device, min_area: usize) -> Result<Side, PerfError> {
        let ctx = dev.ctx.clone();
        let port = ctx.query_port(PORT).map_err(err("query_port"))?;
        let mtu = port.active_mtu;
        let pd = ctx.alloc_pd().map_err(err("alloc_pd"))?;
        let ud = s.conn == Conn::Ud;
        let qp_type = match s.conn {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
        };
        // A UD message is at most one MTU, after the GRH.
        let msg = if ud {
            s.max_size().min(u64::from(mtu.bytes())) as usize + GRH
        } else {
            // With --verify: one slot per operation in flight.
            s.area_bytes() as usize
        };
        let area = msg.max(min_area).div_ceil(64) * 64;
        let qps_n = s.qps as usize;
        let buf = Arc::new(
            MemoryBuffer::zeroed(2 * area * qps_n)
                .map_err(|e| format!("cannot allocate {} bytes: {e}", 2 * area * qps_n))?,
        );
        let mr = pd
            .reg_mr(
                MemRegion::whole(buf.clone()),
                AccessFlags::LOCAL_WRITE | (AccessFlags::REMOTE - AccessFlags::FLUSH_PERSISTENT),
            )
            .map_err(err("reg_mr"))?;
        let rx = if s.test.is_send() {
            RX_DEPTH.min(32_000 / s.qps).max(2)
        } else {
            1
        };
        // Unsignaled sends hold their slot until a later signaled one completes.
        let sq = s.tx_depth + 16;
        let cqe = (s.qps * (sq + rx) + 16).min(32_767);
        let cq = ctx.create_cq(cqe, None).map_err(err("create_cq"))?;
        let mut qps = Vec::new();
        let mut psns = Vec::new();
        for _ in 0..qps_n {
            let qp = pd
                .create_qp(&QpInitAttr {
                    qp_type,
                    send_cq: cq.clone(),
                    recv_cq: cq.clone(),
                    srq: None,
                    cap: QpCap {
                        max_send_wr: sq,
                        max_recv_wr: rx,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: s.inline_size,
                    },
                    sq_sig_all: false,
                })
                .map_err(err("create_qp"))?;
            let (attr, mask) = if ud {
                (
                    QpAttr {
                        qp_state: QpState::Init,
                        port_num: PORT,
                        qkey: QKEY,
                        ..QpAttr::default()
                    },
                    QpAttrMask::STATE
                        | QpAttrMask::PKEY_INDEX
                        | QpAttrMask::PORT
                        | QpAttrMask::QKEY,
                )
            } else {
                // A UC QP grants what UC has: remote WRITE.
                let access = if qp_type == QpType::Uc {
                    AccessFlags::REMOTE_WRITE
                } else {
                    AccessFlags::REMOTE
                };
                (
                    QpAttr {
                        qp_state: QpState::Init,
                        port_num: PORT,
                        qp_access_flags: access,
                        ..QpAttr::default()
                    },
                    QpAttrMask::RC_TO_INIT,
                )
            };
            qp.modify(&attr, mask).map_err(err("modify_qp to INIT"))?;
            qps.push(qp);
            // Initial PSNs from the thread's CSPRNG (rand), never the clock.
            psns.push(rand::random::<u32>() & 0x00ff_ffff);
        }
        let side = Side {
            soft: dev.soft.clone(),
            cq,
            qps,
            buf,
            mr,
            area,
            gid_index: dev.gid_index,
            gid: dev.gid,
            mtu,
            path_mtu: mtu,
            conn: s.conn,
            ud: Vec::new(),
            psns,
            pd,
            ctx,
            cm: None,
        };
        if rx > 1 {
            for q in 0..qps_n {
                for _ in 0..rx {
                    side.post_recv(q)?;
                }
            }
        }
        Ok(side)
    }

    pub(super) fn recv_area(&self, q: usize) -> usize {
        2 * q * self.area
    }

    pub(super) fn src_area(&self, q: usize) -> usize {
        (2 * q + 1) * self.area
    }

    fn sge(&self, offset: usize, len: u64) -> Sge {
        Sge {
            addr: self.mr.addr() + offset as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    pub(super) fn post_recv(&self, q: usize) -> Result<(), PerfError> {
        let sge = [self.sge(self.recv_area(q), self.area as u64)];
        self.qps[q]
            .post_recv(&[RecvWr {
                wr_id: RECV | q as u64,
                sg_list: &sge,
            }])
            .map_err(|e| format!("post_recv: {}", e.error))
    }

    pub(super) fn endpoints(&self) -> Vec<Endpoint> {
        (0..self.qps.len())
            .map(|q| Endpoint {
                qpn: self.qps[q].qp_num(),
                psn: self.psns[q],
                gid: self.gid,
                mtu: self.mtu.bytes(),
                addr: self.mr.addr() + self.recv_area(q) as u64,
                rkey: self.mr.rkey(),
            })
            .collect()
    }

    /// Connects QP `q` to `remote[q]`, with up to `rd_atomic` RDMA READs and atomics
    /// outstanding towards the peer. RC QPs go to RTR (the peer's QPN and PSN) and RTS;
    /// UC QPs too, with only the attributes UC takes (no READ/atomic resources, timeout,
    /// retries or RNR timer); UD QPs to RTS with an address handle for the peer's QP.
    pub(super) fn connect(&mut self, remote: &[Endpoint], rd_atomic: u8) -> Result<(), PerfError> {
        if remote.len() != self.qps.len() {
            return Err(format!(
                "the peer has {} QPs, this side {}",
                remote.len(),
                self.qps.len()
            ));
        }
        let mut path_mtu = self.mtu;
        let mut ud = Vec::new();
        for (q, r) in remote.iter().enumerate() {
            let mtu = Mtu::from_bytes(r.mtu)
                .ok_or_else(|| format!("the peer sent an MTU of {}", r.mtu))?
                .min(self.mtu);
            path_mtu = path_mtu.min(mtu);
            let av = AhAttr {
                dgid: r.gid,
                sgid_index: self.gid_index,
                hop_limit: 64,
                is_global: true,
                port_num: PORT,
                ..AhAttr::default()
            };
            if self.conn == Conn::Ud {
                let mut attr = QpAttr {
                    qp_state: QpState::Rtr,
                    ..QpAttr::default()
                };
                self.qps[q]
                    .modify(&attr, QpAttrMask::STATE)
                    .map_err(err("modify_qp to RTR"))?;
                attr.qp_state = QpState::Rts;
                attr.sq_psn = self.psns[q];
                self.qps[q]
                    .modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
                    .map_err(err("modify_qp to RTS"))?;
                ud.push(UdDest {
                    ah: self.pd.create_ah(&av).map_err(err("create_ah"))?,
                    remote_qpn: r.qpn,
                    remote_qkey: QKEY,
                });
                continue;
            }
            // RC and UC alike (the helper leaves out what UC has not).
            let o = RcOptions {
                port_num: PORT,
                sgid_index: self.gid_index,
                sq_psn: self.psns[q],
                mtu,
                max_rd_atomic: rd_atomic,
                max_dest_rd_atomic: RD_ATOMIC,
                min_rnr_timer: 12,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                ..RcOptions::default()
            };
            let peer = RcPeer {
                qpn: r.qpn,
                psn: r.psn,
                gid: r.gid,
                mtu,
            };
            rc::to_rtr(&*self.qps[q], &peer, &o).map_err(err("modify_qp to RTR"))?;
            rc::to_rts(&*self.qps[q], &o).map_err(err("modify_qp to RTS"))?;
        }
        self.path_mtu = path_mtu;
        self.ud = ud;
        Ok(())
    }

    /// The QP type's name (RC, UC, UD).
    /// -R, the server: a CM listener on this device's address and `port`.
    fn cm_listen(&mut self, port: u16) -> Result<Arc<dyn CmId>, PerfError> {
        let ch = self
            .ctx
            .create_cm_channel()
            .map_err(err("rdma_create_event_channel"))?;
        let id = self
            .ctx
            .create_cm_id(&ch, PortSpace::Tcp)
            .map_err(err("rdma_create_id"))?;
        id.bind(std::net::SocketAddr::new(self.gid.to_ip(), port))
            .map_err(err("rdma_bind_addr"))?;
        id.listen(self.qps.len() as u32)
            .map_err(err("rdma_listen"))?;
        self.cm = Some((ch, vec![id.clone()]));
        Ok(id)
    }

    /// The next CM event, moving the device meanwhile when this side drives it.
    fn cm_event(&self, limit: Duration) -> Result<CmEvent, PerfError> {
        let (ch, _) = self.cm.as_ref().ok_or("no CM channel")?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(ev) = ch.get_event() {
                return Ok(ev);
            }
            if Instant::now() > deadline {
                return Err(format!("RDMA CM: no event within {limit:?}"));
            }
            self.drive(Duration::from_millis(1))?;
        }
    }

    fn cm_expect(&self, kind: CmEventKind, limit: Duration) -> Result<CmEvent, PerfError> {
        let ev = self.cm_event(limit)?;
        if ev.kind != kind {
            return Err(format!(
                "RDMA CM: {:?} (status {}) while waiting for {kind:?}",
                ev.kind, ev.status
            ));
        }
        Ok(ev)
    }

    fn cm_param(q: usize) -> ConnParam {
        ConnParam {
            private_data: (q as u32).to_be_bytes().to_vec(),
            responder_resources: RD_ATOMIC,
            initiator_depth: RD_ATOMIC,
            ..ConnParam::default()
        }
    }

    /// -R, the server: accepts one request per QP (the request names its QP index), each
    /// QP moved to RTS by the CM.
    fn cm_accept(
        &mut self,
        _listener: Arc<dyn CmId>,
        n: usize,
        limit: Duration,
    ) -> Result<(), PerfError> {
        if n != self.qps.len() {
            return Err(format!(
                "the peer has {n} QPs, this side {}",
                self.qps.len()
            ));
        }
        // Requests and establishments interleave (a client connects its QPs one by one).
        let mut ids = Vec::new();
        let mut established = 0;
        while established < n {
            let ev = self.cm_event(limit)?;
            match ev.kind {
                CmEventKind::ConnectRequest if ids.len() < n => {
                    let q = ev
                        .private_data
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                        .filter(|&q| q < self.qps.len())
                        .ok_or("RDMA CM: a request without a QP index")?;
                    ev.id
                        .set_qp(Some(self.qps[q].clone()))
                        .map_err(err("rdma_create_qp"))?;
                    ev.id
                        .accept(&Self::cm_param(q))
                        .map_err(err("rdma_accept"))?;
                    ids.push(ev.id.clone());
                }
                CmEventKind::Established => established += 1,
                kind => {
                    return Err(format!(
                        "RDMA CM: {kind:?} (status {}) while connecting the QPs",
                        ev.status
                    ));
                }
            }
        }
        self.cm_done(ids)
    }

    /// -R, the client: connects each QP to the server's CM at `dst`.
    fn cm_connect(&mut self, dst: std::net::SocketAddr, limit: Duration) -> Result<(), PerfError> {
        let ch = self
            .ctx
            .create_cm_channel()
            .map_err(err("rdma_create_event_channel"))?;
        self.cm = Some((ch.clone(), Vec::new()));
        let mut ids = Vec::new();
        for q in 0..self.qps.len() {
            let id = self
                .ctx
                .create_cm_id(&ch, PortSpace::Tcp)
                .map_err(err("rdma_create_id"))?;
            id.resolve_addr(None, dst, limit)
                .map_err(err("rdma_resolve_addr"))?;
            self.cm_expect(CmEventKind::AddrResolved, limit)?;
            id.resolve_route(limit).map_err(err("rdma_resolve_route"))?;
            self.cm_expect(CmEventKind::RouteResolved, limit)?;
            id.set_qp(Some(self.qps[q].clone()))
                .map_err(err("rdma_create_qp"))?;
            id.connect(&Self::cm_param(q))
                .map_err(err("rdma_connect"))?;
            self.cm_expect(CmEventKind::Established, limit)?;
            ids.push(id);
        }
        self.cm_done(ids)
    }

    /// After the CM connected every QP: the path MTU it chose; the ids stay with the QPs.
    fn cm_done(&mut self, ids: Vec<Arc<dyn CmId>>) -> Result<(), PerfError> {
        let mut path_mtu = self.mtu;
        for qp in &self.qps {
            path_mtu = path_mtu.min(qp.query().map_err(err("query_qp"))?.path_mtu);
        }
        self.path_mtu = path_mtu;
        if let Some((_, keep)) = self.cm.as_mut() {
            keep.extend(ids);
        }
        Ok(())
    }

    pub(super) fn conn_name(&self) -> &'static str {
        self.conn.name()
    }

    /// Whether a message can be lost without an error (UD and UC: nothing is
    /// acknowledged or retransmitted), so a receiver does not wait for every one.
    pub(super) fn unreliable(&self) -> bool {
        matches!(self.conn, Conn::Ud | Conn::Uc)
    }

    /// A send work request on QP `q` (with the peer's address on UD).
    pub(super) fn wr<'a>(&self, q: usize, wr_id: u64, op: SendOp, sge: &'a [Sge]) -> SendWr<'a> {
        let mut wr = SendWr::new(wr_id, op, sge);
        wr.ud = self.ud.get(q).cloned();
        wr
    }

    /// Whether this side moves its device's packets itself (see [`Side::drive`]).
    pub(super) fn drives(&self) -> bool {
        self.soft.is_some()
    }

    /// Moves packets (an inline soft device); waits up to `wait` when there is nothing to
    /// do. Other devices move packets by themselves: this only yields the thread.
    pub(super) fn drive(&self, wait: Duration) -> Result<(), PerfError> {
        match &self.soft {
            Some(soft) => {
                soft.progress(wait).map_err(err("progress"))?;
            }
            None if !wait.is_zero() => std::thread::yield_now(),
            None => {}
        }
        Ok(())
    }

    pub(super) fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PerfError> {
        let n = self.cq.poll(wcs).map_err(err("poll_cq"))?;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "work completion with status {:?} (wr_id {:#x}, vendor error {:#x}){}",
                    wc.status,
                    wc.wr_id,
                    wc.vendor_err,
                    self.counters()
                ));
            }
        }
        Ok(n)
    }

    /// The device's non-zero counters (retries, NAKs, …), to explain a failed run.
    fn counters(&self) -> String {
        let c: Vec<String> = self
            .ctx
            .counters()
            .iter()
            .filter(|c| c.value != 0)
            .map(|c| format!("{}={}", c.name, c.value))
            .collect();
        if c.is_empty() {
            String::new()
        } else {
            format!("; device counters: {}", c.join(" "))
        }
    }

    /// Polls the CQ, reposts the receives it finds and adds them to `got`; send
    /// completions found are dropped. Returns the number of receives.
    pub(super) fn take_recvs(
        &self,
        wcs: &mut [WorkCompletion],
        got: &mut u64,
    ) -> Result<u64, PerfError> {
        let n = self.poll(wcs)?;
        let mut recvs = 0;
        for wc in &wcs[..n] {
            if wc.wr_id & RECV != 0 {
                recvs += 1;
                self.post_recv((wc.wr_id & 0xffff_ffff) as usize)?;
            }
        }
        *got += recvs;
        Ok(recvs)
    }

    /// Receives (and reposts) until `got` reaches `expected`. On RC every message the
    /// peer saw complete has arrived; a peer that claims more than come within `quiet`
    /// is an error. On UD and UC a lost message never comes: the wait ends `UD_GRACE`
    /// after the last arrival.
    pub(super) fn receive_rest(
        &self,
        got: &mut u64,
        expected: u64,
        quiet: Duration,
    ) -> Result<(), PerfError> {
        let mut wcs = [WorkCompletion::default(); 64];
        let mut last = Instant::now();
        while *got < expected {
            if self.take_recvs(&mut wcs, got)? > 0 {
                last = Instant::now();
                self.drive(Duration::ZERO)?;
                continue;
            }
            if self.unreliable() && last.elapsed() >= UD_GRACE {
                return Ok(());
            }
            if !self.unreliable() && last.elapsed() >= quiet {
                return Err(format!(
                    "the peer sent {expected} messages; {got} arrived and nothing more for \
                     {:.1} s",
                    quiet.as_secs_f64()
                ));
            }
            self.drive(Duration::from_micros(100))?;
        }
        Ok(())
    }

    /// Waits for a control frame (at most `limit`), moving packets meanwhile; with `got`,
    /// also takes (reposts and counts) the receives that complete meanwhile.
    fn wait_ctrl(
        &self,
        ctrl: &mut Ctrl,
        limit: Option<Duration>,
        mut got: Option<&mut u64>,
    ) -> Result<(u8, Vec<u8>), PerfError> {
        if self.soft.is_none() && got.is_none() {
            return ctrl.recv_within(limit);
        }
        let deadline = limit.map(|l| Instant::now() + l);
        let mut wcs = [WorkCompletion::default(); 64];
        loop {
            if let Some(frame) = ctrl.try_recv()? {
                return Ok(frame);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(ctrl.silent(limit.unwrap_or_default()));
            }
            let mut busy = false;
            if let Some(got) = got.as_deref_mut() {
                busy = self.take_recvs(&mut wcs, got)? > 0;
            }
            self.drive(if busy {
                Duration::ZERO
            } else {
                Duration::from_millis(1)
            })?;
        }
    }

    /// Waits for the control frame `tag` (at most `limit`) while moving packets without
    /// ever sleeping: the control connection is looked at only every [`CTRL_EVERY`]
    /// passes (each look is a few syscalls), the device is pumped in between.
    fn spin_until_ctrl(
        &self,
        ctrl: &mut Ctrl,
        tag: u8,
        limit: Option<Duration>,
    ) -> Result<Vec<u8>, PerfError> {
        let deadline = limit.map(|l| Instant::now() + l);
        let mut spins = 0u32;
        loop {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(CTRL_EVERY) {
                if let Some((t, payload)) = ctrl.try_recv()? {
                    ctrl::check_tag(t, tag)?;
                    return Ok(payload);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(ctrl.silent(limit.unwrap_or_default()));
                }
            }
            self.drive(Duration::ZERO)?;
        }
    }

    fn wait_ctrl_expect(
        &self,
        ctrl: &mut Ctrl,
        tag: u8,
        limit: Option<Duration>,
        got: Option<&mut u64>,
    ) -> Result<Vec<u8>, PerfError> {
        let (t, payload) = self.wait_ctrl(ctrl, limit, got)?;
        ctrl::check_tag(t, tag)?;
        Ok(payload)
    }

    /// The operation a bandwidth/latency client posts on QP `q`.
    pub(super) fn op(&self, s: &Settings, remote: &Endpoint) -> SendOp {
        match s.test {
            Test::WriteBw | Test::WriteLat => SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            Test::ReadBw | Test::ReadLat => SendOp::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            Test::SendBw | Test::SendLat => SendOp::Send,
            Test::AtomicBw | Test::AtomicLat => match s.atomic {
                AtomicType::FetchAndAdd => SendOp::AtomicFetchAndAdd {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                    add: 1,
                },
                AtomicType::CmpAndSwap => SendOp::AtomicCmpAndSwp {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                    compare: 0,
                    swap: 0,
                },
            },
        }
    }

    /// The local memory of an operation on QP `q`: READs and atomics fill the receive
    /// area, the others send from the source area.
    pub(super) fn local(&self, s: &Settings, q: usize, size: u64) -> Sge {
        match s.test {
            Test::ReadBw | Test::ReadLat | Test::AtomicBw | Test::AtomicLat => {
                self.sge(self.recv_area(q), size)
            }
            _ => self.sge(self.src_area(q), size),
        }
    }

    pub(super) fn flags(&self, s: &Settings, size: u64) -> SendFlags {
        let inline = matches!(
            s.test,
            Test::WriteBw | Test::WriteLat | Test::SendBw | Test::SendLat
        ) && size <= u64::from(s.inline_size);
        if inline {
            SendFlags::INLINE
        } else {
            SendFlags::empty()
        }
    }
}

fn handshake(
    ctrl: &mut Ctrl,
    side: &mut Side,
    s: &Settings,
    server: bool,
) -> Result<Vec<Endpoint>, PerfError> {
    let mine = encode_endpoints(&side.endpoints());
    // With -R the server listens before it says where it is (its endpoints' GID).
    let listener = match (s.cm, server) {
        (Some(port), true) => Some(side.cm_listen(port)?),
        _ => None,
    };
    let theirs = if server {
        ctrl.send(ctrl::ENDPOINTS, &mine)?;
        ctrl.expect(ctrl::ENDPOINTS)?
    } else {
        let t = ctrl.expect(ctrl::ENDPOINTS)?;
        ctrl.send(ctrl::ENDPOINTS, &mine)?;
        t
    };
    let remote = decode_endpoints(&theirs).ok_or("malformed endpoint information")?;
    match (s.cm, listener) {
        (Some(_), Some(l)) => side.cm_accept(l, remote.len(), ctrl.timeout())?,
        (Some(port), None) => {
            let dst = std::net::SocketAddr::new(remote[0].gid.to_ip(), port);
            side.cm_connect(dst, ctrl.timeout())?
        }
        _ => side.connect(&remote, RD_ATOMIC)?,
    }
    Ok(remote)
}

/// How long a wait that spans a run may take: the run's duration and the control
/// timeout, or without bound for a number of iterations (the connection's end ends it).
pub(super) fn run_limit(s: &Settings, ctrl: &Ctrl) -> Option<Duration> {
    s.duration.map(|d| d + ctrl.timeout())
}

/// The server's account of a size (the RESULT frame).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Tally {
    /// Messages this side received (SEND tests).
    pub(super) received: u64,
    /// Operations this side completed (bidirectional runs).
    pub(super) sent: u64,
    /// This side's own run (bidirectional runs).
    pub(super) row: Option<BwRow>,
}

impl Tally {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(57);
        b.extend_from_slice(&self.received.to_be_bytes());
        b.extend_from_slice(&self.sent.to_be_bytes());
        if let Some(r) = &self.row {
            b.push(1);
            for v in [r.size, r.iterations] {
                b.extend_from_slice(&v.to_be_bytes());
            }
            for v in [r.peak_bps, r.avg_bps, r.msg_rate] {
                b.extend_from_slice(&v.to_bits().to_be_bytes());
            }
        } else {
            b.push(0);
        }
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Tally> {
        let mut c = Cursor(b);
        let received = c.u64()?;
        let sent = c.u64()?;
        let row = match c.u8()? {
            0 => None,
            1 => Some(BwRow {
                size: c.u64()?,
                iterations: c.u64()?,
                peak_bps: c.f64()?,
                avg_bps: c.f64()?,
                msg_rate: c.f64()?,
            }),
            _ => return None,
        };
        c.0.is_empty().then_some(Tally {
            received,
            sent,
            row,
        })
    }
}

/// The server: sets up, then serves each size the client runs.
pub(crate) fn server(mut ctrl: Ctrl, s: &Settings, dev: &Device) -> Result<(), PerfError> {
    let result = serve_sizes(&mut ctrl, s, dev);
    if let Err(e) = &result {
        ctrl.fail(e);
    }
    result
}

fn serve_sizes(ctrl: &mut Ctrl, s: &Settings, dev: &Device) -> Result<(), PerfError> {
    let mut side = Side::new(s, dev, 0)?;
    let remote = handshake(ctrl, &mut side, s, true)?;
    ctrl.send(ctrl::READY, &[])?;
    let mut wcs = [WorkCompletion::default(); 64];
    let receives = s.test.is_send();
    loop {
        let mut got = 0u64;
        let payload = {
            let (tag, payload) = side.wait_ctrl(ctrl, Some(ctrl.timeout()), None)?;
            match tag {
                ctrl::DONE => return Ok(()),
                ctrl::START => payload,
                other => return Err(format!("control: unexpected frame {other}")),
            }
        };
        let size = Cursor(&payload).u64().ok_or("malformed START")?;
        if s.verify {
            super::verify::prepare_server(&side, s.test == Test::WriteBw, size, s.tx_depth)?;
        }
        ctrl.send(ctrl::READY, &[])?;
        let mut tally = Tally {
            received: 0,
            sent: 0,
            row: None,
        };
        if matches!(s.test, Test::WriteLat | Test::SendLat) {
            pong(&side, s, &remote[0], size, &mut wcs, ctrl)?;
        } else if s.bidir {
            // This side runs the same test towards the client meanwhile.
            let (row, sent) = bandwidth(&side, s, &remote, size, &mut got, &mut None)?;
            tally.sent = sent;
            tally.row = Some(row);
        }
        // The client's end of this size (receiving meanwhile on SEND tests).
        let p = if matches!(s.test, Test::ReadLat | Test::AtomicLat) && side.drives() {
            // The client's READs and atomics are answered by this side's device, which
            // this thread drives: it must keep polling, not sleep in `poll` between
            // requests (a sleeping thread's wake-up would be most of the latency).
            side.spin_until_ctrl(ctrl, ctrl::DONE, run_limit(s, ctrl))?
        } else {
            side.wait_ctrl_expect(
                ctrl,
                ctrl::DONE,
                if matches!(s.test, Test::WriteLat | Test::SendLat) {
                    Some(ctrl.timeout())
                } else {
                    run_limit(s, ctrl)
                },
                receives.then_some(&mut got),
            )?
        };
        let expected = Cursor(&p).u64().ok_or("malformed DONE")?;
        if s.verify && s.test == Test::WriteBw {
            super::verify::check_writes(&side, size, s.tx_depth, expected)?;
        }
        if receives && s.test.is_bw() {
            // Every SEND the client saw complete has arrived here (RC), or will not (UD).
            side.receive_rest(&mut got, expected, ctrl.timeout())?;
        }
        tally.received = got;
        ctrl.send(ctrl::RESULT, &tally.encode())?;
    }
}

fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// The server half of a ping-pong: answer each of the client's messages.
fn pong(
    side: &Side,
    s: &Settings,
    remote: &Endpoint,
    size: u64,
    wcs: &mut [WorkCompletion],
    ctrl: &mut Ctrl,
) -> Result<(), PerfError> {
    // Nothing comes on the control connection during a ping-pong but news that the client
    // gave up (or vanished): look now and then, so a lost ping cannot hang the server.
    // (Every 4096 spins and at most every millisecond: a look costs a few syscalls, and a
    // spin without a soft device to drive is quick.)
    let mut spins = 0u32;
    let mut looked = Instant::now();
    let mut check = move || -> Result<(), PerfError> {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096)
            && looked.elapsed() >= Duration::from_millis(1)
            && let Some((tag, _)) = {
                looked = Instant::now();
                ctrl.try_recv()?
            }
        {
            return Err(format!(
                "control: unexpected frame {tag} during a ping-pong"
            ));
        }
        Ok(())
    };
    let op = side.op(s, remote);
    let sge = [side.local(s, 0, size)];
    let flags = side.flags(s, size);
    let last = side.recv_area(0) + size as usize - 1;
    let mut byte = [0u8];
    for i in 0..s.iters {
        let m = marker(i);
        // Wait for the ping.
        match s.test {
            Test::WriteLat => loop {
                side.buf.read(last, &mut byte).map_err(|e| e.to_string())?;
                if byte[0] == m {
                    break;
                }
                side.drive(Duration::ZERO)?;
                drain(side, wcs)?;
                check()?;
            },
            _ => wait_recv(side, wcs, &mut check)?,
        }
        side.buf
            .write(side.src_area(0) + size as usize - 1, &[m])
            .map_err(|e| e.to_string())?;
        post(side, 0, op, &sge, flags, i)?;
        side.drive(Duration::ZERO)?;
    }
    Ok(())
}

/// Posts one operation; every 8th is signaled (and reaped by [`drain`]).
pub(super) fn post(
    side: &Side,
    q: usize,
    op: SendOp,
    sge: &[Sge],
    flags: SendFlags,
    i: u64,
) -> Result<(), PerfError> {
    let mut wr = side.wr(q, i, op, sge);
    wr.flags = flags;
    if i % 8 == 7 {
        wr.flags |= SendFlags::SIGNALED;
    }
    side.qps[q]
        .post_send(&[wr])
        .map_err(|e| format!("post_send: {}", e.error))
}

/// Reaps send completions without waiting; reposts receives it finds.
pub(super) fn drain(side: &Side, wcs: &mut [WorkCompletion]) -> Result<u64, PerfError> {
    let mut got = 0;
    side.take_recvs(wcs, &mut got)
}

/// Waits for one receive completion (and reposts it).
pub(super) fn wait_recv(
    side: &Side,
    wcs: &mut [WorkCompletion],
    check: &mut dyn FnMut() -> Result<(), PerfError>,
) -> Result<(), PerfError> {
    // One at a time, so a second receive stays in the CQ for the next call.
    let one = &mut wcs[..1];
    loop {
        if drain(side, one)? > 0 {
            return Ok(());
        }
        side.drive(Duration::ZERO)?;
        check()?;
    }
}

/// The client: sets up, runs every size, and prints each result as it comes.
pub(crate) fn client(
    mut ctrl: Ctrl,
    s: &Settings,
    dev: &Device,
    out: &mut Output,
) -> Result<Vec<Row>, PerfError> {
    let result = run_sizes(&mut ctrl, s, dev, out);
    if let Err(e) = &result {
        ctrl.fail(e);
    }
    result
}

fn run_sizes(
    ctrl: &mut Ctrl,
    s: &Settings,
    dev: &Device,
    out: &mut Output,
) -> Result<Vec<Row>, PerfError> {
    let mut side = Side::new(s, dev, 0)?;
    let remote = handshake(ctrl, &mut side, s, false)?;
    let (fit, note) = s.fit_path_mtu(u64::from(side.path_mtu.bytes()));
    if let Some(n) = note {
        out.note(&n);
    }
    let s = &fit;
    side.wait_ctrl_expect(ctrl, ctrl::READY, Some(ctrl.timeout()), None)?;
    let mut rows = Vec::new();
    for &size in &s.sizes {
        ctrl.send(ctrl::START, &size.to_be_bytes())?;
        side.wait_ctrl_expect(ctrl, ctrl::READY, Some(ctrl.timeout()), None)?;
        let mut progress = out.progress();
        let mut got = 0u64;
        let (row, count) = if s.test.is_bw() {
            let (row, count) = bandwidth(&side, s, &remote, size, &mut got, &mut progress)?;
            (Row::Bw(row), count)
        } else {
            let row = latency(&side, s, &remote[0], size, &mut progress)?;
            (Row::Lat(row), row.iterations)
        };
        drop(progress);
        ctrl.send(ctrl::DONE, &count.to_be_bytes())?;
        // With -b the server may still be running (and sending): receive meanwhile.
        let receives = s.bidir && s.test.is_send();
        let p = side.wait_ctrl_expect(
            ctrl,
            ctrl::RESULT,
            if s.bidir {
                run_limit(s, ctrl)
            } else {
                Some(ctrl.timeout())
            },
            receives.then_some(&mut got),
        )?;
        let tally = Tally::decode(&p).ok_or("malformed RESULT")?;
        if s.test == Test::SendBw && tally.received < count {
            out.note(&format!(
                "{size} B: {} of {count} messages arrived at the server ({} does not \
                 retransmit)",
                tally.received,
                s.conn.name()
            ));
        }
        // Where nothing is resent, the row says what arrived (--json).
        let mut delivery =
            (s.test == Test::SendBw && side.unreliable()).then_some(report::Delivery {
                sent: count,
                received: tally.received,
            });
        let row = match (row, tally.row) {
            (Row::Bw(mine), Some(theirs)) if s.bidir => {
                if receives {
                    side.receive_rest(&mut got, tally.sent, ctrl.timeout())?;
                    if got < tally.sent {
                        out.note(&format!(
                            "{size} B: {got} of the server's {} messages arrived here ({} \
                             does not retransmit)",
                            tally.sent,
                            s.conn.name()
                        ));
                    }
                    if let Some(d) = &mut delivery {
                        d.sent += tally.sent;
                        d.received += got;
                    }
                }
                Row::Bw(report::both_ways(&mine, &theirs))
            }
            (row, None) if !s.bidir || !s.test.is_bw() => row,
            _ => return Err("the server's RESULT does not match the run".into()),
        };
        out.row_with(s, &row, delivery);
        rows.push(row);
    }
    ctrl.send(ctrl::DONE, &0u64.to_be_bytes())?;
    Ok(rows)
}

/// A bandwidth run: keeps `tx_depth` operations in flight on every QP, signaling one in
/// every `cq_mod`; returns the result and how many operations completed. Receives that
/// complete meanwhile are reposted and added to `got` (SEND runs in both directions).
pub(super) fn bandwidth(
    side: &Side,
    s: &Settings,
    remote: &[Endpoint],
    size: u64,
    got: &mut u64,
    progress: &mut Option<report::Progress>,
) -> Result<(BwRow, u64), PerfError> {
    let nq = side.qps.len();
    let cq_mod = (s.tx_depth / 2).clamp(1, 64) as u64;
    let per_qp = if s.duration.is_some() {
        u64::MAX
    } else {
        s.iters
    };
    let total = per_qp.saturating_mul(nq as u64);
    let ops: Vec<SendOp> = remote.iter().map(|r| side.op(s, r)).collect();
    let sges: Vec<[Sge; 1]> = (0..nq).map(|q| [side.local(s, q, size)]).collect();
    let flags = side.flags(s, size);
    let mut posted = vec![0u64; nq];
    let mut outstanding = vec![0u64; nq];
    // --verify: operations completed per QP (the READs to check).
    let mut completed = vec![0u64; nq];
    let mut done = 0u64;
    let mut marks: Vec<(f64, u64)> = Vec::with_capacity(4096);
    let mut wcs = [WorkCompletion::default(); 64];
    let mut batch: Vec<SendWr<'_>> = Vec::with_capacity(cq_mod as usize);
    let start = Instant::now();
    let deadline = s.duration.map(|d| start + d);
    let mut stop_posting = false;
    loop {
        let mut busy = false;
        if let Some(d) = deadline
            && !stop_posting
            && Instant::now() >= d
        {
            stop_posting = true;
        }
        if !stop_posting {
            for q in 0..nq {
                let room = u64::from(s.tx_depth) - outstanding[q];
                let left = per_qp - posted[q];
                let k = cq_mod.min(left);
                if k == 0 || room < k {
                    continue;
                }
                if s.verify {
                    post_verified(side, s, q, ops[q], posted[q], k, size, flags)?;
                    posted[q] += k;
                    outstanding[q] += k;
                    busy = true;
                    continue;
                }
                batch.clear();
                for j in 0..k {
                    let mut wr = side.wr(q, 0, ops[q], &sges[q]);
                    wr.flags = flags;
                    if j == k - 1 {
                        wr.flags |= SendFlags::SIGNALED;
                        wr.wr_id = ((q as u64) << 32) | k;
                    }
                    batch.push(wr);
                }
                side.qps[q]
                    .post_send(&batch)
                    .map_err(|e| format!("post_send: {}", e.error))?;
                posted[q] += k;
                outstanding[q] += k;
                busy = true;
            }
        }
        let n = side.poll(&mut wcs)?;
        if n > 0 {
            let now = start.elapsed().as_secs_f64();
            let before = done;
            for wc in &wcs[..n] {
                if wc.wr_id & RECV != 0 {
                    *got += 1;
                    side.post_recv((wc.wr_id & 0xffff_ffff) as usize)?;
                    continue;
                }
                let q = (wc.wr_id >> 32) as usize;
                let k = wc.wr_id & 0xffff_ffff;
                if let Some(o) = outstanding.get_mut(q) {
                    *o = o.saturating_sub(k);
                }
                if s.verify && s.test == Test::ReadBw {
                    let first = completed[q];
                    for i in first..first + k {
                        super::verify::check_read(side, q, i, size, s.tx_depth)?;
                    }
                }
                if let Some(c) = completed.get_mut(q) {
                    *c += k;
                }
                done += k;
            }
            busy = true;
            if done > before {
                marks.push((now, done));
                if let Some(p) = progress.as_mut() {
                    let f = match s.duration {
                        Some(d) => now / d.as_secs_f64(),
                        None => done as f64 / total as f64,
                    };
                    p.update(s.test.name(), f);
                }
            }
        }
        let all_posted = stop_posting || posted.iter().all(|&p| p == per_qp);
        if all_posted && outstanding.iter().all(|&o| o == 0) {
            break;
        }
        side.drive(if busy {
            Duration::ZERO
        } else {
            Duration::from_micros(200)
        })?;
    }
    Ok((report::bw_row(size, &marks), done))
}

/// `--verify`: posts operations `first..first + k` of QP `q`, each from and to its own
/// slot (a WRITE's pattern written first); the last one signaled, as in [`bandwidth`].
#[allow(clippy::too_many_arguments)]
fn post_verified(
    side: &Side,
    s: &Settings,
    q: usize,
    op: SendOp,
    first: u64,
    k: u64,
    size: u64,
    flags: SendFlags,
) -> Result<(), PerfError> {
    use super::verify::{fill_source, slot_offset};
    let mut sges = Vec::with_capacity(k as usize);
    let mut ops = Vec::with_capacity(k as usize);
    for i in first..first + k {
        let off = slot_offset(i, size, s.tx_depth);
        let (local, op) = match op {
            SendOp::RdmaWrite { remote_addr, rkey } => {
                fill_source(side, q, i, size, s.tx_depth)?;
                let remote_addr = remote_addr + off;
                (side.src_area(q), SendOp::RdmaWrite { remote_addr, rkey })
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                let remote_addr = remote_addr + off;
                (side.recv_area(q), SendOp::RdmaRead { remote_addr, rkey })
            }
            _ => return Err("--verify checks WRITEs and READs".into()),
        };
        sges.push([side.sge(local + off as usize, size)]);
        ops.push(op);
    }
    let batch: Vec<SendWr<'_>> = sges
        .iter()
        .zip(&ops)
        .enumerate()
        .map(|(j, (sge, &op))| {
            let mut wr = side.wr(q, 0, op, sge);
            wr.flags = flags;
            if j as u64 == k - 1 {
                wr.flags |= SendFlags::SIGNALED;
                wr.wr_id = ((q as u64) << 32) | k;
            }
            wr
        })
        .collect();
    side.qps[q]
        .post_send(&batch)
        .map_err(|e| format!("post_send: {}", e.error))
}

/// A latency run: ping-pong (WRITE, SEND; half the round trip) or one operation at a
/// time (READ, atomics; the whole operation).
pub(super) fn latency(
    side: &Side,
    s: &Settings,
    remote: &Endpoint,
    size: u64,
    progress: &mut Option<report::Progress>,
) -> Result<report::LatRow, PerfError> {
    let op = side.op(s, remote);
    let sge = [side.local(s, 0, size)];
    let flags = side.flags(s, size);
    let mut wcs = [WorkCompletion::default(); 64];
    let iters = if s.duration.is_some() {
        u64::MAX
    } else {
        s.iters
    };
    let deadline = s.duration.map(|d| Instant::now() + d);
    let mut samples: Vec<f64> = Vec::with_capacity(iters.min(1 << 24) as usize);
    let last = side.recv_area(0) + size as usize - 1;
    let mut byte = [0u8];
    let began = Instant::now();
    for i in 0..iters {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        match s.test {
            Test::WriteLat | Test::SendLat => {
                let m = marker(i);
                side.buf
                    .write(side.src_area(0) + size as usize - 1, &[m])
                    .map_err(|e| e.to_string())?;
                let t0 = Instant::now();
                post(side, 0, op, &sge, flags, i)?;
                side.drive(Duration::ZERO)?;
                if s.test == Test::WriteLat {
                    loop {
                        side.buf.read(last, &mut byte).map_err(|e| e.to_string())?;
                        if byte[0] == m {
                            break;
                        }
                        side.drive(Duration::ZERO)?;
                        drain(side, &mut wcs)?;
                    }
                } else {
                    wait_recv(side, &mut wcs, &mut || Ok(()))?;
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            _ => {
                let mut wr = side.wr(0, i, op, &sge);
                wr.flags = flags | SendFlags::SIGNALED;
                let t0 = Instant::now();
                side.qps[0]
                    .post_send(&[wr])
                    .map_err(|e| format!("post_send: {}", e.error))?;
                loop {
                    side.drive(Duration::ZERO)?;
                    if side.poll(&mut wcs[..1])? > 0 {
                        break;
                    }
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        if i % 256 == 0
            && let Some(p) = progress.as_mut()
        {
            let f = match s.duration {
                Some(d) => began.elapsed().as_secs_f64() / d.as_secs_f64(),
                None => i as f64 / iters as f64,
            };
            p.update(s.test.name(), f);
        }
    }
    // Signaled sends still in flight are reaped by the next size's polls.
    Ok(report::lat_row(size, &mut samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_truncation_fails() {
        let eps = vec![
            Endpoint {
                qpn: 0x11,
                psn: 0xabcdef,
                gid: Gid([7; 16]),
                mtu: 4096,
                addr: 0x1000,
                rkey: 0x55,
            };
            3
        ];
        let b = encode_endpoints(&eps);
        assert_eq!(decode_endpoints(&b), Some(eps));
        for cut in 0..b.len() {
            assert_eq!(decode_endpoints(&b[..cut]), None);
        }
    }

    #[test]
    fn tallies_round_trip_and_truncation_fails() {
        let t = Tally {
            received: 7,
            sent: 9,
            row: Some(BwRow {
                size: 4096,
                iterations: 9,
                peak_bps: 1.5e9,
                avg_bps: 1.25e9,
                msg_rate: 3e5,
            }),
        };
        for t in [t, Tally { row: None, ..t }] {
            let b = t.encode();
            assert_eq!(Tally::decode(&b), Some(t));
            for cut in 0..b.len() {
                assert_eq!(Tally::decode(&b[..cut]), None);
            }
        }
    }
}
