//! `remem run` as a user runs it: the drop-in directory, the environment the program sees,
//! its exit status, and the errors. The drop-in library is a stand-in file here (these tests
//! check how it is found and linked, not what it does); the programs are `sh -c …`.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory holding a stand-in `libremem_ibv.so`; returns it (canonical) and the
/// library's path.
fn lab(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("remem-cli-run-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let dir = fs::canonicalize(dir).unwrap();
    let lib = dir.join("libremem_ibv.so");
    fs::write(&lib, b"a stand-in").unwrap();
    (dir, lib)
}

/// `remem` (the binary at `exe`) with `args`, the library named by `REMEM_IBV_LIB` (unset
/// for `None`) and a known `LD_LIBRARY_PATH`.
fn remem_at(exe: &Path, lib: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", "/opt/before")
        .env_remove("XDG_RUNTIME_DIR");
    match lib {
        Some(lib) => cmd.env("REMEM_IBV_LIB", lib),
        None => cmd.env_remove("REMEM_IBV_LIB"),
    };
    cmd.output().expect("run remem")
}

fn remem(lib: Option<&Path>, args: &[&str]) -> Output {
    remem_at(Path::new(env!("CARGO_BIN_EXE_remem")), lib, args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SHOW: &str = r#"echo "$LD_LIBRARY_PATH"; readlink "${LD_LIBRARY_PATH%%:*}/libibverbs.so.1""#;
const SHOW_CM: &str = r#"readlink "${LD_LIBRARY_PATH%%:*}/librdmacm.so.1""#;

#[test]
fn the_program_sees_the_drop_in_first_on_its_library_path() {
    let (dir, lib) = lab("env");
    let out = remem(Some(&lib), &["run", "--", "sh", "-c", SHOW]);
    assert!(out.status.success(), "{}", stderr(&out));
    let drop_in = dir.join("remem-ibv");
    assert_eq!(
        stdout(&out),
        format!("{}:/opt/before\n{}\n", drop_in.display(), lib.display())
    );
    // librdmacm.so.1 is the same library.
    let out = remem(Some(&lib), &["run", "--", "sh", "-c", SHOW_CM]);
    assert_eq!(stdout(&out), format!("{}\n", lib.display()));
    // Without `--` too, and with the program's own flags left to it.
    let out = remem(Some(&lib), &["run", "sh", "-c", SHOW]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with(&format!("{}:/opt/before\n", drop_in.display())));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn exit_status_and_signals_are_the_programs() {
    let (dir, lib) = lab("status");
    let out = remem(Some(&lib), &["run", "--", "sh", "-c", "exit 42"]);
    assert_eq!(out.status.code(), Some(42));
    let out = remem(Some(&lib), &["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.signal(), Some(15), "{:?}", out.status);
    // A program that is not there: 127, as env(1) and shells say.
    let out = remem(Some(&lib), &["run", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("/no/such/program"),
        "{}",
        stderr(&out)
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn lib_dir_prints_the_drop_in_directory_and_is_idempotent() {
    let (dir, lib) = lab("libdir");
    let drop_in = dir.join("remem-ibv");
    let link = drop_in.join("libibverbs.so.1");
    let out = remem(Some(&lib), &["run", "--lib-dir"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{}\n", drop_in.display()));
    assert_eq!(fs::read_link(&link).unwrap(), lib);
    // Again, with the link already there.
    let out = remem(Some(&lib), &["run", "--lib-dir"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{}\n", drop_in.display()));
    assert_eq!(fs::read_link(&link).unwrap(), lib);
    // A stale link (another build's library) is replaced.
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("/elsewhere/libremem_ibv.so", &link).unwrap();
    let out = remem(Some(&lib), &["run", "--", "sh", "-c", SHOW]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).ends_with(&format!("\n{}\n", lib.display())));
    assert_eq!(fs::read_link(&link).unwrap(), lib);
    // The same library is the drop-in librdmacm.
    assert_eq!(fs::read_link(drop_in.join("librdmacm.so.1")).unwrap(), lib);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_unusable_directory_beside_the_library_falls_back_to_the_runtime_dir() {
    let (dir, lib) = lab("fallback");
    // `remem-ibv` beside the library is taken by a file.
    fs::write(dir.join("remem-ibv"), b"").unwrap();
    let xdg = dir.join("xdg");
    fs::create_dir(&xdg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["run", "--lib-dir"])
        .env("REMEM_IBV_LIB", &lib)
        .env("XDG_RUNTIME_DIR", &xdg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let drop_in = xdg.join("remem-ibv");
    assert_eq!(stdout(&out), format!("{}\n", drop_in.display()));
    assert_eq!(fs::read_link(drop_in.join("libibverbs.so.1")).unwrap(), lib);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let out = remem(
        Some(Path::new("/no/such/libremem_ibv.so")),
        &["run", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert!(
        err.contains("REMEM_IBV_LIB=/no/such/libremem_ibv.so"),
        "{err}"
    );
    assert!(err.contains("cargo build --release -p remem-ibv"), "{err}");

    // Unset: looked for beside the executable, then in ../lib. A link to the binary in a
    // directory of its own stands for an installed remem.
    let root = std::env::temp_dir().join(format!("remem-cli-run-exe-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let bin = root.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let root = fs::canonicalize(root).unwrap();
    let bin = root.join("bin");
    let exe = bin.join("remem");
    if fs::hard_link(env!("CARGO_BIN_EXE_remem"), &exe).is_err() {
        fs::copy(env!("CARGO_BIN_EXE_remem"), &exe).unwrap();
    }
    let out = remem_at(&exe, None, &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    for looked in [
        "$REMEM_IBV_LIB (not set)".to_string(),
        bin.join("libremem_ibv.so").display().to_string(),
        bin.join("../lib/libremem_ibv.so").display().to_string(),
    ] {
        assert!(err.contains(&looked), "{looked} not in: {err}");
    }
    // Found in <exe dir>/../lib.
    fs::create_dir(root.join("lib")).unwrap();
    fs::write(root.join("lib/libremem_ibv.so"), b"").unwrap();
    let out = remem_at(&exe, None, &["run", "--lib-dir"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{}\n", root.join("lib/remem-ibv").display())
    );
    fs::remove_dir_all(root).unwrap();
}

#[test]
fn usage_errors() {
    let (dir, lib) = lab("usage");
    let out = remem(Some(&lib), &["run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("PROGRAM"), "{}", stderr(&out));
    let out = remem(Some(&lib), &["run", "--lib-dir", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
    let out = remem(None, &["run", "--help"]);
    assert!(out.status.success());
    assert!(stdout(&out).contains("--lib-dir"));
    assert!(stdout(&out).contains("cargo build --release -p remem-ibv"));
    fs::remove_dir_all(dir).unwrap();
}

/// The `=> path` that `ldd` reports for `libibverbs.so.1` in `out`.
fn ibverbs_in_ldd(out: &Output) -> Option<PathBuf> {
    stdout(out)
        .lines()
        .find_map(|l| l.trim().strip_prefix("libibverbs.so.1 => "))
        .and_then(|rest| rest.split(" (").next())
        .map(PathBuf::from)
}

#[test]
fn the_dynamic_loader_takes_libibverbs_from_the_drop_in() {
    // An unmodified Debian binary linked against libibverbs (ibverbs-utils), traced by ldd:
    // the real libibverbs stands in for the drop-in library.
    let Some(tool) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("ibv_devices"))
            .find(|t| t.is_file())
    }) else {
        eprintln!("skipped: ibv_devices (Debian ibverbs-utils) is not installed");
        return;
    };
    let plain = match Command::new("ldd").arg(&tool).output() {
        Ok(o) if o.status.success() => o,
        _ => {
            eprintln!("skipped: ldd cannot trace {}", tool.display());
            return;
        }
    };
    let Some(system) = ibverbs_in_ldd(&plain) else {
        eprintln!("skipped: {} does not load libibverbs.so.1", tool.display());
        return;
    };
    let (dir, lib) = lab("loader");
    fs::copy(&system, &lib).unwrap();
    let out = remem(Some(&lib), &["run", "--", "ldd", tool.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        ibverbs_in_ldd(&out),
        Some(dir.join("remem-ibv/libibverbs.so.1")),
        "{}",
        stdout(&out)
    );
    fs::remove_dir_all(dir).unwrap();
}
