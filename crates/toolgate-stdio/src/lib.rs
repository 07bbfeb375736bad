//! A line-delimited JSON-RPC server transport for stdio (or any byte stream) that answers every
//! line it cannot serve, bounds the size of a line, and bounds the requests in flight.
//!
//! rmcp's own [`AsyncRwTransport`](rmcp::transport::async_rw::AsyncRwTransport) drops a line that
//! is not JSON without a reply (so the client waits for its own timeout), logs it only at debug,
//! and reads as fast as the client writes: every pipelined request becomes a spawned handler task,
//! and 60,000 of them took 772 MB. [`StdioTransport`] implements rmcp's
//! [`Transport<RoleServer>`](rmcp::transport::Transport) over any `AsyncRead` / `AsyncWrite` pair
//! (the halves of `rmcp::transport::stdio_pipes()`, tokio's blocking stdin/stdout, a
//! `tokio::io::duplex` in tests), so `handler.serve(StdioTransport::new(stdin, stdout))` is all
//! a server author changes.
//!
//! # What a line gets
//!
//! One line (terminated by `\n`; a trailing `\r` and a leading UTF-8 byte order mark are ignored)
//! is one message:
//!
//! | line | reply (always `"jsonrpc":"2.0"`) | logged (`warn`, never the line's content) |
//! |---|---|---|
//! | a JSON-RPC request, notification or response rmcp understands | served by rmcp | - |
//! | empty, or only spaces and tabs | none: ignored | - |
//! | not JSON: a syntax error, an invalid escape such as a lone surrogate `"\ud800"`, a number out of range such as `1e400`, `NaN`, more than [`MAX_NESTING`] levels of arrays and objects, invalid UTF-8 | `-32700` Parse error, `"id":null` (the id cannot be read from JSON that does not parse) | byte length, serde_json's category, line and column |
//! | JSON that is not a JSON-RPC message rmcp understands (an array, a scalar, a request whose `params` do not fit its method, a missing `"jsonrpc":"2.0"`, an id that is neither a string nor an integer) | `-32600` Invalid Request, with the line's `id` when it is a string or a 64-bit integer and no request with that id is in flight, else `"id":null` | byte length |
//! | a well-formed JSON-RPC notification (a string `method`, no `id`, `params` absent or structured) or response (`result` or `error`, no `method`) that rmcp cannot read as MCP | none: JSON-RPC forbids answering a notification, and answering a response invites an echo loop | byte length |
//! | a request whose id is already in flight | `-32600`, `"id":null` (an error with the id would be taken for the answer to the request in flight), the id in `error.data.id` | byte length |
//! | longer than [`StdioConfig::max_line_bytes`] (default [`DEFAULT_MAX_LINE_BYTES`], not counting the `\n`) | `-32600`, `"id":null`, sent as soon as the limit is passed; the rest of the line is read and discarded, never buffered | the limit and the bytes seen |
//!
//! The nesting limit is serde_json's: a document of 128 or more nested arrays and objects is a
//! parse error (`recursion limit exceeded`), so a JSON-RPC envelope leaves a `tools/call`'s
//! arguments about 124 levels. Neither limit can be switched off: a line is held in memory whole
//! while it is parsed, and serde_json recurses once per level.
//!
//! # Requests in flight
//!
//! At most [`StdioConfig::max_in_flight`] (default [`DEFAULT_MAX_IN_FLIGHT`]) requests are read
//! and not yet answered per connection. A slot is taken when a request is handed to rmcp and given
//! back when its response or error has been written to the output (not when rmcp hands it over:
//! a client that does not read its replies must not make them pile up here either), or when the
//! client cancels it with `notifications/cancelled` (rmcp then drops the handler's response). A
//! slot is given back exactly once: the release belongs to a ticket that records which admission
//! of the id it is for, so a second cancellation, a cancellation of an answered request, or a
//! response rmcp sends for a reused id cannot free another request's slot. An error reply this
//! transport writes itself takes a slot too until it is written, so a client that floods bad lines
//! without reading is held back the same way.
//!
//! When every slot is taken the transport reads at most one more line: a notification (such as
//! a cancellation) or a response to a server-initiated request (such as an elicitation a blocked
//! handler waits for) is still delivered, so a client that keeps within the limit is never blocked;
//! a request, or a line that needs an error reply, is held until a slot is free, and nothing more is
//! read meanwhile. The OS pipe then fills and the client's writes block. Notifications and
//! responses never take a slot.
//!
//! Long-lived requests (`subscriptions/listen`) hold their slot while they are open. rmcp never
//! answers a request whose handler panicked, so its slot would stay taken until the connection
//! ends; under the gate (`toolgate_rmcp::Gated`) a panic of the inner handler is answered -32603
//! (and a call's record says `error`, or `indeterminate` with an exactly-once ticket), which frees
//! the slot. A cancelled request's handler may still be running when its slot is reused.

