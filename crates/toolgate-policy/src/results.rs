//! `results.<tool>`: the allow-list of the fields a tool's results may carry, and the pure filter
//! that removes every other field (the gate applies it to `structuredContent` and to text blocks
//! that are JSON).
//!
//! Path syntax: dotted member names, `[]` for every element of an array, e.g. `bookings[].id`;
//! `[].id` for the elements of a top-level array, `a[][]` for nested arrays. A member name is one
//! or more characters other than `.`, `[`, `]` and control characters. A path keeps the whole
//! subtree it reaches; a value on the way that has another shape than the path says (a string
//! where the path continues with `.b`, an object where it says `[]`) keeps nothing below it.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::schema_walk::{Walk, inline_ref};

use crate::raw::RawResults;

/// One node of the allow-list: what is kept of the value found there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    /// A path ends here: the whole value is kept.
    whole: bool,
    /// The object members a path continues into.
    members: BTreeMap<String, Node>,
    /// What a path keeps of every array element (`[]`).
    elements: Option<Box<Node>>,
}

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Member(String),
    Elements,
}

/// The fields one tool's results may carry (policy key `results.<tool>.fields`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultFields {
    fields: Vec<String>,
    root: Node,
}

impl ResultFields {
    pub(crate) fn compile(tool: &str, raw: RawResults) -> Result<Self, String> {
        if raw.fields.is_empty() {
            return Err(format!(
                "results.{tool}.fields is empty, so every field of every result would be dropped; list the fields the results may carry (e.g. \"bookings[].id\") or remove the entry"
            ));
        }
        let mut root = Node::default();
        for (index, field) in raw.fields.iter().enumerate() {
            if raw.fields[..index].contains(field) {
                return Err(format!(
                    "results.{tool}.fields lists {field:?} twice; remove one of them"
                ));
            }
            let steps = parse_path(field).map_err(|why| {
                format!(
                    "results.{tool}.fields[{index}] {field:?} {why}; write dotted member names with `[]` for every element of an array, such as \"bookings[].id\""
                )
            })?;
            let mut node = &mut root;
            for step in steps {
                node = match step {
                    Step::Member(name) => node.members.entry(name).or_default(),
                    Step::Elements => node.elements.get_or_insert_with(Box::default),
                };
            }
            node.whole = true;
        }
        Ok(ResultFields {
            fields: raw.fields,
            root,
        })
    }

    /// The paths as written.
    pub fn fields(&self) -> &[String] {
        &self.fields
    }

    /// Removes from `value` every object member and array element that no path allows, and
    /// returns how many it removed (a removed subtree counts once). `None` when `value` itself
    /// cannot be kept: a string, number, boolean or null where the paths expect an object or an
    /// array (the caller withholds it). Nothing is added or reordered; the members and elements
    /// that stay keep their values, filtered below.
    pub fn apply(&self, value: &mut Value) -> Option<u64> {
        let mut dropped = 0;
        keep(value, &self.root, &mut dropped).then_some(dropped)
    }

    /// Rewrites a tool's output schema to describe its results after [`ResultFields::apply`], so
    /// a client that validates structured results against the listed schema accepts the filtered
    /// ones: members no path keeps leave `properties` and `required`, an array no path enters loses
    /// `minItems`, and constraints on members the paths do not name (`additionalProperties`,
    /// `patternProperties`, `minProperties`) are lifted. `$ref`s on a path are inlined. Where the
    /// walk's budget ends, the rest of the schema admits anything (never stricter than the
    /// filtered results).
    pub fn rewrite_schema(&self, schema: &mut Value) {
        let root = schema.clone();
        let mut walk = Walk::new(&root);
        prune(schema, &self.root, &mut walk, 0);
        drop_unreferenced_definitions(schema);
    }
}

/// Removes the `$defs` / `definitions` entries no `$ref` reaches any more (a record inlined and
/// pruned on a path would otherwise still describe the dropped fields).
fn drop_unreferenced_definitions(schema: &mut Value) {
    fn refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("$ref", Value::String(reference)) => out.push(reference.clone()),
                        _ => refs(child, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| refs(item, out)),
            _ => {}
        }
    }
    let Value::Object(map) = schema else {
        return;
    };
    for section in ["$defs", "definitions"] {
        let Some(Value::Object(definitions)) = map.get(section) else {
            continue;
        };
        let definitions = definitions.clone();
        let prefix = format!("#/{section}/");
        // References from outside the definitions, then from the definitions they reach.
        let mut pending = Vec::new();
        for (_, child) in map.iter().filter(|(key, _)| key.as_str() != section) {
            refs(child, &mut pending);
        }
        let mut reached = std::collections::BTreeSet::new();
        while let Some(reference) = pending.pop() {
            let Some(name) = reference.strip_prefix(&prefix) else {
                continue;
            };
            if reached.insert(name.to_owned())
                && let Some(definition) = definitions.get(name)
            {
                refs(definition, &mut pending);
            }
        }
        if let Some(Value::Object(kept)) = map.get_mut(section) {
            kept.retain(|name, _| reached.contains(name));
        }
    }
}

