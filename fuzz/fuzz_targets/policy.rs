//! Policy loading and deciding. The input is a policy text, optionally followed by a NUL byte and
//! the JSON of a call's arguments. Properties: `from_json` never panics; a loaded policy is
//! deterministic (same digest on reload, equal to the digest of the JSON as written); for every
//! tool it names and every principal, `decide_for` never panics, refuses the tool as a whole
//! exactly when `visible_for` hides it, and `Allow` means every argument rule holds; the other
//! per-tool queries (fingerprint, path rules, batch, untrusted output) never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use toolgate_canon::Sha256Digest;
use toolgate_policy::{Decision, Policy};

fuzz_target!(|data: &[u8]| {
    let (policy_bytes, args_bytes) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (data, None),
    };
    let Ok(text) = std::str::from_utf8(policy_bytes) else {
        return;
    };
    let Ok(policy) = Policy::from_json(text) else {
        return;
    };
    let again = Policy::from_json(text).expect("a policy that loaded once loads again");
    assert_eq!(policy.digest(), again.digest());
    let loose: Value = serde_json::from_str(text).expect("a loaded policy is JSON");
    assert_eq!(policy.digest(), Sha256Digest::of_json(&loose));

    let arguments: Option<Map<String, Value>> = args_bytes
        .and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok())
        .and_then(|value| match value {
            Value::Object(map) => Some(map),
            _ => None,
        });
    let arguments = arguments.as_ref();

    let mut tools: Vec<String> = policy
        .allowed()
        .chain(policy.denied())
        .chain(policy.effect_classes().map(|(tool, _)| tool))
        .map(str::to_owned)
        .collect();
    tools.push("not_in_the_policy".to_owned());
    let mut principals: Vec<String> = policy.principals().map(str::to_owned).collect();
    principals.push("nobody-in-particular".to_owned());

    for tool in &tools {
        let _ = policy.fingerprint(tool);
        let _ = policy.idempotency(tool);
        let _ = policy.tool_rate(tool);
        let _ = policy.halt_exempt(tool);
        let decision = policy.decide(tool, arguments);
        assert_eq!(
            policy.visible(tool),
            !matches!(decision, Decision::DenyTool(_)),
            "visible and decide disagree on {tool}"
        );
        for principal in &principals {
            let decision = policy.decide_for(principal, tool, arguments);
            assert_eq!(
                policy.visible_for(principal, tool),
                !matches!(decision, Decision::DenyTool(_)),
                "visible_for and decide_for disagree on {principal} / {tool}"
            );
            let rule = decision.rule();
            assert!(!rule.is_empty());
            if let Decision::DenyArgs(violation) = &decision {
                let _ = (violation.message(), violation.fix(), violation.details());
            }
            if decision.is_allow() {
                let own = policy.principal_arg_rules(principal, tool);
                for rules in policy.arg_rules(tool).into_iter().chain(own) {
                    for (field, rule) in rules {
                        assert!(
                            rule.check(arguments.and_then(|a| a.get(field))).is_ok(),
                            "allowed although {tool}.{field} breaks its rule"
                        );
                    }
                }
            }
            for (field, rule) in policy.path_rules(Some(principal), tool) {
                if let Some(Value::String(value)) = arguments.and_then(|a| a.get(field)) {
                    let _ = rule.normalise(value);
                }
            }
        }
        if let Some(batch) = policy.batch(tool)
            && let Err(violation) = batch.check(arguments)
        {
            let _ = (violation.rule(), violation.message());
        }
        if let Some(untrusted) = policy.untrusted_output(tool)
            && let Some(args) = arguments
        {
            let mut structured = Value::Object(args.clone());
            let _ = untrusted.apply(&mut structured);
            let mut schema = Value::Object(args.clone());
            untrusted.rewrite_schema(&mut schema);
        }
    }
    for principal in &principals {
        let _ = policy.principal_rate(principal);
    }
});
