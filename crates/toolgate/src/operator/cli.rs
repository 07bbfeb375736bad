//! The command line every gated stdio server can offer its operator, parsed and run by the
//! library so that a server's `main` does not rewrite it: serve (no subcommand), `halt`,
//! `resume`, `verify`, `stats` and `prune`, on the ledger layout of [`crate::GatedBuilder::ledger`].
//!
//! ```text
//! NAME [--policy FILE] [--ledger DIR]          serve MCP over stdio (the server's main does that)
//! NAME halt --reason TEXT [--by WHO]           set the kill switch (audited): every server on the
//!                                              ledger refuses tools/call from its next call on
//! NAME resume                                  lift it (audited)
//! NAME verify [--key-file F] [--format json]   verify the audit chain: exit 0 intact, 1 broken
//! NAME stats [--format json]                   counts per tool x decision x outcome
//! NAME prune                                   remove completed exactly-once records past their window (audited)
//! NAME help                                    this text
//! ```
//!
//! `prune` reads the policy (`--policy`): a record is kept as long as the policy's longest
//! `window_secs`, the retention the gate opens the store with ([`crate::ledger_effect_config`]),
//! so a late retry within a tool's window replays whichever command line pruned the store.
//!
//! A report written into a closed pipe (`NAME stats | head -1`) ends the command quietly with
//! exit 0, since the command is done and nobody is left to read an error.
//!
//! `--policy` and `--ledger` may stand anywhere and default to the environment variables
//! `POLICY_PATH` and `LEDGER_DIR`, then `./policy.json` and `./.ledger` (the reference server's
//! convention). Exit codes: 0 done, 1 a broken audit chain, 2 a usage or I/O error.
//!
//! There is no argument-parsing dependency here: the grammar is small and fixed, and a server
//! that wants its own flags parses them itself (for example from the environment).

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use toolgate_audit::{AuditConfig, FileAuditLog, VerifyOptions};
use toolgate_commit::EffectStore;
use toolgate_rmcp::checks::KillSwitch;

/// The default policy file when neither `--policy` nor `POLICY_PATH` is given.
pub const DEFAULT_POLICY: &str = "./policy.json";
/// The default ledger directory when neither `--ledger` nor `LEDGER_DIR` is given.
pub const DEFAULT_LEDGER: &str = "./.ledger";

/// A parsed command line: serve (no command) or an operator command, with the policy file and
/// the ledger (`--policy`, `--ledger`; `POLICY_PATH`, `LEDGER_DIR`; [`DEFAULT_POLICY`],
/// [`DEFAULT_LEDGER`]). [`usage`] has the grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cli {
    /// The policy file to serve with (and whose replay windows `prune` keeps records for).
    pub policy: PathBuf,
    /// The ledger directory: audit log, exactly-once store and kill switch.
    pub ledger: PathBuf,
    /// The operator command; `None` means serve.
    pub command: Option<Command>,
}

/// An operator command.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// Set the kill switch, audited.
    Halt {
        /// Shown to refused callers and recorded.
        reason: String,
        /// Who halts (recorded); default `$USER`, else `operator`.
        by: String,
    },
    /// Lift the kill switch, audited.
    Resume,
    /// Verify the audit chain (with a key, its signed checkpoints too).
    Verify {
        /// The checkpoint key file, if the server signs checkpoints.
        key_file: Option<PathBuf>,
        /// How to print the report.
        format: Format,
    },
    /// Count the audit log's tool-call records.
    Stats {
        /// How to print the counts.
        format: Format,
    },
    /// Remove completed exactly-once records past their window, audited.
    Prune,
    /// Print the usage.
    Help,
}

/// How a command prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// For people.
    Text,
    /// One JSON object.
    Json,
}

/// A command line that cannot be parsed; the text names the argument and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(String);

