//! The PostgreSQL backend (feature `postgres`): the same state machine, one row per key in a
//! database every replica shares.
//!
//! Table `toolgate_effects` (component `effects`, schema version 1): one row per record, keyed by
//! the record's name (hex SHA-256 of canonical `{"key","principal","tool"}`, as in the journal),
//! with `principal`, `tool`, `state`, `fingerprint` (hex), the owner (`owner_key`, `owner_nonce`,
//! `owner_pid`), `lease_until_ns`, `created_ns`, `finished_ns`, `result` (the canonical JSON text),
//! `error` and `retryable`. Times are nanoseconds since the epoch.
//!
//! # Decisions
//!
//! `begin` first reads the row without a lock: a settled record (finished, well inside its
//! retention window) is answered from that read alone (`settled`, shared with the file store).
//! Otherwise it is one transaction: `INSERT .. ON CONFLICT (name) DO NOTHING` claims an absent key;
//! otherwise `SELECT .. FOR UPDATE` locks the row, the shared `decide` judges it exactly as the
//! other backends do, and a takeover or retry rewrites it in the same transaction. Concurrent
//! begins of one key, from any replica, are serialized by the row lock: one executes.
//! `complete`, `fail` and `resolve` change the row only while the caller still owns it.
//!
//! # Owners and liveness
//!
//! Every backend value (one per process) draws a random 63-bit `owner_key` and holds the
//! session-level advisory lock of that key on a connection of its own for as long as it lives.
//! An owner of another process is alive exactly while that lock is held (`pg_locks`): a replica
//! that crashes, is killed or loses its connection releases it at once, so its idempotent keys
//! are taken over and its unsafe ones become indeterminate, as for a dead process on one machine.
//! An owner of this process is judged by its ticket, as in the other backends. A lease that ran
//! out does not make a live owner dead; it only sets `retry_after`. If this process's own lock
//! connection dropped (the database restarted), the next call opens a new one and takes the lock
//! again; meanwhile the other replicas see its owners as dead.
//!
//! # Durability
//!
//! Answers are given after the transaction commits. For unsafe effects the commit is
//! synchronous (`synchronous_commit` as configured, `on` by default); for idempotent ones the
//! transaction sets `synchronous_commit = off`, the database's counterpart of the journal
//! deferring their `fdatasync`: a database crash may lose the last idempotent records (a retry
//! then executes again, harmlessly), never an unsafe one. [`EffectBackend::sync`] makes
//! everything durable (a synchronous commit flushes the write-ahead log up to itself).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use crate::store::{PgError, PgSession, PgStore, cause, get, query_error};
use serde_json::Value;
use toolgate_canon::Sha256Digest;

use toolgate_commit::machine::{
    CounterTable, Course, Liveness, Owner, Record, State, StoredResult, answer, decide,
    in_progress, liveness, now_ns, record_name, resolvable, self_start_ticks, settled,
};
use toolgate_commit::{
    Attempt, Begin, Counters, EffectBackend, EffectConfig, EffectError, EffectKind, EffectRequest,
    EffectStatus, InProgressWait, Resolution, Scope, Ticket,
};

/// The schema of component `effects`, one entry per version.
const MIGRATIONS: &[&str] = &["CREATE TABLE toolgate_effects (
        name text PRIMARY KEY,
        principal text NOT NULL,
        tool text NOT NULL,
        state text NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed')),
        fingerprint text NOT NULL,
        owner_key bigint NOT NULL,
        owner_nonce bigint NOT NULL,
        owner_pid bigint NOT NULL,
        lease_until_ns bigint NOT NULL,
        created_ns bigint NOT NULL,
        finished_ns bigint,
        result text,
        error text,
        retryable boolean
    );
    CREATE INDEX toolgate_effects_finished ON toolgate_effects (finished_ns)
        WHERE finished_ns IS NOT NULL;"];

/// The columns a record is read from, in `to_record`'s terms.
macro_rules! columns {
    () => {
        "state, fingerprint, owner_key, owner_nonce, lease_until_ns, created_ns, finished_ns, \
         result, error, retryable, principal, tool"
    };
}
const COLUMNS: &str = columns!();

/// One record by name, without a lock.
const READ_ONE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM toolgate_effects WHERE name = $1"
);

