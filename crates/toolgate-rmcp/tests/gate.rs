//! The gate's behaviour at the tool-call boundary, in process over `tokio::io::duplex`: what a
//! caller sees for denied, unknown and rule-breaking calls, what the audit log records and when,
//! and the `Permit` a handler receives (and cannot get, or keep, any other way).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ErrorCode, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::{ErrorData, ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use toolgate_audit::{FileAuditLog, Outcome};
use toolgate_policy::Policy;
use toolgate_rmcp::{Gated, Permit, PermitError, TOOL_NOT_FOUND};

/// `echo` and `ruled` are allowed (`ruled` with a rule on `text`), `secret` is denied, `unlisted`
/// is in neither list, and `ghost` is allowed but has no handler.
const POLICY: &str = r#"{
    "version": 1,
    "allow": ["echo", "ruled", "ghost"],
    "deny": ["secret"],
    "arg_rules": {"ruled": {"text": {"max_len": 5}}}
}"#;

/// What the handler bodies observed. Every flag starts false and is set only inside a body.
#[derive(Default)]
struct Observed {
    echo_ran: AtomicBool,
    ruled_ran: AtomicBool,
    secret_ran: AtomicBool,
    unlisted_ran: AtomicBool,
    /// The audit log's line count as seen from inside `echo`.
    lines_inside_echo: Mutex<Option<usize>>,
    /// `permit.tool()` as seen from inside `echo`.
    permit_tool: Mutex<Option<String>>,
    /// A clone of the permit, kept past the end of the call.
    kept_permit: Mutex<Option<Permit>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct TextArgs {
    text: String,
}

#[derive(Clone)]
struct Tools {
    audit_path: PathBuf,
    observed: Arc<Observed>,
    tool_router: ToolRouter<Self>,
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("every audit line is JSON"))
        .collect()
}

#[tool_router]
impl Tools {
    fn new(audit_path: PathBuf) -> Self {
        Tools {
            audit_path,
            observed: Arc::default(),
            tool_router: Self::tool_router(),
        }
    }

    /// Echoes its text; records what it saw.
    #[tool]
    async fn echo(
        &self,
        Extension(permit): Extension<Permit>,
        Parameters(args): Parameters<TextArgs>,
    ) -> Result<String, String> {
        self.observed.echo_ran.store(true, Ordering::SeqCst);
        *self.observed.lines_inside_echo.lock().unwrap() =
            Some(audit_lines(&self.audit_path).len());
        *self.observed.permit_tool.lock().unwrap() = Some(permit.tool().to_owned());
        *self.observed.kept_permit.lock().unwrap() = Some(permit.clone());
        Ok(format!("echo: {}", args.text))
    }

    /// Allowed, with a length rule on `text`.
    #[tool]
    async fn ruled(
        &self,
        Extension(_permit): Extension<Permit>,
        Parameters(args): Parameters<TextArgs>,
    ) -> String {
        self.observed.ruled_ran.store(true, Ordering::SeqCst);
        format!("ruled: {}", args.text)
    }

    /// Denied by the policy's deny list.
    #[tool]
    async fn secret(&self, Extension(_permit): Extension<Permit>) -> String {
        self.observed.secret_ran.store(true, Ordering::SeqCst);
        "secret".to_owned()
    }

