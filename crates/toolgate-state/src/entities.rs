//! Static entity data for Cedar policies: the roles and attributes of principals whose
//! credential does not carry them (a stdio principal, an API token created without `--attr`), from
//! an operator's file re-read like the rights file (see [`crate::watched`]: an edit takes effect
//! on the next call).
//!
//! Format (strict; docs/policy.md, "Cedar"):
//!
//! ```json
//! {"version": 1, "principals": {"alice": {"roles": ["admin"], "attributes": {"dept": "sales"}}}}
//! ```
//!
//! Principals are named by their identity key (`alice`, `acme/alice`, `ISSUER#acme/alice`), roles
//! like principal names, attribute keys 1 to 64 of `a-z`, `0-9`, `_` starting with a letter, values
//! 1 to 256 characters without control characters. Unknown and duplicate keys are refused. A
//! principal absent from the file gets nothing from it. A missing, unreadable or invalid file is
//! an error (the gate then refuses the calls Cedar decides).
//!
//! # Shared by replicas
//!
//! `toolgate_postgres::PgEntities` keeps the same document in the database every replica uses,
//! as `PgRights` keeps the rights: one row, its version read on every load (the document only
//! when the version changed), so a change through any replica's operator command (`entities
//! set`) applies to the next call of all of them. While none is set no principal gets anything
//! from it (as without an entities file). A row that is missing or invalid, or a database that
//! cannot be read, refuses the calls Cedar decides. [`MemoryEntities`] keeps a document in the
//! process (tests, servers that set entities themselves).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Deserialize;
use toolgate_canon::Sha256Digest;

use crate::GuardError;
use crate::document::{Document, DocumentStore, FileDocument, MemoryDocument, read_valid_file};
use crate::rights::UniqueMap;

/// The only entities file format version.
pub const ENTITIES_VERSION: u64 = 1;
/// An entities file larger than this is refused as invalid.
pub const MAX_ENTITIES_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// What the entities file says of one principal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrincipalEntity {
    /// The roles it is a member of.
    pub roles: BTreeSet<String>,
    /// Its attributes (tags for Cedar).
    pub attributes: BTreeMap<String, String>,
}

/// One version of the entities file, parsed.
#[derive(Debug)]
pub struct EntityDocument {
    principals: HashMap<String, PrincipalEntity>,
    digest: Sha256Digest,
}

impl EntityDocument {
    /// What the document says of `principal` (nothing for a principal it does not name).
    pub fn of(&self, principal: &str) -> Option<&PrincipalEntity> {
        self.principals.get(principal)
    }

    /// SHA-256 of the file's bytes.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// Parses an entities document (the bytes of a file).
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        parse(bytes, Sha256Digest::of(bytes))
    }

    /// No document set: no principal gets anything from it (the digest is that of no bytes).
    pub fn unset() -> Self {
        EntityDocument {
            principals: HashMap::new(),
            digest: Sha256Digest::of(b""),
        }
    }
}

impl Document for EntityDocument {
    const NAME: &'static str = "entities";
    const MAX_BYTES: u64 = MAX_ENTITIES_FILE_BYTES;
    const CANNOT_CLEAR: &'static str = "an entities file cannot be cleared (a missing file \
         refuses what Cedar decides); to give principals no roles or attributes of their own, \
         run without an entities file";

    fn parse_with_digest(bytes: &[u8], digest: Sha256Digest) -> Result<Self, String> {
        parse(bytes, digest)
    }

    fn unset() -> Self {
        EntityDocument::unset()
    }

    fn unreadable(path: PathBuf, source: std::io::Error) -> GuardError {
        GuardError::EntitiesUnreadable { path, source }
    }

    fn invalid_file(path: PathBuf, problem: String) -> GuardError {
        GuardError::EntitiesInvalid { path, problem }
    }

    fn invalid(problem: String) -> GuardError {
        GuardError::EntitiesDocumentInvalid { problem }
    }
}

/// Where the entities document lives: a file ([`FileEntities`]), the process's memory
/// ([`MemoryEntities`]) or a database every replica shares (`toolgate_postgres::PgEntities`).
/// `crates/toolgate-postgres/tests/entities_conformance.rs` runs the same cases against each.
///
/// What every store guarantees (as a [`crate::RightsStore`] does):
/// - `load` reads afresh enough that a change through another handle of the same store (another
///   process on the same file, another replica on the same database) applies to the next call;
/// - `load` fails closed: a document that cannot be read or is invalid is an error (the gate then
///   refuses what Cedar decides), and no role of an older document survives it;
/// - `replace` is durable when it returns; its document was validated by the caller
///   ([`EntitiesFile::set`]), and `None` clears the document where the store can hold "none set"
///   (no principal then gets anything from it).
pub trait EntitiesStore: DocumentStore<EntityDocument> {}

