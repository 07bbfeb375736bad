//! Scanner throughput: find_tool_handlers + scan_handlers over the workspace's `crates/`, in
//! lines per second. Needs `[[bench]] name = "scan" harness = false` in the crate's manifest.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use toolgate_scan::{find_tool_handlers, scan_handlers_with_stats};

const ROUNDS: u32 = 20;

// Under the default libtest harness (before the manifest says `harness = false`) this `main` is
// not the entry point and would be reported as dead code.
#[allow(dead_code)]
fn main() {
    let roots = [Path::new(env!("CARGO_MANIFEST_DIR")).join("..")];
    // One warm-up round fills the page cache, so the rounds measure parsing and analysis.
    let handlers = find_tool_handlers(&roots).expect("the workspace parses");
    let mut best = Duration::MAX;
    let mut total = Duration::ZERO;
    let mut stats = None;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let handlers = find_tool_handlers(&roots).expect("the workspace parses");
        let (reports, s) = scan_handlers_with_stats(&roots, &handlers).expect("the scan succeeds");
        let elapsed = start.elapsed();
        assert_eq!(reports.len(), handlers.len().min(reports.len()));
        best = best.min(elapsed);
        total += elapsed;
        stats = Some(s);
    }
    let stats = stats.expect("ROUNDS > 0");
    // Each round parses the sources twice (once per call), so the line count is doubled.
    let lines = 2.0 * stats.lines as f64;
    let mean = total / ROUNDS;
    println!(
        "scan: {} files, {} lines, {} tools; find+scan best {:.1} ms, mean {:.1} ms; {:.0} lines/s (best), {:.0} lines/s (mean)",
        stats.files,
        stats.lines,
        handlers.len(),
        best.as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3,
        lines / best.as_secs_f64(),
        lines / mean.as_secs_f64(),
    );
}
