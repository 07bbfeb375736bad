//! The mechanics of a lock check (`cargo xtask lock --check`, or a server's own test through
//! `toolgate::contract::check_lock`): compare a live lockfile with the committed one, render
//! the result for people, machines or GitHub Actions, and write a new lockfile durably.
//!
//! Nothing here names a command: the caller says how its users regenerate the lockfile (the fix
//! hint), because `cargo xtask lock` exists in this workspace and not in a user's server.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::diff::{Change, Verdict, diff};
use crate::lockfile::Lockfile;

/// Why a check or a write could not run at all (as opposed to finding drift).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// Reading or writing the lockfile failed.
    #[error("cannot {action} {path}: {source}; check the path and its permissions")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// A contract rule broken by the live code itself, independent of any lockfile: for example a
/// tool that claims `readOnlyHint: true` while its handler writes files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The tool.
    pub tool: String,
    /// What is wrong and where, for a reviewer.
    pub message: String,
}

/// Why the committed lockfile does not match the live contract.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DriftReason {
    /// There is no lockfile.
    Missing,
    /// The lockfile cannot be parsed or its digests do not verify.
    Unreadable(String),
    /// The contracts differ; `changes` says how.
    Changed,
    /// The contracts are equal but the bytes differ (another toolgate version, or a hand edit of
    /// formatting): rewriting is still required so that review sees canonical bytes.
    BytesOnly,
}

/// The result of comparing the live lockfile with the committed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// The committed lockfile is byte-identical to the live one.
    UpToDate,
    /// They differ.
    Drift {
        /// Why.
        reason: DriftReason,
        /// Every classified difference, most severe first (empty unless `reason` is `Changed`).
        changes: Vec<Change>,
    },
}

impl CheckOutcome {
    /// Whether the check passes.
    pub fn is_up_to_date(&self) -> bool {
        matches!(self, CheckOutcome::UpToDate)
    }
}

/// The text of the lockfile at `path`, `None` when there is none.
fn read_committed(path: &Path) -> Result<Option<String>, CheckError> {
    toolgate_storage::read_regular_text(
        path,
        crate::MAX_LOCKFILE_BYTES,
        toolgate_storage::Symlinks::Follow,
    )
    .map_err(|source| CheckError::Io {
        action: "read",
        path: path.to_owned(),
        source,
    })
}

/// The lockfile at `path`, when there is one and it parses (what [`check_lockfile`] compared
/// `live` with).
pub fn committed_lockfile(path: &Path) -> Option<Lockfile> {
    Lockfile::parse(&read_committed(path).ok()??).ok()
}

/// Compares `live` with the lockfile at `path`.
pub fn check_lockfile(path: &Path, live: &Lockfile) -> Result<CheckOutcome, CheckError> {
    let Some(committed) = read_committed(path)? else {
        return Ok(CheckOutcome::Drift {
            reason: DriftReason::Missing,
            changes: Vec::new(),
        });
    };
    let rendered = live.render();
    if committed == rendered {
        return Ok(CheckOutcome::UpToDate);
    }
    let old = match Lockfile::parse(&committed) {
        Ok(old) => old,
        Err(error) => {
            return Ok(CheckOutcome::Drift {
                reason: DriftReason::Unreadable(error.to_string()),
                changes: Vec::new(),
            });
        }
    };
    let changes = diff(old.contract(), live.contract());
    let reason = if changes.is_empty() {
        DriftReason::BytesOnly
    } else {
        DriftReason::Changed
    };
    Ok(CheckOutcome::Drift { reason, changes })
}

/// Writes `live` to `path` durably through `storage` (the storage floor's `replace_file`: a
/// temporary file in the same directory, fdatasync, rename over the old file, fsync of the
/// directory). A crash or a failed step leaves either the old or the new lockfile.
pub fn write_lockfile(
    storage: &dyn toolgate_storage::Storage,
    path: &Path,
    live: &Lockfile,
) -> Result<(), CheckError> {
    let dir = toolgate_storage::parent_of(path);
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| CheckError::Io {
            action: "use as a lockfile name",
            path: path.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
    toolgate_storage::replace_file(storage, dir, name, live.render().as_bytes()).map_err(|e| {
        CheckError::Io {
            action: e.op,
            path: e.path,
            source: e.source,
        }
    })
}

/// How to render a check result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReportFormat {
    /// For people: changes grouped by verdict, most severe first.
    Text,
    /// One JSON object for machines.
    Json,
    /// GitHub Actions workflow commands (`::error`, `::warning`, `::notice`).
    Github,
}

