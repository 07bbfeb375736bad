//! The PostgreSQL floor (feature `postgres`): what every store on PostgreSQL shares.
//!
//! - **One pool per store value**: [`PgStore::connect`] parses a `postgres://` URL, builds a
//!   connection pool (deadpool-postgres over tokio-postgres) and a small tokio runtime of its own
//!   that drives the connections. The stores' traits are synchronous and run on blocking threads;
//!   [`PgStore::run`] hands a future to that runtime and waits for its answer on a channel, so it
//!   works from any thread (an async executor's included: it never nests runtimes).
//! - **Versioned migrations per component** ([`PgStore::migrate`]): the table `toolgate_schema`
//!   holds one version per component (`effects`, `audit`, ...); migrations run in one transaction
//!   under a transaction-scoped advisory lock, so replicas starting together apply each once. A
//!   database whose version for a component is newer than this build knows is refused: a replica
//!   never runs against a schema it does not understand.
//! - **TLS through rustls** (the private `tls` module): `sslmode` (`disable`, `require`, `verify-ca`,
//!   `verify-full`) and `sslrootcert` of the URL; `verify-full` unless the host is loopback. A
//!   certificate that does not verify stops [`PgStore::connect`] with [`PgError::Tls`], before any
//!   statement runs.
//! - **Errors without credentials**: the URL is only ever shown as `user@host:port/db`.
//!
//! Durability: PostgreSQL's own (`fsync=on`, `synchronous_commit=on`). A store may lower
//! `synchronous_commit` for a transaction whose loss on a database crash is harmless (the effect
//! store does for idempotent effects, as the file journal defers their `fdatasync`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

mod tls;

pub use deadpool_postgres::{Object as PgClient, Pool as PgPool};
pub use tokio_postgres::types::ToSql as PgToSql;
pub use tokio_postgres::{Error as PgDriverError, Row as PgRow, Transaction as PgTransaction};

/// The most connections one store value opens.
const MAX_CONNECTIONS: usize = 16;
/// How long opening a connection may take before the call fails (closed).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The key of the advisory lock migrations run under (any constant shared by every replica).
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465; // "toolgate"

/// Why the PostgreSQL floor failed. Messages name the database as `user@host:port/db`, never a
/// password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The store URL does not parse.
    #[error(
        "the store URL is not a PostgreSQL URL ({reason}); write it as postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    )]
    Url {
        /// What is wrong with it.
        reason: String,
    },
    /// The database could not be reached or refused the connection (wrong password, no such
    /// database, server down).
    #[error(
        "cannot connect to PostgreSQL at {database}: {cause}; check that the server runs and accepts this user and password"
    )]
    Connect {
        /// The database, without credentials.
        database: String,
        /// The driver's or the pool's message.
        cause: String,
    },
    /// The trusted roots of `sslrootcert` (or the operating system's) cannot be used.
    #[error(
        "cannot use {roots} as the trusted roots of the PostgreSQL store: {reason}; give sslrootcert=PATH of a PEM file holding the CA certificate(s) that sign the server's certificate"
    )]
    RootCert {
        /// The roots (`sslrootcert=PATH`, or the operating system's).
        roots: String,
        /// What is wrong with them.
        reason: String,
    },
    /// The TLS connection to the server was refused under the URL's `sslmode`: the server's
    /// certificate does not verify (wrong CA, wrong host name, expired), or the server offers no
    /// TLS. Nothing was sent to the server but the TLS handshake.
    #[error("refused the PostgreSQL server at {database} under sslmode={sslmode}: {reason}")]
    Tls {
        /// The database, without credentials.
        database: String,
        /// The `sslmode` in force (given or defaulted).
        sslmode: &'static str,
        /// Why, and what to do.
        reason: String,
    },
    /// A statement or transaction failed.
    #[error("PostgreSQL at {database} failed to {what}: {cause}")]
    Query {
        /// The database, without credentials.
        database: String,
        /// What was being done (`claim an idempotency key`, `append an audit record`).
        what: &'static str,
        /// The driver's message.
        cause: String,
    },
    /// The database's schema for a component is newer than this build.
    #[error(
        "the PostgreSQL schema of {component} at {database} is at version {found}, newer than this build knows ({known}); run a toolgate version that knows it, never an older one against a migrated database"
    )]
    SchemaTooNew {
        /// The database, without credentials.
        database: String,
        /// The component (`effects`, `audit`).
        component: &'static str,
        /// The version found.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// The store's runtime stopped (the process is shutting down).
    #[error("the PostgreSQL store of {database} is shut down; the call was not executed")]
    ShutDown {
        /// The database, without credentials.
        database: String,
    },
}

