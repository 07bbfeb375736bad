//! The builder's configuration: a policy file and a ledger directory opened in the documented
//! layout at `build`, the server name in the messages that name an operator command, and load
//! errors as one `build` error naming the cause.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, RequestId,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::json;
use toolgate_rmcp::checks::KillSwitch;
use toolgate_rmcp::{GateError, Gated, HALTED};

#[derive(Clone)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == "echo").then(|| {
            Tool::new(
                "echo",
                "echo",
                json!({"type": "object"}).as_object().unwrap().clone(),
            )
        })
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("echo")]).into())
    }
}

async fn peer() -> (Peer<RoleServer>, impl Sized, impl Sized) {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(Echo.serve(server_half));
    let client = ().serve(client_half).await.unwrap();
    let server = server.await.unwrap().unwrap();
    (server.peer().clone(), server, client)
}

#[tokio::test]
async fn a_ledger_and_a_policy_file_are_opened_at_build_and_messages_name_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"version":1,"allow":["echo"]}"#).unwrap();
    let ledger = dir.path().join("ledger");
    let (peer, _server, _client) = peer().await;
    let call = |id: i64| {
        (
            CallToolRequestParams::new("echo".to_owned()),
            RequestContext::new(RequestId::Number(id), peer.clone()),
        )
    };

    let named = Gated::builder(Echo)
        .policy_file(&policy)
        .ledger(&ledger)
        .server_name("bookings-mcp")
        .build()
        .unwrap();
    let (request, context) = call(1);
    named.call_tool(request, context).await.unwrap();
    assert!(ledger.join(toolgate_rmcp::LEDGER_AUDIT_FILE).is_file());
    assert!(ledger.join(toolgate_rmcp::LEDGER_EFFECTS_DIR).is_dir());

    // The ledger's kill switch is the gate's.
    KillSwitch::new(&ledger)
        .halt("incident 7", "oncall")
        .unwrap();
    let (request, context) = call(2);
    let halted = named.call_tool(request, context).await.unwrap_err();
    assert_eq!(halted.code.0, HALTED);
    assert!(
        halted.message.contains("`bookings-mcp resume`"),
        "{}",
        halted.message
    );

    let anonymous = Gated::builder(Echo)
        .policy_file(&policy)
        .ledger(&ledger)
        .build()
        .unwrap();
    let (request, context) = call(3);
    let halted = anonymous.call_tool(request, context).await.unwrap_err();
    assert!(
        !halted.message.contains('`'),
        "names no command: {}",
        halted.message
    );
    assert!(halted.message.contains("incident 7"), "{}", halted.message);
}

#[test]
fn load_errors_are_the_build_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = Gated::builder(Echo)
        .policy_file(dir.path().join("absent.json"))
        .ledger(dir.path().join("ledger"))
        .build();
    assert!(matches!(missing, Err(GateError::Policy(_))));

    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"version":1,"allow":["echo"]}"#).unwrap();
    // A ledger whose audit log cannot be opened (a directory in its place).
    let ledger = dir.path().join("bad-ledger");
    std::fs::create_dir_all(ledger.join(toolgate_rmcp::LEDGER_AUDIT_FILE)).unwrap();
    let bad = Gated::builder(Echo)
        .policy_file(&policy)
        .ledger(&ledger)
        .build();
    assert!(matches!(bad, Err(GateError::Audit(_))), "{bad:?}");
    // No policy at all, no audit sink at all: named.
    let none = Gated::builder(Echo).build().unwrap_err();
    assert!(
        matches!(&none, GateError::Missing { parts } if parts == &["policy", "audit"]),
        "{none:?}"
    );
    let message = none.to_string();
    assert!(
        message.contains("without policy and audit") && message.contains("GatedBuilder::ledger"),
        "{message}"
    );
    assert!(matches!(
        Gated::builder(Echo).policy_file(&policy).build(),
        Err(GateError::Missing { parts }) if parts == ["audit"]
    ));
}

