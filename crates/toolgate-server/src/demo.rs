//! `toolgate-server demo`: the gated server end to end, against a real child process.
//!
//! It starts this same binary as a child MCP server over stdio in a temporary directory, drives it
//! with the execute-verify-stop harness, and prints a transcript of each step and its evidence:
//! discovery, the filtered tool list, a write followed by an observed postcondition and the
//! harness's CONTINUE, a direct call of the hidden `rm_rf` refused with its target unchanged, a
//! replay, and the audit chain verified. It returns `Ok(false)` if any expectation failed.
#![allow(clippy::print_stdout)] // The demo's transcript is its output; it is not a stdio server.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::Stdio;

use anyhow::Context as _;
use rmcp::model::{CallToolRequestParams, ErrorCode, ProtocolVersion};
use rmcp::service::ServiceError;
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientLifecycleMode, ClientServiceExt as _};
use serde_json::{Value, json};
use toolgate::canon::Sha256Digest;
use toolgate::harness::{self, NextStep, Step, ToolCall};

/// What an observer can see of a file without trusting anyone: existence, size, mtime, content hash.
#[derive(PartialEq, Eq)]
struct Snapshot {
    exists: bool,
    size: u64,
    mtime_ns: i128,
    sha256: Option<Sha256Digest>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hash = self
            .sha256
            .map(|d| d.to_hex())
            .unwrap_or_else(|| "-".to_owned());
        write!(
            f,
            "exists={} size={} mtime_ns={} sha256={}…",
            self.exists,
            self.size,
            self.mtime_ns,
            hash.get(..16).unwrap_or("-")
        )
    }
}

fn snapshot(path: &Path) -> Snapshot {
    match (std::fs::metadata(path), std::fs::read(path)) {
        (Ok(meta), Ok(bytes)) => Snapshot {
            exists: true,
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            sha256: Some(Sha256Digest::of(&bytes)),
        },
        _ => Snapshot {
            exists: false,
            size: 0,
            mtime_ns: 0,
            sha256: None,
        },
    }
}

struct Transcript {
    ok: bool,
    step: u32,
}

impl Transcript {
    fn heading(&mut self, title: &str) {
        self.step += 1;
        println!("\n[{}] {title}", self.step);
    }

    fn expect(&mut self, ok: bool, what: &str) {
        println!("    {} {what}", if ok { "ok  " } else { "FAIL" });
        self.ok &= ok;
    }
}

fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(name.to_owned());
    if let Value::Object(map) = arguments {
        params.arguments = Some(map);
    }
    params
}

