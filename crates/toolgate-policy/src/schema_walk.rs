//! The bounded walk over a tool's JSON Schema shared by the output rewrites (`untrusted_output`,
//! `results`): `$ref`s inlined from the original schema, depth and work capped so a
//! self-referential or huge schema cannot make a rewrite run away.

use serde_json::Value;

/// How many `$ref` hops a schema walk follows at one node before giving up on it.
const MAX_REF_HOPS: usize = 32;

/// How deep and how far a schema walk goes (schema nodes, combinator branches included).
/// Combinators and `$ref`s do not consume pointer segments, so a self-referential schema would
/// otherwise recurse forever (or branch exponentially); what lies beyond is left as it is.
const MAX_SCHEMA_DEPTH: usize = 64;
const MAX_SCHEMA_STEPS: usize = 10_000;
/// How many `$ref`s one walk inlines (each is a copy of the referenced schema).
const MAX_SCHEMA_INLINES: usize = 256;

/// The state of one schema walk: the original schema (for `$ref`s) and the work left.
pub(crate) struct Walk<'a> {
    root: &'a Value,
    steps_left: usize,
    inlines_left: usize,
}

impl<'a> Walk<'a> {
    /// A walk of `root` (the schema as it was before the walk changes it), with the full budget.
    pub(crate) fn new(root: &'a Value) -> Self {
        Walk {
            root,
            steps_left: MAX_SCHEMA_STEPS,
            inlines_left: MAX_SCHEMA_INLINES,
        }
    }

    /// Whether one more node at `depth` may be visited.
    pub(crate) fn enter(&mut self, depth: usize) -> bool {
        if depth > MAX_SCHEMA_DEPTH || self.steps_left == 0 {
            return false;
        }
        self.steps_left -= 1;
        true
    }
}

/// Replaces a `$ref` at `node` by a copy of its target (within `root`), keeping sibling keys.
pub(crate) fn inline_ref(node: &mut Value, walk: &mut Walk<'_>) {
    let root = walk.root;
    for _ in 0..MAX_REF_HOPS {
        if walk.inlines_left == 0 {
            return;
        }
        let Some(Value::String(reference)) = node.get("$ref") else {
            return;
        };
        let Some(pointer) = reference.strip_prefix('#') else {
            return;
        };
        let Some(Value::Object(target)) = root.pointer(pointer) else {
            return;
        };
        let mut merged = target.clone();
        if let Value::Object(siblings) = node {
            for (key, value) in siblings.iter() {
                if key != "$ref" && !merged.contains_key(key) {
                    merged.insert(key.clone(), value.clone());
                }
            }
        }
        *node = Value::Object(merged);
        walk.inlines_left -= 1;
    }
}
