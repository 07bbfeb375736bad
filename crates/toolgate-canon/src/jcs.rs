//! The RFC 8785 (JCS) writer: the canonical bytes of a `serde_json::Value`.
//!
//! # Compatibility contract
//!
//! Every digest toolgate has ever written (audit chains, `toolgate.lock`, effect journals) was
//! computed over the bytes of `serde_json_canonicalizer` 0.4, so this writer reproduces that
//! crate's output for every `serde_json::Value` byte for byte. A differential property test
//! (`tests/jcs_differential.rs`) keeps the two in step. What that crate does, and so what this one
//! does:
//!
//! * Every number, integer or not, is converted to `f64` and written the way ECMAScript's
//!   `Number.prototype.toString` does (the `ryu-js` crate). Integers above 2^53 therefore lose
//!   precision: `u64::MAX` is written `18446744073709552000`. `-0.0` is written `0`.
//! * Strings escape `"`, `\` and U+0000..U+001F only (`\b \t \n \f \r`, else `\u00xx` lowercase);
//!   everything else, DEL and U+2028/U+2029 included, is written as UTF-8.
//! * Object members are sorted by the UTF-16 code units of their names.
//!
//! A `Value` has only string keys, distinct within an object, and finite numbers, so writing one
//! cannot fail. (This crate once also wrote canonical JSON straight from any `Serialize` value,
//! modelling the canonicalizer's serializer call by call; no caller needed it, and a typed value
//! now goes through `serde_json::to_value` first, see the crate documentation.)

use std::cmp::Ordering;

// ---------------------------------------------------------------------------------------------
// Scalars
// ---------------------------------------------------------------------------------------------

/// Output buffers start this large: an audit record's canonical form is about 600 bytes.
pub(crate) const INITIAL_CAPACITY: usize = 1024;

/// 2^53: every integer up to this magnitude is exactly an `f64`, and ECMAScript writes such an
/// integral `f64` as its plain decimal digits.
const EXACT_INT: u64 = 1 << 53;

