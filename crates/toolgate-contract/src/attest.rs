//! Attestation: a signature over the server digest, so a server can prove at start that the tool
//! contracts it is about to serve are the ones a reviewer approved.
//!
//! Hashing (the lockfile) proves that two artefacts differ; attestation binds an approved digest to
//! a key. The signing primitive sits behind [`Signer`] so that HMAC-SHA256 (shared key) can be
//! replaced by a KMS or a transparency log (asymmetric, verifier cannot sign) without touching the
//! callers. Every comparison of secret-dependent or attacker-influenced bytes is constant-time.
//! The wire format and what an attestation does and does not prove are in `docs/attestation.md`.

use std::fmt;
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;
use toolgate_canon::{HmacKey, KeyError, Sha256Digest};

/// Something that can sign and verify a message: HMAC today, a KMS or transparency log tomorrow.
pub trait Signer: Send + Sync + fmt::Debug {
    /// The algorithm name written into the attestation, e.g. `"hmac-sha256"`. It is part of the
    /// signed message, so an attestation cannot be replayed under another algorithm.
    fn algorithm(&self) -> &'static str;

    /// Signs `message`.
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, AttestError>;

    /// Checks that `signature` is a signature of `message`, in constant time with respect to the
    /// signature bytes; [`AttestError::BadSignature`] when it is not.
    fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), AttestError>;
}

/// The shortest HMAC key accepted, in bytes: the output size of SHA-256, below which the key, not
/// the hash, bounds the strength of the signature (RFC 2104 section 3). The same rule as
/// [`HmacKey`]'s, which enforces it.
pub const MIN_KEY_BYTES: usize = toolgate_canon::MIN_KEY_BYTES;

/// The algorithm name of [`HmacSha256Signer`].
const HMAC_SHA256: &str = "hmac-sha256";

/// The domain-separation prefix of the signed message. A key that also signs other things (a
/// reused secret, a future format) can never produce a signature that verifies as an attestation,
/// and `v1` lets a later format change the message without ambiguity.
const MESSAGE_PREFIX: &str = "toolgate-attestation-v1\n";

/// HMAC-SHA256 with a shared key. Signer and verifier hold the same key, so anyone who can verify
/// can also attest; use a KMS-backed [`Signer`] when those roles must be separate.
#[derive(Clone)]
pub struct HmacSha256Signer {
    // The shared key type also signs audit checkpoints; it keeps the keyed HMAC state, not the raw
    // key bytes, and redacts itself in `Debug`.
    key: HmacKey,
}

impl fmt::Debug for HmacSha256Signer {
    // Written by hand so that the key (or the state derived from it) never reaches a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HmacSha256Signer")
            .field("key", &"<redacted>")
            .finish()
    }
}

impl HmacSha256Signer {
    /// A signer with `key`, which must be at least [`MIN_KEY_BYTES`] long.
    pub fn new(key: &[u8]) -> Result<Self, AttestError> {
        Ok(Self {
            key: HmacKey::new(key).map_err(key_error)?,
        })
    }

    /// A signer whose key is the raw bytes of the file at `path`, with exactly one trailing line
    /// ending (`"\n"` or `"\r\n"`) removed, because editors and `echo` add one. Nothing else is
    /// trimmed or decoded: a file holding 64 hex characters is a 64-byte key made of those
    /// characters, not 32 decoded bytes.
    pub fn from_key_file(path: &Path) -> Result<Self, AttestError> {
        let io_error = |source| AttestError::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = toolgate_storage::read_regular(
            path,
            toolgate_canon::MAX_KEY_FILE_BYTES,
            toolgate_storage::Symlinks::Follow,
        )
        .map_err(io_error)?
        .ok_or_else(|| io_error(std::io::ErrorKind::NotFound.into()))?;
        Ok(Self {
            key: HmacKey::from_file_bytes(bytes).map_err(key_error)?,
        })
    }
}

/// Maps the shared key type's error onto this module's documented variant.
fn key_error(err: KeyError) -> AttestError {
    match err {
        KeyError::TooShort { len } => AttestError::KeyTooShort { len },
        // `KeyError` is non-exhaustive; a future rule on keys is still a key the signer refuses.
        other => AttestError::SignerFailed {
            algorithm: HMAC_SHA256.to_owned(),
            reason: other.to_string(),
        },
    }
}

impl Signer for HmacSha256Signer {
    fn algorithm(&self) -> &'static str {
        HMAC_SHA256
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, AttestError> {
        Ok(self.key.mac(message).to_vec())
    }

    fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), AttestError> {
        // `HmacKey::verify` compares in constant time and rejects a signature of the wrong length.
        if self.key.verify(message, signature) {
            Ok(())
        } else {
            Err(AttestError::BadSignature)
        }
    }
}

/// A signed statement "the approved server digest is `server_digest`".
///
/// Its text form, [`render`](Self::render) and [`parse`](Self::parse), is
/// `<algorithm>:<64-hex server digest>:<hex signature>` on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attestation {
    /// The signer's algorithm name, e.g. `hmac-sha256`.
    pub algorithm: String,
    /// The server digest that was approved.
    pub server_digest: Sha256Digest,
    /// The signature over [`Attestation::create`]'s message.
    pub signature: Vec<u8>,
}

impl Attestation {
    /// Signs `server_digest` with `signer`.
    ///
    /// The signed message is the UTF-8 bytes of `"toolgate-attestation-v1\n" + algorithm + "\n" +
    /// digest hex` (lowercase, no trailing newline). The prefix is domain separation: a signature
    /// made with the same key for any other purpose cannot pass as an attestation; the algorithm is
    /// inside so the signature cannot be relabelled.
    pub fn create(signer: &dyn Signer, server_digest: Sha256Digest) -> Result<Self, AttestError> {
        let algorithm = signer.algorithm().to_owned();
        let signature = signer.sign(&message(&algorithm, server_digest))?;
        Ok(Self {
            algorithm,
            server_digest,
            signature,
        })
    }

    /// Parses the text form `<algorithm>:<64-hex digest>:<hex signature>`; surrounding whitespace
    /// (a trailing newline from a file or an environment variable) is ignored.
    pub fn parse(text: &str) -> Result<Self, AttestError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(malformed("the text is empty"));
        }
        let parts: Vec<&str> = text.split(':').collect();
        let [algorithm, digest, signature] = parts.as_slice() else {
            return Err(malformed(format!(
                "expected 3 parts separated by ':', found {}",
                parts.len()
            )));
        };
        if algorithm.is_empty() {
            return Err(malformed("the algorithm is empty"));
        }
        if let Some(c) = algorithm
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(malformed(format!(
                "the algorithm {algorithm:?} contains {c:?}; only ASCII letters, digits, '-', '_' \
                 and '.' are allowed"
            )));
        }
        let server_digest = digest
            .parse::<Sha256Digest>()
            .map_err(|err| malformed(format!("the server digest is invalid: {err}")))?;
        let signature = decode_hex(signature)
            .map_err(|reason| malformed(format!("the signature is invalid: {reason}")))?;
        Ok(Self {
            algorithm: (*algorithm).to_owned(),
            server_digest,
            signature,
        })
    }

    /// The text form accepted by [`parse`](Self::parse), without a trailing newline.
    pub fn render(&self) -> String {
        format!(
            "{}:{}:{}",
            self.algorithm,
            self.server_digest.to_hex(),
            encode_hex(&self.signature)
        )
    }

    /// Checks that `signer` produced the signature and that the attested digest equals `live`.
    ///
    /// The signature is checked first: a digest that was edited in the text form is reported as
    /// [`AttestError::BadSignature`], and [`AttestError::DigestMismatch`] means a genuine
    /// attestation of another digest (the tools changed since it was made).
    pub fn verify(&self, signer: &dyn Signer, live: Sha256Digest) -> Result<(), AttestError> {
        if self.algorithm != signer.algorithm() {
            return Err(AttestError::AlgorithmMismatch {
                expected: signer.algorithm().to_owned(),
                found: self.algorithm.clone(),
            });
        }
        signer.verify(
            &message(&self.algorithm, self.server_digest),
            &self.signature,
        )?;
        digests_equal(self.server_digest, live)
    }
}

/// Checks an expected digest given by an operator (`sha256:<hex>` or `<hex>`, surrounding
/// whitespace ignored, hex in either case) against the live digest, in constant time.
///
/// This pins without a key: it proves nothing about who chose the expected digest, only that the
/// running tools are the ones it names.
pub fn check_expected_digest(expected: &str, live: Sha256Digest) -> Result<(), AttestError> {
    let trimmed = expected.trim();
    let hex = trimmed.strip_prefix("sha256:").unwrap_or(trimmed);
    let expected = hex
        .to_ascii_lowercase()
        .parse::<Sha256Digest>()
        .map_err(|err| {
            malformed(format!(
                "the expected digest is not `sha256:<64 hex>` or `<64 hex>`: {err}"
            ))
        })?;
    digests_equal(expected, live)
}

