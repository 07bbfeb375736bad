//! The one grammar of the names toolgate checks: principals (the caller, from configuration or a
//! verified credential) and tools (MCP tool names). The policy, the rights file and the gate all
//! check names here, so a name one accepts the others accept too.

/// The longest principal or tool name, in bytes (all allowed characters are ASCII).
pub const MAX_NAME_BYTES: usize = 128;

/// The principal grammar in words, for error messages.
pub const PRINCIPAL_GRAMMAR: &str =
    "1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-'";

/// The tool-name grammar in words, for error messages.
pub const TOOL_GRAMMAR: &str = "1 to 128 characters from A-Z, a-z, 0-9, '_', '-' and '.'";

fn is_name(s: &str, extra: &[u8]) -> bool {
    (1..=MAX_NAME_BYTES).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// Whether `s` is a principal name: [`PRINCIPAL_GRAMMAR`].
pub fn is_principal_name(s: &str) -> bool {
    is_name(s, b"_.@:-")
}

/// Whether `s` is a tool name: [`TOOL_GRAMMAR`] (the rights file's `*` is not one).
pub fn is_tool_name(s: &str) -> bool {
    is_name(s, b"_.-")
}

/// The OAuth scope grammar in words, for error messages.
pub const SCOPE_GRAMMAR: &str =
    "1 to 128 printable ASCII characters without spaces, '\"' or '\\' (RFC 6749, section 3.3)";

/// Whether `s` is an OAuth scope token (RFC 6749, section 3.3: `%x21 / %x23-5B / %x5D-7E`), at
/// most [`MAX_NAME_BYTES`]: [`SCOPE_GRAMMAR`].
pub fn is_scope(s: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&s.len())
        && s.bytes()
            .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// The longest authority (an OAuth issuer identifier) an identity may name, in bytes.
pub const MAX_AUTHORITY_BYTES: usize = 256;

/// The identity grammar in words, for error messages.
pub const IDENTITY_GRAMMAR: &str = "[AUTHORITY#][TENANT/]NAME, where NAME and TENANT are 1 to 128 \
     characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-', and AUTHORITY (an OAuth issuer) is \
     1 to 256 printable ASCII characters without '#'";

/// Whether `s` is an authority: an OAuth issuer identifier as an identity names it, 1 to
/// [`MAX_AUTHORITY_BYTES`] printable ASCII characters without `#` (issuer identifiers have no
/// fragment, RFC 8414).
pub fn is_authority(s: &str) -> bool {
    (1..=MAX_AUTHORITY_BYTES).contains(&s.len())
        && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'#')
}

/// The identity key of a caller: the one string every per-principal store (the policy's
/// `principals` and `rate_limits.principals` sections, the rights file, rate buckets,
/// exactly-once records, pending confirmations) and the audit line's `principal` use.
///
/// - `name` for a principal of this server's own credentials (stdio's configured principal, an
///   API token of the ledger) without a tenant: unchanged from before tenants and issuers;
/// - `TENANT/name` for one in a tenant;
/// - `AUTHORITY#name` or `AUTHORITY#TENANT/name` for a principal an OAuth issuer vouches for,
///   the authority being the issuer identifier (`https://idp.example#alice`).
///
/// Names and tenants cannot contain `/` or `#`, and authorities cannot contain `#`, so two
/// different identities never have the same key: an issuer's `alice` is not the ledger's
/// `alice`, and `alice` of tenant `acme` is not `alice` of tenant `globex`.
pub fn identity_key(authority: Option<&str>, tenant: Option<&str>, name: &str) -> String {
    let mut key = String::with_capacity(
        authority.map_or(0, |a| a.len() + 1) + tenant.map_or(0, |t| t.len() + 1) + name.len(),
    );
    if let Some(authority) = authority {
        key.push_str(authority);
        key.push('#');
    }
    if let Some(tenant) = tenant {
        key.push_str(tenant);
        key.push('/');
    }
    key.push_str(name);
    key
}

