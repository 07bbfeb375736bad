//! The idempotency key newtype: checked once at construction, trusted everywhere after.

use toolgate_canon::Sha256Digest;

use crate::CommitError;

/// The longest key accepted, in bytes of UTF-8.
///
/// Keys come from tool arguments (an untrusted caller), so a bound keeps one request from making the
/// store hash and log arbitrarily large strings; 1024 bytes is far above any realistic request id.
const MAX_KEY_BYTES: usize = 1024;

/// An idempotency key: non-empty, at most 1024 bytes of UTF-8, no control characters.
///
/// The store never uses the key text as a name; it uses [`IdempotencyKey::digest`], so any such
/// string is safe on every backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses a key, rejecting empty strings, strings over 1024 bytes and control characters.
    ///
    /// The error never quotes the key, because keys are caller input and errors reach logs.
    pub fn new(s: impl Into<String>) -> Result<Self, CommitError> {
        let s = s.into();
        if s.is_empty() {
            return Err(CommitError::InvalidKey {
                reason: "the key is empty".to_owned(),
            });
        }
        if s.len() > MAX_KEY_BYTES {
            return Err(CommitError::InvalidKey {
                reason: format!(
                    "the key is {} bytes long, the limit is {MAX_KEY_BYTES}",
                    s.len()
                ),
            });
        }
        if let Some((offset, c)) = s.char_indices().find(|(_, c)| c.is_control()) {
            return Err(CommitError::InvalidKey {
                reason: format!(
                    "the key contains control character U+{:04X} at byte offset {offset}",
                    u32::from(c)
                ),
            });
        }
        Ok(IdempotencyKey(s))
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The SHA-256 of the key's UTF-8 bytes; the file store names the key's file after its hex form.
    pub fn digest(&self) -> Sha256Digest {
        Sha256Digest::of(self.0.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_invalid(input: &str, reason_contains: &str) {
        match IdempotencyKey::new(input) {
            Err(CommitError::InvalidKey { reason }) => {
                assert!(reason.contains(reason_contains), "{reason:?}");
            }
            other => panic!("expected InvalidKey for {input:?}, got {other:?}"),
        }
    }

    #[test]
    fn invalid_keys_are_rejected() {
        check_invalid("", "empty");
        check_invalid(&"a".repeat(1025), "1025 bytes");
        // 513 two-byte characters: 513 characters but 1026 bytes, so the limit counts bytes.
        check_invalid(&"é".repeat(513), "1026 bytes");
        check_invalid("req\n0001", "U+000A at byte offset 3");
        check_invalid("\u{7f}", "U+007F");
        check_invalid("a\u{85}", "U+0085");
        check_invalid("tab\there", "U+0009");
    }

    #[test]
    fn valid_keys_are_kept_verbatim() {
        for input in [
            "a",
            "req-0001",
            " spaces are fine ",
            "ção 😀",
            &"x".repeat(1024),
        ] {
            let key = IdempotencyKey::new(input).unwrap();
            assert_eq!(key.as_str(), input);
        }
        let max_multibyte = "é".repeat(512);
        assert!(IdempotencyKey::new(max_multibyte).is_ok());
    }

    #[test]
    fn invalid_key_error_does_not_quote_the_key() {
        let secret = format!("secret-token{}", "z".repeat(1100));
        let err = IdempotencyKey::new(secret).unwrap_err().to_string();
        assert!(!err.contains("secret-token"), "{err}");
        let err = IdempotencyKey::new("secret\u{0}").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn digest_is_sha256_of_utf8_bytes() {
        let key = IdempotencyKey::new("abc").unwrap();
        assert_eq!(
            key.digest().to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