/// An [`EffectBackend`] on PostgreSQL, shared by every replica that opens the same database.
#[derive(Debug)]
pub struct PgEffects {
    store: PgStore,
    /// This process's owner key: the advisory lock that says its owners are alive.
    owner_key: i64,
    /// The connection holding that lock (`None` until the first call, or after it dropped).
    session: Mutex<Option<PgSession>>,
    counters: CounterTable,
    lease: Duration,
    completed_ttl: Duration,
    wait_in_progress: Option<Duration>,
}

/// What one `begin` transaction decided.
enum Claimed {
    /// The key is this call's: execute.
    Took(Record),
    /// Anything else, for the shared `answer`.
    Decided(Course),
    /// The row vanished between the claim and the read (a prune or a forget): attempt again.
    Vanished,
}

/// A row as read.
enum Read {
    Absent,
    Found(Record, Liveness),
    /// The row does not make a record (outside interference): why.
    Corrupt(String),
}

impl Read {
    /// The record and its owner's liveness, `None` when absent, `Corrupt` when unreadable.
    fn found(self) -> Result<Option<(Record, Liveness)>, EffectError> {
        match self {
            Read::Absent => Ok(None),
            Read::Found(record, live) => Ok(Some((record, live))),
            Read::Corrupt(reason) => Err(EffectError::Corrupt {
                path: NAME.into(),
                reason,
            }),
        }
    }
}

