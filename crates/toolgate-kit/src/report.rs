//! Verdicts and the report a reviewer reads.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::observe::{ChangeKind, Delta};

/// A claim the kit can contradict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Claim {
    /// `readOnlyHint: true`: the tool does not modify its environment.
    ReadOnly,
    /// `idempotentHint: true`: repeating the call with the same arguments has no additional effect.
    Idempotent,
    /// `destructiveHint: false`: the tool performs only additive updates.
    NonDestructive,
}

impl Claim {
    /// The annotation as written in `tools/list`.
    pub fn annotation(self) -> &'static str {
        match self {
            Claim::ReadOnly => "readOnlyHint=true",
            Claim::Idempotent => "idempotentHint=true",
            Claim::NonDestructive => "destructiveHint=false",
        }
    }
}

/// The annotations a tool declares in `tools/list` (`None` = absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Claims {
    /// `readOnlyHint` as declared.
    pub read_only: Option<bool>,
    /// `destructiveHint` as declared.
    pub destructive: Option<bool>,
    /// `idempotentHint` as declared.
    pub idempotent: Option<bool>,
}

impl Claims {
    /// The claims of one `tools/list` entry.
    pub fn of_tool(tool: &Value) -> Self {
        let hint = |key: &str| {
            tool.get("annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_bool)
        };
        Claims {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
            idempotent: hint("idempotentHint"),
        }
    }

    /// No behavioural hint at all (a title alone claims nothing): unclassified, never safe.
    pub fn is_unclassified(&self) -> bool {
        self.read_only.is_none() && self.destructive.is_none() && self.idempotent.is_none()
    }

    /// `readOnlyHint` with the spec's default (false).
    pub fn read_only(&self) -> bool {
        self.read_only.unwrap_or(false)
    }

    /// `destructiveHint` with the spec's default (true).
    pub fn destructive(&self) -> bool {
        self.destructive.unwrap_or(true)
    }

    /// `idempotentHint` with the spec's default (false).
    pub fn idempotent(&self) -> bool {
        self.idempotent.unwrap_or(false)
    }

    /// `readOnlyHint=false (default), ...` for the report.
    pub fn describe(&self) -> String {
        let one = |name: &str, value: Option<bool>, default: bool| match value {
            Some(v) => format!("{name}={v}"),
            None => format!("{name}={default} (default)"),
        };
        format!(
            "{}, {}, {}",
            one("readOnlyHint", self.read_only, false),
            one("destructiveHint", self.destructive, true),
            one("idempotentHint", self.idempotent, false)
        )
    }
}

/// The cases of the matrix, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CaseKind {
    /// 1. One valid call.
    Valid,
    /// 2. The byte-identical call again.
    Repeat,
    /// 3a. A call naming a resource that does not exist.
    MissingResource,
    /// 3b. A call for an operation the matrix already completed.
    AlreadyDone,
    /// 3c. A call with an invalid field.
    Invalid,
    /// 4. A call cut off after the server received it, retried with a new JSON-RPC id.
    RetryAfterCutOff,
    /// 5. Two identical calls at the same time.
    Concurrent,
    /// 6. A call that modifies state the kit seeded before it.
    Overwrite,
}

impl CaseKind {
    /// The case's name in reports.
    pub fn title(self) -> &'static str {
        match self {
            CaseKind::Valid => "valid call",
            CaseKind::Repeat => "byte-identical repeat",
            CaseKind::MissingResource => "missing resource",
            CaseKind::AlreadyDone => "already done",
            CaseKind::Invalid => "invalid field",
            CaseKind::RetryAfterCutOff => "retry after cut-off",
            CaseKind::Concurrent => "concurrent pair",
            CaseKind::Overwrite => "overwrite existing state",
        }
    }
}

/// One declared claim that an observed effect contradicts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Contradiction {
    /// The tool.
    pub tool: String,
    /// The contradicted claim.
    pub claim: Claim,
    /// The case that contradicted it.
    pub case: CaseKind,
    /// What was observed.
    pub evidence: String,
}

/// A flagged lost update: two identical calls at once both reported success, but the state
/// holds the effect of one, while two such calls one after the other have two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LostUpdate {
    /// The tool.
    pub tool: String,
    /// The case that found it ([`CaseKind::Concurrent`]).
    pub case: CaseKind,
    /// What was observed.
    pub evidence: String,
}

/// What the matrix concluded about one declared claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClaimStatus {
    /// Some case put the claim to the test and no observed effect contradicted it (evidence,
    /// not proof).
    Held,
    /// An observed effect contradicted the claim.
    Contradicted,
    /// No case could put the claim to the test, or one that should have could only run weakened
    /// (see [`ClaimVerdict::reason`]): nothing contradicted it, and nothing showed it either.
    Untested,
}

impl ClaimStatus {
    /// The word used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimStatus::Held => "held",
            ClaimStatus::Contradicted => "contradicted",
            ClaimStatus::Untested => "untested",
        }
    }
}

/// The verdict on one claim a tool declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimVerdict {
    /// The claim.
    pub claim: Claim,
    /// Held, contradicted or untested.
    pub verdict: ClaimStatus,
    /// The cases that contradicted it ([`ClaimStatus::Contradicted`]), or that exercised it.
    pub cases: Vec<CaseKind>,
    /// How it was tested, what contradicted it, or why it is untested and what to do about it.
    pub reason: String,
}

/// A case that ran, but could not fully test a claim (the verdict is then untested).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimGap {
    /// The claim.
    pub claim: Claim,
    /// Why, and what to do about it.
    pub reason: String,
}

/// What one step of a case changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObservedStep {
    /// The step (`call`, `cut-off call`, `retry`, `one call`, `both calls`, `seed (not judged)`).
    pub step: String,
    /// What changed during it.
    pub changes: Delta,
}

