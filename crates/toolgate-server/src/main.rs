//! The `toolgate-server` binary: MCP over stdio by default, plus `audit verify` and `demo`.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)] // Operator commands report on stdout (`say!`); the stdio server path never prints.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use toolgate::operator::GateArgs;
use toolgate_server::ServerOptions;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Prints one line of a command's report on stdout, and returns from the calling function when
/// it cannot be written: with exit 0 and nothing on stderr when the reader has gone (`| head`),
/// since the command is done and nobody is left to tell; with [`fail`]'s exit 2 otherwise.
macro_rules! say {
    ($($arg:tt)*) => {
        if let Err(error) = report(&format!("{}\n", format_args!($($arg)*))) {
            return report_failed(error);
        }
    };
}

/// Reference MCP server gated by toolgate. With no subcommand it serves MCP over stdio.
#[derive(Debug, Parser)]
#[command(name = "toolgate-server", version)]
struct Cli {
    /// The policy, the ledger, the stores and the audit chain's options, shared with the operator
    /// commands.
    #[command(flatten)]
    gate: GateArgs,
    /// Refuse to start unless the live contract digest is this one (`sha256:<hex>`).
    #[arg(long, env = "TOOLGATE_EXPECTED_DIGEST", global = true)]
    expect_digest: Option<String>,
    /// Refuse to start unless this attestation of the contract digest verifies and matches.
    #[arg(long, env = "TOOLGATE_ATTESTATION", global = true)]
    attestation: Option<String>,
    /// The attestation key file (at least 32 bytes; one trailing newline is ignored).
    #[arg(long, env = "TOOLGATE_ATTESTATION_KEY_FILE", global = true)]
    attestation_key_file: Option<PathBuf>,
    /// A previous toolgate.lock: refused calls then list what changed in the tool's contract.
    #[arg(long, env = "TOOLGATE_PREVIOUS_LOCK", global = true)]
    previous_lock: Option<PathBuf>,
    /// The most requests read from stdin and not yet answered (default 64); past it the server
    /// stops reading until one is answered, so a pipelining client waits in its writes.
    #[arg(long, env = "TOOLGATE_MAX_IN_FLIGHT", global = true)]
    max_in_flight: Option<NonZeroUsize>,
    /// The longest stdin line accepted, in bytes (default 4194304, 4 MiB); a longer one is refused
    /// with an error reply and discarded without being held in memory.
    #[arg(long, env = "TOOLGATE_MAX_LINE_BYTES", global = true)]
    max_line_bytes: Option<NonZeroUsize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP over stdio (the default), or over Streamable HTTP with --http.
    Serve {
        /// Serve Streamable HTTP at http://ADDR/mcp instead of stdio, every request
        /// authenticated by an API token (`token create`) or an OAuth access token
        /// (--oauth-issuer); port 0 picks a free port.
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
        #[command(flatten)]
        web: Box<HttpArgs>,
    },
    /// Gate an MCP server toolgate did not build: start it as a child over stdio and serve it
    /// to the host through the gate, its tools as pinned by `proxy lock` (docs/proxy.md).
    Proxy(ProxyArgs),
    /// Run the gated server end to end against a child process and print a transcript.
    #[cfg(feature = "demo")]
    Demo,
    /// The live tool contract of this binary under --policy.
    Contract {
        #[command(subcommand)]
        command: ContractCommand,
    },
    /// Cedar authorization (feature `cedar`).
    #[cfg(feature = "cedar")]
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// The operator's commands (`toolgate::operator::Command`).
    #[command(flatten)]
    Operator(toolgate::operator::Command),
}

#[cfg(feature = "cedar")]
#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Print the Cedar schema of this binary's tools (JSON), for editors: the entity model of
    /// docs/policy.md with one action per tool, its arguments typed from the tool's input schema.
    Schema,
    /// Run a table of requests against the policy (JSON and Cedar) and their expected
    /// decisions; exit 1 on a mismatch (docs/policy.md, "Testing policies").
    Test {
        /// The cases: `{"cases": [{"name", "request": {...}, "expect": "allow"|"deny"|"hidden",
        /// "policies": [...]}]}`.
        cases: std::path::PathBuf,
    },
    /// Print how the policy decides one request, with the rule and the Cedar policies that
    /// decided it.
    Explain {
        /// The tool called.
        tool: String,
        /// Its arguments, as a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
        /// The caller's identity key (`alice`, `acme/alice`).
        #[arg(long = "as", value_name = "PRINCIPAL", default_value = "local")]
        principal: String,
        /// The caller's tenant.
        #[arg(long = "as-tenant", value_name = "TENANT")]
        tenant: Option<String>,
        /// The channel: stdio or http.
        #[arg(long, default_value = "stdio")]
        channel: String,
        /// A scope of the caller (repeat for several).
        #[arg(long = "as-scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        /// `role=NAME` or `KEY=VALUE`, as `token create --attr` gives them.
        #[arg(long = "attr", value_name = "KEY=VALUE")]
        attributes: Vec<String>,
        /// The client's declared name.
        #[arg(long)]
        client: Option<String>,
        /// The time of the call, seconds since the Unix epoch (default: now).
        #[arg(long)]
        now: Option<i64>,
    },
}

