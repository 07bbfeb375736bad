//! Attestation: signing, verification, the text form and the key rules, through the public API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use toolgate_canon::Sha256Digest;
use toolgate_contract::attest::{
    AttestError, Attestation, HmacSha256Signer, MIN_KEY_BYTES, Signer, check_expected_digest,
};

fn key(byte: u8) -> Vec<u8> {
    vec![byte; MIN_KEY_BYTES]
}

fn signer(byte: u8) -> HmacSha256Signer {
    HmacSha256Signer::new(&key(byte)).expect("a 32-byte key is accepted")
}

fn digest_a() -> Sha256Digest {
    Sha256Digest::of(b"abc")
}

fn digest_b() -> Sha256Digest {
    Sha256Digest::of(b"abd")
}

/// Asserts that `text` is rejected as malformed and that the reason mentions `needle`.
fn check_malformed(text: &str, needle: &str) {
    match Attestation::parse(text) {
        Err(AttestError::Malformed { reason }) => {
            assert!(
                reason.contains(needle),
                "{text:?}: reason {reason:?} lacks {needle:?}"
            )
        }
        other => panic!("{text:?}: expected Malformed, got {other:?}"),
    }
}

#[test]
fn sign_verify_round_trip() {
    let signer = signer(0x42);
    let attestation = Attestation::create(&signer, digest_a()).unwrap();
    assert_eq!(attestation.algorithm, "hmac-sha256");
    assert_eq!(attestation.signature.len(), 32);
    attestation.verify(&signer, digest_a()).unwrap();
    let reparsed = Attestation::parse(&attestation.render()).unwrap();
    reparsed.verify(&signer, digest_a()).unwrap();
}

#[test]
fn wrong_key_is_bad_signature() {
    let attestation = Attestation::create(&signer(1), digest_a()).unwrap();
    let err = attestation.verify(&signer(2), digest_a()).unwrap_err();
    assert!(matches!(err, AttestError::BadSignature), "{err:?}");
    assert!(err.to_string().contains("re-attest"), "{err}");
}

