//! remem-ibv: a drop-in `libibverbs.so.1` backed by remem's userspace RoCEv2 NIC
//! (remem-soft), so that unmodified verbs programs (rdma-core's tools, perftest, UCX, MPI,
//! C/C++ applications, Rust crates over libibverbs) run without RDMA hardware and without
//! a kernel module.
//!
//! The crate builds `libremem_ibv.so` with soname `libibverbs.so.1`; a directory holding
//! a `libibverbs.so.1` symlink to it, put first on `LD_LIBRARY_PATH`, replaces rdma-core's
//! library for a program (`remem run -- prog`). The same file carries librdmacm's symbols
//! ([`rdmacm`]): a `librdmacm.so.1` symlink to it replaces rdma-core's librdmacm too.
//!
//! # Layers
//!
//! - [`abi`]: the `#[repr(C)]` structs, unions and constants of rdma-core 44's verbs.h,
//!   checked against the installed header by a layout test.
//! - the exported functions: each C symbol `ibv_x` is a Rust function
//!   `remem_ibv_ibv_x`, reached from `ibv_x@@IBVERBS_1.n` through a one-jump trampoline
//!   versioned by a `.symver` directive (`symver!`, next to the function);
//!   `libibverbs.map` declares the version nodes.
//!   [`symbols::exports`] lists them all.
//! - [`ffi`], the one unsafe boundary: the entry points (`ffi::queues`: channels, CQs,
//!   SRQs, QPs, posting, address handles; `ffi::device`: PDs, memory regions and windows, async
//!   events; `ffi::verbs`: the device list, contexts, queries, helpers; `ffi::private`: the
//!   provider-internal stubs; `ffi::rdmacm`: the `rdma_*` calls, `ffi::rsocket`, with
//!   `ffi::sockaddr`) convert the program's raw pointers
//!   once — [`ffi::handles::Handle`] for the library's objects, [`ffi::wr`] for
//!   work-request lists, [`ffi::opt_ref`]/[`ffi::out`]/[`ffi::slice()`] for the rest — and
//!   call safe code in the object modules. A unit test (`ffi::boundary`) fails when
//!   `unsafe` appears outside its allow-list, which is the modules of `ffi` (and the
//!   test-only modules that call the C entry points as a program does); every other
//!   module, `rdmacm::devices` and `rdmacm::qp` included, forbids it.
//! - the objects: every verbs object is a Rust struct whose FIRST field is the ABI struct
//!   the program sees (`ibv_pd`, `ibv_qp`, ...), boxed; the pointer handed out is cast
//!   back on each call ([`ffi::handles::Object`]). The Rust side holds the remem-verbs
//!   handles (`Arc<dyn ...>`).
//! - the backend: remem-verbs' provider-neutral traits, opened through remem-soft; the
//!   soft NIC's progress thread runs inside the program's process.
//!
//! # Conventions for the object modules (`channel`, `cq`, `cq_ex`, `qp`, `qp_ex`, `post`,
//! `srq`, `ah`, `pd`, `mw`, `event`)
//!
//! - Context: [`context::ctx_from`] turns a `*mut ibv_context` into `&Ctx`;
//!   [`context::Ctx::shared`] is the `Arc<CtxShared>` an object keeps (it holds the
//!   `Arc<dyn remem_verbs::Context>` in [`context::CtxShared::dev`]). `CtxShared::ibv_context`
//!   gives the `*mut ibv_context` to store in the object's ABI struct.
//! - PD: [`context::pd_from`] turns a `*mut ibv_pd` into `&Pd`; `Pd::inner.pd` is the
//!   `Arc<dyn ProtectionDomain>`, `Pd::inner.ctx` its context. An object made on a PD
//!   keeps the [`context::PdUse`] from [`context::PdInner::hold`] for its whole life:
//!   `ibv_dealloc_pd` fails with EBUSY while any exists (as rdma-core's kernel does).
//! - Async events: register each QP / CQ / SRQ in its context when created
//!   (`CtxShared::register_qp(qp_num, ptr)`, `register_cq(CqId, ptr)`,
//!   `register_srq(srq_num, ptr)`) and unregister it in destroy BEFORE freeing it
//!   (`unregister_*`): unregistering waits until the program has acked
//!   (`ibv_ack_async_event`) every event handed out for that object, as rdma-core's
//!   destroy verbs do. The registries also map a CQ id to its `*mut ibv_cq`
//!   (`CtxShared::cq_ptr`) for `ibv_get_cq_event`.
//! - GID indices: programs see the device's RoCE v2 GIDs only, from index 0
//!   ([`context::CtxShared::gid_table`]). A soft device's table is rxe's layout, all
//!   RoCE v2 (`remem_soft::netdev`): 0 the link-local default GID, 1 the bound IPv4
//!   address (`remem_verbs::first_roce_v2_ipv4` finds it), then the netdev's other IPv6
//!   addresses; so the map is the identity there, and drops the entries of other
//!   providers' types (`remem-ibverbs` over a NIC with RoCE v1 entries). Every
//!   `sgid_index` a program passes (QP address vectors, `ibv_create_ah`,
//!   `ibv_init_ah_from_wc`) must go through [`context::CtxShared::soft_gid_index`] before
//!   remem sees it (NULL/EINVAL past the table), and every one remem reports back
//!   (`ibv_query_qp`) through [`context::CtxShared::program_gid_index`].
//! - Errors: [`ffi::set_errno`], [`ffi::null_with`] (NULL + errno),
//!   [`ffi::errno_of`] (a `remem_verbs::Error`'s errno). Verbs that return an int return
//!   the errno value itself (rdma-core: `ibv_modify_qp` returns EINVAL), those that return
//!   a pointer return NULL with errno set. Never panic across the C ABI: bodies run
//!   inside [`ffi::guard`].
//! - Unsafe: the crate denies `unsafe_code`; the object modules say
//!   `#![forbid(unsafe_code)]` and take references and handles, never raw pointers to
//!   dereference. Only the modules of [`ffi`] allow it (`ffi::boundary` checks so),
//!   with a `// SAFETY:` note on every block.
//!
//! # What is reported as rxe reports it, and why
//!
//! Programs are written and tuned against kernel rxe (and NICs), so the drop-in reports
//! what rxe reports wherever a program can see it:
//!
//! - **GID table** ([`query`]): RoCE v2 entries only, index 0 the link-local default GID,
//!   index 1 the IPv4-mapped address, then other IPv6 addresses; `ndev_ifindex` the
//!   netdev's (lo: 1). Scripts hard-code index 1; UCX takes the first RoCE v2 IPv4 GID
//!   (`remem_verbs::first_roce_v2_ipv4`). A loopback device's link-local GID carries the
//!   last three bytes of its address (`127.0.0.1`: the host's device), so index 0 connects
//!   too.
//! - **Limits that match rxe** (`ibv_query_device`): `max_cqe` 32767 (rxe's
//!   `RXE_MAX_CQE`; CQ sizes are granted as rxe's `2^k - 1`, see [`cq`]), `max_qp_rd_atom`
//!   128, `max_sge` and `max_inline_data` rxe's; they match so that a program that fits
//!   on rxe fits here and one that does not fails here the same way (EINVAL at create),
//!   rather than working here and failing on the rxe it will meet. libfabric's verbs
//!   provider passes the CQ size it wants straight to `ibv_create_cq` (no clamp to
//!   `max_cqe`; a comment in `vrb_cq_open` says so), and `ofi_rxm` sizes its message CQ
//!   as (tx + rx queue size) × universe size (262,144 seen): past 32767 that fails on rxe
//!   as here, and the remedy is the same on both — a smaller `FI_UNIVERSE_SIZE` (or
//!   `FI_OFI_RXM_MSG_TX_SIZE`/`_RX_SIZE`).
//! - **QP capabilities**: the granted send side is rxe's (`max(max_send_sge * 16,
//!   max_inline_data)` bytes per WQE, all of it usable inline): `max_inline_data` asked
//!   as 0 with one SGE comes back 16 (`rdma_xclient` relies on it).
//! - **`cmd_fd`**: an open descriptor (uverbs where `remem run` provides it, else
//!   `/dev/null`), so programs can `fstat` or `dup` it.
//! - **UD receives**: the 40-byte GRH area holds twenty zero bytes then the IPv4 header
//!   for RoCEv2 over IPv4 (rxe's layout), and `wc.sl` is mlx5's RoCE packet type
//!   (`remem_soft`'s `WC_SL_ROCE_V2_IPV4`, 0xA: UDP, IPv4): RoCEv2 carries no SL, rxe
//!   reports 0 and mlx5 the packet type, and UCX's `ud_verbs` (1.13) reads that to find
//!   the destination GID in the GRH area — with 0 it drops every datagram (on rxe too).

