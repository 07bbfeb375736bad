//! The effect store's state machine: conflict, replay across reopen, failures, expiry, dead owners,
//! resolution and counters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};
use toolgate_commit::{
    Attempt, Begin, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStore, Resolution,
    Scope,
};

fn scope() -> Scope {
    Scope {
        principal: "alice".into(),
        tool: "write_note".into(),
    }
}

fn req(key: &str, fp: &str) -> EffectRequest {
    EffectRequest {
        scope: scope(),
        key: key.into(),
        fingerprint: Sha256Digest::of(fp.as_bytes()),
    }
}

fn open(dir: &Path) -> EffectStore {
    EffectStore::open(EffectConfig::new(dir)).unwrap()
}

fn execute(store: &EffectStore, r: &EffectRequest, kind: EffectKind, result: &Value) {
    match store.begin(r, kind).unwrap() {
        Begin::Execute(ticket) => store.complete(ticket, result).unwrap(),
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn name_hex(key: &str) -> String {
    Sha256Digest::of_json(&json!({"key": key, "principal": "alice", "tool": "write_note"})).to_hex()
}

/// The record file of the previous one-file-per-record layout (migrated at open).
fn legacy_record_path(dir: &Path, key: &str) -> std::path::PathBuf {
    dir.join(format!("{}.json", name_hex(key)))
}

fn journal_path(dir: &Path) -> std::path::PathBuf {
    dir.join("effects.journal")
}

/// The journal's bytes up to its logical end (the zero padding after it excluded).
fn journal_bytes(dir: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(journal_path(dir)).unwrap_or_default();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    bytes.truncate(end);
    bytes
}

/// Writes `bytes` at the journal's logical end, under the store's lock, as another writer would.
fn append_raw(dir: &Path, bytes: &[u8]) {
    use std::os::unix::fs::FileExt as _;
    std::fs::create_dir_all(dir).unwrap();
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(".lock"))
        .unwrap();
    lock.lock().unwrap();
    let end = journal_bytes(dir).len() as u64;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(journal_path(dir))
        .unwrap();
    file.write_all_at(bytes, end).unwrap();
    file.sync_all().unwrap();
}

/// The latest state of `key` in the journal (`None`: absent or removed).
fn journal_record(dir: &Path, key: &str) -> Option<Value> {
    let hex = name_hex(key);
    let mut latest = None;
    for line in journal_bytes(dir)
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let v: Value = serde_json::from_slice(line).unwrap();
        if v["name"] == hex.as_str() {
            latest = Some(v["record"].clone()).filter(|r| !r.is_null());
        }
    }
    latest
}

fn ns(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_nanos()).unwrap()
}

