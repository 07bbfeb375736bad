//! The lock check as one library call: [`check_lock`] scans a server's handlers, computes its live
//! contract and the violations of the contract rules, and either compares the result with the
//! committed lockfile or, in update mode, writes it durably. `cargo xtask lock [--check]` is a
//! thin caller; so is a server's own test, in the manner of expect-test and insta:
//!
//! ```rust,no_run
//! # fn my_tools() -> Vec<rmcp::model::Tool> { Vec::new() }
//! // The body of a #[test] in the server's tests/lock.rs: the crate's policy.json, src/ and
//! // toolgate.lock; TOOLGATE_UPDATE_LOCK=1 rewrites the lockfile.
//! let check = toolgate::contract::LockCheck::in_crate(
//!     env!("CARGO_MANIFEST_DIR"),
//!     "my-server",
//!     my_tools(),
//! );
//! let report = toolgate::contract::check_lock(&check).unwrap();
//! assert!(report.passed(), "{report}");
//! ```
//!
//! A server that ships without its sources publishes its contract digest with
//! [`crate::contract::live_lockfile`] instead, which needs no scanner.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::model::Tool;
use serde_json::json;
use toolgate_contract::check::{
    CheckError, CheckOutcome, ReportFormat, Violation, check_lockfile, render_report,
    write_lockfile,
};
use toolgate_contract::diff::{Change, Verdict};
use toolgate_contract::lockfile::Lockfile;
use toolgate_policy::{Policy, PolicyError};
use toolgate_storage::{FsStorage, Storage};

use crate::live::{
    ContractBuildError, ScannedHandler, TOOLGATE_VERSION, effect_class_violations, server_contract,
    tool_definition,
};
use toolgate_scan::{ScanError, check_claims, find_tool_handlers, scan_handlers};

/// Scans the handlers of `tools` in `source_roots` (every `#[tool]` fn) and returns their
/// entitlements, plus a violation for every tool whose annotations claim `readOnlyHint: true`
/// while its handler writes files, spawns a process or opens a connection.
pub fn scan_sources(
    source_roots: &[std::path::PathBuf],
    tools: &[Tool],
) -> Result<(BTreeMap<String, ScannedHandler>, Vec<Violation>), ScanError> {
    let handlers = find_tool_handlers(source_roots)?;
    let reports = scan_handlers(source_roots, &handlers)?;
    let mut violations = Vec::new();
    for tool in tools {
        if let Some(report) = reports.get(tool.name.as_ref())
            && let Some(violation) = check_claims(&tool_definition(tool), report)
        {
            violations.push(Violation {
                tool: violation.tool.clone(),
                message: violation.to_string(),
            });
        }
    }
    let scans = reports
        .into_iter()
        .map(|(tool, report)| {
            let scan = ScannedHandler {
                entitlements: report.entitlements,
                evasion: report.evasion_kinds(),
                unresolved: report.unresolved_calls(),
            };
            (tool, scan)
        })
        .collect();
    Ok((scans, violations))
}

/// The environment variable that puts [`LockMode::from_env`] in update mode: run the lock test
/// with `TOOLGATE_UPDATE_LOCK=1` to rewrite the lockfile, review the diff, commit it.
pub const UPDATE_LOCK_ENV: &str = "TOOLGATE_UPDATE_LOCK";

/// Whether [`check_lock`] compares or rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Compare the live contract with the committed lockfile; write nothing.
    Check,
    /// Write the live contract to the lockfile unless the live code breaks a contract rule (a
    /// lockfile that would record a lie is never written). Nothing is written when the file is
    /// already up to date.
    Update,
}

impl LockMode {
    /// [`LockMode::Update`] when [`UPDATE_LOCK_ENV`] is `1`, else [`LockMode::Check`] (so a
    /// misspelt value checks, and the failing check names the variable).
    pub fn from_env() -> LockMode {
        match std::env::var_os(UPDATE_LOCK_ENV) {
            Some(value) if value == "1" => LockMode::Update,
            _ => LockMode::Check,
        }
    }
}