#![forbid(unsafe_code)]

pub mod upstream;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ClientNotification, ErrorCode, JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader, BufWriter,
};
use tokio::sync::{Notify, mpsc, oneshot};

/// The default [`StdioConfig::max_line_bytes`]: 4 MiB. The largest legitimate request of the
/// reference server is a `write_note` of 2,000 characters (under 10 KiB even escaped); 4 MiB
/// leaves room for any server's tool arguments while keeping a hostile line well below the
/// reference server's 10 MB resident-memory budget (rmcp's own default is 16 MiB).
pub const DEFAULT_MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// The default [`StdioConfig::max_in_flight`]: 64 requests per connection. Enough to keep the
/// reference server's blocking pool (16 threads) and group commits busy; a sequential client uses
/// one.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// The deepest nesting of arrays and objects a line may have (serde_json's recursion limit: 128
/// levels are a parse error). The JSON-RPC envelope counts: `params` is level 2.
pub const MAX_NESTING: usize = 127;

/// A line buffer grown past this is given back after its line, so one large request does not
/// keep its size for the connection's life.
const RETAINED_LINE_CAPACITY: usize = 64 * 1024;

/// The output buffer: replies written together are flushed in one write.
const WRITE_BUFFER: usize = 8 * 1024;

/// How long [`Transport::close`] waits for queued replies to be written before it gives up on a
/// client that no longer reads.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The limits of a [`StdioTransport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StdioConfig {
    max_line_bytes: NonZeroUsize,
    max_in_flight: NonZeroUsize,
}

impl Default for StdioConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl StdioConfig {
    /// The defaults: [`DEFAULT_MAX_LINE_BYTES`] and [`DEFAULT_MAX_IN_FLIGHT`].
    pub const fn new() -> Self {
        Self {
            max_line_bytes: non_zero(DEFAULT_MAX_LINE_BYTES),
            max_in_flight: non_zero(DEFAULT_MAX_IN_FLIGHT),
        }
    }

    /// The longest line accepted, in bytes, not counting its `\n`. A longer line is answered with
    /// an error and discarded while it is read.
    #[must_use]
    pub const fn max_line_bytes(mut self, bytes: NonZeroUsize) -> Self {
        self.max_line_bytes = bytes;
        self
    }

    /// How many requests may be read and not yet answered before the transport stops reading.
    #[must_use]
    pub const fn max_in_flight(mut self, requests: NonZeroUsize) -> Self {
        self.max_in_flight = requests;
        self
    }

    /// The configured line limit in bytes.
    pub const fn line_limit(&self) -> usize {
        self.max_line_bytes.get()
    }

    /// The configured limit of requests in flight.
    pub const fn in_flight_limit(&self) -> usize {
        self.max_in_flight.get()
    }
}

/// `n` as a `NonZeroUsize`, for the constant defaults (both are above zero).
const fn non_zero(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => NonZeroUsize::MIN,
    }
}

