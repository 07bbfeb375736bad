//! Typed errors of the kit. Each message names the cause and what to do about it.

use std::time::Duration;

/// Why the kit could not run the matrix (a contradiction is not an error: it is in the report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KitError {
    /// The server under test could not be started.
    #[error(
        "cannot start the server under test ({what}): {source}; check the launcher's command (path, arguments) and that the binary is built"
    )]
    Launch {
        /// What was being started.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Writing to or reading from the server's connection failed.
    #[error(
        "the connection to the server under test failed while {what}: {source}; the server probably exited, see its stderr:\n{stderr}"
    )]
    Io {
        /// What the kit was doing.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
        /// What the server wrote on stderr so far (child processes only).
        stderr: String,
    },
    /// The server closed its side of the connection before answering.
    #[error(
        "the server under test closed the connection while {what}; it probably exited, see its stderr:\n{stderr}"
    )]
    Closed {
        /// What the kit was waiting for.
        what: String,
        /// What the server wrote on stderr so far (child processes only).
        stderr: String,
    },
    /// A condition did not hold within the kit's timeout.
    #[error(
        "{what} did not happen within {after:?}; raise Kit::timeout on a slow machine, or check the server's stderr:\n{stderr}"
    )]
    Timeout {
        /// The awaited condition.
        what: String,
        /// The timeout that expired.
        after: Duration,
        /// What the server wrote on stderr so far (child processes only).
        stderr: String,
    },
    /// The server answered something the kit cannot use.
    #[error(
        "the server under test answered {what} with {message}; the kit speaks MCP 2026-07-28 (server/discover, then requests carrying _meta), or 2025-11-25 (initialize) with a server that refuses server/discover, over JSON lines"
    )]
    Protocol {
        /// The request that got the unusable answer.
        what: String,
        /// What was wrong with it.
        message: String,
    },
    /// Fixtures name a tool that `tools/list` does not list.
    #[error(
        "fixtures name the tool `{tool}` but the server's tools/list does not list it; check the name, and that the server's policy makes it visible"
    )]
    ToolNotListed {
        /// The tool named by the fixtures.
        tool: String,
    },
    /// A fixture is unusable.
    #[error("the fixture `{fixture}` of tool `{tool}` is unusable: {message}")]
    Fixture {
        /// The tool.
        tool: String,
        /// Which fixture.
        fixture: &'static str,
        /// What is wrong, and how to fix it.
        message: String,
    },
    /// The overwrite case could not seed the state its call is to modify.
    #[error("the overwrite case of tool `{tool}` could not seed the existing state: {message}")]
    Seed {
        /// The tool whose overwrite case it is.
        tool: String,
        /// What went wrong, and how to fix it.
        message: String,
    },
    /// After [`Observer::restore`](crate::Observer::restore) the state differs from the one saved.
    #[error(
        "after restoring the state saved before {what}, the observation differs from the saved one ({differences}); the observer's restore must put back every record it observes, with the same content"
    )]
    NotRestored {
        /// Which step saved the state.
        what: String,
        /// The records that differ (saved to restored).
        differences: String,
    },
    /// The kit was run without an observer.
    #[error(
        "no observer was given, so no effect could be seen and every claim would pass untested; call Kit::observer (FsObserver::new(dirs) for files)"
    )]
    NoObserver,
    /// The observer failed.
    #[error(transparent)]
    Observe(#[from] ObserveError),
    /// A blocking observer task or a server task panicked or was cancelled.
    #[error(
        "an internal task of the kit failed ({what}): {message}; this is a bug in the observer or the server factory"
    )]
    Task {
        /// Which task.
        what: String,
        /// The join error.
        message: String,
    },
}

/// An observer could not take a snapshot of the state.
#[derive(Debug, thiserror::Error)]
#[error("the observer could not snapshot the state ({what}){}", source.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
#[non_exhaustive]
pub struct ObserveError {
    /// What the observer was reading, and what to check.
    pub what: String,
    /// The underlying error, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ObserveError {
    /// An error reading `what`, caused by `source`.
    pub fn new(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ObserveError {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    /// An error without an underlying cause.
    pub fn message(what: impl Into<String>) -> Self {
        ObserveError {
            what: what.into(),
            source: None,
        }
    }
}
