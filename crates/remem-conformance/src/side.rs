//! One side of a case. A case is one function both sides run (SPMD, as in MPI): each side
//! knows its [`Role`], holds only its own device and talks to its peer through a [`Link`],
//! so the same case runs with both sides in one process or in two.
//!
//! Every message a case sends is a *data* message; when a side's case function returns, the
//! side sends an *end* message carrying its error, if it failed, and reads up to the peer's
//! end message. A side waiting for data that gets the peer's end fails at once ("peer
//! failed: …"), so a failing side never leaves its peer waiting, and both sides report
//! both errors.

use crate::harness::{Endpoint, PSNS, QpInfo, QpOptions, endpoint};
use crate::link::{ChannelLink, Link};
use crate::{Case, CaseResult, Pair};
use remem_verbs::{Context, MemoryRegion, QpType, QueuePair};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which side of a case: A is the requester of most cases, B the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The requester side.
    A,
    /// The responder side.
    B,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::A => "A",
            Role::B => "B",
        })
    }
}

/// How much longer than a completion a side waits for a message: the peer may be waiting
/// for completions itself before it sends.
pub(crate) const LINK_WAIT_FACTOR: u32 = 3;

const DATA: u8 = b'D';
const END: u8 = b'E';

/// The error an end message carries after its tag (none: the side succeeded, or failed
/// only because its peer had).
fn end_error(rest: &[u8]) -> Option<String> {
    (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned())
}

/// A memory region of the peer, as a work request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMr {
    /// Virtual address of its first byte.
    pub addr: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u64,
}

/// One side of a running case: its role, its device and the link to its peer.
pub struct Side<'l> {
    /// This side's role.
    pub role: Role,
    /// This side's device.
    pub ctx: Arc<dyn Context>,
    /// How long to wait for a completion.
    pub timeout: Duration,
    link: &'l mut dyn Link,
    /// Set when the peer's end message arrived: the peer's own error, if it failed.
    peer_end: Option<Option<String>>,
    /// Connected QPs, kept until both sides finished: a QP destroyed at once after its last
    /// receive completed may never send the ACK its peer is waiting for (as with any NIC,
    /// a verbs program keeps its QP until the peer is done).
    connected: Vec<Arc<dyn QueuePair>>,
}