/// The usage text of `server_name`'s command line.
pub fn usage(server_name: &str) -> String {
    let n = server_name;
    format!(
        "usage:\n  \
         {n} [--policy FILE] [--ledger DIR]          serve MCP over stdio (POLICY_PATH, LEDGER_DIR; defaults {DEFAULT_POLICY}, {DEFAULT_LEDGER})\n  \
         {n} halt --reason TEXT [--by WHO]           refuse every tools/call on the ledger from the next call on (audited)\n  \
         {n} resume                                  lift the halt (audited)\n  \
         {n} verify [--key-file F] [--format json]   verify the audit chain: exit 0 intact, 1 broken, 2 unusable\n  \
         {n} stats [--format json]                   counts per tool x decision x outcome\n  \
         {n} prune                                   remove completed exactly-once records past the policy's windows (audited)\n\
         --policy and --ledger may stand anywhere on the line."
    )
}

/// The options each command takes besides `--policy` and `--ledger`.
fn command_options(command: &str) -> Option<&'static [&'static str]> {
    Some(match command {
        "halt" => &["--reason", "--by"],
        "verify" => &["--key-file", "--format"],
        "stats" => &["--format"],
        "resume" | "prune" | "help" => &[],
        _ => return None,
    })
}

fn parse_format(value: Option<String>) -> Result<Format, UsageError> {
    match value.as_deref() {
        None | Some("text") => Ok(Format::Text),
        Some("json") => Ok(Format::Json),
        Some(other) => Err(UsageError(format!(
            "--format takes `text` or `json`, not `{other}`"
        ))),
    }
}

