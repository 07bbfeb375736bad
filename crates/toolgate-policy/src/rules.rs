//! Argument rules (`arg_rules.<tool>.<field>` and `principals.<p>.arg_rules.<tool>.<field>`):
//! compiled once at load, checked on every call without allocating unless the call is refused.

use std::cmp::Ordering;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use regex::{Regex, RegexBuilder};
use serde_json::{Map, Number, Value};

use crate::raw::{RawArgRule, RawPathRule};

/// The largest compiled size of one `pattern` (regex crate `size_limit`), 1 MiB.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// How many enum values an error message lists before eliding the rest.
const ENUM_VALUES_IN_MESSAGES: usize = 20;

/// The JSON type a ruled argument must have. Derived from the rule's keys: string rules
/// (`min_len`, `max_len`, `pattern`, `path`) need a string, number rules (`minimum`, `maximum`) a
/// number, `max_items` an array; a rule with only `enum` accepts any type listed in its enum; a rule
/// with none of these (e.g. `{}` or `{"optional": true}`) needs a string, as it always did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgType {
    /// A JSON string.
    String,
    /// A JSON number.
    Number,
    /// A JSON array.
    Array,
    /// Any JSON value (only rules made of `enum` alone).
    Any,
}

impl ArgType {
    fn with_article(self) -> &'static str {
        match self {
            ArgType::String => "a string",
            ArgType::Number => "a number",
            ArgType::Array => "an array",
            ArgType::Any => "any value",
        }
    }

    /// The type's name as used in messages and in `details()`.
    pub fn name(self) -> &'static str {
        match self {
            ArgType::String => "string",
            ArgType::Number => "number",
            ArgType::Array => "array",
            ArgType::Any => "any",
        }
    }
}

/// A compiled `pattern`: the text as written and the whole-string regex `^(?:text)$`.
#[derive(Debug, Clone)]
struct Pattern {
    source: Arc<str>,
    regex: Regex,
}

/// A compiled `enum`: the values as written; strings, booleans and null (whose canonical JSON is
/// equal exactly when they are) for direct lookup; the canonical JSON of the other values
/// (numbers, arrays, objects), sorted for binary search.
#[derive(Debug, Clone)]
struct EnumValues {
    values: Arc<[Value]>,
    strings: Vec<String>,
    scalars: Vec<Value>,
    canonical: Vec<Vec<u8>>,
}

impl EnumValues {
    fn new(values: Vec<Value>) -> Self {
        let mut strings = Vec::new();
        let mut scalars = Vec::new();
        let mut canonical = Vec::new();
        for value in &values {
            match value {
                Value::String(text) => strings.push(text.clone()),
                Value::Bool(_) | Value::Null => scalars.push(value.clone()),
                other => canonical.push(toolgate_canon::canonical_value(other)),
            }
        }
        strings.sort();
        strings.dedup();
        canonical.sort();
        canonical.dedup();
        EnumValues {
            values: values.into(),
            strings,
            scalars,
            canonical,
        }
    }

    fn contains(&self, value: &Value) -> bool {
        match value {
            Value::String(text) => self.strings.binary_search(text).is_ok(),
            Value::Bool(_) | Value::Null => self.scalars.contains(value),
            other => {
                !self.canonical.is_empty()
                    && self
                        .canonical
                        .binary_search(&toolgate_canon::canonical_value(other))
                        .is_ok()
            }
        }
    }
}

/// A compiled `path` rule: the allowed roots, absolute and normalised, and the base directory
/// relative values are resolved against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRule {
    roots: Arc<[String]>,
    root_parts: Vec<Vec<String>>,
    base: String,
    base_parts: Vec<String>,
}

