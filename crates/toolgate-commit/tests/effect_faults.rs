//! Crash model with injected I/O failures (in the manner of redb's crash tests): fail the Nth call
//! of every storage operation during a begin/complete cycle, then reopen on healthy storage, retry,
//! and check the invariants: never a panic, never two executions of an unsafe effect, never a lost
//! completed result, and a clear answer for every retry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};
use toolgate_commit::{
    Begin, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStore, FaultyStorage,
    FsStorage, Op, Resolution, Scope,
};

fn req() -> EffectRequest {
    EffectRequest {
        scope: Scope {
            principal: "alice".into(),
            tool: "transfer".into(),
        },
        key: "payment-42".into(),
        fingerprint: Sha256Digest::of(b"amount=10"),
    }
}

fn result() -> Value {
    json!({"transfer_id": "t-1", "amount": 10})
}

/// What happened in the faulty cycle.
#[derive(Debug)]
struct Attempt {
    executions: u32,
    completed_ok: bool,
    error: Option<String>,
}

/// One begin/complete cycle; every error is returned, never a panic.
fn cycle(store: &EffectStore, kind: EffectKind) -> Attempt {
    let mut attempt = Attempt {
        executions: 0,
        completed_ok: false,
        error: None,
    };
    match store.begin(&req(), kind) {
        Ok(Begin::Execute(ticket)) => {
            attempt.executions += 1;
            match store.complete(ticket, &result()) {
                Ok(()) => attempt.completed_ok = true,
                Err(e) => attempt.error = Some(e.to_string()),
            }
        }
        Ok(other) => panic!("fresh directory must execute, got {other:?}"),
        Err(e) => attempt.error = Some(e.to_string()),
    }
    attempt
}

fn no_temp_files(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".tmp"))
}

fn check_op(op: Op, kind: EffectKind) -> u64 {
    let mut injected = 0;
    for n in 1.. {
        let tmp = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        let store =
            EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone()).unwrap();
        faulty.fail_nth(op, n);
        let first = cycle(&store, kind);
        if faulty.triggered() == 0 {
            assert!(
                first.completed_ok,
                "{op:?} #{n}: no fault, must complete: {first:?}"
            );
            break;
        }
        injected += 1;
        assert!(
            first.error.is_some() || first.completed_ok,
            "{op:?} #{n}: {first:?}"
        );
        if let Some(e) = &first.error {
            assert!(
                e.contains("injected fault"),
                "{op:?} #{n}: error names the cause: {e}"
            );
        }
        drop(store);

        // "Restart": a fresh store on healthy storage over the same directory.
        let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
        assert!(
            no_temp_files(tmp.path()),
            "{op:?} #{n}: orphans removed at open"
        );
        let mut executions = first.executions;
        match store.begin(&req(), kind) {
            Ok(Begin::Execute(ticket)) => {
                assert!(!first.completed_ok, "{op:?} #{n}: completed result lost");
                executions += 1;
                store.complete(ticket, &result()).unwrap();
            }
            Ok(Begin::Replay(v)) => {
                assert_eq!(canonical_value(&v), canonical_value(&result()));
            }
            Err(EffectError::Indeterminate { .. }) => {
                assert!(!first.completed_ok, "{op:?} #{n}: completed result lost");
                assert_eq!(kind, EffectKind::Unsafe);
                assert_eq!(
                    first.executions, 1,
                    "{op:?} #{n}: indeterminate only after an execution"
                );
                // The operator inspects the target (the effect happened) and resolves.
                store
                    .resolve(&req().scope, &req().key, Resolution::Completed(result()))
                    .unwrap();
            }
            other => panic!("{op:?} #{n}: unexpected retry answer {other:?} after {first:?}"),
        }
        if kind == EffectKind::Unsafe {
            assert!(
                executions <= 1,
                "{op:?} #{n}: unsafe effect executed {executions} times"
            );
        }
        // Afterwards the outcome is settled and replays.
        let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
        match store.begin(&req(), kind).unwrap() {
            Begin::Replay(v) => assert_eq!(canonical_value(&v), canonical_value(&result())),
            other => panic!("{op:?} #{n}: expected Replay at the end, got {other:?}"),
        }
    }
    injected
}

