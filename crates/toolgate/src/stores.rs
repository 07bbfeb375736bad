//! Opening the stores of a gated server once, from a ledger directory or a database URL, for the
//! builder's callers and the reference server alike.
//!
//! A gate needs an audit chain, an exactly-once store and a kill switch; with a database, the
//! rights, the Cedar entities, the rate-limit buckets and the pending confirmations are shared by
//! every replica too.
//! [`Stores::ledger`] opens the ledger's files (the documented layout: `audit.jsonl`,
//! `effects/`, `halt.json`); [`Stores::database`] (feature `postgres`) opens all seven in one
//! PostgreSQL database. [`GatedBuilderExt::stores`](crate::GatedBuilderExt::stores) hands them to a [`GatedBuilder`](toolgate_rmcp::GatedBuilder), which
//! takes open stores and never names a backend.
//!
//! ```no_run
//! use toolgate::prelude::*;
//! use toolgate::stores::Stores;
//!
//! # #[derive(Clone)] struct MyServer;
//! # impl rmcp::ServerHandler for MyServer {}
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = toolgate::policy::Policy::load(std::path::Path::new("policy.json"))?;
//! let stores = Stores::ledger("ledger", AuditConfig::new("ledger/audit.jsonl"), &policy)?;
//! let gated = Gated::builder(MyServer).policy(policy).stores(stores).build()?;
//! # drop(gated); Ok(()) }
//! ```

use std::path::Path;
use std::sync::Arc;

use toolgate_audit::{AuditConfig, AuditError, AuditSink, FileAuditLog};
use toolgate_commit::{EffectBackend, EffectError, EffectStore};
use toolgate_policy::Policy;
use toolgate_state::{EntitiesFile, KillSwitch, PendingStore, RateStore, RightsFile};
use toolgate_storage::{FsStorage, Storage};

