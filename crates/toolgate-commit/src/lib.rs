//! Exactly-once effects: the one place in toolgate that deduplicates calls by idempotency key.
//!
//! [`EffectStore`] is a durable state machine per (principal, tool, key): the gate asks it
//! before running a tool the policy opts in (`idempotency`), and it answers execute (exactly once),
//! replay (the stored result), conflict (the same key with other arguments), in progress or
//! indeterminate. Tools themselves contain no key logic. The store keeps its journal on the storage
//! floor (`toolgate-storage`), whose `Storage` trait lets tests count and fail every write and sync.
//! `docs/commit-store.md` documents the layout and the durability assumptions.
//!
//! # Use
//!
//! A caller asks [`EffectStore::begin`] before performing a side effect. The store answers
//! [`Begin::Execute`] exactly once per key (with a [`Ticket`] to report the outcome through
//! [`EffectStore::complete`] or [`EffectStore::fail`]), and afterwards replays the stored outcome
//! instead of executing again. `docs/commit-store.md` ("Effect store") documents the layout and
//! the durability assumptions; this comment is the state machine.
//!
//! # Records
//!
//! One record per (scope, key), named by the hex SHA-256 of canonical `{"key","principal","tool"}`,
//! holding `{"state": "in_progress" | "completed" | "failed", "fingerprint", "owner": {"pid",
//! "start_ticks", "nonce"}, "lease_until_ns", "created_ns", "finished_ns" (finished records),
//! "result" (completed), "error" and "retryable" (failed), "principal", "tool"}`. Every state change
//! appends one line to `dir/effects.journal`: the canonical JSON of `{"name", "record"}` with the
//! full new state (`null` when the record was removed). The key text itself is not stored: the
//! name already identifies it, and keys may be derived from arguments. Times are decimal strings of
//! nanoseconds since the epoch and the nonce is hex, because RFC 8785 numbers are doubles.
//!
//! # State machine of `begin`
//!
//! | record                                     | same fingerprint                        | other fingerprint |
//! |--------------------------------------------|-----------------------------------------|-------------------|
//! | absent                                     | write `in_progress`, `Execute`          | (n/a)             |
//! | `completed`                                | `Replay(result)`, not executed          | `Conflict`        |
//! | `failed`, not retryable                    | `ReplayFailure(error)`                  | `Conflict`        |
//! | `failed`, retryable                        | new `in_progress`, `Execute`            | `Conflict`        |
//! | `in_progress`, owner alive                 | `InProgress { retry_after }` (or wait)  | `Conflict`        |
//! | `in_progress`, owner dead, `Idempotent`    | take over: new owner, `Execute`         | `Conflict`        |
//! | `in_progress`, owner dead, `Unsafe`        | `Indeterminate` until [`EffectStore::resolve`] | `Conflict` |
//!
//! The `in_progress` record is written to the journal before `Execute` is returned, so a crash of
//! the process after the effect always leaves evidence; for `Unsafe` effects it is also durable
//! (fdatasynced) by then, so a power loss does too (see "Idempotent effects" below). An owner is `(pid, start ticks, nonce)`: it is dead when no process with
//! that pid exists, when the process with that pid started at another time (field 22 of
//! `/proc/<pid>/stat`, so pid reuse is detected), or, inside this process, when its ticket was
//! consumed or dropped without storing an outcome. Only where `/proc` is unavailable does an
//! expired lease count as death. **A live owner whose lease has expired is still live**: a slow
//! effect is not a dead one, and declaring it dead could run an unsafe effect twice; the lease
//! then only sets `retry_after` (at least one second).
//!
//! # Concurrency and durability
//!
//! Each store keeps an index (name -> latest record) built at open from the journal; a completed
//! record's result is kept there as its canonical JSON text (the bytes of its journal line), not
//! as a `serde_json::Value` tree, so a record costs a few hundred bytes. Every call is a job for a
//! pipelined group commit: the first waiting caller becomes the leader and, under an exclusive
//! `flock` of `dir/.lock`, applies the lines other processes appended since it last looked, decides
//! every queued job in order against the index (the compare-and-swap: decision and append under
//! one lock, on the latest state) and writes all new lines with one write. It then releases the
//! lock, hands the lead to the next waiting caller, and makes its lines durable with one
//! `fdatasync` (skipped when no answer of the batch needs it, below; shared when another leader's
//! `fdatasync` started after its write), while the next batch is decided and written; then it
//! wakes its own callers. A call returns only after an `fdatasync` covering its line (or every not
//! yet durable line its answer depends on) succeeded: durability is tracked as an offset of the
//! journal, and each record remembers where its latest line ends. The journal file is the storage
//! floor's padded [`toolgate_storage::Journal`]: it grows in zero-filled chunks so appends do not
//! change its size, it reads the lines others appended (each at most [`MAX_LINE_BYTES`]), and it
//! notices a compaction by another process by file identity; a torn last line is zeroed, a
//! corrupt complete line is `Corrupt` naming the line. `docs/commit-store.md` has the details.
//!
//! # Idempotent effects: written, durable with the next fdatasync
//!
//! An `Unsafe` begin+complete cycle costs 2 `fdatasync`s one after the other: the `in_progress`
//! line must be durable before the effect runs (after a power loss, indeterminate detection
//! depends on it), and the outcome before `complete` returns. An `Idempotent` cycle costs none on
//! the call path: its `in_progress` line and its outcome are written (one `pwrite` each, under the
//! lock), and answers about it (replays, conflicts, in progress, takeovers) may rest on written
//! lines. They become durable with the next `fdatasync` of the journal (an unsafe job's, a
//! prune's, a compaction's, or [`EffectStore::sync`], which a server calls at shutdown). What each
//! failure loses:
//!
//! - **process crash (SIGKILL, panic, OOM kill)**: nothing. The written lines are in the page cache,
//!   which outlives the process; other threads and processes read the journal through it, so they
//!   see the record at once, a completed call replays, and after the owner's death a retry takes an
//!   interrupted record over, as for any dead owner of an idempotent effect.
//! - **power loss or kernel crash**: the lines written since the last `fdatasync` may be lost. A key
//!   whose record is lost is absent again (or back to an earlier state), so a retry executes the
//!   effect again, which is harmless by the `Idempotent` declaration, and a call with other
//!   arguments under that key is no longer a conflict. Tools whose key must never be forgotten are
//!   declared `Unsafe`. (If writeback persisted a later page of unsynced lines but not an earlier
//!   one, `open` zeroes a fragment after the logical end and reports whole lines there as
//!   `Corrupt`.)
//!
//! Answers about unsafe effects never rest on a line that is not durable: a record's latest line
//! (written by this store or read from another's appends) is durable once this store's
//! `fdatasync`s reach its end offset, and an unsafe job whose answer depends on one that is not yet
//! (a `Conflict`, `InProgress`, `Replay` or takeover decided on it), any unsafe `complete` or
//! `fail`, and every `resolve` and `prune`, make their batch fdatasync before answering.
//!
//! # Compaction
//!
//! Superseded and removed lines stay in the journal until [`EffectStore::compact`] rewrites it as
//! one line per live record (same format, sorted by name): under the exclusive lock, after an
//! `fdatasync` of the old journal, into `.effects.journal.compact.tmp` (written, fdatasynced),
//! renamed over `effects.journal`, then the directory is fsynced. A crash at any point leaves the
//! old journal or the complete new one; an orphaned temporary file is removed at open. It runs on
//! request, after every `prune` (best-effort), and in the batch leader once the used length
//! exceeds `max(4 MiB, 4 x the live records' lines)` ([`EffectConfig::compact_min_bytes`]; with
//! the factor 4 the rewrite costs at most a third of what was appended since the previous one).
//! Other processes and store instances keep the old file open; before every batch, under the lock,
//! they compare the `(st_dev, st_ino)` of their open journal with a `stat` of its path, and on a
//! difference they open the new file, fsync the directory (the compacting process may have died
//! before doing so) and rebuild their index from it. Their open descriptor pins the old inode, so
//! its number cannot be reused by a new file while they compare.

#![forbid(unsafe_code)]

/// A test-only callback invoked with the name of each crash point the store reaches.
///
/// The reference server installs one that creates a marker file and sleeps, so that a test can kill
/// the process at exactly that point. It only exists with the `fault-injection` feature, so that a
/// production build has no code path that can stall a commit.
#[cfg(feature = "fault-injection")]
pub type FaultHook = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;

mod memory;
mod record;

/// The pieces of the exactly-once state machine that every backend runs, public so that the
/// PostgreSQL backend (`toolgate-postgres`) decides by the very code the file store does. Not a
/// stable API: a backend outside this workspace should wrap an `EffectBackend` instead.
#[doc(hidden)]
pub mod machine {
    pub use crate::record::{
        Liveness, Owner, Record, State, StoredResult, liveness, now_ns, self_start_ticks,
    };
    pub use crate::{
        CounterTable, Course, answer, decide, in_progress, record_name, resolvable, settled,
    };
}

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use toolgate_canon::Sha256Digest;

pub use memory::MemoryEffects;
use record::{
    Liveness, Owner, Record, State, StoredResult, encode_line, liveness, now_ns, parse_line,
};
use toolgate_storage::{
    AtPath, Caller, GroupCommit, Journal as JournalFile, JournalConfig, JournalError, JournalStep,
    Layout, LockFile, LockGuard, Missing, SyncHandle,
};
pub use toolgate_storage::{FaultyStorage, FsStorage, Op, Storage};

/// The lock file every transition locks exclusively; its contents are irrelevant.
const LOCK_FILE_NAME: &str = ".lock";
const HEX_LEN: usize = 64;
/// The shortest retry-after a caller is told.
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Who and what a key belongs to: keys are scoped to principal and tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The authenticated caller.
    pub principal: String,
    /// The tool name.
    pub tool: String,
}

/// What the caller asks: the same key with another fingerprint is a conflict.
#[derive(Debug, Clone)]
pub struct EffectRequest {
    /// Whose key it is.
    pub scope: Scope,
    /// The idempotency key: non-empty, at most [`MAX_KEY_BYTES`] bytes of UTF-8, no control
    /// characters.
    pub key: String,
    /// What the request asks (e.g. SHA-256 of canonical arguments and the input schema digest).
    pub fingerprint: Sha256Digest,
}

/// Whether an effect may be re-run after its owner died mid-effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectKind {
    /// Re-running is harmless: a dead owner's `in_progress` record may be taken over.
    Idempotent,
    /// Re-running could duplicate: a dead owner's record is indeterminate.
    Unsafe,
}

/// An exactly-once backend: where the one state machine of this module keeps its records.
///
/// [`EffectStore`] keeps them in a journal under a directory (one machine; `/proc` tells live
/// owners from dead ones), [`MemoryEffects`] in memory (one process; for tests and embedders).
/// Nothing here names files, processes or locks: a backend keeps, per (principal, tool, key), the
/// record `absent -> in_progress (owner + lease) -> completed | failed`, decides every `begin`
/// against the latest record atomically, and answers exactly as the module documentation's table
/// says. Tickets are created by the backends of this crate; `tests/effect_conformance.rs` runs
/// the same cases against every backend.
pub trait EffectBackend: Send + Sync + fmt::Debug {
    /// Starts one caller's wait for a key held by another live call (see [`InProgressWait`]).
    fn in_progress_wait(&self) -> InProgressWait;

