//! The one fake [`Env`] the transports' tests run in: the RC, UC and UD unit tests, the
//! deterministic simulation (`sim`, one per node) and the responder fuzzer (an integration
//! test, through the `internals` feature). It holds a receive queue, the completions and
//! asynchronous events the transport reports, its counters by rxe name ([`Stat::rxe_name`]), a
//! key table (rkey → registration and access rights, as a device's MR table), and the local
//! operations it executed (refused while [`FakeEnv::refuse_local`]).
//!
//! [`FakeEnv::new`] registers one revocable 64 KiB region under [`RKEY`] ([`FakeEnv::target`],
//! [`FakeEnv::key`]); [`FakeEnv::with_key`] registers a given one under a given rkey, and
//! [`FakeEnv::register`] adds more.

use super::wqe::RecvWqe;
use super::{Env, Grant, RemoteKeyError, Stat};
use crate::mem::grant::KeyedRegion;
use remem_verbs::{
    AccessFlags, AsyncEvent, MemRegion, MemoryBuffer, SendOp, WcStatus, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The rkey of [`FakeEnv::new`]'s region.
pub const RKEY: u32 = 0x77;

/// One side of a transport test: see the module's doc.
pub struct FakeEnv {
    /// The receive queue.
    pub rq: VecDeque<RecvWqe>,
    /// Send completions, in order.
    pub sent: Vec<WorkCompletion>,
    /// Receive completions, in order.
    pub recvd: Vec<WorkCompletion>,
    /// Counters by rxe name ([`Stat::rxe_name`]).
    pub stats: HashMap<&'static str, u64>,
    /// Asynchronous events, in order.
    pub events: Vec<AsyncEvent>,
    /// The memory of the first region registered (that of [`FakeEnv::key`]).
    pub target: Arc<MemoryBuffer>,
    /// The first region's registration; revoked, its rkey is unknown.
    pub key: Arc<KeyedRegion>,
    /// The key table: registrations and the rights they grant, by rkey. A revoked
    /// registration's rkey is unknown.
    pub keys: HashMap<u32, (Arc<KeyedRegion>, AccessFlags)>,
    /// Local operations executed, in order.
    pub local_ops: Vec<SendOp>,
    /// Refuse local operations (`MwBindErr`).
    pub refuse_local: bool,
}

impl Default for FakeEnv {
    fn default() -> Self {
        let target = Arc::new(MemoryBuffer::zeroed(64 * 1024).unwrap());
        FakeEnv::with_key(
            RKEY,
            KeyedRegion::new(MemRegion::whole(target)),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE,
        )
    }
}

impl FakeEnv {
    /// A fresh side with a zeroed 64 KiB region under [`RKEY`] granting local write and
    /// every remote right.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh side with `key` (its [`target`](FakeEnv::target) the key's buffer) under
    /// `rkey`, granting `access`.
    pub fn with_key(rkey: u32, key: Arc<KeyedRegion>, access: AccessFlags) -> Self {
        FakeEnv {
            rq: VecDeque::new(),
            sent: Vec::new(),
            recvd: Vec::new(),
            stats: HashMap::new(),
            events: Vec::new(),
            target: key.region().buffer().clone(),
            keys: HashMap::from([(rkey, (key.clone(), access))]),
            key,
            local_ops: Vec::new(),
            refuse_local: false,
        }
    }

    /// Registers `key` under `rkey` granting `access` (replacing what `rkey` named).
    pub fn register(&mut self, rkey: u32, key: Arc<KeyedRegion>, access: AccessFlags) {
        self.keys.insert(rkey, (key, access));
    }

    /// Sets the rights `rkey` grants.
    ///
    /// # Panics
    ///
    /// If `rkey` is not registered.
    pub fn set_access(&mut self, rkey: u32, access: AccessFlags) {
        self.keys.get_mut(&rkey).expect("a registered rkey").1 = access;
    }

    /// The counter named `name` (an rxe name).
    pub fn stat(&self, name: &str) -> u64 {
        self.stats.get(name).copied().unwrap_or(0)
    }

    /// Posts a receive of `len` bytes; returns its buffer.
    pub fn post_recv(&mut self, wr_id: u64, len: usize) -> Arc<MemoryBuffer> {
        let buf = Arc::new(MemoryBuffer::zeroed(len).unwrap());
        self.rq.push_back(RecvWqe {
            wr_id,
            sges: vec![MemRegion::whole(buf.clone()).into()],
            total_len: len as u64,
        });
        buf
    }

    /// The registration `rkey` names, if it grants `need`.
    fn lookup(&self, rkey: u32, need: AccessFlags) -> Result<&Arc<KeyedRegion>, RemoteKeyError> {
        match self.keys.get(&rkey) {
            Some((key, _)) if key.is_revoked() => Err(RemoteKeyError::UnknownKey),
            Some((_, access)) if !access.contains(need) => Err(RemoteKeyError::MissingAccess),
            Some((key, _)) => Ok(key),
            None => Err(RemoteKeyError::UnknownKey),
        }
    }
}

impl Env for FakeEnv {
    fn remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Grant, RemoteKeyError> {
        self.lookup(rkey, need)?.grant(va, len)
    }

    fn remote_region(&mut self, rkey: u32, need: AccessFlags) -> Result<Grant, RemoteKeyError> {
        self.lookup(rkey, need)?.grant_all()
    }

    fn local_op(&mut self, op: &SendOp) -> Result<(), WcStatus> {
        if self.refuse_local {
            return Err(WcStatus::MwBindErr);
        }
        self.local_ops.push(*op);
        Ok(())
    }

    fn take_recv(&mut self) -> Option<RecvWqe> {
        self.rq.pop_front()
    }

    fn send_completion(&mut self, wc: WorkCompletion) {
        self.sent.push(wc);
    }

    fn recv_completion(&mut self, wc: WorkCompletion, _solicited: bool) {
        self.recvd.push(wc);
    }

    fn count(&mut self, stat: Stat) {
        *self.stats.entry(stat.rxe_name()).or_default() += 1;
    }

    fn async_event(&mut self, event: AsyncEvent) {
        self.events.push(event);
    }
}
