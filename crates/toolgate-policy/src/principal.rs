//! Principal names and the per-principal sections (`principals.<name>`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::PolicyError;
use crate::rules::ArgRule;

/// A principal (the authenticated caller) as the policy names it: its identity key
/// (`toolgate_canon::names::identity_key`): a name of 1 to 128 characters from
/// `A-Z a-z 0-9 _ . @ : -`, preceded by `TENANT/` for a principal in a tenant and by
/// `ISSUER#` for one an OAuth issuer vouches for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Principal(String);

impl Principal {
    /// Checks `name` against the principal grammar.
    pub fn new(name: &str) -> Result<Self, PolicyError> {
        if toolgate_canon::names::is_identity_key(name) {
            Ok(Principal(name.to_owned()))
        } else {
            Err(PolicyError::Invalid {
                reason: format!(
                    "{name:?} is not a valid principal name; use {}",
                    toolgate_canon::names::IDENTITY_GRAMMAR
                ),
            })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One `principals.<name>` section, validated.
#[derive(Debug, Clone, Default)]
pub(crate) struct PrincipalSection {
    pub(crate) allow: BTreeSet<String>,
    pub(crate) deny: BTreeSet<String>,
    pub(crate) arg_rules: BTreeMap<String, BTreeMap<String, ArgRule>>,
}

impl PrincipalSection {
    /// Whether the section says anything about `tool` (it then belongs in the tool's fingerprint).
    pub(crate) fn mentions(&self, tool: &str) -> bool {
        self.allow.contains(tool) || self.deny.contains(tool) || self.arg_rules.contains_key(tool)
    }
}