impl PathRule {
    /// `inherited`: the top-level path rule on the same field, whose base a principal's rule
    /// shares (a tool has one working directory, so one relative value must name one file).
    fn compile(raw: RawPathRule, at: &str, inherited: Option<&PathRule>) -> Result<Self, String> {
        if raw.roots.is_empty() {
            return Err(format!(
                "{at}.path.roots is empty, so no path could pass; list at least one absolute directory such as \"/data\""
            ));
        }
        let mut roots = Vec::with_capacity(raw.roots.len());
        let mut root_parts = Vec::with_capacity(raw.roots.len());
        for (index, root) in raw.roots.iter().enumerate() {
            let bad = |why: &str| {
                format!(
                    "{at}.path.roots[{index}] {root:?} {why}; write each root as an absolute directory without `.` or `..` such as \"/data\""
                )
            };
            if !root.starts_with('/') {
                return Err(bad("is not absolute"));
            }
            if root.contains('\0') {
                return Err(bad("contains a NUL byte"));
            }
            let parts: Vec<String> = root
                .split('/')
                .filter(|part| !part.is_empty())
                .map(str::to_owned)
                .collect();
            if parts.iter().any(|part| part == "." || part == "..") {
                return Err(bad("has a `.` or `..` component"));
            }
            roots.push(format!("/{}", parts.join("/")));
            root_parts.push(parts);
        }
        let (base, base_parts) = match inherited {
            Some(top) => (top.base.clone(), top.base_parts.clone()),
            // `raw.roots` is non-empty (checked at the top), so both vectors have an element 0.
            None => (roots[0].clone(), root_parts[0].clone()),
        };
        Ok(PathRule {
            roots: roots.into(),
            root_parts,
            base,
            base_parts,
        })
    }

    /// The allowed roots, absolute, normalised, without trailing slash (`/` stays `/`).
    pub fn roots(&self) -> &[String] {
        &self.roots
    }

    /// The directory relative values are resolved against: the first root of the top-level
    /// `path` rule on the same field (so a principal's narrower rule resolves a relative value to
    /// the same file), or this rule's own first root.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The length in characters of the shortest value that passes this rule and `other` (which
    /// shares its base), or `None` when no value passes both (their roots do not nest).
    pub(crate) fn shortest_with(&self, other: Option<&PathRule>) -> Option<u64> {
        let nested: Vec<&[String]> = match other {
            None => self.root_parts.iter().map(Vec::as_slice).collect(),
            Some(other) => {
                let mut deeper = Vec::new();
                for a in &self.root_parts {
                    for b in &other.root_parts {
                        if a.starts_with(b) {
                            deeper.push(a.as_slice());
                        } else if b.starts_with(a) {
                            deeper.push(b.as_slice());
                        }
                    }
                }
                deeper
            }
        };
        let chars = |parts: &[String]| -> u64 {
            parts
                .iter()
                .map(|p| u64::try_from(p.chars().count()).unwrap_or(u64::MAX))
                .fold(0u64, |sum, n| sum.saturating_add(n).saturating_add(1))
        };
        nested
            .into_iter()
            .map(|dir| {
                // Absolute: "/a/b" (or "/"); relative: "../" per level above the common prefix,
                // then the rest ("." when the directory is the base itself).
                let absolute = chars(dir).max(1);
                let common = dir
                    .iter()
                    .zip(&self.base_parts)
                    .take_while(|(a, b)| a == b)
                    .count();
                // `common` counts a prefix of `base_parts`, so it is at most its length.
                let up = u64::try_from(self.base_parts.len() - common).unwrap_or(u64::MAX);
                let rest = chars(&dir[common..]);
                let relative = if up == 0 && rest == 0 {
                    1
                } else {
                    up.saturating_mul(3).saturating_add(rest).saturating_sub(1)
                };
                absolute.min(relative)
            })
            .min()
    }

    /// Normalises `value` lexically and checks it lies inside one of the roots.
    ///
    /// A relative value is resolved against [`PathRule::base`]; empty components and `.` are dropped and
    /// `..` removes the preceding component. Climbing above `/`, or ending outside every root
    /// (component-wise, so `/data2` is not inside `/data`), is [`Violation::PathEscapes`]; an empty
    /// value or one containing a NUL byte is [`Violation::BadPath`]. No file system access happens
    /// here: symbolic links are the caller's to resolve (the gate does, at call time).
    pub fn normalise(&self, value: &str) -> Result<PathBuf, Violation> {
        let parts = self.inside(value)?;
        Ok(PathBuf::from(format!("/{}", parts.join("/"))))
    }

    /// The normalised components of `value` when it lies inside a root.
    fn inside<'a>(&'a self, value: &'a str) -> Result<Vec<&'a str>, Violation> {
        if value.is_empty() || value.contains('\0') {
            return Err(Violation::BadPath {
                roots: self.roots.clone(),
            });
        }
        let mut parts: Vec<&str> = Vec::with_capacity(self.base_parts.len() + 8);
        if !value.starts_with('/') {
            parts.extend(self.base_parts.iter().map(String::as_str));
        }
        for part in value.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(self.escapes());
                    }
                }
                name => parts.push(name),
            }
        }
        let inside = self
            .root_parts
            .iter()
            .any(|root| root.len() <= parts.len() && root.iter().zip(&parts).all(|(r, p)| r == p));
        if !inside {
            return Err(self.escapes());
        }
        Ok(parts)
    }

    fn escapes(&self) -> Violation {
        Violation::PathEscapes {
            roots: self.roots.clone(),
        }
    }
}

