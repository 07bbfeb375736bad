//! Audit logs built by an independent writer (the chain formula of docs/audit-format.md over
//! fuzz-chosen records, unknown and nested fields included) verify intact with the right count
//! and head; one fuzz-chosen change (a byte changed, two lines swapped, a line other than the
//! last deleted) is always detected.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use toolgate_audit::{Sha256Digest, verify_reader};
use toolgate_canon::canonical_value;

#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn to_value(&self, depth: usize) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            // Audit records hold integers only, and RFC 8785 writes numbers as doubles: keep
            // them where the rounded value is still an integer of the same JSON type.
            Json::Int(i) => Value::from(i >> 2),
            Json::Str(s) => Value::String(s.clone()),
            _ if depth >= 8 => Value::Null,
            Json::Arr(items) => Value::Array(items.iter().map(|j| j.to_value(depth + 1)).collect()),
            Json::Obj(members) => Value::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value(depth + 1)))
                    .collect(),
            ),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Change {
    None,
    Byte { at: usize, xor: u8 },
    Swap { a: usize, b: usize },
    Delete { at: usize },
}

#[derive(Arbitrary, Debug)]
struct Input {
    records: Vec<Vec<(String, Json)>>,
    change: Change,
}

fuzz_target!(|input: Input| {
    if input.records.is_empty() || input.records.len() > 64 {
        return;
    }
    let mut prev = Sha256Digest::ZERO;
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for (i, fields) in input.records.iter().enumerate() {
        let mut record = Map::new();
        for (key, value) in fields {
            record.insert(key.clone(), value.to_value(0));
        }
        record.remove("sha256");
        record.insert("prev_sha256".into(), Value::from(prev.to_hex()));
        record.insert("seq".into(), Value::from(i as u64 + 1));
        let mut record = Value::Object(record);
        let body = canonical_value(&record);
        let sha = Sha256Digest::of_parts(&[prev.to_hex().as_bytes(), &body]);
        record
            .as_object_mut()
            .expect("an object")
            .insert("sha256".into(), Value::from(sha.to_hex()));
        let mut line = canonical_value(&record);
        line.push(b'\n');
        lines.push(line);
        prev = sha;
    }
    let log: Vec<u8> = lines.concat();
    let report = verify_reader(log.as_slice()).expect("reading a slice cannot fail");
    assert!(
        report.is_intact(),
        "a well-formed log does not verify: {report}"
    );
    assert_eq!(report.records, lines.len() as u64);
    assert_eq!(report.head, prev);

    let n = lines.len();
    let changed: Vec<u8> = match input.change {
        Change::None => return,
        Change::Byte { at, xor } => {
            if xor == 0 {
                return;
            }
            let mut log = log.clone();
            let at = at % log.len();
            log[at] ^= xor;
            log
        }
        Change::Swap { a, b } => {
            let (a, b) = (a % n, b % n);
            if a == b {
                return;
            }
            let mut lines = lines.clone();
            lines.swap(a, b);
            lines.concat()
        }
        Change::Delete { at } => {
            // Cutting the last line is truncation, which only a checkpoint can reveal.
            if n < 2 {
                return;
            }
            let mut lines = lines.clone();
            lines.remove(at % (n - 1));
            lines.concat()
        }
    };
    let report = verify_reader(changed.as_slice()).expect("reading a slice cannot fail");
    assert!(
        !report.is_intact(),
        "a changed log verifies: {report}\n{}",
        String::from_utf8_lossy(&changed)
    );
});
