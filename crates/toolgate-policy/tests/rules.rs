//! One test per argument rule kind: a passing call, each violation, its rule id, a message that
//! names field, rule and fix without echoing the value, and the structured details.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::{Map, Value, json};
use toolgate_policy::{ArgType, ArgViolation, Decision, Policy, Violation};

fn policy(rules: Value) -> Policy {
    let text = json!({"version": 1, "allow": ["t"], "arg_rules": {"t": rules}}).to_string();
    Policy::from_json(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("test arguments must be an object"),
    }
}

fn allow(p: &Policy, arguments: Value) {
    let d = p.decide("t", Some(&args(arguments.clone())));
    assert_eq!(d, Decision::Allow, "{arguments}");
}

/// Asserts the call is refused by `rule_id`, that neither the message nor the details contain
/// `secret` (a rendering of the value), and returns the violation.
fn refuse(p: &Policy, arguments: Value, rule_id: &str, secret: &str) -> ArgViolation {
    let d = p.decide("t", Some(&args(arguments.clone())));
    assert_eq!(d.rule(), rule_id, "{arguments}");
    let Decision::DenyArgs(v) = d else {
        panic!("expected an argument violation for {arguments}")
    };
    assert_eq!(v.rule(), rule_id);
    let message = v.message();
    assert!(message.starts_with("Error:"), "{message}");
    assert!(message.contains(&format!("`{}`", v.field)), "{message}");
    assert!(message.contains(rule_id), "{message}");
    assert!(!secret.is_empty());
    assert!(
        !message.contains(secret),
        "message echoes the value: {message}"
    );
    let details = v.details();
    assert_eq!(details["error"], "argument_rejected");
    assert_eq!(details["tool"], "t");
    assert_eq!(details["field"], v.field.as_str());
    assert_eq!(details["rule"], rule_id);
    assert!(details["constraint"].is_object(), "{details}");
    assert!(details["fix"].as_str().is_some_and(|f| !f.is_empty()));
    assert!(
        !details.to_string().contains(secret),
        "details echo the value: {details}"
    );
    v
}

#[test]
fn length_rules() {
    let p = policy(json!({"s": {"min_len": 3, "max_len": 5}}));
    allow(&p, json!({"s": "abc"}));
    allow(&p, json!({"s": "ééééé"}));
    let v = refuse(&p, json!({"s": "zq"}), "arg_rules.t.s.min_len", "zq");
    assert_eq!(
        v.violation,
        Violation::TooShort {
            min_len: 3,
            actual: 2
        }
    );
    assert_eq!(v.details()["constraint"], json!({"min_len": 3}));
    assert_eq!(v.details()["received"], json!({"length": 2}));
    let v = refuse(
        &p,
        json!({"s": "zqzqzq"}),
        "arg_rules.t.s.max_len",
        "zqzqzq",
    );
    assert_eq!(v.details()["constraint"], json!({"max_len": 5}));
    let v = refuse(&p, json!({"s": 12345}), "arg_rules.t.s.type", "12345");
    assert_eq!(v.violation, Violation::NotString);
    assert_eq!(v.details()["constraint"], json!({"type": "string"}));
    let v = refuse(&p, json!({}), "arg_rules.t.s.type", "zqzq");
    assert_eq!(v.violation, Violation::Missing);
    assert_eq!(
        v.details()["constraint"],
        json!({"required": true, "type": "string"})
    );
}

#[test]
fn pattern_rule_matches_the_whole_string() {
    let p = policy(json!({"id": {"pattern": "[a-z]{3}-[0-9]+"}}));
    allow(&p, json!({"id": "abc-42"}));
    // A match inside the string is not enough: the pattern is anchored at both ends.
    let v = refuse(
        &p,
        json!({"id": "xabc-42"}),
        "arg_rules.t.id.pattern",
        "xabc-42",
    );
    assert!(matches!(v.violation, Violation::PatternMismatch { .. }));
    assert_eq!(
        v.details()["constraint"],
        json!({"pattern": "[a-z]{3}-[0-9]+"})
    );
    assert!(v.message().contains("[a-z]{3}-[0-9]+"));
    refuse(
        &p,
        json!({"id": "abc-42!"}),
        "arg_rules.t.id.pattern",
        "abc-42!",
    );
    // An alternation cannot escape the anchors.
    let p = policy(json!({"id": {"pattern": "a|b"}}));
    allow(&p, json!({"id": "b"}));
    refuse(&p, json!({"id": "bz"}), "arg_rules.t.id.pattern", "bz");
    refuse(&p, json!({"id": 7}), "arg_rules.t.id.type", "7");
    assert_eq!(
        p.arg_rules("t").expect("rules")["id"].pattern(),
        Some("a|b")
    );
}

