//! The Cedar step's cost next to the JSON policy's decision, measured in the same run: the JSON
//! policy's `decide_for` alone, then `CedarPolicies::authorize_call` and `authorize_listing` with
//! 1, 100 and 1,000 Cedar policies over 20 tools (roles, tenants, argument bounds, time windows,
//! annotations), and 1,000 written per tenant (50 tenants, one rule per tenant and tool), for one
//! caller in a tenant with two roles calling a tool with three typed arguments.
//!
//! Goal (docs/BENCHMARKS.md, "Cedar"): the Cedar step adds at most 10 us p50 at 1,000 policies.
//! Criterion's report, then a summary of medians measured interleaved.
//!
//! Run: `cargo bench -p toolgate-policy --features cedar --bench cedar`

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use serde_json::{Map, Value, json};
use toolgate_policy::Policy;
use toolgate_policy::cedar::{CedarCaller, CedarPolicies, ToolSignature};

const TOOLS: usize = 20;
const NOW: i64 = 1_796_428_800;

fn tool_name(i: usize) -> String {
    format!("tool_{i:02}")
}

fn tools() -> Vec<ToolSignature> {
    (0..TOOLS)
        .map(|i| ToolSignature {
            read_only: i % 4 == 0,
            destructive: i % 4 == 3,
            ..ToolSignature::new(
                tool_name(i),
                json!({"type": "object", "properties": {
                    "id": {"type": "string"},
                    "amount": {"type": "integer"},
                    "region": {"type": "string", "enum": ["eu", "us"]},
                    "note": {"type": "string"}
                }, "required": ["id", "amount", "region"]}),
            )
        })
        .collect()
}

/// `n` policies over the tools, each tool getting all five shapes in turn: a role's permit, an
/// argument bound, a tenant forbid, a time window and a deny by annotation; plus one listing
/// permit. At 1,000, the called tool has 50 policies: 10 role permits (3 of them the caller's
/// roles) and 40 forbids whose conditions Cedar evaluates.
fn policies(n: usize) -> String {
    let mut text = String::from(
        "@id(\"lists\")\npermit(principal, action == Toolgate::Action::\"tools/list\", resource);\n",
    );
    for i in 0..n.saturating_sub(1) {
        let tool = tool_name(i % TOOLS);
        // Each tool gets every shape (the shape cycles once per round over the tools).
        let rule = match (i / TOOLS) % 5 {
            0 => format!(
                "permit(principal in Toolgate::Role::\"role-{}\", action == Toolgate::Action::\"{tool}\", resource);",
                i % 7
            ),
            1 => format!(
                "forbid(principal, action == Toolgate::Action::\"{tool}\", resource) when {{ context.arguments.amount > {} }};",
                100 + i
            ),
            2 => format!(
                "forbid(principal, action == Toolgate::Action::\"{tool}\", resource) when {{ principal has tenant && principal.tenant == \"tenant-{i}\" }};"
            ),
            3 => format!(
                "forbid(principal, action == Toolgate::Action::\"{tool}\", resource) when {{ context.now > {} }};",
                NOW + 1_000_000 + i64::try_from(i).unwrap()
            ),
            _ => format!(
                "forbid(principal, action == Toolgate::Action::\"{tool}\", resource) when {{ resource.destructive && !principal.scopes.contains(\"write-{i}\") && context.arguments.region == \"us\" }};"
            ),
        };
        text.push_str(&format!("@id(\"p{i}\")\n{rule}\n"));
    }
    text
}

/// `n` policies as a multi-tenant deployment writes them: each of 50 tenants has its own rule on
/// each tool (a permit under an argument bound, or a forbid on a region), plus one listing
/// permit; a caller in a tenant meets one policy per tool.
fn tenant_policies(n: usize) -> String {
    let mut text = String::from(
        "@id(\"lists\")\npermit(principal, action == Toolgate::Action::\"tools/list\", resource);\n",
    );
    for i in 0..n.saturating_sub(1) {
        let tenant = match i % 50 {
            0 => "acme".to_owned(),
            t => format!("tenant-{t}"),
        };
        let tool = tool_name((i / 50) % TOOLS);
        let when = format!("principal has tenant && principal.tenant == \"{tenant}\"");
        let rule = if i % 2 == 0 {
            format!(
                "permit(principal, action == Toolgate::Action::\"{tool}\", resource) when {{ {when} && context.arguments.amount < {} }};",
                100 + i % 900
            )
        } else {
            format!(
                "forbid(principal, action == Toolgate::Action::\"{tool}\", resource) when {{ {when} && context.arguments.region == \"us\" }};"
            )
        };
        text.push_str(&format!("@id(\"t{i}\")\n{rule}\n"));
    }
    text
}

struct Caller {
    roles: BTreeSet<String>,
    scopes: BTreeSet<String>,
    attributes: BTreeMap<String, String>,
}

