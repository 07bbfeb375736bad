//! `toolgate-server proxy`: the gate in front of an upstream MCP server it did not build, with
//! real processes on both sides. The upstream here is another `toolgate-server` over stdio (with
//! its own ledger), so what reaches it can be read from its audit log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{Server, TestEnv, output_text};
use serde_json::{Value, json};
use toolgate::contract::upstream::UpstreamPin;

const BIN: &str = env!("CARGO_BIN_EXE_toolgate-server");

/// The proxy's policy: write_note under exactly-once, read_ledger denied.
const PROXY_POLICY: &str = r#"{
  "version": 1,
  "allow": ["write_note"],
  "deny": ["read_ledger"],
  "idempotency": {
    "write_note": {
      "key_argument": "request_id",
      "effect": "idempotent",
      "replay_marker": {"pointer": "/status", "value": "replay"}
    }
  },
  "effects": {"write_note": "write"}
}"#;

struct Setup {
    proxy: TestEnv,
    upstream: TestEnv,
    pin: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let proxy = TestEnv::new();
        std::fs::write(&proxy.policy, PROXY_POLICY).unwrap();
        let upstream = TestEnv::new();
        let pin = proxy.path("toolgate-proxy.lock");
        Setup {
            proxy,
            upstream,
            pin,
        }
    }

    fn upstream_command(&self) -> Vec<String> {
        vec![
            BIN.to_owned(),
            "--policy".to_owned(),
            self.upstream.policy.display().to_string(),
            "--ledger".to_owned(),
            self.upstream.ledger.display().to_string(),
        ]
    }

    fn proxy_command(&self, extra: &[&str]) -> std::process::Command {
        proxy_command(&self.proxy, &self.pin, extra, &self.upstream_command())
    }

    fn lock(&self) {
        let said = pin_upstream(&self.proxy, &self.pin, &self.upstream_command());
        assert!(said.contains("pinned 2 tools of toolgate-server"), "{said}");
    }

    fn start(&self) -> Server {
        let mut server = Server::spawn(self.proxy_command(&[]), &self.proxy.path("proxy.stderr"));
        server.discover();
        server
    }

    /// The upstream's audit records of `tool` (what was forwarded).
    fn forwarded(&self, tool: &str) -> Vec<Value> {
        self.upstream
            .audit_records()
            .into_iter()
            .filter(|r| r["method"] == "tools/call" && r["name"] == tool)
            .collect()
    }
}

/// `proxy --lock PIN EXTRA… -- UPSTREAM` in `env`.
fn proxy_command(
    env: &TestEnv,
    pin: &Path,
    extra: &[&str],
    upstream: &[String],
) -> std::process::Command {
    let mut command = env.command();
    command
        .arg("proxy")
        .arg("--lock")
        .arg(pin)
        .args(extra)
        .arg("--")
        .args(upstream);
    command
}

/// The lines of a file the scripted upstream appends to (none while it does not exist).
fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `proxy lock --lock PIN -- UPSTREAM` in `env`, which must succeed; returns what it said.
fn pin_upstream(env: &TestEnv, pin: &Path, upstream: &[String]) -> String {
    let output = common::run_to_end({
        let mut command = env.command();
        command
            .args(["proxy", "lock", "--lock"])
            .arg(pin)
            .arg("--")
            .args(upstream);
        command
    });
    assert!(output.status.success(), "{}", output_text(&output));
    output_text(&output)
}

fn edit_pin(path: &Path, edit: impl FnOnce(&mut Value)) {
    // Re-rendered through the library, so the digests are right and only the content differs.
    let pin = UpstreamPin::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut document: Value = serde_json::from_str(&pin.render("test")).unwrap();
    edit(&mut document["upstream"]["tools"]);
    let tools = document["upstream"]["tools"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| toolgate::contract::upstream::UpstreamTool {
            name: t["name"].as_str().unwrap().to_owned(),
            title: t["title"].as_str().map(str::to_owned),
            description: t["description"].as_str().map(str::to_owned),
            input_schema: t["inputSchema"].clone(),
            output_schema: Some(t["outputSchema"].clone()).filter(|v| !v.is_null()),
            annotations: Some(t["annotations"].clone()).filter(|v| !v.is_null()),
        })
        .collect::<Vec<_>>();
    let edited = UpstreamPin::new(pin.server_name(), pin.server_version(), tools).unwrap();
    std::fs::write(path, edited.render("test")).unwrap();
}

