//! Tasks created through the gate: a completed task's result, read later with `tasks/get`, is
//! presented like a direct result (the policy's result allow-list), and only the caller that
//! created the task may read, update or cancel it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Task, TaskPayload, TaskStatus, Tool,
};
use rmcp::service::{RequestContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::json;
use toolgate_audit::MemoryAuditLog;
use toolgate_policy::Policy;
use toolgate_rmcp::Gated;

/// In every completed result's `secret`; the allow-list withholds it.
const CANARY: &str = "CANARY-task-5d21";

/// A server whose `report` tool answers with a task, completed when read.
#[derive(Clone)]
struct Reports;

fn report_tool() -> Tool {
    Tool::new(
        "report",
        "Builds a report as a task",
        Arc::new(json!({"type": "object"}).as_object().unwrap().clone()),
    )
}

fn task(id: &str, status: TaskStatus) -> Task {
    Task::new(id, status, "2026-12-04T00:00:00Z", "2026-12-04T00:00:00Z")
}

impl ServerHandler for Reports {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == "report").then(report_tool)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![report_tool()]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResponse::Task(CreateTaskResult::new(task(
            "task-1",
            TaskStatus::Working,
        ))))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let body = json!({"id": "r-1", "secret": CANARY});
        let result = json!({"content": [{"type": "text", "text": body.to_string()}],
                            "structuredContent": body});
        Ok(GetTaskResult::new(DetailedTask::new(
            task(&request.task_id, TaskStatus::Completed),
            TaskPayload::Completed {
                result: result.as_object().unwrap().clone(),
            },
        )))
    }

    async fn cancel_task(
        &self,
        _request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}

/// A client that declares the tasks extension.
#[derive(Clone)]
struct TaskClient;

impl ClientHandler for TaskClient {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.capabilities = ClientCapabilities::builder().enable_tasks().build();
        info
    }
}

type Client = RunningService<RoleClient, TaskClient>;

/// One gate as `principal` over the shared server, and a client connected to it.
async fn connect(principal: &str) -> Client {
    let gated = Gated::builder(Reports)
        .principal(principal)
        .policy(
            Policy::from_json(
                r#"{"version":1,"allow":["report"],"results":{"report":{"fields":["id"]}}}"#,
            )
            .unwrap(),
        )
        .audit(Arc::new(MemoryAuditLog::new()))
        .build()
        .unwrap();
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = gated.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    TaskClient.serve(client_half).await.unwrap()
}

#[tokio::test]
async fn a_task_result_is_presented_and_only_its_creator_reads_it() {
    let alice = connect("alice").await;
    let created = alice
        .call_tool_once(CallToolRequestParams::new("report"))
        .await
        .unwrap();
    let CallToolResponse::Task(created) = created else {
        panic!("not a task: {created:?}");
    };

    // Read before the gate saw it created: refused like an unknown task.
    let unseen = alice.get_task(GetTaskParams::new("task-unseen")).await;
    assert!(unseen.is_err(), "{unseen:?}");

    let read = alice
        .get_task(GetTaskParams::new(created.task.task_id.clone()))
        .await
        .unwrap();
    let TaskPayload::Completed { result } = &read.task.payload else {
        panic!("not completed: {read:?}");
    };
    let shown = serde_json::to_string(result).unwrap();
    assert!(
        !shown.contains(CANARY),
        "the allow-list was bypassed: {shown}"
    );
    assert_eq!(result["structuredContent"], json!({"id": "r-1"}), "{shown}");

    // Another principal cannot read or cancel alice's task, even with its id.
    let bob = connect("bob").await;
    let stolen = bob
        .get_task(GetTaskParams::new(created.task.task_id.clone()))
        .await;
    assert!(stolen.is_err(), "{stolen:?}");
    let cancelled = bob
        .cancel_task(CancelTaskParams::new(created.task.task_id.clone()))
        .await;
    assert!(cancelled.is_err(), "{cancelled:?}");
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
}
