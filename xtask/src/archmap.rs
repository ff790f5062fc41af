//! The crate map of ARCHITECTURE.md, kept honest: its `crate-map` block (one line per
//! workspace crate, `crate → dependencies`) is compared with what `cargo metadata` says the
//! manifests declare. `cargo xtask crate-map` prints the block the manifests give;
//! `cargo test -p xtask` fails when the document and the manifests disagree.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// One crate's workspace dependencies, as the map writes them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Deps {
    /// Normal dependencies; `(name, optional)`.
    pub normal: Vec<(String, bool)>,
    /// Dev-dependencies (tests, benches, examples) other than those already normal.
    pub dev: Vec<String>,
}

/// The map: crate name → its workspace dependencies.
pub type Map = BTreeMap<String, Deps>;

/// The map as the manifests declare it (`cargo metadata --no-deps`, run in `root`).
pub fn from_metadata(root: &Path) -> Result<Map, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let names: Vec<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    let mut map = Map::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        let mut deps = Deps::default();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default().to_string();
            if !names.contains(&dep) {
                continue;
            }
            match d["kind"].as_str() {
                None | Some("normal") => {
                    let optional = d["optional"].as_bool().unwrap_or(false);
                    if !deps.normal.iter().any(|(n, _)| *n == dep) {
                        deps.normal.push((dep, optional));
                    }
                }
                Some("dev") => {
                    if dep != name && !deps.dev.contains(&dep) {
                        deps.dev.push(dep);
                    }
                }
                // Build dependencies between workspace crates: none today; a new one
                // shows up as a difference with the document.
                Some(other) => deps.dev.push(format!("{dep} ({other})")),
            }
        }
        deps.normal.sort();
        deps.dev.retain(|d| !deps.normal.iter().any(|(n, _)| n == d));
        deps.dev.sort();
        map.insert(name, deps);
    }
    Ok(map)
}

/// The `crate-map` block of a document: the lines between "```text crate-map" and "```".
/// Each line is `crate → a, b?  (dev: c, d)`; `?` marks an optional dependency (behind a
/// feature); a crate with none writes nothing after the arrow.
pub fn from_document(doc: &str) -> Result<Map, String> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != "```text crate-map");
    if lines.next().is_none() {
        return Err("no ```text crate-map block".into());
    }
    let mut map = Map::new();
    for line in lines.take_while(|l| l.trim() != "```") {
        let Some((name, rest)) = line.split_once('→') else {
            return Err(format!("crate-map line without an arrow: {line:?}"));
        };
        let (normal, dev) = match rest.split_once("(dev:") {
            Some((n, d)) => (n, d.trim().trim_end_matches(')')),
            None => (rest, ""),
        };
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        };
        let mut deps = Deps {
            normal: list(normal)
                .into_iter()
                .map(|d| match d.strip_suffix('?') {
                    Some(d) => (d.to_string(), true),
                    None => (d, false),
                })
                .collect(),
            dev: list(dev),
        };
        deps.normal.sort();
        deps.dev.sort();
        if map.insert(name.trim().to_string(), deps).is_some() {
            return Err(format!("crate {} listed twice", name.trim()));
        }
    }
    Ok(map)
}

/// The block for `map`, crates in the order given (crates not in `order` last).
pub fn render(map: &Map, order: &[String]) -> String {
    let mut names: Vec<&String> = order.iter().filter(|n| map.contains_key(*n)).collect();
    names.extend(map.keys().filter(|n| !order.contains(n)));
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let mut s = String::from("```text crate-map\n");
    for name in names {
        let d = &map[name];
        let normal: Vec<String> = d
            .normal
            .iter()
            .map(|(n, opt)| if *opt { format!("{n}?") } else { n.clone() })
            .collect();
        let mut line = format!("{name:width$} → {}", normal.join(", "));
        if !d.dev.is_empty() {
            let _ = write!(line, "  (dev: {})", d.dev.join(", "));
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s.push_str("```\n");
    s
}

/// Every difference between the document's map and the manifests', one line each.
pub fn differences(doc: &Map, manifests: &Map) -> Vec<String> {
    let mut out = Vec::new();
    for (name, want) in manifests {
        match doc.get(name) {
            None => out.push(format!("{name}: a workspace crate the map does not show")),
            Some(have) if have != want => out.push(format!(
                "{name}: the map says {have:?}, the manifests say {want:?}"
            )),
            Some(_) => {}
        }
    }
    for name in doc.keys().filter(|n| !manifests.contains_key(*n)) {
        out.push(format!("{name}: in the map, not in the workspace"));
    }
    out
}

/// `cargo xtask crate-map`: prints the block the manifests give, in the document's order,
/// and says whether the document agrees.
pub fn print(root: &Path) -> Result<i32, String> {
    let manifests = from_metadata(root)?;
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .map_err(|e| format!("ARCHITECTURE.md: {e}"))?;
    let doc = from_document(&text).unwrap_or_default();
    let order: Vec<String> = doc.keys().cloned().collect();
    let order = document_order(&text).unwrap_or(order);
    print!("{}", render(&manifests, &order));
    let diff = differences(&doc, &manifests);
    for d in &diff {
        eprintln!("ARCHITECTURE.md disagrees: {d}");
    }
    Ok(i32::from(!diff.is_empty()))
}

/// The crate names of the document's block in the order written.
fn document_order(doc: &str) -> Option<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != "```text crate-map");
    lines.next()?;
    Some(
        lines
            .take_while(|l| l.trim() != "```")
            .filter_map(|l| l.split_once('→').map(|(n, _)| n.trim().to_string()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
            .to_path_buf()
    }

    #[test]
    fn architecture_crate_map_is_what_the_manifests_declare() {
        let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
        let doc = from_document(&text).unwrap();
        let manifests = from_metadata(&root()).unwrap();
        let diff = differences(&doc, &manifests);
        assert!(
            diff.is_empty(),
            "ARCHITECTURE.md's crate map is not the workspace's (fix the document; \
             `cargo xtask crate-map` prints the true block):\n{}",
            diff.join("\n")
        );
    }

    #[test]
    fn a_missing_or_wrong_edge_is_a_difference() {
        let doc = from_document(
            "x\n```text crate-map\na → b, c?  (dev: d)\nb →\nc →\nd →\n```\n",
        )
        .unwrap();
        let mut truth = doc.clone();
        assert!(differences(&doc, &truth).is_empty());
        // An edge the document inverts or omits, an optional one written as required,
        // a crate it leaves out: each is reported.
        truth.get_mut("b").unwrap().normal.push(("a".into(), false));
        truth.get_mut("a").unwrap().normal[1].1 = false;
        truth.insert("e".into(), Deps::default());
        let diff = differences(&doc, &truth);
        assert_eq!(diff.len(), 3, "{diff:?}");
        // What `render` writes reads back as the same map.
        let order = vec!["a".to_string(), "b".into()];
        assert_eq!(from_document(&render(&truth, &order)).unwrap(), truth);
    }
}
