//! Single-threaded behaviour of the file store: layout, replay, conflict, listing, garbage on disk.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolgate_canon::canonical_value;
use toolgate_commit::{CommitError, CommitOutcome, CommitStore, FileCommitStore, IdempotencyKey};

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::new(s).unwrap()
}

/// Every entry name in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    out.sort();
    out
}

fn record_names(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect()
}

#[test]
fn commit_then_replay_then_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    let k = key("req-0001");
    let payload = json!({"text": "gate aplicado", "request_id": "req-0001"});

    assert_eq!(
        store.commit(&k, &payload).unwrap(),
        CommitOutcome::Committed
    );
    let path = store.path_for(&k);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(
        bytes,
        br#"{"request_id":"req-0001","text":"gate aplicado"}"#
    );
    assert_eq!(bytes, canonical_value(&payload));

    // Same payload built with the other key order: canonical bytes match, so it replays.
    let reordered: Value =
        serde_json::from_str(r#"{"request_id":"req-0001","text":"gate aplicado"}"#).unwrap();
    assert_eq!(store.commit(&k, &reordered).unwrap(), CommitOutcome::Replay);
    assert_eq!(store.commit(&k, &payload).unwrap(), CommitOutcome::Replay);

    let other = json!({"request_id": "req-0001", "text": "something else"});
    match store.commit(&k, &other) {
        Err(CommitError::Conflict { key_digest }) => assert_eq!(key_digest, k.digest()),
        res => panic!("expected Conflict, got {res:?}"),
    }
    assert_eq!(fs::read(&path).unwrap(), bytes, "a conflict must not write");
    assert_eq!(store.get(&k).unwrap(), Some(payload));
    assert_eq!(record_names(tmp.path()).len(), 1);
}

#[test]
fn layout_matches_the_server_contract() {
    // LEDGER_DIR/notes/<sha256-hex of request_id>.json holding the canonical payload, no newline.
    let tmp = tempfile::tempdir().unwrap();
    let notes = tmp.path().join("ledger").join("notes");
    let store = FileCommitStore::open(&notes).unwrap();
    let k = key("abc");
    store
        .commit(&k, &json!({"request_id": "abc", "text": "ção 😀"}))
        .unwrap();
    let expected_path =
        notes.join("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad.json");
    assert_eq!(store.path_for(&k), expected_path);
    assert_eq!(
        fs::read_to_string(&expected_path).unwrap(),
        "{\"request_id\":\"abc\",\"text\":\"ção 😀\"}"
    );
    assert_eq!(store.dir(), notes);
}

#[test]
fn conflict_message_names_digest_not_key_or_payload() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    let k = key("secret-request-id");
    store.commit(&k, &json!({"t": "first-secret"})).unwrap();
    let err = store
        .commit(&k, &json!({"t": "second-secret"}))
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&k.digest().to_hex()), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

#[test]
fn get_missing_is_none_and_list_is_sorted_by_file_name() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    assert_eq!(store.get(&key("nope")).unwrap(), None);
    assert_eq!(store.list().unwrap(), Vec::<Value>::new());

    let mut expected = Vec::new();
    for i in 0..30 {
        let k = key(&format!("req-{i:04}"));
        let payload = json!({"request_id": k.as_str(), "n": i});
        store.commit(&k, &payload).unwrap();
        expected.push((k.digest().to_hex(), payload));
    }
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    let expected: Vec<Value> = expected.into_iter().map(|(_, p)| p).collect();
    assert_eq!(store.list().unwrap(), expected);
    // Insertion order differs from hash order, so the sort above is not a no-op.
    assert_ne!(expected[0]["n"], json!(0));
    // The same payloads, in the same order, as the bytes the store holds.
    let canonical: Vec<Vec<u8>> = expected.iter().map(canonical_value).collect();
    assert_eq!(store.list_canonical().unwrap(), canonical);
}

