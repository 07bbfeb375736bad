//! The audit log as an auditor sees it, through the real binary: signed checkpoints written by a
//! running server, `audit verify` with and without the key (text and JSON), the records' seq,
//! policy and contract digests, and `audit stats`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{
    TestEnv, note_status, output_text, run_into_closed_pipe, run_to_end, scrubbed_command,
};
use serde_json::{Value, json};

const COMMITTED_LOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../toolgate.lock");

fn audit(env: &TestEnv, args: &[&str]) -> Output {
    let mut command = scrubbed_command();
    command
        .arg("--ledger")
        .arg(&env.ledger)
        .arg("audit")
        .args(args);
    run_to_end(command)
}

/// `toolgate-server --ledger L <args>` (operator commands such as `halt`).
fn ledger_command(env: &TestEnv, args: &[&str]) -> Output {
    let mut command = scrubbed_command();
    command.arg("--ledger").arg(&env.ledger).args(args);
    run_to_end(command)
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", output_text(output)))
}

fn write_key(env: &TestEnv, name: &str, bytes: &[u8]) -> String {
    let path = env.path(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

/// A session with checkpoints every 3 records: 3 notes, a replay, a denied call, a read.
fn session(env: &TestEnv, key: &str) {
    session_with(env, key, &[]);
}

/// [`session`] with extra server arguments.
fn session_with(env: &TestEnv, key: &str, extra: &[&str]) {
    let mut command = env.command();
    command.args(["--audit-key-file", key, "--checkpoint-every", "3"]);
    command.args(extra);
    let mut server = common::Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    for (id, text) in [
        ("req-audit-01", "a"),
        ("req-audit-02", "b"),
        ("req-audit-03", "c"),
    ] {
        assert_eq!(note_status(&server.write_note(id, text)), "committed");
    }
    assert_eq!(
        note_status(&server.write_note("req-audit-01", "a")),
        "replay"
    );
    server.call("rm_rf", json!({"path": "/"}));
    server.call("read_ledger", json!({}));
    assert!(server.close().success(), "{}", server.stderr());
}

#[test]
fn a_served_log_carries_seq_digests_and_signed_checkpoints() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    session(&env, &key);

    let records = env.audit_records();
    assert_eq!(records.len(), 6);
    let policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    let policy_digest = common::sha256_hex(&toolgate::canon::canonical_value(&policy));
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(COMMITTED_LOCK).unwrap()).unwrap();
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record["seq"], json!(i + 1), "{record}");
        assert_eq!(record["policy_digest"], json!(policy_digest), "{record}");
        let tool = record["name"].as_str().unwrap();
        let locked = lock["tools"][tool]["integrityDigest"].as_str().unwrap();
        assert_eq!(
            format!("sha256:{}", record["contract_digest"].as_str().unwrap()),
            locked,
            "{record}"
        );
    }

    // Checkpoints at 3 and 6 records (the shutdown one covers the tail).
    let checkpoints = std::fs::read_to_string(env.ledger.join("audit.checkpoints.jsonl")).unwrap();
    let counts: Vec<u64> = checkpoints
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["count"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(counts.last(), Some(&6), "{checkpoints}");

    let out = audit(&env, &["verify", "--key-file", &key, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let report = json_of(&out);
    assert_eq!(report["status"], "intact");
    assert_eq!(report["records"], 6);
    assert!(
        report["checkpoints_verified"].as_u64().unwrap() >= 1,
        "{report}"
    );

    // Without the key the checkpoints are reported as unchecked, not silently trusted.
    let out = audit(&env, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("NOT checked"),
        "{}",
        output_text(&out)
    );
}

fn cut_last_line(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap();
    let body = text.trim_end_matches('\n');
    let cut = body.rfind('\n').map(|i| i + 1).unwrap_or(0);
    std::fs::write(log, &text[..cut]).unwrap();
}

#[test]
fn verify_names_truncation_deletion_and_a_wrong_key() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    session(&env, &key);
    let log = env.audit_path();
    let original = std::fs::read_to_string(&log).unwrap();

    // A wrong key: the checkpoints do not verify.
    let wrong = write_key(&env, "wrong.key", b"not the key that signed them, 32+!");
    let out = audit(&env, &["verify", "--key-file", &wrong, "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert_eq!(
        json_of(&out)["problem"]["reason"],
        "bad_checkpoint_signature"
    );

    // A clean cut at a line boundary: invisible to the chain alone, caught by the checkpoint.
    cut_last_line(&log);
    let out = audit(&env, &["verify"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "without a key a clean cut passes (documented)"
    );
    let out = audit(&env, &["verify", "--key-file", &key, "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert_eq!(
        json_of(&out)["problem"]["reason"],
        "truncated_before_checkpoint"
    );

    // A deleted middle record: a gap in seq, with the line and the seq named.
    let mut lines: Vec<&str> = original.lines().collect();
    lines.remove(2);
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let out = audit(&env, &["verify", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let problem = &json_of(&out)["problem"];
    assert_eq!(problem["reason"], "seq_gap", "{problem}");
    assert_eq!(problem["line"], 3);
    assert_eq!(problem["seq"], 3);
    let out = audit(&env, &["verify"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3: seq_gap"),
        "{}",
        output_text(&out)
    );

    // Usage and I/O errors exit 2.
    let short = write_key(&env, "short.key", &[b'k'; 31]);
    let out = audit(&env, &["verify", "--key-file", &short]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    let out = audit(&env, &["verify", "--format", "yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
}

#[test]
fn stats_count_per_tool_decision_and_outcome_with_ratios() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    session(&env, &key);

    let out = audit(&env, &["stats", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let stats = json_of(&out);
    assert_eq!(stats["calls"], 6);
    assert_eq!(
        stats["totals"],
        json!({"committed": 3, "replay": 1, "deny": 1, "failure": 0})
    );
    assert_eq!(stats["ratios"]["committed"], 0.5);
    let counts = stats["counts"].as_array().unwrap();
    let find = |tool: &str, outcome: &str| {
        counts
            .iter()
            .find(|c| c["tool"] == tool && c["outcome"] == outcome)
            .map(|c| c["records"].clone())
    };
    assert_eq!(find("write_note", "committed"), Some(json!(3)));
    assert_eq!(find("write_note", "replay"), Some(json!(1)));
    assert_eq!(find("rm_rf", "not_executed"), Some(json!(1)));
    assert_eq!(find("read_ledger", "observed"), Some(json!(1)));

    let out = audit(&env, &["stats"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("write_note") && text.contains("committed") && text.contains("50.0%"),
        "{text}"
    );
}

#[test]
fn verify_with_the_mirror_detects_a_deleted_checkpoint_file() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    let mirror = env.path("other-volume/mirror.checkpoints.jsonl");
    let mirror_arg = mirror.display().to_string();
    session_with(&env, &key, &["--checkpoint-mirror", &mirror_arg]);
    // An operator command configured like the server writes its checkpoint to the mirror too.
    let out = ledger_command(
        &env,
        &[
            "--audit-key-file",
            &key,
            "--checkpoint-mirror",
            &mirror_arg,
            "halt",
            "--reason",
            "mirror test",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let cps = env.ledger.join("audit.checkpoints.jsonl");
    assert_eq!(
        std::fs::read_to_string(&mirror).unwrap(),
        std::fs::read_to_string(&cps).unwrap(),
        "the mirror holds every checkpoint"
    );

    let keyed = ["verify", "--key-file", &key, "--format", "json"];
    let with_mirror = [&keyed[..], &["--checkpoint-mirror", &mirror_arg]].concat();
    let out = audit(&env, &with_mirror);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let report = json_of(&out);
    assert_eq!(report["status"], "intact", "{report}");
    assert_eq!(report["records"], 7, "{report}");
    assert_eq!(report["mirror"], mirror_arg.as_str(), "{report}");
    assert_eq!(report["checkpoint_mismatch"], Value::Null, "{report}");

    // The ledger's checkpoint file is deleted: alone it now proves nothing (a warning), and with
    // the mirror it is a problem naming the file and how many checkpoints it lost.
    let lost = std::fs::read_to_string(&cps).unwrap().lines().count();
    std::fs::remove_file(&cps).unwrap();
    let out = audit(&env, &keyed);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    assert_eq!(json_of(&out)["warnings"][0]["kind"], "no_checkpoints");
    let out = audit(&env, &with_mirror);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let problem = json_of(&out)["problem"].clone();
    assert_eq!(problem["reason"], "checkpoint_missing", "{problem}");
    assert_eq!(problem["checkpoint_file"], mirror_arg.as_str(), "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains(&cps.display().to_string())
            && detail.contains("which does not exist")
            && detail.contains(&format!("{lost} of the {lost} checkpoints in the mirror")),
        "{detail}"
    );

    // The text form and stderr say the same; the mirror also comes from the server's variable.
    let mut command = scrubbed_command();
    command
        .env("TOOLGATE_AUDIT_CHECKPOINT_MIRROR", &mirror)
        .arg("--ledger")
        .arg(&env.ledger)
        .args(["audit", "verify", "--key-file", &key]);
    let out = run_to_end(command);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("audit verify: BROKEN: checkpoint file ")
            && stdout.contains("checkpoint_missing"),
        "{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("checkpoint_missing"),
        "{}",
        output_text(&out)
    );

    // Cutting the log's last record as well: the cut is caught against the mirror's checkpoint.
    cut_last_line(&env.audit_path());
    let out = audit(&env, &with_mirror);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let report = json_of(&out);
    assert_eq!(
        report["problem"]["reason"], "truncated_before_checkpoint",
        "{report}"
    );
    assert_eq!(
        report["checkpoint_mismatch"]["reason"], "checkpoint_missing",
        "{report}"
    );
}

#[test]
fn verify_counts_the_records_after_the_newest_checkpoint() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    session(&env, &key);
    let out = audit(&env, &["verify", "--key-file", &key]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("after the newest checkpoint"),
        "the shutdown checkpoint covers every record: {}",
        output_text(&out)
    );

    // Two operator records appended without the key: no checkpoint covers them.
    for args in [&["halt", "--reason", "uncovered"][..], &["resume"][..]] {
        let out = ledger_command(&env, args);
        assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    }
    let out = audit(&env, &["verify", "--key-file", &key]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("2 records after the newest checkpoint (not covered by any signature)"),
        "{}",
        output_text(&out)
    );
    let out = audit(&env, &["verify", "--key-file", &key, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let report = json_of(&out);
    assert_eq!(report["records"], 8, "{report}");
    assert_eq!(report["records_after_checkpoint"], 2, "{report}");
    // Without a key nothing is covered, and the count is not given.
    let report = json_of(&audit(&env, &["verify", "--format", "json"]));
    assert_eq!(report["records_after_checkpoint"], Value::Null, "{report}");
}

#[test]
fn verify_with_a_key_and_no_checkpoints_warns_and_exits_0() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    // A server run without the key writes no checkpoint.
    let mut server = env.start();
    assert_eq!(
        note_status(&server.write_note("req-nokey-01", "a")),
        "committed"
    );
    assert!(server.close().success(), "{}", server.stderr());

    let out = audit(&env, &["verify", "--key-file", &key]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("WARNING: a key was given but no checkpoint was found in")
            && stdout.contains("none of the 1 records is covered by a signature"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("toolgate-server: warning: no_checkpoints: a key was given"),
        "{stderr}"
    );

    let out = audit(&env, &["verify", "--key-file", &key, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let report = json_of(&out);
    assert_eq!(report["status"], "intact", "{report}");
    assert_eq!(report["warnings"][0]["kind"], "no_checkpoints", "{report}");

    // Without a key there is no such warning (the report says nothing was checked instead).
    let out = audit(&env, &["verify", "--format", "json"]);
    assert_eq!(
        json_of(&out)["warnings"],
        json!([]),
        "{}",
        output_text(&out)
    );
}

/// An operator command piped into a reader that closed early (`toolgate-server audit stats |
/// head -1`) exits 0 and says nothing on stderr; a broken chain still exits 1.
#[test]
fn a_report_into_a_closed_pipe_exits_quietly() {
    let env = TestEnv::new();
    let key = write_key(&env, "audit.key", b"an audit checkpoint key, 32+ bytes\n");
    session(&env, &key);
    let quiet = |args: &[&str]| {
        let mut command = scrubbed_command();
        command
            .arg("--policy")
            .arg(&env.policy)
            .arg("--ledger")
            .arg(&env.ledger)
            .args(args);
        let out = run_into_closed_pipe(command);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["audit", "stats"][..],
        &["audit", "stats", "--format", "json"],
        &["audit", "verify"],
        &["audit", "verify", "--format", "json"],
        &["contract", "lockfile"],
        &["halt", "--reason", "incident 4"],
        &["resume"],
        &["effects", "prune"],
    ] {
        assert_eq!(quiet(args), (Some(0), String::new()), "{args:?}");
    }
    // The commands ran: the halt and the resume are recorded.
    let methods: Vec<Value> = env
        .audit_records()
        .iter()
        .map(|r| r["method"].clone())
        .collect();
    assert!(
        methods.ends_with(&[
            json!("admin/halt"),
            json!("admin/resume"),
            json!("effects/prune")
        ]),
        "{methods:?}"
    );
    // The verdict does not depend on the reader: a broken chain exits 1 and says why.
    let text = std::fs::read_to_string(env.audit_path()).unwrap();
    std::fs::write(
        env.audit_path(),
        text.replacen("write_note", "write_notes", 1),
    )
    .unwrap();
    let (code, stderr) = quiet(&["audit", "verify"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("audit log is broken"), "{stderr}");
}

/// `audit stats --store` counts the database's chain, which the replicas write (their ledgers
/// keep no audit log of their own), and `audit export --store` into a closed pipe exits quietly.
#[cfg(feature = "postgres")]
#[test]
fn stats_with_a_store_count_the_database_chain() {
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database("audit_stats")
        .unwrap();
    let env = TestEnv::new();
    let mut command = env.command();
    command.env("TOOLGATE_STORE", &url);
    let mut server = common::Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    assert_eq!(
        note_status(&server.write_note("req-store-01", "a")),
        "committed"
    );
    assert_eq!(
        note_status(&server.write_note("req-store-01", "a")),
        "replay"
    );
    server.call("rm_rf", json!({"path": "/"}));
    assert!(server.close().success(), "{}", server.stderr());
    assert!(
        !env.audit_path().exists(),
        "with --store the ledger has no audit log"
    );

    let out = audit(&env, &["--store", &url, "stats", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let stats = json_of(&out);
    assert_eq!(stats["calls"], 3, "{stats}");
    assert_eq!(
        stats["totals"],
        json!({"committed": 1, "replay": 1, "deny": 1, "failure": 0})
    );
    // TOOLGATE_STORE applies as --store does.
    let mut command = scrubbed_command();
    command
        .env("TOOLGATE_STORE", &url)
        .arg("--ledger")
        .arg(&env.ledger)
        .args(["audit", "stats"]);
    let out = run_to_end(command);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("write_note"),
        "{}",
        output_text(&out)
    );

    let mut command = scrubbed_command();
    command.args(["--store", &url, "audit", "export"]);
    let out = run_into_closed_pipe(command);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned()
        ),
        (Some(0), String::new())
    );
}
