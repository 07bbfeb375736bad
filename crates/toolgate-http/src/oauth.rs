//! OAuth 2.1 bearer tokens (JWTs) checked as a resource server: the signature against the
//! issuer's JSON Web Key Set, `exp` and `nbf` (60 s of leeway), `iss` equal to the configured
//! issuer, and an `aud` naming this server's canonical URI (RFC 8707). The subject (a configurable
//! claim, `sub` by default) becomes the request's principal, namespaced by the issuer (its
//! authority: `ISSUER#sub`, see [`VerifiedPrincipal::key`](toolgate_rmcp::VerifiedPrincipal::key)) unless the configuration maps
//! it to a principal of this server ([`OAuthOptions::local_principals`]); a configured tenant claim
//! its tenant; `scope` (space-separated) or `scp` its scopes.
//!
//! Only asymmetric algorithms are accepted (RS256/384/512, PS256/384/512, ES256/384, EdDSA), each
//! only with a key of its own type and curve, and only when the key's `alg` (if the JWKS gives one)
//! is the token's: `alg: none`, an HMAC token keyed with a published public key, or a token naming
//! a key that is not in the set are refused. Keys of the set that are not signature keys are
//! dropped: symmetric (`oct`) keys, keys whose `use` is not `sig`, whose `key_ops` lack `verify`,
//! whose `alg` is not a signing algorithm of their type (`RSA-OAEP`), RSA keys under 2048 bits,
//! and keys that do not parse (one bad key does not cost the others). A token's `typ`, when
//! present, must be `at+jwt` (RFC 9068) or `JWT`; [`OAuthOptions::require_at_jwt`] accepts
//! `at+jwt` only.
//!
//! The key set is fetched lazily (on the first token), kept, fetched again when it is older than
//! [`OAuthOptions::refresh_after`] or when a token names a key it does not hold (the issuer
//! rotated). One fetch at a time: requests that need the set while it is being fetched wait for
//! that fetch and take its outcome, so a hanging issuer costs each of them one
//! [`OAuthOptions::fetch_timeout`] at most. After a fetch ends (whatever its outcome) no other
//! starts for [`OAuthOptions::refetch_cooldown`]; meanwhile requests are answered from the keys
//! known at once, so tokens naming random keys cannot make the server hammer the issuer, nor wait
//! on it. A failed fetch keeps the keys it had; with no keys at all the request is answered 503
//! `jwks_unavailable` (the server cannot judge it), with the issuer and what failed in the audit
//! reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde_json::{Map, Value};

use crate::HttpRefusal;
use toolgate_rmcp::VerifiedPrincipal;

/// The largest key set read, in bytes.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// How long a key set fetch may take by default.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The smallest RSA modulus accepted, in bits.
const MIN_RSA_BITS: usize = 2048;
/// The clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 60;

/// How the OAuth resource server is configured.
#[derive(Debug, Clone)]
pub struct OAuthOptions {
    /// The authorization server's issuer identifier; a token's `iss` must equal it.
    pub issuer: String,
    /// Where the issuer publishes its JSON Web Key Set (`https://…`; `http://` only on loopback).
    pub jwks_url: String,
    /// The audience a token must name: this server's canonical URI.
    pub audience: String,
    /// The claim naming the principal (`sub` by default).
    pub principal_claim: String,
    /// The claim naming the tenant, when tenants are used; a token without it is refused.
    pub tenant_claim: Option<String>,
    /// The claim naming the caller's roles for Cedar policies (`principal in
    /// Toolgate::Role::"NAME"`): a string (space-separated names) or an array of strings; role
    /// names that are not principal names are ignored. `None` (the default): no roles.
    pub roles_claim: Option<String>,
    /// Claims given to Cedar policies as the principal's tags (`principal.getTag("dept")`):
    /// string claims only (numbers and booleans as their JSON text; others are left out).
    pub attribute_claims: Vec<String>,
    /// A key set older than this is fetched again on the next token (5 minutes by default).
    pub refresh_after: Duration,
    /// The shortest time from the end of one fetch (successful or not) to the start of the next
    /// (10 s by default); meanwhile requests are answered from the keys known, at once.
    pub refetch_cooldown: Duration,
    /// How long one fetch of the key set may take, connection to last byte (10 s by default).
    pub fetch_timeout: Duration,
    /// Accept only tokens whose header says `typ: at+jwt` (RFC 9068), for issuers that set it;
    /// off by default, since many issuers send `JWT` or nothing (a `typ` other than `at+jwt`
    /// and `JWT` is refused all the same).
    pub require_at_jwt: bool,
    /// Subjects of this issuer that are principals of this server (subject → local principal
    /// name): a token of such a subject is that principal, with its policy section, rights,
    /// rate bucket and exactly-once records. Every other subject is the issuer's own
    /// (`ISSUER#subject`), never equal to a principal of this server.
    pub local_principals: BTreeMap<String, String>,
}

