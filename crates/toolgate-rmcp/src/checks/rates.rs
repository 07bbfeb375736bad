//! The rate-limit check over a [`RateStore`] (`toolgate_state::rates`).

use toolgate_state::{Limit, Limited, RateLimiter, RateStore};

/// The check: takes a token from the tool's and the principal's buckets (the policy's
/// `rate_limits`), all or nothing, or refuses with the seconds to wait. A call coming back
/// through `confirm_action` took its tokens at the preview.
#[derive(Debug)]
pub(crate) struct Rates {
    buckets: std::sync::Arc<dyn RateStore>,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            buckets: std::sync::Arc::new(RateLimiter::new()),
        }
    }
}

impl Rates {
    /// Buckets in `store`.
    pub(crate) fn with_store(buckets: std::sync::Arc<dyn RateStore>) -> Self {
        Rates { buckets }
    }

    /// Takes the tokens of `keys`: `Err` when the buckets could not be reached.
    fn take(&self, keys: &[(String, Limit)]) -> Result<Result<(), Limited>, String> {
        self.buckets.take(keys)
    }
}

fn limit(rate: toolgate_policy::Rate) -> Limit {
    Limit {
        burst: rate.burst,
        per_minute: rate.per_minute,
    }
}

impl super::Check for Rates {
    fn admit<'a>(&'a self, call: &'a super::Call<'a>) -> super::Verdict<'a> {
        if call.confirmed.is_some() {
            return super::Verdict::Pass;
        }
        let (policy, name, principal) = (call.policy(), call.name, call.principal);
        let mut keys = Vec::new();
        let mut rules = Vec::new();
        if let Some(rate) = policy.tool_rate(name) {
            keys.push((format!("tool:{name}"), limit(rate)));
            rules.push(format!("rate_limits.tools.{name}"));
        }
        if let Some(rate) = policy.principal_rate(principal) {
            keys.push((format!("principal:{principal}"), limit(rate)));
            rules.push(format!("rate_limits.principals.{principal}"));
        }
        if keys.is_empty() {
            return super::Verdict::Pass;
        }
        let limited = match self.take(&keys) {
            Ok(Ok(())) => return super::Verdict::Pass,
            Ok(Err(limited)) => limited,
            // Fail closed: a limit that cannot be counted admits nothing.
            Err(cause) => {
                tracing::error!(tool = %name, error = %cause, "the rate limits cannot be counted; refusing the call");
                return super::Verdict::Fail {
                    reason: toolgate_audit::Reason::RateLimitsUnavailable,
                    error: rmcp::ErrorData::internal_error(
                        format!(
                            "the rate limits of `{name}` cannot be counted ({cause}); nothing was executed; retry when the store is reachable"
                        ),
                        None,
                    ),
                };
            }
        };
        let rule = rules
            .get(limited.key_index)
            .cloned()
            .unwrap_or_else(|| "rate_limits".to_owned());
        let retry_after = limited.retry_after_secs();
        let fix = format!("retry after {retry_after} s");
        super::Verdict::Refuse(crate::refusal::Refusal {
            message: format!(
                "Error: `{name}` is over its rate limit (rule {rule}); nothing was executed. Retry after {retry_after} s"
            ),
            details: serde_json::json!({
                "error": "rate_limited",
                "tool": name,
                "rule": rule,
                "retry_after_secs": retry_after,
                "fix": fix,
            }),
            rule,
        })
    }
}