/// A connection pool to one database, with the runtime that drives it. Cheap to clone (shared).
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Option<tokio::runtime::Runtime>,
    pool: PgPool,
    config: tokio_postgres::Config,
    tls: tls::PgTls,
    database: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping a runtime blocks; inside an async context that panics. Nothing is pending once
        // the last store value is gone, so let its threads go in the background.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &self.inner.database)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database of `url` (`postgres://user:password@host:port/db`, or the
    /// key=value form tokio-postgres accepts) and checks that a connection opens, so a wrong
    /// password, an unreachable server or a certificate that does not verify fails here, at
    /// start-up, naming the cause. `sslmode` and `sslrootcert` choose the TLS (module docs).
    pub fn connect(url: &str) -> Result<PgStore, PgError> {
        let tls::Parsed { config, tls } = tls::parse(url)?;
        let database = describe(&config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("toolgate-postgres")
            .enable_all()
            .build()
            .map_err(|e| PgError::Connect {
                database: database.clone(),
                cause: format!("cannot start the driver's runtime: {e}"),
            })?;
        let mut config = config;
        config.connect_timeout(CONNECT_TIMEOUT);
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tls.clone(),
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(MAX_CONNECTIONS)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| PgError::Connect {
                database: database.clone(),
                cause: e.to_string(),
            })?;
        let store = PgStore {
            inner: Arc::new(Inner {
                runtime: Some(runtime),
                pool,
                config,
                tls,
                database,
            }),
        };
        let mode = store.inner.tls.mode();
        store.run(move |pool, database| async move {
            let client = pool.get().await.map_err(|e| match e {
                deadpool_postgres::PoolError::Backend(e) => {
                    connect_error(database.clone(), Some(mode), &e)
                }
                other => PgError::Connect {
                    database: database.clone(),
                    cause: other.to_string(),
                },
            })?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| connect_error(database, Some(mode), &e))?;
            Ok(())
        })??;
        Ok(store)
    }

    /// The database as errors name it: `user@host:port/db`, no password.
    pub fn database(&self) -> &str {
        &self.inner.database
    }

    /// Runs `job` on the store's runtime with the pool and the database's name, and waits for its
    /// result. Callable from any thread; the calling thread blocks until the job finishes.
    pub fn run<T, F, Fut>(&self, job: F) -> Result<T, PgError>
    where
        F: FnOnce(PgPool, String) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let shut_down = || PgError::ShutDown {
            database: self.inner.database.clone(),
        };
        let runtime = self.inner.runtime.as_ref().ok_or_else(shut_down)?;
        let future = job(self.inner.pool.clone(), self.inner.database.clone());
        let (tx, rx) = mpsc::sync_channel(1);
        runtime.spawn(async move {
            // The receiver is gone only if the caller's thread died; nothing to tell then.
            let _ = tx.send(future.await);
        });
        rx.recv().map_err(|_| shut_down())
    }

    /// Opens a connection of its own, outside the pool, for state that lives as long as a
    /// session does (a session-level advisory lock: the effect store's liveness of this process).
    pub fn session(&self) -> Result<PgSession, PgError> {
        let config = self.inner.config.clone();
        let tls = self.inner.tls.clone();
        let runtime = self
            .inner
            .runtime
            .as_ref()
            .ok_or_else(|| PgError::ShutDown {
                database: self.inner.database.clone(),
            })?;
        let handle = runtime.handle().clone();
        self.run(move |_, database| async move {
            let mode = tls.mode();
            let (client, connection) = config
                .connect(tls)
                .await
                .map_err(|e| connect_error(database, Some(mode), &e))?;
            // The connection's task ends when the client is dropped or the server goes away;
            // `PgSession::is_closed` tells the owner.
            handle.spawn(connection);
            Ok(PgSession {
                client: Arc::new(client),
            })
        })?
    }

    /// Brings `component`'s schema to `migrations.len()`: applies `migrations[v..]` (each a batch
    /// of SQL statements) in one transaction, under an advisory lock every replica takes, where
    /// `v` is the version recorded in `toolgate_schema`. Returns the version now in force.
    pub fn migrate(
        &self,
        component: &'static str,
        migrations: &'static [&'static str],
    ) -> Result<i32, PgError> {
        let known = i32::try_from(migrations.len()).unwrap_or(i32::MAX);
        self.run(move |pool, database| async move {
            let query = |what| query_error(&database, what);
            let mut client = get(&pool, &database).await?;
            let tx = client
                .transaction()
                .await
                .map_err(query("start a migration"))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(query("lock the schema for a migration"))?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS toolgate_schema (
                     component text PRIMARY KEY,
                     version integer NOT NULL
                 )",
            )
            .await
            .map_err(query("create the schema version table"))?;
            let found: i32 = tx
                .query_opt(
                    "SELECT version FROM toolgate_schema WHERE component = $1",
                    &[&component],
                )
                .await
                .map_err(query("read the schema version"))?
                .map(|row| row.get(0))
                .unwrap_or(0);
            if found > known {
                return Err(PgError::SchemaTooNew {
                    database,
                    component,
                    found,
                    known,
                });
            }
            for migration in &migrations[usize::try_from(found).unwrap_or(0)..] {
                tx.batch_execute(migration)
                    .await
                    .map_err(query("apply a schema migration"))?;
            }
            tx.execute(
                "INSERT INTO toolgate_schema (component, version) VALUES ($1, $2)
                 ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
                &[&component, &known],
            )
            .await
            .map_err(query("record the schema version"))?;
            tx.commit().await.map_err(query("commit a migration"))?;
            Ok(known)
        })?
    }
}

