//! Pending actions in a PostgreSQL database, shared by every replica on it:
//! one row per token (its SHA-256, never the token), decided under the row's lock by the same
//! rules as in memory, so a preview issued by one replica is confirmed at most once across all
//! of them. The per-principal cap is counted under a transaction-scoped advisory lock of the
//! principal. A dead token's arguments and summary are dropped; rows are deleted `ttl` after
//! expiry, by the next preview of any principal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::{PgDriverError, PgError, PgStore, get, query_error};
use serde_json::{Map, Value};
use toolgate_canon::Sha256Digest;

use toolgate_state::pending::{
    ConfirmError, ConfirmToken, Lifetime, PendingAction, PendingStore, TokenState, judge,
    summary_step,
};

/// The component's migrations (`toolgate_schema`, component `confirmations`).
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE toolgate_pending (
         token_hash bytea PRIMARY KEY,
         principal text NOT NULL,
         tool text NOT NULL,
         arguments text,
         args_digest bytea NOT NULL,
         content_hash bytea NOT NULL,
         summary text,
         expires_ns bigint NOT NULL,
         forget_ns bigint NOT NULL,
         state text NOT NULL CHECK (state IN ('live', 'used', 'rejected', 'locked', 'expired')),
         wrong_summaries integer NOT NULL DEFAULT 0
     );
     CREATE INDEX toolgate_pending_live ON toolgate_pending (principal) WHERE state = 'live';
     CREATE INDEX toolgate_pending_forget ON toolgate_pending (forget_ns)",
    // The previewed call's `_meta` idempotency key, under which the confirmed call runs.
    "ALTER TABLE toolgate_pending ADD COLUMN idempotency_key text",
];

/// The pending actions of every replica on one database.
#[derive(Debug, Clone)]
pub struct PgPending {
    store: PgStore,
}

impl PgPending {
    /// The pending actions in `store`; creates or migrates their table.
    pub fn open(store: PgStore) -> Result<PgPending, PgError> {
        store.migrate("confirmations", MIGRATIONS)?;
        Ok(PgPending { store })
    }
}

impl PendingStore for PgPending {
    fn issue(
        &self,
        action: PendingAction,
        now: SystemTime,
        lifetime: Lifetime,
        max_live: usize,
    ) -> Result<ConfirmToken, ConfirmError> {
        prepare(&self.store, action, now, lifetime, max_live)
    }

    fn decide(
        &self,
        token: &str,
        principal: &str,
        now: SystemTime,
        summary: Option<&str>,
    ) -> Result<PendingAction, ConfirmError> {
        decide(&self.store, token, principal, now, summary)
    }

    fn count(&self, principal: Option<&str>, now: SystemTime) -> Result<usize, ConfirmError> {
        count(&self.store, principal, now)
    }
}

/// Nanoseconds since the epoch, as stored (0 before it, `i64::MAX` past 2262).
fn ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// A store failure as the caller sees it, logged (stderr) where it happens.
fn unavailable(error: PgError) -> ConfirmError {
    tracing::error!(%error, "the pending confirmations cannot be reached; refusing");
    ConfirmError::Store {
        cause: error.to_string(),
    }
}

/// `.map_err(fail(&database, "..."))` for a statement.
fn fail(database: &str, what: &'static str) -> impl Fn(PgDriverError) -> ConfirmError {
    let query = query_error(database, what);
    move |e| unavailable(query(e))
}

fn digest(bytes: Vec<u8>) -> Option<Sha256Digest> {
    <[u8; 32]>::try_from(bytes)
        .ok()
        .map(Sha256Digest::from_bytes)
}

/// Issues a token for `action`, after forgetting and expiring what is due at `now`.
fn prepare(
    store: &PgStore,
    action: PendingAction,
    now: SystemTime,
    Lifetime {
        expires_at,
        forget_at,
    }: Lifetime,
    max_per_principal: usize,
) -> Result<ConfirmToken, ConfirmError> {
    let arguments = serde_json::to_string(&action.arguments).map_err(|e| ConfirmError::Store {
        cause: format!("the arguments cannot be stored: {e}"),
    })?;
    store
        .run(move |pool, database| async move {
            let mut client = get(&pool, &database).await.map_err(unavailable)?;
            let tx = client
                .transaction()
                .await
                .map_err(fail(&database, "start a preview"))?;
            let now = ns(now);
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('toolgate_pending:' || $1, 0))",
                &[&action.principal],
            )
            .await
            .map_err(fail(&database, "lock the principal's pending actions"))?;
            tx.execute(
                "DELETE FROM toolgate_pending WHERE forget_ns <= $1",
                &[&now],
            )
            .await
            .map_err(fail(&database, "forget old pending actions"))?;
            tx.execute(
                "UPDATE toolgate_pending SET state = 'expired', arguments = NULL, summary = NULL
                 WHERE state = 'live' AND expires_ns <= $1",
                &[&now],
            )
            .await
            .map_err(fail(&database, "expire pending actions"))?;
            let live: i64 = tx
                .query_one(
                    "SELECT count(*) FROM toolgate_pending WHERE principal = $1 AND state = 'live'",
                    &[&action.principal],
                )
                .await
                .map_err(fail(&database, "count the principal's pending actions"))?
                .get(0);
            if usize::try_from(live).unwrap_or(usize::MAX) >= max_per_principal {
                return Err(ConfirmError::TooMany {
                    limit: max_per_principal,
                });
            }
            let token = loop {
                let token = ConfirmToken::random()?;
                let hash = token.hash();
                // 2^-256 per pair; even then two actions never share a token.
                let inserted = tx
                    .execute(
                        "INSERT INTO toolgate_pending (token_hash, principal, tool, arguments,
                             args_digest, content_hash, summary, expires_ns, forget_ns, state,
                             idempotency_key)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'live', $10)
                         ON CONFLICT (token_hash) DO NOTHING",
                        &[
                            &hash.as_bytes().as_slice(),
                            &action.principal,
                            &action.tool,
                            &arguments,
                            &action.args_digest.as_bytes().as_slice(),
                            &action.content_hash.as_bytes().as_slice(),
                            &action.summary,
                            &ns(expires_at),
                            &ns(forget_at),
                            &action.idempotency_key,
                        ],
                    )
                    .await
                    .map_err(fail(&database, "store a pending action"))?;
                if inserted == 1 {
                    break token;
                }
            };
            tx.commit()
                .await
                .map_err(fail(&database, "commit a pending action"))?;
            Ok(token)
        })
        .map_err(unavailable)?
}