    /// One attempt of [`EffectBackend::begin`], which never sleeps (see
    /// [`EffectStore::begin_attempt`]).
    fn begin_attempt(
        &self,
        req: &EffectRequest,
        kind: EffectKind,
        wait: &mut InProgressWait,
    ) -> Result<Attempt, EffectError>;

    /// Stores the outcome of `ticket`'s execution (durable before this returns for an unsafe
    /// effect).
    fn complete(&self, ticket: Ticket, result: &Value) -> Result<(), EffectError>;

    /// Stores a definite failure; a `retryable` one lets the next call execute again.
    fn fail(&self, ticket: Ticket, error: &str, retryable: bool) -> Result<(), EffectError>;

    /// Gives `ticket` up without an outcome, for a caller that cannot tell whether the effect
    /// happened (the server it forwarded the call to died mid-call): the record stays
    /// `in_progress` with an owner that is dead for every process at once (pid 0, and for
    /// PostgreSQL owner key 0, which no replica holds), so an unsafe effect is `Indeterminate`
    /// everywhere until [`EffectBackend::resolve`], and an idempotent one is taken over. Dropping
    /// the ticket has that effect only inside this process (others see its live pid).
    fn abandon(&self, ticket: Ticket) -> Result<(), EffectError>;

    /// What the backend holds for `key` in `scope`.
    fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<EffectStatus>, EffectError>;

    /// Operator resolution of an indeterminate record (see [`Resolution`]).
    fn resolve(&self, scope: &Scope, key: &str, resolution: Resolution) -> Result<(), EffectError>;

    /// Removes finished records older than the retention window; returns how many.
    fn prune(&self, now: SystemTime) -> Result<u64, EffectError>;

    /// Drops superseded history, if the backend keeps any.
    fn compact(&self) -> Result<(), EffectError>;

    /// Makes everything stored so far durable (idempotent outcomes are stored without waiting).
    fn sync(&self) -> Result<(), EffectError>;

    /// Outcome counts per tool since the backend was opened (process-local).
    fn counters(&self) -> BTreeMap<String, Counters>;

    /// Decides what the caller must do for `req`, polling (this thread sleeps between attempts)
    /// while another live call holds the key and the configured wait has time left.
    fn begin(&self, req: &EffectRequest, kind: EffectKind) -> Result<Begin, EffectError> {
        let mut wait = self.in_progress_wait();
        loop {
            match self.begin_attempt(req, kind, &mut wait)? {
                Attempt::Ready(begin) => return Ok(begin),
                // Poll without holding anything: the owner needs the store to finish.
                Attempt::Pause(pause) => std::thread::sleep(pause),
            }
        }
    }
}

/// What a backend holds for one key ([`EffectBackend::lookup`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EffectStatus {
    /// A call holds the key (`live`) or held it and is gone (indeterminate for an unsafe effect).
    InProgress {
        /// The request's fingerprint.
        fingerprint: Sha256Digest,
        /// Whether the owner may still be running the effect.
        live: bool,
    },
    /// The effect completed with this result.
    Completed {
        /// The request's fingerprint.
        fingerprint: Sha256Digest,
        /// The stored result.
        result: Value,
    },
    /// The effect failed.
    Failed {
        /// The request's fingerprint.
        fingerprint: Sha256Digest,
        /// The stored error.
        error: String,
        /// Whether the next call may execute again.
        retryable: bool,
    },
}

impl EffectStatus {
    /// The status of `record`, whose owner (when in progress) is `live`.
    #[doc(hidden)]
    pub fn of(record: &Record, live: Liveness, path: &Path) -> Result<Self, EffectError> {
        let fingerprint = record.fingerprint;
        Ok(match &record.state {
            State::InProgress => EffectStatus::InProgress {
                fingerprint,
                live: live == Liveness::Live,
            },
            State::Completed(stored) => EffectStatus::Completed {
                fingerprint,
                result: stored.to_value().map_err(|e| EffectError::Corrupt {
                    path: path.to_path_buf(),
                    reason: format!("a stored result does not parse ({:?} error)", e.classify()),
                })?,
            },
            State::Failed { error, retryable } => EffectStatus::Failed {
                fingerprint,
                error: error.to_string(),
                retryable: *retryable,
            },
        })
    }
}

impl EffectBackend for EffectStore {
    fn in_progress_wait(&self) -> InProgressWait {
        EffectStore::in_progress_wait(self)
    }
    fn begin_attempt(
        &self,
        req: &EffectRequest,
        kind: EffectKind,
        wait: &mut InProgressWait,
    ) -> Result<Attempt, EffectError> {
        EffectStore::begin_attempt(self, req, kind, wait)
    }
    fn complete(&self, ticket: Ticket, result: &Value) -> Result<(), EffectError> {
        EffectStore::complete(self, ticket, result)
    }
    fn fail(&self, ticket: Ticket, error: &str, retryable: bool) -> Result<(), EffectError> {
        EffectStore::fail(self, ticket, error, retryable)
    }
    fn abandon(&self, ticket: Ticket) -> Result<(), EffectError> {
        EffectStore::abandon(self, ticket)
    }
    fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<EffectStatus>, EffectError> {
        EffectStore::lookup(self, scope, key)
    }
    fn resolve(&self, scope: &Scope, key: &str, resolution: Resolution) -> Result<(), EffectError> {
        EffectStore::resolve(self, scope, key, resolution)
    }
    fn prune(&self, now: SystemTime) -> Result<u64, EffectError> {
        EffectStore::prune(self, now)
    }
    fn compact(&self) -> Result<(), EffectError> {
        EffectStore::compact(self).map(drop)
    }
    fn sync(&self) -> Result<(), EffectError> {
        EffectStore::sync(self)
    }
    fn counters(&self) -> BTreeMap<String, Counters> {
        EffectStore::counters(self)
    }
}

/// How to open an [`EffectStore`].
#[derive(Clone)]
pub struct EffectConfig {
    dir: PathBuf,
    lease: Duration,
    completed_ttl: Duration,
    wait_in_progress: Option<Duration>,
    compact_min_bytes: u64,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<crate::FaultHook>,
}

impl EffectConfig {
    /// How long a begun effect's owner holds it before another may find it dead.
    pub fn lease_time(&self) -> Duration {
        self.lease
    }

    /// How long completed records answer retries.
    pub fn completed_retention(&self) -> Duration {
        self.completed_ttl
    }

    /// How long a `begin` waits for an effect in progress elsewhere (`None`: it answers at once).
    pub fn in_progress_wait(&self) -> Option<Duration> {
        self.wait_in_progress
    }
}

impl EffectConfig {
    /// A store in `dir` (created if absent), lease 30 s, completed records kept 24 h, and
    /// `InProgress` answered at once.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        EffectConfig {
            dir: dir.into(),
            lease: Duration::from_secs(30),
            completed_ttl: Duration::from_secs(24 * 60 * 60),
            wait_in_progress: None,
            compact_min_bytes: COMPACT_MIN_BYTES,
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        }
    }

    /// How long an owner is expected to hold a key; sets `retry_after`, and where `/proc` is
    /// unavailable, when an owner counts as dead.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long finished records are kept before [`EffectStore::prune`] may remove them.
    pub fn completed_ttl(mut self, ttl: Duration) -> Self {
        self.completed_ttl = ttl;
        self
    }

    /// Wait up to `wait` (polling without the lock) for a live owner to finish instead of
    /// answering `InProgress` at once. [`EffectStore::begin`] sleeps between its polls;
    /// [`EffectStore::begin_attempt`] leaves the pauses to its caller.
    pub fn wait_in_progress(mut self, wait: Duration) -> Self {
        self.wait_in_progress = Some(wait);
        self
    }

    /// The batch leader compacts the journal automatically once its used length exceeds
    /// `max(bytes, 4 x the size of the live records)` (default 4 MiB). `u64::MAX` turns the
    /// automatic trigger off; [`EffectStore::compact`] and the compaction after
    /// [`EffectStore::prune`] remain.
    pub fn compact_min_bytes(mut self, bytes: u64) -> Self {
        self.compact_min_bytes = bytes;
        self
    }

    /// Calls `hook` with `"effect.after_in_progress"` (the `in_progress` line is written, and
    /// durable unless the effect is idempotent; `Execute` not yet returned),
    /// `"effect.before_complete"` (before the completed or failed record is written),
    /// `"effect.after_complete"` (it is durable, not yet returned), and during a compaction
    /// `"effect.compact_before_rename"` (the new journal is complete and durable under its
    /// temporary name) and `"effect.compact_after_rename"` (it replaced the journal; the directory
    /// is not fsynced yet).
    #[cfg(feature = "fault-injection")]
    pub fn fault_hook(mut self, hook: crate::FaultHook) -> Self {
        self.fault_hook = Some(hook);
        self
    }
}

impl fmt::Debug for EffectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("EffectConfig");
        s.field("dir", &self.dir)
            .field("lease", &self.lease)
            .field("completed_ttl", &self.completed_ttl)
            .field("wait_in_progress", &self.wait_in_progress)
            .field("compact_min_bytes", &self.compact_min_bytes);
        #[cfg(feature = "fault-injection")]
        s.field("fault_hook", &self.fault_hook.as_ref().map(|_| "<hook>"));
        s.finish()
    }
}

/// What [`EffectStore::begin`] tells the caller to do.
#[derive(Debug)]
pub enum Begin {
    /// Run the effect, then call [`EffectStore::complete`] or [`EffectStore::fail`] with this ticket.
    Execute(Ticket),
    /// The same request completed earlier: its stored result, not executed again.
    Replay(Value),
    /// The same request failed definitively earlier (non-retryable): its stored error.
    ReplayFailure(String),
}

/// What one [`EffectStore::begin_attempt`] tells the caller.
#[derive(Debug)]
pub enum Attempt {
    /// The answer, exactly as [`EffectStore::begin`] would give it (and counted as it counts it).
    Ready(Begin),
    /// Another live call holds the key and the caller's [`InProgressWait`] has time left: pause
    /// this long, holding nothing the owner needs, then attempt again with the same wait. Nothing
    /// was counted.
    Pause(Duration),
}

/// One caller's wait for a key that another live call holds, across the attempts of
/// [`EffectStore::begin_attempt`]: when it started, how long it may last (the store's
/// [`EffectConfig::wait_in_progress`]; none: `InProgress` at once) and the next pause (1 ms,
/// doubling, at most 50 ms). Plain data, so an async caller can move it into each attempt it
/// runs on a blocking pool and keep the pauses on its own timer; start one per call with
/// [`EffectStore::in_progress_wait`].
#[derive(Debug, Clone, Copy)]
pub struct InProgressWait {
    started: Instant,
    limit: Option<Duration>,
    pause: Duration,
}

/// The first pause of an [`InProgressWait`]; each further one doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between two attempts: a waiting call notices the owner's outcome within this.
const MAX_PAUSE: Duration = Duration::from_millis(50);

impl InProgressWait {
    /// A wait starting now that lasts `limit` (none: `InProgress` at once).
    #[doc(hidden)]
    pub fn start(limit: Option<Duration>) -> Self {
        InProgressWait {
            started: Instant::now(),
            limit,
            pause: FIRST_PAUSE,
        }
    }

    /// The pause before the next attempt, or `None` when the wait is over; advances the backoff.
    fn next_pause(&mut self) -> Option<Duration> {
        let remaining = self.limit?.checked_sub(self.started.elapsed())?;
        if remaining.is_zero() {
            return None;
        }
        let pause = self.pause.min(remaining);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        Some(pause)
    }
}

