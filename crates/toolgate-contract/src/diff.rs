//! Classifies every difference between two server contracts as BREAKING, RISKY, SAFE or COSMETIC.
//!
//! Every rule has a stable id and a fixed verdict, listed once in [`RULES`] (and in
//! `docs/lockfile.md`). Schemas are compared keyword by keyword so that cheap semantic cases get a
//! precise verdict (a new optional argument is SAFE, a removed enum value is BREAKING); anything the
//! comparison does not understand falls back to a conservative rule, and a per-section safety net
//! guarantees that two contracts with different digests never produce an empty diff.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use crate::contract::{ServerContract, ToolContract, push_token};

/// How much a change matters to a caller, least severe first (so `Ord` ranks severity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Cannot change what a caller or model does (the same meaning written differently).
    Cosmetic,
    /// Existing callers keep working and the blast radius does not grow.
    Safe,
    /// Callers keep working, but the model's behaviour or the tool's governance may change: a
    /// human should review it.
    Risky,
    /// Existing callers or their expectations break, or the tool gained power.
    Breaking,
}

impl Verdict {
    /// `"COSMETIC"`, `"SAFE"`, `"RISKY"` or `"BREAKING"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Cosmetic => "COSMETIC",
            Verdict::Safe => "SAFE",
            Verdict::Risky => "RISKY",
            Verdict::Breaking => "BREAKING",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One classification rule: a stable id, its verdict and what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Stable id such as `"input.required_added"`.
    pub id: &'static str,
    /// The verdict every change of this rule gets.
    pub verdict: Verdict,
    /// One line for documentation and reviewers.
    pub summary: &'static str,
}

/// One classified difference.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// The tool concerned (`""` for a server-level change).
    pub tool: String,
    /// The verdict.
    pub verdict: Verdict,
    /// The stable rule id (see [`RULES`]).
    pub rule: &'static str,
    /// What changed, for a reviewer. Names schema locations and values, never call arguments.
    pub detail: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tool.is_empty() {
            write!(f, "{} {}: {}", self.verdict, self.rule, self.detail)
        } else {
            write!(
                f,
                "{} {} [{}]: {}",
                self.verdict, self.tool, self.rule, self.detail
            )
        }
    }
}

