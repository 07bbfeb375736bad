//! `StdioTransport` over `tokio::io::duplex`: what each kind of bad line gets, and the bound on
//! requests in flight, on the transport alone and under rmcp with a handler whose calls block.
//!
//! The tests run on tokio's paused clock. A `blocked` check is a timeout of an hour that elapses
//! only when the runtime has nothing left to do (the clock jumps forward only then), so "the
//! transport reads nothing more" is decided by an idle runtime, never by sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, EmptyResult, ErrorData,
    JsonRpcMessage, RequestId, ServerCapabilities, ServerConfig, ServerResult,
};
use rmcp::service::{RequestContext, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream, ReadHalf};
use tokio::sync::{Semaphore, mpsc};
use toolgate_stdio::{StdioConfig, StdioTransport};

const HOUR: Duration = Duration::from_secs(3600);

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

type Server = StdioTransport<ReadHalf<DuplexStream>, tokio::io::WriteHalf<DuplexStream>>;

/// A transport on one end of a duplex pipe, and the client's halves of the other.
fn pair(config: StdioConfig) -> (Server, Client) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (server_r, server_w) = tokio::io::split(server);
    let (client_r, client_w) = tokio::io::split(client);
    (
        StdioTransport::with_config(server_r, server_w, config),
        Client {
            write: client_w,
            read: BufReader::new(client_r),
        },
    )
}

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

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.unwrap();
        self.write.flush().await.unwrap();
    }

    /// The next line the server wrote.
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

fn ping(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

fn cancel(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id}})
}

fn request_id(message: Option<RxJsonRpcMessage<RoleServer>>) -> i64 {
    match message {
        Some(JsonRpcMessage::Request(request)) => match request.id {
            RequestId::Number(n) => n,
            RequestId::String(s) => panic!("string id {s}"),
        },
        other => panic!("expected a request, got {other:?}"),
    }
}

fn is_cancellation(message: Option<RxJsonRpcMessage<RoleServer>>) -> bool {
    matches!(
        message,
        Some(JsonRpcMessage::Notification(n))
            if matches!(n.notification, rmcp::model::ClientNotification::CancelledNotification(_))
    )
}

fn answer(id: i64) -> TxJsonRpcMessage<RoleServer> {
    JsonRpcMessage::response(
        ServerResult::EmptyResult(EmptyResult {}),
        RequestId::Number(id),
    )
}

/// Whether `receive` is stuck: it has not returned by the time the runtime is idle.
async fn blocked(server: &mut Server) -> bool {
    tokio::time::timeout(HOUR, server.receive()).await.is_err()
}

fn nest(levels: usize) -> String {
    format!("{}{}", "[".repeat(levels), "]".repeat(levels))
}

/// Every class of bad line gets its reply (or, where JSON-RPC forbids one, none), in order, and
/// the request after them is served.
#[tokio::test(start_paused = true)]
async fn every_bad_line_is_answered_in_order_and_the_next_request_is_served() {
    let (mut server, mut client) = pair(StdioConfig::new().max_line_bytes(nz(1024)));
    let call_nested = |levels: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}}}}}}}"#,
            nest(levels)
        )
    };
    // (line, expected reply: None = no reply, Some((code, id)))
    let cases: Vec<(String, Option<(i64, Value)>)> = vec![
        ("{not json".into(), Some((-32700, Value::Null))),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\ud800"}}"#.into(),
            Some((-32700, Value::Null)),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":1e400}}"#.into(),
            Some((-32700, Value::Null)),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":NaN}}"#.into(),
            Some((-32700, Value::Null)),
        ),
        (nest(127), Some((-32600, Value::Null))),
        (nest(128), Some((-32700, Value::Null))),
        (nest(200), Some((-32700, Value::Null))),
        (call_nested(127), Some((-32700, Value::Null))),
        ("\u{0}".into(), Some((-32700, Value::Null))),
        ("[1,2]".into(), Some((-32600, Value::Null))),
        ("42".into(), Some((-32600, Value::Null))),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":"x"}"#.into(),
            Some((-32600, json!(5))),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"s-1","method":"tools/call","params":"x"}"#.into(),
            Some((-32600, json!("s-1"))),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#.into(),
            Some((-32600, Value::Null)),
        ),
        (
            r#"{"id":6,"method":"ping"}"#.into(),
            Some((-32600, json!(6))),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"$/lsp","params":3}"#.into(),
            Some((-32600, Value::Null)),
        ),
        // A malformed response from the client: never answered.
        (r#"{"jsonrpc":"2.0","id":1,"error":"x"}"#.into(), None),
        (String::new(), None),
        ("  \t ".into(), None),
        ("\r".into(), None),
        ("x".repeat(5000), Some((-32600, Value::Null))),
    ];
    let mut input = Vec::new();
    for (line, _) in &cases {
        input.extend_from_slice(line.as_bytes());
        input.push(b'\n');
    }
    client.send_raw(&input).await;
    client.send(&[ping(99)]).await;

    assert_eq!(request_id(server.receive().await), 99);
    server.send(answer(99)).await.unwrap();

    for (line, expected) in &cases {
        let Some((code, id)) = expected else { continue };
        let reply = client.reply().await;
        let shown: String = line.chars().take(60).collect();
        assert_eq!(reply["jsonrpc"], "2.0", "{shown}: {reply}");
        assert_eq!(reply["error"]["code"], *code, "{shown}: {reply}");
        assert_eq!(
            reply.as_object().unwrap().get("id"),
            Some(id),
            "{shown}: {reply}"
        );
        assert!(reply["error"]["message"].is_string(), "{shown}: {reply}");
    }
    let last = client.reply().await;
    assert_eq!(
        last["id"], 99,
        "the ping's reply follows the error replies: {last}"
    );
    assert!(last.get("result").is_some(), "{last}");
}

