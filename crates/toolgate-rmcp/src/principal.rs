//! Who is calling. The gate asks its [`PrincipalSource`] on every `tools/list` and `tools/call`,
//! with the request's extensions, so nothing assumes one principal per process: over stdio the
//! source is the configured name ([`FixedPrincipal`]); a transport that authenticates its callers
//! puts a [`VerifiedPrincipal`] into each request's extensions and [`FromExtensions`] reads it.
//!
//! The principal decides the policy section, the rights, the rate-limit bucket, the scope of
//! exactly-once keys and of pending confirmations, and is recorded in every audit line. It never
//! comes from a tool's arguments. What the gate receives is the caller's whole identity as one
//! string, its identity key ([`VerifiedPrincipal::key`], defined by
//! `toolgate_canon::names::identity_key`): the authority that vouches for it (an OAuth issuer, or
//! none for this server's own credentials), its tenant and its name, so every store keeps two
//! identities apart that share a name.

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

    /// The whole credential of the request (tenant, scopes, channel), for sources that verify
    /// one; `None` (the default) for sources that only name the principal.
    fn credential(&self, _extensions: &Extensions) -> Option<VerifiedPrincipal> {
        None
    }
}

pub use toolgate_policy::credential::{InvalidPrincipal, VerifiedPrincipal};

/// One principal for every request: the configured caller of a stdio server.
#[derive(Debug, Clone)]
pub struct FixedPrincipal(Arc<str>);

impl FixedPrincipal {
    /// The source that names `name` for every request.
    pub fn new(name: &str) -> Result<Self, InvalidPrincipal> {
        VerifiedPrincipal::new(name).map(|principal| FixedPrincipal(principal.key().into()))
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

/// The [`VerifiedPrincipal`] of a request: in its extensions, or, over Streamable HTTP, in the
/// extensions of the HTTP request's parts that rmcp attaches (where the authentication layer put
/// it).
pub(crate) fn verified(extensions: &Extensions) -> Option<&VerifiedPrincipal> {
    extensions.get::<VerifiedPrincipal>().or_else(|| {
        extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<VerifiedPrincipal>())
    })
}

/// The principal is the [`VerifiedPrincipal`] in the request's extensions; a request without one
/// is refused.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromExtensions;

impl PrincipalSource for FromExtensions {
    fn principal(&self, extensions: &Extensions) -> Option<Arc<str>> {
        verified(extensions).map(VerifiedPrincipal::shared_key)
    }

    fn credential(&self, extensions: &Extensions) -> Option<VerifiedPrincipal> {
        verified(extensions).cloned()
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
