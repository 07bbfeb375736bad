//! The three tools of the reference server. Every handler requires a [`Permit`], so none of them
//! can run unless the gate decided `allow` for that very call.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::{Json, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgate_commit::{CommitError, IdempotencyKey};
use toolgate_rmcp::{Permit, PermitError};

/// Arguments of `write_note`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteNoteArgs {
    /// Idempotency key: the same request_id and text always produce exactly one note.
    pub request_id: String,
    /// The note's text.
    pub text: String,
}

/// Result of `write_note`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WriteNoteResult {
    /// The request_id of the call.
    pub request_id: String,
    /// `committed` the first time, `replay` for a retry with the same text.
    pub status: String,
}

/// A stored note.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Note {
    /// The note's request_id.
    pub request_id: String,
    /// The note's text.
    pub text: String,
}

/// A stored note checked in place: what [`Note`] accepts, without copying its strings.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoteRef<'a> {
    #[serde(rename = "request_id")]
    _request_id: &'a str,
    #[serde(rename = "text")]
    _text: &'a str,
}

/// Result of `read_ledger`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReadLedgerResult {
    /// Every note, sorted by file name.
    pub notes: Vec<Note>,
}

/// Arguments of `rm_rf`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RmRfArgs {
    /// The path the caller wants removed. It is never touched.
    pub path: String,
}

/// The reference tools. Its state is the tool router only: the notes live in the gate's commit
/// store, which handlers reach through their permit.
#[derive(Debug, Clone)]
pub struct NotesServer {
    tool_router: ToolRouter<Self>,
}

impl Default for NotesServer {
    fn default() -> Self {
        Self::new()
    }
}

fn tool_error(error: PermitError) -> String {
    match error {
        PermitError::Commit(CommitError::Conflict { .. }) => "Error: this request_id was already used with a different text; nothing was written. Retry with the original text, or use a new request_id for a new note".to_owned(),
        other => format!("Error: {other}"),
    }
}

#[tool_router]
impl NotesServer {
    /// The server with its three tools registered.
    pub fn new() -> Self {
        NotesServer {
            tool_router: Self::tool_router(),
        }
    }

    /// Every registered tool, as it appears before the gate filters tools/list.
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }

    /// Write one note per request_id. Retrying with the same request_id and text is safe and
    /// returns status "replay"; the same request_id with a different text is an error.
    #[tool(annotations(
        title = "Write note",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn write_note(
        &self,
        Extension(permit): Extension<Permit>,
        Parameters(args): Parameters<WriteNoteArgs>,
    ) -> Result<Json<WriteNoteResult>, String> {
        let key =
            IdempotencyKey::new(args.request_id.as_str()).map_err(|e| format!("Error: {e}"))?;
        let payload = serde_json::json!({"request_id": args.request_id, "text": args.text});
        let outcome = permit.commit(&key, payload).await.map_err(tool_error)?;
        Ok(Json(WriteNoteResult {
            request_id: args.request_id,
            status: outcome.as_str().to_owned(),
        }))
    }

    /// Observe every committed note, sorted by file name.
    #[tool(
        annotations(
            title = "Read ledger",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
        // What `Json<ReadLedgerResult>` would declare: the result is that object.
        output_schema = rmcp::handler::server::tool::schema_for_output::<ReadLedgerResult>()
    )]
    async fn read_ledger(
        &self,
        Extension(permit): Extension<Permit>,
    ) -> Result<CallToolResult, String> {
        let payloads = permit.observe().await.map_err(tool_error)?;
        for (index, payload) in payloads.iter().enumerate() {
            // Checked where it lies (its strings borrowed), so that the payloads themselves become
            // the result: converting every note into a `Note` and back into a new JSON tree, as
            // `Json<ReadLedgerResult>` would, copies the whole ledger once more per call.
            // The serde message could quote stored text; report only where and what kind.
            // An object only: serde would also read a note from a two-element array, which
            // `Note` used to turn into an object but which would now go out as it is.
            let checked = match payload {
                serde_json::Value::Object(_) => NoteRef::deserialize(payload).map(drop),
                _ => Err(serde::de::Error::custom("not an object")),
            };
            checked.map_err(|e: serde_json::Error| {
                format!(
                    "Error: ledger entry {index} (in file-name order) is not a note ({:?} error); inspect LEDGER_DIR/notes",
                    e.classify()
                )
            })?;
        }
        // The same JSON as `ReadLedgerResult { notes }` serializes to: an object whose `notes`
        // are the checked notes in file-name order.
        let mut result = serde_json::Map::new();
        result.insert("notes".to_owned(), serde_json::Value::Array(payloads));
        Ok(CallToolResult::structured(serde_json::Value::Object(
            result,
        )))
    }

    /// Registered only to prove that the list gate and the call gate are independent. It never
    /// deletes anything, in any configuration.
    #[tool(annotations(title = "Remove recursively", destructive_hint = true))]
    async fn rm_rf(
        &self,
        Extension(permit): Extension<Permit>,
        Parameters(_args): Parameters<RmRfArgs>,
    ) -> Result<String, String> {
        permit.record_outcome("refused").map_err(tool_error)?;
        Err("Error: rm_rf is a decoy of the reference server and never deletes anything; remove files with your own tools".to_owned())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for NotesServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new(
                "toolgate-server",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Notes ledger gated by toolgate: write_note is idempotent per request_id; read_ledger observes the committed notes.",
            )
    }
}

