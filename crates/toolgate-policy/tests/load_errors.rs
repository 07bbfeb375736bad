//! Every load error of the keys added to version 1: each names the problem and how to fix it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use toolgate_policy::Policy;

/// Loads `policy` (a JSON value, or raw text when a string) and returns the error text.
fn error(policy: Value) -> String {
    let text = match &policy {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    match Policy::from_json(&text) {
        Ok(_) => panic!("must be rejected: {text}"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn rejects(policy: Value, needles: &[&str]) {
    let e = error(policy);
    for needle in needles {
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
    }
    // Every message says how to fix the problem.
    let fix_words = [
        "fix", "use ", "remove", "add ", "keep", "list ", "raise", "declare", "give", "name ",
        "write",
    ];
    assert!(
        fix_words.iter().any(|w| e.contains(w)),
        "{e:?} does not say how to fix it"
    );
}

fn with_rule(rule: Value) -> Value {
    json!({"version": 1, "allow": ["t"], "arg_rules": {"t": {"f": rule}}})
}

#[test]
fn unknown_keys_name_the_allowed_ones() {
    rejects(
        json!({"version": 1, "efects": {}}),
        &[
            "efects",
            "effects",
            "principals",
            "untrusted_output",
            "kill_switch",
            "rate_limits",
            "batch",
            "confirmation",
            "versions",
            "duplicates",
            "results",
        ],
    );
    rejects(
        with_rule(json!({"patern": "a"})),
        &[
            "patern",
            "pattern",
            "enum",
            "minimum",
            "maximum",
            "max_items",
            "path",
            "optional",
        ],
    );
    rejects(
        with_rule(json!({"path": {"root": ["/a"]}})),
        &["root", "roots"],
    );
    rejects(
        json!({"version": 1, "confirmation": {"ttl": 5}}),
        &["ttl", "ttl_secs"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "batch": {"t": {"ids": "x"}}}),
        &[
            "`ids`",
            "ids_argument",
            "filter_argument",
            "expected_count_argument",
        ],
    );
    rejects(
        json!({"version": 1, "rate_limits": {"tool": {}}}),
        &["tool", "tools", "principals"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "rate_limits": {"tools": {"t": {"burst": 1, "per_minute": 1, "per_hour": 1}}}}),
        &["per_hour", "burst", "per_minute"],
    );
    rejects(
        json!({"version": 1, "kill_switch": {"exempted": []}}),
        &["exempted", "exempt"],
    );
    rejects(
        json!({"version": 1, "principals": {"p": {"alow": []}}}),
        &["alow", "allow", "deny", "arg_rules"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "untrusted_output": {"t": {"fields": ["/a"], "max_len": 3}}}),
        &["max_len", "fields", "max_chars"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "versions": {"t": {"arg": "version"}}}),
        &["`arg`", "argument"],
    );
    rejects(
        json!({"version": 1, "allow": ["t", "u"], "duplicates": {"t": {"key": ["a"], "update_tool": "u", "updater": "u"}}}),
        &["updater", "key", "update_tool"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "results": {"t": {"fields": ["a"], "field": ["b"]}}}),
        &["`field`", "fields"],
    );
}

#[test]
fn duplicate_keys_are_errors() {
    for text in [
        r#"{"version":1,"allow":["t"],"effects":{"t":"read","t":"write"}}"#,
        r#"{"version":1,"allow":["t"],"batch":{"t":{},"t":{}}}"#,
        r#"{"version":1,"allow":["t"],"rate_limits":{"tools":{"t":{"burst":1,"per_minute":1},"t":{"burst":2,"per_minute":1}}}}"#,
        r#"{"version":1,"rate_limits":{"principals":{"p":{"burst":1,"per_minute":1},"p":{"burst":1,"per_minute":1}}}}"#,
        r#"{"version":1,"principals":{"p":{},"p":{}}}"#,
        r#"{"version":1,"allow":["t"],"principals":{"p":{"arg_rules":{"t":{"f":{}},"t":{}}}}}"#,
        r#"{"version":1,"allow":["t"],"untrusted_output":{"t":{"fields":["/a"]},"t":{"fields":["/b"]}}}"#,
        r#"{"version":1,"allow":["t"],"versions":{"t":{"argument":"v"},"t":{"argument":"w"}}}"#,
        r#"{"version":1,"allow":["t","u"],"duplicates":{"t":{"key":["a"],"update_tool":"u"},"t":{"key":["b"],"update_tool":"u"}}}"#,
        r#"{"version":1,"allow":["t"],"results":{"t":{"fields":["a"]},"t":{"fields":["b"]}}}"#,
    ] {
        let e = error(Value::String(text.to_owned()));
        assert!(e.contains("duplicate key"), "{text}: {e}");
    }
    for text in [
        r#"{"version":1,"confirmation":{"ttl_secs":5,"ttl_secs":6}}"#,
        r#"{"version":1,"confirmation":{},"confirmation":{}}"#,
        r#"{"version":1,"allow":["t"],"arg_rules":{"t":{"f":{"pattern":"a","pattern":"b"}}}}"#,
        r#"{"version":1,"kill_switch":{"exempt":[],"exempt":[]}}"#,
        r#"{"version":1,"allow":["t"],"versions":{"t":{"argument":"v","argument":"w"}}}"#,
        r#"{"version":1,"allow":["t","u"],"duplicates":{"t":{"key":["a"],"key":["b"],"update_tool":"u"}}}"#,
        r#"{"version":1,"allow":["t"],"results":{"t":{"fields":["a"],"fields":["b"]}}}"#,
    ] {
        let e = error(Value::String(text.to_owned()));
        assert!(e.contains("duplicate field"), "{text}: {e}");
    }
}

