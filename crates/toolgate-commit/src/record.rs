//! The on-disk record of one (scope, key) and the owner identity used to tell live calls from dead.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use toolgate_canon::{
    Sha256Digest, canonical_value, is_canonical, write_canonical_str, write_canonical_u64,
};

use super::EffectError;

/// The call that holds (or held) an `in_progress` record.
///
/// `pid` and `start_ticks` (field 22 of `/proc/<pid>/stat`) identify a process even across pid
/// reuse; `nonce` identifies one [`super::Ticket`] within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub start_ticks: u64,
    pub nonce: u64,
}

/// Nonces of tickets handed out by this process and not yet consumed or dropped.
static LIVE: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
/// Nonces whose `in_progress` record was written but whose `begin` then failed, so the effect was
/// certainly never started: such a record may be taken over even for an unsafe effect.
static ABORTED: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
static NONCE_COUNTER: AtomicU64 = AtomicU64::new(0);

fn set(
    cell: &'static OnceLock<Mutex<HashSet<u64>>>,
) -> std::sync::MutexGuard<'static, HashSet<u64>> {
    // A set of integers stays consistent even if a holder panicked.
    cell.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Owner {
    /// A fresh owner for this process: unique within the process (counter), and unlikely to repeat
    /// across processes that share a pid and start time (time-derived base).
    pub fn fresh() -> Self {
        static BASE: OnceLock<u64> = OnceLock::new();
        let base = *BASE.get_or_init(|| {
            let nanos = now_ns(SystemTime::now());
            nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id())
        });
        let counter = NONCE_COUNTER.fetch_add(1, Ordering::Relaxed);
        Owner {
            pid: std::process::id(),
            start_ticks: self_start_ticks(),
            nonce: base.wrapping_add(counter),
        }
    }

    /// The owner of an execution given up without an outcome: pid 0 names no process, so it is
    /// dead for every reader (see `EffectBackend::abandon`).
    pub(crate) fn abandoned(nonce: u64) -> Self {
        Owner {
            pid: 0,
            start_ticks: 0,
            nonce,
        }
    }

    pub fn register_live(&self) {
        set(&LIVE).insert(self.nonce);
    }

    pub fn unregister_live(&self) {
        set(&LIVE).remove(&self.nonce);
    }

    pub fn mark_aborted(&self) {
        set(&LIVE).remove(&self.nonce);
        set(&ABORTED).insert(self.nonce);
    }

    fn is_this_process(&self) -> bool {
        self.pid == std::process::id() && self.start_ticks == self_start_ticks()
    }
}

/// What the store knows about an `in_progress` record's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The owner may still be running the effect.
    Live,
    /// The owner is gone; the effect may or may not have happened.
    Dead,
    /// The owner is gone and certainly never started the effect (its `begin` failed after writing).
    NeverStarted,
}

/// Decides whether `owner` is alive. `lease_until_ns` is only consulted where `/proc` is missing.
pub fn liveness(owner: &Owner, lease_until_ns: u64, now_ns: u64) -> Liveness {
    if owner.pid == 0 {
        // Abandoned (`Owner::abandoned`): its execution may or may not have happened.
        return Liveness::Dead;
    }
    if owner.is_this_process() {
        if set(&LIVE).contains(&owner.nonce) {
            return Liveness::Live;
        }
        if set(&ABORTED).contains(&owner.nonce) {
            return Liveness::NeverStarted;
        }
        // A ticket of this process that was consumed or dropped without storing its outcome.
        return Liveness::Dead;
    }
    if !Path::new("/proc/self/stat").exists() {
        // Without /proc the only evidence is the lease.
        return if now_ns < lease_until_ns {
            Liveness::Live
        } else {
            Liveness::Dead
        };
    }
    match std::fs::read_to_string(format!("/proc/{}/stat", owner.pid)) {
        Ok(stat) => match parse_stat(&stat) {
            Some((state, start)) if start == owner.start_ticks && state != 'Z' && state != 'X' => {
                Liveness::Live
            }
            Some(_) => Liveness::Dead,
            // Unparseable stat: do not declare a possibly running owner dead.
            None => Liveness::Live,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Liveness::Dead,
        // Permission or other trouble: be conservative, an owner wrongly held dead could duplicate.
        Err(_) => Liveness::Live,
    }
}

/// State (field 3) and start time in clock ticks (field 22) from a `/proc/<pid>/stat` line. The
/// command name (field 2) may contain spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// This process's start time in clock ticks, or 0 where `/proc` is unavailable.
pub fn self_start_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .map_or(0, |(_, start)| start)
    })
}

