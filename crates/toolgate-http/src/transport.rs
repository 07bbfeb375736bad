//! The front door's transport checks, made before anything else reads a request: `Host` and
//! `Origin` against their allow-lists (before authentication: the transport spec wants 403 for a
//! foreign Origin, not a challenge), and the body of a POST (its declared length, its media type,
//! whether it is one JSON-RPC message at all). Also the bounded audit of the refusals
//! ([`RefusalLog`]): a flood of refused requests writes at most a fixed number of records per
//! window and one summary with the count of the rest, so it can neither stall the calls that
//! wait on the audit log nor fill the disk.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use toolgate_audit::{AuditDecision, AuditEntry, AuditSink, Outcome};
use toolgate_canon::Sha256Digest;

/// Why the transport refused a request: a stable code for the audit record's `reason` and the
/// response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportRefusal {
    /// No usable `Host` (empty, several, malformed, with userinfo): 400.
    InvalidHost,
    /// A `Host` outside the allow-list: 403.
    HostNotAllowed,
    /// Several `Origin` headers, or one that is not a bare `scheme://host[:port]` (userinfo, a
    /// path, not UTF-8): 403.
    InvalidOrigin,
    /// An `Origin` outside the allow-list: 403.
    OriginNotAllowed,
    /// A body (declared or sent) over the limit: 413.
    BodyTooLarge,
    /// A POST whose `Content-Type` is not `application/json`: 415.
    UnsupportedMediaType,
    /// A body that is not JSON: 400, JSON-RPC -32700.
    ParseError,
    /// A JSON-RPC batch (an array), which no supported protocol version has: 400, -32600.
    Batch,
    /// JSON that is not one JSON-RPC message: 400, -32600.
    InvalidMessage,
    /// rmcp found the MCP headers disagreeing with the body (`Mcp-Method`, `Mcp-Name`, ...): 400,
    /// -32020.
    HeaderMismatch,
    /// Another 400 of rmcp (a bad `MCP-Protocol-Version`, for example).
    BadRequest,
}

impl TransportRefusal {
    pub(crate) fn code(self) -> &'static str {
        match self {
            TransportRefusal::InvalidHost => "invalid_host",
            TransportRefusal::HostNotAllowed => "host_not_allowed",
            TransportRefusal::InvalidOrigin => "invalid_origin",
            TransportRefusal::OriginNotAllowed => "origin_not_allowed",
            TransportRefusal::BodyTooLarge => "body_too_large",
            TransportRefusal::UnsupportedMediaType => "unsupported_media_type",
            TransportRefusal::ParseError => "parse_error",
            TransportRefusal::Batch => "batch_not_supported",
            TransportRefusal::InvalidMessage => "invalid_message",
            TransportRefusal::HeaderMismatch => "header_mismatch",
            TransportRefusal::BadRequest => "bad_request",
        }
    }

    /// The response to a refusal the front door answers itself (rmcp's own 400s keep rmcp's
    /// response).
    pub(crate) fn response(self, max_body_bytes: usize) -> Response {
        let jsonrpc = |code: i64, message: &str| {
            (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": code, "message": message}})),
            )
                .into_response()
        };
        match self {
            TransportRefusal::ParseError => jsonrpc(-32700, "Parse error: the body is not JSON"),
            TransportRefusal::Batch => jsonrpc(
                -32600,
                "Invalid request: JSON-RPC batches are not part of this protocol version; send one message per request",
            ),
            TransportRefusal::InvalidMessage | TransportRefusal::HeaderMismatch => jsonrpc(
                -32600,
                "Invalid request: the body is not a JSON-RPC request, notification or response",
            ),
            TransportRefusal::BodyTooLarge => {
                let mut response = (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    axum::Json(json!({"error": self.code(), "limit_bytes": max_body_bytes})),
                )
                    .into_response();
                // The body is not read: the connection cannot carry another request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
            other => {
                let status = match other {
                    TransportRefusal::InvalidHost | TransportRefusal::BadRequest => {
                        StatusCode::BAD_REQUEST
                    }
                    TransportRefusal::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    _ => StatusCode::FORBIDDEN,
                };
                (status, axum::Json(json!({"error": other.code()}))).into_response()
            }
        }
    }
}

