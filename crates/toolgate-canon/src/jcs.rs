//! The RFC 8785 (JCS) writer: canonical JSON bytes straight from `Serialize` or from a
//! `serde_json::Value`.
//!
//! # Compatibility contract
//!
//! Every digest toolgate has ever written (audit chains, `toolgate.lock`, effect journals) was
//! computed over the bytes of `serde_json_canonicalizer` 0.4, so this writer reproduces that
//! crate's output byte for byte, and fails exactly where it fails. A differential property test
//! (`tests/jcs_differential.rs`) keeps the two in step. What that crate does, and so what this one
//! does:
//!
//! * Every number, integer or not, is converted to `f64` and written the way ECMAScript's
//!   `Number.prototype.toString` does (the `ryu-js` crate). Integers above 2^53 therefore lose
//!   precision: `u64::MAX` is written `18446744073709552000`, `i128` and `u128` beyond 1e21 in
//!   exponent form (`1e+21`), and `f32` values are widened (`0.1f32` is `0.10000000149011612`).
//!   `-0.0` is written `0`.
//! * A non-finite `f32`/`f64` is an error only when it is the value itself; nested anywhere (in a
//!   field, an element, an `Option`, a newtype) it is written `null`, as `serde_json` does.
//! * Strings escape `"`, `\` and U+0000..U+001F only (`\b \t \n \f \r`, else `\u00xx` lowercase);
//!   everything else, DEL and U+2028/U+2029 included, is written as UTF-8.
//! * Object members are sorted by the UTF-16 code units of their unescaped names; two names that
//!   are equal after unescaping are an error (`duplicate object key`).
//! * Map keys may be strings, chars, unit variants, numbers (written as the quoted number text,
//!   so `1u8` and `1.0f64` are the same key), booleans (`"true"`), or newtypes/`Some` of those;
//!   a non-finite float key, bytes, unit, `None`, sequences, maps, structs and non-unit variants
//!   are errors.
//! * Enums are externally tagged (`"V"`, `{"V":x}`, `{"V":[..]}`, `{"V":{..}}`), bytes are an
//!   array of numbers, unit, unit structs and `None` are `null`, newtypes and `Some` are their
//!   content.
//! * A `Serialize` impl that announces a length of zero (`serialize_seq(Some(0))`,
//!   `serialize_map(Some(0))`, a zero-field struct) gets `[]`/`{}` written at once; whatever it
//!   then serializes anyway is placed as `serde_json`'s serializer and the canonicalizer's
//!   formatter would place it (elements after the `]`, members into the enclosing object).
//!
//! One deliberate difference: a `Display` impl that fails inside `collect_str` makes
//! `serde_json` (and so `serde_json_canonicalizer`) panic; here it is an error.
//!
//! # How
//!
//! [`Ser`] mirrors the control flow of `serde_json`'s serializer (the events it emits and where
//! it stops on an error) and sends object events to a [`Sink`]. The fast sink, [`Fast`], writes
//! everything into one buffer: members are written in place as `,key:value`, and when an object
//! closes they are left where they are if they arrived in order (the usual case for a
//! `serde_json::Map`) or sorted and copied back once otherwise. A repeated key is refused when its
//! member is added, as the canonicalizer does (a caller that swallows that error gets the object
//! without the member, in both).
//!
//! [`Fast`] also checks that the events follow the ordinary grammar (key, value, key, value,
//! end). A `Serialize` impl that breaks it (by lying about a length, or by swallowing an error
//! and carrying on) makes the whole value be serialized again through [`Exact`], a direct model
//! of `serde_json_canonicalizer`'s formatter (stacks of buffers, keys and objects), so that even
//! those inputs give the same bytes. Ordinary values, and ordinary errors, are serialized once.
//!
//! [`write_value`] walks a `serde_json::Value` directly, without serde.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::fmt::{self, Display};
use std::hash::{Hash, Hasher};

use serde::Serialize;
use serde::ser::{self, Impossible};

/// Why a value has no canonical form (or the `Serialize` impl's own error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Error(String);

impl Error {
    fn new(message: &str) -> Self {
        Error(message.to_owned())
    }

    fn non_finite() -> Self {
        Error::new("NaN and +/-Infinity are not permitted in JSON")
    }

    fn key_must_be_a_string() -> Self {
        Error::new("key must be a string")
    }

    fn float_key_must_be_finite() -> Self {
        Error::new("float key must be finite (got NaN or +/-inf)")
    }

    fn duplicate_key() -> Self {
        Error::new("duplicate object key")
    }

    fn display_failed() -> Self {
        Error::new("a Display impl used through collect_str returned an error")
    }

    /// The fast sink met a sequence of calls it does not model; the value is serialized again.
    fn irregular() -> Self {
        Error::new("irregular sequence of serializer calls")
    }
}

impl Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

type Result<T = ()> = std::result::Result<T, Error>;

