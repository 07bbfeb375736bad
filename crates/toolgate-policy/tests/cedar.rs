//! Cedar policies checked against the tools they govern: the schema toolgate generates from the
//! tools' input schemas, the policies it accepts (the worked examples of docs/policy.md) and
//! the ones it refuses, each naming the policy and its line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use toolgate_policy::cedar::{CedarError, CedarPolicies, ToolSignature, cedar_schema};

fn tools() -> Vec<ToolSignature> {
    let tool = |name: &str, input_schema| ToolSignature {
        name: name.to_owned(),
        input_schema,
    };
    vec![
        tool("list_bookings", json!({"type": "object", "properties": {}})),
        tool(
            "create_booking",
            json!({
                "type": "object",
                "properties": {
                    "guest": {"type": "string"},
                    "nights": {"type": "integer", "minimum": 1},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "notes": {"type": ["string", "null"]},
                    "room": {"$ref": "#/$defs/Room"},
                    "price": {"type": "number"}
                },
                "required": ["guest", "nights", "room"],
                "$defs": {"Room": {"type": "object", "properties": {
                    "kind": {"enum": ["single", "double"]},
                    "floor": {"type": "integer"}
                }, "required": ["kind"]}}
            }),
        ),
        tool(
            "delete_booking",
            json!({
                "type": "object",
                "properties": {"id": {"type": "string"}, "amount": {"type": "integer"}},
                "required": ["id", "amount"]
            }),
        ),
    ]
}

/// The five worked policies of docs/policy.md's Cedar section.
/// The worked policies of docs/policy.md's Cedar section (its one `cedar` block), so the page
/// cannot show a policy that does not load.
fn worked() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/policy.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let start = page
        .find("```cedar\n")
        .expect("a cedar block in docs/policy.md")
        + 9;
    let end = start + page[start..].find("```").unwrap();
    page[start..end].to_owned()
}

#[test]
fn the_worked_policies_fit_the_tools() {
    let worked = worked();
    let policies = CedarPolicies::from_text(&worked, "worked.cedar", &tools()).unwrap();
    assert_eq!(policies.len(), 6);
    assert_eq!(
        policies.ids(),
        [
            "admins-delete-small",
            "booking-bounds",
            "destructive-needs-write",
            "everyone-lists",
            "tenant-isolation",
            "until-2030"
        ]
    );
    assert_eq!(
        policies.digest(),
        toolgate_canon::Sha256Digest::of(worked.as_bytes())
    );
}

#[test]
fn the_schema_types_each_argument_from_the_input_schema() {
    let schema = cedar_schema(&tools());
    let create = &schema["Toolgate"]["actions"]["create_booking"];
    assert_eq!(create["memberOf"], json!([{"id": "tools/call"}]));
    let arguments = &create["appliesTo"]["context"]["attributes"]["arguments"]["attributes"];
    assert_eq!(arguments["guest"], json!({"type": "String"}));
    assert_eq!(arguments["nights"], json!({"type": "Long"}));
    assert_eq!(
        arguments["tags"],
        json!({"type": "Set", "element": {"type": "String"}, "required": false})
    );
    assert_eq!(
        arguments["notes"],
        json!({"type": "String", "required": false})
    );
    assert_eq!(
        arguments["room"]["attributes"]["kind"],
        json!({"type": "String"})
    );
    assert_eq!(
        arguments["room"]["attributes"]["floor"],
        json!({"type": "Long", "required": false})
    );
    // A JSON number has no Cedar type: it is left out, and a policy reading it is refused.
    assert!(arguments.get("price").is_none(), "{arguments}");
    assert!(cedar_policy::Schema::from_json_value(schema).is_ok());
}

