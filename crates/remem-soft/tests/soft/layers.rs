//! The folder-level import graph of remem-soft's `src/`, drawn from the source and held to
//! the crate's layers: each top-level module (a folder or a file under `src/`) is a node,
//! each `crate::…` or `super::…` path that leaves it an edge. The test prints the graph
//! (`cargo test -p remem-soft --test soft layers -- --nocapture`) and asserts that no import
//! circle joins two nodes and that the only edges running up the layers are the ones
//! [`UPWARD`] names, each with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first: a node may use any node of its own layer or a lower one (no
/// circle allowed, though); an edge to a higher layer must be in [`UPWARD`]. `lib` is the
/// crate root (the provider and device names).
const LAYERS: &[&[&str]] = &[
    &["mem"],
    &["transport"],
    &["cm"],
    &["engine"],
    &["io"],
    &["device"],
    &["verbs"],
    &["lib", "dropin", "testing"],
];

/// The edges allowed to run up the layers, with why (none: the engine knows QPs and the
/// GSI through its ports, `engine::port::{QpPort, GsiPort}`, which the verbs layer
/// implements).
const UPWARD: &[(&str, &str, &str)] = &[];

/// The import circles between nodes still to be broken (each a sorted set of nodes).
const KNOWN_CYCLES: &[&[&str]] = &[];

// ------------------------------------------------------------------ reading the source

/// A token of Rust source with comments, strings and character literals taken out.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

fn tokenize(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && {
            let mut j = i + 1;
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            b.get(j) == Some(&b'"')
        } {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    i = j + 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push(Tok::Other);
        } else if c == b'"' {
            i += 1;
            while b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Tok::Other);
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                i += 1;
            }
            out.push(Tok::Other);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_string()));
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(match c {
                b'{' => Tok::Open,
                b'}' => Tok::Close,
                b',' => Tok::Comma,
                _ if c.is_ascii_whitespace() => {
                    i += 1;
                    continue;
                }
                _ => Tok::Other,
            });
            i += 1;
        }
    }
    out
}