/// The canonical bytes of `value`.
pub(crate) fn to_vec<T: ?Sized + Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut fast = Ser::new(Fast::default());
    let outcome = value.serialize(Top(&mut fast));
    if !fast.sink.irregular {
        if fast.display_failed {
            return Err(Error::display_failed());
        }
        match outcome {
            // Every object closed: the canonicalizer's bytes.
            Ok(()) if fast.sink.frames.is_empty() => return Ok(fast.sink.out),
            // An error that reached the top: the canonicalizer met the same calls, gave the same
            // answers and fails too. Not serializing again also keeps a `Serialize` impl that
            // can run only once (one drawing from an iterator) from passing the second time.
            Err(error) => return Err(error),
            // Ok although an object was left open: an error was swallowed inside and the
            // canonicalizer's stacks hold what ours do not.
            Ok(()) => {}
        }
    }
    // Calls outside the ordinary grammar, or a swallowed error: replay through the exact model,
    // whose state after any call sequence is the canonicalizer's.
    let mut exact = Ser::new(Exact::default());
    let outcome = value.serialize(Top(&mut exact));
    if exact.display_failed {
        return Err(Error::display_failed());
    }
    outcome.map(|()| exact.sink.out)
}

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

fn write_u128(out: &mut Vec<u8>, value: u128) {
    match u64::try_from(value) {
        Ok(small) => write_u64(out, small),
        Err(_) => write_f64(out, value as f64),
    }
}

