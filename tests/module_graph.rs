//! The layering of the workspace, checked over the source text (ARCHITECTURE.md "Invariants").
//!
//! Proves: inside `src/` every `crate::<module>` reference points down the layer order below
//! (so there is no import circle, and nothing under the API layer builds an HTTP answer or calls
//! it), every module of `src/` has a place in that order, the crates depend one way
//! (`narad` -> `narad-shard`/`narad-raft` -> `narad-io`), and only `io` names glommio or calls
//! libc. A failure names each offending reference with its file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/`'s top-level modules, lowest first: a module may use only modules before it.
const LAYERS: &[&str] = &[
    "wire",       // byte-exact wire helpers: no state
    "http",       // HTTP/1.1 server and its types
    "config",     // settings
    "logging",    // log lines, the audit line
    "schema",     // JSON Schema checks (typed rejections)
    "metrics",    // the recorder every layer records into
    "node",       // one shard's view of the node: metadata copy, routing over the mesh
    "cluster",    // the cluster port: other nodes' requests
    "transit",    // hand-off of transit records to their owner shards
    "auth",       // authentication and grants (typed errors)
    "ship",       // remote children: shipping to another cluster over HTTPS
    "scrape",     // collecting and rendering /metrics
    "api",        // the routes: the only layer that builds answers
    "service",    // glue between http and api, the metrics listener
    "boot_probe", // the ports' answers before the shards serve
    "server",     // start-up wiring
    "cli",        // the CLI (an HTTP client)
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comments (line comments, doc comments and block comments), so that a
/// module named in prose is not taken for a reference. String literals are kept as they are.
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            out.push(c);
            if c == b'\\' && i + 1 < b.len() {
                out.push(b[i + 1]);
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            out.push(c);
            i += 1;
        } else if c == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal such as '"' or '\\': copy it whole so its quote opens no string.
            let end = b[i + 1..]
                .iter()
                .position(|&x| x == b'\'')
                .map_or(b.len(), |p| i + 2 + p);
            out.extend_from_slice(&b[i..end.min(b.len())]);
            i = end;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a source text names through `crate::`: `crate::a::b`, and each item
/// of `crate::{a, b::c, ...}`.
fn crate_refs(src: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = src;
    while let Some(p) = rest.find("crate::") {
        let before = rest[..p].chars().next_back();
        rest = &rest[p + "crate::".len()..];
        // `narad_crate::x` or `my_crate::x` are other paths.
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        let id = ident_at(&group[i..]);
                        if !id.is_empty() {
                            refs.insert(id.to_string());
                        }
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let id = ident_at(rest);
            if !id.is_empty() {
                refs.insert(id.to_string());
            }
        }
    }
    refs
}

/// The top-level module of a file under `src/` (`None` for the crate roots).
fn module_of(src_dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src_dir).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let m = first.strip_suffix(".rs").unwrap_or(first);
    (m != "lib" && m != "main").then(|| m.to_string())
}

/// module -> (used module -> files that use it).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn src_graph() -> Graph {
    let src_dir = root().join("src");
    let mut files = Vec::new();
    rust_files(&src_dir, &mut files);
    let mut g = Graph::new();
    for f in &files {
        let Some(m) = module_of(&src_dir, f) else {
            continue;
        };
        let text = strip_comments(&std::fs::read_to_string(f).unwrap());
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        let entry = g.entry(m.clone()).or_default();
        for r in crate_refs(&text) {
            if r != m && r != "self" && r != "super" {
                entry.entry(r).or_default().insert(rel.clone());
            }
        }
    }
    g
}

/// The strongly connected components with more than one module (the import circles), by
/// Tarjan's algorithm.
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct St<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        if let Some(ws) = s.g.get(v) {
            for w in ws {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> = g
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a.as_str()).chain(bs.iter().map(String::as_str)))
        .collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn edges(g: &Graph) -> BTreeMap<String, BTreeSet<String>> {
    g.iter()
        .map(|(a, bs)| (a.clone(), bs.keys().cloned().collect()))
        .collect()
}

