//! Signed checkpoints: `(count, head, ts)` under HMAC-SHA256, one canonical JSON line each in
//! `audit.checkpoints.jsonl` (and its mirror), so truncation and whole-log replacement are
//! detectable by anyone holding the key.
//!
//! The chain head after record `n` already commits to every byte of records `1..=n`, so signing
//! that head with the record count is enough to pin the whole prefix; see docs/audit-format.md for
//! why this is not a C2SP signed note or a Merkle tree.

use serde_json::{Map, Value};
use toolgate_canon::{HmacKey, Sha256Digest, canonical_value};

/// Domain separation for the MAC: a key that also signs attestations or anything else can never
/// produce a tag that verifies as a checkpoint, and `v1` leaves room for another message format.
pub(crate) const MAC_PREFIX: &[u8] = b"toolgate-audit-checkpoint-v1\n";

/// One signed checkpoint: after `count` records the chain head was `head`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Checkpoint {
    /// How many records the log held (the `seq` of the record whose `sha256` is `head`).
    pub count: u64,
    /// The `sha256` of record `count` (64 zeros for `count` 0).
    pub head: Sha256Digest,
    /// When the checkpoint was made, ns since the UNIX epoch (rounded like the records' `ts`).
    pub ts: u64,
    /// [`HmacKey::key_id`] of the key that signed it.
    pub key_id: String,
    /// HMAC-SHA256 over `MAC_PREFIX` and the canonical JSON of the other fields.
    pub mac: [u8; 32],
}

impl Checkpoint {
    /// Signs `(count, head, ts)` with `key`.
    pub fn sign(key: &HmacKey, count: u64, head: Sha256Digest, ts: u64) -> Self {
        let key_id = key.key_id();
        let mac = key.mac(&message(count, head, &key_id, ts));
        Checkpoint {
            count,
            head,
            ts,
            key_id,
            mac,
        }
    }

    /// The checkpoint file line, canonical JSON with its `\n`.
    pub fn line(&self) -> Vec<u8> {
        let mut map = fields(self.count, self.head, &self.key_id, self.ts);
        map.insert(
            "mac".into(),
            Value::from(Sha256Digest::from_bytes(self.mac).to_hex()),
        );
        let mut line = canonical_value(&Value::Object(map));
        line.push(b'\n');
        line
    }

    /// Parses one line (without its `\n`): a canonical JSON object with exactly the five fields.
    /// The MAC is not checked here; see [`Checkpoint::verify`].
    pub(crate) fn parse(line: &[u8]) -> Result<Self, String> {
        let value: Value =
            serde_json::from_slice(line).map_err(|e| format!("not valid JSON ({e})"))?;
        let Some(map) = value.as_object() else {
            return Err("not a JSON object".into());
        };
        if canonical_value(&value) != line {
            return Err("not the canonical JSON (RFC 8785) of its own content".into());
        }
        let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
        keys.sort_unstable();
        if keys != ["count", "head", "key_id", "mac", "ts"] {
            return Err(format!(
                "fields are {keys:?}, expected count, head, key_id, mac and ts"
            ));
        }
        let int = |k: &str| {
            map.get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("{k} is not a non-negative integer"))
        };
        let digest = |k: &str| {
            map.get(k)
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<Sha256Digest>().ok())
                .ok_or_else(|| format!("{k} is not 64 lowercase hex characters"))
        };
        Ok(Checkpoint {
            count: int("count")?,
            ts: int("ts")?,
            head: digest("head")?,
            mac: *digest("mac")?.as_bytes(),
            key_id: map
                .get("key_id")
                .and_then(Value::as_str)
                .ok_or("key_id is not a string")?
                .to_owned(),
        })
    }

    /// Whether `key` made this checkpoint; the comparison is constant-time.
    pub(crate) fn verify(&self, key: &HmacKey) -> bool {
        key.verify(
            &message(self.count, self.head, &self.key_id, self.ts),
            &self.mac,
        )
    }
}

fn fields(count: u64, head: Sha256Digest, key_id: &str, ts: u64) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("count".into(), Value::from(count));
    map.insert("head".into(), Value::from(head.to_hex()));
    map.insert("key_id".into(), Value::from(key_id));
    map.insert("ts".into(), Value::from(ts));
    map
}

/// The MAC input: the prefix, then the canonical JSON of the line without `mac`.
fn message(count: u64, head: Sha256Digest, key_id: &str, ts: u64) -> Vec<u8> {
    let mut msg = MAC_PREFIX.to_vec();
    msg.extend_from_slice(&canonical_value(&Value::Object(fields(
        count, head, key_id, ts,
    ))));
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_round_trips_and_verifies_only_under_its_key() {
        let key = HmacKey::new(&[7; 32]).unwrap();
        let other = HmacKey::new(&[8; 32]).unwrap();
        let cp = Checkpoint::sign(&key, 12, Sha256Digest::of(b"h"), 1_000_000_000);
        let line = cp.line();
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(text.starts_with("{\"count\":12,\"head\":\""), "{text}");
        let parsed = Checkpoint::parse(line.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(parsed, cp);
        assert!(parsed.verify(&key));
        assert!(!parsed.verify(&other));
        let edited = text.replace("\"count\":12", "\"count\":11");
        let edited = Checkpoint::parse(edited.trim_end().as_bytes()).unwrap();
        assert!(!edited.verify(&key));
        assert!(Checkpoint::parse(b"{\"count\":1}").is_err());
        assert!(Checkpoint::parse(b"\xff").is_err());
    }
}
