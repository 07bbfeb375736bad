//! The per-tool and per-principal sections: effects, confirmation, batch, rate_limits,
//! kill_switch; their accessors, the pure batch check, and their place in fingerprints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Map, Value, json};
use toolgate_policy::{BatchCall, BatchProblem, EffectClass, HostRequest, Policy, Rate};

fn load(value: Value) -> Policy {
    Policy::from_json(&value.to_string()).unwrap_or_else(|e| panic!("{value}: {e}"))
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().expect("object")
}

#[test]
fn effects_classify_tools() {
    let p = load(
        json!({"version": 1, "allow": ["r", "w", "n", "k", "a", "d", "x"],
        "effects": {"r": "read", "w": "write", "n": "notify", "k": "wake", "a": "alert", "d": "delete"}}),
    );
    let expected = [
        ("r", EffectClass::Read, false),
        ("w", EffectClass::Write, false),
        ("n", EffectClass::Notify, true),
        ("k", EffectClass::Wake, true),
        ("a", EffectClass::Alert, true),
        ("d", EffectClass::Delete, true),
    ];
    for (tool, class, confirm) in expected {
        assert_eq!(p.effect_class(tool), Some(class));
        assert_eq!(class.needs_confirmation(), confirm, "{tool}");
        assert_eq!(class.is_read(), class == EffectClass::Read);
        assert_eq!(
            serde_json::to_value(class).expect("serializes"),
            json!(class.as_str())
        );
    }
    assert_eq!(p.effect_class("x"), None);
    assert_eq!(p.effect_class("unknown"), None);
}

#[test]
fn confirmation_ttl_defaults_to_five_minutes() {
    let p = load(json!({"version": 1}));
    assert_eq!(p.confirmation_ttl(), Duration::from_secs(300));
    let p = load(json!({"version": 1, "confirmation": {}}));
    assert_eq!(p.confirmation_ttl(), Duration::from_secs(300));
    let p = load(json!({"version": 1, "confirmation": {"ttl_secs": 86400}}));
    assert_eq!(p.confirmation_ttl(), Duration::from_secs(86400));
    let p = load(json!({"version": 1, "confirmation": {"ttl_secs": 1}}));
    assert_eq!(p.confirmation_ttl(), Duration::from_secs(1));
}

#[test]
fn rate_limits_per_tool_and_principal() {
    let p = load(json!({"version": 1, "allow": ["t", "u"],
        "rate_limits": {"tools": {"t": {"burst": 5, "per_minute": 60}},
                        "principals": {"alice@example.com": {"burst": 1, "per_minute": 10}}}}));
    assert_eq!(
        p.tool_rate("t"),
        Some(Rate {
            burst: 5,
            per_minute: 60
        })
    );
    assert_eq!(p.tool_rate("u"), None);
    let rate = p.principal_rate("alice@example.com").expect("set");
    assert_eq!((rate.burst, rate.per_minute), (1, 10));
    // A principal named here need not have a `principals` section.
    assert_eq!(p.principals().count(), 0);
    assert_eq!(p.principal_rate("bob"), None);
}

#[test]
fn kill_switch_exempts_read_tools_only() {
    let p = load(
        json!({"version": 1, "allow": ["r", "w"], "effects": {"r": "read", "w": "write"},
        "kill_switch": {"exempt": ["r"]}}),
    );
    assert!(p.halt_exempt("r"));
    assert!(!p.halt_exempt("w") && !p.halt_exempt("other"));
    let p = load(json!({"version": 1, "kill_switch": {}}));
    assert!(!p.halt_exempt("r"));
}

fn batch_policy() -> Policy {
    load(json!({"version": 1, "allow": ["del", "tag"],
        "batch": {"del": {}, "tag": {"ids_argument": "note_ids", "filter_argument": "where", "expected_count_argument": "n"}}}))
}

#[test]
fn batch_defaults_and_names() {
    let p = batch_policy();
    let b = p.batch("del").expect("set");
    assert_eq!(
        (
            b.ids_argument(),
            b.filter_argument(),
            b.expected_count_argument()
        ),
        ("ids", "filter", "expected_count")
    );
    let b = p.batch("tag").expect("set");
    assert_eq!(
        (
            b.ids_argument(),
            b.filter_argument(),
            b.expected_count_argument()
        ),
        ("note_ids", "where", "n")
    );
    assert!(p.batch("other").is_none());
}