#[test]
fn the_proxy_gates_an_upstream_and_answers_replays_itself() {
    let setup = Setup::new();
    setup.lock();
    let mut proxy = setup.start();
    assert_eq!(proxy.list_tool_names(), ["write_note"]);

    let first = proxy.write_note("req-proxy-0001", "through the proxy");
    assert_eq!(common::note_status(&first), "committed");
    let again = proxy.write_note("req-proxy-0001", "through the proxy");
    assert_eq!(common::note_status(&again), "replay");
    // The replay was answered from the proxy's store: the upstream ran the call once.
    assert_eq!(setup.forwarded("write_note").len(), 1);

    // A tool the proxy's policy denies is refused before anything is forwarded.
    let refused = proxy.call("read_ledger", json!({}));
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    assert!(setup.forwarded("read_ledger").is_empty());
    assert!(proxy.close().success());

    let outcomes: Vec<(String, String)> = setup
        .proxy
        .audit_records()
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("write_note".to_owned(), "committed".to_owned()),
            ("write_note".to_owned(), "replay".to_owned()),
            ("read_ledger".to_owned(), "not_executed".to_owned()),
        ]
    );
    assert!(setup.proxy.audit_verify().status.success());
    assert!(setup.upstream.audit_verify().status.success());

    // The pin is the proxy's contract: each call's record carries its pinned tool's digest.
    let pin = UpstreamPin::parse(&std::fs::read_to_string(&setup.pin).unwrap()).unwrap();
    let write_note = pin.tools()["write_note"].digest().to_hex();
    let records = setup.proxy.audit_records();
    let committed = records
        .iter()
        .find(|r| r["name"] == "write_note" && r["outcome"] == "committed")
        .unwrap();
    assert_eq!(
        committed["contract_digest"],
        json!(write_note),
        "{committed}"
    );
}

#[test]
fn the_pin_is_the_proxys_contract_for_expect_digest_and_the_host() {
    let setup = Setup::new();
    setup.lock();
    let pin = UpstreamPin::parse(&std::fs::read_to_string(&setup.pin).unwrap()).unwrap();
    let digest = format!("sha256:{}", pin.digest().to_hex());

    // Another digest: refused before the upstream starts or the ledger is touched.
    let other = format!("sha256:{}", "0".repeat(64));
    let output = common::run_to_end(setup.proxy_command(&["--expect-digest", &other]));
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("the upstream pin is not the expected one"),
        "{}",
        output_text(&output)
    );
    assert!(!setup.proxy.ledger.exists(), "nothing written");

    // The pin's digest: served, and published to the host as the contract digest.
    let mut proxy = Server::spawn(
        setup.proxy_command(&["--expect-digest", &digest]),
        &setup.proxy.path("proxy.stderr"),
    );
    let discovered = proxy.discover();
    assert_eq!(
        discovered["_meta"]["io.toolgate/contractDigest"],
        json!(digest),
        "{discovered}"
    );
    assert!(proxy.close().success());
}

#[test]
fn a_tool_that_drifted_from_its_pin_is_hidden_refused_and_audited() {
    let setup = Setup::new();
    setup.lock();
    // As if the upstream had changed write_note's description since it was approved.
    edit_pin(&setup.pin, |tools| {
        tools["write_note"]["description"] = json!("The description a person approved.");
        tools["read_ledger"]["description"] = json!("Another approved description.");
    });

    let mut proxy = setup.start();
    assert!(proxy.list_tool_names().is_empty(), "write_note is hidden");
    // The caller may call write_note: the refusal names the change.
    let refused = proxy.write_note("req-proxy-0002", "x");
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("upstream.description_changed") && message.contains("proxy lock"),
        "{message}"
    );
    // read_ledger drifted too, but the policy denies it: as unknown as a tool that never existed.
    let denied = proxy.call("read_ledger", json!({}));
    assert_eq!(
        denied["error"]["message"],
        json!("tool not found"),
        "{denied}"
    );
    assert!(setup.forwarded("write_note").is_empty());
    assert!(setup.forwarded("read_ledger").is_empty());
    assert!(proxy.close().success());
    let records = setup.proxy.audit_records();
    let unavailable = records
        .iter()
        .find(|r| r["method"] == "tools/call" && r["name"] == "write_note")
        .unwrap();
    assert!(
        unavailable["reason"]
            .as_str()
            .unwrap()
            .starts_with("unavailable: "),
        "{unavailable}"
    );
    let drift: Vec<String> = setup
        .proxy
        .audit_records()
        .iter()
        .filter(|r| r["method"] == "proxy/drift")
        .map(|r| {
            format!(
                "{} {}",
                r["name"].as_str().unwrap(),
                r["reason"].as_str().unwrap()
            )
        })
        .collect();
    // Recorded once each, at start (the host's list found nothing new).
    assert_eq!(drift.len(), 2, "{drift:?}");
    assert!(
        drift[0].starts_with("read_ledger RISKY upstream.description_changed")
            && drift[1].starts_with("write_note RISKY upstream.description_changed"),
        "{drift:?}"
    );

    // Refusing to start instead names the change and touches no ledger.
    let ledger = setup.proxy.ledger.join("audit.jsonl");
    let before = std::fs::read(&ledger).unwrap();
    let output = common::run_to_end(setup.proxy_command(&["--on-drift", "refuse-start"]));
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("upstream.description_changed"),
        "{}",
        output_text(&output)
    );
    assert_eq!(std::fs::read(&ledger).unwrap(), before);

    // Pinned again, the tool is served.
    setup.lock();
    let mut proxy = setup.start();
    assert_eq!(proxy.list_tool_names(), ["write_note"]);
    assert!(proxy.close().success());
}

