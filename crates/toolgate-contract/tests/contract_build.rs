//! Building contracts: defaults, validation, section digests, token economics, input contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod contract_support;

use contract_support::{fingerprint, parts_from_spec, sample_server, sample_specs, tool_from_spec};
use serde_json::{Value, json};
use toolgate_canon::Sha256Digest;
use toolgate_contract::contract::{ContractError, InflationRisk, ServerContract, ToolContract};
use toolgate_contract::{Annotations, EffectiveAnnotations, HandlerFacts, ToolDefinition};

fn facts() -> HandlerFacts {
    HandlerFacts {
        gate_stages: vec!["call_decide".into(), "permit".into()],
        policy_fingerprint: fingerprint("p"),
        entitlements: Default::default(),
        evasion: vec![],
        unresolved: vec![],
    }
}

fn def(input: Value, output: Option<Value>) -> ToolDefinition {
    ToolDefinition {
        name: "t".into(),
        description: Some("A tool.".into()),
        input_schema: input,
        output_schema: output,
        annotations: Annotations::default(),
    }
}

fn economics(
    input: Value,
    output: Option<Value>,
    description: &str,
) -> (u64, Vec<String>, InflationRisk) {
    let mut d = def(input, output);
    d.description = Some(description.to_owned());
    let c = ToolContract::build(&d, &facts()).unwrap();
    let e = &c.token_economics;
    (
        e.schema_field_count(),
        e.unbounded_collections().to_vec(),
        e.inflation_risk(),
    )
}

#[test]
fn absent_annotations_take_the_conservative_defaults() {
    let c = ToolContract::build(&def(json!({"type": "object"}), None), &facts()).unwrap();
    assert_eq!(
        c.behavior.annotations(),
        EffectiveAnnotations {
            read_only_hint: false,
            destructive_hint: true,
            idempotent_hint: false,
            open_world_hint: true
        }
    );
    assert_eq!(c.surface.description(), "A tool.");
    assert_eq!(c.behavior.output_schema(), None);
    assert_eq!(c.behavior.output_schema_digest(), None);
    assert_eq!(c.behavior.gate_stages(), ["call_decide", "permit"]);
}

#[test]
fn invalid_definitions_are_errors() {
    for bad in [json!("string"), json!(null), json!([]), json!(true)] {
        let err = ToolContract::build(&def(bad.clone(), None), &facts()).unwrap_err();
        assert!(
            matches!(err, ContractError::InputSchemaNotObject { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("`t`"));
        let err = ToolContract::build(&def(json!({}), Some(bad.clone())), &facts()).unwrap_err();
        assert!(
            matches!(err, ContractError::OutputSchemaNotObject { .. }),
            "{bad}: {err}"
        );
    }
    let mut unnamed = def(json!({}), None);
    unnamed.name.clear();
    assert_eq!(
        ToolContract::build(&unnamed, &facts()),
        Err(ContractError::EmptyToolName)
    );

    // Deeper than the JSON parser's limit: it could never be read back from toolgate.lock.
    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "object", "properties": {"x": deep}});
    }
    let err = ToolContract::build(&def(deep, None), &facts()).unwrap_err();
    assert!(
        matches!(
            err,
            ContractError::SchemaNotRepresentable { which: "input", .. }
        ),
        "{err}"
    );

    let t = ToolContract::build(&def(json!({}), None), &facts()).unwrap();
    let err = ServerContract::new("s", [t.clone(), t.clone()]).unwrap_err();
    assert_eq!(err, ContractError::DuplicateTool { name: "t".into() });
    assert_eq!(
        ServerContract::new("", [t]).unwrap_err(),
        ContractError::EmptyServerName
    );
}

