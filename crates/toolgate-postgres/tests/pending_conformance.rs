//! The behaviours every store of pending confirmations (`PendingStore`) must have, run against
//! this process's memory (`MemoryPending`), a ledger's file (`FilePending`) and a real PostgreSQL
//! database: a token confirmed once
//! with the preview's exact summary, refused to another principal without being consumed,
//! rejected, expired, remembered dead then forgotten, locked after the fifth wrong summary, the
//! per-principal cap, and exactly one winner among concurrent confirmations. The last cases take
//! the database down and back, and show the file store's tokens surviving a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};
use toolgate_canon::Sha256Digest;
use toolgate_postgres::{PgPending, PgStore};
use toolgate_state::pending::{
    ConfirmError, ConfirmToken, FilePending, MAX_TTL, MAX_WRONG_SUMMARIES, PendingAction,
    PendingActions,
};

const TTL: Duration = Duration::from_secs(300);

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn action(principal: &str) -> PendingAction {
    let mut arguments = Map::new();
    arguments.insert("path".to_owned(), Value::from("/srv/notes/a.txt"));
    PendingAction {
        principal: principal.to_owned(),
        tool: "delete_note".to_owned(),
        args_digest: Sha256Digest::of_json_object(&arguments),
        arguments,
        content_hash: Sha256Digest::of(b"content"),
        summary: "delete note a.txt (12 bytes)".to_owned(),
        idempotency_key: Some("preview-key-1".to_owned()),
    }
}

fn issue(p: &PendingActions, principal: &str, now: SystemTime) -> String {
    p.prepare(action(principal), now).unwrap().token.to_string()
}

const SUMMARY: &str = "delete note a.txt (12 bytes)";

/// The same pending actions in every store: memory, and a fresh database of the test process's
/// PostgreSQL cluster.
fn stores(ttl: Duration) -> Vec<PendingActions> {
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database("pending")
        .unwrap();
    let store = PgPending::open(PgStore::connect(&url).unwrap()).unwrap();
    vec![
        PendingActions::new(ttl),
        PendingActions::with_store(ttl, Arc::new(FilePending::new(fresh_dir()))),
        PendingActions::with_store(ttl, Arc::new(store)),
    ]
}

/// A directory of its own for one file store, under cargo's scratch directory for tests.
fn fresh_dir() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pending-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The counts, which every case expects the store to give.
trait Counts {
    fn live_count_ok(&self, principal: &str, now: SystemTime) -> usize;
    fn len_ok(&self, now: SystemTime) -> usize;
}

impl Counts for PendingActions {
    fn live_count_ok(&self, principal: &str, now: SystemTime) -> usize {
        self.live_count(principal, now).unwrap()
    }

    fn len_ok(&self, now: SystemTime) -> usize {
        self.len(now).unwrap()
    }
}

#[test]
fn prepare_then_confirm_returns_the_action_once() {
    for p in stores(TTL) {
        let issued = p.prepare(action("alice"), t(0)).unwrap();
        assert_eq!(issued.expires_at, t(300));
        let token = issued.token.as_str();
        assert!(ConfirmToken::is_well_formed(token));
        assert_eq!(p.live_count_ok("alice", t(1)), 1);
        let got = p.confirm(token, SUMMARY, "alice", t(1)).unwrap();
        assert_eq!(got, action("alice"));
        assert_eq!(p.live_count_ok("alice", t(1)), 0);
        assert_eq!(
            p.confirm(token, SUMMARY, "alice", t(2)),
            Err(ConfirmError::Used)
        );
        assert_eq!(p.reject(token, "alice", t(2)), Err(ConfirmError::Used));
    }
}

#[test]
fn tokens_are_distinct_random_hex_and_redacted_in_debug() {
    for p in stores(TTL) {
        let a = p.prepare(action("alice"), t(0)).unwrap();
        let b = p.prepare(action("alice"), t(0)).unwrap();
        assert_ne!(a.token, b.token);
        assert_eq!(a.token.as_str().len(), 64);
        assert!(!format!("{a:?}").contains(a.token.as_str()));
        assert!(!format!("{:?}", action("alice")).contains("/srv/notes"));
    }
}