fn write_digits(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(slot) = buf.get_mut(at) {
            // `n % 10` is below 10.
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    out.extend_from_slice(buf.get(at..).unwrap_or_default());
}

/// A finite `f64` as ECMAScript writes it.
fn write_f64(out: &mut Vec<u8>, value: f64) {
    // Integral values below 2^53 are their digits; skip the shortest-digits search for them.
    if value.trunc() == value && value.abs() <= EXACT_INT as f64 {
        // In range of i64 and integral: the cast is exact (and -0.0 becomes 0, written "0").
        write_i64(out, value as i64);
    } else {
        let mut buffer = ryu_js::Buffer::new();
        out.extend_from_slice(buffer.format_finite(value).as_bytes());
    }
}

pub(crate) fn write_u64(out: &mut Vec<u8>, value: u64) {
    if value <= EXACT_INT {
        write_digits(out, value);
    } else {
        write_f64(out, value as f64);
    }
}

fn write_i64(out: &mut Vec<u8>, value: i64) {
    let magnitude = value.unsigned_abs();
    if magnitude <= EXACT_INT {
        if value < 0 {
            out.push(b'-');
        }
        write_digits(out, magnitude);
    } else {
        write_f64(out, value as f64);
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// In [`ESCAPE`]: written as `\u00xx`.
const UU: u8 = b'u';

/// For each byte, the letter after `\` that escapes it, `u` for `\u00xx`, or 0 for none.
/// The same table as `serde_json`'s.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = UU;
        i += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Whether any of the 8 bytes in `word` needs escaping (< 0x20, `"` or `\`).
#[inline]
fn word_needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    // Bytes below 0x20: subtracting 0x20 borrows into the high bit of a byte that was below it
    // and had its high bit clear (a false positive only after a real hit in a lower byte).
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0;
    below_space || has_zero(word ^ (ONES * u64::from(b'"'))) || has_zero(word ^ (ONES * 0x5c))
}

/// The escaped contents of a string, without the quotes.
fn write_str_contents(out: &mut Vec<u8>, value: &str) {
    let bytes = value.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Skip 8 bytes at a time while none needs escaping.
        if let Some(chunk) = bytes.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            if !word_needs_escape(u64::from_le_bytes(word)) {
                i += 8;
                continue;
            }
        }
        let byte = bytes.get(i).copied().unwrap_or_default();
        let escape = ESCAPE[usize::from(byte)];
        if escape != 0 {
            out.extend_from_slice(bytes.get(start..i).unwrap_or_default());
            if escape == UU {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0x0f)]);
            } else {
                out.push(b'\\');
                out.push(escape);
            }
            start = i + 1;
        }
        i += 1;
    }
    out.extend_from_slice(bytes.get(start..).unwrap_or_default());
}

pub(crate) fn write_str(out: &mut Vec<u8>, value: &str) {
    out.reserve(value.len() + 2);
    out.push(b'"');
    write_str_contents(out, value);
    out.push(b'"');
}

// ---------------------------------------------------------------------------------------------
// Member order
// ---------------------------------------------------------------------------------------------

/// Orders two bytes found at the first difference of two UTF-8 strings with equal prefixes (so
/// both are lead bytes, or both continuation bytes of characters of the same length) as their
/// UTF-16 code units would order. Byte order is code point order; UTF-16 differs only in putting
/// characters above U+FFFF (lead byte F0..F4, high surrogate D800..DBFF) before U+E000..U+FFFF
/// (lead byte EE or EF).
#[inline]
fn utf16_byte_cmp(a: u8, b: u8) -> Ordering {
    let supplementary = |x: u8| x >= 0xf0;
    let upper_bmp = |x: u8| x == 0xee || x == 0xef;
    if supplementary(a) && upper_bmp(b) {
        Ordering::Less
    } else if upper_bmp(a) && supplementary(b) {
        Ordering::Greater
    } else {
        a.cmp(&b)
    }
}

/// Compares two UTF-8 strings by their UTF-16 code units.
pub(crate) fn utf16_cmp(a: &[u8], b: &[u8]) -> Ordering {
    match a.iter().zip(b).find(|(x, y)| x != y) {
        Some((&x, &y)) => utf16_byte_cmp(x, y),
        None => a.len().cmp(&b.len()),
    }
}

// ---------------------------------------------------------------------------------------------
// serde_json::Value
// ---------------------------------------------------------------------------------------------

/// Writes the canonical form of a `serde_json::Value`, the same bytes as serializing it.
pub(crate) fn write_value(out: &mut Vec<u8>, value: &serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_map(out, map),
    }
}

fn write_number(out: &mut Vec<u8>, number: &serde_json::Number) {
    // As `Number`'s Serialize impl: u64, else i64, else f64 (always finite in a `Number`; a
    // nested non-finite float is `null` in serde_json).
    if let Some(value) = number.as_u64() {
        write_u64(out, value);
    } else if let Some(value) = number.as_i64() {
        write_i64(out, value);
    } else {
        match number.as_f64() {
            Some(value) if value.is_finite() => write_f64(out, value),
            _ => out.extend_from_slice(b"null"),
        }
    }
}

pub(crate) fn write_map(out: &mut Vec<u8>, map: &serde_json::Map<String, serde_json::Value>) {
    out.push(b'{');
    // serde_json's default map is a BTreeMap, in byte (code point) order, which is UTF-16 order
    // unless a key with a character above U+FFFF meets one with U+E000..U+FFFF; with serde_json's
    // `preserve_order` feature it is in insertion order. The keys are checked first and every
    // value is written exactly once: writing in iteration order and starting again sorted when a
    // key turned out of order would write a value once per enclosing map that needed the restart,
    // 2^depth times for nested maps with such keys at every level (a denial of service for any
    // caller whose arguments are digested).
    let mut keys = map.keys();
    let in_order = match keys.next() {
        None => true,
        Some(first) => {
            let mut previous = first;
            keys.all(|key| {
                let ascending = utf16_cmp(previous.as_bytes(), key.as_bytes()) == Ordering::Less;
                previous = key;
                ascending
            })
        }
    };
    let mut write_member = |i: usize, key: &String, value: &serde_json::Value| {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, key);
        out.push(b':');
        write_value(out, value);
    };
    if in_order {
        for (i, (key, value)) in map.iter().enumerate() {
            write_member(i, key, value);
        }
    } else {
        let mut members: Vec<(&String, &serde_json::Value)> = map.iter().collect();
        members.sort_unstable_by(|a, b| utf16_cmp(a.0.as_bytes(), b.0.as_bytes()));
        for (i, (key, value)) in members.into_iter().enumerate() {
            write_member(i, key, value);
        }
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn utf16_order() {
        assert_eq!(
            utf16_cmp("\u{10000}".as_bytes(), "\u{e000}".as_bytes()),
            Ordering::Less
        );
        assert_eq!(
            utf16_cmp("\u{ffff}".as_bytes(), "\u{10ffff}".as_bytes()),
            Ordering::Greater
        );
        assert_eq!(
            utf16_cmp("\u{d7ff}".as_bytes(), "\u{10000}".as_bytes()),
            Ordering::Less
        );
        assert_eq!(utf16_cmp(b"a", b"ab"), Ordering::Less);
        assert_eq!(utf16_cmp(b"", b""), Ordering::Equal);
    }

    fn any_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let text = prop::collection::vec(
            prop_oneof![
                proptest::char::range('a', 'c'),
                proptest::char::range('\u{0}', '\u{21}'),
                Just('\\'),
                proptest::char::range('\u{fff0}', '\u{ffff}'),
                proptest::char::range('\u{10000}', '\u{10004}'),
            ],
            0..4,
        )
        .prop_map(|chars| chars.into_iter().collect::<String>());
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text.clone().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((text.clone(), inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        #[test]
        fn write_value_matches_the_oracle(value in any_value()) {
            let oracle = serde_json_canonicalizer::to_vec(&value).ok();
            prop_assert!(oracle.is_some());
            let mut direct = Vec::new();
            write_value(&mut direct, &value);
            prop_assert_eq!(Some(direct), oracle);
        }
    }
}