/// Whether `s` is an identity key ([`IDENTITY_GRAMMAR`]), as [`identity_key`] makes them.
pub fn is_identity_key(s: &str) -> bool {
    let (authority, rest) = match s.split_once('#') {
        Some((authority, rest)) => (Some(authority), rest),
        None => (None, s),
    };
    let (tenant, name) = match rest.split_once('/') {
        Some((tenant, name)) => (Some(tenant), name),
        None => (None, rest),
    };
    authority.is_none_or(is_authority)
        && tenant.is_none_or(is_principal_name)
        && is_principal_name(name)
}

/// The longest attribute key (an API token's `--attr`, the Cedar entities file), in bytes.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 64;
/// The longest attribute value, in characters.
pub const MAX_ATTRIBUTE_VALUE_CHARS: usize = 256;

/// Whether `key` is 1 to 64 of `a-z`, `0-9` and `_`, starting with a letter: the key of an
/// attribute given to Cedar policies, and a tool's tag in a policy.
pub fn is_attribute_key(key: &str) -> bool {
    key.len() <= MAX_ATTRIBUTE_KEY_BYTES
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Checks an attribute given to Cedar policies as a tag of the principal: the key is 1 to 64 of
/// `a-z`, `0-9` and `_`, starting with a letter; the value 1 to 256 characters without control
/// characters. `Err` says which rule is broken.
pub fn check_attribute(key: &str, value: &str) -> Result<(), &'static str> {
    if !is_attribute_key(key) {
        return Err("a key is 1 to 64 of a-z, 0-9 and '_', starting with a letter");
    }
    if value.is_empty()
        || value.chars().count() > MAX_ATTRIBUTE_VALUE_CHARS
        || value.chars().any(char::is_control)
    {
        return Err("a value is 1 to 256 characters without control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes() {
        for ok in [
            "notes:write",
            "read",
            "https://api.example/notes.write",
            "!",
        ] {
            assert!(is_scope(ok), "{ok}");
        }
        for bad in ["", "a b", "a\"b", "a\\b", "é", &"s".repeat(129)] {
            assert!(!is_scope(bad), "{bad}");
        }
    }

    #[test]
    fn the_grammars() {
        for ok in [
            "local",
            "alice@example.com",
            "svc:ci-bot_1",
            &"p".repeat(128),
        ] {
            assert!(is_principal_name(ok), "{ok}");
        }
        for bad in ["", "a b", "é", "a/b", &"p".repeat(129)] {
            assert!(!is_principal_name(bad), "{bad}");
        }
        for (authority, tenant, name) in [
            (None, None, "alice"),
            (None, Some("acme"), "alice"),
            (Some("https://idp.example/realm"), None, "alice"),
            (Some("https://idp.example"), Some("acme"), "svc:bot"),
        ] {
            let key = identity_key(authority, tenant, name);
            assert!(is_identity_key(&key), "{key}");
        }
        assert_eq!(identity_key(None, None, "alice"), "alice");
        assert_eq!(identity_key(None, Some("acme"), "alice"), "acme/alice");
        assert_eq!(
            identity_key(Some("https://i.example"), Some("acme"), "alice"),
            "https://i.example#acme/alice"
        );
        for bad in [
            "",
            "a/b/c",
            "#alice",
            "i#",
            "i#a#b",
            "/alice",
            "acme/",
            "i x#alice",
            &format!("{}#a", "i".repeat(257)),
        ] {
            assert!(!is_identity_key(bad), "{bad}");
        }
        for ok in ["write_note", "x.y", "rm-rf", &"t".repeat(128)] {
            assert!(is_tool_name(ok), "{ok}");
        }
        for bad in ["", "*", "a@b", "a:b", "a b", &"t".repeat(129)] {
            assert!(!is_tool_name(bad), "{bad}");
        }
    }
}
