//! Shared helpers of the process-level tests: a real `toolgate-server` child over stdio, a raw
//! line client, 2026-07-28 request builders, file snapshots and audit readers.
//!
//! Nothing here sleeps for a fixed time: every wait is for a condition (a reply line, a marker
//! file, a process exit) with a generous deadline, so the tests hold on a loaded machine.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate::canon::Sha256Digest;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_toolgate-server");
/// The shipped reference policy.
pub const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
/// The tampered audit log fixtures.
pub const AUDIT_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/audit");
/// How long any single condition may take before a test fails.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// The protocol version of the 2026-07-28 flow.
pub const PROTOCOL_2026: &str = "2026-07-28";
/// The JSON-RPC error code of a denied or unknown tool.
pub const INVALID_PARAMS: i64 = -32602;

/// Environment variables a test process might inherit that would change the server's behaviour.
const SCRUBBED_ENV: [&str; 30] = [
    "TOOLGATE_STORE",
    "RUST_LOG",
    "TOOLGATE_AUDIT_KEY_FILE",
    "TOOLGATE_AUDIT_CHECKPOINT_EVERY",
    "TOOLGATE_AUDIT_CHECKPOINT_MIRROR",
    "TOOLGATE_AUDIT_SEGMENT_BYTES",
    "POLICY_PATH",
    "LEDGER_DIR",
    "TOOLGATE_CRASH_POINT",
    "TOOLGATE_CRASH_MARKER",
    "TOOLGATE_EXPECTED_DIGEST",
    "TOOLGATE_ATTESTATION",
    "TOOLGATE_ATTESTATION_KEY_FILE",
    "TOOLGATE_PREVIOUS_LOCK",
    "TOOLGATE_RIGHTS_FILE",
    "TOOLGATE_ENTITIES_FILE",
    "TOOLGATE_PRINCIPAL",
    "TOOLGATE_MAX_IN_FLIGHT",
    "TOOLGATE_MAX_LINE_BYTES",
    "TOOLGATE_PUBLIC_URL",
    "TOOLGATE_OAUTH_ISSUER",
    "TOOLGATE_OAUTH_JWKS_URL",
    "TOOLGATE_OAUTH_AUDIENCE",
    "TOOLGATE_OAUTH_PRINCIPAL_CLAIM",
    "TOOLGATE_OAUTH_TENANT_CLAIM",
    "TOOLGATE_OAUTH_ROLES_CLAIM",
    "TOOLGATE_OAUTH_ATTRIBUTE_CLAIMS",
    "TOOLGATE_OAUTH_JWKS_COOLDOWN",
    "TOOLGATE_HTTP_REQUEST_TIMEOUT",
    "TOOLGATE_HTTP_HEADER_TIMEOUT",
];

/// One test's private world: a tempdir with its own policy copy and ledger path.
#[derive(Debug)]
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub policy: PathBuf,
    pub ledger: PathBuf,
}

