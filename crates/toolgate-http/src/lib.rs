//! Streamable HTTP: the gated handler behind rmcp's `StreamableHttpService`,
//! mounted at `/mcp` of an axum router, with every request authenticated before it reaches rmcp.
//!
//! - **Authentication** ([`Authentication`]): `Authorization: Bearer <token>` on every request,
//!   either a static API token of the ledger ([`tokens::ApiTokens`], `tgt_…`) or an OAuth 2.1
//!   access token (a JWT checked against the issuer's keys, [`oauth::JwtVerifier`]). A request
//!   without a valid token gets 401 with `WWW-Authenticate: Bearer resource_metadata="…",
//!   error="invalid_token"` and is audited (the reason code, never the token); nothing reaches
//!   rmcp. The verified principal (with its tenant and scopes) goes into the request's extensions
//!   as a [`VerifiedPrincipal`], where the gate's [`FromExtensions`](toolgate_rmcp::FromExtensions) finds it: the
//!   principal comes from the credential only.
//! - **Scopes**: a `tools/call` of a tool the policy puts under scopes (`scopes`) that the
//!   credential does not hold gets 403 with `error="insufficient_scope", scope="…"`; tools/list
//!   leaves such tools out.
//! - **Kill switch**: while it is on, a `tools/call` of a tool it stops gets 503 with
//!   `Retry-After` and the JSON-RPC error in the body; the connection stays usable.
//! - **Sessions** (the 2025-11-25 flow): a session is bound to the whole verified identity that
//!   opened it (name, tenant, scopes, channel); a request on it with another identity, or on a
//!   session id the front door did not see opened, gets 404, as for an unknown session. The
//!   binding ends only when rmcp ends the session (a DELETE it accepted, or its expiry). The
//!   2026-07-28 flow is stateless; rmcp checks its `Mcp-Method` / `Mcp-Name` headers against the
//!   body (400, JSON-RPC -32020).
//! - **Transport checks** (`transport.rs`), before authentication: `Host` (exactly one, on the
//!   allow-list, loopback by default) and `Origin` (at most one, a bare origin on the allow-list,
//!   loopback by default; anything else is 403); then, for a POST, a declared `Content-Length`
//!   over the limit (413 at once), a media type other than JSON (415), and a body that is not one
//!   JSON-RPC message (400 with -32700 or -32600). Every refusal is audited, bounded per window
//!   ([`RefusalAuditLimit`]).
//! - **Protected resource metadata** (RFC 9728) at `/.well-known/oauth-protected-resource`.
//! - **Serving** ([`serve_connections`], [`HttpConfig`]): hyper's HTTP/1 connections with a
//!   header-read and idle timeout, drained on SIGINT or SIGTERM.

#![forbid(unsafe_code)]

pub mod oauth;
mod serve;
pub mod tokens;
mod transport;

pub use serve::{
    FrontDoor, HttpConfig, SHUTDOWN_GRACE, http_runtime, serve_connections, shutdown_signal,
};
pub use transport::RefusalAuditLimit;

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
use toolgate_audit::{AuditDecision, AuditEntry, AuditSink, Outcome, Reason};
use toolgate_canon::Sha256Digest;

use oauth::JwtVerifier;
use tokens::ApiTokens;
use toolgate_rmcp::{Gated, VerifiedPrincipal};
use transport::{RefusalLog, TransportRefusal};

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
/// cannot judge, with [`HttpRefusal::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpRefusal {
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
    /// Several `Authorization` headers: which one counts is ambiguous (400, `invalid_request`).
    Ambiguous,
}

