//! Differential tests: toolgate-canon's own JCS writer against `serde_json_canonicalizer` 0.4,
//! whose bytes every existing digest was computed over. Any difference is a bug in ours.
//!
//! The writer takes a `serde_json::Value`; typed values reach it through `serde_json::to_value`,
//! and the tests check that route too on every shape of the serde data model.

// Test code: a failed set-up should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use serde::Serialize;
use serde_json::{Map, Number, Value, json};
use toolgate_canon::{Sha256Digest, canonical_value, is_canonical};

/// Ours and the oracle give the same bytes for `value`; returns them.
#[track_caller]
fn same(value: &Value) -> Vec<u8> {
    let ours = canonical_value(value);
    let theirs = serde_json_canonicalizer::to_vec(value).expect("a Value always canonicalizes");
    assert_eq!(
        String::from_utf8_lossy(&ours),
        String::from_utf8_lossy(&theirs),
        "bytes differ"
    );
    assert_eq!(ours, theirs);
    ours
}

/// Ours and the oracle give these exact bytes for `value`.
#[track_caller]
fn gives(value: &Value, expected: &str) {
    assert_eq!(String::from_utf8(same(value)).unwrap(), expected);
}

/// A typed value through `serde_json::to_value` and ours, against the oracle on the typed value
/// itself: the same bytes whenever both accept it. `None` when either refuses it.
#[track_caller]
fn typed<T: Serialize>(value: &T) -> Option<Vec<u8>> {
    let ours = serde_json::to_value(value)
        .ok()
        .map(|v| canonical_value(&v));
    let theirs = serde_json_canonicalizer::to_vec(value).ok();
    match (ours, theirs) {
        (Some(ours), Some(theirs)) => {
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "bytes differ"
            );
            Some(ours)
        }
        _ => None,
    }
}

/// A typed value gives these exact bytes through `to_value` and ours, and through the oracle.
#[track_caller]
fn typed_gives<T: Serialize>(value: &T, expected: &str) {
    let got = typed(value).expect("both serialize");
    assert_eq!(String::from_utf8(got).unwrap(), expected);
}

/// 4096 cases per property, or `PROPTEST_CASES` (for a longer run).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4096)
}

// ---------------------------------------------------------------------------------------------
// Random serde_json::Value trees
// ---------------------------------------------------------------------------------------------

/// Characters that matter to escaping and to UTF-16 ordering.
fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => proptest::char::range('a', 'e'),
        2 => proptest::char::range('\u{0}', '\u{1f}'),
        2 => prop::sample::select(vec!['"', '\\', '/', '\u{7f}', '\u{2028}', '\u{2029}', ' ', '0']),
        1 => proptest::char::range('\u{80}', '\u{7ff}'),
        1 => proptest::char::range('\u{800}', '\u{d7ff}'),
        3 => proptest::char::range('\u{e000}', '\u{ffff}'),
        3 => proptest::char::range('\u{10000}', '\u{10ffff}'),
        1 => prop::sample::select(vec!['\u{e000}', '\u{ffff}', '\u{10000}', '\u{1f600}', '\u{10ffff}', '\u{fb33}', '\u{20ac}']),
    ]
}

fn interesting_string(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(interesting_char(), 0..max).prop_map(|cs| cs.into_iter().collect())
}

fn special_f64() -> impl Strategy<Value = f64> {
    prop::sample::select(vec![
        0.0,
        -0.0,
        f64::MIN_POSITIVE,
        -f64::MIN_POSITIVE,
        5e-324,
        -5e-324,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        1e21,
        1e21 - 65536.0,
        999_999_999_999_999_900_000.0,
        1e-7,
        1e-6,
        9.999_999_999_999_997e-7,
        1.000_000_000_000_000_1e-6,
        9_007_199_254_740_992.0,
        9_007_199_254_740_994.0,
        -9_007_199_254_740_992.0,
        18_446_744_073_709_551_616.0,
        9_223_372_036_854_775_808.0,
        1e20,
        1e22,
        1e23,
        0.1,
        0.2 + 0.1,
        333_333_333.333_333_3,
        1.5,
        -1.5,
        100.0,
        f64::from(f32::MAX),
        f64::from(f32::MIN_POSITIVE),
    ])
}

