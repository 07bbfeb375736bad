//! Canonical JSON (RFC 8785, "JCS") and the SHA-256 digest newtype.
//!
//! Every digest toolgate computes (audit chain links, argument digests, commit payloads, contract
//! sections) is a SHA-256 over the canonical bytes produced here, so two independent programs that
//! agree on RFC 8785 agree on every digest. This crate performs no I/O.
//!
//! The writer is this crate's own (module `jcs`), and it writes one thing: a `serde_json::Value`
//! ([`canonical_value`], and the `write_canonical_*` functions for callers that assemble a larger
//! canonical document piece by piece). Its output is byte-for-byte that of the
//! `serde_json_canonicalizer` 0.4 crate, which produced every digest written before it, including
//! that crate's quirk that every number goes through `f64` (integers above 2^53 are rounded); a
//! differential property test against that crate guards the equivalence, and the tests below check
//! the test vectors of RFC 8785 (appendix B numbers, section 3.2.3 key ordering by UTF-16 code
//! units, and the appendix's complete example).
//!
//! A typed value is canonicalized as `canonical_value(&serde_json::to_value(&value)?)`. For
//! ordinary data (structs, enums, strings, maps with string or small integer keys, numbers within
//! 64 bits) that gives the canonicalizer's bytes for the typed value too (the differential test
//! checks random derived structs). Where `serde_json::to_value` itself differs from the
//! canonicalizer's serializer, the `Value` decides: a repeated map key keeps its last value instead
//! of being an error, a non-finite float is `null` even as the whole value, a 128-bit integer
//! beyond 64 bits is an error, and a float or above-2^53 integer map key is written as serde_json
//! writes it (`1.0`, every digit) rather than as an ECMAScript number.

#![forbid(unsafe_code)]

mod jcs;
mod key;
pub mod names;

pub use key::{HmacKey, KeyError, MAX_KEY_FILE_BYTES, MIN_KEY_BYTES};

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// The RFC 8785 canonical bytes of a `serde_json::Value`.
///
/// Keys are sorted by UTF-16 code units, there is no insignificant whitespace, strings are UTF-8
/// without `\u` escapes for non-ASCII, and numbers use the ECMAScript shortest round-trip form of
/// the nearest `f64` (so integers above 2^53 are rounded).
///
/// A `Value` always has string keys, distinct within an object, and finite numbers, so this cannot
/// fail.
pub fn canonical_value(value: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(jcs::INITIAL_CAPACITY);
    jcs::write_value(&mut out, value);
    out
}

/// Appends the canonical bytes of `value` to `out`: what [`canonical_value`] returns, without a
/// buffer of its own (for a caller that assembles a larger canonical document).
pub fn write_canonical_value(out: &mut Vec<u8>, value: &serde_json::Value) {
    jcs::write_value(out, value);
}

/// Appends the canonical bytes of the JSON object `map` to `out`: the same bytes as
/// `canonical_value(&Value::Object(map.clone()))`, without the copy.
pub fn write_canonical_object(out: &mut Vec<u8>, map: &serde_json::Map<String, serde_json::Value>) {
    jcs::write_map(out, map);
}

/// Appends the canonical form of the JSON string `text` to `out`: quoted, with RFC 8785's
/// escapes (the same bytes as `canonical_value(&Value::from(text))`).
pub fn write_canonical_str(out: &mut Vec<u8>, text: &str) {
    jcs::write_str(out, text);
}

/// Appends the canonical form of the number `value` to `out`: its digits up to 2^53, above that
/// the ECMAScript form of the nearest double (the same bytes as `canonical_value(&Value::from(value))`).
pub fn write_canonical_u64(out: &mut Vec<u8>, value: u64) {
    jcs::write_u64(out, value);
}

/// Whether `bytes` are exactly the canonical form of the JSON they encode.
pub fn is_canonical(bytes: &[u8]) -> bool {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(value) => canonical_value(&value) == bytes,
        Err(_) => false,
    }
}

/// A SHA-256 digest. Displayed, parsed and serialized as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256Digest([u8; 32]);

