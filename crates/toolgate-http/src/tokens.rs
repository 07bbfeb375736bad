//! Static API tokens for self-hosted HTTP deployments: created by the operator, shown once,
//! stored only as their SHA-256 in `LEDGER_DIR/tokens.json`, each naming the principal it
//! authenticates and an optional expiry; listed and revoked by id. Every request checks the
//! file's identity with one `stat` and reads it again when it changed, so a revocation applies to
//! the next request.
//!
//! A token is `tgt_` followed by 64 lowercase hex characters (32 bytes from the operating
//! system's generator). Its id, the first 12 hex characters of its SHA-256, names it in lists,
//! revocations and the audit log; the token itself is never written anywhere.
//!
//! File (version 1, strict: unknown keys are refused):
//! `{"version":1,"tokens":[{"id":"…","sha256":"…","principal":"alice","tenant":"acme"?,
//! "scopes":["notes:read"]?,"created_ns":"…","expires_ns":"…"|null,"revoked_ns":"…"|null}]}`
//! (`tenant` and `scopes` only when the token has them) (times are decimal strings of nanoseconds since
//! the epoch). Changes are read-modify-write under a lock file and written through the storage
//! floor's durable replace (temporary file, fdatasync, rename, directory fsync).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use toolgate_canon::Sha256Digest;
use toolgate_storage::{FsStorage, LockFile, Storage, Symlinks};

use crate::HttpRefusal;
use toolgate_rmcp::VerifiedPrincipal;

/// The type prefix of a toolgate API token.
pub const TOKEN_PREFIX: &str = "tgt_";
/// The token file in the ledger directory.
pub const TOKENS_FILE: &str = "tokens.json";
/// The largest token file read.
const MAX_TOKENS_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// What the operator sees of a token: everything but the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenInfo {
    /// The token's public id (12 hex characters of its SHA-256).
    pub id: String,
    /// Hex SHA-256 of the token.
    sha256: String,
    /// The principal it authenticates.
    pub principal: String,
    /// The tenant of that principal, if tenants are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The scopes it is limited to; `None`: not scoped (the policy and the rights decide alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    /// The roles it carries (`--attr role=NAME`), for Cedar policies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// Its other attributes (`--attr KEY=VALUE`), for Cedar policies (the principal's tags).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// When it was created, ns since the epoch.
    #[serde(with = "ns_text")]
    pub created_ns: u64,
    /// When it stops being accepted, if ever.
    #[serde(with = "ns_text_opt")]
    pub expires_ns: Option<u64>,
    /// When it was revoked, if it was.
    #[serde(with = "ns_text_opt")]
    pub revoked_ns: Option<u64>,
}

/// What a new token is for.
#[derive(Debug, Clone, Default)]
pub struct TokenSpec {
    /// The principal it authenticates.
    pub principal: String,
    /// The principal's tenant, if tenants are used.
    pub tenant: Option<String>,
    /// The scopes to limit it to; `None` for an unscoped token.
    pub scopes: Option<Vec<String>>,
    /// How long it is accepted; `None`: until revoked.
    pub valid_for: Option<Duration>,
    /// Attributes as `(key, value)` pairs (`token create --attr KEY=VALUE`): the key `role`
    /// (repeatable) names a role, any other key (once each) an attribute; Cedar policies read
    /// them (docs/policy.md, "Cedar").
    pub attributes: Vec<(String, String)>,
}

impl TokenSpec {
    /// An unscoped token for `principal`, without tenant or expiry.
    pub fn new(principal: impl Into<String>) -> Self {
        TokenSpec {
            principal: principal.into(),
            ..TokenSpec::default()
        }
    }
}

/// A token just created: the secret (show it once) and its record.
#[derive(Clone)]
pub struct NewToken {
    /// The token to hand to the client. Not stored anywhere.
    pub token: String,
    /// Its record.
    pub info: TokenInfo,
}

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("token", &"<redacted>")
            .field("info", &self.info)
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    version: u64,
    tokens: Vec<TokenInfo>,
}