#[test]
fn new_keys_refuse_null() {
    rejects(
        with_rule(json!({"pattern": null})),
        &["null", "fix the policy file"],
    );
    rejects(with_rule(json!({"optional": null})), &["null"]);
    rejects(json!({"version": 1, "confirmation": null}), &["null"]);
    rejects(json!({"version": 1, "kill_switch": null}), &["null"]);
}

#[test]
fn bad_patterns_name_tool_field_and_regex_error() {
    rejects(
        with_rule(json!({"pattern": "(unclosed"})),
        &[
            "arg_rules.t.f.pattern",
            "regex",
            "unclosed",
            "fix the pattern",
        ],
    );
    // Balanced on its own or refused: "a)|(b" would otherwise escape the anchors.
    rejects(
        with_rule(json!({"pattern": "a)|(b"})),
        &["arg_rules.t.f.pattern", "fix the pattern"],
    );
    rejects(
        with_rule(json!({"pattern": "\\pL{5000}{100}"})),
        &["arg_rules.t.f.pattern", "size limit", "1048576"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "principals": {"p": {"arg_rules": {"t": {"g": {"pattern": "["}}}}}}),
        &["principals.p.arg_rules.t.g.pattern", "regex"],
    );
}

#[test]
fn contradictory_rules_are_errors() {
    rejects(
        with_rule(json!({"minimum": 5, "maximum": 2.5})),
        &[
            "arg_rules.t.f",
            "minimum 5",
            "maximum 2.5",
            "fix the bounds",
        ],
    );
    rejects(
        with_rule(json!({"min_len": 1, "minimum": 0})),
        &[
            "arg_rules.t.f",
            "string rules",
            "number rules",
            "min_len",
            "minimum",
        ],
    );
    rejects(
        with_rule(json!({"max_items": 3, "max_len": 2})),
        &["arg_rules.t.f", "string rules", "max_items"],
    );
    rejects(
        with_rule(json!({"max_items": 3, "maximum": 2})),
        &["number rules", "max_items"],
    );
    rejects(
        with_rule(json!({"pattern": "a", "maximum": 2})),
        &["pattern", "maximum"],
    );
    rejects(
        with_rule(json!({"path": {"roots": ["/a"]}, "minimum": 2})),
        &["path", "minimum"],
    );
    rejects(
        with_rule(json!({"path": {"roots": ["/a"]}, "max_len": 0})),
        &[
            "arg_rules.t.f",
            "max_len 0",
            "at least 1 characters",
            "no value could pass",
            "raise max_len",
        ],
    );
    rejects(
        with_rule(json!({"max_items": -1})),
        &["arg_rules.t.f.max_items", "-1", "non-negative integer"],
    );
    rejects(
        with_rule(json!({"max_items": 1.5})),
        &["arg_rules.t.f.max_items", "non-negative integer"],
    );
    rejects(
        with_rule(json!({"enum": []})),
        &["arg_rules.t.f.enum", "empty", "at least one"],
    );
    rejects(
        with_rule(json!({"minimum": "1"})),
        &["expected a JSON number"],
    );
}