fn reason_text(reason: &DriftReason, lock: &str) -> String {
    match reason {
        DriftReason::Missing => format!("{lock} is missing"),
        DriftReason::Unreadable(why) => format!("{lock} cannot be used: {why}"),
        DriftReason::Changed => format!("the live tool contracts differ from {lock}"),
        DriftReason::BytesOnly => {
            format!("{lock} is not byte-identical to what this toolgate version writes")
        }
    }
}

/// Renders the outcome of a check (with any violations) in `format`. `lock_path` names the
/// lockfile in the text and in GitHub annotations (`toolgate.lock`, or its path from the
/// repository root); `fix_hint` tells the reader how to regenerate it (for example "run `cargo
/// xtask lock` and commit the result") and is shown whenever the lockfile is stale.
pub fn render_report(
    outcome: &CheckOutcome,
    violations: &[Violation],
    format: ReportFormat,
    lock_path: &str,
    fix_hint: &str,
) -> String {
    let mut out = String::new();
    match format {
        ReportFormat::Text => {
            for v in violations {
                let _ = writeln!(out, "VIOLATION {}: {}", v.tool, v.message);
            }
            match outcome {
                CheckOutcome::UpToDate => {
                    let _ = writeln!(out, "{lock_path} is up to date");
                }
                CheckOutcome::Drift { reason, changes } => {
                    let _ = writeln!(out, "{}", reason_text(reason, lock_path));
                    for verdict in [
                        Verdict::Breaking,
                        Verdict::Risky,
                        Verdict::Safe,
                        Verdict::Cosmetic,
                    ] {
                        let group: Vec<&Change> =
                            changes.iter().filter(|c| c.verdict == verdict).collect();
                        if group.is_empty() {
                            continue;
                        }
                        let _ = writeln!(out, "{} ({})", verdict.as_str(), group.len());
                        for change in group {
                            let _ = writeln!(
                                out,
                                "  {}: {} ({})",
                                change.tool, change.detail, change.rule
                            );
                        }
                    }
                    let _ = writeln!(out, "{fix_hint}");
                }
            }
        }
        ReportFormat::Json => {
            let (status, reason, changes) = match outcome {
                CheckOutcome::UpToDate => ("up_to_date", None, &[][..]),
                CheckOutcome::Drift { reason, changes } => (
                    "drift",
                    Some(reason_text(reason, lock_path)),
                    changes.as_slice(),
                ),
            };
            let value = json!({
                "status": status,
                "reason": reason,
                "changes": changes.iter().map(|c| json!({
                    "tool": c.tool, "verdict": c.verdict.as_str(), "rule": c.rule, "detail": c.detail,
                })).collect::<Vec<_>>(),
                "violations": violations.iter().map(|v| json!({"tool": v.tool, "message": v.message})).collect::<Vec<_>>(),
                "fix": if outcome.is_up_to_date() && violations.is_empty() { None } else { Some(fix_hint) },
            });
            let _ = writeln!(out, "{value}");
        }
        ReportFormat::Github => {
            // Workflow commands are one line each: messages escape %, CR and LF; property values
            // (file=, title=) also escape the separators `:` and `,`.
            let escape = |s: &str| {
                s.replace('%', "%25")
                    .replace('\r', "%0D")
                    .replace('\n', "%0A")
            };
            let prop = |s: &str| escape(s).replace(':', "%3A").replace(',', "%2C");
            let shown = lock_path;
            let lock_path = prop(lock_path);
            for v in violations {
                let _ = writeln!(
                    out,
                    "::error file={lock_path},title=contract violation in {}::{}",
                    prop(&v.tool),
                    escape(&v.message)
                );
            }
            if let CheckOutcome::Drift { reason, changes } = outcome {
                let _ = writeln!(
                    out,
                    "::error file={lock_path},title={} drift::{}; {}",
                    prop(shown),
                    escape(&reason_text(reason, shown)),
                    escape(fix_hint)
                );
                for change in changes {
                    let level = match change.verdict {
                        Verdict::Breaking => "error",
                        Verdict::Risky => "warning",
                        Verdict::Safe | Verdict::Cosmetic => "notice",
                    };
                    let _ = writeln!(
                        out,
                        "::{level} file={lock_path},title={} contract change in {}::{} ({})",
                        change.verdict.as_str(),
                        prop(&change.tool),
                        escape(&change.detail),
                        change.rule
                    );
                }
            }
        }
    }
    out
}
