//! Development automation for the toolgate workspace.
//!
//! `cargo xtask lock` computes the live contract of toolgate-server's tools (definitions from the
//! compiled tool router, entitlements from scanning the handlers' source, gate stages and policy
//! fingerprints under `fixtures/policy.json`) and writes `toolgate.lock`. `cargo xtask lock --check`
//! recomputes it and compares: exit 0 on a match, 1 on drift or a contract violation (with the diff
//! grouped by verdict), 2 on usage or I/O errors.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)] // A CLI: its report is its output.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use toolgate_contract::check::{
    CheckOutcome, ReportFormat, check_lockfile, render_report, write_lockfile,
};

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
    let lock_path = root.join("toolgate.lock");
    let policy_path = root.join("fixtures/policy.json");
    let sources = root.join("crates/toolgate-server/src");
    let policy = toolgate_server::load_policy(&policy_path)?;
    let live =
        toolgate_server::contract::lock_from_source(&policy, &sources).with_context(|| {
            format!(
                "cannot compute the live contract from {}",
                sources.display()
            )
        })?;
    let shown_path = "toolgate.lock";

    if check {
        let outcome = check_lockfile(&lock_path, &live.lockfile)?;
        print!(
            "{}",
            render_report(&outcome, &live.violations, format.into(), shown_path)
        );
        let ok = outcome.is_up_to_date() && live.violations.is_empty();
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }

    if !live.violations.is_empty() {
        // A contract that lies about its tools is never written.
        print!(
            "{}",
            render_report(
                &CheckOutcome::UpToDate,
                &live.violations,
                format.into(),
                shown_path
            )
        );
        println!("toolgate.lock was not written: fix the violations above first");
        return Ok(ExitCode::from(1));
    }
    write_lockfile(&toolgate_storage::FsStorage, &lock_path, &live.lockfile)?;
    println!(
        "wrote {}: {} tools, integrity sha256:{}",
        lock_path.display(),
        live.lockfile.contract().tools.len(),
        live.lockfile.integrity_digest()
    );
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
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::from(2)
        }
    }
}
