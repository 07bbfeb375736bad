//! Cedar through the real binary: `policy schema` prints the Cedar schema of the binary's own
//! tools for editors; a policy naming Cedar policies decides lists and calls with them (the
//! JSON policy's decision AND Cedar's, `forbid` winning), every call record names the
//! determining policies and the set's digest; a set that does not fit the tools stops the
//! server from starting, and a SIGHUP with one keeps the old set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Instant;

use common::*;
use serde_json::{Value, json};

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

const POLICY: &str = r#"{"version": 1, "allow": ["write_note", "read_ledger"], "deny": ["rm_rf"],
  "idempotency": {"write_note": {"key_argument": "request_id", "effect": "idempotent"}},
  "cedar": "notes.cedar"}"#;

const CEDAR: &str = r#"// alice sees the tools; anybody else sees nothing.
@id("alice-lists")
permit(principal == Toolgate::Caller::"alice", action == Toolgate::Action::"tools/list", resource);

@id("alice-reads")
permit(principal == Toolgate::Caller::"alice", action == Toolgate::Action::"read_ledger", resource);

// Only notes whose id says they are approved.
@id("alice-writes-approved")
permit(principal == Toolgate::Caller::"alice", action == Toolgate::Action::"write_note", resource)
when { context.arguments.request_id like "ok-*" };

@id("no-secrets")
forbid(principal, action == Toolgate::Action::"write_note", resource)
when { context.arguments.text like "*secret*" };
"#;

/// A test environment whose policy names `notes.cedar` holding `cedar`.
fn cedar_env(cedar: &str) -> TestEnv {
    let env = TestEnv::new();
    std::fs::write(&env.policy, POLICY).unwrap();
    std::fs::write(env.path("notes.cedar"), cedar).unwrap();
    env
}

fn spawn_as(env: &TestEnv, principal: &str) -> Server {
    let mut command = env.command();
    command.arg("--principal").arg(principal);
    Server::spawn(command, &env.path(&format!("stderr-{principal}")))
}

fn error_code(reply: &Value) -> Option<i64> {
    reply.get("error").and_then(|e| e["code"].as_i64())
}

fn is_error(reply: &Value) -> bool {
    result_of(reply).get("isError") == Some(&Value::Bool(true))
}

/// The last audit record of a tools/call of `tool`.
fn last_call(env: &TestEnv, tool: &str) -> Value {
    audit_records(&env.audit_path())
        .into_iter()
        .rev()
        .find(|r| r["method"] == "tools/call" && r["name"] == tool)
        .unwrap_or_else(|| panic!("no record of {tool}"))
}

