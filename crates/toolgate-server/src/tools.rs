//! The three tools of the reference server. Every handler requires a [`Permit`], so none of them
//! can run unless the gate decided `allow` for that very call. Exactly-once is the gate's
//! (`idempotency` in the policy): `write_note` only publishes its note.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::{Json, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use toolgate::Permit;
use toolgate::audit::Outcome;

use crate::notes::{NoteError, Notes, Written};

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

/// The reference tools over the notes directory.
#[derive(Debug, Clone)]
pub struct NotesServer {
    tool_router: ToolRouter<Self>,
    notes: Arc<Notes>,
}

/// Runs blocking note I/O without blocking other tasks (in place on a multi-thread runtime);
/// errors become the tool's error text.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, NoteError> + Send + 'static,
) -> Result<T, String> {
    match toolgate::run_blocking(work).await {
        Ok(result) => result.map_err(|error| format!("Error: {error}")),
        Err(cancelled) => Err(format!("Error: {cancelled}")),
    }
}

#[tool_router]
impl NotesServer {
    /// The server with its three tools registered, keeping its notes in `notes`.
    pub fn new(notes: Arc<Notes>) -> Self {
        NotesServer {
            tool_router: Self::tool_router(),
            notes,
        }
    }

    /// Every registered tool, as it appears before the gate filters tools/list.
    pub fn tools() -> Vec<rmcp::model::Tool> {
        Self::tool_router().list_all()
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
        let notes = Arc::clone(&self.notes);
        let (request_id, text) = (args.request_id.clone(), args.text);
        let written = blocking(move || notes.write(&request_id, &text)).await?;
        // The gate ran this handler, so no completed call holds this request_id; a note already
        // there was published by a call that crashed before the gate stored its result.
        let status = match written {
            Written::Created => "committed",
            Written::AlreadyThere => {
                permit
                    .record_outcome(Outcome::Replay)
                    .map_err(|e| format!("Error: {e}"))?;
                "replay"
            }
        };
        Ok(Json(WriteNoteResult {
            request_id: args.request_id,
            status: status.to_owned(),
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
        // Unused, but required: only the gate issues permits, so this cannot run undecided.
        Extension(_permit): Extension<Permit>,
    ) -> Result<CallToolResult, String> {
        let notes = Arc::clone(&self.notes);
        let payloads = blocking(move || notes.list()).await?;
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
        permit
            .record_outcome(Outcome::Refused)
            .map_err(|e| format!("Error: {e}"))?;
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

impl toolgate::Preflight for NotesPreflight {
    // Every caller may preview any path: the summary describes the path the caller named, and
    // the decoy never deletes it.
    fn prepare(
        &self,
        _caller: &toolgate::Caller,
        tool: &str,
        arguments: &rmcp::model::JsonObject,
    ) -> Result<toolgate::Preparation, String> {
        let canonical = serde_json::Value::Object(arguments.clone());
        match (
            tool,
            arguments.get("path").and_then(serde_json::Value::as_str),
        ) {
            ("rm_rf", Some(path)) => {
                let (entries, bytes, digest) = describe_tree(std::path::Path::new(path))?;
                Ok(toolgate::Preparation {
                    summary: format!("delete {path} recursively: {entries} entries, {bytes} bytes"),
                    content_hash: digest,
                })
            }
            _ => Ok(toolgate::Preparation {
                summary: format!(
                    "call {tool} with arguments sha256:{}",
                    toolgate::canon::Sha256Digest::of_json(&canonical)
                ),
                content_hash: toolgate::canon::Sha256Digest::of_json(&canonical),
            }),
        }
    }
}

/// Counts the entries and bytes under `root` (without following links) and digests their
/// relative paths, kinds, sizes and modification times, in sorted order.
fn describe_tree(
    root: &std::path::Path,
) -> Result<(usize, u64, toolgate::canon::Sha256Digest), String> {
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
        toolgate::canon::Sha256Digest::of_json(&serde_json::Value::Array(listing)),
    ))
}
