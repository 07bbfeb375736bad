//! `toolgate-server`: the thin reference server composing every toolgate crate over stdio.
//!
//! The binary's `main` parses the command line and calls into this library: [`serve_stdio`] for
//! the MCP server, [`build_proxy`] for the proxy and [`demo::run`] for the end-to-end demo; the
//! operator's commands are the facade's (`toolgate::operator::Command`).
//! Nothing here writes to stdout while serving: stdout carries protocol messages only.

#![forbid(unsafe_code)]

#[cfg(feature = "cedar")]
pub mod cedar;
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
use toolgate::audit::{AuditConfig, AuditSink};
use toolgate::contract::attest::{Attestation, HmacSha256Signer, check_expected_digest};
use toolgate::contract::diff::diff;
use toolgate::contract::lockfile::Lockfile;
use toolgate::effect::EffectBackend;
use toolgate::policy::Policy;
use toolgate::{Gated, StdioConfig, StdioTransport};

/// The binary's name, used in messages that name an operator command.
pub const SERVER_NAME: &str = "toolgate-server";
/// The audit log's file name inside the ledger directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
/// The notes directory's name inside the ledger directory.
pub const NOTES_DIR: &str = "notes";
/// The exactly-once effect store's directory inside the ledger.
const EFFECTS_DIR: &str = "effects";
/// The reference policy, shipped as `fixtures/policy.json`. The crate carries its own copy (a
/// published crate cannot reach outside its directory); `tests/tidy.rs` keeps the two identical.
pub const REFERENCE_POLICY: &str = include_str!("reference-policy.json");

/// Where the server keeps its state, which policy it enforces, and what contract it must have.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The policy, the ledger and the stores, shared with the operator commands
    /// (`toolgate::operator::GateArgs`: `--policy`, `--ledger`, `--store`, the audit key ...).
    pub gate: GateArgs,
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
}

use toolgate::GatedBuilderExt as _;
use toolgate::operator::GateArgs;
/// The stores behind a server (`toolgate::stores`): its audit chain, exactly-once records and
/// kill switch, and with `--store` the rights, rate buckets and pending confirmations every
/// replica shares.
pub use toolgate::stores::Stores;

/// Opens the stores of `options` as the operator commands do
/// (`toolgate::operator::GateArgs::open_stores`), the ledger's audit log opened with `audit`
/// (the serving path adds its fault hook).
fn open_stores_with(
    options: &ServerOptions,
    policy: &Policy,
    audit: AuditConfig,
) -> anyhow::Result<Stores> {
    Ok(options.gate.open_stores(SERVER_NAME, policy, audit)?)
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
    if options.gate.principal.is_some() {
        anyhow::bail!(
            "over HTTP each request's principal is the one its API token names: leave out --principal / TOOLGATE_PRINCIPAL and create a token per principal with `{SERVER_NAME} token create --principal NAME`"
        );
    }
    build_gate(options, true)
}

fn build_gate(options: &ServerOptions, per_request: bool) -> anyhow::Result<BuiltServer> {
    if let Some(principal) = &options.gate.principal
        && !toolgate::canon::names::is_principal_name(principal)
    {
        anyhow::bail!(
            "invalid principal {principal:?}: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-' (--principal or TOOLGATE_PRINCIPAL)"
        );
    }
    let policy = load_policy(&options.gate.policy)?;
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
    let storage = options.gate.storage();

    let notes = notes::Notes::open(options.gate.ledger.join(NOTES_DIR), Arc::clone(&storage))
        .with_context(|| format!("cannot open the notes in {}", options.gate.ledger.display()))?;
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
                .gate
                .principal
                .clone()
                .unwrap_or_else(|| "local".to_owned()),
        )
    };
    let gated = match &options.gate.rights {
        Some(path) => gated.rights(toolgate::checks::RightsFile::new(path)),
        None => gated,
    };
    let gated = match &options.gate.entities {
        Some(path) => gated.entities(toolgate::checks::EntitiesFile::new(path)),
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
    if options.gate.store.is_some() {
        let stores = open_stores_with(options, policy, options.gate.audit_config()?)?;
        check_ledger_layout(&options.gate.ledger)?;
        // The file stores create the ledger; with the database's, the notes need it.
        toolgate::storage::create_dir_durably(
            options.gate.storage().as_ref(),
            &options.gate.ledger,
        )
        .with_context(|| format!("cannot create the ledger {}", options.gate.ledger.display()))?;
        return tidy_ledger(options).map(|()| stores);
    }
    check_ledger_layout(&options.gate.ledger)?;
    let audit_config = options.gate.audit_config()?;
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
    toolgate::storage::remove_orphaned_temps(
        options.gate.storage().as_ref(),
        &options.gate.ledger,
        false,
    )
    .with_context(|| format!("cannot tidy the ledger {}", options.gate.ledger.display()))?;
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
    if let Some(principal) = &options.gate.principal
        && !toolgate::canon::names::is_principal_name(principal)
    {
        anyhow::bail!(
            "invalid principal {principal:?}: use {} (--principal or TOOLGATE_PRINCIPAL)",
            toolgate::canon::names::PRINCIPAL_GRAMMAR
        );
    }
    let policy = load_policy(&options.gate.policy)?;
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
    match load_policy(&options.gate.policy) {
        Ok(policy) => Ok(handle.install(toolgate::Reload {
            policy,
            contract: None,
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
        let policy = load_policy(&options.gate.policy)?;
        let live = contract::live_lockfile(&policy)?;
        check_contract(options, &live)
            .context("the new policy changes the attested tool contract")?;
        Ok(toolgate::Reload {
            policy,
            contract: Some(live),
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
    let tokens = toolgate::http::tokens::ApiTokens::new(&options.gate.ledger)
        .with_storage(options.gate.storage());
    let door = config.front_door(local, tokens)?;
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