#[test]
fn batch_check_accepts_ids_or_filter_with_count() {
    let p = batch_policy();
    let b = p.batch("del").expect("set");
    assert_eq!(
        b.check(Some(&args(json!({"ids": ["a", 7, -3]})))),
        Ok(BatchCall::Ids(vec![json!("a"), json!(7), json!(-3)]))
    );
    assert_eq!(
        b.check(Some(&args(json!({"ids": ["a", "b"], "expected_count": 2})))),
        Ok(BatchCall::Ids(vec![json!("a"), json!("b")]))
    );
    assert_eq!(
        b.check(Some(&args(
            json!({"filter": {"older_than": "30d"}, "expected_count": 0})
        ))),
        Ok(BatchCall::Filter {
            filter: json!({"older_than": "30d"}),
            expected_count: 0
        })
    );
    // JSON null counts as absent.
    assert_eq!(
        b.check(Some(&args(json!({"ids": ["a"], "filter": null})))),
        Ok(BatchCall::Ids(vec![json!("a")]))
    );
    let tag = p.batch("tag").expect("set");
    assert_eq!(
        tag.check(Some(&args(json!({"where": "x", "n": 3})))),
        Ok(BatchCall::Filter {
            filter: json!("x"),
            expected_count: 3
        })
    );
}

#[test]
fn batch_check_refusals() {
    let p = batch_policy();
    let b = p.batch("del").expect("set");
    let cases = [
        (json!({}), BatchProblem::NoSelector, "batch.del.selector"),
        (
            json!({"ids": null, "filter": null}),
            BatchProblem::NoSelector,
            "batch.del.selector",
        ),
        (
            json!({"ids": ["secret-id"], "filter": "secret-filter", "expected_count": 1}),
            BatchProblem::BothSelectors,
            "batch.del.selector",
        ),
        (json!({"ids": []}), BatchProblem::BadIds, "batch.del.ids"),
        (
            json!({"ids": "secret-id"}),
            BatchProblem::BadIds,
            "batch.del.ids",
        ),
        (json!({"ids": [1.5]}), BatchProblem::BadIds, "batch.del.ids"),
        (
            json!({"ids": [{"id": "secret-id"}]}),
            BatchProblem::BadIds,
            "batch.del.ids",
        ),
        (
            json!({"filter": "secret-filter"}),
            BatchProblem::MissingExpectedCount,
            "batch.del.expected_count",
        ),
        (
            json!({"filter": "secret-filter", "expected_count": -1}),
            BatchProblem::BadExpectedCount,
            "batch.del.expected_count",
        ),
        (
            json!({"filter": "secret-filter", "expected_count": "3"}),
            BatchProblem::BadExpectedCount,
            "batch.del.expected_count",
        ),
        (
            json!({"filter": "secret-filter", "expected_count": 2.5}),
            BatchProblem::BadExpectedCount,
            "batch.del.expected_count",
        ),
        (
            json!({"ids": ["secret-id"], "expected_count": 2}),
            BatchProblem::CountMismatch {
                ids: 1,
                expected_count: 2,
            },
            "batch.del.expected_count",
        ),
    ];
    for (call, problem, rule) in cases {
        let v = b.check(Some(&args(call.clone()))).expect_err("refused");
        assert_eq!(v.problem, problem, "{call}");
        assert_eq!(v.rule(), rule, "{call}");
        let message = v.message();
        assert!(
            message.starts_with("Error:") && message.contains(rule),
            "{message}"
        );
        assert!(!message.contains("secret"), "{message}");
    }
    assert_eq!(
        b.check(None).expect_err("refused").problem,
        BatchProblem::NoSelector
    );
    let tag = p.batch("tag").expect("set");
    let v = tag
        .check(Some(&args(json!({"where": 1}))))
        .expect_err("refused");
    assert!(
        v.message().contains("`n`") && v.message().contains("`where`"),
        "{}",
        v.message()
    );
}

#[test]
fn new_per_tool_settings_enter_the_fingerprint_only_when_present() {
    let base = json!({"version": 1, "allow": ["t", "u"], "effects": {"u": "read"}});
    let plain = load(base.clone());
    let variants = [
        ("effects", json!({"t": "write", "u": "read"})),
        ("batch", json!({"t": {}})),
        (
            "rate_limits",
            json!({"tools": {"t": {"burst": 1, "per_minute": 1}}}),
        ),
        ("untrusted_output", json!({"t": {"fields": ["/a"]}})),
        ("versions", json!({"t": {"argument": "version"}})),
        (
            "duplicates",
            json!({"t": {"key": ["k"], "update_tool": "u"}}),
        ),
        ("results", json!({"t": {"fields": ["a"]}})),
    ];
    for (key, section) in variants {
        let mut changed = base.clone();
        changed[key] = section;
        let changed = load(changed);
        assert_ne!(plain.fingerprint("t"), changed.fingerprint("t"), "{key}");
        assert_eq!(plain.fingerprint("u"), changed.fingerprint("u"), "{key}");
    }
    let mut exempt = base.clone();
    exempt["kill_switch"] = json!({"exempt": ["u"]});
    assert_ne!(plain.fingerprint("u"), load(exempt).fingerprint("u"));
    // The confirmation window belongs to the tools that need confirmation only.
    let mut confirm = base.clone();
    confirm["effects"] = json!({"t": "delete", "u": "read"});
    let confirm_default = load(confirm.clone());
    confirm["confirmation"] = json!({"ttl_secs": 60});
    let confirm_short = load(confirm);
    assert_ne!(
        confirm_default.fingerprint("t"),
        confirm_short.fingerprint("t")
    );
    assert_eq!(
        confirm_default.fingerprint("u"),
        confirm_short.fingerprint("u")
    );
    // Principal rate limits are not per tool.
    let mut principal_rate = base.clone();
    principal_rate["rate_limits"] = json!({"principals": {"p": {"burst": 1, "per_minute": 1}}});
    assert_eq!(
        plain.fingerprint("t"),
        load(principal_rate).fingerprint("t")
    );
    // Spelling out a default that means nothing new keeps the fingerprint.
    let explicit = load(
        json!({"version": 1, "allow": ["t", "u"], "effects": {"u": "read"},
        "arg_rules": {"t": {"f": {"optional": false}}}}),
    );
    let implicit = load(
        json!({"version": 1, "allow": ["t", "u"], "effects": {"u": "read"},
        "arg_rules": {"t": {"f": {}}}}),
    );
    assert_eq!(explicit.fingerprint("t"), implicit.fingerprint("t"));
}