/// The right (and duty) to store the outcome of one execution.
///
/// Dropping it without calling `complete` or `fail` leaves the `in_progress` record with a dead
/// owner: indeterminate for unsafe effects, taken over for idempotent ones.
#[must_use = "report the effect's outcome with EffectStore::complete or EffectStore::fail"]
pub struct Ticket {
    #[doc(hidden)]
    pub scope: Scope,
    #[doc(hidden)]
    pub key: String,
    #[doc(hidden)]
    pub fingerprint: Sha256Digest,
    #[doc(hidden)]
    pub owner: Owner,
    #[doc(hidden)]
    pub name: Sha256Digest,
    #[doc(hidden)]
    pub created_ns: u64,
    #[doc(hidden)]
    pub lease_until_ns: u64,
    /// The kind the effect was begun as: an `Unsafe` outcome is durable before `complete`/`fail`
    /// return, an `Idempotent` one is written (see "Idempotent effects" in the module docs).
    #[doc(hidden)]
    pub kind: EffectKind,
}

impl Ticket {
    /// The record that stores this execution's outcome (shared by every backend).
    fn finished(&self, state: State) -> Record {
        Record {
            state,
            fingerprint: self.fingerprint,
            owner: self.owner,
            lease_until_ns: self.lease_until_ns,
            created_ns: self.created_ns,
            finished_ns: Some(now_ns(SystemTime::now())),
            principal: self.scope.principal.as_str().into(),
            tool: self.scope.tool.as_str().into(),
        }
    }

    /// The record of this execution given up without an outcome: still `in_progress`, under an
    /// owner no process can be ([`Owner::abandoned`]).
    fn abandoned(&self) -> Record {
        Record {
            state: State::InProgress,
            fingerprint: self.fingerprint,
            owner: Owner::abandoned(self.owner.nonce),
            lease_until_ns: 0,
            created_ns: self.created_ns,
            finished_ns: None,
            principal: self.scope.principal.as_str().into(),
            tool: self.scope.tool.as_str().into(),
        }
    }

    /// The scope of the key this ticket holds.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The idempotency key this ticket holds.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The request fingerprint.
    pub fn fingerprint(&self) -> Sha256Digest {
        self.fingerprint
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key text is caller input; the digest identifies it without leaking it.
        f.debug_struct("Ticket")
            .field("scope", &self.scope)
            .field("key_digest", &self.name)
            .field("fingerprint", &self.fingerprint)
            .field("owner_pid", &self.owner.pid)
            .finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.owner.unregister_live();
    }
}

/// How an operator settles an indeterminate record after inspecting the effect's target.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// The effect happened: store this result, so later calls replay it.
    Completed(Value),
    /// The effect did not happen: delete the record, so the next call executes.
    Forget,
}

/// Outcome counts per tool since this store was opened (process-local, not persisted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Completed records written by [`EffectStore::complete`].
    pub committed: u64,
    /// `Replay` and `ReplayFailure` answers.
    pub replayed: u64,
    /// `Conflict` errors.
    pub conflict: u64,
    /// `InProgress` errors.
    pub in_progress: u64,
    /// `Indeterminate` errors.
    pub indeterminate: u64,
    /// Failed records written by [`EffectStore::fail`].
    pub failed: u64,
}

/// Why an effect store operation failed. Messages carry digests and paths, never key text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EffectError {
    /// The key was used before with a different request; nothing was executed.
    #[error(
        "idempotency key sha256:{key_digest} was already used for a different request; it was not \
         executed; retry with the original arguments or use a new key"
    )]
    Conflict {
        /// SHA-256 of the canonical `{"key","principal","tool"}` (the record's name in the journal).
        key_digest: Sha256Digest,
    },

    /// Another live call holds the key; nothing was executed.
    #[error(
        "idempotency key sha256:{key_digest} is being executed by another call; it was not \
         executed again; retry after {retry_after:?} to get its result"
    )]
    InProgress {
        /// SHA-256 of the canonical `{"key","principal","tool"}`.
        key_digest: Sha256Digest,
        /// When a retry is likely to find the outcome (the remaining lease, at least 1 s).
        retry_after: Duration,
    },

    /// The call that held the key died mid-effect and the effect is not idempotent: it may or
    /// may not have happened, so it is not re-run automatically.
    #[error(
        "idempotency key sha256:{key_digest} is indeterminate: the call executing it died and the \
         effect may or may not have happened; it will not be re-run automatically; inspect the \
         target, then resolve the record (EffectStore::resolve with Completed(result) if it \
         happened, Forget if it did not)"
    )]
    Indeterminate {
        /// SHA-256 of the canonical `{"key","principal","tool"}`.
        key_digest: Sha256Digest,
    },

    /// The ticket's `in_progress` record was resolved or taken over meanwhile, so this outcome
    /// was not stored.
    #[error(
        "idempotency key sha256:{key_digest} no longer belongs to this call (an operator resolved \
         it or its lease was taken over); the outcome was not stored; inspect the target and the \
         record before retrying"
    )]
    LostOwnership {
        /// SHA-256 of the canonical `{"key","principal","tool"}`.
        key_digest: Sha256Digest,
    },

    /// The batch that carried this call failed unexpectedly (a panic in the store: a bug); its
    /// outcome is unknown.
    #[error(
        "the effect store's batch carrying this call stopped unexpectedly (an internal error); \
         retry with the same key: the store then answers from what was recorded"
    )]
    BatchAbandoned,

    /// `resolve` was asked to settle a record that is not indeterminate.
    #[error(
        "idempotency key sha256:{key_digest} is {state}, not indeterminate; only an in_progress \
         record whose owner died can be resolved; nothing was changed"
    )]
    NotIndeterminate {
        /// SHA-256 of the canonical `{"key","principal","tool"}`.
        key_digest: Sha256Digest,
        /// What the record is: `absent`, `in_progress (owner alive)`, `completed` or `failed`.
        state: &'static str,
    },

    /// An operating system call failed.
    #[error(
        "effect store could not {op} {path}: {source}; check that the store directory is on a \
         local filesystem, writable and not full, then retry the same call (a retry never \
         executes an effect twice; it may report Indeterminate if the outcome is unknown)"
    )]
    Io {
        /// The operation that failed, e.g. `"fsync directory"`.
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },

    /// A record is unreadable: outside interference or media damage.
    #[error(
        "effect record {path} is corrupt: {reason}; inspect it and restore it from a backup or \
         remove it if the effect is known not to have happened (the store never repairs it)"
    )]
    Corrupt {
        /// Where the record lives.
        path: PathBuf,
        /// What is wrong with it, without its contents.
        reason: String,
    },

    /// A record's journal line would be longer than the journal allows ([`MAX_LINE_BYTES`]): the
    /// result is too large to store, and nothing was written.
    #[error(
        "the record of idempotency key sha256:{key_digest} would take {len} bytes in the journal, \
         over the limit of {max}; it was not stored; return a smaller result (keep large outputs \
         elsewhere and return a reference to them)"
    )]
    RecordTooLarge {
        /// SHA-256 of the canonical `{"key","principal","tool"}`.
        key_digest: Sha256Digest,
        /// The line's length in bytes.
        len: u64,
        /// The limit, [`MAX_LINE_BYTES`].
        max: u64,
    },

    /// The database behind the store failed (unreachable, a transaction failed, a schema it
    /// does not know): the call fails closed.
    #[error(
        "the effect store's database failed: {cause}; nothing was executed by this call; retry the same call once the database is reachable (a retry never executes an effect twice; it may report Indeterminate if an outcome is unknown)"
    )]
    Backend {
        /// What failed, naming the database without credentials.
        cause: String,
    },

    /// The key (or scope) is not acceptable.
    #[error(
        "invalid idempotency key: {reason}; use a non-empty key of at most 2048 bytes of UTF-8 \
         without control characters"
    )]
    InvalidKey {
        /// What is wrong, without quoting the key.
        reason: String,
    },
}

