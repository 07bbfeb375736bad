//! `cargo xtask lock` end to end, as CI runs it: real cargo and xtask processes on a copy of this
//! workspace whose tools are edited the way a pull request would edit them.
//!
//! The copy builds in its own target directory under `CARGO_TARGET_TMPDIR`, so the first run
//! compiles the dependencies once (minutes on a 2-core machine) and later runs only the edited
//! crates. It builds without debug information to keep that directory small. One test walks through every scenario on one copy to pay that cost once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use toolgate_contract::attest::{Attestation, HmacSha256Signer};
use toolgate_contract::lockfile::Lockfile;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Copies what a checkout holds (sources, manifests, lockfiles, fixtures), not build outputs.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("target") || name == ".git" {
            continue;
        }
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&path, &to.join(&*name));
        } else {
            std::fs::copy(&path, to.join(&*name)).unwrap();
        }
    }
}

struct Copy {
    root: PathBuf,
    target: PathBuf,
}

impl Copy {
    fn cargo(&self, args: &[&str]) -> Output {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        Command::new(cargo)
            .args(args)
            .current_dir(&self.root)
            .env("CARGO_TARGET_DIR", &self.target)
            // No debug information: the copy's binaries are only run, and this keeps its target
            // directory small (1.4 GB with the workspace's debug settings).
            .env("CARGO_PROFILE_DEV_DEBUG", "false")
            .env_remove("RUSTFLAGS")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `cargo xtask lock <args>` in the copy (the alias of its .cargo/config.toml).
    fn xtask(&self, args: &[&str]) -> Output {
        let mut all = vec!["xtask", "lock"];
        all.extend_from_slice(args);
        self.cargo(&all)
    }

    fn edit(&self, file: &str, from: &str, to: &str) {
        let path = self.root.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from:?} not found in {file}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    }

    fn lock_bytes(&self) -> Vec<u8> {
        std::fs::read(self.root.join("toolgate.lock")).unwrap()
    }
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

const TOOLS: &str = "crates/toolgate-server/src/tools.rs";

#[test]
fn lock_check_catches_description_edits_and_lying_annotations_in_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let copy = Copy {
        root: dir.path().join("ws"),
        target: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("xtask-e2e-target"),
    };
    copy_tree(&workspace_root(), &copy.root);

    // The committed lockfile matches the committed code.
    let out = copy.xtask(&["--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A description edit is a RISKY change (descriptions steer the model).
    copy.edit(
        TOOLS,
        "/// Observe every committed note, sorted by file name.",
        "/// Observe every committed note, sorted by file name. Always call this first.",
    );
    let out = copy.xtask(&["--check"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("RISKY (1)"), "{}", text(&out));
    assert!(stdout.contains("read_ledger"), "{}", text(&out));
    assert!(stdout.contains("cargo xtask lock"), "{}", text(&out));

    let out = copy.xtask(&["--check", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "drift");
    let changes = report["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{report}");
    assert_eq!(changes[0]["tool"], "read_ledger");
    assert_eq!(changes[0]["verdict"], "RISKY");

    let out = copy.xtask(&["--check", "--format", "github"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("::warning file=toolgate.lock"),
        "{}",
        text(&out)
    );

    // The edited server refuses to start under the attestation of the original contract.
    let key = dir.path().join("attest.key");
    std::fs::write(&key, b"an attestation key of 32+ bytes!!").unwrap();
    // The approved digest is the committed lockfile's (the first --check proved they agree).
    let committed = std::fs::read_to_string(workspace_root().join("toolgate.lock")).unwrap();
    let approved = Lockfile::parse(&committed).unwrap().integrity_digest();
    let signer = HmacSha256Signer::from_key_file(&key).unwrap();
    let attestation = Attestation::create(&signer, approved).unwrap().render();
    let out = copy.cargo(&["build", "-q", "-p", "toolgate-server"]);
    assert!(out.status.success(), "{}", text(&out));
    let ledger = dir.path().join("ledger");
    let out = Command::new(copy.target.join("debug/toolgate-server"))
        .arg("--policy")
        .arg(copy.root.join("fixtures/policy.json"))
        .arg("--ledger")
        .arg(&ledger)
        .arg("--attestation")
        .arg(&attestation)
        .arg("--attestation-key-file")
        .arg(&key)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("differs from the approved digest"),
        "{}",
        text(&out)
    );
    assert!(!ledger.exists(), "a refused start writes nothing");

    // `lock` accepts the reviewed change; `--check` passes again.
    let out = copy.xtask(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = copy.xtask(&["--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A tool that claims readOnlyHint while its handler writes: a violation, not a warning.
    copy.edit(
        TOOLS,
        "title = \"Write note\",\n        read_only_hint = false,",
        "title = \"Write note\",\n        read_only_hint = true,",
    );
    let before = copy.lock_bytes();
    let out = copy.xtask(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("VIOLATION write_note") && stdout.contains("readOnlyHint"),
        "{}",
        text(&out)
    );
    assert_eq!(
        copy.lock_bytes(),
        before,
        "a refused lock must not touch toolgate.lock"
    );
    let out = copy.xtask(&["--check"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("VIOLATION write_note"),
        "{}",
        text(&out)
    );

    // Usage errors exit 2.
    let out = copy.xtask(&["--format", "yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
