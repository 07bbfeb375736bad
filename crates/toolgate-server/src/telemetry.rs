//! OpenTelemetry export (feature `otel`): off unless the standard OTLP variables are set.
//!
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`) set, the gate's spans and its
//! `mcp.server.operation.duration` histogram are exported over OTLP/HTTP: protobuf, or JSON with
//! `OTEL_EXPORTER_OTLP_PROTOCOL=http/json` (gRPC is not built in). The W3C trace context of each
//! request's `params._meta` is the parent of its span. The service is `toolgate-server` unless
//! `OTEL_SERVICE_NAME` says otherwise. Spans carry names, methods, ids and error types, never
//! arguments or results (`toolgate_rmcp`'s `telemetry.rs`).

use anyhow::Context as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The installed providers; [`Telemetry::shutdown`] flushes them.
#[derive(Debug)]
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

const ENDPOINTS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
];

impl Telemetry {
    /// Installs the exporting providers when an OTLP endpoint is configured; `None` otherwise.
    /// Call it outside any async runtime (the exporter's HTTP client has its own thread).
    pub fn from_env() -> anyhow::Result<Option<Telemetry>> {
        let configured = ENDPOINTS
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        if !configured {
            return Ok(None);
        }
        let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
            Ok("http/json") => Protocol::HttpJson,
            Ok("http/protobuf") | Err(_) => Protocol::HttpBinary,
            Ok(other) => anyhow::bail!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported: use http/protobuf (the default) or http/json"
            ),
        };
        // HTTPS endpoints go through rustls on ring, as the JWKS fetches do.
        let _already = rustls::crypto::ring::default_provider().install_default();
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(crate::SERVER_NAME);
        }
        let resource = resource.build();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .context("cannot build the OTLP span exporter (OTEL_EXPORTER_OTLP_* settings)")?;
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .context("cannot build the OTLP metric exporter (OTEL_EXPORTER_OTLP_* settings)")?;
        let tracer = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        let meter = SdkMeterProvider::builder()
            .with_periodic_exporter(metrics)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_tracer_provider(tracer.clone());
        opentelemetry::global::set_meter_provider(meter.clone());
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        Ok(Some(Telemetry { tracer, meter }))
    }

    /// Exports what is pending and stops. Call it outside any async runtime.
    pub fn shutdown(self) {
        if let Err(error) = self.tracer.shutdown() {
            tracing::warn!(%error, "the span exporter did not shut down cleanly");
        }
        if let Err(error) = self.meter.shutdown() {
            tracing::warn!(%error, "the metric exporter did not shut down cleanly");
        }
    }
}
