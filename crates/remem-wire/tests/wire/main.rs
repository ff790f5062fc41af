//! remem-wire's integration tests, one test binary (`cargo test -p remem-wire --test wire`):
//! a binary per file would link the crate and proptest once for each.
//!
//! - [`props`]: property tests of the packet headers and the ICRC;
//! - [`cm_props`]: property tests of the CM MADs;
//! - [`rxe_vectors`]: golden vectors, packets captured from kernel Soft-RoCE;
//! - [`cm_mads`]: the CM MADs of a kernel `rping` capture, and the IBTA layouts of those
//!   it lacks.

mod cm_mads;
mod cm_props;
mod props;
mod rxe_vectors;