#[test]
fn enum_rule_compares_canonical_json() {
    let p = policy(json!({"mode": {"enum": ["fast", "safe", 1, {"k": [1, 2]}]}}));
    allow(&p, json!({"mode": "safe"}));
    allow(&p, json!({"mode": 1.0}));
    allow(&p, json!({"mode": {"k": [1, 2]}}));
    let v = refuse(
        &p,
        json!({"mode": "reckless"}),
        "arg_rules.t.mode.enum",
        "reckless",
    );
    assert_eq!(
        v.details()["constraint"],
        json!({"enum": ["fast", "safe", 1, {"k": [1, 2]}]})
    );
    assert!(v.message().contains("\"fast\""), "{}", v.message());
    assert_eq!(v.expected, ArgType::Any);
    refuse(
        &p,
        json!({"mode": {"k": [2, 1]}}),
        "arg_rules.t.mode.enum",
        "[2,1]",
    );
    // An enum-only rule has no type of its own: a missing field is still `.type`.
    let v = refuse(&p, json!({}), "arg_rules.t.mode.type", "reckless");
    assert_eq!(v.violation, Violation::Missing);
    // Combined with string rules, the string rules are checked first.
    let p = policy(json!({"mode": {"enum": ["fast", "safe"], "max_len": 4}}));
    allow(&p, json!({"mode": "fast"}));
    refuse(
        &p,
        json!({"mode": "slowx"}),
        "arg_rules.t.mode.max_len",
        "slowx",
    );
    refuse(&p, json!({"mode": "slow"}), "arg_rules.t.mode.enum", "slow");
}

#[test]
fn number_rules_are_inclusive_and_exact() {
    let p = policy(json!({"n": {"minimum": -2.5, "maximum": 9007199254740993_u64}}));
    allow(&p, json!({"n": -2.5}));
    allow(&p, json!({"n": 0}));
    allow(&p, json!({"n": 9007199254740993_u64}));
    let v = refuse(&p, json!({"n": -2.75}), "arg_rules.t.n.minimum", "-2.75");
    assert!(matches!(v.violation, Violation::BelowMinimum { .. }));
    assert_eq!(v.details()["constraint"], json!({"minimum": -2.5}));
    // 2^53 + 2 is above 2^53 + 1 although both round to the same f64.
    let v = refuse(
        &p,
        json!({"n": 9007199254740994_u64}),
        "arg_rules.t.n.maximum",
        "9007199254740994",
    );
    assert!(matches!(v.violation, Violation::AboveMaximum { .. }));
    let v = refuse(&p, json!({"n": "5"}), "arg_rules.t.n.type", "\"5\"");
    assert_eq!(v.violation, Violation::NotNumber);
    assert!(v.message().contains("must be a number"), "{}", v.message());
    let p = policy(json!({"n": {"minimum": 1}}));
    allow(&p, json!({"n": 1e300}));
    refuse(&p, json!({"n": 0.999}), "arg_rules.t.n.minimum", "0.999");
    refuse(&p, json!({"n": -1e300}), "arg_rules.t.n.minimum", "1e300");
}

#[test]
fn max_items_rule() {
    let p = policy(json!({"ids": {"max_items": 2}}));
    allow(&p, json!({"ids": []}));
    allow(&p, json!({"ids": ["a", 1]}));
    let v = refuse(
        &p,
        json!({"ids": ["q1", "q2", "q3"]}),
        "arg_rules.t.ids.max_items",
        "q1",
    );
    assert_eq!(
        v.violation,
        Violation::TooManyItems {
            max_items: 2,
            actual: 3
        }
    );
    assert_eq!(v.details()["constraint"], json!({"max_items": 2}));
    assert_eq!(v.details()["received"], json!({"items": 3}));
    let v = refuse(&p, json!({"ids": "q1"}), "arg_rules.t.ids.type", "q1");
    assert_eq!(v.violation, Violation::NotArray);
}

#[test]
fn optional_fields_pass_when_absent_only() {
    let p = policy(
        json!({"note": {"optional": true, "max_len": 3}, "n": {"optional": true, "minimum": 0}}),
    );
    allow(&p, json!({}));
    assert_eq!(p.decide("t", None), Decision::Allow);
    allow(&p, json!({"note": "abc", "n": 0}));
    refuse(
        &p,
        json!({"note": "abcd"}),
        "arg_rules.t.note.max_len",
        "abcd",
    );
    // Present but null is present: it is not a string.
    refuse(&p, json!({"note": null}), "arg_rules.t.note.type", "null");
    refuse(&p, json!({"n": -1}), "arg_rules.t.n.minimum", "-1");
    // Without optional, absence breaks the rule.
    let p = policy(json!({"note": {"optional": false, "max_len": 3}}));
    refuse(&p, json!({}), "arg_rules.t.note.type", "abcd");
}