/// Where the policy of a [`LockCheck`] comes from.
#[derive(Debug, Clone)]
enum PolicySource {
    File(PathBuf),
    Loaded(Arc<Policy>),
}

/// What [`check_lock`] checks: one server's tools, gated by a policy, with the handlers found in
/// source roots, against a lockfile.
#[derive(Debug, Clone)]
#[must_use]
pub struct LockCheck {
    server_name: String,
    tools: Vec<Tool>,
    policy: PolicySource,
    sources: Vec<PathBuf>,
    lockfile: PathBuf,
    shown_as: String,
    mode: LockMode,
    fix_hint: String,
    storage: Arc<dyn Storage>,
}

impl LockCheck {
    /// A check of `server_name` (the `serverName` the lockfile records), whose `tools` are gated
    /// by `policy` and handled by `#[tool]` functions under `sources`, against `lockfile`. Mode
    /// [`LockMode::Check`]; the fix hint says to run the lock test again with
    /// `TOOLGATE_UPDATE_LOCK=1`.
    pub fn new(
        server_name: impl Into<String>,
        tools: Vec<Tool>,
        policy: impl Into<Arc<Policy>>,
        sources: impl IntoIterator<Item = impl Into<PathBuf>>,
        lockfile: impl Into<PathBuf>,
    ) -> LockCheck {
        LockCheck::with_policy(
            server_name.into(),
            tools,
            PolicySource::Loaded(policy.into()),
            sources.into_iter().map(Into::into).collect(),
            lockfile.into(),
        )
    }

    fn with_policy(
        server_name: String,
        tools: Vec<Tool>,
        policy: PolicySource,
        sources: Vec<PathBuf>,
        lockfile: PathBuf,
    ) -> LockCheck {
        let shown_as = lockfile.file_name().map_or_else(
            || lockfile.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        LockCheck {
            server_name,
            tools,
            policy,
            sources,
            fix_hint: format!(
                "run the lock test again with {UPDATE_LOCK_ENV}=1 and commit {shown_as}"
            ),
            lockfile,
            shown_as,
            mode: LockMode::Check,
            storage: Arc::new(FsStorage),
        }
    }

    /// The check a test in a server's own crate runs, by convention: the policy
    /// `<crate>/policy.json` (loaded by [`check_lock`]), the handlers under `<crate>/src`, the
    /// lockfile `<crate>/toolgate.lock`, the mode from [`LockMode::from_env`], and a fix hint
    /// naming the exact command, ``run `TOOLGATE_UPDATE_LOCK=1 cargo test -p PACKAGE` and
    /// commit toolgate.lock`` (the package from `CARGO_PKG_NAME`, which cargo sets when it runs
    /// tests). Pass `env!("CARGO_MANIFEST_DIR")` as `crate_dir`.
    pub fn in_crate(
        crate_dir: impl AsRef<Path>,
        server_name: impl Into<String>,
        tools: Vec<Tool>,
    ) -> LockCheck {
        let dir = crate_dir.as_ref();
        let package = std::env::var("CARGO_PKG_NAME")
            .map(|name| format!(" -p {name}"))
            .unwrap_or_default();
        let check = LockCheck::with_policy(
            server_name.into(),
            tools,
            PolicySource::File(dir.join("policy.json")),
            vec![dir.join("src")],
            dir.join("toolgate.lock"),
        )
        .mode(LockMode::from_env());
        let hint = format!(
            "run `{UPDATE_LOCK_ENV}=1 cargo test{package}` and commit {}",
            check.shown_as
        );
        check.fix_hint(hint)
    }

    /// Reads the policy from `path` when the check runs (an error there is the check's error).
    pub fn policy_file(mut self, path: impl Into<PathBuf>) -> LockCheck {
        self.policy = PolicySource::File(path.into());
        self
    }

    /// Compare or rewrite.
    pub fn mode(mut self, mode: LockMode) -> LockCheck {
        self.mode = mode;
        self
    }

    /// What the report tells its reader to do when the lockfile is stale, for example
    /// ``run `cargo xtask lock` and commit the result``.
    pub fn fix_hint(mut self, hint: impl Into<String>) -> LockCheck {
        self.fix_hint = hint.into();
        self
    }

    /// How the report names the lockfile (default its file name): in GitHub annotations this
    /// should be its path from the repository root.
    pub fn shown_as(mut self, name: impl Into<String>) -> LockCheck {
        self.shown_as = name.into();
        self
    }

    /// The storage the update mode writes through (default the real filesystem; tests pass a
    /// fault-injecting one).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> LockCheck {
        self.storage = storage;
        self
    }
}