/// Settings of which the gate would silently use only one are refused at build, naming both.
#[test]
fn conflicting_settings_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.json");
    std::fs::write(&file, r#"{"version":1,"allow":["echo"]}"#).unwrap();
    let loaded = || toolgate_policy::Policy::from_json(r#"{"version":1,"allow":[]}"#).unwrap();
    let key = || toolgate_canon::HmacKey::new(b"a checkpoint key of at least 32 bytes").unwrap();
    let ledger = dir.path().join("ledger");

    let check = |built: Result<Gated<Echo>, GateError>, pair: (&str, &str)| {
        let error = built.expect_err("conflicting settings must be refused");
        assert!(
            matches!(&error, GateError::Conflict { first, second } if (*first, *second) == pair),
            "{error:?}"
        );
        let message = error.to_string();
        for name in [pair.0, pair.1] {
            assert!(
                message.contains(&format!("GatedBuilder::{name} ")),
                "{message} lacks {name}"
            );
        }
        message
    };
    // The policy, in either order: before, `.policy()` after `.policy_file()` was dropped.
    let message = check(
        Gated::builder(Echo)
            .policy_file(&file)
            .policy(loaded())
            .ledger(&ledger)
            .build(),
        ("policy", "policy_file"),
    );
    assert!(message.contains("give the policy once"), "{message}");
    check(
        Gated::builder(Echo)
            .policy(loaded())
            .policy_file(&file)
            .ledger(&ledger)
            .build(),
        ("policy", "policy_file"),
    );
    // A checkpoint key with an explicit sink: the builder opens no log the key could sign.
    let message = check(
        Gated::builder(Echo)
            .policy_file(&file)
            .audit(toolgate_audit::MemoryAuditLog::new())
            .checkpoint_key(key())
            .build(),
        ("checkpoint_key", "audit"),
    );
    assert!(message.contains("AuditConfig::checkpoint_key"), "{message}");
    // Refused before anything is opened.
    assert!(!ledger.exists());

    // Each alone builds; the key signs the log the ledger opens.
    Gated::builder(Echo)
        .policy(loaded())
        .audit(toolgate_audit::MemoryAuditLog::new())
        .build()
        .unwrap();
    let gate = Gated::builder(Echo)
        .policy_file(&file)
        .ledger(&ledger)
        .checkpoint_key(key())
        .build()
        .unwrap();
    drop(gate);
    assert!(ledger.join(toolgate_rmcp::LEDGER_AUDIT_FILE).exists());
}

/// `checkpoint_every` sets how often the checkpoint key signs the log the ledger opens (it was
/// fixed at `DEFAULT_CHECKPOINT_EVERY`, so a server wanting another interval had to open the log
/// itself); without a key it is refused, naming the missing setting.
#[tokio::test]
async fn checkpoint_every_sets_how_often_the_ledger_log_is_signed() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"version":1,"allow":["echo"]}"#).unwrap();
    let ledger = dir.path().join("ledger");
    let key = || toolgate_canon::HmacKey::new(b"a checkpoint key of at least 32 bytes").unwrap();

    let refused = Gated::builder(Echo)
        .policy_file(&policy)
        .ledger(&ledger)
        .checkpoint_every(5)
        .build();
    let Err(GateError::Missing { parts }) = refused else {
        panic!("a checkpoint interval without a key must be refused: {refused:?}");
    };
    assert_eq!(parts, ["checkpoint_key"]);

    let gate = Gated::builder(Echo)
        .policy_file(&policy)
        .ledger(&ledger)
        .checkpoint_key(key())
        .checkpoint_every(5)
        .build()
        .unwrap();
    let (peer, _server, _client) = peer().await;
    for id in 0..10 {
        let request = CallToolRequestParams::new("echo".to_owned());
        let context = RequestContext::new(RequestId::Number(id), peer.clone());
        gate.call_tool(request, context).await.unwrap();
    }
    drop(gate);
    let log = toolgate_audit::FileAuditLog::open_with(
        toolgate_audit::AuditConfig::new(ledger.join(toolgate_rmcp::LEDGER_AUDIT_FILE))
            .checkpoint_key(key()),
    )
    .unwrap();
    let mut checkpoints = Vec::new();
    let count = toolgate_audit::AuditSink::export_checkpoints(&log, &mut checkpoints).unwrap();
    // One after the 5th record and one after the 10th (the default interval would sign none of
    // ten records before shutdown).
    assert!(count >= 2, "{}", String::from_utf8_lossy(&checkpoints));
    let report = toolgate_audit::verify_sink_with(&log, Some(&key())).unwrap();
    assert!(report.problem.is_none(), "{report}");
}
