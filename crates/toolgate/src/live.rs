//! A server's live contract from its rmcp tools and policy: the bridge from rmcp's tool model to
//! toolgate-contract's plain one ([`tool_definition`]), the contract of a gated server
//! ([`server_contract`], the gate's stages from `toolgate_rmcp::contract::gate_stages`), the
//! effect-class rules `lock --check` reports ([`effect_class_violations`]), and the contract of a
//! server that runs without its sources ([`live_lockfile`];
//! [`crate::GatedBuilderExt::locked_contract`] publishes it).

use std::collections::BTreeMap;

use rmcp::model::Tool;
use serde_json::Value;

use toolgate_contract::check::Violation;
use toolgate_contract::contract::{ServerContract, ToolContract};
use toolgate_contract::{Annotations, Entitlements, HandlerFacts, ToolDefinition};
use toolgate_policy::Policy;

/// The toolgate version recorded in the lockfiles toolgate writes (not part of any digest).
pub const TOOLGATE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `tool` as toolgate-contract sees it: name, description, schemas and the annotations as declared
/// (absent hints stay absent; the contract applies the spec's defaults).
pub fn tool_definition(tool: &Tool) -> ToolDefinition {
    let annotations = tool
        .annotations
        .as_ref()
        .map(|a| Annotations {
            read_only: a.read_only_hint,
            destructive: a.destructive_hint,
            idempotent: a.idempotent_hint,
            open_world: a.open_world_hint,
        })
        .unwrap_or_default();
    ToolDefinition {
        name: tool.name.to_string(),
        description: tool.description.as_ref().map(|d| d.to_string()),
        input_schema: Value::Object((*tool.input_schema).clone()),
        output_schema: tool
            .output_schema
            .as_ref()
            .map(|schema| Value::Object((**schema).clone())),
        annotations,
    }
}

/// The contract facts of `tool` under a gate with `policy`, completed with what the entitlement
/// scanner found in its handler.
fn handler_facts(policy: &Policy, tool: &str, scan: &ScannedHandler) -> HandlerFacts {
    HandlerFacts {
        gate_stages: toolgate_rmcp::contract::gate_stages(policy, tool),
        policy_fingerprint: policy.fingerprint(tool),
        entitlements: scan.entitlements,
        evasion: scan.evasion.clone(),
        unresolved: scan.unresolved.clone(),
    }
}

/// What the entitlement scanner found for one tool's handler.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScannedHandler {
    /// The capability families.
    pub entitlements: Entitlements,
    /// The evasion signal kinds, sorted.
    pub evasion: Vec<String>,
    /// The calls the scanner could not follow, sorted.
    #[serde(default)]
    pub unresolved: Vec<String>,
}

/// The contract of a server whose tools are `tools`, gated by `policy`: every tool needs a scan
/// result, since an unscanned handler has unknown entitlements.
pub fn server_contract(
    server_name: &str,
    tools: &[Tool],
    policy: &Policy,
    scans: &BTreeMap<String, ScannedHandler>,
) -> Result<ServerContract, ContractBuildError> {
    let mut contracts = Vec::with_capacity(tools.len() + 2);
    for tool in tools {
        let name = tool.name.to_string();
        let scan = scans
            .get(&name)
            .ok_or_else(|| ContractBuildError::Unscanned { tool: name.clone() })?;
        let facts = handler_facts(policy, &name, scan);
        contracts.push(ToolContract::build(&tool_definition(tool), &facts)?);
    }
    // The gate's own tools, listed to clients whenever some tool needs confirmation: their
    // handler is the gate (no entitlements of the server's code), their stages the gate's.
    let confirms = policy
        .effect_classes()
        .any(|(tool, class)| class.needs_confirmation() && tools.iter().any(|t| t.name == tool));
    for name in [toolgate_rmcp::CONFIRM_ACTION, toolgate_rmcp::REJECT_ACTION] {
        if confirms && !tools.iter().any(|t| t.name == name) {
            // A rejection works while calls are halted (it executes nothing).
            let stages: &[&str] = if name == toolgate_rmcp::CONFIRM_ACTION {
                &[
                    "list_filter",
                    "call_decide",
                    "kill_switch",
                    "input_schema",
                    "audit",
                ]
            } else {
                &["list_filter", "call_decide", "input_schema", "audit"]
            };
            let facts = HandlerFacts {
                gate_stages: stages.iter().map(|stage| (*stage).to_owned()).collect(),
                policy_fingerprint: policy.fingerprint(name),
                entitlements: Entitlements::default(),
                evasion: Vec::new(),
                unresolved: Vec::new(),
            };
            let tool = toolgate_rmcp::checks::confirmation_tool(name);
            contracts.push(ToolContract::build(&tool_definition(&tool), &facts)?);
        }
    }
    Ok(ServerContract::new(server_name, contracts)?)
}

/// The Cedar schema of `tools` (`toolgate::policy::cedar::cedar_schema`): their names and input
/// schemas, as rmcp has them.
#[cfg(feature = "cedar")]
pub fn cedar_schema_of(tools: &[Tool]) -> Value {
    let signatures: Vec<toolgate_policy::cedar::ToolSignature> = tools
        .iter()
        .map(|tool| {
            toolgate_policy::cedar::ToolSignature::new(
                tool.name.to_string(),
                Value::Object((*tool.input_schema).clone()),
            )
        })
        .collect();
    toolgate_policy::cedar::cedar_schema(&signatures)
}

