//! Property: for random Cedar policy sets, callers, tools and arguments, toolgate's decision is
//! `cedar_policy::Authorizer`'s on the whole set (with every entity and the schema-validated
//! request built independently here), combined with the JSON policy as docs/policy.md says:
//! a call runs exactly when the JSON policy allows it, Cedar permits `tools/list` on the tool and
//! Cedar permits the call. The determining policies agree too. This covers what toolgate adds on
//! top of Cedar: the arguments' projection, the per-tool policy subsets and the entity cache.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr as _;

use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    PolicySet, Request, RestrictedExpression, Schema,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolgate_policy::Policy;
use toolgate_policy::cedar::{
    CedarPolicies, Principal, Request as CaseRequest, ToolSignature, cedar_schema, explain,
};

const TOOLS: [&str; 3] = ["alpha", "beta", "gamma"];
const ROLES: [&str; 3] = ["admin", "staff", "guest"];
const IDS: [&str; 3] = ["alice", "acme/bob", "https://idp.example#acme/carol"];

fn tools() -> Vec<ToolSignature> {
    TOOLS
        .iter()
        .enumerate()
        .map(|(i, name)| ToolSignature {
            destructive: i == 2,
            read_only: i == 0,
            tags: if i == 1 {
                ["billing".to_owned()].into()
            } else {
                Default::default()
            },
            ..ToolSignature::new(
                *name,
                json!({"type": "object", "properties": {
                    "amount": {"type": "integer"},
                    "region": {"type": "string"}
                }, "required": ["amount"]}),
            )
        })
        .collect()
}

/// One policy of the generated sets.
fn policy() -> impl Strategy<Value = String> {
    let effect = prop_oneof![Just("permit"), Just("forbid")];
    let principal = prop_oneof![
        Just("principal".to_owned()),
        (0..3usize).prop_map(|r| format!("principal in Toolgate::Role::\"{}\"", ROLES[r])),
        (0..3usize).prop_map(|i| format!("principal == Toolgate::Caller::\"{}\"", IDS[i])),
        Just("principal is Toolgate::Caller".to_owned()),
        (0..3usize).prop_map(|r| format!(
            "principal is Toolgate::Caller in Toolgate::Role::\"{}\"",
            ROLES[r]
        )),
    ];
    let resource = prop_oneof![
        Just("resource".to_owned()),
        Just("resource".to_owned()),
        (0..3usize).prop_map(|t| format!("resource == Toolgate::Tool::\"{}\"", TOOLS[t])),
        (0..3usize).prop_map(|t| format!("resource in Toolgate::Tool::\"{}\"", TOOLS[t])),
        Just("resource is Toolgate::Tool".to_owned()),
        (0..3usize).prop_map(|t| format!(
            "resource is Toolgate::Tool in Toolgate::Tool::\"{}\"",
            TOOLS[t]
        )),
    ];
    let action = prop_oneof![
        Just("action".to_owned()),
        (0..3usize).prop_map(|t| format!("action == Toolgate::Action::\"{}\"", TOOLS[t])),
        Just("action == Toolgate::Action::\"tools/list\"".to_owned()),
        Just("action in Toolgate::Action::\"tools/call\"".to_owned()),
        (0..3usize, 0..3usize).prop_map(|(a, b)| format!(
            "action in [Toolgate::Action::\"{}\", Toolgate::Action::\"{}\"]",
            TOOLS[a], TOOLS[b]
        )),
    ];
    let condition = prop_oneof![
        // Policies without a condition are decided from their scopes alone (the gate's shortcut).
        3 => Just(String::new()),
        1 => Just(" when { resource.tags.contains(\"billing\") }".to_owned()),
        // Errs (an overflow) for amounts above 4, or in a call without arguments.
        1 => Just(" when { context.arguments.amount * 2305843009213693952 > 0 }".to_owned()),
        // Errs (an overflow) for callers with a tenant, whatever the call's context.
        1 => Just(" when { 9223372036854775807 + (if principal has tenant then 1 else 0) > 0 }".to_owned()),
        1 => (0..200i64).prop_map(|k| format!(
            " when {{ context has arguments && context.arguments.amount < {k} }}"
        )),
        1 => Just(" when { principal has tenant && principal.tenant == \"acme\" }".to_owned()),
        1 => Just(" unless { resource.destructive }".to_owned()),
        1 => Just(" when { principal.hasTag(\"dept\") && principal.getTag(\"dept\") == \"sales\" }".to_owned()),
        1 => Just(" when { context has arguments && context.arguments has region && context.arguments.region == \"eu\" }".to_owned()),
    ];
    (effect, principal, action, resource, condition)
        .prop_map(|(e, p, a, r, c)| format!("{e}({p}, {a}, {r}){c};"))
}

