//! Semantic drift probes: replay recorded inputs, compare the current output of each tool with its
//! recorded baseline through an injected [`Judge`], and grade the difference.
//!
//! Structural diffs cannot see a tool that keeps its schemas but starts answering differently, so
//! probes look at outputs. The module is pure mechanism: the caller supplies both the judge (an
//! LLM adapter, an embedding service, or the offline [`StructuralJudge`]) and the function that
//! produces current outputs, so this module never performs network or process I/O itself. A probe
//! that cannot be judged degrades to a neutral score instead of blocking a release: drift probes
//! are advisory evidence, while blocking decisions belong to the lockfile diff.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Judges how similar the current output of a tool is to its baseline for the same input: a score
/// in [0, 1]. Injected by the caller: this module never performs network I/O itself.
pub trait Judge {
    /// The similarity of `current` to `baseline`, both outputs of `tool` for `input`; 1 means the
    /// same meaning, 0 unrelated. A value outside [0, 1] or NaN is treated as a failed probe.
    fn similarity(
        &self,
        tool: &str,
        input: &Value,
        baseline: &Value,
        current: &Value,
    ) -> Result<f64, JudgeError>;
}

/// Why a judge could not score a probe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JudgeError {
    /// The judge could not be consulted (service down, timeout, quota).
    #[error("the judge is unavailable: {reason}; the probe was scored neutral, retry later")]
    Unavailable {
        /// What the adapter reported.
        reason: String,
    },
    /// The judge answered, but not with a usable score.
    #[error("the judge gave an unusable answer: {reason}; check the judge adapter's parsing")]
    InvalidResponse {
        /// What was wrong with the answer.
        reason: String,
    },
}

/// How far a tool's output drifted from its baseline, ordered from none to high so that the worst
/// of several levels is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftLevel {
    /// Score >= 0.95.
    None,
    /// 0.75 <= score < 0.95.
    Low,
    /// 0.5 <= score < 0.75; also the level of a degraded probe.
    Medium,
    /// Score < 0.5.
    High,
}

impl DriftLevel {
    /// The level for `score`. Every comparison with NaN is false, so NaN falls through to `High`,
    /// the conservative answer; [`run_probes`] never passes NaN because it degrades such a score
    /// first. Scores above 1 map to `None` and below 0 to `High`; nothing here panics.
    pub fn from_score(score: f64) -> Self {
        if score >= 0.95 {
            DriftLevel::None
        } else if score >= 0.75 {
            DriftLevel::Low
        } else if score >= 0.5 {
            DriftLevel::Medium
        } else {
            DriftLevel::High
        }
    }

    /// `"none"`, `"low"`, `"medium"` or `"high"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftLevel::None => "none",
            DriftLevel::Low => "low",
            DriftLevel::Medium => "medium",
            DriftLevel::High => "high",
        }
    }
}

impl std::fmt::Display for DriftLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The score given to a probe that could not be judged: the middle of the scale, level `Medium`,
/// visible enough to be looked at, not low enough to block anything.
pub const NEUTRAL_SCORE: f64 = 0.5;

/// One recorded probe: an input and the output the tool gave for it when the baseline was taken.
/// Stored as one JSON object per line (JSON Lines), see [`load_cases`] and [`write_cases`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Unknown keys are rejected so a misspelt field in a hand-edited case file is an error, not a
// silently ignored line.
#[serde(deny_unknown_fields)]
pub struct ProbeCase {
    /// The tool's name.
    pub tool: String,
    /// The recorded arguments.
    pub input: Value,
    /// The tool's output for `input` when the baseline was recorded.
    pub baseline: Value,
}

/// Why a probe case file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeLoadError {
    /// Reading failed (including a line that is not UTF-8).
    #[error("cannot read probe cases at line {line}: {source}; check the file is readable UTF-8")]
    Io {
        /// The 1-based line being read.
        line: usize,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a JSON object with exactly `tool`, `input` and `baseline`.
    #[error(
        "probe case at line {line} is invalid: {source}; each line must be a JSON object \
         {{\"tool\": ..., \"input\": ..., \"baseline\": ...}}"
    )]
    Json {
        /// The 1-based line.
        line: usize,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A line names no tool.
    #[error("probe case at line {line} has an empty tool name; record the tool the case probes")]
    EmptyTool {
        /// The 1-based line.
        line: usize,
    },
}

/// Loads probe cases from JSON Lines: one [`ProbeCase`] object per line. Blank lines (only
/// whitespace) are skipped so a trailing newline or a separating blank line is harmless; any
/// other line that is not a valid case is an error naming its 1-based line number.
pub fn load_cases<R: BufRead>(reader: R) -> Result<Vec<ProbeCase>, ProbeLoadError> {
    let mut cases = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line_no = index + 1;
        let line = line.map_err(|source| ProbeLoadError::Io {
            line: line_no,
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let case: ProbeCase =
            serde_json::from_str(&line).map_err(|source| ProbeLoadError::Json {
                line: line_no,
                source,
            })?;
        if case.tool.is_empty() {
            return Err(ProbeLoadError::EmptyTool { line: line_no });
        }
        cases.push(case);
    }
    Ok(cases)
}

/// Writes `cases` as JSON Lines, the format [`load_cases`] reads: one compact object per line,
/// each followed by `"\n"`.
pub fn write_cases<W: Write>(mut writer: W, cases: &[ProbeCase]) -> std::io::Result<()> {
    for case in cases {
        // Compact serde_json output escapes control characters inside strings, so a case never
        // spans two lines.
        serde_json::to_writer(&mut writer, case)?;
        writer.write_all(b"\n")?;
    }
    writer.flush()
}

/// The outcome of one probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeResult {
    /// The probed tool.
    pub tool: String,
    /// The similarity in [0, 1], or [`NEUTRAL_SCORE`] when degraded.
    pub score: f64,
    /// The level of `score`.
    pub level: DriftLevel,
    /// Why the probe could not be judged, when it could not.
    pub degraded: Option<String>,
}

