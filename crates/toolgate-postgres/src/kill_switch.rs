//! The kill switch in a PostgreSQL database: one row (and one per halted
//! tenant, in `toolgate_tenant_halt`), shared by every
//! replica on the database, so a halt ordered through any of them (or the operator's `halt
//! --store`) refuses the next call of all of them. Reading fails closed: a database that cannot
//! be read halts, with a reason naming it.

use crate::store::{PgError, PgStore, get, query_error};

use toolgate_state::kill_switch::UNREADABLE_HALT_BY;
use toolgate_state::{GuardError, Halt, HaltStore, Status};

/// The component's migrations (`toolgate_schema`, component `control`).
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE toolgate_halt (
         id boolean PRIMARY KEY DEFAULT true CHECK (id),
         by_name text NOT NULL,
         reason text NOT NULL,
         since_ns bigint NOT NULL
     )",
    "CREATE TABLE toolgate_tenant_halt (
         tenant text PRIMARY KEY,
         by_name text NOT NULL,
         reason text NOT NULL,
         since_ns bigint NOT NULL
     )",
];

/// The halts of every replica on one database.
#[derive(Debug, Clone)]
pub struct PgHalts {
    store: PgStore,
}

impl PgHalts {
    /// The halts in `store`; creates or migrates the switch's tables.
    pub fn open(store: PgStore) -> Result<PgHalts, GuardError> {
        store
            .migrate("control", MIGRATIONS)
            .map_err(GuardError::backend)?;
        Ok(PgHalts { store })
    }
}

impl HaltStore for PgHalts {
    fn status(&self, tenant: Option<&str>, _: Option<&str>) -> Status {
        match status(&self.store, tenant) {
            Ok(None) => Status::Running,
            Ok(Some(halt)) => Status::Halted(halt),
            Err(e) => Status::Halted(Halt {
                by: UNREADABLE_HALT_BY.to_owned(),
                reason: format!(
                    "the kill switch cannot be read ({e}); every call is refused until the database answers"
                ),
                since_ns: 0,
            }),
        }
    }

    fn put(
        &self,
        tenant: Option<&str>,
        halt: &Halt,
        _: Option<&str>,
    ) -> Result<Option<Halt>, GuardError> {
        put(&self.store, tenant, halt)
    }

    fn take(&self, tenant: Option<&str>, _: Option<&str>) -> Result<Option<Halt>, GuardError> {
        take(&self.store, tenant)
    }
}

fn halt_of(row: &crate::store::PgRow) -> Halt {
    let since: i64 = row.get(2);
    Halt {
        by: row.get(0),
        reason: row.get(1),
        since_ns: u64::try_from(since).unwrap_or(0),
    }
}

/// The halt in force (of `tenant`, or of everyone), if any.
fn status(store: &PgStore, tenant: Option<&str>) -> Result<Option<Halt>, PgError> {
    let tenant = tenant.map(str::to_owned);
    store.run(|pool, database| async move {
        let client = get(&pool, &database).await?;
        let query = query_error(&database, "read the kill switch");
        let row = match &tenant {
            None => {
                let read = client
                    .prepare_cached("SELECT by_name, reason, since_ns FROM toolgate_halt")
                    .await
                    .map_err(&query)?;
                client.query_opt(&read, &[]).await.map_err(&query)?
            }
            Some(tenant) => {
                let read = client
                    .prepare_cached(
                        "SELECT by_name, reason, since_ns FROM toolgate_tenant_halt WHERE tenant = $1",
                    )
                    .await
                    .map_err(&query)?;
                client.query_opt(&read, &[tenant]).await.map_err(&query)?
            }
        };
        Ok(row.as_ref().map(halt_of))
    })?
}

/// Sets `halt` (of `tenant`, or of everyone), returning the one it replaced (read in the same
/// transaction).
fn put(store: &PgStore, tenant: Option<&str>, halt: &Halt) -> Result<Option<Halt>, GuardError> {
    let halt = halt.clone();
    let tenant = tenant.map(str::to_owned);
    let since = i64::try_from(halt.since_ns).unwrap_or(i64::MAX);
    store
        .run(move |pool, database| async move {
            let query = |what| query_error(&database, what);
            let mut client = get(&pool, &database).await?;
            let tx = client
                .transaction()
                .await
                .map_err(query("start setting the kill switch"))?;
            let previous = match &tenant {
                None => tx.query_opt(
                    "SELECT by_name, reason, since_ns FROM toolgate_halt FOR UPDATE",
                    &[],
                ).await,
                Some(tenant) => tx.query_opt(
                    "SELECT by_name, reason, since_ns FROM toolgate_tenant_halt \
                     WHERE tenant = $1 FOR UPDATE",
                    &[tenant],
                ).await,
            }
            .map_err(query("read the kill switch"))?;
            match &tenant {
                None => tx.execute(
                    "INSERT INTO toolgate_halt (id, by_name, reason, since_ns) VALUES (true, $1, $2, $3) \
                     ON CONFLICT (id) DO UPDATE SET by_name = $1, reason = $2, since_ns = $3",
                    &[&halt.by, &halt.reason, &since],
                ).await,
                Some(tenant) => tx.execute(
                    "INSERT INTO toolgate_tenant_halt (tenant, by_name, reason, since_ns) \
                     VALUES ($4, $1, $2, $3) \
                     ON CONFLICT (tenant) DO UPDATE SET by_name = $1, reason = $2, since_ns = $3",
                    &[&halt.by, &halt.reason, &since, tenant],
                ).await,
            }
            .map_err(query("set the kill switch"))?;
            tx.commit().await.map_err(query("commit the halt"))?;
            Ok(previous.as_ref().map(halt_of))
        })
        .and_then(|r| r)
        .map_err(GuardError::backend)
}

/// Lifts the halt (of `tenant`, or of everyone), returning exactly the one that was in force.
fn take(store: &PgStore, tenant: Option<&str>) -> Result<Option<Halt>, GuardError> {
    let tenant = tenant.map(str::to_owned);
    store
        .run(|pool, database| async move {
            let client = get(&pool, &database).await?;
            let row = match &tenant {
                None => {
                    client
                        .query_opt(
                            "DELETE FROM toolgate_halt RETURNING by_name, reason, since_ns",
                            &[],
                        )
                        .await
                }
                Some(tenant) => {
                    client
                        .query_opt(
                            "DELETE FROM toolgate_tenant_halt WHERE tenant = $1 \
                     RETURNING by_name, reason, since_ns",
                            &[tenant],
                        )
                        .await
                }
            }
            .map_err(query_error(&database, "lift the kill switch"))?;
            Ok(row.as_ref().map(halt_of))
        })
        .and_then(|r| r)
        .map_err(GuardError::backend)
}
