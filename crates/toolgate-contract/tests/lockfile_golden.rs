//! The golden lockfile: deterministic bytes, a stable layout, and a lossless round trip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod contract_support;

use contract_support::{
    fixtures_dir, sample_server, sample_specs, tool_digest_from_sections, tool_from_spec,
};
use serde_json::Value;
use toolgate_canon::{Sha256Digest, canonical_value};
use toolgate_contract::contract::ServerContract;
use toolgate_contract::lockfile::{LOCKFILE_VERSION, Lockfile};

const VERSION: &str = "0.1.0";

#[test]
fn golden_lockfile_is_byte_identical() {
    let lock = Lockfile::new(sample_server(), VERSION);
    let rendered = lock.render();
    assert_eq!(rendered, lock.render(), "two renders differ");
    // Registration order does not matter.
    let reversed = ServerContract::new(
        "toolgate-server",
        sample_specs().iter().rev().map(tool_from_spec),
    )
    .unwrap();
    assert_eq!(Lockfile::new(reversed, VERSION).render(), rendered);

    let path = fixtures_dir().join("golden.lock");
    if std::env::var_os("UPDATE_EXPECT").is_some_and(|v| v == "1") {
        std::fs::write(&path, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_EXPECT=1 to create it",
            path.display()
        )
    });
    assert!(
        expected == rendered,
        "{} differs from the rendered lockfile; if the change is intended, rerun with UPDATE_EXPECT=1 and review the diff",
        path.display()
    );
}

#[test]
fn render_parse_round_trip_is_lossless() {
    let lock = Lockfile::new(sample_server(), VERSION);
    let parsed = Lockfile::parse(&lock.render()).unwrap();
    assert_eq!(parsed, lock);
    assert_eq!(parsed.render(), lock.render());
    assert_eq!(parsed.toolgate_version(), VERSION);
    assert_eq!(parsed.integrity_digest(), lock.contract().digest());
}

#[test]
fn golden_file_parses_to_the_sample_server() {
    let text = std::fs::read_to_string(fixtures_dir().join("golden.lock")).unwrap();
    let lock = Lockfile::parse(&text).unwrap();
    assert_eq!(lock.contract(), &sample_server());
}

#[test]
fn layout_is_pretty_canonical_json() {
    let text = Lockfile::new(sample_server(), VERSION).render();
    assert!(text.ends_with("}\n") && !text.ends_with("\n\n"));
    assert!(!text.contains('\t') && !text.contains('\r'));
    for line in text.lines() {
        let spaces = line.len() - line.trim_start_matches(' ').len();
        assert_eq!(spaces % 2, 0, "odd indentation: {line:?}");
    }
    // Without the indentation, the file is exactly the canonical JSON of its content: strings in
    // this fixture hold no ": " or newline, so removing layout whitespace is safe here.
    let value: Value = serde_json::from_str(&text).unwrap();
    let compact: String = text
        .lines()
        .map(|l| l.trim_start().replace("\": ", "\":"))
        .collect();
    assert_eq!(compact.as_bytes(), canonical_value(&value).as_slice());
    assert_eq!(value["lockfileVersion"], LOCKFILE_VERSION);
    assert_eq!(value["toolgateVersion"], VERSION);
}

/// The digests written in the file follow the documented layout, recomputed here independently.
#[test]
fn stored_digests_follow_the_documented_layout() {
    let lock = Lockfile::new(sample_server(), VERSION);
    let value: Value = serde_json::from_str(&lock.render()).unwrap();
    let mut tool_hexes = serde_json::Map::new();
    for (name, entry) in value["tools"].as_object().unwrap() {
        let entry = entry.as_object().unwrap();
        for section in ["behavior", "entitlements", "surface", "tokenEconomics"] {
            assert_eq!(
                entry["sectionDigests"][section],
                format!("sha256:{}", Sha256Digest::of_json(&entry[section]).to_hex())
            );
        }
        let digest = tool_digest_from_sections(entry);
        assert_eq!(
            entry["integrityDigest"],
            format!("sha256:{}", digest.to_hex())
        );
        assert_eq!(lock.contract().tools[name].digest(), digest);
        let schema = &entry["surface"]["inputSchema"];
        assert_eq!(
            entry["surface"]["inputSchemaDigest"],
            format!("sha256:{}", Sha256Digest::of_json(schema).to_hex())
        );
        tool_hexes.insert(name.clone(), Value::String(digest.to_hex()));
    }
    let server = Sha256Digest::of_json(&serde_json::json!({
        "serverName": "toolgate-server",
        "tools": tool_hexes,
    }));
    assert_eq!(
        value["integrityDigest"],
        format!("sha256:{}", server.to_hex())
    );
    assert_eq!(lock.integrity_digest(), server);
}

#[test]
fn toolgate_version_is_not_digested() {
    let a = Lockfile::new(sample_server(), "0.1.0");
    let b = Lockfile::new(sample_server(), "9.9.9");
    assert_eq!(a.integrity_digest(), b.integrity_digest());
    assert_ne!(a.render(), b.render());
}

/// The lockfile writer goes through the storage floor: two syncs, and a failure at any step
/// leaves the old lockfile whole and no temporary file.
#[test]
fn write_lockfile_is_durable_and_fails_cleanly() {
    use std::sync::Arc;
    use toolgate_storage::{FaultyStorage, FsStorage, Op};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.lock");
    let storage = FaultyStorage::new(Arc::new(FsStorage));
    let lock = Lockfile::new(sample_server(), VERSION);
    toolgate_contract::check::write_lockfile(&storage, &path, &lock).unwrap();
    assert_eq!(storage.syncs(), 2);
    let written = std::fs::read_to_string(&path).unwrap();
    assert_eq!(written, lock.render());
    let other = Lockfile::new(sample_server(), "9.9.9");
    for op in [Op::Write, Op::FsyncFile, Op::Rename] {
        storage.fail_nth(op, 1);
        let error = toolgate_contract::check::write_lockfile(&storage, &path, &other).unwrap_err();
        assert!(
            error.to_string().contains("injected fault"),
            "{op:?}: {error}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), written, "{op:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "{op:?}");
    }
}
