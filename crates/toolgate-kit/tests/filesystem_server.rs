//! The kit against a server we did not write: the reference filesystem server of the MCP project
//! (`@modelcontextprotocol/server-filesystem` 2026.8.31, TypeScript SDK, `initialize` only),
//! started as `node <TOOLGATE_FS_SERVER> <state dir>` on a temporary directory.
//!
//! Every one of its 14 tools runs the whole matrix, and the verdict expected of each declared
//! annotation is written down in [`EXPECTED`]. Then one liar per claim kind: the same server
//! presented through `tests/fixtures/relabel.mjs`, which rewrites only its `tools/list` reply, so
//! the calls reach the real server and its real behaviour contradicts the false annotation.
//!
//! Ignored by default because it needs Node and the npm package: `tests/interop/run.sh` installs
//! both (`npm ci` in `tests/interop`) and runs
//! `TOOLGATE_FS_SERVER=tests/interop/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js
//! cargo test -p toolgate-kit --test filesystem_server --locked -- --ignored`. Without the
//! variable the tests fail rather than pass untested.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use toolgate_kit::{
    CaseKind, Claim, ClaimStatus, Claims, FsObserver, Kit, Launcher, Report, Seed, ToolFixtures,
    ToolStatus,
};

/// What the matrix must conclude about one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    /// The annotation makes the claim, some case tested it, and nothing contradicted it.
    Holds,
    /// The annotation does not make the claim (false, or absent with the spec's default), so
    /// there is nothing to contradict.
    NotClaimed,
    /// The annotation makes the claim and an observed effect contradicts it.
    Contradicted,
    /// The annotation makes the claim, nothing contradicted it, and no case could test it.
    Untested,
}

use Expected::{Holds, NotClaimed};

/// One tool: the verdict on `readOnlyHint: true`, `idempotentHint: true`,
/// `destructiveHint: false`, in that order.
struct Row {
    tool: &'static str,
    read_only: Expected,
    idempotent: Expected,
    non_destructive: Expected,
}

const fn row(
    tool: &'static str,
    read_only: Expected,
    idempotent: Expected,
    non_destructive: Expected,
) -> Row {
    Row {
        tool,
        read_only,
        idempotent,
        non_destructive,
    }
}

/// The server's own annotations, and what its behaviour makes of them. The ten readers declare
/// only `readOnlyHint: true` (the other two hints are meaningless for a read-only tool and left
/// absent). `write_file` declares idempotent and destructive: a rewrite with the same content
/// replaces the file (new inode, new mtime) without changing its content, which is no added
/// effect. `create_directory` declares idempotent and non-destructive, and `mkdir -p` of an
/// existing directory changes nothing. `edit_file` and `move_file` claim neither.
const EXPECTED: [Row; 14] = [
    row("read_file", Holds, NotClaimed, NotClaimed),
    row("read_text_file", Holds, NotClaimed, NotClaimed),
    row("read_media_file", Holds, NotClaimed, NotClaimed),
    row("read_multiple_files", Holds, NotClaimed, NotClaimed),
    row("write_file", NotClaimed, Holds, NotClaimed),
    row("edit_file", NotClaimed, NotClaimed, NotClaimed),
    row("create_directory", NotClaimed, Holds, Holds),
    row("list_directory", Holds, NotClaimed, NotClaimed),
    row("list_directory_with_sizes", Holds, NotClaimed, NotClaimed),
    row("directory_tree", Holds, NotClaimed, NotClaimed),
    row("move_file", NotClaimed, NotClaimed, NotClaimed),
    row("search_files", Holds, NotClaimed, NotClaimed),
    row("get_file_info", Holds, NotClaimed, NotClaimed),
    row("list_allowed_directories", Holds, NotClaimed, NotClaimed),
];

/// Node child processes on a loaded 2-core machine: every awaited condition gets minutes.
const TIMEOUT: Duration = Duration::from_secs(180);

