//! Differential tests: toolgate-canon's own JCS writer against `serde_json_canonicalizer` 0.4,
//! whose bytes every existing digest was computed over. Any difference is a bug in ours.

// Test code: a failed set-up should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use proptest::prelude::*;
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, SerializeStructVariant, Serializer};
use serde_json::{Map, Number, Value};
use toolgate_canon::{canonical_value, is_canonical, to_canonical_vec};

/// Ours and the oracle agree: the same bytes, or both an error.
#[track_caller]
fn same<T: Serialize + ?Sized>(value: &T) -> Option<Vec<u8>> {
    let ours = to_canonical_vec(&value);
    let theirs = serde_json_canonicalizer::to_vec(&value);
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => {
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "bytes differ"
            );
            assert_eq!(ours, theirs);
            Some(ours)
        }
        (Err(_), Err(_)) => None,
        (ours, theirs) => panic!(
            "one side failed: ours {:?}, serde_json_canonicalizer {:?}",
            ours.map(|b| String::from_utf8_lossy(&b).into_owned()),
            theirs.map(|b| String::from_utf8_lossy(&b).into_owned())
        ),
    }
}

/// Ours and the oracle give these exact bytes.
#[track_caller]
fn gives<T: Serialize + ?Sized>(value: &T, expected: &str) {
    let got = same(value).expect("both serialize");
    assert_eq!(String::from_utf8(got).unwrap(), expected);
}

