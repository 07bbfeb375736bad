//! Property: for every principal and tool of a random policy, the tool is shown (`visible_for`)
//! exactly when some call to it can be allowed.
//!
//! Random policies mix allow/deny lists, principal sections and argument rules of every kind
//! (patterns from a small fixed set whose matching strings the test knows). A model of the rules,
//! written independently here, predicts whether the loader must accept the policy (every rule, and
//! every top-level/principal pair of rules on one field, satisfiable) and builds a witness
//! argument object for every shown tool; `decide_for` must allow it. Hidden tools must be refused
//! as a whole whatever the arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolgate_policy::{Decision, Policy};

const TOOLS: [&str; 4] = ["a", "b", "c", "d"];
const PRINCIPALS: [&str; 3] = ["p1", "p2", "p3"];
const FIELDS: [&str; 3] = ["f", "g", "h"];
/// Patterns with hand-written predicates (`pattern_matches`).
const PATTERNS: [&str; 3] = ["[a-z]*", "x[0-9]*", "(ab)+|zz"];
const ROOTS: [&[&str]; 4] = [&["/r1"], &["/r1", "/r2/s"], &["/"], &["/r2"]];

fn pattern_matches(index: usize, s: &str) -> bool {
    match index {
        0 => s.chars().all(|c| c.is_ascii_lowercase()),
        1 => s.starts_with('x') && s[1..].chars().all(|c| c.is_ascii_digit()),
        _ => {
            s == "zz"
                || (!s.is_empty()
                    && s.len().is_multiple_of(2)
                    && s.as_bytes().chunks(2).all(|c| c == b"ab"))
        }
    }
}

/// The components of `s` normalised lexically against `base`; `None` for an empty value or a
/// `..` above the root.
fn normalise<'a>(s: &'a str, base: &'a str) -> Option<Vec<&'a str>> {
    if s.is_empty() {
        return None;
    }
    let mut parts: Vec<&str> = if s.starts_with('/') {
        Vec::new()
    } else {
        base.split('/').filter(|p| !p.is_empty()).collect()
    };
    for part in s.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(parts)
}

fn path_ok(s: &str, roots: &[&str], base: &str) -> bool {
    normalise(s, base).is_some_and(|parts| {
        roots.iter().any(|root| {
            let root: Vec<&str> = root.split('/').filter(|p| !p.is_empty()).collect();
            parts.starts_with(&root)
        })
    })
}

