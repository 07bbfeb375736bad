//! `toolgate-kit`: prove MCP tool annotations by experiment.
//!
//! Annotations (`readOnlyHint`, `idempotentHint`, `destructiveHint`) are claims. This kit runs a
//! fixed matrix of calls against a server and compares what each call did to what the tool claims,
//! using a state [`Observer`] the author supplies (files under a directory, rows, captured
//! outbound requests, queued jobs: anything that can be digested).
//!
//! For every tool with fixtures, in this order, on one persistent state (nothing is reset between
//! cases, except that what cases 5 and 6 do only to compare or to seed is undone when the
//! observer can restore; the observer snapshots around each case):
//!
//! 1. `valid call`: [`ToolFixtures::valid`] once;
//! 2. `byte-identical repeat`: the same arguments again (a new JSON-RPC id);
//! 3. `missing resource`, `already done`, `invalid field`: the optional fixtures and `invalid`;
//! 4. `retry after cut-off`: [`ToolFixtures::second_valid`] on a connection that is cut after the
//!    server received the call (see [`CutOff`]), then the identical call on a new connection with a
//!    new JSON-RPC id, as the 2026-07-28 revision requires of a retry;
//! 5. `concurrent pair`: two identical calls at the same time on two connections (two child
//!    processes on the same state for [`Launcher::child`]). When the observer can restore state
//!    ([`Observer::save`]), one call runs first, its outcome is recorded, the starting state is
//!    put back, then two calls run one after the other and the state is put back again. The
//!    pair's outcome must have the same content as one call's, record by record: an edit
//!    applied twice is an added effect. When both calls of the pair succeed and leave one
//!    call's outcome while two calls in a row leave more, one update was lost: the case flags
//!    a [`LostUpdate`] (and contradicts `destructiveHint: false`: an update was replaced).
//!    Otherwise (no restore) the pair may change no more records than case 1's single call,
//!    which a lost update passes unseen, so a claimed `idempotentHint: true` is then untested;
//! 6. `overwrite existing state` ([`ToolFixtures::with_overwrite`]): the kit seeds state (a
//!    record it writes, [`Seed::record`], or a preparatory call, [`Seed::call`]), calls the tool
//!    to modify it, and restores the state afterwards when the observer can.
//!
//! Every case runs on fresh connections (a fresh child process per connection for
//! [`Launcher::child`]), and the "before" snapshot is taken after the handshake, so a server's
//! own start-up writes are never attributed to a call.
//!
//! Each claim reads the observed changes with its own meaning: for `readOnlyHint: true` any
//! change is an effect, a metadata-only touch ([`ChangeKind::Touched`]) included; for
//! `idempotentHint: true` a repeat that leaves the same content adds no effect (touches are
//! reported in the case, not counted); `destructiveHint: false` is contradicted by a record
//! modified or removed, which the overwrite case provokes on purpose.
//!
//! Every declared claim gets a [`ClaimVerdict`]: [`ClaimStatus::Contradicted`] when an observed effect
//! contradicts it, [`ClaimStatus::Held`] only when some case actually put it to the test and nothing
//! did, and [`ClaimStatus::Untested`] otherwise, with the reason. `readOnlyHint: true` is tested by a
//! call that succeeded; `idempotentHint: true` by a repeat of a completed operation (case 2 after
//! a successful case 1, case 3's already-done call, case 4 after a completed cut-off call, the
//! pair, at full strength only with an observer that restores); `destructiveHint: false` by the
//! overwrite case (a result, even an error result: refusing to overwrite is additive), or by a
//! call that appended to a record that existed before it. A call that only wrote fresh records
//! leaves `destructiveHint: false` untested, except on a tool whose `readOnlyHint: true` held
//! (the spec gives `destructiveHint` meaning only when `readOnlyHint` is false). A tool with an
//! untested claim is [`ToolStatus::Untested`], never consistent.
//!
//! Verdicts read the annotations with the spec's conservative defaults (`readOnlyHint=false`,
//! `destructiveHint=true`, `idempotentHint=false` when absent). A tool that declares none of the
//! three is *unclassified*: nothing is claimed, so nothing is contradicted, and it is never reported
//! as safe. See [`Report`].
//!
//! The kit is a test-time crate: the gate does not depend on it.
//!
//! # Example
//!
//! docs/kit.md's example: a test that runs the matrix on a server started as a child process.
//!
//! ```no_run
//! use serde_json::json;
//! use toolgate_kit::{FsObserver, Kit, Launcher, ToolFixtures};
//!
//! #[tokio::test(flavor = "multi_thread")]
//! async fn annotations_survive_the_matrix() {
//!     let state = tempfile::tempdir().unwrap();
//!     let data_dir = state.path().to_path_buf();
//!     let launcher = Launcher::child(move || {
//!         let mut command = std::process::Command::new("target/debug/my-server");
//!         command.arg("--data-dir").arg(&data_dir);
//!         command
//!     }); // or Launcher::in_process(move || MyServer::new(shared.clone()))
//!     let report = Kit::new(launcher)
//!         .observer(FsObserver::new([state.path()]).ignore("*.log", "request log, not an effect"))
//!         .tool(
//!             ToolFixtures::new(
//!                 "create_ticket",
//!                 json!({"request_id": "t-1", "title": "rotate cert"}), // valid
//!                 json!({"request_id": "t-2", "title": "renew domain"}), // second valid
//!                 json!({"request_id": "t-3", "title": 42}), // invalid
//!             )
//!             .with_already_done(json!({"request_id": "t-1", "title": "rotate cert"}))
//!             .with_concurrent(json!({"request_id": "t-4", "title": "page on-call"})),
//!         )
//!         .run()
//!         .await
//!         .unwrap();
//!     eprintln!("{}", report.to_text());
//!     report.assert_honest(); // panics with the report if any claim is contradicted
//! }
//! ```

#![forbid(unsafe_code)]

mod error;
pub mod harness;
mod launch;
mod matrix;
mod observe;
mod report;

pub use error::{KitError, ObserveError};
pub use launch::Launcher;
pub use matrix::{CutOff, Kit, Overwrite, Seed, ToolFixtures};
pub use observe::{Change, ChangeKind, Delta, FsObserver, Item, Observation, Observer, SavedState};
pub use report::{
    CaseKind, CaseReport, Claim, ClaimGap, ClaimStatus, ClaimVerdict, Claims, Contradiction,
    LostUpdate, ObservedStep, Report, ToolReport, ToolStatus,
};