impl From<toolgate_storage::StorageError> for EffectError {
    fn from(e: toolgate_storage::StorageError) -> Self {
        EffectError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> EffectError + 'a {
    move |source| EffectError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// A failed step of the floor's journal in the store's words (the operations its errors always
/// named); `line_no` names the line a damaged or over-long one would be.
fn journal_err(e: JournalError, line_no: u64) -> EffectError {
    match e {
        JournalError::Io { step, path, source } => EffectError::Io {
            op: match step {
                JournalStep::Open | JournalStep::Create => "open journal",
                JournalStep::Stat => "stat journal",
                JournalStep::Read => "read journal",
                JournalStep::Write => "append to journal",
                JournalStep::Zero => "zero the torn last line of",
                JournalStep::Sync => "fdatasync journal",
                _ => "use journal",
            },
            path,
            source,
        },
        JournalError::Dir(e) => e.into(),
        JournalError::LineTooLong { path, limit, .. } => EffectError::Corrupt {
            path,
            reason: format!(
                "line {line_no}: no newline within {limit} bytes, longer than any line the store \
                 writes"
            ),
        },
        JournalError::DamagedLine { path, .. } => EffectError::Corrupt {
            path,
            reason: format!(
                "line {line_no}: a zero byte or the end of the file before its newline, yet more \
                 lines follow (not a torn last write)"
            ),
        },
        other => EffectError::Io {
            op: "use journal",
            path: other.path().to_path_buf(),
            source: io::Error::other(other.to_string()),
        },
    }
}

/// [`journal_err`] for the new file of a compaction, opened as `op` says.
fn replacement_err(e: JournalError, op: &'static str) -> EffectError {
    match e {
        JournalError::Io { path, source, .. } => EffectError::Io { op, path, source },
        other => journal_err(other, 0),
    }
}

/// Why [`EffectStore::refresh`] stopped at a line: the floor could not read it, or the store
/// could not parse it.
enum LineError {
    Journal(JournalError),
    Effect(EffectError),
}

impl From<JournalError> for LineError {
    fn from(e: JournalError) -> Self {
        LineError::Journal(e)
    }
}

impl From<EffectError> for LineError {
    fn from(e: EffectError) -> Self {
        LineError::Effect(e)
    }
}

impl LineError {
    fn into_effect(self, line_no: u64) -> EffectError {
        match self {
            LineError::Journal(e) => journal_err(e, line_no),
            LineError::Effect(e) => e,
        }
    }
}

/// The journal: one canonical JSON line per state change, appended under the lock.
const JOURNAL_FILE_NAME: &str = "effects.journal";
/// The journal grows in zero-filled chunks of this size, so that an append overwrites bytes the
/// file already has and its `fdatasync` need not commit a new file size (one metadata commit per
/// chunk instead of one per append). 64 KiB: a chunk is written together with the lines that need
/// it, from one buffer, and a buffer of that size comes from the allocator's heap; a 1 MiB one got
/// a mapping of its own, whose release makes glibc keep up to twice as much freed memory in every
/// thread's heap from then on (about 1 MiB more resident in toolgate-server).
const CHUNK: u64 = 64 << 10;

/// The largest record file of the previous layout that `open` migrates (a record holds one tool
/// result; 64 MiB is far beyond any the gate stores).
const MAX_RECORD_FILE_BYTES: u64 = 64 << 20;
/// The longest journal line read or written: a line holds one record, whose result the previous
/// layout's record files capped at 64 MiB, plus its name and fields. Reading a journal therefore
/// never holds more than this (and a read step) of a line in memory, whatever the file holds.
pub const MAX_LINE_BYTES: u64 = MAX_RECORD_FILE_BYTES + (1 << 20);

/// The temporary file a compaction writes before renaming it over the journal. Compactions run
/// only under the lock, so one fixed name suffices, and any such file found by a lock holder is
/// an orphan of a crashed compaction.
const COMPACT_TEMP_NAME: &str = ".effects.journal.compact.tmp";
/// Automatic compaction: the batch leader compacts once the journal's used length exceeds
/// `max(compact_min_bytes, COMPACT_FACTOR x live bytes)`. With the factor 4, rewriting the live
/// records costs at most a third of the bytes appended since the previous compaction.
const COMPACT_FACTOR: u64 = 4;
/// The default `compact_min_bytes` (4 MiB): small journals are never worth a rewrite.
const COMPACT_MIN_BYTES: u64 = 4 << 20;

/// The latest state of one record and the length of the journal line that set it (to know what
/// a compaction would write).
#[derive(Debug)]
struct Live {
    record: Record,
    line_len: u64,
    /// The offset just past that line in the current journal file: the line is durable once
    /// [`Durability::durable`] reaches it.
    line_end: u64,
}

/// What this store knows of the journal. Guarded by a mutex that only a batch leader, `open` and
/// `compact` take, always together with the `flock`.
#[derive(Debug)]
struct Journal {
    /// The journal file (the floor's padded journal), opened once; reopened when a compaction
    /// replaced it, which its identity, compared with the path's under the lock, tells. Its known
    /// end is the logical end: just past the last complete line this store read or wrote, and
    /// unknown after a failed write or a replacement, when the index is rebuilt from the start.
    file: JournalFile,
    /// Which journal file `file` is, counted from 0 at open; mirrors [`Durability::epoch`].
    epoch: u64,
    /// What the lines up to the logical end say.
    records: Records,
    /// How many complete lines precede the logical end (to name a corrupt line).
    lines: u64,
    /// An automatic compaction failed at this used length: the next automatic attempt waits until
    /// the journal grew past this (so a full disk is not rewritten on every batch).
    auto_compact_floor: u64,
}

/// The index built from the journal's lines.
#[derive(Debug, Default)]
struct Records {
    /// The latest state of every record (removed ones are absent). Boxed: the table then holds
    /// 40 bytes per slot instead of 190, and a hash table keeps up to half its slots empty.
    index: HashMap<Sha256Digest, Box<Live>>,
    /// The principal and tool names the records share (usually a handful for any number of
    /// records); names no record uses any more are dropped at compaction.
    names: HashSet<Arc<str>>,
    /// The sum of `line_len` over `index`: the used length a compaction would leave.
    live_bytes: u64,
    /// The offset just past the latest removal line (a removed record is absent from `index`, so
    /// its line's end is kept here): an answer that relies on a record being absent waits until
    /// this is durable.
    removed_end: u64,
}

impl Journal {
    fn new(file: JournalFile) -> Self {
        Journal {
            file,
            epoch: 0,
            records: Records::default(),
            lines: 0,
            auto_compact_floor: 0,
        }
    }

    /// The logical end (0 while unknown: nothing of the file is relied on then).
    fn end(&self) -> u64 {
        self.file.end().unwrap_or(0)
    }

    /// Forgets everything read from the file (which is kept), so the next refresh reads it whole.
    fn reset(&mut self) {
        self.records = Records::default();
        self.lines = 0;
        self.file.read_from_start();
    }
}

impl Records {
    fn record(&self, name: &Sha256Digest) -> Option<&Record> {
        self.index.get(name).map(|live| &live.record)
    }

    /// The shared copy of a principal or tool name.
    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(text) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = text.into();
        self.names.insert(Arc::clone(&shared));
        shared
    }

    /// Drops names that no record uses any more (only this set holds them).
    fn forget_unused_names(&mut self) {
        self.names.retain(|name| Arc::strong_count(name) > 1);
    }

    /// Whether the latest line about `name` (or, for an absent record, the latest removal line)
    /// may not be durable yet, given that everything before `durable` is.
    fn relies_on_undurable(&self, name: &Sha256Digest, durable: u64) -> bool {
        let end = self
            .index
            .get(name)
            .map_or(self.removed_end, |live| live.line_end);
        end > durable
    }

    /// Applies a line (of `line_len` bytes, ending at offset `line_end`) that sets `name` to
    /// `record` (`None`: removed).
    fn set(&mut self, name: Sha256Digest, record: Option<Record>, line_len: u64, line_end: u64) {
        let old_len = match record {
            Some(mut record) => {
                record.principal = self.intern(&record.principal);
                record.tool = self.intern(&record.tool);
                let live = Live {
                    record,
                    line_len,
                    line_end,
                };
                self.live_bytes = self.live_bytes.saturating_add(line_len);
                match self.index.entry(name) {
                    // The record's box is reused for its new state.
                    Entry::Occupied(mut slot) => {
                        Some(std::mem::replace(&mut **slot.get_mut(), live).line_len)
                    }
                    Entry::Vacant(slot) => {
                        slot.insert(Box::new(live));
                        None
                    }
                }
            }
            None => {
                self.removed_end = self.removed_end.max(line_end);
                self.index.remove(&name).map(|old| old.line_len)
            }
        };
        if let Some(old_len) = old_len {
            self.live_bytes = self.live_bytes.saturating_sub(old_len);
        }
    }
}

/// What [`EffectStore::compact`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactStats {
    /// The journal's used length (up to its logical end, padding excluded) before.
    pub bytes_before: u64,
    /// Its used length after: one line per live record.
    pub bytes_after: u64,
    /// How many lines it held before.
    pub lines_before: u64,
    /// How many lines (live records) it holds after.
    pub records: u64,
}

/// A request to the batch leader.
enum Job {
    Begin {
        req: EffectRequest,
        name: Sha256Digest,
        kind: EffectKind,
    },
    Finish {
        name: Sha256Digest,
        owner: Owner,
        record: Record,
        kind: EffectKind,
    },
    /// `result: None` is [`Resolution::Forget`].
    Resolve {
        name: Sha256Digest,
        result: Option<StoredResult>,
    },
    Prune {
        now: u64,
        ttl: u64,
    },
}

/// The leader's answer to one [`Job`].
enum Answer {
    Begin(Course),
    Execute {
        owner: Owner,
        created_ns: u64,
        lease_until_ns: u64,
    },
    Done,
    Pruned(u64),
}

/// What this store knows to be durable in its current journal file. It has its own mutex, so a
/// leader can fdatasync its batch (or wait for another leader's fdatasync) after releasing the
/// journal lock and the `flock`, while the next leader decides and writes the next batch.
///
/// Invariant: `durable <= written`, and every byte before `written` was in the file (written by
/// this store, or read from it under the lock) before any fdatasync that counts it started.
#[derive(Debug, Default)]
struct Durability {
    /// Which journal file: bumped, under the journal lock, when a compaction replaced the file.
    /// Everything in the old file was made durable before that (by this store's compaction, or by
    /// the other process's, which read this store's lines under the lock before its fdatasync),
    /// so a wait for an older epoch is over.
    epoch: u64,
    /// The end of what this store wrote to the current file or read from it.
    written: u64,
    /// Everything before this offset of the current file is durable (fdatasynced by this store
    /// after it was written or read).
    durable: u64,
    /// An fdatasync is running; a leader that needs one waits for it first, since it may cover
    /// its lines.
    syncing: bool,
}

/// A batch's pending durability: everything before `target` in journal file `epoch` must be
/// durable before its answers are given.
struct SyncTarget {
    file: SyncHandle,
    epoch: u64,
    target: u64,
}

/// One job's answer, decided and written, not yet given.
struct Pending {
    caller: Caller<Result<Answer, EffectError>>,
    answer: Result<Answer, EffectError>,
    /// The answer rests on lines that must be durable before it is given.
    needs_sync: bool,
}

/// A batch decided and written, not yet answered.
struct Decided {
    answers: Vec<Pending>,
    /// `Ok(None)`: nothing to wait for; `Err`: the write (or a sync under the lock) failed, and
    /// every answer of the batch becomes that error.
    sync: Result<Option<SyncTarget>, EffectError>,
}

/// A store of effect outcomes in one directory. `Send + Sync`; share it in an `Arc`.
pub struct EffectStore {
    dir: PathBuf,
    journal_path: PathBuf,
    config: EffectConfig,
    storage: Arc<dyn Storage>,
    /// The lock file, opened once. Only used with `journal` locked (which serializes this store's
    /// threads; a `flock` is per open file description); the `flock` serializes processes and
    /// other store instances.
    lock_file: LockFile,
    journal: Mutex<Journal>,
    /// The group commit: the first caller leads a batch of every queued job (one write, at most
    /// one `fdatasync`), and hands the lead on once the batch is written.
    group: GroupCommit<Job, Result<Answer, EffectError>>,
    durability: Mutex<Durability>,
    /// Signalled when an fdatasync of the journal ends.
    durability_cond: Condvar,
    counters: CounterTable,
}

impl Drop for EffectStore {
    fn drop(&mut self) {
        // Best effort, like the audit log's checkpoint on drop: a clean shutdown makes the
        // idempotent outcomes durable (they are written, not synced, when stored). Errors cannot
        // be reported from Drop; `sync()` is the way to see them.
        let _ = self.sync();
    }
}

impl fmt::Debug for EffectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EffectStore")
            .field("config", &self.config)
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

/// What a record means for a `begin`.
#[doc(hidden)]
#[derive(Debug)]
pub enum Course {
    Replay(StoredResult),
    ReplayFailure(String),
    Conflict,
    Indeterminate,
    Busy(Duration),
    /// Write a new `in_progress` record.
    Take,
}

/// What the jobs of one batch produced, besides their answers.
#[derive(Default)]
struct Batch {
    /// Everything before this offset of the journal was durable when the batch started.
    durable: u64,
    /// The new journal lines, in order.
    lines: Vec<u8>,
    /// The job being decided needs the batch's lines (or lines it read) durable before its answer
    /// is given (reset for every job).
    needs_sync: bool,
    /// A `prune` ran: compact afterwards.
    pruned: bool,
}

/// Turns every successful answer into a copy of `e` (the batch's write or `fdatasync` failed). An
/// `Execute` owner is marked aborted: its record may be visible, but the effect never started.
fn fail_all(mut answers: Vec<Pending>, e: &EffectError) -> Vec<Pending> {
    for pending in &mut answers {
        if let Ok(Answer::Execute { owner, .. }) = &pending.answer {
            owner.mark_aborted();
        }
        if pending.answer.is_ok() {
            pending.answer = Err(dup(e));
        }
    }
    answers
}