#[tokio::test(start_paused = true)]
async fn an_oversized_line_is_never_buffered_whole_and_a_final_line_without_newline_is_read() {
    let (mut server, mut client) = pair(StdioConfig::new().max_line_bytes(nz(64)));
    // Exactly the limit is accepted.
    let mut at_limit = serde_json::to_vec(&ping(1)).unwrap();
    at_limit.resize(64, b' ');
    at_limit.push(b'\n');
    client.send_raw(&at_limit).await;
    assert_eq!(request_id(server.receive().await), 1);
    server.send(answer(1)).await.unwrap();
    assert_eq!(client.reply().await["id"], 1);
    // One byte more is refused, even when it arrives in pieces with no newline for a while.
    let mut over = serde_json::to_vec(&ping(2)).unwrap();
    over.resize(65, b' ');
    client.send_raw(&over).await;
    // The transport reads only while rmcp polls `receive`; the reply is written meanwhile (and
    // the dropped `receive` leaves the discarding state intact).
    let reply = tokio::select! {
        reply = client.reply() => reply,
        message = server.receive() => panic!("nothing to deliver yet: {message:?}"),
    };
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(reply["error"]["data"]["max_line_bytes"], 64, "{reply}");
    assert!(reply["id"].is_null(), "{reply}");
    // The rest of that line is discarded, then the next line is served; the last line of the
    // input has no newline.
    client.send_raw(&vec![b'y'; 10_000]).await;
    client.send_raw(b"\n").await;
    client
        .send_raw(serde_json::to_string(&ping(3)).unwrap().as_bytes())
        .await;
    client.write.shutdown().await.unwrap();
    assert_eq!(request_id(server.receive().await), 3);
    assert!(server.receive().await.is_none(), "EOF after the last line");
}

