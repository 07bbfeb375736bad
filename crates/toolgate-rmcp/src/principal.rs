//! Who is calling. The gate asks its [`PrincipalSource`] on every `tools/list` and `tools/call`,
//! with the request's extensions, so nothing assumes one principal per process: over stdio the
//! source is the configured name ([`FixedPrincipal`]); a transport that authenticates its callers
//! puts a [`VerifiedPrincipal`] into each request's extensions and [`FromExtensions`] reads it.
//!
//! The principal decides the policy section, the rights, the rate-limit bucket, the scope of
//! exactly-once keys and of pending confirmations, and is recorded in every audit line. It never
//! comes from a tool's arguments.

use std::fmt;
use std::sync::Arc;

use rmcp::model::Extensions;

/// Where the gate gets the principal of a request.
pub trait PrincipalSource: Send + Sync + fmt::Debug + 'static {
    /// The principal of the request carrying `extensions`, or `None` when the request has no
    /// identity: the gate then refuses it (and audits the refusal).
    fn principal(&self, extensions: &Extensions) -> Option<Arc<str>>;

    /// The principal of a lookup that comes with no request (rmcp's `get_tool`, which the HTTP
    /// transport uses to validate headers against a tool's schema): a fixed source's own name.
    /// `None` (the default) for sources that depend on the request; the gate then answers such a
    /// lookup from the policy's top level, without any principal's section or rights.
    fn without_request(&self) -> Option<Arc<str>> {
        None
    }
}

/// The principal name is not one the rights file and the policy can name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid principal name: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-'"
)]
#[non_exhaustive]
pub struct InvalidPrincipal;

fn checked(name: &str) -> Result<Arc<str>, InvalidPrincipal> {
    if toolgate_canon::names::is_principal_name(name) {
        Ok(Arc::from(name))
    } else {
        Err(InvalidPrincipal)
    }
}

/// One principal for every request: the configured caller of a stdio server.
#[derive(Debug, Clone)]
pub struct FixedPrincipal(Arc<str>);

impl FixedPrincipal {
    /// The source that names `name` for every request.
    pub fn new(name: &str) -> Result<Self, InvalidPrincipal> {
        checked(name).map(FixedPrincipal)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl PrincipalSource for FixedPrincipal {
    fn principal(&self, _extensions: &Extensions) -> Option<Arc<str>> {
        Some(Arc::clone(&self.0))
    }

    fn without_request(&self) -> Option<Arc<str>> {
        Some(Arc::clone(&self.0))
    }
}

/// An identity the transport verified (a bearer token's subject, an API token's principal), put
/// into the request's extensions by the layer that verified it. Only code that authenticates may
/// construct one; the gate never derives it from anything the caller sends in MCP messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPrincipal(Arc<str>);

impl VerifiedPrincipal {
    /// The verified identity `name`, if it is a valid principal name.
    pub fn new(name: &str) -> Result<Self, InvalidPrincipal> {
        checked(name).map(VerifiedPrincipal)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// The principal is the [`VerifiedPrincipal`] in the request's extensions; a request without one
/// is refused.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromExtensions;

impl PrincipalSource for FromExtensions {
    fn principal(&self, extensions: &Extensions) -> Option<Arc<str>> {
        let verified = extensions.get::<VerifiedPrincipal>();
        // Over Streamable HTTP, rmcp hands the handler the HTTP request's parts, whose extensions
        // hold what the authentication layer verified.
        #[cfg(feature = "http")]
        let verified = verified.or_else(|| {
            extensions
                .get::<axum::http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<VerifiedPrincipal>())
        });
        verified.map(|verified| Arc::clone(&verified.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_sources_answer() {
        assert!(FixedPrincipal::new("").is_err());
        assert!(VerifiedPrincipal::new("a b").is_err());
        let fixed = FixedPrincipal::new("local").unwrap_or_else(|e| panic!("{e}"));
        let empty = Extensions::new();
        assert_eq!(fixed.principal(&empty).as_deref(), Some("local"));
        assert_eq!(fixed.without_request().as_deref(), Some("local"));
        assert_eq!(FromExtensions.principal(&empty), None);
        assert_eq!(FromExtensions.without_request(), None);
        let mut extensions = Extensions::new();
        extensions
            .insert(VerifiedPrincipal::new("alice@example").unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(
            FromExtensions.principal(&extensions).as_deref(),
            Some("alice@example")
        );
    }
}
