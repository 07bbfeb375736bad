//! `toolgate-server`: the thin reference server composing every toolgate crate over stdio.
//!
//! The binary's `main` parses the command line and calls into this library: [`serve_stdio`] for
//! the MCP server, [`verify_ledger`] for `audit verify`, and [`demo::run`] for the end-to-end demo.
//! Nothing here writes to stdout while serving: stdout carries protocol messages only.

#![forbid(unsafe_code)]

pub mod contract;
#[cfg(feature = "demo")]
pub mod demo;
#[cfg(feature = "fault-injection")]
mod fault;
pub mod notes;
pub mod proxy;
#[cfg(feature = "otel")]
pub mod telemetry;
pub mod tools;

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::ServiceExt as _;
use toolgate::audit::{AuditConfig, AuditSink, FileAuditLog, VerifyOptions, VerifyReport};
use toolgate::contract::attest::{Attestation, HmacSha256Signer, check_expected_digest};
use toolgate::contract::diff::diff;
use toolgate::contract::lockfile::Lockfile;
use toolgate::effect::{EffectBackend, EffectStore};
use toolgate::policy::Policy;
use toolgate::{Gated, StdioConfig, StdioTransport};

/// The binary's name, used in messages that name an operator command.
pub const SERVER_NAME: &str = "toolgate-server";
/// The audit log's file name inside the ledger directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
/// The notes directory's name inside the ledger directory.
pub const NOTES_DIR: &str = "notes";
/// The reference policy, shipped as `fixtures/policy.json`. The crate carries its own copy (a
/// published crate cannot reach outside its directory); `tests/tidy.rs` keeps the two identical.
pub const REFERENCE_POLICY: &str = include_str!("reference-policy.json");

/// Where the server keeps its state, which policy it enforces, and what contract it must have.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The policy file, loaded once at start.
    pub policy: PathBuf,
    /// The ledger directory: `audit.jsonl` and `notes/`.
    pub ledger: PathBuf,
    /// The contract digest the server must have (`sha256:<hex>` or `<hex>`); it refuses to start
    /// otherwise.
    pub expect_digest: Option<String>,
    /// An attestation of the contract digest (`hmac-sha256:<digest>:<signature>`); the server
    /// refuses to start unless it verifies with the key and matches the live digest.
    pub attestation: Option<String>,
    /// The file holding the attestation key (at least 32 bytes).
    pub attestation_key_file: Option<PathBuf>,
    /// A previous toolgate.lock: refused calls then say what changed in the tool's contract since.
    pub previous_lock: Option<PathBuf>,
    /// The audit checkpoint key file (at least 32 bytes). Without it no checkpoints are written.
    pub audit_key_file: Option<PathBuf>,
    /// Write a checkpoint every this many records (default 1000 when a key is given).
    pub checkpoint_every: Option<u64>,
    /// A second checkpoint file (another volume or mount) that receives every checkpoint too.
    pub checkpoint_mirror: Option<PathBuf>,
    /// Rotate the audit log into a new segment past this many bytes.
    pub segment_bytes: Option<u64>,
    /// Who is calling (keys of exactly-once tools are scoped to it). Default `local`.
    pub principal: Option<String>,
    /// The rights file (`--rights`, `TOOLGATE_RIGHTS_FILE`); without it only the policy decides.
    pub rights: Option<PathBuf>,
    /// A PostgreSQL database (`--store`, `TOOLGATE_STORE`: `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`)
    /// that holds the exactly-once store, the audit chain, the kill switch, the rights, rate
    /// limits and pending confirmations instead of the
    /// ledger's files, shared by every replica on the same database. The ledger directory keeps
    /// the notes. Needs the feature `postgres` (on by default). TLS from the URL's `sslmode` and
    /// `sslrootcert` (docs/postgres.md).
    pub store: Option<String>,
    /// The storage every store of the ledger writes through (default: the real filesystem).
    /// Tests pass a `toolgate::storage::FaultyStorage` to count the syncs of a call or fail one.
    pub storage: Option<Arc<dyn toolgate::storage::Storage>>,
    /// The most requests read and not yet answered on the stdio connection (`--max-in-flight`,
    /// `TOOLGATE_MAX_IN_FLIGHT`); past it the server stops reading stdin until one is answered.
    /// Default [`toolgate::stdio::DEFAULT_MAX_IN_FLIGHT`].
    pub max_in_flight: Option<NonZeroUsize>,
    /// The longest stdin line accepted, in bytes (`--max-line-bytes`, `TOOLGATE_MAX_LINE_BYTES`);
    /// a longer one is refused with an error reply and discarded while it is read. Default
    /// [`toolgate::stdio::DEFAULT_MAX_LINE_BYTES`].
    pub max_line_bytes: Option<NonZeroUsize>,
}

impl ServerOptions {
    /// The limits of the stdio transport.
    pub fn stdio_config(&self) -> StdioConfig {
        let config = StdioConfig::new();
        let config = match self.max_in_flight {
            Some(n) => config.max_in_flight(n),
            None => config,
        };
        match self.max_line_bytes {
            Some(n) => config.max_line_bytes(n),
            None => config,
        }
    }

    /// The storage of the ledger's stores.
    fn storage(&self) -> Arc<dyn toolgate::storage::Storage> {
        self.storage
            .clone()
            .unwrap_or_else(|| Arc::new(toolgate::storage::FsStorage))
    }
}

/// The exactly-once effect store's directory inside the ledger.
pub const EFFECTS_DIR: &str = "effects";

/// Opens the exactly-once effect store of `ledger` as the library's ledger layout does
/// (`toolgate::ledger_effect_config`).
pub fn open_effects(
    ledger: &Path,
    policy: &Policy,
    storage: Arc<dyn toolgate::storage::Storage>,
) -> anyhow::Result<EffectStore> {
    EffectStore::open_with_storage(toolgate::ledger_effect_config(ledger, policy), storage)
        .with_context(|| format!("cannot open the effect store in {}", ledger.display()))
}

