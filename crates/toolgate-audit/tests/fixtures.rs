//! The committed logs under `fixtures/audit/`: each is derived from `intact.jsonl` (and its
//! signed checkpoints `intact.checkpoints.jsonl`) by one kind of damage, and the verifier must
//! report it at the expected line, with and without the checkpoint key.
//!
//! The chain and the checkpoints here are built independently of the writer (serde_json plus
//! toolgate-canon only), so the fixtures also pin the record and checkpoint formats. The key is
//! `fixtures/audit/TEST-ONLY-checkpoint.key`, a published test key. Set `UPDATE_EXPECT=1` to
//! rewrite the fixtures after a deliberate format change; otherwise any difference fails.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolgate_audit::{ProblemKind, VerifyOptions, verify, verify_file};
use toolgate_canon::{HmacKey, Sha256Digest, canonical_value};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/audit");

/// Seven records covering allow and deny, every outcome, with and without `reason`, the digests of
/// the policy and the contract. `intact.jsonl` holds the first six; the seventh is the record a
/// crash interrupted in `torn.jsonl`.
fn records() -> Vec<Value> {
    let calls = [
        (
            "req-0001",
            "write_note",
            "allow",
            "committed",
            json!({"request_id": "req-0001", "text": "gate applied"}),
            None,
        ),
        (
            "req-0001",
            "write_note",
            "allow",
            "replay",
            json!({"request_id": "req-0001", "text": "gate applied"}),
            None,
        ),
        (
            "req-0002",
            "rm_rf",
            "deny",
            "not_executed",
            json!({"path": "/"}),
            Some("denied by policy"),
        ),
        (
            "req-0003",
            "read_ledger",
            "allow",
            "observed",
            json!({}),
            None,
        ),
        (
            "short",
            "write_note",
            "deny",
            "not_executed",
            json!({"request_id": "short", "text": "x"}),
            Some("arg_rules: request_id shorter than 8"),
        ),
        (
            "req-0004",
            "read_ledger",
            "allow",
            "observed",
            json!({}),
            None,
        ),
        (
            "req-0005",
            "write_note",
            "allow",
            "committed",
            json!({"request_id": "req-0005", "text": "never finished"}),
            None,
        ),
    ];
    let policy = Sha256Digest::of(b"fixture policy").to_hex();
    let contract = Sha256Digest::of(b"fixture contract").to_hex();
    calls
        .into_iter()
        .enumerate()
        .map(|(i, (request_id, name, decision, outcome, args, reason))| {
            let mut record = json!({
                // Multiples of 1e9 are exact doubles, so the timestamps read back unchanged.
                "ts": 1_767_225_600_000_000_000u64 + i as u64 * 1_000_000_000,
                "seq": i as u64 + 1,
                "request_id": request_id,
                "method": "tools/call",
                "name": name,
                "decision": decision,
                "outcome": outcome,
                "args_digest": Sha256Digest::of_json(&args).to_hex(),
                "policy_digest": policy,
            });
            if name != "rm_rf" {
                record["contract_digest"] = Value::from(contract.as_str());
            }
            if let Some(reason) = reason {
                record["reason"] = Value::from(reason);
            }
            record
        })
        .collect()
}

/// Chains `records` (any `prev_sha256`/`sha256` they carry is replaced) into canonical lines.
fn chain(records: &[Value]) -> Vec<String> {
    let mut prev = "0".repeat(64);
    records
        .iter()
        .map(|record| {
            let mut record = record.clone();
            let object = record.as_object_mut().unwrap();
            object.remove("sha256");
            object.insert("prev_sha256".into(), Value::from(prev.as_str()));
            let sha =
                Sha256Digest::of_parts(&[prev.as_bytes(), &canonical_value(&record)]).to_hex();
            record["sha256"] = Value::from(sha.as_str());
            prev = sha;
            String::from_utf8(canonical_value(&record)).unwrap()
        })
        .collect()
}

fn intact_lines() -> Vec<String> {
    chain(&records()[..6])
}

