//! Setting up connected queue pairs and waiting for completions.

use remem_verbs::{
    AccessFlags, CompletionQueue, Context, Gid, MemRegion, MemoryBuffer, MemoryRegion, Mtu,
    ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair, WorkCompletion,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a case waits for a completion by default.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Two devices to test between (they may be the same device).
#[derive(Clone)]
pub struct Pair {
    /// The requester side of most cases.
    pub a: Arc<dyn Context>,
    /// The responder side of most cases.
    pub b: Arc<dyn Context>,
    /// How long a case waits for a completion before failing.
    pub timeout: Duration,
}

impl Pair {
    /// A pair with the default completion timeout, [`TIMEOUT`].
    pub fn new(a: Arc<dyn Context>, b: Arc<dyn Context>) -> Self {
        Pair {
            a,
            b,
            timeout: TIMEOUT,
        }
    }
}

/// The environment variable that sets the suite's default path MTU in bytes.
pub const MTU_ENV: &str = "REMEM_CONFORMANCE_MTU";

/// Options for [`connect_rc`].
#[derive(Debug, Clone, Copy)]
pub struct QpOptions {
    /// Queue sizes.
    pub cap: QpCap,
    /// Path MTU (clamped to both ports' active MTU). Default 1024, or the bytes that
    /// [`MTU_ENV`] names (`REMEM_CONFORMANCE_MTU=4096` runs the suite at MTU 4096).
    pub mtu: Mtu,
    /// Remote access the responder QP grants.
    pub access: AccessFlags,
    /// `rnr_retry` of the requester (7 = infinite).
    pub rnr_retry: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `timeout` code.
    pub timeout: u8,
    /// `min_rnr_timer` code of the responder.
    pub min_rnr_timer: u8,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
    /// CQ depth.
    pub cqe: u32,
}

impl Default for QpOptions {
    fn default() -> Self {
        QpOptions {
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            mtu: std::env::var(MTU_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .and_then(Mtu::from_bytes)
                .unwrap_or(Mtu::Mtu1024),
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            rnr_retry: 7,
            retry_cnt: 7,
            timeout: 14,
            min_rnr_timer: 1,
            sq_sig_all: false,
            cqe: 256,
        }
    }
}

/// One side of a connection.
pub struct Endpoint {
    /// The device.
    pub ctx: Arc<dyn Context>,
    /// Its protection domain.
    pub pd: Arc<dyn ProtectionDomain>,
    /// Send and receive completions.
    pub cq: Arc<dyn CompletionQueue>,
    /// The queue pair.
    pub qp: Arc<dyn QueuePair>,
    /// The RoCE v2 GID index used.
    pub gid_index: u8,
}

impl Endpoint {
    /// Registers `len` zeroed bytes with `access`.
    pub fn reg(
        &self,
        len: usize,
        access: AccessFlags,
    ) -> Result<(Arc<MemoryBuffer>, Arc<dyn MemoryRegion>), String> {
        let buf = Arc::new(MemoryBuffer::zeroed(len).map_err(|e| e.to_string())?);
        let mr = self
            .pd
            .reg_mr(MemRegion::whole(buf.clone()), access)
            .map_err(|e| format!("reg_mr: {e}"))?;
        Ok((buf, mr))
    }
}

/// Whether `ctx` is the Linux kernel's Soft-RoCE (`rdma_rxe`) through rdma-core (vendor
/// 0xFFFFFF on the `ibverbs` provider). Cases accept its known deviations from IBTA —
/// and only for it — each where it is checked:
///
/// - a SEND longer than the receive is a malformed WQE to rxe (Linux 6.1): the receive
///   completes with `LOC_QP_OP_ERR` and the requester gets `REM_OP_ERR`, where IBTA asks for
///   `LOC_LEN_ERR` and an Invalid Request NAK (`REM_INV_REQ_ERR`);
/// - rxe sends a UD datagram larger than the path MTU (when the IP MTU allows it) instead
///   of failing it with `LOC_LEN_ERR`.
pub fn is_kernel_rxe(ctx: &dyn Context) -> bool {
    // rdma-core over remem's drop-in libibverbs also shows rxe's vendor id; its firmware
    // version names the soft NIC underneath.
    ctx.info().provider == "ibverbs"
        && ctx
            .query_device()
            .is_ok_and(|d| d.vendor_id == 0x00ff_ffff && !d.fw_ver.starts_with("remem-soft"))
}

/// The first RoCE v2 GID of port 1 (IPv4-mapped ones first): its index and value
/// ([`remem_verbs::rc::roce_v2_gid`]).
pub fn roce_v2_gid(ctx: &dyn Context) -> Result<(u8, Gid), String> {
    remem_verbs::rc::roce_v2_gid(ctx, 1)
        .map(|g| (g.index as u8, g.gid))
        .map_err(|e| e.to_string())
}

/// A PD, a CQ (used for sends and receives; reporting to `channel` if given) and a QP of
/// `qp_type` in RESET on `ctx`, with its first RoCE v2 GID index.
pub fn endpoint(
    ctx: &Arc<dyn Context>,
    o: &QpOptions,
    qp_type: QpType,
    channel: Option<Arc<dyn remem_verbs::CompletionChannel>>,
) -> Result<Endpoint, String> {
    let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let cq = ctx
        .create_cq(o.cqe, channel)
        .map_err(|e| format!("create_cq: {e}"))?;
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: o.cap,
            sq_sig_all: o.sq_sig_all,
        })
        .map_err(|e| format!("create_qp: {e}"))?;
    let (gid_index, _) = roce_v2_gid(&**ctx)?;
    Ok(Endpoint {
        ctx: ctx.clone(),
        pd,
        cq,
        qp,
        gid_index,
    })
}

