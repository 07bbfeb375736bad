//! `Policy::decide` on a generated 1,000-rule policy (100 tools x 10 ruled fields mixing every
//! rule kind, plus a principal section), and decide + JSON Schema validation of the arguments.
//!
//! Run: `cargo bench -p toolgate-policy --bench decide -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Map, Value, json};
use toolgate_policy::{Decision, Policy};

const TOOLS: usize = 100;

/// Ten rules per tool, one or more of every kind.
fn field_rules() -> Value {
    json!({
        "request_id": {"min_len": 8, "max_len": 64},
        "text": {"max_len": 2000},
        "slug": {"pattern": "[a-z0-9_-]{1,32}"},
        "priority": {"enum": ["low", "normal", "high"]},
        "count": {"minimum": 1, "maximum": 100},
        "tags": {"max_items": 50},
        "file": {"path": {"roots": ["/srv/data", "/tmp/scratch"]}, "max_len": 4096},
        "note": {"max_len": 200, "optional": true},
        "ratio": {"minimum": 0, "maximum": 1.5},
        "flag": {"enum": [true, false]}
    })
}

fn policy() -> Policy {
    let tools: Vec<String> = (0..TOOLS).map(|i| format!("tool_{i:03}")).collect();
    let rules: Map<String, Value> = tools.iter().map(|t| (t.clone(), field_rules())).collect();
    let mut allow = tools.clone();
    allow.push("tool_denied".to_owned());
    let text = json!({
        "version": 1,
        "allow": allow,
        "deny": ["rm_rf", "tool_denied"],
        "arg_rules": rules,
        "effects": {"tool_000": "write"},
        "principals": {
            "alice@example.com": {"arg_rules": {"tool_050": {"text": {"max_len": 500}, "file": {"path": {"roots": ["/srv/data/alice"]}}}}}
        }
    })
    .to_string();
    let policy = Policy::from_json(&text).expect("bench policy loads");
    let ruled: usize = policy
        .allowed()
        .filter_map(|t| policy.arg_rules(t))
        .map(|r| r.len())
        .sum();
    assert_eq!(ruled, 1000, "the bench policy must hold 1,000 rules");
    policy
}

fn good_args() -> Map<String, Value> {
    json!({
        "request_id": "req-2024-000123",
        "text": "Quarterly numbers are in; see the attached ledger for the breakdown by region.",
        "slug": "q3-ledger_v2",
        "priority": "normal",
        "count": 12,
        "tags": ["finance", "q3", "ledger"],
        "file": "alice/reports/2024/q3.csv",
        "ratio": 0.75,
        "flag": true,
        "unruled": {"anything": [1, 2, 3]}
    })
    .as_object()
    .cloned()
    .expect("object")
}

/// A realistic input schema for the same ten-ish properties.
fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "request_id": {"type": "string", "minLength": 8, "maxLength": 64},
            "text": {"type": "string", "maxLength": 2000},
            "slug": {"type": "string", "pattern": "^[a-z0-9_-]{1,32}$"},
            "priority": {"type": "string", "enum": ["low", "normal", "high"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 100},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 50},
            "file": {"type": "string", "maxLength": 4096},
            "note": {"type": "string", "maxLength": 200},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1.5},
            "flag": {"type": "boolean"}
        },
        "required": ["request_id", "text", "slug", "priority", "count", "tags", "file", "ratio", "flag"],
        "additionalProperties": true
    })
}

fn bench(c: &mut Criterion) {
    let policy = policy();
    let good = good_args();
    let mut bad = good.clone();
    bad.insert("count".to_owned(), json!(101));
    assert!(policy.decide("tool_042", Some(&good)).is_allow());
    assert_eq!(
        policy.decide("tool_042", Some(&bad)).rule(),
        "arg_rules.tool_042.count.maximum"
    );
    assert!(matches!(
        policy.decide("tool_denied", Some(&good)),
        Decision::DenyTool(_)
    ));
    assert!(
        policy
            .decide_for("alice@example.com", "tool_050", Some(&good))
            .is_allow()
    );

    let mut group = c.benchmark_group("decide_1000_rules");
    group.bench_function("allowed_call", |b| {
        b.iter(|| black_box(policy.decide(black_box("tool_042"), Some(black_box(&good)))))
    });
    group.bench_function("denied_tool", |b| {
        b.iter(|| black_box(policy.decide(black_box("tool_denied"), Some(black_box(&good)))))
    });
    group.bench_function("argument_violation", |b| {
        b.iter(|| black_box(policy.decide(black_box("tool_042"), Some(black_box(&bad)))))
    });
    group.bench_function("allowed_call_for_principal", |b| {
        b.iter(|| {
            black_box(policy.decide_for(
                black_box("alice@example.com"),
                black_box("tool_050"),
                Some(black_box(&good)),
            ))
        })
    });

    let schema = input_schema();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let good_value = Value::Object(good.clone());
    assert!(validator.is_valid(&good_value));
    group.bench_function("allowed_call_with_schema_validation", |b| {
        b.iter(|| {
            let decision = policy.decide(black_box("tool_042"), Some(black_box(&good)));
            black_box(decision.is_allow() && validator.is_valid(black_box(&good_value)))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
