//! The rights file: which principal may call which tools, re-read so that a revocation takes
//! effect on the next call.
//!
//! Format (strict; see `docs/checks.md`):
//!
//! ```json
//! {"version":1,"principals":{"alice":{"tools":["write_note","read_ledger"]},"bob":{"tools":["*"]}}}
//! ```
//!
//! Unknown keys and duplicate keys are rejected (naming the allowed keys), `version` must be 1,
//! principals are named by their identity key (`toolgate_canon::names::identity_key`: a name of
//! 1..=128 characters of `[A-Za-z0-9_.@:-]`, with `TENANT/` before it for a principal in a tenant
//! and `ISSUER#` for one an OAuth issuer vouches for), tool names 1..=128 characters of
//! `[A-Za-z0-9_.-]` or exactly `*` (every tool). A principal absent from the file has no rights.
//!
//! # Caching
//!
//! The file is a [`crate::watched`] file: opened and `fstat`ed on every call, parsed again only
//! when it changed (with the 2-second freshness rule that catches same-size rewrites on
//! filesystems with coarse timestamps). A missing, unreadable or invalid file is an error naming
//! the path and the problem (the gate refuses the call); the cache is dropped, so no stale grant
//! survives a broken file, and the next call tries again.
//!
//! # Shared by replicas
//!
//! `toolgate_postgres::PgRights` keeps the same document in the database every replica uses: one
//! row, its version read on every call (the document only when the version changed), so a
//! revocation through any replica's operator command applies to the next call of all of them.
//! The operator sets it with [`RightsFile::set_from_file`] (validated like a file first); while
//! none is set every principal has every tool the policy allows, as without a rights file. A row
//! that is missing or invalid, or a database that cannot be read, refuses every call.
//!
//! [`MemoryRights`] keeps a document in the process (tests, and servers that set rights
//! themselves): none set until one is.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use toolgate_canon::Sha256Digest;

use crate::GuardError;
use crate::document::{Document, DocumentStore, FileDocument, MemoryDocument, read_valid_file};

pub use crate::watched::FRESHNESS_WINDOW;

/// The only rights file format version.
pub const RIGHTS_VERSION: u64 = 1;
/// Longest principal or tool name.
pub const MAX_NAME_CHARS: usize = toolgate_canon::names::MAX_NAME_BYTES;
/// The tool name that grants every tool.
pub const ALL_TOOLS: &str = "*";
/// A rights file larger than this is rejected as invalid.
pub const MAX_RIGHTS_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The tools one principal may call, as granted by one version of the rights file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    all: bool,
    tools: Arc<BTreeSet<String>>,
    file_digest: Sha256Digest,
}

impl Rights {
    /// Whether `tool` may be called.
    pub fn allows(&self, tool: &str) -> bool {
        self.all || self.tools.contains(tool)
    }

    /// Whether the principal was granted `*`.
    pub fn allows_all(&self) -> bool {
        self.all
    }

    /// Whether nothing at all is allowed (absent principal or an empty `tools` list).
    pub fn is_empty(&self) -> bool {
        !self.all && self.tools.is_empty()
    }

    /// The tools granted by name, sorted (without `*`; see [`Rights::allows_all`]).
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(String::as_str)
    }

    /// SHA-256 of the exact bytes of the rights file these rights were read from, for the audit.
    pub fn file_digest(&self) -> Sha256Digest {
        self.file_digest
    }
}

/// Where the rights document lives: a file ([`FileRights`]), the process's memory
/// ([`MemoryRights`]) or a database every replica shares (`toolgate_postgres::PgRights`).
/// `tests/rights_conformance.rs` runs the same cases against every store.
///
/// What every store guarantees:
/// - `load` reads afresh enough that a change through another handle of the same store (another
///   process on the same file, another replica on the same database) applies to the next call;
/// - `load` fails closed: a document that cannot be read or is invalid is an error (the gate then
///   refuses every call), and no grant of an older document survives it;
/// - `replace` is durable when it returns; its document was validated by the caller
///   ([`RightsFile::set`]), and `None` clears the rights where the store can hold "none set"
///   (every principal then has every tool the policy allows).
pub trait RightsStore: DocumentStore<RightsDocument> {}