/// A refused request's `Host` or `Origin`, for the audit record: its digest only (the value is
/// attacker-chosen text; the digest lets an operator see repeated attempts).
pub(crate) type Refused = (TransportRefusal, Sha256Digest);

/// Checks `Host` (exactly one, non-empty, a bare `host[:port]`, on `allowed_hosts` unless that is
/// empty) and `Origin` (at most one; when present a bare `scheme://host[:port]` or `null`, on
/// `allowed_origins`).
pub(crate) fn check_host_and_origin(
    uri: &Uri,
    headers: &HeaderMap,
    allowed_hosts: &[String],
    allowed_origins: &[String],
) -> Result<(), Refused> {
    let digest = |value: &HeaderValue| Sha256Digest::of(value.as_bytes());
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(value), None) => {
            let parsed = value.to_str().ok().and_then(parse_authority);
            parsed.ok_or((TransportRefusal::InvalidHost, digest(value)))?
        }
        (None, _) => {
            // HTTP/2 carries the host in `:authority` (and a router may drop the synthesized
            // `Host`); HTTP/1.1 without a Host is malformed.
            let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
            parse_authority(authority)
                .ok_or((TransportRefusal::InvalidHost, Sha256Digest::of(b"")))?
        }
        (Some(value), Some(_)) => return Err((TransportRefusal::InvalidHost, digest(value))),
    };
    if !allowed_hosts.is_empty()
        && !allowed_hosts
            .iter()
            .filter_map(|allowed| allowed_authority(allowed.trim()))
            .any(|allowed| {
                allowed.host == host.host && allowed.port.is_none_or(|port| host.port == Some(port))
            })
    {
        return Err((
            TransportRefusal::HostNotAllowed,
            Sha256Digest::of(host.host.as_bytes()),
        ));
    }
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let origin = match (origins.next(), origins.next()) {
        (None, _) => return Ok(()),
        (Some(value), None) => value,
        (Some(value), Some(_)) => return Err((TransportRefusal::InvalidOrigin, digest(value))),
    };
    let parsed = origin.to_str().ok().and_then(parse_origin);
    let Some(parsed) = parsed else {
        return Err((TransportRefusal::InvalidOrigin, digest(origin)));
    };
    if allowed_origins
        .iter()
        .filter_map(|allowed| parse_allowed_origin(allowed))
        .any(|allowed| allowed.matches(&parsed))
    {
        Ok(())
    } else {
        Err((TransportRefusal::OriginNotAllowed, digest(origin)))
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

/// A bare `host[:port]`: no userinfo, nothing else; the host lowercased, IPv6 brackets removed.
fn parse_authority(text: &str) -> Option<Authority> {
    if text.is_empty() || text.contains(['@', '/', '?', '#', ' ']) {
        return None;
    }
    let authority = axum::http::uri::Authority::try_from(text).ok()?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    if authority
        .as_str()
        .strip_prefix(authority.host())
        .is_some_and(|rest| rest.starts_with(':'))
    {
        // `host:` with an empty port, or a port that does not parse.
        authority.port_u16()?;
    }
    Some(Authority {
        host,
        port: authority.port_u16(),
    })
}

/// An entry of the Host allow-list: an authority, or a bare name (an IPv6 address may be listed
/// without brackets, as rmcp's default `::1` is), which matches any port.
fn allowed_authority(text: &str) -> Option<Authority> {
    parse_authority(text).or_else(|| {
        let host = text
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        (!host.is_empty()).then_some(Authority { host, port: None })
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Origin {
    Null,
    Tuple {
        scheme: String,
        authority: Authority,
    },
}

/// An origin as browsers serialize it (RFC 6454): `null`, or `scheme://host[:port]` with nothing
/// after the authority and no userinfo in it.
fn parse_origin(text: &str) -> Option<Origin> {
    if text.eq_ignore_ascii_case("null") {
        return Some(Origin::Null);
    }
    let (scheme, authority) = text.split_once("://")?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return None;
    }
    Some(Origin::Tuple {
        scheme: scheme.to_ascii_lowercase(),
        authority: parse_authority(authority)?,
    })
}

/// An entry of the Origin allow-list: an origin, `scheme://host:*` for any port; an entry without
/// a port matches any port (rmcp's reading, kept so that configurations mean what they meant).
struct AllowedOrigin {
    origin: Origin,
    any_port: bool,
}

fn parse_allowed_origin(text: &str) -> Option<AllowedOrigin> {
    let text = text.trim();
    match text.strip_suffix(":*") {
        Some(base) => {
            let origin = parse_origin(base)?;
            matches!(&origin, Origin::Tuple { authority, .. } if authority.port.is_none())
                .then_some(AllowedOrigin {
                    origin,
                    any_port: true,
                })
        }
        None => {
            let origin = parse_origin(text)?;
            let any_port =
                matches!(&origin, Origin::Tuple { authority, .. } if authority.port.is_none());
            Some(AllowedOrigin { origin, any_port })
        }
    }
}

impl AllowedOrigin {
    fn matches(&self, origin: &Origin) -> bool {
        match (&self.origin, origin) {
            (Origin::Null, Origin::Null) => true,
            (
                Origin::Tuple {
                    scheme: a_scheme,
                    authority: a,
                },
                Origin::Tuple {
                    scheme,
                    authority: o,
                },
            ) => {
                let default_port = match scheme.as_str() {
                    "http" => Some(80),
                    "https" => Some(443),
                    _ => None,
                };
                a_scheme == scheme
                    && a.host == o.host
                    && (self.any_port || a.port == o.port.or(default_port))
            }
            _ => false,
        }
    }
}

/// The refusal of a POST by its headers alone: a declared `Content-Length` over the limit (413
/// at once, instead of reading up to the limit first), a `Content-Type` that is not JSON (415).
pub(crate) fn check_post_headers(
    headers: &HeaderMap,
    max_body_bytes: usize,
) -> Result<(), TransportRefusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_body_bytes as u64) {
        return Err(TransportRefusal::BodyTooLarge);
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split_once(';').map_or(v, |(essence, _)| essence);
            essence.trim().eq_ignore_ascii_case("application/json")
        });
    if json {
        Ok(())
    } else {
        Err(TransportRefusal::UnsupportedMediaType)
    }
}

