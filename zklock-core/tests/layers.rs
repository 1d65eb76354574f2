//! The layers of zklock-core stay one-way: a module may use only the layers below it.
//!
//! Reads the crate's own sources and fails, naming file and line, when code in one layer refers
//! to a higher layer (`crate::<higher>::…`), or to an item re-exported at the crate root
//! (`crate::LockManager`: that hides which layer it comes from), or when code outside
//! `backend/` names a backend's insides. And in every crate of the workspace, no two sibling
//! modules use each other, directly or around a cycle. Doc comments are not code.
//!
//! And the tests stay readable: no function of the workspace's tests is over 100 lines (a long
//! scenario is split into named steps).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first. Each module of `src/` belongs to one.
const LAYERS: &[&[&str]] = &[
    &["types"],
    &["metrics"],
    &["background"],
    &["backend"],
    &["local"],
    &["fence"],
    &["guard"],
    &["recipe"],
    &["manager", "inspect", "multi", "private", "lib"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/backend/zk/hold.rs` -> `backend`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Every `crate::name` in a line of code.
fn crate_refs(line: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `zklock_crate::`
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        refs.push(name);
    }
    refs
}

#[test]
fn no_layer_uses_a_higher_one() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        let Some(mine) = layer_of(&module) else {
            violations.push(format!(
                "{}: module `{module}` is in no layer; add it to LAYERS in tests/layers.rs",
                file.display()
            ));
            continue;
        };
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for name in crate_refs(code) {
                let theirs = match layer_of(&name) {
                    Some(layer) => layer,
                    // An item re-exported at the root (`crate::Error`): only the top may.
                    None if mine == LAYERS.len() - 1 => continue,
                    None => {
                        violations.push(format!(
                            "{}:{}: `crate::{name}` names a root re-export; import it from its layer's module",
                            file.display(),
                            n + 1
                        ));
                        continue;
                    }
                };
                if theirs > mine {
                    violations.push(format!(
                        "{}:{}: layer `{module}` uses the higher layer `{name}`",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "the layers must stay one-way:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_sees_a_violation() {
    // The scanner itself: a line naming a higher layer is found.
    assert_eq!(
        crate_refs("use crate::manager::LockManager;"),
        vec!["manager"]
    );
    assert_eq!(
        crate_refs("let x = crate::types::key::Key::new(k); crate::LossReason"),
        vec!["types", "LossReason"]
    );
    assert!(crate_refs("use zklock_crate::x;").is_empty());
    assert!(layer_of("manager").unwrap() > layer_of("types").unwrap());
}

/// The backends' folders: their insides are theirs. Above the seam, only the files that build
/// a manager name one: the builder (each backend's own settings type) and the connect
/// string's scheme parser, which opens the backend.
const BACKENDS: &[&str] = &["zk", "redis", "postgres", "etcd", "memory"];
const OPENS_BACKENDS: &[&str] = &["manager/builder.rs", "manager/connect.rs"];

/// Every line of code (not a comment) in `src/`, trimmed, with its file's path relative to
/// `src/` and its line number, in the files `skip` does not leave out.
fn code_lines(skip: impl Fn(&str) -> bool) -> Vec<(String, usize, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut lines = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if skip(&rel) {
            continue;
        }
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if !code.starts_with("//") {
                lines.push((rel.clone(), n + 1, code.to_string()));
            }
        }
    }
    lines
}

#[test]
fn nothing_above_the_seam_names_a_backends_insides() {
    // Unit tests of a layer (`local/tests.rs`) may run it on the in-memory backend.
    let skip = |rel: &str| {
        rel.starts_with("backend/") || OPENS_BACKENDS.contains(&rel) || rel.ends_with("/tests.rs")
    };
    let mut violations = Vec::new();
    for (rel, n, code) in code_lines(skip) {
        for b in BACKENDS {
            if code.contains(&format!("backend::{b}")) {
                violations.push(format!("{rel}:{n}: names `backend::{b}`"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "above the seam, go through the Backend trait and its abilities:\n{}",
        violations.join("\n")
    );
}

/// The backends' client crates. Outside each backend's own folder, only the files that build a manager and the
/// fence stores (each an adapter to the user's own store of that kind) may name one: the
/// shared types, the recipes, the guards and the manager's face stay the same whichever backend
/// runs underneath, and a new backend adds its folder without touching them.
const CLIENT_CRATES: &[&str] = &["zookeeper_client", "redis", "tokio_postgres", "etcd_client"];
const STORE_ADAPTERS: &[&str] = &[
    "fence/zookeeper.rs",
    "fence/redis.rs",
    "fence/postgres.rs",
    "fence/etcd.rs",
    "fence/error.rs",
    "fence/mod.rs",
];

/// Every path in a line of code that starts with one of `crates` (`redis::Cmd`,
/// `::redis::Value`, `tokio_postgres::Error`), by crate name.
fn client_paths<'a>(code: &str, crates: &[&'a str]) -> Vec<&'a str> {
    let mut found = Vec::new();
    for name in crates {
        let needle = format!("{name}::");
        let mut from = 0;
        while let Some(at) = code[from..].find(&needle) {
            let at = from + at;
            from = at + needle.len();
            let head = &code[..at];
            let prefixed = match head.strip_suffix("::") {
                // `zklock_core::redis::x`: a re-export reached through another crate.
                Some(rest) => rest.ends_with(|c: char| c.is_alphanumeric() || c == '_'),
                // `my_redis::x`, `conn.redis::<T>()`: another name.
                None => head.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.'),
            };
            if !prefixed {
                found.push(*name);
            }
        }
    }
    found
}

#[test]
fn the_shared_face_names_no_backend_client() {
    // A backend's own folder is its own; the seam (`backend/mod.rs`) and the shared pieces
    // beside it are not.
    let skip = |rel: &str| {
        let own = BACKENDS
            .iter()
            .any(|b| rel.starts_with(&format!("backend/{b}/")) || rel == format!("backend/{b}.rs"));
        own || OPENS_BACKENDS.contains(&rel) || STORE_ADAPTERS.contains(&rel)
    };
    let mut violations = Vec::new();
    for (rel, n, code) in code_lines(skip) {
        for name in client_paths(&code, CLIENT_CRATES) {
            violations.push(format!("{rel}:{n}: names the client crate `{name}`"));
        }
    }
    assert!(
        violations.is_empty(),
        "outside backend/, reach a backend's client through the seam (`Backend::client`, \
         `ServerError`), not by its type:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_client_check_sees_a_client_path() {
    let crates = CLIENT_CRATES;
    assert_eq!(
        client_paths("use zookeeper_client::Client;", crates),
        vec!["zookeeper_client"]
    );
    assert_eq!(
        client_paths("let c: ::redis::Value = v;", crates),
        vec!["redis"]
    );
    assert_eq!(
        client_paths("fn f(e: tokio_postgres::Error) {}", crates),
        vec!["tokio_postgres"]
    );
    assert!(client_paths("let r = conn.redis::<u8>();", crates).is_empty());
    assert!(client_paths("use zklock_core::redis::Client;", crates).is_empty());
    assert!(client_paths("let my_redis::x = 1;", crates).is_empty());
}

/// A module path in a crate: `["backend", "zk", "hold"]`.
type ModPath = Vec<String>;

/// The module a file is, under a crate root `src` (`lib.rs`, `main.rs` are the root).
fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The module paths a line of code refers to (`crate::a::b`, `super::c`, `self::d`), resolved
/// against the modules that exist: the longest existing prefix of each path.
fn module_refs(line: &str, me: &ModPath, modules: &BTreeSet<ModPath>) -> Vec<ModPath> {
    let mut out = Vec::new();
    let text = line;
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if text[..at]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue;
            }
            // The whole path after the first segment: `super::super::a::b`.
            let rest: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut segs = rest.split("::").filter(|s| !s.is_empty());
            let mut path: ModPath = match segs.next() {
                Some("crate") => vec![],
                Some("self") => me.clone(),
                Some("super") => me[..me.len().saturating_sub(1)].to_vec(),
                _ => continue,
            };
            for seg in segs {
                if seg == "super" {
                    path.pop();
                    continue;
                }
                let mut next = path.clone();
                next.push(seg.to_string());
                if !modules.contains(&next) {
                    break;
                }
                path = next;
            }
            out.push(path);
        }
    }
    out
}

/// Cycles among sibling modules of the crate rooted at `src`: for each reference from module
/// A to module B, the children of their deepest common ancestor that hold A and B depend one
/// on the other (a module and its own descendants may use each other).
fn sibling_cycles(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|f| !f.strip_prefix(src).unwrap().starts_with("bin"));
    files.sort();
    let modules: BTreeSet<ModPath> = files.iter().map(|f| module_path(src, f)).collect();
    // parent -> child -> children it uses
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let me = module_path(src, file);
        let text = fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for target in module_refs(code, &me, &modules) {
                let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common == me.len() || common == target.len() {
                    continue;
                }
                graphs
                    .entry(me[..common].to_vec())
                    .or_default()
                    .entry(me[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
    }
    let mut cycles = Vec::new();
    for (parent, graph) in &graphs {
        for start in graph.keys() {
            // A path back to `start`, by depth-first search.
            let mut stack = vec![(start.clone(), vec![start.clone()])];
            let mut seen = BTreeSet::new();
            while let Some((node, path)) = stack.pop() {
                for next in graph.get(&node).into_iter().flatten() {
                    if next == start {
                        // One cycle once, whichever module it was found from: start it at
                        // its least module.
                        if path.iter().any(|m| m < start) {
                            continue;
                        }
                        let mut ring = path.clone();
                        ring.push(start.clone());
                        cycles.push(format!(
                            "{} in `{}`: {}",
                            src.display(),
                            if parent.is_empty() {
                                "crate".into()
                            } else {
                                parent.join("::")
                            },
                            ring.join(" -> ")
                        ));
                    } else if seen.insert(next.clone()) {
                        let mut longer = path.clone();
                        longer.push(next.clone());
                        stack.push((next.clone(), longer));
                    }
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    cycles
}

/// Every crate root of the workspace: each package's `src` (without `src/bin`) and each binary
/// folder under `src/bin`.
fn crate_roots() -> Vec<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let mut roots = vec![];
    for package in [
        "zklock-core",
        "zklock-macros",
        "zklock-cli",
        "zklock-testkit",
        "bench",
        "examples/inventory",
        ".",
    ] {
        let src = workspace.join(package).join("src");
        if !src.is_dir() {
            continue;
        }
        let bin = src.join("bin");
        if bin.is_dir() {
            for entry in fs::read_dir(&bin).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    roots.push(path);
                }
            }
        }
        roots.push(src);
    }
    roots
}

#[test]
fn no_crate_has_an_import_cycle() {
    let mut cycles = Vec::new();
    for root in crate_roots() {
        cycles.extend(sibling_cycles(&root));
    }
    assert!(
        cycles.is_empty(),
        "sibling modules that use each other (move what both need below them):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let dir = std::env::temp_dir().join(format!("zklock-layers-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "mod a;\n").unwrap();
    fs::write(src.join("a/mod.rs"), "mod b;\nmod c;\n").unwrap();
    fs::write(src.join("a/b.rs"), "use super::c::X;\n").unwrap();
    fs::write(src.join("a/c.rs"), "use crate::a::b::Y;\n").unwrap();
    let cycles = sibling_cycles(&src);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains("b -> c -> b"), "{cycles:?}");
}

/// The folders of test code held to `MAX_TEST_FN_LINES`, relative to the workspace's root.
const TEST_FOLDERS: &[&str] = &[
    "tests",
    "zklock-core/tests",
    "zklock-cli/tests",
    "zklock-macros/tests",
    "zklock-testkit/tests",
];

/// The most lines a function of the tests may span (from its signature to its closing brace,
/// attributes and doc comments not counted): a longer scenario is split into named steps.
const MAX_TEST_FN_LINES: usize = 100;

/// Test files not held to the limit while another change rewrites them, each named only while
/// a function in it is over (the check fails on an entry that no longer needs to be here).
const LONG_TEST_FNS_ALLOWED: &[&str] = &[
    // Empty: `tests/operators/tls_servers.rs` and the other `tests/operators/tls_*.rs`, being
    // rewritten in another change, have no function over the limit. Name such a file here
    // only while one of its functions is.
];

/// Every function of a source file (free, in an impl or a trait, nested or not) with its first
/// line and the lines it spans.
fn function_lengths(source: &str) -> syn::Result<Vec<(String, usize, usize)>> {
    lengths_of(source, false)
}

/// [`function_lengths`], without the functions of `mod tests` blocks when `library`.
fn lengths_of(source: &str, library: bool) -> syn::Result<Vec<(String, usize, usize)>> {
    use syn::spanned::Spanned;
    use syn::visit::Visit;

    struct Lengths(Vec<(String, usize, usize)>, bool);
    impl Lengths {
        fn add(&mut self, sig: &syn::Signature, block: &syn::Block) {
            let first = sig.span().start().line;
            let last = block.brace_token.span.close().end().line;
            self.0
                .push((sig.ident.to_string(), first, last + 1 - first));
        }
    }
    impl<'ast> Visit<'ast> for Lengths {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !(self.1 && m.ident == "tests") {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.add(&f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.add(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
        fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
            if let Some(block) = &f.default {
                self.add(&f.sig, block);
            }
            syn::visit::visit_trait_item_fn(self, f);
        }
    }
    let file = syn::parse_file(source)?;
    let mut lengths = Lengths(Vec::new(), library);
    lengths.visit_file(&file);
    Ok(lengths.0)
}

/// The source folders of the workspace's libraries and binaries.
const LIBRARY_FOLDERS: &[&str] = &[
    "zklock-core/src",
    "zklock-cli/src",
    "zklock-macros/src",
    "zklock-testkit/src",
    "src",
];

/// The most lines a function of the libraries may span (as [`MAX_TEST_FN_LINES`] counts).
const MAX_LIBRARY_FN_LINES: usize = 80;

#[test]
fn no_library_function_is_over_80_lines() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for folder in LIBRARY_FOLDERS {
        rust_files(&workspace.join(folder), &mut files);
    }
    files.sort();
    let mut long = Vec::new();
    for file in &files {
        let shown = file.strip_prefix(workspace).unwrap().to_string_lossy();
        // A crate's unit tests in a file of their own are tests.
        if shown.ends_with("/tests.rs") {
            continue;
        }
        match lengths_of(&fs::read_to_string(file).unwrap(), true) {
            Ok(lengths) => long.extend(
                lengths
                    .into_iter()
                    .filter(|(_, _, lines)| *lines > MAX_LIBRARY_FN_LINES)
                    .map(|(name, line, lines)| format!("{shown}:{line} fn {name}: {lines} lines")),
            ),
            Err(e) => long.push(format!("{shown}: not read as Rust ({e})")),
        }
    }
    assert!(
        long.is_empty(),
        "{} library functions over {MAX_LIBRARY_FN_LINES} lines (split each into named \
         steps):\n{}",
        long.len(),
        long.join("\n")
    );
}

/// `file:line fn name: N lines` for each function of `source` over `MAX_TEST_FN_LINES`.
fn long_functions(shown: &str, source: &str) -> Vec<String> {
    match function_lengths(source) {
        Ok(lengths) => lengths
            .into_iter()
            .filter(|(_, _, lines)| *lines > MAX_TEST_FN_LINES)
            .map(|(name, line, lines)| format!("{shown}:{line} fn {name}: {lines} lines"))
            .collect(),
        Err(e) => vec![format!("{shown}: not read as Rust ({e})")],
    }
}

#[test]
fn no_test_function_is_over_100_lines() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for folder in TEST_FOLDERS {
        rust_files(&workspace.join(folder), &mut files);
    }
    files.sort();
    let mut long = Vec::new();
    let mut allowed_but_short = Vec::new();
    for file in &files {
        let shown = file.strip_prefix(workspace).unwrap().to_string_lossy();
        let found = long_functions(&shown, &fs::read_to_string(file).unwrap());
        if LONG_TEST_FNS_ALLOWED.contains(&&*shown) {
            if found.is_empty() {
                allowed_but_short.push(shown.into_owned());
            }
        } else {
            long.extend(found);
        }
    }
    assert!(
        long.is_empty(),
        "{} test functions over {MAX_TEST_FN_LINES} lines (split each into named steps: setup, \
         the fault, the check):\n{}",
        long.len(),
        long.join("\n")
    );
    assert!(
        allowed_but_short.is_empty(),
        "no longer over {MAX_TEST_FN_LINES} lines: take them out of LONG_TEST_FNS_ALLOWED: {}",
        allowed_but_short.join(", ")
    );
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body = "    let x = 1;\n".repeat(MAX_TEST_FN_LINES - 1);
    let source = format!(
        "/// Doc.\n#[test]\nfn long() {{\n{body}}}\nimpl S {{\n    async fn short() {{}}\n}}\n"
    );
    let lengths = function_lengths(&source).unwrap();
    assert_eq!(
        lengths,
        vec![
            ("long".to_string(), 3, MAX_TEST_FN_LINES + 1),
            ("short".to_string(), MAX_TEST_FN_LINES + 5, 1),
        ]
    );
    assert_eq!(
        long_functions("t.rs", &source),
        vec![format!("t.rs:3 fn long: {} lines", MAX_TEST_FN_LINES + 1)]
    );
}