/// Prepares the reference server's calls for two-step confirmation (used when a policy gives a
/// tool a class that needs it, e.g. `rm_rf` as `delete`). The summary names the concrete
/// operation; the content hash covers what it would touch, so an edit between the preview and
/// the confirmation is detected.
#[derive(Debug, Default)]
pub struct NotesPreflight;

/// At most this many entries are walked to describe a deletion.
const MAX_PREVIEW_ENTRIES: usize = 10_000;

impl toolgate_rmcp::Preflight for NotesPreflight {
    fn prepare(
        &self,
        tool: &str,
        arguments: &rmcp::model::JsonObject,
    ) -> Result<toolgate_rmcp::Preparation, String> {
        let canonical = serde_json::Value::Object(arguments.clone());
        match (
            tool,
            arguments.get("path").and_then(serde_json::Value::as_str),
        ) {
            ("rm_rf", Some(path)) => {
                let (entries, bytes, digest) = describe_tree(std::path::Path::new(path))?;
                Ok(toolgate_rmcp::Preparation {
                    summary: format!("delete {path} recursively: {entries} entries, {bytes} bytes"),
                    content_hash: digest,
                })
            }
            _ => Ok(toolgate_rmcp::Preparation {
                summary: format!(
                    "call {tool} with arguments sha256:{}",
                    toolgate_canon::Sha256Digest::of_json(&canonical)
                ),
                content_hash: toolgate_canon::Sha256Digest::of_json(&canonical),
            }),
        }
    }
}

/// Counts the entries and bytes under `root` (without following links) and digests their
/// relative paths, kinds, sizes and modification times, in sorted order.
fn describe_tree(
    root: &std::path::Path,
) -> Result<(usize, u64, toolgate_canon::Sha256Digest), String> {
    use std::os::unix::fs::MetadataExt as _;
    let mut listing = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    let mut bytes = 0u64;
    while let Some(path) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == root => {
                listing.push(serde_json::json!(["(absent)"]));
                break;
            }
            Err(e) => return Err(format!("cannot inspect the target ({})", e.kind())),
        };
        let relative = path
            .strip_prefix(root)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let kind = if meta.is_dir() {
            "dir"
        } else if meta.file_type().is_symlink() {
            "link"
        } else {
            "file"
        };
        bytes = bytes.saturating_add(meta.len());
        listing.push(serde_json::json!([
            relative,
            kind,
            meta.len(),
            meta.mtime_nsec(),
            meta.mtime()
        ]));
        if listing.len() > MAX_PREVIEW_ENTRIES {
            return Err(format!(
                "the target has more than {MAX_PREVIEW_ENTRIES} entries; delete it in smaller parts"
            ));
        }
        if meta.is_dir() {
            let children = std::fs::read_dir(&path)
                .map_err(|e| format!("cannot list the target ({})", e.kind()))?;
            for child in children {
                let child = child.map_err(|e| format!("cannot list the target ({})", e.kind()))?;
                stack.push(child.path());
            }
        }
    }
    listing.sort_by_key(|entry| entry.to_string());
    let entries = listing.len();
    Ok((
        entries,
        bytes,
        toolgate_canon::Sha256Digest::of_json(&serde_json::Value::Array(listing)),
    ))
}
