//! `policy test` and `policy explain`: the policy (JSON and Cedar) decides requests stated by
//! hand, as the gate would decide them, without serving (feature `cedar`).

use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;
use toolgate::policy::cedar::{CedarPolicies, Explanation, Request, explain};

/// The policy at `path` and its Cedar policies validated against this binary's tools.
fn load(
    path: &Path,
) -> anyhow::Result<(
    toolgate::policy::Policy,
    Option<std::sync::Arc<CedarPolicies>>,
)> {
    let policy = crate::load_policy(path)?;
    let live = crate::contract::live_lockfile(&policy)?;
    let cedar =
        toolgate::contract::cedar_policies(&policy, &live).map_err(|e| anyhow::anyhow!(e))?;
    Ok((policy, cedar))
}

/// What a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Expect {
    /// The call runs.
    Allow,
    /// The tool is listed, the call refused.
    Deny,
    /// The tool is not listed, and a call of it is refused as unknown.
    Hidden,
}

/// One case of a `policy test` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// What the case is about, printed with its result.
    name: String,
    request: Request,
    expect: Expect,
    /// The Cedar policies expected to determine the decision, when given.
    #[serde(default)]
    policies: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    cases: Vec<Case>,
}

fn outcome(explained: &Explanation) -> Expect {
    match (explained.listed, explained.allowed) {
        (_, true) => Expect::Allow,
        (true, false) => Expect::Deny,
        (false, false) => Expect::Hidden,
    }
}

/// One line: the decision, its rule and the determining Cedar policies.
fn describe(explained: &Explanation) -> String {
    let decision = match outcome(explained) {
        Expect::Allow => "allow",
        Expect::Deny => "deny",
        Expect::Hidden => "hidden",
    };
    let mut line = format!("{decision} (rule {})", explained.rule);
    if let Some(cedar) = &explained.cedar {
        if cedar.determining.is_empty() {
            line.push_str("; Cedar: no determining policy");
        } else {
            line.push_str(&format!("; Cedar: {}", cedar.determining.join(", ")));
        }
        for error in &cedar.errors {
            line.push_str(&format!("; Cedar error: {error}"));
        }
    }
    line
}

/// Runs the cases of `cases_path` against the policy at `policy_path`: one line per case, and
/// whether every case matched.
pub fn test(policy_path: &Path, cases_path: &Path) -> anyhow::Result<(String, bool)> {
    let (policy, cedar) = load(policy_path)?;
    let text = std::fs::read_to_string(cases_path)
        .with_context(|| format!("cannot read the cases {}", cases_path.display()))?;
    let cases: Cases = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a file of cases (docs/policy.md, \"Testing policies\")",
            cases_path.display()
        )
    })?;
    let mut report = String::new();
    let mut failed = 0;
    for case in &cases.cases {
        let explained = explain(&policy, cedar.as_deref(), &case.request);
        let decided = explained
            .cedar
            .as_ref()
            .map(|answer| answer.determining.clone())
            .unwrap_or_default();
        let matched = outcome(&explained) == case.expect
            && case
                .policies
                .as_ref()
                .is_none_or(|expected| expected.as_slice() == &*decided);
        if !matched {
            failed += 1;
        }
        report.push_str(&format!(
            "{} {}: {}\n",
            if matched { "ok      " } else { "MISMATCH" },
            case.name,
            describe(&explained)
        ));
    }
    report.push_str(&format!(
        "{} case{}, {failed} mismatch{}",
        cases.cases.len(),
        if cases.cases.len() == 1 { "" } else { "s" },
        if failed == 1 { "" } else { "es" }
    ));
    Ok((report, failed == 0))
}

/// How the policy at `policy_path` decides `request`.
pub fn explain_one(policy_path: &Path, request: &Request) -> anyhow::Result<String> {
    let (policy, cedar) = load(policy_path)?;
    let explained = explain(&policy, cedar.as_deref(), request);
    Ok(format!(
        "{} for {}: {}\nlisted: {}",
        request.tool,
        request.principal.id,
        describe(&explained),
        if explained.listed { "yes" } else { "no" }
    ))
}
