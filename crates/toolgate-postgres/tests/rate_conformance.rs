//! The behaviours every rate-limit bucket store (`RateStore`) must have, run against this
//! process's memory (`RateLimiter`), a ledger's file (`FileRates`) and a real PostgreSQL database,
//! each shared by two handles: a bucket starts full and then refuses with the time to wait, a call's
//! keys are taken all or nothing, buckets of other keys are untouched, and concurrent takers
//! never get more than the burst between them. A database that goes down and comes back, and a
//! broken buckets file, are the last cases.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use toolgate_postgres::{PgRates, PgStore};
use toolgate_state::{FileRates, Limit, RateLimiter, RateStore};

/// A store, and a second handle on the same buckets (another replica on the database).
struct Subject {
    name: &'static str,
    store: Arc<dyn RateStore>,
    other: Arc<dyn RateStore>,
    _dir: Option<tempfile::TempDir>,
}

fn subjects(database: &str) -> Vec<Subject> {
    let memory: Arc<dyn RateStore> = Arc::new(RateLimiter::new());
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database(database)
        .unwrap();
    let open = || -> Arc<dyn RateStore> {
        Arc::new(PgRates::open(PgStore::connect(&url).unwrap()).unwrap())
    };
    let dir = tempfile::tempdir().unwrap();
    let file = || -> Arc<dyn RateStore> { Arc::new(FileRates::new(dir.path().join("ledger"))) };
    vec![
        Subject {
            name: "memory",
            store: Arc::clone(&memory),
            other: memory,
            _dir: None,
        },
        Subject {
            name: "file",
            store: file(),
            other: file(),
            _dir: Some(dir),
        },
        Subject {
            name: "postgres",
            store: open(),
            other: open(),
            _dir: None,
        },
    ]
}

/// A key whose bucket holds `burst` tokens and refills one per minute (nothing refills during a
/// test).
fn key(name: &str, burst: u32) -> (String, Limit) {
    (
        name.to_owned(),
        Limit {
            burst,
            per_minute: 1,
        },
    )
}

#[test]
fn a_bucket_starts_full_and_then_refuses_with_the_time_to_wait() {
    for subject in subjects("rates_full") {
        let name = subject.name;
        let keys = [key("tool:send", 3)];
        for _ in 0..3 {
            assert_eq!(subject.store.take(&keys).unwrap(), Ok(()), "{name}");
        }
        let limited = subject.other.take(&keys).unwrap().unwrap_err();
        assert_eq!(limited.key_index, 0, "{name}");
        assert!(
            limited.retry_after > Duration::ZERO && limited.retry_after <= Duration::from_secs(60),
            "{name}: {limited:?}"
        );
        assert!(limited.retry_after_secs() >= 1, "{name}");
    }
}

#[test]
fn a_calls_keys_are_taken_all_or_nothing() {
    for subject in subjects("rates_all_or_nothing") {
        let name = subject.name;
        let tool = key("tool:send", 1);
        let principal = key("principal:p", 5);
        let both = [tool.clone(), principal.clone()];
        assert_eq!(subject.store.take(&both).unwrap(), Ok(()), "{name}");
        // The tool's bucket is empty: the call is refused, naming it, and the principal's
        // bucket keeps the token the refused call would have taken.
        let limited = subject.store.take(&both).unwrap().unwrap_err();
        assert_eq!(limited.key_index, 0, "{name}");
        for _ in 0..4 {
            assert_eq!(
                subject
                    .other
                    .take(std::slice::from_ref(&principal))
                    .unwrap(),
                Ok(()),
                "{name}"
            );
        }
        assert!(subject.store.take(&[principal]).unwrap().is_err(), "{name}");
        // Another key's bucket is its own.
        assert_eq!(
            subject.store.take(&[key("tool:other", 1)]).unwrap(),
            Ok(()),
            "{name}"
        );
    }
}

#[test]
fn concurrent_takers_never_get_more_than_the_burst_between_them() {
    for subject in subjects("rates_concurrent") {
        let name = subject.name;
        let keys = vec![key("tool:shared", 20)];
        let takers: Vec<_> = [Arc::clone(&subject.store), Arc::clone(&subject.other)]
            .into_iter()
            .map(|store| {
                let keys = keys.clone();
                std::thread::spawn(move || {
                    (0..30)
                        .filter(|_| store.take(&keys).unwrap().is_ok())
                        .count()
                })
            })
            .collect();
        let granted: usize = takers.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 20, "{name}");
    }
}

/// A database that stops answering refuses to count (the check then refuses the call),
/// naming the database and never the password; counting resumes when it is back.
#[test]
fn database_buckets_fail_closed_while_the_database_is_down() {
    let cluster = toolgate_pgtest::PgCluster::start().unwrap();
    let url = cluster.create_database("rates_down").unwrap();
    let rates = PgRates::open(PgStore::connect(&url).unwrap()).unwrap();
    let keys = [(
        "tool:send".to_owned(),
        Limit {
            burst: 5,
            per_minute: 60,
        },
    )];
    rates.take(&keys).unwrap().unwrap();
    cluster.stop_immediate().unwrap();
    let cause = rates.take(&keys).unwrap_err();
    assert!(cause.contains("PostgreSQL"), "{cause}");
    assert!(!cause.contains(toolgate_pgtest::PASSWORD), "{cause}");
    cluster.start_again().unwrap();
    // The pool replaces the broken connections: counting works again without a restart.
    let back = (0..300).find_map(|_| match rates.take(&keys) {
        Ok(taken) => Some(taken),
        Err(_) => {
            std::thread::sleep(Duration::from_millis(100));
            None
        }
    });
    assert_eq!(back, Some(Ok(())));
}

/// A buckets file that is not one refuses (the check then refuses the call), naming the file
/// and the fix; removing it starts every bucket full.
#[test]
fn a_broken_buckets_file_fails_closed_until_removed() {
    let dir = tempfile::tempdir().unwrap();
    let rates = FileRates::new(dir.path());
    let keys = [key("tool:send", 2)];
    rates.take(&keys).unwrap().unwrap();
    assert!(rates.path().is_file(), "a bucket short of full is kept");
    std::fs::write(rates.path(), "{not json").unwrap();
    let cause = rates.take(&keys).unwrap_err();
    assert!(
        cause.contains(&rates.path().display().to_string()),
        "{cause}"
    );
    assert!(cause.contains("remove it"), "{cause}");
    std::fs::remove_file(rates.path()).unwrap();
    assert_eq!(rates.take(&keys).unwrap(), Ok(()));
}
