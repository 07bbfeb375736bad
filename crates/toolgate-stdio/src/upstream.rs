//! A line-delimited JSON-RPC client transport for a server that toolgate does not trust: the
//! upstream of a proxy, spoken to over its stdin and stdout.
//!
//! rmcp's child-process transport skips a line it cannot parse, accepts lines of up to 16 MiB and
//! drops a response whose id it is not waiting for, so a request the upstream garbled or answered
//! under the wrong id waits for ever. [`UpstreamTransport`] implements rmcp's
//! [`Transport<RoleClient>`](rmcp::transport::Transport) and treats every breach of the protocol
//! as the end of the upstream: the stream can no longer be trusted to say which answer belongs to
//! which request. It then stops reading, so every request in flight fails at once (rmcp answers
//! them with `TransportClosed`), and its [`UpstreamEnd`] says why. What ends it:
//!
//! | the upstream's stdout | [`UpstreamEnd::reason`] |
//! |---|---|
//! | closed (the process exited, or closed the pipe) | `the upstream closed its output …` |
//! | a line longer than the limit | `… a line of more than N bytes …` |
//! | a line that is not JSON, or not a JSON-RPC message rmcp reads as MCP | `… a line that is not …` |
//! | a response or error to a request id that was not asked, or was answered already | `… answered request id … which …` |
//! | an error without an id (it could not read a request it was sent) | `… an error without a request id …` |
//!
//! Blank lines are ignored. An answer to a request the client cancelled is accepted (and dropped
//! by rmcp): the protocol lets a server answer a request whose cancellation crossed its reply.
//! Lines are read with the same bounded reader as [`crate::StdioTransport`], so a huge line is never
//! held in memory beyond the limit.
//!
//! What the upstream pushes unasked (notifications, and requests to the client) is bounded twice
//! ([`UpstreamLimits`]): at most `in_flight` of them are being handled at once (rmcp handles each
//! in a task of its own; while that many are, the upstream's output is not read, so it waits on a
//! full pipe: backpressure, as on the host side), and at most `pushes_per_answer` are passed on
//! between two answers of the upstream. The rest are dropped, counted, and reported once per flood
//! as a [`Flood`] (when the next answer arrives or the connection ends).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rmcp::RoleClient;
use rmcp::model::GetExtensions as _;
use rmcp::model::{ClientNotification, JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use crate::{LineRead, LineReader};

/// The default line limit of an upstream: 16 MiB, rmcp's own default (an upstream's results, such
/// as a file read, are larger than a client's requests).
pub const DEFAULT_UPSTREAM_MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How many cancelled request ids are remembered, so that their late answers are accepted.
const CANCELLED_REMEMBERED: usize = 4096;

/// The default [`UpstreamLimits::pushes_per_answer`].
pub const DEFAULT_PUSHES_PER_ANSWER: usize = 1000;

/// The default [`UpstreamLimits::in_flight`].
pub const DEFAULT_PUSHES_IN_FLIGHT: usize = 64;

/// How many floods wait to be reported before more are only logged.
const FLOODS_QUEUED: usize = 16;

/// What an upstream may push unasked (notifications and requests to the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamLimits {
    /// The most pushes passed on between two answers of the upstream (and before its first);
    /// further ones are dropped until it answers a request again.
    pub pushes_per_answer: usize,
    /// The most pushes being handled at once; the upstream's output is not read while this many
    /// are.
    pub in_flight: usize,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        UpstreamLimits {
            pushes_per_answer: DEFAULT_PUSHES_PER_ANSWER,
            in_flight: DEFAULT_PUSHES_IN_FLIGHT,
        }
    }
}

/// Pushes of the upstream dropped between two of its answers, over
/// [`UpstreamLimits::pushes_per_answer`]: one report per flood.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Flood {
    /// The pushes passed on (the limit).
    pub passed: u64,
    /// The pushes dropped.
    pub dropped: u64,
    /// Whether the flood ended with an answer (`false`: with the end of the connection).
    pub answered: bool,
}