impl HttpRefusal {
    /// A short stable code, for the audit log and the response body.
    pub fn code(self) -> &'static str {
        match self {
            HttpRefusal::Missing => "missing_token",
            HttpRefusal::Invalid => "invalid_token",
            HttpRefusal::Expired => "expired_token",
            HttpRefusal::NotYetValid => "token_not_yet_valid",
            HttpRefusal::Revoked => "revoked_token",
            HttpRefusal::WrongIssuer => "wrong_issuer",
            HttpRefusal::WrongAudience => "wrong_audience",
            HttpRefusal::UnknownKey => "unknown_key",
            HttpRefusal::Algorithm => "algorithm_not_accepted",
            HttpRefusal::InvalidSubject => "invalid_subject",
            HttpRefusal::TokenType => "wrong_token_type",
            HttpRefusal::Unavailable => "token_store_unavailable",
            HttpRefusal::KeysUnavailable => "jwks_unavailable",
            HttpRefusal::Ambiguous => "multiple_credentials",
        }
    }

    /// Whether the server, not the credential, is at fault (503 rather than 401).
    fn is_server_fault(self) -> bool {
        matches!(
            self,
            HttpRefusal::Unavailable | HttpRefusal::KeysUnavailable
        )
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

    /// The principal `token` proves (and an API token's id), or why not (with the id of an API
    /// token that is revoked or expired: a token of this server, named in the audit record).
    async fn verify(
        &self,
        token: &str,
    ) -> Result<(VerifiedPrincipal, Option<String>), (oauth::Rejection, Option<String>)> {
        if token.starts_with(tokens::TOKEN_PREFIX) {
            let Some(tokens) = &self.tokens else {
                return Err((HttpRefusal::Invalid.into(), None));
            };
            // One `stat` of the token file per request (and a read when it changed: a revocation
            // applies to the next request), on the async thread: the ledger is a local
            // filesystem (docs/storage.md), where both take microseconds.
            return tokens
                .verify(token, SystemTime::now())
                .map(|(principal, id)| (principal, Some(id)))
                .map_err(|refusal| match refusal {
                    HttpRefusal::Revoked | HttpRefusal::Expired => {
                        (refusal.into(), Some(tokens::token_id(token)))
                    }
                    other => (other.into(), None),
                });
        }
        match &self.oauth {
            Some(oauth) => oauth
                .verify(token)
                .await
                .map(|principal| (principal, None))
                .map_err(|rejection| (rejection, None)),
            None => Err((HttpRefusal::Invalid.into(), None)),
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
    /// How many refused requests (transport checks, authentication) are audited one by one per
    /// window; the rest of a window are counted in one summary record.
    pub refusal_audit: RefusalAuditLimit,
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
            refusal_audit: RefusalAuditLimit::default(),
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
    /// The bounded audit of refused requests.
    refusals: Arc<RefusalLog>,
    metadata_url: String,
    max_body_bytes: usize,
    retry_after: HeaderValue,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    /// rmcp's sessions, to forget the owners of the sessions it ended.
    manager: Arc<LocalSessionManager>,
    /// Legacy sessions and the identity that opened each.
    sessions: Mutex<Sessions>,
}

/// The owner of every legacy session rmcp holds (and, until the next pruning, of some it ended).
#[derive(Default)]
struct Sessions {
    owners: HashMap<String, VerifiedPrincipal>,
    /// The size at which the owners are next compared with rmcp's sessions (so pruning costs
    /// O(1) per new session, amortized).
    prune_at: usize,
}

/// The least number of owner entries before they are pruned.
const PRUNE_FLOOR: usize = 64;

impl Sessions {
    /// Binds session `id` to `principal` (a session keeps its first owner); whether the owners
    /// are now due to be compared with rmcp's live sessions.
    fn bind(&mut self, id: String, principal: &VerifiedPrincipal) -> bool {
        self.owners.entry(id).or_insert_with(|| principal.clone());
        self.owners.len() >= self.prune_at
    }

    /// Forgets the owners of sessions rmcp no longer holds (ended or expired), and sets the next
    /// pruning at twice what is left.
    fn prune(&mut self, live: &std::collections::HashSet<String>) {
        self.owners.retain(|id, _| live.contains(id));
        self.prune_at = (self.owners.len() * 2).max(PRUNE_FLOOR);
    }
}

/// The axum router serving `gated` at [`MCP_PATH`] behind `auth`, with the protected resource
/// metadata. Mount it in a server of your own, or serve it as is.
///
/// Each request's principal is the one its credential names: a gate built with a fixed principal
/// ([`toolgate_rmcp::GatedBuilder::principal`], `local` by default) gets [`FromExtensions`](toolgate_rmcp::FromExtensions) instead, so
/// that no HTTP caller is ever served as the fixed name. A custom per-request source is kept.
pub fn router<H>(
    gated: Gated<H>,
    auth: Authentication,
    audit: Arc<dyn AuditSink>,
    options: &HttpOptions,
) -> axum::Router
where
    H: ServerHandler + Send + Sync + 'static,
{
    let (gated, replaced) = gated.with_verified_principals();
    if replaced {
        tracing::info!(
            "the gate's fixed principal does not apply over HTTP: each request is served as its credential's principal"
        );
    }
    let gated = Arc::new(gated);
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts = options.allowed_hosts.clone();
    config.allowed_origins = options.allowed_origins.clone();
    config = config.enforce_origin_validation();
    config.max_request_body_bytes = options.max_body_bytes;
    config.json_response = true;
    let service_gate = Arc::clone(&gated);
    let manager = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || Ok(Arc::clone(&service_gate)),
        Arc::clone(&manager),
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
        refusals: RefusalLog::new(Arc::clone(&audit), options.refusal_audit),
        audit,
        metadata_url: options.metadata_url(),
        max_body_bytes: options.max_body_bytes,
        retry_after: HeaderValue::from(options.retry_after_secs),
        allowed_hosts: options.allowed_hosts.clone(),
        allowed_origins: options.allowed_origins.clone(),
        manager,
        sessions: Mutex::new(Sessions {
            owners: HashMap::new(),
            prune_at: PRUNE_FLOOR,
        }),
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
    // The transport's checks come first: a foreign Origin is 403 whatever the credential.
    if let Err((refusal, digest)) = transport::check_host_and_origin(
        request.uri(),
        request.headers(),
        &door.allowed_hosts,
        &door.allowed_origins,
    ) {
        transport_refused(&door, None, refusal, digest).await;
        return refusal.response(door.max_body_bytes);
    }
    let verified = match bearer(request.headers()) {
        Err(refusal) => Err((refusal.into(), None)),
        Ok(token) => door.auth.verify(token).await,
    };
    let principal = match verified {
        Ok((principal, _id)) => principal,
        Err((refusal, token_id)) => return refuse(&door, refusal, token_id).await,
    };
    let session = match request.headers().get(SESSION_HEADER) {
        None => None,
        Some(value) => match value.to_str() {
            Ok(id) => Some(id.to_owned()),
            // Not a session id rmcp could have issued.
            Err(_) => return StatusCode::NOT_FOUND.into_response(),
        },
    };
    if let Some(id) = &session {
        let owned = sessions(&door).owners.get(id) == Some(&principal);
        if !owned {
            // Another identity's session, or one the front door never saw opened (rmcp's
            // sessions are opened through it, so none of its live sessions lacks an owner): as
            // unknown as a session that never existed.
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
    request.extensions_mut().insert(principal.clone());
    let response = next.run(request).await;
    let status = response.status();
    if let Some(opened) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    {
        bind_session(&door, opened, &principal).await;
    }
    if let Some(id) = session
        && ((deleting && status.is_success()) || status == StatusCode::NOT_FOUND)
    {
        // rmcp ended the session (a DELETE it accepted) or no longer knows it (expired): its
        // owner entry goes. A refused DELETE keeps the session and its owner.
        sessions(&door).owners.remove(&id);
    }
    if status == StatusCode::BAD_REQUEST {
        return audit_rmcp_refusal(&door, &principal, response).await;
    }
    response
}

/// Binds the new session `id` to `principal`, and now and then forgets the owners of sessions
/// rmcp has ended (expired ones included), so the map never outgrows rmcp's own.
async fn bind_session(door: &Door, id: String, principal: &VerifiedPrincipal) {
    let prune = sessions(door).bind(id, principal);
    if prune {
        let live: std::collections::HashSet<String> = door
            .manager
            .sessions
            .read()
            .await
            .keys()
            .map(|id| id.to_string())
            .collect();
        sessions(door).prune(&live);
    }
}

/// Audits a 400 of rmcp (the MCP headers disagreeing with the body, -32020; a bad protocol
/// version header; ...) and gives its response back unchanged. A 400 is a short JSON or text
/// body, never a stream.
async fn audit_rmcp_refusal(
    door: &Door,
    principal: &VerifiedPrincipal,
    response: Response,
) -> Response {
    const MAX_ERROR_BODY: usize = 64 * 1024;
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        transport_refused(
            door,
            Some(principal),
            TransportRefusal::BadRequest,
            Sha256Digest::of(b""),
        )
        .await;
        return (parts.status, parts.headers).into_response();
    };
    let code = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|body| body["error"]["code"].as_i64());
    let refusal = if code == Some(-32020) {
        TransportRefusal::HeaderMismatch
    } else {
        TransportRefusal::BadRequest
    };
    transport_refused(door, Some(principal), refusal, Sha256Digest::of(b"")).await;
    Response::from_parts(parts, Body::from(bytes))
}

/// Audits a transport refusal (method `http/transport`, the refusal's code as reason, the digest
/// of the refused `Host` or `Origin` as `args_digest`), bounded by the refusal log.
async fn transport_refused(
    door: &Door,
    principal: Option<&VerifiedPrincipal>,
    refusal: TransportRefusal,
    digest: Sha256Digest,
) {
    let mut entry = AuditEntry::tool_call(
        "http",
        "mcp",
        AuditDecision::Deny,
        Outcome::NotExecuted,
        digest,
    )
    .with_reason(toolgate_audit::Reason::Refused(refusal.code()))
    .with_channel("http")
    .with_policy_digest(door.gate.policy().digest());
    entry.method = "http/transport".to_owned();
    if let Some(principal) = principal {
        entry.principal = Some(principal.key().to_owned());
        entry.tenant = principal.tenant().map(str::to_owned);
    }
    door.refusals.record(entry).await;
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
    let refused = async |refusal: TransportRefusal| {
        transport_refused(door, Some(principal), refusal, Sha256Digest::of(b"")).await;
        refusal.response(door.max_body_bytes)
    };
    if let Err(refusal) = transport::check_post_headers(request.headers(), door.max_body_bytes) {
        return Err(refused(refusal).await);
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, door.max_body_bytes).await else {
        return Err(refused(TransportRefusal::BodyTooLarge).await);
    };
    if let Err(refusal) = transport::check_message(&bytes) {
        return Err(refused(refusal).await);
    }
    if let Some(call) = tools_call(&bytes) {
        let required = door.gate.policy().required_scopes(&call.name).cloned();
        if !principal.grants(required.as_ref()) {
            let scopes = required.into_iter().flatten().collect::<Vec<_>>().join(" ");
            record(door, principal, &call, &bytes, Reason::InsufficientScope).await;
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
            toolgate_rmcp::run_blocking(move || gate.halted_for(&tool, tenant.as_deref()))
                .await
                .unwrap_or_else(|cancelled| {
                    Some(rmcp::ErrorData::internal_error(cancelled.to_string(), None))
                })
        };
        if let Some(error) = halted {
            record(door, principal, &call, &bytes, Reason::KillSwitch).await;
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

fn sessions(door: &Door) -> std::sync::MutexGuard<'_, Sessions> {
    // Only whole entries are inserted or removed: valid after a panic elsewhere.
    door.sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bearer token of the one `Authorization` header: missing when there is none or it is not
/// a bearer token, ambiguous when there are several (which one a proxy or a client library
/// meant cannot be known, so none is tried).
fn bearer(headers: &HeaderMap) -> Result<&str, HttpRefusal> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(HttpRefusal::Missing),
        (Some(value), None) => value,
        (Some(_), Some(_)) => return Err(HttpRefusal::Ambiguous),
    };
    let (scheme, token) = value
        .to_str()
        .ok()
        .and_then(|value| value.split_once(' '))
        .ok_or(HttpRefusal::Missing)?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or(HttpRefusal::Missing)
}

/// Audits a call the front door refused, under the caller's principal, channel and tenant.
async fn record(
    door: &Door,
    principal: &VerifiedPrincipal,
    call: &Call,
    body: &[u8],
    reason: Reason,
) {
    let name = match toolgate_policy::ToolName::new(&call.name) {
        Ok(_) => call.name.clone(),
        Err(_) => format!("sha256:{}", Sha256Digest::of(call.name.as_bytes())),
    };
    let mut entry = AuditEntry::tool_call(
        format!("rpc:{}", call.id),
        name,
        AuditDecision::Deny,
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
    append_to(&door.audit, entry).await;
}

/// Appends a record of the front door's to `audit` (on the blocking pool when the sink may
/// block); a failure is logged, since the refusal stands either way.
pub(crate) async fn append_to(audit: &Arc<dyn AuditSink>, entry: AuditEntry) {
    let audit = Arc::clone(audit);
    let recorded = if audit.may_block() {
        toolgate_rmcp::run_blocking(move || audit.append(&entry))
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

/// 401 (503 when the server cannot judge, 400 for several credentials) with the challenge,
/// after auditing the refusal (its code and the server's detail, and the id of a revoked or
/// expired API token; never the token), bounded like the transport's refusals.
async fn refuse(door: &Door, rejection: oauth::Rejection, token_id: Option<String>) -> Response {
    let refusal = rejection.refusal;
    let request_id = token_id.map_or_else(|| "http".to_owned(), |id| format!("token:{id}"));
    let mut entry = AuditEntry::tool_call(
        request_id,
        "mcp",
        AuditDecision::Deny,
        Outcome::NotExecuted,
        Sha256Digest::of(b""),
    )
    .with_reason(toolgate_audit::Reason::Note(rejection.reason()))
    .with_channel("http");
    entry.method = "http/authenticate".to_owned();
    door.refusals.record(entry).await;
    let (status, error) = match refusal {
        HttpRefusal::Ambiguous => (StatusCode::BAD_REQUEST, "invalid_request"),
        _ if refusal.is_server_fault() => (StatusCode::SERVICE_UNAVAILABLE, "invalid_token"),
        _ => (StatusCode::UNAUTHORIZED, "invalid_token"),
    };
    let mut response = (status, axum::Json(json!({"error": refusal.code()}))).into_response();
    let challenge = format!(
        "Bearer resource_metadata=\"{}\", error=\"{error}\"",
        door.metadata_url
    );
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_sessions_rmcp_no_longer_holds_are_forgotten() {
        let mut sessions = Sessions {
            owners: HashMap::new(),
            prune_at: PRUNE_FLOOR,
        };
        let alice = VerifiedPrincipal::new("alice").unwrap_or_else(|e| panic!("{e}"));
        let bob = VerifiedPrincipal::new("bob").unwrap_or_else(|e| panic!("{e}"));
        // A session keeps its first owner.
        assert!(!sessions.bind("s-0".to_owned(), &alice));
        assert!(!sessions.bind("s-0".to_owned(), &bob));
        assert_eq!(sessions.owners.get("s-0"), Some(&alice));
        // Pruning is due once the floor is reached, not before.
        let due: Vec<bool> = (1..PRUNE_FLOOR)
            .map(|n| sessions.bind(format!("s-{n}"), &alice))
            .collect();
        assert_eq!(due.iter().filter(|due| **due).count(), 1);
        assert!(due[PRUNE_FLOOR - 2]);
        // rmcp still holds two of them (the others ended or expired): only their owners stay.
        let live = ["s-0".to_owned(), "s-7".to_owned()].into_iter().collect();
        sessions.prune(&live);
        assert_eq!(sessions.owners.len(), 2);
        assert_eq!(sessions.owners.get("s-7"), Some(&alice));
        assert_eq!(sessions.prune_at, PRUNE_FLOOR);
        // Above the floor, the next pruning comes at twice what was left.
        for n in 0..100 {
            sessions.bind(format!("t-{n}"), &bob);
        }
        let live: std::collections::HashSet<String> = sessions.owners.keys().cloned().collect();
        sessions.prune(&live);
        assert_eq!(sessions.prune_at, 2 * sessions.owners.len());
    }
}