#[test]
fn enum_values_must_satisfy_the_other_rules() {
    for (rule, key) in [
        (json!({"enum": ["ok", 3], "max_len": 5}), "type"),
        (json!({"enum": ["ok", "too long"], "max_len": 5}), "max_len"),
        (json!({"enum": ["ok", "x"], "min_len": 2}), "min_len"),
        (
            json!({"enum": ["ab", "AB"], "pattern": "[a-z]+"}),
            "pattern",
        ),
        (json!({"enum": [1, 10], "maximum": 5}), "maximum"),
        (json!({"enum": [1, -10], "minimum": 0}), "minimum"),
        (
            json!({"enum": [[1], [1, 2, 3]], "max_items": 2}),
            "max_items",
        ),
        (
            json!({"enum": ["/a/x", "/b/x"], "path": {"roots": ["/a"]}}),
            "path",
        ),
    ] {
        rejects(
            with_rule(rule.clone()),
            &[
                "arg_rules.t.f.enum[1]",
                &format!("own {key} rule"),
                "fix or remove that value",
            ],
        );
    }
}

#[test]
fn path_roots_must_be_absolute_and_clean() {
    rejects(
        with_rule(json!({"path": {"roots": []}})),
        &["arg_rules.t.f.path.roots", "empty", "absolute directory"],
    );
    rejects(
        with_rule(json!({"path": {"roots": ["data"]}})),
        &["arg_rules.t.f.path.roots[0]", "not absolute"],
    );
    rejects(
        with_rule(json!({"path": {"roots": ["/a", "/data/../etc"]}})),
        &["roots[1]", "`..`"],
    );
    rejects(
        with_rule(json!({"path": {"roots": ["/data/./x"]}})),
        &["roots[0]", "`.`"],
    );
    rejects(
        with_rule(json!({"path": {"roots": ["/da\u{0}ta"]}})),
        &["roots[0]", "NUL"],
    );
    rejects(
        with_rule(json!({"path": {"roots": [""]}})),
        &["roots[0]", "not absolute"],
    );
    rejects(
        with_rule(json!({"path": {"roots": "/data"}})),
        &["invalid type"],
    );
}

#[test]
fn per_tool_keys_name_allowed_tools_only() {
    let sections = [
        ("effects", json!({"u": "read"})),
        ("batch", json!({"u": {}})),
        ("untrusted_output", json!({"u": {"fields": ["/a"]}})),
        ("idempotency", json!({"u": {}})),
        ("versions", json!({"u": {"argument": "version"}})),
        (
            "duplicates",
            json!({"u": {"key": ["k"], "update_tool": "t"}}),
        ),
        ("results", json!({"u": {"fields": ["a"]}})),
    ];
    for (key, section) in sections {
        let mut policy = json!({"version": 1, "allow": ["t", "u"], "deny": ["u"]});
        policy[key] = section;
        rejects(
            policy,
            &[
                &format!("{key} names `u`"),
                "does not allow",
                "(t)",
                "fix the tool name or remove the entry",
            ],
        );
    }
    rejects(
        json!({"version": 1, "allow": ["t"], "rate_limits": {"tools": {"u": {"burst": 1, "per_minute": 1}}}}),
        &["rate_limits.tools names `u`", "does not allow"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "effects": {"u": "read"}, "kill_switch": {"exempt": ["u"]}}),
        &["effects names `u`"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "effects": {"bad name": "read"}}),
        &["\"bad name\"", "tool name"],
    );
    // The list of allowed tools includes those allowed for a principal only; "none" when empty.
    rejects(
        json!({"version": 1, "principals": {"p": {"allow": ["v"]}}, "effects": {"u": "read"}}),
        &["(v)"],
    );
    rejects(json!({"version": 1, "effects": {"u": "read"}}), &["(none)"]);
    // A tool allowed only for some principal may be named.
    let p = Policy::from_json(
        &json!({"version": 1, "principals": {"p": {"allow": ["v"]}},
                "effects": {"v": "read"}, "batch": {"v": {}}, "kill_switch": {"exempt": ["v"]},
                "rate_limits": {"tools": {"v": {"burst": 1, "per_minute": 2}}},
                "untrusted_output": {"v": {"fields": ["/x"]}}, "idempotency": {"v": {}},
                "arg_rules": {"v": {"f": {}}}})
        .to_string(),
    )
    .expect("a tool allowed for one principal may carry per-tool keys");
    assert!(p.halt_exempt("v") && !p.visible("v") && p.visible_for("p", "v"));
}

