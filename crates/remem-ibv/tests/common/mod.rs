//! Helpers of the integration tests: the drop-in directory, tools, bounded runs.
//!
//! The tests run programs on the freshly built `libremem_ibv.so` through a directory
//! holding a `libibverbs.so.1` symlink to it, put on `LD_LIBRARY_PATH`. They never link
//! the library into the test executable (its versioned symbols need the cdylib's link).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The built `libremem_ibv.so`: next to the test executable (`target/<profile>/deps`,
/// where `cargo test` builds it), else in `target/<profile>`.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let lib = dir.join("libremem_ibv.so");
        if lib.exists() {
            return lib;
        }
    }
    panic!("libremem_ibv.so not found next to {}", exe.display());
}

/// A fresh drop-in directory for one test: `libibverbs.so.1` and `librdmacm.so.1` (and
/// `libibverbs.so`, `librdmacm.so`, for linking C programs) pointing at the built library.
/// Removed when dropped.
pub struct DropIn {
    pub dir: PathBuf,
}

impl DropIn {
    pub fn new(test: &str) -> DropIn {
        let dir = std::env::temp_dir().join(format!("remem-ibv-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let lib = library();
        // One file is both libraries (see remem_ibv::rdmacm).
        for name in [
            "libibverbs.so.1",
            "libibverbs.so",
            "librdmacm.so.1",
            "librdmacm.so",
        ] {
            std::os::unix::fs::symlink(&lib, dir.join(name)).unwrap();
        }
        DropIn { dir }
    }

    /// A command for `program` with the drop-in first on `LD_LIBRARY_PATH` and the device
    /// configuration of the environment removed.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("LD_LIBRARY_PATH", &self.dir)
            .env_remove("REMEM_IBV_DEVICES")
            .stdin(Stdio::null());
        cmd
    }
}

impl Drop for DropIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reports that a test skips for lack of `why` — or, where `REMEM_REQUIRE_IBV_TOOLS` is set
/// (CI, which installs the Debian tools), fails it: there a skip would hide a lane.
pub fn skip(why: &str) {
    if std::env::var_os("REMEM_REQUIRE_IBV_TOOLS").is_some() {
        panic!("REMEM_REQUIRE_IBV_TOOLS is set, but: {why}");
    }
    eprintln!("skipped: {why}");
}

/// The path of a tool on `PATH`, or `None` after printing why the test skips.
pub fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        skip(&format!("{name} not found (Debian package {package})"));
    }
    found
}

/// Runs `cmd` to completion within `limit` (killed after, and the test fails), with its
/// output.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    run_pid(cmd, limit).1
}

/// [`run`], also giving the child's pid.
pub fn run_pid(cmd: &mut Command, limit: Duration) -> (u32, Output) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (pid, out.expect("wait")),
        Err(_) => {
            kill_child(pid);
            let out = rx.recv().expect("output").expect("wait");
            panic!(
                "{cmd:?} ran past {limit:?}; stdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
    }
}

/// Kills a child that ran too long (its pid is still ours: it has not been waited for).
fn kill_child(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// The loopback address the library picks for a process with `pid` (first attempt): the
/// formula of `remem_ibv::device::loopback_candidate`, restated.
pub fn loopback_for_pid(pid: u32) -> std::net::Ipv4Addr {
    const SLOTS: u64 = 256 * 256 * 254;
    let mut n = u64::from(pid);
    loop {
        let idx = n % SLOTS;
        let (a, b, c) = (idx / (256 * 254), (idx / 254) % 256, idx % 254 + 1);
        if (a, b, c) != (0, 0, 1) {
            return std::net::Ipv4Addr::new(127, a as u8, b as u8, c as u8);
        }
        n += 1;
    }
}

/// Text of an output stream.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether `path` exists, else prints why the test skips.
pub fn have_file(path: &Path, package: &str) -> bool {
    let ok = path.exists();
    if !ok {
        skip(&format!(
            "{} missing (Debian package {package})",
            path.display()
        ));
    }
    ok
}

/// Compiles `tests/c/<name>.c` (gnu11, `-Wall -Werror`, the headers beside it) into the
/// drop-in directory `d`, linked with `libs` from there (`-libverbs`, `-lrdmacm`: the
/// drop-in) and run-path'd to it. `None`, after saying why the test skips, without a C
/// compiler or without `header` (from Debian's `package`).
pub fn compile_c(
    d: &DropIn,
    name: &str,
    header: &str,
    package: &str,
    libs: &[&str],
) -> Option<PathBuf> {
    if !have_file(Path::new(header), package) {
        return None;
    }
    let cc = tool("cc", "gcc")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = d.dir.join(name);
    let out = Command::new(cc)
        .args(["-std=gnu11", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", d.dir.display()))
        .args(libs)
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
