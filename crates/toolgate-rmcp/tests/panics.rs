//! A panicking handler under the gate, served over `StdioTransport` with few slots in flight:
//! every panic is answered (so its slot is given back) and recorded, and the connection serves on.
//!
//! Runs on tokio's paused clock: a reply that never comes fails after an hour of idle runtime,
//! never after a sleep.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream, ReadHalf};
use toolgate_stdio::{StdioConfig, StdioTransport};

const HOUR: Duration = Duration::from_secs(3600);

/// The client's halves of a duplex pipe whose other end a `StdioTransport` serves.
struct Client {
    write: tokio::io::WriteHalf<DuplexStream>,
    read: BufReader<ReadHalf<DuplexStream>>,
}

impl Client {
    async fn send(&mut self, messages: &[Value]) {
        for message in messages {
            let mut line = serde_json::to_vec(message).unwrap();
            line.push(b'\n');
            self.write.write_all(&line).await.unwrap();
        }
        self.write.flush().await.unwrap();
    }

    async fn reply(&mut self) -> Value {
        let mut line = String::new();
        let read = tokio::time::timeout(HOUR, self.read.read_line(&mut line))
            .await
            .expect("no reply: the runtime went idle")
            .unwrap();
        assert!(read > 0, "the server closed its output");
        serde_json::from_str(&line).unwrap()
    }
}

/// Serves `handler` with at most `slots` requests in flight, after the 2025-11-25 handshake.
async fn serve<H: ServerHandler>(
    handler: H,
    slots: usize,
) -> (Client, tokio::task::JoinHandle<()>) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (server_r, server_w) = tokio::io::split(server);
    let (client_r, client_w) = tokio::io::split(client);
    let config = StdioConfig::new().max_in_flight(NonZeroUsize::new(slots).unwrap());
    let transport = StdioTransport::with_config(server_r, server_w, config);
    let serving = tokio::spawn(async move {
        let running = handler.serve(transport).await.unwrap();
        let _ = running.waiting().await;
    });
    let mut client = Client {
        write: client_w,
        read: BufReader::new(client_r),
    };
    client
        .send(&[
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}),
        ])
        .await;
    assert_eq!(client.reply().await["id"], 0);
    client
        .send(&[json!({"jsonrpc": "2.0", "method": "notifications/initialized"})])
        .await;
    (client, serving)
}

/// A gated server whose `boom` tool panics.
#[derive(Clone)]
struct Panicking {
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

#[rmcp::tool_router]
impl Panicking {
    #[rmcp::tool]
    async fn boom(
        &self,
        rmcp::handler::server::tool::Extension(_permit): rmcp::handler::server::tool::Extension<
            toolgate_rmcp::Permit,
        >,
    ) -> String {
        panic!("the handler of boom fails on every call")
    }

    #[rmcp::tool]
    async fn fine(
        &self,
        rmcp::handler::server::tool::Extension(_permit): rmcp::handler::server::tool::Extension<
            toolgate_rmcp::Permit,
        >,
    ) -> String {
        "fine".to_owned()
    }
}

#[rmcp::tool_handler(router = self.tool_router)]
impl ServerHandler for Panicking {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

fn named_call(id: i64, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {}}})
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_answered_and_frees_its_slot() {
    const N: usize = 2;
    let audit = Arc::new(toolgate_audit::MemoryAuditLog::new());
    let gated = toolgate_rmcp::Gated::builder(Panicking {
        tool_router: Panicking::tool_router(),
    })
    .policy(toolgate_policy::Policy::from_json(r#"{"version":1,"allow":["boom","fine"]}"#).unwrap())
    .audit(Arc::clone(&audit) as Arc<dyn toolgate_audit::AuditSink>)
    .build()
    .unwrap();
    let (mut client, serving) = serve(gated, N).await;

    // Three times as many panics as there are slots, pipelined: each is answered -32603 without
    // the panic's message, and the connection still serves.
    const PANICS: i64 = 3 * N as i64;
    client
        .send(
            &(1..=PANICS)
                .map(|n| named_call(n, "boom"))
                .collect::<Vec<_>>(),
        )
        .await;
    let mut answered = Vec::new();
    for _ in 1..=PANICS {
        let reply = client.reply().await;
        assert_eq!(reply["error"]["code"], -32603, "{reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains("panicked"), "{message}");
        assert!(!message.contains("fails on every call"), "{message}");
        answered.push(reply["id"].as_i64().unwrap());
    }
    answered.sort_unstable();
    assert_eq!(answered, (1..=PANICS).collect::<Vec<_>>());
    client.send(&[named_call(100, "fine")]).await;
    let reply = client.reply().await;
    assert_eq!(reply["id"], 100);
    assert_eq!(reply["result"]["content"][0]["text"], "fine", "{reply}");

    // Every panicked call left its record, as an error.
    let records: Vec<Value> = String::from_utf8(audit.bytes())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let errors = records
        .iter()
        .filter(|r| r["name"] == "boom" && r["decision"] == "allow" && r["outcome"] == "error")
        .count();
    assert_eq!(errors, PANICS as usize, "{records:?}");
    drop(client);
    let _ = tokio::time::timeout(HOUR, serving).await;
}
