//! The on-disk record of one (scope, key) and the owner identity used to tell live calls from dead.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_canon::{Sha256Digest, is_canonical, to_canonical_vec};

use super::EffectError;

/// The call that holds (or held) an `in_progress` record.
///
/// `pid` and `start_ticks` (field 22 of `/proc/<pid>/stat`) identify a process even across pid
/// reuse; `nonce` identifies one [`super::Ticket`] within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) pid: u32,
    pub(crate) start_ticks: u64,
    pub(crate) nonce: u64,
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
    pub(crate) fn fresh() -> Self {
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

    pub(crate) fn register_live(&self) {
        set(&LIVE).insert(self.nonce);
    }

    pub(crate) fn unregister_live(&self) {
        set(&LIVE).remove(&self.nonce);
    }

    pub(crate) fn mark_aborted(&self) {
        set(&LIVE).remove(&self.nonce);
        set(&ABORTED).insert(self.nonce);
    }

    fn is_this_process(&self) -> bool {
        self.pid == std::process::id() && self.start_ticks == self_start_ticks()
    }
}

/// What the store knows about an `in_progress` record's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// The owner may still be running the effect.
    Live,
    /// The owner is gone; the effect may or may not have happened.
    Dead,
    /// The owner is gone and certainly never started the effect (its `begin` failed after writing).
    NeverStarted,
}

/// Decides whether `owner` is alive. `lease_until_ns` is only consulted where `/proc` is missing.
pub(crate) fn liveness(owner: &Owner, lease_until_ns: u64, now_ns: u64) -> Liveness {
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

/// Whether process `pid` exists (used for orphaned temporary files). Unknown counts as alive.
pub(crate) fn pid_alive(pid: u32) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(parse_stat(&stat), Some(('Z' | 'X', _))),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
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
pub(crate) fn self_start_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .map_or(0, |(_, start)| start)
    })
}

/// Nanoseconds since the Unix epoch (0 for times before it, saturating far in the future).
pub(crate) fn now_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The state part of a record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    InProgress,
    Completed(Value),
    Failed { error: String, retryable: bool },
}

/// A parsed record.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) state: State,
    pub(crate) fingerprint: Sha256Digest,
    pub(crate) owner: Owner,
    pub(crate) lease_until_ns: u64,
    pub(crate) created_ns: u64,
    pub(crate) finished_ns: Option<u64>,
    pub(crate) principal: String,
    pub(crate) tool: String,
}

/// The file form. Times are decimal strings and the nonce is hex, because RFC 8785 numbers are
/// doubles and would round values above 2^53.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerFile {
    nonce: String,
    pid: u32,
    start_ticks: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile {
    state: String,
    fingerprint: String,
    owner: OwnerFile,
    lease_until_ns: String,
    created_ns: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_ns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retryable: Option<bool>,
    principal: String,
    tool: String,
}

/// One journal line: the full new state of the record `name`, or `null` once it was removed
/// (pruned or forgotten).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineFile {
    name: String,
    record: Option<RecordFile>,
}

/// The canonical JSON line (with its trailing newline) recording that `name` now is `record`
/// (`None`: removed).
pub(crate) fn encode_line(
    name: &Sha256Digest,
    record: Option<&Record>,
) -> Result<Vec<u8>, EffectError> {
    let line = LineFile {
        name: name.to_hex(),
        record: record.map(Record::to_file),
    };
    let mut bytes = canonical(&line)?;
    bytes.push(b'\n');
    Ok(bytes)
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

fn canonical<T: Serialize>(value: &T) -> Result<Vec<u8>, EffectError> {
    // Cannot fail: records hold only strings, small integers and a `serde_json::Value` (finite
    // numbers, string keys), all of which RFC 8785 represents. The error is kept rather than
    // unwrapped so that a future field cannot turn into a panic.
    to_canonical_vec(value).map_err(|e| EffectError::InvalidKey {
        reason: format!("the result cannot be stored as canonical JSON: {e}"),
    })
}

impl Record {
    fn to_file(&self) -> RecordFile {
        let (state, result, error, retryable) = match &self.state {
            State::InProgress => ("in_progress", None, None, None),
            State::Completed(v) => ("completed", Some(v.clone()), None, None),
            State::Failed { error, retryable } => {
                ("failed", None, Some(error.clone()), Some(*retryable))
            }
        };
        RecordFile {
            state: state.to_owned(),
            fingerprint: self.fingerprint.to_hex(),
            owner: OwnerFile {
                nonce: format!("{:016x}", self.owner.nonce),
                pid: self.owner.pid,
                start_ticks: self.owner.start_ticks,
            },
            lease_until_ns: self.lease_until_ns.to_string(),
            created_ns: self.created_ns.to_string(),
            finished_ns: self.finished_ns.map(|n| n.to_string()),
            result,
            error,
            retryable,
            principal: self.principal.clone(),
            tool: self.tool.clone(),
        }
    }

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
        file: RecordFile,
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
            ("completed", Some(v), None, None) => State::Completed(v),
            ("failed", None, Some(error), Some(retryable)) => State::Failed { error, retryable },
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
        if (state == State::InProgress) != finished_ns.is_none() {
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
            principal: file.principal,
            tool: file.tool,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(pid_alive(std::process::id()));
    }
}
