//! C programs against Debian's `verbs.h`, linked against the system libibverbs and run on
//! the drop-in (`LD_LIBRARY_PATH`): what an unmodified program does, for the queue verbs'
//! error paths and blocking behaviour (`tests/c/queues.c`). Skipped (visibly) without a C
//! compiler, verbs.h or the system libibverbs to link against.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::{dropin_command, have_timeout, tool};

/// Compiles `tests/c/<name>.c` into the test's temporary directory; `None` (skipped) when
/// the toolchain or the headers are missing.
fn compile(name: &str) -> Option<PathBuf> {
    let cc = tool("cc")?;
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!("skipped: /usr/include/infiniband/verbs.h is missing (libibverbs-dev)");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out = support::dropin_dir().join(name);
    let r = Command::new(cc)
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-libverbs", "-lpthread"])
        .output()
        .unwrap();
    if !r.status.success() {
        let err = String::from_utf8_lossy(&r.stderr);
        if err.contains("cannot find -libverbs") {
            println!("skipped: no libibverbs to link against (libibverbs-dev)");
            return None;
        }
        panic!("cc {}: {err}", src.display());
    }
    Some(out)
}

#[test]
fn queue_error_paths_and_blocking_events() {
    if !have_timeout() {
        return;
    }
    let Some(prog) = compile("queues") else {
        return;
    };
    let _one = support::serial();
    let out = dropin_command(&prog, &[]).output().unwrap();
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
