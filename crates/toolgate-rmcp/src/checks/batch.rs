//! The policy's `batch` section: a tool that acts on many items is called with explicit ids, or
//! with a filter and the `expected_count` of items it must match now (asked of the server's
//! [`Preflight::batch_matches`](crate::Preflight::batch_matches)), so a filter that matches more
//! than the caller believes never runs.

use std::sync::Arc;

use serde_json::{Value, json};
use toolgate_policy::BatchCall;

use super::{Call, Check, Verdict};
use crate::refusal::Refusal;
use crate::world::Preflight;

/// At most this many batch matches are returned with a count mismatch.
const MAX_BATCH_MATCHES_SHOWN: usize = 100;

/// The batch guard, with the server's matcher.
#[derive(Default)]
pub(crate) struct BatchGuard {
    pub(crate) preflight: Option<Arc<dyn Preflight>>,
}

impl Check for BatchGuard {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        let name = call.name;
        let Some(batch) = call.policy().batch(name) else {
            return Verdict::Pass;
        };
        let (filter, expected_count) = match batch.check(call.arguments) {
            Ok(BatchCall::Filter {
                filter,
                expected_count,
            }) => (filter, expected_count),
            Ok(_) => return Verdict::Pass,
            Err(violation) => {
                return Verdict::Refuse(Refusal {
                    rule: violation.rule(),
                    message: violation.message(),
                    details: json!({
                        "error": "batch_rejected",
                        "tool": name,
                        "rule": violation.rule(),
                        "fix": violation.message(),
                    }),
                });
            }
        };
        let rule = format!("batch.{name}.expected_count");
        let Some(preflight) = self.preflight.clone() else {
            let fix = "pass explicit ids instead of a filter";
            return Verdict::Refuse(Refusal {
                message: format!(
                    "Error: `{name}` cannot be called with a filter on this server (no batch matcher is configured; rule {rule}); nothing was executed. {fix}"
                ),
                details: json!({"error": "batch_rejected", "tool": name, "rule": rule, "fix": fix}),
                rule,
            });
        };
        Verdict::Later(Box::pin(async move {
            let (tool, caller) = (name.to_owned(), call.caller.clone());
            let matched = tokio::task::spawn_blocking(move || {
                preflight.batch_matches(&caller, &tool, &filter)
            })
            .await;
            match matched {
                Ok(Ok(matches)) => count_verdict(name, rule, matches, expected_count),
                failed => {
                    let why = match failed {
                        Ok(Err(why)) => why,
                        _ => "the matcher task failed".to_owned(),
                    };
                    let fix = "fix the filter or pass explicit ids";
                    Verdict::Refuse(Refusal {
                        message: format!(
                            "Error: the filter of `{name}` could not be evaluated ({why}); nothing was executed. {fix}"
                        ),
                        details: json!({"error": "batch_rejected", "tool": name, "rule": rule, "fix": fix}),
                        rule,
                    })
                }
            }
        }))
    }
}

/// Passes when the filter matches exactly `expected_count` items, else refuses with the matches.
fn count_verdict<'a>(
    name: &str,
    rule: String,
    matches: Vec<Value>,
    expected_count: u64,
) -> Verdict<'a> {
    let count = u64::try_from(matches.len()).unwrap_or(u64::MAX);
    if count == expected_count {
        return Verdict::Pass;
    }
    let fix = "check the matches; call again with explicit ids, or with a narrower filter and the right expected_count";
    let shown: Vec<Value> = matches.into_iter().take(MAX_BATCH_MATCHES_SHOWN).collect();
    Verdict::Refuse(Refusal {
        message: format!(
            "Error: the filter of `{name}` matches {count} items but expected_count is {expected_count} (rule {rule}); nothing was executed. {fix}"
        ),
        details: json!({
            "error": "batch_count_mismatch",
            "tool": name,
            "rule": rule,
            "expected_count": expected_count,
            "matched": count,
            "matches": shown,
            "fix": fix,
        }),
        rule,
    })
}