/// A connection outside the pool ([`PgStore::session`]).
#[derive(Clone)]
pub struct PgSession {
    /// The connection; use it inside [`PgStore::run`].
    pub client: Arc<tokio_postgres::Client>,
}

impl fmt::Debug for PgSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSession")
            .field("closed", &self.client.is_closed())
            .finish()
    }
}

impl PgSession {
    /// Whether the connection is gone (server restarted, network cut): open a new one.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// A connection from the pool, or `Connect` (`Tls`) naming why there is none.
pub async fn get(pool: &PgPool, database: &str) -> Result<PgClient, PgError> {
    pool.get().await.map_err(|e| match e {
        deadpool_postgres::PoolError::Backend(e) => connect_error(database.to_owned(), None, &e),
        other => PgError::Connect {
            database: database.to_owned(),
            cause: other.to_string(),
        },
    })
}

/// A failed connection as [`PgError::Tls`] when TLS refused it, else [`PgError::Connect`].
/// `mode` is the store's `sslmode` where the caller knows it (a server that declines TLS is
/// named as such only then).
fn connect_error(
    database: String,
    mode: Option<tls::SslMode>,
    e: &tokio_postgres::Error,
) -> PgError {
    match tls_refusal(e, mode) {
        Some((mode, reason)) => PgError::Tls {
            database,
            sslmode: mode.name(),
            reason,
        },
        None => PgError::Connect {
            database,
            cause: cause(e),
        },
    }
}

/// Why the TLS of a connection failed, if it did: the connector's explanation, or the driver's
/// when the server answered the TLS request with "no".
fn tls_refusal(
    e: &tokio_postgres::Error,
    mode: Option<tls::SslMode>,
) -> Option<(tls::SslMode, String)> {
    let source = std::error::Error::source(e)?;
    if let Some(refused) = source.downcast_ref::<tls::Refused>() {
        return Some((refused.mode, refused.reason.clone()));
    }
    // tokio-postgres's own words for a server that declined the TLS request.
    let mode = mode.filter(|_| source.to_string() == "server does not support TLS")?;
    Some((
        mode,
        "the server does not offer TLS; turn `ssl` on in its configuration (or, on a network you trust, write sslmode=disable)".to_owned(),
    ))
}

/// The mapping of a failed statement to [`PgError::Query`], naming the database (without
/// credentials) and what was being done: `.map_err(query_error(&database, "read the head"))`.
pub fn query_error(database: &str, what: &'static str) -> impl Fn(PgDriverError) -> PgError {
    let database = database.to_owned();
    move |e| PgError::Query {
        database: database.clone(),
        what,
        cause: cause(&e),
    }
}

/// The driver's message with its source (the server's text for a database error).
pub fn cause(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

/// `user@host:port/db` from a parsed configuration (never the password).
fn describe(config: &tokio_postgres::Config) -> String {
    let user = config.get_user().unwrap_or("(default user)");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;

    use super::*;

    #[test]
    fn a_malformed_url_is_named_without_its_password() {
        let err = PgStore::connect("postgres://alice:s3cret@127.0.0.1:notaport/db").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, PgError::Url { .. }), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("postgres://USER"), "{text}");
    }

    #[test]
    fn the_database_is_described_without_credentials() {
        let config =
            tokio_postgres::Config::from_str("postgres://alice:s3cret@db.local:6543/ledger")
                .unwrap();
        assert_eq!(describe(&config), "alice@db.local:6543/ledger");
    }
}
