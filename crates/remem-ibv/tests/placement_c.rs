//! The RoCEv2 memory placement extensions (ATOMIC WRITE, FLUSH) through the drop-in's
//! ex API, as an unmodified C program uses them (`tests/c/placement.c`), and librpma
//! choosing its native ATOMIC WRITE on the drop-in (`tests/c/rpma_native.c`). Skipped
//! (visibly) without a C compiler, verbs.h or librpma.

mod common;
mod support;

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