fn write_i128(out: &mut Vec<u8>, value: i128) {
    match i64::try_from(value) {
        Ok(small) => write_i64(out, small),
        Err(_) => write_f64(out, value as f64),
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

fn utf16_cmp_iter(mut a: impl Iterator<Item = u8>, mut b: impl Iterator<Item = u8>) -> Ordering {
    loop {
        match (a.next(), b.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x == y => {}
            (Some(x), Some(y)) => return utf16_byte_cmp(x, y),
        }
    }
}

/// The UTF-8 bytes of the string whose escaped contents (as this module writes them) are
/// `escaped`.
fn unescape(escaped: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut rest = escaped.iter().copied();
    std::iter::from_fn(move || {
        let byte = rest.next()?;
        if byte != b'\\' {
            return Some(byte);
        }
        Some(match rest.next()? {
            b'b' => 0x08,
            b't' => 0x09,
            b'n' => 0x0a,
            b'f' => 0x0c,
            b'r' => 0x0d,
            b'u' => {
                // Always `\u00xx` with xx below 0x20.
                let mut code = 0u8;
                for _ in 0..4 {
                    let digit = rest.next()?;
                    let nibble = match digit {
                        b'0'..=b'9' => digit - b'0',
                        b'a'..=b'f' => digit - b'a' + 10,
                        _ => 0,
                    };
                    code = (code << 4) | nibble;
                }
                code
            }
            other => other,
        })
    })
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

// ---------------------------------------------------------------------------------------------
// Sinks: where object events go
// ---------------------------------------------------------------------------------------------

/// Receives the object events of `serde_json`'s `Formatter` (arrays and scalars are plain
/// writes to [`Sink::out`]).
pub(crate) trait Sink {
    /// Where the next bytes go.
    fn out(&mut self) -> &mut Vec<u8>;
    fn begin_object(&mut self) -> Result;
    fn end_object(&mut self) -> Result;
    fn begin_object_key(&mut self) -> Result;
    fn end_object_key(&mut self) -> Result;
    fn begin_object_value(&mut self) -> Result;
    fn end_object_value(&mut self) -> Result;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between members.
    Idle,
    /// Writing a key.
    Key,
    /// A key written, its value not begun.
    KeyDone,
    /// Writing a value.
    Value,
}

/// A key written into [`Fast`]'s buffer.
#[derive(Debug, Clone, Copy, Default)]
struct KeyRef {
    /// Its range in `out`, quotes included.
    start: usize,
    end: usize,
    /// It contains an escape sequence: compare unescaped.
    escaped: bool,
    /// It contains a byte >= 0xEE (a character from U+E000 on): byte order may not be UTF-16
    /// order against another such key.
    high: bool,
    /// Its first 8 bytes, big-endian, zero-padded: orders most keys in one comparison.
    prefix: u64,
}

impl KeyRef {
    /// The key's text as written, without the quotes.
    fn text<'a>(&self, out: &'a [u8]) -> &'a [u8] {
        out.get(self.start + 1..self.end.saturating_sub(1))
            .unwrap_or_default()
    }

    /// Orders keys by the UTF-16 code units of the strings they stand for.
    fn cmp(&self, other: &KeyRef, out: &[u8]) -> Ordering {
        let (a, b) = (self.text(out), other.text(out));
        if self.escaped || other.escaped {
            utf16_cmp_iter(unescape(a), unescape(b))
        } else if self.high && other.high {
            utf16_cmp(a, b)
        } else {
            // Byte order. Unescaped keys hold no NUL, so zero padding sorts a key before any
            // longer key it is a prefix of, as byte order does.
            self.prefix.cmp(&other.prefix).then_with(|| a.cmp(b))
        }
    }
}

/// An open object in [`Fast`].
#[derive(Debug)]
struct Frame {
    /// Offset of its `{` in `out`.
    start: usize,
    /// Index of its first member in `members`.
    first: usize,
    /// Whether its members so far arrived in strictly increasing order (then no key repeats).
    in_order: bool,
    /// Whether its members are in `Fast::index`.
    indexed: bool,
    phase: Phase,
    /// The member being written: its key and where its value starts.
    key: KeyRef,
    value_start: usize,
}

/// A written member: ranges of `out`.
#[derive(Debug, Clone, Copy)]
struct Member {
    key: KeyRef,
    value: (usize, usize),
}

/// The fast sink: one buffer, members sorted in place.
#[derive(Debug)]
pub(crate) struct Fast {
    out: Vec<u8>,
    frames: Vec<Frame>,
    members: Vec<Member>,
    scratch: Vec<u8>,
    /// For objects with many members that did not arrive in order: a hash of (object, key) to
    /// the member's index, to find a repeated key without comparing it with every member.
    index: HashMap<u64, usize>,
    /// Set when a call broke the ordinary grammar: the output is then not trusted and the value
    /// is serialized again through [`Exact`].
    irregular: bool,
}

/// Up to this many members, a repeated key is looked for by comparing with each.
const LINEAR_SEARCH_MEMBERS: usize = 32;

impl Default for Fast {
    fn default() -> Self {
        Fast {
            out: Vec::with_capacity(INITIAL_CAPACITY),
            frames: Vec::with_capacity(4),
            members: Vec::with_capacity(16),
            scratch: Vec::new(),
            index: HashMap::new(),
            irregular: false,
        }
    }
}

impl Fast {
    fn irregular(&mut self) -> Error {
        self.irregular = true;
        Error::irregular()
    }

    /// The top frame, if it is in `phase`.
    fn top_in(&mut self, phase: Phase) -> Option<&mut Frame> {
        self.frames.last_mut().filter(|frame| frame.phase == phase)
    }

    fn index_hash(out: &[u8], frame_start: usize, key: &KeyRef) -> u64 {
        let mut hasher = DefaultHasher::new();
        frame_start.hash(&mut hasher);
        key.text(out).hash(&mut hasher);
        hasher.finish()
    }

    /// Whether a member of the object starting at `frame_start`, whose members begin at
    /// `first`, has the key `key`. Equal strings are written as equal bytes, so bytes are
    /// compared.
    fn has_key(&self, frame_start: usize, first: usize, indexed: bool, key: &KeyRef) -> bool {
        let out = &self.out;
        let text = key.text(out);
        let same = |member: &Member| {
            member.key.prefix == key.prefix
                && member.key.end.saturating_sub(member.key.start)
                    == key.end.saturating_sub(key.start)
                && member.key.text(out) == text
        };
        let members = self.members.get(first..).unwrap_or_default();
        if indexed {
            match self.index.get(&Self::index_hash(out, frame_start, key)) {
                None => return false,
                Some(&at) if self.members.get(at).is_some_and(same) => return true,
                // A hash collision: fall back to comparing with each.
                Some(_) => {}
            }
        }
        members.iter().any(same)
    }

    /// Indexes every member of the top frame (called once it has many members out of order).
    fn build_index(&mut self, frame_start: usize, first: usize) {
        for (at, member) in self.members.iter().enumerate().skip(first) {
            let hash = Self::index_hash(&self.out, frame_start, &member.key);
            self.index.entry(hash).or_insert(at);
        }
    }

    /// Forgets the index entries of a closing frame.
    fn drop_index(&mut self, frame_start: usize, first: usize) {
        for (at, member) in self.members.iter().enumerate().skip(first) {
            let hash = Self::index_hash(&self.out, frame_start, &member.key);
            if self.index.get(&hash) == Some(&at) {
                self.index.remove(&hash);
            }
        }
    }
}

impl Sink for Fast {
    #[inline]
    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    fn begin_object(&mut self) -> Result {
        // At the top level, or inside the value of the innermost open object.
        if self
            .frames
            .last()
            .is_some_and(|top| top.phase != Phase::Value)
        {
            return Err(self.irregular());
        }
        self.frames.push(Frame {
            start: self.out.len(),
            first: self.members.len(),
            in_order: true,
            indexed: false,
            phase: Phase::Idle,
            key: KeyRef::default(),
            value_start: 0,
        });
        self.out.push(b'{');
        Ok(())
    }

    fn begin_object_key(&mut self) -> Result {
        let at = self.out.len();
        let members = self.members.len();
        let Some(top) = self.top_in(Phase::Idle) else {
            return Err(self.irregular());
        };
        top.phase = Phase::Key;
        let comma = members > top.first;
        top.key.start = at + usize::from(comma);
        if comma {
            self.out.push(b',');
        }
        Ok(())
    }

    fn end_object_key(&mut self) -> Result {
        let at = self.out.len();
        // Borrowing fields, not `self`: the frame is updated while `out` and `members` are read.
        let Some(top) = self.frames.last_mut().filter(|f| f.phase == Phase::Key) else {
            return Err(self.irregular());
        };
        top.phase = Phase::KeyDone;
        if at < top.key.start + 2 {
            // Not a quoted string (cannot happen: keys are written by `KeySer`).
            return Err(self.irregular());
        }
        top.key.end = at;
        let (escaped, high) = top
            .key
            .text(&self.out)
            .iter()
            .fold((false, false), |(escaped, high), &byte| {
                (escaped || byte == b'\\', high || byte >= 0xee)
            });
        let mut prefix = [0u8; 8];
        for (slot, &byte) in prefix.iter_mut().zip(top.key.text(&self.out)) {
            *slot = byte;
        }
        top.key.escaped = escaped;
        top.key.high = high;
        top.key.prefix = u64::from_be_bytes(prefix);
        // Still in order if this key sorts after the previous member's.
        if top.in_order && self.members.len() > top.first {
            let previous = self.members.last().map(|member| member.key);
            top.in_order = previous
                .is_some_and(|previous| previous.cmp(&top.key, &self.out) == Ordering::Less);
        }
        Ok(())
    }

    fn begin_object_value(&mut self) -> Result {
        let at = self.out.len();
        let Some(top) = self.top_in(Phase::KeyDone) else {
            return Err(self.irregular());
        };
        top.phase = Phase::Value;
        top.value_start = at + 1;
        self.out.push(b':');
        Ok(())
    }

    fn end_object_value(&mut self) -> Result {
        let at = self.out.len();
        let members = self.members.len();
        let Some(top) = self.top_in(Phase::Value) else {
            return Err(self.irregular());
        };
        top.phase = Phase::Idle;
        let (key, value_start, frame_start, first) =
            (top.key, top.value_start, top.start, top.first);
        let (in_order, mut indexed) = (top.in_order, top.indexed);
        // Like the canonicalizer, refuse a repeated key when it is added: the member is dropped
        // (its bytes with it) and the object stays open, as its does.
        if !in_order {
            if !indexed && members.saturating_sub(first) >= LINEAR_SEARCH_MEMBERS {
                self.build_index(frame_start, first);
                indexed = true;
                if let Some(top) = self.frames.last_mut() {
                    top.indexed = true;
                }
            }
            if self.has_key(frame_start, first, indexed, &key) {
                // The member's comma (there is an earlier member: the one with this key).
                self.out.truncate(key.start.saturating_sub(1));
                return Err(Error::duplicate_key());
            }
        }
        if indexed {
            let hash = Self::index_hash(&self.out, frame_start, &key);
            self.index.entry(hash).or_insert(members);
        }
        self.members.push(Member {
            key,
            value: (value_start, at),
        });
        Ok(())
    }

    fn end_object(&mut self) -> Result {
        if self.top_in(Phase::Idle).is_none() {
            return Err(self.irregular());
        }
        let Some(frame) = self.frames.pop() else {
            return Err(self.irregular());
        };
        if frame.in_order {
            self.out.push(b'}');
            self.members.truncate(frame.first);
            return Ok(());
        }
        if frame.indexed {
            self.drop_index(frame.start, frame.first);
        }
        let out = &self.out;
        let members = self.members.get_mut(frame.first..).unwrap_or_default();
        members.sort_unstable_by(|a, b| a.key.cmp(&b.key, out));
        let duplicate = members.windows(2).any(|pair| match pair {
            [a, b] => a.key.cmp(&b.key, out) == Ordering::Equal,
            _ => false,
        });
        if duplicate {
            // Cannot happen: repeated keys are refused as they are added.
            return Err(self.irregular());
        }
        let scratch = &mut self.scratch;
        scratch.clear();
        scratch.reserve(out.len().saturating_sub(frame.start) + 1);
        scratch.push(b'{');
        for (i, member) in members.iter().enumerate() {
            if i > 0 {
                scratch.push(b',');
            }
            scratch.extend_from_slice(
                out.get(member.key.start..member.key.end)
                    .unwrap_or_default(),
            );
            scratch.push(b':');
            scratch.extend_from_slice(out.get(member.value.0..member.value.1).unwrap_or_default());
        }
        scratch.push(b'}');
        self.members.truncate(frame.first);
        self.out.truncate(frame.start);
        self.out.extend_from_slice(&self.scratch);
        Ok(())
    }
}

/// A member of an object in [`Exact`], as `serde_json_canonicalizer` keeps it.
#[derive(Debug)]
struct Property {
    sorting_key: Vec<u16>,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// A direct model of `serde_json_canonicalizer`'s formatter: every key and value goes to a
/// buffer of its own, objects are sets ordered by UTF-16 key. Slow; used only when [`Fast`]
/// gives up.
#[derive(Debug, Default)]
pub(crate) struct Exact {
    out: Vec<u8>,
    objects: Vec<Vec<Property>>,
    keys: Vec<Vec<u8>>,
    buffers: Vec<Vec<u8>>,
}

impl Sink for Exact {
    fn out(&mut self) -> &mut Vec<u8> {
        match self.buffers.last_mut() {
            Some(buffer) => buffer,
            None => &mut self.out,
        }
    }

    fn begin_object(&mut self) -> Result {
        self.objects.push(Vec::new());
        Ok(())
    }

    fn end_object(&mut self) -> Result {
        let object = self
            .objects
            .pop()
            .ok_or_else(|| Error::new("end_object called before start_object"))?;
        let out = self.out();
        out.push(b'{');
        for (i, property) in object.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&property.key);
            out.push(b':');
            out.extend_from_slice(&property.value);
        }
        out.push(b'}');
        Ok(())
    }

    fn begin_object_key(&mut self) -> Result {
        self.buffers.push(Vec::new());
        Ok(())
    }

    fn end_object_key(&mut self) -> Result {
        let key = self
            .buffers
            .pop()
            .ok_or_else(|| Error::new("end_object_key called before begin_object_key"))?;
        self.keys.push(key);
        Ok(())
    }

    fn begin_object_value(&mut self) -> Result {
        self.buffers.push(Vec::new());
        Ok(())
    }

    fn end_object_value(&mut self) -> Result {
        // The same steps in the same order as the canonicalizer: what is popped before a
        // failure stays popped.
        let value = self
            .buffers
            .pop()
            .ok_or_else(|| Error::new("end_object_value called before begin_object_value"))?;
        let key = self
            .keys
            .pop()
            .ok_or_else(|| Error::new("end_object_value called before end_object_key"))?;
        let object = self
            .objects
            .last_mut()
            .ok_or_else(|| Error::new("end_object_value called before start_object"))?;
        // It reads the key back as JSON to unescape it before comparing.
        let sorting_key: Vec<u16> = match serde_json::from_slice::<serde_json::Value>(&key) {
            Ok(serde_json::Value::String(text)) => text.encode_utf16().collect(),
            Ok(_) => return Err(Error::new("Invalid UTF8 sequence")),
            Err(error) => return Err(Error(error.to_string())),
        };
        match object.binary_search_by(|p| p.sorting_key.cmp(&sorting_key)) {
            Ok(_) => Err(Error::duplicate_key()),
            Err(at) => {
                object.insert(
                    at,
                    Property {
                        sorting_key,
                        key,
                        value,
                    },
                );
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The serde front end: serde_json's Serializer, call for call
// ---------------------------------------------------------------------------------------------

/// Emits what `serde_json::Serializer<_, JcsFormatter>` emits, to a [`Sink`].
#[derive(Debug)]
pub(crate) struct Ser<K> {
    sink: K,
    /// A `Display` impl failed in `collect_str` (where serde_json panics).
    display_failed: bool,
}

impl<K: Sink> Ser<K> {
    fn new(sink: K) -> Self {
        Ser {
            sink,
            display_failed: false,
        }
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.sink.out().extend_from_slice(bytes);
    }

    fn write_quoted(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let out = self.sink.out();
        out.push(b'"');
        write(out);
        out.push(b'"');
    }

    fn collect_display<T: ?Sized + Display>(&mut self, value: &T) -> Result {
        struct Adapter<'a>(&'a mut Vec<u8>);
        impl fmt::Write for Adapter<'_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                write_str_contents(self.0, s);
                Ok(())
            }
        }
        let out = self.sink.out();
        out.push(b'"');
        if fmt::Write::write_fmt(&mut Adapter(out), format_args!("{value}")).is_err() {
            self.display_failed = true;
            return Err(Error::display_failed());
        }
        self.sink.out().push(b'"');
        Ok(())
    }

    fn begin_variant(&mut self, variant: &str) -> Result {
        self.sink.begin_object()?;
        self.sink.begin_object_key()?;
        write_str(self.sink.out(), variant);
        self.sink.end_object_key()?;
        self.sink.begin_object_value()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    First,
    Rest,
}

/// serde_json's `Compound` (for sequences, tuples, maps, structs and their variants).
#[derive(Debug)]
pub(crate) struct Compound<'a, K> {
    ser: &'a mut Ser<K>,
    state: State,
}

impl<'a, K: Sink> ser::Serializer for &'a mut Ser<K> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a, K>;
    type SerializeTuple = Compound<'a, K>;
    type SerializeTupleStruct = Compound<'a, K>;
    type SerializeTupleVariant = Compound<'a, K>;
    type SerializeMap = Compound<'a, K>;
    type SerializeStruct = Compound<'a, K>;
    type SerializeStructVariant = Compound<'a, K>;

    fn serialize_bool(self, v: bool) -> Result {
        self.write(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result {
        write_i64(self.sink.out(), i64::from(v));
        Ok(())
    }

    fn serialize_i16(self, v: i16) -> Result {
        write_i64(self.sink.out(), i64::from(v));
        Ok(())
    }

    fn serialize_i32(self, v: i32) -> Result {
        write_i64(self.sink.out(), i64::from(v));
        Ok(())
    }

    fn serialize_i64(self, v: i64) -> Result {
        write_i64(self.sink.out(), v);
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result {
        write_i128(self.sink.out(), v);
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Result {
        write_u64(self.sink.out(), u64::from(v));
        Ok(())
    }

    fn serialize_u16(self, v: u16) -> Result {
        write_u64(self.sink.out(), u64::from(v));
        Ok(())
    }

    fn serialize_u32(self, v: u32) -> Result {
        write_u64(self.sink.out(), u64::from(v));
        Ok(())
    }

    fn serialize_u64(self, v: u64) -> Result {
        write_u64(self.sink.out(), v);
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result {
        write_u128(self.sink.out(), v);
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result {
        // Nested non-finite floats are `null` (serde_json); only the top level rejects them.
        if v.is_finite() {
            write_f64(self.sink.out(), f64::from(v));
        } else {
            self.write(b"null");
        }
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result {
        if v.is_finite() {
            write_f64(self.sink.out(), v);
        } else {
            self.write(b"null");
        }
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result {
        self.serialize_str(v.encode_utf8(&mut [0u8; 4]))
    }

    fn serialize_str(self, v: &str) -> Result {
        write_str(self.sink.out(), v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result {
        let out = self.sink.out();
        out.push(b'[');
        for (i, &byte) in v.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_u64(out, u64::from(byte));
        }
        out.push(b']');
        Ok(())
    }

    fn serialize_none(self) -> Result {
        self.serialize_unit()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result {
        self.write(b"null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
    ) -> Result {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result {
        self.begin_variant(variant)?;
        value.serialize(&mut *self)?;
        self.sink.end_object_value()?;
        self.sink.end_object()
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a, K>> {
        self.write(b"[");
        if len == Some(0) {
            self.write(b"]");
            Ok(Compound {
                ser: self,
                state: State::Empty,
            })
        } else {
            Ok(Compound {
                ser: self,
                state: State::First,
            })
        }
    }

    fn serialize_tuple(self, len: usize) -> Result<Compound<'a, K>> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a, K>> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a, K>> {
        self.begin_variant(variant)?;
        self.serialize_seq(Some(len))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a, K>> {
        self.sink.begin_object()?;
        if len == Some(0) {
            self.sink.end_object()?;
            Ok(Compound {
                ser: self,
                state: State::Empty,
            })
        } else {
            Ok(Compound {
                ser: self,
                state: State::First,
            })
        }
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a, K>> {
        self.serialize_map(Some(len))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a, K>> {
        self.begin_variant(variant)?;
        self.serialize_map(Some(len))
    }

    fn collect_str<T: ?Sized + Display>(self, value: &T) -> Result {
        self.collect_display(value)
    }
}

impl<K: Sink> Compound<'_, K> {
    fn element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        if self.state != State::First {
            self.ser.write(b",");
        }
        self.state = State::Rest;
        value.serialize(&mut *self.ser)
    }

    fn end_array(self) -> Result {
        if self.state != State::Empty {
            self.ser.write(b"]");
        }
        Ok(())
    }

    fn key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result {
        self.ser.sink.begin_object_key()?;
        self.state = State::Rest;
        key.serialize(KeySer { ser: self.ser })?;
        self.ser.sink.end_object_key()
    }

    fn value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        self.ser.sink.begin_object_value()?;
        value.serialize(&mut *self.ser)?;
        self.ser.sink.end_object_value()
    }

    fn end_map(self) -> Result {
        if self.state != State::Empty {
            self.ser.sink.end_object()?;
        }
        Ok(())
    }
}

impl<K: Sink> ser::SerializeSeq for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        self.element(value)
    }

    fn end(self) -> Result {
        self.end_array()
    }
}

impl<K: Sink> ser::SerializeTuple for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        self.element(value)
    }

    fn end(self) -> Result {
        self.end_array()
    }
}

impl<K: Sink> ser::SerializeTupleStruct for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        self.element(value)
    }

    fn end(self) -> Result {
        self.end_array()
    }
}

impl<K: Sink> ser::SerializeTupleVariant for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        self.element(value)
    }

    fn end(self) -> Result {
        let ser = self.ser;
        if self.state != State::Empty {
            ser.write(b"]");
        }
        ser.sink.end_object_value()?;
        ser.sink.end_object()
    }
}

impl<K: Sink> ser::SerializeMap for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result {
        self.key(key)
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        self.value(value)
    }

    fn end(self) -> Result {
        self.end_map()
    }
}

impl<K: Sink> ser::SerializeStruct for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, value: &T) -> Result {
        self.key(key)?;
        self.value(value)
    }

    fn end(self) -> Result {
        self.end_map()
    }
}

impl<K: Sink> ser::SerializeStructVariant for Compound<'_, K> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, value: &T) -> Result {
        self.key(key)?;
        self.value(value)
    }

    fn end(self) -> Result {
        let ser = self.ser;
        if self.state != State::Empty {
            ser.sink.end_object()?;
        }
        ser.sink.end_object_value()?;
        ser.sink.end_object()
    }
}

