//! The operator's command line, on clap: what `toolgate-server` runs and what every server built
//! on the crates can offer its operator without writing it.
//!
//! - [`GateArgs`]: the global options (`--policy`, `--ledger`, `--store`, the audit key ...).
//! - [`Command`]: the operator commands (`halt`, `resume`, `verify`, `stats`, `prune`, `audit
//!   verify|export|stats`, `effects prune|resolve`, `rights set|clear|show`, `entities
//!   set|clear|show`, and with the feature
//!   `http` `token create|list|revoke`), each run by [`Command::run`] on the stores of the
//!   [`GateArgs`].
//! - [`Cli`]: both plus the server's own flags (any `clap::Args`, such as a data directory), as one
//!   `clap::Parser`. [`Cli::parse`] runs a command and exits, or returns to serve.
//!
//! A server with commands of its own flattens [`Command`] into its subcommand enum
//! (`#[command(flatten)] Operator(toolgate::operator::Command)`) and [`GateArgs`] into its parser,
//! as the reference server does.
//!
//! Each command reports on stdout and says what went wrong on stderr, one line prefixed with the
//! server's name. Exit codes: 0 done, 1 a broken audit chain, 2 a usage or I/O error. A report
//! written into a closed pipe (`NAME stats | head -1`) ends the command quietly with 0: the command
//! is done and nobody is left to read an error (a broken chain still exits 1).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::{CommandFactory as _, FromArgMatches as _};

use super::{EffectKey, GateArgs};

/// An operator command, run on the stores of a [`GateArgs`] by [`Command::run`].
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
#[non_exhaustive]
pub enum Command {
    /// Stop every tools/call of every server on this ledger (the kill switch), audited. Takes
    /// effect on each server's next call, without a restart; tools/list keeps working.
    Halt {
        /// Why, shown to refused callers and recorded in the audit log.
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who halts (recorded); default $USER, else `operator`.
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
        /// Stop only this tenant's calls (over HTTP, the tenant its credentials name).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Lift the kill switch (audited).
    Resume {
        /// Lift only this tenant's halt.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Verify the audit chain (as `audit verify`): exit 0 intact, 1 broken, 2 unusable.
    Verify(VerifyArgs),
    /// Counts per tool x decision x outcome (as `audit stats`).
    Stats(FormatArgs),
    /// Remove completed exactly-once records past the policy's windows (as `effects prune`).
    Prune,
    /// Audit log tools.
    Audit {
        /// The audit command.
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// The exactly-once effect store.
    Effects {
        /// The effects command.
        #[command(subcommand)]
        command: EffectsCommand,
    },
    /// The rights of every replica on the database of --store (which tools each principal may
    /// call), applied on each replica's next call; audited. Without --store the rights are the
    /// file named by --rights.
    Rights {
        /// The rights command.
        #[command(subcommand)]
        command: RightsCommand,
    },
    /// The Cedar entities of every replica on the database of --store (roles and attributes of
    /// principals for the policy's Cedar policies), applied on each replica's next call; audited.
    /// Without --store the entities are the file named by --entities.
    Entities {
        /// The entities command.
        #[command(subcommand)]
        command: EntitiesCommand,
    },
    /// API tokens for Streamable HTTP (stored as hashes in the ledger; every change audited).
    /// A build without the feature `http` refuses them, saying so.
    Token {
        /// The token command.
        #[command(subcommand)]
        command: TokenCommand,
    },
}

/// The options of `verify` and `audit verify`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct VerifyArgs {
    /// The checkpoint key file (default: --audit-key-file). Without a key, truncation after a line
    /// boundary and a re-chained replacement cannot be detected. The mirror compared is the global
    /// --checkpoint-mirror.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// The output format of a report.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct FormatArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// How a command prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum Format {
    /// For people.
    Text,
    /// One JSON object.
    Json,
}

/// `audit ...`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
#[non_exhaustive]
pub enum AuditCommand {
    /// Verify the hash chain of the ledger's audit.jsonl (and its segments; with a key, its
    /// signed checkpoints; with --checkpoint-mirror, that the mirror holds the same checkpoints),
    /// or of --store: exit 0 when intact (warnings included), 1 when broken, 2 on usage or I/O
    /// errors.
    Verify(VerifyArgs),
    /// Write the audit chain of --store (TOOLGATE_STORE) to stdout in the file format
    /// (audit.jsonl), for `audit verify` on a copy or any independent verifier.
    Export,
    /// Counts per tool x decision x outcome and the committed / replay / deny / failure ratios.
    Stats(FormatArgs),
}

/// `effects ...`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
#[non_exhaustive]
pub enum EffectsCommand {
    /// Remove completed records older than the policy's longest window (24 h by default), the
    /// retention the gate opens the store with; audited.
    Prune,
    /// Settle an indeterminate call (its caller died, or the proxy lost its upstream mid-call)
    /// after inspecting its target: `--completed RESULT` if the effect happened (later calls
    /// replay RESULT), `--forget` if it did not (the next call runs); audited. The call is the
    /// one of --principal (default `local`) to TOOL with KEY.
    Resolve {
        /// The tool of the call.
        #[arg(long)]
        tool: String,
        /// The idempotency key the call carried (its key argument or `_meta`).
        #[arg(
            long,
            required_unless_present = "args_digest",
            conflicts_with = "args_digest"
        )]
        key: Option<String>,
        /// For a call that carried no key: the `args_digest` of its audit record.
        #[arg(long)]
        args_digest: Option<String>,
        /// The effect did not happen: the next call with this key runs.
        #[arg(
            long,
            required_unless_present = "completed",
            conflicts_with = "completed"
        )]
        forget: bool,
        /// The effect happened: later calls replay this result (a CallToolResult as JSON, e.g.
        /// `{"content":[{"type":"text","text":"done"}]}`).
        #[arg(long)]
        completed: Option<String>,
    },
}

