//! [`GateArgs`]: where a gated server's state is and how its audit chain is written, the options
//! its serving path and every operator command share, so that a command opens exactly the stores
//! the server writes (a command that appended with the key but without the mirror would leave
//! checkpoints the mirror lacks).

use std::path::PathBuf;
use std::sync::Arc;

use toolgate_audit::{AuditConfig, AuditSink, FileAuditLog, VerifyOptions, VerifyReport};
use toolgate_canon::HmacKey;
use toolgate_policy::Policy;
use toolgate_state::{EntitiesFile, KillSwitch, RightsFile};
use toolgate_storage::Storage;

use super::OperatorError;
use crate::stores::{Database, Stores};

/// The default policy file when neither `--policy` nor `POLICY_PATH` is given.
pub const DEFAULT_POLICY: &str = "./policy.json";
/// The default ledger directory when neither `--ledger` nor `LEDGER_DIR` is given.
pub const DEFAULT_LEDGER: &str = "./.ledger";

/// The audit log's file name inside the ledger directory.
const AUDIT_FILE: &str = crate::LEDGER_AUDIT_FILE;

/// Where a gated server keeps its state, which policy it enforces and how its audit chain is
/// written: the global options of its command line (`--policy`, `--ledger`, `--store`, ...; each
/// may stand anywhere on the line), shared by serving and every operator command.
/// [`GatedBuilderExt::gate_args`](crate::GatedBuilderExt::gate_args) serves with them.
#[derive(Debug, Clone, clap::Args)]
pub struct GateArgs {
    /// The policy file, loaded once at start.
    #[arg(long, env = "POLICY_PATH", default_value = DEFAULT_POLICY, global = true)]
    pub policy: PathBuf,
    /// The ledger directory (the audit log, the exactly-once store, the kill switch).
    #[arg(long, env = "LEDGER_DIR", default_value = DEFAULT_LEDGER, global = true)]
    pub ledger: PathBuf,
    /// The audit checkpoint key file (at least 32 bytes, kept outside the ledger).
    #[arg(long, env = "TOOLGATE_AUDIT_KEY_FILE", global = true)]
    pub audit_key_file: Option<PathBuf>,
    /// Write an audit checkpoint every this many records (default 1000 with a key).
    #[arg(long, env = "TOOLGATE_AUDIT_CHECKPOINT_EVERY", global = true)]
    pub checkpoint_every: Option<u64>,
    /// A second file (another volume) that receives every audit checkpoint too.
    #[arg(long, env = "TOOLGATE_AUDIT_CHECKPOINT_MIRROR", global = true)]
    pub checkpoint_mirror: Option<PathBuf>,
    /// Rotate the audit log into a new segment past this many bytes.
    #[arg(long, env = "TOOLGATE_AUDIT_SEGMENT_BYTES", global = true)]
    pub segment_bytes: Option<u64>,
    /// Who is calling: exactly-once keys are scoped to it (default `local`).
    #[arg(long, env = "TOOLGATE_PRINCIPAL", global = true)]
    pub principal: Option<String>,
    /// The rights file: which tools each principal may call, re-read so that a revocation takes
    /// effect on the next call. Without it only the policy decides. With --store the rights are
    /// the database's (`rights set`).
    #[arg(long, env = "TOOLGATE_RIGHTS_FILE", global = true)]
    pub rights: Option<PathBuf>,
    /// The entities file: roles and attributes of principals for the policy's Cedar policies
    /// (`{"version":1,"principals":{"alice":{"roles":["admin"]}}}`), joined with what each
    /// caller's credential says, re-read so that a change takes effect on the next call. With
    /// --store the entities are the database's (`entities set`).
    #[arg(long, env = "TOOLGATE_ENTITIES_FILE", global = true)]
    pub entities: Option<PathBuf>,
    /// A PostgreSQL database for the exactly-once store, the audit chain, the kill switch, the
    /// rights, the Cedar entities, rate limits and pending confirmations, shared by every replica on it
    /// (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`); the ledger keeps the rest. The
    /// password is never logged. TLS: ?sslmode=verify-full&sslrootcert=CA.pem (verify-full is the
    /// default unless the host is loopback; docs/postgres.md). Needs the feature `postgres`.
    #[arg(long, env = "TOOLGATE_STORE", global = true, hide_env_values = true)]
    pub store: Option<String>,
    /// The storage every store of the ledger writes through (default: the real filesystem).
    /// Tests pass a `toolgate::storage::FaultyStorage` to count the syncs of a call or fail one.
    #[arg(skip)]
    pub storage: Option<Arc<dyn Storage>>,
}

impl Default for GateArgs {
    /// The defaults of the command line, without reading the environment.
    fn default() -> Self {
        GateArgs {
            policy: DEFAULT_POLICY.into(),
            ledger: DEFAULT_LEDGER.into(),
            audit_key_file: None,
            checkpoint_every: None,
            checkpoint_mirror: None,
            segment_bytes: None,
            principal: None,
            rights: None,
            entities: None,
            store: None,
            storage: None,
        }
    }
}

