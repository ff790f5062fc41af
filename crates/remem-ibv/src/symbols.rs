//! The list of every exported C symbol and its version (each module declares its own
//! with `symver!`, next to the functions).

/// Every exported C symbol with its default version, as `(name, version)`.
pub fn exports() -> Vec<(&'static str, &'static str)> {
    [
        crate::device::SYMBOLS,
        crate::query::SYMBOLS,
        crate::pd::SYMBOLS,
        crate::mr::SYMBOLS,
        crate::event::SYMBOLS,
        crate::misc::SYMBOLS,
        crate::private::SYMBOLS,
        crate::private::DATA_SYMBOLS,
        crate::channel::SYMBOLS,
        crate::cq::SYMBOLS,
        crate::cq_ex::SYMBOLS,
        crate::qp::SYMBOLS,
        crate::qp_ex::SYMBOLS,
        crate::post::SYMBOLS,
        crate::srq::SYMBOLS,
        crate::ah::SYMBOLS,
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use super::exports;
    use std::collections::BTreeSet;
    use std::process::Command;

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
        let out = match Command::new("objdump").args(["-T", DEBIAN_LIB]).output() {
            Ok(o) if o.status.success() => o,
            _ => {
                let why = format!("objdump or {DEBIAN_LIB} missing (binutils, libibverbs1)");
                // CI installs both: there a skip would hide the check.
                assert!(
                    std::env::var_os("REMEM_REQUIRE_IBV_TOOLS").is_none(),
                    "REMEM_REQUIRE_IBV_TOOLS is set, but: {why}"
                );
                eprintln!("skipped: {why}");
                return;
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let mut debian = BTreeSet::new();
        for line in text
            .lines()
            .filter(|l| l.contains(" DF ") || l.contains(" DO "))
            .filter(|l| !l.contains("*UND*") && !l.contains("*ABS*"))
        {
            let mut words = line.split_whitespace().rev();
            let (Some(name), Some(ver)) = (words.next(), words.next()) else {
                continue;
            };
            // "(IBVERBS_1.0)" is a hidden compat version (old struct layouts).
            if ver.starts_with("IBVERBS_") {
                debian.insert((name.to_string(), ver.to_string()));
            }
        }
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