/// Declares each rule as a constant and `$list`, every rule in documentation order.
macro_rules! rules {
    ($(#[$doc:meta])* $list:ident { $($name:ident = $id:literal, $verdict:ident, $summary:literal;)* }) => {
        $(const $name: Rule = Rule { id: $id, verdict: Verdict::$verdict, summary: $summary };)*
        $(#[$doc])*
        pub const $list: &[Rule] = &[$($name),*];
    };
}
pub(crate) use rules;

rules! {
    /// Every rule [`diff`] can emit, in documentation order.
    RULES {
    SERVER_RENAMED = "server.renamed", Risky, "the server name changed (hosts and attestations pin it)";
    TOOL_REMOVED = "tool.removed", Breaking, "a tool was removed (a rename is a removal plus an addition)";
    TOOL_ADDED = "tool.added", Safe, "a tool was added";
    DESCRIPTION_CHANGED = "surface.description_changed", Risky, "the tool description changed: descriptions steer the model and are a known poisoning vector";
    SURFACE_CHANGED = "surface.changed", Risky, "fallback: any other surface difference";
    IN_PROPERTY_ADDED = "input.property_added", Safe, "a new optional argument";
    IN_PROPERTY_REMOVED = "input.property_removed", Breaking, "an argument was removed (callers that send it are rejected)";
    IN_REQUIRED_ADDED = "input.required_added", Breaking, "an argument became required (new or existing)";
    IN_REQUIRED_REMOVED = "input.required_removed", Safe, "a required argument became optional";
    IN_ENUM_VALUE_ADDED = "input.enum_value_added", Safe, "an input enum accepts a new value";
    IN_ENUM_VALUE_REMOVED = "input.enum_value_removed", Breaking, "an input enum no longer accepts a value";
    IN_ENUM_INTRODUCED = "input.enum_introduced", Breaking, "an input value is now restricted to an enum";
    IN_ENUM_DROPPED = "input.enum_dropped", Safe, "an input enum restriction was removed";
    IN_TYPE_WIDENED = "input.type_widened", Safe, "an input accepts more types (e.g. integer -> number, string -> [string, null])";
    IN_TYPE_NARROWED = "input.type_narrowed", Breaking, "an input accepts fewer types (e.g. number -> integer, [string, null] -> string)";
    IN_BOUND_TIGHTENED = "input.bound_tightened", Breaking, "an input bound (maxLength, maximum, minItems, ...) became stricter or appeared";
    IN_BOUND_LOOSENED = "input.bound_loosened", Safe, "an input bound became looser or disappeared";
    IN_ADDITIONAL_ALLOWED = "input.additional_properties_allowed", Safe, "an input object now accepts undeclared properties";
    IN_ADDITIONAL_FORBIDDEN = "input.additional_properties_forbidden", Breaking, "an input object now rejects undeclared properties";
    IN_DESCRIPTION_CHANGED = "input.description_changed", Risky, "a description inside the input schema changed (the model reads it)";
    IN_ANNOTATION_CHANGED = "input.annotation_changed", Risky, "title, examples, default, deprecated, readOnly, writeOnly or $comment changed in the input schema";
    IN_EQUIVALENT = "input.equivalent", Cosmetic, "the same input constraint written differently (order of required, type or enum entries)";
    IN_SCHEMA_CHANGED = "input.schema_changed", Breaking, "fallback: any other input schema difference (pattern, format, $ref, anyOf, incomparable types, ...)";
    OUT_SCHEMA_ADDED = "output.schema_added", Safe, "an output schema was declared";
    OUT_SCHEMA_REMOVED = "output.schema_removed", Breaking, "the output schema was withdrawn";
    OUT_PROPERTY_ADDED = "output.property_added", Safe, "the output has a new property";
    OUT_PROPERTY_REMOVED = "output.property_removed", Breaking, "an output property was removed";
    OUT_REQUIRED_ADDED = "output.required_added", Safe, "an output property is now always present";
    OUT_REQUIRED_REMOVED = "output.required_removed", Breaking, "an output property may now be absent";
    OUT_ENUM_VALUE_ADDED = "output.enum_value_added", Breaking, "an output enum has a new value (exhaustive consumers break)";
    OUT_ENUM_VALUE_REMOVED = "output.enum_value_removed", Safe, "an output enum lost a value";
    OUT_ENUM_INTRODUCED = "output.enum_introduced", Safe, "an output value is now restricted to an enum";
    OUT_ENUM_DROPPED = "output.enum_dropped", Breaking, "an output enum restriction was removed";
    OUT_TYPE_WIDENED = "output.type_widened", Breaking, "an output value may have more types";
    OUT_TYPE_NARROWED = "output.type_narrowed", Safe, "an output value has fewer types";
    OUT_BOUND_TIGHTENED = "output.bound_tightened", Safe, "an output bound became stricter or appeared";
    OUT_BOUND_LOOSENED = "output.bound_loosened", Risky, "an output bound became looser or disappeared (larger results)";
    OUT_ADDITIONAL_ALLOWED = "output.additional_properties_allowed", Risky, "an output object may now carry undeclared properties";
    OUT_ADDITIONAL_FORBIDDEN = "output.additional_properties_forbidden", Safe, "an output object no longer carries undeclared properties";
    OUT_DESCRIPTION_CHANGED = "output.description_changed", Risky, "a description inside the output schema changed (the model reads it)";
    OUT_ANNOTATION_CHANGED = "output.annotation_changed", Risky, "title, examples, default, deprecated, readOnly, writeOnly or $comment changed in the output schema";
    OUT_EQUIVALENT = "output.equivalent", Cosmetic, "the same output constraint written differently";
    OUT_SCHEMA_CHANGED = "output.schema_changed", Breaking, "fallback: any other output schema difference";
    READ_ONLY_CHANGED = "behavior.read_only_changed", Breaking, "readOnlyHint changed (hosts auto-approve read-only tools)";
    DESTRUCTIVE_CHANGED = "behavior.destructive_changed", Breaking, "destructiveHint changed (hosts ask for confirmation on it)";
    IDEMPOTENT_CHANGED = "behavior.idempotent_changed", Risky, "idempotentHint changed (retry behaviour)";
    OPEN_WORLD_CHANGED = "behavior.open_world_changed", Risky, "openWorldHint changed";
    GATE_STAGE_REMOVED = "behavior.gate_stage_removed", Breaking, "a gate stage (a guarantee such as confirmation, exactly-once, the kill switch or a result allow-list) no longer applies to the tool";
    GATE_STAGE_ADDED = "behavior.gate_stage_added", Safe, "a gate stage (a guarantee) now applies to the tool";
    GATE_STAGE_CHANGED = "behavior.gate_stage_changed", Risky, "a gate stage's parameters changed (e.g. the confirmation class, the exactly-once effect kind or key, a rate)";
    GATE_STAGES_CHANGED = "behavior.gate_stages_changed", Risky, "fallback: the gate stages (middleware chain) changed otherwise (their order)";
    POLICY_CHANGED = "behavior.policy_changed", Risky, "the policy rules for the tool changed";
    BEHAVIOR_CHANGED = "behavior.changed", Risky, "fallback: any other behavior difference";
    COLLECTION_UNBOUNDED = "economics.collection_unbounded", Risky, "an output collection lost its size bound";
    COLLECTION_BOUNDED = "economics.collection_bounded", Safe, "an output collection gained a size bound";
    INFLATION_RAISED = "economics.inflation_raised", Risky, "the inflation risk rose";
    INFLATION_LOWERED = "economics.inflation_lowered", Safe, "the inflation risk fell";
    FIELD_COUNT_CHANGED = "economics.field_count_changed", Cosmetic, "the schema field count changed (a derived metric; the schema change itself is classified separately)";
    ECONOMICS_CHANGED = "economics.changed", Risky, "fallback: any other token economics difference";
    ENTITLEMENT_GAINED = "entitlements.gained", Breaking, "the handler gained a capability family (a reviewer must see it)";
    ENTITLEMENT_LOST = "entitlements.lost", Safe, "the handler lost a capability family (smaller blast radius)";
    EVASION_GAINED = "entitlements.evasion_gained", Risky, "a new evasion signal: the scanner may be fooled, a human must look";
    EVASION_LOST = "entitlements.evasion_lost", Safe, "an evasion signal disappeared";
    UNRESOLVED_GAINED = "entitlements.unresolved_gained", Risky, "a new call the scanner could not follow: what it does is unknown, a human must look";
    UNRESOLVED_LOST = "entitlements.unresolved_lost", Safe, "a call the scanner could not follow is gone or now resolved";
    ENTITLEMENTS_CHANGED = "entitlements.changed", Risky, "fallback: any other entitlements difference";
}
}

rules! {
    /// The rules the lock check adds from the policy that governs the tools (beside [`RULES`],
    /// which compare contracts alone), in documentation order.
    POLICY_RULES {
    CEDAR_POLICY_BROKEN = "cedar.policy_broken", Breaking, "the tool's contract change leaves a Cedar policy naming what the tool no longer has, or misusing a type (a server with it refuses to start)";
    }
}

/// The change of `tool` that leaves a Cedar policy unfit (rule `cedar.policy_broken`): `detail`
/// names the policy, its file and line.
pub fn cedar_policy_broken(tool: &str, detail: String) -> Change {
    Change {
        tool: tool.to_owned(),
        verdict: CEDAR_POLICY_BROKEN.verdict,
        rule: CEDAR_POLICY_BROKEN.id,
        detail,
    }
}

/// Every classified difference from `old` to `new`, ordered by verdict (most severe first), tool,
/// rule and detail, so the output is deterministic.
pub fn diff(old: &ServerContract, new: &ServerContract) -> Vec<Change> {
    let mut out = Vec::new();
    if old.server_name != new.server_name {
        out.push(Change {
            tool: String::new(),
            verdict: SERVER_RENAMED.verdict,
            rule: SERVER_RENAMED.id,
            detail: format!("server name `{}` -> `{}`", old.server_name, new.server_name),
        });
    }
    for (name, old_tool) in &old.tools {
        match new.tools.get(name) {
            Some(new_tool) => diff_tool(name, old_tool, new_tool, &mut out),
            None => {
                // A rename cannot be told apart from a removal, but a tool with the same input
                // schema appearing at the same time is worth pointing out to the reviewer.
                let twin = new.tools.iter().find(|(other, tool)| {
                    !old.tools.contains_key(*other)
                        && tool.surface.input_schema_digest()
                            == old_tool.surface.input_schema_digest()
                });
                let detail = match twin {
                    Some((other, _)) => format!(
                        "tool removed; `{other}` with the same input schema was added (renamed?): callers of `{name}` break"
                    ),
                    None => "tool removed: callers of it break".to_owned(),
                };
                push(&mut out, name, &TOOL_REMOVED, detail);
            }
        }
    }
    for name in new.tools.keys() {
        if !old.tools.contains_key(name) {
            push(&mut out, name, &TOOL_ADDED, "tool added".to_owned());
        }
    }
    sort(&mut out);
    out
}

/// Orders `changes` by verdict (most severe first), tool, rule and detail (the order of every
/// list of changes).
pub fn sort(changes: &mut [Change]) {
    changes.sort_by(|a, b| {
        b.verdict
            .cmp(&a.verdict)
            .then_with(|| a.tool.cmp(&b.tool))
            .then_with(|| a.rule.cmp(b.rule))
            .then_with(|| a.detail.cmp(&b.detail))
    });
}

/// The most severe verdict among `changes`, or `None` when there are none.
pub fn worst(changes: &[Change]) -> Option<Verdict> {
    changes.iter().map(|c| c.verdict).max()
}

pub(crate) fn push(out: &mut Vec<Change>, tool: &str, rule: &Rule, detail: String) {
    out.push(Change {
        tool: tool.to_owned(),
        verdict: rule.verdict,
        rule: rule.id,
        detail,
    });
}

/// Collects the changes of one tool.
struct Sink<'a> {
    tool: &'a str,
    out: &'a mut Vec<Change>,
}

impl Sink<'_> {
    fn push(&mut self, rule: &Rule, detail: String) {
        push(self.out, self.tool, rule, detail);
    }

    /// How many changes were found so far.
    fn len(&self) -> usize {
        self.out.len()
    }
}