impl Caller {
    fn cedar(&self) -> CedarCaller<'_> {
        CedarCaller {
            id: "acme/alice",
            name: "alice",
            channel: "http",
            scopes: &self.scopes,
            tenant: Some("acme"),
            roles: &self.roles,
            attributes: &self.attributes,
        }
    }
}

fn main() {
    let caller = Caller {
        roles: ["role-0".to_owned(), "role-5".to_owned()].into(),
        scopes: ["write".to_owned()].into(),
        attributes: BTreeMap::new(),
    };
    let arguments: Map<String, Value> = json!({"id": "b-1", "amount": 50, "region": "eu"})
        .as_object()
        .unwrap()
        .clone();
    let tool = tool_name(5);
    let allow: Vec<String> = (0..TOOLS).map(tool_name).collect();
    let json_policy =
        Policy::from_json(&json!({"version": 1, "allow": allow}).to_string()).unwrap();
    let sets: Vec<(String, CedarPolicies)> = [
        ("1".to_owned(), policies(1)),
        ("100".to_owned(), policies(100)),
        ("1000".to_owned(), policies(1000)),
        ("1000_tenants".to_owned(), tenant_policies(1000)),
    ]
    .into_iter()
    .map(|(label, text)| {
        let set = CedarPolicies::from_text(&text, "bench.cedar", &tools()).unwrap();
        (label, set)
    })
    .collect();
    // The request is decided as intended: permitted (by role-0's permit on tool_05 in the mixed
    // sets, by acme's own permit in the per-tenant one; the set of one only lists).
    for (label, set) in &sets {
        let answer = set.authorize_call(&caller.cedar(), &tool, Some(&arguments), NOW, None);
        assert_eq!(answer.allowed, label != "1", "{label}: {answer:?}");
        assert!(answer.errors.is_empty());
    }

    // A call the amount bounds forbid (in the mixed sets): every applicable policy is evaluated
    // to name each satisfied `forbid`.
    let over: Map<String, Value> = json!({"id": "b-1", "amount": 100_000, "region": "eu"})
        .as_object()
        .unwrap()
        .clone();
    for (label, set) in &sets[1..3] {
        let answer = set.authorize_call(&caller.cedar(), &tool, Some(&over), NOW, None);
        assert!(
            !answer.allowed && !answer.determining.is_empty(),
            "{label}: {answer:?}"
        );
    }

    let mut criterion = Criterion::default().configure_from_args();
    criterion.bench_function("json_decide", |b| {
        b.iter(|| black_box(json_policy.decide_for("acme/alice", &tool, Some(&arguments))));
    });
    for (n, set) in &sets {
        criterion.bench_function(&format!("cedar_call_{n}"), |b| {
            b.iter(|| {
                black_box(set.authorize_call(&caller.cedar(), &tool, Some(&arguments), NOW, None))
            });
        });
        criterion.bench_function(&format!("cedar_forbidden_{n}"), |b| {
            b.iter(|| {
                black_box(set.authorize_call(&caller.cedar(), &tool, Some(&over), NOW, None))
            });
        });
        criterion.bench_function(&format!("cedar_listing_{n}"), |b| {
            b.iter(|| black_box(set.authorize_listing(&caller.cedar(), &tool)));
        });
    }
    criterion.final_summary();

    // Medians of 15 interleaved rounds of 2,000 decisions each.
    let median = |mut samples: Vec<f64>| {
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2]
    };
    let rounds = 15;
    let per_round = 2_000;
    let mut json_ns = Vec::new();
    let mut call_ns: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
    let mut list_ns: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
    let mut forbidden_ns: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..per_round {
            f();
        }
        start.elapsed().as_nanos() as f64 / f64::from(per_round)
    };
    for _ in 0..rounds {
        json_ns.push(time(&mut || {
            black_box(json_policy.decide_for("acme/alice", &tool, Some(&arguments)));
        }));
        for (i, (_, set)) in sets.iter().enumerate() {
            call_ns[i].push(time(&mut || {
                black_box(set.authorize_call(&caller.cedar(), &tool, Some(&arguments), NOW, None));
            }));
            forbidden_ns[i].push(time(&mut || {
                black_box(set.authorize_call(&caller.cedar(), &tool, Some(&over), NOW, None));
            }));
            list_ns[i].push(time(&mut || {
                black_box(set.authorize_listing(&caller.cedar(), &tool));
            }));
        }
    }
    let json = median(json_ns);
    println!("\nsummary (median of {rounds} interleaved rounds of {per_round}):");
    println!("json_decide: {:.0} ns", json);
    for (i, (n, _)) in sets.iter().enumerate() {
        let call = median(call_ns[i].clone());
        let list = median(list_ns[i].clone());
        let forbidden = median(forbidden_ns[i].clone());
        println!(
            "{n:>12} Cedar policies: call {:.2} us (x{:.0} the JSON decision; {:.2}x the 10 us goal), a forbidden call {:.2} us, listing {:.2} us",
            call / 1000.0,
            call / json,
            call / 10_000.0,
            forbidden / 1000.0,
            list / 1000.0
        );
    }
}
