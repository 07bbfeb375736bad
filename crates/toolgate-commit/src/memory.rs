//! The in-memory backend: the same state machine as the journal, kept in a map of this process.
//!
//! Nothing survives the process, so it gives exactly-once across retries and concurrent calls of
//! one process, not across restarts: for tests, benchmarks and embedders whose effects live in
//! memory too. Owners are always this process's tickets, so liveness is exact. It is configured
//! by the same [`EffectConfig`] as the journal (its directory unused).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use toolgate_canon::Sha256Digest;

use super::record::{Record, State, StoredResult, liveness, now_ns};
use super::{
    Attempt, Begin, CounterTable, Counters, Course, EffectBackend, EffectConfig, EffectError,
    EffectKind, EffectRequest, EffectStatus, InProgressWait, Resolution, Scope, Ticket, answer,
    decide, held_by, in_progress, record_name, resolvable,
};

/// Named in `Corrupt` errors, which this backend can only report for a result that does not
/// parse back.
const NAME: &str = "(memory effect store)";

/// An [`EffectBackend`] in this process's memory.
#[derive(Debug)]
pub struct MemoryEffects {
    records: Mutex<HashMap<Sha256Digest, Record>>,
    counters: CounterTable,
    lease: Duration,
    completed_ttl: Duration,
    wait_in_progress: Option<Duration>,
}

impl Default for MemoryEffects {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryEffects {
    /// An empty store with [`EffectConfig::new`]'s defaults (lease 30 s, finished records kept
    /// 24 h, `InProgress` answered at once).
    pub fn new() -> Self {
        Self::with_config(&EffectConfig::new(""))
    }

    /// An empty store with `config`'s lease, retention and wait (its directory is not used).
    pub fn with_config(config: &EffectConfig) -> Self {
        MemoryEffects {
            records: Mutex::default(),
            counters: CounterTable::default(),
            lease: config.lease,
            completed_ttl: config.completed_ttl,
            wait_in_progress: config.wait_in_progress,
        }
    }

    fn records(&self) -> MutexGuard<'_, HashMap<Sha256Digest, Record>> {
        // Every change is one insert or remove of a whole record, so the map is consistent even
        // if a holder panicked.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn finish(&self, ticket: Ticket, state: State) -> Result<(), EffectError> {
        let is_failure = matches!(state, State::Failed { .. });
        let mut records = self.records();
        if !held_by(records.get(&ticket.name), &ticket.owner) {
            return Err(EffectError::LostOwnership {
                key_digest: ticket.name,
            });
        }
        records.insert(ticket.name, ticket.finished(state));
        drop(records);
        let tool = ticket.scope.tool.clone();
        // Dropping the ticket after the record changed: no one sees its record with a dead owner.
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
}

impl EffectBackend for MemoryEffects {
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
        let now = now_ns(SystemTime::now());
        let mut records = self.records();
        let decision = match records.get(&name) {
            None => Course::Take,
            Some(record) => {
                let live = liveness(&record.owner, record.lease_until_ns, now);
                decide(record, Path::new(NAME), req, kind, now, live)?
            }
        };
        if !matches!(decision, Course::Take) {
            drop(records);
            return answer(decision, name, req, wait, &self.counters, Path::new(NAME));
        }
        let record = in_progress(
            req,
            now,
            self.lease,
            req.scope.principal.as_str().into(),
            req.scope.tool.as_str().into(),
        );
        let owner = record.owner;
        // Live before the map is released: no one may see the record with an unregistered owner.
        owner.register_live();
        let ticket = Ticket {
            scope: req.scope.clone(),
            key: req.key.clone(),
            fingerprint: req.fingerprint,
            owner,
            name,
            created_ns: record.created_ns,
            lease_until_ns: record.lease_until_ns,
            kind,
        };
        records.insert(name, record);
        Ok(Attempt::Ready(Begin::Execute(ticket)))
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
        let mut records = self.records();
        if !held_by(records.get(&ticket.name), &ticket.owner) {
            return Err(EffectError::LostOwnership {
                key_digest: ticket.name,
            });
        }
        records.insert(ticket.name, ticket.abandoned());
        Ok(())
    }

    fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<EffectStatus>, EffectError> {
        let name = record_name(scope, key)?;
        let now = now_ns(SystemTime::now());
        self.records()
            .get(&name)
            .map(|record| {
                let live = liveness(&record.owner, record.lease_until_ns, now);
                EffectStatus::of(record, live, Path::new(NAME))
            })
            .transpose()
    }

    fn resolve(&self, scope: &Scope, key: &str, resolution: Resolution) -> Result<(), EffectError> {
        let name = record_name(scope, key)?;
        let now = now_ns(SystemTime::now());
        let mut records = self.records();
        let record = records.get(&name);
        let live = record.map(|r| liveness(&r.owner, r.lease_until_ns, now));
        let record = resolvable(record, name, live)?;
        match resolution {
            Resolution::Forget => {
                records.remove(&name);
            }
            Resolution::Completed(result) => {
                let completed = Record {
                    state: State::Completed(StoredResult::from_value(&result)?),
                    finished_ns: Some(now),
                    ..record.clone()
                };
                records.insert(name, completed);
            }
        }
        Ok(())
    }

    fn prune(&self, now: SystemTime) -> Result<u64, EffectError> {
        let now = now_ns(now);
        let ttl = u64::try_from(self.completed_ttl.as_nanos()).unwrap_or(u64::MAX);
        let mut records = self.records();
        let before = records.len();
        records.retain(|_, record| {
            record
                .finished_ns
                .is_none_or(|finished| now.saturating_sub(finished) <= ttl)
        });
        Ok((before - records.len()) as u64)
    }

    fn compact(&self) -> Result<(), EffectError> {
        // The map holds only the latest record of each key: no history to drop.
        Ok(())
    }

    fn sync(&self) -> Result<(), EffectError> {
        // Nothing here is durable, and nothing more can be made so.
        Ok(())
    }

    fn counters(&self) -> BTreeMap<String, Counters> {
        self.counters.snapshot()
    }
}
