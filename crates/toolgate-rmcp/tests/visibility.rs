//! "Shown in tools/list ⇔ tools/call is not refused with -32602", checked through the gate over a
//! real connection for many generated policies and handlers.
//!
//! proptest is not a dependency of this workspace, so the cases come from a fixed-seed generator:
//! the same cases run every time, and a failure names its case number and inputs. Each case draws
//! which of a fixed set of tool names the policy allows, denies and rules, and which ones the inner
//! handler actually has; then every name (plus names nobody knows) is listed and called.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, ServiceError};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use toolgate_policy::Policy;
use toolgate_rmcp::Gated;

const CASES: u64 = 200;
/// Names the generator picks from; all valid MCP tool names.
const NAMES: [&str; 7] = ["a", "b", "write_note", "rm-rf", "x.y", "Z9", "t_"];
/// Names no policy or handler ever has.
const STRANGERS: [&str; 2] = ["never", "also.never"];

/// splitmix64: small, deterministic, good enough to spread the cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A handler whose tools are data, so each case can have a different set.
struct Catalog {
    tools: Vec<Tool>,
}

fn tool(name: &str) -> Tool {
    Tool::new(
        name.to_owned(),
        "generated",
        json!({"type": "object"}).as_object().unwrap().clone(),
    )
}

impl ServerHandler for Catalog {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.get_tool(&request.name).is_none() {
            return Err(ErrorData::invalid_params("tool not found", None));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text("ran")]).into())
    }
}

struct Case {
    policy: Value,
    handler: BTreeSet<&'static str>,
}

fn generate(rng: &mut Rng) -> Case {
    let mut allow = Vec::new();
    let mut deny = Vec::new();
    let mut rules = serde_json::Map::new();
    let mut handler = BTreeSet::new();
    for name in NAMES {
        if rng.chance(55) {
            allow.push(name);
        }
        if rng.chance(25) {
            deny.push(name);
        }
        // The policy refuses rules for tools it does not allow (a likely typo), so rules are
        // drawn for allowed, undenied tools only; the draw happens either way to keep the stream.
        let ruled = rng.chance(30);
        if ruled && allow.contains(&name) && !deny.contains(&name) {
            rules.insert(name.to_owned(), json!({"text": {"min_len": 3}}));
        }
        if rng.chance(70) {
            handler.insert(name);
        }
    }
    Case {
        policy: json!({"version": 1, "allow": allow, "deny": deny, "arg_rules": rules}),
        handler,
    }
}

fn refused_as_unknown(result: &Result<CallToolResult, ServiceError>) -> bool {
    matches!(result, Err(ServiceError::McpError(e)) if e.code == ErrorCode::INVALID_PARAMS)
}

async fn check(number: u64, case: &Case) {
    let policy = Policy::from_json(&case.policy.to_string()).expect("generated policies are valid");
    let gate = Gated::builder(Catalog {
        tools: case.handler.iter().map(|name| tool(name)).collect(),
    })
    .policy(policy)
    // In memory: the property is about decisions, and an fsync per call would make hundreds of
    // cases slow without testing anything more.
    .audit(Arc::new(toolgate_audit::MemoryAuditLog::new()))
    .build()
    .unwrap();

    let context = format!(
        "case {number}: policy {} handler {:?}",
        case.policy, case.handler
    );
    // The oracle: a tool is shown exactly when the policy lets it through and the handler has it.
    let expected: BTreeSet<&str> = NAMES
        .iter()
        .copied()
        .filter(|name| gate.policy().visible(name) && case.handler.contains(name))
        .collect();
    let by_get_tool: BTreeSet<&str> = NAMES
        .iter()
        .chain(&STRANGERS)
        .copied()
        .filter(|name| gate.get_tool(name).is_some())
        .collect();

    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let running = gate.serve(server_half).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_half).await.unwrap();

    let listed: BTreeSet<String> = client
        .list_tools(None)
        .await
        .unwrap()
        .tools
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    assert_eq!(
        listed.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        by_get_tool,
        "tools/list and get_tool disagree; {context}"
    );
    assert_eq!(
        by_get_tool, expected,
        "get_tool disagrees with the oracle; {context}"
    );

    for name in NAMES.iter().chain(&STRANGERS) {
        // Both with arguments that satisfy any rule and with ones that break it: a rule violation
        // is an isError result, never the "not found" error, so it must not hide a visible tool.
        for text in ["long enough", "no"] {
            let mut params = CallToolRequestParams::new((*name).to_owned());
            params.arguments = json!({"text": text}).as_object().cloned();
            let result = client.call_tool(params).await;
            let visible = listed.contains(*name);
            assert_eq!(
                visible,
                !refused_as_unknown(&result),
                "`{name}` (text {text:?}) listed={visible} but call gave {result:?}; {context}"
            );
        }
    }

    client.cancel().await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn listed_iff_callable_over_generated_policies() {
    let mut rng = Rng(0x746F_6F6C_6761_7465); // "toolgate"
    let mut listed_somewhere = 0usize;
    let mut hidden_somewhere = 0usize;
    for number in 0..CASES {
        let case = generate(&mut rng);
        let policy = Policy::from_json(&case.policy.to_string()).unwrap();
        for name in NAMES {
            if policy.visible(name) && case.handler.contains(name) {
                listed_somewhere += 1;
            } else {
                hidden_somewhere += 1;
            }
        }
        check(number, &case).await;
    }
    // The generator must produce both sides of the equivalence often, or the test proves little.
    assert!(listed_somewhere > 200, "{listed_somewhere}");
    assert!(hidden_somewhere > 200, "{hidden_somewhere}");
}
