//! The RoCEv2 memory placement extensions (ATOMIC WRITE, FLUSH) through the drop-in's
//! ex API, as an unmodified C program uses them (`tests/c/placement.c`), and librpma's
//! write, atomic write and flush on the drop-in, natively where that librpma was built
//! with native ATOMIC WRITE (`tests/c/rpma_native.c`). Skipped (visibly) without a C
//! compiler, verbs.h or librpma.

use crate::common;
use crate::support;

use common::DropIn;
use support::{dropin_command, have_timeout};

#[test]
fn atomic_write_and_flush_through_the_ex_api() {
    if !have_timeout() {
        return;
    }
    let d = DropIn::new("placement-c");
    let Some(prog) = common::compile_c(
        &d,
        "placement",
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        &["-libverbs"],
    ) else {
        return;
    };
    let _one = support::serial();
    let out = dropin_command(&d, &prog, &[]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("0 failures"),
        "tests/c/placement.c failed ({:?}):\n{text}",
        out.status
    );
}

#[test]
fn librpma_atomic_write_and_flush_native_where_built_with_it() {
    if !have_timeout() {
        return;
    }
    let d = DropIn::new("rpma-native");
    // librpma's own libibverbs/librdmacm come from LD_LIBRARY_PATH: the drop-in.
    let Some(prog) = common::compile_c(
        &d,
        "rpma_native",
        "/usr/include/librpma.h",
        "librpma-dev",
        &["-lrpma", "-libverbs", "-lrdmacm", "-lpthread"],
    ) else {
        return;
    };
    // A librpma built with native ATOMIC WRITE calls `ibv_qp_to_qp_ex` (Debian's 1.2.0,
    // built against rdma-core 44 without it, does not): it must then pick the native
    // path on the drop-in.
    let native = librpma_has_native_atomic_write();
    println!("librpma has the native atomic write: {native}");
    let _one = support::serial();
    let (ip, _) = support::cm_addrs();
    let port = support::free_port().to_string();
    let mode = if native { "native" } else { "fallback" };
    let out = dropin_command(&d, &prog, &[&ip.to_string(), &port, mode])
        .env("REMEM_IBV_DEVICES", format!("rxe0=soft@{ip}"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("0 failures"),
        "tests/c/rpma_native.c failed ({:?}):\n{text}",
        out.status
    );
}

/// Whether the installed librpma imports `ibv_qp_to_qp_ex` (what its native ATOMIC WRITE
/// path calls), read from the library file's bytes.
fn librpma_has_native_atomic_write() -> bool {
    let libs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ];
    libs.iter()
        .filter_map(|dir| std::fs::read(format!("{dir}/librpma.so.0")).ok())
        .any(|b| b.windows(16).any(|w| w == b"ibv_qp_to_qp_ex\0"))
}
