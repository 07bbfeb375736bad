//! The bookings server before adoption: its `main` opens the store and serves stdio, nothing
//! more. `tests/adoption.rs` subtracts this file's lines from what `src/main.rs` and
//! `tests/lock.rs` hold. `cargo run -p bookings --example ungated` serves it.
#![forbid(unsafe_code)]

use rmcp::ServiceExt as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data = std::env::var_os("BOOKINGS_DATA").unwrap_or_else(|| "./data".into());
    let server = bookings::Bookings::open(data)?;
    server
        .serve(rmcp::transport::stdio())
        .await?
        .waiting()
        .await?;
    Ok(())
}
