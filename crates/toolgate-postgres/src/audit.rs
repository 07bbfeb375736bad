//! The audit chain on PostgreSQL: one chain shared by every replica.
//!
//! Tables (component `audit`, schema version 1): `toolgate_audit (seq, sha256, line)`, one row
//! per record holding its canonical line (the exact bytes of the file format, without the
//! newline), and `toolgate_audit_head`, one row with the chain's last `seq` and `sha256`.
//!
//! **One sequencer**: the head row. An append is one statement (one round trip, one commit):
//! it seals its records onto the head this process last saw, exactly as `toolgate_audit::FileAuditLog`
//! does (same fields, same RFC 8785 line, same `prev_sha256`), and moves the head row to the new
//! head only if the row still holds the old one, inserting the records only then (a
//! compare-and-set: concurrent appenders of every replica queue on the row's lock, and the later
//! ones find the head moved, change nothing, read the head and seal again). So `seq` runs 1, 2,
//! 3... without gaps or forks, and a failed append changes nothing. **Group commit**: the
//! concurrent appenders of one process share a statement (the storage floor's
//! [`toolgate_storage::GroupCommit`]): the first becomes the leader, seals every queued entry in
//! order and commits once for all. An append returns after its statement committed with
//! `synchronous_commit` as configured (`on` by default): durable.
//! [`AuditSink::export`] writes the lines in `seq` order, one per line: the bytes of an
//! `audit.jsonl` that `audit verify` and any independent verifier accept.
//!
//! **Checkpoints** (schema version 2, `toolgate_audit_checkpoints (count, line)`): with a key
//! ([`PgAuditLog::with_checkpoints`]), the append that carries the chain past a multiple of
//! `every` records also stores, in the same statement, a signed checkpoint of its new head, in the checkpoint
//! file's line format; [`PgAuditLog::checkpoint`] signs the head on demand (at clean shutdown).
//! Whoever can write the database can rewrite the chain and its head row together, but cannot
//! sign: `toolgate_audit::verify_sink_with` with the key finds the re-chained or cut chain.

use toolgate_audit::{
    AppendReceipt, AuditEntry, AuditError, AuditSink, ChainHead, Checkpoint, MAX_LINE_BYTES,
    now_ns, seal,
};
use toolgate_canon::{HmacKey, Sha256Digest};
use toolgate_storage::GroupCommit;

use crate::store::{PgError, PgStore, cause, get, query_error};

/// The schema of component `audit`, one entry per version.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE toolgate_audit (
        seq bigint PRIMARY KEY,
        sha256 text NOT NULL,
        line text NOT NULL
    );
    CREATE TABLE toolgate_audit_head (
        id integer PRIMARY KEY CHECK (id = 1),
        seq bigint NOT NULL,
        sha256 text NOT NULL
    );
    INSERT INTO toolgate_audit_head (id, seq, sha256)
        VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');",
    "CREATE TABLE toolgate_audit_checkpoints (
        count bigint PRIMARY KEY,
        line text NOT NULL
    );",
];

/// How many rows an export reads per round trip.
const EXPORT_PAGE: i64 = 1000;

type Answer = Result<AppendReceipt, AuditError>;

/// A hash-chained audit log in a PostgreSQL database, shared by every replica that opens it.
pub struct PgAuditLog {
    store: PgStore,
    group: GroupCommit<AuditEntry, Answer>,
    /// The key that signs checkpoints, and every how many records.
    checkpoints: Option<(HmacKey, u64)>,
    /// The head this process last appended to or read: where the next append starts sealing
    /// (`None`: read it first).
    known_head: std::sync::Mutex<Option<(u64, Sha256Digest)>>,
}

impl std::fmt::Debug for PgAuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAuditLog")
            .field("database", &self.store.database())
            .finish_non_exhaustive()
    }
}

impl PgAuditLog {
    /// Opens the chain of the database `store` connects to, creating or migrating its tables.
    pub fn open(store: PgStore) -> Result<Self, AuditError> {
        store.migrate("audit", MIGRATIONS).map_err(backend)?;
        Ok(PgAuditLog {
            store,
            group: GroupCommit::new(|| {
                Err(AuditError::Backend {
                    cause: "the append batch this record was part of was abandoned (its leader \
                            panicked); nothing of it was committed"
                        .to_owned(),
                })
            }),
            checkpoints: None,
            known_head: std::sync::Mutex::new(None),
        })
    }

