//! OpenTelemetry for the gated methods (feature `otel`), per the GenAI semantic conventions for
//! MCP: one server span per `tools/call` and `tools/list`, named `{mcp.method.name} {target}`
//! (`tools/call write_note`), with `mcp.method.name`, `gen_ai.tool.name`,
//! `gen_ai.operation.name` (`execute_tool`), `jsonrpc.request.id` and, on failure, `error.type`
//! (the JSON-RPC error code, or `tool_error` for a result with `isError`) and an error status; and
//! the histogram `mcp.server.operation.duration` (seconds) with the same method, tool and error
//! attributes. The parent comes from the request's `params._meta` (`traceparent`, `tracestate`)
//! through the process's text-map propagator. Arguments and results never enter a span.
//!
//! This module uses the API only: nothing is recorded until the process installs a tracer and a
//! meter provider (and a propagator), which the reference server does when OTLP is configured.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Instant;

use opentelemetry::metrics::Histogram;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{FutureExt as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, global};
use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResponse, RequestMetaObject};

/// The instrumentation scope.
const SCOPE: &str = "toolgate";

/// What an operation's result says about failure.
pub(crate) trait Failure {
    /// `error.type` of a successful answer that still failed (`isError`), if it did.
    fn error_type(&self) -> Option<&'static str>;
}

impl Failure for CallToolResponse {
    fn error_type(&self) -> Option<&'static str> {
        match self {
            CallToolResponse::Complete(result) if result.is_error == Some(true) => {
                Some("tool_error")
            }
            _ => None,
        }
    }
}

impl Failure for rmcp::model::ListToolsResult {
    fn error_type(&self) -> Option<&'static str> {
        None
    }
}

/// `_meta` as a carrier of the W3C trace context.
struct Meta<'a>(&'a RequestMetaObject);

impl Extractor for Meta<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(serde_json::Value::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

fn duration() -> &'static Histogram<f64> {
    static DURATION: OnceLock<Histogram<f64>> = OnceLock::new();
    DURATION.get_or_init(|| {
        global::meter(SCOPE)
            .f64_histogram("mcp.server.operation.duration")
            .with_unit("s")
            .with_description("Duration of MCP requests handled by the server")
            .build()
    })
}

/// Runs `work`, the handling of `method` (of tool `tool`), inside its server span.
pub(crate) async fn traced<T: Failure>(
    method: &'static str,
    tool: Option<String>,
    request_id: String,
    meta: &RequestMetaObject,
    work: impl Future<Output = Result<T, McpError>>,
) -> Result<T, McpError> {
    let parent = global::get_text_map_propagator(|propagator| propagator.extract(&Meta(meta)));
    let tracer = global::tracer(SCOPE);
    let name = match &tool {
        Some(tool) => format!("{method} {tool}"),
        None => method.to_owned(),
    };
    let mut attributes = vec![KeyValue::new("mcp.method.name", method)];
    if let Some(tool) = &tool {
        attributes.push(KeyValue::new("gen_ai.tool.name", tool.clone()));
        attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
    }
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Server)
        .with_attributes(
            attributes
                .iter()
                .cloned()
                .chain([KeyValue::new("jsonrpc.request.id", request_id)]),
        )
        .start_with_context(&tracer, &parent);
    let context = Context::current_with_span(span);
    let started = Instant::now();
    let result = work.with_context(context.clone()).await;
    let error = match &result {
        Ok(answer) => answer.error_type().map(str::to_owned),
        Err(error) => Some(error.code.0.to_string()),
    };
    let span = context.span();
    if let Some(error) = &error {
        span.set_attribute(KeyValue::new("error.type", error.clone()));
        span.set_status(Status::error(error.clone()));
        attributes.push(KeyValue::new("error.type", error.clone()));
    }
    span.end();
    duration().record(started.elapsed().as_secs_f64(), &attributes);
    result
}
