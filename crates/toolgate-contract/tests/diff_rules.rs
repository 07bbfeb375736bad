//! Diff verdicts, data-driven from `fixtures/contract/diff/cases.json`, plus the completeness
//! property: two contracts with different digests never produce an empty diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod contract_support;

use std::collections::BTreeSet;

use contract_support::{fixtures_dir, merge_patch, sample_server, tool_from_spec};
use serde_json::Value;
use toolgate_contract::contract::{ServerContract, ToolContract};
use toolgate_contract::diff::{Change, POLICY_RULES, RULES, Verdict, diff, worst};

struct Cases {
    base: Value,
    cases: Vec<Value>,
}

fn load() -> Cases {
    let text = std::fs::read_to_string(fixtures_dir().join("diff/cases.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    Cases {
        base: doc["base"].clone(),
        cases: doc["cases"].as_array().unwrap().clone(),
    }
}

fn patched(base: &Value, patch: &Value) -> Value {
    let mut spec = base.clone();
    merge_patch(&mut spec, patch);
    spec
}

fn server(name: &str, base: &Value, patch: &Value) -> ServerContract {
    let tools: Vec<ToolContract> = if patch.is_null() {
        Vec::new()
    } else {
        vec![tool_from_spec(&patched(base, patch))]
    };
    ServerContract::new(name, tools).unwrap()
}

fn line(change: &Change) -> String {
    let tool = if change.tool.is_empty() {
        "-"
    } else {
        &change.tool
    };
    format!("{} {} {}", change.verdict, tool, change.rule)
}

/// The one check: the diff from `old` to `new` is exactly `expected`, in order.
fn check(case: &str, old: &ServerContract, new: &ServerContract, expected: &[String]) {
    let changes = diff(old, new);
    let got: Vec<String> = changes.iter().map(line).collect();
    assert_eq!(
        got,
        expected,
        "case {case:?}\nchanges:\n{}",
        changes
            .iter()
            .map(|c| format!("  {c}\n"))
            .collect::<String>()
    );
    // Determinism and the digest link.
    assert_eq!(
        diff(old, new),
        changes,
        "case {case:?}: diff is not deterministic"
    );
    assert_eq!(
        old.digest() == new.digest(),
        changes.is_empty(),
        "case {case:?}: digests and diff disagree"
    );
    assert!(changes.iter().all(|c| !c.detail.is_empty()));
}

#[test]
fn every_case_in_the_table() {
    let cases = load();
    assert!(cases.cases.len() >= 60);
    for case in &cases.cases {
        let name = case["case"].as_str().unwrap();
        let old = server(
            case["oldServer"].as_str().unwrap_or("s"),
            &cases.base,
            &case["old"],
        );
        let new = server(
            case["newServer"].as_str().unwrap_or("s"),
            &cases.base,
            &case["new"],
        );
        let expected: Vec<String> = case["expected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        check(name, &old, &new, &expected);
    }
}

/// One fixture case per rule: every rule (except the safety nets no definition can reach) is
/// exercised by the table, and the table uses no rule that is not documented in RULES.
#[test]
fn the_table_covers_every_rule() {
    let cases = load();
    let used: BTreeSet<String> = cases
        .cases
        .iter()
        .flat_map(|c| c["expected"].as_array().unwrap().clone())
        .map(|v| v.as_str().unwrap().rsplit(' ').next().unwrap().to_owned())
        .collect();
    let known: BTreeSet<String> = RULES.iter().map(|r| r.id.to_owned()).collect();
    for rule in &used {
        assert!(
            known.contains(rule),
            "fixture uses undocumented rule {rule}"
        );
    }
    let safety_nets = [
        "surface.changed",
        "behavior.changed",
        "economics.changed",
        "entitlements.changed",
    ];
    for rule in RULES {
        if !safety_nets.contains(&rule.id) {
            assert!(
                used.contains(rule.id),
                "no fixture case for rule {}",
                rule.id
            );
        }
    }
    // Every fixture line's verdict is the rule's verdict.
    for case in &cases.cases {
        for line in case["expected"].as_array().unwrap() {
            let line = line.as_str().unwrap();
            let verdict = line.split(' ').next().unwrap();
            let rule = line.rsplit(' ').next().unwrap();
            let documented = RULES.iter().find(|r| r.id == rule).unwrap();
            assert_eq!(documented.verdict.as_str(), verdict, "{line}");
        }
    }
}

#[test]
fn rule_ids_are_unique_and_documented() {
    let all: Vec<_> = RULES.iter().chain(POLICY_RULES).collect();
    let ids: BTreeSet<&str> = all.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), all.len());
    let doc = std::fs::read_to_string(fixtures_dir().join("../../docs/lockfile.md")).unwrap();
    for rule in all {
        let row = doc
            .lines()
            .find(|l| l.contains(&format!("`{}`", rule.id)))
            .unwrap_or_else(|| panic!("docs/lockfile.md does not list `{}`", rule.id));
        assert!(
            row.contains(rule.verdict.as_str()),
            "docs/lockfile.md gives `{}` another verdict: {row}",
            rule.id
        );
    }
}