/// A copy of `e` for every job of a batch that failed as a whole (`io::Error` is not `Clone`).
fn dup(e: &EffectError) -> EffectError {
    match e {
        EffectError::BatchAbandoned => EffectError::BatchAbandoned,
        EffectError::Conflict { key_digest } => EffectError::Conflict {
            key_digest: *key_digest,
        },
        EffectError::InProgress {
            key_digest,
            retry_after,
        } => EffectError::InProgress {
            key_digest: *key_digest,
            retry_after: *retry_after,
        },
        EffectError::Indeterminate { key_digest } => EffectError::Indeterminate {
            key_digest: *key_digest,
        },
        EffectError::LostOwnership { key_digest } => EffectError::LostOwnership {
            key_digest: *key_digest,
        },
        EffectError::NotIndeterminate { key_digest, state } => EffectError::NotIndeterminate {
            key_digest: *key_digest,
            state,
        },
        EffectError::Io { op, path, source } => EffectError::Io {
            op,
            path: path.clone(),
            source: io::Error::new(source.kind(), source.to_string()),
        },
        EffectError::Corrupt { path, reason } => EffectError::Corrupt {
            path: path.clone(),
            reason: reason.clone(),
        },
        EffectError::RecordTooLarge {
            key_digest,
            len,
            max,
        } => EffectError::RecordTooLarge {
            key_digest: *key_digest,
            len: *len,
            max: *max,
        },
        EffectError::InvalidKey { reason } => EffectError::InvalidKey {
            reason: reason.clone(),
        },
        EffectError::Backend { cause } => EffectError::Backend {
            cause: cause.clone(),
        },
    }
}

impl EffectStore {
    /// Opens (creating if needed) the store described by `config` on the real filesystem.
    pub fn open(config: EffectConfig) -> Result<Self, EffectError> {
        Self::open_with_storage(config, Arc::new(FsStorage))
    }

    /// Opens the store with another [`Storage`] (for fault injection).
    ///
    /// Creates the directory and the journal, then under the lock removes orphaned temporary
    /// files (those whose writer process is gone), reads the journal into memory (a torn last line
    /// is zeroed out; a corrupt complete line is a `Corrupt` error naming it), moves records of the
    /// previous one-file-per-record layout into the journal, and makes everything it read durable,
    /// so that every record visible at open is durable. `in_progress` records of dead owners stay:
    /// they are evidence, and `begin` reports them as described in the module documentation.
    pub fn open_with_storage(
        config: EffectConfig,
        storage: Arc<dyn Storage>,
    ) -> Result<Self, EffectError> {
        let dir = config.dir.clone();
        std::fs::create_dir_all(&dir).map_err(io_err("create store directory", &dir))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            storage
                .fsync_dir(parent)
                .map_err(io_err("fsync parent of store directory", parent))?;
        }
        let lock_file = LockFile::open(dir.join(LOCK_FILE_NAME))?;
        let journal_path = dir.join(JOURNAL_FILE_NAME);
        // Created without a directory fsync of its own: `open` fsyncs the directory below.
        let journal_config = JournalConfig::new(Layout::Padded { chunk: CHUNK }, MAX_LINE_BYTES)
            .missing(Missing::Create);
        let journal_file = JournalFile::open(Arc::clone(&storage), &journal_path, journal_config)
            .map_err(|e| journal_err(e, 0))?;
        let store = EffectStore {
            dir,
            journal_path,
            config,
            storage,
            lock_file,
            journal: Mutex::new(Journal::new(journal_file)),
            group: GroupCommit::new(|| Err(EffectError::BatchAbandoned)),
            durability: Mutex::default(),
            durability_cond: Condvar::new(),
            counters: CounterTable::default(),
        };
        {
            let mut journal = store.journal();
            let _lock = store.lock()?;
            store.remove_orphaned_temps()?;
            store.refresh(&mut journal)?;
            // Bytes after the logical end: only the zero padding, unless a power loss left parts
            // of writes that were never fdatasynced (e.g. a later page of a lost write). They are
            // zeroed now, before an append could land next to them (or Corrupt if whole lines
            // follow, which the operator must judge).
            store.zero_torn_tail(&mut journal)?;
            let legacy = store.migrate(&mut journal)?;
            store.sync_locked(&journal)?;
            for path in &legacy {
                store
                    .storage
                    .remove(path)
                    .map_err(io_err("remove migrated record file", path))?;
            }
            // Makes the journal's directory entry (and the removals) durable.
            store
                .storage
                .fsync_dir(&store.dir)
                .map_err(io_err("fsync directory", &store.dir))?;
        }
        Ok(store)
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Decides what the caller must do for `req`; see the module documentation for the table.
    ///
    /// On `Execute` the `in_progress` record is in the journal: visible to every store and process
    /// sharing the directory, and kept if this process dies. For [`EffectKind::Unsafe`] it is also
    /// durable (fdatasynced); for [`EffectKind::Idempotent`] it becomes durable with the next
    /// fdatasync of the journal (see "Idempotent effects" in the module documentation), so only a
    /// power loss or kernel crash before that can lose it, and then a retry re-runs the
    /// idempotent effect, as a takeover would. Errors other than `Io` and `Corrupt` are answers (nothing was
    /// executed); they are counted per tool.
    ///
    /// With [`EffectConfig::wait_in_progress`], a key held by another live call is polled (this
    /// thread sleeps between attempts) until that call finished or the wait ran out. An async
    /// caller should not block a thread that long: it runs [`EffectStore::begin_attempt`] and
    /// pauses on its own timer instead.
    pub fn begin(&self, req: &EffectRequest, kind: EffectKind) -> Result<Begin, EffectError> {
        EffectBackend::begin(self, req, kind)
    }

    /// What the store holds for `key` in `scope` (after reading what other processes appended).
    pub fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<EffectStatus>, EffectError> {
        let name = record_name(scope, key)?;
        let mut journal = self.journal();
        let _lock = self.lock()?;
        self.refresh(&mut journal)?;
        let now = now_ns(SystemTime::now());
        journal
            .records
            .record(&name)
            .map(|record| {
                let live = liveness(&record.owner, record.lease_until_ns, now);
                EffectStatus::of(record, live, &self.journal_path)
            })
            .transpose()
    }

    /// Starts one caller's wait for a key held by another live call, for
    /// [`EffectStore::begin_attempt`]: it lasts the configured
    /// [`EffectConfig::wait_in_progress`] from now (no wait when none is configured).
    pub fn in_progress_wait(&self) -> InProgressWait {
        InProgressWait::start(self.config.wait_in_progress)
    }

    /// One attempt of [`EffectStore::begin`], which never sleeps: the same decision (one job of a
    /// group commit, so it may wait for the batch's `fdatasync`), except that a key held by
    /// another live call answers [`Attempt::Pause`] while `wait` has time left, so the caller
    /// decides how to pause. The counters see a call, not its attempts: a call that waited and
    /// then replays counts one replay, one that runs out of time counts one `in_progress` (its
    /// last attempt answers [`EffectError::InProgress`]), and a `Pause` counts nothing.
    ///
    /// ```no_run
    /// # use toolgate_commit::*;
    /// # fn run(store: &EffectStore, req: &EffectRequest) -> Result<Begin, EffectError> {
    /// let mut wait = store.in_progress_wait();
    /// loop {
    ///     match store.begin_attempt(req, EffectKind::Idempotent, &mut wait)? {
    ///         Attempt::Ready(begin) => return Ok(begin),
    ///         Attempt::Pause(pause) => std::thread::sleep(pause), // or an async timer
    ///     }
    /// }
    /// # }
    /// ```
    pub fn begin_attempt(
        &self,
        req: &EffectRequest,
        kind: EffectKind,
        wait: &mut InProgressWait,
    ) -> Result<Attempt, EffectError> {
        let name = record_name(&req.scope, &req.key)?;
        // A settled record this store has read is answered without the lock or a batch. An
        // unsafe effect's answer must still rest on a durable line, as under the lock.
        let quick = {
            let journal = self.journal();
            match journal.records.record(&name) {
                Some(record)
                    if kind == EffectKind::Idempotent
                        || !journal
                            .records
                            .relies_on_undurable(&name, self.durable_offset(journal.epoch)) =>
                {
                    settled(
                        record,
                        &self.journal_path,
                        req,
                        kind,
                        now_ns(SystemTime::now()),
                        self.config.completed_ttl,
                    )?
                }
                _ => None,
            }
        };
        let job = Job::Begin {
            req: req.clone(),
            name,
            kind,
        };
        let decision = match quick.map_or_else(|| self.submit(job), |d| Ok(Answer::Begin(d)))? {
            Answer::Begin(decision) => decision,
            Answer::Execute {
                owner,
                created_ns,
                lease_until_ns,
            } => {
                let ticket = Ticket {
                    scope: req.scope.clone(),
                    key: req.key.clone(),
                    fingerprint: req.fingerprint,
                    owner,
                    name,
                    created_ns,
                    lease_until_ns,
                    kind,
                };
                #[cfg(feature = "fault-injection")]
                self.fault("effect.after_in_progress");
                return Ok(Attempt::Ready(Begin::Execute(ticket)));
            }
            Answer::Done | Answer::Pruned(_) => unreachable!("begin answers a decision"),
        };
        answer(
            decision,
            name,
            req,
            wait,
            &self.counters,
            &self.journal_path,
        )
    }

    /// Stores `result` as the outcome of `ticket`'s execution: durable when this returns `Ok` for an
    /// unsafe effect, written (durable with the next fdatasync of the journal) for an idempotent one.
    pub fn complete(&self, ticket: Ticket, result: &Value) -> Result<(), EffectError> {
        // Canonicalized once, here, before the batch: the journal line and the index both use
        // this text.
        let stored = StoredResult::from_value(result)?;
        self.finish(ticket, State::Completed(stored))?;
        Ok(())
    }

    /// Stores a definite failure. A `retryable` one lets the next call with the same request
    /// execute again; a non-retryable one is replayed as [`Begin::ReplayFailure`].
    pub fn fail(&self, ticket: Ticket, error: &str, retryable: bool) -> Result<(), EffectError> {
        self.finish(
            ticket,
            State::Failed {
                error: error.into(),
                retryable,
            },
        )
    }

    /// Gives `ticket` up without an outcome (see [`EffectBackend::abandon`]): its record is
    /// rewritten `in_progress` under the abandoned owner (pid 0, lease 0); durable when this
    /// returns for an unsafe effect.
    pub fn abandon(&self, ticket: Ticket) -> Result<(), EffectError> {
        let record = ticket.abandoned();
        self.replace_held(&ticket, record)
    }

    /// Removes finished records (completed and failed, retryable or not) whose `finished_ns` is
    /// more than `completed_ttl` before `now` (by appending a removal line for each); never
    /// `in_progress` (or indeterminate) ones. Returns how many were removed, for the caller's audit.
    ///
    /// Afterwards, in the same batch, the journal is compacted if it holds superseded or removed
    /// lines. That compaction is best-effort: if it fails, the removal (already durable) still
    /// counts, the old journal stays in use and the next trigger retries; call
    /// [`EffectStore::compact`] to compact with its error reported.
    pub fn prune(&self, now: SystemTime) -> Result<u64, EffectError> {
        let now = now_ns(now);
        let ttl = u64::try_from(self.config.completed_ttl.as_nanos()).unwrap_or(u64::MAX);
        match self.submit(Job::Prune { now, ttl })? {
            Answer::Pruned(n) => Ok(n),
            _ => unreachable!("prune answers a count"),
        }
    }

    /// Rewrites the journal as one line per live record (the same line format; superseded and
    /// removed lines are dropped), under the exclusive lock: a temporary file in the store
    /// directory is written and fdatasynced, renamed over `effects.journal`, and the directory is
    /// fsynced. A crash at any point leaves either the old journal or the complete new one (an
    /// orphaned temporary file is removed at the next open). Other processes and store instances
    /// notice the replacement under the lock before their next batch and reload from the new file.
    ///
    /// On an error the old journal stays in use and nothing is lost; if it came after the rename
    /// (the directory fsync failed), the next batch adopts the new journal and fsyncs the
    /// directory again.
    pub fn compact(&self) -> Result<CompactStats, EffectError> {
        let mut journal = self.journal();
        let _lock = self.lock()?;
        self.refresh(&mut journal)?;
        self.compact_locked(&mut journal)
    }

