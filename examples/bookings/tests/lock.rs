//! The tool contracts of bookings-mcp match the committed toolgate.lock (update it with
//! `TOOLGATE_UPDATE_LOCK=1 cargo test -p bookings --test lock`).

#[test]
fn toolgate_lock_matches_the_tools() {
    let tools = bookings::Bookings::tools();
    let check =
        toolgate::contract::LockCheck::in_crate(env!("CARGO_MANIFEST_DIR"), "bookings-mcp", tools);
    let report = toolgate::contract::check_lock(&check).unwrap();
    assert!(report.passed(), "{report}");
}
