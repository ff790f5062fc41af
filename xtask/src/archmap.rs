//! ARCHITECTURE.md, kept honest. Its `crate-map` block (one line per workspace crate,
//! `crate → dependencies`) is compared with what `cargo metadata` says the manifests
//! declare, and every source file it names (`` `remem-soft/src/io/driver.rs` ``) must exist,
//! with the function a walk's hop names after it (`` `Nic::transmit` ``) defined there.
//! `cargo xtask crate-map` prints the block the manifests give; `cargo test -p xtask`
//! fails when the document and the code disagree.

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
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
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
        deps.dev
            .retain(|d| !deps.normal.iter().any(|(n, _)| n == d));
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
/// and says whether the document agrees with the manifests and names only files and
/// functions that exist.
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
    let stale = stale_references(root, &text);
    for s in &stale {
        eprintln!("ARCHITECTURE.md names what the code lacks: {s}");
    }
    Ok(i32::from(!diff.is_empty() || !stale.is_empty()))
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

/// Every file the document names that does not exist, and every hop whose function is not
/// defined in the file named before it. A file is a backticked token ending in `.rs`, taken
/// under `crates/` when its first component is a crate there, else under `root`; a hop is
/// such a file followed by a chain of backticked paths (`Type::function` or `function`)
/// separated only by spaces and arrows, whose last components must be defined in the file
/// (a function, type, trait or constant). A list item's continuation lines are part of it.
pub fn stale_references(root: &Path, doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in paragraphs(doc) {
        // parts[k] for odd k is a backticked token; parts[k + 1] the text after it.
        let parts: Vec<&str> = line.split('`').collect();
        for k in (1..parts.len()).step_by(2) {
            let tok = parts[k];
            if !tok.ends_with(".rs") || !tok.contains('/') || tok.contains(' ') {
                continue;
            }
            let first = tok.split('/').next().unwrap_or_default();
            let path = if root.join("crates").join(first).is_dir() {
                root.join("crates").join(tok)
            } else {
                root.join(tok)
            };
            let Ok(text) = std::fs::read_to_string(&path) else {
                out.push(format!("line {}: `{tok}` does not exist", n + 1));
                continue;
            };
            // The hops: the chain of identifier paths right after the file, separated
            // only by spaces and arrows (`file` `a` → `B::c` → `d`: prose ends it).
            let mut k = k;
            while k + 2 < parts.len() && parts[k + 1].chars().all(|c| c.is_whitespace() || c == '→')
            {
                k += 2;
                let next = parts[k];
                let is_path = !next.is_empty()
                    && next.split("::").all(|s| {
                        !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
                    });
                if !is_path {
                    break;
                }
                let name = next.rsplit("::").next().unwrap_or(next);
                if !defines(&text, name) {
                    out.push(format!(
                        "line {}: `{next}` is not defined in `{tok}`",
                        n + 1
                    ));
                }
            }
        }
    }
    out
}

/// The document's lines joined into logical lines: a list item or a table row with the
/// lines that continue it (indented, not starting a new item), each with its first line's
/// number (from 0). A hop's file and functions may then sit on different lines of an item.
fn paragraphs(doc: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (n, line) in doc.lines().enumerate() {
        let t = line.trim_start();
        let starts_item = t.starts_with("- ")
            || t.starts_with('|')
            || t.split_once(". ")
                .is_some_and(|(k, _)| k.parse::<u32>().is_ok());
        let continues = open && !starts_item && !t.is_empty() && line.starts_with(' ');
        match out.last_mut() {
            Some((_, text)) if continues => {
                text.push(' ');
                text.push_str(t);
            }
            _ => out.push((n, line.to_string())),
        }
        open = starts_item || continues;
    }
    out
}

/// Whether `text` defines `name`: a function, type, trait or constant of that name.
fn defines(text: &str, name: &str) -> bool {
    [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ",
    ]
    .iter()
    .any(|kw| {
        let pat = format!("{kw}{name}");
        text.match_indices(&pat).any(|(at, m)| {
            let after = text[at + m.len()..].chars().next();
            !matches!(after, Some(c) if c.is_alphanumeric() || c == '_')
        })
    })
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
    fn architecture_names_files_and_functions_that_exist() {
        let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
        let stale = stale_references(&root(), &text);
        assert!(
            stale.is_empty(),
            "ARCHITECTURE.md names what the code does not have:\n{}",
            stale.join("\n")
        );
    }

    #[test]
    fn a_moved_file_or_renamed_function_is_stale() {
        let doc = "1. `xtask/src/archmap.rs` `stale_references` reads the document\n\
                   2. `xtask/src/archmap.rs` `no_such_function`\n\
                   3. `xtask/src/gone.rs` `main`\n";
        let stale = stale_references(&root(), doc);
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert!(stale[0].contains("no_such_function"), "{stale:?}");
        assert!(stale[1].contains("gone.rs"), "{stale:?}");
        // A list item's continuation lines belong to it.
        let doc = "1. `xtask/src/archmap.rs` `render` →\n   `nope_either`\n";
        let stale = stale_references(&root(), doc);
        assert_eq!(stale.len(), 1, "{stale:?}");
        // Every hop after a file on its line counts, up to the next file.
        let doc =
            "`xtask/src/archmap.rs` `render` → `Deps` → `nope` then `xtask/src/main.rs` `main`";
        let stale = stale_references(&root(), doc);
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert!(stale[0].contains("`nope`"), "{stale:?}");
    }

    #[test]
    fn a_missing_or_wrong_edge_is_a_difference() {
        let doc = from_document("x\n```text crate-map\na → b, c?  (dev: d)\nb →\nc →\nd →\n```\n")
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