#[test]
fn effects_and_kill_switch() {
    rejects(
        json!({"version": 1, "allow": ["t"], "effects": {"t": "explode"}}),
        &[
            "explode", "read", "write", "notify", "wake", "alert", "delete",
        ],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "effects": {"t": "Read"}}),
        &["Read", "read"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "kill_switch": {"exempt": ["t"]}}),
        &[
            "kill_switch.exempt lists `t`",
            "declare it \"read\" in effects or remove it from exempt",
        ],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "effects": {"t": "write"}, "kill_switch": {"exempt": ["t"]}}),
        &["kill_switch.exempt lists `t`", "\"read\""],
    );
    rejects(
        json!({"version": 1, "kill_switch": {"exempt": ["no way"]}}),
        &["kill_switch.exempt", "tool name"],
    );
}

#[test]
fn confirmation_ttl_bounds() {
    rejects(
        json!({"version": 1, "confirmation": {"ttl_secs": 0}}),
        &["confirmation.ttl_secs is 0", "from 1 to 86400"],
    );
    rejects(
        json!({"version": 1, "confirmation": {"ttl_secs": 86401}}),
        &["86401", "from 1 to 86400"],
    );
    rejects(
        json!({"version": 1, "confirmation": {"ttl_secs": -5}}),
        &["invalid value"],
    );
    rejects(
        json!({"version": 1, "confirmation": 300}),
        &["invalid type"],
    );
}

#[test]
fn batch_argument_names() {
    rejects(
        json!({"version": 1, "allow": ["t"], "batch": {"t": {"ids_argument": ""}}}),
        &["batch.t.ids_argument is empty", "name the argument"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "batch": {"t": {"ids_argument": "filter"}}}),
        &[
            "batch.t.ids_argument and batch.t.filter_argument both name `filter`",
            "give each its own",
        ],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "batch": {"t": {"filter_argument": "q", "expected_count_argument": "q"}}}),
        &["batch.t.filter_argument and batch.t.expected_count_argument both name `q`"],
    );
}

#[test]
fn rate_limit_bounds() {
    rejects(
        json!({"version": 1, "allow": ["t"], "rate_limits": {"tools": {"t": {"burst": 0, "per_minute": 1}}}}),
        &["rate_limits.tools.t.burst is 0", "use at least 1"],
    );
    rejects(
        json!({"version": 1, "rate_limits": {"principals": {"p": {"burst": 1, "per_minute": 0}}}}),
        &["rate_limits.principals.p.per_minute is 0"],
    );
    rejects(
        json!({"version": 1, "rate_limits": {"principals": {"p": {"burst": 1}}}}),
        &["missing field `per_minute`"],
    );
    rejects(
        json!({"version": 1, "rate_limits": {"principals": {"p": {"burst": 5000000000_u64, "per_minute": 1}}}}),
        &["invalid value"],
    );
    rejects(
        json!({"version": 1, "rate_limits": {"principals": {"bad principal": {"burst": 1, "per_minute": 1}}}}),
        &[
            "rate_limits.principals",
            "\"bad principal\"",
            "principal name",
            "1 to 128 characters",
        ],
    );
}

#[test]
fn principal_sections() {
    rejects(
        json!({"version": 1, "principals": {"": {}}}),
        &["\"\"", "not a valid principal name"],
    );
    rejects(
        json!({"version": 1, "principals": {"a/b/c": {}}}),
        &["\"a/b/c\"", "principal name"],
    );
    let long = "p".repeat(129);
    rejects(
        json!({"version": 1, "principals": {long.clone(): {}}}),
        &[&long, "principal name"],
    );
    rejects(
        json!({"version": 1, "principals": {"p": {"allow": ["bad tool"]}}}),
        &["principals.p.allow", "tool name"],
    );
    rejects(
        json!({"version": 1, "principals": {"p": {"deny": [""]}}}),
        &["principals.p.deny", "tool name"],
    );
    // Principal rules only for tools the principal may call.
    rejects(
        json!({"version": 1, "allow": ["t"], "principals": {"p": {"deny": ["t"], "arg_rules": {"t": {"f": {}}}}}}),
        &[
            "principals.p.arg_rules names `t`",
            "does not allow for `p`",
            "add it to",
        ],
    );
    rejects(
        json!({"version": 1, "principals": {"p": {"arg_rules": {"t": {"f": {}}}}, "q": {"allow": ["t"]}}}),
        &["principals.p.arg_rules names `t`"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "deny": ["t"], "principals": {"p": {"allow": ["t"], "arg_rules": {"t": {"f": {}}}}}}),
        &["principals.p.arg_rules names `t`"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "principals": {"p": {"arg_rules": {"t": {"f": {"min_len": 3, "max_len": 1}}}}}}),
        &["principals.p.arg_rules.t.f", "min_len 3", "max_len 1"],
    );
    rejects(
        json!({"version": 1, "allow": ["t"], "principals": {"p": {"arg_rules": {"t": {"": {}}}}}}),
        &["principals.p.arg_rules.t has an empty field name"],
    );
}