/// Nanoseconds since the Unix epoch (0 for times before it, saturating far in the future).
pub fn now_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The state part of a record.
#[derive(Debug, Clone)]
pub enum State {
    InProgress,
    Completed(StoredResult),
    Failed { error: Box<str>, retryable: bool },
}

impl State {
    pub fn is_in_progress(&self) -> bool {
        matches!(self, State::InProgress)
    }
}

/// A completed call's result as the index keeps it: its canonical JSON text, exactly the bytes
/// of the journal line's `"result"` (so writing a line or compacting copies them instead of
/// canonicalizing again), a few hundred bytes where a `serde_json::Value` tree took kilobytes.
///
/// A replay parses the text back. That gives the very value that was stored unless it holds a
/// number whose RFC 8785 text reads back differently (a float such as `1.0`, which reads back as
/// the integer `1`, or an integer beyond 2^53, which RFC 8785 rounds to a double); for such a
/// value, which no reference tool returns, the value itself is kept as well, so that replays in
/// this process stay identical to the first result. (A process that reads the record from the
/// journal only has the canonical text, as before.)
#[derive(Debug, Clone)]
pub struct StoredResult {
    /// The canonical text, or in [`Form::ToolResult`] only the canonical text of the result's
    /// structured content.
    text: Arc<str>,
    form: Form,
    exact: Option<Arc<Value>>,
}

/// How [`StoredResult::text`] stands for the canonical text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `text` is the canonical text.
    Whole,
    /// The result is an MCP tool result in the shape rmcp's `CallToolResult::structured` gives
    /// (one text block whose text is the structured content's JSON, `isError` false, and with
    /// `complete` the 2026-07-28 protocol's `"resultType":"complete"`), and `text` is the
    /// canonical text of its structured content `S`; the canonical text is
    /// `{"content":[{"text":<S as a JSON string>,"type":"text"}],"isError":false,["resultType":"complete",]"structuredContent":S}`.
    /// The text block repeats the structured content, so this keeps about half the bytes (a
    /// `write_note` result: 232 bytes per key in the index before, about 90 after). Chosen only when
    /// rebuilding the canonical text from `S` gives the very bytes, so it never changes them.
    ToolResult { complete: bool },
}

const TOOL_RESULT_HEAD: &[u8] = b"{\"content\":[{\"text\":";
const TOOL_RESULT_MIDDLE: &[u8] = b",\"type\":\"text\"}],\"isError\":false,";
const TOOL_RESULT_COMPLETE: &[u8] = b"\"resultType\":\"complete\",";
const TOOL_RESULT_STRUCTURED: &[u8] = b"\"structuredContent\":";
const TOOL_RESULT_TAIL: &[u8] = b"}";

impl StoredResult {
    /// The stored form of a result given to `complete` or `resolve`.
    pub fn from_value(value: &Value) -> Result<Self, EffectError> {
        let bytes = canonical_value(value);
        let canonical = String::from_utf8(bytes).map_err(|_| EffectError::InvalidKey {
            reason: "the result's canonical JSON is not UTF-8".to_owned(),
        })?;
        let exact = (!reads_back_exactly(value)).then(|| {
            let mut value = value.clone();
            value.sort_all_objects();
            Arc::new(value)
        });
        Ok(Self::compact(&canonical, value, exact))
    }

    /// A result read from a journal line whose canonical form was checked.
    fn from_canonical(text: &str) -> Self {
        // Parsed only to see whether the shorter form applies; a text that does not parse (it
        // was checked, so it does) is kept whole.
        match serde_json::from_str::<Value>(text) {
            Ok(value) => Self::compact(text, &value, None),
            Err(_) => StoredResult {
                text: text.into(),
                form: Form::Whole,
                exact: None,
            },
        }
    }

    /// The shorter [`Form::ToolResult`] when the canonical text rebuilt from the result's first
    /// text block is `canonical` byte for byte; else the whole text. The comparison alone decides:
    /// equal bytes mean the result has exactly that shape (no other member, one text block,
    /// `isError` false) and that the block's text is the canonical text of `structuredContent`.
    fn compact(canonical: &str, value: &Value, exact: Option<Arc<Value>>) -> Self {
        let text = value.pointer("/content/0/text").and_then(Value::as_str);
        let complete = value.get("resultType").is_some();
        if let Some(text) = text {
            let mut rebuilt = Vec::with_capacity(canonical.len());
            write_tool_result(&mut rebuilt, text, complete);
            if rebuilt == canonical.as_bytes() {
                return StoredResult {
                    text: text.into(),
                    form: Form::ToolResult { complete },
                    exact,
                };
            }
        }
        StoredResult {
            text: canonical.into(),
            form: Form::Whole,
            exact,
        }
    }

