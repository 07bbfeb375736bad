//! The definitions of the gate's own tools `confirm_action` and `reject_action`, listed to a
//! principal who can see some tool that needs confirmation (answered in `gate/confirm.rs`).

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value, json};

use crate::world::REJECT_ACTION;

/// The definitions of the gate's own confirmation tools.
pub(crate) fn confirmation_tool(name: &str) -> Tool {
    let reject = name == REJECT_ACTION;
    let mut properties = Map::new();
    properties.insert(
        "confirm_token".to_owned(),
        json!({"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "The confirm_token of the preview."}),
    );
    if !reject {
        properties.insert(
            "confirm_summary".to_owned(),
            json!({"type": "string", "description": "The confirm_summary of the preview, exactly as given."}),
        );
    }
    let required: Vec<&str> = if reject {
        vec!["confirm_token"]
    } else {
        vec!["confirm_token", "confirm_summary"]
    };
    let mut schema = Map::new();
    schema.insert("type".to_owned(), json!("object"));
    schema.insert("properties".to_owned(), Value::Object(properties));
    schema.insert("required".to_owned(), json!(required));
    schema.insert("additionalProperties".to_owned(), Value::Bool(false));
    let description = if reject {
        "Cancel a previewed action: its confirm_token can no longer be used."
    } else {
        "Execute a previewed action exactly once. Pass the confirm_token and the confirm_summary of the preview exactly as given; show the summary to the person who approves it first."
    };
    let annotations = if reject {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    } else {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(true)
    };
    Tool::new(
        Cow::Owned(name.to_owned()),
        Cow::Borrowed(description),
        Arc::new(schema),
    )
    .annotate(annotations)
}
