//! Rate-limit buckets in a PostgreSQL database, shared by every replica on
//! it: one row per key, taken in one transaction under the rows' locks by the same arithmetic as
//! the in-memory limiter (`toolgate_state::rates::take`), timed by the database's clock (replicas' clocks never
//! meet: one clock counts for all). A limit of N per minute therefore admits N calls across all
//! replicas together. Rows are per tool and per principal with a limit, so their number is
//! bounded by the policy.

use std::collections::HashMap;

use crate::store::{PgError, PgStore, PgToSql, get, query_error};

use toolgate_state::rates::{Bucket, Limit, Limited, RateStore};

/// The component's migrations (`toolgate_schema`, component `rates`).
const MIGRATIONS: &[&str] = &["CREATE TABLE toolgate_rate_buckets (
         key text PRIMARY KEY,
         units numeric NOT NULL CHECK (units >= 0),
         at_ns bigint NOT NULL,
         burst bigint NOT NULL,
         per_minute bigint NOT NULL
     )"];

/// The buckets of every replica on one database.
#[derive(Debug, Clone)]
pub struct PgRates {
    store: PgStore,
}

impl PgRates {
    /// The buckets in `store`; creates or migrates their table.
    pub fn open(store: PgStore) -> Result<PgRates, PgError> {
        store.migrate("rates", MIGRATIONS)?;
        Ok(PgRates { store })
    }
}

impl RateStore for PgRates {
    fn take(&self, keys: &[(String, Limit)]) -> Result<Result<(), Limited>, String> {
        take(&self.store, keys).map_err(|e| e.to_string())
    }
}

/// One column of bucket values per field, as the statements take them (`unnest`).
#[derive(Default)]
struct Columns {
    keys: Vec<String>,
    units: Vec<String>,
    at: Vec<i64>,
    burst: Vec<i64>,
    per_minute: Vec<i64>,
}

impl Columns {
    /// The five columns as the statements' `$1..$5`.
    fn params(&self) -> [&(dyn PgToSql + Sync); 5] {
        [
            &self.keys,
            &self.units,
            &self.at,
            &self.burst,
            &self.per_minute,
        ]
    }

    fn push(&mut self, key: &str, bucket: &Bucket) {
        self.keys.push(key.to_owned());
        self.units.push(bucket.units.to_string());
        self.at.push(i64::try_from(bucket.at).unwrap_or(i64::MAX));
        self.burst.push(i64::from(bucket.limit.burst));
        self.per_minute.push(i64::from(bucket.limit.per_minute));
    }
}

/// Takes one token per listing from the buckets of `keys`, or none, in one transaction.
fn take(store: &PgStore, keys: &[(String, Limit)]) -> Result<Result<(), Limited>, PgError> {
    let keys = keys.to_vec();
    store.run(move |pool, database| async move {
        let query = |what| query_error(&database, what);
        let mut client = get(&pool, &database).await?;
        let tx = client
            .transaction()
            .await
            .map_err(query("start counting a rate limit"))?;
        let micros: i64 = tx
            .query_one(
                "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::int8",
                &[],
            )
            .await
            .map_err(query("read the database's clock"))?
            .get(0);
        let now = u64::try_from(micros).unwrap_or(0).saturating_mul(1000);

        // New keys get a full bucket first, in key order (as the rows are then locked), so
        // replicas creating the same key wait for each other instead of failing or deadlocking.
        let mut fresh: Vec<(&str, Bucket)> = keys
            .iter()
            .map(|(key, limit)| (key.as_str(), Bucket::full(*limit, now)))
            .collect();
        fresh.sort_by(|a, b| a.0.cmp(b.0));
        fresh.dedup_by(|a, b| a.0 == b.0);
        let mut columns = Columns::default();
        for (key, bucket) in &fresh {
            columns.push(key, bucket);
        }
        tx.execute(
            "INSERT INTO toolgate_rate_buckets (key, units, at_ns, burst, per_minute)
             SELECT k, u::numeric, a, b, p
             FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[]) AS x(k, u, a, b, p)
             ORDER BY k
             ON CONFLICT (key) DO NOTHING",
            &columns.params(),
        )
        .await
        .map_err(query("create a rate limit bucket"))?;
        let rows = tx
            .query(
                "SELECT key, units::text, at_ns, burst, per_minute FROM toolgate_rate_buckets
                 WHERE key = ANY($1) ORDER BY key FOR UPDATE",
                &[&columns.keys],
            )
            .await
            .map_err(query("lock the rate limit buckets"))?;
        let mut buckets = HashMap::with_capacity(rows.len());
        for row in &rows {
            let key: String = row.get(0);
            let units: String = row.get(1);
            let bucket = Bucket {
                units: units.parse().map_err(|_| PgError::Query {
                    database: database.clone(),
                    what: "read a rate limit bucket",
                    cause: format!("the bucket `{key}` holds {units} units, not a whole number"),
                })?,
                at: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
                limit: Limit {
                    burst: u32::try_from(row.get::<_, i64>(3)).unwrap_or(0),
                    per_minute: u32::try_from(row.get::<_, i64>(4)).unwrap_or(0),
                },
            };
            buckets.insert(key, bucket);
        }

        let taken = toolgate_state::rates::take(&mut buckets, &keys, now);
        // Refused or not, every bucket was brought up to now and to its listed limit, as the
        // in-memory limiter keeps them.
        let mut columns = Columns::default();
        for (key, bucket) in &buckets {
            columns.push(key, bucket);
        }
        tx.execute(
            "UPDATE toolgate_rate_buckets AS b
             SET units = x.u::numeric, at_ns = x.a, burst = x.b, per_minute = x.p
             FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[]) AS x(k, u, a, b, p)
             WHERE b.key = x.k",
            &columns.params(),
        )
        .await
        .map_err(query("update the rate limit buckets"))?;
        tx.commit()
            .await
            .map_err(query("commit a rate limit count"))?;
        Ok(taken)
    })?
}
