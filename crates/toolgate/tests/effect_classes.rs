//! A policy's declared effect class against the tool's annotations and scanned entitlements: the
//! contradictions `lock --check` reports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use toolgate::contract::{Entitlements, ScannedHandler, effect_class_violations};
use toolgate::policy::Policy;
use toolgate::rmcp::model::{Tool, ToolAnnotations};

fn tool(name: &str, annotations: Option<ToolAnnotations>) -> Tool {
    let schema = serde_json::Map::new();
    let tool = Tool::new(
        Cow::Owned(name.to_owned()),
        Cow::Borrowed("test tool"),
        Arc::new(schema),
    );
    match annotations {
        Some(a) => tool.annotate(a),
        None => tool,
    }
}

fn scan(write: bool) -> ScannedHandler {
    ScannedHandler {
        entitlements: Entitlements {
            filesystem_write: write,
            ..Entitlements::default()
        },
        evasion: Vec::new(),
        unresolved: Vec::new(),
    }
}

#[test]
fn declared_classes_are_checked_against_annotations_and_entitlements() {
    let policy = Policy::from_json(
        r#"{"version":1,"allow":["honest_read","lying_read","bare_read","writer","claims_read","soft_delete"],
            "effects":{"honest_read":"read","lying_read":"read","bare_read":"read","writer":"write",
                       "claims_read":"notify","soft_delete":"delete"}}"#,
    )
    .unwrap();
    let read_only = ToolAnnotations::new().read_only(true).destructive(false);
    let tools = vec![
        tool("honest_read", Some(read_only.clone())),
        tool("lying_read", Some(read_only.clone())),
        tool("bare_read", None),
        tool("writer", Some(ToolAnnotations::new().read_only(false))),
        tool("claims_read", Some(read_only)),
        tool(
            "soft_delete",
            Some(ToolAnnotations::new().read_only(false).destructive(false)),
        ),
    ];
    let scans: BTreeMap<String, ScannedHandler> = [
        ("honest_read", scan(false)),
        ("lying_read", scan(true)),
        ("bare_read", scan(false)),
        ("writer", scan(true)),
        ("claims_read", scan(false)),
        ("soft_delete", scan(true)),
    ]
    .into_iter()
    .map(|(name, scan)| (name.to_owned(), scan))
    .collect();

    let violations = effect_class_violations(&policy, &tools, &scans);
    let mut found: Vec<(String, String)> = violations
        .iter()
        .map(|v| (v.tool.clone(), v.message.clone()))
        .collect();
    found.sort();
    let tools_flagged: Vec<&str> = found.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tools_flagged,
        vec!["bare_read", "claims_read", "lying_read", "soft_delete"],
        "{found:#?}"
    );
    let message = |tool: &str| {
        found
            .iter()
            .find(|(t, _)| t == tool)
            .map(|(_, m)| m.clone())
            .unwrap()
    };
    assert!(message("lying_read").contains("filesystemWrite"));
    assert!(message("bare_read").contains("absent hints read as false"));
    assert!(message("claims_read").contains("readOnlyHint: true"));
    assert!(message("soft_delete").contains("destructiveHint: false"));

    // A policy without effect classes has nothing to contradict.
    let plain = Policy::from_json(r#"{"version":1,"allow":["lying_read"]}"#).unwrap();
    assert!(effect_class_violations(&plain, &tools, &scans).is_empty());
}
