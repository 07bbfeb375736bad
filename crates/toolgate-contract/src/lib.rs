//! Tool contracts: what a tool promises to the model that calls it, digested, locked and diffed.
//!
//! A tool's description, schemas and annotations are behaviour, because the consumer is a model.
//! This crate turns each tool into a [`contract::ToolContract`] of four sections (surface, behavior,
//! token economics, entitlements), each canonical JSON hashed with SHA-256, writes them to
//! `toolgate.lock` ([`lockfile`]), classifies every difference between two lockfiles as BREAKING,
//! RISKY, SAFE or COSMETIC ([`diff`]) and signs the server digest ([`attest`]). The entitlement
//! scanner that reads a handler's source is `toolgate-scan`, so a running server links no parser.
//!
//! It knows nothing of MCP libraries: callers convert their tool definitions into
//! [`model::ToolDefinition`].

#![forbid(unsafe_code)]

/// The largest `toolgate.lock` read (16 MiB; a lockfile of 1,000 tools is about 2 MiB).
pub const MAX_LOCKFILE_BYTES: u64 = 16 << 20;

pub mod attest;
pub mod awareness;
pub mod check;
pub mod contract;
pub mod diff;
pub mod lockfile;
pub mod model;
pub mod upstream;

pub use model::{Annotations, EffectiveAnnotations, Entitlements, HandlerFacts, ToolDefinition};
