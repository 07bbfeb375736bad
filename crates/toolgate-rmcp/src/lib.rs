//! The only toolgate crate that knows MCP: it puts policy, audit and exactly-once at the
//! tool-call boundary of any `rmcp` server.
//!
//! - [`Gated`] wraps a `ServerHandler`: `tools/list` shows only what the policy allows, and
//!   `tools/call` is decided before dispatch. Denied and unknown tools get the same JSON-RPC error
//!   (-32602); every decision is appended to the audit log.
//! - [`Permit`] is the handler-side proof of a decision. Only the gate can create one, so a handler
//!   that takes it cannot run undecided. Exactly-once is the gate's: tools the policy opts in
//!   (`idempotency`) run at most once per key through the effect store.

#![forbid(unsafe_code)]

mod blocking;
pub mod checks;
pub mod contract;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod gate;
mod permit;
mod principal;
mod refusal;
mod state;
#[cfg(feature = "otel")]
mod telemetry;
mod unwind;
mod world;

pub use blocking::{Cancelled, run as run_blocking};
pub use checks::arguments::SchemaCache;
pub use checks::exactly_once::{IDEMPOTENCY_KEY_META, MAX_IDEMPOTENCY_KEY_BYTES, REPLAYED_META};
pub use gate::{
    CONTRACT_DIGEST_META_KEY, GateError, Gated, GatedBuilder, LEDGER_AUDIT_FILE,
    LEDGER_EFFECTS_DIR, LEDGER_WAIT_IN_PROGRESS, UnavailableTools, ledger_effect_config,
};
pub use permit::{Permit, PermitError};
pub use principal::{
    FixedPrincipal, FromExtensions, InvalidPrincipal, PrincipalSource, VerifiedPrincipal,
};
pub use state::{GateState, PolicyHandle, Reload, ReloadError, Reloaded};
pub use world::{
    CONFIRM_ACTION, Caller, Current, EffectProbe, HALTED, Preflight, Preparation, ProbeAnswer,
    REJECT_ACTION, TOOL_NOT_FOUND,
};