/// Whether `body` is one JSON-RPC message rmcp can read (it parses the same type afterwards, so
/// its parser's message never reaches the caller).
pub(crate) fn check_message(body: &[u8]) -> Result<(), TransportRefusal> {
    if serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(body).is_ok() {
        return Ok(());
    }
    match serde_json::from_slice::<Value>(body) {
        Err(_) => Err(TransportRefusal::ParseError),
        Ok(Value::Array(_)) => Err(TransportRefusal::Batch),
        Ok(_) => Err(TransportRefusal::InvalidMessage),
    }
}

/// How many refusal records a window may hold before the rest are only counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalAuditLimit {
    /// Records written one by one per window (at least 1).
    pub records: u32,
    /// The window.
    pub window: Duration,
}

impl Default for RefusalAuditLimit {
    fn default() -> Self {
        RefusalAuditLimit {
            records: 100,
            window: Duration::from_secs(60),
        }
    }
}

/// The audit of refused requests, bounded: the first [`RefusalAuditLimit::records`] of a window
/// are written one by one, the rest counted and written as one summary record (method
/// `http/refusals`) when the window ends (a timer), when the next window's first refusal comes,
/// or when the front door is dropped at shutdown.
pub(crate) struct RefusalLog {
    audit: Arc<dyn AuditSink>,
    limit: RefusalAuditLimit,
    window: Mutex<Window>,
}

struct Window {
    started: Instant,
    recorded: u32,
    suppressed: u64,
    flush_scheduled: bool,
}

/// What to do with one refusal's record.
enum Admission {
    /// Write it, after the summary of the window before when there is one.
    Record { summary: Option<u64> },
    /// Only counted; the first of a window schedules the summary at the window's end.
    Counted { flush_at: Option<Instant> },
}

