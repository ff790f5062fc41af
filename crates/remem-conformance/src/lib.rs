//! The provider conformance suite: verbs behaviour every remem provider must show, written
//! once against `remem-verbs` so that the soft provider and the rdma-core provider run the
//! same checks.
//!
//! Each case is one function that both sides run (SPMD, as in MPI): a [`Side`] knows its
//! [`Role`] (A, the requester of most cases, or B), holds only its own device and exchanges
//! endpoint information, memory-region keys and results with its peer over a [`Link`]. So
//! every case runs unchanged
//!
//! - in one process, over two device contexts ([`run_pair`], [`Case::run`], [`run_all`]:
//!   two threads and a channel), and
//! - across two processes ([`run_side`] in each; [`remote`] spawns the peer process and
//!   runs a whole suite over a socket between the two).
//!
//! Every case creates its own PD, CQs, QPs and memory, so cases are independent. Waiting
//! is bounded: a case fails with a clear message instead of hanging, and a side that fails
//! tells its peer, which then fails at once ("peer failed: …").

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cases;
mod cm_cases;
mod harness;
mod link;
#[cfg(unix)]
pub mod remote;
mod side;

pub use cases::CASES;
pub use harness::{
    Endpoint, MTU_ENV, Pair, QpOptions, TIMEOUT, bring_up, connect_rc, endpoint, is_kernel_rxe,
    poll_n, poll_one, roce_v2_gid,
};
pub use link::{ChannelLink, Link, Stream, StreamLink};
pub use side::{RemoteMr, Role, Side, run_pair, run_side};

/// The result of one conformance case: `Err` carries what went wrong.
pub type CaseResult = Result<(), String>;

/// A named conformance case.
pub struct Case {
    /// Name, for reports and test filters.
    pub name: &'static str,
    /// What it checks, in a sentence.
    pub about: &'static str,
    /// The check, run by both sides, each in its role.
    pub side: fn(&mut Side<'_>) -> CaseResult,
    /// Runs both sides in this process, on the two devices of a [`Pair`] ([`run_pair`]).
    pub run: fn(&Pair) -> CaseResult,
}

impl Case {
    /// The case called `name`.
    pub fn named(name: &str) -> Option<&'static Case> {
        CASES.iter().find(|c| c.name == name)
    }
}

/// Runs every case in this process and returns the names and errors of those that failed.
pub fn run_all(pair: &Pair) -> Vec<(&'static str, String)> {
    CASES
        .iter()
        .filter_map(|c| (c.run)(pair).err().map(|e| (c.name, e)))
        .collect()
}
