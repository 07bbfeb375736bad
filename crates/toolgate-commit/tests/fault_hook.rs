//! The `fault-injection` crash points: reached in order on a publishing commit, never on a replay.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]
#![cfg(feature = "fault-injection")]

use std::fs;
use std::sync::{Arc, Mutex};

use serde_json::json;
use toolgate_commit::{
    CommitConfig, CommitOutcome, CommitStore, FaultHook, FileCommitStore, IdempotencyKey,
};

/// Each crash point reached, whether the record existed then, and how many of the key's temporary
/// files existed then.
type Seen = Arc<Mutex<Vec<(&'static str, bool, usize)>>>;

/// A store whose hook records each point together with what is on disk at that moment.
fn recording_store(dir: &std::path::Path, key: &IdempotencyKey) -> (FileCommitStore, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = dir.join(format!("{}.json", key.digest().to_hex()));
    let temp_prefix = format!(".{}.", key.digest().to_hex());
    let (seen_in_hook, dir_in_hook) = (Arc::clone(&seen), dir.to_path_buf());
    let hook: FaultHook = Arc::new(move |point| {
        let temps = fs::read_dir(&dir_in_hook)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name().into_string().unwrap();
                name.starts_with(&temp_prefix) && name.ends_with(".tmp")
            })
            .count();
        seen_in_hook
            .lock()
            .unwrap()
            .push((point, record.exists(), temps));
    });
    let store = FileCommitStore::open_with(CommitConfig::new(dir).fault_hook(hook)).unwrap();
    (store, seen)
}

#[test]
fn hook_sees_both_points_in_order_and_nothing_on_replay_or_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let key = IdempotencyKey::new("req-0001").unwrap();
    let (store, seen) = recording_store(tmp.path(), &key);
    assert!(format!("{store:?}").contains("<hook>"));

    let payload = json!({"request_id": "req-0001", "text": "t"});
    assert_eq!(
        store.commit(&key, &payload).unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            // Before publish: the temporary file exists, the record does not yet.
            ("commit.before_publish", false, 1),
            // After publish: the record exists and the temporary name is gone.
            ("commit.after_publish", true, 0),
        ]
    );

    seen.lock().unwrap().clear();
    assert_eq!(store.commit(&key, &payload).unwrap(), CommitOutcome::Replay);
    assert!(store.commit(&key, &json!({"other": true})).is_err());
    assert_eq!(store.get(&key).unwrap(), Some(payload));
    store.list().unwrap();
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
}

#[test]
fn hook_runs_once_per_publishing_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let names = Arc::new(Mutex::new(Vec::new()));
    let names_in_hook = Arc::clone(&names);
    let hook: FaultHook = Arc::new(move |point| names_in_hook.lock().unwrap().push(point));
    let store = FileCommitStore::open_with(CommitConfig::new(tmp.path()).fault_hook(hook)).unwrap();
    for i in 0..3 {
        let key = IdempotencyKey::new(format!("k{i}")).unwrap();
        store.commit(&key, &json!(i)).unwrap();
        store.commit(&key, &json!(i)).unwrap();
    }
    let expected: Vec<&str> = ["commit.before_publish", "commit.after_publish"].repeat(3);
    assert_eq!(*names.lock().unwrap(), expected);
}