/// `rights ...`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
#[non_exhaustive]
pub enum RightsCommand {
    /// Replace the rights with those of a rights file (validated first; format in docs/checks.md).
    Set {
        /// The rights file.
        file: PathBuf,
    },
    /// Remove the rights: only the policy decides (as without a rights file).
    Clear,
    /// Print the rights document in force.
    Show,
}

/// `entities ...`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
#[non_exhaustive]
pub enum EntitiesCommand {
    /// Replace the entities with those of an entities file (validated first; format in
    /// docs/policy.md, "Cedar").
    Set {
        /// The entities file.
        file: PathBuf,
    },
    /// Remove the entities: principals have only the roles and attributes their credentials
    /// carry (as without an entities file).
    Clear,
    /// Print the entities document in force.
    Show,
}

/// `token ...`.
/// `KEY=VALUE`, split at the first `=` (the token store checks both halves).
fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, e.g. role=admin, got {text:?}"))
}

#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
#[non_exhaustive]
pub enum TokenCommand {
    /// Create a token for a principal and print it (once: only its hash is kept).
    Create {
        /// The principal the token authenticates.
        #[arg(long)]
        principal: String,
        /// Seconds the token is accepted for (default: until revoked).
        #[arg(long)]
        expires_in: Option<u64>,
        /// The principal's tenant (recorded in the audit log; the per-tenant kill switch).
        #[arg(long)]
        tenant: Option<String>,
        /// Limit the token to this scope (repeat for several): tools the policy puts under
        /// scopes are then reachable only with one of theirs. Default: not scoped.
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        /// An attribute for Cedar policies (repeat for several): `role=NAME` makes the caller a
        /// member of that role (`principal in Toolgate::Role::"NAME"`; repeatable), any other
        /// `KEY=VALUE` a tag of the principal (`principal.getTag("KEY")`).
        #[arg(long = "attr", value_name = "KEY=VALUE", value_parser = key_value)]
        attributes: Vec<(String, String)>,
    },
    /// List the tokens: id, principal, expiry, revocation.
    List,
    /// Revoke a token by id; the next request with it is refused.
    Revoke {
        /// The token's id (from `token create` or `token list`).
        id: String,
    },
}

/// No flags of the server's own: `Cli<NoArgs>`, the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct NoArgs {}

