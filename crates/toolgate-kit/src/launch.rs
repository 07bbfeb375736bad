//! Starting the server under test, and a raw JSON-lines MCP client that controls every id.
//!
//! The kit writes JSON-RPC itself instead of using rmcp's client because the matrix needs what a
//! well-behaved client never does: discard a response it received, reuse a request on a new
//! connection with a chosen new id, and send two identical requests at the same instant.

use std::collections::HashMap;
use std::fmt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::{ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::KitError;

/// The protocol revision the kit speaks first: `server/discover`, then `_meta` on every request.
pub(crate) const PROTOCOL_VERSION: &str = "2026-07-28";
/// The revision it falls back to when a server refuses `server/discover` (most servers today,
/// the TypeScript SDK's among them): the `initialize` handshake, then plain requests.
pub(crate) const LEGACY_PROTOCOL_VERSION: &str = "2025-11-25";

/// In-process duplex buffer: large enough for any fixture or result line.
const DUPLEX_BYTES: usize = 1 << 20;

type ChildFactory = Arc<dyn Fn() -> std::process::Command + Send + Sync>;
type ServeFn = Arc<dyn Fn(tokio::io::DuplexStream) -> JoinHandle<()> + Send + Sync>;

/// How the kit starts the server under test. Every connection gets a new server (a new child
/// process, or a new handler from the factory), so state must live where the observer looks:
/// on disk, in a database, or in an `Arc` the factory shares.
#[derive(Clone)]
pub struct Launcher {
    kind: LauncherKind,
}

#[derive(Clone)]
enum LauncherKind {
    Child(ChildFactory),
    InProcess(ServeFn),
}

impl fmt::Debug for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            LauncherKind::Child(_) => f.write_str("Launcher::child(..)"),
            LauncherKind::InProcess(_) => f.write_str("Launcher::in_process(..)"),
        }
    }
}

impl Launcher {
    /// A child process speaking MCP over stdio, one per connection. `command` builds the command
    /// line each time (stdin, stdout and stderr are set by the kit; stderr is kept for errors).
    /// Closing a connection closes the child's stdin and waits for it to exit.
    pub fn child(command: impl Fn() -> std::process::Command + Send + Sync + 'static) -> Self {
        Launcher {
            kind: LauncherKind::Child(Arc::new(command)),
        }
    }

    /// An rmcp handler built by `factory` for each connection and served over an in-memory
    /// duplex with rmcp's async read/write transport. Closing a connection drops the client side
    /// and waits for the server task to end.
    pub fn in_process<H, F>(factory: F) -> Self
    where
        H: ServerHandler,
        F: Fn() -> H + Send + Sync + 'static,
    {
        let serve: ServeFn = Arc::new(move |stream| {
            let handler = factory();
            tokio::spawn(async move {
                // A client that leaves before the handshake is not an error of the server; any
                // failure shows up on the client side as a closed connection.
                if let Ok(running) = handler.serve(stream).await {
                    let _ = running.waiting().await;
                }
            })
        });
        Launcher {
            kind: LauncherKind::InProcess(serve),
        }
    }
}

enum End {
    Child(tokio::process::Child),
    Task(JoinHandle<()>),
}

/// One MCP connection to a fresh server, after `server/discover` (or `initialize`).
pub(crate) struct Connection {
    /// Whether the server only speaks the `initialize` flow: requests then carry no 2026-07-28
    /// `_meta` keys.
    legacy: bool,
    writer: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    lines: mpsc::UnboundedReceiver<String>,
    stash: HashMap<String, Value>,
    end: End,
    stderr: Arc<Mutex<Vec<u8>>>,
    timeout: Duration,
    ids: Arc<AtomicU64>,
}