/// An OAuth configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthError {
    /// The key set URL is not https (or http on a loopback host), or does not parse.
    #[error(
        "the JWKS URL {url:?} is not usable: {problem}; give the issuer's https:// jwks_uri (http:// only for a loopback host)"
    )]
    JwksUrl {
        /// The URL given.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// The issuer or the audience is empty.
    #[error("the OAuth {what} is empty; give the {what} the tokens carry")]
    Empty {
        /// `issuer` or `audience`.
        what: &'static str,
    },
    /// The issuer cannot name an authority (1 to 256 printable ASCII characters without `#`).
    #[error(
        "the OAuth issuer {issuer:?} is not usable: an issuer identifier is 1 to 256 printable ASCII characters without '#' (RFC 8414: no fragment); give the issuer's `iss` value"
    )]
    Issuer {
        /// The issuer given.
        issuer: String,
    },
    /// A mapping of a subject to a local principal names something that is not a principal name.
    #[error(
        "the mapping of OAuth subject {subject:?} to local principal {principal:?} is not usable: both must be 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-'"
    )]
    LocalPrincipal {
        /// The subject.
        subject: String,
        /// The local principal.
        principal: String,
    },
    /// The HTTPS client could not be built.
    #[error("cannot build the HTTPS client that fetches the JWKS: {cause}")]
    Client {
        /// The cause.
        cause: String,
    },
}

impl OAuthOptions {
    /// Tokens of `issuer`, signed with the keys at `jwks_url`, for the audience `audience`.
    pub fn new(
        issuer: impl Into<String>,
        jwks_url: impl Into<String>,
        audience: impl Into<String>,
    ) -> Self {
        OAuthOptions {
            issuer: issuer.into(),
            jwks_url: jwks_url.into(),
            audience: audience.into(),
            principal_claim: "sub".to_owned(),
            tenant_claim: None,
            roles_claim: None,
            attribute_claims: Vec::new(),
            refresh_after: Duration::from_secs(300),
            refetch_cooldown: Duration::from_secs(10),
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            require_at_jwt: false,
            local_principals: BTreeMap::new(),
        }
    }
}

/// One key of the set, ready to verify.
struct Key {
    decoding: DecodingKey,
    /// The algorithms this key may verify (its type and curve, narrowed by its `alg`).
    algorithms: Vec<Algorithm>,
}

#[derive(Default)]
struct KeySet {
    keys: HashMap<String, Arc<Key>>,
    /// When the last fetch ended (successful or not).
    tried: Option<Instant>,
    /// When the keys were last fetched successfully.
    fetched: Option<Instant>,
    /// Why the last fetch failed, when it did.
    failure: Option<FetchFailure>,
    /// How many fetches have ended: a request that waited for the fetch in flight sees it change
    /// and takes that fetch's outcome instead of starting another.
    generation: u64,
}

/// Why a fetch of the key set failed, in the server's words (never the issuer's response text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FetchFailure {
    /// No complete answer within the fetch timeout (a hanging or trickling issuer).
    Timeout(Duration),
    /// No connection, or the connection broke.
    Connection,
    /// A redirect (not followed: the key set must be at the configured URL).
    Redirect(u16),
    /// Another status than 200.
    Status(u16),
    /// More than the size limit.
    TooLarge,
    /// Not JSON, or JSON without a `keys` array.
    NotJwks,
}

impl std::fmt::Display for FetchFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchFailure::Timeout(limit) => {
                write!(f, "no complete answer within {} s", limit.as_secs_f64())
            }
            FetchFailure::Connection => f.write_str("the connection failed"),
            FetchFailure::Redirect(status) => {
                write!(f, "a redirect (HTTP {status}), which is not followed")
            }
            FetchFailure::Status(status) => write!(f, "HTTP {status}"),
            FetchFailure::TooLarge => write!(f, "larger than {MAX_JWKS_BYTES} bytes"),
            FetchFailure::NotJwks => f.write_str("not a JSON Web Key Set"),
        }
    }
}

/// A refused token: the code, and for the audit line what the server knows besides (the issuer
/// and what failed, for `jwks_unavailable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The refusal (its code is the answer's `error`).
    pub refusal: HttpRefusal,
    /// The audit reason's detail after the code, when there is one; never token content.
    pub detail: Option<String>,
}

