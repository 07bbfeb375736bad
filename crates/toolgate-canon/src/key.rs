//! `HmacKey`: an HMAC-SHA256 key checked for length, shared by attestation and audit checkpoints.
//!
//! Both signers need the same rules (a minimum length, the same key-file convention, a redacted
//! `Debug`, constant-time verification), so they live once here. Reading the key file is left to
//! the callers: this crate performs no I/O.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// The shortest HMAC key accepted, in bytes: the output size of SHA-256, below which the key, not
/// the hash, bounds the strength of the MAC (RFC 2104 section 3).
pub const MIN_KEY_BYTES: usize = 32;

/// The largest key file read: a key is 32 to a few hundred bytes, so anything larger is not one.
pub const MAX_KEY_FILE_BYTES: u64 = 4096;

/// Why bytes were not accepted as an HMAC key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is shorter than [`MIN_KEY_BYTES`].
    #[error(
        "the HMAC key is {len} bytes, at least 32 are required; generate one with \
         `head -c 32 /dev/urandom > key` and keep it outside the ledger and the repository"
    )]
    TooShort {
        /// The length of the rejected key, in bytes.
        len: usize,
    },
}

/// An HMAC-SHA256 key of at least [`MIN_KEY_BYTES`] bytes.
///
/// It keeps the keyed HMAC state (inner and outer pads already absorbed), cloned for every message,
/// and a short public identifier; the raw key bytes are not kept.
#[derive(Clone)]
pub struct HmacKey {
    mac: Hmac<Sha256>,
    key_id: String,
}

impl fmt::Debug for HmacKey {
    // Written by hand so that the key (or the state derived from it) never reaches a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HmacKey")
            .field("key_id", &self.key_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl HmacKey {
    /// A key made of exactly `key`, which must be at least [`MIN_KEY_BYTES`] long.
    pub fn new(key: &[u8]) -> Result<Self, KeyError> {
        if key.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort { len: key.len() });
        }
        // HMAC accepts keys of any length (long ones are hashed first), so `new_from_slice` cannot
        // fail for `Hmac<Sha256>`; the fallback keeps that invariant without a panic path by
        // treating it like a too-short key.
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
            .map_err(|_| KeyError::TooShort { len: key.len() })?;
        let digest = Sha256::digest(key);
        let mut key_id = String::with_capacity(16);
        for byte in &digest[..8] {
            key_id.push_str(&format!("{byte:02x}"));
        }
        Ok(HmacKey { mac, key_id })
    }

    /// A key from the contents of a key file: the raw bytes with exactly one trailing line ending
    /// (`"\n"` or `"\r\n"`) removed, because editors and `echo` add one. Nothing else is trimmed or
    /// decoded: a file holding 64 hex characters is a 64-byte key made of those characters.
    pub fn from_file_bytes(bytes: Vec<u8>) -> Result<Self, KeyError> {
        let key = bytes
            .strip_suffix(b"\r\n")
            .or_else(|| bytes.strip_suffix(b"\n"))
            .unwrap_or(&bytes);
        Self::new(key)
    }

    /// HMAC-SHA256 of `msg` under this key.
    pub fn mac(&self, msg: &[u8]) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(msg);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the HMAC of `msg`, compared in constant time; a tag of the wrong length is
    /// rejected.
    pub fn verify(&self, msg: &[u8], tag: &[u8]) -> bool {
        let expected = self.mac(msg);
        tag.len() == expected.len() && bool::from(expected.as_slice().ct_eq(tag))
    }

    /// A public identifier of the key: the first 16 hex characters of the SHA-256 of the key
    /// bytes. It tells an operator which key a signature claims, without revealing the key.
    pub fn key_id(&self) -> String {
        self.key_id.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_matches_an_independent_implementation_and_verify_is_strict() {
        // RFC 4231's vectors use keys shorter than 32 bytes, so the expected value was computed
        // independently: python3 -c 'import hmac,hashlib; print(hmac.new(b"k"*32, b"msg",
        // hashlib.sha256).hexdigest())'.
        let key = HmacKey::new(&[b'k'; 32]).unwrap();
        let tag = key.mac(b"msg");
        assert_eq!(
            crate::Sha256Digest::from_bytes(tag).to_hex(),
            "ce3cf455678bd9de76d2f2e35c4b385d37d2b6f478869f052c8e3b4587a9f1fd"
        );
        assert!(key.verify(b"msg", &tag));
        assert!(!key.verify(b"msg!", &tag));
        assert!(!key.verify(b"msg", &tag[..31]));
        let mut bad = tag;
        bad[0] ^= 1;
        assert!(!key.verify(b"msg", &bad));
    }

    #[test]
    fn short_keys_are_rejected_and_file_bytes_lose_one_line_ending() {
        assert_eq!(
            HmacKey::new(&[1; 31]).unwrap_err(),
            KeyError::TooShort { len: 31 }
        );
        let raw = vec![b'a'; 32];
        let direct = HmacKey::new(&raw).unwrap();
        for suffix in [&b""[..], b"\n", b"\r\n"] {
            let key = HmacKey::from_file_bytes([raw.as_slice(), suffix].concat()).unwrap();
            assert_eq!(key.mac(b"x"), direct.mac(b"x"));
            assert_eq!(key.key_id(), direct.key_id());
        }
        let two = HmacKey::from_file_bytes([raw.as_slice(), b"\n\n"].concat()).unwrap();
        assert_ne!(two.mac(b"x"), direct.mac(b"x"));
        assert_eq!(
            HmacKey::from_file_bytes([&[1u8; 31][..], b"\n"].concat()).unwrap_err(),
            KeyError::TooShort { len: 31 }
        );
    }

    #[test]
    fn key_id_is_a_sha256_prefix_and_debug_redacts() {
        let key = HmacKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(key.key_id().len(), 16);
        assert!(
            crate::Sha256Digest::of(b"0123456789abcdef0123456789abcdef")
                .to_hex()
                .starts_with(&key.key_id())
        );
        let debug = format!("{key:?}");
        assert!(debug.contains("<redacted>"), "{debug}");
        assert!(!debug.contains("0123456789abcdef0123"), "{debug}");
    }
}
