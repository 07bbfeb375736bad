//! One conformance suite for every exactly-once backend: the same cases, the same answers.
//!
//! Each case runs against the file backend (`EffectStore`, a journal in a temporary directory),
//! the in-memory one (`MemoryEffects`) and the PostgreSQL one
//! (`PgEffects`, a fresh database of a real PostgreSQL cluster this test process starts).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use toolgate_canon::Sha256Digest;
use toolgate_commit::{
    Begin, EffectBackend, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStatus,
    EffectStore, MemoryEffects, Resolution, Scope,
};

/// A backend under test, with whatever keeps it alive (its directory).
struct Subject {
    name: &'static str,
    backend: Arc<dyn EffectBackend>,
    _dir: Option<tempfile::TempDir>,
}

/// Every backend, configured alike: `wait` for keys held by live calls, `ttl` for finished ones.
fn backends(wait: Option<Duration>, ttl: Duration) -> Vec<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let mut config = EffectConfig::new(dir.path()).completed_ttl(ttl);
    if let Some(wait) = wait {
        config = config.wait_in_progress(wait);
    }
    let memory = MemoryEffects::with_config(&config);
    let postgres = {
        let url = toolgate_pgtest::PgCluster::shared()
            .unwrap()
            .create_database("effects")
            .unwrap();
        let store = toolgate_postgres::PgStore::connect(&url).unwrap();
        toolgate_postgres::PgEffects::open(store, &config).unwrap()
    };
    vec![
        Subject {
            name: "file",
            backend: Arc::new(EffectStore::open(config).unwrap()),
            _dir: Some(dir),
        },
        Subject {
            name: "memory",
            backend: Arc::new(memory),
            _dir: None,
        },
        Subject {
            name: "postgres",
            backend: Arc::new(postgres),
            _dir: None,
        },
    ]
}

fn each(check: impl Fn(&str, &dyn EffectBackend)) {
    for subject in backends(None, Duration::from_secs(3600)) {
        check(subject.name, subject.backend.as_ref());
    }
}

fn req(principal: &str, tool: &str, key: &str, args: &str) -> EffectRequest {
    EffectRequest {
        scope: Scope {
            principal: principal.into(),
            tool: tool.into(),
        },
        key: key.into(),
        fingerprint: Sha256Digest::of(args.as_bytes()),
    }
}

fn simple(key: &str, args: &str) -> EffectRequest {
    req("alice", "book", key, args)
}

fn result(n: u64) -> Value {
    json!({"booking": format!("b-{n}"), "nested": {"z": 1, "a": [true, null]}})
}

fn execute(name: &str, backend: &dyn EffectBackend, r: &EffectRequest, kind: EffectKind) -> Begin {
    match backend.begin(r, kind) {
        Ok(begin @ Begin::Execute(_)) => begin,
        other => panic!("{name}: expected Execute, got {other:?}"),
    }
}

fn ticket(begin: Begin) -> toolgate_commit::Ticket {
    match begin {
        Begin::Execute(ticket) => ticket,
        other => panic!("expected Execute, got {other:?}"),
    }
}

#[test]
fn executes_once_then_replays_the_stored_result() {
    each(|name, backend| {
        for kind in [EffectKind::Idempotent, EffectKind::Unsafe] {
            let r = simple(&format!("k-{kind:?}"), "seats=2");
            let t = ticket(execute(name, backend, &r, kind));
            assert_eq!(t.key(), r.key);
            assert_eq!(t.scope(), &r.scope);
            backend.complete(t, &result(1)).unwrap();
            for _ in 0..3 {
                match backend.begin(&r, kind).unwrap() {
                    Begin::Replay(value) => assert_eq!(value, result(1), "{name}"),
                    other => panic!("{name}: expected Replay, got {other:?}"),
                }
            }
            assert_eq!(
                backend.lookup(&r.scope, &r.key).unwrap(),
                Some(EffectStatus::Completed {
                    fingerprint: r.fingerprint,
                    result: result(1)
                }),
                "{name}"
            );
        }
        let counters = backend.counters()["book"];
        assert_eq!((counters.committed, counters.replayed), (2, 6), "{name}");
        backend.sync().unwrap();
        backend.compact().unwrap();
    });
}

#[test]
fn the_same_key_with_other_arguments_is_a_conflict_in_every_state() {
    each(|name, backend| {
        let kind = EffectKind::Unsafe;
        let conflict = |r: &EffectRequest| {
            let other = EffectRequest {
                fingerprint: Sha256Digest::of(b"other"),
                ..r.clone()
            };
            assert!(
                matches!(
                    backend.begin(&other, kind),
                    Err(EffectError::Conflict { .. })
                ),
                "{name}"
            );
        };
        let held = simple("held", "a");
        let t = ticket(execute(name, backend, &held, kind));
        conflict(&held);
        backend.complete(t, &result(2)).unwrap();
        conflict(&held);
        let failed = simple("failed", "a");
        let t = ticket(execute(name, backend, &failed, kind));
        backend.fail(t, "Error: refused", false).unwrap();
        conflict(&failed);
        assert_eq!(backend.counters()["book"].conflict, 3, "{name}");
    });
}