#[test]
fn cedar_decides_lists_and_calls_and_the_audit_names_the_determining_policies() {
    let env = cedar_env(CEDAR);
    let digest = sha256_hex(CEDAR.as_bytes());
    let mut alice = spawn_as(&env, "alice");
    alice.discover();
    let mut listed = alice.list_tool_names();
    listed.sort();
    assert_eq!(listed, ["read_ledger", "write_note"]);

    // Both the JSON policy and Cedar allow it.
    let written = alice.write_note("ok-000001", "hello");
    assert_eq!(note_status(&written), "committed", "{written}");
    let record = last_call(&env, "write_note");
    assert_eq!(record["decision"], "allow");
    assert_eq!(record["cedar_policies"], json!(["alice-writes-approved"]));
    assert_eq!(record["cedar_digest"], digest);

    // No permit for this id: an isError refusal of the usual shape, nothing written.
    let refused = alice.write_note("no-000001", "hello");
    assert!(is_error(&refused), "{refused}");
    let details = &result_of(&refused)["structuredContent"];
    assert_eq!(details["rule"], "cedar", "{refused}");
    assert_eq!(details["policies"], json!([]), "{refused}");
    assert!(!env.note_path("no-000001").exists());
    let record = last_call(&env, "write_note");
    assert_eq!(
        (&record["decision"], &record["reason"]),
        (&json!("deny"), &json!("cedar"))
    );
    assert_eq!(record["cedar_policies"], json!([]));
    assert_eq!(record["cedar_digest"], digest);

    // A forbid wins over the permit, and is named.
    let forbidden = alice.write_note("ok-000002", "my secret plan");
    assert!(is_error(&forbidden), "{forbidden}");
    assert!(first_text(&forbidden).contains("no-secrets"), "{forbidden}");
    assert!(
        !first_text(&forbidden).contains("secret plan"),
        "{forbidden}"
    );
    assert!(!env.note_path("ok-000002").exists());
    assert_eq!(
        last_call(&env, "write_note")["cedar_policies"],
        json!(["no-secrets"])
    );
    // The JSON policy still decides first: rm_rf is denied there, whatever Cedar says.
    let denied = alice.call("rm_rf", json!({"path": "/tmp/x"}));
    assert_eq!(error_code(&denied), Some(INVALID_PARAMS), "{denied}");
    alice.close();

    // Another principal: Cedar lists nothing, and a call is as unknown as a missing tool.
    let mut bob = spawn_as(&env, "bob");
    bob.discover();
    assert!(bob.list_tool_names().is_empty());
    let hidden = bob.call("read_ledger", json!({}));
    assert_eq!(error_code(&hidden), Some(INVALID_PARAMS), "{hidden}");
    let unknown = bob.call("no_such_tool", json!({}));
    assert_eq!(hidden["error"], unknown["error"]);
    let record = last_call(&env, "read_ledger");
    assert_eq!(record["reason"], "cedar.list");
    assert_eq!(record["principal"], "bob");
    bob.close();
    assert_verifies(&env.ledger);
}

#[test]
fn a_cedar_set_that_does_not_fit_the_tools_stops_the_server_naming_policy_and_line() {
    let env = cedar_env(
        r#"@id("fine")
permit(principal, action == Toolgate::Action::"tools/list", resource);
@id("typo")
permit(principal, action == Toolgate::Action::"write_note", resource)
when { context.arguments.txt == "x" };
"#,
    );
    let output = run_to_end(env.command());
    assert!(!output.status.success());
    let text = output_text(&output);
    assert!(
        text.contains("notes.cedar") && text.contains("policy typo (line 5)"),
        "{text}"
    );
    assert!(!env.audit_path().exists() || audit_records(&env.audit_path()).is_empty());
}

/// The first `policy/reload` record with `outcome` after the first `after` records.
fn wait_for_reload(env: &TestEnv, server: &mut Server, outcome: &str, after: usize) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let records = audit_records(&env.audit_path());
        if let Some(record) = records
            .iter()
            .skip(after)
            .find(|r| r["method"] == "policy/reload" && r["outcome"] == outcome)
        {
            return record.clone();
        }
        assert!(
            Instant::now() < deadline && server.is_running(),
            "no {outcome} reload; stderr:\n{}",
            server.stderr()
        );
        poll_pause();
    }
}

