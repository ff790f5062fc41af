//! remem-ibv: a drop-in `libibverbs.so.1` backed by remem's userspace RoCEv2 NIC
//! (remem-soft), so that unmodified verbs programs (rdma-core's tools, perftest, UCX, MPI,
//! C/C++ applications, Rust crates over libibverbs) run without RDMA hardware and without
//! a kernel module.
//!
//! The crate builds `libremem_ibv.so` with soname `libibverbs.so.1`; a directory holding
//! a `libibverbs.so.1` symlink to it, put first on `LD_LIBRARY_PATH`, replaces rdma-core's
//! library for a program (`remem run -- prog`).
//!
//! # Layers
//!
//! - [`abi`]: the `#[repr(C)]` structs, unions and constants of rdma-core 44's verbs.h,
//!   checked against the installed header by a layout test.
//! - the exported functions: each C symbol `ibv_x` is a Rust function
//!   `remem_ibv_ibv_x` aliased to `ibv_x@@IBVERBS_1.n` by a `.symver` directive
//!   (`symver!`, next to the function: the alias must be assembled in the same
//!   codegen unit as its target); `libibverbs.map` declares the version nodes.
//!   [`symbols::exports`] lists them all.
//! - the objects: every verbs object is a Rust struct whose FIRST field is the ABI struct
//!   the program sees (`ibv_pd`, `ibv_qp`, ...), boxed; the pointer handed out is cast
//!   back on each call. The Rust side holds the remem-verbs handles (`Arc<dyn ...>`).
//! - the backend: remem-verbs' provider-neutral traits, opened through remem-soft; the
//!   soft NIC's progress thread runs inside the program's process.
//!
//! # Conventions for the object modules (`channel`, `cq`, `cq_ex`, `qp`, `qp_ex`, `post`,
//! `srq`, `ah`)
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
//! - Errors: [`ffi::set_errno`], [`ffi::null_with`] (NULL + errno),
//!   [`ffi::errno_of`] (a `remem_verbs::Error`'s errno). Verbs that return an int return
//!   the errno value itself (rdma-core: `ibv_modify_qp` returns EINVAL), those that return
//!   a pointer return NULL with errno set. Never panic across the C ABI: bodies run
//!   inside [`ffi::guard`].
//! - Unsafe: the crate denies `unsafe_code`; a module that dereferences program pointers
//!   says `#![allow(unsafe_code)]` and puts a `// SAFETY:` note on every block.

#![warn(missing_docs)]

/// Aliases exported Rust functions to versioned C symbols:
/// `symver!("ibv_fork_init" @ "IBVERBS_1.1")` makes `remem_ibv_ibv_fork_init` the default
/// (`@@`) definition of `ibv_fork_init` at version `IBVERBS_1.1`. Write it in the module
/// that defines the function (the alias must be in the same codegen unit).
macro_rules! symver {
    () => {
        /// The C symbols this module exports, with their versions (none).
        #[allow(dead_code)]
        pub(crate) const SYMBOLS: &[(&str, &str)] = &[];
    };
    ($($name:literal @ $ver:literal),+ $(,)?) => {
        #[cfg(not(test))]
        ::core::arch::global_asm!($(concat!(".symver remem_ibv_", $name, ", ", $name, "@@", $ver)),*);
        /// The C symbols this module exports, with their versions.
        #[allow(dead_code)]
        pub(crate) const SYMBOLS: &[(&str, &str)] = &[$(($name, $ver)),*];
    };
}

pub mod abi;
pub mod context;
pub mod device;
pub mod event;
pub mod ffi;
pub mod misc;
pub mod mr;
pub mod pd;
pub mod query;
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
