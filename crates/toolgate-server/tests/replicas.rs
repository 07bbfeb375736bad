//! Replicas on one PostgreSQL database (`--store`): real `toolgate-server` processes, each with
//! a ledger directory of its own (as on separate machines), sharing the exactly-once store and
//! the audit chain of one database of a real PostgreSQL cluster this test process starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Server, TestEnv, note_bytes, note_files, note_status, output_text};
use serde_json::{Value, json};
use toolgate_pgtest::PgCluster;

/// A fresh database of the process's shared cluster.
fn database(prefix: &str) -> String {
    PgCluster::shared()
        .unwrap()
        .create_database(prefix)
        .unwrap()
}

/// `toolgate-server --policy P --ledger L` of `env` with `TOOLGATE_STORE=url`.
fn command(env: &TestEnv, url: &str) -> Command {
    env.store_command(url)
}

fn stderr_path(env: &TestEnv) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    env.path(&format!(
        "replica-{}.stderr",
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Starts a replica on `url` and completes `server/discover`.
fn replica(env: &TestEnv, url: &str) -> Server {
    let mut server = Server::spawn(command(env, url), &stderr_path(env));
    server.discover();
    server
}

/// Runs an operator command of `env` against the store and returns its output.
fn operator(env: &TestEnv, url: &str, args: &[&str]) -> Output {
    common::run_to_end({
        let mut c = command(env, url);
        c.args(args);
        c
    })
}

/// The store's chain, exported in the file format and parsed.
fn exported_records(env: &TestEnv, url: &str) -> Vec<Value> {
    let output = operator(env, url, &["audit", "export"]);
    assert!(output.status.success(), "{}", output_text(&output));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Asserts `audit verify --store` passes, and that the exported copy verifies as a file too.
fn assert_store_verifies(env: &TestEnv, url: &str) {
    let output = operator(env, url, &["audit", "verify"]);
    assert!(output.status.success(), "{}", output_text(&output));
    let export = operator(env, url, &["audit", "export"]);
    let copy = env.path("exported-audit.jsonl");
    std::fs::write(&copy, &export.stdout).unwrap();
    let report = toolgate::audit::verify_file(&copy).unwrap();
    assert!(report.problem.is_none(), "{report}");
}

fn assert_seq_without_gaps(records: &[Value]) {
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record["seq"], json!(i as u64 + 1), "{record}");
    }
}

/// The 500 calls of replica `r`: the 250 shared ids (from a different starting point for each
/// replica, so that they meet on the same keys at different moments) and 250 of its own,
/// interleaved.
fn workload(r: usize) -> Vec<(String, String)> {
    (0..250)
        .flat_map(|i| {
            let shared = (i + r * 61) % 250;
            [
                (
                    format!("req-shared-{shared:04}"),
                    format!("shared note {shared}"),
                ),
                (
                    format!("req-r{r}-{i:04}"),
                    format!("note {i} of replica {r}"),
                ),
            ]
        })
        .collect()
}

#[test]
fn four_replicas_execute_each_key_once_and_keep_one_chain() {
    let url = database("replicas");
    let envs: Vec<TestEnv> = (0..4).map(|_| TestEnv::new()).collect();
    let mut servers: Vec<Server> = envs.iter().map(|env| replica(env, &url)).collect();
    let work: Vec<_> = (0..4).map(workload).collect();

    // Pipeline every call, round robin over the replicas, then collect the replies.
    let mut pending: Vec<Vec<(u64, String)>> = vec![Vec::new(); 4];
    for i in 0..500 {
        for ((server, calls), pending) in servers.iter_mut().zip(&work).zip(&mut pending) {
            let (id, text) = &calls[i];
            let rpc = server.send_call("write_note", json!({"request_id": id, "text": text}));
            pending.push((rpc, id.clone()));
        }
    }
    let mut statuses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (server, pending) in servers.iter_mut().zip(pending) {
        for (rpc, request_id) in pending {
            let reply = server.response(rpc);
            statuses
                .entry(request_id)
                .or_default()
                .push(note_status(&reply));
        }
    }
    for server in &mut servers {
        assert!(server.close().success(), "{}", server.stderr());
    }

    // One `committed` per key; every other call on it is a replay.
    assert_eq!(statuses.len(), 250 + 4 * 250);
    for (id, mut got) in statuses {
        got.sort();
        let expected: &[&str] = if id.starts_with("req-shared-") {
            &["committed", "replay", "replay", "replay"]
        } else {
            &["committed"]
        };
        assert_eq!(got, expected, "{id}");
    }

    // One effect per key: across the four ledgers, one note file per id, with its bytes.
    let mut notes: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for env in &envs {
        for path in note_files(&env.notes_dir()) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                notes.insert(name, bytes).is_none(),
                "{} twice",
                path.display()
            );
        }
    }
    assert_eq!(notes.len(), 1250);
    for calls in &work {
        for (id, text) in calls {
            let found = envs
                .iter()
                .map(|env| env.note_path(id))
                .find(|path| path.exists())
                .unwrap_or_else(|| panic!("no note for {id}"));
            assert_eq!(std::fs::read(found).unwrap(), note_bytes(id, text), "{id}");
        }
    }

    // One chain of exactly 2,000 records, seq 1..2000, that verifies in place and as a file.
    let records = exported_records(&envs[0], &url);
    assert_eq!(records.len(), 2000);
    assert_seq_without_gaps(&records);
    let outcomes = common::outcome_counts(&records, "write_note", "allow");
    assert_eq!(outcomes.get("committed"), Some(&1250), "{outcomes:?}");
    assert_eq!(outcomes.get("replay"), Some(&750), "{outcomes:?}");
    assert_store_verifies(&envs[0], &url);
}