fn any_finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        // Every bit pattern: subnormals, huge and tiny exponents.
        4 => any::<u64>().prop_map(f64::from_bits).prop_filter("finite", |f| f.is_finite()),
        2 => special_f64(),
        // Neighbours of the specials, one ulp either side.
        2 => (special_f64(), -2i64..=2).prop_map(|(f, d)| {
            let bits = f.to_bits() as i64;
            f64::from_bits(bits.wrapping_add(d) as u64)
        }).prop_filter("finite", |f| f.is_finite()),
        // Decimal-looking values of every magnitude.
        2 => (-999_999i64..999_999, -330i32..310).prop_map(|(m, e)| m as f64 * 10f64.powi(e)).prop_filter("finite", |f| f.is_finite()),
        // Integral floats.
        1 => any::<i64>().prop_map(|i| i as f64),
    ]
}

fn any_integer() -> impl Strategy<Value = Number> {
    let near_2_53 = (-70i64..70).prop_map(|d| (1i64 << 53) + d);
    prop_oneof![
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
        (0u64..=u64::MAX >> 11).prop_map(Number::from),
        near_2_53.clone().prop_map(Number::from),
        near_2_53.prop_map(|i| Number::from(-i)),
        (0u32..64).prop_map(|s| Number::from(1u64 << s)),
        (0u32..64, -3i64..=3).prop_map(|(s, d)| Number::from((1u64 << s).wrapping_add(d as u64))),
        prop::sample::select(vec![
            Number::from(u64::MAX),
            Number::from(i64::MIN),
            Number::from(i64::MAX),
            Number::from(0u64),
            Number::from(10u64.pow(19)),
            Number::from(999_999_999_999_999_999u64),
        ]),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        3 => any_integer().prop_map(Value::Number),
        3 => any_finite_f64().prop_map(|f| Value::Number(Number::from_f64(f).unwrap())),
        3 => interesting_string(12).prop_map(Value::String),
    ]
}

fn any_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            // Short keys from a small alphabet, so that orderings that only UTF-16 decides
            // (U+E000..U+FFFF against supplementary characters), escapes and shared prefixes
            // come up often.
            prop::collection::vec((interesting_string(4), inner), 0..8)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Random JSON values: `canonical_value` gives the oracle's bytes.
    #[test]
    fn values_match_the_oracle(value in any_value()) {
        let theirs = serde_json_canonicalizer::to_vec(&value).unwrap();
        let ours = canonical_value(&value);
        prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs));
        prop_assert_eq!(&ours, &theirs);
        prop_assert!(is_canonical(&ours));
        prop_assert_eq!(Sha256Digest::of_json(&value), Sha256Digest::of(&theirs));
    }

    /// Random JSON texts, parsed, then canonicalized.
    #[test]
    fn parsed_text_matches_the_oracle(value in any_value()) {
        let text = serde_json::to_string_pretty(&value).unwrap();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(canonical_value(&parsed), serde_json_canonicalizer::to_vec(&parsed).unwrap());
    }

    /// Numbers alone, as every Rust type a `Value` holds, and through `to_value`.
    #[test]
    fn numbers_of_every_type_match(
        i in any::<i64>(), u in any::<u64>(), f in any::<u32>().prop_map(f32::from_bits),
        d in any_finite_f64(),
    ) {
        same(&Value::from(i));
        same(&Value::from(u));
        same(&Value::from(f));
        same(&Value::from(d));
        typed(&i).unwrap();
        typed(&u).unwrap();
        typed(&d).unwrap();
        typed(&(i as i32, u as u16, i as i8, u as u8, i128::from(i), u128::from(u))).unwrap();
        if f.is_finite() {
            typed(&f).unwrap();
        }
        // Small integer keys are written as their digits by both.
        let keys: BTreeMap<u32, u8> = [(u as u32, 1), ((u as u32).wrapping_add(1), 2)].into();
        typed(&keys).unwrap();
    }

    /// Random structs built from every serde data model shape, through `to_value`: the oracle's
    /// bytes whenever both accept them (a 128-bit integer beyond 64 bits is refused by
    /// `to_value`, a flattened member that repeats a field by the oracle).
    #[test]
    fn records_match_the_oracle(record in any_record()) {
        let ordinary = i64::try_from(record.wide).is_ok()
            && u64::try_from(record.uwide).is_ok()
            && !record.flattened.contains_key("name");
        let bytes = typed(&record);
        prop_assert!(bytes.is_some() || !ordinary, "an ordinary record was refused");
        typed(&vec![&record, &record]);
        let mut wrapped = BTreeMap::new();
        wrapped.insert("record", &record);
        typed(&wrapped);
    }
}

