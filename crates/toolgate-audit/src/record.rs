//! The record format: building a chained line and checking one line on its own.
//!
//! The writer and the verifier share [`check_line`], so what `open` accepts as the head of the chain
//! is exactly what the verifier would accept as a good line.

use serde_json::{Map, Value};
use toolgate_canon::{
    Sha256Digest, canonical_value, write_canonical_str, write_canonical_u64, write_canonical_value,
};

use crate::{AuditEntry, ProblemKind};

/// The longest line (newline included) the writer produces and the readers accept.
///
/// Audit records hold names, outcomes and digests, so real lines are a few hundred bytes; the limit
/// exists so that a garbage file without newlines cannot make a reader allocate without bound.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The longest `request_id`, `method` or `name` recorded as it is, in bytes of UTF-8. A longer
/// one (a caller's 1 MiB JSON-RPC id, an unknown tool's name) is recorded as `sha256:<hex>` of its
/// bytes, with its length in `<field>_bytes`, so every decision is audited whatever the size of its
/// inputs and an audit line always fits [`MAX_LINE_BYTES`].
pub const MAX_TEXT_FIELD_BYTES: usize = 256;

/// The longest `reason` recorded as it is (reasons are the gate's own words, a few hundred bytes;
/// longer ones are recorded as their digest and length like the other text fields).
pub const MAX_REASON_BYTES: usize = 4096;

/// A text field of a record, bounded: the text itself, or its digest when longer than `max`.
enum Bounded<'a> {
    Text(&'a str),
    Digest { text: String, bytes: u64 },
}

impl<'a> Bounded<'a> {
    fn of(text: &'a str, max: usize) -> Self {
        if text.len() <= max {
            Bounded::Text(text)
        } else {
            Bounded::Digest {
                text: format!("sha256:{}", Sha256Digest::of(text.as_bytes())),
                bytes: u64::try_from(text.len()).unwrap_or(u64::MAX),
            }
        }
    }

    fn text(&self) -> &str {
        match self {
            Bounded::Text(text) => text,
            Bounded::Digest { text, .. } => text,
        }
    }

    fn bytes(&self) -> Option<u64> {
        match self {
            Bounded::Text(_) => None,
            Bounded::Digest { bytes, .. } => Some(*bytes),
        }
    }
}

/// A record ready to be written.
#[derive(Debug)]
pub struct Sealed {
    /// Canonical JSON followed by `\n`.
    pub line: Vec<u8>,
    /// The record's `sha256`: the next record's `prev_sha256`.
    pub sha256: Sha256Digest,
}

/// The chain link of a line that passed [`check_line`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    pub(crate) prev: Sha256Digest,
    pub(crate) sha256: Sha256Digest,
    pub(crate) seq: SeqField,
}

/// The `seq` field of a line, which the hash covers but [`check_line`] does not judge: whether a
/// missing or odd `seq` is damage depends on the lines around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqField {
    /// No `seq`: a record written before sequence numbers existed.
    Absent,
    /// A positive integer.
    Valid(u64),
    /// Present but not a positive integer.
    Invalid,
}

