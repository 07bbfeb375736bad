//! What the benches that drive a server over stdio share (`stdio.rs`, `proxy.rs`, `calls.rs`): a
//! child process
//! spoken to in raw JSON-RPC lines on its stdin and stdout, one request in flight, the 2026-07-28
//! flow (`server/discover`, then requests with per-request `_meta`).
//!
//! It lives in a directory so that cargo does not take it for a bench of its own. Each bench uses
//! a part of it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

/// The per-request `_meta` of the 2026-07-28 protocol.
pub(crate) fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A child process speaking JSON-RPC lines on stdin/stdout (its stderr is discarded).
pub(crate) struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Peer {
    pub(crate) fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server binary starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one request without waiting; returns its id.
    pub(crate) fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut text = serde_json::to_string(&line).unwrap();
        text.push('\n');
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        id
    }

    /// The next message the child writes.
    pub(crate) fn read(&mut self) -> Value {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line).unwrap();
        assert!(read > 0, "the child closed stdout");
        serde_json::from_str(&line).expect("the child writes JSON lines")
    }

    /// Writes `line` (with its `\n`) and reads one line back, as it is (for a `cat` child).
    pub(crate) fn round_trip(&mut self, line: &str) -> String {
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let mut back = String::new();
        self.stdout.read_line(&mut back).unwrap();
        back
    }

    /// Sends one request and waits for the reply with its id.
    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        loop {
            let message = self.read();
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
        }
    }

    /// `server/discover` (2026-07-28), which must succeed.
    pub(crate) fn discover(&mut self) -> Value {
        let discover = self.request("server/discover", json!({"_meta": meta()}));
        assert!(
            discover.get("result").is_some(),
            "discover failed: {discover}"
        );
        discover
    }

    /// `tools/call` of `tool`, which must succeed; returns its result.
    pub(crate) fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let reply = self.request(
            "tools/call",
            json!({"name": tool, "arguments": arguments, "_meta": meta()}),
        );
        let result = reply
            .get("result")
            .unwrap_or_else(|| panic!("{tool} failed: {reply}"));
        assert_ne!(result["isError"], json!(true), "{tool} failed: {reply}");
        result.clone()
    }

    /// Closes stdin and waits for a clean exit.
    pub(crate) fn close(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the server exited with {status}");
    }
}
