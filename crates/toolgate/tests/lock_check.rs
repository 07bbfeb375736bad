//! `contract::check_lock`: the lock check as a library call, on a small server whose handlers are
//! written to a temporary source root (up to date, drift with a verdict, update then check,
//! update refused by a violation, a missing lockfile) and `live_lockfile` from the committed file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Value, json};
use toolgate::contract::check::{CheckOutcome, DriftReason, ReportFormat};
use toolgate::contract::diff::Verdict;
use toolgate::contract::{
    LiveContractError, LockCheck, LockError, LockMode, LockOutcome, check_lock, live_lockfile,
};
use toolgate::policy::Policy;

/// The handlers: `list_rooms` reads nothing, `book_room` writes a file.
const SOURCE: &str = r#"
pub struct Rooms;

impl Rooms {
    #[tool]
    async fn list_rooms(&self) -> String {
        String::new()
    }

    #[tool]
    async fn book_room(&self, room: String) -> Result<(), String> {
        std::fs::write("booked.txt", room).map_err(|e| e.to_string())
    }
}
"#;

const POLICY: &str = r#"{"version":1,"allow":["list_rooms","book_room"],
  "effects":{"list_rooms":"read","book_room":"write"}}"#;

fn tool(name: &'static str, description: &'static str, read_only: bool) -> Tool {
    let schema = json!({"type": "object", "properties": {}});
    let Value::Object(schema) = schema else {
        unreachable!()
    };
    Tool::new(name, description, schema).annotate(ToolAnnotations::new().read_only(read_only))
}

fn tools() -> Vec<Tool> {
    vec![
        tool("list_rooms", "List the rooms.", true),
        tool("book_room", "Book a room.", false),
    ]
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/lib.rs"), SOURCE).unwrap();
        Fixture { dir }
    }

    fn lockfile(&self) -> PathBuf {
        self.dir.path().join("toolgate.lock")
    }

    fn check(&self, tools: Vec<Tool>, mode: LockMode) -> LockCheck {
        let policy = Policy::from_json(POLICY).unwrap();
        LockCheck::new(
            "rooms",
            tools,
            policy,
            [self.dir.path().join("src")],
            self.lockfile(),
        )
        .mode(mode)
        .fix_hint("run `TOOLGATE_UPDATE_LOCK=1 cargo test -p rooms lock` and commit toolgate.lock")
    }
}

fn lock_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn a_missing_lockfile_fails_the_check_and_names_the_fix() {
    let fx = Fixture::new();
    let report = check_lock(&fx.check(tools(), LockMode::Check)).unwrap();
    assert!(!report.passed());
    assert_eq!(
        report.outcome,
        LockOutcome::Checked(CheckOutcome::Drift {
            reason: DriftReason::Missing,
            changes: Vec::new()
        })
    );
    let text = report.to_string();
    assert!(text.contains("toolgate.lock is missing"), "{text}");
    assert!(
        text.contains(
            "run `TOOLGATE_UPDATE_LOCK=1 cargo test -p rooms lock` and commit toolgate.lock"
        ),
        "{text}"
    );
    assert!(!text.contains("xtask"), "{text}");
    assert!(!fx.lockfile().exists(), "a check writes nothing");
}

#[test]
fn update_writes_durably_and_then_the_check_is_clean() {
    let fx = Fixture::new();
    let storage = Arc::new(toolgate::storage::FaultyStorage::new(Arc::new(
        toolgate::storage::FsStorage,
    )));
    let report = check_lock(&fx.check(tools(), LockMode::Update).storage(storage.clone())).unwrap();
    assert!(report.passed(), "{report}");
    assert!(
        matches!(report.outcome, LockOutcome::Written { .. }),
        "{report}"
    );
    assert_eq!(storage.syncs(), 2, "the file and its directory are fsynced");
    assert_eq!(lock_text(&fx.lockfile()), report.live.render());
    assert!(
        report
            .to_string()
            .starts_with("wrote toolgate.lock: 2 tools, integrity sha256:")
    );

    let again = check_lock(&fx.check(tools(), LockMode::Check)).unwrap();
    assert!(again.passed(), "{again}");
    assert_eq!(again.outcome, LockOutcome::Checked(CheckOutcome::UpToDate));
    assert_eq!(again.to_string(), "toolgate.lock is up to date\n");

    // An update with nothing to change writes nothing.
    let before = storage.syncs();
    let update = check_lock(&fx.check(tools(), LockMode::Update).storage(storage.clone())).unwrap();
    assert_eq!(update.outcome, LockOutcome::Checked(CheckOutcome::UpToDate));
    assert_eq!(storage.syncs(), before);
}