/// Each policy is refused with its id and the line it is on (line 3: a comment, the `@id`,
/// then the policy).
#[test]
fn policies_that_do_not_fit_the_tools_are_refused_naming_the_policy_and_line() {
    let cases = [
        // An argument the tool does not have.
        (
            "missing argument",
            r#"permit(principal, action == Toolgate::Action::"delete_booking", resource) when { context.arguments.amout < 100 };"#,
        ),
        // A number compared with a string.
        (
            "wrong type",
            r#"permit(principal, action == Toolgate::Action::"delete_booking", resource) when { context.arguments.amount < "100" };"#,
        ),
        // A string compared for equality with a number.
        (
            "incompatible types",
            r#"permit(principal, action == Toolgate::Action::"delete_booking", resource) when { context.arguments.id == 7 };"#,
        ),
        // A tool that does not exist.
        (
            "unknown tool",
            r#"permit(principal, action == Toolgate::Action::"drop_tables", resource);"#,
        ),
        // A typo in a principal attribute.
        (
            "attribute typo",
            r#"forbid(principal, action in Toolgate::Action::"tools/call", resource) when { principal.tennant == "acme" };"#,
        ),
        // An entity type the model does not have.
        (
            "unknown entity type",
            r#"permit(principal in Toolgate::Group::"admins", action == Toolgate::Action::"list_bookings", resource);"#,
        ),
        // An optional attribute read without `has`.
        (
            "optional tenant",
            r#"forbid(principal, action in Toolgate::Action::"tools/call", resource) when { principal.tenant != "acme" };"#,
        ),
        // An optional argument read without `has`.
        (
            "optional argument",
            r#"forbid(principal, action == Toolgate::Action::"create_booking", resource) when { context.arguments.notes like "*vip*" };"#,
        ),
        // A set operation on a string.
        (
            "contains on a string",
            r#"forbid(principal, action == Toolgate::Action::"create_booking", resource) when { context.arguments.guest.contains("x") };"#,
        ),
        // A boolean ordered like a number.
        (
            "bool as number",
            r#"forbid(principal, action in Toolgate::Action::"tools/call", resource) when { resource.read_only < 3 };"#,
        ),
        // Arguments while listing (no call, no arguments).
        (
            "arguments of a listing",
            r#"forbid(principal, action == Toolgate::Action::"tools/list", resource) when { context.arguments.amount > 5 };"#,
        ),
        // Another tool's argument.
        (
            "argument of another tool",
            r#"forbid(principal, action == Toolgate::Action::"list_bookings", resource) when { context.arguments.amount > 5 };"#,
        ),
        // An argument without a Cedar type (a JSON number).
        (
            "untyped argument",
            r#"forbid(principal, action == Toolgate::Action::"create_booking", resource) when { context.arguments.price > 5 };"#,
        ),
    ];
    for (name, policy) in cases {
        let text = format!("// {name}\n@id(\"bad\")\n{policy}\n");
        let error = CedarPolicies::from_text(&text, "bad.cedar", &tools()).unwrap_err();
        let CedarError::Invalid {
            source_name,
            problems,
        } = &error
        else {
            panic!("{name}: not a validation error: {error}");
        };
        assert_eq!(source_name, "bad.cedar");
        assert!(!problems.is_empty(), "{name}");
        for problem in problems {
            assert_eq!(problem.policy, "bad", "{name}: {problem}");
            assert_eq!(problem.line, Some(3), "{name}: {problem}");
        }
        let message = error.to_string();
        assert!(
            message.starts_with("bad.cedar: ") && message.contains("policy bad (line 3)"),
            "{name}: {message}"
        );
    }
}

#[test]
fn text_that_is_not_cedar_is_refused_with_its_line() {
    let error = CedarPolicies::from_text(
        "permit(principal, action, resource);\npermit(principal action, resource);\n",
        "typo.cedar",
        &tools(),
    )
    .unwrap_err();
    match &error {
        CedarError::Syntax { problems, .. } => {
            assert!(problems.iter().any(|p| p.line == Some(2)), "{error}")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_file_is_read_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policies.cedar");
    std::fs::write(&path, worked()).unwrap();
    assert_eq!(CedarPolicies::load(&path, &tools()).unwrap().len(), 6);
    let missing = dir.path().join("none.cedar");
    let error = CedarPolicies::load(&missing, &tools()).unwrap_err();
    assert!(error.to_string().contains("none.cedar"), "{error}");
}