impl RefusalLog {
    pub(crate) fn new(audit: Arc<dyn AuditSink>, limit: RefusalAuditLimit) -> Arc<Self> {
        Arc::new(RefusalLog {
            audit,
            limit: RefusalAuditLimit {
                records: limit.records.max(1),
                window: limit.window.max(Duration::from_millis(1)),
            },
            window: Mutex::new(Window {
                started: Instant::now(),
                recorded: 0,
                suppressed: 0,
                flush_scheduled: false,
            }),
        })
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        // Every update leaves the counters consistent: valid after a panic elsewhere.
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn admit(&self, now: Instant) -> Admission {
        let mut window = self.window();
        let mut summary = None;
        if now.duration_since(window.started) >= self.limit.window {
            summary = Some(std::mem::take(&mut window.suppressed)).filter(|n| *n > 0);
            *window = Window {
                started: now,
                recorded: 0,
                suppressed: 0,
                flush_scheduled: false,
            };
        }
        if window.recorded < self.limit.records {
            window.recorded += 1;
            return Admission::Record { summary };
        }
        window.suppressed += 1;
        let flush_at = (!window.flush_scheduled).then(|| window.started + self.limit.window);
        window.flush_scheduled = true;
        Admission::Counted { flush_at }
    }

    /// The count of the window that started at `started`, taken, if it is still the current one.
    fn take_summary(&self, started: Option<Instant>) -> Option<u64> {
        let mut window = self.window();
        if started.is_some_and(|started| started != window.started) {
            return None;
        }
        window.flush_scheduled = false;
        Some(std::mem::take(&mut window.suppressed)).filter(|n| *n > 0)
    }

    fn summary_entry(&self, count: u64) -> AuditEntry {
        let mut entry = AuditEntry::tool_call(
            "http",
            "mcp",
            AuditDecision::Deny,
            Outcome::NotExecuted,
            Sha256Digest::of(b""),
        )
        .with_reason(toolgate_audit::Reason::Note(format!(
            "{count} more refused requests not recorded one by one (at most {} records per {} s)",
            self.limit.records,
            self.limit.window.as_secs()
        )))
        .with_channel("http");
        entry.method = "http/refusals".to_owned();
        entry
    }

    /// Records `entry` (a refusal) within the bound: written, or counted for the summary.
    pub(crate) async fn record(self: &Arc<Self>, entry: AuditEntry) {
        match self.admit(Instant::now()) {
            Admission::Record { summary } => {
                if let Some(count) = summary {
                    self.append(self.summary_entry(count)).await;
                }
                self.append(entry).await;
            }
            Admission::Counted { flush_at } => {
                if let Some(at) = flush_at {
                    let started = at.checked_sub(self.limit.window);
                    let log: Weak<RefusalLog> = Arc::downgrade(self);
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at.into()).await;
                        let Some(log) = log.upgrade() else { return };
                        if let Some(count) = log.take_summary(started) {
                            log.append(log.summary_entry(count)).await;
                        }
                    });
                }
            }
        }
    }

    async fn append(&self, entry: AuditEntry) {
        crate::append_to(&self.audit, entry).await;
    }
}

