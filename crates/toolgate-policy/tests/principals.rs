//! `principals.<p>`: per-principal allow/deny and argument rules merged with the top level.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Map, Value, json};
use toolgate_policy::{Decision, Policy, Principal, ToolDenial};

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().expect("object")
}

fn policy() -> Policy {
    Policy::from_json(
        &json!({
            "version": 1,
            "allow": ["read", "write", "send"],
            "deny": ["nuke"],
            "arg_rules": {"write": {"text": {"max_len": 10}}},
            "principals": {
                "alice@example.com": {
                    "allow": ["admin", "nuke"],
                    "deny": ["send"],
                    "arg_rules": {
                        "write": {"text": {"pattern": "[a-z ]*"}, "tag": {"enum": ["a", "b"], "optional": true}},
                        "admin": {"level": {"minimum": 1, "maximum": 3}}
                    }
                },
                "bob": {"deny": ["write"]},
                "svc:batch-1": {}
            }
        })
        .to_string(),
    )
    .expect("loads")
}

#[test]
fn principal_allow_and_deny_merge_with_the_top_level() {
    let p = policy();
    let alice = "alice@example.com";
    // Own allow adds tools; global deny still wins over it.
    assert!(p.visible_for(alice, "admin") && !p.visible("admin"));
    assert!(!p.visible_for(alice, "nuke"));
    assert_eq!(p.decide_for(alice, "nuke", None).rule(), "deny");
    // Own deny removes tools the top level allows.
    assert!(!p.visible_for(alice, "send") && p.visible("send"));
    assert_eq!(
        p.decide_for(alice, "send", None),
        Decision::DenyTool(ToolDenial::PrincipalDenyList {
            principal: alice.to_owned()
        })
    );
    assert_eq!(
        p.decide_for(alice, "send", None).rule(),
        "principals.alice@example.com.deny"
    );
    assert_eq!(
        p.decide_for("bob", "write", None).rule(),
        "principals.bob.deny"
    );
    assert!(p.visible_for("bob", "read") && !p.visible_for("bob", "admin"));
    assert_eq!(p.decide_for("bob", "admin", None).rule(), "default_deny");
    // An empty section is the top-level policy.
    for tool in ["read", "write", "send", "admin", "nuke", "other"] {
        assert_eq!(
            p.visible_for("svc:batch-1", tool),
            p.visible(tool),
            "{tool}"
        );
    }
    let names: Vec<&str> = p.principals().collect();
    assert_eq!(names, ["alice@example.com", "bob", "svc:batch-1"]);
}

#[test]
fn principal_rules_apply_after_the_top_level_rules() {
    let p = policy();
    let alice = "alice@example.com";
    assert!(
        p.decide_for(alice, "write", Some(&args(json!({"text": "hello"}))))
            .is_allow()
    );
    // The top-level rule is checked first and reported with its own id.
    assert_eq!(
        p.decide_for(alice, "write", Some(&args(json!({"text": "HELLO WORLD!"}))))
            .rule(),
        "arg_rules.write.text.max_len"
    );
    let d = p.decide_for(alice, "write", Some(&args(json!({"text": "HELLO"}))));
    assert_eq!(
        d.rule(),
        "principals.alice@example.com.arg_rules.write.text.pattern"
    );
    let Decision::DenyArgs(v) = d else { panic!() };
    assert_eq!(v.principal.as_deref(), Some(alice));
    assert!(
        v.message()
            .contains("principals.alice@example.com.arg_rules.write.text.pattern")
    );
    assert!(!v.message().contains("HELLO"));
    assert_eq!(v.details()["principal"], alice);
    assert_eq!(
        v.details()["rule"],
        "principals.alice@example.com.arg_rules.write.text.pattern"
    );
    // Optional principal rule: absent passes, present must be listed.
    assert_eq!(
        p.decide_for(
            alice,
            "write",
            Some(&args(json!({"text": "hi", "tag": "c"})))
        )
        .rule(),
        "principals.alice@example.com.arg_rules.write.tag.enum"
    );
    assert!(
        p.decide_for(
            alice,
            "write",
            Some(&args(json!({"text": "hi", "tag": "b"})))
        )
        .is_allow()
    );
    // Other principals and the top level do not see alice's rules.
    assert!(
        p.decide("write", Some(&args(json!({"text": "HELLO"}))))
            .is_allow()
    );
    assert!(p.decide_for("bob", "read", None).is_allow());
    assert!(
        p.decide_for(
            "svc:batch-1",
            "write",
            Some(&args(json!({"text": "HELLO"})))
        )
        .is_allow()
    );
    assert_eq!(
        p.decide_for(alice, "admin", Some(&args(json!({"level": 4}))))
            .rule(),
        "principals.alice@example.com.arg_rules.admin.level.maximum"
    );
    assert!(
        p.decide_for(alice, "admin", Some(&args(json!({"level": 2}))))
            .is_allow()
    );
    assert!(p.principal_arg_rules(alice, "admin").is_some());
    assert!(p.principal_arg_rules("bob", "admin").is_none());
}