/// The rules on one argument of one tool. Constructed only by the policy loader, which rejects
/// contradictory rule sets (see the crate documentation).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ArgRule {
    /// Minimum length in characters, inclusive.
    pub min_len: Option<u64>,
    /// Maximum length in characters, inclusive.
    pub max_len: Option<u64>,
    pattern: Option<Pattern>,
    one_of: Option<EnumValues>,
    minimum: Option<Number>,
    maximum: Option<Number>,
    max_items: Option<u64>,
    path: Option<PathRule>,
    optional: bool,
    kind: ArgType,
}

impl PartialEq for ArgRule {
    /// Two rules are equal when they are written the same (after normalisation).
    fn eq(&self, other: &Self) -> bool {
        self.spec() == other.spec()
    }
}

impl Eq for ArgRule {}

impl ArgRule {
    /// Compiles a rule as written at `at` (e.g. `arg_rules.write_note.text`), rejecting rule sets
    /// no value could satisfy (patterns excepted: their satisfiability is not checked).
    ///
    /// `top`: for a principal's rule, the top-level rule on the same field (its `path` base is
    /// inherited).
    pub(crate) fn compile(
        raw: RawArgRule,
        at: &str,
        top: Option<&ArgRule>,
    ) -> Result<Self, String> {
        let string_keys: Vec<&str> = [
            ("min_len", raw.min_len.is_some()),
            ("max_len", raw.max_len.is_some()),
            ("pattern", raw.pattern.is_some()),
            ("path", raw.path.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        let number_keys: Vec<&str> = [
            ("minimum", raw.minimum.is_some()),
            ("maximum", raw.maximum.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        let array = raw.max_items.is_some();
        let groups = [
            (!string_keys.is_empty(), "string rules"),
            (!number_keys.is_empty(), "number rules"),
            (array, "max_items"),
        ];
        let kinds: Vec<&str> = groups
            .iter()
            .filter_map(|(set, name)| set.then_some(*name))
            .collect();
        if kinds.len() > 1 {
            let mut keys = string_keys.clone();
            keys.extend(&number_keys);
            if array {
                keys.push("max_items");
            }
            let (last, first) = kinds.split_last().unwrap_or((&"", &[]));
            return Err(format!(
                "{at} mixes {} and {last} ({}), but a value has only one JSON type; keep the keys of one kind (string: min_len, max_len, pattern, path; number: minimum, maximum; array: max_items)",
                first.join(", "),
                keys.join(", ")
            ));
        }
        let kind = if !string_keys.is_empty() {
            ArgType::String
        } else if !number_keys.is_empty() {
            ArgType::Number
        } else if array {
            ArgType::Array
        } else if raw.one_of.is_some() {
            ArgType::Any
        } else {
            ArgType::String
        };

        if let (Some(min), Some(max)) = (raw.min_len, raw.max_len)
            && min > max
        {
            return Err(format!(
                "{at}: min_len {min} is greater than max_len {max}, so no value could pass; fix the bounds"
            ));
        }
        if let (Some(min), Some(max)) = (&raw.minimum, &raw.maximum)
            && cmp_numbers(min, max) == Ordering::Greater
        {
            return Err(format!(
                "{at}: minimum {min} is greater than maximum {max}, so no value could pass; fix the bounds"
            ));
        }
        let max_items = match &raw.max_items {
            None => None,
            Some(n) => Some(n.as_u64().ok_or_else(|| {
                format!(
                    "{at}.max_items is {n}, not a non-negative integer; use a whole number such as 10"
                )
            })?),
        };
        let pattern = match raw.pattern {
            None => None,
            Some(source) => Some(compile_pattern(&source, at)?),
        };
        let path = match raw.path {
            None => None,
            Some(raw_path) => {
                let inherited = top.and_then(|rule| rule.path.as_ref());
                Some(PathRule::compile(raw_path, at, inherited)?)
            }
        };
        if let (Some(path), Some(max)) = (&path, raw.max_len)
            && let Some(shortest) = path.shortest_with(None)
            && shortest > max
        {
            return Err(format!(
                "{at}: max_len {max} is shorter than any path the path rule admits (at least {shortest} characters; relative values resolve against {}), so no value could pass; raise max_len or change the roots",
                path.base()
            ));
        }
        let mut rule = ArgRule {
            min_len: raw.min_len,
            max_len: raw.max_len,
            pattern,
            one_of: None,
            minimum: raw.minimum,
            maximum: raw.maximum,
            max_items,
            path,
            optional: raw.optional.unwrap_or(false),
            kind,
        };
        if let Some(values) = raw.one_of {
            if values.is_empty() {
                return Err(format!(
                    "{at}.enum is empty, so no value could pass; list at least one allowed value or remove enum"
                ));
            }
            for (index, value) in values.iter().enumerate() {
                if let Err(violation) = rule.check_present(value) {
                    return Err(format!(
                        "{at}.enum[{index}] breaks the field's own {} rule, so listing it has no effect; fix or remove that value",
                        violation.key()
                    ));
                }
            }
            rule.one_of = Some(EnumValues::new(values));
        }
        Ok(rule)
    }

    /// The `pattern` as written (matched against the whole string).
    pub fn pattern(&self) -> Option<&str> {
        self.pattern.as_ref().map(|p| &*p.source)
    }

    /// The `enum` values as written.
    pub fn enum_values(&self) -> Option<&[Value]> {
        self.one_of.as_ref().map(|e| &*e.values)
    }

    /// The inclusive `minimum`.
    pub fn minimum(&self) -> Option<&Number> {
        self.minimum.as_ref()
    }

    /// The inclusive `maximum`.
    pub fn maximum(&self) -> Option<&Number> {
        self.maximum.as_ref()
    }

    /// The inclusive `max_items`.
    pub fn max_items(&self) -> Option<u64> {
        self.max_items
    }

    /// The `path` rule.
    pub fn path(&self) -> Option<&PathRule> {
        self.path.as_ref()
    }

    /// Whether a missing field passes (`optional`, default false).
    pub fn optional(&self) -> bool {
        self.optional
    }

    /// The JSON type a present value must have.
    pub fn expected_type(&self) -> ArgType {
        self.kind
    }

    /// Checks one argument value (`None` = the field is absent).
    pub fn check(&self, value: Option<&Value>) -> Result<(), Violation> {
        match value {
            None if self.optional => Ok(()),
            None => Err(Violation::Missing),
            Some(value) => self.check_present(value),
        }
    }

    fn check_present(&self, value: &Value) -> Result<(), Violation> {
        match self.kind {
            ArgType::String => {
                let Value::String(text) = value else {
                    return Err(Violation::NotString);
                };
                self.check_string(text)?;
            }
            ArgType::Number => {
                let Value::Number(number) = value else {
                    return Err(Violation::NotNumber);
                };
                if let Some(minimum) = &self.minimum
                    && cmp_numbers(number, minimum) == Ordering::Less
                {
                    return Err(Violation::BelowMinimum {
                        minimum: minimum.clone(),
                        actual: number.clone(),
                    });
                }
                if let Some(maximum) = &self.maximum
                    && cmp_numbers(number, maximum) == Ordering::Greater
                {
                    return Err(Violation::AboveMaximum {
                        maximum: maximum.clone(),
                        actual: number.clone(),
                    });
                }
            }
            ArgType::Array => {
                let Value::Array(items) = value else {
                    return Err(Violation::NotArray);
                };
                let actual = u64::try_from(items.len()).unwrap_or(u64::MAX);
                if let Some(max_items) = self.max_items
                    && actual > max_items
                {
                    return Err(Violation::TooManyItems { max_items, actual });
                }
            }
            ArgType::Any => {}
        }
        if let Some(one_of) = &self.one_of
            && !one_of.contains(value)
        {
            return Err(Violation::NotInEnum {
                allowed: one_of.values.clone(),
            });
        }
        Ok(())
    }

    fn check_string(&self, text: &str) -> Result<(), Violation> {
        if self.min_len.is_some() || self.max_len.is_some() {
            let actual = u64::try_from(text.chars().count()).unwrap_or(u64::MAX);
            if let Some(min_len) = self.min_len
                && actual < min_len
            {
                return Err(Violation::TooShort { min_len, actual });
            }
            if let Some(max_len) = self.max_len
                && actual > max_len
            {
                return Err(Violation::TooLong { max_len, actual });
            }
        }
        if let Some(pattern) = &self.pattern
            && !pattern.regex.is_match(text)
        {
            return Err(Violation::PatternMismatch {
                pattern: pattern.source.clone(),
            });
        }
        if let Some(path) = &self.path {
            path.inside(text)?;
        }
        Ok(())
    }

    /// The rule as a JSON object in normalised form: what fingerprints and equality are computed
    /// from. A rule written with only `min_len`/`max_len` gives exactly the object it always gave.
    pub(crate) fn spec(&self) -> Value {
        let mut bounds = Map::new();
        if let Some(min) = self.min_len {
            bounds.insert("min_len".to_owned(), Value::from(min));
        }
        if let Some(max) = self.max_len {
            bounds.insert("max_len".to_owned(), Value::from(max));
        }
        if let Some(pattern) = self.pattern() {
            bounds.insert("pattern".to_owned(), Value::from(pattern));
        }
        if let Some(values) = self.enum_values() {
            bounds.insert("enum".to_owned(), Value::Array(values.to_vec()));
        }
        if let Some(minimum) = &self.minimum {
            bounds.insert("minimum".to_owned(), Value::Number(minimum.clone()));
        }
        if let Some(maximum) = &self.maximum {
            bounds.insert("maximum".to_owned(), Value::Number(maximum.clone()));
        }
        if let Some(max_items) = self.max_items {
            bounds.insert("max_items".to_owned(), Value::from(max_items));
        }
        if let Some(path) = &self.path {
            bounds.insert(
                "path".to_owned(),
                serde_json::json!({ "roots": path.roots() }),
            );
        }
        if self.optional {
            bounds.insert("optional".to_owned(), Value::Bool(true));
        }
        Value::Object(bounds)
    }

    /// Whether some value passes both `self` (the top-level rule) and `other` (a principal's rule
    /// on the same field); `Err` says why not. Exact except for patterns, which are only checked
    /// against enum values.
    pub(crate) fn jointly_satisfiable(&self, other: &ArgRule) -> Result<(), String> {
        let candidates = self
            .enum_values()
            .or_else(|| other.enum_values())
            .map(<[Value]>::to_vec);
        if let Some(candidates) = candidates {
            return if candidates
                .iter()
                .any(|v| self.check_present(v).is_ok() && other.check_present(v).is_ok())
            {
                Ok(())
            } else {
                Err("no value listed in enum passes both rules".to_owned())
            };
        }
        if self.kind != other.kind {
            return Err(format!(
                "one needs {} and the other {}",
                self.kind.with_article(),
                other.kind.with_article()
            ));
        }
        match self.kind {
            ArgType::String => {
                let lo = self.min_len.max(other.min_len);
                let hi = match (self.max_len, other.max_len) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if let (Some(lo), Some(hi)) = (lo, hi)
                    && lo > hi
                {
                    return Err(format!(
                        "together they need at least {lo} and at most {hi} characters"
                    ));
                }
                let shortest = match (&self.path, &other.path) {
                    (None, None) => return Ok(()),
                    (Some(a), None) | (None, Some(a)) => a.shortest_with(None),
                    (Some(a), Some(b)) => b.shortest_with(Some(a)),
                };
                let Some(shortest) = shortest else {
                    return Err(format!(
                        "their path roots do not overlap ({} versus {})",
                        self.path
                            .as_ref()
                            .map(|p| p.roots().join(", "))
                            .unwrap_or_default(),
                        other
                            .path
                            .as_ref()
                            .map(|p| p.roots().join(", "))
                            .unwrap_or_default()
                    ));
                };
                if let Some(hi) = hi
                    && shortest > hi
                {
                    return Err(format!(
                        "together they allow at most {hi} characters but every path inside both has at least {shortest}"
                    ));
                }
                Ok(())
            }
            ArgType::Number => {
                let lo = max_number(self.minimum.as_ref(), other.minimum.as_ref());
                let hi = min_number(self.maximum.as_ref(), other.maximum.as_ref());
                if let (Some(lo), Some(hi)) = (lo, hi)
                    && cmp_numbers(lo, hi) == Ordering::Greater
                {
                    return Err(format!(
                        "together they need a number of at least {lo} and at most {hi}"
                    ));
                }
                Ok(())
            }
            ArgType::Array | ArgType::Any => Ok(()),
        }
    }
}

fn compile_pattern(source: &str, at: &str) -> Result<Pattern, String> {
    let build = |text: &str| {
        RegexBuilder::new(text)
            .size_limit(PATTERN_SIZE_LIMIT)
            .dfa_size_limit(PATTERN_SIZE_LIMIT)
            .build()
    };
    // Compiling the pattern on its own first guarantees it is balanced, so wrapping it in
    // `^(?:...)$` cannot change its meaning (e.g. "a)|(b" would otherwise escape the anchors).
    let compiled = build(source).and_then(|_| build(&format!("^(?:{source})$")));
    match compiled {
        Ok(regex) => Ok(Pattern {
            source: source.into(),
            regex,
        }),
        Err(error) => Err(format!(
            "{at}.pattern is not a usable regex: {}; fix the pattern (regex crate syntax, compiled size at most {PATTERN_SIZE_LIMIT} bytes)",
            error
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .trim_end_matches('.')
        )),
    }
}

/// Exact comparison of two JSON numbers (integers beyond 2^53 included). serde_json numbers are
/// always finite, so there is no NaN to order.
pub(crate) fn cmp_numbers(a: &Number, b: &Number) -> Ordering {
    enum N {
        Int(i128),
        Float(f64),
    }
    fn of(n: &Number) -> N {
        if let Some(u) = n.as_u64() {
            N::Int(i128::from(u))
        } else if let Some(i) = n.as_i64() {
            N::Int(i128::from(i))
        } else {
            N::Float(n.as_f64().unwrap_or(0.0))
        }
    }
    fn int_vs_float(i: i128, f: f64) -> Ordering {
        // |i| < 2^65 and f is finite; 2^100 is exactly representable in f64.
        const BIG: f64 = 1_267_650_600_228_229_401_496_703_205_376.0; // 2^100
        if f >= BIG {
            return Ordering::Less;
        }
        if f <= -BIG {
            return Ordering::Greater;
        }
        let whole = f.trunc();
        // In range by the checks above, so the cast is exact.
        #[allow(clippy::cast_possible_truncation)]
        let whole_int = whole as i128;
        match i.cmp(&whole_int) {
            Ordering::Equal => 0.0f64.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal),
            other => other,
        }
    }
    match (of(a), of(b)) {
        (N::Int(x), N::Int(y)) => x.cmp(&y),
        (N::Int(x), N::Float(y)) => int_vs_float(x, y),
        (N::Float(x), N::Int(y)) => int_vs_float(y, x).reverse(),
        (N::Float(x), N::Float(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
    }
}

fn max_number<'a>(a: Option<&'a Number>, b: Option<&'a Number>) -> Option<&'a Number> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if cmp_numbers(x, y) == Ordering::Less {
            y
        } else {
            x
        }),
        (x, y) => x.or(y),
    }
}

fn min_number<'a>(a: Option<&'a Number>, b: Option<&'a Number>) -> Option<&'a Number> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if cmp_numbers(x, y) == Ordering::Greater {
            y
        } else {
            x
        }),
        (x, y) => x.or(y),
    }
}