#[test]
fn malformed_and_unknown_tokens() {
    for p in stores(TTL) {
        for bad in [
            "",
            "abc",
            &"A".repeat(64),
            &"g".repeat(64),
            &"a".repeat(65),
            &"é".repeat(32),
        ] {
            assert_eq!(
                p.confirm(bad, SUMMARY, "alice", t(0)),
                Err(ConfirmError::Malformed)
            );
            assert_eq!(p.reject(bad, "alice", t(0)), Err(ConfirmError::Malformed));
        }
        let unknown = "0".repeat(64);
        assert_eq!(
            p.confirm(&unknown, SUMMARY, "alice", t(0)),
            Err(ConfirmError::Unknown)
        );
        assert_eq!(
            p.reject(&unknown, "alice", t(0)),
            Err(ConfirmError::Unknown)
        );
    }
}

#[test]
fn foreign_principal_is_refused_without_consuming() {
    for p in stores(TTL) {
        let token = issue(&p, "alice", t(0));
        assert_eq!(
            p.confirm(&token, SUMMARY, "bob", t(1)),
            Err(ConfirmError::Foreign)
        );
        assert_eq!(p.reject(&token, "bob", t(1)), Err(ConfirmError::Foreign));
        // Wrong summaries from bob would not count either: still 5 attempts for alice.
        for _ in 0..10 {
            assert_eq!(
                p.confirm(&token, "x", "bob", t(1)),
                Err(ConfirmError::Foreign)
            );
        }
        p.confirm(&token, SUMMARY, "alice", t(2)).unwrap();
        // After use, bob still learns only "foreign", not "used".
        assert_eq!(
            p.confirm(&token, SUMMARY, "bob", t(3)),
            Err(ConfirmError::Foreign)
        );
        assert!(!ConfirmError::Foreign.to_string().contains("used"));
    }
}

#[test]
fn reject_kills_the_token() {
    for p in stores(TTL) {
        let token = issue(&p, "alice", t(0));
        assert_eq!(p.reject(&token, "alice", t(1)).unwrap(), action("alice"));
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(2)),
            Err(ConfirmError::Rejected)
        );
        assert_eq!(p.reject(&token, "alice", t(2)), Err(ConfirmError::Rejected));
        assert_eq!(p.live_count_ok("alice", t(2)), 0);
    }
}

#[test]
fn expiry_then_forgetting() {
    for p in stores(TTL) {
        let token = issue(&p, "alice", t(0));
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(300)),
            Err(ConfirmError::Expired)
        );
        assert_eq!(
            p.reject(&token, "alice", t(400)),
            Err(ConfirmError::Expired)
        );
        assert_eq!(p.live_count_ok("alice", t(300)), 0);
        // Remembered until ttl after expiry, then unknown.
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(599)),
            Err(ConfirmError::Expired)
        );
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(600)),
            Err(ConfirmError::Unknown)
        );
        assert_eq!(p.len_ok(t(600)), 0);
    }
}

#[test]
fn used_and_rejected_are_remembered_then_swept() {
    for p in stores(TTL) {
        let used = issue(&p, "alice", t(0));
        let rejected = issue(&p, "alice", t(0));
        p.confirm(&used, SUMMARY, "alice", t(1)).unwrap();
        p.reject(&rejected, "alice", t(1)).unwrap();
        // Used beats expired: a reuse after expiry still says why it is dead.
        assert_eq!(
            p.confirm(&used, SUMMARY, "alice", t(400)),
            Err(ConfirmError::Used)
        );
        assert_eq!(
            p.confirm(&rejected, SUMMARY, "alice", t(400)),
            Err(ConfirmError::Rejected)
        );
        assert_eq!(p.len_ok(t(599)), 2);
        assert_eq!(p.len_ok(t(600)), 0);
        assert_eq!(
            p.confirm(&used, SUMMARY, "alice", t(600)),
            Err(ConfirmError::Unknown)
        );
    }
}