/// For each case: current = current_output(tool, input); score = judge.similarity(...). A failing
/// probe (current_output error, judge error, score NaN or outside \[0,1\]) degrades to the neutral
/// score 0.5 (level Medium) with `degraded` saying why, instead of blocking.
///
/// Results are in the order of `cases`, one per case; a failure never stops the other probes.
pub fn run_probes(
    judge: &dyn Judge,
    cases: &[ProbeCase],
    current_output: &mut dyn FnMut(&str, &Value) -> Result<Value, String>,
) -> Vec<ProbeResult> {
    cases
        .iter()
        .map(|case| {
            let scored = current_output(&case.tool, &case.input)
                .map_err(|err| format!("the current output could not be produced: {err}"))
                .and_then(|current| {
                    judge
                        .similarity(&case.tool, &case.input, &case.baseline, &current)
                        .map_err(|err| err.to_string())
                })
                .and_then(|score| {
                    if (0.0..=1.0).contains(&score) {
                        Ok(score)
                    } else {
                        Err(format!("the judge returned {score}, outside [0, 1]"))
                    }
                });
            match scored {
                Ok(score) => ProbeResult {
                    tool: case.tool.clone(),
                    score,
                    level: DriftLevel::from_score(score),
                    degraded: None,
                },
                Err(reason) => ProbeResult {
                    tool: case.tool.clone(),
                    score: NEUTRAL_SCORE,
                    level: DriftLevel::from_score(NEUTRAL_SCORE),
                    degraded: Some(reason),
                },
            }
        })
        .collect()
}

/// The worst level among `results`; `None` when there are no results, since no probe observed any
/// drift (whether zero probes is enough evidence is the caller's policy).
pub fn summarize(results: &[ProbeResult]) -> DriftLevel {
    results
        .iter()
        .map(|result| result.level)
        .max()
        .unwrap_or(DriftLevel::None)
}

/// A deterministic structural judge for tests and offline CI. It ignores meaning and compares
/// shape and values:
///
/// each value is flattened to (JSON pointer, leaf) pairs, where a leaf is a scalar or an empty
/// array or object. With `B` and `C` the pointer sets of baseline and current, `S = B ∩ C`, and
/// `E` the pointers of `S` whose leaves are equal,
///
/// `score = 0.5 * |S| / |B ∪ C| + 0.5 * |E| / |S|` (the second term is 0 when `S` is empty).
///
/// Identical values score 1.0; values sharing no pointer score 0.0; one changed leaf among `n`
/// scores `0.5 + 0.5 * (n - 1) / n`. Numbers compare as serde_json does (`1` differs from `1.0`).
#[derive(Debug, Clone, Copy, Default)]
pub struct StructuralJudge;

impl Judge for StructuralJudge {
    fn similarity(
        &self,
        _tool: &str,
        _input: &Value,
        baseline: &Value,
        current: &Value,
    ) -> Result<f64, JudgeError> {
        let baseline = flatten(baseline);
        let current = flatten(current);
        let mut shared = 0usize;
        let mut equal = 0usize;
        for (pointer, leaf) in &baseline {
            if let Some(other) = current.get(pointer) {
                shared += 1;
                if leaf == other {
                    equal += 1;
                }
            }
        }
        // Both maps hold at least the root's leaves, so the union is never empty; the guard only
        // keeps the division total.
        let union = baseline.len() + current.len() - shared;
        if union == 0 || shared == 0 {
            return Ok(0.0);
        }
        let jaccard = shared as f64 / union as f64;
        let agreement = equal as f64 / shared as f64;
        Ok(0.5 * jaccard + 0.5 * agreement)
    }
}

/// (RFC 6901 pointer, leaf) pairs of `value`. Iterative rather than recursive so that a value
/// nested deeper than the stack allows (built in memory, not parsed) cannot overflow it.
fn flatten(value: &Value) -> BTreeMap<String, &Value> {
    let mut leaves = BTreeMap::new();
    let mut stack = vec![(String::new(), value)];
    while let Some((pointer, value)) = stack.pop() {
        match value {
            Value::Array(items) if !items.is_empty() => {
                for (index, item) in items.iter().enumerate() {
                    stack.push((format!("{pointer}/{index}"), item));
                }
            }
            Value::Object(map) if !map.is_empty() => {
                for (key, item) in map {
                    let escaped = key.replace('~', "~0").replace('/', "~1");
                    stack.push((format!("{pointer}/{escaped}"), item));
                }
            }
            leaf => {
                leaves.insert(pointer, leaf);
            }
        }
    }
    leaves
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flatten_escapes_pointers_and_keeps_empty_containers() {
        let value = json!({"a/b": {"~": 1}, "e": [], "o": {}, "l": [true]});
        let flat = flatten(&value);
        let keys: Vec<&str> = flat.keys().map(String::as_str).collect();
        assert_eq!(keys, ["/a~1b/~0", "/e", "/l/0", "/o"]);
        assert_eq!(flatten(&json!(3)).keys().collect::<Vec<_>>(), [""]);
    }

    #[test]
    fn flatten_survives_deep_nesting() {
        let mut value = json!(0);
        for _ in 0..20_000 {
            value = Value::Array(vec![value]);
        }
        assert_eq!(flatten(&value).len(), 1);
        // Dropping a deeply nested serde_json::Value recurses; leak it so the test measures only
        // `flatten`.
        std::mem::forget(value);
    }
}
