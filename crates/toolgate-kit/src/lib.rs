//! `toolgate-kit`: prove MCP tool annotations by experiment.
//!
//! Annotations (`readOnlyHint`, `idempotentHint`, `destructiveHint`) are claims. This kit runs a
//! fixed matrix of calls against a server and compares what each call did to what the tool claims,
//! using a state [`Observer`] the author supplies (files under a directory, rows, captured
//! outbound requests, queued jobs: anything that can be digested).
//!
//! For every tool with fixtures, in this order, on one persistent state (nothing is reset between
//! cases; the observer snapshots around each case):
//!
//! 1. `valid call`: [`ToolFixtures::valid`] once;
//! 2. `byte-identical repeat`: the same arguments again (a new JSON-RPC id);
//! 3. `missing resource`, `already done`, `invalid field`: the optional fixtures and `invalid`;
//! 4. `retry after cut-off`: [`ToolFixtures::second_valid`] on a connection that is cut after the
//!    server received the call (see [`CutOff`]), then the identical call on a new connection with a
//!    new JSON-RPC id, as the 2026-07-28 revision requires of a retry;
//! 5. `concurrent pair`: two identical calls at the same time on two connections (two child
//!    processes on the same state for [`Launcher::child`]).
//!
//! Every case runs on fresh connections (a fresh child process per connection for
//! [`Launcher::child`]), and the "before" snapshot is taken after the handshake, so a server's
//! own start-up writes are never attributed to a call.
//!
//! Verdicts read the annotations with the spec's conservative defaults (`readOnlyHint=false`,
//! `destructiveHint=true`, `idempotentHint=false` when absent). A tool that declares none of the
//! three is *unclassified*: nothing is claimed, so nothing is contradicted, and it is never reported
//! as safe. See [`Report`].
//!
//! The kit is a test-time crate: the gate does not depend on it.

#![forbid(unsafe_code)]

mod error;
mod launch;
mod matrix;
mod observe;
mod report;

pub use error::{KitError, ObserveError};
pub use launch::Launcher;
pub use matrix::{CutOff, Kit, ToolFixtures};
pub use observe::{Change, ChangeKind, Delta, FsObserver, Item, Observation, Observer};
pub use report::{
    CaseKind, CaseReport, Claim, Claims, Contradiction, ObservedStep, Report, ToolReport,
    ToolStatus,
};