impl TestEnv {
    /// A fresh tempdir with `policy.json` copied from the fixture; the ledger is not created.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy = dir.path().join("policy.json");
        std::fs::copy(POLICY, &policy).expect("copy fixtures/policy.json");
        let ledger = dir.path().join("ledger");
        TestEnv {
            dir,
            policy,
            ledger,
        }
    }

    /// A path inside the tempdir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn audit_path(&self) -> PathBuf {
        self.ledger.join("audit.jsonl")
    }

    pub fn notes_dir(&self) -> PathBuf {
        self.ledger.join("notes")
    }

    /// `LEDGER_DIR/notes/<sha256 hex of request_id>.json`.
    pub fn note_path(&self, request_id: &str) -> PathBuf {
        self.notes_dir()
            .join(format!("{}.json", sha256_hex(request_id.as_bytes())))
    }

    /// The server's command line: `--policy P --ledger L`, scrubbed environment.
    pub fn command(&self) -> Command {
        let mut command = scrubbed_command();
        command
            .arg("--policy")
            .arg(&self.policy)
            .arg("--ledger")
            .arg(&self.ledger);
        command
    }

    /// The server's command line on the PostgreSQL store `url` (`TOOLGATE_STORE`).
    pub fn store_command(&self, url: &str) -> Command {
        let mut command = self.command();
        command.env("TOOLGATE_STORE", url);
        command
    }

    /// Starts the stdio server.
    pub fn spawn(&self) -> Server {
        Server::spawn(self.command(), &self.path(&unique_name("stderr")))
    }

    /// Starts the stdio server with extra environment variables.
    pub fn spawn_with_env(&self, vars: &[(&str, &Path)]) -> Server {
        let mut command = self.command();
        for (key, value) in vars {
            command.env(key, value);
        }
        Server::spawn(command, &self.path(&unique_name("stderr")))
    }

    /// Starts a server and completes `server/discover`.
    pub fn start(&self) -> Server {
        let mut server = self.spawn();
        server.discover();
        server
    }

    /// `toolgate-server audit verify --ledger LEDGER`.
    pub fn audit_verify(&self) -> Output {
        audit_verify(&self.ledger)
    }

    /// The note files (`<64 hex>.json`) in the notes directory, sorted by name.
    pub fn note_files(&self) -> Vec<PathBuf> {
        note_files(&self.notes_dir())
    }

    pub fn audit_records(&self) -> Vec<Value> {
        audit_records(&self.audit_path())
    }

    pub fn audit_text(&self) -> String {
        std::fs::read_to_string(self.audit_path()).unwrap_or_default()
    }

    /// Moves the finish of every finished exactly-once record in the ledger `by` into the past,
    /// as if it had been that long ago (for retention windows; no server may run on the ledger):
    /// a new journal with the times rewritten replaces the store's. The lines are canonical JSON
    /// with the times as 19-digit decimal strings, which stay 19 digits for any `by` of days.
    pub fn age_effects(&self, by: Duration) {
        let journal = self.ledger.join("effects").join("effects.journal");
        let mut text = String::from_utf8(std::fs::read(&journal).unwrap()).unwrap();
        let by = u64::try_from(by.as_nanos()).unwrap();
        let marker = "\"finished_ns\":\"";
        let (mut aged, mut from) = (0, 0);
        while let Some(at) = text[from..].find(marker) {
            let start = from + at + marker.len();
            let end = start + text[start..].find('"').unwrap();
            let new = (text[start..end].parse::<u64>().unwrap() - by).to_string();
            assert_eq!(new.len(), end - start, "the aged time keeps its length");
            text.replace_range(start..end, &new);
            aged += 1;
            from = end;
        }
        assert!(aged > 0, "no finished record in {}", journal.display());
        let temporary = journal.with_extension("aged");
        std::fs::write(&temporary, text).unwrap();
        std::fs::rename(&temporary, &journal).unwrap();
    }
}

/// A `Command` for the binary with the variables that steer it removed.
pub fn scrubbed_command() -> Command {
    let mut command = Command::new(BIN);
    for key in SCRUBBED_ENV {
        command.env_remove(key);
    }
    command
}

fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}.log", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A `toolgate-server` child speaking MCP over stdio, driven line by line.
///
/// The child is SIGKILLed when this value is dropped, so a failing test leaves no process behind.
#[derive(Debug)]
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Replies read while waiting for another id.
    stash: HashMap<String, Value>,
    /// Every stdout line received so far, in order.
    pub transcript: Vec<String>,
    pub stderr_path: PathBuf,
    next_id: u64,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Spawns `command` with piped stdin/stdout and stderr written to `stderr_path`.
    pub fn spawn(mut command: Command, stderr_path: &Path) -> Server {
        let stderr = File::create(stderr_path).expect("create the stderr capture file");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn toolgate-server");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Server {
            child,
            stdin,
            lines: rx,
            stash: HashMap::new(),
            transcript: Vec::new(),
            stderr_path: stderr_path.to_path_buf(),
            next_id: 1,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server wrote on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// A fresh JSON-RPC id.
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Writes raw bytes to stdin (the caller adds the newline).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).expect("write to the server's stdin");
        stdin.flush().expect("flush the server's stdin");
    }

    /// Writes one JSON value as one line.
    pub fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).expect("serialize");
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// Writes `bytes` from a separate thread (so a huge write cannot deadlock against the server's
    /// output), and waits until the write finished.
    pub fn send_raw_in_thread(&mut self, bytes: Vec<u8>) {
        let mut stdin = self.stdin.take().expect("stdin is open");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let result = stdin.write_all(&bytes).and_then(|()| stdin.flush());
            let _ = tx.send((stdin, result));
        });
        let (stdin, result) = rx
            .recv_timeout(TIMEOUT)
            .expect("the big write did not finish in time");
        result.expect("write the big line");
        self.stdin = Some(stdin);
    }

    /// The next stdout line, or a panic after [`TIMEOUT`].
    pub fn recv_line(&mut self) -> String {
        self.recv_line_within(TIMEOUT).unwrap_or_else(|| {
            panic!(
                "no stdout line within {TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// The next stdout line within `timeout`, or `None` (timeout or stdout closed).
    pub fn recv_line_within(&mut self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                self.transcript.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// The reply with JSON-RPC id `id`; other messages are stashed (replies) or skipped.
    pub fn response(&mut self, id: u64) -> Value {
        let key = json!(id).to_string();
        if let Some(reply) = self.stash.remove(&key) {
            return reply;
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.recv_line_within(left) else {
                panic!(
                    "no reply to id {id} within {TIMEOUT:?}; stdout so far:\n{}\nstderr:\n{}",
                    self.transcript.join(""),
                    self.stderr()
                );
            };
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                panic!("stdout line is not JSON: {line:?}");
            };
            match message.get("id") {
                Some(got) if *got == json!(id) => return message,
                Some(got) if message.get("method").is_none() => {
                    self.stash.insert(got.to_string(), message);
                }
                _ => {}
            }
        }
    }

    /// Sends a 2026-07-28 request and returns its id.
    pub fn send_request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id();
        self.send(&request(id, method, params));
        id
    }

    /// Sends a 2026-07-28 request and waits for its reply.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        self.response(id)
    }

    /// `server/discover`; asserts it succeeded and returns the result.
    pub fn discover(&mut self) -> Value {
        let reply = self.request("server/discover", json!({}));
        assert!(
            reply.get("result").is_some(),
            "server/discover failed: {reply}"
        );
        reply["result"].clone()
    }

    /// The 2025-11-25 handshake (`initialize` declaring `capabilities`, then
    /// `notifications/initialized`); asserts it succeeded and returns the result. Requests after it
    /// go without `_meta` ([`Server::send_legacy`]).
    pub fn initialize(&mut self, capabilities: Value) -> Value {
        let id = self.next_id();
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities,
                "clientInfo": {"name": "test-host", "version": "1.0.0"},
            }}),
        );
        let reply = self.response(id);
        assert!(reply.get("result").is_some(), "initialize failed: {reply}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        reply["result"].clone()
    }

    /// Sends a 2025-11-25 request (no `_meta`) and returns its id.
    pub fn send_legacy(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// `tools/list`; returns the tool names.
    pub fn list_tool_names(&mut self) -> Vec<String> {
        let reply = self.request("tools/list", json!({}));
        tool_names(&reply)
    }

    /// Sends a `tools/call` and returns its id (for pipelining).
    pub fn send_call(&mut self, name: &str, arguments: Value) -> u64 {
        self.send_request("tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// `tools/call` with the idempotency key `key` in its `_meta`; returns the whole reply.
    pub fn call_with_key(&mut self, name: &str, arguments: Value, key: &str) -> Value {
        let id = self.next_id();
        let mut message = request(
            id,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        );
        message["params"]["_meta"]["io.toolgate/idempotencyKey"] = json!(key);
        self.send(&message);
        self.response(id)
    }

    /// `tools/call`; returns the whole reply (`result` or `error`).
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        let id = self.send_call(name, arguments);
        self.response(id)
    }

    /// `write_note`; returns the whole reply.
    pub fn write_note(&mut self, request_id: &str, text: &str) -> Value {
        self.call(
            "write_note",
            json!({"request_id": request_id, "text": text}),
        )
    }

    /// Closes stdin and waits for the server to exit.
    pub fn close(&mut self) -> ExitStatus {
        self.stdin = None;
        let status = wait_exit(&mut self.child, TIMEOUT).unwrap_or_else(|| {
            panic!(
                "the server did not exit after EOF; stderr:\n{}",
                self.stderr()
            )
        });
        // Collect whatever stdout still holds (the reader thread ends at EOF).
        while let Some(line) = self.recv_line_within(TIMEOUT) {
            let _ = line;
        }
        status
    }

    /// Waits for the server to exit by itself, with stdin still open.
    pub fn wait_exit(&mut self) -> ExitStatus {
        wait_exit(&mut self.child, TIMEOUT).unwrap_or_else(|| {
            panic!(
                "the server did not exit within {TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            )
        })
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until `path` exists, failing early if the server exits.
    pub fn wait_for_file(&mut self, path: &Path) {
        self.wait_for_file_where(path, |_| true);
    }

    /// Waits until `path` exists with content accepted by `ready` (a file is created before it is
    /// written, so a watcher can see it empty), failing early if the server exits.
    pub fn wait_for_file_where(&mut self, path: &Path, ready: impl Fn(&[u8]) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !std::fs::read(path).is_ok_and(|bytes| ready(&bytes)) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the server exited ({status}) before {} appeared; stderr:\n{}",
                    path.display(),
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not appear (complete) within {TIMEOUT:?}; stderr:\n{}",
                path.display(),
                self.stderr()
            );
            poll_pause();
        }
    }
}

/// The short pause between two polls of a condition (not a wait for anything by itself).
pub fn poll_pause() {
    std::thread::sleep(Duration::from_millis(10));
}

/// Waits up to `timeout` for `child` to exit.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        poll_pause();
    }
}