/// Runs the demo; `Ok(true)` when every expectation held.
pub async fn run() -> anyhow::Result<bool> {
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let policy = dir.path().join("policy.json");
    let ledger = dir.path().join("ledger");
    std::fs::write(&policy, crate::REFERENCE_POLICY).context("cannot write the demo policy")?;
    let mut t = Transcript { ok: true, step: 0 };

    println!("toolgate demo: a gated MCP server in a child process, driven over stdio");
    println!("    workdir {}", dir.path().display());
    println!(
        "    policy  {}",
        crate::REFERENCE_POLICY
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    );

    let exe = std::env::current_exe().context("cannot locate the toolgate-server binary")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("--policy")
        .arg(&policy)
        .arg("--ledger")
        .arg(&ledger);
    let (transport, _stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the child server")?;

    t.heading("discover (protocol 2026-07-28, no initialize handshake)");
    let client = ()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .context("server/discover failed")?;
    if let Some(info) = client.peer_info() {
        let name = info
            .server_info
            .as_ref()
            .map(|i| format!("{} {}", i.name, i.version));
        println!(
            "    server {} speaking {}",
            name.unwrap_or_default(),
            info.protocol_version
        );
    }
    t.expect(
        client.peer_info().is_some(),
        "the server answered server/discover",
    );

    t.heading("tools/list: the policy hides rm_rf");
    let tools = client.list_all_tools().await.context("tools/list failed")?;
    let names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    println!("    tools: {}", names.join(", "));
    t.expect(
        names.contains(&"write_note".to_owned()) && names.contains(&"read_ledger".to_owned()),
        "write_note and read_ledger are listed",
    );
    t.expect(!names.contains(&"rm_rf".to_owned()), "rm_rf is not listed");

    t.heading("execute-verify-stop: write_note, then read_ledger, then the harness decides");
    let note = json!({"request_id": "req-demo-0001", "text": "gate applied"});
    let step = Step::new(
        ToolCall::new("write_note", note.clone()),
        ToolCall::new("read_ledger", json!({})),
        harness::expect_contains("/notes", note.clone()),
    );
    let report = harness::run_step(client.peer(), &step).await;
    println!(
        "    write_note  -> {}",
        report.mutation.json().unwrap_or(Value::Null)
    );
    if let Some(observation) = &report.observation {
        println!(
            "    read_ledger -> {}",
            observation.json().unwrap_or(Value::Null)
        );
    }
    println!("    postcondition: {:?}", report.postcondition);
    println!("    verdict: {}", report.verdict);
    t.expect(
        report.verdict == NextStep::Continue,
        "the harness chose CONTINUE",
    );

    t.heading("a direct rm_rf call: refused before any handler code runs");
    let target = dir.path().join("precious.txt");
    std::fs::write(&target, b"do not delete").context("cannot create the rm_rf target")?;
    let before = snapshot(&target);
    println!("    target before: {before:?}");
    let denied = client
        .call_tool(call("rm_rf", json!({"path": target.display().to_string()})))
        .await;
    let code = match &denied {
        Err(ServiceError::McpError(error)) => {
            println!("    JSON-RPC error {}: {}", error.code.0, error.message);
            Some(error.code)
        }
        other => {
            println!("    unexpected reply: {other:?}");
            None
        }
    };
    t.expect(
        code == Some(ErrorCode::INVALID_PARAMS),
        "rm_rf got JSON-RPC error -32602",
    );
    let after = snapshot(&target);
    println!("    target after:  {after:?}");
    t.expect(
        before == after && after.exists,
        "the target's hash, size, mtime and existence are unchanged",
    );
    let unknown = client.call_tool(call("no_such_tool", json!({}))).await;
    let same = matches!((&denied, &unknown), (Err(ServiceError::McpError(a)), Err(ServiceError::McpError(b))) if a == b);
    t.expect(
        same,
        "an unknown tool gets the identical error, so hidden tools cannot be probed",
    );

    t.heading("retry write_note with the same request_id and text: a replay, not a second note");
    let retry = client.call_tool(call("write_note", note.clone())).await;
    let status = retry
        .as_ref()
        .ok()
        .and_then(|r| r.structured_content.clone())
        .unwrap_or(Value::Null);
    println!("    write_note  -> {status}");
    t.expect(status["status"] == "replay", "status is replay");
    let conflict = client
        .call_tool(call(
            "write_note",
            json!({"request_id": "req-demo-0001", "text": "something else"}),
        ))
        .await;
    let is_error = conflict
        .as_ref()
        .map(|r| r.is_error == Some(true))
        .unwrap_or(false);
    println!("    same request_id, other text -> isError: {is_error}");
    t.expect(
        is_error,
        "a different text under the same request_id is refused",
    );
    let notes = std::fs::read_dir(ledger.join(crate::NOTES_DIR))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .count()
        })
        .unwrap_or(0);
    t.expect(notes == 1, "exactly one note file exists");

    t.heading(
        "an argument the schema does not declare: refused with the rule, the fix and JSON details",
    );
    let misspelt = client
        .call_tool(call(
            "write_note",
            json!({"request_id": "req-demo-0002", "text": "hi", "txt": "typo"}),
        ))
        .await;
    // write_note declares an output schema, so the details are the text's last line only.
    let details = misspelt
        .as_ref()
        .ok()
        .filter(|r| r.is_error == Some(true))
        .and_then(|r| r.content.first())
        .and_then(|c| c.as_text())
        .and_then(|t| t.text.lines().last())
        .and_then(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or(Value::Null);
    println!("    details: {details}");
    t.expect(
        details["rule"] == "input_schema.unknown_argument",
        "the unknown argument is refused before the handler runs",
    );

    t.heading(
        "kill switch: `toolgate-server halt` stops writes on the running server, without a restart",
    );
    let gate = toolgate::operator::GateArgs {
        policy: policy.clone(),
        ledger: ledger.clone(),
        ..toolgate::operator::GateArgs::default()
    };
    let switch = gate.kill_switch(crate::SERVER_NAME, None)?;
    toolgate::operator::halt(&switch, gate.audit()?.as_ref(), "demo incident", "demo")?;
    let halted = client
        .call_tool(call(
            "write_note",
            json!({"request_id": "req-demo-0002", "text": "during the halt"}),
        ))
        .await;
    let halted_code = match &halted {
        Err(ServiceError::McpError(error)) => {
            println!(
                "    write_note  -> JSON-RPC error {}: {}",
                error.code.0, error.message
            );
            Some(error.code.0)
        }
        other => {
            println!("    unexpected reply: {other:?}");
            None
        }
    };
    t.expect(
        halted_code == Some(toolgate::HALTED),
        "write_note is refused while halted (JSON-RPC -32001)",
    );
    let exempt = client.call_tool(call("read_ledger", json!({}))).await;
    t.expect(
        exempt.as_ref().is_ok_and(|r| r.is_error != Some(true)),
        "read_ledger, exempt by policy, still answers",
    );
    toolgate::operator::resume(&switch, gate.audit()?.as_ref())?;
    let resumed = client
        .call_tool(call(
            "write_note",
            json!({"request_id": "req-demo-0002", "text": "after resume"}),
        ))
        .await;
    let status = resumed
        .as_ref()
        .ok()
        .and_then(|r| r.structured_content.clone())
        .unwrap_or(Value::Null);
    println!("    after resume: write_note -> {status}");
    t.expect(
        status["status"] == "committed",
        "writes work again after resume",
    );

    client.cancel().await.context("cannot close the session")?;

    t.heading("audit verify: every decision is in the SHA-256 chain");
    let audit = std::fs::read_to_string(ledger.join(crate::AUDIT_FILE)).unwrap_or_default();
    for line in audit.lines() {
        let record: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        println!(
            "    {:<12} {:<6} {:<13} {:<30} sha256 {}…",
            record["name"].as_str().unwrap_or("?"),
            record["decision"].as_str().unwrap_or("?"),
            record["outcome"].as_str().unwrap_or("?"),
            record["reason"].as_str().unwrap_or(""),
            record["sha256"]
                .as_str()
                .unwrap_or("?")
                .get(..12)
                .unwrap_or("?"),
        );
    }
    let report = gate.verify()?;
    match &report.problem {
        None => println!(
            "    intact: {} records, head {}",
            report.records, report.head
        ),
        Some(problem) => println!("    BROKEN: {problem}"),
    }
    t.expect(
        report.problem.is_none() && report.records == 12,
        "the chain verifies with 12 records",
    );

    println!(
        "\n{}",
        if t.ok {
            "demo: all checks passed"
        } else {
            "demo: SOME CHECKS FAILED"
        }
    );
    Ok(t.ok)
}