/// A gated server's whole command line: the [`GateArgs`], the server's own flags `A` (any
/// `clap::Args`) and an optional operator [`Command`] (none: serve).
///
/// ```rust,no_run
/// #[derive(clap::Args)]
/// struct Data {
///     /// Where the bookings are kept.
///     #[arg(long, env = "BOOKINGS_DATA", default_value = "./data")]
///     data: std::path::PathBuf,
/// }
///
/// // An operator command runs and exits here; without one the server serves.
/// let cli = toolgate::operator::Cli::<Data>::parse("bookings-mcp");
/// // ... open cli.own.data, build the gate with .gate_args(&cli.gate, "bookings-mcp")? and serve
/// ```
#[derive(Debug, Clone, clap::Parser)]
pub struct Cli<A: clap::Args = NoArgs> {
    /// Where the server's state is and how it is written.
    #[command(flatten)]
    pub gate: GateArgs,
    /// The server's own flags.
    #[command(flatten)]
    pub own: A,
    /// The operator command; `None` means serve.
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl<A: clap::Args> Cli<A> {
    /// The process's command line for `server_name`: returns only when the process is to serve.
    /// After an operator command it exits with the command's code; `help` and `--help` print the
    /// usage and exit 0; a usage error prints it on stderr and exits 2.
    pub fn parse(server_name: &str) -> Self {
        Self::parse_with(server_name, |command| command)
    }

    /// As [`Cli::parse`], with `customize` applied to the clap command first: another
    /// environment variable or default for a flag (`command.mut_arg("ledger", |arg|
    /// arg.env("BOOKINGS_LEDGER"))`), an `about` text, more help.
    pub fn parse_with(
        server_name: &str,
        customize: impl FnOnce(clap::Command) -> clap::Command,
    ) -> Self {
        let mut command = customize(Self::clap_command(server_name));
        let matches = command.get_matches_mut();
        if matches.subcommand_name() == Some("help") {
            // Into a closed pipe (`| head`) the help is cut short; nobody is left to tell.
            let _ = command.print_long_help();
            std::process::exit(0);
        }
        let cli = match Self::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(error) => error.exit(),
        };
        if let Some(command) = &cli.command {
            let code = command.run_code(
                &cli.gate,
                server_name,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            );
            std::process::exit(i32::from(code));
        }
        cli
    }

    /// The clap command of this command line, named `server_name`. Its `help` command takes the
    /// gate's options too (`NAME help --ledger DIR` prints the help), unlike clap's own.
    pub fn clap_command(server_name: &str) -> clap::Command {
        Self::command()
            .disable_help_subcommand(true)
            .subcommand(clap::Command::new("help").about("Print this help"))
            .name(server_name.to_owned())
            .bin_name(server_name.to_owned())
            .about(format!(
                "{server_name}: serve MCP over stdio (no command), or run an operator command on its ledger or --store"
            ))
            .long_about(None)
            .after_help(examples(server_name))
    }
}

/// The examples under the usage.
fn examples(n: &str) -> String {
    format!(
        "Examples:\n  \
         {n} halt --reason \"incident 7\"  refuse every tools/call on the ledger from the next call on\n  \
         {n} resume                      lift the halt\n  \
         {n} verify --format json        verify the audit chain: exit 0 intact, 1 broken, 2 unusable\n  \
         {n} stats                       counts per tool x decision x outcome\n  \
         {n} prune                       remove completed exactly-once records past the policy's windows"
    )
}

/// Why a command failed (printed as one line, its causes joined).
type CommandError = Box<dyn std::error::Error + Send + Sync>;

/// A report's output, noting whether a write failed because the reader has gone, so that only
/// that failure ends a command quietly (a database connection that breaks is an error, whatever
/// its `io::ErrorKind`).
struct Report<'a> {
    out: &'a mut dyn Write,
    reader_gone: bool,
}

impl Write for Report<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes);
        self.note(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let flushed = self.out.flush();
        self.note(flushed)
    }
}

impl Report<'_> {
    fn note<T>(&mut self, result: std::io::Result<T>) -> std::io::Result<T> {
        self.reader_gone |= result
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe);
        result
    }
}

/// `error` and its causes on one line, each cause that the text does not already quote appended
/// after `: `.
fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    for cause in std::iter::successors(error.source(), |e| e.source()) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

impl Command {
    /// Runs the command on the stores of `gate`, its report on stdout and problems on stderr (one
    /// line, prefixed with `server_name`). Exit code 0 when done, 1 when a verification finds the
    /// chain broken, 2 on an error.
    pub fn run(&self, gate: &GateArgs, server_name: &str) -> ExitCode {
        ExitCode::from(self.run_code(
            gate,
            server_name,
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        ))
    }

