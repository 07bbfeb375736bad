//! The kill switch's check: while the switch (`toolgate_state::KillSwitch`) is set, every
//! tools/call is refused with [`crate::HALTED`] before any handler code runs.

use toolgate_state::{KillSwitch, Status};

/// The check: while the switch is set every tools/call gets a JSON-RPC error ([`crate::HALTED`])
/// naming the reason and how calls resume, except tools the policy's `halt_exempt` lists.
#[derive(Debug, Default)]
pub(crate) struct KillSwitchCheck {
    pub(crate) switch: Option<KillSwitch>,
    /// The server's binary, named in the error as `<name> resume`.
    pub(crate) server_name: Option<String>,
}

impl KillSwitchCheck {
    /// The JSON-RPC error of a halted server, if the switch is set, or of a halted tenant, if
    /// `tenant`'s switch is.
    pub(crate) fn halted(&self, tenant: Option<&str>) -> Option<rmcp::ErrorData> {
        let switch = self.switch.as_ref()?;
        let halt = match switch.status() {
            Status::Halted(halt) => halt,
            Status::Running => {
                let tenant = tenant.and_then(|tenant| switch.for_tenant(tenant).ok())?;
                match tenant.status() {
                    Status::Halted(halt) => halt,
                    Status::Running => return None,
                }
            }
        };
        let retry = match &self.server_name {
            Some(server) => format!("Retry after the operator runs `{server} resume`"),
            None => "Retry after the operator lifts the halt".to_owned(),
        };
        Some(rmcp::ErrorData::new(
            rmcp::model::ErrorCode(crate::world::HALTED),
            format!(
                "calls are halted by an operator ({}); nothing was executed. {retry}",
                halt.reason
            ),
            Some(serde_json::json!({
                "halted": true,
                "reason": halt.reason,
                "by": halt.by,
                "since_ns": halt.since_ns.to_string(),
            })),
        ))
    }
}

impl super::Check for KillSwitchCheck {
    fn admit<'a>(&'a self, call: &'a super::Call<'a>) -> super::Verdict<'a> {
        if call.policy().halt_exempt(call.name) {
            return super::Verdict::Pass;
        }
        match self.halted(call.tenant) {
            Some(error) => super::Verdict::Fail {
                reason: toolgate_audit::Reason::KillSwitch,
                error,
            },
            None => super::Verdict::Pass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_refuses_a_halted_tenants_calls_only_and_everyones_halt_stops_all() {
        let everyone = KillSwitch::in_memory();
        let acme = everyone.for_tenant("acme").unwrap();
        let halt = acme.halt("acme's incident", "ops").unwrap();
        let check = KillSwitchCheck {
            switch: Some(everyone.clone()),
            server_name: None,
        };
        let refused = check.halted(Some("acme")).unwrap();
        assert!(refused.message.contains("acme's incident"), "{refused:?}");
        assert!(check.halted(Some("globex")).is_none());
        assert!(check.halted(None).is_none());
        everyone.halt("all stop", "ops").unwrap();
        assert!(check.halted(Some("globex")).is_some());
        everyone.resume().unwrap();
        assert_eq!(acme.resume().unwrap(), Some(halt));
        assert!(check.halted(Some("acme")).is_none());
    }
}