/// Prunes the schema `node` to what `keep` leaves under `paths`.
fn prune(schema: &mut Value, paths: &Node, walk: &mut Walk<'_>, depth: usize) {
    if paths.whole {
        return;
    }
    if !walk.enter(depth) {
        *schema = Value::Object(serde_json::Map::new());
        return;
    }
    inline_ref(schema, walk);
    let Value::Object(map) = schema else {
        return;
    };
    if map.contains_key("$ref") {
        // A reference the walk could not inline: its target is unfiltered, so admit anything.
        map.clear();
        return;
    }
    for combinator in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = map.get_mut(combinator) {
            for branch in branches {
                prune(branch, paths, walk, depth + 1);
            }
        }
    }
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        properties.retain(|name, _| paths.members.contains_key(name));
        for (name, member) in properties.iter_mut() {
            if let Some(below) = paths.members.get(name) {
                prune(member, below, walk, depth + 1);
            }
        }
    }
    if let Some(Value::Array(required)) = map.get_mut("required") {
        // A member a path continues through may be dropped (a scalar where the path expects
        // more), so only members kept whole stay required.
        required.retain(|name| {
            name.as_str()
                .and_then(|name| paths.members.get(name))
                .is_some_and(|below| below.whole)
        });
    }
    for key in ["additionalProperties", "patternProperties", "minProperties"] {
        map.remove(key);
    }
    match (&paths.elements, map.get_mut("items")) {
        (Some(below), Some(items)) => prune(items, below, walk, depth + 1),
        (None, _) => {
            map.remove("minItems");
            map.remove("prefixItems");
        }
        _ => {}
    }
}