#[test]
fn the_proxy_does_not_start_without_a_pin_or_an_upstream() {
    let setup = Setup::new();
    let output = common::run_to_end(setup.proxy_command(&[]));
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("proxy lock"),
        "{}",
        output_text(&output)
    );
    assert!(!setup.proxy.ledger.exists(), "nothing written");

    setup.lock();
    let output = common::run_to_end({
        let mut command = setup.proxy.command();
        command
            .args(["proxy", "--lock"])
            .arg(&setup.pin)
            .args(["--", "/nonexistent/upstream"]);
        command
    });
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("cannot start the upstream"),
        "{}",
        output_text(&output)
    );
}

// ---------------------------------------------------------------------------------------------
// A scripted upstream (tests/fixtures/scripted_upstream.py): rug pulls, faults, progress.

const SCRIPTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/scripted_upstream.py"
);

/// Every tool of the scripted upstream allowed; `store` exactly once per key, unsafe.
const SCRIPTED_POLICY: &str = r#"{
  "version": 1,
  "allow": ["echo", "echo_v2", "store", "progress", "rug_pull", "slow", "fault", "flood", "ask",
            "inject", "report", "announce"],
  "idempotency": {"store": {"key_argument": "key", "effect": "unsafe"}},
  "effects": {"store": "write"}
}"#;

struct Scripted {
    proxy: TestEnv,
    state: PathBuf,
    pin: PathBuf,
    /// A 2026-07-28 upstream (`server/discover`, list changes on a subscription) rather than a
    /// 2025-11-25 one.
    modern: bool,
}

impl Scripted {
    fn new() -> Scripted {
        Scripted::speaking(false)
    }

    fn speaking(modern: bool) -> Scripted {
        let proxy = TestEnv::new();
        std::fs::write(&proxy.policy, SCRIPTED_POLICY).unwrap();
        let state = proxy.path("upstream-state");
        let pin = proxy.path("toolgate-proxy.lock");
        let scripted = Scripted {
            proxy,
            state,
            pin,
            modern,
        };
        let said = pin_upstream(&scripted.proxy, &scripted.pin, &scripted.upstream_command());
        assert!(
            said.contains("pinned 11 tools of scripted-upstream 1.0.0"),
            "{said}"
        );
        scripted
    }

    fn upstream_command(&self) -> Vec<String> {
        let mut command = vec![
            "python3".to_owned(),
            SCRIPTED.to_owned(),
            self.state.display().to_string(),
        ];
        if self.modern {
            command.push("modern".to_owned());
        }
        command
    }

    /// The handshake requests the upstream received, in order.
    fn handshakes(&self) -> Vec<String> {
        lines_of(&self.state.join("handshakes"))
    }

    fn start(&self, extra: &[&str]) -> Server {
        let mut server = self.spawn(extra);
        server.discover();
        server
    }

    /// The proxy before the host's handshake.
    fn spawn(&self, extra: &[&str]) -> Server {
        let command = proxy_command(&self.proxy, &self.pin, extra, &self.upstream_command());
        Server::spawn(command, &self.proxy.path("proxy.stderr"))
    }

    /// The proxy's policy: [`SCRIPTED_POLICY`] with `proxy` set to `section`.
    fn set_proxy_section(&self, section: Value) {
        let mut policy: Value = serde_json::from_str(SCRIPTED_POLICY).unwrap();
        policy["proxy"] = section;
        std::fs::write(&self.proxy.policy, policy.to_string()).unwrap();
    }

    /// How many times the upstream was started.
    fn starts(&self) -> usize {
        lines_of(&self.state.join("starts")).len()
    }

    /// The values `store` ran with (one line per execution upstream).
    fn stored(&self) -> Vec<String> {
        lines_of(&self.state.join("stored"))
    }

