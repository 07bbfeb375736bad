//! TLS to PostgreSQL: the `sslmode` and `sslrootcert` of a store URL, and the driver's TLS
//! connector over rustls (ring provider).
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` and encrypts without checking the
//! server's certificate; it has no `verify-ca`, `verify-full` or `sslrootcert`. So the two keys are
//! taken out of the URL here (both the `postgres://` and the `key=value` form), the driver is told
//! only whether to ask for TLS, and the certificate is checked by the connector built here:
//!
//! | `sslmode`     | encrypted | chain checked against the roots | host name checked |
//! |---------------|-----------|---------------------------------|-------------------|
//! | `disable`     | no        | -                               | -                 |
//! | `require`     | yes       | only when `sslrootcert` is given (as libpq does) | no |
//! | `verify-ca`   | yes       | yes                             | no                |
//! | `verify-full` | yes       | yes                             | yes               |
//!
//! Without `sslmode` the mode is `verify-full`, except for a loopback host (`localhost`,
//! `127.0.0.0/8`, `::1`, a Unix socket) named without `sslrootcert`, which stays unencrypted as
//! before: traffic that never leaves the machine. `prefer` and `allow` are refused: they fall back
//! to plain text when the server (or an attacker on the path) declines TLS. The roots are the
//! PEM file of `sslrootcert`, or the operating system's when it is absent or `system`.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::PgError;

/// How the connections of a store are protected (`sslmode` of its URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// No TLS.
    Disable,
    /// TLS that does not authenticate the server (unless `sslrootcert` is given).
    Require,
    /// TLS with the server's chain checked against the roots, not its name.
    VerifyCa,
    /// TLS with the chain and the host name checked.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, PgError> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            "prefer" | "allow" => Err(PgError::Url {
                reason: format!(
                    "sslmode={value} falls back to an unencrypted connection when the server, or anyone on the path, declines TLS; write sslmode=verify-full (or verify-ca, require), or sslmode=disable to go without TLS knowingly"
                ),
            }),
            // The value is not quoted: a mistyped URL may have put anything there.
            _ => Err(PgError::Url {
                reason: "sslmode must be one of disable, require, verify-ca, verify-full"
                    .to_owned(),
            }),
        }
    }

    /// The URL's spelling.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the trusted roots come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// The operating system's root certificates (`sslrootcert` absent or `system`).
    System,
    /// The certificates of a PEM file.
    File(PathBuf),
}

impl fmt::Display for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Roots::System => f.write_str("the operating system's root certificates"),
            Roots::File(path) => write!(f, "sslrootcert={}", path.display()),
        }
    }
}

/// The TLS keys of a URL, before defaults.
#[derive(Debug, Default, PartialEq, Eq)]
struct Requested {
    sslmode: Option<SslMode>,
    sslrootcert: Option<Roots>,
}