/// Why a lock check could not run at all (as opposed to finding drift or violations).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The policy file could not be loaded.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The handlers' sources could not be scanned.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The live contract could not be computed.
    #[error(transparent)]
    Contract(#[from] ContractBuildError),
    /// The lockfile could not be read or written.
    #[error(transparent)]
    Io(#[from] CheckError),
}

/// What a lock check found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockOutcome {
    /// The committed lockfile was compared with the live contract (check mode, or update mode
    /// with nothing to write).
    Checked(CheckOutcome),
    /// Update mode: the live contract replaced the committed lockfile, which differed as
    /// `replaced` says.
    Written {
        /// How the old file differed.
        replaced: CheckOutcome,
    },
    /// Update mode: nothing was written because the live code breaks contract rules;
    /// `found` is what a check found.
    Refused {
        /// The comparison with the committed lockfile.
        found: CheckOutcome,
    },
}

/// The result of [`check_lock`]: what was found or done, the violations, and the live lockfile.
/// `Display` renders it as text; [`LockReport::render`] as JSON or GitHub annotations too.
#[derive(Debug, Clone)]
pub struct LockReport {
    /// What was found or done.
    pub outcome: LockOutcome,
    /// Contract rules the live code breaks: annotations that lie about the handler, effect
    /// classes that contradict the tool.
    pub violations: Vec<Violation>,
    /// The live lockfile (what the code and the policy imply now).
    pub live: Lockfile,
    shown_as: String,
    fix_hint: String,
}

impl LockReport {
    /// Whether the check passes: the lockfile is (now) the live contract and no rule is broken.
    pub fn passed(&self) -> bool {
        match &self.outcome {
            LockOutcome::Checked(outcome) => outcome.is_up_to_date() && self.violations.is_empty(),
            LockOutcome::Written { .. } => true,
            LockOutcome::Refused { .. } => false,
        }
    }

