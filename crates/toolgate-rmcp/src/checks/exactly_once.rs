//! Exactly-once execution for tools the policy opts in (`idempotency`): the gate derives the key
//! and the fingerprint, asks the effect store whether to execute, and stores or replays results,
//! so handlers contain no store code.
//!
//! Keys come from the configured argument, else the request `_meta` key
//! `io.toolgate/idempotencyKey`, else the digest of the canonical arguments. They are scoped to
//! principal and tool by the store. The fingerprint covers the canonical arguments and the tool's
//! input schema digest, so the same key with other arguments (or under another contract) is a
//! conflict, never a second execution.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, RequestMetaObject};
use serde_json::{Value, json};
use toolgate_audit::Outcome;
use toolgate_canon::Sha256Digest;
use toolgate_commit::{
    Attempt, Begin, EffectBackend, EffectError, EffectKind, EffectRequest, EffectStatus,
    Resolution, Scope,
};
use toolgate_policy::{EffectSafety, Idempotency, ReplayMarker};

use crate::refusal::Refusal;
use crate::state::GateState;
use crate::world::{EffectProbe, ProbeAnswer};

/// The `_meta` key a client may use to pass an idempotency key.
pub const IDEMPOTENCY_KEY_META: &str = "io.toolgate/idempotencyKey";

/// The longest idempotency key a caller may pass (argument or `_meta`), in bytes of UTF-8.
/// Checked with the other argument rules before dispatch, so the effect store
/// never sees a key it would refuse.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 1024;

/// The refusal of a caller's idempotency key (the policy's `key_argument`, else the `_meta` key):
/// empty, over [`MAX_IDEMPOTENCY_KEY_BYTES`], or with a control character. Same shape as every
/// argument refusal; the key itself is never quoted.
pub(crate) fn key_refusal(
    settings: &Idempotency,
    tool: &str,
    arguments: Option<&JsonObject>,
    meta: &RequestMetaObject,
) -> Option<Refusal> {
    let from_argument = settings.key_argument.as_deref().and_then(|field| {
        arguments
            .and_then(|a| a.get(field))
            .and_then(Value::as_str)
            .map(|key| (field, key))
    });
    let (field, key) = from_argument.or_else(|| {
        meta.0
            .0
            .get(IDEMPOTENCY_KEY_META)
            .and_then(Value::as_str)
            .map(|key| (IDEMPOTENCY_KEY_META, key))
    })?;
    let (check, problem) = if key.is_empty() {
        ("min_bytes", "is empty".to_owned())
    } else if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        (
            "max_bytes",
            format!(
                "has {} bytes, more than {MAX_IDEMPOTENCY_KEY_BYTES}",
                key.len()
            ),
        )
    } else if let Some((offset, c)) = key.char_indices().find(|(_, c)| c.is_control()) {
        (
            "control_characters",
            format!(
                "contains the control character U+{:04X} at byte {offset}",
                u32::from(c)
            ),
        )
    } else {
        return None;
    };
    let rule = format!("idempotency.{tool}.key.{check}");
    let fix = format!(
        "pass a key of 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes of UTF-8 without control characters"
    );
    let shown = if field == IDEMPOTENCY_KEY_META {
        format!("the `_meta` key `{IDEMPOTENCY_KEY_META}`")
    } else {
        format!("argument `{field}`")
    };
    let mut refusal = Refusal::argument(
        tool,
        field,
        rule.clone(),
        json!({"min_bytes": 1, "max_bytes": MAX_IDEMPOTENCY_KEY_BYTES, "control_characters": false}),
        format!(
            "Error: {shown} of `{tool}` is its idempotency key and {problem} (policy rule {rule}); {fix}"
        ),
        &fix,
    );
    refusal.details["received"] = json!({"bytes": key.len()});
    Some(refusal)
}