fn server_js() -> PathBuf {
    let Some(path) = std::env::var_os("TOOLGATE_FS_SERVER") else {
        panic!(
            "set TOOLGATE_FS_SERVER to @modelcontextprotocol/server-filesystem's dist/index.js (tests/interop/run.sh installs it under tests/interop/node_modules and sets it)"
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "TOOLGATE_FS_SERVER={} is not a file; run `npm ci` in tests/interop",
        path.display()
    );
    std::fs::canonicalize(&path).unwrap()
}

/// The state the server may touch, seeded with the files the fixtures name.
struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // The server resolves its allowed directory with realpath: give it the real one.
        let root = std::fs::canonicalize(dir.path()).unwrap().join("state");
        for (path, content) in [
            ("docs/readme.md", "# Readme\nhello\n"),
            ("docs/notes.txt", "status: draft\n"),
            (
                "docs/changelog.md",
                "# Changelog\n\n## Unreleased\n\n## 1.0.0\n- first release\n",
            ),
            ("docs/todo.md", "# Todo\n\n## Open\n\n## Done\n"),
            ("move/a.txt", "a\n"),
            ("move/c.txt", "c\n"),
            ("move/e.txt", "e\n"),
        ] {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        std::fs::create_dir_all(root.join("img")).unwrap();
        // A PNG signature and a few bytes: read_media_file answers with image content.
        std::fs::write(
            root.join("img/pixel.png"),
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0",
        )
        .unwrap();
        World { _dir: dir, root }
    }

    /// The absolute path of `relative` under the state, as the server's arguments name it.
    fn path(&self, relative: &str) -> Value {
        if relative.is_empty() {
            return json!(self.root);
        }
        json!(self.root.join(relative))
    }

    /// The server as a child process per connection; with `lie`, behind `relabel.mjs`.
    fn launcher(&self, lie: Option<Value>) -> Launcher {
        let server = server_js();
        let relabel = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/relabel.mjs");
        let root = self.root.clone();
        Launcher::child(move || {
            let mut command = std::process::Command::new("node");
            if let Some(lie) = &lie {
                command.arg(&relabel).arg(lie.to_string());
            }
            command.arg(&server).arg(&root);
            command
        })
    }

    fn observer(&self) -> FsObserver {
        // Nothing is ignored: the server writes only where it is told to (its temporary files
        // are renamed or removed before it answers).
        FsObserver::new([&self.root])
    }

    /// Fixtures for every tool of the server.
    fn fixtures(&self) -> Vec<ToolFixtures> {
        let p = |relative: &str| self.path(relative);
        let edit = |old: &str, new: &str| json!([{"oldText": old, "newText": new}]);
        vec![
            ToolFixtures::new(
                "read_file",
                json!({"path": p("docs/readme.md")}),
                json!({"path": p("docs/notes.txt")}),
                json!({"path": 7}),
            )
            .with_missing_resource(json!({"path": p("docs/absent.md")})),
            ToolFixtures::new(
                "read_text_file",
                json!({"path": p("docs/readme.md"), "head": 1}),
                json!({"path": p("docs/changelog.md"), "tail": 2}),
                json!({"path": p("docs/readme.md"), "head": "one"}),
            )
            .with_missing_resource(json!({"path": p("docs/absent.md")})),
            ToolFixtures::new(
                "read_media_file",
                json!({"path": p("img/pixel.png")}),
                json!({"path": p("docs/readme.md")}),
                json!({"path": ["img/pixel.png"]}),
            )
            .with_missing_resource(json!({"path": p("img/absent.png")})),
            ToolFixtures::new(
                "read_multiple_files",
                json!({"paths": [p("docs/readme.md"), p("docs/notes.txt")]}),
                json!({"paths": [p("docs/changelog.md")]}),
                json!({"paths": []}),
            )
            .with_missing_resource(json!({"paths": [p("docs/absent.md")]})),
            ToolFixtures::new(
                "write_file",
                json!({"path": p("written.txt"), "content": "first\n"}),
                json!({"path": p("second.txt"), "content": "second\n"}),
                json!({"path": p("invalid.txt"), "content": 5}),
            )
            .with_missing_resource(json!({"path": p("no/such/dir/x.txt"), "content": "x\n"}))
            .with_already_done(json!({"path": p("written.txt"), "content": "first\n"}))
            .with_concurrent(json!({"path": p("raced.txt"), "content": "raced\n"}))
            .with_overwrite(
                Seed::record("state/docs/seeded.txt", "original\n"),
                json!({"path": p("docs/seeded.txt"), "content": "replaced\n"}),
            ),
            ToolFixtures::new(
                "edit_file",
                // Inserts a line under a heading that stays: applied again, it inserts it again.
                json!({"path": p("docs/changelog.md"), "edits": edit("## Unreleased\n", "## Unreleased\n- fix the parser\n")}),
                json!({"path": p("docs/notes.txt"), "edits": edit("status: draft", "status: final")}),
                json!({"path": p("docs/notes.txt"), "edits": "status"}),
            )
            .with_missing_resource(json!({"path": p("docs/absent.md"), "edits": edit("a", "b")}))
            .with_concurrent(json!({"path": p("docs/todo.md"), "edits": edit("## Done\n", "## Done\n- ship 1.1\n")}))
            .with_overwrite(
                Seed::record("state/docs/draft.md", "title: draft\n"),
                json!({"path": p("docs/draft.md"), "edits": edit("title: draft", "title: final")}),
            ),
            ToolFixtures::new(
                "create_directory",
                json!({"path": p("made/deep")}),
                json!({"path": p("other")}),
                json!({"path": 1}),
            )
            .with_already_done(json!({"path": p("made/deep")}))
            .with_concurrent(json!({"path": p("raced-dir")}))
            // mkdir -p of a directory that exists and holds a file: nothing may be lost.
            .with_overwrite(
                Seed::record("state/existing/keep.txt", "keep\n"),
                json!({"path": p("existing")}),
            ),
            ToolFixtures::new(
                "list_directory",
                json!({"path": p("docs")}),
                json!({"path": p("")}),
                json!({"path": false}),
            )
            .with_missing_resource(json!({"path": p("nowhere")})),
            ToolFixtures::new(
                "list_directory_with_sizes",
                json!({"path": p("docs")}),
                json!({"path": p(""), "sortBy": "size"}),
                json!({"path": p("docs"), "sortBy": "date"}),
            )
            .with_missing_resource(json!({"path": p("nowhere")})),
            ToolFixtures::new(
                "directory_tree",
                json!({"path": p("")}),
                json!({"path": p("docs"), "excludePatterns": ["*.txt"]}),
                json!({"path": p(""), "excludePatterns": "docs"}),
            )
            .with_missing_resource(json!({"path": p("nowhere")})),
            ToolFixtures::new(
                "move_file",
                json!({"source": p("move/a.txt"), "destination": p("move/b.txt")}),
                json!({"source": p("move/c.txt"), "destination": p("move/d.txt")}),
                json!({"source": 1, "destination": 2}),
            )
            .with_missing_resource(
                json!({"source": p("move/absent.txt"), "destination": p("move/z.txt")}),
            )
            .with_concurrent(json!({"source": p("move/e.txt"), "destination": p("move/f.txt")}))
            // Onto an existing file: the server refuses, nothing is replaced.
            .with_overwrite(
                Seed::record("state/move/taken.txt", "taken\n"),
                json!({"source": p("move/b.txt"), "destination": p("move/taken.txt")}),
            ),
            ToolFixtures::new(
                "search_files",
                json!({"path": p(""), "pattern": "**/*.md"}),
                json!({"path": p("docs"), "pattern": "*.txt"}),
                json!({"path": p("")}),
            )
            .with_missing_resource(json!({"path": p("nowhere"), "pattern": "*"})),
            ToolFixtures::new(
                "get_file_info",
                json!({"path": p("docs/readme.md")}),
                json!({"path": p("docs")}),
                json!({"path": null}),
            )
            .with_missing_resource(json!({"path": p("docs/absent.md")})),
            ToolFixtures::new(
                "list_allowed_directories",
                json!({}),
                json!({}),
                json!({"path": 3}),
            ),
        ]
    }

    fn fixture(&self, tool: &str) -> ToolFixtures {
        self.fixtures()
            .into_iter()
            .find(|f| f.name == tool)
            .unwrap()
    }
}