fn diff_tool(name: &str, old: &ToolContract, new: &ToolContract, out: &mut Vec<Change>) {
    // Sections hold schemas in their canonical-round-trip form (see `ToolContract::build`), so
    // structural equality is digest equality, without hashing anything here.
    if old == new {
        return;
    }
    let mut sink = Sink { tool: name, out };

    // Each section is compared on its own; if a section differs and its comparison found nothing
    // (a case the rules do not cover), the section's fallback rule fires, so that a digest
    // difference is never silently dropped.
    let before = sink.out.len();
    diff_surface(old, new, &mut sink);
    if old.surface != new.surface && sink.out.len() == before {
        sink.push(&SURFACE_CHANGED, "surface section changed".to_owned());
    }
    let before = sink.out.len();
    diff_behavior(old, new, &mut sink);
    if old.behavior != new.behavior && sink.out.len() == before {
        sink.push(&BEHAVIOR_CHANGED, "behavior section changed".to_owned());
    }
    let before = sink.out.len();
    diff_economics(old, new, &mut sink);
    if old.token_economics != new.token_economics && sink.out.len() == before {
        sink.push(
            &ECONOMICS_CHANGED,
            "token economics section changed".to_owned(),
        );
    }
    let before = sink.out.len();
    diff_entitlements(old, new, &mut sink);
    if old.entitlements != new.entitlements && sink.out.len() == before {
        sink.push(
            &ENTITLEMENTS_CHANGED,
            "entitlements section changed".to_owned(),
        );
    }
}