#[cfg(feature = "cedar")]
fn policy_command(paths: &ServerOptions, command: PolicyCommand) -> ExitCode {
    match command {
        PolicyCommand::Schema => {
            let tools = toolgate_server::tools::NotesServer::tools();
            let schema = toolgate::contract::cedar_schema_of(&tools);
            say!("{:#}", schema);
            ExitCode::SUCCESS
        }
        PolicyCommand::Test { cases } => {
            match toolgate_server::cedar::test(&paths.gate.policy, &cases) {
                Ok((report, passed)) => {
                    say!("{report}");
                    if passed {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(error) => fail(&error),
            }
        }
        PolicyCommand::Explain {
            tool,
            arguments,
            principal,
            tenant,
            channel,
            scopes,
            attributes,
            client,
            now,
        } => {
            let request = (|| -> anyhow::Result<toolgate::policy::cedar::Request> {
                let arguments = serde_json::from_str(&arguments)
                    .map_err(|e| anyhow::anyhow!("the arguments are not a JSON object: {e}"))?;
                let mut who = toolgate::policy::cedar::Principal {
                    id: principal,
                    tenant,
                    channel: Some(channel),
                    scopes: scopes.into_iter().collect(),
                    ..Default::default()
                };
                for pair in attributes {
                    let (key, value) = pair
                        .split_once('=')
                        .ok_or_else(|| anyhow::anyhow!("--attr expects KEY=VALUE, got {pair:?}"))?;
                    if key == "role" {
                        who.roles.insert(value.to_owned());
                    } else {
                        who.attributes.insert(key.to_owned(), value.to_owned());
                    }
                }
                Ok(toolgate::policy::cedar::Request {
                    principal: who,
                    tool,
                    arguments,
                    now,
                    client,
                })
            })();
            match request.and_then(|request| {
                toolgate_server::cedar::explain_one(&paths.gate.policy, &request)
            }) {
                Ok(text) => {
                    say!("{text}");
                    ExitCode::SUCCESS
                }
                Err(error) => fail(&error),
            }
        }
    }
}

/// `proxy [--lock F] [--on-drift hide|refuse-start] -- CMD ARGS…` and `proxy lock`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct ProxyArgs {
    #[command(subcommand)]
    action: Option<ProxyAction>,
    /// The upstream pin written by `proxy lock`.
    #[arg(long, default_value = "toolgate-proxy.lock")]
    lock: PathBuf,
    /// What a tool that differs from its pin does: `hide` it (and refuse its calls) or
    /// `refuse-start`.
    #[arg(long, value_enum, default_value = "hide")]
    on_drift: DriftArg,
    /// How many times in a row the upstream is restarted when it ends (exits, crashes, breaks
    /// the protocol or hangs) before the proxy exits non-zero; 0 exits at the first end. The
    /// count starts again once an upstream stayed up for 60 seconds.
    #[arg(long, default_value_t = 3)]
    upstream_restarts: u32,
    /// The wait before the first restart in a row, in milliseconds; doubled for each further
    /// one, at most 30 seconds.
    #[arg(long, default_value_t = 500)]
    restart_backoff_ms: u64,
    #[command(flatten)]
    upstream: UpstreamArgs,
    /// The upstream's command line, after `--`.
    #[arg(last = true, required = true, value_name = "CMD ARGS")]
    command: Vec<String>,
}

/// How the upstream is spoken to (`proxy` and `proxy lock`).
#[derive(Debug, clap::Args)]
struct UpstreamArgs {
    /// How long the upstream may take to answer a request (and the handshake), in seconds. A
    /// call without an answer by then is cancelled upstream and is indeterminate; when a ping
    /// then gets no answer within as long either, the upstream is restarted.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    upstream_timeout: u64,
    /// The longest line the upstream may write, in bytes; a longer one ends the connection.
    #[arg(long, default_value_t = toolgate::upstream::DEFAULT_UPSTREAM_MAX_LINE_BYTES, value_parser = parse_line_limit)]
    upstream_max_line_bytes: usize,
    /// The largest tool result of the upstream forwarded to the host, in bytes of JSON; a larger
    /// one is an error to the host.
    #[arg(long, default_value_t = toolgate_server::proxy::DEFAULT_MAX_RESULT_BYTES, value_parser = parse_line_limit)]
    upstream_max_result_bytes: usize,
}

impl UpstreamArgs {
    fn options(
        &self,
        command: Vec<String>,
        restarts: u32,
        backoff_ms: u64,
    ) -> toolgate_server::proxy::UpstreamOptions {
        toolgate_server::proxy::UpstreamOptions {
            command,
            max_line_bytes: self.upstream_max_line_bytes,
            timeout: std::time::Duration::from_secs(self.upstream_timeout),
            restarts,
            backoff: std::time::Duration::from_millis(backoff_ms),
            limits: toolgate::upstream::UpstreamLimits::default(),
            max_result_bytes: self.upstream_max_result_bytes,
        }
    }
}

/// A line limit of at least 1 KiB (an MCP handshake's answer does not fit in less).
fn parse_line_limit(text: &str) -> Result<usize, String> {
    let bytes: usize = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of bytes"))?;
    if bytes < 1024 {
        return Err(format!(
            "{bytes} bytes is too small for an MCP message; give at least 1024"
        ));
    }
    Ok(bytes)
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DriftArg {
    Hide,
    RefuseStart,
}

#[derive(Debug, Subcommand)]
enum ProxyAction {
    /// Start the upstream, pin its tools (names, titles, descriptions, schemas, annotations, and
    /// its name and version) in the lock file, and stop it. Review the file: it is what the
    /// proxy will serve.
    Lock {
        /// The upstream pin to write.
        #[arg(long, default_value = "toolgate-proxy.lock")]
        lock: PathBuf,
        #[command(flatten)]
        upstream: UpstreamArgs,
        /// The upstream's command line, after `--`.
        #[arg(last = true, required = true, value_name = "CMD ARGS")]
        command: Vec<String>,
    },
}

/// The options of `serve --http`.
#[derive(Debug, Default, clap::Args)]
struct HttpArgs {
    /// The server's public canonical URI, when it is reached through a proxy (the audience OAuth
    /// tokens must name, and the resource of the metadata); default http://ADDR/mcp.
    #[arg(long, env = "TOOLGATE_PUBLIC_URL", requires = "http")]
    public_url: Option<String>,
    /// Accept OAuth access tokens (JWTs) of this issuer: `iss` must equal it.
    #[arg(long, env = "TOOLGATE_OAUTH_ISSUER", requires_all = ["http", "oauth_jwks_url"])]
    oauth_issuer: Option<String>,
    /// The issuer's JSON Web Key Set (https://, or http:// on loopback), fetched on the first
    /// token and again when a token names a key it does not hold.
    #[arg(long, env = "TOOLGATE_OAUTH_JWKS_URL", requires = "oauth_issuer")]
    oauth_jwks_url: Option<String>,
    /// The audience tokens must name (default: the server's canonical URI).
    #[arg(long, env = "TOOLGATE_OAUTH_AUDIENCE", requires = "oauth_issuer")]
    oauth_audience: Option<String>,
    /// The claim naming the principal (default `sub`).
    #[arg(
        long,
        env = "TOOLGATE_OAUTH_PRINCIPAL_CLAIM",
        requires = "oauth_issuer"
    )]
    oauth_principal_claim: Option<String>,
    /// The claim naming the tenant; tokens without it are refused.
    #[arg(long, env = "TOOLGATE_OAUTH_TENANT_CLAIM", requires = "oauth_issuer")]
    oauth_tenant_claim: Option<String>,
    /// The claim naming the caller's roles for Cedar policies (a string of space-separated
    /// names, or an array of strings).
    #[arg(long, env = "TOOLGATE_OAUTH_ROLES_CLAIM", requires = "oauth_issuer")]
    oauth_roles_claim: Option<String>,
    /// A claim given to Cedar policies as a tag of the principal (repeat for several).
    #[arg(
        long = "oauth-attribute-claim",
        value_name = "CLAIM",
        env = "TOOLGATE_OAUTH_ATTRIBUTE_CLAIMS",
        value_delimiter = ',',
        requires = "oauth_issuer"
    )]
    oauth_attribute_claims: Vec<String>,
    /// Seconds from the end of one fetch of the key set (successful or not) to the start of the
    /// next (default 10); meanwhile tokens are judged at once with the keys known.
    #[arg(long, env = "TOOLGATE_OAUTH_JWKS_COOLDOWN", requires = "oauth_issuer")]
    oauth_jwks_cooldown: Option<u64>,
    /// Seconds one fetch of the key set may take, connection to last byte (default 10); the
    /// requests waiting for it are answered 503 `jwks_unavailable` when it fails and no key is known.
    #[arg(long, env = "TOOLGATE_OAUTH_JWKS_TIMEOUT", requires = "oauth_issuer", value_parser = clap::value_parser!(u64).range(1..))]
    oauth_jwks_timeout: Option<u64>,
    /// Accept only tokens whose header says `typ: at+jwt` (RFC 9068), for issuers that set it.
    #[arg(long, requires = "oauth_issuer")]
    oauth_require_at_jwt: bool,
    /// `SUBJECT=PRINCIPAL`: the issuer's subject SUBJECT is this server's principal PRINCIPAL
    /// (its policy section, rights, limits and exactly-once records); repeat for several. Every
    /// other subject is the issuer's own principal, `ISSUER#SUBJECT`.
    #[arg(
        long = "oauth-local-principal",
        value_name = "SUBJECT=PRINCIPAL",
        requires = "oauth_issuer"
    )]
    oauth_local_principals: Vec<String>,
    /// An `Origin` browsers may send (`scheme://host:port`, `:*` for any port); repeat for
    /// several. Replaces the default, loopback origins only. A request with another Origin is 403.
    #[arg(long = "allowed-origin", value_name = "ORIGIN", requires = "http")]
    allowed_origins: Vec<String>,
    /// A `Host` the server answers to (a name or `host:port`); repeat for several. Added to the
    /// loopback names (and --public-url's host). A request for another Host is refused.
    #[arg(long = "allowed-host", value_name = "HOST", requires = "http")]
    allowed_hosts: Vec<String>,
    /// Seconds a request may take until its response starts (default 120); past it the answer
    /// is 503 and the call is cancelled.
    #[arg(long, env = "TOOLGATE_HTTP_REQUEST_TIMEOUT", requires = "http", value_parser = clap::value_parser!(u64).range(1..))]
    request_timeout: Option<u64>,
    /// Seconds a client may take to send a request's headers, or keep a connection idle
    /// (default 10).
    #[arg(long, env = "TOOLGATE_HTTP_HEADER_TIMEOUT", requires = "http", value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout: Option<u64>,
    /// How many refused requests (Origin, Host, body, credential) are audited one by one per
    /// minute (default 100); the rest of a minute are counted in one `http/refusals` record.
    #[arg(long, env = "TOOLGATE_HTTP_REFUSAL_AUDIT_LIMIT", requires = "http", value_parser = clap::value_parser!(u32).range(1..))]
    refusal_audit_limit: Option<u32>,
}