/// Runs a short-lived command (CLI subcommands, failing starts) with stdin closed, collecting its
/// output, killing it if it exceeds [`TIMEOUT`].
pub fn run_to_end(mut command: Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolgate-server");
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        let _ = tx.send(buf);
    });
    let Some(status) = wait_exit(&mut child, TIMEOUT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("toolgate-server (pid {pid}) did not finish within {TIMEOUT:?}");
    };
    let stdout = rx.recv_timeout(TIMEOUT).expect("collect stdout");
    let stderr = err_thread.join().expect("collect stderr");
    Output {
        status,
        stdout,
        stderr,
    }
}

/// [`run_to_end`] with stdout a pipe whose reader has already gone, as in `toolgate-server …
/// | head -1` once head has its line: every write to stdout fails with EPIPE. The output's stdout
/// is empty.
pub fn run_into_closed_pipe(mut command: Command) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolgate-server");
    // The command's own copy of the writer is the only one left once `command` is dropped.
    drop(command);
    let mut stderr = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let Some(status) = wait_exit(&mut child, TIMEOUT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("toolgate-server did not finish within {TIMEOUT:?}");
    };
    Output {
        status,
        stdout: Vec::new(),
        stderr: err_thread.join().expect("collect stderr"),
    }
}

/// `toolgate-server audit verify --ledger LEDGER`.
pub fn audit_verify(ledger: &Path) -> Output {
    let mut command = scrubbed_command();
    command.args(["audit", "verify", "--ledger"]).arg(ledger);
    run_to_end(command)
}

