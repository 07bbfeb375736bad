//! Tidy checks: architecture invariants of docs/ARCHITECTURE.md that are cheap to check from the
//! source tree, so that breaking one fails the test suite instead of waiting for a review.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every crate under `crates/`: its directory name and its directory.
fn crate_dirs() -> Vec<(String, PathBuf)> {
    let crates = workspace_root().join("crates");
    let entries = std::fs::read_dir(&crates)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", crates.display()));
    let mut dirs: Vec<(String, PathBuf)> = entries
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("cannot list crates/: {e}"))
                .path()
        })
        .filter(|dir| dir.join("Cargo.toml").exists())
        .map(|dir| {
            let name = dir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, dir)
        })
        .collect();
    dirs.sort();
    dirs
}

/// The names of the dependencies a manifest declares, in any dependency table.
fn dependency_names(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line.contains("dependencies");
            continue;
        }
        if in_deps && let Some((name, _)) = line.split_once('=') {
            let name = name.trim().split('.').next().unwrap_or_default().to_owned();
            if !name.is_empty() && !name.starts_with('#') {
                names.push(name);
            }
        }
    }
    names
}

#[test]
fn only_the_adapter_and_the_server_depend_on_rmcp() {
    let mut checked = 0;
    for (name, dir) in crate_dirs() {
        let deps = dependency_names(&read(&dir.join("Cargo.toml")));
        // toolgate-kit is an MCP client by nature (it drives servers under test), and the
        // transports (toolgate-stdio, the HTTP front door) carry rmcp's messages; nothing in the
        // policy, the stores or the reusable floor depends on any of them.
        let may_know_mcp = matches!(
            name.as_str(),
            "toolgate"
                | "toolgate-rmcp"
                | "toolgate-server"
                | "toolgate-kit"
                | "toolgate-stdio"
                | "toolgate-http"
        );
        if !may_know_mcp {
            // Directly, or through the two crates that know MCP.
            assert!(
                !deps.iter().any(|d| d == "rmcp"
                    || d.starts_with("rmcp-")
                    || d == "toolgate-rmcp"
                    || d == "toolgate-server"),
                "{name} depends on rmcp (directly or through toolgate-rmcp/toolgate-server); only toolgate-rmcp, the transports, the facade toolgate, toolgate-server and the test kit may know MCP"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "expected to check canon, policy, audit and commit, checked {checked}"
    );
}

/// The `[dependencies]` table of a manifest, as (name, the rest of the line).
fn normal_dependencies(manifest: &str) -> Vec<(String, String)> {
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && let Some((name, rest)) = line.split_once('=') {
            let name = name.trim().split('.').next().unwrap_or_default().to_owned();
            if !name.is_empty() && !name.starts_with('#') {
                deps.push((name, rest.trim().to_owned()));
            }
        }
    }
    deps
}

/// The syn-based scanner runs in build scripts, xtask and tests, never in a serving binary: only
/// toolgate-scan depends on syn, and the runtime crates reach it only through an optional
/// dependency (feature `lock`).
#[test]
fn the_runtime_crates_link_no_source_parser() {
    let crates = workspace_root().join("crates");
    for name in [
        "toolgate",
        "toolgate-rmcp",
        "toolgate-contract",
        "toolgate-server",
    ] {
        let manifest = read(&crates.join(name).join("Cargo.toml"));
        for (dep, spec) in normal_dependencies(&manifest) {
            assert!(
                dep != "syn" && dep != "proc-macro2",
                "{name} depends on {dep}: the scanner belongs in toolgate-scan"
            );
            if dep == "toolgate-scan" {
                assert!(
                    spec.contains("optional = true"),
                    "{name} depends on toolgate-scan unconditionally; make it optional (feature `lock`)"
                );
            }
        }
    }
}

#[test]
fn every_crate_forbids_unsafe_and_uses_workspace_lints() {
    for (_, dir) in crate_dirs() {
        let manifest = read(&dir.join("Cargo.toml"));
        assert!(
            manifest.contains("[lints]\nworkspace = true"),
            "{} must inherit the workspace lints",
            dir.display()
        );
        for root in ["src/lib.rs", "src/main.rs"] {
            let path = dir.join(root);
            if path.exists() {
                assert!(
                    read(&path).contains("#![forbid(unsafe_code)]"),
                    "{} must forbid unsafe code",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn every_published_crate_carries_its_metadata_and_its_dependencies_a_version() {
    let root = workspace_root();
    let workspace = read(&root.join("Cargo.toml"));
    for key in ["license", "repository", "readme", "keywords", "categories"] {
        assert!(
            workspace.contains(&format!("\n{key} = ")),
            "[workspace.package] must set {key}"
        );
    }
    for file in ["LICENSE-MIT", "LICENSE-APACHE", "CHANGELOG.md", "README.md"] {
        assert!(root.join(file).is_file(), "{file} is missing");
    }
    // Internal dependencies a published crate may name carry the version crates.io resolves.
    for line in workspace.lines().filter(|l| l.starts_with("toolgate")) {
        if line.starts_with("toolgate-pgtest") {
            // Tests only: a path-only dev-dependency, stripped by `cargo publish`.
            assert!(!line.contains("version"), "{line}");
            continue;
        }
        assert!(
            line.contains("version = \"0.1.0\""),
            "a publishable internal dependency needs the workspace version: {line}"
        );
    }
    let unpublished = ["toolgate-pgtest"];
    for (name, dir) in crate_dirs() {
        let manifest = read(&dir.join("Cargo.toml"));
        if unpublished.contains(&name.as_str()) {
            assert!(
                manifest.contains("publish = false"),
                "{name} is test support only"
            );
            continue;
        }
        assert!(
            manifest.contains("\ndescription = "),
            "{name} has no description"
        );
        for key in [
            "license",
            "repository",
            "keywords",
            "categories",
            "publish",
            "rust-version",
        ] {
            assert!(
                manifest.contains(&format!("\n{key}.workspace = true")),
                "{name} must inherit {key} from the workspace"
            );
        }
        // The workspace's README, or a page of the crate's own (the facade's crates.io page).
        assert!(
            manifest.contains("\nreadme.workspace = true")
                || (manifest.contains("\nreadme = \"README.md\"")
                    && dir.join("README.md").is_file()),
            "{name} must inherit readme from the workspace or have its own README.md"
        );
        assert!(
            manifest.contains("\n[package.metadata.docs.rs]\nall-features = true"),
            "{name} must tell docs.rs to document every feature"
        );
    }
}

// That `Gated` forwards every one of rmcp's 32 `ServerHandler` methods is checked behaviourally by
// crates/toolgate-rmcp/tests/forwarding.rs, which calls each through a real client.

#[test]
fn the_crates_reference_policy_is_the_shipped_one() {
    let root = workspace_root();
    assert_eq!(
        read(&root.join("crates/toolgate-server/src/reference-policy.json")),
        read(&root.join("fixtures/policy.json")),
        "crates/toolgate-server/src/reference-policy.json must be a copy of fixtures/policy.json"
    );
}

/// The floor of each crate of the workspace (docs/ARCHITECTURE.md, "Crate map").
const FLOORS: &[(&str, u8)] = &[
    ("toolgate-canon", 1),
    ("toolgate-storage", 1),
    ("toolgate-stdio", 1),
    ("toolgate-pgtest", 1),
    ("toolgate-policy", 2),
    ("toolgate-contract", 2),
    ("toolgate-audit", 2),
    ("toolgate-commit", 2),
    ("toolgate-state", 2),
    ("toolgate-kit", 2),
    ("toolgate-scan", 3),
    ("toolgate-postgres", 3),
    ("toolgate-rmcp", 4),
    ("toolgate-http", 5),
    ("toolgate", 6),
    ("toolgate-server", 7),
];

#[test]
fn every_crate_depends_only_on_lower_floors() {
    let floor = |name: &str| FLOORS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f);
    let mut checked = 0;
    for (name, dir) in crate_dirs() {
        let Some(own) = floor(&name) else {
            panic!("crates/{name} has no floor: add it to FLOORS and to docs/ARCHITECTURE.md");
        };
        for (dependency, _) in normal_dependencies(&read(&dir.join("Cargo.toml"))) {
            if let Some(theirs) = floor(&dependency) {
                assert!(
                    theirs < own,
                    "{name} (floor {own}) depends on {dependency} (floor {theirs}): a crate depends only on lower floors"
                );
            }
        }
        checked += 1;
    }
    assert_eq!(checked, FLOORS.len(), "every crate of FLOORS exists");
}