#[derive(Debug, Subcommand)]
enum ContractCommand {
    /// Print the contract digest (`sha256:<hex>`), the value a host can pin.
    Digest,
    /// Print the live contract as a toolgate.lock document (for --previous-lock, or to review).
    Lockfile,
    /// Print an attestation of the contract digest signed with the key in --attestation-key-file.
    Attest,
}

fn init_logging() {
    // Logs go to stderr only: stdout carries protocol messages.
    // RUST_LOG takes `level` and `target=level` directives, comma-separated (a `Targets` filter:
    // no span or field filters, which would link a regex engine for the one directive syntax);
    // one it cannot parse is ignored as a whole, with a line on stderr.
    // rmcp logs failed requests at warn with their error text, which can quote argument
    // values; by default only its errors are shown (RUST_LOG overrides this on purpose).
    let default = || {
        Targets::new()
            .with_default(Level::WARN)
            .with_target("rmcp", Level::ERROR)
            .with_target("toolgate", Level::INFO)
    };
    let mut ignored = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            directives.parse::<Targets>().unwrap_or_else(|error| {
                ignored = Some(error);
                default()
            })
        }
        _ => default(),
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .with(filter)
        .init();
    if let Some(error) = ignored {
        tracing::warn!(
            "RUST_LOG ignored ({error}); use `level` or `target=level`, comma-separated"
        );
    }
}