    /// The proxy's audit records of `method`.
    fn records(&self, method: &str) -> Vec<Value> {
        self.proxy
            .audit_records()
            .into_iter()
            .filter(|r| r["method"] == method)
            .collect()
    }

    /// Waits until the proxy's audit log has a record of `method` whose reason contains `text`.
    fn wait_for_record(&self, server: &mut Server, method: &str, text: &str) -> Value {
        let deadline = Instant::now() + common::TIMEOUT;
        loop {
            if let Some(record) = self
                .records(method)
                .into_iter()
                .find(|r| r["reason"].as_str().is_some_and(|s| s.contains(text)))
            {
                return record;
            }
            assert!(
                server.is_running() && Instant::now() < deadline,
                "no {method} record with {text:?} in the proxy's audit log; stderr:\n{}",
                server.stderr()
            );
            common::poll_pause();
        }
    }
}

/// Reads the proxy's output until `count` notifications of `method` arrived; returns them.
fn wait_for_notifications(server: &mut Server, method: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + common::TIMEOUT;
    loop {
        let found: Vec<Value> = server
            .transcript
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["method"] == method)
            .collect();
        if found.len() >= count {
            return found;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            server.recv_line_within(left).is_some(),
            "{count} {method} notifications did not arrive; stderr:\n{}",
            server.stderr()
        );
    }
}

/// The text of a tool result of the upstream, which the proxy wraps as untrusted third-party text
/// (`{"untrusted_text": …, "note": …}`) unless the policy trusts the tool.
fn upstream_text(reply: &Value) -> String {
    let text = common::first_text(reply);
    let wrapped: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("the upstream's text is not wrapped: {reply}"));
    assert_eq!(
        wrapped["note"],
        json!(toolgate::policy::UNTRUSTED_NOTE),
        "{reply}"
    );
    wrapped["untrusted_text"]
        .as_str()
        .unwrap_or_else(|| panic!("no untrusted_text: {reply}"))
        .to_owned()
}

fn error_message(reply: &Value) -> String {
    reply["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error: {reply}"))
        .to_owned()
}

#[test]
fn a_rug_pull_after_start_is_caught_at_the_upstreams_list_changed() {
    // (change, the tool the host then calls, its rule, its verdict)
    let cases = [
        (
            "description",
            "echo",
            "upstream.description_changed",
            "RISKY",
        ),
        (
            "annotation",
            "echo",
            "upstream.annotations_changed",
            "RISKY",
        ),
        (
            "schema",
            "echo",
            "upstream.input_schema_changed",
            "BREAKING",
        ),
        ("rename", "echo_v2", "upstream.tool_renamed", "BREAKING"),
    ];
    for ((change, tool, rule, verdict), modern) in cases
        .into_iter()
        .flat_map(|case| [(case, false), (case, true)])
    {
        let change = &format!(
            "{change} ({})",
            if modern { "2026-07-28" } else { "2025-11-25" }
        );
        let scripted = Scripted::speaking(modern);
        let mut proxy = scripted.start(&[]);
        // Each start (`proxy lock`, the proxy) spoke the upstream's protocol.
        let handshakes = if modern {
            vec!["server/discover"; 2]
        } else {
            ["server/discover", "initialize"].repeat(2)
        };
        assert_eq!(scripted.handshakes(), handshakes, "{change}");
        assert!(proxy.list_tool_names().contains(&"echo".to_owned()));
        let echoed = proxy.call("echo", json!({"text": "before"}));
        assert_eq!(upstream_text(&echoed), "before", "{echoed}");

        let pulled = change.split(' ').next().unwrap();
        let changed = proxy.call("rug_pull", json!({"change": pulled}));
        assert_eq!(upstream_text(&changed), "changed", "{changed}");
        // The proxy compares the new list before it passes the notification on.
        wait_for_notifications(&mut proxy, "notifications/tools/list_changed", 1);

        let refused = proxy.call(tool, json!({"text": "after"}));
        assert_eq!(
            refused["error"]["code"],
            json!(-32602),
            "{change}: {refused}"
        );
        let message = error_message(&refused);
        assert!(
            message.contains(&format!("{verdict} {rule}")) && message.contains("proxy lock"),
            "{change}: {message}"
        );
        let listed = proxy.list_tool_names();
        assert!(
            !listed.contains(&"echo".to_owned()) && !listed.contains(&"echo_v2".to_owned()),
            "{change}: {listed:?}"
        );
        assert!(proxy.close().success());

        let drift = scripted.records("proxy/drift");
        assert_eq!(drift.len(), 1, "{change}: recorded once: {drift:?}");
        assert_eq!(drift[0]["name"], json!(tool), "{change}");
        assert!(
            drift[0]["reason"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{verdict} {rule}: ")),
            "{change}: {}",
            drift[0]
        );
        assert!(scripted.proxy.audit_verify().status.success());
    }
}

/// Waits until the upstream's state file `name` exists.
fn wait_for_state(scripted: &Scripted, server: &mut Server, name: &str) {
    server.wait_for_file(&scripted.state.join(name));
}

#[test]
fn what_the_gate_does_not_decide_is_forwarded_and_a_cancellation_reaches_the_upstream() {
    for modern in [false, true] {
        let scripted = Scripted::speaking(modern);
        let mut proxy = scripted.start(&[]);
        let listed = proxy.request("resources/list", json!({}));
        assert_eq!(
            listed["result"]["resources"][0]["uri"],
            json!("scripted://a"),
            "{listed}"
        );
        let read = proxy.request("resources/read", json!({"uri": "scripted://a"}));
        assert_eq!(
            read["result"]["contents"][0]["text"],
            json!("content of a"),
            "{read}"
        );
        let prompts = proxy.request("prompts/list", json!({}));
        assert_eq!(
            prompts["result"]["prompts"][0]["name"],
            json!("greet"),
            "{prompts}"
        );
        let prompt = proxy.request("prompts/get", json!({"name": "greet"}));
        assert_eq!(
            prompt["result"]["messages"][0]["content"]["text"],
            json!("hello"),
            "{prompt}"
        );

        // The host cancels a call the upstream is working on: the upstream is told.
        let id = proxy.send_call("slow", json!({}));
        wait_for_state(&scripted, &mut proxy, "slow");
        proxy.send(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the user changed their mind"},
        }));
        wait_for_state(&scripted, &mut proxy, "cancelled");
        // The proxy still serves.
        let echoed = proxy.call("echo", json!({"text": "still here"}));
        assert_eq!(upstream_text(&echoed), "still here", "{echoed}");
        assert!(proxy.close().success());
    }
}

