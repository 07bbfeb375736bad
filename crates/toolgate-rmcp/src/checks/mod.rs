//! The governance checks of the gate, one module per feature: each owns its runtime state and
//! the check that reads it, and the gate runs them in the one order given in this module.
//!
//! The state that changes while the server runs is consulted again on every call, so that an
//! operator's decision takes effect on the very next call without a restart:
//!
//! - [`kill_switch`]: `<ledger_dir>/halt.json`. While it exists every call is refused. Read fresh
//!   on each call (one failed `open` when running), and fail-closed: an unreadable halt file halts.
//! - [`rights`]: the rights file mapping principals to the tools they may call. Re-read when it
//!   changes, so a revocation applies to the next call; an invalid file refuses every call.
//! - [`rates`]: token buckets (per principal, per tool), taken all-or-nothing per call.
//! - [`confirmation`]: pending two-step actions. A preview issues a one-time token; the confirming
//!   call must present it with the preview's exact summary. In memory, per process.
//! - [`paths`]: whether a path argument, with symbolic links followed, stays inside the allowed
//!   roots.
//!
//! File formats, caching rules and durability assumptions are in `docs/guard.md`.

pub mod confirmation;
mod error;
pub mod kill_switch;
pub mod paths;
pub mod rates;
pub mod rights;

pub use confirmation::pending::{
    ConfirmError, ConfirmToken, Issued, PendingAction, PendingActions,
};
pub use error::GuardError;
pub use kill_switch::{Halt, KillSwitch, Status};
pub use paths::{PathError, resolve_within};
pub use rates::{Limit, Limited, RateLimiter};
pub use rights::{Rights, RightsFile};
