//! Exactly-once effects for any tool: a durable state machine per (principal, tool, key).
//!
//! A caller asks [`EffectStore::begin`] before performing a side effect. The store answers
//! [`Begin::Execute`] exactly once per key (with a [`Ticket`] to report the outcome through
//! [`EffectStore::complete`] or [`EffectStore::fail`]), and afterwards replays the stored outcome
//! instead of executing again. `docs/commit-store.md` ("Effect store") documents the layout and
//! the durability assumptions; this comment is the state machine.
//!
//! # Records
//!
//! One file per (scope, key): `dir/<hex SHA-256 of canonical {"key","principal","tool"}>.json`
//! holding the canonical JSON of `{"state": "in_progress" | "completed" | "failed", "fingerprint",
//! "owner": {"pid", "start_ticks", "nonce"}, "lease_until_ns", "created_ns", "finished_ns"
//! (finished records), "result" (completed), "error" and "retryable" (failed), "principal",
//! "tool"}`. The key text itself is not stored: the file name already identifies it, and keys
//! may be derived from arguments. Times are decimal strings of nanoseconds since the epoch and the
//! nonce is hex, because RFC 8785 numbers are doubles.
//!
//! # State machine of `begin`
//!
//! | record                                     | same fingerprint                        | other fingerprint |
//! |--------------------------------------------|-----------------------------------------|-------------------|
//! | absent                                     | write `in_progress` durably, `Execute`  | (n/a)             |
//! | `completed`                                | `Replay(result)`, not executed          | `Conflict`        |
//! | `failed`, not retryable                    | `ReplayFailure(error)`                  | `Conflict`        |
//! | `failed`, retryable                        | new `in_progress`, `Execute`            | `Conflict`        |
//! | `in_progress`, owner alive                 | `InProgress { retry_after }` (or wait)  | `Conflict`        |
//! | `in_progress`, owner dead, `Idempotent`    | take over: new owner, `Execute`         | `Conflict`        |
//! | `in_progress`, owner dead, `Unsafe`        | `Indeterminate` until [`EffectStore::resolve`] | `Conflict` |
//!
//! The `in_progress` record is durable before `Execute` is returned, so a crash after the effect
//! always leaves evidence. An owner is `(pid, start ticks, nonce)`: it is dead when no process with
//! that pid exists, when the process with that pid started at another time (field 22 of
//! `/proc/<pid>/stat`, so pid reuse is detected), or, inside this process, when its ticket was
//! consumed or dropped without storing an outcome. Only where `/proc` is unavailable does an
//! expired lease count as death. **A live owner whose lease has expired is still live**: a slow
//! effect is not a dead one, and declaring it dead could run an unsafe effect twice; the lease
//! then only sets `retry_after` (at least one second).
//!
//! # Concurrency and durability
//!
//! Every transition is a compare-and-swap under an exclusive `flock` of `dir/.lock`: the new
//! record is prepared in a temporary file (`.<hex>.<pid>.<counter>.tmp`, written and fsynced
//! *before* the lock is taken, so concurrent callers' fsyncs overlap), then under the lock the
//! record is re-read and the temporary file is renamed over it only if it still holds the bytes
//! the decision was based on. The directory fsync that makes the rename durable happens after the
//! lock is released and is shared: one fsync covers every rename this store made before it
//! started (group commit). A call returns only after its own rename is covered.

mod record;
mod storage;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use toolgate_canon::Sha256Digest;

use record::{Liveness, Owner, Record, State, liveness, now_ns, pid_alive};
pub use storage::{FaultyStorage, FsStorage, Op, Storage};

/// The lock file every transition locks exclusively; its contents are irrelevant.
const LOCK_FILE_NAME: &str = ".lock";
const HEX_LEN: usize = 64;
/// More known-durable record names than this and the set is cleared (costing one extra directory
/// fsync per later replay of a forgotten name) so that memory stays bounded.
const MAX_KNOWN_DURABLE: usize = 100_000;
/// The shortest retry-after a caller is told.
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
const TEMP_NAME_ATTEMPTS: u32 = 16;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

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
    /// The idempotency key: non-empty, at most 1024 bytes of UTF-8, no control characters.
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