    /// Makes every line this store has written durable (one `fdatasync` when any is not yet):
    /// the outcomes of idempotent effects are only written when they are stored, so a server
    /// calls this when it shuts down cleanly.
    pub fn sync(&self) -> Result<(), EffectError> {
        let journal = self.journal();
        let (file, epoch, end) = (journal.file.sync_handle(), journal.epoch, journal.end());
        drop(journal);
        self.wait_durable(&file, epoch, end)
    }

    /// Outcome counts per tool since this store was opened.
    pub fn counters(&self) -> BTreeMap<String, Counters> {
        self.counters.snapshot()
    }

    /// Operator resolution of an indeterminate record (an `in_progress` record whose owner died)
    /// after inspecting the effect's target: mark it completed with a result, or forget it so
    /// the next call executes. Durable when this returns `Ok`.
    pub fn resolve(
        &self,
        scope: &Scope,
        key: &str,
        resolution: Resolution,
    ) -> Result<(), EffectError> {
        let name = record_name(scope, key)?;
        let result = match &resolution {
            Resolution::Completed(result) => Some(StoredResult::from_value(result)?),
            Resolution::Forget => None,
        };
        self.submit(Job::Resolve { name, result })?;
        Ok(())
    }

    // ---- internals ------------------------------------------------------------------------------

    /// Replaces the ticket's `in_progress` record with its outcome.
    fn finish(&self, ticket: Ticket, state: State) -> Result<(), EffectError> {
        #[cfg(feature = "fault-injection")]
        self.fault("effect.before_complete");
        let is_failure = matches!(state, State::Failed { .. });
        // Its names are replaced by the interned ones when the record enters the index.
        let record = ticket.finished(state);
        // On an error the ticket is dropped: its record then has a dead owner, unless the outcome
        // line reached the journal (a failed fdatasync), in which case a retry replays it after
        // the next successful fdatasync.
        self.replace_held(&ticket, record)?;
        if is_failure {
            self.count(&ticket.scope.tool, |c| c.failed += 1);
        } else {
            self.count(&ticket.scope.tool, |c| c.committed += 1);
        }
        drop(ticket);
        #[cfg(feature = "fault-injection")]
        self.fault("effect.after_complete");
        Ok(())
    }

