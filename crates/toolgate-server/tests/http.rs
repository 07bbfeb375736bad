//! `toolgate-server serve --http` as a real process, driven by raw HTTP/1.1 requests on loopback:
//! API tokens created and revoked by the CLI, every request authenticated, the principal from the
//! token only, refusals audited without the token, Origin checked, sessions bound to principals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{TestEnv, output_text};
use serde_json::{Value, json};

/// Runs an operator command of `env` and returns its stdout, asserting success.
fn operator(env: &TestEnv, args: &[&str]) -> String {
    let output = common::run_to_end({
        let mut command = env.command();
        command.args(args);
        command
    });
    assert!(output.status.success(), "{}", output_text(&output));
    String::from_utf8(output.stdout).unwrap()
}

fn create_token(env: &TestEnv, principal: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", "--principal", principal];
    args.extend_from_slice(extra);
    operator(env, &args).trim().to_owned()
}

/// The server over HTTP, killed on drop.
struct HttpServer {
    child: Child,
    port: u16,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpServer {
    fn start(env: &TestEnv) -> HttpServer {
        let mut command = env.command();
        command.args(["serve", "--http", "127.0.0.1:0"]);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line
                    .split("serving Streamable HTTP at http://127.0.0.1:")
                    .nth(1)
                {
                    let port: u16 = at.split('/').next().unwrap().parse().unwrap();
                    let _ = tx.send(port);
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server says where it listens");
        HttpServer { child, port }
    }

    /// POSTs `body` to /mcp with `headers`; returns the status, the headers (lowercased names)
    /// and the body.
    fn post(&self, headers: &[(&str, &str)], body: &Value) -> (u16, Vec<(String, String)>, String) {
        let body = body.to_string();
        let mut request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.port,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        self.exchange(&request)
    }

    fn get(&self, path: &str) -> (u16, Vec<(String, String)>, String) {
        self.exchange(&format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        ))
    }

    fn exchange(&self, request: &str) -> (u16, Vec<(String, String)>, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
            .collect::<Vec<_>>();
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        };
        (status, headers, body)
    }