/// Reads the `seq` of any JSON text without judging anything else, for the verifier's look-ahead.
pub(crate) fn peek_seq(line: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Only {
        seq: Option<u64>,
    }
    serde_json::from_slice::<Only>(line).ok()?.seq
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
///
/// Values within 1,024 of `u64::MAX` (nanoseconds after the year 2554) round up to 2^64, which no
/// `u64` holds and a reader would parse as a float; they are clamped to the largest double below
/// 2^64 instead, so the writer never produces a line the verifier rejects.
pub(crate) fn representable(ts: u64) -> u64 {
    /// The largest double below 2^64 (2^64 - 2^11) as RFC 8785 writes it: the shortest decimal
    /// that rounds to it.
    const LARGEST_BELOW_2_64: u64 = 18_446_744_073_709_550_000;
    let mut text = Vec::with_capacity(24);
    write_canonical_u64(&mut text, ts);
    std::str::from_utf8(&text)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(LARGEST_BELOW_2_64)
}

/// The most determining Cedar policy ids a record names (`cedar_policies`).
const MAX_CEDAR_POLICIES: usize = 64;

/// Builds the line for `entry` chained onto `prev`, record number `seq`, stamped `ts` (nanoseconds
/// since the epoch, [`crate::now_ns`]): the one sealing of every sink, so that a chain kept
/// elsewhere (the PostgreSQL one) has exactly the file format's lines. `extra` adds fields beyond
/// the entry's own (used by the recovery record; a key repeated there replaces the entry's
/// field).
///
/// The members are written once, in RFC 8785 order, straight into the line's buffer (no JSON value
/// is built for the entry's own fields): that is the hashed body, and `sha256` is then inserted at
/// its place in that order, so the line is the canonical form of the record without a second pass (checked against the canonicalizer
/// in the tests below and by every `check_line`).
pub fn seal(
    entry: &AuditEntry,
    extra: Vec<(&'static str, Value)>,
    ts: u64,
    seq: u64,
    prev: Sha256Digest,
) -> Sealed {
    let prev_hex = prev.hex_bytes();
    let request_id = Bounded::of(&entry.request_id, MAX_TEXT_FIELD_BYTES);
    let method = Bounded::of(&entry.method, MAX_TEXT_FIELD_BYTES);
    let name = Bounded::of(&entry.name, MAX_TEXT_FIELD_BYTES);
    let principal = entry
        .principal
        .as_deref()
        .map(|principal| Bounded::of(principal, MAX_TEXT_FIELD_BYTES));
    let reason = entry
        .reason
        .as_deref()
        .map(|reason| Bounded::of(reason, MAX_REASON_BYTES));
    let separate_reason = entry
        .separate_reason
        .as_deref()
        .map(|reason| Bounded::of(reason, MAX_REASON_BYTES));
    let [channel, tenant, client_name, client_version] = [
        &entry.channel,
        &entry.tenant,
        &entry.client_name,
        &entry.client_version,
    ]
    .map(|text| {
        text.as_deref()
            .map(|text| Bounded::of(text, MAX_TEXT_FIELD_BYTES))
    });
    let mut members: Vec<(&str, Field<'_>)> = Vec::with_capacity(18 + extra.len());
    members.extend([
        ("ts", Field::Number(ts)),
        ("request_id", Field::Text(request_id.text())),
        ("method", Field::Text(method.text())),
        ("name", Field::Text(name.text())),
        ("decision", Field::Text(entry.decision.as_str())),
        ("outcome", Field::Text(entry.outcome.as_str())),
        ("args_digest", Field::Digest(entry.args_digest)),
        ("prev_sha256", Field::Digest(prev)),
        ("seq", Field::Number(seq)),
    ]);
    if let Some(reason) = &reason {
        members.push(("reason", Field::Text(reason.text())));
    }
    if let Some(principal) = &principal {
        members.push(("principal", Field::Text(principal.text())));
    }
    if let Some(reason) = &separate_reason {
        members.push(("separate_reason", Field::Text(reason.text())));
    }
    if let Some(dropped) = entry.dropped_fields {
        members.push(("dropped_fields", Field::Number(dropped)));
    }
    for (key, field) in [
        ("channel", &channel),
        ("tenant", &tenant),
        ("client_name", &client_name),
        ("client_version", &client_version),
    ] {
        if let Some(field) = field {
            members.push((key, Field::Text(field.text())));
        }
    }
    for (key, field) in [
        ("request_id_bytes", Some(&request_id)),
        ("method_bytes", Some(&method)),
        ("name_bytes", Some(&name)),
        ("reason_bytes", reason.as_ref()),
        ("principal_bytes", principal.as_ref()),
        ("separate_reason_bytes", separate_reason.as_ref()),
        ("channel_bytes", channel.as_ref()),
        ("tenant_bytes", tenant.as_ref()),
        ("client_name_bytes", client_name.as_ref()),
        ("client_version_bytes", client_version.as_ref()),
    ] {
        if let Some(bytes) = field.and_then(Bounded::bytes) {
            members.push((key, Field::Number(bytes)));
        }
    }
    if let Some(digest) = entry.policy_digest {
        members.push(("policy_digest", Field::Digest(digest)));
    }
    if let Some(digest) = entry.contract_digest {
        members.push(("contract_digest", Field::Digest(digest)));
    }
    if let Some(digest) = entry.cedar_digest {
        members.push(("cedar_digest", Field::Digest(digest)));
    }
    if let Some(policies) = &entry.cedar_policies {
        members.push(("cedar_policies", Field::Ids(policies)));
    }
    for (key, value) in extra {
        members.retain(|(k, _)| *k != key);
        members.push((key, Field::Json(value)));
    }
    // `sha256` is added after hashing; a caller-supplied one would be replaced by it, as before.
    members.retain(|(k, _)| *k != "sha256");
    members.sort_by(|(a, _), (b, _)| utf16_order(a, b));
    // The record without `sha256`, written once into the line's buffer; `sha256` is then
    // inserted where its key sorts (`at`: the offset of the first member after it).
    let mut line = Vec::with_capacity(512);
    line.push(b'{');
    let mut at = None;
    for (i, (key, field)) in members.iter().enumerate() {
        if i > 0 {
            line.push(b',');
        }
        if at.is_none() && utf16_order(key, "sha256").is_gt() {
            at = Some(line.len());
        }
        write_canonical_str(&mut line, key);
        line.push(b':');
        field.write(&mut line);
    }
    line.push(b'}');
    let sha256 = Sha256Digest::of_parts(&[&prev_hex, &line]);
    let mut sha_member = Vec::with_capacity(76);
    sha_member.extend_from_slice(b"\"sha256\":\"");
    sha_member.extend_from_slice(&sha256.hex_bytes());
    sha_member.push(b'"');
    match at {
        // Before the member at `at` (whose preceding comma, if any, stays before `sha256`).
        Some(at) => {
            sha_member.push(b',');
            line.splice(at..at, sha_member);
        }
        // Last: after a comma if any member precedes it.
        None => {
            let close = line.len() - 1;
            if members.is_empty() {
                line.splice(close..close, sha_member);
            } else {
                line.splice(close..close, std::iter::once(b',').chain(sha_member));
            }
        }
    }
    line.push(b'\n');
    Sealed { line, sha256 }
}

/// One member's value in [`seal`], written in canonical form without building a JSON value.
enum Field<'a> {
    Text(&'a str),
    Number(u64),
    Digest(Sha256Digest),
    /// Cedar policy ids: operator text, bounded all the same (at most [`MAX_CEDAR_POLICIES`]
    /// ids, each like a text field, and the number left out as a last element).
    Ids(&'a [String]),
    Json(Value),
}

impl Field<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Field::Text(text) => write_canonical_str(out, text),
            Field::Number(number) => write_canonical_u64(out, *number),
            Field::Digest(digest) => {
                out.push(b'"');
                out.extend_from_slice(&digest.hex_bytes());
                out.push(b'"');
            }
            Field::Ids(ids) => {
                out.push(b'[');
                for (i, id) in ids.iter().take(MAX_CEDAR_POLICIES).enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_canonical_str(out, Bounded::of(id, MAX_TEXT_FIELD_BYTES).text());
                }
                if ids.len() > MAX_CEDAR_POLICIES {
                    out.push(b',');
                    let more = format!("+{} more", ids.len() - MAX_CEDAR_POLICIES);
                    write_canonical_str(out, &more);
                }
                out.push(b']');
            }
            Field::Json(value) => write_canonical_value(out, value),
        }
    }
}