/// Moves `qp` through INIT, RTR and RTS towards the peer, as a verbs program does
/// ([`remem_verbs::rc::connect`]): with the RC attributes for an RC QP, and for a UC QP
/// only those `ibv_modify_qp` takes for UC (no READ/atomic resources, timeout, retries or
/// RNR timer; remote access WRITE at most).
pub fn bring_up(
    me: &Endpoint,
    peer_qpn: u32,
    peer_gid: Gid,
    my_psn: u32,
    peer_psn: u32,
    mtu: Mtu,
    o: &QpOptions,
) -> Result<(), String> {
    use remem_verbs::rc;
    let uc = me.qp.qp_type() == QpType::Uc;
    let access = if uc {
        o.access & AccessFlags::REMOTE_WRITE
    } else {
        o.access - AccessFlags::LOCAL_WRITE
    };
    let ro = rc::RcOptions {
        port_num: 1,
        pkey_index: 0,
        sgid_index: me.gid_index,
        access,
        sq_psn: my_psn,
        mtu,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        min_rnr_timer: o.min_rnr_timer,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        is_global: true,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    };
    let peer = rc::RcPeer {
        qpn: peer_qpn,
        psn: peer_psn,
        gid: peer_gid,
        mtu,
    };
    let qp = &*me.qp;
    rc::to_init(qp, &ro).map_err(|e| format!("to INIT: {e}"))?;
    rc::to_rtr(qp, &peer, &ro).map_err(|e| format!("to RTR: {e}"))?;
    rc::to_rts(qp, &ro).map_err(|e| format!("to RTS: {e}"))?;
    Ok(())
}

/// The initial send PSN of each role: A's (index 0) wraps soon, B's is close to the wrap.
pub(crate) const PSNS: [u32; 2] = [0x00ab_cdef, 0x00ff_fff0];

/// What the peer needs to connect to a queue pair: its number, GID, initial PSN and the
/// path MTU its side can use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpInfo {
    pub qpn: u32,
    pub gid: Gid,
    pub psn: u32,
    pub mtu: Mtu,
}