/// Why the stores could not be opened. Nothing was served; the message names the store and
/// the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoresError {
    /// The audit chain could not be opened.
    #[error("cannot open the audit chain: {0}")]
    Audit(#[from] AuditError),
    /// The exactly-once store could not be opened.
    #[error("cannot open the exactly-once store: {0}")]
    Effects(#[from] EffectError),
    /// The database could not be reached or its schema could not be migrated.
    #[cfg(feature = "postgres")]
    #[error("cannot open the PostgreSQL store: {0}")]
    Database(#[from] toolgate_postgres::PgError),
    /// A governance store in the database (kill switch, rights, entities) could not be opened.
    #[cfg(feature = "postgres")]
    #[error("cannot open the governance state in the database: {0}")]
    State(#[from] toolgate_state::GuardError),
    /// A database URL was given to a build without PostgreSQL support.
    #[error(
        "this build has no PostgreSQL support (the feature `postgres` of toolgate); build it with \
         the feature, or keep the stores in a ledger directory instead of a database"
    )]
    NoDatabaseSupport,
}

/// The open stores of one gated server.
#[derive(Debug, Clone)]
pub struct Stores {
    /// The audit chain.
    pub audit: Arc<dyn AuditSink>,
    /// The exactly-once store.
    pub effects: Arc<dyn EffectBackend>,
    /// The kill switch (name its resume command with [`KillSwitch::resume_command`], or let the
    /// builder's `server_name` do it).
    pub kill_switch: KillSwitch,
    /// The rights, when the store keeps them (a database); a rights file is the caller's choice
    /// ([`GatedBuilder::rights`](toolgate_rmcp::GatedBuilder::rights)).
    pub rights: Option<RightsFile>,
    /// The Cedar entities, when the store keeps them (a database); an entities file is the
    /// caller's choice ([`GatedBuilder::entities`](toolgate_rmcp::GatedBuilder::entities)).
    pub entities: Option<EntitiesFile>,
    /// The rate-limit buckets shared by replicas; `None`: the gate's own, in memory.
    pub rates: Option<Arc<dyn RateStore>>,
    /// The pending confirmations shared by replicas; `None`: the gate's own, in memory.
    pub pending: Option<Arc<dyn PendingStore>>,
}

impl Stores {
    /// The ledger directory `dir` in the documented layout: the audit log of `audit` (its path,
    /// checkpoint key and storage are the caller's; `AuditConfig::new(dir.join("audit.jsonl"))`
    /// is the layout's), the exactly-once store `dir/effects/` with the policy's windows
    /// ([`crate::ledger_effect_config`]) and the kill switch `dir/halt.json` (these two on the
    /// filesystem; [`Stores::ledger_on`] chooses their storage).
    pub fn ledger(
        dir: impl AsRef<Path>,
        audit: AuditConfig,
        policy: &Policy,
    ) -> Result<Stores, StoresError> {
        Stores::ledger_on(dir, audit, policy, Arc::new(FsStorage))
    }

    /// As [`Stores::ledger`], the exactly-once store and the kill switch writing through
    /// `storage` (fault injection in tests; give the audit config the same one).
    pub fn ledger_on(
        dir: impl AsRef<Path>,
        audit: AuditConfig,
        policy: &Policy,
        storage: Arc<dyn Storage>,
    ) -> Result<Stores, StoresError> {
        let dir = dir.as_ref();
        let audit = FileAuditLog::open_with(audit)?;
        if let Some(recovery) = audit.recovered() {
            tracing::warn!(?recovery, "repaired a torn audit tail left by a crash");
        }
        let effects = EffectStore::open_with_storage(
            crate::ledger_effect_config(dir, policy),
            Arc::clone(&storage),
        )?;
        Ok(Stores {
            audit: Arc::new(audit),
            effects: Arc::new(effects),
            kill_switch: KillSwitch::on_storage(dir, storage),
            rights: None,
            entities: None,
            rates: None,
            pending: None,
        })
    }

    /// Every store in the PostgreSQL database at `url`
    /// (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`), shared by every replica on it: the
    /// audit chain (signing a checkpoint every `checkpoints.1` records with `checkpoints.0` when
    /// given), the exactly-once store (the policy's windows), the kill switch, the rights, the
    /// Cedar entities, the rate-limit buckets and the pending confirmations. Each creates or migrates its tables; a
    /// database that cannot be reached, refuses the credentials or has a newer schema is an error
    /// naming it (see `docs/postgres.md`); without the feature `postgres` it is [`StoresError::NoDatabaseSupport`].
    pub fn database(
        url: &str,
        policy: &Policy,
        checkpoints: Option<(toolgate_canon::HmacKey, u64)>,
    ) -> Result<Stores, StoresError> {
        Database::connect(url)?.stores(policy, checkpoints)
    }

    /// As [`Stores::database`], on a database the caller has connected.
    #[cfg(feature = "postgres")]
    pub fn on_database(
        store: toolgate_postgres::PgStore,
        policy: &Policy,
        checkpoints: Option<(toolgate_canon::HmacKey, u64)>,
    ) -> Result<Stores, StoresError> {
        use toolgate_postgres::{PgEntities, PgHalts, PgPending, PgRates, PgRights};
        let audit = toolgate_postgres::PgAuditLog::open(store.clone())?;
        let audit = match checkpoints {
            Some((key, every)) => audit.with_checkpoints(key, every),
            None => audit,
        };
        let effects = toolgate_postgres::PgEffects::open(
            store.clone(),
            &crate::ledger_effect_config(&std::path::PathBuf::new(), policy),
        )?;
        Ok(Stores {
            audit: Arc::new(audit),
            effects: Arc::new(effects),
            kill_switch: KillSwitch::with_store(Arc::new(PgHalts::open(store.clone())?)),
            rights: Some(RightsFile::with_store(Arc::new(PgRights::open(
                store.clone(),
            )?))),
            entities: Some(EntitiesFile::with_store(Arc::new(PgEntities::open(
                store.clone(),
            )?))),
            rates: Some(Arc::new(PgRates::open(store.clone())?)),
            pending: Some(Arc::new(PgPending::open(store)?)),
        })
    }
}

/// A PostgreSQL database to keep stores in, connected once and opened store by store: all of them
/// for a server ([`Database::stores`]), one for an operator command (its audit chain, kill switch,
/// rights or Cedar entities). Without the feature `postgres`, [`Database::connect`] refuses
/// ([`StoresError::NoDatabaseSupport`]) and there is no value of this type.
#[derive(Debug, Clone)]
pub struct Database {
    #[cfg(feature = "postgres")]
    store: toolgate_postgres::PgStore,
    #[cfg(not(feature = "postgres"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "postgres")]
impl Database {
    /// Connects to the database at `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`,
    /// `sslmode`, `sslrootcert`; docs/postgres.md).
    pub fn connect(url: &str) -> Result<Database, StoresError> {
        Ok(Database {
            store: toolgate_postgres::PgStore::connect(url)?,
        })
    }

    /// The database's name as messages show it (`user@host:port/db`, never a password).
    pub fn name(&self) -> &str {
        self.store.database()
    }

    /// Every store in this database ([`Stores::database`]).
    pub fn stores(
        &self,
        policy: &Policy,
        checkpoints: Option<(toolgate_canon::HmacKey, u64)>,
    ) -> Result<Stores, StoresError> {
        Stores::on_database(self.store.clone(), policy, checkpoints)
    }

    /// The audit chain alone (an operator command's), signing as [`Stores::database`] says.
    pub fn audit(
        &self,
        checkpoints: Option<(toolgate_canon::HmacKey, u64)>,
    ) -> Result<Arc<dyn AuditSink>, StoresError> {
        let audit = toolgate_postgres::PgAuditLog::open(self.store.clone())?;
        Ok(Arc::new(match checkpoints {
            Some((key, every)) => audit.with_checkpoints(key, every),
            None => audit,
        }))
    }

    /// The kill switch alone.
    pub fn kill_switch(&self) -> Result<KillSwitch, StoresError> {
        let halts = toolgate_postgres::PgHalts::open(self.store.clone())?;
        Ok(KillSwitch::with_store(Arc::new(halts)))
    }

    /// The rights alone (to set or show them).
    pub fn rights(&self) -> Result<RightsFile, StoresError> {
        let rights = toolgate_postgres::PgRights::open(self.store.clone())?;
        Ok(RightsFile::with_store(Arc::new(rights)))
    }

    /// The Cedar entities alone (to set or show them).
    pub fn entities(&self) -> Result<EntitiesFile, StoresError> {
        let entities = toolgate_postgres::PgEntities::open(self.store.clone())?;
        Ok(EntitiesFile::with_store(Arc::new(entities)))
    }
}

#[cfg(not(feature = "postgres"))]
impl Database {
    /// Refuses: this build has no PostgreSQL support.
    pub fn connect(_url: &str) -> Result<Database, StoresError> {
        Err(StoresError::NoDatabaseSupport)
    }

    /// Unreachable: there is no database without the feature `postgres`.
    pub fn name(&self) -> &str {
        match self.never {}
    }

    /// Unreachable: there is no database without the feature `postgres`.
    pub fn stores(
        &self,
        _: &Policy,
        _: Option<(toolgate_canon::HmacKey, u64)>,
    ) -> Result<Stores, StoresError> {
        match self.never {}
    }

    /// Unreachable: there is no database without the feature `postgres`.
    pub fn audit(
        &self,
        _: Option<(toolgate_canon::HmacKey, u64)>,
    ) -> Result<Arc<dyn AuditSink>, StoresError> {
        match self.never {}
    }

    /// Unreachable: there is no database without the feature `postgres`.
    pub fn kill_switch(&self) -> Result<KillSwitch, StoresError> {
        match self.never {}
    }

    /// Unreachable: there is no database without the feature `postgres`.
    pub fn rights(&self) -> Result<RightsFile, StoresError> {
        match self.never {}
    }

    /// Unreachable: there is no database without the feature `postgres`.
    pub fn entities(&self) -> Result<EntitiesFile, StoresError> {
        match self.never {}
    }
}