/// Which kind of argument rule a call broke.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// The ruled field is absent from the arguments (rule id `.type`).
    Missing,
    /// The ruled field is present but not a string.
    NotString,
    /// The string is shorter than `min_len`.
    TooShort {
        /// The rule's minimum.
        min_len: u64,
        /// The length received.
        actual: u64,
    },
    /// The string is longer than `max_len`.
    TooLong {
        /// The rule's maximum.
        max_len: u64,
        /// The length received.
        actual: u64,
    },
    /// The field must be a number and is not.
    NotNumber,
    /// The field must be an array and is not.
    NotArray,
    /// The string does not match the whole-string `pattern`.
    PatternMismatch {
        /// The pattern as written in the policy.
        pattern: Arc<str>,
    },
    /// The value is not one of the `enum` values.
    NotInEnum {
        /// The allowed values as written in the policy.
        allowed: Arc<[Value]>,
    },
    /// The number is below `minimum`.
    BelowMinimum {
        /// The rule's minimum.
        minimum: Number,
        /// The number received (never put in messages).
        actual: Number,
    },
    /// The number is above `maximum`.
    AboveMaximum {
        /// The rule's maximum.
        maximum: Number,
        /// The number received (never put in messages).
        actual: Number,
    },
    /// The array has more than `max_items` elements.
    TooManyItems {
        /// The rule's maximum.
        max_items: u64,
        /// The number of elements received.
        actual: u64,
    },
    /// The path climbs above `/` or lies outside every root once normalised.
    PathEscapes {
        /// The allowed roots.
        roots: Arc<[String]>,
    },
    /// The path is empty or contains a NUL byte.
    BadPath {
        /// The allowed roots.
        roots: Arc<[String]>,
    },
}

