//! The connection manager's protocol engine: a deterministic, sans-IO state machine for
//! one device (IBTA vol. 1 ch. 12, as the kernel's `ib_cm` and `rdma_cm` speak it).
//!
//! It does no IO and reads no clock: [`Agent::handle_mad`] takes a received MAD with the IP
//! address it came from, [`Agent::handle_timeout`] the current time, and what it wants to
//! send waits in [`Agent::poll_transmit`], what the consumer must learn in
//! [`Agent::poll_event`]. Commands ([`Agent::connect`], [`Agent::accept`], …) come from the
//! shell (`cm::SoftCmId`). Tests drive two agents against each other in virtual time.
//!
//! Connections are keyed by their local communication ID. The states are the IBTA's:
//!
//! ```text
//! active:  connect → ReqSent ─MRA→ MraReqRcvd ─REP→ RepRcvd ─establish (RTU)→ Established
//! passive: REQ → ReqRcvd (─dup REQ: MRA→ MraReqSent) ─accept (REP)→ RepSent ─RTU→ Established
//! either:  Established ─disconnect (DREQ)→ DreqSent ─DREP→ TimeWait → gone
//!          Established ─DREQ (answered with DREP)→ TimeWait → gone
//! UDP:     connect → SidrReqSent ─SIDR REP→ gone;  SIDR REQ → SidrReqRcvd ─accept/reject→ gone
//! ```
//!
//! Retransmission: REQ, REP, DREQ and SIDR REQ are resent at the response timeout until the
//! retry budget runs out; a duplicate REQ is answered with the REP sent (or an MRA while the
//! consumer has not answered), a duplicate REP with the RTU, a duplicate DREQ with the DREP,
//! a duplicate REQ after a reject with the REJ. A connection that was rejected or
//! disconnected stays in TimeWait for [`CmConfig::timewait`] to answer late duplicates.
//!
//! Every MAD that is malformed, of an unknown communication ID, from another address than
//! the connection's peer, or not valid in the connection's state is dropped and counted
//! ([`AgentStats`]); nothing a peer sends can panic the agent or take a listener down.
//!
//! Budgets (what a peer can make the agent hold): [`CmConfig::max_conns`] connection
//! records (each at most about 1 KiB: its REQ, its REP and one saved MAD), of which
//! [`CmConfig::max_timewait`] in TimeWait (the oldest is forgotten early when more come),
//! `backlog` unanswered requests per listener, [`CmConfig::max_tx`] MADs queued for
//! transmission (256 bytes each); at the defaults, under 5 MiB in all.

use remem_verbs::cm::{ConnParam, PortSpace, RDMA_UDP_QKEY};
use remem_verbs::{Error, Mtu, Result};
use remem_wire::CmaIpHeader;
use remem_wire::mad::{
    self, CmDrep, CmDreq, CmMad, CmMessage, CmMra, CmPath, CmRej, CmRep, CmReq, CmRtu, CmSidrRep,
    CmSidrReq, MAD_LEN, MsgRef, rej_reason,
};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// `ETIMEDOUT`: the status of events that report a timeout.
pub const ETIMEDOUT: i32 = 110;

/// Settings of a device's connection manager: timeouts, retries, budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    /// The CM response timeout this side advertises and waits for an answer to its REQ,
    /// DREQ and SIDR REQ, as an IBTA exponent: 4.096 µs × 2^`response_timeout`. Default
    /// 18 (≈ 1.07 s; rdma_cm uses 20, ≈ 4.3 s). `REMEM_SOFT_CM_TIMEOUT`.
    pub response_timeout: u8,
    /// How many times a REQ, REP, DREQ or SIDR REQ is resent before the CM gives up
    /// (0–15; default 15 as rdma_cm). `REMEM_SOFT_CM_RETRIES`.
    pub max_retries: u8,
    /// The largest response timeout exponent a peer may make this side wait per try
    /// (a REQ's local CM response timeout, an MRA's service timeout); larger values are
    /// cut to it. Default 24 (≈ 69 s).
    pub max_peer_timeout: u8,
    /// How long a connection stays in TimeWait (answering late duplicates) after a
    /// disconnect or a reject, at least: longer when the peer's REQ announced longer
    /// response timeouts (twice the longer of them, up to [`CmConfig::max_peer_timeout`]),
    /// so that its retries still find the record. Default: two response timeouts.
    pub timewait: Duration,
    /// How long a connection request may wait for the consumer's accept or reject before
    /// the CM rejects it itself (timeout) and reports a connect error. Default 60 s.
    pub pending_timeout: Duration,
    /// Connection records at most (pending requests, connections, TimeWait). Default 4096.
    pub max_conns: usize,
    /// Connection records in TimeWait at most (the oldest leaves early). Default 1024.
    pub max_timewait: usize,
    /// The largest backlog a listener gets (larger ones are cut). Default 1024.
    pub max_backlog: u32,
    /// MADs waiting for transmission at most (more are dropped and counted; the
    /// retransmission timers resend what matters). Default 1024.
    pub max_tx: usize,
    /// The local ACK timeout (QP `timeout` exponent) this side asks for in its REQs.
    /// Default 14 (≈ 67 ms).
    pub local_ack_timeout: u8,
    /// How long a REQ for a service nobody listens on waits for a listener before it is
    /// rejected (REJ 8, invalid service ID). Kernel rdma_cm rejects at once; a moment's
    /// grace lets a server that listens again for its next connection — as perftest's
    /// `-R` servers do right after their exchange, while their client connects at once —
    /// take the request instead of losing the race. Default 250 ms; zero: at once. At most
    /// 64 requests wait (`MAX_UNCLAIMED`).
    pub listen_grace: Duration,
}

/// REQs waiting for a listener at most ([`CmConfig::listen_grace`]); more are rejected at
/// once.
pub const MAX_UNCLAIMED: usize = 64;

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            response_timeout: 18,
            max_retries: 15,
            max_peer_timeout: 24,
            timewait: mad::timeout_duration(18) * 2,
            pending_timeout: Duration::from_secs(60),
            max_conns: 4096,
            max_timewait: 1024,
            max_backlog: 1024,
            max_tx: 1024,
            local_ack_timeout: 14,
            listen_grace: Duration::from_millis(250),
        }
    }
}

/// The environment variable setting [`CmConfig::response_timeout`] (an exponent, 1–31).
pub const CM_TIMEOUT_ENV: &str = "REMEM_SOFT_CM_TIMEOUT";
/// The environment variable setting [`CmConfig::max_retries`] (0–15).
pub const CM_RETRIES_ENV: &str = "REMEM_SOFT_CM_RETRIES";

impl CmConfig {
    /// The defaults, with the response timeout and retries from the environment
    /// (`REMEM_SOFT_CM_TIMEOUT`, `REMEM_SOFT_CM_RETRIES`) where set and valid.
    pub fn from_env() -> Self {
        let num = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|s| s.trim().parse::<u8>().ok())
        };
        let mut c = CmConfig::default();
        if let Some(t) = num(CM_TIMEOUT_ENV).filter(|t| (1..=31).contains(t)) {
            c = c.with_response_timeout(t);
        }
        if let Some(r) = num(CM_RETRIES_ENV).filter(|r| *r <= 15) {
            c.max_retries = r;
        }
        c
    }

    /// These settings with response timeout exponent `exp` (and the TimeWait that follows).
    pub fn with_response_timeout(mut self, exp: u8) -> Self {
        self.response_timeout = exp.clamp(1, 31);
        self.timewait = mad::timeout_duration(self.response_timeout) * 2;
        self
    }

    fn response(&self) -> Duration {
        mad::timeout_duration(self.response_timeout)
    }
}

