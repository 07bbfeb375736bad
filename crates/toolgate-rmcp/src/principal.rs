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

use std::collections::{BTreeMap, BTreeSet};
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
/// into the request's extensions by the layer that verified it, with what the credential says
/// besides: the tenant, the scopes, and the channel it came through. Only code that authenticates
/// may construct one; the gate never derives it from anything the caller sends in MCP messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPrincipal {
    name: Arc<str>,
    tenant: Option<Arc<str>>,
    /// Who vouches for the name: an OAuth issuer; `None` for this server's own credentials.
    authority: Option<Arc<str>>,
    /// The identity key of (authority, tenant, name), kept with them.
    key: Arc<str>,
    scopes: Option<Arc<BTreeSet<String>>>,
    channel: Option<&'static str>,
    /// The roles the credential names (Cedar: `principal in Toolgate::Role::"admin"`).
    roles: Arc<BTreeSet<String>>,
    /// Its other attributes (Cedar: the principal's tags).
    attributes: Arc<BTreeMap<String, String>>,
}

impl VerifiedPrincipal {
    /// The verified identity `name`, if it is a valid principal name.
    pub fn new(name: &str) -> Result<Self, InvalidPrincipal> {
        let name = checked(name)?;
        Ok(VerifiedPrincipal {
            key: Arc::clone(&name),
            name,
            tenant: None,
            authority: None,
            scopes: None,
            channel: None,
            roles: Arc::default(),
            attributes: Arc::default(),
        })
    }

    /// The same name in `tenant` (a name with the principal names' rules): another identity,
    /// recorded in the audit log and consulted by the per-tenant kill switch.
    pub fn with_tenant(mut self, tenant: &str) -> Result<Self, InvalidPrincipal> {
        self.tenant = Some(checked(tenant)?);
        self.key = self.identity_key();
        Ok(self)
    }

    /// The same name as vouched for by `authority` (an OAuth issuer identifier: 1 to 256
    /// printable ASCII characters without `#`): another identity than the name of this server's
    /// own credentials, or of another issuer.
    pub fn with_authority(mut self, authority: &str) -> Result<Self, InvalidPrincipal> {
        if !toolgate_canon::names::is_authority(authority) {
            return Err(InvalidPrincipal);
        }
        self.authority = Some(Arc::from(authority));
        self.key = self.identity_key();
        Ok(self)
    }

    fn identity_key(&self) -> Arc<str> {
        toolgate_canon::names::identity_key(
            self.authority.as_deref(),
            self.tenant.as_deref(),
            &self.name,
        )
        .into()
    }

    /// The same identity limited to `scopes`: a tool the policy puts under scopes (`scopes` in
    /// the policy) is hidden and refused unless one of them is here. Without this call the
    /// credential is not scoped and the scopes do not apply.
    pub fn with_scopes(mut self, scopes: impl IntoIterator<Item = String>) -> Self {
        self.scopes = Some(Arc::new(scopes.into_iter().collect()));
        self
    }

    /// The same identity, recorded as having come through `channel` (`"http"`).
    pub fn with_channel(mut self, channel: &'static str) -> Self {
        self.channel = Some(channel);
        self
    }

    /// The same identity as a member of `roles` (from an API token's `role` attributes, or the
    /// JWT claim an operator maps to roles): what Cedar policies test with
    /// `principal in Toolgate::Role::"..."`. Not part of the identity key.
    pub fn with_roles(mut self, roles: impl IntoIterator<Item = String>) -> Self {
        self.roles = Arc::new(roles.into_iter().collect());
        self
    }

    /// The same identity with `attributes` (an API token's other `--attr KEY=VALUE`, the JWT
    /// claims an operator maps), which Cedar policies read as the principal's tags. Not part of
    /// the identity key.
    pub fn with_attributes(
        mut self,
        attributes: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        self.attributes = Arc::new(attributes.into_iter().collect());
        self
    }

    /// The roles the credential names.
    pub fn roles(&self) -> &BTreeSet<String> {
        &self.roles
    }

    /// The credential's other attributes.
    pub fn attributes(&self) -> &BTreeMap<String, String> {
        &self.attributes
    }

    /// The name (within its authority and tenant).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The identity key: the one string naming this identity in every store, in the policy's
    /// `principals` sections, the rights file, and the audit line's `principal`
    /// (`toolgate_canon::names::identity_key`: `name`, `TENANT/name`, `ISSUER#name` or
    /// `ISSUER#TENANT/name`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The authority (OAuth issuer) that vouches for the name; `None` for this server's own.
    pub fn authority(&self) -> Option<&str> {
        self.authority.as_deref()
    }

    /// The tenant, if the credential names one.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The scopes, if the credential is scoped.
    pub fn scopes(&self) -> Option<&BTreeSet<String>> {
        self.scopes.as_deref()
    }

    /// The channel, if the verifying layer named it.
    pub fn channel(&self) -> Option<&'static str> {
        self.channel
    }

    /// Whether this credential may reach a tool that needs one of `required` (`None`: the tool
    /// needs no scope). An unscoped credential reaches every tool.
    pub fn grants(&self, required: Option<&BTreeSet<String>>) -> bool {
        match (self.scopes.as_deref(), required) {
            (Some(held), Some(required)) => required.iter().any(|scope| held.contains(scope)),
            _ => true,
        }
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
        verified(extensions).map(|verified| Arc::clone(&verified.key))
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

    #[test]
    fn scopes_limit_only_scoped_tools() {
        let required: BTreeSet<String> = ["notes:write".to_owned()].into();
        let unscoped = VerifiedPrincipal::new("a").unwrap_or_else(|e| panic!("{e}"));
        assert!(unscoped.grants(Some(&required)) && unscoped.grants(None));
        let reader = unscoped.clone().with_scopes(["notes:read".to_owned()]);
        assert!(!reader.grants(Some(&required)) && reader.grants(None));
        let writer = unscoped.with_scopes(["notes:write".to_owned()]);
        assert!(writer.grants(Some(&required)));
        assert!(writer.clone().with_tenant("bad tenant").is_err());
        let acme = writer.with_tenant("acme").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(acme.tenant(), Some("acme"));
        assert_eq!(acme.key(), "acme/a");
        let issued = acme
            .clone()
            .with_authority("https://idp.example")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(issued.key(), "https://idp.example#acme/a");
        assert_ne!(issued, acme);
        assert!(acme.with_authority("a#b").is_err());
    }
}
