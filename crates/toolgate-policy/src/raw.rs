//! The on-disk shape of version 1. Unknown keys and duplicate keys are errors everywhere; the
//! loader (`load.rs`) turns these raw structures into the validated [`crate::Policy`].

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};
use serde_json::{Number, Value};

use crate::{EffectClass, Idempotency};

/// A JSON object deserialized into a map that refuses duplicate keys (serde_json keeps the last one
/// silently, which in a policy would let a later entry quietly override an earlier one).
pub(crate) struct UniqueMap<V>(pub(crate) BTreeMap<String, V>);

impl<V> Default for UniqueMap<V> {
    fn default() -> Self {
        UniqueMap(BTreeMap::new())
    }
}

/// In the schema, a JSON object of `V` (duplicate keys are the loader's to refuse).
impl<V: schemars::JsonSchema> schemars::JsonSchema for UniqueMap<V> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        <BTreeMap<String, V>>::schema_name()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <BTreeMap<String, V>>::json_schema(generator)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for UniqueVisitor<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some((key, value)) = access.next_entry::<String, V>()? {
                    if map.contains_key(&key) {
                        return Err(de::Error::custom(format_args!("duplicate key `{key}`")));
                    }
                    map.insert(key, value);
                }
                Ok(UniqueMap(map))
            }
        }
        deserializer.deserialize_map(UniqueVisitor(std::marker::PhantomData))
    }
}

/// The JSON Schema (draft 2020-12) of the policy file, for editors: `schemas/policy.schema.json`
/// in the repository is this value, and a policy may name it with `$schema`. It describes the
/// shape (keys, types, the refused `null`s); the loader checks more (names, regexes, which tools
/// a key may name), so a file the schema accepts may still be refused, never the reverse.
pub fn json_schema() -> Value {
    let mut schema = Value::from(schemars::schema_for!(RawPolicy));
    schema["$id"] = Value::from(SCHEMA_ID);
    schema["title"] = Value::from("toolgate policy, version 1");
    // Keys in one order whatever serde_json's maps keep (a build with Cedar keeps insertion
    // order), so the published file is the same from every build.
    schema.sort_all_objects();
    schema
}

/// Where the policy format's schema is published (the `$id` of [`json_schema`]).
pub const SCHEMA_ID: &str =
    "https://raw.githubusercontent.com/toolgate/toolgate/main/schemas/policy.schema.json";

/// For optional keys introduced after the first release: absent means "not set", but an explicit
/// `null` is an error rather than a second spelling of absent.
fn present<'de, D: de::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Policy")]
pub(crate) struct RawPolicy {
    /// The JSON Schema the file is written against (`schemas/policy.schema.json`), for editors;
    /// the loader ignores it.
    #[serde(default, rename = "$schema", deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(crate) _schema: Option<String>,
    /// The format's version: `1`.
    #[schemars(range(min = 1, max = 1))]
    pub(crate) version: u64,
    /// Tools the top-level caller may call.
    #[serde(default)]
    pub(crate) allow: Vec<String>,
    /// Tools nobody may call, whatever else says so (deny wins).
    #[serde(default)]
    pub(crate) deny: Vec<String>,
    /// Rules on arguments: `{tool: {argument: rule}}` (docs/policy.md, "Argument rules").
    #[serde(default)]
    pub(crate) arg_rules: UniqueMap<UniqueMap<RawArgRule>>,
    /// Exactly-once execution per tool: `{tool: {key_argument?, effect?, window_secs?,
    /// replay_marker?}}`.
    #[serde(default)]
    pub(crate) idempotency: UniqueMap<Idempotency>,
    /// What each tool does; `notify`, `wake`, `alert` and `delete` need confirmation.
    #[serde(default)]
    pub(crate) effects: UniqueMap<EffectClass>,
    /// How long a confirmation stays valid (`ttl_secs`: 1 to 86400, default 300).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "RawConfirmation")]
    pub(crate) confirmation: Option<RawConfirmation>,
    /// How a bulk tool selects its targets (defaults `ids`, `filter`, `expected_count`).
    #[serde(default)]
    pub(crate) batch: UniqueMap<RawBatch>,
    /// Token buckets per tool and per principal (`{"burst": n, "per_minute": n}`).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "RawRateLimits")]
    pub(crate) rate_limits: Option<RawRateLimits>,
    /// Tools that keep running while the kill switch is engaged (each `read` in `effects`).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "RawKillSwitch")]
    pub(crate) kill_switch: Option<RawKillSwitch>,
    /// Per-caller additions: `{principal: {allow?, deny?, arg_rules?}}`.
    #[serde(default)]
    pub(crate) principals: UniqueMap<RawPrincipal>,
    /// Third-party text in results, wrapped as untrusted: `{tool: {fields, max_chars?}}`.
    #[serde(default)]
    pub(crate) untrusted_output: UniqueMap<RawUntrusted>,
    /// The string argument carrying the version of the object a call changes.
    #[serde(default)]
    pub(crate) versions: UniqueMap<RawVersion>,
    /// A create tool's business key and its update tool.
    #[serde(default)]
    pub(crate) duplicates: UniqueMap<RawDuplicates>,
    /// The only fields a tool's results may carry; everything else is dropped.
    #[serde(default)]
    pub(crate) results: UniqueMap<RawResults>,
    /// OAuth scopes and the tools each grants to a scoped credential.
    #[serde(default)]
    pub(crate) scopes: UniqueMap<Vec<String>>,
    /// For `toolgate-server proxy` only: host requests the upstream may send, tools whose text is
    /// trusted.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "RawProxy")]
    pub(crate) proxy: Option<RawProxy>,
    /// A file of Cedar policies that every call must also satisfy (a path, relative to this
    /// policy file): a call runs only when this policy allows it and Cedar permits it. Needs a
    /// build with Cedar (feature `cedar`); see docs/policy.md, "Cedar".
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(crate) cedar: Option<String>,
    /// Tags of tools, for the Cedar policies (`resource.tags`): `{tool: [tag, ...]}`, each tag
    /// 1 to 64 of `a-z`, `0-9` and `_`, starting with a letter. Needs `cedar`.
    #[serde(default)]
    pub(crate) tags: UniqueMap<Vec<String>>,
}

