//! Streamable HTTP (feature `http`): the gated handler behind rmcp's `StreamableHttpService`,
//! mounted at `/mcp` of an axum router, with every request authenticated before it reaches rmcp.
//!
//! - **Authentication** ([`Authentication`]): `Authorization: Bearer <token>` on every request,
//!   either a static API token of the ledger ([`tokens::ApiTokens`], `tgt_…`) or an OAuth 2.1
//!   access token (a JWT checked against the issuer's keys, [`oauth::JwtVerifier`]). A request
//!   without a valid token gets 401 with `WWW-Authenticate: Bearer resource_metadata="…",
//!   error="invalid_token"` and is audited (the reason code, never the token); nothing reaches
//!   rmcp. The verified principal (with its tenant and scopes) goes into the request's extensions
//!   as a [`crate::VerifiedPrincipal`], where the gate's [`crate::FromExtensions`] finds it: the
//!   principal comes from the credential only.
//! - **Scopes**: a `tools/call` of a tool the policy puts under scopes (`scopes`) that the
//!   credential does not hold gets 403 with `error="insufficient_scope", scope="…"`; tools/list
//!   leaves such tools out.
//! - **Kill switch**: while it is on, a `tools/call` of a tool it stops gets 503 with
//!   `Retry-After` and the JSON-RPC error in the body; the connection stays usable.
//! - **Sessions** (the 2025-11-25 flow): a session is bound to the principal that opened it; a
//!   request on it with another principal's token gets 404, as for an unknown session. The
//!   2026-07-28 flow is stateless; rmcp checks its `Mcp-Method` / `Mcp-Name` headers against the
//!   body (400, JSON-RPC -32020).
//! - **Transport hygiene** from rmcp's service: `Host` allow-list (loopback by default),
//!   `Origin` validation (an allow-list; loopback origins by default, and a present Origin that is
//!   not listed is 403), the body size limit (413).
//! - **Protected resource metadata** (RFC 9728) at `/.well-known/oauth-protected-resource`.

pub mod oauth;
pub mod tokens;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::ServerHandler;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use toolgate_audit::{AuditEntry, AuditSink, Decision, Outcome};
use toolgate_canon::Sha256Digest;

use crate::{Gated, VerifiedPrincipal};
use oauth::JwtVerifier;
use tokens::ApiTokens;

/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
/// The protected resource metadata's path (RFC 9728).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The default body limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// The default `Retry-After` of a call refused by the kill switch, in seconds.
pub const DEFAULT_RETRY_AFTER_SECS: u64 = 30;
/// The default time a request may take until its response starts.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Why a request is not authenticated (the HTTP layer answers 401, or 503 when the server
/// cannot judge, with [`Refusal::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Not a token of this server: malformed, unknown, or a signature that does not verify.
    Invalid,
    /// Past its expiry (`exp`, or an API token's expiry).
    Expired,
    /// Before its `nbf`.
    NotYetValid,
    /// Revoked by the operator.
    Revoked,
    /// Issued by another issuer (`iss`), or without one.
    WrongIssuer,
    /// Issued for another audience than this server, or for none (`aud`).
    WrongAudience,
    /// Signed with a key the issuer's key set does not hold (or without a `kid`).
    UnknownKey,
    /// An algorithm that is not accepted (`none`, HMAC, unknown) or not the key's.
    Algorithm,
    /// The subject (or the configured tenant claim) is missing or not a valid name.
    InvalidSubject,
    /// The JWT's `typ` says it is not an access token (RFC 9068), or is not `at+jwt` where the
    /// server requires it.
    TokenType,
    /// The token store cannot be read (fail closed: 503).
    Unavailable,
    /// The issuer's key set could not be fetched and no key is known (503).
    KeysUnavailable,
}

impl Refusal {
    /// A short stable code, for the audit log and the response body.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Missing => "missing_token",
            Refusal::Invalid => "invalid_token",
            Refusal::Expired => "expired_token",
            Refusal::NotYetValid => "token_not_yet_valid",
            Refusal::Revoked => "revoked_token",
            Refusal::WrongIssuer => "wrong_issuer",
            Refusal::WrongAudience => "wrong_audience",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Algorithm => "algorithm_not_accepted",
            Refusal::InvalidSubject => "invalid_subject",
            Refusal::TokenType => "wrong_token_type",
            Refusal::Unavailable => "token_store_unavailable",
            Refusal::KeysUnavailable => "jwks_unavailable",
        }
    }

    /// Whether the server, not the credential, is at fault (503 rather than 401).
    fn is_server_fault(self) -> bool {
        matches!(self, Refusal::Unavailable | Refusal::KeysUnavailable)
    }
}