/// The stores behind a server (`toolgate::stores`): its audit chain, exactly-once records and
/// kill switch, and with `--store` the rights, rate buckets and pending confirmations every
/// replica shares.
pub use toolgate::stores::Stores;
use toolgate::stores::{Database, GatedBuilderStores as _};

/// Opens the stores of `options`: the PostgreSQL database of `store` when it is given, else the
/// ledger's files (the audit log configured like the operator commands'). The database is
/// reached (and its schema migrated) before anything is written under the ledger, so a bad URL,
/// a refused password or a newer schema stops the server first.
pub fn open_stores(options: &ServerOptions, policy: &Policy) -> anyhow::Result<Stores> {
    open_stores_with(options, policy, audit_config(options)?)
}

/// As [`open_stores`], the ledger's audit log opened with `audit` (the serving path adds its
/// fault hook).
fn open_stores_with(
    options: &ServerOptions,
    policy: &Policy,
    audit: AuditConfig,
) -> anyhow::Result<Stores> {
    let stores = match &options.store {
        Some(url) => open_database_stores(options, url, policy)?,
        None => Stores::ledger_on(&options.ledger, audit, policy, options.storage())
            .with_context(|| format!("cannot open the ledger {}", options.ledger.display()))?,
    };
    Ok(Stores {
        kill_switch: stores
            .kill_switch
            .resume_command(format!("{SERVER_NAME} resume")),
        ..stores
    })
}

fn open_database_stores(
    options: &ServerOptions,
    url: &str,
    policy: &Policy,
) -> anyhow::Result<Stores> {
    if let Some(path) = &options.rights {
        anyhow::bail!(
            "the rights of replicas on a store are kept in the database, not in {}: load it once with `{SERVER_NAME} --store URL rights set {}` and leave out --rights / TOOLGATE_RIGHTS_FILE",
            path.display(),
            path.display()
        );
    }
    let database = connect_store(options, url)?;
    let stores = database
        .stores(policy, checkpoints(options)?)
        .with_context(|| format!("cannot open the stores in {}", database.name()))?;
    tracing::info!(database = database.name(), "stores on PostgreSQL");
    Ok(stores)
}

/// The checkpoint key of `--audit-key-file` and how often it signs (`--checkpoint-every`).
fn checkpoints(options: &ServerOptions) -> anyhow::Result<Option<(toolgate::canon::HmacKey, u64)>> {
    let Some(path) = &options.audit_key_file else {
        return Ok(None);
    };
    let every = options
        .checkpoint_every
        .unwrap_or(toolgate::audit::DEFAULT_CHECKPOINT_EVERY);
    Ok(Some((toolgate::operator::load_key(path)?, every)))
}

/// Connects to the database of `--store`, refusing options the database chain does not support.
fn connect_store(options: &ServerOptions, url: &str) -> anyhow::Result<Database> {
    if options.checkpoint_mirror.is_some() || options.segment_bytes.is_some() {
        anyhow::bail!(
            "a checkpoint mirror and segments (--checkpoint-mirror, --segment-bytes) are options of the ledger's audit file, not of a PostgreSQL store; leave them out with --store (signed checkpoints, --audit-key-file, are kept in the database)"
        );
    }
    Database::connect(url).context("cannot open the store given with --store or TOOLGATE_STORE")
}

/// The audit chain in the database of `--store`, signing checkpoints with `--audit-key-file`
/// (every `--checkpoint-every` records, and at clean shutdown) when it is given.
fn database_audit(options: &ServerOptions, url: &str) -> anyhow::Result<Arc<dyn AuditSink>> {
    let database = connect_store(options, url)?;
    database
        .audit(checkpoints(options)?)
        .with_context(|| format!("cannot open the audit chain in {}", database.name()))
}

/// What SIGHUP does to a running server: re-read the policy (and whatever goes with it) and
/// install it, or refuse and keep the old one.
pub type ReloadFn =
    fn(&ServerOptions, &toolgate::PolicyHandle) -> anyhow::Result<toolgate::Reloaded>;

/// A built server: the gate, and the stores it writes (kept to sync and checkpoint them at
/// shutdown).
#[derive(Debug)]
pub struct BuiltServer<H = tools::NotesServer> {
    /// The gated handler, ready to serve.
    pub gated: Gated<H>,
    /// The audit chain behind the gate.
    pub audit: Arc<dyn AuditSink>,
    /// The exactly-once store behind the gate (synced at shutdown: idempotent outcomes are only
    /// written when stored).
    pub effects: Arc<dyn EffectBackend>,
    /// What the server was started with (a SIGHUP reload re-reads `policy` and re-checks the
    /// contract against `expect_digest` / `attestation`).
    pub options: ServerOptions,
    /// The SIGHUP reload ([`reload_policy`] for the reference server).
    pub reload: ReloadFn,
    /// What ends the server with an error while it serves (the proxy's upstream, once it cannot
    /// be restarted); `None` for the reference server.
    pub watchdog: Option<Watchdog>,
}

type BoxedFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// What stops a server while it serves, and what it closes when it stops.
pub struct Watchdog {
    stop: BoxedFuture<anyhow::Error>,
    close: BoxedFuture<()>,
}

impl Watchdog {
    /// Watches `stop`: when it resolves, the server drains its requests in flight and stops with
    /// that error. `close` runs when the server stops, either way (before the stores are synced).
    pub fn new(
        stop: impl Future<Output = anyhow::Error> + Send + 'static,
        close: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Watchdog {
            stop: Box::pin(stop),
            close: Box::pin(close),
        }
    }
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watchdog")
    }
}

/// The gated handler, ready to serve.
pub type GatedServer = Gated<tools::NotesServer>;