    /// Signs a checkpoint with `key` in the append statement that carries the chain past each
    /// multiple of `every` records (0 is treated as 1), and at [`PgAuditLog::checkpoint`]. Every
    /// replica appending to the chain should use the same key; keep it outside the database.
    pub fn with_checkpoints(mut self, key: HmacKey, every: u64) -> Self {
        self.checkpoints = Some((key, every.max(1)));
        self
    }

    /// Signs a checkpoint of the chain's head now, unless the newest stored checkpoint already
    /// covers it (or no key is set). Returns the checkpoint written.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>, AuditError> {
        let Some((key, _)) = self.checkpoints.clone() else {
            return Ok(None);
        };
        self.store
            .run(move |pool, database| async move {
                let query = |what| query_error(&database, what);
                let mut client = get(&pool, &database).await?;
                let tx = client
                    .transaction()
                    .await
                    .map_err(query("write an audit checkpoint"))?;
                let head = tx
                    .query_one(
                        "SELECT seq, sha256 FROM toolgate_audit_head WHERE id = 1 FOR UPDATE",
                        &[],
                    )
                    .await
                    .map_err(query("lock the audit chain's head"))?;
                let covered: i64 = tx
                    .query_one(
                        "SELECT coalesce(max(count), 0) FROM toolgate_audit_checkpoints",
                        &[],
                    )
                    .await
                    .map_err(query("read the newest audit checkpoint"))?
                    .get(0);
                let seq: i64 = head.get(0);
                let Ok(sha256) = head.get::<_, String>(1).parse::<Sha256Digest>() else {
                    return Ok(Err(corrupt_head()));
                };
                if seq <= covered {
                    return Ok(Ok(None));
                }
                let checkpoint = sign(&tx, &key, seq, sha256, &database).await?;
                tx.commit()
                    .await
                    .map_err(query("commit an audit checkpoint"))?;
                Ok::<_, PgError>(Ok(Some(checkpoint)))
            })
            .and_then(|r| r)
            .map_err(backend)?
    }

    /// Seals and commits one batch of entries in one statement; answers every caller.
    fn commit_batch(&self, jobs: Vec<(AuditEntry, toolgate_storage::Caller<Answer>)>) {
        let entries: Vec<AuditEntry> = jobs.iter().map(|(entry, _)| entry.clone()).collect();
        let checkpoints = self.checkpoints.clone();
        let guess = *self.known_head();
        let outcome = self
            .store
            .run(move |pool, database| async move {
                let query = |what| query_error(&database, what);
                let client = get(&pool, &database).await?;
                let append = client
                    .prepare_cached(APPEND)
                    .await
                    .map_err(query("append audit records"))?;
                let mut head = match guess {
                    Some(head) => head,
                    None => match read_head(&client, &database).await? {
                        Ok(head) => head,
                        Err(e) => return Ok(Err(e)),
                    },
                };
                for _ in 0..MAX_APPEND_TRIES {
                    let batch = Batch::seal(&entries, head, checkpoints.as_ref());
                    if batch.seqs.is_empty() {
                        return Ok(Ok((batch.answers, head)));
                    }
                    let moved: i64 = client
                        .query_one(
                            &append,
                            &[
                                &i64::try_from(head.0).unwrap_or(i64::MAX),
                                &head.1.to_hex(),
                                &i64::try_from(batch.head.0).unwrap_or(i64::MAX),
                                &batch.head.1.to_hex(),
                                &batch.seqs,
                                &batch.shas,
                                &batch.lines,
                                &batch.checkpoint,
                            ],
                        )
                        .await
                        .map_err(query("append audit records"))?
                        .get(0);
                    if moved == 1 {
                        return Ok(Ok((batch.answers, batch.head)));
                    }
                    // Another replica appended since this one last saw the head: seal again on
                    // the head as it is now.
                    head = match read_head(&client, &database).await? {
                        Ok(head) => head,
                        Err(e) => return Ok(Err(e)),
                    };
                }
                Ok::<_, PgError>(Err(AuditError::Backend {
                    cause: format!(
                        "the audit chain's head moved under {MAX_APPEND_TRIES} attempts in a row \
                         to append; nothing of this batch was committed, retry"
                    ),
                }))
            })
            .and_then(|r| r);
        let answers = match outcome {
            Ok(Ok((answers, head))) => {
                *self.known_head() = Some(head);
                Ok(answers)
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(backend(e)),
        };
        match answers {
            Ok(answers) => {
                for ((_, caller), answer) in jobs.into_iter().zip(answers) {
                    caller.answer(answer);
                }
            }
            Err(e) => {
                // The statement's outcome may be unknown: the next append reads the head first.
                *self.known_head() = None;
                for (_, caller) in jobs {
                    caller.answer(Err(e.duplicate()));
                }
            }
        }
    }

    fn known_head(&self) -> std::sync::MutexGuard<'_, Option<(u64, Sha256Digest)>> {
        // Only ever assigned whole; a guess at worst, checked by the append itself.
        self.known_head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How many times one batch is sealed again on a head that moved before the append gives up.
const MAX_APPEND_TRIES: usize = 1000;

/// One append, in one statement: the head moves from `($1, $2)` to `($3, $4)` only if it is still
/// `($1, $2)` (the row's lock orders concurrent appenders; a later one finds the head moved and
/// changes nothing), the records are inserted only if it moved, and so is the checkpoint `$8`
/// when one is due. Answers 1 when appended, 0 when the head had moved.
const APPEND: &str = "WITH moved AS (
        UPDATE toolgate_audit_head SET seq = $3, sha256 = $4
        WHERE id = 1 AND seq = $1 AND sha256 = $2
        RETURNING seq
    ), added AS (
        INSERT INTO toolgate_audit (seq, sha256, line)
        SELECT s, h, l FROM unnest($5::int8[], $6::text[], $7::text[]) AS x(s, h, l)
        WHERE EXISTS (SELECT 1 FROM moved)
        RETURNING 1
    ), signed AS (
        INSERT INTO toolgate_audit_checkpoints (count, line)
        SELECT seq, $8 FROM moved WHERE $8::text IS NOT NULL
        ON CONFLICT (count) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM moved";

/// The chain's head as stored.
async fn read_head(
    client: &crate::store::PgClient,
    database: &str,
) -> Result<Result<(u64, Sha256Digest), AuditError>, PgError> {
    let read = client
        .prepare_cached("SELECT seq, sha256 FROM toolgate_audit_head WHERE id = 1")
        .await
        .map_err(query_error(database, "read the audit chain's head"))?;
    let row = client
        .query_one(&read, &[])
        .await
        .map_err(query_error(database, "read the audit chain's head"))?;
    let seq = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
    Ok(row
        .get::<_, String>(1)
        .parse::<Sha256Digest>()
        .map(|sha256| (seq, sha256))
        .map_err(|_| corrupt_head()))
}

/// A batch sealed onto one head: the rows to insert, the head after them, each caller's answer,
/// and the checkpoint line when the batch passes a multiple of the checkpoint interval.
struct Batch {
    seqs: Vec<i64>,
    shas: Vec<String>,
    lines: Vec<String>,
    head: (u64, Sha256Digest),
    answers: Vec<Answer>,
    checkpoint: Option<String>,
}

impl Batch {
    fn seal(
        entries: &[AuditEntry],
        head: (u64, Sha256Digest),
        checkpoints: Option<&(HmacKey, u64)>,
    ) -> Self {
        let (mut seq, mut prev) = head;
        let mut batch = Batch {
            seqs: Vec::with_capacity(entries.len()),
            shas: Vec::with_capacity(entries.len()),
            lines: Vec::with_capacity(entries.len()),
            head,
            answers: Vec::with_capacity(entries.len()),
            checkpoint: None,
        };
        for entry in entries {
            let ts = now_ns();
            let sealed = seal(entry, Vec::new(), ts, seq + 1, prev);
            if sealed.line.len() > MAX_LINE_BYTES {
                batch.answers.push(Err(AuditError::RecordTooLarge {
                    len: sealed.line.len(),
                    max: MAX_LINE_BYTES,
                }));
                continue;
            }
            seq += 1;
            prev = sealed.sha256;
            batch.seqs.push(i64::try_from(seq).unwrap_or(i64::MAX));
            batch.shas.push(sealed.sha256.to_hex());
            batch.lines.push(
                String::from_utf8_lossy(sealed.line.strip_suffix(b"\n").unwrap_or(&sealed.line))
                    .into_owned(),
            );
            batch.answers.push(Ok(AppendReceipt {
                seq,
                sha256: sealed.sha256,
                ts,
            }));
        }
        batch.head = (seq, prev);
        if let Some((key, every)) = checkpoints
            && head.0 / every < seq / every
        {
            let line = Checkpoint::sign(key, seq, prev, now_ns()).line();
            batch.checkpoint = Some(
                String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(&line)).into_owned(),
            );
        }
        batch
    }
}