#[test]
fn failures_replay_or_retry_as_stored() {
    each(|name, backend| {
        let kind = EffectKind::Unsafe;
        let hard = simple("hard", "a");
        backend
            .fail(
                ticket(execute(name, backend, &hard, kind)),
                "Error: no seats",
                false,
            )
            .unwrap();
        match backend.begin(&hard, kind).unwrap() {
            Begin::ReplayFailure(error) => assert_eq!(error, "Error: no seats", "{name}"),
            other => panic!("{name}: expected ReplayFailure, got {other:?}"),
        }
        let soft = simple("soft", "a");
        backend
            .fail(
                ticket(execute(name, backend, &soft, kind)),
                "Error: timeout",
                true,
            )
            .unwrap();
        assert_eq!(
            backend.lookup(&soft.scope, &soft.key).unwrap(),
            Some(EffectStatus::Failed {
                fingerprint: soft.fingerprint,
                error: "Error: timeout".into(),
                retryable: true
            }),
            "{name}"
        );
        let t = ticket(execute(name, backend, &soft, kind));
        backend.complete(t, &result(3)).unwrap();
        assert!(matches!(
            backend.begin(&soft, kind).unwrap(),
            Begin::Replay(_)
        ));
    });
}

#[test]
fn an_abandoned_execution_is_indeterminate_or_taken_over_as_a_dead_owners() {
    each(|name, backend| {
        // Unsafe: indeterminate at once (for every process: its owner is pid 0), never re-run.
        let u = simple("abandoned-unsafe", "a");
        let t = ticket(execute(name, backend, &u, EffectKind::Unsafe));
        backend.abandon(t).unwrap();
        assert!(
            matches!(
                backend.lookup(&u.scope, &u.key).unwrap(),
                Some(EffectStatus::InProgress { live: false, .. })
            ),
            "{name}"
        );
        assert!(
            matches!(
                backend.begin(&u, EffectKind::Unsafe),
                Err(EffectError::Indeterminate { .. })
            ),
            "{name}"
        );
        // Other arguments under the key are still a conflict.
        assert!(
            matches!(
                backend.begin(&simple("abandoned-unsafe", "b"), EffectKind::Unsafe),
                Err(EffectError::Conflict { .. })
            ),
            "{name}"
        );
        backend
            .resolve(&u.scope, &u.key, Resolution::Completed(result(7)))
            .unwrap();
        match backend.begin(&u, EffectKind::Unsafe).unwrap() {
            Begin::Replay(value) => assert_eq!(value, result(7), "{name}"),
            other => panic!("{name}: expected Replay, got {other:?}"),
        }
        // Idempotent: taken over by the next call.
        let i = simple("abandoned-idempotent", "a");
        let t = ticket(execute(name, backend, &i, EffectKind::Idempotent));
        backend.abandon(t).unwrap();
        let t = ticket(execute(name, backend, &i, EffectKind::Idempotent));
        backend.complete(t, &result(8)).unwrap();
    });
}