impl Requested {
    fn set(&mut self, key: &str, value: &str) -> Result<bool, PgError> {
        match key {
            "sslmode" => self.sslmode = Some(SslMode::parse(value)?),
            "sslrootcert" => {
                self.sslrootcert = Some(match value {
                    "" => {
                        return Err(PgError::Url {
                            reason: "sslrootcert is empty; give the path of a PEM file of the CA certificates that may sign the server's certificate, or `system`".to_owned(),
                        });
                    }
                    "system" => Roots::System,
                    path => Roots::File(PathBuf::from(path)),
                });
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A store URL with its TLS keys taken out (the rest is for the driver) and the connector they
/// ask for.
pub(crate) struct Parsed {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: PgTls,
}

/// Parses `url`: its `sslmode` and `sslrootcert` here, the rest by the driver; applies the
/// defaults and loads the roots.
pub(crate) fn parse(url: &str) -> Result<Parsed, PgError> {
    let (rest, requested) = split(url)?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e: tokio_postgres::Error| {
        PgError::Url {
            // The driver's parse errors quote no part of the URL.
            reason: e.to_string(),
        }
    })?;
    let mode = match requested.sslmode {
        Some(mode) => mode,
        None if requested.sslrootcert.is_none() && is_loopback(&config) => SslMode::Disable,
        None => SslMode::VerifyFull,
    };
    if mode == SslMode::Disable {
        if requested.sslrootcert.is_some() {
            return Err(PgError::Url {
                reason: "sslrootcert is given but sslmode=disable turns TLS off; leave out one of the two".to_owned(),
            });
        }
    } else if let Some(path) = config.get_hosts().iter().find_map(|host| match host {
        tokio_postgres::config::Host::Unix(path) => Some(path),
        tokio_postgres::config::Host::Tcp(_) => None,
    }) {
        return Err(PgError::Url {
            reason: format!(
                "sslmode={} asks for TLS, which PostgreSQL does not offer on a Unix socket ({}); connect over TCP, or write sslmode=disable for the socket",
                mode.name(),
                path.display()
            ),
        });
    }
    if mode != SslMode::Disable && config.get_hosts().is_empty() {
        return Err(PgError::Url {
            reason: format!(
                "sslmode={} checks the server's certificate against a host name, and the URL gives only hostaddr; add the name (host=NAME, or postgres://USER@NAME/DB?hostaddr=ADDR)",
                mode.name()
            ),
        });
    }
    config.ssl_mode(if mode == SslMode::Disable {
        tokio_postgres::config::SslMode::Disable
    } else {
        tokio_postgres::config::SslMode::Require
    });
    let roots = requested.sslrootcert.unwrap_or(Roots::System);
    let client = match mode {
        SslMode::Disable => None,
        _ => Some(Arc::new(client_config(mode, &roots)?)),
    };
    Ok(Parsed {
        config,
        tls: PgTls {
            client,
            mode,
            roots: Arc::new(roots),
        },
    })
}

/// Whether every host the configuration connects to is this machine (and so the default
/// `sslmode` may stay `disable`). A host name other than `localhost` is not: DNS decides where it
/// goes. With `hostaddr`, both the names and the addresses must be loopback.
fn is_loopback(config: &tokio_postgres::Config) -> bool {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    if hosts.is_empty() && addrs.is_empty() {
        return false;
    }
    hosts.iter().all(|host| match host {
        tokio_postgres::config::Host::Unix(_) => true,
        tokio_postgres::config::Host::Tcp(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }) && addrs.iter().all(IpAddr::is_loopback)
}

/// Takes `sslmode` and `sslrootcert` out of `url`, in either of the driver's forms.
fn split(url: &str) -> Result<(String, Requested), PgError> {
    let mut requested = Requested::default();
    let scheme = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|prefix| url.starts_with(prefix));
    if let Some(scheme) = scheme {
        // As the driver reads a URL: the credentials end at the first `@`, the parameters start
        // at the first `?` after them, and are `&`-separated, percent-encoded `key=value` pairs.
        let rest = &url[scheme.len()..];
        let authority = rest.find('@').map_or(0, |at| at + 1);
        let Some(question) = rest[authority..].find('?') else {
            return Ok((url.to_owned(), requested));
        };
        let query_start = scheme.len() + authority + question;
        let mut kept = Vec::new();
        for pair in url[query_start + 1..].split('&') {
            let taken = match pair.split_once('=') {
                Some((key, value)) => requested.set(&decode(key)?, &decode(value)?)?,
                None => false,
            };
            if !taken {
                kept.push(pair);
            }
        }
        let mut rest = url[..query_start].to_owned();
        if !kept.is_empty() {
            rest.push('?');
            rest.push_str(&kept.join("&"));
        }
        return Ok((rest, requested));
    }
    let pairs = key_values(url)?;
    if !pairs
        .iter()
        .any(|(key, _)| matches!(key.as_str(), "sslmode" | "sslrootcert"))
    {
        return Ok((url.to_owned(), requested));
    }
    let mut kept = Vec::new();
    for (key, value) in pairs {
        if !requested.set(&key, &value)? {
            let quoted = value.replace('\\', r"\\").replace('\'', r"\'");
            kept.push(format!("{key}='{quoted}'"));
        }
    }
    Ok((kept.join(" "), requested))
}

fn decode(s: &str) -> Result<String, PgError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| PgError::Url {
            reason: "a parameter is not UTF-8 once percent-decoded".to_owned(),
        })
}

/// The `key = value` pairs of a connection string, read as the driver reads them (values bare or
/// single-quoted, `\` escaping the next character).
fn key_values(s: &str) -> Result<Vec<(String, String)>, PgError> {
    let malformed = |what: &str| PgError::Url {
        reason: format!("the key=value connection string {what}"),
    };
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            if chars.peek().is_some() {
                return Err(malformed("has a value without a key"));
            }
            return Ok(pairs);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(malformed("has a key without `=`"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(malformed("has an unterminated quoted value")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(malformed("ends without a value"));
            }
        }
        pairs.push((key, value));
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration of `mode` with `roots`.
fn client_config(mode: SslMode, roots: &Roots) -> Result<ClientConfig, PgError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Url {
            reason: format!("the TLS provider has no usable protocol version: {e}"),
        })?;
    let explicit_roots = matches!(roots, Roots::File(_));
    Ok(match mode {
        SslMode::VerifyFull => builder
            .with_root_certificates(root_store(roots)?)
            .with_no_client_auth(),
        SslMode::VerifyCa | SslMode::Require if mode == SslMode::VerifyCa || explicit_roots => {
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(roots)?), provider)
                    .build()
                    .map_err(|e| PgError::RootCert {
                        roots: roots.to_string(),
                        reason: e.to_string(),
                    })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly { inner }))
                .with_no_client_auth()
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(DangerousUnauthenticated { provider }))
            .with_no_client_auth(),
    })
}

