//! The layout test: every type and constant of `abi` against the installed
//! `<infiniband/verbs.h>`, measured by a C program compiled with `cc` at test time.

#![forbid(unsafe_code)]

use super::macros::TypeLayout;
use super::{CONSTS, TYPE_LAYOUTS};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// The C name of a Rust field: `r#priv` is `priv`, an anonymous member's `u_first` is
/// `first` (verbs.h has no member whose name starts with `u_`).
fn c_field(rust: &str) -> &str {
    let f = rust.trim_start_matches("r#");
    f.strip_prefix("u_").unwrap_or(f)
}

/// `(key, C expression, Rust value)` for every measurement of one type.
fn measurements(t: &TypeLayout) -> Vec<(String, String, i128)> {
    let ty = t.c_type;
    let mut out = Vec::new();
    match t.base {
        "" => {
            out.push((
                format!("{}:size", t.rust),
                format!("sizeof({ty})"),
                t.size as i128,
            ));
            out.push((
                format!("{}:align", t.rust),
                format!("_Alignof({ty})"),
                t.align as i128,
            ));
        }
        "*" => {}
        path => {
            let member = format!("((({ty} *)0)->{path})");
            out.push((
                format!("{}:size", t.rust),
                format!("sizeof{member}"),
                t.size as i128,
            ));
            out.push((
                format!("{}:align", t.rust),
                format!("_Alignof(__typeof__{member})"),
                t.align as i128,
            ));
        }
    }
    let anchor = match t.base {
        "" => None,
        "*" => Some(c_field(t.fields[0].0).to_string()),
        path => Some(path.to_string()),
    };
    for (f, off) in t.fields {
        let cf = c_field(f);
        let expr = match (&anchor, t.base) {
            (None, _) => format!("offsetof({ty}, {cf})"),
            (Some(a), "*") => format!("(offsetof({ty}, {cf}) - offsetof({ty}, {a}))"),
            (Some(a), _) => format!("(offsetof({ty}, {a}.{cf}) - offsetof({ty}, {a}))"),
        };
        out.push((format!("{}.{}", t.rust, f), expr, *off as i128));
    }
    out
}

fn c_compiler() -> Option<String> {
    ["cc", "gcc", "clang"]
        .into_iter()
        .map(String::from)
        .find(|cc| {
            Command::new(cc)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Reports a skip, or fails where `REMEM_REQUIRE_IBV_TOOLS` is set (CI installs the header).
fn skip(why: &str) {
    if std::env::var_os("REMEM_REQUIRE_IBV_TOOLS").is_some() {
        panic!("REMEM_REQUIRE_IBV_TOOLS is set, but: {why}");
    }
    eprintln!("skipped: {why}");
}

#[test]
fn every_type_and_constant_matches_verbs_h() {
    check_layouts(
        HEADER,
        "libibverbs-dev",
        &[
            "infiniband/verbs.h",
            "infiniband/sa.h",
            "rdma/ib_user_verbs.h",
            "rdma/ib_user_sa.h",
        ],
        TYPE_LAYOUTS,
        CONSTS,
    );
}

/// Measures `types` and `consts` with a C program that includes `includes` and compares
/// every size, alignment, offset and value with Rust's (skips visibly, or fails under
/// `REMEM_REQUIRE_IBV_TOOLS`, without a C compiler or `header`).
pub(crate) fn check_layouts(
    header: &str,
    package: &str,
    includes: &[&str],
    types: &[TypeLayout],
    consts: &[(&str, i128)],
) {
    let Some(cc) = c_compiler() else {
        skip(&format!(
            "no C compiler (cc, gcc, clang) to measure {header} with"
        ));
        return;
    };
    if !Path::new(header).exists() {
        skip(&format!(
            "{header} is not installed (Debian package {package})"
        ));
        return;
    }
    let mut expected = BTreeMap::new();
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n");
    for inc in includes {
        c.push_str(&format!("#include <{inc}>\n"));
    }
    c.push_str("int main(void) {\n");
    for t in types {
        for (key, expr, value) in measurements(t) {
            c.push_str(&format!(
                "  printf(\"%s %lld\\n\", \"{key}\", (long long)({expr}));\n"
            ));
            assert!(expected.insert(key.clone(), value).is_none(), "{key} twice");
        }
    }
    for (name, value) in consts {
        let key = format!("const {name}");
        c.push_str(&format!(
            "  printf(\"%s %lld\\n\", \"{key}\", (long long)({name}));\n"
        ));
        assert!(
            expected.insert(key.clone(), *value).is_none(),
            "{key} twice"
        );
    }
    c.push_str("  return 0;\n}\n");

    let tag = Path::new(header)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("header");
    let dir = std::env::temp_dir().join(format!("remem-ibv-layout-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, &c).unwrap();
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} failed on the generated layout program ({}):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let stdout = String::from_utf8(run.stdout).unwrap();
    let mut mismatches = Vec::new();
    let mut seen = 0;
    for line in stdout.lines() {
        let (key, value) = line.rsplit_once(' ').unwrap();
        let c_value: i128 = value.parse().unwrap();
        let mut rust = expected[key];
        // The C side prints through `long long`: a 64-bit unsigned constant above
        // i64::MAX arrives as its two's-complement negative.
        if rust > i128::from(i64::MAX) {
            rust -= 1i128 << 64;
        }
        seen += 1;
        if c_value != rust {
            mismatches.push(format!("{key}: C {c_value}, Rust {rust}"));
        }
    }
    assert_eq!(
        seen,
        expected.len(),
        "the C program printed every measurement"
    );
    assert!(
        mismatches.is_empty(),
        "ABI mismatches:\n{}",
        mismatches.join("\n")
    );
    std::fs::remove_dir_all(&dir).ok();
    eprintln!(
        "checked {} types, {} measurements against {header}",
        types.len(),
        expected.len()
    );
}

/// Every struct and union written in `abi` goes through `abi_types!` (so it is measured):
/// none is declared by hand.
#[test]
fn no_type_escapes_the_layout_test() {
    check_declared(include_str!("mod.rs"), TYPE_LAYOUTS);
}

/// Every `pub struct` / `pub union` declared in the source `src` has a layout record in
/// `types`, and no other.
pub(crate) fn check_declared(src: &str, types: &[TypeLayout]) {
    let declared: Vec<&str> = src
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.strip_prefix("pub struct ")
                .or_else(|| l.strip_prefix("pub union "))
                .and_then(|rest| rest.split([' ', '{']).next())
        })
        .filter(|name| !name.starts_with('$'))
        .collect();
    for name in &declared {
        assert!(
            types.iter().any(|t| t.rust == *name),
            "{name} is declared outside abi_types! and not measured"
        );
    }
    assert_eq!(declared.len(), types.len());
}
