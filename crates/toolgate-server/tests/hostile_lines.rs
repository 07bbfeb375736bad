//! Through the real binary: every stdin line the server cannot serve gets a JSON-RPC error with
//! `"id":null`, the server answers the next `ping` and `tools/call`, stderr carries a warning per
//! bad line that never quotes it, and the audit chain verifies afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Server, TestEnv};
use serde_json::{Value, json};

/// Text planted in every bad line: it must never appear on stderr.
const CANARY: &str = "CANARY-7f3a";

const DEFAULT_MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

fn nest(levels: usize) -> String {
    format!("{}{}", "[".repeat(levels), "]".repeat(levels))
}

/// The malformed classes: (name, line without its newline, expected error code).
fn bad_lines() -> Vec<(&'static str, Vec<u8>, i64)> {
    let call = |arguments: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":900,"method":"tools/call","params":{{"name":"read_ledger","arguments":{arguments}}}}}"#
        )
        .into_bytes()
    };
    let mut over_limit = format!(r#"{{"{CANARY}":""#).into_bytes();
    over_limit.resize(DEFAULT_MAX_LINE_BYTES + 1, b'x');
    vec![
        (
            "invalid JSON",
            format!(r#"{{"{CANARY}": nope}}"#).into_bytes(),
            -32700,
        ),
        (
            "lone surrogate",
            call(&format!(r#"{{"{CANARY}":"\ud800"}}"#)),
            -32700,
        ),
        ("1e400", call(&format!(r#"{{"{CANARY}":1e400}}"#)), -32700),
        ("NaN", call(&format!(r#"{{"{CANARY}":NaN}}"#)), -32700),
        (
            "127 levels inside a tools/call",
            call(&format!(r#"{{"{CANARY}":{}}}"#, nest(127))),
            -32700,
        ),
        // Valid JSON (serde_json refuses 128 levels), but no JSON-RPC message.
        (
            "127 levels alone",
            format!(r#"{}"{CANARY}"{}"#, "[".repeat(127), "]".repeat(127)).into_bytes(),
            -32600,
        ),
        (
            "200 levels",
            format!(r#"{}"{CANARY}"{}"#, "[".repeat(200), "]".repeat(200)).into_bytes(),
            -32700,
        ),
        ("a line over the limit", over_limit, -32600),
    ]
}

/// Sends a 2025-11-25 request (no per-request `_meta`) and waits for its reply.
fn legacy_request(server: &mut Server, method: &str, params: Value) -> Value {
    let id = server.next_id();
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    server.response(id)
}

/// Starts a server in the 2025-11-25 `initialize` flow, where `ping` is a method (2026-07-28
/// removed it outside the bootstrap).
fn start_initialized(env: &TestEnv) -> Server {
    let mut server = env.spawn();
    let init = legacy_request(
        &mut server,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "hostile-lines", "version": "0"}}),
    );
    assert!(init.get("result").is_some(), "initialize: {init}");
    server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    server
}

/// The server still serves: a `ping`, then a `tools/call` of `read_ledger`.
fn assert_serves(server: &mut Server, after: &str) {
    let ping = legacy_request(server, "ping", json!({}));
    assert_eq!(ping["result"], json!({}), "ping after {after}: {ping}");
    let call = legacy_request(
        server,
        "tools/call",
        json!({"name": "read_ledger", "arguments": {}}),
    );
    assert_eq!(
        call["result"]["structuredContent"],
        json!({"notes": []}),
        "read_ledger after {after}: {call}"
    );
}

/// The same in the 2026-07-28 flow (no `ping` there): a `tools/call`.
fn assert_serves_2026(server: &mut Server, after: &str) {
    let call = server.call("read_ledger", json!({}));
    assert_eq!(
        call["result"]["structuredContent"],
        json!({"notes": []}),
        "read_ledger after {after}: {call}"
    );
}

#[test]
fn every_malformed_line_gets_an_error_with_id_null_and_the_server_serves_on() {
    let env = TestEnv::new();
    let mut server = start_initialized(&env);
    let cases = bad_lines();
    for (name, line, code) in &cases {
        let mut bytes = line.clone();
        bytes.push(b'\n');
        // A big write from a thread, so it cannot deadlock against the server's replies.
        server.send_raw_in_thread(bytes);
        let reply: Value = serde_json::from_str(&server.recv_line()).unwrap();
        assert_eq!(reply["jsonrpc"], "2.0", "{name}: {reply}");
        assert_eq!(reply["error"]["code"], *code, "{name}: {reply}");
        assert!(
            reply.as_object().unwrap().get("id") == Some(&Value::Null),
            "{name}: the reply must carry \"id\":null: {reply}"
        );
        assert!(
            !reply.to_string().contains(CANARY),
            "{name}: the reply does not echo the line: {reply}"
        );
        assert_serves(&mut server, name);
    }

    // An empty line is ignored: the next line on stdout is the ping's reply.
    server.send_raw(b"\n");
    let id = server.next_id();
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"}));
    let next: Value = serde_json::from_str(&server.recv_line()).unwrap();
    assert_eq!(next["id"], id, "an empty line gets no reply: {next}");
    assert_serves(&mut server, "an empty line");

    assert!(server.close().success(), "stderr:\n{}", server.stderr());
    let stderr = server.stderr();
    assert!(
        !stderr.contains(CANARY),
        "stderr quotes a bad line:\n{stderr}"
    );
    let warnings = stderr
        .lines()
        .filter(|line| line.contains(" WARN ") && line.contains("refused a line"))
        .count();
    assert_eq!(
        warnings,
        cases.len(),
        "one warning per bad line at the default level:\n{stderr}"
    );
    assert!(
        stderr.contains("bytes="),
        "the warning gives the line's length:\n{stderr}"
    );

    let verify = env.audit_verify();
    assert!(
        verify.status.success(),
        "audit verify: {}",
        common::output_text(&verify)
    );
    // One record per tools/call; a bad line leaves none.
    assert_eq!(env.audit_records().len(), cases.len() + 1);
}

#[test]
fn max_line_bytes_sets_the_limit() {
    let env = TestEnv::new();
    let mut command = env.command();
    command.args(["--max-line-bytes", "1000"]);
    let mut server = Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    // A request padded to exactly 1,000 bytes is served; one byte more is refused.
    let id = server.next_id();
    let call = json!({"name": "read_ledger", "arguments": {}});
    let mut line = serde_json::to_vec(&common::request(id, "tools/call", call.clone())).unwrap();
    line.resize(1000, b' ');
    line.push(b'\n');
    server.send_raw(&line);
    assert!(server.response(id).get("result").is_some());
    let mut line = serde_json::to_vec(&common::request(id + 1, "tools/call", call)).unwrap();
    line.resize(1001, b' ');
    line.push(b'\n');
    server.send_raw(&line);
    let reply: Value = serde_json::from_str(&server.recv_line()).unwrap();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(reply["error"]["data"]["max_line_bytes"], 1000, "{reply}");
    assert!(reply["id"].is_null(), "{reply}");
    assert_serves_2026(&mut server, "a line over --max-line-bytes");
    assert!(server.close().success());
}

#[test]
fn zero_limits_are_refused_before_anything_is_read() {
    for flag in ["--max-in-flight", "--max-line-bytes"] {
        let env = TestEnv::new();
        let mut command = env.command();
        command.args([flag, "0"]);
        let output = common::run_to_end(command);
        assert!(!output.status.success(), "{flag} 0 must not start");
        let text = common::output_text(&output);
        assert!(text.contains(flag), "{flag}: {text}");
        assert!(!env.ledger.exists(), "{flag}: nothing written");
    }
}

#[test]
fn pipelined_calls_past_the_limit_are_all_answered() {
    let env = TestEnv::new();
    let mut command = env.command();
    command.args(["--max-in-flight", "2"]);
    let mut server = Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    let mut batch = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..200 {
        let id = server.next_id();
        ids.push(id);
        let call = common::request(
            id,
            "tools/call",
            json!({"name": "read_ledger", "arguments": {}}),
        );
        batch.extend(serde_json::to_vec(&call).unwrap());
        batch.push(b'\n');
    }
    // Written from a thread: the server stops reading while two calls are unanswered.
    server.send_raw_in_thread(batch);
    for id in ids {
        assert!(server.response(id).get("result").is_some());
    }
    assert!(server.close().success());
    let verify = env.audit_verify();
    assert!(verify.status.success(), "{}", common::output_text(&verify));
    assert_eq!(env.audit_records().len(), 200);
}