/// The idempotency key of a call.
pub(crate) fn key_for(
    settings: &Idempotency,
    arguments: Option<&JsonObject>,
    meta: &RequestMetaObject,
    args_digest: Sha256Digest,
) -> String {
    let from_argument = settings
        .key_argument
        .as_deref()
        .and_then(|field| arguments.and_then(|a| a.get(field)))
        .and_then(Value::as_str);
    let from_meta = || meta.0.0.get(IDEMPOTENCY_KEY_META).and_then(Value::as_str);
    match from_argument.or_else(from_meta) {
        // Checked by `key_refusal` before dispatch: 1 to 1024 bytes, no control characters.
        Some(key) if !key.is_empty() => format!("key:{key}"),
        _ => format!("args:{args_digest}"),
    }
}

/// The fingerprint of a call: the digest of its canonical arguments (the `args_digest` the gate
/// already computed for the audit line, so the arguments are canonicalized once per call) under
/// the tool's input schema.
pub(crate) fn fingerprint(args_digest: Sha256Digest, input_schema: &JsonObject) -> Sha256Digest {
    Sha256Digest::of_json(&json!({
        "arguments_digest": args_digest.to_hex(),
        "input_schema_digest": Sha256Digest::of_json_object(input_schema).to_hex(),
    }))
}

/// What the effect store is asked for a call of an exactly-once tool: its key (scoped to the
/// principal and the tool) and its fingerprint.
pub(crate) fn request_for(
    settings: &Idempotency,
    principal: &str,
    tool: &str,
    arguments: Option<&JsonObject>,
    meta: &RequestMetaObject,
    args_digest: Sha256Digest,
    input_schema: &JsonObject,
) -> EffectRequest {
    EffectRequest {
        scope: Scope {
            principal: principal.to_owned(),
            tool: tool.to_owned(),
        },
        key: key_for(settings, arguments, meta, args_digest),
        fingerprint: fingerprint(args_digest, input_schema),
    }
}

/// Whether the effect store will answer a call from an earlier execution of the same call (same
/// key, same fingerprint) without running the handler: the earlier one completed, or failed for
/// good. A check that compares a call with the object as it is now (its version, an existing
/// duplicate) lets such a call through, because what it would see changed is this call's own
/// effect: a client retrying a lost answer gets the replay, not a conflict. A call the store
/// would run again (no record, a retryable failure, another call still holding the key) is not
/// one; neither is a tool that is not exactly-once.
pub(crate) struct EarlierAnswer {
    effects: Arc<dyn EffectBackend>,
    request: EffectRequest,
}

/// What a check that looks at the world found, asked on the blocking pool unless the call is a
/// retry the effect store already answered (see [`EarlierAnswer`]).
pub(crate) enum Lookup<T> {
    /// A retry of an answered call: the check lets it through to its replay.
    Answered,
    /// What the server's lookup said.
    Found(Result<T, String>),
    /// The blocking task did not complete.
    Failed,
}

/// Runs `lookup` on the blocking pool, unless `earlier` says the store already answered the call.
pub(crate) async fn unless_answered<T: Send + 'static>(
    earlier: Option<EarlierAnswer>,
    lookup: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Lookup<T> {
    let ran = tokio::task::spawn_blocking(move || {
        if earlier.is_some_and(|earlier| earlier.exists()) {
            return Lookup::Answered;
        }
        Lookup::Found(lookup())
    })
    .await;
    ran.unwrap_or(Lookup::Failed)
}

impl EarlierAnswer {
    /// The question for `call`, when its tool is exactly-once and the gate has a store.
    pub(crate) fn of(
        effects: Option<&Arc<dyn EffectBackend>>,
        call: &super::Call<'_>,
    ) -> Option<Self> {
        let settings = call.policy().idempotency(call.name)?;
        Some(EarlierAnswer {
            effects: Arc::clone(effects?),
            request: request_for(
                settings,
                call.principal,
                call.name,
                call.arguments,
                call.meta,
                call.args_digest,
                &call.tool.input_schema,
            ),
        })
    }