    /// As [`Command::run`], writing to `out` and `err`.
    pub fn run_with(
        &self,
        gate: &GateArgs,
        server_name: &str,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> ExitCode {
        ExitCode::from(self.run_code(gate, server_name, out, err))
    }

    fn run_code(
        &self,
        gate: &GateArgs,
        server_name: &str,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> u8 {
        let mut report = Report {
            out,
            reader_gone: false,
        };
        let result =
            self.execute(gate, server_name, &mut report, err)
                .and_then(|code| match report.flush() {
                    // The command is done: its code stands whether or not the reader stayed.
                    Err(error) if !report.reader_gone => Err(error.into()),
                    _ => Ok(code),
                });
        match result {
            Ok(code) => code,
            // The reader of the report went away (`| head`): nobody is left to tell, and the
            // command itself is done (its report is written after the action).
            Err(_) if report.reader_gone => 0,
            Err(error) => {
                let _ = writeln!(err, "{server_name}: {}", one_line(error.as_ref()));
                2
            }
        }
    }

    fn execute(
        &self,
        gate: &GateArgs,
        name: &str,
        out: &mut Report<'_>,
        err: &mut dyn Write,
    ) -> Result<u8, CommandError> {
        match self {
            Command::Halt { reason, by, tenant } => halt(gate, name, reason, by, tenant, out)?,
            Command::Resume { tenant } => {
                let audit = gate.audit()?;
                let switch = gate.kill_switch(name, tenant.as_deref())?;
                let lifted = super::resume(&switch, audit.as_ref())?;
                audit.checkpoint()?;
                match lifted {
                    Some(lifted) => writeln!(
                        out,
                        "resume: lifted the halt by {} ({})",
                        lifted.by, lifted.reason
                    )?,
                    None => writeln!(out, "resume: no halt was in force")?,
                }
            }
            Command::Verify(args) => return verify(gate, name, "verify", args, out, err),
            Command::Audit {
                command: AuditCommand::Verify(args),
            } => return verify(gate, name, "audit verify", args, out, err),
            Command::Stats(args)
            | Command::Audit {
                command: AuditCommand::Stats(args),
            } => {
                let stats = gate.stats()?;
                match args.format {
                    Format::Json => writeln!(out, "{}", stats.render_json())?,
                    Format::Text => write!(out, "{}", stats.render_text())?,
                }
            }
            Command::Audit {
                command: AuditCommand::Export,
            } => {
                let mut buffered = std::io::BufWriter::new(&mut *out);
                let records = gate.export(&mut buffered)?;
                drop(buffered);
                writeln!(err, "{name}: exported {records} audit records")?;
            }
            Command::Prune => writeln!(
                out,
                "prune: removed {} completed records",
                prune(gate, name)?
            )?,
            Command::Effects {
                command: EffectsCommand::Prune,
            } => writeln!(
                out,
                "effects prune: removed {} completed records",
                prune(gate, name)?
            )?,
            Command::Effects {
                command:
                    EffectsCommand::Resolve {
                        tool,
                        key,
                        args_digest,
                        forget: _,
                        completed,
                    },
            } => {
                let summary = resolve(gate, name, tool, key, args_digest, completed)?;
                writeln!(out, "effects resolve: {summary}")?;
            }
            Command::Rights { command } => rights(gate, command, out)?,
            Command::Entities { command } => entities(gate, command, out)?,
            Command::Token { command } => token(gate, name, command, out, err)?,
        }
        Ok(0)
    }
}

fn halt(
    gate: &GateArgs,
    name: &str,
    reason: &str,
    by: &str,
    tenant: &Option<String>,
    out: &mut dyn Write,
) -> Result<(), CommandError> {
    let switch = gate.kill_switch(name, tenant.as_deref())?;
    // A halt is what an operator reaches for in an incident: it is set even when the audit log
    // cannot be opened, and the error then says it was not recorded. (A resume, the less safe
    // direction, needs the audit log first.)
    let audit = match gate.audit() {
        Ok(audit) => audit,
        Err(error) => {
            switch.halt(reason, by)?;
            return Err(format!(
                "the halt is set, but it could not be recorded in the audit log: {}",
                one_line(&error)
            )
            .into());
        }
    };
    let previous = super::halt(&switch, audit.as_ref(), reason, by)?;
    audit.checkpoint()?;
    let whose = match tenant {
        Some(tenant) => format!("of tenant {tenant} "),
        None => String::new(),
    };
    let lift = match tenant {
        Some(tenant) => format!("{name} resume --tenant {tenant}"),
        None => format!("{name} resume"),
    };
    let replaced = previous
        .map(|p| format!(" (replacing the halt by {}: {})", p.by, p.reason))
        .unwrap_or_default();
    writeln!(
        out,
        "halt: every tools/call {whose}on {} is refused{replaced}; lift with `{lift}`",
        gate.ledger.display()
    )?;
    Ok(())
}

fn verify(
    gate: &GateArgs,
    name: &str,
    command: &str,
    args: &VerifyArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CommandError> {
    let gate = match &args.key_file {
        Some(key_file) => &GateArgs {
            audit_key_file: Some(key_file.clone()),
            ..gate.clone()
        },
        None => gate,
    };
    let report = gate.verify()?;
    let text = match (args.format, &report.problem) {
        (Format::Json, _) => {
            let mut json = report.to_json();
            json["mirror"] = serde_json::json!(
                gate.checkpoint_mirror
                    .as_ref()
                    .map(|m| m.display().to_string())
            );
            json.to_string()
        }
        (Format::Text, None) => format!("{command}: {report}"),
        (Format::Text, Some(_)) => format!("{command}: BROKEN: {report}"),
    };
    // A reader that has gone does not change the verdict: a broken chain still exits 1 (and
    // says so on stderr) when nobody reads the report.
    let written = writeln!(out, "{text}").and_then(|()| out.flush());
    if let Err(error) = written
        && error.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(error.into());
    }
    // Warnings keep exit 0; stderr makes them hard to miss in scripts too.
    for warning in &report.warnings {
        writeln!(err, "{name}: warning: {warning}")?;
    }
    match &report.problem {
        None => Ok(0),
        Some(problem) => {
            writeln!(err, "{name}: the audit log is broken at {problem}")?;
            Ok(1)
        }
    }
}

/// Prunes the exactly-once store with the policy's windows, exactly as the gate opens it: a prune
/// with another window would let a late retry of a tool with a longer one run again.
fn prune(gate: &GateArgs, name: &str) -> Result<u64, CommandError> {
    let policy = gate.load_policy()?;
    let stores = gate.open_stores(name, &policy, gate.audit_config()?)?;
    let removed = super::prune_effects(
        stores.effects.as_ref(),
        stores.audit.as_ref(),
        SystemTime::now(),
    )?;
    stores.audit.checkpoint()?;
    Ok(removed)
}

fn resolve(
    gate: &GateArgs,
    name: &str,
    tool: &str,
    key: &Option<String>,
    args_digest: &Option<String>,
    completed: &Option<String>,
) -> Result<String, CommandError> {
    let key = match (key, args_digest) {
        (Some(key), _) => EffectKey::given(key),
        (None, Some(hex)) => EffectKey::arguments(hex).ok_or_else(|| {
            format!("--args-digest {hex:?} is not a SHA-256 digest: give the 64 lowercase hex digits of the call's args_digest in the audit log")
        })?,
        (None, None) => return Err("give the call's --key, or --args-digest for a call without one".into()),
    };
    let resolution = match completed {
        Some(text) => {
            let result: rmcp::model::CallToolResult = serde_json::from_str(text).map_err(|e| {
                format!("--completed is not a CallToolResult: give JSON such as {{\"content\":[{{\"type\":\"text\",\"text\":\"done\"}}]}}: {e}")
            })?;
            toolgate_commit::Resolution::Completed(serde_json::to_value(&result)?)
        }
        None => toolgate_commit::Resolution::Forget,
    };
    let forget = matches!(resolution, toolgate_commit::Resolution::Forget);
    let principal = gate.principal.as_deref().unwrap_or("local");
    let policy = gate.load_policy()?;
    let stores = gate.open_stores(name, &policy, gate.audit_config()?)?;
    super::resolve_effect(
        stores.effects.as_ref(),
        stores.audit.as_ref(),
        principal,
        tool,
        &key,
        resolution,
    )?;
    stores.audit.checkpoint()?;
    Ok(if forget {
        format!("the call of {principal} to {tool} is forgotten: the next call with its key runs")
    } else {
        format!("the call of {principal} to {tool} is settled: later calls replay the given result")
    })
}

fn rights(
    gate: &GateArgs,
    command: &RightsCommand,
    out: &mut dyn Write,
) -> Result<(), CommandError> {
    let rights = gate.database_rights()?;
    match command {
        RightsCommand::Set { file } => {
            let audit = gate.audit()?;
            let digest = super::set_rights(&rights, audit.as_ref(), Some(file))?;
            audit.checkpoint()?;
            let digest = digest.map(|d| d.to_hex()).unwrap_or_default();
            writeln!(
                out,
                "rights set: sha256:{digest} applies to every replica's next call"
            )?;
        }
        RightsCommand::Clear => {
            let audit = gate.audit()?;
            super::set_rights(&rights, audit.as_ref(), None)?;
            audit.checkpoint()?;
            writeln!(out, "rights cleared: only the policy decides")?;
        }
        RightsCommand::Show => match rights.document()? {
            Some(document) => writeln!(out, "{}", String::from_utf8_lossy(&document).trim_end())?,
            None => writeln!(out, "no rights are set: only the policy decides")?,
        },
    }
    Ok(())
}

fn entities(
    gate: &GateArgs,
    command: &EntitiesCommand,
    out: &mut dyn Write,
) -> Result<(), CommandError> {
    let entities = gate.database_entities()?;
    match command {
        EntitiesCommand::Set { file } => {
            let audit = gate.audit()?;
            let digest = super::set_entities(&entities, audit.as_ref(), Some(file))?;
            audit.checkpoint()?;
            let digest = digest.map(|d| d.to_hex()).unwrap_or_default();
            writeln!(
                out,
                "entities set: sha256:{digest} applies to every replica's next call"
            )?;
        }
        EntitiesCommand::Clear => {
            let audit = gate.audit()?;
            super::set_entities(&entities, audit.as_ref(), None)?;
            audit.checkpoint()?;
            writeln!(
                out,
                "entities cleared: principals have only what their credentials carry"
            )?;
        }
        EntitiesCommand::Show => match entities.document()? {
            Some(document) => writeln!(out, "{}", String::from_utf8_lossy(&document).trim_end())?,
            None => writeln!(
                out,
                "no entities are set: principals have only what their credentials carry"
            )?,
        },
    }
    Ok(())
}

#[cfg(not(feature = "http"))]
fn token(
    _: &GateArgs,
    name: &str,
    _: &TokenCommand,
    _: &mut dyn Write,
    _: &mut dyn Write,
) -> Result<(), CommandError> {
    Err(format!(
        "this build of {name} has no HTTP support (toolgate's feature `http`): API tokens are for Streamable HTTP; build it with the feature or serve stdio"
    )
    .into())
}

#[cfg(feature = "http")]
fn token(
    gate: &GateArgs,
    _: &str,
    command: &TokenCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CommandError> {
    let tokens = toolgate_http::tokens::ApiTokens::new(&gate.ledger).with_storage(gate.storage());
    match command {
        TokenCommand::Create {
            principal,
            expires_in,
            tenant,
            scopes,
            attributes,
        } => {
            let spec = toolgate_http::tokens::TokenSpec {
                principal: principal.clone(),
                tenant: tenant.clone(),
                scopes: (!scopes.is_empty()).then(|| scopes.clone()),
                valid_for: expires_in.map(std::time::Duration::from_secs),
                attributes: attributes.clone(),
            };
            let created = super::create_token(&tokens, gate.audit()?.as_ref(), &spec)?;
            writeln!(
                err,
                "token {} for {}: shown once, only its hash is kept",
                created.info.id, created.info.principal
            )?;
            // The token itself on stdout, alone on its line, for scripts; shown only this once.
            writeln!(out, "{}", created.token)?;
        }
        TokenCommand::List => {
            for token in tokens.list()? {
                let state = match (token.revoked_ns, token.expires_ns) {
                    (Some(at), _) => format!("revoked at {at}"),
                    (None, Some(at)) => format!("expires at {at}"),
                    (None, None) => "no expiry".to_owned(),
                };
                // Then what Cedar policies see of it: tenant, scopes, roles, attributes.
                let mut line = format!("{} {} {state}", token.id, token.principal);
                let shown = |value: &str| {
                    if value.contains(|c: char| c.is_whitespace() || c == '"') {
                        format!("{value:?}")
                    } else {
                        value.to_owned()
                    }
                };
                if let Some(tenant) = &token.tenant {
                    line.push_str(&format!(" tenant={tenant}"));
                }
                if let Some(scopes) = &token.scopes {
                    line.push_str(&format!(" scopes={}", scopes.join(",")));
                }
                for role in &token.roles {
                    line.push_str(&format!(" role={role}"));
                }
                for (key, value) in &token.attributes {
                    line.push_str(&format!(" {key}={}", shown(value)));
                }
                writeln!(out, "{line}")?;
            }
        }
        TokenCommand::Revoke { id } => {
            let revoked = super::revoke_token(&tokens, gate.audit()?.as_ref(), id)?;
            writeln!(out, "revoked token {} of {}", revoked.id, revoked.principal)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use toolgate_state::KillSwitch;

    /// An embedding server's own flag.
    #[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
    struct Data {
        #[arg(long, default_value = "./data")]
        data: PathBuf,
    }

    fn parse(args: &[&str]) -> Result<Cli<Data>, clap::Error> {
        let matches = Cli::<Data>::clap_command("bookings-mcp")
            .try_get_matches_from(std::iter::once("bookings-mcp").chain(args.iter().copied()))?;
        Cli::<Data>::from_arg_matches(&matches)
    }

    fn run(cli: &Cli<Data>) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let command = cli.command.as_ref().expect("a command");
        let code = command.run_code(&cli.gate, "bookings-mcp", &mut out, &mut err);
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (code, text(out), text(err))
    }

    #[test]
    fn parses_serving_the_servers_own_flags_and_every_command() {
        let serve = parse(&["--data", "/d", "--ledger", "/l", "--policy=/p.json"]).unwrap();
        assert_eq!(serve.command, None);
        assert_eq!(serve.own.data, PathBuf::from("/d"));
        assert_eq!(
            (serve.gate.ledger, serve.gate.policy),
            ("/l".into(), "/p.json".into())
        );

        // The gate's options may follow the command.
        let halt = parse(&[
            "halt",
            "--reason",
            "incident 7",
            "--by",
            "bob",
            "--ledger",
            "/l",
        ])
        .unwrap();
        assert_eq!(halt.gate.ledger, PathBuf::from("/l"));
        assert_eq!(
            halt.command,
            Some(Command::Halt {
                reason: "incident 7".into(),
                by: "bob".into(),
                tenant: None,
            })
        );
        let resume = parse(&["resume", "--tenant", "acme"]).unwrap();
        assert_eq!(
            resume.command,
            Some(Command::Resume {
                tenant: Some("acme".into())
            })
        );
        assert_eq!(parse(&["prune"]).unwrap().command, Some(Command::Prune));
        let verify = parse(&["verify", "--key-file", "k", "--format", "json"]).unwrap();
        assert_eq!(
            verify.command,
            Some(Command::Verify(VerifyArgs {
                key_file: Some("k".into()),
                format: Format::Json
            }))
        );
        let audit = parse(&["audit", "stats", "--format", "json"]).unwrap();
        assert_eq!(
            audit.command,
            Some(Command::Audit {
                command: AuditCommand::Stats(FormatArgs {
                    format: Format::Json
                })
            })
        );
        let resolve = parse(&[
            "effects", "resolve", "--tool", "t", "--key", "k", "--forget",
        ])
        .unwrap();
        assert!(matches!(
            resolve.command,
            Some(Command::Effects {
                command: EffectsCommand::Resolve { forget: true, .. }
            })
        ));
    }

    #[test]
    fn a_server_can_rename_a_flags_environment_and_default() {
        let command = Cli::<Data>::clap_command("bookings-mcp")
            .mut_arg("ledger", |arg| arg.default_value("/var/lib/bookings"));
        let matches = command
            .try_get_matches_from(["bookings-mcp", "resume"])
            .unwrap();
        let cli = Cli::<Data>::from_arg_matches(&matches).unwrap();
        assert_eq!(cli.gate.ledger, PathBuf::from("/var/lib/bookings"));
    }

    #[test]
    fn usage_errors_name_the_argument() {
        let error = |args: &[&str]| parse(args).unwrap_err().to_string();
        assert!(
            error(&["halt"]).contains("--reason <TEXT>"),
            "{}",
            error(&["halt"])
        );
        assert!(error(&["halt", "--reasn", "x"]).contains("--reasn"));
        assert!(error(&["delete"]).contains("delete"));
        assert!(error(&["resume", "now"]).contains("now"));
        assert!(error(&["--ledger"]).contains("--ledger"));
        assert!(error(&["stats", "--format", "yaml"]).contains("yaml"));
        assert!(error(&["effects", "resolve", "--tool", "t", "--forget"]).contains("--key"));
    }

    /// A reader that went away: every write fails as a closed pipe does.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_report_into_a_closed_pipe_exits_quietly_but_a_broken_chain_still_exits_1() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().to_str().unwrap();
        let into_pipe = |args: &[&str]| {
            let mut all = args.to_vec();
            all.extend(["--ledger", ledger]);
            let cli = parse(&all).unwrap();
            let mut err = Vec::new();
            let code = cli.command.as_ref().unwrap().run_code(
                &cli.gate,
                "bookings-mcp",
                &mut ClosedPipe,
                &mut err,
            );
            (code, String::from_utf8(err).unwrap())
        };
        for args in [&["resume"][..], &["stats"], &["verify"]] {
            assert_eq!(into_pipe(args), (0, String::new()), "{args:?}");
        }
        let audit = dir.path().join(crate::LEDGER_AUDIT_FILE);
        let text = std::fs::read_to_string(&audit).unwrap();
        std::fs::write(&audit, text.replacen("no halt", "no HALT", 1)).unwrap();
        let (code, err) = into_pipe(&["verify"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("the audit log is broken at line 1"), "{err}");
    }

    #[test]
    fn halt_resume_verify_stats_and_prune_run_on_a_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger");
        let ledger_arg = ledger.to_str().unwrap();
        let cli = |args: &[&str]| {
            let mut all = args.to_vec();
            all.extend(["--ledger", ledger_arg]);
            parse(&all).unwrap()
        };

        let (code, out, err) = run(&cli(&["halt", "--reason", "incident 7", "--by", "ada"]));
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("lift with `bookings-mcp resume`"), "{out}");
        assert!(KillSwitch::new(&ledger).status().is_halted());
        let (_, out, _) = run(&cli(&["halt", "--reason", "incident 8", "--by", "bob"]));
        assert!(
            out.contains("replacing the halt by ada: incident 7"),
            "{out}"
        );

        let (code, out, _) = run(&cli(&["resume"]));
        assert_eq!(code, 0);
        assert!(out.contains("lifted the halt by bob (incident 8)"), "{out}");
        assert!(!KillSwitch::new(&ledger).status().is_halted());
        let (_, out, _) = run(&cli(&["resume"]));
        assert!(out.contains("no halt was in force"), "{out}");

        // Prune reads the policy for its windows: without one it prunes nothing.
        let (code, _, err) = run(&cli(&["prune"]));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("cannot read policy file"), "{err}");
        let policy = dir.path().join("policy.json");
        std::fs::write(&policy, r#"{"version":1,"allow":["t"]}"#).unwrap();
        let policy = policy.to_str().unwrap();
        let (code, out, err) = run(&cli(&["prune", "--policy", policy]));
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, "prune: removed 0 completed records\n");
        let (_, out, _) = run(&cli(&["effects", "prune", "--policy", policy]));
        assert_eq!(out, "effects prune: removed 0 completed records\n");

        let (code, out, err) = run(&cli(&["verify"]));
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("verify: intact: 6 records"), "{out}");
        let (_, out, _) = run(&cli(&["audit", "verify"]));
        assert!(out.starts_with("audit verify: intact: 6 records"), "{out}");
        let (code, out, _) = run(&cli(&["verify", "--format", "json"]));
        assert_eq!(code, 0);
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (report["status"].as_str(), report["records"].as_u64()),
            (Some("intact"), Some(6))
        );
        let (code, out, _) = run(&cli(&["stats", "--format", "json"]));
        assert_eq!(code, 0);
        assert!(serde_json::from_str::<Value>(&out).is_ok(), "{out}");