/// Why a [`StdioTransport`] could not send a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StdioError {
    /// The transport was closed, or the output task is gone; nothing more can be sent.
    #[error("the stdio transport is closed; no more messages can be sent on this connection")]
    Closed,
    /// Sending needs a tokio runtime (the output is written by a task of its own).
    #[error("the stdio transport was used outside a tokio runtime; serve it from within one")]
    NoRuntime,
    /// Writing to the output failed (typically: the client closed its end of the pipe). Every
    /// later send fails the same way.
    #[error("cannot write to the client: {0}")]
    Write(#[source] Arc<std::io::Error>),
    /// A message could not be serialized as JSON.
    #[error("cannot serialize an outgoing message: {0}")]
    Encode(#[source] serde_json::Error),
}

/// The requests a [`StdioTransport`] has read and not yet answered (written).
#[derive(Debug, Clone)]
pub struct InFlight(Arc<Slots>);

impl InFlight {
    /// Waits until every request read so far has been answered, its reply written (or
    /// cancelled), and every error reply of the transport's own written.
    pub async fn settled(&self) {
        loop {
            let notified = self.0.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.lock().used == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// The line-delimited JSON-RPC server transport; see the [module documentation](self).
#[derive(Debug)]
pub struct StdioTransport<R, W> {
    input: BufReader<R>,
    reader: LineReader,
    slots: Arc<Slots>,
    /// A request or an error reply read while every slot was taken, waiting for one.
    parked: Option<Parked>,
    output: Output<W>,
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// A transport over `input` and `output` with the default limits.
    pub fn new(input: R, output: W) -> Self {
        Self::with_config(input, output, StdioConfig::new())
    }

    /// A transport over `input` and `output` with the given limits.
    ///
    /// Needs no runtime to be built; the output task is started by the first receive or send.
    pub fn with_config(input: R, output: W, config: StdioConfig) -> Self {
        Self {
            input: BufReader::new(input),
            reader: LineReader::new(config.line_limit()),
            slots: Arc::new(Slots::new(config.in_flight_limit())),
            parked: None,
            output: Output::Idle(output),
        }
    }

    /// A handle on the requests in flight, to wait until every one read has been answered.
    pub fn in_flight(&self) -> InFlight {
        InFlight(Arc::clone(&self.slots))
    }

    /// Queues a reply this transport makes itself; it holds a slot until it is written.
    fn refuse(&mut self, refusal: DecidedError) {
        let id = refusal.id.filter(|id| !self.slots.is_in_flight(id));
        let ticket = self.slots.take_anonymous();
        let reply = ErrorReply {
            jsonrpc: "2.0",
            id: id.as_ref(),
            error: ErrorBody {
                code: refusal.code.0,
                message: &refusal.message,
                data: refusal.data.as_ref(),
            },
        };
        match encode(&reply) {
            Ok(bytes) => {
                if let Ok(sender) = self.output.sender() {
                    // A closed output drops the message and with it the ticket.
                    let _ = sender.send(Outgoing {
                        bytes,
                        ticket: Some(ticket),
                        ack: None,
                    });
                }
            }
            Err(error) => tracing::error!(%error, "cannot serialize an error reply"),
        }
    }

    /// Hands a parked item over once a slot is free: the request to rmcp (`Some`), or the error
    /// reply to the output (`None`).
    fn dispatch(&mut self, parked: Parked) -> Option<RxJsonRpcMessage<RoleServer>> {
        match parked {
            Parked::Request { message, id, bytes } => {
                if self.slots.admit(&id) {
                    return Some(message);
                }
                tracing::warn!(
                    bytes,
                    "refused a request whose id is already in flight (-32600)"
                );
                self.refuse(DecidedError {
                    id: None,
                    code: ErrorCode::INVALID_REQUEST,
                    message: "Invalid Request: a request with this id is already in flight; ids must be unique among outstanding requests".to_owned(),
                    data: Some(serde_json::json!({"id": id})),
                });
                None
            }
            Parked::DecidedError(refusal) => {
                self.refuse(refusal);
                None
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for StdioTransport<R, W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = StdioError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // The ticket is taken now, in rmcp's order of events: it names the admission of the id
        // this response answers, so a later reuse of the id is not released by it.
        let ticket = match &item {
            JsonRpcMessage::Response(response) => self.slots.ticket(&response.id),
            JsonRpcMessage::Error(error) => error.id.as_ref().and_then(|id| self.slots.ticket(id)),
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
        };
        let bytes = match &item {
            // JSON-RPC 2.0 wants `"id": null` on an error whose request id is unknown; rmcp
            // leaves the member out.
            JsonRpcMessage::Error(error) if error.id.is_none() => encode(&ErrorReply {
                jsonrpc: "2.0",
                id: None,
                error: ErrorBody {
                    code: error.error.code.0,
                    message: &error.error.message,
                    data: error.error.data.as_ref(),
                },
            }),
            _ => encode(&item),
        };
        let sender = self.output.sender();
        async move {
            let bytes = bytes?;
            let (ack, acked) = oneshot::channel();
            sender?
                .send(Outgoing {
                    bytes,
                    ticket,
                    ack: Some(ack),
                })
                .map_err(|_| StdioError::Closed)?;
            acked.await.map_err(|_| StdioError::Closed)?
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        // Start the output task now, so error replies can be written before the first send.
        if self.output.sender().is_err() {
            return None;
        }
        // Cancellation safety: rmcp polls this inside a `select!` and drops the future whenever
        // another branch is ready. The only awaits are the wait for a slot (which consumes
        // nothing) and the line read (which keeps a partial line in `self.reader`); everything
        // after them up to the return is synchronous.
        loop {
            if self.parked.is_some() {
                self.slots.wait_for_free().await;
                if let Some(parked) = self.parked.take()
                    && let Some(message) = self.dispatch(parked)
                {
                    return Some(message);
                }
                continue;
            }
            let line = match self.reader.read_line(&mut self.input).await {
                LineRead::Line => self.reader.line(),
                LineRead::TooLong { seen } => {
                    tracing::warn!(
                        max_line_bytes = self.reader.max,
                        bytes_at_least = seen,
                        "refused a line over the size limit (-32600); discarding the rest of it"
                    );
                    self.parked = Some(Parked::DecidedError(DecidedError {
                        id: None,
                        code: ErrorCode::INVALID_REQUEST,
                        message: format!(
                            "Invalid Request: the line exceeds the limit of {} bytes; it was discarded",
                            self.reader.max
                        ),
                        data: Some(serde_json::json!({"max_line_bytes": self.reader.max})),
                    }));
                    continue;
                }
                LineRead::Eof => return None,
                LineRead::Failed(error) => {
                    tracing::error!(%error, "cannot read from the client; closing the connection");
                    return None;
                }
            };
            let bytes = line.len();
            let classified = classify(line);
            self.reader.done();
            match classified {
                Line::Ignored => {}
                Line::Message(message) => match message {
                    JsonRpcMessage::Request(request) => {
                        let id = request.id.clone();
                        self.parked = Some(Parked::Request {
                            message: JsonRpcMessage::Request(request),
                            id,
                            bytes,
                        });
                    }
                    JsonRpcMessage::Notification(notification) => {
                        if let ClientNotification::CancelledNotification(cancelled) =
                            &notification.notification
                            && let Some(id) = &cancelled.params.request_id
                        {
                            self.slots.cancel(id);
                        }
                        return Some(JsonRpcMessage::Notification(notification));
                    }
                    other @ (JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_)) => {
                        return Some(other);
                    }
                },
                Line::NotJson(error) => {
                    tracing::warn!(
                        bytes,
                        category = category_name(error.classify()),
                        line = error.line(),
                        column = error.column(),
                        "refused a line that is not JSON (-32700)"
                    );
                    self.parked = Some(Parked::DecidedError(DecidedError {
                        id: None,
                        code: ErrorCode::PARSE_ERROR,
                        // serde_json's messages are fixed texts with a position, never input.
                        message: format!("Parse error: {error}"),
                        data: None,
                    }));
                }
                Line::Invalid { id } => {
                    tracing::warn!(
                        bytes,
                        "refused a line that is JSON but not a JSON-RPC message (-32600)"
                    );
                    self.parked = Some(Parked::DecidedError(DecidedError {
                        id,
                        code: ErrorCode::INVALID_REQUEST,
                        message: "Invalid Request: not a JSON-RPC 2.0 request this server can read (an object with \"jsonrpc\":\"2.0\", a string or integer \"id\", a string \"method\" and \"params\" that fit it)".to_owned(),
                        data: None,
                    }));
                }
                Line::Unanswerable => {
                    tracing::warn!(
                        bytes,
                        "ignored a JSON-RPC notification or response this server cannot read"
                    );
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let output = std::mem::replace(&mut self.output, Output::Closed);
        if let Output::Running { sender, task } = output {
            // The task ends once every sender is gone and the queue is written.
            drop(sender);
            match tokio::time::timeout(CLOSE_TIMEOUT, task).await {
                Ok(_) => {}
                Err(_) => tracing::warn!(
                    "the client did not read the last replies within {CLOSE_TIMEOUT:?}; closing anyway"
                ),
            }
        }
        Ok(())
    }
}

/// A stable name for serde_json's error category (its `Debug` is not a contract).
fn category_name(category: serde_json::error::Category) -> &'static str {
    match category {
        serde_json::error::Category::Io => "io",
        serde_json::error::Category::Syntax => "syntax",
        serde_json::error::Category::Data => "data",
        serde_json::error::Category::Eof => "eof",
    }
}

/// What one line is.
#[expect(
    clippy::large_enum_variant,
    reason = "one value at a time, returned and matched at once: boxing would only add an allocation per message"
)]
enum Line {
    /// Empty or blank: no message, no reply.
    Ignored,
    Message(RxJsonRpcMessage<RoleServer>),
    /// Not JSON at all.
    NotJson(serde_json::Error),
    /// JSON, but not a JSON-RPC message rmcp can read, and not a notification or response.
    Invalid {
        id: Option<RequestId>,
    },
    /// A well-formed JSON-RPC notification or response rmcp cannot read: never answered.
    Unanswerable,
}

/// UTF-8 byte order mark (RFC 8259 section 8.1 lets a parser ignore it; rmcp does).
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

fn classify(line: &[u8]) -> Line {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return Line::Ignored;
    }
    // The fast path is rmcp's own parse; only a line that fails it is parsed again to find out why.
    let typed_error = match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line) {
        Ok(message) => return Line::Message(message),
        Err(error) => error,
    };
    let value = match serde_json::from_slice::<Value>(line) {
        Ok(value) => value,
        Err(error) => return Line::NotJson(error),
    };
    // Valid JSON the typed parse refused. With the same recursion limit and number handling,
    // a syntax failure of one is a syntax failure of the other; stay on the safe side anyway.
    if matches!(
        typed_error.classify(),
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof
    ) {
        return Line::NotJson(typed_error);
    }
    let Value::Object(object) = &value else {
        return Line::Invalid { id: None };
    };
    let is_v2 = object.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    let has_method = object.contains_key("method");
    let method_is_string = object.get("method").is_some_and(Value::is_string);
    let params_ok = object
        .get("params")
        .is_none_or(|params| params.is_object() || params.is_array());
    let is_notification = is_v2 && method_is_string && !object.contains_key("id") && params_ok;
    let is_response = is_v2
        && !has_method
        && object.contains_key("id")
        && (object.contains_key("result") ^ object.contains_key("error"));
    if is_notification || is_response {
        return Line::Unanswerable;
    }
    let id = object
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    Line::Invalid { id }
}

/// The error replies this transport writes: always with an `id` member, `null` when unknown.
#[derive(Serialize)]
struct ErrorReply<'a> {
    jsonrpc: &'static str,
    id: Option<&'a RequestId>,
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: i32,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a Value>,
}

/// An error reply decided while reading, written once it has a slot.
#[derive(Debug)]
struct DecidedError {
    id: Option<RequestId>,
    code: ErrorCode,
    message: String,
    data: Option<Value>,
}

/// What waits for a slot.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "at most one per connection, and a request is the common case"
)]
enum Parked {
    Request {
        message: RxJsonRpcMessage<RoleServer>,
        id: RequestId,
        /// The line's length, for the log line if it turns out to be a duplicate.
        bytes: usize,
    },
    DecidedError(DecidedError),
}

fn encode(message: &impl Serialize) -> Result<Vec<u8>, StdioError> {
    let mut bytes = serde_json::to_vec(message).map_err(StdioError::Encode)?;
    bytes.push(b'\n');
    Ok(bytes)
}

// ---------------------------------------------------------------------------------------------
// Slots

/// The requests in flight on one connection.
#[derive(Debug)]
struct Slots {
    limit: usize,
    state: Mutex<SlotState>,
    /// Signalled when a slot is given back.
    freed: Notify,
}

#[derive(Debug, Default)]
struct SlotState {
    /// Slots taken: requests in flight plus error replies not yet written.
    used: usize,
    /// The requests in flight, each with the admission it was (see [`Ticket`]).
    requests: HashMap<RequestId, u64>,
    next_admission: u64,
}

/// The right to give back one slot, used when it is dropped (written, failed or abandoned): so a
/// slot is released exactly once whatever path the message takes.
#[derive(Debug)]
struct Ticket {
    slots: Arc<Slots>,
    /// `Some((id, admission))` for a request's response: released only if that admission of
    /// the id is still in flight. `None` for an error reply of the transport's own.
    request: Option<(RequestId, u64)>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        let released = match self.request.take() {
            Some((id, admission)) => {
                if state.requests.get(&id) == Some(&admission) {
                    state.requests.remove(&id);
                    true
                } else {
                    false
                }
            }
            None => true,
        };
        if released {
            state.used = state.used.saturating_sub(1);
            drop(state);
            self.slots.freed.notify_waiters();
        }
    }
}