/// One block of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaseReport {
    /// Which case.
    pub case: CaseKind,
    /// The tool and its canonical (RFC 8785) arguments.
    pub request: String,
    /// The first call's outcome.
    pub first_call: String,
    /// The second call's outcome, for cases with two calls.
    pub second_call: Option<String>,
    /// What each step changed.
    pub observed: Vec<ObservedStep>,
    /// The verdict in one sentence.
    pub result: String,
    /// The claims this case contradicted.
    pub contradictions: Vec<Contradiction>,
    /// The declared claims this case put to the test (contradicted or not).
    pub exercised: Vec<Claim>,
    /// The declared claims this case should have tested but could only test weakened.
    pub gaps: Vec<ClaimGap>,
    /// A lost update this case found (the concurrent pair only).
    pub lost_update: Option<LostUpdate>,
}

/// What the kit concluded about one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolStatus {
    /// Every declared claim was tested and held (not a proof of safety).
    Consistent,
    /// At least one declared claim was contradicted.
    Contradicted,
    /// No declared claim was contradicted, but at least one could not be tested (see
    /// [`ToolReport::verdicts`] for why): it is not reported as consistent.
    Untested,
    /// The tool declares no behavioural hint: nothing is claimed, nothing is safe.
    Unclassified,
    /// Listed by the server, but no fixtures were given: not exercised.
    NotExercised,
}

/// The matrix's findings for one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolReport {
    /// The tool's name.
    pub name: String,
    /// Its declared annotations.
    pub claims: Claims,
    /// The conclusion.
    pub status: ToolStatus,
    /// One verdict per declared claim (`readOnlyHint: true`, `idempotentHint: true`,
    /// `destructiveHint: false`, in that order); empty when the tool was not exercised.
    pub verdicts: Vec<ClaimVerdict>,
    /// One block per case run.
    pub cases: Vec<CaseReport>,
}

impl ToolReport {
    /// The verdict on `claim`, or `None` when the tool does not declare it (or was not exercised).
    pub fn verdict(&self, claim: Claim) -> Option<&ClaimVerdict> {
        self.verdicts.iter().find(|v| v.claim == claim)
    }
}

/// The report of one run of the matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// What the observer watched and ignored.
    pub observer: Vec<String>,
    /// When case 4 cut the connection.
    pub cut_off: String,
    /// One entry per listed tool.
    pub tools: Vec<ToolReport>,
    /// Wall time of the whole run.
    #[serde(serialize_with = "seconds")]
    pub elapsed: Duration,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Report {
    /// Every contradicted claim, across tools.
    pub fn contradictions(&self) -> Vec<&Contradiction> {
        self.tools
            .iter()
            .flat_map(|t| t.cases.iter())
            .flat_map(|c| c.contradictions.iter())
            .collect()
    }

    /// Every declared claim no case could test, with the tool's name.
    pub fn untested(&self) -> Vec<(&str, &ClaimVerdict)> {
        self.tools
            .iter()
            .flat_map(|t| {
                t.verdicts
                    .iter()
                    .filter(|v| v.verdict == ClaimStatus::Untested)
                    .map(|v| (t.name.as_str(), v))
            })
            .collect()
    }

    /// Every lost update the concurrent pairs found, across tools.
    pub fn lost_updates(&self) -> Vec<&LostUpdate> {
        self.tools
            .iter()
            .flat_map(|t| t.cases.iter())
            .filter_map(|c| c.lost_update.as_ref())
            .collect()
    }

    /// The verdict on `claim` of `tool` (see [`ToolReport::verdict`]).
    pub fn verdict(&self, tool: &str, claim: Claim) -> Option<&ClaimVerdict> {
        self.tool(tool).and_then(|t| t.verdict(claim))
    }

    /// The tools that declare no behavioural hint.
    pub fn unclassified(&self) -> Vec<&str> {
        self.tools
            .iter()
            .filter(|t| t.status == ToolStatus::Unclassified)
            .map(|t| t.name.as_str())
            .collect()
    }

    /// The report of `tool`.
    pub fn tool(&self, tool: &str) -> Option<&ToolReport> {
        self.tools.iter().find(|t| t.name == tool)
    }

    /// No declared claim was contradicted (some may be untested: see [`Report::untested`]).
    pub fn is_honest(&self) -> bool {
        self.contradictions().is_empty()
    }

    /// Panics with the text report when any claim was contradicted (for tests). Untested claims
    /// and lost updates do not make it panic: check [`Report::untested`] and
    /// [`Report::lost_updates`] for those.
    #[track_caller]
    pub fn assert_honest(&self) {
        let found = self.contradictions().len();
        assert!(
            found == 0,
            "{found} annotation claim(s) contradicted by observed effects:\n{}",
            self.to_text()
        );
    }

    /// The report as one JSON document (same content as [`Report::to_text`]).
    pub fn to_json(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert(
                "summary".to_owned(),
                serde_json::json!({
                    "tools": self.tools.len(),
                    "cases": self.tools.iter().map(|t| t.cases.len()).sum::<usize>(),
                    "contradictions": self.contradictions().len(),
                    "untested": self.untested().len(),
                    "lost_updates": self.lost_updates().len(),
                    "unclassified": self.unclassified(),
                }),
            );
        }
        value
    }

    /// The report as text: a summary, then one block per case.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let cases: usize = self.tools.iter().map(|t| t.cases.len()).sum();
        // Writing to a String cannot fail; the results are ignored throughout.
        let _ = writeln!(
            out,
            "toolgate-kit: {} tools, {cases} cases, {} contradictions, {} untested claims, {} lost updates, {} unclassified, {:.2} s",
            self.tools.len(),
            self.contradictions().len(),
            self.untested().len(),
            self.lost_updates().len(),
            self.unclassified().len(),
            self.elapsed.as_secs_f64()
        );
        for line in &self.observer {
            let _ = writeln!(out, "observer: {line}");
        }
        let _ = writeln!(out, "cut-off: {}", self.cut_off);
        for tool in &self.tools {
            let _ = writeln!(out, "\n== tool {}: {}", tool.name, tool.claims.describe());
            let mut verdict = match tool.status {
                ToolStatus::Consistent if tool.verdicts.is_empty() => format!(
                    "consistent: it declares none of the claims the matrix tests (readOnlyHint=true, idempotentHint=true, destructiveHint=false), so nothing was contradicted in {} cases",
                    tool.cases.len()
                ),
                ToolStatus::Consistent => format!(
                    "consistent: every declared claim was tested and held in {} cases (evidence, not proof)",
                    tool.cases.len()
                ),
                ToolStatus::Untested => {
                    let claims: Vec<&str> = tool
                        .verdicts
                        .iter()
                        .filter(|v| v.verdict == ClaimStatus::Untested)
                        .map(|v| v.claim.annotation())
                        .collect();
                    format!(
                        "UNTESTED: {} (nothing contradicted, nothing showed it either; see the claims below)",
                        claims.join(", ")
                    )
                }
                ToolStatus::Contradicted => {
                    let claims: Vec<&str> = tool
                        .cases
                        .iter()
                        .flat_map(|c| c.contradictions.iter())
                        .map(|c| c.claim.annotation())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    format!("CONTRADICTED: {}", claims.join(", "))
                }
                ToolStatus::Unclassified => "unclassified: no readOnlyHint, destructiveHint or idempotentHint; the defaults (not read-only, destructive, not idempotent) apply and nothing about it is safe".to_owned(),
                ToolStatus::NotExercised => "not exercised: no fixtures were given for it".to_owned(),
            };
            let lost: Vec<&str> = tool
                .cases
                .iter()
                .filter(|c| c.lost_update.is_some())
                .map(|c| c.case.title())
                .collect();
            if !lost.is_empty() {
                let _ = write!(verdict, "; LOST UPDATE in case '{}'", lost.join("', '"));
            }
            let _ = writeln!(out, "verdict: {verdict}");
            for v in &tool.verdicts {
                let cases = if v.cases.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({})",
                        v.cases
                            .iter()
                            .map(|c| c.title())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                let _ = writeln!(
                    out,
                    "claim {}: {}{cases}: {}",
                    v.claim.annotation(),
                    v.verdict.as_str(),
                    v.reason
                );
            }
            for case in &tool.cases {
                let _ = writeln!(out, "\ncase: {}", case.case.title());
                let _ = writeln!(out, "request: {}", case.request);
                let _ = writeln!(out, "first call: {}", case.first_call);
                let _ = writeln!(
                    out,
                    "second call: {}",
                    case.second_call.as_deref().unwrap_or("-")
                );
                let observed = match case.observed.as_slice() {
                    [one] => one.changes.to_string(),
                    steps => steps
                        .iter()
                        .map(|s| format!("{}: {}", s.step, s.changes))
                        .collect::<Vec<_>>()
                        .join("; "),
                };
                let _ = writeln!(out, "observed records: {observed}");
                let _ = writeln!(out, "result: {}", case.result);
            }
        }
        out
    }
}

