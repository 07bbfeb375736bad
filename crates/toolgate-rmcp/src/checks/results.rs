//! The policy's `results` section, a presenter: the fields a tool's results may carry. Every other
//! field is dropped before the result leaves the gate, in `structuredContent` and in the text
//! content alike, so a handler that serializes a whole record cannot leak a secret column; the
//! call's allow record counts what was dropped (`dropped_fields`).
//!
//! Text blocks that parse as JSON are filtered like `structuredContent` (a block that repeats
//! `structuredContent` is rewritten from the filtered structure and counted once with it). What
//! cannot be checked against the allow-list is withheld, failing closed: a text block that is not
//! JSON (or is JSON with no allowed shape, a bare string), and every non-text block (images,
//! audio, resources). Withheld blocks are replaced by one notice; when nothing checked remains the
//! result becomes an error. Each withheld block counts as one dropped field.
//!
//! The filter runs on the handler's result, first run or replay; the effect store keeps the result
//! already filtered (`exactly_once::stored`), so a withheld field is not at rest either, and a
//! replay is filtered again under the policy in force when it is answered. Filtering a filtered
//! result changes nothing (the withheld notice is recognised and kept), so a replay under the same
//! policy is what the first call got. The gate's own answers (refusals, previews, conflicts) are
//! not filtered.
//!
//! A tool's own error text is no exception: prose (not JSON) is withheld like any other text, so
//! the caller sees that the result was withheld and that it was an error, not the text. An error
//! message may quote the very values the allow-list keeps back (a row's secret in "no such row
//! …"); a server that wants its errors shown returns them as JSON whose fields the allow-list
//! names (an `error` field, say).

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde_json::Value;
use toolgate_audit::AuditEntry;
use toolgate_policy::ResultFields;

use super::{Call, Check, Verdict};
use crate::state::GateState;

/// Drops the result fields the policy does not list.
#[derive(Debug, Default)]
pub(crate) struct ResultFilter;

impl Check for ResultFilter {
    fn admit<'a>(&'a self, _call: &'a Call<'a>) -> Verdict<'a> {
        Verdict::Pass
    }

    /// The listed output schema describes the filtered results (a client that validates
    /// structured results, as the official SDKs do, would refuse them otherwise).
    fn describe(&self, state: &GateState, tool: &mut Tool) {
        if let Some(fields) = state.policy.results(&tool.name) {
            crate::refusal::rewrite_output_schema(tool, |schema| fields.rewrite_schema(schema));
        }
    }

    fn present(
        &self,
        state: &GateState,
        name: &str,
        result: &mut CallToolResult,
        entry: &mut AuditEntry,
    ) {
        let Some(fields) = state.policy.results(name) else {
            return;
        };
        let dropped = filter(fields, name, result);
        entry.dropped_fields = Some(entry.dropped_fields.unwrap_or(0).saturating_add(dropped));
    }
}

/// The notice that replaces `withheld` blocks of a `name` result.
fn withheld_notice(withheld: u64, name: &str) -> String {
    format!(
        "[withheld: {withheld} content block(s) of this `{name}` result could not be checked against the server's field allow-list (not JSON)]"
    )
}

/// The error that replaces a `name` result of which nothing could be checked.
fn withheld_error(name: &str) -> String {
    format!(
        "Error: the result of `{name}` could not be checked against the server's field allow-list (it is not JSON), so it was withheld"
    )
}

/// Whether `result` is this filter's own [`withheld_error`] for `name`.
fn is_withheld_error(result: &CallToolResult, name: &str) -> bool {
    result.is_error == Some(true)
        && result.structured_content.is_none()
        && matches!(result.content.as_slice(), [ContentBlock::Text(text)] if text.text == withheld_error(name))
}

/// How many blocks `text` says were withheld, when it is this filter's own notice for `name`.
fn notice_count(text: &str, name: &str) -> Option<u64> {
    let count: u64 = text
        .strip_prefix("[withheld: ")?
        .split_once(' ')?
        .0
        .parse()
        .ok()?;
    (withheld_notice(count, name) == text).then_some(count)
}

