//! Tasks a gated call created (`resultType: "task"`): whose they are and which tool they run.
//!
//! A task's result reaches the caller later, through `tasks/get`, and never passes the tools/call
//! pipeline that presents results. The gate remembers each task a gated call created (its tool and
//! its caller), presents a completed task's result as it presents a direct one (the policy's
//! result allow-list, then untrusted output, under the policy in force when it is read), and
//! answers `tasks/get`, `tasks/update` and `tasks/cancel` only for the caller that created the
//! task. A task the gate did not see created (another caller's, one from before a restart, an id
//! made up) is refused with the same error as an unknown one: a task's result is never shown
//! unpresented.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, TaskPayload};
use toolgate_audit::{AuditDecision, AuditEntry, Outcome};
use toolgate_canon::Sha256Digest;

use super::Caller;
use crate::checks::Checks;
use crate::state::GateState;

/// At most this many tasks are remembered; the oldest is forgotten first (and then refused).
pub(crate) const MAX_TASKS: usize = 10_000;

/// The error of a task the gate does not know, or that is another caller's.
pub(crate) fn unknown_task() -> McpError {
    McpError::invalid_params(
        "unknown task: no task with this id was created by this caller through this server",
        None,
    )
}

#[derive(Debug, Clone)]
struct Owner {
    tool: String,
    principal: Arc<str>,
    tenant: Option<String>,
}

impl Owner {
    fn is(&self, caller: &Caller) -> bool {
        self.principal == caller.principal && self.tenant.as_deref() == caller.tenant()
    }
}

/// The tasks gated calls created, bounded.
#[derive(Debug, Default)]
pub(crate) struct Tasks(Mutex<Known>);

#[derive(Debug, Default)]
struct Known {
    owners: HashMap<String, Owner>,
    order: VecDeque<String>,
}

impl Tasks {
    /// Remembers that `caller`'s call of `tool` created task `id`.
    pub(crate) fn created(&self, id: &str, tool: &str, caller: &Caller) {
        // Nothing panics while the lock is held; a poisoned map is still consistent.
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let owner = Owner {
            tool: tool.to_owned(),
            principal: Arc::clone(&caller.principal),
            tenant: caller.tenant().map(str::to_owned),
        };
        if known.owners.insert(id.to_owned(), owner).is_none() {
            known.order.push_back(id.to_owned());
        }
        while known.order.len() > MAX_TASKS {
            if let Some(oldest) = known.order.pop_front() {
                known.owners.remove(&oldest);
            }
        }
    }

    /// The tool of task `id`, if `caller` created it.
    pub(crate) fn tool_of(&self, id: &str, caller: &Caller) -> Result<String, McpError> {
        let known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match known.owners.get(id) {
            Some(owner) if owner.is(caller) => Ok(owner.tool.clone()),
            _ => Err(unknown_task()),
        }
    }
}

/// Presents a completed task's result of `tool` as a direct result is presented. A result that
/// is not a `CallToolResult` is withheld (an error result in its place). The delivery is not
/// audited: the call that created the task was.
pub(crate) fn present(checks: &Checks, state: &GateState, tool: &str, payload: &mut TaskPayload) {
    let TaskPayload::Completed { result } = payload else {
        return;
    };
    let mut presented =
        serde_json::from_value::<CallToolResult>(serde_json::Value::Object(result.clone()))
            .unwrap_or_else(|_| {
                CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                    "Error: the task result of `{tool}` is not a tool result, so it was withheld"
                ))])
            });
    // What the presenters note is for an allow record; a delivery writes none.
    let mut scratch = AuditEntry::tool_call(
        String::new(),
        tool,
        AuditDecision::Allow,
        Outcome::Observed,
        Sha256Digest::of(b""),
    );
    checks.present(state, tool, &mut presented, &mut scratch);
    match serde_json::to_value(&presented) {
        Ok(serde_json::Value::Object(object)) => *result = object,
        _ => result.clear(),
    }
}