/// Why an attestation or an expected digest was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttestError {
    /// The HMAC key is shorter than [`MIN_KEY_BYTES`].
    #[error(
        "the attestation key is {len} bytes, at least 32 are required; generate one with \
         `head -c 32 /dev/urandom > attest.key` and keep it outside the repository"
    )]
    KeyTooShort {
        /// The length of the rejected key, in bytes.
        len: usize,
    },
    /// The key file could not be read.
    #[error("cannot read the attestation key file {}: {source}; check the path and its permissions", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The attestation text or expected digest does not have the documented form.
    #[error(
        "malformed attestation: {reason}; expected `<algorithm>:<64-hex server digest>:<hex \
         signature>` (or `sha256:<64 hex>` for an expected digest), regenerate it rather than \
         editing it by hand"
    )]
    Malformed {
        /// What is wrong, naming the part.
        reason: String,
    },
    /// The attestation names another algorithm than the configured signer.
    #[error(
        "the attestation was made with {found} but this server verifies with {expected}; \
         re-attest with the configured signer or configure the signer it was made with"
    )]
    AlgorithmMismatch {
        /// The configured signer's algorithm.
        expected: String,
        /// The algorithm named in the attestation.
        found: String,
    },
    /// The signature does not match: another key made it, or the attestation was edited.
    #[error(
        "the attestation signature does not verify: it was made with another key or its text was \
         edited; re-attest the approved server digest with the key this server is configured with"
    )]
    BadSignature,
    /// The attested or expected digest differs from the digest of the tools actually served.
    #[error(
        "the live server digest {live} differs from the approved digest {attested}: the tool \
         contracts changed since they were approved; review the change (a lock check of the \
         server's toolgate.lock lists it), then re-attest or update the expected digest"
    )]
    DigestMismatch {
        /// The attested or expected digest, hex.
        attested: String,
        /// The digest computed from the running server's tools, hex.
        live: String,
    },
    /// A signer could not produce or check a signature for a reason of its own (a KMS that cannot
    /// be reached, a key it refuses). Not a verdict on the attestation: retry or fix the signer.
    #[error("the {algorithm} signer failed: {reason}; check the signer's configuration and retry")]
    SignerFailed {
        /// The signer's algorithm name.
        algorithm: String,
        /// What the signer reported.
        reason: String,
    },
}

/// The exact bytes that are signed; see [`Attestation::create`].
fn message(algorithm: &str, digest: Sha256Digest) -> Vec<u8> {
    format!("{MESSAGE_PREFIX}{algorithm}\n{}", digest.to_hex()).into_bytes()
}

/// Constant-time digest comparison. The digests are public, but a timing oracle on "how many
/// leading bytes match" is exactly what the issue asks to rule out, and it costs nothing.
fn digests_equal(attested: Sha256Digest, live: Sha256Digest) -> Result<(), AttestError> {
    if bool::from(attested.as_bytes().ct_eq(live.as_bytes())) {
        Ok(())
    } else {
        Err(AttestError::DigestMismatch {
            attested: attested.to_hex(),
            live: live.to_hex(),
        })
    }
}

fn malformed(reason: impl Into<String>) -> AttestError {
    AttestError::Malformed {
        reason: reason.into(),
    }
}

fn encode_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// Decodes hex in either case; the error says what is wrong and where.
fn decode_hex(text: &str) -> Result<Vec<u8>, String> {
    if text.is_empty() {
        return Err("it is empty".to_owned());
    }
    // Checking every character first means the pairing below only ever sees ASCII hex digits.
    if let Some((at, c)) = text.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(format!("{c:?} at byte {at} is not a hex digit"));
    }
    if !text.len().is_multiple_of(2) {
        return Err(format!(
            "it has {} hex digits, an odd number, so the last byte is incomplete",
            text.len()
        ));
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).map_err(|err| err.to_string())?;
            u8::from_str_radix(s, 16).map_err(|err| err.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(encode_hex(&bytes), "000fa5ff");
        assert_eq!(decode_hex("000FA5ff").unwrap(), bytes);
        assert!(decode_hex("0").unwrap_err().contains("odd"));
        assert!(decode_hex("zz").unwrap_err().contains("'z'"));
        assert!(decode_hex("é0").unwrap_err().contains("'é'"));
    }

    #[test]
    fn message_bytes_are_documented_ones() {
        let digest = Sha256Digest::of(b"abc");
        assert_eq!(
            message("hmac-sha256", digest),
            format!("toolgate-attestation-v1\nhmac-sha256\n{}", digest.to_hex()).into_bytes()
        );
    }
}
