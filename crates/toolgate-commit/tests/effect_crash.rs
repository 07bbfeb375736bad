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
use toolgate_commit::effect::{
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

/// Child role: stop forever at `point` after writing `marker`; the effect appends to `effects`.
fn run_child(spec: &str) {
    let mut parts = spec.splitn(3, '|');
    let (point, dir, control) = (
        parts.next().unwrap().to_owned(),
        PathBuf::from(parts.next().unwrap()),
        PathBuf::from(parts.next().unwrap()),
    );
    let marker = control.join("marker");
    let hook: FaultHook = Arc::new(move |reached| {
        if reached == point {
            fs::write(&marker, reached).unwrap();
            loop {
                thread::sleep(Duration::from_secs(1));
            }
        }
    });
    let store = EffectStore::open(EffectConfig::new(&dir).fault_hook(hook)).unwrap();
    if let Begin::Execute(ticket) = store.begin(&req(), EffectKind::Unsafe).unwrap() {
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

/// Runs a child that is killed at `point`; returns (store dir, control dir, tempdir guard).
fn crash_at(point: &str) -> (PathBuf, PathBuf, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("effects");
    let control = tmp.path().join("control");
    fs::create_dir(&control).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "kill_at_every_crash_point"])
        .env(
            CHILD_ENV,
            format!("{point}|{}|{}", dir.display(), control.display()),
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
        let (dir, control, _tmp) = crash_at(point);
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

    let (dir, control, _tmp) = crash_at("effect.after_complete");
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
