//! `toolgate::stores`: a set of stores opened once, from a ledger directory or a database URL,
//! and handed to the builder, which then needs nothing else to gate calls: the audit chain
//! records them, the kill switch stops them, and with a database the rights, the checkpoint key
//! and the shared state are the database's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Echo;
use toolgate::prelude::*;
use toolgate::rmcp::model::{CallToolRequestParams, RequestId};
use toolgate::rmcp::service::{Peer, RequestContext};
use toolgate::rmcp::{ErrorData, RoleServer, ServerHandler as _, ServiceExt as _};

async fn peer() -> (Peer<RoleServer>, impl Sized, impl Sized) {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(Echo.serve(server_half));
    let client = ().serve(client_half).await.unwrap();
    let server = server.await.unwrap().unwrap();
    (server.peer().clone(), server, client)
}

fn policy() -> toolgate::policy::Policy {
    toolgate::policy::Policy::from_json(r#"{"version":1,"allow":["echo"]}"#).unwrap()
}

async fn call(gate: &Gated<Echo>, peer: &Peer<RoleServer>, id: u64) -> Result<(), ErrorData> {
    let context = RequestContext::new(RequestId::Number(i64::try_from(id).unwrap()), peer.clone());
    gate.call_tool(CallToolRequestParams::new("echo".to_owned()), context)
        .await
        .map(drop)
}

#[tokio::test]
async fn the_ledgers_stores_record_and_halt_the_calls_of_a_builder_given_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let stores = Stores::ledger(
        &ledger,
        AuditConfig::new(ledger.join("audit.jsonl")),
        &policy(),
    )
    .unwrap();
    let switch = stores.kill_switch.clone();
    let audit = stores.audit.clone();
    let gate = Gated::builder(Echo)
        .policy(policy())
        .stores(stores)
        .server_name("echo-mcp")
        .build()
        .unwrap();
    let (peer, _server, _client) = peer().await;
    call(&gate, &peer, 1).await.unwrap();
    assert!(ledger.join("effects").is_dir(), "the layout's effect store");
    switch.halt("maintenance", "ops").unwrap();
    assert!(
        ledger.join("halt.json").is_file(),
        "the layout's kill switch"
    );
    let refused = call(&gate, &peer, 2).await.unwrap_err();
    assert_eq!(refused.code.0, toolgate::HALTED, "{refused:?}");
    assert!(refused.message.contains("echo-mcp resume"), "{refused:?}");
    let mut lines = Vec::new();
    audit.export(&mut lines).unwrap();
    let lines = String::from_utf8(lines).unwrap();
    assert!(lines.contains("\"kill_switch\""), "{lines}");
}

/// Every store in one database: the checkpoint key signs its chain (past
/// `DEFAULT_CHECKPOINT_EVERY` calls it carries a checkpoint that verifies with the key and is
/// refused with another), and rights set through another replica's handle refuse the next call.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_databases_stores_sign_their_chain_and_share_the_rights() {
    use std::sync::Arc;
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database("facade_stores")
        .unwrap();
    let key = || toolgate::canon::HmacKey::new(b"a checkpoint key of at least 32 bytes").unwrap();
    let every = toolgate::audit::DEFAULT_CHECKPOINT_EVERY;
    let stores = Stores::database(&url, &policy(), Some((key(), every))).unwrap();
    let gate = Gated::builder(Echo)
        .policy(policy())
        .stores(stores)
        .build()
        .unwrap();
    let (peer, _server, _client) = peer().await;
    for id in 0..every {
        call(&gate, &peer, id).await.unwrap();
    }
    let chain =
        toolgate::audit::PgAuditLog::open(toolgate::postgres::PgStore::connect(&url).unwrap())
            .unwrap();
    let mut checkpoints = Vec::new();
    let count = chain.export_checkpoints(&mut checkpoints).unwrap();
    assert_eq!(count, 1, "{}", String::from_utf8_lossy(&checkpoints));
    let report = toolgate::audit::verify_sink_with(&chain, Some(&key())).unwrap();
    assert!(report.problem.is_none(), "{report}");
    let other = toolgate::canon::HmacKey::new(b"another key of at least 32 bytes!!").unwrap();
    let report = toolgate::audit::verify_sink_with(&chain, Some(&other)).unwrap();
    assert!(report.problem.is_some(), "{report}");

    let replica = toolgate::checks::RightsFile::with_store(Arc::new(
        toolgate::postgres::PgRights::open(toolgate::postgres::PgStore::connect(&url).unwrap())
            .unwrap(),
    ));
    replica
        .set(Some(
            br#"{"version":1,"principals":{"local":{"tools":[]}}}"#,
        ))
        .unwrap();
    let refused = call(&gate, &peer, every).await.unwrap_err();
    assert_eq!(
        refused.message, "tool not found",
        "hidden like an unknown tool: {refused:?}"
    );
}