/// Which credentials the front door accepts: static API tokens, OAuth access tokens, or both (a
/// token with the API tokens' prefix goes to the API tokens, any other to OAuth).
#[derive(Debug, Clone, Default)]
pub struct Authentication {
    tokens: Option<ApiTokens>,
    oauth: Option<JwtVerifier>,
}

impl Authentication {
    /// Accepts nothing yet.
    pub fn new() -> Self {
        Authentication::default()
    }

    /// Accepts the API tokens of `tokens`.
    pub fn api_tokens(mut self, tokens: ApiTokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Accepts the OAuth access tokens `verifier` verifies.
    pub fn oauth(mut self, verifier: JwtVerifier) -> Self {
        self.oauth = Some(verifier);
        self
    }

    /// The principal `token` proves (and an API token's id), or why not.
    async fn verify(
        &self,
        token: &str,
    ) -> Result<(VerifiedPrincipal, Option<String>), oauth::Rejection> {
        if token.starts_with(tokens::TOKEN_PREFIX) {
            let Some(tokens) = &self.tokens else {
                return Err(Refusal::Invalid.into());
            };
            // One `stat` of the token file per request (and a read when it changed: a revocation
            // applies to the next request), on the async thread: the ledger is a local
            // filesystem (docs/storage.md), where both take microseconds.
            return tokens
                .verify(token, SystemTime::now())
                .map(|(principal, id)| (principal, Some(id)))
                .map_err(oauth::Rejection::from);
        }
        match &self.oauth {
            Some(oauth) => oauth.verify(token).await.map(|principal| (principal, None)),
            None => Err(Refusal::Invalid.into()),
        }
    }
}

/// How the HTTP front door is configured.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The server's canonical URI, e.g. `http://127.0.0.1:8080/mcp` (named in the metadata and in
    /// `WWW-Authenticate`).
    pub resource: String,
    /// Accepted `Host` values (names or `host:port`); rmcp's loopback names by default.
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host:port`, `:*` for any port); loopback by default.
    pub allowed_origins: Vec<String>,
    /// The largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// The `Retry-After` of calls refused by the kill switch, in seconds.
    pub retry_after_secs: u64,
    /// How long a request may take until its response starts (its body read, its call
    /// answered); past it the answer is 503 and the call is cancelled as if its client had gone.
    /// A long-lived event stream counts only until its headers are sent.
    pub request_timeout: std::time::Duration,
}

impl HttpOptions {
    /// Loopback-only defaults for the server at `resource`.
    pub fn new(resource: impl Into<String>) -> Self {
        let defaults = StreamableHttpServerConfig::default();
        HttpOptions {
            resource: resource.into(),
            allowed_hosts: defaults.allowed_hosts,
            allowed_origins: vec![
                "http://localhost:*".to_owned(),
                "http://127.0.0.1:*".to_owned(),
                "http://[::1]:*".to_owned(),
            ],
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            retry_after_secs: DEFAULT_RETRY_AFTER_SECS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// Where the protected resource metadata is served, from the resource's origin.
    fn metadata_url(&self) -> String {
        let origin = self
            .resource
            .find("://")
            .and_then(|scheme| {
                let rest = &self.resource[scheme + 3..];
                rest.find('/')
                    .map(|path| &self.resource[..scheme + 3 + path])
            })
            .unwrap_or(&self.resource);
        format!("{origin}{METADATA_PATH}")
    }
}

/// What the gate answers for the front door, whatever the wrapped handler.
trait GateView: Send + Sync {
    fn policy(&self) -> Arc<toolgate_policy::Policy>;
    fn halted_for(&self, tool: &str, tenant: Option<&str>) -> Option<rmcp::ErrorData>;
}

impl<H: ServerHandler + Send + Sync + 'static> GateView for Gated<H> {
    fn policy(&self) -> Arc<toolgate_policy::Policy> {
        Gated::policy(self)
    }

    fn halted_for(&self, tool: &str, tenant: Option<&str>) -> Option<rmcp::ErrorData> {
        Gated::halted_for(self, tool, tenant)
    }
}

/// What the authentication layer shares across requests.
struct Door {
    auth: Authentication,
    gate: Arc<dyn GateView>,
    audit: Arc<dyn AuditSink>,
    metadata_url: String,
    max_body_bytes: usize,
    retry_after: HeaderValue,
    /// Legacy sessions and the principal that opened each.
    sessions: Mutex<HashMap<String, Arc<str>>>,
}

/// The axum router serving `gated` at [`MCP_PATH`] behind `auth`, with the protected resource
/// metadata. Mount it in a server of your own, or serve it as is.
pub fn router<H>(
    gated: Gated<H>,
    auth: Authentication,
    audit: Arc<dyn AuditSink>,
    options: &HttpOptions,
) -> axum::Router
where
    H: ServerHandler + Send + Sync + 'static,
{
    let gated = Arc::new(gated);
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts = options.allowed_hosts.clone();
    config.allowed_origins = options.allowed_origins.clone();
    config = config.enforce_origin_validation();
    config.max_request_body_bytes = options.max_body_bytes;
    config.json_response = true;
    let service_gate = Arc::clone(&gated);
    let service = StreamableHttpService::new(
        move || Ok(Arc::clone(&service_gate)),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let policy = gated.policy();
    let mut metadata = json!({
        "resource": options.resource,
        "bearer_methods_supported": ["header"],
        "authorization_servers": auth.oauth.iter().map(|o| o.options().issuer.clone()).collect::<Vec<_>>(),
        "resource_name": "toolgate",
    });
    let scopes: Vec<&str> = policy.scopes_supported().into_iter().collect();
    if !scopes.is_empty() {
        metadata["scopes_supported"] = json!(scopes);
    }
    let door = Arc::new(Door {
        auth,
        gate: gated,
        audit,
        metadata_url: options.metadata_url(),
        max_body_bytes: options.max_body_bytes,
        retry_after: HeaderValue::from(options.retry_after_secs),
        sessions: Mutex::new(HashMap::new()),
    });
    let deadline = options.request_timeout;
    axum::Router::new()
        .route_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn_with_state(door, authenticate))
        .layer(axum::middleware::from_fn(move |request, next| {
            within(deadline, request, next)
        }))
        .route(
            METADATA_PATH,
            axum::routing::get(move || {
                let metadata = metadata.clone();
                async move { axum::Json(metadata) }
            }),
        )
}

/// Runs the rest of the stack on `request` for at most `deadline`; past it, 503 with a JSON-RPC
/// error (the id is not known here) and the work is dropped, which cancels the call as a client
/// that went away would (an exactly-once call keeps its record: a retry with its key is answered
/// from it, or told that the first is still running).
async fn within(deadline: std::time::Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let body = json!({"jsonrpc": "2.0", "id": null, "error": {
                "code": -32001,
                "message": format!(
                    "the request took longer than {} s and was cancelled; if it was a call with an idempotency key, retry it with the same key to learn its outcome",
                    deadline.as_secs()
                ),
            }});
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
        }
    }
}

/// The session id header of the 2025-11-25 flow.
const SESSION_HEADER: &str = "mcp-session-id";

async fn authenticate(State(door): State<Arc<Door>>, request: Request, next: Next) -> Response {
    let verified = match bearer(request.headers()) {
        None => Err(Refusal::Missing.into()),
        Some(token) => door.auth.verify(token).await,
    };
    let principal = match verified {
        Ok((principal, _id)) => principal,
        Err(refusal) => return refuse(&door, refusal).await,
    };
    let name: Arc<str> = principal.name().into();
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session {
        let owner = sessions(&door).get(id).cloned();
        if owner.is_some_and(|owner| owner != name) {
            // Another principal's session: as unknown as a session that never existed.
            return StatusCode::NOT_FOUND.into_response();
        }
    }
    let deleting = request.method() == axum::http::Method::DELETE;
    let mut request = if request.method() == axum::http::Method::POST {
        match screen(&door, &principal, request).await {
            Ok(request) => request,
            Err(response) => return response,
        }
    } else {
        request
    };
    request.extensions_mut().insert(principal);
    let response = next.run(request).await;
    if let Some(opened) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        sessions(&door)
            .entry(opened.to_owned())
            .or_insert_with(|| Arc::clone(&name));
    }
    if deleting && let Some(id) = session {
        sessions(&door).remove(&id);
    }
    response
}

/// A `tools/call` the front door decides before rmcp sees it: its JSON-RPC id and tool.
struct Call {
    id: Value,
    name: String,
}

/// Reads the body of a POST (up to the limit) and answers a `tools/call` the caller's scopes do
/// not reach (403) or the kill switch stops (503); gives the request back otherwise.
async fn screen(
    door: &Door,
    principal: &VerifiedPrincipal,
    request: Request,
) -> Result<Request, Response> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, door.max_body_bytes)
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(json!({"error": "body_too_large", "limit_bytes": door.max_body_bytes})),
            )
                .into_response()
        })?;
    if let Some(call) = tools_call(&bytes) {
        let required = door.gate.policy().required_scopes(&call.name).cloned();
        if !principal.grants(required.as_ref()) {
            let scopes = required.into_iter().flatten().collect::<Vec<_>>().join(" ");
            record(door, principal, &call, &bytes, "insufficient_scope").await;
            let mut response = (
                StatusCode::FORBIDDEN,
                axum::Json(json!({"error": "insufficient_scope", "scope": scopes})),
            )
                .into_response();
            let challenge = format!(
                "Bearer error=\"insufficient_scope\", scope=\"{scopes}\", resource_metadata=\"{}\"",
                door.metadata_url
            );
            if let Ok(value) = HeaderValue::from_str(&challenge) {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, value);
            }
            return Err(response);
        }
        // Reading the switch may block (a file, the database): off the async threads, and not
        // at all for the tools the policy exempts.
        let halted = if door.gate.policy().halt_exempt(&call.name) {
            None
        } else {
            let gate = Arc::clone(&door.gate);
            let tool = call.name.clone();
            let tenant = principal.tenant().map(str::to_owned);
            crate::blocking::run(move || gate.halted_for(&tool, tenant.as_deref()))
                .await
                .unwrap_or_else(|cancelled| {
                    Some(rmcp::ErrorData::internal_error(cancelled.to_string(), None))
                })
        };
        if let Some(error) = halted {
            record(door, principal, &call, &bytes, "kill_switch").await;
            let body = json!({"jsonrpc": "2.0", "id": call.id, "error": error});
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, door.retry_after.clone());
            return Err(response);
        }
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// The `tools/call` request in `body`, if it is one (anything else is rmcp's to answer). Reads
/// only the method and the tool's name (rmcp parses the whole message afterwards); the
/// arguments' digest is computed only for a refusal's audit record.
fn tools_call(body: &[u8]) -> Option<Call> {
    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
        id: Option<Value>,
        params: Option<ProbeParams<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct ProbeParams<'a> {
        #[serde(borrow)]
        name: Option<std::borrow::Cow<'a, str>>,
    }
    let probe: Probe<'_> = serde_json::from_slice(body).ok()?;
    if probe.method.as_deref() != Some("tools/call") {
        return None;
    }
    Some(Call {
        id: probe.id.unwrap_or(Value::Null),
        name: probe.params?.name?.into_owned(),
    })
}

/// SHA-256 of the canonical arguments of the `tools/call` in `body` (`{}` when absent).
fn args_digest(body: &[u8]) -> Sha256Digest {
    let arguments = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|message| message["params"]["arguments"].as_object().cloned())
        .unwrap_or_default();
    Sha256Digest::of_json_object(&arguments)
}

fn sessions(door: &Door) -> std::sync::MutexGuard<'_, HashMap<String, Arc<str>>> {
    // Only whole entries are inserted or removed: valid after a panic elsewhere.
    door.sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bearer token of `Authorization`, if the header is one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

/// Audits a call the front door refused, under the caller's principal, channel and tenant.
async fn record(
    door: &Door,
    principal: &VerifiedPrincipal,
    call: &Call,
    body: &[u8],
    reason: &str,
) {
    let name = match toolgate_policy::ToolName::new(&call.name) {
        Ok(_) => call.name.clone(),
        Err(_) => format!("sha256:{}", Sha256Digest::of(call.name.as_bytes())),
    };
    let mut entry = AuditEntry::tool_call(
        format!("rpc:{}", call.id),
        name,
        Decision::Deny,
        Outcome::NotExecuted,
        args_digest(body),
    )
    .with_reason(reason)
    .with_principal(principal.key())
    .with_policy_digest(door.gate.policy().digest());
    entry.channel = principal.channel().map(str::to_owned);
    entry.tenant = principal.tenant().map(str::to_owned);
    append(door, entry).await;
}

async fn append(door: &Door, entry: AuditEntry) {
    let audit = Arc::clone(&door.audit);
    let recorded = if audit.may_block() {
        crate::blocking::run(move || audit.append(&entry))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
    } else {
        audit.append(&entry).map_err(|e| e.to_string())
    };
    if let Err(error) = recorded {
        tracing::error!(%error, "could not audit a request the HTTP front door refused");
    }
}

/// 401 (503 when the server cannot judge) with the challenge, after auditing the refusal (its
/// code and the server's detail, never the token).
async fn refuse(door: &Door, rejection: oauth::Rejection) -> Response {
    let refusal = rejection.refusal;
    let mut entry = AuditEntry::tool_call(
        "http",
        "mcp",
        Decision::Deny,
        Outcome::NotExecuted,
        Sha256Digest::of(b""),
    )
    .with_reason(rejection.reason())
    .with_channel("http");
    entry.method = "http/authenticate".to_owned();
    append(door, entry).await;
    let status = if refusal.is_server_fault() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::UNAUTHORIZED
    };
    let mut response = (status, axum::Json(json!({"error": refusal.code()}))).into_response();
    let challenge = format!(
        "Bearer resource_metadata=\"{}\", error=\"invalid_token\"",
        door.metadata_url
    );
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}