/// Filters `value` in place under `node`; returns whether the value itself stays.
fn keep(value: &mut Value, node: &Node, dropped: &mut u64) -> bool {
    if node.whole {
        return true;
    }
    match value {
        Value::Object(map) => {
            map.retain(|name, child| {
                let stays = node
                    .members
                    .get(name)
                    .is_some_and(|below| keep(child, below, dropped));
                if !stays {
                    *dropped += 1;
                }
                stays
            });
            true
        }
        Value::Array(items) => {
            let below = node.elements.as_deref();
            items.retain_mut(|item| {
                let stays = below.is_some_and(|below| keep(item, below, dropped));
                if !stays {
                    *dropped += 1;
                }
                stays
            });
            true
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => false,
    }
}

fn parse_path(path: &str) -> Result<Vec<Step>, &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    let mut steps = Vec::new();
    let mut rest = path;
    // A member name is expected at the start (unless the path starts with `[]`) and after a dot.
    let mut expect_member = !path.starts_with('[');
    while !rest.is_empty() {
        if expect_member {
            let end = rest.find(['.', '[', ']']).unwrap_or(rest.len());
            let name = &rest[..end];
            if name.is_empty() {
                return Err("has an empty member name (two dots, or a dot at the start or end)");
            }
            if name.chars().any(char::is_control) {
                return Err("has a control character in a member name");
            }
            steps.push(Step::Member(name.to_owned()));
            rest = &rest[end..];
            expect_member = false;
        } else if let Some(after) = rest.strip_prefix("[]") {
            steps.push(Step::Elements);
            rest = after;
        } else if let Some(after) = rest.strip_prefix('.') {
            if after.is_empty() {
                return Err("has an empty member name (two dots, or a dot at the start or end)");
            }
            rest = after;
            expect_member = true;
        } else if rest.starts_with('[') {
            return Err(
                "has a `[` not followed by `]` (array indexes are not supported: `[]` means every element)",
            );
        } else if rest.starts_with(']') {
            return Err("has a `]` without its `[`");
        } else {
            return Err("has a member name right after `[]`; separate it with a dot");
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_output_schema_describes_the_filtered_results() {
        // As schemars writes `Json<BookingList>`: the record behind a `$ref`, every field required.
        let mut schema = json!({
            "type": "object",
            "properties": {"bookings": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/Booking"}}},
            "required": ["bookings"],
            "$defs": {"Booking": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "id": {"type": "string"},
                    "guest": {"type": "string"},
                    "payment_token": {"type": "string"},
                    "meta": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a", "b"]}
                },
                "required": ["id", "guest", "payment_token", "meta"]
            }}
        });
        fields(&["bookings[].id", "bookings[].guest", "bookings[].meta.a"])
            .rewrite_schema(&mut schema);
        let item = &schema["properties"]["bookings"]["items"];
        let mut names: Vec<&String> = item["properties"].as_object().unwrap().keys().collect();
        names.sort();
        assert_eq!(names, ["guest", "id", "meta"]);
        // Kept whole: required as before; continued through: no longer required.
        assert_eq!(item["required"], json!(["id", "guest"]));
        assert_eq!(item["properties"]["meta"]["required"], json!(["a"]));
        assert!(item.get("additionalProperties").is_none());
        assert_eq!(schema["required"], json!([]));
        assert_eq!(schema["properties"]["bookings"]["minItems"], json!(1));
        assert_eq!(
            schema["$defs"],
            json!({}),
            "the record's definition is no longer reached"
        );

        // An array no path enters may be emptied; a reference that cannot be inlined admits anything.
        let mut schema = json!({"type": "object", "properties": {
            "list": {"type": "array", "minItems": 2, "items": {"type": "string"}},
            "other": {"$ref": "#/nowhere"}
        }});
        fields(&["list", "other.x"]).rewrite_schema(&mut schema);
        assert_eq!(
            schema["properties"]["list"]["minItems"],
            json!(2),
            "kept whole"
        );
        assert_eq!(schema["properties"]["other"], json!({}));
        let mut schema =
            json!({"type": "object", "properties": {"list": {"type": "array", "minItems": 2}}});
        fields(&["list.x"]).rewrite_schema(&mut schema);
        assert!(schema["properties"]["list"].get("minItems").is_none());
    }

    fn fields(paths: &[&str]) -> ResultFields {
        ResultFields::compile(
            "t",
            RawResults {
                fields: paths.iter().map(|p| (*p).to_owned()).collect(),
            },
        )
        .expect("valid paths")
    }

    #[test]
    fn paths_parse_into_steps() {
        let member = |name: &str| Step::Member(name.to_owned());
        assert_eq!(parse_path("a"), Ok(vec![member("a")]));
        assert_eq!(
            parse_path("bookings[].id"),
            Ok(vec![member("bookings"), Step::Elements, member("id")])
        );
        assert_eq!(parse_path("[].id"), Ok(vec![Step::Elements, member("id")]));
        assert_eq!(
            parse_path("m[][]"),
            Ok(vec![member("m"), Step::Elements, Step::Elements])
        );
        assert_eq!(
            parse_path("first name.$ref"),
            Ok(vec![member("first name"), member("$ref")])
        );
        for bad in [
            "", ".a", "a.", "a..b", "a[0]", "a[", "a]", "a[]b", "a.[]", "a\u{7}b", "[]]",
        ] {
            assert!(parse_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_allowed_fields_stay_and_drops_are_counted() {
        let allow = fields(&[
            "bookings[].id",
            "bookings[].guest",
            "count",
            "meta",
            "grid[][].v",
        ]);
        let mut value = json!({
            "bookings": [
                {"id": "b1", "guest": "ana", "secret": "s1"},
                {"id": "b2", "guest": {"name": "bo"}, "secret": "s2", "card": {"n": 1}},
            ],
            "count": 2,
            "meta": {"anything": {"below": [1, 2]}},
            "grid": [[{"v": 1, "w": 2}], [3]],
            "token": "t",
        });
        assert_eq!(allow.apply(&mut value), Some(6));
        assert_eq!(
            value,
            json!({
                "bookings": [{"id": "b1", "guest": "ana"}, {"id": "b2", "guest": {"name": "bo"}}],
                "count": 2,
                "meta": {"anything": {"below": [1, 2]}},
                "grid": [[{"v": 1}], []],
            })
        );
    }

    #[test]
    fn a_value_of_another_shape_keeps_nothing_below_it() {
        let allow = fields(&["bookings[].id"]);
        // An object where the path says `[]`, a string where it continues with `.id`.
        let mut value = json!({"bookings": {"x": {"id": 1}}});
        assert_eq!(allow.apply(&mut value), Some(1));
        assert_eq!(value, json!({"bookings": {}}));
        let mut value = json!({"bookings": ["secret", {"id": 1, "pin": 2}]});
        assert_eq!(allow.apply(&mut value), Some(2));
        assert_eq!(value, json!({"bookings": [{"id": 1}]}));
        let mut scalar = json!("secret");
        assert_eq!(allow.apply(&mut scalar), None);
        let top = fields(&["[].id"]);
        let mut list = json!([{"id": 1, "pin": 2}]);
        assert_eq!(top.apply(&mut list), Some(1));
        assert_eq!(list, json!([{"id": 1}]));
    }

    #[test]
    fn compile_refuses_empty_duplicate_and_malformed_lists() {
        let error = |paths: &[&str]| {
            ResultFields::compile(
                "t",
                RawResults {
                    fields: paths.iter().map(|p| (*p).to_owned()).collect(),
                },
            )
            .expect_err("invalid")
        };
        assert!(error(&[]).contains("is empty"));
        assert!(error(&["a", "a"]).contains("twice"));
        let e = error(&["ok", "a[0]"]);
        assert!(
            e.contains("fields[1]") && e.contains("bookings[].id"),
            "{e}"
        );
    }
}