/// Holds one place of [`UpstreamLimits::in_flight`] while rmcp handles the push it came with (it
/// travels in the message's extensions into the handler's context, and is released with it).
#[derive(Debug, Clone)]
struct InFlight(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// Why an [`UpstreamTransport`] could not send a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// The upstream ended (see [`UpstreamEnd::reason`]); nothing more can be sent to it.
    #[error("the upstream ended: {0}")]
    Ended(String),
    /// A message could not be serialized as JSON.
    #[error("cannot serialize a message for the upstream: {0}")]
    Encode(#[source] serde_json::Error),
}

/// How an upstream connection ended: set once, by the first cause.
#[derive(Debug, Default)]
pub struct UpstreamEnd {
    reason: OnceLock<String>,
    ended: Notify,
}

impl UpstreamEnd {
    /// Records why the upstream ended (the first cause wins) and wakes [`UpstreamEnd::wait`].
    pub fn end(&self, reason: impl Into<String>) {
        let reason = reason.into();
        if self.reason.set(reason.clone()).is_ok() {
            tracing::warn!(%reason, "the upstream connection ended");
        }
        self.ended.notify_waiters();
    }

    /// Why the upstream ended, once it has.
    pub fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// Waits until the upstream has ended and returns why.
    pub async fn wait(&self) -> &str {
        loop {
            let notified = self.ended.notified();
            if let Some(reason) = self.reason.get() {
                return reason;
            }
            notified.await;
        }
    }
}

/// The requests sent and not yet answered, and the cancelled ones whose late answer is allowed.
#[derive(Debug, Default)]
struct Outstanding {
    asked: HashSet<RequestId>,
    cancelled: VecDeque<RequestId>,
}

impl Outstanding {
    fn lock(this: &Mutex<Self>) -> std::sync::MutexGuard<'_, Self> {
        this.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `id` may be answered now (and forgets it).
    fn answer(&mut self, id: &RequestId) -> bool {
        if self.asked.remove(id) {
            return true;
        }
        match self.cancelled.iter().position(|cancelled| cancelled == id) {
            Some(at) => {
                self.cancelled.remove(at);
                true
            }
            None => false,
        }
    }

    fn cancel(&mut self, id: &RequestId) {
        if self.asked.remove(id) {
            if self.cancelled.len() == CANCELLED_REMEMBERED {
                self.cancelled.pop_front();
            }
            self.cancelled.push_back(id.clone());
        }
    }
}

/// The client transport towards an untrusted upstream; see the [module documentation](self).
#[derive(Debug)]
pub struct UpstreamTransport<R> {
    input: BufReader<R>,
    reader: LineReader,
    max_line_bytes: usize,
    output: mpsc::UnboundedSender<Vec<u8>>,
    outstanding: Arc<Mutex<Outstanding>>,
    end: Arc<UpstreamEnd>,
    limits: UpstreamLimits,
    in_flight: Arc<Semaphore>,
    /// A push read and waiting for a place in flight (kept here: `receive` may be cancelled).
    waiting: Option<RxJsonRpcMessage<RoleClient>>,
    /// Pushes passed on since the last answer, and dropped since then.
    passed: u64,
    dropped: u64,
    floods: mpsc::Sender<Flood>,
    flood_reports: Option<mpsc::Receiver<Flood>>,
}

impl<R> UpstreamTransport<R>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    /// A transport reading `input` (the upstream's stdout) and writing `output` (its stdin),
    /// accepting lines of at most `max_line_bytes`. Must be called within a tokio runtime: the
    /// output is written by a task of its own, in the order messages are sent. Returns the
    /// transport and the handle that says when and why it ended.
    pub fn new<W>(input: R, output: W, max_line_bytes: usize) -> (Self, Arc<UpstreamEnd>)
    where
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let end = Arc::new(UpstreamEnd::default());
        let (sender, mut queue) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer_end = Arc::clone(&end);
        tokio::spawn(async move {
            let mut output = output;
            while let Some(bytes) = queue.recv().await {
                let written = async {
                    output.write_all(&bytes).await?;
                    // Write whatever else is queued before one flush.
                    while let Ok(more) = queue.try_recv() {
                        output.write_all(&more).await?;
                    }
                    output.flush().await
                };
                if let Err(error) = written.await {
                    writer_end.end(format!(
                        "the upstream's input cannot be written ({error}): it exited or closed it"
                    ));
                    return;
                }
            }
            // Closed by the client: the upstream reads EOF on its stdin.
            let _ = output.shutdown().await;
        });
        let limits = UpstreamLimits::default();
        let (floods, flood_reports) = mpsc::channel(FLOODS_QUEUED);
        let transport = UpstreamTransport {
            input: BufReader::new(input),
            reader: LineReader::new(max_line_bytes),
            max_line_bytes,
            output: sender,
            outstanding: Arc::default(),
            end: Arc::clone(&end),
            limits,
            in_flight: Arc::new(Semaphore::new(limits.in_flight.max(1))),
            waiting: None,
            passed: 0,
            dropped: 0,
            floods,
            flood_reports: Some(flood_reports),
        };
        (transport, end)
    }

    /// The same transport with other limits on what the upstream pushes (at least one push is
    /// handled at a time).
    pub fn with_limits(mut self, limits: UpstreamLimits) -> Self {
        self.limits = limits;
        self.in_flight = Arc::new(Semaphore::new(limits.in_flight.max(1)));
        self
    }

    /// The floods, as they end; `None` after the first call.
    pub fn take_floods(&mut self) -> Option<mpsc::Receiver<Flood>> {
        self.flood_reports.take()
    }

    /// Ends the connection for `reason`: nothing more is read.
    fn fault(&mut self, reason: String) -> Option<RxJsonRpcMessage<RoleClient>> {
        self.end.end(reason);
        self.flood_over(false);
        None
    }

    /// An answer arrived, or the connection ended: a flood since the last answer is reported.
    fn flood_over(&mut self, answered: bool) {
        if self.dropped > 0 {
            let flood = Flood {
                passed: self.passed,
                dropped: self.dropped,
                answered,
            };
            if self.floods.try_send(flood).is_err() {
                tracing::warn!(
                    dropped = self.dropped,
                    "the upstream flooded the proxy and the flood could not be reported"
                );
            }
        }
        self.passed = 0;
        self.dropped = 0;
    }

    /// Whether a push of the upstream may be passed on (counts it either way).
    fn admit_push(&mut self) -> bool {
        let limit = u64::try_from(self.limits.pushes_per_answer).unwrap_or(u64::MAX);
        if self.passed < limit {
            self.passed += 1;
            return true;
        }
        if self.dropped == 0 {
            tracing::warn!(
                limit,
                "the upstream pushes more notifications and requests than allowed between two answers; the rest are dropped until it answers"
            );
        }
        self.dropped += 1;
        false
    }

    /// Waits for a place in flight for `message` (kept in `self.waiting` meanwhile), and gives it
    /// the place to carry.
    async fn hand_over(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let permit = Arc::clone(&self.in_flight).acquire_owned().await.ok()?;
        let mut message = self.waiting.take()?;
        let held = InFlight(Arc::new(permit));
        match &mut message {
            JsonRpcMessage::Request(request) => {
                request.request.extensions_mut().insert(held);
            }
            JsonRpcMessage::Notification(notification) => {
                notification.notification.extensions_mut().insert(held);
            }
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
        }
        Some(message)
    }
}