/// A caller: which identity, its roles, tenant and dept tag.
#[derive(Debug, Clone)]
struct Who {
    id: usize,
    roles: BTreeSet<String>,
    tenant: Option<String>,
    dept: Option<String>,
}

fn who() -> impl Strategy<Value = Who> {
    (
        0..3usize,
        proptest::collection::btree_set(0..3usize, 0..3),
        prop_oneof![Just(None), Just(Some("acme")), Just(Some("globex"))],
        prop_oneof![Just(None), Just(Some("sales")), Just(Some("ops"))],
    )
        .prop_map(|(id, roles, tenant, dept)| Who {
            id,
            roles: roles.into_iter().map(|r| ROLES[r].to_owned()).collect(),
            tenant: tenant.map(str::to_owned),
            dept: dept.map(str::to_owned),
        })
}

fn uid(kind: &str, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(
        EntityTypeName::from_str(&format!("Toolgate::{kind}")).unwrap(),
        EntityId::new(id),
    )
}

/// Cedar's own decision on the whole set: every action entity from the schema, the caller and
/// tool built here, the request validated against the schema.
fn reference(
    set: &PolicySet,
    schema: &Schema,
    who: &Who,
    tool: &ToolSignature,
    action: &str,
    context: Context,
) -> (bool, Vec<String>) {
    let caller = uid("Caller", IDS[who.id]);
    let mut attributes = HashMap::from([
        (
            "name".to_owned(),
            RestrictedExpression::new_string("n".to_owned()),
        ),
        (
            "channel".to_owned(),
            RestrictedExpression::new_string("http".to_owned()),
        ),
        ("scopes".to_owned(), RestrictedExpression::new_set([])),
    ]);
    if let Some(tenant) = &who.tenant {
        attributes.insert(
            "tenant".to_owned(),
            RestrictedExpression::new_string(tenant.clone()),
        );
    }
    let tags: Vec<(String, RestrictedExpression)> = who
        .dept
        .iter()
        .map(|d| {
            (
                "dept".to_owned(),
                RestrictedExpression::new_string(d.clone()),
            )
        })
        .collect();
    let roles: HashSet<EntityUid> = who.roles.iter().map(|r| uid("Role", r)).collect();
    let mut entities: Vec<Entity> = roles
        .iter()
        .map(|r| Entity::new_no_attrs(r.clone(), HashSet::new()))
        .collect();
    entities.push(Entity::new_with_tags(caller.clone(), attributes, roles, tags).unwrap());
    entities.push(
        Entity::new(
            uid("Tool", &tool.name),
            HashMap::from([
                (
                    "read_only".to_owned(),
                    RestrictedExpression::new_bool(tool.read_only),
                ),
                (
                    "destructive".to_owned(),
                    RestrictedExpression::new_bool(tool.destructive),
                ),
                (
                    "idempotent".to_owned(),
                    RestrictedExpression::new_bool(tool.idempotent),
                ),
                (
                    "open_world".to_owned(),
                    RestrictedExpression::new_bool(tool.open_world),
                ),
                (
                    "tags".to_owned(),
                    RestrictedExpression::new_set(
                        tool.tags
                            .iter()
                            .map(|t| RestrictedExpression::new_string(t.clone())),
                    ),
                ),
            ]),
            HashSet::new(),
        )
        .unwrap(),
    );
    let entities = Entities::from_entities(entities, Some(schema)).unwrap();
    let request = Request::new(
        caller,
        uid("Action", action),
        uid("Tool", &tool.name),
        context,
        Some(schema),
    )
    .unwrap();
    let response = Authorizer::new().is_authorized(&request, set, &entities);
    let mut determining: Vec<String> = response
        .diagnostics()
        .reason()
        .map(|id| {
            set.annotation(id, "id")
                .map_or_else(|| id.to_string(), str::to_owned)
        })
        .collect();
    determining.sort();
    let errors = response.diagnostics().errors().count();
    (
        response.decision() == Decision::Allow && errors == 0,
        determining,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn the_gate_decides_as_cedar_and_the_json_policy_do(
        policies in proptest::collection::vec(policy(), 0..12),
        callers in proptest::collection::vec(who(), 1..4),
        tool in 0..3usize,
        amount in -5i64..250,
        region in prop_oneof![Just(None), Just(Some("eu")), Just(Some("us"))],
        json_allows in proptest::collection::vec(any::<bool>(), 3),
    ) {
        let text: String = policies
            .iter()
            .enumerate()
            .map(|(i, p)| format!("@id(\"p{i}\")\n{p}\n"))
            .collect();
        let tools = tools();
        let Ok(set) = CedarPolicies::from_text(&text, "generated.cedar", &tools) else {
            // A generated policy that does not fit (e.g. arguments read for tools/list) is
            // refused as a whole; the property is about sets that load.
            return Ok(());
        };
        let schema = Schema::from_json_value(cedar_schema(&tools)).unwrap();
        let whole = PolicySet::from_str(&text).unwrap();
        let allow: Vec<&str> = TOOLS
            .iter()
            .zip(&json_allows)
            .filter_map(|(t, a)| a.then_some(*t))
            .collect();
        let json_policy =
            Policy::from_json(&json!({"version": 1, "allow": allow}).to_string()).unwrap();
        let signature = &tools[tool];
        let mut arguments = Map::new();
        arguments.insert("amount".to_owned(), json!(amount));
        if let Some(region) = region {
            arguments.insert("region".to_owned(), json!(region));
        }
        // The same callers again, in another order: the entity cache must not mix them up.
        for who in callers.iter().chain(callers.iter().rev()) {
            let mut args_record = vec![(
                "amount".to_owned(),
                RestrictedExpression::new_long(amount),
            )];
            if let Some(region) = region {
                args_record.push((
                    "region".to_owned(),
                    RestrictedExpression::new_string(region.to_owned()),
                ));
            }
            let context = Context::from_pairs([
                (
                    "arguments".to_owned(),
                    RestrictedExpression::new_record(args_record).unwrap(),
                ),
                ("now".to_owned(), RestrictedExpression::new_long(1_796_428_800)),
            ])
            .unwrap();
            let (call_allowed, call_policies) =
                reference(&whole, &schema, who, signature, &signature.name, context);
            let (list_allowed, _) =
                reference(&whole, &schema, who, signature, "tools/list", Context::empty());

            let mut attributes = BTreeMap::new();
            if let Some(dept) = &who.dept {
                attributes.insert("dept".to_owned(), dept.clone());
            }
            let principal = Principal {
                id: IDS[who.id].to_owned(),
                name: Some("n".to_owned()),
                channel: Some("http".to_owned()),
                tenant: who.tenant.clone(),
                scopes: BTreeSet::new(),
                roles: who.roles.clone(),
                attributes,
            };
            let call = set.authorize_call(
                &principal.caller(),
                &signature.name,
                Some(&arguments),
                1_796_428_800,
                None,
            );
            prop_assert_eq!(call.allowed, call_allowed, "call {:?}\n{}", who, text);
            prop_assert_eq!(&*call.determining, call_policies.as_slice(), "call {:?}\n{}", who, text);
            let listing = set.authorize_listing(&principal.caller(), &signature.name);
            // Listed needs Cedar's tools/list permit; a call it permits is always listed.
            prop_assert!(!listing.allowed || list_allowed, "listing {:?}\n{}", who, text);
            prop_assert!(!(call_allowed && list_allowed) || listing.allowed, "{:?}\n{}", who, text);

            // Composed with the JSON policy, as the gate composes them.
            let explained = explain(
                &json_policy,
                Some(&set),
                &CaseRequest {
                    principal,
                    tool: signature.name.clone(),
                    arguments: arguments.clone(),
                    now: Some(1_796_428_800),
                    client: None,
                },
            );
            let json_allowed = json_allows[tool];
            prop_assert_eq!(
                explained.allowed,
                json_allowed && list_allowed && call_allowed,
                "explain {:?}\n{}", who, text
            );
            prop_assert_eq!(explained.listed, json_allowed && listing.allowed);
        }
    }
}

#[test]
fn names_unicode_and_look_alikes_do_not_reach_another_identity() {
    // A tool or caller whose name only looks like another one's is another entity.
    let text = "@id(\"l\") permit(principal, action == Toolgate::Action::\"tools/list\", resource);\n\
                @id(\"a\") permit(principal == Toolgate::Caller::\"alice\", action in Toolgate::Action::\"tools/call\", resource);";
    let set = CedarPolicies::from_text(text, "t.cedar", &tools()).unwrap();
    let none = BTreeSet::new();
    let no_attributes = BTreeMap::new();
    for id in [
        "alice",
        "ALICE",
        "alice ",
        "al\u{0456}ce",
        "alice\u{0}",
        "acme/alice",
    ] {
        let caller = toolgate_policy::cedar::CedarCaller {
            id,
            name: id,
            channel: "stdio",
            scopes: &none,
            tenant: None,
            roles: &none,
            attributes: &no_attributes,
        };
        let arguments: Map<String, Value> = json!({"amount": 1}).as_object().unwrap().clone();
        let answer = set.authorize_call(&caller, "alpha", Some(&arguments), 0, None);
        assert_eq!(answer.allowed, id == "alice", "{id:?}");
        // A tool name that differs in case or Unicode is no tool of the set: denied.
        for tool in ["Alpha", "alpha\u{200b}", "alph\u{0430}"] {
            assert!(
                !set.authorize_call(&caller, tool, Some(&arguments), 0, None)
                    .allowed
            );
        }
    }
}
