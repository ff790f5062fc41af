//! The built library resolves, at the right versions, every libibverbs symbol the Debian
//! tools of the issue need (`objdump -T`) — their own references and those of the
//! libraries they load (perftest links libmlx5 and libefa, which reference rdma-core's
//! provider-internal `IBVERBS_PRIVATE_34` symbols, and starts with `-z now`: a missing one
//! and it does not start) — and carries the soname `libibverbs.so.1`. The same file is the
//! drop-in librdmacm: every `RDMACM` reference of rdmacm-utils and perftest resolves too.

use crate::common;

use std::collections::BTreeSet;
use std::process::Command;

/// The programs the issue runs on the drop-in (ibverbs-utils, perftest).
const TOOLS: &[(&str, &str)] = &[
    ("ibv_devices", "ibverbs-utils"),
    ("ibv_devinfo", "ibverbs-utils"),
    ("ibv_rc_pingpong", "ibverbs-utils"),
    ("ibv_uc_pingpong", "ibverbs-utils"),
    ("ibv_ud_pingpong", "ibverbs-utils"),
    ("ibv_srq_pingpong", "ibverbs-utils"),
    ("ibv_xsrq_pingpong", "ibverbs-utils"),
    ("ibv_asyncwatch", "ibverbs-utils"),
    ("ib_write_bw", "perftest"),
    ("ib_read_bw", "perftest"),
    ("ib_send_bw", "perftest"),
    ("ib_atomic_bw", "perftest"),
    ("ib_write_lat", "perftest"),
    ("ib_read_lat", "perftest"),
    ("ib_send_lat", "perftest"),
    ("ib_atomic_lat", "perftest"),
    ("rping", "rdmacm-utils"),
    ("rdma_server", "rdmacm-utils"),
    ("rdma_client", "rdmacm-utils"),
    ("rdma_xserver", "rdmacm-utils"),
    ("rdma_xclient", "rdmacm-utils"),
    ("ucmatose", "rdmacm-utils"),
    ("udaddy", "rdmacm-utils"),
    ("mckey", "rdmacm-utils"),
    ("cmtime", "rdmacm-utils"),
    ("rstream", "rdmacm-utils"),
    ("riostream", "rdmacm-utils"),
    ("rcopy", "rdmacm-utils"),
    ("udpong", "rdmacm-utils"),
];

fn objdump(path: &std::path::Path) -> Option<String> {
    let out = Command::new("objdump").arg("-T").arg(path).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `(name, version)` of the symbols in `objdump -T` output, undefined (`UND`) ones or
/// defined ones, with a version starting `prefix` (`IBVERBS`, `RDMACM`).
fn versioned(dump: &str, prefix: &str, undefined: bool) -> BTreeSet<(String, String)> {
    dump.lines()
        .filter(|l| l.contains(prefix) && l.contains("*UND*") == undefined)
        .filter_map(|l| {
            let mut w = l.split_whitespace().rev();
            let name = w.next()?;
            let ver = w.next()?.trim_matches(['(', ')']);
            Some((name.to_string(), ver.to_string()))
        })
        .filter(|(_, v)| v.starts_with(prefix))
        .collect()
}

/// The `IBVERBS` symbols of an `objdump -T` output.
fn ibverbs_symbols(dump: &str, undefined: bool) -> BTreeSet<(String, String)> {
    versioned(dump, "IBVERBS", undefined)
}

/// The shared libraries `path` loads (`ldd`), but libibverbs and librdmacm themselves.
fn libraries(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(out) = Command::new("ldd").arg(path).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split("=>")
                .nth(1)?
                .split_whitespace()
                .next()
                .map(Into::into)
        })
        .filter(|p: &std::path::PathBuf| {
            let s = p.to_string_lossy();
            !s.contains("libibverbs.so") && !s.contains("librdmacm.so") && p.is_file()
        })
        .collect()
}

#[test]
fn every_tool_resolves_every_libibverbs_and_librdmacm_symbol() {
    let lib = common::library();
    let Some(dump) = objdump(&lib) else {
        common::skip("objdump not found (Debian package binutils)");
        return;
    };
    let defined: BTreeSet<_> = ibverbs_symbols(&dump, false)
        .union(&versioned(&dump, "RDMACM", false))
        .cloned()
        .collect();
    assert!(
        defined.len() >= 76,
        "{} versioned definitions",
        defined.len()
    );
    let mut checked = 0;
    for (name, package) in TOOLS {
        let Some(path) = common::tool(name, package) else {
            continue;
        };
        let mut objects = vec![path.clone()];
        objects.extend(libraries(&path));
        for object in objects {
            let dump = objdump(&object).unwrap();
            let needed: BTreeSet<_> = ibverbs_symbols(&dump, true)
                .union(&versioned(&dump, "RDMACM", true))
                .cloned()
                .collect();
            let missing: Vec<_> = needed.difference(&defined).collect();
            assert!(
                missing.is_empty(),
                "{name}: {} needs {missing:?}",
                object.display()
            );
            checked += needed.len();
        }
    }
    eprintln!("{checked} symbol references resolved");
}

#[test]
fn soname_is_libibverbs_so_1() {
    let lib = common::library();
    let Ok(out) = Command::new("objdump").arg("-p").arg(&lib).output() else {
        common::skip("objdump not found (Debian package binutils)");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let soname = text
        .lines()
        .find(|l| l.trim_start().starts_with("SONAME"))
        .expect("a SONAME");
    assert!(soname.trim_end().ends_with("libibverbs.so.1"), "{soname}");
    // It needs no rdma-core library itself.
    assert!(!text.contains("NEEDED               libibverbs"), "{text}");
}
