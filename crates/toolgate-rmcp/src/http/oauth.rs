//! OAuth 2.1 bearer tokens (JWTs) checked as a resource server: the signature against the
//! issuer's JSON Web Key Set, `exp` and `nbf` (60 s of leeway), `iss` equal to the configured
//! issuer, and an `aud` naming this server's canonical URI (RFC 8707). The subject (a configurable
//! claim, `sub` by default) becomes the request's principal; a configured tenant claim its tenant;
//! `scope` (space-separated) or `scp` its scopes.
//!
//! Only asymmetric algorithms are accepted (RS256/384/512, PS256/384/512, ES256/384, EdDSA), each
//! only with a key of its own type and curve, and only when the key's `alg` (if the JWKS gives one)
//! is the token's: `alg: none`, an HMAC token keyed with a published public key, or a token naming
//! a key that is not in the set are refused. Symmetric (`oct`) and encryption keys of the set are
//! ignored.
//!
//! The key set is fetched lazily (on the first token), kept, fetched again when it is older than
//! [`OAuthOptions::refresh_after`] or when a token names a key it does not hold (the issuer
//! rotated), but not more often than every [`OAuthOptions::refetch_cooldown`], so tokens naming
//! random keys cannot make the server hammer the issuer. A failed fetch keeps the keys it had;
//! with no keys at all the request is answered 503 (the server cannot judge it).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde_json::{Map, Value};

use super::Refusal;
use crate::VerifiedPrincipal;

/// The largest key set read, in bytes.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// How long a key set fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// A key set older than this is fetched again on the next token (5 minutes by default).
    pub refresh_after: Duration,
    /// The shortest time between two fetches (10 s by default).
    pub refetch_cooldown: Duration,
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
            refresh_after: Duration::from_secs(300),
            refetch_cooldown: Duration::from_secs(10),
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
    /// When the last fetch was tried (successful or not).
    tried: Option<Instant>,
    /// When the keys were last fetched successfully.
    fetched: Option<Instant>,
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
        check_jwks_url(&options.jwks_url)?;
        // rustls on ring, the provider every TLS user in this process shares.
        let _already = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
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
    pub async fn verify(&self, token: &str) -> Result<VerifiedPrincipal, Refusal> {
        let header = Header::of(token)?;
        let key = self.key(&header.kid).await?;
        if !key.algorithms.contains(&header.alg) {
            return Err(Refusal::Algorithm);
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
        principal_of(&claims, options)
    }

    /// The key `kid`, fetching the set when it is missing or stale.
    async fn key(&self, kid: &str) -> Result<Arc<Key>, Refusal> {
        let options = &self.inner.options;
        let fresh = |set: &KeySet| {
            set.fetched
                .is_some_and(|at| at.elapsed() < options.refresh_after)
        };
        let current = self.snapshot();
        if fresh(&current)
            && let Some(key) = current.keys.get(kid)
        {
            return Ok(Arc::clone(key));
        }
        let _one_fetch = self.inner.fetching.lock().await;
        let current = self.snapshot();
        let cooling = current
            .tried
            .is_some_and(|at| at.elapsed() < options.refetch_cooldown);
        let current = if (fresh(&current) && current.keys.contains_key(kid)) || cooling {
            current
        } else {
            self.refresh(&current).await
        };
        match current.keys.get(kid) {
            Some(key) => Ok(Arc::clone(key)),
            None if current.fetched.is_none() => Err(Refusal::Unavailable),
            None => Err(Refusal::UnknownKey),
        }
    }

    /// Fetches the set; on failure keeps `previous`'s keys (and says so in the log).
    async fn refresh(&self, previous: &KeySet) -> Arc<KeySet> {
        let now = Instant::now();
        let next = match self.fetch().await {
            Ok(keys) => KeySet {
                keys,
                tried: Some(now),
                fetched: Some(now),
            },
            Err(error) => {
                tracing::warn!(url = %self.inner.options.jwks_url, %error, "cannot fetch the JWKS; keeping the keys already known");
                KeySet {
                    keys: previous.keys.clone(),
                    tried: Some(now),
                    fetched: previous.fetched,
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

    async fn fetch(&self) -> Result<HashMap<String, Arc<Key>>, String> {
        let mut response = self
            .inner
            .client
            .get(&self.inner.options.jwks_url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let set: JwkSet = serde_json::from_slice(&body).map_err(|e| format!("not a JWKS: {e}"))?;
        Ok(set
            .keys
            .iter()
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, Arc::new(usable(jwk)?))))
            .collect())
    }
}

/// A key of the set usable for signatures, with the algorithms it may verify; `None` for keys
/// without an id, symmetric keys, encryption keys and keys that do not parse.
fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let family: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
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
    let declared = jwk
        .common
        .key_algorithm
        .and_then(|alg| serde_json::to_value(alg).ok())
        .and_then(|alg| alg.as_str().and_then(|alg| alg.parse::<Algorithm>().ok()));
    let algorithms = match declared {
        Some(alg) if family.contains(&alg) => vec![alg],
        Some(_) => return None,
        None => family.to_vec(),
    };
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        decoding,
        algorithms,
    })
}

