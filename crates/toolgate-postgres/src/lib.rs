//! The PostgreSQL stores of toolgate, shared by every replica on one database: the kill switch
//! ([`PgHalts`]), the rights ([`PgRights`]), the rate buckets ([`PgRates`]) and the pending
//! confirmations ([`PgPending`]), each implementing its `toolgate-state` trait with the guarantees
//! written there. Every store creates or migrates its own tables (`toolgate_schema`, one component
//! each) when opened on a `toolgate_storage::postgres::PgStore`.
//!
//! `tests/*_conformance.rs` run the same cases against these stores and the file and memory ones
//! (this is the one crate that sees all three); they start a real PostgreSQL cluster from the
//! machine's binaries (`toolgate-pgtest`).

#![forbid(unsafe_code)]

mod kill_switch;
mod pending;
mod rates;
mod rights;

pub use kill_switch::PgHalts;
pub use pending::PgPending;
pub use rates::PgRates;
pub use rights::PgRights;
pub use toolgate_storage::postgres::{PgError, PgStore};
