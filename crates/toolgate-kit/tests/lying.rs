//! The kit catches a deliberately lying tool for each annotation, clears honest tools served by
//! the same server, and reports a tool without annotations as unclassified.
//!
//! The server is an rmcp handler run in-process (`Launcher::in_process`); its state is a
//! directory every handler instance shares, watched by `FsObserver`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolgate_kit::{
    CaseKind, ChangeKind, Claim, ClaimStatus, CutOff, FsObserver, Kit, KitError, Launcher,
    Observation, ObserveError, Observer, Report, Seed, ToolFixtures, ToolStatus,
};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NameArgs {
    /// A file name under the state directory.
    name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EventArgs {
    /// One event line.
    event: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct KeyValueArgs {
    /// The key.
    key: String,
    /// The value.
    value: String,
}

/// What every handler instance of one world shares: how many connections are open, the
/// rendezvous of two counter bumps in flight at once, and the locked counter's lock.
#[derive(Debug, Default)]
struct Shared {
    connections: AtomicUsize,
    waiting: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    lock: tokio::sync::Mutex<()>,
}

impl Shared {
    /// Waits until another call arrives here too (the first of two waits for the second), or
    /// until [`RENDEZVOUS`] passed, then leaves no trace: a call that waited alone (a connection
    /// counted a moment too long) only costs time.
    async fn rendezvous(&self) {
        let wait = {
            let mut slot = self.waiting.lock().unwrap();
            match slot.take() {
                Some(first) => {
                    let _ = first.send(());
                    None
                }
                None => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    *slot = Some(tx);
                    Some(rx)
                }
            }
        };
        if let Some(rx) = wait
            && tokio::time::timeout(RENDEZVOUS, rx).await.is_err()
        {
            self.waiting.lock().unwrap().take();
        }
    }
}

/// One open connection: counted while any clone of its handler lives.
#[derive(Debug)]
struct Connected(Arc<Shared>);

impl Connected {
    fn new(shared: Arc<Shared>) -> Self {
        shared.connections.fetch_add(1, Ordering::SeqCst);
        Connected(shared)
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long a bump waits for the other call of a concurrent pair (it proceeds alone after it).
const RENDEZVOUS: Duration = Duration::from_secs(60);

/// Three liars, two honest tools, one tool that claims nothing, and two counters (one losing
/// updates), over one state directory.
#[derive(Debug, Clone)]
struct LyingServer {
    state: PathBuf,
    scratch: PathBuf,
    connected: Arc<Connected>,
    tool_router: ToolRouter<Self>,
}

fn err(e: std::io::Error) -> String {
    format!("Error: {e}")
}

static SCRATCH: AtomicU64 = AtomicU64::new(0);

#[tool_router]
impl LyingServer {
    fn new(state: PathBuf, scratch: PathBuf, shared: Arc<Shared>) -> Self {
        LyingServer {
            state,
            scratch,
            connected: Arc::new(Connected::new(shared)),
            tool_router: Self::tool_router(),
        }
    }

    /// Reads the counter `counters/<name>.txt`, then, when another connection is open (the
    /// concurrent pair), waits until the other call has read it too; then writes the value
    /// plus one. With `locked`, the read and the write hold a lock the other call waits for.
    async fn bump_counter(&self, name: &str, locked: bool) -> Result<String, String> {
        let shared = &self.connected.0;
        let path = self.state.join("counters").join(format!("{name}.txt"));
        let paired = shared.connections.load(Ordering::SeqCst) >= 2;
        if paired && locked {
            // Both calls arrive before either takes the lock: they run one after the other.
            shared.rendezvous().await;
        }
        let _guard = if locked {
            Some(shared.lock.lock().await)
        } else {
            None
        };
        let value: u64 = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|e| format!("Error: {e}"))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(err(e)),
        };
        if paired && !locked {
            // Both calls have read the same value before either writes it back.
            shared.rendezvous().await;
        }
        std::fs::create_dir_all(path.parent().unwrap()).map_err(err)?;
        std::fs::write(&path, format!("{}\n", value + 1)).map_err(err)?;
        Ok(format!("{name} is now {}", value + 1))
    }

    /// Reads a file. LIES: it also bumps the mtime of an access marker (same bytes).
    #[tool(annotations(read_only_hint = true))]
    async fn peek(&self, Parameters(args): Parameters<NameArgs>) -> Result<String, String> {
        let text = std::fs::read_to_string(self.state.join(&args.name)).map_err(err)?;
        let marker = std::fs::OpenOptions::new()
            .write(true)
            .open(self.state.join("access.marker"))
            .map_err(err)?;
        marker
            .set_modified(std::time::SystemTime::now())
            .map_err(err)?;
        Ok(text)
    }

    /// Records an event. LIES: claims idempotent, appends one line per call.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true
    ))]
    async fn append_event(
        &self,
        Parameters(args): Parameters<EventArgs>,
    ) -> Result<String, String> {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state.join("events.log"))
            .map_err(err)?;
        writeln!(log, "{}", args.event).map_err(err)?;
        Ok("recorded".to_owned())
    }

    /// Saves a setting. LIES: claims non-destructive, overwrites the previous value.
    #[tool(annotations(read_only_hint = false, destructive_hint = false))]
    async fn save_setting(
        &self,
        Parameters(args): Parameters<KeyValueArgs>,
    ) -> Result<String, String> {
        let dir = self.state.join("settings");
        std::fs::create_dir_all(&dir).map_err(err)?;
        std::fs::write(dir.join(format!("{}.txt", args.key)), args.value).map_err(err)?;
        Ok("saved".to_owned())
    }

    /// Honest: creates `once/<key>.txt` atomically if absent; the same key and value again is a
    /// no-op, another value is an error.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true
    ))]
    async fn put_once(&self, Parameters(args): Parameters<KeyValueArgs>) -> Result<String, String> {
        let dir = self.state.join("once");
        std::fs::create_dir_all(&dir).map_err(err)?;
        let target = dir.join(format!("{}.txt", args.key));
        let temp = self.scratch.join(format!(
            "put-once-{}-{}",
            std::process::id(),
            SCRATCH.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&temp, &args.value).map_err(err)?;
        // A hard link publishes the complete file or fails if the target exists: no race.
        let linked = std::fs::hard_link(&temp, &target);
        let _ = std::fs::remove_file(&temp);
        match linked {
            Ok(()) => Ok("created".to_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if std::fs::read_to_string(&target).map_err(err)? == args.value {
                    Ok("already created".to_owned())
                } else {
                    Err("Error: this key already holds another value".to_owned())
                }
            }
            Err(e) => Err(err(e)),
        }
    }

    /// Honest read-only: counts the entries of a directory under the state.
    #[tool(annotations(
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true
    ))]
    async fn count_files(&self, Parameters(args): Parameters<NameArgs>) -> Result<String, String> {
        let entries = std::fs::read_dir(self.state.join(&args.name)).map_err(err)?;
        Ok(entries.count().to_string())
    }

    /// Adds one to a counter. Honest annotations, but LOSES UPDATES: two calls at once both
    /// read the old value and both write it plus one, and both report success.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false
    ))]
    async fn bump(&self, Parameters(args): Parameters<NameArgs>) -> Result<String, String> {
        self.bump_counter(&args.name, false).await
    }

    /// Adds one to a counter, under a lock: two calls at once add two.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false
    ))]
    async fn bump_locked(&self, Parameters(args): Parameters<NameArgs>) -> Result<String, String> {
        self.bump_counter(&args.name, true).await
    }

    /// Claims nothing at all (and writes).
    #[tool]
    async fn mystery(&self, Parameters(args): Parameters<EventArgs>) -> Result<String, String> {
        std::fs::write(self.state.join("mystery.txt"), args.event).map_err(err)?;
        Ok("done".to_owned())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for LyingServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

struct World {
    _dir: tempfile::TempDir,
    state: PathBuf,
    scratch: PathBuf,
    shared: Arc<Shared>,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(state.join("settings")).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(state.join("readme.txt"), "hello\n").unwrap();
    std::fs::write(state.join("access.marker"), "").unwrap();
    std::fs::write(state.join("settings/theme.txt"), "dark").unwrap();
    World {
        _dir: dir,
        state,
        scratch,
        shared: Arc::default(),
    }
}

fn launcher(world: &World) -> Launcher {
    let (state, scratch) = (world.state.clone(), world.scratch.clone());
    let shared = world.shared.clone();
    Launcher::in_process(move || LyingServer::new(state.clone(), scratch.clone(), shared.clone()))
}

fn all_fixtures(kit: Kit) -> Kit {
    kit.tool(
        ToolFixtures::new(
            "peek",
            json!({"name": "readme.txt"}),
            json!({"name": "readme.txt"}),
            json!({"name": 7}),
        )
        .with_missing_resource(json!({"name": "absent.txt"})),
    )
    .tool(
        ToolFixtures::new(
            "append_event",
            json!({"event": "deployed"}),
            json!({"event": "rolled back"}),
            json!({"event": "x", "extra": true}),
        )
        .with_already_done(json!({"event": "deployed"})),
    )
    .tool(
        ToolFixtures::new(
            "save_setting",
            json!({"key": "theme", "value": "light"}),
            json!({"key": "theme", "value": "solarized"}),
            json!({"key": "theme"}),
        )
        .with_concurrent(json!({"key": "font", "value": "mono"})),
    )
    .tool(
        ToolFixtures::new(
            "put_once",
            json!({"key": "a", "value": "1"}),
            json!({"key": "b", "value": "2"}),
            json!({"key": "c", "value": 3}),
        )
        .with_already_done(json!({"key": "a", "value": "1"}))
        .with_concurrent(json!({"key": "d", "value": "4"})),
    )
    .tool(
        ToolFixtures::new(
            "count_files",
            json!({"name": "settings"}),
            json!({"name": "."}),
            json!({"name": null}),
        )
        .with_missing_resource(json!({"name": "nowhere"})),
    )
    .tool(ToolFixtures::new(
        "mystery",
        json!({"event": "a"}),
        json!({"event": "b"}),
        json!({}),
    ))
}

fn has(report: &Report, tool: &str, claim: Claim, case: CaseKind) -> bool {
    report
        .contradictions()
        .iter()
        .any(|c| c.tool == tool && c.claim == claim && c.case == case)
}

async fn run(world: &World, cut_off: CutOff) -> Report {
    all_fixtures(Kit::new(launcher(world)))
        .observer(FsObserver::new([&world.state]))
        .cut_off(cut_off)
        .run()
        .await
        .expect("the matrix runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lie_is_caught_and_honest_tools_are_not_flagged() {
    let world = world();
    let report = run(&world, CutOff::AfterResponse).await;
    let text = report.to_text();
    eprintln!("{text}");

    // The read-only liar: a touch without a content change is a write.
    assert!(
        has(&report, "peek", Claim::ReadOnly, CaseKind::Valid),
        "{text}"
    );
    // The idempotent liar: caught by the repeat, the already-done call, the retry after the
    // cut-off and the concurrent pair.
    for case in [
        CaseKind::Repeat,
        CaseKind::AlreadyDone,
        CaseKind::RetryAfterCutOff,
        CaseKind::Concurrent,
    ] {
        assert!(
            has(&report, "append_event", Claim::Idempotent, case),
            "{case:?}\n{text}"
        );
    }
    // The non-destructive liar: the first call replaced "dark".
    assert!(
        has(
            &report,
            "save_setting",
            Claim::NonDestructive,
            CaseKind::Valid
        ),
        "{text}"
    );
    // Nothing else is flagged: every contradiction is one of the three lies.
    for c in report.contradictions() {
        assert!(
            matches!(
                (c.tool.as_str(), c.claim),
                ("peek", Claim::ReadOnly)
                    | ("append_event", Claim::Idempotent)
                    | ("save_setting", Claim::NonDestructive)
            ),
            "unexpected contradiction {c:?}\n{text}"
        );
    }
    for (tool, status) in [
        ("peek", ToolStatus::Contradicted),
        ("append_event", ToolStatus::Contradicted),
        ("save_setting", ToolStatus::Contradicted),
        // No case here gives put_once existing state: its destructiveHint=false is untested.
        ("put_once", ToolStatus::Untested),
        ("count_files", ToolStatus::Consistent),
        ("mystery", ToolStatus::Unclassified),
    ] {
        assert_eq!(report.tool(tool).unwrap().status, status, "{tool}\n{text}");
    }
    assert_eq!(report.unclassified(), ["mystery"], "{text}");

    // Per claim: held, contradicted or untested, with the cases and the reason.
    let verdict = |tool: &str, claim: Claim| report.verdict(tool, claim).unwrap().verdict;
    for (tool, claim, expected) in [
        ("peek", Claim::ReadOnly, ClaimStatus::Contradicted),
        ("append_event", Claim::Idempotent, ClaimStatus::Contradicted),
        // Its repeat appended to the log the first call created, and kept what was there.
        ("append_event", Claim::NonDestructive, ClaimStatus::Held),
        (
            "save_setting",
            Claim::NonDestructive,
            ClaimStatus::Contradicted,
        ),
        ("put_once", Claim::Idempotent, ClaimStatus::Held),
        ("put_once", Claim::NonDestructive, ClaimStatus::Untested),
        ("count_files", Claim::ReadOnly, ClaimStatus::Held),
        ("count_files", Claim::Idempotent, ClaimStatus::Held),
        // Read-only, and that held: the spec gives destructiveHint no meaning then.
        ("count_files", Claim::NonDestructive, ClaimStatus::Held),
    ] {
        assert_eq!(verdict(tool, claim), expected, "{tool} {claim:?}\n{text}");
    }
    assert!(
        report.verdict("peek", Claim::Idempotent).is_none(),
        "{text}"
    );
    assert!(
        report.tool("mystery").unwrap().verdicts.is_empty(),
        "{text}"
    );
    let untested: Vec<(&str, Claim)> = report
        .untested()
        .iter()
        .map(|(tool, v)| (*tool, v.claim))
        .collect();
    assert_eq!(untested, [("put_once", Claim::NonDestructive)], "{text}");
    let put_once_nd = report.verdict("put_once", Claim::NonDestructive).unwrap();
    assert!(put_once_nd.cases.is_empty(), "{text}");
    assert!(
        put_once_nd.reason.contains("ToolFixtures::with_overwrite"),
        "{text}"
    );
    assert_eq!(
        report
            .verdict("append_event", Claim::Idempotent)
            .unwrap()
            .cases,
        [
            CaseKind::Repeat,
            CaseKind::AlreadyDone,
            CaseKind::RetryAfterCutOff,
            CaseKind::Concurrent
        ],
        "{text}"
    );
    assert!(
        text.contains("verdict: UNTESTED: destructiveHint=false"),
        "{text}"
    );
    assert!(
        text.contains("claim destructiveHint=false: untested: no case gave the tool existing state to modify or remove"),
        "{text}"
    );
    assert!(
        text.contains("claim readOnlyHint=true: held (valid call, byte-identical repeat"),
        "{text}"
    );
    assert!(report.lost_updates().is_empty(), "{text}");

    // The honest writer really wrote (the observer is live), once per fresh key.
    let put_once = report.tool("put_once").unwrap();
    let valid = &put_once.cases[0];
    assert_eq!(valid.case, CaseKind::Valid);
    assert!(
        valid.observed[0]
            .changes
            .changes
            .iter()
            .any(|c| c.item == "state/once/a.txt" && c.kind == ChangeKind::Added),
        "{text}"
    );
    assert_eq!(put_once.cases.len(), 6, "{text}");

    // The text names each lie in the reviewer's shape, and the JSON carries the same.
    assert!(
        text.contains("\ncase: valid call\nrequest: peek {\"name\":\"readme.txt\"}\n"),
        "{text}"
    );
    assert!(text.contains("result: contradicts readOnlyHint=true: the tool changed its environment (call: touched state/access.marker)"), "{text}");
    assert!(text.contains("result: contradicts destructiveHint=false: state was lost or replaced (modified state/settings/theme.txt)"), "{text}");
    assert!(
        text.contains("not idempotent without a remote idempotency mechanism"),
        "{text}"
    );
    assert!(text.contains("verdict: unclassified"), "{text}");
    let json = report.to_json();
    assert_eq!(
        json["summary"]["contradictions"].as_u64(),
        Some(report.contradictions().len() as u64)
    );
    assert_eq!(json["summary"]["untested"], 1);
    let put_once_json = json["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "put_once")
        .unwrap();
    assert_eq!(put_once_json["status"], "untested");
    assert_eq!(put_once_json["verdicts"][1]["claim"], "non_destructive");
    assert_eq!(put_once_json["verdicts"][1]["verdict"], "untested");
    assert_eq!(json["tools"][0]["cases"][0]["case"], "valid");
    assert_eq!(json["tools"][0]["status"], "contradicted");

    // assert_honest fails, with the report.
    let panic = std::panic::catch_unwind(|| report.assert_honest()).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains("contradicted by observed effects"),
        "{message}"
    );
    assert!(message.contains("case: valid call"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_on_the_first_observed_change_still_catches_the_appender() {
    let world = world();
    let report = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .cut_off(CutOff::WhenObserved)
        .tool(ToolFixtures::new(
            "append_event",
            json!({"event": "a"}),
            json!({"event": "b"}),
            json!({}),
        ))
        .tool(
            ToolFixtures::new(
                "put_once",
                json!({"key": "a", "value": "1"}),
                json!({"key": "b", "value": "2"}),
                json!({}),
            )
            .with_concurrent(json!({"key": "c", "value": "3"})),
        )
        .run()
        .await
        .unwrap();
    let text = report.to_text();
    assert!(
        has(&report, "append_event", Claim::Idempotent, CaseKind::Repeat),
        "{text}"
    );
    // Not contradicted; its destructiveHint=false is untested (no overwrite case here).
    assert_eq!(
        report.tool("put_once").unwrap().status,
        ToolStatus::Untested,
        "{text}"
    );
    assert_eq!(
        report
            .verdict("put_once", Claim::Idempotent)
            .unwrap()
            .verdict,
        ClaimStatus::Held,
        "{text}"
    );
    assert!(
        report.cut_off.contains("as soon as the state changed"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overwrite_case_catches_a_false_destructive_hint_and_restores_the_state() {
    let world = world();
    let report = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(
            ToolFixtures::new(
                "save_setting",
                json!({"key": "size", "value": "12"}),
                json!({"key": "lang", "value": "en"}),
                json!({"key": 1}),
            )
            // Every other case writes a fresh key: only the seeded one is overwritten.
            .with_concurrent(json!({"key": "font", "value": "mono"}))
            .with_overwrite(
                Seed::record("state/settings/color.txt", "blue"),
                json!({"key": "color", "value": "red"}),
            ),
        )
        .tool(
            ToolFixtures::new(
                "put_once",
                json!({"key": "a", "value": "1"}),
                json!({"key": "b", "value": "2"}),
                json!({}),
            )
            .with_concurrent(json!({"key": "c", "value": "3"}))
            .with_overwrite(
                Seed::call("put_once", json!({"key": "z", "value": "1"})),
                json!({"key": "z", "value": "2"}),
            ),
        )
        .run()
        .await
        .unwrap();
    let text = report.to_text();
    eprintln!("{text}");
    let contradictions: Vec<_> = report
        .contradictions()
        .iter()
        .map(|c| (c.tool.as_str(), c.claim, c.case))
        .collect();
    assert_eq!(
        contradictions,
        [("save_setting", Claim::NonDestructive, CaseKind::Overwrite)],
        "{text}"
    );
    assert_eq!(
        report.tool("put_once").unwrap().status,
        ToolStatus::Consistent,
        "{text}"
    );
    assert!(text.contains("\ncase: overwrite existing state\nrequest: save_setting {\"key\":\"color\",\"value\":\"red\"}\n"), "{text}");
    assert!(text.contains("observed records: seed (not judged): added state/settings/color.txt; call: modified state/settings/color.txt\n"), "{text}");
    assert!(
        text.contains("the call changed the seeded state (modified state/settings/color.txt)"),
        "{text}"
    );
    assert!(
        text.contains("seed: preparatory call put_once {\"key\":\"z\",\"value\":\"1\"}"),
        "{text}"
    );
    assert!(
        text.contains("the call left the seeded state's content as it was"),
        "{text}"
    );
    // The concurrent pairs were compared with one call from the same, restored, start.
    assert!(
        text.contains("two identical calls at once left the same outcome as one call"),
        "{text}"
    );
    // Restored: neither seed is left behind.
    assert!(!world.state.join("settings/color.txt").exists());
    assert!(!world.state.join("once/z.txt").exists());
    assert!(world.state.join("settings/font.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_successful_calls_that_leave_one_effect_are_a_lost_update() {
    let world = world();
    let counter = |name: &str, fresh: &str| {
        ToolFixtures::new(
            name,
            json!({"name": "a"}),
            json!({"name": "b"}),
            json!({"name": 1}),
        )
        .with_concurrent(json!({"name": fresh}))
    };
    let report = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(counter("bump", "raced"))
        .tool(counter("bump_locked", "locked"))
        .run()
        .await
        .unwrap();
    let text = report.to_text();
    eprintln!("{text}");
    // Both of bump's concurrent calls reported success, the counter says 1: flagged.
    let lost: Vec<(&str, CaseKind)> = report
        .lost_updates()
        .iter()
        .map(|l| (l.tool.as_str(), l.case))
        .collect();
    assert_eq!(lost, [("bump", CaseKind::Concurrent)], "{text}");
    let pair = report
        .tool("bump")
        .unwrap()
        .cases
        .iter()
        .find(|c| c.case == CaseKind::Concurrent)
        .unwrap();
    assert!(pair.first_call.contains(": ok: "), "{text}");
    assert!(
        pair.second_call.as_deref().unwrap().contains(": ok: "),
        "{text}"
    );
    assert!(
        pair.result.contains("LOST UPDATE: both calls succeeded, but together they left the outcome of one call, while two calls one after the other from the same starting state leave more (one call's outcome to theirs: modified state/counters/raced.txt)"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(world.state.join("counters/raced.txt")).unwrap(),
        "1\n"
    );
    assert!(
        text.contains("verdict: consistent: it declares none of the claims the matrix tests (readOnlyHint=true, idempotentHint=true, destructiveHint=false), so nothing was contradicted in 5 cases; LOST UPDATE in case 'concurrent pair'"),
        "{text}"
    );
    assert_eq!(report.to_json()["summary"]["lost_updates"], 1);
    // Honest annotations (destructive, not idempotent): nothing is contradicted.
    report.assert_honest();
    // The locked counter applied both: no update lost, and not idempotent, as it says.
    assert_eq!(
        std::fs::read_to_string(world.state.join("counters/locked.txt")).unwrap(),
        "2\n"
    );
    let locked = report
        .tool("bump_locked")
        .unwrap()
        .cases
        .iter()
        .find(|c| c.case == CaseKind::Concurrent)
        .unwrap();
    assert!(locked.lost_update.is_none(), "{text}");
    assert!(
        locked.result.contains("not idempotent under concurrency"),
        "{text}"
    );
}

/// An observer wrapper that forwards `observe` and `describe` only: `save`, `restore` and `seed`
/// are the trait's defaults.
struct Forgetful(FsObserver);

impl Observer for Forgetful {
    fn observe(&self) -> Result<Observation, ObserveError> {
        self.0.observe()
    }

    fn describe(&self) -> Vec<String> {
        self.0.describe()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_that_cannot_restore_leaves_the_concurrent_claim_untested() {
    let world = world();
    let fixtures = ToolFixtures::new(
        "put_once",
        json!({"key": "a", "value": "1"}),
        json!({"key": "b", "value": "2"}),
        json!({}),
    )
    .with_concurrent(json!({"key": "c", "value": "3"}))
    .with_overwrite(
        Seed::call("put_once", json!({"key": "z", "value": "1"})),
        json!({"key": "z", "value": "2"}),
    );
    let report = Kit::new(launcher(&world))
        .observer(Forgetful(FsObserver::new([&world.state])))
        .tool(fixtures)
        .run()
        .await
        .unwrap();
    let text = report.to_text();
    eprintln!("{text}");
    assert!(report.is_honest(), "{text}");
    let tool = report.tool("put_once").unwrap();
    assert_eq!(tool.status, ToolStatus::Untested, "{text}");
    let idempotent = tool.verdict(Claim::Idempotent).unwrap();
    assert_eq!(idempotent.verdict, ClaimStatus::Untested, "{text}");
    assert!(
        idempotent.reason.contains("in case 'concurrent pair', the observer cannot restore state (its Observer::save returned None, the trait's default; a wrapper must forward save and restore)"),
        "{text}"
    );
    // The cases that did run are named; the overwrite case still tested destructiveHint.
    assert!(idempotent.cases.contains(&CaseKind::Repeat), "{text}");
    assert_eq!(
        tool.verdict(Claim::NonDestructive).unwrap().verdict,
        ClaimStatus::Held,
        "{text}"
    );
    assert!(
        text.contains("claim idempotentHint=true: untested (byte-identical repeat"),
        "{text}"
    );
    // The same fixtures with the observer itself: every claim held.
    let world = self::world();
    let fixtures = ToolFixtures::new(
        "put_once",
        json!({"key": "a", "value": "1"}),
        json!({"key": "b", "value": "2"}),
        json!({}),
    )
    .with_concurrent(json!({"key": "c", "value": "3"}))
    .with_overwrite(
        Seed::call("put_once", json!({"key": "z", "value": "1"})),
        json!({"key": "z", "value": "2"}),
    );
    let report = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(fixtures)
        .run()
        .await
        .unwrap();
    assert_eq!(
        report.tool("put_once").unwrap().status,
        ToolStatus::Consistent,
        "{}",
        report.to_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misuse_is_a_typed_error_naming_the_fix() {
    let world = world();
    let no_observer = Kit::new(launcher(&world)).run().await;
    assert!(matches!(no_observer, Err(KitError::NoObserver)));

    let unknown = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(ToolFixtures::new("nope", json!({}), json!({}), json!({})))
        .run()
        .await;
    match unknown {
        Err(e @ KitError::ToolNotListed { .. }) => assert!(e.to_string().contains("`nope`")),
        other => panic!("expected ToolNotListed, got {other:?}"),
    }

    let bad_fixture = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(ToolFixtures::new(
            "peek",
            json!("readme.txt"),
            json!({}),
            json!({}),
        ))
        .run()
        .await;
    assert!(matches!(
        bad_fixture,
        Err(KitError::Fixture {
            fixture: "valid",
            ..
        })
    ));

    let fixtures = || {
        ToolFixtures::new(
            "save_setting",
            json!({"key": "k", "value": "v"}),
            json!({"key": "l", "value": "v"}),
            json!({}),
        )
    };
    let unlisted_seed = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(fixtures().with_overwrite(Seed::call("nope", json!({})), json!({})))
        .run()
        .await;
    assert!(
        matches!(&unlisted_seed, Err(KitError::ToolNotListed { tool }) if tool == "nope"),
        "{unlisted_seed:?}"
    );
    let failing_seed = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(fixtures().with_overwrite(
            Seed::call("put_once", json!({"key": "q", "value": 3})),
            json!({"key": "q", "value": "x"}),
        ))
        .run()
        .await;
    match failing_seed {
        Err(e @ KitError::Seed { .. }) => {
            assert!(e.to_string().contains("preparatory call put_once"), "{e}")
        }
        other => panic!("expected KitError::Seed, got {other:?}"),
    }
    let outside = Kit::new(launcher(&world))
        .observer(FsObserver::new([&world.state]))
        .tool(fixtures().with_overwrite(Seed::record("elsewhere/x.txt", "x"), json!({})))
        .run()
        .await;
    match outside {
        Err(e @ KitError::Observe(_)) => assert!(e.to_string().contains("state/"), "{e}"),
        other => panic!("expected an observer error, got {other:?}"),
    }

    let no_server = Kit::new(Launcher::child(|| {
        std::process::Command::new("/nonexistent/toolgate-kit-test-server")
    }))
    .observer(FsObserver::new([&world.state]))
    .run()
    .await;
    assert!(
        matches!(no_server, Err(KitError::Launch { .. })),
        "{no_server:?}"
    );
}
