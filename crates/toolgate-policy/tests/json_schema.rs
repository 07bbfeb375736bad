//! The policy format's JSON Schema: `schemas/policy.schema.json` is what the types generate
//! (`TOOLGATE_UPDATE_SCHEMA=1` rewrites it), every policy file in the repository validates against
//! it, and what it refuses the loader refuses too (it may accept more: the loader checks names,
//! regexes and reachability).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolgate_policy::{Policy, json_schema};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn committed_path() -> PathBuf {
    workspace().join("schemas/policy.schema.json")
}

#[test]
fn the_committed_schema_is_the_generated_one() {
    let generated = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
    let path = committed_path();
    if std::env::var_os("TOOLGATE_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is not what the policy types generate; rerun with TOOLGATE_UPDATE_SCHEMA=1 and commit it",
        path.display()
    );
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&json_schema()).expect("the schema is a valid JSON Schema")
}

/// Every `*.json` policy the repository ships (fixtures, examples, the seed's) loads and
/// validates.
#[test]
fn every_policy_in_the_repository_validates() {
    let validator = validator();
    let mut files = vec![
        workspace().join("fixtures/policy.json"),
        workspace().join("examples/bookings/policy.json"),
    ];
    for dir in ["fixtures", "fixtures/policies"] {
        for entry in std::fs::read_dir(workspace().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with("policy") && name.ends_with(".json") || dir.ends_with("policies") {
                files.push(path);
            }
        }
    }
    files.sort();
    files.dedup();
    assert!(files.len() >= 6, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        Policy::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let value: Value = serde_json::from_str(&text).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }
}

#[test]
fn a_schema_key_is_accepted_and_the_policy_loads_as_without_it() {
    let with = json!({"$schema": toolgate_policy::SCHEMA_ID, "version": 1, "allow": ["t"]});
    assert!(validator().is_valid(&with));
    let policy = Policy::from_json(&with.to_string()).unwrap();
    assert!(policy.visible("t"));
    // Like every key added after the first release, it refuses an explicit null.
    assert!(Policy::from_json(r#"{"$schema":null,"version":1}"#).is_err());
}

/// Files both the schema and the loader refuse: what an editor flags is never a policy that
/// would have loaded.
#[test]
fn what_the_schema_refuses_the_loader_refuses() {
    let validator = validator();
    let refused = [
        json!({"allow": ["t"]}),
        json!({"version": 2, "allow": ["t"]}),
        json!({"version": 1, "allw": ["t"]}),
        json!({"version": 1, "allow": "t"}),
        json!({"version": 1, "allow": ["t"], "confirmation": null}),
        json!({"version": 1, "allow": ["t"], "confirmation": {"ttl": 5}}),
        json!({"version": 1, "allow": ["t"], "effects": {"t": "explode"}}),
        json!({"version": 1, "allow": ["t"], "arg_rules": {"t": {"a": {"pattern": null}}}}),
        json!({"version": 1, "allow": ["t"], "arg_rules": {"t": {"a": {"min_len": "3"}}}}),
        json!({"version": 1, "allow": ["t"], "idempotency": {"t": {"effect": "maybe"}}}),
        json!({"version": 1, "allow": ["t"], "rate_limits": {"tools": {"t": {"burst": 1}}}}),
        json!({"version": 1, "allow": ["t"], "proxy": {"host_requests": ["telepathy"]}}),
    ];
    for policy in refused {
        assert!(!validator.is_valid(&policy), "the schema accepts {policy}");
        assert!(
            Policy::from_json(&policy.to_string()).is_err(),
            "the loader accepts {policy}"
        );
    }
}
