//! Journal compaction: every live record keeps its state and answers, superseded and removed lines
//! go, other store instances on the same directory follow the replacement, leftovers of a crashed
//! compaction are ignored and removed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};
use toolgate_commit::{
    Begin, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStore, Resolution, Scope,
    Ticket,
};

const TEMP: &str = ".effects.journal.compact.tmp";

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

fn execute(store: &EffectStore, key: &str, kind: EffectKind) -> Ticket {
    match store.begin(&req(key, "fp"), kind).unwrap() {
        Begin::Execute(ticket) => ticket,
        other => panic!("{key}: expected Execute, got {other:?}"),
    }
}

fn name_hex(key: &str) -> String {
    Sha256Digest::of_json(&json!({"key": key, "principal": "alice", "tool": "write_note"})).to_hex()
}

fn journal_path(dir: &Path) -> PathBuf {
    dir.join("effects.journal")
}

fn inode(dir: &Path) -> u64 {
    std::fs::metadata(journal_path(dir)).unwrap().ino()
}

/// The journal's complete lines up to its logical end.
fn journal_lines(dir: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(journal_path(dir)).unwrap();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    bytes[..end]
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Name (hex) -> latest line, for the names whose latest line is not a removal.
fn latest_live_lines(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut latest = BTreeMap::new();
    for line in journal_lines(dir) {
        let v: Value = serde_json::from_slice(&line).unwrap();
        latest.insert(
            v["name"].as_str().unwrap().to_owned(),
            (!v["record"].is_null()).then_some(line),
        );
    }
    latest
        .into_iter()
        .filter_map(|(name, line)| Some((name, line?)))
        .collect()
}

fn replay(store: &EffectStore, key: &str) -> Value {
    match store.begin(&req(key, "fp"), EffectKind::Unsafe).unwrap() {
        Begin::Replay(v) => v,
        other => panic!("{key}: expected Replay, got {other:?}"),
    }
}

fn result(key: &str) -> Value {
    // Key order, non-ASCII and a large exponent: replays must be byte-identical in canonical form.
    json!({"z": key, "a": [1.5, "é", {"k": null}], "n": 1e21})
}

#[test]
fn compaction_keeps_every_live_record_and_drops_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = EffectStore::open(
        EffectConfig::new(dir)
            .completed_ttl(Duration::from_secs(3600))
            .compact_min_bytes(u64::MAX),
    )
    .unwrap();
    for i in 0..20 {
        let key = format!("done-{i}");
        let t = execute(&store, &key, EffectKind::Unsafe);
        store.complete(t, &result(&key)).unwrap();
    }
    let t = execute(&store, "retried", EffectKind::Idempotent);
    store.fail(t, "503", true).unwrap();
    let t = execute(&store, "retried", EffectKind::Idempotent);
    store.complete(t, &result("retried")).unwrap();
    let t = execute(&store, "refused", EffectKind::Unsafe);
    store.fail(t, "bad input", false).unwrap();
    drop(execute(&store, "indeterminate", EffectKind::Unsafe));
    drop(execute(&store, "forgotten", EffectKind::Unsafe));
    store
        .resolve(&scope(), "forgotten", Resolution::Forget)
        .unwrap();
    // Still running across the compaction: one unsafe (durable in_progress), one idempotent
    // (lazily written in_progress).
    let running_unsafe = execute(&store, "running-unsafe", EffectKind::Unsafe);
    let running_idem = execute(&store, "running-idem", EffectKind::Idempotent);

    let before_lines = journal_lines(dir);
    let live = latest_live_lines(dir);
    let old_inode = inode(dir);
    let replays: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| format!("done-{i}"))
        .chain(["retried".to_owned()])
        .map(|k| {
            let v = replay(&store, &k);
            (k, canonical_value(&v))
        })
        .collect();

    let stats = store.compact().unwrap();
    assert_eq!(stats.records, live.len() as u64, "{stats:?}");
    assert_eq!(
        stats.records, 25,
        "20 done, retried, refused, indeterminate, 2 running"
    );
    assert_eq!(stats.lines_before, before_lines.len() as u64);
    assert!(stats.bytes_after < stats.bytes_before, "{stats:?}");
    assert_ne!(inode(dir), old_inode, "a new file replaced the journal");

    // One line per live record, byte-identical to its latest line before; nothing else.
    let after = journal_lines(dir);
    assert_eq!(after.len(), live.len());
    assert_eq!(latest_live_lines(dir), live);
    assert_eq!(
        stats.bytes_after,
        after.iter().map(|l| l.len() as u64 + 1).sum::<u64>()
    );
    assert!(!live.contains_key(&name_hex("forgotten")));

    for check in [&store, &open(dir)] {
        for (key, bytes) in &replays {
            assert_eq!(&canonical_value(&replay(check, key)), bytes, "{key}");
            assert_eq!(&canonical_value(&result(key)), bytes, "{key}");
        }
        assert!(matches!(
            check.begin(&req("refused", "fp"), EffectKind::Unsafe).unwrap(),
            Begin::ReplayFailure(e) if e == "bad input"
        ));
        assert!(matches!(
            check.begin(&req("indeterminate", "fp"), EffectKind::Unsafe),
            Err(EffectError::Indeterminate { .. })
        ));
        for key in ["running-unsafe", "running-idem"] {
            assert!(matches!(
                check.begin(&req(key, "fp"), EffectKind::Unsafe),
                Err(EffectError::InProgress { .. })
            ));
        }
        assert!(matches!(
            check.begin(&req("done-3", "other"), EffectKind::Unsafe),
            Err(EffectError::Conflict { .. })
        ));
    }
    // The tickets still work after the compaction.
    store
        .complete(running_unsafe, &result("running-unsafe"))
        .unwrap();
    store
        .complete(running_idem, &result("running-idem"))
        .unwrap();
    assert_eq!(
        canonical_value(&replay(&open(dir), "running-idem")),
        canonical_value(&result("running-idem"))
    );
    // The forgotten key executes again.
    drop(execute(&store, "forgotten", EffectKind::Unsafe));
}