impl PgEffects {
    /// Opens the effect store of the database `store` connects to, creating or migrating its
    /// table, configured by `config`'s lease, retention and wait (its directory is not used).
    pub fn open(store: PgStore, config: &EffectConfig) -> Result<Self, EffectError> {
        store.migrate("effects", MIGRATIONS).map_err(backend)?;
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| EffectError::Backend {
            cause: format!("cannot draw an owner key: {e}"),
        })?;
        // Positive, so it prints and compares the same in SQL and here.
        // Never 0: that key marks an abandoned execution (`abandon`).
        let owner_key = (i64::from_le_bytes(bytes) & i64::MAX).max(1);
        let effects = PgEffects {
            store,
            owner_key,
            session: Mutex::new(None),
            counters: CounterTable::default(),
            lease: config.lease_time(),
            completed_ttl: config.completed_retention(),
            wait_in_progress: config.in_progress_wait(),
        };
        effects.hold_liveness()?;
        Ok(effects)
    }

    fn session(&self) -> MutexGuard<'_, Option<PgSession>> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes sure this process holds its liveness lock (again, after a dropped connection).
    fn hold_liveness(&self) -> Result<(), EffectError> {
        let mut session = self.session();
        if session.as_ref().is_some_and(|s| !s.is_closed()) {
            return Ok(());
        }
        let fresh = self.store.session().map_err(backend)?;
        let client = Arc::clone(&fresh.client);
        let key = self.owner_key;
        self.store
            .run(move |_, database| async move {
                client
                    .execute("SELECT pg_advisory_lock($1)", &[&key])
                    .await
                    .map_err(|e| PgError::Query {
                        database,
                        what: "take the liveness lock of this process",
                        cause: cause(&e),
                    })
            })
            .and_then(|r| r)
            .map_err(backend)?;
        *session = Some(fresh);
        Ok(())
    }

    fn ttl_ns(&self) -> i64 {
        i64::try_from(self.completed_ttl.as_nanos()).unwrap_or(i64::MAX)
    }

    /// Stores a finished state for `ticket` while it still owns the row.
    fn finish(&self, ticket: Ticket, state: State) -> Result<(), EffectError> {
        let is_failure = matches!(state, State::Failed { .. });
        let (result, error, retryable) = match &state {
            State::Completed(stored) => (Some(stored.canonical()), None, None),
            State::Failed { error, retryable } => (None, Some(error.to_string()), Some(*retryable)),
            State::InProgress => (None, None, None),
        };
        let state_name = if is_failure { "failed" } else { "completed" };
        let name = ticket.name.to_hex();
        let nonce = ticket.owner.nonce as i64;
        let key = self.owner_key;
        let finished = ns(now_ns(SystemTime::now()));
        let asynchronous = ticket.kind == EffectKind::Idempotent;
        let updated = self
            .store
            .run(move |pool, database| async move {
                let query = query_error(&database, "store an effect's outcome");
                let mut client = get(&pool, &database).await?;
                let tx = client.transaction().await.map_err(&query)?;
                if asynchronous {
                    tx.batch_execute("SET LOCAL synchronous_commit = off")
                        .await
                        .map_err(&query)?;
                }
                let store_outcome = tx
                    .prepare_cached(
                        "UPDATE toolgate_effects SET state = $2, result = $3, error = $4, \
                         retryable = $5, finished_ns = $6 \
                         WHERE name = $1 AND state = 'in_progress' AND owner_key = $7 \
                         AND owner_nonce = $8",
                    )
                    .await
                    .map_err(&query)?;
                let n = tx
                    .execute(
                        &store_outcome,
                        &[
                            &name,
                            &state_name,
                            &result,
                            &error,
                            &retryable,
                            &finished,
                            &key,
                            &nonce,
                        ],
                    )
                    .await
                    .map_err(&query)?;
                tx.commit().await.map_err(&query)?;
                Ok::<u64, PgError>(n)
            })
            .and_then(|r| r)
            .map_err(backend)?;
        if updated != 1 {
            return Err(EffectError::LostOwnership {
                key_digest: ticket.name,
            });
        }
        let tool = ticket.scope.tool.clone();
        drop(ticket);
        self.counters.count(&tool, |c| {
            if is_failure {
                c.failed += 1;
            } else {
                c.committed += 1;
            }
        });
        Ok(())
    }

    /// Gives the ticket up: its row keeps `in_progress` under owner key 0 (never drawn, so no
    /// replica holds its lock) and pid 0, so every replica sees a dead owner.
    fn abandon_row(&self, ticket: Ticket) -> Result<(), EffectError> {
        let name = ticket.name.to_hex();
        let nonce = ticket.owner.nonce as i64;
        let key = self.owner_key;
        let updated = self
            .store
            .run(move |pool, database| async move {
                let query = query_error(&database, "give up an effect without an outcome");
                let client = get(&pool, &database).await?;
                let abandon = client
                    .prepare_cached(
                        "UPDATE toolgate_effects SET owner_key = 0, owner_pid = 0, \
                         lease_until_ns = 0 \
                         WHERE name = $1 AND state = 'in_progress' AND owner_key = $2 \
                         AND owner_nonce = $3",
                    )
                    .await
                    .map_err(&query)?;
                let n = client
                    .execute(&abandon, &[&name, &key, &nonce])
                    .await
                    .map_err(&query)?;
                Ok::<u64, PgError>(n)
            })
            .and_then(|r| r)
            .map_err(backend)?;
        if updated != 1 {
            return Err(EffectError::LostOwnership {
                key_digest: ticket.name,
            });
        }
        Ok(())
    }

    /// The record of `name` and what is known of its owner, read in `tx` (locked with `lock`).
    async fn read(
        tx: &tokio_postgres::Transaction<'_>,
        name: &str,
        mine: i64,
        lock: bool,
        now: u64,
    ) -> Result<Read, tokio_postgres::Error> {
        let sql = format!(
            "SELECT {COLUMNS} FROM toolgate_effects WHERE name = $1{}",
            if lock { " FOR UPDATE" } else { "" }
        );
        let Some(row) = tx.query_opt(&sql, &[&name]).await? else {
            return Ok(Read::Absent);
        };
        let owner_key: i64 = row.get("owner_key");
        let record = match to_record(&row, owner_key == mine) {
            Ok(record) => record,
            Err(reason) => return Ok(Read::Corrupt(reason)),
        };
        let live = if !record.state.is_in_progress() {
            Liveness::Live
        } else if owner_key == mine {
            liveness(&record.owner, record.lease_until_ns, now)
        } else {
            let held: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                     AND granted AND objsubid = 1 \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND classid::int8 = ($1::int8 >> 32) AND objid::int8 = ($1::int8 & 4294967295))",
                    &[&owner_key],
                )
                .await?
                .get(0);
            if held { Liveness::Live } else { Liveness::Dead }
        };
        Ok(Read::Found(record, live))
    }
}

