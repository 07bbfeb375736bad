//! The governance state the gate consults on every call, one store trait each: the kill switch
//! ([`HaltStore`]), the rights ([`RightsStore`]), the Cedar entities ([`EntitiesStore`]), the rate buckets ([`RateStore`]) and the
//! pending confirmations ([`PendingStore`]). File and memory stores live here; the PostgreSQL
//! ones, shared by every replica on a database, are in `toolgate-postgres`. What every store of
//! a trait guarantees is written on the trait, and one conformance suite per trait
//! (`crates/toolgate-postgres/tests/*_conformance.rs`) runs the same cases against each.
//!
//! The checks that read these stores are in `toolgate-rmcp`; file formats, caching rules and
//! durability assumptions are in `docs/checks.md`.

#![forbid(unsafe_code)]

pub mod document;
pub mod entities;
mod error;
pub mod kill_switch;
pub mod pending;
pub mod rates;
pub mod rights;
pub mod watched;

pub use document::{Document, DocumentStore};
pub use entities::{
    EntitiesFile, EntitiesStore, EntityDocument, FileEntities, MemoryEntities, PrincipalEntity,
};
pub use error::GuardError;
pub use kill_switch::{FileHalts, Halt, HaltStore, KillSwitch, MemoryHalts, Status};
pub use pending::{
    ConfirmError, ConfirmToken, FilePending, Issued, Lifetime, MemoryPending, PendingAction,
    PendingActions, PendingStore, TokenState,
};
pub use rates::{FileRates, Limit, Limited, RateLimiter, RateStore};
pub use rights::{
    FileRights, InvalidRights, MemoryRights, Rights, RightsDocument, RightsFile, RightsStore,
};
pub use watched::FRESHNESS_WINDOW;
