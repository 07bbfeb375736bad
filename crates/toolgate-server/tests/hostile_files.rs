//! Files that are not what they seem, through the real binary: a FIFO, a device, a symbolic link
//! or an oversized file in each place the server reads. Every case ends in a clear error or a
//! fail-closed refusal, promptly (no open ever blocks), the server keeps answering, and the audit
//! chain verifies afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use common::*;
use serde_json::{Value, json};

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

fn error_message(reply: &Value) -> String {
    reply["error"]["message"].as_str().unwrap_or("").to_owned()
}

/// Starts the server with `args` added and expects it to refuse to start, naming `needle`.
fn refuses_to_start(env: &TestEnv, args: &[&dyn AsRef<std::ffi::OsStr>], needle: &str) -> Output {
    let mut command = env.command();
    for arg in args {
        command.arg(arg);
    }
    let output = run_to_end(command);
    let text = output_text(&output);
    assert!(!output.status.success(), "started anyway: {text}");
    assert!(text.contains(needle), "expected {needle:?} in: {text}");
    output
}

/// A ledger with one committed note and a verifying chain, made by a server that has exited.
fn ledger_with_one_note(env: &TestEnv) {
    let mut server = env.start();
    assert_eq!(
        note_status(&server.write_note("req-before", "before")),
        "committed"
    );
    server.close();
}

#[test]
fn a_fifo_halt_file_reads_as_halted_without_blocking_and_resume_lifts_it() {
    let env = TestEnv::new();
    ledger_with_one_note(&env);
    let halt = env.ledger.join("halt.json");
    mkfifo(&halt);

    let mut server = env.start();
    let refused = server.write_note("req-during", "during");
    let message = error_message(&refused);
    assert!(
        message.contains("FIFO") && message.contains("halt.json"),
        "{refused}"
    );
    // Every other request keeps being answered.
    assert!(!server.list_tool_names().is_empty());
    assert!(!env.note_path("req-during").exists());

    // The operator's resume lifts it without blocking either.
    let mut command = scrubbed_command();
    command
        .arg("--policy")
        .arg(&env.policy)
        .arg("--ledger")
        .arg(&env.ledger)
        .arg("resume");
    let resumed = run_to_end(command);
    assert!(resumed.status.success(), "{}", output_text(&resumed));
    assert!(
        std::fs::symlink_metadata(&halt).is_err(),
        "the FIFO is gone"
    );
    assert_eq!(
        note_status(&server.write_note("req-during", "during")),
        "committed"
    );
    // Closing stdin ends the process (the runtime was never blocked).
    assert!(server.close().success());
    assert_verifies(&env.ledger);
}

#[test]
fn a_halt_file_that_is_a_link_reads_as_halted() {
    let env = TestEnv::new();
    ledger_with_one_note(&env);
    let outside = env.path("outside-halt.json");
    std::fs::write(
        &outside,
        br#"{"by":"nobody","reason":"not mine","since_ns":1}"#,
    )
    .unwrap();
    symlink(&outside, &env.ledger.join("halt.json"));
    let mut server = env.start();
    let refused = server.write_note("req-link-1", "x");
    let message = error_message(&refused);
    assert!(message.contains("symbolic link"), "{refused}");
    assert!(
        !message.contains("not mine"),
        "the link was followed: {refused}"
    );
    server.close();
    assert_verifies(&env.ledger);
}

#[test]
fn a_fifo_or_device_as_the_rights_file_refuses_calls_until_fixed() {
    for kind in ["fifo", "device"] {
        let env = TestEnv::new();
        let rights = env.path("rights.json");
        match kind {
            "fifo" => mkfifo(&rights),
            _ => symlink(Path::new("/dev/zero"), &rights),
        }
        let mut command = env.command();
        command
            .arg("--principal")
            .arg("alice")
            .arg("--rights")
            .arg(&rights);
        let mut server = Server::spawn(command, &env.path("stderr-rights.log"));
        server.discover();
        let refused = server.call("read_ledger", json!({}));
        assert!(refused.get("error").is_some(), "{kind}: {refused}");
        assert!(
            server.list_tool_names().is_empty(),
            "{kind}: no rights, no tools"
        );

        std::fs::remove_file(&rights).unwrap();
        std::fs::write(
            &rights,
            r#"{"version":1,"principals":{"alice":{"tools":["*"]}}}"#,
        )
        .unwrap();
        assert_eq!(
            note_status(&server.write_note("req-rights", "fixed")),
            "committed",
            "{kind}"
        );
        assert!(server.close().success());
        assert_verifies(&env.ledger);
        let reasons: Vec<Value> = audit_records(&env.audit_path())
            .iter()
            .map(|r| r["reason"].clone())
            .collect();
        assert!(
            reasons.contains(&json!("rights_unavailable")),
            "{kind}: {reasons:?}"
        );
    }
}

