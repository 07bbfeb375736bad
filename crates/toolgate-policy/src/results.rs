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
