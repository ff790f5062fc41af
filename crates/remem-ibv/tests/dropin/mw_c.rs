//! Memory windows (type 1 and 2) through the drop-in's C ABI, as an unmodified program
//! uses them (`tests/c/mw.c`). Skipped (visibly) without a C compiler or verbs.h.

use crate::common;
use crate::support;

use common::DropIn;
use support::{dropin_command, have_timeout};

#[test]
fn memory_windows_bind_grant_invalidate_and_revoke() {
    if !have_timeout() {
        return;
    }
    let d = DropIn::new("mw-c");
    let Some(prog) = common::compile_c(
        &d,
        "mw",
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
        "tests/c/mw.c failed ({:?}):\n{text}",
        out.status
    );
}
