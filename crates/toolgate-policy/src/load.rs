//! The strict version-1 loader: raw structures in, a valid [`Policy`] out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;
use toolgate_canon::Sha256Digest;

use crate::principal::{Principal, PrincipalSection};
use crate::raw::{RawArgRule, RawPolicy, UniqueMap};
use crate::results::ResultFields;
use crate::rules::ArgRule;
use crate::sections::{Batch, DuplicateGuard, EffectClass, Rate, Versioned};
use crate::untrusted::UntrustedOutput;
use crate::{
    DEFAULT_CONFIRMATION_TTL_SECS, MAX_CONFIRMATION_TTL_SECS, Policy, PolicyError,
    SUPPORTED_VERSION, ToolName,
};

fn invalid(reason: String) -> PolicyError {
    PolicyError::Invalid { reason }
}

fn syntax(error: &serde_json::Error) -> PolicyError {
    PolicyError::Syntax {
        message: error
            .to_string()
            .split(" at line ")
            .next()
            .unwrap_or_default()
            .to_owned(),
        line: error.line(),
        column: error.column(),
    }
}

fn tool_names(list: Vec<String>, key: &str) -> Result<BTreeSet<String>, PolicyError> {
    list.into_iter()
        .map(|name| {
            ToolName::new(&name)
                .map(|valid| valid.0)
                .map_err(|e| invalid(format!("in \"{key}\": {e}")))
        })
        .collect()
}

fn tool_name(name: &str, key: &str) -> Result<String, PolicyError> {
    ToolName::new(name)
        .map(|valid| valid.0)
        .map_err(|e| invalid(format!("in \"{key}\": {e}")))
}

/// Who may call which tool, computed before the per-tool sections are checked.
struct Reach<'a> {
    allow: &'a BTreeSet<String>,
    deny: &'a BTreeSet<String>,
    principals: &'a BTreeMap<String, PrincipalSection>,
}

impl Reach<'_> {
    fn allowed_for(&self, section: Option<&PrincipalSection>, tool: &str) -> bool {
        if self.deny.contains(tool) {
            return false;
        }
        match section {
            None => self.allow.contains(tool),
            Some(section) => {
                !section.deny.contains(tool)
                    && (self.allow.contains(tool) || section.allow.contains(tool))
            }
        }
    }

    /// Allowed for the top-level caller or for at least one principal.
    fn allowed_for_somebody(&self, tool: &str) -> bool {
        self.allowed_for(None, tool)
            || self
                .principals
                .values()
                .any(|section| self.allowed_for(Some(section), tool))
    }

    fn somebody_list(&self) -> String {
        let mut names: BTreeSet<&str> = self.allow.iter().map(String::as_str).collect();
        for section in self.principals.values() {
            names.extend(section.allow.iter().map(String::as_str));
        }
        let list: Vec<&str> = names
            .into_iter()
            .filter(|tool| self.allowed_for_somebody(tool))
            .collect();
        const SHOWN: usize = 20;
        match list.len() {
            0 => "none".to_owned(),
            n if n > SHOWN => format!("{}, … ({} more)", list[..SHOWN].join(", "), n - SHOWN),
            _ => list.join(", "),
        }
    }

    /// The check every per-tool key shares: the tool must be callable by somebody.
    fn require(&self, key: &str, tool: &str) -> Result<(), PolicyError> {
        if self.allowed_for_somebody(tool) {
            Ok(())
        } else {
            Err(invalid(format!(
                "{key} names `{tool}`, which the policy does not allow; {key} applies only to allowed tools ({}): fix the tool name or remove the entry",
                self.somebody_list()
            )))
        }
    }
}

/// Compiles `<prefix>.<tool>.<field>` rules for one section; `top` are the top-level rules when
/// compiling a principal's.
fn compile_rules(
    raw: UniqueMap<UniqueMap<RawArgRule>>,
    prefix: &str,
    top: Option<&BTreeMap<String, BTreeMap<String, ArgRule>>>,
) -> Result<BTreeMap<String, BTreeMap<String, ArgRule>>, PolicyError> {
    let mut out = BTreeMap::new();
    for (tool, fields) in raw.0 {
        let tool = tool_name(&tool, prefix)?;
        let mut compiled = BTreeMap::new();
        for (field, rule) in fields.0 {
            if field.is_empty() {
                return Err(invalid(format!(
                    "{prefix}.{tool} has an empty field name; name the argument the rule applies to"
                )));
            }
            let at = format!("{prefix}.{tool}.{field}");
            let top_rule = top.and_then(|t| t.get(&tool)).and_then(|f| f.get(&field));
            let rule = ArgRule::compile(rule, &at, top_rule).map_err(invalid)?;
            compiled.insert(field, rule);
        }
        out.insert(tool, compiled);
    }
    Ok(out)
}