impl<T: DocumentStore<RightsDocument> + ?Sized> RightsStore for T {}

/// The rights the gate consults on every call, from a [`RightsStore`]. Thread-safe.
#[derive(Debug, Clone)]
pub struct RightsFile {
    store: Arc<dyn RightsStore>,
    /// The file's path, empty for a store without one.
    path: PathBuf,
    #[cfg(test)]
    counters: Arc<crate::watched::test_counters::Counters>,
}

/// One parsed version of a rights document: who may call which tools.
#[derive(Debug)]
pub struct RightsDocument {
    digest: Sha256Digest,
    principals: HashMap<String, Rights>,
    /// No document is set (a database without rights): every principal has every tool.
    everyone: bool,
}

/// Why bytes are not a rights document: the text says what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRights(String);

impl RightsDocument {
    /// Parses a rights document (the format of the [module documentation](self)); the error
    /// says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, InvalidRights> {
        parse(bytes, Sha256Digest::of(bytes)).map_err(InvalidRights)
    }

    /// No document set: every principal has every tool the policy allows (the digest is that
    /// of no bytes).
    pub fn unset() -> Self {
        RightsDocument {
            digest: Sha256Digest::of(b""),
            principals: HashMap::new(),
            everyone: true,
        }
    }

    /// SHA-256 of the document's bytes.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// The rights of `principal`: empty when the document does not name it.
    pub fn rights_of(&self, principal: &str) -> Rights {
        self.principals
            .get(principal)
            .cloned()
            .unwrap_or_else(|| Rights {
                all: self.everyone,
                tools: Arc::default(),
                file_digest: self.digest,
            })
    }
}

/// The rights file at a path, re-read as described in the [module documentation](self).
pub type FileRights = FileDocument<RightsDocument>;

/// Rights in this process's memory: none set until one is; clones of the [`RightsFile`] holding
/// it share it.
pub type MemoryRights = MemoryDocument<RightsDocument>;

impl Document for RightsDocument {
    const NAME: &'static str = "rights";
    const MAX_BYTES: u64 = MAX_RIGHTS_FILE_BYTES;
    const CANNOT_CLEAR: &'static str = "a rights file cannot be cleared (a missing file refuses \
         every call); to let the policy alone decide, run without a rights file";

    fn parse_with_digest(bytes: &[u8], digest: Sha256Digest) -> Result<Self, String> {
        parse(bytes, digest)
    }

    fn unset() -> Self {
        RightsDocument::unset()
    }

    fn unreadable(path: PathBuf, source: std::io::Error) -> GuardError {
        GuardError::RightsUnreadable { path, source }
    }

    fn invalid_file(path: PathBuf, problem: String) -> GuardError {
        GuardError::RightsInvalid { path, problem }
    }

    fn invalid(problem: String) -> GuardError {
        GuardError::RightsDocumentInvalid { problem }
    }
}

