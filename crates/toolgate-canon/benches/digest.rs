//! SHA-256 as toolgate computes it (`Sha256Digest::of`, the `sha2` crate), next to coreutils'
//! `sha256sum` over the same bytes.
//!
//! Criterion rows: `of` over 1 MiB in memory, and `of_parts` over one audit-record-sized message
//! (64-byte previous hash + 470 bytes); and the canonical JSON of an audit-record-like value:
//! this crate's writer on the `serde_json::Value` (`canonical_value`, which walks the value), and
//! of a derived struct with the same fields through `serde_json::to_value` first, next to
//! `serde_json_canonicalizer::to_vec` (the crate it replaced, whose bytes it reproduces) and plain,
//! non-canonical `serde_json::to_vec` of the same value; then `canonical_value` and
//! `serde_json::to_vec` of a tool's input schema of about 10 KB. Then a comparison
//! outside criterion: a 64 MiB file hashed
//! by reading it and calling `Sha256Digest::of`, against `sha256sum FILE` (process start
//! included, page cache warm), median of 7 runs each, in MB/s, plus `sha256sum` of a 1 MiB file
//! to show its fixed cost.
//!
//! Run: `cargo bench -p toolgate-canon --bench digest`.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use serde::Serialize;
use toolgate_canon::{Sha256Digest, canonical_value};

const MIB: usize = 1024 * 1024;

/// Deterministic, incompressible-looking bytes (xorshift).
fn bytes(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn criterion_groups(c: &mut Criterion) {
    let data = bytes(MIB);
    let mut group = c.benchmark_group("sha256");
    group.throughput(Throughput::Bytes(MIB as u64));
    group.bench_function("of_1MiB", |b| {
        b.iter(|| black_box(Sha256Digest::of(black_box(&data))))
    });
    let prev = [b'0'; 64];
    let record = bytes(470);
    group.throughput(Throughput::Bytes(64 + 470));
    group.bench_function("of_parts_audit_record", |b| {
        b.iter(|| {
            black_box(Sha256Digest::of_parts(&[
                black_box(&prev[..]),
                black_box(&record[..]),
            ]))
        })
    });
    // What sealing an audit record costs besides the hash: the canonical bytes of a typical
    // record (the audit log canonicalizes each record twice, before and after adding `sha256`).
    let record = serde_json::json!({
        "ts": 1_767_225_600_000_000_000u64,
        "seq": 1234,
        "request_id": "bench-00000001",
        "method": "tools/call",
        "name": "write_note",
        "decision": "allow",
        "outcome": "committed",
        "reason": "allow",
        "args_digest": Sha256Digest::of(b"{}").to_hex(),
        "policy_digest": Sha256Digest::of(b"policy").to_hex(),
        "prev_sha256": "0".repeat(64),
    });
    let typed: AuditRecord = serde_json::from_value(record.clone()).unwrap();
    let canonical = canonical_value(&record);
    assert_eq!(
        canonical_value(&serde_json::to_value(&typed).unwrap()),
        canonical
    );
    assert_eq!(serde_json_canonicalizer::to_vec(&typed).unwrap(), canonical);
    assert_eq!(
        serde_json_canonicalizer::to_vec(&record).unwrap(),
        canonical
    );
    group.throughput(Throughput::Elements(1));
    group.bench_function("canonical_value_audit_record", |b| {
        b.iter(|| black_box(canonical_value(black_box(&record))))
    });
    group.bench_function("to_value_canonical_value_struct_audit_record", |b| {
        b.iter(|| {
            black_box(canonical_value(
                &serde_json::to_value(black_box(&typed)).unwrap(),
            ))
        })
    });
    group.bench_function("serde_json_canonicalizer_audit_record", |b| {
        b.iter(|| black_box(serde_json_canonicalizer::to_vec(black_box(&record)).unwrap()))
    });
    group.bench_function("serde_json_to_vec_audit_record", |b| {
        b.iter(|| black_box(serde_json::to_vec(black_box(&record)).unwrap()))
    });
    // A tool's input schema of about 10 KB, as a lockfile or contract digests it.
    let schema = tool_schema();
    let canonical = canonical_value(&schema);
    assert_eq!(
        serde_json_canonicalizer::to_vec(&schema).unwrap(),
        canonical
    );
    assert!(
        (9_000..12_000).contains(&canonical.len()),
        "{}",
        canonical.len()
    );
    group.bench_function("canonical_value_tool_schema", |b| {
        b.iter(|| black_box(canonical_value(black_box(&schema))))
    });
    group.bench_function("serde_json_to_vec_tool_schema", |b| {
        b.iter(|| black_box(serde_json::to_vec(black_box(&schema)).unwrap()))
    });
    group.finish();
}

/// A JSON Schema of about 10 KB: 32 properties of every kind, with descriptions (some with
/// non-ASCII text and escapes), enums, bounds, a nested object and an array of objects.
fn tool_schema() -> serde_json::Value {
    use serde_json::{Map, Value, json};
    let mut properties = Map::new();
    for i in 0..32u32 {
        let description = format!(
            "Field {i} of the request: what the tool does with it, in a sentence long enough to \
             look like a real one (limits, units, défauts \"quoted\")."
        );
        let property = match i % 4 {
            0 => json!({
                "type": "string",
                "description": description,
                "minLength": 1,
                "maxLength": 256 + i,
                "pattern": "^[a-z][a-z0-9_\\-]*$",
            }),
            1 => json!({
                "type": "integer",
                "description": description,
                "minimum": -1_000_000,
                "maximum": 9_007_199_254_740_991u64,
                "default": i * 10,
            }),
            2 => json!({
                "type": "string",
                "description": description,
                "enum": ["alpha", "beta", "gamma", "delta", format!("opt_{i}")],
            }),
            _ => json!({
                "type": "array",
                "description": description,
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "properties": {
                        "weight": {"type": "number", "minimum": 0.0, "maximum": 1.5e3, "multipleOf": 0.25},
                        "label": {"type": "string", "maxLength": 40},
                        "enabled": {"type": "boolean", "default": true},
                    },
                    "required": ["label"],
                    "additionalProperties": false,
                },
            }),
        };
        properties.insert(
            format!(
                "field_{i:02}_{}",
                ["name", "count", "mode", "items"][i as usize % 4]
            ),
            property,
        );
    }
    let required: Vec<Value> = properties
        .keys()
        .step_by(3)
        .cloned()
        .map(Value::from)
        .collect();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "write_note",
        "description": "Writes a note to the store; every field is described below.",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The audit record above as a derived struct, fields in declaration (not canonical) order
/// (`serde_json::to_value` puts them in a map, which `canonical_value` writes in order).
#[derive(Serialize, serde::Deserialize)]
struct AuditRecord {
    ts: u64,
    seq: u64,
    request_id: String,
    method: String,
    name: String,
    decision: String,
    outcome: String,
    reason: String,
    args_digest: String,
    policy_digest: String,
    prev_sha256: String,
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                black_box(f());
                start.elapsed()
            })
            .collect(),
    )
}