/// The module path of a file under `src/` (`engine/mod.rs` → `[engine]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The first-level names a path reaches after `crate::` or `super::…`: one, or the heads
/// of a `{…}` group.
fn heads(toks: &[Tok], mut i: usize) -> Vec<String> {
    match toks.get(i) {
        Some(Tok::Ident(name)) => vec![name.clone()],
        Some(Tok::Open) => {
            let mut out = Vec::new();
            let mut depth = 0;
            let mut at_head = true;
            while i < toks.len() {
                match &toks[i] {
                    Tok::Open => {
                        depth += 1;
                        if depth > 1 {
                            at_head = false;
                        }
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Comma if depth == 1 => at_head = true,
                    Tok::Ident(name) if depth == 1 && at_head => {
                        if name != "self" {
                            out.push(name.clone());
                        }
                        at_head = false;
                    }
                    _ => {}
                }
                i += 1;
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names `lib.rs` re-exports from a module (`pub use context::{SoftContext, …}`):
/// `crate::SoftContext` is a use of `context`.
fn reexports(lib: &[Tok]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for i in 0..lib.len() {
        if lib[i] != Tok::Ident("use".into()) {
            continue;
        }
        let Some(Tok::Ident(module)) = lib.get(i + 1) else {
            continue;
        };
        if lib.get(i + 2) != Some(&Tok::PathSep) {
            continue;
        }
        // The last names of the path or group: whatever identifiers come before `;`.
        let mut j = i + 3;
        while j < lib.len() && lib[j] != Tok::Other {
            if let Tok::Ident(name) = &lib[j] {
                map.insert(name.clone(), module.clone());
            }
            j += 1;
        }
    }
    map
}

/// The graph: node → node → the paths that make the edge (`verbs::qp::SoftQp`).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Whether the `mod` at `toks[i]` is under `#[cfg(test)]` (`pub` or not).
fn test_only(toks: &[Tok], mut i: usize) -> bool {
    if i > 0 && toks[i - 1] == Tok::Ident("pub".into()) {
        i -= 1;
    }
    // `# [ cfg ( test ) ] mod`
    i >= 5 && toks[i - 5] == Tok::Ident("cfg".into()) && toks[i - 3] == Tok::Ident("test".into())
}

/// The rest of a path after its head, up to two more names (`SoftQp` of `qp::SoftQp`).
fn tail(toks: &[Tok], mut i: usize) -> String {
    let mut out = String::new();
    for _ in 0..2 {
        match (toks.get(i), toks.get(i + 1)) {
            (Some(Tok::PathSep), Some(Tok::Ident(name))) => {
                out.push_str("::");
                out.push_str(name);
                i += 2;
            }
            _ => break,
        }
    }
    out
}

/// The graph of the crate's code, tests left out (`#[cfg(test)]` modules): what the
/// layers are about is what the library is built from.
fn graph() -> Graph {
    // REMEM_LAYERS_SRC: draw another tree (an older checkout's `src`, for comparison).
    let src = std::env::var_os("REMEM_LAYERS_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let top: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(&src, f).first().cloned())
        .collect();
    let lib = tokenize(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let reexported = reexports(&lib);
    let node_of = |path: &[String], head: &str| -> String {
        if let Some(first) = path.first() {
            return first.clone();
        }
        if top.contains(head) {
            head.to_string()
        } else if let Some(module) = reexported.get(head).filter(|m| top.contains(*m)) {
            module.clone()
        } else {
            "lib".to_string()
        }
    };
    let sources: Vec<(Vec<String>, Vec<Tok>)> = files
        .iter()
        .map(|f| {
            (
                module_path(&src, f),
                tokenize(&std::fs::read_to_string(f).unwrap()),
            )
        })
        .collect();
    // The files of `#[cfg(test)] mod name;` declarations.
    let mut test_modules: Vec<Vec<String>> = Vec::new();
    for (file_mod, toks) in &sources {
        for i in 0..toks.len() {
            if let (Tok::Ident(kw), Some(Tok::Ident(name)), Some(Tok::Other)) =
                (&toks[i], toks.get(i + 1), toks.get(i + 2))
                && kw == "mod"
                && test_only(toks, i)
            {
                let mut m = file_mod.clone();
                m.push(name.clone());
                test_modules.push(m);
            }
        }
    }
    let mut g = Graph::new();
    for (file_mod, toks) in &sources {
        let from = file_mod.first().cloned().unwrap_or_else(|| "lib".into());
        g.entry(from.clone()).or_default();
        if test_modules.iter().any(|t| file_mod.starts_with(t)) {
            continue;
        }
        // Inline modules (`mod tests { … }`) deepen the path that `super` climbs from; the
        // code of a test module is not read.
        let mut inline: Vec<(String, usize, bool)> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                Tok::Open => depth += 1,
                Tok::Close => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, d, _)| *d == depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(kw) if kw == "mod" => {
                    if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                        (toks.get(i + 1), toks.get(i + 2))
                    {
                        inline.push((name.clone(), depth, test_only(toks, i)));
                    }
                }
                Tok::Ident(kw)
                    if (kw == "crate" || kw == "super")
                        && toks.get(i + 1) == Some(&Tok::PathSep)
                        && !matches!(i.checked_sub(1).map(|p| &toks[p]), Some(Tok::PathSep))
                        && !inline.iter().any(|(_, _, test)| *test) =>
                {
                    let mut path: Vec<String> = file_mod.clone();
                    path.extend(inline.iter().map(|(n, _, _)| n.clone()));
                    let mut j = i;
                    if kw == "crate" {
                        path.clear();
                        j += 2;
                    } else {
                        while toks.get(j) == Some(&Tok::Ident("super".into()))
                            && toks.get(j + 1) == Some(&Tok::PathSep)
                        {
                            path.pop();
                            j += 2;
                        }
                    }
                    let single = matches!(toks.get(j), Some(Tok::Ident(_)));
                    for head in heads(toks, j) {
                        let to = node_of(&path, &head);
                        if to != from {
                            let mut item: Vec<String> = path.clone();
                            item.push(head.clone());
                            let mut item = item.join("::");
                            if single {
                                item.push_str(&tail(toks, j + 1));
                            }
                            g.entry(from.clone())
                                .or_default()
                                .entry(to)
                                .or_default()
                                .insert(item);
                        }
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    g
}

/// The circles of the graph: its strongly connected components of more than one node.
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = g.keys().collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for to in g.get(&n).into_iter().flat_map(|m| m.keys()) {
                if seen.insert(to.clone()) {
                    stack.push(to.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for n in &nodes {
        let scc: Vec<String> = nodes
            .iter()
            .filter(|m| reaches[*n].contains(**m) && reaches[*m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

fn layer(node: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&node))
        .unwrap_or_else(|| panic!("module `{node}` is in no layer of LAYERS: place it"))
}

#[test]
fn folders_are_layers_without_circles() {
    let g = graph();
    println!("remem-soft's import graph (from -> to [paths]), layers lowest first:");
    for l in LAYERS {
        for from in *l {
            let Some(tos) = g.get(*from) else { continue };
            let edges: Vec<String> = tos
                .iter()
                .map(|(to, items)| {
                    let up = if layer(to) > layer(from) { " ^" } else { "" };
                    format!("{to} [{}]{up}", items.len())
                })
                .collect();
            println!("  {from:10} -> {}", edges.join(", "));
        }
    }
    let mut up = Vec::new();
    for (from, tos) in &g {
        for to in tos.keys() {
            if layer(to) > layer(from) {
                up.push((from.as_str(), to.as_str()));
            }
        }
    }
    println!("upward edges (^): {}", up.len());
    for (from, to) in &up {
        let items: Vec<&String> = g[*from][*to].iter().collect();
        println!("  {from} -> {to}: {items:?}");
    }
    let found = cycles(&g);
    let known: Vec<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(found, known, "the import circles between modules");
    for (from, to) in &up {
        assert!(
            UPWARD.iter().any(|(f, t, _)| f == from && t == to),
            "`{from}` uses `{to}`, a higher layer: move the code, or allow the edge in UPWARD \
             with why"
        );
    }
    for (from, to, _) in UPWARD {
        assert!(
            up.contains(&(*from, *to)),
            "UPWARD allows `{from}` -> `{to}`, which is gone: take it out"
        );
    }
}

#[test]
fn the_reader_sees_paths_through_groups_supers_and_inline_modules() {
    let toks = tokenize(
        r#"use crate::{a::X, b, self}; // crate::c
           /* crate::d */ let s = "crate::e"; let c = '"';
           mod tests { use super::f; } use super::super::g;"#,
    );
    let i = toks
        .iter()
        .position(|t| *t == Tok::Ident("crate".into()))
        .unwrap();
    assert_eq!(heads(&toks, i + 2), ["a", "b"]);
    let crates = toks
        .iter()
        .filter(|t| **t == Tok::Ident("crate".into()))
        .count();
    assert_eq!(crates, 1, "comments and strings are not read");
    assert!(toks.contains(&Tok::Ident("f".into())));
}

#[test]
fn unsafe_code_lives_in_io_sys_alone() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in &files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        let unsafe_tokens = tokenize(&text)
            .iter()
            .filter(|t| **t == Tok::Ident("unsafe".into()))
            .count();
        if rel == "io/sys.rs" {
            assert!(unsafe_tokens > 0, "io/sys.rs is the unsafe module");
        } else {
            assert_eq!(unsafe_tokens, 0, "{rel}: unsafe code outside io/sys.rs");
        }
        // Each folder (and top-level module) but `io`, whose `sys` needs unsafe, forbids it
        // for everything below.
        let top = module_path(&src, file);
        let is_top = top.len() == 1 && (rel.ends_with("/mod.rs") || !rel.contains('/'));
        let io_child = top.len() == 2 && top[0] == "io" && top[1] != "sys";
        if (is_top && top[0] != "io") || io_child {
            assert!(
                text.contains("#![forbid(unsafe_code)]"),
                "{rel}: no #![forbid(unsafe_code)]"
            );
        }
    }
}