fn diff_surface(old: &ToolContract, new: &ToolContract, sink: &mut Sink<'_>) {
    let (o, n) = (&old.surface, &new.surface);
    if o.description() != n.description() {
        sink.push(
            &DESCRIPTION_CHANGED,
            format!(
                "tool description changed ({} -> {} characters); review the new text",
                o.description().chars().count(),
                n.description().chars().count()
            ),
        );
    }
    let before = sink.out.len();
    compare_schema(Dir::Input, "", o.input_schema(), n.input_schema(), sink);
    if o.input_schema() != n.input_schema() && sink.out.len() == before {
        sink.push(&IN_SCHEMA_CHANGED, "input schema changed".to_owned());
    }
}

fn diff_behavior(old: &ToolContract, new: &ToolContract, sink: &mut Sink<'_>) {
    let (o, n) = (&old.behavior, &new.behavior);
    match (o.output_schema(), n.output_schema()) {
        (None, Some(_)) => sink.push(&OUT_SCHEMA_ADDED, "output schema declared".to_owned()),
        (Some(_), None) => sink.push(
            &OUT_SCHEMA_REMOVED,
            "output schema withdrawn: consumers lose the shape of structuredContent".to_owned(),
        ),
        (Some(os), Some(ns)) => {
            let before = sink.out.len();
            compare_schema(Dir::Output, "", os, ns, sink);
            if os != ns && sink.out.len() == before {
                sink.push(&OUT_SCHEMA_CHANGED, "output schema changed".to_owned());
            }
        }
        (None, None) => {}
    }
    let (oa, na) = (o.annotations(), n.annotations());
    let flags = [
        (
            &READ_ONLY_CHANGED,
            "readOnlyHint",
            oa.read_only_hint,
            na.read_only_hint,
        ),
        (
            &DESTRUCTIVE_CHANGED,
            "destructiveHint",
            oa.destructive_hint,
            na.destructive_hint,
        ),
        (
            &IDEMPOTENT_CHANGED,
            "idempotentHint",
            oa.idempotent_hint,
            na.idempotent_hint,
        ),
        (
            &OPEN_WORLD_CHANGED,
            "openWorldHint",
            oa.open_world_hint,
            na.open_world_hint,
        ),
    ];
    for (rule, name, was, is) in flags {
        if was != is {
            sink.push(rule, format!("{name} {was} -> {is}"));
        }
    }
    diff_gate_stages(o.gate_stages(), n.gate_stages(), sink);
    if o.policy_fingerprint() != n.policy_fingerprint() {
        sink.push(
            &POLICY_CHANGED,
            format!(
                "policy fingerprint sha256:{} -> sha256:{}",
                short(&o.policy_fingerprint().to_hex()),
                short(&n.policy_fingerprint().to_hex())
            ),
        );
    }
}

/// Gate stages are `kind` or `kind:parameters`; each kind is one guarantee.
fn diff_gate_stages(old: &[String], new: &[String], sink: &mut Sink<'_>) {
    if old == new {
        return;
    }
    let kinds = |stages: &[String]| -> BTreeMap<String, String> {
        stages
            .iter()
            .map(|stage| match stage.split_once(':') {
                Some((kind, _)) => (kind.to_owned(), stage.clone()),
                None => (stage.clone(), stage.clone()),
            })
            .collect()
    };
    let (o, n) = (kinds(old), kinds(new));
    let before = sink.len();
    for (kind, stage) in &o {
        match n.get(kind) {
            None => sink.push(&GATE_STAGE_REMOVED, format!("gate stage `{stage}` removed")),
            Some(now) if now != stage => {
                sink.push(
                    &GATE_STAGE_CHANGED,
                    format!("gate stage `{stage}` -> `{now}`"),
                );
            }
            Some(_) => {}
        }
    }
    for (kind, stage) in &n {
        if !o.contains_key(kind) {
            sink.push(&GATE_STAGE_ADDED, format!("gate stage `{stage}` added"));
        }
    }
    if sink.len() == before {
        sink.push(
            &GATE_STAGES_CHANGED,
            format!("gate stages [{}] -> [{}]", old.join(", "), new.join(", ")),
        );
    }
}