impl Side<'_> {
    /// Sends a message to the peer.
    pub fn send(&mut self, msg: &[u8]) -> CaseResult {
        self.link.send(&[&[DATA], msg].concat())
    }

    /// Receives the peer's next message. Fails if the peer finished or failed instead.
    pub fn recv(&mut self) -> Result<Vec<u8>, String> {
        if self.peer_end.is_some() {
            return Err("the peer has already finished the case".into());
        }
        let msg = self.link.recv(self.timeout * LINK_WAIT_FACTOR)?;
        match msg.split_first() {
            Some((&DATA, rest)) => Ok(rest.to_vec()),
            Some((&END, rest)) => {
                let peer_error = end_error(rest);
                self.peer_end = Some(peer_error.clone());
                Err(match peer_error {
                    Some(e) => format!("peer failed: {e}"),
                    None => "the peer finished the case while this side waited for it".into(),
                })
            }
            _ => Err(format!("malformed message from the peer: {msg:?}")),
        }
    }

    /// Sends `mine` and receives the peer's message.
    pub fn exchange(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        self.send(mine)?;
        self.recv()
    }

    /// Tells the peer that this side reached `tag` (see [`Side::wait_for`]).
    pub fn signal(&mut self, tag: &str) -> CaseResult {
        self.send(tag.as_bytes())
    }

    /// Waits until the peer signals `tag`.
    pub fn wait_for(&mut self, tag: &str) -> CaseResult {
        let got = self.recv()?;
        if got != tag.as_bytes() {
            return Err(format!(
                "out of step: waited for {tag:?}, the peer sent {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        Ok(())
    }

    /// Both sides reach `tag` before either goes on.
    pub fn barrier(&mut self, tag: &str) -> CaseResult {
        self.signal(tag)?;
        self.wait_for(tag)
    }

    /// Sends numbers to the peer (see [`Side::recv_words`]).
    pub fn send_words(&mut self, words: &[u64]) -> CaseResult {
        self.send(
            &words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<_>>(),
        )
    }

    /// Receives exactly `N` numbers from the peer.
    pub fn recv_words<const N: usize>(&mut self) -> Result<[u64; N], String> {
        let msg = self.recv()?;
        let words: Vec<u64> = msg
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        words.try_into().map_err(|_| {
            format!(
                "expected {N} numbers from the peer, got {} bytes",
                msg.len()
            )
        })
    }

    /// Sends `N` numbers and receives the peer's `N`.
    pub fn exchange_words<const N: usize>(&mut self, mine: [u64; N]) -> Result<[u64; N], String> {
        self.send_words(&mine)?;
        self.recv_words()
    }

    /// Tells the peer where `mr` is (see [`Side::remote_mr`]).
    pub fn offer_mr(&mut self, mr: &dyn MemoryRegion) -> CaseResult {
        self.send_words(&[mr.addr(), u64::from(mr.rkey()), mr.len() as u64])
    }

    /// Receives the memory region the peer offers.
    pub fn remote_mr(&mut self) -> Result<RemoteMr, String> {
        let [addr, rkey, len] = self.recv_words()?;
        let rkey = u32::try_from(rkey).map_err(|_| format!("bad rkey {rkey:#x}"))?;
        Ok(RemoteMr { addr, rkey, len })
    }

    /// Sends `ep`'s connection information (with this role's initial PSN) and receives the
    /// peer's: `(mine, peer's)`.
    pub(crate) fn exchange_qp(
        &mut self,
        ep: &Endpoint,
        o: &QpOptions,
    ) -> Result<(QpInfo, QpInfo), String> {
        let me = QpInfo::of(ep, PSNS[self.role as usize], o)?;
        let peer = QpInfo::from_words(self.exchange_words(me.words())?)?;
        Ok((me, peer))
    }

    /// Creates an RC QP on this side's device and connects it to the peer's (both sides
    /// call this): exchanges QP number, GID, PSN and MTU, brings the QP up to RTS, and
    /// returns once both QPs are in RTS.
    pub fn connect_rc(&mut self, o: &QpOptions) -> Result<Endpoint, String> {
        self.connect(o, QpType::Rc)
    }

    /// [`Side::connect_rc`] for a UC QP (brought up with the attributes UC takes).
    pub fn connect_uc(&mut self, o: &QpOptions) -> Result<Endpoint, String> {
        self.connect(o, QpType::Uc)
    }

    fn connect(&mut self, o: &QpOptions, qp_type: QpType) -> Result<Endpoint, String> {
        let ep = endpoint(&self.ctx, o, qp_type, None)?;
        let (me, peer) = self.exchange_qp(&ep, o)?;
        me.connect(&ep, &peer, o)?;
        self.barrier("connected")?;
        self.connected.push(ep.qp.clone());
        Ok(ep)
    }

    /// After the case: sends this side's end message and receives the peer's (then drops
    /// the connected QPs); the result names every side's own error.
    fn finish(mut self, result: CaseResult) -> CaseResult {
        let peer_failed_first = matches!(self.peer_end, Some(Some(_)));
        // A failure caused by the peer's is reported by the peer.
        let own = result
            .err()
            .filter(|_| !peer_failed_first)
            .map(|e| format!("{}: {e}", self.role));
        let mut errors: Vec<String> = own.clone().into_iter().collect();
        // Trouble with the link is worth reporting only if nothing else went wrong first.
        let mut link_error = |e: String, doing: &str| {
            if own.is_none() {
                errors.push(format!("{}: {doing}: {e}", self.role));
            }
        };
        let end = [&[END], own.as_deref().unwrap_or("").as_bytes()].concat();
        if let Err(e) = self.link.send(&end) {
            link_error(e, "ending the case");
        } else {
            let wait = self.timeout * LINK_WAIT_FACTOR;
            while self.peer_end.is_none() {
                match self.link.recv(wait) {
                    Ok(msg) if msg.first() == Some(&END) => {
                        self.peer_end = Some(end_error(&msg[1..]))
                    }
                    Ok(_) => {} // data this side's case did not read
                    Err(e) => {
                        link_error(e, "waiting for the peer to finish");
                        break;
                    }
                }
            }
        }
        errors.extend(self.peer_end.flatten());
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

/// Runs one side of `case` on `ctx` as `role`, its peer at the other end of `link`;
/// `timeout` bounds every wait for a completion. Returns both sides' errors, if any.
pub fn run_side(
    case: &Case,
    role: Role,
    ctx: Arc<dyn Context>,
    link: &mut dyn Link,
    timeout: Duration,
) -> CaseResult {
    run_side_with(case.side, role, ctx, link, timeout)
}

pub(crate) fn run_side_with(
    f: impl FnOnce(&mut Side<'_>) -> CaseResult,
    role: Role,
    ctx: Arc<dyn Context>,
    link: &mut dyn Link,
    timeout: Duration,
) -> CaseResult {
    let mut side = Side {
        role,
        ctx,
        timeout,
        link,
        peer_end: None,
        connected: Vec::new(),
    };
    let result = f(&mut side);
    side.finish(result)
}

/// Runs both sides of `case` in this process, A on `pair.a` and B on `pair.b`, each on its
/// own thread, linked by channels.
pub fn run_pair(case: &Case, pair: &Pair) -> CaseResult {
    run_pair_with(case.side, pair)
}

/// [`run_pair`] for a case function (what [`Case::run`] calls).
pub(crate) fn run_pair_with(f: fn(&mut Side<'_>) -> CaseResult, pair: &Pair) -> CaseResult {
    let (ctx_b, timeout) = (pair.b.clone(), pair.timeout);
    std::thread::scope(|s| {
        // Each link end lives on its side's stack: a side that panics drops it, and the
        // other side's next receive fails at once.
        let (mut la, mut lb) = ChannelLink::pair();
        let b = s.spawn(move || run_side_with(f, Role::B, ctx_b, &mut lb, timeout));
        let a = run_side_with(f, Role::A, pair.a.clone(), &mut la, timeout);
        match b.join() {
            Ok(b) => a.and(b),
            Err(panic) => {
                let what = (panic.downcast_ref::<&str>().copied())
                    .or(panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("");
                let panicked = format!("B panicked: {what}");
                Err(a
                    .err()
                    .map_or(panicked.clone(), |a| format!("{panicked}; {a}")))
            }
        }
    })
}