impl Cli {
    /// Parses `args` (without the program name), with `POLICY_PATH` and `LEDGER_DIR` from the
    /// process environment as the defaults of `--policy` and `--ledger`.
    pub fn parse_from<I>(args: I) -> Result<Cli, UsageError>
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        Cli::parse_with_env(args, |name| std::env::var_os(name))
    }

    /// Parses `args` with `env` as the environment (`POLICY_PATH`, `LEDGER_DIR`, `USER`).
    fn parse_with_env<I>(args: I, env: impl Fn(&str) -> Option<OsString>) -> Result<Cli, UsageError>
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        let mut command: Option<String> = None;
        let mut values: Vec<(String, OsString)> = Vec::new();
        let mut args = args.into_iter().map(Into::into);
        while let Some(arg) = args.next() {
            let Some(text) = arg.to_str() else {
                return Err(UsageError(format!(
                    "argument {arg:?} is not UTF-8; only option values may be other bytes"
                )));
            };
            if text == "--help" || text == "-h" {
                command = Some("help".to_owned());
                continue;
            }
            if let Some(option) = text.strip_prefix("--") {
                let (name, inline) = match option.split_once('=') {
                    Some((name, value)) => (format!("--{name}"), Some(OsString::from(value))),
                    None => (text.to_owned(), None),
                };
                let value = match inline {
                    Some(value) => value,
                    None => args
                        .next()
                        .ok_or_else(|| UsageError(format!("{name} needs a value")))?,
                };
                if values.iter().any(|(seen, _)| *seen == name) {
                    return Err(UsageError(format!("{name} is given twice")));
                }
                values.push((name, value));
                continue;
            }
            if let Some(first) = &command {
                return Err(UsageError(format!(
                    "unexpected argument `{text}` after the command `{first}`"
                )));
            }
            if command_options(text).is_none() {
                return Err(UsageError(format!(
                    "unknown command `{text}`; the commands are halt, resume, verify, stats, prune and help (none serves MCP over stdio)"
                )));
            }
            command = Some(text.to_owned());
        }

        let allowed: &[&str] = command
            .as_deref()
            .and_then(command_options)
            .unwrap_or_default();
        for (name, _) in &values {
            if name != "--policy" && name != "--ledger" && !allowed.contains(&name.as_str()) {
                let with = command
                    .as_deref()
                    .map_or("serving".to_owned(), |c| format!("`{c}`"));
                let mut all = vec!["--policy", "--ledger"];
                all.extend_from_slice(allowed);
                return Err(UsageError(format!(
                    "unknown option {name} for {with}; allowed: {}",
                    all.join(", ")
                )));
            }
        }
        let mut take = |name: &str| {
            values
                .iter()
                .position(|(seen, _)| seen == name)
                .map(|i| values.swap_remove(i).1)
        };
        let text = |value: OsString, name: &str| {
            value
                .into_string()
                .map_err(|_| UsageError(format!("the value of {name} is not UTF-8")))
        };
        let policy = take("--policy")
            .or_else(|| env("POLICY_PATH"))
            .map_or_else(|| PathBuf::from(DEFAULT_POLICY), PathBuf::from);
        let ledger = take("--ledger")
            .or_else(|| env("LEDGER_DIR"))
            .map_or_else(|| PathBuf::from(DEFAULT_LEDGER), PathBuf::from);
        let format = take("--format").map(|v| text(v, "--format")).transpose()?;
        let command = match command.as_deref() {
            None => None,
            Some("halt") => {
                let reason = take("--reason")
                    .map(|v| text(v, "--reason"))
                    .transpose()?
                    .ok_or_else(|| UsageError("halt needs --reason TEXT".to_owned()))?;
                let by = match take("--by") {
                    Some(by) => text(by, "--by")?,
                    None => env("USER")
                        .and_then(|user| user.into_string().ok())
                        .filter(|user| !user.is_empty())
                        .unwrap_or_else(|| "operator".to_owned()),
                };
                Some(Command::Halt { reason, by })
            }
            Some("resume") => Some(Command::Resume),
            Some("verify") => Some(Command::Verify {
                key_file: take("--key-file").map(PathBuf::from),
                format: parse_format(format)?,
            }),
            Some("stats") => Some(Command::Stats {
                format: parse_format(format)?,
            }),
            Some("prune") => Some(Command::Prune),
            _ => Some(Command::Help),
        };
        Ok(Cli {
            policy,
            ledger,
            command,
        })
    }

    /// The process's command line for `server_name`, in the manner of clap's `Parser::parse`:
    /// returns only when the process is to serve. After an operator command (its report on
    /// stdout, problems on stderr) it exits with the command's code, after `help` with 0, and on
    /// a usage error with 2 and the usage on stderr. [`run_cli`] is the same without exiting.
    pub fn parse(server_name: &str) -> Cli {
        match parse_and_run(server_name) {
            Ok(cli) => cli,
            // The command's output was flushed by `run_code`; nothing else needs dropping.
            Err(code) => std::process::exit(i32::from(code)),
        }
    }

    /// Runs the operator command on [`Cli::ledger`], writing its report to `out` and problems
    /// (one line, prefixed with `server_name`) to `err`. Exit code 0 when done, 1 when `verify`
    /// finds the chain broken, 2 on an I/O error. Without a command there is nothing to run
    /// (exit 0): the caller serves.
    pub fn run(&self, server_name: &str, out: &mut dyn Write, err: &mut dyn Write) -> ExitCode {
        ExitCode::from(self.run_code(server_name, out, err))
    }

    fn run_code(&self, server_name: &str, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
        let Some(command) = &self.command else {
            return 0;
        };
        let code = match run_command(command, server_name, self, out, err) {
            Ok(code) => code,
            // The reader of the report went away (`| head`): nobody is left to tell, and the
            // command itself is done (its report is written after the action), so exit quietly
            // as other command-line tools do.
            Err(error) if is_broken_pipe(error.as_ref()) => 0,
            Err(error) => {
                let _ = writeln!(err, "{server_name}: {error}");
                2
            }
        };
        let _ = out.flush();
        code
    }
}