#![warn(missing_docs)]

/// Exports Rust functions as versioned C symbols:
/// `symver!("ibv_fork_init" @ "IBVERBS_1.1")` makes `ibv_fork_init@@IBVERBS_1.1` (the
/// default version) a definition that jumps to the Rust function `remem_ibv_ibv_fork_init`.
///
/// A `.symver` directive must name a symbol defined in the same object file, and rustc
/// may place a function and a `global_asm!` in different codegen units (even in the same
/// module), so the directive cannot name the Rust function itself. Each symbol therefore
/// gets a one-instruction trampoline written in the same `global_asm!`
/// (`__remem_ibv_v_<name>: jmp remem_ibv_<name>`), which the directive versions; the jump
/// leaves the arguments and the return address untouched, whatever the signature.
macro_rules! symver {
    () => {
        /// The C symbols this module exports, with their versions (none).
        #[allow(dead_code)]
        pub(crate) const SYMBOLS: &[(&str, &str)] = &[];
    };
    ($($name:literal @ $ver:literal),+ $(,)?) => {
        #[cfg(not(test))]
        ::core::arch::global_asm!($(concat!(
            ".pushsection .text\n",
            ".globl __remem_ibv_v_", $name, "\n",
            ".type __remem_ibv_v_", $name, ", ", crate::trampoline_type!(), "\n",
            ".p2align 4\n",
            "__remem_ibv_v_", $name, ":\n",
            crate::trampoline_jump!(), " remem_ibv_", $name, "\n",
            ".size __remem_ibv_v_", $name, ", . - __remem_ibv_v_", $name, "\n",
            ".symver __remem_ibv_v_", $name, ", ", $name, "@@", $ver, "\n",
            ".popsection",
        )),*);
        /// The C symbols this module exports, with their versions.
        #[allow(dead_code)]
        pub(crate) const SYMBOLS: &[(&str, &str)] = &[$(($name, $ver)),*];
    };
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("remem-ibv builds libibverbs.so.1 for Linux on x86_64 and aarch64 only");

/// The tail-jump instruction of the symbol trampolines.
#[cfg(target_arch = "x86_64")]
#[doc(hidden)]
#[macro_export]
macro_rules! trampoline_jump {
    () => {
        "jmp"
    };
}
/// The tail-jump instruction of the symbol trampolines.
#[cfg(target_arch = "aarch64")]
#[doc(hidden)]
#[macro_export]
macro_rules! trampoline_jump {
    () => {
        "b"
    };
}
/// The ELF symbol type of the trampolines.
#[cfg(target_arch = "x86_64")]
#[doc(hidden)]
#[macro_export]
macro_rules! trampoline_type {
    () => {
        "@function"
    };
}
/// The ELF symbol type of variables defined in assembly.
#[cfg(target_arch = "x86_64")]
#[doc(hidden)]
#[macro_export]
macro_rules! object_type {
    () => {
        "@object"
    };
}
/// The ELF symbol type of variables defined in assembly.
#[cfg(target_arch = "aarch64")]
#[doc(hidden)]
#[macro_export]
macro_rules! object_type {
    () => {
        "%object"
    };
}
/// The ELF symbol type of the trampolines.
#[cfg(target_arch = "aarch64")]
#[doc(hidden)]
#[macro_export]
macro_rules! trampoline_type {
    () => {
        "%function"
    };
}

#[macro_use]
pub mod abi;
pub mod context;
pub mod device;
pub mod event;
pub mod ffi;
pub mod misc;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod query;
pub mod rdmacm;
pub mod stats;
pub mod symbols;

// The queue objects (helper B).
pub mod ah;
pub mod channel;
pub mod cq;
pub mod cq_ex;
pub mod post;
pub mod qp;
pub mod qp_ex;
pub mod srq;

/// The queue verbs through their C entry points, in process.
#[cfg(test)]
mod queues_tests;