    /// The report in `format`. A check renders exactly as
    /// [`toolgate_contract::check::render_report`]; an update names what was written or why
    /// nothing was.
    pub fn render(&self, format: ReportFormat) -> String {
        let (shown, hint) = (self.shown_as.as_str(), self.fix_hint.as_str());
        match &self.outcome {
            LockOutcome::Checked(outcome) => {
                render_report(outcome, &self.violations, format, shown, hint)
            }
            LockOutcome::Refused { .. } => {
                let not_written =
                    format!("{shown} was not written: fix the violations above first");
                match format {
                    ReportFormat::Json => {
                        let mut value = report_json(&self.violations, "not_written", &[]);
                        value["fix"] = json!(not_written);
                        format!("{value}\n")
                    }
                    _ => {
                        let violations = render_report(
                            &CheckOutcome::UpToDate,
                            &self.violations,
                            format,
                            shown,
                            hint,
                        );
                        // Only the violations: the lockfile's state is beside the point.
                        let violations: String = violations
                            .lines()
                            .filter(|l| l.starts_with("VIOLATION") || l.starts_with("::"))
                            .map(|l| format!("{l}\n"))
                            .collect();
                        match format {
                            ReportFormat::Github => format!(
                                "{violations}::error file={}::{not_written}\n",
                                github_prop(shown)
                            ),
                            _ => format!("{violations}{not_written}\n"),
                        }
                    }
                }
            }
            LockOutcome::Written { replaced } => {
                let changes = match replaced {
                    CheckOutcome::Drift { changes, .. } => changes.as_slice(),
                    CheckOutcome::UpToDate => &[],
                };
                let wrote = format!(
                    "wrote {shown}: {} tools, integrity sha256:{}",
                    self.live.contract().tools.len(),
                    self.live.integrity_digest()
                );
                match format {
                    ReportFormat::Json => {
                        let mut value = report_json(&self.violations, "written", changes);
                        value["integrity"] =
                            json!(format!("sha256:{}", self.live.integrity_digest()));
                        format!("{value}\n")
                    }
                    ReportFormat::Github => {
                        format!("::notice file={}::{wrote}\n", github_prop(shown))
                    }
                    _ => {
                        let mut out = format!("{wrote}\n");
                        for change in changes {
                            out.push_str(&format!(
                                "  {} {}: {} ({})\n",
                                change.verdict.as_str(),
                                change.tool,
                                change.detail,
                                change.rule
                            ));
                        }
                        if changes.iter().any(|c| c.verdict != Verdict::Cosmetic) {
                            out.push_str("review these changes before you commit it\n");
                        }
                        out
                    }
                }
            }
        }
    }
}

impl fmt::Display for LockReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(ReportFormat::Text))
    }
}

fn github_prop(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
        .replace(':', "%3A")
        .replace(',', "%2C")
}

fn report_json(violations: &[Violation], status: &str, changes: &[Change]) -> serde_json::Value {
    json!({
        "status": status,
        "changes": changes.iter().map(|c| json!({
            "tool": c.tool, "verdict": c.verdict.as_str(), "rule": c.rule, "detail": c.detail,
        })).collect::<Vec<_>>(),
        "violations": violations.iter()
            .map(|v| json!({"tool": v.tool, "message": v.message}))
            .collect::<Vec<_>>(),
    })
}

/// The Cedar policies the policy names, validated against the live contract's tools as a gate
/// validates them: each problem is a violation (BREAKING: a server with this contract and this
/// policy refuses to start), naming the policy and its line. A build without the feature
/// `cedar` reports a policy that names Cedar policies as one violation.
fn cedar_violations(policy: &Policy, live: &Lockfile) -> Vec<Violation> {
    if policy.cedar().is_none() {
        return Vec::new();
    }
    #[cfg(feature = "cedar")]
    let error = match toolgate_rmcp::contract::cedar_policies(policy, live) {
        Ok(_) => return Vec::new(),
        Err(error) => error,
    };
    #[cfg(not(feature = "cedar"))]
    let error: Box<dyn std::error::Error> = {
        let _ = live;
        "the policy names Cedar policies and this build has no Cedar support (feature `cedar`)"
            .into()
    };
    #[cfg(feature = "cedar")]
    if let Some(toolgate_policy::cedar::CedarError::Invalid {
        source_name,
        problems,
    }) = error.downcast_ref::<toolgate_policy::cedar::CedarError>()
    {
        return problems
            .iter()
            .map(|problem| Violation {
                tool: "cedar".to_owned(),
                message: format!(
                    "BREAKING: {source_name}: {problem}; the Cedar policies no longer fit the tools' contracts, fix the policy or the tool"
                ),
            })
            .collect();
    }
    vec![Violation {
        tool: "cedar".to_owned(),
        message: format!("BREAKING: {error}"),
    }]
}

