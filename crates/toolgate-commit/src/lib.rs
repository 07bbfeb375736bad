//! Exactly-once effects: the one place in toolgate that deduplicates calls by idempotency key.
//!
//! [`effect::EffectStore`] is a durable state machine per (principal, tool, key): the gate asks it
//! before running a tool the policy opts in (`idempotency`), and it answers execute (exactly once),
//! replay (the stored result), conflict (the same key with other arguments), in progress or
//! indeterminate. Tools themselves contain no key logic. The store keeps its journal on the storage
//! floor (`toolgate-storage`), whose `Storage` trait lets tests count and fail every write and sync.
//! `docs/commit-store.md` documents the layout and the durability assumptions.

#![forbid(unsafe_code)]

pub mod effect;

/// A test-only callback invoked with the name of each crash point the store reaches.
///
/// The reference server installs one that creates a marker file and sleeps, so that a test can kill
/// the process at exactly that point. It only exists with the `fault-injection` feature, so that a
/// production build has no code path that can stall a commit.
#[cfg(feature = "fault-injection")]
pub type FaultHook = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;
