//! `bookings-mcp`: the server of `src/lib.rs` behind toolgate's gate, served over stdio, with the
//! operator's commands (`halt`, `resume`, `verify`, `stats`, `prune`; `bookings-mcp help`).
//! Everything here that the ungated server does not need is counted by `tests/adoption.rs`.
#![forbid(unsafe_code)]

use rmcp::ServiceExt as _;
use toolgate::prelude::*;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // An operator command runs and exits here; without one the server serves.
    let cli = toolgate::operator::Cli::parse("bookings-mcp");
    let data = std::env::var_os("BOOKINGS_DATA").unwrap_or_else(|| "./data".into());
    let server = Gated::builder(bookings::Bookings::open(data)?)
        .policy_file(&cli.policy)
        .ledger(&cli.ledger)
        .server_name("bookings-mcp")
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
