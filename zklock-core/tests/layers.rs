//! The layers of zklock-core stay one-way: a module may use only the layers below it.
//!
//! Reads the crate's own sources and fails, naming file and line, when code in one layer refers
//! to a higher layer (`crate::<higher>::…`), or to an item re-exported at the crate root
//! (`crate::LockManager`: that hides which layer it comes from). Doc comments are not code.

use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first. Each module of `src/` belongs to one.
const LAYERS: &[&[&str]] = &[
    &["types"],
    &["metrics"],
    &["session"],
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