impl Policy {
    /// Parses a policy from JSON text.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        Self::from_json_in(text, None)
    }

    /// [`Policy::from_json`] for a policy read from a file in `dir` (or, `None`, from the
    /// current directory): a relative `cedar` path is read from there.
    pub(crate) fn from_json_in(text: &str, dir: Option<&Path>) -> Result<Self, PolicyError> {
        // Check the version before the strict parse, so that a file written for a newer format
        // reports "unsupported version" rather than an unknown key of that format.
        let loose: Value = serde_json::from_str(text).map_err(|e| syntax(&e))?;
        let Value::Object(top) = &loose else {
            return Err(invalid(
                "the policy must be a JSON object such as {\"version\":1,\"allow\":[...]}"
                    .to_owned(),
            ));
        };
        match top.get("version").and_then(Value::as_u64) {
            None => return Err(PolicyError::MissingVersion),
            Some(SUPPORTED_VERSION) => {}
            Some(found) => return Err(PolicyError::UnsupportedVersion { found }),
        }
        let raw: RawPolicy = serde_json::from_str(text).map_err(|e| syntax(&e))?;
        debug_assert_eq!(raw.version, SUPPORTED_VERSION);

        let allow = tool_names(raw.allow, "allow")?;
        let deny = tool_names(raw.deny, "deny")?;

        // Principal sections: names and lists first; their rules once reach is known.
        let mut principals = BTreeMap::new();
        let mut principal_rules = Vec::new();
        for (name, section) in raw.principals.0 {
            let name = Principal::new(&name)
                .map_err(|e| invalid(format!("in \"principals\": {e}")))?
                .into_string();
            let key = format!("principals.{name}");
            principals.insert(
                name.clone(),
                PrincipalSection {
                    allow: tool_names(section.allow, &format!("{key}.allow"))?,
                    deny: tool_names(section.deny, &format!("{key}.deny"))?,
                    arg_rules: BTreeMap::new(),
                },
            );
            principal_rules.push((name, section.arg_rules));
        }

        let arg_rules = compile_rules(raw.arg_rules, "arg_rules", None)?;
        let mut compiled_principal_rules = Vec::new();
        for (name, rules) in principal_rules {
            let prefix = format!("principals.{name}.arg_rules");
            compiled_principal_rules.push((name, compile_rules(rules, &prefix, Some(&arg_rules))?));
        }

        let reach = Reach {
            allow: &allow,
            deny: &deny,
            principals: &principals,
        };
        for tool in arg_rules.keys() {
            // A rule for a tool the policy never allows is at best dead and at worst a typo of
            // an allowed tool's name, which would silently leave that tool unruled.
            if !reach.allowed_for_somebody(tool) {
                return Err(invalid(format!(
                    "arg_rules names `{tool}`, which the policy does not allow; rules apply only to allowed tools ({}): fix the tool name or remove the rule",
                    reach.somebody_list()
                )));
            }
        }
        for (name, rules) in &compiled_principal_rules {
            let section = principals.get(name);
            for (tool, fields) in rules {
                if !reach.allowed_for(section, tool) {
                    return Err(invalid(format!(
                        "principals.{name}.arg_rules names `{tool}`, which the policy does not allow for `{name}`; add it to \"allow\" or principals.{name}.allow, or fix the tool name or remove the rule"
                    )));
                }
                let Some(top_fields) = arg_rules.get(tool) else {
                    continue;
                };
                for (field, rule) in fields {
                    if let Some(top_rule) = top_fields.get(field)
                        && let Err(why) = top_rule.jointly_satisfiable(rule)
                    {
                        return Err(invalid(format!(
                            "principals.{name}.arg_rules.{tool}.{field} contradicts arg_rules.{tool}.{field} ({why}), so `{name}` could never call `{tool}`; fix one of the two rules"
                        )));
                    }
                }
            }
        }

        let mut idempotency = BTreeMap::new();
        for (tool, settings) in raw.idempotency.0 {
            let tool = tool_name(&tool, "idempotency")?;
            reach.require("idempotency", &tool)?;
            if settings.key_argument.as_deref() == Some("") {
                return Err(invalid(format!(
                    "idempotency.{tool}.key_argument is empty; name the argument holding the key or remove it"
                )));
            }
            if let Some(marker) = &settings.replay_marker
                && !(marker.pointer.starts_with('/') && marker.pointer.len() > 1)
            {
                return Err(invalid(format!(
                    "idempotency.{tool}.replay_marker.pointer {:?} is not a JSON pointer such as \"/status\"",
                    marker.pointer
                )));
            }
            if settings.window_secs == Some(0) {
                return Err(invalid(format!(
                    "idempotency.{tool}.window_secs is 0, so nothing could replay; use at least 1"
                )));
            }
            idempotency.insert(tool, settings);
        }

        let mut effects: BTreeMap<String, EffectClass> = BTreeMap::new();
        for (tool, class) in raw.effects.0 {
            let tool = tool_name(&tool, "effects")?;
            reach.require("effects", &tool)?;
            effects.insert(tool, class);
        }

        let confirmation_ttl_secs = match raw.confirmation.and_then(|c| c.ttl_secs) {
            None => DEFAULT_CONFIRMATION_TTL_SECS,
            Some(secs) if (1..=MAX_CONFIRMATION_TTL_SECS).contains(&secs) => secs,
            Some(secs) => {
                return Err(invalid(format!(
                    "confirmation.ttl_secs is {secs}; use a value from 1 to {MAX_CONFIRMATION_TTL_SECS} seconds (default {DEFAULT_CONFIRMATION_TTL_SECS})"
                )));
            }
        };

        let mut batch = BTreeMap::new();
        for (tool, settings) in raw.batch.0 {
            let tool = tool_name(&tool, "batch")?;
            reach.require("batch", &tool)?;
            let compiled = Batch::compile(&tool, settings).map_err(invalid)?;
            batch.insert(tool, compiled);
        }

        let mut tool_rates = BTreeMap::new();
        let mut principal_rates = BTreeMap::new();
        if let Some(limits) = raw.rate_limits {
            for (tool, rate) in limits.tools.0 {
                let tool = tool_name(&tool, "rate_limits.tools")?;
                reach.require("rate_limits.tools", &tool)?;
                let rate =
                    Rate::compile(&rate, &format!("rate_limits.tools.{tool}")).map_err(invalid)?;
                tool_rates.insert(tool, rate);
            }
            for (name, rate) in limits.principals.0 {
                let name = Principal::new(&name)
                    .map_err(|e| invalid(format!("in \"rate_limits.principals\": {e}")))?
                    .into_string();
                let rate = Rate::compile(&rate, &format!("rate_limits.principals.{name}"))
                    .map_err(invalid)?;
                principal_rates.insert(name, rate);
            }
        }

        let mut halt_exempt = BTreeSet::new();
        if let Some(kill_switch) = raw.kill_switch {
            for tool in tool_names(kill_switch.exempt, "kill_switch.exempt")? {
                reach.require("kill_switch.exempt", &tool)?;
                if effects.get(&tool) != Some(&EffectClass::Read) {
                    return Err(invalid(format!(
                        "kill_switch.exempt lists `{tool}`, but only tools whose effect class is \"read\" may keep running under the kill switch; declare it \"read\" in effects or remove it from exempt"
                    )));
                }
                halt_exempt.insert(tool);
            }
        }

        let mut untrusted_output = BTreeMap::new();
        for (tool, settings) in raw.untrusted_output.0 {
            let tool = tool_name(&tool, "untrusted_output")?;
            reach.require("untrusted_output", &tool)?;
            let compiled = UntrustedOutput::compile(&tool, settings).map_err(invalid)?;
            untrusted_output.insert(tool, compiled);
        }

        let mut host_requests = BTreeSet::new();
        let mut trusted_output = BTreeSet::new();
        if let Some(proxy) = raw.proxy {
            for request in proxy.host_requests {
                if !host_requests.insert(request) {
                    return Err(invalid(format!(
                        "proxy.host_requests lists \"{}\" twice; list each kind once",
                        request.as_str()
                    )));
                }
            }
            for tool in tool_names(proxy.trusted_output, "proxy.trusted_output")? {
                reach.require("proxy.trusted_output", &tool)?;
                trusted_output.insert(tool);
            }
        }

        let mut versions = BTreeMap::new();
        for (tool, settings) in raw.versions.0 {
            let tool = tool_name(&tool, "versions")?;
            reach.require("versions", &tool)?;
            let compiled = Versioned::compile(&tool, settings).map_err(invalid)?;
            versions.insert(tool, compiled);
        }

        let mut duplicates = BTreeMap::new();
        for (tool, settings) in raw.duplicates.0 {
            let tool = tool_name(&tool, "duplicates")?;
            reach.require("duplicates", &tool)?;
            let at = format!("duplicates.{tool}.update_tool");
            let update_tool = tool_name(&settings.update_tool, &at)?;
            if !reach.allowed_for_somebody(&update_tool) {
                return Err(invalid(format!(
                    "{at} names `{update_tool}`, which the policy does not allow, so a refused duplicate would point callers at a tool they cannot call; allow it or fix the name ({})",
                    reach.somebody_list()
                )));
            }
            let compiled = DuplicateGuard::compile(&tool, settings).map_err(invalid)?;
            duplicates.insert(tool, compiled);
        }

        let mut results = BTreeMap::new();
        for (tool, settings) in raw.results.0 {
            let tool = tool_name(&tool, "results")?;
            reach.require("results", &tool)?;
            let compiled = ResultFields::compile(&tool, settings).map_err(invalid)?;
            results.insert(tool, compiled);
        }

        let mut scopes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (scope, tools) in raw.scopes.0 {
            if !toolgate_canon::names::is_scope(&scope) {
                return Err(invalid(format!(
                    "scopes has the scope {scope:?}: a scope is {}",
                    toolgate_canon::names::SCOPE_GRAMMAR
                )));
            }
            for tool in tool_names(tools, &format!("scopes.{scope}"))? {
                reach.require("scopes", &tool)?;
                scopes.entry(tool).or_default().insert(scope.clone());
            }
        }

        if raw.cedar.is_none() && !raw.tags.0.is_empty() {
            return Err(invalid(
                "tags are read only by Cedar policies, and this policy names none: name the Cedar file with `cedar`, or remove `tags`"
                    .to_owned(),
            ));
        }
        let mut tags = BTreeMap::new();
        for (tool, list) in raw.tags.0 {
            let tool = tool_name(&tool, "tags")?;
            reach.require("tags", &tool)?;
            let mut set = BTreeSet::new();
            for tag in list {
                if !toolgate_canon::names::is_attribute_key(&tag) {
                    return Err(invalid(format!(
                        "tags.{tool} has the tag {tag:?}; a tag is 1 to 64 of a-z, 0-9 and '_', starting with a letter"
                    )));
                }
                if !set.insert(tag.clone()) {
                    return Err(invalid(format!(
                        "tags.{tool} lists `{tag}` twice; list each tag once"
                    )));
                }
            }
            tags.insert(tool, set);
        }

        for (name, rules) in compiled_principal_rules {
            if let Some(section) = principals.get_mut(&name) {
                section.arg_rules = rules;
            }
        }

        let json_digest = Sha256Digest::of_json(&loose);
        let cedar = raw
            .cedar
            .map(|path| crate::CedarSource::read(&dir.unwrap_or(Path::new(".")).join(path)))
            .transpose()?;
        // A policy with Cedar is named by both texts, so that editing either is a new policy.
        let digest = match &cedar {
            None => json_digest,
            Some(cedar) => Sha256Digest::of_json(&serde_json::json!({
                "json": json_digest.to_string(),
                "cedar": cedar.digest().to_string(),
            })),
        };
        Ok(Policy {
            allow,
            deny,
            arg_rules,
            idempotency,
            effects,
            confirmation_ttl_secs,
            batch,
            tool_rates,
            principal_rates,
            halt_exempt,
            principals,
            untrusted_output,
            versions,
            duplicates,
            results,
            scopes,
            host_requests,
            trusted_output,
            cedar,
            tags,
            digest,
        })
    }
}