impl Slots {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            state: Mutex::new(SlotState::default()),
            freed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Nothing panics while the lock is held; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until a slot is free. Only the receiving side takes slots, so one stays free until
    /// it takes it.
    async fn wait_for_free(&self) {
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().used < self.limit {
                return;
            }
            notified.await;
        }
    }

    /// Takes a slot for the request `id`, unless a request with that id is in flight.
    fn admit(&self, id: &RequestId) -> bool {
        let mut state = self.lock();
        if state.requests.contains_key(id) {
            return false;
        }
        let admission = state.next_admission;
        state.next_admission = admission.wrapping_add(1);
        state.requests.insert(id.clone(), admission);
        state.used += 1;
        true
    }

    fn take_anonymous(self: &Arc<Self>) -> Ticket {
        self.lock().used += 1;
        Ticket {
            slots: Arc::clone(self),
            request: None,
        }
    }

    /// The ticket of the response to the request `id` in flight now, if there is one.
    fn ticket(self: &Arc<Self>, id: &RequestId) -> Option<Ticket> {
        let admission = *self.lock().requests.get(id)?;
        Some(Ticket {
            slots: Arc::clone(self),
            request: Some((id.clone(), admission)),
        })
    }

    fn is_in_flight(&self, id: &RequestId) -> bool {
        self.lock().requests.contains_key(id)
    }

    /// The client cancelled the request `id`: rmcp will not answer it.
    fn cancel(&self, id: &RequestId) {
        let mut state = self.lock();
        if state.requests.remove(id).is_some() {
            state.used = state.used.saturating_sub(1);
            drop(state);
            self.freed.notify_waiters();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Output

/// One message for the output task.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    /// Given back once the bytes are written (or the write failed).
    ticket: Option<Ticket>,
    /// Told the outcome of the write, for [`Transport::send`].
    ack: Option<oneshot::Sender<Result<(), StdioError>>>,
}

#[derive(Debug)]
enum Output<W> {
    /// Not started: the output task is spawned on first use, inside the runtime.
    Idle(W),
    Running {
        sender: mpsc::UnboundedSender<Outgoing>,
        task: tokio::task::JoinHandle<()>,
    },
    Closed,
}

impl<W> Output<W>
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// The queue of the output task, starting it if needed. The queue is unbounded on purpose:
    /// what is in it is bounded by the slots (responses and error replies) and by rmcp, which
    /// waits for each notification and request it sends.
    fn sender(&mut self) -> Result<mpsc::UnboundedSender<Outgoing>, StdioError> {
        if let Output::Running { sender, .. } = self {
            return Ok(sender.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StdioError::NoRuntime)?;
        match std::mem::replace(self, Output::Closed) {
            Output::Idle(writer) => {
                let (sender, queue) = mpsc::unbounded_channel();
                let task = runtime.spawn(write_out(writer, queue));
                *self = Output::Running {
                    sender: sender.clone(),
                    task,
                };
                Ok(sender)
            }
            Output::Running { .. } | Output::Closed => Err(StdioError::Closed),
        }
    }
}

/// Writes queued messages in order; what is queued together is flushed together. Tickets are
/// given back and senders told only after the flush.
async fn write_out<W: AsyncWrite + Unpin>(writer: W, mut queue: mpsc::UnboundedReceiver<Outgoing>) {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER, writer);
    let mut failed: Option<Arc<std::io::Error>> = None;
    let mut batch = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some(message) = next.take() {
            if failed.is_none()
                && let Err(error) = writer.write_all(&message.bytes).await
            {
                failed = Some(Arc::new(error));
            }
            batch.push((message.ticket, message.ack));
            // Bounded, so the first replies of a long burst are not held back behind the last.
            if batch.len() < 64 {
                next = queue.try_recv().ok();
            }
        }
        if failed.is_none()
            && let Err(error) = writer.flush().await
        {
            failed = Some(Arc::new(error));
        }
        if let Some(error) = &failed
            && batch.iter().any(|(_, ack)| ack.is_none())
        {
            tracing::debug!(%error, "an error reply could not be written");
        }
        for (ticket, ack) in batch.drain(..) {
            drop(ticket);
            if let Some(ack) = ack {
                let _ = ack.send(match &failed {
                    None => Ok(()),
                    Some(error) => Err(StdioError::Write(Arc::clone(error))),
                });
            }
        }
    }
    let _ = writer.flush().await;
}

