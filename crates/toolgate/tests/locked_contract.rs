//! A server that runs without its sources publishes the contract its committed `toolgate.lock`
//! records (`locked_contract`), computed at build under the policy the builder loaded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Echo;
use toolgate::prelude::*;
use toolgate::rmcp::ServerHandler as _;

#[test]
fn a_locked_contract_is_computed_at_build_under_the_loaded_policy() {
    let dir = tempfile::tempdir().unwrap();
    let policy_path = dir.path().join("policy.json");
    std::fs::write(&policy_path, r#"{"version":1,"allow":["echo"]}"#).unwrap();
    let policy = Policy::load(&policy_path).unwrap();
    let tools = vec![Echo.get_tool("echo").unwrap()];
    // The committed lockfile of Echo: what its lock check would have written.
    let scans = [("echo".to_owned(), Default::default())]
        .into_iter()
        .collect();
    let contract = toolgate::contract::server_contract("echo", &tools, &policy, &scans).unwrap();
    let committed = toolgate::contract::lockfile::Lockfile::new(contract, "0").render();
    let expected = toolgate::contract::live_lockfile(&tools, &policy, &committed).unwrap();

    let gated = Gated::builder(Echo)
        .policy_file(&policy_path)
        .ledger(dir.path().join("ledger"))
        .locked_contract(tools.clone(), committed)
        .build()
        .unwrap();
    assert_eq!(gated.contract_digest(), Some(expected.integrity_digest()));

    let broken = Gated::builder(Echo)
        .policy_file(&policy_path)
        .ledger(dir.path().join("ledger"))
        .locked_contract(tools, "{not a lockfile")
        .build();
    assert!(matches!(broken, Err(GateError::Contract(_))), "{broken:?}");
}
