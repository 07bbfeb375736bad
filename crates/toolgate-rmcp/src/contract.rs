//! The gate's part of a tool's contract: the stages a call passes through, recorded in
//! `toolgate.lock` (the rest of a server's live contract is the facade's, `toolgate::contract`).

use rmcp::ServerHandler;
use toolgate_policy::Policy;

use crate::Gated;

/// The gate stages a call of `tool` passes through, in the order of the check sequence: its
/// "middleware chain" as recorded in the contract, each stage `kind` or `kind:parameters`. Every
/// stage is a guarantee, so a stage that disappears is BREAKING (a lost confirmation, a lost
/// exactly-once), a new one SAFE, and changed parameters RISKY (`docs/lockfile.md`).
pub fn gate_stages(policy: &Policy, tool: &str) -> Vec<String> {
    let mut stages: Vec<String> = vec!["list_filter".into(), "call_decide".into()];
    if policy.cedar().is_some() {
        // Cedar decides lists and calls too (checks::cedar).
        stages.push("cedar".into());
    }
    if !policy.halt_exempt(tool) {
        stages.push("kill_switch".into());
    }
    stages.push("input_schema".into());
    if policy
        .arg_rules(tool)
        .is_some_and(|rules| !rules.is_empty())
    {
        stages.push("arg_rules".into());
    }
    if let Some(settings) = policy.idempotency(tool) {
        let effect = match settings.effect {
            toolgate_policy::EffectSafety::Idempotent => "idempotent",
            toolgate_policy::EffectSafety::Unsafe => "unsafe",
        };
        let key = settings.key_argument.as_deref().unwrap_or("_meta");
        stages.push(format!("exactly_once:{effect},key={key}"));
    }
    if policy.batch(tool).is_some() {
        stages.push("batch".into());
    }
    if let Some(rate) = policy.tool_rate(tool) {
        stages.push(format!("rate_limit:{}/{}", rate.burst, rate.per_minute));
    }
    if let Some(versioned) = policy.versions(tool) {
        stages.push(format!("versions:{}", versioned.argument()));
    }
    if let Some(guard) = policy.duplicates(tool) {
        stages.push(format!(
            "duplicates:{},update={}",
            guard.key().join("+"),
            guard.update_tool()
        ));
    }
    if let Some(class) = policy
        .effect_class(tool)
        .filter(|class| class.needs_confirmation())
    {
        stages.push(format!("confirmation:{class}"));
    }
    stages.push("permit".into());
    if let Some(fields) = policy.results(tool) {
        stages.push(format!("results:{}", fields.fields().join(",")));
    }
    if let Some(untrusted) = policy.untrusted_output(tool) {
        stages.push(format!("untrusted_output:{}", untrusted.fields().join(",")));
    }
    stages.push("audit".into());
    stages
}

impl<H: ServerHandler> Gated<H> {
    /// The gate stages of `tool` under this gate (see [`gate_stages`]).
    pub fn gate_stages(&self, tool: &str) -> Vec<String> {
        gate_stages(&self.policy(), tool)
    }
}

/// The tools of `live` (a server's live contract) as Cedar sees them: name, input schema and
/// annotations with the spec's defaults (their effect classes come from the policy).
pub fn tool_signatures(
    live: &toolgate_contract::lockfile::Lockfile,
) -> Vec<toolgate_policy::ToolSignature> {
    live.contract()
        .tools
        .iter()
        .map(|(name, contract)| {
            let hints = contract.behavior.annotations();
            toolgate_policy::ToolSignature {
                read_only: hints.read_only_hint,
                destructive: hints.destructive_hint,
                idempotent: hints.idempotent_hint,
                open_world: hints.open_world_hint,
                ..toolgate_policy::ToolSignature::new(
                    name.clone(),
                    contract.surface.input_schema().clone(),
                )
            }
        })
        .collect()
}

/// The Cedar policies `policy` names, validated against the tools of `live` exactly as a gate
/// validates them at build and reload (effect classes from the policy); `None` when it names
/// none. What `lock --check`, `policy test` and `policy explain` use.
#[cfg(feature = "cedar")]
pub fn cedar_policies(
    policy: &Policy,
    live: &toolgate_contract::lockfile::Lockfile,
) -> Result<
    Option<std::sync::Arc<toolgate_policy::cedar::CedarPolicies>>,
    Box<dyn std::error::Error + Send + Sync>,
> {
    crate::checks::cedar::compile(policy, Some(&tool_signatures(live)))
}