    /// Asks the store (blocking work). A store error answers `false`: the check then decides
    /// from the object as it is, which can only refuse more.
    pub(crate) fn exists(&self) -> bool {
        let status = self.effects.lookup(&self.request.scope, &self.request.key);
        match status {
            Ok(Some(EffectStatus::Completed { fingerprint, .. }))
            | Ok(Some(EffectStatus::Failed {
                fingerprint,
                retryable: false,
                ..
            })) => fingerprint == self.request.fingerprint,
            _ => false,
        }
    }
}

/// The store's view of the policy's effect safety.
pub(crate) fn kind(settings: &Idempotency) -> EffectKind {
    match settings.effect {
        EffectSafety::Idempotent => EffectKind::Idempotent,
        EffectSafety::Unsafe => EffectKind::Unsafe,
    }
}

/// What is stored for a completed call of `tool`: the result as the handler first returned it,
/// less what the policy's result allow-list withholds (a secret the caller never sees does not sit
/// in the store either). The untrusted-output wrapping is not stored: a replay is presented again
/// by every check, under the policy in force, and the allow-list filter presents a filtered result
/// unchanged.
pub(crate) fn stored(state: &GateState, tool: &str, result: &CallToolResult) -> Value {
    match state.policy.results(tool) {
        Some(fields) => {
            let mut kept = result.clone();
            super::results::filter(fields, tool, &mut kept);
            serde_json::to_value(&kept).unwrap_or(Value::Null)
        }
        None => serde_json::to_value(result).unwrap_or(Value::Null),
    }
}

/// The `_meta` key every replayed result carries (`true`), so a client can tell a replay from a
/// first execution whatever the tool's output looks like.
pub const REPLAYED_META: &str = "io.toolgate/replayed";

/// The stored first result of a call, as the handler returned it.
pub(crate) fn restored(stored: Value) -> Option<CallToolResult> {
    serde_json::from_value(stored).ok()
}

/// Marks `result` (a restored result, already presented) as a replay: identical to what the first
/// call got apart from the replay markers: `_meta["io.toolgate/replayed"] = true` always, and the
/// policy's `replay_marker` (if any) set in `structuredContent` (inserted when absent, as a member
/// of an existing object) and in a text block that carried the same JSON. An inserted member takes
/// its place in key order, in any build (see `toolgate_canon::in_key_order`).
pub(crate) fn mark_replay(result: &mut CallToolResult, marker: Option<&ReplayMarker>) {
    let meta = result.meta.get_or_insert_with(rmcp::model::MetaObject::new);
    meta.0.insert(REPLAYED_META.to_owned(), Value::Bool(true));
    meta.0.sort_keys();
    if let (Some(marker), Some(structured)) = (marker, result.structured_content.as_mut()) {
        let before = structured.clone();
        if set_pointer(structured, &marker.pointer, marker.value.clone()) {
            structured.sort_all_objects();
            let after = structured.to_string();
            for block in &mut result.content {
                // The same JSON, whatever order its writer put the keys in.
                if let ContentBlock::Text(text) = block
                    && serde_json::from_str::<Value>(&text.text).is_ok_and(|text| text == before)
                {
                    text.text = after.clone();
                }
            }
        }
    }
}

/// Sets the member at JSON `pointer` to `value`, inserting it when its parent is an object that
/// lacks it. Returns whether anything was set.
fn set_pointer(target: &mut Value, pointer: &str, value: Value) -> bool {
    if let Some(slot) = target.pointer_mut(pointer) {
        *slot = value;
        return true;
    }
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return false;
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(key, value);
            true
        }
        _ => false,
    }
}