#[test]
fn wrong_summary_does_not_consume_until_the_fifth() {
    for p in stores(TTL) {
        let token = issue(&p, "alice", t(0));
        // Byte-exact: trailing space, case and Unicode normalisation all differ.
        for (i, wrong) in [
            "delete note a.txt (12 bytes) ",
            "Delete note a.txt (12 bytes)",
            "",
        ]
        .iter()
        .enumerate()
        {
            let left = MAX_WRONG_SUMMARIES - 1 - u32::try_from(i).unwrap();
            assert_eq!(
                p.confirm(&token, wrong, "alice", t(1)),
                Err(ConfirmError::WrongSummary {
                    attempts_left: left
                })
            );
        }
        p.confirm(&token, SUMMARY, "alice", t(2)).unwrap();

        let token = issue(&p, "alice", t(0));
        for left in (0..MAX_WRONG_SUMMARIES).rev() {
            assert_eq!(
                p.confirm(&token, "nope", "alice", t(1)),
                Err(ConfirmError::WrongSummary {
                    attempts_left: left
                })
            );
        }
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(1)),
            Err(ConfirmError::Locked)
        );
        assert_eq!(p.reject(&token, "alice", t(1)), Err(ConfirmError::Locked));
        assert_eq!(p.live_count_ok("alice", t(1)), 0);
        assert!(
            ConfirmError::WrongSummary { attempts_left: 0 }
                .to_string()
                .contains("get a new preview")
        );
    }
}

#[test]
fn cap_per_principal() {
    for p in stores(TTL) {
        let p = p.with_max_per_principal(3);
        let tokens: Vec<_> = (0..3).map(|_| issue(&p, "alice", t(0))).collect();
        let err = p.prepare(action("alice"), t(0)).unwrap_err();
        assert_eq!(err, ConfirmError::TooMany { limit: 3 });
        assert!(
            err.to_string()
                .contains("confirm or reject pending actions, or wait for them to expire")
        );
        // Other principals are unaffected.
        issue(&p, "bob", t(0));
        // Confirming, rejecting or expiry frees a slot.
        p.confirm(&tokens[0], SUMMARY, "alice", t(1)).unwrap();
        issue(&p, "alice", t(1));
        p.reject(&tokens[1], "alice", t(1)).unwrap();
        issue(&p, "alice", t(1));
        assert!(p.prepare(action("alice"), t(299)).is_err());
        issue(&p, "alice", t(300));
    }
}

#[test]
fn default_cap_is_100() {
    for p in stores(TTL) {
        for _ in 0..100 {
            issue(&p, "alice", t(0));
        }
        assert_eq!(
            p.prepare(action("alice"), t(0)),
            Err(ConfirmError::TooMany { limit: 100 })
        );
    }
}

#[test]
fn concurrent_confirms_of_one_token_exactly_one_wins() {
    for p in stores(TTL) {
        let p = Arc::new(p);
        for _ in 0..50 {
            let token = issue(&p, "alice", t(0));
            let barrier = Arc::new(Barrier::new(2));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (p, token, barrier) = (Arc::clone(&p), token.clone(), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        barrier.wait();
                        p.confirm(&token, SUMMARY, "alice", t(1))
                    })
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(
                results.iter().filter(|r| r.is_ok()).count(),
                1,
                "{results:?}"
            );
            assert!(results.contains(&Err(ConfirmError::Used)));
        }
    }
}

#[test]
fn memory_is_bounded_by_sweeping() {
    for p in stores(Duration::from_secs(10)) {
        for i in 0..1_000 {
            let token = issue(&p, "alice", t(i));
            if i % 2 == 0 {
                p.confirm(&token, SUMMARY, "alice", t(i)).unwrap();
            }
        }
        // Only tokens issued in the last 2·ttl remain.
        assert!(p.len_ok(t(1_000)) <= 20, "{}", p.len_ok(t(1_000)));
        assert_eq!(p.len_ok(t(2_000)), 0);
    }
}

#[test]
fn codes_prefix_messages() {
    let all = [
        ConfirmError::Malformed,
        ConfirmError::Unknown,
        ConfirmError::Foreign,
        ConfirmError::Used,
        ConfirmError::Rejected,
        ConfirmError::Expired,
        ConfirmError::WrongSummary { attempts_left: 2 },
        ConfirmError::Locked,
        ConfirmError::TooMany { limit: 100 },
        ConfirmError::Random {
            cause: "x".to_owned(),
        },
        ConfirmError::Store {
            cause: "x".to_owned(),
        },
    ];
    for e in all {
        assert!(e.to_string().starts_with(&format!("{}: ", e.code())), "{e}");
    }
    assert!(
        ConfirmError::Expired
            .to_string()
            .contains("call the tool again to get a new preview")
    );
}

