//! Crash model with injected I/O failures (in the manner of redb's crash tests): fail the Nth call
//! of every storage operation during a begin/complete cycle, then reopen on healthy storage, retry,
//! and check the invariants: never a panic, never two executions of an unsafe effect, never a lost
//! completed result, and a clear answer for every retry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};
use toolgate_commit::effect::{
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
    // begin and complete each write, fsync and rename once; open and the cycle fsync the directory
    // three times after the fault is armed; removals only happen on error paths.
    assert_eq!(total, 2 * 8, "faults injected");
}

#[test]
fn failed_fsync_of_the_directory_after_complete_still_replays() {
    let tmp = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let store =
        EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone()).unwrap();
    let Begin::Execute(ticket) = store.begin(&req(), EffectKind::Unsafe).unwrap() else {
        panic!()
    };
    faulty.fail_nth(Op::FsyncDir, 1);
    let err = store.complete(ticket, &result()).unwrap_err();
    assert!(
        matches!(
            err,
            EffectError::Io {
                op: "fsync directory",
                ..
            }
        ),
        "{err}"
    );
    // Same store, storage healthy again: the retry replays (after fsyncing the directory).
    match store.begin(&req(), EffectKind::Unsafe).unwrap() {
        Begin::Replay(v) => assert_eq!(v, result()),
        other => panic!("expected Replay, got {other:?}"),
    }
}

#[test]
fn failed_rename_and_failed_cleanup_leave_an_orphan_that_open_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let store =
        EffectStore::open_with_storage(EffectConfig::new(tmp.path()), faulty.clone()).unwrap();
    faulty.fail_nth(Op::Rename, 1);
    faulty.fail_nth(Op::Remove, 1);
    let err = store.begin(&req(), EffectKind::Unsafe).unwrap_err();
    assert!(matches!(err, EffectError::Io { .. }), "{err}");
    assert_eq!(faulty.triggered(), 2);
    assert!(
        !no_temp_files(tmp.path()),
        "the failed removal left the temporary file"
    );
    drop(store);
    let store = EffectStore::open(EffectConfig::new(tmp.path())).unwrap();
    assert!(no_temp_files(tmp.path()));
    // Nothing was written: the retry executes.
    assert!(matches!(
        store.begin(&req(), EffectKind::Unsafe).unwrap(),
        Begin::Execute(_)
    ));
}