#[test]
fn equal_meaning_gives_equal_contracts() {
    let a = ToolContract::build(
        &def(json!({"type": "object", "maximum": 2.0}), None),
        &facts(),
    )
    .unwrap();
    let b = ToolContract::build(
        &def(json!({"maximum": 2, "type": "object"}), None),
        &facts(),
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.digest(), b.digest());

    let mut none = def(json!({}), None);
    none.description = None;
    let mut empty = def(json!({}), None);
    empty.description = Some(String::new());
    assert_eq!(
        ToolContract::build(&none, &facts()).unwrap(),
        ToolContract::build(&empty, &facts()).unwrap()
    );

    let mut shuffled = facts();
    shuffled.evasion = vec![
        "char_codes".into(),
        "base64_blob".into(),
        "char_codes".into(),
    ];
    let c = ToolContract::build(&def(json!({}), None), &shuffled).unwrap();
    assert_eq!(
        c.entitlements.evasion_signals(),
        ["base64_blob", "char_codes"]
    );
}

#[test]
fn every_input_changes_the_digest_of_its_section_only() {
    let spec = &sample_specs()[0];
    let base = tool_from_spec(spec);
    let bd = base.section_digests();
    let variant = |patch: Value| {
        let mut s = spec.clone();
        contract_support::merge_patch(&mut s, &patch);
        tool_from_spec(&s).section_digests()
    };
    let d = variant(json!({"description": "other"}));
    assert!(
        d.surface != bd.surface && d.behavior == bd.behavior && d.entitlements == bd.entitlements
    );
    let d = variant(json!({"policy": "other"}));
    assert!(
        d.surface == bd.surface
            && d.behavior != bd.behavior
            && d.token_economics == bd.token_economics
    );
    let d = variant(json!({"entitlements": ["network"]}));
    assert!(
        d.entitlements != bd.entitlements && d.surface == bd.surface && d.behavior == bd.behavior
    );
    let d = variant(json!({"evasion": ["base64_blob"]}));
    assert!(d.entitlements != bd.entitlements);
    let d = variant(json!({"annotations": {"openWorldHint": true}}));
    assert!(d.behavior != bd.behavior);
    let d = variant(json!({"gateStages": ["permit"]}));
    assert!(d.behavior != bd.behavior);
    assert_ne!(variant(json!({"name": "other"})).surface, bd.surface);

    let (ad, bdg) = (
        base.digest(),
        tool_from_spec(&{
            let mut s = spec.clone();
            s["policy"] = "x".into();
            s
        })
        .digest(),
    );
    assert_ne!(ad, bdg);
}

#[test]
fn server_digest_covers_name_and_tools_but_not_order() {
    let a = sample_server();
    let b = ServerContract::new(
        "toolgate-server",
        sample_specs().iter().rev().map(tool_from_spec),
    )
    .unwrap();
    assert_eq!(a.digest(), b.digest());
    let renamed = ServerContract::new("other", sample_specs().iter().map(tool_from_spec)).unwrap();
    assert_ne!(a.digest(), renamed.digest());
    let fewer = ServerContract::new(
        "toolgate-server",
        sample_specs().iter().skip(1).map(tool_from_spec),
    )
    .unwrap();
    assert_ne!(a.digest(), fewer.digest());
}

#[test]
fn field_count_is_recursive() {
    let input = json!({
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "object", "properties": {"c": {}, "d": {}}},
            "e": {"type": "array", "items": {"type": "object", "properties": {"f": {}}}},
            "g": {"$ref": "#/$defs/G"}
        },
        "$defs": {"G": {"type": "object", "properties": {"h": {}, "i": {}}}},
        "anyOf": [{"properties": {"j": {}}}],
        "default": {"properties": {"not": {}, "counted": {}}}
    });
    let output = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
    // a b e g + c d + f + h i + j = 10 input, 1 output.
    assert_eq!(economics(input, Some(output), "").0, 11);
}