/// `found` with a `cedar.policy_broken` (BREAKING) change for each changed tool whose new
/// contract leaves a Cedar policy unfit that fitted the committed contract: the committed tools
/// with that one tool as it is now are validated as a gate validates them. (Every problem of
/// the live contract is a violation besides, [`cedar_violations`].)
fn cedar_breakage(
    policy: &Policy,
    lockfile: &Path,
    live: &Lockfile,
    found: CheckOutcome,
) -> CheckOutcome {
    #[cfg(feature = "cedar")]
    if let (
        Some(source),
        CheckOutcome::Drift {
            reason: toolgate_contract::check::DriftReason::Changed,
            changes,
        },
    ) = (policy.cedar(), &found)
    {
        use toolgate_policy::cedar::{CedarError, CedarPolicies};
        let Some(committed) = toolgate_contract::check::committed_lockfile(lockfile) else {
            return found;
        };
        let signatures = |lock: &Lockfile| -> Vec<toolgate_policy::ToolSignature> {
            toolgate_rmcp::contract::tool_signatures(lock)
                .iter()
                .map(|tool| policy.signature(tool))
                .collect()
        };
        let (old, new) = (signatures(&committed), signatures(live));
        if CedarPolicies::from_source(source, &old).is_err() {
            return found; // unfit before this change: not its doing
        }
        let mut changes = changes.clone();
        let tools: std::collections::BTreeSet<String> = changes
            .iter()
            .filter(|change| !change.tool.is_empty())
            .map(|change| change.tool.clone())
            .collect();
        for tool in tools {
            let mut with_it: Vec<_> = old.iter().filter(|t| t.name != tool).cloned().collect();
            with_it.extend(new.iter().find(|t| t.name == tool).cloned());
            if let Err(CedarError::Invalid {
                source_name,
                problems,
            }) = CedarPolicies::from_source(source, &with_it)
            {
                changes.extend(problems.iter().map(|problem| {
                    toolgate_contract::diff::cedar_policy_broken(
                        &tool,
                        format!("{source_name}: {problem}"),
                    )
                }));
            }
        }
        toolgate_contract::diff::sort(&mut changes);
        return CheckOutcome::Drift {
            reason: toolgate_contract::check::DriftReason::Changed,
            changes,
        };
    }
    let _ = (policy, lockfile, live);
    found
}

/// Runs `check`: scans the handlers, computes the live contract, the scan's violations and the
/// effect-class violations ([`effect_class_violations`]), then compares with the committed
/// lockfile or, in update mode, writes it durably (through the storage floor's `replace_file`)
/// unless there are violations. An `Err` means the check could not run; drift and violations
/// are in the report ([`LockReport::passed`]).
pub fn check_lock(check: &LockCheck) -> Result<LockReport, LockError> {
    let policy = match &check.policy {
        PolicySource::File(path) => Arc::new(Policy::load(path)?),
        PolicySource::Loaded(policy) => Arc::clone(policy),
    };
    let (scans, mut violations) = scan_sources(&check.sources, &check.tools)?;
    violations.extend(effect_class_violations(&policy, &check.tools, &scans));
    let contract = server_contract(&check.server_name, &check.tools, &policy, &scans)?;
    let live = Lockfile::new(contract, TOOLGATE_VERSION);
    violations.extend(cedar_violations(&policy, &live));
    let found = cedar_breakage(
        &policy,
        &check.lockfile,
        &live,
        check_lockfile(&check.lockfile, &live)?,
    );
    let outcome = match (check.mode, found) {
        (LockMode::Check, found) => LockOutcome::Checked(found),
        (LockMode::Update, CheckOutcome::UpToDate) if violations.is_empty() => {
            LockOutcome::Checked(CheckOutcome::UpToDate)
        }
        (LockMode::Update, found) if !violations.is_empty() => LockOutcome::Refused { found },
        (LockMode::Update, replaced) => {
            write_lockfile(check.storage.as_ref(), &check.lockfile, &live)?;
            LockOutcome::Written { replaced }
        }
    };
    Ok(LockReport {
        outcome,
        violations,
        live,
        shown_as: check.shown_as.clone(),
        fix_hint: check.fix_hint.clone(),
    })
}
