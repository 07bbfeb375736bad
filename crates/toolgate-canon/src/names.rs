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
        for ok in ["write_note", "x.y", "rm-rf", &"t".repeat(128)] {
            assert!(is_tool_name(ok), "{ok}");
        }
        for bad in ["", "*", "a@b", "a:b", "a b", &"t".repeat(129)] {
            assert!(!is_tool_name(bad), "{bad}");
        }
    }
}