#[test]
fn a_live_owner_holds_the_key_and_a_dead_one_is_taken_over_or_indeterminate() {
    each(|name, backend| {
        // Live: the ticket is held.
        let r = simple("live", "a");
        let t = ticket(execute(name, backend, &r, EffectKind::Unsafe));
        match backend.begin(&r, EffectKind::Unsafe) {
            Err(EffectError::InProgress { retry_after, .. }) => {
                assert!(retry_after >= Duration::from_secs(1), "{name}")
            }
            other => panic!("{name}: expected InProgress, got {other:?}"),
        }
        assert!(matches!(
            backend.lookup(&r.scope, &r.key).unwrap(),
            Some(EffectStatus::InProgress { live: true, .. })
        ));
        // Dead (the ticket dropped without an outcome): idempotent effects are taken over...
        drop(t);
        assert!(matches!(
            backend.lookup(&r.scope, &r.key).unwrap(),
            Some(EffectStatus::InProgress { live: false, .. })
        ));
        let t = ticket(execute(name, backend, &r, EffectKind::Idempotent));
        backend.complete(t, &result(4)).unwrap();

        // ...unsafe ones are indeterminate until an operator resolves them.
        let u = simple("unsafe", "a");
        drop(ticket(execute(name, backend, &u, EffectKind::Unsafe)));
        for _ in 0..2 {
            assert!(
                matches!(
                    backend.begin(&u, EffectKind::Unsafe),
                    Err(EffectError::Indeterminate { .. })
                ),
                "{name}"
            );
        }
        backend
            .resolve(&u.scope, &u.key, Resolution::Completed(result(5)))
            .unwrap();
        match backend.begin(&u, EffectKind::Unsafe).unwrap() {
            Begin::Replay(value) => assert_eq!(value, result(5), "{name}"),
            other => panic!("{name}: expected Replay, got {other:?}"),
        }
        let f = simple("forget", "a");
        drop(ticket(execute(name, backend, &f, EffectKind::Unsafe)));
        backend
            .resolve(&f.scope, &f.key, Resolution::Forget)
            .unwrap();
        assert_eq!(backend.lookup(&f.scope, &f.key).unwrap(), None, "{name}");
        let t = ticket(execute(name, backend, &f, EffectKind::Unsafe));
        // Only indeterminate records can be resolved.
        assert!(matches!(
            backend.resolve(&f.scope, &f.key, Resolution::Forget),
            Err(EffectError::NotIndeterminate { .. })
        ));
        backend.complete(t, &result(6)).unwrap();
        assert!(matches!(
            backend.resolve(&f.scope, &f.key, Resolution::Forget),
            Err(EffectError::NotIndeterminate { .. })
        ));
        assert!(matches!(
            backend.resolve(&f.scope, "never", Resolution::Forget),
            Err(EffectError::NotIndeterminate { .. })
        ));
        assert_eq!(backend.counters()["book"].indeterminate, 2, "{name}");
    });
}

#[test]
fn keys_are_scoped_to_principal_and_tool_and_checked() {
    each(|name, backend| {
        let kind = EffectKind::Idempotent;
        for (principal, tool) in [("alice", "book"), ("bob", "book"), ("alice", "cancel")] {
            let r = req(principal, tool, "same-key", principal);
            let t = ticket(execute(name, backend, &r, kind));
            backend.complete(t, &result(7)).unwrap();
        }
        for key in [
            String::new(),
            "x".repeat(toolgate_commit::MAX_KEY_BYTES + 1),
            "a\u{7}b".to_owned(),
        ] {
            assert!(
                matches!(
                    backend.begin(&simple(&key, "a"), kind),
                    Err(EffectError::InvalidKey { .. })
                ),
                "{name}"
            );
        }
        assert!(backend.begin(&simple(&"x".repeat(1024), "a"), kind).is_ok());
    });
}

#[test]
fn prune_removes_finished_records_past_the_window_only() {
    for subject in backends(None, Duration::ZERO) {
        let (name, backend) = (subject.name, subject.backend.as_ref());
        let kind = EffectKind::Unsafe;
        let done = simple("done", "a");
        backend
            .complete(ticket(execute(name, backend, &done, kind)), &result(8))
            .unwrap();
        let failed = simple("failed", "a");
        backend
            .fail(
                ticket(execute(name, backend, &failed, kind)),
                "Error",
                false,
            )
            .unwrap();
        let running = simple("running", "a");
        let held = ticket(execute(name, backend, &running, kind));
        let later = SystemTime::now() + Duration::from_secs(1);
        assert_eq!(backend.prune(later).unwrap(), 2, "{name}");
        assert_eq!(backend.lookup(&done.scope, &done.key).unwrap(), None);
        assert!(
            backend
                .lookup(&running.scope, &running.key)
                .unwrap()
                .is_some()
        );
        // A pruned key executes again.
        drop(ticket(execute(name, backend, &done, kind)));
        drop(held);
    }
}

#[test]
fn racing_calls_execute_once_and_a_waiting_call_replays() {
    for subject in backends(Some(Duration::from_secs(60)), Duration::from_secs(3600)) {
        let (name, backend) = (subject.name, Arc::clone(&subject.backend));
        let barrier = Arc::new(Barrier::new(16));
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let (backend, barrier) = (Arc::clone(&backend), Arc::clone(&barrier));
                thread::spawn(move || {
                    barrier.wait();
                    let r = simple("raced", "a");
                    match backend.begin(&r, EffectKind::Unsafe).unwrap() {
                        Begin::Execute(t) => {
                            // Hold the key a moment so others find it in progress and wait.
                            thread::sleep(Duration::from_millis(20));
                            backend.complete(t, &result(9)).unwrap();
                            true
                        }
                        Begin::Replay(value) => {
                            assert_eq!(value, result(9));
                            false
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                })
            })
            .collect();
        let executions = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&executed| executed)
            .count();
        assert_eq!(executions, 1, "{name}");
        let counters = backend.counters()["book"];
        assert_eq!((counters.committed, counters.replayed), (1, 15), "{name}");
    }
}