/// Loads the policy file.
pub fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    Ok(Policy::load(path)?)
}

/// Checks the live contract against the expected digest and the attestation, if given. Runs
/// before the ledger is opened, so a server that refuses to start writes nothing.
fn check_contract(options: &ServerOptions, live: &Lockfile) -> anyhow::Result<()> {
    check_contract_digest(
        options,
        live.integrity_digest(),
        "the live tool contract is not the expected one; refusing to start (run `toolgate-server contract digest` to see the live digest)",
    )
}

/// Checks `digest` (a server's contract digest: the live lockfile's, or a proxy's upstream pin's)
/// against `--expect-digest` and `--attestation`; `mismatch` says what differs and how to see it.
fn check_contract_digest(
    options: &ServerOptions,
    digest: toolgate::canon::Sha256Digest,
    mismatch: &'static str,
) -> anyhow::Result<()> {
    if let Some(expected) = &options.expect_digest {
        check_expected_digest(expected, digest).context(mismatch)?;
    }
    match (&options.attestation, &options.attestation_key_file) {
        (Some(text), Some(key_file)) => {
            let signer = HmacSha256Signer::from_key_file(key_file)?;
            Attestation::parse(text)?
                .verify(&signer, digest)
                .context("the contract attestation does not verify; refusing to start")?;
        }
        (Some(_), None) => anyhow::bail!(
            "an attestation was given without a key; pass --attestation-key-file or TOOLGATE_ATTESTATION_KEY_FILE"
        ),
        (None, Some(_)) => anyhow::bail!(
            "an attestation key was given without an attestation; pass --attestation or TOOLGATE_ATTESTATION"
        ),
        (None, None) => {}
    }
    Ok(())
}

/// Loads the policy, checks the contract, then opens the ledger, then builds the gate.
///
/// The order is deliberate: an invalid policy or a contract that does not match its attestation
/// must stop the process before anything is created or written under the ledger directory.
pub fn build(options: &ServerOptions) -> anyhow::Result<BuiltServer> {
    build_gate(options, false)
}

/// As [`build`], for Streamable HTTP: each request's principal is the one its API token
/// authenticates (`toolgate::FromExtensions`), never `--principal`.
#[cfg(feature = "http")]
pub fn build_for_http(options: &ServerOptions) -> anyhow::Result<BuiltServer> {
    if options.principal.is_some() {
        anyhow::bail!(
            "over HTTP each request's principal is the one its API token names: leave out --principal / TOOLGATE_PRINCIPAL and create a token per principal with `{SERVER_NAME} token create --principal NAME`"
        );
    }
    build_gate(options, true)
}

fn build_gate(options: &ServerOptions, per_request: bool) -> anyhow::Result<BuiltServer> {
    if let Some(principal) = &options.principal
        && !toolgate::canon::names::is_principal_name(principal)
    {
        anyhow::bail!(
            "invalid principal {principal:?}: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-' (--principal or TOOLGATE_PRINCIPAL)"
        );
    }
    let policy = load_policy(&options.policy)?;
    let live = contract::live_lockfile(&policy)?;
    check_contract(options, &live)?;
    let changes = match &options.previous_lock {
        Some(path) => {
            let text = toolgate::storage::read_regular_text(
                path,
                toolgate::contract::MAX_LOCKFILE_BYTES,
                toolgate::storage::Symlinks::Follow,
            )
            .and_then(|text| text.ok_or_else(|| std::io::ErrorKind::NotFound.into()))
            .with_context(|| format!("cannot read the previous lockfile {}", path.display()))?;
            let previous = Lockfile::parse(&text)
                .with_context(|| format!("the previous lockfile {} is invalid", path.display()))?;
            diff(previous.contract(), live.contract())
        }
        None => Vec::new(),
    };

    #[cfg(feature = "fault-injection")]
    let hook = fault::hook_from_env()?;
    #[cfg(feature = "fault-injection")]
    let stores = server_stores(options, &policy, hook.as_ref())?;
    #[cfg(not(feature = "fault-injection"))]
    let stores = server_stores(options, &policy)?;
    let storage = options.storage();

    let notes = notes::Notes::open(options.ledger.join(NOTES_DIR), Arc::clone(&storage))
        .with_context(|| format!("cannot open the notes in {}", options.ledger.display()))?;
    #[cfg(feature = "fault-injection")]
    let notes = match hook {
        Some(hook) => notes.with_hook(hook),
        None => notes,
    };

    tracing::info!(digest = %live.integrity_digest(), "contract");
    let gated = Gated::builder(tools::NotesServer::new(Arc::new(notes)))
        .preflight(Arc::new(tools::NotesPreflight))
        .contract(&live)
        .contract_changes(changes);
    finish_gate(gated, policy, stores, options, per_request, reload_policy)
}

/// Completes `gated` with `policy`, the stores, the principal source (the configured principal,
/// or each request's verified one when `per_request`), the kill switch, the database's checks and
/// the rights, as `options` say.
fn finish_gate<H: rmcp::ServerHandler>(
    gated: toolgate::GatedBuilder<H>,
    policy: Policy,
    stores: Stores,
    options: &ServerOptions,
    per_request: bool,
    reload: ReloadFn,
) -> anyhow::Result<BuiltServer<H>> {
    let (audit, effects) = (Arc::clone(&stores.audit), Arc::clone(&stores.effects));
    let gated = gated.policy(policy).stores(stores).server_name(SERVER_NAME);
    let gated = if per_request {
        gated.principal_source(toolgate::FromExtensions)
    } else {
        gated.principal(
            options
                .principal
                .clone()
                .unwrap_or_else(|| "local".to_owned()),
        )
    };
    let gated = match &options.rights {
        Some(path) => gated.rights(toolgate::checks::RightsFile::new(path)),
        None => gated,
    };
    let gated = gated.build()?;
    Ok(BuiltServer {
        gated,
        audit,
        effects,
        options: options.clone(),
        reload,
        watchdog: None,
    })
}