/// Why a server contract could not be computed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContractBuildError {
    /// A registered tool has no scan result.
    #[error(
        "tool `{tool}` has no entitlement scan; its handler must be a `#[tool]` fn in the scanned sources"
    )]
    Unscanned {
        /// The tool.
        tool: String,
    },
    /// The contract crate refused the definitions.
    #[error(transparent)]
    Contract(#[from] toolgate_contract::contract::ContractError),
}

/// Where a policy's declared effect class contradicts what the tool's contract says about it:
/// its annotations (read with the spec's conservative defaults when absent) or the entitlements
/// the scanner found in its handler. `lock --check` reports these as violations.
///
/// - `read`: the annotations must claim `readOnlyHint: true`, and the handler must not write
///   files or spawn processes;
/// - `write`, `notify`, `wake`, `alert`, `delete`: the annotations must not claim
///   `readOnlyHint: true`;
/// - `delete`: the annotations must not claim `destructiveHint: false`.
pub fn effect_class_violations(
    policy: &Policy,
    tools: &[Tool],
    scans: &BTreeMap<String, ScannedHandler>,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (name, class) in policy.effect_classes() {
        let Some(tool) = tools.iter().find(|t| t.name == name) else {
            continue;
        };
        let hints = tool_definition(tool).annotations.effective();
        let mut problems = Vec::new();
        if class.is_read() {
            if !hints.read_only_hint {
                problems.push(
                    "its annotations do not claim readOnlyHint: true (absent hints read as false); annotate the tool read-only or declare the class it has".to_owned(),
                );
            }
            if let Some(scan) = scans.get(name) {
                let e = &scan.entitlements;
                let found: Vec<&str> = [
                    ("filesystemWrite", e.filesystem_write),
                    ("subprocess", e.subprocess),
                ]
                .into_iter()
                .filter_map(|(family, used)| used.then_some(family))
                .collect();
                if !found.is_empty() {
                    problems.push(format!(
                        "its handler uses {} (found by the entitlement scan); declare the class that matches what it does",
                        found.join(", ")
                    ));
                }
            }
        } else if hints.read_only_hint {
            problems.push(format!(
                "its annotations claim readOnlyHint: true, but class `{}` changes something; fix the annotation or the class",
                class.as_str()
            ));
        }
        if class.as_str() == "delete" && !hints.destructive_hint {
            problems.push(
                "its annotations claim destructiveHint: false, but class `delete` destroys; fix the annotation or the class".to_owned(),
            );
        }
        for problem in problems {
            violations.push(Violation {
                tool: name.to_owned(),
                message: format!(
                    "the policy declares `{name}` as effect class `{}`, but {problem}",
                    class.as_str()
                ),
            });
        }
    }
    violations
}

/// The live lockfile of a server that runs without its sources: `tools` as compiled, the gate
/// stages and policy fingerprints under `policy` (the policy in force, not the one the lockfile
/// was written with), and for each tool the entitlements `committed` (the text of its
/// `toolgate.lock`) records, which the server's lock check keeps equal to what its handlers do.
/// The server name is the lockfile's. Give the result to `GatedBuilder::contract` to publish the
/// digest; a tool missing from `committed` is an error (run the lock check in update mode).
pub fn live_lockfile(
    tools: &[Tool],
    policy: &Policy,
    committed: &str,
) -> Result<toolgate_contract::lockfile::Lockfile, LiveContractError> {
    let committed = toolgate_contract::lockfile::Lockfile::parse(committed)?;
    let contract = committed.contract();
    let scans: BTreeMap<String, ScannedHandler> = contract
        .tools
        .iter()
        .map(|(name, tool)| {
            let scan = ScannedHandler {
                entitlements: tool.entitlements.families(),
                evasion: tool.entitlements.evasion_signals().to_vec(),
                unresolved: tool.entitlements.unresolved().to_vec(),
            };
            (name.clone(), scan)
        })
        .collect();
    if let Some(tool) = tools.iter().find(|t| !scans.contains_key(t.name.as_ref())) {
        return Err(LiveContractError::NotLocked {
            tool: tool.name.to_string(),
        });
    }
    let live = server_contract(&contract.server_name, tools, policy, &scans)?;
    Ok(toolgate_contract::lockfile::Lockfile::new(
        live,
        TOOLGATE_VERSION,
    ))
}

/// Why [`live_lockfile`] could not compute the contract.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiveContractError {
    /// The committed lockfile is invalid.
    #[error("the committed lockfile is invalid: {0}")]
    Lockfile(#[from] toolgate_contract::lockfile::LockfileError),
    /// A tool the server registers is not in the committed lockfile.
    #[error(
        "tool `{tool}` is not in the committed lockfile, so its entitlements are unknown; run the lock check in update mode, review and commit the lockfile, and rebuild"
    )]
    NotLocked {
        /// The tool.
        tool: String,
    },
    /// The live contract could not be computed.
    #[error(transparent)]
    Contract(#[from] ContractBuildError),
}