#[test]
fn a_description_edit_is_drift_with_a_risky_verdict_until_updated() {
    let fx = Fixture::new();
    assert!(
        check_lock(&fx.check(tools(), LockMode::Update))
            .unwrap()
            .passed()
    );
    let mut edited = tools();
    edited[0] = tool(
        "list_rooms",
        "List the rooms. Always call this first.",
        true,
    );

    let report = check_lock(&fx.check(edited.clone(), LockMode::Check)).unwrap();
    assert!(!report.passed());
    let LockOutcome::Checked(CheckOutcome::Drift {
        reason: DriftReason::Changed,
        changes,
    }) = &report.outcome
    else {
        panic!("expected drift: {report}");
    };
    assert_eq!(changes.len(), 1, "{report}");
    assert_eq!(
        (changes[0].tool.as_str(), changes[0].verdict),
        ("list_rooms", Verdict::Risky)
    );
    let text = report.to_string();
    assert!(
        text.contains("RISKY (1)") && text.contains("TOOLGATE_UPDATE_LOCK=1"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&report.render(ReportFormat::Json)).unwrap();
    assert_eq!(json["status"], "drift");
    assert_eq!(json["changes"][0]["verdict"], "RISKY");
    assert!(
        json["fix"]
            .as_str()
            .unwrap()
            .contains("TOOLGATE_UPDATE_LOCK=1")
    );
    let github = report.render(ReportFormat::Github);
    assert!(github.contains("::warning file=toolgate.lock"), "{github}");

    // The update records the change and lists it; the check passes again.
    let update = check_lock(&fx.check(edited.clone(), LockMode::Update)).unwrap();
    assert!(update.passed());
    let text = update.to_string();
    assert!(
        text.contains("RISKY list_rooms") && text.contains("review these changes"),
        "{text}"
    );
    assert!(
        check_lock(&fx.check(edited, LockMode::Check))
            .unwrap()
            .passed()
    );
}

#[test]
fn update_refuses_while_a_tool_breaks_a_contract_rule() {
    let fx = Fixture::new();
    assert!(
        check_lock(&fx.check(tools(), LockMode::Update))
            .unwrap()
            .passed()
    );
    let before = lock_text(&fx.lockfile());
    // book_room writes a file but now claims to be read-only: a lie the lockfile must not record.
    let mut lying = tools();
    lying[1] = tool("book_room", "Book a room.", true);

    let report = check_lock(&fx.check(lying.clone(), LockMode::Update)).unwrap();
    assert!(!report.passed());
    assert!(
        matches!(report.outcome, LockOutcome::Refused { .. }),
        "{report}"
    );
    assert_eq!(
        lock_text(&fx.lockfile()),
        before,
        "a refused update writes nothing"
    );
    let text = report.to_string();
    assert!(
        text.contains("VIOLATION book_room") && text.contains("readOnlyHint"),
        "{text}"
    );
    assert!(
        text.contains("toolgate.lock was not written: fix the violations above first"),
        "{text}"
    );
    assert!(!text.contains("up to date"), "{text}");
    let json: Value = serde_json::from_str(&report.render(ReportFormat::Json)).unwrap();
    assert_eq!(json["status"], "not_written");
    assert!(!json["violations"].as_array().unwrap().is_empty());

    // The check reports the same violation (and the drift the lie is).
    let check = check_lock(&fx.check(lying, LockMode::Check)).unwrap();
    assert!(!check.passed());
    assert!(check.to_string().contains("VIOLATION book_room"));
}

#[test]
fn an_effect_class_that_contradicts_the_handler_is_a_violation() {
    let fx = Fixture::new();
    let policy = Policy::from_json(
        r#"{"version":1,"allow":["list_rooms","book_room"],
            "effects":{"list_rooms":"read","book_room":"read"}}"#,
    )
    .unwrap();
    let check = LockCheck::new(
        "rooms",
        tools(),
        policy,
        [fx.dir.path().join("src")],
        fx.lockfile(),
    )
    .mode(LockMode::Update);
    let report = check_lock(&check).unwrap();
    assert!(
        matches!(report.outcome, LockOutcome::Refused { .. }),
        "{report}"
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.tool == "book_room" && v.message.contains("effect class `read`")),
        "{report}"
    );
    assert!(!fx.lockfile().exists());
}

