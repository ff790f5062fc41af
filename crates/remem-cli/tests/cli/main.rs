//! The `remem` binary run as a user would, in one test binary (one link, not one per
//! file): a module per command.

mod devices;
mod namespace;
mod perf;
mod run;