/// Opens the stores a server writes (the database's with `--store`, else the ledger's files),
/// after checking the ledger's layout, and tidies the temporary files dead writers left.
fn server_stores(
    options: &ServerOptions,
    policy: &Policy,
    #[cfg(feature = "fault-injection")] hook: Option<&toolgate::audit::FaultHook>,
) -> anyhow::Result<Stores> {
    // The stores first: a database that cannot be used stops the server before the ledger is
    // touched.
    if options.store.is_some() {
        let stores = open_stores(options, policy)?;
        check_ledger_layout(&options.ledger)?;
        // The file stores create the ledger; with the database's, the notes need it.
        toolgate::storage::create_dir_durably(options.storage().as_ref(), &options.ledger)
            .with_context(|| format!("cannot create the ledger {}", options.ledger.display()))?;
        return tidy_ledger(options).map(|()| stores);
    }
    check_ledger_layout(&options.ledger)?;
    let audit_config = audit_config(options)?;
    #[cfg(feature = "fault-injection")]
    let audit_config = match hook {
        Some(hook) => audit_config.fault_hook(hook.clone()),
        None => audit_config,
    };
    let stores = open_stores_with(options, policy, audit_config)?;
    tidy_ledger(options).map(|()| stores)
}

/// Removes the temporary files that writers in the ledger directory (the kill switch, torn-tail
/// evidence) left when their process died mid-write; a live writer's are kept.
fn tidy_ledger(options: &ServerOptions) -> anyhow::Result<()> {
    toolgate::storage::remove_orphaned_temps(options.storage().as_ref(), &options.ledger, false)
        .with_context(|| format!("cannot tidy the ledger {}", options.ledger.display()))?;
    Ok(())
}

/// Refuses a ledger whose `notes/` or `effects/` is a link or not a directory: the layout has no
/// links, and following one would put the notes or the exactly-once journal outside the ledger.
/// (The ledger directory itself may be a link: the operator chose its path. Files inside these
/// directories are opened without following links by the stores themselves.)
fn check_ledger_layout(ledger: &Path) -> anyhow::Result<()> {
    for dir in [NOTES_DIR, EFFECTS_DIR] {
        let path = ledger.join(dir);
        toolgate::storage::check_real_dir(&path).with_context(|| {
            format!(
                "{} must be a directory inside the ledger, not a link or a file; move it aside \
                 and restart",
                path.display()
            )
        })?;
    }
    Ok(())
}

/// How `proxy` treats an upstream whose tools differ from its pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDrift {
    /// Serve, hiding and refusing every tool that is not exactly as pinned (the default).
    #[default]
    Hide,
    /// Do not start.
    RefuseStart,
}

/// What `proxy` starts and against which pin.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The upstream's command line and how it is run.
    pub upstream: proxy::UpstreamOptions,
    /// The upstream pin (`proxy lock` writes it).
    pub lock: PathBuf,
    /// What drift does.
    pub on_drift: OnDrift,
}

/// `proxy lock`: starts the upstream, pins its tools in `config.lock` (durably: temporary file,
/// fsync, rename, directory fsync) and stops it. Returns the pin.
pub async fn lock_upstream(
    config: &ProxyConfig,
) -> anyhow::Result<toolgate::contract::upstream::UpstreamPin> {
    let connection = proxy::connect(&config.upstream, &Arc::default()).await?;
    let pin = proxy::live_pin(&connection).await;
    connection.close().await;
    let (pin, _) = pin?;
    let text = pin.render(env!("CARGO_PKG_VERSION"));
    let (dir, name) = split_path(&config.lock)?;
    toolgate::storage::replace_file(&toolgate::storage::FsStorage, &dir, &name, text.as_bytes())
        .with_context(|| format!("cannot write the upstream pin {}", config.lock.display()))?;
    Ok(pin)
}

/// The directory and file name of `path` (the directory `.` for a bare name).
fn split_path(path: &Path) -> anyhow::Result<(PathBuf, String)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} names no file", path.display()))?
        .to_owned();
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