    /// The result as a value (parsed from the canonical text unless the value itself is kept).
    ///
    /// Objects come back with their keys in `str` order whatever serde_json's map keeps: its
    /// default map sorts them so, and a build in which some dependency turns on the feature
    /// `preserve_order` (Cedar's does) would otherwise keep the canonical text's order, which
    /// differs for keys beyond U+FFFF. The gate presents a first result in the same order, so a
    /// replay is byte-identical to it in either build.
    pub(crate) fn to_value(&self) -> Result<Value, serde_json::Error> {
        if let Some(value) = &self.exact {
            return Ok(Value::clone(value));
        }
        match self.form {
            Form::Whole => {
                let mut value: Value = serde_json::from_str(&self.text)?;
                value.sort_all_objects();
                Ok(value)
            }
            Form::ToolResult { complete } => {
                let mut structured: Value = serde_json::from_str(&self.text)?;
                structured.sort_all_objects();
                let mut block = serde_json::Map::new();
                block.insert("text".to_owned(), Value::String(self.text.to_string()));
                block.insert("type".to_owned(), Value::String("text".to_owned()));
                let mut result = serde_json::Map::new();
                result.insert(
                    "content".to_owned(),
                    Value::Array(vec![Value::Object(block)]),
                );
                result.insert("isError".to_owned(), Value::Bool(false));
                if complete {
                    result.insert(
                        "resultType".to_owned(),
                        Value::String("complete".to_owned()),
                    );
                }
                result.insert("structuredContent".to_owned(), structured);
                Ok(Value::Object(result))
            }
        }
    }

    /// About the length of the canonical text (a buffer's capacity; exact for the whole form).
    pub(crate) fn canonical_len_hint(&self) -> usize {
        match self.form {
            Form::Whole => self.text.len(),
            // The text twice (once as a string, with its escapes) and the fixed members.
            Form::ToolResult { .. } => 2 * self.text.len() + 128,
        }
    }

    /// Appends the canonical JSON text.
    pub(crate) fn write_canonical(&self, out: &mut Vec<u8>) {
        match self.form {
            Form::Whole => out.extend_from_slice(self.text.as_bytes()),
            Form::ToolResult { complete } => write_tool_result(out, &self.text, complete),
        }
    }

    /// The canonical JSON text.
    pub fn canonical(&self) -> String {
        let mut out = Vec::new();
        self.write_canonical(&mut out);
        // Canonical JSON is UTF-8; a lossy conversion never changes it.
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// Appends the canonical text of a [`Form::ToolResult`] result whose structured content's
/// canonical text is `structured`.
fn write_tool_result(out: &mut Vec<u8>, structured: &str, complete: bool) {
    out.extend_from_slice(TOOL_RESULT_HEAD);
    toolgate_canon::write_canonical_str(out, structured);
    out.extend_from_slice(TOOL_RESULT_MIDDLE);
    if complete {
        out.extend_from_slice(TOOL_RESULT_COMPLETE);
    }
    out.extend_from_slice(TOOL_RESULT_STRUCTURED);
    out.extend_from_slice(structured.as_bytes());
    out.extend_from_slice(TOOL_RESULT_TAIL);
}

/// The largest integer that RFC 8785 (IEEE 754 doubles) writes exactly.
const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// Whether parsing the canonical text of `value` gives `value` back: true unless it holds a float
/// (whose canonical text may read back as an integer) or an integer beyond +-2^53. Strings and
/// key order need no check: the canonical text escapes strings losslessly, and a
/// `serde_json::Map` keeps its keys sorted whichever order they were inserted in.
fn reads_back_exactly(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => true,
        Value::Number(n) => {
            n.as_u64().is_some_and(|u| u <= MAX_EXACT_INTEGER)
                || n.as_i64()
                    .is_some_and(|i| i.unsigned_abs() <= MAX_EXACT_INTEGER)
        }
        Value::Array(items) => items.iter().all(reads_back_exactly),
        Value::Object(map) => map.values().all(reads_back_exactly),
    }
}

/// A parsed record.
///
/// `principal` and `tool` are shared with every other record of the same scope (the journal
/// interns them), so a record costs its fixed fields plus its result text.
#[derive(Debug, Clone)]
pub struct Record {
    pub state: State,
    pub fingerprint: Sha256Digest,
    pub owner: Owner,
    pub lease_until_ns: u64,
    pub created_ns: u64,
    pub finished_ns: Option<u64>,
    pub principal: Arc<str>,
    pub tool: Arc<str>,
}

/// The file form. Times are decimal strings and the nonce is hex, because RFC 8785 numbers are
/// doubles and would round values above 2^53.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerFile {
    nonce: String,
    pid: u32,
    start_ticks: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile<'a> {
    state: String,
    fingerprint: String,
    owner: OwnerFile,
    lease_until_ns: String,
    created_ns: String,
    #[serde(default)]
    finished_ns: Option<String>,
    /// Borrowed as text: the line was checked canonical as a whole, so this slice is the
    /// result's canonical form. Present means `Some`, also for a `null` result (which a plain
    /// `Option` would read as absent, making the record unreadable).
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    retryable: Option<bool>,
    principal: String,
    tool: String,
}

