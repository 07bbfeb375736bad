//! The server's contract at run time, through the real binary: the digest it publishes, the
//! attestation that gates its start, and the contract-aware refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{TestEnv, output_text, run_to_end, scrubbed_command};
use serde_json::{Value, json};

const COMMITTED_LOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../toolgate.lock");

fn contract(env: &TestEnv, args: &[&str], extra: &[&str]) -> Output {
    let mut command = scrubbed_command();
    command.arg("--policy").arg(&env.policy).args(extra);
    command.arg("contract").args(args);
    run_to_end(command)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn live_digest(env: &TestEnv) -> String {
    let output = contract(env, &["digest"], &[]);
    assert!(output.status.success(), "{}", output_text(&output));
    stdout(&output)
}

/// Starts the server with `extra` flags and stdin closed; returns its output once it exits.
fn start_with(env: &TestEnv, extra: &[&str]) -> Output {
    let mut command = env.command();
    command.args(extra);
    run_to_end(command)
}

fn assert_refused(env: &TestEnv, output: &Output, needle: &str) {
    assert!(
        !output.status.success(),
        "the server started: {}",
        output_text(output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got {stderr:?}"
    );
    assert!(lines[0].contains(needle), "{needle:?} not in {stderr:?}");
    assert!(
        !env.ledger.exists(),
        "a refused start must write nothing under the ledger"
    );
}

fn write_key(env: &TestEnv, name: &str, bytes: &[u8]) -> String {
    let path = env.path(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

#[test]
fn the_published_digest_is_the_committed_lockfile_digest() {
    let env = TestEnv::new();
    let digest = live_digest(&env);
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(COMMITTED_LOCK).unwrap()).unwrap();
    assert_eq!(
        lock["integrityDigest"], digest,
        "the binary's contract differs from toolgate.lock: run `cargo xtask lock`"
    );

    let mut server = env.spawn();
    let discovered = server.discover();
    assert_eq!(
        discovered["_meta"]["io.toolgate/contractDigest"], digest,
        "{discovered}"
    );
    let initialized = server.request(
        "initialize",
        json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}
        }),
    );
    let result = &initialized["result"];
    assert_eq!(
        result["_meta"]["io.toolgate/contractDigest"], digest,
        "{initialized}"
    );
}

#[test]
fn attestation_and_expected_digest_gate_the_start() {
    let env = TestEnv::new();
    let digest = live_digest(&env);
    let key = write_key(&env, "key", b"an attestation key of 32+ bytes!!\n");
    let attest = contract(&env, &["attest"], &["--attestation-key-file", &key]);
    assert!(attest.status.success(), "{}", output_text(&attest));
    let attestation = stdout(&attest);
    assert!(attestation.starts_with("hmac-sha256:"), "{attestation}");

    // The right attestation and key: the server starts and serves.
    let mut server = env.spawn_with_env(&[
        ("TOOLGATE_ATTESTATION", Path::new(&attestation)),
        ("TOOLGATE_ATTESTATION_KEY_FILE", Path::new(&key)),
    ]);
    server.discover();
    assert!(server.close().success());
    std::fs::remove_dir_all(&env.ledger).unwrap();

    // The right expected digest: starts.
    let ok = start_with(&env, &["--expect-digest", &digest]);
    assert!(ok.status.success(), "{}", output_text(&ok));
    std::fs::remove_dir_all(&env.ledger).unwrap();

    let wrong_key = write_key(&env, "wrong", b"another key that is long enough..");
    let out = start_with(
        &env,
        &[
            "--attestation",
            &attestation,
            "--attestation-key-file",
            &wrong_key,
        ],
    );
    assert_refused(&env, &out, "signature does not verify");

    let short_key = write_key(&env, "short", &[b'k'; 31]);
    let out = start_with(
        &env,
        &[
            "--attestation",
            &attestation,
            "--attestation-key-file",
            &short_key,
        ],
    );
    assert_refused(&env, &out, "32");

    // Tampered digest: one hex digit of the attested digest changed.
    let mut parts: Vec<String> = attestation.split(':').map(str::to_owned).collect();
    let flipped = if parts[1].starts_with('0') { "1" } else { "0" };
    parts[1].replace_range(0..1, flipped);
    let tampered = parts.join(":");
    let out = start_with(
        &env,
        &["--attestation", &tampered, "--attestation-key-file", &key],
    );
    assert_refused(&env, &out, "does not verify");

    let out = start_with(&env, &["--attestation", &attestation]);
    assert_refused(&env, &out, "without a key");

    let zero = format!("sha256:{}", "0".repeat(64));
    let out = start_with(&env, &["--expect-digest", &zero]);
    assert_refused(&env, &out, "differs from the approved digest");

    // An edited contract: the policy's rule for write_note changed, so its policy fingerprint and
    // the server digest changed; the old attestation no longer matches.
    let policy = std::fs::read_to_string(&env.policy)
        .unwrap()
        .replace("2000", "1000");
    std::fs::write(&env.policy, policy).unwrap();
    assert_ne!(live_digest(&env), digest);
    let out = start_with(
        &env,
        &[
            "--attestation",
            &attestation,
            "--attestation-key-file",
            &key,
        ],
    );
    assert_refused(&env, &out, "differs from the approved digest");
}

#[test]
fn refused_calls_carry_the_input_contract_and_the_changes_since_the_previous_lock() {
    let env = TestEnv::new();
    // The previous contract: the same tools under a policy without argument rules.
    let old_policy = env.path("old-policy.json");
    std::fs::write(
        &old_policy,
        r#"{"version":1,"allow":["write_note","read_ledger"],"deny":["rm_rf"]}"#,
    )
    .unwrap();
    let mut command = scrubbed_command();
    command
        .arg("--policy")
        .arg(&old_policy)
        .args(["contract", "lockfile"]);
    let previous = run_to_end(command);
    assert!(previous.status.success(), "{}", output_text(&previous));
    let previous_lock = env.path("previous.lock");
    std::fs::write(&previous_lock, &previous.stdout).unwrap();

    let mut server = env.spawn_with_env(&[("TOOLGATE_PREVIOUS_LOCK", &previous_lock)]);
    server.discover();

    // A call from a model working from the old contract: `text` missing.
    let reply = server.call("write_note", json!({"request_id": "req-contract-01"}));
    let result = &reply["result"];
    assert_eq!(result["isError"], true, "{reply}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("Error:") && text.contains("`text`"),
        "{text}"
    );
    assert!(
        text.contains("request_id") && text.contains("required"),
        "{text}"
    );
    assert!(
        text.contains("RISKY"),
        "the policy change since the previous lock: {text}"
    );
    assert!(
        !text.contains("SAFE") && !text.contains("COSMETIC"),
        "{text}"
    );

    // An unknown argument (the input schema forbids additional properties).
    let reply = server.call(
        "write_note",
        json!({"request_id": "req-contract-02", "text": "t", "txt": "typo"}),
    );
    let text = reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("`txt`") && !text.contains("typo"), "{text}");

    assert!(server.close().success());
    assert!(env.note_files().is_empty(), "refused calls write nothing");
    let records = env.audit_records();
    let reasons: Vec<&str> = records
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert_eq!(
        reasons,
        ["input_schema.required", "input_schema.unknown_argument"],
        "{records:?}"
    );
    assert!(
        records
            .iter()
            .all(|r| r["decision"] == "deny" && r["outcome"] == "not_executed")
    );
}