/// `proxy`: the gate in front of the upstream of `config`, over the stores of `options`. The pin
/// is read first and compared with the live list before the ledger is touched; every difference
/// is logged and audited as `proxy/drift`, and either hides the tools concerned or, with
/// [`OnDrift::RefuseStart`], stops the start.
pub async fn build_proxy(
    options: &ServerOptions,
    config: &ProxyConfig,
) -> anyhow::Result<BuiltServer<proxy::Upstream>> {
    if let Some(principal) = &options.principal
        && !toolgate::canon::names::is_principal_name(principal)
    {
        anyhow::bail!(
            "invalid principal {principal:?}: use {} (--principal or TOOLGATE_PRINCIPAL)",
            toolgate::canon::names::PRINCIPAL_GRAMMAR
        );
    }
    let policy = load_policy(&options.policy)?;
    let pin = proxy::read_pin(&config.lock)?;
    // The pin is the proxy's contract: `--expect-digest` and `--attestation` are checked against
    // its digest (the pin file's `integrityDigest`) before the upstream is even started.
    check_contract_digest(
        options,
        pin.digest(),
        "the upstream pin is not the expected one; refusing to start (its digest is the pin file's upstream.integrityDigest)",
    )?;
    let pinned_digests: std::collections::BTreeMap<String, toolgate::canon::Sha256Digest> = pin
        .tools()
        .iter()
        .map(|(name, tool)| (name.clone(), tool.digest()))
        .collect();
    let pin_digest = pin.digest();
    let host = Arc::new(proxy::Host::default());
    let connection = proxy::connect(&config.upstream, &host).await?;
    let (live, tools) = match proxy::live_pin(&connection).await {
        Ok(live) => live,
        Err(error) => {
            connection.close().await;
            return Err(error);
        }
    };
    let changes = pin.compare(&live);
    if config.on_drift == OnDrift::RefuseStart && !changes.is_empty() {
        connection.close().await;
        let list: Vec<String> = changes.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "the upstream differs from its pin {}: {}; review the change and pin it again with `{SERVER_NAME} proxy lock --lock {} -- CMD ARGS…`",
            config.lock.display(),
            list.join("; "),
            config.lock.display()
        );
    }
    #[cfg(feature = "fault-injection")]
    let stores = server_stores(options, &policy, None)?;
    #[cfg(not(feature = "fault-injection"))]
    let stores = server_stores(options, &policy)?;
    // The first observation records the drift found at start.
    let audit = Arc::clone(&stores.audit);
    let drift = Arc::new(proxy::Drift::new(pin, Arc::clone(&audit)));
    drift
        .observe_and_record((live.server_name(), live.server_version()), &tools)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    host.watch_drift(Arc::clone(&drift));
    let link = Arc::new(proxy::Link::new(
        config.upstream.clone(),
        Arc::clone(&host),
        connection,
    ));
    let upstream = proxy::Upstream::new(Arc::clone(&link), Arc::clone(&drift));
    let mut server = finish_gate(
        Gated::builder(upstream)
            .unavailable_tools(Arc::clone(&drift) as Arc<dyn toolgate::UnavailableTools>)
            .contract_digests(pin_digest, pinned_digests),
        policy,
        stores,
        options,
        false,
        reload_policy_only,
    )?;
    // The upstream's requests to the host and its results are decided by the policy in force.
    host.govern(server.gated.policy_handle(), Arc::clone(&audit));
    let closing = Arc::clone(&link);
    server.watchdog = Some(Watchdog::new(
        proxy::supervise(link, drift, audit),
        async move { closing.close().await },
    ));
    Ok(server)
}

/// The proxy's SIGHUP reload: the policy alone (the upstream's contract is its pin's business).
fn reload_policy_only(
    options: &ServerOptions,
    handle: &toolgate::PolicyHandle,
) -> anyhow::Result<toolgate::Reloaded> {
    match load_policy(&options.policy) {
        Ok(policy) => Ok(handle.install(toolgate::Reload {
            policy,
            contract_digest: None,
            tool_contract_digests: None,
        })?),
        Err(error) => {
            handle.record_rejected(&format!("{error:#}"));
            Err(error)
        }
    }
}

/// Re-reads the policy file and installs it in the running gate: the file is parsed completely
/// first, and the new live contract must still satisfy `--expect-digest` / `--attestation` when
/// those were given. On any error the old policy stays in force and the refusal is audited; on
/// success both digests are audited.
pub fn reload_policy(
    options: &ServerOptions,
    handle: &toolgate::PolicyHandle,
) -> anyhow::Result<toolgate::Reloaded> {
    let prepared = (|| -> anyhow::Result<toolgate::Reload> {
        let policy = load_policy(&options.policy)?;
        let live = contract::live_lockfile(&policy)?;
        check_contract(options, &live)
            .context("the new policy changes the attested tool contract")?;
        Ok(toolgate::Reload {
            policy,
            contract_digest: Some(live.integrity_digest()),
            tool_contract_digests: Some(
                live.contract()
                    .tools
                    .iter()
                    .map(|(name, contract)| (name.clone(), contract.digest()))
                    .collect(),
            ),
        })
    })();
    match prepared {
        Ok(reload) => Ok(handle.install(reload)?),
        Err(error) => {
            handle.record_rejected(&format!("{error:#}"));
            Err(error)
        }
    }
}

/// Reloads the policy on every SIGHUP until the process ends.
fn spawn_reload_on_sighup(
    options: ServerOptions,
    handle: toolgate::PolicyHandle,
    reload: ReloadFn,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let options = options.clone();
            let handle = handle.clone();
            let outcome = tokio::task::spawn_blocking(move || reload(&options, &handle)).await;
            match outcome {
                Ok(Ok(reloaded)) => {
                    tracing::info!(old = %reloaded.old, new = %reloaded.new, "policy reloaded on SIGHUP");
                }
                Ok(Err(error)) => {
                    tracing::error!(
                        "policy reload refused, the old policy stays in force: {error:#}"
                    );
                }
                Err(error) => tracing::error!(%error, "the policy reload task failed"),
            }
        }
    });
    Ok(())
}

/// How long a server stopped by its [`Watchdog`] waits for the answers of the requests in flight.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves MCP over stdin/stdout until the client closes the connection (or the server's
/// [`Watchdog`] stops it); SIGHUP reloads the policy.
pub async fn serve_stdio<H>(server: BuiltServer<H>) -> anyhow::Result<()>
where
    H: rmcp::ServerHandler + Send + Sync + 'static,
{
    let BuiltServer {
        gated,
        audit,
        effects,
        options,
        reload,
        watchdog,
    } = server;
    let stdio = options.stdio_config();
    spawn_reload_on_sighup(options, gated.policy_handle(), reload)?;
    // When stdin and stdout are pipes (as MCP clients launch servers, and as the stdio bench does)
    // they are read and written on the runtime's own thread through tokio's reactor: no blocking
    // thread parked in a read of stdin, no hand-off per message. Anything else (a file, a
    // terminal, a socket) falls back to tokio's blocking handles, as `rmcp::transport::stdio`
    // uses. Over either, toolgate's `StdioTransport` frames the lines: every line it cannot
    // serve gets an error reply and a warning, a line is bounded, and so are the requests in
    // flight (past the limit stdin is not read, so a pipelining client blocks in its writes).
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    tracing::debug!(
        max_in_flight = stdio.in_flight_limit(),
        max_line_bytes = stdio.line_limit(),
        "serving stdio"
    );
    let transport = StdioTransport::with_config(stdin, stdout, stdio);
    let in_flight = transport.in_flight();
    let session = match gated.serve(transport).await {
        Ok(running) => {
            let stop = running.cancellation_token();
            let waiting = running.waiting();
            tokio::pin!(waiting);
            let (stop_when, close) = match watchdog {
                Some(Watchdog { stop, close }) => (Some(stop), Some(close)),
                None => (None, None),
            };
            let watchdog = async {
                match stop_when {
                    Some(stop) => stop.await,
                    None => std::future::pending().await,
                }
            };
            let ended = tokio::select! {
                ended = &mut waiting => ended.map(|_| ()).context("the MCP session ended abnormally"),
                error = watchdog => {
                    // Every request read is answered (and written) before the session ends.
                    if tokio::time::timeout(DRAIN_TIMEOUT, in_flight.settled()).await.is_err() {
                        tracing::warn!("requests were still in flight after {DRAIN_TIMEOUT:?}; stopping anyway");
                    }
                    stop.cancel();
                    let _ = waiting.await;
                    Err(error)
                }
            };
            if let Some(close) = close {
                close.await;
            }
            ended
        }
        // A client that connects and leaves before its first request is not a server failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => Ok(()),
        Err(error) => Err(error).context("the MCP session could not start"),
    };
    shut_down(effects, audit).await?;
    session
}

