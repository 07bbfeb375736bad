//! Canonical JSON (RFC 8785): for any JSON text, canonicalizing is a fixed point, `is_canonical`
//! agrees with it, the append writers give the same bytes, and digests parse back from their hex
//! form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolgate_canon::{
    Sha256Digest, canonical_value, is_canonical, write_canonical_object, write_canonical_value,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        // Digest parsing must reject or round-trip, never panic.
        if let Ok(digest) = text.parse::<Sha256Digest>() {
            assert_eq!(digest.to_hex(), text);
        }
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        assert!(
            !is_canonical(data),
            "is_canonical accepted text that is not JSON"
        );
        return;
    };
    let once = canonical_value(&value);
    let mut appended = b"[".to_vec();
    write_canonical_value(&mut appended, &value);
    assert_eq!(
        appended[1..],
        once[..],
        "write_canonical_value and canonical_value disagree"
    );
    if let Value::Object(map) = &value {
        appended.truncate(1);
        write_canonical_object(&mut appended, map);
        assert_eq!(
            appended[1..],
            once[..],
            "write_canonical_object and canonical_value disagree"
        );
    }
    assert!(
        is_canonical(&once),
        "canonical form not recognised as canonical: {}",
        String::from_utf8_lossy(&once)
    );
    let reparsed: Value = match serde_json::from_slice(&once) {
        Ok(v) => v,
        Err(e) => panic!(
            "canonical form does not parse ({e}): {}",
            String::from_utf8_lossy(&once)
        ),
    };
    let twice = canonical_value(&reparsed);
    assert_eq!(
        once,
        twice,
        "canonicalization is not a fixed point: {} -> {}",
        String::from_utf8_lossy(&once),
        String::from_utf8_lossy(&twice)
    );
    // The input is canonical exactly when it equals its canonical form.
    assert_eq!(is_canonical(data), data == once.as_slice());
    // Digests of equal canonical forms are equal.
    assert_eq!(Sha256Digest::of_json(&value), Sha256Digest::of(&once));
});
