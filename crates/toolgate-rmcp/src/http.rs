//! Streamable HTTP (feature `http`): the gated handler behind rmcp's `StreamableHttpService`,
//! mounted at `/mcp` of an axum router, with every request authenticated before it reaches rmcp.
//!
//! - **Authentication**: `Authorization: Bearer <token>`, checked against the static API tokens
//!   ([`tokens::ApiTokens`]) on every request. A request without a valid token gets 401 with
//!   `WWW-Authenticate: Bearer resource_metadata="…", error="invalid_token"` and is audited (the
//!   reason code and the token's id when there is one, never the token); nothing reaches rmcp.
//!   The verified principal goes into the request's extensions as a [`crate::VerifiedPrincipal`], where
//!   the gate's [`crate::FromExtensions`] finds it: the principal comes from the credential only.
//! - **Sessions** (the 2025-11-25 flow): a session is bound to the principal that opened it; a
//!   request on it with another principal's token gets 404, as for an unknown session. The
//!   2026-07-28 flow is stateless.
//! - **Transport hygiene** from rmcp's service: `Host` allow-list (loopback by default),
//!   `Origin` validation (an allow-list; loopback origins by default, and a present Origin that is
//!   not listed is 403), the body size limit (413).
//! - **Protected resource metadata** (RFC 9728) at `/.well-known/oauth-protected-resource`.

pub mod tokens;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::ServerHandler;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use toolgate_audit::{AuditEntry, AuditSink, Decision, Outcome};
use toolgate_canon::Sha256Digest;

use crate::Gated;
use tokens::{ApiTokens, Refusal};

/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
/// The protected resource metadata's path (RFC 9728).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The default body limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

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

/// What the authentication layer shares across requests.
struct Door {
    tokens: ApiTokens,
    audit: Arc<dyn AuditSink>,
    challenge: HeaderValue,
    /// Legacy sessions and the principal that opened each.
    sessions: Mutex<HashMap<String, Arc<str>>>,
}

/// The axum router serving `gated` at [`MCP_PATH`] behind token authentication, with the
/// protected resource metadata. Mount it in a server of your own, or serve it as is.
pub fn router<H>(
    gated: Gated<H>,
    tokens: ApiTokens,
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
    let service = StreamableHttpService::new(
        move || Ok(Arc::clone(&gated)),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let challenge = HeaderValue::from_str(&format!(
        "Bearer resource_metadata=\"{}\", error=\"invalid_token\"",
        options.metadata_url()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("Bearer error=\"invalid_token\""));
    let door = Arc::new(Door {
        tokens,
        audit,
        challenge,
        sessions: Mutex::new(HashMap::new()),
    });
    let metadata = serde_json::json!({
        "resource": options.resource,
        "bearer_methods_supported": ["header"],
        "authorization_servers": [],
        "resource_name": "toolgate",
    });
    axum::Router::new()
        .route_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn_with_state(door, authenticate))
        .route(
            METADATA_PATH,
            axum::routing::get(move || {
                let metadata = metadata.clone();
                async move { axum::Json(metadata) }
            }),
        )
}

/// The session id header of the 2025-11-25 flow.
const SESSION_HEADER: &str = "mcp-session-id";

async fn authenticate(State(door): State<Arc<Door>>, mut request: Request, next: Next) -> Response {
    let verified = match bearer(request.headers()) {
        None => Err(Refusal::Missing),
        Some(token) => door.tokens.verify(token, SystemTime::now()),
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
    request.extensions_mut().insert(principal);
    let deleting = request.method() == axum::http::Method::DELETE;
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

/// 401 with the challenge, after auditing the refusal (its code, never the token).
async fn refuse(door: &Door, refusal: Refusal) -> Response {
    let mut entry = AuditEntry::tool_call(
        "http",
        "mcp",
        Decision::Deny,
        Outcome::NotExecuted,
        Sha256Digest::of(b""),
    )
    .with_reason(refusal.code());
    entry.method = "http/authenticate".to_owned();
    let audit = Arc::clone(&door.audit);
    let recorded = if audit.may_block() {
        tokio::task::spawn_blocking(move || audit.append(&entry))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
    } else {
        audit.append(&entry).map_err(|e| e.to_string())
    };
    if let Err(error) = recorded {
        tracing::error!(%error, "could not audit a refused request");
    }
    let status = if refusal == Refusal::Unavailable {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::UNAUTHORIZED
    };
    let mut response = (
        status,
        axum::Json(serde_json::json!({"error": refusal.code()})),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, door.challenge.clone());
    response
}