impl<T: DocumentStore<EntityDocument> + ?Sized> EntitiesStore for T {}

/// The entities file at a path, re-read as described in the [module documentation](self).
pub type FileEntities = FileDocument<EntityDocument>;

/// Entities in this process's memory: none set until one is; clones of the [`EntitiesFile`]
/// holding it share it.
pub type MemoryEntities = MemoryDocument<EntityDocument>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    version: u64,
    principals: UniqueMap<RawPrincipal>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    attributes: Option<UniqueMap<String>>,
}

fn parse(bytes: &[u8], digest: Sha256Digest) -> Result<EntityDocument, String> {
    let raw: RawDocument = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "{e} (the file is {{\"version\":1,\"principals\":{{<identity>:{{\"roles\":[...],\"attributes\":{{...}}}}}}}})"
        )
    })?;
    if raw.version != ENTITIES_VERSION {
        return Err(format!(
            "version {} is not supported; this build reads version {ENTITIES_VERSION}",
            raw.version
        ));
    }
    let mut principals = HashMap::with_capacity(raw.principals.0.len());
    for (name, entity) in raw.principals.0 {
        if !toolgate_canon::names::is_identity_key(&name) {
            return Err(format!(
                "principal {name:?} is not an identity key (`name`, `TENANT/name`, `ISSUER#TENANT/name`)"
            ));
        }
        if let Some(role) = entity
            .roles
            .iter()
            .find(|role| !toolgate_canon::names::is_principal_name(role))
        {
            return Err(format!(
                "principal {name:?}: role {role:?} is not a valid name ({})",
                toolgate_canon::names::PRINCIPAL_GRAMMAR
            ));
        }
        let attributes: BTreeMap<String, String> = entity
            .attributes
            .map(|map| map.0)
            .unwrap_or_default()
            .into_iter()
            .collect();
        for (key, value) in &attributes {
            if let Err(problem) = toolgate_canon::names::check_attribute(key, value) {
                return Err(format!("principal {name:?}: attribute {key:?}: {problem}"));
            }
        }
        principals.insert(
            name,
            PrincipalEntity {
                roles: entity.roles.into_iter().collect(),
                attributes,
            },
        );
    }
    Ok(EntityDocument { principals, digest })
}

/// The entities the gate's Cedar checks consult on every call, from an [`EntitiesStore`]: a file
/// ([`EntitiesFile::new`]), memory ([`EntitiesFile::in_memory`]) or any other store
/// ([`EntitiesFile::with_store`], e.g. a database's). Clones share the store. Thread-safe.
#[derive(Debug, Clone)]
pub struct EntitiesFile {
    store: Arc<dyn EntitiesStore>,
    /// The file's path, empty for a store without one.
    path: PathBuf,
}

impl<S: EntitiesStore + 'static> From<Arc<S>> for EntitiesFile {
    fn from(store: Arc<S>) -> Self {
        EntitiesFile::with_store(store)
    }
}

impl From<Arc<dyn EntitiesStore>> for EntitiesFile {
    fn from(store: Arc<dyn EntitiesStore>) -> Self {
        EntitiesFile::with_store(store)
    }
}