/// serde_json's `MapKeySerializer`: keys are strings, or scalars written as quoted text.
struct KeySer<'a, K> {
    ser: &'a mut Ser<K>,
}

impl<K: Sink> KeySer<'_, K> {
    fn quoted(self, write: impl FnOnce(&mut Vec<u8>)) -> Result {
        self.ser.write_quoted(write);
        Ok(())
    }
}

impl<K: Sink> ser::Serializer for KeySer<'_, K> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Impossible<(), Error>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_str(self, v: &str) -> Result {
        write_str(self.ser.sink.out(), v);
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
    ) -> Result {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result {
        value.serialize(self)
    }

    fn serialize_bool(self, v: bool) -> Result {
        self.quoted(|out| out.extend_from_slice(if v { b"true" } else { b"false" }))
    }

    fn serialize_i8(self, v: i8) -> Result {
        self.quoted(|out| write_i64(out, i64::from(v)))
    }

    fn serialize_i16(self, v: i16) -> Result {
        self.quoted(|out| write_i64(out, i64::from(v)))
    }

    fn serialize_i32(self, v: i32) -> Result {
        self.quoted(|out| write_i64(out, i64::from(v)))
    }

    fn serialize_i64(self, v: i64) -> Result {
        self.quoted(|out| write_i64(out, v))
    }

    fn serialize_i128(self, v: i128) -> Result {
        self.quoted(|out| write_i128(out, v))
    }

    fn serialize_u8(self, v: u8) -> Result {
        self.quoted(|out| write_u64(out, u64::from(v)))
    }

    fn serialize_u16(self, v: u16) -> Result {
        self.quoted(|out| write_u64(out, u64::from(v)))
    }

    fn serialize_u32(self, v: u32) -> Result {
        self.quoted(|out| write_u64(out, u64::from(v)))
    }

    fn serialize_u64(self, v: u64) -> Result {
        self.quoted(|out| write_u64(out, v))
    }

    fn serialize_u128(self, v: u128) -> Result {
        self.quoted(|out| write_u128(out, v))
    }

    fn serialize_f32(self, v: f32) -> Result {
        if !v.is_finite() {
            return Err(Error::float_key_must_be_finite());
        }
        self.quoted(|out| write_f64(out, f64::from(v)))
    }

    fn serialize_f64(self, v: f64) -> Result {
        if !v.is_finite() {
            return Err(Error::float_key_must_be_finite());
        }
        self.quoted(|out| write_f64(out, v))
    }

    fn serialize_char(self, v: char) -> Result {
        self.serialize_str(v.encode_utf8(&mut [0u8; 4]))
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_unit(self) -> Result {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_none(self) -> Result {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result {
        value.serialize(self)
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq> {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple> {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct> {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant> {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap> {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct> {
        Err(Error::key_must_be_a_string())
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant> {
        Err(Error::key_must_be_a_string())
    }

    fn collect_str<T: ?Sized + Display>(self, value: &T) -> Result {
        self.ser.collect_display(value)
    }
}

/// The top level: `serde_json_canonicalizer`'s own serializer, which rejects a non-finite
/// float when it is the whole value and otherwise defers to the nested behaviour.
struct Top<'a, K>(&'a mut Ser<K>);

impl<'a, K: Sink> ser::Serializer for Top<'a, K> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a, K>;
    type SerializeTuple = Compound<'a, K>;
    type SerializeTupleStruct = Compound<'a, K>;
    type SerializeTupleVariant = Compound<'a, K>;
    type SerializeMap = Compound<'a, K>;
    type SerializeStruct = Compound<'a, K>;
    type SerializeStructVariant = Compound<'a, K>;

    fn serialize_bool(self, v: bool) -> Result {
        self.0.serialize_bool(v)
    }

    fn serialize_i8(self, v: i8) -> Result {
        self.0.serialize_i8(v)
    }

    fn serialize_i16(self, v: i16) -> Result {
        self.0.serialize_i16(v)
    }

    fn serialize_i32(self, v: i32) -> Result {
        self.0.serialize_i32(v)
    }

    fn serialize_i64(self, v: i64) -> Result {
        self.0.serialize_i64(v)
    }

    fn serialize_i128(self, v: i128) -> Result {
        self.0.serialize_i128(v)
    }

    fn serialize_u8(self, v: u8) -> Result {
        self.0.serialize_u8(v)
    }

    fn serialize_u16(self, v: u16) -> Result {
        self.0.serialize_u16(v)
    }

    fn serialize_u32(self, v: u32) -> Result {
        self.0.serialize_u32(v)
    }

    fn serialize_u64(self, v: u64) -> Result {
        self.0.serialize_u64(v)
    }

    fn serialize_u128(self, v: u128) -> Result {
        self.0.serialize_u128(v)
    }

    fn serialize_f32(self, v: f32) -> Result {
        if !v.is_finite() {
            return Err(Error::non_finite());
        }
        self.0.serialize_f32(v)
    }

    fn serialize_f64(self, v: f64) -> Result {
        if !v.is_finite() {
            return Err(Error::non_finite());
        }
        self.0.serialize_f64(v)
    }

    fn serialize_char(self, v: char) -> Result {
        self.0.serialize_char(v)
    }

    fn serialize_str(self, v: &str) -> Result {
        self.0.serialize_str(v)
    }

    fn serialize_bytes(self, v: &[u8]) -> Result {
        self.0.serialize_bytes(v)
    }

    fn serialize_none(self) -> Result {
        self.0.serialize_none()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result {
        self.0.serialize_some(value)
    }

    fn serialize_unit(self) -> Result {
        self.0.serialize_unit()
    }

    fn serialize_unit_struct(self, name: &'static str) -> Result {
        self.0.serialize_unit_struct(name)
    }

    fn serialize_unit_variant(
        self,
        name: &'static str,
        variant_index: u32,
        variant: &'static str,
    ) -> Result {
        self.0.serialize_unit_variant(name, variant_index, variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result {
        self.0.serialize_newtype_struct(name, value)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        variant_index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result {
        self.0
            .serialize_newtype_variant(name, variant_index, variant, value)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a, K>> {
        self.0.serialize_seq(len)
    }

    fn serialize_tuple(self, len: usize) -> Result<Compound<'a, K>> {
        self.0.serialize_tuple(len)
    }

    fn serialize_tuple_struct(self, name: &'static str, len: usize) -> Result<Compound<'a, K>> {
        self.0.serialize_tuple_struct(name, len)
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        variant_index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a, K>> {
        self.0
            .serialize_tuple_variant(name, variant_index, variant, len)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a, K>> {
        self.0.serialize_map(len)
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Compound<'a, K>> {
        self.0.serialize_struct(name, len)
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        variant_index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a, K>> {
        self.0
            .serialize_struct_variant(name, variant_index, variant, len)
    }

    fn collect_str<T: ?Sized + Display>(self, value: &T) -> Result {
        self.0.collect_str(value)
    }
}

#[cfg(test)]
mod tests {
    //! The fast sink alone on ordinary input (the differential tests in `tests/` see only the
    //! combined result, which would hide a fast sink that gives up too often).

    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap};

    /// Serializes through [`Fast`] only; `None` if it gave up.
    fn fast_only<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        let mut fast = Ser::new(Fast::default());
        let outcome = value.serialize(Top(&mut fast));
        (outcome.is_ok() && !fast.sink.irregular && fast.sink.frames.is_empty())
            .then_some(fast.sink.out)
    }

    fn exact_only<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        let mut exact = Ser::new(Exact::default());
        value
            .serialize(Top(&mut exact))
            .ok()
            .map(|()| exact.sink.out)
    }

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(u8),
        Tuple(i8, char),
        Struct { z: u8, a: Vec<u8> },
    }

    #[derive(Serialize)]
    struct Fields {
        zeta: Option<u32>,
        alpha: String,
        #[serde(rename = "\u{10000}")]
        supplementary: u8,
        #[serde(rename = "\u{ffff}")]
        bmp: u8,
        #[serde(rename = "\n")]
        newline: u8,
        #[serde(rename = " ")]
        space: u8,
        shapes: Vec<Shape>,
        by_number: BTreeMap<i64, f64>,
        by_name: HashMap<String, bool>,
        nested: BTreeMap<&'static str, BTreeMap<&'static str, u8>>,
    }

    fn fields() -> Fields {
        Fields {
            zeta: Some(1),
            alpha: "a\"\\\u{1}é".into(),
            supplementary: 1,
            bmp: 2,
            newline: 3,
            space: 4,
            shapes: vec![
                Shape::Unit,
                Shape::Newtype(1),
                Shape::Tuple(-1, 'x'),
                Shape::Struct { z: 1, a: vec![] },
            ],
            by_number: [(-5, 0.5), (10, 1e300), (2, -0.0)].into(),
            by_name: [("b".to_owned(), true), ("a".to_owned(), false)].into(),
            nested: [("y", [("b", 1), ("a", 2)].into()), ("x", BTreeMap::new())].into(),
        }
    }

    #[test]
    fn the_fast_sink_handles_ordinary_values_itself() {
        let value = fields();
        let fast = fast_only(&value).expect("the fast sink handles a derived struct");
        assert_eq!(Some(&fast), exact_only(&value).as_ref());
        assert_eq!(fast, to_vec(&value).expect("serializes"));
        assert_eq!(Some(fast), serde_json_canonicalizer::to_vec(&value).ok());
    }

    /// Adds every pair, swallowing the errors of repeated keys.
    struct SwallowingMap(Vec<(String, u32)>);

    impl Serialize for SwallowingMap {
        fn serialize<S: ser::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(None)?;
            for (k, v) in &self.0 {
                let _ = map.serialize_entry(k, v);
            }
            map.end()
        }
    }

    #[test]
    fn the_fast_sink_refuses_a_repeated_key_when_it_is_added() {
        for len in [3u32, 40, 300] {
            let mut pairs: Vec<(String, u32)> = (0..len)
                .map(|i| (format!("k{}", (i * 7) % len), i))
                .collect();
            pairs.insert(2, ("k0".to_owned(), 1000));
            pairs.push(("k1".to_owned(), 1001));
            let value = SwallowingMap(pairs);
            let fast = fast_only(&value).expect("the fast sink handles it without replaying");
            assert_eq!(Some(&fast), exact_only(&value).as_ref());
            assert_eq!(Some(fast), serde_json_canonicalizer::to_vec(&value).ok());
        }
    }

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
        let unescaped: Vec<u8> = unescape(br#"a\n\"\\\u001f\/b"#).collect();
        assert_eq!(unescaped, b"a\n\"\\\x1f/b");
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

    /// A `Value` through serde, with its objects' members in reverse: the fast sink must sort.
    struct Reversed<'a>(&'a serde_json::Value);

    impl Serialize for Reversed<'_> {
        fn serialize<S: ser::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            use serde::ser::{SerializeMap, SerializeSeq};
            match self.0 {
                serde_json::Value::Array(items) => {
                    let mut seq = s.serialize_seq(Some(items.len()))?;
                    for item in items {
                        seq.serialize_element(&Reversed(item))?;
                    }
                    seq.end()
                }
                serde_json::Value::Object(map) => {
                    let mut out = s.serialize_map(Some(map.len()))?;
                    for (key, value) in map.iter().rev() {
                        out.serialize_entry(key, &Reversed(value))?;
                    }
                    out.end()
                }
                other => other.serialize(s),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        #[test]
        fn fast_sink_alone_matches_the_exact_model_and_the_oracle(value in any_value()) {
            let oracle = serde_json_canonicalizer::to_vec(&value).ok();
            prop_assert!(oracle.is_some());
            let mut direct = Vec::new();
            write_value(&mut direct, &value);
            prop_assert_eq!(Some(&direct), oracle.as_ref());
            prop_assert_eq!(fast_only(&value), oracle.clone());
            prop_assert_eq!(exact_only(&value), oracle.clone());
            prop_assert_eq!(fast_only(&Reversed(&value)), oracle.clone());
            prop_assert_eq!(exact_only(&Reversed(&value)), oracle);
        }
    }
}
