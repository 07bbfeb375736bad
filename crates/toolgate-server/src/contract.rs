//! The reference server's own contract: computed from source by `cargo xtask lock`, and at start
//! from the entitlements build.rs scanned, so a running server knows its digest without its
//! source tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use toolgate::contract::check::Violation;
use toolgate::contract::lockfile::Lockfile;
use toolgate::policy::Policy;
use toolgate::contract::{
    ScannedHandler, effect_class_violations, scan_sources, server_contract,
};

use crate::tools::NotesServer;

/// The server name recorded in toolgate.lock.
pub const SERVER_NAME: &str = "toolgate-server";

/// What build.rs found when it scanned `src/` of this crate.
const EMBEDDED_SCAN: &str = include_str!(concat!(env!("OUT_DIR"), "/entitlements.json"));

/// A live lockfile and the contract violations found while computing it.
#[derive(Debug)]
pub struct LiveLock {
    /// The lockfile the live code implies.
    pub lockfile: Lockfile,
    /// Claims the code contradicts (a `lock` refuses to write while there are any).
    pub violations: Vec<Violation>,
}

/// Computes the lockfile from the handlers' source under `sources` (what `cargo xtask lock` does).
pub fn lock_from_source(policy: &Policy, sources: &Path) -> anyhow::Result<LiveLock> {
    let tools = NotesServer::tools();
    let (scans, mut violations) = scan_sources(&[PathBuf::from(sources)], &tools)?;
    violations.extend(effect_class_violations(policy, &tools, &scans));
    let contract = server_contract(SERVER_NAME, &tools, policy, &scans)?;
    Ok(LiveLock {
        lockfile: Lockfile::new(contract, env!("CARGO_PKG_VERSION")),
        violations,
    })
}

/// Computes the lockfile of this binary from the scan embedded at build time.
pub fn live_lockfile(policy: &Policy) -> anyhow::Result<Lockfile> {
    let scans: BTreeMap<String, ScannedHandler> = serde_json::from_str(EMBEDDED_SCAN).context(
        "the entitlement scan embedded at build time is unreadable; rebuild toolgate-server",
    )?;
    let tools = NotesServer::tools();
    let contract = server_contract(SERVER_NAME, &tools, policy, &scans)?;
    Ok(Lockfile::new(contract, env!("CARGO_PKG_VERSION")))
}