async fn run(world: &World, lie: Option<Value>, fixtures: Vec<ToolFixtures>) -> Report {
    let mut kit = Kit::new(world.launcher(lie))
        .observer(world.observer())
        .timeout(TIMEOUT);
    for f in fixtures {
        kit = kit.tool(f);
    }
    let report = kit
        .run()
        .await
        .expect("the matrix runs against the filesystem server");
    eprintln!("{}", report.to_text());
    report
}

/// Whether `claims` make `claim`.
fn makes(claims: &Claims, claim: Claim) -> bool {
    match claim {
        Claim::ReadOnly => claims.read_only == Some(true),
        Claim::Idempotent => claims.idempotent == Some(true),
        Claim::NonDestructive => claims.destructive == Some(false),
        _ => false,
    }
}

/// The verdict the report gives `tool` on `claim` (checked against its contradictions).
fn verdict(report: &Report, tool: &str, claim: Claim) -> Expected {
    let claims = report.tool(tool).unwrap().claims;
    let contradicted = report
        .contradictions()
        .iter()
        .any(|c| c.tool == tool && c.claim == claim);
    let given = report.verdict(tool, claim).map(|v| v.verdict);
    assert_eq!(
        given.is_some(),
        makes(&claims, claim),
        "{tool} {claim:?}: a verdict exactly for each declared claim"
    );
    assert_eq!(
        given == Some(ClaimStatus::Contradicted),
        contradicted,
        "{tool} {claim:?}"
    );
    match given {
        None => NotClaimed,
        Some(ClaimStatus::Held) => Holds,
        Some(ClaimStatus::Contradicted) => Expected::Contradicted,
        Some(_) => Expected::Untested,
    }
}

