//! Shared helpers for the contract, lockfile and diff tests: tool specs, the sample server, and an
//! independent implementation of the documented digest layout.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::path::PathBuf;

use serde_json::{Map, Value, json};
use toolgate_canon::Sha256Digest;
use toolgate_contract::contract::{ServerContract, ToolContract};
use toolgate_contract::{Annotations, Entitlements, HandlerFacts, ToolDefinition};

/// `fixtures/contract` at the workspace root.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/contract")
}

/// The policy fingerprint used for a policy text in tests.
pub fn fingerprint(policy: &str) -> Sha256Digest {
    Sha256Digest::of(policy.as_bytes())
}

/// Definition and facts from a compact JSON spec (the format of `fixtures/contract/diff/cases.json`):
/// `name`, `description`, `inputSchema`, `outputSchema`, `annotations` (camelCase hints, each
/// optional), `gateStages`, `policy` (text hashed into the fingerprint), `entitlements` (family
/// names as in the lockfile), `evasion`, `unresolved`.
pub fn parts_from_spec(spec: &Value) -> (ToolDefinition, HandlerFacts) {
    let hint = |name: &str| spec["annotations"].get(name).and_then(Value::as_bool);
    let def = ToolDefinition {
        name: spec["name"].as_str().expect("spec has a name").to_owned(),
        description: spec
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input_schema: spec["inputSchema"].clone(),
        output_schema: spec.get("outputSchema").filter(|v| !v.is_null()).cloned(),
        annotations: Annotations {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
            idempotent: hint("idempotentHint"),
            open_world: hint("openWorldHint"),
        },
    };
    let families: Vec<&str> = spec
        .get("entitlements")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_str().expect("family name")).collect())
        .unwrap_or_default();
    let has = |name: &str| families.contains(&name);
    let strings = |key: &str| -> Vec<String> {
        spec.get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().expect("string").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let facts = HandlerFacts {
        gate_stages: strings("gateStages"),
        policy_fingerprint: fingerprint(spec.get("policy").and_then(Value::as_str).unwrap_or("")),
        entitlements: Entitlements {
            filesystem_read: has("filesystemRead"),
            filesystem_write: has("filesystemWrite"),
            network: has("network"),
            subprocess: has("subprocess"),
            crypto: has("crypto"),
            unsafe_ffi: has("unsafeFfi"),
            environment: has("environment"),
        },
        evasion: strings("evasion"),
        unresolved: strings("unresolved"),
    };
    (def, facts)
}

pub fn tool_from_spec(spec: &Value) -> ToolContract {
    let (def, facts) = parts_from_spec(spec);
    ToolContract::build(&def, &facts).expect("spec builds")
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let map = target.as_object_mut().expect("object");
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

const STAGES: &[&str] = &["list_filter", "call_decide", "arg_rules", "permit", "audit"];

/// The three tools of the reference server, as fixed specs.
pub fn sample_specs() -> Vec<Value> {
    vec![
        json!({
            "name": "write_note",
            "description": "Store a note under a request id. Calling again with the same request id and text is a replay, not a second write.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "request_id": {"type": "string", "description": "Idempotency key, at least 8 characters.", "minLength": 8},
                    "text": {"type": "string", "maxLength": 2000}
                },
                "required": ["request_id", "text"],
                "additionalProperties": false
            },
            "outputSchema": {
                "type": "object",
                "properties": {
                    "request_id": {"type": "string"},
                    "status": {"type": "string", "enum": ["committed", "replay"]}
                },
                "required": ["request_id", "status"]
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
            "gateStages": STAGES,
            "policy": "allow write_note; request_id min_len 8; text max_len 2000",
            "entitlements": ["filesystemRead", "filesystemWrite", "crypto"]
        }),
        json!({
            "name": "read_ledger",
            "description": "List every stored note, sorted by file name.",
            "inputSchema": {"type": "object", "properties": {}},
            "outputSchema": {
                "type": "object",
                "properties": {
                    "notes": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"request_id": {"type": "string"}, "text": {"type": "string"}},
                            "required": ["request_id", "text"]
                        }
                    }
                },
                "required": ["notes"]
            },
            "annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
            "gateStages": STAGES,
            "policy": "allow read_ledger",
            "entitlements": ["filesystemRead"]
        }),
        json!({
            "name": "rm_rf",
            "description": "Remove a path recursively (denied by the shipped policy; never deletes anything).",
            "inputSchema": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"]
            },
            "gateStages": STAGES,
            "policy": "deny rm_rf",
            "entitlements": [],
            "unresolved": ["self.client.send", "self.backup.remove"],
            "evasion": ["char_codes", "base64_blob", "char_codes"]
        }),
    ]
}

pub fn sample_server() -> ServerContract {
    ServerContract::new("toolgate-server", sample_specs().iter().map(tool_from_spec))
        .expect("sample server builds")
}

/// SHA-256 of canonical `{section: hex}`: the documented tool digest, written independently.
pub fn tool_digest_from_sections(sections: &Map<String, Value>) -> Sha256Digest {
    let mut hexes = Map::new();
    for name in ["behavior", "entitlements", "surface", "tokenEconomics"] {
        hexes.insert(
            name.to_owned(),
            Value::String(Sha256Digest::of_json(&sections[name]).to_hex()),
        );
    }
    Sha256Digest::of_json(&Value::Object(hexes))
}

/// Recomputes every digest of a lockfile document from its content, as the documentation
/// describes, so that a test can make a consistent edit (what a careful attacker would do).
pub fn rehash(doc: &mut Value) {
    let mut tool_hexes = Map::new();
    let tools = doc["tools"].as_object_mut().expect("tools");
    for (name, entry) in tools.iter_mut() {
        let entry = entry.as_object_mut().expect("tool entry");
        let mut section_digests = Map::new();
        for section in ["behavior", "entitlements", "surface", "tokenEconomics"] {
            section_digests.insert(
                section.to_owned(),
                Value::String(format!(
                    "sha256:{}",
                    Sha256Digest::of_json(&entry[section]).to_hex()
                )),
            );
        }
        entry.insert("sectionDigests".to_owned(), Value::Object(section_digests));
        let digest = tool_digest_from_sections(entry);
        entry.insert(
            "integrityDigest".to_owned(),
            json!(format!("sha256:{}", digest.to_hex())),
        );
        tool_hexes.insert(name.clone(), Value::String(digest.to_hex()));
    }
    let server = Sha256Digest::of_json(&json!({
        "serverName": doc["serverName"],
        "tools": tool_hexes,
    }));
    doc["integrityDigest"] = json!(format!("sha256:{}", server.to_hex()));
}
