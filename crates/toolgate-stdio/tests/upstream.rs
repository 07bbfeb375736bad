//! `UpstreamTransport`: what of an untrusted server's output ends the connection, driven through
//! an in-memory pipe with the transport's own `Transport` methods (the proxy's tests in
//! toolgate-server cover the same with real processes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientNotification, ClientRequest,
    JsonRpcMessage, JsonRpcNotification, JsonRpcRequest, JsonRpcVersion2_0, NumberOrString,
    PingRequest,
};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream};
use toolgate_stdio::upstream::{UpstreamEnd, UpstreamLimits, UpstreamTransport};

struct Pipe {
    transport: UpstreamTransport<DuplexStream>,
    end: std::sync::Arc<UpstreamEnd>,
    /// The upstream's side: what it writes, and what it reads.
    writes: DuplexStream,
    reads: BufReader<DuplexStream>,
}

fn pipe(max_line_bytes: usize) -> Pipe {
    let (from_upstream, writes) = tokio::io::duplex(1 << 16);
    let (to_upstream, reads) = tokio::io::duplex(1 << 16);
    let (transport, end) = UpstreamTransport::new(from_upstream, to_upstream, max_line_bytes);
    Pipe {
        transport,
        end,
        writes,
        reads: BufReader::new(reads),
    }
}

impl Pipe {
    async fn ask(&mut self, id: i64) {
        let request = ClientRequest::PingRequest(PingRequest::default());
        self.transport
            .send(JsonRpcMessage::Request(JsonRpcRequest::new(
                NumberOrString::Number(id),
                request,
            )))
            .await
            .unwrap();
        let mut line = String::new();
        self.reads.read_line(&mut line).await.unwrap();
        assert!(line.contains("\"ping\""), "{line}");
    }

    async fn cancel(&mut self, id: i64) {
        let notification = ClientNotification::CancelledNotification(CancelledNotification::new(
            CancelledNotificationParam::new(Some(NumberOrString::Number(id)), None),
        ));
        self.transport
            .send(JsonRpcMessage::Notification(JsonRpcNotification {
                jsonrpc: JsonRpcVersion2_0,
                notification,
            }))
            .await
            .unwrap();
    }

    async fn upstream_writes(&mut self, bytes: &[u8]) {
        self.writes.write_all(bytes).await.unwrap();
    }
}

#[tokio::test]
async fn answers_to_requests_asked_pass_and_blank_lines_are_skipped() {
    let mut pipe = pipe(1024);
    pipe.ask(1).await;
    pipe.upstream_writes(b"\n  \r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
        .await;
    assert!(matches!(
        pipe.transport.receive().await,
        Some(JsonRpcMessage::Response(_))
    ));
    // Answered once: a second answer to the same id ends the connection.
    pipe.upstream_writes(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
        .await;
    assert!(pipe.transport.receive().await.is_none());
    assert!(pipe.end.reason().unwrap().contains("answered request id 1"));
}

#[tokio::test]
async fn a_late_answer_to_a_cancelled_request_is_accepted() {
    let mut pipe = pipe(1024);
    pipe.ask(7).await;
    pipe.cancel(7).await;
    pipe.upstream_writes(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n")
        .await;
    assert!(pipe.transport.receive().await.is_some());
    assert!(pipe.end.reason().is_none());
}

#[tokio::test]
async fn garbage_a_huge_line_an_unasked_id_or_an_error_without_id_ends_the_connection() {
    let cases: [(&[u8], &str); 5] = [
        (b"not json\n", "not a JSON-RPC message"),
        (b"[1,2,3]\n", "not a JSON-RPC message"),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}\n",
            "answered request id 99",
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error\"}}\n",
            "an error without a request id",
        ),
        (&[b'x'; 2048], "more than 1024 bytes"),
    ];
    for (line, says) in cases {
        let mut pipe = pipe(1024);
        pipe.upstream_writes(line).await;
        assert!(pipe.transport.receive().await.is_none(), "{says}");
        let reason = pipe.end.reason().unwrap();
        assert!(reason.contains(says), "{reason}");
        // Nothing more can be sent.
        let ping = ClientRequest::PingRequest(PingRequest::default());
        assert!(
            pipe.transport
                .send(JsonRpcMessage::Request(JsonRpcRequest::new(
                    NumberOrString::Number(1),
                    ping,
                )))
                .await
                .is_err()
        );
    }
}

#[tokio::test]
async fn the_upstream_closing_its_output_ends_the_connection() {
    let mut pipe = pipe(1024);
    drop(pipe.writes);
    assert!(pipe.transport.receive().await.is_none());
    assert!(pipe.end.reason().unwrap().contains("closed its output"));
}

/// Polls `future` once (no waiting): whether it is still pending.
fn pending<F: std::future::Future>(future: F) -> bool {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    future.as_mut().poll(&mut context).is_pending()
}

fn log_line(n: u32) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"level\":\"info\",\"data\":\"{n}\"}}}}\n"
    )
}

#[tokio::test]
async fn pushes_wait_for_a_place_in_flight_and_a_flood_is_dropped_and_reported_once() {
    let mut pipe = pipe(1024);
    pipe.transport = pipe.transport.with_limits(UpstreamLimits {
        pushes_per_answer: 3,
        in_flight: 2,
    });
    let mut floods = pipe.transport.take_floods().unwrap();
    pipe.ask(1).await;
    let mut lines: String = (1..=5).map(log_line).collect();
    lines.push_str("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n");
    pipe.upstream_writes(lines.as_bytes()).await;

    // Two pushes are handled (held here); the third waits for one of them, and a wait given up
    // loses nothing.
    let first = pipe.transport.receive().await.unwrap();
    let second = pipe.transport.receive().await.unwrap();
    assert!(matches!(first, JsonRpcMessage::Notification(_)));
    assert!(matches!(second, JsonRpcMessage::Notification(_)));
    assert!(pending(pipe.transport.receive()));
    drop(first);
    let third = pipe.transport.receive().await.unwrap();
    let JsonRpcMessage::Notification(third) = third else {
        panic!("not the third notification: {third:?}");
    };
    assert!(format!("{third:?}").contains("\"3\""), "{third:?}");
    // The fourth and fifth are over the limit: dropped; the answer passes and ends the flood.
    drop((second, third));
    assert!(matches!(
        pipe.transport.receive().await,
        Some(JsonRpcMessage::Response(_))
    ));
    let flood = floods.try_recv().unwrap();
    assert_eq!((flood.passed, flood.dropped, flood.answered), (3, 2, true));
    assert!(floods.try_recv().is_err(), "one report per flood");
    assert!(pipe.end.reason().is_none());
}
