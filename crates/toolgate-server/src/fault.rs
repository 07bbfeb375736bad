//! Crash points for crash-consistency tests (feature `fault-injection` only).
//!
//! With `TOOLGATE_CRASH_POINT=<name>` and `TOOLGATE_CRASH_MARKER=<path>` set, reaching the named
//! point creates the marker file and sleeps 30 s, so a test can SIGKILL the process exactly there.

use std::path::PathBuf;
use std::sync::Arc;

// The audit and commit crates declare the same hook type; one value serves both.
const _: fn(toolgate_audit::FaultHook) -> toolgate_commit::FaultHook = |hook| hook;
use std::time::Duration;

/// The points the server's storage crates report, as fixed by DESIGN.md part 2.
const POINTS: [&str; 3] = [
    "commit.before_publish",
    "commit.after_publish",
    "audit.mid_record",
];

/// The hook described by the environment, or `None` when no crash point is requested.
pub(crate) fn hook_from_env() -> anyhow::Result<Option<toolgate_audit::FaultHook>> {
    let Ok(point) = std::env::var("TOOLGATE_CRASH_POINT") else {
        return Ok(None);
    };
    if !POINTS.contains(&point.as_str()) {
        anyhow::bail!(
            "unknown TOOLGATE_CRASH_POINT {point:?}; use one of {}",
            POINTS.join(", ")
        );
    }
    let marker = std::env::var_os("TOOLGATE_CRASH_MARKER").map(PathBuf::from).ok_or_else(|| {
        anyhow::anyhow!("TOOLGATE_CRASH_POINT is set but TOOLGATE_CRASH_MARKER is not; set it to the marker file path")
    })?;
    tracing::warn!(%point, "fault injection armed");
    Ok(Some(Arc::new(move |reached: &'static str| {
        if reached == point {
            if let Err(error) = std::fs::write(&marker, reached) {
                tracing::error!(%error, "cannot create the crash marker");
            }
            std::thread::sleep(Duration::from_secs(30));
        }
    })))
}
