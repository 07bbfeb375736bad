//! The bookings server before adoption: its `main` reads its one flag, opens the store and
//! serves stdio, nothing more. `tests/adoption.rs` subtracts this file's lines from what
//! `src/main.rs` and `tests/lock.rs` hold. `cargo run -p bookings --example ungated` serves it.
#![forbid(unsafe_code)]

use clap::Parser as _;
use rmcp::ServiceExt as _;

/// The server's own command line: where its bookings are kept.
#[derive(clap::Parser)]
struct Args {
    /// The bookings' data directory.
    #[arg(long, env = "BOOKINGS_DATA", default_value = "./data")]
    data: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let server = bookings::Bookings::open(args.data)?;
    server
        .serve(rmcp::transport::stdio())
        .await?
        .waiting()
        .await?;
    Ok(())
}