#[tokio::test(start_paused = true)]
async fn reading_stops_at_the_limit_and_resumes_when_an_answer_is_written() {
    let (mut server, mut client) = pair(StdioConfig::new().max_in_flight(nz(2)));
    client.send(&[ping(1), ping(2), ping(3), ping(4)]).await;
    assert_eq!(request_id(server.receive().await), 1);
    assert_eq!(request_id(server.receive().await), 2);
    assert!(
        blocked(&mut server).await,
        "a third request while two are in flight"
    );
    server.send(answer(1)).await.unwrap();
    assert_eq!(request_id(server.receive().await), 3);
    assert!(blocked(&mut server).await);
    // An error answers a request as well as a result does.
    server
        .send(JsonRpcMessage::error(
            ErrorData::internal_error("no", None),
            Some(RequestId::Number(2)),
        ))
        .await
        .unwrap();
    assert_eq!(request_id(server.receive().await), 4);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_request_frees_its_slot_exactly_once() {
    let (mut server, mut client) = pair(StdioConfig::new().max_in_flight(nz(2)));
    client.send(&[ping(1), ping(2)]).await;
    assert_eq!(request_id(server.receive().await), 1);
    assert_eq!(request_id(server.receive().await), 2);
    // Notifications are read while every slot is taken.
    client
        .send(&[cancel(1), cancel(1), cancel(77), ping(3), ping(4)])
        .await;
    assert!(is_cancellation(server.receive().await));
    assert!(is_cancellation(server.receive().await));
    assert!(is_cancellation(server.receive().await));
    assert_eq!(request_id(server.receive().await), 3);
    assert!(
        blocked(&mut server).await,
        "the second cancellation of 1 and the one of an unknown id free nothing"
    );
    // A late response to the cancelled request does not free a slot either.
    server.send(answer(1)).await.unwrap();
    assert!(blocked(&mut server).await);
    server.send(answer(3)).await.unwrap();
    assert_eq!(request_id(server.receive().await), 4);
    // An id reused after its cancellation is a new request with a slot of its own.
    server.send(answer(2)).await.unwrap();
    client.send(&[ping(1), ping(5)]).await;
    assert_eq!(request_id(server.receive().await), 1);
    assert!(blocked(&mut server).await, "4 and the new 1 are in flight");
    server.send(answer(1)).await.unwrap();
    assert_eq!(request_id(server.receive().await), 5);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_id_is_refused_without_leaking_a_slot() {
    let (mut server, mut client) = pair(StdioConfig::new().max_in_flight(nz(2)));
    client.send(&[ping(7), ping(7), ping(8), ping(9)]).await;
    assert_eq!(request_id(server.receive().await), 7);
    assert_eq!(request_id(server.receive().await), 8);
    let refusal = client.reply().await;
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert!(refusal["id"].is_null(), "{refusal}");
    assert_eq!(refusal["error"]["data"]["id"], 7, "{refusal}");
    assert!(blocked(&mut server).await, "7 and 8 are in flight");
    server.send(answer(7)).await.unwrap();
    assert_eq!(request_id(server.receive().await), 9);
    server.send(answer(8)).await.unwrap();
    server.send(answer(9)).await.unwrap();
    // Both slots are free again: two requests are read with nothing answered in between.
    client.send(&[ping(10), ping(11), ping(12)]).await;
    assert_eq!(request_id(server.receive().await), 10);
    assert_eq!(request_id(server.receive().await), 11);
    assert!(blocked(&mut server).await);
}

/// A tool handler whose calls wait until the test releases them (or the client cancels them).
#[derive(Clone)]
struct Blocking {
    entered: mpsc::UnboundedSender<i64>,
    release: Arc<Semaphore>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl ServerHandler for Blocking {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let n = request
            .arguments
            .as_ref()
            .and_then(|args| args.get("n"))
            .and_then(Value::as_i64)
            .unwrap();
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.entered.send(n).unwrap();
        tokio::select! {
            permit = self.release.acquire() => permit.unwrap().forget(),
            () = context.ct.cancelled() => {}
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(CallToolResult::success(vec![ContentBlock::text(n.to_string())]).into())
    }
}

/// Serves `handler` on `transport` under rmcp, and has `client` complete the 2025-11-25 handshake.
async fn serve_initialized<H: ServerHandler>(
    handler: H,
    transport: Server,
    client: &mut Client,
) -> tokio::task::JoinHandle<()> {
    let serving = tokio::spawn(async move {
        let running = handler.serve(transport).await.unwrap();
        let _ = running.waiting().await;
    });
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
    serving
}

fn tool_call(n: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
           "params": {"name": "block", "arguments": {"n": n}}})
}

/// Whether another call reaches the handler before the runtime goes idle.
async fn next_entry(entered: &mut mpsc::UnboundedReceiver<i64>) -> Option<i64> {
    tokio::time::timeout(HOUR, entered.recv())
        .await
        .ok()
        .flatten()
}

#[tokio::test(start_paused = true)]
async fn under_rmcp_at_most_n_calls_reach_the_handler() {
    const N: usize = 3;
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let handler = Blocking {
        entered: entered_tx,
        release: Arc::new(Semaphore::new(0)),
        running: Arc::new(AtomicUsize::new(0)),
        most: Arc::new(AtomicUsize::new(0)),
    };
    let (release, most) = (Arc::clone(&handler.release), Arc::clone(&handler.most));
    let (transport, mut client) = pair(StdioConfig::new().max_in_flight(nz(N)));
    let serving = serve_initialized(handler, transport, &mut client).await;

    // Four calls pipelined: three reach the handler, and nothing more happens.
    client
        .send(&(1..=4).map(tool_call).collect::<Vec<_>>())
        .await;
    let mut seen = Vec::new();
    for _ in 0..N {
        seen.push(
            next_entry(&mut entered)
                .await
                .expect("a call within the limit"),
        );
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![1, 2, 3]);
    assert_eq!(
        next_entry(&mut entered).await,
        None,
        "a fourth call while three block"
    );
    assert_eq!(most.load(Ordering::SeqCst), N);

    // One answered: reading resumes and the fourth call comes in.
    release.add_permits(1);
    let answered = client.reply().await;
    let answered_id = answered["id"].as_i64().unwrap();
    assert!(answered.get("result").is_some(), "{answered}");
    assert_eq!(next_entry(&mut entered).await, Some(4));
    assert_eq!(next_entry(&mut entered).await, None);
    assert_eq!(most.load(Ordering::SeqCst), N);

    // A cancelled call frees its slot: the next call comes in while the other two still block.
    let cancelled = (1..=4).find(|&n| n != answered_id).unwrap();
    client
        .send(&[cancel(cancelled), tool_call(5), tool_call(6)])
        .await;
    assert_eq!(next_entry(&mut entered).await, Some(5));
    assert_eq!(next_entry(&mut entered).await, None, "full again: 6 waits");

    // Everything released: every call but the cancelled one is answered, once.
    release.add_permits(10);
    client.send(&[ping(100)]).await;
    let mut answers = vec![answered_id];
    let mut pinged = false;
    while answers.len() < 5 || !pinged {
        let reply = client.reply().await;
        let id = reply["id"].as_i64().unwrap();
        if id == 100 {
            pinged = true;
            continue;
        }
        assert!(reply.get("result").is_some(), "{reply}");
        answers.push(id);
    }
    answers.sort_unstable();
    let expected: Vec<i64> = (1..=6).filter(|&n| n != cancelled).collect();
    assert_eq!(answers, expected);
    drop(client);
    let _ = tokio::time::timeout(HOUR, serving).await;
}
