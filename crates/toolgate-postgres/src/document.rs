//! One operator document in a PostgreSQL database, shared by every replica on it (the rights,
//! the Cedar entities): one row of a table of its own holding a version and the document (the
//! bytes of its file, or NULL while none is set). Every load reads the version; the document is
//! fetched and parsed again only when the version moved, so a change through any replica applies
//! to the next call of all of them. A missing row, an invalid document or an unreadable database
//! is an error (the gate refuses what the document decides), and no older version survives it.

use std::sync::{Arc, Mutex, PoisonError};

use toolgate_state::{Document, GuardError};

use crate::store::{PgError, PgStore, get, query_error};

/// Where a kind of document lives and how its messages read.
#[derive(Debug)]
pub(crate) struct DocumentRow {
    /// Its migration component in `toolgate_schema`.
    pub(crate) component: &'static str,
    /// Its table (one row).
    pub(crate) table: &'static str,
    /// Its migrations, the first creating the table with the row.
    pub(crate) migrations: &'static [&'static str],
    /// `read the rights`.
    pub(crate) read: &'static str,
    /// `set the rights`.
    pub(crate) write: &'static str,
    /// The operator command that sets it: `rights set`.
    pub(crate) set_command: &'static str,
    /// What a load that fails refuses: `every call`.
    pub(crate) refuses: &'static str,
}

/// The database's row of one kind of document and the last version of it this process parsed.
#[derive(Debug)]
pub(crate) struct VersionedDocument<D> {
    store: PgStore,
    row: &'static DocumentRow,
    cache: Mutex<Option<(i64, Arc<D>)>>,
}

impl<D: Document> VersionedDocument<D> {
    /// Creates or migrates the document's table (none set in a new one).
    pub(crate) fn open(store: PgStore, row: &'static DocumentRow) -> Result<Self, GuardError> {
        store
            .migrate(row.component, row.migrations)
            .map_err(GuardError::backend)?;
        Ok(VersionedDocument {
            store,
            row,
            cache: Mutex::new(None),
        })
    }

    /// A problem with what the database holds, as the guards report a database failure.
    fn unusable(&self, problem: &str) -> GuardError {
        GuardError::backend(PgError::Query {
            database: self.store.database().to_owned(),
            what: self.row.read,
            cause: format!(
                "{problem}; set it with the operator's `{}` (until then {} is refused)",
                self.row.set_command, self.row.refuses
            ),
        })
    }

    /// The document in force now.
    pub(crate) fn load(&self) -> Result<Arc<D>, GuardError> {
        // The cache only ever holds a whole parsed version: valid even after a panic elsewhere.
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let known = cache.as_ref().map_or(-1, |(version, _)| *version);
        let (table, read) = (self.row.table, self.row.read);
        let row = self
            .store
            .run(move |pool, database| async move {
                let client = get(&pool, &database).await?;
                let query = query_error(&database, read);
                let statement = client
                    .prepare_cached(&format!(
                        "SELECT version, CASE WHEN version = $1 THEN NULL ELSE document END,
                             document IS NULL
                         FROM {table}"
                    ))
                    .await
                    .map_err(&query)?;
                client
                    .query_opt(&statement, &[&known])
                    .await
                    .map_err(&query)
            })
            .and_then(|row| row);
        let loaded = match row {
            Err(error) => Err(GuardError::backend(error)),
            Ok(None) => Err(self.unusable(&format!("the {} row is missing", D::NAME))),
            Ok(Some(row)) => {
                let version: i64 = row.get(0);
                match (&*cache, row.get::<_, bool>(2)) {
                    (Some((cached, document)), _) if *cached == version => Ok(Arc::clone(document)),
                    (_, true) => Ok(Arc::new(D::unset())),
                    (_, false) => {
                        let bytes: Vec<u8> = row.get::<_, Option<Vec<u8>>>(1).unwrap_or_default();
                        D::parse_with_digest(&bytes, toolgate_canon::Sha256Digest::of(&bytes))
                            .map(Arc::new)
                            .map_err(|problem| {
                                self.unusable(&format!(
                                    "the {} document in the database is invalid: {problem}",
                                    D::NAME
                                ))
                            })
                    }
                }
                .map(|document| (version, document))
            }
        };
        match loaded {
            Ok((version, document)) => {
                *cache = Some((version, Arc::clone(&document)));
                Ok(document)
            }
            Err(error) => {
                // Nothing of an older version survives a broken row, as for a broken file.
                *cache = None;
                Err(error)
            }
        }
    }

    /// Replaces the document (already validated) or clears it, for every replica's next load.
    pub(crate) fn replace(&self, document: Option<Vec<u8>>) -> Result<(), GuardError> {
        let (table, write) = (self.row.table, self.row.write);
        self.store
            .run(move |pool, database| async move {
                let client = get(&pool, &database).await?;
                client
                    .execute(
                        &format!(
                            "INSERT INTO {table} (id, version, document) VALUES (true, 1, $1)
                             ON CONFLICT (id) DO UPDATE
                             SET version = {table}.version + 1, document = EXCLUDED.document"
                        ),
                        &[&document],
                    )
                    .await
                    .map_err(query_error(&database, write))
            })
            .and_then(|r| r)
            .map_err(GuardError::backend)?;
        Ok(())
    }

    /// The bytes of the document in force, `None` while none is set.
    pub(crate) fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        let (table, read) = (self.row.table, self.row.read);
        let row = self
            .store
            .run(move |pool, database| async move {
                let client = get(&pool, &database).await?;
                client
                    .query_opt(&format!("SELECT document FROM {table}"), &[])
                    .await
                    .map_err(query_error(&database, read))
            })
            .and_then(|r| r)
            .map_err(GuardError::backend)?;
        let row = row.ok_or_else(|| self.unusable(&format!("the {} row is missing", D::NAME)))?;
        Ok(row.get(0))
    }
}