#[test]
fn key_length_rule() {
    let err = HmacSha256Signer::new(&[7; 31]).unwrap_err();
    assert!(
        matches!(err, AttestError::KeyTooShort { len: 31 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("at least 32"), "{err}");
    assert!(matches!(
        HmacSha256Signer::new(&[]),
        Err(AttestError::KeyTooShort { len: 0 })
    ));
    HmacSha256Signer::new(&[7; 32]).unwrap();
    HmacSha256Signer::new(&[7; 200]).unwrap();
}

#[test]
fn tampered_digest_in_text_is_bad_signature() {
    let signer = signer(3);
    let text = Attestation::create(&signer, digest_a()).unwrap().render();
    let tampered = text.replace(&digest_a().to_hex(), &digest_b().to_hex());
    assert_ne!(text, tampered);
    let err = Attestation::parse(&tampered)
        .unwrap()
        .verify(&signer, digest_b())
        .unwrap_err();
    assert!(matches!(err, AttestError::BadSignature), "{err:?}");
}

#[test]
fn tampered_signature_is_bad_signature() {
    let signer = signer(3);
    let mut attestation = Attestation::create(&signer, digest_a()).unwrap();
    attestation.signature[0] ^= 1;
    let err = attestation.verify(&signer, digest_a()).unwrap_err();
    assert!(matches!(err, AttestError::BadSignature), "{err:?}");
    attestation.signature.pop();
    let err = attestation.verify(&signer, digest_a()).unwrap_err();
    assert!(matches!(err, AttestError::BadSignature), "{err:?}");
}

#[test]
fn genuine_attestation_of_other_digest_is_digest_mismatch() {
    let signer = signer(4);
    let attestation = Attestation::create(&signer, digest_a()).unwrap();
    match attestation.verify(&signer, digest_b()) {
        Err(err @ AttestError::DigestMismatch { .. }) => {
            let text = err.to_string();
            assert!(text.contains(&digest_a().to_hex()), "{text}");
            assert!(text.contains(&digest_b().to_hex()), "{text}");
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
}

#[test]
fn algorithm_relabel_is_rejected() {
    let signer = signer(5);
    let mut attestation = Attestation::create(&signer, digest_a()).unwrap();
    attestation.algorithm = "ed25519".to_owned();
    let err = attestation.verify(&signer, digest_a()).unwrap_err();
    assert!(
        matches!(&err, AttestError::AlgorithmMismatch { expected, found }
            if expected == "hmac-sha256" && found == "ed25519"),
        "{err:?}"
    );
}

#[test]
fn malformed_texts_are_errors_not_panics() {
    let digest = digest_a().to_hex();
    check_malformed("", "empty");
    check_malformed("   \n", "empty");
    check_malformed("hmac-sha256", "found 1");
    check_malformed(&format!("hmac-sha256:{digest}"), "found 2");
    check_malformed(&format!("hmac-sha256:{digest}:00:00"), "found 4");
    check_malformed(&format!(":{digest}:00"), "algorithm is empty");
    check_malformed(&format!("hmac sha256:{digest}:00"), "' '");
    check_malformed("hmac-sha256::00", "server digest");
    check_malformed("hmac-sha256:abc:00", "server digest");
    check_malformed(
        &format!("hmac-sha256:{}:00", digest.to_uppercase()),
        "server digest",
    );
    check_malformed(
        &format!("hmac-sha256:{}:00", "é".repeat(32)),
        "server digest",
    );
    check_malformed(&format!("hmac-sha256:{digest}:"), "signature");
    check_malformed(&format!("hmac-sha256:{digest}:0g"), "'g'");
    check_malformed(&format!("hmac-sha256:{digest}:abc"), "odd");
    check_malformed(&format!("hmac-sha256:{digest}:ééé"), "'é'");
    assert!(
        Attestation::parse(&format!("hmac-sha256:{digest}:AbCd"))
            .unwrap()
            .signature
            .eq(&[0xab, 0xcd])
    );
}

#[test]
fn parse_render_round_trip_and_whitespace() {
    let attestation = Attestation::create(&signer(6), digest_a()).unwrap();
    let text = attestation.render();
    assert_eq!(Attestation::parse(&text).unwrap(), attestation);
    assert_eq!(
        Attestation::parse(&format!("  {text}\r\n")).unwrap(),
        attestation
    );
    assert!(!text.contains(char::is_whitespace));
}

#[test]
fn key_file_trailing_newline_is_stripped_once() {
    let dir = tempfile::tempdir().unwrap();
    let raw = b"0123456789abcdef0123456789abcdef";
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        path
    };
    let direct = Attestation::create(&HmacSha256Signer::new(raw).unwrap(), digest_a()).unwrap();
    for (name, bytes) in [
        ("plain", raw.to_vec()),
        ("lf", [raw.as_slice(), b"\n"].concat()),
        ("crlf", [raw.as_slice(), b"\r\n"].concat()),
    ] {
        let from_file = HmacSha256Signer::from_key_file(&write(name, &bytes)).unwrap();
        direct.verify(&from_file, digest_a()).unwrap();
    }
    // Only one line ending is stripped: a second one is part of the key.
    let two = HmacSha256Signer::from_key_file(&write("two", &[raw.as_slice(), b"\n\n"].concat()))
        .unwrap();
    assert!(matches!(
        direct.verify(&two, digest_a()),
        Err(AttestError::BadSignature)
    ));
    // 31 bytes plus a newline is still too short.
    let short = write("short", &[&raw[..31], b"\n"].concat());
    assert!(matches!(
        HmacSha256Signer::from_key_file(&short),
        Err(AttestError::KeyTooShort { len: 31 })
    ));
}

#[test]
fn missing_key_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such.key");
    let err = HmacSha256Signer::from_key_file(&path).unwrap_err();
    assert!(
        matches!(&err, AttestError::Io { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert!(err.to_string().contains("no-such.key"), "{err}");
}

/// Known answers computed independently of this crate, with Python's standard library:
///
/// ```text
/// python3 -c "import hmac,hashlib; k=bytes([0x0b])*32; \
///   print(hmac.new(k,b'Hi There',hashlib.sha256).hexdigest()); \
///   m=b'toolgate-attestation-v1\nhmac-sha256\n'+hashlib.sha256(b'abc').hexdigest().encode(); \
///   print(hmac.new(k,m,hashlib.sha256).hexdigest())"
/// ```
///
/// The first is RFC 4231 test case 2's shape (its message "Hi There" of test case 1) with a 32-byte
/// 0x0b key, since the RFC's 20-byte key is below our minimum; the second pins the exact message
/// bytes of an attestation, so a change to the signed message cannot go unnoticed.
#[test]
fn hmac_known_answers() {
    let signer = HmacSha256Signer::new(&[0x0b; 32]).unwrap();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        hex(&signer.sign(b"Hi There").unwrap()),
        "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7"
    );
    let attestation = Attestation::create(&signer, digest_a()).unwrap();
    assert_eq!(
        attestation.render(),
        "hmac-sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad:\
         9c828cbef4b6c41354d284baccd3be2b247e6a0780080ad16af3d0fb01f7c040"
    );
}

#[test]
fn signer_debug_hides_the_key() {
    let secret = b"SECRET-KEY-0123456789-abcdefghijk";
    let signer = HmacSha256Signer::new(secret).unwrap();
    let debug = format!("{signer:?} {signer:#?}");
    assert!(!debug.contains("SECRET"), "{debug}");
    assert!(debug.contains("redacted"), "{debug}");
    let dyn_signer: &dyn Signer = &signer;
    assert!(!format!("{dyn_signer:?}").contains("SECRET"));
}

#[test]
fn expected_digest_forms() {
    let live = digest_a();
    let hex = live.to_hex();
    check_expected_digest(&hex, live).unwrap();
    check_expected_digest(&format!("sha256:{hex}"), live).unwrap();
    check_expected_digest(&format!(" sha256:{}\n", hex.to_uppercase()), live).unwrap();
    let err = check_expected_digest(&digest_b().to_hex(), live).unwrap_err();
    assert!(
        matches!(&err, AttestError::DigestMismatch { attested, live: l }
            if *attested == digest_b().to_hex() && *l == hex),
        "{err:?}"
    );
    for bad in [
        "",
        "sha256:",
        "sha256:abc",
        "md5:00",
        &format!("sha512:{hex}"),
    ] {
        let err = check_expected_digest(bad, live).unwrap_err();
        assert!(
            matches!(err, AttestError::Malformed { .. }),
            "{bad:?}: {err:?}"
        );
    }
}
