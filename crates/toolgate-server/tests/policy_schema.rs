//! `toolgate-server policy schema`: the Cedar schema of the binary's own tools, printed for
//! editors, with each tool's arguments typed from its input schema (the policy crate's tests
//! check that Cedar accepts such a schema and validates policies against it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use serde_json::Value;

#[test]
fn policy_schema_prints_the_cedar_schema_of_the_tools() {
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate-server"))
        .args(["policy", "schema"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let schema: Value = serde_json::from_slice(&output.stdout).unwrap();
    let actions = &schema["Toolgate"]["actions"];
    for tool in [
        "write_note",
        "read_ledger",
        "rm_rf",
        "tools/list",
        "tools/call",
    ] {
        assert!(actions.get(tool).is_some(), "no action {tool}: {actions}");
    }
    let arguments =
        &actions["write_note"]["appliesTo"]["context"]["attributes"]["arguments"]["attributes"];
    assert_eq!(arguments["request_id"]["type"], "String", "{arguments}");
    assert_eq!(arguments["text"]["type"], "String", "{arguments}");
}