fn diff_economics(old: &ToolContract, new: &ToolContract, sink: &mut Sink<'_>) {
    let (o, n) = (&old.token_economics, &new.token_economics);
    let (ou, nu): (BTreeSet<&String>, BTreeSet<&String>) = (
        o.unbounded_collections().iter().collect(),
        n.unbounded_collections().iter().collect(),
    );
    for pointer in nu.difference(&ou) {
        sink.push(
            &COLLECTION_UNBOUNDED,
            format!("output collection at {} is unbounded", at(pointer)),
        );
    }
    for pointer in ou.difference(&nu) {
        sink.push(
            &COLLECTION_BOUNDED,
            format!("output collection at {} is bounded now", at(pointer)),
        );
    }
    let (or, nr) = (o.inflation_risk(), n.inflation_risk());
    if nr > or {
        sink.push(&INFLATION_RAISED, format!("inflation risk {or} -> {nr}"));
    } else if nr < or {
        sink.push(&INFLATION_LOWERED, format!("inflation risk {or} -> {nr}"));
    }
    if o.schema_field_count() != n.schema_field_count() {
        sink.push(
            &FIELD_COUNT_CHANGED,
            format!(
                "schema field count {} -> {}",
                o.schema_field_count(),
                n.schema_field_count()
            ),
        );
    }
}

fn diff_entitlements(old: &ToolContract, new: &ToolContract, sink: &mut Sink<'_>) {
    let (o, n) = (&old.entitlements, &new.entitlements);
    for ((family, was), (_, is)) in o
        .families()
        .families()
        .into_iter()
        .zip(n.families().families())
    {
        if !was && is {
            sink.push(&ENTITLEMENT_GAINED, format!("handler gained `{family}`"));
        } else if was && !is {
            sink.push(&ENTITLEMENT_LOST, format!("handler lost `{family}`"));
        }
    }
    let (oe, ne): (BTreeSet<&String>, BTreeSet<&String>) = (
        o.evasion_signals().iter().collect(),
        n.evasion_signals().iter().collect(),
    );
    for signal in ne.difference(&oe) {
        sink.push(
            &EVASION_GAINED,
            format!("new evasion signal `{signal}` in the handler's reach"),
        );
    }
    for signal in oe.difference(&ne) {
        sink.push(&EVASION_LOST, format!("evasion signal `{signal}` gone"));
    }
    let (ou, nu): (BTreeSet<&String>, BTreeSet<&String>) = (
        o.unresolved().iter().collect(),
        n.unresolved().iter().collect(),
    );
    for call in nu.difference(&ou) {
        sink.push(
            &UNRESOLVED_GAINED,
            format!("`{call}` unresolved: the scanner cannot tell what it does"),
        );
    }
    for call in ou.difference(&nu) {
        sink.push(&UNRESOLVED_LOST, format!("`{call}` no longer unresolved"));
    }
}

/// Which side of the call a schema describes; it decides whether narrowing or widening breaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Arguments: the caller writes, so narrowing breaks callers.
    Input,
    /// `structuredContent`: the caller reads, so widening breaks consumers.
    Output,
}

/// The kinds of schema change, each mapped to an input and an output rule.
#[derive(Clone, Copy)]
enum Kind {
    PropertyAdded,
    PropertyRemoved,
    RequiredAdded,
    RequiredRemoved,
    EnumValueAdded,
    EnumValueRemoved,
    EnumIntroduced,
    EnumDropped,
    TypeWidened,
    TypeNarrowed,
    BoundTightened,
    BoundLoosened,
    AdditionalAllowed,
    AdditionalForbidden,
    DescriptionChanged,
    AnnotationChanged,
    Equivalent,
    SchemaChanged,
}

impl Kind {
    fn rule(self, dir: Dir) -> &'static Rule {
        let (input, output) = match self {
            Kind::PropertyAdded => (&IN_PROPERTY_ADDED, &OUT_PROPERTY_ADDED),
            Kind::PropertyRemoved => (&IN_PROPERTY_REMOVED, &OUT_PROPERTY_REMOVED),
            Kind::RequiredAdded => (&IN_REQUIRED_ADDED, &OUT_REQUIRED_ADDED),
            Kind::RequiredRemoved => (&IN_REQUIRED_REMOVED, &OUT_REQUIRED_REMOVED),
            Kind::EnumValueAdded => (&IN_ENUM_VALUE_ADDED, &OUT_ENUM_VALUE_ADDED),
            Kind::EnumValueRemoved => (&IN_ENUM_VALUE_REMOVED, &OUT_ENUM_VALUE_REMOVED),
            Kind::EnumIntroduced => (&IN_ENUM_INTRODUCED, &OUT_ENUM_INTRODUCED),
            Kind::EnumDropped => (&IN_ENUM_DROPPED, &OUT_ENUM_DROPPED),
            Kind::TypeWidened => (&IN_TYPE_WIDENED, &OUT_TYPE_WIDENED),
            Kind::TypeNarrowed => (&IN_TYPE_NARROWED, &OUT_TYPE_NARROWED),
            Kind::BoundTightened => (&IN_BOUND_TIGHTENED, &OUT_BOUND_TIGHTENED),
            Kind::BoundLoosened => (&IN_BOUND_LOOSENED, &OUT_BOUND_LOOSENED),
            Kind::AdditionalAllowed => (&IN_ADDITIONAL_ALLOWED, &OUT_ADDITIONAL_ALLOWED),
            Kind::AdditionalForbidden => (&IN_ADDITIONAL_FORBIDDEN, &OUT_ADDITIONAL_FORBIDDEN),
            Kind::DescriptionChanged => (&IN_DESCRIPTION_CHANGED, &OUT_DESCRIPTION_CHANGED),
            Kind::AnnotationChanged => (&IN_ANNOTATION_CHANGED, &OUT_ANNOTATION_CHANGED),
            Kind::Equivalent => (&IN_EQUIVALENT, &OUT_EQUIVALENT),
            Kind::SchemaChanged => (&IN_SCHEMA_CHANGED, &OUT_SCHEMA_CHANGED),
        };
        match dir {
            Dir::Input => input,
            Dir::Output => output,
        }
    }
}

