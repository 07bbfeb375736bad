//! The sync budget of the reference tools, counted through one `FaultyStorage` under every store
//! of the ledger (effect journal, notes, audit log): a count is deterministic, a timing is not.
//!
//! A new `write_note` makes its note durable (the temporary file's fdatasync, the directory's
//! fsync) and its audit record (one fsync): 3. Its effect record is idempotent, so its lines are
//! written and made durable by the next fdatasync of the journal (here: at shutdown). A replay is
//! answered from the effect store and costs its audit record's fsync: 1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use toolgate_server::ServerOptions;
use toolgate_storage::{FaultyStorage, FsStorage, Op};

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
const CALLS: u64 = 20;

async fn write_note(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    request_id: &str,
    text: &str,
) -> Value {
    let mut params = CallToolRequestParams::new("write_note");
    params.arguments = json!({"request_id": request_id, "text": text})
        .as_object()
        .cloned();
    let result = client.call_tool(params).await.unwrap();
    serde_json::to_value(result).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_note_costs_three_syncs_and_a_replay_one() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let options = ServerOptions {
        policy: POLICY.into(),
        ledger: dir.path().join("ledger"),
        storage: Some(storage.clone()),
        ..ServerOptions::default()
    };
    let server = toolgate_server::build(&options).unwrap();
    let effects = Arc::clone(&server.effects);
    let (server_half, client_half) = tokio::io::duplex(1 << 20);
    let serving = tokio::spawn(async move {
        let running = server.gated.serve(server_half).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_half).await.unwrap();

    let before = storage.syncs();
    for i in 0..CALLS {
        let reply = write_note(&client, &format!("req-sync-{i:04}"), "counted").await;
        assert_eq!(reply["structuredContent"]["status"], "committed", "{reply}");
    }
    let writes = storage.syncs() - before;
    assert_eq!(
        writes,
        3 * CALLS,
        "fsync-class calls for {CALLS} write_note: {} file, {} directory",
        storage.calls(Op::FsyncFile),
        storage.calls(Op::FsyncDir)
    );

    let before = storage.syncs();
    for i in 0..CALLS {
        let reply = write_note(&client, &format!("req-sync-{i:04}"), "counted").await;
        assert_eq!(reply["structuredContent"]["status"], "replay", "{reply}");
    }
    assert_eq!(storage.syncs() - before, CALLS, "one sync per replay");

    // What a clean shutdown does: the idempotent effect records become durable, in one fdatasync.
    let before = storage.syncs();
    effects.sync().unwrap();
    assert_eq!(storage.syncs() - before, 1);
    client.cancel().await.unwrap();
    serving.abort();
}