/// The shortest relative spelling of `target` from `base` ("." for the base itself).
fn relative(base: &str, target: &str) -> String {
    let b: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    let t: Vec<&str> = target.split('/').filter(|p| !p.is_empty()).collect();
    let common = b.iter().zip(&t).take_while(|(x, y)| x == y).count();
    let mut parts = vec![".."; b.len() - common];
    parts.extend(&t[common..]);
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// Path-shaped witness candidates: every root, absolute and relative to every possible base,
/// then padded to every length up to 9 more characters.
fn path_candidates() -> Vec<Value> {
    let roots: Vec<&str> = ROOTS.iter().flat_map(|r| r.iter().copied()).collect();
    let mut out = Vec::new();
    for target in &roots {
        let mut forms = vec![(*target).to_owned()];
        forms.extend(ROOTS.iter().map(|r| relative(r[0], target)));
        for form in forms {
            out.push(json!(form));
            out.push(json!(format!("{form}/")));
            for k in 1..9 {
                out.push(json!(format!("{form}/{}", "a".repeat(k))));
            }
        }
    }
    out
}

/// A half-integer k/2 as JSON, integral values as integers.
fn half(k: i8) -> Value {
    if k % 2 == 0 {
        json!(i64::from(k / 2))
    } else {
        json!(f64::from(k) / 2.0)
    }
}

fn pool() -> Vec<Value> {
    let mut values: Vec<Value> = [
        "", "a", "ab", "abc", "x", "x1", "x12", "zz", "abab", "sub/f", "../up", "/abs",
    ]
    .iter()
    .map(|s| json!(s))
    .collect();
    values.extend([-6, -1, 0, 2, 5, 8].map(half));
    values.extend([json!([]), json!([1]), json!([1, 2]), json!([1, 2, 3])]);
    values.extend([Value::Null, json!(true), json!({"k": 1})]);
    values
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Num,
    Arr,
    Any,
}

#[derive(Debug, Clone, Default)]
struct Rule {
    min_len: Option<u64>,
    max_len: Option<u64>,
    pattern: Option<usize>,
    path: Option<usize>,
    /// The index into ROOTS whose first root relative values resolve against (the top-level
    /// path rule's on the same field, else the rule's own).
    base: Option<usize>,
    minimum: Option<i8>,
    maximum: Option<i8>,
    max_items: Option<u64>,
    one_of: Option<Vec<Value>>,
    optional: bool,
}

impl Rule {
    /// The JSON type the rule needs, derived from its keys as the policy format defines it.
    fn kind(&self) -> Kind {
        if self.min_len.is_some()
            || self.max_len.is_some()
            || self.pattern.is_some()
            || self.path.is_some()
        {
            Kind::Str
        } else if self.minimum.is_some() || self.maximum.is_some() {
            Kind::Num
        } else if self.max_items.is_some() {
            Kind::Arr
        } else if self.one_of.is_some() {
            Kind::Any
        } else {
            Kind::Str
        }
    }

    fn passes_without_enum(&self, v: &Value) -> bool {
        match self.kind() {
            Kind::Str => {
                let Value::String(s) = v else { return false };
                let n = s.chars().count() as u64;
                self.min_len.is_none_or(|m| n >= m)
                    && self.max_len.is_none_or(|m| n <= m)
                    && self.pattern.is_none_or(|p| pattern_matches(p, s))
                    && self
                        .path
                        .is_none_or(|r| path_ok(s, ROOTS[r], ROOTS[self.base.unwrap_or(r)][0]))
            }
            Kind::Num => {
                let Some(x) = v.as_f64() else { return false };
                self.minimum.is_none_or(|m| x >= f64::from(m) / 2.0)
                    && self.maximum.is_none_or(|m| x <= f64::from(m) / 2.0)
            }
            Kind::Arr => v
                .as_array()
                .is_some_and(|a| self.max_items.is_none_or(|m| a.len() as u64 <= m)),
            Kind::Any => true,
        }
    }

    fn passes(&self, v: &Value) -> bool {
        self.passes_without_enum(v) && self.one_of.as_ref().is_none_or(|e| e.contains(v))
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(x) = self.min_len {
            m.insert("min_len".into(), json!(x));
        }
        if let Some(x) = self.max_len {
            m.insert("max_len".into(), json!(x));
        }
        if let Some(p) = self.pattern {
            m.insert("pattern".into(), json!(PATTERNS[p]));
        }
        if let Some(r) = self.path {
            m.insert("path".into(), json!({ "roots": ROOTS[r] }));
        }
        if let Some(x) = self.minimum {
            m.insert("minimum".into(), half(x));
        }
        if let Some(x) = self.maximum {
            m.insert("maximum".into(), half(x));
        }
        if let Some(x) = self.max_items {
            m.insert("max_items".into(), json!(x));
        }
        if let Some(e) = &self.one_of {
            m.insert("enum".into(), Value::Array(e.clone()));
        }
        if self.optional {
            m.insert("optional".into(), json!(true));
        }
        Value::Object(m)
    }
}

/// A value passing every rule in `rules`, if there is one. Complete for the rules this test
/// generates: enums are searched exhaustively, bounds are taken at their ends, and the string
/// candidates cover every length the patterns can match near the lower bound.
fn witness(rules: &[&Rule]) -> Option<Value> {
    let ok = |v: &Value| rules.iter().all(|r| r.passes(v));
    if let Some(values) = rules.iter().find_map(|r| r.one_of.as_ref()) {
        return values.iter().find(|v| ok(v)).cloned();
    }
    let mut candidates = pool();
    let lo = rules.iter().filter_map(|r| r.min_len).max().unwrap_or(0);
    for n in lo..lo + 7 {
        let n = n as usize;
        candidates.push(json!("a".repeat(n)));
        if n >= 1 {
            candidates.push(json!(format!("x{}", "0".repeat(n - 1))));
        }
        if n >= 2 && n.is_multiple_of(2) {
            candidates.push(json!("ab".repeat(n / 2)));
        }
    }
    let min = rules.iter().filter_map(|r| r.minimum).max();
    let max = rules.iter().filter_map(|r| r.maximum).min();
    candidates.extend(min.into_iter().chain(max).map(half));
    if rules.iter().any(|r| r.path.is_some()) {
        candidates.extend(path_candidates());
    }
    candidates.into_iter().find(|v| ok(v))
}

/// Whether the loader can tell that no value passes both rules (it cannot see into patterns
/// unless an enum lists the candidates).
fn loader_detects_conflict(a: &Rule, b: &Rule) -> bool {
    if a.one_of.is_some() || b.one_of.is_some() {
        return true;
    }
    if a.kind() != b.kind() {
        return true;
    }
    match a.kind() {
        Kind::Str => {
            let lo = a.min_len.max(b.min_len);
            let hi = match (a.max_len, b.max_len) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            // Path rules: the loader computes the shortest admitted path exactly.
            let paths_possible = a.path.is_none() && b.path.is_none() || {
                let hi_ok = |v: &Value| {
                    hi.is_none_or(|h| v.as_str().is_some_and(|s| s.chars().count() as u64 <= h))
                };
                path_candidates().iter().any(|v| {
                    let with = |r: &Rule| {
                        r.path.is_none_or(|p| {
                            path_ok(
                                v.as_str().unwrap_or(""),
                                ROOTS[p],
                                ROOTS[r.base.unwrap_or(p)][0],
                            )
                        })
                    };
                    with(a) && with(b) && hi_ok(v)
                })
            };
            matches!((lo, hi), (Some(l), Some(h)) if l > h) || !paths_possible
        }
        Kind::Num => {
            matches!((a.minimum.max(b.minimum), [a.maximum, b.maximum].into_iter().flatten().min()), (Some(l), Some(h)) if l > h)
        }
        Kind::Arr | Kind::Any => false,
    }
}

type Rules = BTreeMap<usize, BTreeMap<usize, Rule>>;

#[derive(Debug, Clone)]
struct Section {
    allow: u8,
    deny: u8,
    rules: Rules,
}

#[derive(Debug, Clone)]
struct Model {
    allow: u8,
    deny: u8,
    rules: Rules,
    principals: BTreeMap<usize, Section>,
}

fn has(mask: u8, tool: usize) -> bool {
    mask & (1 << tool) != 0
}

impl Model {
    fn allowed(&self, principal: Option<usize>, tool: usize) -> bool {
        let section = principal.and_then(|p| self.principals.get(&p));
        let allow = has(self.allow, tool) || section.is_some_and(|s| has(s.allow, tool));
        let deny = has(self.deny, tool) || section.is_some_and(|s| has(s.deny, tool));
        allow && !deny
    }

    fn allowed_for_somebody(&self, tool: usize) -> bool {
        self.allowed(None, tool) || self.principals.keys().any(|p| self.allowed(Some(*p), tool))
    }

    /// Drops entries the loader rejects for reasons this test does not study (rules on tools
    /// nobody may call), and patterns from rule pairs whose conflict only the patterns cause.
    fn repair(&mut self) {
        for section in self.principals.values_mut() {
            for (t, fields) in section.rules.iter_mut() {
                for (f, own) in fields.iter_mut() {
                    let top = self
                        .rules
                        .get(t)
                        .and_then(|x| x.get(f))
                        .and_then(|r| r.path);
                    own.base = own.path.and(top);
                    // Enum values were chosen against the rule's own base; keep those that pass
                    // with the inherited one.
                    if let Some(mut values) = own.one_of.take() {
                        values.retain(|v| own.passes_without_enum(v));
                        own.one_of = (!values.is_empty()).then_some(values);
                    }
                }
            }
        }
        let somebody: Vec<bool> = (0..TOOLS.len())
            .map(|t| self.allowed_for_somebody(t))
            .collect();
        self.rules.retain(|t, _| somebody[*t]);
        let keys: Vec<usize> = self.principals.keys().copied().collect();
        for p in keys {
            let allowed: Vec<bool> = (0..TOOLS.len()).map(|t| self.allowed(Some(p), t)).collect();
            if let Some(s) = self.principals.get_mut(&p) {
                s.rules.retain(|t, _| allowed[*t]);
            }
        }
        loop {
            let mut changed = false;
            for section in self.principals.values_mut() {
                for (t, fields) in section.rules.iter_mut() {
                    for (f, own) in fields.iter_mut() {
                        let Some(top) = self.rules.get_mut(t).and_then(|x| x.get_mut(f)) else {
                            continue;
                        };
                        if witness(&[top, own]).is_none() && !loader_detects_conflict(top, own) {
                            changed |= top.pattern.take().is_some() | own.pattern.take().is_some();
                        }
                    }
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Whether the loader must accept the policy: every rule satisfiable on its own and together
    /// with the top-level rule on the same field.
    fn satisfiable(&self) -> bool {
        let single = self
            .rules
            .values()
            .chain(self.principals.values().flat_map(|s| s.rules.values()))
            .flat_map(|fields| fields.values())
            .all(|r| witness(&[r]).is_some());
        let pairs = self.principals.values().all(|s| {
            s.rules.iter().all(|(t, fields)| {
                fields
                    .iter()
                    .all(|(f, own)| match self.rules.get(t).and_then(|x| x.get(f)) {
                        Some(top) => witness(&[top, own]).is_some(),
                        None => true,
                    })
            })
        });
        single && pairs
    }

    fn to_json(&self) -> Value {
        let names = |mask: u8| -> Vec<&str> {
            (0..TOOLS.len())
                .filter(|t| has(mask, *t))
                .map(|t| TOOLS[t])
                .collect()
        };
        let rules = |rules: &Rules| -> Value {
            Value::Object(
                rules
                    .iter()
                    .map(|(t, fields)| {
                        let fields: Map<String, Value> = fields
                            .iter()
                            .map(|(f, r)| (FIELDS[*f].to_owned(), r.to_json()))
                            .collect();
                        (TOOLS[*t].to_owned(), Value::Object(fields))
                    })
                    .collect(),
            )
        };
        let principals: Map<String, Value> = self
            .principals
            .iter()
            .map(|(p, s)| {
                (PRINCIPALS[*p].to_owned(), json!({"allow": names(s.allow), "deny": names(s.deny), "arg_rules": rules(&s.rules)}))
            })
            .collect();
        json!({
            "version": 1,
            "allow": names(self.allow),
            "deny": names(self.deny),
            "arg_rules": rules(&self.rules),
            "principals": principals,
        })
    }

    /// The rules that apply to `tool` for `principal`, per field: top-level first.
    fn effective(
        &self,
        principal: Option<usize>,
        tool: usize,
    ) -> BTreeMap<usize, Vec<(bool, &Rule)>> {
        let mut out: BTreeMap<usize, Vec<(bool, &Rule)>> = BTreeMap::new();
        for (f, r) in self.rules.get(&tool).into_iter().flatten() {
            out.entry(*f).or_default().push((false, r));
        }
        let own = principal
            .and_then(|p| self.principals.get(&p))
            .and_then(|s| s.rules.get(&tool));
        for (f, r) in own.into_iter().flatten() {
            out.entry(*f).or_default().push((true, r));
        }
        out
    }
}

#[derive(Debug, Clone)]
struct RuleSeed {
    kind: u8,
    a: u64,
    b: u64,
    has_min: bool,
    has_max: bool,
    pattern: usize,
    path: usize,
    n1: i8,
    n2: i8,
    max_items: u64,
    use_enum: bool,
    enum_mask: u32,
    optional: bool,
}

fn rule_seed() -> impl Strategy<Value = RuleSeed> {
    (
        (
            0u8..4,
            0u64..5,
            0u64..5,
            any::<bool>(),
            any::<bool>(),
            0usize..6,
            0usize..6,
        ),
        (
            -8i8..=8,
            -8i8..=8,
            0u64..4,
            prop::bool::weighted(0.3),
            any::<u32>(),
            prop::bool::weighted(0.3),
        ),
    )
        .prop_map(
            |(
                (kind, a, b, has_min, has_max, pattern, path),
                (n1, n2, max_items, use_enum, enum_mask, optional),
            )| RuleSeed {
                kind,
                a,
                b,
                has_min,
                has_max,
                pattern,
                path,
                n1,
                n2,
                max_items,
                use_enum,
                enum_mask,
                optional,
            },
        )
}

fn build_rule(seed: &RuleSeed) -> Rule {
    let mut rule = Rule {
        optional: seed.optional,
        ..Rule::default()
    };
    let pool = pool();
    let subset = |mask: u32| -> Vec<Value> {
        pool.iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, v)| v.clone())
            .collect()
    };
    match seed.kind {
        0 => {
            rule.min_len = seed.has_min.then_some(seed.a.min(seed.b));
            rule.max_len = seed.has_max.then_some(seed.a.max(seed.b));
            rule.path = (seed.path < ROOTS.len()).then_some(seed.path);
            if seed.pattern < PATTERNS.len() {
                rule.pattern = Some(seed.pattern);
                // Only patterns the rule's own lengths leave satisfiable: the loader cannot tell.
                if witness(&[&rule]).is_none() {
                    rule.pattern = None;
                }
            }
        }
        1 => {
            rule.minimum = seed.has_min.then_some(seed.n1.min(seed.n2));
            rule.maximum = seed.has_max.then_some(seed.n1.max(seed.n2));
        }
        2 => rule.max_items = Some(seed.max_items),
        _ => {
            let mut values = subset(seed.enum_mask);
            if values.is_empty() {
                values.push(pool[seed.enum_mask as usize % pool.len()].clone());
            }
            rule.one_of = Some(values);
            return rule;
        }
    }
    if seed.use_enum {
        let values: Vec<Value> = subset(seed.enum_mask)
            .into_iter()
            .filter(|v| rule.passes_without_enum(v))
            .collect();
        if !values.is_empty() {
            rule.one_of = Some(values);
        }
    }
    rule
}

fn rules_strategy() -> impl Strategy<Value = BTreeMap<usize, BTreeMap<usize, RuleSeed>>> {
    prop::collection::btree_map(
        0..TOOLS.len(),
        prop::collection::btree_map(0..FIELDS.len(), rule_seed(), 1..4),
        0..4,
    )
}

fn build_rules(seeds: &BTreeMap<usize, BTreeMap<usize, RuleSeed>>) -> Rules {
    seeds
        .iter()
        .map(|(t, fields)| {
            (
                *t,
                fields.iter().map(|(f, s)| (*f, build_rule(s))).collect(),
            )
        })
        .collect()
}

fn model_strategy() -> impl Strategy<Value = Model> {
    let section = (any::<u8>(), any::<u8>(), any::<u8>(), rules_strategy());
    (
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        rules_strategy(),
        prop::collection::btree_map(0..PRINCIPALS.len(), section, 0..4),
    )
        .prop_map(|(allow, deny1, deny2, rules, principals)| {
            let mask = (1u8 << TOOLS.len()) - 1;
            Model {
                // Denser allow lists (each tool with probability 3/4) leave more rules in play.
                allow: (allow as u8 | (allow >> 8) as u8) & mask,
                // Sparser deny lists leave more tools to study.
                deny: deny1 & deny2 & mask,
                rules: build_rules(&rules),
                principals: principals
                    .into_iter()
                    .map(|(p, (allow, d1, d2, rules))| {
                        (
                            p,
                            Section {
                                allow: allow & mask,
                                deny: d1 & d2 & mask,
                                rules: build_rules(&rules),
                            },
                        )
                    })
                    .collect(),
            }
        })
}

fn random_args() -> impl Strategy<Value = Map<String, Value>> {
    let pool = pool();
    prop::collection::btree_map(
        prop::sample::select(FIELDS.to_vec()),
        prop::sample::select(pool),
        0..4,
    )
    .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it.
    #[test]
    fn shown_iff_callable(mut model in model_strategy(), noise in random_args(), omit in any::<u8>()) {
        model.repair();
        let text = model.to_json().to_string();
        let loaded = Policy::from_json(&text);
        if !model.satisfiable() {
            let e = loaded.expect_err("the model finds a rule no value passes").to_string();
            prop_assert!(
                e.contains("no value could pass") || e.contains("contradicts"),
                "{e} for {text}"
            );
            return Ok(());
        }
        let policy = loaded.map_err(|e| TestCaseError::fail(format!("{e} for {text}")))?;

        let who: Vec<(Option<usize>, &str)> = PRINCIPALS
            .iter()
            .enumerate()
            .map(|(i, name)| (Some(i), *name))
            .chain([(None, "stranger")])
            .collect();
        for (index, name) in &who {
            // A principal without a section is the top-level caller.
            let index = index.filter(|i| model.principals.contains_key(i));
            for tool in 0..=TOOLS.len() {
                let tool_name = TOOLS.get(tool).copied().unwrap_or("e");
                let visible = policy.visible_for(name, tool_name);
                let expected = tool < TOOLS.len() && model.allowed(index, tool);
                prop_assert_eq!(visible, expected, "{} {} in {}", name, tool_name, text);
                if index.is_none() {
                    prop_assert_eq!(policy.visible(tool_name), visible);
                }
                let decide = |args: &Map<String, Value>| {
                    let d = policy.decide_for(name, tool_name, Some(args));
                    if index.is_none() {
                        assert_eq!(d, policy.decide(tool_name, Some(args)));
                    }
                    d
                };
                if !visible {
                    let d = decide(&noise);
                    prop_assert!(matches!(d, Decision::DenyTool(_)), "{:?} for {} {} in {}", d, name, tool_name, text);
                    continue;
                }
                let effective = model.effective(index, tool);
                let mut args = Map::new();
                for (bit, (field, rules)) in effective.iter().enumerate() {
                    let all_optional = rules.iter().all(|(_, r)| r.optional);
                    if all_optional && omit & (1 << bit) != 0 {
                        continue;
                    }
                    let only: Vec<&Rule> = rules.iter().map(|(_, r)| *r).collect();
                    let value = witness(&only).ok_or_else(|| TestCaseError::fail(format!("no witness for {field} in {text}")))?;
                    args.insert(FIELDS[*field].to_owned(), value);
                }
                let d = decide(&args);
                prop_assert_eq!(&d, &Decision::Allow, "{} {} {:?} in {}", name, tool_name, args, text);

                // Dropping a required field is refused by the first rule that requires it.
                for (field, rules) in &effective {
                    let Some((own, _)) = rules.iter().find(|(_, r)| !r.optional) else { continue };
                    let mut without = args.clone();
                    without.remove(FIELDS[*field]);
                    let expected_rule = if *own {
                        format!("principals.{name}.arg_rules.{tool_name}.{}.type", FIELDS[*field])
                    } else {
                        format!("arg_rules.{tool_name}.{}.type", FIELDS[*field])
                    };
                    // The other fields still pass, so the missing one decides (top level first).
                    let d = decide(&without);
                    prop_assert_eq!(d.rule(), expected_rule, "{:?} in {}", without, text);
                }
            }
        }
    }
}