#[test]
fn principal_rules_must_leave_some_value_callable() {
    for (top, own, why) in [
        (
            json!({"min_len": 5}),
            json!({"max_len": 3}),
            "at least 5 and at most 3 characters",
        ),
        (
            json!({"min_len": 1}),
            json!({"minimum": 0}),
            "one needs a string and the other a number",
        ),
        (
            json!({"minimum": 10}),
            json!({"maximum": 9.5}),
            "at least 10 and at most 9.5",
        ),
        (
            json!({"enum": ["a", "b"]}),
            json!({"enum": ["c"]}),
            "no value listed in enum passes both rules",
        ),
        (
            json!({"pattern": "x+"}),
            json!({"enum": ["y"]}),
            "no value listed in enum",
        ),
        (
            json!({"max_len": 0}),
            json!({"path": {"roots": ["/d"]}}),
            "at most 0 characters but every path inside both has at least 1",
        ),
        (
            json!({"path": {"roots": ["/a", "/b"]}}),
            json!({"path": {"roots": ["/c", "/ab"]}}),
            "their path roots do not overlap (/a, /b versus /c, /ab)",
        ),
        // Relative values resolve against /srv (the top-level base): "data/x" has 6 characters.
        (
            json!({"path": {"roots": ["/srv"]}, "max_len": 5}),
            json!({"path": {"roots": ["/srv/data/x"]}}),
            "at most 5 characters but every path inside both has at least 6",
        ),
    ] {
        rejects(
            json!({"version": 1, "allow": ["t"], "arg_rules": {"t": {"f": top}},
                   "principals": {"p": {"arg_rules": {"t": {"f": own}}}}}),
            &[
                "principals.p.arg_rules.t.f contradicts arg_rules.t.f",
                why,
                "`p` could never call `t`",
                "fix one of the two rules",
            ],
        );
    }
    // Compatible rules load: the principal narrows the top-level rule.
    Policy::from_json(
        &json!({"version": 1, "allow": ["t"], "arg_rules": {"t": {"f": {"min_len": 2}, "n": {"enum": [1, 2, 3]}}},
                "principals": {"p": {"arg_rules": {"t": {"f": {"max_len": 2, "pattern": "[a-z]+"}, "n": {"maximum": 2}}}}}})
        .to_string(),
    )
    .expect("compatible rules load");
}

#[test]
fn untrusted_output_settings() {
    let base = |settings: Value| json!({"version": 1, "allow": ["t"], "untrusted_output": {"t": settings}});
    rejects(
        base(json!({"fields": []})),
        &[
            "untrusted_output.t.fields is empty",
            "list the JSON pointers",
        ],
    );
    rejects(
        base(json!({"fields": ["notes/*/text"]})),
        &[
            "untrusted_output.t.fields[0]",
            "does not start with '/'",
            "write a JSON pointer",
        ],
    );
    rejects(
        base(json!({"fields": ["/a", "/b~2"]})),
        &["fields[1]", "'~' not followed by 0 or 1"],
    );
    rejects(
        base(json!({"fields": [""]})),
        &["fields[0]", "does not start with '/'"],
    );
    rejects(
        base(json!({"fields": ["/a"], "max_chars": 0})),
        &["untrusted_output.t.max_chars is 0", "from 1 to 100000"],
    );
    rejects(
        base(json!({"fields": ["/a"], "max_chars": 100001})),
        &["100001", "from 1 to 100000"],
    );
    rejects(base(json!({"max_chars": 10})), &["missing field `fields`"]);
}

#[test]
fn long_lists_of_allowed_tools_are_cut() {
    let allow: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    rejects(
        json!({"version": 1, "allow": allow, "effects": {"u": "read"}}),
        &["(t00, t01,", "t19, … (10 more))"],
    );
}

