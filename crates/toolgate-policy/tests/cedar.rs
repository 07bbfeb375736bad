//! Cedar policies checked against the tools they govern: the schema toolgate generates from the
//! tools' input schemas, the policies it accepts (the worked examples of docs/policy.md) and
//! the ones it refuses, each naming the policy and its line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

use toolgate_policy::cedar::{
    CedarAnswer, CedarCaller, CedarError, CedarPolicies, ToolSignature, cedar_schema,
};

fn tools() -> Vec<ToolSignature> {
    let tool = |name: &str, input_schema| ToolSignature::new(name, input_schema);
    vec![
        ToolSignature {
            read_only: true,
            destructive: false,
            ..tool("list_bookings", json!({"type": "object", "properties": {}}))
        },
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
    assert_eq!(policies.len(), 7);
    assert_eq!(
        policies.ids(),
        [
            "admins-delete-small",
            "booking-bounds",
            "destructive-needs-write",
            "everyone-lists",
            "members-call",
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
    assert_eq!(CedarPolicies::load(&path, &tools()).unwrap().len(), 7);
    let missing = dir.path().join("none.cedar");
    let error = CedarPolicies::load(&missing, &tools()).unwrap_err();
    assert!(error.to_string().contains("none.cedar"), "{error}");
}

/// A caller with `roles`, `scopes` and `tenant`, calling over HTTP.
struct Who {
    id: String,
    roles: BTreeSet<String>,
    scopes: BTreeSet<String>,
    tenant: Option<String>,
    attributes: BTreeMap<String, String>,
}

fn who(roles: &[&str], scopes: &[&str], tenant: Option<&str>) -> Who {
    Who {
        id: format!("{}/u", tenant.unwrap_or("-")),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        tenant: tenant.map(str::to_owned),
        attributes: BTreeMap::new(),
    }
}

impl Who {
    fn caller(&self) -> CedarCaller<'_> {
        CedarCaller {
            id: &self.id,
            name: "u",
            channel: "http",
            scopes: &self.scopes,
            tenant: self.tenant.as_deref(),
            roles: &self.roles,
            attributes: &self.attributes,
        }
    }
}

/// 2026-12-05, before the worked policies' 2030 cut-off.
const NOW: i64 = 1_796_428_800;

fn call(
    policies: &CedarPolicies,
    who: &Who,
    tool: &str,
    arguments: serde_json::Value,
) -> CedarAnswer {
    policies.authorize_call(
        &who.caller(),
        tool,
        arguments.as_object(),
        NOW,
        Some("test-client"),
    )
}

fn decided(answer: &CedarAnswer) -> (bool, Vec<&str>) {
    (
        answer.allowed,
        answer.determining.iter().map(String::as_str).collect(),
    )
}

#[test]
fn calls_are_decided_with_their_typed_arguments_naming_the_determining_policies() {
    let policies = CedarPolicies::from_text(&worked(), "worked.cedar", &tools()).unwrap();
    let booking = json!({"guest": "Ada", "nights": 2, "room": {"kind": "single"}});
    let member = who(&["member"], &["write"], None);
    assert_eq!(
        decided(&call(&policies, &member, "create_booking", booking.clone())),
        (true, vec!["members-call"])
    );
    // An argument bound: a forbid wins over the member's permit.
    let long = json!({"guest": "Ada", "nights": 31, "room": {"kind": "single"}});
    assert_eq!(
        decided(&call(&policies, &member, "create_booking", long)),
        (false, vec!["booking-bounds"])
    );
    let ground = json!({"guest": "Ada", "nights": 1, "room": {"kind": "double", "floor": 0}});
    assert_eq!(
        decided(&call(&policies, &member, "create_booking", ground)),
        (false, vec!["booking-bounds"])
    );
    // No permit for members on delete_booking: denied, no determining policy.
    let small = json!({"id": "b-1", "amount": 50});
    assert_eq!(
        decided(&call(&policies, &member, "delete_booking", small.clone())),
        (false, vec![])
    );
    // The role and the amount rule of the issue.
    let admin = who(&["admin"], &["write"], None);
    assert_eq!(
        decided(&call(&policies, &admin, "delete_booking", small.clone())),
        (true, vec!["admins-delete-small"])
    );
    let large = json!({"id": "b-1", "amount": 100});
    assert_eq!(
        decided(&call(&policies, &admin, "delete_booking", large)),
        (false, vec![])
    );
    // Deny by annotation: a destructive tool without the write scope.
    let reader = who(&["admin"], &["read"], None);
    assert_eq!(
        decided(&call(&policies, &reader, "delete_booking", small)),
        (false, vec!["destructive-needs-write"])
    );
    // Tenant isolation.
    let globex = who(&["member"], &["write"], Some("globex"));
    assert_eq!(
        decided(&call(&policies, &globex, "create_booking", booking.clone())),
        (false, vec!["tenant-isolation"])
    );
    let acme = who(&["member"], &["write"], Some("acme-eu"));
    assert!(call(&policies, &acme, "create_booking", booking.clone()).allowed);
    // The time window.
    let late = policies.authorize_call(
        &member.caller(),
        "create_booking",
        booking.as_object(),
        1_893_456_000,
        None,
    );
    assert_eq!(decided(&late), (false, vec!["until-2030"]));
    // Nobody without a role.
    let nobody = who(&[], &["write"], None);
    assert_eq!(
        decided(&call(&policies, &nobody, "list_bookings", json!({}))),
        (false, vec![])
    );
}

#[test]
fn arguments_reach_cedar_only_as_their_schema_types_them() {
    let policies = CedarPolicies::from_text(&worked(), "worked.cedar", &tools()).unwrap();
    let member = who(&["member"], &["write"], None);
    // Members the schema does not declare, or cannot type (a JSON number), are left out; an
    // object that looks like Cedar's JSON escapes is a plain member and is dropped with them.
    let extra = json!({
        "guest": "Ada", "nights": 2, "price": 12.5, "surprise": true,
        "room": {"kind": "single", "__entity": {"type": "Toolgate::Role", "id": "admin"}},
        "notes": null
    });
    assert!(call(&policies, &member, "create_booking", extra).allowed);
    // A value that does not fit its type denies the call, and says why (not what the value was).
    for wrong in [
        json!({"guest": "Ada", "nights": "31", "room": {"kind": "single"}}),
        json!({"guest": "Ada", "nights": 2.5, "room": {"kind": "single"}}),
        json!({"guest": "Ada", "nights": 2, "room": {"kind": "single"}, "tags": [1]}),
        json!({"guest": "Ada", "room": {"kind": "single"}}),
        json!({"guest": "Ada", "nights": u64::MAX, "room": {"kind": "single"}}),
    ] {
        let answer = call(&policies, &member, "create_booking", wrong.clone());
        assert!(!answer.allowed, "{wrong}");
        assert_eq!(answer.errors.len(), 1, "{wrong}: {answer:?}");
        assert!(!answer.errors[0].contains("31"), "{answer:?}");
    }
    // A whole float is a Long.
    let whole = json!({"guest": "Ada", "nights": 2.0, "room": {"kind": "single"}});
    assert!(call(&policies, &member, "create_booking", whole).allowed);
    // A tool the policies were not validated against is denied.
    let unknown = call(&policies, &member, "drop_tables", json!({}));
    assert!(!unknown.allowed && !unknown.errors.is_empty());
}

#[test]
fn a_tool_is_listed_when_cedar_lists_it_and_some_arguments_could_be_permitted() {
    let policies = CedarPolicies::from_text(&worked(), "worked.cedar", &tools()).unwrap();
    let listed = |who: &Who| -> Vec<&str> {
        ["create_booking", "delete_booking", "list_bookings"]
            .into_iter()
            .filter(|tool| policies.authorize_listing(&who.caller(), tool).allowed)
            .collect()
    };
    // Members: never delete_booking (no permit can match, whatever the arguments).
    assert_eq!(
        listed(&who(&["member"], &["write"], None)),
        ["create_booking", "list_bookings"]
    );
    // Admins: delete_booking depends on the amount, so it is listed.
    assert_eq!(
        listed(&who(&["admin"], &["write"], None)),
        ["delete_booking"]
    );
    // Without the write scope every destructive tool is forbidden outright.
    assert_eq!(
        listed(&who(&["admin"], &["read"], None)),
        Vec::<&str>::new()
    );
    let answer =
        policies.authorize_listing(&who(&["admin"], &["read"], None).caller(), "delete_booking");
    assert_eq!(decided(&answer), (false, vec!["destructive-needs-write"]));
    assert_eq!(
        listed(&who(&["member"], &["read"], None)),
        ["list_bookings"]
    );
    // Another tenant, or nobody in particular: nothing.
    assert_eq!(
        listed(&who(&["member"], &["write"], Some("globex"))),
        Vec::<&str>::new()
    );
    assert_eq!(listed(&who(&[], &["write"], None)), Vec::<&str>::new());
    // Without a permit on tools/list nothing is listed, whatever the calls would say.
    let no_listing = worked().replace(
        "@id(\"everyone-lists\")\npermit(",
        "@id(\"everyone-lists\")\nforbid(",
    );
    let hidden = CedarPolicies::from_text(&no_listing, "hidden.cedar", &tools()).unwrap();
    assert!(
        !hidden
            .authorize_listing(
                &who(&["member"], &["write"], None).caller(),
                "create_booking"
            )
            .allowed
    );
}

#[test]
fn attributes_are_tags_and_the_client_name_is_in_the_context() {
    let text = r#"
@id("sales-lists") permit(principal, action == Toolgate::Action::"tools/list", resource)
when { principal.hasTag("dept") && principal.getTag("dept") == "sales" };
@id("sales-from-the-cli") permit(principal, action in Toolgate::Action::"tools/call", resource)
when { principal.hasTag("dept") && principal.getTag("dept") == "sales" && context has client && context.client == "cli" };
"#;
    let policies = CedarPolicies::from_text(text, "tags.cedar", &tools()).unwrap();
    let mut sales = who(&[], &[], None);
    sales
        .attributes
        .insert("dept".to_owned(), "sales".to_owned());
    let answer = policies.authorize_call(&sales.caller(), "list_bookings", None, NOW, Some("cli"));
    assert_eq!(decided(&answer), (true, vec!["sales-from-the-cli"]));
    let other_client =
        policies.authorize_call(&sales.caller(), "list_bookings", None, NOW, Some("web"));
    assert!(!other_client.allowed);
    assert!(
        policies
            .authorize_listing(&sales.caller(), "list_bookings")
            .allowed
    );
    let nobody = who(&[], &[], None);
    assert!(
        !policies
            .authorize_listing(&nobody.caller(), "list_bookings")
            .allowed
    );
}

#[test]
fn a_json_policy_names_its_cedar_file_relative_to_itself() {
    use toolgate_policy::{Policy, PolicyError};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cedar")).unwrap();
    std::fs::write(dir.path().join("cedar/bookings.cedar"), worked()).unwrap();
    let json = r#"{"version": 1, "allow": ["create_booking"], "cedar": "cedar/bookings.cedar"}"#;
    std::fs::write(dir.path().join("policy.json"), json).unwrap();
    let policy = Policy::load(&dir.path().join("policy.json")).unwrap();
    let source = policy.cedar().expect("the policy names Cedar policies");
    assert_eq!(source.path(), dir.path().join("cedar/bookings.cedar"));
    assert_eq!(source.text(), worked());
    // The policy's digest names both texts: the same JSON without Cedar is another policy, and
    // so is the same JSON with other Cedar text.
    let plain = Policy::from_json(r#"{"version": 1, "allow": ["create_booking"]}"#).unwrap();
    assert_ne!(policy.digest(), plain.digest());
    std::fs::write(
        dir.path().join("cedar/bookings.cedar"),
        worked() + "\n// edited\n",
    )
    .unwrap();
    let edited = Policy::load(&dir.path().join("policy.json")).unwrap();
    assert_ne!(edited.digest(), policy.digest());
    // Validated against the tools by whoever knows them (the gate).
    assert_eq!(
        CedarPolicies::from_source(edited.cedar().unwrap(), &tools())
            .unwrap()
            .len(),
        7
    );

    // A missing file, text that is not Cedar and a `null` are refused when the policy loads.
    std::fs::remove_file(dir.path().join("cedar/bookings.cedar")).unwrap();
    let missing = Policy::load(&dir.path().join("policy.json")).unwrap_err();
    assert!(missing.to_string().contains("bookings.cedar"), "{missing}");
    std::fs::write(dir.path().join("cedar/bookings.cedar"), "permit(principal,").unwrap();
    let broken = Policy::load(&dir.path().join("policy.json")).unwrap_err();
    assert!(
        broken.to_string().contains("bookings.cedar")
            && broken.to_string().contains("not valid Cedar"),
        "{broken}"
    );
    let null = Policy::from_json(r#"{"version": 1, "cedar": null}"#).unwrap_err();
    assert!(matches!(null, PolicyError::Syntax { .. }), "{null}");
}

#[test]
fn tags_from_the_json_policy_are_the_tools_tags_in_cedar() {
    use toolgate_policy::Policy;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tags.cedar"),
        "@id(\"lists\") permit(principal, action == Toolgate::Action::\"tools/list\", resource);\n\
         @id(\"calls\") permit(principal, action in Toolgate::Action::\"tools/call\", resource);\n\
         @id(\"pii-staff-only\") forbid(principal, action, resource)\n\
           when { resource.tags.contains(\"pii\") } unless { principal in Toolgate::Role::\"staff\" };\n",
    )
    .unwrap();
    let json = r#"{"version": 1, "allow": ["list_bookings", "delete_booking"],
        "cedar": "tags.cedar", "tags": {"delete_booking": ["pii", "billing"]}}"#;
    std::fs::write(dir.path().join("policy.json"), json).unwrap();
    let policy = Policy::load(&dir.path().join("policy.json")).unwrap();
    let tags: Vec<&str> = policy
        .tags("delete_booking")
        .unwrap()
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(tags, ["billing", "pii"]);
    assert!(policy.tags("list_bookings").is_none());
    let signatures: Vec<ToolSignature> = tools().iter().map(|t| policy.signature(t)).collect();
    let set = CedarPolicies::from_source(policy.cedar().unwrap(), &signatures).unwrap();
    let arguments = json!({"id": "b-1", "amount": 5});
    let guest = who(&[], &[], None);
    let staff = who(&["staff"], &[], None);
    for (caller, tool, allowed, determining) in [
        (&guest, "delete_booking", false, vec!["pii-staff-only"]),
        (&staff, "delete_booking", true, vec!["calls"]),
        (&guest, "list_bookings", true, vec!["calls"]),
    ] {
        let answer = call(&set, caller, tool, arguments.clone());
        assert_eq!(
            decided(&answer),
            (allowed, determining),
            "{tool}: {answer:?}"
        );
    }
    // Without the policy's tags the same Cedar text sees none.
    let untagged = CedarPolicies::from_source(policy.cedar().unwrap(), &tools()).unwrap();
    assert!(call(&untagged, &guest, "delete_booking", arguments).allowed);

    // Refused: tags without Cedar, a tag that is not a name, a tag twice, an unknown tool.
    for (json, says) in [
        (
            r#"{"version": 1, "allow": ["a"], "tags": {"a": ["pii"]}}"#,
            "names none",
        ),
        (
            r#"{"version": 1, "allow": ["a"], "cedar": "tags.cedar", "tags": {"a": ["PII"]}}"#,
            "\"PII\"",
        ),
        (
            r#"{"version": 1, "allow": ["a"], "cedar": "tags.cedar", "tags": {"a": ["pii", "pii"]}}"#,
            "twice",
        ),
        (
            r#"{"version": 1, "allow": ["a"], "cedar": "tags.cedar", "tags": {"b": ["pii"]}}"#,
            "does not allow",
        ),
    ] {
        std::fs::write(dir.path().join("refused.json"), json).unwrap();
        let error = Policy::load(&dir.path().join("refused.json")).unwrap_err();
        assert!(
            error.to_string().contains("invalid policy") && error.to_string().contains(says),
            "{json}: {error}"
        );
    }
}