/// What the agent counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// MADs received (every one is counted here, and dropped ones also in one `drop_*`).
    pub rx_mads: u64,
    /// MADs queued for transmission.
    pub tx_mads: u64,
    /// Of those, retransmissions after a timeout or in answer to a duplicate.
    pub retransmits: u64,
    /// Dropped: not a CM MAD this agent parses (truncated, wrong class or version,
    /// unknown attribute, a bad `rdma_cm` IP header or path MTU in a REQ).
    pub drop_malformed: u64,
    /// Dropped: names a communication ID (or SIDR request ID) no connection has.
    pub drop_unknown_comm_id: u64,
    /// Dropped: from another address than the connection's peer.
    pub drop_wrong_source: u64,
    /// Dropped: not valid in the connection's state (a REP to a connection that is not
    /// connecting, an RTU before the REP, …).
    pub drop_out_of_state: u64,
    /// Duplicates (a REQ, REP, RTU, DREQ, DREP or SIDR REQ seen before), answered as the
    /// state requires or ignored.
    pub duplicates: u64,
    /// REQs and SIDR REQs for a service nobody listens on (answered with REJ reason 8 /
    /// SIDR status 1).
    pub rej_no_listener: u64,
    /// REQs refused because the listener's backlog was full (REJ reason 3).
    pub rej_backlog: u64,
    /// REQs refused because the connection records ran out (REJ reason 3).
    pub rej_no_resources: u64,
    /// MADs not queued because the transmit queue was full.
    pub tx_queue_full: u64,
    /// Connections given up after their retries (REQ, REP, DREQ, SIDR REQ) or a pending
    /// request the consumer never answered.
    pub timeouts: u64,
    /// TimeWait records forgotten early to make room.
    pub timewait_evicted: u64,
}

impl AgentStats {
    /// The counters with their names, in a stable order (as `Context::counters` lists them).
    pub fn named(&self) -> [(&'static str, u64); 14] {
        [
            ("cm_rx_mads", self.rx_mads),
            ("cm_tx_mads", self.tx_mads),
            ("cm_retransmits", self.retransmits),
            ("cm_drop_malformed", self.drop_malformed),
            ("cm_drop_unknown_comm_id", self.drop_unknown_comm_id),
            ("cm_drop_wrong_source", self.drop_wrong_source),
            ("cm_drop_out_of_state", self.drop_out_of_state),
            ("cm_duplicates", self.duplicates),
            ("cm_rej_no_listener", self.rej_no_listener),
            ("cm_rej_backlog", self.rej_backlog),
            ("cm_rej_no_resources", self.rej_no_resources),
            ("cm_tx_queue_full", self.tx_queue_full),
            ("cm_timeouts", self.timeouts),
            ("cm_timewait_evicted", self.timewait_evicted),
        ]
    }
}

/// A MAD to send to QP 1 of `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The peer's IP address.
    pub dst: IpAddr,
    /// The 256-byte MAD.
    pub mad: Box<[u8; MAD_LEN]>,
}

/// What the consumer of a connection must learn. `conn` is the connection's local
/// communication ID, as [`Agent::connect`] returned it or [`Event::ConnectRequest`]
/// announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A REQ (or SIDR REQ, `sidr`) for a service `listener` listens on: a new
    /// connection, waiting for [`Agent::accept`] or [`Agent::reject`].
    ConnectRequest {
        /// The listener (the owner given to [`Agent::listen`]).
        listener: u64,
        /// The new connection.
        conn: u32,
        /// The service ID requested (its low 16 bits are the port).
        service_id: u64,
        /// Where it came from.
        peer: IpAddr,
        /// The rdma_cm IP header of its private data.
        header: CmaIpHeader,
        /// The consumer's private data (after the IP header, the whole field).
        private_data: Vec<u8>,
        /// The REQ (`None` for a SIDR REQ).
        req: Option<Box<CmReq>>,
    },
    /// The REP answering our REQ: the consumer moves its QP to RTR and RTS and calls
    /// [`Agent::establish`] (or rejects).
    ConnectReply {
        /// The connection.
        conn: u32,
        /// The REP.
        rep: Box<CmRep>,
    },
    /// The RTU arrived (passive side): the connection is established.
    Established {
        /// The connection.
        conn: u32,
        /// The RTU's private data.
        private_data: Vec<u8>,
    },
    /// The peer rejected the connection (`reason`: the IBTA REJ reason).
    Rejected {
        /// The connection.
        conn: u32,
        /// REJ reason.
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// No answer within the timeouts and retries (REQ or SIDR REQ), or a SIDR REP with a
    /// failure `status` (positive), or `-ETIMEDOUT`.
    Unreachable {
        /// The connection.
        conn: u32,
        /// `-ETIMEDOUT` or the SIDR REP status.
        status: i32,
    },
    /// The connection failed after the REQ was answered: no RTU after the REP's retries,
    /// or a pending request the consumer did not answer in time.
    ConnectError {
        /// The connection.
        conn: u32,
        /// A negative errno.
        status: i32,
    },
    /// Disconnected: a DREQ arrived (answered), our DREQ was answered (`status` 0) or
    /// went unanswered (`-ETIMEDOUT`), or the peer rejected an established connection.
    Disconnected {
        /// The connection.
        conn: u32,
        /// 0 or `-ETIMEDOUT`.
        status: i32,
        /// The DREQ's or DREP's private data (empty after a timeout).
        private_data: Vec<u8>,
    },
    /// The connection left TimeWait: its QP may be reused.
    TimewaitExit {
        /// The connection.
        conn: u32,
    },
    /// The SIDR REP answering our SIDR REQ with status 0.
    SidrResolved {
        /// The connection.
        conn: u32,
        /// The remote UD QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR REP's private data.
        private_data: Vec<u8>,
    },
}

/// What a connection's QP needs to reach RTR and RTS (`rdma_init_qp_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    /// The peer's IP address (the destination GID, IPv4-mapped for IPv4).
    pub peer: IpAddr,
    /// The remote QP number (`dest_qp_num`).
    pub remote_qpn: u32,
    /// The first PSN this side sends (`sq_psn`).
    pub sq_psn: u32,
    /// The first PSN this side expects (`rq_psn`).
    pub rq_psn: u32,
    /// The path MTU.
    pub path_mtu: Mtu,
    /// READ/atomic requests this side issues in flight (`max_rd_atomic`).
    pub max_rd_atomic: u8,
    /// READ/atomic requests this side serves in flight (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: u8,
    /// Local ACK timeout exponent (`timeout`).
    pub timeout: u8,
    /// Transport retries (`retry_cnt`).
    pub retry_cnt: u8,
    /// RNR retries (`rnr_retry`).
    pub rnr_retry: u8,
    /// Flow label of the path.
    pub flow_label: u32,
    /// Traffic class of the path.
    pub traffic_class: u8,
    /// Hop limit of the path.
    pub hop_limit: u8,
    /// Service level of the path.
    pub sl: u8,
}

/// A connection's state (IBTA ch. 12's, less what this CM never enters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnState {
    /// Active: REQ sent, waiting for REP, REJ or MRA.
    ReqSent,
    /// Active: an MRA for the REQ arrived; waiting longer.
    MraReqRcvd,
    /// Active: REP arrived; waiting for the consumer's RTU (or reject).
    RepRcvd,
    /// Passive: REQ arrived; waiting for the consumer.
    ReqRcvd,
    /// Passive: the REQ was resent and answered with an MRA; waiting for the consumer.
    MraReqSent,
    /// Passive: REP sent; waiting for the RTU.
    RepSent,
    /// Passive: an MRA for the REP arrived; waiting longer for the RTU.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent; waiting for the DREP.
    DreqSent,
    /// Closed; answering late duplicates until the timer expires.
    TimeWait,
    /// Active UD: SIDR REQ sent; waiting for the SIDR REP.
    SidrReqSent,
    /// Passive UD: SIDR REQ arrived; waiting for the consumer.
    SidrReqRcvd,
}