/// How to open an [`EffectStore`].
#[derive(Clone)]
pub struct EffectConfig {
    dir: PathBuf,
    lease: Duration,
    completed_ttl: Duration,
    wait_in_progress: Option<Duration>,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<crate::FaultHook>,
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
    /// answering `InProgress` at once.
    pub fn wait_in_progress(mut self, wait: Duration) -> Self {
        self.wait_in_progress = Some(wait);
        self
    }

    /// Calls `hook` with `"effect.after_in_progress"` (the `in_progress` record is durable,
    /// `Execute` not yet returned), `"effect.before_complete"` (before the completed or failed
    /// record is written) and `"effect.after_complete"` (it is durable, not yet returned).
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
            .field("wait_in_progress", &self.wait_in_progress);
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

/// The right (and duty) to store the outcome of one execution.
///
/// Dropping it without calling `complete` or `fail` leaves the `in_progress` record with a dead
/// owner: indeterminate for unsafe effects, taken over for idempotent ones.
#[must_use = "report the effect's outcome with EffectStore::complete or EffectStore::fail"]
pub struct Ticket {
    scope: Scope,
    key: String,
    fingerprint: Sha256Digest,
    owner: Owner,
    name: Sha256Digest,
    created_ns: u64,
    lease_until_ns: u64,
}

impl Ticket {
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
        /// SHA-256 of the canonical `{"key","principal","tool"}` (the record's file name).
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

    /// The key (or scope) is not acceptable.
    #[error(
        "invalid idempotency key: {reason}; use a non-empty key of at most 1024 bytes of UTF-8 \
         without control characters"
    )]
    InvalidKey {
        /// What is wrong, without quoting the key.
        reason: String,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> EffectError + 'a {
    move |source| EffectError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Group commit of directory fsyncs: one fsync covers every rename sequenced before it started.
#[derive(Debug, Default)]
struct SyncState {
    /// Sequence number of the last rename (or explicit durability request).
    renamed: u64,
    /// Every sequence number up to this one is durable.
    synced: u64,
    /// A leader is fsyncing now.
    syncing: bool,
    /// Every sequence number up to this one was covered by a failed fsync.
    failed_through: u64,
    failure: Option<(io::ErrorKind, String)>,
}

#[derive(Debug, Default)]
struct DirSyncer {
    state: Mutex<SyncState>,
    cond: Condvar,
}

/// A store of effect outcomes in one directory. `Send + Sync`; share it in an `Arc`.
pub struct EffectStore {
    dir: PathBuf,
    config: EffectConfig,
    storage: Arc<dyn Storage>,
    /// The lock file, opened once; the mutex serializes this store's threads (a `flock` is per
    /// open file description), the `flock` serializes processes and other store instances.
    lock_file: Mutex<File>,
    syncer: DirSyncer,
    /// Record names known to be durable in this process (written by it, or fsynced once).
    known_durable: Mutex<HashSet<Sha256Digest>>,
    counters: Mutex<BTreeMap<String, Counters>>,
}

impl fmt::Debug for EffectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EffectStore")
            .field("config", &self.config)
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

struct DirLock<'a> {
    guard: MutexGuard<'a, File>,
}

impl Drop for DirLock<'_> {
    fn drop(&mut self) {
        // Closing would release it too; unlocking here makes the release point explicit. An error
        // cannot leave the lock held past the file's close, so it is safe to ignore.
        let _ = self.guard.unlock();
    }
}

/// Temporary names of this process's in-flight writes, so that `open` never removes a temporary
/// file another store instance of this process is about to rename.
static ACTIVE_TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn active_temps() -> MutexGuard<'static, Vec<PathBuf>> {
    ACTIVE_TEMPS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A prepared (written and fsynced) temporary file, removed on drop unless renamed.
struct Temp<'a> {
    storage: &'a dyn Storage,
    path: PathBuf,
    armed: bool,
}