/// Text-only keywords: no effect on validation, but the model reads them.
const ANNOTATION_KEYWORDS: &[&str] = &[
    "$comment",
    "default",
    "deprecated",
    "examples",
    "readOnly",
    "title",
    "writeOnly",
];
/// Bounds where a smaller value is stricter.
const UPPER_BOUNDS: &[&str] = &[
    "exclusiveMaximum",
    "maxContains",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
];
/// Bounds where a larger value is stricter.
const LOWER_BOUNDS: &[&str] = &[
    "exclusiveMinimum",
    "minContains",
    "minItems",
    "minLength",
    "minProperties",
    "minimum",
];

fn compare_schema(dir: Dir, pointer: &str, old: &Value, new: &Value, sink: &mut Sink<'_>) {
    if old == new {
        return;
    }
    let side = match dir {
        Dir::Input => "input",
        Dir::Output => "output",
    };
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else {
        sink.push(
            Kind::SchemaChanged.rule(dir),
            format!("{side} schema at {} changed", at(pointer)),
        );
        return;
    };
    let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
    for key in keys {
        let (ov, nv) = (o.get(key.as_str()), n.get(key.as_str()));
        if ov == nv {
            continue;
        }
        let k = key.as_str();
        let mut here = pointer.to_owned();
        push_token(&mut here, k);
        let handled = match k {
            "description" => {
                sink.push(
                    Kind::DescriptionChanged.rule(dir),
                    format!("{side} description at {} changed", at(pointer)),
                );
                true
            }
            _ if ANNOTATION_KEYWORDS.contains(&k) => {
                sink.push(
                    Kind::AnnotationChanged.rule(dir),
                    format!("{side} `{k}` at {} changed", at(pointer)),
                );
                true
            }
            "type" => compare_types(dir, pointer, ov, nv, sink),
            "enum" => compare_enum(dir, pointer, ov, nv, sink),
            "required" => compare_required(dir, pointer, o, n, sink),
            "properties" => compare_properties(dir, pointer, o, n, sink),
            "additionalProperties" => compare_additional(dir, pointer, ov, nv, sink),
            "items" | "$defs" | "definitions" => compare_nested(dir, &here, ov, nv, sink),
            _ if UPPER_BOUNDS.contains(&k) => compare_bound(dir, pointer, k, ov, nv, true, sink),
            _ if LOWER_BOUNDS.contains(&k) => compare_bound(dir, pointer, k, ov, nv, false, sink),
            _ => false,
        };
        if !handled {
            sink.push(
                Kind::SchemaChanged.rule(dir),
                format!("{side} schema keyword at {} changed", at(&here)),
            );
        }
    }
}

/// `items` (one schema) and `$defs`/`definitions` (maps whose keys stay the same) recurse; an added
/// or removed definition, or an array-form `items`, is left to the fallback (`false`).
fn compare_nested(
    dir: Dir,
    here: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    sink: &mut Sink<'_>,
) -> bool {
    let (Some(old), Some(new)) = (old, new) else {
        return false;
    };
    let is_map = here.ends_with("/$defs") || here.ends_with("/definitions");
    if !is_map {
        if old.is_object() && new.is_object() {
            compare_schema(dir, here, old, new, sink);
            return true;
        }
        return false;
    }
    let (Some(om), Some(nm)) = (old.as_object(), new.as_object()) else {
        return false;
    };
    if om.keys().ne(nm.keys()) {
        return false;
    }
    for (name, ov) in om {
        if let Some(nv) = nm.get(name) {
            let mut p = here.to_owned();
            push_token(&mut p, name);
            compare_schema(dir, &p, ov, nv, sink);
        }
    }
    true
}

/// A `type` keyword as a set; `None` means every type. `Err` for a malformed value.
fn type_set(value: Option<&Value>) -> Result<Option<BTreeSet<&str>>, ()> {
    match value {
        None => Ok(None),
        Some(Value::String(t)) => Ok(Some(BTreeSet::from([t.as_str()]))),
        Some(Value::Array(ts)) => ts
            .iter()
            .map(|t| t.as_str().ok_or(()))
            .collect::<Result<BTreeSet<_>, _>>()
            .map(Some),
        Some(_) => Err(()),
    }
}