impl Sha256Digest {
    /// The all-zero digest, used as `prev_sha256` of the first audit record.
    pub const ZERO: Sha256Digest = Sha256Digest([0; 32]);

    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Sha256Digest(Sha256::digest(bytes).into())
    }

    /// The SHA-256 of the concatenation of `parts`, without copying them into one buffer.
    pub fn of_parts(parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        Sha256Digest(hasher.finalize().into())
    }

    /// The SHA-256 of the canonical JSON of `value`.
    pub fn of_json(value: &serde_json::Value) -> Self {
        Self::of(&canonical_value(value))
    }

    /// The SHA-256 of the canonical JSON of the object `map`: `of_json` of that object, without
    /// copying the map into a `Value` first.
    pub fn of_json_object(map: &serde_json::Map<String, serde_json::Value>) -> Self {
        let mut canonical = Vec::with_capacity(jcs::INITIAL_CAPACITY);
        write_canonical_object(&mut canonical, map);
        Self::of(&canonical)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a digest from raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Sha256Digest(bytes)
    }

    /// The 64-character lowercase hex form.
    pub fn to_hex(&self) -> String {
        self.hex_bytes().iter().map(|&b| char::from(b)).collect()
    }

    /// The lowercase hex form as ASCII bytes, without allocating.
    pub fn hex_bytes(&self) -> [u8; 64] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, byte) in self.0.iter().enumerate() {
            out[2 * i] = HEX[usize::from(byte >> 4)];
            out[2 * i + 1] = HEX[usize::from(byte & 0x0f)];
        }
        out
    }
}

/// Why a string is not a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DigestParseError {
    /// The string is not 64 characters long.
    #[error("a SHA-256 digest is 64 lowercase hex characters, got {0} characters")]
    Length(usize),
    /// The string contains something other than `0-9a-f`.
    #[error("a SHA-256 digest is 64 lowercase hex characters, found {0:?}")]
    Character(char),
}

impl FromStr for Sha256Digest {
    type Err = DigestParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 64 {
            return Err(DigestParseError::Length(s.chars().count()));
        }
        fn nibble(c: u8) -> Result<u8, DigestParseError> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                _ => Err(DigestParseError::Character(char::from(c))),
            }
        }
        let bytes = s.as_bytes();
        let mut out = [0u8; 32];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = (nibble(bytes[2 * i])? << 4) | nibble(bytes[2 * i + 1])?;
        }
        Ok(Sha256Digest(out))
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({})", self.to_hex())
    }
}