/// Why the token store could not be read or changed. Messages name the file and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The file could not be read or written.
    #[error("cannot {action} the token file {path}: {source}; check the ledger directory")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The token file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a valid token file (edited by hand?); nothing is accepted until it is.
    #[error(
        "the token file {path} is invalid: {problem}; restore it from a backup or remove it and create the tokens again"
    )]
    Invalid {
        /// The token file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// No token has this id.
    #[error("no token has the id {id:?}; `token list` shows the ids")]
    UnknownId {
        /// The id given.
        id: String,
    },
    /// The principal (or tenant) name is not a valid principal name.
    #[error(
        "invalid {what} {name:?}: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-'"
    )]
    InvalidPrincipal {
        /// `principal` or `tenant`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// A scope is not an OAuth scope token.
    #[error("invalid scope {scope:?}: a scope is {grammar}", grammar = toolgate_canon::names::SCOPE_GRAMMAR)]
    InvalidScope {
        /// The scope given.
        scope: String,
    },
    /// An attribute (`--attr KEY=VALUE`) is malformed; nothing was created.
    #[error("invalid token attribute `{key}`: {problem}; no token was created")]
    InvalidAttribute {
        /// The key given.
        key: String,
        /// What is wrong with it or its value.
        problem: String,
    },
    /// The operating system's random number generator failed; no token was created.
    #[error("cannot draw a token from the operating system's random number generator: {cause}")]
    Random {
        /// The generator's error.
        cause: String,
    },
}

/// The API tokens of one ledger directory.
#[derive(Debug, Clone)]
pub struct ApiTokens {
    dir: PathBuf,
    path: PathBuf,
    storage: Arc<dyn Storage>,
    /// The tokens last read and the file's identity then (device, inode, size, modification and
    /// change times): a request re-reads the file only when a `stat` says it changed, and every
    /// change (the durable replace renames a new file in) changes the identity.
    cache: Arc<Mutex<Cached>>,
}

/// What identifies one version of the token file (`None`: there is no file).
type FileStamp = Option<(u64, u64, u64, i64, i64, i64, i64)>;

/// The tokens last read, with the identity of the file they were read from.
type Cached = Option<(FileStamp, Arc<Vec<TokenInfo>>)>;

impl ApiTokens {
    /// The tokens of `ledger_dir` (`tokens.json`). Touches nothing on disk.
    pub fn new(ledger_dir: impl Into<PathBuf>) -> Self {
        let dir = ledger_dir.into();
        ApiTokens {
            path: dir.join(TOKENS_FILE),
            dir,
            storage: Arc::new(FsStorage),
            cache: Arc::default(),
        }
    }

    /// Writes through `storage` (tests pass a fault-injecting one).
    pub fn with_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, action: &'static str) -> impl Fn(std::io::Error) -> TokenError + '_ {
        move |source| TokenError::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }

    fn read(&self) -> Result<Vec<TokenInfo>, TokenError> {
        let bytes =
            toolgate_storage::read_regular(&self.path, MAX_TOKENS_FILE_BYTES, Symlinks::Refuse)
                .map_err(self.io("read"))?;
        let Some(bytes) = bytes else {
            return Ok(Vec::new());
        };
        let invalid = |problem: String| TokenError::Invalid {
            path: self.path.clone(),
            problem,
        };
        if bytes.len() as u64 > MAX_TOKENS_FILE_BYTES {
            return Err(invalid(format!(
                "it is larger than {MAX_TOKENS_FILE_BYTES} bytes"
            )));
        }
        let file: TokensFile =
            serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if file.version != 1 {
            return Err(invalid(format!(
                "version {} is not 1, the only version this build reads",
                file.version
            )));
        }
        Ok(file.tokens)
    }