#[test]
fn ttl_is_clamped_and_clock_edge_cases_do_not_panic() {
    let p = PendingActions::new(Duration::MAX);
    assert_eq!(p.ttl(), MAX_TTL);
    // A clock that goes backwards after expiry: the token stays expired.
    let p = PendingActions::new(Duration::from_secs(10));
    let token = issue(&p, "alice", t(0));
    assert_eq!(
        p.confirm(&token, SUMMARY, "alice", t(10)),
        Err(ConfirmError::Expired)
    );
    assert_eq!(
        p.confirm(&token, SUMMARY, "alice", t(5)),
        Err(ConfirmError::Expired)
    );
    // ttl zero: born expired and, with nothing to remember it for, forgotten at once.
    let p = PendingActions::new(Duration::ZERO);
    let token = issue(&p, "alice", t(0));
    assert_eq!(
        p.confirm(&token, SUMMARY, "alice", t(0)),
        Err(ConfirmError::Unknown)
    );
    assert_eq!(p.len_ok(t(0)), 0);
}

/// A database that stops answering issues, confirms and rejects nothing, saying why
/// without the password; a token issued before is confirmed once it is back.
#[test]
fn database_failures_do_nothing_and_name_the_cause() {
    let cluster = toolgate_pgtest::PgCluster::start().unwrap();
    let url = cluster.create_database("pending_down").unwrap();
    let store = PgPending::open(PgStore::connect(&url).unwrap()).unwrap();
    let p = PendingActions::with_store(TTL, Arc::new(store));
    let token = issue(&p, "alice", t(0));
    cluster.stop_immediate().unwrap();
    let refusals = [
        p.prepare(action("alice"), t(1)).map(drop),
        p.confirm(&token, SUMMARY, "alice", t(1)).map(drop),
        p.reject(&token, "alice", t(1)).map(drop),
    ];
    for refusal in refusals {
        let error = refusal.unwrap_err();
        assert_eq!(error.code(), "store_unavailable", "{error}");
        assert!(error.to_string().contains("PostgreSQL"), "{error}");
        assert!(
            !error.to_string().contains(toolgate_pgtest::PASSWORD),
            "{error}"
        );
    }
    cluster.start_again().unwrap();
    let confirmed = (0..300).find_map(|_| match p.confirm(&token, SUMMARY, "alice", t(2)) {
        Err(ConfirmError::Store { .. }) => {
            std::thread::sleep(Duration::from_millis(100));
            None
        }
        other => Some(other),
    });
    assert_eq!(confirmed, Some(Ok(action("alice"))));
}

/// A preview issued by one process is confirmed by another on the same directory (a restart, or
/// a second server on the ledger), once; the file holds the token's hash, never the token.
#[test]
fn a_file_stores_token_survives_a_restart_and_is_confirmed_once() {
    let dir = fresh_dir();
    let first = PendingActions::with_store(TTL, Arc::new(FilePending::new(&dir)));
    let token = issue(&first, "alice", t(0));
    drop(first);
    let file = std::fs::read_to_string(dir.join("pending.json")).unwrap();
    assert!(!file.contains(&token), "the token itself is not stored");
    let second = PendingActions::with_store(TTL, Arc::new(FilePending::new(&dir)));
    assert_eq!(
        second.confirm(&token, SUMMARY, "alice", t(1)),
        Ok(action("alice"))
    );
    assert_eq!(
        second.confirm(&token, SUMMARY, "alice", t(2)),
        Err(ConfirmError::Used)
    );
    std::fs::write(dir.join("pending.json"), "{not json").unwrap();
    let error = second.prepare(action("alice"), t(3)).unwrap_err();
    assert_eq!(error.code(), "store_unavailable", "{error}");
    assert!(error.to_string().contains("pending.json"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}