#[derive(Debug)]
struct Conn {
    /// The peer's communication ID (its SIDR request ID for passive SIDR); 0 until known.
    remote_id: u32,
    peer: IpAddr,
    tid: u64,
    state: ConnState,
    active: bool,
    /// Whether a consumer still holds the connection (events are reported only then).
    owned: bool,
    /// Passive, unanswered: the listener whose backlog it counts in.
    listener: Option<u64>,
    /// The REQ (sent or received).
    req: Option<Box<CmReq>>,
    /// The REP (sent or received).
    rep: Option<Box<CmRep>>,
    /// The PSN this side announces in its REQ or REP: the one it expects its peer to send
    /// first. Linux's CM reads the field so (rping.pcap: each side sends from the PSN its
    /// peer's message announced), and so do we: `sq_psn` is the peer's, `rq_psn` ours.
    my_psn: u32,
    /// Our path MTU (active: advertised; passive: negotiated).
    mtu: Mtu,
    /// What this side asked for in `connect`.
    local_param: Option<ConnParam>,
    /// The MAD resent on timeout or in answer to a duplicate.
    last: Option<Box<[u8; MAD_LEN]>>,
    /// What the saved MAD is (to answer duplicates right).
    last_kind: Option<u16>,
    deadline: Option<Instant>,
    tries_left: u8,
    try_timeout: Duration,
}

#[derive(Debug, Clone)]
struct Listener {
    owner: u64,
    ip: Option<IpAddr>,
    backlog: u32,
    pending: u32,
}

/// What [`Agent::connect`] needs.
#[derive(Debug, Clone)]
pub struct ConnectArgs<'a> {
    /// The port space (UDP: a SIDR request; the others: a REQ).
    pub ps: PortSpace,
    /// The local address (IP and port).
    pub src: SocketAddr,
    /// The destination (IP and port: the service).
    pub dst: SocketAddr,
    /// The local QP number announced.
    pub qpn: u32,
    /// The consumer's parameters (private data without the IP header).
    pub param: &'a ConnParam,
    /// The local path MTU.
    pub mtu: Mtu,
    /// The local CA GUID (the device's node GUID).
    pub ca_guid: u64,
}

/// The connection manager of one device (see the module documentation).
#[derive(Debug)]
pub struct Agent {
    cfg: CmConfig,
    rng: u64,
    /// The top 8 bits of every communication ID handed out (a shared device's slot,
    /// `io::host::steer`), or 0: any.
    id_prefix: u8,
    conns: HashMap<u32, Conn>,
    /// (peer, the peer's communication ID or SIDR request ID, SIDR) → local ID.
    by_remote: HashMap<(IpAddr, u32, bool), u32>,
    /// Listeners by service ID.
    listeners: HashMap<u64, Vec<Listener>>,
    timers: BTreeSet<(Instant, u32)>,
    /// Connections in TimeWait, oldest first.
    timewait: VecDeque<u32>,
    tx: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: AgentStats,
    /// REQs for a service nobody listened on yet, waiting [`CmConfig::listen_grace`]:
    /// (deadline, source, transaction ID, REQ).
    unclaimed: VecDeque<(Instant, IpAddr, u64, Box<CmReq>)>,
}

fn consumer_data(pd: &[u8], skip: usize) -> Vec<u8> {
    pd.get(skip..).unwrap_or_default().to_vec()
}