impl EffectBackend for PgEffects {
    fn in_progress_wait(&self) -> InProgressWait {
        InProgressWait::start(self.wait_in_progress)
    }

    fn begin_attempt(
        &self,
        req: &EffectRequest,
        kind: EffectKind,
        wait: &mut InProgressWait,
    ) -> Result<Attempt, EffectError> {
        let name = record_name(&req.scope, &req.key)?;
        self.hold_liveness()?;
        let now = now_ns(SystemTime::now());
        let fresh = in_progress(
            req,
            now,
            self.lease,
            req.scope.principal.as_str().into(),
            req.scope.tool.as_str().into(),
        );
        // Live before the row is visible to anyone: no one may see it with an unregistered owner.
        fresh.owner.register_live();
        let owner = fresh.owner;
        let (hex, key, request) = (name.to_hex(), self.owner_key, req.clone());
        let retention = self.completed_ttl;
        let claimed = self.store.run(move |pool, database| async move {
            let query = query_error(&database, "claim an idempotency key");
            let mut client = get(&pool, &database).await?;
            // A settled record answers from one read, without a transaction or a row lock
            // (`settled`). In progress, absent, or to be retried: decided below, under the row
            // lock.
            let select = client.prepare_cached(READ_ONE).await.map_err(&query)?;
            if let Some(row) = client.query_opt(&select, &[&hex]).await.map_err(&query)?
                && let Ok(existing) = to_record(&row, row.get::<_, i64>("owner_key") == key)
            {
                match settled(&existing, Path::new(NAME), &request, kind, now, retention) {
                    Ok(None) => {}
                    Ok(Some(decision)) => return Ok(Ok(Claimed::Decided(decision))),
                    Err(e) => return Ok(Err(e)),
                }
            }
            let tx = client.transaction().await.map_err(&query)?;
            if kind == EffectKind::Idempotent {
                tx.batch_execute("SET LOCAL synchronous_commit = off")
                    .await
                    .map_err(&query)?;
            }
            let row = Row::of(&fresh);
            let claim = tx
                .prepare_cached(
                    "INSERT INTO toolgate_effects (name, principal, tool, state, fingerprint, \
                     owner_key, owner_nonce, owner_pid, lease_until_ns, created_ns) \
                     VALUES ($1, $2, $3, 'in_progress', $4, $5, $6, $7, $8, $9) \
                     ON CONFLICT (name) DO NOTHING",
                )
                .await
                .map_err(&query)?;
            let inserted = tx
                .execute(
                    &claim,
                    &[
                        &hex,
                        &row.principal,
                        &row.tool,
                        &row.fingerprint,
                        &key,
                        &row.nonce,
                        &row.pid,
                        &row.lease_until,
                        &row.created,
                    ],
                )
                .await
                .map_err(&query)?;
            if inserted == 1 {
                tx.commit().await.map_err(&query)?;
                return Ok(Ok(Claimed::Took(fresh)));
            }
            let read = Self::read(&tx, &hex, key, true, now)
                .await
                .map_err(&query)?;
            let (existing, live) = match read.found() {
                Ok(Some(found)) => found,
                // Deleted between the insert and the select (a prune or a forget).
                Ok(None) => return Ok(Ok(Claimed::Vanished)),
                Err(e) => return Ok(Err(e)),
            };
            let decision = match decide(&existing, Path::new(NAME), &request, kind, now, live) {
                Ok(decision) => decision,
                Err(e) => return Ok(Err(e)),
            };
            if !matches!(decision, Course::Take) {
                tx.commit().await.map_err(&query)?;
                return Ok(Ok(Claimed::Decided(decision)));
            }
            tx.execute(
                "UPDATE toolgate_effects SET state = 'in_progress', fingerprint = $2, \
                 owner_key = $3, owner_nonce = $4, owner_pid = $5, lease_until_ns = $6, \
                 created_ns = $7, finished_ns = NULL, result = NULL, error = NULL, \
                 retryable = NULL WHERE name = $1",
                &[
                    &hex,
                    &row.fingerprint,
                    &key,
                    &row.nonce,
                    &row.pid,
                    &row.lease_until,
                    &row.created,
                ],
            )
            .await
            .map_err(&query)?;
            tx.commit().await.map_err(&query)?;
            Ok::<_, PgError>(Ok(Claimed::Took(fresh)))
        });
        let claimed = match claimed.and_then(|r| r) {
            Ok(Ok(claimed)) => claimed,
            Ok(Err(e)) => {
                owner.mark_aborted();
                return Err(e);
            }
            Err(e) => {
                // The row may hold this owner if the commit's outcome is unknown; the effect was
                // certainly never started, so a retry may take it over.
                owner.mark_aborted();
                return Err(backend(e));
            }
        };
        match claimed {
            Claimed::Took(record) => Ok(Attempt::Ready(Begin::Execute(Ticket {
                scope: req.scope.clone(),
                key: req.key.clone(),
                fingerprint: req.fingerprint,
                owner,
                name,
                created_ns: record.created_ns,
                lease_until_ns: record.lease_until_ns,
                kind,
            }))),
            Claimed::Vanished => {
                owner.unregister_live();
                Ok(Attempt::Pause(Duration::from_millis(1)))
            }
            Claimed::Decided(decision) => {
                owner.unregister_live();
                answer(decision, name, req, wait, &self.counters, Path::new(NAME))
            }
        }
    }