/// Any two variants drawn from the table (and their compositions) with different digests yield
/// a non-empty diff, and equal digests an empty one.
#[test]
fn different_digests_always_yield_a_non_empty_diff() {
    let cases = load();
    let mut specs = vec![cases.base.clone()];
    for case in &cases.cases {
        for side in ["old", "new"] {
            if !case[side].is_null() {
                specs.push(patched(&cases.base, &case[side]));
            }
        }
    }
    // Compositions of two patches give variants that differ in several places at once.
    let patches: Vec<&Value> = cases
        .cases
        .iter()
        .map(|c| &c["new"])
        .filter(|p| !p.is_null())
        .collect();
    for (i, a) in patches.iter().enumerate() {
        let b = patches[(i * 7 + 3) % patches.len()];
        let mut spec = patched(&cases.base, a);
        merge_patch(&mut spec, b);
        spec["name"] = cases.base["name"].clone();
        specs.push(spec);
    }
    let servers: Vec<(ServerContract, _)> = specs
        .iter()
        .map(|s| {
            let server = ServerContract::new("s", [tool_from_spec(s)]).unwrap();
            let digest = server.digest();
            (server, digest)
        })
        .collect();
    let mut pairs = 0;
    for (old, old_digest) in &servers {
        for (new, new_digest) in &servers {
            let changes = diff(old, new);
            assert_eq!(old_digest == new_digest, changes.is_empty(), "{changes:?}");
            pairs += 1;
        }
    }
    assert!(pairs > 10_000);
}

/// The safety net: a difference no rule understands still produces a change.
#[test]
fn unclassified_surface_difference_falls_back() {
    let cases = load();
    let t = tool_from_spec(&cases.base);
    let mut renamed_spec = cases.base.clone();
    renamed_spec["name"] = "u".into();
    let u = tool_from_spec(&renamed_spec);
    // A contract whose surface was swapped in from another tool under the same key.
    let swapped = ToolContract {
        surface: u.surface.clone(),
        ..t.clone()
    };
    let old = ServerContract {
        server_name: "s".into(),
        tools: [("t".to_owned(), t)].into(),
    };
    let new = ServerContract {
        server_name: "s".into(),
        tools: [("t".to_owned(), swapped)].into(),
    };
    let changes = diff(&old, &new);
    assert_eq!(
        changes.iter().map(line).collect::<Vec<_>>(),
        ["RISKY t surface.changed"]
    );
}

#[test]
fn order_and_worst() {
    let cases = load();
    let mut spec = patched(
        &cases.base,
        &serde_json::json!({"description": "x", "entitlements": [], "evasion": ["char_codes"]}),
    );
    let old = ServerContract::new("s", [tool_from_spec(&cases.base)]).unwrap();
    spec["inputSchema"]["required"] = serde_json::json!(["id", "mode", "text"]);
    let mut other = cases.base.clone();
    other["name"] = "a_new_tool".into();
    let new = ServerContract::new("s", [tool_from_spec(&spec), tool_from_spec(&other)]).unwrap();
    let changes = diff(&old, &new);
    let verdicts: Vec<Verdict> = changes.iter().map(|c| c.verdict).collect();
    let mut sorted = verdicts.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(verdicts, sorted);
    assert_eq!(worst(&changes), Some(Verdict::Breaking));
    assert_eq!(worst(&[]), None);
    assert!(
        Verdict::Cosmetic < Verdict::Safe
            && Verdict::Safe < Verdict::Risky
            && Verdict::Risky < Verdict::Breaking
    );
    assert_eq!(Verdict::Breaking.to_string(), "BREAKING");
    assert_eq!(Verdict::Cosmetic.as_str(), "COSMETIC");
    // The sample server against itself: nothing.
    assert!(diff(&sample_server(), &sample_server()).is_empty());
}

/// A change serializes with the verdict in capitals, for `--format json`.
#[test]
fn change_serializes() {
    let cases = load();
    let old = server("s", &cases.base, &Value::Null);
    let new = server("s", &cases.base, &serde_json::json!({}));
    let json = serde_json::to_value(&diff(&old, &new)[0]).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"tool": "t", "verdict": "SAFE", "rule": "tool.added", "detail": "tool added"})
    );
}
