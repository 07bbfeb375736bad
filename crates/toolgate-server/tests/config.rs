//! Configuration: a bad policy stops the server before anything is written, with one line on
//! stderr naming the problem and the file; POLICY_PATH and LEDGER_DIR apply when the flags are absent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{TestEnv, note_bytes, note_status, run_to_end, scrubbed_command};

/// Starts the stdio server on `policy` and expects it to refuse to start.
fn assert_refuses_policy(env: &TestEnv, policy: &Path, needles: &[&str]) {
    let mut command = scrubbed_command();
    command
        .arg("--policy")
        .arg(policy)
        .arg("--ledger")
        .arg(&env.ledger);
    let output = run_to_end(command);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the server started with a bad policy {}: {stderr}",
        policy.display()
    );
    assert!(output.stdout.is_empty(), "stdout: {:?}", output.stdout);
    let content = stderr.trim();
    assert!(!content.is_empty(), "no reason on stderr");
    assert_eq!(
        content.lines().count(),
        1,
        "the reason must be exactly one line: {stderr:?}"
    );
    // Whatever is wrong with it, the reason names the file to fix.
    let file = policy.display().to_string();
    for needle in needles.iter().copied().chain([file.as_str()]) {
        assert!(
            content.contains(needle),
            "{needle:?} not named in: {content}"
        );
    }
    assert!(
        !env.ledger.exists(),
        "the ledger directory was created despite the bad policy"
    );
}

fn write_policy(env: &TestEnv, name: &str, text: &str) -> std::path::PathBuf {
    let path = env.path(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_unknown_policy_key_stops_the_server() {
    let env = TestEnv::new();
    let policy = write_policy(
        &env,
        "typo.json",
        r#"{"version":1,"alow":["write_note","read_ledger"],"deny":["rm_rf"]}"#,
    );
    assert_refuses_policy(&env, &policy, &["alow", "allow"]);
    let nested = write_policy(
        &env,
        "nested-typo.json",
        r#"{"version":1,"allow":["write_note"],"arg_rules":{"write_note":{"request_id":{"minlen":8}}}}"#,
    );
    assert_refuses_policy(&env, &nested, &["minlen", "min_len"]);
}

#[test]
fn a_policy_that_is_not_json_stops_the_server() {
    let env = TestEnv::new();
    let policy = write_policy(&env, "bad.json", "{\"version\": 1, \"allow\": [\n");
    assert_refuses_policy(&env, &policy, &["policy", "line"]);
}

#[test]
fn an_unsupported_policy_version_stops_the_server() {
    let env = TestEnv::new();
    let policy = write_policy(
        &env,
        "v2.json",
        r#"{"version":2,"allow":["write_note","read_ledger"],"deny":["rm_rf"]}"#,
    );
    assert_refuses_policy(&env, &policy, &["version", "2"]);
}

#[test]
fn a_missing_policy_file_stops_the_server() {
    let env = TestEnv::new();
    let policy = env.path("does-not-exist.json");
    let shown = policy.display().to_string();
    assert_refuses_policy(&env, &policy, &[shown.as_str()]);
}

#[test]
fn policy_path_and_ledger_dir_apply_without_flags() {
    let env = TestEnv::new();
    // An empty working directory: the defaults ./policy.json and ./.ledger cannot be what works.
    let cwd = env.path("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let mut command = scrubbed_command();
    command
        .current_dir(&cwd)
        .env("POLICY_PATH", &env.policy)
        .env("LEDGER_DIR", &env.ledger);
    let mut server = common::Server::spawn(command, &env.path("stderr.log"));
    server.discover();
    assert!(!server.list_tool_names().contains(&"rm_rf".to_owned()));
    assert_eq!(
        note_status(&server.write_note("req-env-0001", "via env")),
        "committed"
    );
    assert!(server.close().success());
    assert_eq!(
        std::fs::read(env.note_path("req-env-0001")).unwrap(),
        note_bytes("req-env-0001", "via env")
    );
    assert_eq!(env.audit_records().len(), 1);
    assert!(!cwd.join(".ledger").exists());
    assert_eq!(
        std::fs::read_dir(&cwd).unwrap().count(),
        0,
        "cwd must stay empty"
    );

    // A flag wins over its variable.
    let other = env.path("flag-ledger");
    let mut command = scrubbed_command();
    command
        .current_dir(&cwd)
        .env("POLICY_PATH", env.path("no-such-policy.json"))
        .env("LEDGER_DIR", &env.ledger)
        .arg("--policy")
        .arg(&env.policy)
        .arg("--ledger")
        .arg(&other);
    let mut server = common::Server::spawn(command, &env.path("stderr2.log"));
    server.discover();
    assert_eq!(
        note_status(&server.write_note("req-flag-0001", "via flag")),
        "committed"
    );
    assert!(server.close().success());
    assert!(common::note_files(&other.join("notes")).len() == 1);
    assert_eq!(
        env.note_files().len(),
        1,
        "the env ledger must be untouched"
    );
}
