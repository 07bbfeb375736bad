//! The Cedar entities document in a PostgreSQL database, shared by every replica on it: one row
//! holding a version and the document (the bytes of an entities file, or NULL while none is
//! set: no principal gets roles or attributes from it), kept as [`crate::document`] says. A
//! missing row, an invalid document or an unreadable database refuses the calls Cedar decides.

use std::sync::Arc;
use std::time::SystemTime;

use toolgate_state::{DocumentStore, EntityDocument, GuardError};

use crate::document::{DocumentRow, VersionedDocument};
use crate::store::PgStore;

/// The entities row: its table, migrations (`toolgate_schema`, component `entities`) and
/// messages.
static ROW: DocumentRow = DocumentRow {
    component: "entities",
    table: "toolgate_entities",
    migrations: &["CREATE TABLE toolgate_entities (
         id boolean PRIMARY KEY DEFAULT true CHECK (id),
         version bigint NOT NULL,
         document bytea
     );
     INSERT INTO toolgate_entities (id, version, document) VALUES (true, 0, NULL)"],
    read: "read the Cedar entities",
    write: "set the Cedar entities",
    set_command: "entities set",
    refuses: "every call Cedar decides",
};

/// The database's entities row and the last version of it this process parsed.
#[derive(Debug)]
pub struct PgEntities(VersionedDocument<EntityDocument>);

impl PgEntities {
    /// Creates or migrates the entities table (none set in a new one).
    pub fn open(store: PgStore) -> Result<Self, GuardError> {
        VersionedDocument::open(store, &ROW).map(PgEntities)
    }
}

impl DocumentStore<EntityDocument> for PgEntities {
    /// The entities in force now (the database's row; `now` is not needed).
    fn load(&self, _now: SystemTime) -> Result<Arc<EntityDocument>, GuardError> {
        self.0.load()
    }

    /// Replaces the document (already validated) or clears it, for every replica's next call.
    fn replace(&self, document: Option<Vec<u8>>) -> Result<(), GuardError> {
        self.0.replace(document)
    }

    /// The document in force, if one is set.
    fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        self.0.document()
    }
}
