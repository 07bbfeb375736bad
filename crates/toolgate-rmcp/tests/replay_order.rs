//! A replay is byte-identical to the first result (apart from its markers) whichever map serde_json
//! was built with. Its default map keeps keys sorted; a dependency that turns on its feature
//! `preserve_order` (Cedar's does) makes every map in the build keep insertion order, and a
//! handler's result built out of order would then differ from its replay, which comes back from
//! the store's canonical text. The workspace's test run links Cedar (insertion order); `.ci/run`
//! also runs this file on its own (sorted maps).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgate_audit::FileAuditLog;
use toolgate_commit::{EffectConfig, EffectStore};
use toolgate_policy::Policy;
use toolgate_rmcp::{Gated, Permit};

#[derive(Debug, Deserialize, JsonSchema)]
struct PutArgs {
    id: String,
}

#[derive(Clone)]
struct Store {
    tool_router: ToolRouter<Self>,
}

/// An object whose keys are inserted in reverse order, nested, with a key beyond U+FFFF (where
/// RFC 8785's UTF-16 order and `str` order differ).
fn out_of_order(id: &str) -> Value {
    let mut inner = Map::new();
    inner.insert("\u{ff61}".to_owned(), json!(1));
    inner.insert("\u{1f600}".to_owned(), json!(2));
    inner.insert("b".to_owned(), json!([{"z": 1, "a": 2}]));
    let mut outer = Map::new();
    outer.insert("zeta".to_owned(), Value::Object(inner));
    outer.insert("request_id".to_owned(), json!(id));
    outer.insert("amount".to_owned(), json!(1.5));
    Value::Object(outer)
}

#[tool_router]
impl Store {
    /// Stores one value per id.
    #[tool]
    async fn put(
        &self,
        Extension(_permit): Extension<Permit>,
        Parameters(args): Parameters<PutArgs>,
    ) -> CallToolResult {
        let mut result = CallToolResult::structured(out_of_order(&args.id));
        let mut meta = rmcp::model::MetaObject::new();
        meta.0.insert("y".to_owned(), json!(1));
        meta.0.insert("x".to_owned(), json!({"q": 1, "p": 2}));
        result.meta = Some(meta);
        result
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Store {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

async fn call(client: &rmcp::service::RunningService<rmcp::RoleClient, ()>, id: &str) -> String {
    let mut params = CallToolRequestParams::new("put");
    params.arguments = json!({ "id": id }).as_object().cloned();
    let result = client.peer().call_tool(params).await.unwrap();
    // The client keeps the wire's key order in the same build, so this is what the server sent.
    serde_json::to_string(&result).unwrap()
}

#[tokio::test]
async fn replays_are_byte_identical_to_first_results_in_either_key_order() {
    let dir = tempfile::tempdir().unwrap();
    for (marker, replayed) in [
        ("", r#""_meta":{"io.toolgate/replayed":true,"#),
        (
            r#","replay_marker":{"pointer":"/status","value":"replay"}"#,
            r#""_meta":{"io.toolgate/replayed":true,"#,
        ),
    ] {
        let policy = format!(
            r#"{{"version":1,"allow":["put"],
              "idempotency":{{"put":{{"key_argument":"id","effect":"unsafe"{marker}}}}}}}"#
        );
        let effects = Arc::new(
            EffectStore::open(EffectConfig::new(
                dir.path().join(format!("e{}", marker.len())),
            ))
            .unwrap(),
        );
        let gated = Gated::builder(Store {
            tool_router: Store::tool_router(),
        })
        .policy(Policy::from_json(&policy).unwrap())
        .audit(Arc::new(
            FileAuditLog::open(dir.path().join(format!("a{}.jsonl", marker.len()))).unwrap(),
        ))
        .effect_store(effects)
        .build()
        .unwrap();
        let (server_half, client_half) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let server = gated.serve(server_half).await.unwrap();
            let _ = server.waiting().await;
        });
        let client = ().serve(client_half).await.unwrap();

        let first = call(&client, "r-1").await;
        let again = call(&client, "r-1").await;
        // The markers are the only difference: the replayed flag, first in `_meta`, and the
        // policy's marker where it was asked for.
        let mut expected = first.replacen(r#""_meta":{"#, replayed, 1);
        if !marker.is_empty() {
            let first: Value = serde_json::from_str(&first).unwrap();
            let structured = &first["structuredContent"];
            let mut marked = structured.clone();
            marked["status"] = json!("replay");
            marked.sort_all_objects();
            expected = expected.replace(
                &serde_json::to_string(structured).unwrap(),
                &serde_json::to_string(&marked).unwrap(),
            );
            // The text block carried the same JSON, in the order the handler wrote it.
            expected = expected.replace(
                &serde_json::to_string(&first["content"][0]["text"]).unwrap(),
                &serde_json::to_string(&marked.to_string()).unwrap(),
            );
            assert!(again.contains(r#"\"status\":\"replay\""#), "{again}");
        }
        assert_eq!(again, expected, "first: {first}");
        // The first result is in key order, the order every replay has.
        let value: Value = serde_json::from_str(&first).unwrap();
        let mut sorted = value.clone();
        sorted.sort_all_objects();
        assert_eq!(
            serde_json::to_string(&value["structuredContent"]).unwrap(),
            serde_json::to_string(&sorted["structuredContent"]).unwrap()
        );
        client.cancel().await.unwrap();
    }
}
