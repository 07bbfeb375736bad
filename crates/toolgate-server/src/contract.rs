//! The reference server's own contract at start, from the entitlements build.rs scanned, so a
//! running server knows its digest without its source tree. (`cargo xtask lock` computes the same
//! contract from the source with `toolgate::contract::check_lock`.)

use anyhow::Context as _;
use std::collections::BTreeMap;
use toolgate::contract::lockfile::Lockfile;
use toolgate::contract::{ScannedHandler, server_contract};
use toolgate::policy::Policy;

use crate::tools::NotesServer;

/// The server name recorded in toolgate.lock.
pub const SERVER_NAME: &str = "toolgate-server";

/// What build.rs found when it scanned `src/` of this crate.
const EMBEDDED_SCAN: &str = include_str!(concat!(env!("OUT_DIR"), "/entitlements.json"));

/// Computes the lockfile of this binary from the scan embedded at build time.
pub fn live_lockfile(policy: &Policy) -> anyhow::Result<Lockfile> {
    let scans: BTreeMap<String, ScannedHandler> = serde_json::from_str(EMBEDDED_SCAN).context(
        "the entitlement scan embedded at build time is unreadable; rebuild toolgate-server",
    )?;
    let tools = NotesServer::tools();
    let contract = server_contract(SERVER_NAME, &tools, policy, &scans)?;
    Ok(Lockfile::new(contract, env!("CARGO_PKG_VERSION")))
}