/// The cases that contradicted `claim` of `tool`.
fn cases(report: &Report, tool: &str, claim: Claim) -> BTreeSet<&'static str> {
    report
        .contradictions()
        .iter()
        .filter(|c| c.tool == tool && c.claim == claim)
        .map(|c| c.case.title())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Node and @modelcontextprotocol/server-filesystem: run by tests/interop/run.sh"]
async fn the_filesystem_server_keeps_its_annotations() {
    let world = World::new();
    let report = run(&world, None, world.fixtures()).await;
    let text = report.to_text();
    assert_eq!(report.tools.len(), EXPECTED.len(), "{text}");
    for row in &EXPECTED {
        let tool = report
            .tool(row.tool)
            .unwrap_or_else(|| panic!("the server no longer lists {}\n{text}", row.tool));
        assert_eq!(tool.status, ToolStatus::Consistent, "{}\n{text}", row.tool);
        for (claim, expected) in [
            (Claim::ReadOnly, row.read_only),
            (Claim::Idempotent, row.idempotent),
            (Claim::NonDestructive, row.non_destructive),
        ] {
            assert_eq!(
                verdict(&report, row.tool, claim),
                expected,
                "{} {}\n{text}",
                row.tool,
                claim.annotation()
            );
        }
    }
    report.assert_honest();
    assert!(report.untested().is_empty(), "{text}");
    // edit_file's concurrent pair loses one of its two insertions when both processes read
    // before either writes (both succeed): flagged when it happens. No other tool loses one.
    for lost in report.lost_updates() {
        assert_eq!(lost.tool, "edit_file", "{text}");
    }

    // The observer is live: the writers' effects were seen, and write_file's repeat, a rewrite
    // with the same bytes, was a touch that added no effect.
    let case = |tool: &str, kind: CaseKind| {
        report
            .tool(tool)
            .unwrap()
            .cases
            .iter()
            .find(|c| c.case == kind)
            .unwrap_or_else(|| panic!("no {kind:?} for {tool}\n{text}"))
    };
    assert_eq!(
        case("write_file", CaseKind::Valid).observed[0]
            .changes
            .to_string(),
        "added state/written.txt",
        "{text}"
    );
    assert_eq!(
        case("write_file", CaseKind::Repeat).observed[0]
            .changes
            .to_string(),
        "touched state/written.txt",
        "{text}"
    );
    assert!(
        case("write_file", CaseKind::Overwrite)
            .result
            .contains("the call changed the seeded state (modified state/docs/seeded.txt)"),
        "{text}"
    );
    assert!(
        case("edit_file", CaseKind::Repeat)
            .result
            .contains("not idempotent: the byte-identical repeat added effects"),
        "{text}"
    );
    assert!(
        case("create_directory", CaseKind::Overwrite)
            .result
            .contains("the call left the seeded state's content as it was"),
        "{text}"
    );
    // Every overwrite case restored the state: no seed is left behind.
    for seeded in [
        "docs/seeded.txt",
        "docs/draft.md",
        "existing",
        "move/taken.txt",
    ] {
        assert!(!world.root.join(seeded).exists(), "{seeded}\n{text}");
    }
}