    /// The tokens now: from the cache while the file's identity is the one they were read at.
    fn current(&self) -> Result<Arc<Vec<TokenInfo>>, TokenError> {
        use std::os::unix::fs::MetadataExt as _;
        let stamp: FileStamp = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => Some((
                meta.dev(),
                meta.ino(),
                meta.size(),
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ctime(),
                meta.ctime_nsec(),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(self.io("read")(e)),
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((cached, tokens)) = cache.as_ref()
            && *cached == stamp
        {
            return Ok(Arc::clone(tokens));
        }
        // Read after the stat: the content is never older than the identity it is kept under.
        let tokens = Arc::new(self.read()?);
        *cache = Some((stamp, Arc::clone(&tokens)));
        Ok(tokens)
    }

    /// Runs `change` on the tokens under the lock and writes the result durably.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut Vec<TokenInfo>) -> Result<T, TokenError>,
    ) -> Result<T, TokenError> {
        toolgate_storage::create_dir_durably(self.storage.as_ref(), &self.dir)
            .map_err(|e| self.io("create the directory of")(e.source))?;
        let lock =
            LockFile::open(self.dir.join(".tokens.lock")).map_err(|e| self.io("lock")(e.source))?;
        let _held = lock.lock().map_err(|e| self.io("lock")(e.source))?;
        let mut tokens = self.read()?;
        let answer = change(&mut tokens)?;
        let mut bytes = serde_json::to_vec_pretty(&TokensFile { version: 1, tokens })
            .map_err(|e| self.io("encode")(std::io::Error::other(e)))?;
        bytes.push(b'\n');
        toolgate_storage::replace_file(self.storage.as_ref(), &self.dir, TOKENS_FILE, &bytes)
            .map_err(|e| self.io("write")(e.source))?;
        Ok(answer)
    }

    /// Creates a token as `spec` says; checks every name first, so a bad one creates nothing.
    pub fn create(&self, spec: &TokenSpec, now: SystemTime) -> Result<NewToken, TokenError> {
        let names = std::iter::once(("principal", &spec.principal))
            .chain(spec.tenant.iter().map(|tenant| ("tenant", tenant)));
        for (what, name) in names {
            if !toolgate_canon::names::is_principal_name(name) {
                return Err(TokenError::InvalidPrincipal {
                    what,
                    name: name.clone(),
                });
            }
        }
        if let Some(scope) = spec
            .scopes
            .iter()
            .flatten()
            .find(|scope| !toolgate_canon::names::is_scope(scope))
        {
            return Err(TokenError::InvalidScope {
                scope: scope.clone(),
            });
        }
        let (roles, attributes) = token_attributes(&spec.attributes)?;
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| TokenError::Random {
            cause: e.to_string(),
        })?;
        let token = format!(
            "{TOKEN_PREFIX}{}",
            Sha256Digest::from_bytes(secret).to_hex()
        );
        let sha256 = Sha256Digest::of(token.as_bytes()).to_hex();
        let created_ns = ns(now);
        let info = TokenInfo {
            id: token_id(&token),
            sha256,
            principal: spec.principal.clone(),
            tenant: spec.tenant.clone(),
            scopes: spec.scopes.clone(),
            roles,
            attributes,
            created_ns,
            expires_ns: spec.valid_for.map(|d| {
                created_ns.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            }),
            revoked_ns: None,
        };
        let stored = info.clone();
        self.update(move |tokens| {
            tokens.push(stored);
            Ok(())
        })?;
        Ok(NewToken { token, info })
    }

    /// Every token, oldest first.
    pub fn list(&self) -> Result<Vec<TokenInfo>, TokenError> {
        self.read()
    }

    /// Revokes the token `id` from now on; revoking a revoked token keeps its first revocation.
    pub fn revoke(&self, id: &str, now: SystemTime) -> Result<TokenInfo, TokenError> {
        self.update(|tokens| {
            let token = tokens
                .iter_mut()
                .find(|t| t.id == id)
                .ok_or_else(|| TokenError::UnknownId { id: id.to_owned() })?;
            token.revoked_ns.get_or_insert(ns(now));
            Ok(token.clone())
        })
    }

    /// The principal `presented` authenticates at `now` (with the token's id), or why not.
    pub fn verify(
        &self,
        presented: &str,
        now: SystemTime,
    ) -> Result<(VerifiedPrincipal, String), HttpRefusal> {
        let well_formed = presented.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        if !well_formed {
            return Err(HttpRefusal::Invalid);
        }
        let tokens = self.current().map_err(|error| {
            tracing::error!(%error, "the token file is unusable; refusing every request");
            HttpRefusal::Unavailable
        })?;
        let sha256 = Sha256Digest::of(presented.as_bytes()).to_hex();
        let token = tokens
            .iter()
            .find(|t| bool::from(t.sha256.as_bytes().ct_eq(sha256.as_bytes())))
            .ok_or(HttpRefusal::Invalid)?;
        if token.revoked_ns.is_some() {
            return Err(HttpRefusal::Revoked);
        }
        if token.expires_ns.is_some_and(|at| ns(now) >= at) {
            return Err(HttpRefusal::Expired);
        }
        let mut principal =
            VerifiedPrincipal::new(&token.principal).map_err(|_| HttpRefusal::Invalid)?;
        if let Some(tenant) = &token.tenant {
            principal = principal
                .with_tenant(tenant)
                .map_err(|_| HttpRefusal::Invalid)?;
        }
        if let Some(scopes) = &token.scopes {
            principal = principal.with_scopes(scopes.iter().cloned());
        }
        let principal = principal
            .with_roles(token.roles.iter().cloned())
            .with_attributes(token.attributes.clone());
        Ok((principal.with_channel("http"), token.id.clone()))
    }
}

/// A token's roles and attributes from `--attr KEY=VALUE` pairs: `role` (repeatable) names a
/// role (a principal name); any other key, once, an attribute
/// (`toolgate_canon::names::check_attribute`).
fn token_attributes(
    pairs: &[(String, String)],
) -> Result<(Vec<String>, BTreeMap<String, String>), TokenError> {
    let invalid = |key: &str, problem: &str| TokenError::InvalidAttribute {
        key: key.to_owned(),
        problem: problem.to_owned(),
    };
    let mut roles = Vec::new();
    let mut attributes = BTreeMap::new();
    for (key, value) in pairs {
        if key == "role" {
            if !toolgate_canon::names::is_principal_name(value) {
                return Err(invalid(
                    key,
                    &format!("a role is {}", toolgate_canon::names::PRINCIPAL_GRAMMAR),
                ));
            }
            if !roles.contains(value) {
                roles.push(value.clone());
            }
            continue;
        }
        toolgate_canon::names::check_attribute(key, value)
            .map_err(|problem| invalid(key, problem))?;
        if attributes.insert(key.clone(), value.clone()).is_some() {
            return Err(invalid(key, "given twice; only `role` may repeat"));
        }
    }
    Ok((roles, attributes))
}

