//! remem-soft's integration tests, one test binary (`cargo test -p remem-soft --test soft`):
//! one link of the crate and its dependencies instead of one per file. Each module is a
//! suite; filter by its name (`cargo test -p remem-soft --test soft fuzz::`). Suites that
//! are heavy read the environment variables CI sets (`REMEM_FUZZ_ITERS`, `REMEM_SIM_SEEDS`,
//! `REMEM_KERNEL_PCAP`, …) and keep a plain `cargo test` short without them.

mod common;

mod affinity;
mod attacks;
mod busy_poll;
mod close;
mod cm;
mod cm_hostile;
mod cm_rxe_replay;
mod comp_channel;
mod conformance;
mod faults_gso;
mod fuzz;
mod host;
mod hostile;
mod inline;
mod iova;
mod ipv6;
mod layers;
mod limits;
mod multicast;
mod pcap;
mod peer_port;
mod rc_setup;
mod scale;
mod two_process;
mod window;
mod zerocopy;