/// Clean shutdown: makes the idempotent outcomes durable, then seals what was appended with a
/// checkpoint (when a key is configured).
async fn shut_down(
    effects: Arc<dyn EffectBackend>,
    audit: Arc<dyn AuditSink>,
) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || effects.sync())
        .await
        .context("the shutdown sync task failed")?
        .context("cannot make the effect store durable at shutdown")?;
    let checkpoint = tokio::task::spawn_blocking(move || audit.checkpoint())
        .await
        .context("the shutdown checkpoint task failed")?;
    if let Some(checkpoint) = checkpoint.context("cannot write the shutdown audit checkpoint")? {
        tracing::info!(count = checkpoint.count, "audit checkpoint at shutdown");
    }
    Ok(())
}

/// Serves `server` over Streamable HTTP at `http://ADDR/mcp` until SIGINT or SIGTERM, every
/// request authenticated by an API token of the ledger (`docs/http.md`). Says where it listens on
/// stderr (`serving Streamable HTTP at http://HOST:PORT/mcp`, the port resolved when `ADDR`
/// asks for port 0).
#[cfg(feature = "http")]
pub async fn serve_http(
    server: BuiltServer,
    config: toolgate::http::HttpConfig,
) -> anyhow::Result<()> {
    let BuiltServer {
        gated,
        audit,
        effects,
        options,
        reload,
        watchdog: _,
    } = server;
    spawn_reload_on_sighup(options.clone(), gated.policy_handle(), reload)?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.addr))?;
    let local = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let door = config.front_door(local, api_tokens(&options))?;
    let router = toolgate::http::router(gated, door.auth, Arc::clone(&audit), &door.options);
    let resource = door.resource;
    // The one line a supervisor (or a test) reads to find the port.
    tracing::info!(%resource, "serving Streamable HTTP");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{SERVER_NAME}: serving Streamable HTTP at {resource}");
    }
    toolgate::http::serve_connections(listener, router, config.header_read_timeout).await;
    shut_down(effects, audit).await
}

/// The serving runtime's blocking threads: the stores' writes and fsyncs run there, so this bounds
/// how many calls can wait on the disk at once. Enough for concurrent callers to fill the audit
/// log's and the effect journal's group commits (concurrent fsyncs also share the filesystem's
/// journal commits); threads start on demand, so a sequential client uses one or two, and all of
/// them allocate from the one heap above. `benches/calls.rs` measures the concurrent rate.
pub const BLOCKING_THREADS: usize = 16;

/// The API tokens of the ledger, written through the configured storage.
#[cfg(feature = "http")]
fn api_tokens(options: &ServerOptions) -> toolgate::http::tokens::ApiTokens {
    toolgate::http::tokens::ApiTokens::new(&options.ledger).with_storage(options.storage())
}

/// Creates an API token as `spec` says and records `admin/token` with its id (never the
/// token). Returns the token, to show once.
#[cfg(feature = "http")]
pub fn create_token(
    options: &ServerOptions,
    spec: &toolgate::http::tokens::TokenSpec,
) -> anyhow::Result<toolgate::http::tokens::NewToken> {
    let audit = operator_audit(options)?;
    let tokens = api_tokens(options);
    let created = tokens.create(spec, std::time::SystemTime::now())?;
    let reason = format!("created token {} for {}", created.info.id, spec.principal);
    record_token_change(&audit, &created.info.id, reason)?;
    Ok(created)
}

/// Revokes the API token `id` from the next request on, and records it.
#[cfg(feature = "http")]
pub fn revoke_token(
    options: &ServerOptions,
    id: &str,
) -> anyhow::Result<toolgate::http::tokens::TokenInfo> {
    let audit = operator_audit(options)?;
    let tokens = api_tokens(options);
    let revoked = tokens.revoke(id, std::time::SystemTime::now())?;
    let reason = format!("revoked token {id} of {}", revoked.principal);
    record_token_change(&audit, id, reason)?;
    Ok(revoked)
}

/// The API tokens of the ledger, oldest first.
#[cfg(feature = "http")]
pub fn list_tokens(
    options: &ServerOptions,
) -> anyhow::Result<Vec<toolgate::http::tokens::TokenInfo>> {
    Ok(api_tokens(options).list()?)
}