impl Violation {
    /// The last segment of the rule id: `type`, `min_len`, `max_len`, `pattern`, `enum`,
    /// `minimum`, `maximum`, `max_items` or `path`.
    pub fn key(&self) -> &'static str {
        match self {
            Violation::Missing
            | Violation::NotString
            | Violation::NotNumber
            | Violation::NotArray => "type",
            Violation::TooShort { .. } => "min_len",
            Violation::TooLong { .. } => "max_len",
            Violation::PatternMismatch { .. } => "pattern",
            Violation::NotInEnum { .. } => "enum",
            Violation::BelowMinimum { .. } => "minimum",
            Violation::AboveMaximum { .. } => "maximum",
            Violation::TooManyItems { .. } => "max_items",
            Violation::PathEscapes { .. } | Violation::BadPath { .. } => "path",
        }
    }
}

/// An allowed tool called with arguments that break one of its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArgViolation {
    /// The tool.
    pub tool: String,
    /// The argument that broke the rule.
    pub field: String,
    /// How it broke it.
    pub violation: Violation,
    /// The principal whose section holds the broken rule; `None` for a top-level rule.
    pub principal: Option<String>,
    /// The JSON type the rule needs.
    pub expected: ArgType,
}

impl ArgViolation {
    pub(crate) fn new(
        tool: &str,
        field: &str,
        violation: Violation,
        principal: Option<&str>,
        expected: ArgType,
    ) -> Self {
        ArgViolation {
            tool: tool.to_owned(),
            field: field.to_owned(),
            violation,
            principal: principal.map(str::to_owned),
            expected,
        }
    }

