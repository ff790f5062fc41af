//! The provider conformance suite: verbs behaviour every remem provider must show, written
//! once against `remem-verbs` so that the soft provider and the rdma-core provider run the
//! same checks.
//!
//! A provider's test file builds a [`Pair`] of device contexts (two soft devices, or two
//! rdma-core devices, or one of each for interop) and runs [`run_all`] or single cases from
//! [`CASES`]. Every case creates its own PD, CQs, QPs and memory, so cases are independent.
//! Waiting is bounded: a case fails with a clear message instead of hanging.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cases;
mod harness;
pub mod remote;

pub use cases::CASES;
pub use harness::{
    Endpoint, Pair, QpOptions, bring_up, connect_rc, endpoint, poll_n, poll_one, roce_v2_gid,
};

/// The result of one conformance case: `Err` carries what went wrong.
pub type CaseResult = Result<(), String>;

/// A named conformance case.
pub struct Case {
    /// Name, for reports and test filters.
    pub name: &'static str,
    /// The check.
    pub run: fn(&Pair) -> CaseResult,
}

/// Runs every case and returns the names and errors of those that failed.
pub fn run_all(pair: &Pair) -> Vec<(&'static str, String)> {
    CASES
        .iter()
        .filter_map(|c| (c.run)(pair).err().map(|e| (c.name, e)))
        .collect()
}