    /// A JSON-RPC request of the 2026-07-28 flow, with its headers, as `token`'s holder.
    fn call(&self, token: &str, id: u64, method: &str, mut params: Value) -> (u16, Value) {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        });
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let auth = format!("Bearer {token}");
        let mut headers = vec![
            ("Authorization", auth.as_str()),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
        ];
        if !name.is_empty() {
            headers.push(("Mcp-Name", name.as_str()));
        }
        let (status, _, body) = self.post(
            &headers,
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn note_call(request_id: &str) -> Value {
    json!({"name": "write_note", "arguments": {"request_id": request_id, "text": "over http"}})
}

fn status_of(reply: &Value) -> String {
    let result = &reply["result"];
    assert_ne!(result["isError"], json!(true), "{reply}");
    result["structuredContent"]["status"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_owned()
}

#[test]
fn every_request_is_authenticated_and_served_as_its_tokens_principal() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let bob = create_token(&env, "bob", &[]);
    let expired = create_token(&env, "carol", &["--expires-in", "0"]);
    assert!(alice.starts_with("tgt_") && alice.len() == 68, "{alice}");
    let server = HttpServer::start(&env);

    // Without a token, with garbage, with an expired one: 401 and the challenge.
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}});
    let (status, headers, body) = server.post(&[("MCP-Protocol-Version", "2026-07-28")], &discover);
    assert_eq!(status, 401, "{body}");
    let challenge = header(&headers, "www-authenticate").unwrap();
    assert!(
        challenge.starts_with("Bearer ")
            && challenge.contains(&format!(
                "resource_metadata=\"http://127.0.0.1:{}/.well-known/oauth-protected-resource\"",
                server.port
            )),
        "{challenge}"
    );
    assert!(body.contains("missing_token"), "{body}");
    for (token, code) in [
        ("not-a-token", "invalid_token"),
        (&format!("tgt_{}", "0".repeat(64)), "invalid_token"),
        (expired.as_str(), "expired_token"),
    ] {
        let (status, reply) = server.call(token, 2, "tools/list", json!({}));
        assert_eq!(status, 401, "{reply}");
        assert_eq!(reply["error"], json!(code), "{reply}");
    }

    // The metadata names the resource.
    let (status, _, body) = server.get("/.well-known/oauth-protected-resource");
    assert_eq!(status, 200, "{body}");
    let metadata: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        metadata["resource"],
        json!(format!("http://127.0.0.1:{}/mcp", server.port))
    );

    // A valid token: served, exactly once per key and per principal.
    let (status, reply) = server.call(&alice, 3, "server/discover", json!({}));
    assert_eq!(status, 200, "{reply}");
    let (_, listed) = server.call(&alice, 4, "tools/list", json!({}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"write_note") && !names.contains(&"rm_rf"),
        "{names:?}"
    );
    // Filtered for this principal: not for a shared cache.
    assert_eq!(listed["result"]["cacheScope"], json!("private"), "{listed}");
    let (_, first) = server.call(&alice, 5, "tools/call", note_call("req-http-0001"));
    assert_eq!(status_of(&first), "committed");
    let (_, again) = server.call(&alice, 6, "tools/call", note_call("req-http-0001"));
    assert_eq!(status_of(&again), "replay");
    // Another principal's key space: bob's call with the same key executes for bob.
    let (_, bobs) = server.call(&bob, 7, "tools/call", note_call("req-http-0002"));
    assert_eq!(status_of(&bobs), "committed");

    // A foreign Origin is refused even with a valid token.
    let auth = format!("Bearer {alice}");
    let (status, _, body) = server.post(
        &[
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
            ("Origin", "http://evil.example"),
        ],
        &json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}}),
    );
    assert_eq!(status, 403, "{body}");

    // Revoked while the server runs: refused from the next request on.
    let id = operator(&env, &["token", "list"])
        .lines()
        .find(|l| l.contains(" alice "))
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    operator(&env, &["token", "revoke", &id]);
    let (status, reply) = server.call(&alice, 9, "tools/list", json!({}));
    assert_eq!(status, 401, "{reply}");
    assert_eq!(reply["error"], json!("revoked_token"));

    drop(server);
    let audit = env.audit_text();
    for token in [&alice, &bob, &expired] {
        assert!(
            !audit.contains(token.as_str()),
            "a token reached the audit log"
        );
    }
    let records = env.audit_records();
    let calls: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["name"] == "write_note")
        .map(|r| {
            (
                r["principal"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("alice", "committed"),
            ("alice", "replay"),
            ("bob", "committed")
        ]
    );
    let refusals: Vec<&str> = records
        .iter()
        .filter(|r| r["method"] == "http/authenticate")
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        refusals,
        [
            "missing_token",
            "invalid_token",
            "invalid_token",
            "expired_token",
            "revoked_token"
        ]
    );
    let changes = records
        .iter()
        .filter(|r| r["method"] == "admin/token")
        .count();
    assert_eq!(changes, 4, "three creations and a revocation");
    assert!(env.audit_verify().status.success());
}

#[test]
fn http_refuses_a_configured_principal() {
    let env = TestEnv::new();
    let output = common::run_to_end({
        let mut command = env.command();
        command.args(["--principal", "alice", "serve", "--http", "127.0.0.1:0"]);
        command
    });
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("token create"),
        "{}",
        output_text(&output)
    );
}

#[test]
fn a_session_belongs_to_the_principal_that_opened_it() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let bob = create_token(&env, "bob", &[]);
    let mut server = HttpServer::start(&env);
    let (alice_auth, bob_auth) = (format!("Bearer {alice}"), format!("Bearer {bob}"));
    let (status, headers, body) = server.post(
        &[("Authorization", &alice_auth)],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "http-test", "version": "1"}}}),
    );
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id")
        .unwrap_or_else(|| panic!("a session id: {headers:?}"))
        .to_owned();
    let on_session = |auth: &str| {
        vec![
            ("Authorization", auth.to_owned()),
            ("Mcp-Session-Id", session.clone()),
            ("MCP-Protocol-Version", "2025-11-25".to_owned()),
        ]
    };
    let send = |server: &HttpServer, headers: Vec<(&'static str, String)>, body: Value| {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        server.post(&headers, &body)
    };
    let (status, _, body) = send(
        &server,
        on_session(&alice_auth),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert!(status == 202 || status == 200, "{status} {body}");
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    // Bob's valid token on alice's session: as unknown as a session that never existed.
    let (status, _, body) = send(&server, on_session(&bob_auth), list.clone());
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = send(&server, on_session(&alice_auth), list);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("write_note"), "{body}");

    // A clean stop on SIGTERM, the chain intact.
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = common::wait_exit(&mut server.child, Duration::from_secs(120))
        .expect("the server stops on SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(env.audit_verify().status.success());
}