#[test]
fn every_injected_failure_is_clean_and_recoverable() {
    let mut total = 0;
    for kind in [EffectKind::Unsafe, EffectKind::Idempotent] {
        for op in Op::ALL {
            total += check_op(op, kind);
        }
    }
    // begin and complete each append one journal line (one write); the unsafe cycle fdatasyncs
    // after each, the idempotent one never (its lines are written, and made durable by the next
    // fdatasync of the journal); renames, directory fsyncs and removals only happen at open (see
    // `open_fails_cleanly_...`) and in compaction (see `compaction_fails_cleanly_...`).
    assert_eq!(total, 4 + 2, "faults injected");
}

#[test]
fn failed_fdatasync_after_complete_fails_the_call_and_the_retry_replays() {
    let tmp = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let store =
        EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone()).unwrap();
    let Begin::Execute(ticket) = store.begin(&req(), EffectKind::Unsafe).unwrap() else {
        panic!()
    };
    faulty.fail_nth(Op::FsyncFile, 1);
    let err = store.complete(ticket, &result()).unwrap_err();
    assert!(
        matches!(
            err,
            EffectError::Io {
                op: "fdatasync journal",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(faulty.triggered(), 1);
    // Same store, storage healthy again: the retry replays, after an fdatasync of its own.
    match store.begin(&req(), EffectKind::Unsafe).unwrap() {
        Begin::Replay(v) => assert_eq!(v, result()),
        other => panic!("expected Replay, got {other:?}"),
    }
    assert_eq!(faulty.calls(Op::FsyncFile), 2);
    drop(store);
    let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
    assert!(matches!(
        store.begin(&req(), EffectKind::Unsafe).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn failed_fdatasync_or_append_of_begin_fails_the_call_and_a_retry_executes_once() {
    for op in [Op::FsyncFile, Op::Write] {
        let tmp = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        let store =
            EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone()).unwrap();
        faulty.fail_nth(op, 1);
        let err = store.begin(&req(), EffectKind::Unsafe).unwrap_err();
        assert!(matches!(err, EffectError::Io { .. }), "{op:?}: {err}");
        assert!(err.to_string().contains("injected fault"), "{err}");
        // The effect never started, so even an unsafe effect executes on retry (once).
        let Begin::Execute(ticket) = store.begin(&req(), EffectKind::Unsafe).unwrap() else {
            panic!("{op:?}: expected Execute")
        };
        assert!(matches!(
            store.begin(&req(), EffectKind::Unsafe),
            Err(EffectError::InProgress { .. })
        ));
        store.complete(ticket, &result()).unwrap();
        drop(store);
        let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
        assert!(matches!(
            store.begin(&req(), EffectKind::Unsafe).unwrap(),
            Begin::Replay(_)
        ));
    }
}

/// A directory for `open` to recover: a journal with a torn tail and a record file of the previous
/// layout to migrate (so open writes, fdatasyncs, removes and fsyncs the directory).
fn recovery_dir(dir: &Path) {
    {
        let store = EffectStore::open(EffectConfig::new(dir)).unwrap();
        let Begin::Execute(ticket) = store.begin(&req(), EffectKind::Unsafe).unwrap() else {
            panic!()
        };
        store.complete(ticket, &result()).unwrap();
    }
    let journal = dir.join("effects.journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    let end = bytes.iter().position(|&b| b == 0).unwrap();
    bytes[end..end + 5].copy_from_slice(b"{\"nam");
    std::fs::write(&journal, bytes).unwrap();
    let other =
        Sha256Digest::of_json(&json!({"key": "k2", "principal": "alice", "tool": "transfer"}));
    let record = json!({
        "created_ns": "1", "finished_ns": "2", "fingerprint": Sha256Digest::of(b"amount=10").to_hex(),
        "lease_until_ns": "3", "owner": {"nonce": "00000000000000aa", "pid": 1, "start_ticks": 1},
        "principal": "alice", "result": {"legacy": true}, "state": "completed", "tool": "transfer",
    });
    std::fs::write(
        dir.join(format!("{}.json", other.to_hex())),
        canonical_value(&record),
    )
    .unwrap();
}

#[test]
fn open_fails_cleanly_on_every_injected_failure_and_a_retry_recovers() {
    let mut injected = 0;
    for op in Op::ALL {
        for n in 1.. {
            let tmp = tempfile::tempdir().unwrap();
            recovery_dir(tmp.path());
            let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
            faulty.fail_nth(op, n);
            let opened =
                EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone());
            if faulty.triggered() == 0 {
                opened.unwrap();
                break;
            }
            injected += 1;
            let err = opened.unwrap_err();
            assert!(
                err.to_string().contains("injected fault"),
                "{op:?} #{n}: {err}"
            );
            let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
            let mut k2 = req();
            k2.key = "k2".into();
            for (r, want) in [(req(), result()), (k2, json!({"legacy": true}))] {
                match store.begin(&r, EffectKind::Unsafe).unwrap() {
                    Begin::Replay(v) => assert_eq!(v, want, "{op:?} #{n}"),
                    other => panic!("{op:?} #{n}: expected Replay, got {other:?}"),
                }
            }
        }
    }
    // Write (zeroing the torn tail, appending the migrated record), FsyncFile (after each), Remove
    // (the migrated file), FsyncDir (parent and store directory); open renames nothing.
    assert_eq!(injected, 7, "faults injected");
}

// ---- fdatasyncs per cycle ------------------------------------------------------------------------

fn keyed(key: &str, fingerprint: &[u8]) -> EffectRequest {
    EffectRequest {
        key: key.into(),
        fingerprint: Sha256Digest::of(fingerprint),
        ..req()
    }
}

#[test]
fn idempotent_cycle_does_no_data_sync_and_unsafe_two() {
    let tmp = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let store =
        EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone()).unwrap();
    let (writes, dir_syncs) = (faulty.calls(Op::Write), faulty.calls(Op::FsyncDir));
    for (kind, begin_syncs, complete_syncs) in
        [(EffectKind::Idempotent, 0, 0), (EffectKind::Unsafe, 1, 1)]
    {
        for i in 0..5 {
            let r = keyed(&format!("{kind:?}-{i}"), b"amount=10");
            let before = faulty.calls(Op::FsyncFile);
            let Begin::Execute(ticket) = store.begin(&r, kind).unwrap() else {
                panic!("{kind:?}: expected Execute")
            };
            assert_eq!(
                faulty.calls(Op::FsyncFile) - before,
                begin_syncs,
                "{kind:?}: fdatasyncs of begin"
            );
            store.complete(ticket, &result()).unwrap();
            assert_eq!(
                faulty.calls(Op::FsyncFile) - before,
                begin_syncs + complete_syncs,
                "{kind:?}: fdatasyncs of a begin+complete cycle"
            );
            // A replay relies on a durable line (unsafe) or a written one (idempotent): no
            // fdatasync.
            assert!(matches!(store.begin(&r, kind).unwrap(), Begin::Replay(_)));
            assert_eq!(
                faulty.calls(Op::FsyncFile) - before,
                begin_syncs + complete_syncs
            );
        }
    }
    assert_eq!(
        faulty.calls(Op::Write) - writes,
        20,
        "one journal write per begin and complete"
    );
    assert_eq!(
        faulty.calls(Op::FsyncDir),
        dir_syncs,
        "no directory fsync after open"
    );
}

#[test]
fn unsafe_answers_that_rely_on_a_lazily_written_line_wait_for_its_fdatasync() {
    let tmp = tempfile::tempdir().unwrap();
    let a_storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let b_storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let a =
        EffectStore::open_with_storage(EffectConfig::new(tmp.path()), a_storage.clone()).unwrap();
    let b =
        EffectStore::open_with_storage(EffectConfig::new(tmp.path()), b_storage.clone()).unwrap();
    let syncs = |s: &FaultyStorage| s.calls(Op::FsyncFile);
    let (a0, b0) = (syncs(&a_storage), syncs(&b_storage));
    let (idem, unsafe_) = (EffectKind::Idempotent, EffectKind::Unsafe);

    // Same store: an idempotent conflict is answered from the written line; an unsafe one (a
    // policy reload can change a tool's kind) fdatasyncs first; afterwards the line is durable.
    let Begin::Execute(t1) = a.begin(&keyed("k1", b"x"), idem).unwrap() else {
        panic!()
    };
    assert_eq!(syncs(&a_storage), a0, "lazy begin");
    assert!(matches!(
        a.begin(&keyed("k1", b"other"), idem),
        Err(EffectError::Conflict { .. })
    ));
    assert_eq!(syncs(&a_storage), a0, "idempotent conflict on a lazy line");
    assert!(matches!(
        a.begin(&keyed("k1", b"other"), unsafe_),
        Err(EffectError::Conflict { .. })
    ));
    assert_eq!(syncs(&a_storage), a0 + 1, "unsafe conflict on a lazy line");
    assert!(matches!(
        a.begin(&keyed("k1", b"x"), unsafe_),
        Err(EffectError::InProgress { .. })
    ));
    assert_eq!(syncs(&a_storage), a0 + 1, "the line is durable now");

    // Another store instance (another process would behave the same): it reads the line through
    // the page cache, and fdatasyncs before an unsafe answer from it.
    let Begin::Execute(t2) = a.begin(&keyed("k2", b"x"), idem).unwrap() else {
        panic!()
    };
    assert_eq!(syncs(&a_storage), a0 + 1);
    let Begin::Execute(t3) = b.begin(&keyed("k3", b"x"), idem).unwrap() else {
        panic!()
    };
    assert_eq!(syncs(&b_storage), b0, "unrelated lazy begin in B");
    assert!(matches!(
        b.begin(&keyed("k2", b"x"), idem),
        Err(EffectError::InProgress { .. })
    ));
    assert_eq!(
        syncs(&b_storage),
        b0,
        "idempotent answer from A's lazy line"
    );
    assert!(matches!(
        b.begin(&keyed("k2", b"x"), unsafe_),
        Err(EffectError::InProgress { .. })
    ));
    assert_eq!(
        syncs(&b_storage),
        b0 + 1,
        "unsafe answer from A's lazy line"
    );

    // Idempotent completions are written, not synced; replays of them in the other store are
    // answered from the written lines, and `sync` makes everything durable with one fdatasync.
    b.complete(t3, &result()).unwrap();
    a.complete(t1, &result()).unwrap();
    a.complete(t2, &result()).unwrap();
    assert_eq!(syncs(&a_storage), a0 + 1);
    assert_eq!(syncs(&b_storage), b0 + 1);
    for key in ["k1", "k2", "k3"] {
        assert!(matches!(
            b.begin(&keyed(key, b"x"), idem).unwrap(),
            Begin::Replay(_)
        ));
    }
    assert_eq!(syncs(&b_storage), b0 + 1);
    a.sync().unwrap();
    assert_eq!(syncs(&a_storage), a0 + 2, "sync: one fdatasync");
    a.sync().unwrap();
    assert_eq!(syncs(&a_storage), a0 + 2, "nothing left to sync");

    // prune relies on every record: it fdatasyncs even with nothing to remove.
    let Begin::Execute(_t4) = a.begin(&keyed("k4", b"x"), idem).unwrap() else {
        panic!()
    };
    let before = syncs(&a_storage);
    assert_eq!(a.prune(std::time::SystemTime::now()).unwrap(), 0);
    assert!(syncs(&a_storage) > before);
}

// ---- compaction ----------------------------------------------------------------------------------

/// Records in every state, plus superseded and removed lines: `done` (completed), `retried`
/// (failed retryably, then completed), `refused` (failed for good), `indeterminate` (unsafe,
/// ticket dropped), `forgotten` (resolved away).
fn populate(dir: &Path) {
    let store = EffectStore::open(EffectConfig::new(dir)).unwrap();
    let run = |key: &str, kind| match store.begin(&keyed(key, b"x"), kind).unwrap() {
        Begin::Execute(t) => t,
        other => panic!("{key}: expected Execute, got {other:?}"),
    };
    store
        .complete(run("done", EffectKind::Unsafe), &result())
        .unwrap();
    store
        .fail(run("retried", EffectKind::Idempotent), "503", true)
        .unwrap();
    store
        .complete(
            run("retried", EffectKind::Idempotent),
            &json!({"second": true}),
        )
        .unwrap();
    store
        .fail(run("refused", EffectKind::Unsafe), "bad input", false)
        .unwrap();
    drop(run("indeterminate", EffectKind::Unsafe));
    drop(run("forgotten", EffectKind::Unsafe));
    store
        .resolve(&req().scope, "forgotten", Resolution::Forget)
        .unwrap();
}

/// The answers `populate` promises (`forgotten` is checked by the caller: a begin would change it).
fn check_populated(store: &EffectStore, what: &str) {
    for (key, want) in [("done", result()), ("retried", json!({"second": true}))] {
        match store.begin(&keyed(key, b"x"), EffectKind::Unsafe).unwrap() {
            Begin::Replay(v) => assert_eq!(canonical_value(&v), canonical_value(&want), "{what}"),
            other => panic!("{what}: {key}: expected Replay, got {other:?}"),
        }
    }
    match store
        .begin(&keyed("refused", b"x"), EffectKind::Unsafe)
        .unwrap()
    {
        Begin::ReplayFailure(e) => assert_eq!(e, "bad input", "{what}"),
        other => panic!("{what}: expected ReplayFailure, got {other:?}"),
    }
    assert!(
        matches!(
            store.begin(&keyed("indeterminate", b"x"), EffectKind::Unsafe),
            Err(EffectError::Indeterminate { .. })
        ),
        "{what}"
    );
    assert!(
        matches!(
            store.begin(&keyed("done", b"other"), EffectKind::Unsafe),
            Err(EffectError::Conflict { .. })
        ),
        "{what}"
    );
}

#[test]
fn compaction_fails_cleanly_on_every_injected_failure_and_the_store_stays_usable() {
    let mut injected = 0;
    for op in Op::ALL {
        for n in 1.. {
            let what = format!("{op:?} #{n}");
            let tmp = tempfile::tempdir().unwrap();
            populate(tmp.path());
            let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
            let store =
                EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone())
                    .unwrap();
            faulty.fail_nth(op, n);
            let compacted = store.compact();
            let fired = faulty.triggered() > 0;
            faulty.fail_nth(op, 0);
            if !fired {
                let stats = compacted.unwrap();
                assert_eq!(stats.records, 4, "{what}: {stats:?}");
                assert!(stats.bytes_after < stats.bytes_before, "{what}: {stats:?}");
                check_populated(&store, &what);
                break;
            }
            injected += 1;
            let err = compacted.unwrap_err();
            assert!(err.to_string().contains("injected fault"), "{what}: {err}");
            // The same store goes on (on the old journal, or on the new one if the failure came
            // after the rename), and so does a fresh one on healthy storage.
            check_populated(&store, &what);
            let Begin::Execute(t) = store
                .begin(&keyed("after", b"x"), EffectKind::Unsafe)
                .unwrap()
            else {
                panic!("{what}: expected Execute")
            };
            store.complete(t, &json!("after")).unwrap();
            drop(store);
            let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
            assert!(
                no_temp_files(tmp.path()),
                "{what}: leftover removed at open"
            );
            check_populated(&store, &what);
            assert!(matches!(
                store
                    .begin(&keyed("after", b"x"), EffectKind::Unsafe)
                    .unwrap(),
                Begin::Replay(_)
            ));
            // And it compacts on healthy storage.
            assert_eq!(store.compact().unwrap().records, 5, "{what}");
            assert!(matches!(
                store
                    .begin(&keyed("forgotten", b"x"), EffectKind::Unsafe)
                    .unwrap(),
                Begin::Execute(_)
            ));
        }
    }
    // Remove (a leftover temporary file, absent here), Write and FsyncFile (the new file), Rename
    // and FsyncDir; the old journal is durable already after open, so it is not fdatasynced.
    assert_eq!(injected, 5, "faults injected");
}
