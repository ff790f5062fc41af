//! The drop-in `librdmacm.so.1`: RDMA CM (`rdma_cm(7)`) over remem-verbs' provider-neutral
//! CM API ([`remem_verbs::cm`]), so unmodified librdmacm programs (rping, rdma_server /
//! rdma_client, ucmatose, udaddy, perftest's `-R`) connect on remem's soft NIC.
//!
//! # One file, two libraries
//!
//! The cdylib `libremem_ibv.so` (soname `libibverbs.so.1`) carries librdmacm's symbols too,
//! at their versions (`RDMACM_1.0` .. `RDMACM_1.3`, declared in `libibverbs.map` beside
//! the `IBVERBS_*` nodes). A drop-in directory holds `librdmacm.so.1` as a second symlink
//! to the same file: the dynamic loader maps a file once (it recognises it by device and
//! inode, and by its soname) and adds the second name to the loaded object, so a program's
//! `NEEDED librdmacm.so.1` and `NEEDED libibverbs.so.1` are one object, and its
//! `rdma_*@RDMACM_1.x` and `ibv_*@IBVERBS_1.x` references both resolve there.
//!
//! # Layers
//!
//! - [`abi`]: `rdma_cma.h`'s structs and constants (layout-tested against the header).
//! - [`devices`]: which device an id is on. `rdma_create_id` has none; binding or
//!   resolving an address picks it (the device whose address it is; a wildcard binds
//!   every device), and opens it once for the process as an `ibv_context` of this
//!   library (`rdma_cm_id.verbs`, usable with every `ibv_*` call), with a default PD
//!   (`rdma_cm_id.pd`) and the device's CM channel.
//! - [`router`]: one thread that waits on every device's CM channel and hands each event
//!   to the `rdma_event_channel` its id belongs to *now* (ids migrate between channels).
//! - [`channel`]: `rdma_event_channel`s (a blocking eventfd, readable while an event is
//!   queued; `O_NONBLOCK` is the program's) and the events handed out
//!   (`rdma_get_cm_event` / `rdma_ack_cm_event`).
//! - [`id`]: `rdma_cm_id`s and the calls on them, synchronous ids (no channel: the calls
//!   block until their event), endpoints (`rdma_create_ep`, `rdma_get_request`); one file
//!   per concern: `id/mod.rs` (the id and its state), `fields` (the ABI fields written in
//!   place), `events`, `lifecycle` (create, destroy), `addr` (bind, resolve, listen),
//!   `conn` (connect, accept, reject, disconnect), `endpoint` (synchronous endpoints),
//!   `options` (options, migration, QP attributes, ECE), `mcast`.
//! - [`qp`]: `rdma_create_qp` (on the id's device, moved to INIT with the CM's
//!   attributes and attached to the CM id, which moves it on), SRQs.
//! - [`addrinfo`]: `rdma_getaddrinfo` / `rdma_freeaddrinfo`.
//! - [`rsocket`] (`crate::ffi::rsocket`): rsockets are not implemented (stubs;
//!   `rpoll`/`rselect` pass through).
//! - [`sockaddr`] (`crate::ffi::sockaddr`): the program's `struct sockaddr`s.
//!
//! The C entry points of `channel`, `id`, `devices`, `qp`, `addrinfo` are in
//! [`crate::ffi::rdmacm`], which converts the program's pointers once and calls the safe
//! code here (every module says `#![forbid(unsafe_code)]`; this one denies it, as its
//! test-only `tests` calls the C entry points as a program does).
//!
//! Errors follow librdmacm: -1 with errno (pointer results: NULL with errno), and the
//! `EAI_*` codes of `rdma_getaddrinfo`. Every exported body runs inside
//! [`crate::ffi::guard`].

#![deny(unsafe_code)]

pub mod abi;
pub mod addrinfo;
pub mod channel;
pub mod devices;
pub mod id;
pub mod qp;
pub mod router;
pub use crate::ffi::rsocket;
pub use crate::ffi::sockaddr;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub(crate) use crate::ffi::guard_neg;
use crate::ffi::set_errno;
use core::ffi::c_int;

/// Every C symbol the drop-in librdmacm exports, with its version.
pub fn exports() -> Vec<(&'static str, &'static str)> {
    [rsocket::SYMBOLS, crate::ffi::rdmacm::SYMBOLS].concat()
}

/// -1 with errno `e`: how librdmacm's calls fail.
pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// The errno of a remem-verbs error, as librdmacm's calls report it.
pub(crate) fn errno_of(e: &remem_verbs::Error) -> c_int {
    e.errno()
}

#[cfg(test)]
mod symbol_tests {
    use super::exports;
    use crate::symbols::debian_exports;
    use std::collections::BTreeSet;

    const DEBIAN_LIB: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

    #[test]
    fn no_symbol_is_exported_twice_by_either_library() {
        let cm = exports();
        let names: BTreeSet<_> = cm.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), cm.len());
        let verbs: BTreeSet<_> = crate::symbols::exports().iter().map(|(n, _)| *n).collect();
        assert!(names.is_disjoint(&verbs));
        assert!(cm.iter().all(|(_, v)| v.starts_with("RDMACM_1.")));
    }

    /// Every function Debian's librdmacm exports is exported here at the same version,
    /// and nothing else.
    #[test]
    fn exports_are_debian_librdmacm_s() {
        let Some(debian) = debian_exports(DEBIAN_LIB, "librdmacm1", "RDMACM_", false) else {
            return;
        };
        assert!(debian.len() >= 60, "parsed {} symbols", debian.len());
        let ours: BTreeSet<(String, String)> = exports()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let missing: Vec<_> = debian.difference(&ours).collect();
        let extra: Vec<_> = ours.difference(&debian).collect();
        assert!(missing.is_empty(), "not exported: {missing:?}");
        assert!(extra.is_empty(), "not in Debian's librdmacm: {extra:?}");
    }
}