/// Parses the process's command line for `server_name` and runs an operator command if one was
/// given (its report on stdout, problems on stderr). Returns the settings to serve with, or the
/// exit code the process should end with (after a command, `help` or a usage error):
///
/// ```rust,no_run
/// # fn main() -> std::process::ExitCode {
/// let cli = match toolgate::operator::run_cli("bookings-mcp") {
///     Ok(cli) => cli,
///     Err(code) => return code,
/// };
/// // ... build the gate with .policy_file(&cli.policy).ledger(&cli.ledger) and serve
/// # std::process::ExitCode::SUCCESS }
/// ```
pub fn run_cli(server_name: &str) -> Result<Cli, ExitCode> {
    parse_and_run(server_name).map_err(ExitCode::from)
}

fn parse_and_run(server_name: &str) -> Result<Cli, u8> {
    let mut stderr = std::io::stderr().lock();
    let cli = match Cli::parse_from(std::env::args_os().skip(1)) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = writeln!(stderr, "{server_name}: {error}\n{}", usage(server_name));
            return Err(2);
        }
    };
    if cli.command.is_none() {
        return Ok(cli);
    }
    Err(cli.run_code(server_name, &mut std::io::stdout().lock(), &mut stderr))
}

/// Why a command failed (printed as one line).
type CommandError = Box<dyn std::error::Error>;