fn join(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn test_key() -> HmacKey {
    HmacKey::from_file_bytes(
        fs::read(Path::new(FIXTURES).join("TEST-ONLY-checkpoint.key")).unwrap(),
    )
    .unwrap()
}

/// A checkpoint line as docs/audit-format.md describes it, computed without toolgate-audit.
fn checkpoint_line(key: &HmacKey, count: u64, head: &str, ts: u64) -> String {
    let mut line = json!({"count": count, "head": head, "key_id": key.key_id(), "ts": ts});
    let mut message = b"toolgate-audit-checkpoint-v1\n".to_vec();
    message.extend_from_slice(&canonical_value(&line));
    line["mac"] = Value::from(Sha256Digest::from_bytes(key.mac(&message)).to_hex());
    format!("{}\n", String::from_utf8(canonical_value(&line)).unwrap())
}

fn sha_of(line: &str) -> String {
    serde_json::from_str::<Value>(line).unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The checkpoints of `intact.jsonl`: after records 3 and 6.
fn intact_checkpoints(key: &HmacKey) -> String {
    let lines = intact_lines();
    checkpoint_line(key, 3, &sha_of(&lines[2]), 1_767_225_603_000_000_000)
        + &checkpoint_line(key, 6, &sha_of(&lines[5]), 1_767_225_606_000_000_000)
}

/// A fixture: the log's file name, its content, the checkpoint file it is verified against, and
/// the expected first problem (line, kind) and good records, with the key and without it.
struct Fixture {
    name: &'static str,
    content: String,
    checkpoints: &'static str,
    with_key: (Option<(u64, ProblemKind)>, u64),
    without_key: (Option<(u64, ProblemKind)>, u64),
}

fn fixture(
    name: &'static str,
    content: String,
    with_key: (Option<(u64, ProblemKind)>, u64),
    without_key: (Option<(u64, ProblemKind)>, u64),
) -> Fixture {
    Fixture {
        name,
        content,
        checkpoints: "intact.checkpoints.jsonl",
        with_key,
        without_key,
    }
}

fn fixtures() -> Vec<Fixture> {
    use ProblemKind::*;
    let intact = intact_lines();

    let mut edited = intact.clone();
    // Someone turns the recorded denial of rm_rf into an allow.
    edited[2] = edited[2].replace("\"decision\":\"deny\"", "\"decision\":\"allow\"");

    // The same edit with line 3's own sha256 recomputed: line 4 no longer links to it.
    let mut rehashed = intact.clone();
    let mut records3: Vec<Value> = intact
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    records3[2]["decision"] = Value::from("allow");
    let prev = records3[2]["prev_sha256"].as_str().unwrap().to_owned();
    records3[2].as_object_mut().unwrap().remove("sha256");
    let sha = Sha256Digest::of_parts(&[prev.as_bytes(), &canonical_value(&records3[2])]);
    records3[2]["sha256"] = Value::from(sha.to_hex());
    rehashed[2] = String::from_utf8(canonical_value(&records3[2])).unwrap();

    // The whole log re-chained after the edit: a valid chain with different content.
    let mut forged_records = records();
    forged_records.truncate(6);
    forged_records[2]["decision"] = Value::from("allow");
    let forged = chain(&forged_records);

    let mut deleted = intact.clone();
    deleted.remove(2);

    let mut swapped = intact.clone();
    swapped.swap(3, 4);

    let seven = chain(&records());
    let mut torn = join(&seven[..6]);
    torn.push_str(&seven[6][..seven[6].len() / 2]);

    let mut not_canonical = intact.clone();
    not_canonical[1] = not_canonical[1].replacen("\":", "\": ", 1);

    let mut malformed = intact.clone();
    malformed[3] = "this is not json".to_owned();

    vec![
        fixture("intact.jsonl", join(&intact), (None, 6), (None, 6)),
        fixture(
            "edited.jsonl",
            join(&edited),
            (Some((3, Modified)), 2),
            (Some((3, Modified)), 2),
        ),
        fixture(
            "rehashed.jsonl",
            join(&rehashed),
            // The checkpoint after record 3 catches the edit first.
            (Some((3, Modified)), 2),
            (Some((4, LinkBroken)), 3),
        ),
        fixture(
            "deleted.jsonl",
            join(&deleted),
            (Some((3, SeqGap)), 2),
            (Some((3, SeqGap)), 2),
        ),
        fixture(
            "swapped.jsonl",
            join(&swapped),
            (Some((4, Reordered)), 3),
            (Some((4, Reordered)), 3),
        ),
        fixture(
            "not_canonical.jsonl",
            join(&not_canonical),
            (Some((2, NotCanonical)), 1),
            (Some((2, NotCanonical)), 1),
        ),
        fixture(
            "malformed.jsonl",
            join(&malformed),
            (Some((4, Malformed)), 3),
            (Some((4, Malformed)), 3),
        ),
        fixture(
            "torn.jsonl",
            torn,
            (Some((7, TornTail)), 6),
            (Some((7, TornTail)), 6),
        ),
        fixture(
            "truncated.jsonl",
            join(&intact[..4]),
            (Some((5, TruncatedBeforeCheckpoint)), 4),
            (None, 4),
        ),
        fixture(
            "forged.jsonl",
            join(&forged),
            (Some((3, Modified)), 2),
            (None, 6),
        ),
        Fixture {
            name: "bad_checkpoint.jsonl",
            content: join(&intact),
            checkpoints: "bad_checkpoint.checkpoints.jsonl",
            with_key: (Some((2, BadCheckpointSignature)), 6),
            without_key: (None, 6),
        },
    ]
}

fn update_expect() -> bool {
    std::env::var("UPDATE_EXPECT").is_ok_and(|v| v == "1")
}

/// Compares `actual` with the committed file, or rewrites it under `UPDATE_EXPECT=1`.
fn expect_file(path: &Path, actual: &str) {
    if update_expect() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, actual).unwrap();
        return;
    }
    let committed = fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_EXPECT=1 to create it",
            path.display()
        )
    });
    assert!(
        committed == actual,
        "{} differs from what the test generates; if the change is intended, rerun with UPDATE_EXPECT=1\n--- committed\n{committed}\n--- generated\n{actual}",
        path.display()
    );
}

