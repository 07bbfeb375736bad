//! Serving the front door: the configuration of `serve --http` ([`HttpConfig`]), the runtime
//! ([`http_runtime`]) and the accept loop ([`serve_connections`]): hyper's HTTP/1 connections
//! with a header-read (and idle keep-alive) timeout, drained on SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use crate::oauth::{JwtVerifier, OAuthError, OAuthOptions};
use crate::tokens::ApiTokens;
use crate::{Authentication, HttpOptions, MCP_PATH};

/// How long in-flight HTTP requests may take to finish once a shutdown is asked for.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Where and how a gated server serves Streamable HTTP.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The address to listen on (port 0 picks a free port).
    pub addr: SocketAddr,
    /// The server's public canonical URI (behind a proxy); default `http://ADDR/mcp`.
    pub public_url: Option<String>,
    /// OAuth access tokens accepted besides the API tokens; an empty audience means the
    /// server's canonical URI.
    pub oauth: Option<OAuthOptions>,
    /// How long a request may take until its response starts (then 503, the call cancelled).
    pub request_timeout: Duration,
    /// How long a client may take to send a request's headers, and keep a connection idle.
    pub header_read_timeout: Duration,
    /// The `Origin` values accepted instead of the loopback ones (empty: loopback only).
    pub allowed_origins: Vec<String>,
    /// `Host` values accepted besides the loopback names and the public URL's host.
    pub allowed_hosts: Vec<String>,
    /// Refused requests audited one by one per minute (default 100, [`crate::RefusalAuditLimit`]).
    pub refusal_audit_limit: Option<u32>,
}

/// What [`HttpConfig::front_door`] makes: the canonical URI, the router's options and the
/// authentication layer.
#[derive(Debug)]
pub struct FrontDoor {
    /// The server's canonical URI (the public URL, or `http://LOCAL/mcp`).
    pub resource: String,
    /// The router's options.
    pub options: HttpOptions,
    /// API tokens, and OAuth when configured.
    pub auth: Authentication,
}

impl HttpConfig {
    /// The front door of a server bound at `local`, accepting `tokens`: the canonical URI (the
    /// public URL, else `http://LOCAL/mcp`), whose host is accepted besides the configured ones,
    /// and the OAuth verifier, whose audience defaults to that URI.
    pub fn front_door(
        &self,
        local: SocketAddr,
        tokens: ApiTokens,
    ) -> Result<FrontDoor, OAuthError> {
        let resource = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{local}{MCP_PATH}"));
        let mut options = HttpOptions::new(resource.clone());
        options.request_timeout = self.request_timeout;
        if let Some(records) = self.refusal_audit_limit {
            options.refusal_audit.records = records;
        }
        if !self.allowed_origins.is_empty() {
            options.allowed_origins.clone_from(&self.allowed_origins);
        }
        options
            .allowed_hosts
            .extend(self.allowed_hosts.iter().cloned());
        if let Some(host) = resource
            .parse::<axum::http::Uri>()
            .ok()
            .and_then(|uri| uri.authority().map(|a| a.host().to_owned()))
        {
            options.allowed_hosts.push(host);
        }
        let mut auth = Authentication::new().api_tokens(tokens);
        if let Some(mut oauth) = self.oauth.clone() {
            if oauth.audience.is_empty() {
                oauth.audience.clone_from(&resource);
            }
            auth = auth.oauth(JwtVerifier::new(oauth)?);
        }
        Ok(FrontDoor {
            resource,
            options,
            auth,
        })
    }
}

/// Serves HTTP/1 connections of `listener` with `router` until SIGINT or SIGTERM, then lets the
/// requests in flight finish (up to [`SHUTDOWN_GRACE`]). A client that does not send a request's
/// headers within `header_read_timeout`, or keeps a connection idle that long, is disconnected.
pub async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    header_read_timeout: Duration,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let service = hyper_util::service::TowerToHyperService::new(router);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let connection =
                        graceful.watch(builder.serve_connection(TokioIo::new(stream), service.clone()));
                    tokio::spawn(async move {
                        if let Err(error) = connection.await {
                            tracing::debug!(%error, "an HTTP connection ended with an error");
                        }
                    });
                }
                Err(error) => {
                    // Mostly out of descriptors: give open connections a moment to close.
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("HTTP connections still open after the shutdown grace period are closed");
    }
}

/// The HTTP server's runtime: one worker per core, since connections are served concurrently,
/// and there the gate's blocking work (the audit log's and the stores' writes) runs in place on
/// the worker (`block_in_place`) instead of being handed to another thread and back. At most
/// `max_blocking_threads` threads wait on the disk at once.
pub fn http_runtime(max_blocking_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(max_blocking_threads)
        .build()
}

/// Resolves at SIGINT or SIGTERM (never, where signals cannot be handled).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut interrupt), Ok(mut terminate)) => {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        // No signal handling: serve until killed.
        _ => std::future::pending().await,
    }
}
