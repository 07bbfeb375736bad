//! `docs/ARCHITECTURE.md` is a map of the code, so it must not name what is gone: every type it
//! names in backticks (`Gated<H>`, `Policy::load`) must be defined somewhere in the workspace's
//! sources, and every file or directory it names (`gate/call.rs`, `checks/`) must exist.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Types the map names that belong to other crates.
const EXTERNAL: &[&str] = &["ServerHandler"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` (skipping build output and dependencies), as paths relative to `root`.
fn files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_owned());
            files(root, &path, out);
        } else {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_owned());
        }
    }
}

/// The spans between backticks.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Whether `word` is an identifier that starts with an upper-case letter and has a lower-case one
/// (a type name, not a constant).
fn is_type_name(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && word.chars().any(|c| c.is_ascii_lowercase())
}

/// Whether `source` defines `name` as a type, trait, alias or enum variant, or (for `fn_name`)
/// a function.
fn defines(source: &str, name: &str) -> bool {
    let words: Vec<&str> = source
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let keyword = words.windows(2).any(|pair| {
        matches!(pair[0], "struct" | "enum" | "trait" | "type" | "fn" | "mod") && pair[1] == name
    });
    keyword
        || source.lines().any(|line| {
            // An enum variant: `    Name,` / `    Name(..)` / `    Name {`.
            let line = line.trim_start();
            line.strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([',', '(', ' ', '{']))
                && !line.starts_with("//")
        })
}

#[test]
fn every_type_and_file_the_map_names_exists() {
    let root = workspace_root();
    let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md"))
        .unwrap_or_else(|e| panic!("cannot read docs/ARCHITECTURE.md: {e}"));
    let mut all = Vec::new();
    for dir in [
        "crates", "xtask", "examples", "fuzz", "fixtures", "docs", "tests",
    ] {
        if root.join(dir).is_dir() {
            all.push(PathBuf::from(dir));
        }
        files(&root, &root.join(dir), &mut all);
    }
    let sources: Vec<String> = all
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| std::fs::read_to_string(root.join(p)).ok())
        .collect();
    let paths: BTreeSet<String> = all
        .iter()
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .collect();

    let mut missing = Vec::new();
    let mut checked = 0;
    for span in backticked(&map) {
        let span = span.trim();
        if span.ends_with(".rs") || (span.ends_with('/') && !span.contains(' ')) {
            let wanted = span.trim_end_matches('/');
            let found = paths
                .iter()
                .any(|p| p == wanted || p.ends_with(&format!("/{wanted}")));
            checked += 1;
            if !found {
                missing.push(format!("file or directory `{span}`"));
            }
            continue;
        }
        // `Gated<H>` -> `Gated`; `Policy::load` -> `Policy` and `load`.
        let head = span.split('<').next().unwrap_or(span);
        let mut segments = head.split("::");
        let Some(first) = segments.next() else {
            continue;
        };
        if !is_type_name(first) || EXTERNAL.contains(&first) {
            continue;
        }
        checked += 1;
        if !sources.iter().any(|s| defines(s, first)) {
            missing.push(format!("type `{first}` (from `{span}`)"));
        }
        for item in segments {
            if !item.is_empty() && !sources.iter().any(|s| defines(s, item)) {
                missing.push(format!("item `{item}` (from `{span}`)"));
            }
        }
    }
    assert!(
        checked > 40,
        "the map names only {checked} types and files: has the backtick convention changed?"
    );
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names what does not exist; update the map:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_check_finds_what_is_gone() {
    assert!(defines("pub struct Gated<H> {", "Gated"));
    assert!(defines("enum V {\n    Pass,\n    Hide(String),\n}", "Hide"));
    assert!(!defines("let gated = Gated::builder();", "Gated"));
    assert!(!defines("// Pass, in a comment", "Pass"));
    assert!(is_type_name("GateState") && !is_type_name("LEDGER_DIR") && !is_type_name("names"));
    assert_eq!(backticked("a `b` c `d`"), vec!["b", "d"]);
}
