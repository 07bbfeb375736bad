//! toolgate: the decisions a model must not make alone, enforced in an rmcp server at the
//! tool-call boundary. The one dependency a server author adds.
//!
//! ```toml
//! [dependencies]
//! toolgate = "0.1"
//! rmcp = { version = "3.11", features = ["server", "macros", "transport-io"] }
//! ```
//!
//! Wrap the server's handler in [`Gated`] and serve it; everything a server needs is in the
//! [`prelude`]:
//!
//! - a versioned policy decides every `tools/list` and `tools/call` ([`policy`]); a denied tool is
//!   invisible and a direct call gets a JSON-RPC error before any handler code runs;
//! - tools the policy opts in run exactly once per idempotency key ([`effect`]);
//! - every decision is appended to a hash-chained audit log ([`audit`]) that `verify` checks;
//! - the kill switch, rights file, rate limits and two-step confirmation ([`checks`]);
//! - each tool's contract is digested into `toolgate.lock` and checked in CI ([`contract`]);
//! - [`StdioTransport`] serves stdio with every malformed line answered and bounded memory;
//! - [`PrincipalSource`] tells the gate who is calling on each request.
//!
//! The crates behind these modules can also be used one by one; this crate only re-exports them.

#![forbid(unsafe_code)]

pub use toolgate_rmcp::*;

/// The rmcp this toolgate is built with: depend on it through here (`toolgate::rmcp`) or pin the
/// same version, so that the handler you wrap and the gate agree on rmcp's types.
pub use rmcp;
pub use toolgate_stdio::{InFlight, StdioConfig, StdioError, StdioTransport, upstream};

/// The stdio transports: the server side ([`StdioTransport`]) and the client side to an untrusted
/// upstream process ([`upstream`]) (`toolgate-stdio`).
pub mod stdio {
    pub use toolgate_stdio::*;
}

/// The policy: its file format, loading and decisions (`toolgate-policy`).
pub mod policy {
    pub use toolgate_policy::*;
}

/// The audit chain: records, the file and memory sinks, the verifier, checkpoints
/// (`toolgate-audit`).
pub mod audit {
    pub use toolgate_audit::*;
    /// The chain in PostgreSQL (`toolgate-postgres`, feature `postgres`).
    #[cfg(feature = "postgres")]
    pub use toolgate_postgres::PgAuditLog;
}

/// Exactly-once effects: the backend trait, the file store and the in-memory one
/// (`toolgate-commit`).
pub mod effect {
    pub use toolgate_commit::*;
    /// The store in PostgreSQL (`toolgate-postgres`, feature `postgres`).
    #[cfg(feature = "postgres")]
    pub use toolgate_postgres::PgEffects;
}

/// The state the gate's checks consult on every call: the kill switch, rights file, Cedar
/// entities, rate limits, pending confirmations (their stores: `toolgate-state`) and path
/// containment (`toolgate_rmcp::checks`).
pub mod checks {
    pub use toolgate_rmcp::checks::*;
    pub use toolgate_state::{document, entities, kill_switch, pending, rates, rights};
}

/// The PostgreSQL stores of the governance state, shared by every replica on one database
/// (`toolgate-postgres`, feature `postgres`).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use toolgate_postgres::*;
}

/// The tool contract: lockfile, digests, verdicts, attestation (`toolgate-contract`), and a
/// server's live contract from its tools and policy (`live_lockfile`, `server_contract`,
/// `locked_contract`; the gate's stages from `toolgate_rmcp::contract`).
pub mod contract {
    pub use crate::live::*;
    pub use toolgate_contract::*;
    pub use toolgate_rmcp::contract::*;

    /// The lock check (feature `lock`): [`check_lock`] with [`LockCheck`], and the scan of a
    /// server's handlers it runs ([`scan_sources`]).
    #[cfg(feature = "lock")]
    pub use crate::lock::{
        LockCheck, LockError, LockMode, LockOutcome, LockReport, UPDATE_LOCK_ENV, check_lock,
        scan_sources,
    };

    /// The entitlement scanner (`toolgate-scan`, feature `lock`).
    #[cfg(feature = "lock")]
    pub mod scan {
        pub use toolgate_scan::*;
    }
}

mod builder;
pub use builder::GatedBuilderExt;
mod live;
#[cfg(feature = "lock")]
mod lock;

/// The storage floor every store sits on (`toolgate-storage`).
pub mod storage {
    pub use toolgate_storage::*;
}

/// Canonical JSON, digests and HMAC keys (`toolgate-canon`).
pub mod canon {
    pub use toolgate_canon::*;
}

/// The Streamable HTTP front door: the router, API tokens, OAuth, the accept loop
/// (`toolgate-http`, feature `http`).
#[cfg(feature = "http")]
pub mod http {
    pub use toolgate_http::*;
}

/// The annotation kit: drives a server under test and checks that its annotations do not lie
/// (`toolgate-kit`, feature `kit`).
#[cfg(feature = "kit")]
pub mod kit {
    pub use toolgate_kit::*;
}

/// Execute-verify-stop on the client side: run one mutation, observe what remained, and decide
/// CONTINUE, STOP or ROLLBACK (`toolgate_kit::harness`, feature `kit`).
#[cfg(feature = "kit")]
pub use toolgate_kit::harness;

pub mod operator;
pub mod stores;

/// What a gated server uses, in one import: `use toolgate::prelude::*;`.
pub mod prelude {
    pub use crate::GatedBuilderExt as _;
    pub use crate::audit::{AuditConfig, AuditSink, FileAuditLog, MemoryAuditLog};
    pub use crate::canon::{HmacKey, Sha256Digest};
    pub use crate::checks::{KillSwitch, RightsFile};
    pub use crate::effect::{EffectConfig, EffectStore, MemoryEffects};
    pub use crate::policy::Policy;
    pub use crate::stores::Stores;
    pub use crate::{
        Caller, Current, FixedPrincipal, FromExtensions, GateError, Gated, GatedBuilder, Permit,
        Preflight, Preparation, PrincipalSource, StdioConfig, StdioTransport, VerifiedPrincipal,
    };
}

/// The README's example is compiled as a doc test so that it cannot rot.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The crates.io page's example, compiled likewise.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct CratePageDoctests;
