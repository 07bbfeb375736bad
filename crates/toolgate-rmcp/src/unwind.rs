//! A panic inside the inner handler becomes an answer.
//!
//! rmcp runs each request in a task of its own. When the handler panics, the task ends and no
//! response is ever sent: the client waits forever, and the stdio transport keeps the request's
//! in-flight slot until the connection ends, so a handful of panics would leave a connection
//! that can no longer be served. The gate therefore polls every future of the inner handler
//! through [`contained`], which turns a panic into -32603 (the panic's own message stays in the
//! process's log through the panic hook: it may quote arguments, so the caller never sees it).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::Poll;

use rmcp::ErrorData as McpError;

/// The inner handler panicked while serving `what`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Panicked {
    pub(crate) what: &'static str,
}

impl From<Panicked> for McpError {
    fn from(panicked: Panicked) -> Self {
        McpError::internal_error(
            format!(
                "the server's handler failed while serving {} (it panicked; the server's log has the details); the request was not completed",
                panicked.what
            ),
            None,
        )
    }
}

/// Polls `future` to completion, or to the first panic, which is caught and returned as
/// [`Panicked`]. The future is not polled again after it panicked.
pub(crate) async fn contained<F: Future>(
    what: &'static str,
    future: F,
) -> Result<F::Output, Panicked> {
    let mut future = std::pin::pin!(future);
    // Unwind safety: after a panic the future is dropped without being polled again, and what
    // it shares with the gate (stores, the audit sink) keeps its own invariants under a panic
    // (its locks recover from poisoning).
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(Panicked { what })),
        }
    })
    .await
}

/// [`contained`] for a request whose answer is a `Result`: a panic is its -32603.
pub(crate) async fn answered<T, F>(what: &'static str, future: F) -> Result<T, McpError>
where
    F: Future<Output = Result<T, McpError>>,
{
    contained(what, future)
        .await
        .unwrap_or_else(|p| Err(p.into()))
}

/// [`contained`] for a notification: a panic is logged, there is nobody to answer.
pub(crate) async fn notified<F: Future<Output = ()>>(what: &'static str, future: F) {
    if contained(what, future).await.is_err() {
        tracing::error!(
            notification = what,
            "the server's handler panicked on a notification"
        );
    }
}