/// `list_canonical` checks each record as `list` does: a record rewritten in another form is
/// reported as corrupt by both, never handed out as bytes nobody checked.
#[test]
fn list_canonical_reports_what_list_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    let k = key("req-0001");
    store.commit(&k, &json!({"a": 1, "b": 2})).unwrap();
    let path = store.path_for(&k);
    // Valid JSON, but not canonical (key order, spacing).
    fs::write(&path, br#"{"b": 2, "a": 1}"#).unwrap();
    for result in [store.list().map(drop), store.list_canonical().map(drop)] {
        match result {
            Err(CommitError::Corrupt { path: reported, .. }) => assert_eq!(reported, path),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn list_and_get_ignore_junk_and_open_removes_orphaned_temps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = FileCommitStore::open(dir).unwrap();
    let k = key("req-0001");
    let payload = json!({"request_id": "req-0001", "text": "kept"});
    store.commit(&k, &payload).unwrap();

    let hex = k.digest().to_hex();
    let other_hex = key("req-0002").digest().to_hex();
    let orphan_same = format!(".{hex}.999999.0.tmp");
    let orphan_other = format!(".{other_hex}.1.2.tmp");
    fs::write(dir.join(&orphan_same), b"{\"half").unwrap();
    fs::write(dir.join(&orphan_other), b"").unwrap();
    let junk: Vec<(String, &[u8])> = vec![
        ("README".into(), b"not a record"),
        ("notes.json".into(), b"{}"),
        ("ABCDEF.json".into(), b"garbage"),
        (".hidden.tmp".into(), b"not ours"),
        (
            format!("{}.json", "A".repeat(64)),
            b"upper-case hex is not ours",
        ),
        (format!("{hex}.json.bak"), b"backup"),
        (format!("{}.json", "0".repeat(63)), b"short"),
    ];
    for (name, bytes) in &junk {
        fs::write(dir.join(name), bytes).unwrap();
    }
    fs::create_dir(dir.join("subdir")).unwrap();
    assert!(dir.join(".lock").exists());

    // Orphans and junk are invisible to readers.
    assert_eq!(store.list().unwrap(), vec![payload.clone()]);
    assert_eq!(store.get(&k).unwrap(), Some(payload.clone()));
    assert_eq!(store.get(&key("req-0002")).unwrap(), None);

    // Reopening removes exactly the orphaned temporary files and nothing else.
    let before = names(dir);
    let store = FileCommitStore::open(dir).unwrap();
    let after = names(dir);
    let removed: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    let mut expected_removed = vec![&orphan_same, &orphan_other];
    expected_removed.sort();
    assert_eq!(removed, expected_removed);
    assert!(after.contains(&".hidden.tmp".to_owned()));
    assert_eq!(store.list().unwrap(), vec![payload]);
}

#[test]
fn orphan_from_crash_before_publish_does_not_block_retry() {
    // A writer killed at commit.before_publish leaves a complete, fsynced temporary file and no
    // record. The retry (here without reopening, so the orphan is still present) must commit.
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    let k = key("req-crash-0001");
    let payload = json!({"request_id": "req-crash-0001", "text": "uma vez"});
    let hex = k.digest().to_hex();
    // Same name pattern, including this process's pid and low counters, so create_new collides.
    for counter in 0..4 {
        let orphan = tmp
            .path()
            .join(format!(".{hex}.{}.{counter}.tmp", std::process::id()));
        fs::write(&orphan, canonical_value(&payload)).unwrap();
    }

    assert_eq!(
        store.commit(&k, &payload).unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(record_names(tmp.path()), vec![format!("{hex}.json")]);
    assert_eq!(store.commit(&k, &payload).unwrap(), CommitOutcome::Replay);
    assert_eq!(store.list().unwrap(), vec![payload]);
}

#[test]
fn crash_after_publish_retry_replays_after_reopen() {
    // A writer killed at commit.after_publish leaves the record in place: a new process replays.
    let tmp = tempfile::tempdir().unwrap();
    let k = key("req-crash-0002");
    let payload = json!({"request_id": "req-crash-0002", "text": "uma vez"});
    {
        let store = FileCommitStore::open(tmp.path()).unwrap();
        assert_eq!(
            store.commit(&k, &payload).unwrap(),
            CommitOutcome::Committed
        );
    }
    let store = FileCommitStore::open(tmp.path()).unwrap();
    assert_eq!(store.commit(&k, &payload).unwrap(), CommitOutcome::Replay);
    assert_eq!(record_names(tmp.path()).len(), 1);
}

fn assert_corrupt<T: std::fmt::Debug>(res: Result<T, CommitError>, path: &Path) {
    match res {
        Err(CommitError::Corrupt { path: p, reason }) => {
            assert_eq!(p, path);
            let text = CommitError::Corrupt { path: p, reason }.to_string();
            assert!(text.contains("restore it from a backup"), "{text}");
            assert!(
                !text.contains("PAYLOAD"),
                "corrupt message leaks content: {text}"
            );
        }
        other => panic!("expected Corrupt for {}, got {other:?}", path.display()),
    }
}

#[test]
fn corrupt_records_are_errors_on_commit_get_and_list() {
    let cases: &[(&str, &[u8])] = &[
        ("empty", b""),
        ("not json", b"PAYLOAD not json"),
        ("truncated", b"{\"request_id\":\"PAYLOAD"),
        ("non-canonical whitespace", b"{\"a\": \"PAYLOAD\"}"),
        ("non-canonical order", b"{\"b\":1,\"a\":\"PAYLOAD\"}"),
        ("trailing newline", b"{\"a\":\"PAYLOAD\"}\n"),
        ("invalid utf-8", b"\"PAYLOAD\xff\xfe\""),
    ];
    for (label, bytes) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let store = FileCommitStore::open(tmp.path()).unwrap();
        let k = key("req-0001");
        let path = store.path_for(&k);
        fs::write(&path, bytes).unwrap();
        eprintln!("case: {label}");

        assert_corrupt(store.get(&k), &path);
        assert_corrupt(store.list(), &path);
        assert_corrupt(store.commit(&k, &json!({"a": "other"})), &path);
        assert_corrupt(store.commit(&k, &json!({"a": "PAYLOAD"})), &path);
        assert_eq!(
            &fs::read(&path).unwrap(),
            bytes,
            "{label}: the store must not repair"
        );
    }
}

#[test]
fn directory_in_place_of_a_record_is_corrupt_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    let k = key("req-0001");
    let path = store.path_for(&k);
    fs::create_dir(&path).unwrap();
    assert_corrupt(store.get(&k), &path);
    assert_corrupt(store.list(), &path);
    assert_corrupt(store.commit(&k, &json!({})), &path);
}

#[test]
fn open_creates_missing_parents_and_rejects_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let deep: PathBuf = tmp.path().join("a").join("b").join("notes");
    let store = FileCommitStore::open(&deep).unwrap();
    assert!(deep.is_dir());
    store.commit(&key("k"), &json!(1)).unwrap();

    let file = tmp.path().join("plain-file");
    fs::write(&file, b"x").unwrap();
    match FileCommitStore::open(&file) {
        Err(CommitError::Io { path, .. }) => assert_eq!(path, file),
        other => panic!("expected Io, got {other:?}"),
    }
    match FileCommitStore::open(file.join("below")) {
        Err(CommitError::Io { .. }) => {}
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn payloads_of_every_json_shape_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileCommitStore::open(tmp.path()).unwrap();
    let payloads = [
        json!(null),
        json!(true),
        json!(-17),
        json!(u64::MAX),
        json!(1.5e300),
        json!("\u{0001}ção\"\\"),
        json!([1, "two", {"z": [], "a": {}}]),
        json!({"\u{20ac}": 1, "\r": 2, "1": 3}),
    ];
    for (i, payload) in payloads.iter().enumerate() {
        let k = key(&format!("shape-{i}"));
        assert_eq!(store.commit(&k, payload).unwrap(), CommitOutcome::Committed);
        // get returns the payload as its canonical bytes read back, which equals the input except
        // where RFC 8785 itself normalizes (numbers are IEEE doubles).
        let stored = store.get(&k).unwrap().unwrap();
        assert_eq!(canonical_value(&stored), canonical_value(payload));
        if i != 3 {
            assert_eq!(&stored, payload);
        }
        assert_eq!(store.commit(&k, payload).unwrap(), CommitOutcome::Replay);
    }
    // Integers beyond 2^53 are not exact in RFC 8785: u64::MAX comes back as the nearest double.
    assert_eq!(
        store.get(&key("shape-3")).unwrap(),
        Some(json!(1.8446744073709552e19))
    );
    // 1.0 and 1 have the same canonical form, so they are the same payload.
    let k = key("number-spelling");
    store.commit(&k, &json!(1.0)).unwrap();
    assert_eq!(store.commit(&k, &json!(1)).unwrap(), CommitOutcome::Replay);
}

#[test]
fn store_is_usable_as_a_trait_object() {
    let tmp = tempfile::tempdir().unwrap();
    let store: Box<dyn CommitStore> = Box::new(FileCommitStore::open(tmp.path()).unwrap());
    assert_eq!(
        store.commit(&key("k"), &json!({"x": 1})).unwrap(),
        CommitOutcome::Committed
    );
    assert!(format!("{store:?}").contains("FileCommitStore"));
}