#[test]
fn replay_after_reopen_returns_the_same_bytes_and_conflict_never_executes() {
    let tmp = tempfile::tempdir().unwrap();
    let result = json!({"z": 1, "a": [1.5, "é", {"k": null}], "n": 1e21});
    {
        let store = open(tmp.path());
        execute(&store, &req("k1", "fp"), EffectKind::Unsafe, &result);
    }
    let store = open(tmp.path());
    match store.begin(&req("k1", "fp"), EffectKind::Unsafe).unwrap() {
        Begin::Replay(v) => assert_eq!(canonical_value(&v), canonical_value(&result)),
        other => panic!("expected Replay, got {other:?}"),
    }
    match store.begin(&req("k1", "other"), EffectKind::Unsafe) {
        Err(EffectError::Conflict { key_digest }) => {
            let msg = EffectError::Conflict { key_digest }.to_string();
            assert!(!msg.contains("k1") && msg.contains("not executed"), "{msg}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    // The same key under another principal is another record.
    let mut bob = req("k1", "other");
    bob.scope.principal = "bob".into();
    assert!(matches!(
        store.begin(&bob, EffectKind::Unsafe).unwrap(),
        Begin::Execute(_)
    ));
    let c = store.counters()["write_note"];
    assert_eq!((c.replayed, c.conflict, c.committed), (1, 1, 0));
}

#[test]
fn replay_in_the_same_process_returns_the_value_as_given() {
    // The index keeps a result as its canonical text; a value that would not read back from it
    // exactly (floats, integers beyond 2^53) is replayed as given all the same.
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let results = [
        json!({"content": [{"type": "text", "text": "{\"a\":1}"}], "isError": false}),
        json!({"z": 1.0, "a": [1.5, "é\u{2028}\"\\", {"k": null}], "n": 1e21, "big": u64::MAX}),
        json!(-0.0),
    ];
    for (i, result) in results.iter().enumerate() {
        let r = req(&format!("same-process-{i}"), "fp");
        execute(&store, &r, EffectKind::Idempotent, result);
        match store.begin(&r, EffectKind::Idempotent).unwrap() {
            // With its objects' keys in `str` order whatever serde_json's maps keep (a build
            // with `preserve_order` keeps insertion order; see `StoredResult::to_value`).
            Begin::Replay(v) => assert_eq!(serde_json::to_string(&v).unwrap(), {
                let mut sorted = result.clone();
                sorted.sort_all_objects();
                serde_json::to_string(&sorted).unwrap()
            }),
            other => panic!("expected Replay, got {other:?}"),
        }
    }
}

#[test]
fn a_null_result_is_replayed_after_reopen() {
    // `"result":null` is a present result: reading it as absent made the record unreadable.
    let tmp = tempfile::tempdir().unwrap();
    {
        let store = open(tmp.path());
        execute(&store, &req("null", "fp"), EffectKind::Unsafe, &Value::Null);
    }
    assert!(
        String::from_utf8(journal_bytes(tmp.path()))
            .unwrap()
            .contains(r#""result":null,"state":"completed""#)
    );
    let store = open(tmp.path());
    match store.begin(&req("null", "fp"), EffectKind::Unsafe).unwrap() {
        Begin::Replay(v) => assert_eq!(v, Value::Null),
        other => panic!("expected Replay, got {other:?}"),
    }
    store.compact().unwrap();
    drop(store);
    let store = open(tmp.path());
    assert!(matches!(
        store.begin(&req("null", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Replay(Value::Null)
    ));
}

#[test]
fn failures_retryable_and_not() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let Begin::Execute(t) = store.begin(&req("r", "fp"), EffectKind::Unsafe).unwrap() else {
        panic!("expected Execute")
    };
    store.fail(t, "upstream 503", true).unwrap();
    // Retryable: executes again; a different fingerprint is still a conflict.
    assert!(matches!(
        store.begin(&req("r", "fp2"), EffectKind::Unsafe),
        Err(EffectError::Conflict { .. })
    ));
    let Begin::Execute(t) = store.begin(&req("r", "fp"), EffectKind::Unsafe).unwrap() else {
        panic!("retryable failure must execute again")
    };
    store.fail(t, "quota exceeded", false).unwrap();
    let store = open(tmp.path());
    match store.begin(&req("r", "fp"), EffectKind::Unsafe).unwrap() {
        Begin::ReplayFailure(e) => assert_eq!(e, "quota exceeded"),
        other => panic!("expected ReplayFailure, got {other:?}"),
    }
}

#[test]
fn live_owner_gives_in_progress_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    let store = EffectStore::open(EffectConfig::new(tmp.path()).lease(Duration::ZERO)).unwrap();
    let Begin::Execute(ticket) = store.begin(&req("p", "fp"), EffectKind::Unsafe).unwrap() else {
        panic!()
    };
    // Lease already expired, but the owner is alive: still InProgress, never a second Execute.
    for kind in [EffectKind::Unsafe, EffectKind::Idempotent] {
        match store.begin(&req("p", "fp"), kind) {
            Err(EffectError::InProgress { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(1));
            }
            other => panic!("expected InProgress, got {other:?}"),
        }
    }
    store.complete(ticket, &json!("done")).unwrap();
    assert!(matches!(
        store.begin(&req("p", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Replay(_)
    ));
    assert_eq!(store.counters()["write_note"].in_progress, 2);
}

/// One attempt at a time, as an async caller makes them: a key held by a live owner answers
/// `Pause` (counted nowhere) while the wait has time left, and the call is counted once, by its
/// final answer.
#[test]
fn attempts_pause_while_the_owner_runs_and_count_the_call_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store =
        EffectStore::open(EffectConfig::new(tmp.path()).wait_in_progress(Duration::from_secs(600)))
            .unwrap();
    let r = req("w", "fp");
    let mut owner = store.in_progress_wait();
    let Attempt::Ready(Begin::Execute(ticket)) = store
        .begin_attempt(&r, EffectKind::Idempotent, &mut owner)
        .unwrap()
    else {
        panic!("the first call executes")
    };

    let mut wait = store.in_progress_wait();
    let mut pauses = Vec::new();
    for _ in 0..8 {
        match store.begin_attempt(&r, EffectKind::Idempotent, &mut wait) {
            Ok(Attempt::Pause(pause)) => pauses.push(pause),
            other => panic!("expected Pause while the owner runs, got {other:?}"),
        }
    }
    // The backoff: 1 ms, doubling, at most 50 ms (the wait has minutes left).
    let ms = |n| Duration::from_millis(n);
    assert_eq!(
        pauses,
        [ms(1), ms(2), ms(4), ms(8), ms(16), ms(32), ms(50), ms(50)]
    );
    assert_eq!(
        store.counters().get("write_note").copied(),
        None,
        "pauses count nothing"
    );

    store.complete(ticket, &json!("done")).unwrap();
    match store.begin_attempt(&r, EffectKind::Idempotent, &mut wait) {
        Ok(Attempt::Ready(Begin::Replay(value))) => assert_eq!(value, json!("done")),
        other => panic!("expected Replay, got {other:?}"),
    }
    let counters = store.counters()["write_note"];
    assert_eq!((counters.committed, counters.replayed), (1, 1));
    assert_eq!(counters.in_progress, 0);
}

/// Without a configured wait the first attempt on a held key is the answer: `InProgress`, counted
/// once; `Conflict` and the other answers never pause.
#[test]
fn without_a_wait_an_attempt_answers_in_progress_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let mut owner = store.in_progress_wait();
    let Attempt::Ready(Begin::Execute(ticket)) = store
        .begin_attempt(&req("n", "fp"), EffectKind::Unsafe, &mut owner)
        .unwrap()
    else {
        panic!("the first call executes")
    };
    let mut wait = store.in_progress_wait();
    assert!(matches!(
        store.begin_attempt(&req("n", "fp"), EffectKind::Unsafe, &mut wait),
        Err(EffectError::InProgress { .. })
    ));
    let mut wait = store.in_progress_wait();
    assert!(matches!(
        store.begin_attempt(&req("n", "other"), EffectKind::Unsafe, &mut wait),
        Err(EffectError::Conflict { .. })
    ));
    store.complete(ticket, &json!(1)).unwrap();
    let counters = store.counters()["write_note"];
    assert_eq!((counters.in_progress, counters.conflict), (1, 1));
}

#[test]
fn dropped_ticket_is_indeterminate_for_unsafe_effects() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path());
    let Begin::Execute(ticket) = store.begin(&req("d", "fp"), EffectKind::Unsafe).unwrap() else {
        panic!()
    };
    drop(ticket);
    assert!(matches!(
        store.begin(&req("d", "fp"), EffectKind::Unsafe),
        Err(EffectError::Indeterminate { .. })
    ));
    assert!(matches!(
        store
            .begin(&req("d", "fp"), EffectKind::Idempotent)
            .unwrap(),
        Begin::Execute(_)
    ));
}

/// An in_progress record owned by a process that has exited.
fn dead_owner_record() -> Value {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let now = ns(SystemTime::now());
    json!({
        "state": "in_progress",
        "fingerprint": Sha256Digest::of(b"fp").to_hex(),
        "owner": {"pid": pid, "start_ticks": 1, "nonce": "00000000000000ff"},
        "lease_until_ns": (now + 3_600_000_000_000).to_string(),
        "created_ns": now.to_string(),
        "principal": "alice",
        "tool": "write_note",
    })
}

/// Appends a journal line: an in_progress record owned by a process that has exited.
fn write_dead_owner_record(dir: &Path, key: &str) {
    let line = json!({"name": name_hex(key), "record": dead_owner_record()});
    let mut bytes = canonical_value(&line);
    bytes.push(b'\n');
    append_raw(dir, &bytes);
}

#[test]
fn dead_owner_unsafe_is_indeterminate_idempotent_executes() {
    let tmp = tempfile::tempdir().unwrap();
    write_dead_owner_record(tmp.path(), "dead");
    let store = open(tmp.path());
    match store.begin(&req("dead", "fp"), EffectKind::Unsafe) {
        Err(e @ EffectError::Indeterminate { .. }) => {
            assert!(e.to_string().contains("resolve"), "{e}");
        }
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    // Different fingerprint: a conflict even while indeterminate.
    assert!(matches!(
        store.begin(&req("dead", "other"), EffectKind::Idempotent),
        Err(EffectError::Conflict { .. })
    ));
    execute(
        &store,
        &req("dead", "fp"),
        EffectKind::Idempotent,
        &json!(1),
    );
    assert!(matches!(
        store.begin(&req("dead", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Replay(_)
    ));
    assert_eq!(store.counters()["write_note"].indeterminate, 1);
}

#[test]
fn resolve_completed_and_forget() {
    let tmp = tempfile::tempdir().unwrap();
    write_dead_owner_record(tmp.path(), "a");
    write_dead_owner_record(tmp.path(), "b");
    let store = open(tmp.path());
    // Not indeterminate: absent, and later completed.
    assert!(matches!(
        store.resolve(&scope(), "absent", Resolution::Forget),
        Err(EffectError::NotIndeterminate {
            state: "absent",
            ..
        })
    ));
    store
        .resolve(&scope(), "a", Resolution::Completed(json!({"found": true})))
        .unwrap();
    match store.begin(&req("a", "fp"), EffectKind::Unsafe).unwrap() {
        Begin::Replay(v) => assert_eq!(v, json!({"found": true})),
        other => panic!("expected Replay, got {other:?}"),
    }
    assert!(matches!(
        store.resolve(&scope(), "a", Resolution::Forget),
        Err(EffectError::NotIndeterminate {
            state: "completed",
            ..
        })
    ));
    store.resolve(&scope(), "b", Resolution::Forget).unwrap();
    assert!(journal_record(tmp.path(), "b").is_none());
    assert!(matches!(
        store.begin(&req("b", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Execute(_)
    ));
    // A live owner cannot be resolved.
    let Begin::Execute(t) = store.begin(&req("c", "fp"), EffectKind::Unsafe).unwrap() else {
        panic!()
    };
    assert!(matches!(
        store.resolve(&scope(), "c", Resolution::Forget),
        Err(EffectError::NotIndeterminate { .. })
    ));
    store.complete(t, &json!(null)).unwrap();
}

#[test]
fn prune_boundaries() {
    let tmp = tempfile::tempdir().unwrap();
    let ttl = Duration::from_secs(3600);
    let store = EffectStore::open(EffectConfig::new(tmp.path()).completed_ttl(ttl)).unwrap();
    execute(&store, &req("done", "fp"), EffectKind::Unsafe, &json!(1));
    let finished = {
        let v = journal_record(tmp.path(), "done").unwrap();
        v["finished_ns"].as_str().unwrap().parse::<u64>().unwrap()
    };
    let Begin::Execute(_running) = store.begin(&req("run", "fp"), EffectKind::Unsafe).unwrap()
    else {
        panic!()
    };
    write_dead_owner_record(tmp.path(), "dead");
    let at = |offset_secs: i64| {
        let base = UNIX_EPOCH + Duration::from_nanos(finished);
        if offset_secs >= 0 {
            base + Duration::from_secs(offset_secs.unsigned_abs())
        } else {
            base - Duration::from_secs(offset_secs.unsigned_abs())
        }
    };
    assert_eq!(store.prune(at(3599)).unwrap(), 0);
    assert!(journal_record(tmp.path(), "done").is_some());
    assert_eq!(store.prune(at(3601)).unwrap(), 1);
    assert!(journal_record(tmp.path(), "done").is_none());
    // in_progress (live or dead owner) is never pruned, however old.
    assert_eq!(store.prune(at(10 * 365 * 24 * 3600)).unwrap(), 0);
    assert!(journal_record(tmp.path(), "run").is_some());
    assert!(journal_record(tmp.path(), "dead").is_some());
    // Pruned: the key executes again.
    assert!(matches!(
        store.begin(&req("done", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Execute(_)
    ));
}

#[test]
fn garbage_on_disk_is_an_error_not_a_panic() {
    let garbage: [&[u8]; 9] = [
        b"",
        b"{",
        b"{\"state\":\"completed\"}",
        b"[1,2]",
        b"{\"name\": null}",
        b"{\"name\":\"ABC\",\"record\":null}",
        b"{\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"record\":{\"state\":\"in_progress\"}}",
        &[0xff, 0xfe, 0x01],
        b"{\0}",
    ];
    for bytes in garbage {
        let tmp = tempfile::tempdir().unwrap();
        execute(
            &open(tmp.path()),
            &req("k1", "fp"),
            EffectKind::Unsafe,
            &json!(1),
        );
        let mut line = bytes.to_vec();
        line.push(b'\n');
        append_raw(tmp.path(), &line);
        // A second valid line after the damaged one: never silently dropped.
        write_dead_owner_record(tmp.path(), "after");
        let before = std::fs::read(journal_path(tmp.path())).unwrap();
        match EffectStore::open(EffectConfig::new(tmp.path())) {
            Err(EffectError::Corrupt { path, reason }) => {
                assert_eq!(path, journal_path(tmp.path()));
                assert!(reason.starts_with("line 3"), "{bytes:?}: {reason}");
            }
            other => panic!("expected Corrupt for {bytes:?}, got {other:?}"),
        }
        // Nothing repaired or rewritten.
        assert_eq!(std::fs::read(journal_path(tmp.path())).unwrap(), before);
    }
}

#[test]
fn orphaned_temporaries_are_removed_and_stray_files_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let orphan = tmp
        .path()
        .join(format!(".{}.{}.0.tmp", "a".repeat(64), u32::MAX - 1));
    std::fs::write(&orphan, b"partial").unwrap();
    std::fs::write(tmp.path().join("notes.txt"), b"x").unwrap();
    let _store = open(tmp.path());
    assert!(!orphan.exists());
    assert!(tmp.path().join("notes.txt").exists());
}

#[test]
fn torn_journal_tail_is_truncated_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    execute(
        &open(tmp.path()),
        &req("k1", "fp"),
        EffectKind::Unsafe,
        &json!(1),
    );
    let good = journal_bytes(tmp.path());
    // A write that never finished: part of a line, no newline.
    append_raw(tmp.path(), b"{\"name\":\"0123");
    let store = open(tmp.path());
    assert_eq!(journal_bytes(tmp.path()), good, "torn tail removed");
    let all = std::fs::read(journal_path(tmp.path())).unwrap();
    assert!(all[good.len()..].iter().all(|&b| b == 0));
    assert!(matches!(
        store.begin(&req("k1", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Replay(_)
    ));
    execute(&store, &req("k2", "fp"), EffectKind::Unsafe, &json!(2));
    drop(store);

    // The same without zero padding: the torn line is the end of the file.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut bytes = good.clone();
    bytes.extend_from_slice(b"{\"name\"");
    std::fs::write(journal_path(tmp2.path()), &bytes).unwrap();
    let store = open(tmp2.path());
    assert_eq!(journal_bytes(tmp2.path()), good);
    execute(&store, &req("k2", "fp"), EffectKind::Unsafe, &json!(2));
    drop(store);
    let store = open(tmp2.path());
    for (key, want) in [("k1", json!(1)), ("k2", json!(2))] {
        match store.begin(&req(key, "fp"), EffectKind::Unsafe).unwrap() {
            Begin::Replay(v) => assert_eq!(v, want),
            other => panic!("expected Replay, got {other:?}"),
        }
    }
}

#[test]
fn record_files_of_the_previous_layout_are_migrated() {
    let tmp = tempfile::tempdir().unwrap();
    let legacy = legacy_record_path(tmp.path(), "old");
    std::fs::write(&legacy, canonical_value(&dead_owner_record())).unwrap();
    let store = open(tmp.path());
    assert!(!legacy.exists(), "moved into the journal");
    assert!(journal_record(tmp.path(), "old").is_some());
    assert!(matches!(
        store.begin(&req("old", "fp"), EffectKind::Unsafe),
        Err(EffectError::Indeterminate { .. })
    ));
    // A corrupt legacy file is reported, not dropped.
    let bad = legacy_record_path(tmp.path(), "bad");
    std::fs::write(&bad, b"{").unwrap();
    drop(store);
    assert!(matches!(
        EffectStore::open(EffectConfig::new(tmp.path())),
        Err(EffectError::Corrupt { .. })
    ));
    assert!(bad.exists());
}

#[test]
fn a_journal_larger_than_one_read_is_read_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let store = open(tmp.path());
        for i in 0..150 {
            execute(
                &store,
                &req(&format!("k{i}"), "fp"),
                EffectKind::Unsafe,
                &json!(i),
            );
        }
    }
    assert!(journal_bytes(tmp.path()).len() > 64 * 1024);
    // A torn tail after many lines as well.
    append_raw(tmp.path(), b"{\"name\":");
    let store = open(tmp.path());
    for i in 0..150 {
        match store
            .begin(&req(&format!("k{i}"), "fp"), EffectKind::Unsafe)
            .unwrap()
        {
            Begin::Replay(v) => assert_eq!(v, json!(i)),
            other => panic!("k{i}: expected Replay, got {other:?}"),
        }
    }
    assert!(journal_bytes(tmp.path()).ends_with(b"\n"));
}

#[test]
fn bytes_after_the_logical_end_are_zeroed_at_open_or_reported() {
    use std::os::unix::fs::FileExt as _;
    // What a power loss can leave: a later page of never-synced writes persisted, an earlier one
    // not, so non-zero bytes sit in the padding after a zero at a line start.
    for (stray, corrupt) in [(&b"3\",\"record\":null}"[..], false), (b"x\n{}", true)] {
        let tmp = tempfile::tempdir().unwrap();
        execute(
            &open(tmp.path()),
            &req("k1", "fp"),
            EffectKind::Unsafe,
            &json!(1),
        );
        let good = journal_bytes(tmp.path());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(journal_path(tmp.path()))
            .unwrap();
        file.write_all_at(stray, good.len() as u64 + 5000).unwrap();
        drop(file);
        match EffectStore::open(EffectConfig::new(tmp.path())) {
            Ok(store) => {
                assert!(
                    !corrupt,
                    "{stray:?}: whole lines after the end must be reported"
                );
                let all = std::fs::read(journal_path(tmp.path())).unwrap();
                assert!(all[good.len()..].iter().all(|&b| b == 0), "zeroed");
                // Appends land on clean ground and read back.
                execute(&store, &req("k2", "fp"), EffectKind::Unsafe, &json!(2));
                drop(store);
                let store = open(tmp.path());
                match store.begin(&req("k2", "fp"), EffectKind::Unsafe).unwrap() {
                    Begin::Replay(v) => assert_eq!(v, json!(2)),
                    other => panic!("expected Replay, got {other:?}"),
                }
            }
            Err(EffectError::Corrupt { reason, .. }) => {
                assert!(corrupt, "{stray:?}: {reason}");
                assert!(reason.starts_with("line 3"), "{reason}");
            }
            Err(e) => panic!("{stray:?}: {e}"),
        }
    }
}

/// A result whose journal line would exceed `MAX_LINE_BYTES` is refused before anything is
/// written (a line the journal could not read back would fail every later open), and the key can
/// still be completed with a smaller result.
#[test]
fn a_result_too_large_for_a_journal_line_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let r = req("huge", "fp");
    let Begin::Execute(ticket) = store.begin(&r, EffectKind::Idempotent).unwrap() else {
        panic!("expected Execute")
    };
    let before = journal_bytes(dir.path());
    let huge = Value::String("x".repeat(toolgate_commit::MAX_LINE_BYTES as usize));
    let err = store.complete(ticket, &huge).unwrap_err();
    assert!(
        matches!(err, EffectError::RecordTooLarge { len, max, .. } if len > max),
        "{err}"
    );
    assert!(err.to_string().contains("was not stored"), "{err}");
    assert_eq!(journal_bytes(dir.path()), before, "nothing was written");
    drop(store);
    // The interrupted idempotent call is taken over and completes with a smaller result.
    let store = open(dir.path());
    execute(&store, &r, EffectKind::Idempotent, &json!({"small": true}));
    match store.begin(&r, EffectKind::Idempotent).unwrap() {
        Begin::Replay(v) => assert_eq!(v, json!({"small": true})),
        other => panic!("expected Replay, got {other:?}"),
    }
}

/// A settled record (finished, well inside its retention window) is answered without the
/// store's cross-process lock: a replay and a conflict go through while another process holds
/// it (without the quick path this test waits for the lock and fails at the timeout).
#[test]
fn a_settled_record_is_answered_without_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path()));
    execute(
        &store,
        &req("k1", "a"),
        EffectKind::Unsafe,
        &json!({"n": 1}),
    );
    // Another process's hold of the store's lock (a flock of another open file description).
    let holder = toolgate_storage::LockFile::open(dir.path().join(".lock")).unwrap();
    let held = holder.lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let store = std::sync::Arc::clone(&store);
        std::thread::spawn(move || {
            let replay = store.begin(&req("k1", "a"), EffectKind::Unsafe);
            let conflict = store.begin(&req("k1", "b"), EffectKind::Unsafe);
            tx.send((replay, conflict)).unwrap();
        })
    };
    let answers = rx.recv_timeout(Duration::from_secs(120));
    drop(held);
    worker.join().unwrap();
    let (replay, conflict) = answers.expect("answered while another process holds the lock");
    assert!(matches!(replay.unwrap(), Begin::Replay(v) if v == json!({"n": 1})));
    assert!(
        matches!(conflict, Err(EffectError::Conflict { .. })),
        "{conflict:?}"
    );
}