#[test]
fn versions_duplicates_and_results_load_strictly() {
    let base = |key: &str, section: Value| {
        let mut policy = json!({"version": 1, "allow": ["create", "update", "list"]});
        policy[key] = section;
        policy
    };
    // versions
    rejects(
        base("versions", json!({"update": {"argument": ""}})),
        &["versions.update.argument is empty", "name the argument"],
    );
    rejects(base("versions", json!({"update": {}})), &["argument"]);
    rejects(
        base("versions", json!({"update": {"argument": null}})),
        &["invalid type"],
    );
    rejects(
        base("versions", json!({"update": {"argument": 3}})),
        &["invalid type"],
    );
    // duplicates
    rejects(
        base(
            "duplicates",
            json!({"create": {"key": [], "update_tool": "update"}}),
        ),
        &["duplicates.create.key is empty", "list the arguments"],
    );
    rejects(
        base(
            "duplicates",
            json!({"create": {"key": ["guest", ""], "update_tool": "update"}}),
        ),
        &["duplicates.create.key[1] is empty"],
    );
    rejects(
        base(
            "duplicates",
            json!({"create": {"key": ["guest", "guest"], "update_tool": "update"}}),
        ),
        &["lists `guest` twice", "remove one"],
    );
    rejects(
        base("duplicates", json!({"create": {"key": ["guest"]}})),
        &["update_tool"],
    );
    rejects(
        base(
            "duplicates",
            json!({"create": {"key": ["guest"], "update_tool": "create"}}),
        ),
        &["update_tool names `create` itself"],
    );
    rejects(
        base(
            "duplicates",
            json!({"create": {"key": ["guest"], "update_tool": "amend"}}),
        ),
        &[
            "duplicates.create.update_tool names `amend`",
            "does not allow",
            "allow it or fix the name",
        ],
    );
    rejects(
        base(
            "duplicates",
            json!({"create": {"key": ["guest"], "update_tool": "bad name"}}),
        ),
        &["\"bad name\"", "tool name"],
    );
    // results
    rejects(
        base("results", json!({"list": {"fields": []}})),
        &["results.list.fields is empty", "list the fields"],
    );
    for bad in ["", "a..b", ".a", "a.", "a[0]", "a[", "a]", "a[]b"] {
        rejects(
            base("results", json!({"list": {"fields": ["ok", bad]}})),
            &[
                "results.list.fields[1]",
                "bookings[].id",
                "write dotted member names",
            ],
        );
    }
    rejects(
        base("results", json!({"list": {"fields": ["a.b", "a.b"]}})),
        &["lists \"a.b\" twice"],
    );
    let loaded = Policy::from_json(
        &json!({"version": 1, "allow": ["create", "update", "list"],
            "versions": {"update": {"argument": "version"}},
            "duplicates": {"create": {"key": ["guest", "date"], "update_tool": "update"}},
            "results": {"list": {"fields": ["bookings[].id", "[].id", "total"]}}})
        .to_string(),
    )
    .expect("loads");
    assert_eq!(loaded.versions("update").unwrap().argument(), "version");
    assert!(loaded.versions("create").is_none());
    let guard = loaded.duplicates("create").unwrap();
    assert_eq!(guard.key(), ["guest", "date"]);
    assert_eq!(guard.update_tool(), "update");
    assert_eq!(
        loaded.results("list").unwrap().fields(),
        ["bookings[].id", "[].id", "total"]
    );
}

/// A file's syntax, version and validity errors name the file and keep the cause's text.
#[test]
fn errors_of_a_policy_file_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, cause) in [
        ("syntax.json", "{\"version\": 1, \"allow\": [\n", "line 2"),
        (
            "version.json",
            r#"{"version":2,"allow":["t"]}"#,
            "unsupported policy version 2",
        ),
        (
            "no-version.json",
            r#"{"allow":["t"]}"#,
            "missing integer \"version\" key",
        ),
        ("typo.json", r#"{"version":1,"alow":["t"]}"#, "alow"),
        (
            "invalid.json",
            r#"{"version":1,"allow":["t"],"idempotency":{"t":{"window_secs":0}}}"#,
            "window_secs is 0",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let error = Policy::load(&path).expect_err(name);
        assert!(
            matches!(&error, toolgate_policy::PolicyError::File { path: p, .. } if *p == path),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("policy file {}: ", path.display())),
            "{message}"
        );
        assert!(message.contains(cause), "{message:?} lacks {cause:?}");
        // The same text without a file names none.
        let inline = Policy::from_json(text).unwrap_err().to_string();
        assert!(!inline.contains(name), "{inline}");
    }
}