impl Temp<'_> {
    fn disarm(&mut self) {
        self.armed = false;
        active_temps().retain(|p| p != &self.path);
    }
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: a leftover is ignored by readers and removed by the next open().
            let _ = self.storage.remove(&self.path);
            active_temps().retain(|p| p != &self.path);
        }
    }
}

/// What a snapshot of the record means for a `begin`.
enum Decision {
    Replay(Value),
    ReplayFailure(String),
    Conflict,
    Indeterminate,
    Busy(Duration),
    /// Write a new `in_progress` record over the snapshot.
    Take,
}

impl EffectStore {
    /// Opens (creating if needed) the store described by `config` on the real filesystem.
    pub fn open(config: EffectConfig) -> Result<Self, EffectError> {
        Self::open_with_storage(config, Arc::new(FsStorage))
    }

    /// Opens the store with another [`Storage`] (for fault injection).
    ///
    /// Creates the directory, then under the lock removes orphaned temporary files (those whose
    /// writer process is gone) and fsyncs the directory once, so that every record visible at
    /// open is durable. `in_progress` records of dead owners stay: they are evidence, and `begin`
    /// reports them as described in the module documentation.
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
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err("open lock file", &lock_path))?;
        let store = EffectStore {
            dir,
            config,
            storage,
            lock_file: Mutex::new(lock_file),
            syncer: DirSyncer::default(),
            known_durable: Mutex::default(),
            counters: Mutex::default(),
        };
        {
            let _lock = store.lock()?;
            store.remove_orphaned_temps()?;
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
    /// On `Execute` the `in_progress` record is durable. Errors other than `Io` and `Corrupt` are
    /// answers (nothing was executed); they are counted per tool.
    pub fn begin(&self, req: &EffectRequest, kind: EffectKind) -> Result<Begin, EffectError> {
        let name = record_name(&req.scope, &req.key)?;
        let path = self.record_path(&name);
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let snapshot = self.read(&path)?;
            let now = now_ns(SystemTime::now());
            let decision = match &snapshot {
                None => Decision::Take,
                Some(bytes) => decide(&Record::parse(&path, bytes)?, &path, req, kind, now)?,
            };
            match decision {
                Decision::Replay(value) => {
                    self.ensure_durable(name)?;
                    self.count(&req.scope.tool, |c| c.replayed += 1);
                    return Ok(Begin::Replay(value));
                }
                Decision::ReplayFailure(error) => {
                    self.ensure_durable(name)?;
                    self.count(&req.scope.tool, |c| c.replayed += 1);
                    return Ok(Begin::ReplayFailure(error));
                }
                Decision::Conflict => {
                    self.count(&req.scope.tool, |c| c.conflict += 1);
                    return Err(EffectError::Conflict { key_digest: name });
                }
                Decision::Indeterminate => {
                    // The owner was seen dead after the snapshot was read; it stores its outcome
                    // before it stops counting as live, so if the record is unchanged now, the
                    // owner died without storing one. If it changed, decide again.
                    if self.read(&path)? != snapshot {
                        continue;
                    }
                    self.count(&req.scope.tool, |c| c.indeterminate += 1);
                    return Err(EffectError::Indeterminate { key_digest: name });
                }
                Decision::Busy(retry_after) => {
                    if let Some(wait) = self.config.wait_in_progress
                        && started.elapsed() < wait
                    {
                        // Poll without the lock: the owner needs it to finish.
                        std::thread::sleep(pause.min(wait.saturating_sub(started.elapsed())));
                        pause = (pause * 2).min(Duration::from_millis(50));
                        continue;
                    }
                    self.count(&req.scope.tool, |c| c.in_progress += 1);
                    return Err(EffectError::InProgress {
                        key_digest: name,
                        retry_after,
                    });
                }
                Decision::Take => {
                    if let Some(ticket) = self.take(req, name, &path, snapshot.as_deref())? {
                        return Ok(Begin::Execute(ticket));
                    }
                    // The record changed between our read and the lock: decide again.
                }
            }
        }
    }

    /// Stores `result` as the outcome of `ticket`'s execution; durable when this returns `Ok`.
    pub fn complete(&self, ticket: Ticket, result: &Value) -> Result<(), EffectError> {
        self.finish(ticket, State::Completed(result.clone()))?;
        Ok(())
    }

    /// Stores a definite failure. A `retryable` one lets the next call with the same request
    /// execute again; a non-retryable one is replayed as [`Begin::ReplayFailure`].
    pub fn fail(&self, ticket: Ticket, error: &str, retryable: bool) -> Result<(), EffectError> {
        self.finish(
            ticket,
            State::Failed {
                error: error.to_owned(),
                retryable,
            },
        )
    }

    /// Removes finished records (completed and failed, retryable or not) whose `finished_ns` is
    /// more than `completed_ttl` before `now`; never `in_progress` (or indeterminate) ones, and
    /// never unreadable files. Returns how many were removed, for the caller's audit.
    pub fn prune(&self, now: SystemTime) -> Result<u64, EffectError> {
        let now = now_ns(now);
        let ttl = u64::try_from(self.config.completed_ttl.as_nanos()).unwrap_or(u64::MAX);
        let _lock = self.lock()?;
        let mut removed = 0;
        for path in self.list()? {
            let Some(name) = record_file_name(&path) else {
                continue;
            };
            let Some(bytes) = self.read(&path)? else {
                continue;
            };
            // An unreadable record is the operator's to inspect, not ours to delete.
            let Ok(record) = Record::parse(&path, &bytes) else {
                continue;
            };
            let Some(finished) = record.finished_ns else {
                continue;
            };
            if now.saturating_sub(finished) > ttl {
                self.storage
                    .remove(&path)
                    .map_err(io_err("remove expired record", &path))?;
                self.forget_durable(name);
                removed += 1;
            }
        }
        if removed > 0 {
            self.storage
                .fsync_dir(&self.dir)
                .map_err(io_err("fsync directory", &self.dir))?;
        }
        Ok(removed)
    }

    /// Outcome counts per tool since this store was opened.
    pub fn counters(&self) -> BTreeMap<String, Counters> {
        self.counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
        let path = self.record_path(&name);
        let _lock = self.lock()?;
        let not = |state| EffectError::NotIndeterminate {
            key_digest: name,
            state,
        };
        let bytes = self.read(&path)?.ok_or_else(|| not("absent"))?;
        let record = Record::parse(&path, &bytes)?;
        match record.state {
            State::Completed(_) => return Err(not("completed")),
            State::Failed { .. } => return Err(not("failed")),
            State::InProgress => {}
        }
        let now = now_ns(SystemTime::now());
        if liveness(&record.owner, record.lease_until_ns, now) == Liveness::Live {
            return Err(not("in_progress (owner alive)"));
        }
        match resolution {
            Resolution::Forget => {
                self.storage
                    .remove(&path)
                    .map_err(io_err("remove resolved record", &path))?;
                self.forget_durable(name);
            }
            Resolution::Completed(result) => {
                let completed = Record {
                    state: State::Completed(result),
                    finished_ns: Some(now),
                    ..record
                };
                let mut temp = self.prepare(&name, &completed.to_bytes()?)?;
                self.storage
                    .rename(&temp.path, &path)
                    .map_err(io_err("rename temporary file into place at", &path))?;
                temp.disarm();
            }
        }
        self.storage
            .fsync_dir(&self.dir)
            .map_err(io_err("fsync directory", &self.dir))?;
        Ok(())
    }

    // ---- internals ------------------------------------------------------------------------------

    /// Writes a new `in_progress` record over `expected` (the snapshot the decision was based on).
    /// `Ok(None)` if the record changed meanwhile.
    fn take(
        &self,
        req: &EffectRequest,
        name: Sha256Digest,
        path: &Path,
        expected: Option<&[u8]>,
    ) -> Result<Option<Ticket>, EffectError> {
        let owner = Owner::fresh();
        let now = now_ns(SystemTime::now());
        let lease = u64::try_from(self.config.lease.as_nanos()).unwrap_or(u64::MAX);
        let record = Record {
            state: State::InProgress,
            fingerprint: req.fingerprint,
            owner,
            lease_until_ns: now.saturating_add(lease),
            created_ns: now,
            finished_ns: None,
            principal: req.scope.principal.clone(),
            tool: req.scope.tool.clone(),
        };
        // Written and fsynced before the lock, so that concurrent callers' fsyncs overlap.
        let mut temp = self.prepare(&name, &record.to_bytes()?)?;
        // Live before it is visible: another thread of this process must never see our record
        // with an unregistered nonce and take it for a dead owner's.
        owner.register_live();
        let seq = {
            let _lock = match self.lock() {
                Ok(lock) => lock,
                Err(e) => {
                    owner.unregister_live();
                    return Err(e);
                }
            };
            let current = match self.read(path) {
                Ok(current) => current,
                Err(e) => {
                    owner.unregister_live();
                    return Err(e);
                }
            };
            if current.as_deref() != expected {
                owner.unregister_live();
                return Ok(None);
            }
            if let Err(e) = self.storage.rename(&temp.path, path) {
                owner.unregister_live();
                return Err(io_err("rename temporary file into place at", path)(e));
            }
            temp.disarm();
            self.sequence()
        };
        let ticket = Ticket {
            scope: req.scope.clone(),
            key: req.key.clone(),
            fingerprint: req.fingerprint,
            owner,
            name,
            created_ns: record.created_ns,
            lease_until_ns: record.lease_until_ns,
        };
        if let Err(e) = self.wait_durable(seq) {
            // The record is visible but the effect never started: let a retry take it over.
            owner.mark_aborted();
            drop(ticket);
            return Err(e);
        }
        self.mark_durable(name);
        #[cfg(feature = "fault-injection")]
        self.fault("effect.after_in_progress");
        Ok(Some(ticket))
    }

    /// Replaces the ticket's `in_progress` record with its outcome.
    fn finish(&self, ticket: Ticket, state: State) -> Result<(), EffectError> {
        #[cfg(feature = "fault-injection")]
        self.fault("effect.before_complete");
        let path = self.record_path(&ticket.name);
        let is_failure = matches!(state, State::Failed { .. });
        let record = Record {
            state,
            fingerprint: ticket.fingerprint,
            owner: ticket.owner,
            lease_until_ns: ticket.lease_until_ns,
            created_ns: ticket.created_ns,
            finished_ns: Some(now_ns(SystemTime::now())),
            principal: ticket.scope.principal.clone(),
            tool: ticket.scope.tool.clone(),
        };
        let mut temp = self.prepare(&ticket.name, &record.to_bytes()?)?;
        let seq = {
            let _lock = self.lock()?;
            let current = self.read(&path)?;
            let ours = match &current {
                Some(bytes) => Record::parse(&path, bytes)
                    .is_ok_and(|r| r.state == State::InProgress && r.owner == ticket.owner),
                None => false,
            };
            if !ours {
                return Err(EffectError::LostOwnership {
                    key_digest: ticket.name,
                });
            }
            self.storage
                .rename(&temp.path, &path)
                .map_err(io_err("rename temporary file into place at", &path))?;
            temp.disarm();
            self.sequence()
        };
        // The outcome is visible now; if the fsync fails a retry of `begin` replays it (after
        // fsyncing the directory itself), so the ticket is done either way.
        self.wait_durable(seq)?;
        self.mark_durable(ticket.name);
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

    /// Writes `bytes` to a fresh temporary file and fsyncs it.
    fn prepare(&self, name: &Sha256Digest, bytes: &[u8]) -> Result<Temp<'_>, EffectError> {
        let pid = std::process::id();
        let hex = name.to_hex();
        let mut last = self.dir.clone();
        for _ in 0..TEMP_NAME_ATTEMPTS {
            let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = self.dir.join(format!(".{hex}.{pid}.{counter}.tmp"));
            active_temps().push(path.clone());
            match self.storage.write_new(&path, bytes) {
                Ok(()) => {
                    let temp = Temp {
                        storage: self.storage.as_ref(),
                        path,
                        armed: true,
                    };
                    self.storage
                        .fsync_file(&temp.path)
                        .map_err(io_err("fsync temporary file", &temp.path))?;
                    return Ok(temp);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    active_temps().retain(|p| p != &path);
                    last = path;
                }
                Err(e) => {
                    // A partial file may exist; remove it (best effort, open() removes leftovers).
                    let _ = self.storage.remove(&path);
                    active_temps().retain(|p| p != &path);
                    return Err(io_err("write temporary file", &path)(e));
                }
            }
        }
        Err(EffectError::Io {
            op: "create temporary file (every candidate name was taken)",
            path: last,
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }

    fn record_path(&self, name: &Sha256Digest) -> PathBuf {
        self.dir.join(format!("{}.json", name.to_hex()))
    }

    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, EffectError> {
        match self.storage.read(path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == io::ErrorKind::IsADirectory => Err(EffectError::Corrupt {
                path: path.to_path_buf(),
                reason: "it is a directory, not a record file".to_owned(),
            }),
            Err(e) => Err(io_err("read effect record", path)(e)),
        }
    }

    fn list(&self) -> Result<Vec<PathBuf>, EffectError> {
        self.storage
            .list(&self.dir)
            .map_err(io_err("list directory", &self.dir))
    }

    fn lock(&self) -> Result<DirLock<'_>, EffectError> {
        let guard = self
            .lock_file
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let path = self.dir.join(LOCK_FILE_NAME);
        loop {
            match guard.lock() {
                Ok(()) => return Ok(DirLock { guard }),
                // A signal interrupted the wait; waiting again is the only sane response.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("lock", &path)(e)),
            }
        }
    }

    /// Deletes `.<64 hex>.<pid>.<n>.tmp` files whose writer is gone. Callers hold the lock.
    fn remove_orphaned_temps(&self) -> Result<(), EffectError> {
        let own_pid = std::process::id();
        let mut removed = false;
        for path in self.list()? {
            let Some(pid) = temp_writer_pid(&path) else {
                continue;
            };
            let orphan = if pid == own_pid {
                !active_temps().contains(&path)
            } else {
                // A live pid may be an unrelated process that reused it; its leftover stays as
                // harmless garbage that readers ignore.
                !pid_alive(pid)
            };
            if orphan {
                match self.storage.remove(&path) {
                    Ok(()) => removed = true,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("remove orphaned temporary file", &path)(e)),
                }
            }
        }
        let _ = removed; // the fsync in open() covers the removals
        Ok(())
    }

    /// A sequence number for a rename just made (call under the lock).
    fn sequence(&self) -> u64 {
        let mut state = self.sync_state();
        state.renamed += 1;
        state.renamed
    }

    fn sync_state(&self) -> MutexGuard<'_, SyncState> {
        self.syncer
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once a directory fsync that started after rename `seq` has succeeded. One caller
    /// at a time fsyncs (the leader) for every rename sequenced so far; the others wait for it.
    fn wait_durable(&self, seq: u64) -> Result<(), EffectError> {
        let mut state = self.sync_state();
        loop {
            if state.synced >= seq {
                return Ok(());
            }
            if state.failed_through >= seq {
                let (kind, msg) = state
                    .failure
                    .clone()
                    .unwrap_or((io::ErrorKind::Other, "fsync failed".to_owned()));
                return Err(EffectError::Io {
                    op: "fsync directory",
                    path: self.dir.clone(),
                    source: io::Error::new(kind, msg),
                });
            }
            if state.syncing {
                state = self
                    .syncer
                    .cond
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            state.syncing = true;
            let target = state.renamed;
            drop(state);
            let result = self.storage.fsync_dir(&self.dir);
            state = self.sync_state();
            state.syncing = false;
            match result {
                Ok(()) => state.synced = state.synced.max(target),
                Err(e) => {
                    state.failed_through = state.failed_through.max(target);
                    state.failure = Some((e.kind(), e.to_string()));
                }
            }
            self.syncer.cond.notify_all();
        }
    }

    /// Before replaying a record this process did not write, makes sure its directory entry is
    /// durable: its writer may have died between its rename and its directory fsync.
    fn ensure_durable(&self, name: Sha256Digest) -> Result<(), EffectError> {
        if self.known().contains(&name) {
            return Ok(());
        }
        let seq = self.sequence();
        self.wait_durable(seq)?;
        self.mark_durable(name);
        Ok(())
    }

    fn known(&self) -> MutexGuard<'_, HashSet<Sha256Digest>> {
        self.known_durable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn mark_durable(&self, name: Sha256Digest) {
        let mut known = self.known();
        if known.len() >= MAX_KNOWN_DURABLE {
            known.clear();
        }
        known.insert(name);
    }

    fn forget_durable(&self, name: Sha256Digest) {
        self.known().remove(&name);
    }

    fn count(&self, tool: &str, bump: impl FnOnce(&mut Counters)) {
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        bump(counters.entry(tool.to_owned()).or_default());
    }

    #[cfg(feature = "fault-injection")]
    fn fault(&self, point: &'static str) {
        if let Some(hook) = &self.config.fault_hook {
            hook(point);
        }
    }
}

