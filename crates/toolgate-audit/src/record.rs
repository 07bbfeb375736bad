//! The record format: building a chained line and checking one line on its own.
//!
//! The writer and the verifier share [`check_line`], so what `open` accepts as the head of the chain
//! is exactly what the verifier would accept as a good line.

use serde_json::{Map, Value};
use toolgate_canon::{Sha256Digest, canonical_value};

use crate::{AuditEntry, ProblemKind};

/// The longest line (newline included) the writer produces and the readers accept.
///
/// Audit records hold names, outcomes and digests, so real lines are a few hundred bytes; the limit
/// exists so that a garbage file without newlines cannot make a reader allocate without bound.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// A record ready to be written.
#[derive(Debug)]
pub(crate) struct Sealed {
    /// Canonical JSON followed by `\n`.
    pub(crate) line: Vec<u8>,
    pub(crate) sha256: Sha256Digest,
}

/// The chain link of a line that passed [`check_line`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    pub(crate) prev: Sha256Digest,
    pub(crate) sha256: Sha256Digest,
}

/// Why one line is bad on its own (chain links are checked by the caller).
#[derive(Debug, Clone)]
pub(crate) struct LineFault {
    pub(crate) kind: ProblemKind,
    pub(crate) detail: String,
}

/// The value RFC 8785 will actually write for the integer `ts`.
///
/// RFC 8785 numbers are IEEE-754 doubles, so a nanosecond timestamp (about 1.8e18, above 2^53) is
/// written rounded to the nearest double in its shortest decimal form. We store that rounded value
/// so that the receipt, the line and any reader agree on the same integer.
pub(crate) fn representable(ts: u64) -> u64 {
    let text = canonical_value(&Value::from(ts));
    std::str::from_utf8(&text)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(ts)
}

/// Builds the line for `entry` chained onto `prev`. `extra` adds fields beyond the entry's own (used
/// by the recovery record).
pub(crate) fn seal(
    entry: &AuditEntry,
    extra: Vec<(&'static str, Value)>,
    ts: u64,
    prev: Sha256Digest,
) -> Sealed {
    let prev_hex = prev.to_hex();
    let mut record = Map::new();
    record.insert("ts".into(), Value::from(ts));
    record.insert("request_id".into(), Value::from(entry.request_id.as_str()));
    record.insert("method".into(), Value::from(entry.method.as_str()));
    record.insert("name".into(), Value::from(entry.name.as_str()));
    record.insert("decision".into(), Value::from(entry.decision.as_str()));
    record.insert("outcome".into(), Value::from(entry.outcome.as_str()));
    record.insert(
        "args_digest".into(),
        Value::from(entry.args_digest.to_hex()),
    );
    record.insert("prev_sha256".into(), Value::from(prev_hex.as_str()));
    if let Some(reason) = &entry.reason {
        record.insert("reason".into(), Value::from(reason.as_str()));
    }
    for (key, value) in extra {
        record.insert(key.into(), value);
    }
    let mut record = Value::Object(record);
    let body = canonical_value(&record);
    let sha256 = Sha256Digest::of_parts(&[prev_hex.as_bytes(), &body]);
    if let Value::Object(map) = &mut record {
        map.insert("sha256".into(), Value::from(sha256.to_hex()));
    }
    let mut line = canonical_value(&record);
    line.push(b'\n');
    Sealed { line, sha256 }
}

/// Checks one line (without its `\n`) in isolation: a JSON object with hex `prev_sha256` and
/// `sha256`, integers only, byte-identical to its canonical form, and a `sha256` that matches the
/// hash recomputed from every other field (unknown fields included).
pub(crate) fn check_line(line: &[u8]) -> Result<Link, LineFault> {
    let fault = |kind, detail: String| LineFault { kind, detail };
    let mut value: Value = serde_json::from_slice(line)
        .map_err(|e| fault(ProblemKind::Malformed, format!("not valid JSON ({e})")))?;
    let Some(map) = value.as_object() else {
        return Err(fault(ProblemKind::Malformed, "not a JSON object".into()));
    };
    let prev = digest_field(map, "prev_sha256")?;
    let sha256 = digest_field(map, "sha256")?;
    if !integers_only(&value) {
        return Err(fault(
            ProblemKind::NotCanonical,
            "contains a non-integer number; audit records hold integers only".into(),
        ));
    }
    if canonical_value(&value) != line {
        return Err(fault(
            ProblemKind::NotCanonical,
            "the line is not the canonical JSON (RFC 8785) of its own content".into(),
        ));
    }
    if let Value::Object(map) = &mut value {
        map.remove("sha256");
    }
    let body = canonical_value(&value);
    let recomputed = Sha256Digest::of_parts(&[prev.to_hex().as_bytes(), &body]);
    if recomputed != sha256 {
        return Err(fault(
            ProblemKind::Modified,
            "sha256 does not match the hash recomputed from the record".into(),
        ));
    }
    Ok(Link { prev, sha256 })
}

fn digest_field(map: &Map<String, Value>, key: &str) -> Result<Sha256Digest, LineFault> {
    map.get(key)
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<Sha256Digest>().ok())
        .ok_or_else(|| LineFault {
            kind: ProblemKind::Malformed,
            detail: format!("missing or invalid {key} (expected 64 lowercase hex characters)"),
        })
}

/// Whether every number in `value` is an integer. Floats are not allowed in audit records because
/// their text form is where independent canonicalizers most often disagree.
fn integers_only(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::Array(items) => items.iter().all(integers_only),
        Value::Object(map) => map.values().all(integers_only),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Decision;

    #[test]
    fn sealed_line_passes_check_and_links_to_prev() {
        let entry = AuditEntry::tool_call(
            "r-1",
            "write_note",
            Decision::Allow,
            "committed",
            Sha256Digest::of(b"{}"),
        )
        .with_reason("policy allow");
        let ts = representable(1_780_000_000_123_456_789);
        let first = seal(&entry, vec![], ts, Sha256Digest::ZERO);
        let second = seal(&entry, vec![("extra", Value::from(7))], ts, first.sha256);
        let link = check_line(first.line.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(link.prev, Sha256Digest::ZERO);
        assert_eq!(link.sha256, first.sha256);
        let link = check_line(second.line.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(link.prev, first.sha256);
        let text = String::from_utf8(second.line).unwrap();
        assert!(text.ends_with(&format!("\"ts\":{ts}}}\n")), "{text}");
        assert!(text.contains("\"reason\":\"policy allow\""), "{text}");
    }

    #[test]
    fn representable_is_a_fixed_point() {
        for raw in [
            0,
            1,
            9_007_199_254_740_993,
            1_780_000_000_123_456_789,
            u64::MAX,
        ] {
            let ts = representable(raw);
            assert_eq!(representable(ts), ts, "raw {raw}");
        }
        assert_eq!(representable(12_345), 12_345);
    }

    #[test]
    fn floats_are_not_canonical() {
        let prev = Sha256Digest::ZERO.to_hex();
        let line = format!(r#"{{"prev_sha256":"{prev}","sha256":"{prev}","x":1.5}}"#);
        let fault = check_line(line.as_bytes()).unwrap_err();
        assert_eq!(fault.kind, ProblemKind::NotCanonical);
    }
}
