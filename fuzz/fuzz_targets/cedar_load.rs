//! Cedar policy sets loaded against a fixed set of tools (two tools with typed arguments). The
//! input is the policy text. Properties: `CedarPolicies::from_text` never panics; a set that
//! loads loads again with the same digest and ids; a refusal names at least one problem, each
//! with a line inside the text; a loaded set decides a call and a listing without panicking, an
//! answer with errors is never an allow, and a call allowed is a tool listed.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use toolgate_policy::cedar::{CedarCaller, CedarError, CedarPolicies, ToolSignature};

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
    let arguments = json!({"id": "b-1", "amount": 50, "tags": ["x"], "room": {"floor": 2}});
    for tool in ["delete_booking", "list_bookings"] {
        let call = set.authorize_call(&caller, tool, arguments.as_object(), 1_796_428_800, None);
        let listing = set.authorize_listing(&caller, tool);
        for answer in [&call, &listing] {
            assert!(!answer.allowed || answer.errors.is_empty(), "{answer:?}");
        }
        if call.allowed {
            assert!(listing.allowed, "a call allowed of a tool not listed: {text}");
        }
    }
});
