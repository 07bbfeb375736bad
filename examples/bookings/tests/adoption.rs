//! What adopting toolgate costs this server: the ungated server (`src/lib.rs`) knows nothing of
//! it, and the Rust that adoption adds (policy, audit, exactly-once, confirmation, kill switch,
//! operator commands, published contract, lock check) stays within 20 lines.

use std::path::Path;

/// The `main` the server had before adoption (`examples/ungated.rs`, compiled and formatted
/// with the crate, so it cannot drift from the library).
const UNGATED_MAIN: &str = include_str!("../examples/ungated.rs");

/// The most lines of Rust adoption may add.
const BUDGET: usize = 20;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Lines that are neither blank nor only a comment (`//`, `//!`, `///`).
fn code_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .count()
}

#[test]
fn the_ungated_server_does_not_mention_toolgate() {
    let lib = read("src/lib.rs");
    assert!(
        !lib.to_lowercase().contains("toolgate"),
        "src/lib.rs is the server before adoption; keep toolgate out of it"
    );
}

#[test]
fn adoption_adds_at_most_twenty_lines_of_rust() {
    let gated = code_lines(&read("src/main.rs")) + code_lines(&read("tests/lock.rs"));
    let ungated = code_lines(UNGATED_MAIN);
    let added = gated - ungated;
    eprintln!(
        "src/main.rs + tests/lock.rs: {gated} lines of code, the ungated main {ungated}: {added} added"
    );
    assert!(
        added <= BUDGET,
        "adopting toolgate costs {added} lines of Rust here, over the budget of {BUDGET}"
    );
}