#[test]
fn tags_in_the_policy_are_the_tools_tags_in_cedar_and_reload_with_it() {
    let env = TestEnv::new();
    let tagged = POLICY.replace(
        r#""cedar": "notes.cedar""#,
        r#""cedar": "notes.cedar", "tags": {"read_ledger": ["finance"]}"#,
    );
    std::fs::write(&env.policy, &tagged).unwrap();
    std::fs::write(
        env.path("notes.cedar"),
        r#"@id("lists") permit(principal, action == Toolgate::Action::"tools/list", resource);
@id("calls") permit(principal, action in Toolgate::Action::"tools/call", resource);
@id("no-finance") forbid(principal, action, resource) when { resource.tags.contains("finance") };
"#,
    )
    .unwrap();
    let mut alice = spawn_as(&env, "alice");
    alice.discover();
    // Forbidden outright by its tag: not listed, and called it is as unknown as a missing tool.
    assert_eq!(alice.list_tool_names(), ["write_note"]);
    let hidden = alice.call("read_ledger", json!({}));
    assert_eq!(error_code(&hidden), Some(INVALID_PARAMS), "{hidden}");
    assert_eq!(last_call(&env, "read_ledger")["reason"], "cedar.list");
    let written = alice.write_note("ok-000001", "hello");
    assert_eq!(note_status(&written), "committed", "{written}");

    // The tags are the policy's: a reload without them lists and runs the tool.
    std::fs::write(&env.policy, POLICY).unwrap();
    let before = audit_records(&env.audit_path()).len();
    sighup(alice.pid());
    wait_for_reload(&env, &mut alice, "reloaded", before);
    let mut listed = alice.list_tool_names();
    listed.sort();
    assert_eq!(listed, ["read_ledger", "write_note"]);
    let read = alice.call("read_ledger", json!({}));
    assert!(read.get("error").is_none() && !is_error(&read), "{read}");
    assert_eq!(
        last_call(&env, "read_ledger")["cedar_policies"],
        json!(["calls"])
    );
    alice.close();
    assert_verifies(&env.ledger);
}

#[test]
fn sighup_with_a_cedar_set_that_does_not_fit_keeps_the_old_one() {
    let env = cedar_env(CEDAR);
    let mut alice = spawn_as(&env, "alice");
    alice.discover();
    let wait_for = |server: &mut Server, outcome: &str, after: usize| {
        wait_for_reload(&env, server, outcome, after)
    };
    // An argument the tool does not have: refused, the old set stays.
    std::fs::write(
        env.path("notes.cedar.new"),
        CEDAR.replace("context.arguments.text like", "context.arguments.body like"),
    )
    .unwrap();
    std::fs::rename(env.path("notes.cedar.new"), env.path("notes.cedar")).unwrap();
    let before = audit_records(&env.audit_path()).len();
    sighup(alice.pid());
    let rejected = wait_for(&mut alice, "rejected", before);
    let reason = rejected["reason"].as_str().unwrap();
    assert!(reason.contains("no-secrets"), "{reason}");
    let forbidden = alice.write_note("ok-000003", "a secret");
    assert!(
        is_error(&forbidden),
        "the old set still forbids: {forbidden}"
    );

    // A set that fits replaces it: now alice may write anything.
    let open = CEDAR.replace("when { context.arguments.request_id like \"ok-*\" }", "");
    let open = open.replace(
        "when { context.arguments.text like \"*secret*\" }",
        "when { false }",
    );
    std::fs::write(env.path("notes.cedar"), &open).unwrap();
    let before = audit_records(&env.audit_path()).len();
    sighup(alice.pid());
    wait_for(&mut alice, "reloaded", before);
    let written = alice.write_note("any-000004", "a secret");
    assert_eq!(note_status(&written), "committed", "{written}");
    assert_eq!(
        last_call(&env, "write_note")["cedar_digest"],
        sha256_hex(open.as_bytes())
    );
    alice.close();
    assert_verifies(&env.ledger);
}

