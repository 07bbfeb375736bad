//! The `toolgate-server` binary: MCP over stdio by default, plus `audit verify` and `demo`.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)] // `audit verify` reports on stdout; the stdio server path never prints.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use toolgate_server::ServerPaths;

/// Reference MCP server gated by toolgate. With no subcommand it serves MCP over stdio.
#[derive(Debug, Parser)]
#[command(name = "toolgate-server", version)]
struct Cli {
    /// The policy file, loaded once at start.
    #[arg(
        long,
        env = "POLICY_PATH",
        default_value = "./policy.json",
        global = true
    )]
    policy: PathBuf,
    /// The ledger directory (audit.jsonl and notes/).
    #[arg(long, env = "LEDGER_DIR", default_value = "./.ledger", global = true)]
    ledger: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP over stdio (the default).
    Serve,
    /// Audit log tools.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Run the gated server end to end against a child process and print a transcript.
    Demo,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Verify the hash chain of LEDGER_DIR/audit.jsonl: exit 0 when intact, 1 when broken, 2 on
    /// usage or I/O errors.
    Verify,
}

fn init_logging() {
    // Logs go to stderr only: stdout carries protocol messages.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,toolgate=info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(filter)
        .init();
}

/// Prints a one-line reason on stderr (the full cause chain, joined) and returns exit code 2.
fn fail(error: &anyhow::Error) -> ExitCode {
    eprintln!("toolgate-server: {error:#}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let paths = ServerPaths {
        policy: cli.policy,
        ledger: cli.ledger,
    };
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let gated = match toolgate_server::build(&paths) {
                Ok(gated) => gated,
                Err(error) => return fail(&error),
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime,
                Err(error) => return fail(&error.into()),
            };
            match runtime.block_on(toolgate_server::serve_stdio(gated)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            }
        }
        Command::Audit {
            command: AuditCommand::Verify,
        } => match toolgate_server::verify_ledger(&paths.ledger) {
            Ok(report) => match &report.problem {
                None => {
                    println!(
                        "audit verify: intact: {} records, head {}",
                        report.records, report.head
                    );
                    ExitCode::SUCCESS
                }
                Some(problem) => {
                    println!("audit verify: BROKEN: {problem}");
                    eprintln!("toolgate-server: audit log is broken at {problem}");
                    ExitCode::from(1)
                }
            },
            Err(error) => fail(&error),
        },
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