// ---------------------------------------------------------------------------------------------
// Serialize types: every shape of the serde data model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize)]
struct Inner {
    z: Option<i32>,
    a: Option<Vec<u8>>,
    é: String,
    #[serde(rename = "\u{10000}")]
    supplementary: bool,
    #[serde(rename = "\u{ffff}")]
    bmp_top: bool,
    #[serde(rename = "\n")]
    newline: (),
}

#[derive(Debug, Clone, Serialize)]
enum Variant {
    Unit,
    Newtype(i64),
    Tuple(u8, String),
    EmptyTuple(),
    Struct { y: f64, x: Option<bool> },
    EmptyStruct {},
}

#[derive(Debug, Clone, Serialize)]
struct UnitStruct;

#[derive(Debug, Clone, Serialize)]
struct Newtype(f64);

#[derive(Debug, Clone, Serialize)]
struct TupleStruct(u16, char, i8);

#[derive(Debug, Clone, Serialize)]
struct Empty {}

#[derive(Debug, Clone, Serialize)]
struct Record {
    name: String,
    maybe: Option<u32>,
    nothing: Option<String>,
    inner: Inner,
    variants: Vec<Variant>,
    by_number: BTreeMap<u32, String>,
    by_name: HashMap<String, i64>,
    bytes: Vec<u8>,
    #[serde(with = "as_bytes")]
    raw_bytes: Vec<u8>,
    wide: i128,
    uwide: u128,
    single: f32,
    double: f64,
    letter: char,
    unit: (),
    unit_struct: UnitStruct,
    newtype: Newtype,
    tuple: (u8, String, bool),
    tuple_struct: TupleStruct,
    empty: Empty,
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<i64>,
    #[serde(flatten)]
    flattened: BTreeMap<String, u8>,
}

/// `serialize_bytes`, which `Vec<u8>` does not use on its own.
mod as_bytes {
    pub(super) fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
}

fn any_variant() -> impl Strategy<Value = Variant> {
    prop_oneof![
        Just(Variant::Unit),
        any::<i64>().prop_map(Variant::Newtype),
        (any::<u8>(), interesting_string(4)).prop_map(|(a, b)| Variant::Tuple(a, b)),
        Just(Variant::EmptyTuple()),
        (any::<f64>(), any::<Option<bool>>()).prop_map(|(y, x)| Variant::Struct { y, x }),
        Just(Variant::EmptyStruct {}),
    ]
}