/// SIGKILLs a replica at `point` during a write_note, restarts it on the same ledger and store,
/// retries, and returns the retry's status.
#[cfg(feature = "fault-injection")]
fn crash_then_retry(point: &str) -> String {
    let url = database("crash");
    let env = TestEnv::new();
    let other_env = TestEnv::new();
    let mut other = replica(&other_env, &url);
    let marker = env.path("crash.marker");
    let mut crashing = command(&env, &url);
    crashing
        .env("TOOLGATE_CRASH_POINT", point)
        .env("TOOLGATE_CRASH_MARKER", &marker);
    let mut server = Server::spawn(crashing, &stderr_path(&env));
    server.discover();
    server.send_call(
        "write_note",
        json!({"request_id": "req-crash-0001", "text": "across a crash"}),
    );
    server.wait_for_file_where(&marker, |bytes| bytes == point.as_bytes());
    server.kill();

    // The other replica keeps serving while one is down.
    assert_eq!(
        note_status(&other.write_note("req-other-0001", "meanwhile")),
        "committed"
    );

    let mut server = replica(&env, &url);
    let status = note_status(&server.write_note("req-crash-0001", "across a crash"));
    assert!(status == "committed" || status == "replay", "{status}");
    assert_eq!(
        note_status(&server.write_note("req-crash-0001", "across a crash")),
        "replay"
    );
    assert!(server.close().success());
    assert!(other.close().success());
    assert_eq!(
        note_files(&env.notes_dir()),
        [env.note_path("req-crash-0001")]
    );
    assert_eq!(
        std::fs::read(env.note_path("req-crash-0001")).unwrap(),
        note_bytes("req-crash-0001", "across a crash")
    );
    let records = exported_records(&env, &url);
    assert_seq_without_gaps(&records);
    assert_store_verifies(&env, &url);
    status
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_replica_killed_before_publishing_executes_once_after_restart() {
    // The note was never published: the retry takes the dead owner's key over and writes it.
    assert_eq!(crash_then_retry("commit.before_publish"), "committed");
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_replica_killed_after_publishing_executes_once_after_restart() {
    // The note is in place: the retry finds it and writes nothing new.
    let status = crash_then_retry("commit.after_publish");
    assert!(status == "committed" || status == "replay", "{status}");
}

/// Whether a reply is a refusal (a JSON-RPC error or an `isError` result), with its text.
fn refusal(reply: &Value) -> Option<String> {
    if let Some(error) = reply.get("error") {
        return Some(error.to_string());
    }
    let result = &reply["result"];
    (result["isError"] == json!(true)).then(|| result.to_string())
}

#[test]
fn a_database_crash_refuses_calls_while_down_and_loses_nothing_acknowledged() {
    // A cluster of its own: stopping it must not disturb the other tests.
    let cluster = PgCluster::start().unwrap();
    let url = cluster.create_database("crash").unwrap();
    let env = TestEnv::new();
    let mut server = replica(&env, &url);
    let mut acknowledged = BTreeSet::new();
    for i in 0..20 {
        let id = format!("req-before-{i:04}");
        assert_eq!(note_status(&server.write_note(&id, "before")), "committed");
        acknowledged.insert(id);
    }

    cluster.stop_immediate().unwrap();
    let reply = server.write_note("req-while-down", "refused");
    let text = refusal(&reply).unwrap_or_else(|| panic!("served while down: {reply}"));
    assert!(
        text.contains("PostgreSQL"),
        "the refusal names the cause: {text}"
    );
    assert!(
        !env.note_path("req-while-down").exists(),
        "nothing executed"
    );
    assert!(
        server.stderr().contains("PostgreSQL"),
        "the refusal is logged: {}",
        server.stderr()
    );
    assert!(!server.stderr().contains(toolgate_pgtest::PASSWORD));

    // Back without a restart of the replica.
    cluster.start_again().unwrap();
    assert_eq!(
        note_status(&server.write_note("req-while-down", "refused")),
        "committed"
    );
    for id in &acknowledged {
        assert_eq!(
            note_status(&server.write_note(id, "before")),
            "replay",
            "{id}"
        );
    }
    assert!(server.close().success());

    let files = note_files(&env.notes_dir());
    assert_eq!(files.len(), 21, "one effect per key: {files:?}");
    let records = exported_records(&env, &url);
    assert_seq_without_gaps(&records);
    let committed: BTreeSet<String> = records
        .iter()
        .filter(|r| r["outcome"] == "committed")
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(committed.is_superset(&acknowledged), "{committed:?}");
    assert_store_verifies(&env, &url);
}

/// Starts a server with `url` and returns its exit and stderr; it must not create its ledger.
fn refused_start(url: &str) -> (std::process::ExitStatus, String) {
    let env = TestEnv::new();
    let output = common::run_to_end(command(&env, url));
    assert!(!env.ledger.exists(), "a refused start writes nothing");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_stores_stop_the_server_with_one_line_naming_the_cause() {
    let cluster = PgCluster::shared().unwrap();

    let (status, stderr) = refused_start("postgres://postgres@127.0.0.1:notaport/db");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not a PostgreSQL URL"), "{stderr}");

    let url = cluster.create_database("password").unwrap();
    let wrong = url.replace(toolgate_pgtest::PASSWORD, "wrong-secret");
    let (status, stderr) = refused_start(&wrong);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot connect to PostgreSQL at postgres@127.0.0.1"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("wrong-secret"),
        "no password in messages: {stderr}"
    );

    // A database migrated by a newer build.
    let env = TestEnv::new();
    let mut server = replica(&env, &url);
    assert!(server.close().success());
    let db = url.rsplit('/').next().unwrap();
    cluster
        .psql(
            db,
            "UPDATE toolgate_schema SET version = 99 WHERE component = 'effects'",
        )
        .unwrap();
    let (status, stderr) = refused_start(&url);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("version 99, newer than this build knows"),
        "{stderr}"
    );
    assert!(!stderr.contains(toolgate_pgtest::PASSWORD), "{stderr}");
}

#[test]
fn a_halt_through_the_store_stops_every_replica_on_its_next_call() {
    let url = database("halt");
    let envs: Vec<TestEnv> = (0..3).map(|_| TestEnv::new()).collect();
    let mut a = replica(&envs[0], &url);
    let mut b = replica(&envs[1], &url);
    assert_eq!(
        note_status(&a.write_note("req-halt-0001", "before")),
        "committed"
    );

    // The operator halts from a third machine's ledger: only the database is shared.
    let output = operator(&envs[2], &url, &["halt", "--reason", "incident 42"]);
    assert!(output.status.success(), "{}", output_text(&output));
    for server in [&mut a, &mut b] {
        let reply = server.write_note("req-halt-0002", "during");
        let error = reply["error"].to_string();
        assert!(error.contains("incident 42"), "{reply}");
    }
    assert!(!envs[0].note_path("req-halt-0002").exists());
    assert!(!envs[1].note_path("req-halt-0002").exists());
    // read_ledger is exempt from the kill switch in the shipped policy.
    assert!(a.call("read_ledger", json!({})).get("result").is_some());

    let output = operator(&envs[2], &url, &["resume"]);
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(output_text(&output).contains("incident 42"));
    assert_eq!(
        note_status(&b.write_note("req-halt-0002", "during")),
        "committed"
    );
    assert!(a.close().success());
    assert!(b.close().success());

    let records = exported_records(&envs[2], &url);
    assert_seq_without_gaps(&records);
    let methods: Vec<&str> = records
        .iter()
        .map(|r| r["method"].as_str().unwrap_or_default())
        .collect();
    assert!(methods.contains(&"admin/halt"), "{methods:?}");
    assert!(methods.contains(&"admin/resume"), "{methods:?}");
    assert_store_verifies(&envs[2], &url);
}

/// Writes `policy` into every env's policy file (each replica reads its own copy, as on its own
/// machine).
fn with_policy(envs: &[TestEnv], policy: &Value) {
    for env in envs {
        std::fs::write(&env.policy, policy.to_string()).unwrap();
    }
}

/// The shipped policy plus `extra` top-level sections.
fn policy_with(extra: Value) -> Value {
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(TestEnv::new().policy).unwrap()).unwrap();
    for (key, value) in extra.as_object().unwrap() {
        policy[key] = value.clone();
    }
    policy
}