fn spawn_line_reader(
    reader: impl AsyncRead + Send + Unpin + 'static,
) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Connection {
    /// Starts a server with `launcher` and completes `server/discover`.
    pub(crate) async fn open(
        launcher: &Launcher,
        ids: Arc<AtomicU64>,
        timeout: Duration,
    ) -> Result<Connection, KitError> {
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (writer, lines, end): (Box<dyn AsyncWrite + Send + Unpin>, _, _) = match &launcher.kind
        {
            LauncherKind::Child(factory) => {
                let mut command = tokio::process::Command::from(factory());
                command
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true);
                let mut child = command.spawn().map_err(|source| KitError::Launch {
                    what: format!("{:?}", command.as_std()),
                    source,
                })?;
                let (Some(stdin), Some(stdout), Some(mut err)) =
                    (child.stdin.take(), child.stdout.take(), child.stderr.take())
                else {
                    return Err(KitError::Launch {
                        what: format!("{:?}", command.as_std()),
                        source: std::io::Error::other("the child's stdio was not piped"),
                    });
                };
                let sink = stderr.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = err.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        sink.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .extend_from_slice(&buf[..n]);
                    }
                });
                (
                    Box::new(stdin),
                    spawn_line_reader(stdout),
                    End::Child(child),
                )
            }
            LauncherKind::InProcess(serve) => {
                let (client, server) = tokio::io::duplex(DUPLEX_BYTES);
                let task = serve(server);
                let (read, write) = tokio::io::split(client);
                (Box::new(write), spawn_line_reader(read), End::Task(task))
            }
        };
        let mut connection = Connection {
            legacy: false,
            writer: Some(writer),
            lines,
            stash: HashMap::new(),
            end,
            stderr,
            timeout,
            ids,
        };
        let (_, reply) = connection.request("server/discover", json!({})).await?;
        if reply.get("result").is_some() {
            return Ok(connection);
        }
        // Refused (method not found, or an unsupported version): the 2025-11-25 handshake.
        connection.legacy = true;
        let (_, reply) = connection
            .request(
                "initialize",
                json!({
                    "protocolVersion": LEGACY_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "toolgate-kit", "version": env!("CARGO_PKG_VERSION")},
                }),
            )
            .await?;
        if reply.get("result").is_none() {
            return Err(KitError::Protocol {
                what: "server/discover and initialize".to_owned(),
                message: format!("neither handshake succeeded; initialize answered {reply}"),
            });
        }
        connection
            .notify("notifications/initialized", json!({}))
            .await?;
        Ok(connection)
    }

    /// What a child server wrote on stderr so far (empty in-process).
    pub(crate) fn stderr(&self) -> String {
        let bytes = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Sends a 2026-07-28 request with a new id (unique across every connection of the run).
    pub(crate) async fn send(&mut self, method: &str, params: Value) -> Result<u64, KitError> {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut params = match params {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        if !self.legacy {
            params.insert(
                "_meta".to_owned(),
                json!({
                    "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
                    "io.modelcontextprotocol/clientCapabilities": {}
                }),
            );
        }
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.write_line(&message, &format!("sending {method} (id {id})"))
            .await?;
        Ok(id)
    }

    /// Sends a notification (no id, no reply).
    pub(crate) async fn notify(&mut self, method: &str, params: Value) -> Result<(), KitError> {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.write_line(&message, &format!("sending {method}"))
            .await
    }

    async fn write_line(&mut self, message: &Value, what: &str) -> Result<(), KitError> {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        let stderr = self.stderr();
        let what = what.to_owned();
        let Some(writer) = self.writer.as_mut() else {
            return Err(KitError::Closed { what, stderr });
        };
        let written = async {
            writer.write_all(&line).await?;
            writer.flush().await
        };
        written.await.map_err(|source| KitError::Io {
            what,
            source,
            stderr,
        })
    }

    /// The reply to `id` (other replies are kept for later; notifications and server requests
    /// are skipped), or a timeout error.
    pub(crate) async fn response(&mut self, id: u64) -> Result<Value, KitError> {
        let deadline = Instant::now() + self.timeout;
        match self.response_until(id, deadline).await? {
            Some(reply) => Ok(reply),
            None => Err(KitError::Timeout {
                what: format!("the reply to id {id}"),
                after: self.timeout,
                stderr: self.stderr(),
            }),
        }
    }

    /// The reply to `id` if it arrives before `deadline`, else `None`.
    pub(crate) async fn response_until(
        &mut self,
        id: u64,
        deadline: Instant,
    ) -> Result<Option<Value>, KitError> {
        let key = json!(id).to_string();
        if let Some(reply) = self.stash.remove(&key) {
            return Ok(Some(reply));
        }
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    return Err(KitError::Closed {
                        what: format!("waiting for the reply to id {id}"),
                        stderr: self.stderr(),
                    });
                }
                Err(_) => return Ok(None),
            };
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                return Err(KitError::Protocol {
                    what: format!("request id {id}"),
                    message: format!("a line that is not JSON: {line:?}"),
                });
            };
            match message.get("id") {
                Some(got) if *got == json!(id) && message.get("method").is_none() => {
                    return Ok(Some(message));
                }
                Some(got) if message.get("method").is_none() => {
                    self.stash.insert(got.to_string(), message);
                }
                _ => {}
            }
        }
    }

    /// Sends a request and waits for its reply.
    pub(crate) async fn request(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<(u64, Value), KitError> {
        let id = self.send(method, params).await?;
        let reply = self.response(id).await?;
        Ok((id, reply))
    }

    /// Every tool of `tools/list`, following `nextCursor`.
    pub(crate) async fn list_tools(&mut self) -> Result<Vec<Value>, KitError> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let (_, reply) = self.request("tools/list", params).await?;
            let Some(page) = reply["result"]["tools"].as_array() else {
                return Err(KitError::Protocol {
                    what: "tools/list".to_owned(),
                    message: format!("no result.tools array: {reply}"),
                });
            };
            tools.extend(page.iter().cloned());
            match reply["result"].get("nextCursor") {
                Some(next) if !next.is_null() => cursor = Some(next.clone()),
                _ => return Ok(tools),
            }
        }
    }

    /// Cuts the connection: closes the client's writing side and waits (up to the timeout) for
    /// the server to end. A child is killed if it does not exit, and that is an error.
    pub(crate) async fn close(mut self) -> Result<(), KitError> {
        if let Some(mut writer) = self.writer.take() {
            // Shutdown, not just drop: an in-process duplex stays open while the reader half
            // lives, and the server must see the end of its input. A failure means the server
            // already went away, which is what closing wants anyway.
            let _ = writer.shutdown().await;
        }
        let stderr = self.stderr();
        let timeout = self.timeout;
        match &mut self.end {
            End::Child(child) => match tokio::time::timeout(timeout, child.wait()).await {
                Ok(Ok(_status)) => Ok(()),
                Ok(Err(source)) => Err(KitError::Io {
                    what: "waiting for the server to exit".to_owned(),
                    source,
                    stderr,
                }),
                Err(_) => {
                    let _ = child.kill().await;
                    Err(KitError::Timeout {
                        what: "the server's exit after its stdin was closed".to_owned(),
                        after: timeout,
                        stderr,
                    })
                }
            },
            End::Task(task) => match tokio::time::timeout(timeout, &mut *task).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(KitError::Task {
                    what: "the in-process server".to_owned(),
                    message: e.to_string(),
                }),
                Err(_) => {
                    task.abort();
                    Err(KitError::Timeout {
                        what: "the in-process server's end after the client left".to_owned(),
                        after: timeout,
                        stderr,
                    })
                }
            },
        }
    }
}