/// The trust anchors of `roots`; an empty set is an error (nothing could ever be verified).
fn root_store(roots: &Roots) -> Result<RootCertStore, PgError> {
    let refused = |reason: String| PgError::RootCert {
        roots: roots.to_string(),
        reason,
    };
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let certs = read_pem(path).map_err(refused)?;
            for cert in certs {
                store
                    .add(cert)
                    .map_err(|e| refused(format!("a certificate in it is not valid: {e}")))?;
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(refused(format!(
                    "none were found ({} errors); install the system's CA certificates or give sslrootcert=PATH",
                    found.errors.len()
                )));
            }
        }
    }
    Ok(store)
}

fn read_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read it: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("it is not a PEM file of certificates: {e}"))?;
    if certs.is_empty() {
        return Err("it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok(certs)
}

/// `verify-ca` (and `require` with `sslrootcert`): the chain must lead to a root; the name is not
/// checked. webpki checks the chain before the name, so a name mismatch means the chain passed.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `require` without `sslrootcert`: any certificate is accepted, so the connection is encrypted
/// but the server is not authenticated (whoever answers on the path can read it). The handshake's
/// signatures are still checked, so the session is at least bound to the certificate shown.
#[derive(Debug)]
struct DangerousUnauthenticated {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for DangerousUnauthenticated {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The driver's TLS connector for one store: its mode and roots, and the rustls configuration
/// (none for `disable`, where the driver never asks for TLS).
#[derive(Clone)]
pub(crate) struct PgTls {
    client: Option<Arc<ClientConfig>>,
    mode: SslMode,
    roots: Arc<Roots>,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTls")
            .field("sslmode", &self.mode.name())
            .field("roots", &self.roots.to_string())
            .finish()
    }
}

impl PgTls {
    pub(crate) fn mode(&self) -> SslMode {
        self.mode
    }
}

/// Why a TLS handshake with the server failed, as the store's error tells it.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) mode: SslMode,
    pub(crate) reason: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Refused {}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = Refused;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, Refused> {
        // The driver makes a connector for every connection, also under `disable` (where it never
        // calls it) and for a Unix socket (host ""): everything is checked when a handshake starts.
        Ok(PgTlsConnect {
            client: self.client.clone(),
            mode: self.mode,
            host: domain.to_owned(),
            roots: self.roots.clone(),
        })
    }
}

/// One handshake ([`PgTls`]).
#[derive(Debug)]
pub(crate) struct PgTlsConnect {
    client: Option<Arc<ClientConfig>>,
    mode: SslMode,
    host: String,
    roots: Arc<Roots>,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = Refused;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream<S>, Refused>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let Some(client) = self.client else {
                return Err(Refused {
                    mode: self.mode,
                    reason:
                        "the driver asked for TLS under sslmode=disable (a bug: please report it)"
                            .to_owned(),
                });
            };
            let host = &self.host;
            let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
                .map_err(|_| Refused {
                    mode: self.mode,
                    reason: format!(
                        "the host {host} is neither a DNS name nor an IP address a certificate can be checked against"
                    ),
                })?
                .to_owned();
            let connector = tokio_rustls::TlsConnector::from(client);
            match connector.connect(name, stream).await {
                Ok(stream) => Ok(PgTlsStream(stream)),
                Err(e) => Err(Refused {
                    mode: self.mode,
                    reason: explain(&e, &self.host, &self.roots),
                }),
            }
        })
    }
}

/// A handshake's failure in the operator's terms, with the fix.
fn explain(e: &io::Error, host: &str, roots: &Roots) -> String {
    use CertificateError as C;
    let Some(tls) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
        return format!("the TLS handshake failed: {e}");
    };
    match tls {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "the server's certificate is not signed by a CA in {roots}; point sslrootcert at the CA that issued the server's certificate"
        ),
        rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            format!(
                "the server's certificate is not issued for the host {host}; connect by a name the certificate holds (sslmode=verify-ca skips this check, and then any server with a certificate from that CA is accepted)"
            )
        }
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => "the server's certificate is expired or not yet valid; renew it (or check this machine's clock)".to_owned(),
        other => format!("the TLS handshake failed: {other}"),
    }
}

