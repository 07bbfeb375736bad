//! The behaviours every kill-switch store (`HaltStore`) must have, run against the ledger's files,
//! memory and a real PostgreSQL database: a halt and its resume,
//! the halt it replaced, tenants kept apart from everyone and from each other, and two handles on
//! one store seeing each other's halts on the next read. What only the file store does (its
//! format, failing closed on a broken file, its durable writes) is tested beside it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use toolgate_postgres::{PgHalts, PgStore};
use toolgate_state::{GuardError, KillSwitch, Status};

/// A store, and a second handle on the same store (another process on the ledger, another
/// replica on the database, the same memory).
struct Subject {
    name: &'static str,
    switch: KillSwitch,
    other: KillSwitch,
    _dir: Option<tempfile::TempDir>,
}

fn subjects() -> Vec<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let memory = KillSwitch::in_memory();
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database("halt_conformance")
        .unwrap();
    let connect = || {
        KillSwitch::with_store(Arc::new(
            PgHalts::open(PgStore::connect(&url).unwrap()).unwrap(),
        ))
    };
    vec![
        Subject {
            name: "file",
            switch: KillSwitch::new(dir.path()),
            other: KillSwitch::new(dir.path()),
            _dir: Some(dir),
        },
        Subject {
            name: "memory",
            switch: memory.clone(),
            other: memory,
            _dir: None,
        },
        Subject {
            name: "postgres",
            switch: connect(),
            other: connect(),
            _dir: None,
        },
    ]
}

fn at(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

#[test]
fn a_halt_is_in_force_until_resumed_and_resume_returns_it() {
    for subject in subjects() {
        let (name, switch) = (subject.name, &subject.switch);
        assert_eq!(switch.status(), Status::Running, "{name}");
        assert_eq!(
            switch.resume().unwrap(),
            None,
            "{name}: resuming a running switch"
        );
        let (halt, previous) = switch.halt_at("disk full", "alice", at(42)).unwrap();
        assert_eq!(previous, None, "{name}");
        assert_eq!(
            (halt.reason.as_str(), halt.by.as_str()),
            ("disk full", "alice")
        );
        assert_eq!(halt.since_ns, 42, "{name}: the time is kept exactly");
        assert_eq!(switch.status(), Status::Halted(halt.clone()), "{name}");
        assert_eq!(switch.resume().unwrap(), Some(halt), "{name}");
        assert_eq!(switch.status(), Status::Running, "{name}");
    }
}

#[test]
fn halting_while_halted_replaces_and_returns_the_previous_halt() {
    for subject in subjects() {
        let (name, switch) = (subject.name, &subject.switch);
        let (first, _) = switch.halt_at("first", "ops", at(1)).unwrap();
        // A time of today's order (PostgreSQL keeps i64 nanoseconds: up to the year 2262).
        let (second, previous) = switch
            .halt_at("second", "ops", at(1_800_000_000_000_000_000))
            .unwrap();
        assert_eq!(previous, Some(first), "{name}");
        assert_eq!(switch.status(), Status::Halted(second.clone()), "{name}");
        assert_eq!(switch.resume().unwrap(), Some(second), "{name}");
    }
}

#[test]
fn another_handle_on_the_same_store_sees_the_halt_on_its_next_read() {
    for subject in subjects() {
        let name = subject.name;
        let halt = subject.other.halt("incident 42", "ops").unwrap();
        assert_eq!(
            subject.switch.status(),
            Status::Halted(halt.clone()),
            "{name}"
        );
        assert_eq!(subject.switch.resume().unwrap(), Some(halt), "{name}");
        assert_eq!(subject.other.status(), Status::Running, "{name}");
    }
}

#[test]
fn tenants_are_kept_apart_from_everyone_and_from_each_other() {
    for subject in subjects() {
        let (name, everyone) = (subject.name, &subject.switch);
        let acme = everyone.for_tenant("acme").unwrap();
        let globex = subject.other.for_tenant("globex").unwrap();
        assert_eq!(acme.tenant(), Some("acme"), "{name}");
        let halt = acme.halt("acme's incident", "ops").unwrap();
        assert_eq!(acme.status(), Status::Halted(halt.clone()), "{name}");
        assert_eq!(globex.status(), Status::Running, "{name}");
        assert_eq!(everyone.status(), Status::Running, "{name}");
        // The same tenant through the other handle.
        let acme_too = subject.other.for_tenant("acme").unwrap();
        assert_eq!(acme_too.status(), Status::Halted(halt.clone()), "{name}");
        everyone.halt("all stop", "ops").unwrap();
        assert_eq!(acme.resume().unwrap(), Some(halt), "{name}");
        assert!(everyone.resume().unwrap().is_some(), "{name}");
        assert_eq!(acme.status(), Status::Running, "{name}");
        assert!(matches!(
            everyone.for_tenant("a/b"),
            Err(GuardError::InvalidTenant { .. })
        ));
    }
}

#[test]
fn an_invalid_reason_or_author_is_refused_before_the_store_is_touched() {
    for subject in subjects() {
        let (name, switch) = (subject.name, &subject.switch);
        assert!(matches!(
            switch.halt("", "ops"),
            Err(GuardError::InvalidReason { .. })
        ));
        assert!(matches!(
            switch.halt("line\nbreak", "ops"),
            Err(GuardError::InvalidReason { .. })
        ));
        assert!(matches!(
            switch.halt("ok", "a\u{7}b"),
            Err(GuardError::InvalidBy { .. })
        ));
        assert_eq!(switch.status(), Status::Running, "{name}");
    }
}