/// `sha256sum FILE`'s hex digest, or `None` when the tool is missing.
fn sha256sum(path: &Path) -> Option<String> {
    let out = Command::new("sha256sum").arg(path).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout)[..64].to_owned())
}

fn against_sha256sum(file_mib: usize, runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    std::fs::write(&path, bytes(file_mib * MIB)).unwrap();
    let small = dir.path().join("small");
    std::fs::write(&small, bytes(MIB)).unwrap();

    // Warm the page cache, and check both compute the same digest.
    let ours = Sha256Digest::of(&std::fs::read(&path).unwrap()).to_hex();
    let Some(theirs) = sha256sum(&path) else {
        println!("sha256sum is not available: comparison skipped");
        return;
    };
    assert_eq!(ours, theirs, "sha256sum disagrees with Sha256Digest::of");

    let size = (file_mib * MIB) as f64;
    let ours = time(runs, || Sha256Digest::of(&std::fs::read(&path).unwrap()));
    let theirs = time(runs, || sha256sum(&path));
    let small_theirs = time(runs, || sha256sum(&small));
    let rate = |d: Duration| size / 1e6 / d.as_secs_f64();
    println!(
        "{file_mib} MiB file, median of {runs}: read + Sha256Digest::of {:.1} ms ({:.0} MB/s); sha256sum {:.1} ms ({:.0} MB/s, process included); ratio {:.2}x",
        ours.as_secs_f64() * 1e3,
        rate(ours),
        theirs.as_secs_f64() * 1e3,
        rate(theirs),
        ours.as_secs_f64() / theirs.as_secs_f64(),
    );
    println!(
        "sha256sum of a 1 MiB file: {:.2} ms (mostly process start)",
        small_theirs.as_secs_f64() * 1e3
    );
}

fn main() {
    // `cargo bench` passes `--bench`; under `cargo test --benches` criterion runs each function
    // once, and the file comparison is a small smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c);
    c.final_summary();
    if full {
        against_sha256sum(64, 7);
    } else {
        against_sha256sum(1, 1);
    }
}
