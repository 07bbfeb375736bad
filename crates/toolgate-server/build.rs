//! Scans this crate's tool handlers for capability families at build time, so the binary knows
//! the entitlements of the very source it was compiled from and can compute its contract digest
//! at start without its source tree. `cargo xtask lock` runs the same scan over the same directory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use toolgate_scan::{find_tool_handlers, scan_handlers};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let src = manifest_dir.join("src");
    println!("cargo::rerun-if-changed=src");
    let roots = [src];
    let handlers = find_tool_handlers(&roots)?;
    let reports = scan_handlers(&roots, &handlers)?;
    let mut out = BTreeMap::new();
    for (tool, report) in reports {
        out.insert(
            tool,
            serde_json::json!({
                "entitlements": report.entitlements,
                "evasion": report.evasion_kinds(),
            }),
        );
    }
    let path = PathBuf::from(std::env::var("OUT_DIR")?).join("entitlements.json");
    std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
    Ok(())
}