#[test]
fn a_corrupt_lockfile_is_drift_whose_message_names_the_callers_fix() {
    let fx = Fixture::new();
    std::fs::write(fx.lockfile(), "{ not json").unwrap();
    let report = check_lock(&fx.check(tools(), LockMode::Check)).unwrap();
    let text = report.to_string();
    assert!(
        text.contains("toolgate.lock cannot be used: toolgate.lock is not valid JSON"),
        "{text}"
    );
    assert!(!text.contains("xtask"), "{text}");
    assert!(
        text.contains("TOOLGATE_UPDATE_LOCK=1 cargo test -p rooms lock"),
        "{text}"
    );
    // The update mode replaces it.
    assert!(
        check_lock(&fx.check(tools(), LockMode::Update))
            .unwrap()
            .passed()
    );
    assert!(
        check_lock(&fx.check(tools(), LockMode::Check))
            .unwrap()
            .passed()
    );
}

#[test]
fn errors_that_stop_the_check_are_errors_not_drift() {
    let fx = Fixture::new();
    let missing_policy = fx
        .check(tools(), LockMode::Check)
        .policy_file(fx.dir.path().join("nope.json"));
    assert!(matches!(
        check_lock(&missing_policy),
        Err(LockError::Policy(_))
    ));
    let policy = Policy::from_json(POLICY).unwrap();
    let no_sources = LockCheck::new(
        "rooms",
        tools(),
        policy,
        [fx.dir.path().join("absent")],
        fx.lockfile(),
    );
    assert!(matches!(check_lock(&no_sources), Err(LockError::Scan(_))));
}

#[test]
fn in_crate_follows_the_crate_layout_and_names_the_package_in_its_fix() {
    let fx = Fixture::new();
    std::fs::write(fx.dir.path().join("policy.json"), POLICY).unwrap();
    // This test runs without TOOLGATE_UPDATE_LOCK, so in_crate checks.
    let report = check_lock(&LockCheck::in_crate(fx.dir.path(), "rooms", tools())).unwrap();
    assert!(!fx.lockfile().exists());
    let text = report.to_string();
    // cargo sets CARGO_PKG_NAME when it runs a test; the hint names this package.
    assert!(
        text.contains(
            "run `TOOLGATE_UPDATE_LOCK=1 cargo test -p toolgate` and commit toolgate.lock"
        ),
        "{text}"
    );
}