#[test]
fn scopes_name_the_tools_they_grant() {
    let p = load(json!({"version": 1, "allow": ["r", "w", "free"],
        "scopes": {"notes:read": ["r", "w"], "notes:write": ["w"]}}));
    let names = |tool: &str| -> Vec<String> {
        p.required_scopes(tool)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(names("r"), ["notes:read"]);
    assert_eq!(names("w"), ["notes:read", "notes:write"]);
    assert!(p.required_scopes("free").is_none());
    assert_eq!(
        p.scopes_supported().into_iter().collect::<Vec<_>>(),
        ["notes:read", "notes:write"]
    );
    // A scope changes the fingerprint of the tools it names only.
    let without = load(json!({"version": 1, "allow": ["r", "w", "free"]}));
    assert_ne!(p.fingerprint("w"), without.fingerprint("w"));
    assert_eq!(p.fingerprint("free"), without.fingerprint("free"));
}

#[test]
fn scopes_refuse_bad_names_and_unallowed_tools() {
    for (policy, needle) in [
        (
            json!({"version": 1, "allow": ["r"], "scopes": {"a b": ["r"]}}),
            "scope \"a b\"",
        ),
        (
            json!({"version": 1, "allow": ["r"], "scopes": {"": ["r"]}}),
            "scope \"\"",
        ),
        (
            json!({"version": 1, "allow": ["r"], "scopes": {"s": ["other"]}}),
            "scopes names `other`",
        ),
        (
            json!({"version": 1, "allow": ["r"], "scopes": {"s": "r"}}),
            "expected a sequence",
        ),
    ] {
        let error = Policy::from_json(&policy.to_string())
            .err()
            .unwrap_or_else(|| panic!("{policy} loaded"))
            .to_string();
        assert!(error.contains(needle), "{policy}: {error}");
    }
}

#[test]
fn proxy_lets_nothing_through_to_the_host_and_trusts_no_text_by_default() {
    let plain = load(json!({"version": 1, "allow": ["r"]}));
    for request in [
        HostRequest::Sampling,
        HostRequest::Elicitation,
        HostRequest::Roots,
    ] {
        assert!(!plain.host_request_allowed(request), "{request:?}");
    }
    assert!(!plain.trusted_output("r"));

    let proxy = load(json!({"version": 1, "allow": ["r"], "proxy": {
        "host_requests": ["sampling", "roots"], "trusted_output": ["r"]
    }}));
    assert!(proxy.host_request_allowed(HostRequest::Sampling));
    assert!(proxy.host_request_allowed(HostRequest::Roots));
    assert!(!proxy.host_request_allowed(HostRequest::Elicitation));
    assert!(proxy.trusted_output("r"));
    assert!(!proxy.trusted_output("other"));
}

#[test]
fn proxy_refuses_unknown_kinds_keys_repeats_and_unallowed_tools() {
    for (policy, needle) in [
        (
            json!({"version": 1, "allow": ["r"], "proxy": {"host_requests": ["tasks"]}}),
            "unknown variant `tasks`, expected one of `sampling`, `elicitation`, `roots`",
        ),
        (
            json!({"version": 1, "allow": ["r"], "proxy": {"host_request": ["roots"]}}),
            "unknown field `host_request`, expected `host_requests` or `trusted_output`",
        ),
        (
            json!({"version": 1, "allow": ["r"], "proxy": {"host_requests": ["roots", "roots"]}}),
            "lists \"roots\" twice",
        ),
        (
            json!({"version": 1, "allow": ["r"], "proxy": {"trusted_output": ["other"]}}),
            "`other`",
        ),
        (
            json!({"version": 1, "allow": ["r"], "proxy": null}),
            "invalid type: null",
        ),
    ] {
        let error = Policy::from_json(&policy.to_string())
            .err()
            .unwrap_or_else(|| panic!("{policy} loaded"))
            .to_string();
        assert!(error.contains(needle), "{policy}: {error}");
    }
}
