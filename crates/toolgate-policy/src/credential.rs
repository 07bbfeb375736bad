//! What a verified credential says about its holder: the identity (name, tenant, the authority
//! that vouches for it) and what the gate and the Cedar policies decide with (scopes, channel,
//! roles, attributes). A transport that authenticates its callers builds one per request; the
//! gate never derives it from anything the caller sends in MCP messages.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The principal name is not one the rights file and the policy can name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid principal name: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-'"
)]
#[non_exhaustive]
pub struct InvalidPrincipal;

pub(crate) fn checked(name: &str) -> Result<Arc<str>, InvalidPrincipal> {
    if toolgate_canon::names::is_principal_name(name) {
        Ok(Arc::from(name))
    } else {
        Err(InvalidPrincipal)
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

    /// [`VerifiedPrincipal::key`], shared (no copy).
    pub fn shared_key(&self) -> Arc<str> {
        Arc::clone(&self.key)
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

#[cfg(test)]
mod tests {
    use super::*;

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
