//! Tells the kernel-capture test (`tests/wire/rxe_vectors.rs`) whether the captures are there, so
//! that without them the test is reported as *ignored* with the reason in `cargo test`'s
//! summary instead of passing silently (the harness swallows a passing test's output).

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(rxe_vectors_missing)");
    println!("cargo::rerun-if-env-changed=REMEM_VECTORS_DIR");
    let dir = match std::env::var_os("REMEM_VECTORS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
            .join("../../../shared/vectors/rxe"),
    };
    // A path that does not exist makes Cargo run this script again on every build, so the
    // captures are noticed as soon as they appear; one that exists is watched for changes.
    println!("cargo::rerun-if-changed={}", dir.display());
    if !dir.is_dir() {
        println!("cargo::rustc-cfg=rxe_vectors_missing");
    }
}