#[cfg(feature = "http")]
fn record_token_change(audit: &Arc<dyn AuditSink>, id: &str, reason: String) -> anyhow::Result<()> {
    let mut entry = toolgate::audit::AuditEntry::tool_call(
        "operator",
        "tokens",
        toolgate::audit::AuditDecision::Allow,
        toolgate::audit::Outcome::Reloaded,
        toolgate::canon::Sha256Digest::of(id.as_bytes()),
    )
    .with_reason(toolgate::audit::Reason::Note(reason));
    entry.method = "admin/token".to_owned();
    audit
        .append(&entry)
        .context("the token change took place but could not be audited")?;
    audit.checkpoint()?;
    Ok(())
}

/// Verifies `LEDGER_DIR/audit.jsonl` (and its rotated segments) with the ledger options the
/// server writes it with: with `audit_key_file` its checkpoints, and with `checkpoint_mirror` the
/// agreement of the checkpoint file and the mirror (see `VerifyOptions::checkpoint_mirror`).
///
/// With `store` (`--store`), verifies the database's chain in place instead
/// (`toolgate::audit::verify_sink`: the chain must reach the head the database records).
pub fn verify_ledger(options: &ServerOptions) -> anyhow::Result<VerifyReport> {
    if let Some(url) = &options.store {
        if options.checkpoint_mirror.is_some() {
            anyhow::bail!(
                "a PostgreSQL store keeps its checkpoints in the database, without a mirror file: leave out --checkpoint-mirror"
            );
        }
        let key = options
            .audit_key_file
            .as_deref()
            .map(toolgate::operator::load_key)
            .transpose()?;
        let audit = database_audit(
            &ServerOptions {
                audit_key_file: None,
                ..options.clone()
            },
            url,
        )?;
        return Ok(toolgate::audit::verify_sink_with(
            audit.as_ref(),
            key.as_ref(),
        )?);
    }
    let path = options.ledger.join(AUDIT_FILE);
    if !path.exists() {
        anyhow::bail!(
            "no audit log at {}; pass the ledger directory with --ledger or LEDGER_DIR",
            path.display()
        );
    }
    let mut verify = VerifyOptions::new(&path);
    if let Some(key_file) = &options.audit_key_file {
        verify = verify.checkpoint_key(toolgate::operator::load_key(key_file)?);
    }
    if let Some(mirror) = &options.checkpoint_mirror {
        verify = verify.checkpoint_mirror(mirror);
    }
    Ok(toolgate::audit::verify(&verify)?)
}

/// Writes the audit chain of the database of `store` (`--store`) to `out` in the file format
/// (`audit.jsonl`); returns how many records it wrote.
pub fn export_store(options: &ServerOptions, out: &mut dyn std::io::Write) -> anyhow::Result<u64> {
    let Some(url) = &options.store else {
        anyhow::bail!(
            "audit export reads the chain of a PostgreSQL store: pass --store or TOOLGATE_STORE (a ledger's audit log is already in the file format: copy {} and its segments)",
            options.ledger.join(AUDIT_FILE).display()
        );
    };
    let audit = database_audit(options, url)?;
    let records = audit.export(out)?;
    out.flush().context("cannot write the export to stdout")?;
    Ok(records)
}

/// `audit stats`: the counts of the chain the server writes, the database's with `store`
/// (`--store`), else `LEDGER_DIR/audit.jsonl` and its segments.
pub fn audit_stats(options: &ServerOptions) -> anyhow::Result<toolgate::audit::stats::LogStats> {
    match &options.store {
        Some(url) => {
            let audit = database_audit(options, url)?;
            Ok(toolgate::audit::stats::LogStats::of_sink(audit.as_ref())?)
        }
        None => Ok(toolgate::audit::stats::LogStats::of_log(
            &options.ledger.join(AUDIT_FILE),
        )?),
    }
}

/// The ledger's audit log configuration, the same for the server and its operator commands: a
/// command that appends with the key but without the mirror would leave checkpoints in the
/// ledger's checkpoint file that the mirror lacks.
fn audit_config(options: &ServerOptions) -> anyhow::Result<AuditConfig> {
    let mut audit_config =
        AuditConfig::new(options.ledger.join(AUDIT_FILE)).storage(options.storage());
    if let Some(path) = &options.audit_key_file {
        audit_config = audit_config.checkpoint_key(toolgate::operator::load_key(path)?);
    }
    if let Some(every) = options.checkpoint_every {
        audit_config = audit_config.checkpoint_every(every);
    }
    if let Some(mirror) = &options.checkpoint_mirror {
        audit_config = audit_config.checkpoint_mirror(mirror);
    }
    if let Some(bytes) = options.segment_bytes {
        audit_config = audit_config.segment_bytes(bytes);
    }
    Ok(audit_config)
}

/// Opens the ledger's audit log, configured like the server's.
fn file_audit(options: &ServerOptions) -> anyhow::Result<FileAuditLog> {
    FileAuditLog::open_with(audit_config(options)?)
        .with_context(|| format!("cannot open the audit log in {}", options.ledger.display()))
}

/// Opens the audit chain for an operator command: the store's when `--store` is given, else the
/// ledger's file, configured like the server's.
fn operator_audit(options: &ServerOptions) -> anyhow::Result<Arc<dyn AuditSink>> {
    match &options.store {
        Some(url) => database_audit(options, url),
        None => Ok(Arc::new(file_audit(options)?)),
    }
}

/// The kill switch of the operator commands: the database's with `--store`, else the ledger's
/// file, written through the configured storage.
fn ledger_switch(options: &ServerOptions) -> anyhow::Result<toolgate::checks::KillSwitch> {
    if let Some(url) = &options.store {
        let database = connect_store(options, url)?;
        let switch = database
            .kill_switch()
            .with_context(|| format!("cannot open the kill switch in {}", database.name()))?;
        return Ok(switch.resume_command(format!("{SERVER_NAME} resume")));
    }
    Ok(
        toolgate::checks::KillSwitch::on_storage(&options.ledger, options.storage())
            .resume_command(format!("{SERVER_NAME} resume")),
    )
}