/// The exactly-once feature of the gate: the effect store that runs each key once, and the
/// probes that settle calls whose caller died mid-effect. As a check it refuses a caller's key
/// that breaks the limits (with the other argument refusals); the gate then begins the effect
/// with [`begin_effect`] right before the handler runs and settles it right after.
#[derive(Default)]
pub(crate) struct ExactlyOnce {
    pub(crate) effects: Option<Arc<dyn EffectBackend>>,
    pub(crate) probes: BTreeMap<String, EffectProbe>,
}

impl super::Check for ExactlyOnce {
    fn admit<'a>(&'a self, call: &'a super::Call<'a>) -> super::Verdict<'a> {
        let refusal = call
            .policy()
            .idempotency(call.name)
            .and_then(|settings| key_refusal(settings, call.name, call.arguments, call.meta));
        match refusal {
            Some(refusal) => super::Verdict::Refuse(refusal),
            None => super::Verdict::Pass,
        }
    }
}

/// A tool's probe with the arguments of the call that asks it.
pub(crate) struct ProbeCall {
    pub(crate) probe: EffectProbe,
    pub(crate) arguments: Option<JsonObject>,
}

/// An exactly-once refusal in the shape of every gate refusal: the message, then `details` as the
/// last text line and as `structuredContent` (admitted by the tool's listed output schema).
fn store_refusal(text: &str, details: Value) -> CallToolResult {
    let line = serde_json::to_string(&details).unwrap_or_default();
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{text}\n{line}"))]);
    result.structured_content = Some(details);
    result
}

/// What the exactly-once step decided for a call.
pub(crate) enum EffectAnswer {
    /// Run the handler; store its outcome with the ticket.
    Execute(toolgate_commit::Ticket),
    /// Answered without the handler (replay, conflict, in progress, indeterminate, a store
    /// failure); `recorded` says whether its allow record was appended.
    Answered {
        response: Result<CallToolResult, McpError>,
        recorded: Result<(), String>,
    },
}

/// How to answer and audit a call the store does not let execute.
pub(crate) struct Answering {
    pub(crate) marker: Option<toolgate_policy::ReplayMarker>,
    pub(crate) audit: Arc<dyn toolgate_audit::AuditSink>,
    /// The allow record, its outcome set once the answer is known.
    pub(crate) entry: toolgate_audit::AuditEntry,
    /// The checks that present a replayed result, the state they present it under, and the tool.
    pub(crate) checks: Arc<super::Checks>,
    pub(crate) state: Arc<GateState>,
    pub(crate) tool: String,
}

impl Answering {
    /// The answer to `begun`, with its allow record appended (blocking work), or the ticket to
    /// execute with. A replay is the stored result presented by every check (the record carries
    /// what they noted) and then marked as a replay; the gate's own answers are not presented.
    fn settle(&self, begun: Result<Begin, EffectError>) -> EffectAnswer {
        let mut entry = self.entry.clone();
        let (outcome, response) = match begun {
            Ok(Begin::Execute(ticket)) => return EffectAnswer::Execute(ticket),
            Ok(Begin::Replay(stored)) => match restored(stored) {
                Some(mut result) => {
                    self.checks
                        .present(&self.state, &self.tool, &mut result, &mut entry);
                    mark_replay(&mut result, self.marker.as_ref());
                    (Outcome::Replay, Ok(result))
                }
                None => (
                    Outcome::Error,
                    Err(McpError::internal_error(
                        "the stored result of this call cannot be read back; inspect the effect store",
                        None,
                    )),
                ),
            },
            Ok(Begin::ReplayFailure(text)) => (
                Outcome::Replay,
                Ok(store_refusal(
                    &text,
                    json!({"error": "failed_before", "fix": "use a new key for a new attempt"}),
                )),
            ),
            Err(EffectError::Conflict { .. }) => (
                Outcome::Conflict,
                Ok(store_refusal(
                    "Error: this idempotency key was already used with different arguments; nothing was executed. Retry with the original arguments, or use a new key for a new effect",
                    json!({"error": "conflict", "fix": "retry with the original arguments, or use a new key for a new effect"}),
                )),
            ),
            Err(EffectError::InProgress { retry_after, .. }) => (
                Outcome::InProgress,
                Ok(store_refusal(
                    &format!(
                        "Error: a call with this idempotency key is still in progress; nothing was executed. Retry after {} s",
                        retry_after.as_secs().max(1)
                    ),
                    json!({
                        "error": "in_progress",
                        "retry_after_secs": retry_after.as_secs().max(1),
                        "fix": "retry with the same key later",
                    }),
                )),
            ),
            Err(EffectError::Indeterminate { .. }) => (
                Outcome::Indeterminate,
                Ok(store_refusal(
                    "Error: an earlier call with this idempotency key stopped mid-effect, so the effect may or may not have happened; it is not re-run automatically. An operator must inspect the target and resolve the key",
                    json!({"error": "indeterminate", "fix": "an operator must inspect the target and resolve the key"}),
                )),
            ),
            Err(error) => (
                Outcome::Error,
                Err(McpError::internal_error(
                    format!("the effect store failed: {error}"),
                    None,
                )),
            ),
        };
        entry.outcome = outcome;
        let recorded = self
            .audit
            .append(&entry)
            .map(drop)
            .map_err(|e| e.to_string());
        EffectAnswer::Answered { response, recorded }
    }
}

