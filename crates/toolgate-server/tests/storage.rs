//! The reference server on one `FaultyStorage` under every store of its ledger (effect journal,
//! notes, audit log, kill switch): the sync budget of a call, counted (a count is deterministic, a
//! timing is not), and a failure injected at every storage step of a `write_note`.
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
use toolgate::operator::GateArgs;
use toolgate::storage::{FaultyStorage, FsStorage, Op};
use toolgate_server::ServerOptions;

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// A server built in this process on `storage`, served over an in-memory duplex.
async fn start(ledger: &std::path::Path, storage: Arc<FaultyStorage>) -> (Client, ServerHandle) {
    let options = ServerOptions {
        gate: GateArgs {
            policy: POLICY.into(),
            ledger: ledger.to_path_buf(),
            storage: Some(storage),
            ..GateArgs::default()
        },
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
    (client, ServerHandle { serving, effects })
}

struct ServerHandle {
    serving: tokio::task::JoinHandle<()>,
    effects: Arc<dyn toolgate::effect::EffectBackend>,
}

impl ServerHandle {
    async fn stop(self, client: Client) {
        client.cancel().await.unwrap();
        self.serving.abort();
        let _ = self.serving.await;
    }
}

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
const CALLS: u64 = 20;

/// The call's result, or the JSON-RPC error as `{"rpc_error": message}`.
async fn write_note(client: &Client, request_id: &str, text: &str) -> Value {
    let mut params = CallToolRequestParams::new("write_note");
    params.arguments = json!({"request_id": request_id, "text": text})
        .as_object()
        .cloned();
    match client.call_tool(params).await {
        Ok(result) => serde_json::to_value(result).unwrap(),
        Err(error) => json!({"rpc_error": error.to_string()}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_note_costs_three_syncs_and_a_replay_one() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let (client, server) = start(&dir.path().join("ledger"), storage.clone()).await;

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
    server.effects.sync().unwrap();
    assert_eq!(storage.syncs() - before, 1);
    server.stop(client).await;
}

/// The storage operations of one new `write_note`, in order: the effect record's `in_progress`
/// line, the note's temporary file, its fdatasync, its link into place, the notes directory's
/// fsync, the effect record's outcome line, the audit line and its fdatasync.
const STEPS: [(Op, u64); 8] = [
    (Op::Write, 1),
    (Op::Write, 2),
    (Op::FsyncFile, 1),
    (Op::Rename, 1),
    (Op::FsyncDir, 1),
    (Op::Write, 3),
    (Op::Write, 4),
    (Op::FsyncFile, 2),
];

/// A failure at any storage step of a `write_note` is a clean error (a tool error or a JSON-RPC
/// error, never a half-written note), and a retry with the same request_id, once the storage is
/// healthy again, leaves exactly one note with the right bytes and a chain that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_note_survives_a_failure_at_every_storage_step() {
    for (step, (op, n)) in STEPS.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger");
        let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        let (client, server) = start(&ledger, storage.clone()).await;
        storage.fail_nth(op, n);
        let first = write_note(&client, "req-fault-0001", "survives").await;
        assert_eq!(storage.triggered(), 1, "{op:?} #{n}: the fault fired");
        let refused = first["isError"] == true || first.get("rpc_error").is_some();
        assert!(refused, "{op:?} #{n}: the failure is reported: {first}");
        let notes = ledger.join("notes");
        let names = |dir: &std::path::Path| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".tmp"))
                .collect();
            names.sort();
            names
        };
        let retry = write_note(&client, "req-fault-0001", "survives").await;
        let status = retry["structuredContent"]["status"].as_str().unwrap_or("");
        assert!(
            status == "committed" || status == "replay",
            "{op:?} #{n}: the retry succeeds: {retry}"
        );
        let files = names(&notes);
        assert_eq!(files.len(), 1, "{op:?} #{n}: exactly one note: {files:?}");
        assert_eq!(
            std::fs::read(notes.join(&files[0])).unwrap(),
            br#"{"request_id":"req-fault-0001","text":"survives"}"#,
            "{op:?} #{n}"
        );
        // The same request_id with another text is still refused, and writes nothing.
        let conflict = write_note(&client, "req-fault-0001", "other").await;
        assert_eq!(conflict["isError"], true, "{op:?} #{n}: {conflict}");
        server.stop(client).await;
        let report = GateArgs {
            ledger: ledger.clone(),
            ..GateArgs::default()
        }
        .verify()
        .unwrap();
        assert!(report.is_intact(), "{op:?} #{n}: {report}");
        // Every call left its record, the failed one included, unless the audit log itself was
        // what failed (the last two steps).
        if step < STEPS.len() - 2 {
            assert_eq!(report.records, 3, "{op:?} #{n}: one record per call");
        }
    }
}