/// Whether every type admitted by `inner` is admitted by `outer` (`integer` is a `number`).
fn types_within(inner: &Option<BTreeSet<&str>>, outer: &Option<BTreeSet<&str>>) -> bool {
    match (inner, outer) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(i), Some(o)) => i
            .iter()
            .all(|t| o.contains(t) || (*t == "integer" && o.contains("number"))),
    }
}

fn describe_types(set: &Option<BTreeSet<&str>>) -> String {
    match set {
        None => "any".to_owned(),
        Some(s) => s.iter().copied().collect::<Vec<_>>().join("|"),
    }
}

fn compare_types(
    dir: Dir,
    pointer: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    sink: &mut Sink<'_>,
) -> bool {
    let (Ok(o), Ok(n)) = (type_set(old), type_set(new)) else {
        return false;
    };
    let detail = format!(
        "type at {}: {} -> {}",
        at(pointer),
        describe_types(&o),
        describe_types(&n)
    );
    match (types_within(&o, &n), types_within(&n, &o)) {
        (true, true) => sink.push(Kind::Equivalent.rule(dir), detail),
        (true, false) => sink.push(Kind::TypeWidened.rule(dir), detail),
        (false, true) => sink.push(Kind::TypeNarrowed.rule(dir), detail),
        // Incomparable (string -> integer): the fallback rule of the side, BREAKING either way.
        (false, false) => sink.push(Kind::SchemaChanged.rule(dir), detail),
    }
    true
}

fn compare_enum(
    dir: Dir,
    pointer: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    sink: &mut Sink<'_>,
) -> bool {
    match (old, new) {
        (None, Some(Value::Array(_))) => {
            sink.push(
                Kind::EnumIntroduced.rule(dir),
                format!("enum introduced at {}", at(pointer)),
            );
            true
        }
        (Some(Value::Array(_)), None) => {
            sink.push(
                Kind::EnumDropped.rule(dir),
                format!("enum dropped at {}", at(pointer)),
            );
            true
        }
        (Some(Value::Array(o)), Some(Value::Array(n))) => {
            let removed: Vec<&Value> = o.iter().filter(|v| !n.contains(v)).collect();
            let added: Vec<&Value> = n.iter().filter(|v| !o.contains(v)).collect();
            if !removed.is_empty() {
                sink.push(
                    Kind::EnumValueRemoved.rule(dir),
                    format!("enum at {} lost {}", at(pointer), values(&removed)),
                );
            }
            if !added.is_empty() {
                sink.push(
                    Kind::EnumValueAdded.rule(dir),
                    format!("enum at {} gained {}", at(pointer), values(&added)),
                );
            }
            if removed.is_empty() && added.is_empty() {
                sink.push(
                    Kind::Equivalent.rule(dir),
                    format!("enum at {} reordered", at(pointer)),
                );
            }
            true
        }
        _ => false,
    }
}

fn string_set(value: Option<&Value>) -> Result<BTreeSet<&str>, ()> {
    match value {
        None => Ok(BTreeSet::new()),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().ok_or(())).collect(),
        Some(_) => Err(()),
    }
}

fn property_names(schema: &Map<String, Value>) -> Option<BTreeSet<&str>> {
    match schema.get("properties") {
        None => Some(BTreeSet::new()),
        Some(Value::Object(p)) => Some(p.keys().map(String::as_str).collect()),
        Some(_) => None,
    }
}

fn compare_required(
    dir: Dir,
    pointer: &str,
    o: &Map<String, Value>,
    n: &Map<String, Value>,
    sink: &mut Sink<'_>,
) -> bool {
    let (Ok(or), Ok(nr)) = (string_set(o.get("required")), string_set(n.get("required"))) else {
        return false;
    };
    let old_props = property_names(o).unwrap_or_default();
    let new_props = property_names(n).unwrap_or_default();
    let mut any = false;
    for name in nr.difference(&or) {
        let what = if old_props.contains(name) {
            "existing field"
        } else {
            "new field"
        };
        sink.push(
            Kind::RequiredAdded.rule(dir),
            format!("{what} `{name}` at {} is required", at(pointer)),
        );
        any = true;
    }
    for name in or.difference(&nr) {
        any = true;
        // A field that disappeared altogether is reported once, as a removed property.
        if old_props.contains(name) && !new_props.contains(name) {
            continue;
        }
        sink.push(
            Kind::RequiredRemoved.rule(dir),
            format!("field `{name}` at {} is no longer required", at(pointer)),
        );
    }
    if !any {
        sink.push(
            Kind::Equivalent.rule(dir),
            format!("`required` at {} reordered", at(pointer)),
        );
    }
    true
}

