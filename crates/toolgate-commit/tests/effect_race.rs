//! Concurrency: one execution per key across 64 threads and across 4 processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_canon::Sha256Digest;
use toolgate_commit::{
    Begin, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStore, Scope,
};

const THREADS: usize = 64;

fn req(key: &str) -> EffectRequest {
    EffectRequest {
        scope: Scope {
            principal: "alice".into(),
            tool: "counter".into(),
        },
        key: key.into(),
        fingerprint: Sha256Digest::of(b"same arguments"),
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    executed: usize,
    replayed: usize,
    in_progress: usize,
}

fn race(store: &Arc<EffectStore>, key: &str) -> (u64, Tally) {
    let effects = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (store, effects, barrier) = (
                Arc::clone(store),
                Arc::clone(&effects),
                Arc::clone(&barrier),
            );
            let key = key.to_owned();
            thread::spawn(move || {
                barrier.wait();
                match store.begin(&req(&key), EffectKind::Unsafe) {
                    Ok(Begin::Execute(ticket)) => {
                        let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
                        store.complete(ticket, &json!({"count": n})).unwrap();
                        "execute"
                    }
                    Ok(Begin::Replay(v)) => {
                        assert_eq!(v, json!({"count": 1}));
                        "replay"
                    }
                    Err(EffectError::InProgress { .. }) => "in_progress",
                    other => panic!("unexpected {other:?}"),
                }
            })
        })
        .collect();
    let mut tally = Tally::default();
    for h in handles {
        match h.join().unwrap() {
            "execute" => tally.executed += 1,
            "replay" => tally.replayed += 1,
            _ => tally.in_progress += 1,
        }
    }
    (effects.load(Ordering::SeqCst), tally)
}

#[test]
fn sixty_four_threads_one_key_execute_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(EffectStore::open(EffectConfig::new(tmp.path())).unwrap());
    for round in 0..5 {
        let (effects, tally) = race(&store, &format!("k{round}"));
        assert_eq!(effects, 1, "{tally:?}");
        assert_eq!(tally.executed, 1, "{tally:?}");
        assert_eq!(tally.replayed + tally.in_progress, THREADS - 1);
    }
    let c = store.counters()["counter"];
    assert_eq!(c.committed, 5);
    assert_eq!(c.replayed + c.in_progress, 5 * (THREADS as u64 - 1));
}

#[test]
fn sixty_four_threads_with_waiting_all_others_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(
        EffectStore::open(EffectConfig::new(tmp.path()).wait_in_progress(Duration::from_secs(120)))
            .unwrap(),
    );
    for round in 0..5 {
        let (effects, tally) = race(&store, &format!("w{round}"));
        assert_eq!(effects, 1);
        assert_eq!(
            tally,
            Tally {
                executed: 1,
                replayed: THREADS - 1,
                in_progress: 0
            }
        );
    }
}

// ---- 4 processes, 100 keys ----------------------------------------------------------------------

const CHILD_ENV: &str = "TOOLGATE_EFFECT_RACE_CHILD";
const PROCESSES: usize = 4;
const KEYS: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(120);

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

/// Child role. `mode` is `unsafe` (every key unsafe) or `mixed` (even keys idempotent, so their
/// `in_progress` lines are written without an fdatasync).
fn run_child(spec: &str) {
    let mut parts = spec.splitn(4, '|');
    let (mode, id, dir, control) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        PathBuf::from(parts.next().unwrap()),
        PathBuf::from(parts.next().unwrap()),
    );
    let store =
        EffectStore::open(EffectConfig::new(&dir).wait_in_progress(Duration::from_secs(60)))
            .unwrap();
    fs::write(control.join(format!("ready-{id}")), b"").unwrap();
    wait_for("the start file", || control.join("start").exists());
    let mut executed = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(control.join(format!("executed-{id}")))
        .unwrap();
    // Each process walks the keys from a different starting point so that they collide both on
    // fresh keys and on keys another process is executing.
    let offset: usize = id.parse::<usize>().unwrap() * 7;
    for i in 0..KEYS {
        let k = (i + offset) % KEYS;
        let key = format!("key-{k:03}");
        let kind = if mode == "mixed" && k.is_multiple_of(2) {
            EffectKind::Idempotent
        } else {
            EffectKind::Unsafe
        };
        match store.begin(&req(&key), kind).unwrap() {
            Begin::Execute(ticket) => {
                // The effect: recorded (and flushed) before the outcome is stored.
                writeln!(executed, "{key}").unwrap();
                executed.flush().unwrap();
                store.complete(ticket, &json!({"key": key})).unwrap();
            }
            Begin::Replay(v) => assert_eq!(v, json!({"key": key})),
            other => panic!("unexpected {other:?}"),
        }
    }
    fs::write(control.join(format!("done-{id}")), b"").unwrap();
}