/// A short account of a delta's effects: `1 added, 1 appended`.
fn effect_counts(delta: &Delta) -> String {
    let kinds = [
        ChangeKind::Added,
        ChangeKind::Appended,
        ChangeKind::Touched,
        ChangeKind::Modified,
        ChangeKind::Removed,
    ];
    kinds
        .iter()
        .filter_map(|&k| {
            let n = delta.count(k);
            (n > 0).then(|| format!("{n} {}", k.as_str()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// How one call of a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallOutcome {
    /// A result without `isError`.
    Ok,
    /// A result with `isError: true`: the tool ran and refused or failed.
    ToolError,
    /// A JSON-RPC error: refused before (or instead of) the tool's work.
    RpcError,
    /// Cut off before its response (case 4 with [`CutOff::WhenObserved`](crate::CutOff)), after
    /// the state changed.
    Interrupted,
}

impl CallOutcome {
    pub(crate) fn of_reply(reply: &Value) -> Self {
        if reply.get("error").is_some() || reply.get("result").is_none() {
            CallOutcome::RpcError
        } else if reply["result"]["isError"] == Value::Bool(true) {
            CallOutcome::ToolError
        } else {
            CallOutcome::Ok
        }
    }

    /// The tool ran (a result, an error result included, or a call cut off mid-flight).
    fn ran(self) -> bool {
        !matches!(self, CallOutcome::RpcError)
    }
}

/// Case 5: two calls one after the other from the pair's starting state, compared with one call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sequential {
    /// How their outcome differs from one call's (empty: the second call added nothing).
    pub(crate) difference: Delta,
    /// Both calls succeeded.
    pub(crate) both_ok: bool,
}

/// The raw material of one case, before the verdict.
#[derive(Debug)]
pub(crate) struct CaseRun {
    pub(crate) case: CaseKind,
    pub(crate) request: String,
    pub(crate) first_call: String,
    pub(crate) second_call: Option<String>,
    /// Steps shown before `observed` in the report but not judged (the overwrite case's seed).
    pub(crate) context: Vec<ObservedStep>,
    /// The judged steps.
    pub(crate) observed: Vec<ObservedStep>,
    /// Case 5 only: whether the pair ran on a fresh input (compared with case 1's effects) or on
    /// the already-done `valid` input (which must add nothing).
    pub(crate) fresh: bool,
    /// Case 4 only: the connection was cut before the response (the call may be unfinished).
    pub(crate) mid_flight: bool,
    /// Case 5 only: how the pair's outcome differs in content from one call's outcome from the
    /// same starting state; `None` when the observer cannot restore that state.
    pub(crate) compared: Option<Delta>,
    /// Sentences the runner adds to the result (how the case was set up).
    pub(crate) notes: Vec<String>,
    /// How the case's calls ended, in order (for case 2, the first is case 1's valid call; for
    /// case 5, the pair's two calls).
    pub(crate) outcomes: Vec<CallOutcome>,
    /// Case 5 only, with an observer that can restore: two calls one after the other.
    pub(crate) sequential: Option<Sequential>,
}

impl Default for CaseRun {
    fn default() -> Self {
        CaseRun {
            case: CaseKind::Valid,
            request: String::new(),
            first_call: String::new(),
            second_call: None,
            context: Vec::new(),
            observed: Vec::new(),
            fresh: false,
            mid_flight: false,
            compared: None,
            notes: Vec::new(),
            outcomes: Vec::new(),
            sequential: None,
        }
    }
}

/// `; metadata-only touches (touched x) are writes, not an added effect for idempotentHint`, or
/// nothing when `delta` touched nothing.
fn touches_note(delta: &Delta) -> String {
    let touches = delta.touches();
    if touches.is_empty() {
        String::new()
    } else {
        format!(
            " (metadata-only touches, {touches}, leave the same content: no added effect for idempotentHint, still a write for readOnlyHint)"
        )
    }
}

/// Judges one case against the claims. `baseline` is what case 1 (one valid call) changed.
///
/// Each claim reads the changes with its own meaning: for `readOnlyHint` every change is an
/// effect, a metadata-only touch included; for `idempotentHint` only a change of content or
/// existence is an added effect (a repeat that leaves the same content adds none); for
/// `destructiveHint` only a modification or removal loses state.
pub(crate) fn judge(
    tool: &str,
    claims: &Claims,
    run: CaseRun,
    baseline: Option<&Delta>,
) -> CaseReport {
    let mut contradictions = Vec::new();
    let mut notes: Vec<String> = run.notes.clone();
    let contradict = |claim: Claim, evidence: String, list: &mut Vec<Contradiction>| {
        list.push(Contradiction {
            tool: tool.to_owned(),
            claim,
            case: run.case,
            evidence,
        });
    };
    let all_changes: Vec<_> = run
        .observed
        .iter()
        .flat_map(|s| s.changes.changes.iter())
        .collect();

    if claims.read_only == Some(true) && !all_changes.is_empty() {
        let evidence = run
            .observed
            .iter()
            .filter(|s| !s.changes.is_empty())
            .map(|s| format!("{}: {}", s.step, s.changes))
            .collect::<Vec<_>>()
            .join("; ");
        contradict(
            Claim::ReadOnly,
            format!("the tool changed its environment ({evidence})"),
            &mut contradictions,
        );
    }
    let losses: Vec<String> = all_changes
        .iter()
        .filter(|c| c.kind.loses_state())
        .map(|c| format!("{} {}", c.kind.as_str(), c.item))
        .collect();
    if claims.destructive == Some(false) && !losses.is_empty() {
        contradict(
            Claim::NonDestructive,
            format!("state was lost or replaced ({})", losses.join(", ")),
            &mut contradictions,
        );
    }

    let mut lost: Option<String> = None;
    let idempotent_claimed = claims.idempotent == Some(true);
    let declared = || {
        format!(
            " (consistent with idempotentHint={}{})",
            claims.idempotent(),
            if claims.idempotent.is_none() {
                ", the default"
            } else {
                ""
            }
        )
    };
    let step = |name: &str| {
        run.observed
            .iter()
            .find(|s| s.step == name)
            .map(|s| s.changes.clone())
            .unwrap_or_default()
    };
    match run.case {
        CaseKind::Repeat | CaseKind::AlreadyDone => {
            let delta = step("call");
            let added = delta.content_changes();
            let what = if run.case == CaseKind::Repeat {
                "the byte-identical repeat"
            } else {
                "repeating an already completed operation"
            };
            if added.is_empty() {
                notes.push(format!("{what} added no effect{}", touches_note(&delta)));
            } else if idempotent_claimed {
                contradict(
                    Claim::Idempotent,
                    format!("{what} added effects ({added})"),
                    &mut contradictions,
                );
            } else {
                notes.push(format!(
                    "not idempotent: {what} added effects{}",
                    declared()
                ));
            }
        }
        CaseKind::RetryAfterCutOff => {
            let first = step("cut-off call");
            let retry_delta = step("retry");
            let retry = retry_delta.content_changes();
            if retry.is_empty() {
                if first.is_empty() && retry_delta.is_empty() {
                    notes.push(
                        "neither the cut-off call nor its retry had an observable effect"
                            .to_owned(),
                    );
                } else {
                    notes.push(format!(
                        "the retry with a new JSON-RPC id added no effect: the server recognized the operation as done{}",
                        touches_note(&retry_delta)
                    ));
                }
            } else if run.mid_flight
                && !(first.count(ChangeKind::Added) > 0 && retry.count(ChangeKind::Added) > 0)
            {
                notes.push(format!(
                    "the retry finished what the interrupted call had started ({retry}) without creating records a second time"
                ));
            } else if idempotent_claimed {
                contradict(
                    Claim::Idempotent,
                    format!(
                        "not idempotent without a remote idempotency mechanism: the retry added effects ({retry}) after the cut-off call had already had its own"
                    ),
                    &mut contradictions,
                );
            } else {
                notes.push(format!(
                    "not idempotent without a remote idempotency mechanism: the retry added effects after the cut-off call had already had its own{}",
                    declared()
                ));
            }
        }
        CaseKind::Concurrent => {
            let pair = step("both calls");
            let excess = match &run.compared {
                // The outcomes are compared record by record: a lost update or an edit applied
                // twice leaves other content than one call does.
                Some(difference) => (!difference.is_empty()).then(|| {
                    format!(
                        "two identical calls at once left other content than one call from the same starting state (one call's outcome to the pair's: {difference})"
                    )
                }),
                None if run.fresh => baseline.and_then(|one| {
                    // Records differ between inputs, so only the number of changed records can be
                    // compared with the single call of case 1.
                    let (pair, one) = (pair.content_changes(), one.content_changes());
                    (pair.changes.len() > one.changes.len()).then(|| {
                        format!(
                            "two identical calls at once had more effects ({}) than one call had in case 'valid call' ({})",
                            effect_counts(&pair),
                            if one.is_empty() { "none".to_owned() } else { effect_counts(&one) }
                        )
                    })
                }),
                None => {
                    let added = pair.content_changes();
                    (!added.is_empty()).then(|| {
                        format!(
                            "two identical calls at once, repeating an already completed operation, added effects ({added})"
                        )
                    })
                }
            };
            // Both calls reported success and the pair left one call's outcome, but two calls
            // one after the other leave more: one of the two updates was lost.
            lost = match (&run.compared, &run.sequential) {
                (Some(difference), Some(sequential))
                    if difference.is_empty()
                        && !sequential.difference.is_empty()
                        && sequential.both_ok
                        && run.outcomes.len() == 2
                        && run.outcomes.iter().all(|o| *o == CallOutcome::Ok) =>
                {
                    Some(format!(
                        "both calls succeeded, but together they left the outcome of one call, while two calls one after the other from the same starting state leave more (one call's outcome to theirs: {}): one update was lost",
                        sequential.difference
                    ))
                }
                _ => None,
            };
            match &run.sequential {
                Some(s) if s.difference.is_empty() => notes.push(
                    "two calls one after the other from the same starting state left the same outcome as one call".to_owned(),
                ),
                Some(s) => notes.push(format!(
                    "two calls one after the other from the same starting state left more than one call ({})",
                    s.difference
                )),
                None => {}
            }
            if let Some(evidence) = &lost
                && claims.destructive == Some(false)
                && !contradictions
                    .iter()
                    .any(|c| c.claim == Claim::NonDestructive)
            {
                contradict(
                    Claim::NonDestructive,
                    format!("a lost update replaced the other call's effect: {evidence}"),
                    &mut contradictions,
                );
            }
            match excess {
                None if lost.is_some() => {}
                Some(evidence) if idempotent_claimed => {
                    contradict(Claim::Idempotent, evidence, &mut contradictions);
                }
                Some(evidence) => notes.push(format!(
                    "not idempotent under concurrency: {evidence}{}",
                    declared()
                )),
                None if run.compared.is_some() => notes.push(
                    "two identical calls at once left the same outcome as one call".to_owned(),
                ),
                None if run.fresh => notes.push(
                    "two identical calls at once had no more effect than one call".to_owned(),
                ),
                None => notes.push("two identical calls at once added no effect".to_owned()),
            }
        }
        CaseKind::Valid | CaseKind::MissingResource | CaseKind::Invalid | CaseKind::Overwrite => {
            if all_changes.is_empty() {
                notes.push("no observable effect".to_owned());
            }
        }
    }
    if !all_changes.is_empty() && !matches!(run.case, CaseKind::Repeat | CaseKind::AlreadyDone) {
        // The pair's own effect: its single call for comparison is reported as its own step.
        let merged = if run.case == CaseKind::Concurrent {
            step("both calls")
        } else {
            Delta {
                changes: all_changes.iter().map(|c| (*c).clone()).collect(),
            }
        };
        let lost = if losses.is_empty() {
            "no state lost or replaced".to_owned()
        } else if claims.destructive() {
            format!(
                "state lost or replaced (consistent with destructiveHint=true{})",
                if claims.destructive.is_none() {
                    ", the default"
                } else {
                    ""
                }
            )
        } else {
            "state lost or replaced".to_owned()
        };
        let effect = if merged.is_empty() {
            "none".to_owned()
        } else {
            effect_counts(&merged)
        };
        notes.push(format!("effect: {effect}; {lost}"));
    }

    // Which declared claims this case put to the test.
    let first = run.outcomes.first().copied();
    let any_ok = run.outcomes.contains(&CallOutcome::Ok);
    let mut exercised: Vec<Claim> = Vec::new();
    let mut gaps = Vec::new();
    if claims.read_only == Some(true) && any_ok {
        exercised.push(Claim::ReadOnly);
    }
    let repeated = match run.case {
        // The valid call completed, and the repeat ran on its outcome.
        CaseKind::Repeat => first == Some(CallOutcome::Ok),
        CaseKind::AlreadyDone => first.is_some_and(CallOutcome::ran),
        CaseKind::RetryAfterCutOff => {
            matches!(first, Some(CallOutcome::Ok | CallOutcome::Interrupted))
        }
        CaseKind::Concurrent => any_ok,
        _ => false,
    };
    if idempotent_claimed && repeated {
        exercised.push(Claim::Idempotent);
    }
    if idempotent_claimed && run.case == CaseKind::Concurrent && run.fresh && run.compared.is_none()
    {
        gaps.push(ClaimGap {
            claim: Claim::Idempotent,
            reason: "the observer cannot restore state (its Observer::save returned None, the trait's default; a wrapper must forward save and restore), so the concurrent pair was compared with case 'valid call' by the number of changed records only, and a lost update or an edit applied twice would not show".to_owned(),
        });
    }
    // Existing state given to the tool: the overwrite case's seed, or a record that existed
    // before a call and that the call extended (its earlier content kept).
    let on_existing = (run.case == CaseKind::Overwrite && first.is_some_and(CallOutcome::ran))
        || all_changes.iter().any(|c| c.kind == ChangeKind::Appended);
    if claims.destructive == Some(false) && on_existing {
        exercised.push(Claim::NonDestructive);
    }
    for c in &contradictions {
        if !exercised.contains(&c.claim) {
            exercised.push(c.claim);
        }
    }

    let mut sentences: Vec<String> = contradictions
        .iter()
        .map(|c| format!("contradicts {}: {}", c.claim.annotation(), c.evidence))
        .collect();
    if let Some(evidence) = &lost {
        sentences.push(format!("LOST UPDATE: {evidence}"));
    }
    sentences.extend(notes);
    let mut observed = run.context;
    observed.extend(run.observed);
    CaseReport {
        case: run.case,
        request: run.request,
        first_call: run.first_call,
        second_call: run.second_call,
        observed,
        result: sentences.join("; "),
        contradictions,
        exercised,
        gaps,
        lost_update: lost.map(|evidence| LostUpdate {
            tool: tool.to_owned(),
            case: run.case,
            evidence,
        }),
    }
}

/// The declared claims of `claims`, in report order.
fn declared(claims: &Claims) -> Vec<Claim> {
    let mut out = Vec::new();
    if claims.read_only == Some(true) {
        out.push(Claim::ReadOnly);
    }
    if claims.idempotent == Some(true) {
        out.push(Claim::Idempotent);
    }
    if claims.destructive == Some(false) {
        out.push(Claim::NonDestructive);
    }
    out
}

/// One verdict per declared claim, from the judged cases: contradicted when a case contradicted
/// it; untested when a case that should have tested it ran weakened, or when no case exercised
/// it; held otherwise. `destructiveHint: false` of a tool whose `readOnlyHint: true` held is
/// held too: no case changed anything, and the spec gives `destructiveHint` meaning only when
/// `readOnlyHint` is false.
pub(crate) fn verdicts(claims: &Claims, cases: &[CaseReport]) -> Vec<ClaimVerdict> {
    let mut out: Vec<ClaimVerdict> = Vec::new();
    for claim in declared(claims) {
        let contradicted: Vec<&Contradiction> = cases
            .iter()
            .flat_map(|c| c.contradictions.iter())
            .filter(|c| c.claim == claim)
            .collect();
        let mut by: Vec<CaseKind> = Vec::new();
        let push = |case: CaseKind, list: &mut Vec<CaseKind>| {
            if !list.contains(&case) {
                list.push(case);
            }
        };
        if let Some(first) = contradicted.first() {
            for c in &contradicted {
                push(c.case, &mut by);
            }
            out.push(ClaimVerdict {
                claim,
                verdict: ClaimStatus::Contradicted,
                cases: by,
                reason: first.evidence.clone(),
            });
            continue;
        }
        for case in cases.iter().filter(|c| c.exercised.contains(&claim)) {
            push(case.case, &mut by);
        }
        let gaps: Vec<String> = cases
            .iter()
            .flat_map(|c| c.gaps.iter().map(move |g| (c.case, g)))
            .filter(|(_, g)| g.claim == claim)
            .map(|(case, g)| format!("in case '{}', {}", case.title(), g.reason))
            .collect();
        let (verdict, reason) = if !gaps.is_empty() {
            (
                ClaimStatus::Untested,
                format!(
                    "{}; the other cases found nothing against it, which does not make up for it",
                    gaps.join("; ")
                ),
            )
        } else if !by.is_empty() {
            (
                ClaimStatus::Held,
                match claim {
                    Claim::ReadOnly => "calls that succeeded changed nothing observed",
                    Claim::Idempotent => "repeating completed operations added no effect",
                    _ if by.contains(&CaseKind::Overwrite) => {
                        "the overwrite case's call, given the seeded state, lost or replaced none of it, and no other call lost or replaced state"
                    }
                    _ => {
                        "calls extended records that existed before them (appended, earlier content kept), and no call lost or replaced state; ToolFixtures::with_overwrite tests a call that modifies existing state"
                    }
                }
                .to_owned(),
            )
        } else if claim == Claim::NonDestructive
            && let Some(read_only) = out
                .iter()
                .find(|v| v.claim == Claim::ReadOnly && v.verdict == ClaimStatus::Held)
        {
            by = read_only.cases.clone();
            (
                ClaimStatus::Held,
                "implied by readOnlyHint=true, which held: no case changed anything (the spec gives destructiveHint meaning only when readOnlyHint is false)".to_owned(),
            )
        } else {
            (
                ClaimStatus::Untested,
                match claim {
                    Claim::ReadOnly => "no call of the tool succeeded (every reply was an error), so it never did its work under observation; check the fixtures",
                    Claim::Idempotent => "no completed operation was repeated: the valid call, the cut-off call and the concurrent pair all failed; check the fixtures",
                    _ => "no case gave the tool existing state to modify or remove (every call wrote fresh records, or nothing); add ToolFixtures::with_overwrite, a seed and a call that modifies it",
                }
                .to_owned(),
            )
        };
        out.push(ClaimVerdict {
            claim,
            verdict,
            cases: by,
            reason,
        });
    }
    out
}

/// The tool's conclusion from its claims and verdicts.
pub(crate) fn status(claims: &Claims, verdicts: &[ClaimVerdict]) -> ToolStatus {
    if verdicts
        .iter()
        .any(|v| v.verdict == ClaimStatus::Contradicted)
    {
        ToolStatus::Contradicted
    } else if claims.is_unclassified() {
        ToolStatus::Unclassified
    } else if verdicts.iter().any(|v| v.verdict == ClaimStatus::Untested) {
        ToolStatus::Untested
    } else {
        ToolStatus::Consistent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::Change;

    use ChangeKind::{Added, Appended, Modified, Touched};

    fn delta(changes: &[(&str, ChangeKind)]) -> Delta {
        Delta {
            changes: changes
                .iter()
                .map(|&(item, kind)| Change {
                    item: item.to_owned(),
                    kind,
                })
                .collect(),
        }
    }

    fn run(case: CaseKind, steps: &[(&str, &[(&str, ChangeKind)])]) -> CaseRun {
        CaseRun {
            case,
            observed: steps
                .iter()
                .map(|&(step, changes)| ObservedStep {
                    step: step.to_owned(),
                    changes: delta(changes),
                })
                .collect(),
            ..CaseRun::default()
        }
    }

    /// `readOnlyHint`, `destructiveHint`, `idempotentHint` as declared.
    fn claims(
        read_only: Option<bool>,
        destructive: Option<bool>,
        idempotent: Option<bool>,
    ) -> Claims {
        Claims {
            read_only,
            destructive,
            idempotent,
        }
    }

    /// Judges `run` and checks the contradicted claims and a phrase of the result.
    #[track_caller]
    fn check(claims: Claims, run: CaseRun, expect: &[Claim], phrase: &str) {
        let report = judge("tool", &claims, run, None);
        let got: Vec<Claim> = report.contradictions.iter().map(|c| c.claim).collect();
        assert_eq!(got, expect, "{}", report.result);
        assert!(report.result.contains(phrase), "{}", report.result);
    }

    const IDEMPOTENT: Claims = Claims {
        read_only: Some(false),
        destructive: Some(true),
        idempotent: Some(true),
    };

    #[test]
    fn a_repeat_that_only_touches_adds_no_effect_for_idempotent_hint() {
        let touched: &[(&str, ChangeKind)] = &[("state/a.txt", Touched)];
        check(
            IDEMPOTENT,
            run(CaseKind::Repeat, &[("call", touched)]),
            &[],
            "added no effect (metadata-only touches, touched state/a.txt, leave the same content",
        );
        check(
            IDEMPOTENT,
            run(CaseKind::AlreadyDone, &[("call", touched)]),
            &[],
            "added no effect",
        );
        check(
            IDEMPOTENT,
            run(
                CaseKind::RetryAfterCutOff,
                &[
                    ("cut-off call", &[("state/a.txt", Added)]),
                    ("retry", touched),
                ],
            ),
            &[],
            "the retry with a new JSON-RPC id added no effect",
        );
        // Content that changes again is an added effect.
        check(
            IDEMPOTENT,
            run(
                CaseKind::Repeat,
                &[(
                    "call",
                    &[("state/a.txt", Touched), ("state/b.txt", Modified)],
                )],
            ),
            &[Claim::Idempotent],
            "the byte-identical repeat added effects (modified state/b.txt)",
        );
    }

    #[test]
    fn any_touch_still_contradicts_read_only_hint() {
        let touched: &[(&str, ChangeKind)] = &[("state/a.txt", Touched)];
        let read_only = claims(Some(true), None, Some(true));
        for case in [CaseKind::Valid, CaseKind::Repeat, CaseKind::Concurrent] {
            check(
                read_only,
                run(case, &[("call", touched), ("both calls", touched)]),
                &[Claim::ReadOnly],
                "the tool changed its environment",
            );
        }
    }

    #[test]
    fn a_touch_loses_no_state_for_destructive_hint() {
        let additive = claims(Some(false), Some(false), None);
        check(
            additive,
            run(CaseKind::Valid, &[("call", &[("state/a.txt", Touched)])]),
            &[],
            "no state lost or replaced",
        );
        check(
            additive,
            run(
                CaseKind::Overwrite,
                &[("call", &[("state/a.txt", Modified)])],
            ),
            &[Claim::NonDestructive],
            "state was lost or replaced (modified state/a.txt)",
        );
    }

    #[test]
    fn the_seed_is_reported_but_not_judged() {
        let mut overwrite = run(CaseKind::Overwrite, &[("call", &[])]);
        overwrite.context = vec![ObservedStep {
            step: "seed (not judged)".to_owned(),
            changes: delta(&[("state/seeded.txt", Added)]),
        }];
        let report = judge(
            "tool",
            &claims(Some(true), Some(false), None),
            overwrite,
            None,
        );
        assert!(report.contradictions.is_empty(), "{}", report.result);
        assert_eq!(report.observed[0].step, "seed (not judged)");
        assert_eq!(report.observed[1].step, "call");
    }

    /// Case 5 with a restorable observer: the pair left one call's outcome (`compared` empty),
    /// two calls in a row leave `sequential`, the pair's calls ended with `outcomes`.
    fn pair(outcomes: [CallOutcome; 2], sequential: &[(&str, ChangeKind)]) -> CaseRun {
        let mut pair = run(
            CaseKind::Concurrent,
            &[
                ("one call", &[("state/n", Added)]),
                ("both calls", &[("state/n", Added)]),
            ],
        );
        pair.fresh = true;
        pair.compared = Some(Delta::default());
        pair.outcomes = outcomes.to_vec();
        pair.sequential = Some(Sequential {
            difference: delta(sequential),
            both_ok: true,
        });
        pair
    }

    #[test]
    fn a_lost_update_is_flagged_only_when_both_calls_succeed_and_two_in_a_row_leave_more() {
        use CallOutcome::{Ok, ToolError};
        let honest = claims(Some(false), Some(true), Some(false));
        let lost = judge("t", &honest, pair([Ok, Ok], &[("state/n", Modified)]), None);
        assert!(lost.contradictions.is_empty(), "{}", lost.result);
        let flag = lost.lost_update.as_ref().expect("flagged");
        assert_eq!((flag.tool.as_str(), flag.case), ("t", CaseKind::Concurrent));
        assert!(
            lost.result.starts_with(
                "LOST UPDATE: both calls succeeded, but together they left the outcome of one call"
            ),
            "{}",
            lost.result
        );
        // One of the pair failed: one effect is what two replies said.
        let refused = judge(
            "t",
            &honest,
            pair([Ok, ToolError], &[("state/n", Modified)]),
            None,
        );
        assert!(refused.lost_update.is_none(), "{}", refused.result);
        // Two calls in a row leave what one leaves: the operation is idempotent, nothing lost.
        let same = judge("t", &honest, pair([Ok, Ok], &[]), None);
        assert!(same.lost_update.is_none(), "{}", same.result);
        assert!(
            same.result
                .contains("two identical calls at once left the same outcome as one call"),
            "{}",
            same.result
        );
        // A tool claiming only additive updates lost one: that contradicts destructiveHint.
        let additive = claims(Some(false), Some(false), None);
        let report = judge(
            "t",
            &additive,
            pair([Ok, Ok], &[("state/n", Modified)]),
            None,
        );
        let got: Vec<Claim> = report.contradictions.iter().map(|c| c.claim).collect();
        assert_eq!(got, [Claim::NonDestructive], "{}", report.result);
        assert!(report.lost_update.is_some());
    }

    #[test]
    fn a_claim_is_held_only_when_a_case_exercised_it() {
        use CallOutcome::{Ok, RpcError, ToolError};
        let all = claims(Some(false), Some(false), Some(true));
        let case = |kind: CaseKind, outcomes: &[CallOutcome], changes: &[(&str, ChangeKind)]| {
            let mut r = run(kind, &[("call", changes)]);
            r.outcomes = outcomes.to_vec();
            judge("t", &all, r, None)
        };
        // Fresh records only: destructiveHint=false is untested, idempotentHint=true held.
        let cases = vec![
            case(CaseKind::Valid, &[Ok], &[("state/a", Added)]),
            case(CaseKind::Repeat, &[Ok, Ok], &[]),
        ];
        let v = verdicts(&all, &cases);
        let got: Vec<(Claim, ClaimStatus)> = v.iter().map(|v| (v.claim, v.verdict)).collect();
        assert_eq!(
            got,
            [
                (Claim::Idempotent, ClaimStatus::Held),
                (Claim::NonDestructive, ClaimStatus::Untested)
            ]
        );
        assert_eq!(v[0].cases, [CaseKind::Repeat]);
        assert!(v[1].reason.contains("with_overwrite"), "{}", v[1].reason);
        assert_eq!(status(&all, &v), ToolStatus::Untested);
        // A repeat of a failed call repeats nothing: idempotentHint=true untested too.
        let failed = vec![case(CaseKind::Repeat, &[ToolError, Ok], &[])];
        assert_eq!(verdicts(&all, &failed)[0].verdict, ClaimStatus::Untested);
        // An overwrite the tool refused (an error result) tested it; a JSON-RPC error did not.
        for (outcome, expected) in [
            (ToolError, ClaimStatus::Held),
            (Ok, ClaimStatus::Held),
            (RpcError, ClaimStatus::Untested),
        ] {
            let cases = vec![case(CaseKind::Overwrite, &[outcome], &[])];
            assert_eq!(verdicts(&all, &cases)[1].verdict, expected, "{outcome:?}");
        }
        // An append to a record that existed before the call tested it too.
        let cases = vec![case(
            CaseKind::Repeat,
            &[Ok, Ok],
            &[("state/log", Appended)],
        )];
        assert_eq!(verdicts(&all, &cases)[1].verdict, ClaimStatus::Held);
        // A read-only tool that never succeeded: untested, and so is the implied claim.
        let reader = claims(Some(true), Some(false), None);
        let r = |outcomes: &[CallOutcome]| {
            let mut r = run(CaseKind::Valid, &[("call", &[])]);
            r.outcomes = outcomes.to_vec();
            vec![judge("t", &reader, r, None)]
        };
        let v = verdicts(&reader, &r(&[ToolError]));
        assert_eq!(
            v.iter().map(|v| v.verdict).collect::<Vec<_>>(),
            [ClaimStatus::Untested, ClaimStatus::Untested]
        );
        let v = verdicts(&reader, &r(&[Ok]));
        assert_eq!(
            v.iter().map(|v| v.verdict).collect::<Vec<_>>(),
            [ClaimStatus::Held, ClaimStatus::Held]
        );
        assert!(
            v[1].reason.contains("implied by readOnlyHint=true"),
            "{}",
            v[1].reason
        );
        assert_eq!(status(&reader, &v), ToolStatus::Consistent);
    }

    #[test]
    fn a_pair_that_could_not_be_compared_by_content_leaves_idempotent_hint_untested() {
        let mut counted = run(
            CaseKind::Concurrent,
            &[("both calls", &[("state/x", Added)])],
        );
        counted.fresh = true;
        counted.outcomes = vec![CallOutcome::Ok, CallOutcome::Ok];
        let mut repeat = run(CaseKind::Repeat, &[("call", &[])]);
        repeat.outcomes = vec![CallOutcome::Ok, CallOutcome::Ok];
        let one = delta(&[("state/w", Added)]);
        let cases = vec![
            judge("t", &IDEMPOTENT, repeat, None),
            judge("t", &IDEMPOTENT, counted, Some(&one)),
        ];
        let v = verdicts(&IDEMPOTENT, &cases);
        assert_eq!(v[0].verdict, ClaimStatus::Untested);
        assert_eq!(v[0].cases, [CaseKind::Repeat, CaseKind::Concurrent]);
        assert!(
            v[0].reason
                .contains("in case 'concurrent pair', the observer cannot restore state"),
            "{}",
            v[0].reason
        );
    }

    #[test]
    fn the_concurrent_pair_is_compared_by_content_with_one_call() {
        let mut pair = run(
            CaseKind::Concurrent,
            &[
                ("one call", &[("state/log.md", Modified)]),
                ("both calls", &[("state/log.md", Modified)]),
            ],
        );
        // Same number of changed records as one call, but the edit was applied twice.
        pair.compared = Some(delta(&[("state/log.md", Appended)]));
        pair.fresh = true;
        check(
            IDEMPOTENT,
            pair,
            &[Claim::Idempotent],
            "left other content than one call from the same starting state (one call's outcome to the pair's: appended state/log.md)",
        );
        let mut same = run(
            CaseKind::Concurrent,
            &[
                ("one call", &[("state/x", Added)]),
                ("both calls", &[("state/x", Added), ("state/y", Touched)]),
            ],
        );
        same.compared = Some(Delta::default());
        check(IDEMPOTENT, same, &[], "left the same outcome as one call");
        // Without a restorable observer: counts of content changes against case 1.
        let mut counted = run(
            CaseKind::Concurrent,
            &[("both calls", &[("state/x", Added), ("state/y", Touched)])],
        );
        counted.fresh = true;
        let one = delta(&[("state/w", Added)]);
        let report = judge("tool", &IDEMPOTENT, counted, Some(&one));
        assert!(report.contradictions.is_empty(), "{}", report.result);
        let mut doubled = run(
            CaseKind::Concurrent,
            &[("both calls", &[("state/x", Added), ("state/y", Added)])],
        );
        doubled.fresh = true;
        let report = judge("tool", &IDEMPOTENT, doubled, Some(&one));
        assert_eq!(report.contradictions.len(), 1, "{}", report.result);
    }
}