fn path_policy() -> Policy {
    policy(json!({"file": {"path": {"roots": ["/data/", "/srv//www"]}}}))
}

#[test]
fn path_rule_allows_inside_roots_and_normalises() {
    let p = path_policy();
    let rule = p.arg_rules("t").expect("rules")["file"]
        .path()
        .expect("path rule");
    assert_eq!(rule.roots(), ["/data", "/srv/www"]);
    let ok = |value: &str, expected: &str| {
        assert_eq!(
            rule.normalise(value),
            Ok(PathBuf::from(expected)),
            "{value}"
        );
        allow(&p, json!({ "file": value }));
    };
    ok("/data/a/b.txt", "/data/a/b.txt");
    ok("/data", "/data");
    ok("/data/./a//b/", "/data/a/b");
    ok("/data/a/../b", "/data/b");
    ok("notes/today.md", "/data/notes/today.md");
    ok(".", "/data");
    ok("a/../b", "/data/b");
    ok("/srv/www/index.html", "/srv/www/index.html");
    ok("../data/x", "/data/x");
    let v = refuse(
        &p,
        json!({"file": "/etc/passwd"}),
        "arg_rules.t.file.path",
        "passwd",
    );
    assert!(matches!(v.violation, Violation::PathEscapes { .. }));
    assert_eq!(
        v.details()["constraint"],
        json!({"roots": ["/data", "/srv/www"]})
    );
    let paths = p.path_rules(None, "t");
    assert_eq!(paths.len(), 1);
    assert_eq!(paths[0].0, "file");
}

#[test]
fn path_traversal_attempts_are_refused() {
    let p = path_policy();
    let rule = p.arg_rules("t").expect("rules")["file"]
        .path()
        .expect("path rule");
    for attempt in [
        "../",
        "..",
        "../../etc/passwd",
        "a/../../x",
        "/data/../etc",
        "/data/../../../../etc",
        "/data2",
        "/data2/x",
        "/dat",
        "//",
        "/",
        "//etc",
        "/srv/www/../www2",
        "a/../../../../../../..",
    ] {
        assert!(
            matches!(rule.normalise(attempt), Err(Violation::PathEscapes { .. })),
            "{attempt}"
        );
        // Short attempts ("/", "..") are substrings of any message; check the distinctive ones.
        let secret = if attempt.len() >= 5 { attempt } else { "zqzq" };
        refuse(
            &p,
            json!({ "file": attempt }),
            "arg_rules.t.file.path",
            secret,
        );
    }
    for bad in ["", "/data/a\0b", "\0"] {
        assert!(
            matches!(rule.normalise(bad), Err(Violation::BadPath { .. })),
            "{bad:?}"
        );
        let v = p.decide("t", Some(&args(json!({ "file": bad }))));
        assert_eq!(v.rule(), "arg_rules.t.file.path");
        let Decision::DenyArgs(v) = v else { panic!() };
        assert!(v.message().contains("empty or containing a NUL byte"));
    }
    // Combined with string rules.
    let p = policy(json!({"file": {"path": {"roots": ["/"]}, "max_len": 8, "pattern": "[a-z/]+"}}));
    allow(&p, json!({"file": "/etc/x"}));
    refuse(
        &p,
        json!({"file": "/etc/abcdefg"}),
        "arg_rules.t.file.max_len",
        "abcdefg",
    );
    refuse(
        &p,
        json!({"file": "/etc/X"}),
        "arg_rules.t.file.pattern",
        "/etc/X",
    );
    // The root `/` holds every absolute path but still refuses climbing above it.
    let rule = p.arg_rules("t").expect("rules")["file"]
        .path()
        .expect("path")
        .clone();
    assert_eq!(
        rule.normalise("/../x"),
        Err(Violation::PathEscapes {
            roots: rule.roots().to_vec().into()
        })
    );
    assert_eq!(rule.normalise("x/y/.."), Ok(PathBuf::from("/x")));
}

#[test]
fn rules_are_checked_in_field_order_and_first_failure_wins() {
    let p = policy(json!({"a": {"max_len": 1}, "b": {"minimum": 0}}));
    refuse(
        &p,
        json!({"a": "xyz", "b": -1}),
        "arg_rules.t.a.max_len",
        "xyz",
    );
    refuse(
        &p,
        json!({"a": "x", "b": -1}),
        "arg_rules.t.b.minimum",
        "-1",
    );
    // Unruled fields are not looked at.
    allow(&p, json!({"a": "x", "b": 0, "c": {"anything": true}}));
}