/// A field that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// One journal line: the full new state of the record `name`, or `null` once it was removed
/// (pruned or forgotten). Only read this way; [`encode_line`] writes the same form directly.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LineFile<'a> {
    name: String,
    #[serde(borrow)]
    record: Option<RecordFile<'a>>,
}

/// The canonical JSON line (with its trailing newline) recording that `name` now is `record`
/// (`None`: removed).
///
/// Written field by field in RFC 8785 order rather than through a serializer, so that a completed
/// record's result is copied from its stored canonical text instead of being canonicalized again.
/// The bytes are exactly those of the canonical JSON of `{"name", "record"}` (a test compares
/// them with the canonicalizer's output, and `parse_line` rejects any line that is not canonical).
pub(crate) fn encode_line(
    name: &Sha256Digest,
    record: Option<&Record>,
) -> Result<Vec<u8>, EffectError> {
    let result_len = match record.map(|r| &r.state) {
        Some(State::Completed(result)) => result.canonical_len_hint(),
        _ => 0,
    };
    let mut out = Vec::with_capacity(LINE_OVERHEAD + result_len);
    out.extend_from_slice(b"{\"name\":\"");
    out.extend_from_slice(name.to_hex().as_bytes());
    out.extend_from_slice(b"\",\"record\":");
    match record {
        Some(record) => record.write_canonical(&mut out),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b"}\n");
    let len = out.len() as u64;
    // A line the journal could not read back would make every later open fail.
    if len > super::MAX_LINE_BYTES {
        return Err(EffectError::RecordTooLarge {
            key_digest: *name,
            len,
            max: super::MAX_LINE_BYTES,
        });
    }
    Ok(out)
}

/// About what a line takes besides its result (name, fingerprint, times, owner, scope, keys).
const LINE_OVERHEAD: usize = 512;

impl Record {
    /// Appends the canonical JSON object of this record. Keys in RFC 8785 order (UTF-16 code
    /// units; all ASCII here, so byte order): created_ns, error, fingerprint, finished_ns,
    /// lease_until_ns, owner (nonce, pid, start_ticks), principal, result, retryable, state, tool.
    fn write_canonical(&self, out: &mut Vec<u8>) {
        let (state, result, error, retryable) = match &self.state {
            State::InProgress => ("in_progress", None, None, None),
            State::Completed(result) => ("completed", Some(result), None, None),
            State::Failed { error, retryable } => {
                ("failed", None, Some(&**error), Some(*retryable))
            }
        };
        out.extend_from_slice(b"{\"created_ns\":");
        write_decimal_string(out, self.created_ns);
        if let Some(error) = error {
            out.extend_from_slice(b",\"error\":");
            write_canonical_str(out, error);
        }
        out.extend_from_slice(b",\"fingerprint\":\"");
        out.extend_from_slice(self.fingerprint.to_hex().as_bytes());
        out.push(b'"');
        if let Some(finished_ns) = self.finished_ns {
            out.extend_from_slice(b",\"finished_ns\":");
            write_decimal_string(out, finished_ns);
        }
        out.extend_from_slice(b",\"lease_until_ns\":");
        write_decimal_string(out, self.lease_until_ns);
        out.extend_from_slice(
            format!(
                ",\"owner\":{{\"nonce\":\"{:016x}\",\"pid\":",
                self.owner.nonce
            )
            .as_bytes(),
        );
        write_canonical_u64(out, u64::from(self.owner.pid));
        out.extend_from_slice(b",\"start_ticks\":");
        write_canonical_u64(out, self.owner.start_ticks);
        out.extend_from_slice(b"},\"principal\":");
        write_canonical_str(out, &self.principal);
        if let Some(result) = result {
            out.extend_from_slice(b",\"result\":");
            result.write_canonical(out);
        }
        if let Some(retryable) = retryable {
            out.extend_from_slice(if retryable {
                b",\"retryable\":true"
            } else {
                b",\"retryable\":false"
            });
        }
        out.extend_from_slice(b",\"state\":\"");
        out.extend_from_slice(state.as_bytes());
        out.extend_from_slice(b"\",\"tool\":");
        write_canonical_str(out, &self.tool);
        out.push(b'}');
    }
}