/// Whether `error`, or an error it was caused by, is a write to a closed pipe.
fn is_broken_pipe(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |e| e.source()).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run_command(
    command: &Command,
    server_name: &str,
    cli: &Cli,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CommandError> {
    let ledger = cli.ledger.as_path();
    let audit_path = ledger.join(crate::LEDGER_AUDIT_FILE);
    let open_audit = || -> Result<FileAuditLog, CommandError> {
        FileAuditLog::open_with(AuditConfig::new(&audit_path)).map_err(|error| {
            format!("cannot open the audit log in {}: {error}", ledger.display()).into()
        })
    };
    match command {
        Command::Help => writeln!(out, "{}", usage(server_name))?,
        Command::Halt { reason, by } => {
            let switch = KillSwitch::new(ledger);
            // A halt is what an operator reaches for in an incident: it is set even when the
            // audit log cannot be opened, and the error then says it was not recorded.
            let audit = match open_audit() {
                Ok(audit) => audit,
                Err(error) => {
                    switch.halt(reason, by)?;
                    return Err(format!(
                        "the halt is set, but it could not be recorded in the audit log: {error}"
                    )
                    .into());
                }
            };
            let previous = super::halt(&switch, &audit, reason, by)?;
            let replaced = previous
                .map(|p| format!(" (replacing the halt by {}: {})", p.by, p.reason))
                .unwrap_or_default();
            writeln!(
                out,
                "halt: every tools/call on {} is refused{replaced}; lift with `{server_name} resume`",
                ledger.display()
            )?;
        }
        Command::Resume => {
            let audit = open_audit()?;
            match super::resume(&KillSwitch::new(ledger), &audit)? {
                Some(lifted) => writeln!(
                    out,
                    "resume: lifted the halt by {} ({})",
                    lifted.by, lifted.reason
                )?,
                None => writeln!(out, "resume: no halt was in force")?,
            }
        }
        Command::Prune => {
            // The records are kept as long as the policy's longest replay window, exactly as
            // the gate opens the store: a prune with another window would let a late retry of
            // a tool with a longer one run again.
            let policy = toolgate_policy::Policy::load(&cli.policy)?;
            let effects = EffectStore::open(crate::ledger_effect_config(ledger, &policy))?;
            let removed = super::prune_effects(&effects, &open_audit()?, SystemTime::now())?;
            writeln!(out, "prune: removed {removed} completed records")?;
        }
        Command::Stats { format } => {
            let stats = toolgate_audit::stats::LogStats::of_log(&audit_path)?;
            match format {
                Format::Json => writeln!(out, "{}", stats.render_json())?,
                Format::Text => write!(out, "{}", stats.render_text())?,
            }
        }
        Command::Verify { key_file, format } => {
            if !audit_path.exists() {
                return Err(format!(
                    "no audit log at {}; pass the ledger directory with --ledger or LEDGER_DIR",
                    audit_path.display()
                )
                .into());
            }
            let mut options = VerifyOptions::new(&audit_path);
            if let Some(path) = key_file {
                options = options.checkpoint_key(super::load_key(path)?);
            }
            let report = toolgate_audit::verify(&options)?;
            match (format, &report.problem) {
                (Format::Json, _) => writeln!(out, "{}", report.to_json())?,
                (Format::Text, None) => writeln!(out, "verify: {report}")?,
                (Format::Text, Some(_)) => writeln!(out, "verify: BROKEN: {report}")?,
            }
            for warning in &report.warnings {
                writeln!(err, "{server_name}: warning: {warning}")?;
            }
            if let Some(problem) = &report.problem {
                writeln!(err, "{server_name}: the audit log is broken at {problem}")?;
                return Ok(1);
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn parse(args: &[&str]) -> Result<Cli, UsageError> {
        Cli::parse_with_env(args.iter().copied(), |name| match name {
            "USER" => Some("ada".into()),
            _ => None,
        })
    }

    fn run(cli: &Cli) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = cli.run_code("bookings-mcp", &mut out, &mut err);
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (code, text(out), text(err))
    }

    #[test]
    fn parses_serving_and_every_command() {
        let serve = parse(&[]).unwrap();
        assert_eq!(serve.policy, PathBuf::from(DEFAULT_POLICY));
        assert_eq!(serve.ledger, PathBuf::from(DEFAULT_LEDGER));
        assert_eq!(serve.command, None);
        let serve = parse(&["--ledger", "/l", "--policy=/p.json"]).unwrap();
        assert_eq!(
            (serve.ledger, serve.policy),
            ("/l".into(), "/p.json".into())
        );

        let halt = parse(&["halt", "--reason", "incident 7", "--ledger", "/l"]).unwrap();
        assert_eq!(halt.ledger, PathBuf::from("/l"));
        assert_eq!(
            halt.command,
            Some(Command::Halt {
                reason: "incident 7".into(),
                by: "ada".into()
            })
        );
        let halt = parse(&["--ledger=/l", "halt", "--by", "bob", "--reason=x"]).unwrap();
        assert_eq!(
            halt.command,
            Some(Command::Halt {
                reason: "x".into(),
                by: "bob".into()
            })
        );
        assert_eq!(parse(&["resume"]).unwrap().command, Some(Command::Resume));
        assert_eq!(parse(&["prune"]).unwrap().command, Some(Command::Prune));
        assert_eq!(parse(&["--help"]).unwrap().command, Some(Command::Help));
        assert_eq!(
            parse(&["verify", "--key-file", "k", "--format", "json"])
                .unwrap()
                .command,
            Some(Command::Verify {
                key_file: Some("k".into()),
                format: Format::Json
            })
        );
        assert_eq!(
            parse(&["stats"]).unwrap().command,
            Some(Command::Stats {
                format: Format::Text
            })
        );
    }

    #[test]
    fn environment_defaults_apply_when_flags_are_absent() {
        let cli = Cli::parse_with_env(["resume"], |name| match name {
            "LEDGER_DIR" => Some("/env/ledger".into()),
            "POLICY_PATH" => Some("/env/policy.json".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(cli.ledger, PathBuf::from("/env/ledger"));
        assert_eq!(cli.policy, PathBuf::from("/env/policy.json"));
        let cli = Cli::parse_with_env(["--ledger", "/flag"], |_| Some("/env".into())).unwrap();
        assert_eq!(cli.ledger, PathBuf::from("/flag"));
    }

    #[test]
    fn usage_errors_name_the_argument() {
        let error = |args: &[&str]| parse(args).unwrap_err().to_string();
        assert!(
            error(&["halt"]).contains("--reason"),
            "{}",
            error(&["halt"])
        );
        assert!(error(&["halt", "--reasn", "x"]).contains("unknown option --reasn for `halt`"));
        assert!(error(&["--reason", "x"]).contains("for serving"));
        assert!(error(&["delete"]).contains("unknown command `delete`"));
        assert!(error(&["resume", "now"]).contains("unexpected argument `now`"));
        assert!(error(&["--ledger"]).contains("--ledger needs a value"));
        assert!(error(&["--ledger", "a", "--ledger", "b"]).contains("twice"));
        assert!(error(&["stats", "--format", "yaml"]).contains("`text` or `json`"));
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
    fn a_report_into_a_closed_pipe_exits_quietly() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().to_str().unwrap();
        for args in [&["help"][..], &["resume"], &["stats"], &["verify"]] {
            let mut all = args.to_vec();
            all.extend(["--ledger", ledger]);
            let mut err = Vec::new();
            let code = parse(&all)
                .unwrap()
                .run_code("bookings-mcp", &mut ClosedPipe, &mut err);
            assert_eq!(
                (code, String::from_utf8(err).unwrap()),
                (0, String::new()),
                "{args:?}"
            );
        }
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

        let (code, out, err) = run(&cli(&["halt", "--reason", "incident 7"]));
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("lift with `bookings-mcp resume`"), "{out}");
        assert!(KillSwitch::new(&ledger).status().is_halted());

        let (code, out, _) = run(&cli(&["resume"]));
        assert_eq!(code, 0);
        assert!(out.contains("lifted the halt by ada (incident 7)"), "{out}");
        assert!(!KillSwitch::new(&ledger).status().is_halted());
        let (_, out, _) = run(&cli(&["resume"]));
        assert!(out.contains("no halt was in force"), "{out}");

        // Prune reads the policy for its windows: without one it prunes nothing.
        let (code, _, err) = run(&cli(&["prune"]));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("cannot read policy file"), "{err}");
        let policy = dir.path().join("policy.json");
        std::fs::write(&policy, r#"{"version":1,"allow":["t"]}"#).unwrap();
        let (code, out, err) = run(&cli(&["prune", "--policy", policy.to_str().unwrap()]));
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("removed 0 completed records"), "{out}");

        let (code, out, err) = run(&cli(&["verify"]));
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("verify: intact: 4 records"), "{out}");
        let (code, out, _) = run(&cli(&["verify", "--format", "json"]));
        assert_eq!(code, 0);
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (report["status"].as_str(), report["records"].as_u64()),
            (Some("intact"), Some(4))
        );

        let (code, out, _) = run(&cli(&["stats", "--format", "json"]));
        assert_eq!(code, 0);
        assert!(serde_json::from_str::<Value>(&out).is_ok(), "{out}");

        // A broken chain: exit 1, the line named on stderr.
        let audit = ledger.join(crate::LEDGER_AUDIT_FILE);
        let text = std::fs::read_to_string(&audit).unwrap();
        std::fs::write(&audit, text.replacen("incident 7", "incident 8", 1)).unwrap();
        let (code, out, err) = run(&cli(&["verify"]));
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.starts_with("verify: BROKEN: line 1"), "{out}");
        assert!(
            err.contains("bookings-mcp: the audit log is broken at line 1"),
            "{err}"
        );

        // No audit log at all: exit 2 with the fix.
        let (code, _, err) = run(&parse(&[
            "verify",
            "--ledger",
            dir.path().join("none").to_str().unwrap(),
        ])
        .unwrap());
        assert_eq!(code, 2);
        assert!(
            err.contains("pass the ledger directory with --ledger"),
            "{err}"
        );

        // Help and serving run nothing.
        let (code, out, _) = run(&parse(&["help"]).unwrap());
        assert_eq!(code, 0);
        assert!(out.contains("bookings-mcp halt --reason TEXT"), "{out}");
        assert_eq!(run(&parse(&[]).unwrap()), (0, String::new(), String::new()));
    }
}