/// Confirms (`summary` given) or rejects (`None`) the action of `token` for `principal`, under
/// the token's row lock.
fn decide(
    store: &PgStore,
    token: &str,
    principal: &str,
    now: SystemTime,
    summary: Option<&str>,
) -> Result<PendingAction, ConfirmError> {
    if !ConfirmToken::is_well_formed(token) {
        return Err(ConfirmError::Malformed);
    }
    let hash = Sha256Digest::of(token.as_bytes());
    let principal = principal.to_owned();
    let summary = summary.map(str::to_owned);
    store
        .run(move |pool, database| async move {
            let mut client = get(&pool, &database).await.map_err(unavailable)?;
            let tx = client
                .transaction()
                .await
                .map_err(fail(&database, "start a confirmation"))?;
            let row = tx
                .query_opt(
                    "SELECT principal, state, wrong_summaries, expires_ns, tool, arguments,
                         args_digest, content_hash, summary, idempotency_key
                     FROM toolgate_pending WHERE token_hash = $1 AND forget_ns > $2 FOR UPDATE",
                    &[&hash.as_bytes().as_slice(), &ns(now)],
                )
                .await
                .map_err(fail(&database, "read a pending action"))?
                .ok_or(ConfirmError::Unknown)?;
            let owner: String = row.get(0);
            let wrong_summaries = u32::try_from(row.get::<_, i32>(2)).unwrap_or(0);
            let state = TokenState::from_name(row.get::<_, &str>(1), wrong_summaries);
            let verdict = judge(&owner, state, time(row.get(3)), &principal, now);
            let (next, verdict) = match (verdict, &summary) {
                (Err(ConfirmError::Expired), _) if matches!(state, TokenState::Live { .. }) => {
                    (TokenState::Expired, Err(ConfirmError::Expired))
                }
                (Err(error), _) => return Err(error),
                (Ok(()), None) => (TokenState::Rejected, Ok(())),
                (Ok(()), Some(summary)) => {
                    let stored: Option<&str> = row.get(8);
                    summary_step(wrong_summaries, stored == Some(summary.as_str()))
                }
            };
            // A dead token keeps its count and loses its action.
            let (wrong, dead) = match next {
                TokenState::Live { wrong_summaries } => {
                    (i32::try_from(wrong_summaries).unwrap_or(i32::MAX), false)
                }
                _ => (row.get::<_, i32>(2), true),
            };
            tx.execute(
                "UPDATE toolgate_pending SET state = $2, wrong_summaries = $3,
                     arguments = CASE WHEN $4 THEN NULL ELSE arguments END,
                     summary = CASE WHEN $4 THEN NULL ELSE summary END
                 WHERE token_hash = $1",
                &[&hash.as_bytes().as_slice(), &next.name(), &wrong, &dead],
            )
            .await
            .map_err(fail(&database, "record a confirmation"))?;
            tx.commit()
                .await
                .map_err(fail(&database, "commit a confirmation"))?;
            verdict?;
            let arguments: Option<String> = row.get(5);
            let arguments: Map<String, Value> = arguments
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok())
                .ok_or(ConfirmError::Unknown)?;
            Ok(PendingAction {
                principal: owner,
                tool: row.get(4),
                arguments,
                args_digest: digest(row.get(6)).ok_or(ConfirmError::Unknown)?,
                content_hash: digest(row.get(7)).ok_or(ConfirmError::Unknown)?,
                summary: row.get::<_, Option<String>>(8).unwrap_or_default(),
                idempotency_key: row.get(9),
            })
        })
        .map_err(unavailable)?
}

/// Live tokens of `principal`, or every remembered token (`None`), at `now`.
fn count(store: &PgStore, principal: Option<&str>, now: SystemTime) -> Result<usize, ConfirmError> {
    let principal = principal.map(str::to_owned);
    store
        .run(move |pool, database| async move {
            let client = get(&pool, &database).await.map_err(unavailable)?;
            let now = ns(now);
            let row = match &principal {
                Some(principal) => {
                    client
                        .query_one(
                            "SELECT count(*) FROM toolgate_pending
                             WHERE principal = $1 AND state = 'live' AND expires_ns > $2",
                            &[principal, &now],
                        )
                        .await
                }
                None => {
                    client
                        .query_one(
                            "SELECT count(*) FROM toolgate_pending WHERE forget_ns > $1",
                            &[&now],
                        )
                        .await
                }
            }
            .map_err(fail(&database, "count pending actions"))?;
            Ok(usize::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
        .map_err(unavailable)?
}
