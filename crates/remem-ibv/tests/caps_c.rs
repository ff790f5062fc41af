//! C programs on the drop-in for what changes objects in place and the capabilities
//! reported as rxe reports them (`tests/c/caps.c`): `ctx->cmd_fd`, `max_inline_data`
//! rounding, `ibv_resize_cq`, `ibv_rereg_mr` (old keys revoked). Skipped (visibly) without
//! a C compiler or verbs.h.

mod common;

use common::{DropIn, run, text};
use std::time::Duration;

#[test]
fn cmd_fd_inline_caps_resize_cq_and_rereg_mr() {
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