impl<R> Transport<RoleClient> for UpstreamTransport<R>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    type Error = UpstreamError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Queued now, in rmcp's order of events; the writer task keeps that order.
        let queued = (|| {
            if let Some(reason) = self.end.reason() {
                return Err(UpstreamError::Ended(reason.to_owned()));
            }
            let mut bytes = serde_json::to_vec(&item).map_err(UpstreamError::Encode)?;
            bytes.push(b'\n');
            {
                let mut outstanding = Outstanding::lock(&self.outstanding);
                match &item {
                    JsonRpcMessage::Request(request) => {
                        outstanding.asked.insert(request.id.clone());
                    }
                    JsonRpcMessage::Notification(notification) => {
                        if let ClientNotification::CancelledNotification(cancelled) =
                            &notification.notification
                            && let Some(id) = &cancelled.params.request_id
                        {
                            outstanding.cancel(id);
                        }
                    }
                    JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
                }
            }
            self.output.send(bytes).map_err(|_| {
                UpstreamError::Ended(
                    self.end
                        .reason()
                        .unwrap_or("the connection to the upstream was closed")
                        .to_owned(),
                )
            })
        })();
        std::future::ready(queued)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        // Cancellation safety: the awaits are the line read, which keeps a partial line in
        // `self.reader`, and the wait for a place in flight, which keeps its push in
        // `self.waiting`; everything between them is synchronous.
        if self.waiting.is_some() {
            return self.hand_over().await;
        }
        loop {
            if self.end.reason().is_some() {
                return None;
            }
            let line = match self.reader.read_line(&mut self.input).await {
                LineRead::Line => self.reader.line(),
                LineRead::TooLong { seen } => {
                    return self.fault(format!(
                        "the upstream wrote a line of more than {} bytes (at least {seen}), over the limit",
                        self.max_line_bytes
                    ));
                }
                LineRead::Eof => {
                    return self.fault(
                        "the upstream closed its output (it exited, crashed or closed stdout)"
                            .to_owned(),
                    );
                }
                LineRead::Failed(error) => {
                    return self.fault(format!("the upstream's output cannot be read: {error}"));
                }
            };
            let bytes = line.len();
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                self.reader.done();
                continue;
            }
            let parsed = serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(trimmed);
            self.reader.done();
            let message = match parsed {
                Ok(message) => message,
                Err(error) => {
                    // serde_json's category and position only: the line may hold anything.
                    return self.fault(format!(
                        "the upstream wrote a line that is not a JSON-RPC message it may send ({bytes} bytes, {:?} error at line {} column {})",
                        error.classify(),
                        error.line(),
                        error.column()
                    ));
                }
            };
            let answered = match &message {
                JsonRpcMessage::Response(response) => Some(Some(&response.id)),
                JsonRpcMessage::Error(error) => Some(error.id.as_ref()),
                JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
            };
            match answered {
                None => {
                    if self.admit_push() {
                        self.waiting = Some(message);
                        return self.hand_over().await;
                    }
                    continue;
                }
                Some(None) => {
                    let error = match &message {
                        JsonRpcMessage::Error(error) => error.error.message.to_string(),
                        _ => String::new(),
                    };
                    return self.fault(format!(
                        "the upstream answered with an error without a request id (it could not read a request it was sent): {error}"
                    ));
                }
                Some(Some(id)) if !Outstanding::lock(&self.outstanding).answer(id) => {
                    return self.fault(format!(
                        "the upstream answered request id {id}, which was not asked or was already answered"
                    ));
                }
                Some(Some(_)) => self.flood_over(true),
            }
            return Some(message);
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Dropping the queue's sender ends the writer task, which closes the upstream's stdin.
        let (closed, _) = mpsc::unbounded_channel();
        self.output = closed;
        self.end
            .end("the proxy closed the connection to the upstream");
        Ok(())
    }
}