#[test]
fn prune_compacts_the_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = EffectStore::open(
        EffectConfig::new(dir)
            .completed_ttl(Duration::from_secs(3600))
            .compact_min_bytes(u64::MAX),
    )
    .unwrap();
    for i in 0..10 {
        let t = execute(&store, &format!("k{i}"), EffectKind::Idempotent);
        store.complete(t, &json!(i)).unwrap();
    }
    let running = execute(&store, "running", EffectKind::Unsafe);
    let old_inode = inode(dir);
    assert_eq!(journal_lines(dir).len(), 21);
    let later = SystemTime::now() + Duration::from_secs(7200);
    assert_eq!(store.prune(later).unwrap(), 10);
    // Only the running record is left, in a compacted journal.
    assert_eq!(journal_lines(dir).len(), 1);
    assert_ne!(inode(dir), old_inode);
    assert_eq!(latest_live_lines(dir).len(), 1);
    store.complete(running, &json!("r")).unwrap();
    let store = open(dir);
    assert_eq!(replay(&store, "running"), json!("r"));
    assert!(matches!(
        store.begin(&req("k3", "fp"), EffectKind::Unsafe).unwrap(),
        Begin::Execute(_)
    ));
}

#[test]
fn another_store_instance_follows_a_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = EffectConfig::new(dir).compact_min_bytes(u64::MAX);
    let a = EffectStore::open(config.clone()).unwrap();
    let b = EffectStore::open(config).unwrap();
    for i in 0..5 {
        let t = execute(&a, &format!("a{i}"), EffectKind::Unsafe);
        a.complete(t, &json!(format!("a{i}"))).unwrap();
        let t = execute(&b, &format!("b{i}"), EffectKind::Idempotent);
        b.complete(t, &json!(format!("b{i}"))).unwrap();
    }
    // Tickets held across the compaction, in both stores.
    let b_held = execute(&b, "b-held", EffectKind::Unsafe);
    let a_held = execute(&a, "a-held", EffectKind::Idempotent);

    let stats = a.compact().unwrap();
    assert_eq!(stats.records, 12);
    let compacted = journal_lines(dir);
    assert_eq!(compacted.len(), 12);

    // B has the old file open; it notices the replacement and continues on the new one.
    assert_eq!(replay(&b, "a3"), json!("a3"));
    b.complete(b_held, &json!("b-held")).unwrap();
    let t = execute(&b, "b-new", EffectKind::Idempotent);
    b.complete(t, &json!("b-new")).unwrap();
    assert!(matches!(
        b.begin(&req("a-held", "fp"), EffectKind::Unsafe),
        Err(EffectError::InProgress { .. })
    ));
    // A sees what B appended to the new file, and its own ticket still completes.
    assert_eq!(replay(&a, "b-new"), json!("b-new"));
    assert_eq!(replay(&a, "b-held"), json!("b-held"));
    a.complete(a_held, &json!("a-held")).unwrap();

    // Now B compacts, and A follows.
    assert_eq!(b.compact().unwrap().records, 13);
    assert_eq!(replay(&a, "b2"), json!("b2"));
    let t = execute(&a, "a-new", EffectKind::Unsafe);
    a.complete(t, &json!("a-new")).unwrap();

    // Nothing lost, nothing duplicated: the compacted lines plus exactly the lines written after.
    let lines = journal_lines(dir);
    assert_eq!(
        lines.len(),
        13 + 2,
        "b's compaction, then a-new's two lines"
    );
    let c = open(dir);
    let keys: Vec<String> = (0..5)
        .flat_map(|i| [format!("a{i}"), format!("b{i}")])
        .chain(["a-held", "b-held", "b-new", "a-new"].map(String::from))
        .collect();
    for key in &keys {
        assert_eq!(replay(&c, key), json!(key), "{key}");
    }
    assert_eq!(latest_live_lines(dir).len(), keys.len());
}