/// A `u64` as a JSON string of decimal digits (times are stored so: RFC 8785 numbers are doubles).
fn write_decimal_string(out: &mut Vec<u8>, n: u64) {
    out.push(b'"');
    out.extend_from_slice(n.to_string().as_bytes());
    out.push(b'"');
}

/// Parses one complete journal line (without its newline), requiring exactly the canonical bytes
/// the store writes. `line_no` (1-based) names the line in errors. Never panics.
pub(crate) fn parse_line(
    path: &Path,
    line_no: u64,
    bytes: &[u8],
) -> Result<(Sha256Digest, Option<Record>), EffectError> {
    let corrupt = |reason: String| EffectError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("line {line_no}: {reason}"),
    };
    if bytes.is_empty() {
        return Err(corrupt("the line is empty".to_owned()));
    }
    let line: LineFile = serde_json::from_slice(bytes).map_err(|e| {
        corrupt(format!(
            "not a valid journal line ({:?} error at column {})",
            e.classify(),
            e.column()
        ))
    })?;
    if !is_canonical(bytes) {
        return Err(corrupt(
            "valid JSON but not in canonical (RFC 8785) form, so the store did not write it"
                .to_owned(),
        ));
    }
    let name_ok = line.name.len() == 64
        && line
            .name
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let name: Sha256Digest = if name_ok {
        line.name.parse().ok()
    } else {
        None
    }
    .ok_or_else(|| corrupt("name is not a lowercase SHA-256 hex digest".to_owned()))?;
    let record = match line.record {
        Some(file) => Some(Record::from_file(file, &corrupt)?),
        None => None,
    };
    Ok((name, record))
}

