//! Checks that what rdma-core's bindings need to build is there, before they are built.
//!
//! `rdma-mummy-sys` (the bindings under `sideway`) builds a C shim of rdma-core with cmake
//! (through make, cmake's default generator) and reads its headers with bindgen, which
//! loads libclang. Without them its build script panics deep in a dependency; this one
//! stops with one message naming what to install and how to leave the crate out. Cargo
//! may run that dependency's build script first: then, for cmake, `.cargo/cmake` (the
//! workspace's `CMAKE`) says the same.
//! It honours what those build scripts honour: `CMAKE` (and `CMAKE_<target>`, `HOST_CMAKE`)
//! for the cmake binary, `CMAKE_GENERATOR` (another generator needs no make) and
//! `LIBCLANG_PATH` (where libclang is looked for; found as bindgen finds it, by clang-sys).

use std::ffi::OsString;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let cmake_vars = [
        format!("CMAKE_{target}"),
        format!("CMAKE_{}", target.replace('-', "_")),
        "HOST_CMAKE".to_string(),
        "CMAKE".to_string(),
    ];
    for var in cmake_vars.iter().map(String::as_str) {
        println!("cargo::rerun-if-env-changed={var}");
    }
    for var in ["CMAKE_GENERATOR", "LIBCLANG_PATH"] {
        println!("cargo::rerun-if-env-changed={var}");
    }

    let mut missing: Vec<Missing> = Vec::new();
    let cmake = cmake_vars
        .iter()
        .find_map(std::env::var_os)
        .unwrap_or_else(|| OsString::from("cmake"));
    if let Err(why) = runs(&cmake) {
        missing.push(Missing {
            what: "cmake",
            debian: "cmake",
            fedora: "cmake",
            why,
        });
    }
    if std::env::var_os("CMAKE_GENERATOR").is_none()
        && let Err(why) = runs(&OsString::from("make"))
    {
        missing.push(Missing {
            what: "make (cmake's default generator)",
            debian: "make",
            fedora: "make",
            why,
        });
    }
    if let Err(why) = clang_sys::load() {
        missing.push(Missing {
            what: "libclang (bindgen reads rdma-core's headers with it)",
            debian: "libclang-dev",
            fedora: "clang-devel",
            why,
        });
    }
    if !missing.is_empty() {
        eprintln!("{}", message(&missing));
        std::process::exit(1);
    }
}

/// A tool the bindings need that is not there, the packages that have it, and why it
/// is taken for absent.
struct Missing {
    what: &'static str,
    debian: &'static str,
    fedora: &'static str,
    why: String,
}

/// Whether `program --version` runs and succeeds.
fn runs(program: &OsString) -> Result<(), String> {
    let shown = program.to_string_lossy();
    match Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("`{shown} --version` failed ({status})")),
        Err(e) => Err(format!("`{shown}`: {e}")),
    }
}

/// What the build says when something is missing: what, why, what to install, and how
/// to build the workspace without this crate.
fn message(missing: &[Missing]) -> String {
    let list =
        |f: fn(&Missing) -> &'static str| missing.iter().map(f).collect::<Vec<_>>().join(" ");
    let mut text = String::from(
        "error: remem-ibverbs (the rdma-core provider) cannot be built on this machine: \
         its bindings (rdma-mummy-sys) build rdma-core's C shim with cmake and read its \
         headers with libclang.\n",
    );
    for m in missing {
        text.push_str(&format!("  missing: {} — {}\n", m.what, m.why));
    }
    text.push_str(&format!(
        "Install them:  apt-get install {}   (Debian, Ubuntu; Fedora: dnf install {})\n",
        list(|m| m.debian),
        list(|m| m.fedora),
    ));
    text.push_str(
        "Or leave the crate out: `cargo build` and `cargo test` at the workspace root do (it \
         is not a default member); with `--workspace` add `--exclude remem-ibverbs`; the \
         features `remem/ibverbs` and `remem-cli/ibverbs` need it.",
    );
    text
}
