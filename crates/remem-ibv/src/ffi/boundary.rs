//! Keeps the unsafe boundary where [`super`] says it is: a scan of the crate's sources.
//!
//! `unsafe` code (blocks, `unsafe fn`, `unsafe impl`, `unsafe trait`, `#[unsafe(..)]`
//! attributes, `allow(unsafe_code)`) may appear only in the modules of [`FFI`] (and the
//! test-only modules of [`TESTS`], which call the C entry points as a program does); every
//! other module says `#![forbid(unsafe_code)]` (`deny` where a child module is in the
//! FFI layer); every `unsafe` block and `unsafe impl` has
//! a `// SAFETY:` note just above it (outside the test-only modules). The lists are exact: a module that no longer needs
//! `unsafe` must leave them, so they only shrink.

use std::path::{Path, PathBuf};

/// The modules allowed `unsafe` code: the FFI layer (paths under `src/`).
const FFI: &[&str] = &[
    "ffi/mod.rs",
    "ffi/device.rs",
    "ffi/handles.rs",
    "ffi/private.rs",
    "ffi/queues.rs",
    "ffi/rdmacm.rs",
    "ffi/rsocket.rs",
    "ffi/sockaddr.rs",
    "ffi/sys.rs",
    "ffi/verbs.rs",
    "ffi/wr.rs",
];

/// Test-only modules that call the C entry points as a program does.
const TESTS: &[&str] = &["queues_tests.rs", "rdmacm/tests.rs"];

/// Every `.rs` file under `dir`, as paths relative to `root`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            sources(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p.strip_prefix(root).expect("under src").to_path_buf());
        }
    }
}

/// The code of a line: without a `//` comment (strings holding `//` do not occur before
/// an `unsafe` in this crate).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// Whether a line of code is `unsafe` code (not an `unsafe extern "C" fn(..)` pointer
/// type, which is a type, not code that is unsafe).
fn is_unsafe_code(c: &str) -> bool {
    let words: Vec<&str> = c
        .split(|ch: char| !(ch.is_alphanumeric() || ch == '_' || ch == '{' || ch == '"'))
        .filter(|w| !w.is_empty())
        .collect();
    let after_unsafe = words
        .windows(2)
        .any(|w| w[0] == "unsafe" && matches!(w[1], "{" | "fn" | "impl" | "trait"));
    let unsafe_block = c.contains("unsafe {") || c.trim_end().ends_with("unsafe");
    let entry = c.contains("unsafe extern \"C\" fn ") && !c.contains("unsafe extern \"C\" fn(");
    after_unsafe
        || unsafe_block
        || entry
        || c.contains("#[unsafe(")
        || c.contains("allow(unsafe_code)")
}

struct Scan {
    /// Files (relative to `src/`) with `unsafe` code.
    with_unsafe: Vec<String>,
    /// `unsafe` blocks and impls without a `// SAFETY:` note: `file:line`.
    undocumented: Vec<String>,
    /// Files outside the allow-lists that neither forbid nor deny `unsafe_code`.
    not_forbidding: Vec<String>,
}

fn scan() -> Scan {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    files.sort();
    let mut s = Scan {
        with_unsafe: Vec::new(),
        undocumented: Vec::new(),
        not_forbidding: Vec::new(),
    };
    for f in files {
        let name = f.to_string_lossy().replace('\\', "/");
        if name == "ffi/boundary.rs" {
            // This scanner: its test strings spell what it looks for.
            continue;
        }
        let text = std::fs::read_to_string(root.join(&f)).expect("a source file");
        let lines: Vec<&str> = text.lines().collect();
        let mut any = false;
        for (i, l) in lines.iter().enumerate() {
            let c = code(l);
            if !is_unsafe_code(c) {
                continue;
            }
            any = true;
            // Test modules call the entry points as a C program does (clippy's
            // `undocumented_unsafe_blocks` is allowed there).
            if !TESTS.contains(&name.as_str())
                && (c.contains("unsafe {")
                    || c.contains("unsafe impl")
                    || c.trim_end().ends_with("unsafe"))
            {
                let documented = lines[i.saturating_sub(8)..=i]
                    .iter()
                    .any(|l| l.contains("SAFETY:"));
                if !documented {
                    s.undocumented.push(format!("{name}:{}", i + 1));
                }
            }
        }
        if any {
            s.with_unsafe.push(name.clone());
        }
        let listed = FFI.contains(&name.as_str()) || TESTS.contains(&name.as_str());
        let says =
            text.contains("#![forbid(unsafe_code)]") || text.contains("#![deny(unsafe_code)]");
        if !listed && name != "lib.rs" && !says {
            s.not_forbidding.push(name);
        }
    }
    s
}

#[test]
fn unsafe_code_only_in_the_ffi_layer() {
    let s = scan();
    let outside: Vec<_> = s
        .with_unsafe
        .iter()
        .filter(|f| !FFI.contains(&f.as_str()) && !TESTS.contains(&f.as_str()))
        .collect();
    assert!(
        outside.is_empty(),
        "unsafe code outside the FFI layer (crate::ffi): {outside:?}"
    );
    // The allow-list is exact: a module that needs no `unsafe` any more leaves it.
    let stale: Vec<_> = FFI
        .iter()
        .chain(TESTS)
        .filter(|f| !s.with_unsafe.iter().any(|w| w == *f))
        .collect();
    assert!(
        stale.is_empty(),
        "listed but without unsafe code: {stale:?}"
    );
}

#[test]
fn safe_modules_forbid_unsafe_code() {
    let s = scan();
    assert!(
        s.not_forbidding.is_empty(),
        "modules outside the FFI layer that do not forbid unsafe_code: {:?}",
        s.not_forbidding
    );
}

#[test]
fn every_unsafe_block_says_why() {
    let s = scan();
    assert!(
        s.undocumented.is_empty(),
        "unsafe without a // SAFETY: note: {:?}",
        s.undocumented
    );
}

#[test]
fn the_scan_sees_unsafe_code() {
    assert!(is_unsafe_code("    unsafe { p.as_ref() }"));
    assert!(is_unsafe_code("pub unsafe fn qp_from<'a>(qp: *mut ibv_qp)"));
    assert!(is_unsafe_code("unsafe impl Send for EpAttr {}"));
    assert!(is_unsafe_code("#[unsafe(no_mangle)]"));
    assert!(is_unsafe_code(
        "pub unsafe extern \"C\" fn remem_ibv_x(a: i32) -> i32 {"
    ));
    assert!(is_unsafe_code("#![allow(unsafe_code)]"));
    assert!(is_unsafe_code("    let x = unsafe"));
    assert!(!is_unsafe_code(
        "pub post_send: Option<unsafe extern \"C\" fn(qp: *mut ibv_qp) -> c_int>,"
    ));
    assert!(!is_unsafe_code("#![forbid(unsafe_code)]"));
    assert!(!is_unsafe_code(code(
        "x(); // an unsafe { block } in a comment"
    )));
}
