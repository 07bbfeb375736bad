//! The policy's `untrusted_output` section: a tool's third-party text fields are wrapped as
//! untrusted data before the result leaves the gate, in `structuredContent` and in the text
//! content (regenerated from it, so the raw text cannot slip through a second copy), and the
//! listed output schema describes the wrapped shape.

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use toolgate_audit::AuditEntry;

use super::{Call, Check, Verdict};
use crate::state::GateState;

/// Wraps untrusted output fields.
#[derive(Debug, Default)]
pub(crate) struct UntrustedOutput;

impl Check for UntrustedOutput {
    fn admit<'a>(&'a self, _call: &'a Call<'a>) -> Verdict<'a> {
        Verdict::Pass
    }

    fn describe(&self, state: &GateState, tool: &mut Tool) {
        if let Some(untrusted) = state.policy.untrusted_output(&tool.name) {
            crate::refusal::rewrite_output_schema(tool, |schema| untrusted.rewrite_schema(schema));
        }
    }

    fn present(
        &self,
        state: &GateState,
        name: &str,
        result: &mut CallToolResult,
        _entry: &mut AuditEntry,
    ) {
        let Some(untrusted) = state.policy.untrusted_output(name) else {
            return;
        };
        let Some(structured) = result.structured_content.as_mut() else {
            // Without structured content the fields cannot be located: drop the text rather than
            // pass third-party text through unmarked.
            if !result.content.is_empty() {
                result.content = vec![ContentBlock::text(
                    "Error: this tool's output contains third-party text that the server could not isolate; it was withheld",
                )];
                result.is_error = Some(true);
            }
            return;
        };
        untrusted.apply(structured);
        let text = serde_json::to_string(structured).unwrap_or_default();
        result.content = vec![ContentBlock::text(text)];
    }
}
