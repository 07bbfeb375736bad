//! Contract-aware error text: what a model needs to fix a call made from a stale contract.
//!
//! When a call fails argument validation, the error carries the tool's current required and
//! allowed fields and, when a previous lockfile is known, the BREAKING and RISKY changes of that
//! tool since. The model can then correct the call in the same turn instead of guessing. The text
//! is built only from the contract and the diff: argument values never appear in it, so an error
//! message cannot echo (or leak) what the caller sent.

use std::fmt::Write as _;

use crate::diff::{Change, Verdict};

pub use crate::contract::InputContract;

/// A compact `<contract_awareness>` block for an argument-validation error.
///
/// It lists the current required and allowed top-level fields of `tool` and at most `limit` of the
/// BREAKING and RISKY `changes` concerning `tool` (most severe first; SAFE and COSMETIC changes are
/// left out because they cannot explain a rejected call), then tells the model to adapt the call.
pub fn contract_awareness(
    tool: &str,
    input: &InputContract,
    changes: &[Change],
    limit: usize,
) -> String {
    let mut relevant: Vec<&Change> = changes
        .iter()
        .filter(|c| c.tool == tool && c.verdict >= Verdict::Risky)
        .collect();
    // A stable sort keeps the diff's own order (rule, detail) within one verdict.
    relevant.sort_by_key(|c| std::cmp::Reverse(c.verdict));

    let tool = sanitize(tool);
    let mut out = String::new();
    // `write!` into a String cannot fail; the results are ignored for that reason.
    let _ = writeln!(out, "<contract_awareness tool=\"{tool}\">");
    let _ = writeln!(
        out,
        "The arguments do not match the current contract of `{tool}`."
    );
    let _ = writeln!(out, "Required fields: {}", list(&input.required));
    let _ = writeln!(out, "Allowed fields: {}", list(&input.allowed));
    if limit > 0 && !relevant.is_empty() {
        let _ = writeln!(out, "Changes since the contract you may know:");
        for change in relevant.iter().take(limit) {
            let _ = writeln!(
                out,
                "- {} {}: {}",
                change.verdict,
                change.rule,
                one_line(&change.detail)
            );
        }
        if relevant.len() > limit {
            let _ = writeln!(out, "- ({} more not shown)", relevant.len() - limit);
        }
    }
    let _ = writeln!(
        out,
        "Adapt the call to this contract: send every required field, only allowed fields, and retry."
    );
    out.push_str("</contract_awareness>");
    out
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names
            .iter()
            .map(|n| one_line(n))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Tool names are `[A-Za-z0-9_.-]` in MCP; anything else is replaced so that a strange name cannot
/// close the block or inject lines into the message.
fn sanitize(tool: &str) -> String {
    tool.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/') {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// Field names and details on one line, without markup that could end the block early.
fn one_line(text: &str) -> String {
    // Angle brackets become look-alike guillemets so nothing can open or close a tag; the arrows
    // of diff details ("a -> b") are kept readable.
    text.replace("->", "→")
        .chars()
        .map(|c| match c {
            '\n' | '\r' => ' ',
            '<' => '‹',
            '>' => '›',
            c => c,
        })
        .collect()
}