impl RightsFile {
    /// The rights file at `path`. Touches nothing on disk; the first call reads it.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let file = FileRights::new(path.clone());
        RightsFile {
            #[cfg(test)]
            counters: Arc::clone(&file.file.counters),
            store: Arc::new(file),
            path,
        }
    }

    /// Rights in this process's memory, none set until [`RightsFile::set`] sets some (every
    /// principal has every tool the policy allows until then). Clones share them.
    pub fn in_memory() -> Self {
        RightsFile::with_store(Arc::new(MemoryRights::default()))
    }

    /// The rights of `store`.
    pub fn with_store(store: Arc<dyn RightsStore>) -> Self {
        RightsFile {
            store,
            path: PathBuf::new(),
            #[cfg(test)]
            counters: Arc::default(),
        }
    }

    /// The file's path (empty for a store without one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rights of `principal` per the current file. See [`RightsFile::rights_at`].
    pub fn rights(&self, principal: &str) -> Result<Rights, GuardError> {
        self.rights_at(principal, SystemTime::now())
    }

    /// The rights of `principal` per the file as of `now` (the clock used for the 2-second
    /// freshness rule; injectable for tests). A principal not in the file, including a name the
    /// grammar does not allow, gets empty rights. An error means the gate must refuse the call.
    pub fn rights_at(&self, principal: &str, now: SystemTime) -> Result<Rights, GuardError> {
        Ok(self.store.load(now)?.rights_of(principal))
    }

    /// SHA-256 of the current file's bytes (the same value as [`Rights::file_digest`]).
    pub fn digest(&self) -> Result<Sha256Digest, GuardError> {
        Ok(self.store.load(SystemTime::now())?.digest)
    }

    /// Sets the rights to `document` after validating it (an invalid document changes nothing),
    /// or clears them (`None`: every principal has every tool the policy allows; a file cannot
    /// be cleared). Returns the digest of the document now in force.
    pub fn set(&self, document: Option<&[u8]>) -> Result<Option<Sha256Digest>, GuardError> {
        if let Some(bytes) = document {
            RightsDocument::validate(bytes)?;
        }
        self.store.replace(document.map(<[u8]>::to_vec))?;
        Ok(document.map(Sha256Digest::of))
    }

    /// Sets the rights to the rights file at `file` (read and validated first, errors naming
    /// it), or clears them (`None`). Returns the digest of the document now in force.
    pub fn set_from_file(&self, file: Option<&Path>) -> Result<Option<Sha256Digest>, GuardError> {
        match file {
            Some(path) => self.set(Some(&read_valid_file::<RightsDocument>(path)?)),
            None => self.set(None),
        }
    }

    /// The bytes of the document in force, `None` while none is set.
    pub fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        self.store.document()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    version: u64,
    principals: UniqueMap<RawPrincipal>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    tools: Vec<String>,
}

/// A JSON object whose duplicate keys are an error (serde's maps silently keep the last one).
pub(crate) struct UniqueMap<T>(pub(crate) Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for UniqueMap<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for UniqueVisitor<T> {
            type Value = UniqueMap<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object without repeated keys")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut seen = HashSet::new();
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!(
                            "{} appears twice in one object; merge its entries into one",
                            quote_short(&key)
                        )));
                    }
                    entries.push((key, map.next_value::<T>()?));
                }
                Ok(UniqueMap(entries))
            }
        }

        deserializer.deserialize_map(UniqueVisitor(PhantomData))
    }
}

/// Parses and validates the whole file.
fn parse(bytes: &[u8], digest: Sha256Digest) -> Result<RightsDocument, String> {
    let raw: RawFile = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "{e} (the file is {{\"version\":1,\"principals\":{{<name>:{{\"tools\":[<tool>,...]}}}}}}; \
             the top-level keys are \"version\" and \"principals\", a principal's only key is \"tools\")"
        )
    })?;
    if raw.version != RIGHTS_VERSION {
        return Err(format!(
            "\"version\" is {}, but this toolgate understands only version {RIGHTS_VERSION}",
            raw.version
        ));
    }
    let mut principals = HashMap::with_capacity(raw.principals.0.len());
    for (name, entry) in raw.principals.0 {
        if !is_identity_key(&name) {
            return Err(format!(
                "principal name {} is not of the form {}",
                quote_short(&name),
                toolgate_canon::names::IDENTITY_GRAMMAR
            ));
        }
        let mut tools = BTreeSet::new();
        let mut all = false;
        for tool in entry.tools {
            if tool != ALL_TOOLS && !is_tool_name(&tool) {
                return Err(format!(
                    "tool name {} of principal {} is not \"*\" or 1 to {MAX_NAME_CHARS} characters \
                     of A-Z a-z 0-9 _ . -",
                    quote_short(&tool),
                    quote_short(&name)
                ));
            }
            let duplicate = if tool == ALL_TOOLS {
                std::mem::replace(&mut all, true)
            } else {
                !tools.insert(tool.clone())
            };
            if duplicate {
                return Err(format!(
                    "tool {} is listed twice for principal {}; list each tool once",
                    quote_short(&tool),
                    quote_short(&name)
                ));
            }
        }
        let rights = Rights {
            all,
            tools: Arc::new(tools),
            file_digest: digest,
        };
        principals.insert(name, rights);
    }
    Ok(RightsDocument {
        digest,
        principals,
        everyone: false,
    })
}