/// The server allocates from one dlmalloc heap for all its threads instead of glibc malloc's
/// arena per thread: glibc keeps freed memory in each thread's arena and raises the threshold below
/// which it keeps it after the first large response, so a call's allocations scattered over several
/// arenas each held on to its own high-water mark. One heap keeps peak RSS at one high-water mark
/// (figures in docs/BENCHMARKS.md); its lock is not contended, because protocol work runs on one
/// thread and the blocking threads mostly wait for fsyncs. The libraries leave the allocator to
/// the program that links them.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The runtime that serves MCP over stdio: every task on the main thread, blocking work (fsyncs,
/// file reads) on a blocking pool of at most [`BLOCKING_THREADS`] threads.
///
/// The protocol work is light next to the fsyncs it waits for, so worker threads buy no
/// throughput, while each thread that builds large responses raises peak memory. A bounded pool is
/// safe because no blocking task waits for another call: a call whose idempotency key another
/// call holds waits on a timer between single store attempts (`EffectStore::begin_attempt`), not
/// in a blocking thread.
fn serving_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(toolgate_server::BLOCKING_THREADS)
        .build()
}

#[cfg(feature = "http")]
fn serve_http(paths: &ServerOptions, addr: std::net::SocketAddr, web: HttpArgs) -> ExitCode {
    let oauth = web.oauth_issuer.map(|issuer| {
        let mut oauth = toolgate::http::oauth::OAuthOptions::new(
            issuer,
            web.oauth_jwks_url.unwrap_or_default(),
            web.oauth_audience.unwrap_or_default(),
        );
        if let Some(claim) = web.oauth_principal_claim {
            oauth.principal_claim = claim;
        }
        oauth.tenant_claim = web.oauth_tenant_claim;
        oauth.roles_claim = web.oauth_roles_claim;
        oauth.attribute_claims = web.oauth_attribute_claims;
        if let Some(secs) = web.oauth_jwks_timeout {
            oauth.fetch_timeout = std::time::Duration::from_secs(secs);
        }
        oauth.require_at_jwt = web.oauth_require_at_jwt;
        for mapping in &web.oauth_local_principals {
            // A mapping without `=` names the empty principal, which JwtVerifier::new refuses
            // with a message naming the mapping.
            let (subject, principal) = mapping.split_once('=').unwrap_or((mapping, ""));
            oauth
                .local_principals
                .insert(subject.to_owned(), principal.to_owned());
        }
        if let Some(secs) = web.oauth_jwks_cooldown {
            oauth.refetch_cooldown = std::time::Duration::from_secs(secs);
        }
        oauth
    });
    let seconds = std::time::Duration::from_secs;
    let config = toolgate::http::HttpConfig {
        addr,
        public_url: web.public_url,
        oauth,
        request_timeout: web
            .request_timeout
            .map_or(toolgate::http::DEFAULT_REQUEST_TIMEOUT, seconds),
        header_read_timeout: seconds(web.header_timeout.unwrap_or(10)),
        allowed_origins: web.allowed_origins,
        allowed_hosts: web.allowed_hosts,
        refusal_audit_limit: web.refusal_audit_limit,
    };
    let server = match toolgate_server::build_for_http(paths) {
        Ok(server) => server,
        Err(error) => return fail(&error),
    };
    let runtime = match toolgate::http::http_runtime(toolgate_server::BLOCKING_THREADS) {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error.into()),
    };
    match runtime.block_on(toolgate_server::serve_http(server, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    }
}