impl Serialize for Sha256Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Sha256Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Puts every JSON object inside `value` in `str` key order, the order a value parsed from
/// canonical text comes back in, so that what was stored and what is replayed serialize to the
/// same bytes. serde_json's default map keeps that order anyway (nothing is done); a build in
/// which a dependency turns on serde_json's `preserve_order` (Cedar does) keeps insertion order,
/// and `value` then takes a round trip through a JSON value with its objects sorted.
pub fn in_key_order<T: Serialize + serde::de::DeserializeOwned>(value: &mut T) {
    static SORTED_MAPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let sorted = SORTED_MAPS.get_or_init(|| {
        let mut map = serde_json::Map::new();
        map.insert("b".to_owned(), serde_json::Value::Null);
        map.insert("a".to_owned(), serde_json::Value::Null);
        map.keys().next().is_some_and(|key| key == "a")
    });
    if *sorted {
        return;
    }
    let Ok(mut json) = serde_json::to_value(&*value) else {
        return;
    };
    json.sort_all_objects();
    if let Ok(in_order) = serde_json::from_value(json) {
        *value = in_order;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(input: &str, expected: &str) {
        let value: serde_json::Value = serde_json::from_str(input).expect("test input is JSON");
        let got = String::from_utf8(canonical_value(&value)).expect("canonical JSON is UTF-8");
        assert_eq!(got, expected, "input: {input}");
        assert!(is_canonical(expected.as_bytes()));
    }

    #[test]
    fn the_append_writers_write_what_canonical_value_returns() {
        let mut out = b"prefix".to_vec();
        for text in [
            "",
            "plain",
            "q\"b\\s\n\u{1f}\u{7f}\u{2028}\u{e000}\u{1F600}/",
        ] {
            out.truncate(6);
            write_canonical_str(&mut out, text);
            assert_eq!(out[6..], canonical_value(&json!(text)), "{text:?}");
        }
        for number in [0, 1, 9_007_199_254_740_992, 9_007_199_254_740_993, u64::MAX] {
            out.truncate(6);
            write_canonical_u64(&mut out, number);
            assert_eq!(out[6..], canonical_value(&json!(number)), "{number}");
        }
        let value = json!({"b": [1, 2.5, null, "\u{10000}"], "a": {"\u{e000}": true, "z": -3}});
        out.truncate(6);
        write_canonical_value(&mut out, &value);
        assert_eq!(out[6..], canonical_value(&value));
        out.truncate(6);
        write_canonical_object(&mut out, value.as_object().expect("an object"));
        assert_eq!(out[6..], canonical_value(&value));
        assert_eq!(
            Sha256Digest::of_json_object(value.as_object().expect("an object")),
            Sha256Digest::of_json(&value)
        );
        assert_eq!(&out[..6], b"prefix");
        let digest = Sha256Digest::of(b"abc");
        assert_eq!(digest.hex_bytes().as_slice(), digest.to_hex().as_bytes());
        assert_eq!(
            digest.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// RFC 8785 section 3.2.2 / appendix: the complete example.
    #[test]
    fn rfc8785_complete_example() {
        check(
            r#"{
              "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
              "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
              "literals": [null, true, false]
            }"#,
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#,
        );
    }

    /// RFC 8785 section 3.2.3: property names sort by UTF-16 code units, not by code points.
    #[test]
    fn rfc8785_sorting_by_utf16_code_units() {
        check(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
        );
    }

    /// RFC 8785 appendix B: IEEE 754 bit patterns and their canonical number text.
    #[test]
    fn rfc8785_appendix_b_numbers() {
        let vectors: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, expected) in vectors {
            let number = json!(f64::from_bits(bits));
            let got = canonical_value(&number);
            assert_eq!(
                String::from_utf8(got).expect("utf-8"),
                expected,
                "bits {bits:#018x}"
            );
        }
    }

    #[test]
    fn non_ascii_is_not_escaped_and_controls_are() {
        check(
            r#"{"b":"ção","a":"\u0001"}"#,
            "{\"a\":\"\\u0001\",\"b\":\"ção\"}",
        );
    }

    #[test]
    fn is_canonical_rejects_whitespace_and_key_order() {
        assert!(!is_canonical(br#"{"b":1, "a":2}"#));
        assert!(!is_canonical(br#"{"b":1,"a":2}"#));
        assert!(is_canonical(br#"{"a":2,"b":1}"#));
        assert!(!is_canonical(b"not json"));
    }

    #[test]
    fn digest_hex_round_trip_and_errors() {
        let digest = Sha256Digest::of(b"abc");
        assert_eq!(
            digest.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(digest.to_hex().parse::<Sha256Digest>(), Ok(digest));
        assert_eq!(
            "ab".parse::<Sha256Digest>(),
            Err(DigestParseError::Length(2))
        );
        let upper = digest.to_hex().to_uppercase();
        assert!(matches!(
            upper.parse::<Sha256Digest>(),
            Err(DigestParseError::Character(_))
        ));
        assert_eq!(Sha256Digest::ZERO.to_hex(), "0".repeat(64));
        assert_eq!(Sha256Digest::of_parts(&[b"a", b"bc"]), digest);
        let json = serde_json::to_value(digest).expect("serializes");
        assert_eq!(json, json!(digest.to_hex()));
    }

    /// Digests of parsed JSON depend on `serde_json` parsing floats exactly (`float_roundtrip`):
    /// without it `44392119048899982e7` parses one ulp off and canonicalizes to other bytes.
    /// `serde_json_canonicalizer` used to turn the feature on for every build; it is now only a
    /// dev-dependency, whose features reach test builds but not release builds, so a parsing test
    /// would pass either way. Check the manifest instead.
    #[test]
    fn serde_json_parses_floats_exactly_in_every_build() {
        let manifest = include_str!("../Cargo.toml");
        let dependencies = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .expect("the manifest has a [dependencies] table");
        assert!(
            dependencies
                .lines()
                .any(|line| line.starts_with("serde_json ") && line.contains("float_roundtrip")),
            "toolgate-canon must depend on serde_json with the float_roundtrip feature"
        );
        let value: serde_json::Value = serde_json::from_str("44392119048899982e7").expect("JSON");
        assert_eq!(canonical_value(&value), b"4.439211904889998e+23");
    }

    #[test]
    fn multibyte_input_of_length_64_is_rejected_without_panic() {
        let s = "é".repeat(32);
        assert_eq!(s.len(), 64);
        assert!(s.parse::<Sha256Digest>().is_err());
    }
}