/// One blocking step of [`begin_effect`].
enum Step {
    Done(EffectAnswer),
    Pause(std::time::Duration),
    /// Indeterminate, with a probe still to ask.
    Probe(EffectError),
}

/// Asks the effect store what to do with a call of an exactly-once tool, as
/// [`EffectBackend::begin`] would, without holding a thread while another live call holds the key,
/// and answers (and audits) a call it does not let execute.
///
/// Each attempt is blocking work (it takes the store's lock and may wait for an fdatasync; it
/// runs in place on a multi-thread runtime, else on the blocking pool: see `crate::blocking`);
/// an answer that is not `Execute` is audited in the same blocking task. The pauses between
/// attempts (1 ms doubling to 50 ms, for at most the store's `wait_in_progress`) are timers on
/// the runtime. A waiting call therefore holds no blocking thread, so the pool can stay small and
/// many concurrent retries of one key cannot starve the call they wait for. The store counts the
/// call once, whatever the number of attempts.
///
/// An unsafe effect whose caller died is `Indeterminate`: the tool's probe, if it has one, is
/// asked (once per call, as blocking work: it reads the effect's target), the record is
/// resolved from its answer, and the call is decided again.
pub(crate) async fn begin_effect(
    store: Arc<dyn EffectBackend>,
    request: EffectRequest,
    kind: EffectKind,
    mut probe: Option<ProbeCall>,
    answering: Answering,
) -> EffectAnswer {
    let request = Arc::new(request);
    let answering = Arc::new(answering);
    let cancelled = |answering: &Answering| {
        let mut entry = answering.entry.clone();
        entry.outcome = Outcome::Error;
        // The task that would have recorded the answer did not run to its end: record here.
        let recorded = answering
            .audit
            .append(&entry)
            .map(drop)
            .map_err(|e| e.to_string());
        EffectAnswer::Answered {
            response: Err(McpError::internal_error(
                "the effect store task was cancelled; retry the call",
                None,
            )),
            recorded,
        }
    };
    let mut wait = store.in_progress_wait();
    loop {
        let probing = probe.is_some();
        let step = {
            let (store, request, task) = (
                Arc::clone(&store),
                Arc::clone(&request),
                Arc::clone(&answering),
            );
            let ran = crate::blocking::run(move || {
                let step = match store.begin_attempt(&request, kind, &mut wait) {
                    Ok(Attempt::Pause(pause)) => Step::Pause(pause),
                    Err(error @ EffectError::Indeterminate { .. }) if probing => Step::Probe(error),
                    Ok(Attempt::Ready(begin)) => Step::Done(task.settle(Ok(begin))),
                    Err(error) => Step::Done(task.settle(Err(error))),
                };
                (step, wait)
            })
            .await;
            match ran {
                Ok((step, waited)) => {
                    wait = waited;
                    step
                }
                Err(_) => return cancelled(&answering),
            }
        };
        let indeterminate = match step {
            Step::Done(answer) => return answer,
            Step::Pause(pause) => {
                tokio::time::sleep(pause).await;
                continue;
            }
            Step::Probe(error) => error,
        };
        let Some(ProbeCall { probe, arguments }) = probe.take() else {
            unreachable!("a step asks for the probe only while there is one");
        };
        let (store, request) = (Arc::clone(&store), Arc::clone(&request));
        let task = Arc::clone(&answering);
        let resolved = crate::blocking::run(move || {
            let resolution = match probe(arguments.as_ref()) {
                ProbeAnswer::Happened(result) => {
                    Resolution::Completed(stored(&task.state, &task.tool, &result))
                }
                ProbeAnswer::NotHappened => Resolution::Forget,
                ProbeAnswer::Unknown => return Some(task.settle(Err(indeterminate))),
            };
            match store.resolve(&request.scope, &request.key, resolution) {
                // Decided again with the same wait: the record is now completed or absent.
                Ok(()) => None,
                Err(error) => Some(task.settle(Err(error))),
            }
        })
        .await;
        match resolved {
            Ok(None) => {}
            Ok(Some(answer)) => return answer,
            Err(_) => return cancelled(&answering),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> JsonObject {
        match value {
            Value::Object(map) => map,
            _ => panic!("test value must be an object"),
        }
    }

    #[test]
    fn keys_prefer_the_argument_then_meta_then_the_arguments() {
        let settings: Idempotency =
            serde_json::from_value(json!({"key_argument": "request_id"})).expect("valid");
        let digest = Sha256Digest::of(b"args");
        let mut meta = RequestMetaObject::default();
        let args = object(json!({"request_id": "req-1", "text": "t"}));
        assert_eq!(key_for(&settings, Some(&args), &meta, digest), "key:req-1");
        meta.0
            .0
            .insert(IDEMPOTENCY_KEY_META.to_owned(), json!("from-meta"));
        let no_id = object(json!({"text": "t"}));
        assert_eq!(
            key_for(&settings, Some(&no_id), &meta, digest),
            "key:from-meta"
        );
        let none = RequestMetaObject::default();
        assert_eq!(
            key_for(&settings, Some(&no_id), &none, digest),
            format!("args:{digest}")
        );
    }

    #[test]
    fn keys_are_refused_at_the_boundaries_and_for_control_characters() {
        let settings: Idempotency =
            serde_json::from_value(json!({"key_argument": "request_id"})).expect("valid");
        let none = RequestMetaObject::default();
        let refusal = |key: &str| {
            let args = object(json!({"request_id": key}));
            key_refusal(&settings, "write_note", Some(&args), &none).map(|r| r.rule)
        };
        // 1024 bytes of UTF-8 made of multi-byte characters: the limit is in bytes.
        let at_limit = "\u{e9}".repeat(MAX_IDEMPOTENCY_KEY_BYTES / 2);
        assert_eq!(at_limit.len(), MAX_IDEMPOTENCY_KEY_BYTES);
        assert_eq!(refusal(&at_limit), None);
        assert_eq!(refusal(&"k".repeat(1023)), None);
        assert_eq!(refusal(&"k".repeat(1024)), None);
        assert_eq!(
            refusal(&"k".repeat(1025)).as_deref(),
            Some("idempotency.write_note.key.max_bytes")
        );
        assert_eq!(
            refusal(&format!("{at_limit}k")).as_deref(),
            Some("idempotency.write_note.key.max_bytes")
        );
        assert_eq!(
            refusal("").as_deref(),
            Some("idempotency.write_note.key.min_bytes")
        );
        for control in ["a\nb", "a\u{0}b", "a\u{7f}b", "a\u{85}b"] {
            assert_eq!(
                refusal(control).as_deref(),
                Some("idempotency.write_note.key.control_characters"),
                "{control:?}"
            );
        }
        // The `_meta` key is checked the same way when no argument carries the key.
        let mut meta = RequestMetaObject::default();
        meta.0
            .0
            .insert(IDEMPOTENCY_KEY_META.to_owned(), json!("k".repeat(1025)));
        let no_id = object(json!({"text": "t"}));
        let refused = key_refusal(&settings, "write_note", Some(&no_id), &meta).unwrap();
        assert_eq!(refused.details["field"], IDEMPOTENCY_KEY_META);
        assert_eq!(refused.details["received"]["bytes"], 1025);
        assert!(
            refused.message.starts_with("Error: "),
            "{}",
            refused.message
        );
    }

    #[test]
    fn fingerprints_cover_arguments_and_schema() {
        let fingerprint = |args: Option<&JsonObject>, schema: &JsonObject| {
            let digest = Sha256Digest::of_json(&Value::Object(args.cloned().unwrap_or_default()));
            super::fingerprint(digest, schema)
        };
        let schema = object(json!({"type": "object"}));
        let other_schema = object(json!({"type": "object", "required": ["a"]}));
        let a = object(json!({"a": 1, "b": 2}));
        let a_reordered = object(json!({"b": 2, "a": 1}));
        let b = object(json!({"a": 2}));
        assert_eq!(
            fingerprint(Some(&a), &schema),
            fingerprint(Some(&a_reordered), &schema)
        );
        assert_ne!(
            fingerprint(Some(&a), &schema),
            fingerprint(Some(&b), &schema)
        );
        assert_ne!(
            fingerprint(Some(&a), &schema),
            fingerprint(Some(&a), &other_schema)
        );
    }

    fn replayed(stored: Value, marker: Option<&ReplayMarker>) -> CallToolResult {
        let mut result = restored(stored).expect("replayable");
        mark_replay(&mut result, marker);
        result
    }

    #[test]
    fn replays_differ_from_the_first_result_only_by_the_marker() {
        let first = CallToolResult::structured(json!({"request_id": "r", "status": "committed"}));
        let marker: ReplayMarker =
            serde_json::from_value(json!({"pointer": "/status", "value": "replay"}))
                .expect("valid");
        let replay = replayed(serde_json::to_value(&first).unwrap(), Some(&marker));
        assert_eq!(
            replay.structured_content,
            Some(json!({"request_id": "r", "status": "replay"}))
        );
        match &replay.content[0] {
            ContentBlock::Text(text) => {
                assert_eq!(
                    text.text,
                    json!({"request_id": "r", "status": "replay"}).to_string()
                )
            }
            other => panic!("expected text, got {other:?}"),
        }
        assert_eq!(
            replay.meta.as_ref().and_then(|m| m.0.get(REPLAYED_META)),
            Some(&json!(true))
        );
        let mut unmarked = replayed(serde_json::to_value(&first).unwrap(), None);
        assert_eq!(
            unmarked.meta.take().map(|m| m.0),
            Some(
                [(REPLAYED_META.to_owned(), json!(true))]
                    .into_iter()
                    .collect()
            )
        );
        assert_eq!(
            serde_json::to_value(&unmarked).unwrap(),
            serde_json::to_value(&first).unwrap(),
            "without a policy marker, byte-identical apart from `_meta`"
        );
        // A marker whose member is absent is inserted.
        let bare = CallToolResult::structured(json!({"booking": "b-1"}));
        let replay = replayed(serde_json::to_value(&bare).unwrap(), Some(&marker));
        assert_eq!(
            replay.structured_content,
            Some(json!({"booking": "b-1", "status": "replay"}))
        );
    }
}