/// `what` failed because of `cause`.
fn open_error(
    what: String,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> OperatorError {
    move |cause| OperatorError::Open { what, cause }
}

impl GateArgs {
    /// The storage of the ledger's stores.
    pub fn storage(&self) -> Arc<dyn Storage> {
        self.storage
            .clone()
            .unwrap_or_else(|| Arc::new(toolgate_storage::FsStorage))
    }

    /// The policy file, loaded.
    pub fn load_policy(&self) -> Result<Policy, OperatorError> {
        Ok(Policy::load(&self.policy)?)
    }

    /// The ledger's audit log configuration, the same for the server and its operator commands:
    /// the checkpoint key, interval and mirror, and the segment size.
    pub fn audit_config(&self) -> Result<AuditConfig, OperatorError> {
        let mut config = AuditConfig::new(self.ledger.join(AUDIT_FILE)).storage(self.storage());
        if let Some(path) = &self.audit_key_file {
            config = config.checkpoint_key(super::load_key(path)?);
        }
        if let Some(every) = self.checkpoint_every {
            config = config.checkpoint_every(every);
        }
        if let Some(mirror) = &self.checkpoint_mirror {
            config = config.checkpoint_mirror(mirror);
        }
        if let Some(bytes) = self.segment_bytes {
            config = config.segment_bytes(bytes);
        }
        Ok(config)
    }

    /// The checkpoint key of `--audit-key-file` and how often it signs (`--checkpoint-every`).
    fn checkpoints(&self) -> Result<Option<(HmacKey, u64)>, OperatorError> {
        let Some(path) = &self.audit_key_file else {
            return Ok(None);
        };
        let every = self
            .checkpoint_every
            .unwrap_or(toolgate_audit::DEFAULT_CHECKPOINT_EVERY);
        Ok(Some((super::load_key(path)?, every)))
    }

    /// The database of `--store`, if one is given, refusing the options the database's chain
    /// does not support.
    pub fn database(&self) -> Result<Option<Database>, OperatorError> {
        let Some(url) = &self.store else {
            return Ok(None);
        };
        if self.checkpoint_mirror.is_some() || self.segment_bytes.is_some() {
            return Err(OperatorError::Refused(
                "a checkpoint mirror and segments (--checkpoint-mirror, --segment-bytes) are options of the ledger's audit file, not of a PostgreSQL store; leave them out with --store (signed checkpoints, --audit-key-file, are kept in the database)".to_owned(),
            ));
        }
        Database::connect(url).map(Some).map_err(|cause| {
            open_error("cannot open the store given with --store or TOOLGATE_STORE".to_owned())(
                cause.into(),
            )
        })
    }

    /// Opens the stores of these options for `policy`: the PostgreSQL database of `--store` when
    /// it is given (reached, and its schema migrated, before anything is written under the
    /// ledger), else the ledger's files with the audit log of `audit` ([`GateArgs::audit_config`],
    /// or one the caller extended). The kill switch's refusals name `server_name resume`.
    pub fn open_stores(
        &self,
        server_name: &str,
        policy: &Policy,
        audit: AuditConfig,
    ) -> Result<Stores, OperatorError> {
        let stores = match self.database()? {
            Some(database) => {
                if let Some(path) = &self.rights {
                    return Err(OperatorError::Refused(format!(
                        "the rights of replicas on a store are kept in the database, not in {}: load it once with `{server_name} --store URL rights set {}` and leave out --rights / TOOLGATE_RIGHTS_FILE",
                        path.display(),
                        path.display()
                    )));
                }
                if let Some(path) = &self.entities {
                    return Err(OperatorError::Refused(format!(
                        "the Cedar entities of replicas on a store are kept in the database, not in {}: load it once with `{server_name} --store URL entities set {}` and leave out --entities / TOOLGATE_ENTITIES_FILE",
                        path.display(),
                        path.display()
                    )));
                }
                let stores = database
                    .stores(policy, self.checkpoints()?)
                    .map_err(|cause| {
                        open_error(format!("cannot open the stores in {}", database.name()))(
                            cause.into(),
                        )
                    })?;
                tracing::info!(database = database.name(), "stores on PostgreSQL");
                stores
            }
            None => {
                Stores::ledger_on(&self.ledger, audit, policy, self.storage()).map_err(|cause| {
                    open_error(format!("cannot open the ledger {}", self.ledger.display()))(
                        cause.into(),
                    )
                })?
            }
        };
        Ok(Stores {
            kill_switch: stores
                .kill_switch
                .resume_command(format!("{server_name} resume")),
            ..stores
        })
    }

    /// The audit chain an operator command records in: the database's with `--store` (signing
    /// checkpoints with `--audit-key-file`), else the ledger's file, configured like the server's.
    pub fn audit(&self) -> Result<Arc<dyn AuditSink>, OperatorError> {
        match self.database()? {
            Some(database) => database.audit(self.checkpoints()?).map_err(|cause| {
                open_error(format!(
                    "cannot open the audit chain in {}",
                    database.name()
                ))(cause.into())
            }),
            None => FileAuditLog::open_with(self.audit_config()?)
                .map(|log| Arc::new(log) as Arc<dyn AuditSink>)
                .map_err(|cause| {
                    open_error(format!(
                        "cannot open the audit log in {}",
                        self.ledger.display()
                    ))(cause.into())
                }),
        }
    }

    /// The kill switch (of `tenant`, or everyone's): the database's with `--store`, else the
    /// ledger's file. Its refusals name `server_name resume`.
    pub fn kill_switch(
        &self,
        server_name: &str,
        tenant: Option<&str>,
    ) -> Result<KillSwitch, OperatorError> {
        let switch = match self.database()? {
            Some(database) => database.kill_switch().map_err(|cause| {
                open_error(format!(
                    "cannot open the kill switch in {}",
                    database.name()
                ))(cause.into())
            })?,
            None => KillSwitch::on_storage(&self.ledger, self.storage()),
        };
        let switch = switch.resume_command(format!("{server_name} resume"));
        Ok(match tenant {
            Some(tenant) => switch.for_tenant(tenant)?,
            None => switch,
        })
    }

    /// The rights every replica on the database of `--store` shares.
    pub fn database_rights(&self) -> Result<RightsFile, OperatorError> {
        let Some(database) = self.database()? else {
            return Err(OperatorError::Refused(
                "the rights of a server without --store are the file named by --rights (re-read on the next call): edit that file; `rights set` and `rights show` need --store or TOOLGATE_STORE".to_owned(),
            ));
        };
        database.rights().map_err(|cause| {
            open_error(format!("cannot open the rights in {}", database.name()))(cause.into())
        })
    }

    /// The Cedar entities every replica on the database of `--store` shares.
    pub fn database_entities(&self) -> Result<EntitiesFile, OperatorError> {
        let Some(database) = self.database()? else {
            return Err(OperatorError::Refused(
                "the Cedar entities of a server without --store are the file named by --entities (re-read on the next call): edit that file; `entities set` and `entities show` need --store or TOOLGATE_STORE".to_owned(),
            ));
        };
        database.entities().map_err(|cause| {
            open_error(format!(
                "cannot open the Cedar entities in {}",
                database.name()
            ))(cause.into())
        })
    }

    /// Verifies the audit chain these options write: the ledger's `audit.jsonl` and its
    /// segments (with `--audit-key-file` its checkpoints, with `--checkpoint-mirror` the
    /// agreement of the checkpoint file and the mirror), or with `--store` the database's chain
    /// in place (it must reach the head the database records). `key_file` replaces
    /// `--audit-key-file`.
    pub fn verify(&self) -> Result<VerifyReport, OperatorError> {
        let key = self
            .audit_key_file
            .as_deref()
            .map(super::load_key)
            .transpose()?;
        if self.store.is_some() {
            if self.checkpoint_mirror.is_some() {
                return Err(OperatorError::Refused(
                    "a PostgreSQL store keeps its checkpoints in the database, without a mirror file: leave out --checkpoint-mirror".to_owned(),
                ));
            }
            let audit = GateArgs {
                audit_key_file: None,
                ..self.clone()
            }
            .audit()?;
            return toolgate_audit::verify_sink_with(audit.as_ref(), key.as_ref())
                .map_err(OperatorError::Chain);
        }
        let path = self.ledger.join(AUDIT_FILE);
        if !path.exists() {
            return Err(OperatorError::Refused(format!(
                "no audit log at {}; pass the ledger directory with --ledger or LEDGER_DIR",
                path.display()
            )));
        }
        let mut verify = VerifyOptions::new(&path);
        if let Some(key) = key {
            verify = verify.checkpoint_key(key);
        }
        if let Some(mirror) = &self.checkpoint_mirror {
            verify = verify.checkpoint_mirror(mirror);
        }
        toolgate_audit::verify(&verify).map_err(OperatorError::Chain)
    }

    /// The counts of the chain these options write: the database's with `--store`, else the
    /// ledger's `audit.jsonl` and its segments.
    pub fn stats(&self) -> Result<toolgate_audit::stats::LogStats, OperatorError> {
        match &self.store {
            Some(_) => toolgate_audit::stats::LogStats::of_sink(self.audit()?.as_ref()),
            None => toolgate_audit::stats::LogStats::of_log(&self.ledger.join(AUDIT_FILE)),
        }
        .map_err(OperatorError::Chain)
    }

    /// Writes the audit chain of the database of `--store` to `out` in the file format
    /// (`audit.jsonl`); returns how many records it wrote.
    pub fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, OperatorError> {
        if self.store.is_none() {
            return Err(OperatorError::Refused(format!(
                "audit export reads the chain of a PostgreSQL store: pass --store or TOOLGATE_STORE (a ledger's audit log is already in the file format: copy {} and its segments)",
                self.ledger.join(AUDIT_FILE).display()
            )));
        }
        let records = self.audit()?.export(out).map_err(OperatorError::Chain)?;
        out.flush().map_err(|cause| {
            open_error("cannot write the export to stdout".to_owned())(cause.into())
        })?;
        Ok(records)
    }
}
