//! `toolgate-server`: the thin reference server composing every toolgate crate over stdio.
//!
//! The binary's `main` parses the command line and calls into this library: [`serve_stdio`] for
//! the MCP server, [`verify_ledger`] for `audit verify`, and [`demo::run`] for the end-to-end demo.
//! Nothing here writes to stdout while serving: stdout carries protocol messages only.

#![forbid(unsafe_code)]

pub mod demo;
#[cfg(feature = "fault-injection")]
mod fault;
pub mod tools;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::ServiceExt as _;
use toolgate_audit::{AuditConfig, AuditSink, FileAuditLog, VerifyReport};
use toolgate_commit::{CommitConfig, CommitStore, FileCommitStore};
use toolgate_policy::Policy;
use toolgate_rmcp::Gated;

/// The audit log's file name inside the ledger directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
/// The notes directory's name inside the ledger directory.
pub const NOTES_DIR: &str = "notes";
/// The reference policy, shipped as `fixtures/policy.json`.
pub const REFERENCE_POLICY: &str = include_str!("../../../fixtures/policy.json");

/// Where the server keeps its state and which policy it enforces.
#[derive(Debug, Clone)]
pub struct ServerPaths {
    /// The policy file, loaded once at start.
    pub policy: PathBuf,
    /// The ledger directory: `audit.jsonl` and `notes/`.
    pub ledger: PathBuf,
}

/// The gated handler, ready to serve.
pub type GatedServer = Gated<tools::NotesServer>;

/// Loads the policy, then opens the ledger, then builds the gate.
///
/// The policy comes first on purpose: an invalid policy must stop the process before anything is
/// created or written under the ledger directory.
pub fn build(paths: &ServerPaths) -> anyhow::Result<GatedServer> {
    let policy = Policy::load(&paths.policy)?;

    #[cfg(feature = "fault-injection")]
    let hook = fault::hook_from_env()?;

    let audit_config = AuditConfig::new(paths.ledger.join(AUDIT_FILE));
    #[cfg(feature = "fault-injection")]
    let audit_config = match &hook {
        Some(hook) => audit_config.fault_hook(hook.clone()),
        None => audit_config,
    };
    let audit = FileAuditLog::open_with(audit_config)
        .with_context(|| format!("cannot open the audit log in {}", paths.ledger.display()))?;
    if let Some(recovery) = audit.recovered() {
        tracing::warn!(?recovery, "repaired a torn audit tail left by a crash");
    }

    let store_config = CommitConfig::new(paths.ledger.join(NOTES_DIR));
    #[cfg(feature = "fault-injection")]
    let store_config = match hook {
        Some(hook) => store_config.fault_hook(hook),
        None => store_config,
    };
    let store = FileCommitStore::open_with(store_config)
        .with_context(|| format!("cannot open the notes store in {}", paths.ledger.display()))?;

    let audit: Arc<dyn AuditSink> = Arc::new(audit);
    let store: Arc<dyn CommitStore> = Arc::new(store);
    Ok(Gated::builder(tools::NotesServer::new())
        .policy(policy)
        .audit(audit)
        .commit_store(store)
        .build()?)
}

/// Serves MCP over stdin/stdout until the client closes the connection.
pub async fn serve_stdio(gated: GatedServer) -> anyhow::Result<()> {
    let (stdin, stdout) = rmcp::transport::stdio();
    let running = match gated.serve((stdin, stdout)).await {
        Ok(running) => running,
        // A client that connects and leaves before its first request is not a server failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(error) => return Err(error).context("the MCP session could not start"),
    };
    running
        .waiting()
        .await
        .context("the MCP session ended abnormally")?;
    Ok(())
}

/// Verifies `LEDGER_DIR/audit.jsonl`.
pub fn verify_ledger(ledger: &Path) -> anyhow::Result<VerifyReport> {
    let path = ledger.join(AUDIT_FILE);
    if !path.exists() {
        anyhow::bail!(
            "no audit log at {}; pass the ledger directory with --ledger or LEDGER_DIR",
            path.display()
        );
    }
    Ok(toolgate_audit::verify_file(&path)?)
}