impl Drop for RefusalLog {
    /// Writes the count of the window still open, so a shutdown loses no refusal. On a thread of
    /// its own: a sink may block, and this may run on a runtime's worker.
    fn drop(&mut self) {
        let Some(count) = self.take_summary(None) else {
            return;
        };
        let entry = self.summary_entry(count);
        let audit = &self.audit;
        let written = std::thread::scope(|scope| {
            scope
                .spawn(|| audit.append(&entry).map_err(|e| e.to_string()))
                .join()
        });
        match written {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, "could not audit the refusals of the last window");
            }
            Err(_) => tracing::error!("the audit of the last window's refusals panicked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(host: &str, origin: Option<&str>) -> Result<(), TransportRefusal> {
        let mut headers = HeaderMap::new();
        headers.append(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(origin) = origin {
            headers.append(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        }
        let hosts = [
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        let origins = [
            "http://127.0.0.1:*".to_owned(),
            "http://[::1]:*".to_owned(),
            "https://app.example".to_owned(),
            "https://exact.example:8443".to_owned(),
        ];
        check_host_and_origin(&Uri::from_static("/mcp"), &headers, &hosts, &origins)
            .map_err(|(refusal, _)| refusal)
    }

    #[test]
    fn hosts_and_origins() {
        use TransportRefusal::*;
        let cases: &[(&str, Option<&str>, Result<(), TransportRefusal>)] = &[
            ("127.0.0.1:8080", None, Ok(())),
            ("[::1]:8080", Some("http://[::1]:9"), Ok(())),
            ("LOCALHOST", Some("http://127.0.0.1:1"), Ok(())),
            ("127.0.0.1", Some("https://app.example:1"), Ok(())),
            (
                "127.0.0.1",
                Some("https://exact.example"),
                Err(OriginNotAllowed),
            ),
            ("127.0.0.1", Some("https://exact.example:8443"), Ok(())),
            ("", None, Err(InvalidHost)),
            ("127.0.0.1:", None, Err(InvalidHost)),
            ("[::1]:", None, Err(InvalidHost)),
            ("a@127.0.0.1", None, Err(InvalidHost)),
            ("evil.example", None, Err(HostNotAllowed)),
            (
                "127.0.0.1",
                Some("http://evil.example@127.0.0.1"),
                Err(InvalidOrigin),
            ),
            (
                "127.0.0.1",
                Some("http://127.0.0.1:1/path"),
                Err(InvalidOrigin),
            ),
            ("127.0.0.1", Some(""), Err(InvalidOrigin)),
            ("127.0.0.1", Some("null"), Err(OriginNotAllowed)),
            (
                "127.0.0.1",
                Some("http://evil.example"),
                Err(OriginNotAllowed),
            ),
            (
                "127.0.0.1",
                Some("https://127.0.0.1:1"),
                Err(OriginNotAllowed),
            ),
        ];
        for (host, origin, expected) in cases {
            assert_eq!(check(host, *origin), *expected, "{host} {origin:?}");
        }
        let mut headers = HeaderMap::new();
        headers.append(header::HOST, HeaderValue::from_static("127.0.0.1"));
        headers.append(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:1"),
        );
        headers.append(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        let refused = check_host_and_origin(
            &Uri::from_static("/mcp"),
            &headers,
            &[],
            &["http://127.0.0.1:*".to_owned()],
        );
        assert_eq!(refused.map_err(|(r, _)| r), Err(InvalidOrigin));
    }

    #[test]
    fn messages() {
        assert_eq!(
            check_message(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Ok(())
        );
        for (body, expected) in [
            (&b"{not json"[..], TransportRefusal::ParseError),
            (b"", TransportRefusal::ParseError),
            (
                b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
                TransportRefusal::Batch,
            ),
            (b"{}", TransportRefusal::InvalidMessage),
            (b"42", TransportRefusal::InvalidMessage),
        ] {
            assert_eq!(check_message(body), Err(expected));
        }
    }

    #[test]
    fn a_window_admits_its_limit_then_counts() {
        let audit: Arc<dyn AuditSink> = Arc::new(toolgate_audit::MemoryAuditLog::new());
        let log = RefusalLog::new(
            audit,
            RefusalAuditLimit {
                records: 2,
                window: Duration::from_secs(10),
            },
        );
        let start = log.window().started;
        assert!(matches!(
            log.admit(start),
            Admission::Record { summary: None }
        ));
        assert!(matches!(
            log.admit(start),
            Admission::Record { summary: None }
        ));
        assert!(matches!(
            log.admit(start),
            Admission::Counted { flush_at: Some(_) }
        ));
        assert!(matches!(
            log.admit(start),
            Admission::Counted { flush_at: None }
        ));
        let later = start + Duration::from_secs(10);
        assert!(matches!(
            log.admit(later),
            Admission::Record { summary: Some(2) }
        ));
        assert_eq!(log.take_summary(Some(start)), None, "another window now");
    }
}