    /// The rule's path in the policy file, e.g. `arg_rules.write_note.request_id.min_len` or
    /// `principals.alice.arg_rules.write_note.text.pattern`.
    pub fn rule(&self) -> String {
        let key = self.violation.key();
        match &self.principal {
            None => format!("arg_rules.{}.{}.{}", self.tool, self.field, key),
            Some(principal) => format!(
                "principals.{principal}.arg_rules.{}.{}.{}",
                self.tool, self.field, key
            ),
        }
    }

    fn type_phrase(&self) -> &'static str {
        match self.expected {
            ArgType::Any => "one of the values the policy allows",
            kind => kind.with_article(),
        }
    }

    /// What the caller should do instead, without the argument's value.
    pub fn fix(&self) -> String {
        let field = &self.field;
        match &self.violation {
            Violation::Missing
            | Violation::NotString
            | Violation::NotNumber
            | Violation::NotArray => {
                format!("pass `{field}` as {}", self.type_phrase())
            }
            Violation::TooShort { min_len, .. } => {
                format!("pass a longer `{field}` (at least {min_len} characters)")
            }
            Violation::TooLong { max_len, .. } => {
                format!("shorten `{field}` to at most {max_len} characters")
            }
            Violation::PatternMismatch { pattern } => {
                format!("pass a `{field}` that matches the whole pattern /{pattern}/")
            }
            Violation::NotInEnum { allowed } => {
                format!(
                    "pass one of these values as `{field}`: {}",
                    list_values(allowed)
                )
            }
            Violation::BelowMinimum { minimum, .. } => {
                format!("pass a `{field}` of at least {minimum}")
            }
            Violation::AboveMaximum { maximum, .. } => {
                format!("pass a `{field}` of at most {maximum}")
            }
            Violation::TooManyItems { max_items, .. } => {
                format!("pass at most {max_items} items in `{field}`, splitting the call if needed")
            }
            Violation::PathEscapes { roots } => format!(
                "pass a path inside {} (relative paths resolve against {}; `..` may not leave the root)",
                roots.join(" or "),
                roots.first().map(String::as_str).unwrap_or("/")
            ),
            Violation::BadPath { roots } => format!(
                "pass a non-empty path without NUL bytes inside {}",
                roots.join(" or ")
            ),
        }
    }

    /// A message for the caller: starts with `Error:`, names the field, the rule and the fix.
    /// It never echoes the argument's value (lengths, counts and the rule's bounds only).
    pub fn message(&self) -> String {
        let Self { tool, field, .. } = self;
        let rule = self.rule();
        let fix = self.fix();
        match &self.violation {
            Violation::Missing => format!(
                "Error: argument `{field}` of `{tool}` is required by policy rule {rule}; {fix}"
            ),
            Violation::NotString | Violation::NotNumber | Violation::NotArray => format!(
                "Error: argument `{field}` of `{tool}` must be {} (policy rule {rule}); {fix}",
                self.type_phrase()
            ),
            Violation::TooShort { min_len, actual } => format!(
                "Error: argument `{field}` of `{tool}` has {actual} characters but policy rule {rule} requires at least {min_len}; pass a longer `{field}`"
            ),
            Violation::TooLong { max_len, actual } => format!(
                "Error: argument `{field}` of `{tool}` has {actual} characters but policy rule {rule} allows at most {max_len}; shorten `{field}`"
            ),
            Violation::PatternMismatch { .. } => format!(
                "Error: argument `{field}` of `{tool}` does not match the pattern of policy rule {rule}; {fix}"
            ),
            Violation::NotInEnum { .. } => format!(
                "Error: argument `{field}` of `{tool}` is not a value allowed by policy rule {rule}; {fix}"
            ),
            Violation::BelowMinimum { minimum, .. } => format!(
                "Error: argument `{field}` of `{tool}` is below the minimum {minimum} of policy rule {rule}; {fix}"
            ),
            Violation::AboveMaximum { maximum, .. } => format!(
                "Error: argument `{field}` of `{tool}` is above the maximum {maximum} of policy rule {rule}; {fix}"
            ),
            Violation::TooManyItems { max_items, actual } => format!(
                "Error: argument `{field}` of `{tool}` has {actual} items but policy rule {rule} allows at most {max_items}; {fix}"
            ),
            Violation::PathEscapes { .. } => format!(
                "Error: argument `{field}` of `{tool}` names a path outside the directories allowed by policy rule {rule}; {fix}"
            ),
            Violation::BadPath { .. } => format!(
                "Error: argument `{field}` of `{tool}` is not a usable path (empty or containing a NUL byte) under policy rule {rule}; {fix}"
            ),
        }
    }

    /// The refusal as structured data: `error` (`"argument_rejected"`), `tool`, `field`, `rule`
    /// (the rule id), `constraint` (the rule's bound(s)), `fix`, and `principal` and `received`
    /// (a length or item count) when they apply. Never the argument's value.
    pub fn details(&self) -> Value {
        let constraint = match &self.violation {
            Violation::Missing => {
                serde_json::json!({ "required": true, "type": self.expected.name() })
            }
            Violation::NotString | Violation::NotNumber | Violation::NotArray => {
                serde_json::json!({ "type": self.expected.name() })
            }
            Violation::TooShort { min_len, .. } => serde_json::json!({ "min_len": min_len }),
            Violation::TooLong { max_len, .. } => serde_json::json!({ "max_len": max_len }),
            Violation::PatternMismatch { pattern } => {
                serde_json::json!({ "pattern": &**pattern })
            }
            Violation::NotInEnum { allowed } => serde_json::json!({ "enum": &**allowed }),
            Violation::BelowMinimum { minimum, .. } => serde_json::json!({ "minimum": minimum }),
            Violation::AboveMaximum { maximum, .. } => serde_json::json!({ "maximum": maximum }),
            Violation::TooManyItems { max_items, .. } => {
                serde_json::json!({ "max_items": max_items })
            }
            Violation::PathEscapes { roots } | Violation::BadPath { roots } => {
                serde_json::json!({ "roots": &**roots })
            }
        };
        let mut details = serde_json::json!({
            "error": "argument_rejected",
            "tool": self.tool,
            "field": self.field,
            "rule": self.rule(),
            "constraint": constraint,
            "fix": self.fix(),
        });
        if let Value::Object(map) = &mut details {
            if let Some(principal) = &self.principal {
                map.insert("principal".to_owned(), Value::from(principal.as_str()));
            }
            let received = match self.violation {
                Violation::TooShort { actual, .. } | Violation::TooLong { actual, .. } => {
                    Some(serde_json::json!({ "length": actual }))
                }
                Violation::TooManyItems { actual, .. } => {
                    Some(serde_json::json!({ "items": actual }))
                }
                _ => None,
            };
            if let Some(received) = received {
                map.insert("received".to_owned(), received);
            }
        }
        details
    }
}

impl fmt::Display for ArgViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

fn list_values(values: &[Value]) -> String {
    let mut shown: Vec<String> = values
        .iter()
        .take(ENUM_VALUES_IN_MESSAGES)
        .map(|v| String::from_utf8_lossy(&toolgate_canon::canonical_value(v)).into_owned())
        .collect();
    if values.len() > ENUM_VALUES_IN_MESSAGES {
        shown.push(format!(
            "… ({} more)",
            values.len() - ENUM_VALUES_IN_MESSAGES
        ));
    }
    shown.join(", ")
}
