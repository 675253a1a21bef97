//! Logs and distributed traces of `pacpriv serve`: the `tracing`
//! subscriber (text or JSON logs on stderr) and, when
//! `telemetry.otlp_endpoint` is set, OpenTelemetry spans exported over OTLP
//! (gRPC) through the `tracing-opentelemetry` bridge, with W3C trace
//! context taken from each client request ([`adopt_parent`]) and passed on
//! to every teacher call ([`inject`]).
//!
//! Spans: one per RPC (`rpc`), one per query (`query`: principal and query
//! id), one per teacher batch (a root of its own, linked to each query it
//! serves) and per teacher call (`teacher_call`: the model, every teacher
//! alike).
//!
//! # Invariants
//! - A client's trace context is a hint, not an instruction: every request
//!   is traced when export is on (the client's `sampled` flag cannot turn
//!   it off), and only `traceparent` is read — a client's `tracestate` is
//!   neither kept nor sent on to teachers.
//! - A span's fields and events are those the logs already carry: never
//!   the secret index, the noise or the posterior (`tests/it/telemetry.rs`
//!   scans the exported spans as `hygiene` scans the logs).
//! - Off (the default), nothing is exported and no trace context is read
//!   or sent.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The span of one call to one teacher model.
pub const TEACHER_CALL: &str = "teacher_call";

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint: {0}")]
pub struct TraceError(String);

/// Exports spans until dropped (flushing what is queued).
pub struct Exporting(SdkTracerProvider);

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "flushing the last spans failed");
        }
    }
}

/// Installs the process's subscriber: logs (`json` or text) filtered by
/// `RUST_LOG` (default `info`), and span export to `otlp_endpoint` (as
/// `service_name`) when one is given. Call inside a tokio runtime (the
/// exporter's channel lives there). A second call keeps the first
/// subscriber.
///
/// # Errors
/// [`TraceError`]: the exporter could not be built.
pub fn install(json: bool, otlp_endpoint: Option<&str>, service_name: &str) -> Result<Option<Exporting>, TraceError> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if json { fmt.json().boxed() } else { fmt.with_ansi(std::io::stderr().is_terminal()).boxed() };
    // A teacher call's span names its model: exported, every teacher
    // alike, but kept out of the logs' span context, which name only a
    // teacher that failed (as `tests/it/hygiene.rs` checks).
    let logs = logs.with_filter(tracing_subscriber::filter::filter_fn(|m| !(m.is_span() && m.name() == TEACHER_CALL)));
    let Some(endpoint) = otlp_endpoint else {
        let _ = tracing_subscriber::registry().with(logs).with(filter).try_init();
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.to_owned())
        .build()
        .map_err(|e| TraceError(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_owned()).build();
    // Not parent-based: whether a request is traced is the operator's
    // choice (export on), not the client's traceparent flags.
    let provider = SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let spans = tracing_opentelemetry::layer().with_tracer(provider.tracer("pacpriv"));
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let _ = tracing_subscriber::registry().with(logs).with(spans).with(filter).try_init();
    Ok(Some(Exporting(provider)))
}

/// Makes the trace context the client sent (its `traceparent` among
/// `headers`: HTTP headers or gRPC metadata; not its `tracestate`) the
/// parent of `span`; nothing when none was sent or export is off.
pub fn adopt_parent(span: &Span, headers: &dyn Extractor) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&ParentOnly(headers)));
    // Fails only when no OpenTelemetry layer is installed: export is off.
    let _ = span.set_parent(parent);
}

/// A client's headers with only `traceparent` visible.
struct ParentOnly<'a>(&'a dyn Extractor);

impl Extractor for ParentOnly<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        if key.eq_ignore_ascii_case("traceparent") { self.0.get(key) } else { None }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().into_iter().filter(|k| k.eq_ignore_ascii_case("traceparent")).collect()
    }
}

/// HTTP request headers, as trace context.
pub struct Headers<'a>(pub &'a axum::http::HeaderMap);

/// gRPC request metadata, as trace context.
pub struct Metadata<'a>(pub &'a tonic::metadata::MetadataMap);

/// Adds the current span's trace context to an outgoing call's `metadata`.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    let context = Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut Outgoing(metadata)));
}

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => k.as_str(),
                tonic::metadata::KeyRef::Binary(k) => k.as_str(),
            })
            .collect()
    }
}

struct Outgoing<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for Outgoing<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::AsciiMetadataKey::from_bytes(key.as_bytes()),
            value.parse::<tonic::metadata::AsciiMetadataValue>(),
        ) {
            self.0.insert(k, v);
        }
    }
}
