//! C programs compiled against rdma-core's verbs.h and linked with the drop-in library:
//! the results and errno values of the device, query, PD and MR verbs (tests/c/*.c).

use crate::common;

use common::{DropIn, run, text};
use std::path::PathBuf;
use std::time::Duration;

/// Compiles `tests/c/<name>.c` against verbs.h, linked with the drop-in's
/// `libibverbs.so`; `None` after printing why the test skips.
fn compile(d: &DropIn, name: &str) -> Option<PathBuf> {
    common::compile_c(
        d,
        name,
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        &["-libverbs"],
    )
}

#[test]
fn device_query_pd_mr_verbs_and_their_errors() {
    let d = DropIn::new("c-core");
    let Some(exe) = compile(&d, "core") else {
        return;
    };
    let out = run(&mut d.command(&exe), Duration::from_secs(60));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{}\nstderr:\n{}",
        stdout,
        text(&out.stderr)
    );
    assert!(stdout.contains("0 failures"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}