/// A TLS connection to the server.
#[derive(Debug)]
pub(crate) struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding (tls-server-end-point) needs the hash named by the
        // certificate's signature algorithm, which rustls does not expose; the server is
        // authenticated by verify-full instead, and the password exchange is SCRAM either way.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn check(url: &str, rest: &str, sslmode: Option<SslMode>, sslrootcert: Option<&str>) {
        let (got_rest, got) = split(url).unwrap();
        assert_eq!(got_rest, rest, "{url}");
        let expected = Requested {
            sslmode,
            sslrootcert: sslrootcert.map(|r| match r {
                "system" => Roots::System,
                path => Roots::File(path.into()),
            }),
        };
        assert_eq!(got, expected, "{url}");
    }

    #[test]
    fn the_tls_keys_are_taken_out_of_both_forms() {
        use SslMode::*;
        check("postgres://u:p@h:1/db", "postgres://u:p@h:1/db", None, None);
        check(
            "postgres://u:p?x@h/db?sslmode=verify-ca&application_name=a&sslrootcert=%2Ftmp%2Fca.pem",
            "postgres://u:p?x@h/db?application_name=a",
            Some(VerifyCa),
            Some("/tmp/ca.pem"),
        );
        check(
            "postgresql://h/db?sslmode=require",
            "postgresql://h/db",
            Some(Require),
            None,
        );
        check(
            "host=h user=u password='a b\\'c' sslmode = verify-full sslrootcert=system",
            r"host='h' user='u' password='a b\'c'",
            Some(VerifyFull),
            Some("system"),
        );
        check("host=h user=u", "host=h user=u", None, None);
        assert!(matches!(split("host=h sslmode"), Err(PgError::Url { .. })));
    }

    #[test]
    fn weak_or_unknown_modes_are_refused_without_quoting_the_url() {
        for url in [
            "postgres://u:s3cret@h/db?sslmode=prefer",
            "postgres://u:s3cret@h/db?sslmode=allow",
            "postgres://u:s3cret@h/db?sslmode=s3cret",
            "postgres://u:s3cret@h/db?sslrootcert=",
            "host=h password=s3cret sslmode=verify_full",
            "host=h password='s3cret sslmode=verify-full",
        ] {
            let err = match split(url) {
                Err(e) => e,
                Ok(_) => match parse(url) {
                    Err(e) => e,
                    Ok(_) => panic!("{url} was accepted"),
                },
            };
            let text = err.to_string();
            assert!(matches!(err, PgError::Url { .. }), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    fn mode_of(url: &str) -> SslMode {
        parse(url).unwrap().tls.mode()
    }

    #[test]
    fn verify_full_is_the_default_off_loopback() {
        use SslMode::*;
        for (url, mode) in [
            ("postgres://u@127.0.0.1/db", Disable),
            ("postgres://u@localhost/db", Disable),
            ("postgres://u@[::1]:5432/db", Disable),
            ("host=/run/postgresql user=u", Disable),
            ("postgres://u@db.example/db", VerifyFull),
            ("postgres://u@10.0.0.7/db", VerifyFull),
            ("postgres://u@127.0.0.1,db.example/db", VerifyFull),
            ("postgres://u@db.example/db?hostaddr=127.0.0.1", VerifyFull),
            ("postgres://u@db.example/db?sslmode=disable", Disable),
            ("postgres://u@db.example/db?sslmode=verify-ca", VerifyCa),
            ("postgres://u@127.0.0.1/db?sslrootcert=system", VerifyFull),
        ] {
            assert_eq!(mode_of(url), mode, "{url}");
        }
    }

    #[test]
    fn contradictions_are_refused() {
        for url in [
            "postgres://u@127.0.0.1/db?sslmode=disable&sslrootcert=/tmp/ca.pem",
            "host=/run/postgresql user=u sslmode=require",
            "hostaddr=10.0.0.7 user=u",
        ] {
            let err = parse(url).err().unwrap();
            assert!(matches!(err, PgError::Url { .. }), "{err}");
        }
    }

    #[test]
    fn an_unreadable_or_empty_root_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for path in [dir.path().join("missing.pem"), empty] {
            let url = format!(
                "postgres://u:s3cret@db.example/db?sslrootcert={}",
                path.display()
            );
            let err = parse(&url).err().unwrap();
            let text = err.to_string();
            assert!(matches!(err, PgError::RootCert { .. }), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }
}
