//! `toolgate-server proxy`: the gate in front of an upstream MCP server it did not build, with
//! real processes on both sides. The upstream here is another `toolgate-server` over stdio (with
//! its own ledger), so what reaches it can be read from its audit log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

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
        let mut command = self.proxy.command();
        command
            .arg("proxy")
            .arg("--lock")
            .arg(&self.pin)
            .args(extra)
            .arg("--")
            .args(self.upstream_command());
        command
    }

    fn lock(&self) {
        let output = common::run_to_end({
            let mut command = self.proxy.command();
            command
                .args(["proxy", "lock", "--lock"])
                .arg(&self.pin)
                .arg("--")
                .args(self.upstream_command());
            command
        });
        assert!(output.status.success(), "{}", output_text(&output));
        assert!(output_text(&output).contains("pinned 2 tools of toolgate-server"));
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
        drift[0].starts_with("read_ledger upstream.description_changed")
            && drift[1].starts_with("write_note upstream.description_changed"),
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