#[test]
fn a_policy_that_is_a_fifo_a_device_or_too_large_refuses_to_start_promptly() {
    let env = TestEnv::new();
    let fifo = env.path("fifo-policy.json");
    mkfifo(&fifo);
    let large = env.path("large-policy.json");
    std::fs::write(&large, vec![b' '; 5 << 20]).unwrap();
    for (policy, needle) in [
        (fifo.as_path(), "FIFO"),
        (Path::new("/dev/zero"), "character device"),
        (large.as_path(), "larger than the limit"),
    ] {
        let mut command = scrubbed_command();
        command
            .arg("--policy")
            .arg(policy)
            .arg("--ledger")
            .arg(&env.ledger);
        let output = run_to_end(command);
        let text = output_text(&output);
        assert!(!output.status.success(), "{text}");
        assert!(text.contains(needle), "{needle}: {text}");
        assert!(
            !env.ledger.exists(),
            "nothing is created before the policy loads"
        );
    }
    // A link to a good policy is followed: the operator chose the path.
    let link = env.path("linked-policy.json");
    symlink(&env.policy, &link);
    let mut command = scrubbed_command();
    command
        .arg("--policy")
        .arg(&link)
        .arg("--ledger")
        .arg(&env.ledger);
    let mut server = Server::spawn(command, &env.path("stderr-link.log"));
    server.discover();
    assert!(server.close().success());
}

#[test]
fn sighup_with_a_fifo_policy_is_refused_and_later_reloads_still_work() {
    let env = TestEnv::new();
    let mut server = env.start();
    std::fs::remove_file(&env.policy).unwrap();
    mkfifo(&env.policy);
    sighup(server.pid());
    let deadline = Instant::now() + TIMEOUT;
    let rejected = |env: &TestEnv| {
        audit_records(&env.audit_path())
            .iter()
            .filter(|r| r["method"] == "policy/reload" && r["outcome"] == "rejected")
            .count()
    };
    while rejected(&env) < 1 {
        assert!(Instant::now() < deadline, "{}", server.stderr());
        poll_pause();
    }
    // The log line naming the cause follows the audit record: wait for it too.
    while !server.stderr().contains("FIFO") {
        assert!(Instant::now() < deadline, "{}", server.stderr());
        poll_pause();
    }
    assert!(!server.list_tool_names().is_empty());

    // The next reload is not stuck behind the first.
    std::fs::remove_file(&env.policy).unwrap();
    std::fs::copy(POLICY, &env.policy).unwrap();
    sighup(server.pid());
    let reloaded = |env: &TestEnv| {
        audit_records(&env.audit_path())
            .iter()
            .any(|r| r["method"] == "policy/reload" && r["outcome"] == "reloaded")
    };
    while !reloaded(&env) {
        assert!(Instant::now() < deadline, "{}", server.stderr());
        poll_pause();
    }
    assert!(server.close().success());
    assert_verifies(&env.ledger);
}