/// The public id of `token`: the first 12 hex characters of its SHA-256.
pub(crate) fn token_id(token: &str) -> String {
    let mut id = Sha256Digest::of(token.as_bytes()).to_hex();
    id.truncate(12);
    id
}

fn ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Nanosecond times as decimal strings (JSON numbers lose precision past 2^53).
mod ns_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

mod ns_text_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&v.to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| text.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn created_tokens_verify_until_expired_or_revoked_and_are_stored_as_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = ApiTokens::new(dir.path());
        let alice = TokenSpec {
            valid_for: Some(Duration::from_secs(60)),
            ..TokenSpec::new("alice")
        };
        let alice = tokens.create(&alice, t(0)).unwrap();
        let bob = TokenSpec {
            tenant: Some("acme".to_owned()),
            scopes: Some(vec!["notes:read".to_owned()]),
            ..TokenSpec::new("bob")
        };
        let bob = tokens.create(&bob, t(0)).unwrap();
        assert!(alice.token.starts_with(TOKEN_PREFIX));
        assert!(!format!("{alice:?}").contains(&alice.token));
        let file = std::fs::read_to_string(tokens.path()).unwrap();
        assert!(!file.contains(&alice.token) && !file.contains(&alice.token[4..]));

        let (principal, id) = tokens.verify(&alice.token, t(1)).unwrap();
        assert_eq!(
            (principal.name(), id.as_str()),
            ("alice", alice.info.id.as_str())
        );
        assert_eq!(
            tokens.verify(&alice.token, t(60)),
            Err(HttpRefusal::Expired)
        );
        let (bob_principal, _) = tokens.verify(&bob.token, t(1_000_000)).unwrap();
        assert_eq!(bob_principal.name(), "bob");
        assert_eq!(bob_principal.tenant(), Some("acme"));
        assert_eq!(bob_principal.channel(), Some("http"));
        assert!(
            bob_principal
                .scopes()
                .is_some_and(|s| s.contains("notes:read"))
        );
        assert!(principal.scopes().is_none() && principal.tenant().is_none());
        tokens.revoke(&bob.info.id, t(2)).unwrap();
        assert_eq!(tokens.verify(&bob.token, t(3)), Err(HttpRefusal::Revoked));

        let other = format!("{TOKEN_PREFIX}{}", "a".repeat(64));
        for bad in ["", "tgt_", "Bearer x", &other, &alice.token.to_uppercase()] {
            assert_eq!(tokens.verify(bad, t(1)), Err(HttpRefusal::Invalid), "{bad}");
        }
        assert_eq!(tokens.list().unwrap().len(), 2);
        assert!(matches!(
            tokens.revoke("nope", t(1)),
            Err(TokenError::UnknownId { .. })
        ));
        assert!(matches!(
            tokens.create(&TokenSpec::new("not a name"), t(1)),
            Err(TokenError::InvalidPrincipal { .. })
        ));
        let bad_tenant = TokenSpec {
            tenant: Some("a b".to_owned()),
            ..TokenSpec::new("carol")
        };
        assert!(matches!(
            tokens.create(&bad_tenant, t(1)),
            Err(TokenError::InvalidPrincipal { what: "tenant", .. })
        ));
        let bad_scope = TokenSpec {
            scopes: Some(vec!["a b".to_owned()]),
            ..TokenSpec::new("carol")
        };
        assert!(matches!(
            tokens.create(&bad_scope, t(1)),
            Err(TokenError::InvalidScope { .. })
        ));
        assert_eq!(
            tokens.list().unwrap().len(),
            2,
            "a refused spec creates nothing"
        );
    }

    #[test]
    fn a_broken_file_refuses_every_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = ApiTokens::new(dir.path());
        let alice = tokens.create(&TokenSpec::new("alice"), t(0)).unwrap();
        std::fs::write(tokens.path(), "{\"version\":1,\"tokens\":[],\"extra\":1}").unwrap();
        assert_eq!(
            tokens.verify(&alice.token, t(1)),
            Err(HttpRefusal::Unavailable)
        );
        assert!(matches!(tokens.list(), Err(TokenError::Invalid { .. })));
    }
}