/// What the token's header says, checked before any key is looked at.
struct Header {
    alg: Algorithm,
    kid: String,
}

impl Header {
    fn of(token: &str) -> Result<Self, Refusal> {
        use base64::Engine as _;
        let mut parts = token.split('.');
        let (Some(header), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refusal::Invalid);
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| Refusal::Invalid)?;
        let header: Map<String, Value> =
            serde_json::from_slice(&bytes).map_err(|_| Refusal::Invalid)?;
        let alg = match header.get("alg").and_then(Value::as_str) {
            Some(
                name @ ("RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512" | "ES256"
                | "ES384" | "EdDSA"),
            ) => name.parse::<Algorithm>().map_err(|_| Refusal::Algorithm)?,
            // `none`, the HMAC family and anything unknown.
            _ => return Err(Refusal::Algorithm),
        };
        let kid = header
            .get("kid")
            .and_then(Value::as_str)
            .ok_or(Refusal::UnknownKey)?;
        Ok(Header {
            alg,
            kid: kid.to_owned(),
        })
    }
}

fn refusal_of(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidIssuer => Refusal::WrongIssuer,
        ErrorKind::InvalidAudience => Refusal::WrongAudience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => Refusal::WrongAudience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => Refusal::WrongIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Refusal::Algorithm,
        _ => Refusal::Invalid,
    }
}

/// The principal, tenant and scopes of verified claims.
fn principal_of(
    claims: &Map<String, Value>,
    options: &OAuthOptions,
) -> Result<VerifiedPrincipal, Refusal> {
    let name = claims
        .get(&options.principal_claim)
        .and_then(Value::as_str)
        .ok_or(Refusal::InvalidSubject)?;
    let mut principal = VerifiedPrincipal::new(name).map_err(|_| Refusal::InvalidSubject)?;
    if let Some(claim) = &options.tenant_claim {
        let tenant = claims
            .get(claim)
            .and_then(Value::as_str)
            .ok_or(Refusal::InvalidSubject)?;
        principal = principal
            .with_tenant(tenant)
            .map_err(|_| Refusal::InvalidSubject)?;
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
    Ok(principal.with_scopes(scopes).with_channel("http"))
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
            Some(Refusal::Algorithm)
        );
        assert_eq!(
            refused(r#"{"alg":"HS256","kid":"k"}"#),
            Some(Refusal::Algorithm)
        );
        assert_eq!(refused(r#"{"kid":"k"}"#), Some(Refusal::Algorithm));
        assert_eq!(refused(r#"{"alg":"RS256"}"#), Some(Refusal::UnknownKey));
        assert_eq!(refused("not json"), Some(Refusal::Invalid));
        assert!(Header::of(&token(r#"{"alg":"EdDSA","kid":"k"}"#)).is_ok());
        assert_eq!(Header::of("a.b").err(), Some(Refusal::Invalid));
        assert_eq!(Header::of("a.b.c.d").err(), Some(Refusal::Invalid));
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
            Some(Refusal::InvalidSubject)
        );
        options.tenant_claim = Some("org".to_owned());
        assert_eq!(
            principal_of(&claims(serde_json::json!({"sub": "alice"})), &options).err(),
            Some(Refusal::InvalidSubject)
        );
        let p = principal_of(
            &claims(serde_json::json!({"sub": "alice", "org": "acme"})),
            &options,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.tenant(), Some("acme"));
        assert_eq!(p.scopes().map(BTreeSet::len), Some(0));
    }
}