use toolgate_canon::names::{is_identity_key, is_tool_name};

/// `s` quoted for an error message, cut after 40 characters.
fn quote_short(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}…")
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::time::Duration;

    use super::*;

    const ALICE_BOB: &str = r#"{"version":1,"principals":{"alice":{"tools":["write_note","read_ledger"]},"bob":{"tools":["*"]}}}"#;

    /// Long after any write in these tests: the freshness window has passed.
    fn later() -> SystemTime {
        SystemTime::now() + Duration::from_secs(60)
    }

    /// Replaces the file atomically (new inode), as an operator's editor or deploy tool would.
    fn replace(path: &Path, content: &str) {
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, content).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    fn setup(content: &str) -> (tempfile::TempDir, RightsFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rights.json");
        fs::write(&path, content).unwrap();
        (dir, RightsFile::new(path))
    }

    fn invalid_problem(content: &str) -> String {
        let (_dir, file) = setup(content);
        match file.rights_at("alice", later()) {
            Err(GuardError::RightsInvalid { problem, .. }) => problem,
            other => panic!("expected RightsInvalid for {content}, got {other:?}"),
        }
    }

    #[test]
    fn grants_named_tools_and_wildcard() {
        let (_dir, file) = setup(ALICE_BOB);
        let alice = file.rights_at("alice", later()).unwrap();
        assert!(alice.allows("write_note"));
        assert!(alice.allows("read_ledger"));
        assert!(!alice.allows("delete_all"));
        assert!(!alice.allows("*"));
        assert!(!alice.allows_all());
        assert_eq!(
            alice.tools().collect::<Vec<_>>(),
            ["read_ledger", "write_note"]
        );
        let bob = file.rights_at("bob", later()).unwrap();
        assert!(bob.allows_all());
        assert!(bob.allows("anything"));
    }

    #[test]
    fn absent_or_ill_formed_principal_has_no_rights() {
        let (_dir, file) = setup(ALICE_BOB);
        for who in ["carol", "", "Alice", "alice ", &"a".repeat(200)] {
            let rights = file.rights_at(who, later()).unwrap();
            assert!(rights.is_empty());
            assert!(!rights.allows("write_note"));
        }
    }

    #[test]
    fn digest_is_sha256_of_the_file_bytes() {
        let (_dir, file) = setup(ALICE_BOB);
        let expected = Sha256Digest::of(ALICE_BOB.as_bytes());
        assert_eq!(file.digest().unwrap(), expected);
        assert_eq!(
            file.rights_at("alice", later()).unwrap().file_digest(),
            expected
        );
        assert_eq!(
            file.rights_at("nobody", later()).unwrap().file_digest(),
            expected
        );
    }

    #[test]
    fn revocation_takes_effect_on_the_next_call() {
        let (_dir, file) = setup(ALICE_BOB);
        assert!(
            file.rights_at("alice", later())
                .unwrap()
                .allows("write_note")
        );
        replace(
            file.path(),
            r#"{"version":1,"principals":{"alice":{"tools":["read_ledger"]}}}"#,
        );
        let alice = file.rights_at("alice", later()).unwrap();
        assert!(!alice.allows("write_note"));
        assert!(alice.allows("read_ledger"));
        assert!(file.rights_at("bob", later()).unwrap().is_empty());
    }

    #[test]
    fn unchanged_old_file_is_read_once() {
        let (_dir, file) = setup(ALICE_BOB);
        for _ in 0..5 {
            file.rights_at("alice", later()).unwrap();
        }
        assert_eq!(file.counters.get(), (1, 1));
    }

    #[test]
    fn fresh_file_is_reread_on_every_call_but_parsed_once() {
        let (_dir, file) = setup(ALICE_BOB);
        // The file was written just now: its mtime and ctime are inside the window.
        let now = SystemTime::now();
        for _ in 0..3 {
            file.rights_at("alice", now).unwrap();
        }
        assert_eq!(file.counters.get(), (3, 1));
        // Once the window has passed, the stamp is trusted.
        file.rights_at("alice", later()).unwrap();
        file.rights_at("alice", later()).unwrap();
        assert_eq!(file.counters.get(), (3, 1));
    }

    #[test]
    fn freshness_window_rule() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let stamp = |mtime: Option<u64>, ctime: Option<u64>| crate::watched::Stamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: mtime.map(|ms| now - Duration::from_millis(ms)),
            ctime: ctime.map(|ms| now - Duration::from_millis(ms)),
        };
        // Old mtime and ctime: trusted.
        assert!(!stamp(Some(2_000), Some(2_000)).is_fresh(now));
        assert!(!stamp(Some(60_000), Some(5_000)).is_fresh(now));
        // Younger than 2 s, unknown, or in the future: re-read.
        assert!(stamp(Some(1_999), Some(60_000)).is_fresh(now));
        assert!(stamp(Some(0), Some(60_000)).is_fresh(now));
        assert!(stamp(None, Some(60_000)).is_fresh(now));
        let mut future = stamp(Some(60_000), Some(60_000));
        future.mtime = Some(now + Duration::from_secs(1));
        assert!(future.is_fresh(now));
        if cfg!(unix) {
            assert!(stamp(Some(60_000), Some(1_000)).is_fresh(now));
        }
    }

    #[test]
    fn same_size_rewrite_with_unchanged_mtime_is_seen_within_the_window() {
        use std::io::{Seek as _, SeekFrom, Write as _};
        // Simulates a coarse-timestamp filesystem: the rewrite keeps size, inode and mtime.
        let (_dir, file) = setup(ALICE_BOB);
        let mtime = SystemTime::now();
        let mut f = std::fs::File::options()
            .write(true)
            .open(file.path())
            .unwrap();
        f.set_modified(mtime).unwrap();
        assert!(file.rights_at("alice", mtime).unwrap().allows("write_note"));
        let revoked = ALICE_BOB.replace("write_note", "write_nope");
        assert_eq!(revoked.len(), ALICE_BOB.len());
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(revoked.as_bytes()).unwrap();
        f.set_modified(mtime).unwrap();
        let soon = mtime + Duration::from_millis(1_500);
        assert!(!file.rights_at("alice", soon).unwrap().allows("write_note"));
    }

    #[test]
    fn missing_file_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.json");
        let file = RightsFile::new(&path);
        let err = file.rights("alice").unwrap_err();
        assert!(matches!(err, GuardError::RightsUnreadable { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("every call is refused"), "{msg}");
    }

    #[test]
    fn invalid_file_is_an_error_and_the_next_call_retries() {
        let (_dir, file) = setup(ALICE_BOB);
        assert!(
            file.rights_at("alice", later())
                .unwrap()
                .allows("write_note")
        );
        replace(file.path(), "{not json");
        let err = file.rights_at("alice", later()).unwrap_err();
        assert!(matches!(err, GuardError::RightsInvalid { .. }), "{err}");
        assert!(err.to_string().contains(&file.path().display().to_string()));
        // Still broken: still an error (the stale grant is not served).
        assert!(file.rights_at("alice", later()).is_err());
        replace(file.path(), ALICE_BOB);
        assert!(
            file.rights_at("alice", later())
                .unwrap()
                .allows("write_note")
        );
    }

    #[test]
    fn a_directory_in_place_of_the_file_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let file = RightsFile::new(dir.path());
        assert!(matches!(
            file.rights("alice"),
            Err(GuardError::RightsInvalid { .. })
        ));
    }

    #[test]
    fn unknown_keys_are_rejected_naming_the_allowed_keys() {
        let problem = invalid_problem(r#"{"version":1,"principals":{},"admins":[]}"#);
        assert!(problem.contains("unknown field `admins`"), "{problem}");
        assert!(
            problem.contains("`version`") && problem.contains("`principals`"),
            "{problem}"
        );
        let problem =
            invalid_problem(r#"{"version":1,"principals":{"alice":{"tools":[],"deny":[]}}}"#);
        assert!(problem.contains("unknown field `deny`"), "{problem}");
        assert!(problem.contains("`tools`"), "{problem}");
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let problem = invalid_problem(r#"{"version":1,"version":1,"principals":{}}"#);
        assert!(problem.contains("duplicate field `version`"), "{problem}");
        let problem = invalid_problem(
            r#"{"version":1,"principals":{"alice":{"tools":["a"]},"alice":{"tools":["*"]}}}"#,
        );
        assert!(problem.contains("\"alice\" appears twice"), "{problem}");
        let problem =
            invalid_problem(r#"{"version":1,"principals":{"alice":{"tools":[],"tools":[]}}}"#);
        assert!(problem.contains("duplicate field `tools`"), "{problem}");
        let problem =
            invalid_problem(r#"{"version":1,"principals":{"alice":{"tools":["a","a"]}}}"#);
        assert!(problem.contains("listed twice"), "{problem}");
        let problem =
            invalid_problem(r#"{"version":1,"principals":{"alice":{"tools":["*","*"]}}}"#);
        assert!(problem.contains("listed twice"), "{problem}");
    }

    #[test]
    fn version_must_be_1() {
        assert!(invalid_problem(r#"{"version":2,"principals":{}}"#).contains("only version 1"));
        assert!(invalid_problem(r#"{"principals":{}}"#).contains("missing field `version`"));
        assert!(invalid_problem(r#"{"version":"1","principals":{}}"#).contains("invalid type"));
        assert!(invalid_problem(r#"{"version":1}"#).contains("missing field `principals`"));
    }

    #[test]
    fn name_grammar_is_enforced() {
        for bad in [
            "",
            "al ice",
            "acme/alice/x",
            "#alice",
            "é",
            &"a".repeat(129),
        ] {
            let content =
                serde_json::json!({"version":1,"principals":{bad:{"tools":[]}}}).to_string();
            assert!(
                invalid_problem(&content).contains("principal name"),
                "{bad:?}"
            );
        }
        for bad in ["", "a b", "a@b", "a:b", "**", "a*", &"t".repeat(129)] {
            let content =
                serde_json::json!({"version":1,"principals":{"alice":{"tools":[bad]}}}).to_string();
            assert!(invalid_problem(&content).contains("tool name"), "{bad:?}");
        }
        let ok = serde_json::json!({"version":1,"principals":{
            "svc:deploy@example.org-1_x.y": {"tools": ["a.b-c_D9", "t".repeat(128)]},
            "p".repeat(128): {"tools": []}
        }})
        .to_string();
        let (_dir, file) = setup(&ok);
        let rights = file
            .rights_at("svc:deploy@example.org-1_x.y", later())
            .unwrap();
        assert!(rights.allows("a.b-c_D9"));
        assert!(
            file.rights_at(&"p".repeat(128), later())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        let name = "x".repeat(500);
        let content =
            serde_json::json!({"version":1,"principals":{name.clone():{"tools":[]}}}).to_string();
        let problem = invalid_problem(&content);
        assert!(!problem.contains(&name), "{problem}");
        assert!(problem.contains('…'), "{problem}");
    }

    #[test]
    fn oversized_file_is_invalid() {
        let (_dir, file) = setup(&" ".repeat(MAX_RIGHTS_FILE_BYTES as usize + 1));
        let err = file.rights_at("alice", later()).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    #[test]
    fn consistent_under_concurrent_atomic_rewrites() {
        let (_dir, file) = setup(ALICE_BOB);
        let revoked = r#"{"version":1,"principals":{"alice":{"tools":["read_ledger"]}}}"#;
        let file = Arc::new(file);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let file = Arc::clone(&file);
                std::thread::spawn(move || {
                    for _ in 0..300 {
                        // Either version, never an error or a torn read.
                        let alice = file.rights("alice").unwrap();
                        assert!(alice.allows("read_ledger"));
                    }
                })
            })
            .collect();
        for i in 0..100 {
            replace(file.path(), if i % 2 == 0 { revoked } else { ALICE_BOB });
        }
        replace(file.path(), revoked);
        for r in readers {
            r.join().unwrap();
        }
        assert!(!file.rights("alice").unwrap().allows("write_note"));
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<RightsFile>();
        check::<Rights>();
    }
}