#[test]
fn automatic_compaction_keeps_the_journal_near_its_live_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let min = 16 * 1024;
    let a = EffectStore::open(EffectConfig::new(dir).compact_min_bytes(min)).unwrap();
    // A second instance that never compacts on its own: it must follow A's compactions.
    let b = EffectStore::open(EffectConfig::new(dir).compact_min_bytes(u64::MAX)).unwrap();
    let mut max_used = 0;
    let mut shrunk = 0;
    let mut last_used = 0;
    for i in 0u64..200 {
        // The same key over and over: every line supersedes the one before.
        let t = execute(&a, "busy", EffectKind::Idempotent);
        a.fail(t, &format!("attempt {i} failed"), true).unwrap();
        if i.is_multiple_of(10) {
            let key = format!("b{i}");
            let t = execute(&b, &key, EffectKind::Unsafe);
            b.complete(t, &json!(i)).unwrap();
        }
        let used: usize = journal_lines(dir).iter().map(|l| l.len() + 1).sum();
        let live: usize = latest_live_lines(dir).values().map(|l| l.len() + 1).sum();
        // The threshold, plus what one batch appends after it (a line of a few hundred bytes).
        let bound = (min as usize).max(4 * live) + 1024;
        assert!(
            used <= bound,
            "iteration {i}: {used} used bytes, {live} live"
        );
        max_used = max_used.max(used);
        if used < last_used {
            shrunk += 1;
        }
        last_used = used;
    }
    // Without compaction the journal would hold 400 lines of a few hundred bytes each. (Inode
    // numbers are no evidence here: a freed one is reused by a later compaction.)
    assert!(shrunk >= 2, "compacted {shrunk} times");
    assert!(
        max_used > min as usize,
        "the threshold was reached: {max_used}"
    );
    let c = open(dir);
    match c.begin(&req("busy", "fp"), EffectKind::Unsafe).unwrap() {
        Begin::Execute(t) => c.complete(t, &json!("busy")).unwrap(),
        other => panic!("a retryable failure executes again, got {other:?}"),
    }
    for i in (0..200).step_by(10) {
        assert_eq!(replay(&c, &format!("b{i}")), json!(i));
        assert_eq!(replay(&a, &format!("b{i}")), json!(i));
    }
    assert_eq!(replay(&b, "busy"), json!("busy"));
}

#[test]
fn a_torn_compaction_file_is_ignored_and_removed_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        let store = open(dir);
        for i in 0..3 {
            let t = execute(&store, &format!("k{i}"), EffectKind::Unsafe);
            store.complete(t, &json!(i)).unwrap();
        }
    }
    let journal = std::fs::read(journal_path(dir)).unwrap();
    // What a compaction that crashed mid-write leaves: part of the new file, no padding.
    let lines = journal_lines(dir);
    let mut torn = lines[1].clone();
    torn.push(b'\n');
    torn.extend_from_slice(&lines[3][..40]);
    std::fs::write(dir.join(TEMP), &torn).unwrap();

    let store = open(dir);
    assert!(!dir.join(TEMP).exists(), "removed at open");
    assert_eq!(
        std::fs::read(journal_path(dir)).unwrap(),
        journal,
        "journal untouched"
    );
    for i in 0..3 {
        assert_eq!(replay(&store, &format!("k{i}")), json!(i));
    }

    // A leftover that appears while a store is open (e.g. a compaction by a process that then
    // died) does not block the next compaction either.
    std::fs::write(dir.join(TEMP), b"{\"name\":").unwrap();
    assert_eq!(store.compact().unwrap().records, 3);
    assert!(!dir.join(TEMP).exists());
    for i in 0..3 {
        assert_eq!(replay(&open(dir), &format!("k{i}")), json!(i));
    }
}

#[test]
fn compacting_an_empty_store_and_a_compacted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = open(dir);
    let stats = store.compact().unwrap();
    assert_eq!((stats.records, stats.bytes_after), (0, 0));
    let t = execute(&store, "k", EffectKind::Idempotent);
    store.complete(t, &json!(1)).unwrap();
    let first = store.compact().unwrap();
    assert_eq!(first.records, 1);
    assert_eq!(first.lines_before, 2);
    let second = store.compact().unwrap();
    assert_eq!(
        (second.bytes_before, second.bytes_after),
        (first.bytes_after, first.bytes_after)
    );
    assert_eq!(replay(&open(dir), "k"), json!(1));
}
