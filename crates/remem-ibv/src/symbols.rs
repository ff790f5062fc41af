//! The list of every exported C symbol and its version (each module declares its own
//! with `symver!`, next to the functions).

#![forbid(unsafe_code)]

/// Every exported C symbol with its default version, as `(name, version)`.
pub fn exports() -> Vec<(&'static str, &'static str)> {
    [
        crate::ffi::device::SYMBOLS,
        crate::ffi::verbs::SYMBOLS,
        crate::ffi::private::SYMBOLS,
        crate::ffi::private::DATA_SYMBOLS,
        crate::ffi::queues::SYMBOLS,
    ]
    .concat()
}

/// The `(name, version)` pairs a Debian library exports (functions, and objects if
/// `objects`) at versions starting with `prefix`, as `objdump -T` lists them; `None` (after
/// a visible "skipped") when objdump or the library is missing — a failure instead under
/// `REMEM_REQUIRE_IBV_TOOLS`, as in CI, where a skip would hide the check.
#[cfg(test)]
pub(crate) fn debian_exports(
    lib: &str,
    package: &str,
    prefix: &str,
    objects: bool,
) -> Option<std::collections::BTreeSet<(String, String)>> {
    let out = match std::process::Command::new("objdump")
        .args(["-T", lib])
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => {
            let why = format!("objdump or {lib} missing (binutils, {package})");
            assert!(
                std::env::var_os("REMEM_REQUIRE_IBV_TOOLS").is_none(),
                "REMEM_REQUIRE_IBV_TOOLS is set, but: {why}"
            );
            eprintln!("skipped: {why}");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter(|l| l.contains(" DF ") || (objects && l.contains(" DO ")))
            .filter(|l| !l.contains("*UND*") && !l.contains("*ABS*"))
            .filter_map(|l| {
                let mut words = l.split_whitespace().rev();
                Some((words.next()?.to_string(), words.next()?.to_string()))
            })
            // "(IBVERBS_1.0)" is a hidden compat version (old struct layouts).
            .filter(|(_, v)| v.starts_with(prefix))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::{debian_exports, exports};
    use std::collections::BTreeSet;

    const DEBIAN_LIB: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

    #[test]
    fn no_symbol_is_exported_twice() {
        let all = exports();
        let names: BTreeSet<_> = all.iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), all.len());
    }

    /// Every symbol Debian's libibverbs exports at a default version is exported here at
    /// the same version: the IBVERBS_1.x functions programs call, and the
    /// IBVERBS_PRIVATE_34 ones provider libraries (libmlx5, libefa, which perftest links)
    /// reference.
    #[test]
    fn exports_cover_debian_libibverbs() {
        let Some(debian) = debian_exports(DEBIAN_LIB, "libibverbs1", "IBVERBS_", true) else {
            return;
        };
        assert!(
            debian.len() > 140,
            "parsed {} symbols from objdump",
            debian.len()
        );
        let ours: BTreeSet<_> = exports()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let missing: Vec<_> = debian.difference(&ours).collect();
        assert!(missing.is_empty(), "not exported: {missing:?}");
        let extra: Vec<_> = ours
            .difference(&debian)
            .filter(|(n, _)| n != "ibv_query_gid_type")
            .collect();
        assert!(
            extra.is_empty(),
            "exported but not in Debian's library: {extra:?}"
        );
        assert!(ours.contains(&("ibv_query_gid_type".into(), "IBVERBS_PRIVATE_34".into())));
    }
}
