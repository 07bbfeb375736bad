//! Crash matrix: a real process is SIGKILLed at each effect crash point, then the store is reopened
//! and the call retried: never two executions of an unsafe effect, never a lost completed result.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "fault-injection")]

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};
use toolgate_commit::FaultHook;
use toolgate_commit::{
    Begin, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStore, Scope,
};

const CHILD_ENV: &str = "TOOLGATE_EFFECT_CRASH_CHILD";
const TIMEOUT: Duration = Duration::from_secs(60);

fn req() -> EffectRequest {
    EffectRequest {
        scope: Scope {
            principal: "alice".into(),
            tool: "send_mail".into(),
        },
        key: "mail-7".into(),
        fingerprint: Sha256Digest::of(b"to=bob"),
    }
}

fn result() -> Value {
    json!({"message_id": "<m7@example>", "queued": true})
}

/// The records a `compact` child writes before compacting: `done-<i>` completed, `failed`
/// (retryable, then completed), `indeterminate` (an unsafe ticket dropped).
const COMPACT_CHILD_KEYS: usize = 5;

fn keyed(key: &str) -> EffectRequest {
    EffectRequest {
        key: key.into(),
        ..req()
    }
}

/// Child role: stop forever at `point` after writing `marker`. `mode` is `unsafe` or `idempotent`
/// (one begin+complete of that kind; the effect appends to `effects`) or `compact` (a few records,
/// then `compact`).
fn run_child(spec: &str) {
    let mut parts = spec.splitn(4, '|');
    let (mode, point, dir, control) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
        PathBuf::from(parts.next().unwrap()),
        PathBuf::from(parts.next().unwrap()),
    );
    let marker = control.join("marker");
    let stop_at = point.clone();
    let hook: FaultHook = Arc::new(move |reached| {
        if reached == stop_at {
            fs::write(&marker, reached).unwrap();
            loop {
                thread::sleep(Duration::from_secs(1));
            }
        }
    });
    let store = EffectStore::open(EffectConfig::new(&dir).fault_hook(hook)).unwrap();
    let kind = match mode.as_str() {
        "unsafe" => EffectKind::Unsafe,
        "idempotent" => EffectKind::Idempotent,
        "compact" => {
            for i in 0..COMPACT_CHILD_KEYS {
                let Begin::Execute(t) = store
                    .begin(&keyed(&format!("done-{i}")), EffectKind::Unsafe)
                    .unwrap()
                else {
                    panic!("expected Execute")
                };
                store.complete(t, &json!(i)).unwrap();
            }
            let Begin::Execute(t) = store
                .begin(&keyed("failed"), EffectKind::Idempotent)
                .unwrap()
            else {
                panic!("expected Execute")
            };
            store.fail(t, "503", true).unwrap();
            let Begin::Execute(t) = store
                .begin(&keyed("failed"), EffectKind::Idempotent)
                .unwrap()
            else {
                panic!("expected Execute")
            };
            store.complete(t, &json!("second try")).unwrap();
            let Begin::Execute(t) = store
                .begin(&keyed("indeterminate"), EffectKind::Unsafe)
                .unwrap()
            else {
                panic!("expected Execute")
            };
            drop(t);
            store.compact().unwrap();
            panic!("the child was not stopped at {point}");
        }
        other => panic!("unknown child mode {other}"),
    };
    if let Begin::Execute(ticket) = store.begin(&req(), kind).unwrap() {
        let mut effects = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(control.join("effects"))
            .unwrap();
        writeln!(effects, "executed").unwrap();
        effects.sync_all().unwrap();
        store.complete(ticket, &result()).unwrap();
    }
}

fn executions(control: &Path) -> usize {
    fs::read_to_string(control.join("effects"))
        .unwrap_or_default()
        .lines()
        .count()
}

/// Runs a child (as the test `test`) that is killed at `point`; returns (store dir, control dir,
/// tempdir guard).
fn crash_at(test: &str, mode: &str, point: &str) -> (PathBuf, PathBuf, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("effects");
    let control = tmp.path().join("control");
    fs::create_dir(&control).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test])
        .env(
            CHILD_ENV,
            format!("{mode}|{point}|{}|{}", dir.display(), control.display()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while !control.join("marker").exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("child exited before reaching {point}: {status}");
        }
        assert!(Instant::now() < deadline, "child never reached {point}");
        thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    (dir, control, tmp)
}

