//! The drop-in's integration tests, one test binary (`cargo test -p remem-ibv --test
//! dropin`; a binary per file would link the soft NIC once for each). Every test runs
//! programs on the freshly built `libremem_ibv.so` (see `common`); what needs something
//! absent (a C compiler, rdma-core's headers, Debian's tools) says `skipped: <why>`.
//!
//! - C programs compiled against rdma-core's headers, linked with the drop-in:
//!   [`c_api`], [`caps_c`], [`queues_c`], [`mw_c`], [`placement_c`], [`mcast_c`],
//!   [`rdmacm_c`], [`teardown_c`] (their sources in `tests/c/`);
//! - eight processes on the host's shared device in a full mesh, C programs on the
//!   drop-in and the `remem` crate's async API mixed, one killed mid-run: [`mesh`];
//! - unmodified Debian programs on it: [`tools`] (ibverbs-utils), [`queues_tools`]
//!   (pingpong examples, perftest), [`rdmacm_tools`] (rdmacm-utils, perftest `-R`);
//! - unmodified programs on ONE host address, the default device shared by every process
//!   (127.0.0.1): [`host_tools`] (rping, perftest, fi_pingpong, four pingpong pairs at
//!   once, a client's death);
//! - the library's versioned symbols: [`symbols`].
//!
//! Pairs of processes take `support::serial()`, so that at most one pair runs at a time
//! (as when each file was a binary of its own, run one after another).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod c_api;
mod caps_c;
mod host_tools;
mod mcast_c;
mod mesh;
mod mw_c;
mod placement_c;
mod queues_c;
mod queues_tools;
mod rdmacm_c;
mod rdmacm_tools;
mod symbols;
mod teardown_c;
mod tools;