/// Sets the kill switch of the ledger (every tools/call of every server on it is refused from its
/// next call on) and records it in the audit log. Returns the halt it replaced, if any.
///
/// With `tenant`, only that tenant's calls are refused (its principals' credentials name it).
pub fn halt(
    options: &ServerOptions,
    reason: &str,
    by: &str,
    tenant: Option<&str>,
) -> anyhow::Result<Option<toolgate::checks::Halt>> {
    let switch = switch_of(options, tenant)?;
    // A halt is what an operator reaches for in an incident: it is set even when the audit log
    // cannot be opened, and the error then says it was not recorded. (A resume, the less safe
    // direction, needs the audit log first.)
    let audit = match operator_audit(options) {
        Ok(audit) => audit,
        Err(error) => {
            switch.halt(reason, by)?;
            return Err(
                error.context("the halt is set, but it could not be recorded in the audit log")
            );
        }
    };
    let previous = toolgate::operator::halt(&switch, audit.as_ref(), reason, by)?;
    audit.checkpoint()?;
    Ok(previous)
}

/// The kill switch of the ledger, or of one tenant on it.
fn switch_of(
    options: &ServerOptions,
    tenant: Option<&str>,
) -> anyhow::Result<toolgate::checks::KillSwitch> {
    let switch = ledger_switch(options)?;
    Ok(match tenant {
        Some(tenant) => switch.for_tenant(tenant)?,
        None => switch,
    })
}

/// Lifts the kill switch (of `tenant`, or the one of everyone) and records it. Returns the halt
/// that was in force, if any.
pub fn resume(
    options: &ServerOptions,
    tenant: Option<&str>,
) -> anyhow::Result<Option<toolgate::checks::Halt>> {
    let audit = operator_audit(options)?;
    let lifted = toolgate::operator::resume(&switch_of(options, tenant)?, audit.as_ref())?;
    audit.checkpoint()?;
    Ok(lifted)
}

/// Why the operator's rights commands need `--store`.
fn rights_need_a_store() -> anyhow::Error {
    anyhow::anyhow!(
        "the rights of a server without --store are the file named by --rights (re-read on the next call): edit that file; `rights set` and `rights show` need --store or TOOLGATE_STORE"
    )
}

/// The rights in the database of `--store`, for the operator's rights commands.
fn database_rights(options: &ServerOptions) -> anyhow::Result<toolgate::checks::RightsFile> {
    let url = options.store.as_ref().ok_or_else(rights_need_a_store)?;
    let database = connect_store(options, url)?;
    database
        .rights()
        .with_context(|| format!("cannot open the rights in {}", database.name()))
}

/// Sets the rights of every replica on the database of `--store` to the rights file at `file`
/// (validated first), or clears them (`None`), and records it. Returns the digest now in force.
pub fn set_rights(
    options: &ServerOptions,
    file: Option<&Path>,
) -> anyhow::Result<Option<toolgate::canon::Sha256Digest>> {
    let rights = database_rights(options)?;
    let audit = operator_audit(options)?;
    Ok(toolgate::operator::set_rights(
        &rights,
        audit.as_ref(),
        file,
    )?)
}

/// The rights document in force on the database of `--store`, if one is set.
pub fn rights_document(options: &ServerOptions) -> anyhow::Result<Option<Vec<u8>>> {
    Ok(database_rights(options)?.document()?)
}

/// `effects resolve`: settles the indeterminate call of `options.principal` (default `local`) to
/// `tool` under `key` (or, without one, its `args_digest`): replayed as `completed` (a
/// `CallToolResult` as JSON) from now on, or forgotten when `completed` is `None`. Audited.
/// Returns what was done, for the operator.
pub fn resolve_effect(
    options: &ServerOptions,
    tool: &str,
    key: Option<&str>,
    args_digest: Option<&str>,
    completed: Option<&str>,
) -> anyhow::Result<String> {
    use toolgate::operator::EffectKey;
    let key = match (key, args_digest) {
        (Some(key), _) => EffectKey::given(key),
        (None, Some(hex)) => EffectKey::arguments(hex).with_context(|| {
            format!("--args-digest {hex:?} is not a SHA-256 digest: give the 64 lowercase hex digits of the call's args_digest in the audit log")
        })?,
        (None, None) => anyhow::bail!("give the call's --key, or --args-digest for a call without one"),
    };
    let resolution = match completed {
        Some(text) => {
            let result: rmcp::model::CallToolResult = serde_json::from_str(text).context(
                "--completed is not a CallToolResult: give JSON such as {\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}",
            )?;
            toolgate::effect::Resolution::Completed(serde_json::to_value(&result)?)
        }
        None => toolgate::effect::Resolution::Forget,
    };
    let forget = matches!(resolution, toolgate::effect::Resolution::Forget);
    let principal = options.principal.as_deref().unwrap_or("local");
    let policy = load_policy(&options.policy)?;
    let Stores { audit, effects, .. } = open_stores(options, &policy)?;
    toolgate::operator::resolve_effect(
        effects.as_ref(),
        audit.as_ref(),
        principal,
        tool,
        &key,
        resolution,
    )?;
    audit.checkpoint()?;
    Ok(if forget {
        format!("the call of {principal} to {tool} is forgotten: the next call with its key runs")
    } else {
        format!("the call of {principal} to {tool} is settled: later calls replay the given result")
    })
}

/// Removes completed exactly-once records older than their retention window, and records the
/// pruning in the audit log (pruning is explicit and audited). Returns how many were removed.
pub fn prune_effects(options: &ServerOptions) -> anyhow::Result<u64> {
    let policy = load_policy(&options.policy)?;
    let Stores { audit, effects, .. } = open_stores(options, &policy)?;
    let removed = toolgate::operator::prune_effects(
        effects.as_ref(),
        audit.as_ref(),
        std::time::SystemTime::now(),
    )?;
    audit.checkpoint()?;
    Ok(removed)
}