    fn complete(&self, ticket: Ticket, result: &Value) -> Result<(), EffectError> {
        let stored = StoredResult::from_value(result)?;
        self.finish(ticket, State::Completed(stored))
    }

    fn fail(&self, ticket: Ticket, error: &str, retryable: bool) -> Result<(), EffectError> {
        self.finish(
            ticket,
            State::Failed {
                error: error.into(),
                retryable,
            },
        )
    }

    fn abandon(&self, ticket: Ticket) -> Result<(), EffectError> {
        self.abandon_row(ticket)
    }

    fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<EffectStatus>, EffectError> {
        let name = record_name(scope, key)?.to_hex();
        let mine = self.owner_key;
        let now = now_ns(SystemTime::now());
        let found = self
            .store
            .run(move |pool, database| async move {
                let query = query_error(&database, "look up an idempotency key");
                let mut client = get(&pool, &database).await?;
                let tx = client.transaction().await.map_err(&query)?;
                let found = Self::read(&tx, &name, mine, false, now)
                    .await
                    .map_err(&query)?;
                tx.commit().await.map_err(&query)?;
                Ok::<_, PgError>(found)
            })
            .and_then(|r| r)
            .map_err(backend)?;
        found
            .found()?
            .map(|(record, live)| EffectStatus::of(&record, live, Path::new(NAME)))
            .transpose()
    }

    fn resolve(&self, scope: &Scope, key: &str, resolution: Resolution) -> Result<(), EffectError> {
        let digest = record_name(scope, key)?;
        let name = digest.to_hex();
        let mine = self.owner_key;
        let now = now_ns(SystemTime::now());
        let completed = match &resolution {
            Resolution::Completed(result) => Some(StoredResult::from_value(result)?.canonical()),
            Resolution::Forget => None,
        };
        self.store
            .run(move |pool, database| async move {
                let query = query_error(&database, "resolve an indeterminate effect");
                let mut client = get(&pool, &database).await?;
                let tx = client.transaction().await.map_err(&query)?;
                let read = Self::read(&tx, &name, mine, true, now)
                    .await
                    .map_err(&query)?;
                let found = match read.found() {
                    Ok(found) => found,
                    Err(e) => return Ok(Err(e)),
                };
                let live = found.as_ref().map(|(_, live)| *live);
                if let Err(e) = resolvable(found.as_ref().map(|(r, _)| r), digest, live) {
                    return Ok(Err(e));
                }
                match completed {
                    None => tx
                        .execute("DELETE FROM toolgate_effects WHERE name = $1", &[&name])
                        .await
                        .map_err(&query)?,
                    Some(text) => tx
                        .execute(
                            "UPDATE toolgate_effects SET state = 'completed', result = $2, \
                             finished_ns = $3 WHERE name = $1",
                            &[&name, &text, &ns(now)],
                        )
                        .await
                        .map_err(&query)?,
                };
                tx.commit().await.map_err(&query)?;
                Ok::<_, PgError>(Ok(()))
            })
            .and_then(|r| r)
            .map_err(backend)?
    }

