//! Cedar policy sets loaded against a fixed set of tools (two tools with typed arguments). The
//! input is the policy text. Properties: `CedarPolicies::from_text` never panics; a set that
//! loads loads again with the same digest and ids; a refusal names at least one problem, each
//! with a line inside the text; a loaded set decides a call and a listing without panicking, an
//! answer with errors is never an allow; a tool is listed only where Cedar's own authorizer
//! (the whole set, entities and request built here against the schema) permits `tools/list`
//! on it, and a call allowed is a tool listed where it does.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr as _;

use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    PolicySet, Request, RestrictedExpression, Schema,
};

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use toolgate_policy::cedar::{
    CedarCaller, CedarError, CedarPolicies, ToolSignature, cedar_schema,
};

fn tools() -> Vec<ToolSignature> {
    vec![
        ToolSignature::new(
            "delete_booking",
            json!({"type": "object", "properties": {
                "id": {"type": "string"}, "amount": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "room": {"type": "object", "properties": {"floor": {"type": "integer"}}}
            }, "required": ["id", "amount"]}),
        ),
        ToolSignature::new("list_bookings", json!({"type": "object"})),
    ]
}

fn uid(kind: &str, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(
        EntityTypeName::from_str(&format!("Toolgate::{kind}")).expect("a type name"),
        EntityId::new(id),
    )
}

/// Whether Cedar itself permits `tools/list` on `tool` for the caller below (acme/alice, role
/// admin, over http), without errors: the whole set, the entities and the request built here.
fn list_permitted(policies: &PolicySet, schema: &Schema, tool: &ToolSignature) -> bool {
    let string = |text: &str| RestrictedExpression::new_string(text.to_owned());
    let caller = uid("Caller", "acme/alice");
    let attributes = HashMap::from([
        ("name".to_owned(), string("alice")),
        ("channel".to_owned(), string("http")),
        ("scopes".to_owned(), RestrictedExpression::new_set([])),
        ("tenant".to_owned(), string("acme")),
    ]);
    let admin = uid("Role", "admin");
    let flag = RestrictedExpression::new_bool;
    let entities = vec![
        Entity::new_no_attrs(admin.clone(), HashSet::new()),
        Entity::new(caller.clone(), attributes, HashSet::from([admin])).expect("the caller"),
        Entity::new(
            uid("Tool", &tool.name),
            HashMap::from([
                ("read_only".to_owned(), flag(tool.read_only)),
                ("destructive".to_owned(), flag(tool.destructive)),
                ("idempotent".to_owned(), flag(tool.idempotent)),
                ("open_world".to_owned(), flag(tool.open_world)),
                (
                    "tags".to_owned(),
                    RestrictedExpression::new_set(
                        tool.tags.iter().cloned().map(RestrictedExpression::new_string),
                    ),
                ),
            ]),
            HashSet::new(),
        )
        .expect("the tool"),
    ];
    let entities = Entities::from_entities(entities, Some(schema)).expect("the entities");
    let request = Request::new(
        caller,
        uid("Action", "tools/list"),
        uid("Tool", &tool.name),
        Context::empty(),
        Some(schema),
    )
    .expect("a request that fits the schema");
    let response = Authorizer::new().is_authorized(&request, policies, &entities);
    response.decision() == Decision::Allow && response.diagnostics().errors().next().is_none()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tools = tools();
    let set = match CedarPolicies::from_text(text, "fuzz.cedar", &tools) {
        Ok(set) => set,
        Err(CedarError::Syntax { problems, .. } | CedarError::Invalid { problems, .. }) => {
            assert!(!problems.is_empty(), "a refusal names its problems");
            let lines = text.lines().count().max(1);
            for problem in &problems {
                if let Some(line) = problem.line {
                    assert!(line >= 1 && line <= lines + 1, "{problem} in {lines} lines");
                }
            }
            return;
        }
        Err(other) => panic!("unexpected refusal: {other}"),
    };
    let again = CedarPolicies::from_text(text, "fuzz.cedar", &tools).expect("loads again");
    assert_eq!(set.digest(), again.digest());
    assert_eq!(set.ids(), again.ids());
    let roles: BTreeSet<String> = ["admin".to_owned()].into();
    let scopes = BTreeSet::new();
    let attributes = BTreeMap::new();
    let caller = CedarCaller {
        id: "acme/alice",
        name: "alice",
        channel: "http",
        scopes: &scopes,
        tenant: Some("acme"),
        roles: &roles,
        attributes: &attributes,
    };
    let whole = PolicySet::from_str(text).expect("a set that loaded parses");
    let schema = Schema::from_json_value(cedar_schema(&tools)).expect("the tools' schema");
    let arguments = json!({"id": "b-1", "amount": 50, "tags": ["x"], "room": {"floor": 2}});
    for tool in &tools {
        let name = tool.name.as_str();
        let call = set.authorize_call(&caller, name, arguments.as_object(), 1_796_428_800, None);
        let listing = set.authorize_listing(&caller, name);
        for answer in [&call, &listing] {
            assert!(!answer.allowed || answer.errors.is_empty(), "{answer:?}");
        }
        // Listing needs Cedar's permit of tools/list; where it has it, a call allowed is listed
        // (a call without that permit is refused by the gate as an unknown tool).
        let list_allowed = list_permitted(&whole, &schema, tool);
        assert!(!listing.allowed || list_allowed, "listed without a permit: {text}");
        if call.allowed && list_allowed {
            assert!(listing.allowed, "a call allowed of a tool not listed: {text}");
        }
    }
});