impl From<HttpRefusal> for Rejection {
    fn from(refusal: HttpRefusal) -> Self {
        Rejection {
            refusal,
            detail: None,
        }
    }
}

impl Rejection {
    /// The audit reason: the code, then the detail.
    pub fn reason(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{}: {detail}", self.refusal.code()),
            None => self.refusal.code().to_owned(),
        }
    }
}

/// Verifies OAuth bearer tokens; cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct JwtVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    options: OAuthOptions,
    client: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    /// One fetch at a time; a request that waited finds the keys the other fetched.
    fetching: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// A verifier for `options`; checks the URL, fetches nothing yet.
    pub fn new(options: OAuthOptions) -> Result<Self, OAuthError> {
        if options.issuer.is_empty() {
            return Err(OAuthError::Empty { what: "issuer" });
        }
        if options.audience.is_empty() {
            return Err(OAuthError::Empty { what: "audience" });
        }
        if !toolgate_canon::names::is_authority(&options.issuer) {
            return Err(OAuthError::Issuer {
                issuer: options.issuer.clone(),
            });
        }
        for (subject, principal) in &options.local_principals {
            if !toolgate_canon::names::is_principal_name(subject)
                || !toolgate_canon::names::is_principal_name(principal)
            {
                return Err(OAuthError::LocalPrincipal {
                    subject: subject.clone(),
                    principal: principal.clone(),
                });
            }
        }
        check_jwks_url(&options.jwks_url)?;
        // rustls on ring, the provider every TLS user in this process shares.
        let _already = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(options.fetch_timeout)
            .connect_timeout(options.fetch_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| OAuthError::Client {
                cause: e.to_string(),
            })?;
        Ok(JwtVerifier {
            inner: Arc::new(Inner {
                options,
                client,
                keys: RwLock::new(Arc::new(KeySet::default())),
                fetching: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The options.
    pub fn options(&self) -> &OAuthOptions {
        &self.inner.options
    }

    /// The principal `token` proves, or why it proves nothing.
    pub async fn verify(&self, token: &str) -> Result<VerifiedPrincipal, Rejection> {
        let header = Header::of(token)?;
        if !header.typ_accepted(self.inner.options.require_at_jwt) {
            return Err(HttpRefusal::TokenType.into());
        }
        let key = self.key(&header.kid).await?;
        if !key.algorithms.contains(&header.alg) {
            return Err(HttpRefusal::Algorithm.into());
        }
        let options = &self.inner.options;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&options.issuer]);
        validation.set_audience(&[&options.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(|e| refusal_of(e.kind()))?
            .claims;
        Ok(principal_of(&claims, options)?)
    }

    /// The key `kid`, fetching the set when it is missing or stale (one fetch at a time; none
    /// during the cooldown after the last one).
    async fn key(&self, kid: &str) -> Result<Arc<Key>, Rejection> {
        let options = &self.inner.options;
        let fresh = |set: &KeySet| {
            set.fetched
                .is_some_and(|at| at.elapsed() < options.refresh_after)
        };
        let cooling = |set: &KeySet| {
            set.tried
                .is_some_and(|at| at.elapsed() < options.refetch_cooldown)
        };
        let current = self.snapshot();
        if (fresh(&current) && current.keys.contains_key(kid)) || cooling(&current) {
            return self.answer(&current, kid);
        }
        let seen = current.generation;
        let _one_fetch = match self.inner.fetching.try_lock() {
            Ok(guard) => guard,
            // A fetch is under way: a key already known serves meanwhile (the set is only
            // stale); a request for a key not known waits for that fetch's outcome.
            Err(_) if current.keys.contains_key(kid) => return self.answer(&current, kid),
            Err(_) => self.inner.fetching.lock().await,
        };
        let current = self.snapshot();
        // A fetch ended while this request waited: its outcome is this request's too.
        if current.generation != seen || cooling(&current) {
            return self.answer(&current, kid);
        }
        let current = self.refresh(&current).await;
        self.answer(&current, kid)
    }

    /// What `set` says of `kid`.
    fn answer(&self, set: &KeySet, kid: &str) -> Result<Arc<Key>, Rejection> {
        let options = &self.inner.options;
        match set.keys.get(kid) {
            Some(key) => Ok(Arc::clone(key)),
            None if set.fetched.is_none() => Err(Rejection {
                refusal: HttpRefusal::KeysUnavailable,
                detail: Some(match set.failure {
                    Some(failure) => format!(
                        "the key set of issuer {} could not be fetched ({failure}); no key is known yet, and no fetch starts within {} s of the last",
                        options.issuer,
                        options.refetch_cooldown.as_secs()
                    ),
                    None => format!(
                        "the key set of issuer {} has not been fetched yet",
                        options.issuer
                    ),
                }),
            }),
            None => Err(HttpRefusal::UnknownKey.into()),
        }
    }

    /// Fetches the set (within the fetch timeout); on failure keeps `previous`'s keys (and says
    /// so in the log).
    async fn refresh(&self, previous: &KeySet) -> Arc<KeySet> {
        let options = &self.inner.options;
        let fetched = match tokio::time::timeout(options.fetch_timeout, self.fetch()).await {
            Ok(fetched) => fetched,
            Err(_) => Err(FetchFailure::Timeout(options.fetch_timeout)),
        };
        // The cooldown runs from the end of the fetch: a fetch that hung for the whole timeout
        // does not let the next request start another at once.
        let now = Instant::now();
        let next = match fetched {
            Ok(keys) => KeySet {
                keys,
                tried: Some(now),
                fetched: Some(now),
                failure: None,
                generation: previous.generation + 1,
            },
            Err(failure) => {
                tracing::warn!(issuer = %options.issuer, url = %options.jwks_url, %failure, "cannot fetch the JWKS; keeping the keys already known");
                KeySet {
                    keys: previous.keys.clone(),
                    tried: Some(now),
                    fetched: previous.fetched,
                    failure: Some(failure),
                    generation: previous.generation + 1,
                }
            }
        };
        let next = Arc::new(next);
        *self
            .inner
            .keys
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::clone(&next);
        next
    }

    fn snapshot(&self) -> Arc<KeySet> {
        Arc::clone(
            &self
                .inner
                .keys
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    async fn fetch(&self) -> Result<HashMap<String, Arc<Key>>, FetchFailure> {
        let timeout = self.inner.options.fetch_timeout;
        let failure = |e: reqwest::Error| {
            tracing::debug!(error = %e, "JWKS fetch");
            if e.is_timeout() {
                FetchFailure::Timeout(timeout)
            } else {
                FetchFailure::Connection
            }
        };
        let mut response = self
            .inner
            .client
            .get(&self.inner.options.jwks_url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(failure)?;
        let status = response.status();
        if status.is_redirection() {
            return Err(FetchFailure::Redirect(status.as_u16()));
        }
        if status != reqwest::StatusCode::OK {
            return Err(FetchFailure::Status(status.as_u16()));
        }
        if response
            .content_length()
            .is_some_and(|length| length > MAX_JWKS_BYTES as u64)
        {
            return Err(FetchFailure::TooLarge);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failure)? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(FetchFailure::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        let set: Value = serde_json::from_slice(&body).map_err(|_| FetchFailure::NotJwks)?;
        let keys = set
            .get("keys")
            .and_then(Value::as_array)
            .ok_or(FetchFailure::NotJwks)?;
        Ok(keys
            .iter()
            .filter_map(|raw| usable(raw).map(|(kid, key)| (kid, Arc::new(key))))
            .collect())
    }
}

/// A key of the set usable for signatures, with its id and the algorithms it may verify; `None`
/// for keys without an id, symmetric keys, keys not meant for signatures (`use` other than `sig`,
/// `key_ops` without `verify`, an `alg` that is not a signing algorithm of the key's type), RSA
/// keys under [`MIN_RSA_BITS`] and keys that do not parse.
fn usable(raw: &Value) -> Option<(String, Key)> {
    let kid = raw.get("kid")?.as_str()?.to_owned();
    match raw.get("use") {
        None => {}
        Some(Value::String(purpose)) if purpose == "sig" => {}
        Some(_) => return None,
    }
    if let Some(ops) = raw.get("key_ops")
        && !ops
            .as_array()
            .is_some_and(|ops| ops.iter().any(|op| op == "verify"))
    {
        return None;
    }
    let declared = match raw.get("alg") {
        None => None,
        Some(Value::String(alg)) => Some(alg.as_str()),
        Some(_) => return None,
    };
    let jwk: Jwk = serde_json::from_value(raw.clone()).ok()?;
    let family: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            if rsa_bits(&rsa.n)? < MIN_RSA_BITS {
                return None;
            }
            &[
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ]
        }
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => &[Algorithm::EdDSA],
            _ => return None,
        },
        // A symmetric key never verifies anything here: accepting one is how HMAC confusion starts.
        AlgorithmParameters::OctetKey(_) => return None,
    };
    // A declared `alg` narrows the key to it, and must be one of the family's signing
    // algorithms: an encryption algorithm (`RSA-OAEP`) or another type's drops the key.
    let algorithms = match declared {
        Some(alg) => {
            let alg = alg.parse::<Algorithm>().ok()?;
            if !family.contains(&alg) {
                return None;
            }
            vec![alg]
        }
        None => family.to_vec(),
    };
    let decoding = DecodingKey::from_jwk(&jwk).ok()?;
    Some((
        kid,
        Key {
            decoding,
            algorithms,
        },
    ))
}

/// The size in bits of the RSA modulus `n` (base64url, big-endian), or `None` if it does not
/// decode.
fn rsa_bits(n: &str) -> Option<usize> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(n.trim_end_matches('='))
        .ok()?;
    let first = bytes.iter().position(|&b| b != 0)?;
    let significant = &bytes[first..];
    Some(significant.len() * 8 - significant[0].leading_zeros() as usize)
}

/// What the token's header says, checked before any key is looked at.
struct Header {
    alg: Algorithm,
    kid: String,
    /// The `typ` header, when present.
    typ: Option<String>,
}

impl Header {
    fn of(token: &str) -> Result<Self, HttpRefusal> {
        use base64::Engine as _;
        let mut parts = token.split('.');
        let (Some(header), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(HttpRefusal::Invalid);
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| HttpRefusal::Invalid)?;
        let header: Map<String, Value> =
            serde_json::from_slice(&bytes).map_err(|_| HttpRefusal::Invalid)?;
        let alg = match header.get("alg").and_then(Value::as_str) {
            Some(
                name @ ("RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512" | "ES256"
                | "ES384" | "EdDSA"),
            ) => name
                .parse::<Algorithm>()
                .map_err(|_| HttpRefusal::Algorithm)?,
            // `none`, the HMAC family and anything unknown.
            _ => return Err(HttpRefusal::Algorithm),
        };
        let kid = header
            .get("kid")
            .and_then(Value::as_str)
            .ok_or(HttpRefusal::UnknownKey)?;
        let typ = match header.get("typ") {
            None => None,
            Some(Value::String(typ)) => Some(typ.clone()),
            Some(_) => return Err(HttpRefusal::TokenType),
        };
        Ok(Header {
            alg,
            kid: kid.to_owned(),
            typ,
        })
    }

    /// Whether the `typ` says this is an access token (RFC 9068: `at+jwt`, or its media type
    /// `application/at+jwt`) or, unless `at_jwt_only`, a plain `JWT` or nothing. Any other type
    /// (a logout token's, a DPoP proof's, an ID token's where issuers type them) is another kind
    /// of JWT.
    fn typ_accepted(&self, at_jwt_only: bool) -> bool {
        match self.typ.as_deref() {
            Some(typ)
                if typ.eq_ignore_ascii_case("at+jwt")
                    || typ.eq_ignore_ascii_case("application/at+jwt") =>
            {
                true
            }
            Some(typ) if typ.eq_ignore_ascii_case("jwt") => !at_jwt_only,
            None => !at_jwt_only,
            Some(_) => false,
        }
    }
}

fn refusal_of(kind: &ErrorKind) -> HttpRefusal {
    match kind {
        ErrorKind::ExpiredSignature => HttpRefusal::Expired,
        ErrorKind::ImmatureSignature => HttpRefusal::NotYetValid,
        ErrorKind::InvalidIssuer => HttpRefusal::WrongIssuer,
        ErrorKind::InvalidAudience => HttpRefusal::WrongAudience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => HttpRefusal::WrongAudience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => HttpRefusal::WrongIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => HttpRefusal::Algorithm,
        _ => HttpRefusal::Invalid,
    }
}

/// The principal, tenant and scopes of verified claims.
fn principal_of(
    claims: &Map<String, Value>,
    options: &OAuthOptions,
) -> Result<VerifiedPrincipal, HttpRefusal> {
    let subject = claims
        .get(&options.principal_claim)
        .and_then(Value::as_str)
        .ok_or(HttpRefusal::InvalidSubject)?;
    // The issuer's subject is the issuer's principal, unless the operator made it one of this
    // server's.
    let mut principal = match options.local_principals.get(subject) {
        Some(local) => VerifiedPrincipal::new(local),
        None => VerifiedPrincipal::new(subject)
            .and_then(|principal| principal.with_authority(&options.issuer)),
    }
    .map_err(|_| HttpRefusal::InvalidSubject)?;
    if let Some(claim) = &options.tenant_claim {
        let tenant = claims
            .get(claim)
            .and_then(Value::as_str)
            .ok_or(HttpRefusal::InvalidSubject)?;
        principal = principal
            .with_tenant(tenant)
            .map_err(|_| HttpRefusal::InvalidSubject)?;
    }
    let mut scopes = BTreeSet::new();
    for claim in ["scope", "scp"] {
        match claims.get(claim) {
            Some(Value::String(list)) => {
                scopes.extend(list.split_ascii_whitespace().map(str::to_owned));
            }
            Some(Value::Array(list)) => {
                scopes.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            _ => {}
        }
    }
    let mut roles = BTreeSet::new();
    if let Some(claim) = &options.roles_claim {
        let names: Vec<&str> = match claims.get(claim) {
            Some(Value::String(list)) => list.split_ascii_whitespace().collect(),
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        roles.extend(
            names
                .into_iter()
                .filter(|name| toolgate_canon::names::is_principal_name(name))
                .map(str::to_owned),
        );
    }
    let attributes = options.attribute_claims.iter().filter_map(|claim| {
        let value = match claims.get(claim)? {
            Value::String(text) => text.clone(),
            value @ (Value::Number(_) | Value::Bool(_)) => value.to_string(),
            _ => return None,
        };
        Some((claim.clone(), value))
    });
    Ok(principal
        .with_scopes(scopes)
        .with_roles(roles)
        .with_attributes(attributes.collect::<Vec<_>>())
        .with_channel("http"))
}

fn check_jwks_url(url: &str) -> Result<(), OAuthError> {
    let problem = |problem: &str| OAuthError::JwksUrl {
        url: url.to_owned(),
        problem: problem.to_owned(),
    };
    let parsed: axum::http::Uri = url.parse().map_err(|_| problem("it does not parse"))?;
    let host = parsed.host().ok_or_else(|| problem("it names no host"))?;
    match parsed.scheme_str() {
        Some("https") => Ok(()),
        Some("http") if is_loopback(host) => Ok(()),
        Some("http") => Err(problem(
            "plain http to a non-loopback host lets anyone on the path replace the keys",
        )),
        _ => Err(problem("the scheme must be https")),
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_urls_must_be_https_or_loopback() {
        assert!(check_jwks_url("https://issuer.example/jwks").is_ok());
        assert!(check_jwks_url("http://127.0.0.1:9/jwks").is_ok());
        assert!(check_jwks_url("http://[::1]:9/jwks").is_ok());
        assert!(check_jwks_url("http://localhost/jwks").is_ok());
        for bad in [
            "http://issuer.example/jwks",
            "ftp://x/y",
            "not a url",
            "/jwks",
        ] {
            assert!(check_jwks_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers_refuse_none_hmac_and_missing_kids() {
        use base64::Engine as _;
        let token = |header: &str| {
            format!(
                "{}.e30.c2ln",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header)
            )
        };
        let refused = |header: &str| Header::of(&token(header)).err();
        assert_eq!(
            refused(r#"{"alg":"none","kid":"k"}"#),
            Some(HttpRefusal::Algorithm)
        );
        assert_eq!(
            refused(r#"{"alg":"HS256","kid":"k"}"#),
            Some(HttpRefusal::Algorithm)
        );
        assert_eq!(refused(r#"{"kid":"k"}"#), Some(HttpRefusal::Algorithm));
        assert_eq!(refused(r#"{"alg":"RS256"}"#), Some(HttpRefusal::UnknownKey));
        assert_eq!(refused("not json"), Some(HttpRefusal::Invalid));
        assert!(Header::of(&token(r#"{"alg":"EdDSA","kid":"k"}"#)).is_ok());
        assert_eq!(Header::of("a.b").err(), Some(HttpRefusal::Invalid));
        assert_eq!(Header::of("a.b.c.d").err(), Some(HttpRefusal::Invalid));
    }

    fn fixture(bits: u32) -> Value {
        let path = format!(
            "{}/../../fixtures/oauth/TEST-ONLY-rsa-{bits}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn requests_waiting_for_a_hanging_fetch_take_its_outcome() {
        use base64::Engine as _;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let url = format!(
            "http://{}/jwks",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        std::thread::spawn(move || {
            // Connections are held, never answered.
            let mut held = Vec::new();
            for stream in listener.incoming() {
                counter.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        let mut options = OAuthOptions::new("https://i.example", url, "aud");
        options.fetch_timeout = Duration::from_secs(1);
        // No cooldown at all: only the one-fetch-at-a-time rule keeps the waiters from fetching.
        options.refetch_cooldown = Duration::ZERO;
        let verifier = JwtVerifier::new(options).unwrap_or_else(|e| panic!("{e}"));
        let token = format!(
            "{}.e30.c2ln",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k"}"#)
        );
        // The test's runtime has one thread: all ten requests reach the key set (one fetching,
        // nine waiting) before the runtime looks at the network or the clock again.
        let waiting: Vec<_> = (0..10)
            .map(|_| {
                let (verifier, token) = (verifier.clone(), token.clone());
                tokio::spawn(async move { verifier.verify(&token).await })
            })
            .collect();
        for request in waiting {
            let answer = request.await.unwrap_or_else(|e| panic!("{e}"));
            let rejection = answer.err().unwrap_or_else(|| panic!("no key is known"));
            assert_eq!(rejection.refusal, HttpRefusal::KeysUnavailable);
            assert!(
                rejection.reason().contains("no complete answer within 1 s"),
                "{}",
                rejection.reason()
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one fetch for ten requests"
        );
    }

    #[tokio::test]
    async fn known_keys_serve_while_a_refresh_hangs() {
        use base64::Engine as _;
        use ring::signature::KeyPair as _;
        use std::io::{BufRead as _, Write as _};

        let pkcs8 =
            ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
                .unwrap_or_else(|e| panic!("{e}"));
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
            .unwrap_or_else(|e| panic!("{e}"));
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let set = serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k",
            "x": b64.encode(pair.public_key().as_ref())}]})
        .to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let url = format!(
            "http://{}/jwks",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        std::thread::spawn(move || {
            // The first fetch gets the set; every later one hangs.
            let mut held = Vec::new();
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { continue };
                if n == 0 {
                    let mut reader = std::io::BufReader::new(&stream);
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                        line.clear();
                    }
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{set}",
                        set.len()
                    );
                } else {
                    held.push(stream);
                }
            }
        });
        let mut options = OAuthOptions::new("https://i.example", url, "aud");
        // Every request finds the set stale and would refresh it; the refresh hangs "forever".
        options.refresh_after = Duration::ZERO;
        options.refetch_cooldown = Duration::ZERO;
        options.fetch_timeout = Duration::from_secs(3600);
        let verifier = JwtVerifier::new(options).unwrap_or_else(|e| panic!("{e}"));
        let mut header = jsonwebtoken::Header::new(Algorithm::EdDSA);
        header.kid = Some("k".to_owned());
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() + 300)
            .unwrap_or_default();
        let token = jsonwebtoken::encode(
            &header,
            &serde_json::json!({"iss": "https://i.example", "aud": "aud", "sub": "alice", "exp": exp}),
            &jsonwebtoken::EncodingKey::from_ed_der(pkcs8.as_ref()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // The first request fetches the set.
        let first = verifier.verify(&token).await.map(|p| p.key().to_owned());
        assert_eq!(first, Ok("https://i.example#alice".to_owned()));
        // The next one refreshes it and hangs; the others are served with the key known.
        let refreshing = {
            let (verifier, token) = (verifier.clone(), token.clone());
            tokio::spawn(async move { verifier.verify(&token).await })
        };
        tokio::task::yield_now().await;
        let served: Vec<_> = (0..5)
            .map(|_| {
                let (verifier, token) = (verifier.clone(), token.clone());
                tokio::spawn(async move { verifier.verify(&token).await })
            })
            .collect();
        for request in served {
            let answer = tokio::time::timeout(Duration::from_secs(120), request)
                .await
                .unwrap_or_else(|_| panic!("a known key waited for the hanging refresh"))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(answer.is_ok(), "{answer:?}");
        }
        assert!(!refreshing.is_finished(), "the refresh still hangs");
        refreshing.abort();
    }

    #[test]
    fn only_signature_keys_of_the_set_are_kept() {
        let big = fixture(2048);
        let small = fixture(1024);
        let rsa = |extra: Value| {
            let mut key =
                serde_json::json!({"kty": "RSA", "kid": "r", "n": big["n"], "e": big["e"]});
            for (k, v) in extra.as_object().into_iter().flatten() {
                key[k] = v.clone();
            }
            key
        };
        let algorithms = |key: Value| usable(&key).map(|(_, key)| key.algorithms);
        assert_eq!(
            algorithms(rsa(serde_json::json!({}))).map(|a| a.len()),
            Some(6)
        );
        assert_eq!(
            algorithms(rsa(serde_json::json!({"alg": "PS256", "use": "sig"}))),
            Some(vec![Algorithm::PS256])
        );
        for dropped in [
            serde_json::json!({"alg": "RSA-OAEP"}),
            serde_json::json!({"alg": "RSA-OAEP-256"}),
            serde_json::json!({"alg": "ES256"}),
            serde_json::json!({"alg": "HS256"}),
            serde_json::json!({"alg": "XYZ"}),
            serde_json::json!({"alg": 5}),
            serde_json::json!({"use": "enc"}),
            serde_json::json!({"use": "other"}),
            serde_json::json!({"key_ops": ["encrypt"]}),
            serde_json::json!({"key_ops": "verify"}),
            serde_json::json!({"n": small["n"]}),
            serde_json::json!({"n": "!!"}),
        ] {
            assert!(algorithms(rsa(dropped.clone())).is_none(), "{dropped}");
        }
        assert!(algorithms(rsa(serde_json::json!({"key_ops": ["verify"]}))).is_some());
        assert!(usable(&serde_json::json!({"kty": "oct", "kid": "s", "k": "c2VjcmV0"})).is_none());
        assert_eq!(rsa_bits("AQAB"), Some(17));
        assert_eq!(rsa_bits("AAAB"), Some(1));
    }

    #[test]
    fn token_types_are_access_tokens_or_plain_jwts() {
        let header = |typ: Option<&str>| Header {
            alg: Algorithm::EdDSA,
            kid: "k".to_owned(),
            typ: typ.map(str::to_owned),
        };
        for typ in [Some("at+jwt"), Some("AT+JWT"), Some("application/at+jwt")] {
            assert!(header(typ).typ_accepted(true), "{typ:?}");
        }
        for typ in [None, Some("JWT"), Some("jwt")] {
            assert!(header(typ).typ_accepted(false), "{typ:?}");
            assert!(!header(typ).typ_accepted(true), "{typ:?}");
        }
        for typ in ["dpop+jwt", "logout+jwt", "secevent+jwt", ""] {
            assert!(!header(Some(typ)).typ_accepted(false), "{typ}");
        }
    }

    #[test]
    fn issuers_name_authorities_and_mappings_name_principals() {
        let mut options = OAuthOptions::new("https://i.example#frag", "https://x/jwks", "aud");
        assert!(matches!(
            JwtVerifier::new(options.clone()),
            Err(OAuthError::Issuer { .. })
        ));
        options.issuer = "https://i.example".to_owned();
        options
            .local_principals
            .insert("alice".to_owned(), String::new());
        assert!(matches!(
            JwtVerifier::new(options.clone()),
            Err(OAuthError::LocalPrincipal { .. })
        ));
        options
            .local_principals
            .insert("alice".to_owned(), "alice".to_owned());
        assert!(JwtVerifier::new(options).is_ok());
    }

    #[test]
    fn claims_give_the_principal_tenant_and_scopes() {
        let mut options = OAuthOptions::new("iss", "https://x/jwks", "aud");
        let claims = |v: Value| v.as_object().cloned().unwrap_or_default();
        let p = principal_of(
            &claims(serde_json::json!({"sub": "alice", "scope": "a b", "scp": ["c"]})),
            &options,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.name(), "alice");
        assert_eq!(p.key(), "iss#alice");
        assert_eq!(p.authority(), Some("iss"));
        assert_eq!(p.channel(), Some("http"));
        let scopes: Vec<&str> = p
            .scopes()
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        assert_eq!(scopes, ["a", "b", "c"]);
        assert_eq!(
            principal_of(&claims(serde_json::json!({"sub": "a b"})), &options).err(),
            Some(HttpRefusal::InvalidSubject)
        );
        options.tenant_claim = Some("org".to_owned());
        assert_eq!(
            principal_of(&claims(serde_json::json!({"sub": "alice"})), &options).err(),
            Some(HttpRefusal::InvalidSubject)
        );
        let p = principal_of(
            &claims(serde_json::json!({"sub": "alice", "org": "acme"})),
            &options,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.tenant(), Some("acme"));
        assert_eq!(p.key(), "iss#acme/alice");
        assert_eq!(p.scopes().map(BTreeSet::len), Some(0));
        options
            .local_principals
            .insert("alice".to_owned(), "al".to_owned());
        let p = principal_of(
            &claims(serde_json::json!({"sub": "alice", "org": "acme"})),
            &options,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.key(), p.authority()), ("acme/al", None));
    }
}
