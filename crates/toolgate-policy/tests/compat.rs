//! Policies that use none of the keys added after the first release keep their exact digests,
//! per-tool fingerprints and messages. The hex values were computed by the crate before those keys
//! existed (commit 2173c21); `toolgate.lock` depends on them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use toolgate_policy::{Decision, Policy};

const MIX: &str = r#"{"version":1,"allow":["a","b","c"],"deny":["c","d"],"arg_rules":{"a":{"x":{"min_len":1,"max_len":5},"y":{}}},"idempotency":{"b":{"effect":"unsafe","window_secs":60}}}"#;

const REFERENCE_AT_2173C21: &str = r#"{
  "version": 1,
  "allow": ["write_note", "read_ledger"],
  "deny": ["rm_rf"],
  "arg_rules": {
    "write_note": {
      "request_id": {"min_len": 8},
      "text": {"max_len": 2000}
    }
  },
  "idempotency": {
    "write_note": {
      "key_argument": "request_id",
      "effect": "idempotent",
      "replay_marker": {"pointer": "/status", "value": "replay"}
    }
  }
}
"#;

fn baseline() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    // (policy, tool or "digest", hex)
    // The reference policy as it was at that commit (fixtures/policy.json has since gained
    // `effects` and `kill_switch`, which change its digest on purpose).
    let reference = REFERENCE_AT_2173C21;
    let seed = include_str!("../../../fixtures/policies/seed.json");
    vec![
        (
            reference,
            "policy",
            "digest",
            "15efd1e7e356679e1203c809a09ccb7d6cc1dfb57a27c284037a0ef1838b0af6",
        ),
        (
            reference,
            "policy",
            "write_note",
            "78fef2c08e0a120892a6c4291c948a223e4f88568aa4457a8a401844809baab1",
        ),
        (
            reference,
            "policy",
            "read_ledger",
            "2bd666ddf8ccea9f0bc7d0ab6b13edd282dfa0c797705c8a0e9c0601fdba976a",
        ),
        (
            reference,
            "policy",
            "rm_rf",
            "21f4181363cf72017c3dd4f4d25294fe6f9cfb08511f68c0fbdbe485ecc1f6af",
        ),
        (
            reference,
            "policy",
            "other",
            "38c2cd6812fcdedffbf39e9ea91d06c4a775980e83fe65a5da672102c1df3009",
        ),
        (
            seed,
            "seed",
            "digest",
            "84963db833f3752cedddd17cb299aff394bda023b1ac368ceff89acd0c235806",
        ),
        (
            seed,
            "seed",
            "write_note",
            "430e668bb3c7ee2c4c02e4e81346a46e44ce3105b99eeb22c4fe2994ae9d52b7",
        ),
        (
            seed,
            "seed",
            "read_ledger",
            "2bd666ddf8ccea9f0bc7d0ab6b13edd282dfa0c797705c8a0e9c0601fdba976a",
        ),
        (
            MIX,
            "mix",
            "digest",
            "2daac2dd73d588a03623acd5358980c5c8d0bee3a5e2892bf6e5caab4a799cb0",
        ),
        (
            MIX,
            "mix",
            "a",
            "2bf737bd29fce6cbb3f419358a38ab299d9269353a686ae99d7f363fd60e6b52",
        ),
        (
            MIX,
            "mix",
            "b",
            "52be5cff23388a7a9e870ca630e902f4795182e2c746a9cdeb60ac66ef809c4a",
        ),
        (
            MIX,
            "mix",
            "c",
            "d5710ec22b61c0a5282e7ff7b64e6021a0851a00f378e843e4ab073766f09e5e",
        ),
        (
            MIX,
            "mix",
            "d",
            "24e1a21284925788f14402b92b92201bafafe7889c9ca09f89f86b41bafeb8f8",
        ),
        (
            MIX,
            "mix",
            "other",
            "38c2cd6812fcdedffbf39e9ea91d06c4a775980e83fe65a5da672102c1df3009",
        ),
    ]
}

#[test]
fn old_policies_keep_digests_and_fingerprints() {
    for (text, name, tool, hex) in baseline() {
        let policy = Policy::from_json(text).expect("loads");
        let got = if tool == "digest" {
            policy.digest().to_hex()
        } else {
            policy.fingerprint(tool).to_hex()
        };
        assert_eq!(got, hex, "{name} {tool}");
    }
}

#[test]
fn old_rules_keep_their_meaning_and_messages() {
    let policy = Policy::from_json(MIX).expect("loads");
    let args = |v: Value| v.as_object().cloned().expect("object");
    // An empty rule still requires a string.
    let d = policy.decide("a", Some(&args(json!({"x": "abc"}))));
    assert_eq!(d.rule(), "arg_rules.a.y.type");
    let d = policy.decide("a", Some(&args(json!({"x": "abc", "y": 3}))));
    let Decision::DenyArgs(v) = d else {
        panic!("expected an argument violation")
    };
    assert_eq!(
        v.message(),
        "Error: argument `y` of `a` must be a string (policy rule arg_rules.a.y.type); pass `y` as a string"
    );
    let d = policy.decide("a", Some(&args(json!({"y": ""}))));
    let Decision::DenyArgs(v) = d else {
        panic!("expected an argument violation")
    };
    assert_eq!(
        v.message(),
        "Error: argument `x` of `a` is required by policy rule arg_rules.a.x.type; pass `x` as a string"
    );
    let d = policy.decide("a", Some(&args(json!({"x": "", "y": ""}))));
    let Decision::DenyArgs(v) = d else {
        panic!("expected an argument violation")
    };
    assert_eq!(
        v.message(),
        "Error: argument `x` of `a` has 0 characters but policy rule arg_rules.a.x.min_len requires at least 1; pass a longer `x`"
    );
    let d = policy.decide("a", Some(&args(json!({"x": "toolong", "y": ""}))));
    let Decision::DenyArgs(v) = d else {
        panic!("expected an argument violation")
    };
    assert_eq!(
        v.message(),
        "Error: argument `x` of `a` has 7 characters but policy rule arg_rules.a.x.max_len allows at most 5; shorten `x`"
    );
    assert!(
        policy
            .decide("a", Some(&args(json!({"x": "ok", "y": ""}))))
            .is_allow()
    );
    assert_eq!(policy.decide("c", None).rule(), "deny");
    assert_eq!(policy.decide("zz", None).rule(), "default_deny");
    // Nothing new is reported for a policy without the new keys.
    assert_eq!(policy.principals().count(), 0);
    assert_eq!(policy.effect_class("a"), None);
    assert_eq!(policy.confirmation_ttl().as_secs(), 300);
    assert!(policy.batch("a").is_none() && policy.tool_rate("a").is_none());
    assert!(!policy.halt_exempt("a") && policy.untrusted_output("a").is_none());
    // With no principal sections, every principal gets the top-level policy.
    for tool in ["a", "b", "c", "d", "zz"] {
        assert_eq!(policy.visible_for("anyone", tool), policy.visible(tool));
        assert_eq!(
            policy.decide_for("anyone", tool, None),
            policy.decide(tool, None)
        );
    }
}