impl QpInfo {
    /// `ep`'s information, with `psn` as its initial send PSN.
    pub fn of(ep: &Endpoint, psn: u32, o: &QpOptions) -> Result<QpInfo, String> {
        let (_, gid) = roce_v2_gid(&*ep.ctx)?;
        let port = ep.ctx.query_port(1).map_err(|e| e.to_string())?;
        Ok(QpInfo {
            qpn: ep.qp.qp_num(),
            gid,
            psn,
            mtu: o.mtu.min(port.active_mtu),
        })
    }

    /// Brings `ep` (described by `self`) up towards `peer`.
    pub fn connect(&self, ep: &Endpoint, peer: &QpInfo, o: &QpOptions) -> Result<(), String> {
        let mtu = self.mtu.min(peer.mtu);
        bring_up(ep, peer.qpn, peer.gid, self.psn, peer.psn, mtu, o)
    }

    /// As words for a link.
    pub fn words(&self) -> [u64; 5] {
        let gid = u128::from_be_bytes(self.gid.0);
        let mtu = u64::from(self.mtu.bytes());
        let (qpn, psn) = (u64::from(self.qpn), u64::from(self.psn));
        [qpn, (gid >> 64) as u64, gid as u64, psn, mtu]
    }

    /// From [`QpInfo::words`].
    pub fn from_words([qpn, hi, lo, psn, mtu]: [u64; 5]) -> Result<QpInfo, String> {
        let bad = || format!("bad QP information {:?}", [qpn, hi, lo, psn, mtu]);
        let gid = (u128::from(hi) << 64) | u128::from(lo);
        Ok(QpInfo {
            qpn: u32::try_from(qpn).map_err(|_| bad())?,
            gid: Gid(gid.to_be_bytes()),
            psn: u32::try_from(psn).map_err(|_| bad())?,
            mtu: u32::try_from(mtu)
                .ok()
                .and_then(Mtu::from_bytes)
                .ok_or_else(bad)?,
        })
    }
}

/// Creates an RC QP on each device of `pair` and connects them (`a` ↔ `b`).
pub fn connect_rc(pair: &Pair, o: &QpOptions) -> Result<(Endpoint, Endpoint), String> {
    let a = endpoint(&pair.a, o, QpType::Rc, None)?;
    let b = endpoint(&pair.b, o, QpType::Rc, None)?;
    let ia = QpInfo::of(&a, PSNS[0], o)?;
    let ib = QpInfo::of(&b, PSNS[1], o)?;
    ia.connect(&a, &ib, o)?;
    ib.connect(&b, &ia, o)?;
    Ok((a, b))
}

/// Waits for `n` completions on `cq` (bounded by `timeout`).
pub fn poll_n(
    cq: &dyn CompletionQueue,
    n: usize,
    timeout: Duration,
) -> Result<Vec<WorkCompletion>, String> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::default(); 16];
    while out.len() < n {
        let want = (n - out.len()).min(wc.len());
        let got = cq
            .poll(&mut wc[..want])
            .map_err(|e| format!("poll_cq: {e}"))?;
        out.extend_from_slice(&wc[..got]);
        if got == 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "timed out after {timeout:?} with {} of {n} completions: {out:?}",
                    out.len()
                ));
            }
            std::thread::yield_now();
        }
    }
    Ok(out)
}

/// Waits for one completion.
pub fn poll_one(cq: &dyn CompletionQueue, timeout: Duration) -> Result<WorkCompletion, String> {
    poll_n(cq, 1, timeout).map(|mut v| v.remove(0))
}

/// Checks that no completion arrives on `cq` (after the peer was given a round trip).
pub fn expect_none(cq: &dyn CompletionQueue) -> Result<(), String> {
    let mut wc = [WorkCompletion::default(); 4];
    match cq.poll(&mut wc) {
        Ok(0) => Ok(()),
        Ok(n) => Err(format!("unexpected completions: {:?}", &wc[..n])),
        Err(e) => Err(format!("poll_cq: {e}")),
    }
}