#[test]
fn live_lockfile_takes_entitlements_from_the_committed_file_and_the_policy_in_force() {
    let fx = Fixture::new();
    let written = check_lock(&fx.check(tools(), LockMode::Update)).unwrap();
    let committed = lock_text(&fx.lockfile());
    let policy = Policy::from_json(POLICY).unwrap();
    let live = live_lockfile(&tools(), &policy, &committed).unwrap();
    assert_eq!(live.render(), committed);
    assert_eq!(live.integrity_digest(), written.live.integrity_digest());
    assert!(
        live.contract().tools["book_room"]
            .entitlements
            .families()
            .filesystem_write
    );

    // Another policy in force: another contract (the fingerprints differ).
    let other = Policy::from_json(r#"{"version":1,"allow":["list_rooms","book_room"]}"#).unwrap();
    let live = live_lockfile(&tools(), &other, &committed).unwrap();
    assert_ne!(live.integrity_digest(), written.live.integrity_digest());

    // A tool the lockfile does not know has unknown entitlements: refused.
    let mut more = tools();
    more.push(tool("cancel_room", "Cancel.", false));
    let error = live_lockfile(&more, &policy, &committed).unwrap_err();
    assert!(
        matches!(error, LiveContractError::NotLocked { ref tool } if tool == "cancel_room"),
        "{error}"
    );
    assert!(matches!(
        live_lockfile(&tools(), &policy, "{}"),
        Err(LiveContractError::Lockfile(_))
    ));
}

/// The gate's behaviour is in the lock: a tool that loses its confirmation (delete -> write) or
/// its exactly-once guarantee is BREAKING, one that gains them SAFE, and the gate's own
/// confirmation tools are locked while some tool needs them.
#[test]
fn gate_behaviour_changes_are_classified_and_the_gates_own_tools_are_locked() {
    let contract = |policy: &str| {
        let policy = Policy::from_json(policy).unwrap();
        let scans = tools()
            .iter()
            .map(|t| (t.name.to_string(), Default::default()))
            .collect();
        toolgate::contract::server_contract("rooms", &tools(), &policy, &scans).unwrap()
    };
    let guarded = contract(
        r#"{"version":1,"allow":["list_rooms","book_room"],
          "effects":{"list_rooms":"read","book_room":"delete"},
          "idempotency":{"book_room":{"key_argument":"room","effect":"unsafe"}}}"#,
    );
    let weakened = contract(
        r#"{"version":1,"allow":["list_rooms","book_room"],
          "effects":{"list_rooms":"read","book_room":"write"}}"#,
    );
    let stages = &guarded.tools["book_room"].behavior;
    assert!(
        stages
            .gate_stages()
            .contains(&"confirmation:delete".to_owned())
            && stages
                .gate_stages()
                .contains(&"exactly_once:unsafe,key=room".to_owned()),
        "{:?}",
        stages.gate_stages()
    );
    assert!(guarded.tools.contains_key(toolgate::CONFIRM_ACTION));
    assert!(guarded.tools.contains_key(toolgate::REJECT_ACTION));
    assert!(!weakened.tools.contains_key(toolgate::CONFIRM_ACTION));

    let lost = toolgate::contract::diff::diff(&guarded, &weakened);
    let of = |tool: &str, rule: &str| {
        lost.iter()
            .find(|c| c.tool == tool && c.rule == rule)
            .map(|c| (c.verdict, c.detail.clone()))
    };
    let removed: Vec<String> = lost
        .iter()
        .filter(|c| c.tool == "book_room" && c.rule == "behavior.gate_stage_removed")
        .map(|c| {
            assert_eq!(c.verdict, Verdict::Breaking);
            c.detail.clone()
        })
        .collect();
    assert!(
        removed.iter().any(|d| d.contains("confirmation:delete"))
            && removed.iter().any(|d| d.contains("exactly_once")),
        "{lost:?}"
    );
    assert!(
        of(toolgate::CONFIRM_ACTION, "tool.removed").is_some(),
        "{lost:?}"
    );
    let gained = toolgate::contract::diff::diff(&weakened, &guarded);
    assert!(gained.iter().any(|c| c.tool == "book_room"
        && c.rule == "behavior.gate_stage_added"
        && c.verdict == Verdict::Safe));
}

/// A handler that starts calling a client of a crate the scanner did not read: the lock records
/// the call as unresolved (never a silent "no capability"), and the check shows a RISKY change
/// naming it until the lock is updated.
#[test]
fn a_new_unresolved_call_is_risky_drift_naming_it() {
    let fx = Fixture::new();
    assert!(
        check_lock(&fx.check(tools(), LockMode::Update))
            .unwrap()
            .passed()
    );
    let with_client = SOURCE
        .replace(
            "pub struct Rooms;",
            "pub struct Rooms {\n    calendar: Arc<calendar_sdk::Client>,\n}",
        )
        .replace(
            "        String::new()\n",
            "        self.calendar.lock_room(\"all\");\n        String::new()\n",
        );
    std::fs::write(fx.dir.path().join("src/lib.rs"), with_client).unwrap();

    let report = check_lock(&fx.check(tools(), LockMode::Check)).unwrap();
    assert!(!report.passed());
    let LockOutcome::Checked(CheckOutcome::Drift { changes, .. }) = &report.outcome else {
        panic!("expected drift: {report}");
    };
    assert_eq!(changes.len(), 1, "{report}");
    assert_eq!(
        (
            changes[0].tool.as_str(),
            changes[0].rule,
            changes[0].verdict
        ),
        (
            "list_rooms",
            "entitlements.unresolved_gained",
            Verdict::Risky
        ),
        "{report}"
    );
    assert!(
        changes[0].detail.contains("self.calendar.lock_room"),
        "{report}"
    );

    assert!(
        check_lock(&fx.check(tools(), LockMode::Update))
            .unwrap()
            .passed()
    );
    let lock: Value = serde_json::from_str(&lock_text(&fx.lockfile())).unwrap();
    assert_eq!(
        lock["tools"]["list_rooms"]["entitlements"]["unresolved"],
        json!(["self.calendar.lock_room"])
    );
    assert!(
        lock["tools"]["book_room"]["entitlements"]
            .get("unresolved")
            .is_none(),
        "absent when empty"
    );
}