/// Runs the matrix on `tool` only, presented with `lie` merged into its annotations, and checks
/// that exactly `claim` is contradicted, and by the cases in `by` among others.
async fn liar(tool: &str, lie: Value, claim: Claim, by: &[CaseKind]) -> Report {
    let world = World::new();
    let mut annotations = serde_json::Map::new();
    annotations.insert(tool.to_owned(), lie);
    let report = run(
        &world,
        Some(Value::Object(annotations)),
        vec![world.fixture(tool)],
    )
    .await;
    let text = report.to_text();
    let claims = report.tool(tool).unwrap().claims;
    assert!(makes(&claims, claim), "the lie was not presented\n{text}");
    assert_eq!(
        report.tool(tool).unwrap().status,
        ToolStatus::Contradicted,
        "{text}"
    );
    assert_eq!(
        verdict(&report, tool, claim),
        Expected::Contradicted,
        "{text}"
    );
    for c in report.contradictions() {
        assert!(
            c.tool == tool && c.claim == claim,
            "only the lie may be contradicted, got {c:?}\n{text}"
        );
    }
    let found = cases(&report, tool, claim);
    for case in by {
        assert!(found.contains(case.title()), "{case:?}\n{text}");
    }
    // The other tools were listed, not exercised.
    assert_eq!(report.tools.len(), EXPECTED.len(), "{text}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Node and @modelcontextprotocol/server-filesystem: run by tests/interop/run.sh"]
async fn write_file_claiming_read_only_is_contradicted() {
    liar(
        "write_file",
        json!({"readOnlyHint": true}),
        Claim::ReadOnly,
        &[CaseKind::Valid, CaseKind::Overwrite],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Node and @modelcontextprotocol/server-filesystem: run by tests/interop/run.sh"]
async fn edit_file_claiming_idempotent_is_contradicted() {
    // The repeat applies the insertion a second time. The concurrent pair may or may not: two
    // processes that both read before either writes lose one update, which leaves the same
    // content as one call; two that run one after the other apply it twice.
    liar(
        "edit_file",
        json!({"idempotentHint": true}),
        Claim::Idempotent,
        &[CaseKind::Repeat],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Node and @modelcontextprotocol/server-filesystem: run by tests/interop/run.sh"]
async fn write_file_claiming_non_destructive_is_contradicted() {
    // Every other case writes a fresh file or the same bytes again: only the overwrite of the
    // seeded file replaces content.
    let report = liar(
        "write_file",
        json!({"destructiveHint": false}),
        Claim::NonDestructive,
        &[CaseKind::Overwrite],
    )
    .await;
    assert_eq!(
        cases(&report, "write_file", Claim::NonDestructive),
        BTreeSet::from([CaseKind::Overwrite.title()]),
        "{}",
        report.to_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Node and @modelcontextprotocol/server-filesystem: run by tests/interop/run.sh"]
async fn destructive_hint_false_without_an_overwrite_case_is_untested() {
    // create_directory's destructiveHint=false holds with the overwrite case (the whole matrix
    // above). Without it, every call makes fresh directories: no case gives the tool existing
    // state, so the claim is untested, and the tool is not reported as consistent.
    let world = World::new();
    let mut fixtures = world.fixture("create_directory");
    fixtures.overwrite = None;
    let report = run(&world, None, vec![fixtures]).await;
    let text = report.to_text();
    report.assert_honest();
    let tool = report.tool("create_directory").unwrap();
    assert_eq!(tool.status, ToolStatus::Untested, "{text}");
    assert_eq!(
        verdict(&report, "create_directory", Claim::Idempotent),
        Holds,
        "{text}"
    );
    let untested = tool.verdict(Claim::NonDestructive).unwrap();
    assert_eq!(untested.verdict, ClaimStatus::Untested, "{text}");
    assert!(
        untested
            .reason
            .contains("no case gave the tool existing state to modify or remove"),
        "{text}"
    );
    assert!(
        text.contains("verdict: UNTESTED: destructiveHint=false"),
        "{text}"
    );
}