#[test]
fn unbounded_collections_are_pointers_into_the_output_schema() {
    let output = json!({
        "type": "object",
        "properties": {
            "bounded": {"type": "array", "maxItems": 5, "items": {"type": "string"}},
            "list": {"type": "array", "items": {"type": "string"}},
            "nullable_list": {"type": ["array", "null"]},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "bounded_map": {"type": "object", "additionalProperties": true, "maxProperties": 3},
            "closed": {"type": "object", "additionalProperties": false},
            "plain": {"type": "object", "properties": {"x": {}}},
            "a/b~c": {"type": "array"}
        },
        "$defs": {"Rows": {"type": "array", "items": {}}}
    });
    let (_, pointers, risk) = economics(json!({"type": "object"}), Some(output), "");
    assert_eq!(
        pointers,
        [
            "/$defs/Rows",
            "/properties/a~1b~0c",
            "/properties/list",
            "/properties/map",
            "/properties/nullable_list"
        ]
    );
    assert_eq!(risk, InflationRisk::High);
    // Unbounded input collections do not count: the server does not emit them.
    let (_, pointers, _) = economics(
        json!({"type": "object", "properties": {"xs": {"type": "array"}}}),
        Some(json!({"type": "object"})),
        "",
    );
    assert!(pointers.is_empty());
}

#[test]
fn inflation_risk_levels() {
    let small_output = Some(json!({"type": "object", "properties": {"ok": {"type": "boolean"}}}));
    assert_eq!(
        economics(json!({"type": "object"}), small_output.clone(), "short").2,
        InflationRisk::Low
    );
    // No output schema: the size of the result is unknown.
    assert_eq!(
        economics(json!({"type": "object"}), None, "short").2,
        InflationRisk::Medium
    );
    // More than 20 fields.
    let props: serde_json::Map<String, Value> =
        (0..20).map(|i| (format!("f{i}"), json!({}))).collect();
    let wide = json!({"type": "object", "properties": props});
    assert_eq!(
        economics(wide.clone(), small_output.clone(), "short"),
        (21, vec![], InflationRisk::Medium)
    );
    // Exactly 20 is still low.
    let props: serde_json::Map<String, Value> =
        (0..19).map(|i| (format!("f{i}"), json!({}))).collect();
    assert_eq!(
        economics(json!({"properties": props}), small_output.clone(), "short").2,
        InflationRisk::Low
    );
    // A description longer than 1,000 characters (not bytes).
    assert_eq!(
        economics(json!({}), small_output.clone(), &"é".repeat(1000)).2,
        InflationRisk::Low
    );
    assert_eq!(
        economics(json!({}), small_output, &"é".repeat(1001)).2,
        InflationRisk::Medium
    );
    assert_eq!(InflationRisk::High.to_string(), "high");
    assert_eq!(
        serde_json::to_value(InflationRisk::Medium).unwrap(),
        json!("medium")
    );
}

#[test]
fn input_contract_is_sorted_and_includes_required_names() {
    let c = ToolContract::build(
        &def(
            json!({
                "type": "object",
                "properties": {"text": {}, "request_id": {}, "priority": {}},
                "required": ["text", "request_id", "ghost", "text"]
            }),
            None,
        ),
        &facts(),
    )
    .unwrap();
    let input = c.input_contract();
    assert_eq!(input.required, ["ghost", "request_id", "text"]);
    assert_eq!(input.allowed, ["ghost", "priority", "request_id", "text"]);
    let empty = ToolContract::build(&def(json!({}), None), &facts())
        .unwrap()
        .input_contract();
    assert!(empty.required.is_empty() && empty.allowed.is_empty());
}

#[test]
fn schema_digests_are_canonical_sha256() {
    let (d, f) = parts_from_spec(&sample_specs()[0]);
    let c = ToolContract::build(&d, &f).unwrap();
    assert_eq!(
        c.surface.input_schema_digest(),
        Sha256Digest::of_json(&d.input_schema)
    );
    assert_eq!(
        c.behavior.output_schema_digest(),
        d.output_schema.as_ref().map(Sha256Digest::of_json)
    );
    assert_eq!(c.name(), "write_note");
    assert_eq!(c.behavior.policy_fingerprint(), f.policy_fingerprint);
}
