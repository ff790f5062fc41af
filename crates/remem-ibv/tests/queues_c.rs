//! C programs against Debian's `verbs.h`, linked against the drop-in and run on it: what an
//! unmodified program does, for the queue verbs' error paths and blocking behaviour
//! (`tests/c/queues.c`). Skipped (visibly) without a C compiler or verbs.h.

mod common;
mod support;

use common::{DropIn, tool};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{dropin_command, have_timeout};

/// Compiles `tests/c/<name>.c` into the drop-in directory; `None` (skipped) when the
/// toolchain or the headers are missing.
fn compile(d: &DropIn, name: &str) -> Option<PathBuf> {
    let cc = tool("cc", "gcc")?;
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        common::skip("/usr/include/infiniband/verbs.h is missing (libibverbs-dev)");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out = d.dir.join(name);
    let r = Command::new(cc)
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-L")
        .arg(&d.dir)
        .args(["-libverbs", "-lpthread"])
        .output()
        .unwrap();
    if !r.status.success() {
        let err = String::from_utf8_lossy(&r.stderr);
        panic!("cc {}: {err}", src.display());
    }
    Some(out)
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
