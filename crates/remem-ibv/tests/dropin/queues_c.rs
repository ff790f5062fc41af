//! C programs against Debian's `verbs.h`, linked against the drop-in and run on it: what an
//! unmodified program does, for the queue verbs' error paths and blocking behaviour
//! (`tests/c/queues.c`). Skipped (visibly) without a C compiler or verbs.h.

use crate::common;
use crate::support;

use common::DropIn;
use std::path::PathBuf;
use support::{dropin_command, have_timeout};

/// Compiles `tests/c/<name>.c` into the drop-in directory; `None` (skipped) when the
/// toolchain or the headers are missing.
fn compile(d: &DropIn, name: &str) -> Option<PathBuf> {
    common::compile_c(
        d,
        name,
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        &["-libverbs", "-lpthread"],
    )
}

#[test]
fn queue_error_paths_and_blocking_events() {
    if !have_timeout() {
        return;
    }
    let d = DropIn::new("queues-c");
    let Some(prog) = compile(&d, "queues") else {
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
        out.status.success() && text.contains("all passed"),
        "tests/c/queues.c failed ({:?}):\n{text}",
        out.status
    );
}