impl AuditSink for PgAuditLog {
    fn checkpoint(&self) -> Result<Option<Checkpoint>, AuditError> {
        PgAuditLog::checkpoint(self)
    }

    fn append(&self, entry: &AuditEntry) -> Result<AppendReceipt, AuditError> {
        self.group
            .submit(entry.clone(), |jobs, _handoff| self.commit_batch(jobs))
    }

    fn head(&self) -> Result<ChainHead, AuditError> {
        let (seq, hex) = self
            .store
            .run(|pool, database| async move {
                let client = get(&pool, &database).await?;
                let row = client
                    .query_one(
                        "SELECT seq, sha256 FROM toolgate_audit_head WHERE id = 1",
                        &[],
                    )
                    .await
                    .map_err(|e| PgError::Query {
                        database,
                        what: "read the audit chain's head",
                        cause: cause(&e),
                    })?;
                Ok::<_, PgError>((row.get::<_, i64>(0), row.get::<_, String>(1)))
            })
            .and_then(|r| r)
            .map_err(backend)?;
        let sha256 = hex
            .parse::<Sha256Digest>()
            .ok()
            .ok_or_else(|| AuditError::Backend {
                cause: format!("the audit chain's head row holds {hex:?}, not a SHA-256"),
            })?;
        Ok(ChainHead {
            seq: u64::try_from(seq).unwrap_or(0),
            sha256,
        })
    }

