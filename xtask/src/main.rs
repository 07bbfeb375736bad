//! Development automation for the toolgate workspace.
//!
//! `cargo xtask lock` computes the live contract of toolgate-server's tools (definitions from the
//! compiled tool router, entitlements from scanning the handlers' source, gate stages and policy
//! fingerprints under `fixtures/policy.json`) and writes `toolgate.lock`. `cargo xtask lock --check`
//! recomputes it and compares: exit 0 on a match, 1 on drift or a contract violation (with the diff
//! grouped by verdict), 2 on usage or I/O errors. Both are `toolgate::contract::check_lock`,
//! the call any server's own test makes; this file only chooses the inputs and the fix hint.
//! `cargo xtask scan ROOTS..` prints what the entitlement scanner finds in any Rust sources.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)] // A CLI: its report is its output.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use toolgate::contract::{LockCheck, LockMode, check_lock};
use toolgate_contract::check::ReportFormat;

/// What `lock --check` tells its reader to do when toolgate.lock is stale.
const FIX_HINT: &str = "run `cargo xtask lock` and commit the result";

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "toolgate development automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write toolgate.lock from the live tool contracts (or check it with --check).
    Lock {
        /// Compare instead of writing: exit 0 on a match, 1 on drift or a violation.
        #[arg(long)]
        check: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// The workspace root (default: the workspace this xtask was built from).
        #[arg(long)]
        workspace: Option<PathBuf>,
    },
    /// Scan any Rust sources for rmcp `#[tool]` handlers and print what each can do: the
    /// entitlement families with their evidence, and the calls the scanner could not follow.
    Scan {
        /// Source roots (directories or `.rs` files), for example a server's `src/`.
        #[arg(required = true)]
        roots: Vec<PathBuf>,
        /// Print the reports as one JSON object keyed by tool.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Github,
}

impl From<Format> for ReportFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Text => ReportFormat::Text,
            Format::Json => ReportFormat::Json,
            Format::Github => ReportFormat::Github,
        }
    }
}

fn default_workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn lock(check: bool, format: Format, root: &Path) -> anyhow::Result<ExitCode> {
    let policy = toolgate_server::load_policy(&root.join("fixtures/policy.json"))?;
    let lock = LockCheck::new(
        toolgate_server::contract::SERVER_NAME,
        toolgate_server::tools::NotesServer::tools(),
        policy,
        [root.join("crates/toolgate-server/src")],
        root.join("toolgate.lock"),
    )
    .mode(if check {
        LockMode::Check
    } else {
        LockMode::Update
    })
    .fix_hint(FIX_HINT);
    let report = check_lock(&lock)?;
    print!("{}", report.render(format.into()));
    // Drift, a violation, or an update refused because of violations: exit 1.
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn scan(roots: &[PathBuf], json: bool) -> anyhow::Result<ExitCode> {
    let handlers = toolgate_scan::find_tool_handlers(roots)?;
    let reports = toolgate_scan::scan_handlers(roots, &handlers)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(ExitCode::SUCCESS);
    }
    for (tool, report) in &reports {
        let families: Vec<&str> = report
            .entitlements
            .families()
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
            .collect();
        println!("{tool}: {}", families.join(", "));
        for e in &report.evidence {
            let at = format!("{}:{}", e.file.display(), e.line);
            println!(
                "  {} {} at {at} via {}",
                e.family,
                e.what,
                e.via.join(" -> ")
            );
        }
        for u in &report.unresolved {
            let at = format!("{}:{}", u.file.display(), u.line);
            println!("  unresolved {} at {at} via {}", u.call, u.via.join(" -> "));
        }
        for kind in report.evasion_kinds() {
            println!("  evasion {kind}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Lock {
            check,
            format,
            workspace,
        } => lock(check, format, &workspace.unwrap_or_else(default_workspace)),
        Command::Scan { roots, json } => scan(&roots, json),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::from(2)
        }
    }
}
