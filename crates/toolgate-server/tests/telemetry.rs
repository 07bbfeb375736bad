//! OpenTelemetry export: the real server over stdio, exporting OTLP/HTTP (JSON) to a collector
//! endpoint this test serves on loopback. Spans per the GenAI MCP conventions, parented by the
//! request's `_meta.traceparent`, failures marked, arguments absent; the duration histogram.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::TestEnv;
use serde_json::{Value, json};

/// Every OTLP request received: (path, JSON body).
type Received = Arc<Mutex<Vec<(String, Value)>>>;

/// A loopback endpoint answering every OTLP/HTTP export with 200.
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received: Received = Arc::default();
    let store = Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                // Requests on this connection, one after another (keep-alive).
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        if header == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    store.lock().unwrap().push((path, body));
                    let _ = writer.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
                    );
                }
            });
        }
    });
    (url, received)
}

/// Every span exported, flattened.
fn spans(received: &[(String, Value)]) -> Vec<Value> {
    received
        .iter()
        .filter(|(path, _)| path == "/v1/traces")
        .flat_map(|(_, body)| {
            body["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|r| r["scopeSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

#[test]
fn calls_are_traced_and_timed_per_the_mcp_conventions() {
    let env = TestEnv::new();
    let (url, received) = collector();
    let mut command = env.command();
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json");
    let mut server = common::Server::spawn(command, &env.path("stderr.log"));
    server.discover();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let mut meta = common::meta();
    meta["traceparent"] = json!(format!("00-{trace_id}-{parent}-01"));
    let secret = "a note nobody may read in a span";
    for (id, params) in [
        (
            101,
            json!({"name": "write_note", "arguments": {"request_id": "req-otel-0001", "text": secret}}),
        ),
        (102, json!({"name": "rm_rf", "arguments": {"path": "/"}})),
        (
            103,
            json!({"name": "write_note", "arguments": {"request_id": "short", "text": "x"}}),
        ),
    ] {
        let mut params = params;
        params["_meta"] = meta.clone();
        server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
        let _ = server.response(id);
    }
    let _ = server.list_tool_names();
    assert!(server.close().success(), "{}", server.stderr());

    let received = received.lock().unwrap().clone();
    let spans = spans(&received);
    let named =
        |name: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == name).collect() };
    let writes = named("tools/call write_note");
    assert_eq!(writes.len(), 2, "{spans:#?}");
    for span in &writes {
        assert_eq!(span["traceId"], json!(trace_id), "{span}");
        assert_eq!(span["parentSpanId"], json!(parent), "{span}");
        assert_eq!(span["kind"], json!(2), "a server span: {span}");
        assert_eq!(
            attribute(span, "gen_ai.tool.name"),
            Some(&json!({"stringValue": "write_note"}))
        );
        assert_eq!(
            attribute(span, "mcp.method.name"),
            Some(&json!({"stringValue": "tools/call"}))
        );
    }
    // The first write succeeded; the second was refused as a tool result (isError).
    let failed: Vec<_> = writes
        .iter()
        .filter_map(|s| attribute(s, "error.type"))
        .collect();
    assert_eq!(failed, [&json!({"stringValue": "tool_error"})]);
    // The denied tool: a JSON-RPC error, its code as the error type.
    let denied = named("tools/call rm_rf");
    assert_eq!(
        attribute(denied[0], "error.type"),
        Some(&json!({"stringValue": "-32602"}))
    );
    assert_eq!(denied[0]["status"]["code"], json!(2), "{}", denied[0]);
    assert_eq!(named("tools/list").len(), 1, "{spans:#?}");
    // Never an argument.
    let exported = serde_json::to_string(&received).unwrap();
    assert!(!exported.contains(secret) && !exported.contains("req-otel-0001"));
    // The duration histogram.
    assert!(
        received.iter().any(|(path, body)| path == "/v1/metrics"
            && body.to_string().contains("mcp.server.operation.duration")),
        "{received:#?}"
    );
}