        // Without --store, the database's commands say what to pass.
        let (code, _, err) = run(&cli(&["audit", "export"]));
        assert_eq!(code, 2);
        assert!(err.contains("pass --store or TOOLGATE_STORE"), "{err}");
        for command in ["rights", "entities"] {
            let (code, _, err) = run(&cli(&[command, "show"]));
            assert_eq!(code, 2);
            assert!(err.contains("need --store"), "{err}");
        }

        // A broken chain: exit 1, the line named on stderr.
        let audit = ledger.join(crate::LEDGER_AUDIT_FILE);
        let text = std::fs::read_to_string(&audit).unwrap();
        std::fs::write(&audit, text.replacen("incident 7", "incident 9", 1)).unwrap();
        let (code, out, err) = run(&cli(&["verify"]));
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.starts_with("verify: BROKEN: line 1"), "{out}");
        assert!(
            err.contains("bookings-mcp: the audit log is broken at line 1"),
            "{err}"
        );

        // No audit log at all: exit 2 with the fix.
        let none = dir.path().join("none");
        let (code, _, err) = run(&parse(&["verify", "--ledger", none.to_str().unwrap()]).unwrap());
        assert_eq!(code, 2);
        assert!(
            err.contains("pass the ledger directory with --ledger"),
            "{err}"
        );
    }
}