impl EntitiesFile {
    /// The entities file at `path`. Touches nothing on disk; the first call reads it.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        EntitiesFile {
            store: Arc::new(FileEntities::new(path.clone())),
            path,
        }
    }

    /// Entities in this process's memory, none set until [`EntitiesFile::set`] sets some.
    pub fn in_memory() -> Self {
        EntitiesFile::with_store(Arc::new(MemoryEntities::default()))
    }

    /// The entities of `store`.
    pub fn with_store(store: Arc<dyn EntitiesStore>) -> Self {
        EntitiesFile {
            store,
            path: PathBuf::new(),
        }
    }

    /// The file's path (empty for a store without one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The document as it is now.
    pub fn load(&self) -> Result<Arc<EntityDocument>, GuardError> {
        self.load_at(SystemTime::now())
    }

    /// The document as of `now` (the clock of the file's freshness rule). An error means the
    /// gate must refuse what Cedar decides.
    pub fn load_at(&self, now: SystemTime) -> Result<Arc<EntityDocument>, GuardError> {
        self.store.load(now)
    }

    /// Sets the entities to `document` after validating it (an invalid document changes
    /// nothing: [`GuardError::EntitiesDocumentInvalid`]), or clears them (`None`; a file cannot
    /// be cleared). Returns the digest of the document now in force.
    pub fn set(&self, document: Option<&[u8]>) -> Result<Option<Sha256Digest>, GuardError> {
        let digest = match document {
            Some(bytes) => Some(EntityDocument::validate(bytes)?.digest()),
            None => None,
        };
        self.store.replace(document.map(<[u8]>::to_vec))?;
        Ok(digest)
    }

    /// Sets the entities to the entities file at `file` (read and validated first, errors
    /// naming it), or clears them (`None`). Returns the digest of the document now in force.
    pub fn set_from_file(&self, file: Option<&Path>) -> Result<Option<Sha256Digest>, GuardError> {
        let bytes = file.map(read_valid_file::<EntityDocument>).transpose()?;
        self.set(bytes.as_deref())
    }

    /// The bytes of the document in force, `None` while none is set.
    pub fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        self.store.document()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_valid_document_names_roles_and_attributes_by_identity() {
        let document = EntityDocument::parse(
            br#"{"version": 1, "principals": {
                "alice": {"roles": ["admin", "staff"], "attributes": {"dept": "sales"}},
                "acme/bob": {"roles": ["staff"]},
                "https://idp.example#acme/carol": {}
            }}"#,
        )
        .unwrap();
        let alice = document.of("alice").unwrap();
        assert_eq!(alice.roles, ["admin".to_owned(), "staff".to_owned()].into());
        assert_eq!(alice.attributes["dept"], "sales");
        assert_eq!(document.of("acme/bob").unwrap().roles.len(), 1);
        assert!(
            document
                .of("https://idp.example#acme/carol")
                .unwrap()
                .roles
                .is_empty()
        );
        assert!(
            document.of("bob").is_none(),
            "another identity than acme/bob"
        );
    }

    #[test]
    fn invalid_documents_are_refused_naming_the_problem() {
        for (text, expected) in [
            (r#"{"version": 2, "principals": {}}"#, "version 2"),
            (r#"{"principals": {}}"#, "missing field `version`"),
            (
                r#"{"version": 1, "principals": {}, "roles": []}"#,
                "unknown field `roles`",
            ),
            (
                r#"{"version": 1, "principals": {"a b": {}}}"#,
                "not an identity key",
            ),
            (
                r#"{"version": 1, "principals": {"a": {"roles": ["x y"]}}}"#,
                "role \"x y\"",
            ),
            (
                r#"{"version": 1, "principals": {"a": {"groups": []}}}"#,
                "unknown field `groups`",
            ),
            (
                r#"{"version": 1, "principals": {"a": {}, "a": {}}}"#,
                "\"a\" appears twice",
            ),
            (
                r#"{"version": 1, "principals": {"a": {"attributes": {"k": "1", "k": "2"}}}}"#,
                "\"k\" appears twice",
            ),
            (
                r#"{"version": 1, "principals": {"a": {"attributes": {"Dept": "x"}}}}"#,
                "a key is 1 to 64",
            ),
            (
                r#"{"version": 1, "principals": {"a": {"attributes": {"dept": ""}}}}"#,
                "a value is 1 to 256",
            ),
            (
                r#"{"version": 1, "principals": {"a": {"attributes": {"dept": 7}}}}"#,
                "invalid type",
            ),
            ("not json", "expected"),
        ] {
            let problem = EntityDocument::parse(text.as_bytes()).unwrap_err();
            assert!(problem.contains(expected), "{text}: {problem}");
        }
    }

    #[test]
    fn the_file_is_reread_when_it_changes_and_an_invalid_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entities.json");
        let file = EntitiesFile::new(&path);
        assert!(matches!(
            file.load(),
            Err(GuardError::EntitiesUnreadable { .. })
        ));
        std::fs::write(
            &path,
            r#"{"version": 1, "principals": {"a": {"roles": ["x"]}}}"#,
        )
        .unwrap();
        let later = SystemTime::now() + Duration::from_secs(60);
        assert!(
            file.load_at(later)
                .unwrap()
                .of("a")
                .unwrap()
                .roles
                .contains("x")
        );
        let temporary = path.with_extension("new");
        std::fs::write(
            &temporary,
            r#"{"version": 1, "principals": {"a": {"roles": ["y"]}}}"#,
        )
        .unwrap();
        std::fs::rename(&temporary, &path).unwrap();
        assert!(
            file.load_at(later)
                .unwrap()
                .of("a")
                .unwrap()
                .roles
                .contains("y")
        );
        std::fs::write(&path, "{").unwrap();
        let error = file.load().unwrap_err();
        assert!(
            matches!(error, GuardError::EntitiesInvalid { .. })
                && error.to_string().contains("entities.json"),
            "{error}"
        );
    }
}