/// RFC 8785's member order: by the keys' UTF-16 code units.
fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
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
    if !is_canonical_line(&value, line) {
        return Err(fault(
            ProblemKind::NotCanonical,
            "the line is not the canonical JSON (RFC 8785) of its own content".into(),
        ));
    }
    let seq = match map.get("seq") {
        None => SeqField::Absent,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => SeqField::Valid(n),
            _ => SeqField::Invalid,
        },
    };
    let prev_hex = prev.to_hex();
    let recomputed = match body_without_sha256(line, &sha256.to_hex()) {
        Some((before, after)) => Sha256Digest::of_parts(&[prev_hex.as_bytes(), before, after]),
        None => {
            if let Value::Object(map) = &mut value {
                map.remove("sha256");
            }
            Sha256Digest::of_parts(&[prev_hex.as_bytes(), &canonical_value(&value)])
        }
    };
    if recomputed != sha256 {
        return Err(fault(
            ProblemKind::Modified,
            "sha256 does not match the hash recomputed from the record".into(),
        ));
    }
    Ok(Link { prev, sha256, seq })
}

/// The canonical JSON of a canonical `line` without its top-level `sha256` member, as the two byte
/// ranges around that member, or `None` when the member cannot be located unambiguously.
///
/// In canonical JSON, removing one member of an object leaves the canonical form of the rest
/// (members stay sorted, no whitespace), so cutting `"sha256":"<hex>"` and one adjacent comma out
/// of the line gives exactly what re-serializing would, without a second canonicalization. A quote
/// inside a string is always escaped, so the unescaped text `"sha256":"` can only be a key; when it
/// appears more than once (a nested object with that key) the caller falls back to the slow path.
fn body_without_sha256<'a>(line: &'a [u8], hex: &str) -> Option<(&'a [u8], &'a [u8])> {
    const KEY: &[u8] = b"\"sha256\":\"";
    let mut found = None;
    let mut from = 0;
    while let Some(at) = find(&line[from..], KEY) {
        if found.is_some() {
            return None;
        }
        found = Some(from + at);
        from += at + KEY.len();
    }
    let start = found?;
    let value_start = start + KEY.len();
    let value_end = value_start + hex.len();
    if line.get(value_start..value_end)? != hex.as_bytes() || line.get(value_end) != Some(&b'"') {
        return None;
    }
    let end = value_end + 1;
    // Only a top-level member is preceded by `{` or `,` at depth one; checking the neighbours is
    // enough because the key is unique in the line.
    match (line.get(start.checked_sub(1)?), line.get(end)) {
        (Some(b','), Some(b',' | b'}')) => Some((&line[..start - 1], &line[end..])),
        (Some(b'{'), Some(b',')) => Some((&line[..start], &line[end + 1..])),
        (Some(b'{'), Some(b'}')) => Some((&line[..start], &line[end..])),
        _ => None,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
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

/// Whether `line` is the RFC 8785 form of `value` (which was parsed from it and holds integers
/// only).
///
/// The verifier spends most of its time here, so the common case takes a shortcut: for a value
/// whose keys are all ASCII and whose integers RFC 8785 writes unchanged, serde_json's compact
/// output *is* the RFC 8785 form (keys sorted by bytes, which for ASCII is the UTF-16 order; the
/// same string escapes: `\b \t \n \f \r`, other controls as lowercase `\u00xx`, nothing else;
/// integers in plain decimal). If the shortcut does not confirm the line, the full canonicalizer
/// decides, so the shortcut can only save time, never change a verdict.
fn is_canonical_line(value: &Value, line: &[u8]) -> bool {
    if plain(value) && serde_json::to_vec(value).is_ok_and(|compact| compact == line) {
        return true;
    }
    canonical_value(value) == line
}

/// ASCII keys in ascending order and integers that RFC 8785 (which writes every number as a
/// double) prints exactly as their decimal value.
///
/// The order is checked, not assumed: serde_json's default map iterates sorted, but with its
/// `preserve_order` feature, which any crate of a program can switch on for all of them, a parsed
/// map keeps the line's order, and a line with its keys out of order would print back unchanged.
fn plain(value: &Value) -> bool {
    const EXACT: u64 = 1 << 53;
    match value {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) if u <= EXACT => true,
            (_, Some(i)) if i.unsigned_abs() <= EXACT => true,
            // Above 2^53 the double's shortest form must spell the same integer; Rust prints an
            // integral f64 below 1e21 without an exponent, as RFC 8785 does.
            (Some(u), _) => format!("{}", u as f64) == u.to_string(),
            (_, Some(i)) => format!("{}", i as f64) == i.to_string(),
            _ => false,
        },
        Value::Array(items) => items.iter().all(plain),
        Value::Object(map) => {
            let mut previous: Option<&str> = None;
            map.iter().all(|(k, v)| {
                let ascending = previous.is_none_or(|p| p < k.as_str());
                previous = Some(k);
                ascending && k.is_ascii() && plain(v)
            })
        }
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
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
    use crate::AuditDecision;
    use serde_json::json;

    #[test]
    fn sealed_line_passes_check_and_links_to_prev() {
        let entry = AuditEntry::tool_call(
            "r-1",
            "write_note",
            AuditDecision::Allow,
            crate::Outcome::Committed,
            Sha256Digest::of(b"{}"),
        )
        .with_reason(crate::Reason::Note("policy allow".to_owned()));
        let ts = representable(1_780_000_000_123_456_789);
        let first = seal(&entry, vec![], ts, 1, Sha256Digest::ZERO);
        let second = seal(&entry, vec![("extra", Value::from(7))], ts, 2, first.sha256);
        let link = check_line(first.line.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(link.prev, Sha256Digest::ZERO);
        assert_eq!(link.sha256, first.sha256);
        let link = check_line(second.line.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(link.prev, first.sha256);
        let text = String::from_utf8(second.line).unwrap();
        assert!(text.ends_with(&format!("\"ts\":{ts}}}\n")), "{text}");
        assert!(text.contains("\"reason\":\"policy allow\""), "{text}");
        assert!(text.contains("\"seq\":2,"), "{text}");
        assert_eq!(link.seq, SeqField::Valid(2));
    }

    #[test]
    fn oversized_text_fields_are_recorded_as_digest_and_length() {
        let long_id = "i".repeat(2 << 20);
        let long_name = "n".repeat(MAX_TEXT_FIELD_BYTES + 1);
        let long_reason = "r".repeat(MAX_REASON_BYTES + 1);
        let entry = AuditEntry::tool_call(
            long_id.as_str(),
            long_name.as_str(),
            AuditDecision::Deny,
            crate::Outcome::NotExecuted,
            Sha256Digest::of(b"{}"),
        )
        .with_reason(crate::Reason::Note(long_reason.clone()));
        let sealed = seal(&entry, vec![], 1, 1, Sha256Digest::ZERO);
        assert!(sealed.line.len() < 1024, "{}", sealed.line.len());
        check_line(sealed.line.strip_suffix(b"\n").unwrap()).unwrap();
        let record: Value = serde_json::from_slice(&sealed.line).unwrap();
        for (field, text) in [
            ("request_id", &long_id),
            ("name", &long_name),
            ("reason", &long_reason),
        ] {
            assert_eq!(
                record[field],
                format!("sha256:{}", Sha256Digest::of(text.as_bytes())),
                "{field}"
            );
            assert_eq!(record[format!("{field}_bytes")], text.len(), "{field}");
        }
        assert!(record.get("method_bytes").is_none());
        // At the limit, the text itself and no length.
        let id = "i".repeat(MAX_TEXT_FIELD_BYTES);
        let entry = AuditEntry::tool_call(
            id.as_str(),
            "write_note",
            AuditDecision::Deny,
            crate::Outcome::NotExecuted,
            Sha256Digest::of(b"{}"),
        );
        let record: Value =
            serde_json::from_slice(&seal(&entry, vec![], 1, 1, Sha256Digest::ZERO).line).unwrap();
        assert_eq!(record["request_id"], id.as_str());
        assert!(record.get("request_id_bytes").is_none());
    }

    #[test]
    fn separate_reason_and_dropped_fields_are_written_only_when_present_and_bounded() {
        let plain = AuditEntry::tool_call(
            "r",
            "create_booking",
            AuditDecision::Allow,
            crate::Outcome::Committed,
            Sha256Digest::of(b"{}"),
        );
        let record: Value =
            serde_json::from_slice(&seal(&plain, vec![], 1, 1, Sha256Digest::ZERO).line).unwrap();
        assert!(record.get("separate_reason").is_none());
        assert!(record.get("dropped_fields").is_none());

        let noted = plain
            .clone()
            .with_separate_reason("a second stay, same guest and date")
            .with_dropped_fields(0);
        let sealed = seal(&noted, vec![], 1, 1, Sha256Digest::ZERO);
        check_line(sealed.line.strip_suffix(b"\n").unwrap()).unwrap();
        let record: Value = serde_json::from_slice(&sealed.line).unwrap();
        assert_eq!(
            record["separate_reason"],
            "a second stay, same guest and date"
        );
        assert_eq!(record["dropped_fields"], 0);
        assert!(record.get("separate_reason_bytes").is_none());

        let long = "r".repeat(MAX_REASON_BYTES + 1);
        let sealed = seal(
            &plain
                .with_separate_reason(long.as_str())
                .with_dropped_fields(7),
            vec![],
            1,
            1,
            Sha256Digest::ZERO,
        );
        check_line(sealed.line.strip_suffix(b"\n").unwrap()).unwrap();
        let record: Value = serde_json::from_slice(&sealed.line).unwrap();
        assert_eq!(
            record["separate_reason"],
            format!("sha256:{}", Sha256Digest::of(long.as_bytes()))
        );
        assert_eq!(record["separate_reason_bytes"], long.len());
        assert_eq!(record["dropped_fields"], 7);
    }

    #[test]
    fn caller_fields_are_written_only_when_present_and_bounded() {
        let plain = AuditEntry::tool_call(
            "r",
            "write_note",
            AuditDecision::Allow,
            crate::Outcome::Committed,
            Sha256Digest::of(b"{}"),
        );
        let record: Value =
            serde_json::from_slice(&seal(&plain, vec![], 1, 1, Sha256Digest::ZERO).line).unwrap();
        for key in ["channel", "tenant", "client_name", "client_version"] {
            assert!(record.get(key).is_none(), "{key}");
        }
        let long = "v".repeat(MAX_TEXT_FIELD_BYTES + 1);
        let entry = plain
            .with_channel("http")
            .with_tenant("acme")
            .with_client("probe \"x\"", long.as_str());
        let sealed = seal(&entry, vec![], 1, 1, Sha256Digest::ZERO);
        check_line(sealed.line.strip_suffix(b"\n").unwrap()).unwrap();
        let record: Value = serde_json::from_slice(&sealed.line).unwrap();
        assert_eq!(
            (
                &record["channel"],
                &record["tenant"],
                &record["client_name"]
            ),
            (&json!("http"), &json!("acme"), &json!("probe \"x\""))
        );
        assert_eq!(
            record["client_version"],
            format!("sha256:{}", Sha256Digest::of(long.as_bytes()))
        );
        assert_eq!(record["client_version_bytes"], long.len());
    }

    #[test]
    fn sealed_line_is_the_canonical_record() {
        let entry = AuditEntry::tool_call(
            "r-\u{1F600}\n\"x\"",
            "wr\u{e000}te",
            AuditDecision::Deny,
            crate::Outcome::NotExecuted,
            Sha256Digest::of(b"{}"),
        )
        .with_reason(crate::Reason::Note("r\u{7f}\u{2028}".to_owned()));
        let extras: Vec<Vec<(&'static str, Value)>> = vec![
            vec![],
            vec![("a", Value::from(1))],
            vec![("zz", serde_json::json!({"b": [1, "\u{10000}"], "a": null}))],
            vec![("sha", Value::from(2)), ("sha256x", Value::from(3))],
            vec![("\u{e000}", Value::from(4)), ("\u{1F600}", Value::from(5))],
            vec![
                ("outcome", Value::from("replaced")),
                ("sha256", Value::from("x")),
            ],
        ];
        for extra in extras {
            let sealed = seal(
                &entry,
                extra.clone(),
                9_007_199_254_740_993,
                3,
                Sha256Digest::ZERO,
            );
            let line = sealed.line.strip_suffix(b"\n").unwrap();
            let mut record: Value = serde_json::from_slice(line).unwrap();
            assert_eq!(canonical_value(&record), line, "{extra:?}");
            let map = record.as_object_mut().unwrap();
            assert_eq!(
                map.remove("sha256"),
                Some(Value::from(sealed.sha256.to_hex()))
            );
            for (key, value) in extra.iter().filter(|(k, _)| *k != "sha256") {
                assert_eq!(map.get(*key), Some(value), "{key}");
            }
            let body = canonical_value(&record);
            let prev = Sha256Digest::ZERO.to_hex();
            assert_eq!(
                Sha256Digest::of_parts(&[prev.as_bytes(), &body]),
                sealed.sha256,
                "{extra:?}"
            );
            check_line(line).unwrap();
        }
    }

    #[test]
    fn cedar_policy_ids_are_written_canonical_and_bounded() {
        let long = "p".repeat(MAX_TEXT_FIELD_BYTES + 1);
        let few: Vec<String> = vec!["z\u{1F600}".into(), "a\"\n".into(), long.clone()];
        let many: Vec<String> = (0..MAX_CEDAR_POLICIES + 3)
            .map(|i| format!("p{i}"))
            .collect();
        for (ids, expected) in [
            (Vec::new(), json!([])),
            (
                few.clone(),
                json!([
                    "z\u{1F600}",
                    "a\"\n",
                    format!("sha256:{}", Sha256Digest::of(long.as_bytes()))
                ]),
            ),
            (
                many.clone(),
                Value::Array(
                    many[..MAX_CEDAR_POLICIES]
                        .iter()
                        .map(|id| json!(id))
                        .chain([json!("+3 more")])
                        .collect(),
                ),
            ),
        ] {
            let mut entry = AuditEntry::tool_call(
                "r",
                "t",
                AuditDecision::Allow,
                crate::Outcome::Observed,
                Sha256Digest::of(b"{}"),
            );
            entry.set_cedar(Some(ids.into()), Sha256Digest::of(b"set"));
            let sealed = seal(&entry, Vec::new(), 1, 1, Sha256Digest::ZERO);
            let line = sealed.line.strip_suffix(b"\n").unwrap();
            let record: Value = serde_json::from_slice(line).unwrap();
            assert_eq!(canonical_value(&record), line);
            assert_eq!(record["cedar_policies"], expected);
            check_line(line).unwrap();
        }
    }

    #[test]
    fn fast_body_equals_the_canonical_body() {
        let prev = Sha256Digest::ZERO.to_hex();
        let sha = Sha256Digest::of(b"x").to_hex();
        for text in [
            format!(r#"{{"a":1,"prev_sha256":"{prev}","sha256":"{sha}","z":2}}"#),
            format!(r#"{{"prev_sha256":"{prev}","sha256":"{sha}"}}"#),
            format!(r#"{{"sha256":"{sha}","zz":"{prev}"}}"#),
        ] {
            let (before, after) = body_without_sha256(text.as_bytes(), &sha).unwrap();
            let mut value: Value = serde_json::from_str(&text).unwrap();
            value.as_object_mut().unwrap().remove("sha256");
            assert_eq!([before, after].concat(), canonical_value(&value), "{text}");
        }
        let nested = format!(r#"{{"a":{{"sha256":"{sha}"}},"sha256":"{sha}"}}"#);
        assert!(body_without_sha256(nested.as_bytes(), &sha).is_none());
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
        // Found by fuzzing: a timestamp that rounds to 2^64 used to be written as
        // 18446744073709552000, which the verifier (integers only) rejected.
        for raw in [u64::MAX, u64::MAX - 1_023, 0xFFFF_FFFF_FFFF_FC00] {
            assert_eq!(representable(raw), 18_446_744_073_709_550_000, "raw {raw}");
        }
        let entry = AuditEntry::tool_call(
            "r",
            "t",
            AuditDecision::Allow,
            crate::Outcome::Observed,
            Sha256Digest::ZERO,
        );
        let sealed = seal(
            &entry,
            vec![],
            representable(u64::MAX),
            1,
            Sha256Digest::ZERO,
        );
        check_line(sealed.line.strip_suffix(b"\n").unwrap()).unwrap();
    }

    #[test]
    fn the_canonical_shortcut_agrees_with_the_canonicalizer() {
        let cases = [
            r#"{"a":1,"b":"x"}"#,
            r#"{"b":1,"a":2}"#,
            r#"{"a":"\u001f\n\t\"\\/é"}"#,
            r#"{"a":"\u001F"}"#,
            r#"{"a":"\/"}"#,
            r#"{"a":1795981786718735400}"#,
            r#"{"a":1795981786718735401}"#,
            r#"{"a":-9007199254740993}"#,
            r#"{"a":9007199254740993}"#,
            r#"{"a":[1,{"z":null,"b":true}]}"#,
            r#"{"é":1,"z":2}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"\ud83d\ude00":1,"\ufb33":2}"#,
            r#"{"\ufb33":2,"😀":1}"#,
        ];
        for text in cases {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(
                is_canonical_line(&value, text.as_bytes()),
                canonical_value(&value) == text.as_bytes(),
                "{text}"
            );
            let canonical = canonical_value(&value);
            assert!(is_canonical_line(&value, &canonical), "{text}");
        }
    }

    #[test]
    fn floats_are_not_canonical() {
        let prev = Sha256Digest::ZERO.to_hex();
        let line = format!(r#"{{"prev_sha256":"{prev}","sha256":"{prev}","x":1.5}}"#);
        let fault = check_line(line.as_bytes()).unwrap_err();
        assert_eq!(fault.kind, ProblemKind::NotCanonical);
    }
}