#[test]
fn the_circle_finder_finds_a_planted_circle() {
    // Proves the check can fail: a graph with a circle (a -> b -> c -> a) and a module outside
    // it (d) is reported as exactly that circle, and the same graph without c -> a as none.
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut add = |a: &str, b: &str| {
        g.entry(a.into()).or_default().insert(b.into());
    };
    add("a", "b");
    add("b", "c");
    add("c", "a");
    add("d", "a");
    assert_eq!(circles(&g), vec![vec!["a", "b", "c"]]);
    g.get_mut("c").unwrap().clear();
    assert!(circles(&g).is_empty());
    // And the reference reader sees grouped and plain paths, not prose or other crates.
    let refs = crate_refs(&strip_comments(
        "use crate::{api::{self, error}, node::Node};\n// crate::metrics in prose\n\
         let x = crate::wire::json::x(); let s = \"//\"; let y = narad_crate::z;",
    ));
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        vec!["api", "node", "wire"]
    );
}

#[test]
fn src_modules_form_no_import_circle_and_point_down_the_layers() {
    let g = src_graph();
    let found = circles(&edges(&g));
    let mut problems = Vec::new();
    for c in &found {
        problems.push(format!("import circle: {}", c.join(" <-> ")));
    }
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    for (m, uses) in &g {
        let Some(rm) = rank(m) else {
            problems.push(format!("module `{m}` has no place in LAYERS"));
            continue;
        };
        for (u, files) in uses {
            match rank(u) {
                None => problems.push(format!("`{m}` uses `{u}`, which has no place in LAYERS")),
                Some(ru) if ru >= rm => problems.push(format!(
                    "`{m}` uses `{u}`, a layer above it or beside it, in {}",
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                Some(_) => {}
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering of src/ broken:\n{}",
        problems.join("\n")
    );
}

/// The lines of a manifest's own `[dependencies]`, `[dev-dependencies]` and
/// `[build-dependencies]` (not the workspace's shared list).
fn dependency_lines(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = matches!(
                l,
                "[dependencies]" | "[dev-dependencies]" | "[build-dependencies]"
            );
            continue;
        }
        if in_deps && !l.is_empty() && !l.starts_with('#') {
            out.push(l.to_string());
        }
    }
    out
}

/// The entries of a crate's own dependency lists that name workspace crates.
fn workspace_deps(manifest: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in dependency_lines(manifest) {
        let name = ident_dashed(&l);
        if name == "narad" || name.starts_with("narad-") {
            out.insert(name.to_string());
        }
    }
    out
}

/// The dependency name a manifest line starts with (`narad-io = { path = ... }`).
fn ident_dashed(l: &str) -> &str {
    let end = l
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(l.len());
    &l[..end]
}

#[test]
fn crates_depend_one_way_and_only_io_names_glommio_or_libc() {
    let r = root();
    let allowed: &[(&str, &[&str])] = &[
        ("io", &[]),
        ("shard", &["narad-io"]),
        ("raft", &["narad-io"]),
    ];
    let mut problems = Vec::new();
    for (dir, ok) in allowed {
        for d in workspace_deps(&r.join(dir).join("Cargo.toml")) {
            if !ok.contains(&d.as_str()) {
                problems.push(format!("{dir}/Cargo.toml depends on {d}"));
            }
        }
    }
    for manifest in ["Cargo.toml", "shard/Cargo.toml", "raft/Cargo.toml"] {
        if dependency_lines(&r.join(manifest))
            .iter()
            .any(|l| l.starts_with("glommio"))
        {
            problems.push(format!("{manifest} depends on glommio (only io may)"));
        }
    }
    for dir in ["src", "shard/src", "raft/src"] {
        let mut files = Vec::new();
        rust_files(&r.join(dir), &mut files);
        for f in files {
            let text = strip_comments(&std::fs::read_to_string(&f).unwrap());
            for name in ["glommio::", "libc::"] {
                if text.contains(name) {
                    problems.push(format!(
                        "{} names {name} (only io may)",
                        f.strip_prefix(&r).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "crate layering broken:\n{}",
        problems.join("\n")
    );
}