/// What a stored record means for `req`.
fn decide(
    record: &Record,
    path: &Path,
    req: &EffectRequest,
    kind: EffectKind,
    now: u64,
) -> Result<Decision, EffectError> {
    if record.principal != req.scope.principal || record.tool != req.scope.tool {
        return Err(EffectError::Corrupt {
            path: path.to_path_buf(),
            reason: "the record's principal or tool does not match its file name".to_owned(),
        });
    }
    if record.fingerprint != req.fingerprint {
        return Ok(Decision::Conflict);
    }
    Ok(match &record.state {
        State::Completed(value) => Decision::Replay(value.clone()),
        State::Failed {
            error,
            retryable: false,
        } => Decision::ReplayFailure(error.clone()),
        State::Failed {
            retryable: true, ..
        } => Decision::Take,
        State::InProgress => match liveness(&record.owner, record.lease_until_ns, now) {
            Liveness::Live => {
                let remaining = Duration::from_nanos(record.lease_until_ns.saturating_sub(now));
                Decision::Busy(remaining.max(MIN_RETRY_AFTER))
            }
            Liveness::NeverStarted => Decision::Take,
            Liveness::Dead => match kind {
                EffectKind::Idempotent => Decision::Take,
                EffectKind::Unsafe => Decision::Indeterminate,
            },
        },
    })
}

/// The record name: SHA-256 of the canonical `{"key","principal","tool"}`, after checking the key.
fn record_name(scope: &Scope, key: &str) -> Result<Sha256Digest, EffectError> {
    crate::IdempotencyKey::new(key).map_err(|e| match e {
        crate::CommitError::InvalidKey { reason } => EffectError::InvalidKey { reason },
        other => EffectError::InvalidKey {
            reason: other.to_string(),
        },
    })?;
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

/// The writer pid of a `.<64 hex>.<pid>.<counter>.tmp` path; `None` for every other name.
fn temp_writer_pid(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let mut parts = rest.split('.');
    let (hex, pid, counter) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !is_lower_hex(hex) || counter.parse::<u64>().is_err() {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let hex = "a".repeat(64);
        assert_eq!(
            temp_writer_pid(Path::new(&format!("/d/.{hex}.12.3.tmp"))),
            Some(12)
        );
        assert_eq!(
            temp_writer_pid(Path::new(&format!("/d/{hex}.12.3.tmp"))),
            None
        );
        assert_eq!(temp_writer_pid(Path::new("/d/.lock")), None);
        assert_eq!(
            temp_writer_pid(Path::new(&format!("/d/.{hex}.x.3.tmp"))),
            None
        );
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