fn compare_properties(
    dir: Dir,
    pointer: &str,
    o: &Map<String, Value>,
    n: &Map<String, Value>,
    sink: &mut Sink<'_>,
) -> bool {
    let empty = Map::new();
    fn as_map<'a>(
        v: Option<&'a Value>,
        empty: &'a Map<String, Value>,
    ) -> Option<&'a Map<String, Value>> {
        match v {
            None => Some(empty),
            Some(Value::Object(m)) => Some(m),
            Some(_) => None,
        }
    }
    let (Some(op), Some(np)) = (
        as_map(o.get("properties"), &empty),
        as_map(n.get("properties"), &empty),
    ) else {
        return false;
    };
    let old_required = string_set(o.get("required")).unwrap_or_default();
    let new_required = string_set(n.get("required")).unwrap_or_default();
    for (name, ov) in op {
        let mut p = pointer.to_owned();
        push_token(&mut p, "properties");
        push_token(&mut p, name);
        match np.get(name) {
            Some(nv) => compare_schema(dir, &p, ov, nv, sink),
            None => sink.push(
                Kind::PropertyRemoved.rule(dir),
                format!("property `{name}` removed at {}", at(pointer)),
            ),
        }
    }
    for (name, nv) in np {
        if op.contains_key(name) {
            continue;
        }
        let required_before = old_required.contains(name.as_str());
        let required_now = new_required.contains(name.as_str());
        if required_now && !required_before {
            // A newly required property is reported once, by the `required` comparison.
            continue;
        }
        if required_before {
            // Already accepted (required, but undeclared, so unconstrained): its new declaration
            // constrains an argument callers already send. Compare it with the empty schema.
            let mut p = pointer.to_owned();
            push_token(&mut p, "properties");
            push_token(&mut p, name);
            compare_schema(dir, &p, &Value::Object(Map::new()), nv, sink);
            continue;
        }
        sink.push(
            Kind::PropertyAdded.rule(dir),
            format!("optional property `{name}` added at {}", at(pointer)),
        );
    }
    true
}

fn compare_additional(
    dir: Dir,
    pointer: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    sink: &mut Sink<'_>,
) -> bool {
    // Absent and `true` mean the same: any undeclared property is accepted.
    let open = |v: Option<&Value>| matches!(v, None | Some(Value::Bool(true)));
    let closed = |v: Option<&Value>| matches!(v, Some(Value::Bool(false)));
    let schema = |v: Option<&Value>| matches!(v, Some(Value::Object(_)));
    let mut here = pointer.to_owned();
    push_token(&mut here, "additionalProperties");
    let detail = |what: &str| format!("object at {} {what}", at(pointer));
    if open(old) && open(new) {
        sink.push(
            Kind::Equivalent.rule(dir),
            detail("writes `additionalProperties: true` differently"),
        );
    } else if (closed(old) && (open(new) || schema(new))) || (schema(old) && open(new)) {
        sink.push(
            Kind::AdditionalAllowed.rule(dir),
            detail("accepts more undeclared properties"),
        );
    } else if closed(new) && (open(old) || schema(old)) {
        sink.push(
            Kind::AdditionalForbidden.rule(dir),
            detail("rejects undeclared properties"),
        );
    } else if let (Some(o @ Value::Object(_)), Some(n @ Value::Object(_))) = (old, new) {
        compare_schema(dir, &here, o, n, sink);
    } else {
        // open -> schema restricts extra properties in a way this comparison does not rank.
        return false;
    }
    true
}

fn compare_bound(
    dir: Dir,
    pointer: &str,
    keyword: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    upper: bool,
    sink: &mut Sink<'_>,
) -> bool {
    let number = |v: Option<&Value>| match v {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_f64().map(Some).ok_or(()),
        // Draft 4 wrote exclusiveMaximum as a boolean; not ranked here.
        Some(_) => Err(()),
    };
    let (Ok(o), Ok(n)) = (number(old), number(new)) else {
        return false;
    };
    let tighter = match (o, n) {
        (None, Some(_)) => Some(true),
        (Some(_), None) => Some(false),
        (Some(a), Some(b)) if a == b => None,
        (Some(a), Some(b)) => Some(if upper { b < a } else { b > a }),
        (None, None) => None,
    };
    let show = |v: Option<f64>| v.map_or_else(|| "none".to_owned(), |x| x.to_string());
    let detail = format!("`{keyword}` at {}: {} -> {}", at(pointer), show(o), show(n));
    match tighter {
        Some(true) => sink.push(Kind::BoundTightened.rule(dir), detail),
        Some(false) => sink.push(Kind::BoundLoosened.rule(dir), detail),
        None => sink.push(Kind::Equivalent.rule(dir), detail),
    }
    true
}

/// A schema location for a detail line.
fn at(pointer: &str) -> String {
    if pointer.is_empty() {
        "the schema root".to_owned()
    } else {
        format!("`{pointer}`")
    }
}

/// At most five values, compactly, so a detail line stays one line.
fn values(list: &[&Value]) -> String {
    let mut shown: Vec<String> = list
        .iter()
        .take(5)
        .map(|v| {
            let text = v.to_string();
            if text.chars().count() > 40 {
                format!("{}...", text.chars().take(40).collect::<String>())
            } else {
                text
            }
        })
        .collect();
    if list.len() > 5 {
        shown.push(format!("and {} more", list.len() - 5));
    }
    shown.join(", ")
}

fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}
