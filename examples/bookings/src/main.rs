//! `bookings-mcp`: the server of `src/lib.rs` behind toolgate's gate, served over stdio, with its
//! own flag (`--data`) and the operator's commands (`halt`, `resume`, `verify`, `stats`, `prune`,
//! `audit ...`, `effects ...`; `bookings-mcp help`) on one command line.
//! Everything here that the ungated server does not need is counted by `tests/adoption.rs`.
#![forbid(unsafe_code)]

use rmcp::ServiceExt as _;
use toolgate::prelude::*;

/// The server's own command line: where its bookings are kept.
#[derive(clap::Args)]
struct Args {
    /// The bookings' data directory.
    #[arg(long, env = "BOOKINGS_DATA", default_value = "./data")]
    data: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // An operator command runs and exits here; without one the server serves.
    let cli = toolgate::operator::Cli::<Args>::parse("bookings-mcp");
    let server = Gated::builder(bookings::Bookings::open(cli.own.data)?)
        // The policy, ledger or database, audit key, principal and rights of the command line.
        .gate_args(&cli.gate, "bookings-mcp")?
        // The contract published to hosts: these tools under the policy in force, with the
        // entitlements toolgate.lock records (tests/lock.rs keeps them equal to the sources).
        .locked_contract(
            bookings::Bookings::tools(),
            include_str!("../toolgate.lock"),
        )
        .build()?;
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    server
        .serve(StdioTransport::new(stdin, stdout))
        .await?
        .waiting()
        .await?;
    Ok(())
}