    /// In neither list: denied by default.
    #[tool]
    async fn unlisted(&self, Extension(_permit): Extension<Permit>) -> String {
        self.observed.unlisted_ran.store(true, Ordering::SeqCst);
        "unlisted".to_owned()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

struct Setup {
    _ledger: tempfile::TempDir,
    audit_path: PathBuf,
    observed: Arc<Observed>,
}

fn fresh() -> (Setup, Tools) {
    let ledger = tempfile::tempdir().unwrap();
    let audit_path = ledger.path().join("audit.jsonl");
    let tools = Tools::new(audit_path.clone());
    let setup = Setup {
        _ledger: ledger,
        audit_path,
        observed: Arc::clone(&tools.observed),
    };
    (setup, tools)
}

fn gate(setup: &Setup, tools: Tools) -> Gated<Tools> {
    let audit = FileAuditLog::open(&setup.audit_path).unwrap();
    Gated::builder(tools)
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(Arc::new(audit))
        .build()
        .unwrap()
}

type Client = RunningService<RoleClient, ()>;

/// Serves `handler` over an in-process duplex pipe and connects a 2025-11-25 client to it.
async fn connect<H: ServerHandler>(handler: H) -> Client {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = handler.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    ().serve(client_half).await.unwrap()
}

async fn call(client: &Client, tool: &str, args: Value) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = args.as_object().cloned();
    client.call_tool(params).await
}

fn protocol_error(result: Result<CallToolResult, ServiceError>) -> ErrorData {
    match result {
        Err(ServiceError::McpError(error)) => error,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

fn first_text(result: &CallToolResult) -> &str {
    match result.content.first() {
        Some(ContentBlock::Text(text)) => &text.text,
        other => panic!("expected a text block, got {other:?}"),
    }
}

#[tokio::test]
async fn denied_and_unknown_tools_are_indistinguishable() {
    let (setup, tools) = fresh();
    let gated = gate(&setup, tools);
    for hidden in ["secret", "unlisted", "ghost", "nowhere"] {
        assert!(gated.get_tool(hidden).is_none(), "get_tool shows {hidden}");
    }
    assert!(gated.get_tool("echo").is_some());
    let client = connect(gated).await;

    let listed: Vec<String> = client
        .list_tools(None)
        .await
        .unwrap()
        .tools
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    assert_eq!(listed, ["echo", "ruled"]);

    // (tool, reason the audit line must give)
    let cases = [
        ("secret", "deny"),
        ("unlisted", "default_deny"),
        ("ghost", "unknown_tool"),
        ("nowhere", "unknown_tool"),
    ];
    let mut errors = Vec::new();
    for (tool, _) in cases {
        errors.push(protocol_error(call(&client, tool, json!({})).await));
    }
    let expected = ErrorData::invalid_params(TOOL_NOT_FOUND, None);
    for ((tool, _), error) in cases.iter().zip(&errors) {
        assert_eq!(error, &expected, "{tool}");
        assert_eq!(error.code, ErrorCode(-32602));
        assert_eq!(error.message, "tool not found");
    }
    assert!(!setup.observed.secret_ran.load(Ordering::SeqCst));
    assert!(!setup.observed.unlisted_ran.load(Ordering::SeqCst));

    let lines = audit_lines(&setup.audit_path);
    assert_eq!(lines.len(), cases.len(), "{lines:#?}");
    for ((tool, reason), line) in cases.iter().zip(&lines) {
        assert_eq!(line["method"], "tools/call");
        assert_eq!(line["name"], *tool);
        assert_eq!(line["decision"], "deny");
        assert_eq!(line["outcome"], "not_executed");
        assert_eq!(line["reason"], *reason, "{line}");
    }
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_allowed_call_is_audited_after_its_handler_returns() {
    let (setup, tools) = fresh();
    let client = connect(gate(&setup, tools)).await;

    // One deny line first, so that "unchanged" is not trivially "empty".
    let _ = call(&client, "secret", json!({})).await;
    let before = audit_lines(&setup.audit_path).len();
    assert_eq!(before, 1);

    let result = call(&client, "echo", json!({"text": "hi"})).await.unwrap();
    assert_eq!(result.is_error, Some(false));
    assert_eq!(first_text(&result), "echo: hi");
    assert!(setup.observed.echo_ran.load(Ordering::SeqCst));
    assert_eq!(
        *setup.observed.lines_inside_echo.lock().unwrap(),
        Some(before),
        "the allow line must not exist while the handler runs"
    );

    let lines = audit_lines(&setup.audit_path);
    assert_eq!(lines.len(), before + 1);
    let allow = lines.last().unwrap();
    assert_eq!(allow["name"], "echo");
    assert_eq!(allow["decision"], "allow");
    assert_eq!(
        allow["outcome"], "committed",
        "an executed call is recorded committed"
    );
    assert_eq!(allow["reason"], "allow");
    assert!(
        allow["request_id"].as_str().unwrap().starts_with("rpc:"),
        "{allow}"
    );

    // `echo` does not declare `request_id`: passing one is refused as an unknown argument, and the
    // caller cannot choose the recorded id.
    let refused = call(
        &client,
        "echo",
        json!({"text": "hi", "request_id": "req-0001"}),
    )
    .await
    .unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert!(first_text(&refused).contains("`request_id`"));
    let lines = audit_lines(&setup.audit_path);
    let deny = lines.last().unwrap();
    assert_eq!(deny["reason"], "input_schema.unknown_argument");
    assert!(
        deny["request_id"].as_str().unwrap().starts_with("rpc:"),
        "{deny}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn the_handler_gets_a_permit_for_its_own_tool_that_expires_with_the_call() {
    let (setup, tools) = fresh();
    let client = connect(gate(&setup, tools)).await;

    call(&client, "echo", json!({"text": "x"})).await.unwrap();
    assert_eq!(
        setup.observed.permit_tool.lock().unwrap().as_deref(),
        Some("echo")
    );

    let kept = setup
        .observed
        .kept_permit
        .lock()
        .unwrap()
        .take()
        .expect("the handler kept a clone of its permit");
    assert_eq!(kept.tool(), "echo");
    match kept.record_outcome(Outcome::Replay) {
        Err(PermitError::Expired { tool }) => assert_eq!(tool, "echo"),
        other => panic!("a kept permit must be expired, got {other:?}"),
    }
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_argument_rule_violation_is_a_tool_error_and_the_handler_never_runs() {
    let (setup, tools) = fresh();
    let client = connect(gate(&setup, tools)).await;

    let result = call(&client, "ruled", json!({"text": "far too long"}))
        .await
        .expect("a rule violation is a tool result, not a protocol error");
    assert_eq!(result.is_error, Some(true));
    let text = first_text(&result);
    assert!(text.starts_with("Error:"), "{text}");
    assert!(
        !text.contains("far too long"),
        "the message must not echo the value"
    );
    assert!(!setup.observed.ruled_ran.load(Ordering::SeqCst));

    let lines = audit_lines(&setup.audit_path);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["name"], "ruled");
    assert_eq!(lines[0]["decision"], "deny");
    assert_eq!(lines[0]["outcome"], "not_executed");
    assert_eq!(lines[0]["reason"], "arg_rules.ruled.text.max_len");

    // The same tool within its rule runs: the flag above could have become true.
    let ok = call(&client, "ruled", json!({"text": "short"}))
        .await
        .unwrap();
    assert_eq!(first_text(&ok), "ruled: short");
    assert!(setup.observed.ruled_ran.load(Ordering::SeqCst));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn without_the_gate_a_permit_handler_fails_before_its_body() {
    let (setup, tools) = fresh();
    let client = connect(tools).await;

    let outcome = call(&client, "echo", json!({"text": "x"})).await;
    let failed = match &outcome {
        Err(_) => true,
        Ok(result) => result.is_error == Some(true),
    };
    assert!(failed, "an ungated call must fail: {outcome:?}");
    assert!(
        !setup.observed.echo_ran.load(Ordering::SeqCst),
        "the body ran without a permit"
    );
    assert!(setup.observed.permit_tool.lock().unwrap().is_none());
    client.cancel().await.unwrap();

    // The same handler behind the gate does run, so the flag is not stuck at false.
    let (setup, tools) = fresh();
    let client = connect(gate(&setup, tools)).await;
    call(&client, "echo", json!({"text": "x"})).await.unwrap();
    assert!(setup.observed.echo_ran.load(Ordering::SeqCst));
    client.cancel().await.unwrap();
}

/// A sink that never blocks is appended to from the calling task (no blocking-pool hand-off), on
/// a current-thread runtime as well as a multi-thread one, and its records are the same chained
/// lines the file log writes.
#[tokio::test]
async fn a_non_blocking_sink_is_appended_to_inline_and_its_chain_verifies() {
    let (_setup, tools) = fresh();
    let audit = Arc::new(toolgate_audit::MemoryAuditLog::new());
    let gated = Gated::builder(tools)
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(audit.clone())
        .build()
        .unwrap();
    let client = connect(gated).await;
    let _ = call(&client, "secret", json!({})).await;
    let result = call(&client, "echo", json!({"text": "hi"})).await.unwrap();
    assert_eq!(first_text(&result), "echo: hi");
    assert_eq!(audit.records(), 2);
    let report = toolgate_audit::verify_reader(audit.bytes().as_slice()).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 2);
    let lines: Vec<Value> = audit
        .bytes()
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines[0]["decision"], "deny");
    assert_eq!(lines[1]["name"], "echo");
    assert_eq!(lines[1]["outcome"], "committed");
    client.cancel().await.unwrap();
}