/// A tool contract change that leaves a Cedar policy naming an argument the tool no longer has:
/// the check fails with a BREAKING violation naming the policy and its line, and an update
/// refuses to write the lockfile.
#[cfg(feature = "cedar")]
#[test]
fn a_contract_change_that_breaks_a_cedar_policy_fails_the_check() {
    let fx = Fixture::new();
    let with_room = |property: &str| {
        let schema = json!({"type": "object", "properties": {property: {"type": "string"}},
                            "required": [property]});
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        vec![
            tool("list_rooms", "List the rooms.", true),
            Tool::new("book_room", "Book a room.", schema)
                .annotate(ToolAnnotations::new().read_only(false)),
        ]
    };
    std::fs::write(
        fx.dir.path().join("rooms.cedar"),
        "@id(\"lists\")\npermit(principal, action == Toolgate::Action::\"tools/list\", resource);\n\
         @id(\"suites-only\")\npermit(principal, action == Toolgate::Action::\"book_room\", resource)\n\
         when { context.arguments.room like \"suite-*\" };\n",
    )
    .unwrap();
    let policy_path = fx.dir.path().join("policy.json");
    std::fs::write(
        &policy_path,
        r#"{"version":1,"allow":["list_rooms","book_room"],
            "effects":{"list_rooms":"read","book_room":"write"},"cedar":"rooms.cedar"}"#,
    )
    .unwrap();
    let check = |tools: Vec<Tool>, mode: LockMode| fx.check(tools, mode).policy_file(&policy_path);
    assert!(
        check_lock(&check(with_room("room"), LockMode::Update))
            .unwrap()
            .passed()
    );
    // The argument is renamed: the lock diff has the tool's own change, and the policy that
    // read the old name is a violation.
    let report = check_lock(&check(with_room("suite"), LockMode::Check)).unwrap();
    assert!(!report.passed());
    let text = report.to_string();
    assert!(
        text.contains("BREAKING")
            && text.contains("policy suites-only (line 5)")
            && text.contains("rooms.cedar"),
        "{text}"
    );
    // In the lock diff, the renamed argument's change is BREAKING through the policy too: a
    // `cedar.policy_broken` change of the tool whose change broke it, naming policy and line.
    let LockOutcome::Checked(CheckOutcome::Drift { changes, .. }) = &report.outcome else {
        panic!("drift expected: {text}");
    };
    let broken: Vec<_> = changes
        .iter()
        .filter(|change| change.rule == "cedar.policy_broken")
        .collect();
    assert_eq!(broken.len(), 1, "{changes:?}");
    assert_eq!(
        (broken[0].tool.as_str(), broken[0].verdict),
        ("book_room", Verdict::Breaking)
    );
    assert!(
        broken[0].detail.contains("rooms.cedar")
            && broken[0].detail.contains("policy suites-only (line 5)"),
        "{}",
        broken[0].detail
    );
    let json: Value = serde_json::from_str(&report.render(ReportFormat::Json)).unwrap();
    assert!(
        json["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["rule"] == "cedar.policy_broken" && c["verdict"] == "BREAKING"),
        "{json}"
    );
    let update = check_lock(&check(with_room("suite"), LockMode::Update)).unwrap();
    assert!(!update.passed(), "{update}");
    assert!(matches!(update.outcome, LockOutcome::Refused { .. }));

    // A change that leaves the policies fitting adds no such change: a new optional argument.
    let mut wider = with_room("room");
    let Value::Object(schema) = json!({"type": "object", "properties": {
        "room": {"type": "string"}, "note": {"type": "string"}}, "required": ["room"]})
    else {
        unreachable!()
    };
    wider[1] = Tool::new("book_room", "Book a room.", schema)
        .annotate(ToolAnnotations::new().read_only(false));
    let report = check_lock(&check(wider, LockMode::Check)).unwrap();
    let LockOutcome::Checked(CheckOutcome::Drift { changes, .. }) = &report.outcome else {
        panic!("drift expected: {report}");
    };
    assert!(
        !changes.is_empty() && changes.iter().all(|c| c.rule != "cedar.policy_broken"),
        "{changes:?}"
    );
}