impl Agent {
    /// An agent with settings `cfg`, drawing communication IDs, transaction IDs and
    /// PSNs from a generator seeded with `seed`.
    pub fn new(cfg: CmConfig, seed: u64) -> Self {
        Agent {
            cfg,
            rng: seed ^ 0x6a09_e667_f3bc_c909,
            id_prefix: 0,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: HashMap::new(),
            timers: BTreeSet::new(),
            timewait: VecDeque::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: AgentStats::default(),
            unclaimed: VecDeque::new(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> AgentStats {
        self.stats
    }

    /// Connection records held (any state).
    #[cfg(any(test, feature = "internals"))]
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// A connection's state.
    #[cfg(any(test, feature = "internals"))]
    pub fn state(&self, conn: u32) -> Option<ConnState> {
        self.conns.get(&conn).map(|c| c.state)
    }

    /// MADs waiting for transmission.
    #[cfg(any(test, feature = "internals"))]
    pub fn tx_len(&self) -> usize {
        self.tx.len()
    }

    fn next_u64(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Makes every communication ID (and SIDR request ID) handed out from now on carry
    /// `prefix` in its top 8 bits: on a shared device the host steers a CM MAD to its
    /// process by the receiver's ID (`io::host::steer`). 0: no prefix.
    pub fn set_id_prefix(&mut self, prefix: u8) {
        self.id_prefix = prefix;
    }

    /// The connections a peer believes open or opening with this side (REP sent or
    /// received, established, DREQ sent): what must be closed with a DREQ if this side's
    /// process dies without closing them.
    pub fn links(&self) -> Vec<(u32, u32, IpAddr, u32)> {
        use ConnState::*;
        let mut v: Vec<_> = (self.conns.iter())
            .filter(|(_, c)| {
                matches!(c.state, RepSent | MraRepRcvd | Established | DreqSent) && c.remote_id != 0
            })
            .map(|(&id, c)| {
                let remote_qpn = if c.active {
                    c.rep.as_ref().map_or(0, |r| r.local_qpn)
                } else {
                    c.req.as_ref().map_or(0, |r| r.local_qpn)
                };
                (id, c.remote_id, c.peer, remote_qpn)
            })
            .collect();
        v.sort_unstable_by_key(|l| l.0);
        v
    }

    /// Closes every connection a peer believes open (established, or REP sent): a DREQ
    /// each, as kernel rdma_cm does for the ids of a process that exits without closing
    /// them. Returns how many.
    pub fn disconnect_all(&mut self, now: Instant) -> usize {
        use ConnState::*;
        let open: Vec<u32> = (self.conns.iter())
            .filter(|(_, c)| matches!(c.state, Established | RepSent | MraRepRcvd))
            .map(|(&id, _)| id)
            .collect();
        for &conn in &open {
            self.send_dreq(now, conn, &[]);
        }
        open.len()
    }

    /// Sends a DREQ for a connection this agent does not hold: one of a dead process on
    /// the same shared device (`io::host`), closed for it as a NIC's CM would. Sent once;
    /// the DREP that answers it is for an unknown connection and dropped.
    pub fn send_orphan_dreq(
        &mut self,
        peer: IpAddr,
        local_id: u32,
        remote_id: u32,
        remote_qpn: u32,
    ) {
        let tid = self.new_tid(local_id);
        let dreq = CmDreq {
            local_comm_id: local_id,
            remote_comm_id: remote_id,
            remote_qpn_eecn: remote_qpn,
            private_data: Vec::new(),
        };
        self.emit(peer, tid, CmMessage::Dreq(dreq));
    }

    fn new_comm_id(&mut self) -> u32 {
        loop {
            let mut id = self.next_u64() as u32;
            if self.id_prefix != 0 {
                id = u32::from(self.id_prefix) << 24 | (id & 0x00ff_ffff);
            }
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_psn(&mut self) -> u32 {
        self.next_u64() as u32 & 0x00ff_ffff
    }

    fn new_tid(&mut self, local_id: u32) -> u64 {
        (self.next_u64() << 32) | u64::from(local_id)
    }

    // ----------------------------------------------------------------- sans-IO surface

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Agent::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timer = self.timers.first().map(|(t, _)| *t);
        let unclaimed = self.unclaimed.front().map(|u| u.0);
        match (timer, unclaimed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn queue(&mut self, dst: IpAddr, mad: Box<[u8; MAD_LEN]>) {
        if self.tx.len() >= self.cfg.max_tx {
            self.stats.tx_queue_full += 1;
            return;
        }
        self.stats.tx_mads += 1;
        self.tx.push_back(Transmit { dst, mad });
    }

    fn emit(&mut self, dst: IpAddr, tid: u64, msg: CmMessage) -> Option<Box<[u8; MAD_LEN]>> {
        // Every message is built by this agent from valid values; a failure would be a
        // bug, and the message is then not sent (the peer times out) rather than a panic.
        let bytes = Box::new(CmMad::new(tid, msg).emit().ok()?);
        self.queue(dst, bytes.clone());
        Some(bytes)
    }

    fn resend(&mut self, conn: u32) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if let Some(m) = c.last.clone() {
            let peer = c.peer;
            self.stats.retransmits += 1;
            self.queue(peer, m);
        }
    }

    fn set_timer(&mut self, conn: u32, at: Option<Instant>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if let Some(old) = c.deadline.take() {
            self.timers.remove(&(old, conn));
        }
        c.deadline = at;
        if let Some(t) = at {
            self.timers.insert((t, conn));
        }
    }

    fn report(&mut self, conn: u32, ev: Event) {
        if self.conns.get(&conn).is_some_and(|c| c.owned) {
            self.events.push_back(ev);
        }
    }

    fn remove(&mut self, conn: u32) {
        self.set_timer(conn, None);
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        let sidr = matches!(c.state, ConnState::SidrReqSent | ConnState::SidrReqRcvd)
            || c.last_kind == Some(mad::CM_ATTR_SIDR_REP);
        if c.remote_id != 0 {
            let key = (c.peer, c.remote_id, sidr);
            if self.by_remote.get(&key) == Some(&conn) {
                self.by_remote.remove(&key);
            }
        }
        self.release_backlog(c.listener, c.req.as_ref().map(|r| r.service_id));
        if c.state == ConnState::TimeWait {
            self.timewait.retain(|&id| id != conn);
        }
    }

    fn release_backlog(&mut self, listener: Option<u64>, service: Option<u64>) {
        let Some(owner) = listener else {
            return;
        };
        let lists = match service {
            Some(sid) => self.listeners.get_mut(&sid).into_iter().collect::<Vec<_>>(),
            None => self.listeners.values_mut().collect(),
        };
        for list in lists {
            for l in list.iter_mut().filter(|l| l.owner == owner) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
    }

    /// Takes a passive connection off its listener's backlog (it was answered).
    fn answered(&mut self, conn: u32) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let (listener, service) = (c.listener.take(), c.req.as_ref().map(|r| r.service_id));
        if c.state == ConnState::SidrReqRcvd {
            // SIDR requests keep no REQ: find the listener by owner.
            self.release_backlog(listener, None);
        } else {
            self.release_backlog(listener, service);
        }
    }

    /// Moves a connection to TimeWait (keeping `last` to answer duplicates).
    fn enter_timewait(&mut self, now: Instant, conn: u32) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.state == ConnState::TimeWait {
            return;
        }
        c.state = ConnState::TimeWait;
        let peer = c
            .req
            .as_ref()
            .filter(|_| !c.active)
            .map_or(Duration::ZERO, |r| {
                let exp = r
                    .remote_cm_response_timeout
                    .max(r.local_cm_response_timeout)
                    .min(self.cfg.max_peer_timeout);
                mad::timeout_duration(exp) * 2
            });
        let until = now + self.cfg.timewait.max(peer);
        self.set_timer(conn, Some(until));
        self.timewait.push_back(conn);
        while self.timewait.len() > self.cfg.max_timewait {
            if let Some(old) = self.timewait.pop_front() {
                self.stats.timewait_evicted += 1;
                self.remove(old);
            }
        }
    }

    // ----------------------------------------------------------------- consumer commands

    /// Listens for service `service_id` on `ip` (`None`: any address) for consumer
    /// `owner`, with at most `backlog` requests unanswered (0: the largest allowed).
    pub fn listen(&mut self, owner: u64, service_id: u64, ip: Option<IpAddr>, backlog: u32) {
        let backlog = if backlog == 0 {
            self.cfg.max_backlog
        } else {
            backlog.min(self.cfg.max_backlog)
        };
        let list = self.listeners.entry(service_id).or_default();
        list.retain(|l| l.owner != owner);
        list.push(Listener {
            owner,
            ip,
            backlog,
            pending: 0,
        });
    }

    /// Hands the requests that waited for a listener ([`CmConfig::listen_grace`]) to the
    /// listeners there are now (a `listen` since they came): as if they arrived at `now`.
    pub fn claim_unclaimed(&mut self, now: Instant) {
        let waiting = std::mem::take(&mut self.unclaimed);
        for (deadline, from, tid, req) in waiting {
            let header = CmaIpHeader::parse(&req.private_data).ok();
            let claimed =
                header.is_some_and(|h| self.find_listener(req.service_id, h.dst).is_some());
            if claimed {
                self.on_req(now, from, tid, *req);
            } else {
                self.unclaimed.push_back((deadline, from, tid, req));
            }
        }
    }

    /// Stops every listen of `owner` (its pending requests stay, owned by their own ids).
    pub fn unlisten(&mut self, owner: u64) {
        self.listeners.retain(|_, list| {
            list.retain(|l| l.owner != owner);
            !list.is_empty()
        });
    }

    /// Starts a connection: a REQ (or a SIDR REQ in the UDP port space). Returns the
    /// connection's local communication ID.
    pub fn connect(&mut self, now: Instant, a: &ConnectArgs<'_>) -> Result<u32> {
        if self.conns.len() >= self.cfg.max_conns {
            return Err(Error::Exhausted("CM connection records"));
        }
        let header = CmaIpHeader {
            cma_version: CmaIpHeader::VERSION,
            src_port: a.src.port(),
            src: a.src.ip(),
            dst: a.dst.ip(),
        };
        let sidr = a.ps == PortSpace::Udp;
        let field = if sidr {
            CmSidrReq::PRIVATE_DATA_LEN
        } else {
            CmReq::PRIVATE_DATA_LEN
        };
        let private_data = header
            .with_private_data(&a.param.private_data, field)
            .map_err(|e| Error::InvalidArgument(format!("connect: {e}")))?;
        let local_id = self.new_comm_id();
        let tid = self.new_tid(local_id);
        let service_id = a.ps.service_id(a.dst.port());
        let peer = a.dst.ip();
        let (msg, req, my_psn) = if sidr {
            let m = CmMessage::SidrReq(CmSidrReq {
                request_id: local_id,
                partition_key: 0xffff,
                service_id,
                private_data,
            });
            (m, None, 0)
        } else {
            let psn = self.new_psn();
            let path = CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: mad::ip_to_gid(a.src.ip()),
                remote_gid: mad::ip_to_gid(peer),
                flow_label: 0,
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: self.cfg.local_ack_timeout,
            };
            let req = CmReq {
                local_comm_id: local_id,
                service_id,
                local_ca_guid: a.ca_guid,
                local_qpn: a.qpn & mad::QPN_MASK,
                responder_resources: a.param.responder_resources,
                initiator_depth: a.param.initiator_depth,
                remote_cm_response_timeout: self.cfg.response_timeout,
                transport_service_type: mad::TRANSPORT_RC,
                end_to_end_flow_control: a.param.flow_control,
                starting_psn: psn,
                local_cm_response_timeout: self.cfg.response_timeout,
                retry_count: a.param.retry_count.min(7),
                partition_key: 0xffff,
                path_mtu: a.mtu as u8,
                rnr_retry_count: a.param.rnr_retry_count.min(7),
                max_cm_retries: self.cfg.max_retries.min(15),
                srq: a.param.srq,
                primary_path: path,
                private_data,
                ..CmReq::default()
            };
            (CmMessage::Req(req.clone()), Some(Box::new(req)), psn)
        };
        let Some(last) = self.emit(peer, tid, msg) else {
            return Err(Error::InvalidArgument(
                "connect: the request does not fit its MAD".into(),
            ));
        };
        let try_timeout = self.cfg.response();
        self.conns.insert(
            local_id,
            Conn {
                remote_id: 0,
                peer,
                tid,
                state: if sidr {
                    ConnState::SidrReqSent
                } else {
                    ConnState::ReqSent
                },
                active: true,
                owned: true,
                listener: None,
                req,
                rep: None,
                my_psn,
                mtu: a.mtu,
                local_param: Some(a.param.clone()),
                last: Some(last),
                last_kind: Some(if sidr {
                    mad::CM_ATTR_SIDR_REQ
                } else {
                    mad::CM_ATTR_REQ
                }),
                deadline: None,
                tries_left: self.cfg.max_retries,
                try_timeout,
            },
        );
        self.set_timer(local_id, Some(now + try_timeout));
        Ok(local_id)
    }

    /// The QP attributes of connection `conn` as they stand (before [`Agent::accept`], a
    /// passive connection's take the peer's offer: responder resources = its initiator
    /// depth and the reverse). `None` until the peer's QP is known.
    pub fn qp_params(&self, conn: u32) -> Option<QpParams> {
        self.qp_params_with(conn, None)
    }

    /// The QP attributes a passive connection gets if accepted with `param`.
    pub fn accept_qp_params(&self, conn: u32, param: &ConnParam) -> Option<QpParams> {
        self.qp_params_with(conn, Some(param))
    }

    fn qp_params_with(&self, conn: u32, accept: Option<&ConnParam>) -> Option<QpParams> {
        let c = self.conns.get(&conn)?;
        let req = c.req.as_ref()?;
        let path = req.primary_path;
        if c.active {
            let rep = c.rep.as_ref()?;
            let mine = c.local_param.as_ref()?;
            Some(QpParams {
                peer: c.peer,
                remote_qpn: rep.local_qpn,
                sq_psn: rep.starting_psn,
                rq_psn: c.my_psn,
                path_mtu: c.mtu,
                max_rd_atomic: mine.initiator_depth.min(rep.responder_resources),
                max_dest_rd_atomic: mine.responder_resources,
                timeout: path.local_ack_timeout,
                retry_cnt: req.retry_count,
                rnr_retry: rep.rnr_retry_count,
                flow_label: path.flow_label,
                traffic_class: path.traffic_class,
                hop_limit: path.hop_limit,
                sl: path.sl,
            })
        } else {
            let (rr, id) = match (accept, c.rep.as_ref()) {
                (Some(p), _) => (p.responder_resources, p.initiator_depth),
                (None, Some(rep)) => (rep.responder_resources, rep.initiator_depth),
                (None, None) => (req.initiator_depth, req.responder_resources),
            };
            Some(QpParams {
                peer: c.peer,
                remote_qpn: req.local_qpn,
                sq_psn: req.starting_psn,
                rq_psn: c.my_psn,
                path_mtu: c.mtu,
                max_rd_atomic: id.min(req.responder_resources),
                max_dest_rd_atomic: rr,
                timeout: path.local_ack_timeout,
                retry_cnt: req.retry_count,
                rnr_retry: req.rnr_retry_count,
                flow_label: path.flow_label,
                traffic_class: path.traffic_class,
                hop_limit: path.hop_limit,
                sl: path.sl,
            })
        }
    }

    fn conn_in(&self, conn: u32, states: &[ConnState], what: &str) -> Result<()> {
        match self.conns.get(&conn) {
            Some(c) if states.contains(&c.state) => Ok(()),
            Some(c) => Err(Error::InvalidArgument(format!(
                "{what}: the connection is {:?}",
                c.state
            ))),
            None => Err(Error::InvalidArgument(format!(
                "{what}: the connection is gone"
            ))),
        }
    }

    /// Accepts a pending request: a REP announcing QP `qpn` (or, for a SIDR request, a
    /// SIDR REP with status 0, QP `qpn` and Q_Key `RDMA_UDP_QKEY`).
    pub fn accept(
        &mut self,
        now: Instant,
        conn: u32,
        qpn: u32,
        param: &ConnParam,
        ca_guid: u64,
    ) -> Result<()> {
        use ConnState::*;
        self.conn_in(conn, &[ReqRcvd, MraReqSent, SidrReqRcvd], "accept")?;
        self.answered(conn);
        let Some(c) = self.conns.get(&conn) else {
            return Ok(());
        };
        let (peer, tid, remote_id, state, psn) = (c.peer, c.tid, c.remote_id, c.state, c.my_psn);
        if state == SidrReqRcvd {
            if param.private_data.len() > CmSidrRep::PRIVATE_DATA_LEN {
                return Err(Error::InvalidArgument(
                    "SIDR REP private data too long".into(),
                ));
            }
            let service_id = c.req.as_ref().map_or(0, |r| r.service_id);
            let rep = CmSidrRep {
                request_id: remote_id,
                status: mad::SIDR_SUCCESS,
                qpn: qpn & mad::QPN_MASK,
                service_id,
                qkey: RDMA_UDP_QKEY,
                private_data: param.private_data.clone(),
                ..CmSidrRep::default()
            };
            self.sidr_done(now, conn, tid, rep);
            return Ok(());
        }
        let rep = CmRep {
            local_comm_id: conn,
            remote_comm_id: remote_id,
            local_qpn: qpn & mad::QPN_MASK,
            starting_psn: psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            target_ack_delay: 15,
            end_to_end_flow_control: param.flow_control,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: param.srq,
            local_ca_guid: ca_guid,
            private_data: param.private_data.clone(),
            ..CmRep::default()
        };
        let Some(last) = self.emit(peer, tid, CmMessage::Rep(rep.clone())) else {
            return Err(Error::InvalidArgument("accept: REP does not fit".into()));
        };
        let (retries, timeout) = {
            let req = self.conns.get(&conn).and_then(|c| c.req.as_ref());
            let t = req.map_or(self.cfg.response_timeout, |r| {
                r.local_cm_response_timeout.min(self.cfg.max_peer_timeout)
            });
            let r = req.map_or(self.cfg.max_retries, |r| {
                r.max_cm_retries.min(self.cfg.max_retries)
            });
            (r, mad::timeout_duration(t))
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = RepSent;
            c.rep = Some(Box::new(rep));
            c.last = Some(last);
            c.last_kind = Some(mad::CM_ATTR_REP);
            c.tries_left = retries;
            c.try_timeout = timeout;
        }
        self.set_timer(conn, Some(now + timeout));
        Ok(())
    }

    fn sidr_done(&mut self, now: Instant, conn: u32, tid: u64, rep: CmSidrRep) {
        let peer = match self.conns.get(&conn) {
            Some(c) => c.peer,
            None => return,
        };
        let last = self.emit(peer, tid, CmMessage::SidrRep(rep));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.last = last;
            c.last_kind = Some(mad::CM_ATTR_SIDR_REP);
            c.owned = false;
        }
        // Kept a while to answer duplicate SIDR REQs with the same reply.
        self.enter_timewait(now, conn);
    }

    /// Rejects a connection with `reason` and private data: a pending request (REJ, or a
    /// SIDR REP with status "rejected"), or one whose REP this side received (REJ).
    pub fn reject(
        &mut self,
        now: Instant,
        conn: u32,
        reason: u16,
        private_data: &[u8],
    ) -> Result<()> {
        use ConnState::*;
        self.conn_in(
            conn,
            &[
                ReqRcvd,
                MraReqSent,
                SidrReqRcvd,
                RepRcvd,
                ReqSent,
                MraReqRcvd,
                RepSent,
                MraRepRcvd,
            ],
            "reject",
        )?;
        self.answered(conn);
        let Some(c) = self.conns.get(&conn) else {
            return Ok(());
        };
        let (tid, remote_id, state) = (c.tid, c.remote_id, c.state);
        if state == SidrReqRcvd {
            if private_data.len() > CmSidrRep::PRIVATE_DATA_LEN {
                return Err(Error::InvalidArgument(
                    "SIDR REP private data too long".into(),
                ));
            }
            let rep = CmSidrRep {
                request_id: remote_id,
                status: mad::SIDR_REJECT,
                service_id: c.req.as_ref().map_or(0, |r| r.service_id),
                private_data: private_data.to_vec(),
                ..CmSidrRep::default()
            };
            self.sidr_done(now, conn, tid, rep);
            return Ok(());
        }
        if private_data.len() > CmRej::PRIVATE_DATA_LEN {
            return Err(Error::InvalidArgument("REJ private data too long".into()));
        }
        let rejected = match state {
            ReqRcvd | MraReqSent => MsgRef::Req,
            RepRcvd => MsgRef::Rep,
            _ => MsgRef::Other,
        };
        self.send_rej(conn, reason, rejected, private_data);
        self.enter_timewait(now, conn);
        Ok(())
    }

    fn send_rej(&mut self, conn: u32, reason: u16, rejected: MsgRef, private_data: &[u8]) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let (peer, tid) = (c.peer, c.tid);
        let rej = CmRej {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            message_rejected: rejected,
            reason,
            private_data: private_data.to_vec(),
            ..CmRej::default()
        };
        let last = self.emit(peer, tid, CmMessage::Rej(rej));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.last = last;
            c.last_kind = Some(mad::CM_ATTR_REJ);
        }
    }

    /// Completes an active connection after its REP: sends the RTU.
    pub fn establish(&mut self, conn: u32, private_data: &[u8]) -> Result<()> {
        self.conn_in(conn, &[ConnState::RepRcvd], "establish")?;
        if private_data.len() > CmRtu::PRIVATE_DATA_LEN {
            return Err(Error::InvalidArgument("RTU private data too long".into()));
        }
        let Some(c) = self.conns.get(&conn) else {
            return Ok(());
        };
        let (peer, tid, remote_id) = (c.peer, c.tid, c.remote_id);
        let rtu = CmRtu {
            local_comm_id: conn,
            remote_comm_id: remote_id,
            private_data: private_data.to_vec(),
        };
        let last = self.emit(peer, tid, CmMessage::Rtu(rtu));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = ConnState::Established;
            c.last = last;
            c.last_kind = Some(mad::CM_ATTR_RTU);
        }
        Ok(())
    }