    fn export_checkpoints(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        let lines: Vec<String> = self
            .store
            .run(|pool, database| async move {
                let client = get(&pool, &database).await?;
                let rows = client
                    .query(
                        "SELECT line FROM toolgate_audit_checkpoints ORDER BY count",
                        &[],
                    )
                    .await
                    .map_err(query_error(&database, "read the audit checkpoints"))?;
                Ok::<_, PgError>(rows.iter().map(|row| row.get(0)).collect())
            })
            .and_then(|r| r)
            .map_err(backend)?;
        for line in &lines {
            out.write_all(line.as_bytes())
                .and_then(|()| out.write_all(b"\n"))
                .map_err(|source| AuditError::Export { source })?;
        }
        Ok(u64::try_from(lines.len()).unwrap_or(u64::MAX))
    }

    fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        let mut after: i64 = 0;
        let mut count = 0u64;
        loop {
            let page: Vec<(i64, String)> = self
                .store
                .run(move |pool, database| async move {
                    let client = get(&pool, &database).await?;
                    let rows = client
                        .query(
                            "SELECT seq, line FROM toolgate_audit WHERE seq > $1 ORDER BY seq \
                             LIMIT $2",
                            &[&after, &EXPORT_PAGE],
                        )
                        .await
                        .map_err(|e| PgError::Query {
                            database,
                            what: "read the audit chain",
                            cause: cause(&e),
                        })?;
                    Ok::<_, PgError>(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
                })
                .and_then(|r| r)
                .map_err(backend)?;
            let Some(&(last, _)) = page.last() else {
                return Ok(count);
            };
            for (_, line) in &page {
                out.write_all(line.as_bytes())
                    .and_then(|()| out.write_all(b"\n"))
                    .map_err(|source| AuditError::Export { source })?;
                count += 1;
            }
            after = last;
        }
    }
}

/// Signs `(seq, head)` and stores it in the transaction `tx`.
async fn sign(
    tx: &crate::store::PgTransaction<'_>,
    key: &HmacKey,
    seq: i64,
    head: Sha256Digest,
    database: &str,
) -> Result<Checkpoint, PgError> {
    let checkpoint = Checkpoint::sign(key, u64::try_from(seq).unwrap_or(0), head, now_ns());
    let line = checkpoint.line();
    let line = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(&line)).into_owned();
    tx.execute(
        "INSERT INTO toolgate_audit_checkpoints (count, line) VALUES ($1, $2)
         ON CONFLICT (count) DO NOTHING",
        &[&seq, &line],
    )
    .await
    .map_err(query_error(database, "write an audit checkpoint"))?;
    Ok(checkpoint)
}

fn corrupt_head() -> AuditError {
    AuditError::Backend {
        cause: "the audit chain's head row does not hold a SHA-256; the table was changed \
                outside toolgate: verify it with `audit verify`"
            .to_owned(),
    }
}

fn backend(e: PgError) -> AuditError {
    AuditError::Backend {
        cause: e.to_string(),
    }
}
