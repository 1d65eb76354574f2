//! The documents name the repository's files: every path they name must exist.
//!
//! ARCHITECTURE.md, the README and the user guide under `docs/` name files in backticks as
//! repository-relative paths (`zklock-core/src/backend/mod.rs`), and link to each other with
//! relative markdown links (`[fencing](fencing.md#the-rule)`). A renamed or moved file, or a
//! renamed heading, fails here with the document, its line and the missing path, instead of
//! leaving a map that points nowhere.
//!
//! It also holds the house to its plan: every backend folder has the role files ARCHITECTURE.md
//! names ("One shape for every backend folder"), and ARCHITECTURE.md names every file of
//! zklock-core's library, so that a file added without a word on what it is for fails here.
//!
//! A code span counts as a path when it is made of path characters only (letters, digits,
//! `.`, `_`, `-`, `%`, `/`), does not start with `/` (a znode path such as `/zklock/locks`) and
//! contains a `/` or ends in `.rs`, `.md` or `.toml`. Fenced code blocks are not read.

use std::fs;
use std::path::{Path, PathBuf};

/// The repository's root (this crate's parent).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("zklock-core sits in the repository")
        .to_path_buf()
}

/// The documents checked: ARCHITECTURE.md, README.md and every `.md` under `docs/`.
fn documents() -> Vec<PathBuf> {
    fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("a readable directory entry").path();
            if path.is_dir() {
                markdown(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut docs = vec![root.join("ARCHITECTURE.md"), root.join("README.md")];
    let mut guide = Vec::new();
    markdown(&root.join("docs"), &mut guide);
    guide.sort();
    docs.extend(guide);
    docs
}

/// A document's text with every fenced code block blanked (its lines kept, so that line
/// numbers still match).
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let fence = {
            let t = line.trim_start();
            t.starts_with("```") || t.starts_with("~~~")
        };
        if fence {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The inline code spans of `prose`, with the line each starts on. A span may run over a
/// line break, as markdown allows.
fn code_spans(prose: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut line = 1;
    let mut open: Option<(usize, String)> = None;
    for c in prose.chars() {
        match (&mut open, c) {
            (None, '`') => open = Some((line, String::new())),
            (Some(_), '`') => spans.push(open.take().expect("open")),
            (Some((_, span)), c) => span.push(if c == '\n' { ' ' } else { c }),
            (None, _) => {}
        }
        if c == '\n' {
            line += 1;
        }
    }
    spans
}

/// The repository path a code span names, if it names one.
fn repository_path(span: &str) -> Option<&str> {
    let span = span.trim();
    let path_like = !span.is_empty()
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '%' | '/'))
        && !span.starts_with('/');
    let names_file =
        span.contains('/') || [".rs", ".md", ".toml"].iter().any(|e| span.ends_with(e));
    (path_like && names_file).then_some(span)
}

/// `path` relative to the repository, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every path a document names in backticks that does not exist: `doc:line: message`.
fn missing_code_paths(doc: &Path) -> Vec<String> {
    let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let root = root();
    code_spans(&prose(&text))
        .into_iter()
        .filter_map(|(line, span)| {
            let path = repository_path(&span)?;
            (!root.join(path).exists()).then(|| {
                format!(
                    "{}:{line}: `{path}` names no file or folder of the repository (renamed or moved? update the document)",
                    shown(doc)
                )
            })
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' | '-' => Some('-'),
            '_' => Some('_'),
            c if c.is_alphanumeric() => Some(c.to_lowercase().next().unwrap_or(c)),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings.
fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter_map(|l| {
            let t = l.trim_start();
            t.starts_with('#')
                .then(|| anchor(t.trim_start_matches('#').replace('`', "").as_str()))
        })
        .collect()
}

/// The targets of a document's markdown links (`](target)`), with their lines.
fn links(prose: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            out.push((n + 1, rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    out
}

/// Every relative link of a document whose file, or heading, does not exist.
fn broken_links(doc: &Path) -> Vec<String> {
    let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let dir = doc.parent().expect("a document sits in a folder");
    let mut broken = Vec::new();
    for (line, target) in links(&prose(&text)) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (target.as_str(), None),
        };
        let file = if file.is_empty() {
            doc.to_path_buf()
        } else {
            dir.join(file)
        };
        if !file.exists() {
            broken.push(format!(
                "{}:{line}: the link `{target}` points at {}, which does not exist",
                shown(doc),
                shown(&file)
            ));
            continue;
        }
        let Some(fragment) = fragment else { continue };
        if file.extension().is_some_and(|e| e == "md") {
            let their = fs::read_to_string(&file).unwrap_or_default();
            if !anchors(&their).iter().any(|a| a == fragment) {
                broken.push(format!(
                    "{}:{line}: the link `{target}`: {} has no heading #{fragment}",
                    shown(doc),
                    shown(&file)
                ));
            }
        }
    }
    broken
}

#[test]
fn architecture_names_only_existing_paths() {
    let doc = root().join("ARCHITECTURE.md");
    let missing = missing_code_paths(&doc);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist:\n{}",
        missing.join("\n")
    );
    // It does name paths: a check that finds none checks nothing.
    let text = fs::read_to_string(&doc).expect("ARCHITECTURE.md");
    let named = code_spans(&prose(&text))
        .iter()
        .filter(|(_, s)| repository_path(s).is_some())
        .count();
    assert!(named > 50, "ARCHITECTURE.md names only {named} paths");
}

#[test]
fn the_readme_and_the_guide_name_only_existing_paths() {
    let missing: Vec<String> = documents()
        .iter()
        .filter(|d| !d.ends_with("ARCHITECTURE.md"))
        .flat_map(|d| missing_code_paths(d))
        .collect();
    assert!(
        missing.is_empty(),
        "the README or the guide names paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn relative_links_reach_their_files_and_headings() {
    let broken: Vec<String> = documents().iter().flat_map(|d| broken_links(d)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_renamed_path_is_named_in_the_failure() {
    let doc = std::env::temp_dir().join(format!("zklock-architecture-{}.md", std::process::id()));
    fs::write(
        &doc,
        "The seam is `zklock-core/src/backend/mod.rs`, once `zklock-core/src/backend/seam.rs`.\n\
         ```text\n`not/checked/in/a/fence.rs`\n```\nA znode path, `/zklock/locks`, is not a file.\n",
    )
    .unwrap();
    let missing = missing_code_paths(&doc);
    let _ = fs::remove_file(&doc);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].contains("`zklock-core/src/backend/seam.rs`"),
        "{missing:?}"
    );
    assert!(missing[0].contains(":1:"), "{missing:?}");
    assert_eq!(
        anchor("What is remembered, and for how long"),
        "what-is-remembered-and-for-how-long"
    );
}

/// The roles every backend folder has, each a file `<role>.rs` or a folder `<role>/`
/// (ARCHITECTURE.md, "One shape for every backend folder"); `session` or `conn`.
const ROLES: &[&[&str]] = &[
    &["session", "conn"],
    &["acquire"],
    &["hold"],
    &["jobs"],
    &["inspect"],
    &["wire"],
    &["options"],
    &["error"],
];

/// The backend folders under `zklock-core/src/backend/`.
fn backend_folders() -> Vec<PathBuf> {
    let dir = root().join("zklock-core/src/backend");
    let mut folders: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("the backend folder")
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    folders.sort();
    folders
}

#[test]
fn every_backend_folder_has_the_shape() {
    let mut missing = Vec::new();
    let folders = backend_folders();
    assert!(folders.len() >= 4, "the backend folders: {folders:?}");
    for folder in &folders {
        if !folder.join("mod.rs").exists() {
            missing.push(format!("{}: no mod.rs", shown(folder)));
        }
        for role in ROLES {
            let found = role.iter().any(|r| {
                folder.join(format!("{r}.rs")).exists() || folder.join(r).join("mod.rs").exists()
            });
            if !found {
                missing.push(format!(
                    "{}: no {} (a file or a folder)",
                    shown(folder),
                    role.join(" or ")
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "backend folders without their shape:\n{}",
        missing.join("\n")
    );
}

/// Every Rust file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a readable directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn architecture_names_every_file_of_the_library() {
    let text = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named: std::collections::HashSet<String> = code_spans(&prose(&text))
        .into_iter()
        .filter_map(|(_, span)| repository_path(&span).map(str::to_string))
        .collect();
    let mut files = Vec::new();
    rust_files(&root().join("zklock-core/src"), &mut files);
    files.sort();
    let unnamed: Vec<String> = files
        .iter()
        .map(|f| shown(f))
        .filter(|f| !named.contains(f) && !f.ends_with("/tests.rs"))
        .collect();
    assert!(
        unnamed.is_empty(),
        "ARCHITECTURE.md does not name these files of zklock-core (say in it what each is for):\n{}",
        unnamed.join("\n")
    );
}