#[test]
fn four_processes_share_keys_and_execute_each_once() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        run_child(&spec);
        return;
    }
    let (tmp, compactions) = run_processes(
        "four_processes_share_keys_and_execute_each_once",
        "unsafe",
        false,
    );
    drop(tmp);
    assert_eq!(compactions, 0);
}

#[test]
fn four_processes_with_lazy_idempotent_begins_while_another_compacts() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        run_child(&spec);
        return;
    }
    let (tmp, compactions) = run_processes(
        "four_processes_with_lazy_idempotent_begins_while_another_compacts",
        "mixed",
        true,
    );
    assert!(
        compactions >= 1,
        "the parent compacted while the children ran"
    );
    // A final compaction leaves exactly one line per key.
    let store = EffectStore::open(EffectConfig::new(tmp.path().join("effects"))).unwrap();
    assert_eq!(store.compact().unwrap().records, KEYS as u64);
    for k in 0..KEYS {
        let key = format!("key-{k:03}");
        match store.begin(&req(&key), EffectKind::Unsafe).unwrap() {
            Begin::Replay(v) => assert_eq!(v, json!({"key": key})),
            other => panic!("{key}: expected Replay, got {other:?}"),
        }
    }
}

/// Runs `PROCESSES` children of `test` in `mode` over one store and checks that every key was
/// executed exactly once; with `compact`, this process compacts the journal until they are done.
/// Returns the tempdir and how many compactions ran.
fn run_processes(test: &str, mode: &str, compact: bool) -> (tempfile::TempDir, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("effects");
    let control = tmp.path().join("control");
    fs::create_dir(&control).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|id| {
            Command::new(&exe)
                .args(["--exact", test])
                .env(
                    CHILD_ENV,
                    format!("{mode}|{id}|{}|{}", dir.display(), control.display()),
                )
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_for("children to be ready", || {
        (0..PROCESSES).all(|id| control.join(format!("ready-{id}")).exists())
    });
    fs::write(control.join("start"), b"").unwrap();
    let mut compactions = 0;
    if compact {
        let store = EffectStore::open(EffectConfig::new(&dir)).unwrap();
        let deadline = Instant::now() + TIMEOUT;
        let mut running = PROCESSES;
        while running > 0 {
            assert!(Instant::now() < deadline, "children did not finish");
            store.compact().unwrap();
            compactions += 1;
            // Pacing, not waiting for anything: leave the lock to the children for a while.
            thread::sleep(Duration::from_millis(5));
            running = 0;
            for child in &mut children {
                if child.try_wait().unwrap().is_none() {
                    running += 1;
                }
            }
        }
    }
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    let mut executions: BTreeMap<String, usize> = BTreeMap::new();
    for id in 0..PROCESSES {
        assert!(control.join(format!("done-{id}")).exists());
        let path = control.join(format!("executed-{id}"));
        for line in fs::read_to_string(&path).unwrap_or_default().lines() {
            *executions.entry(line.to_owned()).or_default() += 1;
        }
    }
    assert_eq!(executions.len(), KEYS, "every key executed somewhere");
    assert!(executions.values().all(|&n| n == 1), "{executions:?}");
    assert_eq!(json_records(&dir), KEYS);
    (tmp, compactions)
}

/// How many records the journal holds (latest state per name, removals excluded).
fn json_records(dir: &Path) -> usize {
    let mut bytes = fs::read(dir.join("effects.journal")).unwrap();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    bytes.truncate(end);
    let mut latest = BTreeMap::new();
    for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        latest.insert(
            v["name"].as_str().unwrap().to_owned(),
            !v["record"].is_null(),
        );
    }
    latest.values().filter(|&&live| live).count()
}
