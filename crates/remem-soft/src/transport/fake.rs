//! The one fake [`Env`] the RC, UC and UD unit tests run their transports in: a receive
//! queue, the completions and asynchronous events the transport reports, its counters by
//! rxe name, one revocable 64 KiB region under [`RKEY`] with the access rights
//! [`FakeEnv::key_access`], and the local operations it executed (refused while
//! [`FakeEnv::refuse_local`]). The deterministic simulation (`sim`) has its own environment
//! (memory checked against a model), as has the fuzzer (an integration test).

use super::wqe::RecvWqe;
use super::{Env, Grant, RemoteKeyError, Stat};
use crate::mem::grant::KeyedRegion;
use remem_verbs::{
    AccessFlags, AsyncEvent, MemRegion, MemoryBuffer, SendOp, WcStatus, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The rkey of the fake's region; any other is unknown.
pub const RKEY: u32 = 0x77;

/// One side of a transport test: see the module's doc.
pub struct FakeEnv {
    /// The receive queue.
    pub rq: VecDeque<RecvWqe>,
    /// Send completions, in order.
    pub sent: Vec<WorkCompletion>,
    /// Receive completions, in order.
    pub recvd: Vec<WorkCompletion>,
    /// Counters by rxe name (`out_of_seq_request`, …; `other` for the rest).
    pub stats: HashMap<&'static str, u64>,
    /// Asynchronous events, in order.
    pub events: Vec<AsyncEvent>,
    /// The memory under [`RKEY`].
    pub target: Arc<MemoryBuffer>,
    /// Its key; revoked, [`RKEY`] is unknown.
    pub key: Arc<KeyedRegion>,
    /// The access rights [`RKEY`] grants (default: local write and every remote right).
    pub key_access: AccessFlags,
    /// Local operations executed, in order.
    pub local_ops: Vec<SendOp>,
    /// Refuse local operations (`MwBindErr`).
    pub refuse_local: bool,
}

impl Default for FakeEnv {
    fn default() -> Self {
        let target = Arc::new(MemoryBuffer::zeroed(64 * 1024).unwrap());
        FakeEnv {
            rq: VecDeque::new(),
            sent: Vec::new(),
            recvd: Vec::new(),
            stats: HashMap::new(),
            events: Vec::new(),
            key: KeyedRegion::new(MemRegion::whole(target.clone())),
            target,
            key_access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE,
            local_ops: Vec::new(),
            refuse_local: false,
        }
    }
}

impl FakeEnv {
    /// A fresh side.
    pub fn new() -> Self {
        Self::default()
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
}

impl Env for FakeEnv {
    fn remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Grant, RemoteKeyError> {
        if rkey != RKEY || self.key.is_revoked() {
            return Err(RemoteKeyError::UnknownKey);
        }
        if !self.key_access.contains(need) {
            return Err(RemoteKeyError::MissingAccess);
        }
        self.key.grant(va, len)
    }

    fn remote_region(&mut self, rkey: u32, need: AccessFlags) -> Result<Grant, RemoteKeyError> {
        let va = self.key.region().addr();
        let len = self.key.region().len() as u64;
        self.remote(rkey, va, len, need)
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
        let name = match stat {
            Stat::DuplicateRequest => "duplicate_request",
            Stat::SendErr => "send_err",
            Stat::DuplicateReadDropped => "drop_duplicate_read",
            Stat::ReadOverflowDropped => "drop_read_overflow",
            Stat::OutOfSeqRequest => "out_of_seq_request",
            Stat::ResponseQueueFull => "drop_resp_queue_full",
            Stat::SentRnrNak => "send_rnr_err",
            _ => "other",
        };
        *self.stats.entry(name).or_default() += 1;
    }

    fn async_event(&mut self, event: AsyncEvent) {
        self.events.push(event);
    }
}