#[test]
fn a_rate_limit_counts_the_calls_of_every_replica_together() {
    let url = database("rates");
    let envs: Vec<TestEnv> = (0..3).map(|_| TestEnv::new()).collect();
    // 5 calls, then one more per minute (across all replicas).
    with_policy(
        &envs,
        &policy_with(json!({
            "rate_limits": {"tools": {"read_ledger": {"burst": 5, "per_minute": 1}}}
        })),
    );
    let mut replicas: Vec<Server> = envs.iter().map(|env| replica(env, &url)).collect();
    let started = std::time::Instant::now();
    let mut admitted = 0;
    let mut limited = 0;
    for round in 0..5 {
        for server in &mut replicas {
            let reply = server.call("read_ledger", json!({}));
            match refusal(&reply) {
                None => admitted += 1,
                Some(text) => {
                    assert!(text.contains("rate_limited"), "round {round}: {reply}");
                    limited += 1;
                }
            }
        }
    }
    // One token more per whole minute the calls took (none on any sane machine).
    let refilled = usize::try_from(started.elapsed().as_secs() / 60).unwrap();
    assert!(
        (5..=5 + refilled).contains(&admitted),
        "admitted {admitted}, refused {limited}"
    );
    assert_eq!(admitted + limited, 15);
    for mut server in replicas {
        assert!(server.close().success());
    }
    let records = exported_records(&envs[0], &url);
    let refused = records
        .iter()
        .filter(|r| r["name"] == "read_ledger" && r["decision"] == "deny")
        .count();
    assert_eq!(refused, limited, "every refusal is audited");
    assert_store_verifies(&envs[0], &url);
}