/// `proxy` as written: what a proxied upstream may ask of the host, and whose text is trusted.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Proxy")]
pub(crate) struct RawProxy {
    #[serde(default)]
    pub(crate) host_requests: Vec<crate::HostRequest>,
    #[serde(default)]
    pub(crate) trusted_output: Vec<String>,
}

/// `arg_rules.<tool>.<field>` as written.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ArgRule")]
pub(crate) struct RawArgRule {
    // The two original keys keep their original leniency (`null` = absent).
    #[serde(default)]
    pub(crate) min_len: Option<u64>,
    #[serde(default)]
    pub(crate) max_len: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(crate) pattern: Option<String>,
    #[serde(default, rename = "enum", deserialize_with = "present")]
    #[schemars(with = "Vec<Value>")]
    pub(crate) one_of: Option<Vec<Value>>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Number")]
    pub(crate) minimum: Option<Number>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Number")]
    pub(crate) maximum: Option<Number>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Number")]
    pub(crate) max_items: Option<Number>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "RawPathRule")]
    pub(crate) path: Option<RawPathRule>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "bool")]
    pub(crate) optional: Option<bool>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "PathRule")]
pub(crate) struct RawPathRule {
    pub(crate) roots: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Confirmation")]
pub(crate) struct RawConfirmation {
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "u64")]
    pub(crate) ttl_secs: Option<u64>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Batch")]
pub(crate) struct RawBatch {
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(crate) ids_argument: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(crate) filter_argument: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(crate) expected_count_argument: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Rate")]
pub(crate) struct RawRate {
    pub(crate) burst: u32,
    pub(crate) per_minute: u32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RateLimits")]
pub(crate) struct RawRateLimits {
    #[serde(default)]
    pub(crate) tools: UniqueMap<RawRate>,
    #[serde(default)]
    pub(crate) principals: UniqueMap<RawRate>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "KillSwitch")]
pub(crate) struct RawKillSwitch {
    #[serde(default)]
    pub(crate) exempt: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Principal")]
pub(crate) struct RawPrincipal {
    #[serde(default)]
    pub(crate) allow: Vec<String>,
    #[serde(default)]
    pub(crate) deny: Vec<String>,
    #[serde(default)]
    pub(crate) arg_rules: UniqueMap<UniqueMap<RawArgRule>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Untrusted")]
pub(crate) struct RawUntrusted {
    pub(crate) fields: Vec<String>,
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "u64")]
    pub(crate) max_chars: Option<u64>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Version")]
pub(crate) struct RawVersion {
    pub(crate) argument: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Duplicates")]
pub(crate) struct RawDuplicates {
    pub(crate) key: Vec<String>,
    pub(crate) update_tool: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Results")]
pub(crate) struct RawResults {
    pub(crate) fields: Vec<String>,
}