    fn prune(&self, now: SystemTime) -> Result<u64, EffectError> {
        let cutoff = ns(now_ns(now)).saturating_sub(self.ttl_ns());
        self.store
            .run(move |pool, database| async move {
                let query = query_error(&database, "prune finished effects");
                let client = get(&pool, &database).await?;
                client
                    .execute(
                        "DELETE FROM toolgate_effects WHERE finished_ns IS NOT NULL \
                         AND finished_ns < $1",
                        &[&cutoff],
                    )
                    .await
                    .map_err(&query)
            })
            .and_then(|r| r)
            .map_err(backend)
    }

    fn compact(&self) -> Result<(), EffectError> {
        // One row per key and no history: the database reclaims dead rows itself (VACUUM).
        Ok(())
    }

    fn sync(&self) -> Result<(), EffectError> {
        self.store
            .run(move |pool, database| async move {
                let query = query_error(&database, "flush idempotent effects");
                let mut client = get(&pool, &database).await?;
                let tx = client.transaction().await.map_err(&query)?;
                tx.batch_execute("SET LOCAL synchronous_commit = on; SELECT pg_current_xact_id()")
                    .await
                    .map_err(&query)?;
                tx.commit().await.map_err(&query)
            })
            .and_then(|r| r)
            .map_err(backend)
    }

    fn counters(&self) -> BTreeMap<String, Counters> {
        self.counters.snapshot()
    }
}

/// Named in `Corrupt` errors.
const NAME: &str = "(PostgreSQL table toolgate_effects)";

/// The parameters of a fresh `in_progress` row.
struct Row {
    principal: String,
    tool: String,
    fingerprint: String,
    nonce: i64,
    pid: i64,
    lease_until: i64,
    created: i64,
}

impl Row {
    fn of(record: &Record) -> Row {
        Row {
            principal: record.principal.to_string(),
            tool: record.tool.to_string(),
            fingerprint: record.fingerprint.to_hex(),
            // The nonce's bits, stored in a signed column.
            nonce: record.owner.nonce as i64,
            pid: i64::from(record.owner.pid),
            lease_until: ns(record.lease_until_ns),
            created: ns(record.created_ns),
        }
    }
}

fn ns(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn unns(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A row as the shared state machine's record. The owner of another process gets pid 0, which
/// is never this process; its liveness is decided from the advisory lock instead.
fn to_record(row: &tokio_postgres::Row, mine: bool) -> Result<Record, String> {
    let state: String = row.get("state");
    let fingerprint = row
        .get::<_, &str>("fingerprint")
        .parse::<Sha256Digest>()
        .map_err(|e| format!("a fingerprint is not a digest: {e}"))?;
    let state = match state.as_str() {
        "in_progress" => State::InProgress,
        "completed" => {
            let text: Option<String> = row.get("result");
            let text = text.ok_or("a completed record has no result")?;
            let value: Value = serde_json::from_str(&text).map_err(|e| {
                format!("a stored result does not parse ({:?} error)", e.classify())
            })?;
            State::Completed(StoredResult::from_value(&value).map_err(|e| e.to_string())?)
        }
        "failed" => {
            let error: Option<String> = row.get("error");
            let retryable: Option<bool> = row.get("retryable");
            State::Failed {
                error: error.unwrap_or_default().into(),
                retryable: retryable.unwrap_or(false),
            }
        }
        other => return Err(format!("unknown state {other:?}")),
    };
    let nonce: i64 = row.get("owner_nonce");
    let owner = if mine {
        Owner {
            pid: std::process::id(),
            start_ticks: self_start_ticks(),
            nonce: nonce as u64,
        }
    } else {
        Owner {
            pid: 0,
            start_ticks: 0,
            nonce: nonce as u64,
        }
    };
    let finished: Option<i64> = row.get("finished_ns");
    let principal: String = row.get("principal");
    let tool: String = row.get("tool");
    Ok(Record {
        state,
        fingerprint,
        owner,
        lease_until_ns: unns(row.get("lease_until_ns")),
        created_ns: unns(row.get("created_ns")),
        finished_ns: finished.map(unns),
        principal: principal.into(),
        tool: tool.into(),
    })
}

fn backend(e: PgError) -> EffectError {
    EffectError::Backend {
        cause: e.to_string(),
    }
}