    /// Disconnects: a DREQ from an established connection (or one whose REP was sent).
    /// Already disconnecting or disconnected: nothing to do.
    pub fn disconnect(&mut self, now: Instant, conn: u32, private_data: &[u8]) -> Result<()> {
        use ConnState::*;
        let Some(c) = self.conns.get(&conn) else {
            return Ok(()); // gone: disconnected long ago
        };
        match c.state {
            DreqSent | TimeWait => return Ok(()),
            Established | RepSent | MraRepRcvd => {}
            s => {
                return Err(Error::InvalidArgument(format!(
                    "disconnect: the connection is {s:?}"
                )));
            }
        }
        if private_data.len() > CmDreq::PRIVATE_DATA_LEN {
            return Err(Error::InvalidArgument("DREQ private data too long".into()));
        }
        self.send_dreq(now, conn, private_data);
        Ok(())
    }

    fn send_dreq(&mut self, now: Instant, conn: u32, private_data: &[u8]) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let remote_qpn = if c.active {
            c.rep.as_ref().map_or(0, |r| r.local_qpn)
        } else {
            c.req.as_ref().map_or(0, |r| r.local_qpn)
        };
        let (peer, remote_id) = (c.peer, c.remote_id);
        let tid = self.new_tid(conn);
        let dreq = CmDreq {
            local_comm_id: conn,
            remote_comm_id: remote_id,
            remote_qpn_eecn: remote_qpn,
            private_data: private_data.to_vec(),
        };
        let last = self.emit(peer, tid, CmMessage::Dreq(dreq));
        let timeout = self.cfg.response();
        let retries = self.cfg.max_retries;
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = ConnState::DreqSent;
            c.last = last;
            c.last_kind = Some(mad::CM_ATTR_DREQ);
            c.tries_left = retries;
            c.try_timeout = timeout;
        }
        self.set_timer(conn, Some(now + timeout));
    }

    /// The consumer let go of connection `conn` (its id was destroyed): what is pending
    /// is rejected, what is established is disconnected, and no more events are reported.
    pub fn release(&mut self, now: Instant, conn: u32) {
        use ConnState::*;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.owned = false;
        match c.state {
            ReqRcvd | MraReqSent | RepSent | MraRepRcvd | RepRcvd => {
                let _ = self.reject(now, conn, rej_reason::CONSUMER_DEFINED, &[]);
            }
            ReqSent | MraReqRcvd => {
                self.send_rej(conn, rej_reason::TIMEOUT, MsgRef::Other, &[]);
                self.remove(conn);
            }
            SidrReqRcvd => {
                let _ = self.reject(now, conn, 0, &[]);
            }
            SidrReqSent => self.remove(conn),
            Established => self.send_dreq(now, conn, &[]),
            DreqSent | TimeWait => {}
        }
    }

    // ----------------------------------------------------------------- timers

    /// Runs the timers due at `now`: retransmissions, give-ups, TimeWait exits.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Requests no listener took in their grace: rejected now.
        while self.unclaimed.front().is_some_and(|u| u.0 <= now) {
            if let Some((_, from, tid, req)) = self.unclaimed.pop_front() {
                self.stats.rej_no_listener += 1;
                self.stateless_rej(from, tid, req.local_comm_id, rej_reason::INVALID_SERVICE_ID);
            }
        }
        while let Some(&(t, conn)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.remove(&(t, conn));
            if let Some(c) = self.conns.get_mut(&conn) {
                c.deadline = None;
            }
            self.expire(now, conn);
        }
    }

    fn expire(&mut self, now: Instant, conn: u32) {
        use ConnState::*;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let state = c.state;
        let retry = matches!(
            state,
            ReqSent | MraReqRcvd | RepSent | MraRepRcvd | DreqSent | SidrReqSent
        );
        if retry && c.tries_left > 0 {
            c.tries_left -= 1;
            // After an MRA, the next try waits the normal time again.
            if state == MraReqRcvd {
                c.state = ReqSent;
            } else if state == MraRepRcvd {
                c.state = RepSent;
            }
            let next = now + c.try_timeout;
            self.resend(conn);
            self.set_timer(conn, Some(next));
            return;
        }
        match state {
            ReqSent | MraReqRcvd | SidrReqSent => {
                self.stats.timeouts += 1;
                // A SIDR REQ has no REJ; a REQ's connection is given up with one.
                if state != SidrReqSent {
                    self.send_rej(conn, rej_reason::TIMEOUT, MsgRef::Other, &[]);
                }
                self.report(
                    conn,
                    Event::Unreachable {
                        conn,
                        status: -ETIMEDOUT,
                    },
                );
                self.remove(conn);
            }
            RepSent | MraRepRcvd | ReqRcvd | MraReqSent => {
                self.stats.timeouts += 1;
                self.answered(conn);
                self.send_rej(conn, rej_reason::TIMEOUT, MsgRef::Other, &[]);
                self.report(
                    conn,
                    Event::ConnectError {
                        conn,
                        status: -ETIMEDOUT,
                    },
                );
                self.enter_timewait(now, conn);
            }
            SidrReqRcvd => {
                self.stats.timeouts += 1;
                self.answered(conn);
                self.report(
                    conn,
                    Event::ConnectError {
                        conn,
                        status: -ETIMEDOUT,
                    },
                );
                self.remove(conn);
            }
            DreqSent => {
                self.stats.timeouts += 1;
                self.report(
                    conn,
                    Event::Disconnected {
                        conn,
                        status: -ETIMEDOUT,
                        private_data: Vec::new(),
                    },
                );
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.last = None;
                    c.last_kind = None;
                }
                self.enter_timewait(now, conn);
            }
            TimeWait => {
                let had_conn = self.conns.get(&conn).is_some_and(|c| {
                    matches!(
                        c.last_kind,
                        Some(mad::CM_ATTR_DREQ | mad::CM_ATTR_DREP) | None
                    )
                });
                if had_conn {
                    self.report(conn, Event::TimewaitExit { conn });
                }
                self.remove(conn);
            }
            RepRcvd | Established => {}
        }
    }

    // ----------------------------------------------------------------- receive

    /// Handles a MAD received from `from` (the UD payload of a packet to QP 1).
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, bytes: &[u8]) {
        self.stats.rx_mads += 1;
        let Ok(mad) = CmMad::parse(bytes) else {
            self.stats.drop_malformed += 1;
            return;
        };
        let tid = mad.header.transaction_id;
        match mad.message {
            CmMessage::Req(req) => self.on_req(now, from, tid, req),
            CmMessage::SidrReq(req) => self.on_sidr_req(now, from, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(from, rep),
            msg => {
                // Every other message names our communication ID — but a REJ of a REQ
                // whose answer we never saw (the active side gave up) may know only its
                // own.
                let mut ours = msg.remote_comm_id().unwrap_or(0);
                if let CmMessage::Rej(r) = &msg
                    && !self.conns.contains_key(&ours)
                    && let Some(&c) = self.by_remote.get(&(from, r.local_comm_id, false))
                {
                    ours = c;
                }
                let Some(c) = self.conns.get(&ours) else {
                    self.stats.drop_unknown_comm_id += 1;
                    if let CmMessage::Dreq(d) = msg {
                        // As ib_cm: a DREQ for a connection we no longer know gets its
                        // DREP, so that the peer does not retry into the void.
                        let drep = CmDrep {
                            local_comm_id: d.remote_comm_id,
                            remote_comm_id: d.local_comm_id,
                            private_data: Vec::new(),
                        };
                        self.emit(from, tid, CmMessage::Drep(drep));
                    }
                    return;
                };
                if c.peer != from {
                    self.stats.drop_wrong_source += 1;
                    return;
                }
                // Once known, the peer's ID must match (an MRA, REP or REJ may be the
                // first to tell it).
                let theirs = msg.local_comm_id();
                if c.remote_id != 0 && theirs != c.remote_id && theirs != 0 {
                    self.stats.drop_unknown_comm_id += 1;
                    return;
                }
                match msg {
                    CmMessage::Rep(rep) => self.on_rep(ours, rep),
                    CmMessage::Rtu(rtu) => self.on_rtu(ours, rtu),
                    CmMessage::Mra(mra) => self.on_mra(now, ours, mra),
                    CmMessage::Rej(rej) => self.on_rej(now, ours, rej),
                    CmMessage::Dreq(dreq) => self.on_dreq(now, ours, tid, dreq),
                    CmMessage::Drep(drep) => self.on_drep(now, ours, drep),
                    _ => self.stats.drop_out_of_state += 1,
                }
            }
        }
    }

    /// A reply sent without a connection record (REJ to an unknown service, a full
    /// backlog, …).
    fn stateless_rej(&mut self, to: IpAddr, tid: u64, remote_id: u32, reason: u16) {
        let rej = CmRej {
            local_comm_id: 0,
            remote_comm_id: remote_id,
            message_rejected: MsgRef::Req,
            reason,
            ..CmRej::default()
        };
        self.emit(to, tid, CmMessage::Rej(rej));
    }

    fn find_listener(&self, service_id: u64, dst: IpAddr) -> Option<&Listener> {
        let list = self.listeners.get(&service_id)?;
        list.iter()
            .find(|l| l.ip == Some(dst))
            .or_else(|| list.iter().find(|l| l.ip.is_none()))
    }

    fn take_backlog(&mut self, service_id: u64, owner: u64) -> bool {
        let Some(l) = self
            .listeners
            .get_mut(&service_id)
            .and_then(|list| list.iter_mut().find(|l| l.owner == owner))
        else {
            return false;
        };
        if l.pending >= l.backlog {
            return false;
        }
        l.pending += 1;
        true
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, tid: u64, req: CmReq) {
        use ConnState::*;
        if let Some(&conn) = self.by_remote.get(&(from, req.local_comm_id, false)) {
            self.stats.duplicates += 1;
            let Some(c) = self.conns.get(&conn) else {
                return;
            };
            match (c.state, c.last_kind) {
                (ReqRcvd | MraReqSent, _) => self.send_mra(conn, MsgRef::Req),
                (RepSent | MraRepRcvd, _) | (TimeWait, Some(mad::CM_ATTR_REJ)) => self.resend(conn),
                (TimeWait, _) => {
                    self.stateless_rej(from, tid, req.local_comm_id, rej_reason::STALE_CONN)
                }
                _ => {}
            }
            return;
        }
        let Ok(header) = CmaIpHeader::parse(&req.private_data) else {
            self.stats.drop_malformed += 1;
            return;
        };
        let Some(mtu) = Mtu::from_ibv(req.path_mtu) else {
            self.stats.drop_malformed += 1;
            return;
        };
        let Some(owner) = self
            .find_listener(req.service_id, header.dst)
            .map(|l| l.owner)
        else {
            // Nobody listens: the request waits its grace for a listener (a duplicate of a
            // waiting one is dropped), then is rejected; at once without a grace or room.
            let waiting = (self.unclaimed.iter())
                .any(|u| u.1 == from && u.3.local_comm_id == req.local_comm_id);
            if waiting {
                self.stats.duplicates += 1;
            } else if self.cfg.listen_grace.is_zero() || self.unclaimed.len() >= MAX_UNCLAIMED {
                self.stats.rej_no_listener += 1;
                self.stateless_rej(from, tid, req.local_comm_id, rej_reason::INVALID_SERVICE_ID);
            } else {
                let deadline = now + self.cfg.listen_grace;
                self.unclaimed
                    .push_back((deadline, from, tid, Box::new(req)));
            }
            return;
        };
        if !matches!(
            req.transport_service_type,
            mad::TRANSPORT_RC | mad::TRANSPORT_UC
        ) {
            self.stateless_rej(
                from,
                tid,
                req.local_comm_id,
                rej_reason::INVALID_TRANSPORT_TYPE,
            );
            return;
        }
        if self.conns.len() >= self.cfg.max_conns {
            self.stats.rej_no_resources += 1;
            self.stateless_rej(from, tid, req.local_comm_id, rej_reason::NO_RESOURCES);
            return;
        }
        if !self.take_backlog(req.service_id, owner) {
            self.stats.rej_backlog += 1;
            self.stateless_rej(from, tid, req.local_comm_id, rej_reason::NO_RESOURCES);
            return;
        }
        let local_id = self.new_comm_id();
        let my_psn = self.new_psn();
        let private_data = consumer_data(&req.private_data, CmaIpHeader::LEN);
        let remote_id = req.local_comm_id;
        let req = Box::new(req);
        self.conns.insert(
            local_id,
            Conn {
                remote_id,
                peer: from,
                tid,
                state: ReqRcvd,
                active: false,
                owned: true,
                listener: Some(owner),
                req: Some(req.clone()),
                rep: None,
                my_psn,
                mtu,
                local_param: None,
                last: None,
                last_kind: None,
                deadline: None,
                tries_left: 0,
                try_timeout: Duration::ZERO,
            },
        );
        self.by_remote.insert((from, remote_id, false), local_id);
        self.set_timer(local_id, Some(now + self.cfg.pending_timeout));
        self.events.push_back(Event::ConnectRequest {
            listener: owner,
            conn: local_id,
            service_id: req.service_id,
            peer: from,
            header,
            private_data,
            req: Some(req),
        });
    }

    /// Clamps a passive connection's MTU to the device's (the shell calls this with the
    /// device's active MTU before reporting the request).
    pub fn limit_mtu(&mut self, conn: u32, mtu: Mtu) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.mtu = c.mtu.min(mtu);
        }
    }

    fn send_mra(&mut self, conn: u32, what: MsgRef) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let (peer, tid, remote_id) = (c.peer, c.tid, c.remote_id);
        let mra = CmMra {
            local_comm_id: conn,
            remote_comm_id: remote_id,
            message_mraed: what,
            service_timeout: mad::timeout_exponent(self.cfg.pending_timeout),
            private_data: Vec::new(),
        };
        self.stats.retransmits += 1;
        self.emit(peer, tid, CmMessage::Mra(mra));
        if let Some(c) = self.conns.get_mut(&conn)
            && c.state == ConnState::ReqRcvd
        {
            c.state = ConnState::MraReqSent;
        }
    }

    fn on_rep(&mut self, conn: u32, rep: CmRep) {
        use ConnState::*;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.state {
            ReqSent | MraReqRcvd => {
                c.state = RepRcvd;
                c.remote_id = rep.local_comm_id;
                let peer = c.peer;
                c.rep = Some(Box::new(rep.clone()));
                c.last = None;
                c.last_kind = None;
                self.by_remote
                    .insert((peer, rep.local_comm_id, false), conn);
                self.set_timer(conn, None);
                self.report(
                    conn,
                    Event::ConnectReply {
                        conn,
                        rep: Box::new(rep),
                    },
                );
            }
            RepRcvd => self.stats.duplicates += 1,
            Established if c.last_kind == Some(mad::CM_ATTR_RTU) => {
                // Our RTU was lost: the peer resent its REP.
                self.stats.duplicates += 1;
                self.resend(conn);
            }
            _ => self.stats.drop_out_of_state += 1,
        }
    }

    fn on_rtu(&mut self, conn: u32, rtu: CmRtu) {
        use ConnState::*;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.state {
            RepSent | MraRepRcvd if !c.active => {
                c.state = Established;
                c.last = None;
                c.last_kind = None;
                self.set_timer(conn, None);
                self.report(
                    conn,
                    Event::Established {
                        conn,
                        private_data: rtu.private_data,
                    },
                );
            }
            Established if !c.active => self.stats.duplicates += 1,
            _ => self.stats.drop_out_of_state += 1,
        }
    }

    fn on_mra(&mut self, now: Instant, conn: u32, mra: CmMra) {
        use ConnState::*;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let wait = mad::timeout_duration(mra.service_timeout.min(self.cfg.max_peer_timeout))
            + self.cfg.response();
        match (c.state, mra.message_mraed) {
            (ReqSent | MraReqRcvd, MsgRef::Req) => {
                if c.remote_id == 0 {
                    c.remote_id = mra.local_comm_id;
                }
                c.state = MraReqRcvd;
                self.set_timer(conn, Some(now + wait));
            }
            (RepSent | MraRepRcvd, MsgRef::Rep) => {
                c.state = MraRepRcvd;
                self.set_timer(conn, Some(now + wait));
            }
            _ => self.stats.drop_out_of_state += 1,
        }
    }

    fn on_rej(&mut self, now: Instant, conn: u32, rej: CmRej) {
        use ConnState::*;
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        match c.state {
            ReqSent | MraReqRcvd | RepRcvd | ReqRcvd | MraReqSent | RepSent | MraRepRcvd => {
                self.answered(conn);
                self.report(
                    conn,
                    Event::Rejected {
                        conn,
                        reason: rej.reason,
                        private_data: rej.private_data,
                    },
                );
                self.remove(conn);
            }
            Established | DreqSent => {
                // The peer gave up on the connection.
                self.report(
                    conn,
                    Event::Disconnected {
                        conn,
                        status: 0,
                        private_data: Vec::new(),
                    },
                );
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.last = None;
                    c.last_kind = None;
                }
                self.enter_timewait(now, conn);
            }
            _ => self.stats.drop_out_of_state += 1,
        }
    }

    fn on_dreq(&mut self, now: Instant, conn: u32, tid: u64, dreq: CmDreq) {
        use ConnState::*;
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let state = c.state;
        match state {
            Established | RepSent | MraRepRcvd | DreqSent => {
                let drep = CmDrep {
                    local_comm_id: conn,
                    remote_comm_id: c.remote_id,
                    private_data: Vec::new(),
                };
                let peer = c.peer;
                let last = self.emit(peer, tid, CmMessage::Drep(drep));
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.last = last;
                    c.last_kind = Some(mad::CM_ATTR_DREP);
                }
                self.report(
                    conn,
                    Event::Disconnected {
                        conn,
                        status: 0,
                        private_data: dreq.private_data,
                    },
                );
                self.enter_timewait(now, conn);
            }
            TimeWait if c.last_kind == Some(mad::CM_ATTR_DREP) => {
                self.stats.duplicates += 1;
                self.resend(conn);
            }
            TimeWait => {
                // Our DREQ crossed theirs, or our DREP was lost: answer.
                self.stats.duplicates += 1;
                let drep = CmDrep {
                    local_comm_id: conn,
                    remote_comm_id: c.remote_id,
                    private_data: Vec::new(),
                };
                let peer = c.peer;
                self.emit(peer, tid, CmMessage::Drep(drep));
            }
            _ => self.stats.drop_out_of_state += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, conn: u32, drep: CmDrep) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.state {
            ConnState::DreqSent => {
                c.last = None;
                c.last_kind = None;
                self.report(
                    conn,
                    Event::Disconnected {
                        conn,
                        status: 0,
                        private_data: drep.private_data,
                    },
                );
                self.enter_timewait(now, conn);
            }
            ConnState::TimeWait => self.stats.duplicates += 1,
            _ => self.stats.drop_out_of_state += 1,
        }
    }

    fn on_sidr_req(&mut self, now: Instant, from: IpAddr, tid: u64, req: CmSidrReq) {
        if let Some(&conn) = self.by_remote.get(&(from, req.request_id, true)) {
            self.stats.duplicates += 1;
            if self
                .conns
                .get(&conn)
                .is_some_and(|c| c.state == ConnState::TimeWait)
            {
                self.resend(conn);
            }
            return;
        }
        let Ok(header) = CmaIpHeader::parse(&req.private_data) else {
            self.stats.drop_malformed += 1;
            return;
        };
        let sidr_rep = |status| CmSidrRep {
            request_id: req.request_id,
            status,
            service_id: req.service_id,
            ..CmSidrRep::default()
        };
        let Some(owner) = self
            .find_listener(req.service_id, header.dst)
            .map(|l| l.owner)
        else {
            self.stats.rej_no_listener += 1;
            self.emit(
                from,
                tid,
                CmMessage::SidrRep(sidr_rep(mad::SIDR_UNSUPPORTED)),
            );
            return;
        };
        if self.conns.len() >= self.cfg.max_conns {
            self.stats.rej_no_resources += 1;
            self.emit(from, tid, CmMessage::SidrRep(sidr_rep(mad::SIDR_NO_QP)));
            return;
        }
        if !self.take_backlog(req.service_id, owner) {
            self.stats.rej_backlog += 1;
            self.emit(from, tid, CmMessage::SidrRep(sidr_rep(mad::SIDR_NO_QP)));
            return;
        }
        let local_id = self.new_comm_id();
        let private_data = consumer_data(&req.private_data, CmaIpHeader::LEN);
        // The REQ slot keeps the service ID (for the reply and the backlog).
        let pseudo = CmReq {
            service_id: req.service_id,
            ..CmReq::default()
        };
        self.conns.insert(
            local_id,
            Conn {
                remote_id: req.request_id,
                peer: from,
                tid,
                state: ConnState::SidrReqRcvd,
                active: false,
                owned: true,
                listener: Some(owner),
                req: Some(Box::new(pseudo)),
                rep: None,
                my_psn: 0,
                mtu: Mtu::Mtu256,
                local_param: None,
                last: None,
                last_kind: None,
                deadline: None,
                tries_left: 0,
                try_timeout: Duration::ZERO,
            },
        );
        self.by_remote
            .insert((from, req.request_id, true), local_id);
        self.set_timer(local_id, Some(now + self.cfg.pending_timeout));
        self.events.push_back(Event::ConnectRequest {
            listener: owner,
            conn: local_id,
            service_id: req.service_id,
            peer: from,
            header,
            private_data,
            req: None,
        });
    }

    fn on_sidr_rep(&mut self, from: IpAddr, rep: CmSidrRep) {
        let conn = rep.request_id;
        let Some(c) = self.conns.get(&conn) else {
            self.stats.drop_unknown_comm_id += 1;
            return;
        };
        if c.peer != from {
            self.stats.drop_wrong_source += 1;
            return;
        }
        if c.state != ConnState::SidrReqSent {
            self.stats.drop_out_of_state += 1;
            return;
        }
        let ev = if rep.status == mad::SIDR_SUCCESS {
            Event::SidrResolved {
                conn,
                qpn: rep.qpn,
                qkey: rep.qkey,
                private_data: rep.private_data,
            }
        } else {
            Event::Unreachable {
                conn,
                status: i32::from(rep.status),
            }
        };
        self.report(conn, ev);
        self.remove(conn);
    }
}

#[cfg(test)]
mod tests;