#[test]
fn policy_test_runs_a_table_of_cases_and_fails_on_a_mismatch() {
    let env = cedar_env(CEDAR);
    let alice = json!({"id": "alice"});
    let cases = json!({"cases": [
        {"name": "alice writes an approved note", "expect": "allow",
         "policies": ["alice-writes-approved"],
         "request": {"principal": alice, "tool": "write_note",
                     "arguments": {"request_id": "ok-1", "text": "hi"}}},
        {"name": "no permit for other ids", "expect": "deny", "policies": [],
         "request": {"principal": alice, "tool": "write_note",
                     "arguments": {"request_id": "no-1", "text": "hi"}}},
        {"name": "secrets are forbidden", "expect": "deny", "policies": ["no-secrets"],
         "request": {"principal": alice, "tool": "write_note",
                     "arguments": {"request_id": "ok-2", "text": "top secret"}}},
        {"name": "bob sees nothing", "expect": "hidden",
         "request": {"principal": {"id": "bob", "channel": "http", "roles": ["admin"]},
                     "tool": "read_ledger"}},
        {"name": "the JSON policy denies rm_rf", "expect": "hidden",
         "request": {"principal": alice, "tool": "rm_rf", "arguments": {"path": "/"}}}
    ]});
    std::fs::write(env.path("cases.json"), cases.to_string()).unwrap();
    let run = |file: &str| {
        let mut command = env.command();
        command.args(["policy", "test"]).arg(env.path(file));
        run_to_end(command)
    };
    let output = run("cases.json");
    let text = String::from_utf8(output.stdout.clone()).unwrap();
    assert!(output.status.success(), "{}", output_text(&output));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        5,
        "{text}"
    );
    assert!(text.contains("5 cases, 0 mismatches"), "{text}");
    assert!(
        text.contains("secrets are forbidden: deny (rule cedar); Cedar: no-secrets"),
        "{text}"
    );

    // One wrong expectation: exit 1, the case named.
    let mut wrong = cases.clone();
    wrong["cases"][0]["policies"] = json!(["alice-reads"]);
    std::fs::write(env.path("wrong.json"), wrong.to_string()).unwrap();
    let output = run("wrong.json");
    assert_eq!(output.status.code(), Some(1), "{}", output_text(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("MISMATCH alice writes an approved note") && text.contains("1 mismatch"),
        "{text}"
    );
    // A file that is not a table of cases: exit 2, nothing decided.
    std::fs::write(env.path("bad.json"), r#"{"cases": [{"name": "x"}]}"#).unwrap();
    let output = run("bad.json");
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
}

#[test]
fn policy_explain_prints_one_decision_with_its_policies() {
    let env = cedar_env(CEDAR);
    let explain = |args: &[&str]| {
        let mut command = env.command();
        command.args(["policy", "explain"]).args(args);
        let output = run_to_end(command);
        assert!(output.status.success(), "{}", output_text(&output));
        String::from_utf8(output.stdout).unwrap()
    };
    let text = explain(&[
        "write_note",
        r#"{"request_id": "ok-7", "text": "secret"}"#,
        "--as",
        "alice",
    ]);
    assert_eq!(
        text.trim(),
        "write_note for alice: deny (rule cedar); Cedar: no-secrets\nlisted: yes"
    );
    let text = explain(&["read_ledger", "--as", "alice"]);
    assert!(
        text.starts_with("read_ledger for alice: allow (rule allow); Cedar: alice-reads"),
        "{text}"
    );
    let text = explain(&["read_ledger", "--as", "bob", "--attr", "role=admin"]);
    assert!(
        text.contains("hidden (rule cedar.list)") && text.contains("listed: no"),
        "{text}"
    );
}

/// Nothing but the call's arguments reaches Cedar's context: a `_meta` that carries arguments,
/// an idempotency key or a principal of its own choosing changes no decision, and a replay key
/// cannot carry a refused call through.
#[test]
fn meta_cannot_steer_a_cedar_decision() {
    let env = cedar_env(CEDAR);
    let mut alice = spawn_as(&env, "alice");
    alice.discover();
    let refused_arguments = json!({"request_id": "no-000009", "text": "hello"});
    for meta in [
        json!({"arguments": {"request_id": "ok-000009"}}),
        json!({"io.toolgate/idempotencyKey": "ok-000009", "principal": "bob"}),
        json!({"context": {"arguments": {"request_id": "ok-1"}}, "now": 0, "client": "x"}),
    ] {
        let reply = alice.request(
            "tools/call",
            json!({"name": "write_note", "arguments": refused_arguments, "_meta": meta}),
        );
        assert!(is_error(&reply), "{meta}: {reply}");
        assert_eq!(
            result_of(&reply)["structuredContent"]["rule"],
            "cedar",
            "{reply}"
        );
    }
    assert!(!env.note_path("no-000009").exists());
    // A permitted call under a key, then a refused call with the same key: refused, not replayed.
    let ok = alice.call_with_key(
        "write_note",
        json!({"request_id": "ok-000010", "text": "hello"}),
        "shared-key-0001",
    );
    assert_eq!(note_status(&ok), "committed", "{ok}");
    let refused = alice.call_with_key(
        "write_note",
        json!({"request_id": "no-000010", "text": "hello"}),
        "shared-key-0001",
    );
    assert!(is_error(&refused), "{refused}");
    assert!(!env.note_path("no-000010").exists());
    alice.close();
    assert_verifies(&env.ledger);
}

/// A JSON-RPC request of the 2025-11-25 flow (no `_meta`).
fn legacy_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// A request of the 2025-11-25 flow and its reply.
fn legacy(server: &mut Server, method: &str, params: Value) -> Value {
    let id = server.send_legacy(method, params);
    server.response(id)
}

/// A `tools/call` of the 2025-11-25 flow and its reply.
fn legacy_tool(server: &mut Server, name: &str, arguments: Value) -> Value {
    legacy(
        server,
        "tools/call",
        json!({"name": name, "arguments": arguments}),
    )
}

/// The records of tool calls in the audit log.
fn call_records(env: &TestEnv) -> Vec<Value> {
    audit_records(&env.audit_path())
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect()
}

/// MCP 2025-11-25 has no JSON-RPC batches, and neither has this server: over stdio, a line
/// holding an array of requests (after a normal `initialize`) is refused whole with one
/// `-32600` Invalid Request and `"id":null`. No request of it reaches the gate: not the call
/// both policies permit, not the one Cedar has no permit for, not the one a Cedar `forbid`
/// names, not the one the JSON policy denies. So nothing is written, nothing is audited as a
/// call, and a later call of the permitted request runs as the first (`committed`, not a
/// replay). The refusal is the same whatever the batch holds (a refused tool is not told
/// apart from an unknown one), and the server goes on serving.
#[test]
fn a_json_rpc_batch_is_refused_whole_and_carries_no_call_past_the_policies() {
    let env = cedar_env(CEDAR);
    let mut alice = spawn_as(&env, "alice");
    alice.initialize(json!({}));
    let permitted = || {
        legacy_call(
            101,
            "write_note",
            json!({"request_id": "ok-000020", "text": "hello"}),
        )
    };
    let no_permit = || {
        legacy_call(
            102,
            "write_note",
            json!({"request_id": "no-000021", "text": "hello"}),
        )
    };
    let forbidden = || {
        legacy_call(
            103,
            "write_note",
            json!({"request_id": "ok-000022", "text": "a secret"}),
        )
    };
    let denied = || {
        legacy_call(
            104,
            "rm_rf",
            json!({"path": env.path("victim").to_str().unwrap()}),
        )
    };
    let unknown = || legacy_call(105, "no_such_tool", json!({}));
    std::fs::write(env.path("victim"), "still here").unwrap();
    let calls_before = call_records(&env).len();

    let batches = [
        json!([permitted(), no_permit(), forbidden(), denied()]),
        json!([permitted()]),
        json!([no_permit()]),
        json!([forbidden()]),
        json!([denied()]),
        json!([unknown()]),
        json!([forbidden(), {"jsonrpc": "2.0", "method": "notifications/initialized"}, permitted()]),
    ];
    let mut refusals = Vec::new();
    for batch in &batches {
        alice.send(batch);
        let line = alice.recv_line();
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["id"], Value::Null, "{batch}: {reply}");
        assert_eq!(reply["error"]["code"], json!(-32600), "{batch}: {reply}");
        refusals.push(reply);
    }
    // One reply per batch, the same for all: nothing tells a refused tool from an unknown one.
    assert!(refusals.iter().all(|r| *r == refusals[0]), "{refusals:?}");
    let message = refusals[0]["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains("write_note") && !message.contains("rm_rf"),
        "{message}"
    );

    // The server still serves, and nothing of any batch ran or was answered.
    let mut listed = tool_names(&legacy(&mut alice, "tools/list", json!({})));
    listed.sort();
    assert_eq!(listed, ["read_ledger", "write_note"]);
    assert!(env.note_files().is_empty(), "{:?}", env.note_files());
    assert_eq!(
        std::fs::read_to_string(env.path("victim")).unwrap(),
        "still here"
    );
    assert_eq!(
        call_records(&env).len(),
        calls_before,
        "{:?}",
        call_records(&env)
    );

    // The same requests one by one: each decided as it would be alone.
    let ok = legacy_tool(
        &mut alice,
        "write_note",
        json!({"request_id": "ok-000020", "text": "hello"}),
    );
    assert_eq!(
        note_status(&ok),
        "committed",
        "the batch ran it before: {ok}"
    );
    assert_eq!(
        std::fs::read(env.note_path("ok-000020")).unwrap(),
        note_bytes("ok-000020", "hello")
    );
    let refused = legacy_tool(
        &mut alice,
        "write_note",
        json!({"request_id": "no-000021", "text": "hello"}),
    );
    assert_eq!(
        result_of(&refused)["structuredContent"]["rule"],
        "cedar",
        "{refused}"
    );
    let refused = legacy_tool(
        &mut alice,
        "write_note",
        json!({"request_id": "ok-000022", "text": "a secret"}),
    );
    assert!(first_text(&refused).contains("no-secrets"), "{refused}");
    let denied = legacy_tool(
        &mut alice,
        "rm_rf",
        json!({"path": env.path("victim").to_str().unwrap()}),
    );
    let unknown = legacy_tool(&mut alice, "no_such_tool", json!({}));
    assert_eq!(error_code(&denied), Some(INVALID_PARAMS), "{denied}");
    assert_eq!(denied["error"], unknown["error"]);
    assert_eq!(env.note_files(), [env.note_path("ok-000020")]);
    assert_eq!(
        std::fs::read_to_string(env.path("victim")).unwrap(),
        "still here"
    );
    alice.close();

    // No reply ever carried an id of a batched request.
    for line in &alice.transcript {
        let message: Value = serde_json::from_str(line).unwrap();
        let id = message["id"].as_u64().unwrap_or(0);
        assert!(!(101..=105).contains(&id), "{line}");
    }
    // The audit holds the single calls only: one allow of write_note, then the refusals.
    let calls: Vec<(String, String, String)> = call_records(&env)
        .iter()
        .skip(calls_before)
        .map(|r| {
            let text = |key: &str| r[key].as_str().unwrap_or("").to_owned();
            (text("name"), text("decision"), text("reason"))
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("write_note", "allow", "allow"),
        ("write_note", "deny", "cedar"),
        ("write_note", "deny", "cedar"),
        ("rm_rf", "deny", "deny"),
        ("no_such_tool", "deny", "unknown_tool"),
    ]
    .iter()
    .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
    .collect();
    assert_eq!(calls, expected);

    // The 2026-07-28 flow (`server/discover`, each request with its `_meta`): the same.
    let calls_before = call_records(&env).len();
    let mut again = spawn_as(&env, "alice");
    again.discover();
    let mut batch = json!([forbidden(), permitted(), no_permit()]);
    for item in batch.as_array_mut().unwrap() {
        item["params"]["_meta"] = meta();
    }
    again.send(&batch);
    let reply: Value = serde_json::from_str(&again.recv_line()).unwrap();
    assert_eq!(reply, refusals[0]);
    again.close();
    assert_eq!(env.note_files(), [env.note_path("ok-000020")]);
    assert_eq!(call_records(&env).len(), calls_before);
    assert_verifies(&env.ledger);
}