#[test]
fn progress_of_a_forwarded_call_reaches_the_host_under_its_own_token() {
    let scripted = Scripted::new();
    let mut proxy = scripted.start(&[]);
    let id = proxy.next_id();
    let mut meta = common::meta();
    meta["progressToken"] = json!("host-token-7");
    proxy.send(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": "progress", "arguments": {}, "_meta": meta},
    }));
    let reply = proxy.response(id);
    assert_eq!(upstream_text(&reply), "done", "{reply}");
    let progress = wait_for_notifications(&mut proxy, "notifications/progress", 2);
    for notification in &progress {
        assert_eq!(
            notification["params"]["progressToken"],
            json!("host-token-7"),
            "{notification}"
        );
    }
    assert!(proxy.close().success());
}

#[test]
fn an_upstream_that_breaks_the_protocol_is_restarted_and_its_call_is_indeterminate() {
    // (fault, what the host's error says, what the audit record of the upstream's end says)
    let cases = [
        ("crash", "closed its output", "closed its output"),
        (
            "garbage",
            "not a JSON-RPC message",
            "not a JSON-RPC message",
        ),
        ("huge", "more than 1048576 bytes", "more than 1048576 bytes"),
        ("wrong_id", "answered request id", "answered request id"),
        ("hang", "did not answer within 4s", "stopped answering"),
    ];
    for (fault, says, recorded) in cases {
        let scripted = Scripted::new();
        // The hang waits for the timeout twice (the call, then a ping); the others need none
        // (the default, 120 s, leaves a loaded machine all the time it needs to start Python).
        let timeout = if fault == "hang" { "4" } else { "120" };
        let mut proxy = scripted.start(&[
            "--upstream-restarts",
            "1",
            "--restart-backoff-ms",
            "20",
            "--upstream-timeout",
            timeout,
            "--upstream-max-line-bytes",
            "1048576",
        ]);
        let failed = proxy.call("fault", json!({"kind": fault}));
        let message = error_message(&failed);
        assert!(
            message.contains(says) && message.contains("indeterminate"),
            "{fault}: {message}"
        );
        // The end is audited, the upstream started again, and serves.
        let ended = scripted.wait_for_record(&mut proxy, "proxy/upstream", "upstream_ended");
        assert!(
            ended["reason"].as_str().unwrap().contains(recorded),
            "{fault}: {ended}"
        );
        scripted.wait_for_record(&mut proxy, "proxy/upstream", "upstream_restarted");
        // `proxy lock`, the proxy's start, the restart.
        assert_eq!(scripted.starts(), 3, "{fault}");
        let echoed = proxy.call("echo", json!({"text": "again"}));
        assert_eq!(upstream_text(&echoed), "again", "{fault}: {echoed}");
        assert!(proxy.close().success());

        let calls: Vec<String> = scripted
            .records("tools/call")
            .iter()
            .map(|r| format!("{} {}", r["name"], r["outcome"]))
            .collect();
        assert_eq!(
            calls,
            [r#""fault" "indeterminate""#, r#""echo" "committed""#],
            "{fault}"
        );
        assert!(scripted.proxy.audit_verify().status.success());
    }
}

#[test]
fn an_exactly_once_call_lost_with_its_upstream_is_never_forwarded_again() {
    let scripted = Scripted::new();
    let mut proxy = scripted.start(&["--restart-backoff-ms", "20"]);
    let arguments = json!({"key": "order-1", "value": "v1", "crash_after_write": true});
    let lost = proxy.call("store", arguments.clone());
    assert!(error_message(&lost).contains("indeterminate"), "{lost}");
    scripted.wait_for_record(&mut proxy, "proxy/upstream", "upstream_restarted");
    // The effect happened once upstream; the retry is answered by the proxy, not forwarded.
    let retried = proxy.call("store", arguments);
    assert_eq!(scripted.stored(), ["v1"]);
    let text = serde_json::to_string(&retried).unwrap();
    assert!(text.contains("indeterminate"), "{retried}");
    // Another key runs normally.
    let other = proxy.call("store", json!({"key": "order-2", "value": "v2"}));
    assert_eq!(upstream_text(&other), "stored", "{other}");
    assert_eq!(scripted.stored(), ["v1", "v2"]);

    // The operator sees v1 in the store and settles the call while the proxy runs: the next
    // retry replays the result given, still without reaching the upstream.
    let resolved = common::run_to_end({
        let mut command = scripted.proxy.command();
        command.args([
            "effects",
            "resolve",
            "--tool",
            "store",
            "--key",
            "order-1",
            "--completed",
            r#"{"content":[{"type":"text","text":"stored (settled by an operator)"}]}"#,
        ]);
        command
    });
    assert!(resolved.status.success(), "{}", output_text(&resolved));
    let replayed = proxy.call(
        "store",
        json!({"key": "order-1", "value": "v1", "crash_after_write": true}),
    );
    assert_eq!(
        common::first_text(&replayed),
        "stored (settled by an operator)",
        "{replayed}"
    );
    assert_eq!(scripted.stored(), ["v1", "v2"]);
    // Only an indeterminate call can be settled.
    let again = common::run_to_end({
        let mut command = scripted.proxy.command();
        command.args([
            "effects", "resolve", "--tool", "store", "--key", "order-2", "--forget",
        ]);
        command
    });
    assert_eq!(again.status.code(), Some(2), "{}", output_text(&again));
    assert!(
        output_text(&again).contains("not indeterminate"),
        "{}",
        output_text(&again)
    );
    assert!(proxy.close().success());
    let outcomes: Vec<String> = scripted
        .records("tools/call")
        .iter()
        .map(|r| r["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        outcomes,
        ["indeterminate", "indeterminate", "committed", "replay"]
    );
    assert_eq!(scripted.records("effects/resolve").len(), 1);
    assert!(scripted.proxy.audit_verify().status.success());
}

#[test]
fn without_restarts_left_the_proxy_answers_then_exits_non_zero() {
    let scripted = Scripted::new();
    let mut proxy = scripted.start(&["--upstream-restarts", "0"]);
    let failed = proxy.call("fault", json!({"kind": "crash"}));
    assert!(
        error_message(&failed).contains("closed its output"),
        "{failed}"
    );
    let status = proxy.wait_exit();
    assert_eq!(status.code(), Some(2), "stderr:\n{}", proxy.stderr());
    assert!(
        proxy.stderr().contains("no restart left"),
        "{}",
        proxy.stderr()
    );
    // `proxy lock` and the proxy's start, no restart.
    assert_eq!(scripted.starts(), 2);
    let ended = scripted.records("proxy/upstream");
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert!(scripted.proxy.audit_verify().status.success());
}

/// The resident set of process `pid`, in KiB (Linux `/proc`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

#[test]
fn an_upstream_flood_is_dropped_and_recorded_once() {
    for modern in [false, true] {
        let scripted = Scripted::speaking(modern);
        let mut proxy = scripted.start(&[]);
        // 100,000 log notifications (about 8 MB) during one call.
        let reply = proxy.call("flood", json!({"count": 100_000}));
        assert_eq!(upstream_text(&reply), "flooded", "modern {modern}: {reply}");
        let flood = scripted.wait_for_record(&mut proxy, "proxy/flood", "upstream_flood");
        let reason = flood["reason"].as_str().unwrap();
        assert!(
            reason.contains(
                "pushed 100000 notifications and requests between two answers, over the limit of 1000: 99000 were dropped"
            ),
            "modern {modern}: {reason}"
        );
        assert_eq!(flood["decision"], "deny");
        // The queue towards the host is bounded: no 600 MB proxy (a generous bound, not a
        // measurement).
        let rss = rss_kib(proxy.pid());
        assert!(
            rss < 256 * 1024,
            "modern {modern}: the proxy holds {rss} KiB"
        );
        // It serves on, and the next call is no flood.
        let echoed = proxy.call("echo", json!({"text": "after the flood"}));
        assert_eq!(upstream_text(&echoed), "after the flood");
        assert!(proxy.close().success());
        let passed = proxy
            .transcript
            .iter()
            .filter(|line| line.contains("\"notifications/message\""))
            .count();
        assert!(passed <= 1000, "modern {modern}: {passed} reached the host");
        assert_eq!(scripted.records("proxy/flood").len(), 1, "modern {modern}");
        assert!(scripted.proxy.audit_verify().status.success());
    }
}

/// How many requests for sampling or elicitation the host received.
fn asked_of_host(proxy: &Server) -> usize {
    proxy
        .transcript
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["method"] == "sampling/createMessage" || m["method"] == "elicitation/create")
        .count()
}

#[test]
fn the_upstreams_requests_to_the_host_need_its_capability_and_the_policy() {
    for modern in [false, true] {
        let scripted = Scripted::speaking(modern);
        // A 2026-07-28 host takes no requests from a server: both are refused and audited, and
        // the host never sees them.
        let mut proxy = scripted.start(&[]);
        for what in ["sampling", "elicitation"] {
            let reply = proxy.call("ask", json!({"what": what}));
            let text = upstream_text(&reply);
            assert!(
                text.starts_with("refused: ") && text.contains("host_capability_missing"),
                "modern {modern}, {what}: {text}"
            );
        }
        assert!(proxy.close().success());
        assert_eq!(
            asked_of_host(&proxy),
            0,
            "modern {modern}: the host was asked"
        );
        for method in ["sampling/createMessage", "elicitation/create"] {
            let records = scripted.records(method);
            assert_eq!(records.len(), 1, "modern {modern}: {records:?}");
            assert_eq!(records[0]["decision"], "deny");
            assert!(
                records[0]["reason"]
                    .as_str()
                    .unwrap()
                    .starts_with("host_capability_missing:"),
                "{records:?}"
            );
        }

        // A 2025-11-25 host that declares both: the default policy refuses them still.
        let capabilities = json!({"sampling": {}, "elicitation": {}});
        let mut proxy = scripted.spawn(&[]);
        proxy.initialize(capabilities.clone());
        let id = proxy.send_legacy(
            "tools/call",
            json!({"name": "ask", "arguments": {"what": "elicitation"}}),
        );
        let text = upstream_text(&proxy.response(id));
        assert!(
            text.starts_with("refused: ") && text.contains("proxy.host_requests"),
            "modern {modern}: {text}"
        );
        assert!(proxy.close().success());
        assert_eq!(
            asked_of_host(&proxy),
            0,
            "modern {modern}: the host was asked"
        );

        // The policy lets sampling through: it reaches the host, whose answer reaches the
        // upstream; elicitation stays refused.
        scripted.set_proxy_section(json!({"host_requests": ["sampling"]}));
        let mut proxy = scripted.spawn(&[]);
        proxy.initialize(capabilities);
        let id = proxy.send_legacy(
            "tools/call",
            json!({"name": "ask", "arguments": {"what": "sampling"}}),
        );
        let asked = wait_for_notifications(&mut proxy, "sampling/createMessage", 1);
        proxy.send(&json!({"jsonrpc": "2.0", "id": asked[0]["id"], "result": {
            "role": "assistant",
            "content": {"type": "text", "text": "hello from the host"},
            "model": "test-model",
        }}));
        let text = upstream_text(&proxy.response(id));
        assert!(
            text.starts_with("answered: ") && text.contains("hello from the host"),
            "modern {modern}: {text}"
        );
        let id = proxy.send_legacy(
            "tools/call",
            json!({"name": "ask", "arguments": {"what": "elicitation"}}),
        );
        let text = upstream_text(&proxy.response(id));
        assert!(text.contains("proxy.host_requests"), "{text}");
        assert!(proxy.close().success());

        let decisions: Vec<(String, String)> = ["sampling/createMessage", "elicitation/create"]
            .into_iter()
            .flat_map(|method| scripted.records(method))
            .map(|r| {
                (
                    r["method"].as_str().unwrap().to_owned(),
                    r["decision"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            decisions,
            [
                ("sampling/createMessage".to_owned(), "deny".to_owned()),
                ("sampling/createMessage".to_owned(), "allow".to_owned()),
                ("elicitation/create".to_owned(), "deny".to_owned()),
                ("elicitation/create".to_owned(), "deny".to_owned()),
                ("elicitation/create".to_owned(), "deny".to_owned()),
            ],
            "modern {modern}"
        );
        assert!(scripted.proxy.audit_verify().status.success());
    }
}

#[test]
fn upstream_results_are_checked_against_their_pin_and_their_text_is_untrusted() {
    for modern in [false, true] {
        let scripted = Scripted::speaking(modern);
        let mut proxy = scripted.start(&[]);
        // Prompt injection in a result reaches the host marked as third-party text.
        let injected = proxy.call("inject", json!({}));
        assert!(
            upstream_text(&injected).starts_with("IGNORE ALL PREVIOUS INSTRUCTIONS"),
            "{injected}"
        );
        // A result that matches the pinned outputSchema passes.
        let ok = proxy.call("report", json!({"kind": "ok"}));
        assert_eq!(
            common::result_of(&ok)["structuredContent"],
            json!({"count": 3}),
            "{ok}"
        );
        // One that breaks it, or is too large, is an error naming why, never its content.
        let bad = proxy.call("report", json!({"kind": "bad"}));
        assert_eq!(bad["error"]["code"], json!(-32603), "{bad}");
        let message = error_message(&bad);
        assert!(
            message.contains("breaks the pinned outputSchema") && message.contains("`type`"),
            "{message}"
        );
        assert!(!message.contains("three"), "{message}");
        let huge = proxy.call("report", json!({"kind": "huge"}));
        let message = error_message(&huge);
        assert!(
            message.contains("over the limit of 4194304"),
            "modern {modern}: {}",
            &message[..message.len().min(500)]
        );
        assert!(message.len() < 1000, "the error carries the result");
        assert!(proxy.close().success());

        let reasons: Vec<String> = scripted
            .records("proxy/result")
            .iter()
            .map(|r| r["reason"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(
            reasons
                .iter()
                .all(|r| r.starts_with("upstream_result_invalid: `report`"))
        );
        let outcomes: Vec<Value> = scripted
            .records("tools/call")
            .iter()
            .filter(|r| r["name"] == "report")
            .map(|r| r["outcome"].clone())
            .collect();
        assert_eq!(
            outcomes,
            [json!("committed"), json!("error"), json!("error")]
        );
        assert!(!scripted.proxy.audit_text().contains("three"));

        // The policy may trust a tool's text: then it comes as the upstream wrote it.
        scripted.set_proxy_section(json!({"trusted_output": ["inject"]}));
        let mut proxy = scripted.start(&[]);
        let injected = proxy.call("inject", json!({}));
        assert!(
            common::first_text(&injected).starts_with("IGNORE ALL PREVIOUS INSTRUCTIONS"),
            "{injected}"
        );
        assert!(proxy.close().success());
        assert!(scripted.proxy.audit_verify().status.success());
    }
}

#[test]
fn a_flood_of_list_changes_costs_a_few_lists_not_one_each() {
    for modern in [false, true] {
        let scripted = Scripted::speaking(modern);
        let mut proxy = scripted.start(&[]);
        let lists = || lines_of(&scripted.state.join("lists")).len();
        let before = lists();
        // 500 announcements, within the limit on pushes: each reaches the proxy.
        let reply = proxy.call("announce", json!({"count": 500}));
        assert_eq!(upstream_text(&reply), "announced", "{reply}");
        // The host is told (at least once), after a comparison.
        wait_for_notifications(&mut proxy, "notifications/tools/list_changed", 1);
        // The upstream still serves its tools, and a rug pull after the flood is still caught.
        let changed = proxy.call("rug_pull", json!({"change": "description"}));
        assert_eq!(upstream_text(&changed), "changed", "{changed}");
        scripted.wait_for_record(&mut proxy, "proxy/drift", "upstream.description_changed");
        assert!(proxy.close().success());
        // Announcements during a comparison are coalesced into one more: without that, 500.
        let listed = lists() - before;
        assert!(
            (1..=50).contains(&listed),
            "modern {modern}: the proxy listed the tools {listed} times"
        );
    }
}