// ---------------------------------------------------------------------------------------------
// Input

/// Reads `\n`-terminated lines without ever holding more than the limit.
#[derive(Debug)]
pub(crate) struct LineReader {
    max: usize,
    line: Vec<u8>,
    /// Dropping the tail of a line over the limit, until its `\n`. On the struct because a read
    /// can be cancelled in the middle.
    discarding: bool,
    /// The input ended after a final line without `\n`, which was returned; the next read is EOF.
    ended: bool,
}

pub(crate) enum LineRead {
    /// A whole line is in [`LineReader::line`] (with its `\n`, unless it was the last one).
    Line,
    /// The line passed the limit after `seen` bytes; its rest is discarded as it arrives.
    TooLong {
        seen: usize,
    },
    Eof,
    Failed(std::io::Error),
}

enum Step {
    Line,
    More,
    EndDiscard,
    TooLong { seen: usize, ended: bool },
}

impl LineReader {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            line: Vec::new(),
            discarding: false,
            ended: false,
        }
    }

    pub(crate) fn line(&self) -> &[u8] {
        &self.line
    }

    /// Forgets the line just handled, giving back a buffer that a large line grew.
    pub(crate) fn done(&mut self) {
        if self.line.capacity() > RETAINED_LINE_CAPACITY {
            self.line = Vec::new();
        } else {
            self.line.clear();
        }
    }

    /// Cancellation-safe: `fill_buf` consumes nothing when dropped, and the copy into `line`
    /// and the matching `consume` happen with no await between them.
    pub(crate) async fn read_line<R: AsyncRead + Unpin>(
        &mut self,
        input: &mut BufReader<R>,
    ) -> LineRead {
        if self.ended {
            return LineRead::Eof;
        }
        loop {
            let (consumed, step) = {
                let available = match input.fill_buf().await {
                    Ok(available) => available,
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(error) => return LineRead::Failed(error),
                };
                if available.is_empty() {
                    // A last line without `\n` is still a line; a partial discard just ends.
                    self.ended = true;
                    if !self.discarding && !self.line.is_empty() {
                        return LineRead::Line;
                    }
                    return LineRead::Eof;
                }
                let newline = available.iter().position(|&b| b == b'\n');
                let take = newline.map_or(available.len(), |at| at + 1);
                let content = newline.unwrap_or(available.len());
                if self.discarding {
                    (
                        take,
                        if newline.is_some() {
                            Step::EndDiscard
                        } else {
                            Step::More
                        },
                    )
                } else if self.line.len().saturating_add(content) > self.max {
                    (
                        take,
                        Step::TooLong {
                            seen: self.line.len().saturating_add(content),
                            ended: newline.is_some(),
                        },
                    )
                } else {
                    self.line.extend_from_slice(&available[..take]);
                    (
                        take,
                        if newline.is_some() {
                            Step::Line
                        } else {
                            Step::More
                        },
                    )
                }
            };
            input.consume(consumed);
            match step {
                Step::Line => return LineRead::Line,
                Step::More => {}
                Step::EndDiscard => self.discarding = false,
                Step::TooLong { seen, ended } => {
                    self.done();
                    self.discarding = !ended;
                    return LineRead::TooLong { seen };
                }
            }
        }
    }
}