#[test]
fn unknown_principals_get_the_top_level_policy() {
    let p = policy();
    for who in ["carol", "", "not a valid name/", "ALICE@example.com"] {
        for tool in ["read", "write", "send", "admin", "nuke", "other"] {
            assert_eq!(p.visible_for(who, tool), p.visible(tool), "{who} {tool}");
            for a in [
                json!({}),
                json!({"text": "HELLO"}),
                json!({"text": "x".repeat(11)}),
            ] {
                assert_eq!(
                    p.decide_for(who, tool, Some(&args(a.clone()))),
                    p.decide(tool, Some(&args(a))),
                    "{who} {tool}"
                );
            }
        }
    }
}

#[test]
fn path_rules_of_a_principal() {
    let p = Policy::from_json(
        &json!({"version": 1, "allow": ["cp"],
                "arg_rules": {"cp": {"src": {"path": {"roots": ["/data"]}}}},
                "principals": {"p": {"arg_rules": {"cp": {"dst": {"path": {"roots": ["/data/p", "/tmp"]}}}}}}})
        .to_string(),
    )
    .expect("loads");
    let top: Vec<&str> = p
        .path_rules(None, "cp")
        .into_iter()
        .map(|(f, _)| f)
        .collect();
    assert_eq!(top, ["src"]);
    let own = p.path_rules(Some("p"), "cp");
    assert_eq!(own.len(), 2);
    assert_eq!(own[1].0, "dst");
    assert_eq!(own[1].1.roots(), ["/data/p", "/tmp"]);
    assert!(p.path_rules(Some("unknown"), "cp").len() == 1);
    assert_eq!(
        p.decide_for(
            "p",
            "cp",
            Some(&args(json!({"src": "a", "dst": "/data/q"})))
        )
        .rule(),
        "principals.p.arg_rules.cp.dst.path"
    );
}

#[test]
fn principal_names_follow_the_grammar() {
    // Identity keys: a name, in a tenant, of an issuer (docs/http.md, "Identities").
    for ok in [
        "a",
        "alice@example.com",
        "svc:x-1_2.3",
        &"p".repeat(128),
        "acme/alice",
        "https://idp.example#alice",
        "https://idp.example/realm#acme/alice",
    ] {
        assert_eq!(Principal::new(ok).expect("valid").as_str(), ok);
    }
    for bad in ["", "a b", "a/b/c", "#a", "i#a#b", "é", &"p".repeat(129)] {
        let e = Principal::new(bad).expect_err("invalid").to_string();
        assert!(e.contains("1 to 128 characters"), "{e}");
    }
}

#[test]
fn fingerprint_includes_principal_sections_that_mention_the_tool() {
    let base = json!({"version": 1, "allow": ["a", "b"]});
    let plain = Policy::from_json(&base.to_string()).expect("loads");
    let mut with = base.clone();
    with["principals"] = json!({"p": {"deny": ["a"]}});
    let with = Policy::from_json(&with.to_string()).expect("loads");
    assert_ne!(plain.fingerprint("a"), with.fingerprint("a"));
    // `b` is not mentioned by the section: unchanged.
    assert_eq!(plain.fingerprint("b"), with.fingerprint("b"));
    let mut rules = base;
    rules["principals"] = json!({"p": {"arg_rules": {"b": {"f": {"optional": true}}}}});
    let rules = Policy::from_json(&rules.to_string()).expect("loads");
    assert_ne!(plain.fingerprint("b"), rules.fingerprint("b"));
    assert_eq!(plain.fingerprint("a"), rules.fingerprint("a"));
}
