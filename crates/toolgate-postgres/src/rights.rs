//! The rights document in a PostgreSQL database, shared by every replica on
//! it: one row holding a version and the document (the bytes of a rights file, or NULL while no
//! rights are set). Every call reads the version; the document is fetched and parsed again only
//! when the version moved, so a change through any replica applies to the next call of all of
//! them. A missing row, an invalid document or an unreadable database refuses every call.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use crate::store::{PgError, PgStore, get, query_error};

use toolgate_state::{GuardError, RightsDocument, RightsStore};

/// The component's migrations (`toolgate_schema`, component `rights`).
const MIGRATIONS: &[&str] = &["CREATE TABLE toolgate_rights (
         id boolean PRIMARY KEY DEFAULT true CHECK (id),
         version bigint NOT NULL,
         document bytea
     );
     INSERT INTO toolgate_rights (id, version, document) VALUES (true, 0, NULL)"];

/// The database's rights row and the last version of it this process parsed.
#[derive(Debug)]
pub struct PgRights {
    store: PgStore,
    cache: Mutex<Option<(i64, Arc<RightsDocument>)>>,
}

/// A problem with what the database holds, as the guards report a database failure.
fn unusable(store: &PgStore, cause: String) -> GuardError {
    GuardError::backend(PgError::Query {
        database: store.database().to_owned(),
        what: "read the rights",
        cause,
    })
}

impl PgRights {
    /// Creates or migrates the rights table (no rights set in a new one).
    pub fn open(store: PgStore) -> Result<Self, GuardError> {
        store
            .migrate("rights", MIGRATIONS)
            .map_err(GuardError::backend)?;
        Ok(PgRights {
            store,
            cache: Mutex::new(None),
        })
    }
}

impl RightsStore for PgRights {
    /// The rights in force now (the database's row; `now` is not needed).
    fn load(&self, _now: SystemTime) -> Result<Arc<RightsDocument>, GuardError> {
        // The cache only ever holds a whole parsed version: valid even after a panic elsewhere.
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let known = cache.as_ref().map_or(-1, |(version, _)| *version);
        let row = self
            .store
            .run(move |pool, database| async move {
                let client = get(&pool, &database).await?;
                let query = query_error(&database, "read the rights");
                let read = client
                    .prepare_cached(
                        "SELECT version, CASE WHEN version = $1 THEN NULL ELSE document END,
                             document IS NULL
                         FROM toolgate_rights",
                    )
                    .await
                    .map_err(&query)?;
                client.query_opt(&read, &[&known]).await.map_err(&query)
            })
            .and_then(|row| row);
        let grants = match row {
            Err(error) => Err(GuardError::backend(error)),
            Ok(None) => Err(unusable(
                &self.store,
                "the rights row is missing; set the rights again with the operator's `rights set` \
                 (until then every call is refused)"
                    .to_owned(),
            )),
            Ok(Some(row)) => {
                let version: i64 = row.get(0);
                match (&*cache, row.get::<_, bool>(2)) {
                    (Some((cached, grants)), _) if *cached == version => Ok(Arc::clone(grants)),
                    (_, true) => Ok(Arc::new(RightsDocument::unset())),
                    (_, false) => {
                        let bytes: Vec<u8> = row.get::<_, Option<Vec<u8>>>(1).unwrap_or_default();
                        RightsDocument::parse(&bytes)
                            .map(Arc::new)
                            .map_err(|problem| {
                                unusable(
                                    &self.store,
                                    format!(
                                        "the rights document in the database is invalid: {problem}; set valid rights with the operator's `rights set` (until then every call is refused)"
                                    ),
                                )
                            })
                    }
                }
                .map(|grants| (version, grants))
            }
        };
        match grants {
            Ok((version, grants)) => {
                *cache = Some((version, Arc::clone(&grants)));
                Ok(grants)
            }
            Err(error) => {
                // No stale grant survives a broken row, as for a broken file.
                *cache = None;
                Err(error)
            }
        }
    }

    /// Replaces the document (already validated) or clears it, for every replica's next call.
    fn replace(&self, document: Option<Vec<u8>>) -> Result<(), GuardError> {
        self.store
            .run(move |pool, database| async move {
                let client = get(&pool, &database).await?;
                client
                    .execute(
                        "INSERT INTO toolgate_rights (id, version, document) VALUES (true, 1, $1)
                         ON CONFLICT (id) DO UPDATE
                         SET version = toolgate_rights.version + 1, document = EXCLUDED.document",
                        &[&document],
                    )
                    .await
                    .map_err(query_error(&database, "set the rights"))
            })
            .and_then(|r| r)
            .map_err(GuardError::backend)?;
        Ok(())
    }

    /// The document in force, if one is set.
    fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        let row = self
            .store
            .run(|pool, database| async move {
                let client = get(&pool, &database).await?;
                client
                    .query_opt("SELECT document FROM toolgate_rights", &[])
                    .await
                    .map_err(query_error(&database, "read the rights"))
            })
            .and_then(|r| r)
            .map_err(GuardError::backend)?;
        let row = row.ok_or_else(|| {
            unusable(
                &self.store,
                "the rights row is missing; set the rights again with the operator's `rights set`"
                    .to_owned(),
            )
        })?;
        Ok(row.get(0))
    }
}