#[cfg(not(feature = "http"))]
fn serve_http(_: &ServerOptions, _: std::net::SocketAddr, _: HttpArgs) -> ExitCode {
    fail(&no_http())
}

#[cfg(not(feature = "http"))]
fn no_http() -> anyhow::Error {
    anyhow::anyhow!(
        "this build of toolgate-server has no HTTP support (feature `http`); build it with the feature or serve stdio"
    )
}

fn proxy_command(paths: &ServerOptions, args: ProxyArgs) -> ExitCode {
    let runtime = match serving_runtime() {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error.into()),
    };
    match args.action {
        Some(ProxyAction::Lock {
            lock,
            upstream,
            command,
        }) => {
            let config = toolgate_server::ProxyConfig {
                upstream: upstream.options(command, 0, 0),
                lock,
                on_drift: toolgate_server::OnDrift::default(),
            };
            match runtime.block_on(toolgate_server::lock_upstream(&config)) {
                Ok(pin) => {
                    say!(
                        "pinned {} tools of {} {} in {}",
                        pin.tools().len(),
                        pin.server_name(),
                        pin.server_version(),
                        config.lock.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => fail(&error),
            }
        }
        None => {
            let config = toolgate_server::ProxyConfig {
                upstream: args.upstream.options(
                    args.command,
                    args.upstream_restarts,
                    args.restart_backoff_ms,
                ),
                lock: args.lock,
                on_drift: match args.on_drift {
                    DriftArg::Hide => toolgate_server::OnDrift::Hide,
                    DriftArg::RefuseStart => toolgate_server::OnDrift::RefuseStart,
                },
            };
            let served = runtime.block_on(async {
                let server = toolgate_server::build_proxy(paths, &config).await?;
                toolgate_server::serve_stdio(server).await
            });
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            }
        }
    }
}