#[test]
fn fixtures_are_current_and_verify_as_expected() {
    let dir = PathBuf::from(FIXTURES);
    let key = test_key();
    let intact_cps = intact_checkpoints(&key);
    expect_file(&dir.join("intact.checkpoints.jsonl"), &intact_cps);
    // The second checkpoint claims 5 records under the MAC made for 6.
    let bad_cps = intact_cps.replacen("\"count\":6", "\"count\":5", 1);
    assert_ne!(bad_cps, intact_cps);
    expect_file(&dir.join("bad_checkpoint.checkpoints.jsonl"), &bad_cps);

    let prefix = format!("{FIXTURES}/");
    let mut reports = String::new();
    for f in fixtures() {
        let path = dir.join(f.name);
        expect_file(&path, &f.content);
        let cps = dir.join(f.checkpoints);
        let keyed = verify(
            &VerifyOptions::new(&path)
                .checkpoint_key(key.clone())
                .checkpoints_path(&cps),
        )
        .unwrap();
        let unkeyed = verify(&VerifyOptions::new(&path).checkpoints_path(&cps)).unwrap();
        for (mode, report, (problem, records)) in [
            ("", &keyed, f.with_key),
            (" (no key)", &unkeyed, f.without_key),
        ] {
            let got = report.problem.as_ref().map(|p| (p.line, p.kind));
            assert_eq!(got, problem, "{}{mode}: {report}", f.name);
            assert_eq!(report.records, records, "{}{mode}: {report}", f.name);
            writeln!(
                reports,
                "{}{mode}: {}",
                f.name,
                report.to_string().replace(&prefix, "")
            )
            .unwrap();
        }
        // Without checkpoints, the single-file verifier agrees with the unkeyed report.
        let plain = verify_file(&path).unwrap();
        assert_eq!(plain.problem, unkeyed.problem, "{}", f.name);
    }
    expect_file(&dir.join("expected.txt"), &reports);
}

#[test]
fn fixture_timestamps_read_back_unchanged() {
    for (i, line) in intact_lines().iter().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            record["ts"].as_u64(),
            Some(1_767_225_600_000_000_000 + i as u64 * 1_000_000_000)
        );
        assert_eq!(record["seq"].as_u64(), Some(i as u64 + 1));
    }
}
