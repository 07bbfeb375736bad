//! The rights document in a PostgreSQL database, shared by every replica on it: one row holding
//! a version and the document (the bytes of a rights file, or NULL while no rights are set),
//! kept as [`crate::document`] says. A missing row, an invalid document or an unreadable
//! database refuses every call.

use std::sync::Arc;
use std::time::SystemTime;

use toolgate_state::{DocumentStore, GuardError, RightsDocument};

use crate::document::{DocumentRow, VersionedDocument};
use crate::store::PgStore;

/// The rights row: its table, migrations (`toolgate_schema`, component `rights`) and messages.
static ROW: DocumentRow = DocumentRow {
    component: "rights",
    table: "toolgate_rights",
    migrations: &["CREATE TABLE toolgate_rights (
         id boolean PRIMARY KEY DEFAULT true CHECK (id),
         version bigint NOT NULL,
         document bytea
     );
     INSERT INTO toolgate_rights (id, version, document) VALUES (true, 0, NULL)"],
    read: "read the rights",
    write: "set the rights",
    set_command: "rights set",
    refuses: "every call",
};

/// The database's rights row and the last version of it this process parsed.
#[derive(Debug)]
pub struct PgRights(VersionedDocument<RightsDocument>);

impl PgRights {
    /// Creates or migrates the rights table (no rights set in a new one).
    pub fn open(store: PgStore) -> Result<Self, GuardError> {
        VersionedDocument::open(store, &ROW).map(PgRights)
    }
}

impl DocumentStore<RightsDocument> for PgRights {
    /// The rights in force now (the database's row; `now` is not needed).
    fn load(&self, _now: SystemTime) -> Result<Arc<RightsDocument>, GuardError> {
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
