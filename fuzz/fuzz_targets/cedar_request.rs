//! Cedar requests built from arbitrary call arguments, under a fixed policy set (a role's permit
//! with an argument bound, a forbid on a nested optional argument, a tenant forbid). The input is
//! a byte choosing the caller, then the arguments' JSON. Properties: building and deciding never
//! panic; the answer is deterministic; an answer with errors (arguments that do not fit their
//! Cedar types, a policy that errs) is never an allow; an allowed call satisfies the policies as
//! read directly off the JSON (admin role, amount under 100, floor not 0, tenant acme); a call
//! allowed is a tool listed.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use toolgate_policy::cedar::{CedarCaller, CedarPolicies, ToolSignature};

const POLICIES: &str = r#"
@id("lists") permit(principal, action == Toolgate::Action::"tools/list", resource);
@id("admins-small") permit(principal in Toolgate::Role::"admin", action == Toolgate::Action::"delete_booking", resource)
when { context.arguments.amount < 100 };
@id("no-ground-floor") forbid(principal, action == Toolgate::Action::"delete_booking", resource)
when { context.arguments has room && context.arguments.room has floor && context.arguments.room.floor == 0 };
@id("acme-only") forbid(principal, action in Toolgate::Action::"tools/call", resource)
unless { principal has tenant && principal.tenant == "acme" };
"#;

fuzz_target!(|data: &[u8]| {
    let Some((&who, rest)) = data.split_first() else {
        return;
    };
    let Ok(arguments) = serde_json::from_slice::<Map<String, Value>>(rest) else {
        return;
    };
    let tools = vec![ToolSignature::new(
        "delete_booking",
        json!({"type": "object", "properties": {
            "id": {"type": "string"}, "amount": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "room": {"type": "object", "properties": {"floor": {"type": "integer"}, "kind": {"type": "string"}}}
        }, "required": ["id", "amount"]}),
    )];
    let set = CedarPolicies::from_text(POLICIES, "fuzz.cedar", &tools).expect("the policies fit");
    let admin = who & 1 == 1;
    let tenant = match who >> 1 & 3 {
        0 => None,
        1 => Some("acme"),
        2 => Some("globex"),
        _ => Some("acme\u{0}"),
    };
    let roles: BTreeSet<String> = if admin { ["admin".to_owned()].into() } else { BTreeSet::new() };
    let scopes = BTreeSet::new();
    let attributes = BTreeMap::new();
    let caller = CedarCaller {
        id: "u",
        name: "u",
        channel: "http",
        scopes: &scopes,
        tenant,
        roles: &roles,
        attributes: &attributes,
    };
    let answer = set.authorize_call(&caller, "delete_booking", Some(&arguments), 0, None);
    let again = set.authorize_call(&caller, "delete_booking", Some(&arguments), 0, None);
    assert_eq!(answer, again);
    assert!(!answer.allowed || answer.errors.is_empty(), "{answer:?}");
    if answer.allowed {
        let amount = arguments.get("amount").and_then(Value::as_f64).expect("an amount");
        assert!(admin && amount < 100.0 && tenant == Some("acme"), "{arguments:?}");
        let floor = arguments.get("room").and_then(|room| room.get("floor"));
        assert!(floor.and_then(Value::as_f64) != Some(0.0), "{arguments:?}");
        assert!(set.authorize_listing(&caller, "delete_booking").allowed);
    }
});
