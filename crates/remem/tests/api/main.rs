//! The async API's integration tests, in one test binary (one link of the workspace, not
//! one per file): a module per suite, `common` what they share. Suites that run this
//! binary again as a child process (`durability`, `kv_cache`, `stream_kill`,
//! `two_process`) name the child's test by its path here (`two_process::child_server`).
//! `tests/dispatch.rs` stays a binary of its own: it counts the process's threads and
//! tasks, which other suites running beside it would add to.

mod common;

mod api;
mod cm;
mod connect;
mod durability;
mod faults;
mod hostile;
mod kv_cache;
mod liveness;
mod memory;
mod persist;
mod rpc;
mod srq;
mod stream_kill;
mod two_process;
