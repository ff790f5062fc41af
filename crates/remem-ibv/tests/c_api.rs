//! C programs compiled against rdma-core's verbs.h and linked with the drop-in library:
//! the results and errno values of the device, query, PD and MR verbs (tests/c/*.c).

mod common;

use common::{DropIn, run, text};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Compiles `tests/c/<name>.c` against verbs.h, linked with the drop-in's
/// `libibverbs.so`; `None` after printing why the test skips.
fn compile(d: &DropIn, name: &str) -> Option<PathBuf> {
    if !common::have_file(
        Path::new("/usr/include/infiniband/verbs.h"),
        "libibverbs-dev",
    ) {
        return None;
    }
    let cc = common::tool("cc", "gcc")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = d.dir.join(name);
    let out = Command::new(cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", d.dir.display()))
        .arg("-libverbs")
        .arg(format!("-Wl,-rpath,{}", d.dir.display()))
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc {}: {}",
        src.display(),
        text(&out.stderr)
    );
    Some(exe)
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