#[test]
fn links_and_special_files_inside_the_ledger_refuse_start_and_touch_nothing_outside() {
    // audit.jsonl as a link to a file outside the ledger.
    let env = TestEnv::new();
    ledger_with_one_note(&env);
    let outside = env.path("outside.jsonl");
    std::fs::rename(env.audit_path(), &outside).unwrap();
    let before = std::fs::read(&outside).unwrap();
    symlink(&outside, &env.audit_path());
    refuses_to_start(&env, &[], "symbolic link");
    assert_eq!(
        std::fs::read(&outside).unwrap(),
        before,
        "nothing was appended"
    );
    std::fs::remove_file(env.audit_path()).unwrap();
    std::fs::rename(&outside, env.audit_path()).unwrap();
    assert_verifies(&env.ledger);

    // audit.jsonl as a FIFO.
    let env = TestEnv::new();
    std::fs::create_dir_all(&env.ledger).unwrap();
    mkfifo(&env.audit_path());
    refuses_to_start(&env, &[], "FIFO");

    // notes/ and effects/ as links to directories outside the ledger.
    for dir in ["notes", "effects"] {
        let env = TestEnv::new();
        ledger_with_one_note(&env);
        let outside = env.path("outside-dir");
        std::fs::rename(env.ledger.join(dir), &outside).unwrap();
        symlink(&outside, &env.ledger.join(dir));
        refuses_to_start(&env, &[], dir);
    }

    // The effect journal as a FIFO.
    let env = TestEnv::new();
    ledger_with_one_note(&env);
    let journal = env.ledger.join("effects/effects.journal");
    std::fs::remove_file(&journal).unwrap();
    mkfifo(&journal);
    refuses_to_start(&env, &[], "FIFO");

    // A note replaced by a link: the call fails clearly, the next one is served.
    let env = TestEnv::new();
    ledger_with_one_note(&env);
    let target = env.path("outside-note.json");
    std::fs::write(&target, br#"{"request_id":"req-link-2","text":"x"}"#).unwrap();
    symlink(&target, &env.note_path("req-link-2"));
    let mut server = env.start();
    let reply = server.write_note("req-link-2", "x");
    let text = format!("{reply}");
    assert!(
        result_of(&reply).get("isError") == Some(&Value::Bool(true))
            || reply.get("error").is_some(),
        "{reply}"
    );
    assert!(text.contains("symbolic link"), "{text}");
    assert_eq!(
        note_status(&server.write_note("req-next-3", "y")),
        "committed"
    );
    assert!(server.close().success());
    assert_verifies(&env.ledger);
}

#[test]
fn key_files_that_are_fifos_devices_or_too_large_are_refused() {
    let env = TestEnv::new();
    let fifo = env.path("key.fifo");
    mkfifo(&fifo);
    let large = env.path("key.large");
    std::fs::write(&large, vec![b'k'; 8192]).unwrap();
    for (key, needle) in [
        (fifo.as_path(), "FIFO"),
        (Path::new("/dev/zero"), "character device"),
        (large.as_path(), "larger than the limit"),
    ] {
        refuses_to_start(&env, &[&"--audit-key-file", &key], needle);
    }
}

#[test]
fn a_previous_lockfile_or_rights_file_that_is_special_or_too_large_is_refused() {
    let env = TestEnv::new();
    let fifo = env.path("previous.lock");
    mkfifo(&fifo);
    refuses_to_start(&env, &[&"--previous-lock", &fifo], "FIFO");
    let large = env.path("large.lock");
    std::fs::write(&large, vec![b' '; (16 << 20) + 1]).unwrap();
    refuses_to_start(&env, &[&"--previous-lock", &large], "larger than the limit");

    // A rights file over its cap refuses every call (fail closed) without reading it whole.
    let rights = env.path("rights.json");
    std::fs::write(&rights, vec![b' '; (4 << 20) + 1]).unwrap();
    let mut command = env.command();
    command
        .arg("--principal")
        .arg("alice")
        .arg("--rights")
        .arg(&rights);
    let mut server = Server::spawn(command, &env.path("stderr-large-rights.log"));
    server.discover();
    let refused = server.call("read_ledger", json!({}));
    assert!(refused.get("error").is_some(), "{refused}");
    assert!(server.close().success());
    assert_verifies(&env.ledger);
}

#[test]
fn checkpoint_files_that_are_fifos_never_block_the_server() {
    let env = TestEnv::new();
    let key = env.path("audit.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let mirror = env.path("mirror.fifo");
    mkfifo(&mirror);
    std::fs::create_dir_all(&env.ledger).unwrap();
    mkfifo(&env.ledger.join("audit.checkpoints.jsonl"));
    let mut command = env.command();
    command
        .arg("--audit-key-file")
        .arg(&key)
        .arg("--checkpoint-every")
        .arg("1")
        .arg("--checkpoint-mirror")
        .arg(&mirror);
    let mut server = Server::spawn(command, &env.path("stderr-checkpoints.log"));
    server.discover();
    // Each call would write a checkpoint: the write fails (and is retried later), the call is
    // answered, and the server keeps serving.
    for i in 0..3 {
        assert_eq!(
            note_status(&server.write_note(&format!("req-cp-{i:04}"), "x")),
            "committed"
        );
    }
    assert!(!server.list_tool_names().is_empty());
    // Shutdown reports the checkpoint it could not write, without hanging.
    server.close();
    assert!(
        server.stderr().contains("FIFO"),
        "the cause is named: {}",
        server.stderr()
    );
    // Verifying names the FIFO, promptly; once it is gone the chain verifies.
    let mut command = scrubbed_command();
    command
        .arg("--ledger")
        .arg(&env.ledger)
        .arg("audit")
        .arg("verify")
        .arg("--key-file")
        .arg(&key);
    let output = run_to_end(command);
    let text = output_text(&output);
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("FIFO"), "{text}");
    std::fs::remove_file(env.ledger.join("audit.checkpoints.jsonl")).unwrap();
    assert_verifies(&env.ledger);
}

#[test]
fn temporary_files_of_dead_writers_in_the_ledger_are_removed_at_start() {
    let env = TestEnv::new();
    ledger_with_one_note(&env);
    // A pid no process can have (above 4,194,304, the largest pid_max Linux allows), and this
    // test's own, alive.
    let dead = [
        ".audit.jsonl.torn.4999999.0.tmp",
        ".halt.json.4999999.1.tmp",
    ];
    let alive = format!(".halt.json.{}.2.tmp", std::process::id());
    for name in dead.iter().copied().chain([alive.as_str()]) {
        std::fs::write(env.ledger.join(name), b"partial").unwrap();
    }
    let mut server = env.start();
    for name in dead {
        assert!(!env.ledger.join(name).exists(), "{name} was left");
    }
    assert!(
        env.ledger.join(&alive).exists(),
        "a live writer's file is kept"
    );
    assert!(server.close().success());
    assert_verifies(&env.ledger);
}