/// Writes `text` (a command's report) to stdout.
fn report(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// The exit of a command whose report could not be written: 0, quietly, when the reader has
/// gone (a closed pipe); otherwise 2 with the reason.
fn report_failed(error: std::io::Error) -> ExitCode {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        return ExitCode::SUCCESS;
    }
    fail(&anyhow::Error::new(error).context("cannot write the report to stdout"))
}

/// Prints a one-line reason on stderr (the full cause chain, joined) and returns exit code 2.
fn fail(error: &anyhow::Error) -> ExitCode {
    eprintln!("toolgate-server: {error:#}");
    ExitCode::from(2)
}

fn contract_command(command: &ContractCommand, options: &ServerOptions) -> anyhow::Result<String> {
    let policy = toolgate_server::load_policy(&options.gate.policy)?;
    let live = toolgate_server::contract::live_lockfile(&policy)?;
    let digest = live.integrity_digest();
    match command {
        ContractCommand::Digest => Ok(format!("sha256:{digest}")),
        ContractCommand::Lockfile => Ok(live.render().trim_end().to_owned()),
        ContractCommand::Attest => {
            let key_file = options.attestation_key_file.as_ref().ok_or_else(|| {
                anyhow::anyhow!(
                    "pass the key with --attestation-key-file or TOOLGATE_ATTESTATION_KEY_FILE"
                )
            })?;
            let signer = toolgate::contract::attest::HmacSha256Signer::from_key_file(key_file)?;
            Ok(toolgate::contract::attest::Attestation::create(&signer, digest)?.render())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let paths = ServerOptions {
        gate: cli.gate,
        expect_digest: cli.expect_digest,
        attestation: cli.attestation,
        attestation_key_file: cli.attestation_key_file,
        previous_lock: cli.previous_lock,
        max_in_flight: cli.max_in_flight,
        max_line_bytes: cli.max_line_bytes,
    };
    let command = cli.command.unwrap_or(Command::Serve {
        http: None,
        web: Box::default(),
    });
    #[cfg(feature = "otel")]
    if matches!(command, Command::Serve { .. } | Command::Proxy(_)) {
        // Before any runtime: the exporter's HTTP client runs on threads of its own.
        let telemetry = match toolgate_server::telemetry::Telemetry::from_env() {
            Ok(telemetry) => telemetry,
            Err(error) => return fail(&error),
        };
        let code = run(&paths, command);
        if let Some(telemetry) = telemetry {
            telemetry.shutdown();
        }
        return code;
    }
    run(&paths, command)
}

fn run(paths: &ServerOptions, command: Command) -> ExitCode {
    match command {
        Command::Serve { http: None, .. } => {
            let server = match toolgate_server::build(paths) {
                Ok(server) => server,
                Err(error) => return fail(&error),
            };
            let runtime = match serving_runtime() {
                Ok(runtime) => runtime,
                Err(error) => return fail(&error.into()),
            };
            match runtime.block_on(toolgate_server::serve_stdio(server)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            }
        }
        Command::Serve {
            http: Some(addr),
            web,
        } => serve_http(paths, addr, *web),
        Command::Proxy(args) => proxy_command(paths, args),
        Command::Operator(command) => command.run(&paths.gate, toolgate_server::SERVER_NAME),
        Command::Contract { command } => match contract_command(&command, paths) {
            Ok(text) => {
                say!("{text}");
                ExitCode::SUCCESS
            }
            Err(error) => fail(&error),
        },
        #[cfg(feature = "cedar")]
        Command::Policy { command } => policy_command(paths, command),
        #[cfg(feature = "demo")]
        Command::Demo => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime,
                Err(error) => return fail(&error.into()),
            };
            match runtime.block_on(toolgate_server::demo::run()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(error) => fail(&error),
            }
        }
    }
}