/// Filters `result` in place; returns how many fields (and withheld blocks) it dropped. A result
/// this filter already filtered under the same fields comes out unchanged, dropping nothing.
pub(crate) fn filter(fields: &ResultFields, name: &str, result: &mut CallToolResult) -> u64 {
    if is_withheld_error(result, name) {
        return 0;
    }
    let mut dropped = 0u64;
    // The structured content as the handler returned it, to recognise text blocks repeating it.
    let mut raw_structured = None;
    if let Some(structured) = result.structured_content.as_mut() {
        raw_structured = Some(structured.clone());
        match fields.apply(structured) {
            Some(count) => dropped += count,
            None => {
                // No allowed shape at all (a bare value where fields were expected).
                result.structured_content = None;
                dropped += 1;
            }
        }
    }
    let filtered_text = result
        .structured_content
        .as_ref()
        .map(|structured| serde_json::to_string(structured).unwrap_or_default());
    let mut withheld = 0u64;
    // Blocks an earlier filtering withheld (its notice): still withheld, not dropped again.
    let mut withheld_before = 0u64;
    let mut checked_text = false;
    let mut content = Vec::with_capacity(result.content.len());
    for block in std::mem::take(&mut result.content) {
        let ContentBlock::Text(mut text) = block else {
            withheld += 1;
            continue;
        };
        if let Some(count) = notice_count(&text.text, name) {
            withheld_before = withheld_before.saturating_add(count);
            continue;
        }
        let Ok(mut value) = serde_json::from_str::<Value>(&text.text) else {
            withheld += 1;
            continue;
        };
        if raw_structured.as_ref() == Some(&value)
            && let Some(filtered) = &filtered_text
        {
            // The same JSON as `structuredContent`: counted once, with it.
            text.text.clone_from(filtered);
        } else {
            match fields.apply(&mut value) {
                Some(count) => {
                    dropped += count;
                    text.text = serde_json::to_string(&value).unwrap_or_default();
                }
                None => {
                    withheld += 1;
                    continue;
                }
            }
        }
        checked_text = true;
        content.push(ContentBlock::Text(text));
    }
    let notice = withheld.saturating_add(withheld_before);
    if notice > 0 {
        content.push(ContentBlock::text(withheld_notice(notice, name)));
        if withheld > 0 && !checked_text && result.structured_content.is_none() {
            result.is_error = Some(true);
            content = vec![ContentBlock::text(withheld_error(name))];
        }
    }
    result.content = content;
    dropped + withheld
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolgate_policy::Policy;

    fn fields(paths: Value) -> ResultFields {
        let policy = Policy::from_json(
            &json!({"version": 1, "allow": ["t"], "results": {"t": {"fields": paths}}}).to_string(),
        )
        .expect("loads");
        policy.results("t").expect("set").clone()
    }

    fn texts(result: &CallToolResult) -> Vec<String> {
        result
            .content
            .iter()
            .filter_map(|block| block.as_text().map(|t| t.text.clone()))
            .collect()
    }

    #[test]
    fn structured_and_repeated_text_are_filtered_and_counted_once() {
        let allow = fields(json!(["rows[].id"]));
        let body = json!({"rows": [{"id": 1, "secret": "x"}, {"id": 2, "secret": "y"}]});
        let mut result = CallToolResult::structured(body);
        assert_eq!(filter(&allow, "t", &mut result), 2);
        let expected = json!({"rows": [{"id": 1}, {"id": 2}]});
        assert_eq!(result.structured_content, Some(expected.clone()));
        assert_eq!(texts(&result), vec![expected.to_string()]);
        assert_ne!(result.is_error, Some(true));
    }

    #[test]
    fn other_json_text_is_filtered_on_its_own_and_non_json_is_withheld() {
        let allow = fields(json!(["id"]));
        let mut result = CallToolResult::success(vec![
            ContentBlock::text(json!({"id": 1, "secret": "x"}).to_string()),
            ContentBlock::text("secret in prose"),
            ContentBlock::text("\"a bare string\""),
        ]);
        assert_eq!(filter(&allow, "t", &mut result), 3);
        let shown = texts(&result);
        assert_eq!(shown[0], json!({"id": 1}).to_string());
        assert!(
            shown[1].starts_with("[withheld: 2 content block(s)"),
            "{shown:?}"
        );
        assert_eq!(shown.len(), 2);
        assert_ne!(result.is_error, Some(true));

        let mut prose = CallToolResult::success(vec![ContentBlock::text("secret in prose")]);
        assert_eq!(filter(&allow, "t", &mut prose), 1);
        assert_eq!(prose.is_error, Some(true));
        let shown = texts(&prose);
        assert_eq!(shown.len(), 1);
        assert!(shown[0].starts_with("Error:") && !shown[0].contains("secret"));
    }

    #[test]
    fn a_filtered_result_filters_to_itself() {
        let allow = fields(json!(["id"]));
        let cases = [
            CallToolResult::success(vec![
                ContentBlock::text(json!({"id": 1, "secret": "x"}).to_string()),
                ContentBlock::text("secret in prose"),
            ]),
            CallToolResult::success(vec![ContentBlock::text("only prose")]),
            CallToolResult::structured(json!({"id": 2, "secret": "y"})),
            CallToolResult::error(vec![ContentBlock::text("no row with secret z")]),
        ];
        for mut result in cases {
            filter(&allow, "t", &mut result);
            let once = result.clone();
            assert_eq!(filter(&allow, "t", &mut result), 0, "{once:?}");
            assert_eq!(result, once);
            // Another tool's notice is not this tool's: withheld like any prose.
            let mut other =
                CallToolResult::success(vec![ContentBlock::text(withheld_notice(1, "u"))]);
            assert_eq!(filter(&allow, "t", &mut other), 1);
        }
    }
}
