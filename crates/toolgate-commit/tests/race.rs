//! Concurrency: racing commits of one key yield exactly one Committed, in one process and across
//! processes.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_commit::{CommitError, CommitOutcome, CommitStore, FileCommitStore, IdempotencyKey};

const THREADS: usize = 16;
const ROUNDS: usize = 20;

fn record_count(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name().into_string().unwrap();
            name.len() == 69 && name.ends_with(".json")
        })
        .count()
}

fn no_temp_files(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().all(|e| {
        let name = e.unwrap().file_name().into_string().unwrap();
        !name.ends_with(".tmp")
    })
}

/// Runs `THREADS` threads that all call `commit(key, payload_for(i))` at once; returns the results.
fn race(
    store: &Arc<FileCommitStore>,
    key: &IdempotencyKey,
    payload_for: fn(usize) -> Value,
) -> Vec<Result<CommitOutcome, CommitError>> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let store = Arc::clone(store);
            let barrier = Arc::clone(&barrier);
            let key = key.clone();
            thread::spawn(move || {
                let payload = payload_for(i);
                barrier.wait();
                store.commit(&key, &payload)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn threads_racing_with_the_same_payload_commit_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(FileCommitStore::open(tmp.path()).unwrap());
    for round in 0..ROUNDS {
        let key = IdempotencyKey::new(format!("same-{round}")).unwrap();
        let results = race(&store, &key, |_| json!({"text": "same for everyone"}));
        let committed = results
            .iter()
            .filter(|r| matches!(r, Ok(CommitOutcome::Committed)))
            .count();
        let replayed = results
            .iter()
            .filter(|r| matches!(r, Ok(CommitOutcome::Replay)))
            .count();
        assert_eq!(
            (committed, replayed),
            (1, THREADS - 1),
            "round {round}: {results:?}"
        );
    }
    assert_eq!(record_count(tmp.path()), ROUNDS);
    assert!(no_temp_files(tmp.path()));
}

#[test]
fn threads_racing_with_different_payloads_commit_the_winner_only() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(FileCommitStore::open(tmp.path()).unwrap());
    for round in 0..ROUNDS {
        let key = IdempotencyKey::new(format!("different-{round}")).unwrap();
        let results = race(&store, &key, |i| json!({"writer": i}));
        let winners: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Ok(CommitOutcome::Committed)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let conflicts = results
            .iter()
            .filter(|r| matches!(r, Err(CommitError::Conflict { key_digest }) if *key_digest == key.digest()))
            .count();
        assert_eq!(conflicts, THREADS - 1, "round {round}: {results:?}");
        assert_eq!(
            store.get(&key).unwrap(),
            Some(json!({"writer": winners[0]}))
        );
    }
    assert_eq!(record_count(tmp.path()), ROUNDS);
    assert!(no_temp_files(tmp.path()));
}

#[test]
fn threads_with_separate_store_instances_commit_once() {
    // Separate instances share nothing in memory; only the lock file serializes them.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                let dir = dir.clone();
                thread::spawn(move || {
                    let store = FileCommitStore::open(&dir).unwrap();
                    let key = IdempotencyKey::new(format!("instances-{round}")).unwrap();
                    barrier.wait();
                    store.commit(&key, &json!({"round": round})).unwrap()
                })
            })
            .collect();
        let committed = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|o| *o == CommitOutcome::Committed)
            .count();
        assert_eq!(committed, 1, "round {round}");
    }
    assert_eq!(record_count(&dir), ROUNDS);
}

// ---- Cross-process race -------------------------------------------------------------------------

const CHILD_ENV: &str = "TOOLGATE_COMMIT_RACE_CHILD";
const KEYS: usize = 200;
const CHILDREN: usize = 2;
/// Generous: only reached if something is broken, and then the test fails instead of hanging.
const TIMEOUT: Duration = Duration::from_secs(120);

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

fn race_key(i: usize) -> IdempotencyKey {
    IdempotencyKey::new(format!("cross-process-{i:03}")).unwrap()
}

/// Child role: open the store, announce readiness, wait for the start file, commit every key,
/// then publish the outcomes atomically to its result file.
fn run_child(spec: &str) {
    let mut parts = spec.splitn(3, '|');
    let (id, dir, control) = (
        parts.next().unwrap(),
        PathBuf::from(parts.next().unwrap()),
        PathBuf::from(parts.next().unwrap()),
    );
    let store = FileCommitStore::open(&dir).unwrap();
    fs::write(control.join(format!("ready-{id}")), b"").unwrap();
    wait_for("the start file", || control.join("start").exists());

    let mut lines = String::new();
    for i in 0..KEYS {
        let outcome = store
            .commit(&race_key(i), &json!({"key": i, "text": "same payload"}))
            .unwrap();
        lines.push_str(&format!("{i} {}\n", outcome.as_str()));
    }
    let partial = control.join(format!("result-{id}.partial"));
    fs::write(&partial, lines).unwrap();
    fs::rename(&partial, control.join(format!("result-{id}"))).unwrap();
}

#[test]
fn processes_racing_on_the_same_keys_commit_each_once() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        run_child(&spec);
        return;
    }

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    let control = tmp.path().join("control");
    fs::create_dir(&control).unwrap();

    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|id| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "processes_racing_on_the_same_keys_commit_each_once",
                    "--nocapture",
                ])
                .env(
                    CHILD_ENV,
                    format!("{id}|{}|{}", dir.display(), control.display()),
                )
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();

    wait_for("children to be ready", || {
        (0..CHILDREN).all(|id| control.join(format!("ready-{id}")).exists())
    });
    fs::write(control.join("start"), b"").unwrap();

    for child in &mut children {
        let status = child.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }

    let mut committed_by: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut replays = 0;
    for id in 0..CHILDREN {
        let text = fs::read_to_string(control.join(format!("result-{id}"))).unwrap();
        assert_eq!(text.lines().count(), KEYS, "child {id} reported every key");
        for line in text.lines() {
            let (i, outcome) = line.split_once(' ').unwrap();
            let i: usize = i.parse().unwrap();
            match outcome {
                "committed" => committed_by.entry(i).or_default().push(id),
                "replay" => replays += 1,
                other => panic!("unexpected outcome {other}"),
            }
        }
    }
    for i in 0..KEYS {
        assert_eq!(
            committed_by.get(&i).map(Vec::len),
            Some(1),
            "key {i} committed by {:?}",
            committed_by.get(&i)
        );
    }
    assert_eq!(replays, KEYS * (CHILDREN - 1));
    assert_eq!(record_count(&dir), KEYS);
    assert!(no_temp_files(&dir));

    let store = FileCommitStore::open(&dir).unwrap();
    for i in 0..KEYS {
        assert_eq!(
            store.get(&race_key(i)).unwrap(),
            Some(json!({"key": i, "text": "same payload"}))
        );
    }
}
