//! Every PostgreSQL store of toolgate, shared by the replicas on one database: the audit chain
//! ([`PgAuditLog`], an `AuditSink`), the exactly-once store ([`PgEffects`], an `EffectBackend`),
//! the kill switch ([`PgHalts`]), the rights ([`PgRights`]), the Cedar entities ([`PgEntities`]),
//! the rate buckets ([`PgRates`]) and the pending confirmations ([`PgPending`]), each
//! implementing its trait with the guarantees written there, and what they share ([`store`]: the connection pool, its runtime, TLS and the
//! versioned migrations). Every store creates or migrates its own tables (`toolgate_schema`, one
//! component each) when opened on a [`PgStore`].
//!
//! `tests/*_conformance.rs` run the same cases against these stores and the file and memory ones
//! (this is the one crate that sees all three); they start a real PostgreSQL cluster from the
//! machine's binaries (`toolgate-pgtest`).

#![forbid(unsafe_code)]

mod audit;
mod document;
mod effects;
mod entities;
mod kill_switch;
mod pending;
mod rates;
mod rights;
pub mod store;

pub use audit::PgAuditLog;
pub use effects::PgEffects;
pub use entities::PgEntities;
pub use kill_switch::PgHalts;
pub use pending::PgPending;
pub use rates::PgRates;
pub use rights::PgRights;
pub use store::{PgError, PgStore};