fn any_record() -> impl Strategy<Value = Record> {
    let inner = (
        any::<Option<i32>>(),
        proptest::option::of(prop::collection::vec(any::<u8>(), 0..4)),
        interesting_string(6),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(z, a, é, supplementary, bmp_top)| Inner {
            z,
            a,
            é,
            supplementary,
            bmp_top,
            newline: (),
        });
    let scalars = (
        // Mostly within 64 bits, which `to_value` accepts.
        prop_oneof![3 => any::<i64>().prop_map(i128::from), 1 => any::<i128>()],
        prop_oneof![3 => any::<u64>().prop_map(u128::from), 1 => any::<u128>()],
        prop_oneof![any::<f32>(), Just(f32::NAN), Just(0.1f32)],
        prop_oneof![any_finite_f64(), Just(f64::NAN), Just(f64::NEG_INFINITY)],
        any::<char>(),
        any::<Option<u32>>(),
        proptest::option::of(any::<i64>()),
    );
    let maps = (
        prop::collection::btree_map(any::<u32>(), interesting_string(3), 0..4),
        prop::collection::hash_map(interesting_string(3), any::<i64>(), 0..4),
        // Flattened members may collide with the fields: a duplicate key, an error for both.
        prop::collection::btree_map(
            prop_oneof![
                interesting_string(3),
                Just("name".to_owned()),
                Just("zz".to_owned())
            ],
            any::<u8>(),
            0..3,
        ),
    );
    (
        interesting_string(8),
        inner,
        prop::collection::vec(any_variant(), 0..4),
        prop::collection::vec(any::<u8>(), 0..5),
        scalars,
        maps,
        (
            any::<u16>(),
            any::<char>(),
            any::<i8>(),
            any::<u8>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(name, inner, variants, bytes, scalars, maps, small)| Record {
                name,
                maybe: scalars.5,
                nothing: None,
                inner,
                variants,
                by_number: maps.0,
                by_name: maps.1,
                raw_bytes: bytes.clone(),
                bytes,
                wide: scalars.0,
                uwide: scalars.1,
                single: scalars.2,
                double: scalars.3,
                letter: scalars.4,
                unit: (),
                unit_struct: UnitStruct,
                newtype: Newtype(scalars.3),
                tuple: (small.3, small.1.to_string(), small.4),
                tuple_struct: TupleStruct(small.0, small.1, small.2),
                empty: Empty {},
                skipped: scalars.6,
                flattened: maps.2,
            },
        )
}

#[test]
fn every_variant_kind() {
    typed_gives(&Variant::Unit, r#""Unit""#);
    typed_gives(&Variant::Newtype(-3), r#"{"Newtype":-3}"#);
    typed_gives(&Variant::Tuple(1, "x".into()), r#"{"Tuple":[1,"x"]}"#);
    typed_gives(&Variant::EmptyTuple(), r#"{"EmptyTuple":[]}"#);
    typed_gives(
        &Variant::Struct { y: 0.5, x: None },
        r#"{"Struct":{"x":null,"y":0.5}}"#,
    );
    typed_gives(&Variant::EmptyStruct {}, r#"{"EmptyStruct":{}}"#);
    typed_gives(&UnitStruct, "null");
    typed_gives(&Empty {}, "{}");
    typed_gives(&(), "null");
    typed_gives(&Newtype(2.5), "2.5");
    typed_gives(&TupleStruct(7, 'é', -1), r#"[7,"é",-1]"#);
    typed_gives(&Some(Some(3u8)), "3");
    typed_gives(&None::<u8>, "null");
    typed_gives(&vec![1u8, 2], "[1,2]");
    typed_gives(&Bytes(&[0, 255]), "[0,255]");
    typed_gives(&Bytes(&[]), "[]");
    typed_gives(&vec![f64::NAN, f64::INFINITY], "[null,null]");
    typed_gives(&Some(f64::NAN), "null");
    typed_gives(&Newtype(f64::NEG_INFINITY), "null");
    typed_gives(&(f32::NAN,), "[null]");
    gives(&json!({}), "{}");
    gives(&json!([]), "[]");
}

#[test]
fn integers_go_through_f64_like_ecmascript() {
    // The canonicalizer converts every integer to f64 first: above 2^53 precision is lost and
    // from 1e21 on the exponent form appears.
    gives(&json!(9_007_199_254_740_992u64), "9007199254740992");
    gives(&json!(9_007_199_254_740_993u64), "9007199254740992");
    gives(&json!(9_007_199_254_740_995u64), "9007199254740996");
    gives(&json!(-9_007_199_254_740_993i64), "-9007199254740992");
    gives(&json!(u64::MAX), "18446744073709552000");
    gives(&json!(i64::MIN), "-9223372036854776000");
    gives(&json!(i64::MAX), "9223372036854776000");
    gives(&json!(0.1f32), "0.10000000149011612");
    gives(&json!(f32::MAX), "3.4028234663852886e+38");
    gives(&json!(-0.0f64), "0");
    gives(&json!(-0.0f32), "0");
    gives(&json!(1e21f64), "1e+21");
    gives(&json!(1e-7f64), "1e-7");
    gives(&json!(1e-6f64), "0.000001");
    typed_gives(&u64::MAX, "18446744073709552000");
    typed_gives(&i128::from(i64::MIN), "-9223372036854776000");
    typed_gives(&u128::from(u64::MAX), "18446744073709552000");
}

/// Where `serde_json::to_value` differs from the canonicalizer's own serializer on a typed value
/// (the crate documentation lists these): the `Value` decides.
#[test]
fn typed_values_that_to_value_reads_differently() {
    fn through_value<T: Serialize>(value: &T) -> Option<String> {
        let value = serde_json::to_value(value).ok()?;
        Some(String::from_utf8(canonical_value(&value)).unwrap())
    }
    // The whole value a non-finite float: `null`, not an error.
    assert!(serde_json_canonicalizer::to_vec(&f64::NAN).is_err());
    assert_eq!(through_value(&f64::NAN).as_deref(), Some("null"));
    // Beyond 64 bits: an error, not a rounded number.
    assert!(serde_json_canonicalizer::to_vec(&u128::MAX).is_ok());
    assert_eq!(through_value(&u128::MAX), None);
    // A repeated key: the last value, not an error.
    let repeated = Pairs(vec![("a", 1), ("a", 2)]);
    assert!(serde_json_canonicalizer::to_vec(&repeated).is_err());
    assert_eq!(through_value(&repeated).as_deref(), Some(r#"{"a":2}"#));
    // Float and large integer keys: serde_json's text, not an ECMAScript number.
    let float_key = Pairs(vec![(1.0f64, 0)]);
    assert_eq!(
        serde_json_canonicalizer::to_vec(&float_key).unwrap(),
        br#"{"1":0}"#
    );
    assert_eq!(through_value(&float_key).as_deref(), Some(r#"{"1.0":0}"#));
    let big_key = Pairs(vec![(u64::MAX, 0)]);
    assert_eq!(
        serde_json_canonicalizer::to_vec(&big_key).unwrap(),
        br#"{"18446744073709552000":0}"#
    );
    assert_eq!(
        through_value(&big_key).as_deref(),
        Some(r#"{"18446744073709551615":0}"#)
    );
}

#[test]
fn keys_sort_by_utf16_after_unescaping() {
    // Escaped forms sort differently from what they stand for: "\n" (U+000A) < " " < "\"" < "\\".
    gives(
        &json!({"\\": 0, "\"": 1, " ": 2, "\n": 3, "\u{1}": 4, "": 5}),
        r#"{"":5,"\u0001":4,"\n":3," ":2,"\"":1,"\\":0}"#,
    );
    gives(
        &json!({"\u{ffff}": 0, "\u{10000}": 1, "\u{e000}": 2, "\u{d7ff}": 3}),
        "{\"\u{d7ff}\":3,\"\u{10000}\":1,\"\u{e000}\":2,\"\u{ffff}\":0}",
    );
    gives(
        &json!({"a\u{ffff}": 0, "a\u{10ffff}": 1, "a": 2, "a\u{7f}": 3}),
        "{\"a\":2,\"a\u{7f}\":3,\"a\u{10ffff}\":1,\"a\u{ffff}\":0}",
    );
    gives(
        &json!({"\u{ffff}": 0, "\u{10000}": 1, "a\u{e000}b": 2, "a\u{1f600}": 3}),
        "{\"a\u{1f600}\":3,\"a\u{e000}b\":2,\"\u{10000}\":1,\"\u{ffff}\":0}",
    );
    // The same through a typed map.
    typed_gives(
        &Pairs(vec![
            ("\u{ffff}", 0),
            ("\u{10000}", 1),
            ("\n", 2),
            ("\\", 3),
        ]),
        "{\"\\n\":2,\"\\\\\":3,\"\u{10000}\":1,\"\u{ffff}\":0}",
    );
}

#[test]
fn strings_escape_like_json_stringify() {
    let all_controls: String = (0u8..0x20).map(char::from).collect();
    same(&json!(all_controls));
    gives(
        &json!("\u{8}\u{c}\n\r\t\u{b}\u{1f}"),
        r#""\b\f\n\r\t\u000b\u001f""#,
    );
    gives(
        &json!("\u{7f}\u{2028}\u{2029}/é😀"),
        "\"\u{7f}\u{2028}\u{2029}/é😀\"",
    );
    gives(&json!("\"\\"), r#""\"\\""#);
    typed_gives(&'\u{0}', r#""\u0000""#);
    // Long strings cross the 8-byte fast path of the escaper at every offset.
    for offset in 0..17 {
        let mut text = "x".repeat(offset);
        text.push('\u{1}');
        text.push_str(&"é".repeat(offset));
        text.push('"');
        text.push_str(&"y".repeat(9));
        same(&json!(text));
    }
}

/// Bytes through `serialize_bytes`.
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// A map given as a list of pairs: any key type, duplicates allowed.
struct Pairs<K, V>(Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for Pairs<K, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[test]
fn nested_maps_out_of_byte_order_at_every_level_are_written_once() {
    // At every level the byte order (serde_json's map order: U+E000 before U+10000) differs from
    // the UTF-16 order (U+10000, a surrogate pair from 0xD800, first), and the nested map comes
    // first in byte order. Writing in map order and restarting sorted on the first key out of
    // order wrote each nested map twice per level: 2^48 times here, which never finishes.
    let mut value = json!({"leaf": true});
    for i in 0..48 {
        value = json!({ "\u{e000}": value, "\u{10000}": i });
    }
    let ours = same(&value);
    let Value::Object(map) = &value else {
        unreachable!("built as an object")
    };
    assert_eq!(Sha256Digest::of_json_object(map), Sha256Digest::of(&ours));
}

#[test]
fn deep_and_wide_values() {
    let mut value = json!({"leaf": [1, 2.5, "x"]});
    for i in 0..100 {
        value = json!({ format!("k{i}"): value, "\u{10000}": [value.clone()], "\u{ffff}": i });
        if i % 10 == 0 {
            same(&value);
        }
        // Keep it from growing exponentially.
        value = json!({ "v": value["k".to_owned() + &i.to_string()].clone(), "i": i });
    }
    same(&value);
    let wide: Map<String, Value> = (0..2000)
        .map(|i| {
            (
                format!("{}{}", char::from_u32(0xe000 + i % 7).unwrap(), 1999 - i),
                Value::from(i),
            )
        })
        .chain((0..50).map(|i| (format!("\u{10000}{i}"), Value::from(-i))))
        .collect();
    same(&Value::Object(wide));
    let pairs: Vec<(String, i32)> = (0..500)
        .map(|i| (format!("{}", (i * 7919) % 1000), i))
        .collect();
    typed(&Pairs(pairs)).expect("distinct keys");
}