#[test]
fn kill_at_every_crash_point() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        run_child(&spec);
        return;
    }
    for (point, executed_before) in [
        ("effect.after_in_progress", 0),
        ("effect.before_complete", 1),
    ] {
        let (dir, control, _tmp) = crash_at("kill_at_every_crash_point", "unsafe", point);
        assert_eq!(executions(&control), executed_before, "{point}");
        let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
        // Unsafe: the effect may or may not have happened; never re-run automatically.
        match store.begin(&req(), EffectKind::Unsafe) {
            Err(EffectError::Indeterminate { .. }) => {}
            other => panic!("{point}: expected Indeterminate, got {other:?}"),
        }
        assert_eq!(executions(&control), executed_before);
        // Idempotent: taken over and executed once more.
        match store.begin(&req(), EffectKind::Idempotent).unwrap() {
            Begin::Execute(ticket) => store.complete(ticket, &result()).unwrap(),
            other => panic!("{point}: expected Execute, got {other:?}"),
        }
        let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
        assert!(matches!(
            store.begin(&req(), EffectKind::Unsafe).unwrap(),
            Begin::Replay(_)
        ));
    }

    let (dir, control, _tmp) = crash_at(
        "kill_at_every_crash_point",
        "unsafe",
        "effect.after_complete",
    );
    assert_eq!(executions(&control), 1);
    let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
    for kind in [EffectKind::Unsafe, EffectKind::Idempotent] {
        match store.begin(&req(), kind).unwrap() {
            Begin::Replay(v) => assert_eq!(canonical_value(&v), canonical_value(&result())),
            other => panic!("after_complete: expected Replay, got {other:?}"),
        }
    }
    assert_eq!(executions(&control), 1);
}

/// The latest record of `req()` in the journal, read from the file (not through a store).
fn journal_record(dir: &Path) -> Option<Value> {
    let name =
        Sha256Digest::of_json(&json!({"key": "mail-7", "principal": "alice", "tool": "send_mail"}))
            .to_hex();
    let bytes = fs::read(dir.join("effects.journal")).unwrap();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let mut latest = None;
    for line in bytes[..end]
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let v: Value = serde_json::from_slice(line).unwrap();
        if v["name"] == name.as_str() {
            latest = Some(v["record"].clone()).filter(|r| !r.is_null());
        }
    }
    latest
}

#[test]
fn kill_after_a_lazily_written_idempotent_begin() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        run_child(&spec);
        return;
    }
    // The in_progress line of an idempotent begin is written but not fdatasynced when Execute is
    // returned; SIGKILL does not lose written data, so the record is there after the restart.
    let (dir, control, _tmp) = crash_at(
        "kill_after_a_lazily_written_idempotent_begin",
        "idempotent",
        "effect.after_in_progress",
    );
    assert_eq!(executions(&control), 0);
    let record = journal_record(&dir).expect("the in_progress line survived the kill");
    assert_eq!(record["state"], "in_progress");
    let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
    // The owner is dead: evidence for an unsafe caller, taken over by an idempotent one.
    assert!(matches!(
        store.begin(&req(), EffectKind::Unsafe),
        Err(EffectError::Indeterminate { .. })
    ));
    match store.begin(&req(), EffectKind::Idempotent).unwrap() {
        Begin::Execute(ticket) => {
            assert_ne!(
                journal_record(&dir).unwrap()["owner"],
                record["owner"],
                "taken over by a new owner"
            );
            store.complete(ticket, &result()).unwrap();
        }
        other => panic!("expected Execute (takeover), got {other:?}"),
    }
    let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
    assert!(matches!(
        store.begin(&req(), EffectKind::Idempotent).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn kill_during_compaction() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        run_child(&spec);
        return;
    }
    let temp_name = ".effects.journal.compact.tmp";
    for (point, temp_left, lines_left) in [
        // The new journal is complete under its temporary name: the old one is still in use.
        (
            "effect.compact_before_rename",
            true,
            COMPACT_CHILD_KEYS * 2 + 5,
        ),
        // The new journal replaced the old one (its directory entry maybe not durable yet).
        ("effect.compact_after_rename", false, COMPACT_CHILD_KEYS + 2),
    ] {
        let (dir, _control, _tmp) = crash_at("kill_during_compaction", "compact", point);
        assert_eq!(dir.join(temp_name).exists(), temp_left, "{point}");
        let bytes = fs::read(dir.join("effects.journal")).unwrap();
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        assert_eq!(
            bytes[..end].iter().filter(|&&b| b == b'\n').count(),
            lines_left,
            "{point}"
        );
        let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
        assert!(!dir.join(temp_name).exists(), "{point}: removed at open");
        for i in 0..COMPACT_CHILD_KEYS {
            match store
                .begin(&keyed(&format!("done-{i}")), EffectKind::Unsafe)
                .unwrap()
            {
                Begin::Replay(v) => assert_eq!(v, json!(i), "{point}"),
                other => panic!("{point}: expected Replay, got {other:?}"),
            }
        }
        match store.begin(&keyed("failed"), EffectKind::Unsafe).unwrap() {
            Begin::Replay(v) => assert_eq!(v, json!("second try"), "{point}"),
            other => panic!("{point}: expected Replay, got {other:?}"),
        }
        assert!(
            matches!(
                store.begin(&keyed("indeterminate"), EffectKind::Unsafe),
                Err(EffectError::Indeterminate { .. })
            ),
            "{point}"
        );
        // And the store compacts and goes on.
        assert_eq!(
            store.compact().unwrap().records,
            COMPACT_CHILD_KEYS as u64 + 2
        );
        let Begin::Execute(t) = store.begin(&req(), EffectKind::Unsafe).unwrap() else {
            panic!("{point}: expected Execute")
        };
        store.complete(t, &result()).unwrap();
    }
}
