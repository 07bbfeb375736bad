//! Both protocol flows list the allowed tools only, hostile input does not stop the server, and
//! stdout carries protocol messages only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;

use common::{TIMEOUT, TestEnv};
use rmcp::model::ProtocolVersion;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientLifecycleMode, ClientServiceExt as _, RoleClient, ServiceExt as _};
use serde_json::{Value, json};

fn child_command(env: &TestEnv) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(common::BIN);
    command
        .arg("--policy")
        .arg(&env.policy)
        .arg("--ledger")
        .arg(&env.ledger)
        .env_remove("POLICY_PATH")
        .env_remove("LEDGER_DIR")
        .env_remove("TOOLGATE_CRASH_POINT")
        .env_remove("TOOLGATE_CRASH_MARKER")
        .kill_on_drop(true);
    command
}

fn spawn_transport(env: &TestEnv) -> TokioChildProcess {
    let (transport, _stderr) = TokioChildProcess::builder(child_command(env))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn toolgate-server");
    transport
}

async fn assert_lists_allowed_tools(client: &RunningService<RoleClient, ()>) {
    let tools = tokio::time::timeout(TIMEOUT, client.list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list failed");
    let names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    assert!(names.contains(&"write_note".to_owned()), "{names:?}");
    assert!(names.contains(&"read_ledger".to_owned()), "{names:?}");
    assert!(!names.contains(&"rm_rf".to_owned()), "{names:?}");
}

#[tokio::test]
async fn tools_list_hides_rm_rf_in_the_2026_discover_flow() {
    let env = TestEnv::new();
    let client = tokio::time::timeout(
        TIMEOUT,
        ().serve_with_lifecycle(
            spawn_transport(&env),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        ),
    )
    .await
    .expect("server/discover timed out")
    .expect("server/discover failed");
    let info = client.peer_info().expect("peer info after discover");
    assert_eq!(info.protocol_version, ProtocolVersion::V_2026_07_28);
    assert_lists_allowed_tools(&client).await;
    client.cancel().await.expect("close the session");
}

#[tokio::test]
async fn tools_list_hides_rm_rf_in_the_2025_initialize_flow() {
    let env = TestEnv::new();
    let client = tokio::time::timeout(TIMEOUT, ().serve(spawn_transport(&env)))
        .await
        .expect("initialize timed out")
        .expect("initialize failed");
    let info = client.peer_info().expect("peer info after initialize");
    assert_eq!(info.protocol_version, ProtocolVersion::V_2025_11_25);
    assert_lists_allowed_tools(&client).await;
    client.cancel().await.expect("close the session");
}

#[test]
fn tools_list_hides_rm_rf_in_the_raw_2026_flow() {
    let env = TestEnv::new();
    let mut server = env.spawn();
    let discover = server.discover();
    let versions = discover["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no supportedVersions: {discover}"));
    assert!(
        versions.contains(&json!(common::PROTOCOL_2026)),
        "{discover}"
    );
    let names = server.list_tool_names();
    assert!(names.contains(&"write_note".to_owned()), "{names:?}");
    assert!(names.contains(&"read_ledger".to_owned()), "{names:?}");
    assert!(!names.contains(&"rm_rf".to_owned()), "{names:?}");
    assert!(server.close().success());
}

/// A line of `len` bytes (plus newline) that is one JSON string.
fn huge_json_string_line(len: usize) -> Vec<u8> {
    let mut line = Vec::with_capacity(len + 1);
    line.push(b'"');
    line.resize(len - 1, b'x');
    line.extend_from_slice(b"\"\n");
    line
}

const SEVENTEEN_MIB: usize = 17 * 1024 * 1024;

fn assert_lists_tools(server: &mut common::Server) {
    let names = server.list_tool_names();
    assert!(
        names.contains(&"write_note".to_owned()) && !names.contains(&"rm_rf".to_owned()),
        "{names:?}"
    );
}