/// stdout and stderr of `output`, joined, for assertions and messages.
pub fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The `_meta` every 2026-07-28 request carries.
pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_2026,
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A 2026-07-28 JSON-RPC request: `params` (an object) gets the `_meta` of [`meta`].
pub fn request(id: u64, method: &str, params: Value) -> Value {
    let mut params = match params {
        Value::Object(map) => map,
        Value::Null => serde_json::Map::new(),
        other => panic!("params must be an object, got {other}"),
    };
    params.insert("_meta".to_owned(), meta());
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// The tool names of a `tools/list` reply.
pub fn tool_names(reply: &Value) -> Vec<String> {
    let tools = reply["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("tools/list reply has no tools array: {reply}"));
    tools
        .iter()
        .map(|tool| tool["name"].as_str().expect("tool name").to_owned())
        .collect()
}

/// The `result` of a tool call reply, asserting it is not a JSON-RPC error.
pub fn result_of(reply: &Value) -> &Value {
    assert!(
        reply.get("error").is_none(),
        "expected a result, got a JSON-RPC error: {reply}"
    );
    reply
        .get("result")
        .unwrap_or_else(|| panic!("no result: {reply}"))
}

/// `status` of a successful `write_note` reply, asserting `isError` is not set.
pub fn note_status(reply: &Value) -> String {
    let result = result_of(reply);
    assert_ne!(
        result.get("isError"),
        Some(&Value::Bool(true)),
        "write_note failed: {reply}"
    );
    result["structuredContent"]["status"]
        .as_str()
        .unwrap_or_else(|| panic!("no structuredContent.status: {reply}"))
        .to_owned()
}

/// The first text content of a tool result.
pub fn first_text(reply: &Value) -> String {
    result_of(reply)["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {reply}"))
        .to_owned()
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256Digest::of(bytes).to_hex()
}

/// The exact bytes of a note file: canonical `{"request_id":…,"text":…}`.
pub fn note_bytes(request_id: &str, text: &str) -> Vec<u8> {
    toolgate::canon::canonical_value(&json!({"request_id": request_id, "text": text}))
}

/// The note files (`<64 hex>.json`) in `dir`, sorted by name.
pub fn note_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.len() == 64 + 5
                && name.ends_with(".json")
                && name[..64]
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
        .collect();
    files.sort();
    files
}

/// What an observer can see of a file: existence, size, mtime and content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub exists: bool,
    pub size: u64,
    pub mtime_ns: i128,
    pub sha256: Option<String>,
}

pub fn snapshot(path: &Path) -> Snapshot {
    match (std::fs::metadata(path), std::fs::read(path)) {
        (Ok(meta), Ok(bytes)) => Snapshot {
            exists: true,
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            sha256: Some(sha256_hex(&bytes)),
        },
        _ => Snapshot {
            exists: false,
            size: 0,
            mtime_ns: 0,
            sha256: None,
        },
    }
}

/// Every line of an audit log, parsed (an absent log is empty).
pub fn audit_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("audit line is not JSON ({e}): {line}"))
        })
        .collect()
}

/// Counts of `outcome` over records matching `name` and `decision`.
pub fn outcome_counts(records: &[Value], name: &str, decision: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for record in records
        .iter()
        .filter(|r| r["name"] == name && r["decision"] == decision)
    {
        *counts
            .entry(record["outcome"].as_str().unwrap_or("?").to_owned())
            .or_insert(0) += 1;
    }
    counts
}

/// Asserts `audit verify` exits 0 on `ledger`.
pub fn assert_verifies(ledger: &Path) {
    let output = audit_verify(ledger);
    assert!(
        output.status.success(),
        "audit verify failed ({}): {}",
        output.status,
        output_text(&output)
    );
}

/// Sends SIGHUP to `pid` (a policy reload), asserting that it was delivered.
pub fn sighup(pid: u32) {
    let status = Command::new("kill")
        .arg("-HUP")
        .arg(pid.to_string())
        .status()
        .expect("runs kill");
    assert!(status.success(), "kill -HUP {pid}: {status}");
}
