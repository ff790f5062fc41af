//! A C program on the drop-in for what changes objects in place, the capabilities
//! reported as rxe reports them, and what a UD receive carries (`tests/c/caps.c`):
//! `ctx->cmd_fd`, `max_inline_data` rounding, `ibv_resize_cq`, `ibv_rereg_mr` (old keys
//! revoked: remote access error), the GRH area and `wc.sl` of a UD receive over IPv4.
//! Skipped (visibly) without a C compiler or verbs.h.

use crate::common;

use common::{DropIn, run, text};
use std::time::Duration;

#[test]
fn cmd_fd_inline_caps_resize_cq_rereg_mr_and_ud_receives() {
    let d = DropIn::new("c-caps");
    let Some(exe) = common::compile_c(
        &d,
        "caps",
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        &["-libverbs"],
    ) else {
        return;
    };
    let out = run(&mut d.command(&exe), Duration::from_secs(120));
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