#[test]
fn a_preview_from_one_replica_is_confirmed_once_on_another() {
    let url = database("confirm");
    let envs: Vec<TestEnv> = (0..3).map(|_| TestEnv::new()).collect();
    let mut policy = policy_with(json!({}));
    policy["allow"] = json!(["write_note", "read_ledger", "rm_rf"]);
    policy["deny"] = json!([]);
    policy["effects"]["rm_rf"] = json!("delete");
    with_policy(&envs, &policy);
    let target = envs[0].path("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("a.txt"), b"alpha").unwrap();
    let path = target.display().to_string();
    let (mut a, mut b, mut c) = (
        replica(&envs[0], &url),
        replica(&envs[1], &url),
        replica(&envs[2], &url),
    );
    let preview = |server: &mut Server| -> (Value, Value) {
        let reply = server.call("rm_rf", json!({"path": path}));
        let preview = common::result_of(&reply)["structuredContent"].clone();
        assert_eq!(preview["status"], "preview", "{reply}");
        (
            preview["confirm_token"].clone(),
            preview["confirm_summary"].clone(),
        )
    };
    let confirm = |server: &mut Server, (token, summary): &(Value, Value)| {
        server.call(
            "confirm_action",
            json!({"confirm_token": token, "confirm_summary": summary}),
        )
    };

    // Issued by a, confirmed by b: the action runs there (the reference rm_rf is a decoy whose
    // handler answers that it deletes nothing).
    let ran = |reply: &Value| common::first_text(reply).contains("decoy");
    let first = preview(&mut a);
    let done = confirm(&mut b, &first);
    assert!(ran(&done), "{done}");
    // Used across every replica, the issuing one included.
    for server in [&mut c, &mut a, &mut b] {
        let again = confirm(server, &first);
        assert!(
            refusal(&again).is_some_and(|text| text.contains("token_used")),
            "{again}"
        );
    }

    // Issued by b, rejected by c: confirming it on a is refused as rejected.
    let second = preview(&mut b);
    let rejected = c.call("reject_action", json!({"confirm_token": second.0}));
    assert!(refusal(&rejected).is_none(), "{rejected}");
    let late = confirm(&mut a, &second);
    assert!(
        refusal(&late).is_some_and(|text| text.contains("token_rejected")),
        "{late}"
    );

    // Many replicas confirming one token at once: exactly one runs it.
    let third = preview(&mut c);
    let ids: Vec<u64> = [&mut a, &mut b, &mut c]
        .into_iter()
        .map(|server| {
            server.send_call(
                "confirm_action",
                json!({"confirm_token": third.0, "confirm_summary": third.1}),
            )
        })
        .collect();
    let replies: Vec<Value> = [&mut a, &mut b, &mut c]
        .into_iter()
        .zip(ids)
        .map(|(server, id)| server.response(id))
        .collect();
    assert_eq!(replies.iter().filter(|r| ran(r)).count(), 1, "{replies:?}");
    let used = replies
        .iter()
        .filter(|r| refusal(r).is_some_and(|text| text.contains("token_used")))
        .count();
    assert_eq!(used, 2, "{replies:?}");

    for server in [&mut a, &mut b, &mut c] {
        assert!(server.close().success());
    }
    let records = exported_records(&envs[0], &url);
    let confirmed = records
        .iter()
        .filter(|r| r["name"] == "rm_rf" && r["reason"] == "confirmed")
        .count();
    assert_eq!(confirmed, 2, "one run per confirmed token");
    assert_store_verifies(&envs[0], &url);
}

#[test]
fn rights_set_through_the_store_apply_to_every_replica_on_its_next_call() {
    let url = database("rights");
    let envs: Vec<TestEnv> = (0..3).map(|_| TestEnv::new()).collect();
    let mut a = replica(&envs[0], &url);
    let mut b = replica(&envs[1], &url);
    // No rights set: the policy decides.
    assert_eq!(
        note_status(&a.write_note("req-rights-0001", "one")),
        "committed"
    );

    // The operator revokes write_note of `local` (the stdio principal) from a third machine.
    let file = envs[2].path("rights.json");
    let rights = |text: &str| {
        std::fs::write(&file, text).unwrap();
        operator(&envs[2], &url, &["rights", "set", file.to_str().unwrap()])
    };
    let output = rights(r#"{"version":1,"principals":{"local":{"tools":["read_ledger"]}}}"#);
    assert!(output.status.success(), "{}", output_text(&output));
    for server in [&mut a, &mut b] {
        let reply = server.write_note("req-rights-0002", "two");
        assert_eq!(
            reply["error"]["code"],
            json!(common::INVALID_PARAMS),
            "{reply}"
        );
        assert!(!server.list_tool_names().contains(&"write_note".to_owned()));
        assert!(
            server
                .call("read_ledger", json!({}))
                .get("result")
                .is_some()
        );
    }
    assert!(!envs[0].note_path("req-rights-0002").exists());
    let shown = operator(&envs[2], &url, &["rights", "show"]);
    assert!(
        output_text(&shown).contains("read_ledger"),
        "{}",
        output_text(&shown)
    );

    // An invalid file changes nothing and says why, naming the file.
    let output = rights(r#"{"version":1,"principals":{"local":{"tool":["write_note"]}}}"#);
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("rights.json"),
        "{}",
        output_text(&output)
    );
    let reply = a.write_note("req-rights-0002", "two");
    assert_eq!(
        reply["error"]["code"],
        json!(common::INVALID_PARAMS),
        "{reply}"
    );

    // Cleared: the policy decides again, on every replica.
    let output = operator(&envs[2], &url, &["rights", "clear"]);
    assert!(output.status.success(), "{}", output_text(&output));
    assert_eq!(
        note_status(&b.write_note("req-rights-0002", "two")),
        "committed"
    );
    assert!(a.close().success());
    assert!(b.close().success());

    // Without a store the rights are a file: the commands say so.
    let output = common::run_to_end({
        let mut command = envs[2].command();
        command.args(["rights", "show"]);
        command
    });
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("--rights"),
        "{}",
        output_text(&output)
    );
    // A rights file beside a store would be a second truth: refused at start.
    let env = TestEnv::new();
    let mut start = command(&env, &url);
    start.arg("--rights").arg(&file);
    let output = common::run_to_end(start);
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("rights set"),
        "{}",
        output_text(&output)
    );
    assert!(!env.ledger.exists(), "a refused start writes nothing");

    let records = exported_records(&envs[2], &url);
    let changes: Vec<&str> = records
        .iter()
        .filter(|r| r["method"] == "admin/rights")
        .map(|r| r["reason"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        changes.len(),
        2,
        "set and clear, not the refused file: {changes:?}"
    );
    assert!(changes[0].starts_with("rights set: sha256:"), "{changes:?}");
    assert_store_verifies(&envs[2], &url);
}

#[test]
fn replicas_sign_checkpoints_of_the_shared_chain_and_verify_catches_a_cut() {
    let cluster = PgCluster::shared().unwrap();
    let url = database("signed");
    let db = url.rsplit('/').next().unwrap().to_owned();
    let envs: Vec<TestEnv> = (0..3).map(|_| TestEnv::new()).collect();
    let key = envs[2].path("audit.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let signed = |env: &TestEnv| {
        let mut command = command(env, &url);
        command
            .arg("--audit-key-file")
            .arg(&key)
            .args(["--checkpoint-every", "4"]);
        let mut server = Server::spawn(command, &stderr_path(env));
        server.discover();
        server
    };
    let (mut a, mut b) = (signed(&envs[0]), signed(&envs[1]));
    for i in 0..5 {
        for (server, name) in [(&mut a, "a"), (&mut b, "b")] {
            let id = format!("req-signed-{name}-{i:04}");
            assert_eq!(note_status(&server.write_note(&id, "signed")), "committed");
        }
    }
    // A clean shutdown signs the head too.
    assert!(a.close().success());
    assert!(b.close().success());

    let verify = |extra: &[&str]| {
        let mut args = vec!["audit", "verify", "--key-file", key.to_str().unwrap()];
        args.extend_from_slice(extra);
        operator(&envs[2], &url, &args)
    };
    let output = verify(&["--format", "json"]);
    assert!(output.status.success(), "{}", output_text(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["records"], json!(10), "{report}");
    assert!(
        report["checkpoints_verified"].as_u64().unwrap() >= 3,
        "{report}"
    );
    assert_eq!(report["records_after_checkpoint"], json!(0), "{report}");

    // Someone with write access to the database cuts the chain and moves its head back with it:
    // a well-formed shorter chain that only the signed checkpoints expose.
    cluster
        .psql(
            &db,
            "DELETE FROM toolgate_audit WHERE seq > 6;
             UPDATE toolgate_audit_head SET seq = 6,
                 sha256 = (SELECT sha256 FROM toolgate_audit WHERE seq = 6);",
        )
        .unwrap();
    let unsigned = operator(&envs[2], &url, &["audit", "verify"]);
    assert!(unsigned.status.success(), "{}", output_text(&unsigned));
    let output = verify(&[]);
    assert_eq!(output.status.code(), Some(1), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("cut from the end"),
        "{}",
        output_text(&output)
    );

    // A mirror file is an option of the ledger's log, refused with a store.
    let mirror = envs[2].path("mirror.jsonl");
    let output = verify(&["--checkpoint-mirror", mirror.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
}

/// Whether `reply` refused the call (hidden by Cedar's listing or refused by its decision).
fn refused(reply: &Value) -> bool {
    refusal(reply).is_some()
}

#[test]
fn cedar_entities_set_through_the_store_decide_every_replicas_next_call() {
    let cluster = PgCluster::shared().unwrap();
    let url = database("entities");
    let db = url.rsplit('/').next().unwrap().to_owned();
    let envs: Vec<TestEnv> = (0..3).map(|_| TestEnv::new()).collect();
    // Only roles let anyone read or write; the stdio principal `local` has none of its own.
    let cedar = r#"
@id("everyone-lists")
permit(principal, action == Toolgate::Action::"tools/list", resource);

@id("readers-read")
permit(principal in Toolgate::Role::"reader", action == Toolgate::Action::"read_ledger", resource);

@id("writers-write")
permit(principal in Toolgate::Role::"writer", action == Toolgate::Action::"write_note", resource);
"#;
    with_policy(&envs, &policy_with(json!({"cedar": "roles.cedar"})));
    for env in &envs {
        std::fs::write(env.path("roles.cedar"), cedar).unwrap();
    }
    let mut a = replica(&envs[0], &url);
    let mut b = replica(&envs[1], &url);
    // No entities set: `local` has no role, Cedar permits nothing.
    assert!(refused(&a.write_note("req-roles-0001", "one")));
    assert!(refused(&b.call("read_ledger", json!({}))));

    // The operator gives `local` both roles from a third machine.
    let file = envs[2].path("entities.json");
    let set = |env: &TestEnv, text: &str| {
        std::fs::write(&file, text).unwrap();
        operator(env, &url, &["entities", "set", file.to_str().unwrap()])
    };
    let output = set(
        &envs[2],
        r#"{"version":1,"principals":{"local":{"roles":["reader","writer"]}}}"#,
    );
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("applies to every replica's next call"),
        "{}",
        output_text(&output)
    );
    assert_eq!(
        note_status(&a.write_note("req-roles-0001", "one")),
        "committed"
    );
    assert!(b.call("read_ledger", json!({})).get("result").is_some());
    let record = exported_records(&envs[2], &url)
        .into_iter()
        .rev()
        .find(|r| r["method"] == "tools/call" && r["name"] == "write_note")
        .unwrap();
    assert_eq!(
        record["cedar_policies"],
        json!(["writers-write"]),
        "{record}"
    );

    // Writing taken away through the database as replica a's machine sees it: b's next call
    // is refused, reading still works on both.
    let output = set(
        &envs[0],
        r#"{"version":1,"principals":{"local":{"roles":["reader"]}}}"#,
    );
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(refused(&b.write_note("req-roles-0002", "two")));
    assert!(!envs[1].note_path("req-roles-0002").exists());
    for server in [&mut a, &mut b] {
        assert!(
            server
                .call("read_ledger", json!({}))
                .get("result")
                .is_some()
        );
    }
    let shown = operator(&envs[2], &url, &["entities", "show"]);
    assert!(
        output_text(&shown).contains(r#""roles":["reader"]"#),
        "{}",
        output_text(&shown)
    );

    // An invalid file is refused, naming the file and the problem; nothing changes.
    let output = set(
        &envs[2],
        r#"{"version":1,"principals":{"local":{"groups":["writer"]}}}"#,
    );
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    let text = output_text(&output);
    assert!(
        text.contains("entities.json") && text.contains("unknown field `groups`"),
        "{text}"
    );
    assert!(refused(&a.write_note("req-roles-0002", "two")));
    assert!(a.call("read_ledger", json!({})).get("result").is_some());

    // The row gone (deleted by hand): every call Cedar decides is refused, fail closed, and the
    // log names the fix; setting the entities again restores them.
    cluster.psql(&db, "DELETE FROM toolgate_entities").unwrap();
    assert!(refused(&a.call("read_ledger", json!({}))));
    assert!(refused(&b.call("read_ledger", json!({}))));
    assert!(a.stderr().contains("entities set"), "{}", a.stderr());
    let output = set(
        &envs[2],
        r#"{"version":1,"principals":{"local":{"roles":["reader","writer"]}}}"#,
    );
    assert!(output.status.success(), "{}", output_text(&output));
    assert_eq!(
        note_status(&b.write_note("req-roles-0003", "three")),
        "committed"
    );

    // Cleared: `local` has only what its credential carries (nothing), on every replica.
    let output = operator(&envs[2], &url, &["entities", "clear"]);
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(refused(&a.call("read_ledger", json!({}))));
    let shown = operator(&envs[2], &url, &["entities", "show"]);
    assert!(
        output_text(&shown).contains("no entities are set"),
        "{}",
        output_text(&shown)
    );
    assert!(a.close().success());
    assert!(b.close().success());

    // An entities file beside a store would be a second truth: refused at start, nothing
    // written.
    let env = TestEnv::new();
    let mut start = command(&env, &url);
    start.arg("--entities").arg(&file);
    let output = common::run_to_end(start);
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("entities set"),
        "{}",
        output_text(&output)
    );
    assert!(!env.ledger.exists(), "a refused start writes nothing");
    // Without a store the entities are a file: the commands say so.
    let output = common::run_to_end({
        let mut command = envs[2].command();
        command.args(["entities", "show"]);
        command
    });
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("--entities"),
        "{}",
        output_text(&output)
    );

    let changes: Vec<String> = exported_records(&envs[2], &url)
        .iter()
        .filter(|r| r["method"] == "admin/entities")
        .map(|r| r["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        changes.len(),
        4,
        "three sets and a clear, not the refused file: {changes:?}"
    );
    assert!(
        changes[0].starts_with("entities set: sha256:"),
        "{changes:?}"
    );
    assert_store_verifies(&envs[2], &url);
}