impl Record {
    /// Parses a record file of the previous layout (one file per record), requiring exactly the
    /// canonical bytes the store wrote. Never panics.
    pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Record, EffectError> {
        let corrupt = |reason: String| EffectError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.is_empty() {
            return Err(corrupt("the file is empty".to_owned()));
        }
        let file: RecordFile = serde_json::from_slice(bytes).map_err(|e| {
            // Only the class and position: serde_json messages may quote input fragments.
            corrupt(format!(
                "not a valid effect record ({:?} error at line {}, column {})",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        if !is_canonical(bytes) {
            return Err(corrupt(
                "valid JSON but not in canonical (RFC 8785) form, so the store did not write it"
                    .to_owned(),
            ));
        }
        Record::from_file(file, &corrupt)
    }

    fn from_file(
        file: RecordFile<'_>,
        corrupt: &dyn Fn(String) -> EffectError,
    ) -> Result<Record, EffectError> {
        let num = |what: &str, s: &str| -> Result<u64, EffectError> {
            s.parse()
                .map_err(|_| corrupt(format!("{what} is not a decimal integer")))
        };
        let fingerprint = file
            .fingerprint
            .parse()
            .map_err(|_| corrupt("fingerprint is not a SHA-256 hex digest".to_owned()))?;
        let nonce = u64::from_str_radix(&file.owner.nonce, 16)
            .map_err(|_| corrupt("owner.nonce is not hex".to_owned()))?;
        let state = match (file.state.as_str(), file.result, file.error, file.retryable) {
            ("in_progress", None, None, None) => State::InProgress,
            ("completed", Some(raw), None, None) => {
                State::Completed(StoredResult::from_canonical(raw.get()))
            }
            ("failed", None, Some(error), Some(retryable)) => State::Failed {
                error: error.into(),
                retryable,
            },
            _ => {
                return Err(corrupt(
                    "state and result/error fields do not match".to_owned(),
                ));
            }
        };
        let finished_ns = match &file.finished_ns {
            Some(s) => Some(num("finished_ns", s)?),
            None => None,
        };
        if state.is_in_progress() != finished_ns.is_none() {
            return Err(corrupt(
                "finished_ns must be present exactly for finished records".to_owned(),
            ));
        }
        Ok(Record {
            state,
            fingerprint,
            owner: Owner {
                pid: file.owner.pid,
                start_ticks: file.owner.start_ticks,
                nonce,
            },
            lease_until_ns: num("lease_until_ns", &file.lease_until_ns)?,
            created_ns: num("created_ns", &file.created_ns)?,
            finished_ns,
            principal: file.principal.into(),
            tool: file.tool.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stat_fields_after_last_paren() {
        let line = "123 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21";
        assert_eq!(parse_stat(line), Some(('S', 4242)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[test]
    fn this_process_has_start_ticks() {
        assert!(self_start_ticks() > 0);
        assert!(toolgate_storage::pid_alive(std::process::id()));
    }

    /// A small deterministic generator, so the cases below are the same on every run.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 11
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// Strings that exercise every escaping rule: quotes, backslashes, control characters,
        /// DEL, non-ASCII, U+2028, characters outside the BMP.
        fn string(&mut self) -> String {
            const PIECES: [&str; 14] = [
                "a", "Z", "0", " ", "\"", "\\", "/", "\n", "\u{1}", "\u{7f}", "é", "\u{2028}", "𝄞",
                "note",
            ];
            (0..self.below(6))
                .map(|_| PIECES[self.below(PIECES.len() as u64) as usize])
                .collect()
        }

        fn number(&mut self) -> Value {
            match self.below(7) {
                0 => json!(self.below(1000)),
                1 => json!(-(self.below(1000) as i64)),
                2 => json!(u64::MAX - self.below(3)),
                3 => json!(i64::MIN + self.below(3) as i64),
                4 => json!(self.below(1000) as f64),
                5 => json!(self.below(1_000_000) as f64 / 7.0),
                _ => json!(1e21 * (self.below(5) + 1) as f64),
            }
        }

        fn value(&mut self, depth: u32) -> Value {
            match self.below(if depth == 0 { 5 } else { 7 }) {
                0 => Value::Null,
                1 => json!(self.below(2) == 0),
                2 => self.number(),
                3 | 4 => json!(self.string()),
                5 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
                _ => Value::Object(
                    (0..self.below(4))
                        .map(|_| (self.string(), self.value(depth - 1)))
                        .collect(),
                ),
            }
        }

        fn record(&mut self) -> Record {
            let state = match self.below(3) {
                0 => State::InProgress,
                1 => State::Completed(
                    StoredResult::from_value(&self.value(3)).expect("canonicalizes"),
                ),
                _ => State::Failed {
                    error: self.string().into(),
                    retryable: self.below(2) == 0,
                },
            };
            let finished_ns = (!state.is_in_progress()).then(|| self.next());
            Record {
                state,
                fingerprint: Sha256Digest::of(&self.next().to_le_bytes()),
                owner: Owner {
                    pid: [0, 1, u32::MAX][self.below(3) as usize],
                    start_ticks: [
                        0,
                        12_345,
                        MAX_EXACT_INTEGER,
                        MAX_EXACT_INTEGER + 1,
                        u64::MAX,
                    ][self.below(5) as usize],
                    nonce: [0, self.next(), u64::MAX][self.below(3) as usize],
                },
                lease_until_ns: [0, self.next(), u64::MAX][self.below(3) as usize],
                created_ns: self.next(),
                finished_ns,
                principal: [String::from("local"), self.string()][self.below(2) as usize]
                    .as_str()
                    .into(),
                tool: [String::from("write_note"), self.string()][self.below(2) as usize]
                    .as_str()
                    .into(),
            }
        }
    }

    /// The line as the canonicalizer writes the full JSON document (what `encode_line` wrote
    /// before it assembled lines itself).
    fn line_via_canonicalizer(name: &Sha256Digest, record: Option<&Record>) -> Vec<u8> {
        let record = record.map(|r| {
            let mut file = json!({
                "state": match &r.state {
                    State::InProgress => "in_progress",
                    State::Completed(_) => "completed",
                    State::Failed { .. } => "failed",
                },
                "fingerprint": r.fingerprint.to_hex(),
                "owner": {
                    "nonce": format!("{:016x}", r.owner.nonce),
                    "pid": r.owner.pid,
                    "start_ticks": r.owner.start_ticks,
                },
                "lease_until_ns": r.lease_until_ns.to_string(),
                "created_ns": r.created_ns.to_string(),
                "principal": &*r.principal,
                "tool": &*r.tool,
            });
            if let Some(finished) = r.finished_ns {
                file["finished_ns"] = json!(finished.to_string());
            }
            match &r.state {
                State::InProgress => {}
                State::Completed(result) => {
                    file["result"] = result.to_value().expect("parses");
                }
                State::Failed { error, retryable } => {
                    file["error"] = json!(&**error);
                    file["retryable"] = json!(retryable);
                }
            }
            file
        });
        let mut bytes = canonical_value(&json!({"name": name.to_hex(), "record": record}));
        bytes.push(b'\n');
        bytes
    }

    #[test]
    fn lines_are_the_canonical_json_of_the_record() {
        let mut rng = Lcg(7);
        let path = Path::new("effects.journal");
        for case in 0..3000 {
            let name = Sha256Digest::of(&rng.next().to_le_bytes());
            let record = (case % 10 != 0).then(|| rng.record());
            let line = encode_line(&name, record.as_ref()).expect("encodes");
            assert_eq!(
                String::from_utf8_lossy(&line),
                String::from_utf8_lossy(&line_via_canonicalizer(&name, record.as_ref())),
                "case {case}"
            );
            // It reads back (the parser insists on canonical bytes) to a record that writes the
            // same line again. (Not a `start_ticks` near u64::MAX: RFC 8785 writes it as a double
            // beyond u64, which the parser refuses, before this change as after.)
            if record
                .as_ref()
                .is_some_and(|r| r.owner.start_ticks == u64::MAX)
            {
                continue;
            }
            let (parsed_name, parsed) =
                parse_line(path, 1, &line[..line.len() - 1]).expect("parses");
            assert_eq!(parsed_name, name);
            let again = encode_line(&name, parsed.as_ref()).expect("encodes");
            assert_eq!(again, line, "case {case}");
        }
    }

    #[test]
    fn stored_results_read_back_as_given() {
        let mut rng = Lcg(11);
        for case in 0..3000 {
            let value = rng.value(4);
            let stored = StoredResult::from_value(&value).expect("canonicalizes");
            let back = stored.to_value().expect("parses");
            // The same value, and the same bytes when serialized again (what a replay sends).
            assert_eq!(back, value, "case {case}");
            assert_eq!(
                serde_json::to_string(&back).expect("serializes"),
                serde_json::to_string(&in_key_order(&value)).expect("serializes"),
                "case {case}"
            );
            assert_eq!(stored.canonical().as_bytes(), canonical_value(&value));
            // Only values that need it keep more than the text.
            assert_eq!(stored.exact.is_none(), reads_back_exactly(&value));
            if reads_back_exactly(&value) {
                let from_text = StoredResult::from_canonical(&stored.canonical());
                assert_eq!(from_text.to_value().expect("parses"), value, "case {case}");
            }
        }
    }

    /// A tool result shaped as rmcp's `CallToolResult::structured` makes it keeps only its
    /// structured content's text, and gives back the same canonical bytes, value and serialization
    /// as the whole text would; anything else in that neighbourhood is kept whole.
    #[test]
    fn tool_results_keep_their_structured_text_and_read_back_identically() {
        fn tool_result(text: Value, structured: Value, is_error: bool) -> Value {
            json!({
                "content": [{"type": "text", "text": text}],
                "isError": is_error,
                "structuredContent": structured,
            })
        }
        fn check(value: &Value) -> Form {
            let stored = StoredResult::from_value(value).expect("canonicalizes");
            let canonical = canonical_value(value);
            assert_eq!(stored.canonical().as_bytes(), canonical, "{value}");
            let mut line = Vec::new();
            stored.write_canonical(&mut line);
            assert_eq!(line, canonical, "{value}");
            assert_eq!(stored.to_value().expect("parses"), *value, "{value}");
            assert_eq!(
                serde_json::to_string(&stored.to_value().expect("parses")).expect("serializes"),
                serde_json::to_string(&in_key_order(value)).expect("serializes"),
                "{value}"
            );
            if stored.exact.is_none() {
                let from_text = StoredResult::from_canonical(&stored.canonical());
                assert_eq!(from_text.form, stored.form, "{value}");
                assert_eq!(from_text.canonical(), stored.canonical(), "{value}");
            }
            stored.form
        }
        let note = json!({"request_id": "req-0001", "status": "committed"});
        let text = Value::String(note.to_string());
        assert_eq!(
            check(&tool_result(text.clone(), note.clone(), false)),
            Form::ToolResult { complete: false }
        );
        // As rmcp serializes it for the 2026-07-28 protocol.
        let mut complete = tool_result(text.clone(), note.clone(), false);
        complete["resultType"] = json!("complete");
        assert_eq!(check(&complete), Form::ToolResult { complete: true });
        let mut other_kind = tool_result(text.clone(), note.clone(), false);
        other_kind["resultType"] = json!("task");
        assert_eq!(check(&other_kind), Form::Whole);
        let odd = json!({"s": "quote \" back \\ nl \n tab \t ctl \u{1f} é \u{2028} 😀", "n": [1, -2, null]});
        assert_eq!(
            check(&tool_result(
                Value::String(String::from_utf8(canonical_value(&odd)).unwrap()),
                odd,
                false
            )),
            Form::ToolResult { complete: false }
        );
        // Near misses are kept whole.
        assert_eq!(
            check(&tool_result(text.clone(), note.clone(), true)),
            Form::Whole
        );
        assert_eq!(
            check(&tool_result(
                json!("{\"status\": \"committed\"}"),
                note.clone(),
                false
            )),
            Form::Whole
        );
        let mut extra = tool_result(text.clone(), note.clone(), false);
        extra["_meta"] = json!({});
        assert_eq!(check(&extra), Form::Whole);
        let mut two_blocks = tool_result(text.clone(), note.clone(), false);
        two_blocks["content"] =
            json!([{"type": "text", "text": text}, {"type": "text", "text": "x"}]);
        assert_eq!(check(&two_blocks), Form::Whole);
        let mut image = tool_result(text.clone(), note.clone(), false);
        image["content"][0]["type"] = json!("image");
        assert_eq!(check(&image), Form::Whole);
        // Generated structured contents, with the text rmcp writes (serde_json's compact form).
        let mut rng = Lcg(23);
        let mut compact = 0;
        for _ in 0..2000 {
            let structured = rng.value(3);
            let text = Value::String(structured.to_string());
            if check(&tool_result(text, structured, false))
                == (Form::ToolResult { complete: false })
            {
                compact += 1;
            }
        }
        assert!(compact > 0, "no generated result took the shorter form");
    }

    #[test]
    fn results_with_inexact_numbers_keep_their_value() {
        for (value, exact) in [
            (json!({"a": [1, -2, "x", null, true]}), true),
            (json!({"n": 9_007_199_254_740_992_u64}), true),
            (json!({"n": -9_007_199_254_740_992_i64}), true),
            (json!({"n": 9_007_199_254_740_993_u64}), false),
            (json!({"n": 1.0}), false),
            (json!([0.5]), false),
        ] {
            let stored = StoredResult::from_value(&value).expect("canonicalizes");
            assert_eq!(stored.exact.is_none(), exact, "{value}");
            assert_eq!(stored.to_value().expect("parses"), value);
        }
        // Inserted out of order, replayed in key order whether serde_json's maps keep insertion
        // order or not (a dependency may turn `preserve_order` on for the whole build), from every
        // form: kept whole, the shorter tool-result form and an inexact value kept as given.
        let mut map = serde_json::Map::new();
        map.insert("status".into(), json!("committed"));
        map.insert("request_id".into(), json!("r"));
        map.insert("n".into(), json!(1.5));
        let inexact = Value::Object(map.clone());
        map.remove("n");
        let exact = Value::Object(map);
        let text = serde_json::to_string(&exact).expect("serializes");
        let tool = json!({"content": [{"type": "text", "text": text}], "isError": false, "structuredContent": exact});
        for (value, sorted) in [
            (
                &exact,
                r#"{"request_id":"r","status":"committed"}"#.to_owned(),
            ),
            (
                &inexact,
                r#"{"n":1.5,"request_id":"r","status":"committed"}"#.to_owned(),
            ),
            (
                &tool,
                format!(
                    r#"{{"content":[{{"text":{},"type":"text"}}],"isError":false,"structuredContent":{{"request_id":"r","status":"committed"}}}}"#,
                    serde_json::to_string(&text).expect("serializes")
                ),
            ),
        ] {
            let stored = StoredResult::from_value(value).expect("canonicalizes");
            assert_eq!(
                serde_json::to_string(&stored.to_value().expect("parses")).expect("serializes"),
                sorted
            );
        }
        // Keys beyond U+FFFF: RFC 8785 orders by UTF-16 units ("\u{ff61}" after "\u{1f600}"), a
        // replay by `str` (code points), the order of serde_json's default map.
        let mut map = serde_json::Map::new();
        map.insert("\u{ff61}".into(), json!(1));
        map.insert("\u{1f600}".into(), json!(2));
        let value = Value::Object(map);
        let stored = StoredResult::from_value(&value).expect("canonicalizes");
        assert_eq!(stored.canonical(), "{\"\u{1f600}\":2,\"\u{ff61}\":1}");
        assert_eq!(
            serde_json::to_string(&stored.to_value().expect("parses")).expect("serializes"),
            "{\"\u{ff61}\":1,\"\u{1f600}\":2}"
        );
    }

    /// `value` with every object's keys in `str` order, as a replay gives it back.
    fn in_key_order(value: &Value) -> Value {
        let mut value = value.clone();
        value.sort_all_objects();
        value
    }
}
