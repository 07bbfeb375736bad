//! The built `bookings-mcp` binary over stdio, driven by rmcp's own client: the denied admin tool
//! is hidden and refused, `create_booking` runs once per `request_id`, cancel and notify need a
//! confirmation, the kill switch stops calls until `resume`, and `verify` accepts the chain.
//!
//! Nothing sleeps for a fixed time: every step waits for its answer, under a generous deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorCode, ProtocolVersion};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientLifecycleMode, ClientServiceExt as _, RoleClient, ServiceExt as _};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_bookings-mcp");
const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/policy.json");
const TIMEOUT: Duration = Duration::from_secs(60);
/// The variables that steer the binary, removed so that the test's environment cannot.
const SCRUBBED: [&str; 3] = ["POLICY_PATH", "LEDGER_DIR", "BOOKINGS_DATA"];

type Client = RunningService<RoleClient, ()>;

struct World {
    dir: tempfile::TempDir,
    policy: PathBuf,
    /// More arguments for the server (`--principal`, `--entities`).
    extra: Vec<String>,
}

impl World {
    fn new() -> World {
        World {
            dir: tempfile::tempdir().unwrap(),
            policy: PathBuf::from(POLICY),
            extra: Vec::new(),
        }
    }

    /// A world whose server and operator commands use the shipped policy as `edit` changes it.
    fn with_policy(edit: impl FnOnce(&mut Value)) -> World {
        let mut world = World::new();
        let mut policy: Value =
            serde_json::from_str(&std::fs::read_to_string(POLICY).unwrap()).unwrap();
        edit(&mut policy);
        world.policy = world.dir.path().join("policy.json");
        std::fs::write(&world.policy, policy.to_string()).unwrap();
        world
    }

    fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The stored bookings file (`bookings.json`) as JSON.
    fn stored(&self) -> Value {
        let text = std::fs::read_to_string(self.data().join(bookings::DATA_FILE)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// `bookings-mcp <args> --policy POLICY --ledger LEDGER`, not yet run.
    fn operator_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        for key in SCRUBBED {
            command.env_remove(key);
        }
        command
            .args(args)
            .arg("--policy")
            .arg(&self.policy)
            .arg("--ledger")
            .arg(self.ledger())
            .stdin(Stdio::null());
        command
    }

    /// `bookings-mcp <args> --policy POLICY --ledger LEDGER` to completion.
    fn operator(&self, args: &[&str]) -> Output {
        self.operator_command(args).output().unwrap()
    }

    /// [`World::operator`] with stdout a pipe whose reader has gone (`| head` after its line):
    /// the exit status and stderr.
    fn operator_into_closed_pipe(&self, args: &[&str]) -> (std::process::ExitStatus, String) {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = self
            .operator_command(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Moves the finish of every finished exactly-once record `by` into the past, as if it had
    /// been that long ago: a new journal with the times rewritten replaces the store's (the
    /// store notices a replaced journal by its identity). The journal's lines are canonical JSON
    /// with the times as 19-digit decimal strings, which stay 19 digits for any `by` of days.
    fn age_effects(&self, by: Duration) {
        let journal = self.ledger().join("effects").join("effects.journal");
        let text = std::fs::read(&journal).unwrap();
        let mut text = String::from_utf8(text).unwrap();
        let by = u64::try_from(by.as_nanos()).unwrap();
        let marker = "\"finished_ns\":\"";
        let mut aged = 0;
        let mut from = 0;
        while let Some(at) = text[from..].find(marker) {
            let start = from + at + marker.len();
            let end = start + text[start..].find('"').unwrap();
            let old: u64 = text[start..end].parse().unwrap();
            let new = (old - by).to_string();
            assert_eq!(new.len(), end - start, "the aged time keeps its length");
            text.replace_range(start..end, &new);
            aged += 1;
            from = end;
        }
        assert!(
            aged > 0,
            "no finished record to age in {}",
            journal.display()
        );
        let temporary = journal.with_extension("aged");
        std::fs::write(&temporary, text).unwrap();
        std::fs::rename(&temporary, &journal).unwrap();
    }

    async fn connect(&self, lifecycle: Option<ClientLifecycleMode>) -> Client {
        let mut command = tokio::process::Command::new(BIN);
        for key in SCRUBBED {
            command.env_remove(key);
        }
        command
            .arg("--policy")
            .arg(&self.policy)
            .arg("--ledger")
            .arg(self.ledger())
            .args(&self.extra)
            .env("BOOKINGS_DATA", self.data())
            .kill_on_drop(true);
        let (transport, _stderr) = TokioChildProcess::builder(command)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let client = match lifecycle {
            Some(lifecycle) => {
                tokio::time::timeout(TIMEOUT, ().serve_with_lifecycle(transport, lifecycle)).await
            }
            None => tokio::time::timeout(TIMEOUT, ().serve(transport)).await,
        };
        client.expect("the handshake timed out").unwrap()
    }
}

async fn try_call(
    client: &Client,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = args.as_object().cloned();
    tokio::time::timeout(TIMEOUT, client.call_tool(params))
        .await
        .expect("tools/call timed out")
}

async fn call(client: &Client, tool: &str, args: Value) -> Value {
    let result = try_call(client, tool, args).await.unwrap();
    serde_json::to_value(result).unwrap()
}

fn json_error(result: Result<CallToolResult, ServiceError>) -> rmcp::ErrorData {
    match result {
        Err(ServiceError::McpError(error)) => error,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

async fn tool_names(client: &Client) -> Vec<String> {
    let tools = tokio::time::timeout(TIMEOUT, client.list_all_tools())
        .await
        .unwrap()
        .unwrap();
    tools.into_iter().map(|t| t.name.to_string()).collect()
}

fn replayed(result: &Value) -> bool {
    result["_meta"]["io.toolgate/replayed"] == json!(true)
}

fn assert_verified(world: &World) {
    let out = world.operator(&["verify"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("verify: intact:"), "{stdout}");
}

#[tokio::test]
async fn the_admin_tool_is_hidden_and_a_direct_call_is_refused() {
    let world = World::new();
    let client = world
        .connect(Some(ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        }))
        .await;
    let names = tool_names(&client).await;
    for tool in [
        "list_bookings",
        "create_booking",
        "cancel_booking",
        "notify_guest",
    ] {
        assert!(names.contains(&tool.to_owned()), "{names:?}");
    }
    assert!(!names.contains(&"purge_bookings".to_owned()), "{names:?}");
    // Confirmation is the gate's: its two tools are listed because cancel and notify need them.
    assert!(names.contains(&"confirm_action".to_owned()), "{names:?}");

    let created = call(
        &client,
        "create_booking",
        json!({"request_id": "req-hidden-1", "guest": "Ada", "date": "2026-09-01", "nights": 2}),
    )
    .await;
    assert_eq!(created["structuredContent"]["id"], "bk-1", "{created}");
    let error = json_error(try_call(&client, "purge_bookings", json!({})).await);
    assert_eq!(error.code, ErrorCode::INVALID_PARAMS, "{error:?}");
    assert_eq!(error.message, "tool not found");
    assert_eq!(
        world.stored()["bookings"].as_array().unwrap().len(),
        1,
        "nothing purged"
    );
    client.cancel().await.unwrap();
    assert_verified(&world);
}

#[tokio::test]
async fn create_booking_runs_once_per_request_id_and_retries_replay() {
    let world = World::new();
    let client = world.connect(None).await;
    let args =
        json!({"request_id": "req-once-0001", "guest": "Ada", "date": "2026-09-01", "nights": 2});
    let first = call(&client, "create_booking", args.clone()).await;
    assert!(!replayed(&first), "{first}");
    let mut retries = Vec::new();
    for _ in 0..2 {
        retries.push(call(&client, "create_booking", args.clone()).await);
    }
    for retry in &retries {
        assert!(replayed(retry), "{retry}");
        assert_eq!(retry["structuredContent"], first["structuredContent"]);
    }
    let stored = world.stored();
    assert_eq!(stored["bookings"].as_array().unwrap().len(), 1, "{stored}");

    // The same request_id with other arguments is refused, and a short one by the policy.
    let conflict = call(
        &client,
        "create_booking",
        json!({"request_id": "req-once-0001", "guest": "Bob", "date": "2026-09-01", "nights": 2}),
    )
    .await;
    assert_eq!(conflict["isError"], true, "{conflict}");
    let short = call(
        &client,
        "create_booking",
        json!({"request_id": "r1", "guest": "Bob", "date": "2026-09-01", "nights": 2}),
    )
    .await;
    assert_eq!(short["isError"], true, "{short}");
    assert_eq!(world.stored()["bookings"].as_array().unwrap().len(), 1);

    // The booking survives a restart of the server, and so does the key.
    client.cancel().await.unwrap();
    let client = world.connect(None).await;
    let after = call(&client, "create_booking", args).await;
    assert!(replayed(&after), "{after}");
    let listed = call(&client, "list_bookings", json!({})).await;
    assert_eq!(
        listed["structuredContent"]["bookings"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    client.cancel().await.unwrap();
    assert_verified(&world);
}

#[tokio::test]
async fn the_payment_token_never_leaves_the_server() {
    let world = World::new();
    let client = world.connect(None).await;
    let args =
        json!({"request_id": "req-canary-01", "guest": "Ada", "date": "2026-10-01", "nights": 1});
    let mut results = vec![call(&client, "create_booking", args.clone()).await];
    results.push(call(&client, "create_booking", args).await);
    results.push(call(&client, "list_bookings", json!({})).await);
    assert!(replayed(&results[1]), "{}", results[1]);
    // The canary: the token the store keeps with the record.
    let stored = world.stored();
    let token = stored["bookings"][0]["payment_token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(token.len() > 8, "{stored}");
    for result in &results {
        let text = result.to_string();
        assert!(
            !text.contains(&token) && !text.contains("payment_token"),
            "{text}"
        );
        assert_eq!(
            result["structuredContent"]["guest"]
                .as_str()
                .or(result["structuredContent"]["bookings"][0]["guest"].as_str()),
            Some("Ada"),
            "{result}"
        );
    }
    // The listed output schemas describe the filtered results.
    let tools = tokio::time::timeout(TIMEOUT, client.list_all_tools())
        .await
        .unwrap()
        .unwrap();
    for tool in tools.iter().filter(|t| t.output_schema.is_some()) {
        let schema = serde_json::to_string(&tool.output_schema).unwrap();
        assert!(!schema.contains("payment_token"), "{}: {schema}", tool.name);
    }
    client.cancel().await.unwrap();
    // Nor the audit log, which counts what the gate dropped.
    let audit = std::fs::read_to_string(world.ledger().join("audit.jsonl")).unwrap();
    assert!(!audit.contains(&token), "{audit}");
    let dropped: Vec<u64> = audit
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["decision"] == "allow")
        .filter_map(|record| record["dropped_fields"].as_u64())
        .collect();
    // The create, its replay and the list: the exactly-once store kept the create's result
    // without the token, so the replay had nothing more to drop.
    assert_eq!(dropped, [1, 0, 1], "{audit}");
    assert_verified(&world);
}

#[tokio::test]
async fn cancel_and_notify_wait_for_a_confirmation() {
    let world = World::new();
    let client = world.connect(None).await;
    let args =
        json!({"request_id": "req-confirm-1", "guest": "Ada", "date": "2026-09-01", "nights": 2});
    call(&client, "create_booking", args).await;

    let preview = call(&client, "cancel_booking", json!({"id": "bk-1"})).await;
    let body = &preview["structuredContent"];
    assert_eq!(body["status"], "preview", "{preview}");
    assert_eq!(
        world.stored()["bookings"][0]["status"],
        "confirmed",
        "a preview cancels nothing"
    );
    let done = call(
        &client,
        "confirm_action",
        json!({"confirm_token": body["confirm_token"], "confirm_summary": body["confirm_summary"]}),
    )
    .await;
    assert_ne!(done["isError"], true, "{done}");
    assert_eq!(done["structuredContent"]["id"], "bk-1", "{done}");
    assert_eq!(done["structuredContent"]["status"], "cancelled", "{done}");
    assert!(
        done["structuredContent"].get("payment_token").is_none(),
        "{done}"
    );
    assert_eq!(world.stored()["bookings"][0]["status"], "cancelled");

    call(
        &client,
        "create_booking",
        json!({"request_id": "req-confirm-2", "guest": "Bob", "date": "2026-09-02", "nights": 1}),
    )
    .await;
    let preview = call(
        &client,
        "notify_guest",
        json!({"id": "bk-2", "message": "See you soon"}),
    )
    .await;
    let body = &preview["structuredContent"];
    assert_eq!(body["status"], "preview", "{preview}");
    let rejected = call(
        &client,
        "reject_action",
        json!({"confirm_token": body["confirm_token"]}),
    )
    .await;
    assert_ne!(rejected["isError"], true, "{rejected}");
    let late = call(
        &client,
        "confirm_action",
        json!({"confirm_token": body["confirm_token"], "confirm_summary": body["confirm_summary"]}),
    )
    .await;
    assert_eq!(
        late["isError"], true,
        "a rejected token confirms nothing: {late}"
    );
    assert!(
        world.stored()["outbox"].as_array().unwrap().is_empty(),
        "nothing sent"
    );
    client.cancel().await.unwrap();
    assert_verified(&world);
}

#[tokio::test]
async fn halt_stops_calls_of_the_running_server_until_resume() {
    let world = World::new();
    let client = world.connect(None).await;
    let args =
        |id: &str| json!({"request_id": id, "guest": "Ada", "date": "2026-09-01", "nights": 1});
    call(&client, "create_booking", args("req-halt-0001")).await;

    let out = world.operator(&["halt", "--reason", "incident 7", "--by", "oncall"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("bookings-mcp resume"),
        "{out:?}"
    );
    let error = json_error(try_call(&client, "create_booking", args("req-halt-0002")).await);
    assert_eq!(error.code, ErrorCode(-32001), "{error:?}");
    assert!(
        error.message.contains("incident 7") && error.message.contains("bookings-mcp resume"),
        "{error:?}"
    );
    // The exempt read keeps working.
    let listed = call(&client, "list_bookings", json!({})).await;
    assert_eq!(
        listed["structuredContent"]["bookings"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let out = world.operator(&["resume"]);
    assert!(out.status.success(), "{out:?}");
    let created = call(&client, "create_booking", args("req-halt-0002")).await;
    assert_eq!(created["structuredContent"]["id"], "bk-2", "{created}");
    client.cancel().await.unwrap();
    assert_verified(&world);

    let stats = world.operator(&["stats", "--format", "json"]);
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["totals"]["committed"], 2, "{stats}");
}

#[test]
fn a_usage_error_exits_2_and_help_exits_0() {
    let world = World::new();
    let out = world.operator(&["halt"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--reason <TEXT>"),
        "{out:?}"
    );
    let out = world.operator(&["help"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("bookings-mcp verify"),
        "{out:?}"
    );
    assert!(
        !Path::new(&world.ledger()).exists(),
        "usage and help touch nothing"
    );
}

/// `prune` keeps the records of a tool for the policy's window (here 7 days), as the gate does:
/// a record finished 2 days ago survives it and a late retry replays; one finished 8 days ago
/// is removed, and the retry then runs again.
#[tokio::test]
async fn prune_keeps_records_for_the_policy_window_and_a_late_retry_replays() {
    const DAY: Duration = Duration::from_secs(24 * 60 * 60);
    let world = World::with_policy(|policy| {
        policy["idempotency"]["create_booking"]["window_secs"] = json!(7 * 24 * 60 * 60);
    });
    let args =
        json!({"request_id": "req-late-0001", "guest": "Ada", "date": "2026-09-01", "nights": 2});
    let client = world.connect(None).await;
    let first = call(&client, "create_booking", args.clone()).await;
    assert!(!replayed(&first), "{first}");
    client.cancel().await.unwrap();

    world.age_effects(2 * DAY);
    let out = world.operator(&["prune"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("removed 0 completed records"),
        "{out:?}"
    );
    let client = world.connect(None).await;
    let retry = call(&client, "create_booking", args.clone()).await;
    assert!(replayed(&retry), "{retry}");
    assert_eq!(retry["structuredContent"], first["structuredContent"]);
    client.cancel().await.unwrap();
    assert_eq!(world.stored()["bookings"].as_array().unwrap().len(), 1);

    // Past the window the record goes, and the same request runs as a new one.
    world.age_effects(6 * DAY);
    let out = world.operator(&["prune"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("removed 1 completed records"),
        "{out:?}"
    );
    let client = world.connect(None).await;
    let again = call(&client, "create_booking", args).await;
    assert!(!replayed(&again), "{again}");
    client.cancel().await.unwrap();
    assert_eq!(world.stored()["bookings"].as_array().unwrap().len(), 2);
    assert_verified(&world);
}

/// An operator command whose reader closed early (`bookings-mcp stats | head -1`) exits 0 and
/// says nothing: the command is done, and nobody is left to read an error.
#[test]
fn a_report_into_a_closed_pipe_exits_quietly() {
    let world = World::new();
    let out = world.operator(&["halt", "--reason", "incident 9"]);
    assert!(out.status.success(), "{out:?}");
    for args in [
        &["resume"][..],
        &["stats"],
        &["stats", "--format", "json"],
        &["verify"],
        &["help"],
    ] {
        let (status, stderr) = world.operator_into_closed_pipe(args);
        assert_eq!((status.code(), stderr.as_str()), (Some(0), ""), "{args:?}");
    }
    // The command itself ran: the resume is in force and recorded.
    let out = world.operator(&["verify"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("verify: intact: 2 records"),
        "{out:?}"
    );
}

/// The shipped Cedar policies (`policy.cedar`) named from the shipped policy: roles from the
/// entities file for stdio callers; the nights rule; an edit of the entities file applies to the
/// next call; an unreadable one refuses what Cedar decides.
#[test]
fn the_shipped_cedar_policies_decide_by_role_and_nights() {
    let mut world = World::with_policy(|policy| {
        policy["cedar"] = json!(concat!(env!("CARGO_MANIFEST_DIR"), "/policy.cedar"));
    });
    let entities = world.dir.path().join("entities.json");
    let write_entities = |roles: &str| {
        let temporary = entities.with_extension("new");
        std::fs::write(
            &temporary,
            format!(r#"{{"version": 1, "principals": {{"desk": {{"roles": {roles}}}}}}}"#),
        )
        .unwrap();
        std::fs::rename(&temporary, &entities).unwrap();
    };
    write_entities(r#"["staff"]"#);
    world.extra = vec![
        "--principal".into(),
        "desk".into(),
        "--entities".into(),
        entities.display().to_string(),
    ];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = world.connect(None).await;
        let mut names = tool_names(&client).await;
        names.sort();
        assert_eq!(names, ["create_booking", "list_bookings"]);
        let booking = |request_id: &str, nights: u32| {
            json!({"request_id": request_id, "guest": request_id, "date": "2027-01-02", "nights": nights})
        };
        let created = call(&client, "create_booking", booking("req-cedar-01", 3)).await;
        assert_ne!(created["isError"], json!(true), "{created}");
        let long = call(&client, "create_booking", booking("req-cedar-02", 10)).await;
        assert_eq!(long["isError"], json!(true), "{long}");
        assert_eq!(
            long["structuredContent"]["policies"],
            json!(["long-stays-need-a-manager"]),
            "{long}"
        );
        // Staff cannot cancel: hidden, and refused as unknown.
        let error = json_error(try_call(&client, "cancel_booking", json!({"id": "bk-1"})).await);
        assert_eq!(error.code, ErrorCode::INVALID_PARAMS);

        // Promoted in the entities file: the next call sees it.
        write_entities(r#"["staff", "manager"]"#);
        let long = call(&client, "create_booking", booking("req-cedar-03", 10)).await;
        assert_ne!(long["isError"], json!(true), "{long}");
        assert!(tool_names(&client).await.contains(&"cancel_booking".to_owned()));

        // An invalid entities file refuses what Cedar decides, until it is fixed.
        std::fs::write(&entities, "{not json").unwrap();
        let error = json_error(try_call(&client, "list_bookings", json!({})).await);
        assert_eq!(error.code, ErrorCode::INVALID_PARAMS);
        write_entities(r#"["staff"]"#);
        let listed = call(&client, "list_bookings", json!({})).await;
        assert_ne!(listed["isError"], json!(true), "{listed}");
        client.cancel().await.unwrap();
    });
    let stored = world.stored();
    let nights: Vec<u64> = stored["bookings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["nights"].as_u64().unwrap())
        .collect();
    assert_eq!(nights, [3, 10]);
    assert_verified(&world);
}