    /// Writes `record` over the one `ticket` holds (durable first for an unsafe effect), unless
    /// another owner took the key over meanwhile (`LostOwnership`).
    fn replace_held(&self, ticket: &Ticket, record: Record) -> Result<(), EffectError> {
        self.submit(Job::Finish {
            name: ticket.name,
            owner: ticket.owner,
            record,
            kind: ticket.kind,
        })?;
        Ok(())
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn durability(&self) -> MutexGuard<'_, Durability> {
        self.durability
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job` and returns its answer: either another caller's batch carries it, or this
    /// caller leads a batch of every queued job. A leader decides and writes its batch under the
    /// journal lock and the `flock`, hands the lead on, gives the answers that need no
    /// `fdatasync`, and only then waits for the one the others need, so the next batch is decided
    /// and written during it (one `fdatasync` can then cover several batches).
    fn submit(&self, job: Job) -> Result<Answer, EffectError> {
        self.group.submit(job, |jobs, handoff| {
            let Decided { answers, sync } = self.decide_batch(jobs);
            handoff.hand_off();
            let give = |answers: Vec<Pending>| {
                for pending in answers {
                    pending.caller.answer(pending.answer);
                }
            };
            match sync {
                Err(e) => give(fail_all(answers, &e)),
                Ok(target) => {
                    let (rest, now): (Vec<Pending>, Vec<Pending>) =
                        answers.into_iter().partition(|p| p.needs_sync);
                    give(now);
                    let durable =
                        target.map_or(Ok(()), |t| self.wait_durable(&t.file, t.epoch, t.target));
                    match durable {
                        Ok(()) => give(rest),
                        Err(e) => give(fail_all(rest, &e)),
                    }
                }
            }
        })
    }

    /// Under the journal lock and the `flock`: reads what other processes appended, decides every
    /// job in order against the index (each seeing the ones before it) and appends all new lines
    /// with one write. Returns the answers, each noting whether it waits for the batch's lines
    /// to be durable: not an idempotent `begin` that wrote its `in_progress` line and relied on no
    /// line that is not yet durable, nor an answer that relied on durable lines only; every other
    /// does. After a `prune`, or when the journal grew past the threshold, the batch is made
    /// durable and the journal compacted here, still under the lock (the compaction is
    /// best-effort: see [`EffectStore::prune`]).
    fn decide_batch(&self, jobs: Vec<(Job, Caller<Result<Answer, EffectError>>)>) -> Decided {
        let failed =
            |jobs: Vec<(Job, Caller<Result<Answer, EffectError>>)>, e: &EffectError| Decided {
                answers: jobs
                    .into_iter()
                    .map(|(_, caller)| Pending {
                        caller,
                        answer: Err(dup(e)),
                        needs_sync: false,
                    })
                    .collect(),
                sync: Ok(None),
            };
        let mut journal = self.journal();
        let lock = match self.lock() {
            Ok(lock) => lock,
            Err(e) => return failed(jobs, &e),
        };
        if let Err(e) = self.refresh(&mut journal) {
            return failed(jobs, &e);
        }
        self.note_written(&journal);
        let now = now_ns(SystemTime::now());
        let mut batch = Batch {
            durable: self.durable_offset(journal.epoch),
            ..Batch::default()
        };
        let mut any_sync = false;
        let answers: Vec<Pending> = jobs
            .into_iter()
            .map(|(job, caller)| {
                batch.needs_sync = false;
                let answer = self.apply(&mut journal, job, now, &mut batch);
                any_sync |= batch.needs_sync;
                Pending {
                    caller,
                    answer,
                    needs_sync: batch.needs_sync,
                }
            })
            .collect();
        let mut sync = self
            .append(&mut journal, &batch.lines)
            .map(|()| any_sync.then_some(journal.end()));
        if sync.is_ok() {
            self.note_written(&journal);
            let after_prune = batch.pruned && journal.lines > journal.records.index.len() as u64;
            if after_prune || self.compaction_due(&journal) {
                if let Ok(Some(_)) = sync {
                    sync = self.sync_locked(&journal).map(|()| None);
                }
                // Every answer is settled by now; a failed compaction leaves the old journal in
                // use (see `compact`) and only postpones the next automatic attempt.
                if sync.is_ok() && self.compact_locked(&mut journal).is_err() {
                    journal.auto_compact_floor = journal
                        .end()
                        .saturating_add(self.config.compact_min_bytes.max(CHUNK));
                }
            }
        }
        let sync = sync.map(|target| {
            target.map(|target| SyncTarget {
                file: journal.file.sync_handle(),
                epoch: journal.epoch,
                target,
            })
        });
        drop(lock);
        drop(journal);
        Decided { answers, sync }
    }

    /// Decides one job against the index, appending its line (if any) to `batch.lines` and
    /// noting whether its answer needs the batch's `fdatasync`.
    fn apply(
        &self,
        journal: &mut Journal,
        job: Job,
        now: u64,
        batch: &mut Batch,
    ) -> Result<Answer, EffectError> {
        match job {
            Job::Begin { req, name, kind } => {
                // The answer depends on the latest line of `name` (or its absence): if that line
                // is not durable yet (written lazily, or by a process that may have died before
                // its fdatasync), the answer waits for the batch's fdatasync.
                let relies_on_undurable = journal.records.relies_on_undurable(&name, batch.durable);
                let decision = match journal.records.record(&name) {
                    None => Course::Take,
                    Some(record) => {
                        let live = liveness(&record.owner, record.lease_until_ns, now);
                        decide(record, &self.journal_path, &req, kind, now, live)?
                    }
                };
                if !matches!(decision, Course::Take) {
                    // An idempotent call may be answered from a written line: should a power loss
                    // take the line, a retry runs the effect again, which its declaration allows.
                    batch.needs_sync |= relies_on_undurable && kind == EffectKind::Unsafe;
                    return Ok(Answer::Begin(decision));
                }
                // An unsafe effect's `in_progress` must be durable before it runs (indeterminate
                // detection after a power loss depends on it). An idempotent one only needs to be
                // written: other processes read it through the page cache, it survives a crash
                // of this process, and after a power loss a retry re-runs the effect, which is
                // harmless by declaration.
                batch.needs_sync |= kind == EffectKind::Unsafe;
                let record = in_progress(
                    &req,
                    now,
                    self.config.lease,
                    journal.records.intern(&req.scope.principal),
                    journal.records.intern(&req.scope.tool),
                );
                let owner = record.owner;
                let line = encode_line(&name, Some(&record))?;
                batch.lines.extend(&line);
                let line_end = journal.end() + batch.lines.len() as u64;
                // Live before the lock is released: no one may see the record with an
                // unregistered nonce and take it for a dead owner's.
                owner.register_live();
                let answer = Answer::Execute {
                    owner,
                    created_ns: record.created_ns,
                    lease_until_ns: record.lease_until_ns,
                };
                journal
                    .records
                    .set(name, Some(record), line.len() as u64, line_end);
                Ok(answer)
            }
            Job::Finish {
                name,
                owner,
                record,
                kind,
            } => {
                // An unsafe outcome must be durable before the caller is told it is stored; an
                // idempotent one only written (a power loss can only make a retry run it again).
                batch.needs_sync = kind == EffectKind::Unsafe;
                if !held_by(journal.records.record(&name), &owner) {
                    return Err(EffectError::LostOwnership { key_digest: name });
                }
                let line = encode_line(&name, Some(&record))?;
                batch.lines.extend(&line);
                let line_end = journal.end() + batch.lines.len() as u64;
                journal
                    .records
                    .set(name, Some(record), line.len() as u64, line_end);
                Ok(Answer::Done)
            }
            Job::Resolve { name, result } => {
                batch.needs_sync = true;
                let record = journal.records.record(&name);
                let live = record.map(|r| liveness(&r.owner, r.lease_until_ns, now));
                let record = resolvable(record, name, live)?;
                let (line, record) = match result {
                    None => (encode_line(&name, None)?, None),
                    Some(result) => {
                        let completed = Record {
                            state: State::Completed(result),
                            finished_ns: Some(now),
                            ..record.clone()
                        };
                        (encode_line(&name, Some(&completed))?, Some(completed))
                    }
                };
                batch.lines.extend(&line);
                let line_end = journal.end() + batch.lines.len() as u64;
                journal
                    .records
                    .set(name, record, line.len() as u64, line_end);
                Ok(Answer::Done)
            }
            Job::Prune { now, ttl } => {
                batch.needs_sync = true;
                batch.pruned = true;
                let expired: Vec<Sha256Digest> = journal
                    .records
                    .index
                    .iter()
                    .filter(|(_, live)| {
                        live.record
                            .finished_ns
                            .is_some_and(|f| now.saturating_sub(f) > ttl)
                    })
                    .map(|(name, _)| *name)
                    .collect();
                for name in &expired {
                    let line = encode_line(name, None)?;
                    batch.lines.extend(&line);
                    let line_end = journal.end() + batch.lines.len() as u64;
                    journal
                        .records
                        .set(*name, None, line.len() as u64, line_end);
                }
                Ok(Answer::Pruned(expired.len() as u64))
            }
        }
    }

    /// Writes `lines` at the logical end with one write (the floor adds a zero-filled chunk when
    /// the file is too short). A failed write leaves unknown bytes and an unknown end, so the
    /// index is rebuilt next time.
    fn append(&self, journal: &mut Journal, lines: &[u8]) -> Result<(), EffectError> {
        journal
            .file
            .append(lines)
            .map_err(|e| journal_err(e, journal.lines + 1))?;
        journal.lines += lines.iter().filter(|&&b| b == b'\n').count() as u64;
        Ok(())
    }

    /// Everything before `durable` in journal file `epoch` is durable (0 if the file was
    /// replaced since: its lines are not durable by this store's account yet).
    fn durable_offset(&self, epoch: u64) -> u64 {
        let state = self.durability();
        if state.epoch == epoch {
            state.durable
        } else {
            0
        }
    }

    /// Under the journal lock: records that everything before the logical end is in the file (so
    /// an fdatasync starting from now on covers it).
    fn note_written(&self, journal: &Journal) {
        let mut state = self.durability();
        if state.epoch == journal.epoch {
            state.written = state.written.max(journal.end());
        }
    }

    /// Under the journal lock: the journal file was replaced (by this store's compaction, or
    /// another's noticed at refresh), after everything in the old one was made durable. Starts
    /// the new file's account: its first `durable_end` bytes are durable.
    fn adopt(&self, journal: &mut Journal, durable_end: u64) {
        journal.epoch += 1;
        let mut state = self.durability();
        state.epoch = journal.epoch;
        state.written = durable_end;
        state.durable = durable_end;
    }

    /// Under the journal lock: makes everything this store knows of the journal durable.
    fn sync_locked(&self, journal: &Journal) -> Result<(), EffectError> {
        self.wait_durable(&journal.file.sync_handle(), journal.epoch, journal.end())
    }

    /// Returns once everything before `target` in journal file `epoch` is durable: at once if it
    /// is already, after the running `fdatasync` if that covers it, else after an `fdatasync` of
    /// its own, which covers everything written so far (other leaders' batches included). Takes
    /// only the durability mutex, so it may be called with or without the journal lock.
    fn wait_durable(&self, file: &SyncHandle, epoch: u64, target: u64) -> Result<(), EffectError> {
        let mut state = self.durability();
        loop {
            if state.epoch != epoch || state.durable >= target {
                return Ok(());
            }
            if state.syncing {
                state = self
                    .durability_cond
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            state.syncing = true;
            let covering = state.written.max(target);
            drop(state);
            let synced = file.sync_data();
            state = self.durability();
            state.syncing = false;
            self.durability_cond.notify_all();
            synced.map_err(|e| journal_err(e, 0))?;
            if state.epoch == epoch {
                state.durable = state.durable.max(covering);
            }
        }
    }

    /// Under the lock: if `effects.journal` is no longer the file this store has open (a compaction
    /// by another process or store instance renamed a new one over it), opens the new file and
    /// marks the index for a rebuild from it. The directory is fsynced first: the compaction may
    /// have died between its rename and its own directory fsync, and nothing may rely on the new
    /// file before its name is durable.
    fn follow_replacement(&self, journal: &mut Journal) -> Result<(), EffectError> {
        let path = &self.journal_path;
        match journal.file.at_path().map_err(|e| journal_err(e, 0))? {
            AtPath::Same => return Ok(()),
            // Compactions rename over the journal and never remove it.
            AtPath::Absent => {
                return Err(io_err("stat journal", path)(io::Error::from(
                    io::ErrorKind::NotFound,
                )));
            }
            AtPath::Other => {}
        }
        journal
            .file
            .reopen(Missing::Fail)
            .map_err(|e| replacement_err(e, "open the compacted journal"))?;
        self.storage.fsync_dir(&self.dir).map_err(io_err(
            "fsync directory (journal replaced by a compaction)",
            &self.dir,
        ))?;
        // The other store fdatasynced the old file (our lines included: it read them under the
        // lock) before compacting; the new file's lines are not durable by our account yet. Its
        // end is unknown now, so the next refresh rebuilds the index from it.
        self.adopt(journal, 0);
        Ok(())
    }

    /// Whether the journal grew enough to compact it automatically: its used length exceeds
    /// `max(compact_min_bytes, COMPACT_FACTOR x live bytes)` (and the last failed automatic attempt
    /// is far enough behind).
    fn compaction_due(&self, journal: &Journal) -> bool {
        let threshold = self
            .config
            .compact_min_bytes
            .max(journal.records.live_bytes.saturating_mul(COMPACT_FACTOR));
        journal.end() > threshold && journal.end() >= journal.auto_compact_floor
    }

    /// Under the lock, after a refresh: rewrites the index as a new journal (see
    /// [`EffectStore::compact`]). Steps: fdatasync the old journal (so that, should the rename be
    /// lost to a power loss, the old file says the same as the new one), remove a leftover
    /// temporary file, write the new file (lines sorted by name, then zero padding to the next
    /// chunk), fdatasync it, rename it over the journal, fsync the directory.
    fn compact_locked(&self, journal: &mut Journal) -> Result<CompactStats, EffectError> {
        self.sync_locked(journal)?;
        let temp = self.dir.join(COMPACT_TEMP_NAME);
        match self.storage.remove(&temp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove the leftover compaction file", &temp)(e)),
        }
        let mut names: Vec<Sha256Digest> = journal.records.index.keys().copied().collect();
        names.sort_unstable();
        let mut bytes =
            Vec::with_capacity(usize::try_from(journal.records.live_bytes).unwrap_or(0));
        let mut line_lens = Vec::with_capacity(names.len());
        for name in &names {
            let line = encode_line(name, journal.records.record(name))?;
            line_lens.push(line.len() as u64);
            bytes.extend(line);
        }
        let end = bytes.len() as u64;
        let size = (end / CHUNK + 1) * CHUNK;
        bytes.resize(usize::try_from(size).unwrap_or(bytes.len()), 0);
        let replacement = match self.write_compacted(journal, &temp, &bytes) {
            Ok(new) => new,
            Err(e) => {
                // Best-effort: a leftover is removed by the next compaction or open.
                let _ = self.storage.remove(&temp);
                return Err(e);
            }
        };
        #[cfg(feature = "fault-injection")]
        self.fault("effect.compact_after_rename");
        // On failure the old file stays open here; the next refresh sees that the path names
        // another file, adopts it and fsyncs the directory again.
        self.storage
            .fsync_dir(&self.dir)
            .map_err(io_err("fsync directory after compacting", &self.dir))?;
        let stats = CompactStats {
            bytes_before: journal.end(),
            bytes_after: end,
            lines_before: journal.lines,
            records: names.len() as u64,
        };
        let mut line_end = 0;
        for (name, line_len) in names.iter().zip(line_lens) {
            line_end += line_len;
            if let Some(live) = journal.records.index.get_mut(name) {
                live.line_len = line_len;
                live.line_end = line_end;
            }
        }
        // The new file is durable whole (written, fdatasynced, renamed, directory fsynced).
        journal.file.adopt(replacement, end);
        self.adopt(journal, end);
        journal.records.live_bytes = end;
        journal.lines = stats.records;
        journal.records.removed_end = 0;
        journal.auto_compact_floor = 0;
        journal.records.forget_unused_names();
        Ok(stats)
    }

    /// Writes and fdatasyncs the compacted journal under its temporary name, opens it through the
    /// floor, and renames it over the journal. Returns the new file, opened before the rename
    /// (which does not change it).
    fn write_compacted(
        &self,
        journal: &Journal,
        temp: &Path,
        bytes: &[u8],
    ) -> Result<toolgate_storage::Replacement, EffectError> {
        self.storage
            .write_new(temp, bytes)
            .map_err(io_err("write the compacted journal", temp))?;
        self.storage
            .fsync_file(temp)
            .map_err(io_err("fdatasync the compacted journal", temp))?;
        let replacement = journal
            .file
            .open_replacement(temp)
            .map_err(|e| replacement_err(e, "open the compacted journal"))?;
        #[cfg(feature = "fault-injection")]
        self.fault("effect.compact_before_rename");
        self.storage
            .rename(temp, &self.journal_path)
            .map_err(io_err(
                "rename the compacted journal over",
                &self.journal_path,
            ))?;
        Ok(replacement)
    }

    /// Under the lock: applies the complete lines after the logical end (appended by other
    /// processes or store instances) to the index. A torn last line (no newline before the zero
    /// padding or the end of the file) is a write that never finished: it is zeroed out. A
    /// complete line that does not parse is `Corrupt`, naming its line number. If a compaction
    /// replaced the journal since this store last looked, or a write failed, the index is first
    /// rebuilt from the file's start.
    fn refresh(&self, journal: &mut Journal) -> Result<(), EffectError> {
        self.follow_replacement(journal)?;
        if journal.file.end().is_none() {
            journal.reset();
        }
        let path = &self.journal_path;
        let Journal {
            file,
            records,
            lines,
            ..
        } = &mut *journal;
        let scan = file.read_lines(|line, line_end| {
            let line_no = *lines + 1;
            let (name, record) = parse_line(path, line_no, line)?;
            // Bytes appended by someone else: their writer may have died before its fdatasync,
            // so they count as not durable (their end is past what this store fdatasynced) until
            // this store makes them so.
            records.set(name, record, line.len() as u64 + 1, line_end);
            *lines = line_no;
            Ok::<_, LineError>(())
        });
        match scan.map_err(|e| e.into_effect(journal.lines + 1))? {
            toolgate_storage::Scan::Clean => Ok(()),
            toolgate_storage::Scan::Torn { .. } => self.zero_torn_tail(journal),
        }
    }

    /// Zeroes every non-zero byte from the logical end to the end of the file (a torn last line,
    /// and whatever a power loss left after it), so the next append starts on clean ground.
    fn zero_torn_tail(&self, journal: &mut Journal) -> Result<(), EffectError> {
        let zeroed = journal
            .file
            .zero_tail()
            .map_err(|e| journal_err(e, journal.lines + 1))?;
        if zeroed == 0 {
            return Ok(());
        }
        // The zeroes lie past the logical end, which `wait_durable` does not count, so the
        // floor's fdatasync was unconditional; it covers every line before the end too.
        let end = journal.end();
        let mut state = self.durability();
        if state.epoch == journal.epoch {
            state.written = state.written.max(end);
            state.durable = state.durable.max(end);
        }
        Ok(())
    }

    /// Moves `<hex>.json` record files of the previous layout into the journal (for names the
    /// journal does not know yet). Returns the files to remove once the journal is durable.
    fn migrate(&self, journal: &mut Journal) -> Result<Vec<PathBuf>, EffectError> {
        let mut lines = Vec::new();
        let mut migrated = Vec::new();
        for path in self.list()? {
            let Some(name) = record_file_name(&path) else {
                continue;
            };
            let Some(bytes) = self
                .storage
                .read(&path, MAX_RECORD_FILE_BYTES)
                .map_err(io_err("read effect record", &path))?
            else {
                continue;
            };
            let record = Record::parse(&path, &bytes)?;
            if !journal.records.index.contains_key(&name) {
                let line = encode_line(&name, Some(&record))?;
                lines.extend(&line);
                let line_end = journal.end() + lines.len() as u64;
                journal
                    .records
                    .set(name, Some(record), line.len() as u64, line_end);
            }
            migrated.push(path);
        }
        self.append(journal, &lines)?;
        Ok(migrated)
    }

    fn list(&self) -> Result<Vec<PathBuf>, EffectError> {
        self.storage
            .list(&self.dir)
            .map_err(io_err("list directory", &self.dir))
    }

    /// The `flock` of `dir/.lock`; callers hold the `journal` mutex.
    fn lock(&self) -> Result<LockGuard<'_>, EffectError> {
        Ok(self.lock_file.lock()?)
    }

    /// Deletes the temporary file of a crashed compaction (compactions run under the lock, so
    /// any such file is an orphan), and `.<64 hex>.<pid>.<n>.tmp` files whose writer is gone (left
    /// by the previous one-file-per-record layout). Callers hold the lock.
    fn remove_orphaned_temps(&self) -> Result<(), EffectError> {
        for path in self.list()? {
            if path.file_name().is_some_and(|n| n == COMPACT_TEMP_NAME) {
                match self.storage.remove(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("remove orphaned compaction file", &path)(e)),
                }
            }
        }
        // This process writes no temporary files of its own here, so its pid's are orphans too.
        toolgate_storage::remove_orphaned_temps(self.storage.as_ref(), &self.dir, true)?;
        Ok(())
    }

    fn count(&self, tool: &str, bump: impl FnOnce(&mut Counters)) {
        self.counters.count(tool, bump);
    }

    #[cfg(feature = "fault-injection")]
    fn fault(&self, point: &'static str) {
        if let Some(hook) = &self.config.fault_hook {
            hook(point);
        }
    }
}

/// What a stored record means for `req`.
/// What `begin` does with the latest record of the key (shared by every backend); `live` is what
/// the backend knows of the record's owner (only read for an `in_progress` record).
/// How long before the end of its retention window a finished record stops being answered
/// without the store's lock (a margin for the clocks of the processes or replicas that prune).
const SETTLED_MARGIN: Duration = Duration::from_secs(60);

/// The answer for a finished record that is still well inside its retention window: a replay, a
/// conflict or a failure not to retry. Such a record changes only by a prune, which cannot touch
/// it yet, so every backend may answer it from what it read without the lock that `begin` takes.
/// `None` (decide under the lock) for a record in progress, near or past the end of its window,
/// or to be retried.
#[doc(hidden)]
pub fn settled(
    record: &Record,
    path: &Path,
    req: &EffectRequest,
    kind: EffectKind,
    now: u64,
    retention: Duration,
) -> Result<Option<Course>, EffectError> {
    let Some(finished) = record.finished_ns else {
        return Ok(None);
    };
    let window = retention.saturating_sub(SETTLED_MARGIN).as_nanos();
    if record.state.is_in_progress() || u128::from(now.saturating_sub(finished)) >= window {
        return Ok(None);
    }
    match decide(record, path, req, kind, now, Liveness::Live)? {
        Course::Take => Ok(None),
        decision => Ok(Some(decision)),
    }
}

#[doc(hidden)]
pub fn decide(
    record: &Record,
    path: &Path,
    req: &EffectRequest,
    kind: EffectKind,
    now: u64,
    live: Liveness,
) -> Result<Course, EffectError> {
    if *record.principal != *req.scope.principal || *record.tool != *req.scope.tool {
        return Err(EffectError::Corrupt {
            path: path.to_path_buf(),
            reason: "a record's principal or tool does not match its name".to_owned(),
        });
    }
    if record.fingerprint != req.fingerprint {
        return Ok(Course::Conflict);
    }
    Ok(match &record.state {
        State::Completed(result) => Course::Replay(result.clone()),
        State::Failed {
            error,
            retryable: false,
        } => Course::ReplayFailure(error.to_string()),
        State::Failed {
            retryable: true, ..
        } => Course::Take,
        State::InProgress => match live {
            Liveness::Live => {
                let remaining = Duration::from_nanos(record.lease_until_ns.saturating_sub(now));
                Course::Busy(remaining.max(MIN_RETRY_AFTER))
            }
            Liveness::NeverStarted => Course::Take,
            Liveness::Dead => match kind {
                EffectKind::Idempotent => Course::Take,
                EffectKind::Unsafe => Course::Indeterminate,
            },
        },
    })
}

/// A fresh `in_progress` record of `req` for a new owner of this process (shared by every
/// backend), with the scope's names as the backend keeps them.
#[doc(hidden)]
pub fn in_progress(
    req: &EffectRequest,
    now: u64,
    lease: Duration,
    principal: Arc<str>,
    tool: Arc<str>,
) -> Record {
    let lease = u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX);
    Record {
        state: State::InProgress,
        fingerprint: req.fingerprint,
        owner: Owner::fresh(),
        lease_until_ns: now.saturating_add(lease),
        created_ns: now,
        finished_ns: None,
        principal,
        tool,
    }
}

/// The record `resolve` may settle (shared by every backend): one `in_progress` whose owner is
/// gone; anything else is `NotIndeterminate`, naming what it is.
#[doc(hidden)]
pub fn resolvable(
    record: Option<&Record>,
    name: Sha256Digest,
    live: Option<Liveness>,
) -> Result<&Record, EffectError> {
    let not = |state| EffectError::NotIndeterminate {
        key_digest: name,
        state,
    };
    let record = record.ok_or_else(|| not("absent"))?;
    match record.state {
        State::Completed(_) => return Err(not("completed")),
        State::Failed { .. } => return Err(not("failed")),
        State::InProgress => {}
    }
    if live != Some(Liveness::Dead) && live != Some(Liveness::NeverStarted) {
        return Err(not("in_progress (owner alive)"));
    }
    Ok(record)
}

/// Whether `owner` still holds the record, so that its outcome may be stored (shared by every
/// backend).
fn held_by(record: Option<&Record>, owner: &Owner) -> bool {
    record.is_some_and(|r| r.state.is_in_progress() && r.owner == *owner)
}

/// Turns a decision that is not `Take` into the caller's answer, counting it (shared by every
/// backend, so they answer alike). `corrupt_path` names the store in a `Corrupt` error.
#[doc(hidden)]
pub fn answer(
    decision: Course,
    name: Sha256Digest,
    req: &EffectRequest,
    wait: &mut InProgressWait,
    counters: &CounterTable,
    corrupt_path: &Path,
) -> Result<Attempt, EffectError> {
    let tool = &req.scope.tool;
    match decision {
        Course::Replay(stored) => {
            // Parsed here, outside the batch: the index keeps only the text.
            let value = stored.to_value().map_err(|e| EffectError::Corrupt {
                path: corrupt_path.to_path_buf(),
                reason: format!(
                    "the stored result of sha256:{name} does not parse ({:?} error)",
                    e.classify()
                ),
            })?;
            counters.count(tool, |c| c.replayed += 1);
            Ok(Attempt::Ready(Begin::Replay(value)))
        }
        Course::ReplayFailure(error) => {
            counters.count(tool, |c| c.replayed += 1);
            Ok(Attempt::Ready(Begin::ReplayFailure(error)))
        }
        Course::Conflict => {
            counters.count(tool, |c| c.conflict += 1);
            Err(EffectError::Conflict { key_digest: name })
        }
        Course::Indeterminate => {
            counters.count(tool, |c| c.indeterminate += 1);
            Err(EffectError::Indeterminate { key_digest: name })
        }
        Course::Busy(retry_after) => {
            if let Some(pause) = wait.next_pause() {
                return Ok(Attempt::Pause(pause));
            }
            counters.count(tool, |c| c.in_progress += 1);
            Err(EffectError::InProgress {
                key_digest: name,
                retry_after,
            })
        }
        // The backend turns `Take` into `Execute`.
        Course::Take => unreachable!("a backend answers Execute for Take"),
    }
}

/// Outcome counts per tool, shared by the backends.
#[derive(Debug, Default)]
#[doc(hidden)]
pub struct CounterTable(pub Mutex<BTreeMap<String, Counters>>);

impl CounterTable {
    /// Adds to the counts of `tool`.
    pub fn count(&self, tool: &str, bump: impl FnOnce(&mut Counters)) {
        // Plain counters stay consistent even if a holder panicked.
        let mut counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match counters.get_mut(tool) {
            Some(counts) => bump(counts),
            None => bump(counters.entry(tool.to_owned()).or_default()),
        }
    }

    /// The counts of every tool.
    pub fn snapshot(&self) -> BTreeMap<String, Counters> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The longest key accepted, in bytes of UTF-8: keys come from tool arguments (an untrusted
/// caller), so a bound keeps one request from making the store hash and log arbitrarily large
/// strings. The gate refuses caller keys over 1024 bytes before dispatch and adds a short
/// namespace prefix (`key:`), so every key it derives fits well within this.
pub const MAX_KEY_BYTES: usize = 2048;

/// Refuses empty keys, keys over [`MAX_KEY_BYTES`] and keys with control characters. The reason never
/// quotes the key, because keys are caller input and errors reach logs.
fn check_key(key: &str) -> Result<(), EffectError> {
    let reason = if key.is_empty() {
        "the key is empty".to_owned()
    } else if key.len() > MAX_KEY_BYTES {
        format!(
            "the key is {} bytes long, the limit is {MAX_KEY_BYTES}",
            key.len()
        )
    } else if let Some((offset, c)) = key.char_indices().find(|(_, c)| c.is_control()) {
        format!(
            "the key contains control character U+{:04X} at byte offset {offset}",
            u32::from(c)
        )
    } else {
        return Ok(());
    };
    Err(EffectError::InvalidKey { reason })
}

/// The record name: SHA-256 of the canonical `{"key","principal","tool"}`, after checking the key.
#[doc(hidden)]
pub fn record_name(scope: &Scope, key: &str) -> Result<Sha256Digest, EffectError> {
    check_key(key)?;
    let value = serde_json::json!({
        "key": key,
        "principal": scope.principal,
        "tool": scope.tool,
    });
    Ok(Sha256Digest::of_json(&value))
}

fn is_lower_hex(s: &str) -> bool {
    s.len() == HEX_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The digest of a `<64 lowercase hex>.json` path; `None` for every other name.
fn record_file_name(path: &Path) -> Option<Sha256Digest> {
    let name = path.file_name()?.to_str()?;
    let hex = name.strip_suffix(".json")?;
    if !is_lower_hex(hex) {
        return None;
    }
    hex.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let hex = "a".repeat(64);
        assert!(record_file_name(Path::new(&format!("/d/{hex}.json"))).is_some());
        assert!(record_file_name(Path::new(&format!("/d/{}.json", "A".repeat(64)))).is_none());
        assert!(record_file_name(Path::new("/d/.lock")).is_none());
    }

    #[test]
    fn record_name_is_scoped() {
        let a = Scope {
            principal: "alice".into(),
            tool: "write_note".into(),
        };
        let b = Scope {
            principal: "bob".into(),
            tool: "write_note".into(),
        };
        assert_ne!(record_name(&a, "k").unwrap(), record_name(&b, "k").unwrap());
        assert!(matches!(
            record_name(&a, ""),
            Err(EffectError::InvalidKey { .. })
        ));
    }
}