#[track_caller]
fn both_fail<T: Serialize + ?Sized>(value: &T) {
    assert!(same(value).is_none(), "expected both to fail");
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
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Random JSON values: `canonical_value` and `to_canonical_vec` give the oracle's bytes.
    #[test]
    fn values_match_the_oracle(value in any_value()) {
        let theirs = serde_json_canonicalizer::to_vec(&value).unwrap();
        let ours = canonical_value(&value);
        prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs));
        prop_assert_eq!(&to_canonical_vec(&value).unwrap(), &theirs);
        prop_assert!(is_canonical(&ours));
    }

    /// Random JSON texts, parsed, then canonicalized.
    #[test]
    fn parsed_text_matches_the_oracle(value in any_value()) {
        let text = serde_json::to_string_pretty(&value).unwrap();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(canonical_value(&parsed), serde_json_canonicalizer::to_vec(&parsed).unwrap());
    }

    /// Numbers alone, as every Rust type serde has.
    #[test]
    fn numbers_of_every_type_match(
        i in any::<i64>(), u in any::<u64>(), wide in any::<i128>(), uwide in any::<u128>(),
        f in any::<u32>().prop_map(f32::from_bits), d in any_finite_f64(), s in 0u32..128,
    ) {
        same(&i);
        same(&u);
        same(&wide);
        same(&uwide);
        same(&(1u128 << s));
        same(&(-(1i128 << s.min(126))));
        same(&f);
        same(&d);
        same(&(i as i32, u as u16, i as i8, u as u8));
        // As map keys, where they are written as quoted number text.
        let keys: BTreeMap<i128, u8> = [(wide, 1), (i128::from(i), 2), (uwide as i128, 3)].into();
        same(&keys);
        let keys: BTreeMap<u64, u8> = [(u, 1), (u.wrapping_add(1), 2)].into();
        same(&keys);
        same(&Pairs(vec![(f, 0u8)]));
        same(&Pairs(vec![(d, 0u8)]));
        same(&Pairs(vec![(d, 0u8), (d * 2.0, 1)]));
    }

    /// Random structs built from every serde data model shape.
    #[test]
    fn records_match_the_oracle(record in any_record()) {
        same(&record);
        same(&vec![&record, &record]);
        let mut wrapped = BTreeMap::new();
        wrapped.insert("record", &record);
        same(&wrapped);
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
        any::<i128>(),
        any::<u128>(),
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

/// A map given as a list of pairs: any key type, duplicates allowed.
struct Pairs<K, V>(Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for Pairs<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[test]
fn every_variant_kind() {
    gives(&Variant::Unit, r#""Unit""#);
    gives(&Variant::Newtype(-3), r#"{"Newtype":-3}"#);
    gives(&Variant::Tuple(1, "x".into()), r#"{"Tuple":[1,"x"]}"#);
    gives(&Variant::EmptyTuple(), r#"{"EmptyTuple":[]}"#);
    gives(
        &Variant::Struct { y: 0.5, x: None },
        r#"{"Struct":{"x":null,"y":0.5}}"#,
    );
    gives(&Variant::EmptyStruct {}, r#"{"EmptyStruct":{}}"#);
    gives(&UnitStruct, "null");
    gives(&Empty {}, "{}");
    gives(&(), "null");
    gives(&Newtype(2.5), "2.5");
    gives(&TupleStruct(7, 'é', -1), r#"[7,"é",-1]"#);
    gives(&Some(Some(3u8)), "3");
    gives(&None::<u8>, "null");
    gives(&vec![1u8, 2], "[1,2]");
    gives(&serde_json::json!({}), "{}");
    gives(&serde_json::json!([]), "[]");
}

#[test]
fn integers_go_through_f64_like_ecmascript() {
    // The canonicalizer converts every integer to f64 first: above 2^53 precision is lost and
    // from 1e21 on the exponent form appears.
    gives(&9_007_199_254_740_992u64, "9007199254740992");
    gives(&9_007_199_254_740_993u64, "9007199254740992");
    gives(&9_007_199_254_740_995u64, "9007199254740996");
    gives(&-9_007_199_254_740_993i64, "-9007199254740992");
    gives(&u64::MAX, "18446744073709552000");
    gives(&i64::MIN, "-9223372036854776000");
    gives(&i64::MAX, "9223372036854776000");
    gives(&i128::MAX, "1.7014118346046923e+38");
    gives(&i128::MIN, "-1.7014118346046923e+38");
    gives(&u128::MAX, "3.402823669209385e+38");
    gives(&10u128.pow(21), "1e+21");
    gives(&(10u128.pow(21) - 1), "1e+21");
    gives(&999_999_999_999_999_999_999u128, "1e+21");
    gives(
        &123_456_789_012_345_678_901_234u128,
        "1.2345678901234569e+23",
    );
    gives(&0.1f32, "0.10000000149011612");
    gives(&f32::MAX, "3.4028234663852886e+38");
    gives(&-0.0f64, "0");
    gives(&-0.0f32, "0");
    gives(&1e21f64, "1e+21");
    gives(&1e-7f64, "1e-7");
    gives(&1e-6f64, "0.000001");
    let ints: BTreeMap<u64, u8> = [(9_007_199_254_740_992, 1), (u64::MAX, 2)].into();
    gives(&ints, r#"{"18446744073709552000":2,"9007199254740992":1}"#);
}

#[test]
fn non_finite_floats_fail_only_at_the_top() {
    both_fail(&f64::NAN);
    both_fail(&f64::INFINITY);
    both_fail(&f32::NEG_INFINITY);
    // Nested anywhere, serde_json's serializer writes them as null and the canonicalizer keeps it.
    gives(&vec![f64::NAN, f64::INFINITY], "[null,null]");
    gives(&Some(f64::NAN), "null");
    gives(&Newtype(f64::NEG_INFINITY), "null");
    gives(&(f32::NAN,), "[null]");
    gives(
        &Variant::Struct {
            y: f64::NAN,
            x: None,
        },
        r#"{"Struct":{"x":null,"y":null}}"#,
    );
    both_fail(&Pairs(vec![(f64::NAN, 1)]));
    both_fail(&Pairs(vec![(f32::INFINITY, 1)]));
}

#[test]
fn map_keys_of_every_type() {
    gives(&Pairs(vec![(1u8, 0)]), r#"{"1":0}"#);
    gives(&Pairs(vec![(-1i8, 0)]), r#"{"-1":0}"#);
    gives(&Pairs(vec![(1.5f64, 0)]), r#"{"1.5":0}"#);
    gives(&Pairs(vec![(1e21f64, 0)]), r#"{"1e+21":0}"#);
    gives(&Pairs(vec![(0.1f32, 0)]), r#"{"0.10000000149011612":0}"#);
    gives(
        &Pairs(vec![(true, 0), (false, 1)]),
        r#"{"false":1,"true":0}"#,
    );
    gives(&Pairs(vec![('\n', 0), ('a', 1)]), r#"{"\n":0,"a":1}"#);
    gives(&Pairs(vec![(Variant::Unit, 0)]), r#"{"Unit":0}"#);
    gives(&Pairs(vec![(Some("k"), 0)]), r#"{"k":0}"#);
    gives(&Pairs(vec![(Newtype(2.0), 0)]), r#"{"2":0}"#);
    gives(
        &Pairs(vec![(u128::MAX, 0)]),
        r#"{"3.402823669209385e+38":0}"#,
    );
    gives(
        &Pairs(vec![(i128::MIN, 0)]),
        r#"{"-1.7014118346046923e+38":0}"#,
    );
    gives(&Pairs(vec![(Display("x\"y"), 0)]), r#"{"x\"y":0}"#);
    both_fail(&Pairs(vec![(None::<&str>, 0)]));
    both_fail(&Pairs(vec![((), 0)]));
    both_fail(&Pairs(vec![(UnitStruct, 0)]));
    both_fail(&Pairs(vec![(Variant::Newtype(1), 0)]));
    both_fail(&Pairs(vec![(Variant::Tuple(1, String::new()), 0)]));
    both_fail(&Pairs(vec![(Variant::EmptyStruct {}, 0)]));
    both_fail(&Pairs(vec![(vec![1u8], 0)]));
    both_fail(&Pairs(vec![((1u8, 2u8), 0)]));
    both_fail(&Pairs(vec![(TupleStruct(1, 'a', 1), 0)]));
    both_fail(&Pairs(vec![(Empty {}, 0)]));
    both_fail(&Pairs(vec![(BTreeMap::<String, u8>::new(), 0)]));
    both_fail(&Pairs(vec![(Bytes(b"k"), 0)]));
    // The error is in a nested map.
    both_fail(&vec![Pairs(vec![((), 0)])]);
    both_fail(
        &serde_json::json!({"a": [1, 2]})
            .as_object()
            .map(|m| Pairs(vec![(m, 0)])),
    );
}

#[test]
fn duplicate_keys_fail() {
    both_fail(&Pairs(vec![("a", 1), ("a", 2)]));
    both_fail(&Pairs(vec![("b", 1), ("a", 1), ("b", 2)]));
    // Equal only as text: numbers are keys through their canonical number text.
    both_fail(&Pairs(vec![(Key::U(1), 1), (Key::S("1"), 2)]));
    both_fail(&Pairs(vec![(Key::U(1), 1), (Key::F(1.0), 2)]));
    both_fail(&Pairs(vec![(Key::B(true), 1), (Key::S("true"), 2)]));
    both_fail(&Pairs(vec![(Key::C('x'), 1), (Key::S("x"), 2)]));
    let keys: BTreeMap<u64, u8> = [(9_007_199_254_740_992, 1), (9_007_199_254_740_993, 2)].into();
    both_fail(&keys);
    // ... and nested.
    both_fail(&vec![Pairs(vec![("a", 1), ("a", 2)])]);
    gives(&Pairs(vec![("a", 1), ("A", 2)]), r#"{"A":2,"a":1}"#);
}

#[test]
fn keys_sort_by_utf16_after_unescaping() {
    // Escaped forms sort differently from what they stand for: "\n" (U+000A) < " " < "\"" < "\\".
    gives(
        &Pairs(vec![
            ("\\", 0),
            ("\"", 1),
            (" ", 2),
            ("\n", 3),
            ("\u{1}", 4),
            ("", 5),
        ]),
        r#"{"":5,"\u0001":4,"\n":3," ":2,"\"":1,"\\":0}"#,
    );
    gives(
        &Pairs(vec![
            ("\u{ffff}", 0),
            ("\u{10000}", 1),
            ("\u{e000}", 2),
            ("\u{d7ff}", 3),
        ]),
        "{\"\u{d7ff}\":3,\"\u{10000}\":1,\"\u{e000}\":2,\"\u{ffff}\":0}",
    );
    gives(
        &Pairs(vec![
            ("a\u{ffff}", 0),
            ("a\u{10ffff}", 1),
            ("a", 2),
            ("a\u{7f}", 3),
        ]),
        "{\"a\":2,\"a\u{7f}\":3,\"a\u{10ffff}\":1,\"a\u{ffff}\":0}",
    );
    gives(
        &serde_json::json!({"\u{ffff}": 0, "\u{10000}": 1, "a\u{e000}b": 2, "a\u{1f600}": 3}),
        "{\"a\u{1f600}\":3,\"a\u{e000}b\":2,\"\u{10000}\":1,\"\u{ffff}\":0}",
    );
}

#[test]
fn strings_escape_like_json_stringify() {
    let all_controls: String = (0u8..0x20).map(char::from).collect();
    same(&all_controls);
    gives(
        &"\u{8}\u{c}\n\r\t\u{b}\u{1f}",
        r#""\b\f\n\r\t\u000b\u001f""#,
    );
    gives(
        &"\u{7f}\u{2028}\u{2029}/é😀",
        "\"\u{7f}\u{2028}\u{2029}/é😀\"",
    );
    gives(&"\"\\", r#""\"\\""#);
    gives(&'\u{0}', r#""\u0000""#);
    // Long strings cross the 8-byte fast path of the escaper at every offset.
    for offset in 0..17 {
        let mut text = "x".repeat(offset);
        text.push('\u{1}');
        text.push_str(&"é".repeat(offset));
        text.push('"');
        text.push_str(&"y".repeat(9));
        same(&text);
    }
    gives(&Display("a\u{1}b"), r#""a\u0001b""#);
    gives(&Bytes(&[0, 255]), "[0,255]");
    gives(&Bytes(&[]), "[]");
}

#[derive(Debug, Clone, Copy)]
enum Key {
    U(u64),
    F(f64),
    B(bool),
    C(char),
    S(&'static str),
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Key::U(v) => s.serialize_u64(v),
            Key::F(v) => s.serialize_f64(v),
            Key::B(v) => s.serialize_bool(v),
            Key::C(v) => s.serialize_char(v),
            Key::S(v) => s.serialize_str(v),
        }
    }
}

/// Serializes through `collect_str`.
struct Display<T>(T);

impl<T: fmt::Display> Serialize for Display<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Serialize impls that break the rules: the canonicalizer still gives an answer, so must we
// ---------------------------------------------------------------------------------------------

/// A sequence or map that announces a length it does not keep.
struct Lying {
    map: bool,
    announced: Option<usize>,
    items: usize,
}

impl Serialize for Lying {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.map {
            let mut map = s.serialize_map(self.announced)?;
            for i in 0..self.items {
                map.serialize_entry(&format!("k{}", self.items - i), &i)?;
            }
            map.end()
        } else {
            let mut seq = s.serialize_seq(self.announced)?;
            for i in 0..self.items {
                seq.serialize_element(&i)?;
            }
            seq.end()
        }
    }
}

/// A struct variant announcing no fields and writing one anyway.
struct LyingVariant;

impl Serialize for LyingVariant {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut v = s.serialize_struct_variant("E", 0, "V", 0)?;
        v.serialize_field("f", &1)?;
        v.end()
    }
}

/// Map calls out of order, errors swallowed.
#[derive(Clone, Copy)]
enum Odd {
    ValueWithoutKey,
    KeyTwice,
    EndAfterKey,
    SwallowKeyError,
    SwallowValueError,
    SwallowDuplicate,
    SwallowNestedKeyError,
}

struct Failing;

impl Serialize for Failing {
    fn serialize<S: Serializer>(&self, _s: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("failing on purpose"))
    }
}

impl Serialize for Odd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match self {
            Odd::ValueWithoutKey => {
                map.serialize_entry("a", &1)?;
                map.serialize_value(&2)?;
            }
            Odd::KeyTwice => {
                map.serialize_key("b")?;
                map.serialize_key("a")?;
                map.serialize_value(&1)?;
            }
            Odd::EndAfterKey => {
                map.serialize_entry("a", &1)?;
                map.serialize_key("b")?;
            }
            Odd::SwallowKeyError => {
                let _ = map.serialize_key(&());
                map.serialize_entry("a", &1)?;
            }
            Odd::SwallowValueError => {
                map.serialize_entry("b", &1)?;
                let _ = map.serialize_entry("a", &Failing);
                map.serialize_entry("c", &2)?;
            }
            Odd::SwallowDuplicate => {
                map.serialize_entry("b", &1)?;
                map.serialize_entry("a", &2)?;
                let _ = map.serialize_entry("b", &3);
                map.serialize_entry("c", &4)?;
            }
            Odd::SwallowNestedKeyError => {
                map.serialize_entry("z", &1)?;
                let _ = map.serialize_entry("y", &Pairs(vec![((), 1)]));
                map.serialize_entry("x", &2)?;
            }
        }
        map.end()
    }
}

/// A sequence that swallows its elements' errors.
struct SwallowingSeq<T>(Vec<T>);

impl<T: Serialize> Serialize for SwallowingSeq<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in &self.0 {
            let _ = seq.serialize_element(item);
        }
        seq.end()
    }
}

/// A struct variant that swallows its fields' errors.
struct SwallowingVariant<T>(T);

impl<T: Serialize> Serialize for SwallowingVariant<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut v = s.serialize_struct_variant("E", 0, "V", 2)?;
        let _ = v.serialize_field("b", &self.0);
        v.serialize_field("a", &1)?;
        v.end()
    }
}

#[test]
fn lying_lengths_give_the_canonicalizers_bytes() {
    let mut agreed_ok = 0;
    let mut count = |result: Option<Vec<u8>>| agreed_ok += usize::from(result.is_some());
    for map in [false, true] {
        for announced in [None, Some(0), Some(1), Some(5)] {
            for items in 0..4 {
                let lying = || Lying {
                    map,
                    announced,
                    items,
                };
                count(same(&lying()));
                count(same(&vec![lying()]));
                count(same(&Pairs(vec![("outer", lying())])));
                count(same(&Pairs(vec![("a", Pairs(vec![("b", lying())]))])));
                count(same(&Pairs(vec![("a", Pairs(vec![("b", vec![lying()])]))])));
                count(same(&Pairs(vec![
                    (
                        "p",
                        Lying {
                            map: true,
                            announced: Some(3),
                            items: 3,
                        },
                    ),
                    ("q", lying()),
                ])));
            }
        }
    }
    // Not only errors: most of these give (odd) bytes, the exact model's.
    assert!(agreed_ok > 100, "{agreed_ok}");
    gives(
        &Lying {
            map: false,
            announced: Some(0),
            items: 2,
        },
        "[],0,1]",
    );
    // The member of a map announced empty lands in the enclosing object, which its `end` then
    // closes: the outer object's own end finds nothing open.
    both_fail(&Pairs(vec![(
        "outer",
        Lying {
            map: true,
            announced: Some(0),
            items: 1,
        },
    )]));
    both_fail(&Pairs(vec![(
        "a",
        Pairs(vec![(
            "outer",
            Lying {
                map: true,
                announced: Some(0),
                items: 1,
            },
        )]),
    )]));
    same(&LyingVariant);
    same(&vec![LyingVariant]);
    same(&Pairs(vec![("x", LyingVariant)]));
    same(&Pairs(vec![("y", Pairs(vec![("x", LyingVariant)]))]));
}

#[test]
fn out_of_order_map_calls_and_swallowed_errors_give_the_canonicalizers_answer() {
    for odd in [
        Odd::ValueWithoutKey,
        Odd::KeyTwice,
        Odd::EndAfterKey,
        Odd::SwallowKeyError,
        Odd::SwallowValueError,
        Odd::SwallowDuplicate,
        Odd::SwallowNestedKeyError,
    ] {
        same(&odd);
        same(&vec![odd]);
        same(&Pairs(vec![("outer", odd)]));
        same(&Pairs(vec![("o", Pairs(vec![("i", odd)]))]));
        same(&SwallowingSeq(vec![odd, odd]));
        same(&Pairs(vec![("s", SwallowingSeq(vec![odd]))]));
        same(&SwallowingVariant(odd));
        same(&Pairs(vec![("v", SwallowingVariant(odd))]));
    }
    same(&SwallowingSeq(vec![Failing, Failing]));
    same(&Pairs(vec![("s", SwallowingSeq(vec![Failing]))]));
    same(&SwallowingVariant(Failing));
    same(&Pairs(vec![("v", SwallowingVariant(Failing))]));
    same(&SwallowingSeq(vec![
        Pairs(vec![((), 1)]),
        Pairs(vec![((), 2)]),
    ]));
    same(&Pairs(vec![(
        "k",
        SwallowingSeq(vec![Pairs(vec![((), 1)])]),
    )]));
    same(&SwallowingSeq(vec![Pairs(vec![("a", 1), ("a", 2)])]));
}

/// A `Display` impl that fails on its own: serde_json's `collect_str` panics on it (an
/// `expect`), ours returns an error.
struct BadDisplay;

impl fmt::Display for BadDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("partial")?;
        Err(fmt::Error)
    }
}

#[test]
fn a_failing_display_is_an_error_not_a_panic() {
    assert!(to_canonical_vec(&Display(BadDisplay)).is_err());
    assert!(to_canonical_vec(&vec![Display(BadDisplay)]).is_err());
    assert!(to_canonical_vec(&Pairs(vec![(Display(BadDisplay), 1)])).is_err());
    assert!(to_canonical_vec(&SwallowingSeq(vec![Display(BadDisplay)])).is_err());
    let oracle =
        std::panic::catch_unwind(|| serde_json_canonicalizer::to_vec(&Display(BadDisplay)));
    assert!(
        oracle.is_err(),
        "serde_json_canonicalizer no longer panics here"
    );
}

#[test]
fn nested_maps_out_of_byte_order_at_every_level_are_written_once() {
    // At every level the byte order (serde_json's map order: U+E000 before U+10000) differs from
    // the UTF-16 order (U+10000, a surrogate pair from 0xD800, first), and the nested map comes
    // first in byte order. Writing in map order and restarting sorted on the first key out of
    // order wrote each nested map twice per level: 2^48 times here, which never finishes.
    let mut value = serde_json::json!({"leaf": true});
    for i in 0..48 {
        value = serde_json::json!({ "\u{e000}": value, "\u{10000}": i });
    }
    let ours = canonical_value(&value);
    assert_eq!(ours, serde_json_canonicalizer::to_vec(&value).unwrap());
    let Value::Object(map) = &value else {
        unreachable!("built as an object")
    };
    assert_eq!(
        toolgate_canon::Sha256Digest::of_json_object(map),
        toolgate_canon::Sha256Digest::of(&ours)
    );
}

#[test]
fn deep_and_wide_values() {
    let mut value = serde_json::json!({"leaf": [1, 2.5, "x"]});
    for i in 0..100 {
        value = serde_json::json!({ format!("k{i}"): value, "\u{10000}": [value.clone()], "\u{ffff}": i });
        if i % 10 == 0 {
            assert_eq!(
                canonical_value(&value),
                serde_json_canonicalizer::to_vec(&value).unwrap()
            );
        }
        // Keep it from growing exponentially.
        value = serde_json::json!({ "v": value["k".to_owned() + &i.to_string()].clone(), "i": i });
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
    let wide = Value::Object(wide);
    assert_eq!(
        canonical_value(&wide),
        serde_json_canonicalizer::to_vec(&wide).unwrap()
    );
    let pairs: Vec<(String, i32)> = (0..500)
        .map(|i| (format!("{}", (i * 7919) % 1000), i))
        .collect();
    same(&Pairs(pairs));
}

/// A map that can be serialized once (it drains its entries), as iterator adapters do.
struct OneShot<K, V>(std::cell::RefCell<Vec<(K, V)>>);

impl<K: Serialize, V: Serialize> Serialize for OneShot<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let entries = std::mem::take(&mut *self.0.borrow_mut());
        let mut map = s.serialize_map(None)?;
        for (k, v) in &entries {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[test]
fn errors_do_not_serialize_again() {
    fn fails<K: Serialize + Clone, V: Serialize + Clone>(entries: Vec<(K, V)>) {
        let ours = OneShot(std::cell::RefCell::new(entries.clone()));
        let theirs = OneShot(std::cell::RefCell::new(entries));
        assert!(serde_json_canonicalizer::to_vec(&theirs).is_err());
        assert!(to_canonical_vec(&ours).is_err());
        // Once drained it is an empty map, for both.
        assert_eq!(to_canonical_vec(&ours).unwrap(), b"{}");
        assert_eq!(serde_json_canonicalizer::to_vec(&theirs).unwrap(), b"{}");
    }
    fails(vec![("a", 1), ("a", 2)]);
    fails(vec![("b", 1), ("a", 2), ("b", 3)]);
    fails(vec![((), 1)]);
    fails(vec![(f64::NAN, 1)]);
    fails(vec![(Key::U(1), 1), (Key::S("1"), 2)]);
}

/// A map that adds every pair and swallows the errors (repeated keys among them).
struct SwallowingMap<K, V>(Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for SwallowingMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (k, v) in &self.0 {
            let _ = map.serialize_entry(k, v);
        }
        map.end()
    }
}

#[test]
fn repeated_keys_in_large_unordered_maps() {
    for len in [2usize, 31, 32, 33, 100, 1000] {
        // Distinct keys, in no particular order.
        let keys: Vec<String> = (0..len).map(|i| format!("k{}", (i * 7919) % len)).collect();
        let distinct: Vec<(String, usize)> = keys.iter().cloned().zip(0..).collect();
        same(&Pairs(distinct.clone())).expect("distinct keys");
        for repeat_at in [1, len / 2, len - 1] {
            let mut pairs = distinct.clone();
            pairs.insert(repeat_at, (keys[repeat_at / 3].clone(), 999_999));
            both_fail(&Pairs(pairs.clone()));
            same(&SwallowingMap(pairs.clone())).expect("a swallowed repeat is dropped");
            same(&vec![SwallowingMap(pairs.clone())]).expect("nested too");
            let nested = Pairs(vec![
                ("z", SwallowingMap(pairs.clone())),
                ("a", SwallowingMap(pairs)),
            ]);
            same(&nested).expect("and in objects");
        }
    }
    same(&SwallowingMap(vec![
        ("a", 1),
        ("a", 2),
        ("b", 3),
        ("a", 4),
        ("b", 5),
    ]))
    .expect("first wins");
}