#[test]
fn garbage_and_an_oversized_line_do_not_stop_the_server() {
    let env = TestEnv::new();
    let mut server = env.start();
    server.send_raw(b"this is not json\n");
    server.send_raw_in_thread(huge_json_string_line(SEVENTEEN_MIB));
    assert!(server.is_running(), "stderr:\n{}", server.stderr());
    assert_lists_tools(&mut server);
    // And it still works for real calls afterwards.
    let reply = server.write_note("req-after-garbage", "still alive");
    assert_eq!(common::note_status(&reply), "committed");
    assert!(server.close().success());
}

#[test]
fn garbage_as_the_very_first_line_does_not_stop_the_server() {
    let env = TestEnv::new();
    let mut server = env.spawn();
    server.send_raw(b"this is not json\n");
    server.discover();
    assert_lists_tools(&mut server);
    assert!(server.close().success());
}

#[test]
fn an_oversized_first_line_does_not_stop_the_server() {
    let env = TestEnv::new();
    let mut server = env.spawn();
    server.send_raw(b"this is not json\n");
    server.send_raw_in_thread(huge_json_string_line(SEVENTEEN_MIB));
    server.discover();
    assert_lists_tools(&mut server);
    assert!(server.close().success());
}

fn assert_json_rpc_message(line: &str) {
    assert!(
        line.ends_with('\n'),
        "stdout line not newline-terminated: {line:?}"
    );
    let message: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
    let object = message
        .as_object()
        .unwrap_or_else(|| panic!("stdout line is not a JSON object: {line}"));
    assert_eq!(object.get("jsonrpc"), Some(&json!("2.0")), "{line}");
    // MCP 2026-07-28 (Error Responses) omits the id of an error whose request id is unreadable.
    let is_response = !object.contains_key("method")
        && ((object.contains_key("id") && object.contains_key("result"))
            ^ object.contains_key("error"));
    let is_request_or_notification =
        object.get("method").is_some_and(Value::is_string) && !object.contains_key("result");
    assert!(
        is_response || is_request_or_notification,
        "not a JSON-RPC 2.0 message: {line}"
    );
}

#[test]
fn stdout_carries_only_protocol_messages() {
    let env = TestEnv::new();
    let mut command = env.command();
    // As much logging as possible: none of it may reach stdout.
    command.env("RUST_LOG", "trace");
    let mut server = common::Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    server.list_tool_names();
    server.write_note("req-stdout-0001", "first");
    server.write_note("req-stdout-0001", "first");
    server.write_note("req-stdout-0001", "conflicting");
    server.write_note("short", "too short an id");
    server.call("rm_rf", json!({"path": "/"}));
    server.call("no_such_tool", json!({}));
    server.call("read_ledger", json!({}));
    server.send_raw(b"this is not json\n");
    server.send_raw(b"{\"valid\":\"json but not json-rpc\"}\n");
    server.list_tool_names();
    let status = server.close();
    assert!(status.success(), "exit {status}");
    assert!(
        server.transcript.len() >= 10,
        "expected a reply per request: {:?}",
        server.transcript
    );
    for line in &server.transcript {
        assert_json_rpc_message(line);
    }
    assert!(
        !server.stderr().is_empty(),
        "RUST_LOG=trace should have produced logs on stderr"
    );
}

#[test]
fn unparsable_rust_log_is_reported_and_the_default_filter_serves() {
    let env = TestEnv::new();
    let mut command = env.command();
    // Not a level: the whole variable is ignored, not just this directive.
    command.env("RUST_LOG", "rmcp=loud");
    let mut server = common::Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    server.write_note("req-rustlog-001", "still served");
    let status = server.close();
    assert!(status.success(), "exit {status}");
    let stderr = server.stderr();
    assert!(
        stderr.contains("RUST_LOG ignored") && stderr.contains("target=level"),
        "expected the ignored RUST_LOG to be named on stderr: {stderr}"
    );
    // The default filter applies: toolgate's info lines are shown, nothing at debug.
    assert!(
        stderr.contains(" INFO "),
        "default filter shows info: {stderr}"
    );
    assert!(
        !stderr.contains(" DEBUG "),
        "default filter hides debug: {stderr}"
    );
}
