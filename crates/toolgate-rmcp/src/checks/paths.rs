//! The path containment check: a path argument the policy's path rule allows lexically is
//! resolved on the real filesystem (`toolgate_storage::paths::resolve_within`, symbolic links
//! followed) and refused when it leaves its roots.

use std::path::PathBuf;

use toolgate_storage::paths::resolve_within;

/// The check: a path argument that lies inside its roots lexically (the policy's decision) but
/// leaves them through a symbolic link is refused, checked now on the real filesystem.
#[derive(Debug, Default)]
pub(crate) struct PathContainment;

impl super::Check for PathContainment {
    fn admit<'a>(&'a self, call: &'a super::Call<'a>) -> super::Verdict<'a> {
        match path_refusal(call.policy(), call.principal, call.name, call.arguments) {
            Some(refusal) => super::Verdict::Refuse(refusal),
            None => super::Verdict::Pass,
        }
    }
}

/// The refusal of the first path argument of `name` that resolves outside its roots.
pub(crate) fn path_refusal(
    policy: &toolgate_policy::Policy,
    principal: &str,
    name: &str,
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Option<crate::refusal::Refusal> {
    for (field, rule) in policy.path_rules(Some(principal), name) {
        let Some(serde_json::Value::String(value)) = arguments.and_then(|a| a.get(field)) else {
            continue;
        };
        let Ok(normalised) = rule.normalise(value) else {
            continue; // the policy's own decision already refused it
        };
        let roots: Vec<PathBuf> = rule.roots().iter().map(Into::into).collect();
        if let Err(error) = resolve_within(&roots, &normalised) {
            let top_level = policy
                .arg_rules(name)
                .and_then(|rules| rules.get(field))
                .is_some_and(|r| r.path().is_some());
            let rule_id = if top_level {
                format!("arg_rules.{name}.{field}.path")
            } else {
                format!("principals.{principal}.arg_rules.{name}.{field}.path")
            };
            let fix = format!(
                "pass a path that stays inside {} without following links out of it",
                rule.roots().join(", ")
            );
            return Some(crate::refusal::Refusal::argument(
                name,
                field,
                rule_id.clone(),
                serde_json::json!({"roots": rule.roots(), "check": error.code()}),
                format!(
                    "Error: argument `{field}` of `{name}` resolves outside its allowed roots (policy rule {rule_id}: {}); {fix}",
                    error.code()
                ),
                &fix,
            ));
        }
    }
    None
}
